//! The access log and the error log through the real binary: a line for every outcome (proxied 200, unmatched 404,
//! malformed 400, header timeout 408, oversized head 431, dead upstream 502), a custom `access_log_format`, the
//! SIGUSR1 reopen after a logrotate-style rename, lines flushed at shutdown, prometheus in a global rule counting
//! an unmatched request with an empty route label, and the error log's level and colour rules.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use crate::support::process::{Mock, Sluice, TempDir};
use crate::support::{free_port, refused_addr, Client};

/// Writes config.yaml (access log in the temp dir, `nginx_http` appended under `nginx_config.http`) and starts
/// the gateway.
async fn start(
    apisix_yaml: &str,
    nginx_http: &str,
    metrics_port: Option<u16>,
) -> (Sluice, SocketAddr) {
    let dir = TempDir::new("logs");
    std::fs::write(dir.0.join("apisix.yaml"), apisix_yaml).expect("write apisix.yaml");
    let port = free_port();
    let prom = match metrics_port {
        Some(p) => format!("    export_addr:\n      ip: 127.0.0.1\n      port: {p}\n"),
        None => "    enable_export_server: false\n".into(),
    };
    let cfg = format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: false\n  ssl:\n    enable: false\n\
         nginx_config:\n  worker_processes: 1\n  http:\n    access_log: {log}\n{nginx_http}\
         deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
         plugin_attr:\n  prometheus:\n{prom}\
         sluice:\n  client_header_timeout: 1\n  graceful_shutdown_timeout: 5\n",
        log = dir.0.join("access.log").display()
    );
    std::fs::write(dir.0.join("config.yaml"), cfg).expect("write config.yaml");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut also = Vec::new();
    if let Some(p) = metrics_port {
        also.push(([127, 0, 0, 1], p).into());
    }
    (Sluice::spawn_in(dir, addr, &also).await, addr)
}

fn read(p: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned()
}

