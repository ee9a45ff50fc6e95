//! http-logger (priority 410, log): sends log entries to `uri` (http://) in batches: a batch goes out when it
//! holds `batch_max_size` entries, when `inactive_timeout` seconds pass without a new entry, or when
//! `buffer_duration` seconds pass since its first entry (the shared [`crate::batch_processor`]). `concat_method`
//! `json` sends one object (a batch of one) or an array, `new_line` sends one entry per line. The log phase only
//! queues the entry (bounded; a full backlog drops it); the processor's thread posts with a plain HTTP/1.1 client
//! and retries `max_retry_count` times. https endpoints are refused for now.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::batch_processor::{wrap_schema, Queue, Sink};
use crate::log_entry::{entry, with_req_body, Format};
use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "http-logger";
pub const PRIORITY: i32 = 410;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &["auth_header"],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    wrap_schema(
        json!({
            "type": "object",
            "properties": {
                "uri": {"type": "string", "pattern": "^[^\\/]+:\\/\\/([\\da-zA-Z.-]+|\\[[\\da-fA-F:]+\\])(:\\d+)?"},
                "auth_header": {"type": "string"},
                "timeout": {"type": "integer", "minimum": 1, "default": 3},
                "log_format": {"type": "object"},
                "include_req_body": {"type": "boolean", "default": false},
                "include_resp_body": {"type": "boolean", "default": false},
                "include_resp_body_expr": {"type": "array", "minItems": 1, "items": {"type": "array"}},
                "concat_method": {"type": "string", "enum": ["json", "new_line"], "default": "json"},
                "ssl_verify": {"type": "boolean", "default": false}
            },
            "required": ["uri"]
        }),
        "http logger",
    )
}

#[derive(Deserialize, Clone)]
struct Conf {
    uri: String,
    auth_header: Option<String>,
    #[serde(default = "three")]
    timeout: u64,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
    #[serde(default = "json_method")]
    concat_method: String,
}

fn three() -> u64 {
    3
}
fn json_method() -> String {
    "json".into()
}

/// `http://host[:port]/path` -> (host:port, host header, path).
pub(crate) fn split_uri(uri: &str) -> Result<(String, String, String), String> {
    if !head_safe(uri, false) {
        return Err(format!(
            "invalid endpoint (spaces or control characters): {uri:?}"
        ));
    }
    let rest = uri
        .strip_prefix("http://")
        .ok_or_else(|| format!("only http:// endpoints are supported: {uri}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Ok((addr, authority.to_owned(), path.to_owned()))
}

/// Whether `v` can be written into a request head as it is: no control character (CR and LF would end the line
/// and let a configured value add headers or a whole request) and, unless `space`, no space or tab.
pub(crate) fn head_safe(v: &str, space: bool) -> bool {
    v.bytes()
        .all(|b| (space && b == b'\t') || !(b.is_ascii_control() || (!space && b == b' ')))
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    split_uri(&c.uri)?;
    if c.auth_header
        .as_deref()
        .is_some_and(|a| !head_safe(a, true))
    {
        return Err("property \"auth_header\" must not contain control characters".into());
    }
    Format::compile(c.log_format.as_ref()).map(drop)
}

impl Sink for Conf {
    fn send(&mut self, entries: &[Value], _: usize) -> Result<(), String> {
        send(self, entries)
    }
}

fn send(c: &Conf, batch: &[Value]) -> Result<(), String> {
    let (body, ctype) = if c.concat_method == "new_line" {
        let lines: Vec<String> = batch.iter().map(Value::to_string).collect();
        (lines.join("\n"), "text/plain")
    } else if batch.len() == 1 {
        (batch[0].to_string(), "application/json")
    } else {
        (Value::Array(batch.to_vec()).to_string(), "application/json")
    };
    let mut headers = vec![("Content-Type", ctype)];
    if let Some(a) = &c.auth_header {
        headers.push(("Authorization", a));
    }
    let status = post(
        &c.uri,
        &headers,
        body.as_bytes(),
        Duration::from_secs(c.timeout),
    )?;
    if !(200..300).contains(&status) {
        return Err(format!("server returned status {status}"));
    }
    Ok(())
}

/// POSTs `body` to `uri` (http:// only) on a fresh connection with `headers` (each within `timeout`), and
/// returns the answer's status. Shared by the loggers that speak HTTP.
pub(crate) fn post(
    uri: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<u16, String> {
    let (addr, host, path) = split_uri(uri)?;
    // Checked here, where every HTTP logger's headers are written, before anything is sent.
    if let Some((n, _)) = headers.iter().find(|(n, v)| {
        n.is_empty() || n.contains(':') || !head_safe(n, false) || !head_safe(v, true)
    }) {
        return Err(format!(
            "header {n:?}: characters that cannot go in a request head"
        ));
    }
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (n, v) in headers {
        req.push_str(n);
        req.push_str(": ");
        req.push_str(v);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    s.write_all(body).map_err(|e| e.to_string())?;
    let mut head = [0u8; 32];
    let n = s.read(&mut head).map_err(|e| e.to_string())?;
    Ok(std::str::from_utf8(&head[..n])
        .ok()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0))
}

struct HttpLogger {
    queue: Arc<Queue>,
    format: Option<Format>,
    include_req_body: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    split_uri(&c.uri)?;
    Ok(Arc::new(HttpLogger {
        queue: env
            .shared
            .batches
            .queue(NAME, v, "http logger", env, || Ok(Box::new(c.clone())))?,
        format: Format::resolve(c.log_format.as_ref(), env, NAME)?,
        include_req_body: c.include_req_body,
    }))
}

impl Plugin for HttpLogger {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injected_head_lines_are_refused_and_nothing_is_sent() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let uri = format!("http://{}/x", l.local_addr().unwrap());
        for (n, v) in [
            ("Authorization", "a\r\nX-Evil: 1"),
            ("Authorization", "a\nb"),
            ("X-A\r\nB", "v"),
            ("X:Y", "v"),
            ("X Y", "v"),
            ("", "v"),
        ] {
            let r = post(&uri, &[(n, v)], b"{}", Duration::from_secs(1));
            assert!(r.is_err(), "{n:?}: {v:?} was sent");
        }
        assert!(l.accept().is_err(), "a connection was made");
        assert!(split_uri("http://127.0.0.1:1/ HTTP/1.1\r\nX-Evil: 1").is_err());
        assert!(split_uri("http://127.0.0.1:1/a b").is_err());
        assert!(
            check(&json!({"uri": "http://127.0.0.1:1/", "auth_header": "a\r\nX-Evil: 1"})).is_err()
        );
        assert!(check(&json!({"uri": "http://127.0.0.1:1/", "auth_header": "Basic\tx y"})).is_ok());
    }
}
