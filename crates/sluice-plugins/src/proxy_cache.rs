//! proxy-cache (priority 1085), as APISIX's (apisix/plugins/proxy-cache/*.lua, with nginx's `proxy_cache` for the
//! disk strategy): answers from a cache zone declared in config.yaml's `apisix.proxy_cache.zones` (see `zones.rs`),
//! keyed by `cache_key` (variables and literals concatenated; `$request_uri` is the request-target as received,
//! as nginx's), prefixed by the consumer's name (or Basic user) unless `consumer_isolation` is off or the key
//! names an identity already. `Apisix-Cache-Status` says what happened: HIT, MISS, EXPIRED, BYPASS, STALE.
//! PURGE (anyone may send it, as in APISIX; restrict it with another plugin) drops the key's answer: 200, or 404
//! when there is none.
//!
//! - **memory** (`memory.rs`): looked up in access, so a hit skips the later access plugins and the upstream, as
//!   APISIX's `return res.status, res.body`. APISIX's rules: `cache_method`, `cache_bypass`, with
//!   `cache_control` the request's `no-store` / `no-cache` / `max-age` / `min-fresh` / `max-stale` /
//!   `only-if-cached`; an answer is stored when its status is in `cache_http_status`, `no_cache` is empty or "0",
//!   it is not `private` / `no-store` / `no-cache`, has no Set-Cookie (unless `cache_set_cookie`) and no
//!   `Vary: *`, and its body stays under `max_resp_body_size`; for `cache_ttl` seconds, or with `cache_control`
//!   its own `s-maxage` / `max-age` / `Expires`. Hits carry `Age`.
//! - **disk** (`disk.rs`): looked up in before_proxy, after every access plugin, as nginx's cache runs after
//!   APISIX's access phase; stored by nginx's rules: not with Set-Cookie, `Vary: *`, `private` / `no-store` /
//!   `no-cache`; fresh for `X-Accel-Expires`, else `s-maxage` / `max-age`, else `Expires`, else
//!   `apisix.proxy_cache.cache_ttl`. `cache_bypass` fetches from the upstream and still stores (nginx's
//!   `proxy_cache_bypass`).
//!
//! Both capture the body as it streams to the client (the client's answer is never held back): memory keeps the
//! pieces (shared buffers), disk appends them to a temporary file. A body that outgrows its bound stops being
//! captured and is not stored. The answer is stored from the upstream's own head (not other plugins' edits, which
//! run again on a hit); answers to HEAD are never stored (they have no body). Not here: writing the answer.

mod disk;
mod memory;
mod zones;

pub use zones::Zones;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_router::{MatchRequest, Var};

use crate::filters::BodyChunk;
use crate::registry::Entry as RegistryEntry;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

use zones::Zone;

pub const NAME: &str = "proxy-cache";
pub const PRIORITY: i32 = 1085;

pub(crate) const ENTRY: RegistryEntry = RegistryEntry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

const COMPLEX: &str = r"(^[^\$].+$|^\$[0-9a-zA-Z_]+$)";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "max_resp_body_size": {"type": "integer", "minimum": 1, "default": 67108864},
            "cache_zone": {"type": "string", "minLength": 1, "maxLength": 100, "default": "disk_cache_one"},
            "cache_strategy": {"type": "string", "enum": ["disk", "memory"], "default": "disk"},
            "cache_key": {
                "type": "array", "minItems": 1,
                "items": {"description": "a key for caching", "type": "string", "pattern": COMPLEX},
                "default": ["$host", "$request_uri"]
            },
            "cache_http_status": {
                "type": "array", "minItems": 1,
                "items": {"description": "http response status", "type": "integer", "minimum": 200, "maximum": 599},
                "uniqueItems": true, "default": [200, 301, 404]
            },
            "cache_method": {
                "type": "array", "minItems": 1,
                "items": {"description": "supported http method", "type": "string", "enum": ["GET", "POST", "HEAD"]},
                "uniqueItems": true, "default": ["GET", "HEAD"]
            },
            "hide_cache_headers": {"type": "boolean", "default": false},
            "cache_control": {"type": "boolean", "default": false},
            "cache_bypass": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": COMPLEX}},
            "no_cache": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": COMPLEX}},
            "cache_ttl": {"type": "integer", "minimum": 1, "default": 300},
            "consumer_isolation": {"type": "boolean", "default": true},
            "cache_set_cookie": {"type": "boolean", "default": false}
        }
    })
}

