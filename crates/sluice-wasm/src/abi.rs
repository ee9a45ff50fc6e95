//! The host side of the proxy-wasm ABI (0.2.0 / 0.2.1, the `env` imports the SDKs use) and the few WASI calls
//! their runtimes make. Each function works on the [`Host`] state of the calling instance: the call in progress
//! copied its request data there first, and reads the filter's changes back after (see `plugin.rs`). Imports a
//! module declares that are not here trap when called (`define_unknown_imports_as_traps`), so a filter using
//! one fails its request with 500 instead of failing to load.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use wasmtime::{Caller, Linker, Memory, StoreLimits, TypedFunc};

use crate::headers::{parse_pairs, HeaderMap};

/// proxy-wasm `WasmResult` codes.
pub(crate) const OK: i32 = 0;
const NOT_FOUND: i32 = 1;
const BAD_ARGUMENT: i32 = 2;
const INVALID_MEMORY_ACCESS: i32 = 6;
const EMPTY: i32 = 7;
const CAS_MISMATCH: i32 = 8;
const UNIMPLEMENTED: i32 = 12;

/// Header map types.
const REQUEST_HEADERS: i32 = 0;
const RESPONSE_HEADERS: i32 = 2;
const HTTP_CALL_RESPONSE_HEADERS: i32 = 6;
/// Buffer types.
const REQUEST_BODY: i32 = 0;
const RESPONSE_BODY: i32 = 1;
const HTTP_CALL_RESPONSE_BODY: i32 = 4;
const VM_CONFIGURATION: i32 = 6;
const PLUGIN_CONFIGURATION: i32 = 7;

/// An HTTP call a filter dispatched (`proxy_http_call`); the plugin turns it into awaited IO.
#[derive(Debug)]
pub(crate) struct CallOut {
    pub(crate) token: u32,
    pub(crate) uri: String,
    pub(crate) method: String,
    pub(crate) headers: Vec<(Bytes, Bytes)>,
    pub(crate) body: Bytes,
    pub(crate) timeout: Duration,
}

/// The per-request facts properties are answered from (copied in without allocating on a warm instance).
#[derive(Default)]
pub(crate) struct Facts {
    pub(crate) peer: Option<SocketAddr>,
    pub(crate) local: Option<SocketAddr>,
    pub(crate) route_id: String,
    pub(crate) service_id: String,
    pub(crate) consumer: String,
    pub(crate) status: u16,
}

/// A local answer a filter asked for.
#[derive(Debug)]
pub(crate) struct Local {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(Bytes, Bytes)>,
    pub(crate) body: Bytes,
}

/// The store data of one instance.
pub(crate) struct Host {
    pub(crate) limits: StoreLimits,
    pub(crate) name: &'static str,
    pub(crate) memory: Option<Memory>,
    pub(crate) malloc: Option<TypedFunc<i32, i32>>,
    /// The plugin configuration (`conf`), read by `proxy_on_configure`.
    pub(crate) config: Bytes,
    pub(crate) req: HeaderMap,
    pub(crate) resp: HeaderMap,
    pub(crate) facts: Facts,
    /// The body handed to `proxy_on_request_body` / `proxy_on_response_body` (for the response: what the filter
    /// has buffered so far).
    pub(crate) body: BytesMut,
    /// The filter replaced part of [`Host::body`].
    pub(crate) body_changed: bool,
    /// The most bytes [`Host::body`] may hold (`max_body_size`).
    pub(crate) body_cap: usize,
    /// `proxy_set_buffer_bytes` was refused: the body it asked for was over [`Host::body_cap`].
    pub(crate) body_over: Option<usize>,
    pub(crate) local: Option<Local>,
    pub(crate) call: Option<CallOut>,
    pub(crate) next_token: u32,
    /// The answer to the last HTTP call, for `proxy_on_http_call_response`.
    pub(crate) call_headers: HeaderMap,
    pub(crate) call_body: Bytes,
    /// APISIX's `wasm_process_req_body` / `wasm_process_resp_body` properties.
    pub(crate) want_req_body: bool,
    pub(crate) want_resp_body: bool,
    scratch: Vec<u8>,
}

impl Host {
    pub(crate) fn new(name: &'static str, limits: StoreLimits, config: Bytes) -> Self {
        Host {
            limits,
            name,
            memory: None,
            malloc: None,
            config,
            req: HeaderMap::default(),
            resp: HeaderMap::default(),
            facts: Facts::default(),
            body: BytesMut::new(),
            body_changed: false,
            body_cap: crate::DEFAULT_MAX_BODY_SIZE,
            body_over: None,
            local: None,
            call: None,
            next_token: 1,
            call_headers: HeaderMap::default(),
            call_body: Bytes::new(),
            want_req_body: false,
            want_resp_body: false,
            scratch: Vec::new(),
        }
    }
}

type Cx<'a> = Caller<'a, Host>;

