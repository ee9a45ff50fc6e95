//! Compiling a configuration into the immutable runtime [`Snapshot`] the workers serve from.
//!
//! Everything that can be decided before a request arrives is decided here, once per configuration change: route
//! and service merge, upstream references resolved to `Arc`s, node addresses resolved, balancers built, timeouts
//! chosen. A request then does one router lookup and follows pointers; it never resolves an id or a name.
//! Compilation is also the data plane's validation: a configuration that does not compile is never published.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;
use sluice_model::{
    merge_route_service, Discovery, PluginConfig, Resources, Route, Service, Timeout, Upstream,
};
use sluice_plugins::{Chain, CompileEnv, Shared};
use sluice_router::{RouteSpec, Router, Var};
use sluice_upstream::{Balancer, LbKind, NodeSpec};

use crate::health_check::{self, ActiveCheck, Checks};
use crate::tls;
use crate::tls_server::SniTable;

#[cfg(test)]
mod discovery_tests;
mod reuse;
use reuse::same_ptr;
mod split;
mod table;

/// A route as a request uses it (a traffic-split target is a copy with another upstream).
#[derive(Clone)]
pub(crate) struct CompiledRoute {
    pub id: Arc<str>,
    /// The route's service id, for the live counters (`sluice-stats`).
    pub service: Option<Arc<str>>,
    pub upstream: Arc<UpstreamRt>,
    pub timeouts: Timeouts,
    pub plugins: Option<Arc<Chain>>,
    pub websocket: bool,
    /// `upstream` is the route's own (inline, or its service's inline one): listed as `r:<route id>`.
    pub inline: bool,
    /// The route names a service or plugin config that is gone (deleted with `?force=true`): the status APISIX's
    /// `http_access_phase` answers before any plugin runs (404 for a service, 503 for a plugin config).
    pub dangling: Option<u16>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
}

impl From<Timeout> for Timeouts {
    fn from(t: Timeout) -> Self {
        let d = |s: f64| Duration::from_secs_f64(s.max(0.001));
        Timeouts {
            connect: d(t.connect),
            send: d(t.send),
            read: d(t.read),
        }
    }
}

pub(crate) enum PassHost {
    Pass,
    Node,
    Rewrite(Box<[u8]>),
}

#[derive(PartialEq)]
pub(crate) enum HashOn {
    Var(Var),
    Header(Box<str>),
    Cookie(Box<str>),
    /// The consumer an auth plugin identified.
    Consumer,
}

pub(crate) struct NodeRt {
    pub addr: SocketAddr,
    /// `host:port` as configured (port always shown): the node's key in the live counters.
    pub stats_key: Arc<str>,
    /// `host[:port]` for `pass_host: node`, port omitted when it is the scheme's default.
    pub host_header: Box<[u8]>,
    pub sni: Option<rustls::pki_types::ServerName<'static>>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolCfg {
    pub size: usize,
    pub idle_timeout: Duration,
    pub requests: u32,
}

pub(crate) struct UpstreamRt {
    pub balancer: Balancer,
    pub nodes: Vec<NodeRt>,
    pub pass_host: PassHost,
    pub pool: PoolCfg,
    /// `scheme: grpc`/`grpcs`: requests go over a multiplexed HTTP/2 connection (`h2::upstream`), not the pool.
    pub h2: bool,
    /// The configuration this was compiled from: an unchanged upstream keeps its runtime across reloads.
    /// Shared with the route (or service, or upstream) it came from: one copy of the configuration, not two.
    source: Arc<Upstream>,
    /// What most upstreams leave unset, read through `Deref` (`rt.retries`, `rt.missing`, ...): one `Arc` shared
    /// by every runtime that sets none of it (issue 16: ~170 bytes per route with an inline upstream otherwise).
    rare: Arc<Rare>,
}

/// The parts of an [`UpstreamRt`] most upstreams leave at their defaults (see `UpstreamRt::rare`).
pub(crate) struct Rare {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// For `https` active probes: the upstream's TLS settings (client certificate included) without ALPN h2.
    pub probe_tls: Option<Arc<rustls::ClientConfig>>,
    pub hash_on: HashOn,
    /// `None`: as many as there are other nodes (APISIX's default).
    pub retries: Option<u32>,
    pub retry_timeout: Option<Duration>,
    pub timeouts: Option<Timeouts>,
    /// `checks.active`: probed by the checker task (`health_check::run`).
    pub active: Option<Arc<ActiveCheck>>,
    /// The `ssls` entry `tls.client_cert_id` named: changing it changes the upstream too.
    client_ssl: Option<Box<sluice_model::Ssl>>,
    /// A `type` Sluice has no balancer for, with several nodes. APISIX accepts any `type` when it is written and
    /// fails each request that needs a balancer (its `require("apisix.balancer." .. type)` throws; a lone node is
    /// picked without one): the same here, 500 per request, so that a configuration written for another balancer
    /// still loads.
    pub unsupported: Option<Box<str>>,
    /// Stands for an `upstream_id` that names no upstream (deleted with `?force=true`): the request runs its
    /// plugins, then gets 502, as APISIX's `handle_upstream`; or for a discovered upstream without nodes (none
    /// known, or its `discovery_type` not configured): 503, as APISIX's `set_by_route`. Such a runtime has no
    /// nodes. The status and the reason logged.
    pub missing: Option<(u16, Box<str>)>,
}

impl Rare {
    fn new() -> Rare {
        Rare {
            tls: None,
            probe_tls: None,
            hash_on: HashOn::Var(Var::parse("remote_addr")),
            retries: None,
            retry_timeout: None,
            timeouts: None,
            active: None,
            client_ssl: None,
            unsupported: None,
            missing: None,
        }
    }

    /// `self` behind an `Arc`: the shared one when every field has its default.
    fn shared(self) -> Arc<Rare> {
        static DEFAULT: std::sync::LazyLock<Arc<Rare>> =
            std::sync::LazyLock::new(|| Arc::new(Rare::new()));
        let Rare {
            tls,
            probe_tls,
            hash_on,
            retries,
            retry_timeout,
            timeouts,
            active,
            client_ssl,
            unsupported,
            missing,
        } = &self;
        let default = tls.is_none()
            && probe_tls.is_none()
            && *hash_on == DEFAULT.hash_on
            && retries.is_none()
            && retry_timeout.is_none()
            && timeouts.is_none()
            && active.is_none()
            && client_ssl.is_none()
            && unsupported.is_none()
            && missing.is_none();
        if default {
            DEFAULT.clone()
        } else {
            Arc::new(self)
        }
    }
}

impl std::ops::Deref for UpstreamRt {
    type Target = Rare;

    #[inline]
    fn deref(&self) -> &Rare {
        &self.rare
    }
}

impl UpstreamRt {
    /// The runtime of an `upstream_id` that names nothing: no nodes, every request 502 (see `missing`).
    pub(super) const NO_UPSTREAM_CONF: &'static str =
        "missing upstream configuration in Route or Service";

    /// A route with plugins and no upstream at all (APISIX's 503 when no plugin answers).
    pub(super) fn unconfigured() -> UpstreamRt {
        UpstreamRt::failing(Arc::default(), 503, Self::NO_UPSTREAM_CONF.into())
    }

    pub(super) fn missing(id: &str) -> UpstreamRt {
        UpstreamRt::failing(
            Arc::default(),
            502,
            format!("failed to fetch upstream info by upstream id [{id}]").into(),
        )
    }

    /// A discovered upstream without nodes: every request 503 with `why` logged (see `missing`).
    fn unavailable(u: &Arc<Upstream>, why: String) -> UpstreamRt {
        UpstreamRt::failing(u.clone(), 503, why.into())
    }