/// One item of `cache_key`, `cache_bypass` or `no_cache`.
enum Part {
    Lit(Box<str>),
    Var(Var),
    /// nginx's `$request_uri`: the request-target as received (Sluice's `request_uri` variable is normalised).
    RawRequestUri,
    /// nginx's `$remote_user`: the user of a Basic `Authorization` header.
    RemoteUser,
}

fn parts(v: &Value, field: &str) -> Option<Box<[Part]>> {
    let items = v.get(field)?.as_array()?;
    Some(
        items
            .iter()
            .filter_map(Value::as_str)
            .map(|s| match s.strip_prefix('$') {
                Some("request_uri") => Part::RawRequestUri,
                Some("remote_user") => Part::RemoteUser,
                Some(name) => Part::Var(Var::parse(name)),
                None => Part::Lit(s.into()),
            })
            .collect(),
    )
}

fn remote_user(ctx: &Ctx<'_>) -> Option<String> {
    let auth = ctx.req.head.header("authorization")?;
    let auth = std::str::from_utf8(auth).ok()?.trim();
    let (scheme, b64) = auth.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = crate::util::base64_decode(b64.trim())?;
    let s = String::from_utf8(raw).ok()?;
    let (user, _) = s.split_once(':')?;
    Some(user.to_owned())
}

/// APISIX's `generate_complex_value`: every part's value (a missing variable is empty), concatenated.
fn complex_value(parts: &[Part], ctx: &Ctx<'_>, out: &mut Vec<u8>) {
    for p in parts {
        match p {
            Part::Lit(s) => out.extend_from_slice(s.as_bytes()),
            Part::Var(v) => {
                if let Some(s) = ctx.var(v) {
                    out.extend_from_slice(s.as_bytes());
                }
            }
            Part::RawRequestUri => out.extend_from_slice(ctx.req.head.target_str().as_bytes()),
            Part::RemoteUser => {
                if let Some(u) = remote_user(ctx) {
                    out.extend_from_slice(u.as_bytes());
                }
            }
        }
    }
}

/// Whether a `cache_bypass` / `no_cache` value says yes: not empty and not "0".
fn says_yes(parts: &Option<Box<[Part]>>, ctx: &Ctx<'_>) -> bool {
    let Some(parts) = parts else { return false };
    let mut v = Vec::new();
    complex_value(parts, ctx, &mut v);
    !v.is_empty() && v != b"0"
}

fn check(v: &Value) -> Result<(), String> {
    sluice_model::schema::validate(&schema(), v)?;
    if let Some(keys) = v.get("cache_key").and_then(Value::as_array) {
        for k in keys.iter().filter_map(Value::as_str) {
            if k == "$request_method" {
                return Err(format!("cache_key variable {k} unsupported"));
            }
        }
    }
    Ok(())
}

/// A stored answer.
pub(crate) struct Entry {
    /// The cache key (disk entries, checked against the request's; empty in memory zones, whose slots keep it).
    pub key: Box<[u8]>,
    /// The request's values of the answer's Vary headers, joined with NUL (empty without Vary).
    pub sig: Box<[u8]>,
    pub status: u16,
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
    /// When it was stored (unix ms) and for how long it is fresh.
    pub stored_ms: u64,
    pub ttl_ms: u64,
}

impl Entry {
    fn weight(&self) -> usize {
        self.sig.len()
            + self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 32)
                .sum::<usize>()
            + 96
    }
    fn expired(&self, now_ms: u64) -> bool {
        now_ms >= self.stored_ms.saturating_add(self.ttl_ms)
    }
}

