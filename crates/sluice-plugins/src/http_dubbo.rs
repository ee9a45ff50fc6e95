//! http-dubbo (priority 504, before_proxy): APISIX's HTTP to Dubbo2 with the fastjson serialization. The body is
//! a JSON array of the arguments (or, `serialized`, the argument lines themselves), `params_type_desc` their JVM
//! descriptor; the answer is the returned value's JSON with a 200. The route's upstream nodes are the providers.
//!
//! APISIX opens a connection per request; Sluice sends the calls over dubbo-proxy's per-worker multiplexed
//! connections ([`crate::dubbo_proxy::client`]), so the node choice, failover and passive health are the proxy's
//! ([`Ctx::call_upstream`]). A body that is not JSON is a 400 and nothing is sent (APISIX fails inside the plugin).
//!
//! Sluice extension: `serialization_protocol: "hessian2"` sends the same call in Dubbo's default serialization, so
//! providers without fastjson (dubbo-go, a Java provider without the fastjson module) are reachable. The body is
//! then a JSON array of the arguments, each converted to the Hessian value of its `params_type_desc` type (parsed
//! at config time: `J` a long, `Ljava/lang/String;` a string, a class a map of that class, ...); the answer is
//! the returned value as JSON (see `sluice_dubbo::java` for the mapping).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_dubbo::fastjson::{self, Answer, SERIALIZATION_FASTJSON};
use sluice_dubbo::invoke::{self, Service};
use sluice_dubbo::java::{self, JavaType};
use sluice_dubbo::protocol::{self, Message, Status, DEFAULT_MAX_PAYLOAD};

use crate::dubbo_proxy::client;
use crate::registry::Entry;
use crate::{CallFailure, CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "http-dubbo";
pub const PRIORITY: i32 = 504;

/// Requests in flight per provider connection: dubbo-proxy's default, since both share its connections.
const MULTIPLEX: usize = crate::dubbo_proxy::DEFAULT_MULTIPLEX;

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
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "service_name": {"type": "string", "minLength": 1},
            "service_version": {"type": "string", "pattern": "^\\d+\\.\\d+\\.\\d+", "default": "0.0.0"},
            "method": {"type": "string", "minLength": 1},
            "params_type_desc": {"type": "string", "default": ""},
            "serialization_header_key": {"type": "string"},
            "serialized": {"type": "boolean", "default": false},
            "connect_timeout": {"type": "number", "default": 6000},
            "read_timeout": {"type": "number", "default": 6000},
            "send_timeout": {"type": "number", "default": 6000},
            // Sluice extension (APISIX speaks fastjson only).
            "serialization_protocol": {"type": "string", "enum": ["fastjson", "hessian2"], "default": "fastjson"}
        },
        "required": ["service_name", "method"]
    })
}

fn check(v: &Value) -> Result<(), String> {
    sluice_model::schema::validate(&schema(), v)?;
    if v.get("serialization_protocol").and_then(Value::as_str) == Some("hessian2") {
        if v.get("serialized").and_then(Value::as_bool) == Some(true)
            || v.get("serialization_header_key").is_some()
        {
            return Err(
                "\"serialized\" and \"serialization_header_key\" are fastjson's: \
                        a hessian2 body is a JSON array of the arguments"
                    .into(),
            );
        }
        let desc = v
            .get("params_type_desc")
            .and_then(Value::as_str)
            .unwrap_or("");
        java::parse_descriptors(desc).map_err(|e| format!("params_type_desc: {e}"))?;
    }
    Ok(())
}

struct HttpDubbo {
    service: String,
    version: String,
    method: String,
    desc: String,
    serialized: bool,
    header_key: Option<String>,
    max_body: usize,
    connect: Duration,
    read: Duration,
    /// `serialization_protocol: hessian2`: the parameter types and the call's service (attachments).
    hessian2: Option<(Vec<JavaType>, Service)>,
}

fn millis(v: &Value, k: &str) -> Duration {
    let ms = v.get(k).and_then(Value::as_f64).unwrap_or(6000.0);
    Duration::from_secs_f64((ms / 1000.0).clamp(0.001, 86_400.0))
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let text = |k: &str, d: &str| v.get(k).and_then(Value::as_str).unwrap_or(d).to_owned();
    Ok(Arc::new(HttpDubbo {
        service: text("service_name", ""),
        version: text("service_version", "0.0.0"),
        method: text("method", ""),
        desc: text("params_type_desc", ""),
        serialized: v.get("serialized").and_then(Value::as_bool) == Some(true),
        header_key: v
            .get("serialization_header_key")
            .and_then(Value::as_str)
            .map(str::to_ascii_lowercase),
        max_body: v
            .get("max_req_body_size")
            .and_then(Value::as_u64)
            .map_or(67_108_864, |n| n.min(usize::MAX as u64) as usize),
        connect: millis(v, "connect_timeout"),
        read: millis(v, "read_timeout"),
        hessian2: if v.get("serialization_protocol").and_then(Value::as_str) == Some("hessian2") {
            let desc = v
                .get("params_type_desc")
                .and_then(Value::as_str)
                .unwrap_or("");
            let types =
                java::parse_descriptors(desc).map_err(|e| format!("params_type_desc: {e}"))?;
            Some((
                types,
                Service::new(text("service_name", ""), text("service_version", "0.0.0")),
            ))
        } else {
            None
        },
    }))
}

