//! limit-req (priority 1001, access): a leaky bucket of `rate` requests per second with `burst` excess per key
//! (lua-resty-limit-req's algorithm, [`crate::counters::leak`]). Requests beyond `rate + burst` are rejected; a
//! request within the burst is delayed by `excess / rate` seconds (unless `nodelay`), the sleep the proxy awaits
//! through [`Ctx::add_delay`] without blocking its thread. Policy `local` keeps the buckets in this process
//! (exact across worker threads); `redis` / `redis-cluster` share them cluster-wide with batched, asynchronous
//! syncs ([`remote`]). Not here: the bucket arithmetic (`counters.rs`), Redis connections (limit-count's).

pub(crate) mod remote;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, BucketStore};
use crate::limit_count::remote::Backend;
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
            "allow_degradation": {"type": "boolean", "default": false},
            "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster"], "default": "local"},
            "redis_host": {"type": "string", "minLength": 2},
            "redis_port": {"type": "integer", "minimum": 1, "default": 6379},
            "redis_username": {"type": "string", "minLength": 1},
            "redis_password": {"type": "string", "minLength": 0},
            "redis_database": {"type": "integer", "minimum": 0, "default": 0},
            "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
            "redis_ssl": {"type": "boolean", "default": false},
            "redis_cluster_nodes": {"type": "array", "minItems": 1,
                                    "items": {"type": "string", "minLength": 2, "maxLength": 100}},
            "redis_cluster_name": {"type": "string"}
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
    #[serde(default)]
    allow_degradation: bool,
    #[serde(flatten)]
    redis: RedisConf,
}

/// The Redis fields, named and defaulted as limit-count's.
#[derive(Deserialize)]
struct RedisConf {
    #[serde(default = "local")]
    policy: String,
    redis_host: Option<String>,
    #[serde(default = "port")]
    redis_port: u16,
    redis_username: Option<String>,
    redis_password: Option<String>,
    #[serde(default)]
    redis_database: u32,
    #[serde(default = "ms1000")]
    redis_timeout: u64,
    #[serde(default)]
    redis_ssl: bool,
    #[serde(default)]
    redis_cluster_nodes: Vec<String>,
}

fn local() -> String {
    "local".into()
}
fn port() -> u16 {
    6379
}
fn ms1000() -> u64 {
    1000
}

impl RedisConf {
    /// `None` for policy `local`.
    fn connect(&self) -> Result<Option<remote::Connect>, String> {
        let auth = match (&self.redis_username, &self.redis_password) {
            (Some(u), Some(p)) => format!("{u}:{p}@"),
            (None, Some(p)) if !p.is_empty() => format!(":{p}@"),
            _ => String::new(),
        };
        let scheme = if self.redis_ssl { "rediss" } else { "redis" };
        let backend = match self.policy.as_str() {
            "local" => return Ok(None),
            "redis" => {
                let host = self
                    .redis_host
                    .as_deref()
                    .ok_or("property \"redis_host\" is required")?;
                Backend::Single {
                    url: format!(
                        "{scheme}://{auth}{host}:{}/{}",
                        self.redis_port, self.redis_database
                    ),
                }
            }
            _ => {
                if self.redis_cluster_nodes.len() < 2 {
                    return Err("property \"redis_cluster_nodes\" needs at least 2 nodes".into());
                }
                Backend::Cluster {
                    urls: self
                        .redis_cluster_nodes
                        .iter()
                        .map(|n| format!("{scheme}://{n}"))
                        .collect(),
                }
            }
        };
        Ok(Some(remote::Connect {
            backend,
            password: self.redis_password.clone().filter(|p| !p.is_empty()),
            timeout: Duration::from_millis(self.redis_timeout),
        }))
    }
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    c.redis.connect().map(drop)
}

/// A 64-bit FNV-1a: the same on every node, so every node names a key's Redis bucket alike.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
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
    remote: Option<(Arc<remote::Syncer>, String)>,
    allow_degradation: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let scope_name = env.consumer_scope();
    let remote = match c.redis.connect()? {
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
                if !syncer.healthy() {
                    if self.allow_degradation {
                        return Flow::Continue;
                    }
                    return Flow::Respond(reject(500, Some("failed to limit req")));
                }
                let name = format!("{prefix}:{}:{key}", ctx.route_id);
                syncer
                    .bucket(&name, self.rate, self.burst)
                    .incoming(self.burst)
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
