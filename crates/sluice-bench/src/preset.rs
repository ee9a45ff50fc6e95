//! `sluice bench --preset NAME`: the method of a published benchmark report, as a table of scenario names
//! (and, where the report used one, its load generator), with the report's own figure and source printed
//! beside ours. One table, no per-report code path: adding a report is adding a row.

use std::time::Duration;

use serde::Serialize;

use crate::drivers::Driver;
use crate::report::ScenarioReport;
use crate::scenario::{self, Scenario};

/// A figure a report published, for one of the preset's scenarios.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Published {
    /// The preset scenario it compares with.
    pub scenario: &'static str,
    pub rps: f64,
    /// p99 in milliseconds, where published.
    pub p99_ms: Option<f64>,
    /// What was measured there (product, version, machine, load).
    pub setup: &'static str,
    pub source: &'static str,
}

/// One report's method.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Preset {
    pub name: &'static str,
    pub title: &'static str,
    /// Where the report (or its method) is published.
    pub source: &'static str,
    /// The method as the report describes it, and how the scenarios map it.
    pub method: &'static str,
    pub scenarios: &'static [&'static str],
    /// Load generator the report used, forced on every scenario of the preset.
    #[serde(skip)]
    pub driver: Option<Driver>,
    pub published: &'static [Published],
}

/// Every preset.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "apisix",
        title: "Apache APISIX benchmark (docs/en/latest/benchmark.md)",
        source: "https://apisix.apache.org/docs/apisix/benchmark/",
        method: "1 worker vs all workers; a route with no plugin, and with limit-count + prometheus; 1 KiB \
                 response; `wrk -d 60 --latency` (wrk's defaults: 2 threads, 10 connections). Here: wrk -c10, \
                 the mock's 1 KiB body, nginx/HAProxy beside Sluice. The doc's own figures are charts without \
                 numbers; the figures below are the APISIX authors' published text runs of the same method.",
        scenarios: &[
            "apisix-w1",
            "apisix-wall",
            "apisix-w1-lc-prom",
            "apisix-wall-lc-prom",
        ],
        driver: Some(Driver::Wrk),
        published: &[
            Published {
                scenario: "apisix-w1",
                rps: 16_197.32,
                p99_ms: Some(1.28),
                setup: "APISIX (2019), 1 worker, no plugin, wrk -d 60 2 threads 10 connections, Google Cloud 8 cores",
                source: "https://gist.github.com/membphis/9e7e3799c6bc83156faf2f7fe2fade7e",
            },
            Published {
                scenario: "apisix-w1-lc-prom",
                rps: 13_492.64,
                p99_ms: Some(1.39),
                setup: "APISIX v0.4, limit-count + prometheus, wrk -d 5 2 threads 10 connections",
                source: "https://github.com/apache/apisix/issues/36",
            },
        ],
    },
    Preset {
        name: "api7",
        title: "API7 Gateway performance benchmark",
        source: "https://docs.api7.ai/api7-gateway/configure-and-manage/performance-benchmark",
        method: "One gateway node, worker_processes 1 for the single-core baseline; no plugins, limit-count, \
                 key-auth, key-auth + limit-count, each with 1 route / 1 consumer and 100 routes / 100 \
                 consumers; NGINX upstream with access_log off. Here: the built-in generator closed-loop at \
                 c=32 (API7 used wrk2), the 100-route cases spread over every route and consumer key, nginx \
                 with the equivalent config beside Sluice. The page's result table was not in the stored \
                 copy the suite's authors could read: no figure is printed beside ours.",
        scenarios: &[
            "route-1",
            "limit-count-1",
            "limit-count-100",
            "key-auth-1",
            "key-auth-100",
            "key-auth+limit-count-1",
            "key-auth+limit-count-100",
        ],
        driver: None,
        published: &[],
    },
    Preset {
        name: "shenyu",
        title: "ShenYu-style concurrency sweep (issue 16's seed)",
        source: "issue 16 (seed: ShenYu's report, 20 ms upstream at 600-1,200 connections)",
        method: "A 20 ms upstream delay (the mock sleeps 20 ms before answering) at 600, 800, 1,000 and 1,200 \
                 connections, closed loop; direct, Sluice, nginx, HAProxy. The throughput ceiling is \
                 connections / 20 ms. ShenYu's published report was not found in the stored sources: no \
                 figure is printed beside ours.",
        scenarios: &["sweep-c600", "sweep-c800", "sweep-c1000", "sweep-c1200"],
        driver: None,
        published: &[],
    },
    Preset {
        name: "ngxway",
        title: "ngxway-style ab grid (issue 16's seed)",
        source: "issue 16 (seed: ngxway's ab n/c grid)",
        method: "ApacheBench with a fixed request count over a grid of n (10k, 100k) and c (32, 128, 512, 1200): \
                 `ab -k -n N -c C` (Debian's apache2-utils), throughput over the whole run. ngxway's report was \
                 not found in the stored sources: no figure is printed beside ours.",
        scenarios: &[
            "reqs-10k-c32",
            "reqs-10k-c128",
            "reqs-10k-c512",
            "reqs-10k-c1200",
            "reqs-100k-c32",
            "reqs-100k-c128",
            "reqs-100k-c512",
            "reqs-100k-c1200",
        ],
        driver: Some(Driver::Ab),
        published: &[],
    },
    Preset {
        name: "pixiu",
        title: "dubbo-go-pixiu benchmark (HTTP -> Dubbo generic call)",
        source: "https://github.com/kaori-seasons/benchmark (Pixiu's benchmark suite; apache/dubbo-go-pixiu#788, #805)",
        method: "wrk -c20 POSTing {\"types\":...,\"values\":...} to an HTTP->Dubbo generic call; here the `dubbo` \
                 scenario: Sluice's dubbo-proxy, Pixiu v1.1.0 and a direct dubbo-go client against one dubbo-go \
                 provider. The suite publishes no figure (it does not run: #788, #805); Pixiu's own figure on \
                 this machine is in the scenario's rows.",
        scenarios: scenario::PIXIU,
        driver: None,
        published: &[],
    },
];

