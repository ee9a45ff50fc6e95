//! consumer-restriction (priority 2400, access): allows (`whitelist`) or denies (`blacklist`) requests by the
//! authenticated `consumer_name`, the consumer's `consumer_group_id`, the `route_id` or the route's `service_id`.
//! `allowed_by_methods` narrows a consumer to some methods. Without a consumer it answers 401
//! "Missing authentication or identity verification."; a refusal answers `rejected_code` (403) with
//! "The consumer_name is forbidden." or `rejected_msg`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "consumer-restriction";
pub const PRIORITY: i32 = 2400;

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
    let list = json!({"type": "array", "minItems": 1, "items": {"type": "string"}});
    json!({
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["consumer_name", "service_id", "route_id", "consumer_group_id"],
                     "default": "consumer_name"},
            "blacklist": list,
            "whitelist": list,
            "allowed_by_methods": {"type": "array", "items": {"type": "object", "properties": {
                "user": {"type": "string"},
                "methods": {"type": "array", "minItems": 1, "items": {"type": "string", "enum":
                    ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE", "PURGE"]}}
            }}},
            "rejected_code": {"type": "integer", "minimum": 200, "default": 403},
            "rejected_msg": {"type": "string"}
        },
        "anyOf": [{"required": ["blacklist"]}, {"required": ["whitelist"]}, {"required": ["allowed_by_methods"]}]
    })
}

#[derive(Deserialize)]
struct ByMethod {
    user: String,
    methods: Vec<String>,
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default = "default_type", rename = "type")]
    kind: String,
    blacklist: Option<Vec<String>>,
    whitelist: Option<Vec<String>>,
    #[serde(default)]
    allowed_by_methods: Vec<ByMethod>,
    #[serde(default = "default_code")]
    rejected_code: u16,
    rejected_msg: Option<String>,
}

fn default_type() -> String {
    "consumer_name".into()
}
fn default_code() -> u16 {
    403
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(|_| ())
}

#[derive(Clone, Copy)]
enum By {
    Consumer,
    Group,
    Route,
    Service,
}

struct ConsumerRestriction {
    by: By,
    blacklist: Vec<String>,
    whitelist: Option<Vec<String>>,
    by_method: Vec<ByMethod>,
    code: u16,
    message: String,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let by = match c.kind.as_str() {
        "consumer_group_id" => By::Group,
        "route_id" => By::Route,
        "service_id" => By::Service,
        _ => By::Consumer,
    };
    let message = c
        .rejected_msg
        .unwrap_or_else(|| format!("The {} is forbidden.", c.kind));
    Ok(Arc::new(ConsumerRestriction {
        by,
        blacklist: c.blacklist.unwrap_or_default(),
        whitelist: c.whitelist,
        by_method: c.allowed_by_methods,
        code: c.rejected_code,
        message,
    }))
}

impl Plugin for ConsumerRestriction {
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
        let value = match self.by {
            By::Consumer => ctx.consumer_name(),
            By::Group => ctx
                .consumer
                .as_deref()
                .and_then(|c| c.group_id.as_ref())
                .map(|g| g.0.as_str()),
            By::Route => Some(ctx.route_id),
            By::Service => ctx.service_id(),
        };
        let Some(value) = value else {
            return Flow::Respond(Response::message(
                401,
                "Missing authentication or identity verification.",
            ));
        };
        let mut block = self.blacklist.iter().any(|b| b == value);
        if let Some(w) = &self.whitelist {
            if !w.iter().any(|x| x == value) {
                block = true;
            }
        }
        if !self.by_method.is_empty() {
            let method = ctx.req.head.method_str();
            if let Some(m) = self.by_method.iter().find(|m| m.user == value) {
                if !m.methods.iter().any(|x| x == method) {
                    block = true;
                }
            }
        }
        if block {
            return Flow::Respond(Response::message(self.code, &self.message));
        }
        Flow::Continue
    }
}
