//! [`Shared`]: plugin state that outlives configuration snapshots. The binary creates one and hands it to every
//! compilation, so a reload neither resets a rate limit nor loses a metric. It owns the counter stores and metric
//! registry; the plugins that use them own their semantics.

use std::sync::Arc;

use crate::counters::{BucketStore, ConnStore, WindowStore};
use crate::prometheus::Metrics;

/// Long-lived plugin state (see the module docs).
#[derive(Default)]
pub struct Shared {
    /// limit-count's fixed windows (policy `local`), shared by every worker thread.
    pub(crate) windows: Arc<WindowStore>,
    /// limit-conn's in-flight counts.
    pub(crate) conns: Arc<ConnStore>,
    /// limit-req's leaky buckets.
    pub(crate) buckets: Arc<BucketStore>,
    /// limit-count's Redis backends and their lease threads.
    pub(crate) remote: Arc<crate::limit_count::remote::RemoteStore>,
    /// limit-conn's Redis backends and their threads.
    pub(crate) conn_remote: Arc<crate::redis_lease::Leasers>,
    /// limit-req's Redis backends and their threads.
    pub(crate) req_remote: Arc<crate::redis_lease::Leasers>,
    /// file-logger's writer threads.
    pub(crate) writers: Arc<crate::file_logger::Writers>,
    /// The loggers' batch processors (http-logger, kafka-logger, tcp-logger, ...).
    pub(crate) batches: Arc<crate::batch_processor::Processors>,
    /// opentelemetry's and zipkin's span exporters.
    pub(crate) exporters: Arc<crate::trace::Exporters>,
    /// prometheus' metric families.
    pub(crate) metrics: Arc<Metrics>,
    /// `plugin_attr` from config.yaml: node settings every compilation sees (see [`Shared::with_plugin_attr`]).
    pub(crate) plugin_attr: Option<serde_json::Map<String, serde_json::Value>>,
    /// api-breaker's counts per host + URI.
    pub(crate) breakers: Arc<crate::api_breaker::Breakers>,
    /// proxy-cache's zones (`apisix.proxy_cache`), kept across reloads with what they hold.
    pub(crate) proxy_cache: Arc<crate::proxy_cache::Zones>,
}

impl Shared {
    /// Node-wide `plugin_attr` (config.yaml), read by plugins when they compile; fixed for the process's life,
    /// as APISIX reads it at start.
    pub fn with_plugin_attr(
        mut self,
        attr: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Self {
        self.plugin_attr = attr;
        self
    }

    /// proxy-cache's zones from config.yaml's `apisix.proxy_cache` (checked with
    /// [`crate::ProxyCacheZones::from_conf`]); without it, APISIX's default zones.
    /// The zones are shared: a throwaway `Shared` that checks configurations sees the same zones.
    pub fn with_proxy_cache(mut self, zones: Arc<crate::ProxyCacheZones>) -> Self {
        self.proxy_cache = zones;
        self
    }

    /// The Prometheus registry (for the exporter and for the binary's own gauges).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Spans the tracing plugins' exporters (exported, dropped on a full queue, lost to a failed POST).
    pub fn trace_spans(&self) -> (u64, u64, u64) {
        self.exporters.counts()
    }

    /// A logger's entry counts (pushed, discarded, sent, failed...) across its batch processors.
    pub fn log_stats(&self, plugin: &'static str) -> Arc<crate::batch_processor::LogStats> {
        self.batches.stats(plugin)
    }

    /// Live limit-count windows (for tests and diagnostics).
    pub fn limit_count_keys(&self) -> usize {
        self.windows.len()
    }
}
