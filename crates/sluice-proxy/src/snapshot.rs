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
use sluice_model::{merge_route_service, Discovery, Id, Resources, Timeout, Upstream};
use sluice_plugins::{Chain, CompileEnv, Shared};
use sluice_router::{RouteSpec, Router, Var};
use sluice_upstream::{Balancer, LbKind, NodeSpec};

use crate::health_check::{self, ActiveCheck, Checks};
use crate::tls;
use crate::tls_server::SniTable;

#[cfg(test)]
mod discovery_tests;
mod reuse;
mod split;

/// One published configuration. Immutable; replaced whole.
pub struct Snapshot {
    pub revision: u64,
    /// Shared with the successor when no route's matching changed (same specs in the same order).
    pub(crate) router: Arc<Router<u32>>,
    /// The specs `router` was built from, by route index (compared by pointer by the next compile).
    router_specs: Vec<Arc<RouteSpec<()>>>,
    pub(crate) routes: Vec<CompiledRoute>,
    /// What plugins learn about each route (service id, names, matched patterns), by route index.
    pub(crate) route_meta: Vec<Arc<sluice_plugins::RouteMeta>>,
    /// Plugins of all global rules, run before every route's own (APISIX `global_rules`).
    pub(crate) global: Option<Arc<Chain>>,
    /// Upstream runtimes by `u:<id>` (shared upstreams) or `s:...` (traffic-split and stream routes' inline
    /// ones), for the next compile. Routes' inline upstreams (`r:<route id>`) are reached through `routes`.
    upstreams: AHashMap<Box<str>, Arc<UpstreamRt>>,
    /// Certificates by SNI for TLS listeners (`ssls`).
    pub(crate) tls: SniTable,
    /// Compiled routes with their inputs, so the next compile recompiles only what changed.
    reuse: reuse::Reuse,
    /// Upstreams plugins pick per request (traffic-split), by route index.
    pub(crate) splits: split::Splits,
    /// The consumers as this compile's auth plugins see them (`None`: no auth plugin compiled them).
    pub(crate) consumers: Option<Arc<sluice_plugins::consumers::Consumers>>,
    /// `stream_routes`, compiled (`crate::stream`).
    pub(crate) stream: crate::stream::StreamRouter,
}

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
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// For `https` active probes: the upstream's TLS settings (client certificate included) without ALPN h2.
    pub probe_tls: Option<Arc<rustls::ClientConfig>>,
    pub pass_host: PassHost,
    pub hash_on: HashOn,
    /// `None`: as many as there are other nodes (APISIX's default).
    pub retries: Option<u32>,
    pub retry_timeout: Option<Duration>,
    pub timeouts: Option<Timeouts>,
    pub pool: PoolCfg,
    /// `scheme: grpc`/`grpcs`: requests go over a multiplexed HTTP/2 connection (`h2::upstream`), not the pool.
    pub h2: bool,
    /// `checks.active`: probed by the checker task (`health_check::run`).
    pub active: Option<Arc<ActiveCheck>>,
    /// The configuration this was compiled from: an unchanged upstream keeps its runtime across reloads.
    /// Shared with the route (or service, or upstream) it came from: one copy of the configuration, not two.
    source: Arc<Upstream>,
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

impl UpstreamRt {
    /// The runtime of an `upstream_id` that names nothing: no nodes, every request 502 (see `missing`).
    pub(super) const NO_UPSTREAM_CONF: &'static str =
        "missing upstream configuration in Route or Service";

    /// A route with plugins and no upstream at all (APISIX's 503 when no plugin answers).
    pub(super) fn unconfigured() -> UpstreamRt {
        UpstreamRt {
            missing: Some((503, Self::NO_UPSTREAM_CONF.into())),
            ..UpstreamRt::missing("")
        }
    }

    pub(super) fn missing(id: &str) -> UpstreamRt {
        UpstreamRt {
            balancer: Balancer::new(LbKind::RoundRobin, Vec::new()),
            nodes: Vec::new(),
            tls: None,
            probe_tls: None,
            pass_host: PassHost::Pass,
            hash_on: HashOn::Consumer,
            retries: None,
            retry_timeout: None,
            timeouts: None,
            pool: PoolCfg {
                size: 0,
                idle_timeout: Duration::ZERO,
                requests: 1,
            },
            h2: false,
            active: None,
            source: Arc::default(),
            client_ssl: None,
            unsupported: None,
            missing: Some((
                502,
                format!("failed to fetch upstream info by upstream id [{id}]").into(),
            )),
        }
    }

