//! The report: the stable JSON schema (`sluice-bench/1`, documented in docs/benchmark.md), the
//! per-target median over interleaved rounds, the "% of direct baseline" figure, and writing
//! DIR/report.json + DIR/report.html. Rendering of the HTML lives in `report/html.rs`.

mod html;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::loadgen::Errors;
use crate::noise::Noise;
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
    /// Foreign CPU and load average over the round (see `noise`); absent for medians and where /proc is
    /// not readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<Noise>,
    /// The round's foreign CPU was above `noise::FOREIGN_CPU_THRESHOLD_PCT`: left out of the median
    /// when at least one clean round exists.
    #[serde(default)]
    pub contaminated: bool,
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
    /// Resident set of the target's process tree (VmRSS) once it answered, before any load, KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_rss_kib: Option<u64>,
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
            idle_rss_kib: None,
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
        for r in &mut self.rounds {
            r.contaminated = r.noise.is_some_and(|n| n.contaminated());
        }
        // Contaminated rounds stay in `rounds` (flagged) but leave the median when a clean one exists.
        let clean: Vec<RunResult> = self
            .rounds
            .iter()
            .filter(|r| !r.contaminated)
            .cloned()
            .collect();
        self.median = Some(median_run(if clean.is_empty() {
            &self.rounds
        } else {
            &clean
        }));
        if clean.is_empty() {
            if let Some(m) = self.median.as_mut() {
                m.contaminated = true;
            }
        }
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
        noise: None,
        contaminated: false,
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
    /// `--preset`: the report's method, its published figures and ours beside them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<crate::preset::PresetReport>,
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
        self.noise_notes();
    }

    /// Notes that keep a reader from trusting what should not be trusted: contaminated rounds, and any
    /// "% of direct" above 100 (a proxy in front of the mock cannot serve more than the mock alone: the
    /// baseline was measured low).
    fn noise_notes(&mut self) {
        for s in &mut self.scenarios {
            for t in &s.results {
                let bad: Vec<String> = t
                    .rounds
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.contaminated)
                    .map(|(i, r)| {
                        let n = r.noise.unwrap_or_default();
                        format!(
                            "round {} (foreign CPU {:.0}% of a CPU, load {:.2})",
                            i + 1,
                            n.foreign_cpu_pct,
                            n.load_avg_1m
                        )
                    })
                    .collect();
                if !bad.is_empty() {
                    let clean = t.rounds.len() - bad.len();
                    s.notes.push(format!(
                        "CONTAMINATED {} ({}): {} of {} rounds had foreign CPU above {:.0}% of a CPU: {}; {}",
                        t.target,
                        t.driver,
                        bad.len(),
                        t.rounds.len(),
                        crate::noise::FOREIGN_CPU_THRESHOLD_PCT,
                        bad.join(", "),
                        if clean > 0 {
                            format!("the median is over the {clean} clean round(s)")
                        } else {
                            "no clean round: the median is not to be trusted".into()
                        }
                    ));
                }
                if let Some(p) = t
                    .median
                    .as_ref()
                    .and_then(|m| m.pct_of_baseline)
                    .filter(|p| *p > 100.0)
                {
                    s.notes.push(format!(
                        "WARNING {} at {p:.0}% of direct: above 100% means the direct baseline was measured \
                         low (noise, or the generator/mock was the bottleneck there), not that a proxy beats no \
                         proxy; do not read it as a gain",
                        t.target
                    ));
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
            "{:<26} {:<w$} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7}  {}\n",
            "scenario",
            "target",
            "req/s",
            "p50 µs",
            "p99 µs",
            "max µs",
            "cpu|Ir",
            "errors",
            "% base",
            "rounds: p99 µs (foreign CPU %), ! = contaminated"
        );
        for s in &self.scenarios {
            for t in &s.results {
                match &t.median {
                    Some(m) => out.push_str(&format!(
                        "{:<26} {:<w$} {:>10.0} {:>9.0} {:>9.0} {:>9.0} {:>8} {:>8} {:>7}  {}\n",
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
                            .map(|v| if v > 100.0 {
                                format!("{v:.0}%!")
                            } else {
                                format!("{v:.0}%")
                            })
                            .unwrap_or("-".into()),
                        rounds_text(&t.rounds),
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
        out.push_str(&self.scenario_summary());
        for s in &self.scenarios {
            for n in &s.notes {
                out.push_str(&format!("{}: {n}\n", s.scenario.name));
            }
        }
        out
    }

    /// One line per scenario: Sluice's medians against the peers and the baseline, its costs, and how
    /// many of its rounds were clean.
    pub fn scenario_summary(&self) -> String {
        let mut out = format!(
            "\nsummary (Sluice per scenario){}\n{:<26} {:>10} {:>8} {:>8} {:>7} {:>9} {:>8} {:>9} {:>9} {:>9} {:>6}\n",
            if self.environment.load_average.is_empty() {
                String::new()
            } else {
                format!("; load average at start {}", self.environment.load_average)
            },
            "scenario",
            "req/s",
            "/nginx",
            "/haproxy",
            "% base",
            "p99 µs",
            "cpu µs",
            "instr/req",
            "idle MiB",
            "peak MiB",
            "clean"
        );
        let f = |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or("-".into());
        for s in &self.scenarios {
            let med = |name: &str| {
                s.results
                    .iter()
                    .find(|t| t.target == name)
                    .and_then(|t| t.median.as_ref())
            };
            let Some(t) = s.results.iter().find(|t| t.target == "sluice") else {
                continue;
            };
            let Some(m) = &t.median else {
                out.push_str(&format!(
                    "{:<26} skipped: {}\n",
                    s.scenario.name,
                    t.skip_reason.as_deref().unwrap_or("?")
                ));
                continue;
            };
            // Throughput ratio for load runs; for instruction counts the ratio of instructions.
            let ratio = |peer: &str| -> Option<f64> {
                let p = med(peer)?;
                match (m.instructions_per_req, p.instructions_per_req) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ if p.rps > 0.0 => Some(m.rps / p.rps),
                    _ => None,
                }
            };
            let clean = t.rounds.iter().filter(|r| !r.contaminated).count();
            out.push_str(&format!(
                "{:<26} {:>10.0} {:>8} {:>8} {:>7} {:>9.0} {:>8} {:>9} {:>9} {:>9} {:>6}\n",
                s.scenario.name,
                m.rps,
                f(ratio("nginx"), 2),
                f(ratio("haproxy"), 2),
                m.pct_of_baseline
                    .map(|v| if v > 100.0 {
                        format!("{v:.0}%!")
                    } else {
                        format!("{v:.0}%")
                    })
                    .unwrap_or("-".into()),
                m.latency_us.p99,
                f(m.cpu_us_per_req, 2),
                f(m.instructions_per_req, 0),
                f(t.idle_rss_kib.map(|k| k as f64 / 1024.0), 1),
                f(m.peak_rss_kib.map(|k| k as f64 / 1024.0), 1),
                format!("{clean}/{}", t.rounds.len())
            ));
        }
        out.push_str(
            "(/nginx, /haproxy: Sluice's req/s over the peer's, or its instructions/request over the peer's \
             for the instructions scenario; ! = above 100% of direct, see the warning)\n",
        );
        out
    }
}

/// Per-round p99 and foreign CPU, `!` on contaminated rounds: `812 (1%) 790 (2%) 1020 (35%)!`.
fn rounds_text(rounds: &[RunResult]) -> String {
    rounds
        .iter()
        .map(|r| {
            format!(
                "{:.0}{}{}",
                r.latency_us.p99,
                r.noise
                    .map(|n| format!(" ({:.0}%)", n.foreign_cpu_pct))
                    .unwrap_or_default(),
                if r.contaminated { "!" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
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
