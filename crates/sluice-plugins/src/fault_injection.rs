//! fault-injection (priority 11000, rewrite): `abort` answers with `http_status`, `body` (with `$var`s) and
//! `headers` for `percentage` of requests (all when unset) whose `vars` (a list of lua-resty-expr rules, any
//! may match) match. `delay` needs an asynchronous sleep the hook contract does not have: a configuration
//! with `delay` is refused at compile time rather than silently not delayed.

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_router::expr::Expr;

use crate::registry::Entry;
use crate::util::{parse, Template};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "fault-injection";
pub const PRIORITY: i32 = 11000;

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
            "abort": {"type": "object", "properties": {
                "http_status": {"type": "integer", "minimum": 200},
                "body": {"type": "string", "minLength": 0},
                "headers": {"type": "object", "minProperties": 1},
                "percentage": {"type": "integer", "minimum": 0, "maximum": 100},
                "vars": {"type": "array", "maxItems": 20, "items": {"type": "array"}}
            }, "required": ["http_status"]},
            "delay": {"type": "object", "properties": {
                "duration": {"type": "number", "minimum": 0},
                "percentage": {"type": "integer", "minimum": 0, "maximum": 100},
                "vars": {"type": "array", "maxItems": 20, "items": {"type": "array"}}
            }, "required": ["duration"]}
        },
        "minProperties": 1
    })
}

#[derive(Deserialize)]
struct Abort {
    http_status: u16,
    #[serde(default)]
    body: String,
    #[serde(default)]
    headers: serde_json::Map<String, Value>,
    percentage: Option<u32>,
    #[serde(default)]
    vars: Vec<Value>,
}

#[derive(Deserialize)]
struct Conf {
    abort: Option<Abort>,
    delay: Option<Value>,
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    if c.delay.is_some() {
        return Err("delay is not supported yet (it needs an asynchronous sleep)".into());
    }
    if let Some(a) = &c.abort {
        for rule in &a.vars {
            Expr::compile(rule).map_err(|e| format!("invalid vars: {e}"))?;
        }
    }
    Ok(())
}

struct FaultInjection {
    status: u16,
    body: Template,
    headers: Vec<(Bytes, Template)>,
    percentage: Option<u32>,
    vars: Vec<Expr>,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let c: Conf = parse(&schema(), v)?;
    let a = c.abort.ok_or("abort is required")?;
    Ok(Arc::new(FaultInjection {
        status: a.http_status,
        body: Template::compile(&a.body),
        headers: a
            .headers
            .iter()
            .map(|(k, v)| {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                (Bytes::from(k.clone()), Template::compile(&v))
            })
            .collect(),
        percentage: a.percentage,
        vars: a.vars.iter().map(Expr::compile).collect::<Result<_, _>>()?,
    }))
}

impl Plugin for FaultInjection {
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
        if !self.vars.is_empty() && !self.vars.iter().any(|e| e.eval(&*ctx)) {
            return Flow::Continue;
        }
        if let Some(p) = self.percentage {
            if rand::random::<u32>() % 100 >= p {
                return Flow::Continue;
            }
        }
        let mut r = Response::status(self.status);
        r.body = Bytes::from(self.body.resolve(ctx).0.into_owned());
        for (n, t) in &self.headers {
            r.headers
                .push((n.clone(), Bytes::from(t.resolve(ctx).0.into_owned())));
        }
        Flow::Respond(r)
    }
}
