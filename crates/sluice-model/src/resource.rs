//! APISIX resource types with APISIX's field names and defaults. Plugin configurations stay as JSON here: each
//! plugin owns its schema and compiles its own typed config (sluice-plugins), so the model never needs to know them.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Plugin name -> that plugin's configuration, as in APISIX's `plugins` objects.
pub type Plugins = Map<String, Value>;

/// A resource id. APISIX accepts strings and integers (`id: 1` in apisix.yaml); both become the same string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Id(pub String);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Id(s)),
            Value::Number(n) => Ok(Id(n.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "invalid id {other}: expected string or integer"
            ))),
        }
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id(s.to_owned())
    }
}

/// Seconds, as APISIX's `timeout` objects carry them (fractions allowed).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timeout {
    pub connect: f64,
    pub send: f64,
    pub read: f64,
}

impl Default for Timeout {
    /// nginx's proxy_*_timeout defaults, which APISIX inherits when no timeout is set.
    fn default() -> Self {
        Timeout {
            connect: 60.0,
            send: 60.0,
            read: 60.0,
        }
    }
}

/// A route. The fields most routes leave unset are boxed in [`RouteRare`] and read through `Deref` (`r.vars`,
/// `r.timeout`, ...; writing one through `DerefMut` allocates the box): ~220 bytes a route instead of ~480
/// (issue 16: 100k routes in memory). Reads and writes APISIX's JSON exactly as a flat struct would.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(from = "RouteWire", into = "RouteWire")]
pub struct Route {
    pub id: Id,
    pub uri: Option<String>,
    pub host: Option<String>,
    pub methods: Vec<String>,
    pub priority: i32,
    /// 1 enabled (the default when absent), 0 disabled: a disabled route never matches.
    pub status: Option<u8>,
    pub enable_websocket: Option<bool>,
    pub plugins: Plugins,
    pub upstream: Option<std::sync::Arc<Upstream>>,
    pub upstream_id: Option<Id>,
    pub service_id: Option<Id>,
    pub create_time: Option<i64>,
    pub update_time: Option<i64>,
    /// `None` while every rare field has its default.
    rare: Option<Box<RouteRare>>,
}

/// The fields of a [`Route`] most routes leave unset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteRare {
    pub name: Option<String>,
    pub desc: Option<String>,
    pub uris: Vec<String>,
    pub hosts: Vec<String>,
    pub remote_addr: Option<String>,
    pub remote_addrs: Vec<String>,
    pub vars: Option<Value>,
    pub plugin_config_id: Option<Id>,
    pub timeout: Option<Timeout>,
    pub labels: Option<Map<String, Value>>,
}

static NO_RARE: RouteRare = RouteRare {
    name: None,
    desc: None,
    uris: Vec::new(),
    hosts: Vec::new(),
    remote_addr: None,
    remote_addrs: Vec::new(),
    vars: None,
    plugin_config_id: None,
    timeout: None,
    labels: None,
};

impl std::ops::Deref for Route {
    type Target = RouteRare;

    fn deref(&self) -> &RouteRare {
        self.rare.as_deref().unwrap_or(&NO_RARE)
    }
}

impl std::ops::DerefMut for Route {
    fn deref_mut(&mut self) -> &mut RouteRare {
        self.rare.get_or_insert_with(Box::default)
    }
}

impl PartialEq for Route {
    fn eq(&self, o: &Route) -> bool {
        self.id == o.id
            && self.uri == o.uri
            && self.host == o.host
            && self.methods == o.methods
            && self.priority == o.priority
            && self.status == o.status
            && self.enable_websocket == o.enable_websocket
            && self.plugins == o.plugins
            && self.upstream == o.upstream
            && self.upstream_id == o.upstream_id
            && self.service_id == o.service_id
            && self.create_time == o.create_time
            && self.update_time == o.update_time
            && **self == **o
    }
}

impl From<RouteWire> for Route {
    fn from(w: RouteWire) -> Route {
        let RouteWire {
            id,
            name,
            desc,
            uri,
            uris,
            host,
            hosts,
            methods,
            remote_addr,
            remote_addrs,
            vars,
            priority,
            status,
            plugins,
            plugin_config_id,
            upstream,
            upstream_id,
            service_id,
            timeout,
            enable_websocket,
            labels,
            create_time,
            update_time,
        } = w;
        let rare = RouteRare {
            name,
            desc,
            uris,
            hosts,
            remote_addr,
            remote_addrs,
            vars,
            plugin_config_id,
            timeout,
            labels,
        };
        Route {
            id,
            uri,
            host,
            methods,
            priority,
            status,
            enable_websocket,
            plugins,
            upstream,
            upstream_id,
            service_id,
            create_time,
            update_time,
            rare: (rare != NO_RARE).then(|| Box::new(rare)),
        }
    }
}

