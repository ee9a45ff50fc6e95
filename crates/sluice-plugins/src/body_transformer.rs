//! body-transformer (priority 1080, rewrite + header_filter + body_filter), as APISIX's: decodes the request body
//! (rewrite) or the response body (held whole, body_filter) by `input_format` (`xml`, `json`, `encoded`, `args`,
//! `plain`, `multipart`; unset: from the Content-Type as APISIX guesses it, and a GET request always reads its
//! query `args`) and renders `template` with the decoded fields as variables, plus `_body` (the raw body),
//! `_ctx.var.<name>` (request variables, and `status` on the response side), `_escape_json()` and
//! `_escape_xml()`. The result replaces the body (request: [`Ctx::replace_body`]; response: re-framed).
//!
//! Templates are rendered by minijinja (Jinja2 syntax) instead of lua-resty-template: `{{ expr }}` is
//! HTML-escaped and `{* expr *}` writes raw as in lua-resty-template, and Lua's `..` concatenation is accepted in
//! expressions; Lua statements (`{% if x then %} ... {% end %}`) must be written as Jinja (`{% if x %} ...
//! {% endif %}`). The environment has no loader, no filesystem or environment access and a fuel bound, so a
//! template reads only what it is given. XML is parsed by roxmltree with DTDs refused (no entity expansion, so no
//! billion-laughs); decoded JSON and XML are depth-bounded. Bodies are bounded by `max_req_body_size` (413 past
//! it) and `max_resp_body_size` (truncated). A body that does not decode answers 400 `{"message": "request body
//! decode: ..."}` before anything goes upstream; a template that fails answers 503, as APISIX.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use minijinja::{AutoEscape, Environment};
use serde_json::{json, Map, Value};

use crate::filters::BodyChunk;
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "body-transformer";
pub const PRIORITY: i32 = 1080;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

/// Nesting bound for decoded JSON and XML (serde_json's own recursion limit is 128 too).
const MAX_DEPTH: usize = 128;
/// Template execution bound (minijinja fuel: roughly one unit per instruction).
const FUEL: u64 = 10_000_000;

fn transform_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "input_format": {"type": "string",
                             "enum": ["xml", "json", "encoded", "args", "plain", "multipart"]},
            "template": {"type": "string"},
            "template_is_base64": {"type": "boolean"}
        },
        "required": ["template"]
    })
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "request": transform_schema(),
            "response": transform_schema(),
            "max_req_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "max_resp_body_size": {"type": "integer", "minimum": 1, "default": 67108864}
        },
        "anyOf": [
            {"required": ["request"]},
            {"required": ["response"]},
            {"required": ["request", "response"]}
        ]
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Xml,
    Json,
    Encoded,
    Args,
    Plain,
    Multipart,
}

impl Format {
    fn parse(s: &str) -> Option<Format> {
        Some(match s {
            "xml" => Format::Xml,
            "json" => Format::Json,
            "encoded" => Format::Encoded,
            "args" => Format::Args,
            "plain" => Format::Plain,
            "multipart" => Format::Multipart,
            _ => return None,
        })
    }

    /// APISIX's `set_input_format` guess from a Content-Type.
    fn guess(ct: &str) -> Option<Format> {
        let lower = ct.to_ascii_lowercase();
        if ct.contains("text/xml") {
            Some(Format::Xml)
        } else if ct.contains("application/json") {
            Some(Format::Json)
        } else if lower.contains("application/x-www-form-urlencoded") {
            Some(Format::Encoded)
        } else if lower.contains("multipart/") {
            Some(Format::Multipart)
        } else {
            None
        }
    }
}

/// One side's template: compiled as written and, where APISIX would use it, base64-decoded. A template that does
/// not compile keeps its error: APISIX compiles per request and answers 503.
struct Side {
    typ: &'static str,
    format: Option<Format>,
    env: Environment<'static>,
    /// The template as written: `Ok(name)` in `env`, or the compile error.
    plain: Result<&'static str, String>,
    /// The base64-decoded template, when the text is valid base64.
    decoded: Option<Result<&'static str, String>>,
    base64: bool,
    /// `_ctx.var.<name>` references found in the template text, resolved per request.
    vars: Vec<(String, sluice_router::Var)>,
}

struct BodyTransformer {
    request: Option<Side>,
    response: Option<Side>,
    max_req: usize,
    max_resp: usize,
}

