//! `Balancer::pick` cost per balancer kind with 3 and 100 nodes, first attempt with every node
//! healthy (the hot path), plus the filtered path (one node tried, one unhealthy) and the
//! start/end bookkeeping pair. Run: `cargo bench -p sluice-upstream -- --warm-up-time 1
//! --measurement-time 2`. Single-threaded: it measures instructions, not cross-core contention.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice_upstream::{Balancer, LbKind, NodeSpec, Tried};

const KINDS: [LbKind; 4] = [
    LbKind::RoundRobin,
    LbKind::Chash,
    LbKind::LeastConn,
    LbKind::Ewma,
];

fn balancer(kind: LbKind, n: usize) -> Balancer {
    let nodes = (0..n).map(|i| {
        NodeSpec::new(
            format!("10.0.{}.{}:80", i / 250, i % 250 + 1),
            1 + (i % 3) as u32,
        )
    });
    let b = Balancer::new(kind, nodes.collect());
    for i in 0..n {
        // Give ewma real averages so scores are not all zero.
        b.on_request_start(i);
        b.on_request_end(i, Duration::from_micros(100 + 37 * i as u64), true);
    }
    b
}

fn keys() -> Vec<Vec<u8>> {
    (0..1024)
        .map(|k| format!("consumer-{k}-10.1.2.3").into_bytes())
        .collect()
}

fn bench_pick(c: &mut Criterion) {
    let keys = keys();
    let mut group = c.benchmark_group("pick");
    for kind in KINDS {
        for n in [3usize, 100] {
            let b = balancer(kind, n);
            let tried = Tried::new();
            let mut k = 0usize;
            group.bench_function(BenchmarkId::new(kind.as_apisix(), n), |bench| {
                bench.iter(|| {
                    k = (k + 1) & 1023;
                    black_box(b.pick(Some(&keys[k]), black_box(&tried)))
                })
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("pick_retry_unhealthy");
    for kind in KINDS {
        for n in [3usize, 100] {
            let b = balancer(kind, n);
            b.health().set_healthy(1, false);
            let mut tried = Tried::new();
            tried.insert(0);
            let mut k = 0usize;
            group.bench_function(BenchmarkId::new(kind.as_apisix(), n), |bench| {
                bench.iter(|| {
                    k = (k + 1) & 1023;
                    black_box(b.pick(Some(&keys[k]), black_box(&tried)))
                })
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("request_start_end");
    for kind in [LbKind::LeastConn, LbKind::Ewma] {
        let b = balancer(kind, 3);
        group.bench_function(kind.as_apisix(), |bench| {
            bench.iter(|| {
                b.on_request_start(black_box(1));
                b.on_request_end(black_box(1), Duration::from_micros(250), true);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_pick);
criterion_main!(benches);