    /// A runtime without nodes whose every request gets `status` (see `Rare::missing`).
    fn failing(source: Arc<Upstream>, status: u16, why: Box<str>) -> UpstreamRt {
        UpstreamRt {
            balancer: Balancer::new(LbKind::RoundRobin, Vec::new()),
            nodes: Vec::new(),
            pass_host: PassHost::Pass,
            pool: PoolCfg {
                size: 0,
                idle_timeout: Duration::ZERO,
                requests: 1,
            },
            h2: false,
            source,
            rare: Arc::new(Rare {
                hash_on: HashOn::Consumer,
                missing: Some((status, why)),
                ..Rare::new()
            }),
        }
    }
}

/// Everything compiled for one route: what a request needs (`route`, `meta`, `splits`) and the inputs it was
/// compiled from, so that the next compile keeps it when they did not change. Shared by `Arc` between successive
/// snapshots; the router's value is its `slot`.
pub(crate) struct Served {
    pub route: CompiledRoute,
    /// What plugins learn about the route (service id, names, matched patterns).
    pub meta: sluice_plugins::RouteMeta,
    /// Upstreams plugins pick per request instead of the route's (traffic-split), by the plugin's index.
    pub splits: Box<[CompiledRoute]>,
    /// The router's tie-break among candidates of equal priority: increasing with the route's position in the
    /// configuration, with gaps, so a route added between two others takes an order between theirs.
    order: u32,
    slot: u32,
    input: Arc<Route>,
    service: Option<Arc<Service>>,
    plugin_config: Option<Arc<PluginConfig>>,
    /// The shared upstream it points at (`None`: its own, listed as `r:<id>`, or none).
    upstream_id: Option<String>,
}

impl Served {
    /// A copy with other traffic-split targets (same slot and order: the router is unaffected).
    fn with_splits(&self, splits: Box<[CompiledRoute]>) -> Served {
        Served {
            route: self.route.clone(),
            meta: self.meta.clone(),
            splits,
            order: self.order,
            slot: self.slot,
            input: self.input.clone(),
            service: self.service.clone(),
            plugin_config: self.plugin_config.clone(),
            upstream_id: self.upstream_id.clone(),
        }
    }

    /// The router's view of the route, made again from its inputs when the router needs it (issue 16: kept per
    /// route it was a second copy of what `input` holds, ~190 bytes a route).
    fn spec(&self) -> RouteSpec<()> {
        spec_of(&self.input, self.service.as_deref())
    }

    /// Whether `self` and `other` match the same requests (values aside): same inputs by pointer, else compared.
    fn same_match(&self, other: &Served) -> bool {
        (Arc::ptr_eq(&self.input, &other.input)
            && same_ptr(self.service.as_ref(), other.service.as_ref()))
            || reuse::same_spec(&self.spec(), &other.spec())
    }

    fn placed(mut self, order: u32, slot: u32) -> Served {
        self.order = order;
        self.slot = slot;
        self
    }
}

/// One published configuration. Immutable; replaced whole. Its per-route parts are persistent structures shared
/// with its predecessor and successor, so a write touching a few routes costs O(those routes), whatever the
/// route count (issue 16).
pub struct Snapshot {
    pub revision: u64,
    /// Values are slots of `slots`.
    pub(crate) router: Arc<Router<u32>>,
    /// The enabled routes by slot: what a request reaches from the router.
    pub(crate) slots: table::Slots<Arc<Served>>,
    /// The configuration's routes this was compiled from, and by the same position each one's compile (`None`:
    /// disabled). The next compile finds the routes that changed by comparing pointers with `inputs`.
    inputs: imbl::Vector<Arc<Route>>,
    table: imbl::Vector<Option<Arc<Served>>>,
    /// Everything else this was compiled from (routes left empty), to tell that only routes changed.
    rest: Arc<Resources>,
    /// Plugins of all global rules, run before every route's own (APISIX `global_rules`).
    pub(crate) global: Option<Arc<Chain>>,
    /// Upstream runtimes by `u:<id>` (shared upstreams) or `s:...` (traffic-split and stream routes' inline
    /// ones), for the next compile. Routes' inline upstreams (`r:<route id>`) are reached through `slots`.
    upstreams: AHashMap<Box<str>, Arc<UpstreamRt>>,
    /// Routes' inline upstream runtimes that have active health checks (the checker's list).
    inline_checked: Arc<[Arc<UpstreamRt>]>,
    /// Certificates by SNI for TLS listeners (`ssls`).
    pub(crate) tls: Arc<SniTable>,
    /// Services, plugin configs and the environment chains were compiled against.
    reuse: reuse::Reuse,
    /// The consumers as this compile's auth plugins see them (`None`: no auth plugin compiled them).
    pub(crate) consumers: Option<Arc<sluice_plugins::consumers::Consumers>>,
    /// `stream_routes`, compiled (`crate::stream`).
    pub(crate) stream: Arc<crate::stream::StreamRouter>,
    /// Whether some route's upstream comes from discovery (such routes compile again on every full compile).
    discovered: bool,
    /// Runtimes of routes' inline upstreams that routes share (see [`SharedInline`]).
    shared_inline: Arc<SharedInline>,
}

/// Routes whose inline upstreams are equal hold one `Arc<Upstream>` (sluice-model interns them when decoding) and
/// share one runtime: one balancer, as though they named one upstream by id (issue 16: 100k routes to one
/// backend held 100k runtimes of ~500 bytes). By the configuration's address; a hit counts only when the
/// runtime was compiled from that very `Arc` (which it keeps alive), so an address reused after a free never
/// matches. A cache for compiles, never read by requests; carried from a snapshot to its successors.
#[derive(Default)]
struct SharedInline {
    map: std::sync::Mutex<(AHashMap<usize, std::sync::Weak<UpstreamRt>>, usize)>,
}

impl SharedInline {
    /// Whether routes may share `u`'s runtime: not with health checks (the checker and the status API list
    /// those per route), TLS settings (a client certificate's `ssls` entry may change under it) or discovery.
    fn shareable(u: &Upstream) -> bool {
        u.checks.is_none() && u.tls.is_none() && u.discovery_type.is_none()
    }

    fn get(&self, u: &Arc<Upstream>) -> Option<Arc<UpstreamRt>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.0
            .get(&(Arc::as_ptr(u) as usize))
            .and_then(std::sync::Weak::upgrade)
            .filter(|rt| Arc::ptr_eq(&rt.source, u))
    }

    fn put(&self, rt: &Arc<UpstreamRt>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let (m, swept_at) = &mut *map;
        m.insert(Arc::as_ptr(&rt.source) as usize, Arc::downgrade(rt));
        // Dead entries (each holding its runtime's block through the weak reference) go when the map has grown
        // by an eighth since the last sweep (at least 64 entries): few are held, and sweeping is O(1) per insert.
        if m.len() >= *swept_at + (*swept_at / 8).max(64) {
            m.retain(|_, w| w.strong_count() > 0);
            *swept_at = m.len();
        }
    }

    /// The runtime for a route's inline upstream `u`: the route's own previous one `old` when compiled from
    /// this very `u`, else the one another route shares, else `compile()` (which may inherit `old`'s state).
    fn runtime(
        &self,
        u: &Arc<Upstream>,
        old: Option<&Arc<UpstreamRt>>,
        compile: impl FnOnce() -> Result<Arc<UpstreamRt>, String>,
    ) -> Result<Arc<UpstreamRt>, String> {
        if !Self::shareable(u) {
            return compile();
        }
        if let Some(o) = old.filter(|o| Arc::ptr_eq(&o.source, u)) {
            return Ok(o.clone());
        }
        if let Some(rt) = self.get(u) {
            return Ok(rt);
        }
        let rt = compile()?;
        if Arc::ptr_eq(&rt.source, u) {
            self.put(&rt);
        }
        Ok(rt)
    }
}

/// Compiles (or keeps across reloads) an upstream runtime under a key.
type RuntimeFn<'r> = dyn FnMut(String, &Arc<Upstream>) -> Result<Arc<UpstreamRt>, String> + 'r;

