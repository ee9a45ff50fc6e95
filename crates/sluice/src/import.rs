//! `sluice import [FILE]`: the resources of an APISIX standalone file (apisix.yaml) written through the running
//! instance's Admin API, so they apply live in the traditional role (embedded store or etcd), where the file is
//! otherwise read only to seed an empty store. The whole file is parsed and compiled first (a broken file writes
//! nothing); then each resource is PUT in dependency order (upstreams before the services and routes that use
//! them), each validated by the Admin API as any write. Resources absent from the file are left as they are.
//! Going through the Admin API rather than the store file works with etcd, and with the embedded store while
//! the gateway holds it open.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;
use sluice_admin::{AdminConfig, Role};
use sluice_model::Resources;
use sluice_proxy::Snapshot;
use sluice_store::standalone;

pub fn run(config: &Path, file: Option<PathBuf>) -> Result<String, String> {
    let node = crate::start::load(config)?.checked.config;
    if sluice_store::provider_name(&node) == "yaml" {
        return Err(format!(
            "{} selects standalone mode (config_provider: yaml): the gateway reads apisix.yaml itself and \
             applies edits live; there is no store to import into",
            config.display()
        ));
    }
    if !node.apisix.enable_admin {
        return Err(
            "the Admin API is disabled (apisix.enable_admin: false); import writes through it"
                .into(),
        );
    }
    let admin = AdminConfig::from_node_config(&node)?;
    let key = admin
        .keys
        .iter()
        .find(|k| k.role == Role::Admin && !k.key.is_empty())
        .map(|k| k.key.clone());
    let path = file.unwrap_or_else(|| config.with_file_name("apisix.yaml"));
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let res = standalone::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(e) = res.missing_reference() {
        return Err(format!("{}: {e}", path.display()));
    }
    Snapshot::compile(&res, 0).map_err(|e| format!("{}: {e}", path.display()))?;
    let entries = entries(&res);
    let addr = connect_addr(admin.listen);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async {
        for (i, (k, v)) in entries.iter().enumerate() {
            put(addr, key.as_deref(), k, v).await.map_err(|e| {
                let done = if i == 0 {
                    "nothing was written".to_owned()
                } else {
                    format!("the {i} resource(s) before it were written")
                };
                format!("{k}: {e}; {done}")
            })?;
        }
        Ok::<(), String>(())
    })?;
    Ok(format!(
        "imported {} resource(s) from {} through the Admin API at {addr}",
        entries.len(),
        path.display()
    ))
}

/// A wildcard listen address is reached on loopback.
fn connect_addr(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, listen.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, listen.port()).into(),
        _ => listen,
    }
}

/// Every resource as (store key, value), referenced kinds before the kinds that reference them.
pub fn entries(res: &Resources) -> Vec<(String, Value)> {
    fn json<T: serde::Serialize>(v: &T) -> Value {
        serde_json::to_value(v).unwrap_or(Value::Null)
    }
    let mut out = Vec::new();
    let mut add = |key: String, v: Value| out.push((key, v));
    for s in &res.secrets {
        add(format!("secrets/{}", s.id), json(s));
    }
    for u in &res.upstreams {
        add(
            format!("upstreams/{}", u.id.as_ref().map_or("", |i| i.0.as_str())),
            json(u),
        );
    }
    for s in &res.services {
        add(format!("services/{}", s.id), json(s));
    }
    for p in &res.plugin_configs {
        add(format!("plugin_configs/{}", p.id), json(p));
    }
    for g in &res.consumer_groups {
        add(format!("consumer_groups/{}", g.id), json(g));
    }
    for c in &res.consumers {
        add(format!("consumers/{}", c.username), json(c));
    }
    for c in &res.credentials {
        let mut v = json(c);
        // The owner is in the key, not the body.
        if let Some(m) = v.as_object_mut() {
            m.remove("consumer");
        }
        add(format!("consumers/{}/credentials/{}", c.consumer, c.id), v);
    }
    for s in &res.ssls {
        add(format!("ssls/{}", s.id), json(s));
    }
    for p in &res.protos {
        add(format!("protos/{}", p.id), json(p));
    }
    for m in &res.plugin_metadata {
        add(format!("plugin_metadata/{}", m.id), json(m));
    }
    for g in &res.global_rules {
        add(format!("global_rules/{}", g.id), json(g));
    }
    for r in &res.routes {
        add(format!("routes/{}", r.id), json(r));
    }
    out
}

/// One `PUT /apisix/admin/{key}` on its own connection.
async fn put(addr: SocketAddr, api_key: Option<&str>, key: &str, v: &Value) -> Result<(), String> {
    let io = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .map_err(|_| format!("connecting to the Admin API at {addr}: timed out"))?
    .map_err(|e| format!("connecting to the Admin API at {addr}: {e} (is the gateway running?)"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| format!("Admin API at {addr}: {e}"))?;
    tokio::spawn(conn);
    let mut req = hyper::Request::put(format!("/apisix/admin/{key}"))
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    if let Some(k) = api_key {
        req = req.header("x-api-key", k);
    }
    let req = req
        .body(Full::new(Bytes::from(v.to_string())))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| "the Admin API did not answer within 30 s".to_owned())??;
    if status.is_success() {
        return Ok(());
    }
    let msg = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("error_msg")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    Err(format!("the Admin API answered {status}: {msg}"))
}
