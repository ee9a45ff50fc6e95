//! Facts read from /proc and the system: CPU time and peak RSS of a process tree (gateway CPU µs
//! per request, VmHWM), the machine description for the report, and CPU pinning via `taskset`
//! (the workspace forbids `unsafe`, so no direct sched_setaffinity). Linux only; elsewhere the
//! figures are reported as absent rather than guessed.

use std::process::Command;

use serde::{Deserialize, Serialize};

/// CPU time (user + system) of `pid` and its direct children (nginx workers), in clock ticks.
pub fn cpu_ticks_tree(pid: u32) -> Option<u64> {
    let mut total = cpu_ticks(pid)?;
    for c in children(pid) {
        total += cpu_ticks(c).unwrap_or(0);
    }
    Some(total)
}

/// utime + stime of one process from /proc/PID/stat.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Sum of VmHWM (peak resident set) over `pid` and its direct children, in KiB.
pub fn peak_rss_kib_tree(pid: u32) -> Option<u64> {
    let mut total = peak_rss_kib(pid)?;
    for c in children(pid) {
        total += peak_rss_kib(c).unwrap_or(0);
    }
    Some(total)
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Sum of VmRSS (current resident set) over `pid` and its direct children, in KiB.
pub fn rss_kib_tree(pid: u32) -> Option<u64> {
    let mut total = status_kib(pid, "VmRSS:")?;
    for c in children(pid) {
        total += status_kib(c, "VmRSS:").unwrap_or(0);
    }
    Some(total)
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on every mainstream Linux).
pub fn clock_ticks() -> u64 {
    command_line("getconf", &["CLK_TCK"])
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// Number of CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// First line of a command's stdout (or stderr, for tools like `nginx -v`), if it runs.
pub fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

/// Pins every thread of the current process to `cpus` (taskset list syntax, e.g. `0` or `0-1`).
pub fn pin_self(cpus: &str) -> Result<(), String> {
    let pid = std::process::id().to_string();
    let st = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid])
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("taskset: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("taskset -a -p -c {cpus} failed"))
    }
}

/// The machine the report was produced on.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Environment {
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    pub os: String,
    pub sluice_version: String,
    pub nginx_version: Option<String>,
    pub haproxy_version: Option<String>,
    pub wrk_version: Option<String>,
    pub h2load_version: Option<String>,
    pub valgrind_version: Option<String>,
    /// /proc/loadavg when the run started: a busy machine makes every figure noisy.
    pub load_average: String,
}

impl Environment {
    /// Collects what the machine tells about itself; missing tools are `None`.
    pub fn collect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|s| {
                s.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| {
                    l.trim_start_matches("PRETTY_NAME=")
                        .trim_matches('"')
                        .to_string()
                })
            })
            .unwrap_or_else(|| std::env::consts::OS.into());
        Environment {
            cpu_model,
            cores: cores(),
            kernel: command_line("uname", &["-r"]).unwrap_or_default(),
            os,
            sluice_version: env!("CARGO_PKG_VERSION").to_string(),
            nginx_version: command_line("nginx", &["-v"]),
            haproxy_version: command_line("haproxy", &["-v"]),
            wrk_version: command_line("wrk", &["-v"]).filter(|s| s.starts_with("wrk")),
            h2load_version: command_line("h2load", &["--version"]),
            valgrind_version: command_line("valgrind", &["--version"]),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_and_rss() {
        let pid = std::process::id();
        // Burn CPU until at least one tick is accounted (bounded: a loaded machine is slow).
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while cpu_ticks(pid).unwrap_or(0) == 0 && t.elapsed() < std::time::Duration::from_secs(5) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        assert!(cpu_ticks(pid).expect("stat") > 0);
        // Own ticks first: the tree's, read after, cannot be fewer (ticks only grow; other test threads of this
        // process keep adding some between the two reads).
        let own = cpu_ticks(pid).expect("stat");
        assert!(cpu_ticks_tree(pid).expect("stat") >= own);
        assert!(peak_rss_kib_tree(pid).expect("status") > 100);
        let rss = rss_kib_tree(pid).expect("status");
        assert!(rss > 100 && rss <= peak_rss_kib_tree(pid).expect("status"));
        assert!(cpu_ticks(u32::MAX).is_none());
        assert!(clock_ticks() >= 100);
    }
}
