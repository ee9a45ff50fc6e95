//! Real gRPC servers for the gRPC tests, installed on first use and started by the tests on loopback:
//! - grpc-go's example `helloworld/greeter_server` and `route_guide/server`, built with `go build` from the
//!   versions pinned in crates/sluice-proxy/tools/grpc-peers/go.mod;
//! - the Python "kitchen sink" peer (tools/grpc-peers/kitchen_server.py: `sluice.test.Kitchen` from
//!   kitchen.proto, `helloworld.Greeter`, server reflection) in a virtualenv pinned by requirements.txt, its stubs
//!   generated with grpc_tools.protoc.
//!
//! Include with `#[path = "../common/grpc_peers.rs"] mod grpc_peers;`; the including test binary must have the
//! `ci` module (common/ci.rs) at its crate root. Everything is installed under `<target>/grpc-peers/`, each
//! part behind a stamp of its inputs (a changed .proto regenerates the stubs, a changed go.mod rebuilds), under an
//! exclusive `flock` so that test binaries asking at once install once. Needs Go >= 1.25 (`go` on PATH, else
//! /usr/local/go/bin/go) and `python3` with venv (`SLUICE_TEST_PYTHON` names another interpreter); pip and
//! `go build` reach PyPI and the Go module proxy the first time.
//!
//! Lifetime: every server holds a pipe from this process on its stdin and dies when that pipe reaches end of file
//! (the Python server watches stdin itself; each Go server runs under a small `sh` that kills it then). The pipe's
//! write end is only ever held by this process (std opens pipes close-on-exec), so the servers go away with the
//! test binary however it ends, including a `static` peer set that is never dropped, a panic or a SIGKILL.
//! Dropping a [`GrpcPeers`] closes the pipes and waits for the servers.
#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a started server may take to accept connections.
const READY: Duration = Duration::from_secs(20);
/// How long a test binary waits for another one's install.
const INSTALL_LOCK: Duration = Duration::from_secs(900);
const EXAMPLES: &str = "google.golang.org/grpc/examples";

/// One started set of servers.
pub struct GrpcPeers {
    /// The Python peer: `sluice.test.Kitchen` and `helloworld.Greeter` (127.0.0.1 only).
    pub py: SocketAddr,
    /// grpc-go's helloworld greeter_server (`helloworld.Greeter/SayHello`).
    pub go_greeter: SocketAddr,
    /// grpc-go's route_guide server (`routeguide.RouteGuide`), with the example's feature database.
    pub route_guide: SocketAddr,
    pub installed: Installed,
    children: Vec<Peer>,
}

/// Where the installed peers are.
#[derive(Clone, Debug)]
pub struct Installed {
    pub python: PathBuf,
    pub stubs: PathBuf,
    pub greeter_server: PathBuf,
    pub route_guide_server: PathBuf,
    /// The grpc-go examples module in Go's module cache.
    pub examples: PathBuf,
    /// The venv's site-packages (googleapis-common-protos ships google/rpc/*.proto there).
    pub site_packages: PathBuf,
}

impl Installed {
    /// The route_guide service's .proto (protobuf edition 2023), as the Go server was built from.
    pub fn route_guide_proto(&self) -> PathBuf {
        self.examples
            .join("route_guide/routeguide/route_guide.proto")
    }

    /// The route_guide server's feature database (JSON: `[{"location": {"latitude", "longitude"}, "name"}]`).
    pub fn route_guide_db(&self) -> PathBuf {
        self.examples
            .join("route_guide/testdata/route_guide_db.json")
    }
}

struct Peer {
    name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    log: Log,
}

