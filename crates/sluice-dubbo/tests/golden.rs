//! Golden frames: real traffic between a Java Dubbo 3.3.5 consumer and the Java / dubbo-go providers
//! (tests/golden/). Every frame decodes, the request we build for the same call is byte-identical to the Java
//! consumer's (modulo the request id), and both answers become status 200 with `header1: value1`.

use sluice_dubbo::hessian::Value;
use sluice_dubbo::invoke::{self, Service};
use sluice_dubbo::protocol::{
    self, FrameDecoder, Message, Outcome, Request, Status, DEFAULT_MAX_PAYLOAD,
};

/// Parses an `xxd` dump.
fn unhex(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::new();
    for line in text.lines() {
        let hex = &line[10..line.len().min(49)];
        for group in hex.split_whitespace() {
            for i in (0..group.len()).step_by(2) {
                out.push(u8::from_str_radix(&group[i..i + 2], 16).unwrap());
            }
        }
    }
    out
}

fn one_frame(bytes: &[u8]) -> protocol::Frame {
    let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    d.push(bytes);
    let f = d.next_frame().unwrap().expect("a complete frame");
    assert_eq!(d.buffered(), 0, "exactly one frame");
    f
}

/// The call the Java consumer made, built the way the gateway builds calls.
fn consumer_call() -> Request {
    let mut svc = Service::new("org.apache.dubbo.backend.DemoService", "1.0.0");
    svc.application = Some("gw-dubbo-consumer".into());
    svc.timeout_ms = Some(5000);
    let mut req = invoke::dubbo_proxy_request(
        &svc,
        "hello",
        [("X-Test", &b"hello-from-consumer"[..])],
        b"ping",
    );
    // Java's HashMap iterated "x-test" before "body"; the encoding is otherwise deterministic.
    if let Value::Map { entries, .. } = &mut req.args[0] {
        entries.reverse();
    }
    req
}

#[test]
fn java_consumer_requests_decode() {
    for name in [
        "javaconsumer-to-javaprovider.c2s.hex",
        "javaconsumer-to-dubbogo.c2s.hex",
    ] {
        let bytes = unhex(name);
        let frame = one_frame(&bytes);
        assert_eq!(frame.header.flags, 0xc2, "{name}");
        let Message::Request {
            two_way, request, ..
        } = protocol::decode(&frame).unwrap()
        else {
            panic!("{name}: not a request")
        };
        assert!(two_way);
        assert_eq!(request.dubbo_version, "2.0.2");
        assert_eq!(request.service, "org.apache.dubbo.backend.DemoService");
        assert_eq!(request.version, "1.0.0");
        assert_eq!(request.method, "hello");
        assert_eq!(request.param_types, "Ljava/util/Map;");
        let arg = &request.args[0];
        assert_eq!(
            arg.get("x-test").and_then(Value::as_str),
            Some("hello-from-consumer")
        );
        assert_eq!(arg.get("body"), Some(&Value::Binary(b"ping".to_vec())));
        assert_eq!(
            request.attachment("timeout").and_then(Value::as_str),
            Some("5000")
        );
        assert_eq!(
            request
                .attachment("remote.application")
                .and_then(Value::as_str),
            Some("gw-dubbo-consumer")
        );
        assert_eq!(request, consumer_call(), "{name}");
    }
}

#[test]
fn our_request_is_byte_identical_to_the_java_consumers() {
    for name in [
        "javaconsumer-to-javaprovider.c2s.hex",
        "javaconsumer-to-dubbogo.c2s.hex",
    ] {
        let golden = unhex(name);
        let id = u64::from_be_bytes(golden[4..12].try_into().unwrap());
        let mut ours = Vec::new();
        protocol::encode_request(&consumer_call(), id, DEFAULT_MAX_PAYLOAD, &mut ours).unwrap();
        assert_eq!(ours, golden, "{name}");
    }
}

fn check_answer(name: &str, body_start: &str) {
    let bytes = unhex(name);
    let frame = one_frame(&bytes);
    assert_eq!(frame.header.flags, 0x02, "{name}");
    assert_eq!(frame.header.status, Status::OK);
    let Message::Response {
        status,
        result,
        attachments,
        ..
    } = protocol::decode(&frame).unwrap()
    else {
        panic!("{name}: not a response")
    };
    assert!(
        matches!(result, Ok(Outcome::Value(_))),
        "{name}: {result:?}"
    );
    assert!(
        !attachments.is_empty(),
        "{name}: RESPONSE_VALUE_WITH_ATTACHMENTS carries attachments"
    );
    let reply = invoke::dubbo_proxy_response(result, status).unwrap();
    assert_eq!(reply.status, 200, "{name}");
    assert_eq!(
        reply.headers,
        vec![("header1".to_owned(), "value1".to_owned())],
        "{name}"
    );
    let body = String::from_utf8(reply.body).unwrap();
    assert!(body.starts_with(body_start), "{name}: {body:?}");
    assert!(
        body.contains("x-test: hello-from-consumer\n"),
        "{name}: {body:?}"
    );
    assert!(body.contains("body: ping\n"), "{name}: {body:?}");
}

