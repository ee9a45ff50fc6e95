//! The access log (nginx's `access_log` as APISIX configures it), kept off the request path.
//!
//! A worker renders each finished request into its own buffer (no lock, no allocation once the buffer has grown);
//! a full buffer, or whatever is there once a second, is handed as one batch to the writer thread through a
//! bounded channel. The writer does the file IO, so a slow or stalled disk never blocks a worker: when the queue
//! is full the batch is dropped and its lines are counted (and reported on the error log) instead. Memory is
//! bounded by the queue (about 4 MiB of batches) plus one buffer per worker.
//!
//! Files are opened in append mode; [`AccessLogHandle::reopen`] (SIGUSR1 in the binary) makes the writer open the
//! paths again, so a renamed file (logrotate) is left behind and a fresh one started. [`AccessLog::close`] writes
//! what was handed over and stops the writer; workers hand their last lines over when they exit.

mod format;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) use format::{time_local, Line, Try, Upstream};
pub use format::{Escape, Format};
use sluice_model::NodeConfig;

/// How often a worker hands over a partly filled buffer, and how often the writer looks at the reopen flag.
/// nginx's `flush=3` (APISIX) waits 3 s; one second keeps `tail -f` livelier for the same cost.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Bytes of batches the writer may have queued before workers drop lines.
const QUEUE_BYTES: usize = 4 << 20;

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Stdout,
    Stderr,
    File(PathBuf),
}

/// A compiled access log configuration.
#[derive(Debug, Clone)]
pub struct AccessLogConfig {
    pub format: Format,
    pub targets: Vec<Target>,
    /// Bytes a worker gathers before handing them over.
    pub buffer: usize,
}

impl AccessLogConfig {
    /// `nginx_config.http` of config.yaml; `None` when `enable_access_log` is false. Relative paths are taken
    /// from `prefix`.
    pub fn from_node(n: &NodeConfig, prefix: &Path) -> Result<Option<AccessLogConfig>, String> {
        let h = &n.nginx_config.http;
        if !h.enable_access_log {
            return Ok(None);
        }
        let escape = Escape::parse(&h.access_log_format_escape)?;
        let format = Format::compile(&h.access_log_format, escape)?;
        let mut targets = Vec::new();
        for p in &h.access_log {
            targets.push(match p.as_str() {
                "" => return Err("nginx_config.http.access_log: empty path".into()),
                // nginx's `access_log off`.
                "off" => continue,
                "/dev/stdout" | "stdout" => Target::Stdout,
                "/dev/stderr" | "stderr" => Target::Stderr,
                p => Target::File(prefix.join(p)),
            });
        }
        if targets.is_empty() {
            return Ok(None);
        }
        Ok(Some(AccessLogConfig {
            format,
            targets,
            buffer: h.access_log_buffer.clamp(512, 1 << 20),
        }))
    }
}

enum Msg {
    Batch(Vec<u8>, u64),
    Wake,
    Close,
}

struct Sink {
    format: Format,
    buffer: usize,
    tx: SyncSender<Msg>,
    dropped: AtomicU64,
    written: AtomicU64,
    reopen: AtomicBool,
}

/// What the data plane holds of the access log (in [`crate::ProxyConfig`]); cheap to clone.
#[derive(Clone)]
pub struct AccessLogHandle(Arc<Sink>);

impl fmt::Debug for AccessLogHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessLogHandle")
            .field("format", &self.0.format)
            .finish_non_exhaustive()
    }
}

impl AccessLogHandle {
    /// Asks the writer to open its files again (after logrotate renamed them); takes effect within a second.
    pub fn reopen(&self) {
        self.0.reopen.store(true, Ordering::Release);
        let _ = self.0.tx.try_send(Msg::Wake);
    }

    /// Lines dropped because the writer fell behind or could not write.
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }

    /// Lines written so far.
    pub fn written(&self) -> u64 {
        self.0.written.load(Ordering::Relaxed)
    }
}

/// The access log's writer thread. Dropping it closes it (see [`AccessLog::close`]).
pub struct AccessLog {
    handle: AccessLogHandle,
    thread: Option<JoinHandle<()>>,
}

