//! api-breaker (priority 1005; access, log), APISIX's apisix/plugins/api-breaker.lua (`unhealthy-count` policy):
//! upstream answers with a status in `unhealthy.http_statuses` are counted per host + URI (across routes, as
//! APISIX's shared dict keys them); every `unhealthy.failures`-th one opens the breaker for 2^(failures seen /
//! `failures`) seconds, at most `max_breaker_sec`, during which requests get `break_response_code` (with
//! `break_response_body` and `break_response_headers` when the body is set) without reaching the upstream.
//! `healthy.successes` answers with a status in `healthy.http_statuses` close it and forget the count.
//!
//! The state outlives configuration changes (it is in [`crate::Shared`], as APISIX's shared dict outlives a
//! reload) and is bounded: at most [`MAX_KEYS`] host + URI pairs are tracked, the idle ones go first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::counters::key_hash;
use crate::registry::Entry;
use crate::util::{error_page, parse, Template};
use crate::{CompileEnv, Ctx, Flow, LogInfo, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "api-breaker";
pub const PRIORITY: i32 = 1005;

/// Host + URI pairs tracked at most (APISIX's shared dict has a fixed size too).
pub(crate) const MAX_KEYS: usize = 65_536;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "break_response_code": {"type": "integer", "minimum": 200, "maximum": 599},
            "break_response_body": {"type": "string"},
            "break_response_headers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "key": {"type": "string", "minLength": 1},
                        "value": {"type": "string", "minLength": 1}
                    },
                    "required": ["key", "value"]
                }
            },
            "max_breaker_sec": {"type": "integer", "minimum": 3, "default": 300},
            "unhealthy": {
                "type": "object",
                "properties": {
                    "http_statuses": {"type": "array", "minItems": 1, "uniqueItems": true, "default": [500],
                                      "items": {"type": "integer", "minimum": 500, "maximum": 599}},
                    "failures": {"type": "integer", "minimum": 1, "default": 3}
                },
                "default": {"http_statuses": [500], "failures": 3}
            },
            "healthy": {
                "type": "object",
                "properties": {
                    "http_statuses": {"type": "array", "minItems": 1, "uniqueItems": true, "default": [200],
                                      "items": {"type": "integer", "minimum": 200, "maximum": 499}},
                    "successes": {"type": "integer", "minimum": 1, "default": 3}
                },
                "default": {"http_statuses": [200], "successes": 3}
            }
        },
        "required": ["break_response_code"]
    })
}

#[derive(Deserialize)]
struct HeaderConf {
    key: String,
    value: String,
}

#[derive(Deserialize)]
struct Unhealthy {
    #[serde(default = "s500")]
    http_statuses: Vec<u16>,
    #[serde(default = "three")]
    failures: u64,
}

#[derive(Deserialize)]
struct Healthy {
    #[serde(default = "s200")]
    http_statuses: Vec<u16>,
    #[serde(default = "three")]
    successes: u64,
}

#[derive(Deserialize)]
struct Conf {
    break_response_code: u16,
    break_response_body: Option<String>,
    #[serde(default)]
    break_response_headers: Vec<HeaderConf>,
    #[serde(default = "five_minutes")]
    max_breaker_sec: u64,
    #[serde(default = "unhealthy")]
    unhealthy: Unhealthy,
    #[serde(default = "healthy")]
    healthy: Healthy,
}

