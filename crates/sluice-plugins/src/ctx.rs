//! Per-request plugin state: what the request looks like ([`ReqView`]), who the consumer is, and the edits plugins
//! ask for on the request going upstream and on the response going back. The proxy applies the edits while it
//! writes the heads, so an untouched header is still forwarded byte for byte.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use sluice_router::{MatchRequest, Var};

use crate::{Chain, ReqView};

/// Changes to the request before it goes upstream. Header names are matched case-insensitively.
#[derive(Debug, Default, Clone)]
pub struct Edits {
    /// Lower-case names of headers to drop (e.g. key-auth's `hide_credentials`).
    pub remove_headers: Vec<Bytes>,
    /// Headers to set, replacing any of the same name.
    pub set_headers: Vec<(Bytes, Bytes)>,
    /// A new request-target (path and query), as proxy-rewrite's `uri`.
    pub uri: Option<Bytes>,
    pub method: Option<Bytes>,
    /// A new Host header value, overriding `pass_host`.
    pub host: Option<Bytes>,
    /// A new request body (see [`Ctx::replace_body`]); not part of [`Edits::is_empty`], which is about the head.
    pub body: Option<Bytes>,
}

impl Edits {
    pub fn is_empty(&self) -> bool {
        self.remove_headers.is_empty()
            && self.set_headers.is_empty()
            && self.uri.is_none()
            && self.method.is_none()
            && self.host.is_none()
    }
    /// Whether a header with this name must not be copied from the original request.
    pub fn drops(&self, name: &[u8]) -> bool {
        self.remove_headers
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
            || self
                .set_headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// Changes to the response head before it goes to the client.
#[derive(Debug, Default, Clone)]
pub struct RespEdits {
    pub remove_headers: Vec<Bytes>,
    /// Set (replace) these headers.
    pub set_headers: Vec<(Bytes, Bytes)>,
    /// Append these headers, keeping existing ones.
    pub add_headers: Vec<(Bytes, Bytes)>,
    /// A new status code (response-rewrite `status_code`), sent with its standard reason phrase.
    pub status: Option<u16>,
    /// A plugin will change the body (see [`RespEdits::clear_header_as_body_modified`]): the proxy re-frames it.
    pub body_modified: bool,
    /// Set in header_filter: the head waits for the end of the body, so a body_filter at eof may still change the
    /// status and headers (grpc-transcode maps a `grpc-status` trailer to the HTTP status). The body is then
    /// collected whole and framed by its length; the plugin bounds it.
    pub hold_head: bool,
    /// Set by a filter: the upstream's trailers are not passed on (grpc-web carries them in the body).
    pub drop_trailers: bool,
}

impl RespEdits {
    pub fn is_empty(&self) -> bool {
        self.remove_headers.is_empty()
            && self.set_headers.is_empty()
            && self.add_headers.is_empty()
            && self.status.is_none()
    }
    pub fn drops(&self, name: &[u8]) -> bool {
        self.remove_headers
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
            || self
                .set_headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// The matched route as plugins see it, built once per route when the snapshot compiles: the ids and names log
/// entries carry and the configured uri / host patterns prometheus labels with (`matched_uri`, `matched_host`:
/// the route's first `uris` / `hosts` entry, bounded by configuration, never the request's own path).
#[derive(Debug, Default, Clone)]
pub struct RouteMeta {
    pub service_id: Option<Box<str>>,
    pub route_name: Option<Box<str>>,
    pub service_name: Option<Box<str>>,
    pub matched_uri: Box<str>,
    pub matched_host: Box<str>,
}

/// The request context handed to every hook.
pub struct Ctx<'a> {
    pub req: &'a ReqView<'a>,
    pub route_id: &'a str,
    /// The matched route's service id, names and patterns (set by the proxy; `None` in bare unit tests).
    pub route: Option<&'a RouteMeta>,
    /// The whole request body, when a plugin of the route asked for it ([`crate::Plugin::needs_body`]).
    pub body: Option<&'a [u8]>,
    /// Set by an auth plugin once it identifies the consumer; read by later plugins (limit-count `consumer_name`).
    pub consumer: Option<Arc<sluice_model::Consumer>>,
    pub edits: Edits,
    pub resp: RespEdits,
    /// The consumer's own plugins, merged into the route's chain once an auth plugin has identified it.
    pub(crate) consumer_chain: Option<Arc<Chain>>,
    /// Id of the chain that merged the consumer's plugins (it runs them in header_filter and log).
    pub(crate) merged_by: u64,
    /// Per-request variables plugins publish for later ones (`request_id`, ...).
    pub(crate) vars: Vec<(&'static str, Box<str>)>,
    /// The client address real-ip established (it replaces `remote_addr` for later plugins).
    pub real_ip: Option<std::net::IpAddr>,
    /// Held limit-conn slots: released when the request context is dropped, whatever way the request ends.
    pub(crate) held: Vec<crate::limit_conn::Held>,
    /// The response being filtered: its head, plugins' per-response state, gzip (see `filters.rs`).
    pub(crate) out: crate::filters::RespState,
    /// How long the proxy waits before going on (limit-req, limit-conn, fault-injection `delay`): hooks are
    /// synchronous, so they ask for the sleep and the proxy awaits it without blocking its thread.
    pub(crate) delay: Duration,
    /// Set when a hook's delay paused [`Chain::run_request`]: the hook positions already run.
    pub(crate) resume: u32,
    /// The upstream a plugin chose instead of the route's: an index into [`Chain::upstreams`] of the route's chain.
    pub(crate) upstream: Option<u32>,
    /// A copy of the request proxy-mirror asks the proxy to send.
    pub(crate) mirror: Option<crate::proxy_mirror::Mirror>,
    /// IO a hook started and the proxy awaits (see [`crate::effect`]).
    pub(crate) io: crate::effect::Pending,
    /// The route's `:param` / `*name` captures, when it has any (ranges into `req.path()`).
    pub(crate) params: Option<sluice_router::Params>,
    /// opentelemetry's and zipkin's spans in progress (only on routes with one of them).
    pub(crate) trace: Option<Box<crate::trace::ReqTrace>>,
    /// When the proxy had the request head (its own clock read): limit-count's windows count from it instead of
    /// reading the clock again. `None` (bare unit tests): plugins read the clock.
    pub started: Option<std::time::Instant>,
}

impl<'a> Ctx<'a> {
    pub fn new(req: &'a ReqView<'a>, route_id: &'a str) -> Self {
        Ctx {
            req,
            route_id,
            route: None,
            body: None,
            consumer: None,
            edits: Edits::default(),
            resp: RespEdits::default(),
            consumer_chain: None,
            merged_by: 0,
            vars: Vec::new(),
            held: Vec::new(),
            out: Default::default(),
            real_ip: None,
            delay: Duration::ZERO,
            resume: 0,
            upstream: None,
            mirror: None,
            io: Default::default(),
            params: None,
            trace: None,
            started: None,
        }
    }

    /// Attaches the route's captures (the proxy copies them only for routes that captured something).
    pub fn with_params(mut self, params: sluice_router::Params) -> Self {
        self.params = Some(params);
        self
    }

    /// [`Ctx::with_params`] on a context already in place.
    pub fn set_params(&mut self, params: sluice_router::Params) {
        self.params = Some(params);
    }

    /// A route capture by name (`:id` -> `param("id")`, `/*` -> `param(":ext")`... as the router names it).
    pub fn param(&self, name: &str) -> Option<&str> {
        let path = sluice_router::MatchRequest::path(self.req);
        self.params.as_ref()?.get(name, path)
    }

    /// Every route capture as (name, value).
    pub fn params(&self) -> impl Iterator<Item = (&str, &str)> {
        let path = sluice_router::MatchRequest::path(self.req);
        self.params
            .iter()
            .flat_map(|p| p.iter())
            .filter_map(move |(n, r)| Some((n, path.get(r)?)))
    }

    /// Replaces the request body sent upstream (the proxy frames it with a Content-Length). The client's body is
    /// read whole first and discarded; a plugin that transforms it asks for it with [`crate::Plugin::needs_body`].
    pub fn replace_body(&mut self, body: Bytes) {
        self.edits.body = Some(body);
    }

    /// Sends the request to the route chain's `i`-th plugin upstream (`None`: the route's own upstream).
    pub fn pick_upstream(&mut self, i: Option<u32>) {
        self.upstream = i;
    }

    /// The plugin upstream chosen for this request, if any.
    pub fn picked_upstream(&self) -> Option<usize> {
        self.upstream.map(|i| i as usize)
    }

    /// The request copy proxy-mirror decided on, if any (taken by the proxy, which sends it).
    pub fn take_mirror(&mut self) -> Option<crate::proxy_mirror::Mirror> {
        self.mirror.take()
    }

    /// Asks the proxy to wait `d` more before it goes on (APISIX's `ngx.sleep` in a request phase).
    pub fn add_delay(&mut self, d: Duration) {
        self.delay += d;
    }

    /// The wait plugins asked for so far, reset to zero: the proxy sleeps it before going on.
    pub fn take_delay(&mut self) -> Duration {
        std::mem::take(&mut self.delay)
    }

    /// Whether a delay paused the chain's request phases: after sleeping, the proxy calls
    /// [`Chain::run_request`] again on the same chain, which resumes after the delaying hook.
    pub fn paused(&self) -> bool {
        self.resume != 0
    }

    /// Attaches the matched route's [`RouteMeta`].
    pub fn with_route(mut self, meta: &'a RouteMeta) -> Self {
        self.route = Some(meta);
        self
    }

    /// Attaches the request body the proxy read for the plugins.
    pub fn with_body(mut self, body: &'a [u8]) -> Self {
        self.body = Some(body);
        self
    }

    /// The matched route's `service_id`, if it has one.
    pub fn service_id(&self) -> Option<&'a str> {
        self.route.and_then(|m| m.service_id.as_deref())
    }

    /// The consumer's name, once an auth plugin has identified one.
    pub fn consumer_name(&self) -> Option<&str> {
        self.consumer.as_deref().map(|c| c.username.as_str())
    }

    /// The client address: real-ip's when it set one, else the peer's.
    pub fn remote_ip(&self) -> std::net::IpAddr {
        self.real_ip.unwrap_or_else(|| self.req.peer.ip())
    }

    /// Sets a per-request variable (replacing an earlier value).
    pub fn set_var(&mut self, name: &'static str, value: impl Into<Box<str>>) {
        let value = value.into();
        match self.vars.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.vars.push((name, value)),
        }
    }

    /// An APISIX variable: the request's (`remote_addr`, `http_x`, `arg_y`, ...) plus the ones plugins and the
    /// context know (`consumer_name`, `route_id`, `request_id`, ...).
    pub fn var(&self, var: &Var) -> Option<std::borrow::Cow<'_, str>> {
        use std::borrow::Cow;
        if let (Var::RemoteAddr, Some(ip)) = (var, self.real_ip) {
            return Some(Cow::Owned(ip.to_string()));
        }
        if let Var::Other(name) = var {
            match name.as_ref() {
                "consumer_name" => return self.consumer_name().map(Cow::Borrowed),
                "route_id" => return Some(Cow::Borrowed(self.route_id)),
                "service_id" => return self.service_id().map(Cow::Borrowed),
                "route_name" => {
                    return self
                        .route
                        .and_then(|m| m.route_name.as_deref())
                        .map(Cow::Borrowed)
                }
                "service_name" => {
                    return self
                        .route
                        .and_then(|m| m.service_name.as_deref())
                        .map(Cow::Borrowed)
                }
                "request_uri" => return Some(self.req.request_uri()),
                other => {
                    if let Some((_, v)) = self.vars.iter().find(|(n, _)| *n == other) {
                        return Some(Cow::Borrowed(v));
                    }
                }
            }
        }
        self.req.var(var)
    }
}

/// What the log phase learns about a finished request.
#[derive(Debug, Clone)]
pub struct LogInfo {
    pub status: u16,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// From the end of the request head to the end of the response.
    pub latency: Duration,
    /// Time the upstream took (connect through response head), when one was contacted.
    pub upstream_latency: Option<Duration>,
    pub upstream_addr: Option<SocketAddr>,
    /// The upstream's own status (before a plugin's `status_code`), when one answered. The response headers and
    /// a captured body are on the context: `Ctx::response_headers`, `Ctx::response_body`.
    pub upstream_status: Option<u16>,
}

/// Lets `_meta.filter` expressions see the context's variables (`consumer_name`, ...), not only the request's.
impl MatchRequest for Ctx<'_> {
    fn path(&self) -> &str {
        self.req.path()
    }
    fn host(&self) -> Option<&str> {
        MatchRequest::host(self.req)
    }
    fn method(&self) -> &str {
        self.req.method()
    }
    fn remote_addr(&self) -> std::net::IpAddr {
        self.remote_ip()
    }
    fn var(&self, var: &Var) -> Option<std::borrow::Cow<'_, str>> {
        Ctx::var(self, var)
    }
    fn var_has(&self, var: &Var, item: &str) -> bool {
        match var {
            Var::Other(_) => Ctx::var(self, var).as_deref() == Some(item),
            _ => self.req.var_has(var, item),
        }
    }
}
