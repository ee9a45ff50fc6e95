//! limit-req (priority 1001, access): a leaky bucket of `rate` requests per second with `burst` excess per key
//! (lua-resty-limit-req's algorithm, [`crate::counters::leak`]). Requests beyond `rate + burst` are rejected; a
//! request within the burst is delayed by `excess / rate` seconds (unless `nodelay`), the sleep the proxy awaits
//! through [`Ctx::add_delay`] without blocking its thread. Policy `local` keeps the buckets in this process
//! (exact across worker threads); `redis` / `redis-cluster` run the bucket in Redis for every request, exact
//! cluster-wide as APISIX ([`remote`]). Not here: the bucket arithmetic (`counters.rs`), the Redis plumbing
//! ([`crate::redis_sync`], [`crate::redis_lease`]).

pub(crate) mod remote;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, BucketStore};
use crate::redis_lease::Leaser;
use crate::redis_sync::{fnv, with_redis_schema, RedisConf};
use crate::registry::Entry;
use crate::util::{parse, reject, LimitKey};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Resume};

pub const NAME: &str = "limit-req";
pub const PRIORITY: i32 = 1001;

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
    with_redis_schema(json!({
        "type": "object",
        "properties": {
            "rate": {"type": "number", "exclusiveMinimum": 0},
            "burst": {"type": "number", "minimum": 0},
            "key": {"type": "string"},
            "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "nodelay": {"type": "boolean", "default": false}
        },
        "required": ["rate", "burst", "key"]
    }))
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
    #[serde(default)]
    allow_degradation: bool,
    #[serde(flatten)]
    redis: RedisConf,
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    c.redis.connect().map(drop)
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
    /// Policy redis / redis-cluster: the backend's queue, this plugin's stable key prefix, the wait budget.
    remote: Option<(Arc<Leaser>, String, Duration)>,
    allow_degradation: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let scope_name = env.consumer_scope();
    let remote = match c.redis.connect()? {
        Some(conn) => {
            let prefix = match &scope_name {
                None => format!("limit_req:{:016x}", fnv(&v.to_string())),
                Some(u) => format!("limit_req:{:016x}:consumer:{u}", fnv(&v.to_string())),
            };
            let budget = crate::limit_count::remote::wait_budget(conn.timeout);
            Some((env.shared.req_remote.leaser(conn, NAME), prefix, budget))
        }
        None => None,
    };
    Ok(Arc::new(LimitReq {
        rate: c.rate,
        burst: c.burst,
        key: LimitKey::compile(&c.key_type, &c.key)?,
        scope: key_hash(("limit-req", v.to_string(), scope_name)),
        rejected_code: c.rejected_code,
        rejected_msg: c.rejected_msg,
        nodelay: c.nodelay,
        store: env.shared.buckets.clone(),
        remote,
        allow_degradation: c.allow_degradation,
    }))
}

impl LimitReq {
    /// Runs the bucket in Redis; the chain resumes with the decision (and its wait) once Redis answered.
    fn remote(
        &self,
        ctx: &mut Ctx<'_>,
        leaser: &Arc<Leaser>,
        name: &str,
        budget: Duration,
    ) -> Flow {
        let rx = remote::incoming(leaser, name, self.rate, self.burst);
        let (rate, nodelay, degrade) = (self.rate, self.nodelay, self.allow_degradation);
        let (code, msg) = (self.rejected_code, self.rejected_msg.clone());
        let fut = async move {
            let answer = tokio::time::timeout(budget, rx).await;
            Box::new(move |ctx: &mut Ctx<'_>| match answer {
                Ok(Ok(Some((1, excess)))) => {
                    let d = remote::delay(&excess, rate);
                    // APISIX sleeps only delays of at least 1 ms.
                    if d >= Duration::from_millis(1) && !nodelay {
                        ctx.add_delay(d);
                    }
                    Flow::Continue
                }
                Ok(Ok(Some(_))) => Flow::Respond(reject(code, msg.as_deref())),
                // APISIX's bare `return 500`, or uncounted with `allow_degradation`.
                _ if degrade => Flow::Continue,
                _ => Flow::Respond(reject(500, None)),
            }) as Resume
        };
        ctx.await_io(fut, budget * 4, reject(500, None));
        Flow::Continue
    }
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
        if let Some((leaser, prefix, budget)) = &self.remote {
            let name = format!("{prefix}:{}:{key}", ctx.route_id);
            return self.remote(ctx, leaser, &name, *budget);
        }
        let k = key_hash((self.scope, ctx.route_id, &*key));
        match self.store.incoming(k, self.rate, self.burst) {
            Ok(delay_ms) => {
                // APISIX sleeps only delays of at least 1 ms.
                if delay_ms >= 1 && !self.nodelay {
                    ctx.add_delay(Duration::from_millis(delay_ms));
                }
                Flow::Continue
            }
            Err(()) => Flow::Respond(reject(self.rejected_code, self.rejected_msg.as_deref())),
        }
    }
}
