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
    let n = members.len();
    let (a, b) = if open {
        if n < 2 {
            return members.first().map(|&i| i as usize);
        }
        let a = rand_below(n);
        let mut b = rand_below(n - 1);
        if b >= a {
            b += 1;
        }
        (members[a] as usize, members[b] as usize)
    } else {
        match sample_pair(members, f) {
            Ok(pair) => pair,
            Err(single) => return single,
        }
    };
    let (sa, sb) = (stats.get(a)?, stats.get(b)?);
    Some(if slower(sa, sb) { b } else { a })
}

/// Draws per candidate before falling back to an exact count of eligible members; groups this
/// small go straight to the count.
const SAMPLE_TRIES: usize = 8;

/// Two distinct, uniformly drawn eligible members: rejection sampling (O(1) while most members
/// are eligible), then an exact O(n) fallback. `Err` carries the answer when fewer than two
/// members are eligible.
fn sample_pair(members: &[u32], f: &Filter<'_>) -> Result<(usize, usize), Option<usize>> {
    let n = members.len();
    let draw = |skip: Option<usize>| {
        (0..SAMPLE_TRIES)
            .map(|_| members[rand_below(n)] as usize)
            .find(|&i| Some(i) != skip && f.allows(i))
    };
    // Small groups: an exact count is as cheap as a few failed draws.
    if n > SAMPLE_TRIES {
        if let Some(a) = draw(None) {
            if let Some(b) = draw(Some(a)) {
                return Ok((a, b));
            }
        }
    }
    let eligible = || members.iter().map(|&i| i as usize).filter(|&i| f.allows(i));
    match eligible().count() {
        0 => Err(None),
        1 => Err(eligible().next()),
        e => {
            let a = rand_below(e);
            let mut b = rand_below(e - 1);
            if b >= a {
                b += 1;
            }
            match (eligible().nth(a), eligible().nth(b)) {
                (Some(a), Some(b)) => Ok((a, b)),
                _ => Err(None),
            }
        }
    }
}
