//! The generic Admin API verbs over declared resources (`resources.rs`): GET one / list (filters, pagination),
//! PUT, POST, PATCH, DELETE with APISIX's id rules, timestamps, v3 envelopes, status codes and error texts.
//! Every write is validated on a copy, dry-run through the data plane's checker against the complete candidate
//! configuration, then committed with compare-and-swap guards.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_store::kv::{self, now, Op, Snapshot, StoreError};

use crate::config::Role;
use crate::resources::{self, Kind, CREDENTIALS};
use crate::{patch, AdminState, Reply};

/// A parsed Admin API request, auth already checked.
pub(crate) struct Req {
    pub method: String,
    /// The caller's key role: viewers see every secret redacted.
    pub role: Role,
    /// Segments after `/apisix/admin/`.
    pub segs: Vec<String>,
    pub query: Vec<(String, String)>,
    pub body: Option<Value>,
}

impl Req {
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Where a resource lives: its declaration and its key-space prefix (`routes/` or `consumers/jack/credentials/`).
pub(crate) struct Target {
    pub kind: &'static Kind,
    pub prefix: String,
    pub id: Option<String>,
    pub sub_path: String,
}

fn full_key(key: &str) -> String {
    format!("/apisix/{key}")
}

fn envelope(state: &AdminState, req: &Req, key: &str, e: &sluice_store::kv::Entry) -> Value {
    let value = present(state, req.role, key, &e.value());
    json!({"key": full_key(key), "value": value,
           "createdIndex": e.create_revision, "modifiedIndex": e.mod_revision})
}

/// The one way a stored value leaves the Admin API in an answer to a read (GET one, list, history, diff): what
/// APISIX's GET shows (SSL private keys removed, plugins' `encrypt_fields` decrypted), and for viewer keys every
/// declared secret redacted on top (`sluice_secrets`: SSL and upstream keys, plugin secret fields, secret managers'
/// credentials, unknown plugins whole).
pub(crate) fn present(state: &AdminState, role: Role, key: &str, stored: &Value) -> Value {
    let de = state.store.data_encryption();
    let mut v = stored.clone();
    de.admin_view(key, &mut v);
    if role == Role::Viewer {
        de.redact(key, &mut v);
    }
    v
}

pub(crate) fn store_error(e: StoreError) -> Reply {
    match e {
        StoreError::Unavailable(m) => Reply::error(503, m),
        StoreError::Conflict(m) => Reply::error(409, m),
        StoreError::Unsupported(m) => Reply::error(501, m),
    }
}

pub(crate) async fn resource(state: &AdminState, req: &Req, t: Target) -> Reply {
    if !state.store.healthy() {
        // As APISIX when etcd is unreachable; the data plane keeps running its last configuration.
        return Reply::error(503, "the configuration store is unavailable");
    }
    match req.method.as_str() {
        "GET" => get(state, req, &t),
        "PUT" => put(state, req, &t, false).await,
        "POST" if !t.kind.post => Reply::error(
            405,
            format!("not supported `POST` method for {}", t.kind.kind),
        ),
        "POST" => put(state, req, &t, true).await,
        "PATCH" if !t.kind.patch => Reply::error(
            405,
            format!("not supported `PATCH` method for {}", t.kind.kind),
        ),
        "PATCH" => patch(state, req, &t).await,
        "DELETE" => delete(state, req, &t).await,
        _ => Reply::error(404, "not found"),
    }
}

fn get(state: &AdminState, req: &Req, t: &Target) -> Reply {
    let snap = state.store.snapshot();
    if let Some(id) = &t.id {
        let key = format!("{}{id}", t.prefix);
        return match snap.get(&key) {
            Some(e) => Reply::json(200, envelope(state, req, &key, e)),
            None => Reply::not_found(),
        };
    }
    let name_re = match req.arg("name").map(regex::Regex::new).transpose() {
        Ok(r) => r,
        Err(e) => return Reply::error(400, format!("invalid name filter: {e}")),
    };
    let uri_re = match req.arg("uri").map(regex::Regex::new).transpose() {
        Ok(r) => r,
        Err(e) => return Reply::error(400, format!("invalid uri filter: {e}")),
    };
    let label = req.arg("label");
    let mut list: Vec<Value> = Vec::new();
    for (key, e) in snap.under(&t.prefix) {
        let depth = key[t.prefix.len()..].matches('/').count();
        if depth != usize::from(t.kind.name == "secrets") {
            continue;
        }
        let v = &e.value();
        if let Some(re) = &name_re {
            if !v
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| re.is_match(n))
            {
                continue;
            }
        }
        if let Some(l) = label {
            if !v
                .get("labels")
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key(l))
            {
                continue;
            }
        }
        if let Some(re) = &uri_re {
            let uri_ok = v
                .get("uri")
                .and_then(Value::as_str)
                .is_some_and(|u| re.is_match(u));
            let uris_ok = v
                .get("uris")
                .and_then(Value::as_array)
                .is_some_and(|us| us.iter().filter_map(Value::as_str).any(|u| re.is_match(u)));
            if !uri_ok && !uris_ok {
                continue;
            }
        }
        list.push(envelope(state, req, key, e));
    }
    if list.is_empty() && t.kind.name == "credentials" {
        // APISIX ranges over `/consumers/{name}/credentials`, which has no directory key: nothing there is 404.
        return Reply::not_found();
    }
    let total = list.len();
    if let (Some(page), Some(size)) = (req.arg("page"), req.arg("page_size")) {
        let size: usize = size.parse().unwrap_or(0);
        if !(10..=500).contains(&size) {
            return Reply::json(
                400,
                Value::String("page_size must be between 10 and 500".into()),
            );
        }
        let page: usize = page.parse().ok().filter(|p| *p >= 1).unwrap_or(1);
        list = list
            .into_iter()
            .skip((page - 1) * size)
            .take(size)
            .collect();
    }
    Reply::json(200, json!({"total": total, "list": list}))
}

