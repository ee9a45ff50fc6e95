//! The response side of the plugin runtime: the head plugins read in header_filter, the body_filter phase over
//! response chunks, per-response plugin state, and the gzip output stage (nginx's gzip filter, which APISIX's gzip
//! plugin only configures) that runs after every plugin's filters.
//!
//! The proxy calls [`header_filters`] once per response, then, only when [`filters_body`] says so, [`body_filters`]
//! for each body piece and once more with `eof`. A route whose chains have no BodyFilter plugin never gets here and
//! keeps the proxy's zero-copy streaming. A plugin that will change the body says so in header_filter with
//! [`RespEdits::clear_header_as_body_modified`] (APISIX's `core.response.clear_header_as_body_modified`): the
//! proxy then drops Content-Length and re-frames. Not here: the framing itself and the socket IO (sluice-proxy).

use std::any::Any;
use std::sync::Arc;

use bytes::Bytes;
use sluice_http::ResponseHead;

use crate::gzip::{Encoder, GzipConf};
use crate::{Chain, Ctx, RespEdits};

/// One call of the body_filter phase: APISIX's `ngx.arg[1]` (this piece of the body) and `ngx.arg[2]` (eof).
/// A plugin may replace or clear `data` (clearing holds the piece back, to emit a buffered body later) and may set
/// `eof` to end the body here: the proxy then discards what the upstream still sends.
#[derive(Debug, Default)]
pub struct BodyChunk {
    pub data: Bytes,
    pub eof: bool,
}

/// The response head the plugins are filtering.
#[derive(Default)]
enum Head {
    #[default]
    None,
    /// As received from the upstream.
    Upstream(ResponseHead),
    /// A plugin's own answer (`Flow::Respond`).
    Own(Vec<(Bytes, Bytes)>),
}

/// Per-response state kept in [`Ctx`]: empty (no allocation) until a response is filtered.
#[derive(Default)]
pub(crate) struct RespState {
    head: Head,
    /// Plugins' per-response state, keyed by the plugin instance's address.
    state: Vec<(usize, Box<dyn Any + Send>)>,
    /// Set by the gzip plugin's header_filter: the output stage decides on the final head.
    gzip: Option<Arc<GzipConf>>,
    encoder: Option<Encoder>,
    /// A body filter set `eof`: nothing more is emitted.
    ended: bool,
    /// The body as sent (before gzip), kept for loggers' `include_resp_body`.
    captured: Option<bytes::BytesMut>,
    /// The upstream's trailers, handed over before the eof body_filter call (h2 and gRPC upstreams).
    trailers: Vec<(Bytes, Bytes)>,
}

/// Bodies larger than this are truncated in log entries (APISIX logs what it collected; an unbounded body would
/// hold an unbounded buffer per request).
pub const CAPTURE_LIMIT: usize = 1 << 20;

/// A logger's `include_resp_body: true` with its optional `include_resp_body_expr` (lua-resty-expr over the
/// request's variables and `status`), compiled with the chain.
pub(crate) struct Capture {
    expr: Option<sluice_router::expr::Expr>,
}

impl Capture {
    /// `Some` when a plugin configuration asks for the response body in its log entries.
    pub(crate) fn of(conf: &serde_json::Value) -> Result<Option<Capture>, String> {
        if conf
            .get("include_resp_body")
            .and_then(serde_json::Value::as_bool)
            != Some(true)
        {
            return Ok(None);
        }
        let expr = match conf.get("include_resp_body_expr") {
            None => None,
            Some(e) => Some(
                sluice_router::expr::Expr::compile(e)
                    .map_err(|e| format!("invalid include_resp_body_expr: {e}"))?,
            ),
        };
        Ok(Some(Capture { expr }))
    }
}

impl RespEdits {
    /// APISIX's `clear_header_as_body_modified`: the body will change, so its length, encoding and cache
    /// validators no longer hold. The proxy re-frames the body (chunked for HTTP/1.1 clients).
    pub fn clear_header_as_body_modified(&mut self) {
        self.body_modified = true;
        for name in [
            "content-length",
            "content-encoding",
            "last-modified",
            "etag",
        ] {
            self.remove(name);
        }
    }