pub(crate) enum Lookup {
    Miss,
    Expired,
    Hit(Arc<Entry>),
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct ProxyCache {
    zone: Arc<Zone>,
    memory: bool,
    key: Box<[Part]>,
    /// Prefix the consumer's identity (`consumer_isolation`, and the key names none).
    isolate: bool,
    statuses: Box<[u16]>,
    methods: Box<[Box<str>]>,
    hide: bool,
    cache_control: bool,
    bypass: Option<Box<[Part]>>,
    no_cache: Option<Box<[Part]>>,
    /// memory: `cache_ttl`; disk: `apisix.proxy_cache.cache_ttl` (nginx's `proxy_cache_valid any`).
    ttl_ms: u64,
    set_cookie: bool,
    max_body: u64,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let zones = &env.shared.proxy_cache;
    let name = v
        .get("cache_zone")
        .and_then(Value::as_str)
        .unwrap_or("disk_cache_one");
    let strategy = v
        .get("cache_strategy")
        .and_then(Value::as_str)
        .unwrap_or("disk");
    let memory = strategy == "memory";
    let conf = zones
        .conf(name)
        .ok_or_else(|| format!("cache_zone {name} not found"))?;
    if memory == conf.disk.is_some() {
        return Err(format!(
            "invalid or empty cache_zone for cache_strategy: {strategy}"
        ));
    }
    let zone = zones.open(name)?;
    let key = parts(v, "cache_key")
        .unwrap_or_else(|| Box::new([Part::Var(Var::Host), Part::RawRequestUri]));
    let names_identity = v
        .get("cache_key")
        .and_then(Value::as_array)
        .is_some_and(|k| {
            k.iter().filter_map(Value::as_str).any(|s| {
                matches!(
                    s,
                    "$consumer_name"
                        | "$consumer_group_id"
                        | "$remote_user"
                        | "$http_authorization"
                )
            })
        });
    let list = |f: &str| v.get(f).and_then(Value::as_array);
    let statuses: Box<[u16]> = match list("cache_http_status") {
        Some(l) => l
            .iter()
            .filter_map(Value::as_u64)
            .map(|s| s as u16)
            .collect(),
        None => Box::new([200, 301, 404]),
    };
    let methods: Box<[Box<str>]> = match list("cache_method") {
        Some(l) => l.iter().filter_map(Value::as_str).map(Into::into).collect(),
        None => Box::new(["GET".into(), "HEAD".into()]),
    };
    let flag = |f: &str, d: bool| v.get(f).and_then(Value::as_bool).unwrap_or(d);
    let ttl_ms = if memory {
        v.get("cache_ttl")
            .and_then(Value::as_u64)
            .unwrap_or(300)
            .saturating_mul(1000)
    } else {
        zones.cache_ttl.as_millis() as u64
    };
    Ok(Arc::new(ProxyCache {
        zone,
        memory,
        key,
        isolate: flag("consumer_isolation", true) && !names_identity,
        statuses,
        methods,
        hide: flag("hide_cache_headers", false),
        cache_control: flag("cache_control", false),
        bypass: parts(v, "cache_bypass"),
        no_cache: parts(v, "no_cache"),
        ttl_ms,
        set_cookie: flag("cache_set_cookie", false),
        max_body: v
            .get("max_resp_body_size")
            .and_then(Value::as_u64)
            .unwrap_or(67_108_864),
    }))
}

/// A Cache-Control header's directives, as APISIX's `parse_directive_header` reads them (numbers where the value
/// is one).
#[derive(Default, Debug)]
struct Cc {
    no_store: bool,
    no_cache: bool,
    private: bool,
    only_if_cached: bool,
    max_age: Option<i64>,
    s_maxage: Option<i64>,
    max_stale: Option<i64>,
    min_fresh: Option<i64>,
}

impl Cc {
    fn parse<'v>(values: impl Iterator<Item = &'v [u8]>) -> Cc {
        let mut cc = Cc::default();
        for v in values {
            for d in v.split(|b| *b == b',') {
                let d = String::from_utf8_lossy(d);
                let (name, val) = match d.split_once('=') {
                    Some((n, v)) => (n, Some(v.trim().trim_matches('"'))),
                    None => (&d[..], None),
                };
                let num = val.and_then(|v| v.parse::<i64>().ok());
                match name.trim().to_ascii_lowercase().as_str() {
                    "no-store" => cc.no_store = true,
                    "no-cache" => cc.no_cache = true,
                    "private" => cc.private = true,
                    "only-if-cached" => cc.only_if_cached = true,
                    "max-age" => cc.max_age = num,
                    "s-maxage" => cc.s_maxage = num,
                    "max-stale" => cc.max_stale = num,
                    "min-fresh" => cc.min_fresh = num,
                    _ => {}
                }
            }
        }
        cc
    }
}

