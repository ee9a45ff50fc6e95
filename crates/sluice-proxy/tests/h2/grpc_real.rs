//! gRPC pass-through against real gRPC servers (common/grpc_peers.rs: grpc-go's example greeter and route_guide,
//! and the Python Kitchen peer): an h2 client sends hand-framed gRPC (prost-encoded messages) through a route
//! whose upstream has `scheme: grpc`, and checks what a gRPC client would: messages, their order and timing,
//! `grpc-status` / `grpc-message` / `grpc-status-details-bin`, deadlines and cancellation as the server saw them.

#[path = "../common/grpc_peers.rs"]
pub(super) mod grpc_peers;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use prost::Message;
use serde_json::json;
use sluice_proxy::ProxyConfig;

use super::{connect, rt, Gw};
use grpc_peers::GrpcPeers;

// The messages used here, field for field as in tools/grpc-peers/*.proto, route_guide.proto and google/rpc.

#[derive(Clone, PartialEq, Message)]
struct HelloRequest {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct HelloReply {
    #[prost(string, tag = "1")]
    message: String,
}

#[derive(Clone, PartialEq, Message)]
struct Empty {}

#[derive(Clone, PartialEq, Message)]
struct CountRequest {
    #[prost(int32, tag = "1")]
    n: i32,
    #[prost(int32, tag = "2")]
    interval_ms: i32,
}

#[derive(Clone, PartialEq, Message)]
struct CountReply {
    #[prost(int32, tag = "1")]
    i: i32,
}

#[derive(Clone, PartialEq, Message)]
struct SumItem {
    #[prost(int64, tag = "1")]
    v: i64,
}

#[derive(Clone, PartialEq, Message)]
struct SumReply {
    #[prost(int64, tag = "1")]
    total: i64,
    #[prost(int32, tag = "2")]
    items: i32,
}

#[derive(Clone, PartialEq, Message)]
struct FailRequest {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(bool, tag = "3")]
    with_details: bool,
}

#[derive(Clone, PartialEq, Message)]
struct SlowRequest {
    #[prost(int32, tag = "1")]
    millis: i32,
}

#[derive(Clone, PartialEq, Message)]
pub(super) struct StatsReply {
    #[prost(int32, tag = "1")]
    pub(super) completed: i32,
    #[prost(int32, tag = "2")]
    pub(super) cancelled: i32,
    #[prost(int32, tag = "3")]
    pub(super) calls: i32,
}

#[derive(Clone, PartialEq, Message)]
struct BigRequest {
    #[prost(int32, tag = "1")]
    size: i32,
}

#[derive(Clone, PartialEq, Message)]
struct BigReply {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
}

/// The part of sluice.test.AllKinds used here.
#[derive(Clone, PartialEq, Message)]
struct AllKindsPart {
    #[prost(int64, tag = "4")]
    f_int64: i64,
    #[prost(sint32, tag = "7")]
    f_sint32: i32,
    #[prost(string, tag = "14")]
    f_string: String,
    #[prost(bytes = "vec", tag = "15")]
    f_bytes: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct HeadersReply {
    #[prost(map = "string, string", tag = "1")]
    metadata: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
struct Point {
    #[prost(int32, tag = "1")]
    latitude: i32,
    #[prost(int32, tag = "2")]
    longitude: i32,
}

#[derive(Clone, PartialEq, Message)]
struct Rectangle {
    #[prost(message, optional, tag = "1")]
    lo: Option<Point>,
    #[prost(message, optional, tag = "2")]
    hi: Option<Point>,
}

#[derive(Clone, PartialEq, Message)]
struct Feature {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    location: Option<Point>,
}

/// google.rpc.Status
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// google.protobuf.Any
#[derive(Clone, PartialEq, Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// google.rpc.ErrorInfo
#[derive(Clone, PartialEq, Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(map = "string, string", tag = "3")]
    metadata: HashMap<String, String>,
}

/// google.rpc.BadRequest
#[derive(Clone, PartialEq, Message)]
struct BadRequest {
    #[prost(message, repeated, tag = "1")]
    field_violations: Vec<FieldViolation>,
}

#[derive(Clone, PartialEq, Message)]
struct FieldViolation {
    #[prost(string, tag = "1")]
    field: String,
    #[prost(string, tag = "2")]
    description: String,
}

pub(super) fn peers() -> Option<&'static GrpcPeers> {
    grpc_peers::shared()
}

/// A gateway with one route to `upstream` over gRPC (h2c).
fn gw(upstream: SocketAddr) -> Gw {
    Gw::start(
        json!({"routes": [{"id": "g", "uri": "/*", "upstream": {
            "scheme": "grpc", "type": "roundrobin", "nodes": {upstream.to_string(): 1}}}]}),
        ProxyConfig::default(),
    )
}

