//! Live apply: turns each configuration a provider publishes into the data plane's next snapshot, compiling
//! each accepted write once. The Admin API's dry run prepares the candidate as the successor of the serving
//! snapshot (unchanged routes are reused and only fresh ones validated by the router, see
//! `sluice_proxy::Snapshot::prepare_next`) and keeps it under a token; when the store publishes exactly that
//! candidate (same token), the applier finishes the kept one (the router over every route) instead of compiling
//! again. Anything else (etcd watch events, a candidate that lost a race) compiles as the successor of the
//! serving snapshot. The applier works off the control thread and only ever looks at the newest published
//! configuration, so writes that land during one router build are applied by the next one together. A change
//! of discovered nodes (`sluice-discovery`) recompiles the current configuration the same way: upstreams whose
//! nodes did not change keep their runtime. Not here: the providers and the Admin API themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_model::{Discovery, Resources};
use sluice_plugins::Shared;
use sluice_proxy::{Gateway, Prepared, Snapshot};
use sluice_store::{ConfigRx, Versioned};

pub struct Applier {
    shared: Arc<Shared>,
    gateway: Gateway,
    /// The newest dry run's prepared compile, by token.
    kept: Mutex<Option<(u64, Prepared)>>,
    tokens: AtomicU64,
    /// Nodes of upstreams with a `discovery_type` (config.yaml's `discovery`).
    discovery: Option<Arc<dyn Discovery>>,
}

impl Applier {
    pub fn new(
        shared: Arc<Shared>,
        gateway: Gateway,
        discovery: Option<Arc<dyn Discovery>>,
    ) -> Arc<Applier> {
        Arc::new(Applier {
            shared,
            gateway,
            kept: Mutex::new(None),
            tokens: AtomicU64::new(0),
            discovery,
        })
    }

    fn discovery(&self) -> Option<&dyn Discovery> {
        self.discovery.as_deref()
    }

    fn kept(&self) -> MutexGuard<'_, Option<(u64, Prepared)>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Admin API's dry run: prepares `res` with the live plugin state and keeps the result; returns its token.
    pub fn dry_run(&self, res: &Resources) -> Result<u64, String> {
        let prev = self.gateway.snapshot();
        let snap =
            Snapshot::prepare_discovered(res, 0, &self.shared, Some(&prev), self.discovery())?;
        let token = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
        *self.kept() = Some((token, snap));
        Ok(token)
    }

    /// The snapshot for `v`: the kept dry-run compile when `v` is exactly its candidate, else a fresh compile.
    /// The second value says whether a compile was saved.
    pub fn next_snapshot(&self, v: &Versioned) -> Result<(Snapshot, bool), String> {
        if v.token != 0 {
            let mut kept = self.kept();
            match kept.take() {
                Some((t, p)) if t == v.token => {
                    drop(kept);
                    let mut s = p.finish()?;
                    s.revision = v.revision;
                    return Ok((s, true));
                }
                // A newer dry run stays for its own commit; an older one can never match again.
                Some((t, s)) if t > v.token => *kept = Some((t, s)),
                _ => {}
            }
        }
        self.compile_fresh(v).map(|s| (s, false))
    }

    /// `v` compiled as the successor of the serving snapshot, without looking at kept dry runs.
    fn compile_fresh(&self, v: &Versioned) -> Result<Snapshot, String> {
        let prev = self.gateway.snapshot();
        Snapshot::compile_discovered(
            &v.resources,
            v.revision,
            &self.shared,
            Some(&prev),
            self.discovery(),
        )
    }

