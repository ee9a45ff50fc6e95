//! Runs the selected scenarios: keeps the mock running (restarted when the delay changes),
//! starts and configures each target, drives interleaved rounds (A B C A B C) with the chosen
//! generator, samples target CPU and peak RSS around each measured run, and assembles the report.
//! Process plumbing lives in `procs`, configs in `gateway`, instruction counts in `callgrind`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::drivers::{self, Driver};
use crate::gateway::{self, PATH};
use crate::loadgen::{run_load, LoadSpec, Stop};
use crate::noise::Sampler;
use crate::procinfo::{clock_ticks, cpu_ticks_tree, peak_rss_kib_tree, rss_kib_tree};
use crate::procs::{free_port, installed, probe, probe_head, wait_ready, Proc, ReadyError};
use crate::progress::Progress;
use crate::report::{RunResult, ScenarioReport, TargetResult};
use crate::scenario::{Scenario, TargetKind, Workers};
use crate::stats::Latency;

/// Everything the runner needs besides the scenario list.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub work: PathBuf,
    pub self_bin: PathBuf,
    pub sluice_bin: PathBuf,
    pub upstream: Option<SocketAddr>,
    pub gateway: Option<SocketAddr>,
    pub duration: Duration,
    pub warmup: Duration,
    pub rounds: usize,
    pub driver: Driver,
    pub gen_threads: usize,
    pub mock_threads: usize,
    pub body_size: usize,
    pub timeout: Duration,
    pub pin_gateway: Option<String>,
    pub pin_mock: Option<String>,
    pub peers: bool,
    pub ready_timeout: Duration,
    pub h2c: bool,
    /// Sluice's access log on (`--sluice-access-log`).
    pub access_log: bool,
    /// CPUs of the machine, counted before the generator pinned itself.
    pub cores: usize,
}

/// Pid of the mock the suite runs (0: none, or a given upstream): a measured round counts its CPU as the
/// round's own, not foreign (see `noise`).
static MOCK_PID: AtomicU32 = AtomicU32::new(0);

/// The running mock (or a given upstream address).
pub struct Mock {
    proc: Option<Proc>,
    pub addr: SocketAddr,
    delay: String,
}

