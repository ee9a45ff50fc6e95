//! The dubbo scenario's plumbing without Pixiu: its Sluice config compiles in the real data plane, Pixiu's config
//! is the recipe's, the client's line parses, answers and verdicts are judged right, wrk runs and is measured
//! against an in-process HTTP server, and (with Go) the provider and the direct client are built from the pinned
//! module, started and measured, in a private network namespace when this runs as root.

use super::*;
use std::io::{Read, Write};
use std::net::TcpListener;

use crate::report::TargetResult;

fn ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
}

fn skip(what: &str) -> bool {
    if ci() {
        panic!("{what} missing: CI=true requires this test to run");
    }
    eprintln!("skipping: {what}");
    true
}

fn ctx(work: &Path, duration: Duration, warmup: Duration) -> Ctx {
    Ctx {
        work: work.to_path_buf(),
        self_bin: std::env::current_exe().expect("exe"),
        sluice_bin: PathBuf::from("sluice"),
        upstream: None,
        gateway: None,
        duration,
        warmup,
        rounds: 1,
        driver: crate::drivers::Driver::Wrk,
        gen_threads: 1,
        mock_threads: 1,
        body_size: 0,
        timeout: Duration::from_secs(5),
        pin_gateway: None,
        pin_mock: None,
        peers: false,
        ready_timeout: Duration::from_secs(20),
        h2c: false,
        access_log: false,
        cores: 2,
    }
}

#[test]
fn the_sluice_config_compiles_in_the_data_plane() {
    let y = sluice_yaml("127.0.0.1:20881".parse().expect("addr"));
    let res = sluice_store::standalone::parse(&y).expect("apisix.yaml parses");
    assert_eq!(res.routes.len(), 1);
    let snap = sluice_proxy::Snapshot::compile(&res, 1).expect("the data plane compiles it");
    assert_eq!(snap.route_count(), 1);
    // The plugin's schema is really applied: a bad version is refused.
    let bad = y.replace("service_version: 1.0.0", "service_version: one");
    let res = sluice_store::standalone::parse(&bad).expect("parses");
    let err = sluice_proxy::Snapshot::compile(&res, 1)
        .err()
        .expect("bad version refused");
    assert!(err.contains("dubbo-proxy"), "{err}");
}

#[test]
fn pixiu_and_zookeeper_configs_are_the_recipes() {
    let zk: SocketAddr = "127.0.0.1:2181".parse().expect("addr");
    let conf: serde_yaml::Value =
        serde_yaml::from_str(&pixiu_conf(8883, zk, Path::new("/x/api.yaml"))).expect("yaml");
    let l = &conf["static_resources"]["listeners"][0];
    assert_eq!(l["address"]["socket_address"]["address"], "127.0.0.1");
    assert_eq!(l["address"]["socket_address"]["port"], 8883);
    let filters = &l["filter_chains"]["filters"][0]["config"]["http_filters"];
    assert_eq!(filters[0]["name"], "dgp.filter.http.apiconfig");
    assert_eq!(filters[0]["config"]["path"], "/x/api.yaml");
    assert_eq!(filters[1]["name"], "dgp.filter.http.dubboproxy");
    assert_eq!(
        filters[1]["config"]["dubboProxyConfig"]["registries"]["zookeeper"]["address"],
        "127.0.0.1:2181"
    );
    let api: serde_yaml::Value = serde_yaml::from_str(PIXIU_API).expect("yaml");
    assert_eq!(
        api["resources"][0]["path"],
        "/api/v1/test-dubbo/:application/:interface"
    );
    // Every mapped parameter is mandatory in Pixiu: no group (the provider has none; pixiu.md pitfall 6).
    assert!(!PIXIU_API.contains("group"));
    assert!(URI.starts_with("/api/v1/test-dubbo/dubbo-go-demo/"));
    assert!(PATH.starts_with(URI));
    let _: serde_yaml::Value = serde_yaml::from_str(PIXIU_LOG).expect("log yaml");
    let z = zoo_cfg(Path::new("/d"), 2181);
    assert!(z.contains("clientPortAddress=127.0.0.1\n") && z.contains("clientPort=2181\n"));
    assert!(z.contains("dataDir=/d\n"));
}

