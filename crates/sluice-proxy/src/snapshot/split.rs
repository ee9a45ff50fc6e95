//! Upstreams that plugins pick per request instead of the route's (traffic-split's `weighted_upstreams`),
//! compiled like route upstreams: an `upstream_id` resolves to the shared runtime, an inline `upstream` gets its
//! own (`s:<route id>:<i>`, kept across reloads while unchanged, probed by active checks). Each becomes a
//! sibling [`CompiledRoute`] of its route (same id and chain, other upstream and timeouts), so the request path
//! after the pick is the route's own. Runs after the route loop, over reused and fresh routes alike, so an
//! upstream referenced by id is always the current one. Not here: choosing (the plugin) or proxying (conn.rs).

use std::sync::Arc;

use ahash::AHashMap;
use sluice_model::{Resources, Timeout, Upstream};
use sluice_plugins::PluginUpstream;

use super::{CompiledRoute, Timeouts, UpstreamRt};

/// Plugin upstream targets by route index (only routes whose chain declares any).
#[derive(Default)]
pub(crate) struct Splits(AHashMap<u32, Box<[CompiledRoute]>>);

impl Splits {
    /// Route `route`'s `i`-th plugin upstream.
    pub(crate) fn get(&self, route: u32, i: usize) -> Option<&CompiledRoute> {
        self.0.get(&route)?.get(i)
    }
}

/// Compiles (or keeps across reloads) an upstream runtime under a key: `compile_next`'s `runtime`.
type Runtime<'r> = dyn FnMut(String, &Arc<Upstream>) -> Result<Arc<UpstreamRt>, String> + 'r;

/// APISIX's traffic-split gives an inline upstream 15 s connect/send/read unless it sets `timeout`.
const INLINE_TIMEOUT: Timeout = Timeout {
    connect: 15.0,
    send: 15.0,
    read: 15.0,
};

pub(super) fn compile(
    routes: &[CompiledRoute],
    res: &Resources,
    shared_ups: &AHashMap<&str, Arc<UpstreamRt>>,
    runtime: &mut Runtime<'_>,
) -> Result<Splits, String> {
    let mut out = AHashMap::new();
    let mut by_id: Option<AHashMap<&str, Option<Timeout>>> = None;
    for (idx, route) in routes.iter().enumerate() {
        let Some(chain) = route.plugins.as_deref() else {
            continue;
        };
        let ups = chain.upstreams();
        if ups.is_empty() {
            continue;
        }
        let ctx = |e: String| format!("route {}: {e}", route.id);
        // The route's own `timeout` wins over the picked upstream's, as APISIX's balancer options do.
        let route_timeout = by_id
            .get_or_insert_with(|| {
                res.routes
                    .iter()
                    .map(|r| (r.id.0.as_str(), r.timeout))
                    .collect()
            })
            .get(&*route.id)
            .copied()
            .flatten();
        let mut targets = Vec::with_capacity(ups.len());
        for (i, u) in ups.iter().enumerate() {
            let (upstream, fallback) = match u {
                // A deleted (`?force=true`) upstream: that pick answers 502, as APISIX's `handle_upstream`.
                PluginUpstream::Id(id) => (
                    match shared_ups.get(id.as_str()) {
                        Some(u) => u.clone(),
                        None => Arc::new(UpstreamRt::missing(id)),
                    },
                    Timeout::default(),
                ),
                PluginUpstream::Inline(u) => (
                    runtime(format!("s:{}:{i}", route.id), u)
                        .map_err(|e| ctx(format!("traffic-split upstream: {e}")))?,
                    INLINE_TIMEOUT,
                ),
            };
            let timeouts = route_timeout
                .map(Timeouts::from)
                .or(upstream.timeouts)
                .unwrap_or_else(|| fallback.into());
            targets.push(CompiledRoute {
                id: route.id.clone(),
                service: route.service.clone(),
                upstream,
                timeouts,
                plugins: route.plugins.clone(),
                websocket: route.websocket,
                inline: false,
                dangling: None,
            });
        }
        out.insert(idx as u32, targets.into_boxed_slice());
    }
    Ok(Splits(out))
}
