//! Sluice's default store: an embedded, crash-safe redb database on local disk, so a single node needs no external
//! service. Every commit is one redb write transaction (fsynced before `commit` returns, all-or-nothing after a
//! crash) that updates the keys, the revision counter and the history record together. Reads never touch disk:
//! the whole key space lives in an in-memory [`Snapshot`], replaced (copy-on-write) after each commit.
//! Not here: multi-node replication (that is what the etcd provider is for).

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use sluice_secrets::DataEncryption;
use tokio::sync::watch;

use crate::kv::{
    history_record, now, patch_resources, BoxFuture, Entry, Op, Prepared, Revision, Snapshot,
    Store, StoreError,
};
use crate::{ConfigRx, ConfigTx, Versioned};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const REVISION_KEY: &str = "revision";
/// redb's page cache (see `open_with`).
const CACHE_BYTES: usize = 4 << 20;

pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Serialises commits: guards are checked against the snapshot the commit then replaces.
    writer: Mutex<()>,
    tx: ConfigTx,
    /// Values arrive encrypted from the Admin API; decrypted only for the data plane's view.
    de: Arc<DataEncryption>,
}

fn io<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Unavailable(format!("embedded store: {e}"))
}

impl EmbeddedStore {
    /// Opens (or creates) the database file and loads it. A file left by a crash opens at its last committed
    /// revision: redb never exposes a half-applied transaction.
    pub fn open(path: &Path) -> Result<EmbeddedStore, StoreError> {
        EmbeddedStore::open_with(path, Arc::default())
    }

    /// As [`EmbeddedStore::open`], decrypting secret fields with `de` for the data plane.
    pub fn open_with(path: &Path, de: Arc<DataEncryption>) -> Result<EmbeddedStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        // redb caches up to 1 GiB of pages by default, and every page written stays cached: at 100k routes the
        // key space and the seed's history record alone held ~90 MB (issue 16). Reads are served from `snapshot`,
        // never from redb, so a small cache only costs a commit re-reading (from the OS page cache) the few pages
        // on its path.
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(io)?;
        // Create the tables on first open so reads below find them.
        let w = db.begin_write().map_err(io)?;
        {
            w.open_table(KV).map_err(io)?;
            w.open_table(HISTORY).map_err(io)?;
            w.open_table(META).map_err(io)?;
        }
        w.commit().map_err(io)?;

        let mut snap = Snapshot::default();
        let r = db.begin_read().map_err(io)?;
        let meta = r.open_table(META).map_err(io)?;
        snap.revision = meta.get(REVISION_KEY).map_err(io)?.map_or(0, |g| g.value());
        let kv = r.open_table(KV).map_err(io)?;
        for row in kv.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let entry: Entry = serde_json::from_slice(v.value())
                .map_err(|e| io(format!("corrupt entry {}: {e}", k.value())))?;
            snap.entries.insert(k.value().to_owned(), entry);
        }
        let (tx, _) = watch::channel(Arc::new(Versioned {
            revision: snap.revision,
            resources: snap.to_resources(&de),
            token: 0,
        }));
        Ok(EmbeddedStore {
            inner: Arc::new(Inner {
                db,
                snapshot: RwLock::new(Arc::new(snap)),
                writer: Mutex::new(()),
                tx,
                de,
            }),
        })
    }
}

impl Inner {
    fn current(&self) -> Arc<Snapshot> {
        match self.snapshot.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn commit_blocking(&self, ops: Vec<Op>, prepared: Option<Prepared>) -> Result<u64, StoreError> {
        let _w = self.writer.lock().map_err(|_| io("writer lock poisoned"))?;
        let cur = self.current();
        cur.check_guards(&ops)?;
        let revision = cur.revision + 1;
        let mut prepared = prepared;
        let view = prepared
            .as_mut()
            .filter(|p| p.base == cur.revision)
            .and_then(|p| p.view.take())
            .filter(|v| v.revision == revision);
        let (next, changes) = match view {
            Some(next) => {
                let changes = cur.changes_to(&next, &ops);
                (next, changes)
            }
            None => {
                let mut next = (*cur).clone();
                let changes = next.apply(&ops, revision);
                (next, changes)
            }
        };

        let w = self.db.begin_write().map_err(io)?;
        {
            let mut kv = w.open_table(KV).map_err(io)?;
            for op in &ops {
                match next.get(op.key()) {
                    Some(e) => {
                        kv.insert(op.key(), e.to_row().as_slice()).map_err(io)?;
                    }
                    None => {
                        kv.remove(op.key()).map_err(io)?;
                    }
                }
            }
            let mut hist = w.open_table(HISTORY).map_err(io)?;
            let bytes = history_record(revision, now(), &changes);
            hist.insert(revision, bytes.as_slice()).map_err(io)?;
            let mut meta = w.open_table(META).map_err(io)?;
            meta.insert(REVISION_KEY, revision).map_err(io)?;
        }
        // Durability::Immediate (redb's default): fsynced when this returns.
        w.commit().map_err(io)?;

        let (resources, token) = match prepared {
            Some(p) if p.base == cur.revision => (p.resources, p.token),
            _ => {
                // Only the touched keys are decoded again when the published view matches `cur`.
                let published = self.tx.borrow().clone();
                let r = if published.revision == cur.revision {
                    patch_resources(
                        &published.resources,
                        &next,
                        ops.iter().map(Op::key),
                        &self.de,
                    )
                } else {
                    next.to_resources(&self.de)
                };
                (r, 0)
            }
        };
        let next = Arc::new(next);
        match self.snapshot.write() {
            Ok(mut g) => *g = next,
            Err(p) => *p.into_inner() = next,
        }
        self.tx.send_replace(Arc::new(Versioned {
            revision,
            resources,
            token,
        }));
        Ok(revision)
    }

    fn history_blocking(&self, after: u64, limit: usize) -> Result<Vec<Revision>, StoreError> {
        let r = self.db.begin_read().map_err(io)?;
        let hist = r.open_table(HISTORY).map_err(io)?;
        let mut out = Vec::new();
        for row in hist
            .range(after.saturating_add(1)..)
            .map_err(io)?
            .take(limit)
        {
            let (_, v) = row.map_err(io)?;
            out.push(serde_json::from_slice(v.value()).map_err(io)?);
        }
        Ok(out)
    }
}

impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.current()
    }

    fn commit(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<u64, StoreError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.commit_blocking(ops, None))
                .await
                .map_err(io)?
        })
    }

    fn commit_prepared(
        &self,
        ops: Vec<Op>,
        prepared: Prepared,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        // Inline, not on the blocking pool: the Admin API's writes are serialised anyway, one small fsynced
        // transaction costs well under a millisecond, and two thread hops per write cost more than that when the
        // core is busy with traffic (measured: 100 writes/s were out of reach with the hop under proxy load).
        let r = self.inner.commit_blocking(ops, Some(prepared));
        Box::pin(async move { r })
    }

    fn history(
        &self,
        after: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Revision>, StoreError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || inner.history_blocking(after, limit))
                .await
                .map_err(io)?
        })
    }

    fn subscribe(&self) -> ConfigRx {
        self.inner.tx.subscribe()
    }

    fn data_encryption(&self) -> Arc<DataEncryption> {
        self.inner.de.clone()
    }
}

#[cfg(test)]
mod tests;