/// An HTTP date (IMF-fixdate, RFC 850 or asctime, as nginx's `ngx_parse_http_time`) as unix seconds.
fn parse_http_date(s: &str) -> Option<i64> {
    let s = s.trim();
    let month = |m: &str| {
        [
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ]
        .iter()
        .position(|x| m.eq_ignore_ascii_case(x))
        .map(|i| i as i64 + 1)
    };
    let hms = |t: &str| -> Option<i64> {
        let mut it = t.split(':').map(|x| x.parse::<i64>().ok());
        let (h, m, s) = (it.next()??, it.next()??, it.next()??);
        (h < 24 && m < 60 && s < 61).then_some(h * 3600 + m * 60 + s)
    };
    let words: Vec<&str> = s.split([' ', '-']).filter(|w| !w.is_empty()).collect();
    let (day, mon, year, time): (i64, i64, i64, i64) = match words.as_slice() {
        // Sun, 06 Nov 1994 08:49:37 GMT / Sunday, 06-Nov-94 08:49:37 GMT
        [_, d, m, y, t, "GMT"] => (d.parse().ok()?, month(m)?, y.parse().ok()?, hms(t)?),
        // Sun Nov  6 08:49:37 1994
        [_, m, d, t, y] => (d.parse().ok()?, month(m)?, y.parse().ok()?, hms(t)?),
        _ => return None,
    };
    let year = match year {
        0..=69 => year + 2000,
        70..=99 => year + 1900,
        y => y,
    };
    if !(1..=31).contains(&day) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mon <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mon + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + time)
}

/// What happened to this request, kept from access to body_filter.
#[derive(Default)]
enum Stage {
    /// Not cached (method not cacheable, PURGE) or already decided not to store.
    #[default]
    Off,
    /// Looked up and not served from the cache: the answer may be stored.
    Fetch,
    /// Served from the cache.
    Hit,
    /// memory: the answer's body, piece by piece.
    Collect(Box<Collect>),
    /// disk: the answer's file being written.
    Write(disk::DiskWriter),
}

struct Collect {
    vary: Box<[Box<str>]>,
    entry: Entry,
    pieces: Vec<Bytes>,
    size: u64,
}

#[derive(Default)]
struct State {
    key: Vec<u8>,
    stage: Stage,
    /// disk: the `Apisix-Cache-Status` to send (nginx's `$upstream_cache_status`).
    status: Option<&'static str>,
}

const STATUS: &str = "Apisix-Cache-Status";

fn set_status(ctx: &mut Ctx<'_>, s: &'static str) {
    ctx.resp.set(
        Bytes::from_static(STATUS.as_bytes()),
        Bytes::from_static(s.as_bytes()),
    );
}

/// Headers never stored: hop-by-hop, the framing, ours, and per-request ones (APISIX's list plus `Age`).
fn storable(name: &[u8]) -> bool {
    const SKIP: [&str; 12] = [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "apisix-cache-status",
        "age",
    ];
    !SKIP.iter().any(|s| name.eq_ignore_ascii_case(s.as_bytes()))
        && !String::from_utf8_lossy(name)
            .to_ascii_lowercase()
            .contains("ratelimit-remaining")
}

/// The upstream's header values by lower-case name (every occurrence).
fn upstream_values<'c>(ctx: &'c Ctx<'_>, lower: &'static str) -> Vec<&'c [u8]> {
    match ctx.upstream_head() {
        Some(h) => h
            .headers
            .iter()
            .filter(|s| h.slice(s.name).eq_ignore_ascii_case(lower.as_bytes()))
            .map(|s| h.slice(s.value))
            .collect(),
        None => Vec::new(),
    }
}