/// What compiling one route needs besides the route.
struct RouteCx<'a, 'e> {
    services: &'a AHashMap<String, Arc<Service>>,
    plugin_configs: &'a AHashMap<String, Arc<PluginConfig>>,
    shared_ups: &'a AHashMap<&'a str, Arc<UpstreamRt>>,
    env: &'a CompileEnv<'e>,
}

impl Snapshot {
    pub fn empty() -> Self {
        Snapshot {
            revision: 0,
            router: Arc::new(empty_router()),
            slots: table::Slots::default(),
            inputs: imbl::Vector::new(),
            table: imbl::Vector::new(),
            rest: Arc::default(),
            global: None,
            upstreams: AHashMap::new(),
            inline_checked: Arc::new([]),
            tls: Arc::default(),
            reuse: reuse::Reuse::default(),
            consumers: None,
            stream: Arc::default(),
            discovered: false,
            shared_inline: Arc::default(),
        }
    }

    pub fn route_count(&self) -> usize {
        self.slots.len()
    }

    /// The route a request reached through the router.
    #[inline]
    pub(crate) fn served(&self, slot: u32) -> Option<&Served> {
        self.slots.get(slot).map(|s| &**s)
    }

    /// The enabled routes in the configuration's order.
    #[cfg(test)]
    pub(crate) fn routes(&self) -> impl Iterator<Item = &CompiledRoute> {
        self.table.iter().flatten().map(|s| &s.route)
    }

    /// The enabled route `id`.
    pub(crate) fn served_by_id(&self, id: &str) -> Option<&Served> {
        self.slots
            .values()
            .map(|s| &**s)
            .find(|s| &*s.route.id == id)
    }

    /// Consumers, global rules and the rest of what chains were compiled against.
    pub(crate) fn env(&self) -> &Resources {
        self.reuse.env()
    }

