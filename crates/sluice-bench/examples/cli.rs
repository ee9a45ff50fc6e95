//! Stand-in for the `sluice` binary until it wires the subcommands: `mock` and `bench` only
//! (`cargo run --release -p sluice-bench --example cli -- bench --sluice-bin target/release/sluice`).
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Mock(sluice_mock::MockArgs),
    Bench(Box<sluice_bench::BenchArgs>),
}

fn main() {
    let r = match Cli::parse().cmd {
        Cmd::Mock(a) => sluice_mock::run(a).map_err(|e| e.to_string()),
        Cmd::Bench(a) => sluice_bench::run(*a),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
