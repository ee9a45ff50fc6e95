//! Read-only questions about the serving snapshot, for the Admin API's request tester and effective-chain view:
//! which route a request would match (the snapshot's own router over a head parsed by the proxy's own parser, the
//! same `ReqView` normalisation), the plugins that route runs in order and where each comes from, and the node the
//! balancer would pick next without taking it. Nothing here runs a plugin or touches a connection.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::BytesMut;
use sluice_model::Resources;
use sluice_plugins::{Chain, CompileEnv, PluginOrder, ReqView, Shared};
use sluice_router::Params;

use crate::snapshot::Snapshot;

/// A request to match.
#[derive(Debug, Clone)]
pub struct MatchInput<'a> {
    pub method: &'a str,
    pub host: Option<&'a str>,
    /// Path and optional query string.
    pub uri: &'a str,
    pub headers: &'a [(String, String)],
    pub remote: IpAddr,
    /// A consumer to add (its and its group's plugins), as if an auth plugin had identified it.
    pub consumer: Option<&'a str>,
}

/// What the data plane would do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchOutcome {
    pub route_id: String,
    pub plugins: Vec<ChainEntry>,
    /// `host:port` of the node the balancer would pick next (`None`: no node is available).
    pub node: Option<String>,
}

/// One plugin of an effective chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainEntry {
    pub name: &'static str,
    pub priority: i32,
    /// `global_rule`, `service`, `plugin_config`, `route`, `consumer` or `consumer_group`.
    pub source: &'static str,
    pub source_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InspectError {
    /// The request cannot be a request (the parser's or normaliser's reason).
    BadRequest(String),
    UnknownConsumer,
    Internal(String),
}

/// The port a tester request is taken to arrive on (the `server_port` variable); the peer's port is arbitrary.
const LOCAL: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9080);

fn clean(what: &str, s: &str) -> Result<(), InspectError> {
    if s.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(InspectError::BadRequest(format!(
            "{what} must not contain CR, LF or NUL"
        )));
    }
    Ok(())
}

/// The request head the proxy would have parsed: built as bytes, parsed by `sluice_http::parse_request`.
fn head_of(q: &MatchInput<'_>) -> Result<sluice_http::RequestHead, InspectError> {
    clean("method", q.method)?;
    clean("uri", q.uri)?;
    let host = q.host.or_else(|| {
        q.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.as_str())
    });
    let mut raw = String::with_capacity(256);
    raw.push_str(q.method);
    raw.push(' ');
    raw.push_str(q.uri);
    // Without a host, HTTP/1.0 (HTTP/1.1 requires one): the request routes as one that names no host.
    raw.push_str(if host.is_some() {
        " HTTP/1.1\r\n"
    } else {
        " HTTP/1.0\r\n"
    });
    if let Some(h) = host {
        clean("host", h)?;
        raw.push_str("Host: ");
        raw.push_str(h);
        raw.push_str("\r\n");
    }
    for (k, v) in q.headers {
        if k.eq_ignore_ascii_case("host") {
            continue;
        }
        clean("header name", k)?;
        clean("header value", v)?;
        raw.push_str(k);
        raw.push_str(": ");
        raw.push_str(v);
        raw.push_str("\r\n");
    }
    raw.push_str("\r\n");
    let mut buf = BytesMut::from(raw.as_bytes());
    match sluice_http::parse_request(&mut buf, &sluice_http::Limits::default()) {
        Ok(Some(h)) => Ok(h),
        Ok(None) => Err(InspectError::BadRequest("incomplete request".into())),
        Err(e) => Err(InspectError::BadRequest(format!("bad request: {e}"))),
    }
}

