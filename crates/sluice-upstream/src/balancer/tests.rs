use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::FailureKind;

const ALL: [LbKind; 4] = [
    LbKind::RoundRobin,
    LbKind::Chash,
    LbKind::LeastConn,
    LbKind::Ewma,
];

fn nodes(weights: &[u32]) -> Vec<NodeSpec> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| NodeSpec::new(format!("10.0.0.{}:80", i + 1), w))
        .collect()
}

/// Picks `n` times with a key derived from the iteration (chash) and counts per node.
fn counts(b: &Balancer, n: usize, tried: &Tried) -> Vec<usize> {
    let mut c = vec![0; b.nodes().len()];
    for k in 0..n {
        let key = format!("key-{k}");
        let i = b.pick(Some(key.as_bytes()), tried).expect("a node");
        c[i] += 1;
    }
    c
}

#[test]
fn balancer_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Balancer>();
}

#[test]
fn roundrobin_exact_weights_per_cycle() {
    let b = Balancer::new(LbKind::RoundRobin, nodes(&[1, 2, 3]));
    // Any 6 consecutive picks form one full cycle.
    for _ in 0..50 {
        assert_eq!(counts(&b, 6, &Tried::new()), vec![1, 2, 3]);
    }
    assert_eq!(counts(&b, 6000, &Tried::new()), vec![1000, 2000, 3000]);
}

#[test]
fn roundrobin_gcd_reduction_keeps_cycle_short() {
    let b = Balancer::new(LbKind::RoundRobin, nodes(&[100, 200, 300]));
    let Algo::RoundRobin(seq) = &b.groups[0].algo else {
        panic!("roundrobin")
    };
    assert_eq!(seq.entries().len(), 6);
}

#[test]
fn roundrobin_is_smooth_like_nginx() {
    // nginx's documented smooth sequence for {a=5, b=1, c=1}: a a b a c a a.
    let b = Balancer::new(LbKind::RoundRobin, nodes(&[5, 1, 1]));
    let Algo::RoundRobin(seq) = &b.groups[0].algo else {
        panic!("roundrobin")
    };
    assert_eq!(seq.entries(), &[0, 0, 1, 0, 2, 0, 0]);

    let b = Balancer::new(LbKind::RoundRobin, nodes(&[1, 1, 1]));
    let mut last = usize::MAX;
    for _ in 0..300 {
        let i = b.pick(None, &Tried::new()).expect("node");
        assert_ne!(i, last, "1:1:1 must never repeat a node back to back");
        last = i;
    }
}

#[test]
fn roundrobin_caps_huge_weight_sums_proportionally() {
    let b = Balancer::new(LbKind::RoundRobin, nodes(&[100_000, 50_001, 1]));
    let Algo::RoundRobin(seq) = &b.groups[0].algo else {
        panic!("roundrobin")
    };
    let len = seq.entries().len();
    assert!(len as u64 <= roundrobin::MAX_SEQUENCE + 3, "len {len}");
    let c = counts(&b, len, &Tried::new());
    assert!(c[2] >= 1, "a tiny weight still gets at least one slot");
    let ratio = c[0] as f64 / c[1] as f64;
    assert!((ratio - 2.0).abs() < 0.01, "ratio {ratio}");
}

#[test]
fn roundrobin_exact_under_concurrency() {
    let b = Arc::new(Balancer::new(LbKind::RoundRobin, nodes(&[1, 2])));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || counts(&b, 3000, &Tried::new()))
        })
        .collect();
    let mut total = [0usize; 2];
    for t in threads {
        let c = t.join().expect("thread");
        total[0] += c[0];
        total[1] += c[1];
    }
    // Every pick consumes exactly one slot of the shared cycle.
    assert_eq!(total, [4000, 8000]);
}

