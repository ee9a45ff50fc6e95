//! Zipkin v2 JSON (`POST /api/v2/spans`): an array of spans with hex ids, microsecond timestamps and string tags,
//! as APISIX's zipkin reporter writes them.

use serde_json::{json, Map, Value};

use super::{hex, Kind, SpanRecord};

pub(crate) fn encode(spans: &[SpanRecord]) -> Vec<u8> {
    let all: Vec<Value> = spans.iter().map(span).collect();
    serde_json::to_vec(&all).unwrap_or_default()
}

fn span(s: &SpanRecord) -> Value {
    let tags: Map<String, Value> = s
        .attrs
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    let start_us = s.start_ns / 1000;
    let mut o = json!({
        "traceId": hex(&s.trace_id),
        "id": hex(&s.span_id),
        "name": s.name,
        "timestamp": start_us,
        // Zipkin drops a zero duration; a span always lasted at least a microsecond.
        "duration": (s.end_ns / 1000).saturating_sub(start_us).max(1),
        "tags": tags,
    });
    if let Some(p) = s.parent {
        o["parentId"] = hex(&p).into();
    }
    if s.kind == Kind::Server {
        o["kind"] = "SERVER".into();
    }
    if let Some((service, ip, port)) = &s.local {
        let mut ep = json!({"serviceName": service, "port": port});
        if !ip.is_empty() {
            ep["ipv4"] = ip.to_string().into();
        }
        o["localEndpoint"] = ep;
    }
    o
}
