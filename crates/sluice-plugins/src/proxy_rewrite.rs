//! proxy-rewrite (priority 1008, rewrite): the request sent upstream gets a new `uri` (with `$var`s) or one
//! produced by `regex_uri` ([regex, replacement] on the path), a new `method`, a new `host`, and header edits
//! (`headers.set` / `.add` / `.remove`, or the legacy flat map meaning set; values may use `$var`s). The
//! original query string is appended to a rewritten uri, as APISIX does.

use std::sync::Arc;

use bytes::Bytes;
use regex::Regex;
use serde_json::{json, Map, Value};
use sluice_http::uri::{escape_controls, escape_path};

use crate::registry::Entry;
use crate::util::Template;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "proxy-rewrite";
pub const PRIORITY: i32 = 1008;

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
            "uri": {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": "^\\/.*"},
            "method": {"type": "string", "enum": ["GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "MKCOL",
                "COPY", "MOVE", "PROPFIND", "LOCK", "UNLOCK", "PATCH", "TRACE"]},
            "regex_uri": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "string"}},
            "host": {"type": "string", "pattern": "^[0-9a-zA-Z-.]+(:\\d{1,5})?$"},
            "headers": {"type": "object"},
            "use_real_request_uri_unsafe": {"type": "boolean", "default": false}
        }
    })
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v).map(drop)
}

enum HeaderOp {
    Set(Bytes, Template),
    Add(Bytes, Template),
    Remove(Bytes),
}

struct ProxyRewrite {
    uri: Option<Template>,
    regex_uri: Option<(Regex, String)>,
    method: Option<Bytes>,
    host: Option<Bytes>,
    headers: Vec<HeaderOp>,
}

fn header_map(v: Option<&Value>, what: &str) -> Result<Vec<(String, String)>, String> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let m = v
        .as_object()
        .ok_or_else(|| format!("headers.{what} must be an object"))?;
    m.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            Value::Number(n) => Ok((k.clone(), n.to_string())),
            _ => Err(format!("invalid value of header {k}")),
        })
        .collect()
}

fn compile_conf(v: &Value) -> Result<ProxyRewrite, String> {
    sluice_model::schema::validate(&schema(), v)?;
    let empty = Map::new();
    let o = v.as_object().unwrap_or(&empty);
    let regex_uri = match o.get("regex_uri").and_then(Value::as_array) {
        Some(a) => {
            let re = a.first().and_then(Value::as_str).unwrap_or("");
            let rep = a.get(1).and_then(Value::as_str).unwrap_or("");
            Some((
                Regex::new(re).map_err(|e| format!("invalid regex_uri {re:?}: {e}"))?,
                crate::util::dollar_groups(rep),
            ))
        }
        None => None,
    };
    let mut headers = Vec::new();
    if let Some(h) = o.get("headers").and_then(Value::as_object) {
        let structured = ["set", "add", "remove"].iter().any(|k| h.contains_key(*k));
        if structured {
            for (k, v) in header_map(h.get("add"), "add")? {
                headers.push(HeaderOp::Add(Bytes::from(k), Template::compile(&v)));
            }
            for (k, v) in header_map(h.get("set"), "set")? {
                headers.push(HeaderOp::Set(Bytes::from(k), Template::compile(&v)));
            }
            for r in h
                .get("remove")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = r.as_str().ok_or("headers.remove must list strings")?;
                headers.push(HeaderOp::Remove(Bytes::from(name.to_ascii_lowercase())));
            }
        } else {
            for (k, v) in header_map(Some(&Value::Object(h.clone())), "")? {
                headers.push(HeaderOp::Set(Bytes::from(k), Template::compile(&v)));
            }
        }
    }
    Ok(ProxyRewrite {
        uri: o.get("uri").and_then(Value::as_str).map(Template::compile),
        regex_uri,
        method: o
            .get("method")
            .and_then(Value::as_str)
            .map(|m| Bytes::from(m.to_owned())),
        host: o
            .get("host")
            .and_then(Value::as_str)
            .map(|h| Bytes::from(h.to_owned())),
        headers,
    })
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(compile_conf(v)?))
}

impl Plugin for ProxyRewrite {
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
        // As APISIX: built from the normalised `uri`, then escaped (nginx's `ngx_escape_uri`) so a decoded `%0D%0A`
        // or space cannot reach the upstream request line.
        let path: &str = &ctx.req.uri;
        let new_path = if let Some(t) = &self.uri {
            let p = t.resolve(ctx).0;
            // A `?` the template wrote itself starts a query and stays.
            Some(match p.split_once('?') {
                Some((a, q)) => format!("{}?{}", escape_path(a), escape_controls(q)),
                None => escape_path(&p).into_owned(),
            })
        } else if let Some((re, rep)) = &self.regex_uri {
            re.is_match(path)
                .then(|| escape_path(&re.replace(path, rep.as_str())).into_owned())
        } else {
            None
        };
        if let Some(p) = new_path {
            let uri = match ctx.req.head.query_str() {
                Some(q) if p.contains('?') => format!("{p}&{q}"),
                Some(q) => format!("{p}?{q}"),
                None => p,
            };
            ctx.edits.uri = Some(Bytes::from(uri));
        }
        if let Some(m) = &self.method {
            ctx.edits.method = Some(m.clone());
        }
        if let Some(h) = &self.host {
            ctx.edits.host = Some(h.clone());
        }
        for op in &self.headers {
            match op {
                HeaderOp::Set(n, t) => {
                    let v = Bytes::from(t.resolve(ctx).0.into_owned());
                    ctx.edits
                        .set_headers
                        .retain(|(x, _)| !x.eq_ignore_ascii_case(n));
                    ctx.edits.set_headers.push((n.clone(), v));
                }
                HeaderOp::Add(n, t) => {
                    let v = Bytes::from(t.resolve(ctx).0.into_owned());
                    // Appending: re-emit the request's own values (set_headers replaces), then the new one.
                    if !ctx
                        .edits
                        .set_headers
                        .iter()
                        .any(|(x, _)| x.eq_ignore_ascii_case(n))
                    {
                        let lower = String::from_utf8_lossy(n).to_ascii_lowercase();
                        let own: Vec<Bytes> = ctx
                            .req
                            .head
                            .headers_iter()
                            .filter(|(x, _)| x.eq_ignore_ascii_case(lower.as_bytes()))
                            .map(|(_, v)| Bytes::copy_from_slice(v))
                            .collect();
                        for o in own {
                            ctx.edits.set_headers.push((n.clone(), o));
                        }
                    }
                    ctx.edits.set_headers.push((n.clone(), v));
                }
                HeaderOp::Remove(n) => {
                    ctx.edits
                        .set_headers
                        .retain(|(x, _)| !x.eq_ignore_ascii_case(n));
                    ctx.edits.remove_headers.push(n.clone());
                }
            }
        }
        Flow::Continue
    }
}
