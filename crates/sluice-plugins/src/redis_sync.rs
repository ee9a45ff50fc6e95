//! The Redis plumbing of the limit plugins' `redis` / `redis-cluster` policies (and limit-count's
//! `redis-sentinel`): the policy fields of their
//! configurations ([`RedisConf`]) and blocking connections ([`Conn`]) for the backends' threads
//! ([`crate::redis_lease`]). Not here: each plugin's Lua script and counter maths.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

/// Where the counters live.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Backend {
    Single {
        url: String,
    },
    Cluster {
        urls: Vec<String>,
    },
    /// The master (or a replica) that the first answering sentinel names, asked again on every reconnect.
    Sentinel(Sentinel),
}

/// limit-count's `redis-sentinel` policy, as APISIX's lua-resty-redis-connector setup.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Sentinel {
    /// `redis://[user:password@]host:port` of each sentinel.
    sentinels: Vec<String>,
    master_name: String,
    replica: bool,
    /// `redis[s]://[user:password@]` to which the named `host:port/db` is appended.
    prefix: String,
    database: u32,
    read_timeout_ms: u64,
}

#[derive(Deserialize)]
pub(crate) struct SentinelAddr {
    host: String,
    port: u16,
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
    #[serde(default)]
    redis_sentinels: Vec<SentinelAddr>,
    redis_master_name: Option<String>,
    redis_role: Option<String>,
    #[serde(default = "ms1000")]
    redis_connect_timeout: u64,
    #[serde(default = "ms1000")]
    redis_read_timeout: u64,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
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

/// [`with_redis_schema`] plus APISIX's `redis-sentinel` policy and its fields (limit-count only, as APISIX).
pub(crate) fn with_sentinel_schema(schema: Value) -> Value {
    let mut schema = with_redis_schema(schema);
    let sentinel = json!({
        "policy": {"type": "string", "enum": ["local", "redis", "redis-cluster", "redis-sentinel"],
                   "default": "local"},
        "redis_sentinels": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {
                "host": {"type": "string", "minLength": 2},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535}
            },
            "required": ["host", "port"],
            "additionalProperties": false
        }},
        "redis_master_name": {"type": "string", "minLength": 1},
        "redis_role": {"type": "string", "enum": ["master", "slave"], "default": "master"},
        "redis_connect_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_read_timeout": {"type": "integer", "minimum": 1, "default": 1000},
        "redis_keepalive_timeout": {"type": "integer", "minimum": 1, "default": 60000},
        "sentinel_username": {"type": "string", "minLength": 1},
        "sentinel_password": {"type": "string", "minLength": 0}
    });
    if let (Some(props), Value::Object(sentinel)) = (
        schema.get_mut("properties").and_then(Value::as_object_mut),
        sentinel,
    ) {
        props.extend(sentinel);
    }
    schema
}

/// `user:password@`, `:password@` or nothing.
fn userinfo(user: Option<&str>, password: Option<&str>) -> String {
    match (user, password) {
        (Some(u), Some(p)) => format!("{u}:{p}@"),
        (Some(u), None) => format!("{u}@"),
        (None, Some(p)) if !p.is_empty() => format!(":{p}@"),
        _ => String::new(),
    }
}

impl RedisConf {
    pub(crate) fn timeout_ms(&self) -> u64 {
        if self.policy == "redis-sentinel" {
            return self.redis_connect_timeout + self.redis_read_timeout;
        }
        self.redis_timeout
    }

    /// The backend to sync with and how to reach it; `None` for policy `local`.
    pub(crate) fn connect(&self) -> Result<Option<Connect>, String> {
        let auth = match (&self.redis_username, &self.redis_password) {
            (Some(_), None) => String::new(),
            (u, p) => userinfo(u.as_deref(), p.as_deref()),
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
            "redis-sentinel" => {
                if self.redis_sentinels.is_empty() {
                    return Err("property \"redis_sentinels\" is required".into());
                }
                let master_name = self
                    .redis_master_name
                    .clone()
                    .ok_or("property \"redis_master_name\" is required")?;
                let sauth = userinfo(
                    self.sentinel_username.as_deref(),
                    self.sentinel_password.as_deref(),
                );
                Backend::Sentinel(Sentinel {
                    sentinels: self
                        .redis_sentinels
                        .iter()
                        .map(|a| format!("redis://{sauth}{}:{}", a.host, a.port))
                        .collect(),
                    master_name,
                    replica: self.redis_role.as_deref() == Some("slave"),
                    prefix: format!("{scheme}://{auth}"),
                    database: self.redis_database,
                    read_timeout_ms: self.redis_read_timeout,
                })
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
        let timeout = match backend {
            Backend::Sentinel(_) => self.redis_connect_timeout,
            _ => self.redis_timeout,
        };
        Ok(Some(Connect {
            backend,
            password: self.redis_password.clone().filter(|p| !p.is_empty()),
            timeout: Duration::from_millis(timeout),
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
            Backend::Single { url } => Ok(Conn::Single(single(url, timeout, timeout)?)),
            Backend::Sentinel(s) => {
                let mut last = None;
                for sentinel in &s.sentinels {
                    match s.resolve(sentinel, timeout) {
                        Ok(con) => return Ok(Conn::Single(con)),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::ClientError, "no sentinel"))
                }))
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

/// A blocking connection to `url` with the connect and the read/write timeouts.
fn single(url: &str, connect: Duration, rw: Duration) -> redis::RedisResult<redis::Connection> {
    let c = redis::Client::open(url)?;
    let con = c.get_connection_with_timeout(connect)?;
    con.set_read_timeout(Some(rw))?;
    con.set_write_timeout(Some(rw))?;
    Ok(con)
}

impl Sentinel {
    /// Asks one sentinel where the master (or a healthy replica) is and connects there; the node must then say
    /// it holds that role (`ROLE`), so a demoted master is never written to after a failover.
    fn resolve(&self, sentinel: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let mut s = single(sentinel, timeout, timeout)?;
        let addr = if self.replica {
            let replicas: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(&self.master_name)
                .query(&mut s)?;
            replicas
                .into_iter()
                .find(|r| {
                    r.get("flags").is_some_and(|f| {
                        !f.contains("s_down")
                            && !f.contains("o_down")
                            && !f.contains("disconnected")
                    })
                })
                .and_then(|r| Some((r.get("ip")?.clone(), r.get("port")?.parse::<u16>().ok()?)))
        } else {
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.master_name)
                .query::<Option<(String, u16)>>(&mut s)?
        };
        let (host, port) = addr.ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::ClientError,
                "sentinel knows no such master or no healthy replica",
            ))
        })?;
        let url = format!("{}{host}:{port}/{}", self.prefix, self.database);
        let mut con = single(&url, timeout, Duration::from_millis(self.read_timeout_ms))?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut con)?;
        let want: &[u8] = if self.replica { b"slave" } else { b"master" };
        match role.first() {
            Some(redis::Value::BulkString(r)) if r.as_slice() == want => Ok(con),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::ClientError,
                "the node the sentinel named does not hold the role asked for",
            ))),
        }
    }
}

/// How to reach a backend.
pub(crate) struct Connect {
    pub backend: Backend,
    pub password: Option<String>,
    pub timeout: Duration,
}
