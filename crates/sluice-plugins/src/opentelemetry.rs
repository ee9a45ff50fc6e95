//! opentelemetry (priority 12009, rewrite + log): a SERVER span per request, exported as OTLP/HTTP protobuf to
//! `plugin_attr.opentelemetry.collector` (APISIX 3.x; a `plugin_metadata` object for the plugin, as newer APISIX
//! reads, takes precedence). The client's W3C `traceparent` is continued when valid, else a trace starts; the
//! upstream request carries a `traceparent` whose parent is the server span, sampled or not, on every upstream
//! protocol (the proxy writes request edits into HTTP/1.1, h2 and gRPC heads alike).
//!
//! Samplers are APISIX's: `always_on`, `always_off` (the default), `trace_id_ratio` (`fraction` of trace ids, by
//! the id's low 64 bits), `parent_base` (the client's sampled flag when it sent a valid `traceparent`, else the
//! `root` sampler). Only sampled spans are built and queued; the exporter batches them off the request path
//! (`crate::trace`).

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use sluice_router::Var;

use crate::registry::Entry;
use crate::trace::{self, Attr, ExportConf, Exporter, Kind, SpanRecord};
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "opentelemetry";
pub const PRIORITY: i32 = 12009;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &[],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    let ratio = json!({"type": "number", "title": "trace_id_ratio fraction", "default": 0});
    json!({
        "type": "object",
        "properties": {
            "sampler": {
                "type": "object",
                "properties": {
                    "name": {"type": "string",
                             "enum": ["always_on", "always_off", "trace_id_ratio", "parent_base"],
                             "title": "sampling strategy", "default": "always_off"},
                    "options": {
                        "type": "object",
                        "properties": {
                            "fraction": ratio,
                            "root": {
                                "type": "object",
                                "title": "parent_base root sampler",
                                "properties": {
                                    "name": {"type": "string",
                                             "enum": ["always_on", "always_off", "trace_id_ratio"],
                                             "title": "sampling strategy", "default": "always_off"},
                                    "options": {"type": "object",
                                                "properties": {"fraction": ratio},
                                                "default": {"fraction": 0}}
                                },
                                "default": {"name": "always_off", "options": {"fraction": 0}}
                            }
                        },
                        "default": {"fraction": 0, "root": {"name": "always_off"}}
                    }
                },
                "default": {"name": "always_off", "options": {"fraction": 0, "root": {"name": "always_off"}}}
            },
            "additional_attributes": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "additional_header_prefix_attributes": {"type": "array",
                                                    "items": {"type": "string", "minLength": 1}}
        }
    })
}

/// `plugin_attr.opentelemetry` (APISIX's metadata_schema for the plugin).
fn attr_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "trace_id_source": {"type": "string", "enum": ["x-request-id", "random"], "default": "random"},
            "resource": {"type": "object"},
            "collector": {
                "type": "object",
                "properties": {
                    "address": {"type": "string", "default": "127.0.0.1:4318"},
                    "request_timeout": {"type": "integer", "default": 3},
                    "request_headers": {"type": "object"}
                },
                "default": {"address": "127.0.0.1:4318", "request_timeout": 3}
            },
            "batch_span_processor": {
                "type": "object",
                "properties": {
                    "drop_on_queue_full": {"type": "boolean"},
                    "max_queue_size": {"type": "integer"},
                    "batch_timeout": {"type": "number"},
                    "inactive_timeout": {"type": "number"},
                    "max_export_batch_size": {"type": "integer"}
                },
                "default": {}
            },
            "set_ngx_var": {"type": "boolean", "default": false}
        }
    })
}

#[derive(Deserialize, Default)]
struct Conf {
    #[serde(default)]
    sampler: Option<SamplerConf>,
    #[serde(default)]
    additional_attributes: Vec<String>,
    #[serde(default)]
    additional_header_prefix_attributes: Vec<String>,
}

#[derive(Deserialize)]
struct SamplerConf {
    #[serde(default = "off")]
    name: String,
    #[serde(default)]
    options: Option<SamplerOptions>,
}

#[derive(Deserialize, Default)]
struct SamplerOptions {
    #[serde(default)]
    fraction: f64,
    root: Option<Box<SamplerConf>>,
}

