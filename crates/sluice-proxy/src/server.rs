//! Listeners, worker threads and graceful shutdown.
//!
//! Each worker is an OS thread running a single-threaded tokio runtime with its own SO_REUSEPORT listener per
//! address, so the kernel spreads connections over workers and a connection never migrates between threads
//! (nginx's model). Per-worker state (the upstream pool) therefore needs no locks. The shared state is the
//! published snapshot, a generation counter, and a handful of counters touched per connection, not per request.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice_http::Limits;
use sluice_model::NodeConfig;
use tokio::net::TcpListener;

use crate::accept::{self, ListenerKind};
use crate::pool::Pool;
use crate::slots::Slots;
use crate::snapshot::Snapshot;

/// Data-plane settings taken from the node configuration at start.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub limits: Limits,
    /// The whole request head must arrive within this, counted from its first byte (for a connection's first
    /// request, from the accept, TLS handshake included): a deadline, not an idle timer, so a head dribbled a byte
    /// at a time is cut at it. 408 when part of a head arrived, a silent close otherwise.
    pub header_timeout: Duration,
    /// nginx `client_body_timeout` (APISIX `nginx_config.http.client_body_timeout`): the longest wait between two
    /// successive reads of a request body; 408 when it fires before any response byte.
    pub body_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub graceful_timeout: Duration,
    /// 0 = unlimited.
    pub max_body: u64,
    pub max_connections: usize,
    /// Serve h2c (prior knowledge) on plain listeners (APISIX `apisix.enable_http2`).
    pub enable_http2: bool,
    /// The SNI assumed for TLS clients that send none (APISIX `apisix.ssl.fallback_sni`).
    pub fallback_sni: Option<Box<str>>,
    /// APISIX `apisix.normalize_uri_like_servlet`: route on the path with `;` parameters cut from every segment.
    pub normalize_uri_like_servlet: bool,
    /// Where workers send access log lines (`None`: no access log). The binary opens it ([`crate::AccessLog`]).
    pub access_log: Option<crate::AccessLogHandle>,
    /// APISIX `proxy_protocol.enable_tcp_pp_to_upstream`: stream upstream connections open with a PROXY v1 header.
    pub proxy_protocol_to_upstream: bool,
    /// The stream access log (`nginx_config.stream`): its writer (opened by the binary) and line format.
    pub stream_access_log: Option<(crate::AccessLogHandle, Arc<crate::StreamFormat>)>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig::from_node(&NodeConfig::default())
    }
}

impl ProxyConfig {
    pub fn from_node(n: &NodeConfig) -> Self {
        let s = &n.sluice;
        let secs = |v: f64| Duration::from_secs_f64(v.max(0.001));
        ProxyConfig {
            limits: Limits::default(),
            header_timeout: secs(s.client_header_timeout),
            body_timeout: secs(n.nginx_config.http.client_body_timeout.as_secs_f64()),
            keepalive_timeout: secs(s.keepalive_timeout),
            graceful_timeout: secs(s.graceful_shutdown_timeout),
            max_body: s.client_max_body_size,
            max_connections: s.max_connections.max(1),
            enable_http2: n.apisix.enable_http2,
            fallback_sni: n
                .apisix
                .ssl
                .as_ref()
                .and_then(|v| v.get("fallback_sni"))
                .and_then(|v| v.as_str())
                .filter(|v| !v.is_empty())
                .map(|v| v.to_ascii_lowercase().into()),
            normalize_uri_like_servlet: n.apisix.normalize_uri_like_servlet,
            access_log: None,
            proxy_protocol_to_upstream: n
                .apisix
                .proxy_protocol
                .as_ref()
                .is_some_and(|p| p.enable_tcp_pp_to_upstream),
            stream_access_log: None,
        }
    }
}

pub(crate) struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    generation: AtomicU64,
    pub cfg: ProxyConfig,
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// Set (before `shutdown` is sent) once a graceful shutdown began: the per-request check is one atomic load
    /// where the watch channel's `borrow` takes a lock.
    stopping: AtomicBool,
    connections: AtomicUsize,
    upstream_connects: AtomicU64,
    accepted: AtomicU64,
    /// Live counters: workers hand their seconds over here, `Gateway::run_stats` closes them.
    pub stats: sluice_stats::Hub,
    stats_tx: tokio::sync::broadcast::Sender<Arc<sluice_stats::Sample>>,
}

