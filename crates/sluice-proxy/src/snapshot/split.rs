//! Upstreams that plugins pick per request instead of the route's (traffic-split's `weighted_upstreams`),
//! compiled like route upstreams: an `upstream_id` resolves to the shared runtime, an inline `upstream` gets its
//! own (`s:<route id>:<i>`, kept across reloads while unchanged, probed by active checks). Each becomes a
//! sibling [`CompiledRoute`] of its route (same id and chain, other upstream and timeouts), so the request path
//! after the pick is the route's own. Runs after the route loop, over reused and fresh routes alike, so an
//! upstream referenced by id is always the current one. Not here: choosing (the plugin) or proxying (conn.rs).

use std::sync::Arc;

use ahash::AHashMap;
use sluice_model::{Timeout, Upstream};
use sluice_plugins::PluginUpstream;

use super::{CompiledRoute, Timeouts, UpstreamRt};

/// Compiles (or keeps across reloads) an upstream runtime under a key: `compile_next`'s `runtime`.
type Runtime<'r> = dyn FnMut(String, &Arc<Upstream>) -> Result<Arc<UpstreamRt>, String> + 'r;

/// APISIX's traffic-split gives an inline upstream 15 s connect/send/read unless it sets `timeout`.
const INLINE_TIMEOUT: Timeout = Timeout {
    connect: 15.0,
    send: 15.0,
    read: 15.0,
};

/// Route `route`'s traffic-split targets (empty when its chain declares none). `route_timeout` is the route's own
/// `timeout`, which wins over the picked upstream's, as APISIX's balancer options do.
pub(super) fn compile(
    route: &CompiledRoute,
    route_timeout: Option<Timeout>,
    shared_ups: &AHashMap<&str, Arc<UpstreamRt>>,
    runtime: &mut Runtime<'_>,
) -> Result<Box<[CompiledRoute]>, String> {
    let Some(chain) = route.plugins.as_deref() else {
        return Ok(Box::new([]));
    };
    let ups = chain.upstreams();
    if ups.is_empty() {
        return Ok(Box::new([]));
    }
    let ctx = |e: String| format!("route {}: {e}", route.id);
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
    Ok(targets.into_boxed_slice())
}
