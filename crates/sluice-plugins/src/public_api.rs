//! public-api (priority 501, access), as APISIX's: a route carrying it answers with a plugin's own API (APISIX's
//! `_M.api()` routes) at `uri` (default: the request's `$uri`), so the API gets the route's other plugins in front
//! of it (key-auth, ip-restriction, limit-count ...). The APIs Sluice's plugins offer: prometheus's `GET
//! /apisix/prometheus/metrics` (the exposition the export server serves). Anything else answers 404, as APISIX's
//! API router does when nothing matches. The upstream is never contacted.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::prometheus::Metrics;
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "public-api";
pub const PRIORITY: i32 = 501;

/// prometheus's API (APISIX `default_export_uri`).
const METRICS_URI: &str = "/apisix/prometheus/metrics";

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

fn schema() -> Value {
    json!({"type": "object", "properties": {"uri": {"type": "string"}}})
}

fn check(v: &Value) -> Result<(), String> {
    sluice_model::schema::validate(&schema(), v)
}

struct PublicApi {
    uri: Option<Box<str>>,
    metrics: Arc<Metrics>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    Ok(Arc::new(PublicApi {
        uri: v.get("uri").and_then(Value::as_str).map(Box::from),
        metrics: env.shared.metrics().clone(),
    }))
}

impl Plugin for PublicApi {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access])
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let uri = self.uri.as_deref().unwrap_or(&ctx.req.uri);
        if uri == METRICS_URI && ctx.req.head.method_str() == "GET" {
            let mut r = Response::status(200);
            r.headers.push((
                Bytes::from_static(b"Content-Type"),
                Bytes::from_static(b"text/plain; version=0.0.4"),
            ));
            r.body = Bytes::from(self.metrics.render());
            return Flow::Respond(r);
        }
        // APISIX's `return 404`: nginx's error page.
        Flow::Respond(crate::util::error_page(404))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn schema() {
        assert!(super::check(&json!({})).is_ok());
        assert!(super::check(&json!({"uri": "/apisix/prometheus/metrics"})).is_ok());
        assert!(super::check(&json!({"uri": 1})).is_err());
    }
}
