//! proxy-wasm filters (issue 19) through the real binary: config.yaml's `wasm.plugins` loads real filters, built
//! during the test from npm with the AssemblyScript proxy-wasm SDK (crates/sluice-wasm/tools/filters: package.json,
//! package-lock.json, assembly/*.ts, build.sh; `npm ci` and the build run once into `<target>/wasm-filters/`,
//! behind a stamp of those files and an exclusive `flock`). Needs Node.js and npm; without them the tests skip,
//! or fail under `CI=true`.
//!
//! The filters: add_header (request and response headers, a per-instance request count, refuses the
//! configuration "reject"), local (answers 403 itself), callout (an HTTP call to a real local server, then resumes
//! or answers with what came back), trap (`unreachable`), loop (`while (true)`), body (rewrites the response body,
//! or answers itself from the response phase), metrics (a counter, a gauge and a histogram).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::client::get_once;
use crate::support::process::{Sluice, TempDir};
use crate::support::{free_port, refused_addr, t, Client, Origin};

const KEY: &str = "wasm-admin-key";
const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const FILTERS: [&str; 8] = [
    "add_header",
    "local",
    "callout",
    "trap",
    "loop",
    "resp_header",
    "body",
    "metrics",
];

fn tool_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-wasm/tools/filters")
}

/// The target directory (the test binary lives in `<target>/debug/deps`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors().nth(3).expect("target dir").to_path_buf()
}

fn lock(path: &Path) -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open build lock");
    let end = Instant::now() + Duration::from_secs(900);
    loop {
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return f,
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                assert!(Instant::now() < end, "{} still locked", path.display());
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("flock {}: {e}", path.display()),
        }
    }
}

/// `<target>/wasm-filters/out` with every filter built (`npm ci` from the committed lockfile, then build.sh).
fn filters() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let ok = |c: &str| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !ok("node") || !ok("npm") {
            crate::support::skip_unless_ci("the wasm filters are built with Node.js and npm");
            return None;
        }
        let home = target_dir().join("wasm-filters");
        std::fs::create_dir_all(home.join("assembly")).expect("create <target>/wasm-filters");
        let _lock = lock(&home.join(".lock"));
        let mut h = DefaultHasher::new();
        let mut files = vec![
            "package.json".to_owned(),
            "package-lock.json".into(),
            "build.sh".into(),
        ];
        files.extend(FILTERS.iter().map(|f| format!("assembly/{f}.ts")));
        for f in &files {
            let body = std::fs::read(tool_dir().join(f))
                .unwrap_or_else(|e| panic!("read tools/filters/{f}: {e}"));
            body.hash(&mut h);
            std::fs::write(home.join(f), body).expect("copy the filters' files");
        }
        let stamp = format!("{:016x}", h.finish());
        let stamp_file = home.join(".sluice-stamp");
        if std::fs::read_to_string(&stamp_file).ok().as_deref() != Some(stamp.as_str()) {
            let run = |cmd: &mut Command| {
                let out = cmd
                    .current_dir(&home)
                    .output()
                    .expect("run the filter build");
                assert!(
                    out.status.success(),
                    "{cmd:?} in {} failed:\n{}{}",
                    home.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            run(Command::new("npm").args(["ci", "--no-audit", "--no-fund"]));
            run(Command::new("bash").args(["build.sh", "out"]));
            std::fs::write(&stamp_file, &stamp).expect("write stamp");
        }
        Some(home.join("out"))
    })
    .clone()
}

/// config.yaml for a traditional node (embedded store, Admin API) with the filters as plugins `wasm_<filter>`.
fn config(dir: &TempDir, port: u16, admin: u16, wasm: &str) -> String {
    format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: true\n  enable_control: false\n  ssl:\n    enable: false\n\
         nginx_config:\n  worker_processes: 1\n  http:\n    access_log: {log}\n\
         deployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n\
         \x20 admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin}\n\
         \x20   admin_key:\n      - name: admin\n        key: {KEY}\n        role: admin\n\
         plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
         sluice:\n  data_dir: data\n\
         wasm:\n  plugins:\n{wasm}",
        log = dir.0.join("access.log").display()
    )
}

