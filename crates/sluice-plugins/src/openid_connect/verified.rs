//! Bearer tokens already verified locally, so that a token's signature is checked once, not on every request it
//! comes with: an RS256 verification with `ring` cost ~459k instructions per request (it rebuilds the RSA
//! key's modular arithmetic on each call); a request with a remembered token cost ~23k in all
//! (docs/plugins/openid-connect.md).
//!
//! An entry is the token's exact text with the claims its verification gave, and is used only while the token is
//! unexpired and the keys and discovery document it was checked against are still the ones in use (a JWKS
//! refetch or a new discovery document starts over). Only verified tokens are stored, so an attacker cannot fill
//! the cache with forgeries; each shard is bounded and drops expired entries first, then everything, when full.

use std::sync::{Arc, RwLock};

use ahash::{AHashMap, RandomState};
use serde_json::Value;

const SHARDS: usize = 16;
/// Entries per shard (4,096 tokens in all).
const CAP: usize = 256;

/// What a token was verified against: the JWKS (its allocation and fetch time) and the discovery document.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(super) struct Keys(pub(super) usize, pub(super) u64, pub(super) usize);

struct Entry {
    token: Box<str>,
    claims: Arc<Value>,
    /// The `exp` claim, whole seconds (rounded down: a token is used from here until a second before it expires
    /// at the latest, then verified again).
    exp: u64,
    keys: Keys,
}

pub(super) struct Verified {
    hasher: RandomState,
    shards: Box<[RwLock<AHashMap<u64, Entry>>]>,
}

impl Default for Verified {
    fn default() -> Self {
        Verified {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }
}

impl Verified {
    fn slot(&self, token: &str) -> (&RwLock<AHashMap<u64, Entry>>, u64) {
        let h = self.hasher.hash_one(token);
        (&self.shards[h as usize % SHARDS], h)
    }

    /// The claims of `token` if it was verified against `keys` and has not expired at `now` (unix seconds).
    pub(super) fn get(&self, token: &str, keys: Keys, now: u64) -> Option<Arc<Value>> {
        let (shard, h) = self.slot(token);
        let map = shard.read().ok()?;
        let e = map.get(&h)?;
        (e.keys == keys && now < e.exp && *e.token == *token).then(|| e.claims.clone())
    }

    /// Remembers a token that was just verified against `keys`; returns its claims, shared.
    pub(super) fn put(&self, token: &str, claims: Value, keys: Keys, now: u64) -> Arc<Value> {
        let exp = claims
            .get("exp")
            .and_then(Value::as_f64)
            .filter(|e| e.is_finite() && *e > 0.0)
            .map_or(0, |e| e as u64);
        let claims = Arc::new(claims);
        if exp <= now {
            return claims;
        }
        let (shard, h) = self.slot(token);
        if let Ok(mut map) = shard.write() {
            if map.len() >= CAP {
                map.retain(|_, e| now < e.exp);
                if map.len() >= CAP {
                    map.clear();
                }
            }
            map.insert(
                h,
                Entry {
                    token: token.into(),
                    claims: claims.clone(),
                    exp,
                    keys,
                },
            );
        }
        claims
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_token_is_used_until_it_expires_and_only_with_the_same_keys() {
        let v = Verified::default();
        let k = Keys(1, 2, 3);
        assert!(v.get("t1", k, 100).is_none());
        v.put("t1", json!({"exp": 150.7, "sub": "a"}), k, 100);
        assert_eq!(v.get("t1", k, 149).unwrap()["sub"], "a");
        assert!(v.get("t1", k, 150).is_none(), "expired (rounded down)");
        assert!(v.get("t1", Keys(1, 9, 3), 120).is_none(), "refetched keys");
        assert!(v.get("t1", Keys(1, 2, 4), 120).is_none(), "new discovery");
        assert!(v.get("t1x", k, 120).is_none(), "another token");
        v.put("t2", json!({"sub": "no exp"}), k, 100);
        assert!(
            v.get("t2", k, 100).is_none(),
            "a token without exp is not kept"
        );
    }

    #[test]
    fn shards_stay_bounded() {
        let v = Verified::default();
        let k = Keys::default();
        for i in 0..(SHARDS * CAP * 4) {
            v.put(&format!("tok{i}"), json!({"exp": 1000}), k, 10);
        }
        let total: usize = v.shards.iter().map(|s| s.read().unwrap().len()).sum();
        assert!(total <= SHARDS * CAP, "{total}");
        // Entries kept after the last clear are still served.
        let last = format!("tok{}", SHARDS * CAP * 4 - 1);
        assert!(v.get(&last, k, 10).is_some());
    }
}
