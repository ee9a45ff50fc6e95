//! `/apisix/admin/configs` in the traditional role (embedded store or etcd): the whole configuration in one
//! request, with the body of APISIX's API-driven standalone mode (`apisix/admin/standalone.lua`), so a large
//! configuration loads without one request per resource.
//!
//!   GET  /apisix/admin/configs            the stored configuration in that shape (JSON, or YAML with
//!                                         `Accept: application/yaml`): items without `create_time`/`update_time`,
//!                                         with `modifiedIndex`; every `<kind>_conf_version` is the store revision
//!   PUT  /apisix/admin/configs            replaces the configuration: resources absent from the body are deleted,
//!                                         resources equal to the stored ones are left untouched; `202` with what
//!                                         changed, once this node serves it
//!   POST /apisix/admin/configs/validate   as in standalone mode
//!
//! Every item is checked as a single `PUT /apisix/admin/<kind>/<id>` checks it (id rules, forbidden timestamps,
//! schema, cross-field rules, plugins, references, consumer key uniqueness), references against the new
//! configuration itself; then the complete result goes through the data plane's dry run. The first failure is
//! answered as APISIX's standalone PUT answers it (`400 invalid routes at index 3, err: ...`, naming the
//! resource) and nothing is written. The embedded store commits everything in one transaction, which the data
//! plane applies as one snapshot; etcd takes it in transactions of at most 128 operations and 1 MiB (its default
//! limits), each atomic, the whole not (docs/admin-api.md).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use sluice_store::kv::{now, Entry, Op, Prepared, Snapshot};

use crate::config::Role;
use crate::configs::{self, Answer, Request};
use crate::handlers;
use crate::resources::{self, Kind, CREDENTIALS};
use crate::{AdminState, PluginCatalog};

/// The largest `/apisix/admin/configs` body (Sluice's limit; APISIX's Admin API takes 1.5 MiB per resource): 100k
/// routes with inline upstreams are about 10 MiB of JSON.
pub(crate) const MAX_BODY: usize = 64 << 20;

/// etcd's default `--max-txn-ops`.
pub(crate) const ETCD_MAX_OPS: usize = 128;
/// Bytes of keys and values per etcd transaction: under etcd's default `--max-request-bytes` (1.5 MiB), with
/// room for the request's framing.
pub(crate) const ETCD_MAX_BYTES: usize = 1 << 20;

/// How long a bulk PUT waits for this node's data plane to apply it.
const WAIT_APPLIED: Duration = Duration::from_secs(30);

/// The document's kinds in dependency order: what an item may reference comes before it. Writes go in this order
/// and deletions in the reverse one, so a batched store never holds a reference to a resource not yet written.
const ORDER: &[&str] = &[
    "secrets",
    "protos",
    "plugin_metadata",
    "upstreams",
    "services",
    "plugin_configs",
    "consumer_groups",
    "consumers",
    "credentials",
    "ssls",
    "global_rules",
    "routes",
    "stream_routes",
];

/// One resource of the body, ready to be checked.
struct Item {
    /// Store key: `routes/1`, `consumers/jack/credentials/c1`, `secrets/vault/1`.
    key: String,
    kind: &'static Kind,
    /// The body's array it came from, and its index there.
    list: &'static str,
    index: usize,
    /// As the body names it (`jack/credentials/c1` for a credential).
    id: String,
    /// Plain (not yet encrypted), id field set, no timestamps.
    value: Arc<Value>,
}

pub(crate) async fn handle(state: &AdminState, role: Role, req: Request<'_>) -> Answer {
    match (req.method, req.path) {
        ("GET", "/configs") => get(state, role, req.accept),
        ("HEAD", "/configs") => Answer::json(200, Value::Null),
        ("POST", "/configs/validate") => configs::validate(state, &req),
        ("PUT", "/configs") => put(state, &req).await,
        _ => Answer::error(404, "not found"),
    }
}

