//! loki-logger (priority 414, log): pushes log entries to Grafana Loki's push API (APISIX's
//! apisix/plugins/loki-logger.lua) through the shared batch processor. Each batch is one POST of
//! `{"streams": [{"stream": {labels}, "values": [["<start time ns>", "<entry JSON>"], ...]}, ...]}` to a random
//! `endpoint_addrs` member + `endpoint_uri`, with `X-Scope-OrgID: tenant_id`, `Content-Type: application/json`
//! and `headers`. `log_labels` values may hold `$var`s, resolved per request; entries with the same resolved
//! labels share a stream, in order of first appearance. An entry without a route gets `route_id: "no-matched"`.
//! Only http:// endpoints (as http-logger); one connection per batch (`keepalive*` accepted).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::batch_processor::{wrap_schema, Queue, Sink};
use crate::http_logger::{post, split_uri};
use crate::log_entry::{entry, with_req_body, Format};
use crate::registry::Entry;
use crate::tcp_logger::log_props;
use crate::util::{parse, Template};
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "loki-logger";
pub const PRIORITY: i32 = 414;
const LABEL: &str = "loki logger";

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &["headers"],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    let mut props = json!({
        "endpoint_addrs": {"type": "array", "minItems": 1,
                           "items": {"type": "string", "pattern": "^[^\\/]+:\\/\\/([\\da-zA-Z.-]+|\\[[\\da-fA-F:]+\\])(:\\d+)?"}},
        "endpoint_uri": {"type": "string", "minLength": 1, "default": "/loki/api/v1/push"},
        "tenant_id": {"type": "string", "default": "fake"},
        "headers": {"type": "object", "patternProperties": {".*": {"type": "string", "minLength": 1}}},
        "log_labels": {"type": "object", "patternProperties": {".*": {"type": "string", "minLength": 1}},
                       "default": {"job": "apisix"}},
        "ssl_verify": {"type": "boolean", "default": false},
        "timeout": {"type": "integer", "minimum": 1, "maximum": 60000, "default": 3000,
                    "description": "timeout in milliseconds"},
        "keepalive": {"type": "boolean", "default": true},
        "keepalive_timeout": {"type": "integer", "minimum": 1000, "default": 60000,
                              "description": "keepalive timeout in milliseconds"},
        "keepalive_pool": {"type": "integer", "minimum": 1, "default": 5}
    });
    if let (Some(p), Value::Object(common)) = (props.as_object_mut(), log_props()) {
        p.extend(common);
    }
    wrap_schema(
        json!({"type": "object", "properties": props, "encrypt_fields": ["headers"],
               "required": ["endpoint_addrs"]}),
        LABEL,
    )
}

fn default_uri() -> String {
    "/loki/api/v1/push".into()
}
fn fake() -> String {
    "fake".into()
}
fn three_thousand() -> u64 {
    3000
}
fn job() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("job".into(), json!("apisix"));
    m
}

#[derive(Deserialize, Clone)]
struct Conf {
    endpoint_addrs: Vec<String>,
    #[serde(default = "default_uri")]
    endpoint_uri: String,
    #[serde(default = "fake")]
    tenant_id: String,
    #[serde(default)]
    headers: Map<String, Value>,
    #[serde(default = "job")]
    log_labels: Map<String, Value>,
    #[serde(default = "three_thousand")]
    timeout: u64,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    for a in &c.endpoint_addrs {
        split_uri(&format!("{a}{}", c.endpoint_uri))?;
    }
    Format::compile(c.log_format.as_ref()).map(drop)
}

struct LokiSink {
    conf: Conf,
    next: AtomicUsize,
}

impl Sink for LokiSink {
    fn send(&mut self, entries: &[Value], _: usize) -> Result<(), String> {
        // Streams by resolved label set, in order of first appearance.
        let mut streams: Vec<(&Value, Vec<Value>)> = Vec::new();
        for e in entries {
            let (Some(labels), Some(time), Some(line)) = (e.get(0), e.get(1), e.get(2)) else {
                continue;
            };
            let v = json!([time, line]);
            match streams.iter_mut().find(|(l, _)| *l == labels) {
                Some((_, values)) => values.push(v),
                None => streams.push((labels, vec![v])),
            }
        }
        let body = json!({"streams": streams.iter().map(|(l, v)| json!({"stream": l, "values": v}))
            .collect::<Vec<_>>()});
        let c = &self.conf;
        // APISIX picks a random endpoint; here they take turns.
        let i = self.next.fetch_add(1, Ordering::Relaxed) % c.endpoint_addrs.len();
        let uri = format!("{}{}", c.endpoint_addrs[i], c.endpoint_uri);
        let mut headers: Vec<(&str, &str)> = c
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
            .filter(|(k, _)| {
                !k.eq_ignore_ascii_case("x-scope-orgid") && !k.eq_ignore_ascii_case("content-type")
            })
            .collect();
        headers.push(("X-Scope-OrgID", &c.tenant_id));
        headers.push(("Content-Type", "application/json"));
        let status = post(
            &uri,
            &headers,
            body.to_string().as_bytes(),
            Duration::from_millis(c.timeout),
        )?;
        if status >= 300 || status == 0 {
            return Err(format!("loki server returned status: {status}"));
        }
        Ok(())
    }
}

struct LokiLogger {
    queue: Arc<Queue>,
    format: Option<Format>,
    include_req_body: bool,
    labels: Vec<(String, Template)>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    for a in &c.endpoint_addrs {
        split_uri(&format!("{a}{}", c.endpoint_uri))?;
    }
    let format = Format::resolve(c.log_format.as_ref(), env, NAME)?;
    let include_req_body = c.include_req_body;
    let labels = c
        .log_labels
        .iter()
        .map(|(k, t)| (k.clone(), Template::compile(t.as_str().unwrap_or(""))))
        .collect();
    let queue = env.shared.batches.queue(NAME, v, LABEL, env, || {
        Ok(Box::new(LokiSink {
            conf: c,
            next: AtomicUsize::new(0),
        }))
    })?;
    Ok(Arc::new(LokiLogger {
        queue,
        format,
        include_req_body,
        labels,
    }))
}

impl Plugin for LokiLogger {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Log])
    }
    fn needs_body(&self) -> bool {
        self.include_req_body
    }
    fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        let mut e = entry(ctx, info, self.format.as_ref());
        if self.include_req_body {
            with_req_body(&mut e, ctx);
        }
        if e.get("route_id").is_none_or(|r| r.as_str() == Some("")) {
            e["route_id"] = json!("no-matched");
        }
        let mut labels = Map::with_capacity(self.labels.len());
        for (k, t) in &self.labels {
            labels.insert(k.clone(), json!(t.resolve(ctx).0));
        }
        // The request's start time in nanoseconds, as a string (Loki's timestamp).
        let start = std::time::SystemTime::now()
            .checked_sub(info.latency)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis());
        self.queue.push(json!([
            Value::Object(labels),
            format!("{start}000000"),
            e.to_string()
        ]));
    }
}