impl Shared {
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
    /// A graceful shutdown began.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
    pub fn count_connect(&self) {
        self.upstream_connects.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) struct Worker {
    pub shared: Arc<Shared>,
    pub pool: Pool,
    active: Cell<usize>,
    pub slots: Slots,
    /// This worker's access log buffer.
    pub log: Option<crate::access_log::Local>,
    /// This worker's stream access log buffer.
    pub stream_log: Option<crate::access_log::Local>,
    /// This worker's live counters for the current second (its own: no lock).
    pub stats: std::cell::RefCell<sluice_stats::Local>,
    /// Connection buffers of finished connections and h2 streams, for the next ones.
    pub bufs: crate::conn::BufPool,
}

/// The data plane: publish snapshots into it, start it on bound listeners, shut it down gracefully.
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
}

/// One upstream's nodes as health checks see them ([`Gateway::node_health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHealth {
    /// `u:<upstream id>` or `r:<route id>` (inline upstream).
    pub key: String,
    /// Whether an active checker probes it.
    pub active: bool,
    pub nodes: Vec<NodeHealth>,
}

/// One node: its `host:port` as configured and its health counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    pub addr: String,
    pub status: sluice_upstream::NodeStatus,
}

/// Listeners bound before the gateway starts, so tests and the binary can learn the real ports (port 0) and hand
/// the sockets over without a bind race.
pub struct Listeners {
    per_worker: Vec<Vec<(std::net::TcpListener, ListenerKind)>>,
    pub local_addrs: Vec<SocketAddr>,
    /// UDP stream listeners (APISIX `stream_proxy.udp`), one SO_REUSEPORT socket per worker and address.
    udp_per_worker: Vec<Vec<std::net::UdpSocket>>,
    pub udp_local_addrs: Vec<SocketAddr>,
}

impl Listeners {
    /// Binds `workers` SO_REUSEPORT sockets to each address, all cleartext HTTP.
    pub fn bind(addrs: &[SocketAddr], workers: usize) -> io::Result<Listeners> {
        let plain: Vec<_> = addrs.iter().map(|a| (*a, ListenerKind::Plain)).collect();
        Self::bind_kinds(&plain, workers)
    }

    /// Binds `workers` SO_REUSEPORT sockets to each address. Port 0 is resolved by the first bind and reused.
    pub fn bind_kinds(
        addrs: &[(SocketAddr, ListenerKind)],
        workers: usize,
    ) -> io::Result<Listeners> {
        let workers = workers.max(1);
        let mut per_worker: Vec<Vec<(std::net::TcpListener, ListenerKind)>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut local_addrs = Vec::new();
        for &(addr, kind) in addrs {
            let mut actual = addr;
            for (i, w) in per_worker.iter_mut().enumerate() {
                let l = reuseport_listener(actual)?;
                if i == 0 {
                    actual = l.local_addr()?;
                    local_addrs.push(actual);
                }
                w.push((l, kind));
            }
        }
        let udp_per_worker = (0..workers).map(|_| Vec::new()).collect();
        Ok(Listeners {
            per_worker,
            local_addrs,
            udp_per_worker,
            udp_local_addrs: Vec::new(),
        })
    }

    /// Adds UDP stream listeners: one SO_REUSEPORT socket per worker and address (port 0 resolved by the first).
    pub fn bind_udp(&mut self, addrs: &[SocketAddr]) -> io::Result<()> {
        for &addr in addrs {
            let mut actual = addr;
            for (i, w) in self.udp_per_worker.iter_mut().enumerate() {
                let s = reuseport_udp(actual)?;
                if i == 0 {
                    actual = s.local_addr()?;
                    self.udp_local_addrs.push(actual);
                }
                w.push(s);
            }
        }
        Ok(())
    }

