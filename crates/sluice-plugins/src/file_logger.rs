//! file-logger (priority 399, log): appends one JSON line per request to `path`. The log phase only hands the
//! line to a per-path writer thread over a bounded channel (a full channel drops the line and counts it), so a
//! slow disk never stalls a request.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::log_entry::{entry, with_req_body, Format};
use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "file-logger";
pub const PRIORITY: i32 = 399;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

/// Lines buffered per file before new ones are dropped.
const QUEUE: usize = 65_536;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "log_format": {"type": "object"},
            "include_req_body": {"type": "boolean", "default": false},
            "include_resp_body": {"type": "boolean", "default": false},
            "include_resp_body_expr": {"type": "array", "minItems": 1, "items": {"type": "array"}}
        },
        "required": ["path"]
    })
}

#[derive(Deserialize)]
struct Conf {
    path: String,
    log_format: Option<Value>,
    #[serde(default)]
    include_req_body: bool,
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    Format::compile(c.log_format.as_ref()).map(drop)
}

/// Writer threads by path, shared by every snapshot.
#[derive(Default)]
pub(crate) struct Writers {
    by_path: Mutex<HashMap<String, SyncSender<String>>>,
    pub(crate) dropped: AtomicU64,
}

impl Writers {
    fn sender(&self, path: &str) -> Result<SyncSender<String>, String> {
        let mut m = self
            .by_path
            .lock()
            .map_err(|_| "file-logger writers poisoned")?;
        if let Some(s) = m.get(path) {
            return Ok(s.clone());
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("failed to open file: {path}, error info: {e}"))?;
        let (tx, rx) = sync_channel::<String>(QUEUE);
        std::thread::Builder::new()
            .name("sluice-file-logger".into())
            .spawn(move || {
                while let Ok(line) = rx.recv() {
                    let _ = file.write_all(line.as_bytes());
                    while let Ok(more) = rx.try_recv() {
                        let _ = file.write_all(more.as_bytes());
                    }
                    let _ = file.flush();
                }
            })
            .map_err(|e| e.to_string())?;
        m.insert(path.to_owned(), tx.clone());
        Ok(tx)
    }
}

struct FileLogger {
    tx: SyncSender<String>,
    format: Option<Format>,
    include_req_body: bool,
    writers: Arc<Writers>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(FileLogger {
        tx: env.shared.writers.sender(&c.path)?,
        format: Format::resolve(c.log_format.as_ref(), env, NAME)?,
        include_req_body: c.include_req_body,
        writers: env.shared.writers.clone(),
    }))
}

impl Plugin for FileLogger {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Log])
    }
    fn needs_body(&self) -> bool {
        self.include_req_body
    }
    fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        let mut e = entry(ctx, info, self.format.as_ref());
        if self.include_req_body {
            with_req_body(&mut e, ctx);
        }
        let mut line = e.to_string();
        line.push('\n');
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(line) {
            self.writers.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