/// The preset called `name`.
pub fn find(name: &str) -> Result<&'static Preset, String> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        let known: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        format!("unknown preset {name:?}; known: {}", known.join(", "))
    })
}

/// The preset's scenarios, with its generator forced on each.
pub fn expand(p: &Preset, duration: Duration) -> Result<Vec<Scenario>, String> {
    let names: Vec<String> = p.scenarios.iter().map(|s| s.to_string()).collect();
    let mut v = scenario::select(&names, false, duration)?;
    for s in &mut v {
        if p.driver.is_some() {
            s.driver = p.driver;
        }
    }
    Ok(v)
}

/// One line of the preset table: our median beside the report's figure.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: String,
    pub target: String,
    pub rps: Option<f64>,
    pub p99_ms: Option<f64>,
    pub published: Option<Published>,
}

/// The preset part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct PresetReport {
    pub preset: Preset,
    pub rows: Vec<Row>,
}

impl PresetReport {
    pub fn new(p: &Preset, scenarios: &[ScenarioReport]) -> Self {
        let mut rows = Vec::new();
        for s in scenarios
            .iter()
            .filter(|s| p.scenarios.contains(&s.scenario.name.as_str()))
        {
            let published = p
                .published
                .iter()
                .find(|x| x.scenario == s.scenario.name)
                .copied();
            for t in &s.results {
                rows.push(Row {
                    scenario: s.scenario.name.clone(),
                    target: t.target.clone(),
                    rps: t.median.as_ref().map(|m| m.rps),
                    p99_ms: t.median.as_ref().map(|m| m.latency_us.p99 / 1000.0),
                    published: if t.target == "sluice" {
                        published
                    } else {
                        None
                    },
                });
            }
        }
        PresetReport { preset: *p, rows }
    }

