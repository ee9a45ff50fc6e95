//! response-rewrite (priority 899, header_filter + body_filter), as APISIX's: when `vars` (lua-resty-expr, which
//! may test `status`) match, set `status_code`, edit headers (`headers.add` "Name: value" strings, then
//! `headers.set`, then `headers.remove`; the legacy flat map means set; values may use `$var`s), and either replace
//! the body with `body` (`body_base64`: decoded once at compile time) or run `filters` (regex substitutions,
//! `scope` once/global, over the whole body, held until the upstream's last byte). `body` and `filters` are
//! mutually exclusive (APISIX's schema `dependencies`). Regexes are the regex crate's (bytes), compiled once; PCRE
//! options map to its flags. Not here: the re-framing of a changed body (the proxy does it).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use regex::bytes::{Regex, RegexBuilder};
use serde_json::{json, Value};
use sluice_router::expr::Expr;

use crate::filters::BodyChunk;
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
    secrets: sluice_secrets::SecretFields::NONE,
};

fn schema() -> Value {
    let header_map = json!({
        "type": "object",
        "minProperties": 1,
        "patternProperties": {"^[^:]+$": {"oneOf": [{"type": "string"}, {"type": "number"}]}}
    });
    json!({
        "type": "object",
        "properties": {
            "headers": {
                "description": "new headers for response",
                "anyOf": [
                    header_map,
                    {
                        "properties": {
                            "add": {"type": "array", "minItems": 1,
                                    "items": {"type": "string", "pattern": "^[^:]+:[^:]+[^/]$"}},
                            "set": header_map,
                            "remove": {"type": "array", "minItems": 1,
                                       "items": {"type": "string", "pattern": "^[^:]+$"}}
                        }
                    }
                ]
            },
            "body": {"type": "string"},
            "body_base64": {"type": "boolean", "default": false},
            "status_code": {"type": "integer", "minimum": 200, "maximum": 598},
            "vars": {"type": "array"},
            "filters": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["regex", "replace"],
                    "properties": {
                        "regex": {"type": "string", "minLength": 1},
                        "scope": {"type": "string", "enum": ["once", "global"], "default": "once"},
                        "replace": {"type": "string"},
                        "options": {"type": "string", "default": "jo"}
                    }
                }
            }
        },
        "dependencies": {
            "body": {"not": {"required": ["filters"]}},
            "filters": {"not": {"required": ["body"]}}
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

struct Filter {
    re: Regex,
    global: bool,
    /// The replacement in the regex crate's unambiguous `${1}` form.
    replace: Vec<u8>,
}

/// What replaces the body.
enum NewBody {
    None,
    Fixed(Bytes),
    Filters(Vec<Filter>),
}

struct ResponseRewrite {
    ops: Vec<Op>,
    vars: Option<Expr>,
    status: Option<u16>,
    body: NewBody,
}

/// Per response: whether `vars` matched (decided in header_filter), and the body held for `filters`.
#[derive(Default)]
struct Held {
    matched: bool,
    buf: BytesMut,
}

/// A regex with PCRE-style options (`ngx.re`'s: i, m, s, x, u, a; j, o, D, J, U are accepted and have no effect
/// here), with APISIX's error text for an unknown flag or a bad pattern.
fn compile_regex(pattern: &str, options: &str) -> Result<Regex, String> {
    let fail = |e: String| format!("regex \"{pattern}\" validation failed: {e}");
    let mut b = RegexBuilder::new(pattern);
    let mut anchored = false;
    for f in options.chars() {
        match f {
            'i' => {
                b.case_insensitive(true);
            }
            'm' => {
                b.multi_line(true);
            }
            's' => {
                b.dot_matches_new_line(true);
            }
            'x' => {
                b.ignore_whitespace(true);
            }
            'a' => anchored = true,
            'j' | 'o' | 'u' | 'U' | 'd' | 'D' | 'J' => {}
            other => {
                return Err(fail(format!(
                    "unknown flag \"{other}\" (flags \"{options}\")"
                )))
            }
        }
    }
    if anchored {
        let mut a = RegexBuilder::new(&format!("\\A(?:{pattern})"));
        a.case_insensitive(options.contains('i'))
            .multi_line(options.contains('m'))
            .dot_matches_new_line(options.contains('s'))
            .ignore_whitespace(options.contains('x'));
        b = a;
    }
    b.build().map_err(|e| fail(e.to_string()))
}

fn header_ops(h: &serde_json::Map<String, Value>) -> Result<Vec<Op>, String> {
    let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let structured = ["set", "add", "remove"]
        .iter()
        .any(|k| h.get(*k).is_some_and(|v| v.is_array() || v.is_object()));
    let mut ops = Vec::new();
    if !structured {
        for (k, val) in h {
            if k.is_empty() {
                return Err("invalid field length in header".into());
            }
            if !(val.is_string() || val.is_number()) {
                return Err("invalid type as header value".into());
            }
            ops.push(Op::Set(
                Bytes::from(k.clone()),
                Template::compile(&text(val)),
            ));
        }
        return Ok(ops);
    }
    // APISIX applies add, then set, then remove.
    for a in h.get("add").and_then(Value::as_array).into_iter().flatten() {
        let s = a.as_str().unwrap_or_default();
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
        ops.push(Op::Remove(Bytes::from(
            r.as_str().unwrap_or_default().to_owned(),
        )));
    }
    Ok(ops)
}

fn compile_conf(v: &Value) -> Result<ResponseRewrite, String> {
    sluice_model::schema::validate(&schema(), v)?;
    let ops = match v.get("headers").and_then(Value::as_object) {
        Some(h) => header_ops(h)?,
        None => Vec::new(),
    };
    let text = v.get("body").and_then(Value::as_str);
    let body = if v.get("body_base64").and_then(Value::as_bool) == Some(true) {
        let decoded = text
            .filter(|t| !t.is_empty())
            .and_then(crate::util::base64_decode)
            .ok_or("invalid base64 content")?;
        NewBody::Fixed(Bytes::from(decoded))
    } else if let Some(t) = text {
        NewBody::Fixed(Bytes::from(t.to_owned()))
    } else if let Some(fs) = v.get("filters").and_then(Value::as_array) {
        let mut out = Vec::with_capacity(fs.len());
        for f in fs {
            let regex = f["regex"].as_str().unwrap_or_default();
            let options = f.get("options").and_then(Value::as_str).unwrap_or("jo");
            out.push(Filter {
                re: compile_regex(regex, options)?,
                global: f.get("scope").and_then(Value::as_str) == Some("global"),
                replace: crate::util::dollar_groups(f["replace"].as_str().unwrap_or_default())
                    .into_bytes(),
            });
        }
        NewBody::Filters(out)
    } else {
        NewBody::None
    };
    let vars = match v.get("vars") {
        Some(rule) => Some(
            Expr::compile(rule)
                .map_err(|e| format!("failed to validate the 'vars' expression: {e}"))?,
        ),
        None => None,
    };
    Ok(ResponseRewrite {
        ops,
        vars,
        status: v
            .get("status_code")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok()),
        body,
    })
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(compile_conf(v)?))
}

