//! Redis calls that request hooks await (limit-count's quota leases, limit-req's bucket, limit-conn's in-flight
//! set): one thread per Redis backend (and plugin) owns a blocking connection ([`Conn`]) and runs the jobs the
//! hooks queue, in order. A hook queues a job and awaits its answer through [`crate::Ctx::await_io`] and a oneshot
//! channel, so the worker's runtime never blocks; the job runs the script and hands the answer back.
//!
//! Why a thread and not an async client on each worker's runtime: the workers are current-thread runtimes, so a
//! multiplexed async connection would be tied to the runtime that opened it (or there would be one per worker and
//! backend), and the `redis` crate's blocking client, cluster support included, is already in the build. The
//! cost: calls to one backend are serialised, one round trip each (limit-count needs few: a lease serves many
//! requests; limit-req and limit-conn need one per request, as APISIX does).
//!
//! While Redis cannot be reached, a job gets no connection (`None`) and fails at once; a reconnect is tried for the
//! first job at least [`RETRY`] after the last failure, so recovery takes one connect once Redis is back.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::counters::now_ms;
use crate::redis_sync::{Backend, Conn, Connect};

/// How long after a failed connect or command the next job fails without trying.
pub(crate) const RETRY: Duration = Duration::from_millis(50);

/// Jobs sent to Redis in one pipeline at most.
const BATCH: usize = 128;

/// A Redis call run on the backend's thread: the command, and what to do with its answer (`None` when Redis
/// failed or cannot be reached), given the time (counter-epoch ms) taken just before the command was sent.
pub(crate) struct Job {
    pub(crate) cmd: redis::Cmd,
    pub(crate) done: Box<dyn FnOnce(Option<redis::Value>, u64) + Send>,
}

/// One backend's queue.
pub(crate) struct Leaser {
    tx: mpsc::Sender<Job>,
}

impl Leaser {
    /// Queues `job`; false when the backend's thread is gone (then the job was dropped unrun).
    pub(crate) fn run(&self, job: Job) -> bool {
        self.tx.send(job).is_ok()
    }
}

/// The backends of one [`crate::Shared`], each with its thread (ended when the last [`Leaser`] is dropped).
#[derive(Default)]
pub(crate) struct Leasers {
    by_backend: Mutex<HashMap<Backend, Arc<Leaser>>>,
}

impl Leasers {
    /// The queue of a backend (its thread started on first use). Compile-time only.
    pub(crate) fn leaser(&self, c: Connect, plugin: &'static str) -> Arc<Leaser> {
        let mut m = match self.by_backend.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        if let Some(l) = m.get(&c.backend) {
            return l.clone();
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let backend = c.backend.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("sluice-{plugin}-redis"))
            .spawn(move || serve(rx, c, plugin));
        if let Err(e) = spawned {
            // The receiver is gone with the closure: every job fails, as with Redis down.
            tracing::error!(error = %e, "{plugin}: cannot start the redis thread");
        }
        let l = Arc::new(Leaser { tx });
        m.insert(backend, l.clone());
        l
    }
}

/// Runs the queue: every job waiting is sent at once (one pipeline on a single Redis; one after the other on a
/// cluster, whose keys live on different nodes), so requests arriving together share a round trip.
fn serve(rx: mpsc::Receiver<Job>, c: Connect, plugin: &'static str) {
    let mut conn: Option<Conn> = None;
    let mut failed_at: Option<Instant> = None;
    let mut batch: Vec<Job> = Vec::with_capacity(BATCH);
    while let Ok(job) = rx.recv() {
        batch.push(job);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        if conn.is_none() && failed_at.is_none_or(|t| t.elapsed() >= RETRY) {
            match Conn::open(&c.backend, c.timeout, c.password.as_deref()) {
                Ok(con) => {
                    conn = Some(con);
                    failed_at = None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "{plugin}: redis connect failed");
                    failed_at = Some(Instant::now());
                }
            }
        }
        let sent = now_ms();
        let Some(con) = conn.as_mut() else {
            for j in batch.drain(..) {
                (j.done)(None, sent);
            }
            continue;
        };
        let ok = match con {
            Conn::Single(_) if batch.len() > 1 => {
                let mut p = redis::pipe();
                for j in &batch {
                    p.add_command(j.cmd.clone());
                }
                let mut r = con.query_pipe(&p);
                if resend(&r) && reopen(con, &c, plugin) {
                    r = con.query_pipe(&p);
                }
                match r {
                    Ok(values) if values.len() == batch.len() => {
                        for (j, v) in batch.drain(..).zip(values) {
                            (j.done)(Some(v), sent);
                        }
                        true
                    }
                    r => {
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "{plugin}: redis failed");
                        }
                        for j in batch.drain(..) {
                            (j.done)(None, sent);
                        }
                        false
                    }
                }
            }
            _ => {
                let mut ok = true;
                for j in batch.drain(..) {
                    let sent = now_ms();
                    let mut r = con.query::<redis::Value>(&j.cmd);
                    if resend(&r) && reopen(con, &c, plugin) {
                        r = con.query::<redis::Value>(&j.cmd);
                    }
                    match r {
                        Ok(v) => (j.done)(Some(v), sent),
                        Err(e) => {
                            tracing::warn!(error = %e, "{plugin}: redis failed");
                            (j.done)(None, sent);
                            ok = false;
                        }
                    }
                }
                ok
            }
        };
        if !ok {
            conn = None;
            failed_at = Some(Instant::now());
        }
    }
}

/// Whether the call should be sent once more on a fresh connection: Redis refused it as a replica (a master
/// demoted by a failover runs none of a refused write), or closed the connection (a demoted master closes its
/// clients; a restarted Redis left the connection stale). If a dropped call had in fact run, sending it again
/// counts it twice: stricter, never past the limit (a lease granted twice leaves quota unused, a request
/// counted twice in a bucket or a connection set is only refused sooner).
fn resend<T>(r: &redis::RedisResult<T>) -> bool {
    matches!(r, Err(e) if e.kind() == redis::ErrorKind::ReadOnly || e.is_connection_dropped())
}

/// Connects again (a sentinel backend asks where the master is now); false, leaving `con`, when that fails.
fn reopen(con: &mut Conn, c: &Connect, plugin: &str) -> bool {
    match Conn::open(&c.backend, c.timeout, c.password.as_deref()) {
        Ok(fresh) => {
            tracing::info!("{plugin}: redis connection dropped or read-only; reconnected");
            *con = fresh;
            true
        }
        Err(_) => false,
    }
}

/// Runs `cmd` on the backend's thread; the receiver gets its answer, or `None` when Redis failed or cannot be
/// reached (a receiver whose sender is dropped unanswered means the same).
pub(crate) fn call<T>(leaser: &Leaser, cmd: redis::Cmd) -> oneshot::Receiver<Option<T>>
where
    T: redis::FromRedisValue + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    leaser.run(Job {
        cmd,
        done: Box::new(move |v, _| {
            let _ = tx.send(v.and_then(|v| T::from_redis_value(&v).ok()));
        }),
    });
    rx
}
