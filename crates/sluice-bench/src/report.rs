//! The report: the stable JSON schema (`sluice-bench/1`, documented in docs/benchmark.md), the
//! per-target median over interleaved rounds, the "% of direct baseline" figure, and writing
//! DIR/report.json + DIR/report.html. Rendering of the HTML lives in `report/html.rs`.

mod html;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::loadgen::Errors;
use crate::procinfo::Environment;
use crate::scenario::Scenario;
use crate::stats::{median, Latency};

/// Schema identifier; bumped on any incompatible change.
pub const SCHEMA: &str = "sluice-bench/1";

/// Figures of one run (one round of one target), or the median over rounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunResult {
    pub requests: u64,
    pub duration_s: f64,
    pub rps: f64,
    pub bytes_per_s: f64,
    pub latency_us: Latency,
    pub errors: Errors,
    /// Target CPU (utime+stime of its process tree) per request, µs; absent for `direct`.
    pub cpu_us_per_req: Option<f64>,
    /// CPU of the origin's process per request, µs, where the scenario measures it (the Dubbo provider of the
    /// `dubbo` scenario).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_cpu_us_per_req: Option<f64>,
    /// Target peak RSS (VmHWM summed over its process tree), KiB.
    pub peak_rss_kib: Option<u64>,
    /// User-space instructions per request (callgrind scenarios only).
    pub instructions_per_req: Option<f64>,
    /// rps as a percentage of the direct baseline at the same concurrency and mock delay.
    pub pct_of_baseline: Option<f64>,
}

/// One target (direct, sluice, nginx, haproxy) within a scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetResult {
    pub target: String,
    /// `ok` or `skipped`.
    pub status: String,
    pub skip_reason: Option<String>,
    pub driver: String,
    pub workers: usize,
    /// CPUs the target was pinned to (`null`: not pinned).
    pub pinned_cpus: Option<String>,
    pub rounds: Vec<RunResult>,
    pub median: Option<RunResult>,
}

impl TargetResult {
    pub fn skipped(target: &str, driver: &str, workers: usize, reason: String) -> Self {
        TargetResult {
            target: target.to_string(),
            status: "skipped".into(),
            skip_reason: Some(reason),
            driver: driver.to_string(),
            workers,
            pinned_cpus: None,
            rounds: Vec::new(),
            median: None,
        }
    }

    /// Computes `median` from `rounds` (errors are summed over rounds, not medianed).
    pub fn finish(&mut self) {
        if self.rounds.is_empty() {
            self.status = "skipped".into();
            if self.skip_reason.is_none() {
                self.skip_reason = Some("no run completed".into());
            }
            return;
        }
        self.status = "ok".into();
        self.median = Some(median_run(&self.rounds));
    }
}

/// Per-field median of several runs.
pub fn median_run(runs: &[RunResult]) -> RunResult {
    let m = |f: &dyn Fn(&RunResult) -> f64| {
        median(&runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
    };
    let mo = |f: &dyn Fn(&RunResult) -> Option<f64>| {
        median(&runs.iter().filter_map(f).collect::<Vec<_>>())
    };
    let mut errors = Errors::default();
    for r in runs {
        errors.non_2xx += r.errors.non_2xx;
        errors.connect += r.errors.connect;
        errors.timeout += r.errors.timeout;
        errors.io += r.errors.io;
    }
    RunResult {
        requests: m(&|r| r.requests as f64) as u64,
        duration_s: m(&|r| r.duration_s),
        rps: m(&|r| r.rps),
        bytes_per_s: m(&|r| r.bytes_per_s),
        latency_us: Latency {
            p50: m(&|r| r.latency_us.p50),
            p75: m(&|r| r.latency_us.p75),
            p90: m(&|r| r.latency_us.p90),
            p99: m(&|r| r.latency_us.p99),
            p99_9: m(&|r| r.latency_us.p99_9),
            p99_99: m(&|r| r.latency_us.p99_99),
            max: m(&|r| r.latency_us.max),
            mean: m(&|r| r.latency_us.mean),
        },
        errors,
        cpu_us_per_req: mo(&|r| r.cpu_us_per_req),
        origin_cpu_us_per_req: mo(&|r| r.origin_cpu_us_per_req),
        peak_rss_kib: mo(&|r| r.peak_rss_kib.map(|v| v as f64)).map(|v| v as u64),
        instructions_per_req: mo(&|r| r.instructions_per_req),
        pct_of_baseline: None,
    }
}

/// One scenario with its targets' results.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    #[serde(flatten)]
    pub scenario: Scenario,
    /// `ok` when at least one target ran, else `skipped`.
    pub status: String,
    pub skip_reason: Option<String>,
    pub results: Vec<TargetResult>,
    /// Free-form findings (driver agreement, …).
    pub notes: Vec<String>,
}

