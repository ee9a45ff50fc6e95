//! Per-request cost of the benchmark chain (key-auth + limit-count + prometheus, 100 consumers) without any IO:
//! `cargo run --release -p sluice-plugins --example chain_cost`. Prints ns per request for the request phases,
//! header_filter and log, single-threaded and with 2 threads on one route (shared counters and series).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde_json::json;
use sluice_plugins::{Chain, CompileEnv, Ctx, Flow, LogInfo, ReqView, Shared};

fn main() {
    let consumers: Vec<sluice_model::Consumer> = (0..100)
        .map(|j| {
            serde_json::from_value(json!({"username": format!("c{j}"),
                "plugins": {"key-auth": {"key": format!("key-{j}")}}}))
            .unwrap()
        })
        .collect();
    let shared = Shared::default();
    let env = CompileEnv::new(&shared, &consumers, None);
    let plugins = json!({
        "key-auth": {},
        "limit-count": {"count": 1_000_000_000u64 >> 6, "time_window": 60, "key": "consumer_name"},
        "prometheus": {}
    });
    let chain = Chain::compile(plugins.as_object().unwrap(), &env)
        .unwrap()
        .unwrap();
    let mut raw = BytesMut::from(
        &b"GET /r1/x HTTP/1.1\r\nHost: bench.local\r\napikey: key-42\r\nUser-Agent: bench\r\n\r\n"
            [..],
    );
    let head = sluice_http::parse_request(&mut raw, &sluice_http::Limits::default())
        .unwrap()
        .unwrap();
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let local: SocketAddr = "127.0.0.1:9080".parse().unwrap();
    let view = ReqView::new(&head, peer, local, "http").expect("a normal path");
    let info = LogInfo {
        status: 200,
        request_bytes: 80,
        response_bytes: 120,
        latency: Duration::from_micros(250),
        upstream_latency: Some(Duration::from_micros(200)),
        upstream_addr: Some("127.0.0.1:8080".parse().unwrap()),
        upstream_status: Some(200),
    };
    let run = |n: u32| {
        let t0 = Instant::now();
        for _ in 0..n {
            let mut ctx = Ctx::new(&view, "r1");
            assert!(matches!(chain.run_request(&mut ctx), Flow::Continue));
            chain.header_filter(&mut ctx, 200);
            chain.log(&ctx, &info);
        }
        t0.elapsed().as_nanos() as f64 / f64::from(n)
    };
    run(20_000);
    let n = 500_000;
    println!(
        "1 thread : {:.0} ns/request (key-auth + limit-count + prometheus)",
        run(n)
    );
    std::thread::scope(|s| {
        let a = s.spawn(|| run(n));
        let b = s.spawn(|| run(n));
        println!(
            "2 threads: {:.0} / {:.0} ns/request (same route, same consumer)",
            a.join().unwrap(),
            b.join().unwrap()
        );
    });
}