    /// Removes a header from the response (and any value a plugin set or added for it).
    pub fn remove(&mut self, name: &str) {
        let n = name.as_bytes();
        self.set_headers.retain(|(x, _)| !x.eq_ignore_ascii_case(n));
        self.add_headers.retain(|(x, _)| !x.eq_ignore_ascii_case(n));
        if !self
            .remove_headers
            .iter()
            .any(|x| x.eq_ignore_ascii_case(n))
        {
            self.remove_headers.push(Bytes::copy_from_slice(n));
        }
    }

    /// Sets a header, replacing the upstream's and any earlier set.
    pub fn set(&mut self, name: Bytes, value: Bytes) {
        self.set_headers
            .retain(|(x, _)| !x.eq_ignore_ascii_case(&name));
        self.set_headers.push((name, value));
    }
}

impl Ctx<'_> {
    /// Hands the upstream's response head to the plugins (header_filter, body_filter and log read it).
    pub fn set_upstream_head(&mut self, head: ResponseHead) {
        self.out.head = Head::Upstream(head);
    }

    /// The upstream's response head, as received.
    pub fn upstream_head(&self) -> Option<&ResponseHead> {
        match &self.out.head {
            Head::Upstream(h) => Some(h),
            _ => None,
        }
    }

    /// Hands a plugin's own response headers to the plugins; [`Ctx::own_headers`] gives them back.
    pub fn set_own_headers(&mut self, headers: Vec<(Bytes, Bytes)>) {
        self.out.head = Head::Own(headers);
    }

    pub fn own_headers(&self) -> &[(Bytes, Bytes)] {
        match &self.out.head {
            Head::Own(h) => h,
            _ => &[],
        }
    }

    /// A response header as the client will see it: a plugin's set value, else the original unless removed, else
    /// the first added value. `lower_name` is lower case.
    pub fn response_header(&self, lower_name: &str) -> Option<&[u8]> {
        let n = lower_name.as_bytes();
        let e = &self.resp;
        if let Some((_, v)) = e
            .set_headers
            .iter()
            .rev()
            .find(|(x, _)| x.eq_ignore_ascii_case(n))
        {
            return Some(v);
        }
        let removed = e.remove_headers.iter().any(|x| x.eq_ignore_ascii_case(n));
        let original = match &self.out.head {
            _ if removed => None,
            Head::Upstream(h) => h.header(lower_name),
            Head::Own(hs) => hs
                .iter()
                .find(|(x, _)| x.eq_ignore_ascii_case(n))
                .map(|(_, v)| &v[..]),
            Head::None => None,
        };
        original.or_else(|| {
            e.add_headers
                .iter()
                .find(|(x, _)| x.eq_ignore_ascii_case(n))
                .map(|(_, v)| &v[..])
        })
    }

    /// Every response header the client will see, in order (original ones first, then set, then added).
    pub fn response_headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let e = &self.resp;
        let original: Box<dyn Iterator<Item = (&[u8], &[u8])>> = match &self.out.head {
            Head::Upstream(h) => {
                let tokens = sluice_http::connection_tokens(&h.buf, &h.headers);
                Box::new(
                    h.headers
                        .iter()
                        .map(|s| (h.slice(s.name), h.slice(s.value)))
                        .filter(move |(n, _)| !tokens.is_hop_by_hop(n)),
                )
            }
            Head::Own(hs) => Box::new(hs.iter().map(|(n, v)| (&n[..], &v[..]))),
            Head::None => Box::new(std::iter::empty()),
        };
        original.filter(|(n, _)| !e.drops(n)).chain(
            e.set_headers
                .iter()
                .chain(&e.add_headers)
                .map(|(n, v)| (&n[..], &v[..])),
        )
    }

    /// This plugin instance's state for the current response, created on first use. `key` is the plugin itself
    /// (`self`), so two instances of one plugin (global rule and route) keep separate state.
    pub fn body_state<T: Any + Send + Default>(&mut self, key: *const ()) -> &mut T {
        let key = key as usize;
        let pos = match self.out.state.iter().position(|(k, _)| *k == key) {
            Some(p) => p,
            None => {
                self.out.state.push((key, Box::new(T::default())));
                self.out.state.len() - 1
            }
        };
        let slot = &mut self.out.state[pos].1;
        if !slot.is::<T>() {
            *slot = Box::new(T::default());
        }
        // The slot holds a `T` now (checked or just replaced); the fallback is unreachable.
        match slot.downcast_mut::<T>() {
            Some(t) => t,
            None => unreachable!("body state slot holds a different type"),
        }
    }

    /// The state [`Ctx::body_state`] holds for `key`, if any, read through `&Ctx` (the log phase).
    pub fn body_state_ref<T: Any>(&self, key: *const ()) -> Option<&T> {
        let key = key as usize;
        self.out
            .state
            .iter()
            .find(|(k, _)| *k == key)?
            .1
            .downcast_ref::<T>()
    }

    /// Hands the upstream's trailers to the plugins; the proxy calls it before the eof body_filter call.
    pub fn set_upstream_trailers(&mut self, trailers: Vec<(Bytes, Bytes)>) {
        self.out.trailers = trailers;
    }

    /// The upstream's trailers (empty until the body ended, and for upstreams that sent none).
    pub fn upstream_trailers(&self) -> &[(Bytes, Bytes)] {
        &self.out.trailers
    }

    /// One upstream trailer by lower-case name.
    pub fn upstream_trailer(&self, lower_name: &str) -> Option<&[u8]> {
        self.out
            .trailers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(lower_name.as_bytes()))
            .map(|(_, v)| &v[..])
    }

    /// The response body as sent (before gzip, up to [`CAPTURE_LIMIT`] bytes), when a logger of the route asked
    /// for it with `include_resp_body` (and its `include_resp_body_expr` matched). For the log phase.
    pub fn response_body(&self) -> Option<&[u8]> {
        self.out.captured.as_deref()
    }

    /// Asks for gzip on this response (the gzip plugin's header_filter); decided after every header_filter.
    pub(crate) fn request_gzip(&mut self, conf: Arc<GzipConf>) {
        self.out.gzip = Some(conf);
    }
}

