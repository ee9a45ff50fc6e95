//! Live apply: turns each configuration a provider publishes into the data plane's next snapshot, compiling
//! each accepted write once. The Admin API's dry run compiles the candidate as the successor of the serving
//! snapshot (so unchanged routes are reused, see `sluice_proxy::Snapshot::compile_next`) and keeps that compile
//! under a token; when the store publishes exactly that candidate (same token), the applier publishes the kept
//! compile instead of compiling again. Anything else (etcd watch events, a candidate that lost a race) compiles
//! as the successor of the serving snapshot. Writes that land during one compile coalesce: the applier only
//! ever looks at the newest published configuration. Not here: the providers and the Admin API themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_model::Resources;
use sluice_plugins::Shared;
use sluice_proxy::{Gateway, Snapshot};
use sluice_store::{ConfigRx, Versioned};

pub struct Applier {
    shared: Arc<Shared>,
    gateway: Gateway,
    /// The newest dry-run compile, by token.
    kept: Mutex<Option<(u64, Snapshot)>>,
    tokens: AtomicU64,
}

impl Applier {
    pub fn new(shared: Arc<Shared>, gateway: Gateway) -> Arc<Applier> {
        Arc::new(Applier {
            shared,
            gateway,
            kept: Mutex::new(None),
            tokens: AtomicU64::new(0),
        })
    }

    fn kept(&self) -> MutexGuard<'_, Option<(u64, Snapshot)>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Admin API's dry run: compiles `res` with the live plugin state and keeps the result; returns its token.
    pub fn dry_run(&self, res: &Resources) -> Result<u64, String> {
        let prev = self.gateway.snapshot();
        let snap = Snapshot::compile_next(res, 0, &self.shared, Some(&prev))?;
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
                Some((t, mut s)) if t == v.token => {
                    s.revision = v.revision;
                    return Ok((s, true));
                }
                // A newer dry run stays for its own commit; an older one can never match again.
                Some((t, s)) if t > v.token => *kept = Some((t, s)),
                _ => {}
            }
        }
        let prev = self.gateway.snapshot();
        Snapshot::compile_next(&v.resources, v.revision, &self.shared, Some(&prev))
            .map(|s| (s, false))
    }

    /// Follows `rx` until it closes: compile (or take), publish, report the applied revision.
    pub async fn run(self: Arc<Self>, mut rx: ConfigRx, applied: tokio::sync::watch::Sender<u64>) {
        while rx.changed().await.is_ok() {
            // Only the newest value: writes that landed meanwhile are applied together.
            let v = rx.borrow_and_update().clone();
            let t0 = std::time::Instant::now();
            match self.next_snapshot(&v) {
                Ok((s, reused)) => {
                    let routes = s.route_count();
                    self.gateway.publish(s);
                    applied.send_replace(v.revision);
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