/// The Vary names, lower case and sorted; `None` for `Vary: *`.
fn vary_list(values: &[&[u8]]) -> Option<Vec<Box<str>>> {
    let mut out: Vec<Box<str>> = Vec::new();
    for v in values {
        for name in String::from_utf8_lossy(v).split(',') {
            let n = name.trim();
            if n == "*" {
                return None;
            }
            if !n.is_empty() {
                out.push(n.to_ascii_lowercase().into());
            }
        }
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// This request's values of the Vary headers, joined with NUL.
fn signature(ctx: &Ctx<'_>, vary: &[Box<str>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, name) in vary.iter().enumerate() {
        if i > 0 {
            out.push(0);
        }
        if let Some(v) = ctx.req.head.header(name) {
            out.extend_from_slice(v);
        }
    }
    out
}

/// nginx's not_modified filter on a hit: `If-None-Match` against the stored ETag (weak comparison, `*`), else
/// `If-Modified-Since` equal to the stored Last-Modified (nginx's default `if_modified_since exact`).
fn not_modified(ctx: &Ctx<'_>, e: &Entry) -> bool {
    let stored = |name: &[u8]| {
        e.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let weak = |t: &[u8]| -> Vec<u8> { t.strip_prefix(b"W/").unwrap_or(t).to_vec() };
    if let Some(inm) = ctx.req.head.header("if-none-match") {
        let Some(etag) = stored(b"etag") else {
            return false;
        };
        let etag = weak(etag.trim_ascii());
        return inm
            .split(|b| *b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|t| t == b"*" || weak(t) == etag);
    }
    let Some(ims) = ctx.req.head.header("if-modified-since") else {
        return false;
    };
    let Some(lm) = stored(b"last-modified") else {
        return false;
    };
    let parse = |v: &[u8]| std::str::from_utf8(v).ok().and_then(parse_http_date);
    matches!((parse(ims), parse(&lm)), (Some(a), Some(b)) if a == b)
}

/// A hit's answer: the stored one, or 304 without a body when the request's validators match.
fn hit_response(ctx: &Ctx<'_>, e: &Entry, headers: Vec<(Bytes, Bytes)>) -> Response {
    if not_modified(ctx, e) {
        return Response {
            status: 304,
            headers,
            body: Bytes::new(),
        };
    }
    Response {
        status: e.status,
        headers,
        body: e.body.clone(),
    }
}

impl ProxyCache {
    fn key_of(&self, ctx: &Ctx<'_>) -> Vec<u8> {
        let mut key = Vec::with_capacity(64);
        if self.isolate {
            let id = ctx
                .consumer_name()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .or_else(|| remote_user(ctx).filter(|s| !s.is_empty()));
            if let Some(id) = id {
                key.extend_from_slice(id.as_bytes());
                key.push(1);
            }
        }
        complex_value(&self.key, ctx, &mut key);
        key
    }

    fn method_matches(&self, ctx: &Ctx<'_>) -> bool {
        let m = ctx.req.method();
        self.methods.iter().any(|x| **x == *m)
    }

    fn lookup(&self, key: &[u8], ctx: &Ctx<'_>) -> Lookup {
        let sig = |vary: &[Box<str>]| signature(ctx, vary);
        match &*self.zone {
            Zone::Memory(z) => z.get(key, &sig, now_ms()),
            Zone::Disk(z) => z.get(key, &sig, now_ms()),
        }
    }

    fn purge(&self, ctx: &mut Ctx<'_>) -> Flow {
        let key = self.key_of(ctx);
        let found = match &*self.zone {
            Zone::Memory(z) => z.purge(&key),
            Zone::Disk(z) => z.purge(&key),
        };
        Flow::Respond(if found {
            Response::status(200)
        } else {
            crate::util::error_page(404)
        })
    }

    fn state<'c>(&self, ctx: &'c mut Ctx<'_>) -> &'c mut State {
        ctx.body_state::<State>(self as *const Self as *const ())
    }

    /// The stored headers of a hit, with `hide_cache_headers` applied.
    fn replay(&self, e: &Entry) -> Vec<(Bytes, Bytes)> {
        e.headers
            .iter()
            .filter(|(n, _)| {
                !(self.hide
                    && (n.eq_ignore_ascii_case(b"cache-control")
                        || n.eq_ignore_ascii_case(b"expires")))
            })
            .cloned()
            .collect()
    }

    fn memory_access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let cc = if self.cache_control {
            Cc::parse(ctx.req.head.header("cache-control").into_iter())
        } else {
            Cc::default()
        };
        if !self.method_matches(ctx) {
            set_status(ctx, "MISS");
            return Flow::Continue;
        }
        if says_yes(&self.bypass, ctx) || (self.cache_control && (cc.no_store || cc.no_cache)) {
            set_status(ctx, "BYPASS");
            return Flow::Continue;
        }
        let key = self.key_of(ctx);
        let found = self.lookup(&key, ctx);
        let st = self.state(ctx);
        st.key = key;
        st.stage = Stage::Fetch;
        let e = match found {
            Lookup::Miss => {
                set_status(ctx, "MISS");
                if self.cache_control && cc.only_if_cached {
                    self.state(ctx).stage = Stage::Off;
                    return Flow::Respond(crate::util::error_page(504));
                }
                return Flow::Continue;
            }
            Lookup::Expired => {
                set_status(ctx, "EXPIRED");
                return Flow::Continue;
            }
            Lookup::Hit(e) => e,
        };
        let now = now_ms();
        let age = (now.saturating_sub(e.stored_ms) / 1000) as i64;
        if self.cache_control {
            let ttl = (e.ttl_ms / 1000) as i64;
            let stale = cc.max_age.is_some_and(|m| age > m)
                || cc.max_stale.is_some_and(|m| age - ttl > m)
                || cc.min_fresh.is_some_and(|m| ttl - age < m);
            if stale {
                set_status(ctx, "STALE");
                return Flow::Continue;
            }
        }
        self.state(ctx).stage = Stage::Hit;
        let mut headers = self.replay(&e);
        headers.push((Bytes::from_static(b"Age"), Bytes::from(age.to_string())));
        headers.push((
            Bytes::from_static(STATUS.as_bytes()),
            Bytes::from_static(b"HIT"),
        ));
        Flow::Respond(hit_response(ctx, &e, headers))
    }

    fn disk_access(&self, ctx: &mut Ctx<'_>) {
        let bypass = says_yes(&self.bypass, ctx) || !self.method_matches(ctx);
        let key = self.key_of(ctx);
        let st = self.state(ctx);
        st.key = key;
        st.stage = Stage::Fetch;
        if bypass {
            st.status = Some("BYPASS");
        }
    }

    fn disk_before_proxy(&self, ctx: &mut Ctx<'_>) -> Flow {
        let st = self.state(ctx);
        if !matches!(st.stage, Stage::Fetch) || st.status.is_some() {
            return Flow::Continue;
        }
        let key = std::mem::take(&mut st.key);
        let found = self.lookup(&key, ctx);
        let st = self.state(ctx);
        st.key = key;
        match found {
            Lookup::Miss => st.status = Some("MISS"),
            Lookup::Expired => st.status = Some("EXPIRED"),
            Lookup::Hit(e) => {
                st.status = Some("HIT");
                st.stage = Stage::Hit;
                return Flow::Respond(hit_response(ctx, &e, self.replay(&e)));
            }
        }
        Flow::Continue
    }

    /// APISIX's `cacheable_response` (memory): the freshness in ms, or `None` when the answer is not stored.
    fn memory_ttl(&self, ctx: &Ctx<'_>, status: u16) -> Option<u64> {
        if !self.statuses.contains(&status) || says_yes(&self.no_cache, ctx) {
            return None;
        }
        let cc = Cc::parse(upstream_values(ctx, "cache-control").into_iter());
        if cc.private || cc.no_store || cc.no_cache {
            return None;
        }
        let ttl = if self.cache_control {
            let max_age = cc.s_maxage.or(cc.max_age).or_else(|| {
                let exp = upstream_values(ctx, "expires");
                let last = std::str::from_utf8(exp.last()?).ok()?;
                Some(parse_http_date(last)?.saturating_sub((now_ms() / 1000) as i64))
            });
            let t = max_age.unwrap_or(0).max(0);
            if t <= 0 {
                return None;
            }
            (t as u64).saturating_mul(1000)
        } else {
            self.ttl_ms
        };
        // Set-Cookie in the final headers (another plugin may have added one).
        if !self.set_cookie
            && ctx
                .response_headers()
                .any(|(n, v)| n.eq_ignore_ascii_case(b"set-cookie") && !v.is_empty())
        {
            return None;
        }
        Some(ttl)
    }

    /// nginx's rules for storing an upstream answer (`ngx_http_upstream_process_*` for X-Accel-Expires,
    /// Cache-Control, Expires, Set-Cookie, Vary): the freshness in ms, or `None`.
    fn disk_ttl(&self, ctx: &Ctx<'_>) -> Option<u64> {
        if !upstream_values(ctx, "set-cookie").is_empty() {
            return None;
        }
        let now = (now_ms() / 1000) as i64;
        if let Some(x) = upstream_values(ctx, "x-accel-expires").first() {
            let x = std::str::from_utf8(x).ok()?.trim();
            let secs = match x.strip_prefix('@') {
                Some(at) => at.parse::<i64>().ok()? - now,
                None => x.parse::<i64>().ok()?,
            };
            return (secs > 0).then(|| (secs as u64).saturating_mul(1000));
        }
        let cc_values = upstream_values(ctx, "cache-control");
        let cc = Cc::parse(cc_values.iter().copied());
        if cc.private || cc.no_store || cc.no_cache {
            return None;
        }
        if let Some(secs) = cc.s_maxage.or(cc.max_age) {
            return (secs > 0).then(|| (secs as u64).saturating_mul(1000));
        }
        if let Some(e) = upstream_values(ctx, "expires").first() {
            let at = parse_http_date(std::str::from_utf8(e).ok()?)?;
            return (at > now).then(|| (at.saturating_sub(now) as u64).saturating_mul(1000));
        }
        Some(self.ttl_ms)
    }

    fn stored_headers(ctx: &Ctx<'_>) -> Vec<(Bytes, Bytes)> {
        let Some(h) = ctx.upstream_head() else {
            return Vec::new();
        };
        let tokens = sluice_http::connection_tokens(&h.buf, &h.headers);
        h.headers
            .iter()
            .map(|s| (h.slice(s.name), h.slice(s.value)))
            .filter(|(n, _)| storable(n) && !tokens.is_hop_by_hop(n))
            .map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))
            .collect()
    }

    fn header_filter_memory(&self, ctx: &mut Ctx<'_>, status: u16) {
        if !matches!(self.state(ctx).stage, Stage::Fetch) {
            return;
        }
        // Only upstream answers are stored (not another plugin's own answer).
        if ctx.upstream_head().is_none() {
            self.state(ctx).stage = Stage::Off;
            return;
        }
        if self.hide {
            ctx.resp.remove("cache-control");
            ctx.resp.remove("expires");
        }
        let vary = vary_list(&upstream_values(ctx, "vary"));
        let ttl = match (vary, ctx.req.method() == "HEAD") {
            (Some(vary), false) => self.memory_ttl(ctx, status).map(|t| (t, vary)),
            _ => None,
        };
        let Some((ttl_ms, vary)) = ttl else {
            self.state(ctx).stage = Stage::Off;
            return;
        };
        let entry = Entry {
            key: Box::new([]),
            sig: signature(ctx, &vary).into(),
            status,
            headers: Self::stored_headers(ctx),
            body: Bytes::new(),
            stored_ms: 0,
            ttl_ms,
        };
        self.state(ctx).stage = Stage::Collect(Box::new(Collect {
            vary: vary.into(),
            entry,
            pieces: Vec::new(),
            size: 0,
        }));
    }

    fn header_filter_disk(&self, ctx: &mut Ctx<'_>, status: u16) {
        let st = self.state(ctx);
        let label = st.status;
        let fetch = matches!(st.stage, Stage::Fetch);
        if self.hide {
            ctx.resp.remove("cache-control");
            ctx.resp.remove("expires");
        }
        if let Some(l) = label {
            set_status(ctx, l);
        }
        if !fetch {
            return;
        }
        self.state(ctx).stage = Stage::Off;
        let store = self.method_matches(ctx)
            && self.statuses.contains(&status)
            && !says_yes(&self.no_cache, ctx)
            && ctx.req.method() != "HEAD"
            && ctx.upstream_head().is_some();
        if !store {
            return;
        }
        let Some(vary) = vary_list(&upstream_values(ctx, "vary")) else {
            return;
        };
        let Some(ttl_ms) = self.disk_ttl(ctx) else {
            return;
        };
        let entry = Entry {
            key: Box::new([]),
            sig: signature(ctx, &vary).into(),
            status,
            headers: Self::stored_headers(ctx),
            body: Bytes::new(),
            stored_ms: now_ms(),
            ttl_ms,
        };
        let key = std::mem::take(&mut self.state(ctx).key);
        if let Zone::Disk(z) = &*self.zone {
            if let Some(w) = z.writer(&key, &vary, &entry) {
                self.state(ctx).stage = Stage::Write(w);
            }
        }
    }
}