fn s500() -> Vec<u16> {
    vec![500]
}
fn s200() -> Vec<u16> {
    vec![200]
}
fn three() -> u64 {
    3
}
fn five_minutes() -> u64 {
    300
}
fn unhealthy() -> Unhealthy {
    Unhealthy {
        http_statuses: s500(),
        failures: 3,
    }
}
fn healthy() -> Healthy {
    Healthy {
        http_statuses: s200(),
        successes: 3,
    }
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

/// One host + URI's counts (APISIX's `unhealthy-`, `healthy-` and `unhealthy-lasttime` keys).
#[derive(Default, Clone, Copy)]
struct State {
    unhealthy: u64,
    healthy: u64,
    /// When the breaker last opened (unix seconds); APISIX lets it expire after `max_breaker_sec`.
    opened: Option<u64>,
    /// Last change, for evicting idle pairs.
    touched: u64,
}

/// Every api-breaker's state, shared by the workers and kept across configuration changes.
#[derive(Default)]
pub(crate) struct Breakers(Mutex<HashMap<u64, State>>);

impl Breakers {
    fn get(&self, key: u64) -> Option<State> {
        self.0.lock().ok()?.get(&key).copied()
    }

    fn update(&self, key: u64, now: u64, f: impl FnOnce(&mut State) -> bool) {
        let Ok(mut map) = self.0.lock() else {
            return;
        };
        if map.len() >= MAX_KEYS && !map.contains_key(&key) {
            // Idle pairs first: nothing changed for longer than the longest breaker APISIX allows by default.
            map.retain(|_, s| now.saturating_sub(s.touched) < 300);
            if map.len() >= MAX_KEYS {
                return;
            }
        }
        let s = map.entry(key).or_default();
        s.touched = now;
        if !f(s) {
            map.remove(&key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map_or(0, |m| m.len())
    }
}

struct ApiBreaker {
    code: u16,
    body: Option<Bytes>,
    headers: Vec<(Bytes, Template)>,
    max_breaker_sec: u64,
    unhealthy: Unhealthy,
    healthy: Healthy,
    store: Arc<Breakers>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(ApiBreaker {
        code: c.break_response_code,
        body: c.break_response_body.map(Bytes::from),
        headers: c
            .break_response_headers
            .into_iter()
            .map(|h| (Bytes::from(h.key), Template::compile(&h.value)))
            .collect(),
        max_breaker_sec: c.max_breaker_sec,
        unhealthy: c.unhealthy,
        healthy: c.healthy,
        store: env.shared.breakers.clone(),
    }))
}

fn now() -> u64 {
    crate::counters::now_ms() / 1000
}

fn key(ctx: &Ctx<'_>) -> u64 {
    key_hash((ctx.req.host.as_deref().unwrap_or(""), &*ctx.req.uri))
}

impl ApiBreaker {
    /// Seconds the breaker stays open after `unhealthy` failures: 2^ceil(unhealthy / failures), capped.
    fn breaker_sec(&self, unhealthy: u64) -> u64 {
        let times = unhealthy.div_ceil(self.unhealthy.failures).max(1);
        if times >= 63 {
            return self.max_breaker_sec;
        }
        (1u64 << times).min(self.max_breaker_sec)
    }

    fn open_at(&self, s: &State, now: u64) -> bool {
        match s.opened {
            // APISIX's lasttime key expires after max_breaker_sec.
            Some(t) if now.saturating_sub(t) <= self.max_breaker_sec && s.unhealthy > 0 => {
                t + self.breaker_sec(s.unhealthy) >= now
            }
            _ => false,
        }
    }
}

impl Plugin for ApiBreaker {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access, Phase::Log])
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let Some(s) = self.store.get(key(ctx)) else {
            return Flow::Continue;
        };
        if !self.open_at(&s, now()) {
            return Flow::Continue;
        }
        let Some(body) = &self.body else {
            return Flow::Respond(error_page(self.code));
        };
        let mut r = Response::status(self.code);
        for (name, value) in &self.headers {
            let (v, _) = value.resolve(ctx);
            r.headers.push((name.clone(), Bytes::from(v.into_owned())));
        }
        r.body = body.clone();
        Flow::Respond(r)
    }
    fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        let Some(status) = info.upstream_status else {
            return;
        };
        let (key, now) = (key(ctx), now());
        if self.unhealthy.http_statuses.contains(&status) {
            let failures = self.unhealthy.failures;
            self.store.update(key, now, |s| {
                s.unhealthy += 1;
                s.healthy = 0;
                if s.unhealthy % failures == 0 {
                    s.opened = Some(now);
                }
                true
            });
        } else if self.healthy.http_statuses.contains(&status) {
            if self.store.get(key).is_none_or(|s| s.unhealthy == 0) {
                return;
            }
            let successes = self.healthy.successes;
            self.store.update(key, now, |s| {
                s.healthy += 1;
                // Enough successes: back to normal, the pair is forgotten.
                s.healthy < successes
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(failures: u64, max: u64) -> ApiBreaker {
        ApiBreaker {
            code: 502,
            body: None,
            headers: Vec::new(),
            max_breaker_sec: max,
            unhealthy: Unhealthy {
                http_statuses: vec![500],
                failures,
            },
            healthy: healthy(),
            store: Arc::default(),
        }
    }

    #[test]
    fn breaker_time_doubles_per_round_of_failures_up_to_the_cap() {
        let b = breaker(3, 300);
        assert_eq!(
            [1, 3, 4, 6, 9, 27, 1000].map(|n| b.breaker_sec(n)),
            [2, 2, 4, 4, 8, 300, 300]
        );
    }

    #[test]
    fn the_store_stays_bounded() {
        let s = Breakers::default();
        for k in 0..(MAX_KEYS as u64 + 10) {
            s.update(k, 1_000, |st| {
                st.unhealthy = 1;
                true
            });
        }
        assert_eq!(
            s.len(),
            MAX_KEYS,
            "new pairs are not tracked while every pair is recent"
        );
        s.update(u64::MAX, 2_000, |_| true);
        assert_eq!(s.len(), 1, "idle pairs make room");
    }
}