fn off() -> String {
    "always_off".into()
}

#[derive(Deserialize)]
struct Attrs {
    #[serde(default)]
    resource: Map<String, Value>,
    #[serde(default)]
    collector: Collector,
    #[serde(default)]
    batch_span_processor: Bsp,
}

#[derive(Deserialize)]
struct Collector {
    #[serde(default = "default_address")]
    address: String,
    #[serde(default = "three")]
    request_timeout: u64,
    #[serde(default)]
    request_headers: Map<String, Value>,
}

impl Default for Collector {
    fn default() -> Self {
        Collector {
            address: default_address(),
            request_timeout: 3,
            request_headers: Map::new(),
        }
    }
}

fn default_address() -> String {
    "127.0.0.1:4318".into()
}
fn three() -> u64 {
    3
}

/// opentelemetry-lua's batch span processor defaults.
#[derive(Deserialize, Default)]
struct Bsp {
    max_queue_size: Option<u64>,
    batch_timeout: Option<f64>,
    inactive_timeout: Option<f64>,
    max_export_batch_size: Option<u64>,
}

#[derive(Debug, Clone)]
enum Sampler {
    On,
    Off,
    /// Sampled when the trace id's low 64 bits are below this bound.
    Ratio(u64),
    ParentBase(Box<Sampler>),
}

impl Sampler {
    fn compile(c: Option<&SamplerConf>) -> Sampler {
        let Some(c) = c else { return Sampler::Off };
        let fraction = c.options.as_ref().map_or(0.0, |o| o.fraction);
        match c.name.as_str() {
            "always_on" => Sampler::On,
            "trace_id_ratio" => Sampler::ratio(fraction),
            "parent_base" => {
                let root = c.options.as_ref().and_then(|o| o.root.as_deref());
                Sampler::ParentBase(Box::new(Sampler::compile(root)))
            }
            _ => Sampler::Off,
        }
    }

    fn ratio(fraction: f64) -> Sampler {
        if fraction >= 1.0 {
            Sampler::On
        } else if fraction > 0.0 {
            Sampler::Ratio((fraction * u64::MAX as f64) as u64)
        } else {
            Sampler::Off
        }
    }

    /// `parent`: the sampled flag of a valid incoming `traceparent`.
    fn sample(&self, parent: Option<bool>, trace_id: &[u8; 16]) -> bool {
        match self {
            Sampler::On => true,
            Sampler::Off => false,
            Sampler::Ratio(bound) => {
                let mut low = [0u8; 8];
                low.copy_from_slice(&trace_id[8..]);
                u64::from_be_bytes(low) < *bound
            }
            Sampler::ParentBase(root) => match parent {
                Some(s) => s,
                None => root.sample(None, trace_id),
            },
        }
    }
}

/// An `additional_header_prefix_attributes` entry: a header name, or a prefix when it ends in `*`.
enum HeaderAttr {
    Exact(String),
    Prefix(String),
}

struct Otel {
    sampler: Sampler,
    vars: Vec<(Box<str>, Var)>,
    headers: Vec<HeaderAttr>,
    from_request_id: bool,
    exporter: Arc<Exporter>,
}

