//! Plumbing check of `sluice bench -s cluster-churn-tiny` (issue 18 item 6): the real binary starts a real etcd, a
//! control plane and three data planes, writes 100 routes to etcd, churns 5 writes/s for 2 s per phase with an etcd
//! compaction in the last phase, and reports. Asserts that every write reached every node, the proxy answered only
//! 2xx, the figures are there, and that no process the run started outlives it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::etcd_outage::ETCD;
use crate::support::process::TempDir;

/// Every process whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                out.push(cmd);
            }
        }
    }
    out
}

#[test]
fn cluster_churn_tiny_propagates_every_write_to_every_node_and_stops_everything() {
    if !Path::new(ETCD).exists() {
        crate::support::skip_unless_ci(&format!(
            "{ETCD} not installed (apt-get install -y etcd-server)"
        ));
        return;
    }
    let dir = TempDir::new("cluster-bench");
    let out = dir.0.join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "-s", "cluster-churn-tiny", "--duration", "2s"])
        .args(["--warmup", "0s", "--rounds", "1", "--no-peers", "--no-pin"])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sluice bench");
    let end = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice bench did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "sluice bench: {status}");
    // etcd, the control plane and the data planes ran from directories under `out`: none may be left.
    let left = processes_mentioning(&out.display().to_string());
    assert!(left.is_empty(), "processes left running: {left:?}");

    let text = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    let report: Value = serde_json::from_str(&text).expect("report is JSON");
    let s = &report["scenarios"][0];
    assert_eq!(s["name"], "cluster-churn-tiny");
    assert_eq!(s["status"], "ok", "scenario skipped: {}", s["skip_reason"]);
    assert_eq!(s["routes"], 100);
    let results = s["results"].as_array().expect("results");
    let find = |target: &str, driver: &str| -> &Value {
        results
            .iter()
            .find(|r| r["target"] == target && r["driver"] == driver)
            .unwrap_or_else(|| panic!("no {target} / {driver} in {results:?}"))
    };
    for driver in ["churn", "churn+compaction"] {
        let p = &find("propagation", driver)["median"];
        // 5 writes/s for 2 s: 10 writes scheduled (at least half done on a busy machine), each served by all three nodes, none refused or lost.
        let writes = p["requests"].as_u64().expect("writes");
        assert!((5..=11).contains(&writes), "{driver}: {writes} writes");
        assert_eq!(p["errors"]["non_2xx"], 0, "{driver}: writes refused");
        assert_eq!(p["errors"]["timeout"], 0, "{driver}: writes never served");
        let p50 = p["latency_us"]["p50"].as_f64().expect("p50");
        let max = p["latency_us"]["max"].as_f64().expect("max");
        assert!(p50 > 0.0 && p50 <= max && max < 10e6, "{driver}: {p}");
    }
    for node in ["dp1", "dp2", "dp3"] {
        for driver in ["quiet", "churn", "churn+compaction"] {
            let m = &find(node, driver)["median"];
            // 100 req/s open loop for 2 s.
            let reqs = m["requests"].as_u64().expect("requests");
            assert!(reqs >= 150, "{node} {driver}: {reqs} requests");
            let e = &m["errors"];
            for kind in ["non_2xx", "connect", "timeout", "io"] {
                assert_eq!(e[kind], 0, "{node} {driver}: {kind} errors");
            }
            assert!(m["latency_us"]["p99"].as_f64().expect("p99") > 0.0);
            assert!(m["cpu_us_per_req"].as_f64().expect("cpu") > 0.0);
            assert!(m["peak_rss_kib"].as_u64().expect("rss") > 1024);
        }
    }
    let notes: Vec<&str> = s["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("etcd compacted to revision")),
        "no compaction: {notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.starts_with("CPU per write")),
        "no CPU per write: {notes:?}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    assert!(html.contains("cluster-churn-tiny"));
}