/// Settings that shaped every run.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub duration_s: f64,
    pub warmup_s: f64,
    pub rounds: usize,
    pub driver: String,
    pub generator_threads: usize,
    pub mock_threads: usize,
    pub body_size: usize,
    pub timeout_s: f64,
    pub pin_gateway: Option<String>,
    pub pin_generator: Option<String>,
    pub pin_mock: Option<String>,
    pub sluice_bin: String,
    /// Generator spoke h2c instead of HTTP/1.1.
    pub h2c: bool,
}

/// The whole report (DIR/report.json).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub generated_at: String,
    pub command: String,
    pub total_seconds: f64,
    pub environment: Environment,
    pub settings: Settings,
    pub scenarios: Vec<ScenarioReport>,
}

impl Report {
    /// Fills `pct_of_baseline`: against a `direct` target in the same scenario, else the
    /// medians of direct-only scenarios with the same concurrency and mock delay.
    pub fn compute_baselines(&mut self) {
        let global: Vec<(usize, String, f64)> = self
            .scenarios
            .iter()
            // A gRPC scenario's `direct` is the greeter, no baseline for the mock's scenarios.
            .filter(|s| {
                !s.scenario.compare_drivers
                    && !s.scenario.callgrind
                    && !s.scenario.grpc_transcode
                    && !s.scenario.dubbo
                    && s.scenario.rate.is_none()
            })
            .flat_map(|s| {
                s.results
                    .iter()
                    .filter(|t| t.target == "direct")
                    .filter_map(move |t| {
                        t.median.as_ref().map(|m| {
                            (
                                s.scenario.concurrency,
                                s.scenario.mock_delay.to_string(),
                                m.rps,
                            )
                        })
                    })
            })
            .collect();
        for s in &mut self.scenarios {
            if s.scenario.callgrind || s.scenario.rate.is_some() {
                continue;
            }
            let local = s
                .results
                .iter()
                .find(|t| t.target == "direct")
                .and_then(|t| t.median.as_ref())
                .map(|m| m.rps);
            let key = (s.scenario.concurrency, s.scenario.mock_delay.to_string());
            let base = local.or_else(|| {
                global
                    .iter()
                    .find(|g| g.0 == key.0 && g.1 == key.1)
                    .map(|g| g.2)
            });
            let Some(base) = base.filter(|b| *b > 0.0) else {
                continue;
            };
            for t in &mut s.results {
                for r in t.rounds.iter_mut().chain(t.median.iter_mut()) {
                    r.pct_of_baseline = Some(r.rps * 100.0 / base);
                }
            }
        }
    }

    /// Writes DIR/report.json and DIR/report.html.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("report.json"), json).map_err(|e| format!("report.json: {e}"))?;
        std::fs::write(dir.join("report.html"), html::render(self))
            .map_err(|e| format!("report.html: {e}"))?;
        Ok(())
    }

    /// A plain-text table of medians for the terminal.
    pub fn text_summary(&self) -> String {
        let w = self
            .scenarios
            .iter()
            .flat_map(|s| s.results.iter().map(|t| t.target.chars().count()))
            .max()
            .unwrap_or(0)
            .max(8);
        let mut out = format!(
            "{:<26} {:<w$} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7}\n",
            "scenario",
            "target",
            "req/s",
            "p50 µs",
            "p99 µs",
            "max µs",
            "cpu|Ir",
            "errors",
            "% base"
        );
        for s in &self.scenarios {
            for t in &s.results {
                match &t.median {
                    Some(m) => out.push_str(&format!(
                        "{:<26} {:<w$} {:>10.0} {:>9.0} {:>9.0} {:>9.0} {:>8} {:>8} {:>7}\n",
                        s.scenario.name,
                        t.target,
                        m.rps,
                        m.latency_us.p50,
                        m.latency_us.p99,
                        m.latency_us.max,
                        m.cpu_us_per_req
                            .or(m.instructions_per_req)
                            .map(|v| format!("{v:.1}"))
                            .unwrap_or("-".into()),
                        m.errors.non_2xx + m.errors.failures(),
                        m.pct_of_baseline
                            .map(|v| format!("{v:.0}%"))
                            .unwrap_or("-".into()),
                    )),
                    None => out.push_str(&format!(
                        "{:<26} {:<w$} skipped: {}\n",
                        s.scenario.name,
                        t.target,
                        t.skip_reason.as_deref().unwrap_or("?")
                    )),
                }
            }
            if s.results.is_empty() {
                out.push_str(&format!(
                    "{:<26} {:<w$} skipped: {}\n",
                    s.scenario.name,
                    "-",
                    s.skip_reason.as_deref().unwrap_or("?")
                ));
            }
        }
        for s in &self.scenarios {
            for n in &s.notes {
                out.push_str(&format!("{}: {n}\n", s.scenario.name));
            }
        }
        out
    }
}

/// UTC timestamp `YYYY-MM-DDTHH:MM:SSZ` without a date crate (days-from-civil inverse).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests;