    /// Where route `id`'s merged plugin `name` comes from (`route` | `plugin_config` | `service`, that resource's
    /// id), as `merge_route_service` lets them override: the route's own, else its plugin config's, else its
    /// service's.
    pub(crate) fn plugin_source(&self, id: &str, name: &str) -> (&'static str, String) {
        let Some(c) = self.served_by_id(id) else {
            return ("route", id.to_owned());
        };
        if c.input.plugins.contains_key(name) {
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

    /// The upstream runtimes the health checker looks at: every shared one (`u:<id>`, `s:...`) and the routes'
    /// own ones that have active checks.
    pub(crate) fn upstream_runtimes(&self) -> impl Iterator<Item = &Arc<UpstreamRt>> {
        self.upstreams.values().chain(self.inline_checked.iter())
    }

    /// Every upstream runtime with its key (`u:<id>` or `r:<route id>`), for the status API.
    pub(crate) fn upstream_entries(
        &self,
    ) -> impl Iterator<Item = (std::borrow::Cow<'_, str>, &Arc<UpstreamRt>)> {
        self.upstreams
            .iter()
            .map(|(k, v)| (std::borrow::Cow::Borrowed(&**k), v))
            .chain(
                self.slots
                    .values()
                    .map(|s| &s.route)
                    .filter(|r| r.inline)
                    .map(|r| (std::borrow::Cow::Owned(format!("r:{}", r.id)), &r.upstream)),
            )
    }

    /// Compiles `res` with throwaway plugin state: a dry run that validates a configuration.
    pub fn compile(res: &Resources, revision: u64) -> Result<Snapshot, String> {
        Self::compile_with(res, revision, &Shared::default())
    }

    /// Compiles `res` at `revision`. An error names the resource at fault, in APISIX's words where it has them.
    pub fn compile_with(
        res: &Resources,
        revision: u64,
        shared: &Shared,
    ) -> Result<Snapshot, String> {
        Self::compile_next(res, revision, shared, None)
    }

    /// Compiles `res` as the successor of `prev`: an upstream whose configuration did not change keeps its runtime
    /// (balancer cursor, connection counts, health); a changed one inherits health and latency state by node
    /// address. A reload therefore neither resets passive health nor skews least_conn. A route whose inputs did
    /// not change (same route, service, plugin config, upstream runtime, consumers and plugin state: `reuse`)
    /// keeps its compiled form, its slot and its place in the router.
    pub fn compile_next(
        res: &Resources,
        revision: u64,
        shared: &Shared,
        prev: Option<&Snapshot>,
    ) -> Result<Snapshot, String> {
        Self::prepare_next(res, revision, shared, prev)?.finish()
    }

    /// [`Snapshot::compile_next`] up to, not including, a router build over every route: it validates everything
    /// (the routes compiled afresh go through the router's checks on their own, since its errors are per route),
    /// so the Admin API's dry run gets its verdict without the one step whose cost grows with the route count;
    /// [`Prepared::finish`] builds the router when the result is published.
    pub fn prepare_next(
        res: &Resources,
        revision: u64,
        shared: &Shared,
        prev: Option<&Snapshot>,
    ) -> Result<Prepared, String> {
        Self::prepare_discovered(res, revision, shared, prev, None)
    }

    /// [`Snapshot::compile_next`] with the nodes of upstreams that name a `discovery_type` from `discovery`.
    pub fn compile_discovered(
        res: &Resources,
        revision: u64,
        shared: &Shared,
        prev: Option<&Snapshot>,
        discovery: Option<&dyn Discovery>,
    ) -> Result<Snapshot, String> {
        Self::prepare_discovered(res, revision, shared, prev, discovery)?.finish()
    }

    /// [`Snapshot::prepare_next`] with the nodes of upstreams that name a `discovery_type` from `discovery`:
    /// such an upstream compiles as if its nodes were written in it, so an unchanged node list keeps the runtime
    /// (health, balancer state) and a changed one inherits it by node address, as any upstream edit does.
    ///
    /// When only a few routes differ from `prev`'s configuration (the Admin API's single writes), only those are
    /// compiled and placed (`Snapshot::routes_changed`): the cost does not depend on the route count.
    pub fn prepare_discovered(
        res: &Resources,
        revision: u64,
        shared: &Shared,
        prev: Option<&Snapshot>,
        discovery: Option<&dyn Discovery>,
    ) -> Result<Prepared, String> {
        if let Some(p) = prev {
            if let Some(done) = p.routes_changed(res, revision, shared, discovery) {
                return done.map(|snap| Prepared {
                    plan: RouterPlan::Keep,
                    snap,
                });
            }
        }
        Self::prepare_full(res, revision, shared, prev, discovery)
    }

    /// The successor of `self` when `res` differs from what `self` was compiled from in at most
    /// [`FAST_MAX_CHANGES`] routes (added, changed or removed: found by comparing pointers from both ends) and
    /// nothing else; `None` when it does not (or a changed route is one this path leaves to the full compile).
    fn routes_changed(
        &self,
        res: &Resources,
        revision: u64,
        shared: &Shared,
        discovery: Option<&dyn Discovery>,
    ) -> Option<Result<Snapshot, String>> {
        // Discovered nodes may have changed since: the full compile asks discovery again.
        if !self.reuse.same_shared(shared)
            || (discovery.is_some() && self.discovered)
            || !same_rest(&self.rest, res)
        {
            return None;
        }
        let (prev_in, next_in) = (&self.inputs, &res.routes);
        let prefix = shared_run(prev_in.leaves(), next_in.leaves(), usize::MAX, false);
        let room = prev_in.len().min(next_in.len()) - prefix;
        let suffix = shared_run(prev_in.leaves().rev(), next_in.leaves().rev(), room, true);
        let (old_n, new_n) = (
            prev_in.len() - prefix - suffix,
            next_in.len() - prefix - suffix,
        );
        if old_n > FAST_MAX_CHANGES || new_n > FAST_MAX_CHANGES {
            return None;
        }
        // The window's routes paired by id: (old position, new position); a pair out of order is a reorder.
        // By index: an iterator would step over the prefix one route at a time.
        let olds: Vec<&Arc<Route>> = (prefix..prefix + old_n).map(|i| &prev_in[i]).collect();
        let news: Vec<&Arc<Route>> = (prefix..prefix + new_n).map(|i| &next_in[i]).collect();
        let mut paired: Vec<Option<usize>> = vec![None; new_n];
        let mut last = None;
        for (j, r) in news.iter().enumerate() {
            if let Some(i) = olds.iter().position(|o| o.id == r.id) {
                if last.is_some_and(|l| l >= i) {
                    return None;
                }
                last = Some(i);
                paired[j] = Some(i);
            }
        }
        let old_served = |i: usize| self.table.get(prefix + i).cloned().flatten();
        // Routes this path leaves to the full compile: discovered upstreams and traffic-split targets (their
        // runtimes live in the shared map), old or new.
        let delicate = |r: &Route| {
            r.upstream
                .as_ref()
                .is_some_and(|u| u.discovery_type.is_some())
                || r.service_id
                    .as_ref()
                    .and_then(|id| self.reuse.services.get(&id.0))
                    .and_then(|s| s.upstream.as_ref())
                    .is_some_and(|u| u.discovery_type.is_some())
                || r.plugins.contains_key("traffic-split")
        };
        if news.iter().any(|r| delicate(r))
            || (0..old_n)
                .any(|i| old_served(i).is_some_and(|s| !s.splits.is_empty() || delicate(&s.input)))
        {
            return None;
        }

        let env = self.reuse.compile_env(shared, res, self.consumers.as_ref());
        let shared_ups: AHashMap<&str, Arc<UpstreamRt>> = self
            .upstreams
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("u:")?, v.clone())))
            .collect();
        let cx = RouteCx {
            services: &self.reuse.services,
            plugin_configs: &self.reuse.plugin_configs,
            shared_ups: &shared_ups,
            env: &env,
        };
        let ssls: tls::SslsById = res.ssls.iter().map(|s| (s.id.0.as_str(), s)).collect();
        let mut missing_up = None;
        // Cloned on the first edit: a write that changes no route's matching keeps the router itself.
        let mut edited: Option<Router<u32>> = None;
        let mut slots = self.slots.clone();
        let mut table = self.table.clone();
        let mut checked: Vec<Arc<UpstreamRt>> = self.inline_checked.to_vec();
        let uncheck = |checked: &mut Vec<Arc<UpstreamRt>>, s: &Served| {
            if s.route.inline && s.route.upstream.active.is_some() {
                checked.retain(|u| !Arc::ptr_eq(u, &s.route.upstream));
            }
        };
        // The old window leaves the table; the new one is placed as it is compiled.
        for i in (0..old_n).rev() {
            table.remove(prefix + i);
        }
        let kept_old: Vec<bool> = {
            let mut k = vec![false; old_n];
            for i in paired.iter().flatten() {
                k[*i] = true;
            }
            k
        };
        for (i, kept) in kept_old.iter().enumerate() {
            if let (false, Some(s)) = (kept, old_served(i)) {
                edit(&mut edited, &self.router).remove(s.order, &s.spec());
                slots.clear(s.slot);
                uncheck(&mut checked, &s);
            }
        }
        let err_of = |id: &str, e: sluice_router::RouterError| format!("route {id}: {}", e.reason);
        for (j, r) in news.iter().enumerate() {
            let at = prefix + j;
            let old = paired[j].and_then(old_served);
            if let Some(o) = &old {
                uncheck(&mut checked, o);
            }
            if !r.enabled() {
                if let Some(o) = &old {
                    edit(&mut edited, &self.router).remove(o.order, &o.spec());
                    slots.clear(o.slot);
                }
                table.insert(at, None);
                continue;
            }
            // Unchanged but for its `Arc` (a configuration decoded again): the previous compile serves on.
            if let Some(o) = old.as_ref().filter(|o| {
                o.route.dangling.is_none()
                    && *o.input == ***r
                    && same_ptr(
                        o.service.as_ref(),
                        r.service_id.as_ref().and_then(|id| cx.services.get(&id.0)),
                    )
                    && same_ptr(
                        o.plugin_config.as_ref(),
                        r.plugin_config_id
                            .as_ref()
                            .and_then(|id| cx.plugin_configs.get(&id.0)),
                    )
            }) {
                if o.route.inline && o.route.upstream.active.is_some() {
                    checked.push(o.route.upstream.clone());
                }
                table.insert(at, Some(o.clone()));
                continue;
            }
            let mut runtime = |_key: String, u: &Arc<Upstream>| {
                let inherit = old
                    .as_ref()
                    .filter(|o| o.route.inline)
                    .map(|o| &o.route.upstream);
                self.shared_inline
                    .runtime(u, inherit, || upstream_runtime(u, inherit, &ssls, None))
            };
            let fresh = match compile_route(r, &cx, &mut runtime, &mut missing_up) {
                Ok(f) => f,
                Err(e) => return Some(Err(e)),
            };
            // Traffic-split from its service or plugin config: its targets are the full compile's to place.
            if fresh
                .route
                .plugins
                .as_ref()
                .is_some_and(|c| !c.upstreams().is_empty())
            {
                return None;
            }
            let (order, slot) = match &old {
                Some(o) => (o.order, o.slot),
                None => {
                    // Between the enabled routes around it (already placed before it, kept or not yet
                    // placed after it).
                    let below = (0..at)
                        .rev()
                        .take(FAST_SCAN)
                        .find_map(|k| table.get(k).cloned().flatten())
                        .map(|s| i64::from(s.order));
                    let above = news[j + 1..]
                        .iter()
                        .zip(&paired[j + 1..])
                        .filter(|(r, _)| r.enabled())
                        .find_map(|(_, p)| p.and_then(old_served))
                        .map(|s| i64::from(s.order))
                        .or_else(|| {
                            (prefix + old_n..self.table.len())
                                .take(FAST_SCAN)
                                .find_map(|k| self.table.get(k).cloned().flatten())
                                .map(|s| i64::from(s.order))
                        });
                    let (lo, hi) = (
                        below.unwrap_or(-1),
                        above.unwrap_or(i64::from(u32::MAX) + 1),
                    );
                    if hi - lo < 2 {
                        return None;
                    }
                    let step = (hi - lo) / 2;
                    let order = match above {
                        // Appended: the usual stride after the last route, so appends keep room between them.
                        None => lo + step.min(ORDER_STRIDE),
                        Some(_) => lo + step,
                    };
                    (order as u32, slots.alloc())
                }
            };
            let served = Arc::new(fresh.placed(order, slot));
            let matching_changed = old.as_ref().is_none_or(|o| !o.same_match(&served));
            if matching_changed {
                let router = edit(&mut edited, &self.router);
                // Its previous version leaves first (the router finds a route's candidates by its spec).
                if let Some(o) = &old {
                    router.remove(o.order, &o.spec());
                }
                if let Err(e) = router.insert(order, &served.spec(), slot) {
                    return Some(Err(err_of(&served.route.id, e)));
                }
            }
            if served.route.inline && served.route.upstream.active.is_some() {
                checked.push(served.route.upstream.clone());
            }
            slots.set(slot, served.clone());
            table.insert(at, Some(served));
        }
        let router = match edited {
            Some(r) => Arc::new(r),
            None => self.router.clone(),
        };
        Some(Ok(Snapshot {
            revision,
            router,
            slots,
            inputs: next_in.clone(),
            table,
            rest: self.rest.clone(),
            global: self.global.clone(),
            upstreams: self.upstreams.clone(),
            inline_checked: checked.into(),
            tls: self.tls.clone(),
            reuse: self.reuse.clone(),
            consumers: env
                .compiled
                .get()
                .and_then(|c| c.as_ref().ok())
                .cloned()
                .or_else(|| self.consumers.clone()),
            stream: self.stream.clone(),
            discovered: self.discovered,
            shared_inline: self.shared_inline.clone(),
        }))
    }

    /// Compiles every route, keeping the previous compile of each whose inputs did not change.
    fn prepare_full(
        res: &Resources,
        revision: u64,
        shared: &Shared,
        prev: Option<&Snapshot>,
        discovery: Option<&dyn Discovery>,
    ) -> Result<Prepared, String> {
        let mut upstreams: AHashMap<Box<str>, Arc<UpstreamRt>> = AHashMap::new();
        // One cache for every compile descending from the first (dead entries are swept as it grows).
        let shared_inline = prev.map(|p| p.shared_inline.clone()).unwrap_or_default();
        let cache = reuse::Builder::new(prev.map(|p| &p.reuse), res, shared);
        let prev_lookup = reuse::Lookup::new(prev.map(|p| (&p.inputs, &p.table)));
        // The previous compile of the route being compiled (any of its upstream state is inherited).
        let current_old: std::cell::RefCell<Option<Arc<Served>>> = Default::default();
        let ssls: tls::SslsById = res.ssls.iter().map(|s| (s.id.0.as_str(), s)).collect();
        let mut runtime = |key: String, u: &Arc<Upstream>| -> Result<Arc<UpstreamRt>, String> {
            // A route's inline runtime is found through the previous compile of the route, not the map.
            let inline = key.starts_with("r:");
            let cur = current_old.borrow();
            let old = if inline {
                cur.as_ref()
                    .filter(|o| o.route.inline)
                    .map(|o| &o.route.upstream)
            } else {
                prev.and_then(|p| p.upstreams.get(key.as_str()))
            };
            if !inline {
                let rt = upstream_runtime(u, old, &ssls, discovery)?;
                upstreams.insert(key.into_boxed_str(), rt.clone());
                return Ok(rt);
            }
            shared_inline.runtime(u, old, || upstream_runtime(u, old, &ssls, discovery))
        };
        let mut shared_ups: AHashMap<&str, Arc<UpstreamRt>> = AHashMap::new();
        for u in &res.upstreams {
            let id = u.id.as_ref().map(|i| i.0.as_str()).unwrap_or_default();
            // A shared upstream is one per `upstreams` entry (not per route): its own copy is cheap.
            let rt = runtime(format!("u:{id}"), &Arc::new(u.clone()))
                .map_err(|e| format!("upstream {id}: {e}"))?;
            shared_ups.insert(id, rt);
        }

        let env = cache.compile_env(shared, res);
        let mut global_plugins = serde_json::Map::new();
        for g in &res.global_rules {
            global_plugins.extend(g.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let global =
            Chain::compile(&global_plugins, &env).map_err(|e| format!("global_rules: {e}"))?;
        if global.as_ref().is_some_and(|g| !g.upstreams().is_empty()) {
            return Err("global_rules: traffic-split is supported on routes only".into());
        }
        let services = cache.next.services.clone();
        let plugin_configs = cache.next.plugin_configs.clone();
        let cx = RouteCx {
            services: &services,
            plugin_configs: &plugin_configs,
            shared_ups: &shared_ups,
            env: &env,
        };
        // Each enabled route's compile (order and slot not yet placed), with its previous compile.
        // (compile, previous compile, whether the compile is the previous one reused)
        let mut compiled: Vec<Option<Compiled>> = Vec::with_capacity(res.routes.len());
        // Routes compiled afresh, for the router's per-route checks.
        let mut fresh: Vec<(RouteSpec<()>, Arc<str>)> = Vec::new();
        let mut missing_up: Option<Arc<UpstreamRt>> = None;
        let mut discovered = false;
        for (at, r) in res.routes.iter().enumerate() {
            let old = prev_lookup.find(r, at);
            if !r.enabled() {
                compiled.push(None);
                continue;
            }
            // A route with a discovered upstream compiles again (its nodes may have changed; the upstream
            // runtime is still kept when they did not).
            let discovered_inline = r
                .upstream
                .as_ref()
                .or_else(|| {
                    let s = r.service_id.as_ref().and_then(|id| services.get(&id.0))?;
                    s.upstream.as_ref()
                })
                .is_some_and(|u| u.discovery_type.is_some());
            discovered |= discovered_inline;
            if !discovered_inline {
                if let Some(o) = old.as_ref().filter(|o| cache.reusable(o, r, &shared_ups)) {
                    // Its traffic-split targets are compiled again below (an upstream they name may have changed).
                    let s = o.with_splits(Box::new([]));
                    compiled.push(Some((s, Some(o.clone()), true)));
                    continue;
                }
            }
            *current_old.borrow_mut() = old.clone();
            let s = compile_route(r, &cx, &mut runtime, &mut missing_up)?;
            if old.as_ref().is_none_or(|o| !o.same_match(&s)) {
                fresh.push((s.spec(), s.route.id.clone()));
            }
            compiled.push(Some((s, old, false)));
        }
        *current_old.borrow_mut() = None;
        // Traffic-split targets, over reused and fresh routes alike, so an upstream named by id is the current one.
        for (entry, r) in compiled.iter_mut().zip(res.routes.iter()) {
            let Some((s, _, _)) = entry else { continue };
            s.splits = split::compile(&s.route, r.timeout, &shared_ups, &mut runtime)?;
        }
        let stream = crate::stream::StreamRouter::compile(
            res,
            &shared_ups,
            &mut runtime,
            shared,
            prev.map(|p| &*p.stream),
        )?;
        // The routes compiled afresh go through the router's checks on their own (its errors are per route).
        Router::build_refs(fresh.iter().map(|(s, _)| (s, 0u32))).map_err(|e| {
            let id = fresh.get(e.index).map_or("?", |(_, id)| &**id);
            format!("route {id}: {}", e.reason)
        })?;

        // Orders: each kept route keeps its own while they still increase with the position; new ones take
        // orders between their neighbours'; else every route is numbered afresh (and the router rebuilt).
        let olds: Vec<Option<u32>> = compiled
            .iter()
            .flatten()
            .map(|(_, o, _)| o.as_ref().map(|o| o.order))
            .collect();
        let orders = place_orders(&olds);
        let renumbered = orders.is_none();
        let orders = orders.unwrap_or_else(|| number_orders(olds.len()));
        let mut slots = match prev {
            Some(p) if !renumbered => p.slots.clone(),
            _ => table::Slots::default(),
        };
        let mut table = imbl::Vector::new();
        let mut ops = Vec::new();
        let mut seen: ahash::AHashSet<u32> = ahash::AHashSet::new();
        let mut checked = Vec::new();
        let mut k = 0;
        for entry in compiled {
            let Some((s, old, reused)) = entry else {
                table.push_back(None);
                continue;
            };
            let order = orders[k];
            k += 1;
            let (slot, same_place) = match old.as_ref().filter(|_| !renumbered) {
                Some(o) if seen.insert(o.slot) => (o.slot, o.order == order),
                _ => (slots.alloc(), false),
            };
            let unchanged_match = same_place && old.as_ref().is_some_and(|o| o.same_match(&s));
            if !unchanged_match {
                // Its previous version in the previous router leaves first (found by its spec).
                if let Some(o) = old.as_ref().filter(|o| !renumbered && o.slot == slot) {
                    ops.push(RouterOp::Remove(o.clone()));
                }
            }
            let served = match old {
                // Kept whole: the same `Arc` (no traffic-split targets to refresh).
                Some(o)
                    if reused
                        && o.order == order
                        && o.slot == slot
                        && s.splits.is_empty()
                        && o.splits.is_empty() =>
                {
                    o
                }
                _ => Arc::new(s.placed(order, slot)),
            };
            if !unchanged_match {
                ops.push(RouterOp::Insert(order, slot));
            }
            if served.route.inline && served.route.upstream.active.is_some() {
                checked.push(served.route.upstream.clone());
            }
            slots.set(slot, served.clone());
            table.push_back(Some(served));
        }
        // Routes gone (removed, disabled or moved to another slot): their slots and router entries go.
        if let Some(p) = prev.filter(|_| !renumbered) {
            for s in p.slots.values() {
                if !seen.contains(&s.slot) {
                    ops.push(RouterOp::Remove(s.clone()));
                    slots.clear(s.slot);
                }
            }
        }
        // Removals first: an order a removed route held may be taken by an insert.
        ops.sort_by_key(|op| matches!(op, RouterOp::Insert(..)));
        let plan = match prev {
            Some(_) if renumbered => RouterPlan::Build,
            None => RouterPlan::Build,
            Some(_) if ops.is_empty() => RouterPlan::Keep,
            Some(_) if ops.len() > update_limit(table.len()) => RouterPlan::Build,
            Some(_) => RouterPlan::Update(ops),
        };
        let tls = Arc::new(SniTable::compile(&res.ssls)?);
        let consumers = env.compiled.get().and_then(|c| c.as_ref().ok()).cloned();
        let router = match prev {
            Some(p) => p.router.clone(),
            None => Arc::new(empty_router()),
        };
        let rest = Arc::new(rest_of(res));
        let discovered = discovered
            || res.upstreams.iter().any(|u| u.discovery_type.is_some())
            || res.services.iter().any(|s| {
                s.upstream
                    .as_ref()
                    .is_some_and(|u| u.discovery_type.is_some())
            })
            || res.stream_routes.iter().any(|r| {
                r.upstream
                    .as_ref()
                    .is_some_and(|u| u.discovery_type.is_some())
            });
        Ok(Prepared {
            plan,
            snap: Snapshot {
                revision,
                router,
                slots,
                inputs: res.routes.clone(),
                table,
                rest,
                global,
                upstreams,
                inline_checked: checked.into(),
                tls,
                reuse: cache.next,
                consumers,
                stream: Arc::new(stream),
                discovered,
                shared_inline,
            },
        })
    }
}

/// How many leading routes two route vectors share (same `Arc`s), at most `limit`, walking their leaves: a leaf
/// both share (same memory) is skipped whole, so two vectors differing by a few routes cost a pointer comparison
/// per 64 routes, not per route. With `from_end`, the leaves come last first and trailing routes are counted.
fn shared_run<'a>(
    mut a: impl Iterator<Item = &'a [Arc<Route>]>,
    mut b: impl Iterator<Item = &'a [Arc<Route>]>,
    limit: usize,
    from_end: bool,
) -> usize {
    let (mut x, mut y): (&[Arc<Route>], &[Arc<Route>]) = (&[], &[]);
    let mut n = 0;
    while n < limit {
        if x.is_empty() {
            match a.next() {
                Some(l) => x = l,
                None => break,
            }
        }
        if y.is_empty() {
            match b.next() {
                Some(l) => y = l,
                None => break,
            }
        }
        if std::ptr::eq(x, y) && n + x.len() <= limit {
            n += x.len();
            (x, y) = (&[], &[]);
            continue;
        }
        let left = limit - n;
        let same = if from_end {
            x.iter()
                .rev()
                .zip(y.iter().rev())
                .take(left)
                .take_while(|(p, q)| Arc::ptr_eq(p, q))
                .count()
        } else {
            x.iter()
                .zip(y)
                .take(left)
                .take_while(|(p, q)| Arc::ptr_eq(p, q))
                .count()
        };
        n += same;
        if same < x.len().min(y.len()) || same == left {
            break;
        }
        if from_end {
            (x, y) = (&x[..x.len() - same], &y[..y.len() - same]);
        } else {
            (x, y) = (&x[same..], &y[same..]);
        }
    }
    n.min(limit)
}

