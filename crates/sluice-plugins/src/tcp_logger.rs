//! tcp-logger (priority 405, log): sends log entries over TCP (APISIX's apisix/plugins/tcp-logger.lua) through
//! the shared batch processor. Each batch opens a connection (`timeout` milliseconds for connect, handshake and
//! write), writes the entry alone when `batch_max_size` is 1, else a JSON array of the entries, and closes. With
//! `tls` the connection is TLS; `tls_options` is the server name sent (lua's `sslhandshake(true, tls_options,
//! false)`: SNI, certificate not verified).

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::batch_processor::{encode_batch, wrap_schema, Queue, Sink};
use crate::log_entry::{entry, with_req_body, Format};
use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "tcp-logger";
pub const PRIORITY: i32 = 405;
const LABEL: &str = "tcp logger";

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

/// The properties every socket logger shares (APISIX repeats them in each plugin's schema).
pub(crate) fn log_props() -> Value {
    let body_expr = json!({"type": "array", "minItems": 1, "items": {"type": "array"}});
    json!({
        "log_format": {"type": "object"},
        "log_format_extra": {"type": "object"},
        "include_req_body": {"type": "boolean", "default": false},
        "include_req_body_expr": body_expr,
        "include_resp_body": {"type": "boolean", "default": false},
        "include_resp_body_expr": body_expr,
        "max_req_body_bytes": {"type": "integer", "minimum": 1, "default": 524_288},
        "max_resp_body_bytes": {"type": "integer", "minimum": 1, "default": 524_288}
    })
}

/// `own` properties plus [`log_props`], `host` and `port` required, wrapped with the batch processor's.
pub(crate) fn socket_schema(own: Value, label: &str) -> Value {
    let mut props = log_props();
    if let (Some(p), Value::Object(own)) = (props.as_object_mut(), own) {
        p.extend(own);
    }
    wrap_schema(
        json!({"type": "object", "properties": props, "required": ["host", "port"]}),
        label,
    )
}

fn schema() -> Value {
    socket_schema(
        json!({
            "host": {"type": "string"},
            "port": {"type": "integer", "minimum": 0},
            "tls": {"type": "boolean", "default": false},
            "tls_options": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "default": 1000}
        }),
        LABEL,
    )
}

#[derive(Deserialize, Clone)]
struct Conf {
    host: String,
    port: u16,
    #[serde(default)]
    tls: bool,
    tls_options: Option<String>,
    #[serde(default = "thousand")]
    timeout: u64,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
}

fn thousand() -> u64 {
    1000
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    Format::compile(c.log_format.as_ref()).map(drop)
}

/// A connected stream, plain or TLS (certificate not verified, as APISIX's socket loggers).
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    /// Connects to `host:port` within `timeout` (each of connect, handshake and later writes); with `tls`, `sni`
    /// (or the host) is the server name sent.
    pub(crate) fn open(
        host: &str,
        port: u16,
        timeout: Duration,
        tls: bool,
        sni: Option<&str>,
    ) -> Result<Conn, String> {
        let mut last = format!("no address for {host}");
        for sa in (host, port).to_socket_addrs().map_err(|e| e.to_string())? {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(s) => {
                    s.set_write_timeout(Some(timeout))
                        .map_err(|e| e.to_string())?;
                    s.set_read_timeout(Some(timeout))
                        .map_err(|e| e.to_string())?;
                    let _ = s.set_nodelay(true);
                    if !tls {
                        return Ok(Conn::Plain(s));
                    }
                    let name = sni.unwrap_or(host);
                    let server = rustls::pki_types::ServerName::try_from(name.to_owned())
                        .map_err(|e| format!("bad server name {name}: {e}"))?;
                    let cc = rustls::ClientConnection::new(
                        crate::forward_auth::client::tls_config(false),
                        server,
                    )
                    .map_err(|e| e.to_string())?;
                    let mut t = rustls::StreamOwned::new(cc, s);
                    while t.conn.is_handshaking() {
                        t.conn
                            .complete_io(&mut t.sock)
                            .map_err(|e| format!("failed to perform TLS handshake: {e}"))?;
                    }
                    return Ok(Conn::Tls(Box::new(t)));
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }

    pub(crate) fn send(&mut self, data: &[u8]) -> Result<(), String> {
        let r = match self {
            Conn::Plain(s) => s.write_all(data).and_then(|()| s.flush()),
            Conn::Tls(t) => t.write_all(data).and_then(|()| t.flush()),
        };
        r.map_err(|e| e.to_string())
    }

    pub(crate) fn close(mut self) {
        if let Conn::Tls(t) = &mut self {
            t.conn.send_close_notify();
            let _ = t.conn.complete_io(&mut t.sock);
        }
    }
}

impl Sink for Conf {
    fn send(&mut self, entries: &[Value], batch_max_size: usize) -> Result<(), String> {
        let data = encode_batch(entries, batch_max_size);
        let where_ = || format!("host[{}] port[{}]", self.host, self.port);
        let mut c = Conn::open(
            &self.host,
            self.port,
            Duration::from_millis(self.timeout),
            self.tls,
            self.tls_options.as_deref(),
        )
        .map_err(|e| format!("failed to connect to TCP server: {} err: {e}", where_()))?;
        let r = c
            .send(data.as_bytes())
            .map_err(|e| format!("failed to send data to TCP server: {} err: {e}", where_()));
        c.close();
        r
    }
}

/// The log phase of the socket loggers: builds the entry and queues it.
pub(crate) struct SocketLogger {
    pub(crate) name: &'static str,
    pub(crate) priority: i32,
    pub(crate) queue: Arc<Queue>,
    pub(crate) format: Option<Format>,
    pub(crate) include_req_body: bool,
}

impl Plugin for SocketLogger {
    fn name(&self) -> &'static str {
        self.name
    }
    fn priority(&self) -> i32 {
        self.priority
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
