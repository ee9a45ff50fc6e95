//! grpc-transcode (priority 506, access + header_filter + body_filter): HTTP/JSON in, gRPC to the upstream, JSON
//! back, as APISIX's plugin (`apisix/plugins/grpc-transcode.lua` and its `request` / `response` modules). The
//! mechanism lives in `sluice-grpc`; this file is the plugin around it.
//!
//! - access: the message is built from the JSON body, the form or the query (APISIX's rules), framed, and
//!   replaces the request body; the request becomes `POST /{service}/{method}` with `content-type:
//!   application/grpc` and the route's `deadline` as `grpc-timeout`. A request that cannot be encoded is a 400
//!   and nothing reaches the upstream.
//! - header_filter: a 2xx answer is re-typed as JSON. A unary call holds its head until the trailers arrived, so
//!   a `grpc-status` in the trailers becomes the HTTP status (APISIX can only map a trailers-only answer: it has
//!   sent the head already); a server-streaming call streams.
//! - body_filter: unary bodies are collected (up to `max_resp_body_size`) and decoded at the end; server-streamed
//!   messages are written as they arrive, as a JSON array (or NDJSON / SSE, `stream_format`). A client-streaming
//!   method takes a JSON array body as its stream (one message per element).
//!
//! Beyond APISIX: `use_http_annotations` serves every `google.api.http` binding of the proto's services on one
//! route (`service` then narrows it to one service; `method` is not needed), `auto_mapping` adds
//! `POST /{service}/{method}` for unannotated methods; proto imports resolve against other proto resources.
//! Upstreams must speak gRPC (`scheme: grpc` or `grpcs`).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_grpc::{
    GrpcStatus, HttpRequest, HttpRouter, PbOptions, StreamFormat, StreamResponse, TranscodeConfig,
    Transcoder,
};

use sluice_router::MatchRequest;

use crate::filters::BodyChunk;
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "grpc-transcode";
pub const PRIORITY: i32 = 506;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

/// APISIX's schema, plus Sluice's `use_http_annotations`, `auto_mapping` and `stream_format`.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "proto_id": {"anyOf": [
                {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-zA-Z0-9-_.]+$"},
                {"type": "integer", "minimum": 1}
            ]},
            "service": {"description": "the grpc service name", "type": "string"},
            "method": {"description": "the method name in the grpc service.", "type": "string"},
            "deadline": {"description": "deadline for grpc, millisecond", "type": "number", "default": 0},
            "pb_option": {
                "type": "array",
                "items": {"type": "string", "anyOf": [
                    {"type": "string", "enum": ["enum_as_name", "enum_as_value"]},
                    {"type": "string", "enum": ["int64_as_number", "int64_as_string", "int64_as_hexstring"]},
                    {"type": "string", "enum": ["auto_default_values", "no_default_values",
                                                "use_default_values", "use_default_metatable"]},
                    {"type": "string", "enum": ["enable_hooks", "disable_hooks"]}
                ]},
                "minItems": 1,
                "default": ["enum_as_name", "int64_as_number", "auto_default_values", "disable_hooks"]
            },
            "show_status_in_body": {"description": "show decoded grpc-status-details-bin in response body",
                                    "type": "boolean", "default": false},
            "status_detail_type": {"description": "the message type of the grpc-status-details-bin's details part",
                                   "type": "string"},
            "max_resp_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "use_http_annotations": {"description": "serve the proto's google.api.http bindings on this route",
                                     "type": "boolean", "default": false},
            "auto_mapping": {"description": "with use_http_annotations: POST /{service}/{method} for unannotated methods",
                             "type": "boolean", "default": false},
            "stream_format": {"description": "server-streaming responses: one JSON array, NDJSON or server-sent events",
                              "type": "string", "enum": ["json_array", "ndjson", "sse"], "default": "json_array"}
        },
        "additionalProperties": true,
        "required": ["proto_id"]
    })
}

fn check(v: &Value) -> Result<(), String> {
    Conf::parse(v).map(drop)
}

struct Conf {
    proto_id: String,
    service: Option<String>,
    method: Option<String>,
    config: TranscodeConfig,
    annotations: bool,
    auto_mapping: bool,
    format: StreamFormat,
}