impl From<Route> for RouteWire {
    fn from(r: Route) -> RouteWire {
        let RouteRare {
            name,
            desc,
            uris,
            hosts,
            remote_addr,
            remote_addrs,
            vars,
            plugin_config_id,
            timeout,
            labels,
        } = r.rare.map(|b| *b).unwrap_or_default();
        RouteWire {
            id: r.id,
            name,
            desc,
            uri: r.uri,
            uris,
            host: r.host,
            hosts,
            methods: r.methods,
            remote_addr,
            remote_addrs,
            vars,
            priority: r.priority,
            status: r.status,
            plugins: r.plugins,
            plugin_config_id,
            upstream: r.upstream,
            upstream_id: r.upstream_id,
            service_id: r.service_id,
            timeout,
            enable_websocket: r.enable_websocket,
            labels,
            create_time: r.create_time,
            update_time: r.update_time,
        }
    }
}

/// A route as written (APISIX's fields in this order): what [`Route`] reads and writes through.
#[derive(Default, Serialize, Deserialize)]
#[serde(default)]
struct RouteWire {
    id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    desc: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uri: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    uris: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    methods: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_addr: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    remote_addrs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vars: Option<Value>,
    priority: i32,
    /// 1 enabled (the default when absent), 0 disabled: a disabled route never matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u8>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    plugins: Plugins,
    #[serde(skip_serializing_if = "Option::is_none")]
    plugin_config_id: Option<Id>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::intern::de_upstream"
    )]
    upstream: Option<std::sync::Arc<Upstream>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_id: Option<Id>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_id: Option<Id>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<Timeout>,
    #[serde(skip_serializing_if = "Option::is_none")]
    enable_websocket: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    create_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    update_time: Option<i64>,
}

impl Route {
    pub fn enabled(&self) -> bool {
        self.status != Some(0)
    }
    /// `uri` and `uris` together, as APISIX's router sees them.
    pub fn all_uris(&self) -> Vec<String> {
        self.uri.iter().chain(self.uris.iter()).cloned().collect()
    }
    /// `host` and `hosts` together.
    pub fn all_hosts(&self) -> Vec<String> {
        self.host.iter().chain(self.hosts.iter()).cloned().collect()
    }
    /// `remote_addr` and `remote_addrs` together.
    pub fn all_remote_addrs(&self) -> Vec<String> {
        self.remote_addr
            .iter()
            .chain(self.remote_addrs.iter())
            .cloned()
            .collect()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Service {
    pub id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub plugins: Plugins,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::intern::de_upstream"
    )]
    pub upstream: Option<std::sync::Arc<Upstream>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<Id>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_websocket: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_time: Option<i64>,
}

/// One upstream node. APISIX accepts `nodes` as a `{"host:port": weight}` map or a list of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default = "one")]
    pub weight: u32,
    #[serde(default)]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

fn one() -> u32 {
    1
}

/// `nodes` in either APISIX form; the form is kept so a resource reads back as it was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Nodes {
    /// Compact (see [`NodeMap`]): a `serde_json::Map` here cost ~650 bytes per one-node upstream.
    Map(crate::NodeMap),
    List(Vec<Node>),
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes::List(Vec::new())
    }
}

impl Nodes {
    /// The nodes as a list, map form expanded (`"127.0.0.1:80": 1` -> host 127.0.0.1, port 80, weight 1).
    pub fn to_list(&self) -> Result<Vec<Node>, String> {
        match self {
            Nodes::List(l) => Ok(l.clone()),
            Nodes::Map(m) => m
                .iter()
                .map(|(addr, w)| {
                    let weight = w
                        .as_u64()
                        .and_then(|w| u32::try_from(w).ok())
                        .ok_or_else(|| format!("invalid weight for node {addr}: {w}"))?;
                    let (host, port) = split_host_port(addr)?;
                    Ok(Node {
                        host,
                        port,
                        weight,
                        priority: 0,
                        metadata: None,
                    })
                })
                .collect(),
        }
    }
}

/// Splits `host:port`, `[v6]:port`, or a bare host.
pub fn split_host_port(addr: &str) -> Result<(String, Option<u16>), String> {
    let bad = || format!("invalid node address {addr:?}");
    if let Some(rest) = addr.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host.to_owned(), Some(p.parse().map_err(|_| bad())?))),
            None if after.is_empty() => Ok((host.to_owned(), None)),
            None => Err(bad()),
        };
    }
    match addr.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((h.to_owned(), Some(p.parse().map_err(|_| bad())?))),
        _ if addr.is_empty() => Err(bad()),
        _ => Ok((addr.to_owned(), None)),
    }
}

/// Each field defaults on its own, as APISIX's schema does (`{size: 1024}` is a complete pool).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeepalivePool {
    pub size: u32,
    pub idle_timeout: f64,
    pub requests: u32,
}

