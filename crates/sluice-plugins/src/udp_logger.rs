//! udp-logger (priority 400, log): sends log entries as UDP datagrams (APISIX's apisix/plugins/udp-logger.lua)
//! through the shared batch processor: one datagram per batch, the entry alone when `batch_max_size` is 1, else a
//! JSON array of the entries (a batch over the datagram limit fails, as in APISIX; keep batches small).

use std::net::{ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::batch_processor::{encode_batch, Sink};
use crate::log_entry::Format;
use crate::registry::Entry;
use crate::tcp_logger::{socket_schema, SocketLogger};
use crate::util::parse;
use crate::{CompileEnv, Plugin};

pub const NAME: &str = "udp-logger";
pub const PRIORITY: i32 = 400;
const LABEL: &str = "udp logger";

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
            "port": {"type": "integer", "minimum": 0},
            "timeout": {"type": "integer", "minimum": 1, "default": 3}
        }),
        LABEL,
    )
}

#[derive(Deserialize, Clone)]
struct Conf {
    host: String,
    port: u16,
    #[serde(default = "three")]
    timeout: u64,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
}

fn three() -> u64 {
    3
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    Format::compile(c.log_format.as_ref()).map(drop)
}

impl Sink for Conf {
    fn send(&mut self, entries: &[Value], batch_max_size: usize) -> Result<(), String> {
        let data = encode_batch(entries, batch_max_size);
        let where_ = format!("host[{}] port[{}]", self.host, self.port);
        let sa = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("failed to connect to UDP server: {where_} err: no address"))?;
        let bind = if sa.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let s = UdpSocket::bind(bind)
            .and_then(|s| s.connect(sa).map(|()| s))
            .map_err(|e| format!("failed to connect to UDP server: {where_} err: {e}"))?;
        let _ = s.set_write_timeout(Some(Duration::from_secs(self.timeout)));
        s.send(data.as_bytes())
            .map(drop)
            .map_err(|e| format!("failed to send data to UDP server: {where_} err:{e}"))
    }
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let format = Format::resolve(c.log_format.as_ref(), env, NAME)?;
    let include_req_body = c.include_req_body;
    Ok(Arc::new(SocketLogger {
        name: NAME,
        priority: PRIORITY,
        queue: env
            .shared
            .batches
            .queue(NAME, v, LABEL, env, || Ok(Box::new(c)))?,
        format,
        include_req_body,
    }))
}