impl Conf {
    fn parse(v: &Value) -> Result<Conf, String> {
        sluice_model::schema::validate(&schema(), v)?;
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let proto_id = match v.get("proto_id") {
            Some(Value::String(s)) => s.clone(),
            Some(n) => n.to_string(),
            None => unreachable!("required by the schema"),
        };
        let annotations = v.get("use_http_annotations").and_then(Value::as_bool) == Some(true);
        let (service, method) = (text("service"), text("method"));
        if !annotations {
            // APISIX requires both; with annotations the bindings name the methods.
            for (k, present) in [("service", service.is_some()), ("method", method.is_some())] {
                if !present {
                    return Err(format!("property \"{k}\" is required"));
                }
            }
        }
        let pb_options = match v.get("pb_option").and_then(Value::as_array) {
            None => PbOptions::default(),
            Some(list) => {
                let list: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
                PbOptions::parse(&list)?
            }
        };
        let config = TranscodeConfig {
            pb_options,
            deadline_ms: v.get("deadline").and_then(Value::as_f64).unwrap_or(0.0),
            show_status_in_body: v.get("show_status_in_body").and_then(Value::as_bool)
                == Some(true),
            status_detail_type: text("status_detail_type"),
            max_resp_body_size: v
                .get("max_resp_body_size")
                .and_then(Value::as_u64)
                .map_or(sluice_grpc::transcode::DEFAULT_MAX_RESP_BODY_SIZE, |n| {
                    n.min(usize::MAX as u64) as usize
                }),
        };
        let format = match v.get("stream_format").and_then(Value::as_str) {
            Some("ndjson") => StreamFormat::Ndjson,
            Some("sse") => StreamFormat::Sse,
            _ => StreamFormat::JsonArray,
        };
        Ok(Conf {
            proto_id,
            service,
            method,
            config,
            annotations,
            auto_mapping: v.get("auto_mapping").and_then(Value::as_bool) == Some(true),
            format,
        })
    }
}

enum Mode {
    /// APISIX's one route = one RPC.
    One(Transcoder),
    /// Every `google.api.http` binding of the proto (or of `service`).
    Annotated(HttpRouter),
}

struct GrpcTranscode {
    mode: Mode,
    format: StreamFormat,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c = Conf::parse(v)?;
    let proto = env.proto(&c.proto_id)?;
    let mode = if c.annotations {
        let services: Vec<&str> = c.service.as_deref().into_iter().collect();
        let router = HttpRouter::new(&proto, &services, c.auto_mapping, &c.config)?;
        if router.bindings().is_empty() {
            return Err(format!(
                "proto {} has no google.api.http bindings{}",
                c.proto_id,
                if c.auto_mapping {
                    " nor methods to map"
                } else {
                    " (set auto_mapping to bind methods by name)"
                }
            ));
        }
        Mode::Annotated(router)
    } else {
        let (service, method) = (c.service.unwrap_or_default(), c.method.unwrap_or_default());
        Mode::One(Transcoder::new(&proto, &service, &method, &c.config).map_err(|e| e.to_string())?)
    };
    Ok(Arc::new(GrpcTranscode {
        mode,
        format: c.format,
    }))
}

/// Per request: which method was called and what of its answer has been collected.
#[derive(Default)]
struct State {
    /// The request was transcoded (the response is then too).
    active: bool,
    /// Index of the binding in annotated mode.
    binding: usize,
    /// Unary: the collected body. At most `max_resp_body_size + 1` bytes are kept (the transcoder truncates).
    body: Vec<u8>,
    /// Server streaming: the incremental transcoder.
    stream: Option<StreamResponse>,
}

impl GrpcTranscode {
    fn key(&self) -> *const () {
        self as *const Self as *const ()
    }

    fn transcoder(&self, binding: usize) -> &Transcoder {
        match &self.mode {
            Mode::One(t) => t,
            Mode::Annotated(r) => r.bindings()[binding].transcoder(),
        }
    }
}

impl GrpcTranscode {
    /// The request message, framed, and the binding it was built for; `Err`: the answer instead.
    fn encode(&self, ctx: &Ctx<'_>) -> Result<(usize, Vec<u8>), Flow> {
        let head = ctx.req.head;
        let content_type = head
            .header("content-type")
            .and_then(|v| std::str::from_utf8(v).ok());
        // Route captures (`/users/:name`) fill the fields of the same name (a Sluice extension).
        let params: Vec<(&str, &str)> = ctx.params().collect();
        let req = HttpRequest {
            method: head.method_str(),
            content_type,
            query: head.query_str().unwrap_or("").as_bytes(),
            body: ctx.body.unwrap_or(&[]),
            params: &params,
        };
        let mut frame = Vec::with_capacity(64 + req.body.len());
        match &self.mode {
            Mode::One(t) => {
                let r = if t.method().is_client_streaming() {
                    t.encode_stream_request(&req, &mut frame)
                } else {
                    t.encode_request(&req, &mut frame)
                };
                r.map_err(|e| bad_request(&e.0))?;
                Ok((0, frame))
            }
            Mode::Annotated(router) => {
                let Some(m) = router.find(req.method, ctx.req.path()) else {
                    return Err(Flow::Respond(Response::message(
                        404,
                        "no gRPC method is bound to this method and path",
                    )));
                };
                m.binding
                    .encode_request(&m.captures, &req, &mut frame)
                    .map_err(|e| bad_request(&e.0))?;
                let i = router
                    .bindings()
                    .iter()
                    .position(|b| std::ptr::eq(b, m.binding))
                    .unwrap_or(0);
                Ok((i, frame))
            }
        }
    }
}

