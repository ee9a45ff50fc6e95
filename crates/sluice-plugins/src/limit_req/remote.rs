//! limit-req's `redis` and `redis-cluster` policies, exact cluster-wide as APISIX's: every request runs the leaky
//! bucket in Redis with one script ([`SCRIPT`]: drain by the elapsed time on Redis' clock, refuse past `burst`,
//! else add the request and store), awaited by the hook through [`crate::Ctx::await_io`] on the backend's Redis
//! thread ([`crate::redis_lease`]), so the worker never blocks. One round trip per request, as APISIX: a bucket
//! cannot be leased ahead the way limit-count's quota is, because whether a request passes, and how long it
//! waits, depends on the time it arrives; a slice taken earlier and spent later would be drained as if it had
//! arrived at lease time and so let requests through early.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::redis_lease::{call, Leaser};

/// KEYS[1]: the bucket (a hash of `excess`, in requests, and `last`, ms). ARGV: rate (requests/s), burst, ttl
/// (s). Answers {1, excess} when admitted (stored) or {0, excess} when refused (nothing stored); excess as a
/// string to keep its fraction. A key's first request starts at excess 0, as lua-resty-limit-req.
const SCRIPT: &str = "local t = redis.call('time') \
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2]) \
local s = redis.call('hmget', KEYS[1], 'excess', 'last') \
local excess = 0 \
if s[1] and s[2] then \
excess = math.max(tonumber(s[1]) - rate * math.abs(now - tonumber(s[2])) / 1000 + 1, 0) \
if excess > burst then return {0, tostring(excess)} end end \
redis.call('hset', KEYS[1], 'excess', tostring(excess), 'last', now) \
redis.call('expire', KEYS[1], ARGV[3]) \
return {1, tostring(excess)}";

/// A key's bucket in Redis: the request's answer is awaited from the receiver.
pub(crate) fn incoming(
    leaser: &Arc<Leaser>,
    key: &str,
    rate: f64,
    burst: f64,
) -> oneshot::Receiver<Option<(i64, String)>> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SCRIPT)
        .arg(1)
        .arg(key)
        .arg(rate)
        .arg(burst)
        // APISIX: long enough for a full bucket to drain, and a second.
        .arg((burst / rate).ceil() as u64 + 1);
    call(leaser, cmd)
}

/// The wait of an admitted request whose bucket holds `excess` (lua-resty-limit-req: `excess / rate`).
pub(crate) fn delay(excess: &str, rate: f64) -> Duration {
    let excess: f64 = excess.parse().unwrap_or(0.0);
    Duration::try_from_secs_f64(excess / rate).unwrap_or(Duration::ZERO)
}