#[test]
fn java_provider_answer_becomes_http() {
    check_answer("javaconsumer-to-javaprovider.s2c.hex", "dubbo success\n");
    let frame = one_frame(&unhex("javaconsumer-to-javaprovider.s2c.hex"));
    let Message::Response { attachments, .. } = protocol::decode(&frame).unwrap() else {
        panic!()
    };
    assert_eq!(
        attachments,
        vec![("dubbo".to_owned(), Value::string("2.0.2"))]
    );
}

#[test]
fn dubbo_go_answer_becomes_http() {
    // dubbo-go echoes the request attachments back and adds its own; it also writes one trailing null after
    // them, which Java's decoder ignores and so do we.
    check_answer("javaconsumer-to-dubbogo.s2c.hex", "dubbo-go success\n");
    let bytes = unhex("javaconsumer-to-dubbogo.s2c.hex");
    assert_eq!(*bytes.last().unwrap(), b'N');
    let Message::Response { attachments, .. } = protocol::decode(&one_frame(&bytes)).unwrap()
    else {
        panic!()
    };
    let get = |k: &str| {
        attachments
            .iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.as_str())
    };
    assert_eq!(get("dubbo"), Some("2.0.2"));
    assert_eq!(get("local-addr"), Some("127.0.0.1:20881"));
}

/// What dubbo-proxy's connections decode: the same answers with their attachments left alone, even when those are
/// garbage (the value before them is intact).
#[test]
fn answers_decode_without_their_attachments() {
    for name in [
        "javaconsumer-to-dubbogo.s2c.hex",
        "javaconsumer-to-javaprovider.s2c.hex",
    ] {
        let frame = one_frame(&unhex(name));
        let Message::Response {
            id: full_id,
            status: full_status,
            result: full,
            attachments,
        } = protocol::decode(&frame).unwrap()
        else {
            panic!("{name}")
        };
        assert!(!attachments.is_empty(), "{name}");
        let Message::Response {
            id,
            status,
            result,
            attachments,
        } = protocol::decode_without_response_attachments(&frame).unwrap()
        else {
            panic!("{name}")
        };
        assert_eq!((id, status), (full_id, full_status), "{name}");
        assert_eq!(result, full, "{name}");
        assert!(attachments.is_empty(), "{name}");
        // The attachments cut off in the middle: `decode` refuses the frame, the value still comes out without them.
        let mut cut = frame.clone();
        let keep = cut.body.len() - 3;
        cut.body.truncate(keep);
        cut.header.body_len = keep as u32;
        assert!(protocol::decode(&cut).is_err(), "{name}");
        let Message::Response { result, .. } =
            protocol::decode_without_response_attachments(&cut).unwrap()
        else {
            panic!("{name}")
        };
        assert_eq!(result, full, "{name}");
    }
    // Requests and events decode as with `decode` (their attachments are kept).
    let req = one_frame(&unhex("javaconsumer-to-dubbogo.c2s.hex"));
    assert_eq!(
        protocol::decode_without_response_attachments(&req).unwrap(),
        protocol::decode(&req).unwrap()
    );
}

#[test]
fn frames_split_anywhere_reassemble() {
    let mut stream = Vec::new();
    for name in [
        "javaconsumer-to-javaprovider.c2s.hex",
        "javaconsumer-to-javaprovider.s2c.hex",
        "javaconsumer-to-dubbogo.s2c.hex",
    ] {
        stream.extend(unhex(name));
    }
    for split in 1..=40 {
        let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
        let mut got = Vec::new();
        for chunk in stream.chunks(split) {
            d.push(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(protocol::decode(&f).unwrap());
            }
        }
        assert_eq!(got.len(), 3, "split {split}");
        assert_eq!(d.buffered(), 0);
        assert!(matches!(got[0], Message::Request { .. }));
        assert!(matches!(got[2], Message::Response { .. }));
    }
}
