//! The L4 proxy: APISIX's `stream_routes` on `apisix.stream_proxy` listeners (TCP, TCP with TLS termination, UDP).
//!
//! Configuration: [`stream_listen`] reads `stream_proxy.tcp`/`udp` as APISIX's CLI does; the listeners are bound
//! like the HTTP ones (one SO_REUSEPORT socket per worker and address, `server::Listeners`). Routes compile once
//! per snapshot into a [`StreamRouter`] (`Snapshot::stream`): IP/CIDR matchers, the SNI index, upstream runtimes
//! shared with HTTP (balancers, passive and active health) and the stream plugin chains. Per connection, matching
//! is a few comparisons over the compiled routes, APISIX's `ip_port` router order:
//!
//! 1. a connection with an SNI (a `tls: true` listener's handshake, or, on a plain listener that has routes with
//!    `sni`, the ClientHello read ahead without terminating TLS: `sni::read_client_hello`) tries the routes of
//!    that exact SNI, then of wildcard SNIs (`*.example.com` covers any name ending `.example.com`, longest
//!    first), each list in configuration order, each route's `remote_addr`/`server_addr`/`server_port` checked;
//! 2. then the routes without `sni`, in configuration order.
//!
//! No match closes the connection (APISIX's `ngx.exit(1)`). Sub-modules: `sni` (ClientHello parsing), `tcp` (one
//! TCP connection), `udp` (datagram sessions).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;
use ipnet::IpNet;
use serde_json::Value;
use sluice_model::{Id, NodeConfig, Resources, Service, StreamRoute, Upstream};
use sluice_plugins::stream::StreamChain;

use crate::snapshot::UpstreamRt;

mod copy;
pub mod log;
pub(crate) mod sni;
pub(crate) mod tcp;
pub(crate) mod udp;

/// nginx stream's `proxy_connect_timeout` default.
const DEFAULT_CONNECT: Duration = Duration::from_secs(60);
/// nginx stream's `proxy_timeout` default: the longest time without a byte either way.
const DEFAULT_IDLE: Duration = Duration::from_secs(600);

/// `apisix.stream_proxy`, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamListen {
    /// TCP addresses; `true`: TLS is terminated there with the `ssls` certificates (`{addr, tls: true}`).
    pub tcp: Vec<(SocketAddr, bool)>,
    pub udp: Vec<SocketAddr>,
}

impl StreamListen {
    pub fn is_empty(&self) -> bool {
        self.tcp.is_empty() && self.udp.is_empty()
    }
}

/// The stream listeners of `node` (empty when `proxy_mode` has no `stream`). Entries are a port (`9100`, all
/// interfaces), `"ip:port"` / `"[v6]:port"` / `"port"` strings, or (TCP) `{addr, tls}`; APISIX's port ranges and
/// PROXY protocol options are refused with a message.
pub fn stream_listen(node: &NodeConfig) -> Result<StreamListen, String> {
    let (_, stream) = node.apisix.proxy_modes();
    let Some(sp) = node.apisix.stream_proxy.as_ref().filter(|_| stream) else {
        return Ok(StreamListen::default());
    };
    let list = |k: &str| -> Result<Vec<Value>, String> {
        match sp.get(k) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) if !a.is_empty() => Ok(a.clone()),
            Some(_) => Err(format!(
                "apisix.stream_proxy.{k}: expected a non-empty list of addresses"
            )),
        }
    };
    let mut out = StreamListen::default();
    for item in list("tcp")? {
        let (addr, tls) = match &item {
            Value::Object(o) => {
                for k in o.keys() {
                    if !matches!(k.as_str(), "addr" | "tls") {
                        return Err(format!(
                            "apisix.stream_proxy.tcp: {k} is not supported by Sluice"
                        ));
                    }
                }
                let addr = o
                    .get("addr")
                    .ok_or("apisix.stream_proxy.tcp: an entry without addr")?;
                let tls = match o.get("tls") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => {
                        return Err(format!(
                            "apisix.stream_proxy.tcp: tls must be a boolean, got {v}"
                        ))
                    }
                };
                (parse_addr(addr, "tcp")?, tls)
            }
            other => (parse_addr(other, "tcp")?, false),
        };
        if out.tcp.iter().any(|(a, _)| *a == addr) {
            return Err(format!("apisix.stream_proxy.tcp: {addr} is listed twice"));
        }
        out.tcp.push((addr, tls));
    }
    for item in list("udp")? {
        let addr = parse_addr(&item, "udp")?;
        if out.udp.contains(&addr) {
            return Err(format!("apisix.stream_proxy.udp: {addr} is listed twice"));
        }
        out.udp.push(addr);
    }
    Ok(out)
}