/// The server span of one request, from rewrite to log.
pub(crate) struct ReqSpan {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    trace_state: Option<Box<str>>,
    start_ns: u64,
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

/// The node-wide settings: plugin_metadata (newer APISIX) over `plugin_attr.opentelemetry`, else the defaults.
fn attrs(env: &CompileEnv<'_>) -> Result<ExportConf, String> {
    let raw = match env.metadata(NAME) {
        Some(m) => Value::Object(m.clone()),
        None => env
            .plugin_attr
            .and_then(|a| a.get(NAME))
            .cloned()
            .unwrap_or_else(|| json!({})),
    };
    let a: Attrs =
        parse(&attr_schema(), &raw).map_err(|e| format!("plugin_attr.opentelemetry: {e}"))?;
    let (addr, host, path) = ExportConf::endpoint(&a.collector.address, "/v1/traces")
        .map_err(|e| format!("plugin_attr.opentelemetry.collector.address: {e}"))?;
    let mut headers = Vec::new();
    for (k, v) in &a.collector.request_headers {
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Bool(_) | Value::Number(_) => v.to_string(),
            _ => return Err(format!("plugin_attr.opentelemetry.collector.request_headers.{k}: not a string, number or boolean")),
        };
        let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        if !token(k) || v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!(
                "plugin_attr.opentelemetry.collector.request_headers: invalid header {k:?}"
            ));
        }
        headers.push((k.clone(), v));
    }
    let mut resource = vec![("hostname".to_owned(), Attr::Str(trace::hostname().into()))];
    if !a.resource.contains_key("service.name") {
        resource.push(("service.name".into(), Attr::Str("APISIX".into())));
    }
    for (k, v) in &a.resource {
        let v = match v {
            Value::String(s) => Attr::Str(s.as_str().into()),
            Value::Bool(b) => Attr::Bool(*b),
            Value::Number(n) => Attr::Double(n.as_f64().unwrap_or_default()),
            _ => continue,
        };
        resource.push((k.clone(), v));
    }
    let secs = |s: Option<f64>, d: f64| {
        std::time::Duration::from_secs_f64(s.filter(|s| s.is_finite() && *s > 0.0).unwrap_or(d))
    };
    let bsp = &a.batch_span_processor;
    Ok(ExportConf {
        format: trace::export::Format::Otlp,
        addr,
        host,
        path,
        timeout: std::time::Duration::from_secs(a.collector.request_timeout.clamp(1, 600)),
        headers,
        max_queue: bsp.max_queue_size.unwrap_or(2048).clamp(1, 1 << 20) as usize,
        batch_size: bsp.max_export_batch_size.unwrap_or(256).clamp(1, 1 << 16) as usize,
        batch_timeout: secs(bsp.batch_timeout, 5.0),
        inactive: secs(bsp.inactive_timeout, 2.0),
        resource,
    })
}

fn from_request_id(env: &CompileEnv<'_>) -> bool {
    let src = env
        .metadata(NAME)
        .and_then(|m| m.get("trace_id_source"))
        .or_else(|| env.plugin_attr?.get(NAME)?.get("trace_id_source"));
    src.and_then(Value::as_str) == Some("x-request-id")
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let export = attrs(env)?;
    Ok(Arc::new(Otel {
        sampler: Sampler::compile(c.sampler.as_ref()),
        vars: c
            .additional_attributes
            .iter()
            .map(|n| {
                let name = n.strip_prefix('$').unwrap_or(n);
                (n.as_str().into(), Var::parse(name))
            })
            .collect(),
        headers: c
            .additional_header_prefix_attributes
            .iter()
            .map(|h| match h.strip_suffix('*') {
                Some(p) if !p.is_empty() => HeaderAttr::Prefix(p.to_ascii_lowercase()),
                _ => HeaderAttr::Exact(h.to_ascii_lowercase()),
            })
            .collect(),
        from_request_id: from_request_id(env),
        exporter: env.shared.exporters.get(export),
    }))
}

impl Otel {
    /// A new trace id: random, or with `trace_id_source: x-request-id` the request id when it is 32 hex digits
    /// (a UUID's dashes aside) and not zero.
    fn new_trace_id(&self, ctx: &Ctx<'_>) -> [u8; 16] {
        if self.from_request_id {
            let header = ctx.req.head.header("x-request-id");
            let var = ctx
                .vars
                .iter()
                .find(|(n, _)| *n == "request_id")
                .map(|(_, v)| v.as_bytes());
            if let Some(id) = header.or(var) {
                let mut digits = [0u8; 32];
                let mut n = 0;
                for &b in id.iter().filter(|b| **b != b'-') {
                    if n == 32 {
                        n = 33;
                        break;
                    }
                    digits[n] = b;
                    n += 1;
                }
                if n == 32 {
                    if let Some(id) = trace::parse_hex::<16>(&digits, true) {
                        if id != [0; 16] {
                            return id;
                        }
                    }
                }
            }
        }
        trace::new_trace_id()
    }
}

