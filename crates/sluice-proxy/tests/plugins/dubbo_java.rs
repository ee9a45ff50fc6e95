//! dubbo-proxy against a real Apache Dubbo 3.3.5 Java provider (tools/dubbo-java-peer: `DemoService.hello(Map)`
//! for APISIX's map form, `TypesService` for generic calls: primitives, strings, POJOs, lists, maps, null, no-arg,
//! overloads, an exception, a slow method, 1 MiB payloads). Built with Maven from Maven Central into the target
//! directory on first use (about 40 s cold, jars cached in ~/.m2 afterwards), started once per test process on
//! [::1] (Dubbo refuses a 127.x bind and would listen on every address instead) and ended when the test process
//! ends (it watches its stdin).

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{request, target_dir, Gw};

#[path = "../../tools/dubbo-java-peer/peer_build.rs"]
mod peer_build;

struct Provider {
    addr: SocketAddr,
    /// The same services over Triple (Dubbo 3's HTTP protocol).
    triple: SocketAddr,
    child: Child,
    /// Held open: the provider exits when it closes, so the shared one ends with the test process.
    _stdin: ChildStdin,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The provider's classpath (its jar and Maven's copies of its dependencies), built once per source version.
fn classpath() -> Option<String> {
    static CP: OnceLock<Option<String>> = OnceLock::new();
    CP.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/dubbo-java-peer");
        peer_build::classpath(&src, &target_dir(), super::ci::skip_unless_ci)
    })
    .clone()
}

