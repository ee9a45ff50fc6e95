//! The `dubbo` scenario (issue 13): dubbo-go-pixiu's benchmark report reproduced side by side in one run.
//! The call is the report's, as /work/shared/peers/pixiu.md maps it onto our test service: `POST
//! /api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService?version=1.0.0&method=hello` with
//! `{"types":"object","values":{"name":"tc"}}`, a generic (`$invoke`) call of `DemoService:1.0.0 hello(Map)` on a
//! dubbo-go 3.3.1 provider, at 20 connections, through three targets interleaved round by round:
//!
//! - `sluice`: Sluice's dubbo-proxy (`generic: true`, the provider as a static node), loaded by wrk -c20 -t2;
//! - `pixiu`: dubbo-go-pixiu v1.1.0 with `dgp.filter.http.apiconfig` + `dgp.filter.http.dubboproxy` (its only
//!   configuration that holds under load), the provider found through a private Debian Zookeeper, same wrk load;
//! - `direct`: a dubbo-go 3.3.1 generic consumer calling the provider itself from 20 goroutines (no gateway).
//!
//! Per target: requests/s, p50/p99, errors, the gateway's CPU per request and the provider's (the `origin` CPU).
//! Everything Go is built from crates/sluice-bench/tools/dubbo-bench (one go.mod/go.sum pinning dubbo-go 3.3.1 and
//! Pixiu 1.1.0, embedded here) into the target directory on first use.
//!
//! Pixiu in registry mode binds `*:50051` and `*:<random>` whatever its listener says, so every process of the
//! scenario (Zookeeper, provider, both gateways, wrk, the client) runs in one private network namespace (`unshare
//! -n`, only `lo`) entered with `nsenter`; nothing it binds can meet another program's ports, so the ports inside
//! are fixed. Without a namespace (not root) Sluice and the direct client run on ephemeral loopback ports and
//! Pixiu is skipped, with the reason in the report. Nothing is pinned: Pixiu uses both cores (GOMAXPROCS 2), as in
//! its report, and on 2 cores the machine is saturated, so requests/s is a share of the machine; CPU µs per
//! request is the comparable figure.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::drivers::{parse_wrk, Measured};
use crate::gateway;
use crate::loadgen::Errors;
use crate::procinfo::{clock_ticks, cpu_ticks, cpu_ticks_tree, peak_rss_kib_tree};
use crate::procs::{free_port, installed, Proc};
use crate::progress::Progress;
use crate::report::{RunResult, ScenarioReport, TargetResult};
use crate::runner::Ctx;
use crate::scenario::{Scenario, Workers};
use crate::stats::Latency;

const GO_MOD: &str = include_str!("../tools/dubbo-bench/go.mod");
const GO_SUM: &str = include_str!("../tools/dubbo-bench/go.sum");
const TOOLS_GO: &str = include_str!("../tools/dubbo-bench/tools.go");
const PROVIDER_GO: &str = include_str!("../tools/dubbo-bench/provider/main.go");
const CLIENT_GO: &str = include_str!("../tools/dubbo-bench/client/main.go");
const PIXIU_PKG: &str = "github.com/apache/dubbo-go-pixiu/cmd/pixiu";
/// How long one `go build` may take (Pixiu's first: ~250 modules, 3 minutes on an idle 2-core machine).
const GO_BUILD_LIMIT: Duration = Duration::from_secs(1200);
/// Debian's `zookeeper` package.
pub const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";

pub const SERVICE: &str = "org.apache.dubbo.backend.DemoService";
/// The request line's target, the same for Sluice and Pixiu.
pub const PATH: &str =
    "/api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService?version=1.0.0&method=hello";
/// The route's uri (Sluice) / resource path (Pixiu) without the query.
pub const URI: &str = "/api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService";
/// The body of every request: dubbo-go-pixiu's `{"types": ..., "values": ...}`.
pub const BODY: &str = r#"{"types":"object","values":{"name":"tc"}}"#;
/// Connections (wrk) / goroutines (direct client), as the Pixiu report's wrk -c20.
pub const CONCURRENCY: usize = 20;
/// wrk threads, as pixiu.md's recipe.
const WRK_THREADS: usize = 2;

/// Fixed ports inside the private namespace (nothing else lives there).
const NS_ZK: u16 = 2181;
const NS_PROVIDER: u16 = 20881;
const NS_PIXIU: u16 = 8883;
const NS_SLUICE: u16 = 9080;

/// One of the three ways the same call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Sluice,
    Pixiu,
    Direct,
}