    pub fn workers(&self) -> usize {
        self.per_worker.len()
    }
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

fn reuseport_udp(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// Running worker threads.
pub struct Running {
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Waits until every worker has drained and stopped.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

impl Gateway {
    pub fn new(cfg: ProxyConfig, initial: Snapshot) -> Self {
        let (shutdown, _) = tokio::sync::watch::channel(false);
        Gateway {
            shared: Arc::new(Shared {
                snapshot: ArcSwap::from_pointee(initial),
                generation: AtomicU64::new(1),
                cfg,
                shutdown,
                stopping: AtomicBool::new(false),
                connections: AtomicUsize::new(0),
                upstream_connects: AtomicU64::new(0),
                accepted: AtomicU64::new(0),
                stats: sluice_stats::Hub::default(),
                stats_tx: tokio::sync::broadcast::channel(16).0,
            }),
        }
    }

    /// Publishes a new snapshot to every worker. Requests in flight finish on the snapshot they started with; each
    /// connection picks the new one up at its next request.
    pub fn publish(&self, snap: Snapshot) {
        self.shared.snapshot.store(Arc::new(snap));
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    /// The configuration revision the data plane is serving.
    pub fn applied_revision(&self) -> u64 {
        self.shared.snapshot.load().revision
    }

    /// Upstream TCP connections opened so far (pool reuse shows as this staying far below the request count).
    pub fn upstream_connects(&self) -> u64 {
        self.shared.upstream_connects.load(Ordering::Relaxed)
    }

    /// Downstream connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Open downstream connections.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Runs the active health checkers (APISIX `checks.active`) of every published upstream until shutdown,
    /// following reloads. Spawn it on a runtime that is not a worker's (the binary's control runtime).
    pub fn run_health_checks(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        crate::health_check::run(self.shared.clone())
    }

    /// Per-upstream node health of the serving snapshot, sorted by upstream key (`u:<id>` for upstream resources,
    /// `r:<route id>` for inline ones), for the Admin API.
    pub fn node_health(&self) -> Vec<UpstreamHealth> {
        let snap = self.shared.snapshot.load();
        let mut out: Vec<UpstreamHealth> = snap
            .upstream_entries()
            .map(|(key, up)| UpstreamHealth {
                key: key.to_string(),
                active: up.active.is_some(),
                nodes: up
                    .balancer
                    .health()
                    .snapshot()
                    .into_iter()
                    .map(|st| NodeHealth {
                        addr: up
                            .balancer
                            .nodes()
                            .get(st.index)
                            .map(|n| n.addr.clone())
                            .unwrap_or_default(),
                        status: st,
                    })
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Live counters of every stream route of the serving snapshot (connections open and in all, bytes each
    /// way), in configuration order.
    pub fn stream_stats(&self) -> Vec<crate::StreamRouteStats> {
        self.shared.snapshot.load().stream.stats()
    }

    /// Closes one second of live counters at a time (0.3 s after each wall-clock second, once the workers have
    /// handed theirs over), keeps it in the ring and sends it to [`Gateway::stats_subscribe`]rs. Spawn it on a
    /// runtime that is not a worker's.
    pub fn run_stats(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shared = self.shared.clone();
        async move {
            loop {
                tokio::time::sleep(until_next_second(Duration::from_millis(300))).await;
                let t = unix_now().as_secs().saturating_sub(1);
                let sample = shared.stats.close_second(t);
                let _ = shared.stats_tx.send(sample);
            }
        }
    }

    /// The last `seconds` closed seconds of live counters, oldest first.
    pub fn stats_series(&self, seconds: usize) -> Vec<Arc<sluice_stats::Sample>> {
        self.shared.stats.series(seconds)
    }

    /// Every second closed from now on.
    pub fn stats_subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<sluice_stats::Sample>> {
        self.shared.stats_tx.subscribe()
    }

    /// What the serving snapshot would do with a request (see [`crate::MatchInput`]).
    pub fn match_request(
        &self,
        q: &crate::MatchInput<'_>,
    ) -> Result<Option<crate::MatchOutcome>, crate::InspectError> {
        self.shared
            .snapshot
            .load()
            .match_request(q, self.shared.cfg.normalize_uri_like_servlet)
    }

    /// The plugins route `id` runs, in order, with `consumer`'s (`Ok(None)`: not served).
    pub fn effective(
        &self,
        id: &str,
        consumer: Option<&str>,
    ) -> Result<Option<Vec<crate::ChainEntry>>, crate::InspectError> {
        self.shared.snapshot.load().effective(id, consumer)
    }

    /// Starts one worker thread per listener set.
    pub fn start(&self, listeners: Listeners) -> io::Result<Running> {
        let mut threads = Vec::new();
        let sets = listeners
            .per_worker
            .into_iter()
            .zip(listeners.udp_per_worker);
        for (i, (set, udp)) in sets.enumerate() {
            let shared = self.shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("sluice-worker-{i}"))
                .spawn(move || worker_main(shared, set, udp))?;
            threads.push(t);
        }
        Ok(Running { threads })
    }

    /// Begins a graceful shutdown: stop accepting, let requests in flight finish (up to the graceful timeout),
    /// close idle connections.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.shutdown.send_replace(true);
    }
}

fn worker_main(
    shared: Arc<Shared>,
    listeners: Vec<(std::net::TcpListener, ListenerKind)>,
    udp: Vec<std::net::UdpSocket>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start worker runtime");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let worker = Rc::new(Worker {
            shared: shared.clone(),
            pool: Pool::default(),
            active: Cell::new(0),
            slots: Slots::default(),
            log: shared
                .cfg
                .access_log
                .as_ref()
                .map(crate::access_log::Local::new),
            stream_log: shared
                .cfg
                .stream_access_log
                .as_ref()
                .map(|(h, _)| crate::access_log::Local::new(h)),
            stats: Default::default(),
            bufs: Default::default(),
        });
        {
            // Hands this worker's second of counters over at each wall-clock second. Ends with the runtime.
            let w = worker.clone();
            tokio::task::spawn_local(async move {
                loop {
                    tokio::time::sleep(until_next_second(Duration::ZERO)).await;
                    let batch = w.stats.borrow_mut().take();
                    if let Some(b) = batch {
                        w.shared.stats.submit(b);
                    }
                }
            });
        }
        if worker.log.is_some() || worker.stream_log.is_some() {
            let w = worker.clone();
            // Lines of a quiet worker still reach the file within a second. The task ends with the runtime.
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(crate::access_log::FLUSH_EVERY);
                loop {
                    tick.tick().await;
                    if let Some(l) = &w.log {
                        l.tick();
                    }
                    if let Some(l) = &w.stream_log {
                        l.tick();
                    }
                }
            });
        }
        let mut accept_tasks = Vec::new();
        for (l, kind) in listeners {
            let l = match TcpListener::from_std(l) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "cannot register listener");
                    continue;
                }
            };
            accept_tasks.push(tokio::task::spawn_local(accept_loop(
                l,
                kind,
                worker.clone(),
            )));
        }
        for u in udp {
            match tokio::net::UdpSocket::from_std(u) {
                Ok(u) => accept_tasks.push(tokio::task::spawn_local(crate::stream::udp::serve(
                    u,
                    shared.clone(),
                ))),
                Err(e) => tracing::error!(error = %e, "cannot register UDP listener"),
            }
        }
        for t in accept_tasks {
            let _ = t.await;
        }
        // Draining: accept loops have stopped; wait for open connections to finish, within the grace period.
        let deadline = tokio::time::Instant::now() + shared.cfg.graceful_timeout;
        while worker.active.get() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(l) = &worker.log {
            l.finish();
        }
        if let Some(l) = &worker.stream_log {
            l.finish();
        }
    });
}