#[test]
fn weight_zero_never_gets_traffic() {
    for kind in ALL {
        let b = Balancer::new(kind, nodes(&[1, 0, 1]));
        let c = counts(&b, 3000, &Tried::new());
        assert_eq!(c[1], 0, "{kind:?}");
        assert!(c[0] > 0 && c[2] > 0, "{kind:?}: {c:?}");
        let only_zero = Balancer::new(kind, nodes(&[0, 0]));
        assert_eq!(only_zero.pick(Some(b"k"), &Tried::new()), None, "{kind:?}");
    }
}

#[test]
fn empty_balancer_picks_nothing() {
    for kind in ALL {
        assert_eq!(
            Balancer::new(kind, Vec::new()).pick(None, &Tried::new()),
            None
        );
    }
}

#[test]
fn tried_nodes_are_skipped_then_none() {
    for kind in ALL {
        let b = Balancer::new(kind, nodes(&[1, 1, 1]));
        let mut tried = Tried::new();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let i = b
                .pick(Some(b"same-key"), &tried)
                .expect("untried node left");
            assert!(!tried.contains(i), "{kind:?} returned a tried node");
            tried.insert(i);
            seen.push(i);
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2], "{kind:?}");
        assert_eq!(
            b.pick(Some(b"same-key"), &tried),
            None,
            "{kind:?}: all tried"
        );
    }
}

#[test]
fn tried_skipping_never_returns_tried_over_many_picks() {
    for kind in ALL {
        let b = Balancer::new(kind, nodes(&[3, 1, 2, 1]));
        let mut tried = Tried::new();
        tried.insert(2);
        let mut c = vec![0; 4];
        for k in 0..2000 {
            let i = b
                .pick(Some(format!("{k}").as_bytes()), &tried)
                .expect("node");
            b.on_request_start(i); // held requests, so least_conn spreads too
            c[i] += 1;
        }
        assert_eq!(c[2], 0, "{kind:?}");
        assert!(c[0] > 0 && c[1] > 0 && c[3] > 0, "{kind:?}: {c:?}");
    }
}

fn prio_nodes() -> Vec<NodeSpec> {
    vec![
        NodeSpec::new("10.0.0.1:80", 1).with_priority(10),
        NodeSpec::new("10.0.0.2:80", 1).with_priority(10),
        NodeSpec::new("10.0.0.3:80", 1), // priority 0
        NodeSpec::new("10.0.0.4:80", 1).with_priority(-5),
    ]
}

#[test]
fn priority_failover_on_tried_and_unhealthy() {
    for kind in ALL {
        let b = Balancer::new(kind, prio_nodes());
        assert_eq!(b.priorities().collect::<Vec<_>>(), vec![10, 0, -5]);
        let c = counts(&b, 1000, &Tried::new());
        assert_eq!(
            c[2] + c[3],
            0,
            "{kind:?}: lower priorities idle while higher are fine"
        );

        let mut tried = Tried::new();
        tried.insert(0);
        tried.insert(1);
        assert_eq!(b.pick(Some(b"k"), &tried), Some(2), "{kind:?}");
        tried.insert(2);
        assert_eq!(b.pick(Some(b"k"), &tried), Some(3), "{kind:?}");
        tried.insert(3);
        assert_eq!(b.pick(Some(b"k"), &tried), None, "{kind:?}");

        b.health().set_healthy(0, false);
        let c = counts(&b, 200, &Tried::new());
        assert_eq!(
            c,
            vec![0, 200, 0, 0],
            "{kind:?}: one healthy top node takes all"
        );
        b.health().set_healthy(1, false);
        let c = counts(&b, 200, &Tried::new());
        assert_eq!(c, vec![0, 0, 200, 0], "{kind:?}: next priority takes over");
        b.health().set_healthy(0, true);
        assert_eq!(
            counts(&b, 200, &Tried::new()),
            vec![200, 0, 0, 0],
            "{kind:?}: failback"
        );
    }
}

