//! Report assembly: medians, baselines, timestamps and the self-contained HTML.

use super::*;
use crate::scenario::all;
use std::time::Duration;

fn run(rps: f64, p99: f64) -> RunResult {
    RunResult {
        requests: rps as u64,
        duration_s: 1.0,
        rps,
        bytes_per_s: rps * 1000.0,
        latency_us: Latency {
            p50: p99 / 2.0,
            p99,
            max: p99 * 2.0,
            ..Latency::default()
        },
        errors: Errors {
            non_2xx: 1,
            ..Errors::default()
        },
        cpu_us_per_req: Some(rps / 1000.0),
        peak_rss_kib: Some(1000),
        ..RunResult::default()
    }
}

fn target(name: &str, runs: Vec<RunResult>) -> TargetResult {
    let mut t = TargetResult::skipped(name, "builtin", 1, String::new());
    t.skip_reason = None;
    t.rounds = runs;
    t.finish();
    t
}

fn report() -> Report {
    let sc = all(Duration::from_secs(1));
    let get = |n: &str| sc.iter().find(|s| s.name == n).expect("scenario").clone();
    let mk = |n: &str, results: Vec<TargetResult>| ScenarioReport {
        scenario: get(n),
        status: "ok".into(),
        skip_reason: None,
        results,
        notes: vec![],
    };
    let mut skipped = mk(
        "key-auth-1",
        vec![TargetResult::skipped(
            "sluice",
            "builtin",
            1,
            "plugin not available".into(),
        )],
    );
    skipped.status = "skipped".into();
    skipped.skip_reason = Some("plugin not available".into());
    Report {
        schema: SCHEMA,
        generated_at: utc_now(),
        command: "sluice bench <test>".into(),
        total_seconds: 1.0,
        environment: Environment::default(),
        settings: Settings {
            duration_s: 1.0,
            warmup_s: 0.0,
            rounds: 3,
            driver: "builtin".into(),
            generator_threads: 1,
            mock_threads: 1,
            body_size: 1024,
            timeout_s: 5.0,
            pin_gateway: Some("1".into()),
            pin_generator: None,
            pin_mock: None,
            sluice_bin: "sluice".into(),
            h2c: false,
        },
        scenarios: vec![
            mk(
                "direct",
                vec![target(
                    "direct",
                    vec![run(100.0, 10.0), run(300.0, 30.0), run(200.0, 20.0)],
                )],
            ),
            mk(
                "route-1",
                vec![
                    target("sluice", vec![run(50.0, 5.0)]),
                    target("nginx", vec![run(40.0, 4.0)]),
                ],
            ),
            mk(
                "sweep-c600",
                vec![
                    target("direct", vec![run(1000.0, 1.0)]),
                    target("sluice", vec![run(500.0, 1.0)]),
                ],
            ),
            mk("sweep-c800", vec![target("sluice", vec![run(600.0, 1.0)])]),
            skipped,
        ],
        preset: None,
    }
}

#[test]
fn medians_and_summed_errors() {
    let m = median_run(&[run(100.0, 10.0), run(300.0, 30.0), run(200.0, 20.0)]);
    assert_eq!(m.rps, 200.0);
    assert_eq!(m.latency_us.p99, 20.0);
    assert_eq!(m.cpu_us_per_req, Some(0.2));
    assert_eq!(m.errors.non_2xx, 3);
    let mut empty = TargetResult::skipped("x", "builtin", 1, String::new());
    empty.skip_reason = None;
    empty.finish();
    assert_eq!(empty.status, "skipped");
}

#[test]
fn baselines_use_the_direct_run_at_the_same_concurrency() {
    let mut r = report();
    r.compute_baselines();
    let pct = |s: usize, t: usize| {
        r.scenarios[s].results[t]
            .median
            .as_ref()
            .and_then(|m| m.pct_of_baseline)
    };
    assert_eq!(pct(0, 0), Some(100.0));
    assert_eq!(pct(1, 0), Some(25.0)); // route-1 at c=32 vs direct scenario (200 rps)
    assert_eq!(pct(1, 1), Some(20.0));
    assert_eq!(pct(2, 1), Some(50.0)); // in-scenario direct target
    assert_eq!(pct(3, 0), None); // no direct at c=800
}