/// The last 64 KiB a server wrote to stdout/stderr, for failure messages.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn drain(&self, mut r: impl Read + Send + 'static) {
        let log = self.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                let mut l = log.0.lock().unwrap();
                l.extend_from_slice(&buf[..n]);
                let excess = l.len().saturating_sub(64 << 10);
                l.drain(..excess);
            }
        });
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The tools/grpc-peers directory: kitchen.proto, helloworld.proto and the Python server.
pub fn proto_dir() -> PathBuf {
    workspace_root().join("crates/sluice-proxy/tools/grpc-peers")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("crates/sluice-proxy/tools/grpc-peers").is_dir())
        .expect("workspace root above CARGO_MANIFEST_DIR")
        .to_path_buf()
}

fn home() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("grpc-peers")
}

/// One peer set for the whole test binary, started on first use (see the module comment for its end).
pub fn shared() -> Option<&'static GrpcPeers> {
    static PEERS: OnceLock<Option<GrpcPeers>> = OnceLock::new();
    PEERS.get_or_init(start).as_ref()
}

/// Installs what is missing, then starts a fresh set of servers. None when Python or Go is missing outside CI
/// (after saying so); under `CI=true` that panics, as does any failed install or start.
pub fn start() -> Option<GrpcPeers> {
    let installed = install()?;
    let mut children = Vec::new();
    let py = start_python(&installed, &mut children);
    let go_greeter = start_go(
        "greeter_server",
        &installed.greeter_server,
        &[],
        &mut children,
    );
    let db = installed.route_guide_db();
    let route_guide = start_go(
        "route_guide_server",
        &installed.route_guide_server,
        &["-json_db_file".as_ref(), db.as_os_str()],
        &mut children,
    );
    Some(GrpcPeers {
        py,
        go_greeter,
        route_guide,
        installed,
        children,
    })
}

impl GrpcPeers {
    /// What a server wrote so far (for a failing test's message).
    pub fn log(&self, name: &str) -> String {
        self.children
            .iter()
            .filter(|p| p.name == name)
            .map(|p| p.log.text())
            .collect()
    }
}

impl Drop for GrpcPeers {
    fn drop(&mut self) {
        for p in &mut self.children {
            p.stdin.take();
        }
        for p in &mut self.children {
            let end = Instant::now() + Duration::from_secs(5);
            while matches!(p.child.try_wait(), Ok(None)) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

fn start_python(inst: &Installed, children: &mut Vec<Peer>) -> SocketAddr {
    let mut child = Command::new(&inst.python)
        .arg(proto_dir().join("kitchen_server.py"))
        // Port 0: the server binds a free port itself and prints it, so no other process can take it first.
        .arg("127.0.0.1:0")
        .env("PYTHONPATH", &inst.stubs)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the Python gRPC peer");
    let log = Log::default();
    log.drain(child.stderr.take().unwrap());
    let stdin = child.stdin.take();
    // The ready line, read on a thread so that the wait is bounded; the thread then keeps draining stdout.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let out_log = log.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let _ = tx.send(line);
        out_log.drain(out);
    });
    let mut peer = Peer {
        name: "py",
        child,
        stdin,
        log,
    };
    let line = rx.recv_timeout(READY).unwrap_or_default();
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|a| a.parse::<SocketAddr>().ok());
    let Some(addr) = addr else {
        let _ = peer.child.kill();
        let _ = peer.child.wait();
        std::thread::sleep(Duration::from_millis(100));
        panic!(
            "the Python gRPC peer did not start (first line {line:?}); it said:\n{}",
            peer.log.text()
        );
    };
    children.push(peer);
    addr
}