    /// The terminal table.
    pub fn text(&self) -> String {
        let p = &self.preset;
        let mut out = format!(
            "\npreset {}: {}\nsource: {}\nmethod: {}\n{:<26} {:<8} {:>10} {:>9}   {}\n",
            p.name,
            p.title,
            p.source,
            p.method,
            "scenario",
            "target",
            "req/s",
            "p99 ms",
            "published"
        );
        for r in &self.rows {
            let num = |v: Option<f64>, prec: usize| {
                v.map(|v| format!("{v:.prec$}"))
                    .unwrap_or_else(|| "-".into())
            };
            let published = match &r.published {
                Some(x) => format!(
                    "{:.0} req/s{} ({}; {})",
                    x.rps,
                    x.p99_ms
                        .map(|v| format!(", p99 {v} ms"))
                        .unwrap_or_default(),
                    x.setup,
                    x.source
                ),
                None if r.target == "sluice" && p.published.is_empty() => {
                    "no published figure (see source)".into()
                }
                None => String::new(),
            };
            out.push_str(&format!(
                "{:<26} {:<8} {:>10} {:>9}   {published}\n",
                r.scenario,
                r.target,
                num(r.rps, 0),
                num(r.p99_ms, 2)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Plugins, Workers};
    use sluice_mock::Delay;

    fn d() -> Duration {
        Duration::from_secs(1)
    }

    #[test]
    fn every_preset_expands_to_known_scenarios_and_its_figures_name_them() {
        for p in PRESETS {
            let v = expand(p, d()).unwrap_or_else(|e| panic!("{}: {e}", p.name));
            assert_eq!(v.len(), p.scenarios.len(), "{}", p.name);
            for x in p.published {
                assert!(
                    p.scenarios.contains(&x.scenario),
                    "{}: {}",
                    p.name,
                    x.scenario
                );
                assert!(x.rps > 0.0 && x.source.starts_with("https://"));
            }
            assert!(!p.source.is_empty() && !p.method.is_empty());
        }
        assert!(find("nope").is_err());
    }

    #[test]
    fn presets_reproduce_their_reports_methods() {
        let apisix = expand(find("apisix").expect("apisix"), d()).expect("apisix");
        let key = |s: &Scenario| (s.workers, s.plugins, s.concurrency, s.driver);
        let got: Vec<_> = apisix.iter().map(key).collect();
        let w = Some(Driver::Wrk);
        assert_eq!(
            got,
            vec![
                (Workers::One, Plugins::None, 10, w),
                (Workers::All, Plugins::None, 10, w),
                (Workers::One, Plugins::LimitCountPrometheus, 10, w),
                (Workers::All, Plugins::LimitCountPrometheus, 10, w),
            ]
        );
        let api7 = expand(find("api7").expect("api7"), d()).expect("api7");
        for s in api7.iter().filter(|s| s.routes == 100) {
            assert!(s.spread && s.consumers == 100, "{}", s.name);
        }
        assert_eq!(api7.iter().filter(|s| s.routes == 100).count(), 3);
        let shenyu = expand(find("shenyu").expect("shenyu"), d()).expect("shenyu");
        assert!(shenyu
            .iter()
            .all(|s| s.mock_delay == Delay::Fixed(Duration::from_millis(20))));
        assert_eq!(
            shenyu.iter().map(|s| s.concurrency).collect::<Vec<_>>(),
            vec![600, 800, 1000, 1200]
        );
        let ngxway = expand(find("ngxway").expect("ngxway"), d()).expect("ngxway");
        assert!(ngxway
            .iter()
            .all(|s| s.driver == Some(Driver::Ab) && s.requests.is_some()));
        let pixiu = expand(find("pixiu").expect("pixiu"), d()).expect("pixiu");
        assert!(pixiu.len() == 1 && pixiu[0].dubbo);
    }
}
