//! APISIX's Consul discovery (`discovery.consul` in config.yaml, `discovery_type: consul`): `service_name` is a
//! Consul service name; its nodes are the passing instances of `/v1/health/service/{name}?passing=true`
//! (`Service.Address`, else the node's `Address`; `Service.Port`, 80 when 0), each with the configured `weight`.
//!
//! As APISIX's `discovery/consul`: per server, blocking queries (`?index=N&wait=Ws`) on `/v1/catalog/services` and
//! `/v1/health/state/any` wait for a change (`keepalive: true`, the default; `false`: a poll every
//! `fetch_interval` seconds); when either index moved, the catalog is listed and every service not in
//! `skip_services` (and not `consul`) is read again. A failed round keeps the last nodes and is retried after 1 s,
//! doubling to 30 s. `default_service` answers for a name no server lists. `dump.path` keeps the last services in
//! a file (APISIX's `{services, last_update, expire}` JSON), read at start when `load_on_init` (unless older than
//! `expire` seconds, 0: never too old), so a node that starts while Consul is away serves the last known nodes.
//!
//! Only `http://` servers: the client here is a minimal HTTP/1.0 GET (each answer read to its end, at most
//! 16 MiB), the token sent as `X-Consul-Token` (never in the URL).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sluice_model::Node;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Largest answer read from Consul.
const MAX_BODY: usize = 16 << 20;

/// `discovery.consul` in config.yaml.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsulConfig {
    /// `host:port` of each `http://` server.
    pub servers: Vec<String>,
    pub token: String,
    pub fetch_interval: Duration,
    pub keepalive: bool,
    pub weight: u32,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Blocking queries' `wait`.
    pub wait: Duration,
    pub sort: Sort,
    pub skip_services: Vec<String>,
    pub default_service: Option<Node>,
    pub dump: Option<Dump>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Origin,
    Host,
    Port,
    Combine,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Dump {
    pub path: String,
    pub load_on_init: bool,
    /// Seconds; 0: a dump never expires.
    pub expire: u64,
}

fn int(v: &Value, key: &str, min: i64, default: i64) -> Result<i64, String> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => x
            .as_i64()
            .filter(|n| *n >= min)
            .ok_or_else(|| format!("discovery.consul.{key}: an integer of at least {min}")),
    }
}