    /// A discovered upstream without nodes: every request 503 with `why` logged (see `missing`).
    fn unavailable(u: &Arc<Upstream>, why: String) -> UpstreamRt {
        UpstreamRt {
            source: u.clone(),
            missing: Some((503, why.into())),
            ..UpstreamRt::missing("")
        }
    }
}

impl Snapshot {
    pub fn empty() -> Self {
        Snapshot {
            revision: 0,
            router: Arc::new(
                Router::build(Vec::new())
                    .unwrap_or_else(|_| unreachable!("an empty router always builds")),
            ),
            router_specs: Vec::new(),
            routes: Vec::new(),
            route_meta: Vec::new(),
            global: None,
            upstreams: AHashMap::new(),
            tls: SniTable::default(),
            reuse: reuse::Reuse::default(),
            splits: split::Splits::default(),
            consumers: None,
            stream: Default::default(),
        }
    }

    pub fn route_count(&self) -> usize {
        self.routes.len()
    }

    /// Consumers, global rules and the rest of what chains were compiled against.
    pub(crate) fn env(&self) -> &Resources {
        self.reuse.env()
    }

    /// Where route `id`'s plugin `name` comes from: (`route` | `plugin_config` | `service`, that resource's id).
    pub(crate) fn plugin_source(&self, id: &str, name: &str) -> (&'static str, String) {
        self.reuse.source_of(id, name)
    }

    /// Every upstream runtime with its key (`u:<id>` or `r:<route id>`), for the health checker and status API.
    pub(crate) fn upstream_runtimes(&self) -> impl Iterator<Item = &Arc<UpstreamRt>> {
        self.upstreams
            .values()
            .chain(self.routes.iter().filter(|r| r.inline).map(|r| &r.upstream))
    }

