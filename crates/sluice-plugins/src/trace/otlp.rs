//! OTLP/HTTP protobuf: the few messages of opentelemetry-proto's `ExportTraceServiceRequest` a server span needs,
//! declared with prost (field numbers from opentelemetry/proto/{collector/trace,trace,common,resource}/v1). The
//! `opentelemetry-proto` crate's prost types come with tonic; the data plane has no use for a gRPC stack.

use prost::Message;

use super::{Attr, Kind, SpanRecord};

#[derive(Clone, PartialEq, Message)]
struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, Message)]
struct Resource {
    #[prost(message, repeated, tag = "1")]
    attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    spans: Vec<Span>,
}

#[derive(Clone, PartialEq, Message)]
struct InstrumentationScope {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    version: String,
}

#[derive(Clone, PartialEq, Message)]
struct Span {
    #[prost(bytes = "vec", tag = "1")]
    trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    name: String,
    /// SpanKind: 1 internal, 2 server.
    #[prost(int32, tag = "6")]
    kind: i32,
    #[prost(fixed64, tag = "7")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    attributes: Vec<KeyValue>,
    #[prost(message, optional, tag = "15")]
    status: Option<Status>,
}

#[derive(Clone, PartialEq, Message)]
struct Status {
    #[prost(string, tag = "2")]
    message: String,
    /// StatusCode: 0 unset, 1 ok, 2 error.
    #[prost(int32, tag = "3")]
    code: i32,
}

#[derive(Clone, PartialEq, Message)]
struct KeyValue {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 4")]
    value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Value {
    #[prost(string, tag = "1")]
    Str(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(double, tag = "4")]
    Double(f64),
}

fn kv(key: &str, a: &Attr) -> KeyValue {
    let value = match a {
        Attr::Str(s) => Value::Str(s.to_string()),
        Attr::Int(i) => Value::Int(*i),
        Attr::Double(d) => Value::Double(*d),
        Attr::Bool(b) => Value::Bool(*b),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

/// APISIX's instrumentation scope name (opentelemetry-lua's tracer).
const SCOPE: &str = "opentelemetry-lua";

/// One `ExportTraceServiceRequest` holding `spans` under `resource`.
pub(crate) fn encode(spans: &[SpanRecord], resource: &[(String, Attr)]) -> Vec<u8> {
    let spans = spans
        .iter()
        .map(|s| Span {
            trace_id: s.trace_id.to_vec(),
            span_id: s.span_id.to_vec(),
            trace_state: s.trace_state.as_deref().unwrap_or_default().to_owned(),
            parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: s.name.to_string(),
            kind: match s.kind {
                Kind::Internal => 1,
                Kind::Server => 2,
            },
            start_time_unix_nano: s.start_ns,
            end_time_unix_nano: s.end_ns,
            attributes: s.attrs.iter().map(|(k, v)| kv(k, v)).collect(),
            status: s.error.as_ref().map(|m| Status {
                message: m.to_string(),
                code: 2,
            }),
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource.iter().map(|(k, v)| kv(k, v)).collect(),
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: SCOPE.into(),
                    version: String::new(),
                }),
                spans,
            }],
        }],
    }
    .encode_to_vec()
}
