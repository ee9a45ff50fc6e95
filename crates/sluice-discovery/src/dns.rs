//! APISIX's DNS discovery (`discovery.dns` in config.yaml, `discovery_type: dns`): `service_name` is `host` or
//! `host:port`; its records are tried in `order` (default `SRV`, `A`, `AAAA`; `last` first tries the type that
//! answered last time; CNAMEs are followed by the resolver). An SRV record gives each target's port (0: the
//! service's port) and weight (0 counts as 1, split evenly over the target's addresses), its priority becomes the
//! node's negated priority (lower SRV priority is tried first); A/AAAA give every address with weight 1.
//!
//! A name is resolved the first time the compiler asks for it and again when its records' TTL runs out (at least
//! every second, at most every hour); a failed lookup keeps the last nodes and is retried in a second, doubling
//! to 30 s. Every change bumps the generation the binary follows to recompile.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use serde_json::Value;
use sluice_model::Node;
use tokio::sync::{mpsc, watch};

/// `discovery.dns` in config.yaml.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsConfig {
    pub servers: Vec<SocketAddr>,
    pub order: Vec<Kind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Last,
    Srv,
    A,
    Aaaa,
    /// Followed by every A/AAAA lookup already; kept so APISIX's `order` lists parse.
    Cname,
}

