//! Which connection gives way when `max_connections` is reached.
//!
//! nginx, out of `worker_connections`, closes connections that are "reusable" (idle keep-alive ones and new ones that
//! have not sent a byte) to admit the new one. Sluice does the same and also counts connections still reading a
//! request head: otherwise a few hundred clients dribbling heads hold every slot until their header deadline. A
//! connection busy with a request (or an h2 connection) is never closed for a newcomer.
//!
//! Per worker and lock-free like the rest of the worker state: each connection task owns an `Rc<Slot>`; the worker
//! keeps `Weak`s to find a victim. The keep-alive path pays two `Cell` stores per request (busy / evictable with a
//! sequence number from a worker-local counter, no clock read); the O(connections) scan runs only when the cap is
//! hit. The victim's task is aborted, which drops its socket and runs its guard.

use std::cell::{Cell, OnceCell, RefCell};
use std::rc::{Rc, Weak};

use tokio::task::AbortHandle;

/// One downstream connection's eviction state.
pub(crate) struct Slot {
    /// 0: busy, never evicted. Otherwise the worker sequence number at which it last became evictable (smaller is
    /// older).
    since: Cell<u64>,
    abort: OnceCell<AbortHandle>,
    /// Waiting for the first byte of its next request on a keep-alive connection: a graceful shutdown closes it
    /// ([`Slots::close_idle`]) instead of each such wait watching the shutdown channel (a lock per request).
    idle: Cell<bool>,
    /// When the connection was accepted: the first request's header deadline (TLS handshake included) counts from here.
    pub opened: tokio::time::Instant,
}

impl Slot {
    pub fn set_busy(&self) {
        self.since.set(0);
    }

    pub fn set_evictable(&self, slots: &Slots) {
        let t = slots.tick.get() + 1;
        slots.tick.set(t);
        self.since.set(t);
    }

    pub fn set_abort(&self, h: AbortHandle) {
        let _ = self.abort.set(h);
    }

    /// Marks the wait for the next request's first byte (true) and its end (false).
    pub fn set_idle(&self, idle: bool) {
        self.idle.set(idle);
    }
}

/// A worker's connections, for eviction.
#[derive(Default)]
pub(crate) struct Slots {
    list: RefCell<Vec<Weak<Slot>>>,
    tick: Cell<u64>,
    live: Cell<usize>,
}

impl Slots {
    /// A freshly accepted connection: evictable until its first head is read.
    pub fn register(&self) -> Rc<Slot> {
        let slot = Rc::new(Slot {
            since: Cell::new(0),
            abort: OnceCell::new(),
            idle: Cell::new(false),
            opened: tokio::time::Instant::now(),
        });
        slot.set_evictable(self);
        let mut list = self.list.borrow_mut();
        // Dead entries are dropped once they outnumber the live ones: amortised O(1) per connection.
        if list.len() >= 64 && list.len() > 2 * self.live.get() {
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(Rc::downgrade(&slot));
        self.live.set(self.live.get() + 1);
        slot
    }

    /// A connection task ended.
    pub fn unregister(&self) {
        self.live.set(self.live.get().saturating_sub(1));
    }

    /// At a graceful shutdown: closes every connection waiting for its next request (as nginx closes idle
    /// keep-alive connections). Connections that check the shutdown flag before they wait never start such a wait.
    pub fn close_idle(&self) {
        for s in self.list.borrow().iter().filter_map(Weak::upgrade) {
            if s.idle.get() {
                s.set_busy();
                if let Some(h) = s.abort.get() {
                    h.abort();
                }
            }
        }
    }

    /// Closes the evictable connection that became so first. False when every connection is busy.
    pub fn evict_oldest(&self) -> bool {
        let list = self.list.borrow();
        let victim = list
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| s.since.get() != 0 && s.abort.get().is_some())
            .min_by_key(|s| s.since.get());
        match victim {
            Some(s) => {
                s.set_busy();
                if let Some(h) = s.abort.get() {
                    h.abort();
                }
                true
            }
            None => false,
        }
    }
}