fn free_port(host: &str) -> u16 {
    TcpListener::bind(format!("{host}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a provider; `threads` is its Dubbo thread pool size.
fn spawn(threads: u32) -> Option<Provider> {
    let cp = classpath()?;
    // [::1] keeps it on loopback; a machine without IPv6 falls back to 127.0.0.1 (Dubbo then binds every address).
    let (host, ip) = if TcpListener::bind("[::1]:0").is_ok() {
        ("::1", "[::1]")
    } else {
        ("127.0.0.1", "127.0.0.1")
    };
    let port = free_port(ip);
    let triple = free_port(ip);
    let mut child = Command::new("java")
        .args([
            "-Xss512k",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            &format!("-Dport={port}"),
            &format!("-Dtriple.port={triple}"),
            &format!("-Dhost={host}"),
            &format!("-Dthreads={threads}"),
            "-Dexit.with.stdin=true",
            "-cp",
            &cp,
            "org.sluice.peer.Provider",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start java");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("READY") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the Java Dubbo provider did not start within 120 s");
    Some(Provider {
        addr: format!("{ip}:{port}").parse().unwrap(),
        triple: format!("{ip}:{triple}").parse().unwrap(),
        child,
        _stdin: stdin,
    })
}

/// The provider the tests share (one JVM start per test process).
fn shared() -> &'static Mutex<Option<Provider>> {
    static P: OnceLock<Mutex<Option<Provider>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(spawn(200)))
}

fn provider() -> Option<SocketAddr> {
    shared().lock().unwrap().as_ref().map(|p| p.addr)
}

/// Triple providers (Dubbo 3.3) need no plugin: they speak HTTP themselves (JSON over HTTP/1.1, or HTTP/2), so a
/// plain route reaches them, as docs/plugins/dubbo-proxy.md says.
#[test]
fn java_triple_is_reached_through_plain_http_and_h2_routes() {
    let Some(tri) = shared().lock().unwrap().as_ref().map(|p| p.triple) else {
        return;
    };
    let gw = Gw::start(json!({"routes": [
        {"id": "h1", "uri": "/org.sluice.peer.TypesService/*",
         "upstream": {"type": "roundrobin", "nodes": {tri.to_string(): 1}}},
        {"id": "h2", "uri": "/h2/org.sluice.peer.TypesService/*",
         "plugins": {"proxy-rewrite": {"regex_uri": ["^/h2/(.*)", "/$1"]}},
         "upstream": {"type": "roundrobin", "scheme": "grpc", "nodes": {tri.to_string(): 1}}}]}));
    let call = |path: &str, body: &str| {
        request(
            gw.addr,
            "POST",
            path,
            &[
                ("Content-Type", "application/json"),
                ("tri-service-version", "1.0.0"),
            ],
            body,
        )
    };
    let r = call("/org.sluice.peer.TypesService/length", r#"["hello"]"#);
    assert_eq!((r.status, r.body.as_str()), (200, "5"), "{r:?}");
    let r = call("/h2/org.sluice.peer.TypesService/repeat", r#"["ab", 3]"#);
    // (Relayed chunked: the test client shows the framing.)
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("\"ababab\""), "{r:?}");
    // The provider's own errors come back as it sent them.
    let r = call("/org.sluice.peer.TypesService/nosuch", "[]");
    assert_eq!(r.status, 404, "{r:?}");
}

const TYPES: &str = "org.sluice.peer.TypesService";

fn generic_gw(p: SocketAddr, extra: Value, timeout: Option<f64>) -> Gw {
    let mut conf = json!({"service_name": TYPES, "service_version": "1.0.0", "generic": true});
    conf.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let mut upstream = json!({"type": "roundrobin", "nodes": {p.to_string(): 1}});
    if let Some(t) = timeout {
        upstream["timeout"] = json!({"connect": t, "send": t, "read": t});
    }
    Gw::start(
        json!({"routes": [{"id": "t", "uri": "/types", "plugins": {"dubbo-proxy": conf},
                                  "upstream": upstream}]}),
    )
}

/// A Pixiu-style generic call: `/types?method=..` with `{"types": .., "values": ..}`.
fn call(gw: &Gw, method: &str, body: &str) -> super::Resp {
    request(
        gw.addr,
        "POST",
        &format!("/types?method={method}"),
        &[("Content-Type", "application/json")],
        body,
    )
}

#[test]
fn java_dubbo_proxy_map_form() {
    let Some(p) = provider() else { return };
    let gw = Gw::start(json!({"routes": [{"id": "d", "uri": "/hello",
        "plugins": {"dubbo-proxy": {"service_name": "org.sluice.peer.DemoService",
                                    "service_version": "1.0.0", "method": "hello"}},
        "upstream": {"type": "roundrobin", "nodes": {p.to_string(): 1}}}]}));
    let r = request(gw.addr, "POST", "/hello", &[("X-Trace", "abc")], "payload");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with("java dubbo\n"), "{r:?}");
    assert!(r.body.contains("body: payload\n"), "{r:?}");
    assert!(r.body.contains("x-trace: abc\n"), "{r:?}");
    assert_eq!(r.header("x-provider"), Some("java"));
    // The map's "status" is the HTTP status.
    let r = request(gw.addr, "GET", "/hello", &[("X-Status", "404")], "");
    assert_eq!(r.status, 404, "{r:?}");
    // A 1 MiB body reaches the provider (as byte[]) and comes back.
    let big = "x".repeat(1 << 20);
    let r = request(gw.addr, "POST", "/hello", &[], &big);
    assert_eq!(r.status, 200, "{}", r.status);
    assert!(r.body.contains(&format!("body: {big}\n")));
}

#[test]
fn java_generic_primitives_strings_overloads_and_no_arg() {
    let Some(p) = provider() else { return };
    let gw = generic_gw(p, json!({}), None);
    let cases: &[(&str, &str, Value)] = &[
        (
            "addInt",
            r#"{"types":"int,int","values":[40,2]}"#,
            json!(42),
        ),
        (
            "addInt",
            r#"{"types":["int","int"],"values":[-2147483648,-1]}"#,
            json!(2147483647),
        ),
        // Longs beyond 2^53 keep every digit: in as a string or a number, out as a string.
        (
            "nextLong",
            r#"{"types":"long","values":"9007199254740993"}"#,
            json!("9007199254740994"),
        ),
        (
            "nextLong",
            r#"{"types":"long","values":9007199254740993}"#,
            json!("9007199254740994"),
        ),
        ("nextLong", r#"{"types":"long","values":41}"#, json!(42)),
        ("half", r#"{"types":"double","values":3}"#, json!(1.5)),
        ("not", r#"{"types":"boolean","values":true}"#, json!(false)),
        (
            "greet",
            r#"{"types":"java.lang.String","values":"tc"}"#,
            json!("hello tc"),
        ),
        (
            "greet",
            r#"{"types":"string,int","values":["tc",2]}"#,
            json!("hello tc hello tc"),
        ),
        ("ping", "", json!("pong")),
        ("ping", r#"{"types":[],"values":[]}"#, json!("pong")),
        (
            "describe",
            r#"{"types":"java.lang.String","values":[null]}"#,
            json!("null"),
        ),
        ("nothing", "", Value::Null),
        ("bytes", r#"{"types":"int","values":4}"#, json!("AAECAw==")),
        (
            "date",
            r#"{"types":"long","values":86400000}"#,
            json!(86400000),
        ),
    ];
    for (method, body, want) in cases {
        let r = call(&gw, method, body);
        assert_eq!(r.status, 200, "{method} {body}: {r:?}");
        assert_eq!(r.json(), *want, "{method} {body}: {r:?}");
    }
}

#[test]
fn java_generic_pojos_lists_and_maps() {
    let Some(p) = provider() else { return };
    let gw = generic_gw(p, json!({}), None);
    let r = call(
        &gw,
        "older",
        r#"{"types":"org.sluice.peer.User","values":{"name":"ann","age":41,"id":9007199254740993,"tags":["a"]}}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    assert_eq!(v["name"], "ann", "{r:?}");
    assert_eq!(v["age"], 42, "{r:?}");
    assert_eq!(v["id"], "9007199254740993", "{r:?}");
    assert_eq!(v["tags"], json!(["a", "older"]), "{r:?}");
    let r = call(
        &gw,
        "reverse",
        r#"{"types":"java.util.List","values":[1,2,3]}"#,
    );
    assert_eq!((r.status, r.json()), (200, json!([3, 2, 1])), "{r:?}");
    let r = call(
        &gw,
        "doubled",
        r#"{"types":"java.util.Map","values":{"a":1,"b":21}}"#,
    );
    assert_eq!(
        (r.status, r.json()),
        (200, json!({"a": 2, "b": 42})),
        "{r:?}"
    );
}

#[test]
fn java_generic_one_mib_each_way() {
    let Some(p) = provider() else { return };
    let gw = generic_gw(p, json!({}), None);
    let big = "y".repeat(1 << 20);
    let r = call(
        &gw,
        "length",
        &json!({"types": "string", "values": big}).to_string(),
    );
    assert_eq!((r.status, r.json()), (200, json!(1 << 20)), "{}", r.status);
    let r = call(
        &gw,
        "repeat",
        r#"{"types":"string,int","values":["ab",524288]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.status);
    assert_eq!(r.json().as_str().map(str::len), Some(1 << 20));
}

#[test]
fn java_exception_is_a_500_naming_it() {
    let Some(p) = provider() else { return };
    let gw = generic_gw(p, json!({}), None);
    let r = call(&gw, "fail", r#"{"types":"string","values":"boom at 42"}"#);
    assert_eq!(r.status, 500, "{r:?}");
    assert!(r.body.contains("java.lang.IllegalStateException"), "{r:?}");
    assert!(r.body.contains("boom at 42"), "{r:?}");
}

#[test]
fn java_slow_method_times_out_with_504_and_the_connection_stays_usable() {
    let Some(p) = provider() else { return };
    let gw = generic_gw(p, json!({}), Some(1.0));
    let t0 = Instant::now();
    let r = call(&gw, "slow", r#"{"types":"int","values":4000}"#);
    assert_eq!(r.status, 504, "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    let r = call(&gw, "slow", r#"{"types":"int","values":1}"#);
    assert_eq!((r.status, r.json()), (200, json!("slept 1")), "{r:?}");
}

#[test]
fn java_unknown_service_or_method_is_an_error_not_a_hang() {
    let Some(p) = provider() else { return };
    let gw = Gw::start(json!({"routes": [{"id": "t", "uri": "/types",
        "plugins": {"dubbo-proxy": {"service_name": "org.sluice.peer.Nothing",
                                    "service_version": "1.0.0", "generic": true}},
        "upstream": {"type": "roundrobin", "nodes": {p.to_string(): 1}}}]}));
    let r = call(&gw, "ping", "");
    assert_eq!(r.status, 502, "{r:?}");
    let gw = generic_gw(p, json!({}), None);
    let r = call(&gw, "noSuchMethod", "");
    assert!(r.status >= 500, "{r:?}");
    assert!(r.body.contains("noSuchMethod"), "{r:?}");
}

/// Arguments that do not fit the declared types, or no JSON at all: 400, and the provider sees nothing (the
/// upstream here records any connection).
#[test]
fn java_generic_bad_arguments_are_400_and_nothing_is_sent() {
    let Some(p) = provider() else { return };
    let gw = generic_gw(p, json!({}), None);
    let bad = [
        r#"{"types":"int,int","values":["x",1]}"#,
        r#"{"types":"int,int","values":[4294967296,1]}"#,
        r#"{"types":"int,int","values":[1.5,1]}"#,
        r#"{"types":"long","values":"99999999999999999999"}"#,
        r#"{"types":"long","values":1e300}"#,
        r#"{"types":"boolean","values":"yes"}"#,
        r#"{"types":"int,int","values":[1]}"#,
        r#"{"types":"int","values":[1,2]}"#,
        r#"{"types":"org.sluice.peer.User","values":"ann"}"#,
        r#"{"types":"#,
        r#"[1,2]"#,
    ];
    for body in bad {
        let r = call(&gw, "addInt", body);
        assert_eq!(r.status, 400, "{body}: {r:?}");
    }
    // The same requests against an upstream that records connections: none is made.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let probe = l.local_addr().unwrap();
    let gw = generic_gw(probe, json!({}), None);
    for body in bad {
        assert_eq!(call(&gw, "addInt", body).status, 400, "{body}");
    }
    let mut conn = l.accept();
    if let Ok((s, _)) = &mut conn {
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        panic!("the gateway connected upstream and sent {} bytes", b.len());
    }
}

/// A provider with one thread and no queue (Dubbo's fixed pool): of calls that overlap, those finding it busy are
/// answered SERVER_THREADPOOL_EXHAUSTED_ERROR, a 503.
#[test]
fn java_thread_pool_exhausted_is_503() {
    let Some(p) = spawn(1) else { return };
    let gw = generic_gw(p.addr, json!({}), Some(30.0));
    // Warm: the provider's first generic call is slow (class loading).
    assert_eq!(call(&gw, "ping", "").status, 200);
    let addr = gw.addr;
    let calls: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                request(
                    addr,
                    "POST",
                    "/types?method=slow",
                    &[("Content-Type", "application/json")],
                    r#"{"types":"int","values":4000}"#,
                )
            })
        })
        .collect();
    let answers: Vec<_> = calls.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(answers.iter().any(|r| r.status == 200), "{answers:?}");
    let refused = answers
        .iter()
        .find(|r| r.status != 200)
        .expect("four overlapping calls all ran on one thread");
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("THREADPOOL_EXHAUSTED"), "{refused:?}");
}

fn params_gw(p: SocketAddr, routes: &[(&str, &str, Value)]) -> Gw {
    let routes: Vec<Value> = routes
        .iter()
        .enumerate()
        .map(|(i, (uri, method, params))| {
            json!({"id": format!("r{i}"), "uri": uri,
                   "plugins": {"dubbo-proxy": {"service_name": TYPES, "service_version": "1.0.0",
                                               "method": method, "params": params}},
                   "upstream": {"type": "roundrobin", "nodes": {p.to_string(): 1}}})
        })
        .collect();
    Gw::start(json!({ "routes": routes }))
}

fn typed_routes() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "/add/:a",
            "addInt",
            json!([{"type": "int", "from": "path.a"}, {"type": "int", "from": "query.b"}]),
        ),
        (
            "/greet",
            "greet",
            json!([{"type": "java.lang.String", "from": "header.x-name"},
                                   {"type": "int", "from": "query.times", "default": 1}]),
        ),
        (
            "/long",
            "nextLong",
            json!([{"type": "long", "from": "query.v"}]),
        ),
        (
            "/older",
            "older",
            json!([{"type": "org.sluice.peer.User", "from": "body.user"}]),
        ),
        (
            "/reverse",
            "reverse",
            json!([{"type": "java.util.List", "from": "query.xs"}]),
        ),
        ("/ping", "ping", json!([])),
        (
            "/describe",
            "describe",
            json!([{"type": "java.lang.String", "from": "query.s", "default": null}]),
        ),
        (
            "/not",
            "not",
            json!([{"type": "boolean", "from": "body.flag"}]),
        ),
    ]
}

#[test]
fn java_typed_params_from_path_query_headers_and_body() {
    let Some(p) = provider() else { return };
    let gw = params_gw(p, &typed_routes());
    let post = |path: &str, headers: &[(&str, &str)], body: &str| {
        request(gw.addr, "POST", path, headers, body)
    };
    let cases: Vec<(super::Resp, Value)> = vec![
        (gw.get("/add/40?b=2", &[]), json!(42)),
        (gw.get("/add/-1?b=-2147483647", &[]), json!(-2147483648i64)),
        (gw.get("/greet", &[("X-Name", "tc")]), json!("hello tc")),
        (
            gw.get("/greet?times=2", &[("X-Name", "tc")]),
            json!("hello tc hello tc"),
        ),
        (
            gw.get("/long?v=9007199254740993", &[]),
            json!("9007199254740994"),
        ),
        (
            post(
                "/older",
                &[],
                r#"{"user": {"name": "ann", "age": 41, "id": 7, "tags": []}}"#,
            ),
            // Dubbo's generic answer names the POJO's class.
            json!({"class": "org.sluice.peer.User", "name": "ann", "age": 42, "id": 7, "tags": ["older"]}),
        ),
        (gw.get("/reverse?xs=%5B1%2C2%2C3%5D", &[]), json!([3, 2, 1])),
        (gw.get("/ping", &[]), json!("pong")),
        (gw.get("/describe?s=a%20b+c", &[]), json!("string:a b c")),
        (gw.get("/describe", &[]), json!("null")),
        (post("/not", &[], r#"{"flag": false}"#), json!(true)),
    ];
    for (i, (r, want)) in cases.into_iter().enumerate() {
        assert_eq!(r.status, 200, "case {i}: {r:?}");
        assert_eq!(r.json(), want, "case {i}: {r:?}");
    }
}

/// What an attacker sends to typed parameters: wrong types, numbers out of range, missing values, broken JSON or
/// encodings. Each is a 400 naming the parameter, and nothing reaches the upstream.
#[test]
fn java_typed_params_refuse_bad_input_and_send_nothing() {
    let Some(p) = provider() else { return };
    type Req<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str);
    let bad: Vec<Req> = vec![
        ("GET", "/add/40", &[], ""),
        ("GET", "/add/x?b=1", &[], ""),
        ("GET", "/add/1?b=2147483648", &[], ""),
        ("GET", "/add/1?b=99999999999999999999999", &[], ""),
        ("GET", "/add/1?b=1.5", &[], ""),
        ("GET", "/add/1?b=", &[], ""),
        ("GET", "/greet", &[], ""),
        ("GET", "/greet?times=lots", &[("X-Name", "tc")], ""),
        ("GET", "/long?v=9223372036854775808", &[], ""),
        ("GET", "/long?v=0x10", &[], ""),
        ("GET", "/reverse?xs=%5B1%2C", &[], ""),
        ("GET", "/reverse?xs=%7B%7D", &[], ""),
        ("GET", "/describe?s=%FF", &[], ""),
        ("POST", "/older", &[], r#"{"user": "ann"}"#),
        ("POST", "/older", &[], r#"{"usr": {}}"#),
        ("POST", "/older", &[], r#"{"user": {"#),
        ("POST", "/not", &[], r#"{"flag": "maybe"}"#),
        ("POST", "/not", &[], r#"{"flag": null}"#),
        ("POST", "/not", &[], ""),
    ];
    let check = |gw: &Gw| {
        for (method, path, headers, body) in &bad {
            let r = request(gw.addr, method, path, headers, body);
            assert_eq!(r.status, 400, "{method} {path} {body}: {r:?}");
            assert!(
                r.body.contains("parameter") || r.body.contains("JSON"),
                "{r:?}"
            );
        }
    };
    check(&params_gw(p, &typed_routes()));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    check(&params_gw(l.local_addr().unwrap(), &typed_routes()));
    assert!(l.accept().is_err(), "the gateway connected upstream");
}

#[test]
fn java_typed_params_bad_config_is_refused() {
    let route = |conf: Value| {
        json!({"routes": [{"id": "x", "uri": "/x", "plugins": {"dubbo-proxy": conf},
                           "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1": 1}}}]})
    };
    for conf in [
        json!({"params": [{"type": "int[[", "from": "query.a"}]}),
        json!({"params": [{"type": "int", "from": "cookie.a"}]}),
        json!({"params": [{"type": "int", "from": "query."}]}),
        json!({"params": [{"type": "int", "from": "query.a", "default": "x"}]}),
        json!({"params": [{"type": "int"}]}),
        json!({"attachments": {"version": "2.0.0"}}),
        json!({"attachments": {"generic": "false"}}),
        json!({"attachments": {"a": 1}}),
        json!({"retries": -1}),
    ] {
        let mut c = json!({"service_name": TYPES, "service_version": "1.0.0"});
        c.as_object_mut()
            .unwrap()
            .extend(conf.as_object().unwrap().clone());
        assert!(Gw::try_start(route(c.clone())).is_err(), "{c}");
    }
}

#[test]
fn java_attachments_reach_the_provider() {
    let Some(p) = provider() else { return };
    let gw = generic_gw(p, json!({"attachments": {"tenant": "blue"}}), None);
    let r = call(&gw, "attachment", r#"{"types":"string","values":"tenant"}"#);
    assert_eq!((r.status, r.json()), (200, json!("blue")), "{r:?}");
}

/// `retries` repeats a call that timed out (here the provider is slow on the first call only); without it the
/// timeout is the answer.
#[test]
fn java_retries_repeat_a_timed_out_call() {
    let Some(p) = provider() else { return };
    let body = |key: &str| format!(r#"{{"types":"string,int","values":["{key}",3000]}}"#);
    let gw = generic_gw(p, json!({}), Some(1.0));
    assert_eq!(call(&gw, "slowFirst", &body("no-retry")).status, 504);
    let gw = generic_gw(p, json!({"retries": 1}), Some(1.0));
    let r = call(&gw, "slowFirst", &body("retry"));
    assert_eq!((r.status, r.json()), (200, json!("again")), "{r:?}");
}

/// `retries` is failover: a call that timed out on a frozen provider (it accepts and never answers, as a JVM
/// stopped in a pause or behind a cut link) is repeated on the other provider, not on the same one again (which
/// answered 504 for every call that went to it first before).
#[test]
fn java_retries_go_to_another_provider() {
    let Some(p) = provider() else { return };
    let (frozen_addr, _) = frozen_provider();
    let conf =
        json!({"service_name": TYPES, "service_version": "1.0.0", "generic": true, "retries": 1});
    let gw = Gw::start(json!({"routes": [{"id": "t", "uri": "/types",
        "plugins": {"dubbo-proxy": conf},
        "upstream": {"type": "roundrobin", "nodes": {p.to_string(): 1, frozen_addr.to_string(): 1},
                     "timeout": {"connect": 1.0, "send": 1.0, "read": 1.0}}}]}));
    // Round robin over both: half of the calls try the frozen one first.
    for i in 0..4 {
        let r = call(&gw, "ping", "");
        assert_eq!(
            (r.status, r.json()),
            (200, json!("pong")),
            "call {i}: {r:?}"
        );
    }
    // Without retries the frozen provider's share times out.
    let conf = json!({"service_name": TYPES, "service_version": "1.0.0", "generic": true});
    let gw = Gw::start(json!({"routes": [{"id": "t", "uri": "/types",
        "plugins": {"dubbo-proxy": conf},
        "upstream": {"type": "roundrobin", "nodes": {p.to_string(): 1, frozen_addr.to_string(): 1},
                     "timeout": {"connect": 1.0, "send": 1.0, "read": 1.0}}}]}));
    let statuses: Vec<u16> = (0..4).map(|_| call(&gw, "ping", "").status).collect();
    assert!(
        statuses.contains(&504) && statuses.contains(&200),
        "{statuses:?}"
    );
}

/// A provider that accepts and reads but never answers; counts the Dubbo calls (not heartbeats) it got.
fn frozen_provider() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::Read as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let n = calls.clone();
    std::thread::spawn(move || {
        for c in l.incoming().take(64) {
            let Ok(mut c) = c else { continue };
            let n = n.clone();
            std::thread::spawn(move || {
                let mut head = [0u8; 16];
                while c.read_exact(&mut head).is_ok() {
                    let len = u32::from_be_bytes([head[12], head[13], head[14], head[15]]) as u64;
                    // Flag byte: 0x80 request, 0x20 event (heartbeat).
                    if head[2] & 0x80 != 0 && head[2] & 0x20 == 0 {
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    if std::io::copy(&mut (&mut c).take(len), &mut std::io::sink()).is_err() {
                        break;
                    }
                }
                // Held open, never answered, until the test process ends.
                std::thread::park();
            });
        }
    });
    (addr, calls)
}

/// Passive health: a call that timed out on a frozen provider is reported, the provider leaves rotation, and
/// later calls never reach it (they do not wait `timeout.read` on it first).
#[test]
fn java_frozen_provider_leaves_rotation_by_passive_health() {
    use std::sync::atomic::Ordering;
    let Some(p) = provider() else { return };
    let (frozen, calls) = frozen_provider();
    let conf =
        json!({"service_name": TYPES, "service_version": "1.0.0", "generic": true, "retries": 1});
    let gw = Gw::start(json!({"routes": [{"id": "t", "uri": "/types",
        "plugins": {"dubbo-proxy": conf},
        "upstream": {"type": "roundrobin", "nodes": {p.to_string(): 1, frozen.to_string(): 1},
                     "timeout": {"connect": 1.0, "send": 1.0, "read": 1.0},
                     "checks": {"active": {"type": "tcp"},
                                "passive": {"type": "tcp", "unhealthy": {"timeouts": 1}}}}}]}));
    for i in 0..10 {
        let r = call(&gw, "ping", "");
        assert_eq!(
            (r.status, r.json()),
            (200, json!("pong")),
            "call {i}: {r:?}"
        );
    }
    // Round robin would have sent it five; the first timeout took it out.
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

fn http_dubbo_gw(p: SocketAddr, routes: &[(&str, Value)]) -> Gw {
    let routes: Vec<Value> = routes
        .iter()
        .enumerate()
        .map(|(i, (uri, conf))| {
            let mut c = json!({"service_name": TYPES, "service_version": "1.0.0"});
            c.as_object_mut()
                .unwrap()
                .extend(conf.as_object().unwrap().clone());
            json!({"id": format!("h{i}"), "uri": uri, "plugins": {"http-dubbo": c},
                   "upstream": {"type": "roundrobin", "nodes": {p.to_string(): 1}}})
        })
        .collect();
    Gw::start(json!({ "routes": routes }))
}

fn http_dubbo_routes() -> Vec<(&'static str, Value)> {
    vec![
        (
            "/greet",
            json!({"method": "greet", "params_type_desc": "Ljava/lang/String;I"}),
        ),
        (
            "/add",
            json!({"method": "addInt", "params_type_desc": "II"}),
        ),
        (
            "/long",
            json!({"method": "nextLong", "params_type_desc": "J"}),
        ),
        (
            "/older",
            json!({"method": "older", "params_type_desc": "Lorg/sluice/peer/User;"}),
        ),
        ("/ping", json!({"method": "ping"})),
        ("/nothing", json!({"method": "nothing"})),
        (
            "/fail",
            json!({"method": "fail", "params_type_desc": "Ljava/lang/String;"}),
        ),
        (
            "/ser",
            json!({"method": "addInt", "params_type_desc": "II", "serialized": true}),
        ),
        (
            "/hdr",
            json!({"method": "addInt", "params_type_desc": "II",
                        "serialization_header_key": "X-Serialized"}),
        ),
        (
            "/small",
            json!({"method": "length", "params_type_desc": "Ljava/lang/String;",
                          "max_req_body_size": 16}),
        ),
    ]
}

/// APISIX's http-dubbo (fastjson wire) against the Java provider.
#[test]
fn java_http_dubbo_fastjson_calls() {
    let Some(p) = provider() else { return };
    let gw = http_dubbo_gw(p, &http_dubbo_routes());
    let post = |path: &str, headers: &[(&str, &str)], body: &str| {
        request(gw.addr, "POST", path, headers, body)
    };
    let ok: Vec<(super::Resp, &str)> = vec![
        (
            post("/greet", &[], r#"["tc", 2]"#),
            r#""hello tc hello tc""#,
        ),
        (
            post("/greet", &[], "[\"a\\nb\\\"c\", 1]"),
            r#""hello a\nb\"c""#,
        ),
        (post("/add", &[], "[40, 2]"), "42"),
        (post("/long", &[], "[9007199254740993]"), "9007199254740994"),
        (
            post(
                "/older",
                &[],
                r#"[{"name": "ann", "age": 41, "id": 7, "tags": ["a"]}]"#,
            ),
            r#"{"age":42,"id":7,"name":"ann","tags":["a","older"]}"#,
        ),
        (post("/ping", &[], ""), r#""pong""#),
        (post("/nothing", &[], ""), ""),
        (post("/ser", &[], "40\n2"), "42"),
        (post("/hdr", &[("X-Serialized", "true")], "1\n2\n"), "3"),
        (post("/hdr", &[], "[1, 2]"), "3"),
    ];
    for (i, (r, want)) in ok.into_iter().enumerate() {
        assert_eq!((r.status, r.body.as_str()), (200, want), "case {i}: {r:?}");
    }
    let r = post("/fail", &[], r#"["boom"]"#);
    assert_eq!(r.status, 500, "{r:?}");
    assert!(
        r.body.contains("java.lang.IllegalStateException: boom"),
        "{r:?}"
    );
    assert_eq!(post("/small", &[], r#"["a long string here"]"#).status, 413);
}

/// Bodies that are not a JSON array of arguments: 400, and nothing reaches the upstream.
#[test]
fn java_http_dubbo_bad_body_is_400_and_nothing_is_sent() {
    let Some(p) = provider() else { return };
    let bad = ["[40,", "40", r#""x""#, "{nope"];
    let check = |gw: &Gw| {
        for body in bad {
            let r = request(gw.addr, "POST", "/add", &[], body);
            assert_eq!(r.status, 400, "{body}: {r:?}");
        }
    };
    check(&http_dubbo_gw(p, &http_dubbo_routes()));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    check(&http_dubbo_gw(
        l.local_addr().unwrap(),
        &http_dubbo_routes(),
    ));
    assert!(l.accept().is_err(), "the gateway connected upstream");
}

/// http-dubbo with `serialization_protocol: hessian2` (a Sluice extension): the same routes' calls in Dubbo's
/// default serialization, each JSON argument typed by `params_type_desc`.
fn hessian2_routes() -> Vec<(&'static str, Value)> {
    let h = |method: &str, desc: &str| json!({"method": method, "params_type_desc": desc, "serialization_protocol": "hessian2"});
    vec![
        ("/greet", h("greet", "Ljava/lang/String;I")),
        ("/add", h("addInt", "II")),
        ("/long", h("nextLong", "J")),
        ("/half", h("half", "D")),
        ("/not", h("not", "Z")),
        ("/older", h("older", "Lorg/sluice/peer/User;")),
        ("/reverse", h("reverse", "Ljava/util/List;")),
        ("/doubled", h("doubled", "Ljava/util/Map;")),
        ("/describe", h("describe", "Ljava/lang/String;")),
        ("/ping", h("ping", "")),
        ("/nothing", h("nothing", "")),
        ("/fail", h("fail", "Ljava/lang/String;")),
        ("/bytes", h("bytes", "I")),
        ("/length", h("length", "Ljava/lang/String;")),
        ("/repeat", h("repeat", "Ljava/lang/String;I")),
        (
            "/small",
            json!({"method": "length", "params_type_desc": "Ljava/lang/String;",
                   "serialization_protocol": "hessian2", "max_req_body_size": 16}),
        ),
    ]
}

#[test]
fn java_http_dubbo_hessian2_calls() {
    let Some(p) = provider() else { return };
    let gw = http_dubbo_gw(p, &hessian2_routes());
    let post = |path: &str, body: &str| request(gw.addr, "POST", path, &[], body);
    let ok: Vec<(&str, &str, &str)> = vec![
        ("/greet", r#"["tc", 2]"#, r#""hello tc hello tc""#),
        ("/greet", "[\"a\\nb\\\"c\", 1]", r#""hello a\nb\"c""#),
        ("/add", "[40, 2]", "42"),
        // Declared int: a numeric string is coerced, as a generic call does.
        ("/add", r#"["40", 2]"#, "42"),
        ("/add", "[2147483647, 1]", "-2147483648"),
        // A long beyond 2^53 comes back as a string (JavaScript cannot hold it).
        ("/long", "[9007199254740993]", r#""9007199254740994""#),
        ("/long", "[41]", "42"),
        ("/half", "[5]", "2.5"),
        ("/not", "[false]", "true"),
        (
            "/older",
            r#"[{"name": "ann", "age": 41, "id": 7, "tags": ["a"]}]"#,
            r#"{"age":42,"id":7,"name":"ann","tags":["a","older"]}"#,
        ),
        (
            "/older",
            r#"[{"class": "org.sluice.peer.User", "name": "bo", "age": 1}]"#,
            r#"{"age":2,"id":0,"name":"bo","tags":["older"]}"#,
        ),
        ("/reverse", "[[1, 2, 3]]", "[3,2,1]"),
        ("/doubled", r#"[{"a": 1, "b": 21}]"#, r#"{"a":2,"b":42}"#),
        ("/describe", "[null]", r#""null""#),
        ("/ping", "", r#""pong""#),
        ("/ping", "[]", r#""pong""#),
        ("/nothing", "", ""),
        ("/bytes", "[3]", r#""AAEC""#),
    ];
    for (path, body, want) in ok {
        let r = post(path, body);
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, want),
            "{path} {body}: {r:?}"
        );
    }
    let r = post("/fail", r#"["boom"]"#);
    assert_eq!(r.status, 500, "{r:?}");
    assert!(
        r.body.contains("java.lang.IllegalStateException: boom"),
        "{r:?}"
    );
    // 1 MiB each way.
    let mib = "x".repeat(1 << 20);
    let r = post("/length", &format!("[\"{mib}\"]"));
    assert_eq!((r.status, r.body.as_str()), (200, "1048576"));
    let r = post("/repeat", r#"["x", 1048576]"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, format!("\"{mib}\""));
}

/// Hostile bodies on a hessian2 route: refused with 400 (or 413 for size) before anything is sent.
#[test]
fn java_http_dubbo_hessian2_refuses_bad_input_and_sends_nothing() {
    let Some(p) = provider() else { return };
    let deep = format!("[{}{}]", "[".repeat(200), "]".repeat(200));
    let huge = format!("[\"{}\"]", "y".repeat(9 << 20));
    let bad: Vec<(&str, String, u16)> = vec![
        ("/add", "[40,".into(), 400),
        ("/add", "{nope".into(), 400),
        // Not an array: an object's order is not the parameters'.
        ("/add", r#"{"a": 40, "b": 2}"#.into(), 400),
        ("/add", "40".into(), 400),
        // Arity and types.
        ("/add", "[40]".into(), 400),
        ("/add", "[40, 2, 1]".into(), 400),
        ("/add", r#"["forty", 2]"#.into(), 400),
        ("/add", "[null, 2]".into(), 400),
        ("/add", "[4.5, 2]".into(), 400),
        ("/add", "[2147483648, 0]".into(), 400),
        ("/long", "[9223372036854775808]".into(), 400),
        ("/not", r#"["yes"]"#.into(), 400),
        ("/older", r#"["ann"]"#.into(), 400),
        // The declared class is the one the provider builds: the body cannot pick another.
        (
            "/older",
            r#"[{"class": "java.lang.ProcessBuilder", "command": ["id"]}]"#.into(),
            400,
        ),
        ("/reverse", r#"[{"a": 1}]"#.into(), 400),
        ("/ping", "[1]".into(), 400),
        // Nesting deeper than the JSON parser's limit.
        ("/reverse", deep, 400),
        // Over max_req_body_size, and a frame over the 8 MiB payload limit.
        ("/small", r#"["a long string here"]"#.into(), 413),
        ("/length", huge, 413),
    ];
    let check = |gw: &Gw| {
        for (path, body, want) in &bad {
            let r = request(gw.addr, "POST", path, &[], body);
            let shown: String = body.chars().take(40).collect();
            assert_eq!(r.status, *want, "{path} {shown}: {r:?}");
        }
    };
    // Against the provider: refused, and the provider still answers afterwards.
    let gw = http_dubbo_gw(p, &hessian2_routes());
    check(&gw);
    let r = request(gw.addr, "POST", "/add", &[], "[1, 2]");
    assert_eq!((r.status, r.body.as_str()), (200, "3"));
    // Against a listener that must see no connection.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    check(&http_dubbo_gw(l.local_addr().unwrap(), &hessian2_routes()));
    assert!(l.accept().is_err(), "the gateway connected upstream");
}