#[test]
fn client_lines_parse() {
    let r = parse_client(
        "RESULT requests=1200 ok=1199 fail=1 wall=1.002 p50_us=950 p99_us=4100 max_us=9000 cpu_s=0.120",
    )
    .expect("parses");
    assert_eq!(
        r,
        ClientResult {
            requests: 1200,
            ok: 1199,
            fail: 1,
            wall_s: 1.002,
            p50_us: 950.0,
            p99_us: 4100.0,
            max_us: 9000.0,
            cpu_s: 0.12,
        }
    );
    assert!(parse_client("MEASURING").is_none());
    assert!(parse_client("RESULT requests=1 ok=1").is_none());
    assert!(parse_client(
        "RESULT requests=x ok=1 fail=0 wall=1 p50_us=1 p99_us=1 max_us=1 cpu_s=1"
    )
    .is_none());
}

#[test]
fn only_the_providers_reply_is_an_answer() {
    let good = r#"{"body":"dubbo-go success\nname: tc\n","header1":"value1","status":"200"}"#;
    assert!(answer_ok(200, good));
    assert!(!answer_ok(500, good));
    assert!(!answer_ok(200, r#"{"status":"200"}"#));
    // Pixiu's answer while it has not found the provider yet.
    assert!(!answer_ok(200, r#"{"message":"no provider"}"#));
}

#[test]
fn wrk_gets_the_reports_post() {
    let lua = wrk_lua();
    assert!(lua.contains("wrk.method = \"POST\""));
    assert!(lua.contains(&format!("wrk.body = '{BODY}'")));
    assert!(lua.contains("Content-Type"));
    let a = wrk_args(
        "127.0.0.1:9080".parse().expect("addr"),
        Path::new("/p.lua"),
        Duration::from_secs(10),
    );
    assert_eq!(
        a,
        [
            "wrk",
            "-t2",
            "-c20",
            "-d10s",
            "--latency",
            "--timeout",
            "5s",
            "-s",
            "/p.lua",
            &format!("http://127.0.0.1:9080{PATH}")
        ]
    );
}

fn result(name: &str, rps: f64, p99_us: f64, cpu: Option<f64>) -> TargetResult {
    let mut t = TargetResult::skipped(name, "wrk", 1, String::new());
    t.skip_reason = None;
    t.rounds = vec![RunResult {
        rps,
        latency_us: Latency {
            p99: p99_us,
            ..Latency::default()
        },
        cpu_us_per_req: cpu,
        ..RunResult::default()
    }];
    t.finish();
    t
}

#[test]
fn the_three_targets_are_judged_from_the_medians() {
    let met = target_notes(&[
        result("sluice", 9500.0, 8000.0, Some(30.0)),
        result("pixiu", 4000.0, 16000.0, Some(350.0)),
        result("direct", 10000.0, 7000.0, None),
    ]);
    assert_eq!(met.len(), 3, "{met:?}");
    assert!(
        met.iter()
            .all(|n| n.ends_with("met)") && !n.contains("NOT")),
        "{met:?}"
    );
    assert!(met[0].contains("1/11.7"), "{met:?}");
    assert!(met[2].contains("95%"), "{met:?}");
    let missed = target_notes(&[
        result("sluice", 8900.0, 17000.0, Some(36.0)),
        result("pixiu", 4000.0, 16000.0, Some(350.0)),
        result("direct", 10000.0, 7000.0, None),
    ]);
    assert_eq!(
        missed.iter().filter(|n| n.contains("NOT met")).count(),
        3,
        "{missed:?}"
    );
    // Without Pixiu only the throughput target can be judged.
    let alone = target_notes(&[
        result("sluice", 9500.0, 8000.0, Some(30.0)),
        TargetResult::skipped("pixiu", "wrk", 1, "no Go".into()),
        result("direct", 10000.0, 7000.0, None),
    ]);
    assert_eq!(alone.len(), 1, "{alone:?}");
    let table = markdown_table(&[
        result("sluice", 9500.0, 8000.0, Some(30.0)),
        TargetResult::skipped("pixiu", "wrk", 1, "no Go".into()),
    ]);
    assert!(
        table.contains("| sluice | 9500 | 0.00 | 8.00 | 30.0 | – | 0 |"),
        "{table}"
    );
    assert!(table.contains("| pixiu | skipped: no Go |"), "{table}");
}

/// An HTTP/1.1 server answering every request with the provider's reply, as a gateway would.
fn fake_gateway() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let body =
                    r#"{"body":"dubbo-go success\nname: tc\n","header1":"value1","status":"200"}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut buf = [0u8; 4096];
                let mut have = Vec::new();
                loop {
                    let n = match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    have.extend_from_slice(&buf[..n]);
                    // Each request is a head plus BODY (wrk and curl both send Content-Length).
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        let total = end + 4 + BODY.len();
                        if have.len() < total {
                            break;
                        }
                        have.drain(..total);
                        if s.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_gateway_is_probed_and_measured_with_wrk() {
    if !installed("wrk") && skip("wrk not installed") {
        return;
    }
    if !installed("curl") && skip("curl not installed") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sluice-bench-dubbo-wrk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let addr = fake_gateway();
    let place = Place::Host;
    // Something to watch while probing: a child that lives as long as the probe takes.
    let mut watched = Proc::spawn(
        "sleeper",
        &["sleep".to_string(), "30".into()],
        None,
        &dir.join("sleep.log"),
    )
    .expect("sleep");
    let body = place
        .wait_answer(&mut watched, addr, Duration::from_secs(10))
        .expect("the probe accepts the reply");
    assert!(body.contains("name: tc"));
    gateway::write(&dir, "post.lua", &wrk_lua()).expect("lua");
    let c = ctx(&dir, Duration::from_secs(1), Duration::ZERO);
    let me = std::process::id();
    let r = measure_gateway(&c, &place, addr, &dir.join("post.lua"), me, me).expect("measured");
    assert!(r.requests > 100, "{r:?}");
    assert_eq!(r.errors.non_2xx + r.errors.failures(), 0, "{r:?}");
    assert!(
        r.latency_us.p99 > 0.0 && r.cpu_us_per_req.is_some() && r.origin_cpu_us_per_req.is_some()
    );
    // A dead target ends the probe at once, with its reason.
    let mut gone =
        Proc::spawn("false", &["false".to_string()], None, &dir.join("f.log")).expect("false");
    std::thread::sleep(Duration::from_millis(200));
    let err = place
        .wait_answer(
            &mut gone,
            "127.0.0.1:9".parse().expect("addr"),
            Duration::from_secs(10),
        )
        .expect_err("dead");
    assert!(err.contains("false exited"), "{err}");
    drop(watched);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The provider and the direct client, built from the pinned module, started and measured exactly as the scenario
/// does (in a private network namespace when allowed). Skips without Go (fails under CI=true).
#[test]
fn provider_and_direct_client_build_start_and_measure() {
    let Some(go) = find_go() else {
        skip("Go not installed");
        return;
    };
    let work = std::env::temp_dir().join(format!("sluice-bench-dubbo-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("dir");
    let c = ctx(&work, Duration::from_secs(1), Duration::from_millis(300));
    let tools = tools_dir(&c);
    let provider_bin = go_build(&go, &tools, "./provider", "provider").expect("provider builds");
    let client_bin = go_build(&go, &tools, "./client", "client").expect("client builds");
    // The stamp makes a second call reuse the binary.
    let built = std::fs::metadata(&client_bin)
        .and_then(|m| m.modified())
        .expect("mtime");
    assert_eq!(
        go_build(&go, &tools, "./client", "client").expect("again"),
        client_bin
    );
    assert_eq!(
        std::fs::metadata(&client_bin)
            .and_then(|m| m.modified())
            .expect("mtime"),
        built
    );
    let place = match Place::private(&work) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("no private namespace ({why}): on the host's loopback");
            Place::Host
        }
    };
    let addr: SocketAddr = ([127, 0, 0, 1], place.port(NS_PROVIDER).expect("port")).into();
    let argv = [provider_bin.display().to_string(), addr.port().to_string()];
    let mut provider = Proc::spawn(
        "provider",
        &place.argv(&argv),
        None,
        &work.join("provider.log"),
    )
    .expect("start");
    place
        .wait_listening(&mut provider, addr, Duration::from_secs(60))
        .expect("provider listens");
    let (r, client_cpu) =
        measure_direct(&c, &place, &client_bin, addr, provider.pid()).expect("direct run");
    assert!(r.requests > 100, "{r:?}");
    assert_eq!(r.errors.io, 0, "{r:?}");
    assert!(
        r.latency_us.p50 > 0.0 && r.latency_us.p99 >= r.latency_us.p50,
        "{r:?}"
    );
    let origin = r.origin_cpu_us_per_req.expect("provider CPU");
    assert!(origin > 1.0 && origin < 10_000.0, "{origin}");
    assert!(client_cpu > 1.0, "{client_cpu}");
    // A provider that is gone: the client says so instead of hanging.
    drop(provider);
    let err = measure_direct(&c, &place, &client_bin, addr, 1).expect_err("no provider");
    assert!(err.contains("no result"), "{err}");
    drop(place);
    let _ = std::fs::remove_dir_all(&work);
}