/// lua-resty-template's forms on minijinja: `{* e *}` is raw output, `{{ e }}` escaped output, and Lua's `..`
/// concatenation (outside string literals) is Jinja's `~`.
fn translate(src: &str) -> String {
    fn expr(e: &str) -> String {
        let mut out = String::with_capacity(e.len());
        let mut quote = None;
        let mut chars = e.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), _) if c == q => quote = None,
                (Some(_), '\\') => {
                    out.push(c);
                    if let Some(n) = chars.next() {
                        out.push(n);
                    }
                    continue;
                }
                (None, '.') if chars.peek() == Some(&'.') => {
                    chars.next();
                    out.push('~');
                    continue;
                }
                _ => {}
            }
            out.push(c);
        }
        out
    }
    let mut out = String::with_capacity(src.len() + 16);
    let mut rest = src;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let (open, close) = match tail.get(..2) {
            Some("{*") => ("{*", "*}"),
            Some("{{") => ("{{", "}}"),
            Some("{%") => ("{%", "%}"),
            _ => {
                out.push('{');
                rest = &tail[1..];
                continue;
            }
        };
        let Some(end) = tail[2..].find(close) else {
            out.push_str(tail);
            return out;
        };
        let inner = expr(&tail[2..2 + end]);
        match open {
            "{*" => {
                out.push_str("{{ (");
                out.push_str(&inner);
                out.push_str(")|safe }}");
            }
            _ => {
                out.push_str(open);
                out.push_str(&inner);
                out.push_str(close);
            }
        }
        rest = &tail[2 + end + 2..];
    }
    out.push_str(rest);
    out
}

/// `ngx.decode_base64`: standard alphabet, stops at the first `=`, and a length of 1 mod 4 is not base64.
fn ngx_decode_base64(s: &str) -> Option<String> {
    let body = s.split('=').next().unwrap_or_default();
    if body.len() % 4 == 1
        || !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    {
        return None;
    }
    crate::util::base64_decode(body).and_then(|b| String::from_utf8(b).ok())
}

fn escape_xml(s: String) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

fn escape_json(v: minijinja::Value) -> String {
    serde_json::to_string(&v).unwrap_or_else(|_| "null".into())
}

/// `_ctx.var.<name>` references in a template.
fn ctx_vars(text: &str) -> Vec<(String, sluice_router::Var)> {
    let mut out: Vec<(String, sluice_router::Var)> = Vec::new();
    for (i, _) in text.match_indices("_ctx.var.") {
        let name: String = text[i + 9..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !out.iter().any(|(n, _)| *n == name) {
            let var = sluice_router::Var::parse(&name);
            out.push((name, var));
        }
    }
    out
}

fn compile_side(typ: &'static str, conf: &Value) -> Result<Side, String> {
    let text = conf["template"].as_str().unwrap_or_default();
    let format = conf
        .get("input_format")
        .and_then(Value::as_str)
        .and_then(Format::parse);
    let base64 = conf.get("template_is_base64").and_then(Value::as_bool) == Some(true);
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.set_fuel(Some(FUEL));
    env.add_function("_escape_json", escape_json);
    env.add_function("_escape_xml", escape_xml);
    let mut add = |name: &'static str, source: &str| {
        env.add_template_owned(name, translate(source))
            .map(|()| name)
            .map_err(|e| format!("{typ} template compile: {e}"))
    };
    let plain = add("plain", text);
    let decoded_text = ngx_decode_base64(text);
    let decoded = decoded_text.as_deref().map(|t| add("decoded", t));
    let mut vars = ctx_vars(text);
    for v in decoded_text.as_deref().map(ctx_vars).unwrap_or_default() {
        if !vars.iter().any(|(n, _)| *n == v.0) {
            vars.push(v);
        }
    }
    Ok(Side {
        typ,
        format,
        env,
        plain,
        decoded,
        base64,
        vars,
    })
}

fn compile_conf(v: &Value) -> Result<BodyTransformer, String> {
    sluice_model::schema::validate(&schema(), v)?;
    let size = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .map_or(67_108_864, |n| usize::try_from(n).unwrap_or(usize::MAX))
    };
    Ok(BodyTransformer {
        request: v
            .get("request")
            .map(|c| compile_side("request", c))
            .transpose()?,
        response: v
            .get("response")
            .map(|c| compile_side("response", c))
            .transpose()?,
        max_req: size("max_req_body_size"),
        max_resp: size("max_resp_body_size"),
    })
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v).map(drop)
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(compile_conf(v)?))
}

