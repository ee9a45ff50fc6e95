//! Sluice's additions to the Admin API: configuration history and node status. Every committed write is a
//! revision; these endpoints list revisions, show what one changed, diff two, and roll back to one (as a new
//! revision, validated like any write). Status reports the store's and the data plane's applied revisions.
//!
//!   GET  /apisix/admin/history?after=N&limit=M    revisions after N, oldest first (keys and actions only)
//!   GET  /apisix/admin/history/{rev}              one revision with old/new values
//!   GET  /apisix/admin/history/diff?from=A&to=B   net change between two revisions
//!   POST /apisix/admin/history/{rev}/rollback     restore the configuration as it was at {rev}
//!                                                 (`?confirm=empty` when that state has no resource at all)
//!   GET  /apisix/admin/status                     backend, revision, applied revision, health
//!   GET  /apisix/admin/nodes                      every node (etcd registry) or this one, with applied revision
//!
//! Values are shown as a GET shows them (`handlers::present`): viewer keys see every secret redacted.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sluice_store::kv::{Op, Revision};

use crate::config::Role;
use crate::handlers::{commit, present, store_error, Req};
use crate::{AdminState, Reply};

const MAX_LIST: usize = 1000;

fn action(old: &Option<Value>, new: &Option<Value>) -> &'static str {
    match (old, new) {
        (None, _) => "create",
        (_, None) => "delete",
        _ => "update",
    }
}

fn num(req: &Req, name: &str) -> Result<Option<u64>, Reply> {
    req.arg(name)
        .map(|v| v.parse::<u64>())
        .transpose()
        .map_err(|_| Reply::error(400, format!("invalid argument {name}: should be a number")))
}

pub(crate) async fn handle(state: &AdminState, req: &Req, rest: &[String]) -> Reply {
    let parts: Vec<&str> = rest.iter().map(String::as_str).collect();
    let result = match (req.method.as_str(), parts.as_slice()) {
        ("GET", []) => list(state, req).await,
        ("GET", ["diff"]) => diff(state, req).await,
        ("GET", [rev]) => one(state, req.role, rev).await,
        ("POST", [rev, "rollback"]) => rollback(state, req, rev).await,
        _ => Err(Reply::error(404, "not found")),
    };
    result.unwrap_or_else(|r| r)
}

async fn list(state: &AdminState, req: &Req) -> Result<Reply, Reply> {
    let after = num(req, "after")?.unwrap_or(0);
    let limit = num(req, "limit")?.map_or(100, |l| l as usize).min(MAX_LIST);
    let revs = state
        .store
        .history(after, limit)
        .await
        .map_err(store_error)?;
    let list: Vec<Value> = revs
        .iter()
        .map(|r| {
            let changes: Vec<Value> = r
                .changes
                .iter()
                .map(|c| json!({"key": format!("/apisix/{}", c.key), "action": action(&c.old, &c.new)}))
                .collect();
            json!({"revision": r.revision, "time": r.time, "changes": changes})
        })
        .collect();
    Ok(Reply::json(200, json!({"total": list.len(), "list": list})))
}

fn parse_rev(rev: &str) -> Result<u64, Reply> {
    rev.parse()
        .map_err(|_| Reply::error(400, format!("invalid revision {rev:?}")))
}

async fn one(state: &AdminState, role: Role, rev: &str) -> Result<Reply, Reply> {
    let rev = parse_rev(rev)?;
    let found = state
        .store
        .history(rev.saturating_sub(1), 1)
        .await
        .map_err(store_error)?;
    match found.into_iter().find(|r| r.revision == rev) {
        Some(r) => Ok(Reply::json(200, revision_json(state, role, &r))),
        None => Err(Reply::error(404, format!("revision {rev} not found"))),
    }
}

fn revision_json(state: &AdminState, role: Role, r: &Revision) -> Value {
    let changes: Vec<Value> = r
        .changes
        .iter()
        .map(|c| change_json(state, role, &c.key, &c.old, &c.new))
        .collect();
    json!({"revision": r.revision, "time": r.time, "changes": changes})
}

fn change_json(
    state: &AdminState,
    role: Role,
    key: &str,
    old: &Option<Value>,
    new: &Option<Value>,
) -> Value {
    let show = |v: &Option<Value>| v.as_ref().map(|v| present(state, role, key, v));
    json!({"key": format!("/apisix/{key}"), "action": action(old, new),
           "old": show(old), "new": show(new)})
}