#[test]
fn a_grpc_direct_is_no_baseline_for_the_mock_scenarios() {
    let mut r = report();
    let sc = all(Duration::from_secs(1));
    let grpc = sc
        .iter()
        .find(|s| s.name == "grpc-transcode")
        .expect("scenario")
        .clone();
    assert_eq!(grpc.concurrency, r.scenarios[1].scenario.concurrency);
    // The greeter's direct run at c=32, and no `direct` scenario for route-1 to compare with.
    r.scenarios.remove(0);
    r.scenarios.insert(
        0,
        ScenarioReport {
            scenario: grpc,
            status: "ok".into(),
            skip_reason: None,
            results: vec![
                target("direct", vec![run(1000.0, 1.0)]),
                target("sluice-grpc", vec![run(500.0, 1.0)]),
            ],
            notes: vec![],
        },
    );
    r.compute_baselines();
    let pct = |s: usize, t: usize| {
        r.scenarios[s].results[t]
            .median
            .as_ref()
            .and_then(|m| m.pct_of_baseline)
    };
    assert_eq!(pct(0, 1), Some(50.0)); // against the greeter, in the scenario
    assert_eq!(pct(1, 0), None); // route-1: no mock baseline at c=32
}

#[test]
fn json_schema_fields_are_stable() {
    let mut r = report();
    r.compute_baselines();
    let v: serde_json::Value = serde_json::to_value(&r).expect("json");
    assert_eq!(v["schema"], "sluice-bench/1");
    let s = &v["scenarios"][1];
    assert_eq!(s["name"], "route-1");
    assert_eq!(s["concurrency"], 32);
    assert_eq!(s["mock_delay"], "0ms");
    let m = &s["results"][0]["median"];
    for k in [
        "requests",
        "duration_s",
        "rps",
        "bytes_per_s",
        "cpu_us_per_req",
        "peak_rss_kib",
        "pct_of_baseline",
    ] {
        assert!(m.get(k).is_some(), "missing {k}");
    }
    for k in ["p50", "p75", "p90", "p99", "p99_9", "p99_99", "max", "mean"] {
        assert!(m["latency_us"].get(k).is_some(), "missing latency {k}");
    }
    for k in ["non_2xx", "connect", "timeout", "io"] {
        assert!(m["errors"].get(k).is_some(), "missing error {k}");
    }
    assert_eq!(
        v["scenarios"][4]["results"][0]["skip_reason"],
        "plugin not available"
    );
}

#[test]
fn html_is_self_contained() {
    let h = html::render(&report());
    assert!(h.starts_with("<!DOCTYPE html>") && h.ends_with("</html>\n"));
    assert!(
        h.matches("<svg").count() >= 4,
        "bar chart, sweep charts and latency charts expected"
    );
    assert!(h.contains("Concurrency sweep"));
    assert!(h.contains("skipped: plugin not available"));
    for external in ["<script", "src=\"http", "href=\"http", "<link"] {
        assert!(!h.contains(external), "external reference {external}");
    }
    assert!(html::esc("<a&b>") == "&lt;a&amp;b&gt;");
}

#[test]
fn text_summary_shows_long_targets_skipped_scenarios_and_notes() {
    let mut r = report();
    let sc = all(Duration::from_secs(1));
    let grpc = sc
        .iter()
        .find(|s| s.name == "grpc-transcode")
        .expect("scenario")
        .clone();
    r.scenarios[1]
        .results
        .push(target("sluice-transcode-h2c", vec![run(70.0, 7.0)]));
    r.scenarios[1].notes.push("a finding".into());
    r.scenarios.push(ScenarioReport {
        scenario: grpc,
        status: "skipped".into(),
        skip_reason: Some("Go >= 1.25 not found".into()),
        results: vec![],
        notes: vec![],
    });
    let text = r.text_summary();
    let lines: Vec<&str> = text.lines().collect();
    let row = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"))
    };
    // Columns stay aligned with a target name longer than the old 8-character column.
    let col = |l: &str| l.find(" 50 ").or_else(|| l.find(" 70 ")).expect("req/s");
    assert_eq!(
        col(row("route-1                    sluice ")),
        col(row("sluice-transcode-h2c"))
    );
    assert!(row("grpc-transcode").contains("skipped: Go >= 1.25 not found"));
    assert!(row("route-1: a finding").starts_with("route-1: "));
}

