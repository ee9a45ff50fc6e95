//! A module as a Sluice plugin: the registry entry ([`External`]), the per-route plugin ([`WasmPlugin`]), the
//! per-worker instance pool and the per-request HTTP context ([`Lease`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use sluice_plugins::{
    BodyChunk, CompileEnv, Ctx, Flow, LogInfo, Phase, PhaseMask, Plugin, Response, Resume,
};
use wasmtime::{Store, StoreLimitsBuilder, TypedFunc};

use crate::abi::Host;
use crate::Module;

/// The root context id every instance uses (one plugin configuration per instance).
const ROOT: i32 = 1;
/// Idle instances kept per worker and compiled plugin.
const IDLE_CAP: usize = 64;

type F1 = TypedFunc<i32, i32>;
type F2 = TypedFunc<(i32, i32), i32>;
type F3 = TypedFunc<(i32, i32, i32), i32>;
type F5 = TypedFunc<(i32, i32, i32, i32, i32), ()>;

/// The exports the host calls; the optional ones are skipped when absent.
struct Fns {
    on_context_create: TypedFunc<(i32, i32), ()>,
    on_configure: Option<F2>,
    on_request_headers: Option<F3>,
    on_request_body: Option<F3>,
    on_response_headers: Option<F3>,
    on_response_body: Option<F3>,
    on_http_call_response: Option<F5>,
    on_done: Option<F1>,
    on_log: Option<TypedFunc<i32, ()>>,
    on_delete: Option<TypedFunc<i32, ()>>,
}

/// One instance with its root context configured.
pub(crate) struct Vm {
    store: Store<Host>,
    f: Fns,
    ticks: u64,
    next_id: i32,
}

fn err(e: wasmtime::Error) -> String {
    format!("{e:#}")
}