impl AccessLog {
    /// Opens every file target (creating missing parent directories, as APISIX creates `logs/`) and starts the
    /// writer thread. A file that cannot be opened is an error, as in nginx.
    pub fn open(cfg: AccessLogConfig) -> Result<AccessLog, String> {
        let outs = cfg
            .targets
            .iter()
            .map(open_target)
            .collect::<Result<Vec<_>, _>>()?;
        let depth = (QUEUE_BYTES / cfg.buffer).max(8);
        let (tx, rx) = mpsc::sync_channel(depth);
        let sink = Arc::new(Sink {
            format: cfg.format,
            buffer: cfg.buffer,
            tx,
            dropped: AtomicU64::new(0),
            written: AtomicU64::new(0),
            reopen: AtomicBool::new(false),
        });
        let s = sink.clone();
        let targets = cfg.targets;
        let thread = std::thread::Builder::new()
            .name("sluice-access-log".into())
            .spawn(move || writer(rx, targets, outs, s))
            .map_err(|e| format!("starting the access log writer: {e}"))?;
        Ok(AccessLog {
            handle: AccessLogHandle(sink),
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> AccessLogHandle {
        self.handle.clone()
    }

    /// Writes every batch handed over so far and stops the writer. Call after the workers stopped (they hand
    /// their last lines over as they exit).
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(t) = self.thread.take() else { return };
        if send_bounded(&self.handle.0.tx, Msg::Close).is_ok() {
            let _ = t.join();
        }
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends on the writer's queue, waiting at most two seconds for room (shutdown only: never on a worker's
/// request path).
fn send_bounded(tx: &SyncSender<Msg>, mut m: Msg) -> Result<(), ()> {
    for _ in 0..200 {
        match tx.try_send(m) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(back)) => m = back,
            Err(TrySendError::Disconnected(_)) => return Err(()),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(())
}

enum Out {
    Stdout,
    Stderr,
    File(std::fs::File),
}

fn open_target(t: &Target) -> Result<Out, String> {
    Ok(match t {
        Target::Stdout => Out::Stdout,
        Target::Stderr => Out::Stderr,
        Target::File(p) => Out::File(
            open_file(p).map_err(|e| format!("opening the access log {}: {e}", p.display()))?,
        ),
    })
}

fn open_file(p: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
}

fn writer(rx: Receiver<Msg>, targets: Vec<Target>, mut outs: Vec<Out>, sink: Arc<Sink>) {
    let mut reported = 0;
    loop {
        let msg = rx.recv_timeout(FLUSH_EVERY);
        if sink.reopen.swap(false, Ordering::AcqRel) {
            for (t, o) in targets.iter().zip(outs.iter_mut()) {
                if let Target::File(p) = t {
                    match open_file(p) {
                        Ok(f) => *o = Out::File(f),
                        Err(e) => {
                            tracing::error!(path = %p.display(), error = %e, "cannot reopen the access log")
                        }
                    }
                }
            }
        }
        let close = match msg {
            Ok(Msg::Batch(b, lines)) => {
                let mut ok = true;
                for o in outs.iter_mut() {
                    let r = match o {
                        Out::File(f) => f.write_all(&b),
                        Out::Stdout => std::io::stdout().lock().write_all(&b),
                        Out::Stderr => std::io::stderr().lock().write_all(&b),
                    };
                    if let Err(e) = r {
                        ok = false;
                        tracing::error!(error = %e, "cannot write the access log");
                    }
                }
                if ok {
                    sink.written.fetch_add(lines, Ordering::Relaxed);
                } else {
                    sink.dropped.fetch_add(lines, Ordering::Relaxed);
                }
                false
            }
            Ok(Msg::Wake) | Err(RecvTimeoutError::Timeout) => false,
            Ok(Msg::Close) | Err(RecvTimeoutError::Disconnected) => true,
        };
        let dropped = sink.dropped.load(Ordering::Relaxed);
        if dropped != reported {
            tracing::warn!(
                dropped = dropped - reported,
                total = dropped,
                "access log lines dropped (the writer fell behind or failed)"
            );
            reported = dropped;
        }
        if close {
            let _ = std::io::stdout().flush();
            return;
        }
    }
}

/// A worker's share of the access log: its buffer and line count (single-threaded, so `RefCell`).
pub(crate) struct Local {
    sink: Arc<Sink>,
    buf: RefCell<Vec<u8>>,
    lines: Cell<u64>,
}

impl Local {
    pub fn new(h: &AccessLogHandle) -> Local {
        Local {
            sink: h.0.clone(),
            buf: RefCell::new(Vec::with_capacity(h.0.buffer + 1024)),
            lines: Cell::new(0),
        }
    }

    /// Renders one request; hands the buffer over once it is full.
    pub fn log(&self, line: &Line<'_>) {
        let Ok(mut b) = self.buf.try_borrow_mut() else {
            return;
        };
        self.sink.format.render(line, &mut b);
        self.lines.set(self.lines.get() + 1);
        if b.len() >= self.sink.buffer {
            self.hand_over(&mut b);
        }
    }

    /// Appends what `render` writes as one line (the stream access log's own format); same hand-over.
    pub fn log_with(&self, render: impl FnOnce(&mut Vec<u8>)) {
        let Ok(mut b) = self.buf.try_borrow_mut() else {
            return;
        };
        render(&mut b);
        self.lines.set(self.lines.get() + 1);
        if b.len() >= self.sink.buffer {
            self.hand_over(&mut b);
        }
    }

    /// Hands over a partly filled buffer (the worker's once-a-second tick).
    pub fn tick(&self) {
        if let Ok(mut b) = self.buf.try_borrow_mut() {
            if !b.is_empty() {
                self.hand_over(&mut b);
            }
        }
    }

    fn hand_over(&self, b: &mut Vec<u8>) {
        let lines = self.lines.replace(0);
        let full = std::mem::replace(b, Vec::with_capacity(self.sink.buffer + 1024));
        match self.sink.tx.try_send(Msg::Batch(full, lines)) {
            Ok(()) => {}
            Err(TrySendError::Full(Msg::Batch(mut v, _)))
            | Err(TrySendError::Disconnected(Msg::Batch(mut v, _))) => {
                self.sink.dropped.fetch_add(lines, Ordering::Relaxed);
                // Keep the allocation: a stalled disk costs no memory churn either.
                v.clear();
                *b = v;
            }
            Err(_) => {}
        }
    }

    /// The worker is exiting: hand the rest over, waiting (bounded) for room.
    pub fn finish(&self) {
        let Ok(mut b) = self.buf.try_borrow_mut() else {
            return;
        };
        if b.is_empty() {
            return;
        }
        let lines = self.lines.replace(0);
        let rest = std::mem::take(&mut *b);
        if send_bounded(&self.sink.tx, Msg::Batch(rest, lines)).is_err() {
            self.sink.dropped.fetch_add(lines, Ordering::Relaxed);
        }
    }
}
