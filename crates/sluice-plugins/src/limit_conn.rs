//! limit-conn (priority 1003, access): at most `conn` + `burst` requests in flight per key. A request admitted as
//! the n-th in flight with n > `conn` waits `unit_delay * floor((n - 1) / conn)` seconds (lua-resty-limit-conn),
//! a sleep the proxy awaits through [`Ctx::add_delay`]. `unit_delay` starts at `default_conn_delay` and, unless
//! `only_use_default_delay`, follows the requests' latency: each finished request sets it to the mean of itself
//! and that request's latency, as `lim:leaving(key, latency)` does. The slot is released when the request
//! context is dropped, which covers every way a request ends. Not here: the in-flight map (`counters.rs`).
//!
//! Policies `redis` / `redis-cluster` count in Redis, exactly, as APISIX 3.11+: each request adds itself to a
//! sorted set (member: a request id, score: when the entry expires, `key_ttl` seconds on) with one script that
//! first drops expired entries and refuses past `conn + burst`; leaving removes it. That is one awaited round
//! trip per request (the hook waits with [`Ctx::await_io`]; the worker never blocks) and one queued removal:
//! unlike a count per window, an in-flight slot cannot be leased ahead, because which node holds it changes with
//! every request that ends, so a node cannot admit locally without knowing the others' departures. Redis
//! unreachable: 500, or the request passes uncounted with `allow_degradation`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::{key_hash, ConnStore};
use crate::redis_lease::{Job, Leaser};
use crate::redis_sync::{fnv, with_redis_schema, RedisConf};
use crate::registry::Entry;
use crate::util::{parse, reject, LimitKey};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Resume};

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
    let mut s = with_redis_schema(json!({
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
            "key_ttl": {"type": "integer", "default": 3600}
        },
        "required": ["conn", "burst", "default_conn_delay", "key"]
    }));
    // APISIX's limit-conn has no `redis_cluster_name`.
    if let Some(p) = s.get_mut("properties").and_then(Value::as_object_mut) {
        p.remove("redis_cluster_name");
    }
    s
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
    #[serde(default)]
    allow_degradation: bool,
    #[serde(default = "hour")]
    key_ttl: i64,
    #[serde(flatten)]
    redis: RedisConf,
}

fn hour() -> i64 {
    3600
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    c.redis.connect().map(drop)
}

/// KEYS[1]: the key's set of requests in flight. ARGV: the limit (`conn + burst`), `key_ttl`, the request's id.
/// Answers {1, requests in flight with this one} or {0, in flight} when refused. Redis' clock ages the entries.
const ENTER: &str = "local now = tonumber(redis.call('time')[1]) \
redis.call('zremrangebyscore', KEYS[1], 0, now) \
local n = redis.call('zcard', KEYS[1]) \
if n >= tonumber(ARGV[1]) then return {0, n} end \
redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[3]) \
redis.call('expire', KEYS[1], ARGV[2]) \
return {1, n + 1}";

/// One occupied slot; dropping it frees the slot and, for an adaptive delay, feeds the request's latency back.
pub(crate) struct Held {
    slot: Slot,
    adapt: Option<Adapt>,
}

enum Slot {
    Local(Arc<AtomicI64>),
    /// A member of a Redis set: removed (queued, not awaited) when the request ends.
    Remote {
        leaser: Arc<Leaser>,
        key: String,
        id: String,
    },
}

struct Adapt {
    /// The plugin's `unit_delay` in seconds, as `f64` bits.
    unit: Arc<AtomicU64>,
    start: Instant,
    delay: Duration,
}

