//! The three call shapes an HTTP -> Dubbo gateway makes, and what their answers become.
//!
//! * APISIX `dubbo-proxy` (Tengine's `mod_dubbo`): one `Map<String, Object>` argument holding the request
//!   headers (lower-cased names, string values) and, when the request has one, the body as `byte[]` under
//!   `"body"`; the provider returns a map whose `"status"` is the HTTP status, `"body"` the body (bytes or
//!   string) and every other key a response header.
//! * A generic call: `$invoke(String method, String[] types, Object[] args)` with the `generic=true` attachment;
//!   arguments are JSON converted by their declared types, POJOs as untyped maps that the provider realises.
//! * A direct typed call: the method itself with its JVM descriptor; POJOs as maps typed with the class name.

use serde_json::Value as Json;

use crate::hessian::Value;
use crate::java::{descriptors, from_json, ConvertError, JavaType, Pojo};
use crate::protocol::{Outcome, Request, Status, DUBBO_VERSION};

/// The descriptor of `$invoke(String, String[], Object[])`.
pub const GENERIC_DESCRIPTOR: &str = "Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;";

/// Which provider service a call goes to, and the attachments every call carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The interface, e.g. `org.apache.dubbo.backend.DemoService` (also the `path`).
    pub interface: String,
    /// The service version (`0.0.0` when the provider declares none).
    pub version: String,
    pub group: Option<String>,
    /// Sent as the `timeout` attachment (milliseconds): the provider stops waiting after it.
    pub timeout_ms: Option<u64>,
    /// Sent as `remote.application`.
    pub application: Option<String>,
    /// More attachments, after the ones above (names that would replace one of them are the caller's to refuse).
    pub extra: Vec<(String, String)>,
}

impl Service {
    pub fn new(interface: impl Into<String>, version: impl Into<String>) -> Self {
        Service {
            interface: interface.into(),
            version: version.into(),
            group: None,
            timeout_ms: None,
            application: None,
            extra: Vec::new(),
        }
    }

    /// `path`, `remote.application`, `interface`, `version`, `group`, `timeout`: the order a Java consumer uses.
    pub fn attachments(&self) -> Vec<(String, Value)> {
        let mut a = Vec::with_capacity(6 + self.extra.len());
        a.push(("path".into(), Value::string(&self.interface)));
        if let Some(app) = &self.application {
            a.push(("remote.application".into(), Value::string(app)));
        }
        a.push(("interface".into(), Value::string(&self.interface)));
        if !self.version.is_empty() {
            a.push(("version".into(), Value::string(&self.version)));
        }
        if let Some(g) = &self.group {
            a.push(("group".into(), Value::string(g)));
        }
        if let Some(t) = self.timeout_ms {
            a.push(("timeout".into(), Value::String(t.to_string())));
        }
        for (k, v) in &self.extra {
            a.push((k.clone(), Value::string(v)));
        }
        a
    }

    fn request(&self, method: &str, param_types: String, args: Vec<Value>) -> Request {
        Request {
            dubbo_version: DUBBO_VERSION.into(),
            service: self.interface.clone(),
            version: self.version.clone(),
            method: method.into(),
            param_types,
            args,
            attachments: self.attachments(),
        }
    }
}

/// APISIX `dubbo-proxy`: headers (names lower-cased; a repeated header keeps its last value) and a non-empty
/// body (`byte[]` under `"body"`) in one `Map<String, Object>` argument.
pub fn dubbo_proxy_request<'h>(
    svc: &Service,
    method: &str,
    headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
    body: &[u8],
) -> Request {
    let mut entries: Vec<(Value, Value)> = Vec::new();
    if !body.is_empty() {
        entries.push((Value::string("body"), Value::Binary(body.to_vec())));
    }
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        let value = Value::String(String::from_utf8_lossy(value).into_owned());
        match entries.iter_mut().find(|(k, _)| k.as_str() == Some(&name)) {
            Some(e) => e.1 = value,
            None => entries.push((Value::String(name), value)),
        }
    }
    svc.request(method, "Ljava/util/Map;".into(), vec![Value::map(entries)])
}

/// Why a call's answer cannot become the HTTP response it should.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The provider answered a status other than OK.
    #[error("dubbo status {} ({}): {message}", .status.0, .status.name())]
    Status { status: Status, message: String },
    /// The method threw.
    #[error("dubbo provider threw {class}: {message}")]
    Exception { class: String, message: String },
    /// The answer does not have the expected shape.
    #[error("dubbo answer: {0}")]
    BadResult(String),
}

impl CallError {
    /// The HTTP status a gateway answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            CallError::Status { status, .. } => status.http_status(),
            CallError::Exception { .. } => 500,
            CallError::BadResult(_) => 502,
        }
    }
}

/// The HTTP response a `dubbo-proxy` answer becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

fn outcome(result: Result<Outcome, String>, status: Status) -> Result<Option<Value>, CallError> {
    match result {
        Err(message) => Err(CallError::Status { status, message }),
        Ok(Outcome::Null) => Ok(None),
        Ok(Outcome::Value(v)) => Ok(Some(v)),
        Ok(Outcome::Exception(e)) => {
            let (class, message) = e
                .exception_message()
                .unwrap_or(("java.lang.Throwable", None));
            Err(CallError::Exception {
                class: class.to_owned(),
                message: message.unwrap_or_default().to_owned(),
            })
        }
    }
}

