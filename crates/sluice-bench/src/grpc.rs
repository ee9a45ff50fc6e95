//! The `grpc-transcode` scenario (issue 12): what grpc-transcode costs per request over plain gRPC proxying.
//! The origin is grpc-go's example `helloworld/greeter_server`, built with `go build` into the work directory from
//! the module pinned in crates/sluice-proxy/tools/grpc-peers (embedded here, so the bench needs no source tree).
//! One Sluice (1 worker) serves two routes: `/helloworld.Greeter/SayHello` proxied to the greeter with upstream
//! `scheme: grpc`, and `/hello` with grpc-transcode (proto `helloworld`, given in `apisix.yaml`). h2load drives the
//! same SayHello call, at the same concurrency, interleaved round by round along four paths:
//!
//! - `direct`: gRPC straight at the greeter (a prepared gRPC body file);
//! - `sluice-grpc`: the same gRPC request through Sluice (h2c in, h2c out);
//! - `sluice-transcode`: HTTP/1.1 `POST /hello` with `{"name":"bench"}`, transcoded to the gRPC call;
//! - `sluice-transcode-h2c`: the same JSON request over h2c, so that it crosses the same downstream protocol as
//!   `sluice-grpc` (the HTTP/1.1 row then shows what the h2 downstream costs on its own).
//!
//! Sluice's CPU per request is taken from /proc/PID/stat around each measured run. With valgrind installed a second
//! Sluice runs under callgrind for instruction counts (1 worker, 2,000 warm-up requests, 20,000 counted at c=8, as
//! the `instructions` scenario does). h2load checks only HTTP statuses, so every path is probed before measuring
//! (the answer must be the greeter's real reply, `grpc-status: 0` included) and every run must have received the
//! probe's body size per request; a run that did not is rejected rather than reported.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::callgrind;
use crate::drivers::{parse_h2load, Measured};
use crate::gateway;
use crate::procinfo::{clock_ticks, cpu_ticks_tree, peak_rss_kib_tree};
use crate::procs::{free_port, installed, Proc};
use crate::progress::Progress;
use crate::report::{RunResult, ScenarioReport, TargetResult};
use crate::runner::Ctx;
use crate::scenario::{Scenario, Workers};

/// The pinned grpc-go examples module the tests build their peers from.
const GO_MOD: &str = include_str!("../../sluice-proxy/tools/grpc-peers/go.mod");
const GO_SUM: &str = include_str!("../../sluice-proxy/tools/grpc-peers/go.sum");
const TOOLS_GO: &str = include_str!("../../sluice-proxy/tools/grpc-peers/tools.go");
const GREETER_PKG: &str = "google.golang.org/grpc/examples/helloworld/greeter_server";
/// How long `go build` may take (first build: module download and compile of grpc-go).
const GO_BUILD_LIMIT: Duration = Duration::from_secs(600);

/// grpc-go's helloworld service, as the greeter implements it (SayHello only).
pub const HELLO_PROTO: &str = r#"syntax = "proto3";
package helloworld;
service Greeter {
  rpc SayHello (HelloRequest) returns (HelloReply) {}
}
message HelloRequest { string name = 1; }
message HelloReply { string message = 1; }
"#;

/// The gRPC method path, also the proxied route's uri.
pub const GRPC_PATH: &str = "/helloworld.Greeter/SayHello";
/// The transcoded route's uri.
pub const TRANSCODE_PATH: &str = "/hello";
/// The name every call sends; the greeter answers "Hello " + name.
pub const NAME: &str = "bench";
/// The transcoded request body.
pub const JSON_BODY: &str = "{\"name\":\"bench\"}";

/// Warm-up and counted requests of the instruction counts, c=8 (as the `instructions` scenario).
const CG_WARMUP: u64 = 2_000;
const CG_REQUESTS: u64 = 20_000;
const CG_CONCURRENCY: usize = 8;

