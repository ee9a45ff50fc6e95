//! `ewma` (APISIX `apisix/balancer/ewma.lua`, after Finagle's PeakEwma): each node keeps an
//! exponentially weighted moving average of request latency whose weight decays with *time*
//! (`w = exp(-Δt / 10 s)`, APISIX's `DECAY_TIME`), and a pick samples two random eligible nodes
//! and takes the one with the lower score (power of two choices). The score is the stored
//! average decayed towards 0 since its last update, so a slow node that stopped getting
//! traffic is eventually tried again; a never-measured node scores 0 and is tried first.
//!
//! Differences from APISIX, deliberate: state lives in per-node atomics of this balancer (not a
//! shared dict behind `resty.lock`), so it restarts with each config snapshot; concurrent
//! updates race benignly (one CAS on the average, last-writer timestamp); a failed request
//! never lowers a node's average (APISIX records a fast connect failure as a fast node).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{rand_below, Filter, NodeStats};

/// APISIX's `DECAY_TIME` (10 s), in nanoseconds.
const DECAY_NS: f64 = 10e9;

/// The node's latency estimate at `now_ns` (seconds).
#[inline]
pub(super) fn score(s: &NodeStats, now_ns: u64) -> f64 {
    let touched = s.touched.load(Ordering::Relaxed);
    if touched == 0 {
        return 0.0;
    }
    let ewma = f64::from_bits(s.ewma.load(Ordering::Relaxed));
    ewma * decay(now_ns.saturating_sub(touched - 1))
}

/// Folds one request's latency into the node's average.
pub(super) fn record(s: &NodeStats, elapsed: Duration, ok: bool, now_ns: u64) {
    let rtt = elapsed.as_secs_f64();
    let touched = s.touched.load(Ordering::Relaxed);
    let _ = s
        .ewma
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |bits| {
            let ewma = f64::from_bits(bits);
            // First sample: APISIX's last_touched_at is 0, so its weight is ~0 and ewma = rtt.
            if touched == 0 {
                return Some(rtt.to_bits());
            }
            let sample = if ok { rtt } else { rtt.max(ewma) };
            let w = decay(now_ns.saturating_sub(touched - 1));
            Some((ewma * w + sample * (1.0 - w)).to_bits())
        });
    s.touched.store(now_ns.saturating_add(1), Ordering::Relaxed);
}

/// `score(a, now) > score(b, now)` for any `now`: both decay from their own timestamps, so
/// `now` cancels out and one `exp` of the timestamp gap suffices (no clock read on the pick).
#[inline]
fn slower(a: &NodeStats, b: &NodeStats) -> bool {
    let (ta, tb) = (
        a.touched.load(Ordering::Relaxed),
        b.touched.load(Ordering::Relaxed),
    );
    let ea = f64::from_bits(a.ewma.load(Ordering::Relaxed));
    let eb = f64::from_bits(b.ewma.load(Ordering::Relaxed));
    if ta == 0 || tb == 0 {
        // Never measured scores 0: `a` is slower only if it was measured and `b` was not.
        return ta != 0 && tb == 0 && ea > 0.0;
    }
    // ea * e^-(now-ta)/D > eb * e^-(now-tb)/D  <=>  ea * e^-(tb-ta)/D > eb
    let gap = tb as f64 - ta as f64;
    if gap == 0.0 {
        ea > eb
    } else {
        ea * (-gap / DECAY_NS).exp() > eb
    }
}

#[inline]
fn decay(elapsed_ns: u64) -> f64 {
    (-(elapsed_ns as f64) / DECAY_NS).exp()
}

/// Power of two choices among the group's eligible members.
#[inline]
pub(super) fn pick(
    members: &[u32],
    stats: &[NodeStats],
    f: &Filter<'_>,
    open: bool,
) -> Option<usize> {
    let eligible = if open {
        members.len()
    } else {
        members.iter().filter(|&&i| f.allows(i as usize)).count()
    };
    let nth = |r: usize| -> Option<usize> {
        if open {
            members.get(r).map(|&i| i as usize)
        } else {
            members
                .iter()
                .map(|&i| i as usize)
                .filter(|&i| f.allows(i))
                .nth(r)
        }
    };
    match eligible {
        0 => None,
        1 => nth(0),
        n => {
            let a = rand_below(n);
            let mut b = rand_below(n - 1);
            if b >= a {
                b += 1;
            }
            let (a, b) = (nth(a)?, nth(b)?);
            Some(if slower(&stats[a], &stats[b]) { b } else { a })
        }
    }
}
