//! `sluice bench` end to end (issue 16 items 3 and 4), short enough for CI: `--preset apisix --quick` runs the
//! report's method against the real gateway (and nginx / HAProxy when installed) and prints the report's
//! published figures beside ours; a round run while a busy-loop process burns a CPU is flagged contaminated.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::process::TempDir;

fn installed(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `sluice bench ARGS --out DIR` with a bound; returns (stdout, report.json).
fn bench(out: &Path, args: &[&str]) -> (String, Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("bench")
        .args(args)
        .args(["--no-pin", "--out"])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sluice bench");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let end = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice bench did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = reader.join().expect("stdout reader");
    assert!(status.success(), "sluice bench: {status}\n{text}");
    let json = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    (text, serde_json::from_str(&json).expect("report is JSON"))
}

fn target<'a>(report: &'a Value, scenario: &str, target: &str) -> Option<&'a Value> {
    report["scenarios"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == scenario)?["results"]
        .as_array()?
        .iter()
        .find(|t| t["target"] == target)
}

#[test]
fn preset_apisix_quick_runs_the_method_and_prints_the_published_figures() {
    if !installed("wrk") {
        crate::support::skip_unless_ci("wrk not installed (apt-get install -y wrk)");
        return;
    }
    let dir = TempDir::new("bench-preset");
    let out = dir.0.join("out");
    let (text, report) = bench(&out, &["--preset", "apisix", "--quick"]);
    let p = &report["preset"];
    assert_eq!(p["preset"]["name"], "apisix");
    for s in [
        "apisix-w1",
        "apisix-wall",
        "apisix-w1-lc-prom",
        "apisix-wall-lc-prom",
    ] {
        let t = target(&report, s, "sluice").unwrap_or_else(|| panic!("no sluice row in {s}"));
        assert_eq!(t["status"], "ok", "{s}: {}", t["skip_reason"]);
        assert_eq!(t["driver"], "wrk", "{s}: the report's generator");
        let m = &t["median"];
        assert!(m["rps"].as_f64().expect("rps") > 100.0, "{s}: {m}");
        for kind in ["non_2xx", "connect", "timeout", "io"] {
            assert_eq!(m["errors"][kind], 0, "{s}: {kind} errors");
        }
        assert!(t["idle_rss_kib"].as_u64().expect("idle rss") > 1024, "{s}");
        assert!(
            t["rounds"][0]["noise"]["foreign_cpu_pct"].is_number(),
            "{s}"
        );
        if installed("nginx") {
            // nginx beside it: plain, or with limit_req for limit-count (+ prometheus, no equivalent).
            let n = target(&report, s, "nginx").expect("nginx row");
            assert_eq!(n["status"], "ok", "{s} nginx: {}", n["skip_reason"]);
            assert_eq!(n["median"]["errors"]["non_2xx"], 0, "{s} nginx");
        }
    }
    // The report's figure and its source beside ours, in the JSON and on the terminal.
    let rows = p["rows"].as_array().expect("rows");
    let w1 = rows
        .iter()
        .find(|r| r["scenario"] == "apisix-w1" && r["target"] == "sluice")
        .expect("apisix-w1 row");
    assert_eq!(w1["published"]["rps"], 16197.32);
    assert!(w1["rps"].as_f64().expect("ours") > 0.0);
    assert!(text.contains("preset apisix: "), "{text}");
    assert!(
        text.contains("https://apisix.apache.org/docs/apisix/benchmark/"),
        "{text}"
    );
    assert!(text.contains("16197 req/s, p99 1.28 ms"), "{text}");
    assert!(
        text.contains("https://github.com/apache/apisix/issues/36"),
        "{text}"
    );
    assert!(text.contains("summary (Sluice per scenario)"), "{text}");
}

/// The test: a deliberately contaminated run is flagged. A busy loop burns a CPU during a short
/// round of the 100 routes × 100 consumers plugin scenario (requests spread over every route and key, so
/// a wrong key or route would show as non-2xx); the round must come out contaminated, with the note.
#[test]
fn a_round_beside_a_busy_loop_is_flagged_contaminated() {
    let dir = TempDir::new("bench-noise");
    let out = dir.0.join("out");
    let mut burner = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("spawn busy loop");
    let r = std::panic::catch_unwind(|| {
        bench(
            &out,
            &[
                "-s",
                "key-auth+limit-count-100",
                "--quick",
                "--duration",
                "2s",
                "--no-peers",
            ],
        )
    });
    let _ = burner.kill();
    let _ = burner.wait();
    let (text, report) = r.unwrap_or_else(|e| std::panic::resume_unwind(e));
    let t = target(&report, "key-auth+limit-count-100", "sluice").expect("sluice row");
    assert_eq!(t["status"], "ok", "{}", t["skip_reason"]);
    let round = &t["rounds"][0];
    assert_eq!(round["contaminated"], true, "{round}");
    assert!(round["noise"]["foreign_cpu_pct"].as_f64().expect("foreign") > 10.0);
    for kind in ["non_2xx", "connect", "timeout", "io"] {
        assert_eq!(
            round["errors"][kind], 0,
            "{kind} errors: spread hit a wrong route or key"
        );
    }
    let notes: Vec<&str> = report["scenarios"][0]["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        notes.iter().any(|n| n.starts_with("CONTAMINATED sluice")),
        "{notes:?}"
    );
    assert!(text.contains("CONTAMINATED sluice"), "{text}");
}