#[test]
fn all_unhealthy_falls_back_to_all_nodes_like_apisix() {
    for kind in ALL {
        let b = Balancer::new(kind, prio_nodes());
        for i in 0..4 {
            b.health().set_healthy(i, false);
        }
        // APISIX fetch_health_nodes: "all upstream nodes is unhealthy, use default",
        // priorities still apply.
        let c = counts(&b, 400, &Tried::new());
        assert_eq!(c[0] + c[1], 400, "{kind:?}: {c:?}");
        let mut tried = Tried::new();
        tried.insert(0);
        tried.insert(1);
        assert_eq!(b.pick(Some(b"k"), &tried), Some(2), "{kind:?}");
    }
}

#[test]
fn some_healthy_nodes_exclude_unhealthy_even_when_tried() {
    // APISIX drops unhealthy nodes from the picker while any node is healthy, so once the
    // healthy ones are tried the request fails ("all upstream servers tried") with 502.
    for kind in ALL {
        let b = Balancer::new(kind, nodes(&[1, 1, 1]));
        b.health().set_healthy(0, false);
        b.health().set_healthy(1, false);
        let mut tried = Tried::new();
        assert_eq!(b.pick(Some(b"k"), &tried), Some(2), "{kind:?}");
        tried.insert(2);
        assert_eq!(b.pick(Some(b"k"), &tried), None, "{kind:?}");
    }
}

#[test]
fn weight_zero_healthy_node_does_not_block_the_fallback() {
    let b = Balancer::new(LbKind::RoundRobin, nodes(&[1, 0]));
    b.health().set_healthy(0, false);
    assert_eq!(b.pick(None, &Tried::new()), Some(0));
}

#[test]
fn passive_failures_remove_a_node_from_rotation() {
    let b = Balancer::with_passive(
        LbKind::RoundRobin,
        nodes(&[1, 1, 1]),
        PassiveConfig::default(),
    );
    b.health().report_failure(1, FailureKind::Tcp);
    b.health().report_failure(1, FailureKind::Tcp);
    let c = counts(&b, 600, &Tried::new());
    assert_eq!(c[1], 0);
    assert_eq!(c[0] + c[2], 600);
    assert!(c[0] >= 200 && c[2] >= 200, "{c:?}");
}

#[test]
fn chash_same_key_same_node() {
    let b = Balancer::new(LbKind::Chash, nodes(&[1, 1, 1, 1, 1]));
    for k in 0..500 {
        let key = format!("user-{k}");
        let first = b.pick(Some(key.as_bytes()), &Tried::new());
        for _ in 0..3 {
            assert_eq!(b.pick(Some(key.as_bytes()), &Tried::new()), first);
        }
    }
    // Deterministic across balancers (and processes: the hash is not randomly seeded).
    let b2 = Balancer::new(LbKind::Chash, nodes(&[1, 1, 1, 1, 1]));
    for k in 0..500 {
        let key = format!("user-{k}");
        assert_eq!(
            b.pick(Some(key.as_bytes()), &Tried::new()),
            b2.pick(Some(key.as_bytes()), &Tried::new())
        );
    }
}

#[test]
fn chash_distribution_follows_weights() {
    let b = Balancer::new(LbKind::Chash, nodes(&[1, 1, 2]));
    let Algo::Chash(ring) = &b.groups[0].algo else {
        panic!("chash")
    };
    assert_eq!(ring.len() as u64, 4 * chash::POINTS_PER_WEIGHT);
    let c = counts(&b, 40_000, &Tried::new());
    let share = |i: usize| c[i] as f64 / 40_000.0;
    assert!((share(0) - 0.25).abs() < 0.06, "{c:?}");
    assert!((share(1) - 0.25).abs() < 0.06, "{c:?}");
    assert!((share(2) - 0.50).abs() < 0.08, "{c:?}");
}

fn owner_addr(b: &Balancer, key: &str) -> String {
    let i = b.pick(Some(key.as_bytes()), &Tried::new()).expect("node");
    b.nodes()[i].addr.clone()
}

