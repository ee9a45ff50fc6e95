//! What one compile leaves for the next (issue 4: one route changed out of 100,000 must not recompile the other
//! 99,999): every compiled route with the exact inputs it was compiled from, services and plugin configs shared
//! by `Arc` so that "same input" is a pointer comparison, and the rest of the configuration plugin chains may read
//! (consumers, credentials, metadata, ...). A route is reused only when its route, service, plugin config,
//! referenced upstream runtime, that environment and the plugin state (`Shared`) are all unchanged; anything else
//! compiles afresh. Issue 16 (route scale) made the walk over the unchanged routes cost pointers, not
//! allocations: routes are `Arc`s shared with the configuration they came from (an unchanged route is recognised
//! by pointer before any comparison), the cache is a list in route order (route `i` of the next compile is looked
//! for at the position it had, by hash only when the order shifted) and each entry keeps its router spec and
//! `RouteMeta` behind `Arc`s, so reusing a route clones a few pointers.

use std::sync::Arc;

use ahash::AHashMap;
use sluice_model::{Id, PluginConfig, Resources, Route, Service};
use sluice_plugins::{Chain, RouteMeta, Shared};
use sluice_router::RouteSpec;

use super::{CompiledRoute, Timeouts, UpstreamRt};

/// The inputs and outputs of one compile, kept in its snapshot.
#[derive(Default)]
pub(super) struct Reuse {
    /// Address of the `Shared` the chains were compiled with: chains are reused only under the same plugin state.
    shared: usize,
    /// Everything chains and upstream runtimes may depend on besides routes, services, upstreams and plugin
    /// configs (`ssls` included: upstream client certificates name them). Those four fields stay empty.
    env: Arc<Resources>,
    services: AHashMap<String, Arc<Service>>,
    plugin_configs: AHashMap<String, Arc<PluginConfig>>,
    /// In the order the routes were compiled (the configuration's order).
    routes: Vec<Arc<CachedRoute>>,
}

pub(super) struct CachedRoute {
    route: Arc<Route>,
    service: Option<Arc<Service>>,
    plugin_config: Option<Arc<PluginConfig>>,
    /// The shared upstream it points at (`None`: inline, kept as `r:<id>`).
    upstream_id: Option<String>,
    pub(super) spec: Arc<RouteSpec<()>>,
    pub(super) meta: Arc<RouteMeta>,
    id: Arc<str>,
    service_key: Option<Arc<str>>,
    upstream: Arc<UpstreamRt>,
    timeouts: Timeouts,
    plugins: Option<Arc<Chain>>,
    websocket: bool,
}

/// The previous compile's routes by id: at an expected position first, by hash only when that misses.
pub(super) struct Lookup<'p> {
    prev: Option<&'p Reuse>,
    /// Positions by id, built only when the order shifted.
    by_id: std::cell::OnceCell<AHashMap<Arc<str>, usize>>,
}

impl<'p> Lookup<'p> {
    pub fn new(prev: Option<&'p Reuse>) -> Lookup<'p> {
        Lookup {
            prev,
            by_id: std::cell::OnceCell::new(),
        }
    }

    /// The entry of route `id` and its position, looked for at position `hint` first.
    fn find(&self, id: &str, hint: Option<usize>) -> Option<(usize, &'p Arc<CachedRoute>)> {
        let prev = self.prev?;
        if let Some(i) = hint.filter(|&i| prev.routes.get(i).is_some_and(|c| &*c.id == id)) {
            return prev.routes.get(i).map(|c| (i, c));
        }
        let at = *self
            .by_id
            .get_or_init(|| {
                prev.routes
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.id.clone(), i))
                    .collect()
            })
            .get(id)?;
        prev.routes.get(at).map(|c| (at, c))
    }

    /// The router spec route `id` had in the previous compile.
    pub fn spec_of(&self, id: &str, hint: Option<usize>) -> Option<&'p Arc<RouteSpec<()>>> {
        self.find(id, hint).map(|(_, c)| &c.spec)
    }

    /// The inline upstream runtime route `id` had in the previous compile (its `r:<id>` runtime), whatever
    /// else changed since: an unchanged upstream keeps its runtime (health, balancer state).
    pub fn inline_upstream(&self, id: &str, hint: Option<usize>) -> Option<&'p Arc<UpstreamRt>> {
        let (_, c) = self.find(id, hint)?;
        c.upstream_id.is_none().then_some(&c.upstream)
    }
}

