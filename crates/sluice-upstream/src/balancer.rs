//! [`Balancer`]: one upstream's nodes grouped by priority, the per-kind selection structure of
//! each group, per-node live counters and the [`Health`] table. Built once per config snapshot.
//!
//! Pick order (APISIX `apisix/balancer.lua` + `balancer/priority.lua`):
//! 1. an upstream with exactly one node always gets that node (APISIX `pick_server`'s
//!    shortcut: no weight, health or tried check);
//! 2. otherwise nodes are grouped by `priority`, highest first; weight-0 nodes are in no group;
//! 3. unhealthy and already-tried nodes are skipped; the first group with an eligible node
//!    serves the pick, so lower priorities only see traffic when every higher node is tried or
//!    unhealthy;
//! 4. when *no* weighted node is healthy, health is ignored and all nodes are used again
//!    (APISIX `fetch_health_nodes`: "all upstream nodes is unhealthy, use default"); tried nodes
//!    are still skipped, and `None` ("all upstream servers tried") makes the proxy answer 502.
//!
//! Hot-path budget: no lock, no allocation. The first attempt with all nodes healthy takes the
//! unfiltered fast path (no per-node checks); filtering costs O(group size) only on retries or
//! while some node is unhealthy. Figures: `benches/pick.rs`.

mod chash;
mod ewma;
mod least_conn;
mod roundrobin;

use std::cell::Cell;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Health, LbKind, NodeSpec, PassiveConfig, Tried};

/// The load balancer of one upstream. `Send + Sync`; share it with `Arc`.
#[derive(Debug)]
pub struct Balancer {
    kind: LbKind,
    nodes: Vec<NodeSpec>,
    /// Priority groups, highest priority first; only nodes with weight > 0.
    groups: Box<[Group]>,
    stats: Box<[NodeStats]>,
    health: Health,
    /// Time origin of the ewma timestamps.
    epoch: Instant,
}

/// Nodes of one priority and the structure the balancer kind picks them with.
#[derive(Debug)]
struct Group {
    priority: i32,
    /// Node indices (into `Balancer::nodes`), all with weight > 0.
    members: Box<[u32]>,
    /// `weights[k]` is the weight of `members[k]`, contiguous for least_conn's scan.
    weights: Box<[u32]>,
    algo: Algo,
}

#[derive(Debug)]
enum Algo {
    RoundRobin(roundrobin::Sequence),
    Chash(chash::Ring),
    LeastConn,
    Ewma,
}

/// Live per-node counters, one cache line each so workers hitting different nodes do not
/// false-share.
#[derive(Debug, Default)]
#[repr(align(64))]
struct NodeStats {
    active: AtomicU32,
    /// ewma latency in seconds, as `f64` bits.
    ewma: AtomicU64,
    /// Last ewma update, nanoseconds since `Balancer::epoch` plus one (0 = never).
    touched: AtomicU64,
}

/// Which nodes a pick may return.
struct Filter<'a> {
    tried: &'a Tried,
    /// `None` when health is not consulted (everyone healthy, or the all-unhealthy fallback).
    health: Option<&'a Health>,
}

// === impl Balancer ===

impl Balancer {
    /// A balancer without passive health checks (APISIX upstream without `checks`): nodes only
    /// change state through [`Health::set_healthy`].
    pub fn new(kind: LbKind, nodes: Vec<NodeSpec>) -> Self {
        Self::with_passive(kind, nodes, PassiveConfig::disabled())
    }

