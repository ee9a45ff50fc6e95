//! fault-injection (priority 11000, rewrite): `abort` answers with `http_status`, `body` (with `$var`s) and
//! `headers` for `percentage` of requests (all when unset) whose `vars` (a list of lua-resty-expr rules, any
//! may match) match. `delay` waits `duration` seconds under its own `percentage` and `vars`, before the abort
//! decision, as APISIX does; the proxy awaits the wait ([`Ctx::add_delay`]), so a delayed abort is answered
//! after the delay.

use std::time::Duration;

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
    secrets: sluice_secrets::SecretFields::NONE,
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
struct DelayConf {
    duration: f64,
    percentage: Option<u32>,
    #[serde(default)]
    vars: Vec<Value>,
}

#[derive(Deserialize)]
struct Conf {
    abort: Option<Abort>,
    delay: Option<DelayConf>,
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    let vars = c.abort.iter().flat_map(|a| &a.vars);
    for rule in vars.chain(c.delay.iter().flat_map(|d| &d.vars)) {
        Expr::compile(rule).map_err(|e| format!("invalid vars: {e}"))?;
    }
    if let Some(d) = &c.delay {
        Duration::try_from_secs_f64(d.duration).map_err(|e| format!("invalid duration: {e}"))?;
    }
    Ok(())
}

/// When a fault applies: `percentage` of the requests whose `vars` (any rule) match.
struct Sample {
    percentage: Option<u32>,
    vars: Vec<Expr>,
}

impl Sample {
    fn compile(percentage: Option<u32>, vars: &[Value]) -> Result<Sample, String> {
        Ok(Sample {
            percentage,
            vars: vars.iter().map(Expr::compile).collect::<Result<_, _>>()?,
        })
    }

    fn hit(&self, ctx: &Ctx<'_>) -> bool {
        if !self.vars.is_empty() && !self.vars.iter().any(|e| e.eval(ctx)) {
            return false;
        }
        // APISIX: `random(1, 100) <= percentage`.
        self.percentage
            .is_none_or(|p| rand::random::<u32>() % 100 < p)
    }
}

struct AbortRt {
    status: u16,
    body: Template,
    headers: Vec<(Bytes, Template)>,
    when: Sample,
}

struct FaultInjection {
    delay: Option<(Duration, Sample)>,
    abort: Option<AbortRt>,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let c: Conf = parse(&schema(), v)?;
    let delay = match c.delay {
        Some(d) => Some((
            Duration::try_from_secs_f64(d.duration).map_err(|e| e.to_string())?,
            Sample::compile(d.percentage, &d.vars)?,
        )),
        None => None,
    };
    let abort = match c.abort {
        Some(a) => Some(compile_abort(a)?),
        None => None,
    };
    Ok(Arc::new(FaultInjection { delay, abort }))
}

fn compile_abort(a: Abort) -> Result<AbortRt, String> {
    Ok(AbortRt {
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
        when: Sample::compile(a.percentage, &a.vars)?,
    })
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
        if let Some((d, when)) = &self.delay {
            if when.hit(ctx) {
                ctx.add_delay(*d);
            }
        }
        let Some(a) = &self.abort else {
            return Flow::Continue;
        };
        if !a.when.hit(ctx) {
            return Flow::Continue;
        }
        let mut r = Response::status(a.status);
        r.body = Bytes::from(a.body.resolve(ctx).0.into_owned());
        for (n, t) in &a.headers {
            r.headers
                .push((n.clone(), Bytes::from(t.resolve(ctx).0.into_owned())));
        }
        Flow::Respond(r)
    }
}
