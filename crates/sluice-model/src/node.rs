//! The node configuration, `conf/config.yaml`, laid out as APISIX's for the keys APISIX has, so an APISIX user's
//! file reads the same. [`NodeConfig::from_doc`] reads it strictly (see `node/check.rs`): unknown keys and wrong
//! types are errors naming the key; APISIX keys Sluice does not use are warnings.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

mod check;

/// A node configuration that passed the checks, with one warning per ignored APISIX key.
#[derive(Debug, Clone)]
pub struct CheckedConfig {
    pub config: NodeConfig,
    pub warnings: Vec<String>,
    /// The document as read, for comparing two versions key by key (reload).
    pub doc: Value,
}

impl NodeConfig {
    /// Reads config.yaml parsed into a JSON value (`null` for an empty file). Every error is reported, one per
    /// line, each naming its key path.
    pub fn from_doc(doc: &Value) -> Result<CheckedConfig, Vec<String>> {
        let found = check::check(doc);
        if !found.errors.is_empty() {
            return Err(found.errors);
        }
        let config = match doc {
            Value::Null => NodeConfig::default(),
            // Empty keys mean "the default", as in APISIX; serde would read `null` as a wrong type.
            v => serde_json::from_value(strip_nulls(v.clone())).map_err(|e| vec![e.to_string()])?,
        };
        Ok(CheckedConfig {
            config,
            warnings: found.warnings,
            doc: doc.clone(),
        })
    }

    /// Whether Sluice reads the key at `path` (`a.b.c`, list items as `[]`), so a change to it matters; false
    /// for APISIX keys Sluice ignores and for unknown keys.
    pub fn reads_key(path: &str) -> bool {
        check::reads(path)
    }
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(l) => Value::Array(l.into_iter().map(strip_nulls).collect()),
        v => v,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeConfig {
    pub apisix: ApisixSection,
    pub nginx_config: NginxConfigSection,
    pub deployment: DeploymentSection,
    /// Sluice-only knobs that have no APISIX equivalent.
    pub sluice: SluiceSection,
    /// `plugins:` list as in APISIX's config.yaml; `None` means every built-in plugin is enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugins: Option<Vec<String>>,
    /// `plugin_attr:` per-plugin node settings (e.g. prometheus export address).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_attr: Option<serde_json::Map<String, Value>>,
    /// `wasm:` proxy-wasm modules loaded as plugins (APISIX's `wasm.plugins`).
    #[serde(skip_serializing_if = "WasmSection::is_empty")]
    pub wasm: WasmSection,
}

/// APISIX's `wasm` section: each module becomes a plugin of its `name`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WasmSection {
    pub plugins: Vec<WasmPlugin>,
}

impl WasmSection {
    pub fn is_empty(&self) -> bool {
        self.plugins.is_empty()
    }
}

/// One `wasm.plugins` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WasmPlugin {
    pub name: String,
    pub priority: i32,
    /// The `.wasm` file; a relative path is taken from the config file's directory.
    pub file: String,
    /// Where `proxy_on_request_headers` runs: `access` (APISIX's default) or `rewrite`.
    #[serde(default = "default_wasm_phase")]
    pub http_request_phase: String,
    /// Sluice: the longest one call into the filter may run, in seconds (default 0.1); past it the call traps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout: Option<f64>,
    /// Sluice: the most linear memory one instance may have, in bytes (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// Sluice: the largest body, in bytes, the filter may buffer (a response body it asks for) or set (default
    /// 4 MiB); past it the response is a 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_size: Option<u64>,
}