/// An enabled route's compile in the full path: (compile, its previous compile, whether it is that one reused).
type Compiled = (Served, Option<Arc<Served>>, bool);

/// At most this many routes added, changed or removed by one write take the per-route path; more compile whole.
const FAST_MAX_CHANGES: usize = 256;
/// How far that path looks past disabled routes for a new route's neighbours.
const FAST_SCAN: usize = 4096;
/// The gap between consecutive routes' orders when numbered afresh (room for routes added between them).
const ORDER_STRIDE: i64 = 1 << 10;

/// Orders `1 * stride`, `2 * stride`, ... for `n` routes, the stride shrinking when `n` is large.
fn number_orders(n: usize) -> Vec<u32> {
    let stride = (i64::from(u32::MAX) / (n as i64 + 2)).clamp(1, ORDER_STRIDE);
    (0..n as i64).map(|i| ((i + 1) * stride) as u32).collect()
}

/// Orders for routes whose previous orders are `olds` (`None`: new), keeping every previous one; `None` when they
/// no longer increase or leave no room for the new routes between them.
fn place_orders(olds: &[Option<u32>]) -> Option<Vec<u32>> {
    let mut out = Vec::with_capacity(olds.len());
    let mut lo: i64 = -1;
    let mut i = 0;
    while i < olds.len() {
        if let Some(o) = olds[i] {
            if i64::from(o) <= lo {
                return None;
            }
            lo = i64::from(o);
            out.push(o);
            i += 1;
            continue;
        }
        // A run of new routes up to the next kept one.
        let end = (i..olds.len())
            .find(|&k| olds[k].is_some())
            .unwrap_or(olds.len());
        let run = (end - i) as i64;
        let (hi, step) = match olds.get(end).copied().flatten() {
            Some(h) => {
                let h = i64::from(h);
                (h, (h - lo) / (run + 1))
            }
            None => {
                let top = i64::from(u32::MAX) + 1;
                (top, ((top - lo) / (run + 1)).min(ORDER_STRIDE))
            }
        };
        if step < 1 || lo + step * run >= hi {
            return None;
        }
        for k in 1..=run {
            out.push((lo + step * k) as u32);
        }
        lo += step * run;
        i = end;
    }
    Some(out)
}

