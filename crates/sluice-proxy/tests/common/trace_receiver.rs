//! A real trace backend for the tracing plugins' tests: tools/trace-receiver (Go), which decodes OTLP/HTTP with
//! the OpenTelemetry Collector's pdata and Zipkin v2 JSON with zipkin-go's model, keeps the spans and answers
//! `GET /api/traces?service=NAME`. Built with `go build` into `<target>/trace-receiver/` on first use, behind a
//! stamp of go.mod/go.sum/main.go and an exclusive `flock` (test binaries asking at once build once). Needs Go
//! >= 1.25 (`go` on PATH, else /usr/local/go/bin/go); without it the tests skip, or fail under `CI=true`.
//!
//! The receiver exits when its stdin (a pipe from this process) closes, so it never outlives the test binary.
//! Include with `#[path = "../common/trace_receiver.rs"] mod trace_receiver;` next to the `ci` module.
#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

const INSTALL_LOCK: Duration = Duration::from_secs(900);

fn tool_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/trace-receiver")
}

fn home() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("trace-receiver")
}

/// A running receiver.
pub struct Receiver {
    pub addr: SocketAddr,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    /// Builds (once) and starts a receiver on 127.0.0.1; `None` when Go is missing outside CI.
    pub fn start() -> Option<Receiver> {
        let bin = install()?;
        let mut child = Command::new(&bin)
            .args(["-listen", "127.0.0.1:0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn trace-receiver");
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("trace-receiver did not start: {line:?}"));
        Some(Receiver { addr, child, stdin })
    }

    /// The OTLP collector address for `plugin_attr.opentelemetry.collector.address`.
    pub fn otlp(&self) -> String {
        self.addr.to_string()
    }

    /// The Zipkin endpoint for the zipkin plugin.
    pub fn zipkin(&self) -> String {
        format!("http://{}/api/v2/spans", self.addr)
    }

    /// Every span received for `service` (all when empty), as the receiver reports them.
    pub fn spans(&self, service: &str) -> Vec<Value> {
        let mut c = TcpStream::connect(self.addr).expect("connect trace-receiver");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            c,
            "GET /api/traces?service={service} HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut buf = String::new();
        c.read_to_string(&mut buf).unwrap();
        let body = buf.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        // Go answers small bodies with a Content-Length, bigger ones chunked.
        let json = if buf.contains("Transfer-Encoding: chunked") {
            dechunk(body)
        } else {
            body.to_owned()
        };
        let v: Value = serde_json::from_str(&json).expect("receiver answers JSON");
        v["data"].as_array().cloned().unwrap_or_default()
    }

    /// Waits (bounded) until `pred` holds for the spans of `service`, returning them.
    pub fn wait_for(&self, service: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.spans(service);
            if pred(&s) || Instant::now() > end {
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn install() -> Option<PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(install_locked).clone()
}

fn install_locked() -> Option<PathBuf> {
    let Some(go) = find_go() else {
        crate::ci::skip_unless_ci(
            "the trace receiver needs Go >= 1.25 (on PATH or in /usr/local/go/bin)",
        );
        return None;
    };
    let home = home();
    std::fs::create_dir_all(&home).expect("create <target>/trace-receiver");
    let _lock = lock(&home.join(".lock"));
    let tools = tool_dir();
    let version = Command::new(&go)
        .args(["env", "GOVERSION"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut h = DefaultHasher::new();
    version.hash(&mut h);
    for f in ["go.mod", "go.sum", "main.go"] {
        std::fs::read(tools.join(f))
            .unwrap_or_else(|e| panic!("read tools/trace-receiver/{f}: {e}"))
            .hash(&mut h);
    }
    let stamp = format!("{:016x}", h.finish());
    let bin = home.join("trace-receiver");
    let stamp_file = home.join(".sluice-stamp");
    if std::fs::read_to_string(&stamp_file).ok().as_deref() != Some(stamp.as_str()) || !bin.exists()
    {
        let t = Instant::now();
        let out = Command::new(&go)
            .args(["build", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(&tools)
            .output()
            .expect("run go build");
        assert!(
            out.status.success(),
            "go build of tools/trace-receiver failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("trace-receiver: go build took {:.1?}", t.elapsed());
        std::fs::write(&stamp_file, &stamp).expect("write stamp");
    }
    Some(bin)
}

fn find_go() -> Option<PathBuf> {
    ["go", "/usr/local/go/bin/go"].into_iter().find_map(|go| {
        let out = Command::new(go).args(["env", "GOVERSION"]).output().ok()?;
        let v = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u32> = v
            .trim()
            .trim_start_matches("go")
            .split(|c: char| !c.is_ascii_digit())
            .map_while(|p| p.parse().ok())
            .collect();
        (out.status.success() && v >= vec![1, 25]).then(|| PathBuf::from(go))
    })
}

fn lock(path: &Path) -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open install lock");
    let end = Instant::now() + INSTALL_LOCK;
    loop {
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return f,
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                assert!(Instant::now() < end, "{} still locked", path.display());
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("flock {}: {e}", path.display()),
        }
    }
}