/// Runs header_filter over the chains (global rules first, as APISIX), then the gzip stage on the final head.
pub fn header_filters(chains: &[Option<&Chain>], ctx: &mut Ctx<'_>, status: u16) {
    for chain in chains.iter().flatten() {
        chain.header_filter(ctx, status);
    }
    for cap in chains.iter().flatten().filter_map(|c| c.capture.as_ref()) {
        let wanted = match &cap.expr {
            None => true,
            Some(e) => {
                let final_status = ctx.resp.status.unwrap_or(status);
                ctx.set_var("status", final_status.to_string());
                e.eval(&*ctx)
            }
        };
        if wanted {
            ctx.out.captured = Some(bytes::BytesMut::new());
            break;
        }
    }
    if let Some(conf) = ctx.out.gzip.take() {
        let status = ctx.resp.status.unwrap_or(status);
        if let Some(enc) = crate::gzip::decide(&conf, ctx, status) {
            ctx.out.encoder = Some(enc);
        }
    }
}

/// Whether this response's body must go through [`body_filters`]: a chain (or the merged consumer's) has a
/// body_filter plugin, or gzip applies.
pub fn filters_body(chains: &[Option<&Chain>], ctx: &Ctx<'_>) -> bool {
    chains.iter().flatten().any(|c| c.filters_body(ctx))
        || ctx
            .consumer_chain
            .as_ref()
            .is_some_and(|c| c.filters_body(ctx))
        || ctx.out.encoder.is_some()
}

/// Runs body_filter over the chains for one piece of the body, then gzip. After a filter ended the body (`eof`),
/// further calls yield nothing.
pub fn body_filters(chains: &[Option<&Chain>], ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
    if ctx.out.ended {
        chunk.data = Bytes::new();
        chunk.eof = true;
        return;
    }
    for chain in chains.iter().flatten() {
        chain.body_filter(ctx, chunk);
    }
    if chunk.eof {
        ctx.out.ended = true;
    }
    if let Some(buf) = ctx.out.captured.as_mut() {
        let room = CAPTURE_LIMIT.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk.data[..room.min(chunk.data.len())]);
    }
    if let Some(enc) = ctx.out.encoder.as_mut() {
        enc.filter(chunk);
    }
}

/// Whether a body filter has ended the body (the proxy stops reading it into the filters).
pub fn body_ended(ctx: &Ctx<'_>) -> bool {
    ctx.out.ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clear_header_as_body_modified_drops_length_encoding_and_validators() {
        let mut e = RespEdits::default();
        e.set(Bytes::from_static(b"ETag"), Bytes::from_static(b"x"));
        e.clear_header_as_body_modified();
        assert!(e.body_modified);
        for n in [
            "Content-Length",
            "content-encoding",
            "Last-Modified",
            "etag",
        ] {
            assert!(e.drops(n.as_bytes()), "{n}");
        }
        assert!(e.set_headers.is_empty());
    }
}
