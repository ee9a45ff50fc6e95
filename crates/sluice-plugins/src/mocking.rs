//! mocking (priority 10900, access), as APISIX's: answers the request itself and never contacts the upstream.
//! The body is `response_example` (its `$var`s resolved per request) or, without one, a value generated from
//! `response_schema` the way APISIX's generator does (a property's `example` when it has the right type, else a
//! random value: strings of 1-10 lowercase letters, numbers in [0, 10000), integers in [1, 10000], arrays of 1-3
//! items, objects with every property), encoded as JSON (`application/json`, `text/plain`) or as XML under a
//! `<data>` root (`application/xml`, `text/xml`). `content_type` must be one of APISIX's five types (parameters
//! after the last `;` are allowed). `delay` (seconds) is slept asynchronously before the answer; `x-mock-by:
//! APISIX/<version>` is added unless `with_mock_header` is false; `response_headers` are added with their `$var`s
//! resolved. Not here: the sleep and the writing of the answer (the proxy does both).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use serde_json::{json, Map, Value};

use crate::registry::Entry;
use crate::util::Template;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "mocking";
pub const PRIORITY: i32 = 10900;

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
            "delay": {"type": "integer", "default": 0},
            "response_status": {"type": "integer", "default": 200, "minimum": 100},
            "content_type": {"type": "string", "default": "application/json;charset=utf8"},
            "response_example": {"type": "string"},
            "response_schema": {"type": "object"},
            "with_mock_header": {"type": "boolean", "default": true},
            "response_headers": {
                "type": "object",
                "minProperties": 1,
                "patternProperties": {"^[^:]+$": {"oneOf": [{"type": "string"}, {"type": "number"}]}}
            }
        },
        "anyOf": [{"required": ["response_example"]}, {"required": ["response_schema"]}]
    })
}

const SUPPORTED_TYPES: [&str; 5] = [
    "application/xml",
    "application/json",
    "text/plain",
    "text/html",
    "text/xml",
];

/// APISIX's `parse_content_type`: the part before the last `;` when the value is printable ASCII with one.
fn media_type(ct: &str) -> &str {
    match ct.rsplit_once(';') {
        Some((t, _)) if ct.bytes().all(|b| (b' '..=b'~').contains(&b)) => t,
        _ => ct,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Encoding {
    Json,
    Xml,
    /// text/html with a schema: APISIX logs an error and sends an empty body.
    None,
}

enum Body {
    Example(Template),
    Schema(Value, Encoding),
}

struct Mocking {
    delay: Duration,
    status: u16,
    content_type: Bytes,
    mock_header: bool,
    headers: Vec<(Bytes, Template)>,
    body: Body,
}

fn compile_conf(v: &Value) -> Result<Mocking, String> {
    sluice_model::schema::validate(&schema(), v)?;
    let content_type = v
        .get("content_type")
        .and_then(Value::as_str)
        .unwrap_or("application/json;charset=utf8");
    let typ = media_type(content_type);
    if !SUPPORTED_TYPES.contains(&typ) {
        return Err("unsupported content type!".into());
    }
    // The schema has no maximum; nginx cannot send a status past three digits.
    let status = v
        .get("response_status")
        .and_then(Value::as_u64)
        .unwrap_or(200);
    let status = u16::try_from(status)
        .ok()
        .filter(|s| *s <= 999)
        .ok_or("response_status must be at most 999")?;
    let delay = v.get("delay").and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
    let body = match (
        v.get("response_example").and_then(Value::as_str),
        v.get("response_schema"),
    ) {
        (Some(e), _) => Body::Example(Template::compile(e)),
        (None, Some(s)) => {
            let enc = match typ {
                "application/xml" | "text/xml" => Encoding::Xml,
                "application/json" | "text/plain" => Encoding::Json,
                _ => Encoding::None,
            };
            Body::Schema(s.clone(), enc)
        }
        (None, None) => return Err("response_example or response_schema is required".into()),
    };
    let headers = v
        .get("response_headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, val)| {
            let val = val.as_str().map_or_else(|| val.to_string(), str::to_owned);
            (Bytes::from(k.clone()), Template::compile(&val))
        })
        .collect();
    Ok(Mocking {
        delay: Duration::from_secs(delay),
        status,
        content_type: Bytes::from(content_type.to_owned()),
        mock_header: v.get("with_mock_header").and_then(Value::as_bool) != Some(false),
        headers,
        body,
    })
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v).map(drop)
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(compile_conf(v)?))
}

/// APISIX's `gen_by_property`: `None` for a type it does not know (the key is then absent, as a Lua nil).
fn gen_by_property(p: &Value, rng: &mut impl Rng, depth: usize) -> Option<Value> {
    // A schema nests only as deep as its configuration; the bound keeps a pathological one from recursing far.
    if depth > 64 {
        return None;
    }
    let typ = p.get("type")?.as_str()?.to_ascii_lowercase();
    let example = p.get("example");
    Some(match typ.as_str() {
        "array" => {
            let items = p.get("items")?;
            let n = rng.gen_range(1..=3);
            Value::Array(
                (0..n)
                    .filter_map(|_| gen_by_property(items, rng, depth + 1))
                    .collect(),
            )
        }
        "object" => gen_object(p, rng, depth + 1),
        "string" => match example {
            Some(Value::String(s)) => Value::String(s.clone()),
            _ => {
                let n = rng.gen_range(1..=10);
                Value::String((0..n).map(|_| rng.gen_range(b'a'..=b'z') as char).collect())
            }
        },
        "number" => match example {
            Some(Value::Number(n)) => Value::Number(n.clone()),
            _ => json!(rng.gen::<f64>() * 10000.0),
        },
        "integer" => match example.and_then(Value::as_f64) {
            Some(n) if example.is_some_and(Value::is_number) => json!(n.floor() as i64),
            _ => json!(rng.gen_range(1..=10000)),
        },
        "boolean" => match example {
            Some(Value::Bool(b)) => Value::Bool(*b),
            _ => Value::Bool(rng.gen()),
        },
        _ => return None,
    })
}

