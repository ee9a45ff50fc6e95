//! Latency histogram and the summary figures reported per run (p50 … p99.99, max, mean), plus
//! the median-of-rounds helper. Owns the unit choice: histograms record nanoseconds, summaries
//! report microseconds. Does not know about scenarios or targets.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency the histogram tracks (values above saturate): 60 s in nanoseconds.
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// A new latency histogram: 1 ns .. 60 s at 3 significant digits (~0.1% error).
pub fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts; failure would be a programming error.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("static histogram bounds are valid")
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p75: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub p99_99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Latency {
    /// Summarizes a nanosecond histogram; an empty histogram gives zeros.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
        Latency {
            p50: q(0.50),
            p75: q(0.75),
            p90: q(0.90),
            p99: q(0.99),
            p99_9: q(0.999),
            p99_99: q(0.9999),
            max: h.max() as f64 / 1000.0,
            mean: h.mean() / 1000.0,
        }
    }

    /// The percentiles as (label, value) pairs, in order, for tables and charts.
    pub fn points(&self) -> [(&'static str, f64); 7] {
        [
            ("p50", self.p50),
            ("p75", self.p75),
            ("p90", self.p90),
            ("p99", self.p99),
            ("p99.9", self.p99_9),
            ("p99.99", self.p99_99),
            ("max", self.max),
        ]
    }
}

/// Median of the values (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= b.abs() * rel
    }

    #[test]
    fn percentiles_of_a_uniform_ramp() {
        let mut h = new_histogram();
        // 1..=100_000 µs, one sample each.
        for us in 1..=100_000u64 {
            h.record(us * 1000).expect("in range");
        }
        let l = Latency::from_histogram(&h);
        assert!(close(l.p50, 50_000.0, 0.002), "{l:?}");
        assert!(close(l.p75, 75_000.0, 0.002), "{l:?}");
        assert!(close(l.p90, 90_000.0, 0.002), "{l:?}");
        assert!(close(l.p99, 99_000.0, 0.002), "{l:?}");
        assert!(close(l.p99_9, 99_900.0, 0.002), "{l:?}");
        assert!(close(l.p99_99, 99_990.0, 0.002), "{l:?}");
        assert!(close(l.max, 100_000.0, 0.002), "{l:?}");
        assert!(close(l.mean, 50_000.5, 0.002), "{l:?}");
    }

    #[test]
    fn tail_outliers_show_only_in_high_percentiles() {
        let mut h = new_histogram();
        for _ in 0..9_990 {
            h.record(100_000).expect("in range"); // 100 µs
        }
        for _ in 0..10 {
            h.record(50_000_000).expect("in range"); // 50 ms
        }
        let l = Latency::from_histogram(&h);
        assert!(close(l.p99, 100.0, 0.002), "{l:?}");
        assert!(close(l.p99_9, 100.0, 0.002), "{l:?}");
        assert!(close(l.p99_99, 50_000.0, 0.002), "{l:?}");
        assert!(close(l.max, 50_000.0, 0.002), "{l:?}");
        // Values past the bound saturate instead of failing.
        h.saturating_record(MAX_LATENCY_NS * 10);
        assert!(Latency::from_histogram(&h).max >= 59_000_000.0);
    }

    #[test]
    fn empty_histogram_and_median() {
        assert_eq!(
            Latency::from_histogram(&new_histogram()),
            Latency::default()
        );
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }
}
