//! clickhouse-logger (priority 398, log): inserts log entries into a ClickHouse table over its HTTP interface
//! (APISIX's apisix/plugins/clickhouse-logger.lua) through the shared batch processor. Each batch is one
//! `POST` to `endpoint_addr` or a member of `endpoint_addrs` (path and query kept as given) with
//! `Content-Type: application/json`, `X-ClickHouse-User: user`, `X-ClickHouse-Key: password` and
//! `X-ClickHouse-Database: database`, and the body `INSERT INTO <logtable> FORMAT JSONEachRow {..} {..}`
//! (entries JSON-encoded, joined by one space). A status of 400 or more fails the batch (retried by the batch
//! processor). `password` is a secret (`encrypt_fields`). Only http:// endpoints (as http-logger); one
//! connection per batch. Differences from APISIX: endpoints take turns instead of a random pick, and the
//! `Host` header keeps the endpoint's port.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::batch_processor::{wrap_schema, Queue, Sink};
use crate::http_logger::{post, split_uri};
use crate::log_entry::{entry, with_req_body, Format};
use crate::registry::Entry;
use crate::tcp_logger::log_props;
use crate::util::parse;
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "clickhouse-logger";
pub const PRIORITY: i32 = 398;
const LABEL: &str = "clickhouse logger";

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &["password"],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    let uri_def = json!({"type": "string", "pattern": "^[^\\/]+:\\/\\/([\\da-zA-Z.-]+|\\[[\\da-fA-F:]+\\])(:\\d+)?"});
    let mut props = json!({
        "endpoint_addr": uri_def,
        "endpoint_addrs": {"type": "array", "minItems": 1, "items": uri_def},
        "user": {"type": "string", "default": ""},
        "password": {"type": "string", "default": ""},
        "database": {"type": "string", "default": ""},
        "logtable": {"type": "string", "default": ""},
        "timeout": {"type": "integer", "minimum": 1, "default": 3},
        "ssl_verify": {"type": "boolean", "default": true}
    });
    if let (Some(p), Value::Object(common)) = (props.as_object_mut(), log_props()) {
        p.extend(common);
    }
    wrap_schema(
        json!({"type": "object", "properties": props,
               "oneOf": [
                   {"required": ["endpoint_addr", "user", "password", "database", "logtable"]},
                   {"required": ["endpoint_addrs", "user", "password", "database", "logtable"]}
               ],
               "encrypt_fields": ["password"]}),
        LABEL,
    )
}

fn three() -> u64 {
    3
}

#[derive(Deserialize, Clone)]
struct Conf {
    endpoint_addr: Option<String>,
    #[serde(default)]
    endpoint_addrs: Vec<String>,
    #[serde(default)]
    user: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    database: String,
    #[serde(default)]
    logtable: String,
    #[serde(default = "three")]
    timeout: u64,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
}

impl Conf {
    /// The endpoints to use: the deprecated `endpoint_addr` alone if given, as APISIX.
    fn endpoints(&self) -> Vec<String> {
        match &self.endpoint_addr {
            Some(a) => vec![a.clone()],
            None => self.endpoint_addrs.clone(),
        }
    }
}

fn parse_conf(v: &Value) -> Result<(Conf, Vec<String>), String> {
    let c: Conf = parse(&schema(), v)?;
    let eps = c.endpoints();
    for a in &eps {
        split_uri(a)?;
        if a.bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(format!(
                "invalid endpoint (spaces or control characters): {a:?}"
            ));
        }
    }
    // They go into header values as written: a CR or LF would start a header (or a request) of its own.
    for (name, v) in [
        ("user", &c.user),
        ("password", &c.password),
        ("database", &c.database),
    ] {
        if v.bytes().any(|b| b.is_ascii_control()) {
            return Err(format!(
                "property \"{name}\" must not contain control characters"
            ));
        }
    }
    Ok((c, eps))
}

fn check(v: &Value) -> Result<(), String> {
    let (c, _) = parse_conf(v)?;
    Format::compile(c.log_format.as_ref()).map(drop)
}

struct ClickhouseSink {
    conf: Conf,
    endpoints: Vec<String>,
    next: AtomicUsize,
}

impl Sink for ClickhouseSink {
    fn send(&mut self, entries: &[Value], _: usize) -> Result<(), String> {
        let c = &self.conf;
        let mut body = format!("INSERT INTO {} FORMAT JSONEachRow ", c.logtable);
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                body.push(' ');
            }
            body.push_str(&e.to_string());
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.endpoints.len();
        let headers = [
            ("Content-Type", "application/json"),
            ("X-ClickHouse-User", c.user.as_str()),
            ("X-ClickHouse-Key", c.password.as_str()),
            ("X-ClickHouse-Database", c.database.as_str()),
        ];
        let status = post(
            &self.endpoints[i],
            &headers,
            body.as_bytes(),
            Duration::from_secs(c.timeout),
        )?;
        if status >= 400 || status == 0 {
            return Err(format!(
                "server returned status code[{status}] endpoint[{}]",
                self.endpoints[i]
            ));
        }
        Ok(())
    }
}

struct ClickhouseLogger {
    queue: Arc<Queue>,
    format: Option<Format>,
    include_req_body: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let (c, endpoints) = parse_conf(v)?;
    let format = Format::resolve(c.log_format.as_ref(), env, NAME)?;
    let include_req_body = c.include_req_body;
    let queue = env.shared.batches.queue(NAME, v, LABEL, env, || {
        Ok(Box::new(ClickhouseSink {
            conf: c,
            endpoints,
            next: AtomicUsize::new(0),
        }))
    })?;
    Ok(Arc::new(ClickhouseLogger {
        queue,
        format,
        include_req_body,
    }))
}

impl Plugin for ClickhouseLogger {
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
        self.queue.push(e);
    }
}
