//! Compiled plugin chains and the runner that walks them. A chain is built once per route per configuration
//! snapshot; running a phase is a loop over a `Vec` guarded by one bitmask test.
//!
//! Consumer plugins follow APISIX's `merge_consumer_route`: once an auth plugin has attached a consumer (during
//! rewrite), the consumer's own plugins join the chain. Their rewrite hooks run right away; access, before_proxy,
//! header_filter and log walk both priority-sorted lists in one merge, a consumer plugin replacing the route's
//! plugin of the same name. The consumer's plugins are compiled once per snapshot (see [`crate::consumers`]), so a
//! request never compiles or looks up anything by name. Not here: the plugins themselves, the consumer maps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::{Map, Value};
use sluice_router::expr::Expr;

use crate::consumers::Consumers;
use crate::registry::{self, Entry};
pub use crate::shared::Shared;
use crate::{Ctx, Flow, LogInfo, Phase, PhaseMask, Plugin};

/// What plugins may consult while compiling: the snapshot's consumers, the node's plugin settings and the
/// long-lived [`Shared`] state.
pub struct CompileEnv<'a> {
    pub shared: &'a Shared,
    pub consumers: &'a [sluice_model::Consumer],
    /// `plugin_attr` from config.yaml (the one given to [`CompileEnv::new`], else [`Shared`]'s).
    pub plugin_attr: Option<&'a Map<String, Value>>,
    /// The consumers compiled once per snapshot (credential maps and consumer chains), built on first use.
    pub compiled: OnceLock<Result<Arc<Consumers>, String>>,
    /// Set while a consumer's own plugins compile: counters of consumer-level limits are per consumer, as
    /// APISIX's `route&consumer` conf ids make them.
    pub(crate) consumer_scope: std::sync::Mutex<Option<String>>,
    /// The snapshot's consumer groups (a consumer's `group_id` pulls in the group's plugins).
    pub consumer_groups: &'a [sluice_model::ConsumerGroup],
    /// The snapshot's plugin_metadata (node-wide settings a plugin reads when it compiles).
    pub plugin_metadata: &'a [sluice_model::PluginMetadata],
    /// The snapshot's consumer credentials (APISIX 3.11+): more auth objects for their consumers.
    pub credentials: &'a [sluice_model::Credential],
    /// The snapshot's proto resources (grpc-transcode), compiled on first use by [`CompileEnv::proto`].
    pub protos: &'a [sluice_model::Proto],
    compiled_protos: std::sync::Mutex<Vec<(String, Arc<sluice_grpc::ProtoSet>)>>,
}

impl<'a> CompileEnv<'a> {
    pub fn new(
        shared: &'a Shared,
        consumers: &'a [sluice_model::Consumer],
        plugin_attr: Option<&'a Map<String, Value>>,
    ) -> Self {
        CompileEnv {
            shared,
            consumers,
            plugin_attr: plugin_attr.or(shared.plugin_attr.as_ref()),
            compiled: OnceLock::new(),
            consumer_scope: std::sync::Mutex::new(None),
            consumer_groups: &[],
            plugin_metadata: &[],
            credentials: &[],
            protos: &[],
            compiled_protos: Default::default(),
        }
    }

    /// Adds the snapshot's proto resources.
    pub fn with_protos(mut self, protos: &'a [sluice_model::Proto]) -> Self {
        self.protos = protos;
        self
    }

