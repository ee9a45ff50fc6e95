//! forward-auth (priority 2002, access): asks an external service whether the request may pass, as APISIX's
//! `apisix/plugins/forward-auth.lua`. The auth request carries `X-Forwarded-Proto / -Method / -Host / -Uri / -For`,
//! the `extra_headers` (values may use `$var`s) and the client's `request_headers`; with `request_method: POST` it
//! also carries the client's body (re-framed with a Content-Length). A 2xx answer lets the request go on with the
//! answer's `upstream_headers` set on the upstream request (removed when the answer lacks them, so a client cannot
//! supply them itself); any other answer is returned to the client with its status and body plus the answer's
//! `client_headers`. A connection error or timeout answers `status_on_error`, or lets the request through with
//! `allow_degradation`.
//!
//! The call is one awaited effect ([`Ctx::await_io`]): the hook serialises the request, the proxy awaits the
//! future (a client that leaves cancels it) and the chain applies the answer before the next plugin. The future
//! applies `timeout` itself so that `allow_degradation` can continue after it; the effect's own budget is a
//! backstop slightly larger.

pub(crate) mod client;

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::registry::Entry;
use crate::util::{error_page, Template};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response, Resume};

pub const NAME: &str = "forward-auth";
pub const PRIORITY: i32 = 2002;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

/// How much longer than `timeout` the effect's budget is: the future's own timeout always fires first.
const BACKSTOP: Duration = Duration::from_millis(500);

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "uri": {"type": "string"},
            "allow_degradation": {"type": "boolean", "default": false},
            "status_on_error": {"type": "integer", "minimum": 200, "maximum": 599, "default": 403},
            "ssl_verify": {"type": "boolean", "default": true},
            "request_method": {"type": "string", "default": "GET", "enum": ["GET", "POST"],
                "description": "the method for client to request the authorization service"},
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864,
                "description": "maximum request body size in bytes buffered and forwarded to the authorization service when request_method is POST"},
            "request_headers": {"type": "array", "default": [], "items": {"type": "string"},
                "description": "client request header that will be sent to the authorization service"},
            "extra_headers": {"type": "object", "minProperties": 1,
                "patternProperties": {"^[^:]+$": {"type": "string",
                    "description": "header value as a string; may contain variableslike $remote_addr, $request_uri"}},
                "description": "extra headers sent to the authorization service; values must be strings and can include variableslike $remote_addr, $request_uri."},
            "upstream_headers": {"type": "array", "default": [], "items": {"type": "string"},
                "description": "authorization response header that will be sent to the upstream"},
            "client_headers": {"type": "array", "default": [], "items": {"type": "string"},
                "description": "authorization response header that will be sent tothe client when authorizing failed"},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000,
                "description": "timeout in milliseconds"},
            "keepalive": {"type": "boolean", "default": true},
            "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000},
            "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5}
        },
        "required": ["uri"]
    })
}

#[derive(Deserialize)]
struct Conf {
    uri: String,
    #[serde(default)]
    allow_degradation: bool,
    #[serde(default = "d_status")]
    status_on_error: u16,
    #[serde(default = "yes")]
    ssl_verify: bool,
    #[serde(default = "d_method")]
    request_method: String,
    #[serde(default = "d_max_body")]
    max_req_body_size: u64,
    #[serde(default)]
    request_headers: Vec<String>,
    #[serde(default)]
    extra_headers: Option<Map<String, Value>>,
    #[serde(default)]
    upstream_headers: Vec<String>,
    #[serde(default)]
    client_headers: Vec<String>,
    #[serde(default = "d_timeout")]
    timeout: u64,
    #[serde(default = "yes")]
    keepalive: bool,
    #[serde(default = "d_idle")]
    keepalive_timeout: u64,
    #[serde(default = "d_pool")]
    keepalive_pool: usize,
}

fn d_status() -> u16 {
    403
}
fn yes() -> bool {
    true
}
fn d_method() -> String {
    "GET".into()
}
fn d_max_body() -> u64 {
    64 * 1024 * 1024
}
fn d_timeout() -> u64 {
    3000
}
fn d_idle() -> u64 {
    60_000
}
fn d_pool() -> usize {
    5
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v, false).map(drop)
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(ForwardAuth(Arc::new(compile_conf(v, true)?))))
}

/// A field name as RFC 9110 `token`: anything else could split the auth request's head.
fn header_name(n: &str, what: &str) -> Result<Bytes, String> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if n.is_empty() || !n.bytes().all(tchar) {
        return Err(format!("{what}: invalid header name {n:?}"));
    }
    Ok(Bytes::from(n.to_owned()))
}

