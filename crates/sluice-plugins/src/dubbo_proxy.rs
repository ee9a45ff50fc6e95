//! dubbo-proxy (priority 507, access): HTTP to Dubbo2 in the data plane, as APISIX's plugin (which needs
//! Tengine's `mod_dubbo`; Sluice needs no special build). The route's upstream nodes are Dubbo providers.
//!
//! The call is APISIX's: `service_name` / `service_version` / `method` (default: the request path without its
//! leading `/`) with one `Map<String, Object>` argument holding the request headers (lower-cased names) and the
//! body (`byte[]` under `"body"`); the provider's returned map gives the status (`"status"`), the body (`"body"`)
//! and the response headers (every other entry). The wire is `sluice-dubbo`; the connections are per worker thread
//! and node, multiplexed (`plugin_attr.dubbo-proxy.upstream_multiplex_count`, default 32 calls in flight each).
//!
//! The proxy keeps the upstream logic ([`Ctx::call_upstream`]): the route's balancer picks the provider, one that
//! cannot be reached is reported to passive health and the next is tried, and the answer goes through the
//! response phases and the logs like any upstream's. Dubbo statuses map to HTTP (timeouts 504, service not found
//! 502, thread pool exhausted 503); a provider exception is a 500 naming it.

pub(crate) mod client;
mod params;

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_dubbo::invoke::{self, Service};
use sluice_dubbo::java::JavaType;
use sluice_dubbo::protocol::Message;
use sluice_router::MatchRequest;

use crate::registry::Entry;
use crate::{CallFailure, CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "dubbo-proxy";
pub const PRIORITY: i32 = 507;

/// APISIX's default `upstream_multiplex_count`.
pub(crate) const DEFAULT_MULTIPLEX: usize = 32;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "service_name": {"type": "string", "minLength": 1},
            "service_version": {"type": "string", "pattern": "^\\d+\\.\\d+\\.\\d+"},
            "method": {"type": "string", "minLength": 1},
            "generic": {"description": "Sluice: a generic call ($invoke) whose typed arguments are the JSON body {\"types\": ..., \"values\": ...} (dubbo-go-pixiu's form); the answer is the value as JSON",
                        "type": "boolean", "default": false},
            "group": {"description": "Sluice: the service group", "type": "string", "minLength": 1},
            "timeout": {"description": "Sluice: the provider-side timeout in milliseconds (the `timeout` attachment)",
                        "type": "integer", "minimum": 1},
            "params": params::schema(),
            "attachments": {"description": "Sluice: attachments every call carries",
                            "type": "object", "maxProperties": 64,
                            "additionalProperties": {"type": "string"}},
            "retries": {"description": "Sluice: how many times a call that failed in transit or timed out (also a provider timeout or full thread pool) is repeated, on a provider not tried yet when there is one, as Dubbo's failover does; only for idempotent methods",
                        "type": "integer", "minimum": 0, "maximum": 10, "default": 0}
        },
        "required": ["service_name", "service_version"]
    })
}

/// Attachments Sluice sets itself (or Dubbo reserves): a configured one may not replace them.
const RESERVED_ATTACHMENTS: &[&str] = &[
    "path",
    "interface",
    "version",
    "group",
    "timeout",
    "generic",
    "dubbo",
    "remote.application",
];

fn check(v: &Value) -> Result<(), String> {
    sluice_model::schema::validate(&schema(), v)?;
    if let Some(a) = v.get("attachments").and_then(Value::as_object) {
        if let Some(k) = a
            .keys()
            .find(|k| RESERVED_ATTACHMENTS.contains(&k.to_ascii_lowercase().as_str()))
        {
            return Err(format!(
                "attachment {k:?} is set by the plugin itself (service_name, service_version, group, timeout, generic)"
            ));
        }
    }
    params::compile(v.get("params").unwrap_or(&Value::Null)).map(|_| ())
}

