//! Runs the mock upstream standalone: `cargo run -p sluice-mock --example mock -- --listen 127.0.0.1:1980`.
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: sluice_mock::MockArgs,
}

fn main() -> std::io::Result<()> {
    sluice_mock::run(Cli::parse().args)
}