/// Compiles one enabled route (its order and slot are placed by the caller).
fn compile_route(
    r: &Arc<Route>,
    cx: &RouteCx<'_, '_>,
    runtime: &mut RuntimeFn<'_>,
    missing_up: &mut Option<Arc<UpstreamRt>>,
) -> Result<Served, String> {
    let ctx = |e: String| format!("route {}: {e}", r.id);
    // A service or plugin config deleted with `?force=true` leaves the route routable (APISIX's router keeps it)
    // and answering APISIX's status; a later PUT of the resource heals it (such routes are never reused, so the
    // next compile sees the resource).
    let service = r.service_id.as_ref().and_then(|id| cx.services.get(&id.0));
    let plugin_config = r
        .plugin_config_id
        .as_ref()
        .and_then(|id| cx.plugin_configs.get(&id.0));
    let meta = route_meta_of(r, service.map(|s| &**s));
    // Placed (order and slot) by the caller.
    let served = |route, upstream_id| Served {
        route,
        meta,
        splits: Box::new([]),
        order: 0,
        slot: 0,
        input: r.clone(),
        service: service.cloned(),
        plugin_config: plugin_config.cloned(),
        upstream_id,
    };
    if r.uri.is_none() && r.uris.is_empty() {
        return Err(ctx("one of uri or uris is required".into()));
    }
    let dangling = if r.plugin_config_id.is_some() && plugin_config.is_none() {
        Some(503)
    } else if r.service_id.is_some() && service.is_none() {
        Some(404)
    } else {
        None
    };
    if let Some(status) = dangling {
        let route = CompiledRoute {
            id: Arc::from(r.id.0.as_str()),
            service: r.service_id.as_ref().map(|s| Arc::from(s.0.as_str())),
            upstream: missing_up
                .get_or_insert_with(|| Arc::new(UpstreamRt::missing("")))
                .clone(),
            timeouts: Timeout::default().into(),
            plugins: None,
            websocket: false,
            inline: false,
            dangling: Some(status),
        };
        // Never reused: `reusable` refuses a dangling route.
        return Ok(served(route, Some(String::new())));
    }
    let eff = merge_route_service(r, service.map(|s| &**s), plugin_config.map(|p| &p.plugins));
    let upstream = match (&eff.upstream, &eff.upstream_id) {
        (Some(u), _) => runtime(format!("r:{}", r.id), u).map_err(ctx)?,
        (None, Some(id)) => match cx.shared_ups.get(id.0.as_str()) {
            Some(u) => u.clone(),
            None => Arc::new(UpstreamRt::missing(&id.0)),
        },
        // APISIX accepts a route with plugins and no upstream (one may answer, as mocking does); a request its
        // plugins do not answer gets 503.
        (None, None) if !eff.plugins.is_empty() => Arc::new(UpstreamRt::unconfigured()),
        (None, None) => {
            return Err(ctx(
                "missing upstream configuration in Route or Service".into()
            ))
        }
    };
    let timeouts = r
        .timeout
        .map(Timeouts::from)
        .or(upstream.timeouts)
        .unwrap_or_else(|| Timeout::default().into());
    let plugins = Chain::compile(&eff.plugins, cx.env).map_err(ctx)?;
    let route = CompiledRoute {
        id: Arc::from(r.id.0.as_str()),
        service: r.service_id.as_ref().map(|s| Arc::from(s.0.as_str())),
        upstream,
        timeouts,
        plugins,
        websocket: eff.enable_websocket,
        inline: eff.upstream.is_some(),
        dangling: None,
    };
    let upstream_id = match eff.upstream {
        Some(_) => None,
        None => eff.upstream_id.as_ref().map(|i| i.0.clone()),
    };
    Ok(served(route, upstream_id))
}