/// A protobuf message with one length-delimited string in field 1 (HelloRequest and HelloReply).
fn string_field(s: &str) -> Vec<u8> {
    // Single-byte varint length: the bench's strings are short.
    assert!(s.len() < 128);
    let mut m = vec![0x0a, s.len() as u8];
    m.extend_from_slice(s.as_bytes());
    m
}

/// A gRPC length-prefixed message (uncompressed).
pub fn grpc_frame(msg: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + msg.len());
    f.push(0);
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// The framed HelloRequest every gRPC call sends.
pub fn grpc_request() -> Vec<u8> {
    grpc_frame(&string_field(NAME))
}

/// The framed HelloReply the greeter answers with.
pub fn grpc_reply() -> Vec<u8> {
    grpc_frame(&string_field(&format!("Hello {NAME}")))
}

/// One of the measured paths of the same SayHello call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Direct,
    Grpc,
    Transcode,
    TranscodeH2c,
}

impl Call {
    pub const ALL: [Call; 4] = [
        Call::Direct,
        Call::Grpc,
        Call::Transcode,
        Call::TranscodeH2c,
    ];

    /// The report's target name.
    pub fn target(self) -> &'static str {
        match self {
            Call::Direct => "direct",
            Call::Grpc => "sluice-grpc",
            Call::Transcode => "sluice-transcode",
            Call::TranscodeH2c => "sluice-transcode-h2c",
        }
    }

    fn through_sluice(self) -> bool {
        self != Call::Direct
    }

    /// HTTP/1.1 from the generator (else h2c prior knowledge).
    fn h1(self) -> bool {
        self == Call::Transcode
    }

    fn driver(self) -> &'static str {
        if self.h1() {
            "h2load --h1"
        } else {
            "h2load"
        }
    }

    fn path(self) -> &'static str {
        match self {
            Call::Direct | Call::Grpc => GRPC_PATH,
            Call::Transcode | Call::TranscodeH2c => TRANSCODE_PATH,
        }
    }

    fn headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Call::Direct | Call::Grpc => {
                &[("content-type", "application/grpc"), ("te", "trailers")]
            }
            Call::Transcode | Call::TranscodeH2c => &[("content-type", "application/json")],
        }
    }

    fn body(self) -> Vec<u8> {
        match self {
            Call::Direct | Call::Grpc => grpc_request(),
            Call::Transcode | Call::TranscodeH2c => JSON_BODY.as_bytes().to_vec(),
        }
    }

    fn body_file(self, dir: &Path) -> PathBuf {
        dir.join(match self {
            Call::Direct | Call::Grpc => "say_hello.grpc",
            Call::Transcode | Call::TranscodeH2c => "say_hello.json",
        })
    }
}

/// When an h2load run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    Elapsed(Duration),
    Requests(u64),
}

/// h2load's arguments for one run of `call` against `addr` (one stream per connection: `conns` requests in flight).
pub fn h2load_args(
    call: Call,
    addr: SocketAddr,
    body_file: &Path,
    conns: usize,
    threads: usize,
    until: Until,
) -> Vec<String> {
    let conns = conns.max(1);
    let mut a: Vec<String> = Vec::new();
    if call.h1() {
        a.push("--h1".into());
    }
    a.extend([
        "-c".into(),
        conns.to_string(),
        "-m".into(),
        "1".into(),
        "-t".into(),
        threads.clamp(1, conns).to_string(),
    ]);
    match until {
        Until::Elapsed(d) => a.extend(["-D".into(), format!("{}ms", d.as_millis().max(1))]),
        Until::Requests(n) => a.extend(["-n".into(), n.to_string()]),
    }
    a.extend(["-d".into(), body_file.display().to_string()]);
    for (k, v) in call.headers() {
        a.extend(["-H".into(), format!("{k}: {v}")]);
    }
    a.push(format!("http://{addr}{}", call.path()));
    a
}