/// Starts a grpc-go example server on a free port. They take only `-port` and listen on ":port" (greeter: every
/// interface) or "localhost:port" (route_guide): the port is found by binding 127.0.0.1:0 and released before
/// the server binds it, so another process may take it in between; the server then fails to bind and exits,
/// which is seen here and retried on another port.
fn start_go(
    name: &'static str,
    bin: &Path,
    args: &[&std::ffi::OsStr],
    children: &mut Vec<Peer>,
) -> SocketAddr {
    let mut said = String::new();
    for _ in 0..3 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        // The wrapper keeps the pipe on fd 3 for a watcher that kills the server at end of file; the server
        // gets /dev/null. The wrapper exits with the server, and then stops the watcher (so that a late end of
        // file cannot kill a recycled pid).
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(concat!(
                "exec 3<&0; \"$@\" </dev/null 3<&- & p=$!; ",
                "(cat <&3 >/dev/null; kill -9 $p) >/dev/null 2>&1 & w=$!; ",
                "exec 3<&- 0</dev/null; wait $p; s=$?; kill $w 2>/dev/null; exit $s"
            ))
            .arg("sh")
            .arg(bin)
            .arg("-port")
            .arg(port.to_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let log = Log::default();
        log.drain(child.stdout.take().unwrap());
        log.drain(child.stderr.take().unwrap());
        let stdin = child.stdin.take();
        let mut peer = Peer {
            name,
            child,
            stdin,
            log,
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let end = Instant::now() + READY;
        let ready = loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
                break true;
            }
            if !matches!(peer.child.try_wait(), Ok(None)) || Instant::now() > end {
                break false;
            }
            std::thread::sleep(Duration::from_millis(25));
        };
        if ready {
            children.push(peer);
            return addr;
        }
        peer.stdin.take();
        let _ = peer.child.kill();
        let _ = peer.child.wait();
        std::thread::sleep(Duration::from_millis(100));
        said = peer.log.text();
    }
    panic!("{name} did not start; it said:\n{said}");
}

/// Installs (or finds installed) the Python venv with its stubs and the Go servers. None: a toolchain is missing
/// (outside CI).
pub fn install() -> Option<Installed> {
    static INSTALLED: OnceLock<Option<Installed>> = OnceLock::new();
    INSTALLED.get_or_init(install_locked).clone()
}