#[test]
fn chash_removing_a_node_remaps_only_its_keys() {
    let all = nodes(&[1; 10]);
    let before = Balancer::new(LbKind::Chash, all.clone());
    let removed = all[3].addr.clone();
    let after = Balancer::new(
        LbKind::Chash,
        all.into_iter().filter(|n| n.addr != removed).collect(),
    );
    let keys = 20_000;
    let mut moved = 0;
    for k in 0..keys {
        let key = format!("session-{k}");
        let (a, b) = (owner_addr(&before, &key), owner_addr(&after, &key));
        if a != b {
            assert_eq!(a, removed, "only keys of the removed node may move");
            moved += 1;
        }
    }
    let frac = moved as f64 / keys as f64;
    assert!(frac > 0.04 && frac < 0.17, "moved {frac}, expected ~1/10");
}

#[test]
fn chash_unhealthy_node_equals_ring_without_it() {
    let all = nodes(&[1, 2, 1, 3]);
    let with = Balancer::new(LbKind::Chash, all.clone());
    with.health().set_healthy(1, false);
    let without = Balancer::new(
        LbKind::Chash,
        all.iter()
            .filter(|n| n.addr != all[1].addr)
            .cloned()
            .collect(),
    );
    for k in 0..5000 {
        let key = format!("k{k}");
        assert_eq!(owner_addr(&with, &key), owner_addr(&without, &key));
    }
}

#[test]
fn chash_retry_walks_to_next_node() {
    let b = Balancer::new(LbKind::Chash, nodes(&[1, 1, 1]));
    let first = b.pick(Some(b"abc"), &Tried::new()).expect("node");
    let mut tried = Tried::new();
    tried.insert(first);
    let second = b.pick(Some(b"abc"), &tried).expect("node");
    assert_ne!(first, second);
    assert_eq!(
        b.pick(Some(b"abc"), &tried),
        Some(second),
        "retry target is stable too"
    );
}

#[test]
fn least_conn_prefers_idle_nodes() {
    let b = Balancer::new(LbKind::LeastConn, nodes(&[1, 1, 1]));
    for _ in 0..5 {
        b.on_request_start(0);
        b.on_request_start(1);
    }
    for _ in 0..100 {
        assert_eq!(b.pick(None, &Tried::new()), Some(2));
    }
    for _ in 0..5 {
        b.on_request_end(0, Duration::from_millis(1), true);
    }
    assert_eq!(b.active(0), 0);
    // 0 and 2 are both idle now: ties are shared, 1 is never chosen.
    let c = counts(&b, 1000, &Tried::new());
    assert_eq!(c[1], 0);
    assert!(
        c[0] > 400 && c[2] > 400,
        "ties must be shared evenly: {c:?}"
    );
}

#[test]
fn least_conn_weights_scale_the_score() {
    // (active + 1) / weight: held requests pile up 1:3 by weight.
    let b = Balancer::new(LbKind::LeastConn, nodes(&[1, 3]));
    for _ in 0..400 {
        let i = b.pick(None, &Tried::new()).expect("node");
        b.on_request_start(i);
    }
    let (a0, a1) = (b.active(0), b.active(1));
    assert_eq!(a0 + a1, 400);
    assert!((99..=101).contains(&a0), "active {a0}:{a1}");
}

#[test]
fn unpaired_request_end_does_not_underflow() {
    let b = Balancer::new(LbKind::LeastConn, nodes(&[1, 1]));
    b.on_request_end(0, Duration::ZERO, true);
    b.on_request_end(7, Duration::ZERO, true); // unknown index ignored
    b.on_request_start(7);
    assert_eq!(b.active(0), 0);
    assert_eq!(b.active(7), 0);
}

#[test]
fn ewma_prefers_the_fast_node() {
    let b = Balancer::new(LbKind::Ewma, nodes(&[1, 1, 1]));
    let now = b.now_ns();
    b.record_at(0, Duration::from_millis(200), true, now);
    b.record_at(1, Duration::from_millis(2), true, now);
    b.record_at(2, Duration::from_millis(50), true, now);
    let c = counts(&b, 3000, &Tried::new());
    assert_eq!(c[0], 0, "the slowest node loses every pairing: {c:?}");
    // p2c: the fast node wins the 2 of 3 pairings it appears in.
    assert!(c[1] > 1700 && c[1] < 2300, "{c:?}");
    assert!(c[1] > c[2], "{c:?}");
}

