//! A proxy-wasm host: filters written for Envoy, APISIX or Kong with a proxy-wasm SDK run as Sluice plugins.
//!
//! - Each module declared in config.yaml's `wasm.plugins` ([`Spec`]) is read and compiled once at startup with
//!   wasmtime (cranelift), checked for a proxy-wasm 0.2.x ABI export, and instantiated once to catch missing
//!   exports early. [`install`] then registers it as a plugin of its name in `sluice_plugins::registry`: routes,
//!   services, global rules, consumers and the Admin API find it like a built-in one.
//! - A route's `{"conf": ...}` is checked at write time by running `proxy_on_configure` with it in a fresh instance
//!   (a `false` or a trap refuses the write), and compiled per route when the snapshot is built.
//! - Instances are pooled per worker thread and per compiled plugin (`pool.rs`): a request takes one, creates an
//!   HTTP context in it, and gives it back when the request context is dropped. No lock is taken on the request
//!   path; an instance that trapped is dropped, not reused.
//! - Every call into a filter has a time limit (epoch interruption: a background thread ticks the engine every
//!   [`TICK`]) and every instance a memory cap; past either the call traps. A trap answers 500 (or sets a
//!   response's status to 500 in header_filter) and is logged; the process and the worker go on.
//!
//! The ABI (`abi.rs`) is proxy-wasm 0.2.1 as current SDKs export it (0.2.0 modules, such as the AssemblyScript
//! SDK's, use the same calls). See docs/wasm.md for the host functions and properties.

mod abi;
mod headers;
mod plugin;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::{Config, Engine, InstancePre, Linker, Module as WasmModule, OptLevel};

pub use abi::{metric_values, render_metrics};

/// How often the engine's epoch advances: the resolution of the per-call time limit.
pub const TICK: Duration = Duration::from_millis(5);
/// Defaults for [`Spec::call_timeout`] and [`Spec::memory_limit`].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);
pub const DEFAULT_MEMORY_LIMIT: usize = 64 << 20;
/// Default for [`Spec::max_body_size`].
pub const DEFAULT_MAX_BODY_SIZE: usize = 4 << 20;

/// One entry of config.yaml's `wasm.plugins`.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub priority: i32,
    pub file: PathBuf,
    /// APISIX's `http_request_phase: rewrite` (default `access`): where `proxy_on_request_headers` runs.
    pub rewrite_phase: bool,
    /// The longest one call into the filter may run.
    pub call_timeout: Duration,
    /// The most linear memory one instance may have.
    pub memory_limit: usize,
    /// The largest body the filter may buffer or set (a response body it asked for, a request or response body
    /// it replaces).
    pub max_body_size: usize,
}

/// The engine every module is compiled with, and its epoch ticker.
fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let mut c = Config::new();
        c.epoch_interruption(true)
            .cranelift_opt_level(OptLevel::Speed)
            .max_wasm_stack(1 << 20);
        let engine = match Engine::new(&c) {
            Ok(e) => e,
            Err(e) => panic!("wasmtime engine: {e:#}"),
        };
        let ticker = engine.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-wasm-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                ticker.increment_epoch();
            });
        if let Err(e) = spawned {
            panic!("wasm epoch thread: {e}");
        }
        engine
    })
}

/// A compiled module, shared by every route that uses it.
pub(crate) struct Module {
    pub(crate) name: &'static str,
    pub(crate) priority: i32,
    pub(crate) rewrite: bool,
    pub(crate) pre: InstancePre<abi::Host>,
    /// Epoch ticks one call may run.
    pub(crate) ticks: u64,
    pub(crate) memory_limit: usize,
    pub(crate) max_body_size: usize,
    /// The module exports `proxy_on_response_body`.
    pub(crate) response_body: bool,
    /// Instances created so far (all workers, all routes).
    pub(crate) created: AtomicU64,
}

/// Reads and compiles the modules. Errors name the plugin and the file: a file that is missing, is not wasm,
/// exports no proxy-wasm 0.2 ABI, or fails to start.
pub fn load(specs: &[Spec]) -> Result<Vec<Arc<dyn ModuleInfo>>, String> {
    let mut out: Vec<Arc<dyn ModuleInfo>> = Vec::with_capacity(specs.len());
    for s in specs {
        out.push(Arc::new(plugin::External(Arc::new(compile(s)?))));
    }
    Ok(out)
}

/// What the binary and the tests can ask of a loaded module.
pub trait ModuleInfo: Send + Sync {
    fn name(&self) -> &'static str;
    /// Instances created so far, on every worker and route.
    fn instances_created(&self) -> u64;
    fn as_external(self: Arc<Self>) -> Box<dyn sluice_plugins::registry::External>;
}

/// Loads the modules and registers them as plugins (once per process, before any configuration is compiled).
pub fn install(specs: &[Spec]) -> Result<Vec<Arc<dyn ModuleInfo>>, String> {
    for (i, s) in specs.iter().enumerate() {
        if sluice_plugins::registry::find(&s.name).is_some()
            || specs[..i].iter().any(|o| o.name == s.name)
        {
            return Err(format!(
                "wasm plugin {}: plugin name {:?} is already taken",
                s.name, s.name
            ));
        }
    }
    let mods = load(specs)?;
    sluice_plugins::registry::install_external(
        mods.iter().map(|m| m.clone().as_external()).collect(),
    )?;
    Ok(mods)
}

fn compile(s: &Spec) -> Result<Module, String> {
    let name = &s.name;
    let file = s.file.display();
    let bytes = std::fs::read(&s.file)
        .map_err(|e| format!("wasm plugin {name}: cannot read {file}: {e}"))?;
    if !bytes.starts_with(b"\0asm") {
        return Err(format!(
            "wasm plugin {name}: {file} is not a wasm module (no \\0asm header)"
        ));
    }
    let engine = engine();
    let module = WasmModule::from_binary(engine, &bytes)
        .map_err(|e| format!("wasm plugin {name}: {file} is not a valid wasm module: {e:#}"))?;
    let abi_ok = module.exports().any(|e| {
        matches!(
            e.name(),
            "proxy_abi_version_0_2_0" | "proxy_abi_version_0_2_1"
        )
    });
    if !abi_ok {
        return Err(format!(
            "wasm plugin {name}: {file} exports no proxy-wasm ABI version Sluice implements (proxy_abi_version_0_2_0 or _0_2_1)"
        ));
    }
    let mut linker = Linker::new(engine);
    abi::link(&mut linker).map_err(|e| format!("wasm plugin {name}: {e:#}"))?;
    linker
        .define_unknown_imports_as_traps(&module)
        .map_err(|e| format!("wasm plugin {name}: {e:#}"))?;
    let pre = linker
        .instantiate_pre(&module)
        .map_err(|e| format!("wasm plugin {name}: {file}: {e:#}"))?;
    let ticks = (s.call_timeout.as_millis() / TICK.as_millis()).max(1) as u64 + 1;
    let m = Module {
        name: Box::leak(name.clone().into_boxed_str()),
        priority: s.priority,
        rewrite: s.rewrite_phase,
        pre,
        ticks,
        memory_limit: s.memory_limit,
        max_body_size: s.max_body_size,
        response_body: module
            .exports()
            .any(|e| e.name() == "proxy_on_response_body"),
        created: AtomicU64::new(0),
    };
    // One instance now, so a module that cannot start fails the startup rather than its first request.
    plugin::Vm::new(&m, bytes::Bytes::new(), false)
        .map_err(|e| format!("wasm plugin {name}: {file} does not start: {e}"))?;
    m.created.store(0, Ordering::Relaxed);
    Ok(m)
}