impl Vm {
    /// Instantiates `m`, starts it and (with `configure`) hands its root context `config`.
    pub(crate) fn new(m: &Module, config: Bytes, configure: bool) -> Result<Vm, String> {
        m.created.fetch_add(1, Ordering::Relaxed);
        let limits = StoreLimitsBuilder::new()
            .memory_size(m.memory_limit)
            .instances(1)
            .build();
        let mut store = Store::new(m.pre.module().engine(), Host::new(m.name, limits, config));
        store.limiter(|h| &mut h.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(m.ticks);
        let inst = m.pre.instantiate(&mut store).map_err(err)?;
        let memory = inst.get_memory(&mut store, "memory");
        let malloc = inst
            .get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            .or_else(|_| inst.get_typed_func::<i32, i32>(&mut store, "malloc"))
            .ok();
        store.data_mut().memory = memory;
        store.data_mut().malloc = malloc;
        store.data_mut().body_cap = m.max_body_size;
        // A reactor's initialiser, else a command's entry point (TinyGo and Go modules have one of them).
        if let Ok(init) = inst.get_typed_func::<(), ()>(&mut store, "_initialize") {
            init.call(&mut store, ()).map_err(err)?;
        } else if let Ok(start) = inst.get_typed_func::<(), ()>(&mut store, "_start") {
            start.call(&mut store, ()).map_err(err)?;
        }
        macro_rules! opt {
            ($n:literal) => {
                inst.get_typed_func(&mut store, $n).ok()
            };
        }
        let f = Fns {
            on_context_create: inst
                .get_typed_func(&mut store, "proxy_on_context_create")
                .map_err(|e| format!("proxy_on_context_create: {e:#}"))?,
            on_configure: opt!("proxy_on_configure"),
            on_request_headers: opt!("proxy_on_request_headers"),
            on_request_body: opt!("proxy_on_request_body"),
            on_response_headers: opt!("proxy_on_response_headers"),
            on_response_body: opt!("proxy_on_response_body"),
            on_http_call_response: opt!("proxy_on_http_call_response"),
            on_done: opt!("proxy_on_done"),
            on_log: opt!("proxy_on_log"),
            on_delete: opt!("proxy_on_delete"),
        };
        let on_vm_start: Option<F2> = opt!("proxy_on_vm_start");
        let mut vm = Vm {
            store,
            f,
            ticks: m.ticks,
            next_id: ROOT + 1,
        };
        let create = vm.f.on_context_create.clone();
        vm.call(|s| create.call(s, (ROOT, 0)))?;
        if let Some(start) = on_vm_start {
            if vm.call(|s| start.call(s, (ROOT, 0)))? == 0 {
                return Err("proxy_on_vm_start returned false".into());
            }
        }
        if configure {
            let n = vm.store.data().config.len() as i32;
            if let Some(c) = vm.f.on_configure.clone() {
                if vm.call(|s| c.call(s, (ROOT, n)))? == 0 {
                    return Err(
                        "the filter refused its configuration (proxy_on_configure returned false)"
                            .into(),
                    );
                }
            }
        }
        Ok(vm)
    }

    /// One call into the filter, within the time limit.
    fn call<R>(
        &mut self,
        f: impl FnOnce(&mut Store<Host>) -> wasmtime::Result<R>,
    ) -> Result<R, String> {
        self.store.set_epoch_deadline(self.ticks);
        f(&mut self.store).map_err(err)
    }
}

/// A compiled plugin configuration: one per route (or global rule, service, consumer) using the module.
pub(crate) struct Compiled {
    id: u64,
    module: Arc<Module>,
    conf: Bytes,
}

static COMPILED_IDS: AtomicU64 = AtomicU64::new(1);

/// This worker's idle instances, per compiled plugin.
struct Slot {
    id: u64,
    owner: Weak<Compiled>,
    idle: Vec<Vm>,
}

thread_local! {
    static POOL: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

fn checkout(c: &Arc<Compiled>) -> Result<Vm, String> {
    let reused = POOL.with(|p| {
        let mut p = p.borrow_mut();
        p.iter_mut()
            .find(|s| s.id == c.id)
            .and_then(|s| s.idle.pop())
    });
    match reused {
        Some(vm) => Ok(vm),
        None => Vm::new(&c.module, c.conf.clone(), true),
    }
}

fn checkin(c: &Arc<Compiled>, vm: Vm) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if let Some(s) = p.iter_mut().find(|s| s.id == c.id) {
            if s.idle.len() < IDLE_CAP {
                s.idle.push(vm);
            }
            return;
        }
        // A plugin new to this worker: drop the pools of plugins no configuration holds any more.
        p.retain(|s| s.owner.strong_count() > 0);
        p.push(Slot {
            id: c.id,
            owner: Arc::downgrade(c),
            idle: vec![vm],
        });
    });
}

/// The instance one request uses, with its HTTP context; back to the pool when dropped (unless it trapped).
pub(crate) struct Lease {
    vm: Option<Vm>,
    plugin: Arc<Compiled>,
    id: i32,
    done: bool,
    /// What happens to this response's body.
    resp: RespBody,
    /// Response body the filter let through (`Continue`) while the head is held: sent at the end of the body.
    released: BytesMut,
}

/// What a wasm filter does with the response body.
enum RespBody {
    /// Nothing: the body streams past the filter.
    Stream,
    /// The filter asked for it (`wasm_process_resp_body` and `proxy_on_response_body`): it is buffered,
    /// handed to the filter piece by piece, and sent whole at its end with the head.
    Buffer,
    /// A local answer from the response headers phase: this body replaces the upstream's.
    Local(Bytes),
}

impl Lease {
    fn new(plugin: &Arc<Compiled>) -> Result<Lease, String> {
        let mut vm = checkout(plugin)?;
        let id = vm.next_id;
        vm.next_id = if vm.next_id == i32::MAX {
            ROOT + 1
        } else {
            vm.next_id + 1
        };
        let create = vm.f.on_context_create.clone();
        vm.call(|s| create.call(s, (id, ROOT)))?;
        let h = vm.store.data_mut();
        h.want_req_body = false;
        h.want_resp_body = false;
        h.local = None;
        h.call = None;
        h.req.clear();
        h.resp.clear();
        // A pooled instance does not keep a large body's buffer.
        if h.body.capacity() > 64 << 10 {
            h.body = BytesMut::new();
        }
        h.body.clear();
        h.body_over = None;
        Ok(Lease {
            vm: Some(vm),
            plugin: plugin.clone(),
            id,
            done: false,
            resp: RespBody::Stream,
            released: BytesMut::new(),
        })
    }