fn default_wasm_phase() -> String {
    "access".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApisixSection {
    #[serde(deserialize_with = "listen_list")]
    pub node_listen: Vec<ListenAddr>,
    pub enable_admin: bool,
    pub enable_http2: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssl: Option<Value>,
    pub data_encryption: DataEncryptionSection,
    /// Route on the path with servlet `;` parameters cut from each segment (APISIX, default false).
    pub normalize_uri_like_servlet: bool,
    /// APISIX `proxy_mode`: `http` (the default), `stream` or `http&stream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_mode: Option<String>,
    /// APISIX `stream_proxy` (`tcp`, `udp` listen lists; `only`), read by `sluice_proxy::stream_listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_proxy: Option<Value>,
    /// `apisix.proxy_cache`: the proxy-cache plugin's zones; `None` means APISIX's defaults (`disk_cache_one` and
    /// `memory_cache`, `cache_ttl: 10s`). Sizes and levels are checked when the zones are built (sluice-plugins).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_cache: Option<ProxyCacheSection>,
    /// APISIX `proxy_protocol`: listeners that take a PROXY header first, and sending one to stream upstreams.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocolSection>,
}

/// `apisix.proxy_protocol` as APISIX's config.yaml writes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyProtocolSection {
    /// An extra cleartext HTTP listener (all interfaces) whose connections open with a PROXY header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_http_port: Option<u16>,
    /// The same for TLS (the header comes before the handshake).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen_https_port: Option<u16>,
    /// Every `stream_proxy.tcp` listener takes a PROXY header first.
    pub enable_tcp_pp: bool,
    /// The stream proxy opens each upstream connection with a PROXY v1 header naming the client.
    pub enable_tcp_pp_to_upstream: bool,
}

impl ApisixSection {
    /// Whether the HTTP and the stream (L4) proxies run: APISIX's `proxy_mode` (`http` by default, `stream`,
    /// `http&stream`); without `proxy_mode`, APISIX 2.x's `stream_proxy.only` (`true`: stream only, `false`: both).
    pub fn proxy_modes(&self) -> (bool, bool) {
        match self.proxy_mode.as_deref() {
            Some("stream") => (false, true),
            Some("http&stream") => (true, true),
            Some(_) => (true, false),
            None => match self
                .stream_proxy
                .as_ref()
                .and_then(|s| s.get("only"))
                .and_then(Value::as_bool)
            {
                Some(true) => (false, true),
                Some(false) => (true, true),
                None => (true, false),
            },
        }
    }
}

/// `apisix.proxy_cache` as APISIX's config.yaml writes it: sizes are nginx sizes (`50m`, `1G`), `cache_ttl` an
/// nginx time (`10s`), `cache_levels` nginx's `levels` (`1:2`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyCacheSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_ttl: Option<NginxTime>,
    pub zones: Vec<CacheZoneSection>,
}

/// One `apisix.proxy_cache.zones[]` entry: a memory zone has no `disk_path`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheZoneSection {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_levels: Option<String>,
}

impl Default for ApisixSection {
    fn default() -> Self {
        ApisixSection {
            node_listen: vec![ListenAddr {
                ip: "0.0.0.0".into(),
                port: 9080,
            }],
            enable_admin: true,
            enable_http2: true,
            ssl: None,
            data_encryption: DataEncryptionSection::default(),
            normalize_uri_like_servlet: false,
            proxy_mode: None,
            stream_proxy: None,
            proxy_cache: None,
            proxy_protocol: None,
        }
    }
}

/// `apisix.data_encryption`, with APISIX's defaults (apisix/cli/config.lua): encrypt the plugins' `encrypt_fields`,
/// and APISIX's two sample keys, so data an APISIX node with default settings wrote reads the same. Those keys are
/// public: production configurations set their own. `keyring` is one key or a list (16 or 32 bytes each); an
/// empty list stores everything in clear (`null`, like any empty key, means the default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DataEncryptionSection {
    pub enable_encrypt_fields: bool,
    #[serde(deserialize_with = "keyring_list")]
    pub keyring: Vec<String>,
}

impl Default for DataEncryptionSection {
    fn default() -> Self {
        DataEncryptionSection {
            enable_encrypt_fields: true,
            keyring: vec!["qeddd145sfvddff3".into(), "edd1c9f0985e76a2".into()],
        }
    }
}

