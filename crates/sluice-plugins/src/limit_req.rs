//! limit-req (priority 1001, access): a leaky bucket of `rate` requests per second with `burst` excess per key
//! (lua-resty-limit-req's algorithm, [`crate::counters::leak`]). Requests beyond `rate + burst` are rejected; a
//! request within the burst is delayed by `excess / rate` seconds (unless `nodelay`), the sleep the proxy awaits
//! through [`Ctx::add_delay`] without blocking its thread. Policy `local` keeps the buckets in this process
//! (exact across worker threads); `redis` / `redis-cluster` share them cluster-wide with batched, asynchronous
//! syncs ([`remote`]). Not here: the bucket arithmetic (`counters.rs`), the Redis plumbing ([`crate::redis_sync`]).

pub(crate) mod remote;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, BucketStore};
use crate::redis_sync::{fnv, with_redis_schema, RedisConf, Syncer};
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
    c.redis.connect(remote::SYNC).map(drop)
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
    /// Policy redis / redis-cluster: the backend's syncer and this plugin's stable key prefix.
    remote: Option<(Arc<Syncer<remote::Bucket>>, String)>,
    allow_degradation: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let scope_name = env.consumer_scope();
    let remote = match c.redis.connect(remote::SYNC)? {
        Some(conn) => {
            let prefix = match &scope_name {
                None => format!("plugin-limit-req:{:016x}", fnv(&v.to_string())),
                Some(u) => format!("plugin-limit-req:{:016x}:consumer:{u}", fnv(&v.to_string())),
            };
            Some((env.shared.req_remote.syncer(conn), prefix))
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
        let leak = match &self.remote {
            None => {
                let k = key_hash((self.scope, ctx.route_id, &*key));
                self.store.incoming(k, self.rate, self.burst)
            }
            Some((syncer, prefix)) => {
                if let Some(flow) = syncer.down(self.allow_degradation) {
                    return flow;
                }
                let name = format!("{prefix}:{}:{key}", ctx.route_id);
                remote::Bucket::of(syncer, &name, self.rate, self.burst).incoming(self.burst)
            }
        };
        match leak {
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