struct DubboProxy {
    service: Service,
    method: Option<String>,
    multiplex: usize,
    generic: bool,
    /// Typed parameters from the request (`params` set: a generic call with these arguments).
    params: Option<Vec<params::Param>>,
    types: Vec<JavaType>,
    retries: u32,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let multiplex = env
        .plugin_attr
        .and_then(|a| a.get(NAME))
        .and_then(|a| a.get("upstream_multiplex_count"))
        .and_then(Value::as_u64)
        .map_or(DEFAULT_MULTIPLEX, |n| n.clamp(1, 4096) as usize);
    let mut service = Service::new(
        text("service_name").unwrap_or_default(),
        text("service_version").unwrap_or_default(),
    );
    service.group = text("group");
    service.timeout_ms = v.get("timeout").and_then(Value::as_u64);
    if let Some(a) = v.get("attachments").and_then(Value::as_object) {
        service.extra = a
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
    }
    let params = match v.get("params") {
        Some(p) => Some(params::compile(p)?),
        None => None,
    };
    let types = v
        .get("params")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| JavaType::parse(p.get("type")?.as_str()?).ok())
        .collect();
    Ok(Arc::new(DubboProxy {
        service,
        method: text("method"),
        multiplex,
        generic: params.is_some() || v.get("generic").and_then(Value::as_bool) == Some(true),
        params,
        types,
        retries: v.get("retries").and_then(Value::as_u64).unwrap_or(0) as u32,
    }))
}

/// The status and result of a provider's response (anything else is a failed call).
fn response_of(
    m: Message,
) -> Result<
    (
        sluice_dubbo::protocol::Status,
        Result<sluice_dubbo::protocol::Outcome, String>,
    ),
    CallFailure,
> {
    match m {
        Message::Response { status, result, .. } => Ok((status, result)),
        _ => Err(CallFailure {
            sent: true,
            timeout: false,
            retry: false,
            message: "dubbo: the provider answered with something else than a response".into(),
        }),
    }
}

/// The failure a `retries` repeat is asked with, when one applies: the call failed on the way (connection reset
/// or closed, no answer in time) or the provider answered a timeout or a full thread pool (Dubbo's failover
/// repeats those; an exception or a bad request is final).
fn retryable(addr: std::net::SocketAddr, r: &Result<Message, CallFailure>) -> Option<CallFailure> {
    use sluice_dubbo::protocol::Status;
    match r {
        // One that never reached the provider goes to the route's next node anyway (the proxy's failover, under
        // the upstream's `retries`).
        Err(f) if f.sent => Some(CallFailure {
            retry: true,
            ..f.clone()
        }),
        Err(_) => None,
        Ok(Message::Response { status, .. }) => {
            let timeout = matches!(*status, Status::CLIENT_TIMEOUT | Status::SERVER_TIMEOUT);
            (timeout || *status == Status::SERVER_THREADPOOL_EXHAUSTED_ERROR).then(|| CallFailure {
                sent: true,
                timeout,
                retry: true,
                message: format!("dubbo {addr}: the provider answered status {}", status.0),
            })
        }
        Ok(_) => None,
    }
}

/// The HTTP answer for a Dubbo answer (APISIX's mapping, see `sluice_dubbo::invoke::dubbo_proxy_response`).
fn answer(m: Message) -> Result<Response, CallFailure> {
    let (status, result) = response_of(m)?;
    match invoke::dubbo_proxy_response(result, status) {
        Ok(reply) => Ok(Response {
            status: reply.status,
            headers: reply
                .headers
                .into_iter()
                .map(|(n, v)| (Bytes::from(n), Bytes::from(v)))
                .collect(),
            body: Bytes::from(reply.body),
        }),
        Err(e) => {
            tracing::warn!(error = %e, "dubbo-proxy call failed");
            Ok(Response::message(e.http_status(), &e.to_string()))
        }
    }
}