/// The next compile's view of the previous one.
pub(super) struct Builder<'p> {
    /// The previous compile when its plugin state and environment are the same (else nothing is reused).
    old: Option<&'p Reuse>,
    lookup: Lookup<'p>,
    /// Where the previous compile's route for the next position is expected: its position minus the next one.
    shift: isize,
    pub next: Reuse,
}

fn env_of(res: &Resources) -> Resources {
    // Exhaustive on purpose: a new field in `Resources` must be placed on one side or the other here.
    let Resources {
        routes: _,
        services: _,
        upstreams: _,
        plugin_configs: _,
        stream_routes: _,
        ssls,
        consumers,
        global_rules,
        credentials,
        consumer_groups,
        plugin_metadata,
        protos,
        secrets,
    } = res;
    Resources {
        ssls: ssls.clone(),
        consumers: consumers.clone(),
        global_rules: global_rules.clone(),
        credentials: credentials.clone(),
        consumer_groups: consumer_groups.clone(),
        plugin_metadata: plugin_metadata.clone(),
        protos: protos.clone(),
        secrets: secrets.clone(),
        ..Resources::default()
    }
}

fn same_env(a: &Resources, b: &Resources) -> bool {
    a.consumers == b.consumers
        && a.ssls == b.ssls
        && a.global_rules == b.global_rules
        && a.credentials == b.credentials
        && a.consumer_groups == b.consumer_groups
        && a.plugin_metadata == b.plugin_metadata
        && a.protos == b.protos
        && a.secrets == b.secrets
}

impl Reuse {
    /// The configuration chains were compiled against besides routes, services, upstreams and plugin configs.
    pub(super) fn env(&self) -> &Resources {
        &self.env
    }

    /// Where route `id`'s merged plugin `name` came from, as `merge_route_service` lets them override: the
    /// route's own, else its plugin config's, else its service's.
    pub(super) fn source_of(&self, id: &str, name: &str) -> (&'static str, String) {
        let Some(c) = self.routes.iter().find(|c| &*c.id == id) else {
            return ("route", id.to_owned());
        };
        if c.route.plugins.contains_key(name) {
            return ("route", id.to_owned());
        }
        if let Some(pc) = c
            .plugin_config
            .as_ref()
            .filter(|p| p.plugins.contains_key(name))
        {
            return ("plugin_config", pc.id.0.clone());
        }
        match c.service.as_ref().filter(|s| s.plugins.contains_key(name)) {
            Some(s) => ("service", s.id.0.clone()),
            None => ("route", id.to_owned()),
        }
    }
}

impl<'p> Builder<'p> {
    /// The previous compile's entry for route `id`, looked for at position `hint` first.
    fn find_old(&self, id: &str, hint: Option<usize>) -> Option<(usize, &'p Arc<CachedRoute>)> {
        self.old?;
        self.lookup.find(id, hint)
    }

    /// Where the previous compile's entry for the next route is expected (see [`Lookup::find`]).
    pub fn expected(&self) -> Option<usize> {
        self.next.routes.len().checked_add_signed(self.shift)
    }

