//! A memory zone: APISIX's `lua_shared_dict` for the memory strategy. Bounded by the zone's `memory_size`
//! (bodies, headers and keys counted), least recently used first out. Sixteen shards, each behind its own
//! mutex held for a hash probe (a lookup) or an insert; the answer itself is shared (`Arc`, `Bytes`), never
//! copied under the lock. A URL whose answers carry `Vary` keeps up to 64 variants (APISIX's `MAX_VARIANTS`),
//! oldest dropped first, each under the request values of the Vary headers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::{Entry, Lookup};

const SHARDS: usize = 16;
const MAX_VARIANTS: usize = 64;
/// What a slot costs besides its key and answers (map and LRU nodes, the slot itself).
const SLOT_OVERHEAD: usize = 160;

pub(crate) struct MemZone {
    shards: Box<[Mutex<Shard>]>,
    /// Bytes per shard.
    cap: usize,
    hasher: ahash::RandomState,
}

#[derive(Default)]
struct Shard {
    /// By the key's 64-bit hash; the slot keeps the key, so a colliding key is a miss, never another's answer.
    map: HashMap<u64, Slot, ahash::RandomState>,
    /// Last use -> key hash.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    bytes: usize,
}

struct Slot {
    key: Box<[u8]>,
    tick: u64,
    /// The Vary header names (lower case, sorted) the answers were stored under; empty without Vary.
    vary: Box<[Box<str>]>,
    variants: Vec<Arc<Entry>>,
    bytes: usize,
}

impl Slot {
    fn weigh(&self) -> usize {
        SLOT_OVERHEAD
            + self.key.len()
            + self.vary.iter().map(|v| v.len() + 16).sum::<usize>()
            + self.variants.iter().map(|e| e.weight()).sum::<usize>()
    }
}

impl MemZone {
    pub(crate) fn new(size: u64) -> MemZone {
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        MemZone {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            cap: (size / SHARDS).max(1),
            hasher: ahash::RandomState::new(),
        }
    }

    fn shard(&self, key: &[u8]) -> (u64, std::sync::MutexGuard<'_, Shard>) {
        let h = self.hasher.hash_one(key);
        let s = &self.shards[(h as usize) % SHARDS];
        (h, s.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The answer stored under `key` for this request's Vary values (`sig` computes them from the names).
    pub(crate) fn get(
        &self,
        key: &[u8],
        sig: &dyn Fn(&[Box<str>]) -> Vec<u8>,
        now_ms: u64,
    ) -> Lookup {
        let (h, mut s) = self.shard(key);
        let s = &mut *s;
        let Some(slot) = s.map.get_mut(&h) else {
            return Lookup::Miss;
        };
        if *slot.key != *key {
            return Lookup::Miss;
        }
        let entry = if slot.vary.is_empty() {
            slot.variants.first()
        } else {
            let want = sig(&slot.vary);
            slot.variants.iter().find(|e| *e.sig == *want)
        };
        let Some(entry) = entry.cloned() else {
            return Lookup::Miss;
        };
        s.tick += 1;
        s.lru.remove(&slot.tick);
        slot.tick = s.tick;
        s.lru.insert(slot.tick, h);
        if entry.expired(now_ms) {
            Lookup::Expired
        } else {
            Lookup::Hit(entry)
        }
    }

    /// Whether anything (fresh or expired) is stored under `key`.
    #[cfg(test)]
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        let (h, s) = self.shard(key);
        s.map.get(&h).is_some_and(|slot| *slot.key == *key)
    }

    /// Drops every variant stored under `key`; whether there was one.
    pub(crate) fn purge(&self, key: &[u8]) -> bool {
        let (h, mut s) = self.shard(key);
        if s.map.get(&h).is_none_or(|slot| *slot.key != *key) {
            return false;
        }
        if let Some(slot) = s.map.remove(&h) {
            s.lru.remove(&slot.tick);
            s.bytes -= slot.bytes;
        }
        true
    }

    /// Stores an answer. Its variant replaces the one with the same Vary values; answers stored under other Vary
    /// names are dropped (APISIX flushes the index when the Vary list changes).
    pub(crate) fn put(&self, key: &[u8], vary: Box<[Box<str>]>, entry: Arc<Entry>) {
        let weight = entry.weight() + key.len() + SLOT_OVERHEAD;
        if weight > self.cap {
            return;
        }
        let (h, mut g) = self.shard(key);
        let s = &mut *g;
        s.tick += 1;
        let tick = s.tick;
        let same = s
            .map
            .get(&h)
            .is_some_and(|slot| *slot.key == *key && slot.vary == vary);
        if !same {
            if let Some(old) = s.map.remove(&h) {
                s.lru.remove(&old.tick);
                s.bytes -= old.bytes;
            }
        }
        let slot = s.map.entry(h).or_insert_with(|| Slot {
            key: key.into(),
            tick,
            vary,
            variants: Vec::new(),
            bytes: 0,
        });
        slot.variants.retain(|e| e.sig != entry.sig);
        while slot.variants.len() >= MAX_VARIANTS {
            slot.variants.remove(0);
        }
        slot.variants.push(entry);
        s.lru.remove(&slot.tick);
        slot.tick = tick;
        let before = slot.bytes;
        slot.bytes = slot.weigh();
        s.bytes = s.bytes - before + slot.bytes;
        s.lru.insert(tick, h);
        while s.bytes > self.cap {
            let Some((_, victim)) = s.lru.pop_first() else {
                break;
            };
            if let Some(old) = s.map.remove(&victim) {
                s.bytes -= old.bytes;
            }
        }
    }

    /// The largest answer a shard can hold: bigger ones are not collected.
    pub(crate) fn max_entry(&self) -> usize {
        self.cap
    }

    /// Bytes held (for tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn entry(body: &str, sig: &[u8]) -> Entry {
        Entry {
            key: Box::new([]),
            sig: sig.into(),
            status: 200,
            headers: Vec::new(),
            body: Bytes::from(body.to_owned()),
            stored_ms: 1000,
            ttl_ms: 1000,
        }
    }

