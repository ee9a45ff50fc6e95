//! `cluster-churn` (issue 18 item 6): a real etcd (private data dir, ephemeral loopback ports), one
//! `control_plane` and N `data_plane` Sluice nodes on it, the scenario's routes written straight to etcd in APISIX's
//! key layout (`/apisix/routes/{id}`, transactions of 128 puts), then per round three phases of the round's duration
//! with open-loop proxy load on every data plane: without writes, with route churn through the control plane's
//! Admin API, and with churn plus an etcd compaction (to the current revision, physical) half way. Each write gives
//! a route a fresh uri (`/c/{seq}`); one prober per node polls that uri (every 1 ms) from the write's answer until
//! the node serves it (200); the time from the PUT being sent to that 200 is the write's propagation delay to that
//! node (nodes often serve a write before the control plane's answer arrives). Owns its processes; all stop on drop.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::apply::{admin_request, route_body};
use crate::gateway::{self, ADMIN_KEY, PATH};
use crate::loadgen::{run_load, LoadResult, LoadSpec, Stop};
use crate::procinfo::{clock_ticks, cpu_ticks_tree, peak_rss_kib_tree};
use crate::procs::{free_port, installed, probe, wait_ready, Proc};
use crate::progress::Progress;
use crate::report::{RunResult, ScenarioReport, TargetResult};
use crate::runner::{finish, Ctx, Mock};
use crate::scenario::Scenario;
use crate::stats::{new_histogram, Latency};

/// What a cluster scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClusterLoad {
    /// Data-plane nodes.
    pub data_planes: usize,
    /// Route writes per second through the control plane during the churn phases.
    pub writes_per_sec: f64,
    /// Open-loop proxy requests per second sent to each data plane.
    pub rate_per_node: f64,
}

/// A write not served by a node within this long is counted lost.
const LOST_AFTER: Duration = Duration::from_secs(10);
/// Writer threads of the churn phases.
const WRITERS: usize = 4;
/// Pause between two polls of a node for the writes it does not serve yet.
const POLL: Duration = Duration::from_millis(1);

/// The cluster scenarios (`scenario::all` lists them).
pub fn scenarios(duration: Duration) -> Vec<Scenario> {
    let mut v = Vec::new();
    for (name, routes, writes, rate, what) in [
        (
            "cluster-churn",
            10_000usize,
            50.0f64,
            500.0f64,
            "10k routes, 50 writes/s",
        ),
        (
            "cluster-churn-tiny",
            100,
            5.0,
            100.0,
            "100 routes, 5 writes/s (plumbing check)",
        ),
    ] {
        let mut s = Scenario::base(
            name,
            "cluster",
            &format!(
                "etcd + 1 control plane + 3 data planes, {what}: propagation to every node, proxy p99 per node \
                 without churn / with churn / with an etcd compaction, node CPU per request and per write, RSS. \
                 Needs etcd."
            ),
            &[crate::scenario::TargetKind::Sluice],
            duration,
        );
        s.routes = routes;
        s.concurrency = 8;
        s.rate = Some(rate * 3.0);
        s.cluster = Some(ClusterLoad {
            data_planes: 3,
            writes_per_sec: writes,
            rate_per_node: rate,
        });
        v.push(s);
    }
    v
}

/// Progress steps: three phases per round.
pub fn steps(ctx: &Ctx) -> usize {
    3 * ctx.rounds
}

struct Cluster {
    etcd: Proc,
    etcd_addr: SocketAddr,
    cp: Proc,
    cp_admin: SocketAddr,
    /// (process, proxy address) per data plane.
    dps: Vec<(Proc, SocketAddr)>,
    load_s: f64,
    ready_s: f64,
}