/// Runs h2load; for a request count, elapsed is the wall time of the run.
fn h2load(args: &[String], until: Until) -> Result<Measured, String> {
    let t = Instant::now();
    let out = Command::new("h2load")
        .args(args)
        .output()
        .map_err(|e| format!("h2load: {e}"))?;
    let wall = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut m = match until {
        Until::Elapsed(d) => parse_h2load(&text, d),
        Until::Requests(_) => parse_h2load(&text, wall),
    }
    .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stderr).trim()))?;
    if m.requests == 0 {
        return Err(format!("h2load completed no request: {}", text.trim()));
    }
    m.elapsed = m.elapsed.max(Duration::from_millis(1));
    Ok(m)
}

/// Rejects a run whose answers were not the probed reply: h2load counts any 2xx, the body size tells more.
pub fn check_answers(m: &Measured, per_answer: usize) -> Result<(), String> {
    let got = m.data_bytes as f64 / m.requests.max(1) as f64;
    if m.errors.non_2xx > 0 || (got - per_answer as f64).abs() > per_answer as f64 * 0.01 {
        return Err(format!(
            "answers were not all the reply: {got:.1} body bytes per answer (the reply has {per_answer}), {} non-2xx",
            m.errors.non_2xx
        ));
    }
    Ok(())
}

/// APISIX standalone `apisix.yaml`: the helloworld proto, the gRPC route and the transcoded route, both to the
/// greeter with `scheme: grpc`.
pub fn standalone_yaml(greeter: SocketAddr, keepalive: usize) -> String {
    let upstream = format!(
        "    upstream:\n      scheme: grpc\n      type: roundrobin\n      nodes:\n        \"{greeter}\": 1\n      keepalive_pool: {{size: {keepalive}, idle_timeout: 60, requests: 100000}}\n"
    );
    let mut y = String::from("protos:\n  - id: helloworld\n    content: |\n");
    for l in HELLO_PROTO.lines() {
        y.push_str("      ");
        y.push_str(l);
        y.push('\n');
    }
    y.push_str("routes:\n");
    y.push_str(&format!("  - id: grpc\n    uri: {GRPC_PATH}\n{upstream}"));
    y.push_str(&format!(
        "  - id: transcode\n    uri: {TRANSCODE_PATH}\n    plugins:\n      grpc-transcode:\n        proto_id: helloworld\n        service: helloworld.Greeter\n        method: SayHello\n{upstream}"
    ));
    y.push_str("#END\n");
    y
}

/// A Go toolchain new enough for the pinned module: `go` on PATH, else /usr/local/go/bin/go.
pub fn find_go() -> Option<PathBuf> {
    find_go_for(GO_MOD)
}

/// A Go toolchain new enough for the module whose go.mod is `go_mod`.
pub fn find_go_for(go_mod: &str) -> Option<PathBuf> {
    let need = go_mod
        .lines()
        .find_map(|l| l.strip_prefix("go ").map(|v| version(v.trim())))?;
    ["go", "/usr/local/go/bin/go"].into_iter().find_map(|go| {
        let out = Command::new(go).args(["env", "GOVERSION"]).output().ok()?;
        let v = String::from_utf8_lossy(&out.stdout);
        (out.status.success() && version(v.trim().trim_start_matches("go")) >= need)
            .then(|| PathBuf::from(go))
    })
}

fn version(v: &str) -> Vec<u32> {
    v.split(|c: char| !c.is_ascii_digit())
        .map_while(|p| p.parse().ok())
        .collect()
}

