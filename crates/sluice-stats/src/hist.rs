//! A latency histogram with logarithmic buckets: four per power of two of microseconds (HDR-style, ±12.5% at
//! worst), from 0 µs to ~268 s, the last bucket catching anything longer. Recording is a leading-zero count and
//! two shifts; merging is a bucket-wise sum, so per-worker histograms add up exactly to a process-wide one.

use std::time::Duration;

/// Sub-buckets per power of two (as a bit count).
const SUB_BITS: u32 = 2;
const SUB: u64 = 1 << SUB_BITS;
/// The highest power of two with its own buckets: 2^27 µs ≈ 134 s.
const TOP: u32 = 27;
/// Buckets 0..SUB are single microseconds; then `SUB` buckets per power of two from 2^SUB_BITS to 2^TOP.
pub const BUCKETS: usize = (SUB + (TOP + 1 - SUB_BITS) as u64 * SUB) as usize;

#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: [u32; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; BUCKETS],
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .finish()
    }
}

/// The bucket of a duration in microseconds.
#[inline]
pub fn bucket(us: u64) -> usize {
    if us < SUB {
        return us as usize;
    }
    let msb = 63 - us.leading_zeros();
    if msb > TOP {
        return BUCKETS - 1;
    }
    let sub = (us >> (msb - SUB_BITS)) & (SUB - 1);
    (SUB + u64::from(msb - SUB_BITS) * SUB + sub) as usize
}

/// The `[low, high)` microsecond range of bucket `i`.
pub fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < SUB {
        return (i, i + 1);
    }
    let shift = (i - SUB) / SUB;
    let sub = (i - SUB) % SUB;
    ((SUB + sub) << shift, (SUB + sub + 1) << shift)
}

/// Whole microseconds, without the u128 arithmetic of `Duration::as_micros` (wraps only past 584,000 years).
#[inline]
pub fn micros(d: Duration) -> u64 {
    d.as_secs()
        .wrapping_mul(1_000_000)
        .wrapping_add(u64::from(d.subsec_micros()))
}

impl Histogram {
    #[inline]
    pub fn record(&mut self, d: Duration) {
        self.record_bucket(bucket(micros(d)));
    }

    /// Counts one value of bucket `i` (from [`bucket`]; a second holds far fewer than 2^32 of anything).
    #[inline]
    pub fn record_bucket(&mut self, i: usize) {
        if let Some(c) = self.counts.get_mut(i) {
            *c = c.wrapping_add(1);
        }
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// The `q` quantile (0 < q ≤ 1) in milliseconds: the middle of the bucket holding the rank `ceil(q * n)`
    /// value; 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let n = self.count();
        if n == 0 {
            return 0.0;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                let (lo, hi) = bounds(i);
                return (lo + hi) as f64 / 2.0 / 1000.0;
            }
        }
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_their_values() {
        let mut prev_hi = 0;
        for i in 0..BUCKETS {
            let (lo, hi) = bounds(i);
            assert_eq!(
                lo,
                prev_hi,
                "bucket {i} starts where {} ended",
                i.max(1) - 1
            );
            assert!(hi > lo);
            assert_eq!(bucket(lo), i);
            assert_eq!(bucket(hi - 1), i);
            prev_hi = hi;
        }
        assert_eq!(prev_hi, 1 << (TOP + 1));
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket(1 << 40), BUCKETS - 1);
    }

    #[test]
    fn quantiles_land_in_the_right_bucket() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile_ms(0.5), 0.0);
        for _ in 0..98 {
            h.record(Duration::from_millis(2));
        }
        h.record(Duration::from_millis(100));
        h.record(Duration::from_millis(100));
        let p50 = h.quantile_ms(0.5);
        assert!((1.75..=2.25).contains(&p50), "{p50}");
        // 99th of 100 values: the second-to-last, i.e. one of the 100 ms ones.
        let p99 = h.quantile_ms(0.99);
        assert!((87.5..=112.5).contains(&p99), "{p99}");
        let mut other = Histogram::default();
        other.record(Duration::from_micros(3));
        h.merge(&other);
        assert_eq!(h.count(), 101);
    }

    #[test]
    fn micros_matches_std() {
        for d in [
            Duration::ZERO,
            Duration::from_nanos(999),
            Duration::from_micros(1_234_567),
            Duration::from_secs(3600),
        ] {
            assert_eq!(u128::from(micros(d)), d.as_micros());
        }
    }
}