/// A `$invoke` call from a `{"types": ..., "values": ...}` body (an empty body: a call without arguments).
fn generic_call(
    svc: &Service,
    method: &str,
    body: &[u8],
) -> Result<sluice_dubbo::protocol::Request, String> {
    let json: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?
    };
    let (types, values) = invoke::universality(&json).map_err(|e| e.0)?;
    invoke::generic_request(svc, method, &types, &values).map_err(|e| e.0)
}

/// A generic call's answer: its value as JSON.
fn generic_answer(m: Message) -> Result<Response, CallFailure> {
    let (status, result) = response_of(m)?;
    Ok(match invoke::result_json(result, status) {
        Ok(v) => Response {
            status: 200,
            headers: vec![(
                Bytes::from_static(b"Content-Type"),
                Bytes::from_static(b"application/json"),
            )],
            body: Bytes::from(v.to_string()),
        },
        Err(e) => {
            tracing::warn!(error = %e, "dubbo generic call failed");
            Response::message(e.http_status(), &e.to_string())
        }
    })
}

impl Plugin for DubboProxy {
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
        true
    }

    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let method = match &self.method {
            Some(m) => m.clone(),
            // A generic call may name its method in the query, as dubbo-go-pixiu's URLs do.
            None => match ctx
                .req
                .arg("method")
                .filter(|m| self.generic && !m.is_empty())
            {
                Some(m) => m.to_owned(),
                None => ctx.req.path().trim_start_matches('/').to_owned(),
            },
        };
        if method.is_empty() {
            return Flow::Respond(Response::message(
                400,
                "no dubbo method in the request path",
            ));
        }
        let req = if let Some(params) = &self.params {
            let body = ctx.body.unwrap_or(&[]);
            let json = if params::reads_body(params) && !body.iter().all(u8::is_ascii_whitespace) {
                match serde_json::from_slice::<Value>(body) {
                    Ok(j) => Some(j),
                    Err(e) => {
                        return Flow::Respond(Response::message(
                            400,
                            &format!("invalid JSON body: {e}"),
                        ))
                    }
                }
            } else {
                None
            };
            match params::args(params, ctx, json.as_ref()) {
                Ok(args) => {
                    invoke::generic_request_values(&self.service, &method, &self.types, args)
                }
                Err(msg) => return Flow::Respond(Response::message(400, &msg)),
            }
        } else if self.generic {
            match generic_call(&self.service, &method, ctx.body.unwrap_or(&[])) {
                Ok(r) => r,
                Err(msg) => return Flow::Respond(Response::message(400, &msg)),
            }
        } else {
            // The headers as they would go upstream: earlier plugins' edits applied (a tracing plugin's
            // traceparent / B3, proxy-rewrite's headers), as APISIX passes the rewritten request's headers.
            let edits = &ctx.edits;
            let headers = ctx
                .req
                .head
                .headers_iter()
                .filter(|(n, _)| !edits.drops(n))
                .chain(edits.set_headers.iter().map(|(n, v)| (&n[..], &v[..])))
                .filter_map(|(n, v)| Some((std::str::from_utf8(n).ok()?, v)));
            invoke::dubbo_proxy_request(&self.service, &method, headers, ctx.body.unwrap_or(&[]))
        };
        let req = Rc::new(req);
        let (multiplex, generic) = (self.multiplex, self.generic);
        // The proxy calls this once per try; what is left of `retries` is this request's.
        let left = Rc::new(std::cell::Cell::new(self.retries));
        ctx.call_upstream(Rc::new(move |addr, t| {
            let (req, left) = (req.clone(), left.clone());
            Box::pin(async move {
                let r = client::call(addr, &req, multiplex, t.connect, t.read).await;
                if left.get() > 0 {
                    if let Some(f) = retryable(addr, &r) {
                        // Repeated by the proxy, on another provider when there is one (failover).
                        left.set(left.get() - 1);
                        return Err(f);
                    }
                }
                let m = r?;
                if generic {
                    generic_answer(m)
                } else {
                    answer(m)
                }
            })
        }));
        Flow::Continue
    }
}