fn parse_addr(v: &Value, what: &str) -> Result<SocketAddr, String> {
    let bad = |why: &str| format!("invalid stream_proxy.{what} entry: {v}: {why}");
    let port = |p: u64| {
        u16::try_from(p)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("port out of range (1-65535)"))
    };
    match v {
        Value::Number(n) => {
            let p = n.as_u64().ok_or_else(|| bad("port must be an integer"))?;
            Ok(SocketAddr::from(([0, 0, 0, 0], port(p)?)))
        }
        Value::String(s) => {
            if s.contains('-') {
                return Err(bad("port ranges are not supported by Sluice"));
            }
            if let Ok(p) = s.parse::<u64>() {
                return Ok(SocketAddr::from(([0, 0, 0, 0], port(p)?)));
            }
            s.parse::<SocketAddr>()
                .map_err(|_| bad("expected a port, \"ip:port\" or \"[ipv6]:port\""))
                .and_then(|a| {
                    port(u64::from(a.port()))?;
                    Ok(a)
                })
        }
        _ => Err(bad("expected a port or an address string")),
    }
}

/// One stream route's live counters, shared by every worker and kept across configuration changes while the
/// route exists (a compile takes the previous router's counters of the same id). Updated with relaxed atomics:
/// per connection `total` and `active` (up at the route match, down at the end), per read the byte counts.
#[derive(Debug, Default)]
pub struct StreamCounters {
    pub active: AtomicI64,
    pub total: AtomicU64,
    /// Bytes read from clients.
    pub bytes_in: AtomicU64,
    /// Bytes read from upstreams (sent to clients).
    pub bytes_out: AtomicU64,
}

/// One stream route's counters, read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRouteStats {
    pub route: String,
    pub active: u64,
    pub total: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl StreamRouteStats {
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "route": self.route,
            "active": self.active,
            "total": self.total,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        })
    }
}

/// Prometheus text for `stats`: APISIX's `apisix_stream_connection_total{route}` and, per route,
/// `apisix_stream_active_connections`, `apisix_stream_bandwidth{type="ingress"|"egress"}` (Sluice keys the last
/// two by route; APISIX by listening address).
pub fn render_prometheus(stats: &[StreamRouteStats], out: &mut String) {
    use std::fmt::Write;
    if stats.is_empty() {
        return;
    }
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let _ = writeln!(out, "# HELP apisix_stream_connection_total Total number of connections handled per stream route in APISIX");
    let _ = writeln!(out, "# TYPE apisix_stream_connection_total counter");
    for s in stats {
        let _ = writeln!(
            out,
            "apisix_stream_connection_total{{route=\"{}\"}} {}",
            esc(&s.route),
            s.total
        );
    }
    let _ = writeln!(out, "# HELP apisix_stream_active_connections Number of stream connections currently proxied per stream route");
    let _ = writeln!(out, "# TYPE apisix_stream_active_connections gauge");
    for s in stats {
        let _ = writeln!(
            out,
            "apisix_stream_active_connections{{route=\"{}\"}} {}",
            esc(&s.route),
            s.active
        );
    }
    let _ = writeln!(
        out,
        "# HELP apisix_stream_bandwidth Total bandwidth in bytes proxied per stream route"
    );
    let _ = writeln!(out, "# TYPE apisix_stream_bandwidth counter");
    for s in stats {
        for (t, v) in [("ingress", s.bytes_in), ("egress", s.bytes_out)] {
            let _ = writeln!(
                out,
                "apisix_stream_bandwidth{{route=\"{}\",type=\"{t}\"}} {v}",
                esc(&s.route)
            );
        }
    }
}

/// Builds (or keeps) an upstream runtime under a key (the snapshot compiler's `runtime`).
type RuntimeFn<'a> = dyn FnMut(String, &Arc<Upstream>) -> Result<Arc<UpstreamRt>, String> + 'a;

