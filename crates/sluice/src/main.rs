//! The `sluice` command: `start` runs the gateway, `mock` a fast origin, `bench` the benchmark suite.
//! Each subcommand lives in its own crate or module; this file only parses arguments and dispatches.

mod apply;
mod catalog;
mod control;
mod logging;
mod start;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

// mimalloc: measured ~10% fewer instructions per proxied request than glibc malloc (docs/architecture.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Run a fast mock upstream (HTTP/1.1 keep-alive, fixed body, optional delay).
    Mock(sluice_mock::MockArgs),
    /// Run the benchmark suite (direct vs Sluice vs nginx/HAProxy) and write a JSON + HTML report.
    Bench(Box<sluice_bench::BenchArgs>),
    /// Print the version.
    Version,
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