async fn accept_loop(l: TcpListener, kind: ListenerKind, w: Rc<Worker>) {
    let mut shutdown = w.shared.shutdown.subscribe();
    let local_addr = l.local_addr().ok();
    loop {
        if *shutdown.borrow() {
            w.slots.close_idle();
            return;
        }
        let accepted = tokio::select! {
            r = l.accept() => r,
            _ = shutdown.changed() => {
                // Idle keep-alive connections of this worker wait without watching the shutdown (see
                // `Conn::read_head`): they are closed here.
                w.slots.close_idle();
                return;
            }
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = &w.shared;
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        // At the cap, an idle or head-reading connection of this worker makes room (see `slots`); only when all
        // are busy is the newcomer closed unanswered. Until the victim's task drops, the count is one over.
        if shared.connections.fetch_add(1, Ordering::Relaxed) >= shared.cfg.max_connections
            && !w.slots.evict_oldest()
        {
            shared.connections.fetch_sub(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().ok().or(local_addr).unwrap_or(peer);
        w.active.set(w.active.get() + 1);
        let slot = w.slots.register();
        let guard = ConnGuard(w.clone());
        // Boxed once: a connection's future (TLS, h2, a `Conn`) is many KiB and the spawn would copy it again.
        let task = tokio::task::spawn_local(Box::pin({
            let slot = slot.clone();
            async move {
                let _guard = guard;
                accept::serve(stream, peer, local, kind, slot, _guard.0.clone()).await;
            }
        }));
        slot.set_abort(task.abort_handle());
    }
}

/// Releases a connection's counts however its task ends: finished, or aborted to make room.
struct ConnGuard(Rc<Worker>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let w = &self.0;
        w.active.set(w.active.get() - 1);
        w.slots.unregister();
        w.shared.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// How long until `offset` past the next wall-clock second.
fn until_next_second(offset: Duration) -> Duration {
    let sub = Duration::from_nanos(u64::from(unix_now().subsec_nanos()));
    Duration::from_secs(1) - sub + offset
}
