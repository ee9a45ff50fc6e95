//! dubbo-proxy against a real Apache dubbo-go 3.3.1 provider (tools/dubbo-go-peer: DemoService:1.0.0
//! `hello(Map) -> Map`, hessian2), built with `go build` into the target directory on first use (about 4 minutes
//! the first time: ~130 modules from the Go module proxy) and started on 127.0.0.1 by the test.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{request, target_dir, Gw};

struct Provider {
    addr: SocketAddr,
    child: Child,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The provider binary, built once per target directory.
fn provider_bin() -> Option<PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/dubbo-go-peer");
        // Named after its sources, so a changed provider is rebuilt.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for f in ["main.go", "go.mod", "go.sum"] {
            for b in std::fs::read(dir.join(f)).unwrap_or_default() {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
        let out = target_dir().join(format!("dubbo-go-peer/provider-{h:016x}"));
        if out.exists() {
            return Some(out);
        }
        std::fs::create_dir_all(out.parent()?).ok()?;
        let path = format!(
            "/usr/local/go/bin:{}",
            std::env::var("PATH").unwrap_or_default()
        );
        // Built under a temporary name and renamed: a concurrent or interrupted build never leaves half a binary.
        let tmp = out.with_extension(format!("tmp{}", std::process::id()));
        let st = Command::new("go")
            .args(["build", "-o"])
            .arg(&tmp)
            .arg(".")
            .env("PATH", path)
            .env("GOFLAGS", "-mod=mod")
            .current_dir(&dir)
            .status();
        match st {
            Ok(s) if s.success() => {
                std::fs::rename(&tmp, &out).ok()?;
                Some(out)
            }
            Ok(s) => panic!("go build of the dubbo-go provider failed: {s}"),
            Err(e) => {
                super::ci::skip_unless_ci(&format!("the dubbo-go provider needs Go ({e})"));
                None
            }
        }
    })
    .clone()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_provider() -> Option<Provider> {
    let bin = provider_bin()?;
    let port = free_port();
    let child = Command::new(bin)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start provider");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let p = Provider { addr, child };
    let end = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < end, "dubbo-go provider not listening");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(p)
}

fn route(nodes: serde_json::Value, conf: serde_json::Value) -> serde_json::Value {
    json!({"routes": [{"id": "d", "uri": "/hello", "plugins": {"dubbo-proxy": conf},
                       "upstream": {"type": "roundrobin", "nodes": nodes}}]})
}

fn demo() -> serde_json::Value {
    json!({"service_name": "org.apache.dubbo.backend.DemoService", "service_version": "1.0.0", "method": "hello"})
}

#[test]
fn dubbo_proxy_calls_a_real_provider_with_headers_and_body() {
    let Some(p) = start_provider() else { return };
    let gw = Gw::start(route(json!({p.addr.to_string(): 1}), demo()));
    let r = request(gw.addr, "POST", "/hello", &[("X-Trace", "abc")], "payload");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with("dubbo-go success\n"), "{r:?}");
    assert!(r.body.contains("body: payload"), "{r:?}");
    assert!(r.body.contains("x-trace: abc"), "{r:?}");
    assert_eq!(r.header("header1"), Some("value1"));
    // No `method`: the path names it, as APISIX.
    let mut conf = demo();
    conf.as_object_mut().unwrap().remove("method");
    gw.reload(route(json!({p.addr.to_string(): 1}), conf), 2);
    let r = request(gw.addr, "GET", "/hello", &[], "");
    assert_eq!(r.status, 200, "{r:?}");
}

/// The provider's header map is the request as it goes upstream: a tracing plugin's traceparent replaces the
/// client's, a removed header is gone (proxy-rewrite), as with an HTTP upstream.
#[test]
fn dubbo_proxy_passes_plugin_header_edits_and_the_trace_context() {
    let Some(p) = start_provider() else { return };
    let mut res = route(json!({p.addr.to_string(): 1}), demo());
    res["routes"][0]["plugins"]["opentelemetry"] = json!({"sampler": {"name": "parent_base"}});
    res["routes"][0]["plugins"]["proxy-rewrite"] = json!({"headers": {"remove": ["x-secret"]}});
    res["plugin_metadata"] =
        json!([{"id": "opentelemetry", "collector": {"address": "127.0.0.1:9"}}]);
    let gw = Gw::start(res);
    let client = "4bf92f3577b34da6a3ce929d0e0e4736";
    let r = request(
        gw.addr,
        "POST",
        "/hello",
        &[
            ("traceparent", &format!("00-{client}-00f067aa0ba902b7-00")),
            ("X-Secret", "s"),
        ],
        "payload",
    );
    assert_eq!(r.status, 200, "{r:?}");
    let line = r
        .body
        .lines()
        .find(|l| l.starts_with("traceparent: "))
        .unwrap_or_else(|| panic!("no traceparent in {r:?}"));
    assert!(
        line.starts_with(&format!("traceparent: 00-{client}-")),
        "{line}"
    );
    assert!(
        line.ends_with("-00") && !line.contains("00f067aa0ba902b7"),
        "{line}"
    );
    assert_eq!(r.body.matches("traceparent").count(), 1, "{r:?}");
    assert!(!r.body.contains("x-secret"), "{r:?}");
}