/// A fresh id for POST: decimal, increasing, unique within this process (APISIX lets etcd generate one).
fn gen_id() -> String {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let prev = LAST.fetch_max(micros, Ordering::Relaxed);
    let id = if prev >= micros {
        LAST.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        micros
    };
    format!("{id:020}")
}

async fn put(state: &AdminState, req: &Req, t: &Target, post: bool) -> Reply {
    let kind = t.kind;
    let Some(body) = &req.body else {
        return Reply::error(400, "missing configurations");
    };
    let Some(conf) = body.as_object() else {
        return Reply::error(
            400,
            format!(
                "invalid configuration: wrong type: expected object, got {}",
                json_type(body)
            ),
        );
    };
    let mut conf = conf.clone();
    let body_id = conf.get(kind.id_field).and_then(resources::id_string);
    let id = if post {
        if t.id.is_some() || (kind.id_field == "id" && body_id.is_some()) {
            return Reply::error(400, format!("wrong {} id, do not need it", kind.kind));
        }
        gen_id()
    } else {
        match (&t.id, &body_id) {
            (None, None) if kind.id_field == "username" => {
                return Reply::error(
                    400,
                    "invalid configuration: property \"username\" is required",
                )
            }
            (None, None) => return Reply::error(400, format!("missing {} id", kind.kind)),
            (Some(p), Some(b)) if p != b && kind.id_field == "username" => {
                return Reply::error(400, "wrong username")
            }
            (Some(p), Some(b)) if p != b => {
                return Reply::error(400, format!("wrong {} id", kind.kind))
            }
            (Some(p), _) => p.clone(),
            (None, Some(b)) => b.clone(),
        }
    };
    if let Err(r) = resources::forbidden_times(&conf) {
        return r;
    }
    conf.entry(kind.id_field.to_owned())
        .or_insert_with(|| Value::String(id.clone()));
    let _w = state.write_lock.lock().await;
    let key = format!("{}{id}", t.prefix);
    let mut attempt = 0;
    loop {
        let snap = state.store.snapshot();
        let old = snap.get(&key);
        let mut conf = conf.clone();
        // APISIX stamps every resource but plugin_metadata (`inject_conf_with_prev_conf` is skipped for it).
        if kind.name != "plugin_metadata" {
            let ts = now();
            let create = old.and_then(|e| e.get("create_time")).unwrap_or(json!(ts));
            conf.insert("create_time".into(), create);
            conf.insert("update_time".into(), json!(ts));
        }
        let mut value = Value::Object(conf);
        if let Err(r) = resources::check(kind, &value, &snap, state.plugins.as_ref()) {
            return r;
        }
        if kind.name == "credentials" && !consumer_exists(&snap, t) {
            return Reply::error(404, "consumer not found");
        }
        if let Some(msg) = duplicate_key(state, t, &id, &value, &snap) {
            return Reply::error(400, msg);
        }
        // As APISIX: secrets are encrypted after the check, and the answer shows them as stored.
        state.store.data_encryption().encrypt(&key, &mut value);
        let created = old.is_none();
        let ops = vec![Op::Put {
            key: key.clone(),
            value: value.clone(),
            expect_mod: Some(old.map_or(0, |e| e.mod_revision)),
        }];
        match commit(state, &snap, ops, req).await {
            Ok(()) => {
                return Reply::json(
                    if created || post { 201 } else { 200 },
                    json!({"key": full_key(&key), "value": value}),
                )
            }
            Err(r) if r.status == 409 && attempt < MAX_RETRIES => {
                attempt += 1;
                catch_up(state, attempt).await;
            }
            Err(r) => return r,
        }
    }
}

