//! limit-conn (priority 1003, access): at most `conn` + `burst` requests in flight per key. Requests between
//! `conn` and `conn + burst` are admitted at once (APISIX delays them by `default_conn_delay`; the synchronous
//! hook contract cannot sleep, see docs/plugins/limit-conn.md). The slot is released when the request context
//! is dropped, which covers every way a request ends.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, ConnStore};
use crate::registry::Entry;
use crate::util::{parse, reject, LimitKey};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "limit-conn";
pub const PRIORITY: i32 = 1003;

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
            "conn": {"type": "integer", "exclusiveMinimum": 0},
            "burst": {"type": "integer", "minimum": 0},
            "default_conn_delay": {"type": "number", "exclusiveMinimum": 0},
            "only_use_default_delay": {"type": "boolean", "default": false},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "allow_degradation": {"type": "boolean", "default": false}
        },
        "required": ["conn", "burst", "default_conn_delay", "key"]
    })
}

#[derive(Deserialize)]
struct Conf {
    conn: i64,
    burst: i64,
    key: String,
    #[serde(default = "crate::limit_count::var")]
    key_type: String,
    #[serde(default = "crate::limit_count::code503")]
    rejected_code: u16,
    rejected_msg: Option<String>,
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

/// One occupied slot; dropping it frees the slot.
pub(crate) struct Held(Arc<AtomicI64>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct LimitConn {
    max: i64,
    key: LimitKey,
    scope: u64,
    rejected_code: u16,
    rejected_msg: Option<String>,
    store: Arc<ConnStore>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(LimitConn {
        max: c.conn + c.burst,
        key: LimitKey::compile(&c.key_type, &c.key)?,
        scope: key_hash(("limit-conn", v.to_string(), env.consumer_scope())),
        rejected_code: c.rejected_code,
        rejected_msg: c.rejected_msg,
        store: env.shared.conns.clone(),
    }))
}

impl Plugin for LimitConn {
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
        let (slot, n) = self
            .store
            .enter(key_hash((self.scope, ctx.route_id, &*key)));
        let held = Held(slot);
        if n > self.max {
            drop(held);
            return Flow::Respond(reject(self.rejected_code, self.rejected_msg.as_deref()));
        }
        ctx.held.push(held);
        Flow::Continue
    }
}
