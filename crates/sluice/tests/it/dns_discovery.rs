//! DNS discovery through the real binary (issue 18 item 4): a real DNS server (Debian's dnsmasq, on a 127.0.0.1
//! ephemeral port, records from a hosts file and `--srv-host`, TTL 1 s), `sluice start` with `discovery.dns`, and
//! routes whose upstream is `discovery_type: dns`. A records with the port in `service_name`, SRV records with
//! their own port, and a record change followed within its TTL. Skipped with a message when dnsmasq is missing (a
//! failure under CI=true).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::origin::{body_of, named_origin};
use crate::support::process::{Sluice, TempDir};
use crate::support::{free_port, skip_unless_ci};

const DNSMASQ: &str = "/usr/sbin/dnsmasq";

struct Dns {
    child: Child,
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_follow_dns_records() {
    if !Path::new(DNSMASQ).exists() {
        skip_unless_ci("dnsmasq is not installed (Debian: dnsmasq-base)");
        return;
    }
    let overall = tokio::time::timeout(Duration::from_secs(90), async {
        let dir = TempDir::new("dns");
        let (p1, p2) = (free_port(), free_port());
        let _a = named_origin("127.0.0.1".parse().unwrap(), p1, "A").await;
        let _b = named_origin("127.0.0.2".parse().unwrap(), p1, "B").await;
        let _c = named_origin("127.0.0.1".parse().unwrap(), p2, "C").await;
        let hosts = dir.0.join("hosts");
        std::fs::write(
            &hosts,
            "127.0.0.1 svc.sluice.test\n127.0.0.1 srvtarget.sluice.test\n",
        )
        .unwrap();
        let dns_port = free_port();
        let dns = Dns {
            child: Command::new(DNSMASQ)
                .args([
                    "--keep-in-foreground",
                    "--conf-file=/dev/null",
                    "--no-resolv",
                    "--no-hosts",
                ])
                .args([
                    "--bind-interfaces",
                    "--listen-address=127.0.0.1",
                    "--local-ttl=1",
                    "--user=root",
                ])
                .arg(format!("--port={dns_port}"))
                .arg(format!("--addn-hosts={}", hosts.display()))
                .arg(format!(
                    "--srv-host=_web._tcp.sluice.test,srvtarget.sluice.test,{p2},10,60"
                ))
                .arg("--pid-file=")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn dnsmasq"),
        };

        let (port, admin_port) = (free_port(), free_port());
        let apisix = format!(
            "routes:\n  - {{id: a, uri: /a, upstream: {{discovery_type: dns, service_name: \"svc.sluice.test:{p1}\", type: roundrobin}}}}\n\
             \x20 - {{id: srv, uri: /srv, upstream: {{discovery_type: dns, service_name: _web._tcp.sluice.test, type: roundrobin}}}}\n#END\n"
        );
        std::fs::write(dir.0.join("apisix.yaml"), apisix).unwrap();
        std::fs::write(
            dir.0.join("config.yaml"),
            format!(
                "apisix:\n  node_listen: [{{ip: 127.0.0.1, port: {port}}}]\n  enable_control: false\n  enable_admin: false\n  ssl: {{enable: false}}\n\
                 deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
                 plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
                 discovery:\n  dns:\n    servers: [\"127.0.0.1:{dns_port}\"]\n"
            ),
        )
        .unwrap();
        let _ = admin_port;
        let gw: SocketAddr = ([127, 0, 0, 1], port).into();
        let _sluice = Sluice::spawn_in(dir, gw, &[]).await;

        let until = |path: &'static str, want: &'static str| async move {
            let end = Instant::now() + Duration::from_secs(20);
            loop {
                let got = body_of(gw, path).await;
                if got == (200, want.to_owned()) {
                    return;
                }
                assert!(Instant::now() < end, "{path}: still {got:?}, want {want}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        // A record + the port in service_name; SRV with its own port.
        until("/a", "A").await;
        until("/srv", "C").await;

        // The record changes (dnsmasq re-reads its hosts file on SIGHUP): followed within the TTL.
        let hosts = _sluice.dir.0.join("hosts");
        std::fs::write(
            &hosts,
            "127.0.0.2 svc.sluice.test\n127.0.0.1 srvtarget.sluice.test\n",
        )
        .unwrap();
        let st = Command::new("kill")
            .args(["-HUP", &dns.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        until("/a", "B").await;
        // Only B now, every time.
        for _ in 0..10 {
            assert_eq!(body_of(gw, "/a").await, (200, "B".to_owned()));
        }
    });
    overall.await.expect("bounded");
}