    fn vm(&mut self) -> &mut Vm {
        match self.vm.as_mut() {
            Some(v) => v,
            None => unreachable!("a lease holds its instance until dropped"),
        }
    }

    /// A failed call: the instance is not reused.
    fn poison(&mut self, what: &str, e: &str) {
        tracing::error!(
            plugin = self.plugin.module.name,
            "wasm filter failed in {what}: {e}"
        );
        self.vm = None;
        self.done = true;
    }

    /// `proxy_on_done`, `proxy_on_log` (with `log`), `proxy_on_delete`.
    fn finish(&mut self, log: bool) {
        if self.done || self.vm.is_none() {
            return;
        }
        self.done = true;
        let id = self.id;
        let vm = self.vm();
        let f = (
            vm.f.on_done.clone(),
            vm.f.on_log.clone(),
            vm.f.on_delete.clone(),
        );
        let mut r = Ok(());
        if let Some(d) = f.0 {
            r = vm.call(|s| d.call(s, id)).map(drop);
        }
        if let (Ok(()), true, Some(l)) = (&r, log, f.1) {
            r = vm.call(|s| l.call(s, id));
        }
        if let (Ok(()), Some(d)) = (&r, f.2) {
            r = vm.call(|s| d.call(s, id));
        }
        if let Err(e) = r {
            self.poison("proxy_on_done/log/delete", &e);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.finish(false);
        if let Some(vm) = self.vm.take() {
            checkin(&self.plugin, vm);
        }
    }
}

/// The per-request slot in the context (`Ctx::body_state`, keyed by the plugin).
type State = RefCell<Option<Lease>>;

/// The registry entry of one module.
pub(crate) struct External(pub(crate) Arc<Module>);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "conf": {"oneOf": [
                {"type": "object", "minProperties": 1},
                {"type": "string", "minLength": 1}
            ]}
        },
        "required": ["conf"]
    })
}

/// The bytes `proxy_on_configure` reads: a string as is, an object as JSON (APISIX's `core.json.encode`).
fn conf_bytes(conf: &Value) -> Result<Bytes, String> {
    match conf.get("conf") {
        None => Err("property \"conf\" is required".into()),
        Some(Value::String(s)) if !s.is_empty() => Ok(Bytes::from(s.clone())),
        Some(Value::Object(o)) if !o.is_empty() => Ok(Bytes::from(Value::Object(o.clone()).to_string())),
        Some(_) => Err(
            "property \"conf\" validation failed: value should match only one schema, but matches none".into(),
        ),
    }
}

impl sluice_plugins::registry::External for External {
    fn name(&self) -> &'static str {
        self.0.name
    }
    fn priority(&self) -> i32 {
        self.0.priority
    }
    fn schema(&self) -> Value {
        schema()
    }
    fn check(&self, conf: &Value) -> Result<(), String> {
        let bytes = conf_bytes(conf)?;
        // The filter itself judges the configuration: a fresh instance runs proxy_on_configure with it.
        Vm::new(&self.0, bytes, true).map(drop)
    }
    fn compile(&self, conf: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
        Ok(Arc::new(WasmPlugin(Arc::new(Compiled {
            id: COMPILED_IDS.fetch_add(1, Ordering::Relaxed),
            module: self.0.clone(),
            conf: conf_bytes(conf)?,
        }))))
    }
}

impl crate::ModuleInfo for External {
    fn name(&self) -> &'static str {
        self.0.name
    }
    fn instances_created(&self) -> u64 {
        self.0.created.load(Ordering::Relaxed)
    }
    fn as_external(self: Arc<Self>) -> Box<dyn sluice_plugins::registry::External> {
        Box::new(External(self.0.clone()))
    }
}

/// A module configured on one route.
pub(crate) struct WasmPlugin(Arc<Compiled>);

fn failed() -> Flow {
    Flow::Respond(Response::status(500))
}

