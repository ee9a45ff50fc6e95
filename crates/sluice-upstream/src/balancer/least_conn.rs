//! `least_conn` (APISIX `apisix/balancer/least_conn.lua`): the node with the lowest
//! `(active + 1) / weight` wins. APISIX keeps a binary heap behind a per-worker table; here the
//! score is read from per-node atomics by a linear scan of the priority group (no heap to lock),
//! compared by cross-multiplication in integers. Equal scores are broken uniformly at random
//! (reservoir sampling over the ties), so idle nodes share sequential traffic evenly instead of
//! node 0 taking it all. Cost: O(group size) per pick (one relaxed load per node, no division,
//! one random draw per tie); fine for the tens of nodes upstreams have, measured with 100 in
//! `benches/pick.rs`.

use std::sync::atomic::Ordering;

use super::{rand_below, Filter, NodeStats};
use crate::NodeSpec;

#[inline]
pub(super) fn pick(
    members: &[u32],
    nodes: &[NodeSpec],
    stats: &[NodeStats],
    f: &Filter<'_>,
) -> Option<usize> {
    // (index, load = active + 1, weight) of the best node so far, and how many tie with it.
    let mut best: Option<(usize, u64, u64)> = None;
    let mut ties = 0usize;
    for &i in members {
        let i = i as usize;
        if !f.allows(i) {
            continue;
        }
        let load = u64::from(stats[i].active.load(Ordering::Relaxed)) + 1;
        let weight = u64::from(nodes[i].weight);
        let Some((_, bl, bw)) = best else {
            best = Some((i, load, weight));
            ties = 1;
            continue;
        };
        // Compare load/weight with bl/bw without division.
        let (lhs, rhs) = (load * bw, bl * weight);
        if lhs < rhs {
            best = Some((i, load, weight));
            ties = 1;
        } else if lhs == rhs {
            ties += 1;
            if rand_below(ties) == 0 {
                best = Some((i, load, weight));
            }
        }
    }
    best.map(|(i, _, _)| i)
}
