//! limit-count (priority 1002, access): a fixed window of `count` requests per `time_window` seconds per key.
//! Keys follow APISIX: `key_type` var / var_combination / constant, falling back to the client address; windows
//! are scoped per route and configuration unless a `group` shares them. Policy `local` counts exactly across
//! every worker thread ([`crate::counters::WindowStore`]); the windows live in [`crate::Shared`], so a reload
//! that keeps a route's configuration keeps its counts. Policies `redis` / `redis-cluster` count cluster-wide
//! in Redis with batched, asynchronous syncs ([`remote`]).

pub(crate) mod remote;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, WindowStore, MAX_COUNT};
use crate::registry::Entry;
use crate::util::{parse, reject, LimitKey};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "limit-count";
pub const PRIORITY: i32 = 1002;

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
            "count": {"type": "integer", "exclusiveMinimum": 0},
            "time_window": {"type": "integer", "exclusiveMinimum": 0},
            "group": {"type": "string"},
            "key": {"type": "string", "default": "remote_addr"},
            "key_type": {"type": "string", "enum": ["var", "var_combination", "constant"], "default": "var"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster"], "default": "local"},
            "allow_degradation": {"type": "boolean", "default": false},
            "redis_host": {"type": "string", "minLength": 2},
            "redis_port": {"type": "integer", "minimum": 1, "default": 6379},
            "redis_username": {"type": "string", "minLength": 1},
            "redis_password": {"type": "string", "minLength": 0},
            "redis_database": {"type": "integer", "minimum": 0, "default": 0},
            "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
            "redis_ssl": {"type": "boolean", "default": false},
            "redis_cluster_nodes": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 2, "maxLength": 100}},
            "redis_cluster_name": {"type": "string"},
            "sync_interval": {"type": "number", "default": -1},
            "show_limit_quota_header": {"type": "boolean", "default": true}
        },
        "required": ["count", "time_window"]
    })
}

#[derive(Deserialize)]
struct Conf {
    count: u64,
    time_window: u64,
    group: Option<String>,
    #[serde(default = "remote_addr")]
    key: String,
    #[serde(default = "var")]
    key_type: String,
    #[serde(default = "code503")]
    rejected_code: u16,
    rejected_msg: Option<String>,
    #[serde(default = "local")]
    policy: String,
    #[serde(default = "yes")]
    show_limit_quota_header: bool,
    #[serde(default)]
    allow_degradation: bool,
    redis_host: Option<String>,
    #[serde(default = "port6379")]
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
    #[serde(default = "neg")]
    sync_interval: f64,
}

fn port6379() -> u16 {
    6379
}
fn ms1000() -> u64 {
    1000
}
fn neg() -> f64 {
    -1.0
}

/// Batching interval when `sync_interval` is unset: short enough to stay close to APISIX's exact counting.
const DEFAULT_SYNC: Duration = Duration::from_millis(10);

/// A stable 64-bit FNV-1a (the same on every node, unlike the per-process seeded hashes).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn remote_connect(c: &Conf) -> Result<Option<remote::Connect>, String> {
    let timeout = Duration::from_millis(c.redis_timeout);
    let interval = if c.sync_interval > 0.0 {
        Duration::from_secs_f64(c.sync_interval)
    } else {
        DEFAULT_SYNC
    };
    let auth = match (&c.redis_username, &c.redis_password) {
        (Some(u), Some(p)) => format!("{u}:{p}@"),
        (None, Some(p)) if !p.is_empty() => format!(":{p}@"),
        _ => String::new(),
    };
    let scheme = if c.redis_ssl { "rediss" } else { "redis" };
    let backend = match c.policy.as_str() {
        "local" => return Ok(None),
        "redis" => {
            let host = c
                .redis_host
                .as_deref()
                .ok_or("property \"redis_host\" is required")?;
            remote::Backend::Single {
                url: format!(
                    "{scheme}://{auth}{host}:{}/{}",
                    c.redis_port, c.redis_database
                ),
            }
        }
        _ => {
            if c.redis_cluster_nodes.len() < 2 {
                return Err("property \"redis_cluster_nodes\" needs at least 2 nodes".into());
            }
            remote::Backend::Cluster {
                urls: c
                    .redis_cluster_nodes
                    .iter()
                    .map(|n| format!("{scheme}://{n}"))
                    .collect(),
            }
        }
    };
    Ok(Some(remote::Connect {
        backend,
        password: c.redis_password.clone().filter(|p| !p.is_empty()),
        timeout,
        interval,
    }))
}

