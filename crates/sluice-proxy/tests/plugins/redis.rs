//! limit-count with policies `redis` and `redis-cluster` against real redis-server processes (Debian's
//! redis-server package) on 127.0.0.1 ephemeral ports. Two gateways with separate [`Shared`] state stand in
//! for two APISIX nodes sharing one Redis. Skipped (with a note; a failure under CI=true) when redis-server is not installed. The
//! process and two-node helpers are shared with limit-req's tests (`req_redis.rs`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{route, Gw, Origin};

pub(crate) struct Redis {
    pub(crate) port: u16,
    child: Child,
    _dir: TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn have_redis() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::ci::skip_unless_ci("redis-server not installed (apt-get install redis-server)");
    }
    ok
}

/// A free port whose cluster bus port (+10000) is free too.
pub(crate) fn free_port() -> u16 {
    for _ in 0..200 {
        let p = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p < 55000 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair");
}

fn ping(port: u16) -> bool {
    let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
    let mut b = [0u8; 16];
    c.write_all(b"PING\r\n").is_ok() && c.read(&mut b).is_ok_and(|n| b[..n].starts_with(b"+PONG"))
}

pub(crate) fn start_redis(cluster: bool) -> Redis {
    // A port found free may be taken by a parallel test before redis-server binds it (in cluster mode its bus
    // port too): such a server exits at once, and another port is tried.
    for _ in 0..5 {
        if let Some(r) = try_start_redis_on(free_port(), cluster) {
            return r;
        }
    }
    panic!("redis-server did not start on 5 ports");
}

/// A redis-server on 127.0.0.1:`port`.
pub(crate) fn start_redis_on(port: u16, cluster: bool) -> Redis {
    try_start_redis_on(port, cluster).expect("redis-server exited at start")
}

/// [`start_redis_on`], `None` when the server exits before it answers (its port was taken).
fn try_start_redis_on(port: u16, cluster: bool) -> Option<Redis> {
    let dir = std::env::temp_dir().join(format!("sluice-redis-{port}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .arg("--dir")
    .arg(&dir)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if cluster {
        cmd.args([
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ]);
    }
    let child = cmd.spawn().expect("spawn redis-server");
    let mut r = Redis {
        port,
        child,
        _dir: TempDir(dir),
    };
    let t0 = Instant::now();
    while !ping(port) {
        if r.child.try_wait().ok().flatten().is_some() {
            return None;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(r)
}

pub(crate) fn start_cluster() -> Vec<Redis> {
    let nodes: Vec<Redis> = (0..3).map(|_| start_redis(true)).collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let t0 = Instant::now();
    loop {
        let ok = nodes.iter().all(|n| {
            Command::new("redis-cli")
                .args(["-p", &n.port.to_string(), "cluster", "info"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
        });
        if ok {
            return nodes;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "cluster did not converge"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `conf` with policy `redis-cluster` on `nodes`.
pub(crate) fn on_cluster(nodes: &[Redis], mut conf: Value) -> Value {
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    conf["policy"] = json!("redis-cluster");
    conf["redis_cluster_nodes"] = json!(urls);
    conf["redis_cluster_name"] = json!("test");
    conf
}

/// `conf` with policy `redis` on 127.0.0.1:`port`.
pub(crate) fn on_redis(port: u16, mut conf: Value) -> Value {
    conf["policy"] = json!("redis");
    conf["redis_host"] = json!("127.0.0.1");
    conf["redis_port"] = json!(port);
    conf
}

/// A route `/hello` with one plugin.
pub(crate) fn plugin_cfg(o: &Origin, plugin: &str, conf: Value) -> Value {
    json!({"routes": [route("r1", "/hello", o, json!({plugin: conf}))]})
}

/// Two gateways with separate plugin state (two "nodes") on one configuration.
pub(crate) fn two_nodes(o: &Origin, plugin: &str, conf: Value) -> (Gw, Gw) {
    let a = Gw::start_with(plugin_cfg(o, plugin, conf.clone()), Arc::default(), 1).unwrap();
    let b = Gw::start_with(plugin_cfg(o, plugin, conf), Arc::default(), 1).unwrap();
    (a, b)
}

/// Six requests alternating between two nodes, `gap` apart so each sync can land, on a limit of three
/// cluster-wide: exactly the first three pass, whichever node they hit.
pub(crate) fn three_pass_then_503(a: &Gw, b: &Gw, gap: Duration) {
    let statuses: Vec<u16> = (0..6)
        .map(|i| {
            let gw = if i % 2 == 0 { a } else { b };
            let status = gw.get("/hello", &[]).status;
            std::thread::sleep(gap);
            status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 503, 503, 503]);
}

/// A fresh 3-node Redis Cluster and origin, or `None` (the test is skipped) when redis-server is not installed.
pub(crate) fn cluster_and_origin() -> Option<(Vec<Redis>, Origin)> {
    have_redis().then(|| (start_cluster(), Origin::start()))
}

/// A fresh redis-server and origin, or `None` (the test is skipped) when redis-server is not installed.
pub(crate) fn redis_and_origin() -> Option<(Redis, Origin)> {
    have_redis().then(|| (start_redis(false), Origin::start()))
}

/// With Redis unreachable, `conf` answers 500 (`{"error_msg": msg}`, or nginx's page when `msg` is `None`, as
/// APISIX's bare `return 500`), and passes everything with `allow_degradation`.
pub(crate) fn down_fails_closed_or_degrades(plugin: &str, conf: Value, msg: Option<&str>) {
    let o = Origin::start();
    let mut conf = on_redis(free_port(), conf);
    conf["redis_timeout"] = json!(100);
    let gw = Gw::start(plugin_cfg(&o, plugin, conf.clone()));
    let r = gw.get("/hello", &[]);
    assert_eq!(r.status, 500);
    match msg {
        Some(msg) => assert_eq!(r.json(), json!({ "error_msg": msg })),
        None => assert!(r.body.contains("500 Internal Server Error"), "{}", r.body),
    }
    drop(gw);
    conf["allow_degradation"] = json!(true);
    let gw = Gw::start(plugin_cfg(&o, plugin, conf));
    for _ in 0..5 {
        assert_eq!(gw.get("/hello", &[]).status, 200);
    }
}

/// 8 clients send 40 requests each, spread over the nodes: how many were admitted (and a measurement line on
/// stderr).
pub(crate) fn admitted_under_load(gws: &[&Gw], what: &str, limit: usize) -> usize {
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    let ok = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (addrs, ok) = (addrs.clone(), ok.clone());
            std::thread::spawn(move || {
                for j in 0..40 {
                    let addr = addrs[(i + j) % addrs.len()];
                    if crate::request(addr, "GET", "/hello", &[], "").status == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let admitted = ok.load(Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "redis {what} accuracy: limit {limit}, admitted {admitted} of 320 ({:.0} req/s over {} nodes), overshoot {}",
        320.0 / secs,
        gws.len(),
        admitted.saturating_sub(limit)
    );
    admitted
}

fn two(o: &Origin, lc: Value) -> (Gw, Gw) {
    two_nodes(o, "limit-count", lc)
}

/// `n` gateways ("nodes") with separate plugin state on one configuration.
fn nodes(o: &Origin, n: usize, lc: &Value) -> Vec<Gw> {
    (0..n)
        .map(|_| {
            Gw::start_with(plugin_cfg(o, "limit-count", lc.clone()), Arc::default(), 1).unwrap()
        })
        .collect()
}

/// `redis-cli -p port args...`'s output.
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Commands Redis ran so far (INFO commandstats): the scripts run (`EVAL`, one round trip each) and every command
/// counted (the scripts' own calls included; INFO and CONFIG excluded).
pub(crate) fn redis_commands(port: u16) -> (u64, u64) {
    let (mut evals, mut all) = (0, 0);
    for l in redis_cli(port, &["INFO", "commandstats"]).lines() {
        let Some((name, rest)) = l.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
            continue;
        };
        let calls = rest
            .split("calls=")
            .nth(1)
            .and_then(|c| c.split(',').next())
            .and_then(|c| c.parse::<u64>().ok())
            .unwrap_or(0);
        if name == "info" || name.starts_with("config") {
            continue;
        }
        if name == "eval" || name == "evalsha" {
            evals += calls;
        }
        all += calls;
    }
    (evals, all)
}

/// `total` requests for one key (`X-K: key`) from 8 client threads spread over `gws` at once: how many passed.
fn burst(gws: &[Gw], total: usize, key: &str) -> usize {
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    let ok = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (addrs, ok, key) = (addrs.clone(), ok.clone(), key.to_owned());
            let n = total / 8 + usize::from(t < total % 8);
            std::thread::spawn(move || {
                for i in 0..n {
                    let addr = addrs[(t + i) % addrs.len()];
                    let r = crate::request(addr, "GET", "/hello", &[("X-K", &key)], "");
                    match r.status {
                        200 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        503 => {}
                        s => panic!("unexpected status {s}: {}", r.body),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    ok.load(Ordering::Relaxed)
}

#[test]
fn redis_policy_counts_across_nodes() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    let (a, b) = two(&o, on_redis(r.port, json!({"count": 3, "time_window": 60})));
    // Exact from the first request on, whichever node it hits, with APISIX's quota headers.
    let first = a.get("/hello", &[]);
    assert_eq!(first.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("2"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("60"));
    let second = b.get("/hello", &[]);
    assert_eq!(
        (second.status, second.header("x-ratelimit-remaining")),
        (200, Some("1"))
    );
    assert_eq!(
        a.get("/hello", &[]).header("x-ratelimit-remaining"),
        Some("0")
    );
    let resp = b.get("/hello", &[]);
    assert_eq!(
        (resp.status, resp.header("x-ratelimit-remaining")),
        (503, Some("0"))
    );
    assert_eq!(a.get("/hello", &[]).status, 503);
    drop((a, b));
    // A second configuration has its own counters.
    let (a, b) = two(
        &o,
        on_redis(
            r.port,
            json!({"count": 3, "time_window": 60, "key": "http_x_k"}),
        ),
    );
    three_pass_then_503(&a, &b, Duration::ZERO);
}

#[test]
fn redis_cluster_policy_counts_across_nodes() {
    let Some((nodes, o)) = cluster_and_origin() else {
        return;
    };
    let (a, b) = two(
        &o,
        on_cluster(&nodes, json!({"count": 3, "time_window": 60})),
    );
    three_pass_then_503(&a, &b, Duration::ZERO);
    drop((a, b));
    // Bursts across three nodes on the cluster: never more than the count.
    let lc = on_cluster(
        &nodes,
        json!({"count": 50, "time_window": 60, "key": "http_x_k"}),
    );
    let gws = self::nodes(&o, 3, &lc);
    for i in 0..5 {
        let admitted = burst(&gws, 100, &format!("c{i}"));
        assert!(admitted <= 50, "burst {i}: {admitted} admitted of count 50");
        assert!(
            admitted >= 45,
            "burst {i}: only {admitted} admitted of count 50"
        );
    }
}

/// 20 bursts of 2 x count requests, each on its own key, from 8 clients spread over 2 and over 3 nodes: never one
/// request more than the count (the batched syncs this replaced let 100 to 195 through with count 100), nearly all
/// of the count admitted, and far fewer Redis commands than requests (printed: the figures in
/// docs/plugins/limit-count.md).
#[test]
fn redis_policy_bursts_never_exceed_the_count() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    const COUNT: usize = 100;
    let lc = on_redis(
        r.port,
        json!({"count": COUNT, "time_window": 60, "key": "http_x_k"}),
    );
    for n in [2, 3] {
        let gws = nodes(&o, n, &lc);
        let before = redis_commands(r.port);
        let mut admitted = Vec::new();
        for i in 0..20 {
            admitted.push(burst(&gws, 2 * COUNT, &format!("n{n}-b{i}")));
        }
        let after = redis_commands(r.port);
        let (trips, commands) = (after.0 - before.0, after.1 - before.1);
        let requests = 20 * 2 * COUNT;
        eprintln!(
            "limit-count redis, {n} nodes: admitted per burst {admitted:?} (count {COUNT}); {trips} round trips \
             (EVAL) and {commands} redis commands in all for {requests} requests ({:.3} and {:.3} per request)",
            trips as f64 / requests as f64,
            commands as f64 / requests as f64
        );
        assert!(
            admitted.iter().all(|&a| a <= COUNT),
            "overshoot: {admitted:?}"
        );
        assert!(
            admitted.iter().all(|&a| a >= COUNT * 9 / 10),
            "under-admitted: {admitted:?}"
        );
        assert!(
            trips * 4 < requests as u64,
            "{trips} redis round trips for {requests} requests"
        );
    }
}

/// Bursts straddling a window's end: a 3 s window on one key, a burst at its start, one starting just before it ends
/// and one right after, over 2 and 3 nodes: what passes in total stays within the two windows' counts, and the
/// second window admits. Then tokens leased in a window are never used in the next one: nodes hold leftovers, the
/// rest of the window is used up elsewhere (`SET .. 0 KEEPTTL`, as other nodes would), and after the window ends a
/// burst gets exactly the new window's count.
#[test]
fn redis_policy_window_edges_never_exceed_the_count() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    const COUNT: usize = 40;
    let lc = on_redis(
        r.port,
        json!({"count": COUNT, "time_window": 3, "key": "http_x_k"}),
    );
    for n in [2, 3] {
        let gws = nodes(&o, n, &lc);
        let key = format!("edge{n}");
        let t0 = Instant::now();
        let b1 = burst(&gws, 2 * COUNT, &key);
        let edge = Duration::from_millis(3000 - 40);
        std::thread::sleep(edge.saturating_sub(t0.elapsed()));
        let b2 = burst(&gws, 2 * COUNT, &key);
        // Surely in the second window (the first opened at b1's first request).
        std::thread::sleep(Duration::from_millis(3200).saturating_sub(t0.elapsed()));
        let b3 = burst(&gws, 2 * COUNT, &key);
        let spent = t0.elapsed();
        eprintln!("limit-count redis window edge, {n} nodes: {b1} + {b2} + {b3} admitted (count {COUNT} per 3 s window) in {spent:?}");
        assert_eq!(b1, COUNT, "first window");
        assert!(b1 + b2 + b3 <= 2 * COUNT, "{b1} + {b2} + {b3}");
        if spent < Duration::from_millis(5900) {
            // b3 ran inside the second window, which admitted (during b2 or b3).
            assert!(b2 + b3 > 0, "{b1} + {b2} + {b3}");
        }
    }

    // Leftovers do not spill: a group names the Redis key.
    let lc = on_redis(
        r.port,
        json!({"count": 80, "time_window": 2, "key": "k", "key_type": "constant", "group": "spill"}),
    );
    let gws = nodes(&o, 2, &lc);
    let t0 = Instant::now();
    assert_eq!(gws[0].get("/hello", &[]).status, 200);
    assert_eq!(gws[1].get("/hello", &[]).status, 200);
    assert_eq!(
        redis_cli(
            r.port,
            &["SET", "plugin-limit-count:group:spill:k", "0", "KEEPTTL"]
        )
        .trim(),
        "OK"
    );
    // The nodes still serve what they leased (80/8 and 70/8 tokens, one used each)...
    for _ in 0..3 {
        assert_eq!(gws[0].get("/hello", &[]).status, 200);
        assert_eq!(gws[1].get("/hello", &[]).status, 200);
    }
    // ...but not after the window ended: then only the new window's 80.
    std::thread::sleep(Duration::from_millis(2100).saturating_sub(t0.elapsed()));
    let after = burst(&gws, 3 * 80, "ignored");
    assert_eq!(after, 80, "leftover tokens spilled into the next window");
}

#[test]
fn redis_down_fails_closed_or_degrades() {
    if have_redis() {
        down_fails_closed_or_degrades(
            "limit-count",
            json!({"count": 3, "time_window": 60}),
            Some("failed to limit count"),
        );
    }
}

/// Redis going away under a running gateway: a request that needs Redis gets APISIX's 500 (or passes uncounted
/// with `allow_degradation`); once Redis is back, counting resumes within a connect (the time from Redis answering
/// PING to the first request counted is printed: docs/plugins/limit-count.md).
#[test]
fn redis_outage_and_recovery() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    let port = r.port;
    let conf = on_redis(
        port,
        json!({"count": 2, "time_window": 60, "key": "http_x_k", "redis_timeout": 200}),
    );
    let strict = Gw::start(plugin_cfg(&o, "limit-count", conf.clone()));
    let mut lenient = conf;
    lenient["allow_degradation"] = json!(true);
    let lenient = Gw::start(plugin_cfg(&o, "limit-count", lenient));
    assert_eq!(strict.get("/hello", &[("X-K", "a")]).status, 200);
    assert_eq!(lenient.get("/hello", &[("X-K", "a")]).status, 200);
    drop(r);
    // Each new key needs a lease from Redis, which is gone.
    let down = strict.get("/hello", &[("X-K", "b")]);
    assert_eq!(
        (down.status, down.json()),
        (500, json!({"error_msg": "failed to limit count"}))
    );
    for i in 0..5 {
        let k = format!("c{i}");
        let resp = lenient.get("/hello", &[("X-K", &k)]);
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("x-ratelimit-remaining"), None, "uncounted");
    }
    let _back = start_redis_on(port, false);
    let t0 = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let resp = strict.get("/hello", &[("X-K", "b")]);
        if resp.status == 200 {
            assert_eq!(resp.header("x-ratelimit-remaining"), Some("1"));
            break;
        }
        assert_eq!(resp.status, 500);
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "still failing {:?} after Redis came back",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    eprintln!(
        "limit-count redis recovery: first request counted {:?} after Redis answered PING ({tries} tries)",
        t0.elapsed()
    );
    assert_eq!(strict.get("/hello", &[("X-K", "b")]).status, 200);
    assert_eq!(strict.get("/hello", &[("X-K", "b")]).status, 503);
}

/// User + system CPU time (clock ticks of 10 ms) of this process's gateway threads: the workers and the Redis
/// threads, not the test's client or origin.
fn cpu_ticks() -> u64 {
    let mut total = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !(comm.starts_with("sluice-worker") || comm.contains("redis")) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    total
}

/// CPU per request of policy redis against policy local (one node, one keep-alive client, a count never reached;
/// the gateway's threads only): a measurement, run alone with `--ignored --nocapture` (see
/// docs/plugins/limit-count.md).
#[test]
#[ignore]
fn redis_policy_cpu_per_request() {
    let Some((r, o)) = redis_and_origin() else {
        return;
    };
    const N: usize = 20_000;
    let base = json!({"count": 1_000_000, "time_window": 600, "key": "k", "key_type": "constant"});
    for (name, lc) in [
        ("local", base.clone()),
        ("redis", on_redis(r.port, base.clone())),
    ] {
        let gw = Gw::start_with(plugin_cfg(&o, "limit-count", lc), Arc::default(), 1).unwrap();
        let mut c = TcpStream::connect(gw.addr).unwrap();
        let req = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut buf = vec![0u8; 64 * 1024];
        let mut one = |c: &mut TcpStream| {
            c.write_all(req).unwrap();
            // The origin's answer is small: one read holds it (a short read would only add a request's skew).
            let n = c.read(&mut buf).unwrap();
            assert!(
                buf[..n].starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&buf[..n])
            );
        };
        for _ in 0..1000 {
            one(&mut c);
        }
        let (cmd0, cpu0, t0) = (redis_commands(r.port).0, cpu_ticks(), Instant::now());
        for _ in 0..N {
            one(&mut c);
        }
        let (cmds, ticks, wall) = (
            redis_commands(r.port).0 - cmd0,
            cpu_ticks() - cpu0,
            t0.elapsed(),
        );
        eprintln!(
            "limit-count {name}: {:.1} µs gateway CPU per request, {:.1} µs wall, {:.4} redis round trips per request",
            ticks as f64 * 10_000.0 / N as f64,
            wall.as_secs_f64() * 1e6 / N as f64,
            cmds as f64 / N as f64
        );
    }
}

/// A Redis Sentinel (redis-server in sentinel mode) on a free port, monitoring 127.0.0.1:`master` as `m1` with a
/// quorum of one; `password` sets its `requirepass`.
fn start_sentinel(master: u16, password: Option<&str>) -> Redis {
    for _ in 0..5 {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("sluice-sentinel-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor m1 127.0.0.1 {master} 1\n\
             sentinel down-after-milliseconds m1 1000\nsentinel failover-timeout m1 3000\n",
            dir.display()
        );
        if let Some(p) = password {
            conf.push_str(&format!("requirepass {p}\n"));
        }
        let file = dir.join("sentinel.conf");
        std::fs::write(&file, conf).unwrap();
        let child = Command::new("redis-server")
            .arg(&file)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        let mut s = Redis {
            port,
            child,
            _dir: TempDir(dir),
        };
        let t0 = Instant::now();
        loop {
            let mut args = vec!["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m1"];
            if let Some(p) = password {
                args.splice(0..0, ["--no-auth-warning", "-a", p]);
            }
            if redis_cli(port, &args).contains(&master.to_string()) {
                return s;
            }
            if s.child.try_wait().ok().flatten().is_some() || t0.elapsed() > Duration::from_secs(10)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("redis sentinel did not start");
}

fn on_sentinel(sentinel: u16, mut conf: Value) -> Value {
    conf["policy"] = json!("redis-sentinel");
    conf["redis_sentinels"] = json!([{"host": "127.0.0.1", "port": sentinel}]);
    conf["redis_master_name"] = json!("m1");
    conf
}

/// Polls `cond` every 50 ms for at most `secs` seconds.
fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `redis-sentinel` (APISIX's limit-count policy): the count is exact across two nodes on the master a sentinel
/// names, and after a failover the nodes follow the new master: a spent window stays spent (no 200 ever: the
/// promoted replica holds the count), while a demoted master is never written to again.
#[test]
fn redis_sentinel_policy_counts_and_follows_a_failover() {
    let Some((master, o)) = redis_and_origin() else {
        return;
    };
    let replica = start_redis(false);
    redis_cli(
        replica.port,
        &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
    );
    let s = start_sentinel(master.port, None);
    let rport = replica.port.to_string();
    wait_until(20, "the sentinel sees the replica", || {
        redis_cli(s.port, &["SENTINEL", "REPLICAS", "m1"]).contains(&rport)
    });
    let conf = on_sentinel(
        s.port,
        json!({"count": 6, "time_window": 60, "key": "http_x_k", "redis_connect_timeout": 200, "redis_read_timeout": 200}),
    );
    let (a, b) = two(&o, conf);
    let k = [("X-K", "spent")];
    let statuses: Vec<u16> = (0..8)
        .map(|i| if i % 2 == 0 { &a } else { &b }.get("/hello", &k).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 503, 503]);
    assert!(redis_commands(master.port).0 > 0, "the master counted");
    redis_cli(master.port, &["WAIT", "1", "2000"]);
    assert!(redis_cli(s.port, &["SENTINEL", "FAILOVER", "m1"]).contains("OK"));
    wait_until(
        30,
        "the replica is promoted and the old master demoted",
        || {
            redis_cli(s.port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m1"]).contains(&rport)
                && redis_cli(master.port, &["ROLE"]).starts_with("slave")
        },
    );
    let evals_before = redis_commands(replica.port).0;
    // The spent key stays spent on both nodes: 500 while a node finds its way to the new master, never 200.
    for gw in [&a, &b] {
        let t0 = Instant::now();
        loop {
            let st = gw.get("/hello", &k).status;
            assert_ne!(st, 200, "the window was reset by the failover");
            if st == 503 {
                break;
            }
            assert_eq!(st, 500);
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "still 500 after a failover"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let fresh = a.get("/hello", &[("X-K", "fresh")]);
    assert_eq!(fresh.status, 200);
    assert_eq!(fresh.header("x-ratelimit-remaining"), Some("5"));
    assert!(
        redis_commands(replica.port).0 > evals_before,
        "the promoted replica answers the leases"
    );
}

/// The sentinel's own password (`sentinel_password`) is used, a wrong one or an unknown master name fails closed
/// with APISIX's 500, and a configuration without sentinels or a master name is refused.
#[test]
fn redis_sentinel_auth_unknown_master_and_bad_configurations() {
    let Some((master, o)) = redis_and_origin() else {
        return;
    };
    let s = start_sentinel(master.port, Some("s3cret"));
    let base = json!({"count": 2, "time_window": 60, "redis_connect_timeout": 200, "redis_read_timeout": 200});
    let mut good = on_sentinel(s.port, base.clone());
    good["sentinel_password"] = json!("s3cret");
    let gw = Gw::start(plugin_cfg(&o, "limit-count", good.clone()));
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(gw.get("/hello", &[]).status, 503);
    for (field, value) in [
        ("sentinel_password", "wrong"),
        ("redis_master_name", "nope"),
    ] {
        let mut bad = good.clone();
        bad[field] = json!(value);
        let gw = Gw::start(plugin_cfg(&o, "limit-count", bad));
        let r = gw.get("/hello", &[]);
        assert_eq!(
            (r.status, r.json()),
            (500, json!({"error_msg": "failed to limit count"})),
            "{field}"
        );
    }
    let mut no_pw = good.clone();
    no_pw.as_object_mut().unwrap().remove("sentinel_password");
    let gw = Gw::start(plugin_cfg(&o, "limit-count", no_pw));
    assert_eq!(gw.get("/hello", &[]).status, 500);
    for field in ["redis_sentinels", "redis_master_name"] {
        let mut bad = good.clone();
        bad.as_object_mut().unwrap().remove(field);
        assert!(
            Gw::start_with(plugin_cfg(&o, "limit-count", bad), Arc::default(), 1).is_err(),
            "{field}"
        );
    }
}
