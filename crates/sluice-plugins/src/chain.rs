//! Compiled plugin chains and the runner that walks them. A chain is built once per route per configuration
//! snapshot; running a phase is a loop over a `Vec` guarded by one bitmask test.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::registry::{self, Entry};
use crate::{Ctx, Flow, LogInfo, Phase, PhaseMask, Plugin};

/// State that outlives configuration snapshots: rate-limit counters, metric families, client pools. Created once by
/// the binary and handed to every compilation, so a reload neither resets a limit nor loses a metric.
#[derive(Default)]
pub struct Shared {}

/// What plugins may consult while compiling: the snapshot's consumers, the node's plugin settings and the
/// long-lived [`Shared`] state.
pub struct CompileEnv<'a> {
    pub shared: &'a Shared,
    pub consumers: &'a [sluice_model::Consumer],
    /// `plugin_attr` from config.yaml.
    pub plugin_attr: Option<&'a Map<String, Value>>,
}

pub struct Chain {
    plugins: Vec<Arc<dyn Plugin>>,
    mask: PhaseMask,
}

impl Chain {
    /// Compiles a merged `plugins` object. `Ok(None)` when it is empty (or every plugin is `_meta.disable`d), so a
    /// route without plugins carries no chain at all.
    pub fn compile(
        plugins: &Map<String, Value>,
        env: &CompileEnv<'_>,
    ) -> Result<Option<Arc<Chain>>, String> {
        let mut list: Vec<Arc<dyn Plugin>> = Vec::with_capacity(plugins.len());
        for (name, conf) in plugins {
            let entry: &Entry =
                registry::find(name).ok_or_else(|| format!("unknown plugin [{name}]"))?;
            let disabled = conf
                .get("_meta")
                .and_then(|m| m.get("disable"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            (entry.check)(conf).map_err(|e| {
                format!("failed to check the configuration of plugin {name} err: {e}")
            })?;
            if disabled {
                continue;
            }
            list.push((entry.compile)(conf, env).map_err(|e| format!("plugin {name}: {e}"))?);
        }
        if list.is_empty() {
            return Ok(None);
        }
        // Higher priority runs first, as in APISIX; a stable sort keeps ties in configuration order.
        list.sort_by_key(|p| std::cmp::Reverse(p.priority()));
        let mask = list
            .iter()
            .fold(PhaseMask::default(), |m, p| m.union(p.phases()));
        Ok(Some(Arc::new(Chain {
            plugins: list,
            mask,
        })))
    }

    pub fn mask(&self) -> PhaseMask {
        self.mask
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.plugins.iter().map(|p| p.name())
    }

    /// Runs rewrite, then access, then before_proxy over all plugins, stopping at the first response.
    pub fn run_request(&self, ctx: &mut Ctx<'_>) -> Flow {
        for (phase, call) in [
            (
                Phase::Rewrite,
                <dyn Plugin>::rewrite as fn(&dyn Plugin, &mut Ctx<'_>) -> Flow,
            ),
            (Phase::Access, <dyn Plugin>::access),
            (Phase::BeforeProxy, <dyn Plugin>::before_proxy),
        ] {
            if !self.mask.has(phase) {
                continue;
            }
            for p in &self.plugins {
                if p.phases().has(phase) {
                    if let Flow::Respond(r) = call(p.as_ref(), ctx) {
                        tracing::debug!(
                            plugin = p.name(),
                            status = r.status,
                            "plugin exits with http status code"
                        );
                        return Flow::Respond(r);
                    }
                }
            }
        }
        Flow::Continue
    }

    pub fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        if !self.mask.has(Phase::HeaderFilter) {
            return;
        }
        for p in &self.plugins {
            if p.phases().has(Phase::HeaderFilter) {
                p.header_filter(ctx, status);
            }
        }
    }

    pub fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        if !self.mask.has(Phase::Log) {
            return;
        }
        for p in &self.plugins {
            if p.phases().has(Phase::Log) {
                p.log(ctx, info);
            }
        }
    }
}
