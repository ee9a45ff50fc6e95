//! The plugin runtime and the plugins, with APISIX's names, priorities, schemas and phases.
//!
//! A plugin is one file (`src/<name>.rs`) holding its `NAME`, `PRIORITY`, schema, `check` and `compile`, plus one
//! line in [`registry::REGISTRY`]. Compiling a route's merged `plugins` object yields a [`Chain`]: the plugins sorted
//! by priority with a bitmask of the phases any of them implements, built once per configuration snapshot. The proxy
//! runs a chain's phases per request; a route without plugins has no chain and pays nothing.
//!
//! Contract (see docs/architecture.md, "Plugin phases"): `rewrite` and `access` may answer the request themselves
//! ([`Flow::Respond`]); once one does, later plugins' request phases are skipped but `header_filter` and `log` still
//! run, as in APISIX. `header_filter` may add, set or remove response headers. `log` runs after the response is sent
//! and must not block. Only the runner writes responses.

mod chain;
pub mod consumers;
mod counters;
mod ctx;
mod ctx_view;
pub mod effect;
mod filters;
pub mod registry;
mod shared;
mod trace;
mod util;

mod api_breaker;
mod basic_auth;
pub mod batch_processor;
mod body_transformer;
mod brotli;
mod clickhouse_logger;
mod consumer_restriction;
mod cors;
mod csrf;
mod dubbo_proxy;
mod echo;
mod elasticsearch_logger;
mod fault_injection;
mod file_logger;
mod forward_auth;
mod grpc_transcode;
mod grpc_web;
mod gzip;
pub mod hmac_auth;
pub mod http_call;
mod http_dubbo;
mod http_logger;
mod ip_restriction;
pub mod jwt_auth;
mod kafka_logger;
mod key_auth;
mod limit_conn;
mod limit_count;
mod limit_req;
mod log_entry;
mod loki_logger;
mod mocking;
mod openid_connect;
mod opentelemetry;
pub mod prometheus;
mod proxy_cache;
mod proxy_mirror;
mod proxy_rewrite;
mod public_api;
mod real_ip;
mod redirect;
mod redis_lease;
mod redis_sync;
mod referer_restriction;
mod request_id;
mod request_validation;
mod response_rewrite;
pub mod server_info;
pub mod stream;
mod syslog;
mod tcp_logger;
mod traffic_split;
mod ua_restriction;
mod udp_logger;
mod uri_blocker;
mod zipkin;

pub use chain::{Chain, CompileEnv, PluginOrder, Shared};
pub use ctx::{Ctx, Edits, LogInfo, RespEdits, RouteMeta};
pub use ctx_view::{host_of, HostMemo, HostText, ReqView};
pub use effect::{CallFailure, CallTimeouts, Effect, Resume, UpstreamCall};
pub use filters::{body_ended, body_filters, filters_body, header_filters, BodyChunk};
pub use prometheus::serve_metrics;
pub use proxy_cache::Zones as ProxyCacheZones;
pub use proxy_mirror::Mirror;

use bytes::Bytes;

/// APISIX's plugin phases, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Rewrite = 1,
    Access = 2,
    BeforeProxy = 4,
    HeaderFilter = 8,
    BodyFilter = 16,
    Log = 32,
}

/// Which phases a plugin (or a chain) implements: the runner skips the rest without a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseMask(pub u8);

impl PhaseMask {
    pub const fn of(phases: &[Phase]) -> Self {
        let mut m = 0;
        let mut i = 0;
        while i < phases.len() {
            m |= phases[i] as u8;
            i += 1;
        }
        PhaseMask(m)
    }
    pub const fn has(self, p: Phase) -> bool {
        self.0 & p as u8 != 0
    }
    pub const fn union(self, o: PhaseMask) -> Self {
        PhaseMask(self.0 | o.0)
    }
}

/// What a request-side hook decides.
#[derive(Debug)]
pub enum Flow {
    Continue,
    /// Answer now with this response (APISIX's `return code, body`).
    Respond(Response),
}

/// A response written by a plugin. APISIX's `return 401, {message = "..."}` becomes a JSON body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
}

impl Response {
    /// A JSON `{"message": msg}` body, as APISIX plugins answer.
    pub fn message(status: u16, msg: &str) -> Self {
        let body = serde_json::json!({ "message": msg }).to_string();
        Response {
            status,
            headers: vec![(
                Bytes::from_static(b"Content-Type"),
                Bytes::from_static(b"application/json"),
            )],
            body: Bytes::from(body),
        }
    }
    pub fn status(status: u16) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }
}

/// A compiled plugin instance: one per plugin per route (or global rule), built when the configuration changes.
/// Hooks are synchronous: a request-phase hook that needs IO hands it to the proxy with [`Ctx::await_io`] (the
/// chain resumes when it completes); other phases do IO off the request path or batch it.
pub trait Plugin: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn priority(&self) -> i32;
    fn phases(&self) -> PhaseMask;
    fn rewrite(&self, _ctx: &mut Ctx<'_>) -> Flow {
        Flow::Continue
    }
    fn access(&self, _ctx: &mut Ctx<'_>) -> Flow {
        Flow::Continue
    }
    fn before_proxy(&self, _ctx: &mut Ctx<'_>) -> Flow {
        Flow::Continue
    }
    fn header_filter(&self, _ctx: &mut Ctx<'_>, _status: u16) {}
    /// Whether the request body must be read before the request phases (request-validation's `body_schema`):
    /// the proxy then reads it whole, up to client_max_body_size, and hands it over as [`Ctx::body`].
    fn needs_body(&self) -> bool {
        false
    }
    /// APISIX's body_filter: called per piece of the response body and once with `eof` (see [`BodyChunk`]). A
    /// plugin that changes the body calls `ctx.resp.clear_header_as_body_modified()` in its header_filter; one
    /// that must see the whole body holds pieces in `ctx.body_state` and emits them at eof.
    fn body_filter(&self, _ctx: &mut Ctx<'_>, _chunk: &mut BodyChunk) {}
    /// Asked after header_filter, of plugins with the BodyFilter phase: whether this response's body must go
    /// through [`Plugin::body_filter`]. A plugin that decides per response (a wasm filter, which asks for the body
    /// in its header phase or not) answers false to leave the body streaming when no other plugin filters it.
    fn filters_body(&self, _ctx: &Ctx<'_>) -> bool {
        true
    }
    fn log(&self, _ctx: &Ctx<'_>, _info: &LogInfo) {}
    /// Upstreams this plugin may send a request to instead of the route's (traffic-split). The proxy compiles
    /// them with the route when the snapshot is built; a hook picks one per request with
    /// [`Ctx::pick_upstream`], by index into this list.
    fn upstreams(&self) -> &[PluginUpstream] {
        &[]
    }
}

/// An upstream a plugin declares (see [`Plugin::upstreams`]): a reference to an `upstreams` resource or an inline
/// configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum PluginUpstream {
    Id(String),
    Inline(std::sync::Arc<sluice_model::Upstream>),
}