/// A length-prefixed gRPC message (uncompressed).
fn frame(m: &impl Message) -> Bytes {
    let body = m.encode_to_vec();
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.into()
}

/// What came back for one call.
struct Reply {
    status: u16,
    headers: http::HeaderMap,
    /// Each message with the time its last byte arrived.
    messages: Vec<(Instant, Bytes)>,
    trailers: Option<http::HeaderMap>,
}

impl Reply {
    /// A gRPC status field: from the trailers, or from the headers of a trailers-only response.
    fn grpc(&self, name: &str) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get(name))
            .or_else(|| self.headers.get(name))
            .map(|v| v.to_str().expect("ASCII gRPC field"))
    }

    fn decode<M: Message + Default>(&self) -> Vec<M> {
        self.messages
            .iter()
            .map(|(_, m)| M::decode(m.clone()).expect("decodes"))
            .collect()
    }

    fn assert_ok(&self) {
        assert_eq!(self.status, 200);
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("application/grpc")
        );
        assert_eq!(
            self.grpc("grpc-status"),
            Some("0"),
            "grpc-message {:?}",
            self.grpc("grpc-message")
        );
        assert!(
            self.trailers.is_some(),
            "a gRPC answer with messages ends with trailers"
        );
    }
}

fn request(path: &str, meta: &[(&str, &str)]) -> http::Request<()> {
    let mut r = http::Request::post(format!("http://grpc.test{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in meta {
        r = r.header(*k, *v);
    }
    r.body(()).unwrap()
}

/// Reads a response: its messages split as they arrive (each stamped), then the trailers.
async fn read_reply(resp: h2::client::ResponseFuture) -> Reply {
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("response head in time")
        .expect("response head");
    let (parts, mut body) = resp.into_parts();
    let mut buf = bytes::BytesMut::new();
    let mut messages = Vec::new();
    loop {
        let d = tokio::time::timeout(Duration::from_secs(10), body.data())
            .await
            .expect("body data in time");
        let Some(d) = d else { break };
        let d = d.expect("body data");
        body.flow_control().release_capacity(d.len()).unwrap();
        buf.extend_from_slice(&d);
        while buf.len() >= 5 {
            assert_eq!(buf[0], 0, "uncompressed message");
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            buf.advance(5);
            messages.push((Instant::now(), buf.split_to(len).freeze()));
        }
    }
    assert!(buf.is_empty(), "a partial gRPC message at the end: {buf:?}");
    let trailers = tokio::time::timeout(Duration::from_secs(10), body.trailers())
        .await
        .expect("trailers in time")
        .expect("trailers");
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        messages,
        trailers,
    }
}

/// One call on `client`: `frames` sent as separate DATA frames, the last one ending the stream.
async fn call(
    client: &h2::client::SendRequest<Bytes>,
    path: &str,
    meta: &[(&str, &str)],
    frames: &[Bytes],
) -> Reply {
    let mut c = client.clone().ready().await.expect("ready");
    let (resp, mut tx) = c.send_request(request(path, meta), false).unwrap();
    for (i, f) in frames.iter().enumerate() {
        tx.send_data(f.clone(), i + 1 == frames.len()).unwrap();
    }
    read_reply(resp).await
}

/// Kitchen.Stats for `key`, read directly from the Python peer (not through the gateway).
pub(super) async fn stats(py: SocketAddr, key: &str) -> StatsReply {
    let c = connect(py).await;
    let r = call(
        &c,
        "/sluice.test.Kitchen/Stats",
        &[("x-stats-key", key)],
        &[frame(&Empty {})],
    )
    .await;
    r.assert_ok();
    r.decode::<StatsReply>().pop().expect("a StatsReply")
}