/// Net effect of revisions (from, to]: for each key, its value at `from` and at `to`.
async fn net_changes(
    state: &AdminState,
    from: u64,
    to: u64,
) -> Result<BTreeMap<String, (Option<Value>, Option<Value>)>, Reply> {
    let mut net: BTreeMap<String, (Option<Value>, Option<Value>)> = BTreeMap::new();
    let mut after = from;
    while after < to {
        let batch = state
            .store
            .history(after, MAX_LIST)
            .await
            .map_err(store_error)?;
        let Some(last) = batch.last().map(|r| r.revision) else {
            break;
        };
        for r in batch.iter().filter(|r| r.revision <= to) {
            for c in &r.changes {
                let e = net.entry(c.key.clone()).or_insert((c.old.clone(), None));
                e.1 = c.new.clone();
            }
        }
        after = last;
    }
    net.retain(|_, (a, b)| a != b);
    Ok(net)
}

async fn diff(state: &AdminState, req: &Req) -> Result<Reply, Reply> {
    let current = state.store.snapshot().revision;
    let from = num(req, "from")?.unwrap_or(0);
    let to = num(req, "to")?.unwrap_or(current).min(current);
    if from > to {
        return Err(Reply::error(400, "from must not be greater than to"));
    }
    let net = net_changes(state, from, to).await?;
    let changes: Vec<Value> = net
        .iter()
        .map(|(k, (old, new))| change_json(state, req.role, k, old, new))
        .collect();
    Ok(Reply::json(
        200,
        json!({"from": from, "to": to, "changes": changes}),
    ))
}

async fn rollback(state: &AdminState, req: &Req, rev: &str) -> Result<Reply, Reply> {
    let target = parse_rev(rev)?;
    if !state.store.healthy() {
        return Err(Reply::error(503, "the configuration store is unavailable"));
    }
    let _w = state.write_lock.lock().await;
    let snap = state.store.snapshot();
    if target > snap.revision {
        return Err(Reply::error(404, format!("revision {target} not found")));
    }
    // Undo every revision after the target: each touched key returns to its value at the target.
    let net = net_changes(state, target, snap.revision).await?;
    // A state without resources (revision 0, or after deleting everything) would wipe the configuration in one
    // call: that takes an explicit confirmation.
    let kept = snap
        .entries
        .keys()
        .filter(|k| !net.contains_key(*k))
        .count();
    let restored = net
        .values()
        .filter(|(at_target, _)| at_target.is_some())
        .count();
    if kept + restored == 0 && !net.is_empty() && req.arg("confirm") != Some("empty") {
        return Err(Reply::error(
            400,
            format!(
                "revision {target} has no resources: rolling back to it deletes all {} resources; \
                 add ?confirm=empty to do so",
                snap.entries.len()
            ),
        ));
    }
    let ops: Vec<Op> = net
        .into_iter()
        .map(|(key, (at_target, _))| {
            let expect_mod = Some(snap.get(&key).map_or(0, |e| e.mod_revision));
            match at_target {
                Some(value) => Op::Put {
                    key,
                    value,
                    expect_mod,
                },
                None => Op::Delete { key, expect_mod },
            }
        })
        .collect();
    let changed = ops.len();
    if changed == 0 {
        return Ok(Reply::json(
            200,
            json!({"revision": snap.revision, "rolled_back_to": target, "changes": 0}),
        ));
    }
    commit(state, &snap, ops, req).await?;
    let revision = state.store.snapshot().revision;
    Ok(Reply::json(
        200,
        json!({"revision": revision, "rolled_back_to": target, "changes": changed}),
    ))
}

pub(crate) fn status(state: &AdminState) -> Reply {
    let snap = state.store.snapshot();
    Reply::json(
        200,
        json!({
            "backend": state.store.backend(),
            "revision": snap.revision,
            "applied": *state.applied.borrow(),
            "healthy": state.store.healthy(),
        }),
    )
}

/// `GET /apisix/admin/nodes`: every node's `server_info` with its applied revision, from the store's registry
/// (etcd: live leased keys), or this node alone when the store keeps none (embedded).
pub(crate) async fn nodes(state: &AdminState) -> Reply {
    let list = match state.store.nodes().await {
        Ok(Some(list)) => list,
        Ok(None) => vec![Value::Object(sluice_store::node::report(
            &state.server_info,
            *state.applied.borrow(),
        ))],
        Err(e) => return Reply::error(503, e.to_string()),
    };
    let mut list: Vec<Value> = list
        .into_iter()
        .map(|mut v| {
            // Present means alive: a node's key lives on a lease it renews.
            v["alive"] = Value::Bool(true);
            v
        })
        .collect();
    list.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Reply::json(200, json!({"total": list.len(), "list": list}))
}