impl WasmPlugin {
    fn key(&self) -> *const () {
        self as *const Self as *const ()
    }

    /// The request's lease, created on first use (taken out of the context while the filter runs).
    fn take(&self, ctx: &mut Ctx<'_>) -> Result<Lease, String> {
        match ctx.body_state::<State>(self.key()).get_mut().take() {
            Some(l) => Ok(l),
            None => Lease::new(&self.0),
        }
    }

    fn put(&self, ctx: &mut Ctx<'_>, lease: Lease) {
        *ctx.body_state::<State>(self.key()).get_mut() = Some(lease);
    }

    fn request(&self, ctx: &mut Ctx<'_>) -> Flow {
        let mut lease = match self.take(ctx) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(
                    plugin = self.0.module.name,
                    "wasm filter failed to start: {e}"
                );
                return failed();
            }
        };
        load_request(lease.vm().store.data_mut(), ctx);
        let (id, eos) = (lease.id, i32::from(no_body(ctx)));
        let n = lease.vm().store.data().req.len() as i32;
        if let Some(f) = lease.vm().f.on_request_headers.clone() {
            if let Err(e) = lease.vm().call(|s| f.call(s, (id, n, eos))) {
                lease.poison("proxy_on_request_headers", &e);
                return failed();
            }
        }
        let flow = self.after_request_call(ctx, &mut lease);
        if matches!(flow, Flow::Continue) && lease.vm.is_some() {
            let h = lease.vm().store.data_mut();
            if h.want_req_body && h.call.is_none() {
                if let (Some(body), Some(f)) = (ctx.body, lease.vm().f.on_request_body.clone()) {
                    let h = lease.vm().store.data_mut();
                    h.body.clear();
                    h.body.extend_from_slice(body);
                    h.body_changed = false;
                    let n = body.len() as i32;
                    if let Err(e) = lease.vm().call(|s| f.call(s, (id, n, 1))) {
                        lease.poison("proxy_on_request_body", &e);
                        return failed();
                    }
                    let h = lease.vm().store.data_mut();
                    if let Some(n) = h.body_over.take() {
                        tracing::error!(
                            plugin = self.0.module.name,
                            "wasm filter set a request body of {n} bytes, over max_body_size ({})",
                            h.body_cap
                        );
                        return failed();
                    }
                    if h.body_changed {
                        ctx.replace_body(h.body.split().freeze());
                    }
                    let flow = self.after_request_call(ctx, &mut lease);
                    self.put(ctx, lease);
                    return flow;
                }
            }
        }
        self.put(ctx, lease);
        flow
    }

    /// After a request-side call: a local answer, the header edits, an HTTP call to await.
    fn after_request_call(&self, ctx: &mut Ctx<'_>, lease: &mut Lease) -> Flow {
        let h = lease.vm().store.data_mut();
        if let Some(l) = h.local.take() {
            h.call = None;
            return Flow::Respond(Response {
                status: l.status,
                headers: l.headers,
                body: l.body,
            });
        }
        if h.req.changed() {
            h.req.apply_request(&mut ctx.edits);
        }
        if let Some(call) = h.call.take() {
            let key = self.key() as usize;
            let budget = call.timeout + Duration::from_secs(1);
            ctx.await_io(
                async move {
                    let io = sluice_plugins::http_call::call(
                        &call.uri,
                        &call.method,
                        &call.headers,
                        &call.body,
                    );
                    let answer = match tokio::time::timeout(call.timeout, io).await {
                        Ok(r) => r,
                        Err(_) => Err("timeout".to_owned()),
                    };
                    let token = call.token;
                    Box::new(move |ctx: &mut Ctx<'_>| resume(ctx, key, token, answer)) as Resume
                },
                budget,
                Response::status(504),
            );
        }
        Flow::Continue
    }
}

