//! referer-restriction (priority 2990, access): the Referer's host checked against a `whitelist` or
//! `blacklist` of hosts (`*.example.com` matches by suffix). A missing or malformed Referer is rejected unless
//! `bypass_missing`. Rejects with 403 `{"message": message}` (default "Your referer host is not allowed").

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "referer-restriction";
pub const PRIORITY: i32 = 2990;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

const HOST_DEF: &str = "^\\*?[0-9a-zA-Z-._\\[\\]:]+$";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "bypass_missing": {"type": "boolean", "default": false},
            "whitelist": {"type": "array", "items": {"type": "string", "pattern": HOST_DEF}, "minItems": 1},
            "blacklist": {"type": "array", "items": {"type": "string", "pattern": HOST_DEF}, "minItems": 1},
            "message": {"type": "string", "minLength": 1, "maxLength": 1024,
                        "default": "Your referer host is not allowed"}
        },
        "oneOf": [{"required": ["whitelist"]}, {"required": ["blacklist"]}]
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    bypass_missing: bool,
    whitelist: Option<Vec<String>>,
    blacklist: Option<Vec<String>>,
    #[serde(default = "default_message")]
    message: String,
}

fn default_message() -> String {
    "Your referer host is not allowed".into()
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

struct Matcher {
    exact: Vec<String>,
    suffixes: Vec<String>,
}

impl Matcher {
    fn new(hosts: &[String]) -> Matcher {
        let (mut exact, mut suffixes) = (Vec::new(), Vec::new());
        for h in hosts {
            match h.strip_prefix('*') {
                Some(s) => suffixes.push(s.to_owned()),
                None => exact.push(h.clone()),
            }
        }
        Matcher { exact, suffixes }
    }
    fn matches(&self, host: &str) -> bool {
        self.exact.iter().any(|h| h == host)
            || self.suffixes.iter().any(|s| host.ends_with(s.as_str()))
    }
}

struct RefererRestriction {
    bypass_missing: bool,
    matcher: Matcher,
    allow: bool,
    message: String,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let (list, allow) = match (&c.whitelist, &c.blacklist) {
        (Some(w), _) => (w, true),
        (None, Some(b)) => (b, false),
        (None, None) => return Err("whitelist or blacklist is required".into()),
    };
    Ok(Arc::new(RefererRestriction {
        bypass_missing: c.bypass_missing,
        matcher: Matcher::new(list),
        allow,
        message: c.message,
    }))
}

/// The host of an absolute `http(s)://host[:port]/...` URL, as lua-resty-http's `parse_uri` takes it.
pub(crate) fn url_host(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = authority.split(':').next()?;
    (!host.is_empty()).then_some(host)
}

impl Plugin for RefererRestriction {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access])
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let host = ctx
            .req
            .head
            .header("referer")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(url_host);
        let block = match host {
            None => !self.bypass_missing,
            Some(h) => self.matcher.matches(h) != self.allow,
        };
        if block {
            return Flow::Respond(Response::message(403, &self.message));
        }
        Flow::Continue
    }
}
