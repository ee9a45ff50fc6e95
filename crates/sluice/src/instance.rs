//! One running instance per pid file, and the commands that signal it (`sluice reload | quit | stop`), as nginx's
//! pid file and `nginx -s`. The running gateway holds an exclusive `flock` on its pid file for its whole life: the
//! kernel drops the lock when the process dies however it dies (kill -9 included), so a stale file never blocks
//! the next start, and "is an instance running" is "is the file locked", never a guess from a pid that may have
//! been reused. A second start on the same ports from another directory is caught separately, by
//! [`ports_free`] (the listeners use SO_REUSEPORT, which would otherwise let it share the ports silently).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};
use rustix::process::{kill_process, Pid, Signal};
use sluice_model::NodeConfig;

/// The pid file for `node` read from `config`: `sluice.pid_file` (relative to the config file's directory), else
/// `sluice.pid` beside config.yaml: one config file, one instance. Not in the data directory: its default
/// (`../.data`) is shared by sibling config directories, whose gateways would then refuse each other.
pub fn pid_path(config: &Path, node: &NodeConfig) -> PathBuf {
    let dir = config.parent().unwrap_or(Path::new("."));
    dir.join(node.sluice.pid_file.as_deref().unwrap_or("sluice.pid"))
}

/// The running instance's hold on its pid file; released by the kernel when the process ends.
pub struct PidLock {
    file: File,
    path: PathBuf,
}

impl PidLock {
    /// Locks `path` and writes this process's pid into it, or says which instance holds it.
    pub fn acquire(path: &Path) -> Result<PidLock, String> {
        PidLock::acquire_or(path, |pid| {
            format!(
                "another Sluice instance (pid {pid}) is running with the pid file {}; stop it first \
                 (sluice stop) or give this one its own sluice.pid_file and ports",
                path.display()
            )
        })
    }

    /// The data directory holds the node's identity (`sluice.uid`), the embedded store and the etcd copy: two
    /// nodes sharing one would register as one node and overwrite each other's copy.
    pub fn acquire_data_dir(dir: &Path) -> Result<PidLock, String> {
        PidLock::acquire_or(&dir.join("sluice.lock"), |pid| {
            format!(
                "another Sluice instance (pid {pid}) uses the data directory {}; give each node its own \
                 sluice.data_dir",
                dir.display()
            )
        })
    }

    fn acquire_or(path: &Path, held: impl Fn(&str) -> String) -> Result<PidLock, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| format!("opening the pid file {}: {e}", path.display()))?;
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            let pid = read_pid(&mut file).map_or("unknown".into(), |p| p.to_string());
            return Err(held(&pid));
        }
        file.set_len(0)
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "{}", std::process::id()))
            .and_then(|_| file.sync_all())
            .map_err(|e| format!("writing the pid file {}: {e}", path.display()))?;
        Ok(PidLock {
            file,
            path: path.to_owned(),
        })
    }
}

impl Drop for PidLock {
    /// Any exit that unwinds (a clean stop, a failed start): empty the file while still holding the lock, so no
    /// pid lingers in it. A killed process leaves its pid behind, unlocked, which the next start overwrites.
    fn drop(&mut self) {
        if let Err(e) = self.file.set_len(0) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot empty the pid file");
        }
    }
}

fn read_pid(file: &mut File) -> Option<i32> {
    let mut s = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

/// The pid of the instance holding `path`, or why there is none.
pub fn running_pid(path: &Path) -> Result<i32, String> {
    let mut file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "no Sluice instance is running: the pid file {} does not exist",
            path.display()
        ),
        _ => format!("opening the pid file {}: {e}", path.display()),
    })?;
    // A lock we can take is a lock nobody holds: the file is stale (the instance ended, perhaps by kill -9).
    if flock(&file, FlockOperation::NonBlockingLockShared).is_ok() {
        let _ = flock(&file, FlockOperation::Unlock);
        let why = match read_pid(&mut file) {
            Some(pid) => format!("is stale (pid {pid} ended without a clean exit)"),
            None => "is empty (the last instance exited)".into(),
        };
        return Err(format!(
            "no Sluice instance is running: the pid file {} {why}",
            path.display()
        ));
    }
    read_pid(&mut file).ok_or_else(|| {
        format!(
            "the pid file {} is locked but holds no pid yet; the instance may be starting, try again",
            path.display()
        )
    })
}

/// What `sluice reload | quit | stop` send.
#[derive(Clone, Copy)]
pub enum Action {
    Reload,
    Quit,
    Stop,
}

impl Action {
    fn signal(self) -> (Signal, &'static str) {
        match self {
            Action::Reload => (Signal::HUP, "SIGHUP"),
            Action::Quit => (Signal::QUIT, "SIGQUIT"),
            Action::Stop => (Signal::TERM, "SIGTERM"),
        }
    }
}

/// Signals the instance of `pid_file`; `quit` and `stop` then wait (up to `wait`) until it has exited.
pub fn signal(pid_file: &Path, action: Action, wait: Duration) -> Result<String, String> {
    let pid = running_pid(pid_file)?;
    let (sig, name) = action.signal();
    let p =
        Pid::from_raw(pid).ok_or_else(|| format!("invalid pid {pid} in {}", pid_file.display()))?;
    kill_process(p, sig).map_err(|e| format!("sending {name} to pid {pid}: {e}"))?;
    if matches!(action, Action::Reload) {
        return Ok(format!(
            "sent {name} to pid {pid}: the log says what was applied and what needs a restart"
        ));
    }
    let end = Instant::now() + wait;
    while Instant::now() < end {
        if running_pid(pid_file).is_err() {
            return Ok(format!("sent {name} to pid {pid}: stopped"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "sent {name} to pid {pid}, but it was still running after {wait:?}"
    ))
}

/// Fails when something already listens on one of `addrs`. The gateway's own listeners set SO_REUSEPORT, so a
/// second gateway would otherwise join the first one's ports and split its traffic; this probe binds without it.
pub fn ports_free(addrs: &[SocketAddr]) -> Result<(), String> {
    for a in addrs {
        if let Err(e) = std::net::TcpListener::bind(a) {
            return Err(if e.kind() == std::io::ErrorKind::AddrInUse {
                format!(
                    "{a} is already in use: another Sluice instance or another server listens there \
                     (sluice stop stops a running Sluice)"
                )
            } else {
                format!("cannot listen on {a}: {e}")
            });
        }
    }
    Ok(())
}