impl Default for KeepalivePool {
    /// APISIX's upstream keepalive_pool defaults.
    fn default() -> Self {
        KeepalivePool {
            size: 320,
            idle_timeout: 60.0,
            requests: 1000,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpstreamTls {
    /// An `ssls` resource of `type: "client"` holding the client certificate (instead of `client_cert`/`client_key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert_id: Option<Id>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Upstream {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Id>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    /// roundrobin | chash | least_conn | ewma
    #[serde(rename = "type")]
    pub kind: String,
    pub nodes: Nodes,
    /// vars | header | cookie | consumer | vars_combinations
    pub hash_on: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// http | https | grpc | grpcs, and Sluice's h2c | h2 (HTTP/2 to the upstream, cleartext / TLS)
    pub scheme: String,
    /// pass | node | rewrite
    pub pass_host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_timeout: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Timeout>,
    pub keepalive_pool: KeepalivePool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTls>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Map<String, Value>>,
    /// Service discovery (APISIX's fields): the nodes come from `discovery_type`'s registry under
    /// `service_name`, narrowed by `discovery_args`, instead of `nodes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_args: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_time: Option<i64>,
}

/// Where the nodes of upstreams with a `discovery_type` come from, as the snapshot compiler asks for them (the
/// binary wires a registry client behind it; the data plane only sees node lists).
pub trait Discovery: Send + Sync {
    /// The nodes `discovery_type` knows for `service_name` and `args` (empty while none are known); `None` when
    /// no discovery of that type is configured.
    fn nodes(
        &self,
        discovery_type: &str,
        service_name: &str,
        args: Option<&Map<String, Value>>,
    ) -> Option<Vec<Node>>;
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            id: None,
            name: None,
            desc: None,
            kind: "roundrobin".into(),
            nodes: Nodes::default(),
            hash_on: "vars".into(),
            key: None,
            scheme: "http".into(),
            pass_host: "pass".into(),
            upstream_host: None,
            retries: None,
            retry_timeout: None,
            timeout: None,
            keepalive_pool: KeepalivePool::default(),
            checks: None,
            tls: None,
            labels: None,
            discovery_type: None,
            service_name: None,
            discovery_args: None,
            create_time: None,
            update_time: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Consumer {
    pub username: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub plugins: Plugins,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_id: Option<Id>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_time: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GlobalRule {
    pub id: Id,
    pub plugins: Plugins,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PluginConfig {
    pub id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    pub plugins: Plugins,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ssl {
    pub id: Id,
    /// `server` (default: served on TLS listeners by SNI) or `client` (a certificate for upstream mTLS).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub cert: String,
    pub key: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certs: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snis: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u8>,
}

/// An L4 route (APISIX `stream_routes`, `schema_def.stream_route`): matched per TCP connection or UDP client by
/// `remote_addr`, `server_addr`, `server_port` and, for TLS connections, the ClientHello's `sni`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamRoute {
    pub id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desc: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_time: Option<i64>,
    /// Client IP or CIDR.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_addr: Option<String>,
    /// The gateway's own address the connection arrived at (IP or CIDR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_addr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_port: Option<u16>,
    /// TLS server name (a leading `*.` matches any name ending in the rest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::intern::de_upstream"
    )]
    pub upstream: Option<std::sync::Arc<Upstream>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<Id>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_id: Option<Id>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub plugins: Plugins,
    /// xRPC protocol (APISIX's `protocol`): accepted by the schema, refused by the data plane.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Value>,
}

#[cfg(test)]
mod route_tests {
    use super::*;

    #[test]
    fn a_route_reads_and_writes_apisix_json_as_written_with_its_rare_fields_boxed() {
        let text = r#"{"id":"1","name":"n","desc":"d","uri":"/a","uris":["/b"],"host":"h","hosts":["g"],"methods":["GET"],"remote_addr":"10.0.0.1","remote_addrs":["10.0.0.2"],"vars":[["arg_x","==","1"]],"priority":3,"status":1,"plugins":{"key-auth":{}},"plugin_config_id":"p","upstream_id":"u","service_id":"s","timeout":{"connect":1.0,"send":2.0,"read":3.0},"enable_websocket":true,"labels":{"k":"v"},"create_time":5,"update_time":6}"#;
        let r: Route = serde_json::from_str(text).unwrap();
        assert!(r.rare.is_some());
        assert_eq!(
            (r.name.as_deref(), r.uris.len(), r.timeout.map(|t| t.read)),
            (Some("n"), 1, Some(3.0))
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), text);

        let plain: Route =
            serde_json::from_str(r#"{"id":"2","uri":"/c","methods":["GET"]}"#).unwrap();
        assert!(plain.rare.is_none(), "no rare field set: nothing boxed");
        assert!(plain.vars.is_none() && plain.hosts.is_empty());
        assert_eq!(
            serde_json::to_string(&plain).unwrap(),
            r#"{"id":"2","uri":"/c","methods":["GET"],"priority":0}"#
        );
        // Written through DerefMut, then equal to one that was decoded with it.
        let mut w = plain.clone();
        w.desc = Some("x".into());
        let decoded: Route =
            serde_json::from_str(r#"{"id":"2","uri":"/c","methods":["GET"],"desc":"x"}"#).unwrap();
        assert_eq!(w, decoded);
        assert_ne!(w, plain);
        // A box holding only defaults compares equal to none.
        let mut empty = plain.clone();
        empty.desc = None;
        assert!(empty.rare.is_some());
        assert_eq!(empty, plain);
        assert!(
            std::mem::size_of::<Route>() <= 240,
            "{}",
            std::mem::size_of::<Route>()
        );
    }
}