fn keyring_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Keys {
        One(String),
        List(Vec<String>),
    }
    Ok(match Option::<Keys>::deserialize(d)? {
        None => Vec::new(),
        Some(Keys::One(k)) => vec![k],
        Some(Keys::List(l)) => l,
    })
}

/// One listen address; APISIX writes it as a bare port (`9080`) or `{ip, port}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenAddr {
    #[serde(default = "any_ip")]
    pub ip: String,
    pub port: u16,
}

fn any_ip() -> String {
    "0.0.0.0".into()
}

impl ListenAddr {
    pub fn socket_addr(&self) -> Result<std::net::SocketAddr, String> {
        let ip: std::net::IpAddr = self
            .ip
            .parse()
            .map_err(|_| format!("invalid listen ip {:?}", self.ip))?;
        Ok(std::net::SocketAddr::new(ip, self.port))
    }
}

fn listen_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ListenAddr>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum One {
        Port(u16),
        Addr(ListenAddr),
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Many {
        One(One),
        List(Vec<One>),
    }
    let conv = |o: One| match o {
        One::Port(port) => ListenAddr { ip: any_ip(), port },
        One::Addr(a) => a,
    };
    Ok(match Many::deserialize(d)? {
        Many::One(o) => vec![conv(o)],
        Many::List(l) => l.into_iter().map(conv).collect(),
    })
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NginxConfigSection {
    /// `auto` (one per core) or a number; Sluice runs this many worker threads.
    pub worker_processes: WorkerCount,
    /// Where the error log goes. APISIX writes `logs/error.log`; Sluice keeps stderr unless this is set
    /// (a foreground process's log belongs to its terminal or supervisor). Relative paths are taken from the
    /// prefix (the config file's directory's parent, as APISIX's `conf/` sits in its prefix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_log: Option<String>,
    /// nginx's levels: debug, info, notice, warn, error, crit, alert, emerg (APISIX default warn).
    pub error_log_level: String,
    pub http: NginxHttpSection,
    /// `nginx_config.stream`: the stream proxy's access log.
    pub stream: NginxStreamSection,
}

/// APISIX's default `nginx_config.stream.access_log_format` (apisix/cli/config.lua).
pub const DEFAULT_STREAM_ACCESS_LOG_FORMAT: &str =
    "$remote_addr [$time_local] $protocol $status $bytes_sent $bytes_received $session_time";

/// `nginx_config.stream`: the stream (L4) access log, off by default as in APISIX.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NginxStreamSection {
    pub enable_access_log: bool,
    /// A path or `/dev/stdout`; relative paths are taken from the prefix.
    pub access_log: String,
    /// nginx stream `log_format` with `$variables`.
    pub access_log_format: String,
    pub access_log_format_escape: String,
}

impl Default for NginxStreamSection {
    fn default() -> Self {
        NginxStreamSection {
            enable_access_log: false,
            access_log: "logs/access_stream.log".into(),
            access_log_format: DEFAULT_STREAM_ACCESS_LOG_FORMAT.into(),
            access_log_format_escape: "default".into(),
        }
    }
}

impl Default for NginxConfigSection {
    fn default() -> Self {
        NginxConfigSection {
            worker_processes: WorkerCount::default(),
            error_log: None,
            error_log_level: "warn".into(),
            http: NginxHttpSection::default(),
            stream: NginxStreamSection::default(),
        }
    }
}

/// APISIX's default `nginx_config.http.access_log_format` (conf/config.yaml.example).
pub const DEFAULT_ACCESS_LOG_FORMAT: &str = "$remote_addr - $remote_user [$time_local] $http_host \"$request\" $status $body_bytes_sent $request_time \"$http_referer\" \"$http_user_agent\" $upstream_addr $upstream_status $upstream_response_time \"$upstream_scheme://$upstream_host$upstream_uri\"";