/// The first item (in body order) that fails its checks, with the failure. Items are checked on every core:
/// each check reads only its own item and the candidate, and a 100k-route load spent a third of its time here.
fn first_invalid(
    items: &[Item],
    schemas: &HashMap<&'static str, Value>,
    cand: &Snapshot,
    plugins: &dyn PluginCatalog,
) -> Option<(usize, crate::Reply)> {
    let check = |offset: usize, part: &[Item]| {
        part.iter().enumerate().find_map(|(i, it)| {
            let schema = &schemas[it.kind.name];
            resources::check_with(it.kind, schema, &it.value, cand, plugins)
                .err()
                .map(|r| (offset + i, r))
        })
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    if threads < 2 || items.len() < 2048 {
        return check(0, items);
    }
    let size = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = items
            .chunks(size)
            .enumerate()
            .map(|(n, part)| s.spawn(move || check(n * size, part)))
            .collect();
        // Chunks are in body order: the first chunk with a failure has the first failure.
        parts
            .into_iter()
            .filter_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .next()
    })
}

fn invalid(list: &str, index: usize, id: &str, msg: &str) -> Answer {
    Answer::json(
        400,
        json!({"error_msg": format!("invalid {list} at index {index}, err: {msg}"),
               "resource_type": list, "resource_id": id, "index": index}),
    )
}

fn reply_text(r: &crate::Reply) -> String {
    match r.body.get("error_msg") {
        Some(Value::String(s)) => s.clone(),
        _ => r.body.to_string(),
    }
}

/// The store key, declaration and displayed id of `conf` from the body's `list`; `conf` gets its id field.
fn locate(
    list: &'static str,
    conf: &mut Map<String, Value>,
) -> Result<(String, &'static Kind, String), String> {
    let id = conf.get("id").and_then(resources::id_string);
    let cred = id
        .as_deref()
        .and_then(|i| i.split_once("/credentials/"))
        .map(|(o, c)| (o.to_owned(), c.to_owned()));
    if matches!(list, "consumers" | "credentials") {
        if let Some((owner, cid)) = cred {
            if owner.is_empty() || owner.contains('/') {
                return Err(format!("invalid credential id: {}", id.unwrap_or_default()));
            }
            conf.insert("id".into(), json!(cid));
            return Ok((
                format!("consumers/{owner}/credentials/{cid}"),
                &CREDENTIALS,
                format!("{owner}/credentials/{cid}"),
            ));
        }
        if list == "credentials" {
            return Err(format!(
                "invalid credential id: {} (expected <username>/credentials/<id>)",
                id.unwrap_or_default()
            ));
        }
    }
    let kind = resources::find(list).ok_or_else(|| format!("unknown resource kind {list}"))?;
    let id = match conf.get(kind.id_field).and_then(resources::id_string) {
        Some(id) => id,
        None if kind.id_field == "username" => {
            return Err("invalid configuration: property \"username\" is required".into())
        }
        None => return Err(format!("missing {} id", kind.kind)),
    };
    if kind.name == "secrets" && !id.contains('/') {
        return Err(format!("invalid secret id: {id}"));
    }
    if kind.name != "secrets" && id.contains('/') {
        // Would land under another key (`routes/a/b`); the schema's id pattern says the same for most kinds.
        return Err(format!("invalid {} id: {id}", kind.kind));
    }
    Ok((format!("{}/{id}", kind.name), kind, id))
}

