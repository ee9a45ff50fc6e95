//! Live-apply scenarios (issue 4): Sluice in traditional mode (embedded store, Admin API on loopback with a key),
//! the scenario's routes seeded from `apisix.yaml` on first start, then either PUT-to-applied time of single-route
//! writes (`PUT /apisix/admin/routes/2?wait=applied`, timed end to end by the client) or the proxy's latency under
//! closed-loop load without and with a steady stream of writes to other routes. Owns its gateway process and a
//! minimal blocking Admin API client; it does not touch the standalone-mode targets of `runner`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::drivers::Driver;
use crate::gateway::{self, ADMIN_KEY, PATH};
use crate::procs::{free_port, probe, wait_ready, Proc};
use crate::progress::Progress;
use crate::report::{RunResult, ScenarioReport, TargetResult};
use crate::runner::{finish, measure, Ctx, Mock, Running};
use crate::scenario::{AdminLoad, Scenario, TargetKind, Workers};
use crate::stats::{new_histogram, Latency};

/// A traditional-mode gateway with its Admin API address.
struct Started {
    run: Running,
    admin: SocketAddr,
    /// The mock the seeded routes point at; writes point there too.
    upstream: SocketAddr,
    ready_s: f64,
}

/// Runs one `admin` scenario; a scenario without `admin` is reported as skipped.
pub fn run(ctx: &Ctx, s: &Scenario, mock: &Mock, progress: &mut Progress) -> ScenarioReport {
    let Some(load) = s.admin else {
        return finish(s, Vec::new(), vec!["not a live-apply scenario".into()]);
    };
    let workers = match s.workers {
        Workers::One => 1,
        Workers::All => ctx.cores,
    };
    progress.show(&format!("{}: starting sluice (traditional mode)", s.name));
    let started = match start(ctx, s, mock.addr) {
        Ok(st) => st,
        Err(why) => {
            progress.advance(ctx.rounds);
            let t = TargetResult::skipped("sluice", "admin", workers, why);
            return finish(s, vec![t], Vec::new());
        }
    };
    let mut notes = vec![format!(
        "{} routes seeded from apisix.yaml; gateway ready after {:.2} s",
        s.routes, started.ready_s
    )];
    let results = match load {
        AdminLoad::Apply { writes } => {
            apply_rounds(ctx, s, &started, writes, workers, progress, &mut notes)
        }
        AdminLoad::Writes { per_sec } => {
            writes_rounds(ctx, s, &started, per_sec, workers, progress, &mut notes)
        }
    };
    drop(started);
    finish(s, results, notes)
}