/// `nginx_config.http`: the access log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NginxHttpSection {
    /// Longest wait between two reads of a request body (nginx `client_body_timeout`, APISIX default 60s).
    pub client_body_timeout: NginxTime,
    pub enable_access_log: bool,
    /// A path, `/dev/stdout`, or (Sluice) a list of them; relative paths are taken from the prefix.
    #[serde(deserialize_with = "one_or_many")]
    pub access_log: Vec<String>,
    /// Bytes each worker gathers before handing them to the writer (nginx `buffer=`).
    pub access_log_buffer: usize,
    /// nginx `log_format` with `$variables`.
    pub access_log_format: String,
    /// `default` (nginx's `\xHH` for `"`, `\\` and control bytes), `json` or `none`.
    pub access_log_format_escape: String,
}

impl Default for NginxHttpSection {
    fn default() -> Self {
        NginxHttpSection {
            client_body_timeout: NginxTime(std::time::Duration::from_secs(60)),
            enable_access_log: true,
            access_log: vec!["logs/access.log".into()],
            access_log_buffer: 16384,
            access_log_format: DEFAULT_ACCESS_LOG_FORMAT.into(),
            access_log_format_escape: "default".into(),
        }
    }
}

/// An nginx time value: `60s`, `500ms`, `1m30s`, or a bare number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NginxTime(pub std::time::Duration);

impl NginxTime {
    pub fn as_secs_f64(self) -> f64 {
        self.0.as_secs_f64()
    }

    /// nginx's units: ms, s, m, h, d, w, M (30 days), y (365 days); no unit means seconds.
    pub fn parse(s: &str) -> Result<NginxTime, String> {
        let bad = || format!("invalid nginx time {s:?}");
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(bad());
        }
        let mut ms: u64 = 0;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
            let per: u64 = match &rest[..unit] {
                "ms" => 1,
                "" | "s" => 1000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                "w" => 7 * 86_400_000,
                "M" => 30 * 86_400_000,
                "y" => 365 * 86_400_000,
                _ => return Err(bad()),
            };
            rest = rest[unit..].trim_start();
            ms = n
                .checked_mul(per)
                .and_then(|v| v.checked_add(ms))
                .ok_or_else(bad)?;
        }
        Ok(NginxTime(std::time::Duration::from_millis(ms)))
    }
}

impl Serialize for NginxTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", self.0.as_millis()))
    }
}

impl<'de> Deserialize<'de> for NginxTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => NginxTime::parse(&s).map_err(serde::de::Error::custom),
            Value::Number(n) => n
                .as_f64()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| NginxTime(std::time::Duration::from_secs_f64(v)))
                .ok_or_else(|| serde::de::Error::custom("nginx time must be non-negative")),
            v => Err(serde::de::Error::custom(format!(
                "nginx time must be a string like \"60s\" or a number, got {v}"
            ))),
        }
    }
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Many {
        One(String),
        List(Vec<String>),
    }
    Ok(match Many::deserialize(d)? {
        Many::One(s) => vec![s],
        Many::List(l) => l,
    })
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WorkerCount {
    #[default]
    Auto,
    Fixed(usize),
}