#[test]
fn dubbo_proxy_unknown_service_or_method_is_an_error_not_a_hang() {
    let Some(p) = start_provider() else { return };
    let gw = Gw::start(route(
        json!({p.addr.to_string(): 1}),
        json!({"service_name": "org.example.Nothing", "service_version": "1.0.0", "method": "hello"}),
    ));
    let t0 = Instant::now();
    let r = request(gw.addr, "POST", "/hello", &[], "x");
    assert!(r.status >= 500, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// Concurrent calls share a few multiplexed connections per worker instead of one each.
#[test]
fn dubbo_proxy_multiplexes_concurrent_calls() {
    let Some(p) = start_provider() else { return };
    let gw = Gw::start(route(json!({p.addr.to_string(): 1}), demo()));
    let addr = gw.addr;
    let handles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..25 {
                    let r = request(addr, "POST", "/hello", &[], &format!("t{t}-{i}"));
                    assert_eq!(r.status, 200, "{r:?}");
                    assert!(r.body.contains(&format!("body: t{t}-{i}")), "{r:?}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Connections from the gateway to the provider: counted from the provider's side of /proc/net/tcp.
    let conns = established_to(p.addr.port());
    assert!(
        (1..=4).contains(&conns),
        "{conns} connections for 200 calls"
    );
}

/// Established TCP connections whose local port is `port` (the provider's accepted sockets).
fn established_to(port: u16) -> usize {
    let mut s = String::new();
    std::fs::File::open("/proc/net/tcp")
        .and_then(|mut f| f.read_to_string(&mut s))
        .unwrap();
    s.lines()
        .skip(1)
        .filter(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 3
                && cols[3] == "01"
                && cols[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    == Some(port)
        })
        .count()
}

#[test]
fn dubbo_proxy_skips_an_unreachable_provider_and_fails_cleanly_without_one() {
    let Some(p) = start_provider() else { return };
    let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let gw = Gw::start(route(
        json!({dead.to_string(): 1, p.addr.to_string(): 1}),
        demo(),
    ));
    for _ in 0..4 {
        let r = request(gw.addr, "POST", "/hello", &[], "x");
        assert_eq!(r.status, 200, "{r:?}");
    }
    gw.reload(route(json!({dead.to_string(): 1}), demo()), 2);
    let r = request(gw.addr, "POST", "/hello", &[], "x");
    assert_eq!(r.status, 502, "{r:?}");
    // The provider dies while the gateway holds connections to it: the next calls fail fast, and a provider back
    // on the same port is used again.
    drop(gw);
    let gw = Gw::start(route(json!({p.addr.to_string(): 1}), demo()));
    assert_eq!(request(gw.addr, "POST", "/hello", &[], "x").status, 200);
    let port = p.addr.port();
    drop(p);
    let t0 = Instant::now();
    let r = request(gw.addr, "POST", "/hello", &[], "x");
    assert!(r.status == 502 || r.status == 504, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let bin = provider_bin().unwrap();
    let mut child = Command::new(bin)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let mut ok = false;
    while Instant::now() < end {
        if request(gw.addr, "POST", "/hello", &[], "x").status == 200 {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(ok, "the gateway did not reach the provider again");
    let _ = std::io::stdout().flush();
}

/// dubbo-go-pixiu's "universality" call, its benchmark's request shape: a generic `$invoke` with the typed
/// arguments in the body and the method in the query; the answer is the returned value as JSON.
#[test]
fn dubbo_proxy_generic_call_with_pixiu_s_body() {
    let Some(p) = start_provider() else { return };
    let gw = Gw::start(json!({"routes": [{
        "id": "g", "uri": "/api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService",
        "plugins": {"dubbo-proxy": {"service_name": "org.apache.dubbo.backend.DemoService",
                                    "service_version": "1.0.0", "generic": true}},
        "upstream": {"type": "roundrobin", "nodes": {p.addr.to_string(): 1}}}]}));
    let path = "/api/v1/test-dubbo/dubbo-go-demo/org.apache.dubbo.backend.DemoService?version=1.0.0&method=hello";
    let r = request(
        gw.addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        r#"{"types":"object","values":{"name":"tc"}}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.json(),
        json!({"body": "dubbo-go success\nname: tc\n", "header1": "value1", "status": "200"})
    );
    // Arguments that do not fit their declared types, or no JSON at all: 400, nothing sent.
    for bad in [
        r#"{"types":"int","values":"x"}"#,
        r#"{"types":"#,
        r#"{"types":"no.such.Type[[","values":1}"#,
    ] {
        let r = request(
            gw.addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            bad,
        );
        assert_eq!(r.status, 400, "{bad}: {r:?}");
    }
}

/// http-dubbo's hessian2 option (a Sluice extension) reaches dubbo-go, which has no fastjson: the map argument
/// typed by `params_type_desc`, the returned map as JSON.
#[test]
fn http_dubbo_hessian2_calls_dubbo_go() {
    let Some(p) = start_provider() else { return };
    let conf = json!({"service_name": "org.apache.dubbo.backend.DemoService", "service_version": "1.0.0",
                      "method": "hello", "params_type_desc": "Ljava/util/Map;",
                      "serialization_protocol": "hessian2"});
    let gw = Gw::start(
        json!({"routes": [{"id": "h", "uri": "/hello", "plugins": {"http-dubbo": conf},
                       "upstream": {"type": "roundrobin", "nodes": {p.addr.to_string(): 1}}}]}),
    );
    let r = request(gw.addr, "POST", "/hello", &[], r#"[{"name": "tc"}]"#);
    assert_eq!(r.status, 200, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        v,
        json!({"status": "200", "body": "dubbo-go success\nname: tc\n", "header1": "value1"})
    );
    let r = request(gw.addr, "POST", "/hello", &[], r#"[{"name": "tc"}, 1]"#);
    assert_eq!(r.status, 400, "{r:?}");
}