/// The router's view of route `r` under `service` (the route's hosts, else its service's, as
/// `merge_route_service` gives them).
fn spec_of(r: &Route, service: Option<&Service>) -> RouteSpec<()> {
    let mut hosts = r.all_hosts();
    if hosts.is_empty() {
        if let Some(s) = service {
            hosts = s.hosts.clone();
        }
    }
    RouteSpec {
        uris: r.all_uris(),
        hosts,
        methods: r.methods.clone(),
        remote_addrs: r.all_remote_addrs(),
        vars: r.vars.clone(),
        priority: r.priority,
        value: (),
    }
}

/// The runtime of upstream `u`: `old` itself when its configuration is unchanged, else a new one inheriting its
/// balancer state by node address. A discovered upstream compiles with the nodes `discovery` gives.
fn upstream_runtime(
    u: &Arc<Upstream>,
    old: Option<&Arc<UpstreamRt>>,
    ssls: &tls::SslsById<'_>,
    discovery: Option<&dyn Discovery>,
) -> Result<Arc<UpstreamRt>, String> {
    let resolved;
    let (u, empty) = match discover(u, discovery) {
        Discovered::Static => (u, None),
        Discovered::Nodes(r) => {
            resolved = r;
            (&resolved, None)
        }
        Discovered::None(why) => (u, Some(why)),
    };
    let client_ssl = match &u.tls {
        Some(t) => tls::client_ssl(t, ssls)?,
        None => None,
    };
    Ok(match old {
        Some(o)
            if (Arc::ptr_eq(&o.source, u) || *o.source == **u)
                && o.client_ssl.as_deref() == client_ssl
                && o.missing.as_ref().map(|m| &*m.1) == empty.as_deref() =>
        {
            o.clone()
        }
        _ if empty.is_some() => Arc::new(UpstreamRt::unavailable(u, empty.unwrap_or_default())),
        _ => {
            let rt = compile_upstream(u, ssls)?;
            if let Some(o) = old {
                rt.balancer.inherit_state(&o.balancer);
            }
            Arc::new(rt)
        }
    })
}

/// `res` without its routes: what the per-route path checks did not change.
fn rest_of(res: &Resources) -> Resources {
    Resources {
        routes: imbl::Vector::new(),
        services: res.services.clone(),
        upstreams: res.upstreams.clone(),
        consumers: res.consumers.clone(),
        global_rules: res.global_rules.clone(),
        plugin_configs: res.plugin_configs.clone(),
        ssls: res.ssls.clone(),
        credentials: res.credentials.clone(),
        consumer_groups: res.consumer_groups.clone(),
        plugin_metadata: res.plugin_metadata.clone(),
        protos: res.protos.clone(),
        secrets: res.secrets.clone(),
        stream_routes: res.stream_routes.clone(),
    }
}

/// Whether `res` has exactly `rest`'s resources besides routes.
fn same_rest(rest: &Resources, res: &Resources) -> bool {
    // Exhaustive on purpose: a new field in `Resources` must be compared here.
    let Resources {
        routes: _,
        services,
        upstreams,
        consumers,
        global_rules,
        plugin_configs,
        ssls,
        credentials,
        consumer_groups,
        plugin_metadata,
        protos,
        secrets,
        stream_routes,
    } = rest;
    *services == res.services
        && *upstreams == res.upstreams
        && *consumers == res.consumers
        && *global_rules == res.global_rules
        && *plugin_configs == res.plugin_configs
        && *ssls == res.ssls
        && *credentials == res.credentials
        && *consumer_groups == res.consumer_groups
        && *plugin_metadata == res.plugin_metadata
        && *protos == res.protos
        && *secrets == res.secrets
        && *stream_routes == res.stream_routes
}

/// A route's [`sluice_plugins::RouteMeta`]: its service id and names, its first uri and host pattern.
fn route_meta_of(r: &Route, service: Option<&Service>) -> sluice_plugins::RouteMeta {
    // The route's hosts, else its service's (as the merge gives them to the router).
    let host = r
        .host
        .as_deref()
        .or_else(|| r.hosts.first().map(String::as_str))
        .or_else(|| service.and_then(|s| s.hosts.first()).map(String::as_str));
    sluice_plugins::RouteMeta {
        service_id: r.service_id.as_ref().map(|i| i.0.as_str().into()),
        route_name: r.name.as_deref().map(Into::into),
        service_name: service.and_then(|s| s.name.as_deref()).map(Into::into),
        matched_uri: r
            .uri
            .as_deref()
            .or(r.uris.first().map(String::as_str))
            .unwrap_or("")
            .into(),
        matched_host: host.unwrap_or("").into(),
    }
}

/// The router being edited, cloned from `base` on the first edit.
fn edit<'a>(edited: &'a mut Option<Router<u32>>, base: &Router<u32>) -> &'a mut Router<u32> {
    edited.get_or_insert_with(|| base.clone())
}

fn empty_router() -> Router<u32> {
    Router::default()
}

/// A compiled configuration still missing its router (see [`Snapshot::prepare_next`]).
pub struct Prepared {
    snap: Snapshot,
    /// How [`Prepared::finish`] gets the router.
    plan: RouterPlan,
}

/// One edit of the previous router (orders are the router's keys).
enum RouterOp {
    /// A route of the previous snapshot leaves (found by its spec).
    Remove(Arc<Served>),
    /// The route in this slot, at this order (which no route holds once the removals are done).
    Insert(u32, u32),
}

/// How the next snapshot's router comes from the previous one (already in the snapshot).
enum RouterPlan {
    /// No route's matching changed, or the per-route path already edited it.
    Keep,
    /// The previous router with these edits (removals first).
    Update(Vec<RouterOp>),
    /// A router over every route.
    Build,
}

/// More router edits than this and the router is built afresh rather than updated.
fn update_limit(routes: usize) -> usize {
    (routes / 8).max(64)
}

