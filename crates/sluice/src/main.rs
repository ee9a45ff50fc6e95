//! The `sluice` command: `start` runs the gateway; `test`, `reload`, `quit`, `stop` and `import` operate it (as
//! `nginx -t` / `nginx -s` and `apisix test|reload|quit|stop`); `mock` runs a fast origin, `bench` the benchmark
//! suite. Each subcommand lives in its own crate or module; this file only parses arguments and dispatches.

mod apply;
mod catalog;
mod control;
mod dataplane;
mod import;
mod instance;
mod logging;
mod start;
mod test_config;
mod wasm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

// mimalloc: measured ~10% fewer instructions per proxied request than glibc malloc (docs/architecture.md).
// `--features system-alloc` builds with the system allocator instead, so heap profilers that interpose malloc
// (heaptrack, valgrind's dhat and massif) see every allocation (docs/benchmark.md, "Route scale").
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hands the memory the allocator holds free back to the OS: this thread's empty pages, and every thread's pages
/// already returned to mimalloc's arenas (purged now rather than on the allocator's next slow path, which an idle
/// gateway never takes). Called after a large configuration change (bulk load, first start, a big revision),
/// whose peak would otherwise stay resident (issue 16, docs/benchmark.md "### Memory"); never per request.
/// A few milliseconds at 100k routes. Does nothing with `--features system-alloc`.
pub(crate) fn release_memory() {
    #[cfg(not(feature = "system-alloc"))]
    #[allow(unsafe_code)]
    // SAFETY: `mi_collect` takes no pointers and may be called from any thread at any time.
    unsafe {
        libmimalloc_sys::mi_collect(true)
    }
}

/// An apply that took this long changed enough (thousands of resources) for its freed peak to matter.
pub(crate) const LARGE_APPLY: std::time::Duration = std::time::Duration::from_millis(50);

/// After every apply, on the control runtime (never on a worker, never per request): once applies have been
/// quiet for 250 ms, [`release_memory`] on a blocking thread (the Admin API keeps answering meanwhile), and once
/// more 11 s later, after tokio's idle blocking threads (which ran the compiles) have exited and left their pages
/// to the arenas. After a large apply ([`LARGE_APPLY`]: a bulk load, the first start at scale, a big revision) the
/// quiet-period release also runs on the control thread itself, where the Admin API request's body, its ops and
/// the store's previous view were freed (tens of milliseconds at 100k routes, once). So the load's peak goes back
/// to the OS and RSS stays flat across writes. At most one quiet-period timer is pending.
pub(crate) fn release_memory_after_apply(large: bool) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    static APPLIES: AtomicU64 = AtomicU64::new(0);
    static PENDING: AtomicBool = AtomicBool::new(false);
    static LARGE: AtomicBool = AtomicBool::new(false);
    if large {
        LARGE.store(true, Ordering::Release);
    }
    APPLIES.fetch_add(1, Ordering::AcqRel);
    if PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async {
        loop {
            let seen = APPLIES.load(Ordering::Acquire);
            tokio::time::sleep(Duration::from_millis(250)).await;
            if APPLIES.load(Ordering::Acquire) == seen {
                break;
            }
        }
        PENDING.store(false, Ordering::Release);
        if LARGE.swap(false, Ordering::AcqRel) {
            let t = Instant::now();
            release_memory();
            tracing::info!(
                ms = t.elapsed().as_secs_f64() * 1e3,
                "memory released on the control thread after a large apply"
            );
        }
        let _ = tokio::task::spawn_blocking(|| {
            let t = Instant::now();
            release_memory();
            tracing::debug!(
                ms = t.elapsed().as_secs_f64() * 1e3,
                "memory released, applies quiet"
            );
        })
        .await;
        tokio::time::sleep(Duration::from_secs(11)).await;
        let _ = tokio::task::spawn_blocking(release_memory).await;
    });
}

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Sluice: an APISIX-compatible API gateway"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the gateway in the foreground (logs to stderr).
    Start {
        /// Node configuration, APISIX's conf/config.yaml layout. Resources come from apisix.yaml beside it.
        #[arg(short = 'c', long = "config", default_value = "conf/config.yaml")]
        config: PathBuf,
        /// Standalone resources file (default: apisix.yaml next to the config file).
        #[arg(long = "apisix-yaml")]
        apisix_yaml: Option<PathBuf>,
        /// Worker threads (overrides nginx_config.worker_processes).
        #[arg(long)]
        workers: Option<usize>,
    },
    /// Check config.yaml (and apisix.yaml in standalone mode) without starting; exit status 0 when valid.
    Test {
        #[arg(short = 'c', long = "config", default_value = "conf/config.yaml")]
        config: PathBuf,
        /// Standalone resources file (default: apisix.yaml next to the config file).
        #[arg(long = "apisix-yaml")]
        apisix_yaml: Option<PathBuf>,
    },
    /// Ask the running instance to re-read config.yaml (SIGHUP).
    Reload(Signal),
    /// Stop the running instance gracefully: finish requests in flight, then exit (SIGQUIT).
    Quit(Signal),
    /// Stop the running instance at once (SIGTERM).
    Stop(Signal),
    /// Write the resources of an APISIX standalone file (apisix.yaml) through the running instance's Admin API.
    Import {
        #[arg(short = 'c', long = "config", default_value = "conf/config.yaml")]
        config: PathBuf,
        /// The file to import (default: apisix.yaml next to the config file).
        file: Option<PathBuf>,
    },
    /// Run a fast mock upstream (HTTP/1.1 keep-alive, fixed body, optional delay).
    Mock(sluice_mock::MockArgs),
    /// Run the benchmark suite (direct vs Sluice vs nginx/HAProxy) and write a JSON + HTML report.
    Bench(Box<sluice_bench::BenchArgs>),
    /// Print the version.
    Version,
}

