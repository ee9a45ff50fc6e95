//! uri-blocker (priority 2900, rewrite), as APISIX's apisix/plugins/uri-blocker.lua: `block_rules` are regexes
//! joined with `|` (prefixed `(?i)` with `case_insensitive`) and searched, unanchored, in the request URI with its
//! query string. A match answers `rejected_code` (default 403): `{"error_msg": rejected_msg}` when the message is
//! set, else the bare status page. Nothing reaches the upstream.
//!
//! APISIX searches nginx's raw `$request_uri`, so `/%61dmin` slips past a rule `^/admin` there. Sluice searches the
//! raw target and, when normalisation changed it (percent-decoding, dot segments, merged slashes), the normalised
//! URI with the same query too: a rule written for the raw form (`\.\./`, `%00`) still matches, and an encoded
//! spelling of a blocked path cannot get around it.

use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::{parse, reject};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "uri-blocker";
pub const PRIORITY: i32 = 2900;

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
            "block_rules": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                "uniqueItems": true
            },
            "rejected_code": {"type": "integer", "minimum": 200, "default": 403},
            "rejected_msg": {"type": "string", "minLength": 1},
            "case_insensitive": {"type": "boolean", "default": false}
        },
        "required": ["block_rules"]
    })
}

#[derive(Deserialize)]
struct Conf {
    block_rules: Vec<String>,
    #[serde(default = "forbidden")]
    rejected_code: u16,
    rejected_msg: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
}

fn forbidden() -> u16 {
    403
}

/// Each rule on its own first (so an error names the rule, as APISIX's check does), then the joined pattern.
fn rules(c: &Conf) -> Result<Regex, String> {
    for r in &c.block_rules {
        Regex::new(r).map_err(|e| format!("invalid block rule {r:?}: {e}"))?;
    }
    let joined = c.block_rules.join("|");
    let joined = if c.case_insensitive {
        format!("(?i){joined}")
    } else {
        joined
    };
    Regex::new(&joined).map_err(|e| format!("invalid block rules: {e}"))
}

fn conf(v: &Value) -> Result<Conf, String> {
    let c: Conf = parse(&schema(), v)?;
    // The schema has no maximum; a status past 599 cannot be written on the wire.
    if c.rejected_code > 599 {
        return Err("property \"rejected_code\" validation failed: expected at most 599".into());
    }
    Ok(c)
}

fn check(v: &Value) -> Result<(), String> {
    rules(&conf(v)?).map(drop)
}

struct UriBlocker {
    rules: Regex,
    code: u16,
    msg: Option<String>,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c = conf(v)?;
    Ok(Arc::new(UriBlocker {
        rules: rules(&c)?,
        code: c.rejected_code,
        msg: c.rejected_msg,
    }))
}

impl Plugin for UriBlocker {
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
        let raw = ctx.req.head.target_str();
        let blocked = self.rules.is_match(raw) || {
            let normalised = ctx.req.request_uri();
            *normalised != *raw && self.rules.is_match(&normalised)
        };
        if blocked {
            return Flow::Respond(reject(self.code, self.msg.as_deref()));
        }
        Flow::Continue
    }
}