/// xml2lua's tree handler, namespaces removed as APISIX does: an element with only text is that text (empty: ""),
/// otherwise an object of its child elements by local name (repeated ones become an array), its attributes
/// under `_attr` and its text, if any, under `_text`. The document is `{root_name: root}`.
fn xml_value(node: roxmltree::Node<'_, '_>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err("nesting too deep".into());
    }
    let text: String = node
        .children()
        .filter(|c| c.is_text())
        .filter_map(|c| c.text())
        .collect::<String>()
        .trim()
        .to_owned();
    let elems: Vec<_> = node.children().filter(|c| c.is_element()).collect();
    if elems.is_empty() && node.attributes().len() == 0 {
        return Ok(Value::String(text));
    }
    let mut m = Map::new();
    if node.attributes().len() > 0 {
        let attrs: Map<String, Value> = node
            .attributes()
            .map(|a| (a.name().to_owned(), Value::String(a.value().to_owned())))
            .collect();
        m.insert("_attr".into(), Value::Object(attrs));
    }
    for e in elems {
        let v = xml_value(e, depth + 1)?;
        let k = e.tag_name().name().to_owned();
        match m.get_mut(&k) {
            Some(Value::Array(a)) => a.push(v),
            Some(first) => *first = Value::Array(vec![first.take(), v]),
            None => {
                m.insert(k, v);
            }
        }
    }
    if !text.is_empty() {
        m.insert("_text".into(), Value::String(text));
    }
    Ok(Value::Object(m))
}

fn decode_xml(body: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let opt = roxmltree::ParsingOptions {
        allow_dtd: false,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(text, opt).map_err(|e| e.to_string())?;
    let root = doc.root_element();
    let mut m = Map::new();
    m.insert(root.tag_name().name().to_owned(), xml_value(root, 0)?);
    Ok(Value::Object(m))
}

/// The whole body as multipart fields: `name -> text`, a repeated name an array (lua-multipart's
/// `get_all_with_arrays`). The body is in memory, so the parser's stream is ready at every poll.
fn decode_multipart(body: &[u8], ct: Option<&str>) -> Result<Value, String> {
    let boundary = multer::parse_boundary(ct.unwrap_or_default()).map_err(|e| e.to_string())?;
    let data = Bytes::copy_from_slice(body);
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(data) });
    let mut mp = multer::Multipart::new(stream, boundary);
    let fut = async move {
        let mut m = Map::new();
        while let Some(field) = mp.next_field().await.map_err(|e| e.to_string())? {
            let name = field.name().unwrap_or_default().to_owned();
            let bytes = field.bytes().await.map_err(|e| e.to_string())?;
            let v = Value::String(String::from_utf8_lossy(&bytes).into_owned());
            match m.get_mut(&name) {
                Some(Value::Array(a)) => a.push(v),
                Some(first) => *first = Value::Array(vec![first.take(), v]),
                None => {
                    m.insert(name, v);
                }
            }
        }
        Ok::<_, String>(Value::Object(m))
    };
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => Err("incomplete multipart body".into()),
    }
}

use std::future::Future;

impl Side {
    fn template(&self, format: Option<Format>) -> Result<minijinja::Template<'_, '_>, String> {
        // APISIX base64-decodes the template when asked to, and also whenever the format is one of xml, json,
        // plain or multipart (keeping the text when it is not valid base64).
        let try_decoded = self.base64
            || matches!(
                format,
                Some(Format::Xml | Format::Json | Format::Plain | Format::Multipart)
            );
        let name = match (&self.decoded, try_decoded) {
            (Some(d), true) => d.clone()?,
            _ => self.plain.clone()?,
        };
        self.env
            .get_template(name)
            .map_err(|e| format!("{} template compile: {e}", self.typ))
    }