#[test]
fn ewma_two_nodes_always_fast() {
    let b = Balancer::new(LbKind::Ewma, nodes(&[1, 1]));
    b.on_request_end(0, Duration::from_millis(80), true);
    b.on_request_end(1, Duration::from_millis(1), true);
    assert_eq!(counts(&b, 500, &Tried::new()), vec![0, 500]);
}

#[test]
fn ewma_unmeasured_node_is_tried_and_averages_move_with_time() {
    let b = Balancer::new(LbKind::Ewma, nodes(&[1, 1]));
    b.record_at(0, Duration::from_millis(10), true, 1);
    // Node 1 was never measured: score 0, so it wins.
    assert_eq!(b.pick(None, &Tried::new()), Some(1));
    let e0 = b.stats[0].ewma.load(Ordering::Relaxed);
    assert!(
        (f64::from_bits(e0) - 0.010).abs() < 1e-9,
        "first sample is taken as is"
    );
    // 10 s later (one DECAY_TIME), a 110 ms sample: w = e^-1, ewma = 10ms*w + 110ms*(1-w).
    b.record_at(0, Duration::from_millis(110), true, 10_000_000_001);
    let w = (-1f64).exp();
    let expected = 0.010 * w + 0.110 * (1.0 - w);
    let got = f64::from_bits(b.stats[0].ewma.load(Ordering::Relaxed));
    assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
    // The score decays towards 0 with idle time, so a slow node is eventually retried.
    let s_now = ewma::score(&b.stats[0], 10_000_000_001);
    let s_later = ewma::score(&b.stats[0], 60_000_000_001);
    assert!(s_later < s_now / 100.0);
}

#[test]
fn ewma_failures_never_make_a_node_look_faster() {
    let b = Balancer::new(LbKind::Ewma, nodes(&[1]));
    b.record_at(0, Duration::from_millis(100), true, 1);
    b.record_at(0, Duration::from_micros(10), false, 5_000_000_001);
    assert!(f64::from_bits(b.stats[0].ewma.load(Ordering::Relaxed)) >= 0.1 - 1e-12);
}

#[test]
fn many_nodes_beyond_64_work_with_tried() {
    for kind in ALL {
        let b = Balancer::new(kind, nodes(&[1; 100]));
        let mut tried = Tried::new();
        let mut seen = HashMap::new();
        for _ in 0..100 {
            let i = b.pick(Some(b"x"), &tried).expect("node");
            assert!(seen.insert(i, ()).is_none(), "{kind:?}: node {i} twice");
            tried.insert(i);
        }
        assert_eq!(b.pick(Some(b"x"), &tried), None, "{kind:?}");
    }
}

#[test]
fn chash_bucket_index_agrees_with_binary_search() {
    // (A lone node has no ring: `lone_node_is_picked_without_a_selection_structure`.)
    for weights in [&[1u32, 1][..], &[1, 1, 2], &[5; 100]] {
        let b = Balancer::new(LbKind::Chash, nodes(weights));
        let Algo::Chash(ring) = &b.groups[0].algo else {
            panic!("chash")
        };
        let open = Filter {
            tried: &Tried::new(),
            health: None,
        };
        let mut x = 0x1234_5678_9abc_def1u64;
        let probes = (0..20_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u32
        });
        for h in probes.chain([0, 1, u32::MAX, u32::MAX - 1, 1 << 31]) {
            assert_eq!(
                ring.pick(h, &open, true),
                Some(ring.reference_owner(h)),
                "hash {h}"
            );
        }
    }
}

#[test]
fn single_node_is_always_returned_like_apisix() {
    for kind in ALL {
        let b = Balancer::new(kind, nodes(&[0]));
        let mut tried = Tried::new();
        assert_eq!(
            b.pick(Some(b"k"), &tried),
            Some(0),
            "{kind:?}: weight 0 single node"
        );
        tried.insert(0);
        b.health().set_healthy(0, false);
        assert_eq!(
            b.pick(Some(b"k"), &tried),
            Some(0),
            "{kind:?}: tried + unhealthy single node"
        );
        assert_eq!(b.default_retries(), 0);
    }
}