/// The HTTP answer for a provider's answer.
fn answer(status: Status, flags: u8, body: &[u8]) -> Response {
    if status != Status::OK {
        let msg = String::from_utf8_lossy(body);
        let msg = msg.trim_matches(|c: char| c == '"' || c.is_whitespace());
        return Response::message(
            status.http_status(),
            &format!("dubbo status {} ({}): {msg}", status.0, status.name()),
        );
    }
    if flags & sluice_dubbo::protocol::SERIALIZATION_MASK != SERIALIZATION_FASTJSON {
        return Response::message(502, "dubbo: the provider did not answer in fastjson");
    }
    match fastjson::decode_response(body) {
        Ok(Answer::Value(v)) => Response {
            status: 200,
            headers: vec![(
                Bytes::from_static(b"Content-Type"),
                Bytes::from_static(b"application/json"),
            )],
            body: Bytes::from(v),
        },
        Ok(Answer::Null) => Response {
            status: 200,
            headers: Vec::new(),
            body: Bytes::new(),
        },
        Ok(Answer::Exception { class, message }) => Response::message(
            500,
            &format!(
                "dubbo provider threw {}: {}",
                class.as_deref().unwrap_or("an exception"),
                message.unwrap_or_default()
            ),
        ),
        Err(e) => Response::message(502, &format!("dubbo answer: {e}")),
    }
}

/// The declared class that `json` (an argument of type `t`) names another class for, if it does.
fn other_class<'t>(t: &'t JavaType, json: &Value) -> Option<&'t str> {
    match (t, json) {
        (JavaType::Pojo(class), Value::Object(o)) => o
            .get("class")
            .filter(|named| named.as_str() != Some(class))
            .map(|_| class.as_str()),
        (JavaType::Array(elem), Value::Array(items)) => {
            items.iter().find_map(|item| other_class(elem, item))
        }
        _ => None,
    }
}

/// The HTTP answer for a provider's hessian2 answer: the value as JSON (null: an empty 200, as with fastjson).
fn hessian2_answer(f: &protocol::Frame) -> Response {
    let (status, result) = match protocol::decode(f) {
        Ok(Message::Response { status, result, .. }) => (status, result),
        Ok(_) => {
            return Response::message(
                502,
                "dubbo: the provider answered with something else than a response",
            )
        }
        Err(e) => return Response::message(502, &format!("dubbo answer: {e}")),
    };
    match invoke::result_json(result, status) {
        Ok(Value::Null) => Response {
            status: 200,
            headers: Vec::new(),
            body: Bytes::new(),
        },
        Ok(v) => Response {
            status: 200,
            headers: vec![(
                Bytes::from_static(b"Content-Type"),
                Bytes::from_static(b"application/json"),
            )],
            body: Bytes::from(v.to_string()),
        },
        Err(e) => Response::message(e.http_status(), &e.to_string()),
    }
}

impl HttpDubbo {
    /// The hessian2 request frame (id 0) for a body holding the JSON array of the arguments; the HTTP answer
    /// when the body does not fit the declared types.
    fn hessian2_frame(
        &self,
        types: &[JavaType],
        svc: &Service,
        body: &[u8],
    ) -> Result<Vec<u8>, Response> {
        let args: Vec<Value> = if body.iter().all(u8::is_ascii_whitespace) {
            Vec::new()
        } else {
            match serde_json::from_slice(body) {
                Ok(Value::Array(a)) => a,
                Ok(_) => {
                    return Err(Response::message(
                        400,
                        "the body must be a JSON array of the arguments",
                    ))
                }
                Err(e) => return Err(Response::message(400, &format!("invalid JSON body: {e}"))),
            }
        };
        // A POJO goes as a map typed with its declared class; the body may not name another one (a `"class"` key
        // would otherwise choose the class the provider's Hessian instantiates), in an array of POJOs neither.
        if let Some(class) = types.iter().zip(&args).find_map(|(t, a)| other_class(t, a)) {
            return Err(Response::message(
                400,
                &format!("an argument declared {class} may not name another class"),
            ));
        }
        let req = invoke::direct_request(svc, &self.method, types, &args)
            .map_err(|e| Response::message(400, &e.0))?;
        let mut frame = Vec::new();
        protocol::encode_request(&req, 0, DEFAULT_MAX_PAYLOAD, &mut frame)
            .map_err(|e| Response::message(413, &e.to_string()))?;
        Ok(frame)
    }
}

