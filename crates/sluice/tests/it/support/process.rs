//! The real `sluice` binary as a child process: a temp conf dir with config.yaml and apisix.yaml, `sluice start`
//! on a free 127.0.0.1 port, atomic rewrites of apisix.yaml, SIGTERM via `kill(1)` (the workspace forbids `unsafe`,
//! so no libc call). Also `sluice mock` as a child origin. Children are killed (by their own pid) on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

static SEQ: AtomicUsize = AtomicUsize::new(0);

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "sluice-it-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits (bounded) until something accepts on `addr`.
async fn wait_listening(addr: SocketAddr, child: &mut Child) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("exited early: {st}"));
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err("not listening after 10 s".into())
}

/// `sluice start -c DIR/config.yaml`, logging warnings to the test's stderr.
fn spawn_start(dir: &TempDir) -> Child {
    Command::new(BIN)
        .arg("start")
        .arg("-c")
        .arg(dir.0.join("config.yaml"))
        .env("SLUICE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sluice")
}

pub struct Sluice {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: TempDir,
}

impl Sluice {
    /// Starts `sluice start -c DIR/config.yaml` with `apisix_yaml` (must end with `#END`); retries once on a lost
    /// port race.
    pub async fn start(apisix_yaml: &str, workers: usize) -> Sluice {
        let dir = TempDir::new("gw");
        std::fs::write(dir.0.join("apisix.yaml"), apisix_yaml).expect("write apisix.yaml");
        let mut last = String::new();
        for _ in 0..2 {
            let port = free_port();
            let cfg = format!(
                "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: false\n  enable_control: false\n  ssl:\n    enable: false\n\
                 nginx_config:\n  worker_processes: {workers}\n  http:\n    access_log: {log}\n\
                 deployment:\n  role: data_plane\n  role_data_plane:\n    config_provider: yaml\n\
                 plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
                 sluice:\n  config_poll_interval: 0.1\n  graceful_shutdown_timeout: 5\n",
                log = dir.0.join("access.log").display()
            );
            std::fs::write(dir.0.join("config.yaml"), cfg).expect("write config.yaml");
            let mut child = spawn_start(&dir);
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            match wait_listening(addr, &mut child).await {
                Ok(()) => return Sluice { child, addr, dir },
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = e;
                }
            }
        }
        panic!("sluice start failed twice: {last}");
    }

    /// Starts `sluice start` in APISIX's traditional role: the embedded store in `dir/data` (seeded from
    /// `apisix_yaml` on first start when given), the Admin API on a free loopback port with `key`. Returns the
    /// gateway and the Admin API address. Reuses `dir` when given (to test a restart on the same store).
    pub async fn start_traditional(
        apisix_yaml: Option<&str>,
        key: &str,
        dir: Option<TempDir>,
    ) -> (Sluice, SocketAddr) {
        let dir = dir.unwrap_or_else(|| TempDir::new("trad"));
        if let Some(y) = apisix_yaml {
            std::fs::write(dir.0.join("apisix.yaml"), y).expect("write apisix.yaml");
        }
        let (port, admin_port) = (free_port(), free_port());
        let cfg = format!(
            "apisix:\n  node_listen:\n    - ip: 127.0.0.1\n      port: {port}\n  enable_admin: true\n  enable_control: false\n  ssl:\n    enable: false\n\
             nginx_config:\n  worker_processes: 1\n  http:\n    access_log: {log}\n\
             deployment:\n  role: traditional\n  role_traditional:\n    config_provider: embedded\n\
             \x20 admin:\n    admin_listen:\n      ip: 127.0.0.1\n      port: {admin_port}\n\
             \x20   admin_key:\n      - name: admin\n        key: {key}\n        role: admin\n\
             plugin_attr:\n  prometheus:\n    enable_export_server: false\n\
             sluice:\n  data_dir: data\n",
            log = dir.0.join("access.log").display()
        );
        std::fs::write(dir.0.join("config.yaml"), cfg).expect("write config.yaml");
        let mut child = spawn_start(&dir);
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let admin: SocketAddr = ([127, 0, 0, 1], admin_port).into();
        wait_listening(addr, &mut child)
            .await
            .expect("gateway listening");
        wait_listening(admin, &mut child)
            .await
            .expect("admin listening");
        (Sluice { child, addr, dir }, admin)
    }

    /// Replaces apisix.yaml atomically (write a temp file, rename over).
    /// `sluice start` on `dir`, whose config.yaml the caller wrote, serving on `addr`; waits (bounded) until `addr`
    /// and every address in `also` (Admin API, control API) accept. Panics if it exits or does not listen.
    pub async fn spawn_in(dir: TempDir, addr: SocketAddr, also: &[SocketAddr]) -> Sluice {
        let mut child = spawn_start(&dir);
        for a in std::iter::once(addr).chain(also.iter().copied()) {
            if let Err(e) = wait_listening(a, &mut child).await {
                let _ = child.kill();
                let _ = child.wait();
                panic!("sluice on {a}: {e}");
            }
        }
        Sluice { child, addr, dir }
    }

    /// Kills the process (SIGKILL) and starts it again on the same directory, waiting as [`Sluice::spawn_in`].
    pub async fn restart(&mut self, also: &[SocketAddr]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_start(&self.dir);
        for a in std::iter::once(self.addr).chain(also.iter().copied()) {
            if let Err(e) = wait_listening(a, &mut self.child).await {
                panic!("sluice restarted on {a}: {e}");
            }
        }
    }

    pub fn write_config(&self, apisix_yaml: &str) {
        let tmp = self.dir.0.join("apisix.yaml.tmp");
        std::fs::write(&tmp, apisix_yaml).expect("write temp apisix.yaml");
        std::fs::rename(&tmp, self.dir.0.join("apisix.yaml")).expect("rename apisix.yaml");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM with kill(1).
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Sends `SIG<name>` (`HUP`, `QUIT`, `KILL`...) with kill(1).
    pub fn signal(&self, name: &str) {
        let st = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{name} failed");
    }

    /// Waits (bounded) for the process to exit.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let end = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(
                Instant::now() < end,
                "sluice did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `sluice mock` as a child origin.
pub struct Mock {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Mock {
    pub async fn start(body_size: usize) -> Mock {
        let mut last = String::new();
        for _ in 0..2 {
            let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let mut child = Command::new(BIN)
                .args(["mock", "--listen", &addr.to_string(), "--body-size"])
                .arg(body_size.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn sluice mock");
            match wait_listening(addr, &mut child).await {
                Ok(()) => return Mock { child, addr },
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = e;
                }
            }
        }
        panic!("sluice mock failed twice: {last}");
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
