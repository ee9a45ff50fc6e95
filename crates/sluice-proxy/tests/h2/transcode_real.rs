//! grpc-transcode and grpc-web through the real proxy against real gRPC servers (common/grpc_peers.rs: grpc-go's
//! example greeter and the Python Kitchen peer), the protos uploaded as proto resources exactly as a user would:
//! JSON in, JSON out, every protobuf kind, errors with details, deadlines, 1 MiB, server streaming, google.api.http
//! bindings with imports across proto resources; grpc-web in binary and text mode.

use std::net::SocketAddr;

use base64::Engine as _;
use serde_json::{json, Value};
use sluice_proxy::ProxyConfig;

use super::grpc_real::{peers, stats_until};
use super::transcode::{header, http1, json_body};
use super::{rt, Gw};

fn kitchen_proto() -> String {
    let dir = super::grpc_real::grpc_peers::proto_dir();
    std::fs::read_to_string(dir.join("kitchen.proto")).expect("kitchen.proto")
}

fn greeter_proto() -> String {
    let dir = super::grpc_real::grpc_peers::proto_dir();
    std::fs::read_to_string(dir.join("helloworld.proto")).expect("helloworld.proto")
}

/// A route `uri` -> `upstream` over gRPC with grpc-transcode `conf`.
fn route(id: &str, uri: &str, upstream: SocketAddr, conf: Value) -> Value {
    json!({"id": id, "uri": uri, "plugins": {"grpc-transcode": conf},
           "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {upstream.to_string(): 1}}})
}

fn post(path: &str, body: &str, extra: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    )
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
}

#[test]
fn transcode_real_greeter_go_and_python() {
    let Some(p) = peers() else { return };
    let conf = json!({"proto_id": "hw", "service": "helloworld.Greeter", "method": "SayHello"});
    let gw = Gw::start(
        json!({"protos": [{"id": "hw", "content": greeter_proto()}],
               "routes": [route("go", "/go", p.go_greeter, conf.clone()), route("py", "/py", p.py, conf)]}),
        ProxyConfig::default(),
    );
    for (path, who) in [("/go?name=go", "go"), ("/py?name=py", "py")] {
        let (status, hs, body, _) = http1(gw.addr, &get(path));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert_eq!(header(&hs, "content-type"), Some("application/json"));
        assert_eq!(json_body(&body), json!({"message": format!("Hello {who}")}));
    }
}

#[test]
fn transcode_real_every_kind_round_trips_exactly() {
    let Some(p) = peers() else { return };
    let gw = Gw::start(
        json!({"protos": [{"id": "k", "name": "kitchen.proto", "content": kitchen_proto()}],
               "routes": [route("echo", "/echo", p.py,
                                json!({"proto_id": "k", "service": "sluice.test.Kitchen", "method": "Echo"}))]}),
        ProxyConfig::default(),
    );
    // 64-bit extremes that a double cannot hold, escapes, negative enums, nested and repeated messages, maps with
    // integer keys, a oneof, and the well-known types in their proto3 JSON forms.
    let input = json!({
        "f_double": 1.5, "f_float": 0.25, "f_int32": -7, "f_int64": 9007199254740993_i64,
        "f_uint32": 4294967295_u32, "f_uint64": 18446744073709551615_u64, "f_sint32": -2147483648_i32,
        "f_sint64": -9223372036854775808_i64, "f_fixed32": 7, "f_fixed64": 8, "f_sfixed32": -9, "f_sfixed64": -10,
        "f_bool": true, "f_string": "h\u{e9}llo \"q\" \u{1F600}", "f_bytes": "AAEC/w==", "f_enum": "KIND_NEGATIVE",
        "f_nested": {"name": "n", "value": 3, "tags": ["a", "b"]},
        "r_int32": [1, 2, 3], "r_string": ["x"], "r_double": [0.5], "r_enum": ["KIND_ONE", "KIND_TWO"],
        "r_nested": [{"name": "r", "value": 0, "tags": []}],
        "m_string_int32": {"a": 1}, "m_int64_nested": {"5": {"name": "five", "value": 0, "tags": []}},
        "choice_nested": {"name": "c", "value": 0, "tags": []},
        "w_timestamp": "2026-11-24T12:00:00Z", "w_duration": "1.500s",
        "w_struct": {"k": [1.0, "two", null, true]}, "w_value": 3.5, "w_list_value": [1.0, "a"],
        "w_int64": 42, "w_string": "s", "w_bool": false, "w_field_mask": "fMask,other", "w_empty": {}
    });
    let (status, _, body, _) = http1(gw.addr, &post("/echo", &input.to_string(), ""));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json_body(&body), input);
    // Nothing set: proto3 fields without presence are written with their zero values, empty repeated as [] and
    // empty maps as {} (APISIX wrote `{}` for empty arrays until 2026); unset messages are left out.
    let (status, _, body, _) = http1(gw.addr, &post("/echo", "{}", ""));
    assert_eq!(status, 200);
    let out = json_body(&body);
    assert_eq!(out["r_nested"], json!([]));
    assert_eq!(out["m_string_int32"], json!({}));
    assert_eq!(out["f_int64"], json!(0));
    assert_eq!(out["f_enum"], json!("KIND_UNSPECIFIED"));
    assert!(
        out.get("f_nested").is_none() && out.get("w_timestamp").is_none(),
        "{out}"
    );
}

