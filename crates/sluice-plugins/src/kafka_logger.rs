//! kafka-logger (priority 403, log): sends log entries to a Kafka topic through the shared batch processor
//! (APISIX's apisix/plugins/kafka-logger.lua). Each batch is one Kafka message: the entry alone when
//! `batch_max_size` is 1, else a JSON array of the entries. `meta_format` `default` is the usual log entry,
//! `origin` the raw request (request line, headers and, with `include_req_body`, the body). `key` is the message
//! key and picks the partition as lua-resty-kafka's default partitioner does (CRC32 of the key modulo the
//! partition count); without a key the partitions take turns.
//!
//! The client is rskafka (pure Rust, no librdkafka; InfluxData's, used by InfluxDB IOx), run on the processor's
//! own thread with a current-thread runtime. `brokers[].sasl_config` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and
//! `tls` are passed to it. Differences from lua-resty-kafka, whose options are accepted and checked as APISIX does:
//! rskafka always asks for `acks = -1` (every in-sync replica), which is at least what `required_acks` 1 asks;
//! `producer_type` `sync`/`async`, `producer_batch_*`, `producer_max_buffering`, `producer_time_linger`,
//! `api_version` and `cluster_name` do not change anything here: the batch processor already batches, and one
//! produce request is sent per batch and awaited (at most `timeout` seconds) before the next.

use std::sync::Arc;
use std::time::Duration;

use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::batch_processor::{encode_batch, wrap_schema, Queue, Sink};
use crate::log_entry::{entry, with_req_body, Format};
use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "kafka-logger";
pub const PRIORITY: i32 = 403;
const LABEL: &str = "kafka logger";

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &["brokers.sasl_config.password"],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    let body_expr = json!({"type": "array", "minItems": 1, "items": {"type": "array"}});
    wrap_schema(
        json!({
            "type": "object",
            "properties": {
                "meta_format": {"type": "string", "default": "default", "enum": ["default", "origin"]},
                "log_format": {"type": "object"},
                "log_format_extra": {"type": "object"},
                "broker_list": {
                    "type": "object", "minProperties": 1,
                    "patternProperties": {".*": {"description": "the port of kafka broker",
                        "type": "integer", "minimum": 1, "maximum": 65535}}
                },
                "brokers": {
                    "type": "array", "minItems": 1, "uniqueItems": true,
                    "items": {
                        "type": "object",
                        "properties": {
                            "host": {"type": "string", "description": "the host of kafka broker"},
                            "port": {"type": "integer", "minimum": 1, "maximum": 65535,
                                     "description": "the port of kafka broker"},
                            "sasl_config": {
                                "type": "object", "description": "sasl config",
                                "properties": {
                                    "mechanism": {"type": "string", "default": "PLAIN",
                                                  "enum": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]},
                                    "user": {"type": "string", "description": "user"},
                                    "password": {"type": "string", "description": "password"}
                                },
                                "required": ["user", "password"]
                            }
                        },
                        "required": ["host", "port"]
                    }
                },
                "tls": {"type": "object", "description": "tls config for connecting to kafka brokers",
                        "properties": {"verify": {"type": "boolean", "default": false}}},
                "kafka_topic": {"type": "string"},
                "producer_type": {"type": "string", "default": "async", "enum": ["async", "sync"]},
                "required_acks": {"type": "integer", "default": 1, "enum": [1, -1]},
                "key": {"type": "string"},
                "timeout": {"type": "integer", "minimum": 1, "default": 3},
                "include_req_body": {"type": "boolean", "default": false},
                "include_req_body_expr": body_expr,
                "include_resp_body": {"type": "boolean", "default": false},
                "include_resp_body_expr": body_expr,
                "max_req_body_bytes": {"type": "integer", "minimum": 1, "default": 524_288},
                "max_resp_body_bytes": {"type": "integer", "minimum": 1, "default": 524_288},
                "cluster_name": {"type": "integer", "minimum": 1, "default": 1},
                "producer_batch_num": {"type": "integer", "minimum": 1, "default": 200},
                "producer_batch_size": {"type": "integer", "minimum": 0, "default": 1_048_576},
                "producer_max_buffering": {"type": "integer", "minimum": 1, "default": 50_000},
                "producer_time_linger": {"type": "integer", "minimum": 1, "default": 1},
                "meta_refresh_interval": {"type": "integer", "minimum": 1, "default": 30},
                "api_version": {"type": "integer", "default": 1, "enum": [0, 1, 2]}
            },
            "oneOf": [
                {"required": ["broker_list", "kafka_topic"]},
                {"required": ["brokers", "kafka_topic"]}
            ],
            "encrypt_fields": ["brokers.sasl_config.password"]
        }),
        LABEL,
    )
}

