//! Incremental upkeep of the data plane's view: given the [`Resources`] derived from the snapshot before a commit
//! and the keys the commit touched, decode only those keys again instead of every stored value (issue 4: one
//! route changed out of 100,000 must not cost a full decode). Routes, services, upstreams and plugin configs are
//! patched in place (their vectors stay in key order, exactly as [`Snapshot::to_resources`] lays them out); any
//! other touched kind is rebuilt whole from the snapshot, since those kinds are small. It does no IO.

use serde::de::DeserializeOwned;
use sluice_model::{Id, Resources};
use sluice_secrets::DataEncryption;

use super::{fill, Snapshot};

/// Most keys one commit patches in; more are decoded whole (see [`patch_resources`]).
pub const PATCH_MAX_KEYS: usize = 256;

/// `prev` (the view of the snapshot before the commit) with every key of `touched` re-read from `next`.
/// Equal to `next.to_resources()` whenever `prev` equals the previous snapshot's `to_resources()`.
/// Above [`PATCH_MAX_KEYS`] touched keys (a bulk import) it decodes `next` whole instead: inserting thousands of
/// elements one by one into sorted vectors would cost more than decoding.
pub fn patch_resources<'a>(
    prev: &Resources,
    next: &Snapshot,
    touched: impl IntoIterator<Item = &'a str>,
    de: &DataEncryption,
) -> Resources {
    let touched: Vec<&str> = touched.into_iter().collect();
    if touched.len() > PATCH_MAX_KEYS {
        return next.to_resources(de);
    }
    let mut r = prev.clone();
    let mut refill: Vec<&str> = Vec::new();
    for key in touched {
        let Some((kind, id)) = key.split_once('/') else {
            continue;
        };
        let nested = id.contains('/');
        match kind {
            "routes" if !nested => patch(
                &mut r.routes,
                next,
                key,
                id,
                de,
                |x: &std::sync::Arc<sluice_model::Route>| x.id.0.as_str(),
                |x: &mut sluice_model::Route, id| x.id = id,
            ),
            "services" if !nested => patch(
                &mut r.services,
                next,
                key,
                id,
                de,
                |x: &sluice_model::Service| x.id.0.as_str(),
                |x, id| x.id = id,
            ),
            "upstreams" if !nested => patch(
                &mut r.upstreams,
                next,
                key,
                id,
                de,
                |x: &sluice_model::Upstream| x.id.as_ref().map_or("", |i| i.0.as_str()),
                |x, id| x.id = Some(id),
            ),
            "plugin_configs" if !nested => patch(
                &mut r.plugin_configs,
                next,
                key,
                id,
                de,
                |x: &sluice_model::PluginConfig| x.id.0.as_str(),
                |x, id| x.id = id,
            ),
            "routes" | "services" | "upstreams" | "plugin_configs" => {}
            other => {
                if !refill.contains(&other) {
                    refill.push(other);
                }
            }
        }
    }
    for kind in refill {
        refill_kind(&mut r, next, kind, de);
    }
    r
}

/// Whether [`patch_resources`] reads nothing but `key` itself from the snapshot for this key (a direct child of
/// routes, services, upstreams or plugin_configs), so a snapshot holding only the touched keys suffices.
pub fn patch_is_local(key: &str) -> bool {
    key.split_once('/').is_some_and(|(kind, id)| {
        !id.contains('/') && matches!(kind, "routes" | "services" | "upstreams" | "plugin_configs")
    })
}

/// The sorted vectors [`patch`] edits: `Vec` for the small kinds, the persistent vector of routes.
trait Sorted<A> {
    fn find(&self, f: impl FnMut(&A) -> std::cmp::Ordering) -> Result<usize, usize>;
    fn put(&mut self, at: Result<usize, usize>, v: A);
    fn take(&mut self, i: usize);
}

impl<A> Sorted<A> for Vec<A> {
    fn find(&self, f: impl FnMut(&A) -> std::cmp::Ordering) -> Result<usize, usize> {
        self.binary_search_by(f)
    }
    fn put(&mut self, at: Result<usize, usize>, v: A) {
        match at {
            Ok(i) => self[i] = v,
            Err(i) => self.insert(i, v),
        }
    }
    fn take(&mut self, i: usize) {
        self.remove(i);
    }
}

impl<A: Clone> Sorted<A> for imbl::Vector<A> {
    fn find(&self, f: impl FnMut(&A) -> std::cmp::Ordering) -> Result<usize, usize> {
        self.binary_search_by(f)
    }
    fn put(&mut self, at: Result<usize, usize>, v: A) {
        match at {
            Ok(i) => {
                self.set(i, v);
            }
            Err(i) => self.insert(i, v),
        }
    }
    fn take(&mut self, i: usize) {
        self.remove(i);
    }
}

/// Replaces, inserts or removes the element `id` of a vector kept sorted by id.
fn patch<T: DeserializeOwned, A: From<T>>(
    out: &mut impl Sorted<A>,
    next: &Snapshot,
    key: &str,
    id: &str,
    de: &DataEncryption,
    get_id: impl Fn(&A) -> &str,
    set_id: impl Fn(&mut T, Id),
) {
    let at = out.find(|x| get_id(x).cmp(id));
    let value = next.get(key).and_then(|e| {
        match e.decode::<T>(key.split_once('/').map_or(key, |(k, _)| k), id, de) {
            Ok(mut v) => {
                set_id(&mut v, Id(id.to_owned()));
                Some(A::from(v))
            }
            Err(err) => {
                tracing::error!(key, error = %err, "stored resource does not parse; skipped");
                None
            }
        }
    });
    match (at, value) {
        (at, Some(v)) => out.put(at, v),
        (Ok(i), None) => out.take(i),
        (Err(_), None) => {}
    }
}

/// Rebuilds one small kind whole (and, for consumers or secrets, their nested keys).
fn refill_kind(r: &mut Resources, snap: &Snapshot, kind: &str, de: &DataEncryption) {
    match kind {
        "consumers" => {
            // Consumers and their nested credentials share the prefix.
            let fresh = snap.to_resources_of(&["consumers"], de);
            r.consumers = fresh.consumers;
            r.credentials = fresh.credentials;
        }
        "global_rules" => {
            r.global_rules.clear();
            fill(
                snap,
                kind,
                de,
                &mut r.global_rules,
                |x: &mut sluice_model::GlobalRule, id| x.id = id,
            )
        }
        "ssls" => {
            r.ssls.clear();
            fill(
                snap,
                kind,
                de,
                &mut r.ssls,
                |x: &mut sluice_model::Ssl, id| x.id = id,
            )
        }
        "consumer_groups" => {
            r.consumer_groups.clear();
            fill(
                snap,
                kind,
                de,
                &mut r.consumer_groups,
                |x: &mut sluice_model::ConsumerGroup, id| x.id = id,
            )
        }
        "plugin_metadata" => {
            r.plugin_metadata.clear();
            fill(
                snap,
                kind,
                de,
                &mut r.plugin_metadata,
                |x: &mut sluice_model::PluginMetadata, id| x.id = id,
            )
        }
        "protos" => {
            r.protos.clear();
            fill(
                snap,
                kind,
                de,
                &mut r.protos,
                |x: &mut sluice_model::Proto, id| x.id = id,
            )
        }
        "stream_routes" => {
            r.stream_routes.clear();
            fill(
                snap,
                kind,
                de,
                &mut r.stream_routes,
                |x: &mut sluice_model::StreamRoute, id| x.id = id,
            )
        }
        "secrets" => r.secrets = snap.to_resources_of(&["secrets"], de).secrets,
        _ => {}
    }
}
