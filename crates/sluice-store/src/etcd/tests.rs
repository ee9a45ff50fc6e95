//! Real-etcd tests: each starts `/usr/bin/etcd` on 127.0.0.1 ephemeral ports with a temp data dir and stops it
//! after. Skipped (with a message) when the binary is absent, so `cargo test` still runs elsewhere.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use super::*;

const ETCD: &str = "/usr/bin/etcd";

struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

fn free_port() -> u16 {
    // etcd binds by number, so the port is found by binding and releasing it (a small race, loopback only).
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl Etcd {
    fn start(name: &str) -> Option<Etcd> {
        if !std::path::Path::new(ETCD).exists() {
            eprintln!("skipping: {ETCD} not installed (apt-get install -y etcd-server)");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("sluice-etcd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut e = Etcd {
            child: None,
            dir,
            client_port: free_port(),
            peer_port: free_port(),
        };
        e.spawn();
        Some(e)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(ETCD)
            .args(["--name", "sluice-test", "--data-dir"])
            .arg(&self.dir)
            .args([
                "--listen-client-urls",
                &self.url(),
                "--advertise-client-urls",
                &self.url(),
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("sluice-test={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn cfg(&self) -> EtcdConfig {
        EtcdConfig {
            endpoints: vec![self.url()],
            prefix: "/apisix".into(),
            timeout: Duration::from_secs(2),
            last_known_good: None,
        }
    }

    async fn connect(&self) -> EtcdStore {
        for _ in 0..100 {
            if let Ok(s) = EtcdStore::connect(self.cfg()).await {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd did not come up");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_converge_and_apisix_data_reads_as_is() {
    let Some(etcd) = Etcd::start("converge") else {
        return;
    };
    let a = etcd.connect().await;
    let b = etcd.connect().await;

    // An APISIX-written dataset: raw keys under /apisix, plus non-resource keys that must be ignored.
    let mut raw = Client::connect([etcd.url()], None).await.unwrap();
    raw.put(
        "/apisix/routes/1",
        r#"{"id":"1","uri":"/hello","upstream":{"nodes":{"127.0.0.1:80":1},"type":"roundrobin"}}"#,
        None,
    )
    .await
    .unwrap();
    raw.put("/apisix/plugins", r#"[{"name":"key-auth"}]"#, None)
        .await
        .unwrap();
    raw.put("/apisix/routes", "init_dir", None).await.unwrap();
    let mut rx_b = b.subscribe();
    until("B sees APISIX's route", || {
        rx_b.borrow_and_update().resources.routes.len() == 1
    })
    .await;
    assert_eq!(
        rx_b.borrow().resources.routes[0].uri.as_deref(),
        Some("/hello")
    );

    // A write through node A is visible on A at once and reaches B through the watch.
    let rev = a
        .commit(vec![Op::Put {
            key: "upstreams/u1".into(),
            value: json!({"id": "u1", "nodes": {"127.0.0.1:81": 1}}),
            expect_mod: Some(0),
        }])
        .await
        .unwrap();
    assert!(
        a.snapshot().get("upstreams/u1").is_some(),
        "read-your-writes on A"
    );
    until("B sees A's write", || b.snapshot().revision >= rev).await;
    assert_eq!(b.subscribe().borrow().resources.upstreams.len(), 1);
    let stored = raw.get("/apisix/upstreams/u1", None).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(stored.kvs()[0].value()).unwrap();
    assert_eq!(
        v["nodes"]["127.0.0.1:81"], 1,
        "stored as APISIX lays it out"
    );

    // A stale guard is refused and changes nothing.
    let err = b
        .commit(vec![Op::Put {
            key: "upstreams/u1".into(),
            value: json!({"id": "u1", "nodes": {}}),
            expect_mod: Some(0),
        }])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)));
    assert!(a.history(0, 10).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_keeps_last_config_then_resyncs() {
    let Some(mut etcd) = Etcd::start("outage") else {
        return;
    };
    let s = etcd.connect().await;
    s.commit(vec![Op::Put {
        key: "routes/1".into(),
        value: json!({"uri": "/a", "plugins": {}}),
        expect_mod: None,
    }])
    .await
    .unwrap();
    let mut rx = s.subscribe();
    rx.borrow_and_update();
    assert!(s.healthy());

    etcd.stop();
    until("store notices the outage", || !s.healthy()).await;
    let err = s
        .commit(vec![Op::Delete {
            key: "routes/1".into(),
            expect_mod: None,
        }])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)));
    assert_eq!(
        rx.borrow().resources.routes.len(),
        1,
        "last configuration kept"
    );

    etcd.spawn();
    // A change made by someone else while we reconnect must arrive through the full resync or the watch.
    let mut raw = loop {
        if let Ok(mut c) = Client::connect([etcd.url()], None).await {
            if c.get("x", None).await.is_ok() {
                break c;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    raw.put("/apisix/routes/2", r#"{"uri":"/b","plugins":{}}"#, None)
        .await
        .unwrap();
    // What subscribers see is what counts: the snapshot map is updated a moment before it is published.
    until("store resyncs and publishes", || {
        s.healthy()
            && s.snapshot().get("routes/2").is_some()
            && s.subscribe().borrow().resources.routes.len() == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_from_last_known_good_while_etcd_is_down_then_catches_up() {
    let Some(mut etcd) = Etcd::start("lkg") else {
        return;
    };
    let file = etcd.dir.with_extension("lkg.json");
    let _ = std::fs::remove_file(&file);
    let cfg = EtcdConfig {
        last_known_good: Some(file.clone()),
        ..etcd.cfg()
    };
    let s = {
        let mut n = 0;
        loop {
            match EtcdStore::connect(cfg.clone()).await {
                Ok(s) => break s,
                Err(_) if n < 100 => n += 1,
                Err(e) => panic!("etcd did not come up: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let rev = s
        .commit(vec![Op::Put {
            key: "routes/1".into(),
            value: json!({"uri": "/a", "plugins": {}}),
            expect_mod: None,
        }])
        .await
        .unwrap();
    let on_disk = || {
        read_last_known_good(&file, "/apisix")
            .ok()
            .flatten()
            .is_some_and(|snap| snap.revision >= rev && snap.entries.contains_key("routes/1"))
    };
    until("the copy is written", on_disk).await;
    drop(s);
    etcd.stop();

    // Unreachable, no usable copy: refused as before, naming why.
    let no_copy = EtcdConfig {
        last_known_good: Some(etcd.dir.with_extension("absent.json")),
        ..etcd.cfg()
    };
    assert!(EtcdStore::connect(no_copy).await.is_err());
    let other = EtcdConfig {
        prefix: "/other".into(),
        ..cfg.clone()
    };
    let err = EtcdStore::connect(other).await.err().expect("wrong prefix");
    assert!(err.to_string().contains("prefix"), "{err}");

    // Unreachable with the copy: serves it, unhealthy, writes refused.
    let s = EtcdStore::connect(cfg.clone())
        .await
        .expect("starts from the copy");
    assert!(!s.healthy());
    let rx = s.subscribe();
    assert_eq!(rx.borrow().resources.routes.len(), 1);
    assert_eq!(rx.borrow().resources.routes[0].uri.as_deref(), Some("/a"));
    let err = s
        .commit(vec![Op::Delete {
            key: "routes/1".into(),
            expect_mod: None,
        }])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)));

    // etcd returns with a change made meanwhile: caught up, and the copy follows.
    etcd.spawn();
    let mut raw = loop {
        if let Ok(mut c) = Client::connect([etcd.url()], None).await {
            if c.get("x", None).await.is_ok() {
                break c;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    raw.put("/apisix/routes/2", r#"{"uri":"/b","plugins":{}}"#, None)
        .await
        .unwrap();
    until("store catches up and publishes", || {
        s.healthy() && s.subscribe().borrow().resources.routes.len() == 2
    })
    .await;
    until("the copy follows", || {
        read_last_known_good(&file, "/apisix")
            .ok()
            .flatten()
            .is_some_and(|snap| snap.entries.contains_key("routes/2"))
    })
    .await;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the copy is private to its owner");
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_corrupt_copy_is_an_error_not_an_empty_start() {
    let dir = std::env::temp_dir().join(format!("sluice-lkg-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("c.json");
    std::fs::write(&f, b"{\"prefix\":\"/apisix\",\"revision\":3,\"entries\":{").unwrap();
    assert!(read_last_known_good(&f, "/apisix").is_err());
    assert!(read_last_known_good(&dir.join("none.json"), "/apisix")
        .unwrap()
        .is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
