//! h2spec (github.com/summerwind/h2spec, pinned in crates/sluice-proxy/tools/h2spec/go.mod) against each kind
//! of listener: h2c-only, the dual HTTP/1.1+h2c port, and TLS with ALPN h2. The binary is built with `go build`
//! into the cargo target directory; the JUnit report is parsed, every failure printed, and the failed cases
//! asserted. Without a Go toolchain the tests say so and skip, except under CI=true where they fail.

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
            crate::ci::skip_unless_ci(&format!("h2spec needs a Go toolchain ({e})"));
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
    let mut res = route_to(&o);
    let tls = kind == ListenerKind::Tls;
    if tls {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        res["ssls"] = serde_json::json!([{"id": "1", "snis": ["localhost"],
            "cert": ck.cert.pem(), "key": ck.key_pair.serialize_pem()}]);
    }
    let gw = Gw::start_kind(res, ProxyConfig::default(), kind);
    let report = target_dir().join(format!("h2spec/report-{}.xml", gw.addr.port()));
    let mut cmd = Command::new(&bin);
    if tls {
        // h2spec sends the host as SNI; "localhost" resolves to the 127.0.0.1 listener.
        cmd.args(["-t", "-k", "-h", "localhost"]);
    } else {
        cmd.args(["-h", "127.0.0.1"]);
    }
    let out = cmd
        .arg("-p")
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
fn h2spec_tls_listener_with_alpn_h2_passes_all() {
    let Some(failed) = run(ListenerKind::Tls) else {
        return;
    };
    assert!(failed.is_empty(), "h2spec failures: {failed:?}");
}

#[test]
fn h2spec_dual_protocol_port_passes_all() {
    // Includes 3.5: "INVALID CONNECTION PREFACE\r\n\r\n" is neither the h2 preface nor an HTTP/1.x request line
    // (its version token is not `HTTP/...`), so the shared port closes it unanswered (`h2::sniff`).
    let Some(failed) = run(ListenerKind::Plain) else {
        return;
    };
    assert!(failed.is_empty(), "h2spec failures: {failed:?}");
}