    pub(crate) fn upstream_entries(
        &self,
    ) -> impl Iterator<Item = (std::borrow::Cow<'_, str>, &Arc<UpstreamRt>)> {
        self.upstreams
            .iter()
            .map(|(k, v)| (std::borrow::Cow::Borrowed(&**k), v))
            .chain(
                self.routes
                    .iter()
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
    /// keeps its compiled form, so a one-route change costs little besides `Router::build`.
    pub fn compile_next(
        res: &Resources,
        revision: u64,
        shared: &Shared,
        prev: Option<&Snapshot>,
    ) -> Result<Snapshot, String> {
        Self::prepare_next(res, revision, shared, prev)?.finish()
    }

    /// [`Snapshot::compile_next`] up to, not including, the router over every route: it validates everything
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
    pub fn prepare_discovered(
        res: &Resources,
        revision: u64,
        shared: &Shared,
        prev: Option<&Snapshot>,
        discovery: Option<&dyn Discovery>,
    ) -> Result<Prepared, String> {
        let mut upstreams: AHashMap<Box<str>, Arc<UpstreamRt>> = AHashMap::new();
        let mut cache = reuse::Builder::new(prev.map(|p| &p.reuse), res, shared);
        let prev_lookup = reuse::Lookup::new(prev.map(|p| &p.reuse));
        // Where the previous compile's entry of the route being compiled is expected (see `reuse::Lookup`).
        let hint: std::cell::Cell<Option<usize>> = std::cell::Cell::new(None);
        let prev_inline = |id: &str| prev_lookup.inline_upstream(id, hint.get());
        let ssls: tls::SslsById = res.ssls.iter().map(|s| (s.id.0.as_str(), s)).collect();
        let mut runtime = |key: String, u: &Arc<Upstream>| -> Result<Arc<UpstreamRt>, String> {
            let resolved;
            let (u, empty) = match discover(u, discovery) {
                Discovered::Static => (u, None),
                Discovered::Nodes(r) => {
                    resolved = r;
                    (&resolved, None)
                }
                Discovered::None(why) => (u, Some(why)),
            };
            // A route's inline runtime is found through the previous compile's routes, not the map.
            let inline = key.strip_prefix("r:");
            let old = match inline {
                Some(id) => prev_inline(id),
                None => prev.and_then(|p| p.upstreams.get(key.as_str())),
            };
            let client_ssl = match &u.tls {
                Some(t) => tls::client_ssl(t, &ssls)?,
                None => None,
            };
            let rt = match old {
                Some(o)
                    if (Arc::ptr_eq(&o.source, u) || *o.source == **u)
                        && o.client_ssl.as_deref() == client_ssl
                        && o.missing.as_ref().map(|m| &*m.1) == empty.as_deref() =>
                {
                    o.clone()
                }
                _ if empty.is_some() => {
                    Arc::new(UpstreamRt::unavailable(u, empty.unwrap_or_default()))
                }
                _ => {
                    let rt = compile_upstream(u, &ssls)?;
                    if let Some(o) = old {
                        rt.balancer.inherit_state(&o.balancer);
                    }
                    Arc::new(rt)
                }
            };
            if inline.is_none() {
                upstreams.insert(key.into_boxed_str(), rt.clone());
            }
            Ok(rt)
        };
        let services: AHashMap<&Id, _> = res.services.iter().map(|s| (&s.id, s)).collect();
        let plugin_configs: AHashMap<&Id, _> =
            res.plugin_configs.iter().map(|p| (&p.id, p)).collect();
        let mut shared_ups: AHashMap<&str, Arc<UpstreamRt>> = AHashMap::new();
        for u in &res.upstreams {
            let id = u.id.as_ref().map(|i| i.0.as_str()).unwrap_or_default();
            // A shared upstream is one per `upstreams` entry (not per route): its own copy is cheap.
            let rt = runtime(format!("u:{id}"), &Arc::new(u.clone()))
                .map_err(|e| format!("upstream {id}: {e}"))?;
            shared_ups.insert(id, rt);
        }

        let env = CompileEnv::new(shared, &res.consumers, None)
            .with_groups_and_metadata(&res.consumer_groups, &res.plugin_metadata)
            .with_credentials(&res.credentials)
            .with_protos(&res.protos);
        let mut global_plugins = serde_json::Map::new();
        for g in &res.global_rules {
            global_plugins.extend(g.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let global =
            Chain::compile(&global_plugins, &env).map_err(|e| format!("global_rules: {e}"))?;
        if global.as_ref().is_some_and(|g| !g.upstreams().is_empty()) {
            return Err("global_rules: traffic-split is supported on routes only".into());
        }
        let mut routes = Vec::with_capacity(res.routes.len());
        let mut route_meta = Vec::with_capacity(res.routes.len());
        let mut router_specs: Vec<Arc<RouteSpec<()>>> = Vec::with_capacity(res.routes.len());
        // Routes compiled afresh, for the router's per-route checks.
        let mut fresh: Vec<(Arc<RouteSpec<()>>, Arc<str>)> = Vec::new();
        // The runtime shared by routes that answer before reaching an upstream (`dangling`).
        let mut missing_up: Option<Arc<UpstreamRt>> = None;
        // Whether every route keeps the router spec it had, at the index it had: then the router is reused.
        let prev_specs = prev.map_or(&[][..], |p| &p.router_specs[..]);
        for r in res.routes.iter().filter(|r| r.enabled()) {
            // A route with an inline discovered upstream compiles again (its nodes may have changed; the upstream
            // runtime is still kept when they did not).
            let discovered_inline = r
                .upstream
                .as_ref()
                .or_else(|| {
                    let s = r.service_id.as_ref().and_then(|id| services.get(id))?;
                    s.upstream.as_ref()
                })
                .is_some_and(|u| u.discovery_type.is_some());
            hint.set(cache.expected());
            let kept = if discovered_inline {
                None
            } else {
                cache.reuse(r, &shared_ups)
            };
            if let Some((c, compiled)) = kept {
                router_specs.push(c.spec.clone());
                route_meta.push(c.meta.clone());
                routes.push(compiled);
                continue;
            }
            let meta = Arc::new(route_meta_of(r, &services));
            let ctx = |e: String| format!("route {}: {e}", r.id);
            // A service or plugin config deleted with `?force=true` leaves the route routable (APISIX's router
            // keeps it) and answering APISIX's status; a later PUT of the resource heals it (such routes are
            // never reused, so the next compile sees the resource).
            let service = r
                .service_id
                .as_ref()
                .and_then(|id| services.get(id).copied());
            let pc = r
                .plugin_config_id
                .as_ref()
                .and_then(|id| plugin_configs.get(id).map(|p| &p.plugins));
            let dangling = if r.plugin_config_id.is_some() && pc.is_none() {
                Some(503)
            } else if r.service_id.is_some() && service.is_none() {
                Some(404)
            } else {
                None
            };
            if let Some(status) = dangling {
                let uris = r.all_uris();
                if uris.is_empty() {
                    return Err(ctx("one of uri or uris is required".into()));
                }
                let spec = RouteSpec {
                    uris,
                    hosts: merge_route_service(r, service, None).hosts,
                    methods: r.methods.clone(),
                    remote_addrs: r.all_remote_addrs(),
                    vars: r.vars.clone(),
                    priority: r.priority,
                    value: (),
                };
                let compiled = CompiledRoute {
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
                let spec = keep_spec(&prev_lookup, &compiled.id, spec, hint.get());
                fresh.push((spec.clone(), compiled.id.clone()));
                router_specs.push(spec);
                route_meta.push(meta);
                routes.push(compiled);
                continue;
            }
            let eff = merge_route_service(r, service, pc);
            let upstream = match (&eff.upstream, &eff.upstream_id) {
                (Some(u), _) => runtime(format!("r:{}", r.id), u).map_err(ctx)?,
                (None, Some(id)) => match shared_ups.get(id.0.as_str()) {
                    Some(u) => u.clone(),
                    None => Arc::new(UpstreamRt::missing(&id.0)),
                },
                // APISIX accepts a route with plugins and no upstream (one may answer, as mocking does); a
                // request its plugins do not answer gets 503.
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
            let plugins = Chain::compile(&eff.plugins, &env).map_err(ctx)?;
            let uris = r.all_uris();
            if uris.is_empty() {
                return Err(ctx("one of uri or uris is required".into()));
            }
            let spec = RouteSpec {
                uris,
                hosts: eff.hosts.clone(),
                methods: r.methods.clone(),
                remote_addrs: r.all_remote_addrs(),
                vars: r.vars.clone(),
                priority: r.priority,
                value: (),
            };
            let compiled = CompiledRoute {
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
            let spec = keep_spec(&prev_lookup, &compiled.id, spec, hint.get());
            cache.record(r, upstream_id, spec.clone(), meta.clone(), &compiled);
            fresh.push((spec.clone(), compiled.id.clone()));
            router_specs.push(spec);
            route_meta.push(meta);
            routes.push(compiled);
        }
        let splits = split::compile(&routes, res, &shared_ups, &mut runtime)?;
        let stream = crate::stream::StreamRouter::compile(
            res,
            &shared_ups,
            &mut runtime,
            shared,
            prev.map(|p| &p.stream),
        )?;
        // The routes compiled afresh go through the router's checks on their own (its errors are per route).
        Router::build_refs(fresh.iter().map(|(s, _)| (&**s, 0u32))).map_err(|e| {
            let id = fresh.get(e.index).map_or("?", |(_, id)| &**id);
            format!("route {id}: {}", e.reason)
        })?;
        // The previous router serves on when every route kept its spec (same pointer) at its index; when only a
        // few did not (a route's matching changed, routes were appended or removed at the end), it is updated
        // route by route (`RouterPlan::Update`, copy-on-write, O(changed routes), not O(routes)).
        let plan = match prev {
            None => RouterPlan::Build,
            Some(p) => router_plan(&p.router, prev_specs, &router_specs),
        };
        let tls = SniTable::compile(&res.ssls)?;
        let consumers = env.compiled.get().and_then(|c| c.as_ref().ok()).cloned();
        let router = match &plan {
            RouterPlan::Keep(r) => r.clone(),
            _ => Arc::new(empty_router()),
        };
        Ok(Prepared {
            plan,
            snap: Snapshot {
                revision,
                router,
                router_specs,
                routes,
                route_meta,
                global,
                upstreams,
                tls,
                reuse: cache.next,
                splits,
                consumers,
                stream,
            },
        })
    }
}

/// A route's [`sluice_plugins::RouteMeta`]: its service id and names, its first uri and host pattern.
fn route_meta_of(
    r: &sluice_model::Route,
    services: &AHashMap<&Id, &sluice_model::Service>,
) -> sluice_plugins::RouteMeta {
    let service = r.service_id.as_ref().and_then(|id| services.get(id));
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
        matched_uri: r.all_uris().first().map_or("", String::as_str).into(),
        matched_host: host.unwrap_or("").into(),
    }
}

fn empty_router() -> Router<u32> {
    Router::build(Vec::new()).unwrap_or_else(|_| unreachable!("an empty router always builds"))
}

/// `spec` as the previous compile's `Arc` when route `id` had an equal one (the router is reused when every
/// route's spec is the same pointer as before at the same index), else a new one.
fn keep_spec(
    prev: &reuse::Lookup<'_>,
    id: &str,
    spec: RouteSpec<()>,
    hint: Option<usize>,
) -> Arc<RouteSpec<()>> {
    prev.spec_of(id, hint)
        .filter(|old| reuse::same_spec(old, &spec))
        .cloned()
        .unwrap_or_else(|| Arc::new(spec))
}

/// A compiled configuration still missing its router (see [`Snapshot::prepare_next`]).
pub struct Prepared {
    snap: Snapshot,
    /// How [`Prepared::finish`] gets the router.
    plan: RouterPlan,
}

/// How the next snapshot's router comes from the previous one.
enum RouterPlan {
    /// No route's matching changed: the previous router (already in the snapshot).
    Keep(Arc<Router<u32>>),
    /// The previous router with the routes at these indices replaced, then `len` routes in all (the routes
    /// past the previous length appended, those past `len` removed).
    Update {
        base: Arc<Router<u32>>,
        changed: Vec<u32>,
        len: usize,
    },
    /// A router over every route.
    Build,
}

/// More routes than this changed (or shifted, since the router's values are route indices: a route added or
/// removed in the middle shifts every later one) and the router is built afresh rather than updated.
fn update_limit(routes: usize) -> usize {
    (routes / 8).max(64)
}

/// Compares the router specs by pointer, index by index (an unchanged route keeps its spec's `Arc`).
fn router_plan(
    base: &Arc<Router<u32>>,
    prev: &[Arc<RouteSpec<()>>],
    next: &[Arc<RouteSpec<()>>],
) -> RouterPlan {
    let limit = update_limit(next.len());
    let mut changed = Vec::new();
    for (i, (a, b)) in prev.iter().zip(next).enumerate() {
        if !Arc::ptr_eq(a, b) {
            if changed.len() >= limit {
                return RouterPlan::Build;
            }
            changed.push(i as u32);
        }
    }
    if changed.is_empty() && prev.len() == next.len() {
        return RouterPlan::Keep(base.clone());
    }
    if changed.len() + prev.len().abs_diff(next.len()) > limit {
        return RouterPlan::Build;
    }
    RouterPlan::Update {
        base: base.clone(),
        changed,
        len: next.len(),
    }
}

impl Prepared {
    /// Builds the router (or updates the previous one, or keeps it) and returns the snapshot to publish.
    pub fn finish(self) -> Result<Snapshot, String> {
        let Prepared { mut snap, plan } = self;
        let err = |snap: &Snapshot, e: sluice_router::RouterError| {
            let id = snap.routes.get(e.index).map_or("?", |r| &*r.id);
            format!("route {id}: {}", e.reason)
        };
        match plan {
            RouterPlan::Keep(_) => {}
            RouterPlan::Update { base, changed, len } => {
                let mut router = (*base).clone();
                let old_len = router.len();
                let appended = (old_len.min(len)..len).filter_map(|i| u32::try_from(i).ok());
                for i in changed.into_iter().chain(appended) {
                    let Some(spec) = snap.router_specs.get(i as usize) else {
                        continue;
                    };
                    router.insert(i, &**spec, i).map_err(|e| err(&snap, e))?;
                }
                for i in len..old_len {
                    router.remove(i as u32);
                }
                snap.router = Arc::new(router);
            }
            RouterPlan::Build => {
                let specs = snap.router_specs.iter().zip(0u32..).map(|(s, i)| (&**s, i));
                let router = Router::build_refs(specs).map_err(|e| err(&snap, e))?;
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
        client_ssl,
        unsupported,
        missing: None,
        probe_tls: base_tls,
        active: checks.active.map(Arc::new),
        balancer,
        nodes,
        tls: tls_cfg,
        h2,
        pass_host,
        hash_on,
        retries: u.retries,
        retry_timeout: u
            .retry_timeout
            .filter(|t| *t > 0.0)
            .map(Duration::from_secs_f64),
        timeouts: u.timeout.map(Timeouts::from),
        pool: PoolCfg {
            size: kp.size as usize,
            idle_timeout: Duration::from_secs_f64(kp.idle_timeout.max(0.0)),
            requests: kp.requests.max(1),
        },
    })
}