    /// The proto resource `id`, compiled (once per snapshot). Its imports resolve against the other proto
    /// resources by `name`, as the Admin API's check does.
    pub fn proto(&self, id: &str) -> Result<Arc<sluice_grpc::ProtoSet>, String> {
        if let Some((_, p)) = self
            .compiled_protos
            .lock()
            .map_err(|_| "proto cache poisoned".to_owned())?
            .iter()
            .find(|(k, _)| k == id)
        {
            return Ok(p.clone());
        }
        let p = self
            .protos
            .iter()
            .find(|p| p.id.0 == id)
            .ok_or_else(|| format!("failed to fetch proto by id: {id}"))?;
        let name = p.name.clone().unwrap_or_else(|| id.to_owned());
        let resolver = |import: &str| {
            self.protos
                .iter()
                .find(|o| o.name.as_deref() == Some(import))
                .map(|o| o.content.clone())
        };
        let set = Arc::new(
            sluice_grpc::compile(&name, &p.content, resolver)
                .map_err(|e| format!("proto {id}: {}", e.0))?,
        );
        if let Ok(mut cache) = self.compiled_protos.lock() {
            cache.push((id.to_owned(), set.clone()));
        }
        Ok(set)
    }

    /// Adds the snapshot's consumer credentials (absent, only consumers' own auth objects identify them).
    pub fn with_credentials(mut self, credentials: &'a [sluice_model::Credential]) -> Self {
        self.credentials = credentials;
        self
    }

    /// Adds the snapshot's consumer groups and plugin_metadata (absent, a compile sees none).
    pub fn with_groups_and_metadata(
        mut self,
        groups: &'a [sluice_model::ConsumerGroup],
        metadata: &'a [sluice_model::PluginMetadata],
    ) -> Self {
        self.consumer_groups = groups;
        self.plugin_metadata = metadata;
        self
    }

    /// The plugin_metadata object of plugin `name`, if one is configured.
    pub fn metadata(&self, name: &str) -> Option<&'a serde_json::Map<String, Value>> {
        self.plugin_metadata
            .iter()
            .find(|m| m.id.0 == name)
            .map(|m| &m.conf)
    }

    /// The consumer whose plugins are being compiled, if any.
    pub(crate) fn consumer_scope(&self) -> Option<String> {
        self.consumer_scope.lock().ok().and_then(|g| g.clone())
    }

    fn set_consumer_scope(&self, name: Option<&str>) {
        if let Ok(mut g) = self.consumer_scope.lock() {
            *g = name.map(str::to_owned);
        }
    }

    /// Compiles a consumer's own (non-auth) plugins, merged over its consumer group's, under that consumer's
    /// counter scope.
    pub(crate) fn compile_consumer(
        &self,
        c: &sluice_model::Consumer,
    ) -> Result<Option<Arc<Chain>>, String> {
        let group = match &c.group_id {
            None => None,
            Some(id) => Some(
                self.consumer_groups
                    .iter()
                    .find(|g| g.id == *id)
                    .ok_or_else(|| format!("failed to fetch consumer group config by id: {id}"))?,
            ),
        };
        // APISIX's merge: the group's plugins, then the consumer's own over them (same name: the consumer's).
        let merged;
        let plugins = match group {
            Some(g) if !g.plugins.is_empty() => {
                let mut m = g.plugins.clone();
                m.extend(c.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
                merged = m;
                &merged
            }
            _ => &c.plugins,
        };
        self.set_consumer_scope(Some(&c.username));
        let r = Chain::compile_filtered(plugins, self, true);
        self.set_consumer_scope(None);
        r
    }

    /// The snapshot's compiled consumers (compiled on the first call).
    pub fn consumers_rt(&self) -> Result<Arc<Consumers>, String> {
        self.compiled
            .get_or_init(|| Consumers::compile(self).map(Arc::new))
            .clone()
    }
}

/// Plugins with APISIX's `run_policy = "prefer_route"`: see [`Chain::log_phase`].
const PREFER_ROUTE: &[&str] = &["prometheus"];

/// One plugin in a chain with its `_meta` applied.
struct Slot {
    plugin: Arc<dyn Plugin>,
    name: &'static str,
    priority: i32,
    /// `plugin.phases()`, read once at compile time (the chain walks ask per slot and phase on every request).
    phases: PhaseMask,
    /// `_meta.filter`: the plugin runs only for requests matching it.
    filter: Option<Expr>,
    /// `_meta.error_response`: replaces the body of any response this plugin answers with.
    error_response: Option<Bytes>,
}