async fn put(state: &AdminState, req: &Request<'_>) -> Answer {
    if !state.store.healthy() {
        return Answer::error(503, "the configuration store is unavailable");
    }
    let mut body = match configs::parse(req) {
        Ok(b) => b,
        Err(a) => return a,
    };
    for kind in sluice_store::api::KINDS {
        let vkey = configs::version_key(kind);
        if body.get(&vkey).is_some_and(|v| !v.is_number()) {
            return Answer::error(400, format!("{vkey} must be a number"));
        }
        if body
            .get(*kind)
            .is_some_and(|v| !v.is_array() && !v.is_null())
        {
            return Answer::error(400, format!("invalid {kind}: must be an array"));
        }
    }
    if !state.config.stream
        && body
            .get("stream_routes")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    {
        return Answer::error(400, "stream mode is disabled, can not add stream routes");
    }

    // Parsing and the id rules need no store state.
    let mut items = Vec::new();
    let mut keys: HashSet<String> = HashSet::new();
    for list in ORDER {
        let Some(arr) = body.get_mut(*list).and_then(Value::as_array_mut) else {
            continue;
        };
        // Each item is taken out of the body, not copied: at 100k routes a copy was ~270 MB more at the peak.
        for (index, raw) in arr.iter_mut().map(Value::take).enumerate() {
            let Value::Object(mut conf) = raw else {
                return invalid(
                    list,
                    index,
                    "",
                    &format!(
                        "invalid configuration: wrong type: expected object, got {}",
                        handlers::json_type(&raw)
                    ),
                );
            };
            // What GET /configs adds; as in APISIX's standalone documents, accepted and not stored.
            conf.remove("modifiedIndex");
            let shown = conf
                .get("id")
                .or_else(|| conf.get("username"))
                .and_then(resources::id_string)
                .unwrap_or_default();
            let (key, kind, id) = match locate(list, &mut conf) {
                Ok(l) => l,
                Err(e) => return invalid(list, index, &shown, &e),
            };
            if let Err(r) = resources::forbidden_times(&conf) {
                return invalid(list, index, &id, &reply_text(&r));
            }
            conf.entry(kind.id_field.to_owned())
                .or_insert_with(|| json!(id));
            if !keys.insert(key.clone()) {
                let what = match (kind.name, *list) {
                    ("credentials", _) => "credential id",
                    ("consumers", _) => "username",
                    _ => "id",
                };
                return Answer::error(400, format!("found duplicate {what} {id} in {list}"));
            }
            items.push(Item {
                key,
                kind,
                list,
                index,
                id,
                value: Arc::new(Value::Object(conf)),
            });
        }
    }
    drop(body);

    let t0 = std::time::Instant::now();
    let _w = state.write_lock.lock().await;
    let snap = state.store.snapshot();
    // The configuration as it will be, for the reference checks: exactly the body's resources.
    let mut cand = Snapshot {
        revision: snap.revision,
        entries: Default::default(),
    };
    for it in &items {
        cand.entries
            .insert(it.key.clone(), Entry::new(&it.value, 0, 0));
    }
    let mut schemas: HashMap<&'static str, Value> = HashMap::new();
    for it in &items {
        schemas
            .entry(it.kind.name)
            .or_insert_with(|| (it.kind.schema)());
    }
    let first_bad = first_invalid(&items, &schemas, &cand, state.plugins.as_ref());
    let mut unique: HashMap<(&str, &str, String), (String, Option<String>)> = HashMap::new();
    for (i, it) in items.iter().enumerate() {
        if let Some((bad, r)) = &first_bad {
            if *bad == i {
                return invalid(it.list, it.index, &it.id, &reply_text(r));
            }
        }
        if it.kind.name == "credentials" || it.kind.name == "consumers" {
            let rest = &it.key["consumers/".len()..];
            let (owner, cred) = match rest.split_once("/credentials/") {
                Some((o, c)) => (o.to_owned(), Some(c.to_owned())),
                None => (rest.to_owned(), None),
            };
            if cred.is_some() && cand.get(&format!("consumers/{owner}")).is_none() {
                return invalid(it.list, it.index, &it.id, "consumer not found");
            }
            if let Some(msg) = duplicate_key(&it.value, owner, cred, &mut unique) {
                return invalid(it.list, it.index, &it.id, &msg);
            }
        }
    }

    // What to write: changed and new resources (stamped and encrypted as a single PUT stores them), and the
    // deletion of every stored resource the body does not name.
    // The candidate's values are the items' own: dropping it lets each item take its value without a copy.
    drop(cand);
    let de = state.store.data_encryption();
    let ts = now();
    let (mut created, mut updated, mut unchanged) = (0usize, 0usize, 0usize);
    let mut ops = Vec::new();
    for it in items {
        let old = snap.get(&it.key);
        let mut value = Arc::unwrap_or_clone(it.value);
        de.encrypt(&it.key, &mut value);
        if old.is_some_and(|o| same_but_times(&o.value(), &value)) {
            unchanged += 1;
            continue;
        }
        if it.kind.name != "plugin_metadata" {
            if let Some(o) = value.as_object_mut() {
                let create = old.and_then(|e| e.get("create_time")).unwrap_or(json!(ts));
                o.insert("create_time".into(), create);
                o.insert("update_time".into(), json!(ts));
            }
        }
        if old.is_some() {
            updated += 1;
        } else {
            created += 1;
        }
        ops.push(Op::Put {
            key: it.key,
            value,
            expect_mod: Some(old.map_or(0, |e| e.mod_revision)),
        });
    }
    let mut deletes: Vec<Op> = snap
        .entries
        .iter()
        .filter(|(k, _)| !keys.contains(k.as_str()))
        .map(|(k, e)| Op::Delete {
            key: k.clone(),
            expect_mod: Some(e.mod_revision),
        })
        .collect();
    deletes.sort_by_key(|op| std::cmp::Reverse(rank(op.key())));
    let deleted = deletes.len();
    ops.extend(deletes);
    let summary = |rev: u64| {
        json!({"revision": rev, "created": created, "updated": updated, "deleted": deleted,
               "unchanged": unchanged})
    };
    if ops.is_empty() {
        return Answer::json(202, summary(snap.revision));
    }

    let checked = t0.elapsed();
    // Keys are distinct (checked above): the commit may take the candidate's store view as it is.
    let (resources, view) = handlers::candidate_view(state, &snap, &ops);
    let token = match (state.checker)(&resources) {
        Ok(t) => t,
        Err(e) => return Answer::error(400, e),
    };
    let dry_run = t0.elapsed();
    let rev = if state.store.backend() == "etcd" {
        drop((resources, view));
        match commit_batches(state, ops).await {
            Ok(rev) => rev,
            Err(a) => return a,
        }
    } else {
        let prepared = Prepared {
            base: snap.revision,
            resources,
            token,
            view,
        };
        match state.store.commit_prepared(ops, prepared).await {
            Ok(rev) => rev,
            Err(e) => {
                let r = handlers::store_error(e);
                return Answer::json(r.status, r.body);
            }
        }
    };
    let committed = t0.elapsed();
    let mut applied = state.applied.clone();
    let waited = tokio::time::timeout(WAIT_APPLIED, applied.wait_for(|a| *a >= rev)).await;
    if !matches!(waited, Ok(Ok(_))) {
        return Answer::error(
            504,
            format!(
                "revision {rev} was committed but not applied within {}s",
                WAIT_APPLIED.as_secs()
            ),
        );
    }
    tracing::info!(
        revision = rev, created, updated, deleted, unchanged, ?checked, ?dry_run, ?committed,
        applied = ?t0.elapsed(), "bulk load applied"
    );
    Answer::json(202, summary(rev))
}

