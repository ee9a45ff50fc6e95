//! Dubbo providers discovered from Zookeeper, through the real binary (issue 13): a real Zookeeper (Debian's
//! `zookeeper` package, run as `ZooKeeperServerMain` on a 127.0.0.1 ephemeral port with a temp data dir), real
//! Apache Dubbo 3.3.5 Java providers (`sluice-proxy/tools/dubbo-java-peer`) that register themselves in it, and
//! `sluice start` with `discovery.zookeeper` and routes whose upstream is `discovery_type: zookeeper`.
//!
//! Covered: a provider found in Zookeeper answers, one that starts later gets traffic, version/group filtering,
//! unknown interfaces and discovery types (503), garbage entries skipped, a provider killed with SIGKILL under
//! load (no hung client, no error with `retries`, its entry vanishes, it comes back), and a Zookeeper outage (the
//! last nodes keep serving, changes after it are picked up); Dubbo 3 application-level registration (instances,
//! mapping and metadata only) found, filtered and followed the same way. Skipped with a message when Zookeeper,
//! java or mvn is missing (a failure under CI=true).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::support::process::{Sluice, TempDir};
use crate::support::{free_port, skip_unless_ci, Client};

#[path = "../../../sluice-proxy/tools/dubbo-java-peer/peer_build.rs"]
mod peer_build;

const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
const DEMO: &str = "org.sluice.peer.DemoService";

fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// Zookeeper, standalone, on the same port and data dir across restarts; killed on drop.
struct Zk {
    child: Option<Child>,
    dir: TempDir,
    port: u16,
}

impl Zk {
    fn available() -> bool {
        if Path::new(ZK_JAR).exists() {
            return true;
        }
        skip_unless_ci("Zookeeper is not installed (Debian: zookeeper)");
        false
    }

    async fn start() -> Zk {
        let dir = TempDir::new("zk");
        let port = free_port();
        // tickTime 500: sessions may be as short as 1 s, so a killed provider's entry goes within seconds.
        std::fs::write(
            dir.0.join("zoo.cfg"),
            format!(
                "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\nmaxClientCnxns=0\n",
                dir.0.join("data").display()
            ),
        )
        .expect("zoo.cfg");
        let mut zk = Zk {
            child: None,
            dir,
            port,
        };
        zk.restart().await;
        zk
    }

    fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts it (again); waits (bounded) until it answers `srvr`.
    async fn restart(&mut self) {
        let child = Command::new("java")
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-cp"])
            .arg(format!("/etc/zookeeper/conf:{ZK_JAR}"))
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(self.dir.0.join("zoo.cfg"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn zookeeper");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut out = Vec::new();
                let ok = tokio::time::timeout(Duration::from_secs(2), async {
                    s.write_all(b"srvr").await.ok()?;
                    s.read_to_end(&mut out).await.ok()
                })
                .await;
                if matches!(ok, Ok(Some(_))) && String::from_utf8_lossy(&out).contains("Mode:") {
                    return;
                }
            }
            assert!(Instant::now() < end, "zookeeper not serving after 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL: Zookeeper vanishes, as in a crash.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn client(&self) -> zookeeper_client::Client {
        tokio::time::timeout(
            Duration::from_secs(20),
            zookeeper_client::Client::connect(&self.connect_string()),
        )
        .await
        .expect("zookeeper connect timed out")
        .expect("zookeeper connect")
    }

    /// The provider entries of `iface`, decoded enough to read the port of each.
    async fn providers(&self, iface: &str) -> Vec<String> {
        let c = self.client().await;
        match c.list_children(&format!("/dubbo/{iface}/providers")).await {
            Ok(l) => l,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => panic!("listing providers: {e}"),
        }
    }
}

impl Drop for Zk {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Java Dubbo provider registered in Zookeeper (both services, `version`, `group`); killed on drop.
struct Provider {
    child: Child,
    port: u16,
    _stdin: ChildStdin,
}

fn classpath() -> Option<String> {
    static CP: OnceLock<Option<String>> = OnceLock::new();
    CP.get_or_init(|| {
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-proxy/tools/dubbo-java-peer");
        peer_build::classpath(&src, &target_dir(), skip_unless_ci)
    })
    .clone()
}

impl Provider {
    /// Starts one on `port` (a free one when `None`) and waits until it is registered.
    fn start(zk: &Zk, port: Option<u16>, version: &str, group: Option<&str>) -> Provider {
        Provider::start_with(zk, port, version, group, &[])
    }

    /// Registered as Dubbo 3 application-level discovery does only (`register-mode=instance`), as `app`, its
    /// metadata in Zookeeper (`metadata-type=remote`).
    fn start_instance(zk: &Zk, app: &str, version: &str, group: Option<&str>) -> Provider {
        let app = format!("-Dapp={app}");
        Provider::start_with(
            zk,
            None,
            version,
            group,
            &["-Dregister.mode=instance", &app],
        )
    }

    /// As [`Provider::start_instance`], its metadata served by its own MetadataService only (Dubbo's default
    /// `metadata-type=local`).
    fn start_instance_local(zk: &Zk, app: &str, version: &str) -> Provider {
        let app = format!("-Dapp={app}");
        Provider::start_with(
            zk,
            None,
            version,
            None,
            &["-Dregister.mode=instance", "-Dmetadata.type=local", &app],
        )
    }

    fn start_with(
        zk: &Zk,
        port: Option<u16>,
        version: &str,
        group: Option<&str>,
        extra: &[&str],
    ) -> Provider {
        let cp = classpath().expect("classpath (checked by the caller)");
        // [::1]: Dubbo refuses a 127.x bind (it would listen on every address); it registers dubbo://[::1]:port.
        let port = port.unwrap_or_else(|| {
            TcpListener::bind("[::1]:0")
                .expect("IPv6 loopback")
                .local_addr()
                .unwrap()
                .port()
        });
        let mut child = Command::new("java")
            .args([
                "-Xss512k",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg(format!("-Dport={port}"))
            .arg("-Dhost=::1")
            .arg(format!("-Dregistry=zookeeper://{}", zk.connect_string()))
            // Its entry vanishes 2 s after it dies.
            .arg("-Dregistry.session=2000")
            .arg(format!("-Dversion={version}"))
            .arg(format!("-Dgroup={}", group.unwrap_or("")))
            .arg("-Dexit.with.stdin=true")
            .args(extra)
            .args(["-cp", &cp, "org.sluice.peer.Provider"])
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
        Provider {
            child,
            port,
            _stdin: stdin,
        }
    }

    /// SIGKILL: no deregistration, its ephemeral entry goes with its session.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ready() -> bool {
    Zk::available() && TcpListener::bind("[::1]:0").is_ok() && classpath().is_some()
}

/// A dubbo-proxy route to DemoService.hello (`version`, `group`) over a discovered upstream asking for the same.
fn route(
    id: &str,
    discovery_type: &str,
    service: &str,
    version: &str,
    group: Option<&str>,
    extra: &str,
) -> String {
    let (plugin_group, arg_group) = match group {
        Some(g) => (format!("        group: {g}\n"), format!(", group: {g}")),
        None => (String::new(), String::new()),
    };
    format!(
        "  - id: {id}\n    uri: /{id}\n    timeout: {{connect: 1, send: 5, read: 5}}\n    plugins:\n      dubbo-proxy:\n\
         \x20       service_name: {DEMO}\n        service_version: {version}\n        method: hello\n{plugin_group}{extra}\
         \x20   upstream:\n      type: roundrobin\n      discovery_type: {discovery_type}\n      service_name: {service}\n\
         \x20     discovery_args: {{version: {version}{arg_group}}}\n"
    )
}

/// `sluice start` (standalone: apisix.yaml) with `discovery.zookeeper` on `zk`.
async fn sluice(zk: &Zk, routes: &str, session_timeout: f64) -> Sluice {
    let dir = TempDir::new("zkgw");
    let port = free_port();
    std::fs::write(
        dir.0.join("apisix.yaml"),
        format!("routes:\n{routes}#END\n"),
    )
    .expect("apisix.yaml");
    std::fs::write(
        dir.0.join("config.yaml"),
        format!(
            "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: false\n  ssl:\n    enable: false\n\
             nginx_config:\n  worker_processes: 2\n  http:\n    access_log: {log}\n\
             deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
             plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
             discovery:\n  zookeeper:\n    hosts: [\"{zk}\"]\n    session_timeout: {session_timeout}\n    connect_timeout: 1\n\
             sluice:\n  config_poll_interval: 0.1\n",
            log = dir.0.join("access.log").display(),
            zk = zk.connect_string(),
        ),
    )
    .expect("config.yaml");
    Sluice::spawn_in(dir, ([127, 0, 0, 1], port).into(), &[]).await
}

/// One request on a fresh connection: status and the answering provider's port (`x-provider-port`).
async fn call(gw: SocketAddr, path: &str) -> (u16, Option<u16>) {
    let r = tokio::time::timeout(Duration::from_secs(15), async {
        let mut c = Client::connect(gw).await;
        c.get(path).await
    })
    .await
    .expect("request hung for 15 s");
    (
        r.status,
        r.header("x-provider-port").and_then(|p| p.parse().ok()),
    )
}

/// Waits (bounded) until `path` answers 200 from `port`; returns how long it took.
async fn wait_served_by(gw: SocketAddr, path: &str, port: u16, within: Duration) -> Duration {
    let t0 = Instant::now();
    let mut last = (0, None);
    while t0.elapsed() < within {
        last = call(gw, path).await;
        if last == (200, Some(port)) {
            return t0.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path} not served by provider {port} within {within:?}; last answer {last:?}");
}

/// Status (and provider) counts of `n` requests.
async fn tally(gw: SocketAddr, path: &str, n: usize) -> HashMap<(u16, Option<u16>), usize> {
    let mut m = HashMap::new();
    for _ in 0..n {
        *m.entry(call(gw, path).await).or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_found_in_zookeeper_answer_and_follow_it() {
    if !ready() {
        return;
    }
    let zk = Zk::start().await;
    let routes = [
        route("v1", "zookeeper", DEMO, "1.0.0", None, ""),
        route("v2g", "zookeeper", DEMO, "2.0.0", Some("g2"), ""),
        route(
            "gone",
            "zookeeper",
            "org.nothing.Missing",
            "1.0.0",
            None,
            "",
        ),
        route("other", "eureka", DEMO, "1.0.0", None, ""),
        route("odd", "zookeeper", DEMO, "7.0.0", None, ""),
    ]
    .concat();
    let mut a = Provider::start(&zk, None, "1.0.0", None);
    let gw = sluice(&zk, &routes, 10.0).await;
    wait_served_by(gw.addr, "/v1", a.port, Duration::from_secs(20)).await;
    // Nothing registered for these: APISIX's 503 (no valid upstream node / discovery uninitialized).
    assert_eq!(call(gw.addr, "/v2g").await.0, 503);
    assert_eq!(call(gw.addr, "/gone").await.0, 503);
    assert_eq!(call(gw.addr, "/other").await.0, 503);

    // A second provider that starts later gets traffic, the first keeps its share.
    let mut b = Provider::start(&zk, None, "1.0.0", None);
    wait_served_by(gw.addr, "/v1", b.port, Duration::from_secs(20)).await;
    let t = tally(gw.addr, "/v1", 20).await;
    assert_eq!(
        t.values().sum::<usize>(),
        t[&(200, Some(a.port))] + t[&(200, Some(b.port))],
        "{t:?}"
    );
    assert!(
        t[&(200, Some(a.port))] >= 5 && t[&(200, Some(b.port))] >= 5,
        "{t:?}"
    );

    // Version and group pick the right provider: /v2g only the 2.0.0 / g2 one, /v1 never it.
    let c = Provider::start(&zk, None, "2.0.0", Some("g2"));
    wait_served_by(gw.addr, "/v2g", c.port, Duration::from_secs(20)).await;
    let t = tally(gw.addr, "/v2g", 6).await;
    assert_eq!(t.get(&(200, Some(c.port))), Some(&6), "{t:?}");
    let t = tally(gw.addr, "/v1", 12).await;
    assert!(!t.contains_key(&(200, Some(c.port))), "{t:?}");
    assert_eq!(t.values().sum::<usize>(), 12);
    assert!(t.keys().all(|k| k.0 == 200), "{t:?}");

    // Hostile entries (Zookeeper is trusted, but a broken writer must not break the gateway): skipped with a
    // log line; the good providers keep answering. An entry naming another address is just a node.
    let zc = zk.client().await;
    let base = format!("/dubbo/{DEMO}/providers");
    let huge = format!("dubbo%3A%2F%2F127.0.0.1%3A1%2Fx%3F{}", "a".repeat(100_000));
    let odd = "dubbo%3A%2F%2F192.0.2.1%3A20880%2Forg.sluice.peer.DemoService%3Fversion%3D7.0.0";
    let opts =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for name in [
        "not a url",
        "dubbo%3A%2F%2F127.0.0.1%3A99999%2Fx%3Fversion%3D1.0.0",
        "dubbo%3A%2F%2F127.0.0.1%2Fx%3Fversion%3D1.0.0",
        "dubbo%3A%2F%2Fname.invalid%3A20880%2Fx%3Fversion%3D1.0.0",
        "%FF%FE%00",
        huge.as_str(),
        odd,
    ] {
        zc.create(&format!("{base}/{name}"), b"", &opts)
            .await
            .unwrap_or_else(|e| panic!("create {name:.40}: {e}"));
    }
    // The odd entry is /odd's only provider: tried (it cannot be reached from here: 502 or 504), not refused.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let s = call(gw.addr, "/odd").await.0;
        if s == 502 || s == 504 {
            break;
        }
        assert!(Instant::now() < end, "/odd still {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = tally(gw.addr, "/v1", 10).await;
    assert!(
        t.keys()
            .all(|k| k.0 == 200 && (k.1 == Some(a.port) || k.1 == Some(b.port))),
        "{t:?}"
    );

    // Providers that die leave with their Zookeeper session (2 s here), and with them the nodes: once both 1.0.0
    // providers are gone, /v1 answers 503 (no node), not 502 (a dead node still tried).
    a.kill();
    b.kill();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, _) = call(gw.addr, "/v1").await;
        if s == 503 {
            break;
        }
        assert!(
            Instant::now() < end,
            "/v1 still {s} after its providers died"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = zk.providers(DEMO).await;
    for p in [a.port, b.port] {
        assert!(
            !left.iter().any(|e| e.contains(&format!("%3A{p}%2F"))),
            "{p} still registered"
        );
    }
    // The 2.0.0 provider is untouched.
    assert_eq!(call(gw.addr, "/v2g").await, (200, Some(c.port)));
    drop(zc);
    drop(c);
}

/// Dubbo 3 application-level discovery: providers that register only their instance (`register-mode=instance`,
/// metadata in Zookeeper, or kept by the instance) are found through `/dubbo/mapping/{interface}` and
/// `/services/{application}`, filtered by the version and group of their metadata, and followed as they come and
/// go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_level_providers_are_found_filtered_and_followed() {
    if !ready() {
        return;
    }
    let zk = Zk::start().await;
    let routes = [
        route("v1", "zookeeper", DEMO, "1.0.0", None, ""),
        route("v2g", "zookeeper", DEMO, "2.0.0", Some("g2"), ""),
        route("v3", "zookeeper", DEMO, "3.0.0", None, ""),
    ]
    .concat();
    let mut a = Provider::start_instance(&zk, "app-a", "1.0.0", None);
    // Nothing at interface level: only the application-level nodes can name it.
    assert!(zk.providers(DEMO).await.is_empty());
    let gw = sluice(&zk, &routes, 10.0).await;
    wait_served_by(gw.addr, "/v1", a.port, Duration::from_secs(20)).await;
    assert_eq!(call(gw.addr, "/v2g").await.0, 503);

    // Another application serving the same interface, 2.0.0 in group g2 (the mapping now names both): only /v2g
    // goes there.
    let b = Provider::start_instance(&zk, "app-b", "2.0.0", Some("g2"));
    wait_served_by(gw.addr, "/v2g", b.port, Duration::from_secs(20)).await;
    let t = tally(gw.addr, "/v1", 8).await;
    assert_eq!(t.get(&(200, Some(a.port))), Some(&8), "{t:?}");
    let t = tally(gw.addr, "/v2g", 4).await;
    assert_eq!(t.get(&(200, Some(b.port))), Some(&4), "{t:?}");

    // A second instance of app-a gets traffic as it registers; the first leaves when killed (its ephemeral
    // instance node goes with its 2 s session).
    let c = Provider::start_instance(&zk, "app-a", "1.0.0", None);
    wait_served_by(gw.addr, "/v1", c.port, Duration::from_secs(20)).await;
    let t = tally(gw.addr, "/v1", 20).await;
    assert!(
        t[&(200, Some(a.port))] >= 5 && t[&(200, Some(c.port))] >= 5,
        "{t:?}"
    );
    a.kill();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let t = tally(gw.addr, "/v1", 4).await;
        if t.get(&(200, Some(c.port))) == Some(&4) {
            break;
        }
        assert!(Instant::now() < end, "/v1 still not only {}: {t:?}", c.port);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(zk.providers(DEMO).await.is_empty());

    // Metadata kept by the instance (no /dubbo/metadata/app-l node): asked from its MetadataService.
    assert_eq!(call(gw.addr, "/v3").await.0, 503);
    let d = Provider::start_instance_local(&zk, "app-l", "3.0.0");
    wait_served_by(gw.addr, "/v3", d.port, Duration::from_secs(20)).await;
    let zc = zk.client().await;
    let remote = zc.list_children("/dubbo/metadata/app-l").await;
    assert!(
        matches!(&remote, Err(zookeeper_client::Error::NoNode))
            || remote.as_ref().is_ok_and(Vec::is_empty),
        "{remote:?}"
    );
    let t = tally(gw.addr, "/v1", 4).await;
    assert_eq!(t.get(&(200, Some(c.port))), Some(&4), "{t:?}");
    drop(zc);
    drop(b);
    drop(c);
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_killed_mid_load_fails_over_and_comes_back() {
    if !ready() {
        return;
    }
    let zk = Zk::start().await;
    let extra = "        retries: 2\n";
    let routes = route("v1", "zookeeper", DEMO, "1.0.0", None, extra);
    let mut a = Provider::start(&zk, None, "1.0.0", None);
    let b = Provider::start(&zk, None, "1.0.0", None);
    let a_port = a.port;
    let gw = sluice(&zk, &routes, 10.0).await;
    wait_served_by(gw.addr, "/v1", a.port, Duration::from_secs(20)).await;
    wait_served_by(gw.addr, "/v1", b.port, Duration::from_secs(20)).await;

    // Load: 8 keep-alive clients until told to stop; every answer counted, none may hang (15 s bound each).
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, bad, by_a) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut load = Vec::new();
    for _ in 0..8 {
        let (stop, ok, bad, by_a) = (stop.clone(), ok.clone(), bad.clone(), by_a.clone());
        let addr = gw.addr;
        load.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            while !stop.load(Ordering::Relaxed) {
                let r = tokio::time::timeout(Duration::from_secs(15), c.get("/v1"))
                    .await
                    .expect("a request hung for 15 s");
                if r.status == 200 {
                    ok.fetch_add(1, Ordering::Relaxed);
                    if r.header("x-provider-port") == Some(&a_port.to_string()) {
                        by_a.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    bad.fetch_add(1, Ordering::Relaxed);
                    eprintln!("during the kill: {} {}", r.status, r.text());
                }
                if r.closes() {
                    c = Client::connect(addr).await;
                }
            }
        }));
    }
    let wait_ok = |n: u64| {
        let ok = ok.clone();
        async move {
            let end = Instant::now() + Duration::from_secs(60);
            while ok.load(Ordering::Relaxed) < n {
                assert!(
                    Instant::now() < end,
                    "load stalled at {} answers",
                    ok.load(Ordering::Relaxed)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_ok(200).await;
    assert!(
        by_a.load(Ordering::Relaxed) > 0,
        "provider A had no share before the kill"
    );
    a.kill();
    let at_kill = ok.load(Ordering::Relaxed);
    // Traffic goes on on the survivor.
    wait_ok(at_kill + 300).await;
    // The dead provider's ephemeral entry goes with its session (2 s), and discovery drops it.
    let end = Instant::now() + Duration::from_secs(30);
    while zk.providers(DEMO).await.len() != 1 {
        assert!(
            Instant::now() < end,
            "the killed provider's entry is still in Zookeeper"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = ok.load(Ordering::Relaxed);
    wait_ok(after + 200).await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.expect("load task");
    }
    let (ok_n, bad_n) = (ok.load(Ordering::Relaxed), bad.load(Ordering::Relaxed));
    eprintln!("kill mid-load: {ok_n} answered, {bad_n} failed");
    // With `retries` (the calls are idempotent), a call cut by the kill goes to the other provider: no error.
    assert_eq!(bad_n, 0, "{bad_n} of {} requests failed", ok_n + bad_n);
    // Every answer is the survivor's (that the dead node also left the node list: the first test's 503).
    let t = tally(gw.addr, "/v1", 20).await;
    assert_eq!(t.get(&(200, Some(b.port))), Some(&20), "{t:?}");

    // The provider restarted (same port) registers again and gets traffic again.
    let _a2 = Provider::start(&zk, Some(a_port), "1.0.0", None);
    wait_served_by(gw.addr, "/v1", a_port, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_outage_keeps_the_last_nodes_and_resyncs() {
    if !ready() {
        return;
    }
    let mut zk = Zk::start().await;
    let routes = route("v1", "zookeeper", DEMO, "1.0.0", None, "");
    let mut a = Provider::start(&zk, None, "1.0.0", None);
    let mut c = Provider::start(&zk, None, "1.0.0", None);
    // A short session: the outage below outlives it, so the gateway's reconnect needs a new session.
    let gw = sluice(&zk, &routes, 2.0).await;
    wait_served_by(gw.addr, "/v1", a.port, Duration::from_secs(20)).await;
    wait_served_by(gw.addr, "/v1", c.port, Duration::from_secs(20)).await;

    zk.kill();
    // Zookeeper down: the last known nodes keep serving, for longer than the session timeout; one of them dies
    // meanwhile (its entry can only go once Zookeeper is back), the other takes its calls.
    c.kill();
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_secs(5) {
        assert_eq!(call(gw.addr, "/v1").await, (200, Some(a.port)));
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(n > 5);

    // Back, with a provider that registers after the outage: picked up.
    zk.restart().await;
    let mut b = Provider::start(&zk, None, "1.0.0", None);
    wait_served_by(gw.addr, "/v1", b.port, Duration::from_secs(40)).await;
    wait_served_by(gw.addr, "/v1", a.port, Duration::from_secs(40)).await;
    // What changed while the gateway was away is followed too: the provider that died during the outage left with
    // its session after the restart. With the other two gone as well, no node is left: 503, not a stale 502.
    a.kill();
    b.kill();
    let end = Instant::now() + Duration::from_secs(40);
    loop {
        let (s, _) = call(gw.addr, "/v1").await;
        if s == 503 {
            break;
        }
        assert!(
            Instant::now() < end,
            "/v1 still {s}: a dead provider is still a node"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(zk.providers(DEMO).await.is_empty());
}