    /// APISIX's `transform`: `Err((status, message))` when the body does not decode (400) or the template fails
    /// (503).
    fn transform(
        &self,
        ctx: &Ctx<'_>,
        format: Option<Format>,
        body: Option<&[u8]>,
        ct: Option<&str>,
        is_get: bool,
    ) -> Result<String, (u16, String)> {
        let typ = self.typ;
        let mut out = Value::Object(Map::new());
        if (body.is_some() || is_get) && format != Some(Format::Plain) {
            if let Some(f) = format {
                let raw = body.unwrap_or_default();
                let decoded = match f {
                    Format::Json => serde_json::from_slice::<Value>(raw)
                        .map_err(|e| crate::request_validation::cjson_error(raw, &e)),
                    Format::Xml => decode_xml(raw),
                    Format::Encoded => Ok(crate::request_validation::form_args(raw)),
                    Format::Args => Ok(crate::request_validation::form_args(
                        ctx.req.head.query_str().unwrap_or_default().as_bytes(),
                    )),
                    Format::Multipart => decode_multipart(raw, ct),
                    Format::Plain => Ok(Value::Object(Map::new())),
                };
                out = decoded.map_err(|e| (400, format!("{typ} body decode: {e}")))?;
            }
        }
        let tmpl = self.template(format).map_err(|e| (503, e))?;
        let mut fields = match out {
            Value::Object(m) => m,
            // A JSON array or scalar has no fields to name; lua-resty-template would index it by position.
            _ => Map::new(),
        };
        for k in ["_ctx", "_body", "_escape_xml", "_escape_json", "_multipart"] {
            fields.remove(k);
        }
        let mut vars = Map::new();
        for (name, var) in &self.vars {
            if let Some(v) = ctx.var(var) {
                vars.insert(name.clone(), Value::String(v.into_owned()));
            }
        }
        fields.insert("_ctx".into(), json!({ "var": vars }));
        if let Some(b) = body {
            fields.insert(
                "_body".into(),
                Value::String(String::from_utf8_lossy(b).into_owned()),
            );
        }
        tmpl.render(minijinja::value::Serde(&fields))
            .map_err(|e| (503, format!("{typ} template rendering: {e}")))
    }
}

/// The response body held until its end (bounded by `max_resp_body_size`).
#[derive(Default)]
struct Held {
    active: bool,
    format: Option<Format>,
    ct: Option<String>,
    buf: BytesMut,
}

impl BodyTransformer {
    fn key(&self) -> *const () {
        self as *const Self as *const ()
    }
}

impl Plugin for BodyTransformer {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        match (&self.request, &self.response) {
            (Some(_), None) => PhaseMask::of(&[Phase::Rewrite]),
            (None, _) => PhaseMask::of(&[Phase::HeaderFilter, Phase::BodyFilter]),
            (Some(_), Some(_)) => {
                PhaseMask::of(&[Phase::Rewrite, Phase::HeaderFilter, Phase::BodyFilter])
            }
        }
    }
    fn needs_body(&self) -> bool {
        self.request.is_some()
    }
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        let Some(side) = &self.request else {
            return Flow::Continue;
        };
        let body = ctx.body.filter(|b| !b.is_empty());
        if body.is_some_and(|b| b.len() > self.max_req) {
            return Flow::Respond(Response::status(413));
        }
        let ct = ctx
            .req
            .head
            .header("content-type")
            .and_then(|v| std::str::from_utf8(v).ok());
        let is_get = ctx.req.head.method_str() == "GET";
        let format = if is_get {
            Some(Format::Args)
        } else {
            side.format.or_else(|| ct.and_then(Format::guess))
        };
        match side.transform(ctx, format, body, ct, is_get) {
            Ok(out) => {
                ctx.replace_body(Bytes::from(out));
                Flow::Continue
            }
            Err((status, msg)) => {
                tracing::error!("{msg}");
                Flow::Respond(Response::message(status, &msg))
            }
        }
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        let Some(side) = &self.response else {
            return;
        };
        let ct = ctx
            .response_header("content-type")
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned);
        let format = side
            .format
            .or_else(|| ct.as_deref().and_then(Format::guess));
        ctx.set_var("status", status.to_string());
        ctx.resp.clear_header_as_body_modified();
        let held = ctx.body_state::<Held>(self.key());
        held.active = true;
        held.format = format;
        held.ct = ct;
    }
    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        let Some(side) = &self.response else {
            return;
        };
        let max = self.max_resp;
        let held = ctx.body_state::<Held>(self.key());
        if !held.active {
            return;
        }
        let room = max.saturating_sub(held.buf.len());
        held.buf
            .extend_from_slice(&chunk.data[..room.min(chunk.data.len())]);
        if !chunk.eof {
            chunk.data = Bytes::new();
            return;
        }
        let body = std::mem::take(&mut held.buf).freeze();
        let (format, ct) = (held.format, held.ct.take());
        held.active = false;
        let raw = (!body.is_empty()).then_some(&body[..]);
        match side.transform(ctx, format, raw, ct.as_deref(), false) {
            Ok(out) => chunk.data = Bytes::from(out),
            Err((_, msg)) => {
                // APISIX logs and lets the body through untransformed.
                tracing::error!("failed to transform response body: {msg}");
                chunk.data = body;
            }
        }
    }
}

#[cfg(test)]
mod tests;