impl ConsulConfig {
    pub fn from_value(v: &Value) -> Result<ConsulConfig, String> {
        let servers = v
            .get("servers")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
            .ok_or("discovery.consul.servers: required, a list of \"http://host:port\"")?
            .iter()
            .map(|s| {
                let s = s.as_str().unwrap_or("");
                let rest = s.strip_prefix("http://").ok_or_else(|| {
                    format!("discovery.consul.servers: {s:?}: only http:// servers are supported")
                })?;
                let rest = rest.trim_end_matches('/');
                if rest.is_empty() || rest.contains(['/', '@', '?', '#', ' ']) {
                    return Err(format!(
                        "discovery.consul.servers: {s:?} is not http://host:port"
                    ));
                }
                Ok(
                    if rest.rsplit_once(':').is_some_and(|(h, p)| {
                        !h.is_empty() && !h.ends_with(':') && p.parse::<u16>().is_ok()
                    }) {
                        rest.to_owned()
                    } else {
                        format!("{rest}:80")
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let token = match v.get("token") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err("discovery.consul.token: a string".into()),
        };
        let keepalive = match v.get("keepalive") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("discovery.consul.keepalive: a boolean".into()),
        };
        let t = v.get("timeout").cloned().unwrap_or(json!({}));
        let sort = match v.get("sort_type").and_then(Value::as_str) {
            None | Some("origin") => Sort::Origin,
            Some("host_sort") => Sort::Host,
            Some("port_sort") => Sort::Port,
            Some("combine_sort") => Sort::Combine,
            Some(o) => {
                return Err(format!(
                    "discovery.consul.sort_type: {o:?} is not origin, host_sort, port_sort or combine_sort"
                ))
            }
        };
        let weight = int(v, "weight", 1, 1)?;
        let skip_services = match v.get("skip_services") {
            None => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or("discovery.consul.skip_services: a list of strings")?,
            Some(_) => return Err("discovery.consul.skip_services: a list of strings".into()),
        };
        let default_service = match v.get("default_service") {
            None => None,
            Some(d) => {
                let host = d
                    .get("host")
                    .and_then(Value::as_str)
                    .ok_or("discovery.consul.default_service.host: required, a string")?;
                let port = d
                    .get("port")
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok())
                    .ok_or("discovery.consul.default_service.port: required, a port")?;
                Some(Node {
                    host: host.to_owned(),
                    port: Some(port),
                    weight: weight as u32,
                    priority: 0,
                    metadata: None,
                })
            }
        };
        let dump = match v.get("dump") {
            None => None,
            Some(d) => Some(Dump {
                path: d
                    .get("path")
                    .and_then(Value::as_str)
                    .filter(|p| !p.is_empty())
                    .ok_or("discovery.consul.dump.path: required, a path")?
                    .to_owned(),
                load_on_init: d
                    .get("load_on_init")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
                expire: d.get("expire").and_then(Value::as_u64).unwrap_or(0),
            }),
        };
        let ms = |k: &str, def: i64| int(&t, k, 1, def).map(|n| Duration::from_millis(n as u64));
        Ok(ConsulConfig {
            servers,
            token,
            fetch_interval: Duration::from_secs(int(v, "fetch_interval", 1, 3)? as u64),
            keepalive,
            weight: weight as u32,
            connect_timeout: ms("connect", 2000)?,
            read_timeout: ms("read", 2000)?,
            wait: Duration::from_secs(int(&t, "wait", 1, 60)? as u64),
            sort,
            skip_services,
            default_service,
            dump,
        })
    }
}

/// Services by name, per server.
type Services = BTreeMap<String, Vec<Node>>;
type Known = Arc<Mutex<Vec<Option<Services>>>>;

pub(crate) struct Handle {
    known: Known,
    default_service: Option<Node>,
}

impl Handle {
    pub(crate) fn spawn(cfg: ConsulConfig, changed: watch::Sender<u64>) -> Handle {
        let mut start = vec![None; cfg.servers.len()];
        if let Some(d) = cfg.dump.as_ref().filter(|d| d.load_on_init) {
            match read_dump(d) {
                Ok(Some(s)) => {
                    tracing::info!(path = %d.path, services = s.len(), "consul discovery: nodes from the dump file until Consul answers");
                    start[0] = Some(s);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(path = %d.path, error = %e, "consul discovery: dump file not used")
                }
            }
        }
        let known: Known = Arc::new(Mutex::new(start));
        let cfg = Arc::new(cfg);
        for i in 0..cfg.servers.len() {
            tokio::spawn(follow(cfg.clone(), i, known.clone(), changed.clone()));
        }
        Handle {
            known,
            default_service: cfg.default_service.clone(),
        }
    }