impl Snapshot {
    /// The route `q` matches, its chain and the next node (`Ok(None)`: no route matches).
    pub fn match_request(
        &self,
        q: &MatchInput<'_>,
        like_servlet: bool,
    ) -> Result<Option<MatchOutcome>, InspectError> {
        let head = head_of(q)?;
        let peer = SocketAddr::new(q.remote, 40000);
        let client_ip = q.remote.to_string();
        let view = ReqView::new(&head, peer, LOCAL, "http")
            .and_then(|v| {
                if like_servlet {
                    v.like_servlet()
                } else {
                    Ok(v)
                }
            })
            .map_err(|e| InspectError::BadRequest(format!("bad request: {e}")))?
            .with_peer_text(&client_ip);
        let mut params = Params::new();
        let Some(served) = self
            .router
            .find(&view, &mut params)
            .and_then(|&slot| self.served(slot))
        else {
            return Ok(None);
        };
        let route = &served.route;
        let plugins = self.chain_of(route, q.consumer)?;
        let up = &route.upstream;
        let key = crate::conn::hash_key(up, &view, q.consumer);
        let node = up
            .balancer
            .peek(key.as_deref())
            .and_then(|i| up.nodes.get(i))
            .map(|n| n.stats_key.to_string());
        Ok(Some(MatchOutcome {
            route_id: route.id.to_string(),
            plugins,
            node,
        }))
    }

    /// The plugins route `id` runs, in order (`Ok(None)`: this snapshot does not serve it).
    pub fn effective(
        &self,
        id: &str,
        consumer: Option<&str>,
    ) -> Result<Option<Vec<ChainEntry>>, InspectError> {
        match self.served_by_id(id) {
            Some(s) => self.chain_of(&s.route, consumer).map(Some),
            None => Ok(None),
        }
    }

    /// Global rules' plugins, then the route's merged with the consumer's, as `Chain::run_request` walks them: a
    /// consumer's plugins join the chain whose auth plugin identified it (the global rules' when they hold one).
    fn chain_of(
        &self,
        route: &crate::snapshot::CompiledRoute,
        consumer: Option<&str>,
    ) -> Result<Vec<ChainEntry>, InspectError> {
        let env = self.env();
        let consumer_rt = match consumer {
            None => None,
            Some(name) => Some(self.consumer(name, env)?),
        };
        let consumer_chain = consumer_rt.as_ref().and_then(|c| c.chain.clone());
        let global = self.global.as_deref();
        let into_global = global.is_some_and(Chain::has_auth);
        let mut out = Vec::new();
        let mut push = |list: Vec<PluginOrder>, route_level: bool| {
            for p in list {
                let (source, source_id) = if p.consumer {
                    let c = consumer_rt.as_ref().map(|c| &c.consumer);
                    match c {
                        Some(c) if c.plugins.contains_key(p.name) => {
                            ("consumer", c.username.clone())
                        }
                        Some(c) => (
                            "consumer_group",
                            c.group_id.as_ref().map(|g| g.0.clone()).unwrap_or_default(),
                        ),
                        None => ("consumer", String::new()),
                    }
                } else if route_level {
                    self.plugin_source(&route.id, p.name)
                } else {
                    let id = env
                        .global_rules
                        .iter()
                        .rev()
                        .find(|g| g.plugins.contains_key(p.name))
                        .map(|g| g.id.0.clone())
                        .unwrap_or_default();
                    ("global_rule", id)
                };
                out.push(ChainEntry {
                    name: p.name,
                    priority: p.priority,
                    source,
                    source_id,
                });
            }
        };
        let (gc, rc) = if into_global {
            (consumer_chain.as_deref(), None)
        } else {
            (None, consumer_chain.as_deref())
        };
        if global.is_some() || gc.is_some() {
            push(Chain::run_order(global, gc), false);
        }
        push(Chain::run_order(route.plugins.as_deref(), rc), true);
        Ok(out)
    }

    /// Consumer `name` compiled as the data plane has it; compiled here (with throwaway plugin state) when no
    /// auth plugin made this snapshot compile its consumers.
    fn consumer(
        &self,
        name: &str,
        env: &Resources,
    ) -> Result<Arc<sluice_plugins::consumers::ConsumerRt>, InspectError> {
        let compiled = match &self.consumers {
            Some(c) => c.clone(),
            None => {
                let shared = Shared::default();
                CompileEnv::new(&shared, &env.consumers, None)
                    .with_groups_and_metadata(&env.consumer_groups, &env.plugin_metadata)
                    .with_credentials(&env.credentials)
                    .with_protos(&env.protos)
                    .consumers_rt()
                    .map_err(InspectError::Internal)?
            }
        };
        compiled
            .by_name
            .get(name)
            .cloned()
            .ok_or(InspectError::UnknownConsumer)
    }
}
