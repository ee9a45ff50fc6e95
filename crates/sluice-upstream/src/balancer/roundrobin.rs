//! Smooth weighted round robin (nginx `ngx_http_upstream_get_peer`, used by APISIX through
//! lua-resty-balancer's `roundrobin`) precomputed into a fixed sequence at build time, so a pick
//! is one `fetch_add` plus an index.
//!
//! Exactness: weights are divided by their gcd, and the sequence has one entry per remaining
//! weight unit, so every full cycle matches the weights exactly. When the reduced weights sum
//! to more than [`MAX_SEQUENCE`], each is scaled to `round(w * MAX_SEQUENCE / total)` (at least
//! 1): proportions are then exact to within one entry per node per cycle. Not handled here:
//! health and retries only skip entries (the filter), they never rebuild the sequence. A retry
//! does not advance the cursor (it scans from a random entry), so a failing node does not shift
//! the rotation of later requests.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{rand_below, Filter};

/// Upper bound on sequence entries (16 KiB of `u32` per priority group).
pub(super) const MAX_SEQUENCE: u64 = 4096;

/// The precomputed smooth sequence of one priority group and its shared cursor.
#[derive(Debug)]
pub(super) struct Sequence {
    seq: Box<[u32]>,
    /// Written by every pick from every worker: alone on its cache line so the writes do not
    /// also evict the read-only data next to it.
    cursor: PaddedCursor,
}

#[derive(Debug)]
#[repr(align(64))]
struct PaddedCursor(AtomicUsize);

impl Sequence {
    /// `members[i]` has weight `weights[i]` (> 0).
    pub(super) fn build(members: &[u32], weights: &[u32]) -> Self {
        let weights = scaled_weights(weights);
        let total: i64 = weights.iter().sum();
        let mut current = vec![0i64; weights.len()];
        let mut seq = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for _ in 0..total {
            // nginx: every peer gains its weight, the largest current wins (first on ties) and
            // pays back the total.
            let mut best = 0;
            for (i, w) in weights.iter().enumerate() {
                current[i] += w;
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            seq.push(members[best]);
        }
        // A random phase so that a fresh snapshot does not send its first burst to node 0.
        let start = if seq.is_empty() {
            0
        } else {
            rand_below(seq.len())
        };
        Sequence {
            seq: seq.into_boxed_slice(),
            cursor: PaddedCursor(AtomicUsize::new(start)),
        }
    }

    /// Next node in the sequence; with a filter, the next allowed one after the cursor.
    #[inline]
    pub(super) fn pick(&self, f: &Filter<'_>, open: bool) -> Option<usize> {
        let len = self.seq.len();
        if len == 0 {
            return None;
        }
        // A retry leaves the shared cursor alone: advancing it would make the failed node the first pick of the
        // next request again (with two nodes, every request would start on the slow one). It starts at a random
        // entry instead, which picks the untried nodes in proportion to their weights, and concurrent retries
        // spread rather than all landing on the entry under the cursor.
        let start = if f.is_retry() {
            rand_below(len)
        } else {
            self.cursor.0.fetch_add(1, Ordering::Relaxed) % len
        };
        if open {
            return Some(self.seq[start] as usize);
        }
        let (tail, head) = self.seq.split_at(start);
        head.iter()
            .chain(tail)
            .map(|&i| i as usize)
            .find(|&i| f.allows(i))
    }

    /// The entry the next first attempt would take, without moving the cursor.
    pub(super) fn peek(&self, f: &Filter<'_>) -> Option<usize> {
        let len = self.seq.len();
        if len == 0 {
            return None;
        }
        let start = self.cursor.0.load(Ordering::Relaxed) % len;
        let (tail, head) = self.seq.split_at(start);
        head.iter()
            .chain(tail)
            .map(|&i| i as usize)
            .find(|&i| f.allows(i))
    }

    #[cfg(test)]
    pub(super) fn entries(&self) -> &[u32] {
        &self.seq
    }
}

/// Weights divided by their gcd, then scaled down proportionally if they exceed
/// [`MAX_SEQUENCE`] entries in total.
pub(super) fn scaled_weights(weights: &[u32]) -> Vec<i64> {
    let g = weights
        .iter()
        .fold(0u64, |g, &w| gcd(g, u64::from(w)))
        .max(1);
    let mut w: Vec<u64> = weights.iter().map(|&w| u64::from(w) / g).collect();
    let total: u64 = w.iter().sum();
    if total > MAX_SEQUENCE {
        for x in &mut w {
            *x = ((*x * MAX_SEQUENCE + total / 2) / total).max(1);
        }
        let g = w.iter().fold(0u64, |g, &x| gcd(g, x)).max(1);
        w.iter_mut().for_each(|x| *x /= g);
    }
    w.into_iter()
        .map(|x| i64::try_from(x).unwrap_or(i64::MAX))
        .collect()
}

pub(super) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