/// Builds the greeter into `dir/greeter_server` (kept across runs while go.mod, go.sum and Go stay the same).
pub fn build_greeter(go: &Path, dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let bin = dir.join("greeter_server");
    let go_version = Command::new(go)
        .args(["env", "GOVERSION"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .map_err(|e| format!("{}: {e}", go.display()))?;
    let mut h = DefaultHasher::new();
    (GO_MOD, GO_SUM, &go_version).hash(&mut h);
    let stamp = format!("{:016x}", h.finish());
    let stamp_file = dir.join(".stamp");
    if bin.is_file() && std::fs::read_to_string(&stamp_file).ok().as_deref() == Some(&stamp) {
        return Ok(bin);
    }
    let _ = std::fs::remove_file(&stamp_file);
    for (name, text) in [
        ("go.mod", GO_MOD),
        ("go.sum", GO_SUM),
        ("tools.go", TOOLS_GO),
    ] {
        gateway::write(dir, name, text)?;
    }
    let log_path = dir.join("go-build.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let mut child = Command::new(go)
        .args(["build", "-buildvcs=false", "-o"])
        .arg(&bin)
        .arg(GREETER_PKG)
        .current_dir(dir)
        .env("GOWORK", "off")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("go build: {e}"))?;
    let end = Instant::now() + GO_BUILD_LIMIT;
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "go build {GREETER_PKG} took over {GO_BUILD_LIMIT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        let said = std::fs::read_to_string(&log_path).unwrap_or_default();
        return Err(format!(
            "go build {GREETER_PKG} failed ({status}): {}",
            said.trim().lines().last().unwrap_or("")
        ));
    }
    gateway::write(dir, ".stamp", &stamp)?;
    Ok(bin)
}

/// The running greeter. It logs every call, so its output is kept as a bounded tail in memory (for the reason it
/// died, if it does) rather than in a file that would grow by the request count. Killed when dropped.
pub struct Greeter {
    child: Child,
    tail: Arc<Mutex<Vec<u8>>>,
    pub addr: SocketAddr,
}

/// Bytes of the greeter's output kept.
const TAIL: usize = 16 << 10;

impl Greeter {
    /// Starts the greeter on a free port (it listens on ":port", every interface; only 127.0.0.1 is used). The port
    /// is free when picked and may be taken before the greeter binds it: then it exits and another port is tried.
    pub fn start(bin: &Path, pin: Option<&str>) -> Result<Greeter, String> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port()?;
            let mut cmd = match pin {
                Some(cpus) => {
                    let mut c = Command::new("taskset");
                    c.arg("-c").arg(cpus).arg(bin);
                    c
                }
                None => Command::new(bin),
            };
            let mut child = cmd
                .arg("-port")
                .arg(port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("start {}: {e}", bin.display()))?;
            let tail = Arc::new(Mutex::new(Vec::new()));
            if let Some(o) = child.stdout.take() {
                drain(o, tail.clone());
            }
            if let Some(e) = child.stderr.take() {
                drain(e, tail.clone());
            }
            let mut g = Greeter {
                child,
                tail,
                addr: ([127, 0, 0, 1], port).into(),
            };
            let end = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(why) = g.exited() {
                    last = why;
                    break;
                }
                match probe(Call::Direct, g.addr) {
                    Ok(_) => return Ok(g),
                    Err(e) if Instant::now() > end => {
                        return Err(format!("greeter not ready: {e}"))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        Err(format!("greeter_server did not start: {last}"))
    }

    /// `Some(why)` once the greeter has exited: its status and the last lines it wrote.
    pub fn exited(&mut self) -> Option<String> {
        let st = self.child.try_wait().ok()??;
        std::thread::sleep(Duration::from_millis(50));
        let tail = self.tail.lock().map(|t| t.clone()).unwrap_or_default();
        let text = String::from_utf8_lossy(&tail);
        let last: Vec<&str> = text
            .lines()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .collect();
        let last: Vec<&str> = last.into_iter().rev().collect();
        Some(format!(
            "greeter_server exited ({st}): {}",
            last.join(" | ")
        ))
    }
}

impl Drop for Greeter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Keeps the last [`TAIL`] bytes `r` writes.
fn drain(mut r: impl Read + Send + 'static, tail: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = r.read(&mut buf) {
            let Ok(mut t) = tail.lock() else { return };
            t.extend_from_slice(&buf[..n]);
            let excess = t.len().saturating_sub(TAIL);
            t.drain(..excess);
        }
    });
}

