//! Helpers shared by the Admin API test binaries (each `tests/*.rs` includes this file with `#[path]`): a real etcd
//! on ephemeral loopback ports with a temp data dir, an etcd-backed store that waits for it, and a one-shot HTTP
//! client returning the status and the JSON body.

#![allow(dead_code)] // not every test binary uses every helper

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use sluice_store::etcd::{EtcdConfig, EtcdStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const ETCD: &str = "/usr/bin/etcd";

/// A test whose tool is missing fails under CI (`CI=true`): a conformance test that silently skips proves nothing.
/// Elsewhere it skips, saying why.
pub fn skip_unless_ci(why: &str) {
    if matches!(std::env::var("CI").as_deref(), Ok("true" | "1")) {
        panic!("{why}: CI=true requires this test to run (`make test` installs what it needs)");
    }
    eprintln!("skipping: {why}");
}

/// A running etcd, killed and its data dir removed on drop.
pub struct Etcd {
    pub child: Child,
    dir: std::path::PathBuf,
    pub url: String,
}

impl Etcd {
    /// Starts etcd as member `name`; `None` (with a message) when etcd is not installed, a panic under CI=true.
    pub fn start(name: &str) -> Option<Etcd> {
        if !std::path::Path::new(ETCD).exists() {
            skip_unless_ci(&format!(
                "{ETCD} not installed (apt-get install -y etcd-server)"
            ));
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("sluice-admin-{name}-etcd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (cp, pp) = (free_port(), free_port());
        let url = format!("http://127.0.0.1:{cp}");
        let peer = format!("http://127.0.0.1:{pp}");
        let child = Command::new(ETCD)
            .args(["--name", name, "--data-dir"])
            .arg(&dir)
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("{name}={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        Some(Etcd { child, dir, url })
    }

    /// Kills etcd now (its data dir stays until drop).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// An etcd store on this etcd, retried for up to 10 s while etcd starts.
    pub async fn store(&self) -> EtcdStore {
        let cfg = EtcdConfig {
            endpoints: vec![self.url.clone()],
            prefix: "/apisix".into(),
            timeout: Duration::from_secs(2),
            last_known_good: None,
            auth: None,
            tls: Default::default(),
        };
        for _ in 0..100 {
            if let Ok(s) = EtcdStore::connect(cfg.clone()).await {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd at {} did not come up within 10 s", self.url);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port: etcd takes ports by number (bind-and-release; a small race, acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// One request on its own connection; the status and the body as JSON (`Null` when it is not JSON).
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Value) {
    let a = raw(addr, method, path, "", body).await;
    (a.status, a.body)
}

/// A whole answer: status, raw head, body as JSON (`Null` when it is not JSON) and as text.
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: Value,
    pub raw_body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// One request on its own connection, with the header lines in `extra` (each ending in CRLF).
pub async fn raw(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    extra: &str,
    body: &str,
) -> Answer {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        String::from_utf8_lossy(&out).into_owned()
    };
    let text = tokio::time::timeout(Duration::from_secs(15), fut)
        .await
        .expect("answered within 15 s");
    let (head, body) = text.split_once("\r\n\r\n").expect("head");
    Answer {
        status: head[9..12].parse().expect("status"),
        head: head.to_owned(),
        body: serde_json::from_str(body).unwrap_or(Value::Null),
        raw_body: body.to_owned(),
    }
}

/// The binary's catalog: names, schemas, checks and consumer schemas from the real plugin registry.
pub struct Registry;

impl sluice_admin::PluginCatalog for Registry {
    fn names(&self) -> Vec<String> {
        sluice_plugins::registry::REGISTRY
            .iter()
            .map(|e| e.name.to_owned())
            .collect()
    }
    fn schema(&self, name: &str) -> Option<Value> {
        sluice_plugins::registry::find(name).map(|e| (e.schema)())
    }
    fn check(&self, name: &str, conf: &Value) -> Result<(), String> {
        (sluice_plugins::registry::find(name)
            .ok_or("unknown plugin")?
            .check)(conf)
    }
    fn is_auth(&self, name: &str) -> bool {
        sluice_plugins::registry::find(name).is_some_and(|e| e.auth)
    }
    fn consumer_schema(&self, name: &str) -> Option<Value> {
        sluice_plugins::registry::consumer_schema(name)
    }
}