impl Slot {
    fn applies(&self, ctx: &Ctx<'_>) -> bool {
        self.filter.as_ref().is_none_or(|f| f.eval(ctx))
    }
}

pub struct Chain {
    slots: Vec<Slot>,
    mask: PhaseMask,
    /// Some plugin reads the request body (see [`Plugin::needs_body`]).
    body: bool,
    id: u64,
    /// A logger's `include_resp_body` (+ `_expr`): the response body is kept for the log phase.
    pub(crate) capture: Option<crate::filters::Capture>,
}

/// One plugin in run order ([`Chain::run_order`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginOrder {
    pub name: &'static str,
    /// `_meta.priority` when set, else the plugin's own.
    pub priority: i32,
    /// From the consumer's chain (its own or its group's plugins).
    pub consumer: bool,
}

static CHAIN_IDS: AtomicU64 = AtomicU64::new(1);

impl Chain {
    /// Compiles a merged `plugins` object. `Ok(None)` when it is empty (or every plugin is `_meta.disable`d), so a
    /// route without plugins carries no chain at all.
    pub fn compile(
        plugins: &Map<String, Value>,
        env: &CompileEnv<'_>,
    ) -> Result<Option<Arc<Chain>>, String> {
        Self::compile_filtered(plugins, env, false)
    }