/// Calls SayHello along `call` once and checks the answer is the greeter's reply; returns the reply's body size
/// (what h2load counts as data per answer).
pub fn probe(call: Call, addr: SocketAddr) -> Result<usize, String> {
    let (status, body, grpc_status) = if call.h1() {
        h1_post(addr, call.path(), call.headers(), &call.body())?
    } else {
        h2_post(addr, call.path(), call.headers(), call.body())?
    };
    let text = || {
        String::from_utf8_lossy(&body)
            .chars()
            .take(200)
            .collect::<String>()
    };
    if status != 200 {
        return Err(format!("{} answered {status}: {}", call.path(), text()));
    }
    match call {
        Call::Direct | Call::Grpc => {
            if grpc_status.as_deref() != Some("0") {
                return Err(format!("grpc-status {grpc_status:?}, not 0"));
            }
            if body != grpc_reply() {
                return Err(format!("not the HelloReply: {:?}", text()));
            }
        }
        Call::Transcode | Call::TranscodeH2c => {
            let v: serde_json::Value =
                serde_json::from_slice(&body).map_err(|e| format!("not JSON ({e}): {}", text()))?;
            if v["message"] != format!("Hello {NAME}") {
                return Err(format!("not the transcoded reply: {}", text()));
            }
        }
    }
    Ok(body.len())
}

type Answer = (u16, Vec<u8>, Option<String>);

/// One h2c (prior knowledge) POST: status, body, and `grpc-status` from the trailers (or the head, when the answer
/// is trailers-only).
fn h2_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Answer, String> {
    let a = crate::procs::h2c_exchange(
        addr,
        http::Method::POST,
        path,
        headers.iter().copied(),
        Some(body),
        Duration::from_secs(5),
    )?;
    let grpc = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let status = a.trailers.as_ref().and_then(grpc).or_else(|| grpc(&a.head));
    Ok((a.status, a.body, status))
}

/// One HTTP/1.1 POST with `Connection: close`; the answer must be framed by Content-Length.
fn h1_post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Answer, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut wire = req.into_bytes();
    wire.extend_from_slice(body);
    s.write_all(&wire).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.take(1 << 20)
        .read_to_end(&mut buf)
        .map_err(|e| format!("read {addr}: {e}"))?;
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete response head")?;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status: u16 = head
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or("bad status line")?;
    let len: usize = head
        .split("\r\n")
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or("answer without Content-Length")?;
    let rest = &buf[end + 4..];
    if rest.len() < len {
        return Err(format!("body cut short: {} of {len} bytes", rest.len()));
    }
    Ok((status, rest[..len].to_vec(), None))
}

/// Progress steps of the scenario: each path each round, then the instruction counts.
pub fn steps(ctx: &Ctx) -> usize {
    Call::ALL.len() * ctx.rounds + Call::ALL.len() - 1
}

/// A started Sluice with the scenario's two routes.
struct Gateway {
    proc: Proc,
    addr: SocketAddr,
}

