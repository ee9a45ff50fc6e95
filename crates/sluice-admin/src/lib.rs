//! Sluice's Admin API, compatible with APISIX's Admin API v3: the same URLs, verbs, envelopes, status codes and
//! `error_msg` texts, so APISIX users' scripts and tools work unchanged. It validates every write (JSON schema,
//! references, plugin checks, and the data plane's own dry run) before committing it to the [`Store`], and serves
//! reads from the store's in-memory snapshot. It never touches the data plane directly: the binary consumes the
//! store's watch channel.
//!
//! Layout: `config` (node settings), `http` (hyper glue, auth), `handlers` (generic verbs), `resources`
//! (declared resources), `patch` (PATCH semantics), `history` (revisions, diff, rollback, status), `dataplane`
//! (live stats, request tester, effective chains: Sluice's own endpoints over the running data plane), `ui` (the
//! dashboard's embedded files at `/ui/`).

mod bulk;
mod config;
mod configs;
mod dataplane;
mod handlers;
mod history;
mod http;
mod patch;
mod resources;
mod ui;

use std::sync::Arc;

use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_store::kv::Store;

pub use config::{AdminConfig, AdminKey, Role, SAMPLE_KEYS};
pub use dataplane::{
    DataPlane, EffectiveError, MatchQuery, Matched, PluginRun, StatsFeed, MAX_SECONDS, MAX_STREAMS,
    SEND_BODY_CAP, SEND_TIMEOUT,
};
pub use http::serve;
pub use ui::{BUILT as UI_BUILT, CSP as UI_CSP};

/// The plugins this build knows: the Admin API checks `plugins` objects through it and serves its schemas.
pub trait PluginCatalog: Send + Sync {
    /// Every plugin name, as `GET /apisix/admin/plugins/list` returns them.
    fn names(&self) -> Vec<String>;
    fn schema(&self, name: &str) -> Option<Value>;
    /// The plugin's own check (schema plus cross-field rules), with APISIX's error text.
    fn check(&self, name: &str, conf: &Value) -> Result<(), String>;
    /// An auth plugin (APISIX `type = 'auth'`): the only kind a consumer credential may hold.
    fn is_auth(&self, _name: &str) -> bool {
        false
    }
    /// The plugin's `consumer_schema` (auth plugins), served for `?schema_type=consumer`.
    fn consumer_schema(&self, _name: &str) -> Option<Value> {
        None
    }
}

/// The APISIX release whose Admin API this build implements. Advertised in the Admin API's `Server` header as
/// `sluice/<version> APISIX/<this>`, the token ADC and other APISIX clients read the version from
/// (`/APISIX\/(.*)/`): without it they assume a future APISIX and may use features no release has.
pub const APISIX_VERSION: &str = sluice_model::APISIX_VERSION;

/// The Admin API's `Server` header: Sluice's own product token first, then the APISIX version it implements.
pub fn server_header() -> String {
    format!(
        "sluice/{} APISIX/{APISIX_VERSION}",
        env!("CARGO_PKG_VERSION")
    )
}

/// The data-plane compiler's dry run over a complete candidate configuration. `Ok(token)`: a non-zero token
/// names the compile the checker kept; the store publishes it with the committed candidate
/// ([`sluice_store::Versioned::token`]) so the data plane can publish that compile instead of compiling again.
pub type Checker = Arc<dyn Fn(&Resources) -> Result<u64, String> + Send + Sync>;

/// Everything the Admin API serves from.
#[derive(Clone)]
pub struct AdminState {
    pub config: Arc<AdminConfig>,
    pub store: Arc<dyn Store>,
    pub checker: Checker,
    pub plugins: Arc<dyn PluginCatalog>,
    /// The revision the data plane has applied; `?wait=applied` waits on it.
    pub applied: tokio::sync::watch::Receiver<u64>,
    /// Serialises validate-then-commit so two writes never validate against the same old state.
    write_lock: Arc<tokio::sync::Mutex<()>>,
    /// The running data plane, for Sluice's stats, match and effective-chain endpoints (`None`: they answer 503).
    pub data_plane: Option<Arc<dyn DataPlane>>,
    /// Bounds concurrent `/stats/stream` answers.
    streams: Arc<tokio::sync::Semaphore>,
    /// This node's `server_info` (`sluice_store::node`): `/nodes` lists it when the store keeps no registry.
    pub server_info: serde_json::Map<String, Value>,
    /// API-driven standalone mode: `/apisix/admin/configs` replaces this configuration.
    pub configs: Option<Arc<sluice_store::api::ApiStandalone>>,
}

impl AdminState {
    pub fn new(
        config: AdminConfig,
        store: Arc<dyn Store>,
        checker: Checker,
        plugins: Arc<dyn PluginCatalog>,
        applied: tokio::sync::watch::Receiver<u64>,
    ) -> AdminState {
        AdminState {
            config: Arc::new(config),
            store,
            checker,
            plugins,
            applied,
            write_lock: Arc::new(tokio::sync::Mutex::new(())),
            data_plane: None,
            streams: dataplane::stream_slots(),
            server_info: Default::default(),
            configs: None,
        }
    }

    /// API-driven standalone mode: `/apisix/admin/configs` serves and replaces `api`'s configuration.
    pub fn with_configs(mut self, api: Arc<sluice_store::api::ApiStandalone>) -> AdminState {
        self.configs = Some(api);
        self
    }

    /// Lists `info` as this node in `/nodes` when the store keeps no node registry.
    pub fn with_server_info(mut self, info: serde_json::Map<String, Value>) -> AdminState {
        self.server_info = info;
        self
    }

    /// Serves the data-plane endpoints (`/stats`, `/match`, ...) from `dp`.
    pub fn with_data_plane(mut self, dp: Arc<dyn DataPlane>) -> AdminState {
        self.data_plane = Some(dp);
        self
    }
}

/// A response: status plus JSON body (`Value::Null` = empty body; a string is sent as plain text).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply { status, body }
    }
    pub fn error(status: u16, msg: impl Into<String>) -> Reply {
        Reply {
            status,
            body: json!({ "error_msg": msg.into() }),
        }
    }
    pub fn not_found() -> Reply {
        Reply::json(404, json!({"message": "Key not found"}))
    }
}
