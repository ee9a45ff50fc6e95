//! request-validation (priority 2800, rewrite): validates the request headers (lower-cased names, string values)
//! against `header_schema`, and the request body against `body_schema`: an `application/x-www-form-urlencoded`
//! body as its decoded arguments, any other as JSON. A failure answers `rejected_code` (400) with `rejected_msg`
//! or the error text (the decoder's, cjson-shaped, or the validator's), as plain text like APISIX. With
//! `body_schema` the plugin asks the proxy for the whole body ([`Plugin::needs_body`]), so only its routes buffer
//! bodies. Not here: reading the body (the proxy), re-encoding the validated JSON (the original bytes go upstream).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "request-validation";
pub const PRIORITY: i32 = 2800;

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
            "header_schema": {"type": "object"},
            "body_schema": {"type": "object"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 400},
            "rejected_msg": {"type": "string", "minLength": 1, "maxLength": 256}
        },
        "anyOf": [{"required": ["header_schema"]}, {"required": ["body_schema"]}]
    })
}

fn check(v: &Value) -> Result<(), String> {
    sluice_model::schema::validate(&schema(), v)
}

struct RequestValidation {
    header_schema: Option<Value>,
    body_schema: Option<Value>,
    code: u16,
    msg: Option<Bytes>,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    Ok(Arc::new(RequestValidation {
        header_schema: v.get("header_schema").cloned(),
        body_schema: v.get("body_schema").cloned(),
        code: v
            .get("rejected_code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(400),
        msg: v
            .get("rejected_msg")
            .and_then(Value::as_str)
            .map(|m| Bytes::from(m.to_owned())),
    }))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `ngx.decode_args`: `k=v` pairs (url-decoded), a repeated key becomes an array, a bare key is `true`.
pub(crate) fn form_args(body: &[u8]) -> Value {
    let text = String::from_utf8_lossy(body);
    let mut m = Map::new();
    for kv in text.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = match kv.split_once('=') {
            Some((k, v)) => (percent_decode(k), Value::String(percent_decode(v))),
            None => (percent_decode(kv), Value::Bool(true)),
        };
        match m.get_mut(&k) {
            Some(Value::Array(a)) => a.push(v),
            Some(first) => *first = Value::Array(vec![first.take(), v]),
            None => {
                m.insert(k, v);
            }
        }
    }
    Value::Object(m)
}

/// A JSON decode error in lua-cjson's words (`Expected value but found ... at character N`), which APISIX
/// returns as the body.
pub(crate) fn cjson_error(body: &[u8], e: &serde_json::Error) -> String {
    // serde reports line/column; cjson a 1-based byte offset.
    let mut offset = 0;
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        if i + 1 == e.line() {
            offset += e.column().max(1);
            break;
        }
        offset += line.len() + 1;
    }
    let found = if e.is_eof() {
        offset = body.len() + 1;
        "T_END"
    } else {
        "invalid token"
    };
    let msg = e.to_string();
    let expected = [
        ("key must be a string", "object key string"),
        ("trailing characters", "the end"),
        ("EOF while parsing a list", "comma or array end"),
        ("expected `,` or `]`", "comma or array end"),
        ("EOF while parsing an object", "comma or object end"),
        ("expected `,` or `}`", "comma or object end"),
        ("expected `:`", "colon"),
    ]
    .iter()
    .find(|(serde, _)| msg.starts_with(serde))
    .map_or("value", |(_, cjson)| cjson);
    format!("Expected {expected} but found {found} at character {offset}")
}

impl RequestValidation {
    fn reject(&self, err: String) -> Flow {
        let mut r = Response::status(self.code);
        r.body = self.msg.clone().unwrap_or_else(|| Bytes::from(err));
        Flow::Respond(r)
    }

    fn headers(ctx: &Ctx<'_>) -> Map<String, Value> {
        let mut headers = Map::new();
        for (n, v) in ctx.req.head.headers_iter() {
            let name = String::from_utf8_lossy(n).to_ascii_lowercase();
            let value = Value::String(String::from_utf8_lossy(v).into_owned());
            match headers.get_mut(&name) {
                Some(Value::Array(a)) => a.push(value),
                Some(first) => *first = Value::Array(vec![first.take(), value]),
                None => {
                    headers.insert(name, value);
                }
            }
        }
        headers
    }
}

impl Plugin for RequestValidation {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Rewrite])
    }
    fn needs_body(&self) -> bool {
        self.body_schema.is_some()
    }
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        if let Some(schema) = &self.header_schema {
            let headers = Value::Object(Self::headers(ctx));
            if let Err(e) = sluice_model::schema::validate(schema, &headers) {
                return self.reject(e);
            }
        }
        let Some(schema) = &self.body_schema else {
            return Flow::Continue;
        };
        let body = ctx.body.unwrap_or_default();
        let form =
            ctx.req.head.header("content-type") == Some(&b"application/x-www-form-urlencoded"[..]);
        let value = if form {
            form_args(body)
        } else {
            match serde_json::from_slice::<Value>(body) {
                Ok(v) => v,
                Err(e) => return self.reject(cjson_error(body, &e)),
            }
        };
        match sluice_model::schema::validate(schema, &value) {
            Ok(()) => Flow::Continue,
            Err(e) => self.reject(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn form_bodies_decode_as_ngx_decode_args() {
        assert_eq!(
            super::form_args(b"a=1&b=x+y%21&a=2&flag"),
            json!({"a": ["1", "2"], "b": "x y!", "flag": true})
        );
        assert_eq!(super::percent_decode("%zz%4"), "%zz%4");
        assert_eq!(super::percent_decode("%é%41"), "%éA");
    }

    #[test]
    fn json_errors_read_like_cjson() {
        let err = |b: &[u8]| {
            let e = serde_json::from_slice::<serde_json::Value>(b).unwrap_err();
            super::cjson_error(b, &e)
        };
        assert_eq!(err(b""), "Expected value but found T_END at character 1");
        assert_eq!(
            err(b"{\"a\": 1"),
            "Expected comma or object end but found T_END at character 8"
        );
        assert_eq!(
            err(b"[1 2]"),
            "Expected comma or array end but found invalid token at character 4"
        );
        assert_eq!(
            err(b"{a:1}"),
            "Expected object key string but found invalid token at character 2"
        );
        assert_eq!(
            err(b"[1] x"),
            "Expected the end but found invalid token at character 5"
        );
    }
}
