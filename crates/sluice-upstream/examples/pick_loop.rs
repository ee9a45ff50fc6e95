//! Instruction-count harness for `Balancer::pick`, for machines where wall-clock benches are
//! noisy: run it under `valgrind --tool=cachegrind` with two iteration counts and divide the
//! difference in instructions by the difference in iterations. Not a benchmark by itself;
//! `benches/pick.rs` is.
//!
//! `cargo run --release -p sluice-upstream --example pick_loop -- <kind> <nodes> <iters> [retry]`

use std::hint::black_box;
use std::time::Duration;

use sluice_upstream::{Balancer, LbKind, NodeSpec, Tried};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = args
        .get(1)
        .and_then(|k| LbKind::from_apisix(k))
        .unwrap_or(LbKind::RoundRobin);
    let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(3);
    let iters: usize = args
        .get(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let retry = args.get(4).is_some_and(|v| v == "retry");
    let nodes = (0..n).map(|i| {
        NodeSpec::new(
            format!("10.0.{}.{}:80", i / 250, i % 250 + 1),
            1 + (i % 3) as u32,
        )
    });
    let b = Balancer::new(kind, nodes.collect());
    for i in 0..n {
        b.on_request_end(i, Duration::from_micros(100 + 37 * i as u64), true);
    }
    let mut tried = Tried::new();
    if retry {
        b.health().set_healthy(1, false);
        tried.insert(0);
    }
    let keys: Vec<Vec<u8>> = (0..1024)
        .map(|k| format!("consumer-{k}-10.1.2.3").into_bytes())
        .collect();
    let mut sum = 0usize;
    for k in 0..iters {
        sum = sum.wrapping_add(
            b.pick(Some(&keys[k & 1023]), black_box(&tried))
                .unwrap_or(0),
        );
    }
    println!("{sum}");
}