impl ResponseRewrite {
    fn key(&self) -> *const () {
        self as *const Self as *const ()
    }
}

impl Plugin for ResponseRewrite {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        match self.body {
            NewBody::None => PhaseMask::of(&[Phase::HeaderFilter]),
            _ => PhaseMask::of(&[Phase::HeaderFilter, Phase::BodyFilter]),
        }
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        if let Some(e) = &self.vars {
            ctx.set_var("status", status.to_string());
            if !e.eval(&*ctx) {
                return;
            }
        }
        if let Some(s) = self.status {
            ctx.resp.status = Some(s);
        }
        if !matches!(self.body, NewBody::None) {
            ctx.body_state::<Held>(self.key()).matched = true;
            ctx.resp.clear_header_as_body_modified();
        }
        for op in &self.ops {
            match op {
                Op::Set(n, t) => {
                    let v = Bytes::from(t.resolve(ctx).0.into_owned());
                    ctx.resp.set(n.clone(), v);
                }
                Op::Add(n, t) => {
                    let v = Bytes::from(t.resolve(ctx).0.into_owned());
                    ctx.resp.add_headers.push((n.clone(), v));
                }
                Op::Remove(n) => {
                    let n = String::from_utf8_lossy(n);
                    ctx.resp.remove(&n);
                }
            }
        }
    }
    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        let held = ctx.body_state::<Held>(self.key());
        if !held.matched {
            return;
        }
        match &self.body {
            NewBody::None => {}
            NewBody::Fixed(b) => {
                chunk.data = b.clone();
                chunk.eof = true;
            }
            NewBody::Filters(filters) => {
                held.buf.extend_from_slice(&chunk.data);
                if !chunk.eof {
                    chunk.data = Bytes::new();
                    return;
                }
                let mut body: Vec<u8> = std::mem::take(&mut held.buf).into();
                for f in filters {
                    let limit = if f.global { 0 } else { 1 };
                    body =
                        f.re.replacen(&body, limit, f.replace.as_slice())
                            .into_owned();
                }
                chunk.data = Bytes::from(body);
            }
        }
    }
}

#[cfg(test)]
mod tests;
