//! The Redis plumbing of the limit plugins' `redis` / `redis-cluster` policies: the policy fields of their
//! configurations ([`RedisConf`]) and blocking connections ([`Conn`]) for the backends' threads
//! ([`crate::redis_lease`]). Not here: each plugin's Lua script and counter maths.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

/// Where the counters live.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Backend {
    Single { url: String },
    Cluster { urls: Vec<String> },
}

/// The Redis fields of limit-count's and limit-req's configurations, named and defaulted as APISIX's.
#[derive(Deserialize)]
pub(crate) struct RedisConf {
    #[serde(default = "local")]
    policy: String,
    redis_host: Option<String>,
    #[serde(default = "port")]
    redis_port: u16,
    redis_username: Option<String>,
    redis_password: Option<String>,
    #[serde(default)]
    redis_database: u32,
    #[serde(default = "ms1000")]
    redis_timeout: u64,
    #[serde(default)]
    redis_ssl: bool,
    #[serde(default)]
    redis_cluster_nodes: Vec<String>,
}

fn local() -> String {
    "local".into()
}
fn port() -> u16 {
    6379
}
fn ms1000() -> u64 {
    1000
}

/// Adds the schema properties of [`RedisConf`] (and `allow_degradation`) to a plugin's object schema.
pub(crate) fn with_redis_schema(mut schema: Value) -> Value {
    let redis = json!({
        "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster"], "default": "local"},
        "allow_degradation": {"type": "boolean", "default": false},
        "redis_host": {"type": "string", "minLength": 2},
        "redis_port": {"type": "integer", "minimum": 1, "default": 6379},
        "redis_username": {"type": "string", "minLength": 1},
        "redis_password": {"type": "string", "minLength": 0},
        "redis_database": {"type": "integer", "minimum": 0, "default": 0},
        "redis_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_ssl": {"type": "boolean", "default": false},
        "redis_cluster_nodes": {"type": "array", "minItems": 1,
                                "items": {"type": "string", "minLength": 2, "maxLength": 100}},
        "redis_cluster_name": {"type": "string"}
    });
    if let (Some(props), Value::Object(redis)) = (
        schema.get_mut("properties").and_then(Value::as_object_mut),
        redis,
    ) {
        props.extend(redis);
    }
    schema
}

impl RedisConf {
    pub(crate) fn timeout_ms(&self) -> u64 {
        self.redis_timeout
    }

    /// The backend to sync with and how to reach it; `None` for policy `local`.
    pub(crate) fn connect(&self) -> Result<Option<Connect>, String> {
        let auth = match (&self.redis_username, &self.redis_password) {
            (Some(u), Some(p)) => format!("{u}:{p}@"),
            (None, Some(p)) if !p.is_empty() => format!(":{p}@"),
            _ => String::new(),
        };
        let scheme = if self.redis_ssl { "rediss" } else { "redis" };
        let backend = match self.policy.as_str() {
            "local" => return Ok(None),
            "redis" => {
                let host = self
                    .redis_host
                    .as_deref()
                    .ok_or("property \"redis_host\" is required")?;
                Backend::Single {
                    url: format!(
                        "{scheme}://{auth}{host}:{}/{}",
                        self.redis_port, self.redis_database
                    ),
                }
            }
            _ => {
                if self.redis_cluster_nodes.len() < 2 {
                    return Err("property \"redis_cluster_nodes\" needs at least 2 nodes".into());
                }
                Backend::Cluster {
                    urls: self
                        .redis_cluster_nodes
                        .iter()
                        .map(|n| format!("{scheme}://{n}"))
                        .collect(),
                }
            }
        };
        Ok(Some(Connect {
            backend,
            password: self.redis_password.clone().filter(|p| !p.is_empty()),
            timeout: Duration::from_millis(self.redis_timeout),
        }))
    }
}

/// A 64-bit FNV-1a: the same on every node (unlike the per-process seeded hashes), so every node names a
/// configuration's Redis keys alike.
pub(crate) fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A blocking connection to one Redis or a Redis Cluster (the backends' threads only).
pub(crate) enum Conn {
    Single(redis::Connection),
    Cluster(redis::cluster::ClusterConnection),
}

impl Conn {
    pub(crate) fn open(
        b: &Backend,
        timeout: Duration,
        password: Option<&str>,
    ) -> redis::RedisResult<Conn> {
        match b {
            Backend::Single { url } => {
                let c = redis::Client::open(url.as_str())?;
                let con = c.get_connection_with_timeout(timeout)?;
                con.set_read_timeout(Some(timeout))?;
                con.set_write_timeout(Some(timeout))?;
                Ok(Conn::Single(con))
            }
            Backend::Cluster { urls } => {
                let mut builder = redis::cluster::ClusterClientBuilder::new(urls.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout);
                if let Some(p) = password {
                    builder = builder.password(p.to_owned());
                }
                Ok(Conn::Cluster(builder.build()?.get_connection()?))
            }
        }
    }

    /// Sends a pipeline (single Redis only; a cluster answers an error).
    pub(crate) fn query_pipe(
        &mut self,
        p: &redis::Pipeline,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            Conn::Single(c) => p.query(c),
            Conn::Cluster(_) => Err(redis::RedisError::from((
                redis::ErrorKind::ClientError,
                "pipelines are sent to a single Redis only",
            ))),
        }
    }

    pub(crate) fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(c),
        }
    }
}

/// How to reach a backend.
pub(crate) struct Connect {
    pub backend: Backend,
    pub password: Option<String>,
    pub timeout: Duration,
}
