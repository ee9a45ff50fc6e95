//! The read-write store interface behind the Admin API: APISIX's key space (`routes/1`, `upstreams/u1`, ...) with
//! JSON values, revisions, atomic multi-key commits and a history of changes. Implemented by the embedded redb
//! store and by etcd. This module owns the in-memory [`Snapshot`] every implementation serves reads from and its
//! conversion into the data plane's [`Resources`]; it does no IO itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_model::{Id, Resources};
use sluice_secrets::DataEncryption;

use crate::ConfigRx;

mod patch;
pub use patch::{patch_is_local, patch_resources, PATCH_MAX_KEYS};

/// Every resource kind the store keeps, by its APISIX key prefix.
pub const KINDS: &[&str] = &[
    "routes",
    "services",
    "upstreams",
    "consumers",
    "ssls",
    "global_rules",
    "plugin_configs",
    "consumer_groups",
    "plugin_metadata",
    "protos",
    "secrets",
    "stream_routes",
];

/// One stored value with its etcd-style revisions.
///
/// The value is kept as its compact JSON text (issue 16): a parsed `serde_json::Value` costs several times the
/// text (a route's ~0.4 KB of JSON was ~2.7 KB of `BTreeMap` nodes), and reads are rare next to what is stored.
/// Read it with [`Entry::value`] (parsed), [`Entry::decode`] (straight into a typed resource) or
/// [`Entry::text`]. Serialized as before (`{"value": {...}, "create_revision": .., "mod_revision": ..}`), so the
/// embedded store's file format is unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Shared, so copying a snapshot for a write does not copy every value.
    #[serde(with = "raw_json")]
    value: Arc<str>,
    pub create_revision: u64,
    pub mod_revision: u64,
}

impl Entry {
    pub fn new(value: &Value, create_revision: u64, mod_revision: u64) -> Entry {
        Entry {
            value: compact(value),
            create_revision,
            mod_revision,
        }
    }

    /// An entry from a value another writer stored (etcd): parsed and written again, so what is kept is what
    /// a `Value` holds (keys sorted, a repeated key once, with its last value), compact. Fails when `text` is
    /// not JSON.
    pub fn from_json(
        text: &[u8],
        create_revision: u64,
        mod_revision: u64,
    ) -> serde_json::Result<Entry> {
        let v: Value = serde_json::from_slice(text)?;
        Ok(Entry::new(&v, create_revision, mod_revision))
    }

    /// The stored value, parsed (a copy: change it freely).
    pub fn value(&self) -> Value {
        // The text was produced by serde_json or validated by it: it always parses.
        serde_json::from_str(&self.value).unwrap_or(Value::Null)
    }

    /// One top-level field of the stored value, parsing only that field (the rest of the text is skipped
    /// without allocating): what reference checks and timestamps read.
    pub fn get(&self, field: &str) -> Option<Value> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_str(&self.value);
        Field(field).deserialize(&mut de).ok().flatten()
    }

    /// The row the embedded store writes: what serializing the entry gives, without checking the text again.
    pub fn to_row(&self) -> Vec<u8> {
        format!(
            r#"{{"value":{},"create_revision":{},"mod_revision":{}}}"#,
            self.value, self.create_revision, self.mod_revision
        )
        .into_bytes()
    }

    /// The stored value's compact JSON text.
    pub fn text(&self) -> &str {
        &self.value
    }

    /// The value as the data plane's typed resource stored at `{kind}/{id}`, with its secret fields decrypted.
    /// Without a keyring nothing is encrypted and the text is decoded directly, never through a `Value`.
    pub fn decode<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        id: &str,
        de: &DataEncryption,
    ) -> serde_json::Result<T> {
        if !de.text_may_hold_secrets(kind, &self.value) {
            return serde_json::from_str(&self.value);
        }
        let v: Value = serde_json::from_str(&self.value)?;
        T::deserialize(&*de.decrypted_at(kind, id, &v))
    }
}

/// Picks one field out of a JSON object (None for another field set or a non-object).
struct Field<'a>(&'a str);

impl<'de> serde::de::DeserializeSeed<'de> for Field<'_> {
    type Value = Option<Value>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Field<'_> {
    type Value = Option<Value>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<M: serde::de::MapAccess<'de>>(self, mut m: M) -> Result<Option<Value>, M::Error> {
        let mut found = None;
        while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
            // The last occurrence wins, as when the whole value is parsed into a `Value`.
            if k == self.0 {
                found = Some(m.next_value::<Value>()?);
            } else {
                m.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(found)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Option<Value>, A::Error> {
        while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<Value>, E> {
        Ok(None)
    }
}

fn compact(v: &Value) -> Arc<str> {
    // Serializing a `Value` cannot fail (its map keys are strings).
    Arc::from(serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned()))
}