impl Plugin for Otel {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Rewrite, Phase::Log])
    }

    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        let incoming = ctx
            .req
            .head
            .header("traceparent")
            .and_then(trace::parse_traceparent);
        let (trace_id, parent, sampled) = match incoming {
            Some(tp) => (
                tp.trace_id,
                Some(tp.parent_id),
                self.sampler.sample(Some(tp.sampled()), &tp.trace_id),
            ),
            None => {
                let id = self.new_trace_id(ctx);
                (id, None, self.sampler.sample(None, &id))
            }
        };
        let span_id = trace::new_span_id();
        let trace_state = match incoming {
            Some(_) => ctx
                .req
                .head
                .header("tracestate")
                .and_then(trace::valid_tracestate),
            None => None,
        };
        trace::set_header(
            ctx,
            "traceparent",
            trace::format_traceparent(&trace_id, &span_id, sampled),
        );
        // The client's tracestate belongs to its trace: passed on (when sane) only if that trace continues.
        match trace_state {
            Some(ts) => {
                let ts = ts.to_owned();
                trace::set_header(ctx, "tracestate", ts);
            }
            None => trace::remove_header(ctx, "tracestate"),
        }
        if sampled {
            let span = ReqSpan {
                trace_id,
                span_id,
                parent,
                trace_state: trace_state.map(Into::into),
                start_ns: trace::now_ns(),
            };
            ctx.trace.get_or_insert_with(Default::default).otel = Some(span);
        }
        Flow::Continue
    }

    fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        let Some(s) = ctx.trace.as_ref().and_then(|t| t.otel.as_ref()) else {
            return;
        };
        let req = ctx.req;
        let method = sluice_router::MatchRequest::method(req);
        let mut attrs: Vec<(Box<str>, Attr)> = Vec::with_capacity(12 + self.vars.len());
        let mut put = |k: &str, v: &str| attrs.push((k.into(), Attr::Str(v.into())));
        put("net.host.name", req.host.as_deref().unwrap_or_default());
        put("http.method", method);
        put("http.scheme", req.scheme);
        put("http.target", &req.request_uri());
        if let Some(ua) = req.head.header("user-agent") {
            put("http.user_agent", &String::from_utf8_lossy(ua));
        }
        let mut name = String::with_capacity(method.len() + 32);
        name.push_str(method);
        put("apisix.route_id", ctx.route_id);
        if let Some(m) = ctx.route {
            if let Some(n) = &m.route_name {
                put("apisix.route_name", n);
            }
            put("http.route", &m.matched_uri);
            name.push(' ');
            name.push_str(&m.matched_uri);
            if let Some(id) = &m.service_id {
                put("apisix.service_id", id);
                put(
                    "apisix.service_name",
                    m.service_name.as_deref().unwrap_or_default(),
                );
            }
        }
        for (k, var) in &self.vars {
            if let Some(v) = ctx.var(var) {
                put(k, &v);
            }
        }
        if !self.headers.is_empty() {
            for (n, v) in req.head.headers_iter() {
                let Ok(n) = std::str::from_utf8(n) else {
                    continue;
                };
                let n = n.to_ascii_lowercase();
                let hit = self.headers.iter().any(|h| match h {
                    HeaderAttr::Exact(e) => *e == n,
                    HeaderAttr::Prefix(p) => n.starts_with(p.as_str()),
                });
                if hit {
                    put(&n, &String::from_utf8_lossy(v));
                }
            }
        }
        // APISIX reports the upstream's status; a response made by a plugin has none, so its status stands in.
        let status = info.upstream_status.unwrap_or(info.status);
        attrs.push(("http.status_code".into(), Attr::Int(status.into())));
        attrs.push(("http.response.status_code".into(), Attr::Int(status.into())));
        let error = (status >= 500).then(|| format!("upstream response status: {status}").into());
        self.exporter.submit(SpanRecord {
            trace_id: s.trace_id,
            span_id: s.span_id,
            parent: s.parent,
            name: name.into(),
            kind: Kind::Server,
            start_ns: s.start_ns,
            end_ns: trace::now_ns().max(s.start_ns),
            attrs,
            error,
            trace_state: s.trace_state.clone(),
            local: None,
        });
    }
}