/// Polls Stats until `done` holds (bounded: the server notices a cancellation within a few ms).
pub(super) async fn stats_until(
    py: SocketAddr,
    key: &str,
    done: impl Fn(&StatsReply) -> bool,
) -> StatsReply {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let s = stats(py, key).await;
        if done(&s) || Instant::now() > end {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn grpc_real_unary_say_hello_to_go_and_python() {
    let Some(p) = peers() else { return };
    for (name, upstream) in [("go", p.go_greeter), ("py", p.py)] {
        let g = gw(upstream);
        let addr = g.addr;
        rt().block_on(async move {
            let c = connect(addr).await;
            let r = call(
                &c,
                "/helloworld.Greeter/SayHello",
                &[],
                &[frame(&HelloRequest {
                    name: format!("sluice via {name}"),
                })],
            )
            .await;
            r.assert_ok();
            assert_eq!(
                r.decode::<HelloReply>(),
                [HelloReply {
                    message: format!("Hello sluice via {name}")
                }],
                "{name}"
            );
        });
    }
}

#[test]
fn grpc_real_server_streaming_is_streamed_in_order() {
    let Some(p) = peers() else { return };
    let g = gw(p.py);
    let addr = g.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let r = call(
            &c,
            "/sluice.test.Kitchen/Count",
            &[],
            &[frame(&CountRequest {
                n: 5,
                interval_ms: 100,
            })],
        )
        .await;
        r.assert_ok();
        let got: Vec<i32> = r.decode::<CountReply>().iter().map(|m| m.i).collect();
        assert_eq!(got, [0, 1, 2, 3, 4]);
        // The server sleeps 100 ms before each message after the first: passed on as they come, the first and the
        // last arrive ~400 ms apart; a gateway that buffered the stream would hand them over together.
        let spread = r.messages[4].0 - r.messages[0].0;
        assert!(
            spread >= Duration::from_millis(200),
            "first and last message {spread:?} apart: the stream was buffered"
        );
    });
}

#[test]
fn grpc_real_route_guide_list_features_in_order() {
    let Some(p) = peers() else { return };
    let db: serde_json::Value = serde_json::from_slice(
        &std::fs::read(p.installed.route_guide_db()).expect("route_guide_db.json"),
    )
    .unwrap();
    let (lo, hi) = (
        Point {
            latitude: 400_000_000,
            longitude: -750_000_000,
        },
        Point {
            latitude: 420_000_000,
            longitude: -730_000_000,
        },
    );
    let expected: Vec<Feature> = db
        .as_array()
        .unwrap()
        .iter()
        .map(|f| Feature {
            name: f["name"].as_str().unwrap().to_owned(),
            location: Some(Point {
                latitude: f["location"]["latitude"].as_i64().unwrap() as i32,
                longitude: f["location"]["longitude"].as_i64().unwrap() as i32,
            }),
        })
        .filter(|f| {
            let l = f.location.as_ref().unwrap();
            (lo.latitude..=hi.latitude).contains(&l.latitude)
                && (lo.longitude..=hi.longitude).contains(&l.longitude)
        })
        .collect();
    assert!(
        expected.len() > 10,
        "the example database has features there"
    );
    let g = gw(p.route_guide);
    let addr = g.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let r = call(
            &c,
            "/routeguide.RouteGuide/ListFeatures",
            &[],
            &[frame(&Rectangle {
                lo: Some(lo),
                hi: Some(hi),
            })],
        )
        .await;
        r.assert_ok();
        assert_eq!(r.decode::<Feature>(), expected);
    });
}

#[test]
fn grpc_real_client_streaming_sum() {
    let Some(p) = peers() else { return };
    let g = gw(p.py);
    let addr = g.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let values: Vec<i64> = (1..=20).chain([-7, 1 << 40]).collect();
        let frames: Vec<Bytes> = values.iter().map(|&v| frame(&SumItem { v })).collect();
        let r = call(&c, "/sluice.test.Kitchen/Sum", &[], &frames).await;
        r.assert_ok();
        assert_eq!(
            r.decode::<SumReply>(),
            [SumReply {
                total: values.iter().sum(),
                items: values.len() as i32
            }]
        );
    });
}

#[test]
fn grpc_real_error_with_details_reaches_the_client_intact() {
    let Some(p) = peers() else { return };
    let g = gw(p.py);
    let addr = g.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let message = "no such thing: 100% gone ✓";
        let r = call(
            &c,
            "/sluice.test.Kitchen/Fail",
            &[],
            &[frame(&FailRequest {
                code: 5,
                message: message.to_owned(),
                with_details: true,
            })],
        )
        .await;
        assert_eq!(r.status, 200);
        assert!(r.messages.is_empty());
        assert_eq!(r.grpc("grpc-status"), Some("5"));
        // grpc-message is percent-encoded on the wire (gRPC over HTTP/2 spec).
        assert_eq!(
            r.grpc("grpc-message"),
            Some("no such thing: 100%25 gone %E2%9C%93")
        );
        let details = r
            .grpc("grpc-status-details-bin")
            .expect("grpc-status-details-bin");
        // Binary metadata is base64, padded or not.
        let engine = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        let raw = base64::Engine::decode(&engine, details).expect("base64");
        let st = RpcStatus::decode(&raw[..]).expect("google.rpc.Status");
        assert_eq!(st.code, 5);
        assert_eq!(st.message, message);
        assert_eq!(st.details.len(), 2);
        assert_eq!(
            st.details[0].type_url,
            "type.googleapis.com/google.rpc.ErrorInfo"
        );
        let info = ErrorInfo::decode(&st.details[0].value[..]).unwrap();
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("KITCHEN_FAIL", "sluice.test")
        );
        assert_eq!(info.metadata.get("code").map(String::as_str), Some("5"));
        assert_eq!(
            st.details[1].type_url,
            "type.googleapis.com/google.rpc.BadRequest"
        );
        let bad = BadRequest::decode(&st.details[1].value[..]).unwrap();
        assert_eq!(
            bad.field_violations,
            [FieldViolation {
                field: "code".into(),
                description: "asked to fail".into()
            }]
        );
    });
}

