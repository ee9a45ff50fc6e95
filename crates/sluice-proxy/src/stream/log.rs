//! The stream access log (APISIX's `nginx_config.stream`: `enable_access_log`, `access_log`,
//! `access_log_format`), one line per TCP connection that matched a stream route, written when it ends. It shares
//! the HTTP access log's machinery (a per-worker buffer handed to a writer thread, never a lock or a file write on
//! a worker); the format has nginx stream's variables.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use sluice_model::NodeConfig;

use crate::access_log::{AccessLogConfig, Escape, Format, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    RemoteAddr,
    RemotePort,
    ServerAddr,
    ServerPort,
    Protocol,
    Status,
    BytesSent,
    BytesReceived,
    SessionTime,
    UpstreamAddr,
    TimeLocal,
    Msec,
    Pid,
}

const KNOWN: &str =
    "remote_addr remote_port server_addr server_port protocol status bytes_sent bytes_received \
session_time upstream_addr time_local msec pid";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Lit(Box<str>),
    Var(Var),
}

/// A compiled stream `log_format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFormat {
    segs: Box<[Seg]>,
}

/// One finished stream connection.
pub(crate) struct Session {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// nginx stream's `$status`: 200, 403 (refused by a plugin), 502 (no upstream reached), 503 (limit-conn).
    pub status: u16,
    /// To the client, from the client.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub time: Duration,
    pub upstream: Option<SocketAddr>,
}

impl StreamFormat {
    /// Compiles `fmt`; an unknown `$variable` is refused (nginx refuses to start).
    pub fn compile(fmt: &str) -> Result<StreamFormat, String> {
        let mut segs = Vec::new();
        let mut rest = fmt;
        while let Some(i) = rest.find('$') {
            if i > 0 {
                segs.push(Seg::Lit(rest[..i].into()));
            }
            let after = &rest[i + 1..];
            let (name, next) = match after.strip_prefix('{') {
                Some(b) => {
                    let close = b
                        .find('}')
                        .ok_or("stream access_log_format: unclosed \"${\"")?;
                    (&b[..close], &b[close + 1..])
                }
                None => {
                    let n = after
                        .bytes()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
                        .count();
                    (&after[..n], &after[n..])
                }
            };
            let v = match name {
                "remote_addr" => Var::RemoteAddr,
                "remote_port" => Var::RemotePort,
                "server_addr" => Var::ServerAddr,
                "server_port" => Var::ServerPort,
                "protocol" => Var::Protocol,
                "status" => Var::Status,
                "bytes_sent" => Var::BytesSent,
                "bytes_received" => Var::BytesReceived,
                "session_time" => Var::SessionTime,
                "upstream_addr" => Var::UpstreamAddr,
                "time_local" => Var::TimeLocal,
                "msec" => Var::Msec,
                "pid" => Var::Pid,
                _ => {
                    return Err(format!(
                        "nginx_config.stream.access_log_format: unknown variable \"${name}\" (known: {KNOWN})"
                    ))
                }
            };
            segs.push(Seg::Var(v));
            rest = next;
        }
        if !rest.is_empty() {
            segs.push(Seg::Lit(rest.into()));
        }
        Ok(StreamFormat { segs: segs.into() })
    }

    /// Appends one line (with its newline).
    pub(crate) fn render(&self, s: &Session, out: &mut Vec<u8>) {
        use std::io::Write;
        for seg in self.segs.iter() {
            let _ = match seg {
                Seg::Lit(l) => {
                    out.extend_from_slice(l.as_bytes());
                    Ok(())
                }
                Seg::Var(Var::RemoteAddr) => write!(out, "{}", super::canonical(s.peer.ip())),
                Seg::Var(Var::RemotePort) => write!(out, "{}", s.peer.port()),
                Seg::Var(Var::ServerAddr) => write!(out, "{}", super::canonical(s.local.ip())),
                Seg::Var(Var::ServerPort) => write!(out, "{}", s.local.port()),
                Seg::Var(Var::Protocol) => write!(out, "TCP"),
                Seg::Var(Var::Status) => write!(out, "{}", s.status),
                Seg::Var(Var::BytesSent) => write!(out, "{}", s.bytes_sent),
                Seg::Var(Var::BytesReceived) => write!(out, "{}", s.bytes_received),
                Seg::Var(Var::SessionTime) => write!(out, "{:.3}", s.time.as_secs_f64()),
                Seg::Var(Var::UpstreamAddr) => match s.upstream {
                    Some(a) => write!(out, "{a}"),
                    None => write!(out, "-"),
                },
                Seg::Var(Var::TimeLocal) => {
                    crate::access_log::time_local(out);
                    Ok(())
                }
                Seg::Var(Var::Msec) => {
                    let t = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    write!(out, "{}.{:03}", t.as_secs(), t.subsec_millis())
                }
                Seg::Var(Var::Pid) => write!(out, "{}", std::process::id()),
            };
        }
        out.push(b'\n');
    }
}

/// `nginx_config.stream` of config.yaml: the writer's configuration and the compiled format; `None` when
/// `enable_access_log` is false (APISIX's default) or the path is `off`.
pub fn stream_access_log(
    n: &NodeConfig,
    prefix: &Path,
) -> Result<Option<(AccessLogConfig, StreamFormat)>, String> {
    let s = &n.nginx_config.stream;
    if !s.enable_access_log {
        return Ok(None);
    }
    let format = StreamFormat::compile(&s.access_log_format)?;
    // Every variable is a number, an address or a fixed word: nothing to escape.
    Escape::parse(&s.access_log_format_escape)?;
    let target = match s.access_log.as_str() {
        "" => return Err("nginx_config.stream.access_log: empty path".into()),
        "off" => return Ok(None),
        "/dev/stdout" | "stdout" => Target::Stdout,
        "/dev/stderr" | "stderr" => Target::Stderr,
        p => Target::File(prefix.join(p)),
    };
    let cfg = AccessLogConfig {
        // Lines are rendered by `StreamFormat`; the writer only moves bytes.
        format: Format::compile("", Escape::Default)?,
        targets: vec![target],
        buffer: 16384,
    };
    Ok(Some((cfg, format)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apisix_s_default_format() {
        let f = StreamFormat::compile(sluice_model::DEFAULT_STREAM_ACCESS_LOG_FORMAT).unwrap();
        let s = Session {
            peer: "[::ffff:203.0.113.7]:40000".parse().unwrap(),
            local: "127.0.0.1:9100".parse().unwrap(),
            status: 200,
            bytes_sent: 12,
            bytes_received: 34,
            time: Duration::from_millis(1500),
            upstream: Some("127.0.0.1:1980".parse().unwrap()),
        };
        let mut out = Vec::new();
        f.render(&s, &mut out);
        let line = String::from_utf8(out).unwrap();
        let (head, tail) = line.split_once(" [").unwrap();
        assert_eq!(head, "203.0.113.7");
        assert!(tail.ends_with("] TCP 200 12 34 1.500\n"), "{line}");
        let f =
            StreamFormat::compile("${server_addr}:$server_port $upstream_addr $status").unwrap();
        let mut out = Vec::new();
        f.render(
            &Session {
                upstream: None,
                status: 502,
                ..s
            },
            &mut out,
        );
        assert_eq!(out, b"127.0.0.1:9100 - 502\n");
        assert!(StreamFormat::compile("$request").is_err());
        assert!(StreamFormat::compile("${status").is_err());
    }
}