/// Waits (bounded) until `p` holds at least `n` lines; returns them.
async fn lines(p: &Path, n: usize) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let text = read(p);
        let l: Vec<String> = text.lines().map(str::to_owned).collect();
        if l.len() >= n {
            return l;
        }
        assert!(
            Instant::now() < end,
            "{} has {} lines, waited for {n}:\n{text}",
            p.display(),
            l.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends raw bytes on a fresh connection and reads until the gateway closes it (bounded).
async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut c = Client::connect(addr).await;
    c.send(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET path` with these header lines (each ending in CRLF), on a kept-alive connection.
async fn get(c: &mut Client, path: &str, headers: &str) -> crate::support::client::Response {
    c.send(format!("GET {path} HTTP/1.1\r\n{headers}\r\n").as_bytes())
        .await;
    c.read_response(false).await
}

fn kill(sig: &str, pid: u32) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_has_a_line_for_every_outcome() {
    let mock = Mock::start(4).await;
    let dead = refused_addr();
    let yaml = format!(
        "routes:\n  - id: ok\n    uri: /ok\n    upstream:\n      nodes:\n        \"{}\": 1\n      type: roundrobin\n\
         \x20 - id: dead\n    uri: /dead\n    upstream:\n      nodes:\n        \"{dead}\": 1\n      type: roundrobin\n#END\n",
        mock.addr
    );
    let (gw, addr) = start(&yaml, "", None).await;
    let log = gw.dir.0.join("access.log");

    let mut c = Client::connect(addr).await;
    let r = get(&mut c, "/ok?a=1", "Host: ok.test\r\nUser-Agent: t/1\r\n").await;
    assert_eq!(r.status, 200);
    assert_eq!(c.get("/nope").await.status, 404);
    assert_eq!(c.get("/dead").await.status, 502);
    let bad = raw(
        addr,
        b"GET /bad HTTP/1.1\r\nHost: a\r\nno colon here\r\n\r\n",
    )
    .await;
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    let big = format!(
        "GET /big HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40 * 1024)
    );
    let big = raw(addr, big.as_bytes()).await;
    assert!(big.starts_with("HTTP/1.1 431"), "{big}");
    // Half a head, then silence: client_header_timeout (1 s) ends it.
    let slow = raw(addr, b"GET /slow HTTP/1.1\r\nHost: a\r\n").await;
    assert!(!slow.starts_with("HTTP/1.1 2"), "{slow}");

    let l = lines(&log, 6).await;
    let find = |pat: &str| {
        l.iter()
            .find(|s| s.contains(pat))
            .unwrap_or_else(|| panic!("no line with {pat:?} in\n{}", l.join("\n")))
            .clone()
    };
    let ok = find("\"GET /ok?a=1 HTTP/1.1\" 200 ");
    assert!(ok.starts_with("127.0.0.1 - - ["), "{ok}");
    assert!(
        ok.contains(&format!(" \"-\" \"t/1\" {} 200 ", mock.addr)),
        "{ok}"
    );
    assert!(ok.ends_with(" \"http://ok.test/ok?a=1\""), "{ok}");
    assert!(ok.contains(" ok.test \"GET"), "{ok}");
    let nf = find("\"GET /nope HTTP/1.1\" 404 ");
    assert!(
        nf.contains(" - - - \"http://"),
        "unproxied: no upstream: {nf}"
    );
    let d = find("\"GET /dead HTTP/1.1\" 502 ");
    assert!(d.contains(&format!(" {dead} 502 ")), "{d}");
    let bad_line = l.iter().find(|s| s.contains(" 400 ")).expect("a 400 line");
    assert!(bad_line.contains(" \"-\" 400 "), "{bad_line}");
    let big_line = l.iter().find(|s| s.contains(" 431 ")).expect("a 431 line");
    assert!(big_line.contains(" \"-\" 431 "), "{big_line}");
    let slow_line = l.iter().find(|s| s.contains(" 408 ")).expect("a 408 line");
    assert!(slow_line.contains(" \"-\" 408 "), "{slow_line}");
    assert_eq!(l.len(), 6, "one line per request:\n{}", l.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_format_reopen_on_usr1_and_flush_at_shutdown() {
    let mock = Mock::start(4).await;
    let yaml = format!(
        "routes:\n  - uri: /a\n    upstream:\n      nodes:\n        \"{}\": 1\n      type: roundrobin\n#END\n",
        mock.addr
    );
    let fmt = "    access_log_format: '{\"m\":\"$request_method\",\"u\":\"$uri\",\"s\":$status,\"t\":\"$http_x_tag\"}'\n    access_log_format_escape: json\n";
    let (mut gw, addr) = start(&yaml, fmt, None).await;
    let log = gw.dir.0.join("access.log");
    let rotated = gw.dir.0.join("access.log.1");

    let mut c = Client::connect(addr).await;
    let r = get(&mut c, "/a", "Host: h\r\nX-Tag: one\"q\r\n").await;
    assert_eq!(r.status, 200);
    let l = lines(&log, 1).await;
    assert_eq!(l, vec![r#"{"m":"GET","u":"/a","s":200,"t":"one\"q"}"#]);
    let v: serde_json::Value = serde_json::from_str(&l[0]).expect("a JSON line");
    assert_eq!(v["t"], "one\"q");

    // logrotate: rename, then USR1. Lines after the signal go to a new file at the old path.
    std::fs::rename(&log, &rotated).expect("rename");
    kill("USR1", gw.pid());
    let end = Instant::now() + Duration::from_secs(15);
    while !log.exists() {
        assert!(Instant::now() < end, "no new access.log after SIGUSR1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = get(&mut c, "/a", "Host: h\r\nX-Tag: two\r\n").await;
    assert_eq!(r.status, 200);
    let l = lines(&log, 1).await;
    assert_eq!(l, vec![r#"{"m":"GET","u":"/a","s":200,"t":"two"}"#]);
    assert_eq!(
        read(&rotated).lines().count(),
        1,
        "the rotated file keeps the old line"
    );

    // A line logged just before a graceful stop (SIGQUIT) is written by the time the process exits.
    let r = get(&mut c, "/a", "Host: h\r\nX-Tag: three\r\n").await;
    assert_eq!(r.status, 200);
    drop(c);
    gw.signal("QUIT");
    let st = gw.wait_exit(Duration::from_secs(20)).await;
    assert!(st.success(), "{st:?}");
    let text = read(&log);
    assert!(
        text.contains(r#""t":"three""#),
        "flushed at shutdown:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_global_rule_counts_an_unmatched_request_once() {
    let mock = Mock::start(4).await;
    let yaml = format!(
        "routes:\n  - id: r1\n    uri: /a\n    upstream:\n      nodes:\n        \"{}\": 1\n      type: roundrobin\n\
         global_rules:\n  - id: g1\n    plugins:\n      prometheus: {{}}\n#END\n",
        mock.addr
    );
    let mport = free_port();
    let (gw, addr) = start(&yaml, "", Some(mport)).await;
    let mut c = Client::connect(addr).await;
    let r = c.get("/nowhere").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.text(), "{\"error_msg\":\"404 Route Not Found\"}\n");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(c.get("/a").await.status, 200);

    // The log phase runs after the response went out: poll (bounded) until both requests are counted.
    let want = "apisix_http_status{code=\"404\",route=\"\",matched_uri=\"\",matched_host=\"\",service=\"\",consumer=\"\",node=\"\"} 1";
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let m = Client::connect(([127, 0, 0, 1], mport).into())
            .await
            .get("/apisix/prometheus/metrics")
            .await
            .text();
        let counted = m.contains("apisix_http_requests_total 2");
        if counted || Instant::now() > end {
            assert!(m.lines().any(|l| l == want), "{want} missing in\n{m}");
            assert!(
                m.contains("apisix_http_status{code=\"200\",route=\"r1\","),
                "{m}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The unmatched request is in the access log too.
    let l = lines(&gw.dir.0.join("access.log"), 2).await;
    assert!(
        l.iter()
            .any(|s| s.contains("\"GET /nowhere HTTP/1.1\" 404 ")),
        "{l:?}"
    );
}

/// `sluice start` with no SLUICE_LOG/RUST_LOG, stderr piped (not a terminal).
fn spawn_plain(dir: &TempDir) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("start")
        .arg("-c")
        .arg(dir.0.join("config.yaml"))
        .env_remove("SLUICE_LOG")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice")
}

fn plain_config(dir: &TempDir, port: u16, nginx: &str) {
    let cfg = format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: false\n  ssl:\n    enable: false\n\
         nginx_config:\n  worker_processes: 1\n{nginx}  http:\n    enable_access_log: false\n\
         deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
         plugin_attr:\n  prometheus:\n    enable_export_server: false\n"
    );
    std::fs::write(dir.0.join("config.yaml"), cfg).expect("write config.yaml");
}

async fn until_listening(addr: SocketAddr) {
    let end = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < end, "not listening");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn term_and_wait(child: &mut std::process::Child) -> String {
    kill("TERM", child.id());
    let end = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("try_wait").is_none() {
        assert!(Instant::now() < end, "did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut err = String::new();
    if let Some(mut s) = child.stderr.take() {
        use std::io::Read;
        let _ = s.read_to_string(&mut err);
    }
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_log_level_from_config_and_no_colour_in_a_pipe() {
    let dir = TempDir::new("errlog-pipe");
    std::fs::write(dir.0.join("apisix.yaml"), "routes: []\n#END\n").expect("write apisix.yaml");
    let port = free_port();
    plain_config(&dir, port, "  error_log_level: info\n");
    let mut child = spawn_plain(&dir);
    until_listening(([127, 0, 0, 1], port).into()).await;
    let err = term_and_wait(&mut child).await;
    assert!(
        err.contains("sluice started"),
        "info enabled by config:\n{err}"
    );
    assert!(!err.contains('\x1b'), "colour codes in a pipe:\n{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_log_file_has_no_colour_and_honours_the_level() {
    let dir = TempDir::new("errlog-file");
    let dead = refused_addr();
    std::fs::write(
        dir.0.join("apisix.yaml"),
        format!("routes:\n  - uri: /dead\n    upstream:\n      nodes:\n        \"{dead}\": 1\n      type: roundrobin\n#END\n"),
    )
    .expect("write apisix.yaml");
    let port = free_port();
    let path = dir.0.join("logs-e/error.log");
    plain_config(
        &dir,
        port,
        &format!("  error_log: {}\n  error_log_level: warn\n", path.display()),
    );
    let mut child = spawn_plain(&dir);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    until_listening(addr).await;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.get("/dead").await.status, 502);
    drop(c);
    let stderr = term_and_wait(&mut child).await;
    let text = read(&path);
    assert!(
        text.contains("upstream attempt failed"),
        "warn logged:\n{text}"
    );
    assert!(
        !text.contains("sluice started"),
        "info filtered out at warn:\n{text}"
    );
    assert!(!text.contains('\x1b'), "colour codes in a file:\n{text:?}");
    assert!(
        !stderr.contains("upstream attempt failed"),
        "went to the file, not stderr:\n{stderr}"
    );
}
