//! Consul discovery through the real binary (issue 18 item 4): a real Consul agent (`consul agent -dev`, v1.14.11,
//! MPL-2.0, built with `go build` from crates/sluice-discovery/tools/consul-agent into `<target>/consul-agent/` on
//! first use; every port ephemeral on 127.0.0.1, DNS off), `sluice start` with `discovery.consul`, and a route whose
//! upstream is `discovery_type: consul`. Services are registered and deregistered through Consul's HTTP API and the
//! gateway follows; with Consul killed the last nodes keep serving, and a restarted gateway serves them from the
//! dump file. Skipped with a message when Go is missing (a failure under CI=true).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::origin::{body_of, named_origin};
use crate::support::process::{Sluice, TempDir};
use crate::support::{free_port, skip_unless_ci};

fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-discovery/tools/consul-agent")
}

/// `go build` of the pinned agent, once per go.mod/go.sum (a stamp beside the binary).
fn consul_bin() -> Option<PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        let go = ["go", "/usr/local/go/bin/go"].into_iter().find(|g| {
            Command::new(g)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        })?;
        let home = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
            .join("consul-agent");
        std::fs::create_dir_all(&home).expect("create <target>/consul-agent");
        let mut h = DefaultHasher::new();
        for f in ["go.mod", "go.sum"] {
            std::fs::read(tools().join(f))
                .expect("read tools/consul-agent")
                .hash(&mut h);
        }
        let stamp = format!("{:016x}", h.finish());
        let (bin, stamp_file) = (home.join("consul"), home.join(".sluice-stamp"));
        if std::fs::read_to_string(&stamp_file).ok().as_deref() != Some(&stamp) || !bin.exists() {
            let t = Instant::now();
            let out = Command::new(go)
                .args(["build", "-o"])
                .arg(&bin)
                .arg("github.com/hashicorp/consul")
                .current_dir(tools())
                .output()
                .expect("run go build");
            assert!(
                out.status.success(),
                "go build of consul failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("consul: go build took {:.1?}", t.elapsed());
            std::fs::write(&stamp_file, &stamp).expect("write stamp");
        }
        Some(bin)
    })
    .clone()
}

struct Consul {
    child: Child,
    http: SocketAddr,
}

impl Drop for Consul {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Consul {
    fn start(bin: &Path, dir: &Path) -> Consul {
        let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let hcl = format!(
            "ports {{ http = {} dns = -1 grpc = -1 grpc_tls = -1 serf_lan = {} serf_wan = {} server = {} }}\n\
             disable_update_check = true\n",
            http.port(),
            free_port(),
            free_port(),
            free_port()
        );
        let child = Command::new(bin)
            .args([
                "agent",
                "-dev",
                "-bind=127.0.0.1",
                "-client=127.0.0.1",
                "-log-level=warn",
            ])
            .arg(format!("-hcl={hcl}"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn consul");
        let c = Consul { child, http };
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, body)) = c.call("GET", "/v1/status/leader", "") {
                if body.len() > 2 {
                    return c;
                }
            }
            assert!(
                Instant::now() < end,
                "consul did not elect itself within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn call(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        let mut c = TcpStream::connect_timeout(&self.http, Duration::from_secs(2))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            c,
            "{method} {path} HTTP/1.0\r\nHost: consul\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut out = String::new();
        c.read_to_string(&mut out)?;
        let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
        Ok((status, body))
    }

    fn register(&self, id: &str, port: u16) {
        let body = format!(r#"{{"ID":"{id}","Name":"web","Address":"127.0.0.1","Port":{port}}}"#);
        let r = self
            .call("PUT", "/v1/agent/service/register", &body)
            .expect("register");
        assert_eq!(r.0, 200, "register {id}: {r:?}");
    }

    fn deregister(&self, id: &str) {
        let r = self
            .call("PUT", &format!("/v1/agent/service/deregister/{id}"), "")
            .expect("deregister");
        assert_eq!(r.0, 200, "deregister {id}: {r:?}");
    }
}

/// Waits (bounded) until the bodies of 6 requests to `/w` are exactly the set `want`.
async fn until(gw: SocketAddr, want: &[&str]) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut got = Vec::new();
        for _ in 0..6 {
            let (s, b) = body_of(gw, "/w").await;
            got.push(if s == 200 { b } else { s.to_string() });
        }
        got.sort();
        got.dedup();
        if got == want {
            return;
        }
        assert!(Instant::now() < end, "/w: still {got:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_follow_consul_services() {
    let Some(bin) = consul_bin() else {
        skip_unless_ci("Consul discovery's test needs Go (on PATH or in /usr/local/go/bin)");
        return;
    };
    let overall = tokio::time::timeout(Duration::from_secs(150), async {
        let dir = TempDir::new("consul");
        let consul = Consul::start(&bin, &dir.0);
        let (p1, p2) = (free_port(), free_port());
        let _a = named_origin("127.0.0.1".parse().unwrap(), p1, "A").await;
        let _b = named_origin("127.0.0.1".parse().unwrap(), p2, "B").await;
        consul.register("web-a", p1);

        let port = free_port();
        std::fs::write(
            dir.0.join("apisix.yaml"),
            "routes:\n  - {id: w, uri: /w, upstream: {discovery_type: consul, service_name: web, type: roundrobin}}\n\
             \x20 - {id: n, uri: /n, upstream: {discovery_type: consul, service_name: nobody, type: roundrobin}}\n#END\n",
        )
        .unwrap();
        std::fs::write(
            dir.0.join("config.yaml"),
            format!(
                "apisix:\n  node_listen: [{{ip: 127.0.0.1, port: {port}}}]\n  enable_control: false\n  enable_admin: false\n  ssl: {{enable: false}}\n\
                 deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
                 plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
                 discovery:\n  consul:\n    servers: [\"http://{}\"]\n    timeout: {{connect: 500, read: 1000, wait: 5}}\n    dump: {{path: {}}}\n",
                consul.http,
                dir.0.join("consul.dump.json").display()
            ),
        )
        .unwrap();
        let gw: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut sluice = Sluice::spawn_in(dir, gw, &[]).await;

        until(gw, &["A"]).await;
        // A service no server lists (and no default_service): 503.
        assert_eq!(body_of(gw, "/n").await.0, 503);
        // A second instance registers: both serve; the first leaves: only the second.
        consul.register("web-b", p2);
        until(gw, &["A", "B"]).await;
        consul.deregister("web-a");
        until(gw, &["B"]).await;

        // Consul goes away: the last known node keeps serving.
        drop(consul);
        let end = Instant::now() + Duration::from_secs(3);
        while Instant::now() < end {
            assert_eq!(body_of(gw, "/w").await, (200, "B".to_owned()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A gateway that starts while Consul is away serves the nodes of the dump file.
        sluice.restart(&[]).await;
        until(gw, &["B"]).await;
    });
    overall.await.expect("bounded");
}