fn start_sluice(
    ctx: &Ctx,
    greeter: SocketAddr,
    tag: &str,
    valgrind: Option<&Path>,
) -> Result<Gateway, String> {
    let dir = ctx.work.join(format!("sluice-grpc-transcode{tag}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let port = free_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    gateway::write_node_config(&dir, port, Workers::One, ctx.access_log)?;
    gateway::write(&dir, "apisix.yaml", &standalone_yaml(greeter, 64))?;
    let mut argv: Vec<String> = Vec::new();
    if let Some(out) = valgrind {
        argv.extend([
            "valgrind".into(),
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={}", out.display()),
        ]);
    }
    argv.extend([
        ctx.sluice_bin.display().to_string(),
        "start".into(),
        "-c".into(),
        dir.join("config.yaml").display().to_string(),
    ]);
    let mut proc = Proc::spawn(
        "sluice",
        &argv,
        ctx.pin_gateway.as_deref(),
        &dir.join("sluice.log"),
    )?;
    let limit = if valgrind.is_some() {
        ctx.ready_timeout * 4
    } else {
        ctx.ready_timeout
    };
    let end = Instant::now() + limit;
    loop {
        if let Some(why) = proc.exited() {
            return Err(format!("gateway not ready: {why}"));
        }
        match probe(Call::Transcode, addr) {
            Ok(_) => return Ok(Gateway { proc, addr }),
            Err(e) if Instant::now() > end => return Err(format!("gateway not ready: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// One measured run of `call` (after a warm-up run), with Sluice's CPU sampled around it.
fn measure(
    ctx: &Ctx,
    s: &Scenario,
    call: Call,
    addr: SocketAddr,
    sluice: Option<u32>,
    files: &Path,
    per_answer: usize,
) -> Result<RunResult, String> {
    let body = call.body_file(files);
    let args = |until| h2load_args(call, addr, &body, s.concurrency, ctx.gen_threads, until);
    if !ctx.warmup.is_zero() {
        let until = Until::Elapsed(ctx.warmup);
        h2load(&args(until), until)?;
    }
    let until = Until::Elapsed(ctx.duration);
    let cpu0 = sluice.and_then(cpu_ticks_tree);
    let m = h2load(&args(until), until)?;
    let cpu1 = sluice.and_then(cpu_ticks_tree);
    check_answers(&m, per_answer)?;
    let secs = m.elapsed.as_secs_f64();
    Ok(RunResult {
        requests: m.requests,
        duration_s: secs,
        rps: m.requests as f64 / secs,
        bytes_per_s: m.bytes as f64 / secs,
        latency_us: m.latency,
        errors: m.errors,
        cpu_us_per_req: match (cpu0, cpu1) {
            (Some(a), Some(b)) => {
                Some(b.saturating_sub(a) as f64 * 1e6 / clock_ticks() as f64 / m.requests as f64)
            }
            _ => None,
        },
        origin_cpu_us_per_req: None,
        peak_rss_kib: sluice.and_then(peak_rss_kib_tree),
        instructions_per_req: None,
        pct_of_baseline: None,
        noise: None,
        contaminated: false,
    })
}

/// Instructions per request of `call` through a Sluice running under callgrind.
fn count_instructions(
    call: Call,
    gw: &Gateway,
    cg_dir: &Path,
    files: &Path,
    per_answer: usize,
) -> Result<f64, String> {
    let pid = gw.proc.pid().to_string();
    let body = call.body_file(files);
    let args = |n| h2load_args(call, gw.addr, &body, CG_CONCURRENCY, 1, Until::Requests(n));
    h2load(&args(CG_WARMUP), Until::Requests(CG_WARMUP))?;
    callgrind::control(&["-z", &pid])?;
    let m = h2load(&args(CG_REQUESTS), Until::Requests(CG_REQUESTS))?;
    let since = SystemTime::now();
    callgrind::control(&["-d", &pid])?;
    let ir = callgrind::wait_for_totals(cg_dir, since)?;
    check_answers(&m, per_answer)?;
    Ok(ir as f64 / m.requests as f64)
}

/// `x / base - 1` as a signed percentage.
fn pct_over(x: f64, base: f64) -> String {
    format!("{:+.1}%", (x / base - 1.0) * 100.0)
}

/// The overhead notes: transcoded over proxied gRPC, per metric, from the medians and round by round.
pub fn overhead_notes(results: &[TargetResult]) -> Vec<String> {
    let find = |c: Call| results.iter().find(|t| t.target == c.target());
    let mut notes = Vec::new();
    let Some(grpc) = find(Call::Grpc) else {
        return notes;
    };
    for c in [Call::Transcode, Call::TranscodeH2c] {
        let Some(t) = find(c) else { continue };
        let med = |t: &TargetResult, f: &dyn Fn(&RunResult) -> Option<f64>| {
            t.median.as_ref().and_then(f).filter(|v| *v > 0.0)
        };
        if let (Some(x), Some(b)) = (
            med(t, &|m| m.cpu_us_per_req),
            med(grpc, &|m| m.cpu_us_per_req),
        ) {
            let rounds: Vec<String> = t
                .rounds
                .iter()
                .zip(&grpc.rounds)
                .filter_map(|(a, g)| Some(pct_over(a.cpu_us_per_req?, g.cpu_us_per_req?)))
                .collect();
            let verdict = if x / b - 1.0 < 0.30 {
                "under the 30% target"
            } else {
                "OVER the 30% target"
            };
            notes.push(format!(
                "{} vs {}: CPU {x:.1} vs {b:.1} µs/request, transcoding overhead {} ({verdict}); per round {}",
                c.target(),
                Call::Grpc.target(),
                pct_over(x, b),
                rounds.join(" ")
            ));
        }
        if let (Some(x), Some(b)) = (
            med(t, &|m| m.instructions_per_req),
            med(grpc, &|m| m.instructions_per_req),
        ) {
            notes.push(format!(
                "{} vs {}: {x:.0} vs {b:.0} instructions/request, {}",
                c.target(),
                Call::Grpc.target(),
                pct_over(x, b)
            ));
        }
    }
    notes
}

/// Number of CPUs in a taskset list ("1", "0-2", "0,3").
fn cpu_count(list: &str) -> usize {
    list.split(',')
        .map(|p| match p.split_once('-') {
            Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum()
}

fn skipped(s: &Scenario, why: String) -> ScenarioReport {
    ScenarioReport {
        scenario: s.clone(),
        status: "skipped".into(),
        skip_reason: Some(why),
        results: Vec::new(),
        notes: Vec::new(),
    }
}

/// Runs the scenario: build and start the greeter, start Sluice, probe every path, interleaved measured rounds,
/// then instruction counts under callgrind when valgrind is installed.
pub fn run(ctx: &Ctx, s: &Scenario, progress: &mut Progress) -> ScenarioReport {
    let total = steps(ctx);
    progress.show(&format!("{}: building grpc-go's greeter_server", s.name));
    let prepared = (|| {
        if ctx.gateway.is_some() {
            return Err("this scenario starts its own gateway (--gateway given)".to_string());
        }
        if !installed("h2load") {
            return Err("h2load not installed (apt-get install nghttp2-client)".into());
        }
        let go = find_go().ok_or(
            "Go >= 1.25 not found (on PATH or /usr/local/go/bin): it builds grpc-go's greeter_server, the origin",
        )?;
        let dir = ctx.work.join("grpc-greeter");
        let bin = build_greeter(&go, &dir)?;
        for c in [Call::Direct, Call::Transcode] {
            std::fs::write(c.body_file(&dir), c.body())
                .map_err(|e| format!("{}: {e}", c.body_file(&dir).display()))?;
        }
        Ok((bin, dir))
    })();
    let (bin, files) = match prepared {
        Ok(p) => p,
        Err(why) => {
            progress.advance(total);
            return skipped(s, why);
        }
    };
    progress.show(&format!("{}: starting greeter and sluice", s.name));
    let mut greeter = match Greeter::start(&bin, ctx.pin_mock.as_deref()) {
        Ok(g) => g,
        Err(why) => {
            progress.advance(total);
            return skipped(s, why);
        }
    };
    let greeter_addr = greeter.addr;
    let gw = start_sluice(ctx, greeter_addr, "", None);
    let greeter_cpus = ctx.pin_mock.as_deref().map(cpu_count).unwrap_or(ctx.cores);
    let mut results: Vec<TargetResult> = Vec::new();
    // (call, address, Sluice's pid, body bytes per answer, index in results)
    let mut active: Vec<(Call, SocketAddr, Option<u32>, usize, usize)> = Vec::new();
    for call in Call::ALL {
        let (addr, pid, workers, pinned) = if call.through_sluice() {
            match &gw {
                Ok(g) => (g.addr, Some(g.proc.pid()), 1, ctx.pin_gateway.clone()),
                Err(why) => {
                    results.push(TargetResult::skipped(
                        call.target(),
                        call.driver(),
                        1,
                        why.clone(),
                    ));
                    progress.advance(ctx.rounds);
                    continue;
                }
            }
        } else {
            (greeter_addr, None, greeter_cpus, ctx.pin_mock.clone())
        };
        match probe(call, addr) {
            Ok(per_answer) => {
                let mut t =
                    TargetResult::skipped(call.target(), call.driver(), workers, String::new());
                t.skip_reason = None;
                t.status = "ok".into();
                t.pinned_cpus = pinned;
                results.push(t);
                active.push((call, addr, pid, per_answer, results.len() - 1));
            }
            Err(e) => {
                results.push(TargetResult::skipped(
                    call.target(),
                    call.driver(),
                    workers,
                    format!("probe failed: {e}"),
                ));
                progress.advance(ctx.rounds);
            }
        }
    }
    // Set once the origin is gone: no figure after that would mean anything.
    let mut dead: Option<String> = None;
    for round in 0..ctx.rounds {
        for (call, addr, pid, per_answer, idx) in &active {
            progress.show(&format!(
                "{} {} round {}/{}",
                s.name,
                call.target(),
                round + 1,
                ctx.rounds
            ));
            if dead.is_none() {
                dead = greeter.exited();
            }
            if let Some(why) = &dead {
                results[*idx].skip_reason = Some(why.clone());
                progress.advance(1);
                continue;
            }
            match measure(ctx, s, *call, *addr, *pid, &files, *per_answer) {
                Ok(r) => results[*idx].rounds.push(r),
                Err(e) => results[*idx].skip_reason = Some(e),
            }
            progress.advance(1);
        }
    }
    drop(gw);
    for r in &mut results {
        r.finish();
    }
    let mut notes = vec![format!(
        "origin: grpc-go {GREETER_PKG} (pinned module), SayHello(name=\"{NAME}\"); h2load, {} connections x 1 stream on every path",
        s.concurrency
    )];
    let counted: Vec<(Call, usize, usize)> = active
        .iter()
        .filter(|(c, ..)| c.through_sluice())
        .map(|(c, _, _, per, idx)| (*c, *per, *idx))
        .collect();
    if !installed("valgrind") || !installed("callgrind_control") {
        notes.push("valgrind not installed: no instruction counts".into());
        progress.advance(Call::ALL.len() - 1);
    } else {
        let cg_dir = ctx.work.join("callgrind-grpc-transcode");
        let _ = std::fs::remove_dir_all(&cg_dir);
        let started = std::fs::create_dir_all(&cg_dir)
            .map_err(|e| e.to_string())
            .and_then(|_| {
                start_sluice(
                    ctx,
                    greeter_addr,
                    "-callgrind",
                    Some(&cg_dir.join("callgrind.out")),
                )
            });
        for (call, per_answer, idx) in &counted {
            progress.show(&format!("{} {} (callgrind)", s.name, call.target()));
            if dead.is_none() {
                dead = greeter.exited();
            }
            let r = match (&dead, &started) {
                (Some(why), _) | (None, Err(why)) => Err(why.clone()),
                (None, Ok(g)) => count_instructions(*call, g, &cg_dir, &files, *per_answer),
            };
            match r {
                Ok(ir) => {
                    if let Some(m) = results[*idx].median.as_mut() {
                        m.instructions_per_req = Some(ir);
                    }
                }
                Err(e) => notes.push(format!("{}: no instruction count: {e}", call.target())),
            }
            progress.advance(1);
        }
        progress.advance((Call::ALL.len() - 1).saturating_sub(counted.len()));
    }
    if dead.is_none() {
        dead = greeter.exited();
    }
    drop(greeter);
    if let Some(why) = dead {
        notes.push(format!("the origin died during the run: {why}"));
    }
    notes.extend(overhead_notes(&results));
    crate::runner::finish(s, results, notes)
}

#[cfg(test)]
mod tests;
