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
        self.spawn_with(&self.url(), &[]);
    }

    /// `url` is the client URL (`https://...` with TLS flags in `extra`).
    fn spawn_with(&mut self, url: &str, extra: &[&str]) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(ETCD)
            .args(["--name", "sluice-test", "--data-dir"])
            .arg(&self.dir)
            .args(["--listen-client-urls", url, "--advertise-client-urls", url])
            .args(extra)
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
            auth: None,
            tls: Default::default(),
        }
    }

    async fn connect(&self) -> EtcdStore {
        self.connect_with(self.cfg())
            .await
            .expect("etcd did not come up")
    }

    /// Connects with `cfg`, retrying (bounded) while etcd starts; the last error if it never answers.
    async fn connect_with(&self, cfg: EtcdConfig) -> Result<EtcdStore, StoreError> {
        let mut last = None;
        for _ in 0..100 {
            match EtcdStore::connect(cfg.clone()).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last.expect("tried"))
    }

    /// A plain client, once etcd answers (bounded).
    async fn raw_client(&self) -> Client {
        for _ in 0..100 {
            if let Ok(mut c) = Client::connect([self.url()], None).await {
                if c.get("x", None).await.is_ok() {
                    return c;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd did not answer");
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
    let mut raw = etcd.raw_client().await;
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
    let s = etcd
        .connect_with(cfg.clone())
        .await
        .expect("etcd did not come up");
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
    let mut raw = etcd.raw_client().await;
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

/// A CA and the certificates it signs (ECDSA P-256).
struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_owned());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// (certificate PEM, key PEM) for `names` with common name `cn`.
    fn leaf(&self, cn: &str, names: &[&str]) -> (String, String) {
        let mut p =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, cn.to_owned());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_and_user_password_auth() {
    let Some(mut etcd) = Etcd::start("tls") else {
        return;
    };
    etcd.stop();
    let ca = Ca::new("sluice-test-ca");
    let (server_cert, server_key) = ca.leaf("etcd", &["127.0.0.1", "localhost"]);
    let (client_cert, client_key) = ca.leaf("sluice", &[]);
    let pki = etcd.dir.with_extension("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let file = |name: &str, body: &str| {
        let p = pki.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let (sc, sk, cap) = (
        file("server.pem", &server_cert),
        file("server.key", &server_key),
        file("ca.pem", &ca.cert.pem()),
    );
    let url = format!("https://127.0.0.1:{}", etcd.client_port);
    etcd.spawn_with(
        &url,
        &[
            "--cert-file",
            &sc,
            "--key-file",
            &sk,
            "--client-cert-auth",
            "--trusted-ca-file",
            &cap,
        ],
    );
    let tls = EtcdTls {
        ca: Some(ca.cert.pem().into_bytes()),
        identity: Some((
            client_cert.clone().into_bytes(),
            Secret(client_key.clone().into_bytes()),
        )),
        sni: None,
    };
    let cfg = EtcdConfig {
        endpoints: vec![url.clone()],
        tls: tls.clone(),
        ..etcd.cfg()
    };
    let s = etcd
        .connect_with(cfg.clone())
        .await
        .expect("TLS with a client certificate");
    s.commit(vec![Op::Put {
        key: "routes/1".into(),
        value: json!({"uri": "/tls", "plugins": {}}),
        expect_mod: None,
    }])
    .await
    .unwrap();
    assert_eq!(s.subscribe().borrow().resources.routes.len(), 1);

    // What an attacker or a misconfiguration would try: no client certificate, a CA etcd's certificate is not
    // from, a certificate from another CA, another name than the certificate's.
    let other = Ca::new("other-ca");
    let (other_cert, other_key) = other.leaf("sluice", &[]);
    let refused = [
        EtcdTls {
            identity: None,
            ..tls.clone()
        },
        EtcdTls {
            ca: Some(other.cert.pem().into_bytes()),
            ..tls.clone()
        },
        EtcdTls {
            identity: Some((other_cert.into_bytes(), Secret(other_key.into_bytes()))),
            ..tls.clone()
        },
        EtcdTls {
            sni: Some("etcd.example".into()),
            ..tls.clone()
        },
    ];
    for (i, t) in refused.into_iter().enumerate() {
        let bad = EtcdConfig {
            tls: t,
            ..cfg.clone()
        };
        assert!(EtcdStore::connect(bad).await.is_err(), "case {i} connected");
    }
    let plain = EtcdConfig {
        endpoints: vec![format!("http://127.0.0.1:{}", etcd.client_port)],
        ..cfg.clone()
    };
    assert!(
        EtcdStore::connect(plain).await.is_err(),
        "cleartext to a TLS etcd"
    );

    // Auth on: a user with the root role, then `auth enable`.
    let mut raw = Client::connect([url.as_str()], Some(cfg.connect_options()))
        .await
        .unwrap();
    raw.role_add("root").await.unwrap();
    raw.user_add("root", "s3cret-pw", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.auth_enable().await.unwrap();

    let with_user = EtcdConfig {
        auth: Some(("root".into(), Secret(b"s3cret-pw".to_vec()))),
        ..cfg.clone()
    };
    let s2 = etcd
        .connect_with(with_user)
        .await
        .expect("user and password");
    assert_eq!(s2.subscribe().borrow().resources.routes.len(), 1);
    s2.commit(vec![Op::Put {
        key: "routes/2".into(),
        value: json!({"uri": "/auth", "plugins": {}}),
        expect_mod: None,
    }])
    .await
    .unwrap();
    let wrong = EtcdConfig {
        auth: Some(("root".into(), Secret(b"guess".to_vec()))),
        ..cfg.clone()
    };
    let err = EtcdStore::connect(wrong)
        .await
        .err()
        .expect("wrong password");
    assert!(
        !format!("{err:?}").contains("guess"),
        "the password is never shown: {err:?}"
    );
    // The certificate's name ("sluice") is no etcd user: without a password nothing is readable.
    assert!(
        EtcdStore::connect(cfg.clone()).await.is_err(),
        "no password"
    );
    assert!(
        !format!("{cfg:?}").contains("PRIVATE KEY"),
        "keys are never printed"
    );
    let _ = std::fs::remove_dir_all(&pki);
}
