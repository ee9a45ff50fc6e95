//! APISIX's API-driven standalone Admin API (`apisix/admin/standalone.lua`, `config_validate.lua`), served when
//! the node runs `role: traditional` with `config_provider: yaml`:
//!
//!   GET  /apisix/admin/configs            the configuration (JSON, or YAML with `Accept: application/yaml`)
//!   HEAD /apisix/admin/configs            its `X-Digest` and `X-Last-Modified`
//!   PUT  /apisix/admin/configs            replaces it (JSON or YAML body, `X-Digest` required): 202 once this
//!                                         node serves it (bounded, 10 s); 204 when the digest is the loaded one
//!   POST /apisix/admin/configs/validate   checks a document without applying it: 200 `{}` or 400 with every error
//!
//! Each resource kind has a `<kind>_conf_version`: a higher one replaces that kind, an equal one keeps it, a lower
//! one is refused (400) and changes nothing; a kind sent without one is replaced with the version incremented.
//! Items are checked with the Admin API's schemas (plus APISIX's `modifiedIndex`), then the whole configuration
//! is compiled by the data plane before it is published: a document it would refuse changes nothing.

use bytes::Bytes;
use serde_json::{json, Map, Value};
use sluice_model::Resources;
use sluice_store::api::{ApiStandalone, KINDS};

use crate::{resources, AdminState};

/// What the HTTP layer sends back: status, content type, body, and the metadata headers.
pub(crate) struct Answer {
    pub status: u16,
    pub ctype: &'static str,
    pub body: Bytes,
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    pub(crate) fn json(status: u16, v: Value) -> Answer {
        Answer {
            status,
            ctype: "application/json",
            body: if v.is_null() {
                Bytes::new()
            } else {
                Bytes::from(v.to_string())
            },
            headers: Vec::new(),
        }
    }

    pub(crate) fn error(status: u16, msg: impl Into<String>) -> Answer {
        Answer::json(status, json!({"error_msg": msg.into()}))
    }

    fn meta(mut self, doc: Option<&Map<String, Value>>) -> Answer {
        for (k, name) in [(LAST_MODIFIED, "x-last-modified"), (DIGEST, "x-digest")] {
            if let Some(v) = doc.and_then(|d| d.get(k)) {
                let text = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                self.headers.push((name, text));
            }
        }
        self
    }
}

const DIGEST: &str = "X-Digest";
const LAST_MODIFIED: &str = "X-Last-Modified";

pub(crate) fn version_key(kind: &str) -> String {
    format!("{kind}_conf_version")
}

pub(crate) struct Request<'a> {
    pub method: &'a str,
    /// After `/apisix/admin`, trailing `/` trimmed.
    pub path: &'a str,
    pub content_type: Option<&'a str>,
    pub accept: Option<&'a str>,
    pub digest: Option<&'a str>,
    pub body: Bytes,
}

pub(crate) fn handle(state: &AdminState, api: &ApiStandalone, req: Request<'_>) -> Answer {
    match (req.method, req.path) {
        ("GET", "/configs") => get(api, req.accept),
        ("HEAD", "/configs") => Answer::json(200, Value::Null).meta(api.document().as_ref()),
        ("POST", "/configs/validate") => validate(state, &req),
        _ => Answer::error(404, "not found"),
    }
}