impl Plugin for ProxyCache {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        if self.memory {
            PhaseMask::of(&[Phase::Access, Phase::HeaderFilter, Phase::BodyFilter])
        } else {
            PhaseMask::of(&[
                Phase::Access,
                Phase::BeforeProxy,
                Phase::HeaderFilter,
                Phase::BodyFilter,
            ])
        }
    }

    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        if ctx.req.method() == "PURGE" {
            return self.purge(ctx);
        }
        if self.memory {
            self.memory_access(ctx)
        } else {
            self.disk_access(ctx);
            Flow::Continue
        }
    }

    fn before_proxy(&self, ctx: &mut Ctx<'_>) -> Flow {
        if self.memory {
            return Flow::Continue;
        }
        self.disk_before_proxy(ctx)
    }

    fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        if self.memory {
            self.header_filter_memory(ctx, status)
        } else {
            self.header_filter_disk(ctx, status)
        }
    }

    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        let max = match &*self.zone {
            Zone::Memory(z) => self.max_body.min(z.max_entry() as u64),
            Zone::Disk(_) => self.max_body,
        };
        let st = self.state(ctx);
        match &mut st.stage {
            Stage::Collect(c) => {
                c.size += chunk.data.len() as u64;
                // APISIX: a body reaching max_resp_body_size streams through without being cached.
                if c.size >= max {
                    st.stage = Stage::Off;
                    return;
                }
                if !chunk.data.is_empty() {
                    c.pieces.push(chunk.data.clone());
                }
                if !chunk.eof {
                    return;
                }
                let Stage::Collect(c) = std::mem::take(&mut st.stage) else {
                    return;
                };
                let key = std::mem::take(&mut st.key);
                let Collect {
                    vary,
                    mut entry,
                    pieces,
                    size,
                } = *c;
                entry.body = match pieces.len() {
                    0 => Bytes::new(),
                    1 => pieces.into_iter().next().unwrap_or_default(),
                    _ => {
                        let mut b = bytes::BytesMut::with_capacity(size as usize);
                        for p in pieces {
                            b.extend_from_slice(&p);
                        }
                        b.freeze()
                    }
                };
                entry.stored_ms = now_ms();
                if let Zone::Memory(z) = &*self.zone {
                    z.put(&key, vary, Arc::new(entry));
                }
            }
            Stage::Write(w) => {
                if !w.write(&chunk.data) {
                    st.stage = Stage::Off;
                    return;
                }
                if chunk.eof {
                    if let Stage::Write(w) = std::mem::take(&mut st.stage) {
                        w.commit();
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_in_the_three_formats() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            parse_http_date("Sun Nov  6 08:49:37 1994"),
            Some(784_111_777)
        );
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        for bad in ["0", "", "-1", "Sun, 32 Nov 1994 08:49:37 GMT", "tomorrow"] {
            assert_eq!(parse_http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn cache_control_directives() {
        let cc = Cc::parse(
            [
                &b"public, max-age=60"[..],
                b"S-MaxAge=\"30\", private=\"Set-Cookie\"",
            ]
            .into_iter(),
        );
        assert_eq!(
            (cc.max_age, cc.s_maxage, cc.private),
            (Some(60), Some(30), true)
        );
        assert!(!cc.no_store);
        assert_eq!(
            vary_list(&[b"Accept-Encoding, accept-language"]).map(|v| v.len()),
            Some(2)
        );
        assert!(vary_list(&[b"Accept, *"]).is_none());
    }

    #[test]
    fn schema_and_apisix_checks() {
        assert!(check(&json!({})).is_ok());
        assert_eq!(
            check(&json!({"cache_key": ["$request_method"]})),
            Err("cache_key variable $request_method unsupported".into())
        );
        for bad in [
            json!({"cache_strategy": "redis"}),
            json!({"cache_method": ["PUT"]}),
            json!({"cache_http_status": [100]}),
            json!({"cache_key": ["$a-b"]}),
            json!({"cache_ttl": 0}),
        ] {
            assert!(check(&bad).is_err(), "{bad}");
        }
    }
}
