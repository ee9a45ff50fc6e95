//! syslog (priority 401, log): sends log entries to a syslog server (APISIX's apisix/plugins/syslog.lua and
//! syslog/init.lua) through the shared batch processor. Each entry is an RFC 5424 line built in the log phase,
//! `<46>1 {UTC time, ms} {request host} apisix {pid} - - {JSON entry}\n` (facility SYSLOG, severity INFO, as
//! APISIX's `rfc5424.encode`); a batch is the lines concatenated, written on one connection kept open between
//! batches (`sock_type` tcp, optionally `tls`, or udp: one datagram per batch) and opened again after a failure.
//! `timeout` is in milliseconds. `flush_limit`, `drop_limit` and `pool_size` (lua-resty-logger-socket's own
//! buffer and pool) are accepted and checked; here each batch is written when the batch processor sends it.

use std::net::{ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use sluice_router::Var;

use crate::batch_processor::{Queue, Sink};
use crate::log_entry::{entry, with_req_body, Format};
use crate::registry::Entry;
use crate::tcp_logger::{socket_schema, Conn};
use crate::util::parse;
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "syslog";
pub const PRIORITY: i32 = 401;
const LABEL: &str = "sys logger";

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
    socket_schema(
        json!({
            "host": {"type": "string"},
            "port": {"type": "integer"},
            "flush_limit": {"type": "integer", "minimum": 1, "default": 4096},
            "drop_limit": {"type": "integer", "default": 1_048_576},
            "timeout": {"type": "integer", "minimum": 1, "default": 3000},
            "sock_type": {"type": "string", "default": "tcp", "enum": ["tcp", "udp"]},
            "pool_size": {"type": "integer", "minimum": 5, "default": 5},
            "tls": {"type": "boolean", "default": false}
        }),
        LABEL,
    )
}

#[derive(Deserialize, Clone)]
struct Conf {
    host: String,
    port: u16,
    #[serde(default = "three_thousand")]
    timeout: u64,
    #[serde(default = "tcp")]
    sock_type: String,
    #[serde(default)]
    tls: bool,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
}

fn three_thousand() -> u64 {
    3000
}
fn tcp() -> String {
    "tcp".into()
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    Format::compile(c.log_format.as_ref()).map(drop)
}

struct SyslogSink {
    conf: Conf,
    tcp: Option<Conn>,
}

impl SyslogSink {
    fn write(&mut self, data: &[u8]) -> Result<(), String> {
        let c = &self.conf;
        let timeout = Duration::from_millis(c.timeout);
        if c.sock_type == "udp" {
            let sa = (c.host.as_str(), c.port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or("no address")?;
            let s = UdpSocket::bind(if sa.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
                .map_err(|e| e.to_string())?;
            let _ = s.set_write_timeout(Some(timeout));
            return s.send_to(data, sa).map(drop).map_err(|e| e.to_string());
        }
        if self.tcp.is_none() {
            self.tcp = Some(Conn::open(&c.host, c.port, timeout, c.tls, None)?);
        }
        let r = self.tcp.as_mut().ok_or("no connection")?.send(data);
        if r.is_err() {
            self.tcp = None;
        }
        r
    }
}

impl Sink for SyslogSink {
    fn send(&mut self, entries: &[Value], _: usize) -> Result<(), String> {
        let mut data = String::with_capacity(entries.len() * 512);
        for e in entries {
            if let Value::String(line) = e {
                data.push_str(line);
            }
        }
        self.write(data.as_bytes())
            .map_err(|e| format!("failed to log message: {e}"))
    }
}

struct Syslog {
    queue: Arc<Queue>,
    format: Option<Format>,
    include_req_body: bool,
    host: Var,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let format = Format::resolve(c.log_format.as_ref(), env, NAME)?;
    let include_req_body = c.include_req_body;
    let queue = env.shared.batches.queue(NAME, v, LABEL, env, || {
        Ok(Box::new(SyslogSink { conf: c, tcp: None }))
    })?;
    Ok(Arc::new(Syslog {
        queue,
        format,
        include_req_body,
        host: Var::parse("host"),
    }))
}

/// APISIX's `rfc5424.encode("SYSLOG", "INFO", host, "apisix", pid, msg)`: PRI 5 * 8 + 6.
fn rfc5424(host: &str, msg: &str) -> String {
    let t = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
    let host = if host.is_empty() { "-" } else { host };
    format!("<46>1 {t} {host} apisix {} - - {msg}\n", std::process::id())
}

impl Plugin for Syslog {
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
        let host = ctx.var(&self.host);
        let line = rfc5424(host.as_deref().unwrap_or(""), &e.to_string());
        self.queue.push(Value::String(line));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc5424_line() {
        let l = super::rfc5424("example.com", r#"{"a":1}"#);
        let pid = std::process::id();
        assert!(l.starts_with("<46>1 20"), "{l}");
        assert!(
            l.ends_with(&format!("Z example.com apisix {pid} - - {{\"a\":1}}\n")),
            "{l}"
        );
        assert!(super::rfc5424("", "m").contains("Z - apisix"));
    }
}