/// Runs one cluster scenario.
pub fn run(ctx: &Ctx, s: &Scenario, mock: &Mock, progress: &mut Progress) -> ScenarioReport {
    let Some(cl) = s.cluster else {
        return finish(s, Vec::new(), vec!["not a cluster scenario".into()]);
    };
    progress.show(&format!("{}: starting etcd and the cluster", s.name));
    let c = match start(ctx, s, &cl, mock.addr) {
        Ok(c) => c,
        Err(why) => {
            progress.advance(steps(ctx));
            let t = TargetResult::skipped("sluice", "cluster", 1, why);
            return finish(s, vec![t], Vec::new());
        }
    };
    let mut notes = vec![format!(
        "{} routes written straight to etcd in {:.2} s; control plane and {} data planes serving them {:.2} s later; \
         cluster processes pinned to {}, load generator and probers elsewhere",
        s.routes,
        c.load_s,
        c.dps.len(),
        c.ready_s,
        ctx.pin_gateway.as_deref().unwrap_or("no CPU (not pinned)")
    )];
    let phases = ["quiet", "churn", "churn+compaction"];
    let mut nodes: Vec<Vec<TargetResult>> = (0..c.dps.len())
        .map(|i| {
            phases
                .iter()
                .map(|p| target(&format!("dp{}", i + 1), p, ctx))
                .collect()
        })
        .collect();
    let mut prop = [
        target("propagation", "churn", ctx),
        target("propagation", "churn+compaction", ctx),
    ];
    let mut cpu_per_write: Vec<Vec<f64>> = vec![Vec::new(); c.dps.len() + 2];
    let mut quiet_cpu: Vec<Option<f64>> = vec![None; c.dps.len()];
    if !ctx.warmup.is_zero() {
        let _ = phase(ctx, s, &cl, &c, mock.addr, ctx.warmup, false, false, 0);
    }
    let mut seq = 0u64;
    for round in 0..ctx.rounds {
        for (pi, pname) in phases.iter().enumerate() {
            progress.show(&format!(
                "{} round {}/{}: {pname}",
                s.name,
                round + 1,
                ctx.rounds
            ));
            let writes = pi > 0;
            let compact = pi == 2;
            let r = phase(
                ctx,
                s,
                &cl,
                &c,
                mock.addr,
                ctx.duration,
                writes,
                compact,
                seq,
            );
            progress.advance(1);
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    for n in nodes.iter_mut() {
                        n[pi].skip_reason = Some(e.clone());
                    }
                    continue;
                }
            };
            seq = r.next_seq;
            for (i, run) in r.nodes.iter().enumerate() {
                if pi == 0 {
                    quiet_cpu[i] = run.cpu_us_per_req;
                }
                nodes[i][pi].rounds.push(run.clone());
            }
            if !writes {
                notes.push(format!(
                    "round {} {pname}: the cluster's CPUs ({}) were {} busy",
                    round + 1,
                    ctx.pin_gateway.as_deref().unwrap_or("not pinned"),
                    r.pinned_busy
                        .map_or("-".into(), |b| format!("{:.0}%", b * 100.0)),
                ));
            }
            if writes {
                let ok = r.writes_ok.max(1) as f64;
                for (i, run) in r.nodes.iter().enumerate() {
                    // The node's CPU in this phase minus what its requests cost without writes, per write.
                    if let (Some(total), Some(q)) = (r.node_cpu_us[i], quiet_cpu[i]) {
                        let probes = r.probes[i] as f64;
                        let extra = total - q * (run.requests as f64 + probes);
                        cpu_per_write[i].push(extra / ok);
                    }
                }
                if let Some(v) = r.cp_cpu_us {
                    cpu_per_write[c.dps.len()].push(v / ok);
                }
                if let Some(v) = r.etcd_cpu_us {
                    cpu_per_write[c.dps.len() + 1].push(v / ok);
                }
                let p = &mut prop[pi - 1];
                p.rounds.push(RunResult {
                    requests: r.writes_ok,
                    duration_s: r.secs,
                    rps: r.writes_ok as f64 / ctx.duration.as_secs_f64().max(1e-9),
                    latency_us: Latency::from_histogram(&r.all_nodes),
                    errors: crate::loadgen::Errors {
                        non_2xx: r.writes_failed,
                        timeout: r.lost,
                        ..Default::default()
                    },
                    ..RunResult::default()
                });
                let per_node: Vec<String> = r
                    .per_node
                    .iter()
                    .enumerate()
                    .map(|(i, h)| {
                        let l = Latency::from_histogram(h);
                        format!(
                            "dp{} p50 {:.1} / p99 {:.1} ms",
                            i + 1,
                            l.p50 / 1e3,
                            l.p99 / 1e3
                        )
                    })
                    .collect();
                let all = Latency::from_histogram(&r.all_nodes);
                let ans = Latency::from_histogram(&r.answered);
                notes.push(format!(
                    "round {} {pname}: the control plane answered the PUTs in p50 {:.1} ms, p99 {:.1} ms ({} writer threads: \
                     at most {:.0} writes/s at that p50); the cluster's CPUs ({}) were {} busy",
                    round + 1,
                    ans.p50 / 1e3,
                    ans.p99 / 1e3,
                    WRITERS,
                    WRITERS as f64 * 1e6 / ans.p50.max(1.0),
                    ctx.pin_gateway.as_deref().unwrap_or("not pinned"),
                    r.pinned_busy
                        .map_or("-".into(), |b| format!("{:.0}%", b * 100.0)),
                ));
                notes.push(format!(
                    "round {} {pname}: {} writes answered ({:.1}/s over the phase), {} refused or failed, {} not served by every node \
                     within {} s; PUT sent to served by all {} nodes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({})",
                    round + 1,
                    r.writes_ok,
                    r.writes_ok as f64 / ctx.duration.as_secs_f64().max(1e-9),
                    r.writes_failed,
                    r.lost,
                    LOST_AFTER.as_secs(),
                    c.dps.len(),
                    all.p50 / 1e3,
                    all.p99 / 1e3,
                    all.max / 1e3,
                    per_node.join(", ")
                ));
            }
            if let Some(cmp) = &r.compaction {
                notes.push(format!("round {} {pname}: {cmp}", round + 1));
            }
        }
    }
    drop(c);
    let mut results = Vec::new();
    for p in prop.iter_mut() {
        p.finish();
    }
    for n in nodes.iter_mut() {
        for t in n.iter_mut() {
            t.finish();
        }
    }
    // Side by side per node: p99 and errors without churn, with churn, with compaction.
    for (i, n) in nodes.iter().enumerate() {
        let fig: Vec<String> = n
            .iter()
            .map(|t| match &t.median {
                Some(m) => format!(
                    "{} p99 {:.0} us, {:.1} us CPU/req, {} errors, peak RSS {} MiB",
                    t.driver,
                    m.latency_us.p99,
                    m.cpu_us_per_req.unwrap_or(f64::NAN),
                    m.errors.non_2xx + m.errors.failures(),
                    m.peak_rss_kib.unwrap_or(0) / 1024
                ),
                None => format!("{} not measured", t.driver),
            })
            .collect();
        notes.push(format!("dp{} (medians): {}", i + 1, fig.join("; ")));
    }
    let names: Vec<String> = (1..=nodes.len())
        .map(|i| format!("dp{i}"))
        .chain(["control plane".to_string(), "etcd".to_string()])
        .collect();
    let cpu: Vec<String> = names
        .iter()
        .zip(&cpu_per_write)
        .filter_map(|(n, v)| crate::stats::median(v).map(|m| format!("{n} {m:.0} us")))
        .collect();
    if !cpu.is_empty() {
        notes.push(format!(
            "CPU per write (median over churn phases; a data plane's is its CPU minus its requests' and probes' cost \
             without writes): {}",
            cpu.join(", ")
        ));
    }
    results.extend(prop);
    for n in nodes {
        results.extend(n);
    }
    finish(s, results, notes)
}

