//! response-rewrite (priority 899, header_filter): response header edits (`headers.set` / `.add` ("Name: value"
//! strings) / `.remove`, or the legacy flat map meaning set; values may use `$var`s), applied when `vars`
//! (lua-resty-expr, which may test `status`) match. `status_code`, `body`, `body_base64` and `filters` need the
//! proxy to replace the status and body, which it does not offer plugins yet: they are refused at compile time.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_router::expr::Expr;

use crate::registry::Entry;
use crate::util::Template;
use crate::{CompileEnv, Ctx, Phase, PhaseMask, Plugin};

pub const NAME: &str = "response-rewrite";
pub const PRIORITY: i32 = 899;

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
            "headers": {"type": "object"},
            "body": {"type": "string"},
            "body_base64": {"type": "boolean", "default": false},
            "status_code": {"type": "integer", "minimum": 200, "maximum": 598},
            "vars": {"type": "array"},
            "filters": {"type": "array", "minItems": 1}
        }
    })
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v).map(drop)
}

enum Op {
    Set(Bytes, Template),
    Add(Bytes, Template),
    Remove(Bytes),
}

struct ResponseRewrite {
    ops: Vec<Op>,
    vars: Option<Expr>,
}

fn compile_conf(v: &Value) -> Result<ResponseRewrite, String> {
    sluice_model::schema::validate(&schema(), v)?;
    for unsupported in ["body", "status_code", "filters"] {
        if v.get(unsupported).is_some() {
            return Err(format!(
                "{unsupported} is not supported yet (it needs the proxy to replace the response)"
            ));
        }
    }
    let mut ops = Vec::new();
    if let Some(h) = v.get("headers").and_then(Value::as_object) {
        let structured = ["set", "add", "remove"].iter().any(|k| h.contains_key(*k));
        let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        if structured {
            for a in h.get("add").and_then(Value::as_array).into_iter().flatten() {
                let s = a
                    .as_str()
                    .ok_or("headers.add must list \"Name: value\" strings")?;
                let (n, val) = s
                    .split_once(':')
                    .ok_or_else(|| format!("invalid header {s:?}: want \"Name: value\""))?;
                ops.push(Op::Add(
                    Bytes::from(n.trim().to_owned()),
                    Template::compile(val.trim()),
                ));
            }
            for (k, val) in h
                .get("set")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                ops.push(Op::Set(
                    Bytes::from(k.clone()),
                    Template::compile(&text(val)),
                ));
            }
            for r in h
                .get("remove")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let n = r.as_str().ok_or("headers.remove must list strings")?;
                ops.push(Op::Remove(Bytes::from(n.to_owned())));
            }
        } else {
            for (k, val) in h {
                ops.push(Op::Set(
                    Bytes::from(k.clone()),
                    Template::compile(&text(val)),
                ));
            }
        }
    }
    let vars = match v.get("vars") {
        Some(rule) => Some(Expr::compile(rule).map_err(|e| format!("invalid vars: {e}"))?),
        None => None,
    };
    Ok(ResponseRewrite { ops, vars })
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(compile_conf(v)?))
}

impl Plugin for ResponseRewrite {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::HeaderFilter])
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        if let Some(e) = &self.vars {
            ctx.set_var("status", status.to_string());
            if !e.eval(&*ctx) {
                return;
            }
        }
        for op in &self.ops {
            match op {
                Op::Set(n, t) => {
                    let v = Bytes::from(t.resolve(ctx).0.into_owned());
                    ctx.resp
                        .set_headers
                        .retain(|(x, _)| !x.eq_ignore_ascii_case(n));
                    ctx.resp.set_headers.push((n.clone(), v));
                }
                Op::Add(n, t) => {
                    let v = Bytes::from(t.resolve(ctx).0.into_owned());
                    ctx.resp.add_headers.push((n.clone(), v));
                }
                Op::Remove(n) => {
                    ctx.resp
                        .set_headers
                        .retain(|(x, _)| !x.eq_ignore_ascii_case(n));
                    ctx.resp
                        .add_headers
                        .retain(|(x, _)| !x.eq_ignore_ascii_case(n));
                    ctx.resp.remove_headers.push(n.clone());
                }
            }
        }
    }
}