#[test]
fn grpc_real_one_mib_each_way() {
    let Some(p) = peers() else { return };
    let g = gw(p.py);
    let addr = g.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let r = call(
            &c,
            "/sluice.test.Kitchen/Big",
            &[],
            &[frame(&BigRequest { size: 1 << 20 })],
        )
        .await;
        r.assert_ok();
        let data = r.decode::<BigReply>().pop().unwrap().data;
        assert_eq!(data.len(), 1 << 20);
        assert!(
            data.iter().enumerate().all(|(i, &b)| b as usize == i % 251),
            "the server's byte pattern arrives unchanged"
        );

        // And upstream: a 1 MiB request message, sent in 16 KiB DATA frames, echoed back.
        let sent = AllKindsPart {
            f_int64: -1 << 50,
            f_sint32: -3,
            f_string: "ünïcode".into(),
            f_bytes: (0..1 << 20).map(|i| (i * 7 % 256) as u8).collect(),
        };
        let whole = frame(&sent);
        let pieces: Vec<Bytes> = whole.chunks(16 << 10).map(Bytes::copy_from_slice).collect();
        let r = call(&c, "/sluice.test.Kitchen/Echo", &[], &pieces).await;
        r.assert_ok();
        assert!(r.decode::<AllKindsPart>() == [sent], "echo differs");
    });
}

#[test]
fn grpc_real_metadata_and_deadline_reach_the_server() {
    let Some(p) = peers() else { return };
    let g = gw(p.py);
    let addr = g.addr;
    rt().block_on(async move {
        let c = connect(addr).await;
        let r = call(
            &c,
            "/sluice.test.Kitchen/Headers",
            &[
                ("x-custom", "v1"),
                ("x-trace-bin", "AAEC/w"),
                ("grpc-timeout", "5S"),
                ("user-agent", "sluice-test/1"),
            ],
            &[frame(&Empty {})],
        )
        .await;
        r.assert_ok();
        let md = r.decode::<HeadersReply>().pop().unwrap().metadata;
        assert_eq!(md.get("x-custom").map(String::as_str), Some("v1"), "{md:?}");
        assert_eq!(
            md.get("x-trace-bin").map(String::as_str),
            Some("000102ff"),
            "{md:?}"
        );
        assert!(
            md.get("user-agent")
                .is_some_and(|ua| ua.starts_with("sluice-test/1")),
            "{md:?}"
        );
        let left: u64 = md
            .get("sluice-test-deadline-ms")
            .expect("grpc-timeout set a deadline")
            .parse()
            .unwrap();
        assert!((1..=5000).contains(&left), "{left} ms left of 5 s");
    });
}