impl DnsConfig {
    pub fn from_value(v: &Value) -> Result<DnsConfig, String> {
        let servers = v
            .get("servers")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
            .ok_or("discovery.dns.servers: required, a list of \"ip:port\"")?
            .iter()
            .map(|s| {
                let s = s.as_str().unwrap_or("");
                s.parse::<SocketAddr>()
                    .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                    .map_err(|_| format!("discovery.dns.servers: {s:?} is not an ip:port"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let order = match v.get("order") {
            None => vec![Kind::Last, Kind::Srv, Kind::A, Kind::Aaaa, Kind::Cname],
            Some(Value::Array(l)) => l
                .iter()
                .map(|k| match k.as_str().unwrap_or("") {
                    "last" => Ok(Kind::Last),
                    "SRV" => Ok(Kind::Srv),
                    "A" => Ok(Kind::A),
                    "AAAA" => Ok(Kind::Aaaa),
                    "CNAME" => Ok(Kind::Cname),
                    other => Err(format!(
                        "discovery.dns.order: {other:?} is not one of last, SRV, A, AAAA, CNAME"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err("discovery.dns.order: a list".into()),
        };
        Ok(DnsConfig { servers, order })
    }
}

/// `host` or `host:port` (a bracketed IPv6 literal keeps its brackets off).
fn split_service(name: &str) -> Option<(String, Option<u16>)> {
    if name.is_empty() || name.len() > 253 || name.chars().any(|c| c.is_control() || c == '/') {
        return None;
    }
    match name.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h.to_owned(), Some(p.parse().ok()?))),
        _ => Some((name.to_owned(), None)),
    }
}

type Known = Arc<Mutex<HashMap<String, Option<Vec<Node>>>>>;

pub(crate) struct Handle {
    known: Known,
    want: mpsc::UnboundedSender<String>,
}

impl Handle {
    pub(crate) fn spawn(cfg: DnsConfig, changed: watch::Sender<u64>) -> Result<Handle, String> {
        let mut rc = ResolverConfig::from_parts(None, Vec::new(), Vec::new());
        for s in &cfg.servers {
            let mut udp = ConnectionConfig::udp();
            udp.port = s.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = s.port();
            rc.add_name_server(NameServerConfig::new(s.ip(), true, vec![udp, tcp]));
        }
        let mut opts = ResolverOpts::default();
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 2;
        // Re-resolution follows TTLs itself: the resolver's cache would only answer stale records in between.
        opts.cache_size = 0;
        let resolver = TokioResolver::builder_with_config(rc, TokioRuntimeProvider::default())
            .with_options(opts)
            .build()
            .map_err(|e| format!("discovery.dns: {e}"))?;
        let known = Known::default();
        let (want, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(resolver, cfg.order, known.clone(), rx, changed));
        Ok(Handle { known, want })
    }

    /// Last known nodes of `service_name` (empty until its first answer; the lookup starts now).
    pub(crate) fn nodes(&self, service_name: &str) -> Vec<Node> {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        match known.get(service_name) {
            Some(Some(n)) => n.clone(),
            Some(None) => Vec::new(),
            None => {
                if split_service(service_name).is_some() {
                    known.insert(service_name.to_owned(), None);
                    let _ = self.want.send(service_name.to_owned());
                } else {
                    tracing::warn!(
                        service_name,
                        "dns discovery: not a host or host:port; no nodes"
                    );
                }
                Vec::new()
            }
        }
    }
}

async fn run(
    resolver: TokioResolver,
    order: Vec<Kind>,
    known: Known,
    mut want: mpsc::UnboundedReceiver<String>,
    changed: watch::Sender<u64>,
) {
    let resolver = Arc::new(resolver);
    let order = Arc::new(order);
    while let Some(name) = want.recv().await {
        // One task per name: each follows its own TTL.
        tokio::spawn(follow(
            resolver.clone(),
            order.clone(),
            known.clone(),
            name,
            changed.clone(),
        ));
    }
}

async fn follow(
    resolver: Arc<TokioResolver>,
    order: Arc<Vec<Kind>>,
    known: Known,
    name: String,
    changed: watch::Sender<u64>,
) {
    let Some((host, port)) = split_service(&name) else {
        return;
    };
    let mut last: Option<Kind> = None;
    let mut backoff = Duration::from_secs(1);
    loop {
        match resolve(&resolver, &order, &mut last, &host, port).await {
            Some((mut nodes, ttl)) => {
                backoff = Duration::from_secs(1);
                nodes.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
                let moved = {
                    let mut k = known.lock().unwrap_or_else(|p| p.into_inner());
                    let old = k.insert(name.clone(), Some(nodes.clone()));
                    old != Some(Some(nodes))
                };
                if moved {
                    changed.send_modify(|g| *g += 1);
                }
                tokio::time::sleep(ttl.clamp(Duration::from_secs(1), Duration::from_secs(3600)))
                    .await;
            }
            None => {
                tracing::warn!(service_name = %name, "dns discovery: no records; keeping the last nodes");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
        if changed.is_closed() {
            return;
        }
    }
}

/// The nodes of the first record type in `order` that answers, and how long they are valid.
async fn resolve(
    r: &TokioResolver,
    order: &[Kind],
    last: &mut Option<Kind>,
    host: &str,
    port: Option<u16>,
) -> Option<(Vec<Node>, Duration)> {
    let mut tried = Vec::new();
    for k in order.iter().copied() {
        let k = match k {
            Kind::Last => match *last {
                Some(l) => l,
                None => continue,
            },
            k => k,
        };
        if tried.contains(&k) {
            continue;
        }
        tried.push(k);
        let got = match k {
            Kind::Srv => srv(r, host, port).await,
            Kind::A => addresses(r, host, RecordType::A, port).await,
            Kind::Aaaa => addresses(r, host, RecordType::AAAA, port).await,
            Kind::Cname => continue,
            Kind::Last => continue,
        };
        if let Some(found) = got.filter(|(n, _)| !n.is_empty()) {
            *last = Some(k);
            return Some(found);
        }
    }
    None
}

fn node(ip: IpAddr, port: Option<u16>, weight: u32, priority: i32) -> Node {
    Node {
        host: ip.to_string(),
        port,
        weight,
        priority,
        metadata: None,
    }
}

fn ttl_of(valid_until: std::time::Instant) -> Duration {
    valid_until.saturating_duration_since(std::time::Instant::now())
}

async fn addresses(
    r: &TokioResolver,
    host: &str,
    t: RecordType,
    port: Option<u16>,
) -> Option<(Vec<Node>, Duration)> {
    let l = r.lookup(host, t).await.ok()?;
    let nodes = l
        .answers()
        .iter()
        .filter_map(|rec| match &rec.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .map(|ip| node(ip, port, 1, 0))
        .collect();
    Some((nodes, ttl_of(l.valid_until())))
}

async fn srv(r: &TokioResolver, host: &str, port: Option<u16>) -> Option<(Vec<Node>, Duration)> {
    let l = r.lookup(host, RecordType::SRV).await.ok()?;
    let mut ttl = ttl_of(l.valid_until());
    let mut nodes = Vec::new();
    for rec in l.answers() {
        let RData::SRV(s) = &rec.data else { continue };
        let target = s.target.to_string();
        let Some((ips, t)) = addresses(r, &target, RecordType::A, None)
            .await
            .filter(|(n, _)| !n.is_empty())
            .or(addresses(r, &target, RecordType::AAAA, None).await)
        else {
            continue;
        };
        ttl = ttl.min(t);
        let weight = u32::from(s.weight.max(1));
        let each = (weight / ips.len().max(1) as u32).max(1);
        let p = if s.port == 0 { port } else { Some(s.port) };
        for n in ips {
            nodes.push(Node {
                port: p,
                weight: each,
                priority: -i32::from(s.priority),
                ..n
            });
        }
    }
    Some((nodes, ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_and_config() {
        assert_eq!(split_service("a.b"), Some(("a.b".into(), None)));
        assert_eq!(split_service("a.b:1980"), Some(("a.b".into(), Some(1980))));
        assert_eq!(split_service("a.b:x"), None);
        assert_eq!(split_service("a.b:99999"), None);
        assert_eq!(split_service(""), None);
        assert_eq!(split_service("a/b"), None);
        assert_eq!(split_service("a\nb"), None);
        let c =
            DnsConfig::from_value(&serde_json::json!({"servers": ["127.0.0.1:8600", "10.0.0.1"]}))
                .unwrap();
        assert_eq!(c.servers[1].port(), 53);
        assert_eq!(c.order[1], Kind::Srv);
        assert!(DnsConfig::from_value(&serde_json::json!({"servers": []})).is_err());
        assert!(DnsConfig::from_value(&serde_json::json!({"servers": ["x"]})).is_err());
        assert!(DnsConfig::from_value(
            &serde_json::json!({"servers": ["127.0.0.1"], "order": ["MX"]})
        )
        .is_err());
    }
}
