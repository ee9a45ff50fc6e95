//! grpc-web (priority 505, access + header_filter + body_filter): browsers' gRPC-Web calls to a gRPC upstream, as
//! APISIX's plugin (`apisix/plugins/grpc-web.lua`). The framing lives in `sluice_grpc::grpc_web`.
//!
//! - access: `OPTIONS` is answered 204 (CORS preflight); other methods than `POST` and content types other than
//!   `application/grpc-web[-text][+proto]` are a 400. The upstream path is the route's `*` capture (the route must
//!   be a prefix route, `/grpc/*`), or with `strip_path` the route's prefix plus the capture; a `-text` body is
//!   base64-decoded. The request goes on as `content-type: application/grpc` with the decoded body.
//! - header_filter: CORS headers (`Access-Control-Allow-Origin: *` unless the cors plugin set one,
//!   `Access-Control-Expose-Headers: grpc-status,grpc-message`, on preflights the allowed methods and headers),
//!   the client's content type back, the body marked modified.
//! - body_filter: messages are passed on (base64-encoded per piece for `-text`), and the upstream's `grpc-status`
//!   and `grpc-message` trailers become the in-body trailer frame gRPC-Web clients read. APISIX only writes that
//!   frame with `enable_in_body_trailers_on_success` (and then with defaults rather than the upstream's values);
//!   browsers cannot read HTTP trailers, so Sluice always writes it from the real trailers.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_grpc::grpc_web::{self, Encoding, ResponseEncoder};

use crate::filters::BodyChunk;
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "grpc-web";
pub const PRIORITY: i32 = 505;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

const ALLOW_HEADERS: &str = "content-type,x-grpc-web,x-user-agent,grpc-accept-encoding";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "strip_path": {
                "description": "include prefix matched by path pattern in the path used for upstream call, appropriate for prefix matching path patterns with the format <package>.<service>/*",
                "type": "boolean",
                "default": false
            },
            "enable_in_body_trailers_on_success": {
                "description": "append standard grpc-web in-body trailers frame in response body",
                "type": "boolean",
                "default": false
            }
        }
    })
}

fn check(v: &Value) -> Result<(), String> {
    sluice_model::schema::validate(&schema(), v)
}

struct GrpcWeb {
    strip_path: bool,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    Ok(Arc::new(GrpcWeb {
        strip_path: v.get("strip_path").and_then(Value::as_bool) == Some(true),
    }))
}

/// Per request: the client's content type and, once the request was passed on, how to encode the answer.
#[derive(Default)]
struct State {
    mime: Option<Bytes>,
    encoding: Option<Encoding>,
    /// The upstream answered with its status in the head (no body, no trailers).
    trailers_only: bool,
}

impl GrpcWeb {
    fn key(&self) -> *const () {
        self as *const Self as *const ()
    }

    /// The upstream path: the route's `*` capture, with `strip_path` prefixed by the route's pattern.
    fn path(&self, ctx: &Ctx<'_>) -> Option<String> {
        let ext = ctx.param(":ext")?;
        let pattern = ctx.route.map(|r| &*r.matched_uri).unwrap_or("");
        let joined;
        let path = match pattern.strip_suffix('*') {
            Some(prefix) if self.strip_path && !ext.starts_with('/') => {
                joined = format!("{prefix}{ext}");
                &joined
            }
            _ => ext,
        };
        grpc_web::upstream_path(path)
    }
}

impl Plugin for GrpcWeb {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access, Phase::HeaderFilter, Phase::BodyFilter])
    }
    fn needs_body(&self) -> bool {
        true
    }

    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let head = ctx.req.head;
        let mime = head.header("content-type").map(Bytes::copy_from_slice);
        let encoding = mime
            .as_deref()
            .and_then(|m| std::str::from_utf8(m).ok())
            .and_then(grpc_web::encoding_of);
        ctx.body_state::<State>(self.key()).mime = mime;
        match head.method_str() {
            "OPTIONS" => return Flow::Respond(Response::status(204)),
            "POST" => {}
            _ => return Flow::Respond(Response::status(400)),
        }
        let Some(encoding) = encoding else {
            return Flow::Respond(Response::status(400));
        };
        let Some(path) = self.path(ctx) else {
            // As APISIX: the plugin needs a prefix route (`/prefix/*`) to find the gRPC path.
            tracing::error!("grpc-web plugin only supports `prefix matching` pattern routing");
            return Flow::Respond(Response::status(400));
        };
        let body = match grpc_web::decode_request_body(encoding, ctx.body.unwrap_or(&[])) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, "grpc-web: undecodable request body");
                return Flow::Respond(Response::status(400));
            }
        };
        ctx.edits.uri = Some(Bytes::from(path));
        ctx.edits.set_headers.push((
            Bytes::from_static(b"Content-Type"),
            Bytes::from_static(grpc_web::UPSTREAM_CONTENT_TYPE.as_bytes()),
        ));
        ctx.replace_body(Bytes::from(body));
        ctx.body_state::<State>(self.key()).encoding = Some(encoding);
        Flow::Continue
    }

    fn header_filter(&self, ctx: &mut Ctx<'_>, _status: u16) {
        let set = |ctx: &mut Ctx<'_>, n: &'static str, v: &'static str| {
            ctx.resp.set(
                Bytes::from_static(n.as_bytes()),
                Bytes::from_static(v.as_bytes()),
            )
        };
        if ctx.req.head.method_str() == "OPTIONS" {
            set(ctx, "Access-Control-Allow-Methods", "POST, OPTIONS");
            set(ctx, "Access-Control-Allow-Headers", ALLOW_HEADERS);
        }
        // The cors plugin (priority 4000) ran its header_filter first: its origin stands.
        if ctx.response_header("access-control-allow-origin").is_none() {
            set(ctx, "Access-Control-Allow-Origin", "*");
        }
        set(
            ctx,
            "Access-Control-Expose-Headers",
            "grpc-status,grpc-message",
        );
        let trailers_only = ctx
            .upstream_head()
            .is_some_and(|h| h.header("grpc-status").is_some());
        let st = ctx.body_state::<State>(self.key());
        st.trailers_only = trailers_only;
        let mime = st.mime.clone();
        if let Some(m) = mime {
            ctx.resp.set(Bytes::from_static(b"Content-Type"), m);
        }
        ctx.resp.clear_header_as_body_modified();
        ctx.resp.drop_trailers = true;
    }

    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        let st = ctx.body_state::<State>(self.key());
        let Some(encoding) = st.encoding else {
            return;
        };
        let trailers_only = st.trailers_only;
        let enc = ResponseEncoder::new(encoding);
        let mut out = Vec::with_capacity(chunk.data.len() * 4 / 3 + 64);
        if !chunk.data.is_empty() {
            enc.chunk(&chunk.data, &mut out);
        }
        if chunk.eof {
            enc.finish(
                trailers_only,
                ctx.upstream_trailer("grpc-status"),
                ctx.upstream_trailer("grpc-message"),
                &mut out,
            );
        }
        chunk.data = Bytes::from(out);
    }
}
