//! One shared copy of equal inline upstreams (issue 16: route scale).
//!
//! Configurations at scale repeat the same inline upstream on many routes (100k routes to one backend is
//! the usual shape): decoded one by one, each route held its own ~700-byte `Upstream`. Every decoded inline
//! upstream goes through [`upstream`], which hands back the live copy equal to it when there is one, so equal
//! upstreams are one `Arc` and the compiler can see sharing by pointer (it then shares their runtime too).
//! The table holds weak references: a configuration that no longer names an upstream frees it.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Deserializer};

use crate::{Nodes, Upstream};

#[derive(Default)]
struct Table {
    /// Upstreams by [`fingerprint`]; equal fingerprints are told apart by `==`.
    by_print: HashMap<u64, Vec<Weak<Upstream>>>,
    /// `by_print.len()` after the last sweep of dead entries. A dead entry still holds its `Arc`'s block (~600
    /// bytes) through the weak reference, so sweeps come when the table has grown by an eighth since (at least
    /// 1,024 entries): at most that many dead blocks are held, and sweeping costs O(1) per insert.
    swept_at: usize,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// Only what tells upstreams apart in practice, cheaply: equality decides.
fn fingerprint(u: &Upstream) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    (&u.kind, &u.scheme, &u.pass_host, &u.hash_on, &u.key).hash(&mut h);
    (&u.upstream_host, &u.discovery_type, &u.service_name).hash(&mut h);
    match &u.nodes {
        Nodes::Map(m) => {
            for (addr, w) in m.iter() {
                (addr, w.as_u64()).hash(&mut h);
            }
        }
        Nodes::List(l) => {
            for n in l {
                (&n.host, n.port, n.weight, n.priority).hash(&mut h);
            }
        }
    }
    h.finish()
}

/// The live upstream equal to `u` if there is one, else `u` itself, from now on the one others get.
pub(crate) fn upstream(u: Upstream) -> Arc<Upstream> {
    let print = fingerprint(&u);
    let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let t = guard.get_or_insert_with(Table::default);
    let bucket = t.by_print.entry(print).or_default();
    let mut found = None;
    bucket.retain(|w| match w.upgrade() {
        Some(live) => {
            if found.is_none() && *live == u {
                found = Some(live);
            }
            true
        }
        None => false,
    });
    if let Some(live) = found {
        return live;
    }
    let new = Arc::new(u);
    bucket.push(Arc::downgrade(&new));
    if t.by_print.len() >= t.swept_at + (t.swept_at / 8).max(1024) {
        t.by_print.retain(|_, b| {
            b.retain(|w| w.strong_count() > 0);
            !b.is_empty()
        });
        t.swept_at = t.by_print.len();
    }
    new
}

/// `deserialize_with` for an inline upstream field.
pub(crate) fn de_upstream<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Arc<Upstream>>, D::Error> {
    Ok(Option::<Upstream>::deserialize(d)?.map(upstream))
}

#[cfg(test)]
fn table_len() -> usize {
    TABLE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |t| t.by_print.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Route;

    fn route(json: &str) -> Route {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn equal_inline_upstreams_are_one_copy_and_different_ones_are_not() {
        let a = route(r#"{"uri":"/a","upstream":{"type":"roundrobin","nodes":{"10.0.0.7:80":1}}}"#);
        let b = route(r#"{"uri":"/b","upstream":{"nodes":{"10.0.0.7:80":1},"type":"roundrobin"}}"#);
        let (ua, ub) = (a.upstream.as_ref().unwrap(), b.upstream.as_ref().unwrap());
        assert!(Arc::ptr_eq(ua, ub));
        // Same fingerprint (nodes, type), different in a field the fingerprint skips: two upstreams.
        let c = route(
            r#"{"uri":"/c","upstream":{"type":"roundrobin","nodes":{"10.0.0.7:80":1},"retries":3}}"#,
        );
        let uc = c.upstream.as_ref().unwrap();
        assert!(!Arc::ptr_eq(ua, uc));
        assert_eq!(uc.retries, Some(3));
        assert_eq!(ua.retries, None);
        let d = route(r#"{"uri":"/d","upstream":{"type":"roundrobin","nodes":{"10.0.0.7:80":2}}}"#);
        assert!(!Arc::ptr_eq(ua, d.upstream.as_ref().unwrap()));
        // Serialized back, each route still reads as written.
        assert_eq!(
            serde_json::to_value(&c).unwrap()["upstream"]["retries"],
            serde_json::json!(3)
        );
    }

    #[test]
    fn a_dropped_upstream_is_not_kept() {
        let u = route(r#"{"uri":"/x","upstream":{"nodes":{"10.9.9.9:1":1},"desc":"only-me"}}"#)
            .upstream
            .unwrap();
        let weak = Arc::downgrade(&u);
        drop(u);
        assert!(weak.upgrade().is_none());
        let again = route(r#"{"uri":"/x","upstream":{"nodes":{"10.9.9.9:1":1},"desc":"only-me"}}"#);
        assert_eq!(again.upstream.unwrap().desc.as_deref(), Some("only-me"));
    }

    /// Upstreams written and replaced over and over (a weight changed on each write) leave no more than an
    /// eighth of the live ones (or 1,024) dead in the table: each dead one still holds its block.
    #[test]
    fn replaced_upstreams_do_not_pile_up() {
        let node = |i: usize| format!(r#"{{"nodes":{{"10.77.{}.{}:80":1}}}}"#, i / 250, i % 250);
        let decode = |i: usize| {
            serde_json::from_str::<Upstream>(&node(i))
                .map(upstream)
                .unwrap()
        };
        let live: Vec<Arc<Upstream>> = (0..3000).map(decode).collect();
        for round in 1..=10 {
            let gone: Vec<Arc<Upstream>> = (0..3000).map(|i| decode(round * 3000 + i)).collect();
            drop(gone);
        }
        // Other tests may add a few of their own meanwhile.
        assert!(
            table_len() < 3000 + 1024 + 3000 / 8 + 3000 + 200,
            "{}",
            table_len()
        );
        assert_eq!(live.len(), 3000);
    }
}
