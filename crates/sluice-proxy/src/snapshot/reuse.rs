//! What one compile leaves for the next (issue 4: one route changed out of 100,000 must not recompile the other
//! 99,999): services and plugin configs shared by `Arc` so that "same input" is a pointer comparison, the rest of
//! the configuration plugin chains may read (consumers, credentials, metadata, ...), and the lookup of a route's
//! previous compile (`Served`, which keeps its inputs). A route is reused only when its route, service, plugin
//! config, referenced upstream runtime, that environment and the plugin state (`Shared`) are all unchanged;
//! anything else compiles afresh. Routes are `Arc`s shared with the configuration they came from, so an unchanged
//! route is recognised by pointer before any comparison.

use std::cell::{Cell, OnceCell};
use std::sync::Arc;

use ahash::AHashMap;
use sluice_model::{Id, PluginConfig, Resources, Route, Service};
use sluice_plugins::{CompileEnv, Shared};
use sluice_router::RouteSpec;

use super::{Served, UpstreamRt};

/// What chains were compiled against, kept in the snapshot for the next compile.
#[derive(Default, Clone)]
pub(super) struct Reuse {
    /// Address of the `Shared` the chains were compiled with: chains are reused only under the same plugin state.
    shared: usize,
    /// Everything chains and upstream runtimes may depend on besides routes, services, upstreams and plugin
    /// configs (`ssls` included: upstream client certificates name them). Those four fields stay empty.
    env: Arc<Resources>,
    pub(super) services: AHashMap<String, Arc<Service>>,
    pub(super) plugin_configs: AHashMap<String, Arc<PluginConfig>>,
}

/// A previous compile's input routes and, by the same position, their compiles.
pub(super) type Previous<'p> = (
    &'p imbl::Vector<Arc<Route>>,
    &'p imbl::Vector<Option<Arc<Served>>>,
);

/// The previous compile's routes by position: a route is looked for where the position shift so far puts it,
/// by id only when that misses.
pub(super) struct Lookup<'p> {
    prev: Option<Previous<'p>>,
    shift: Cell<isize>,
    /// Positions by id, built only when the order shifted.
    by_id: OnceCell<AHashMap<&'p str, usize>>,
}

impl<'p> Lookup<'p> {
    pub fn new(prev: Option<Previous<'p>>) -> Lookup<'p> {
        Lookup {
            prev,
            shift: Cell::new(0),
            by_id: OnceCell::new(),
        }
    }

    /// The previous compile of route `r`, now at position `at` (`None`: new, or disabled before).
    pub fn find(&self, r: &Route, at: usize) -> Option<Arc<Served>> {
        let (inputs, table) = self.prev?;
        let guess = at.checked_add_signed(self.shift.get()).filter(|&i| {
            inputs
                .get(i)
                .is_some_and(|o| std::ptr::eq(&**o, r) || o.id == r.id)
        });
        let pos = match guess {
            Some(i) => i,
            None => {
                let i = *self
                    .by_id
                    .get_or_init(|| {
                        inputs
                            .iter()
                            .enumerate()
                            .map(|(i, o)| (o.id.0.as_str(), i))
                            .collect()
                    })
                    .get(r.id.0.as_str())?;
                self.shift.set(i as isize - at as isize);
                i
            }
        };
        table.get(pos).cloned().flatten()
    }
}

/// The next compile's view of the previous one.
pub(super) struct Builder<'p> {
    /// The previous compile when its plugin state and environment are the same (else nothing is reused).
    old: Option<&'p Reuse>,
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

fn env_for<'a>(shared: &'a Shared, res: &'a Resources) -> CompileEnv<'a> {
    CompileEnv::new(shared, &res.consumers, None)
        .with_groups_and_metadata(&res.consumer_groups, &res.plugin_metadata)
        .with_credentials(&res.credentials)
        .with_protos(&res.protos)
}

impl Reuse {
    /// The configuration chains were compiled against besides routes, services, upstreams and plugin configs.
    pub(super) fn env(&self) -> &Resources {
        &self.env
    }

    /// Whether chains were compiled with this plugin state.
    pub(super) fn same_shared(&self, shared: &Shared) -> bool {
        self.shared == shared as *const Shared as usize
    }

    /// The environment to compile more routes of this same configuration (`res` has this compile's environment),
    /// with the consumers it already compiled.
    pub(super) fn compile_env<'a>(
        &self,
        shared: &'a Shared,
        res: &'a Resources,
        consumers: Option<&Arc<sluice_plugins::consumers::Consumers>>,
    ) -> CompileEnv<'a> {
        let env = env_for(shared, res);
        if let Some(c) = consumers {
            let _ = env.compiled.set(Ok(c.clone()));
        }
        env
    }
}

impl<'p> Builder<'p> {
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
            next: Reuse {
                shared: addr,
                env,
                services,
                plugin_configs,
            },
        }
    }

    /// The environment routes compile against.
    pub fn compile_env<'a>(&self, shared: &'a Shared, res: &'a Resources) -> CompileEnv<'a> {
        env_for(shared, res)
    }

    fn service(&self, id: &Option<Id>) -> Option<&Arc<Service>> {
        id.as_ref().and_then(|i| self.next.services.get(&i.0))
    }

    fn plugin_config(&self, id: &Option<Id>) -> Option<&Arc<PluginConfig>> {
        id.as_ref().and_then(|i| self.next.plugin_configs.get(&i.0))
    }

    /// Whether `o`, the previous compile of `r`'s id, can serve as `r`'s compile: every input unchanged.
    pub fn reusable(
        &self,
        o: &Served,
        r: &Arc<Route>,
        shared_ups: &AHashMap<&str, Arc<UpstreamRt>>,
    ) -> bool {
        if self.old.is_none() || o.route.dangling.is_some() {
            return false;
        }
        let fresh_up = match &o.upstream_id {
            Some(id) => shared_ups
                .get(id.as_str())
                .is_some_and(|u| Arc::ptr_eq(u, &o.route.upstream)),
            None => true,
        };
        fresh_up
            && same_ptr(o.service.as_ref(), self.service(&r.service_id))
            && same_ptr(
                o.plugin_config.as_ref(),
                self.plugin_config(&r.plugin_config_id),
            )
            && (Arc::ptr_eq(&o.input, r) || *o.input == **r)
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

pub(super) fn same_ptr<T>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