impl Mock {
    /// Reuses the current mock when its delay matches, else starts a fresh one.
    pub fn ensure(cur: Option<Mock>, ctx: &Ctx, s: &Scenario) -> Result<Mock, String> {
        if let Some(addr) = ctx.upstream {
            MOCK_PID.store(0, Ordering::Relaxed);
            return Ok(Mock {
                proc: None,
                addr,
                delay: s.mock_delay.to_string(),
            });
        }
        let want = s.mock_delay.to_string();
        if let Some(m) = cur {
            if m.delay == want {
                return Ok(m);
            }
        }
        let port = free_port()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let argv: Vec<String> = vec![
            ctx.self_bin.display().to_string(),
            "mock".into(),
            "--listen".into(),
            addr.to_string(),
            "--delay".into(),
            want.clone(),
            "--threads".into(),
            ctx.mock_threads.to_string(),
            "--body-size".into(),
            ctx.body_size.to_string(),
        ];
        let mut p = Proc::spawn(
            "mock",
            &argv,
            ctx.pin_mock.as_deref(),
            &ctx.work.join("mock.log"),
        )?;
        wait_ready(addr, "/", &[], Some(&mut p), Duration::from_secs(10), false)
            .map_err(|e| format!("mock not ready: {e}"))?;
        MOCK_PID.store(p.pid(), Ordering::Relaxed);
        Ok(Mock {
            proc: Some(p),
            addr,
            delay: want,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }
}

/// A started target ready for load.
pub struct Running {
    pub kind: TargetKind,
    pub addr: SocketAddr,
    pub proc: Option<Proc>,
    pub pinned: Option<String>,
    pub workers: usize,
}

fn worker_count(ctx: &Ctx, w: Workers) -> usize {
    match w {
        Workers::One => 1,
        Workers::All => ctx.cores,
    }
}

/// Pinning for a gateway-like target: the configured CPUs for one worker, every CPU for all
/// cores (explicitly: an unpinned child would inherit the generator's pinning).
fn gateway_pin(ctx: &Ctx, s: &Scenario) -> Option<String> {
    match s.workers {
        Workers::One => ctx.pin_gateway.clone(),
        Workers::All => ctx
            .pin_gateway
            .as_ref()
            .map(|_| format!("0-{}", ctx.cores.max(1) - 1)),
    }
}

/// Starts (and configures) one target for the scenario. Err is the skip reason.
pub fn start_target(
    ctx: &Ctx,
    s: &Scenario,
    kind: TargetKind,
    upstream: SocketAddr,
    valgrind: Option<&Path>,
    tag: &str,
) -> Result<Running, String> {
    let headers = gateway::request_headers(s);
    let workers = worker_count(ctx, s.workers);
    let keepalive = s.concurrency.max(64);
    let pin = gateway_pin(ctx, s);
    // One directory per target instance: configs and logs must not be shared between two
    // instances of the same target (driver-agreement runs two).
    let dir = ctx
        .work
        .join(format!("{}-{}-{tag}", kind.name(), sanitize(&s.name)));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let wrap = |argv: Vec<String>| -> Vec<String> {
        match valgrind {
            Some(out) => {
                let mut v = vec![
                    "valgrind".to_string(),
                    "--tool=callgrind".into(),
                    format!("--callgrind-out-file={}", out.display()),
                ];
                v.extend(argv);
                v
            }
            None => argv,
        }
    };
    let limit = if valgrind.is_some() {
        ctx.ready_timeout * 4
    } else {
        ctx.ready_timeout
    };
    match kind {
        TargetKind::Direct => Ok(Running {
            kind,
            addr: upstream,
            proc: None,
            pinned: ctx.pin_mock.clone(),
            workers: ctx.mock_threads,
        }),
        TargetKind::Sluice => {
            if let Some(addr) = ctx.gateway {
                // A gateway the user runs: configured by them, measured without CPU figures.
                wait_ready(addr, PATH, &headers, None, limit, ctx.h2c)
                    .map_err(|e| skip_reason(s, &e))?;
                return Ok(Running {
                    kind,
                    addr,
                    proc: None,
                    pinned: None,
                    workers,
                });
            }
            let port = free_port()?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            gateway::write_node_config(&dir, port, s.workers, ctx.access_log)?;
            gateway::configure(&dir, s, upstream, keepalive)?;
            let argv = wrap(vec![
                ctx.sluice_bin.display().to_string(),
                "start".into(),
                "-c".into(),
                dir.join("config.yaml").display().to_string(),
            ]);
            let mut p = Proc::spawn("sluice", &argv, pin.as_deref(), &dir.join("sluice.log"))?;
            let limit = if s.routes >= 10_000 { limit * 4 } else { limit };
            wait_ready(addr, PATH, &headers, Some(&mut p), limit, ctx.h2c)
                .map_err(|e| skip_reason(s, &e))?;
            if !ctx.h2c {
                check_plugins(addr, s)?;
            }
            Ok(Running {
                kind,
                addr,
                proc: Some(p),
                pinned: pin,
                workers,
            })
        }
        TargetKind::Nginx | TargetKind::Haproxy => {
            let prog = if kind == TargetKind::Nginx {
                "nginx"
            } else {
                "haproxy"
            };
            if !installed(prog) {
                return Err(format!("{prog} not installed"));
            }
            let port = free_port()?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let argv = if kind == TargetKind::Nginx {
                let conf = gateway::nginx_conf(
                    &dir,
                    port,
                    upstream,
                    workers,
                    keepalive,
                    valgrind.is_none(),
                    ctx.h2c,
                );
                let conf = gateway::nginx_with_plugins(&conf, s);
                gateway::write(&dir, "nginx.conf", &conf)?;
                vec![
                    "nginx".into(),
                    "-p".into(),
                    dir.display().to_string(),
                    "-c".into(),
                    dir.join("nginx.conf").display().to_string(),
                ]
            } else {
                gateway::write(
                    &dir,
                    "haproxy.cfg",
                    &gateway::haproxy_conf(port, upstream, workers, keepalive, ctx.h2c),
                )?;
                vec![
                    "haproxy".into(),
                    "-db".into(),
                    "-f".into(),
                    dir.join("haproxy.cfg").display().to_string(),
                ]
            };
            let mut p = Proc::spawn(
                prog,
                &wrap(argv),
                pin.as_deref(),
                &dir.join(format!("{prog}.log")),
            )?;
            wait_ready(addr, PATH, &headers, Some(&mut p), limit, ctx.h2c)
                .map_err(|e| format!("{prog} not ready: {e}"))?;
            Ok(Running {
                kind,
                addr,
                proc: Some(p),
                pinned: pin,
                workers,
            })
        }
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A gateway that ignores plugins it does not know answers 200 anyway: check that each plugin of
/// the scenario visibly acts (key-auth rejects a request without `apikey` with 401; limit-count
/// adds `X-RateLimit-Limit`). prometheus has no visible effect on the proxied response.
fn check_plugins(addr: SocketAddr, s: &Scenario) -> Result<(), String> {
    let names = s.plugins.names();
    if names.contains(&"key-auth") {
        let code = probe(addr, PATH, &[])?;
        if code != 401 {
            return Err(format!(
                "plugin not available (key-auth: a request without apikey answered {code}, not 401)"
            ));
        }
    }
    if names.contains(&"limit-count") {
        let (_, head) = probe_head(addr, PATH, &gateway::request_headers(s))?;
        if !head.contains("\r\nx-ratelimit-limit:") {
            return Err("plugin not available (limit-count: no X-RateLimit-Limit header)".into());
        }
    }
    Ok(())
}

/// Skip reason for a gateway that never answered 200: plugin scenarios name the missing plugin.
fn skip_reason(s: &Scenario, e: &ReadyError) -> String {
    match e {
        ReadyError::Status(404 | 500) if !s.plugins.names().is_empty() => {
            format!(
                "plugin not available ({}: {e})",
                s.plugins.names().join("+")
            )
        }
        _ => format!("gateway not ready: {e}"),
    }
}

/// One measured run against a ready target (warm-up first, then CPU sampled around the run).
pub fn measure(ctx: &Ctx, s: &Scenario, t: &Running, driver: Driver) -> Result<RunResult, String> {
    let headers = gateway::load_headers(s);
    let mut spec = LoadSpec::new(t.addr, PATH, s.concurrency, s.stop);
    spec.headers = headers.clone();
    spec.spread = gateway::spread(s);
    spec.threads = ctx.gen_threads;
    spec.rate = s.rate;
    spec.timeout = ctx.timeout;
    spec.h2c = ctx.h2c;
    if !ctx.warmup.is_zero() {
        let mut w = spec.clone();
        w.stop = Stop::Duration(ctx.warmup);
        run_load(&w)?;
    }
    let pid = t.proc.as_ref().map(Proc::pid);
    let mut roots: Vec<u32> = pid.into_iter().collect();
    match MOCK_PID.load(Ordering::Relaxed) {
        0 => {}
        m => roots.push(m),
    }
    let sampler = Sampler::start(&roots);
    let cpu0 = pid.and_then(cpu_ticks_tree);
    // External drivers do closed-loop timed runs only; anything else uses the built-in generator.
    // They send one request over and over: a spread scenario always uses the built-in generator.
    let external =
        s.rate.is_none() && matches!(s.stop, Stop::Duration(_)) && spec.spread.is_empty();
    let (requests, elapsed, bytes, latency, errors) = match (driver, s.stop) {
        (Driver::Wrk, Stop::Duration(d)) if external => {
            let m = drivers::wrk(t.addr, PATH, &headers, ctx.gen_threads, s.concurrency, d)?;
            (m.requests, m.elapsed, m.bytes, m.latency, m.errors)
        }
        (Driver::Ab, Stop::Requests(n)) if s.rate.is_none() && spec.spread.is_empty() => {
            let m = drivers::ab(t.addr, PATH, &headers, s.concurrency, n)?;
            (m.requests, m.elapsed, m.bytes, m.latency, m.errors)
        }
        (Driver::H2load, Stop::Duration(d)) if external => {
            let m = drivers::h2load(
                t.addr,
                PATH,
                &headers,
                ctx.gen_threads,
                s.concurrency,
                d,
                ctx.h2c,
            )?;
            (m.requests, m.elapsed, m.bytes, m.latency, m.errors)
        }
        _ => {
            let r = run_load(&spec)?;
            (
                r.requests,
                r.elapsed,
                r.bytes,
                Latency::from_histogram(&r.hist),
                r.errors,
            )
        }
    };
    let cpu1 = pid.and_then(cpu_ticks_tree);
    let noise = sampler.finish();
    let secs = elapsed.as_secs_f64().max(1e-9);
    let cpu_us_per_req = match (cpu0, cpu1) {
        (Some(a), Some(b)) if requests > 0 => {
            Some((b.saturating_sub(a)) as f64 * 1e6 / clock_ticks() as f64 / requests as f64)
        }
        _ => None,
    };
    Ok(RunResult {
        requests,
        duration_s: secs,
        rps: requests as f64 / secs,
        bytes_per_s: bytes as f64 / secs,
        latency_us: latency,
        errors,
        cpu_us_per_req,
        origin_cpu_us_per_req: None,
        peak_rss_kib: pid.and_then(peak_rss_kib_tree),
        instructions_per_req: None,
        pct_of_baseline: None,
        contaminated: noise.is_some_and(|n| n.contaminated()),
        noise,
    })
}

/// Number of progress steps a scenario takes.
pub fn steps(ctx: &Ctx, s: &Scenario) -> usize {
    if s.grpc_transcode {
        return crate::grpc::steps(ctx);
    }
    if s.dubbo {
        return crate::dubbo::steps(ctx);
    }
    if s.cluster.is_some() {
        return crate::cluster::steps(ctx);
    }
    let targets = s
        .targets
        .iter()
        .filter(|t| ctx.peers || matches!(t, TargetKind::Direct | TargetKind::Sluice))
        .count();
    if s.callgrind {
        targets
    } else if s.compare_drivers {
        2 * targets * ctx.rounds
    } else {
        targets * ctx.rounds
    }
}

/// Runs one load scenario (not callgrind) with interleaved rounds across its targets.
pub fn run_scenario(
    ctx: &Ctx,
    s: &Scenario,
    mock: &Mock,
    progress: &mut Progress,
) -> ScenarioReport {
    let mut results: Vec<TargetResult> = Vec::new();
    let mut running: Vec<(Running, Driver, usize)> = Vec::new();
    let kinds: Vec<TargetKind> = s
        .targets
        .iter()
        .copied()
        .filter(|t| ctx.peers || matches!(t, TargetKind::Direct | TargetKind::Sluice))
        .collect();
    let plan: Vec<(TargetKind, Driver)> = if s.compare_drivers {
        kinds
            .iter()
            .flat_map(|k| [(*k, Driver::Builtin), (*k, Driver::Wrk)])
            .collect()
    } else {
        kinds
            .iter()
            .map(|k| (*k, s.driver.unwrap_or(ctx.driver)))
            .collect()
    };
    for (kind, driver) in &plan {
        progress.show(&format!("{} {}: starting", s.name, kind.name()));
        if *driver == Driver::Wrk && !installed("wrk")
            || *driver == Driver::H2load && !installed("h2load")
            || *driver == Driver::Ab && !installed("ab")
        {
            results.push(TargetResult::skipped(
                kind.name(),
                driver.name(),
                0,
                format!("{} not installed", driver.name()),
            ));
            progress.advance(ctx.rounds);
            continue;
        }
        match start_target(ctx, s, *kind, mock.addr, None, driver.name()) {
            Ok(r) => {
                // Idle: answered the readiness probe, no load yet.
                let idle_rss_kib = r.proc.as_ref().and_then(|p| rss_kib_tree(p.pid()));
                results.push(TargetResult {
                    target: kind.name().into(),
                    status: "ok".into(),
                    skip_reason: None,
                    driver: driver.name().into(),
                    workers: r.workers,
                    pinned_cpus: r.pinned.clone(),
                    rounds: Vec::new(),
                    median: None,
                    idle_rss_kib,
                });
                running.push((r, *driver, results.len() - 1));
            }
            Err(why) => {
                results.push(TargetResult::skipped(
                    kind.name(),
                    driver.name(),
                    worker_count(ctx, s.workers),
                    why,
                ));
                progress.advance(ctx.rounds);
            }
        }
    }
    for round in 0..ctx.rounds {
        for (t, driver, idx) in &running {
            progress.show(&format!(
                "{} {} ({}) round {}/{}",
                s.name,
                t.kind.name(),
                driver.name(),
                round + 1,
                ctx.rounds
            ));
            match measure(ctx, s, t, *driver) {
                Ok(r) => results[*idx].rounds.push(r),
                Err(e) => results[*idx].skip_reason = Some(e),
            }
            progress.advance(1);
        }
    }
    drop(running);
    for r in &mut results {
        r.finish();
    }
    let mut notes = Vec::new();
    if s.compare_drivers {
        for k in &kinds {
            let rps = |d: &str| {
                results
                    .iter()
                    .find(|r| r.driver == d && r.target == k.name())
                    .and_then(|r| r.median.as_ref())
                    .map(|m| m.rps)
            };
            if let (Some(b), Some(w)) = (rps("builtin"), rps("wrk")) {
                let diff = (b - w).abs() / w.max(1e-9) * 100.0;
                notes.push(format!(
                    "{}: builtin {b:.0} req/s vs wrk {w:.0} req/s: {diff:.1}% apart ({})",
                    k.name(),
                    if diff <= 10.0 {
                        "agree within 10%"
                    } else {
                        "DISAGREE by more than 10%"
                    }
                ));
            }
        }
    }
    finish(s, results, notes)
}

/// Wraps results into a scenario report; skipped when no target ran.
pub fn finish(s: &Scenario, results: Vec<TargetResult>, notes: Vec<String>) -> ScenarioReport {
    let ok = results.iter().any(|r| r.median.is_some());
    let skip_reason = if ok {
        None
    } else {
        results
            .iter()
            .find_map(|r| r.skip_reason.clone())
            .or(Some("no target".into()))
    };
    ScenarioReport {
        scenario: s.clone(),
        status: if ok { "ok" } else { "skipped" }.into(),
        skip_reason,
        results,
        notes,
    }
}

/// Seconds since `t` as f64.
pub fn secs_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}