#[derive(Deserialize, Clone)]
struct Sasl {
    #[serde(default = "plain")]
    mechanism: String,
    user: String,
    password: String,
}

fn plain() -> String {
    "PLAIN".into()
}

#[derive(Deserialize, Clone)]
struct Broker {
    host: String,
    port: u16,
    sasl_config: Option<Sasl>,
}

#[derive(Deserialize, Clone)]
struct Tls {
    #[serde(default)]
    verify: bool,
}

#[derive(Deserialize, Clone)]
struct Conf {
    #[serde(default = "default_meta")]
    meta_format: String,
    log_format: Option<Value>,
    broker_list: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    brokers: Vec<Broker>,
    tls: Option<Tls>,
    kafka_topic: String,
    key: Option<String>,
    #[serde(default = "three")]
    timeout: u64,
    #[serde(default)]
    include_req_body: bool,
}

fn default_meta() -> String {
    "default".into()
}
fn three() -> u64 {
    3
}

impl Conf {
    /// `host:port` of every broker: `brokers` first, then the deprecated `broker_list`, as APISIX merges them.
    fn bootstrap(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .brokers
            .iter()
            .map(|b| host_port(&b.host, b.port))
            .collect();
        for (h, p) in self.broker_list.iter().flatten() {
            if let Some(p) = p.as_u64().and_then(|p| u16::try_from(p).ok()) {
                out.push(host_port(h, p));
            }
        }
        out
    }

    fn sasl(&self) -> Result<Option<SaslConfig>, String> {
        let Some(s) = self.brokers.iter().find_map(|b| b.sasl_config.as_ref()) else {
            return Ok(None);
        };
        let c = Credentials::new(s.user.clone(), s.password.clone());
        Ok(Some(match s.mechanism.as_str() {
            "PLAIN" => SaslConfig::Plain(c),
            "SCRAM-SHA-256" => SaslConfig::ScramSha256(c),
            "SCRAM-SHA-512" => SaslConfig::ScramSha512(c),
            m => return Err(format!("unsupported sasl mechanism {m}")),
        }))
    }
}

fn host_port(h: &str, p: u16) -> String {
    if h.contains(':') && !h.starts_with('[') {
        format!("[{h}]:{p}")
    } else {
        format!("{h}:{p}")
    }
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    c.sasl()?;
    Format::compile(c.log_format.as_ref()).map(drop)
}

/// One producer per processor: the client and the topic's partitions, made on first use and again after a
/// failure (a restarted or replaced broker).
struct KafkaSink {
    rt: tokio::runtime::Runtime,
    producer: Producer,
}

struct Producer {
    conf: Conf,
    client: Option<Client>,
    partitions: Vec<PartitionClient>,
    next: usize,
}