impl WorkerCount {
    pub fn resolve(self) -> usize {
        match self {
            WorkerCount::Fixed(n) if n > 0 => n,
            _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

impl Serialize for WorkerCount {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            WorkerCount::Auto => s.serialize_str("auto"),
            WorkerCount::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for WorkerCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) if s == "auto" => Ok(WorkerCount::Auto),
            Value::Number(n) => n
                .as_u64()
                .map(|n| WorkerCount::Fixed(n as usize))
                .ok_or_else(|| {
                    serde::de::Error::custom("worker_processes must be a positive integer")
                }),
            v => Err(serde::de::Error::custom(format!(
                "worker_processes must be \"auto\" or an integer, got {v}"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeploymentSection {
    /// traditional | data_plane | control_plane
    pub role: String,
    pub role_data_plane: RoleDataPlane,
    pub role_traditional: RoleTraditional,
    pub role_control_plane: RoleControlPlane,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd: Option<Value>,
}

impl Default for DeploymentSection {
    fn default() -> Self {
        DeploymentSection {
            role: "traditional".into(),
            role_data_plane: RoleDataPlane::default(),
            role_traditional: RoleTraditional::default(),
            role_control_plane: RoleControlPlane::default(),
            admin: None,
            etcd: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoleDataPlane {
    /// yaml | etcd | json
    pub config_provider: String,
}

impl Default for RoleDataPlane {
    fn default() -> Self {
        RoleDataPlane {
            config_provider: "yaml".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoleTraditional {
    /// Sluice's default is its embedded store; `etcd` selects an etcd cluster.
    pub config_provider: String,
}

impl Default for RoleTraditional {
    fn default() -> Self {
        RoleTraditional {
            config_provider: "embedded".into(),
        }
    }
}

/// `control_plane`: the Admin API on etcd, no proxy listeners (data planes watch the same etcd).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoleControlPlane {
    /// `etcd`, the only provider several nodes can share.
    pub config_provider: String,
}

impl Default for RoleControlPlane {
    fn default() -> Self {
        RoleControlPlane {
            config_provider: "etcd".into(),
        }
    }
}

/// Proxy limits and timeouts (seconds), Sluice-specific; defaults follow nginx's as APISIX configures it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SluiceSection {
    pub client_header_timeout: f64,
    pub keepalive_timeout: f64,
    pub graceful_shutdown_timeout: f64,
    /// 0 = unlimited, as APISIX's default `client_max_body_size: 0`.
    pub client_max_body_size: u64,
    pub max_connections: usize,
    /// How often the standalone provider checks apisix.yaml for changes, in seconds.
    pub config_poll_interval: f64,
    /// Where the embedded store keeps its file; relative paths are taken from the config file's directory.
    pub data_dir: String,
    /// The running instance's pid file, locked while it runs (one instance per file); relative paths are taken
    /// from the config file's directory. Default: `sluice.pid` beside config.yaml.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid_file: Option<String>,
    /// With etcd: the lease TTL (seconds) of this node's `/data_plane/server_info/{id}` key, so a node that
    /// died leaves the registry this long after its last renewal.
    pub node_ttl: u64,
}

impl Default for SluiceSection {
    fn default() -> Self {
        SluiceSection {
            client_header_timeout: 60.0,
            keepalive_timeout: 60.0,
            graceful_shutdown_timeout: 10.0,
            client_max_body_size: 0,
            max_connections: 65536,
            config_poll_interval: 1.0,
            data_dir: "../.data".into(),
            pid_file: None,
            node_ttl: 30,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_time_units_and_client_body_timeout() {
        let ms = |s: &str| NginxTime::parse(s).map(|t| t.0.as_millis());
        assert_eq!(ms("60s"), Ok(60_000));
        assert_eq!(ms("500ms"), Ok(500));
        assert_eq!(ms("1m30s"), Ok(90_000));
        assert_eq!(ms("5"), Ok(5_000));
        for bad in ["", "s", "5x", "-1s", "1.5s", "99999999999999999999y"] {
            assert!(NginxTime::parse(bad).is_err(), "{bad:?}");
        }
        let n: NodeConfig = serde_json::from_value(serde_json::json!({
            "nginx_config": {"http": {"client_body_timeout": "15s"}},
            "apisix": {"normalize_uri_like_servlet": true}
        }))
        .unwrap();
        assert_eq!(n.nginx_config.http.client_body_timeout.0.as_secs(), 15);
        assert!(n.apisix.normalize_uri_like_servlet);
        let d = NodeConfig::default();
        assert_eq!(d.nginx_config.http.client_body_timeout.0.as_secs(), 60);
        assert!(!d.apisix.normalize_uri_like_servlet);
    }
}