#[test]
fn timestamp_format() {
    let t = utc_now();
    assert_eq!(t.len(), 20, "{t}");
    assert!(
        t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T",
        "{t}"
    );
}

fn noisy(rps: f64, p99: f64, foreign: f64) -> RunResult {
    RunResult {
        noise: Some(Noise {
            foreign_cpu_pct: foreign,
            load_avg_1m: 1.5,
        }),
        ..run(rps, p99)
    }
}

#[test]
fn contaminated_rounds_are_flagged_noted_and_left_out_of_the_median() {
    let mut r = report();
    // Rounds 1 and 3 clean (2% and 4% foreign), round 2 beside a busy loop (95%).
    r.scenarios[1].results[0] = target(
        "sluice",
        vec![
            noisy(1000.0, 900.0, 2.0),
            noisy(400.0, 5000.0, 95.0),
            noisy(1100.0, 950.0, 4.0),
        ],
    );
    r.compute_baselines();
    let t = &r.scenarios[1].results[0];
    assert_eq!(
        t.rounds.iter().map(|x| x.contaminated).collect::<Vec<_>>(),
        vec![false, true, false]
    );
    let m = t.median.as_ref().expect("median");
    assert_eq!(m.rps, 1050.0, "median of the clean rounds only");
    assert!(!m.contaminated);
    let notes = r.scenarios[1].notes.join("\n");
    assert!(
        notes.contains("CONTAMINATED sluice (builtin): 1 of 3 rounds")
            && notes.contains("round 2 (foreign CPU 95% of a CPU")
            && notes.contains("median is over the 2 clean round(s)"),
        "{notes}"
    );
    let text = r.text_summary();
    assert!(text.contains("900 (2%) 5000 (95%)! 950 (4%)"), "{text}");
    assert!(text.contains("summary (Sluice per scenario)"), "{text}");
    let v: serde_json::Value = serde_json::to_value(&r).expect("json");
    let rounds = &v["scenarios"][1]["results"][0]["rounds"];
    assert_eq!(rounds[1]["contaminated"], true);
    assert_eq!(rounds[1]["noise"]["foreign_cpu_pct"], 95.0);
    assert_eq!(rounds[0]["contaminated"], false);
    assert!(html::render(&r).contains("CONTAMINATED"));

    // Every round contaminated: the median says so.
    let mut all_bad = target(
        "sluice",
        vec![noisy(1000.0, 900.0, 50.0), noisy(900.0, 900.0, 60.0)],
    );
    all_bad.finish();
    assert!(all_bad.median.as_ref().expect("median").contaminated);
    // No noise sample (an external gateway, or no /proc): never flagged.
    let none = target("sluice", vec![run(1.0, 1.0)]);
    assert!(!none.rounds[0].contaminated);
}

#[test]
fn above_100_percent_of_direct_carries_a_warning() {
    let mut r = report();
    // route-1's Sluice at 250 req/s against the direct scenario's 200.
    r.scenarios[1].results[0] = target("sluice", vec![run(250.0, 5.0)]);
    r.compute_baselines();
    let pct = r.scenarios[1].results[0]
        .median
        .as_ref()
        .and_then(|m| m.pct_of_baseline);
    assert_eq!(pct, Some(125.0));
    let notes = r.scenarios[1].notes.join("\n");
    assert!(
        notes.contains("WARNING sluice at 125% of direct")
            && notes.contains("baseline was measured low"),
        "{notes}"
    );
    let text = r.text_summary();
    assert!(text.contains("125%!"), "{text}");
    assert!(html::render(&r).contains("above 100%"));
    // Below 100: no warning.
    assert!(!r.scenarios[2].notes.iter().any(|n| n.contains("WARNING")));
}