fn bad_request(msg: &str) -> Flow {
    Flow::Respond(Response::message(400, msg))
}

impl Plugin for GrpcTranscode {
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
        let (binding, frame) = match self.encode(ctx) {
            Ok(x) => x,
            Err(flow) => return flow,
        };
        let transcoder = self.transcoder(binding);
        ctx.edits.method = Some(Bytes::from_static(b"POST"));
        ctx.edits.uri = Some(Bytes::copy_from_slice(transcoder.grpc_path().as_bytes()));
        ctx.edits.set_headers.retain(|(n, _)| {
            !n.eq_ignore_ascii_case(b"content-type") && !n.eq_ignore_ascii_case(b"grpc-timeout")
        });
        ctx.edits.set_headers.push((
            Bytes::from_static(b"Content-Type"),
            Bytes::from_static(b"application/grpc"),
        ));
        if let Some(t) = transcoder.grpc_timeout() {
            ctx.edits.set_headers.push((
                Bytes::from_static(b"grpc-timeout"),
                Bytes::copy_from_slice(t.as_bytes()),
            ));
        }
        // The client's own framing and encodings describe the JSON, not the gRPC message.
        for h in ["content-encoding", "accept-encoding"] {
            ctx.edits
                .remove_headers
                .push(Bytes::from_static(h.as_bytes()));
        }
        ctx.replace_body(Bytes::from(frame));
        let streaming = transcoder.method().is_server_streaming();
        let format = self.format;
        let st = ctx.body_state::<State>(self.key());
        st.active = true;
        st.binding = binding;
        st.stream = streaming.then(|| transcoder.stream_response(format));
        Flow::Continue
    }

    fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        let key = self.key();
        let st = ctx.body_state::<State>(key);
        // As APISIX: an answer that is not a gRPC success on the HTTP level passes unchanged.
        if !st.active || status >= 300 {
            st.active = false;
            return;
        }
        let content_type = match &st.stream {
            Some(s) => s.content_type(),
            None => "application/json",
        };
        let unary = st.stream.is_none();
        ctx.resp.clear_header_as_body_modified();
        ctx.resp.set(
            Bytes::from_static(b"Content-Type"),
            Bytes::from_static(content_type.as_bytes()),
        );
        // gRPC's trailers mean nothing to an HTTP client once they are mapped into the status or the body.
        ctx.resp.drop_trailers = true;
        ctx.resp.hold_head = unary;
    }

    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        let key = self.key();
        let upstream_status = ctx.upstream_head().map_or(200, |h| h.status);
        let st = ctx.body_state::<State>(key);
        if !st.active {
            return;
        }
        let binding = st.binding;
        let t = self.transcoder(binding);
        if let Some(mut stream) = st.stream.take() {
            let mut out = Vec::new();
            if let Err(e) = stream.push(&chunk.data, &mut out) {
                tracing::warn!(error = %e, "grpc-transcode: server stream cannot be transcoded");
                chunk.data = Bytes::from(out);
                chunk.eof = true;
                st.active = false;
                return;
            }
            if chunk.eof {
                let grpc = grpc_status(ctx);
                let _ = stream.finish(&grpc, &mut out);
            } else {
                st.stream = Some(stream);
            }
            chunk.data = Bytes::from(out);
            return;
        }
        // Unary: keep one byte past the limit so the transcoder sees the truncation.
        let limit = t.max_resp_body_size().saturating_add(1);
        let room = limit.saturating_sub(st.body.len());
        st.body
            .extend_from_slice(&chunk.data[..chunk.data.len().min(room)]);
        chunk.data = Bytes::new();
        if !chunk.eof {
            return;
        }
        let body = std::mem::take(&mut st.body);
        let grpc = grpc_status(ctx);
        let mut resp = t.unary_response();
        resp.push(&body);
        let Some(out) = resp.finish(upstream_status, &grpc) else {
            return;
        };
        ctx.resp.status = Some(out.status);
        if let Some(ct) = out.content_type {
            ctx.resp
                .set(Bytes::from_static(b"Content-Type"), Bytes::from(ct));
        }
        chunk.data = Bytes::from(out.body);
    }
}

/// The call's `grpc-*` status: from the head of a trailers-only answer, else from the trailers.
fn grpc_status<'c>(ctx: &'c Ctx<'_>) -> GrpcStatus<'c> {
    let pick = |name: &str| {
        ctx.upstream_head()
            .and_then(|h| h.header(name))
            .or_else(|| ctx.upstream_trailer(name))
    };
    GrpcStatus {
        code: pick("grpc-status"),
        message: pick("grpc-message"),
        details_bin: pick("grpc-status-details-bin"),
    }
}
