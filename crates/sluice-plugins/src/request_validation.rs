//! request-validation (priority 2800, rewrite): validates the request headers (lower-cased names, string values)
//! against `header_schema`, answering `rejected_code` (400) with `rejected_msg` or the validator's error text,
//! as plain text like APISIX. `body_schema` needs the request body, which plugins cannot read yet: it is
//! refused at compile time.

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
    sluice_model::schema::validate(&schema(), v)?;
    if v.get("body_schema").is_some() {
        return Err(
            "body_schema is not supported yet (plugins cannot read the request body)".into(),
        );
    }
    Ok(())
}

struct RequestValidation {
    header_schema: Value,
    code: u16,
    msg: Option<Bytes>,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    Ok(Arc::new(RequestValidation {
        header_schema: v.get("header_schema").cloned().unwrap_or(Value::Null),
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
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
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
        match sluice_model::schema::validate(&self.header_schema, &Value::Object(headers)) {
            Ok(()) => Flow::Continue,
            Err(e) => {
                let mut r = Response::status(self.code);
                r.body = self.msg.clone().unwrap_or_else(|| Bytes::from(e));
                Flow::Respond(r)
            }
        }
    }
}
