//! Per-node health state for one upstream: passive checks on real traffic (APISIX
//! `checks.passive`, counted like lua-resty-healthcheck) plus a seam for the active checker.
//!
//! Each node is one `AtomicU64` packing four 8-bit consecutive-event counters and an unhealthy
//! bit, updated with a compare-and-swap loop: reads on the pick path are one relaxed load, writes
//! never lock. This module does not probe anything and does not know node addresses; the active
//! checker (a later issue) drives [`Health::set_healthy`], the proxy drives the `report_*` calls.
//!
//! Counting rules (lua-resty-healthcheck `incr_counter`, with its "mostly_healthy/unhealthy"
//! states folded into the two that matter for routing):
//! - healthy node: a failure of kind k bumps counter k and clears the success counter; when
//!   counter k reaches its threshold the node turns unhealthy. A success clears the failure
//!   counters, so only *consecutive* failures trip a node.
//! - unhealthy node: a success bumps the success counter and clears failures; at
//!   `healthy_successes` the node turns healthy. A failure clears the success counter.
//! - a threshold of 0 disables that counter (lua-resty-healthcheck's `limit == 0`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

/// What went wrong on a request to a node (APISIX maps nginx's last failure to these:
/// 504 -> timeout, other connect/send/receive errors -> tcp, bad status -> http).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Connect/send/receive error (`unhealthy.tcp_failures`).
    Tcp,
    /// Timeout (`unhealthy.timeouts`).
    Timeout,
    /// Response status in `unhealthy.http_statuses`, or an invalid response (`unhealthy.http_failures`).
    Http,
}

/// APISIX `upstream.checks.passive` (type http). Thresholds are 1..=254 in APISIX's schema;
/// 0 here disables the counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassiveConfig {
    /// `healthy.http_statuses`: responses that count as a success.
    pub healthy_http_statuses: Vec<u16>,
    /// `healthy.successes`: consecutive successes that restore an unhealthy node.
    pub healthy_successes: u8,
    /// `unhealthy.http_statuses`: responses that count as an http failure.
    pub unhealthy_http_statuses: Vec<u16>,
    /// `unhealthy.http_failures`.
    pub unhealthy_http_failures: u8,
    /// `unhealthy.tcp_failures`.
    pub unhealthy_tcp_failures: u8,
    /// `unhealthy.timeouts`.
    pub unhealthy_timeouts: u8,
}

impl Default for PassiveConfig {
    /// APISIX's schema defaults (`apisix/schema_def.lua`, `health_checker.passive`).
    fn default() -> Self {
        PassiveConfig {
            healthy_http_statuses: vec![
                200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305,
                306, 307, 308,
            ],
            healthy_successes: 5,
            unhealthy_http_statuses: vec![429, 500, 503],
            unhealthy_http_failures: 5,
            unhealthy_tcp_failures: 2,
            unhealthy_timeouts: 7,
        }
    }
}

impl PassiveConfig {
    /// No passive checks (APISIX without `checks`): every report is ignored, nodes stay healthy.
    pub fn disabled() -> Self {
        PassiveConfig {
            healthy_http_statuses: Vec::new(),
            healthy_successes: 0,
            unhealthy_http_statuses: Vec::new(),
            unhealthy_http_failures: 0,
            unhealthy_tcp_failures: 0,
            unhealthy_timeouts: 0,
        }
    }
}

/// One node's state for the admin/status API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStatus {
    /// Index into [`crate::Balancer::nodes`].
    pub index: usize,
    pub healthy: bool,
    /// Consecutive successes counted while unhealthy.
    pub successes: u8,
    pub http_failures: u8,
    pub tcp_failures: u8,
    pub timeouts: u8,
}

const SUCCESS_SHIFT: u32 = 0;
const HTTP_SHIFT: u32 = 8;
const TCP_SHIFT: u32 = 16;
const TIMEOUT_SHIFT: u32 = 24;
const FAILURE_MASK: u64 = 0xff_ff_ff << HTTP_SHIFT;
const SUCCESS_MASK: u64 = 0xff << SUCCESS_SHIFT;
const UNHEALTHY: u64 = 1 << 32;

/// HTTP statuses 0..512 as a bitmap: O(1), allocation-free classification.
#[derive(Debug, Clone, Default)]
struct StatusSet([u64; 8]);

impl StatusSet {
    fn new(codes: &[u16]) -> Self {
        let mut set = StatusSet::default();
        for &c in codes {
            let c = usize::from(c);
            if let Some(w) = set.0.get_mut(c.wrapping_sub(100) / 64) {
                *w |= 1 << (c.wrapping_sub(100) % 64);
            }
        }
        set
    }

    fn contains(&self, code: u16) -> bool {
        let c = usize::from(code).wrapping_sub(100);
        self.0.get(c / 64).is_some_and(|w| w & (1 << (c % 64)) != 0)
    }
}

/// Health of every node of one balancer. Lock-free; shared by all workers.
#[derive(Debug)]
pub struct Health {
    states: Box<[AtomicU64]>,
    unhealthy: AtomicUsize,
    /// Shared: every upstream without passive checks points at one disabled set (issue 16: the rules are ~180
    /// bytes, paid per route with an inline upstream when they were inline).
    rules: Arc<Rules>,
}

/// The passive configuration with its status sets, read-only once built.
#[derive(Debug)]
struct Rules {
    healthy_codes: StatusSet,
    unhealthy_codes: StatusSet,
    cfg: PassiveConfig,
}

impl Rules {
    fn new(cfg: PassiveConfig) -> Rules {
        Rules {
            healthy_codes: StatusSet::new(&cfg.healthy_http_statuses),
            unhealthy_codes: StatusSet::new(&cfg.unhealthy_http_statuses),
            cfg,
        }
    }
}