/// opentelemetry's `traceparent` and zipkin's B3 headers reach a real gRPC server as call metadata.
#[test]
fn grpc_real_trace_context_reaches_the_server() {
    let Some(p) = peers() else { return };
    let py = p.py;
    let g = Gw::start(
        json!({"routes": [{"id": "g", "uri": "/*",
            "plugins": {
                "opentelemetry": {"sampler": {"name": "parent_base"}},
                "zipkin": {"endpoint": "http://127.0.0.1:9/api/v2/spans", "sample_ratio": 1}
            },
            "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {py.to_string(): 1}}}],
            // Spans of sampled calls go to a closed port: export is tests/plugins/tracing.rs's subject.
            "plugin_metadata": [{"id": "opentelemetry", "collector": {"address": "127.0.0.1:9"}}]}),
        ProxyConfig::default(),
    );
    let addr = g.addr;
    let client = "4bf92f3577b34da6a3ce929d0e0e4736";
    rt().block_on(async move {
        let c = connect(addr).await;
        let parent = format!("00-{client}-00f067aa0ba902b7-01");
        let r = call(
            &c,
            "/sluice.test.Kitchen/Headers",
            &[("traceparent", parent.as_str())],
            &[frame(&Empty {})],
        )
        .await;
        r.assert_ok();
        let md = r.decode::<HeadersReply>().pop().unwrap().metadata;
        let tp = md.get("traceparent").expect("traceparent metadata");
        assert!(tp.starts_with(&format!("00-{client}-")), "{md:?}");
        assert!(
            tp.ends_with("-01") && !tp.contains("00f067aa0ba902b7"),
            "{tp}"
        );
        assert_eq!(
            md.get("x-b3-sampled").map(String::as_str),
            Some("1"),
            "{md:?}"
        );
        let b3_trace = md.get("x-b3-traceid").expect("x-b3-traceid metadata");
        assert_eq!(b3_trace.len(), 32, "{md:?}");
        assert!(
            md.get("x-b3-spanid").is_some_and(|s| s.len() == 16),
            "{md:?}"
        );
        assert!(
            md.get("x-b3-parentspanid").is_some_and(|s| s.len() == 16),
            "{md:?}"
        );
    });
}

#[test]
fn grpc_real_deadline_exceeded_cancels_the_upstream_call() {
    let Some(p) = peers() else { return };
    let py = p.py;
    let g = gw(py);
    let addr = g.addr;
    let key = format!("deadline-{}", std::process::id());
    rt().block_on(async move {
        let c = connect(addr).await;
        let r = call(
            &c,
            "/sluice.test.Kitchen/Slow",
            &[("grpc-timeout", "200m"), ("x-stats-key", &key)],
            &[frame(&SlowRequest { millis: 2000 })],
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.grpc("grpc-status"),
            Some("4"),
            "DEADLINE_EXCEEDED; grpc-message {:?}",
            r.grpc("grpc-message")
        );
        let s = stats_until(py, &key, |s| s.completed + s.cancelled > 0).await;
        assert_eq!(
            (s.calls, s.cancelled, s.completed),
            (1, 1, 0),
            "the server saw the deadline"
        );
    });
}

/// Starts Slow(5000) through `via`, resets the stream once the server has the call, and returns the server's
/// counters for it once it ended (completed or cancelled); then checks the connection still serves a call.
fn reset_mid_call(via: SocketAddr, py: SocketAddr, key: &str) -> StatsReply {
    rt().block_on(async move {
        let c = connect(via).await;
        let mut s = c.clone().ready().await.unwrap();
        let (resp, mut tx) = s
            .send_request(
                request("/sluice.test.Kitchen/Slow", &[("x-stats-key", key)]),
                false,
            )
            .unwrap();
        tx.send_data(frame(&SlowRequest { millis: 5000 }), true)
            .unwrap();
        let started = stats_until(py, key, |s| s.calls > 0).await;
        assert_eq!(started.calls, 1, "the call reached the server");
        tx.send_reset(h2::Reason::CANCEL);
        drop(resp);
        let st = stats_until(py, key, |s| s.completed + s.cancelled > 0).await;
        let r = call(
            &c,
            "/helloworld.Greeter/SayHello",
            &[],
            &[frame(&HelloRequest {
                name: "after".into(),
            })],
        )
        .await;
        r.assert_ok();
        st
    })
}

/// The control for the next test: the same reset sent straight to the server cancels its call.
#[test]
fn grpc_real_client_reset_direct_cancels_the_call() {
    let Some(p) = peers() else { return };
    let key = format!("reset-direct-{}", std::process::id());
    let st = reset_mid_call(p.py, p.py, &key);
    assert_eq!((st.calls, st.cancelled, st.completed), (1, 1, 0));
}

#[test]
fn grpc_real_client_reset_cancels_the_upstream_call() {
    let Some(p) = peers() else { return };
    let key = format!("reset-{}", std::process::id());
    let g = gw(p.py);
    let st = reset_mid_call(g.addr, p.py, &key);
    assert_eq!(
        (st.calls, st.cancelled, st.completed),
        (1, 1, 0),
        "the client's RST_STREAM(CANCEL) must cancel the upstream call"
    );
}

/// The harness itself: a private peer set serves, and its servers are gone once it is dropped (the shared set
/// ends the same way, by its stdin pipes closing when the test binary exits).
#[test]
fn grpc_peers_private_set_is_gone_after_drop() {
    let Some(p) = grpc_peers::start() else { return };
    let addrs = [p.py, p.go_greeter, p.route_guide];
    for a in addrs {
        assert!(
            std::net::TcpStream::connect(a).is_ok(),
            "{a} serves while the set lives"
        );
    }
    drop(p);
    for a in addrs {
        assert!(
            std::net::TcpStream::connect(a).is_err(),
            "{a} still accepts after drop"
        );
    }
}
