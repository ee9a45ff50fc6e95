//! elasticsearch-logger (priority 413, log): pushes log entries to Elasticsearch's bulk API (APISIX's
//! apisix/plugins/elasticsearch-logger.lua) through the shared batch processor. Each batch is one
//! `POST <endpoint>/_bulk` with `Content-Type: application/x-ndjson`,
//! `Accept: application/vnd.elasticsearch+json`, `Authorization: Basic base64(username:password)` when `auth`
//! is set, then `headers` (which override the former). The body is, per entry,
//! `{"index":{"_index":"<index>"}}\n<entry JSON>\n`. `field.index` may hold `$var`s, resolved per request.
//! Not done (yet): APISIX's version probe (`GET <endpoint>` for ES 5/6, which adds `"_type":"_doc"`) and
//! `{strftime}` time patterns in the index. Only http:// endpoints (as http-logger).

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
use crate::util::{base64_encode, parse, Template};
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "elasticsearch-logger";
pub const PRIORITY: i32 = 413;
const LABEL: &str = "elasticsearch logger";

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &["auth.password", "headers"],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    let mut props = json!({
        "endpoint_addr": {"type": "string", "pattern": "[^/]$"},
        "endpoint_addrs": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "[^/]$"}},
        "field": {"type": "object", "properties": {"index": {"type": "string"}}, "required": ["index"]},
        "auth": {"type": "object",
                 "properties": {"username": {"type": "string", "minLength": 1},
                                "password": {"type": "string", "minLength": 1}},
                 "oneOf": [{"required": ["username", "password"]}]},
        "headers": {"type": "object", "minProperties": 1,
                    "patternProperties": {"^[^:]+$": {"type": "string", "minLength": 1}},
                    "additionalProperties": false},
        "timeout": {"type": "integer", "minimum": 1, "default": 10},
        "ssl_verify": {"type": "boolean", "default": true}
    });
    if let (Some(p), Value::Object(common)) = (props.as_object_mut(), log_props()) {
        p.extend(common);
    }
    wrap_schema(
        json!({"type": "object", "properties": props, "encrypt_fields": ["auth.password", "headers"],
               "oneOf": [{"required": ["endpoint_addr", "field"]}, {"required": ["endpoint_addrs", "field"]}]}),
        LABEL,
    )
}

fn ten() -> u64 {
    10
}

#[derive(Deserialize, Clone)]
struct Field {
    index: String,
}

#[derive(Deserialize, Clone)]
struct Auth {
    username: String,
    password: String,
}

#[derive(Deserialize, Clone)]
struct Conf {
    endpoint_addr: Option<String>,
    #[serde(default)]
    endpoint_addrs: Vec<String>,
    field: Field,
    auth: Option<Auth>,
    #[serde(default)]
    headers: Map<String, Value>,
    /// Seconds, as APISIX.
    #[serde(default = "ten")]
    timeout: u64,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
}

/// The `/_bulk` URIs, the deprecated `endpoint_addr` winning as in APISIX.
fn uris(c: &Conf) -> Result<Vec<String>, String> {
    let addrs = match &c.endpoint_addr {
        Some(a) => std::slice::from_ref(a),
        None => &c.endpoint_addrs[..],
    };
    addrs
        .iter()
        .map(|a| {
            let u = format!("{a}/_bulk");
            split_uri(&u).map(|_| u)
        })
        .collect()
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    uris(&c)?;
    Format::compile(c.log_format.as_ref()).map(drop)
}

struct EsSink {
    uris: Vec<String>,
    headers: Vec<(String, String)>,
    timeout: Duration,
    next: AtomicUsize,
}

impl Sink for EsSink {
    fn send(&mut self, entries: &[Value], _: usize) -> Result<(), String> {
        let mut body = String::new();
        for e in entries {
            if let Some(s) = e.as_str() {
                body.push_str(s);
            }
        }
        // APISIX picks a random endpoint; here they take turns.
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.uris.len();
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let status = post(&self.uris[i], &headers, body.as_bytes(), self.timeout)?;
        if status != 200 {
            return Err(format!("elasticsearch server returned status: {status}"));
        }
        Ok(())
    }
}

struct EsLogger {
    queue: Arc<Queue>,
    format: Option<Format>,
    include_req_body: bool,
    index: Template,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let uris = uris(&c)?;
    let format = Format::resolve(c.log_format.as_ref(), env, NAME)?;
    // Built once: fixed headers, then auth, then the user's headers replacing any of the same name.
    let mut headers: Vec<(String, String)> = vec![
        ("Content-Type".into(), "application/x-ndjson".into()),
        ("Accept".into(), "application/vnd.elasticsearch+json".into()),
    ];
    if let Some(a) = &c.auth {
        let token = base64_encode(format!("{}:{}", a.username, a.password).as_bytes());
        headers.push(("Authorization".into(), format!("Basic {token}")));
    }
    for (k, v) in &c.headers {
        if let Some(v) = v.as_str() {
            headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
            headers.push((k.clone(), v.to_string()));
        }
    }
    let sink = EsSink {
        uris,
        headers,
        timeout: Duration::from_secs(c.timeout),
        next: AtomicUsize::new(0),
    };
    let queue = env
        .shared
        .batches
        .queue(NAME, v, LABEL, env, || Ok(Box::new(sink)))?;
    Ok(Arc::new(EsLogger {
        queue,
        format,
        include_req_body: c.include_req_body,
        index: Template::compile(&c.field.index),
    }))
}

impl Plugin for EsLogger {
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
        let action = json!({"index": {"_index": self.index.resolve(ctx).0}});
        self.queue.push(Value::String(format!("{action}\n{e}\n")));
    }
}
