//! limit-req (priority 1001, access): a leaky bucket of `rate` requests per second with `burst` excess per key
//! (lua-resty-limit-req's algorithm, [`crate::counters::BucketStore`]). Requests beyond `rate + burst` are
//! rejected; a request within the burst is delayed by `excess / rate` seconds (unless `nodelay`), the sleep the
//! proxy awaits through [`Ctx::add_delay`] without blocking its thread. Not here: the bucket arithmetic
//! (`counters.rs`).

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, BucketStore};
use crate::registry::Entry;
use crate::util::{parse, reject, LimitKey};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "limit-req";
pub const PRIORITY: i32 = 1001;

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
            "rate": {"type": "number", "exclusiveMinimum": 0},
            "burst": {"type": "number", "minimum": 0},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "nodelay": {"type": "boolean", "default": false},
            "allow_degradation": {"type": "boolean", "default": false}
        },
        "required": ["rate", "burst", "key"]
    })
}

#[derive(Deserialize)]
struct Conf {
    rate: f64,
    burst: f64,
    key: String,
    #[serde(default = "crate::limit_count::var")]
    key_type: String,
    #[serde(default = "crate::limit_count::code503")]
    rejected_code: u16,
    rejected_msg: Option<String>,
    #[serde(default)]
    nodelay: bool,
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

struct LimitReq {
    rate: f64,
    burst: f64,
    key: LimitKey,
    scope: u64,
    rejected_code: u16,
    rejected_msg: Option<String>,
    nodelay: bool,
    store: Arc<BucketStore>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(LimitReq {
        rate: c.rate,
        burst: c.burst,
        key: LimitKey::compile(&c.key_type, &c.key)?,
        scope: key_hash(("limit-req", v.to_string(), env.consumer_scope())),
        rejected_code: c.rejected_code,
        rejected_msg: c.rejected_msg,
        nodelay: c.nodelay,
        store: env.shared.buckets.clone(),
    }))
}

impl Plugin for LimitReq {
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
        let key = self.key.resolve(ctx);
        let k = key_hash((self.scope, ctx.route_id, &*key));
        match self.store.incoming(k, self.rate, self.burst) {
            Ok(delay_ms) => {
                // APISIX sleeps only delays of at least 1 ms.
                if delay_ms >= 1 && !self.nodelay {
                    ctx.add_delay(std::time::Duration::from_millis(delay_ms));
                }
                Flow::Continue
            }
            Err(()) => Flow::Respond(reject(self.rejected_code, self.rejected_msg.as_deref())),
        }
    }
}
