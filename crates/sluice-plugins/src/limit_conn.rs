//! limit-conn (priority 1003, access): at most `conn` + `burst` requests in flight per key. A request admitted as
//! the n-th in flight with n > `conn` waits `unit_delay * floor((n - 1) / conn)` seconds (lua-resty-limit-conn),
//! a sleep the proxy awaits through [`Ctx::add_delay`]. `unit_delay` starts at `default_conn_delay` and, unless
//! `only_use_default_delay`, follows the requests' latency: each finished request sets it to the mean of itself
//! and that request's latency, as `lim:leaving(key, latency)` does. The slot is released when the request
//! context is dropped, which covers every way a request ends. Not here: the in-flight map (`counters.rs`).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    secrets: sluice_secrets::SecretFields {
        conf: &["redis_password"],
        consumer: None,
        metadata: &[],
    },
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
            "allow_degradation": {"type": "boolean", "default": false},
            "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster"], "default": "local"}
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
    default_conn_delay: f64,
    #[serde(default)]
    only_use_default_delay: bool,
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v)?;
    // APISIX 3.11+ counts in Redis too; refused rather than silently counted per node.
    match v.get("policy").and_then(Value::as_str) {
        None | Some("local") => Ok(()),
        Some(p) => Err(format!("policy {p} is not supported yet (local only)")),
    }
}

/// One occupied slot; dropping it frees the slot and, for an adaptive delay, feeds the request's latency back.
pub(crate) struct Held {
    slot: Arc<AtomicI64>,
    adapt: Option<Adapt>,
}

struct Adapt {
    /// The plugin's `unit_delay` in seconds, as `f64` bits.
    unit: Arc<AtomicU64>,
    start: Instant,
    delay: Duration,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Ordering::AcqRel);
        if let Some(a) = &self.adapt {
            // APISIX: `request_time - delay` (the upstream's time when proxied; the whole request here).
            let latency = a.start.elapsed().saturating_sub(a.delay).as_secs_f64();
            let unit = f64::from_bits(a.unit.load(Ordering::Relaxed));
            // A racing update loses one sample, as concurrent `leaving` calls in an nginx worker would not.
            a.unit
                .store(((latency + unit) / 2.0).to_bits(), Ordering::Relaxed);
        }
    }
}

struct LimitConn {
    conn: i64,
    max: i64,
    /// `unit_delay` in seconds as `f64` bits; fixed when `only_use_default_delay`.
    unit: Arc<AtomicU64>,
    adaptive: bool,
    key: LimitKey,
    scope: u64,
    rejected_code: u16,
    rejected_msg: Option<String>,
    store: Arc<ConnStore>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(LimitConn {
        conn: c.conn,
        max: c.conn + c.burst,
        unit: Arc::new(AtomicU64::new(c.default_conn_delay.to_bits())),
        adaptive: !c.only_use_default_delay,
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
        if n > self.max {
            slot.fetch_sub(1, Ordering::AcqRel);
            return Flow::Respond(reject(self.rejected_code, self.rejected_msg.as_deref()));
        }
        let delay = if n > self.conn {
            let unit = f64::from_bits(self.unit.load(Ordering::Relaxed));
            let secs = unit * ((n - 1) / self.conn) as f64;
            Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO)
        } else {
            Duration::ZERO
        };
        // APISIX sleeps only delays of at least 1 ms.
        if delay >= Duration::from_millis(1) {
            ctx.add_delay(delay);
        }
        ctx.held.push(Held {
            slot,
            adapt: self.adaptive.then(|| Adapt {
                unit: self.unit.clone(),
                start: Instant::now(),
                delay,
            }),
        });
        Flow::Continue
    }
}