#[test]
fn inherit_state_keeps_health_and_ewma_by_addr() {
    let old = Balancer::new(LbKind::Ewma, nodes(&[1, 1, 1]));
    old.health().set_healthy(1, false);
    old.on_request_end(2, Duration::from_millis(40), true);
    // New snapshot: node order changed, 10.0.0.1 removed, a new node added.
    let mut new_nodes = nodes(&[1, 1, 1]);
    new_nodes.remove(0);
    new_nodes.reverse(); // [10.0.0.3, 10.0.0.2]
    new_nodes.push(NodeSpec::new("10.0.0.9:80", 1));
    let new = Balancer::new(LbKind::Ewma, new_nodes);
    new.inherit_state(&old);
    assert!(new.health().is_healthy(0));
    assert!(
        !new.health().is_healthy(1),
        "10.0.0.2 stays down across the reload"
    );
    assert!(new.health().is_healthy(2));
    assert_eq!(new.health().unhealthy_count(), 1);
    let e = new.ewma(0).as_secs_f64();
    assert!(
        e > 0.035 && e <= 0.040,
        "ewma of 10.0.0.3 carried over: {e}"
    );
    assert_eq!(new.ewma(2), Duration::ZERO);
}

#[test]
fn request_end_at_uses_the_callers_clock() {
    let b = Balancer::new(LbKind::Ewma, nodes(&[1, 1]));
    let t0 = Instant::now();
    b.on_request_start(0);
    assert_eq!(b.active(0), 1);
    b.on_request_end_at(0, Duration::from_millis(30), true, t0);
    assert_eq!(b.active(0), 0);
    // 10 s later by the caller's clock, a 130 ms sample moves the average by (1 - 1/e).
    b.on_request_end_at(
        0,
        Duration::from_millis(130),
        true,
        t0 + Duration::from_secs(10),
    );
    let got = f64::from_bits(b.stats[0].ewma.load(Ordering::Relaxed));
    let w = (-1f64).exp();
    let expected = 0.030 * w + 0.130 * (1.0 - w);
    assert!((got - expected).abs() < 1e-3, "{got} vs {expected}");
}

#[test]
fn concurrent_picks_while_health_flaps() {
    for kind in ALL {
        let b = Arc::new(Balancer::new(kind, nodes(&[1, 0, 2, 3])));
        let flapper = {
            let b = b.clone();
            std::thread::spawn(move || {
                for k in 0..2000 {
                    b.health().set_healthy(k % 4, k % 3 == 0);
                }
            })
        };
        let pickers: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for k in 0..5000u32 {
                        let i = b
                            .pick(Some(&k.to_le_bytes()), &Tried::new())
                            .expect("a node");
                        assert!(i < 4 && i != 1, "weight-0 or out-of-range node {i}");
                        b.on_request_start(i);
                        b.on_request_end(i, Duration::from_micros(50), true);
                    }
                })
            })
            .collect();
        flapper.join().expect("flapper");
        for p in pickers {
            p.join().expect("picker");
        }
        let unhealthy = b.health().snapshot().iter().filter(|s| !s.healthy).count();
        assert_eq!(
            b.health().unhealthy_count(),
            unhealthy,
            "{kind:?}: count in step with states"
        );
        assert!((0..4).all(|i| b.active(i) == 0), "{kind:?}");
    }
}

