//! Instruction-count mode: each plain-proxy target runs under `valgrind --tool=callgrind`; after
//! a warm-up the counters are zeroed (`callgrind_control -z`), a fixed number of requests is sent,
//! the counters are dumped (`callgrind_control -d`) and total Ir / requests is reported. nginx runs
//! with `master_process off` so the one traced process does all the work. Counts are user space
//! only; kernel work (the loopback TCP floor) is invisible here by design.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use crate::gateway::{self, PATH};
use crate::loadgen::{run_load, LoadSpec, Stop};
use crate::procs::installed;
use crate::progress::Progress;
use crate::report::{RunResult, ScenarioReport, TargetResult};
use crate::runner::{finish, start_target, Ctx, Mock};
use crate::scenario::{Scenario, TargetKind};
use crate::stats::Latency;

/// Runs the instruction-count scenario over its targets (one round each: counts are deterministic enough).
pub fn run(ctx: &Ctx, s: &Scenario, mock: &Mock, progress: &mut Progress) -> ScenarioReport {
    let mut results = Vec::new();
    for kind in s
        .targets
        .iter()
        .copied()
        .filter(|t| ctx.peers || *t == TargetKind::Sluice)
    {
        progress.show(&format!("{} {} (callgrind)", s.name, kind.name()));
        let r = if !installed("valgrind") || !installed("callgrind_control") {
            Err("valgrind not installed".to_string())
        } else {
            one(ctx, s, kind, mock)
        };
        match r {
            Ok(run) => {
                let mut t = TargetResult::skipped(kind.name(), "builtin", 1, String::new());
                t.skip_reason = None;
                t.pinned_cpus = ctx.pin_gateway.clone();
                t.rounds.push(run);
                t.finish();
                results.push(t);
            }
            Err(why) => results.push(TargetResult::skipped(kind.name(), "builtin", 1, why)),
        }
        progress.advance(1);
    }
    finish(s, results, Vec::new())
}

fn one(ctx: &Ctx, s: &Scenario, kind: TargetKind, mock: &Mock) -> Result<RunResult, String> {
    let dir = ctx.work.join(format!("callgrind-{}", kind.name()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let out = dir.join("callgrind.out");
    let t = start_target(ctx, s, kind, mock.addr, Some(&out), "callgrind")?;
    let pid = t
        .proc
        .as_ref()
        .map(|p| p.pid())
        .ok_or("no process to trace")?;
    let n = match s.stop {
        Stop::Requests(n) => n,
        Stop::Duration(_) => 20_000,
    };
    let mut spec = LoadSpec::new(t.addr, PATH, s.concurrency, Stop::Requests(2_000));
    spec.headers = gateway::load_headers(s);
    spec.spread = gateway::spread(s);
    spec.timeout = Duration::from_secs(30);
    run_load(&spec)?;
    control(&["-z", &pid.to_string()])?;
    spec.stop = Stop::Requests(n);
    let r = run_load(&spec)?;
    let since = SystemTime::now();
    control(&["-d", &pid.to_string()])?;
    let ir = wait_for_totals(&dir, since)?;
    let done = r.requests.max(1);
    Ok(RunResult {
        requests: r.requests,
        duration_s: r.elapsed.as_secs_f64(),
        rps: r.rps(),
        bytes_per_s: r.bytes_per_s(),
        latency_us: Latency::from_histogram(&r.hist),
        errors: r.errors,
        cpu_us_per_req: None,
        origin_cpu_us_per_req: None,
        peak_rss_kib: None,
        instructions_per_req: Some(ir as f64 / done as f64),
        pct_of_baseline: None,
        noise: None,
        contaminated: false,
    })
}

pub(crate) fn control(args: &[&str]) -> Result<(), String> {
    let st = Command::new("callgrind_control")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("callgrind_control: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("callgrind_control {} failed", args.join(" ")))
    }
}

/// Waits (bounded) for a dump newer than `since` and returns its total Ir.
pub(crate) fn wait_for_totals(dir: &Path, since: SystemTime) -> Result<u64, String> {
    for _ in 0..100 {
        let mut newest: Option<(SystemTime, std::path::PathBuf)> = None;
        for e in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Ok(m) = e.metadata().and_then(|m| m.modified()) else {
                continue;
            };
            if name.starts_with("callgrind.out")
                && m >= since
                && newest.as_ref().is_none_or(|(t, _)| m > *t)
            {
                newest = Some((m, e.path()));
            }
        }
        if let Some((_, p)) = newest {
            if let Some(ir) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|t| parse_totals(&t))
            {
                return Ok(ir);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err("no callgrind dump appeared".into())
}

/// Total Ir from a callgrind dump (`totals:` or `summary:` line, first event column).
pub fn parse_totals(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_totals() {
        assert_eq!(
            super::parse_totals("events: Ir\nfn=x\n1 2\ntotals: 123456\n"),
            Some(123456)
        );
        assert_eq!(super::parse_totals("summary: 42 7\n"), Some(42));
        assert_eq!(super::parse_totals("events: Ir\n"), None);
    }
}