/// The `wasm.plugins` lines for these filters (each test loads only the ones it uses: modules compile at start).
fn wasm_section(out: &Path, names: &[&str]) -> String {
    let mut s = String::new();
    for (i, f) in names.iter().enumerate() {
        s += &format!(
            "    - name: wasm_{f}\n      priority: {}\n      file: {}\n",
            7000 - i,
            out.join(format!("{f}.wasm")).display()
        );
    }
    s
}

async fn admin(a: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut c = t(Client::connect(a)).await;
    let r = t(c.request(
        method,
        path,
        &format!("X-API-KEY: {KEY}\r\n"),
        body.as_bytes(),
    ))
    .await;
    (r.status, r.text())
}

async fn put_route(
    a: SocketAddr,
    id: &str,
    uri: &str,
    plugins: &str,
    up: SocketAddr,
) -> (u16, String) {
    let body = format!(
        r#"{{"uri":"{uri}","plugins":{plugins},"upstream":{{"type":"roundrobin","nodes":{{"{up}":1}}}}}}"#
    );
    admin(a, "PUT", &format!("/apisix/admin/routes/{id}"), &body).await
}

/// GETs `path` until it answers `want` (the route applies within the store's sync), bounded.
async fn until(addr: SocketAddr, path: &str, want: u16) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get_once(addr, path).await;
        if r.status == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "{path}: {} after 10 s, want {want}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start(out: &Path, names: &[&str]) -> (Sluice, SocketAddr) {
    start_with(&wasm_section(out, names), None).await
}

/// [`start`] with a given `wasm.plugins` section and, with `metrics`, the prometheus export server on that port.
async fn start_with(section: &str, metrics: Option<u16>) -> (Sluice, SocketAddr) {
    let dir = TempDir::new("wasm");
    let (port, admin_port) = (free_port(), free_port());
    let mut conf = config(&dir, port, admin_port, section);
    if let Some(m) = metrics {
        conf = conf.replace(
            "    enable_export_server: false\n",
            &format!("    export_addr:\n      ip: 127.0.0.1\n      port: {m}\n"),
        );
    }
    std::fs::write(dir.0.join("config.yaml"), conf).expect("write config.yaml");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    (Sluice::spawn_in(dir, addr, &[admin]).await, admin)
}

async fn get_with(addr: SocketAddr, path: &str, extra: &str) -> crate::support::client::Response {
    let mut c = t(Client::connect(addr)).await;
    t(c.request("GET", path, extra, b"")).await
}

