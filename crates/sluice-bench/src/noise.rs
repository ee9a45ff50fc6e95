//! How much of the box something else used during a measured round ("foreign CPU"), so the report can
//! tell a clean round from a contaminated one instead of printing both with the same confidence.
//!
//! Foreign CPU over a round = busy time of the whole machine (/proc/stat: every column but idle and
//! iowait) minus the CPU time of the processes the round is made of: the gateway (or nginx / HAProxy)
//! tree, the mock tree, this process (the built-in generator's threads) with its reaped children (wrk,
//! ab, h2load), and the kernel's ksoftirqd threads (which run the round's own loopback traffic when the
//! softirq load is high). With tick-based accounting (no IRQ time accounting, as on the kernels this
//! suite runs on) a softirq tick is charged both to /proc/stat's softirq column and to the interrupted
//! process, so softirq stays in "busy" and is subtracted with the process that ran it. The result is in
//! percent of one CPU, averaged over the round. Steal time (the hypervisor giving the CPU to another
//! guest) counts as foreign. The 1-minute load average is recorded at the end of each round beside it
//! (it counts the benchmark's own runnable threads, so it describes the box, it does not decide the flag).

use serde::{Deserialize, Serialize};

use crate::procinfo::{clock_ticks, cpu_ticks_tree};

/// A round is contaminated when foreign work averaged more than this, in percent of one CPU.
///
/// Why 10%: the gateway is pinned to one core and every other process of the round shares the rest, so
/// foreign work of 10% of a core can take up to 10% of the gateway's (or the generator's) time, which is
/// the spread this suite already treats as disagreement (driver-agreement's 10%). Below it, a round's
/// figures move less than the rounds of one target usually do between themselves.
pub const FOREIGN_CPU_THRESHOLD_PCT: f64 = 10.0;

/// Busy ticks of the whole machine from /proc/stat's first line: user + nice + system + irq + softirq +
/// steal (guest time is inside user already).
pub fn system_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_busy(stat.lines().next()?)
}

/// Parses `cpu  user nice system idle iowait irq softirq steal ...`.
pub fn parse_busy(line: &str) -> Option<u64> {
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal
    Some(get(0) + get(1) + get(2) + get(5) + get(6) + get(7))
}

/// utime + stime + cutime + cstime of this process: every generator thread, and external generators
/// (wrk, ab, h2load) once they have been waited for.
pub fn self_ticks_with_children() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
    Some(n(11)? + n(12)? + n(13)? + n(14)?)
}

/// The kernel's per-CPU softirq threads (`ksoftirqd/N`).
pub fn ksoftirqd_pids() -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("ksoftirqd/"))
        {
            out.push(pid);
        }
    }
    out
}

/// The 1-minute load average.
pub fn load_avg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Counters at the start of a round.
#[derive(Debug, Clone)]
pub struct Sampler {
    pids: Vec<u32>,
    with_self: bool,
    busy: Option<u64>,
    own: Option<u64>,
    at: std::time::Instant,
}

/// What a round's noise sample says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Noise {
    /// Foreign CPU over the round, percent of one CPU (may read slightly below 0 from tick rounding).
    pub foreign_cpu_pct: f64,
    /// 1-minute load average at the end of the round.
    pub load_avg_1m: f64,
}

impl Noise {
    /// Whether the round should not be trusted.
    pub fn contaminated(&self) -> bool {
        self.foreign_cpu_pct > FOREIGN_CPU_THRESHOLD_PCT
    }
}

impl Sampler {
    /// Starts a sample; `pids` are the roots of the round's process trees besides this process (gateway,
    /// mock).
    pub fn start(pids: &[u32]) -> Self {
        Self::start_with(pids, true)
    }

    /// As [`Sampler::start`]; `with_self: false` leaves this process out of the round's own work. Its
    /// reaped children's time lands in cutime all at once when they are waited for, so a child started
    /// before the sample and reaped during it (another test's generator in a parallel test run) would
    /// count its whole life as own work of the window.
    pub fn start_with(pids: &[u32], with_self: bool) -> Self {
        let mut pids = pids.to_vec();
        pids.extend(ksoftirqd_pids());
        Sampler {
            own: Self::own_ticks(&pids, with_self),
            with_self,
            pids,
            busy: system_busy_ticks(),
            at: std::time::Instant::now(),
        }
    }

