//! limit-count (priority 1002, access): a fixed window of `count` requests per `time_window` seconds per key.
//! Keys follow APISIX: `key_type` var / var_combination / constant, falling back to the client address; windows
//! are scoped per route and configuration unless a `group` shares them. Policy `local` counts exactly across
//! every worker thread ([`crate::counters::WindowStore`]); the windows live in [`crate::Shared`], so a reload
//! that keeps a route's configuration keeps its counts. Policies `redis` / `redis-cluster` / `redis-sentinel`
//! count exactly cluster-wide by leasing slices of each window's quota from Redis ([`remote`]).

pub(crate) mod remote;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, Quota, WindowStore, MAX_COUNT};
use crate::redis_sync::{fnv, with_sentinel_schema, Connect, RedisConf};
use crate::registry::Entry;
use crate::util::{parse, reject, LimitKey};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Resume};

pub const NAME: &str = "limit-count";
pub const PRIORITY: i32 = 1002;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &["redis_password", "sentinel_password"],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    with_sentinel_schema(json!({
        "type": "object",
        "properties": {
            "count": {"type": "integer", "exclusiveMinimum": 0},
            "time_window": {"type": "integer", "exclusiveMinimum": 0},
            "group": {"type": "string"},
            "key": {"type": "string", "default": "remote_addr"},
            "key_type": {"type": "string", "enum": ["var", "var_combination", "constant"], "default": "var"},
            "rejected_code": {"type": "integer", "minimum": 200, "maximum": 599, "default": 503},
            "rejected_msg": {"type": "string", "minLength": 1},
            "sync_interval": {"type": "number", "default": -1},
            "show_limit_quota_header": {"type": "boolean", "default": true}
        },
        "required": ["count", "time_window"]
    }))
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
    #[serde(default = "yes")]
    show_limit_quota_header: bool,
    #[serde(default)]
    allow_degradation: bool,
    #[serde(default = "neg")]
    sync_interval: f64,
    #[serde(flatten)]
    redis: RedisConf,
}

fn neg() -> f64 {
    -1.0
}

fn remote_connect(c: &Conf) -> Result<Option<Connect>, String> {
    // `sync_interval` (APISIX's delayed sync) is accepted and has no use: leases keep the count exact.
    let _ = c.sync_interval;
    c.redis.connect()
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
    answer: Arc<Answer>,
    windows: Arc<WindowStore>,
    /// Policy redis / redis-cluster: the backend's windows and this plugin's stable key prefix.
    remote: Option<(Arc<remote::Windows>, String)>,
    /// How long a request may wait for a lease.
    budget: Duration,
}

/// How a decision is answered (shared with the requests that await a lease).
struct Answer {
    rejected_code: u16,
    rejected_msg: Option<String>,
    show_headers: bool,
    limit_header: Bytes,
    allow_degradation: bool,
}

impl Answer {
    fn apply(&self, ctx: &mut Ctx<'_>, q: Quota) -> Flow {
        if self.show_headers {
            let set = &mut ctx.resp.set_headers;
            set.reserve(3);
            set.push((
                Bytes::from_static(b"X-RateLimit-Limit"),
                self.limit_header.clone(),
            ));
            set.push((
                Bytes::from_static(b"X-RateLimit-Remaining"),
                crate::util::decimal(q.remaining),
            ));
            set.push((
                Bytes::from_static(b"X-RateLimit-Reset"),
                crate::util::decimal(q.reset),
            ));
        }
        if q.allowed {
            Flow::Continue
        } else {
            Flow::Respond(reject(self.rejected_code, self.rejected_msg.as_deref()))
        }
    }

    /// Redis could not be asked: APISIX's 500, or the request passes uncounted with `allow_degradation`.
    fn failed(&self) -> Flow {
        if self.allow_degradation {
            Flow::Continue
        } else {
            Flow::Respond(reject(500, Some(DOWN_MSG)))
        }
    }
}

const DOWN_MSG: &str = "failed to limit count";

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
            Some((env.shared.remote.windows(conn), prefix))
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
        answer: Arc::new(Answer {
            rejected_code: c.rejected_code,
            rejected_msg: c.rejected_msg,
            show_headers: c.show_limit_quota_header,
            limit_header: Bytes::from(c.count.to_string()),
            allow_degradation: c.allow_degradation,
        }),
        windows: env.shared.windows.clone(),
        remote,
        budget: remote::wait_budget(Duration::from_millis(c.redis.timeout_ms())),
    }))
}

impl LimitCount {
    /// Parks the request until the lease in flight answers (see [`remote`]): the chain resumes with its decision.
    fn await_lease(
        &self,
        ctx: &mut Ctx<'_>,
        w: Arc<remote::Window>,
        leaser: Arc<crate::redis_lease::Leaser>,
        mut rx: tokio::sync::oneshot::Receiver<remote::Outcome>,
    ) {
        let answer = self.answer.clone();
        let budget = self.budget;
        let fut = async move {
            let quota = loop {
                match tokio::time::timeout(budget, &mut rx).await {
                    Ok(Ok(remote::Outcome::Decided(q))) => break Some(q),
                    Ok(Ok(remote::Outcome::Again)) => match w.incoming(&leaser) {
                        remote::Step::Decided(q) => break Some(q),
                        remote::Step::Wait(next) => rx = next,
                    },
                    _ => break None,
                }
            };
            Box::new(move |ctx: &mut Ctx<'_>| match quota {
                Some(q) => answer.apply(ctx, q),
                None => answer.failed(),
            }) as Resume
        };
        // The loop's own timeout answers first (and degrades when allowed); this bound is a backstop.
        ctx.await_io(fut, budget * 4, reject(500, Some(DOWN_MSG)));
    }
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
                let now = match ctx.started {
                    Some(t) => crate::counters::ms_at(t),
                    None => crate::counters::now_ms(),
                };
                self.windows
                    .incoming_at(now, k, self.count, self.window_ms, 1)
            }
            Some((windows, prefix)) => {
                let name = if self.grouped {
                    format!("{prefix}:{key}")
                } else {
                    format!("{prefix}:{}:{key}", ctx.route_id)
                };
                let w = windows.window(name, self.count, self.window_ms);
                match w.incoming(&windows.leaser) {
                    remote::Step::Decided(q) => q,
                    remote::Step::Wait(rx) => {
                        self.await_lease(ctx, w, windows.leaser.clone(), rx);
                        return Flow::Continue;
                    }
                }
            }
        };
        self.answer.apply(ctx, q)
    }
}
