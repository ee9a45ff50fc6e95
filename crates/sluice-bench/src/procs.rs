//! Child processes the suite starts (mock, gateway, nginx, HAProxy, valgrind): spawning with
//! optional CPU pinning (`taskset -c`), logs to a file, readiness polling with a bound, and a
//! clean stop (SIGTERM via `kill`, then SIGKILL) when dropped so no run leaves strays behind.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running child process, stopped on drop.
pub struct Proc {
    pub name: String,
    child: Child,
    log: std::path::PathBuf,
}

impl Proc {
    /// Starts `argv`, pinned to `pin` CPUs when given, with stdout+stderr appended to `log`.
    pub fn spawn(
        name: &str,
        argv: &[String],
        pin: Option<&str>,
        log: &Path,
    ) -> Result<Proc, String> {
        let (prog, args) = argv.split_first().ok_or("empty command")?;
        let mut cmd = match pin {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(prog);
                c
            }
            None => Command::new(prog),
        };
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .map_err(|e| format!("start {name} ({prog}): {e}"))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(reason)` once the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(st)) => {
                // The last log line usually says why (unknown subcommand, bad config, port in use).
                let text = std::fs::read_to_string(&self.log).unwrap_or_default();
                let last = text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim();
                let last: String = last.chars().take(160).collect();
                Some(format!("{} exited ({st}): {last}", self.name))
            }
            Ok(None) => None,
            Err(e) => Some(format!("{}: {e}", self.name)),
        }
    }

    /// SIGTERM, up to 3 s grace, then SIGKILL.
    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago (for children that must be told a number).
pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// One blocking `GET` with `Connection: close`; returns the status code.
pub fn probe(addr: SocketAddr, path: &str, headers: &[(String, String)]) -> Result<u16, String> {
    probe_head(addr, path, headers).map(|(code, _)| code)
}

/// One blocking `GET` with `Connection: close`; returns the status code and the response head
/// (lower-cased, for header checks).
pub fn probe_head(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read until the end of the head (bounded to 16 KiB) or EOF.
    while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let r = s
            .read(&mut chunk)
            .map_err(|e| format!("read {addr}: {e}"))?;
        if r == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..r]);
    }
    let code = std::str::from_utf8(head.get(9..12).ok_or("short response")?)
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line from {addr}"))?;
    Ok((code, String::from_utf8_lossy(&head).to_ascii_lowercase()))
}

/// What one h2c exchange got back: status, head, body and trailers.
pub struct H2Answer {
    pub status: u16,
    pub head: http::HeaderMap,
    pub body: Vec<u8>,
    pub trailers: Option<http::HeaderMap>,
}

/// One h2c (prior knowledge) request on a fresh connection, the whole answer read, within `limit`.
pub fn h2c_exchange<'a>(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: Option<Vec<u8>>,
    limit: Duration,
) -> Result<H2Answer, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut b = http::Request::builder()
        .method(method.clone())
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(k, v);
    }
    let req = b.body(()).map_err(|e| e.to_string())?;
    rt.block_on(async {
        let fut = async {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect {addr}: {e}"))?;
            let (send, conn) = h2::client::handshake(tcp)
                .await
                .map_err(|e| format!("h2c handshake: {e}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut send = send.ready().await.map_err(|e| e.to_string())?;
            let (resp, mut stream) = send
                .send_request(req, body.is_none())
                .map_err(|e| e.to_string())?;
            if let Some(body) = body {
                stream
                    .send_data(bytes::Bytes::from(body), true)
                    .map_err(|e| e.to_string())?;
            }
            let resp = resp.await.map_err(|e| e.to_string())?;
            let (parts, mut rb) = resp.into_parts();
            let mut out = Vec::new();
            while let Some(d) = rb.data().await {
                let d = d.map_err(|e| e.to_string())?;
                let _ = rb.flow_control().release_capacity(d.len());
                out.extend_from_slice(&d);
            }
            let trailers = rb.trailers().await.map_err(|e| e.to_string())?;
            Ok::<H2Answer, String>(H2Answer {
                status: parts.status.as_u16(),
                head: parts.headers,
                body: out,
                trailers,
            })
        };
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| format!("h2c {method} {path} timed out"))?
    })
}

/// One h2c (prior knowledge) `GET`; returns the status code.
pub fn probe_h2c(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
) -> Result<u16, String> {
    let headers = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    h2c_exchange(
        addr,
        http::Method::GET,
        path,
        headers,
        None,
        Duration::from_secs(3),
    )
    .map(|a| a.status)
}

/// Polls `path` until it answers 200, the process exits, or `limit` passes. Err carries the last
/// status or error seen.
pub fn wait_ready(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    mut proc: Option<&mut Proc>,
    limit: Duration,
    h2c: bool,
) -> Result<(), ReadyError> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(p) = proc.as_deref_mut() {
            if let Some(why) = p.exited() {
                return Err(ReadyError::Exited(why));
            }
        }
        let answer = if h2c {
            probe_h2c(addr, path, headers)
        } else {
            probe(addr, path, headers)
        };
        let last = match answer {
            Ok(200) => return Ok(()),
            Ok(code) => ReadyError::Status(code),
            Err(e) => ReadyError::Error(e),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Why a target never became ready.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadyError {
    Exited(String),
    Status(u16),
    Error(String),
}

impl std::fmt::Display for ReadyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadyError::Exited(w) => write!(f, "{w}"),
            ReadyError::Status(c) => write!(f, "answered {c}"),
            ReadyError::Error(e) => write!(f, "{e}"),
        }
    }
}

/// Whether `prog` is on PATH.
pub fn installed(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_and_ready_against_the_mock() {
        let addr = crate::loadgen::tests::mock(sluice_mock::Delay::Fixed(Duration::ZERO), 200);
        assert_eq!(probe(addr, "/status/404", &[]), Ok(404));
        let (code, head) = probe_head(addr, "/", &[]).expect("head");
        assert_eq!(code, 200);
        assert!(head.contains("server: sluice-mock\r\n"), "{head}");
        assert_eq!(
            wait_ready(addr, "/", &[], None, Duration::from_secs(2), false),
            Ok(())
        );
        assert_eq!(
            wait_ready(
                addr,
                "/status/500",
                &[],
                None,
                Duration::from_millis(200),
                false
            ),
            Err(ReadyError::Status(500))
        );
    }

    #[test]
    fn h2c_probe_against_the_mock() {
        let addr = crate::loadgen::tests::mock(sluice_mock::Delay::Fixed(Duration::ZERO), 200);
        assert_eq!(probe_h2c(addr, "/", &[]), Ok(200));
        assert_eq!(probe_h2c(addr, "/status/404", &[]), Ok(404));
        assert_eq!(
            wait_ready(addr, "/", &[], None, Duration::from_secs(2), true),
            Ok(())
        );
    }

    #[test]
    fn spawn_stop_and_exit_detection() {
        let log =
            std::env::temp_dir().join(format!("sluice-bench-proc-{}.log", std::process::id()));
        let mut p =
            Proc::spawn("sleeper", &["sleep".into(), "30".into()], None, &log).expect("spawn");
        assert!(p.exited().is_none());
        let t = Instant::now();
        p.stop();
        assert!(p.exited().is_some() && t.elapsed() < Duration::from_secs(2));
        let mut q = Proc::spawn("false", &["false".into()], None, &log).expect("spawn");
        let r = wait_ready(
            "127.0.0.1:9".parse().expect("addr"),
            "/",
            &[],
            Some(&mut q),
            Duration::from_secs(3),
            false,
        );
        assert!(matches!(r, Err(ReadyError::Exited(_))), "{r:?}");
        let _ = std::fs::remove_file(log);
    }
}
