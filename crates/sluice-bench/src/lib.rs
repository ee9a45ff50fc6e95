//! `sluice bench`: the reproducible benchmark suite. It starts the mock upstream and the gateway
//! (or uses given addresses), configures each scenario, drives load with its own generator (or wrk
//! / h2load), measures requests/s, latency percentiles, errors by kind, bytes/s, gateway CPU per
//! request and peak RSS, optionally nginx and HAProxy side by side and callgrind instruction
//! counts, and writes DIR/report.json + DIR/report.html. The method is in docs/benchmark.md.
//! It deliberately never tunes the machine (governor, IRQs); it records what it finds instead.

pub mod apply;
pub mod callgrind;
pub mod cluster;
pub mod drivers;
pub mod dubbo;
pub mod gateway;
pub mod grpc;
pub mod loadgen;
pub mod noise;
pub mod preset;
pub mod procinfo;
pub mod procs;
pub mod progress;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod stats;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use drivers::Driver;
use sluice_mock::delay::parse_duration;

/// Command-line arguments of `sluice bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Scenario to run (repeatable; `prefix*` globs). Default: the short matrix.
    #[arg(long = "scenario", short = 's', value_name = "NAME")]
    pub scenarios: Vec<String>,
    /// Run every scenario (long).
    #[arg(long)]
    pub full: bool,
    /// List scenarios and exit.
    #[arg(long)]
    pub list: bool,
    /// Also run the callgrind instruction-count scenario.
    #[arg(long)]
    pub callgrind: bool,
    /// Output directory for report.json, report.html and logs.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Measured time per run (default 10 s: long enough for a stable p99.9 and a foreign-CPU sample worth
    /// a flag; `--quick` makes it 1 s).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Reproduce a published report's method and print its figure beside ours: apisix, api7, shenyu,
    /// ngxway, pixiu (see docs/benchmark.md, "Presets").
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// A plumbing run, seconds not minutes: 1 s rounds (unless --duration), 0.2 s warm-up, 1 round,
    /// count-bound runs capped at 10,000 requests. Its figures are not for comparison.
    #[arg(long)]
    pub quick: bool,
    /// Warm-up before each measured run (not counted).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Interleaved rounds per scenario (A B C A B C ...); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Load generator for closed-loop timed runs.
    #[arg(long, value_enum, default_value = "builtin")]
    pub driver: Driver,
    /// Load generator threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Mock upstream threads.
    #[arg(long, default_value_t = 1)]
    pub mock_threads: usize,
    /// Run Sluice with its access log on (default format, to `access.log` in the run's directory). Off by
    /// default, like the nginx it is compared with (`access_log off`).
    #[arg(long)]
    pub sluice_access_log: bool,
    /// Mock response body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub body_size: usize,
    /// Per-request timeout.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// How long to wait for a target to answer 200 before skipping it.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub ready_timeout: Duration,
    /// Gateway binary (default: this executable).
    #[arg(long)]
    pub sluice_bin: Option<PathBuf>,
    /// Use this upstream instead of starting the mock.
    #[arg(long)]
    pub upstream: Option<SocketAddr>,
    /// Use this already configured gateway instead of starting one.
    #[arg(long)]
    pub gateway: Option<SocketAddr>,
    /// CPUs for the gateway / nginx / HAProxy (taskset list; `none` to not pin). Default: the last CPU.
    #[arg(long)]
    pub pin_gateway: Option<String>,
    /// CPUs for the load generator. Default: all but the last CPU.
    #[arg(long)]
    pub pin_generator: Option<String>,
    /// CPUs for the mock. Default: same as the generator.
    #[arg(long)]
    pub pin_mock: Option<String>,
    /// Pin nothing.
    #[arg(long)]
    pub no_pin: bool,
    /// The `plugins` object (JSON) every Sluice route of the run carries, e.g. `'{"mocking": {"response_example":
    /// "x"}}'`: a plugin's per-request cost is this run's figure minus a run without it.
    #[arg(long, value_name = "JSON")]
    pub route_plugins: Option<String>,
    /// YAML appended to every Sluice node's `config.yaml` (e.g. a `wasm:` section declaring the modules
    /// `--route-plugins` uses; give their files as absolute paths).
    #[arg(long, value_name = "FILE")]
    pub node_config_append: Option<std::path::PathBuf>,
    /// An extra request header the generator sends, `Name: value` (repeatable).
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// Do not run nginx / HAProxy side by side even when installed.
    #[arg(long)]
    pub no_peers: bool,
    /// Speak h2c (HTTP/2 prior knowledge) from the generator to every target (nginx and HAProxy
    /// listen with h2c too; the gateway must support it).
    #[arg(long)]
    pub h2c: bool,
}

fn pin_choice(given: &Option<String>, default: Option<String>, no_pin: bool) -> Option<String> {
    if no_pin {
        return None;
    }
    match given.as_deref() {
        Some("none") => None,
        Some(c) => Some(c.to_string()),
        None => default,
    }
}