    /// Follows `rx` until it closes: compile (or take), publish, report the applied revision. A change of
    /// `discovered` (discovered nodes) recompiles the current configuration.
    pub async fn run(
        self: Arc<Self>,
        mut rx: ConfigRx,
        applied: tokio::sync::watch::Sender<u64>,
        mut discovered: Option<tokio::sync::watch::Receiver<u64>>,
    ) {
        loop {
            let nodes_changed = async {
                match discovered.as_mut() {
                    Some(d) => d.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            // Some(true): discovered nodes changed; Some(false): discovery ended; None: a configuration change.
            let nodes = tokio::select! {
                r = rx.changed() => {
                    if r.is_err() {
                        break;
                    }
                    None
                }
                ok = nodes_changed => Some(ok),
            };
            let fresh = match nodes {
                Some(false) => {
                    discovered = None;
                    continue;
                }
                Some(true) => {
                    if let Some(d) = discovered.as_mut() {
                        d.borrow_and_update();
                    }
                    true
                }
                None => false,
            };
            // Only the newest value: writes that landed meanwhile are applied together.
            let v = rx.borrow_and_update().clone();
            let t0 = std::time::Instant::now();
            // Off the control thread: the Admin API keeps answering (and writes keep landing) meanwhile.
            let me = self.clone();
            let vv = v.clone();
            // Discovered nodes changed: the same configuration compiled as the serving snapshot's successor.
            let next = match tokio::task::spawn_blocking(move || {
                if fresh {
                    me.compile_fresh(&vv).map(|s| (s, false))
                } else {
                    me.next_snapshot(&vv)
                }
            })
            .await
            {
                Ok(r) => r,
                Err(e) => Err(format!("applier task failed: {e}")),
            };
            match next {
                Ok((s, reused)) => {
                    let routes = s.route_count();
                    self.gateway.publish(s);
                    applied.send_replace(v.revision);
                    crate::release_memory_after_apply(t0.elapsed() >= crate::LARGE_APPLY);
                    tracing::info!(
                        revision = v.revision,
                        routes,
                        from_dry_run = reused,
                        ms = t0.elapsed().as_secs_f64() * 1e3,
                        "configuration applied"
                    );
                }
                Err(e) => {
                    tracing::error!(revision = v.revision, error = %e, "configuration rejected")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proxy::ProxyConfig;

    fn resources(uri: &str) -> Resources {
        serde_json::from_value(serde_json::json!({"routes": [{"id": "1", "uri": uri,
            "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}}]}))
        .expect("resources")
    }

    fn versioned(revision: u64, resources: Resources, token: u64) -> Versioned {
        Versioned {
            revision,
            resources,
            token,
        }
    }

    #[test]
    fn kept_dry_run_is_published_once_and_only_for_its_token() {
        let gw = Gateway::new(ProxyConfig::default(), Snapshot::empty());
        let a = Applier::new(Arc::new(Shared::default()), gw, None);
        let t1 = a.dry_run(&resources("/a")).expect("dry run");
        let t2 = a.dry_run(&resources("/b")).expect("dry run");
        assert!(t2 > t1 && t1 > 0);
        // An older token finds nothing kept (only the newest dry run is) and compiles; the newer one survives.
        let (s, kept) = a
            .next_snapshot(&versioned(3, resources("/a"), t1))
            .expect("compile");
        assert!(!kept);
        assert_eq!((s.revision, s.route_count()), (3, 1));
        let (s, kept) = a
            .next_snapshot(&versioned(4, resources("/b"), t2))
            .expect("kept");
        assert!(kept);
        assert_eq!(s.revision, 4);
        // Taken: the same token again compiles; so does a value without a token.
        assert!(
            !a.next_snapshot(&versioned(4, resources("/b"), t2))
                .expect("compile")
                .1
        );
        assert!(
            !a.next_snapshot(&versioned(5, resources("/c"), 0))
                .expect("compile")
                .1
        );
        // A dry run that fails keeps nothing and reports the data plane's reason.
        let bad: Resources =
            serde_json::from_value(serde_json::json!({"routes": [{"id": "9", "uri": "/x"}]}))
                .expect("resources");
        let e = a.dry_run(&bad).expect_err("no upstream");
        assert!(
            e.contains("missing upstream configuration in Route or Service"),
            "{e}"
        );
    }
}
