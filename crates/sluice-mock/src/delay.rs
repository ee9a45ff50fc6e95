//! Response-delay distributions of the mock upstream: fixed (`20ms`), uniform (`uniform:10ms-30ms`) and
//! exponential (`exp:20ms`, mean given). Owns parsing and sampling only; it does not sleep (the
//! connection loop does) and uses a tiny per-connection xorshift generator so sampling costs a few
//! instructions and no dependency.

use std::fmt;
use std::time::Duration;

/// How long the mock waits before answering each request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delay {
    /// Always the same delay (`0ms` means answer at once).
    Fixed(Duration),
    /// Uniformly distributed between `lo` and `hi` (inclusive).
    Uniform(Duration, Duration),
    /// Exponentially distributed with the given mean.
    Exp(Duration),
}

impl Delay {
    /// True when no request is ever delayed, so the hot loop can skip the timer entirely.
    pub fn is_zero(&self) -> bool {
        matches!(self, Delay::Fixed(d) if d.is_zero())
    }

    /// Draws one delay using `rng`.
    pub fn sample(&self, rng: &mut XorShift) -> Duration {
        match *self {
            Delay::Fixed(d) => d,
            Delay::Uniform(lo, hi) => {
                let span = hi.as_nanos().saturating_sub(lo.as_nanos()) as u64;
                if span == 0 {
                    return lo;
                }
                lo + Duration::from_nanos(rng.next_u64() % (span + 1))
            }
            Delay::Exp(mean) => {
                // Inverse-CDF sampling; u in (0, 1] so ln(u) is finite.
                let u = ((rng.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                let secs = -mean.as_secs_f64() * u.ln();
                // Cap at 1000x the mean so one draw cannot stall a connection for ever.
                Duration::from_secs_f64(secs.min(mean.as_secs_f64() * 1000.0))
            }
        }
    }
}

impl fmt::Display for Delay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Delay::Fixed(d) => write!(f, "{}", fmt_duration(*d)),
            Delay::Uniform(lo, hi) => {
                write!(f, "uniform:{}-{}", fmt_duration(*lo), fmt_duration(*hi))
            }
            Delay::Exp(m) => write!(f, "exp:{}", fmt_duration(*m)),
        }
    }
}

impl std::str::FromStr for Delay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("uniform:") {
            let (lo, hi) = rest
                .split_once('-')
                .ok_or_else(|| format!("invalid delay {s:?}: expected uniform:LO-HI"))?;
            let (lo, hi) = (parse_duration(lo)?, parse_duration(hi)?);
            if hi < lo {
                return Err(format!(
                    "invalid delay {s:?}: upper bound below lower bound"
                ));
            }
            Ok(Delay::Uniform(lo, hi))
        } else if let Some(rest) = s.strip_prefix("exp:") {
            Ok(Delay::Exp(parse_duration(rest)?))
        } else if let Some(rest) = s.strip_prefix("fixed:") {
            Ok(Delay::Fixed(parse_duration(rest)?))
        } else {
            Ok(Delay::Fixed(parse_duration(s)?))
        }
    }
}

/// Parses `250us`, `20ms`, `1.5s`, or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1e-3)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// Formats a duration the way [`parse_duration`] reads it back.
pub fn fmt_duration(d: Duration) -> String {
    let us = d.as_micros();
    if us.is_multiple_of(1_000_000) && us > 0 {
        format!("{}s", us / 1_000_000)
    } else if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

/// xorshift64*: not cryptographic, only needs to spread delays.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// Seeds the generator; a zero seed is replaced because xorshift would stay at zero.
    pub fn new(seed: u64) -> Self {
        XorShift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Next pseudo-random value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_forms() {
        assert_eq!("0ms".parse::<Delay>(), Ok(Delay::Fixed(Duration::ZERO)));
        assert_eq!(
            "20ms".parse::<Delay>(),
            Ok(Delay::Fixed(Duration::from_millis(20)))
        );
        assert_eq!(
            "250us".parse::<Delay>(),
            Ok(Delay::Fixed(Duration::from_micros(250)))
        );
        assert_eq!(
            "uniform:10ms-30ms".parse::<Delay>(),
            Ok(Delay::Uniform(
                Duration::from_millis(10),
                Duration::from_millis(30)
            ))
        );
        assert_eq!(
            "exp:20ms".parse::<Delay>(),
            Ok(Delay::Exp(Duration::from_millis(20)))
        );
        assert!("uniform:30ms-10ms".parse::<Delay>().is_err());
        assert!("fast".parse::<Delay>().is_err());
        assert!("-1ms".parse::<Delay>().is_err());
        assert_eq!(
            Delay::Uniform(Duration::from_millis(10), Duration::from_secs(1)).to_string(),
            "uniform:10ms-1s"
        );
    }

    #[test]
    fn uniform_stays_in_bounds_and_exp_has_the_mean() {
        let mut rng = XorShift::new(7);
        let u = Delay::Uniform(Duration::from_millis(10), Duration::from_millis(30));
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let d = u.sample(&mut rng);
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(30));
            sum += d.as_secs_f64();
        }
        assert!(
            (sum / 10_000.0 - 0.020).abs() < 0.001,
            "uniform mean {}",
            sum / 10_000.0
        );
        let e = Delay::Exp(Duration::from_millis(20));
        let mean: f64 = (0..20_000)
            .map(|_| e.sample(&mut rng).as_secs_f64())
            .sum::<f64>()
            / 20_000.0;
        assert!((mean - 0.020).abs() < 0.002, "exp mean {mean}");
    }
}