    pub fn new(prev: Option<&'p Reuse>, res: &Resources, shared: &Shared) -> Builder<'p> {
        let addr = shared as *const Shared as usize;
        let old = prev.filter(|p| p.shared == addr);
        let (old, env) = match old {
            Some(p) if same_env(&p.env, res) => (Some(p), p.env.clone()),
            _ => (None, Arc::new(env_of(res))),
        };
        // Services and plugin configs: the previous `Arc` when the value is unchanged, so routes compare pointers.
        let services = res
            .services
            .iter()
            .map(|s| {
                let kept = old
                    .and_then(|o| o.services.get(&s.id.0))
                    .filter(|k| ***k == *s);
                (
                    s.id.0.clone(),
                    kept.cloned().unwrap_or_else(|| Arc::new(s.clone())),
                )
            })
            .collect();
        let plugin_configs = res
            .plugin_configs
            .iter()
            .map(|p| {
                let kept = old
                    .and_then(|o| o.plugin_configs.get(&p.id.0))
                    .filter(|k| ***k == *p);
                (
                    p.id.0.clone(),
                    kept.cloned().unwrap_or_else(|| Arc::new(p.clone())),
                )
            })
            .collect();
        Builder {
            old,
            lookup: Lookup::new(old),
            shift: 0,
            next: Reuse {
                shared: addr,
                env,
                services,
                plugin_configs,
                routes: Vec::with_capacity(res.routes.len()),
            },
        }
    }

    fn service(&self, id: &Option<Id>) -> Option<Arc<Service>> {
        id.as_ref()
            .and_then(|i| self.next.services.get(&i.0))
            .cloned()
    }

    fn plugin_config(&self, id: &Option<Id>) -> Option<Arc<PluginConfig>> {
        id.as_ref()
            .and_then(|i| self.next.plugin_configs.get(&i.0))
            .cloned()
    }

    /// The previous compile of `r` when every input is unchanged: its cache entry (router spec, `RouteMeta`) and
    /// its compiled route.
    pub fn reuse(
        &mut self,
        r: &Arc<Route>,
        shared_ups: &AHashMap<&str, Arc<UpstreamRt>>,
    ) -> Option<(Arc<CachedRoute>, CompiledRoute)> {
        let index = self.next.routes.len();
        let hint = index.checked_add_signed(self.shift);
        // The same route (pointer) at the expected position: found without reading its id.
        let same = self.old.and_then(|o| {
            let i = hint?;
            o.routes
                .get(i)
                .filter(|c| Arc::ptr_eq(&c.route, r))
                .map(|c| (i, c))
        });
        let (at, c) = match same {
            Some(hit) => hit,
            None => self.find_old(&r.id.0, hint)?,
        };
        self.shift = at as isize - index as isize;
        let fresh_up = match &c.upstream_id {
            Some(id) => shared_ups
                .get(id.as_str())
                .is_some_and(|u| Arc::ptr_eq(u, &c.upstream)),
            None => true,
        };
        if !(fresh_up
            && same_ptr(&c.service, &self.service(&r.service_id))
            && same_ptr(&c.plugin_config, &self.plugin_config(&r.plugin_config_id))
            && (Arc::ptr_eq(&c.route, r) || *c.route == **r))
        {
            return None;
        }
        let compiled = CompiledRoute {
            id: c.id.clone(),
            service: c.service_key.clone(),
            upstream: c.upstream.clone(),
            timeouts: c.timeouts,
            plugins: c.plugins.clone(),
            websocket: c.websocket,
            inline: c.upstream_id.is_none(),
            dangling: None,
        };
        self.next.routes.push(c.clone());
        Some((c.clone(), compiled))
    }

    /// Records a freshly compiled route for the next compile.
    pub fn record(
        &mut self,
        r: &Arc<Route>,
        upstream_id: Option<String>,
        spec: Arc<RouteSpec<()>>,
        meta: Arc<RouteMeta>,
        compiled: &CompiledRoute,
    ) {
        let c = CachedRoute {
            route: r.clone(),
            service: self.service(&r.service_id),
            plugin_config: self.plugin_config(&r.plugin_config_id),
            upstream_id,
            spec,
            meta,
            id: compiled.id.clone(),
            service_key: compiled.service.clone(),
            upstream: compiled.upstream.clone(),
            timeouts: compiled.timeouts,
            plugins: compiled.plugins.clone(),
            websocket: compiled.websocket,
        };
        self.next.routes.push(Arc::new(c));
    }
}

/// Two router specs that compile to the same matching (values aside).
pub(super) fn same_spec(a: &RouteSpec<()>, b: &RouteSpec<()>) -> bool {
    a.uris == b.uris
        && a.hosts == b.hosts
        && a.methods == b.methods
        && a.remote_addrs == b.remote_addrs
        && a.vars == b.vars
        && a.priority == b.priority
}

fn same_ptr<T>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