fn header_name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn header_value_ok(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// The HTTP response for a `dubbo-proxy` answer: `"status"` (string or number, default 200), `"body"` (bytes or
/// string), every other entry a header. Entries that are not valid HTTP header names or values (a CR or LF, a
/// non-token name) are dropped, so a provider cannot split the response; a `null` value is dropped too.
pub fn dubbo_proxy_response(
    result: Result<Outcome, String>,
    status: Status,
) -> Result<HttpReply, CallError> {
    let Some(v) = outcome(result, status)? else {
        return Err(CallError::BadResult(
            "the provider returned null instead of a map".into(),
        ));
    };
    let Value::Map { entries, .. } = v else {
        return Err(CallError::BadResult(format!(
            "the provider returned {} instead of a map",
            kind(&v)
        )));
    };
    let mut reply = HttpReply {
        status: 200,
        headers: Vec::new(),
        body: Vec::new(),
    };
    for (k, v) in entries {
        let Value::String(k) = k else { continue };
        match k.as_str() {
            "status" => {
                let s = match &v {
                    Value::String(s) => s.trim().parse::<u16>().ok(),
                    Value::Int(i) => u16::try_from(*i).ok(),
                    Value::Long(l) => u16::try_from(*l).ok(),
                    _ => None,
                };
                reply.status = s
                    .filter(|s| (100..=599).contains(s))
                    .ok_or_else(|| CallError::BadResult(format!("bad status {v:?}")))?;
            }
            "body" => {
                reply.body = match v {
                    Value::Binary(b) => b,
                    Value::String(s) => s.into_bytes(),
                    Value::Null => Vec::new(),
                    other => crate::java::to_json(&other).to_string().into_bytes(),
                }
            }
            _ => {
                let text = match v {
                    Value::Null => continue,
                    Value::String(s) => s,
                    other => match crate::java::to_json(&other) {
                        Json::String(s) => s,
                        j => j.to_string(),
                    },
                };
                if header_name_ok(&k) && header_value_ok(&text) {
                    reply.headers.push((k, text));
                }
            }
        }
    }
    Ok(reply)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Int(_) | Value::Long(_) | Value::Double(_) => "a number",
        Value::Date(_) => "a date",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::List { .. } => "a list",
        Value::Map { .. } => "a map",
        Value::Object { .. } => "an object",
        Value::Ref(_) => "a reference",
    }
}

fn convert_args(types: &[JavaType], args: &[Json], pojo: Pojo) -> Result<Vec<Value>, ConvertError> {
    if types.len() != args.len() {
        return Err(ConvertError(format!(
            "{} argument(s) given for {} declared parameter type(s)",
            args.len(),
            types.len()
        )));
    }
    types
        .iter()
        .zip(args)
        .enumerate()
        .map(|(i, (t, a))| {
            from_json(a, t, pojo)
                .map_err(|e| ConvertError(format!("argument {} ({}): {e}", i + 1, t.java_name())))
        })
        .collect()
}

/// A generic call of `method` with already converted arguments.
pub fn generic_request_values(
    svc: &Service,
    method: &str,
    types: &[JavaType],
    args: Vec<Value>,
) -> Request {
    let names = types.iter().map(|t| Value::String(t.java_name())).collect();
    let mut req = svc.request(
        "$invoke",
        GENERIC_DESCRIPTOR.into(),
        vec![
            Value::string(method),
            Value::List {
                typ: Some("[string".into()),
                items: names,
            },
            Value::List {
                typ: Some("[object".into()),
                items: args,
            },
        ],
    );
    req.attachments
        .push(("generic".into(), Value::string("true")));
    req
}

/// A generic call: JSON arguments converted by their declared types (the counts must match; none is a no-arg
/// call).
pub fn generic_request(
    svc: &Service,
    method: &str,
    types: &[JavaType],
    args: &[Json],
) -> Result<Request, ConvertError> {
    let values = convert_args(types, args, Pojo::Untyped)?;
    Ok(generic_request_values(svc, method, types, values))
}

/// A direct call of `method` with its declared parameter types.
pub fn direct_request(
    svc: &Service,
    method: &str,
    types: &[JavaType],
    args: &[Json],
) -> Result<Request, ConvertError> {
    let values = convert_args(types, args, Pojo::Typed)?;
    Ok(svc.request(method, descriptors(types), values))
}

/// Reads Pixiu's "universality" body `{"types": ..., "values": ...}`: `types` an array of type names or one
/// comma-separated string, `values` an array (one per type) or, for a single type, the value itself. Both absent
/// or empty is a no-arg call.
pub fn universality(body: &Json) -> Result<(Vec<JavaType>, Vec<Json>), ConvertError> {
    let Json::Object(o) = body else {
        return Err(ConvertError(
            "the body must be an object with \"types\" and \"values\"".into(),
        ));
    };
    let types: Vec<JavaType> = match o.get("types") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::String(s)) => s
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .map(JavaType::parse)
            .collect::<Result<_, _>>()?,
        Some(Json::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .ok_or_else(|| ConvertError(format!("\"types\" item {t} is not a string")))
                    .and_then(JavaType::parse)
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ConvertError(format!(
                "\"types\" must be a string or an array, got {other}"
            )))
        }
    };
    let values = match o.get("values") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(a)) if types.len() == 1 => {
            // One array-typed parameter: `[1, 2]` is that array, `[[1, 2]]` the list of arguments.
            let collection = matches!(types[0], JavaType::Array(_) | JavaType::List(_));
            if collection && !(a.len() == 1 && a[0].is_array()) {
                vec![Json::Array(a.clone())]
            } else {
                a.clone()
            }
        }
        Some(Json::Array(a)) => a.clone(),
        Some(v) => vec![v.clone()],
    };
    Ok((types, values))
}

/// The JSON of a generic or direct call's answer (see [`crate::java`] for the mapping); `null` for a null result.
pub fn result_json(result: Result<Outcome, String>, status: Status) -> Result<Json, CallError> {
    Ok(outcome(result, status)?.map_or(Json::Null, |v| crate::java::to_json(&v)))
}