/// Hands an HTTP call's answer to the filter (`proxy_on_http_call_response`, on the root context as Envoy does).
fn resume(
    ctx: &mut Ctx<'_>,
    key: usize,
    token: u32,
    answer: Result<sluice_plugins::http_call::CallAnswer, String>,
) -> Flow {
    let Some(mut lease) = ctx.body_state::<State>(key as *const ()).get_mut().take() else {
        return failed();
    };
    let name = lease.plugin.module.name;
    let (nh, nb) = {
        let h = lease.vm().store.data_mut();
        h.call_headers.clear();
        match &answer {
            Ok(a) => {
                h.call_headers
                    .load(b":status", a.status.to_string().as_bytes());
                for (n, v) in &a.headers {
                    h.call_headers.load(n, v);
                }
                h.call_body = a.body.clone();
                (h.call_headers.len() as i32, a.body.len() as i32)
            }
            Err(e) => {
                tracing::warn!(plugin = name, "wasm filter's http call failed: {e}");
                h.call_body = Bytes::new();
                (0, 0)
            }
        }
    };
    if let Some(f) = lease.vm().f.on_http_call_response.clone() {
        if let Err(e) = lease
            .vm()
            .call(|s| f.call(s, (ROOT, token as i32, nh, nb, 0)))
        {
            lease.poison("proxy_on_http_call_response", &e);
            return failed();
        }
    }
    let h = lease.vm().store.data_mut();
    let flow = if let Some(l) = h.local.take() {
        Flow::Respond(Response {
            status: l.status,
            headers: l.headers,
            body: l.body,
        })
    } else {
        if h.req.changed() {
            h.req.apply_request(&mut ctx.edits);
        }
        Flow::Continue
    };
    if h.call.take().is_some() {
        tracing::warn!(
            plugin = name,
            "wasm filter: a second http call in one request phase is not supported"
        );
    }
    *ctx.body_state::<State>(key as *const ()).get_mut() = Some(lease);
    flow
}

impl WasmPlugin {
    /// One piece of a response body the filter asked for: added to what it holds, handed to
    /// `proxy_on_response_body`; `Continue` lets what it holds go (the next call sees only new data), any other
    /// answer keeps buffering (Envoy's StopIterationAndBuffer). The head is held, so at the end of the body the
    /// whole body goes out with a Content-Length, and a local answer or a failure can still replace the response.
    fn buffer_body(&self, ctx: &mut Ctx<'_>, lease: &mut Lease, chunk: &mut BodyChunk) {
        let name = self.0.module.name;
        let id = lease.id;
        let eos = chunk.eof;
        let data = std::mem::take(&mut chunk.data);
        let cap = self.0.module.max_body_size;
        let held = lease.released.len() + lease.vm().store.data().body.len();
        if held + data.len() > cap {
            tracing::error!(
                plugin = name,
                "wasm filter: the response body is over max_body_size ({cap} bytes); answering 500"
            );
            return too_large(ctx, lease, chunk, name);
        }
        let Some(f) = lease.vm().f.on_response_body.clone() else {
            lease.released.extend_from_slice(&data);
            return;
        };
        let h = lease.vm().store.data_mut();
        h.body.extend_from_slice(&data);
        let n = h.body.len() as i32;
        let r = lease.vm().call(|s| f.call(s, (id, n, i32::from(eos))));
        let action = match r {
            Ok(a) => a,
            Err(e) => {
                lease.poison("proxy_on_response_body", &e);
                lease.resp = RespBody::Stream;
                replace_response(ctx, 500, Vec::new());
                chunk.data = Bytes::new();
                chunk.eof = true;
                return;
            }
        };
        let Some(vm) = lease.vm.as_mut() else {
            return;
        };
        let h = vm.store.data_mut();
        if let Some(l) = h.local.take() {
            h.resp.clear();
            replace_response(ctx, l.status, l.headers);
            lease.resp = RespBody::Stream;
            lease.released.clear();
            h.body.clear();
            chunk.data = l.body;
            chunk.eof = true;
            return;
        }
        if let Some(n) = h.body_over.take() {
            tracing::error!(
                plugin = name,
                "wasm filter set a response body of {n} bytes, over max_body_size ({cap}); answering 500"
            );
            return too_large(ctx, lease, chunk, name);
        }
        if h.resp.changed() {
            h.resp.apply_response(&mut ctx.resp);
        }
        if h.body_changed {
            h.body_changed = false;
            ctx.resp.clear_header_as_body_modified();
        }
        if action == 0 || eos {
            let pending = h.body.split();
            if lease.released.is_empty() {
                lease.released = pending;
            } else {
                lease.released.unsplit(pending);
            }
        }
        if eos {
            chunk.data = lease.released.split().freeze();
            lease.resp = RespBody::Stream;
        }
    }
}