/// Async only because one PUT waits for the one before it.
pub(crate) async fn put(state: &AdminState, api: &ApiStandalone, req: Request<'_>) -> Answer {
    let Some(digest) = req.digest else {
        return Answer::error(400, "missing digest header");
    };
    let body = match parse(&req) {
        Ok(b) => b,
        Err(a) => return a,
    };
    let _one_at_a_time = api.writing.lock().await;
    let current = api.document();
    if current
        .as_ref()
        .and_then(|c| c.get(DIGEST))
        .and_then(Value::as_str)
        == Some(digest)
    {
        return Answer::json(204, Value::Null);
    }
    if let Err(errors) = check_items(state, &body, false) {
        let msg = errors
            .first()
            .and_then(|e| e["error"].as_str())
            .unwrap_or("invalid configuration")
            .to_owned();
        return Answer::error(400, msg);
    }
    let mut next = Map::new();
    for kind in KINDS {
        let vkey = version_key(kind);
        let old = current
            .as_ref()
            .and_then(|c| c.get(&vkey))
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let new = match body.get(&vkey).and_then(Value::as_f64) {
            Some(n) if n < old => {
                return Answer::error(
                    400,
                    format!("{vkey} must be greater than or equal to ({})", num(old)),
                )
            }
            Some(n) => n,
            None => old + 1.0,
        };
        next.insert(vkey, json!(num(new)));
        if new == old {
            if let Some(items) = current.as_ref().and_then(|c| c.get(*kind)) {
                next.insert((*kind).to_owned(), items.clone());
            }
        } else if let Some(items) = body
            .get(*kind)
            .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        {
            next.insert((*kind).to_owned(), items.clone());
        }
    }
    let resources = match to_resources(&next) {
        Ok(r) => r,
        Err(e) => return Answer::error(400, e),
    };
    if let Err(e) = (state.checker)(&resources) {
        return Answer::error(400, e);
    }
    next.insert(LAST_MODIFIED.into(), json!(sluice_store::kv::now()));
    next.insert(DIGEST.into(), json!(digest));
    let rev = api.publish(next.clone(), resources);
    // Answered once this node serves it (bounded), so a client's next request sees the new configuration.
    let mut applied = state.applied.clone();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        applied.wait_for(|a| *a >= rev),
    )
    .await;
    Answer::json(202, Value::Null).meta(Some(&next))
}

/// Integral versions print as integers, as Lua's do.
fn num(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        json!(n as i64)
    } else {
        json!(n)
    }
}

fn get(api: &ApiStandalone, accept: Option<&str>) -> Answer {
    let doc = api.document();
    let body = match &doc {
        Some(d) => d.clone(),
        None => KINDS
            .iter()
            .map(|k| (version_key(k), json!(0)))
            .collect::<Map<String, Value>>(),
    };
    let yaml = accept.is_some_and(|a| a.starts_with("application/yaml"));
    let answer = if yaml {
        match serde_yaml::to_string(&body) {
            Ok(text) => Answer {
                status: 200,
                ctype: "application/yaml",
                body: Bytes::from(text),
                headers: Vec::new(),
            },
            Err(e) => Answer::error(500, format!("failed to encode yaml: {e}")),
        }
    } else {
        Answer::json(200, Value::Object(body))
    };
    answer.meta(doc.as_ref())
}

pub(crate) fn validate(state: &AdminState, req: &Request<'_>) -> Answer {
    let body = match parse(req) {
        Ok(b) => b,
        Err(a) => return a,
    };
    match check_items(state, &body, true) {
        Ok(()) => Answer::json(200, json!({})),
        Err(errors) => Answer::json(
            400,
            json!({"error_msg": "Configuration validation failed", "errors": errors}),
        ),
    }
}

/// The body as a JSON object, from JSON or (with `Content-Type: application/yaml`) YAML.
pub(crate) fn parse(req: &Request<'_>) -> Result<Map<String, Value>, Answer> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Err(Answer::error(
            400,
            "invalid request body: empty request body",
        ));
    }
    let yaml = req
        .content_type
        .is_some_and(|c| c.starts_with("application/yaml"));
    let v: Value = if yaml {
        serde_yaml::from_slice(&req.body)
            .map_err(|_| Answer::error(400, "invalid request body: invalid yaml request body"))?
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| Answer::error(400, format!("invalid request body: {e}")))?
    };
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(Answer::error(
            400,
            "invalid request body: invalid yaml request body",
        )),
    }
}