/// True when `s` has no whitespace outside strings (what serde_json writes).
fn is_compact(s: &str) -> bool {
    let mut in_str = false;
    let mut esc = false;
    for b in s.bytes() {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
        } else if b == b'"' {
            in_str = true;
        } else if b.is_ascii_whitespace() {
            return false;
        }
    }
    true
}

/// `Entry.value` on disk: the JSON value itself, not a string holding it.
mod raw_json {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::value::RawValue;

    pub fn serialize<S: Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue = serde_json::from_str(v).map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        if super::is_compact(raw.get()) {
            Ok(Arc::from(raw.get()))
        } else {
            let v: serde_json::Value =
                serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?;
            Ok(super::compact(&v))
        }
    }
}

/// The whole key space at one revision. Keys are relative to the prefix: `routes/1`, `consumers/jack/credentials/c1`.
/// A persistent map (issue 16): a commit clones the snapshot in O(1) and its writes copy O(log keys) nodes, so the
/// previous revision's readers keep theirs and no commit copies the key space.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub revision: u64,
    pub entries: imbl::OrdMap<String, Entry>,
}

/// One write inside a commit. `expect_mod` guards it: `Some(0)` means "must not exist", `Some(r)` means "must still
/// be at mod revision r" (compare-and-swap across nodes sharing one etcd).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Put {
        key: String,
        value: Value,
        expect_mod: Option<u64>,
    },
    Delete {
        key: String,
        expect_mod: Option<u64>,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } => key,
        }
    }
    pub fn expect_mod(&self) -> Option<u64> {
        match self {
            Op::Put { expect_mod, .. } | Op::Delete { expect_mod, .. } => *expect_mod,
        }
    }
}

/// What one key became in one revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub key: String,
    #[serde(default)]
    pub old: Option<Value>,
    #[serde(default)]
    pub new: Option<Value>,
}

/// What one key became in one commit, as the stored texts: what a commit records without copying or
/// re-serializing any value (a bulk load records 100k of these).
#[derive(Debug, Clone, PartialEq)]
pub struct TextChange {
    pub key: String,
    pub old: Option<Arc<str>>,
    pub new: Option<Arc<str>>,
}

impl TextChange {
    /// The history's parsed form.
    pub fn to_change(&self) -> Change {
        let parse = |t: &Option<Arc<str>>| {
            t.as_deref()
                .map(|t| serde_json::from_str(t).unwrap_or(Value::Null))
        };
        Change {
            key: self.key.clone(),
            old: parse(&self.old),
            new: parse(&self.new),
        }
    }
}