impl Plugin for HttpDubbo {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::BeforeProxy])
    }
    fn needs_body(&self) -> bool {
        true
    }

    fn before_proxy(&self, ctx: &mut Ctx<'_>) -> Flow {
        let body = ctx.body.unwrap_or(&[]);
        if body.len() > self.max_body {
            return Flow::Respond(Response::message(413, "request body too large"));
        }
        if let Some((types, svc)) = &self.hessian2 {
            let frame = match self.hessian2_frame(types, svc, body) {
                Ok(f) => Rc::new(f),
                Err(r) => return Flow::Respond(r),
            };
            let (connect, read) = (self.connect, self.read);
            ctx.call_upstream(Rc::new(move |addr, _t| {
                let frame = frame.clone();
                Box::pin(async move {
                    let encode = |id: u64, out: &mut Vec<u8>| {
                        out.extend_from_slice(&frame);
                        out[4..12].copy_from_slice(&id.to_be_bytes());
                        Ok(())
                    };
                    let f = client::call_raw(addr, &encode, MULTIPLEX, connect, read).await?;
                    Ok::<_, CallFailure>(hessian2_answer(&f))
                })
            }));
            return Flow::Continue;
        }
        let serialized = match &self.header_key {
            Some(k) => ctx.req.head.header(k) == Some(b"true".as_slice()),
            None => self.serialized,
        };
        let args = if serialized {
            fastjson::args_serialized(body)
        } else {
            match fastjson::args_from_body(body) {
                Ok(a) => a,
                Err(msg) => return Flow::Respond(Response::message(400, &msg)),
            }
        };
        let mut frame = Vec::new();
        let call = fastjson::Call {
            service: &self.service,
            version: &self.version,
            method: &self.method,
            params_type_desc: &self.desc,
            args: &args,
        };
        // Encoded once with id 0; each try writes its own id into the header.
        if let Err(e) = fastjson::encode_request(&call, 0, DEFAULT_MAX_PAYLOAD, &mut frame) {
            return Flow::Respond(Response::message(413, &e.to_string()));
        }
        let frame = Rc::new(frame);
        let (connect, read) = (self.connect, self.read);
        ctx.call_upstream(Rc::new(move |addr, _t| {
            let frame = frame.clone();
            Box::pin(async move {
                let encode = |id: u64, out: &mut Vec<u8>| {
                    out.extend_from_slice(&frame);
                    out[4..12].copy_from_slice(&id.to_be_bytes());
                    Ok(())
                };
                let f = client::call_raw(addr, &encode, MULTIPLEX, connect, read).await?;
                Ok::<_, CallFailure>(answer(f.header.status, f.header.flags, &f.body))
            })
        }));
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hessian2_config_is_checked() {
        let base =
            json!({"service_name": "a.B", "method": "m", "serialization_protocol": "hessian2"});
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            c[k] = v;
            check(&c)
        };
        assert!(check(&base).is_ok());
        assert!(with("params_type_desc", json!("ILjava/lang/String;[J")).is_ok());
        assert!(with("params_type_desc", json!("Ljava/lang/String")).is_err());
        assert!(with("params_type_desc", json!("Q")).is_err());
        assert!(with("params_type_desc", json!("[")).is_err());
        assert!(with("serialized", json!(true)).is_err());
        assert!(with("serialization_header_key", json!("X-S")).is_err());
        assert!(with("serialization_protocol", json!("kryo")).is_err());
        // fastjson keeps APISIX's schema: any descriptor text, `serialized` allowed.
        let mut f = base.clone();
        f["serialization_protocol"] = json!("fastjson");
        f["serialized"] = json!(true);
        f["params_type_desc"] = json!("Q");
        assert!(check(&f).is_ok());
    }

    #[test]
    fn a_body_cannot_name_another_class_than_the_declared_one() {
        let types = java::parse_descriptors("Lorg/x/User;[[Lorg/x/User;I").unwrap();
        let other = |args: Value| {
            let Value::Array(a) = args else { panic!() };
            types
                .iter()
                .zip(&a)
                .find_map(|(t, a)| other_class(t, a))
                .map(str::to_owned)
        };
        let user = json!({"name": "a"});
        assert_eq!(other(json!([user, [[user]], 1])), None);
        assert_eq!(
            other(json!([{"class": "org.x.User"}, [[{"class": "org.x.User"}]], 1])),
            None
        );
        let evil = json!({"class": "java.lang.ProcessBuilder"});
        assert_eq!(other(json!([evil, [], 1])).as_deref(), Some("org.x.User"));
        assert_eq!(
            other(json!([user, [[user, evil]], 1])).as_deref(),
            Some("org.x.User")
        );
    }
}
