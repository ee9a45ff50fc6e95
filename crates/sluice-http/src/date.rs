//! The `Date:` value (RFC 9110 §5.6.7 IMF-fixdate, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`), formatted at most once
//! per second.
//!
//! It owns formatting and a per-owner cache. It deliberately has no process-global mutable state: a worker owns
//! a [`DateCache`] (refreshed from its own clock tick or per request), and [`now`] keeps one cache per thread for
//! callers without one. Reading is a 29-byte copy plus one `SystemTime::now()` (vDSO, no syscall) in `now()`.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate.
pub const DATE_LEN: usize = 29;

/// A formatted `Date:` value plus the second it was formatted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateCache {
    secs: u64,
    value: [u8; DATE_LEN],
}

impl Default for DateCache {
    fn default() -> Self {
        Self::new()
    }
}

// === impl DateCache ===

impl DateCache {
    /// A cache holding the current time.
    pub fn new() -> Self {
        let mut cache = DateCache {
            secs: 0,
            value: [0; DATE_LEN],
        };
        format_imf_fixdate(0, &mut cache.value);
        cache.refresh(SystemTime::now());
        cache
    }

    /// Re-format only if `now` is in a different second than the cached value.
    pub fn refresh(&mut self, now: SystemTime) {
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if secs != self.secs {
            self.secs = secs;
            format_imf_fixdate(secs, &mut self.value);
        }
    }

    /// The cached value (as of the last `refresh`).
    pub fn as_bytes(&self) -> &[u8; DATE_LEN] {
        &self.value
    }

    /// The cached value as a string.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.value).unwrap_or_default()
    }
}

thread_local! {
    static THREAD_CACHE: Cell<Option<DateCache>> = const { Cell::new(None) };
}

/// The current `Date:` value from this thread's cache (formatted at most once per second per thread).
pub fn now() -> [u8; DATE_LEN] {
    THREAD_CACHE.with(|cell| {
        let mut cache = cell.get().unwrap_or_else(DateCache::new);
        cache.refresh(SystemTime::now());
        cell.set(Some(cache));
        cache.value
    })
}

/// Format `unix_secs` (seconds since 1970-01-01T00:00:00Z) as IMF-fixdate into `out`. Years past 9999 wrap
/// (the format has four digits); not a concern for a clock.
pub fn format_imf_fixdate(unix_secs: u64, out: &mut [u8; DATE_LEN]) {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let days = unix_secs / 86_400;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);

    out[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    out[3..5].copy_from_slice(b", ");
    two(&mut out[5..7], day);
    out[7] = b' ';
    out[8..11].copy_from_slice(MONTHS[(month - 1) as usize]);
    out[11] = b' ';
    two(&mut out[12..14], year / 100 % 100);
    two(&mut out[14..16], year % 100);
    out[16] = b' ';
    two(&mut out[17..19], h);
    out[19] = b':';
    two(&mut out[20..22], m);
    out[22] = b':';
    two(&mut out[23..25], s);
    out[25..].copy_from_slice(b" GMT");
}

fn two(out: &mut [u8], v: u64) {
    out[0] = b'0' + (v / 10 % 10) as u8;
    out[1] = b'0' + (v % 10) as u8;
}

/// (year, month 1..=12, day 1..=31) for days since 1970-01-01, proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fmt(secs: u64) -> String {
        let mut out = [0u8; DATE_LEN];
        format_imf_fixdate(secs, &mut out);
        String::from_utf8(out.to_vec()).expect("ascii")
    }

    #[test]
    fn known_dates() {
        assert_eq!(fmt(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(fmt(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT"); // RFC 9110 §5.6.7 example
        assert_eq!(fmt(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(fmt(1_709_251_199), "Thu, 29 Feb 2024 23:59:59 GMT");
        assert_eq!(fmt(4_102_444_800), "Fri, 01 Jan 2100 00:00:00 GMT");
    }

    #[test]
    fn cache_changes_only_when_the_second_changes() {
        let t0 = UNIX_EPOCH + Duration::from_secs(784_111_777);
        let mut c = DateCache::new();
        c.refresh(t0);
        assert_eq!(c.as_str(), "Sun, 06 Nov 1994 08:49:37 GMT");
        c.refresh(t0 + Duration::from_millis(999));
        assert_eq!(c.as_str(), "Sun, 06 Nov 1994 08:49:37 GMT");
        c.refresh(t0 + Duration::from_millis(1000));
        assert_eq!(c.as_str(), "Sun, 06 Nov 1994 08:49:38 GMT");
    }

    #[test]
    fn thread_cache_is_a_current_date() {
        let v = now();
        assert!(v.ends_with(b" GMT"));
        let mut c = DateCache::new();
        c.refresh(SystemTime::now());
        // Same second, or the next one if the clock ticked between the two reads.
        assert_eq!(&v[..16], &c.as_bytes()[..16]);
    }
}
