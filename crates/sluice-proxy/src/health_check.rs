//! APISIX `upstream.checks`: parsing both halves, and the active checker.
//!
//! `checks.passive` becomes the balancer's [`PassiveConfig`] (the proxy reports real traffic into it).
//! `checks.active` becomes an [`ActiveCheck`]; [`run`] keeps one probing task per node of every upstream that has
//! one, on whatever runtime it is spawned on (the binary's control runtime, never a worker: probes must not compete
//! with requests, and workers hold no cross-thread state). Probes follow lua-resty-healthcheck: healthy nodes are
//! probed every `healthy.interval`, unhealthy ones every `unhealthy.interval` (0 = not probed in that state);
//! consecutive outcomes are counted and crossing a threshold flips the node through `Health::set_healthy`.
//! An unchanged upstream keeps its runtime across reloads (see `snapshot`), so its checker keeps running; a changed
//! one gets a new checker. This module does not decide what happens when every node is down: the balancer does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;
use serde_json::Value;
use sluice_upstream::PassiveConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::snapshot::UpstreamRt;

/// Probe protocol (`checks.active.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    Tcp,
    Http,
    Https,
}

/// `checks.active`, with APISIX's schema defaults.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ActiveCheck {
    pub kind: ProbeKind,
    pub http_path: String,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub timeout: Duration,
    pub healthy_interval: Duration,
    pub healthy_successes: u8,
    pub healthy_statuses: Vec<u16>,
    pub unhealthy_interval: Duration,
    pub http_failures: u8,
    pub tcp_failures: u8,
    pub timeouts: u8,
    pub unhealthy_statuses: Vec<u16>,
    pub req_headers: Vec<String>,
}

/// Parsed `checks`.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    pub active: Option<ActiveCheck>,
    pub passive: Option<PassiveConfig>,
}

fn obj<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    v.get(k).filter(|x| !x.is_null())
}

fn num(v: Option<&Value>, k: &str, default: f64) -> Result<f64, String> {
    match v.and_then(|v| obj(v, k)) {
        None => Ok(default),
        Some(x) => x
            .as_f64()
            .filter(|n| *n >= 0.0)
            .ok_or_else(|| format!("{k} must be a non-negative number")),
    }
}

fn count(v: Option<&Value>, k: &str, default: u8) -> Result<u8, String> {
    let n = num(v, k, f64::from(default))?;
    if n > 254.0 || n.fract() != 0.0 {
        return Err(format!("{k} must be an integer in 0..=254"));
    }
    Ok(n as u8)
}

fn statuses(v: Option<&Value>, default: &[u16]) -> Result<Vec<u16>, String> {
    match v.and_then(|v| obj(v, "http_statuses")) {
        None => Ok(default.to_vec()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_u64()
                    .filter(|c| (200..=599).contains(c))
                    .map(|c| c as u16)
                    .ok_or_else(|| "http_statuses must hold codes in 200..=599".to_string())
            })
            .collect(),
        Some(_) => Err("http_statuses must be an array".into()),
    }
}

/// Parses `upstream.checks` (APISIX `health_checker` schema; unknown keys are ignored).
pub(crate) fn parse(v: &Value) -> Result<Checks, String> {
    if !v.is_object() {
        return Err("checks must be an object".into());
    }
    let active = obj(v, "active").map(parse_active).transpose()?;
    let passive = obj(v, "passive").map(parse_passive).transpose()?;
    if passive.is_some() && active.is_none() {
        // APISIX's schema: `passive` alone is rejected (`checks` requires `active`); without an active checker an
        // ejected node would never return.
        return Err("checks: passive health checks need active ones".into());
    }
    Ok(Checks { active, passive })
}

