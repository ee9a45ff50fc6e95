//! h2spec (github.com/summerwind/h2spec, pinned in crates/sluice-proxy/tools/h2spec/go.mod) against the h2c
//! listener. The binary is built with `go build` into the cargo target directory; the JUnit report is parsed and
//! the test asserts the number of passed cases, printing every failure. Without a Go toolchain the test says so
//! and passes vacuously (CI has Go).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{route_to, Gw, Origin};
use sluice_proxy::{ListenerKind, ProxyConfig};

/// h2spec 2.2.1's generic + http2 + hpack suites.
const TOTAL: usize = 145;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

fn build_h2spec() -> Option<PathBuf> {
    let out = target_dir().join("h2spec/h2spec");
    if out.exists() {
        return Some(out);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/h2spec");
    let st = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg("github.com/summerwind/h2spec/cmd/h2spec")
        .current_dir(&dir)
        .status();
    match st {
        Ok(s) if s.success() => Some(out),
        Ok(s) => panic!("go build of h2spec failed: {s}"),
        Err(e) => {
            eprintln!("h2spec skipped: no Go toolchain ({e})");
            None
        }
    }
}

/// (name, failure message) of every case in a JUnit report; message empty when it passed.
fn cases(xml: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase") {
        rest = &rest[i + 9..];
        let end = rest.find("</testcase>").unwrap_or(rest.len());
        let body = &rest[..end];
        let name = attr(body, "name").unwrap_or_default();
        let pkg = attr(body, "package").unwrap_or_default();
        let failed = body.contains("<failure") || body.contains("<error");
        let skipped = body.contains("<skipped");
        let msg = if failed {
            body.find("<failure")
                .or_else(|| body.find("<error"))
                .map(|j| body[j..].chars().take(300).collect())
                .unwrap_or_default()
        } else if skipped {
            "skipped".to_owned()
        } else {
            String::new()
        };
        out.push((format!("{pkg} {name}"), msg));
    }
    out
}

fn attr(s: &str, name: &str) -> Option<String> {
    let key = format!("{name}=\"");
    let i = s.find(&key)? + key.len();
    let j = s[i..].find('"')?;
    Some(s[i..i + j].to_owned())
}

/// Runs h2spec against a fresh gateway listening as `kind`; returns the names of the failed cases.
fn run(kind: ListenerKind) -> Option<Vec<String>> {
    let bin = build_h2spec()?;
    let o = Origin::start();
    let gw = Gw::start_kind(route_to(&o), ProxyConfig::default(), kind);
    let report = target_dir().join(format!("h2spec/report-{}.xml", gw.addr.port()));
    let out = Command::new(&bin)
        .args(["-h", "127.0.0.1", "-p"])
        .arg(gw.addr.port().to_string())
        .args(["-o", "3", "-j"])
        .arg(&report)
        .output()
        .expect("run h2spec");
    let xml = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "no report ({e}); h2spec said:\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let _ = std::fs::remove_file(&report);
    let all = cases(&xml);
    let failed: Vec<String> = all
        .iter()
        .filter(|(_, m)| !m.is_empty())
        .map(|(n, m)| {
            eprintln!("h2spec {kind:?} FAIL {n}: {m}");
            n.clone()
        })
        .collect();
    eprintln!(
        "h2spec {kind:?}: {}/{} passed",
        all.len() - failed.len(),
        all.len()
    );
    assert_eq!(all.len(), TOTAL, "h2spec case count changed");
    Some(failed)
}

#[test]
fn h2spec_h2c_only_listener_passes_all() {
    let Some(failed) = run(ListenerKind::H2c) else {
        return;
    };
    assert!(failed.is_empty(), "h2spec failures: {failed:?}");
}

#[test]
fn h2spec_dual_protocol_port_fails_only_the_invalid_preface_case() {
    // On a port that also speaks HTTP/1.1, "INVALID CONNECTION PREFACE\r\n\r\n" is an (invalid) HTTP/1.1
    // request and is answered 400 as RFC 9112 §3 asks, where h2spec 3.5 expects a silent close.
    let Some(failed) = run(ListenerKind::Plain) else {
        return;
    };
    assert_eq!(
        failed,
        ["http2/3.5 Sends invalid connection preface"],
        "h2spec failures"
    );
}