pub(crate) fn remote_addr() -> String {
    "remote_addr".into()
}
pub(crate) fn var() -> String {
    "var".into()
}
pub(crate) fn code503() -> u16 {
    503
}
fn local() -> String {
    "local".into()
}
pub(crate) fn yes() -> bool {
    true
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    if c.count > MAX_COUNT {
        return Err(format!("count above {MAX_COUNT} is not supported"));
    }
    remote_connect(&c).map(drop)
}

struct LimitCount {
    count: u64,
    window_ms: u64,
    key: LimitKey,
    /// The window scope: the group, or this configuration (the route id is added per request).
    scope: u64,
    grouped: bool,
    rejected_code: u16,
    rejected_msg: Option<String>,
    show_headers: bool,
    limit_header: Bytes,
    windows: Arc<WindowStore>,
    /// Policy redis / redis-cluster: the backend's syncer and this plugin's stable key prefix.
    remote: Option<(Arc<remote::Syncer>, String)>,
    allow_degradation: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let remote = match remote_connect(&c)? {
        Some(conn) => {
            let prefix = match (&c.group, env.consumer_scope()) {
                (Some(g), _) => format!("plugin-limit-count:group:{g}"),
                (None, None) => format!("plugin-limit-count:{:016x}", fnv(&v.to_string())),
                (None, Some(u)) => format!(
                    "plugin-limit-count:{:016x}:consumer:{u}",
                    fnv(&v.to_string())
                ),
            };
            Some((env.shared.remote.syncer(conn), prefix))
        }
        None => None,
    };
    let scope = match &c.group {
        Some(g) => key_hash(("group", g)),
        None => key_hash(("conf", v.to_string(), env.consumer_scope())),
    };
    Ok(Arc::new(LimitCount {
        count: c.count,
        window_ms: c.time_window * 1000,
        key: LimitKey::compile(&c.key_type, &c.key)?,
        scope,
        grouped: c.group.is_some(),
        rejected_code: c.rejected_code,
        rejected_msg: c.rejected_msg,
        show_headers: c.show_limit_quota_header,
        limit_header: Bytes::from(c.count.to_string()),
        windows: env.shared.windows.clone(),
        remote,
        allow_degradation: c.allow_degradation,
    }))
}

impl Plugin for LimitCount {
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
        let q = match &self.remote {
            None => {
                let k = if self.grouped {
                    key_hash((self.scope, &*key))
                } else {
                    key_hash((self.scope, ctx.route_id, &*key))
                };
                self.windows.incoming(k, self.count, self.window_ms, 1)
            }
            Some((syncer, prefix)) => {
                if !syncer.healthy() {
                    if self.allow_degradation {
                        return Flow::Continue;
                    }
                    return Flow::Respond(reject(500, Some("failed to limit count")));
                }
                let name = if self.grouped {
                    format!("{prefix}:{key}")
                } else {
                    format!("{prefix}:{}:{key}", ctx.route_id)
                };
                syncer.window(name, self.window_ms).incoming(self.count)
            }
        };
        if self.show_headers {
            let set = &mut ctx.resp.set_headers;
            set.push((
                Bytes::from_static(b"X-RateLimit-Limit"),
                self.limit_header.clone(),
            ));
            set.push((
                Bytes::from_static(b"X-RateLimit-Remaining"),
                Bytes::from(q.remaining.to_string()),
            ));
            set.push((
                Bytes::from_static(b"X-RateLimit-Reset"),
                Bytes::from(q.reset.to_string()),
            ));
        }
        if q.allowed {
            Flow::Continue
        } else {
            Flow::Respond(reject(self.rejected_code, self.rejected_msg.as_deref()))
        }
    }
}