    /// `skip_auth`: leave out auth plugins (a consumer's `key-auth` object is its credential, not a plugin to run).
    pub(crate) fn compile_filtered(
        plugins: &Map<String, Value>,
        env: &CompileEnv<'_>,
        skip_auth: bool,
    ) -> Result<Option<Arc<Chain>>, String> {
        let mut slots: Vec<Slot> = Vec::with_capacity(plugins.len());
        let mut capture = None;
        for (name, conf) in plugins {
            let entry: &Entry =
                registry::find(name).ok_or_else(|| format!("unknown plugin [{name}]"))?;
            if skip_auth && entry.auth {
                continue;
            }
            let meta = conf.get("_meta");
            let bare = strip_meta(conf);
            (entry.check)(&bare).map_err(|e| {
                format!("failed to check the configuration of plugin {name} err: {e}")
            })?;
            let disabled = meta
                .and_then(|m| m.get("disable"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if disabled {
                continue;
            }
            let priority = match meta.and_then(|m| m.get("priority")) {
                None => entry.priority,
                Some(p) => p
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .ok_or_else(|| format!("plugin {name}: _meta.priority must be an integer"))?,
            };
            let filter = match meta.and_then(|m| m.get("filter")) {
                None => None,
                Some(f) => Some(
                    Expr::compile(f).map_err(|e| format!("plugin {name}: _meta.filter: {e}"))?,
                ),
            };
            let error_response = match meta.and_then(|m| m.get("error_response")) {
                None => None,
                Some(Value::String(s)) => Some(Bytes::from(s.clone())),
                Some(v) => Some(Bytes::from(v.to_string())),
            };
            let plugin = (entry.compile)(&bare, env).map_err(|e| format!("plugin {name}: {e}"))?;
            if capture.is_none() {
                capture = crate::filters::Capture::of(&bare)
                    .map_err(|e| format!("plugin {name}: {e}"))?;
            }
            slots.push(Slot {
                phases: plugin.phases(),
                plugin,
                name: entry.name,
                priority,
                filter,
                error_response,
            });
        }
        if slots.is_empty() {
            return Ok(None);
        }
        // Higher priority runs first, as in APISIX; a stable sort keeps ties in configuration order.
        slots.sort_by_key(|s| std::cmp::Reverse(s.priority));
        let mut mask = slots
            .iter()
            .fold(PhaseMask::default(), |m, s| m.union(s.phases));
        if capture.is_some() {
            // The body passes the filters (unchanged) so the log phase can have it.
            mask = mask.union(PhaseMask::of(&[Phase::BodyFilter]));
        }
        let body = slots.iter().any(|s| s.plugin.needs_body());
        Ok(Some(Arc::new(Chain {
            slots,
            mask,
            body,
            id: CHAIN_IDS.fetch_add(1, Ordering::Relaxed),
            capture,
        })))
    }

    pub fn mask(&self) -> PhaseMask {
        self.mask
    }

    /// Whether the proxy must read the request body before running this chain (a consumer's plugins do not
    /// count: the body is read before authentication).
    pub fn needs_body(&self) -> bool {
        self.body
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.slots.iter().map(|s| s.name)
    }

    /// The upstreams a plugin of this chain may pick (traffic-split's), for the proxy's compile; at most one
    /// plugin of a chain declares any, so the index a hook picks is an index into this list.
    pub fn upstreams(&self) -> &[crate::PluginUpstream] {
        self.slots
            .iter()
            .map(|s| s.plugin.upstreams())
            .find(|u| !u.is_empty())
            .unwrap_or(&[])
    }

    fn has(&self, name: &str) -> bool {
        self.slots.iter().any(|s| s.name == name)
    }

    /// Whether an auth plugin is in this chain (a consumer it identifies joins this chain's run).
    pub fn has_auth(&self) -> bool {
        self.slots
            .iter()
            .any(|s| registry::find(s.name).is_some_and(|e| e.auth))
    }

    /// The plugins of `chain` merged with `consumer`'s, in the order a request's access phase walks them (the
    /// walk `run_request` does: a consumer plugin replaces the chain's of the same name), for the Admin API's
    /// effective-chain view. `_meta.disable`d plugins are not in a chain, so not here either.
    pub fn run_order(chain: Option<&Chain>, consumer: Option<&Chain>) -> Vec<PluginOrder> {
        let route = chain.map_or(&[][..], |c| &c.slots[..]);
        let mut out = Vec::with_capacity(route.len());
        merged(route, consumer, |s| {
            let from_consumer =
                consumer.is_some_and(|c| c.slots.as_ptr_range().contains(&(s as *const Slot)));
            out.push(PluginOrder {
                name: s.name,
                priority: s.priority,
                consumer: from_consumer,
            });
            true
        });
        out
    }

    /// Runs rewrite, then access, then before_proxy over all plugins, stopping at the first response. A hook that
    /// asks for a delay ([`Ctx::add_delay`]) pauses the run: it returns `Flow::Continue` with [`Ctx::paused`]
    /// set, the proxy sleeps the delay, and the next call resumes after that hook (hook positions up to
    /// `ctx.resume` are skipped), so later plugins run after the wait, as after APISIX's `ngx.sleep` in a hook.
    ///
    /// A hook that starts IO ([`Ctx::await_io`]) pauses the run the same way; the proxy awaits the IO and hands its
    /// result back with [`Ctx::resume_with`], and this call applies it (as part of that hook: its answer ends the
    /// request phases, with the hook's `_meta.error_response`) before going on with the next hook.
    pub fn run_request(&self, ctx: &mut Ctx<'_>) -> Flow {
        let resume = std::mem::take(&mut ctx.resume);
        if let Some(apply) = ctx.io.resume.take() {
            let error_response = ctx.io.error_response.take();
            if let Flow::Respond(mut r) = apply(ctx) {
                if let Some(body) = error_response {
                    r.body = body;
                }
                tracing::debug!(
                    status = r.status,
                    "plugin exits with http status code after IO"
                );
                return Flow::Respond(r);
            }
            // The IO's result asked for a wait (limit-conn's delay once Redis counted the request): the proxy
            // sleeps it, then the run goes on after the same hook.
            if !ctx.delay.is_zero() {
                ctx.resume = resume;
                return Flow::Continue;
            }
        }
        let mut pos = 0u32;
        if self.mask.has(Phase::Rewrite) {
            for s in &self.slots {
                pos += 1;
                if pos <= resume || !s.phases.has(Phase::Rewrite) || !s.applies(ctx) {
                    continue;
                }
                if let Flow::Respond(r) = s.plugin.rewrite(ctx) {
                    return respond(s, r);
                }
                if pauses(s, ctx, pos) {
                    return Flow::Continue;
                }
            }
        }
        // APISIX merges the consumer's plugins after the rewrite phase and reruns rewrite for them.
        let consumer = if ctx.merged_by == self.id {
            ctx.consumer_chain.clone()
        } else if ctx.merged_by == 0 && ctx.consumer_chain.is_some() {
            ctx.merged_by = self.id;
            ctx.consumer_chain.clone()
        } else {
            None
        };
        if let Some(c) = &consumer {
            for s in &c.slots {
                pos += 1;
                if pos <= resume || !s.phases.has(Phase::Rewrite) || !s.applies(ctx) {
                    continue;
                }
                if let Flow::Respond(r) = s.plugin.rewrite(ctx) {
                    return respond(s, r);
                }
                if pauses(s, ctx, pos) {
                    return Flow::Continue;
                }
            }
        }
        let mask = consumer
            .as_ref()
            .map_or(self.mask, |c| self.mask.union(c.mask));
        for (phase, call) in [
            (
                Phase::Access,
                <dyn Plugin>::access as fn(&dyn Plugin, &mut Ctx<'_>) -> Flow,
            ),
            (Phase::BeforeProxy, <dyn Plugin>::before_proxy),
        ] {
            if !mask.has(phase) {
                continue;
            }
            let mut out = None;
            merged(&self.slots, consumer.as_deref(), |s| {
                pos += 1;
                if pos <= resume || !s.phases.has(phase) || !s.applies(ctx) {
                    return true;
                }
                if let Flow::Respond(r) = call(s.plugin.as_ref(), ctx) {
                    out = Some(respond(s, r));
                    return false;
                }
                if pauses(s, ctx, pos) {
                    out = Some(Flow::Continue);
                    return false;
                }
                true
            });
            if let Some(f) = out {
                return f;
            }
        }
        Flow::Continue
    }

    fn consumer_for(&self, ctx: &Ctx<'_>) -> Option<Arc<Chain>> {
        (ctx.merged_by == self.id)
            .then(|| ctx.consumer_chain.clone())
            .flatten()
    }

    /// The consumer chain merged into this one for `ctx`, when the merged chains implement `phase` at all.
    fn with_phase(&self, ctx: &Ctx<'_>, phase: Phase) -> Option<Option<Arc<Chain>>> {
        let consumer = self.consumer_for(ctx);
        let mask = consumer
            .as_ref()
            .map_or(self.mask, |c| self.mask.union(c.mask));
        mask.has(phase).then_some(consumer)
    }

    /// Calls `f` for each plugin (route merged with consumer) that implements the response-side `phase` and whose
    /// `_meta.filter` matches.
    fn each_in<'a>(
        &self,
        ctx: &mut Ctx<'a>,
        phase: Phase,
        mut f: impl FnMut(&dyn Plugin, &mut Ctx<'a>),
    ) {
        let Some(consumer) = self.with_phase(ctx, phase) else {
            return;
        };
        merged(&self.slots, consumer.as_deref(), |s| {
            if s.phases.has(phase) && s.applies(ctx) {
                f(s.plugin.as_ref(), ctx);
            }
            true
        });
    }

    pub fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        self.each_in(ctx, Phase::HeaderFilter, |p, ctx| {
            p.header_filter(ctx, status)
        });
    }

    /// Whether a body_filter plugin of this chain wants this response's body (see [`Plugin::filters_body`]).
    pub fn filters_body(&self, ctx: &Ctx<'_>) -> bool {
        // A logger's capture (`include_resp_body`) needs the body whatever the plugins answer.
        self.mask.has(Phase::BodyFilter)
            && (self.capture.is_some()
                || self
                    .slots
                    .iter()
                    .any(|s| s.phases.has(Phase::BodyFilter) && s.plugin.filters_body(ctx)))
    }

    /// Runs body_filter over one piece of the response body (see [`crate::filters::body_filters`]).
    pub fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut crate::BodyChunk) {
        self.each_in(ctx, Phase::BodyFilter, |p, ctx| p.body_filter(ctx, chunk));
    }

    pub fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        self.log_unless(ctx, info, |_| false);
    }