/// The response is over the filter's `max_body_size`: a 500 replaces it, and the rest of the upstream's body is
/// not read.
fn too_large(ctx: &mut Ctx<'_>, lease: &mut Lease, chunk: &mut BodyChunk, name: &str) {
    lease.resp = RespBody::Stream;
    lease.released = BytesMut::new();
    if let Some(vm) = lease.vm.as_mut() {
        vm.store.data_mut().body = BytesMut::new();
    }
    replace_response(
        ctx,
        500,
        vec![(
            Bytes::from_static(b"content-type"),
            Bytes::from_static(b"application/json"),
        )],
    );
    chunk.data = Bytes::from(format!(
        "{{\"error_msg\":\"response body too large for wasm plugin {name}\"}}\n"
    ));
    chunk.eof = true;
}

/// Replaces the response the client will get: this status and these headers only (the upstream's and the earlier
/// plugins' are dropped; framing headers are the proxy's).
fn replace_response(ctx: &mut Ctx<'_>, status: u16, headers: Vec<(Bytes, Bytes)>) {
    let names: Vec<String> = ctx
        .response_headers()
        .filter_map(|(n, _)| std::str::from_utf8(n).ok().map(str::to_owned))
        .collect();
    for n in &names {
        ctx.resp.remove(n);
    }
    ctx.resp.status = Some(status);
    ctx.resp.body_modified = true;
    for (n, v) in headers {
        if n.eq_ignore_ascii_case(b"content-length") || n.eq_ignore_ascii_case(b"transfer-encoding")
        {
            continue;
        }
        ctx.resp.add_headers.push((n, v));
    }
}

/// Whether the response has no body to filter: a HEAD request, a status without a body, an empty body.
fn no_response_body(ctx: &Ctx<'_>, status: u16) -> bool {
    ctx.req.head.method_str() == "HEAD"
        || status < 200
        || status == 204
        || status == 304
        || ctx
            .upstream_head()
            .and_then(|h| h.header("content-length"))
            .is_some_and(|v| v == b"0")
}

fn no_body(ctx: &Ctx<'_>) -> bool {
    let h = ctx.req.head;
    h.header("transfer-encoding").is_none() && h.header("content-length").is_none_or(|v| v == b"0")
}

/// Copies the request as the filter sees it (pseudo-headers first, then the headers with earlier plugins' edits)
/// and the facts properties are answered from.
fn load_request(h: &mut Host, ctx: &Ctx<'_>) {
    let head = ctx.req.head;
    let e = &ctx.edits;
    h.req.clear();
    let authority = e
        .host
        .as_deref()
        .or_else(|| head.header("host"))
        .unwrap_or(b"");
    h.req.load(b":authority", authority);
    h.req.load(
        b":path",
        e.uri.as_deref().unwrap_or(head.target_str().as_bytes()),
    );
    h.req.load(
        b":method",
        e.method.as_deref().unwrap_or(head.method_str().as_bytes()),
    );
    h.req.load(b":scheme", ctx.req.scheme.as_bytes());
    for (n, v) in head.headers_iter() {
        if !e.drops(n) {
            h.req.load(n, v);
        }
    }
    for (n, v) in &e.set_headers {
        h.req.load(n, v);
    }
    let f = &mut h.facts;
    f.peer = Some(std::net::SocketAddr::new(
        ctx.remote_ip(),
        ctx.req.peer.port(),
    ));
    f.local = Some(ctx.req.local);
    f.route_id.clear();
    f.route_id.push_str(ctx.route_id);
    f.service_id.clear();
    f.service_id.push_str(ctx.service_id().unwrap_or(""));
    f.consumer.clear();
    f.consumer.push_str(ctx.consumer_name().unwrap_or(""));
    f.status = 0;
}