impl Drop for Held {
    fn drop(&mut self) {
        match &mut self.slot {
            Slot::Local(slot) => {
                slot.fetch_sub(1, Ordering::AcqRel);
            }
            Slot::Remote { leaser, key, id } => {
                let (key, id) = (std::mem::take(key), std::mem::take(id));
                // A removal that fails leaves the entry to expire after `key_ttl`, as in APISIX.
                leaser.run(remove(&key, &id));
            }
        }
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
    rule: Arc<Rule>,
    key: LimitKey,
    scope: u64,
    store: Arc<ConnStore>,
    /// Policy redis / redis-cluster: the backend's queue, this plugin's key prefix, `key_ttl` and the request
    /// timeout.
    remote: Option<Remote>,
}

struct Remote {
    leaser: Arc<Leaser>,
    prefix: String,
    ttl: i64,
    budget: Duration,
}

/// What a decision needs, shared with the requests that await Redis.
struct Rule {
    conn: i64,
    max: i64,
    /// `unit_delay` in seconds as `f64` bits; fixed when `only_use_default_delay`.
    unit: Arc<AtomicU64>,
    adaptive: bool,
    rejected_code: u16,
    rejected_msg: Option<String>,
    allow_degradation: bool,
}

impl Rule {
    /// Admits the `n`-th request in flight (already counted in `slot`), or refuses it and frees the slot.
    fn decide(&self, ctx: &mut Ctx<'_>, n: i64, slot: Slot) -> Flow {
        if n > self.max {
            // Redis refuses in its script; a local count taken for this request is given back.
            if let Slot::Local(s) = slot {
                s.fetch_sub(1, Ordering::AcqRel);
            }
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

    /// Redis could not count the request: APISIX's 500, or it passes uncounted with `allow_degradation`.
    fn failed(&self) -> Flow {
        if self.allow_degradation {
            Flow::Continue
        } else {
            Flow::Respond(reject(500, None))
        }
    }
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let remote = match c.redis.connect()? {
        Some(conn) => {
            let budget = crate::limit_count::remote::wait_budget(conn.timeout);
            let prefix = match env.consumer_scope() {
                None => format!("limit_conn:{:016x}", fnv(&v.to_string())),
                Some(u) => format!("limit_conn:{:016x}:consumer:{u}", fnv(&v.to_string())),
            };
            Some(Remote {
                leaser: env.shared.conn_remote.leaser(conn, NAME),
                prefix,
                ttl: c.key_ttl.max(1),
                budget,
            })
        }
        None => None,
    };
    Ok(Arc::new(LimitConn {
        rule: Arc::new(Rule {
            conn: c.conn,
            max: c.conn + c.burst,
            unit: Arc::new(AtomicU64::new(c.default_conn_delay.to_bits())),
            adaptive: !c.only_use_default_delay,
            rejected_code: c.rejected_code,
            rejected_msg: c.rejected_msg,
            allow_degradation: c.allow_degradation,
        }),
        key: LimitKey::compile(&c.key_type, &c.key)?,
        scope: key_hash(("limit-conn", v.to_string(), env.consumer_scope())),
        store: env.shared.conns.clone(),
        remote,
    }))
}

/// Removes a request from its key's set (the answer is not needed).
fn remove(key: &str, id: &str) -> Job {
    let mut cmd = redis::cmd("ZREM");
    cmd.arg(key).arg(id);
    Job {
        cmd,
        done: Box::new(|_, _| {}),
    }
}

/// A request id unique across nodes: a random per-process prefix and a counter.
fn request_id() -> String {
    use std::sync::atomic::AtomicU64 as Seq;
    use std::sync::OnceLock;
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static SEQ: Seq = Seq::new(0);
    let p = PREFIX.get_or_init(rand::random::<u64>);
    format!("{p:016x}-{}", SEQ.fetch_add(1, Ordering::Relaxed))
}

impl LimitConn {
    /// Counts the request in Redis; the chain resumes with the decision once Redis answered.
    fn remote(&self, ctx: &mut Ctx<'_>, r: &Remote, name: String) -> Flow {
        let id = request_id();
        let (tx, rx) = tokio::sync::oneshot::channel::<Option<(i64, i64)>>();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(ENTER)
            .arg(1)
            .arg(&name)
            .arg(self.rule.max)
            .arg(r.ttl)
            .arg(&id);
        let (job_key, job_id, again) = (name.clone(), id.clone(), Arc::downgrade(&r.leaser));
        let queued = r.leaser.run(Job {
            cmd,
            done: Box::new(move |v, _| {
                let a = v.and_then(|v| redis::from_redis_value::<(i64, i64)>(&v).ok());
                // The request went away (client closed, or the wait's budget ran out) before the answer: its
                // slot is given back at once rather than after `key_ttl`.
                if tx.send(a).is_err() && a.is_some_and(|a| a.0 == 1) {
                    if let Some(l) = again.upgrade() {
                        l.run(remove(&job_key, &job_id));
                    }
                }
            }),
        });
        if !queued {
            return self.rule.failed();
        }
        let rule = self.rule.clone();
        let (leaser, budget) = (r.leaser.clone(), r.budget);
        let fut = async move {
            let answer = tokio::time::timeout(budget, rx).await;
            Box::new(move |ctx: &mut Ctx<'_>| match answer {
                Ok(Ok(Some((1, n)))) => rule.decide(
                    ctx,
                    n,
                    Slot::Remote {
                        leaser,
                        key: name,
                        id,
                    },
                ),
                Ok(Ok(Some((_, _)))) => {
                    Flow::Respond(reject(rule.rejected_code, rule.rejected_msg.as_deref()))
                }
                _ => rule.failed(),
            }) as Resume
        };
        ctx.await_io(fut, budget * 4, reject(500, None));
        Flow::Continue
    }
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
        if let Some(r) = &self.remote {
            let name = format!("{}:{}:{key}", r.prefix, ctx.route_id);
            return self.remote(ctx, r, name);
        }
        let (slot, n) = self
            .store
            .enter(key_hash((self.scope, ctx.route_id, &*key)));
        self.rule.decide(ctx, n, Slot::Local(slot))
    }
}

/// The stream form (APISIX `apisix/stream/plugins/limit-conn.lua`): its own schema (no Redis, no rejected
/// code: a refused connection is closed), counted in `preread` for the connection's lifetime. The n-th
/// connection with n > `conn` waits `default_conn_delay * floor((n - 1) / conn)` first (the stream subsystem
/// feeds no latency back, so the delay stays the default). Keys are stream variables (`remote_addr`,
/// `server_addr`, `server_port`, `remote_port`) or, with `var_combination`, `$var` templates; an empty key is the
/// client address, as APISIX's.
pub(crate) mod stream {
    use std::sync::Arc;
    use std::time::Duration;