/// Which instance `reload`, `quit` and `stop` signal: the pid file config.yaml names, or `--pid-file`.
#[derive(clap::Args)]
struct Signal {
    #[arg(short = 'c', long = "config", default_value = "conf/config.yaml")]
    config: PathBuf,
    /// The running instance's pid file (default: from config.yaml, `sluice.pid_file` or `sluice.pid` beside
    /// config.yaml).
    #[arg(long = "pid-file")]
    pid_file: Option<PathBuf>,
}

fn report(name: &str, r: Result<String, String>) -> ExitCode {
    match r {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn signal(s: Signal, action: instance::Action) -> Result<String, String> {
    let (path, wait) = match s.pid_file {
        Some(p) => (p, 30.0),
        None => {
            let node = start::load(&s.config)
                .map_err(|e| {
                    format!("nothing sent: {e}\n(--pid-file signals the instance without reading config.yaml)")
                })?
                .checked
                .config;
            let wait = node.sluice.graceful_shutdown_timeout + 5.0;
            (instance::pid_path(&s.config, &node), wait)
        }
    };
    instance::signal(&path, action, std::time::Duration::from_secs_f64(wait))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Start {
            config,
            apisix_yaml,
            workers,
        } => {
            if let Err(e) = init_logging(&config) {
                eprintln!("sluice: {e}");
                return ExitCode::FAILURE;
            }
            match start::run(&config, apisix_yaml, workers) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("sluice: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Test {
            config,
            apisix_yaml,
        } => match test_config::run(&config, apisix_yaml) {
            Ok(lines) => {
                for l in lines {
                    println!("{l}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice test: {e}");
                eprintln!("sluice test: configuration test failed");
                ExitCode::FAILURE
            }
        },
        Cmd::Reload(s) => report("reload", signal(s, instance::Action::Reload)),
        Cmd::Quit(s) => report("quit", signal(s, instance::Action::Quit)),
        Cmd::Stop(s) => report("stop", signal(s, instance::Action::Stop)),
        Cmd::Import { config, file } => report("import", import::run(&config, file)),
        Cmd::Mock(args) => match sluice_mock::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice mock: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Bench(args) => match sluice_bench::run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice bench: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Version => {
            println!("sluice {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
    }
}

/// The error log: level and destination from config.yaml (`SLUICE_LOG`/`RUST_LOG` override the level); see
/// `logging.rs`.
fn init_logging(config: &std::path::Path) -> Result<(), String> {
    logging::init(config)
}