/// One compiled stream route.
pub(crate) struct StreamRt {
    pub id: Arc<str>,
    remote: Option<IpNet>,
    server: Option<IpNet>,
    port: Option<u16>,
    /// `None`: its upstream or service is gone (deleted with `?force=true`): connections are closed.
    pub upstream: Option<Arc<UpstreamRt>>,
    pub plugins: Option<StreamChain>,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub counters: Arc<StreamCounters>,
}

impl StreamRt {
    fn matches(&self, remote: IpAddr, local: SocketAddr) -> bool {
        self.remote.is_none_or(|n| n.contains(&remote))
            && self
                .server
                .is_none_or(|n| n.contains(&canonical(local.ip())))
            && self.port.is_none_or(|p| p == local.port())
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is (dual-stack sockets).
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Every stream route, compiled, with the SNI index.
#[derive(Default)]
pub(crate) struct StreamRouter {
    routes: Vec<StreamRt>,
    /// Routes by exact (lowercase) SNI, in configuration order.
    sni_exact: AHashMap<Box<str>, Vec<u32>>,
    /// `*.suffix` / `*` routes: (the suffix after `*`, routes), longest suffix first.
    sni_wild: Vec<(Box<str>, Vec<u32>)>,
    /// Routes without `sni`, in configuration order.
    other: Vec<u32>,
}

impl StreamRouter {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Every route's counters, in configuration order.
    pub fn stats(&self) -> Vec<StreamRouteStats> {
        self.routes
            .iter()
            .map(|r| StreamRouteStats {
                route: r.id.to_string(),
                active: r.counters.active.load(Ordering::Relaxed).max(0) as u64,
                total: r.counters.total.load(Ordering::Relaxed),
                bytes_in: r.counters.bytes_in.load(Ordering::Relaxed),
                bytes_out: r.counters.bytes_out.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Whether some route has an `sni` that a connection to `local` could match (then a plain listener reads the
    /// ClientHello ahead).
    pub fn wants_sni(&self, local: SocketAddr) -> bool {
        let may = |i: &u32| {
            let r = &self.routes[*i as usize];
            r.port.is_none_or(|p| p == local.port())
                && r.server.is_none_or(|n| n.contains(&canonical(local.ip())))
        };
        self.sni_exact.values().flatten().any(may)
            || self.sni_wild.iter().flat_map(|w| &w.1).any(may)
    }

    /// APISIX's `ip_port` match: SNI routes first (exact, then wildcards), then routes without `sni`.
    pub fn find(&self, sni: Option<&str>, remote: IpAddr, local: SocketAddr) -> Option<&StreamRt> {
        let remote = canonical(remote);
        let pick = |list: &[u32]| {
            list.iter()
                .map(|i| &self.routes[*i as usize])
                .find(|r| r.matches(remote, local))
        };
        if let Some(name) = sni.filter(|_| !self.sni_exact.is_empty() || !self.sni_wild.is_empty())
        {
            let lower;
            let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                lower = name.to_ascii_lowercase();
                lower.as_str()
            } else {
                name
            };
            if let Some(r) = self.sni_exact.get(name).and_then(|l| pick(l)) {
                return Some(r);
            }
            for (suffix, list) in &self.sni_wild {
                if name.ends_with(&**suffix) {
                    if let Some(r) = pick(list) {
                        return Some(r);
                    }
                }
            }
        }
        pick(&self.other)
    }

    /// Compiles `res.stream_routes`. `runtime` builds (or keeps) an upstream runtime under a key, `shared_ups` are
    /// the `upstreams` resources' runtimes.
    pub(crate) fn compile(
        res: &Resources,
        shared_ups: &AHashMap<&str, Arc<UpstreamRt>>,
        runtime: &mut RuntimeFn<'_>,
        shared: &sluice_plugins::Shared,
        prev: Option<&StreamRouter>,
    ) -> Result<StreamRouter, String> {
        let prev_counters: AHashMap<&str, &Arc<StreamCounters>> = prev
            .map(|p| p.routes.iter().map(|r| (&*r.id, &r.counters)).collect())
            .unwrap_or_default();
        let services: AHashMap<&Id, &Service> = res.services.iter().map(|s| (&s.id, s)).collect();
        let mut out = StreamRouter::default();
        for r in &res.stream_routes {
            let ctx = |e: String| format!("stream route {}: {e}", r.id);
            let mut rt = compile_route(r, &services, shared_ups, runtime, shared).map_err(ctx)?;
            if let Some(c) = prev_counters.get(r.id.0.as_str()) {
                rt.counters = Arc::clone(c);
            }
            let idx = out.routes.len() as u32;
            match r.sni.as_deref().map(str::to_ascii_lowercase) {
                None => out.other.push(idx),
                Some(s) => match s.strip_prefix('*') {
                    Some(suffix) => match out.sni_wild.iter_mut().find(|w| &*w.0 == suffix) {
                        Some(w) => w.1.push(idx),
                        None => out.sni_wild.push((suffix.into(), vec![idx])),
                    },
                    None => out.sni_exact.entry(s.into()).or_default().push(idx),
                },
            }
            out.routes.push(rt);
        }
        out.sni_wild.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        Ok(out)
    }
}

fn net(s: &str, what: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map(|n| match n {
            // An IPv4-mapped network is matched as IPv4, like the addresses (see `canonical`).
            IpNet::V6(v6) if v6.addr().to_ipv4_mapped().is_some() && v6.prefix_len() >= 96 => {
                IpNet::new(
                    IpAddr::V4(
                        v6.addr()
                            .to_ipv4_mapped()
                            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                    ),
                    v6.prefix_len() - 96,
                )
                .unwrap_or(IpNet::V6(v6))
            }
            n => n,
        })
        .map_err(|_| format!("invalid {what}: {s}"))
}

fn compile_route(
    r: &StreamRoute,
    services: &AHashMap<&Id, &Service>,
    shared_ups: &AHashMap<&str, Arc<UpstreamRt>>,
    runtime: &mut RuntimeFn<'_>,
    shared: &sluice_plugins::Shared,
) -> Result<StreamRt, String> {
    if let Some(p) = &r.protocol {
        let name = p.get("name").and_then(Value::as_str).unwrap_or("?");
        return Err(format!("xRPC protocol {name:?} is not supported by Sluice"));
    }
    let remote = r
        .remote_addr
        .as_deref()
        .map(|s| net(s, "remote_addr"))
        .transpose()?;
    let server = r
        .server_addr
        .as_deref()
        .map(|s| net(s, "server_addr"))
        .transpose()?;
    // APISIX's order (`stream_preread_phase`): `upstream_id`, else the service (its upstream unless the route
    // has its own, plugins merged service first), else the route's inline upstream.
    let service = r.service_id.as_ref().map(|id| services.get(id).copied());
    let mut plugins = serde_json::Map::new();
    if let Some(Some(s)) = service {
        plugins.extend(s.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    plugins.extend(r.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
    let upstream = if let Some(id) = &r.upstream_id {
        shared_ups.get(id.0.as_str()).cloned()
    } else if let Some(service) = service {
        match service {
            None => None,
            Some(s) => match (&r.upstream, &s.upstream, &s.upstream_id) {
                (Some(u), _, _) => Some(runtime(format!("s:{}", r.id), u)?),
                (None, Some(u), _) => Some(runtime(format!("s:{}", r.id), u)?),
                (None, None, Some(id)) => shared_ups.get(id.0.as_str()).cloned(),
                (None, None, None) => {
                    return Err("missing upstream configuration in Stream Route or Service".into())
                }
            },
        }
    } else if let Some(u) = &r.upstream {
        Some(runtime(format!("s:{}", r.id), u)?)
    } else {
        return Err("missing upstream configuration in Stream Route or Service".into());
    };
    let t = upstream.as_ref().and_then(|u| u.timeouts);
    Ok(StreamRt {
        id: Arc::from(r.id.0.as_str()),
        remote,
        server,
        port: r.server_port,
        upstream,
        plugins: StreamChain::compile(&plugins, shared)?,
        connect_timeout: t.map_or(DEFAULT_CONNECT, |t| t.connect),
        // nginx stream has one `proxy_timeout` between two reads or writes either way; APISIX's upstream `timeout`
        // sets `send` and `read`: the longer of the two.
        idle_timeout: t.map_or(DEFAULT_IDLE, |t| t.send.max(t.read)),
        counters: Arc::default(),
    })
}

#[cfg(test)]
mod tests;
