//! redirect (priority 900, rewrite): answers with `ret_code` (302) and a Location built from `uri` (with `$var`s)
//! or `regex_uri`, optionally keeping the query string (`append_query_string`); `http_to_https` sends plain-HTTP
//! requests to `https://$host$request_uri` with 301 (GET/HEAD) or 308. `encode_uri` percent-encodes the path.

use std::sync::Arc;

use bytes::Bytes;
use regex::Regex;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::{error_page, parse, Template};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "redirect";
pub const PRIORITY: i32 = 900;

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
            "ret_code": {"type": "integer", "minimum": 200, "default": 302},
            "uri": {"type": "string", "minLength": 2},
            "regex_uri": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "string"}},
            "http_to_https": {"type": "boolean"},
            "encode_uri": {"type": "boolean", "default": false},
            "append_query_string": {"type": "boolean", "default": false}
        },
        "oneOf": [
            {"required": ["uri"]},
            {"required": ["regex_uri"]},
            {"required": ["http_to_https"]}
        ]
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default = "code302")]
    ret_code: u16,
    uri: Option<String>,
    regex_uri: Option<Vec<String>>,
    #[serde(default)]
    http_to_https: bool,
    #[serde(default)]
    encode_uri: bool,
    #[serde(default)]
    append_query_string: bool,
}

fn code302() -> u16 {
    302
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    if c.http_to_https && c.append_query_string {
        return Err(
            "only one of `http_to_https` and `append_query_string` can be configured.".into(),
        );
    }
    if let Some(r) = &c.regex_uri {
        Regex::new(&r[0]).map_err(|e| format!("invalid regex_uri {:?}: {e}", r[0]))?;
    }
    Ok(())
}

struct Redirect {
    code: u16,
    uri: Option<Template>,
    regex_uri: Option<(Regex, String)>,
    https: bool,
    encode: bool,
    append_query: bool,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let c: Conf = parse(&schema(), v)?;
    let regex_uri = match c.regex_uri {
        Some(r) => Some((
            Regex::new(&r[0]).map_err(|e| e.to_string())?,
            crate::util::dollar_groups(&r[1]),
        )),
        None => None,
    };
    Ok(Arc::new(Redirect {
        code: c.ret_code,
        uri: c.uri.as_deref().map(Template::compile),
        regex_uri,
        https: c.http_to_https,
        encode: c.encode_uri,
        append_query: c.append_query_string,
    }))
}

/// Percent-encodes what is not allowed unescaped in a path (keeps `/`, unreserved and sub-delims).
fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@%?".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Plugin for Redirect {
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
        let mut code = self.code;
        let mut location = None;
        if self.https && ctx.req.scheme == "http" {
            let host = ctx.req.host.as_deref().unwrap_or("");
            location = Some(format!("https://{host}{}", ctx.req.head.target_str()));
            code = if matches!(ctx.req.head.method_str(), "GET" | "HEAD") {
                301
            } else {
                308
            };
        } else if let Some(t) = &self.uri {
            location = Some(t.resolve(ctx).0.into_owned());
        } else if let Some((re, rep)) = &self.regex_uri {
            let path: &str = &ctx.req.uri;
            if re.is_match(path) {
                location = Some(re.replace(path, rep.as_str()).into_owned());
            }
        }
        let Some(mut loc) = location else {
            return Flow::Continue;
        };
        if self.encode {
            loc = encode_path(&loc);
        }
        if self.append_query {
            if let Some(q) = ctx.req.head.query_str() {
                loc.push(if loc.contains('?') { '&' } else { '?' });
                loc.push_str(q);
            }
        }
        // Built from the decoded `uri`: a `%0D%0A` in the request must not split the response head.
        let loc = sluice_http::uri::escape_controls(&loc).into_owned();
        let mut r = error_page(code);
        r.headers
            .push((Bytes::from_static(b"Location"), Bytes::from(loc)));
        Flow::Respond(r)
    }
}