fn gen_object(p: &Value, rng: &mut impl Rng, depth: usize) -> Value {
    let mut out = Map::new();
    for (k, v) in p
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if let Some(val) = gen_by_property(v, rng, depth) {
            out.insert(k.clone(), val);
        }
    }
    Value::Object(out)
}

fn xml_escape(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
}

/// xml2lua's `toXml(value, "data")`: an object's keys become elements, an array repeats its key's element.
fn to_xml(name: &str, v: &Value, out: &mut String) {
    match v {
        Value::Array(items) => {
            for i in items {
                to_xml(name, i, out);
            }
        }
        Value::Object(m) => {
            out.push('<');
            out.push_str(name);
            out.push('>');
            for (k, val) in m {
                to_xml(k, val, out);
            }
            out.push_str("</");
            out.push_str(name);
            out.push('>');
        }
        other => {
            out.push('<');
            out.push_str(name);
            out.push('>');
            match other {
                Value::String(s) => xml_escape(s, out),
                v => out.push_str(&v.to_string()),
            }
            out.push_str("</");
            out.push_str(name);
            out.push('>');
        }
    }
}

fn generate(schema: &Value, enc: Encoding) -> String {
    let value = gen_object(schema, &mut rand::thread_rng(), 0);
    match enc {
        Encoding::Json => value.to_string(),
        Encoding::Xml => {
            let mut out = String::new();
            to_xml("data", &value, &mut out);
            out
        }
        Encoding::None => {
            tracing::error!("json schema body only support xml and json content type");
            String::new()
        }
    }
}

impl Plugin for Mocking {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access])
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        // APISIX resolves `$var`s in the generated body too.
        let body = match &self.body {
            Body::Example(t) => t.resolve(ctx).0.into_owned(),
            Body::Schema(s, enc) => Template::compile(&generate(s, *enc))
                .resolve(ctx)
                .0
                .into_owned(),
        };
        let mut r = Response::status(self.status);
        r.headers.push((
            Bytes::from_static(b"Content-Type"),
            self.content_type.clone(),
        ));
        if self.mock_header {
            r.headers.push((
                Bytes::from_static(b"x-mock-by"),
                Bytes::from(format!("APISIX/{}", sluice_model::APISIX_VERSION)),
            ));
        }
        for (n, t) in &self.headers {
            r.headers
                .push((n.clone(), Bytes::from(t.resolve(ctx).0.into_owned())));
        }
        r.body = Bytes::from(body);
        if !self.delay.is_zero() {
            ctx.add_delay(self.delay);
        }
        Flow::Respond(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_and_schema_errors() {
        let ok = |v: Value| check(&v);
        assert!(ok(json!({"response_example": "x"})).is_ok());
        assert!(
            ok(json!({"response_example": "x", "content_type": "text/xml; charset=utf-8"})).is_ok()
        );
        assert_eq!(
            ok(json!({"response_example": "x", "content_type": "image/png"})).unwrap_err(),
            "unsupported content type!"
        );
        assert!(ok(json!({})).is_err());
        assert!(ok(json!({"response_example": "x", "response_status": 99})).is_err());
        assert!(ok(json!({"response_example": "x", "delay": 1.5})).is_err());
        assert!(ok(json!({"response_example": "x", "response_headers": {}})).is_err());
        assert!(ok(json!({"response_example": "x", "response_status": 1000})).is_err());
    }

    #[test]
    fn generator_follows_apisix() {
        let schema = json!({"type": "object", "properties": {
            "s": {"type": "string"}, "se": {"type": "string", "example": "hello"},
            "n": {"type": "number"}, "ne": {"type": "number", "example": 5.5},
            "i": {"type": "integer"}, "ie": {"type": "integer", "example": 4.7},
            "b": {"type": "boolean"}, "be": {"type": "boolean", "example": true},
            "o": {"type": "object"}, "a": {"type": "array", "items": {"type": "integer", "example": 155}},
            "noitems": {"type": "array"}, "odd": {"type": "null"}, "upper": {"type": "STRING", "example": "u"}
        }});
        let mut rng = rand::thread_rng();
        for _ in 0..200 {
            let v = gen_object(&schema, &mut rng, 0);
            let s = v["s"].as_str().unwrap();
            assert!((1..=10).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase()));
            assert_eq!(v["se"], "hello");
            let n = v["n"].as_f64().unwrap();
            assert!((0.0..10000.0).contains(&n));
            assert_eq!(v["ne"], 5.5);
            let i = v["i"].as_i64().unwrap();
            assert!((1..=10000).contains(&i));
            assert_eq!(v["ie"], 4);
            assert!(v["b"].is_boolean());
            assert_eq!(v["be"], true);
            assert_eq!(v["o"], json!({}));
            let a = v["a"].as_array().unwrap();
            assert!((1..=3).contains(&a.len()) && a.iter().all(|x| x == 155));
            assert!(v.get("noitems").is_none() && v.get("odd").is_none());
            assert_eq!(v["upper"], "u");
        }
    }

    #[test]
    fn xml_has_a_data_root_and_escapes_text() {
        let mut out = String::new();
        to_xml(
            "data",
            &json!({"id": "a<b&", "tags": ["x", "y"], "o": {"n": 1}}),
            &mut out,
        );
        assert_eq!(
            out,
            "<data><id>a&lt;b&amp;</id><o><n>1</n></o><tags>x</tags><tags>y</tags></data>"
        );
    }
}