/// Proxies `n` requests the way `conn.rs` does against two nodes where node 0 always times out and node 1 answers:
/// pick, and on a failure report it and pick again with node 0 tried. Returns how many requests started on node 0.
fn slow_first_picks(kind: LbKind, n: usize) -> usize {
    let b = Balancer::new(kind, nodes(&[1, 1]));
    let mut slow_first = 0;
    for k in 0..n {
        let key = format!("client-{k}");
        let mut tried = Tried::new();
        let mut first = true;
        loop {
            let i = b.pick(Some(key.as_bytes()), &tried).expect("a node");
            tried.insert(i);
            b.on_request_start(i);
            if i == 0 {
                slow_first += usize::from(first);
                b.on_request_end(0, Duration::from_secs(1), false);
                b.health().report_failure(0, FailureKind::Timeout);
                first = false;
                continue;
            }
            b.on_request_end(1, Duration::from_millis(1), true);
            break;
        }
    }
    slow_first
}

#[test]
fn a_retry_does_not_steer_the_next_request_to_the_failed_node() {
    const N: usize = 400;
    for kind in ALL {
        let slow_first = slow_first_picks(kind, N);
        // Equal weights: at most half the requests start on the slow node (roundrobin exactly, chash by its keys,
        // least_conn by its random tie-break, far below this bound: P(Binomial(400, 1/2) > 260) < 1e-9; ewma
        // avoids the slow node once it has a latency).
        let bound = match kind {
            LbKind::RoundRobin => N / 2 + 1,
            _ => N * 65 / 100,
        };
        assert!(
            slow_first <= bound,
            "{kind:?}: {slow_first} of {N} requests started on the slow node (bound {bound})"
        );
    }
}

#[test]
fn roundrobin_retry_keeps_the_weighted_rotation() {
    // Weights 3:1, node 1 (weight 1) always fails: it is still tried first on exactly a quarter of the requests.
    let b = Balancer::new(LbKind::RoundRobin, nodes(&[3, 1]));
    let mut first_on_1 = 0;
    for _ in 0..400 {
        let mut tried = Tried::new();
        let i = b.pick(None, &tried).unwrap();
        if i == 1 {
            first_on_1 += 1;
            tried.insert(1);
            assert_eq!(b.pick(None, &tried), Some(0));
        }
    }
    assert_eq!(first_on_1, 100);
}

#[test]
fn peek_names_the_next_pick_without_taking_it() {
    let b = Balancer::new(LbKind::RoundRobin, nodes(&[3, 1, 2]));
    for _ in 0..20 {
        let next = b.peek(None).expect("a node");
        assert_eq!(b.peek(None), Some(next), "peeking does not move the cursor");
        assert_eq!(b.pick(None, &Tried::new()), Some(next));
    }
    // An unhealthy node is skipped as a pick skips it.
    b.health().set_healthy(0, false);
    for _ in 0..6 {
        let next = b.peek(None).expect("a node");
        assert_ne!(next, 0);
        assert_eq!(b.pick(None, &Tried::new()), Some(next));
    }
    // chash: the same node as the pick for the key.
    let c = Balancer::new(LbKind::Chash, nodes(&[1, 1, 1, 1]));
    for k in ["a", "b", "c", "user-42"] {
        assert_eq!(
            c.peek(Some(k.as_bytes())),
            c.pick(Some(k.as_bytes()), &Tried::new())
        );
    }
}

#[test]
fn lone_node_is_picked_without_a_selection_structure() {
    // Issue 16: a single-node upstream (one per route with an inline upstream) builds no group, ring or
    // sequence; `pick` answers it first, whatever its weight, health or earlier tries.
    for kind in ALL {
        for weight in [0, 1, 7] {
            let b = Balancer::new(kind, nodes(&[weight]));
            assert!(b.groups.is_empty(), "{kind:?}");
            let mut tried = Tried::new();
            assert_eq!(b.pick(Some(b"k"), &tried), Some(0), "{kind:?}");
            tried.insert(0);
            b.health().set_healthy(0, false);
            assert_eq!(b.pick(Some(b"k"), &tried), Some(0), "{kind:?}");
            assert_eq!(b.peek(Some(b"k")), Some(0), "{kind:?}");
        }
    }
    assert_eq!(
        Balancer::new(LbKind::RoundRobin, nodes(&[1, 1]))
            .groups
            .len(),
        1
    );
}