/// Fields whose meaning is the connection's or the message framing's: the client builds them itself, so they are
/// never copied from the client request, the configuration or the auth answer.
fn framing(name: &[u8]) -> bool {
    sluice_http::is_hop_by_hop(name)
        || name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"expect")
}

fn names(list: &[String], what: &str, warn: bool) -> Result<Vec<Bytes>, String> {
    let mut out = Vec::with_capacity(list.len());
    for n in list {
        let n = header_name(n, what)?;
        if framing(&n) {
            if warn {
                tracing::warn!(plugin = NAME, header = ?n, "{what}: framing header ignored");
            }
            continue;
        }
        out.push(n);
    }
    Ok(out)
}

/// `warn`: log the configuration's risks (once per compile, not again for every check of it).
fn compile_conf(v: &Value, warn: bool) -> Result<Inner, String> {
    let c: Conf = crate::util::parse(&schema(), v)?;
    let target = client::Target::parse(&c.uri, c.ssl_verify)?;
    if warn && target.tls.is_none() {
        // APISIX's `core.utils.check_https`: a warning, not an error.
        tracing::warn!(plugin = NAME, uri = %c.uri, "using forward-auth uri with no TLS is a security risk");
    } else if warn && !c.ssl_verify {
        tracing::warn!(
            plugin = NAME,
            "ssl_verify is false: the auth service's certificate is not checked"
        );
    }
    let mut extra = Vec::new();
    for (k, v) in c.extra_headers.iter().flatten() {
        let name = header_name(k, "extra_headers")?;
        let value = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => return Err(format!("extra_headers: the value of {k} must be a string")),
        };
        if framing(&name) {
            if warn {
                tracing::warn!(plugin = NAME, header = %k, "extra_headers: framing header ignored");
            }
            continue;
        }
        extra.push((name, Template::compile(&value)));
    }
    let request_headers = names(&c.request_headers, "request_headers", warn)?
        .into_iter()
        .map(|n| {
            let lower = String::from_utf8_lossy(&n).to_ascii_lowercase();
            (n, lower)
        })
        .collect();
    let status_on_error = c.status_on_error;
    let post = c.request_method == "POST";
    Ok(Inner {
        target,
        post,
        method: if post { "POST" } else { "GET" },
        max_body: c.max_req_body_size,
        request_headers,
        extra,
        upstream_headers: names(&c.upstream_headers, "upstream_headers", warn)?,
        client_headers: names(&c.client_headers, "client_headers", warn)?,
        timeout: Duration::from_millis(c.timeout),
        keepalive: c.keepalive.then_some(client::Keepalive {
            idle: Duration::from_millis(c.keepalive_timeout),
            pool: c.keepalive_pool,
        }),
        degrade: c.allow_degradation,
        status_on_error,
    })
}

struct Inner {
    target: client::Target,
    post: bool,
    method: &'static str,
    max_body: u64,
    /// Configured name, lower-case name for the lookup in the client request.
    request_headers: Vec<(Bytes, String)>,
    extra: Vec<(Bytes, Template)>,
    upstream_headers: Vec<Bytes>,
    client_headers: Vec<Bytes>,
    timeout: Duration,
    keepalive: Option<client::Keepalive>,
    degrade: bool,
    status_on_error: u16,
}

struct ForwardAuth(Arc<Inner>);

/// APISIX's `return conf.status_on_error`: a bare status, so nginx's page for it (none for 2xx).
fn bare(status: u16) -> Response {
    if status < 300 {
        Response::status(status)
    } else {
        error_page(status)
    }
}

