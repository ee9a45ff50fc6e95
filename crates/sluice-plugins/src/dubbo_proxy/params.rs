//! Typed positional parameters of a generic call, each taken from the request: `query.NAME`, `header.NAME`,
//! `path.NAME` (a route capture), `body` (the whole JSON body) or `body.a.b.0` (a field of it), coerced to its
//! declared Java type. Text sources (query, header, path) are read as the value itself for scalar types
//! (primitives and their boxes, `String`, `BigDecimal` / `BigInteger`, `Date`) and as JSON for the others (a
//! `java.lang.Object` that is not JSON stays a string). A missing value is the parameter's `default` when it has
//! one, else the request is refused (400) and nothing is sent.

use serde_json::Value as Json;
use sluice_dubbo::hessian::Value;
use sluice_dubbo::java::{from_json, JavaType, Pojo};

use crate::Ctx;

enum Source {
    Query(String),
    Header(String),
    Path(String),
    /// The body's field at this path (empty: the whole body).
    Body(Vec<String>),
}

pub(super) struct Param {
    ty: JavaType,
    from: Source,
    /// Where it came from, as configured (for error messages).
    label: String,
    default: Option<Json>,
}

/// The `params` item schema.
pub(super) fn schema() -> Json {
    serde_json::json!({
        "description": "Sluice: typed positional parameters of a generic call, in order",
        "type": "array",
        "maxItems": 64,
        "items": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "minLength": 1},
                "from": {"type": "string", "pattern": "^(query\\.[^.].*|header\\.[!#$%&'*+.^_`|~0-9A-Za-z-]+|path\\.[^.].*|body(\\..+)?)$"},
                "default": {}
            },
            "required": ["type", "from"],
            "additionalProperties": false
        }
    })
}

pub(super) fn compile(v: &Json) -> Result<Vec<Param>, String> {
    let Some(items) = v.as_array() else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let text = |k: &str| p.get(k).and_then(Json::as_str).unwrap_or_default();
            let ty = JavaType::parse(text("type")).map_err(|e| format!("params[{i}].type: {e}"))?;
            let label = text("from").to_owned();
            let from = match label.split_once('.') {
                Some(("query", n)) => Source::Query(n.to_owned()),
                Some(("header", n)) => Source::Header(n.to_ascii_lowercase()),
                Some(("path", n)) => Source::Path(n.to_owned()),
                Some(("body", path)) => Source::Body(path.split('.').map(str::to_owned).collect()),
                None if label == "body" => Source::Body(Vec::new()),
                _ => return Err(format!("params[{i}].from: unknown source {label:?}")),
            };
            let default = p.get("default").cloned();
            if let Some(d) = &default {
                from_json(d, &ty, Pojo::Untyped)
                    .map_err(|e| format!("params[{i}].default: {e}"))?;
            }
            Ok(Param {
                ty,
                from,
                label,
                default,
            })
        })
        .collect()
}

/// Whether any parameter reads the body (then it must be JSON).
pub(super) fn reads_body(params: &[Param]) -> bool {
    params.iter().any(|p| matches!(p.from, Source::Body(_)))
}

fn scalar(ty: &JavaType) -> bool {
    matches!(
        ty,
        JavaType::Primitive(_)
            | JavaType::Boxed(_)
            | JavaType::String
            | JavaType::BigDecimal
            | JavaType::BigInteger
            | JavaType::Date
    )
}

/// Query values are form-encoded: `+` is a space, then percent-decoding; anything not UTF-8 is refused.
fn query_value(raw: &str) -> Result<String, String> {
    let plus = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "is not UTF-8 once decoded".to_owned())
}

fn field<'j>(mut v: &'j Json, path: &[String]) -> Option<&'j Json> {
    for k in path {
        v = match v {
            Json::Object(o) => o.get(k)?,
            Json::Array(a) => a.get(k.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// The arguments of a call, in order; an error is the 400's message.
pub(super) fn args(
    params: &[Param],
    ctx: &Ctx<'_>,
    body: Option<&Json>,
) -> Result<Vec<Value>, String> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let fail = |e: &dyn std::fmt::Display| {
                format!(
                    "parameter {} ({} from {}): {e}",
                    i + 1,
                    p.ty.java_name(),
                    p.label
                )
            };
            let text = match &p.from {
                Source::Query(n) => ctx
                    .req
                    .arg(n)
                    .map(query_value)
                    .transpose()
                    .map_err(|e| fail(&e))?,
                Source::Header(n) => ctx
                    .req
                    .head
                    .header(n)
                    .map(|v| {
                        std::str::from_utf8(v)
                            .map(str::to_owned)
                            .map_err(|_| fail(&"the header is not UTF-8"))
                    })
                    .transpose()?,
                Source::Path(n) => ctx.param(n).map(str::to_owned),
                Source::Body(_) => None,
            };
            let json: Option<Json> = match (&p.from, text) {
                (Source::Body(path), _) => body.and_then(|b| field(b, path)).cloned(),
                (_, None) => None,
                (_, Some(s)) if scalar(&p.ty) => Some(Json::String(s)),
                (_, Some(s)) => match serde_json::from_str::<Json>(&s) {
                    Ok(j) => Some(j),
                    Err(_) if p.ty == JavaType::Object => Some(Json::String(s)),
                    Err(e) => return Err(fail(&format!("not JSON ({e})"))),
                },
            };
            let json = match (json, &p.default) {
                (Some(j), _) => j,
                (None, Some(d)) => d.clone(),
                (None, None) => return Err(fail(&"missing")),
            };
            from_json(&json, &p.ty, Pojo::Untyped).map_err(|e| fail(&e))
        })
        .collect()
}