fn parse_active(a: &Value) -> Result<ActiveCheck, String> {
    let kind = match obj(a, "type").and_then(Value::as_str).unwrap_or("http") {
        "http" => ProbeKind::Http,
        "https" => ProbeKind::Https,
        "tcp" => ProbeKind::Tcp,
        other => {
            return Err(format!(
                "checks.active.type {other:?} is not http, https or tcp"
            ))
        }
    };
    let healthy = obj(a, "healthy");
    let unhealthy = obj(a, "unhealthy");
    let port = match obj(a, "port") {
        None => None,
        Some(p) => Some(
            p.as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or("checks.active.port must be in 1..=65535")?,
        ),
    };
    let secs = |n: f64| Duration::from_secs_f64(n);
    Ok(ActiveCheck {
        kind,
        http_path: obj(a, "http_path")
            .and_then(Value::as_str)
            .unwrap_or("/")
            .to_string(),
        host: obj(a, "host").and_then(Value::as_str).map(str::to_string),
        port,
        timeout: secs(num(Some(a), "timeout", 1.0)?.max(0.001)),
        healthy_interval: secs(num(healthy, "interval", 1.0)?),
        healthy_successes: count(healthy, "successes", 2)?,
        healthy_statuses: statuses(healthy, &[200, 302])?,
        unhealthy_interval: secs(num(unhealthy, "interval", 1.0)?),
        http_failures: count(unhealthy, "http_failures", 5)?,
        tcp_failures: count(unhealthy, "tcp_failures", 2)?,
        timeouts: count(unhealthy, "timeouts", 3)?,
        unhealthy_statuses: statuses(unhealthy, &[429, 404, 500, 501, 502, 503, 504, 505])?,
        req_headers: obj(a, "req_headers")
            .and_then(Value::as_array)
            .map(|h| {
                h.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
    })
}

fn parse_passive(p: &Value) -> Result<PassiveConfig, String> {
    let d = PassiveConfig::default();
    let healthy = obj(p, "healthy");
    let unhealthy = obj(p, "unhealthy");
    Ok(PassiveConfig {
        healthy_http_statuses: statuses(healthy, &d.healthy_http_statuses)?,
        healthy_successes: count(healthy, "successes", d.healthy_successes)?,
        unhealthy_http_statuses: statuses(unhealthy, &d.unhealthy_http_statuses)?,
        unhealthy_http_failures: count(unhealthy, "http_failures", d.unhealthy_http_failures)?,
        unhealthy_tcp_failures: count(unhealthy, "tcp_failures", d.unhealthy_tcp_failures)?,
        unhealthy_timeouts: count(unhealthy, "timeouts", d.unhealthy_timeouts)?,
    })
}

/// One probe's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Http,
    Tcp,
    Timeout,
    /// A status in neither list: counted nowhere.
    Neutral,
}

/// Keeps checkers running for whatever the gateway publishes, until shutdown. Spawn it with `tokio::spawn` on a
/// runtime that is not a worker's.
pub(crate) async fn run(shared: Arc<crate::server::Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    // Keyed by the runtime's address: an upstream kept across a reload keeps its checker.
    let mut running: AHashMap<usize, (Arc<UpstreamRt>, tokio::task::JoinSet<()>)> = AHashMap::new();
    let mut seen_gen = u64::MAX;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let gen = shared.generation();
        if gen != seen_gen {
            seen_gen = gen;
            let snap = shared.snapshot.load_full();
            let mut keep = AHashMap::new();
            for up in snap.upstream_runtimes() {
                let Some(check) = up.active.clone() else {
                    continue;
                };
                let key = Arc::as_ptr(up) as usize;
                let entry = match running.remove(&key) {
                    Some(e) => e,
                    None => {
                        let mut set = tokio::task::JoinSet::new();
                        for i in 0..up.nodes.len() {
                            set.spawn(probe_node(up.clone(), check.clone(), i));
                        }
                        (up.clone(), set)
                    }
                };
                keep.insert(key, entry);
            }
            // Dropping the rest aborts their tasks.
            running = keep;
        }
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

async fn probe_node(up: Arc<UpstreamRt>, check: Arc<ActiveCheck>, i: usize) {
    let health = up.balancer.health();
    let (mut ok, mut http, mut tcp, mut timeouts) = (0u8, 0u8, 0u8, 0u8);
    loop {
        let healthy = health.is_healthy(i);
        let interval = if healthy {
            check.healthy_interval
        } else {
            check.unhealthy_interval
        };
        if interval.is_zero() {
            // Not probed in this state; look again later in case passive checks or the admin flip it.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        tokio::time::sleep(interval).await;
        let outcome = probe(&up, &check, i).await;
        let trip = |n: &mut u8, limit: u8| {
            *n = n.saturating_add(1);
            limit > 0 && *n >= limit
        };
        let flip_to = match outcome {
            Outcome::Neutral => None,
            Outcome::Success => {
                (http, tcp, timeouts) = (0, 0, 0);
                trip(&mut ok, check.healthy_successes).then_some(true)
            }
            bad => {
                ok = 0;
                let (n, limit) = match bad {
                    Outcome::Http => (&mut http, check.http_failures),
                    Outcome::Tcp => (&mut tcp, check.tcp_failures),
                    _ => (&mut timeouts, check.timeouts),
                };
                trip(n, limit).then_some(false)
            }
        };
        if let Some(to) = flip_to {
            if to != health.is_healthy(i) {
                tracing::info!(node = %up.nodes[i].addr, healthy = to, "active health check");
                health.set_healthy(i, to);
            }
            (ok, http, tcp, timeouts) = (0, 0, 0, 0);
        }
    }
}

async fn probe(up: &UpstreamRt, check: &ActiveCheck, i: usize) -> Outcome {
    let Some(node) = up.nodes.get(i) else {
        return Outcome::Neutral;
    };
    let addr = SocketAddr::new(node.addr.ip(), check.port.unwrap_or(node.addr.port()));
    let work = async {
        let Ok(tcp) = TcpStream::connect(addr).await else {
            return Outcome::Tcp;
        };
        match check.kind {
            ProbeKind::Tcp => Outcome::Success,
            ProbeKind::Http => http_probe(tcp, up, check, i).await,
            ProbeKind::Https => {
                // Compiled with the upstream (client certificate included) whenever probes are https.
                let Some(cfg) = up.probe_tls.clone() else {
                    return Outcome::Tcp;
                };
                let name = node.sni.clone().unwrap_or_else(|| {
                    rustls::pki_types::ServerName::IpAddress(node.addr.ip().into())
                });
                match tokio_rustls::TlsConnector::from(cfg)
                    .connect(name, tcp)
                    .await
                {
                    Ok(tls) => http_probe(tls, up, check, i).await,
                    Err(_) => Outcome::Tcp,
                }
            }
        }
    };
    tokio::time::timeout(check.timeout, work)
        .await
        .unwrap_or(Outcome::Timeout)
}

/// `GET http_path HTTP/1.0` and classify the status (lua-resty-healthcheck sends HTTP/1.0 and reads only the status
/// line).
async fn http_probe<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    up: &UpstreamRt,
    check: &ActiveCheck,
    i: usize,
) -> Outcome {
    let host: &[u8] = match &check.host {
        Some(h) => h.as_bytes(),
        None => up.nodes.get(i).map_or(&b""[..], |n| &n.host_header),
    };
    let mut req = Vec::with_capacity(128);
    req.extend_from_slice(b"GET ");
    req.extend_from_slice(check.http_path.as_bytes());
    req.extend_from_slice(b" HTTP/1.0\r\nHost: ");
    req.extend_from_slice(host);
    req.extend_from_slice(b"\r\nUser-Agent: sluice-health-check\r\n");
    for h in &check.req_headers {
        req.extend_from_slice(h.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"Connection: close\r\n\r\n");
    if s.write_all(&req).await.is_err() {
        return Outcome::Tcp;
    }
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => return Outcome::Tcp,
            Ok(k) => n += k,
        }
    }
    let status = (buf.starts_with(b"HTTP/1."))
        .then(|| std::str::from_utf8(&buf[9..12]).ok()?.parse::<u16>().ok())
        .flatten();
    match status {
        Some(c) if check.healthy_statuses.contains(&c) => Outcome::Success,
        Some(c) if check.unhealthy_statuses.contains(&c) => Outcome::Http,
        Some(_) => Outcome::Neutral,
        // Not HTTP: an http failure, like an invalid response on real traffic.
        None => Outcome::Http,
    }
}

#[cfg(test)]
mod tests;