impl Prepared {
    /// Builds the router (or updates the previous one, or keeps it) and returns the snapshot to publish.
    pub fn finish(self) -> Result<Snapshot, String> {
        let Prepared { mut snap, plan } = self;
        let err = |snap: &Snapshot, e: sluice_router::RouterError| {
            let id = snap
                .slots
                .values()
                .find(|s| s.order as usize == e.index)
                .map_or("?", |s| &*s.route.id);
            format!("route {id}: {}", e.reason)
        };
        match plan {
            RouterPlan::Keep => {}
            RouterPlan::Update(ops) => {
                let mut router = (*snap.router).clone();
                for op in ops {
                    match op {
                        RouterOp::Remove(old) => {
                            router.remove(old.order, &old.spec());
                        }
                        RouterOp::Insert(order, slot) => {
                            let Some(s) = snap.slots.get(slot) else {
                                continue;
                            };
                            router
                                .insert(order, &s.spec(), slot)
                                .map_err(|e| err(&snap, e))?;
                        }
                    }
                }
                snap.router = Arc::new(router);
            }
            RouterPlan::Build => {
                let mut router = Router::default();
                for s in snap.slots.values() {
                    router
                        .insert(s.order, &s.spec(), s.slot)
                        .map_err(|e| err(&snap, e))?;
                }
                snap.router = Arc::new(router);
            }
        }
        Ok(snap)
    }
}

/// What discovery gives an upstream.
enum Discovered {
    /// No `discovery_type`: its own `nodes`.
    Static,
    /// The upstream with the discovered nodes in `nodes`.
    Nodes(Arc<Upstream>),
    /// No node: why (APISIX's words), for the log of each 503.
    None(String),
}

fn discover(u: &Upstream, discovery: Option<&dyn Discovery>) -> Discovered {
    let Some(kind) = u.discovery_type.as_deref() else {
        return Discovered::Static;
    };
    let service = u.service_name.as_deref().unwrap_or_default();
    match discovery.and_then(|d| d.nodes(kind, service, u.discovery_args.as_ref())) {
        None => Discovered::None(format!("discovery {kind} is uninitialized")),
        Some(nodes) if nodes.is_empty() => Discovered::None(format!(
            "no valid upstream node: no {kind} provider of {service:?}"
        )),
        Some(nodes) => Discovered::Nodes(Arc::new(Upstream {
            nodes: sluice_model::Nodes::List(nodes),
            ..u.clone()
        })),
    }
}

fn compile_upstream(u: &Arc<Upstream>, ssls: &tls::SslsById<'_>) -> Result<UpstreamRt, String> {
    let mut unsupported = None;
    let kind = match u.kind.as_str() {
        "roundrobin" => LbKind::RoundRobin,
        "chash" => LbKind::Chash,
        "least_conn" => LbKind::LeastConn,
        "ewma" => LbKind::Ewma,
        // APISIX picks a lone node without loading a balancer, so only several nodes fail.
        other
            if match &u.nodes {
                sluice_model::Nodes::Map(m) => m.len(),
                sluice_model::Nodes::List(l) => l.len(),
            } > 1 =>
        {
            tracing::warn!(
                r#type = other,
                "upstream type without a balancer: its requests get 500"
            );
            unsupported = Some(format!("no balancer for upstream type {other:?}").into());
            LbKind::RoundRobin
        }
        _ => LbKind::RoundRobin,
    };
    // grpc/grpcs and Sluice's h2c/h2: HTTP/2 to the upstream (cleartext prior knowledge / TLS with ALPN h2), see
    // `h2::upstream`.
    let (https, h2) = match u.scheme.as_str() {
        // tcp/udp/tls: stream routes' upstreams (APISIX's L4 schemes); `tls` dials the node with TLS.
        "http" | "tcp" | "udp" => (false, false),
        "https" | "tls" => (true, false),
        "grpc" | "h2c" => (false, true),
        "grpcs" | "h2" => (true, true),
        other => {
            return Err(format!(
                "unsupported scheme {other:?} (http, https, grpc, grpcs, h2c, h2, tcp, udp and tls are served)"
            ))
        }
    };
    let default_port = if https { 443 } else { 80 };
    let list = u.nodes.to_list()?;
    if list.is_empty() {
        return Err("upstream has no nodes".into());
    }
    let mut nodes = Vec::with_capacity(list.len());
    let mut specs = Vec::with_capacity(list.len());
    for n in &list {
        let port = n.port.unwrap_or(default_port);
        // Resolved once per compile: DNS names in nodes follow config changes, not TTLs.
        let addr = (n.host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve node {}:{port}: {e}", n.host))?
            .next()
            .ok_or_else(|| format!("node {}:{port} resolves to no address", n.host))?;
        let host_header = if port == default_port {
            n.host.clone()
        } else if n.host.contains(':') {
            format!("[{}]:{port}", n.host)
        } else {
            format!("{}:{port}", n.host)
        };
        let sni = if https {
            Some(
                rustls::pki_types::ServerName::try_from(n.host.clone())
                    .map_err(|e| format!("node {}: invalid TLS server name: {e}", n.host))?,
            )
        } else {
            None
        };
        let stats_key = if n.host.contains(':') {
            format!("[{}]:{port}", n.host)
        } else {
            format!("{}:{port}", n.host)
        };
        nodes.push(NodeRt {
            addr,
            stats_key: stats_key.into(),
            host_header: host_header.clone().into_bytes().into(),
            sni,
        });
        specs.push(NodeSpec {
            addr: host_header,
            weight: n.weight,
            priority: n.priority,
        });
    }
    let pass_host = match u.pass_host.as_str() {
        "pass" => PassHost::Pass,
        "node" => PassHost::Node,
        "rewrite" => PassHost::Rewrite(
            u.upstream_host
                .clone()
                .ok_or("pass_host is rewrite but upstream_host is not set")?
                .into_bytes()
                .into(),
        ),
        other => return Err(format!("invalid pass_host {other:?}")),
    };
    let hash_on = match (u.hash_on.as_str(), u.key.as_deref()) {
        (_, None) if kind == LbKind::Chash => return Err("missing key for chash".into()),
        ("vars", key) => HashOn::Var(Var::parse(key.unwrap_or("remote_addr"))),
        ("header", Some(k)) => HashOn::Header(k.to_ascii_lowercase().into()),
        ("cookie", Some(k)) => HashOn::Cookie(k.into()),
        ("consumer", _) => HashOn::Consumer,
        ("vars_combinations", _) => {
            return Err("hash_on vars_combinations is not supported yet".into());
        }
        (other, _) => return Err(format!("invalid hash_on {other:?}")),
    };
    let kp = u.keepalive_pool;
    let checks = match &u.checks {
        Some(v) => health_check::parse(v)?,
        None => Checks::default(),
    };
    let https_probe = checks
        .active
        .as_ref()
        .is_some_and(|a| a.kind == health_check::ProbeKind::Https);
    let base_tls = if https || https_probe {
        Some(tls::client_config(u.tls.as_ref(), ssls)?)
    } else {
        None
    };
    let tls_cfg = match &base_tls {
        Some(cfg) if h2 => {
            let mut c = (**cfg).clone();
            c.alpn_protocols = vec![b"h2".to_vec()];
            Some(Arc::new(c))
        }
        Some(cfg) if https => Some(cfg.clone()),
        _ => None,
    };
    let client_ssl = match &u.tls {
        Some(t) => tls::client_ssl(t, ssls)?.cloned().map(Box::new),
        None => None,
    };
    let balancer = match checks.passive {
        Some(p) => Balancer::with_passive(kind, specs, p),
        None => Balancer::new(kind, specs),
    };
    Ok(UpstreamRt {
        source: u.clone(),
        rare: Rare {
            client_ssl,
            unsupported,
            missing: None,
            probe_tls: base_tls,
            active: checks.active.map(Arc::new),
            tls: tls_cfg,
            hash_on,
            retries: u.retries,
            retry_timeout: u
                .retry_timeout
                .filter(|t| *t > 0.0)
                .map(Duration::from_secs_f64),
            timeouts: u.timeout.map(Timeouts::from),
        }
        .shared(),
        balancer,
        nodes,
        h2,
        pass_host,
        pool: PoolCfg {
            size: kp.size as usize,
            idle_timeout: Duration::from_secs_f64(kp.idle_timeout.max(0.0)),
            requests: kp.requests.max(1),
        },
    })
}
