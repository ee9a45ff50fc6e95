//! Zipkin v2 JSON (`POST /api/v2/spans`): an array of spans with hex ids, microsecond timestamps and string tags,
//! as APISIX's zipkin reporter writes them. Written straight into the body (serde_json only escapes the strings):
//! building `serde_json::Value` trees cost ~15k instructions per span in the exporter thread.

use std::fmt::Write;

use super::{put_hex, Kind, SpanRecord};

pub(crate) fn encode(spans: &[SpanRecord]) -> Vec<u8> {
    let mut out = String::with_capacity(spans.len() * 512 + 2);
    out.push('[');
    for (i, s) in spans.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        span(&mut out, s);
    }
    out.push(']');
    out.into_bytes()
}

/// A JSON string literal, escaped by serde_json.
fn put_str(out: &mut String, s: &str) {
    match serde_json::to_string(s) {
        Ok(q) => out.push_str(&q),
        Err(_) => out.push_str("\"\""),
    }
}

fn span(out: &mut String, s: &SpanRecord) {
    let start_us = s.start_ns / 1000;
    // Zipkin drops a zero duration; a span always lasted at least a microsecond.
    let duration = (s.end_ns / 1000).saturating_sub(start_us).max(1);
    out.push_str("{\"traceId\":\"");
    put_hex(out, &s.trace_id);
    out.push_str("\",\"id\":\"");
    put_hex(out, &s.span_id);
    out.push('"');
    if let Some(p) = s.parent {
        out.push_str(",\"parentId\":\"");
        put_hex(out, &p);
        out.push('"');
    }
    out.push_str(",\"name\":");
    put_str(out, &s.name);
    if s.kind == Kind::Server {
        out.push_str(",\"kind\":\"SERVER\"");
    }
    let _ = write!(out, ",\"timestamp\":{start_us},\"duration\":{duration}");
    if let Some((service, ip, port)) = &s.local {
        out.push_str(",\"localEndpoint\":{\"serviceName\":");
        put_str(out, service);
        if !ip.is_empty() {
            out.push_str(",\"ipv4\":");
            put_str(out, ip);
        }
        let _ = write!(out, ",\"port\":{port}}}");
    }
    out.push_str(",\"tags\":{");
    for (i, (k, v)) in s.attrs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        put_str(out, k);
        out.push(':');
        put_str(out, &v.to_string());
    }
    out.push_str("}}");
}

#[cfg(test)]
mod tests {
    use super::super::{Attr, Kind, SpanRecord};

    #[test]
    fn spans_are_zipkin_v2_json() {
        let s = SpanRecord {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: Some([3; 8]),
            name: "apisix.\"request\"".into(),
            kind: Kind::Server,
            start_ns: 1_700_000_000_123_456_789,
            end_ns: 1_700_000_000_123_456_789,
            attrs: vec![
                ("http.url".into(), Attr::Str("/a?b=\"c\"\n".into())),
                ("n".into(), Attr::Int(200)),
            ],
            error: None,
            trace_state: None,
            local: Some(("APISIX".into(), "10.0.0.1".into(), 9080)),
        };
        let mut other = s.clone();
        other.parent = None;
        other.kind = Kind::Internal;
        other.local = None;
        other.attrs.clear();
        let v: serde_json::Value = serde_json::from_slice(&super::encode(&[s, other])).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"traceId": "01010101010101010101010101010101", "id": "0202020202020202",
                 "parentId": "0303030303030303", "name": "apisix.\"request\"", "kind": "SERVER",
                 "timestamp": 1_700_000_000_123_456u64, "duration": 1,
                 "localEndpoint": {"serviceName": "APISIX", "ipv4": "10.0.0.1", "port": 9080},
                 "tags": {"http.url": "/a?b=\"c\"\n", "n": "200"}},
                {"traceId": "01010101010101010101010101010101", "id": "0202020202020202",
                 "name": "apisix.\"request\"", "timestamp": 1_700_000_000_123_456u64, "duration": 1,
                 "tags": {}}
            ])
        );
    }
}