fn mem(c: &mut Cx<'_>) -> wasmtime::Result<Memory> {
    c.data()
        .memory
        .ok_or_else(|| wasmtime::Error::msg("the module exports no memory"))
}

/// A guest slice, copied out (`None`: out of bounds).
fn read(c: &mut Cx<'_>, ptr: i32, len: i32) -> wasmtime::Result<Option<Vec<u8>>> {
    let m = mem(c)?;
    let (p, l) = (ptr as u32 as usize, len as u32 as usize);
    Ok(m.data(&*c).get(p..p.saturating_add(l)).map(<[u8]>::to_vec))
}

fn write_u32(c: &mut Cx<'_>, ptr: i32, v: u32) -> wasmtime::Result<bool> {
    let m = mem(c)?;
    let p = ptr as u32 as usize;
    match m.data_mut(&mut *c).get_mut(p..p.saturating_add(4)) {
        Some(s) => {
            s.copy_from_slice(&v.to_le_bytes());
            Ok(true)
        }
        None => Ok(false),
    }
}

fn write_u64(c: &mut Cx<'_>, ptr: i32, v: u64) -> wasmtime::Result<bool> {
    let m = mem(c)?;
    let p = ptr as u32 as usize;
    match m.data_mut(&mut *c).get_mut(p..p.saturating_add(8)) {
        Some(s) => {
            s.copy_from_slice(&v.to_le_bytes());
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Hands `bytes` to the guest: memory from its allocator (`proxy_on_memory_allocate` or `malloc`), the address
/// and length written at `ptr_out` / `len_out`.
fn give(c: &mut Cx<'_>, bytes: &[u8], ptr_out: i32, len_out: i32) -> wasmtime::Result<i32> {
    let malloc = c
        .data()
        .malloc
        .clone()
        .ok_or_else(|| wasmtime::Error::msg("the module exports no allocator"))?;
    let addr = if bytes.is_empty() {
        0
    } else {
        malloc.call(&mut *c, bytes.len() as i32)?
    };
    if !bytes.is_empty() {
        if addr == 0 {
            return Err(wasmtime::Error::msg("the module's allocator returned null"));
        }
        let m = mem(c)?;
        let p = addr as u32 as usize;
        match m
            .data_mut(&mut *c)
            .get_mut(p..p.saturating_add(bytes.len()))
        {
            Some(s) => s.copy_from_slice(bytes),
            None => return Ok(INVALID_MEMORY_ACCESS),
        }
    }
    if !write_u32(c, ptr_out, addr as u32)? || !write_u32(c, len_out, bytes.len() as u32)? {
        return Ok(INVALID_MEMORY_ACCESS);
    }
    Ok(OK)
}

/// Like [`give`] for bytes held by the host state (built into its scratch buffer by `f`).
fn give_with(
    c: &mut Cx<'_>,
    ptr_out: i32,
    len_out: i32,
    f: impl FnOnce(&Host, &mut Vec<u8>) -> bool,
) -> wasmtime::Result<i32> {
    let mut scratch = std::mem::take(&mut c.data_mut().scratch);
    scratch.clear();
    let found = f(c.data(), &mut scratch);
    let r = if found {
        give(c, &scratch, ptr_out, len_out)
    } else {
        Ok(NOT_FOUND)
    };
    c.data_mut().scratch = scratch;
    r
}

fn map_of(h: &Host, typ: i32) -> Option<&HeaderMap> {
    match typ {
        REQUEST_HEADERS => Some(&h.req),
        RESPONSE_HEADERS => Some(&h.resp),
        HTTP_CALL_RESPONSE_HEADERS => Some(&h.call_headers),
        _ => None,
    }
}

fn map_of_mut(h: &mut Host, typ: i32) -> Option<&mut HeaderMap> {
    match typ {
        REQUEST_HEADERS => Some(&mut h.req),
        RESPONSE_HEADERS => Some(&mut h.resp),
        _ => None,
    }
}

/// A property by its path (segments joined with NUL by the SDKs, or with `.`): Envoy's names
/// (`request.path`, `source.address`, ...) and APISIX's variables (`route_id`, `remote_addr`, ...).
fn property(h: &Host, path: &[u8], out: &mut Vec<u8>) -> bool {
    let key: Vec<u8> = path
        .iter()
        .map(|&b| if b == 0 { b'.' } else { b })
        .collect();
    let req = |n: &str| h.req.get(n.as_bytes());
    let path_of = || req(":path").unwrap_or(b"/");
    let text = |out: &mut Vec<u8>, s: &dyn std::fmt::Display| {
        use std::io::Write;
        let _ = write!(out, "{s}");
        true
    };
    match &key[..] {
        b"plugin_root_id" | b"plugin_name" => out.extend_from_slice(h.name.as_bytes()),
        b"request.path" | b"request_uri" => out.extend_from_slice(path_of()),
        b"request.url_path" | b"uri" => {
            let p = path_of();
            out.extend_from_slice(p.split(|&b| b == b'?').next().unwrap_or(p))
        }
        b"request.query" | b"args" => match path_of().iter().position(|&b| b == b'?') {
            Some(i) => out.extend_from_slice(&path_of()[i + 1..]),
            None => return false,
        },
        b"request.method" | b"request_method" => {
            out.extend_from_slice(req(":method").unwrap_or(b""))
        }
        b"request.host" | b"host" => out.extend_from_slice(req(":authority").unwrap_or(b"")),
        b"request.scheme" | b"scheme" => out.extend_from_slice(req(":scheme").unwrap_or(b"")),
        b"request.protocol" => out.extend_from_slice(b"HTTP/1.1"),
        b"source.address" => return h.facts.peer.is_some_and(|a| text(out, &a)),
        b"remote_addr" => return h.facts.peer.is_some_and(|a| text(out, &a.ip())),
        b"source.port" | b"remote_port" => {
            return h.facts.peer.is_some_and(|a| text(out, &a.port()))
        }
        b"destination.address" => return h.facts.local.is_some_and(|a| text(out, &a)),
        b"destination.port" | b"server_port" => {
            return h.facts.local.is_some_and(|a| text(out, &a.port()))
        }
        b"route_name" | b"route_id" | b"xds.route_name" => {
            out.extend_from_slice(h.facts.route_id.as_bytes())
        }
        b"service_id" if !h.facts.service_id.is_empty() => {
            out.extend_from_slice(h.facts.service_id.as_bytes())
        }
        b"consumer_name" if !h.facts.consumer.is_empty() => {
            out.extend_from_slice(h.facts.consumer.as_bytes())
        }
        b"response.code" | b"status" if h.facts.status != 0 => return text(out, &h.facts.status),
        _ => {
            // `http_<name>`: a request header, as APISIX's variable.
            if let Some(name) = key.strip_prefix(b"http_") {
                let name: Vec<u8> = name
                    .iter()
                    .map(|&b| if b == b'_' { b'-' } else { b })
                    .collect();
                if let Some(v) = h.req.get(&name) {
                    out.extend_from_slice(v);
                    return true;
                }
            }
            return false;
        }
    }
    true
}

/// Process-wide shared data (`proxy_get_shared_data` / `proxy_set_shared_data`): one map for every module, as
/// in Envoy's per-VM-id store. Guarded by a lock, taken only by filters that use it.
struct Shared {
    map: HashMap<Vec<u8>, (Bytes, u32)>,
}
const SHARED_KEYS: usize = 65536;
fn shared() -> &'static Mutex<Shared> {
    static S: OnceLock<Mutex<Shared>> = OnceLock::new();
    S.get_or_init(|| {
        Mutex::new(Shared {
            map: HashMap::new(),
        })
    })
}

/// Metric types.
const COUNTER: i32 = 0;
const GAUGE: i32 = 1;
const HISTOGRAM: i32 = 2;
/// A histogram's bucket bounds (Envoy's default ones).
const BOUNDS: [u64; 19] = [
    1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000, 600_000,
    1_800_000, 3_600_000, 0,
];

/// A metric a filter defined: counter (0), gauge (1) or histogram (2). Keyed by the plugin that defined it,
/// its name and type; the same definition from several instances (or routes) is one metric.
pub struct Metric {
    pub plugin: &'static str,
    pub name: String,
    pub kind: i32,
    /// A counter's or gauge's value; a histogram's last recorded value.
    pub value: AtomicI64,
    /// A histogram's observations per bucket of [`BOUNDS`] (the last one is +Inf), their count and sum.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
}

impl Metric {
    fn record(&self, v: i64) {
        self.value.store(v, Ordering::Relaxed);
        if self.kind == HISTOGRAM {
            let v = v.max(0) as u64;
            let i = BOUNDS[..BOUNDS.len() - 1]
                .iter()
                .position(|&b| v <= b)
                .unwrap_or(BOUNDS.len() - 1);
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
            self.count.fetch_add(1, Ordering::Relaxed);
            self.sum.fetch_add(v, Ordering::Relaxed);
        }
    }
}

fn metrics() -> &'static Mutex<Vec<&'static Metric>> {
    static M: OnceLock<Mutex<Vec<&'static Metric>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(Vec::new()))
}

/// Every metric the filters defined, with its value (name, type: 0 counter / 1 gauge / 2 histogram, value).
pub fn metric_values() -> Vec<(String, i32, i64)> {
    let l = metrics().lock().unwrap_or_else(|e| e.into_inner());
    l.iter()
        .map(|m| (m.name.clone(), m.kind, m.value.load(Ordering::Relaxed)))
        .collect()
}

/// A metric name as Prometheus accepts it (`[a-zA-Z_:][a-zA-Z0-9_:]*`): other characters (Envoy-style dots,
/// dashes) become `_`.
fn prom_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Appends the filters' metrics to a Prometheus text exposition: `apisix_wasm_<name>{plugin="<plugin>"}`, with a
/// counter as a counter, a gauge as a gauge and a histogram as a histogram (Envoy's default buckets). A name
/// two plugins define with different types is exported for the first type only.
pub fn render_metrics(out: &mut String) {
    use std::fmt::Write;
    let mut list: Vec<&'static Metric> = {
        let l = metrics().lock().unwrap_or_else(|e| e.into_inner());
        l.clone()
    };
    if list.is_empty() {
        return;
    }
    list.sort_by(|a, b| (prom_name(&a.name), a.plugin).cmp(&(prom_name(&b.name), b.plugin)));
    let mut family: Option<(String, i32)> = None;
    for m in list {
        let name = format!("apisix_wasm_{}", prom_name(&m.name));
        match &family {
            Some((n, k)) if *n == name => {
                if *k != m.kind {
                    continue;
                }
            }
            _ => {
                let ty = match m.kind {
                    COUNTER => "counter",
                    GAUGE => "gauge",
                    _ => "histogram",
                };
                let _ = writeln!(out, "# HELP {name} Defined by a wasm filter ({:?})", m.name);
                let _ = writeln!(out, "# TYPE {name} {ty}");
                family = Some((name.clone(), m.kind));
            }
        }
        let plugin = m.plugin;
        if m.kind != HISTOGRAM {
            let v = m.value.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{plugin=\"{plugin}\"}} {v}");
            continue;
        }
        let mut acc = 0;
        for (i, b) in BOUNDS.iter().enumerate() {
            acc += m.buckets[i].load(Ordering::Relaxed);
            if i + 1 == BOUNDS.len() {
                let _ = writeln!(
                    out,
                    "{name}_bucket{{plugin=\"{plugin}\",le=\"+Inf\"}} {acc}"
                );
            } else {
                let _ = writeln!(out, "{name}_bucket{{plugin=\"{plugin}\",le=\"{b}\"}} {acc}");
            }
        }
        let sum = m.sum.load(Ordering::Relaxed);
        let count = m.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_sum{{plugin=\"{plugin}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{plugin=\"{plugin}\"}} {count}");
    }
}

fn metric(id: i32) -> Option<&'static Metric> {
    let l = metrics().lock().unwrap_or_else(|e| e.into_inner());
    l.get((id as u32 as usize).checked_sub(1)?).copied()
}

fn log_enabled(level: i32) -> bool {
    match level {
        0 => tracing::enabled!(target: "wasm", tracing::Level::TRACE),
        1 => tracing::enabled!(target: "wasm", tracing::Level::DEBUG),
        2 => tracing::enabled!(target: "wasm", tracing::Level::INFO),
        3 => tracing::enabled!(target: "wasm", tracing::Level::WARN),
        _ => tracing::enabled!(target: "wasm", tracing::Level::ERROR),
    }
}

fn log_line(name: &str, level: i32, msg: &str) {
    match level {
        0 => tracing::trace!(target: "wasm", plugin = name, "{msg}"),
        1 => tracing::debug!(target: "wasm", plugin = name, "{msg}"),
        2 => tracing::info!(target: "wasm", plugin = name, "{msg}"),
        3 => tracing::warn!(target: "wasm", plugin = name, "{msg}"),
        _ => tracing::error!(target: "wasm", plugin = name, "{msg}"),
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Adds the host functions to `l`.
pub(crate) fn link(l: &mut Linker<Host>) -> wasmtime::Result<()> {
    const E: &str = "env";
    l.func_wrap(
        E,
        "proxy_log",
        |mut c: Cx<'_>, level: i32, p: i32, n: i32| {
            // SDKs log in every callback whatever the level: a line nobody records is not read or converted
            // (about 2.9k instructions per request of the AssemblyScript SDK's debug lines, callgrind).
            if !log_enabled(level) {
                return Ok(OK);
            }
            let Some(msg) = read(&mut c, p, n)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            log_line(c.data().name, level, &String::from_utf8_lossy(&msg));
            Ok(OK)
        },
    )?;
    l.func_wrap(E, "proxy_get_log_level", |mut c: Cx<'_>, out: i32| {
        let level = if tracing::enabled!(target: "wasm", tracing::Level::TRACE) {
            0
        } else if tracing::enabled!(target: "wasm", tracing::Level::DEBUG) {
            1
        } else if tracing::enabled!(target: "wasm", tracing::Level::INFO) {
            2
        } else {
            3
        };
        Ok(if write_u32(&mut c, out, level)? {
            OK
        } else {
            INVALID_MEMORY_ACCESS
        })
    })?;
    l.func_wrap(
        E,
        "proxy_get_current_time_nanoseconds",
        |mut c: Cx<'_>, out: i32| {
            Ok(if write_u64(&mut c, out, now_nanos())? {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    l.func_wrap(
        E,
        "proxy_set_tick_period_milliseconds",
        |_: Cx<'_>, _ms: i32| UNIMPLEMENTED,
    )?;
    for name in [
        "proxy_set_effective_context",
        "proxy_continue_stream",
        "proxy_close_stream",
    ] {
        l.func_wrap(E, name, |_: Cx<'_>, _x: i32| OK)?;
    }
    for name in [
        "proxy_continue_request",
        "proxy_continue_response",
        "proxy_done",
        "proxy_clear_route_cache",
    ] {
        l.func_wrap(E, name, |_: Cx<'_>| OK)?;
    }
    l.func_wrap(
        E,
        "proxy_get_property",
        |mut c: Cx<'_>, p: i32, n: i32, out_p: i32, out_n: i32| {
            let Some(path) = read(&mut c, p, n)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            give_with(&mut c, out_p, out_n, |h, out| property(h, &path, out))
        },
    )?;
    l.func_wrap(
        E,
        "proxy_set_property",
        |mut c: Cx<'_>, p: i32, n: i32, vp: i32, vn: i32| {
            let (Some(path), Some(v)) = (read(&mut c, p, n)?, read(&mut c, vp, vn)?) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let h = c.data_mut();
            match &path[..] {
                b"wasm_process_req_body" => h.want_req_body = !v.is_empty(),
                b"wasm_process_resp_body" => h.want_resp_body = !v.is_empty(),
                _ => return Ok(NOT_FOUND),
            }
            Ok(OK)
        },
    )?;
    l.func_wrap(
        E,
        "proxy_get_header_map_value",
        |mut c: Cx<'_>, typ: i32, kp: i32, kn: i32, out_p: i32, out_n: i32| {
            let Some(k) = read(&mut c, kp, kn)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            if map_of(c.data(), typ).is_none() {
                return Ok(BAD_ARGUMENT);
            }
            give_with(&mut c, out_p, out_n, |h, out| {
                match map_of(h, typ).and_then(|m| m.get(&k)) {
                    Some(v) => {
                        out.extend_from_slice(v);
                        true
                    }
                    None => false,
                }
            })
        },
    )?;
    l.func_wrap(
        E,
        "proxy_get_header_map_pairs",
        |mut c: Cx<'_>, typ: i32, out_p: i32, out_n: i32| {
            if map_of(c.data(), typ).is_none() {
                return Ok(BAD_ARGUMENT);
            }
            give_with(&mut c, out_p, out_n, |h, out| {
                if let Some(m) = map_of(h, typ) {
                    m.serialize(out)
                }
                true
            })
        },
    )?;
    l.func_wrap(
        E,
        "proxy_get_header_map_size",
        |mut c: Cx<'_>, typ: i32, out: i32| {
            let Some(n) = map_of(c.data(), typ).map(HeaderMap::len) else {
                return Ok(BAD_ARGUMENT);
            };
            Ok(if write_u32(&mut c, out, n as u32)? {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    l.func_wrap(
        E,
        "proxy_set_header_map_pairs",
        |mut c: Cx<'_>, typ: i32, p: i32, n: i32| {
            let Some(b) = read(&mut c, p, n)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(pairs) = parse_pairs(&b) else {
                return Ok(BAD_ARGUMENT);
            };
            match map_of_mut(c.data_mut(), typ) {
                Some(m) => {
                    m.set_all(&pairs);
                    Ok(OK)
                }
                None => Ok(BAD_ARGUMENT),
            }
        },
    )?;
    type Edit = fn(&mut HeaderMap, &[u8], &[u8]);
    let edits: [(&str, Edit); 2] = [
        ("proxy_add_header_map_value", |m, k, v| m.add(k, v)),
        ("proxy_replace_header_map_value", |m, k, v| m.replace(k, v)),
    ];
    for (name, f) in edits {
        l.func_wrap(
            E,
            name,
            move |mut c: Cx<'_>, typ: i32, kp: i32, kn: i32, vp: i32, vn: i32| {
                let (Some(k), Some(v)) = (read(&mut c, kp, kn)?, read(&mut c, vp, vn)?) else {
                    return Ok(INVALID_MEMORY_ACCESS);
                };
                if !header_ok(&k, &v) {
                    return Ok(BAD_ARGUMENT);
                }
                match map_of_mut(c.data_mut(), typ) {
                    Some(m) => {
                        f(m, &k, &v);
                        Ok(OK)
                    }
                    None => Ok(BAD_ARGUMENT),
                }
            },
        )?;
    }
    l.func_wrap(
        E,
        "proxy_remove_header_map_value",
        |mut c: Cx<'_>, typ: i32, kp: i32, kn: i32| {
            let Some(k) = read(&mut c, kp, kn)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            match map_of_mut(c.data_mut(), typ) {
                Some(m) => {
                    m.remove(&k);
                    Ok(OK)
                }
                None => Ok(BAD_ARGUMENT),
            }
        },
    )?;
    l.func_wrap(
        E,
        "proxy_get_buffer_bytes",
        |mut c: Cx<'_>, typ: i32, start: i32, len: i32, out_p: i32, out_n: i32| {
            if typ == REQUEST_BODY || typ == RESPONSE_BODY {
                // Lent out of the host state while the guest's allocator runs (no copy of the whole body).
                let body = std::mem::take(&mut c.data_mut().body);
                let s = (start as u32 as usize).min(body.len());
                let e = s.saturating_add(len as u32 as usize).min(body.len());
                let r = if body.is_empty() {
                    Ok(EMPTY)
                } else {
                    give(&mut c, &body[s..e], out_p, out_n)
                };
                c.data_mut().body = body;
                return r;
            }
            let h = c.data();
            let buf = match typ {
                HTTP_CALL_RESPONSE_BODY => h.call_body.clone(),
                PLUGIN_CONFIGURATION => h.config.clone(),
                VM_CONFIGURATION => Bytes::new(),
                _ => return Ok(BAD_ARGUMENT),
            };
            let s = (start as u32 as usize).min(buf.len());
            let e = s.saturating_add(len as u32 as usize).min(buf.len());
            if buf.is_empty() {
                return Ok(EMPTY);
            }
            give(&mut c, &buf[s..e], out_p, out_n)
        },
    )?;
    l.func_wrap(
        E,
        "proxy_get_buffer_status",
        |mut c: Cx<'_>, typ: i32, len_out: i32, flags_out: i32| {
            let h = c.data();
            let n = match typ {
                REQUEST_BODY | RESPONSE_BODY => h.body.len(),
                HTTP_CALL_RESPONSE_BODY => h.call_body.len(),
                PLUGIN_CONFIGURATION => h.config.len(),
                _ => return Ok(BAD_ARGUMENT),
            };
            let ok = write_u32(&mut c, len_out, n as u32)? && write_u32(&mut c, flags_out, 1)?;
            Ok(if ok { OK } else { INVALID_MEMORY_ACCESS })
        },
    )?;
    l.func_wrap(
        E,
        "proxy_set_buffer_bytes",
        |mut c: Cx<'_>, typ: i32, start: i32, len: i32, p: i32, n: i32| {
            let Some(data) = read(&mut c, p, n)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            if typ != REQUEST_BODY && typ != RESPONSE_BODY {
                return Ok(BAD_ARGUMENT);
            }
            // Bytes [start, start + len) of the body become `data`, as Envoy: start 0 with a length at least the
            // body's replaces it (or clears it, with no data), start at or past the end appends, start 0 with
            // length 0 prepends; any other range is replaced as well.
            let h = c.data_mut();
            let b = &mut h.body;
            let s = (start as u32 as usize).min(b.len());
            let e = s.saturating_add(len as u32 as usize).min(b.len());
            let new_len = b.len() - (e - s) + data.len();
            if new_len > h.body_cap {
                h.body_over = Some(new_len);
                return Ok(BAD_ARGUMENT);
            }
            if s == b.len() {
                b.extend_from_slice(&data);
            } else {
                let tail = b.split_off(e);
                b.truncate(s);
                b.extend_from_slice(&data);
                b.extend_from_slice(&tail);
            }
            h.body_changed = true;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        E,
        "proxy_send_local_response",
        |mut c: Cx<'_>,
         status: i32,
         _dp: i32,
         _dn: i32,
         bp: i32,
         bn: i32,
         hp: i32,
         hn: i32,
         _grpc: i32| {
            let (Some(body), Some(hb)) = (read(&mut c, bp, bn)?, read(&mut c, hp, hn)?) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let Some(pairs) = parse_pairs(&hb) else {
                return Ok(BAD_ARGUMENT);
            };
            if !(200..1000).contains(&status) || pairs.iter().any(|(k, v)| !header_ok(k, v)) {
                return Ok(BAD_ARGUMENT);
            }
            let headers = pairs
                .into_iter()
                .map(|(k, v)| (Bytes::copy_from_slice(k), Bytes::copy_from_slice(v)))
                .collect();
            c.data_mut().local = Some(Local {
                status: status as u16,
                headers,
                body: Bytes::from(body),
            });
            Ok(OK)
        },
    )?;
    l.func_wrap(
        E,
        "proxy_http_call",
        |mut c: Cx<'_>,
         up: i32,
         un: i32,
         hp: i32,
         hn: i32,
         bp: i32,
         bn: i32,
         _tp: i32,
         _tn: i32,
         timeout_ms: i32,
         token_out: i32| {
            let (Some(upstream), Some(hb), Some(body)) = (
                read(&mut c, up, un)?,
                read(&mut c, hp, hn)?,
                read(&mut c, bp, bn)?,
            ) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            if c.data().call.is_some() {
                // One call in flight per request.
                return Ok(BAD_ARGUMENT);
            }
            let Some(pairs) = parse_pairs(&hb) else {
                return Ok(BAD_ARGUMENT);
            };
            let Some(call) = call_out(&upstream, &pairs, body, timeout_ms) else {
                return Ok(BAD_ARGUMENT);
            };
            let token = c.data().next_token;
            if !write_u32(&mut c, token_out, token)? {
                return Ok(INVALID_MEMORY_ACCESS);
            }
            let h = c.data_mut();
            h.next_token = h.next_token.wrapping_add(1).max(1);
            h.call = Some(CallOut { token, ..call });
            Ok(OK)
        },
    )?;
    l.func_wrap(
        E,
        "proxy_get_shared_data",
        |mut c: Cx<'_>, kp: i32, kn: i32, out_p: i32, out_n: i32, cas_out: i32| {
            let Some(k) = read(&mut c, kp, kn)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let found = {
                let s = shared().lock().unwrap_or_else(|e| e.into_inner());
                s.map.get(&k).cloned()
            };
            let Some((v, cas)) = found else {
                return Ok(NOT_FOUND);
            };
            if !write_u32(&mut c, cas_out, cas)? {
                return Ok(INVALID_MEMORY_ACCESS);
            }
            give(&mut c, &v, out_p, out_n)
        },
    )?;
    l.func_wrap(
        E,
        "proxy_set_shared_data",
        |mut c: Cx<'_>, kp: i32, kn: i32, vp: i32, vn: i32, cas: i32| {
            let (Some(k), Some(v)) = (read(&mut c, kp, kn)?, read(&mut c, vp, vn)?) else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            let mut s = shared().lock().unwrap_or_else(|e| e.into_inner());
            let full = s.map.len() >= SHARED_KEYS;
            match s.map.get_mut(&k) {
                Some(slot) => {
                    if cas != 0 && slot.1 != cas as u32 {
                        return Ok(CAS_MISMATCH);
                    }
                    *slot = (Bytes::from(v), slot.1.wrapping_add(1).max(1));
                }
                None if full => return Ok(BAD_ARGUMENT),
                None => {
                    s.map.insert(k, (Bytes::from(v), 1));
                }
            }
            Ok(OK)
        },
    )?;
    l.func_wrap(
        E,
        "proxy_define_metric",
        |mut c: Cx<'_>, kind: i32, np: i32, nn: i32, id_out: i32| {
            let Some(n) = read(&mut c, np, nn)? else {
                return Ok(INVALID_MEMORY_ACCESS);
            };
            if !(0..=2).contains(&kind) {
                return Ok(BAD_ARGUMENT);
            }
            let name = String::from_utf8_lossy(&n).into_owned();
            let plugin = c.data().name;
            let id = {
                let mut l = metrics().lock().unwrap_or_else(|e| e.into_inner());
                match l
                    .iter()
                    .position(|m| m.plugin == plugin && m.name == name && m.kind == kind)
                {
                    Some(i) => i + 1,
                    None if l.len() >= 4096 => return Ok(BAD_ARGUMENT),
                    None => {
                        let n = if kind == HISTOGRAM { BOUNDS.len() } else { 0 };
                        l.push(Box::leak(Box::new(Metric {
                            plugin,
                            name,
                            kind,
                            value: AtomicI64::new(0),
                            buckets: (0..n).map(|_| AtomicU64::new(0)).collect(),
                            count: AtomicU64::new(0),
                            sum: AtomicU64::new(0),
                        })));
                        l.len()
                    }
                }
            };
            Ok(if write_u32(&mut c, id_out, id as u32)? {
                OK
            } else {
                INVALID_MEMORY_ACCESS
            })
        },
    )?;
    l.func_wrap(
        E,
        "proxy_increment_metric",
        |_: Cx<'_>, id: i32, by: i64| match metric(id) {
            Some(m) => {
                m.value.fetch_add(by, Ordering::Relaxed);
                OK
            }
            None => NOT_FOUND,
        },
    )?;
    l.func_wrap(
        E,
        "proxy_record_metric",
        |_: Cx<'_>, id: i32, v: i64| match metric(id) {
            Some(m) => {
                m.record(v);
                OK
            }
            None => NOT_FOUND,
        },
    )?;
    l.func_wrap(E, "proxy_get_metric", |mut c: Cx<'_>, id: i32, out: i32| {
        let Some(m) = metric(id) else {
            return Ok(NOT_FOUND);
        };
        let v = m.value.load(Ordering::Relaxed) as u64;
        Ok(if write_u64(&mut c, out, v)? {
            OK
        } else {
            INVALID_MEMORY_ACCESS
        })
    })?;
    l.func_wrap(
        E,
        "proxy_get_status",
        |mut c: Cx<'_>, code_out: i32, msg_p: i32, msg_n: i32| {
            let status = c
                .data()
                .call_headers
                .get(b":status")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u32>().ok())
                .unwrap_or(0);
            if !write_u32(&mut c, code_out, status)? {
                return Ok(INVALID_MEMORY_ACCESS);
            }
            give(&mut c, b"", msg_p, msg_n)
        },
    )?;
    for wasi in ["wasi_snapshot_preview1", "wasi_unstable"] {
        link_wasi(l, wasi)?;
    }
    Ok(())
}