/// A header value the auth request can carry: no CR, LF, NUL or other control byte but HTAB (lua-resty-http
/// refuses them: "invalid characters found in header value").
fn valid_value(v: &[u8]) -> bool {
    v.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// The auth request's fields in order; a later `set` of the same name (any case) replaces an earlier one, as the
/// Lua table APISIX builds does.
#[derive(Default)]
struct Fields(Vec<(Bytes, Bytes)>);

impl Fields {
    fn has(&self, name: &[u8]) -> bool {
        self.0.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
    fn set(&mut self, name: Bytes, value: Bytes) {
        match self
            .0
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case(&name))
        {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }
}

impl Inner {
    /// Serialises the auth request (`Err`: a value that cannot go into a header).
    fn request(&self, ctx: &Ctx<'_>, body: Option<&[u8]>) -> Result<Bytes, String> {
        let req = ctx.req;
        let mut f = Fields::default();
        let s = |v: &str| Bytes::copy_from_slice(v.as_bytes());
        f.set(
            Bytes::from_static(b"X-Forwarded-Proto"),
            Bytes::from_static(req.scheme.as_bytes()),
        );
        f.set(
            Bytes::from_static(b"X-Forwarded-Method"),
            s(req.head.method_str()),
        );
        if let Some(h) = req.host.as_deref() {
            f.set(Bytes::from_static(b"X-Forwarded-Host"), s(h));
        }
        // The normalised path (Sluice's `$request_uri`): the auth service judges the path the router matched, so
        // `/public/../admin` is asked about as `/admin`.
        f.set(
            Bytes::from_static(b"X-Forwarded-Uri"),
            s(&req.request_uri()),
        );
        f.set(
            Bytes::from_static(b"X-Forwarded-For"),
            Bytes::from(ctx.remote_ip().to_string()),
        );
        if self.post {
            // The body is re-framed below; only its coding is the client's.
            if let Some(v) = req.head.header("content-encoding") {
                f.set(
                    Bytes::from_static(b"Content-Encoding"),
                    Bytes::copy_from_slice(v),
                );
            }
        }
        for (name, t) in &self.extra {
            f.set(name.clone(), s(&t.resolve(ctx).0));
        }
        for (name, lower) in &self.request_headers {
            if !f.has(name) {
                if let Some(v) = req.head.header(lower) {
                    f.set(name.clone(), Bytes::copy_from_slice(v));
                }
            }
        }
        let body = body.unwrap_or_default();
        let mut out = BytesMut::with_capacity(256 + body.len());
        out.put_slice(self.method.as_bytes());
        out.put_u8(b' ');
        out.put_slice(self.target.path.as_bytes());
        out.put_slice(b" HTTP/1.1\r\n");
        if !f.has(b"host") {
            put(&mut out, b"Host", self.target.host_header.as_bytes());
        }
        for (n, v) in &f.0 {
            if !valid_value(v) {
                return Err(format!(
                    "invalid characters found in header value of {}",
                    String::from_utf8_lossy(n)
                ));
            }
            put(&mut out, n, v);
        }
        if self.keepalive.is_none() {
            put(&mut out, b"Connection", b"close");
        }
        if self.post {
            put(
                &mut out,
                b"Content-Length",
                body.len().to_string().as_bytes(),
            );
        }
        out.put_slice(b"\r\n");
        out.put_slice(body);
        Ok(out.freeze())
    }

    /// What the request gets when the auth service cannot be asked.
    fn failed(&self, err: &str) -> Resume {
        tracing::warn!("failed to process forward auth, err: {err}");
        if self.degrade {
            Box::new(|_| Flow::Continue)
        } else {
            let r = bare(self.status_on_error);
            Box::new(move |_| Flow::Respond(r))
        }
    }

    /// Turns the auth answer into what the chain applies.
    fn answer(&self, a: client::Answer) -> Resume {
        let values = |name: &[u8]| -> Vec<Bytes> {
            a.head
                .headers_iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| Bytes::copy_from_slice(v))
                .collect()
        };
        if a.head.status >= 300 {
            let mut headers = Vec::new();
            for name in &self.client_headers {
                for v in values(name) {
                    headers.push((name.clone(), v));
                }
            }
            let r = Response {
                status: a.head.status,
                headers,
                body: a.body,
            };
            return Box::new(move |_| Flow::Respond(r));
        }
        let mut set: Vec<(Bytes, Vec<Bytes>)> = Vec::with_capacity(self.upstream_headers.len());
        for name in &self.upstream_headers {
            let v = values(name);
            if !v.iter().all(|v| valid_value(v)) {
                return self.failed("invalid characters in an auth response header");
            }
            set.push((name.clone(), v));
        }
        Box::new(move |ctx: &mut Ctx<'_>| {
            for (name, vals) in set {
                let e = &mut ctx.edits;
                e.set_headers
                    .retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
                if vals.is_empty() {
                    // APISIX's `core.request.set_header(ctx, name, nil)`: the client's own value goes too.
                    e.remove_headers
                        .push(Bytes::from(name.to_ascii_lowercase()));
                } else {
                    e.set_headers
                        .extend(vals.into_iter().map(|v| (name.clone(), v)));
                }
            }
            Flow::Continue
        })
    }
}