    fn log_unless(&self, ctx: &Ctx<'_>, info: &LogInfo, skip: impl Fn(&str) -> bool) {
        let Some(consumer) = self.with_phase(ctx, Phase::Log) else {
            return;
        };
        merged(&self.slots, consumer.as_deref(), |s| {
            if s.phases.has(Phase::Log) && s.applies(ctx) && !skip(s.name) {
                s.plugin.log(ctx, info);
            }
            true
        });
    }

    /// The log phase of a request's chains, global rules first. A plugin APISIX marks `run_policy =
    /// "prefer_route"` (prometheus) runs once: a global rule's instance is skipped when the route's chain (route,
    /// service and plugin_config merged) has the plugin too.
    pub fn log_phase(chains: &[Option<&Chain>; 2], ctx: &Ctx<'_>, info: &LogInfo) {
        let [global, route] = *chains;
        if let Some(g) = global {
            match route {
                Some(r) if PREFER_ROUTE.iter().any(|n| r.has(n)) => {
                    g.log_unless(ctx, info, |name| {
                        PREFER_ROUTE.contains(&name) && r.has(name)
                    })
                }
                _ => g.log(ctx, info),
            }
        }
        if let Some(r) = route {
            r.log(ctx, info);
        }
    }
}

/// Whether the hook just run asked the proxy to wait (a delay or IO): the run stops after position `pos`.
fn pauses(s: &Slot, ctx: &mut Ctx<'_>, pos: u32) -> bool {
    if ctx.has_effect() {
        ctx.io.error_response = s.error_response.clone();
    } else if ctx.delay.is_zero() {
        return false;
    }
    ctx.resume = pos;
    true
}