#[test]
fn transcode_real_errors_map_to_http_with_details_in_the_body() {
    let Some(p) = peers() else { return };
    let fail = |show: bool| {
        json!({"proto_id": "k", "service": "sluice.test.Kitchen", "method": "Fail",
               "show_status_in_body": show, "status_detail_type": "google.rpc.ErrorInfo"})
    };
    // The detail type must be in the route's proto, as in APISIX; Sluice's bundled google/rpc protos make that an
    // import.
    let proto = kitchen_proto().replacen(
        "import \"google/protobuf/duration.proto\";",
        "import \"google/protobuf/duration.proto\";\nimport \"google/rpc/error_details.proto\";",
        1,
    );
    let gw = Gw::start(
        json!({"protos": [{"id": "k", "name": "kitchen.proto", "content": proto}],
               "routes": [route("f", "/fail", p.py, fail(true)), route("f2", "/fail-plain", p.py, fail(false))]}),
        ProxyConfig::default(),
    );
    // NOT_FOUND with a google.rpc.Status: 404, the status decoded into the body.
    let (status, _, body, _) = http1(
        gw.addr,
        &post(
            "/fail",
            r#"{"code": 5, "message": "no such dish", "with_details": true}"#,
            "",
        ),
    );
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    let err = &json_body(&body)["error"];
    assert_eq!(err["code"], json!(5));
    assert_eq!(err["message"], json!("no such dish"));
    assert_eq!(err["details"][0]["reason"], json!("KITCHEN_FAIL"), "{err}");
    assert_eq!(err["details"][0]["domain"], json!("sluice.test"));
    // Each code of APISIX's table, without details.
    for (code, http) in [
        (1, 499),
        (3, 400),
        (4, 504),
        (7, 403),
        (8, 429),
        (12, 501),
        (14, 503),
        (16, 401),
    ] {
        let (status, _, _, _) = http1(
            gw.addr,
            &post(
                "/fail-plain",
                &format!(r#"{{"code": {code}, "message": "m"}}"#),
                "",
            ),
        );
        assert_eq!(status, http, "grpc-status {code}");
    }
}

#[test]
fn transcode_real_deadline_is_sent_and_expiry_cancels_the_call() {
    let Some(p) = peers() else { return };
    let gw = Gw::start(
        json!({"protos": [{"id": "k", "name": "kitchen.proto", "content": kitchen_proto()}],
               "routes": [route("slow", "/slow", p.py,
                                json!({"proto_id": "k", "service": "sluice.test.Kitchen", "method": "Slow",
                                       "deadline": 300}))]}),
        ProxyConfig::default(),
    );
    let key = format!("transcode-deadline-{}", std::process::id());
    let (status, _, body, _) = http1(
        gw.addr,
        &post(
            "/slow",
            r#"{"millis": 5000}"#,
            &format!("x-stats-key: {key}\r\n"),
        ),
    );
    // DEADLINE_EXCEEDED -> 504, well before the 5 s the call asked for.
    assert_eq!(status, 504, "{}", String::from_utf8_lossy(&body));
    let st = rt().block_on(stats_until(p.py, &key, |s| s.cancelled + s.completed >= 1));
    assert_eq!((st.calls, st.cancelled, st.completed), (1, 1, 0));
}

#[test]
fn transcode_real_one_mib_response_and_server_stream_as_ndjson() {
    let Some(p) = peers() else { return };
    let kitchen = |method: &str, extra: Value| {
        let mut c = json!({"proto_id": "k", "service": "sluice.test.Kitchen", "method": method});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    let gw = Gw::start(
        json!({"protos": [{"id": "k", "name": "kitchen.proto", "content": kitchen_proto()}],
               "routes": [route("big", "/big", p.py, kitchen("Big", json!({}))),
                          route("count", "/count", p.py, kitchen("Count", json!({"stream_format": "ndjson"})))]}),
        ProxyConfig::default(),
    );
    let (status, _, body, _) = http1(gw.addr, &get("/big?size=1048576"));
    assert_eq!(status, 200);
    let data = json_body(&body)["data"].as_str().unwrap().to_owned();
    let data = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert!(data.iter().enumerate().all(|(i, b)| *b as usize == i % 251));

    let (status, hs, body, _) = http1(gw.addr, &get("/count?n=3&interval_ms=50"));
    assert_eq!(status, 200);
    assert_eq!(header(&hs, "content-type"), Some("application/x-ndjson"));
    assert_eq!(
        String::from_utf8_lossy(&body),
        "{\"i\":0}\n{\"i\":1}\n{\"i\":2}\n"
    );
}

/// One route serves a whole service through its google.api.http bindings; the service's proto imports its
/// messages from another proto resource by name, and google/api/annotations.proto from the bundled set.
#[test]
fn transcode_real_http_annotations_with_imports_across_proto_resources() {
    let Some(p) = peers() else { return };
    let kitchen = kitchen_proto();
    let messages = {
        let start = kitchen.find("service Kitchen").unwrap();
        let end = start + kitchen[start..].find("\n}\n").unwrap() + 3;
        format!("{}{}", &kitchen[..start], &kitchen[end..])
    };
    let service = r#"syntax = "proto3";
package sluice.test;
import "google/api/annotations.proto";
import "sluice/test/messages.proto";
service Kitchen {
  rpc Big(BigRequest) returns (BigReply) { option (google.api.http) = { get: "/v1/big/{size}" }; }
  rpc Echo(AllKinds) returns (AllKinds) {
    option (google.api.http) = { post: "/v1/echo" body: "*" additional_bindings { put: "/v1/echo/{f_string}" body: "f_nested" } };
  }
  rpc Count(CountRequest) returns (stream CountReply) { option (google.api.http) = { get: "/v1/count/{n}" }; }
}
"#;
    let gw = Gw::start(
        json!({"protos": [{"id": "m", "name": "sluice/test/messages.proto", "content": messages},
                          {"id": "s", "name": "kitchen_http.proto", "content": service}],
               "routes": [route("v1", "/v1/*", p.py, json!({"proto_id": "s", "use_http_annotations": true}))]}),
        ProxyConfig::default(),
    );
    let (status, _, body, _) = http1(gw.addr, &get("/v1/big/3"));
    assert_eq!((status, json_body(&body)), (200, json!({"data": "AAEC"})));
    let (status, _, body, _) = http1(gw.addr, &get("/v1/count/2?interval_ms=1"));
    assert_eq!(
        (status, json_body(&body)),
        (200, json!([{"i": 0}, {"i": 1}]))
    );
    let (status, _, body, _) = http1(
        gw.addr,
        &post("/v1/echo", r#"{"f_string": "b", "f_int32": 4}"#, ""),
    );
    assert_eq!(status, 200);
    assert_eq!(
        (
            json_body(&body)["f_string"].clone(),
            json_body(&body)["f_int32"].clone()
        ),
        (json!("b"), json!(4))
    );
    let put = format!(
        "PUT /v1/echo/path%20value HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 13\r\nConnection: close\r\n\r\n{}",
        r#"{"name":"nn"}"#
    );
    let (status, _, body, _) = http1(gw.addr, &put);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let out = json_body(&body);
    assert_eq!(
        (out["f_string"].clone(), out["f_nested"]["name"].clone()),
        (json!("path value"), json!("nn"))
    );
    let (status, _, _, _) = http1(gw.addr, &get("/v1/nothing/here"));
    assert_eq!(status, 404);
}

/// A gRPC-Web body: each message framed, then the trailer frame.
fn decode_web(body: &[u8]) -> (Vec<Vec<u8>>, String) {
    let (mut messages, mut trailers) = (Vec::new(), String::new());
    let mut b = body;
    while b.len() >= 5 {
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        let payload = &b[5..5 + len];
        if b[0] & 0x80 != 0 {
            trailers.push_str(&String::from_utf8_lossy(payload));
        } else {
            messages.push(payload.to_vec());
        }
        b = &b[5 + len..];
    }
    assert!(b.is_empty(), "trailing bytes {b:?}");
    (messages, trailers)
}

fn hello_frame(name: &str) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 0, (name.len() + 2) as u8, 0x0a, name.len() as u8];
    f.extend_from_slice(name.as_bytes());
    f
}

fn web_request(path: &str, ct: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\nX-Grpc-Web: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[test]
fn grpc_web_real_binary_and_text_unary_and_streaming() {
    let Some(p) = peers() else { return };
    let gw = Gw::start(
        json!({"routes": [{"id": "web", "uri": "/grpc/web/*", "plugins": {"grpc-web": {}},
               "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {p.py.to_string(): 1}}}]}),
        ProxyConfig::default(),
    );
    let send = |req: Vec<u8>| http1(gw.addr, std::str::from_utf8(&req).unwrap());
    // Binary.
    let (status, hs, body, _) = send(web_request(
        "/grpc/web/helloworld.Greeter/SayHello",
        "application/grpc-web+proto",
        &hello_frame("web"),
    ));
    assert_eq!(status, 200);
    assert_eq!(
        header(&hs, "content-type"),
        Some("application/grpc-web+proto")
    );
    assert_eq!(header(&hs, "access-control-allow-origin"), Some("*"));
    let (messages, trailers) = decode_web(&body);
    assert_eq!(messages, vec![b"\x0a\x09Hello web".to_vec()]);
    assert!(trailers.contains("grpc-status:0\r\n"), "{trailers:?}");
    // Text: base64 both ways; the answer is base64 segments, each padded.
    let b64 = base64::engine::general_purpose::STANDARD;
    let (status, hs, body, _) = send(web_request(
        "/grpc/web/helloworld.Greeter/SayHelloStreamReply",
        "application/grpc-web-text",
        b64.encode(hello_frame("txt")).as_bytes(),
    ));
    assert_eq!(status, 200);
    assert_eq!(
        header(&hs, "content-type"),
        Some("application/grpc-web-text")
    );
    let text = String::from_utf8(body).unwrap();
    let mut raw = Vec::new();
    let mut rest = text.as_str();
    while !rest.is_empty() {
        // Each segment ends at its padding or at a multiple of 4 before the next segment starts.
        let end = rest.find('=').map_or(rest.len(), |i| {
            let pad_end = i + rest[i..].chars().take_while(|c| *c == '=').count();
            pad_end
        });
        raw.extend(b64.decode(&rest[..end]).expect("base64 segment"));
        rest = &rest[end..];
    }
    let (messages, trailers) = decode_web(&raw);
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[2], b"\x0a\x0cHello txt #2".to_vec());
    assert!(trailers.contains("grpc-status:0"), "{trailers:?}");
}

#[test]
fn grpc_web_real_preflight_errors_and_refusals() {
    let Some(p) = peers() else { return };
    let gw = Gw::start(
        json!({"routes": [{"id": "web", "uri": "/grpc/web/*", "plugins": {"grpc-web": {}},
               "upstream": {"scheme": "grpc", "type": "roundrobin", "nodes": {p.py.to_string(): 1}}}]}),
        ProxyConfig::default(),
    );
    let (status, hs, _, _) = http1(
        gw.addr,
        "OPTIONS /grpc/web/helloworld.Greeter/SayHello HTTP/1.1\r\nHost: x\r\nOrigin: http://app\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 204);
    assert_eq!(
        header(&hs, "access-control-allow-methods"),
        Some("POST, OPTIONS")
    );
    assert!(header(&hs, "access-control-allow-headers").is_some_and(|h| h.contains("x-grpc-web")));
    // A gRPC error comes back in the head (trailers-only), as gRPC-Web clients read it.
    let mut fail = vec![0, 0, 0, 0, 0];
    let msg = [0x08, 0x05, 0x12, 0x04, b'g', b'o', b'n', b'e'];
    fail[4] = msg.len() as u8;
    fail.extend_from_slice(&msg);
    let req = web_request(
        "/grpc/web/sluice.test.Kitchen/Fail",
        "application/grpc-web",
        &fail,
    );
    let (status, hs, body, _) = http1(gw.addr, std::str::from_utf8(&req).unwrap());
    assert_eq!(status, 200);
    assert_eq!(header(&hs, "grpc-status"), Some("5"));
    assert_eq!(header(&hs, "grpc-message"), Some("gone"));
    assert!(body.is_empty(), "{body:?}");
    // Not gRPC-Web: refused before anything reaches the upstream.
    let (status, _, _, _) = http1(gw.addr, "GET /grpc/web/helloworld.Greeter/SayHello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 400);
    let req = web_request(
        "/grpc/web/helloworld.Greeter/SayHello",
        "application/json",
        b"{}",
    );
    let (status, _, _, _) = http1(gw.addr, std::str::from_utf8(&req).unwrap());
    assert_eq!(status, 400);
    let req = web_request(
        "/grpc/web/helloworld.Greeter/SayHello",
        "application/grpc-web-text",
        b"%%%notbase64",
    );
    let (status, _, _, _) = http1(gw.addr, std::str::from_utf8(&req).unwrap());
    assert_eq!(status, 400);
}

/// An HTTP/1.1 client that gives up while the gRPC call is in flight cancels it upstream (nginx's behaviour with
/// `proxy_ignore_client_abort off`), for transcoded and passed-through calls alike.
#[test]
fn transcode_real_client_going_away_cancels_the_upstream_call() {
    use std::io::Write;
    let Some(p) = peers() else { return };
    let gw = Gw::start(
        json!({"protos": [{"id": "k", "name": "kitchen.proto", "content": kitchen_proto()}],
               "routes": [route("slow", "/slow", p.py,
                                json!({"proto_id": "k", "service": "sluice.test.Kitchen", "method": "Slow"}))]}),
        ProxyConfig::default(),
    );
    let key = format!("transcode-gone-{}", std::process::id());
    let mut c = std::net::TcpStream::connect(gw.addr).unwrap();
    c.write_all(
        post(
            "/slow",
            r#"{"millis": 5000}"#,
            &format!("x-stats-key: {key}\r\n"),
        )
        .as_bytes(),
    )
    .unwrap();
    // Wait until the call reached the server, then leave.
    let st = rt().block_on(stats_until(p.py, &key, |s| s.calls >= 1));
    assert_eq!(st.calls, 1);
    drop(c);
    let st = rt().block_on(stats_until(p.py, &key, |s| s.cancelled + s.completed >= 1));
    assert_eq!((st.calls, st.cancelled, st.completed), (1, 1, 0));
}

/// A client-streaming method takes a JSON array as its stream.
#[test]
fn transcode_real_client_stream_from_a_json_array() {
    let Some(p) = peers() else { return };
    let gw = Gw::start(
        json!({"protos": [{"id": "k", "name": "kitchen.proto", "content": kitchen_proto()}],
               "routes": [route("sum", "/sum", p.py,
                                json!({"proto_id": "k", "service": "sluice.test.Kitchen", "method": "Sum"}))]}),
        ProxyConfig::default(),
    );
    let (status, _, body, _) = http1(
        gw.addr,
        &post(
            "/sum",
            r#"[{"v": 1}, {"v": 2}, {"v": 9007199254740993}]"#,
            "",
        ),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        json_body(&body),
        json!({"total": 9007199254740996_i64, "items": 3})
    );
    // One object is a stream of one; a bad element is a 400 with nothing sent.
    let (status, _, body, _) = http1(gw.addr, &post("/sum", r#"{"v": 5}"#, ""));
    assert_eq!(
        (status, json_body(&body)),
        (200, json!({"total": 5, "items": 1}))
    );
    let (status, _, _, _) = http1(gw.addr, &post("/sum", r#"[{"v": 1}, {"v": "x"}]"#, ""));
    assert_eq!(status, 400);
}
