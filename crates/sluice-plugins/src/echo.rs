//! echo (priority 412, header_filter + body_filter): replaces the response body (`body`), prepends `before_body`
//! and appends `after_body`, and sets `headers`, as APISIX's echo plugin. `body` ends the body at once: whatever
//! the upstream still sends is discarded. Not here: request-side echo (APISIX has none either).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

use crate::filters::BodyChunk;
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Phase, PhaseMask, Plugin};

pub const NAME: &str = "echo";
pub const PRIORITY: i32 = 412;

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
            "before_body": {"type": "string"},
            "body": {"type": "string"},
            "after_body": {"type": "string"},
            "headers": {"type": "object", "minProperties": 1}
        },
        "anyOf": [
            {"required": ["before_body"]},
            {"required": ["body"]},
            {"required": ["after_body"]}
        ],
        "minProperties": 1
    })
}

struct Echo {
    before: Option<Bytes>,
    body: Option<Bytes>,
    after: Option<Bytes>,
    headers: Vec<(Bytes, Bytes)>,
}

fn compile_conf(v: &Value) -> Result<Echo, String> {
    sluice_model::schema::validate(&schema(), v)?;
    let text = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .map(|s| Bytes::from(s.to_owned()))
    };
    let mut headers = Vec::new();
    for (k, val) in v
        .get("headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let val = match val {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => return Err("invalid type as header value".into()),
        };
        if k.is_empty() {
            return Err("invalid field length in header".into());
        }
        headers.push((Bytes::from(k.clone()), Bytes::from(val)));
    }
    Ok(Echo {
        before: text("before_body"),
        body: text("body"),
        after: text("after_body"),
        headers,
    })
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v).map(drop)
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(compile_conf(v)?))
}

/// Whether `before_body` went out already for this response.
#[derive(Default)]
struct Started(bool);

impl Plugin for Echo {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::HeaderFilter, Phase::BodyFilter])
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, _status: u16) {
        // The schema requires one of the three, so the body always changes.
        ctx.resp.clear_header_as_body_modified();
        for (n, v) in &self.headers {
            ctx.resp.set(n.clone(), v.clone());
        }
    }
    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        if let Some(b) = &self.body {
            chunk.data = b.clone();
            chunk.eof = true;
        }
        if let Some(before) = &self.before {
            let started = ctx.body_state::<Started>(self as *const Self as *const ());
            if !started.0 {
                started.0 = true;
                chunk.data = concat(before, &chunk.data);
            }
        }
        if let (true, Some(after)) = (chunk.eof, &self.after) {
            chunk.data = concat(&chunk.data, after);
        }
    }
}

fn concat(a: &[u8], b: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(a.len() + b.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_needs_one_body_field() {
        assert!(compile_conf(&json!({})).is_err());
        assert!(compile_conf(&json!({"headers": {"a": "b"}})).is_err());
        assert!(compile_conf(&json!({"before_body": "x"})).is_ok());
        assert!(compile_conf(&json!({"body": "x", "headers": {}})).is_err());
        assert!(compile_conf(&json!({"after_body": "x", "headers": {"a": true}})).is_err());
        let e = compile_conf(&json!({"body": "x", "headers": {"Location": 1}})).unwrap();
        assert_eq!(e.headers[0].1, "1");
    }
}
