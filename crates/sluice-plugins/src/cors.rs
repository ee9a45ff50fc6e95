//! cors (priority 4000, rewrite + header_filter): answers preflight `OPTIONS` itself (200) and sets the CORS
//! response headers when the request's Origin is allowed: `allow_origins` ("*", "**" = reflect, or a
//! comma-separated list), `allow_origins_by_regex`, `allow_methods` ("**" = all methods), `allow_headers` ("**" =
//! reflect Access-Control-Request-Headers), `expose_headers`, `max_age` (5), `allow_credential` (refuses "*"
//! elsewhere, as APISIX). `allow_origins_by_metadata` needs plugin_metadata, which is not modelled yet.

use std::sync::Arc;

use bytes::Bytes;
use regex::Regex;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "cors";
pub const PRIORITY: i32 = 4000;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

const ALL_METHODS: &str = "GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "allow_origins": {"type": "string", "pattern": "^(\\*|\\*\\*|null|\\w+://[^,]+(,\\w+://[^,]+)*)$", "default": "*"},
            "allow_methods": {"type": "string", "default": "*"},
            "allow_headers": {"type": "string", "default": "*"},
            "expose_headers": {"type": "string"},
            "max_age": {"type": "integer", "default": 5},
            "allow_credential": {"type": "boolean", "default": false},
            "allow_origins_by_regex": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
        }
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default = "star")]
    allow_origins: String,
    #[serde(default = "star")]
    allow_methods: String,
    #[serde(default = "star")]
    allow_headers: String,
    expose_headers: Option<String>,
    #[serde(default = "five")]
    max_age: i64,
    #[serde(default)]
    allow_credential: bool,
    #[serde(default)]
    allow_origins_by_regex: Vec<String>,
}

fn star() -> String {
    "*".into()
}
fn five() -> i64 {
    5
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    if c.allow_credential
        && [&c.allow_origins, &c.allow_methods, &c.allow_headers]
            .into_iter()
            .chain(c.expose_headers.as_ref())
            .any(|s| s == "*")
    {
        return Err("you can not set '*' for other option when 'allow_credential' is true".into());
    }
    for r in &c.allow_origins_by_regex {
        Regex::new(r).map_err(|e| format!("invalid regex {r:?}: {e}"))?;
    }
    Ok(())
}

struct Cors {
    origins: String,
    list: Vec<String>,
    regexes: Vec<Regex>,
    methods: Bytes,
    headers: String,
    expose: Option<Bytes>,
    max_age: Bytes,
    credential: bool,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let c: Conf = parse(&schema(), v)?;
    let methods = if c.allow_methods == "**" {
        ALL_METHODS.to_owned()
    } else {
        c.allow_methods
    };
    Ok(Arc::new(Cors {
        list: c.allow_origins.split(',').map(str::to_owned).collect(),
        origins: c.allow_origins,
        regexes: c
            .allow_origins_by_regex
            .iter()
            .filter_map(|r| Regex::new(r).ok())
            .collect(),
        methods: Bytes::from(methods),
        headers: c.allow_headers,
        expose: c.expose_headers.filter(|e| !e.is_empty()).map(Bytes::from),
        max_age: Bytes::from(c.max_age.to_string()),
        credential: c.allow_credential,
    }))
}

impl Cors {
    /// The Access-Control-Allow-Origin value for this request, if its origin is allowed.
    fn allowed_origin(&self, origin: Option<&str>) -> Option<String> {
        match self.origins.as_str() {
            "*" => return Some("*".into()),
            "**" => return Some(origin.unwrap_or("*").to_owned()),
            _ => {}
        }
        let origin = origin?;
        if self.list.iter().any(|o| o == origin) || self.regexes.iter().any(|r| r.is_match(origin))
        {
            return Some(origin.to_owned());
        }
        None
    }
}

impl Plugin for Cors {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Rewrite, Phase::HeaderFilter])
    }
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        if ctx.req.head.method_str() == "OPTIONS" {
            return Flow::Respond(Response::status(200));
        }
        Flow::Continue
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, _status: u16) {
        let origin = ctx
            .req
            .head
            .header("origin")
            .and_then(|v| std::str::from_utf8(v).ok());
        let Some(allow) = self.allowed_origin(origin) else {
            return;
        };
        let allow_headers = if self.headers == "**" {
            ctx.req
                .head
                .header("access-control-request-headers")
                .map(Bytes::copy_from_slice)
        } else {
            Some(Bytes::from(self.headers.clone()))
        };
        let r = &mut ctx.resp;
        if allow != "*" {
            r.add_headers
                .push((Bytes::from_static(b"Vary"), Bytes::from_static(b"Origin")));
        }
        let set = &mut r.set_headers;
        set.push((
            Bytes::from_static(b"Access-Control-Allow-Origin"),
            Bytes::from(allow),
        ));
        set.push((
            Bytes::from_static(b"Access-Control-Allow-Methods"),
            self.methods.clone(),
        ));
        set.push((
            Bytes::from_static(b"Access-Control-Max-Age"),
            self.max_age.clone(),
        ));
        if let Some(e) = &self.expose {
            set.push((
                Bytes::from_static(b"Access-Control-Expose-Headers"),
                e.clone(),
            ));
        }
        if let Some(h) = allow_headers {
            set.push((Bytes::from_static(b"Access-Control-Allow-Headers"), h));
        }
        if self.credential {
            set.push((
                Bytes::from_static(b"Access-Control-Allow-Credentials"),
                Bytes::from_static(b"true"),
            ));
        }
    }
}
