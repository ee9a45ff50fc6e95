//! Running like a server, through the real binary: SIGHUP re-reads config.yaml (live parts applied, a broken file
//! kept out), SIGUSR1 does not kill, SIGTERM stops at once, one instance per pid file and per port (a pid file
//! left by kill -9 does not block), `sluice test`, `sluice reload | quit | stop` and `sluice import`, and the
//! strict config.yaml messages as the operator sees them.

use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::process::{Sluice, TempDir};
use crate::support::{free_port, Client, Origin};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// `sluice ARGS...` to completion (bounded by the commands' own waits).
fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sluice")
}

/// These tests start and stop several processes: a wider bound than `support::t`'s 10 s for the whole test.
async fn long<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(90), f)
        .await
        .expect("test timed out after 90 s")
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A traditional-role config.yaml (embedded store in `data`, Admin API with `key`) on the given ports.
fn traditional(port: u16, admin_port: u16, key: &str) -> String {
    format!(
        "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_control: false\n  ssl:\n    enable: false\n\
         nginx_config:\n  worker_processes: 1\n\
         deployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n\
         \x20 admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n\
         \x20   admin_key:\n      - name: admin\n        key: {key}\n        role: admin\n\
         plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
         sluice:\n  data_dir: data\n  graceful_shutdown_timeout: 5\n"
    )
}

fn route_yaml(id: &str, uri: &str, origin: SocketAddr) -> String {
    format!(
        "routes:\n  - id: {id}\n    uri: {uri}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{origin}\": 1\n#END\n"
    )
}

/// `sluice start -c DIR/config.yaml` with its log in DIR/sluice.log (read by the tests).
struct Proc {
    child: Child,
    dir: TempDir,
    addr: SocketAddr,
}

impl Proc {
    fn spawn(dir: TempDir, addr: SocketAddr) -> Proc {
        let log = std::fs::File::create(dir.0.join("sluice.log")).expect("log file");
        let child = Command::new(BIN)
            .arg("start")
            .arg("-c")
            .arg(dir.0.join("config.yaml"))
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn sluice");
        Proc { child, dir, addr }
    }