/// etcd: the ops in transactions within its default limits, in order. Each transaction is atomic and guarded
/// (compare-and-swap on every key); one that fails stops the load, and the answer says how much was written.
async fn commit_batches(state: &AdminState, ops: Vec<Op>) -> Result<u64, Answer> {
    let total = ops.len();
    let mut done = 0usize;
    let mut rev = 0u64;
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    let mut iter = ops.into_iter().peekable();
    while let Some(op) = iter.next() {
        bytes += op_size(&op);
        batch.push(op);
        let full = batch.len() >= ETCD_MAX_OPS
            || iter
                .peek()
                .is_none_or(|next| bytes + op_size(next) > ETCD_MAX_BYTES);
        if !full {
            continue;
        }
        let n = batch.len();
        match state.store.commit(std::mem::take(&mut batch)).await {
            Ok(r) => {
                rev = r;
                done += n;
                bytes = 0;
            }
            Err(e) => {
                let r = handlers::store_error(e);
                let why = reply_text(&r);
                let msg = if done == 0 {
                    format!("{why}; nothing was written")
                } else {
                    format!(
                        "{why}; {done} of {total} changes were written (up to revision {rev}) and the rest \
                         was not: send the same configuration again to finish"
                    )
                };
                return Err(Answer::error(r.status, msg));
            }
        }
    }
    Ok(rev)
}

fn op_size(op: &Op) -> usize {
    match op {
        Op::Put { key, value, .. } => key.len() + 32 + value.to_string().len(),
        Op::Delete { key, .. } => key.len() + 32,
    }
}

/// A key's place in [`ORDER`].
fn rank(key: &str) -> usize {
    let list = if key.contains("/credentials/") {
        "credentials"
    } else {
        key.split('/').next().unwrap_or("")
    };
    ORDER.iter().position(|k| *k == list).unwrap_or(ORDER.len())
}

/// `new` (no timestamps) is what `old` holds apart from its timestamps.
fn same_but_times(old: &Value, new: &Value) -> bool {
    let times = |k: &str| k == "create_time" || k == "update_time";
    match (old.as_object(), new.as_object()) {
        (Some(o), Some(n)) => {
            o.iter().filter(|(k, _)| !times(k)).count() == n.len()
                && n.iter().all(|(k, v)| o.get(k) == Some(v))
        }
        _ => old == new,
    }
}