#[tokio::test]
async fn filters_add_headers_answer_call_out_and_refuse_bad_conf() {
    let Some(out) = filters() else { return };
    let origin = Origin::start("wasm-origin").await;
    let checker = Origin::start("checker").await;
    let (gw, a) = start(&out, &["add_header", "local", "callout"]).await;

    // add_header: on the request going upstream and on the response; conf as a string.
    let (s, b) = put_route(
        a,
        "1",
        "/add/*",
        r#"{"wasm_add_header":{"conf":"hello"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201, "{b}");
    until(gw.addr, "/add/x", 200).await;
    let r = get_once(gw.addr, "/add/x").await;
    assert_eq!(r.header("x-wasm"), Some("hello"));
    assert_eq!(origin.last().header("x-wasm-req"), Some("hello"));

    // A conf the filter refuses (proxy_on_configure false), an empty one, none: 400, and nothing changes.
    for (plugins, why) in [
        (
            r#"{"wasm_add_header":{"conf":"reject"}}"#,
            "proxy_on_configure returned false",
        ),
        (r#"{"wasm_add_header":{"conf":""}}"#, "validation failed"),
        (r#"{"wasm_add_header":{"conf":{}}}"#, "validation failed"),
        (r#"{"wasm_add_header":{}}"#, "\\\"conf\\\" is required"),
    ] {
        let (s, b) = put_route(a, "1", "/add/*", plugins, origin.addr).await;
        assert_eq!(s, 400, "{plugins}: {b}");
        assert!(b.contains(why), "{plugins}: {b}");
        let (s, _) = put_route(a, "9", "/new/*", plugins, origin.addr).await;
        assert_eq!(s, 400, "{plugins}");
    }
    let (s, _) = admin(a, "GET", "/apisix/admin/routes/9", "").await;
    assert_eq!(s, 404, "a refused write created nothing");
    let (_, b) = admin(a, "GET", "/apisix/admin/routes/1", "").await;
    assert!(b.contains(r#""conf":"hello""#), "route 1 unchanged: {b}");
    assert_eq!(
        get_once(gw.addr, "/add/x").await.header("x-wasm"),
        Some("hello")
    );

    // An object conf reaches the filter as JSON text (APISIX encodes it); a live change applies.
    let (s, b) = put_route(
        a,
        "1",
        "/add/*",
        r#"{"wasm_add_header":{"conf":{"k":"v"}}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let end = Instant::now() + Duration::from_secs(10);
    while get_once(gw.addr, "/add/x").await.header("x-wasm") != Some(r#"{"k":"v"}"#) {
        assert!(Instant::now() < end, "the new conf never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // local: the filter answers; the upstream never sees the request.
    let (s, b) = put_route(
        a,
        "2",
        "/local/*",
        r#"{"wasm_local":{"conf":"no"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201, "{b}");
    until(gw.addr, "/local/x", 403).await;
    let before = origin.count();
    let r = get_once(gw.addr, "/local/x").await;
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-wasm-local"), Some("1"));
    assert_eq!(r.text(), "denied by wasm: no\n");
    assert_eq!(
        origin.count(),
        before,
        "a local answer does not reach the upstream"
    );
    let r = get_with(gw.addr, "/local/x", "x-pass: yes\r\n").await;
    assert_eq!(r.status, 200);

    // callout: a real HTTP call; a 200 answer resumes the request with what came back.
    let expected = get_once(checker.addr, "/check").await.text();
    let conf = format!(r#"{{"wasm_callout":{{"conf":"{}"}}}}"#, checker.addr);
    let (s, b) = put_route(a, "3", "/call/*", &conf, origin.addr).await;
    assert_eq!(s, 201, "{b}");
    until(gw.addr, "/call/x", 200).await;
    let r = get_with(gw.addr, "/call/x", "x-token: secret-1\r\n").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = checker.last();
    assert_eq!(seen.target, "/check");
    assert_eq!(seen.header("x-token"), Some("secret-1"));
    assert_eq!(origin.last().header("x-checked"), Some(expected.as_str()));
    // A non-200 answer is the client's answer; an unreachable service gives the filter's 503.
    let conf = format!(
        r#"{{"wasm_callout":{{"conf":"{}/status/403"}}}}"#,
        checker.addr
    );
    let (s, _) = put_route(a, "4", "/deny/*", &conf, origin.addr).await;
    assert_eq!(s, 201);
    until(gw.addr, "/deny/x", 403).await;
    let before = origin.count();
    assert_eq!(get_once(gw.addr, "/deny/x").await.status, 403);
    assert_eq!(origin.count(), before);
    let conf = format!(r#"{{"wasm_callout":{{"conf":"{}"}}}}"#, refused_addr());
    let (s, _) = put_route(a, "5", "/down/*", &conf, origin.addr).await;
    assert_eq!(s, 201);
    until(gw.addr, "/down/x", 503).await;
    assert_eq!(
        get_once(gw.addr, "/down/x").await.text(),
        "check service unreachable\n"
    );
}

#[tokio::test]
async fn a_trap_or_a_loop_answers_500_and_the_worker_goes_on() {
    let Some(out) = filters() else { return };
    let origin = Origin::start("wasm-origin").await;
    let (gw, a) = start(&out, &["trap", "loop"]).await;
    let (s, _) = put_route(
        a,
        "1",
        "/trap/*",
        r#"{"wasm_trap":{"conf":"x"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201);
    let (s, _) = put_route(
        a,
        "2",
        "/loop/*",
        r#"{"wasm_loop":{"conf":"x"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201);
    until(gw.addr, "/trap/x", 200).await;
    until(gw.addr, "/loop/x", 200).await;

    for _ in 0..3 {
        assert_eq!(
            get_with(gw.addr, "/trap/x", "x-trap: 1\r\n").await.status,
            500
        );
        assert_eq!(
            get_once(gw.addr, "/trap/x").await.status,
            200,
            "the next request is served"
        );
    }

    // One worker: the looping request and a plain one share it. The loop is cut at the call limit (0.1 s by
    // default) and answered 500; the plain request is served, and the process is still there.
    let started = Instant::now();
    let looping = tokio::spawn({
        let addr = gw.addr;
        async move { get_with(addr, "/loop/x", "x-loop: 1\r\n").await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let plain = get_once(gw.addr, "/loop/x").await;
    let looped = t(looping).await.expect("join");
    assert_eq!(looped.status, 500);
    assert_eq!(plain.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "cut within the limit: {:?}",
        started.elapsed()
    );
    for _ in 0..2 {
        assert_eq!(
            get_with(gw.addr, "/loop/x", "x-loop: 1\r\n").await.status,
            500
        );
    }
    assert_eq!(get_once(gw.addr, "/loop/x").await.status, 200);
    assert_eq!(get_once(gw.addr, "/trap/x").await.status, 200);
    drop(gw);
}

#[tokio::test]
async fn concurrent_requests_on_one_worker_reuse_instances() {
    let Some(out) = filters() else { return };
    let origin = Origin::start("wasm-origin").await;
    let (gw, a) = start(&out, &["add_header"]).await;
    let (s, _) = put_route(
        a,
        "1",
        "/add/*",
        r#"{"wasm_add_header":{"conf":"c"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201);
    until(gw.addr, "/add/x", 200).await;
    // 8 rounds of 10 concurrent requests on keep-alive connections: an instance's first request reports
    // `x-wasm-served: 1`, so the count of those is the count of instances the route created.
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(t(Client::connect(gw.addr)).await);
    }
    let mut served = Vec::new();
    for _ in 0..8 {
        let mut tasks = Vec::new();
        for mut c in clients.drain(..) {
            tasks.push(tokio::spawn(async move {
                let r = t(c.get("/add/x")).await;
                (c, r)
            }));
        }
        for task in tasks {
            let (c, r) = t(task).await.expect("join");
            assert_eq!(r.status, 200);
            served.push(
                r.header("x-wasm-served")
                    .expect("x-wasm-served")
                    .parse::<u32>()
                    .expect("number"),
            );
            clients.push(c);
        }
    }
    let created = served.iter().filter(|&&n| n == 1).count();
    assert!(
        (1..=10).contains(&created),
        "instances created: {created} for 80 requests, 10 at a time"
    );
    assert!(
        served.iter().any(|&n| n >= 8),
        "instances were reused: {served:?}"
    );
    drop(gw);
}

/// `sluice start` with this wasm section: the exit status and stderr (bounded wait).
fn start_fails(wasm: &str) -> String {
    let dir = TempDir::new("wasm-bad");
    std::fs::write(
        dir.0.join("config.yaml"),
        config(&dir, free_port(), free_port(), wasm),
    )
    .expect("config");
    let mut child = Command::new(BIN)
        .arg("start")
        .arg("-c")
        .arg(dir.0.join("config.yaml"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            assert!(!st.success(), "sluice started with a bad wasm section");
            let mut err = String::new();
            use std::io::Read;
            let _ = child
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut err);
            return err;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice still running with a bad wasm section");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_missing_or_bad_module_fails_the_start_with_a_clear_error() {
    let dir = TempDir::new("wasm-files");
    let missing = dir.0.join("nope.wasm");
    let err = start_fails(&format!(
        "    - name: w\n      priority: 1\n      file: {}\n",
        missing.display()
    ));
    assert!(
        err.contains("wasm plugin w: cannot read") && err.contains("nope.wasm"),
        "{err}"
    );

    let text = dir.0.join("text.wasm");
    std::fs::write(&text, "not wasm at all").expect("write");
    let err = start_fails(&format!(
        "    - name: w\n      priority: 1\n      file: {}\n",
        text.display()
    ));
    assert!(err.contains("is not a wasm module"), "{err}");

    // Valid wasm that is no proxy-wasm filter (the smallest module: header and version only).
    let empty = dir.0.join("empty.wasm");
    std::fs::write(&empty, b"\0asm\x01\0\0\0").expect("write");
    let err = start_fails(&format!(
        "    - name: w\n      priority: 1\n      file: {}\n",
        empty.display()
    ));
    assert!(err.contains("exports no proxy-wasm ABI version"), "{err}");

    // A name a built-in plugin has.
    let Some(out) = filters() else { return };
    let err = start_fails(&format!(
        "    - name: key-auth\n      priority: 1\n      file: {}\n",
        out.join("add_header.wasm").display()
    ));
    assert!(err.contains("\"key-auth\" is already taken"), "{err}");
}

/// The body filter with a 64 KiB `max_body_size`.
fn body_section(out: &Path) -> String {
    wasm_section(out, &["body"]) + "      max_body_size: 65536\n"
}

async fn get_mode(c: &mut Client, path: &str, mode: &str) -> crate::support::client::Response {
    t(c.request("GET", path, &format!("x-mode: {mode}\r\n"), b"")).await
}

#[tokio::test]
async fn a_filter_rewrites_response_bodies_within_its_cap() {
    let Some(out) = filters() else { return };
    // The origin answers `/` with its name ("hello world", with a Content-Length), `/chunked/3` with three chunks.
    let origin = Origin::start("hello world").await;
    let (gw, a) = start_with(&body_section(&out), None).await;
    let (s, b) = put_route(
        a,
        "1",
        "/b/*",
        r#"{"wasm_body":{"conf":"wasm"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201, "{b}");
    until(gw.addr, "/b/x", 200).await;
    let mut c = t(Client::connect(gw.addr)).await;

    // Buffered (StopIterationAndBuffer until the end), rewritten, framed by its new length; the upstream's other
    // headers stay and a header the filter set in the body phase is there (the head waited for the body).
    let want = "wasm world[wasm saw 11 bytes]\n";
    let r = get_mode(&mut c, "/b/x", "buffer").await;
    assert_eq!((r.status, r.text().as_str()), (200, want));
    assert!(!r.chunked);
    assert_eq!(
        r.header("content-length"),
        Some(want.len().to_string().as_str())
    );
    assert_eq!(r.header("x-wasm-body"), Some("rewritten"));
    assert_eq!(r.header("x-origin"), Some("hello world"));
    // A chunked upstream body: the same, with a Content-Length.
    let r = get_mode(&mut c, "/b/chunked/3", "buffer").await;
    let want = "chunk-0\nchunk-1\nchunk-2\n[wasm saw 24 bytes]\n";
    assert_eq!((r.status, r.text().as_str()), (200, want));
    assert!(!r.chunked);
    assert_eq!(
        r.header("content-length"),
        Some(want.len().to_string().as_str())
    );

    // Continue on every piece: each call sees only new data, so the lengths it was handed add up to the body's.
    let r = get_mode(&mut c, "/b/chunked/3", "stream").await;
    let body = r.text();
    assert!(
        body.starts_with("chunk-0\nchunk-1\nchunk-2\n[wasm streamed 24 bytes in "),
        "{body}"
    );

    // A filter that does not ask for the body: the upstream's body and length, untouched.
    let r = get_mode(&mut c, "/b/x", "off").await;
    assert_eq!((r.status, r.text().as_str()), (200, "hello world"));
    assert_eq!(r.header("content-length"), Some("11"));
    assert_eq!(r.header("x-wasm-body"), None);

    // Setting a body within the cap works; over it (64 KiB here) the answer is a 500, not a truncated body.
    let r = t(c.request("GET", "/b/x", "x-mode: grow\r\nx-size: 1000\r\n", b"")).await;
    assert_eq!((r.status, r.body.len()), (200, 1000));
    let mut c2 = t(Client::connect(gw.addr)).await;
    let r = t(c2.request("GET", "/b/x", "x-mode: grow\r\nx-size: 70000\r\n", b"")).await;
    assert_eq!(r.status, 500);
    assert!(
        r.text().contains("too large for wasm plugin wasm_body"),
        "{}",
        r.text()
    );
    // An upstream body over the cap: 500 as well, and the rest of it is not read into memory.
    let mut c3 = t(Client::connect(gw.addr)).await;
    let r = get_mode(&mut c3, "/b/large/1000000", "buffer").await;
    assert_eq!(r.status, 500);
    assert!(r.text().contains("too large"), "{}", r.text());
    // Under the cap, a large body reaches the filter whole (the filter reports the length it buffered; the body is
    // binary, and the filter's UTF-8 round trip changes its bytes, so only the report is compared).
    let r = get_mode(&mut c, "/b/large/60000", "buffer").await;
    assert_eq!(r.status, 200);
    assert!(
        r.body.ends_with(b"[wasm saw 60000 bytes]\n"),
        "{}",
        r.body.len()
    );
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );

    // HEAD, 204 and 304: no body is invented, and the connection stays in step for the next request.
    let r = t(c.request("HEAD", "/b/x", "x-mode: buffer\r\n", b"")).await;
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.header("x-wasm-body"), None);
    for code in [204, 304] {
        let r = get_mode(&mut c, &format!("/b/status/{code}"), "buffer").await;
        assert_eq!((r.status, r.body.len()), (code, 0));
        assert_eq!(r.header("transfer-encoding"), None, "{code}");
        assert_eq!(r.header("x-wasm-body"), None, "{code}");
    }
    let r = get_mode(&mut c, "/b/x", "buffer").await;
    assert_eq!(r.text(), "wasm world[wasm saw 11 bytes]\n");
    drop(gw);
}

#[tokio::test]
async fn a_local_answer_from_the_response_phase_replaces_the_upstreams() {
    let Some(out) = filters() else { return };
    let origin = Origin::start("hello world").await;
    let (gw, a) = start_with(&body_section(&out), None).await;
    let (s, b) = put_route(
        a,
        "1",
        "/b/*",
        r#"{"wasm_body":{"conf":"wasm"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201, "{b}");
    until(gw.addr, "/b/x", 200).await;
    let mut c = t(Client::connect(gw.addr)).await;
    for mode in ["local-headers", "local-body"] {
        for path in ["/b/x", "/b/chunked/2"] {
            let r = get_mode(&mut c, path, mode).await;
            assert_eq!(r.status, 418, "{mode} {path}");
            assert_eq!(r.text(), "replaced by wasm\n", "{mode} {path}");
            assert_eq!(r.header("x-wasm-local"), Some("response phase"), "{mode}");
            assert_eq!(
                r.header("x-origin"),
                None,
                "{mode}: the upstream's headers are gone"
            );
            assert_eq!(r.header("content-length"), Some("17"), "{mode} {path}");
        }
    }
    // The same connection goes on with the upstream's answers.
    let r = get_mode(&mut c, "/b/x", "off").await;
    assert_eq!((r.status, r.text().as_str()), (200, "hello world"));
    drop(gw);
}

#[tokio::test]
async fn filter_metrics_are_in_the_prometheus_exposition() {
    let Some(out) = filters() else { return };
    let origin = Origin::start("wasm-origin").await;
    let port = free_port();
    let (gw, a) = start_with(&wasm_section(&out, &["metrics"]), Some(port)).await;
    let (s, b) = put_route(
        a,
        "1",
        "/m/*",
        r#"{"wasm_metrics":{"conf":"x"}}"#,
        origin.addr,
    )
    .await;
    assert_eq!(s, 201, "{b}");
    until(gw.addr, "/m/x", 200).await;
    let mut c = t(Client::connect(gw.addr)).await;
    for _ in 0..4 {
        assert_eq!(t(c.get("/m/x")).await.status, 200);
    }
    let metrics: SocketAddr = ([127, 0, 0, 1], port).into();
    let text = get_once(metrics, "/apisix/prometheus/metrics").await.text();
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not in:\n{text}"))
            .to_owned()
    };
    // `until` sent at least one request before the four: the counter is 5 or more.
    let count: u64 = line("apisix_wasm_wasm_test_requests{plugin=\"wasm_metrics\"} ")
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a count");
    assert!(count >= 5, "{text}");
    assert!(
        text.contains("# TYPE apisix_wasm_wasm_test_requests counter"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE apisix_wasm_wasm_test_last_status gauge"),
        "{text}"
    );
    assert_eq!(
        line("apisix_wasm_wasm_test_last_status{"),
        "apisix_wasm_wasm_test_last_status{plugin=\"wasm_metrics\"} 200"
    );
    // The histogram: every response had an 11-byte body ("wasm-origin"), in the le="25" bucket, not in le="10".
    assert!(
        text.contains("# TYPE apisix_wasm_wasm_test_body_bytes histogram"),
        "{text}"
    );
    assert_eq!(
        line("apisix_wasm_wasm_test_body_bytes_bucket{plugin=\"wasm_metrics\",le=\"10\"}"),
        "apisix_wasm_wasm_test_body_bytes_bucket{plugin=\"wasm_metrics\",le=\"10\"} 0"
    );
    assert_eq!(
        line("apisix_wasm_wasm_test_body_bytes_count{"),
        format!("apisix_wasm_wasm_test_body_bytes_count{{plugin=\"wasm_metrics\"}} {count}")
    );
    assert_eq!(
        line("apisix_wasm_wasm_test_body_bytes_bucket{plugin=\"wasm_metrics\",le=\"25\"}"),
        format!(
            "apisix_wasm_wasm_test_body_bytes_bucket{{plugin=\"wasm_metrics\",le=\"25\"}} {count}"
        )
    );
    drop(gw);
}