    use serde::Deserialize;
    use serde_json::{json, Value};

    use crate::counters::{key_hash, ConnStore};
    use crate::stream::{var, Preread, StreamConn, StreamHeld, StreamPlugin};

    pub(crate) fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "conn": {"type": "integer", "exclusiveMinimum": 0},
                "burst": {"type": "integer", "minimum": 0},
                "default_conn_delay": {"type": "number", "exclusiveMinimum": 0},
                "only_use_default_delay": {"type": "boolean", "default": false},
                "key": {"type": "string"},
                "key_type": {"type": "string", "enum": ["var", "var_combination"], "default": "var"}
            },
            "required": ["conn", "burst", "default_conn_delay", "key"]
        })
    }

    #[derive(Deserialize)]
    struct Conf {
        conn: i64,
        burst: i64,
        default_conn_delay: f64,
        key: String,
        #[serde(default = "crate::limit_count::var")]
        key_type: String,
    }

    enum Key {
        Var(String),
        /// Literal text and variable names, alternating (`$remote_addr $server_port`).
        Combination(Vec<(bool, String)>),
    }

    pub(crate) struct Stream {
        conn: i64,
        max: i64,
        unit: f64,
        key: Key,
        scope: u64,
        store: Arc<ConnStore>,
    }

    pub(crate) fn compile(v: &Value, shared: &crate::Shared) -> Result<Stream, String> {
        let c: Conf = crate::util::parse(&schema(), v)?;
        let key = if c.key_type == "var_combination" {
            Key::Combination(split_vars(&c.key))
        } else {
            Key::Var(c.key.trim_start_matches('$').to_owned())
        };
        Ok(Stream {
            conn: c.conn,
            max: c.conn + c.burst,
            unit: c.default_conn_delay,
            key,
            scope: key_hash(("limit-conn-stream", v.to_string())),
            store: shared.conns.clone(),
        })
    }

    /// `$a-$b x` -> [(var a), (lit "-"), (var b), (lit " x")].
    fn split_vars(s: &str) -> Vec<(bool, String)> {
        let mut out = Vec::new();
        let mut rest = s;
        while let Some(i) = rest.find('$') {
            if i > 0 {
                out.push((false, rest[..i].to_owned()));
            }
            let after = &rest[i + 1..];
            let (name, tail) = if let Some(b) = after.strip_prefix('{') {
                match b.find('}') {
                    Some(e) => (&b[..e], &b[e + 1..]),
                    None => (b, ""),
                }
            } else {
                let e = after
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(after.len());
                (&after[..e], &after[e..])
            };
            out.push((true, name.to_owned()));
            rest = tail;
        }
        if !rest.is_empty() {
            out.push((false, rest.to_owned()));
        }
        out
    }

    impl StreamPlugin for Stream {
        fn name(&self) -> &'static str {
            super::NAME
        }
        fn priority(&self) -> i32 {
            super::PRIORITY
        }
        fn preread(&self, c: &StreamConn<'_>, held: &mut StreamHeld) -> Preread {
            let key = match &self.key {
                Key::Var(name) => var(c, name),
                Key::Combination(parts) => {
                    let mut s = String::new();
                    let mut any = false;
                    for (is_var, p) in parts {
                        if *is_var {
                            if let Some(v) = var(c, p) {
                                any = true;
                                s.push_str(&v);
                            }
                        } else {
                            s.push_str(p);
                        }
                    }
                    any.then_some(s)
                }
            }
            .or_else(|| var(c, "remote_addr"))
            .unwrap_or_default();
            let (slot, n) = self.store.enter(key_hash((self.scope, c.route_id, &*key)));
            if n > self.max {
                slot.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                return Preread::Close(super::NAME);
            }
            held.slots.push(slot);
            let delay = if n > self.conn {
                Duration::try_from_secs_f64(self.unit * ((n - 1) / self.conn) as f64)
                    .unwrap_or(Duration::ZERO)
            } else {
                Duration::ZERO
            };
            // APISIX sleeps only delays of at least 1 ms.
            Preread::Continue(if delay >= Duration::from_millis(1) {
                delay
            } else {
                Duration::ZERO
            })
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn splits_var_combinations() {
            let v = super::split_vars("$remote_addr-${server_port}x");
            assert_eq!(
                v,
                vec![
                    (true, "remote_addr".to_owned()),
                    (false, "-".to_owned()),
                    (true, "server_port".to_owned()),
                    (false, "x".to_owned())
                ]
            );
        }
    }
}
