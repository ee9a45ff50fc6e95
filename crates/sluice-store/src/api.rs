//! APISIX's API-driven standalone mode (`role: traditional` with `config_provider: yaml`): no file and no store;
//! the whole configuration arrives through `PUT /apisix/admin/configs` and lives in memory. This holds what was
//! last accepted (the document with its per-resource `*_conf_version`s, `X-Digest` and `X-Last-Modified`) and
//! publishes it to the data plane; the Admin API side (`sluice-admin/src/configs.rs`) decides what to accept.
//! Starts empty, as APISIX does.

use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::kv::{BoxFuture, Op, Revision, Snapshot, Store, StoreError};
use crate::{ConfigRx, ConfigTx, Versioned};

/// The resource kinds of an APISIX standalone document, as `/configs` names them.
pub const KINDS: &[&str] = &[
    "routes",
    "services",
    "upstreams",
    "consumers",
    "consumer_groups",
    "credentials",
    "global_rules",
    "plugin_configs",
    "plugin_metadata",
    "protos",
    "secrets",
    "ssls",
    "stream_routes",
];

pub struct ApiStandalone {
    tx: ConfigTx,
    /// The accepted document: `{kind: [items], kind_conf_version: n, "X-Digest", "X-Last-Modified"}`; `None`
    /// until the first accepted PUT.
    doc: Mutex<Option<Map<String, Value>>>,
    /// One PUT at a time: each is compared with the one before it.
    pub writing: tokio::sync::Mutex<()>,
}

impl Default for ApiStandalone {
    fn default() -> Self {
        ApiStandalone {
            tx: watch::channel(Arc::new(Versioned::default())).0,
            doc: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
        }
    }
}

impl ApiStandalone {
    /// The accepted document, or `None` before the first PUT.
    pub fn document(&self) -> Option<Map<String, Value>> {
        self.doc.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the configuration: `resources` (already checked) goes to the data plane as the next revision,
    /// `doc` is what GET answers from now on. Returns the revision.
    pub fn publish(&self, doc: Map<String, Value>, resources: sluice_model::Resources) -> u64 {
        let revision = self.tx.borrow().revision + 1;
        *self.doc.lock().unwrap_or_else(|p| p.into_inner()) = Some(doc);
        self.tx.send_replace(Arc::new(Versioned {
            revision,
            resources,
            token: 0,
        }));
        revision
    }
}

fn unsupported() -> StoreError {
    StoreError::Unsupported(
        "standalone mode: the configuration is replaced as a whole through /apisix/admin/configs"
            .into(),
    )
}

/// Resource URLs are not served in this mode; the trait gives the data plane its feed and the Admin API its
/// revision.
impl Store for ApiStandalone {
    fn backend(&self) -> &'static str {
        "yaml"
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        Arc::new(Snapshot {
            revision: self.tx.borrow().revision,
            ..Snapshot::default()
        })
    }

    fn commit(&self, _ops: Vec<Op>) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async { Err(unsupported()) })
    }

    fn history(&self, _: u64, _: usize) -> BoxFuture<'_, Result<Vec<Revision>, StoreError>> {
        Box::pin(async { Err(unsupported()) })
    }

    fn subscribe(&self) -> ConfigRx {
        self.tx.subscribe()
    }
}