    /// A balancer whose [`Health`] counts passive reports with `passive`'s thresholds.
    pub fn with_passive(kind: LbKind, nodes: Vec<NodeSpec>, passive: PassiveConfig) -> Self {
        // A lone node is picked without groups (`pick`'s first rule), so it gets none: no selection structure
        // per single-node upstream (issue 16: one per route with an inline upstream).
        let mut order: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes.len() > 1 && nodes[i].weight > 0)
            .collect();
        // Stable: equal priorities keep config order, like APISIX's per-priority node tables.
        order.sort_by_key(|&i| std::cmp::Reverse(nodes[i].priority));
        let mut groups = Vec::new();
        for chunk in order.chunk_by(|&a, &b| nodes[a].priority == nodes[b].priority) {
            let members: Box<[u32]> = chunk.iter().map(|&i| i as u32).collect();
            let weights: Box<[u32]> = chunk.iter().map(|&i| nodes[i].weight).collect();
            let algo = match kind {
                LbKind::RoundRobin => {
                    Algo::RoundRobin(roundrobin::Sequence::build(&members, &weights))
                }
                LbKind::Chash => {
                    let addrs: Vec<&str> = chunk.iter().map(|&i| nodes[i].addr.as_str()).collect();
                    Algo::Chash(chash::Ring::build(&members, &weights, &addrs))
                }
                LbKind::LeastConn => Algo::LeastConn,
                LbKind::Ewma => Algo::Ewma,
            };
            groups.push(Group {
                priority: nodes[chunk[0]].priority,
                members,
                weights,
                algo,
            });
        }
        Balancer {
            kind,
            stats: (0..nodes.len()).map(|_| NodeStats::default()).collect(),
            health: Health::new(nodes.len(), passive),
            nodes,
            groups: groups.into_boxed_slice(),
            epoch: Instant::now(),
        }
    }

    /// Carries passive-health state and ewma averages over from the balancer this one replaces
    /// (a new config snapshot), matching nodes by `addr`, so a config reload does not forget
    /// that a node is down. In-flight counts stay with `previous`: its requests end there.
    /// Build time only (allocates a lookup table).
    pub fn inherit_state(&self, previous: &Balancer) {
        let by_addr: std::collections::HashMap<&str, usize> = previous
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.addr.as_str(), i))
            .collect();
        // `previous` measured time from its own epoch; shift its stamps onto ours.
        let shift = self
            .epoch
            .saturating_duration_since(previous.epoch)
            .as_nanos();
        let shift = u64::try_from(shift).unwrap_or(u64::MAX);
        for (i, node) in self.nodes.iter().enumerate() {
            let Some(&j) = by_addr.get(node.addr.as_str()) else {
                continue;
            };
            self.health.copy_node(i, &previous.health, j);
            let (old, new) = (&previous.stats[j], &self.stats[i]);
            let touched = old.touched.load(Ordering::Relaxed);
            if touched != 0 {
                new.ewma
                    .store(old.ewma.load(Ordering::Relaxed), Ordering::Relaxed);
                // Stamped before our epoch: clamp to "just now", 1 = epoch + 0.
                new.touched
                    .store(touched.saturating_sub(shift).max(1), Ordering::Relaxed);
            }
        }
    }

    /// The balancer kind.
    pub fn kind(&self) -> LbKind {
        self.kind
    }

    /// All nodes, in config order; `pick` returns indices into this slice.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The distinct priorities in use, highest first (weight-0 nodes excluded; none for a lone node, which is
    /// picked whatever its priority).
    pub fn priorities(&self) -> impl Iterator<Item = i32> + '_ {
        self.groups.iter().map(|g| g.priority)
    }

    /// Health table of these nodes (passive reports, active-checker seam, status snapshot).
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// APISIX's retry count when `upstream.retries` is unset: one per other node.
    pub fn default_retries(&self) -> usize {
        self.nodes.len().saturating_sub(1)
    }

    /// Requests currently in flight on node `i` (as reported by `on_request_start/end`).
    pub fn active(&self, i: usize) -> u32 {
        self.stats
            .get(i)
            .map_or(0, |s| s.active.load(Ordering::Relaxed))
    }

    /// Current decayed ewma latency of node `i` (0 when never measured).
    pub fn ewma(&self, i: usize) -> Duration {
        self.stats.get(i).map_or(Duration::ZERO, |s| {
            Duration::from_secs_f64(ewma::score(s, self.now_ns()).max(0.0))
        })
    }

    /// Picks a node index; see the module docs for priority, health and `tried` rules.
    /// `hash_key` is only read by chash (`None` hashes as the empty key). Lock- and
    /// allocation-free.
    pub fn pick(&self, hash_key: Option<&[u8]>, tried: &Tried) -> Option<usize> {
        if self.nodes.len() == 1 {
            // APISIX `pick_server`: a single node is returned as is, whatever its weight,
            // health or earlier tries (a configured retry goes to the same node again).
            return Some(0);
        }
        let check_health = self.health.unhealthy_count() > 0;
        let filter = Filter {
            tried,
            health: check_health.then_some(&self.health),
        };
        if filter.is_open() {
            // Fast path (first attempt, all healthy): the top group is never empty, so it
            // answers; dispatched inline to keep the common pick free of call frames.
            let g = self.groups.first()?;
            return match &g.algo {
                Algo::RoundRobin(seq) => seq.pick(&filter, true),
                Algo::Chash(ring) => {
                    ring.pick(chash::key_hash(hash_key.unwrap_or_default()), &filter, true)
                }
                Algo::LeastConn => {
                    least_conn::pick(&g.members, &g.weights, &self.stats, &filter, true)
                }
                Algo::Ewma => ewma::pick(&g.members, &self.stats, &filter, true),
            };
        }
        if let Some(i) = self.pick_filtered(hash_key, &filter) {
            return Some(i);
        }
        if !check_health {
            return None;
        }
        // Health may flip between the scan above and this check (an active checker runs concurrently): look
        // once more; a first attempt must not fail while the upstream has nodes, so it falls back to every node.
        if self.any_weighted_healthy() {
            if let Some(i) = self.pick_filtered(hash_key, &filter) {
                return Some(i);
            }
            if !tried.is_empty() {
                return None;
            }
        }
        // APISIX: "all upstream nodes is unhealthy, use default".
        self.pick_filtered(
            hash_key,
            &Filter {
                tried,
                health: None,
            },
        )
    }

    /// The node a first attempt would get now, without taking it: round robin's cursor does not move (for the
    /// Admin API's request tester). Other kinds pick as [`Balancer::pick`] does (they keep no cursor; ewma's
    /// random choice between two may differ from the next real pick).
    pub fn peek(&self, hash_key: Option<&[u8]>) -> Option<usize> {
        let tried = Tried::new();
        if self.nodes.len() == 1 {
            return Some(0);
        }
        let healthy = Filter {
            tried: &tried,
            health: (self.health.unhealthy_count() > 0).then_some(&self.health),
        };
        let all = Filter {
            tried: &tried,
            health: None,
        };
        // As `pick`: the first group with a healthy node, else every node ("all unhealthy, use default").
        for f in [&healthy, &all] {
            for g in self.groups.iter() {
                if !g.members.iter().any(|&i| f.allows(i as usize)) {
                    continue;
                }
                let got = match &g.algo {
                    Algo::RoundRobin(seq) => seq.peek(f),
                    _ => self.pick_in(g, chash::key_hash(hash_key.unwrap_or_default()), f),
                };
                if got.is_some() {
                    return got;
                }
            }
        }
        None
    }

    /// Call when a request is sent to node `i` (least_conn's active count).
    #[inline]
    pub fn on_request_start(&self, node: usize) {
        if let Some(s) = self.stats.get(node) {
            s.active.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Call when the request to node `i` finished (or failed) after `elapsed` (connect +
    /// response time, APISIX's ewma rtt). Failures never lower a node's ewma.
    pub fn on_request_end(&self, node: usize, elapsed: Duration, ok: bool) {
        self.end(node, elapsed, ok, None);
    }

    /// [`Balancer::on_request_end`] for callers that already hold the current time (saves the
    /// ewma balancer a clock read).
    pub fn on_request_end_at(&self, node: usize, elapsed: Duration, ok: bool, now: Instant) {
        self.end(node, elapsed, ok, Some(now));
    }

    fn end(&self, node: usize, elapsed: Duration, ok: bool, now: Option<Instant>) {
        let Some(s) = self.stats.get(node) else {
            return;
        };
        // Saturating: an unpaired end must not wrap the counter to u32::MAX.
        let _ = s
            .active
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| a.checked_sub(1));
        if self.kind == LbKind::Ewma {
            let now_ns = match now {
                Some(t) => u64::try_from(t.saturating_duration_since(self.epoch).as_nanos())
                    .unwrap_or(u64::MAX),
                None => self.now_ns(),
            };
            ewma::record(s, elapsed, ok, now_ns);
        }
    }

    fn pick_filtered(&self, hash_key: Option<&[u8]>, f: &Filter<'_>) -> Option<usize> {
        let key_hash = match self.kind {
            LbKind::Chash => chash::key_hash(hash_key.unwrap_or_default()),
            _ => 0,
        };
        self.groups
            .iter()
            .find_map(|g| self.pick_in(g, key_hash, f))
    }

    fn pick_in(&self, g: &Group, key_hash: u32, f: &Filter<'_>) -> Option<usize> {
        let open = f.is_open();
        // Retries and unhealthy nodes: bail out cheaply when this group has nothing left, so
        // the sequence/ring walks below always terminate on an eligible entry early.
        if !open && !g.members.iter().any(|&i| f.allows(i as usize)) {
            return None;
        }
        match &g.algo {
            Algo::RoundRobin(seq) => seq.pick(f, open),
            Algo::Chash(ring) => ring.pick(key_hash, f, open),
            Algo::LeastConn => least_conn::pick(&g.members, &g.weights, &self.stats, f, open),
            Algo::Ewma => ewma::pick(&g.members, &self.stats, f, open),
        }
    }

    fn any_weighted_healthy(&self) -> bool {
        self.groups
            .iter()
            .flat_map(|g| g.members.iter())
            .any(|&i| self.health.is_healthy(i as usize))
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Test hook: ewma update at an explicit time (nanoseconds since the epoch).
    #[cfg(test)]
    fn record_at(&self, node: usize, elapsed: Duration, ok: bool, now_ns: u64) {
        if let Some(s) = self.stats.get(node) {
            ewma::record(s, elapsed, ok, now_ns);
        }
    }
}

// === impl Filter ===

impl Filter<'_> {
    /// Nothing to skip: first attempt and every node healthy.
    #[inline]
    fn is_open(&self) -> bool {
        self.health.is_none() && self.tried.is_empty()
    }

    /// A later attempt of a request: some node was already tried.
    #[inline]
    fn is_retry(&self) -> bool {
        !self.tried.is_empty()
    }

    #[inline]
    fn allows(&self, i: usize) -> bool {
        !self.tried.contains(i) && self.health.is_none_or(|h| h.is_healthy(i))
    }
}

// === per-thread randomness ===

thread_local! {
    /// xorshift64 state, seeded from std's per-process random keys.
    static RNG: Cell<u64> = Cell::new(std::collections::hash_map::RandomState::new().hash_one(0u64) | 1);
}

/// murmur3's 32-bit finaliser: a cheap per-pick pseudo-random order over node indices.
#[inline]
fn mix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// A fast, non-cryptographic random number for tie-breaking and power-of-two choices.
#[inline]
fn rand_u64() -> u64 {
    RNG.with(|c| {
        let mut x = c.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.set(x);
        x
    })
}

/// Uniform in `0..n` (Lemire's multiply-shift; `n` is a node count, far below 2^32).
#[inline]
fn rand_below(n: usize) -> usize {
    (((rand_u64() >> 32) * (n as u64)) >> 32) as usize
}

#[cfg(test)]
mod tests;