/// APISIX's `check_duplicate_key` over the whole new configuration at once (a set, not a scan per consumer): an
/// auth plugin's key may belong to one consumer (with its credentials) only.
fn duplicate_key<'a>(
    value: &Value,
    owner: String,
    cred: Option<String>,
    seen: &mut HashMap<(&'a str, &'a str, String), (String, Option<String>)>,
) -> Option<String> {
    let plugins = value.get("plugins")?.as_object()?;
    for (plugin, attr) in resources::UNIQUE_KEYS {
        let Some(want) = plugins
            .get(*plugin)
            .and_then(|c| c.get(*attr))
            .and_then(Value::as_str)
            .filter(|v| !v.starts_with("$secret://") && !v.starts_with("$env://"))
        else {
            continue;
        };
        match seen.get(&(*plugin, *attr, want.to_owned())) {
            // A consumer never conflicts with its own credentials.
            Some((o, c)) if *o == owner && (c.is_none() || cred.is_none()) => {}
            Some((o, c)) => {
                let desc = match c {
                    Some(id) => format!("credential: {id} of consumer: {o}"),
                    None => format!("consumer: {o}"),
                };
                return Some(format!(
                    "duplicate {attr} of plugin {plugin} found with {desc}"
                ));
            }
            None => {
                seen.insert(
                    (*plugin, *attr, want.to_owned()),
                    (owner.clone(), cred.clone()),
                );
            }
        }
    }
    None
}

/// The stored configuration in the standalone document's shape.
fn get(state: &AdminState, role: Role, accept: Option<&str>) -> Answer {
    let snap = state.store.snapshot();
    let mut lists: HashMap<&str, Vec<Value>> = HashMap::new();
    for (key, e) in &snap.entries {
        let Some((kind, id)) = key.split_once('/') else {
            continue;
        };
        let Some(list) = sluice_store::api::KINDS.iter().find(|k| **k == kind) else {
            continue;
        };
        let mut v = handlers::present(state, role, key, &e.value());
        if let Some(o) = v.as_object_mut() {
            o.remove("create_time");
            o.remove("update_time");
            if kind != "consumers" || id.contains("/credentials/") {
                o.insert("id".into(), json!(id));
            }
            o.insert("modifiedIndex".into(), json!(e.mod_revision));
        }
        lists.entry(list).or_default().push(v);
    }
    let mut doc = Map::new();
    for kind in sluice_store::api::KINDS {
        doc.insert(configs::version_key(kind), json!(snap.revision));
        if let Some(items) = lists.remove(kind) {
            doc.insert((*kind).to_owned(), Value::Array(items));
        }
    }
    if accept.is_some_and(|a| a.starts_with("application/yaml")) {
        return match serde_yaml::to_string(&doc) {
            Ok(text) => Answer {
                status: 200,
                ctype: "application/yaml",
                body: bytes::Bytes::from(text),
                headers: Vec::new(),
            },
            Err(e) => Answer::error(500, format!("failed to encode yaml: {e}")),
        };
    }
    Answer::json(200, Value::Object(doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_rank_in_dependency_order() {
        assert!(rank("upstreams/1") < rank("routes/1"));
        assert!(rank("consumers/jack") < rank("consumers/jack/credentials/c1"));
        assert!(rank("secrets/vault/1") < rank("services/1"));
    }

    #[test]
    fn unchanged_ignores_only_timestamps() {
        let old = json!({"id": "1", "uri": "/a", "create_time": 1, "update_time": 2});
        assert!(same_but_times(&old, &json!({"id": "1", "uri": "/a"})));
        assert!(!same_but_times(&old, &json!({"id": "1", "uri": "/b"})));
        assert!(!same_but_times(&old, &json!({"id": "1"})));
        assert!(!same_but_times(
            &old,
            &json!({"id": "1", "uri": "/a", "name": "x"})
        ));
    }

    #[test]
    fn a_key_belongs_to_one_consumer() {
        let mut seen = HashMap::new();
        let v = json!({"plugins": {"key-auth": {"key": "k1"}}});
        assert_eq!(duplicate_key(&v, "jack".into(), None, &mut seen), None);
        // Its own credential may repeat it; another consumer may not.
        assert_eq!(
            duplicate_key(&v, "jack".into(), Some("c1".into()), &mut seen),
            None
        );
        let e = duplicate_key(&v, "rose".into(), None, &mut seen).unwrap();
        assert_eq!(
            e,
            "duplicate key of plugin key-auth found with consumer: jack"
        );
    }
}