fn put(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

impl Plugin for ForwardAuth {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access])
    }
    fn needs_body(&self) -> bool {
        self.0.post
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let me = &self.0;
        let body = if me.post { ctx.body } else { None };
        if body.is_some_and(|b| b.len() as u64 > me.max_body) {
            tracing::error!("failed to read request body: request size exceeds max_req_body_size");
            return Flow::Respond(error_page(413));
        }
        let req = match me.request(ctx, body) {
            Ok(r) => r,
            Err(e) => return me.failed(&e)(ctx),
        };
        let me = self.0.clone();
        let on_timeout = bare(me.status_on_error);
        let budget = me.timeout + BACKSTOP;
        ctx.await_io(
            async move {
                let call = client::call(&me.target, &req, me.keepalive);
                match tokio::time::timeout(me.timeout, call).await {
                    Ok(Ok(a)) => me.answer(a),
                    Ok(Err(e)) => me.failed(&e),
                    Err(_) => me.failed("timeout"),
                }
            },
            budget,
            on_timeout,
        );
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_checks_match_apisix() {
        // t/plugin/forward-auth.t TEST 1
        assert!(check(&json!({"uri": "http://127.0.0.1:8199"})).is_ok());
        assert_eq!(
            check(&json!({"request_headers": ["test"]})).unwrap_err(),
            "property \"uri\" is required"
        );
        assert_eq!(
            check(&json!({"uri": 3233})).unwrap_err(),
            "property \"uri\" validation failed: wrong type: expected string, got number"
        );
        assert_eq!(
            check(&json!({"uri": "http://127.0.0.1:8199", "request_headers": "test"})).unwrap_err(),
            "property \"request_headers\" validation failed: wrong type: expected array, got string"
        );
        assert!(check(&json!({"uri": "http://127.0.0.1:8199", "request_method": "POST"})).is_ok());
        assert_eq!(
            check(&json!({"uri": "http://127.0.0.1:8199", "request_method": "PUT"})).unwrap_err(),
            "property \"request_method\" validation failed: matches none of the enum values"
        );
        for bad in [
            json!({"uri": "http://a", "timeout": 0}),
            json!({"uri": "http://a", "timeout": 60001}),
            json!({"uri": "http://a", "status_on_error": 199}),
            json!({"uri": "http://a", "status_on_error": 600}),
            json!({"uri": "http://a", "keepalive_timeout": 999}),
            json!({"uri": "http://a", "keepalive_pool": 0}),
            json!({"uri": "http://a", "extra_headers": {}}),
            json!({"uri": "http://a", "extra_headers": {"X-A": 1}}),
            json!({"uri": "http://a", "max_req_body_size": 0}),
        ] {
            assert!(check(&bad).is_err(), "{bad}");
        }
    }

    /// Names that would split the auth request's head are refused when the configuration is written.
    #[test]
    fn header_names_must_be_tokens() {
        for bad in [
            json!({"uri": "http://a", "request_headers": ["X-A\r\nInjected: 1"]}),
            json!({"uri": "http://a", "request_headers": [""]}),
            json!({"uri": "http://a", "upstream_headers": ["X A"]}),
            json!({"uri": "http://a", "client_headers": ["X:A"]}),
            json!({"uri": "http://a", "extra_headers": {"a:b": "c"}}),
            json!({"uri": "http://a", "extra_headers": {"X-A\n": "c"}}),
        ] {
            let e = check(&bad).unwrap_err();
            assert!(e.contains("invalid header name"), "{bad}: {e}");
        }
    }

    #[test]
    fn defaults_are_apisix_ones() {
        let i = compile_conf(&json!({"uri": "http://a/auth"}), false).unwrap();
        assert_eq!(i.timeout, Duration::from_millis(3000));
        assert_eq!(i.status_on_error, 403);
        assert!(!i.degrade && !i.post);
        assert_eq!(i.max_body, 64 * 1024 * 1024);
        let ka = i.keepalive.unwrap();
        assert_eq!((ka.idle, ka.pool), (Duration::from_secs(60), 5));
        assert!(
            compile_conf(&json!({"uri": "http://a", "keepalive": false}), false)
                .unwrap()
                .keepalive
                .is_none()
        );
        let i = compile_conf(
            &json!({"uri": "http://a",
            "request_headers": ["Authorization", "Content-Length", "Transfer-Encoding"],
            "client_headers": ["Location", "Connection"]}),
            false,
        )
        .unwrap();
        assert_eq!(i.request_headers.len(), 1);
        assert_eq!(i.client_headers, vec![Bytes::from_static(b"Location")]);
    }
}