/// A header name and value a filter may set: a token name (or a pseudo-header), no CR, LF or NUL in the value.
fn header_ok(k: &[u8], v: &[u8]) -> bool {
    let name = k.strip_prefix(b":").unwrap_or(k);
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !v.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0)
}

/// The call a filter asked for: `upstream` is `host:port` (or an `http(s)://` base); the pseudo-headers
/// `:method` (default GET), `:path` (default /) and `:scheme` complete it; `:authority` is sent as Host.
fn call_out(
    upstream: &[u8],
    pairs: &[(&[u8], &[u8])],
    body: Vec<u8>,
    timeout_ms: i32,
) -> Option<CallOut> {
    let up = std::str::from_utf8(upstream).ok()?;
    let pseudo = |n: &str| {
        pairs
            .iter()
            .find(|(k, _)| *k == n.as_bytes())
            .map(|(_, v)| *v)
    };
    let path = std::str::from_utf8(pseudo(":path").unwrap_or(b"/")).ok()?;
    if !path.starts_with('/') {
        return None;
    }
    let method = std::str::from_utf8(pseudo(":method").unwrap_or(b"GET"))
        .ok()?
        .to_owned();
    let uri = if up.starts_with("http://") || up.starts_with("https://") {
        format!("{}{path}", up.trim_end_matches('/'))
    } else {
        let scheme = std::str::from_utf8(pseudo(":scheme").unwrap_or(b"http")).ok()?;
        if scheme != "http" && scheme != "https" {
            return None;
        }
        format!("{scheme}://{up}{path}")
    };
    let mut headers = Vec::new();
    for (k, v) in pairs {
        if k.starts_with(b":") {
            continue;
        }
        if !header_ok(k, v) {
            return None;
        }
        headers.push((Bytes::copy_from_slice(k), Bytes::copy_from_slice(v)));
    }
    let timeout = match timeout_ms {
        t if t <= 0 => Duration::from_secs(5),
        t => Duration::from_millis(t as u64).min(Duration::from_secs(60)),
    };
    Some(CallOut {
        token: 0,
        uri,
        method,
        headers,
        body: Bytes::from(body),
        timeout,
    })
}