    fn own_ticks(pids: &[u32], with_self: bool) -> Option<u64> {
        let mut t = if with_self {
            self_ticks_with_children()?
        } else {
            0
        };
        for p in pids {
            t += cpu_ticks_tree(*p).unwrap_or(0);
        }
        Some(t)
    }

    /// Ends the sample. `None` where /proc is not readable.
    pub fn finish(&self) -> Option<Noise> {
        let busy1 = system_busy_ticks()?;
        let own1 = Self::own_ticks(&self.pids, self.with_self)?;
        let secs = self.at.elapsed().as_secs_f64().max(1e-3);
        Some(foreign(
            busy1.checked_sub(self.busy?)?,
            own1.saturating_sub(self.own?),
            secs,
            clock_ticks(),
            load_avg_1m().unwrap_or(0.0),
        ))
    }
}

/// The arithmetic: (machine busy − own) ticks over `secs`, as percent of one CPU.
pub fn foreign(busy: u64, own: u64, secs: f64, clk_tck: u64, load: f64) -> Noise {
    let ticks = busy as f64 - own as f64;
    Noise {
        foreign_cpu_pct: ticks * 100.0 / clk_tck.max(1) as f64 / secs,
        load_avg_1m: load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn proc_stat_busy_is_everything_but_idle_and_iowait() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let l = "cpu  100 5 50 9000 70 3 40 2 0 0";
        assert_eq!(parse_busy(l), Some(100 + 5 + 50 + 3 + 40 + 2));
        assert_eq!(parse_busy("cpu0 1 2 3 4"), None);
        assert_eq!(parse_busy("cpu 1 2"), None);
    }

    #[test]
    fn flag_logic_on_samples() {
        // 10 s rounds at CLK_TCK 100.
        // Clean: the box was busy 1,530 ticks, the round's processes used 1,512 of them: 1.8% of a core.
        let clean = foreign(1_530, 1_512, 10.0, 100, 2.1);
        assert!((clean.foreign_cpu_pct - 1.8).abs() < 1e-9);
        assert!(!clean.contaminated());
        // A busy loop beside the round: ~96% of a core that none of the round's processes used.
        let dirty = foreign(2_490, 1_530, 10.0, 100, 3.4);
        assert!((dirty.foreign_cpu_pct - 96.0).abs() < 1e-9);
        assert!(dirty.contaminated());
        // Right at the threshold is still clean; just above is not.
        assert!(!foreign(1_100, 1_000, 10.0, 100, 0.0).contaminated());
        assert!(foreign(1_101, 1_000, 10.0, 100, 0.0).contaminated());
        // Tick rounding can make own exceed busy by a tick or two: negative, clean.
        assert!(!foreign(1_000, 1_002, 10.0, 100, 0.0).contaminated());
    }

    /// A real contaminated window: a busy-loop process burns a CPU while a sample covers the kernel's
    /// softirq threads only; the sample must flag it. The loop is a child of this test and is killed by its own id.
    #[test]
    fn a_busy_loop_beside_the_round_is_flagged() {
        let mut burner = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("spawn busy loop");
        std::thread::sleep(Duration::from_millis(100));
        // Without this process: the other tests of this binary run beside this one and reap generators
        // they started before the window (see `start_with`).
        let s = Sampler::start_with(&[], false);
        std::thread::sleep(Duration::from_millis(1500));
        let n = s.finish();
        let _ = burner.kill();
        let _ = burner.wait();
        let n = n.expect("/proc readable");
        // The loop alone is ~100% of a core (less if the box is shared); anything over 30% proves it was seen.
        assert!(n.foreign_cpu_pct > 30.0, "{n:?}");
        assert!(n.contaminated(), "{n:?}");
        assert!(n.load_avg_1m >= 0.0);
        // This kernel has its softirq threads, and they are counted as the round's own.
        assert!(!ksoftirqd_pids().is_empty());
        assert!(s.pids.len() >= ksoftirqd_pids().len());
    }
}