/// Applies `_meta.error_response` to a plugin's own response.
fn respond(s: &Slot, mut r: crate::Response) -> Flow {
    tracing::debug!(
        plugin = s.name,
        status = r.status,
        "plugin exits with http status code"
    );
    if let Some(body) = &s.error_response {
        r.body = body.clone();
    }
    Flow::Respond(r)
}

/// Walks `route` and `consumer` slots in priority order; a consumer plugin replaces the route's of the same name.
/// `f` returns false to stop.
fn merged(route: &[Slot], consumer: Option<&Chain>, mut f: impl FnMut(&Slot) -> bool) {
    let Some(c) = consumer else {
        for s in route {
            if !f(s) {
                return;
            }
        }
        return;
    };
    let (mut i, mut j) = (0, 0);
    let cs = &c.slots;
    while i < route.len() || j < cs.len() {
        let take_route = match (route.get(i), cs.get(j)) {
            (Some(r), Some(k)) => r.priority >= k.priority,
            (Some(_), None) => true,
            _ => false,
        };
        let s = if take_route {
            i += 1;
            let s = &route[i - 1];
            if c.has(s.name) {
                continue;
            }
            s
        } else {
            j += 1;
            &cs[j - 1]
        };
        if !f(s) {
            return;
        }
    }
}

/// The configuration without `_meta`, which plugin schemas (with `additionalProperties: false`) do not list.
fn strip_meta(conf: &Value) -> Value {
    match conf {
        Value::Object(m) if m.contains_key("_meta") => {
            let mut m = m.clone();
            m.remove("_meta");
            Value::Object(m)
        }
        other => other.clone(),
    }
}