/// How often a write that lost a compare-and-swap race (another node wrote the key between our read and our
/// commit) is redone on fresh state before `409` is answered. APISIX's tools never expect a 409.
const MAX_RETRIES: u32 = 16;

/// After a lost race: brings this node's snapshot up to the store's latest revision, so the retry reads what
/// the other writer wrote; a short, growing pause spreads out writers that keep colliding.
async fn catch_up(state: &AdminState, attempt: u32) {
    if let Err(e) = state.store.sync().await {
        tracing::debug!(error = %e, "admin: sync after a write conflict failed");
    }
    if attempt > 2 {
        let ms = 1u64 << attempt.min(7);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// APISIX's `check_duplicate_key` for consumers and credentials.
fn duplicate_key(
    state: &AdminState,
    t: &Target,
    id: &str,
    value: &Value,
    snap: &Snapshot,
) -> Option<String> {
    let plugins = value.get("plugins")?;
    let de = state.store.data_encryption();
    match t.kind.name {
        "consumers" => resources::duplicate_key(plugins, id, None, snap, &de),
        "credentials" => {
            let user = t.prefix.strip_prefix("consumers/")?.split('/').next()?;
            resources::duplicate_key(plugins, user, Some(id), snap, &de)
        }
        _ => None,
    }
}

async fn patch(state: &AdminState, req: &Req, t: &Target) -> Reply {
    let kind = t.kind;
    let Some(id) = &t.id else {
        return Reply::error(400, format!("missing {} id", kind.kind));
    };
    let Some(body) = &req.body else {
        return Reply::error(400, "missing new configuration");
    };
    if t.sub_path.is_empty() && !body.is_object() {
        return Reply::error(400, "invalid configuration");
    }
    let _w = state.write_lock.lock().await;
    let key = format!("{}{id}", t.prefix);
    let mut attempt = 0;
    loop {
        match patch_once(state, req, t, id, body, &key).await {
            Err(r) if r.status == 409 && attempt < MAX_RETRIES => {
                attempt += 1;
                catch_up(state, attempt).await;
            }
            Ok(r) | Err(r) => return r,
        }
    }
}

/// One read-merge-check-commit round of PATCH; `Err` only for a reply a retry may change.
async fn patch_once(
    state: &AdminState,
    req: &Req,
    t: &Target,
    id: &str,
    body: &Value,
    key: &str,
) -> Result<Reply, Reply> {
    let kind = t.kind;
    let snap = state.store.snapshot();
    let key = key.to_owned();
    let Some(old) = snap.get(&key) else {
        return Ok(Reply::not_found());
    };
    // Merge onto plain values (APISIX decrypts before merging too), so kept secrets are not encrypted twice.
    let de = state.store.data_encryption();
    let mut value = old.value();
    de.decrypt(&key, &mut value);
    if t.sub_path.is_empty() {
        patch::merge(&mut value, body);
    } else if let Err(e) = patch::set_sub_path(&mut value, &t.sub_path, body.clone()) {
        return Ok(Reply::error(400, e));
    }
    if let Some(o) = value.as_object_mut() {
        // The id cannot be patched away or changed.
        o.insert(
            kind.id_field.into(),
            old.get(kind.id_field).unwrap_or(json!(id)),
        );
        if let Some(c) = old.get("create_time") {
            o.insert("create_time".into(), c);
        }
        let explicit = t.sub_path.is_empty() && body.get("update_time").is_some();
        if !explicit {
            o.insert("update_time".into(), json!(now()));
        }
    }
    if let Err(r) = resources::check(kind, &value, &snap, state.plugins.as_ref()) {
        return Ok(r);
    }
    de.encrypt(&key, &mut value);
    let ops = vec![Op::Put {
        key: key.clone(),
        value: value.clone(),
        expect_mod: Some(old.mod_revision),
    }];
    commit(state, &snap, ops, req).await?;
    Ok(Reply::json(
        200,
        json!({"key": full_key(&key), "value": value}),
    ))
}

async fn delete(state: &AdminState, req: &Req, t: &Target) -> Reply {
    let kind = t.kind;
    let Some(id) = &t.id else {
        return Reply::error(400, format!("missing {} id", kind.kind));
    };
    let _w = state.write_lock.lock().await;
    let snap = state.store.snapshot();
    let key = format!("{}{id}", t.prefix);
    let Some(old) = snap.get(&key) else {
        return Reply::not_found();
    };
    if req.arg("force") != Some("true") {
        if let Some(msg) = resources::delete_blocker(kind, id, &snap) {
            return Reply::error(400, msg);
        }
    }
    let mut ops = vec![Op::Delete {
        key: key.clone(),
        expect_mod: Some(old.mod_revision),
    }];
    if kind.name == "consumers" {
        // A consumer's credentials go with it.
        let sub = format!("{key}/credentials/");
        ops.extend(snap.under(&sub).map(|(k, _)| Op::Delete {
            key: k.clone(),
            expect_mod: None,
        }));
    }
    match commit(state, &snap, ops, req).await {
        Ok(()) => Reply::json(200, json!({"deleted": "1", "key": full_key(&key)})),
        Err(r) => r,
    }
}

/// How long `?wait=applied` waits, on this node and on the others.
const WAIT_APPLIED: Duration = Duration::from_secs(10);

/// `?nodes=all|N` (with or without `wait=applied`): the write returns once that many live nodes of the registry
/// applied it.
enum WaitNodes {
    All,
    AtLeast(usize),
}

fn wait_nodes(req: &Req) -> Result<Option<WaitNodes>, Reply> {
    match req.arg("nodes") {
        None => Ok(None),
        Some("all") => Ok(Some(WaitNodes::All)),
        Some(n) => match n.parse::<usize>() {
            Ok(n @ 1..=10_000) => Ok(Some(WaitNodes::AtLeast(n))),
            _ => Err(Reply::error(
                400,
                format!("invalid nodes {n:?}: expected \"all\" or a number of nodes from 1"),
            )),
        },
    }
}

/// Dry-runs the complete candidate configuration through the data plane's checker, commits, and with
/// `?wait=applied` waits until the data plane reports the new revision (with `nodes`, until that many nodes do).
pub(crate) async fn commit(
    state: &AdminState,
    snap: &Snapshot,
    ops: Vec<Op>,
    req: &Req,
) -> Result<(), Reply> {
    // Checked before anything is written: a bad query changes nothing.
    let nodes = wait_nodes(req)?;
    let resources = candidate_resources(state, snap, &ops);
    let token = (state.checker)(&resources).map_err(|e| Reply::error(400, e))?;
    let prepared = kv::Prepared {
        base: snap.revision,
        resources,
        token,
        view: None,
    };
    let rev = state
        .store
        .commit_prepared(ops, prepared)
        .await
        .map_err(store_error)?;
    let deadline = tokio::time::Instant::now() + WAIT_APPLIED;
    if req.arg("wait") == Some("applied") || nodes.is_some() {
        let mut rx = state.applied.clone();
        let waited = tokio::time::timeout_at(deadline, rx.wait_for(|a| *a >= rev)).await;
        if !matches!(waited, Ok(Ok(_))) {
            return Err(Reply::error(
                504,
                format!("revision {rev} was committed but not applied within 10s"),
            ));
        }
    }
    if let Some(want) = nodes {
        wait_for_nodes(state, rev, want, deadline).await?;
    }
    Ok(())
}

/// Polls the node registry until enough live nodes report `applied_revision >= rev`. A node reports a new
/// revision as soon as it applied it (then at most once a second), so this takes about one apply plus one etcd
/// round trip. Without a registry (embedded store) this node is the only one.
async fn wait_for_nodes(
    state: &AdminState,
    rev: u64,
    want: WaitNodes,
    deadline: tokio::time::Instant,
) -> Result<(), Reply> {
    let mut seen = (0, 0);
    loop {
        match state.store.nodes().await {
            Ok(list) => {
                let applied = |n: &serde_json::Value| {
                    n["applied_revision"].as_u64().is_some_and(|a| a >= rev)
                };
                seen = match list {
                    Some(list) => (list.iter().filter(|n| applied(n)).count(), list.len()),
                    None => (1, 1),
                };
                let enough = match want {
                    WaitNodes::All => seen.0 == seen.1,
                    WaitNodes::AtLeast(n) => seen.0 >= n,
                };
                if enough {
                    return Ok(());
                }
            }
            Err(e) => tracing::debug!(error = %e, "node registry unreadable while waiting"),
        }
        if tokio::time::Instant::now() + Duration::from_millis(50) >= deadline {
            return Err(Reply::error(
                504,
                format!(
                    "revision {rev} was committed; {} of {} live nodes applied it within 10s",
                    seen.0, seen.1
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The complete configuration after `ops`. When the store's published view is at `snap`'s revision, only the
/// touched keys are decoded (and, for routes and their kin, without copying the key space); else a full decode.
pub(crate) fn candidate_resources(state: &AdminState, snap: &Snapshot, ops: &[Op]) -> Resources {
    candidate_view(state, snap, ops).0
}

/// The candidate's resources, and the store's whole view after `ops` when building them took one (a write of
/// many keys: [`kv::Prepared::view`] lets the commit reuse it).
pub(crate) fn candidate_view(
    state: &AdminState,
    snap: &Snapshot,
    ops: &[Op],
) -> (Resources, Option<Snapshot>) {
    let published = state.store.subscribe().borrow().clone();
    let de = state.store.data_encryption();
    let keys = || ops.iter().map(Op::key);
    if published.revision != snap.revision {
        let mut candidate = snap.clone();
        candidate.apply(ops, snap.revision + 1);
        let r = candidate.to_resources(&de);
        return (r, Some(candidate));
    }
    if ops.len() <= kv::PATCH_MAX_KEYS && keys().all(kv::patch_is_local) {
        let mut delta = Snapshot::default();
        delta.apply(ops, snap.revision + 1);
        return (
            kv::patch_resources(&published.resources, &delta, keys(), &de),
            None,
        );
    }
    let mut candidate = snap.clone();
    candidate.apply(ops, snap.revision + 1);
    let r = kv::patch_resources(&published.resources, &candidate, keys(), &de);
    (r, Some(candidate))
}

pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Maps `/apisix/admin/{segs}` to a resource target, or None when it is no resource URL.
pub(crate) fn target(segs: &[String]) -> Option<Target> {
    let (first, rest) = segs.split_first()?;
    if first == "consumers" && rest.len() >= 2 && rest[1] == "credentials" {
        return Some(Target {
            kind: &CREDENTIALS,
            prefix: format!("consumers/{}/credentials/", rest[0]),
            id: rest.get(2).cloned(),
            sub_path: rest.get(3..).map(|s| s.join("/")).unwrap_or_default(),
        });
    }
    let kind = resources::find(first)?;
    if kind.name == "secrets" {
        // `/secrets/{manager}/{id}`: the id is both segments, as APISIX keys it.
        return Some(Target {
            kind,
            prefix: "secrets/".into(),
            id: (rest.len() >= 2).then(|| rest[..2].join("/")),
            sub_path: rest.get(2..).map(|s| s.join("/")).unwrap_or_default(),
        });
    }
    Some(Target {
        kind,
        prefix: format!("{}/", kind.name),
        id: rest.first().filter(|s| !s.is_empty()).cloned(),
        sub_path: rest.get(1..).map(|s| s.join("/")).unwrap_or_default(),
    })
}

/// A credential's consumer exists in `snap` (true for any other target).
pub(crate) fn consumer_exists(snap: &Snapshot, t: &Target) -> bool {
    let Some(user) = t
        .prefix
        .strip_prefix("consumers/")
        .and_then(|r| r.split('/').next())
    else {
        return true;
    };
    t.kind.name != "credentials" || snap.get(&format!("consumers/{user}")).is_some()
}