fn install_locked() -> Option<Installed> {
    let tools = proto_dir();
    let Some(go) = find_go() else {
        crate::ci::skip_unless_ci(
            "the gRPC peers need Go >= 1.25 (on PATH or in /usr/local/go/bin)",
        );
        return None;
    };
    let python = std::env::var_os("SLUICE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| "python3".into());
    let has_venv = Command::new(&python)
        .args(["-c", "import venv, ensurepip"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_venv {
        crate::ci::skip_unless_ci(
            "the gRPC peers need python3 with venv and ensurepip (apt-get install python3-venv)",
        );
        return None;
    }
    let home = home();
    std::fs::create_dir_all(&home).expect("create <target>/grpc-peers");
    let _lock = lock(&home.join(".lock"));

    // The venv, keyed on the pinned requirements and the interpreter it is made from.
    let venv = home.join("venv");
    let py_version = output(Command::new(&python).arg("--version"), "python3 --version");
    let requirements = tools.join("requirements.txt");
    let venv_stamp = stamp(&[&requirements], &py_version);
    if read_stamp(&venv) != Some(venv_stamp.clone()) {
        let _ = std::fs::remove_dir_all(&venv);
        run(
            Command::new(&python).args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        );
        run(
            Command::new(venv.join("bin/python"))
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "-q",
                    "-r",
                ])
                .arg(&requirements),
            "pip install -r tools/grpc-peers/requirements.txt",
        );
        write_stamp(&venv, &venv_stamp);
    }
    let vpython = venv.join("bin/python");
    let site_packages = PathBuf::from(
        output(
            Command::new(&vpython).args([
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ]),
            "venv site-packages",
        )
        .trim(),
    );

    // The Python stubs, keyed on the .proto files (and the venv, whose protoc made them).
    let stubs = home.join("stubs");
    let protos = ["kitchen.proto", "helloworld.proto"].map(|p| tools.join(p));
    let stubs_stamp = stamp(&protos.each_ref().map(|p| p.as_path()), &venv_stamp);
    if read_stamp(&stubs) != Some(stubs_stamp.clone()) {
        let _ = std::fs::remove_dir_all(&stubs);
        std::fs::create_dir_all(&stubs).expect("create stubs dir");
        run(
            Command::new(&vpython)
                .args(["-m", "grpc_tools.protoc", "-I."])
                .arg(format!("--python_out={}", stubs.display()))
                .arg(format!("--grpc_python_out={}", stubs.display()))
                .args(["kitchen.proto", "helloworld.proto"])
                .current_dir(&tools),
            "grpc_tools.protoc",
        );
        write_stamp(&stubs, &stubs_stamp);
    }

    // The Go servers, keyed on go.mod/go.sum and the Go version.
    let bin = home.join("bin");
    let go_version = output(
        Command::new(&go).args(["env", "GOVERSION"]),
        "go env GOVERSION",
    );
    let go_stamp = stamp(&[&tools.join("go.mod"), &tools.join("go.sum")], &go_version);
    let greeter_server = bin.join("greeter_server");
    let route_guide_server = bin.join("route_guide_server");
    if read_stamp(&bin) != Some(go_stamp.clone()) {
        let _ = std::fs::remove_dir_all(&bin);
        for (out, pkg) in [
            (&greeter_server, "helloworld/greeter_server"),
            (&route_guide_server, "route_guide/server"),
        ] {
            run(
                Command::new(&go)
                    .args(["build", "-o"])
                    .arg(out)
                    .arg(format!("{EXAMPLES}/{pkg}"))
                    .current_dir(&tools),
                &format!("go build {EXAMPLES}/{pkg}"),
            );
        }
        write_stamp(&bin, &go_stamp);
    }
    // Downloads the module when the cache lacks it (go build did, but the cache may have been cleaned since).
    let dl = output(
        Command::new(&go)
            .args(["mod", "download", "-json", EXAMPLES])
            .current_dir(&tools),
        "go mod download",
    );
    let dl: serde_json::Value = serde_json::from_str(&dl).expect("go mod download -json");
    let examples = PathBuf::from(dl["Dir"].as_str().expect("the module's Dir"));
    Some(Installed {
        python: vpython,
        stubs,
        greeter_server,
        route_guide_server,
        examples,
        site_packages,
    })
}

/// A Go toolchain new enough for tools/grpc-peers/go.mod: `go` on PATH, else go.dev's tarball location.
fn find_go() -> Option<PathBuf> {
    let need = std::fs::read_to_string(proto_dir().join("go.mod"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("go ").map(|v| version(v.trim())))?;
    ["go", "/usr/local/go/bin/go"].into_iter().find_map(|go| {
        let out = Command::new(go).args(["env", "GOVERSION"]).output().ok()?;
        let v = String::from_utf8_lossy(&out.stdout);
        (out.status.success() && version(v.trim().trim_start_matches("go")) >= need)
            .then(|| PathBuf::from(go))
    })
}

fn version(v: &str) -> Vec<u32> {
    v.split(|c: char| !c.is_ascii_digit())
        .map_while(|p| p.parse().ok())
        .collect()
}

/// An exclusive flock on `path`, held until dropped (the kernel drops it if this process dies).
fn lock(path: &Path) -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open install lock");
    let end = Instant::now() + INSTALL_LOCK;
    loop {
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return f,
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                assert!(
                    Instant::now() < end,
                    "{} still locked after {INSTALL_LOCK:?}",
                    path.display()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("flock {}: {e}", path.display()),
        }
    }
}

fn stamp(inputs: &[&Path], extra: &str) -> String {
    let mut h = DefaultHasher::new();
    extra.hash(&mut h);
    for p in inputs {
        std::fs::read(p)
            .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
            .hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

fn read_stamp(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(".sluice-stamp")).ok()
}

/// Written last: a part whose install was interrupted has no stamp and is redone.
fn write_stamp(dir: &Path, s: &str) {
    std::fs::write(dir.join(".sluice-stamp"), s).expect("write stamp");
}

fn run(cmd: &mut Command, what: &str) {
    let t = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("grpc peers: {what} took {:.1?}", t.elapsed());
}

fn output(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