fn target(name: &str, driver: &str, ctx: &Ctx) -> TargetResult {
    TargetResult {
        target: name.into(),
        status: "ok".into(),
        skip_reason: None,
        driver: driver.into(),
        workers: 1,
        pinned_cpus: ctx.pin_gateway.clone(),
        rounds: Vec::new(),
        median: None,
        idle_rss_kib: None,
    }
}

fn start(
    ctx: &Ctx,
    s: &Scenario,
    cl: &ClusterLoad,
    upstream: SocketAddr,
) -> Result<Cluster, String> {
    if ctx.gateway.is_some() {
        return Err("cluster scenarios start their own nodes (--gateway given)".into());
    }
    if !installed("etcd") {
        return Err("etcd not installed (apt-get install -y etcd-server)".into());
    }
    let dir = ctx.work.join(format!("cluster-{}", s.name));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let pin = ctx.pin_gateway.as_deref();
    let etcd_addr: SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let peer = format!("http://127.0.0.1:{}", free_port()?);
    let url = format!("http://{etcd_addr}");
    let argv: Vec<String> = [
        "etcd",
        "--name",
        "bench",
        "--data-dir",
        &dir.join("etcd").display().to_string(),
        "--listen-client-urls",
        &url,
        "--advertise-client-urls",
        &url,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("bench={peer}"),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut etcd = Proc::spawn("etcd", &argv, pin, &dir.join("etcd.log"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(why) = etcd.exited() {
            return Err(why);
        }
        if matches!(http(etcd_addr, "GET", "/health", &[], ""), Ok((200, b)) if b.contains("true"))
        {
            break;
        }
        if Instant::now() > deadline {
            return Err("etcd not healthy after 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let t0 = Instant::now();
    load_routes(etcd_addr, s.routes.max(2), upstream)?;
    let load_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let admin_port = free_port()?;
    let cp = start_node(
        ctx,
        &dir.join("cp"),
        "control_plane",
        etcd_addr,
        free_port()?,
        admin_port,
    )?;
    let cp_admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let mut dps = Vec::new();
    for i in 1..=cl.data_planes {
        let port = free_port()?;
        let p = start_node(
            ctx,
            &dir.join(format!("dp{i}")),
            "data_plane",
            etcd_addr,
            port,
            free_port()?,
        )?;
        dps.push((p, SocketAddr::from(([127, 0, 0, 1], port))));
    }
    let limit = ctx.ready_timeout * 8;
    let mut cp = cp;
    let key = [("X-API-KEY".to_string(), ADMIN_KEY.to_string())];
    wait_ready(
        cp_admin,
        "/apisix/admin/routes/1",
        &key,
        Some(&mut cp),
        limit,
        false,
    )
    .map_err(|e| format!("control plane not ready: {e}"))?;
    for (i, (p, addr)) in dps.iter_mut().enumerate() {
        wait_ready(*addr, PATH, &[], Some(p), limit, false)
            .map_err(|e| format!("data plane {} not ready: {e}", i + 1))?;
    }
    Ok(Cluster {
        etcd,
        etcd_addr,
        cp,
        cp_admin,
        dps,
        load_s,
        ready_s: t1.elapsed().as_secs_f64(),
    })
}

fn start_node(
    ctx: &Ctx,
    dir: &Path,
    role: &str,
    etcd: SocketAddr,
    port: u16,
    admin_port: u16,
) -> Result<Proc, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    gateway::write(
        dir,
        "config.yaml",
        &node_config(role, etcd, port, admin_port),
    )?;
    let argv = vec![
        ctx.sluice_bin.display().to_string(),
        "start".into(),
        "-c".into(),
        dir.join("config.yaml").display().to_string(),
    ];
    Proc::spawn(
        role,
        &argv,
        ctx.pin_gateway.as_deref(),
        &dir.join("sluice.log"),
    )
}

/// `config.yaml` of a node in `role` on `etcd` (one worker, no access log, Admin API on loopback with the bench key).
pub fn node_config(role: &str, etcd: SocketAddr, port: u16, admin_port: u16) -> String {
    format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: true\n  enable_control: false\n  ssl:\n    enable: false\n\
         nginx_config:\n  worker_processes: 1\n  http:\n    enable_access_log: false\n\
         deployment:\n  role: {role}\n  role_{role}:\n    config_provider: etcd\n\
         \x20 etcd:\n    host:\n      - http://{etcd}\n    prefix: /apisix\n    timeout: 5\n\
         \x20 admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n\
         \x20   admin_key:\n      - name: admin\n        key: {ADMIN_KEY}\n        role: admin\n\
         plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
         sluice:\n  data_dir: data\n"
    )
}

/// The stored value of route `id` (APISIX's shape, as the Admin API would have written it).
pub fn route_value(id: usize, upstream: SocketAddr) -> String {
    let uri = if id == 1 {
        PATH.to_string()
    } else {
        format!("/r/{id}")
    };
    format!(
        "{{\"id\":\"{id}\",\"uri\":\"{uri}\",\"upstream\":{{\"type\":\"roundrobin\",\"nodes\":{{\"{upstream}\":1}},\
         \"keepalive_pool\":{{\"size\":64,\"idle_timeout\":60,\"requests\":100000}}}},\"create_time\":1,\"update_time\":1}}"
    )
}

/// Writes routes 1..=n to `/apisix/routes/{id}` in transactions of 128 puts (etcd's default `--max-txn-ops`).
fn load_routes(etcd: SocketAddr, n: usize, upstream: SocketAddr) -> Result<(), String> {
    let ids: Vec<usize> = (1..=n).collect();
    for chunk in ids.chunks(128) {
        let ops: Vec<String> = chunk
            .iter()
            .map(|id| {
                format!(
                    "{{\"requestPut\":{{\"key\":\"{}\",\"value\":\"{}\"}}}}",
                    b64(format!("/apisix/routes/{id}").as_bytes()),
                    b64(route_value(*id, upstream).as_bytes())
                )
            })
            .collect();
        let body = format!("{{\"success\":[{}]}}", ops.join(","));
        match http(etcd, "POST", "/v3/kv/txn", &[], &body)? {
            (200, _) => {}
            (code, b) => return Err(format!("etcd txn answered {code}: {}", b.trim())),
        }
    }
    Ok(())
}

/// etcd's current revision (a range over a key that does not exist still carries the header).
fn etcd_revision(etcd: SocketAddr) -> Result<u64, String> {
    let (code, body) = http(
        etcd,
        "POST",
        "/v3/kv/range",
        &[],
        &format!("{{\"key\":\"{}\"}}", b64(b"/none")),
    )?;
    if code != 200 {
        return Err(format!("etcd range answered {code}"));
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    v["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| format!("no revision in {body}"))
}

/// What one phase measured.
struct Phase {
    nodes: Vec<RunResult>,
    /// Each data plane's CPU over the phase, µs.
    node_cpu_us: Vec<Option<f64>>,
    cp_cpu_us: Option<f64>,
    etcd_cpu_us: Option<f64>,
    /// Probe requests each node answered.
    probes: Vec<u64>,
    writes_ok: u64,
    writes_failed: u64,
    lost: u64,
    /// Per write, the time until every node served it (µs).
    all_nodes: Histogram<u64>,
    per_node: Vec<Histogram<u64>>,
    compaction: Option<String>,
    secs: f64,
    next_seq: u64,
    /// Per write, the time from the PUT being sent to the control plane's answer (µs).
    answered: Histogram<u64>,
    /// How busy the CPUs the cluster is pinned to were over the phase (0..1 of their capacity).
    pinned_busy: Option<f64>,
}

/// (busy, total) jiffies of the CPUs in `list` (taskset syntax: `1`, `0-1`, `0,3`), from /proc/stat.
fn cpu_jiffies(list: &str) -> Option<(u64, u64)> {
    let mut want = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => want.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse().ok()?),
            None => want.push(part.trim().parse::<usize>().ok()?),
        }
    }
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (mut busy, mut total) = (0u64, 0u64);
    for line in stat.lines() {
        let mut f = line.split_whitespace();
        let Some(n) = f
            .next()
            .and_then(|c| c.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if !want.contains(&n) {
            continue;
        }
        let v: Vec<u64> = f.take(8).filter_map(|x| x.parse().ok()).collect();
        let all: u64 = v.iter().sum();
        // idle + iowait are the not-busy columns.
        busy += all - v.get(3).copied().unwrap_or(0) - v.get(4).copied().unwrap_or(0);
        total += all;
    }
    (total > 0).then_some((busy, total))
}

fn cpu_us(pid: u32) -> Option<u64> {
    cpu_ticks_tree(pid)
}

#[allow(clippy::too_many_arguments)]
fn phase(
    ctx: &Ctx,
    s: &Scenario,
    cl: &ClusterLoad,
    c: &Cluster,
    upstream: SocketAddr,
    d: Duration,
    writes: bool,
    compact: bool,
    mut seq: u64,
) -> Result<Phase, String> {
    let n = c.dps.len();
    let dp_pids: Vec<u32> = c.dps.iter().map(|(p, _)| p.pid()).collect();
    let t_cpu = |pid: u32| cpu_us(pid);
    let before: Vec<Option<u64>> = dp_pids.iter().map(|p| t_cpu(*p)).collect();
    let cp0 = t_cpu(c.cp.pid());
    let etcd0 = t_cpu(c.etcd.pid());
    let pinned0 = ctx.pin_gateway.as_deref().and_then(cpu_jiffies);
    let mut answered = new_histogram();
    let t0 = Instant::now();
    let mut per_node = vec![new_histogram(); n];
    let mut all_nodes = new_histogram();
    let (mut writes_ok, mut writes_failed, mut lost) = (0u64, 0u64, 0u64);
    let mut probes = vec![0u64; n];
    let mut compaction = None;
    let results: Vec<Result<LoadResult, String>> = std::thread::scope(|sc| {
        let loads: Vec<_> = c
            .dps
            .iter()
            .map(|(_, addr)| {
                let mut spec = LoadSpec::new(*addr, PATH, s.concurrency, Stop::Duration(d));
                spec.rate = Some(cl.rate_per_node);
                spec.timeout = ctx.timeout;
                sc.spawn(move || run_load(&spec))
            })
            .collect();
        if writes {
            let (txs, rxs): (Vec<_>, Vec<_>) =
                (0..n).map(|_| mpsc::channel::<(u64, Instant)>()).unzip();
            let probers: Vec<_> = rxs
                .into_iter()
                .zip(c.dps.iter().map(|(_, a)| *a))
                .map(|(rx, addr)| sc.spawn(move || prober(addr, rx)))
                .collect();
            let compactor = compact.then(|| {
                let etcd = c.etcd_addr;
                sc.spawn(move || {
                    std::thread::sleep(d / 2);
                    compact_now(etcd)
                })
            });
            // WRITERS threads share the schedule (thread k takes slots k, k + WRITERS, ...), so one slow answer
            // does not hold back the others' writes.
            let period = Duration::from_secs_f64(WRITERS as f64 / cl.writes_per_sec.max(0.1));
            let routes = s.routes.max(3);
            let end = t0 + d;
            let base = seq;
            let next_seq = Arc::new(AtomicU64::new(seq));
            let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let writers: Vec<_> = (0..WRITERS)
                .map(|k| {
                    let txs = txs.clone();
                    let (next_seq, ok, failed) = (next_seq.clone(), ok.clone(), failed.clone());
                    let cp = c.cp_admin;
                    sc.spawn(move || {
                        let mut took = Vec::new();
                        let mut next = t0 + period.mul_f64(k as f64 / WRITERS as f64);
                        while Instant::now() < end {
                            let now = Instant::now();
                            if now < next {
                                std::thread::sleep((next - now).min(end - now));
                                continue;
                            }
                            next += period;
                            let seq = next_seq.fetch_add(1, Ordering::Relaxed) + 1;
                            let id = 2 + (seq as usize) % (routes - 1);
                            let body = route_body(&format!("/c/{seq}"), upstream);
                            let path = format!("/apisix/admin/routes/{id}");
                            // Timed from the PUT being sent: a node often serves the write before the control
                            // plane's answer arrives, so timing from the answer would read 0.
                            let sent = Instant::now();
                            let res =
                                admin_request(cp, "PUT", &path, &body, Duration::from_secs(10));
                            took.push(sent.elapsed().as_micros() as u64);
                            match res {
                                Ok(200 | 201) => {
                                    ok.fetch_add(1, Ordering::Relaxed);
                                    for tx in &txs {
                                        let _ = tx.send((seq, sent));
                                    }
                                }
                                _ => {
                                    failed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        took
                    })
                })
                .collect();
            for w in writers {
                for us in w.join().unwrap_or_default() {
                    let _ = answered.record(us.max(1) * 1000);
                }
            }
            seq = next_seq.load(Ordering::Relaxed).max(base);
            writes_ok = ok.load(Ordering::Relaxed);
            writes_failed = failed.load(Ordering::Relaxed);
            drop(txs);
            // Per write: (slowest node's delay, nodes that served it).
            let mut served: std::collections::HashMap<u64, (u64, usize)> = Default::default();
            for (i, p) in probers.into_iter().enumerate() {
                let (done, lost_here, count) = p.join().unwrap_or_default();
                probes[i] = count;
                lost += lost_here;
                for (sq, us) in done {
                    let _ = per_node[i].record(us.max(1) * 1000);
                    let e = served.entry(sq).or_insert((0, 0));
                    *e = (e.0.max(us), e.1 + 1);
                }
            }
            for (us, nodes) in served.values() {
                if *nodes == n {
                    let _ = all_nodes.record((*us).max(1) * 1000);
                }
            }
            if let Some(h) = compactor {
                compaction = Some(
                    h.join()
                        .unwrap_or_else(|_| "compaction thread panicked".into()),
                );
            }
        }
        loads
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("load thread panicked".into()))
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let tick_us = 1e6 / clock_ticks() as f64;
    let diff = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 * tick_us),
        _ => None,
    };
    let mut nodes = Vec::new();
    let mut node_cpu = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        let r = r?;
        let cpu = diff(before[i], t_cpu(dp_pids[i]));
        node_cpu.push(cpu);
        let el = r.elapsed.as_secs_f64().max(1e-9);
        nodes.push(RunResult {
            requests: r.requests,
            duration_s: el,
            rps: r.requests as f64 / el,
            bytes_per_s: r.bytes as f64 / el,
            latency_us: Latency::from_histogram(&r.hist),
            errors: r.errors,
            cpu_us_per_req: cpu
                .filter(|_| r.requests > 0)
                .map(|c| c / r.requests as f64),
            peak_rss_kib: peak_rss_kib_tree(dp_pids[i]),
            instructions_per_req: None,
            pct_of_baseline: None,
            noise: None,
            contaminated: false,
            origin_cpu_us_per_req: None,
        });
    }
    Ok(Phase {
        nodes,
        node_cpu_us: node_cpu,
        cp_cpu_us: diff(cp0, t_cpu(c.cp.pid())),
        etcd_cpu_us: diff(etcd0, t_cpu(c.etcd.pid())),
        probes,
        writes_ok,
        writes_failed,
        lost,
        all_nodes,
        per_node,
        compaction,
        secs,
        next_seq: seq,
        answered,
        pinned_busy: match (pinned0, ctx.pin_gateway.as_deref().and_then(cpu_jiffies)) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                Some((b1 - b0) as f64 / (t1 - t0) as f64)
            }
            _ => None,
        },
    })
}

/// Polls `addr` for each write's uri from its answer until served; returns ((seq, µs), lost, probes sent).
fn prober(addr: SocketAddr, rx: mpsc::Receiver<(u64, Instant)>) -> (Vec<(u64, u64)>, u64, u64) {
    let mut pending: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut done = Vec::new();
    let (mut lost, mut count) = (0u64, 0u64);
    let mut open = true;
    while open || !pending.is_empty() {
        if pending.is_empty() {
            match rx.recv() {
                Ok(w) => pending.push_back(w),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(w) => pending.push_back(w),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        pending.retain(|(sq, at)| {
            count += 1;
            if let Ok(200) = probe(addr, &format!("/c/{sq}"), &[]) {
                done.push((*sq, at.elapsed().as_micros() as u64));
                return false;
            }
            if at.elapsed() > LOST_AFTER {
                lost += 1;
                return false;
            }
            true
        });
        if !pending.is_empty() {
            std::thread::sleep(POLL);
        }
    }
    (done, lost, count)
}

/// Compacts etcd to its current revision (physical, as `etcdctl compact --physical`); a line for the report.
fn compact_now(etcd: SocketAddr) -> String {
    let t0 = Instant::now();
    let rev = match etcd_revision(etcd) {
        Ok(r) => r,
        Err(e) => return format!("etcd compaction not done: {e}"),
    };
    let body = format!("{{\"revision\":\"{rev}\",\"physical\":true}}");
    match http(etcd, "POST", "/v3/kv/compaction", &[], &body) {
        Ok((200, _)) => format!(
            "etcd compacted to revision {rev} (physical) half way through the phase in {:.1} ms",
            t0.elapsed().as_secs_f64() * 1e3
        ),
        Ok((code, b)) => format!("etcd compaction to {rev} answered {code}: {}", b.trim()),
        Err(e) => format!("etcd compaction to {rev} failed: {e}"),
    }
}

/// One blocking HTTP/1.1 request with `Connection: close`; (status, body).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String), String> {
    let timeout = Duration::from_secs(10);
    let mut c = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    c.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    c.read_to_end(&mut out).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.trim().parse().ok())
        .ok_or_else(|| format!("bad response: {}", head.lines().next().unwrap_or("")))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Ok((
        code,
        if chunked {
            dechunk(rest)
        } else {
            rest.to_string()
        },
    ))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Standard base64 with padding (etcd's JSON gateway carries keys and values so).
pub fn b64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for ch in data.chunks(3) {
        let b = [ch[0], *ch.get(1).unwrap_or(&0), *ch.get(2).unwrap_or(&0)];
        let v = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= ch.len() {
                out.push(T[(v >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b64_matches_rfc4648() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64(b"/apisix/routes/1"), "L2FwaXNpeC9yb3V0ZXMvMQ==");
    }

    #[test]
    fn dechunk_joins_chunks() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }

    #[test]
    fn route_value_is_an_apisix_route() {
        let up: SocketAddr = "127.0.0.1:1980".parse().expect("addr");
        let v: serde_json::Value = serde_json::from_str(&route_value(7, up)).expect("json");
        assert_eq!(v["id"], "7");
        assert_eq!(v["uri"], "/r/7");
        assert_eq!(v["upstream"]["nodes"]["127.0.0.1:1980"], 1);
        let v: serde_json::Value = serde_json::from_str(&route_value(1, up)).expect("json");
        assert_eq!(v["uri"], PATH);
    }
}