impl Target {
    pub const ALL: [Target; 3] = [Target::Sluice, Target::Pixiu, Target::Direct];

    pub fn name(self) -> &'static str {
        match self {
            Target::Sluice => "sluice",
            Target::Pixiu => "pixiu",
            Target::Direct => "direct",
        }
    }

    fn driver(self) -> &'static str {
        match self {
            Target::Direct => "dubbo-go client",
            _ => "wrk",
        }
    }
}

/// wrk's script: the report's POST.
pub fn wrk_lua() -> String {
    format!(
        "wrk.method = \"POST\"\nwrk.body = '{BODY}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
    )
}

/// Sluice's `apisix.yaml`: one route, dubbo-proxy in generic mode (method from `?method=`), the provider a static
/// node with APISIX's default multiplexing.
pub fn sluice_yaml(provider: SocketAddr) -> String {
    format!(
        "routes:\n  - id: pixiu-shape\n    uri: {URI}\n    methods: [POST]\n    plugins:\n      dubbo-proxy:\n        service_name: {SERVICE}\n        service_version: 1.0.0\n        generic: true\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{provider}\": 1\n#END\n"
    )
}

/// Zookeeper's `zoo.cfg` (standalone, loopback, private data directory).
pub fn zoo_cfg(data: &Path, port: u16) -> String {
    format!(
        "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat\n",
        data.display()
    )
}

/// Pixiu's bootstrap (pixiu.md's `zk.yaml`): apiconfig + dubboproxy, provider discovered through Zookeeper `zk`.
pub fn pixiu_conf(port: u16, zk: SocketAddr, api_config: &Path) -> String {
    format!(
        r#"static_resources:
  listeners:
    - name: "net/http"
      protocol_type: "HTTP"
      address:
        socket_address:
          address: "127.0.0.1"
          port: {port}
      filter_chains:
        filters:
          - name: dgp.filter.httpconnectionmanager
            config:
              route_config:
                routes:
                  - match:
                      prefix: "/api/v1"
                    route:
                      cluster: "test-dubbo"
                      cluster_not_found_response_code: 505
              http_filters:
                - name: dgp.filter.http.apiconfig
                  config:
                    path: {api}
                - name: dgp.filter.http.dubboproxy
                  config:
                    dubboProxyConfig:
                      registries:
                        "zookeeper":
                          protocol: "zookeeper"
                          timeout: "3s"
                          address: "{zk}"
                          username: ""
                          password: ""
                      timeout_config:
                        connect_timeout: 5s
                        request_timeout: 5s
              server_name: "test_http_dubbo"
              generate_request_id: false
      config:
        idle_timeout: 60s
        read_timeout: 5s
        write_timeout: 5s
  shutdown_config:
    timeout: "10s"
    step_timeout: "5s"
    reject_policy: "immediacy"
"#,
        api = api_config.display()
    )
}

/// Pixiu's API config (pixiu.md's "universality" API; no group mapping: the provider has no group).
pub const PIXIU_API: &str = r#"name: pixiu
description: pixiu http-to-dubbo peer
resources:
  - path: '/api/v1/test-dubbo/:application/:interface'
    type: restful
    description: common
    methods:
      - httpVerb: POST
        enable: true
        timeout: 1000ms
        inboundRequest:
          requestType: http
        integrationRequest:
          requestType: dubbo
          mappingParams:
            - name: requestBody.values
              mapTo: opt.values
            - name: requestBody.types
              mapTo: opt.types
            - name: uri.application
              mapTo: opt.application
            - name: uri.interface
              mapTo: opt.interface
            - name: queryStrings.method
              mapTo: opt.method
            - name: queryStrings.version
              mapTo: opt.version
          clusterName: "test_dubbo"
"#;

/// Pixiu's own logger at warn (without `-g` it logs INFO per request).
pub const PIXIU_LOG: &str = r#"level: "warn"
development: false
disableCaller: true
disableStacktrace: true
encoding: "console"
encoderConfig:
  messageKey: "message"
  levelKey: "level"
  timeKey: "time"
  nameKey: "logger"
  callerKey: "caller"
  stacktraceKey: "stacktrace"
  lineEnding: ""
  levelEncoder: "capital"
  timeEncoder: "iso8601"
  durationEncoder: "seconds"
  callerEncoder: "short"
  nameEncoder: ""
outputPaths:
  - "stderr"
errorOutputPaths:
  - "stderr"
"#;