    /// The nodes of `service_name` over every server (each address once, in server order); `default_service`
    /// when no server lists it; empty without one.
    pub(crate) fn nodes(&self, service_name: &str) -> Vec<Node> {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<Node> = Vec::new();
        let mut listed = false;
        for s in known.iter().flatten() {
            if let Some(nodes) = s.get(service_name) {
                listed = true;
                for n in nodes {
                    if !out.iter().any(|o| o.host == n.host && o.port == n.port) {
                        out.push(n.clone());
                    }
                }
            }
        }
        if !listed {
            if let Some(d) = &self.default_service {
                out.push(d.clone());
            }
        }
        out
    }
}

async fn follow(cfg: Arc<ConsulConfig>, i: usize, known: Known, changed: watch::Sender<u64>) {
    let server = &cfg.servers[i];
    let (mut catalog_index, mut health_index) = (0u64, 0u64);
    let mut backoff = Duration::from_secs(1);
    let mut failures = 0u32;
    loop {
        if changed.is_closed() {
            return;
        }
        // Wait for a change (blocking queries on both indexes), or poll.
        if catalog_index != 0 && cfg.keepalive {
            let block = |path: &'static str, index: u64| {
                let cfg = cfg.clone();
                async move {
                    get(
                        &cfg,
                        server,
                        &format!("{path}?index={index}&wait={}s", cfg.wait.as_secs()),
                        // Consul adds up to wait/16 of jitter to a blocking query.
                        cfg.wait + cfg.wait / 16 + cfg.read_timeout,
                    )
                    .await
                }
            };
            let r = tokio::select! {
                r = block("/v1/catalog/services", catalog_index) => r,
                r = block("/v1/health/state/any", health_index) => r,
            };
            if let Err(e) = r {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(30) {
                    tracing::warn!(server, error = %e, "consul discovery: watch failed; keeping the last nodes");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                // List afresh next: a restarted Consul's indexes may be below the ones held.
                (catalog_index, health_index) = (0, 0);
                continue;
            }
        } else if catalog_index != 0 {
            tokio::time::sleep(cfg.fetch_interval).await;
        }
        match fetch(&cfg, server, catalog_index, health_index).await {
            Ok((ci, hi, services)) => {
                if failures > 0 {
                    tracing::info!(server, "consul discovery: Consul answers again");
                }
                (catalog_index, health_index) = (ci.max(1), hi.max(1));
                backoff = Duration::from_secs(1);
                failures = 0;
                if let Some(services) = services {
                    let moved = {
                        let mut k = known.lock().unwrap_or_else(|p| p.into_inner());
                        let moved = k[i].as_ref() != Some(&services);
                        if moved {
                            k[i] = Some(services.clone());
                        }
                        moved
                    };
                    if moved {
                        changed.send_modify(|g| *g += 1);
                        // The dump file holds the first server's view (with one server, APISIX's).
                        if let Some(d) = cfg.dump.as_ref().filter(|_| i == 0) {
                            write_dump(d, &services);
                        }
                    }
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(30) {
                    tracing::warn!(server, error = %e, "consul discovery: listing failed; keeping the last nodes");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// One listing: the indexes, and the services (`None`: neither index moved since `ci`/`hi`).
async fn fetch(
    cfg: &ConsulConfig,
    server: &str,
    ci: u64,
    hi: u64,
) -> Result<(u64, u64, Option<Services>), String> {
    let (catalog_idx, catalog) = get(cfg, server, "/v1/catalog/services", cfg.read_timeout).await?;
    let (health_idx, _) = get(cfg, server, "/v1/health/state/any", cfg.read_timeout).await?;
    if catalog_idx == ci && health_idx == hi && ci != 0 {
        return Ok((ci, hi, None));
    }
    let Value::Object(names) = catalog else {
        return Err("/v1/catalog/services: not an object".into());
    };
    let mut out = Services::new();
    for name in names.keys() {
        if name == "consul" || cfg.skip_services.iter().any(|s| s == name) {
            continue;
        }
        let path = format!(
            "/v1/health/service/{}?passing=true",
            percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC)
        );
        let (_, entries) = get(cfg, server, &path, cfg.read_timeout).await?;
        let nodes = nodes_of(&entries, cfg.weight, cfg.sort);
        if !nodes.is_empty() {
            out.insert(name.clone(), nodes);
        }
    }
    Ok((catalog_idx, health_idx, Some(out)))
}

/// The nodes of one `/v1/health/service/{name}` answer: one per address, entries without a usable address
/// skipped.
pub(crate) fn nodes_of(entries: &Value, weight: u32, sort: Sort) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    for e in entries.as_array().map(Vec::as_slice).unwrap_or_default() {
        let Some(svc) = e.get("Service").filter(|s| s.is_object()) else {
            continue;
        };
        let addr = svc
            .get("Address")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
            .or_else(|| e.pointer("/Node/Address").and_then(Value::as_str))
            .filter(|a| !a.is_empty() && a.len() <= 253 && !a.contains(['/', ' ', '@']));
        let Some(host) = addr else { continue };
        let port = match svc.get("Port").and_then(Value::as_u64) {
            None | Some(0) => 80,
            Some(p) => match u16::try_from(p) {
                Ok(p) => p,
                Err(_) => continue,
            },
        };
        if nodes.iter().any(|n| n.host == host && n.port == Some(port)) {
            continue;
        }
        nodes.push(Node {
            host: host.to_owned(),
            port: Some(port),
            weight,
            priority: 0,
            metadata: None,
        });
    }
    match sort {
        Sort::Origin => {}
        Sort::Host => nodes.sort_by(|a, b| a.host.cmp(&b.host)),
        Sort::Port => nodes.sort_by_key(|n| n.port),
        Sort::Combine => nodes.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port))),
    }
    nodes
}

/// `GET path` on `server`: the answer's `X-Consul-Index` and JSON body; anything but a 200 is an error.
async fn get(
    cfg: &ConsulConfig,
    server: &str,
    path: &str,
    read_timeout: Duration,
) -> Result<(u64, Value), String> {
    let mut c = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(server))
        .await
        .map_err(|_| format!("connect to {server} timed out"))?
        .map_err(|e| format!("connect to {server}: {e}"))?;
    let token = if cfg.token.is_empty() {
        String::new()
    } else {
        format!("X-Consul-Token: {}\r\n", cfg.token)
    };
    let req =
        format!("GET {path} HTTP/1.0\r\nHost: {server}\r\n{token}Accept: application/json\r\n\r\n");
    let mut raw = Vec::new();
    tokio::time::timeout(read_timeout, async {
        c.write_all(req.as_bytes()).await?;
        let mut buf = [0u8; 16384];
        loop {
            let n = c.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            if raw.len() + n > MAX_BODY {
                return Err(std::io::Error::other("answer over 16 MiB"));
            }
            raw.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .map_err(|_| format!("GET {path}: timed out"))?
    .map_err(|e| format!("GET {path}: {e}"))?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(&raw) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err(format!("GET {path}: not an HTTP answer")),
    };
    if resp.code != Some(200) {
        return Err(format!("GET {path}: status {}", resp.code.unwrap_or(0)));
    }
    let index = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("x-consul-index"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .unwrap_or(0);
    let body = serde_json::from_slice(&raw[head..]).map_err(|e| format!("GET {path}: {e}"))?;
    Ok((index, body))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn write_dump(d: &Dump, s: &Services) {
    let services: serde_json::Map<String, Value> = s
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::to_value(v).unwrap_or(Value::Null)))
        .collect();
    let doc = json!({"services": services, "last_update": now_secs(), "expire": d.expire});
    // Written aside and renamed, so a reader never sees half a file.
    let tmp = format!("{}.tmp", d.path);
    let res = std::fs::write(&tmp, doc.to_string()).and_then(|()| std::fs::rename(&tmp, &d.path));
    if let Err(e) = res {
        tracing::warn!(path = %d.path, error = %e, "consul discovery: could not write the dump file");
    }
}

/// The dump's services; `None` when there is no file or it expired.
fn read_dump(d: &Dump) -> Result<Option<Services>, String> {
    let data = match std::fs::read(&d.path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let v: Value = serde_json::from_slice(&data).map_err(|e| e.to_string())?;
    let last = v
        .get("last_update")
        .and_then(Value::as_u64)
        .ok_or("no last_update")?;
    if d.expire != 0 && last + d.expire < now_secs() {
        return Ok(None);
    }
    let services = v
        .get("services")
        .and_then(Value::as_object)
        .ok_or("no services")?;
    let mut out = Services::new();
    for (k, nodes) in services {
        let nodes: Vec<Node> =
            serde_json::from_value(nodes.clone()).map_err(|e| format!("{k}: {e}"))?;
        out.insert(k.clone(), nodes);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_apisix_shape_and_refuses_bad_input() {
        let c = ConsulConfig::from_value(&json!({
            "servers": ["http://127.0.0.1:8500", "http://consul.local/"],
            "token": "t", "fetch_interval": 5, "weight": 3, "keepalive": false,
            "timeout": {"connect": 100, "read": 200, "wait": 7},
            "skip_services": ["a"], "sort_type": "port_sort",
            "default_service": {"host": "127.0.0.1", "port": 20999},
            "dump": {"path": "/tmp/x.json", "expire": 10}
        }))
        .unwrap();
        assert_eq!(c.servers, ["127.0.0.1:8500", "consul.local:80"]);
        assert_eq!((c.weight, c.keepalive, c.sort), (3, false, Sort::Port));
        assert_eq!(c.wait, Duration::from_secs(7));
        assert_eq!(c.default_service.as_ref().unwrap().weight, 3);
        assert!(c.dump.as_ref().unwrap().load_on_init);
        for bad in [
            json!({}),
            json!({"servers": []}),
            json!({"servers": ["https://127.0.0.1:8501"]}),
            json!({"servers": ["http://u:p@h:1"]}),
            json!({"servers": ["http://h:1/x"]}),
            json!({"servers": ["http://h:1"], "weight": 0}),
            json!({"servers": ["http://h:1"], "fetch_interval": "3"}),
            json!({"servers": ["http://h:1"], "sort_type": "random"}),
            json!({"servers": ["http://h:1"], "dump": {}}),
        ] {
            assert!(ConsulConfig::from_value(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn health_entries_become_nodes() {
        let entries = json!([
            {"Node": {"Address": "10.0.0.1"}, "Service": {"Address": "", "Port": 8080}},
            {"Node": {"Address": "10.0.0.2"}, "Service": {"Address": "10.0.0.9", "Port": 0}},
            {"Node": {"Address": "10.0.0.1"}, "Service": {"Address": "", "Port": 8080}},
            {"Node": {"Address": "10.0.0.3"}},
            {"Node": {"Address": "10.0.0.4"}, "Service": {"Address": "a/b", "Port": 1}},
            {"Node": {"Address": "10.0.0.5"}, "Service": {"Port": 70000}},
            "junk"
        ]);
        let n = nodes_of(&entries, 2, Sort::Origin);
        let got: Vec<_> = n
            .iter()
            .map(|n| (n.host.as_str(), n.port, n.weight))
            .collect();
        assert_eq!(
            got,
            [("10.0.0.1", Some(8080), 2), ("10.0.0.9", Some(80), 2)]
        );
        assert!(nodes_of(&json!({"x": 1}), 1, Sort::Origin).is_empty());
    }
}