static DISABLED: LazyLock<Arc<Rules>> =
    LazyLock::new(|| Arc::new(Rules::new(PassiveConfig::disabled())));

// === impl Health ===

impl Health {
    /// `n` nodes, all healthy (APISIX's checker also starts targets healthy).
    pub fn new(n: usize, cfg: PassiveConfig) -> Self {
        let rules = if cfg == DISABLED.cfg {
            DISABLED.clone()
        } else {
            Arc::new(Rules::new(cfg))
        };
        Health {
            states: (0..n).map(|_| AtomicU64::new(0)).collect(),
            unhealthy: AtomicUsize::new(0),
            rules,
        }
    }

    /// The passive configuration in force.
    pub fn config(&self) -> &PassiveConfig {
        &self.rules.cfg
    }

    /// Number of nodes tracked.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether no node is tracked.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Whether node `i` may receive traffic. Unknown indices are reported unhealthy.
    #[inline]
    pub fn is_healthy(&self, i: usize) -> bool {
        self.states
            .get(i)
            .is_some_and(|s| s.load(Ordering::Relaxed) & UNHEALTHY == 0)
    }

    /// How many nodes are currently unhealthy (0 lets `pick` skip per-node health checks).
    #[inline]
    pub fn unhealthy_count(&self) -> usize {
        self.unhealthy.load(Ordering::Relaxed)
    }

    /// A successful request (or a status in `healthy.http_statuses`).
    pub fn report_success(&self, i: usize) {
        self.count(i, SUCCESS_SHIFT, self.rules.cfg.healthy_successes);
    }

    /// A failed request of the given kind.
    pub fn report_failure(&self, i: usize, kind: FailureKind) {
        let (shift, limit) = match kind {
            FailureKind::Tcp => (TCP_SHIFT, self.rules.cfg.unhealthy_tcp_failures),
            FailureKind::Timeout => (TIMEOUT_SHIFT, self.rules.cfg.unhealthy_timeouts),
            FailureKind::Http => (HTTP_SHIFT, self.rules.cfg.unhealthy_http_failures),
        };
        self.count(i, shift, limit);
    }

    /// Classifies a response status like lua-resty-healthcheck `report_http_status`: healthy
    /// statuses count as success, unhealthy ones (and 0, an invalid response) as an http failure,
    /// anything else is ignored.
    pub fn report_http_status(&self, i: usize, status: u16) {
        if self.rules.healthy_codes.contains(status) {
            self.report_success(i);
        } else if status == 0 || self.rules.unhealthy_codes.contains(status) {
            self.report_failure(i, FailureKind::Http);
        }
    }

    /// Seam for the active checker (and the admin API): force a node's state and clear its
    /// counters, like lua-resty-healthcheck `set_target_status`.
    pub fn set_healthy(&self, i: usize, healthy: bool) {
        let Some(state) = self.states.get(i) else {
            return;
        };
        let new = if healthy { 0 } else { UNHEALTHY };
        let old = state.swap(new, Ordering::AcqRel);
        self.account(old, new);
    }

    /// Copies node `j` of `other` (state and counters) onto node `i` (config reloads).
    pub(crate) fn copy_node(&self, i: usize, other: &Health, j: usize) {
        let (Some(dst), Some(src)) = (self.states.get(i), other.states.get(j)) else {
            return;
        };
        let old = dst.swap(src.load(Ordering::Relaxed), Ordering::AcqRel);
        self.account(old, dst.load(Ordering::Relaxed));
    }

    /// Every node's state, for the status API.
    pub fn snapshot(&self) -> Vec<NodeStatus> {
        self.states
            .iter()
            .enumerate()
            .map(|(index, s)| {
                let v = s.load(Ordering::Relaxed);
                let byte = |shift: u32| ((v >> shift) & 0xff) as u8;
                NodeStatus {
                    index,
                    healthy: v & UNHEALTHY == 0,
                    successes: byte(SUCCESS_SHIFT),
                    http_failures: byte(HTTP_SHIFT),
                    tcp_failures: byte(TCP_SHIFT),
                    timeouts: byte(TIMEOUT_SHIFT),
                }
            })
            .collect()
    }

    fn count(&self, i: usize, shift: u32, limit: u8) {
        if limit == 0 {
            return;
        }
        let Some(state) = self.states.get(i) else {
            return;
        };
        let towards_healthy = shift == SUCCESS_SHIFT;
        let step = |v: u64| -> Option<u64> {
            let unhealthy = v & UNHEALTHY != 0;
            let next = match (unhealthy, towards_healthy) {
                // Healthy and a success: only consecutive failures count, so forget them.
                (false, true) => v & !FAILURE_MASK,
                // Unhealthy and a failure: successes must be consecutive too.
                (true, false) => v & !SUCCESS_MASK,
                _ => {
                    let ctr = (((v >> shift) & 0xff) as u8).saturating_add(1);
                    if ctr >= limit {
                        if towards_healthy {
                            0
                        } else {
                            UNHEALTHY
                        }
                    } else {
                        let cleared = if towards_healthy {
                            v & !FAILURE_MASK
                        } else {
                            v & !SUCCESS_MASK
                        };
                        (cleared & !(0xff << shift)) | (u64::from(ctr) << shift)
                    }
                }
            };
            (next != v).then_some(next)
        };
        if let Ok(old) = state.fetch_update(Ordering::AcqRel, Ordering::Relaxed, step) {
            let new = step(old).unwrap_or(old);
            self.account(old, new);
        }
    }

    /// Keeps `unhealthy` in step with the bit flips this thread's CAS/swap performed.
    fn account(&self, old: u64, new: u64) {
        match (old & UNHEALTHY != 0, new & UNHEALTHY != 0) {
            (false, true) => {
                self.unhealthy.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.unhealthy.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