    /// Waits (bounded) until every address accepts; panics with the log if the process exits first.
    async fn ready(&mut self, also: &[SocketAddr]) {
        let end = Instant::now() + Duration::from_secs(10);
        for a in std::iter::once(self.addr).chain(also.iter().copied()) {
            loop {
                if let Ok(Some(st)) = self.child.try_wait() {
                    panic!("sluice exited early ({st}):\n{}", self.log());
                }
                if tokio::net::TcpStream::connect(a).await.is_ok() {
                    break;
                }
                assert!(Instant::now() < end, "{a} not listening:\n{}", self.log());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("sluice.log")).unwrap_or_default()
    }

    /// Waits (bounded) until the log contains `needle`.
    async fn log_has(&self, needle: &str) -> bool {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if self.log().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    fn signal(&self, name: &str) {
        let st = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{name}");
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(Instant::now() < end, "did not exit within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn config(&self) -> String {
        self.dir.0.join("config.yaml").display().to_string()
    }

    /// Rewrites config.yaml atomically.
    fn write_config(&self, text: &str) {
        let tmp = self.dir.0.join("config.yaml.tmp");
        std::fs::write(&tmp, text).expect("write config");
        std::fs::rename(&tmp, self.dir.0.join("config.yaml")).expect("rename config");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A traditional instance serving `/r` from `origin`, Admin API key `key`.
async fn traditional_proc(origin: &Origin, key: &str) -> (Proc, SocketAddr) {
    let dir = TempDir::new("ops");
    let (port, admin_port) = (free_port(), free_port());
    std::fs::write(
        dir.0.join("config.yaml"),
        traditional(port, admin_port, key),
    )
    .expect("config");
    std::fs::write(
        dir.0.join("apisix.yaml"),
        route_yaml("1", "/r", origin.addr),
    )
    .expect("yaml");
    let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
    let mut p = Proc::spawn(dir, ([127, 0, 0, 1], port).into());
    p.ready(&[admin]).await;
    (p, admin)
}

async fn admin_get(admin: SocketAddr, key: &str) -> u16 {
    let mut c = Client::connect(admin).await;
    c.request(
        "GET",
        "/apisix/admin/routes",
        &format!("X-API-KEY: {key}\r\n"),
        b"",
    )
    .await
    .status
}

/// Polls (bounded) until the Admin API answers `want` for `key`.
async fn admin_until(admin: SocketAddr, key: &str, want: u16) -> u16 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let st = match Client::try_connect(admin).await {
            Ok(_) => admin_get(admin, key).await,
            Err(_) => 0,
        };
        if st == want || Instant::now() >= end {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get_status(addr: SocketAddr, path: &str) -> u16 {
    Client::connect(addr).await.get(path).await.status
}

async fn get_until(addr: SocketAddr, path: &str, want: u16) -> u16 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let st = get_status(addr, path).await;
        if st == want || Instant::now() >= end {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_the_admin_key_live_and_keeps_serving() {
    long(async {
        let o = Origin::start("o").await;
        let (mut p, admin) = traditional_proc(&o, "key-one").await;
        assert_eq!(get_status(p.addr, "/r").await, 200);
        // A keep-alive client connected before the reload keeps being served after it.
        let mut kept = Client::connect(p.addr).await;
        assert_eq!(kept.get("/r").await.status, 200);
        let port = p.addr.port();
        p.write_config(&traditional(port, admin.port(), "key-two"));
        p.signal("HUP");
        assert_eq!(admin_until(admin, "key-two", 200).await, 200, "{}", p.log());
        assert_eq!(
            admin_get(admin, "key-one").await,
            401,
            "the old key is gone"
        );
        assert!(p.alive(), "SIGHUP must not end the process");
        assert_eq!(kept.get("/r").await.status, 200);
        assert_eq!(get_status(p.addr, "/r").await, 200);
        assert!(p.log_has("SIGHUP: config.yaml re-read and applied").await);

        // A setting that cannot change live is named as needing a restart; the old value keeps serving.
        let other = free_port();
        p.write_config(&traditional(other, admin.port(), "key-two"));
        p.signal("HUP");
        assert!(
            p.log_has(
                "need a restart to apply (still running with the old values): apisix.node_listen"
            )
            .await,
            "{}",
            p.log()
        );
        assert_eq!(get_status(p.addr, "/r").await, 200);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_broken_config_keeps_the_running_one_and_says_why() {
    long(async {
        let o = Origin::start("o").await;
        let (mut p, admin) = traditional_proc(&o, "key-one").await;
        let broken = traditional(p.addr.port(), admin.port(), "key-two")
            .replace("enable_control", "enable_contrl");
        p.write_config(&broken);
        p.signal("HUP");
        assert!(
            p.log_has("SIGHUP: reload refused, the running configuration is kept")
                .await,
            "{}",
            p.log()
        );
        assert!(
            p.log()
                .contains("unknown key apisix.enable_contrl (did you mean apisix.enable_control?)"),
            "{}",
            p.log()
        );
        assert!(p.alive());
        // Nothing of the broken file applied: the old key still works, the new one does not.
        assert_eq!(admin_get(admin, "key-one").await, 200);
        assert_eq!(admin_get(admin, "key-two").await, 401);
        assert_eq!(get_status(p.addr, "/r").await, 200);
        // `sluice reload` checks the file first and sends nothing.
        let out = run(&["reload", "-c", &p.config()]);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("nothing sent"), "{}", text(&out));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_does_not_kill() {
    long(async {
        let o = Origin::start("o").await;
        let (mut p, _admin) = traditional_proc(&o, "k").await;
        p.signal("USR1");
        // Handled (not the default action, which ends the process): the log says so, and it keeps serving.
        assert!(p.log_has("SIGUSR1 received").await, "{}", p.log());
        assert_eq!(get_status(p.addr, "/r").await, 200);
        assert!(p.alive(), "SIGUSR1 must not end the process");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_at_once_without_waiting_for_requests_in_flight() {
    long(async {
        let o = Origin::start("o").await;
        let yaml = route_yaml("1", "/*", o.addr);
        let mut gw = Sluice::start(&yaml, 1).await;
        let mut c = Client::connect(gw.addr).await;
        // 2 s: well inside the 5 s graceful timeout, so only a fast stop leaves it without a response.
        c.send(b"GET /delay/2000 HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let end = Instant::now() + Duration::from_secs(5);
        while o.in_flight() == 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(o.in_flight(), 1);
        gw.sigterm();
        let st = gw.wait_exit(Duration::from_secs(8)).await;
        assert!(st.success(), "exit status {st}");
        let got = c.read_to_eof().await;
        assert!(
            !got.starts_with(b"HTTP/1.1 200"),
            "a fast stop does not wait for the request in flight: {}",
            String::from_utf8_lossy(&got)
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_is_refused_and_the_first_keeps_serving() {
    long(async {
        let o = Origin::start("o").await;
        let (mut p, admin) = traditional_proc(&o, "k").await;
        // Same config (same pid file): the lock says who runs.
        let out = run(&["start", "-c", &p.config()]);
        assert!(!out.status.success(), "{}", text(&out));
        let pid = p.child.id();
        assert!(
            text(&out).contains(&format!("another Sluice instance (pid {pid}) is running")),
            "{}",
            text(&out)
        );
        // Another directory, same port: the port probe (SO_REUSEPORT would have shared it).
        let other = TempDir::new("ops-other");
        std::fs::write(
            other.0.join("config.yaml"),
            traditional(p.addr.port(), free_port(), "k"),
        )
        .expect("config");
        let out = run(&[
            "start",
            "-c",
            &other.0.join("config.yaml").display().to_string(),
        ]);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains(&format!("{} is already in use", p.addr)),
            "{}",
            text(&out)
        );
        // The refused start leaves no pid in its own pid file.
        let left = std::fs::read_to_string(other.0.join("sluice.pid")).expect("pid file");
        assert_eq!(left, "", "a failed start empties its pid file");
        assert!(p.alive());
        // Every request still reaches the first instance.
        for _ in 0..20 {
            assert_eq!(get_status(p.addr, "/r").await, 200);
        }
        assert_eq!(admin_get(admin, "k").await, 200);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_file_left_by_kill_9_does_not_block_the_next_start() {
    long(async {
        let o = Origin::start("o").await;
        let (mut p, admin) = traditional_proc(&o, "k").await;
        let pid_file = p.dir.0.join("sluice.pid");
        let pid = p.child.id();
        assert_eq!(
            std::fs::read_to_string(&pid_file).expect("pid file").trim(),
            pid.to_string()
        );
        p.signal("KILL");
        p.wait_exit(Duration::from_secs(5)).await;
        assert_eq!(
            std::fs::read_to_string(&pid_file)
                .expect("left behind")
                .trim(),
            pid.to_string()
        );
        let out = run(&["stop", "-c", &p.config()]);
        assert!(!out.status.success());
        assert!(
            text(&out).contains(&format!("is stale (pid {pid} ended without a clean exit)")),
            "{}",
            text(&out)
        );
        let dir = std::mem::replace(&mut p.dir, TempDir::new("moved"));
        let addr = p.addr;
        drop(p);
        let mut q = Proc::spawn(dir, addr);
        q.ready(&[admin]).await;
        assert_eq!(get_status(q.addr, "/r").await, 200);
        let pid_now = std::fs::read_to_string(&pid_file).expect("pid file");
        assert_eq!(pid_now.trim(), q.child.id().to_string());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_quit_and_stop_subcommands() {
    long(async {
        let o = Origin::start("o").await;
        let dir = TempDir::new("ops-cli");
        let (port, admin_port) = (free_port(), free_port());
        std::fs::write(
            dir.0.join("config.yaml"),
            traditional(port, admin_port, "k1"),
        )
        .expect("cfg");
        std::fs::write(dir.0.join("apisix.yaml"), route_yaml("1", "/*", o.addr)).expect("yaml");
        let config = dir.0.join("config.yaml").display().to_string();
        let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();

        // No instance yet: clear errors, exit status 1.
        for cmd in ["reload", "quit", "stop"] {
            let out = run(&[cmd, "-c", &config]);
            assert!(!out.status.success(), "{}", text(&out));
            assert!(
                text(&out).contains("no Sluice instance is running: the pid file")
                    && text(&out).contains("does not exist"),
                "{}",
                text(&out)
            );
        }

        let mut p = Proc::spawn(dir, ([127, 0, 0, 1], port).into());
        p.ready(&[admin]).await;
        p.write_config(&traditional(port, admin_port, "k2"));
        let out = run(&["reload", "-c", &config]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(admin_until(admin, "k2", 200).await, 200, "{}", p.log());

        // quit: the request in flight completes, then the process exits and the command says so.
        let mut c = Client::connect(p.addr).await;
        c.send(b"GET /delay/500 HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let end = Instant::now() + Duration::from_secs(5);
        while o.in_flight() == 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let quit = tokio::task::spawn_blocking({
            let config = config.clone();
            move || run(&["quit", "-c", &config])
        });
        let r = c.read_response(false).await;
        assert_eq!(r.status, 200, "the request in flight completes");
        let out = quit.await.expect("quit");
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("sent SIGQUIT to pid") && text(&out).contains("stopped"));
        assert!(p.wait_exit(Duration::from_secs(5)).await.success());
        // A clean exit empties the pid file.
        let out = run(&["stop", "-c", &config]);
        assert!(
            text(&out).contains("is empty (the last instance exited)"),
            "{}",
            text(&out)
        );

        // stop: at once, even with a slow request in flight.
        let dir = std::mem::replace(&mut p.dir, TempDir::new("moved"));
        drop(p);
        let mut p = Proc::spawn(dir, ([127, 0, 0, 1], port).into());
        p.ready(&[admin]).await;
        let mut c = Client::connect(p.addr).await;
        // 2 s: inside the graceful timeout, so a response would mean stop waited for it.
        c.send(b"GET /delay/2000 HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let end = Instant::now() + Duration::from_secs(5);
        while o.in_flight() == 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let out = tokio::task::spawn_blocking(move || run(&["stop", "-c", &config]))
            .await
            .expect("stop");
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("sent SIGTERM to pid"), "{}", text(&out));
        assert!(p.wait_exit(Duration::from_secs(5)).await.success());
        let got = c.read_to_eof().await;
        assert!(
            !got.starts_with(b"HTTP/1.1 200"),
            "stop does not wait for requests in flight"
        );
    })
    .await
}

/// Writes config.yaml (and apisix.yaml) into a fresh directory and runs `sluice test` on it.
fn sluice_test(config: &str, apisix_yaml: Option<&str>) -> (bool, String) {
    let dir = TempDir::new("ops-test");
    std::fs::write(dir.0.join("config.yaml"), config).expect("config");
    if let Some(y) = apisix_yaml {
        std::fs::write(dir.0.join("apisix.yaml"), y).expect("yaml");
    }
    let out = run(&[
        "test",
        "-c",
        &dir.0.join("config.yaml").display().to_string(),
    ]);
    (out.status.success(), text(&out))
}

const STANDALONE: &str = "apisix:\n  node_listen: 9080\n\
    deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n";

/// `discovery.zookeeper` is checked as `sluice start` reads it; a discovered upstream compiles without nodes.
#[test]
fn sluice_test_checks_the_zookeeper_discovery_section() {
    let routes = "routes:\n  - id: 1\n    uri: /a\n    upstream:\n      type: roundrobin\n\
                  \x20     discovery_type: zookeeper\n      service_name: a.B\n#END\n";
    let zk = |extra: &str| {
        format!("{STANDALONE}discovery:\n  zookeeper:\n    hosts: [\"127.0.0.1:2181\"]\n{extra}")
    };
    let (ok, out) = sluice_test(&zk(""), Some(routes));
    assert!(ok, "{out}");
    assert!(
        out.contains("zookeeper discovery on 127.0.0.1:2181 under /dubbo"),
        "{out}"
    );
    let (ok, out) = sluice_test(&zk("    root: dubbo\n"), Some(routes));
    assert!(!ok, "{out}");
    assert!(
        out.contains("discovery.zookeeper.root: an absolute Zookeeper path"),
        "{out}"
    );
    let (ok, out) = sluice_test(&zk("    sesion_timeout: 3\n"), Some(routes));
    assert!(
        !ok && out.contains("unknown key discovery.zookeeper.sesion_timeout"),
        "{out}"
    );
    // Other registries are APISIX's: accepted with a warning, not read.
    let (ok, out) = sluice_test(
        &format!("{STANDALONE}discovery:\n  nacos:\n    host: [\"http://127.0.0.1:8848\"]\n"),
        Some(routes),
    );
    assert!(ok, "{out}");
}

#[test]
fn sluice_test_checks_config_yaml_and_apisix_yaml() {
    let good_routes = route_yaml("1", "/a", ([127, 0, 0, 1], 1980).into());
    let (ok, out) = sluice_test(STANDALONE, Some(&good_routes));
    assert!(ok, "{out}");
    assert!(out.contains("config.yaml: ok (role data_plane, config_provider yaml, listen 0.0.0.0:9080 0.0.0.0:9443)"), "{out}");
    assert!(out.contains("apisix.yaml: ok (1 routes"), "{out}");
    assert!(out.contains("configuration test is successful"), "{out}");

    // A route whose upstream does not exist: apisix.yaml fails the compile the gateway would run.
    let dangling = "routes:\n  - id: 1\n    uri: /a\n    upstream_id: nope\n#END\n";
    let (ok, out) = sluice_test(STANDALONE, Some(dangling));
    assert!(!ok, "{out}");
    assert!(
        out.contains("apisix.yaml: route 1: failed to fetch upstream info by upstream id [nope]"),
        "{out}"
    );
    assert!(out.contains("configuration test failed"), "{out}");

    // The messages the issue quotes, now each naming the problem.
    let cases = [
        ("apisix:\n  node_lsten: 9080\n", "unknown key apisix.node_lsten (did you mean apisix.node_listen?)"),
        ("deployment:\n  role: tradtional\n", "deployment.role: expected one of traditional, data_plane, control_plane, got the string \"tradtional\""),
        ("apisix:\n  node_listen: 9O80\n", "apisix.node_listen: expected a port number, an {ip, port} map or a list of them, got the string \"9O80\""),
        ("apisix:\n  node_listen: 9080\n   enable_admin: true\n", "YAML syntax error"),
        ("apisix:\n  node_listen:\n    - ip: 127.0.0.1\n    port: 9080\n", "YAML syntax error"),
    ];
    for (cfg, want) in cases {
        let (ok, out) = sluice_test(cfg, None);
        assert!(!ok, "{cfg}: {out}");
        assert!(out.contains(want), "{cfg}: want {want:?} in {out}");
        assert!(!out.contains("untagged enum"), "{out}");
    }
    let (_, out) = sluice_test(
        "apisix:\n  node_listen: 9080\n   enable_admin: true\n",
        None,
    );
    assert!(
        out.contains("line 3"),
        "the syntax error has its line: {out}"
    );

    // An APISIX key Sluice ignores is a warning, not a failure.
    let (ok, out) = sluice_test(
        &format!("{STANDALONE}nginx_config:\n  http:\n    send_timeout: 60s\n"),
        Some(&good_routes),
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("warning: ")
            && out.contains(
                "nginx_config.http.send_timeout is an APISIX setting Sluice does not use"
            ),
        "{out}"
    );
}

#[test]
fn start_refuses_a_config_with_errors_and_names_the_key() {
    let dir = TempDir::new("ops-bad");
    std::fs::write(dir.0.join("config.yaml"), "apisix:\n  node_lsten: 9080\n").expect("cfg");
    let out = run(&[
        "start",
        "-c",
        &dir.0.join("config.yaml").display().to_string(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("unknown key apisix.node_lsten (did you mean apisix.node_listen?)"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_writes_apisix_yaml_through_the_admin_api() {
    long(async {
        let o = Origin::start("o").await;
        let (p, _admin) = traditional_proc(&o, "k").await;
        assert_eq!(get_status(p.addr, "/new").await, 404);
        let file = p.dir.0.join("new.yaml");
        // An upstream by id and a route using it: the upstream is written first.
        std::fs::write(
            &file,
            format!(
                "upstreams:\n  - id: u1\n    nodes:\n      \"{}\": 1\n\
                 routes:\n  - id: 2\n    uri: /new\n    upstream_id: u1\n#END\n",
                o.addr
            ),
        )
        .expect("file");
        let f = file.display().to_string();
        let out = run(&["import", "-c", &p.config(), &f]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("imported 2 resource(s)"),
            "{}",
            text(&out)
        );
        assert_eq!(get_until(p.addr, "/new", 200).await, 200);
        // The seeded route is untouched.
        assert_eq!(get_status(p.addr, "/r").await, 200);

        // A broken file writes nothing.
        std::fs::write(
            &file,
            "routes:\n  - id: 3\n    uri: /broken\n    upstream_id: missing\n#END\n",
        )
        .expect("file");
        let out = run(&["import", "-c", &p.config(), &f]);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("failed to fetch upstream info by upstream id [missing]"),
            "{}",
            text(&out)
        );
        assert_eq!(get_status(p.addr, "/broken").await, 404);
    })
    .await
}

#[test]
fn import_in_standalone_mode_explains_there_is_nothing_to_import_into() {
    let dir = TempDir::new("ops-imp");
    std::fs::write(dir.0.join("config.yaml"), STANDALONE).expect("cfg");
    let out = run(&[
        "import",
        "-c",
        &dir.0.join("config.yaml").display().to_string(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("selects standalone mode"),
        "{}",
        text(&out)
    );
}