/// APISIX's `validate_configuration`: each kind's version must be a number, each item must pass its kind's
/// schema and plugin checks, ids must not repeat. `all`: collect every error, else stop at the first.
fn check_items(state: &AdminState, body: &Map<String, Value>, all: bool) -> Result<(), Vec<Value>> {
    let mut errors = Vec::new();
    for kind in KINDS {
        let vkey = version_key(kind);
        if let Some(v) = body.get(&vkey).filter(|v| !v.is_number()) {
            errors.push(json!({"resource_type": kind, "error": format!("{vkey} must be a number, got {}", type_name(v))}));
            if !all {
                return Err(errors);
            }
        }
        let Some(items) = body.get(*kind) else {
            continue;
        };
        let Some(items) = items.as_array() else {
            errors
                .push(json!({"resource_type": kind, "error": format!("{kind} must be an array")}));
            if !all {
                return Err(errors);
            }
            continue;
        };
        let mut ids = std::collections::HashSet::new();
        for (index, item) in items.iter().enumerate() {
            let id = item
                .get("id")
                .or_else(|| item.get("username"))
                .and_then(resources::id_string)
                .unwrap_or_default();
            let mut fail = |e: String| {
                errors.push(
                    json!({"resource_type": kind, "resource_id": id, "index": index, "error": e}),
                );
            };
            if let Err(e) = check_item(state, kind, item) {
                fail(e);
            }
            let (what, ident) = if *kind == "consumers" && item.get("id").is_none() {
                ("username", item.get("username"))
            } else if *kind == "consumers" {
                ("credential id", item.get("id"))
            } else {
                ("id", item.get("id"))
            };
            if let Some(ident) = ident.and_then(resources::id_string) {
                if !ids.insert(ident.clone()) {
                    fail(format!("found duplicate {what} {ident} in {kind}"));
                }
            }
            if !all && !errors.is_empty() {
                return Err(errors);
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "nil",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) | Value::Object(_) => "table",
    }
}

fn check_item(state: &AdminState, kind: &str, item: &Value) -> Result<(), String> {
    let Some(obj) = item.as_object() else {
        return Err(format!("invalid {kind} item: expected an object"));
    };
    // A credential listed among consumers, as APISIX's standalone files carry them.
    let kind = if kind == "consumers"
        && obj
            .get("id")
            .and_then(Value::as_str)
            .is_some_and(|id| id.contains("/credentials/"))
    {
        "credentials"
    } else {
        kind
    };
    let Some(k) = resources::find(kind) else {
        return Ok(());
    };
    let mut schema = (k.schema)();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props
            .entry("modifiedIndex")
            .or_insert(json!({"type": "integer"}));
    }
    let mut item = obj.clone();
    if kind == "credentials" {
        // The owner lives in the id here (`jack/credentials/c1`); the schema checks the credential itself.
        item.remove("id");
    }
    sluice_model::schema::validate(&schema, &Value::Object(item.clone()))
        .map_err(|e| format!("invalid configuration: {e}"))?;
    // Stream routes' plugins are the stream forms, checked by the data plane's compile.
    if let Some(p) = item
        .get("plugins")
        .and_then(Value::as_object)
        .filter(|_| k.plugins != resources::PluginsField::Stream)
    {
        resources::check_plugins(p, state.plugins.as_ref())?;
    }
    Ok(())
}

/// The document's kinds as the data plane's model: `modifiedIndex` dropped, credentials taken out of `consumers`
/// (`jack/credentials/c1`) and given their owner.
fn to_resources(doc: &Map<String, Value>) -> Result<Resources, String> {
    let mut m = Map::new();
    let mut credentials = Vec::new();
    for kind in KINDS {
        let Some(items) = doc.get(*kind).and_then(Value::as_array) else {
            continue;
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let mut item = item.clone();
            if let Some(o) = item.as_object_mut() {
                o.remove("modifiedIndex");
                let cred = o
                    .get("id")
                    .and_then(Value::as_str)
                    .and_then(|id| id.split_once("/credentials/"))
                    .map(|(owner, id)| (owner.to_owned(), id.to_owned()));
                if let (Some((owner, id)), true) =
                    (cred, matches!(*kind, "consumers" | "credentials"))
                {
                    o.insert("id".into(), json!(id));
                    o.insert("consumer".into(), json!(owner));
                    credentials.push(item);
                    continue;
                }
            }
            out.push(item);
        }
        if *kind != "credentials" {
            m.insert((*kind).to_owned(), Value::Array(out));
        }
    }
    m.insert("credentials".into(), Value::Array(credentials));
    serde_json::from_value(Value::Object(m)).map_err(|e| format!("invalid configuration: {e}"))
}
