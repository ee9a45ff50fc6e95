//! `least_conn` (APISIX `apisix/balancer/least_conn.lua`): the node with the lowest
//! `(active + 1) / weight` wins. APISIX keeps a binary heap behind a per-worker table; here the
//! score is read from per-node atomics by a linear scan of the priority group (no heap to lock),
//! compared by cross-multiplication in integers. Ties are broken by starting the scan at a
//! random member, so idle nodes share sequential traffic instead of node 0 taking it all.
//! Cost: O(group size) per pick (one relaxed load per node, no division); fine for the tens of
//! nodes upstreams have, measured with 100 in `benches/pick.rs`.

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
    let n = members.len();
    let start = if n > 1 { rand_below(n) } else { 0 };
    // (index, load = active + 1, weight) of the best node so far.
    let mut best: Option<(usize, u64, u64)> = None;
    let (tail, head) = members.split_at(start);
    for &i in head.iter().chain(tail) {
        let i = i as usize;
        if !f.allows(i) {
            continue;
        }
        let load = u64::from(stats[i].active.load(Ordering::Relaxed)) + 1;
        let weight = u64::from(nodes[i].weight);
        // load/weight < best_load/best_weight, without division.
        if best.is_none_or(|(_, bl, bw)| load * bw < bl * weight) {
            best = Some((i, load, weight));
        }
    }
    best.map(|(i, _, _)| i)
}