/// The WASI calls SDK runtimes make: exit (a trap), stdout / stderr (to the log), clocks, randomness, an empty
/// environment and argument list.
fn link_wasi(l: &mut Linker<Host>, m: &str) -> wasmtime::Result<()> {
    l.func_wrap(
        m,
        "proc_exit",
        |_: Cx<'_>, code: i32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::msg(format!(
                "the filter exited (proc_exit {code})"
            )))
        },
    )?;
    l.func_wrap(
        m,
        "fd_write",
        |mut c: Cx<'_>, fd: i32, iovs: i32, n: i32, written: i32| -> wasmtime::Result<i32> {
            let mut out = Vec::new();
            for i in 0..(n.max(0) as u32).min(1024) {
                let Some(iov) = read(&mut c, iovs.wrapping_add((i * 8) as i32), 8)? else {
                    return Ok(21); // EFAULT
                };
                let p = u32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]) as i32;
                let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]) as i32;
                let Some(b) = read(&mut c, p, len)? else {
                    return Ok(21);
                };
                out.extend_from_slice(&b);
            }
            let msg = String::from_utf8_lossy(&out);
            log_line(c.data().name, if fd == 2 { 3 } else { 2 }, msg.trim_end());
            Ok(if write_u32(&mut c, written, out.len() as u32)? {
                0
            } else {
                21
            })
        },
    )?;
    l.func_wrap(
        m,
        "clock_time_get",
        |mut c: Cx<'_>, _id: i32, _prec: i64, out: i32| -> wasmtime::Result<i32> {
            Ok(if write_u64(&mut c, out, now_nanos())? {
                0
            } else {
                21
            })
        },
    )?;
    l.func_wrap(
        m,
        "random_get",
        |mut c: Cx<'_>, p: i32, n: i32| -> wasmtime::Result<i32> {
            let m = mem(&mut c)?;
            let (p, n) = (p as u32 as usize, n as u32 as usize);
            let Some(s) = m.data_mut(&mut c).get_mut(p..p.saturating_add(n)) else {
                return Ok(21);
            };
            // xorshift seeded from the clock: for hash seeds, not for secrets.
            let mut x = now_nanos() | 1;
            for b in s {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            Ok(0)
        },
    )?;
    for name in ["environ_sizes_get", "args_sizes_get"] {
        l.func_wrap(
            m,
            name,
            |mut c: Cx<'_>, a: i32, b: i32| -> wasmtime::Result<i32> {
                Ok(if write_u32(&mut c, a, 0)? && write_u32(&mut c, b, 0)? {
                    0
                } else {
                    21
                })
            },
        )?;
    }
    for name in ["environ_get", "args_get"] {
        l.func_wrap(m, name, |_: Cx<'_>, _a: i32, _b: i32| 0i32)?;
    }
    l.func_wrap(m, "sched_yield", |_: Cx<'_>| 0i32)?;
    Ok(())
}