impl Producer {
    async fn produce(&mut self, value: Vec<u8>) -> Result<(), String> {
        let timeout = Duration::from_secs(self.conf.timeout);
        if self.client.is_none() {
            let mut b = ClientBuilder::new(self.conf.bootstrap())
                .client_id("sluice")
                .backoff_config(BackoffConfig {
                    deadline: Some(timeout),
                    ..BackoffConfig::default()
                });
            if let Some(s) = self.conf.sasl()? {
                b = b.sasl_config(s);
            }
            if let Some(t) = &self.conf.tls {
                b = b.tls_config(crate::forward_auth::client::tls_config(t.verify));
            }
            self.client = Some(b.build().await.map_err(|e| e.to_string())?);
        }
        let client = self.client.as_ref().ok_or("no client")?;
        if self.partitions.is_empty() {
            let topic = &self.conf.kafka_topic;
            let find = || async {
                client
                    .list_topics()
                    .await
                    .map_err(|e| e.to_string())
                    .map(|l| {
                        l.into_iter()
                            .find(|t| &t.name == topic)
                            .map(|t| t.partitions)
                    })
            };
            let parts = match find().await? {
                Some(p) => p,
                None => {
                    // Asking for the topic by name lets a broker with `auto.create.topics.enable` (Kafka's
                    // default) create it, as lua-resty-kafka's metadata request does.
                    client
                        .partition_client(topic.clone(), 0, UnknownTopicHandling::Retry)
                        .await
                        .map_err(|e| format!("topic {topic}: {e}"))?;
                    find()
                        .await?
                        .ok_or_else(|| format!("topic {topic} not found"))?
                }
            };
            for p in parts {
                self.partitions.push(
                    client
                        .partition_client(topic.clone(), p, UnknownTopicHandling::Error)
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            if self.partitions.is_empty() {
                return Err(format!("topic {topic} has no partition"));
            }
        }
        let n = self.partitions.len();
        let idx = match &self.conf.key {
            Some(k) => crc32(k.as_bytes()) as usize % n,
            None => {
                self.next = self.next.wrapping_add(1);
                self.next % n
            }
        };
        let record = Record {
            key: self.conf.key.as_ref().map(|k| k.as_bytes().to_vec()),
            value: Some(value),
            headers: Default::default(),
            timestamp: chrono::Utc::now(),
        };
        self.partitions[idx]
            .produce(vec![record], Compression::NoCompression)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

impl Sink for KafkaSink {
    fn send(&mut self, entries: &[Value], batch_max_size: usize) -> Result<(), String> {
        // A batch of one raw request (`meta_format: origin`) is the request text itself, as APISIX sends it.
        let data = match entries {
            [Value::String(s)] if batch_max_size == 1 => s.clone(),
            _ => encode_batch(entries, batch_max_size),
        };
        let KafkaSink { rt, producer: p } = self;
        let secs = p.conf.timeout;
        let r = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(secs), p.produce(data.into_bytes()))
                .await
                .unwrap_or_else(|_| Err(format!("timed out after {secs}s")))
        });
        if r.is_err() {
            p.client = None;
            p.partitions.clear();
        }
        r.map_err(|e| {
            format!(
                "failed to send data to Kafka topic: {e}, brokers: {:?}",
                p.conf.bootstrap()
            )
        })
    }
}

/// CRC-32 (IEEE), as nginx's `ngx.crc32_short` that lua-resty-kafka's partitioner uses.
fn crc32(b: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(b);
    c.sum()
}

struct KafkaLogger {
    queue: Arc<Queue>,
    format: Option<Format>,
    origin: bool,
    include_req_body: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    c.sasl()?;
    let format = Format::resolve(c.log_format.as_ref(), env, NAME)?;
    let origin = c.meta_format == "origin";
    let include_req_body = c.include_req_body;
    let queue = env.shared.batches.queue(NAME, v, LABEL, env, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Box::new(KafkaSink {
            rt,
            producer: Producer {
                conf: c,
                client: None,
                partitions: Vec::new(),
                next: 0,
            },
        }))
    })?;
    Ok(Arc::new(KafkaLogger {
        queue,
        format,
        origin,
        include_req_body,
    }))
}

/// `meta_format: origin`: APISIX's `get_req_original`, the request line, the headers and (with
/// `include_req_body`) the body.
fn original(ctx: &Ctx<'_>, with_body: bool) -> String {
    let head = ctx.req.head;
    let mut s = String::with_capacity(256);
    s.push_str(head.method_str());
    s.push(' ');
    s.push_str(head.target_str());
    s.push_str(" HTTP/1.1\r\n");
    for (n, v) in head.headers_iter() {
        s.push_str(&String::from_utf8_lossy(n).to_ascii_lowercase());
        s.push_str(": ");
        s.push_str(&String::from_utf8_lossy(v));
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    if with_body {
        if let Some(b) = ctx.body {
            s.push_str(&String::from_utf8_lossy(b));
        }
    }
    s
}

impl Plugin for KafkaLogger {
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
        if self.origin {
            self.queue
                .push(Value::String(original(ctx, self.include_req_body)));
            return;
        }
        let mut e = entry(ctx, info, self.format.as_ref());
        if self.include_req_body {
            with_req_body(&mut e, ctx);
        }
        self.queue.push(e);
    }
}