/// The history record of one revision, byte for byte what serializing its [`Revision`] gives (the texts are
/// compact JSON already, written as they are).
pub fn history_record(revision: u64, time: i64, changes: &[TextChange]) -> Vec<u8> {
    let size: usize = changes
        .iter()
        .map(|c| {
            c.key.len()
                + c.old.as_ref().map_or(4, |t| t.len())
                + c.new.as_ref().map_or(4, |t| t.len())
                + 32
        })
        .sum();
    let mut out = Vec::with_capacity(size + 64);
    out.extend_from_slice(
        format!("{{\"revision\":{revision},\"time\":{time},\"changes\":[").as_bytes(),
    );
    for (i, c) in changes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &c.key);
        for (name, text) in [(&b",\"old\":"[..], &c.old), (&b",\"new\":"[..], &c.new)] {
            out.extend_from_slice(name);
            out.extend_from_slice(text.as_deref().unwrap_or("null").as_bytes());
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

/// One committed revision: the history record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revision {
    pub revision: u64,
    /// Unix seconds.
    pub time: i64,
    pub changes: Vec<Change>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StoreError {
    /// The backend cannot be reached or failed (APISIX answers 503).
    Unavailable(String),
    /// A guarded op found the key changed meanwhile.
    Conflict(String),
    /// The backend does not offer this (e.g. history on etcd).
    Unsupported(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable(m) | StoreError::Conflict(m) | StoreError::Unsupported(m) => {
                f.write_str(m)
            }
        }
    }
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A durable, revisioned key-value store the Admin API writes through.
pub trait Store: Send + Sync {
    /// `embedded` or `etcd`.
    fn backend(&self) -> &'static str;
    /// The state this node currently sees; reads are served from it, never from disk or network.
    fn snapshot(&self) -> Arc<Snapshot>;
    /// Applies every op or none, durably, and returns the new revision. When it returns, [`Store::snapshot`]
    /// already reflects the commit (read-your-writes on this node).
    fn commit(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<u64, StoreError>>;
    /// As [`Store::commit`], with the complete configuration the caller already derived from the snapshot at
    /// `prepared.base` plus `ops` (the Admin API builds it for the data plane's dry run). A store may publish it
    /// (with its token) instead of deriving it again, which matters at thousands of resources; it must ignore it
    /// if its state moved on.
    fn commit_prepared(
        &self,
        ops: Vec<Op>,
        prepared: Prepared,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        let _ = prepared;
        self.commit(ops)
    }
    /// Revisions after `after`, oldest first, at most `limit`.
    fn history(&self, after: u64, limit: usize)
        -> BoxFuture<'_, Result<Vec<Revision>, StoreError>>;
    /// The complete configuration on every change, for the binary to compile.
    fn subscribe(&self) -> ConfigRx;
    /// Waits (bounded) until [`Store::snapshot`] reflects every write the backend had committed when this was
    /// called, including other nodes' (a writer that lost a compare-and-swap race reads the winner's value
    /// before it retries). A store only this process writes is always current.
    fn sync(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
    /// False while the backend is unreachable (the Admin API then answers 503).
    fn healthy(&self) -> bool {
        true
    }
    /// How this store's values are encrypted: the Admin API encrypts with it before committing, and the store
    /// decrypts with it for [`Store::subscribe`]'s view.
    fn data_encryption(&self) -> Arc<DataEncryption> {
        Arc::default()
    }
    /// Keeps this node's `server_info` (see [`crate::node`]) where other nodes can list it, with
    /// `applied_revision` following `applied`, until `applied`'s sender is dropped. A store only this process
    /// uses has nothing to share (the default); etcd keeps a leased key.
    fn announce(
        &self,
        info: serde_json::Map<String, serde_json::Value>,
        applied: tokio::sync::watch::Receiver<u64>,
        ttl: std::time::Duration,
    ) {
        let _ = (info, applied, ttl);
    }
    /// Every live node's `server_info`; `None` when the store keeps no registry (the caller lists itself).
    fn nodes(&self) -> BoxFuture<'_, Result<Option<Vec<serde_json::Value>>, StoreError>> {
        Box::pin(async { Ok(None) })
    }
}

/// A complete candidate configuration derived from the snapshot at `base` plus a commit's ops.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    pub base: u64,
    pub resources: Resources,
    /// The dry run's handle on its compile of `resources` (0: none); published as [`crate::Versioned::token`].
    pub token: u64,
    /// The store's view after the commit (`base` with the ops applied at revision `base + 1`) when the caller
    /// built it (a bulk load): the commit takes it instead of applying (and serializing) every value again.
    /// Only for ops with distinct keys.
    pub view: Option<Snapshot>,
}

/// Unix time in seconds.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Snapshot {
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Direct children of `kind` (`routes/1`, not `consumers/jack/credentials/c1`), as (id, entry).
    pub fn list<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = (&'a str, &'a Entry)> + 'a {
        let prefix = format!("{kind}/");
        self.entries
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .filter_map(move |(k, e)| {
                let id = &k[kind.len() + 1..];
                (!id.contains('/')).then_some((id, e))
            })
    }

    /// Entries under an arbitrary key prefix (e.g. a consumer's credentials).
    pub fn under<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Entry)> + 'a {
        self.entries
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
    }

    /// Applies committed ops at `revision`, returning the history record. Callers have checked the guards.
    pub fn apply(&mut self, ops: &[Op], revision: u64) -> Vec<TextChange> {
        let mut changes = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Put { key, value, .. } => {
                    let old = self.entries.get(key);
                    let create_revision = old.map_or(revision, |e| e.create_revision);
                    let old = old.map(|e| e.value.clone());
                    let entry = Entry::new(value, create_revision, revision);
                    changes.push(TextChange {
                        key: key.clone(),
                        old,
                        new: Some(entry.value.clone()),
                    });
                    self.entries.insert(key.clone(), entry);
                }
                Op::Delete { key, .. } => {
                    if let Some(old) = self.entries.remove(key) {
                        changes.push(TextChange {
                            key: key.clone(),
                            old: Some(old.value),
                            new: None,
                        });
                    }
                }
            }
        }
        self.revision = revision;
        changes
    }

    /// What [`Snapshot::apply`] of `ops` (distinct keys) on `self` records, read off `next`, its result.
    pub fn changes_to(&self, next: &Snapshot, ops: &[Op]) -> Vec<TextChange> {
        let text = |s: &Snapshot, key: &str| s.entries.get(key).map(|e| e.value.clone());
        ops.iter()
            .filter_map(|op| {
                let key = op.key();
                let old = text(self, key);
                let new = text(next, key);
                match op {
                    Op::Delete { .. } if old.is_none() => None,
                    _ => Some(TextChange {
                        key: key.to_owned(),
                        old,
                        new,
                    }),
                }
            })
            .collect()
    }

    /// The first guard that does not hold, as a conflict message.
    pub fn check_guards(&self, ops: &[Op]) -> Result<(), StoreError> {
        for op in ops {
            if let Some(want) = op.expect_mod() {
                let have = self.entries.get(op.key()).map_or(0, |e| e.mod_revision);
                if have != want {
                    return Err(StoreError::Conflict(format!(
                        "{} was modified concurrently (revision {have}, expected {want})",
                        op.key()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The data plane's view, with secret fields decrypted. A stored value that does not parse is skipped with an
    /// error log rather than blocking every other resource (values are validated on write, so this only happens
    /// with foreign data).
    pub fn to_resources(&self, de: &DataEncryption) -> Resources {
        self.to_resources_of(KINDS, de)
    }

    /// As [`Snapshot::to_resources`], decoding only the given kinds (the others stay empty).
    pub fn to_resources_of(&self, kinds: &[&str], de: &DataEncryption) -> Resources {
        let want = |k: &str| kinds.contains(&k);
        let mut r = Resources::default();
        if want("routes") {
            fill(
                self,
                "routes",
                de,
                &mut r.routes,
                |x: &mut sluice_model::Route, id| x.id = id,
            );
        }
        if want("services") {
            fill(
                self,
                "services",
                de,
                &mut r.services,
                |x: &mut sluice_model::Service, id| x.id = id,
            );
        }
        if want("upstreams") {
            fill(
                self,
                "upstreams",
                de,
                &mut r.upstreams,
                |x: &mut sluice_model::Upstream, id| x.id = Some(id),
            );
        }
        if want("consumers") {
            fill(
                self,
                "consumers",
                de,
                &mut r.consumers,
                |x: &mut sluice_model::Consumer, id| {
                    if x.username.is_empty() {
                        x.username = id.0
                    }
                },
            );
        }
        if want("global_rules") {
            fill(
                self,
                "global_rules",
                de,
                &mut r.global_rules,
                |x: &mut sluice_model::GlobalRule, id| x.id = id,
            );
        }
        if want("plugin_configs") {
            fill(
                self,
                "plugin_configs",
                de,
                &mut r.plugin_configs,
                |x: &mut sluice_model::PluginConfig, id| x.id = id,
            );
        }
        if want("ssls") {
            fill(
                self,
                "ssls",
                de,
                &mut r.ssls,
                |x: &mut sluice_model::Ssl, id| x.id = id,
            );
        }
        if want("consumer_groups") {
            fill(
                self,
                "consumer_groups",
                de,
                &mut r.consumer_groups,
                |x: &mut sluice_model::ConsumerGroup, id| x.id = id,
            );
        }
        if want("plugin_metadata") {
            fill(
                self,
                "plugin_metadata",
                de,
                &mut r.plugin_metadata,
                |x: &mut sluice_model::PluginMetadata, id| x.id = id,
            );
        }
        if want("protos") {
            fill(
                self,
                "protos",
                de,
                &mut r.protos,
                |x: &mut sluice_model::Proto, id| x.id = id,
            );
        }
        if want("stream_routes") {
            fill(
                self,
                "stream_routes",
                de,
                &mut r.stream_routes,
                |x: &mut sluice_model::StreamRoute, id| x.id = id,
            );
        }
        // Nested keys: `secrets/{manager}/{id}` and `consumers/{username}/credentials/{id}`.
        for (key, e) in self.under("secrets/").filter(|_| want("secrets")) {
            let id = &key["secrets/".len()..];
            match e.decode::<sluice_model::Secret>("secrets", id, de) {
                Ok(mut v) => {
                    v.id = Id(id.to_owned());
                    r.secrets.push(v);
                }
                Err(err) => {
                    tracing::error!(key, error = %err, "stored secret does not parse; skipped")
                }
            }
        }
        for (key, e) in self.under("consumers/").filter(|_| want("consumers")) {
            let rest = &key["consumers/".len()..];
            let Some((user, id)) = rest.split_once("/credentials/") else {
                continue;
            };
            match e.decode::<sluice_model::Credential>("consumers", rest, de) {
                Ok(mut v) => {
                    v.id = Id(id.to_owned());
                    v.consumer = user.to_owned();
                    r.credentials.push(v);
                }
                Err(err) => {
                    tracing::error!(key, error = %err, "stored credential does not parse; skipped")
                }
            }
        }
        r
    }
}

fn fill<T: serde::de::DeserializeOwned, A: From<T>>(
    snap: &Snapshot,
    kind: &str,
    de: &DataEncryption,
    out: &mut impl Extend<A>,
    set_id: impl Fn(&mut T, Id),
) {
    for (id, e) in snap.list(kind) {
        match e.decode::<T>(kind, id, de) {
            Ok(mut v) => {
                set_id(&mut v, Id(id.to_owned()));
                out.extend(std::iter::once(A::from(v)));
            }
            Err(err) => {
                tracing::error!(kind, id, error = %err, "stored resource does not parse; skipped")
            }
        }
    }
}

#[cfg(test)]
mod tests;
