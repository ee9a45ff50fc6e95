//! ua-restriction (priority 2999, access): `allowlist` / `denylist` regexes (unanchored, as `ngx.re.find`)
//! against the trimmed User-Agent. An allowlist match wins over the denylist; a missing User-Agent is rejected
//! unless `bypass_missing`. Rejects with 403 `{"message": message}` (default "Not allowed").

use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "ua-restriction";
pub const PRIORITY: i32 = 2999;

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
            "bypass_missing": {"type": "boolean", "default": false},
            "allowlist": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "denylist": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "message": {"type": "string", "minLength": 1, "maxLength": 1024, "default": "Not allowed"}
        }
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    bypass_missing: bool,
    #[serde(default)]
    allowlist: Vec<String>,
    #[serde(default)]
    denylist: Vec<String>,
    #[serde(default = "default_message")]
    message: String,
}

fn default_message() -> String {
    "Not allowed".into()
}

fn regexes(list: &[String]) -> Result<Vec<Regex>, String> {
    list.iter()
        .map(|r| Regex::new(r).map_err(|e| format!("invalid regex {r:?}: {e}")))
        .collect()
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    regexes(&c.allowlist)?;
    regexes(&c.denylist).map(drop)
}

struct UaRestriction {
    bypass_missing: bool,
    allow: Vec<Regex>,
    deny: Vec<Regex>,
    message: String,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(UaRestriction {
        bypass_missing: c.bypass_missing,
        allow: regexes(&c.allowlist)?,
        deny: regexes(&c.denylist)?,
        message: c.message,
    }))
}

impl UaRestriction {
    fn denied(&self, ua: &str) -> bool {
        let ua = ua.trim();
        if self.allow.iter().any(|r| r.is_match(ua)) {
            return false;
        }
        self.deny.iter().any(|r| r.is_match(ua))
    }
}

impl Plugin for UaRestriction {
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
        let mut any = false;
        let mut denied = false;
        for (n, v) in ctx.req.head.headers_iter() {
            if n.eq_ignore_ascii_case(b"user-agent") {
                any = true;
                if self.denied(&String::from_utf8_lossy(v)) {
                    denied = true;
                    break;
                }
            }
        }
        if (!any && !self.bypass_missing) || denied {
            return Flow::Respond(Response::message(403, &self.message));
        }
        Flow::Continue
    }
}