/// Whether an HTTP answer is the provider's reply to the call (both gateways answer the returned map as JSON).
pub fn answer_ok(status: u16, body: &str) -> bool {
    status == 200 && body.contains(r#""status":"200""#) && body.contains("name: tc")
}

/// The direct client's summary line.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientResult {
    pub requests: u64,
    pub ok: u64,
    pub fail: u64,
    pub wall_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub cpu_s: f64,
}

/// Parses `RESULT requests=.. ok=.. fail=.. wall=.. p50_us=.. p99_us=.. max_us=.. cpu_s=..`.
pub fn parse_client(line: &str) -> Option<ClientResult> {
    let rest = line.trim().strip_prefix("RESULT ")?;
    let get = |k: &str| -> Option<f64> {
        rest.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Some(ClientResult {
        requests: get("requests")? as u64,
        ok: get("ok")? as u64,
        fail: get("fail")? as u64,
        wall_s: get("wall")?,
        p50_us: get("p50_us")?,
        p99_us: get("p99_us")?,
        max_us: get("max_us")?,
        cpu_s: get("cpu_s")?,
    })
}

/// Where the scenario's processes run: this namespace (ephemeral ports) or a private one held by a `sleep`.
enum Place {
    Host,
    Ns(Proc),
}

impl Place {
    /// A private network namespace with `lo` up, or why not.
    fn private(dir: &Path) -> Result<Place, String> {
        for p in ["unshare", "nsenter", "ip"] {
            if !installed(p) {
                return Err(format!("{p} not installed"));
            }
        }
        let argv: Vec<String> = ["unshare", "--net", "--", "sleep", "86400"]
            .map(String::from)
            .to_vec();
        let mut holder = Proc::spawn("netns", &argv, None, &dir.join("netns.log"))?;
        std::thread::sleep(Duration::from_millis(100));
        if let Some(why) = holder.exited() {
            return Err(format!("unshare -n refused (root needed): {why}"));
        }
        let ns = Place::Ns(holder);
        let up = Command::new("nsenter")
            .args(ns.prefix())
            .args(["ip", "link", "set", "lo", "up"])
            .output()
            .map_err(|e| format!("nsenter: {e}"))?;
        if !up.status.success() {
            return Err(format!(
                "ip link set lo up in the namespace: {}",
                String::from_utf8_lossy(&up.stderr).trim()
            ));
        }
        Ok(ns)
    }

    /// `nsenter`'s arguments (after the program name) for the namespace.
    fn prefix(&self) -> Vec<String> {
        match self {
            Place::Host => Vec::new(),
            Place::Ns(p) => vec![format!("--net=/proc/{}/ns/net", p.pid()), "--".into()],
        }
    }

    /// `argv` run in this place (nsenter execs it: the pid stays the program's).
    fn argv(&self, argv: &[String]) -> Vec<String> {
        match self {
            Place::Host => argv.to_vec(),
            Place::Ns(_) => {
                let mut v = vec!["nsenter".to_string()];
                v.extend(self.prefix());
                v.extend_from_slice(argv);
                v
            }
        }
    }

    fn command(&self, argv: &[String]) -> Command {
        let a = self.argv(argv);
        let mut c = Command::new(&a[0]);
        c.args(&a[1..]);
        c
    }

    /// A port on 127.0.0.1 for a child: fixed inside the namespace, ephemeral outside.
    fn port(&self, fixed: u16) -> Result<u16, String> {
        match self {
            Place::Host => free_port(),
            Place::Ns(_) => Ok(fixed),
        }
    }

    fn listening(&self, addr: SocketAddr) -> bool {
        match self {
            Place::Host => TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok(),
            Place::Ns(_) => self
                .command(&[
                    "bash".into(),
                    "-c".into(),
                    format!("exec 3<>/dev/tcp/{}/{}", addr.ip(), addr.port()),
                ])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
        }
    }

    /// Waits until `addr` accepts connections while `proc` lives.
    fn wait_listening(
        &self,
        proc: &mut Proc,
        addr: SocketAddr,
        limit: Duration,
    ) -> Result<(), String> {
        let end = Instant::now() + limit;
        loop {
            if let Some(why) = proc.exited() {
                return Err(why);
            }
            if self.listening(addr) {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(format!(
                    "{} not listening on {addr} after {limit:?}",
                    proc.name
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One POST of the call with curl: status and body.
    fn post(&self, addr: SocketAddr) -> Result<(u16, String), String> {
        let out = self
            .command(&[
                "curl".into(),
                "-sS".into(),
                "--max-time".into(),
                "5".into(),
                "-X".into(),
                "POST".into(),
                "-H".into(),
                "Content-Type: application/json".into(),
                "-d".into(),
                BODY.into(),
                "-w".into(),
                "\n%{http_code}".into(),
                format!("http://{addr}{PATH}"),
            ])
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code: u16 = code.trim().parse().map_err(|_| {
            format!(
                "curl: no answer ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
        Ok((code, body.to_string()))
    }

    /// Probes `addr` until it answers the call right (a gateway that has just started may not know the provider
    /// yet: Pixiu discovers it through Zookeeper), while `proc` lives.
    fn wait_answer(
        &self,
        proc: &mut Proc,
        addr: SocketAddr,
        limit: Duration,
    ) -> Result<String, String> {
        let end = Instant::now() + limit;
        loop {
            if let Some(why) = proc.exited() {
                return Err(why);
            }
            let last = match self.post(addr) {
                Ok((code, body)) if answer_ok(code, &body) => return Ok(body),
                Ok((code, body)) => format!(
                    "HTTP {code}: {}",
                    body.chars().take(200).collect::<String>()
                ),
                Err(e) => e,
            };
            if Instant::now() > end {
                return Err(format!(
                    "{} never answered the call right: {last}",
                    proc.name
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// wrk -c20 -t2 --latency with the report's POST, for `d`.
    fn wrk(&self, addr: SocketAddr, lua: &Path, d: Duration) -> Result<Measured, String> {
        let out = self
            .command(&wrk_args(addr, lua, d))
            .output()
            .map_err(|e| format!("wrk: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "wrk failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        parse_wrk(&String::from_utf8_lossy(&out.stdout))
    }
}

/// wrk's command line for a run against `addr`.
pub fn wrk_args(addr: SocketAddr, lua: &Path, d: Duration) -> Vec<String> {
    vec![
        "wrk".into(),
        format!("-t{WRK_THREADS}"),
        format!("-c{CONCURRENCY}"),
        format!("-d{}s", d.as_secs().max(1)),
        "--latency".into(),
        "--timeout".into(),
        "5s".into(),
        "-s".into(),
        lua.display().to_string(),
        format!("http://{addr}{PATH}"),
    ]
}

/// A Go toolchain new enough for the pinned module.
fn find_go() -> Option<PathBuf> {
    crate::grpc::find_go_for(GO_MOD)
}

/// Where the Go builds go: `$CARGO_TARGET_DIR`, else the `target` directory this executable lives in, else the
/// run's work directory.
fn tools_dir(ctx: &Ctx) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            ctx.self_bin
                .ancestors()
                .find(|a| a.file_name().is_some_and(|n| n == "target"))
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| ctx.work.clone());
    base.join("sluice-bench-tools").join("dubbo")
}

/// Writes the module into `dir` and builds `pkg` into `dir/bin/name`, unless the same sources and Go built it
/// already.
fn go_build(go: &Path, dir: &Path, pkg: &str, name: &str) -> Result<PathBuf, String> {
    let go_version = Command::new(go)
        .args(["env", "GOVERSION"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .map_err(|e| format!("{}: {e}", go.display()))?;
    let files = [
        ("go.mod", GO_MOD),
        ("go.sum", GO_SUM),
        ("tools.go", TOOLS_GO),
        ("provider/main.go", PROVIDER_GO),
        ("client/main.go", CLIENT_GO),
    ];
    let mut h = DefaultHasher::new();
    (files, &go_version, pkg).hash(&mut h);
    let stamp = format!("{:016x}", h.finish());
    let bin = dir.join("bin").join(name);
    let stamp_file = dir.join("bin").join(format!("{name}.stamp"));
    if bin.is_file() && std::fs::read_to_string(&stamp_file).ok().as_deref() == Some(&stamp) {
        return Ok(bin);
    }
    for (f, text) in files {
        let p = dir.join(f);
        std::fs::create_dir_all(p.parent().unwrap_or(dir)).map_err(|e| e.to_string())?;
        if std::fs::read_to_string(&p).ok().as_deref() != Some(text) {
            std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    std::fs::create_dir_all(dir.join("bin")).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&stamp_file);
    let log_path = dir.join(format!("go-build-{name}.log"));
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    // Built under a temporary name and renamed: an interrupted build never leaves half a binary.
    let tmp = bin.with_extension(format!("tmp{}", std::process::id()));
    let mut child = Command::new(go)
        .args(["build", "-buildvcs=false", "-o"])
        .arg(&tmp)
        .arg(pkg)
        .current_dir(dir)
        .env("GOWORK", "off")
        .env("GOFLAGS", "-mod=mod")
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
            return Err(format!("go build {pkg} took over {GO_BUILD_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if !status.success() {
        let said = std::fs::read_to_string(&log_path).unwrap_or_default();
        return Err(format!(
            "go build {pkg} failed ({status}): {}",
            said.trim().lines().last().unwrap_or("")
        ));
    }
    std::fs::rename(&tmp, &bin).map_err(|e| e.to_string())?;
    gateway::write(&dir.join("bin"), &format!("{name}.stamp"), &stamp)?;
    Ok(bin)
}

/// Progress steps: each target each round.
pub fn steps(ctx: &Ctx) -> usize {
    Target::ALL.len() * ctx.rounds
}

fn cpu_us(ticks: u64, requests: u64) -> f64 {
    ticks as f64 * 1e6 / clock_ticks() as f64 / requests.max(1) as f64
}

/// One measured wrk run against a gateway (after a warm-up run), with the gateway's and the provider's CPU
/// sampled around it.
fn measure_gateway(
    ctx: &Ctx,
    place: &Place,
    addr: SocketAddr,
    lua: &Path,
    gw: u32,
    provider: u32,
) -> Result<RunResult, String> {
    if !ctx.warmup.is_zero() {
        place.wrk(addr, lua, ctx.warmup)?;
    }
    let (g0, p0) = (cpu_ticks_tree(gw), cpu_ticks(provider));
    let m = place.wrk(addr, lua, ctx.duration)?;
    let (g1, p1) = (cpu_ticks_tree(gw), cpu_ticks(provider));
    if m.requests == 0 {
        return Err("wrk completed no request".into());
    }
    let secs = m.elapsed.as_secs_f64().max(1e-3);
    let diff = |a: Option<u64>, b: Option<u64>| Some(cpu_us(b?.saturating_sub(a?), m.requests));
    Ok(RunResult {
        requests: m.requests,
        duration_s: secs,
        rps: m.requests as f64 / secs,
        bytes_per_s: m.bytes as f64 / secs,
        latency_us: m.latency,
        errors: m.errors,
        cpu_us_per_req: diff(g0, g1),
        origin_cpu_us_per_req: diff(p0, p1),
        peak_rss_kib: peak_rss_kib_tree(gw),
        instructions_per_req: None,
        pct_of_baseline: None,
        noise: None,
        contaminated: false,
    })
}

/// One run of the direct client (its own warm-up, then the measured part), the provider's CPU sampled between
/// the client's `MEASURING` and `RESULT` lines. Also returns the client's own CPU µs per request.
fn measure_direct(
    ctx: &Ctx,
    place: &Place,
    client: &Path,
    provider_addr: SocketAddr,
    provider: u32,
) -> Result<(RunResult, f64), String> {
    let argv = [
        client.display().to_string(),
        provider_addr.to_string(),
        CONCURRENCY.to_string(),
        format!("{:.3}", ctx.warmup.as_secs_f64()),
        format!("{:.3}", ctx.duration.as_secs_f64()),
    ];
    let mut child = place
        .command(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start the direct client: {e}"))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let p = cpu_ticks(provider);
            if tx.send((line, p)).is_err() {
                break;
            }
        }
    });
    let end = Instant::now() + ctx.warmup + ctx.duration + Duration::from_secs(60);
    let mut p0 = None;
    let mut last = String::new();
    let got = loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((line, p)) if line.starts_with("MEASURING") => p0 = p,
            Ok((line, p)) if line.starts_with("RESULT") => break Some((line, p)),
            Ok((line, _)) => last = line,
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let (line, p1) = got.ok_or_else(|| format!("the direct client gave no result: {last}"))?;
    let r = parse_client(&line).ok_or_else(|| format!("bad client line {line:?}"))?;
    if r.requests == 0 {
        return Err("the direct client completed no request".into());
    }
    let secs = r.wall_s.max(1e-3);
    let origin = match (p0, p1) {
        (Some(a), Some(b)) => Some(cpu_us(b.saturating_sub(a), r.requests)),
        _ => None,
    };
    Ok((
        RunResult {
            requests: r.requests,
            duration_s: secs,
            rps: r.requests as f64 / secs,
            bytes_per_s: 0.0,
            latency_us: Latency {
                p50: r.p50_us,
                p99: r.p99_us,
                max: r.max_us,
                ..Latency::default()
            },
            errors: Errors {
                io: r.fail,
                ..Errors::default()
            },
            cpu_us_per_req: None,
            origin_cpu_us_per_req: origin,
            peak_rss_kib: None,
            instructions_per_req: None,
            pct_of_baseline: None,
            noise: None,
            contaminated: false,
        },
        r.cpu_s * 1e6 / r.requests as f64,
    ))
}

/// The issue's three targets, from the medians: Sluice's CPU per request at most a tenth of Pixiu's, Sluice's
/// requests/s at least 90% of the direct client's, Sluice's p99 below Pixiu's.
pub fn target_notes(results: &[TargetResult]) -> Vec<String> {
    let med = |t: Target| {
        results
            .iter()
            .find(|r| r.target == t.name())
            .and_then(|r| r.median.as_ref())
    };
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut notes = Vec::new();
    let Some(s) = med(Target::Sluice) else {
        return notes;
    };
    if let Some(p) = med(Target::Pixiu) {
        if let (Some(sc), Some(pc)) = (s.cpu_us_per_req, p.cpu_us_per_req) {
            notes.push(format!(
                "target CPU: Sluice {sc:.1} µs/request, Pixiu {pc:.1}: Sluice costs 1/{:.1} of Pixiu (target at most 1/10: {})",
                pc / sc.max(1e-9),
                verdict(sc * 10.0 <= pc)
            ));
        }
        notes.push(format!(
            "target p99: Sluice {:.2} ms, Pixiu {:.2} ms ({})",
            s.latency_us.p99 / 1000.0,
            p.latency_us.p99 / 1000.0,
            verdict(s.latency_us.p99 < p.latency_us.p99)
        ));
    }
    if let Some(d) = med(Target::Direct) {
        let pct = s.rps * 100.0 / d.rps.max(1e-9);
        notes.push(format!(
            "target throughput: Sluice {:.0} req/s = {pct:.0}% of the direct client's {:.0} (target at least 90%: {})",
            s.rps,
            d.rps,
            verdict(pct >= 90.0)
        ));
    }
    notes
}

/// A markdown table of the medians (docs/benchmark.md's shape).
pub fn markdown_table(results: &[TargetResult]) -> String {
    let mut t = String::from(
        "| target | req/s | p50 ms | p99 ms | gateway CPU µs/req | provider CPU µs/req | errors |\n|---|---|---|---|---|---|---|\n",
    );
    let o = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
    for r in results {
        match &r.median {
            Some(m) => t.push_str(&format!(
                "| {} | {:.0} | {:.2} | {:.2} | {} | {} | {} |\n",
                r.target,
                m.rps,
                m.latency_us.p50 / 1000.0,
                m.latency_us.p99 / 1000.0,
                o(m.cpu_us_per_req),
                o(m.origin_cpu_us_per_req),
                m.errors.non_2xx + m.errors.failures()
            )),
            None => t.push_str(&format!(
                "| {} | skipped: {} | | | | | |\n",
                r.target,
                r.skip_reason.as_deref().unwrap_or("?")
            )),
        }
    }
    t
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

/// The binaries: provider and client (needed), Pixiu (its failure only skips Pixiu).
struct Tools {
    provider: PathBuf,
    client: Result<PathBuf, String>,
    pixiu: Result<PathBuf, String>,
}

fn build_tools(ctx: &Ctx, s: &Scenario, progress: &Progress) -> Result<Tools, String> {
    if ctx.gateway.is_some() {
        return Err("this scenario starts its own gateway (--gateway given)".into());
    }
    if !installed("wrk") {
        return Err("wrk not installed (apt-get install wrk)".into());
    }
    if !installed("curl") {
        return Err("curl not installed".into());
    }
    let go = find_go().ok_or(
        "Go not found (on PATH or /usr/local/go/bin), or older than crates/sluice-bench/tools/dubbo-bench/go.mod wants",
    )?;
    let dir = tools_dir(ctx);
    progress.show(&format!("{}: building the dubbo-go provider", s.name));
    let provider = go_build(&go, &dir, "./provider", "provider")?;
    progress.show(&format!("{}: building the dubbo-go client", s.name));
    let client = go_build(&go, &dir, "./client", "client");
    progress.show(&format!("{}: building dubbo-go-pixiu v1.1.0", s.name));
    let pixiu = go_build(&go, &dir, PIXIU_PKG, "pixiu");
    Ok(Tools {
        provider,
        client,
        pixiu,
    })
}

/// Runs the scenario: build, start everything in a private namespace, probe, interleaved rounds, verdicts.
pub fn run(ctx: &Ctx, s: &Scenario, progress: &mut Progress) -> ScenarioReport {
    let total = steps(ctx);
    let tools = match build_tools(ctx, s, progress) {
        Ok(t) => t,
        Err(why) => {
            progress.advance(total);
            return skipped(s, why);
        }
    };
    let dir = ctx.work.join("dubbo");
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        progress.advance(total);
        return skipped(s, format!("{}: {e}", dir.display()));
    }
    let mut notes = Vec::new();
    let (place, no_ns) = match Place::private(&dir) {
        Ok(p) => (p, None),
        Err(why) => (Place::Host, Some(why)),
    };
    // Pixiu's own prerequisites.
    let pixiu_ok: Result<PathBuf, String> = (|| {
        let bin = tools.pixiu.clone()?;
        if let Some(why) = &no_ns {
            return Err(format!(
                "Pixiu binds *:50051 and a random port, so it runs only in a private network namespace: {why}"
            ));
        }
        if !installed("java") || !Path::new(ZK_JAR).is_file() {
            return Err(format!(
                "Pixiu needs Zookeeper: java and {ZK_JAR} (apt-get install zookeeper)"
            ));
        }
        Ok(bin)
    })();
    progress.show(&format!(
        "{}: starting the provider and the gateways",
        s.name
    ));
    let lua = dir.join("post.lua");
    let started = (|| -> Result<_, String> {
        gateway::write(&dir, "post.lua", &wrk_lua())?;
        let mut zk = None;
        let mut zk_addr = None;
        if pixiu_ok.is_ok() {
            let addr: SocketAddr = ([127, 0, 0, 1], place.port(NS_ZK)?).into();
            let zdir = dir.join("zk");
            std::fs::create_dir_all(zdir.join("data")).map_err(|e| e.to_string())?;
            gateway::write(&zdir, "zoo.cfg", &zoo_cfg(&zdir.join("data"), addr.port()))?;
            let argv = [
                "java".to_string(),
                "-Xmx256m".into(),
                "-cp".into(),
                format!("{}:{ZK_JAR}", zdir.display()),
                "org.apache.zookeeper.server.ZooKeeperServerMain".into(),
                zdir.join("zoo.cfg").display().to_string(),
            ];
            let mut p = Proc::spawn("zookeeper", &place.argv(&argv), None, &dir.join("zk.log"))?;
            match place.wait_listening(&mut p, addr, Duration::from_secs(60)) {
                Ok(()) => {
                    zk = Some(p);
                    zk_addr = Some(addr);
                }
                Err(e) => notes.push(format!("pixiu: Zookeeper did not start: {e}")),
            }
        }
        let provider_addr: SocketAddr = ([127, 0, 0, 1], place.port(NS_PROVIDER)?).into();
        let mut argv = vec![
            tools.provider.display().to_string(),
            provider_addr.port().to_string(),
        ];
        if let Some(z) = zk_addr {
            argv.push(z.to_string());
        }
        let mut provider = Proc::spawn(
            "provider",
            &place.argv(&argv),
            None,
            &dir.join("provider.log"),
        )?;
        place.wait_listening(&mut provider, provider_addr, Duration::from_secs(60))?;
        Ok((zk, zk_addr, provider, provider_addr))
    })();
    let (zk, zk_addr, mut provider, provider_addr) = match started {
        Ok(x) => x,
        Err(why) => {
            progress.advance(total);
            return skipped(s, format!("provider: {why}"));
        }
    };
    // Sluice.
    let sluice = (|| -> Result<(Proc, SocketAddr), String> {
        let sdir = dir.join("sluice");
        std::fs::create_dir_all(&sdir).map_err(|e| e.to_string())?;
        let port = place.port(NS_SLUICE)?;
        gateway::write_node_config(&sdir, port, Workers::One, ctx.access_log)?;
        gateway::write(&sdir, "apisix.yaml", &sluice_yaml(provider_addr))?;
        let argv = [
            ctx.sluice_bin.display().to_string(),
            "start".into(),
            "-c".into(),
            sdir.join("config.yaml").display().to_string(),
        ];
        let mut p = Proc::spawn("sluice", &place.argv(&argv), None, &sdir.join("sluice.log"))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        place.wait_answer(&mut p, addr, ctx.ready_timeout)?;
        Ok((p, addr))
    })();
    // Pixiu.
    let pixiu = (|| -> Result<(Proc, SocketAddr), String> {
        let bin = pixiu_ok.clone()?;
        let zk = zk_addr.ok_or("Zookeeper did not start")?;
        let pdir = dir.join("pixiu");
        std::fs::create_dir_all(&pdir).map_err(|e| e.to_string())?;
        let port = place.port(NS_PIXIU)?;
        gateway::write(&pdir, "api_config.yaml", PIXIU_API)?;
        gateway::write(&pdir, "log.yml", PIXIU_LOG)?;
        gateway::write(
            &pdir,
            "pixiu.yaml",
            &pixiu_conf(port, zk, &pdir.join("api_config.yaml")),
        )?;
        let argv = [
            bin.display().to_string(),
            "gateway".into(),
            "start".into(),
            "-c".into(),
            pdir.join("pixiu.yaml").display().to_string(),
            "-g".into(),
            pdir.join("log.yml").display().to_string(),
        ];
        let mut p = Proc::spawn("pixiu", &place.argv(&argv), None, &pdir.join("pixiu.log"))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        place.wait_answer(&mut p, addr, ctx.ready_timeout.max(Duration::from_secs(60)))?;
        Ok((p, addr))
    })();
    let direct = tools.client.clone();
    let mut results = Vec::new();
    let mut slots: Vec<(Target, usize)> = Vec::new();
    for t in Target::ALL {
        let why = match t {
            Target::Sluice => sluice.as_ref().err().cloned(),
            Target::Pixiu => pixiu.as_ref().err().cloned(),
            Target::Direct => direct.as_ref().err().cloned(),
        };
        let mut r = TargetResult::skipped(t.name(), t.driver(), 1, String::new());
        match why {
            Some(why) => {
                r.skip_reason = Some(why);
                progress.advance(ctx.rounds);
            }
            None => {
                r.skip_reason = None;
                r.status = "ok".into();
                r.workers = match t {
                    Target::Sluice => 1,
                    _ => ctx.cores,
                };
                slots.push((t, results.len()));
            }
        }
        results.push(r);
    }
    let mut client_cpu: Vec<f64> = Vec::new();
    let mut dead: Option<String> = None;
    for round in 0..ctx.rounds {
        for (t, idx) in &slots {
            progress.show(&format!(
                "{} {} round {}/{}",
                s.name,
                t.name(),
                round + 1,
                ctx.rounds
            ));
            if dead.is_none() {
                dead = provider.exited();
            }
            if let Some(why) = &dead {
                results[*idx].skip_reason = Some(format!("the provider died: {why}"));
                progress.advance(1);
                continue;
            }
            let r = match t {
                Target::Sluice => sluice.as_ref().map_err(Clone::clone).and_then(|(p, a)| {
                    measure_gateway(ctx, &place, *a, &lua, p.pid(), provider.pid())
                }),
                Target::Pixiu => pixiu.as_ref().map_err(Clone::clone).and_then(|(p, a)| {
                    measure_gateway(ctx, &place, *a, &lua, p.pid(), provider.pid())
                }),
                Target::Direct => direct.as_ref().map_err(Clone::clone).and_then(|c| {
                    measure_direct(ctx, &place, c, provider_addr, provider.pid()).map(|(r, cpu)| {
                        client_cpu.push(cpu);
                        r
                    })
                }),
            };
            match r {
                Ok(r) => results[*idx].rounds.push(r),
                Err(e) => results[*idx].skip_reason = Some(e),
            }
            progress.advance(1);
        }
    }
    drop(sluice);
    drop(pixiu);
    drop(provider);
    drop(zk);
    drop(place);
    for r in &mut results {
        r.finish();
    }
    notes.insert(
        0,
        format!(
            "POST {PATH} {BODY} → a generic call of {SERVICE}:1.0.0 hello(Map) on a dubbo-go 3.3.1 provider; wrk -c{CONCURRENCY} -t{WRK_THREADS} for the gateways, {CONCURRENCY} goroutines of a dubbo-go generic consumer for direct; {}; nothing pinned",
            match &no_ns {
                None => "all in one private network namespace".to_string(),
                Some(why) => format!("no private network namespace ({why})"),
            }
        ),
    );
    if !client_cpu.is_empty() {
        let per: Vec<String> = client_cpu.iter().map(|c| format!("{c:.1}")).collect();
        notes.push(format!(
            "direct: the client's own CPU µs/request per round: {}",
            per.join(" ")
        ));
    }
    notes.extend(target_notes(&results));
    crate::runner::finish(s, results, notes)
}

#[cfg(test)]
mod tests;