impl Plugin for WasmPlugin {
    fn name(&self) -> &'static str {
        self.0.module.name
    }
    fn priority(&self) -> i32 {
        self.0.module.priority
    }
    fn phases(&self) -> PhaseMask {
        let req = if self.0.module.rewrite {
            Phase::Rewrite
        } else {
            Phase::Access
        };
        // BodyFilter: a filter may ask for the body, or answer locally, in its response headers phase; when it
        // does neither the body streams past it ([`Plugin::filters_body`]).
        PhaseMask::of(&[req, Phase::HeaderFilter, Phase::BodyFilter, Phase::Log])
    }
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        if self.0.module.rewrite {
            self.request(ctx)
        } else {
            Flow::Continue
        }
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        if self.0.module.rewrite {
            Flow::Continue
        } else {
            self.request(ctx)
        }
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        let mut lease = match self.take(ctx) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(
                    plugin = self.0.module.name,
                    "wasm filter failed to start: {e}"
                );
                ctx.resp.status = Some(500);
                return;
            }
        };
        {
            let h = lease.vm().store.data_mut();
            if h.req.len() == 0 {
                // The request phase did not run (an earlier plugin answered).
                load_request(h, ctx);
            }
            h.resp.clear();
            let mut buf = itoa(status);
            h.resp.load(b":status", buf.as_mut());
            for (n, v) in ctx.response_headers() {
                h.resp.load(n, v);
            }
            h.facts.status = status;
        }
        let id = lease.id;
        let eos = i32::from(no_response_body(ctx, status));
        let n = lease.vm().store.data().resp.len() as i32;
        if let Some(f) = lease.vm().f.on_response_headers.clone() {
            if let Err(e) = lease.vm().call(|s| f.call(s, (id, n, eos))) {
                lease.poison("proxy_on_response_headers", &e);
                ctx.resp.status = Some(500);
                return;
            }
        }
        let Some(vm) = lease.vm.as_mut() else {
            return;
        };
        let h = vm.store.data_mut();
        if let Some(l) = h.local.take() {
            // As Envoy: a local answer from the response phase replaces the upstream's (status, headers, body).
            h.resp.clear();
            replace_response(ctx, l.status, l.headers);
            lease.resp = RespBody::Local(l.body);
            ctx.resp.hold_head = true;
        } else {
            if h.resp.changed() {
                h.resp.apply_response(&mut ctx.resp);
            }
            if h.want_resp_body && self.0.module.response_body && eos == 0 {
                lease.resp = RespBody::Buffer;
                ctx.resp.hold_head = true;
            }
        }
        self.put(ctx, lease);
    }
    fn filters_body(&self, ctx: &Ctx<'_>) -> bool {
        ctx.body_state_ref::<State>(self.key())
            .and_then(|c| c.try_borrow().ok())
            .is_some_and(|l| {
                l.as_ref()
                    .is_some_and(|l| !matches!(l.resp, RespBody::Stream))
            })
    }
    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        let Some(mut lease) = ctx.body_state::<State>(self.key()).get_mut().take() else {
            return;
        };
        match std::mem::replace(&mut lease.resp, RespBody::Stream) {
            RespBody::Stream => {}
            RespBody::Local(body) => {
                chunk.data = body;
                chunk.eof = true;
            }
            RespBody::Buffer => {
                lease.resp = RespBody::Buffer;
                self.buffer_body(ctx, &mut lease, chunk);
            }
        }
        self.put(ctx, lease);
    }
    fn log(&self, ctx: &Ctx<'_>, _info: &LogInfo) {
        if let Some(cell) = ctx.body_state_ref::<State>(self.key()) {
            if let Ok(mut g) = cell.try_borrow_mut() {
                if let Some(l) = g.as_mut() {
                    l.finish(true);
                }
            }
        }
    }
}

fn itoa(n: u16) -> [u8; 3] {
    let n = n.min(999);
    [
        b'0' + (n / 100) as u8,
        b'0' + (n / 10 % 10) as u8,
        b'0' + (n % 10) as u8,
    ]
}
