//! sluice-upstream: APISIX's upstream load balancers (`roundrobin`, `chash`, `least_conn`, `ewma`),
//! node priorities and passive health state, built once per config snapshot and shared by every
//! worker thread through an `Arc<Balancer>`.
//!
//! The hot path is [`Balancer::pick`]: it takes no lock and allocates nothing (one `fetch_add` for
//! roundrobin, a binary search for chash, a scan of atomics for least_conn, two random probes for
//! ewma). Everything costly (the smooth roundrobin sequence, the hash ring) is computed in
//! [`Balancer::new`]. This crate deliberately knows nothing about config formats, DNS, sockets or
//! the keepalive pool: the caller hands it resolved [`NodeSpec`]s and reports outcomes back.
//!
//! Request protocol for the proxy:
//! 1. `let i = balancer.pick(hash_key, &tried)?;` (None means "no node left": APISIX answers 502),
//! 2. `balancer.on_request_start(i)` once the request is sent to node `i`,
//! 3. `balancer.on_request_end(i, elapsed, ok)` when it completes, and
//!    `balancer.health().report_*(i, ..)` with the outcome when passive checks are configured,
//! 4. on retry: `tried.insert(i)` and go back to 1.

mod balancer;
mod health;

pub use balancer::Balancer;
pub use health::{FailureKind, Health, NodeStatus, PassiveConfig};

/// One upstream node as APISIX's `upstream.nodes[]` describes it, after the caller resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// `"127.0.0.1:1980"` or `"host:port"`; also the identity hashed onto the chash ring.
    pub addr: String,
    /// Relative share of traffic. Weight 0 nodes never get traffic, except as the only node of an
    /// upstream (APISIX returns a single node unconditionally).
    pub weight: u32,
    /// Higher priorities are used first; lower ones only when every higher node is tried or
    /// unhealthy (APISIX `apisix/balancer/priority.lua`). APISIX's default is 0.
    pub priority: i32,
}

impl NodeSpec {
    /// A node with APISIX's default priority 0.
    pub fn new(addr: impl Into<String>, weight: u32) -> Self {
        NodeSpec {
            addr: addr.into(),
            weight,
            priority: 0,
        }
    }

    /// Builder-style priority setter.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }
}

/// APISIX `upstream.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LbKind {
    /// `roundrobin`: smooth weighted round robin (nginx's algorithm).
    RoundRobin,
    /// `chash`: consistent hashing on a key the proxy derives from `hash_on`/`key`.
    Chash,
    /// `least_conn`: lowest `(active + 1) / weight` wins.
    LeastConn,
    /// `ewma`: time-decayed latency average, power of two choices.
    Ewma,
}

impl LbKind {
    /// Parses APISIX's `upstream.type` string.
    pub fn from_apisix(name: &str) -> Option<Self> {
        match name {
            "roundrobin" => Some(LbKind::RoundRobin),
            "chash" => Some(LbKind::Chash),
            "least_conn" => Some(LbKind::LeastConn),
            "ewma" => Some(LbKind::Ewma),
            _ => None,
        }
    }

    /// APISIX's `upstream.type` string.
    pub fn as_apisix(self) -> &'static str {
        match self {
            LbKind::RoundRobin => "roundrobin",
            LbKind::Chash => "chash",
            LbKind::LeastConn => "least_conn",
            LbKind::Ewma => "ewma",
        }
    }
}

/// Nodes already tried by one request (its retries skip them). A bitset: no allocation for node
/// indices below 64, a lazily grown `Vec<u64>` above.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tried {
    low: u64,
    high: Vec<u64>,
}

impl Tried {
    /// An empty set; `const` so it costs nothing per request.
    pub const fn new() -> Self {
        Tried {
            low: 0,
            high: Vec::new(),
        }
    }

    /// Marks node `idx` as tried.
    pub fn insert(&mut self, idx: usize) {
        if idx < 64 {
            self.low |= 1 << idx;
            return;
        }
        let word = idx / 64 - 1;
        if self.high.len() <= word {
            self.high.resize(word + 1, 0);
        }
        self.high[word] |= 1 << (idx % 64);
    }

    /// Whether node `idx` was tried.
    #[inline]
    pub fn contains(&self, idx: usize) -> bool {
        if idx < 64 {
            return self.low & (1 << idx) != 0;
        }
        self.high
            .get(idx / 64 - 1)
            .is_some_and(|w| w & (1 << (idx % 64)) != 0)
    }

    /// Number of tried nodes.
    pub fn len(&self) -> usize {
        self.low.count_ones() as usize
            + self
                .high
                .iter()
                .map(|w| w.count_ones() as usize)
                .sum::<usize>()
    }

    /// Whether nothing was tried yet (the common, first-attempt case).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.low == 0 && self.high.iter().all(|w| *w == 0)
    }

    /// Forgets every node (reuse across requests without reallocating).
    pub fn clear(&mut self) {
        self.low = 0;
        self.high.iter_mut().for_each(|w| *w = 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tried_bitset_low_and_high() {
        let mut t = Tried::new();
        assert!(t.is_empty());
        t.insert(0);
        t.insert(63);
        t.insert(64);
        t.insert(200);
        t.insert(200);
        assert!(t.contains(0) && t.contains(63) && t.contains(64) && t.contains(200));
        assert!(!t.contains(1) && !t.contains(65) && !t.contains(1000));
        assert_eq!(t.len(), 4);
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.len(), 0);
        assert!(!t.contains(200));
    }

    #[test]
    fn lb_kind_names_round_trip() {
        for k in [
            LbKind::RoundRobin,
            LbKind::Chash,
            LbKind::LeastConn,
            LbKind::Ewma,
        ] {
            assert_eq!(LbKind::from_apisix(k.as_apisix()), Some(k));
        }
        assert_eq!(LbKind::from_apisix("random"), None);
    }
}