fn start(ctx: &Ctx, s: &Scenario, upstream: SocketAddr) -> Result<Started, String> {
    if ctx.gateway.is_some() {
        return Err("live-apply scenarios start their own gateway (--gateway given)".into());
    }
    let dir = ctx.work.join(format!("sluice-{}-admin", s.name));
    // A fresh store every time: the seed only happens on an empty one.
    let _ = std::fs::remove_dir_all(dir.join("data"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (port, admin_port) = (free_port()?, free_port()?);
    gateway::write_traditional_config(&dir, port, admin_port, s.workers)?;
    gateway::configure(&dir, s, upstream, s.concurrency.max(64))?;
    let argv = vec![
        ctx.sluice_bin.display().to_string(),
        "start".into(),
        "-c".into(),
        dir.join("config.yaml").display().to_string(),
    ];
    let pin = ctx
        .pin_gateway
        .clone()
        .filter(|_| s.workers == Workers::One);
    let t0 = Instant::now();
    let mut p = Proc::spawn("sluice", &argv, pin.as_deref(), &dir.join("sluice.log"))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let limit = if s.routes >= 10_000 {
        ctx.ready_timeout * 8
    } else {
        ctx.ready_timeout
    };
    wait_ready(addr, PATH, &[], Some(&mut p), limit, false)
        .map_err(|e| format!("gateway not ready: {e}"))?;
    let ready_s = t0.elapsed().as_secs_f64();
    Ok(Started {
        run: Running {
            kind: TargetKind::Sluice,
            addr,
            proc: Some(p),
            pinned: pin,
            workers: 1,
        },
        admin: ([127, 0, 0, 1], admin_port).into(),
        upstream,
        ready_s,
    })
}

/// The body of a route write: route `id` at `uri`, same upstream shape as the seeded routes.
pub fn route_body(uri: &str, upstream: SocketAddr) -> String {
    format!(
        "{{\"uri\":\"{uri}\",\"upstream\":{{\"type\":\"roundrobin\",\"nodes\":{{\"{upstream}\":1}}}}}}"
    )
}

/// One blocking Admin API request with the bench key; returns the status code.
pub fn admin_request(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<u16, String> {
    let mut c = TcpStream::connect_timeout(&admin, timeout).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let _ = c.set_nodelay(true);
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nX-API-KEY: {ADMIN_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    c.read_to_end(&mut out).map_err(|e| e.to_string())?;
    let line = out.split(|b| *b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.trim().parse().ok())
        .ok_or_else(|| format!("bad admin response: {}", text.trim()))
}

fn apply_rounds(
    ctx: &Ctx,
    s: &Scenario,
    st: &Started,
    writes: usize,
    workers: usize,
    progress: &mut Progress,
    notes: &mut Vec<String>,
) -> Vec<TargetResult> {
    let mut t = TargetResult {
        target: "sluice".into(),
        status: "ok".into(),
        skip_reason: None,
        driver: "admin-put".into(),
        workers,
        pinned_cpus: st.run.pinned.clone(),
        rounds: Vec::new(),
        median: None,
        idle_rss_kib: None,
    };
    let upstream = st.upstream;
    let timeout = Duration::from_secs(60);
    let mut seq = 0usize;
    for round in 0..ctx.rounds {
        progress.show(&format!(
            "{} PUT ?wait=applied round {}/{}",
            s.name,
            round + 1,
            ctx.rounds
        ));
        let mut hist = new_histogram();
        let t0 = Instant::now();
        let mut failed = None;
        for _ in 0..writes {
            seq += 1;
            let body = route_body(&format!("/w/{seq}"), upstream);
            let w0 = Instant::now();
            match admin_request(
                st.admin,
                "PUT",
                "/apisix/admin/routes/2?wait=applied",
                &body,
                timeout,
            ) {
                Ok(200 | 201) => {
                    let _ = hist.record(w0.elapsed().as_nanos() as u64);
                }
                Ok(code) => failed = Some(format!("PUT answered {code}")),
                Err(e) => failed = Some(format!("PUT failed: {e}")),
            }
            if failed.is_some() {
                break;
            }
        }
        // `?wait=applied` promised the data plane serves the last write.
        if failed.is_none() {
            match probe(st.run.addr, &format!("/w/{seq}"), &[]) {
                Ok(200) => {}
                other => failed = Some(format!("applied route not served: {other:?}")),
            }
        }
        if let Some(e) = failed {
            t.skip_reason = Some(e);
            progress.advance(1);
            break;
        }
        let elapsed = t0.elapsed().as_secs_f64();
        t.rounds.push(RunResult {
            requests: writes as u64,
            duration_s: elapsed,
            rps: writes as f64 / elapsed.max(1e-9),
            latency_us: Latency::from_histogram(&hist),
            ..RunResult::default()
        });
        progress.advance(1);
    }
    t.finish();
    if let Some(m) = &t.median {
        notes.push(format!(
            "PUT-to-applied at {} routes: median {:.1} ms, p99 {:.1} ms, max {:.1} ms (median of {} rounds x {writes} writes)",
            s.routes,
            m.latency_us.p50 / 1000.0,
            m.latency_us.p99 / 1000.0,
            m.latency_us.max / 1000.0,
            t.rounds.len()
        ));
    }
    vec![t]
}

fn writes_rounds(
    ctx: &Ctx,
    s: &Scenario,
    st: &Started,
    per_sec: f64,
    workers: usize,
    progress: &mut Progress,
    notes: &mut Vec<String>,
) -> Vec<TargetResult> {
    let label = format!("builtin, {per_sec:.0} writes/s");
    let mk = |driver: &str| TargetResult {
        target: "sluice".into(),
        status: "ok".into(),
        skip_reason: None,
        driver: driver.into(),
        workers,
        pinned_cpus: st.run.pinned.clone(),
        rounds: Vec::new(),
        median: None,
        idle_rss_kib: None,
    };
    let (mut quiet, mut busy) = (mk("builtin"), mk(&label));
    let upstream = st.upstream;
    let routes = s.routes.max(3);
    for round in 0..ctx.rounds {
        progress.show(&format!(
            "{} round {}/{}: no writes, then {per_sec:.0} writes/s",
            s.name,
            round + 1,
            ctx.rounds
        ));
        match measure(ctx, s, &st.run, Driver::Builtin) {
            Ok(r) => quiet.rounds.push(r),
            Err(e) => quiet.skip_reason = Some(e),
        }
        let writer = Writer::start(st.admin, upstream, per_sec, routes);
        let r = measure(ctx, s, &st.run, Driver::Builtin);
        let (done, failed, secs) = writer.stop();
        match r {
            Ok(r) => busy.rounds.push(r),
            Err(e) => busy.skip_reason = Some(e),
        }
        notes.push(format!(
            "round {}: {done} writes accepted ({:.0}/s achieved), {failed} failed",
            round + 1,
            done as f64 / secs.max(1e-9)
        ));
        progress.advance(1);
    }
    quiet.finish();
    busy.finish();
    if let (Some(a), Some(b)) = (&quiet.median, &busy.median) {
        notes.push(format!(
            "proxy p99 at {} routes: {:.0} us without writes, {:.0} us with {per_sec:.0} writes/s ({:+.0}%); errors with writes: {}",
            s.routes,
            a.latency_us.p99,
            b.latency_us.p99,
            (b.latency_us.p99 / a.latency_us.p99.max(1e-9) - 1.0) * 100.0,
            b.errors.non_2xx + b.errors.connect + b.errors.timeout + b.errors.io
        ));
    }
    vec![quiet, busy]
}

/// Paced writers: PUTs to routes 2..=routes (never route 1, the measured one) at `per_sec` in total, spread over
/// a few threads so one slow commit does not hold back the schedule.
struct Writer {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
    t0: Instant,
}

impl Writer {
    const THREADS: usize = 4;

    fn start(admin: SocketAddr, upstream: SocketAddr, per_sec: f64, routes: usize) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let period = Duration::from_secs_f64(Self::THREADS as f64 / per_sec.max(0.1));
        let t0 = Instant::now();
        let threads = (0..Self::THREADS)
            .map(|k| {
                let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
                std::thread::spawn(move || {
                    let mut next = t0 + period.mul_f64(k as f64 / Self::THREADS as f64);
                    let mut i = k;
                    while !stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        if now < next {
                            std::thread::sleep((next - now).min(Duration::from_millis(50)));
                            continue;
                        }
                        next += period;
                        i += Self::THREADS;
                        let id = 2 + i % (routes - 1);
                        let body = route_body(&format!("/r/{id}"), upstream);
                        let path = format!("/apisix/admin/routes/{id}");
                        match admin_request(admin, "PUT", &path, &body, Duration::from_secs(30)) {
                            Ok(200 | 201) => done.fetch_add(1, Ordering::Relaxed),
                            _ => failed.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                })
            })
            .collect();
        Writer {
            stop,
            done,
            failed,
            threads,
            t0,
        }
    }

    /// Stops the writers; (accepted, failed, seconds).
    fn stop(self) -> (u64, u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        (
            self.done.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.t0.elapsed().as_secs_f64(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn route_body_is_an_apisix_route() {
        let up: SocketAddr = "127.0.0.1:1980".parse().expect("addr");
        let v: serde_json::Value = serde_json::from_str(&route_body("/w/3", up)).expect("json");
        assert_eq!(v["uri"], "/w/3");
        assert_eq!(v["upstream"]["nodes"]["127.0.0.1:1980"], 1);
        assert_eq!(v["upstream"]["type"], "roundrobin");
    }

    #[test]
    fn admin_request_sends_key_and_body_and_reads_status() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            c.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.ends_with(b"{\"uri\":\"/x\"}") {
                let n = c.read(&mut chunk).expect("read");
                assert!(n > 0, "client closed early");
                buf.extend_from_slice(&chunk[..n]);
            }
            c.write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
                .expect("write");
            String::from_utf8(buf).expect("utf8")
        });
        let code = admin_request(
            addr,
            "PUT",
            "/apisix/admin/routes/2?wait=applied",
            "{\"uri\":\"/x\"}",
            Duration::from_secs(5),
        )
        .expect("request");
        assert_eq!(code, 201);
        let seen = server.join().expect("server");
        assert!(seen.starts_with("PUT /apisix/admin/routes/2?wait=applied HTTP/1.1\r\n"));
        assert!(seen.contains(&format!("X-API-KEY: {ADMIN_KEY}\r\n")));
        assert!(seen.contains("Content-Length: 12\r\n"));
    }
}