    fn body(l: Lookup) -> Option<String> {
        match l {
            Lookup::Hit(e) => Some(String::from_utf8_lossy(&e.body).into_owned()),
            _ => None,
        }
    }

    #[test]
    fn stores_expires_purges() {
        let z = MemZone::new(1 << 20);
        let none = |_: &[Box<str>]| Vec::new();
        assert!(matches!(z.get(b"k", &none, 1500), Lookup::Miss));
        z.put(b"k", Box::new([]), Arc::new(entry("a", b"")));
        assert_eq!(body(z.get(b"k", &none, 1500)).as_deref(), Some("a"));
        assert!(matches!(z.get(b"k", &none, 2001), Lookup::Expired));
        assert!(z.purge(b"k"));
        assert!(!z.purge(b"k"));
        assert_eq!(z.bytes(), 0);
    }

    #[test]
    fn variants_by_vary_values() {
        let z = MemZone::new(1 << 20);
        let vary: Box<[Box<str>]> = Box::new(["accept-language".into()]);
        z.put(b"k", vary.clone(), Arc::new(entry("en", b"en")));
        z.put(b"k", vary.clone(), Arc::new(entry("fr", b"fr")));
        let asks = |v: &'static [u8]| move |_: &[Box<str>]| v.to_vec();
        assert_eq!(body(z.get(b"k", &asks(b"en"), 1500)).as_deref(), Some("en"));
        assert_eq!(body(z.get(b"k", &asks(b"fr"), 1500)).as_deref(), Some("fr"));
        assert!(matches!(z.get(b"k", &asks(b"de"), 1500), Lookup::Miss));
        for i in 0..100 {
            z.put(
                b"k",
                vary.clone(),
                Arc::new(entry("x", format!("v{i}").as_bytes())),
            );
        }
        assert!(matches!(z.get(b"k", &asks(b"en"), 1500), Lookup::Miss));
        assert!(matches!(z.get(b"k", &asks(b"v99"), 1500), Lookup::Hit(_)));
    }

    #[test]
    fn bounded_least_recently_used_first() {
        // 16 shards of 4 KiB; 1 KiB answers.
        let z = MemZone::new(64 << 10);
        let none = |_: &[Box<str>]| Vec::new();
        let big = "x".repeat(1024);
        for i in 0..1000 {
            z.put(
                format!("k{i}").as_bytes(),
                Box::new([]),
                Arc::new(entry(&big, b"")),
            );
            // k0 stays in use.
            assert!(matches!(z.get(b"k0", &none, 1500), Lookup::Hit(_)), "{i}");
        }
        assert!(z.bytes() <= 64 << 10, "{}", z.bytes());
        assert!(matches!(z.get(b"k1", &none, 1500), Lookup::Miss));
        assert!(matches!(z.get(b"k999", &none, 1500), Lookup::Hit(_)));
        // An answer larger than a shard is not stored.
        z.put(
            b"huge",
            Box::new([]),
            Arc::new(entry(&"y".repeat(8 << 10), b"")),
        );
        assert!(!z.contains(b"huge"));
    }
}
