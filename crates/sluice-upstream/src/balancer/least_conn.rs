//! `least_conn` (APISIX `apisix/balancer/least_conn.lua`): the node with the lowest
//! `(active + 1) / weight` wins. APISIX keeps a binary heap behind a per-worker table; here the
//! score is read from per-node atomics by a linear scan of the priority group (no heap to lock),
//! compared by cross-multiplication in integers. Equal scores are broken by a per-pick random
//! order (`mix32(index ^ r)`, one random draw per pick), so idle nodes share sequential traffic
//! evenly instead of node 0 taking it all. Cost: O(group size) per pick (one relaxed load and
//! one contiguous weight per node, no division); fine for the tens of nodes upstreams have,
//! measured with 100 in `benches/pick.rs`.

use std::sync::atomic::Ordering;

use super::{mix32, rand_u64, Filter, NodeStats};

#[inline]
pub(super) fn pick(
    members: &[u32],
    weights: &[u32],
    stats: &[NodeStats],
    f: &Filter<'_>,
    open: bool,
) -> Option<usize> {
    let r = rand_u64() as u32;
    // Best so far: index, load = active + 1, weight, tie-break key. Starts at an infinite
    // score (load 1 / weight 0) that any real node (weight > 0) beats.
    let (mut best, mut bl, mut bw, mut bkey) = (None, 1u64, 0u64, 0u32);
    for (&i, &w) in members.iter().zip(weights) {
        if !open && !f.allows(i as usize) {
            continue;
        }
        let Some(s) = stats.get(i as usize) else {
            continue;
        };
        let load = u64::from(s.active.load(Ordering::Relaxed)) + 1;
        let weight = u64::from(w);
        // Compare load/weight with bl/bw without division.
        let (lhs, rhs) = (load * bw, bl * weight);
        if lhs < rhs {
            (best, bl, bw, bkey) = (Some(i), load, weight, mix32(i ^ r));
        } else if lhs == rhs {
            let key = mix32(i ^ r);
            if key < bkey {
                (best, bl, bw, bkey) = (Some(i), load, weight, key);
            }
        }
    }
    best.map(|i| i as usize)
}