/// Runs the benchmark described by `args`; blocking.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let started = Instant::now();
    let mut args = args;
    if args.quick {
        args.warmup = args.warmup.min(Duration::from_millis(200));
        args.rounds = 1;
    }
    let duration = args.duration.unwrap_or(if args.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    });
    let preset = args.preset.as_deref().map(preset::find).transpose()?;
    let mut selected = match preset {
        Some(p) => preset::expand(p, duration)?,
        None => scenario::select(&args.scenarios, args.full, duration)?,
    };
    if args.quick {
        for s in &mut selected {
            if let loadgen::Stop::Requests(n) = s.stop {
                let n = n.min(10_000);
                s.stop = loadgen::Stop::Requests(n);
                s.requests = Some(n);
            }
        }
    }
    if args.callgrind && !selected.iter().any(|s| s.callgrind) {
        selected.extend(scenario::select(&["instructions".into()], false, duration)?);
    }
    if let Some(p) = &args.route_plugins {
        let v: serde_json::Value =
            serde_json::from_str(p).map_err(|e| format!("--route-plugins: {e}"))?;
        if !v.is_object() {
            return Err("--route-plugins: want a JSON object".into());
        }
    }
    if let Some(f) = &args.node_config_append {
        let text = std::fs::read_to_string(f)
            .map_err(|e| format!("--node-config-append {}: {e}", f.display()))?;
        gateway::append_to_node_config(text);
    }
    let mut headers = Vec::new();
    for h in &args.headers {
        let (n, v) = h
            .split_once(':')
            .ok_or_else(|| format!("--header {h:?}: want `Name: value`"))?;
        headers.push((n.trim().to_owned(), v.trim().to_owned()));
    }
    for s in &mut selected {
        s.route_plugins = args.route_plugins.clone();
        s.extra_headers = headers.clone();
    }
    if args.list {
        for s in scenario::all(duration) {
            let short = if scenario::SHORT.contains(&s.name.as_str()) {
                " [short]"
            } else {
                ""
            };
            println!("{:<28} {}{short}", s.name, s.description);
        }
        return Ok(());
    }
    // Collected before pinning: available_parallelism follows this process's affinity.
    let environment = procinfo::Environment::collect();
    let n = procinfo::cores();
    let (def_gw, def_gen) = if n >= 2 {
        (Some(format!("{}", n - 1)), Some(format!("0-{}", n - 2)))
    } else {
        (None, None)
    };
    let pin_gateway = pin_choice(&args.pin_gateway, def_gw, args.no_pin);
    let pin_generator = pin_choice(&args.pin_generator, def_gen, args.no_pin);
    let pin_mock = pin_choice(&args.pin_mock, pin_generator.clone(), args.no_pin);
    if let Some(cpus) = &pin_generator {
        procinfo::pin_self(cpus)?;
    }
    let self_bin = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let work = args.out.join("work");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let work = work.canonicalize().map_err(|e| e.to_string())?;
    let ctx = runner::Ctx {
        work,
        sluice_bin: args.sluice_bin.clone().unwrap_or_else(|| self_bin.clone()),
        self_bin,
        upstream: args.upstream,
        gateway: args.gateway,
        duration,
        warmup: args.warmup,
        rounds: args.rounds.max(1),
        driver: args.driver,
        gen_threads: args.threads.max(1),
        mock_threads: args.mock_threads.max(1),
        body_size: args.body_size,
        timeout: args.timeout,
        pin_gateway: pin_gateway.clone(),
        pin_mock: pin_mock.clone(),
        peers: !args.no_peers,
        ready_timeout: args.ready_timeout,
        h2c: args.h2c,
        access_log: args.sluice_access_log,
        cores: n,
    };
    let mut progress =
        progress::Progress::new(selected.iter().map(|s| runner::steps(&ctx, s)).sum());
    let mut mock: Option<runner::Mock> = None;
    let mut reports = Vec::new();
    for s in &selected {
        if s.grpc_transcode {
            // Its own origin (the grpc-go greeter): the mock stays as it is.
            reports.push(grpc::run(&ctx, s, &mut progress));
            continue;
        }
        if s.dubbo {
            // Its own origin (a dubbo-go provider).
            reports.push(dubbo::run(&ctx, s, &mut progress));
            continue;
        }
        let m = match runner::Mock::ensure(mock.take(), &ctx, s) {
            Ok(m) => m,
            Err(e) => {
                reports.push(runner::finish(
                    s,
                    Vec::new(),
                    vec![format!("mock failed: {e}")],
                ));
                progress.advance(runner::steps(&ctx, s));
                continue;
            }
        };
        let r = if s.callgrind {
            callgrind::run(&ctx, s, &m, &mut progress)
        } else if s.cluster.is_some() {
            cluster::run(&ctx, s, &m, &mut progress)
        } else if s.admin.is_some() {
            apply::run(&ctx, s, &m, &mut progress)
        } else {
            runner::run_scenario(&ctx, s, &m, &mut progress)
        };
        reports.push(r);
        mock = Some(m);
    }
    drop(mock);
    progress.finish();
    let mut report = report::Report {
        schema: report::SCHEMA,
        generated_at: report::utc_now(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        total_seconds: runner::secs_since(started),
        environment,
        settings: report::Settings {
            duration_s: duration.as_secs_f64(),
            warmup_s: args.warmup.as_secs_f64(),
            rounds: ctx.rounds,
            driver: args.driver.name().into(),
            generator_threads: ctx.gen_threads,
            mock_threads: ctx.mock_threads,
            body_size: ctx.body_size,
            timeout_s: ctx.timeout.as_secs_f64(),
            pin_gateway,
            pin_generator,
            pin_mock,
            sluice_bin: ctx.sluice_bin.display().to_string(),
            h2c: ctx.h2c,
        },
        scenarios: reports,
        preset: None,
    };
    report.compute_baselines();
    report.preset = preset.map(|p| preset::PresetReport::new(p, &report.scenarios));
    report.write(&args.out)?;
    print!("{}", report.text_summary());
    if let Some(p) = &report.preset {
        print!("{}", p.text());
    }
    eprintln!(
        "report: {}/report.html, {}/report.json",
        args.out.display(),
        args.out.display()
    );
    Ok(())
}
