//! Java types and JSON mapping, frames, and the three call shapes.

use serde_json::json;
use sluice_dubbo::hessian::{ClassDef, Value};
use sluice_dubbo::invoke::{self, CallError, Service, GENERIC_DESCRIPTOR};
use sluice_dubbo::java::{self, from_json, parse_descriptors, to_json, JavaType, Pojo, Primitive};
use sluice_dubbo::protocol::{
    self, FrameDecoder, Message, Outcome, ProtocolError, Status, DEFAULT_MAX_PAYLOAD, HEADER_LEN,
};
use std::sync::Arc;

fn t(name: &str) -> JavaType {
    JavaType::parse(name).unwrap()
}

#[test]
fn java_type_names_descriptors_and_aliases() {
    assert_eq!(t("int"), JavaType::Primitive(Primitive::Int));
    assert_eq!(t("java.lang.Integer"), JavaType::Boxed(Primitive::Int));
    assert_eq!(t("string"), JavaType::String);
    assert_eq!(t("java.lang.String[]").java_name(), "[Ljava.lang.String;");
    assert_eq!(t("[Ljava.lang.String;"), t("java.lang.String[]"));
    assert_eq!(t("int[][]").descriptor(), "[[I");
    assert_eq!(t("com.x.User").descriptor(), "Lcom/x/User;");
    assert_eq!(t("Ljava/util/Map;"), JavaType::Map("java.util.Map".into()));
    let desc = "Ljava/lang/String;[I[[Ljava/lang/Long;JZLcom/x/User;";
    let types = parse_descriptors(desc).unwrap();
    assert_eq!(types.len(), 6);
    assert_eq!(java::descriptors(&types), desc);
    for bad in ["Ljava/lang/String", "[", "Q", "L;"] {
        assert!(parse_descriptors(bad).is_err(), "{bad}");
    }
    for bad in ["", "java lang", "a;b"] {
        assert!(JavaType::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn json_to_hessian_follows_the_declared_type() {
    let typed = |j, ty: &str| from_json(&j, &t(ty), Pojo::Typed);
    assert_eq!(typed(json!(10), "int").unwrap(), Value::Int(10));
    assert_eq!(
        typed(json!("10"), "long").unwrap(),
        Value::Long(10),
        "ShenYu #2487: a string for a long"
    );
    assert_eq!(typed(json!(10), "java.lang.Long").unwrap(), Value::Long(10));
    assert_eq!(typed(json!(1.0), "int").unwrap(), Value::Int(1));
    assert!(typed(json!(1.5), "int").is_err());
    assert!(typed(json!(3_000_000_000u64), "int").is_err());
    assert!(typed(json!(200), "byte").is_err());
    assert_eq!(
        typed(json!(null), "java.lang.Integer").unwrap(),
        Value::Null
    );
    let e = typed(json!(null), "int").unwrap_err();
    assert_eq!(e.0, "expected int, got null");
    assert_eq!(typed(json!("true"), "boolean").unwrap(), Value::Bool(true));
    assert_eq!(typed(json!(2.5), "double").unwrap(), Value::Double(2.5));
    assert_eq!(
        typed(json!(7), "java.lang.String").unwrap(),
        Value::string("7")
    );
    assert!(typed(json!({}), "java.lang.String").is_err());
    assert_eq!(typed(json!("x"), "char").unwrap(), Value::string("x"));
    assert!(typed(json!("xy"), "char").is_err());
    assert_eq!(
        typed(json!(894621060000i64), "java.util.Date").unwrap(),
        Value::Date(894621060000)
    );
    assert_eq!(
        typed(json!("12.50"), "java.math.BigDecimal").unwrap(),
        Value::object("java.math.BigDecimal", [("value", Value::string("12.50"))])
    );
    assert!(typed(json!("NaN"), "java.math.BigDecimal").is_err());
    assert!(typed(json!("1.5"), "java.math.BigInteger").is_err());
    assert_eq!(
        typed(json!([1, 2]), "int[]").unwrap(),
        Value::List {
            typ: Some("[int".into()),
            items: vec![Value::Int(1), Value::Int(2)]
        }
    );
    assert_eq!(
        typed(json!(["a"]), "java.lang.String[]").unwrap(),
        Value::List {
            typ: Some("[string".into()),
            items: vec![Value::string("a")]
        }
    );
    let e = typed(json!([1, "x"]), "long[]").unwrap_err();
    assert_eq!(e.0, "expected long at [1], got \"x\"");
    assert_eq!(
        typed(json!("cGluZw=="), "byte[]").unwrap(),
        Value::Binary(b"ping".to_vec())
    );
    assert_eq!(
        typed(json!([112, 105]), "byte[]").unwrap(),
        Value::Binary(b"pi".to_vec())
    );
    assert_eq!(
        typed(json!({"a": 1}), "java.util.Map").unwrap(),
        Value::string_map([("a", Value::Int(1))])
    );
    assert_eq!(
        typed(json!([1]), "java.util.Set").unwrap(),
        Value::List {
            typ: Some("java.util.HashSet".into()),
            items: vec![Value::Int(1)]
        }
    );
    assert_eq!(
        typed(json!([1, 5_000_000_000i64, 1.5, null]), "java.util.List").unwrap(),
        Value::list([
            Value::Int(1),
            Value::Long(5_000_000_000),
            Value::Double(1.5),
            Value::Null
        ])
    );
    // A POJO: typed map for a direct call (a "class" key names a subclass), untyped for a generic call.
    let user = json!({"name": "tc", "age": 3});
    assert_eq!(
        typed(user.clone(), "com.x.User").unwrap(),
        Value::Map {
            typ: Some("com.x.User".into()),
            entries: vec![
                (Value::string("age"), Value::Int(3)),
                (Value::string("name"), Value::string("tc"))
            ]
        }
    );
    assert_eq!(
        typed(json!({"class": "com.x.Admin", "a": 1}), "com.x.User")
            .unwrap()
            .class_name(),
        Some("com.x.Admin")
    );
    assert_eq!(
        from_json(&user, &t("com.x.User"), Pojo::Untyped)
            .unwrap()
            .class_name(),
        None
    );
    assert!(typed(json!(1), "com.x.User").is_err());
}

#[test]
fn hessian_to_json_drops_class_noise() {
    assert_eq!(to_json(&Value::Long(1 << 53)), json!("9007199254740992"));
    assert_eq!(
        to_json(&Value::Long((1 << 53) - 1)),
        json!(9007199254740991i64)
    );
    assert_eq!(
        to_json(&Value::Long(-(1 << 60))),
        json!("-1152921504606846976")
    );
    assert_eq!(to_json(&Value::Binary(b"ping".to_vec())), json!("cGluZw=="));
    assert_eq!(to_json(&Value::Date(894621060000)), json!(894621060000i64));
    assert_eq!(to_json(&Value::Double(f64::INFINITY)), json!(null));
    assert_eq!(
        to_json(&Value::object(
            "java.math.BigDecimal",
            [("value", Value::string("1.10"))]
        )),
        json!("1.10")
    );
    let user = Value::Object {
        class: Arc::new(ClassDef::new("com.x.User", ["name", "tags", "self"])),
        fields: vec![
            Value::string("tc"),
            Value::List {
                typ: Some("[string".into()),
                items: vec![Value::string("a")],
            },
            Value::Ref(0),
        ],
    };
    assert_eq!(
        to_json(&user),
        json!({"name": "tc", "tags": ["a"], "self": null})
    );
    let m = Value::Map {
        typ: Some("com.x.Scores".into()),
        entries: vec![
            (Value::Int(1), Value::Bool(true)),
            (Value::Null, Value::Int(2)),
        ],
    };
    assert_eq!(to_json(&m), json!({"1": true, "null": 2}));
}

#[test]
fn heartbeats_are_sixteen_bytes_and_a_null() {
    let mut out = Vec::new();
    protocol::encode_heartbeat(7, true, &mut out);
    assert_eq!(
        out,
        [0xda, 0xbb, 0xe2, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1, b'N']
    );
    protocol::encode_heartbeat(7, false, &mut out);
    assert_eq!(&out[17..21], &[0xda, 0xbb, 0x22, 20]);
    let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    d.push(&out);
    let ping = protocol::decode(&d.next_frame().unwrap().unwrap()).unwrap();
    assert_eq!(
        ping,
        Message::Event {
            id: 7,
            request: true,
            two_way: true,
            data: Value::Null
        }
    );
    let pong = protocol::decode(&d.next_frame().unwrap().unwrap()).unwrap();
    assert_eq!(
        pong,
        Message::Event {
            id: 7,
            request: false,
            two_way: false,
            data: Value::Null
        }
    );
    // An event with an empty body (some implementations) is a heartbeat too.
    let mut h = out[..16].to_vec();
    h[15] = 0;
    d.push(&h);
    assert!(matches!(
        protocol::decode(&d.next_frame().unwrap().unwrap()).unwrap(),
        Message::Event {
            data: Value::Null,
            ..
        }
    ));
}

#[test]
fn frame_decoder_waits_for_partial_frames_and_refuses_bad_ones() {
    let mut frame = Vec::new();
    protocol::encode_heartbeat(1, true, &mut frame);
    let mut d = FrameDecoder::new(16);
    d.push(&frame[..HEADER_LEN]);
    assert_eq!(d.next_frame().unwrap(), None);
    d.push(&frame[HEADER_LEN..]);
    assert!(d.next_frame().unwrap().is_some());

    let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    d.push(b"GE");
    assert_eq!(d.next_frame(), Err(ProtocolError::BadMagic(*b"GE")));

    // A length over the limit is refused from the header alone.
    let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    let mut h = frame[..HEADER_LEN].to_vec();
    h[12..16].copy_from_slice(&(DEFAULT_MAX_PAYLOAD as u32 + 1).to_be_bytes());
    d.push(&h);
    assert_eq!(
        d.next_frame(),
        Err(ProtocolError::TooLarge {
            len: DEFAULT_MAX_PAYLOAD + 1,
            max: DEFAULT_MAX_PAYLOAD
        })
    );

    // Another serialization (6 = fastjson) is refused by the body decoder.
    let mut f = frame.clone();
    f[2] = 0xc6;
    let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    d.push(&f);
    assert_eq!(
        protocol::decode(&d.next_frame().unwrap().unwrap()),
        Err(ProtocolError::UnsupportedSerialization(6))
    );
}

#[test]
fn encode_request_refuses_a_body_over_the_limit() {
    let svc = Service::new("S", "1.0.0");
    let req = invoke::dubbo_proxy_request(&svc, "m", [], &[0u8; 2000]);
    let mut out = b"keep".to_vec();
    assert!(matches!(
        protocol::encode_request(&req, 1, 1000, &mut out),
        Err(ProtocolError::TooLarge { .. })
    ));
    assert_eq!(out, b"keep");
    protocol::encode_request(&req, 1, 4000, &mut out).unwrap();
    assert!(out.len() > 2000);
}

fn round_trip(status: Status, result: Result<Outcome, String>, att: &[(String, Value)]) -> Message {
    let mut out = Vec::new();
    protocol::encode_response(9, status, &result, att, &mut out).unwrap();
    let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    d.push(&out);
    protocol::decode(&d.next_frame().unwrap().unwrap()).unwrap()
}

#[test]
fn responses_of_every_kind() {
    let att = vec![("dubbo".to_owned(), Value::string("2.0.2"))];
    for (outcome, flag) in [
        (Outcome::Value(Value::Int(1)), 0x94),
        (Outcome::Null, 0x95),
        (Outcome::Exception(Value::Null), 0x93),
    ] {
        let mut out = Vec::new();
        protocol::encode_response(9, Status::OK, &Ok(outcome.clone()), &att, &mut out).unwrap();
        assert_eq!(out[HEADER_LEN], flag);
        let m = round_trip(Status::OK, Ok(outcome.clone()), &att);
        assert_eq!(
            m,
            Message::Response {
                id: 9,
                status: Status::OK,
                result: Ok(outcome.clone()),
                attachments: att.clone()
            }
        );
        // Without attachments: flags 1, 2, 0.
        let m = round_trip(Status::OK, Ok(outcome.clone()), &[]);
        assert_eq!(
            m,
            Message::Response {
                id: 9,
                status: Status::OK,
                result: Ok(outcome),
                attachments: vec![]
            }
        );
    }
    let m = round_trip(
        Status::SERVICE_NOT_FOUND,
        Err("Not found exported service".into()),
        &[],
    );
    let Message::Response { status, result, .. } = m else {
        panic!()
    };
    assert_eq!(result, Err("Not found exported service".to_owned()));
    let e = invoke::result_json(result, status).unwrap_err();
    assert_eq!(e.http_status(), 502);
    assert_eq!(
        e.to_string(),
        "dubbo status 60 (SERVICE_NOT_FOUND): Not found exported service"
    );
    assert_eq!(Status::SERVER_TIMEOUT.http_status(), 504);
    assert_eq!(Status::CLIENT_TIMEOUT.http_status(), 504);
    assert_eq!(Status::SERVER_THREADPOOL_EXHAUSTED_ERROR.http_status(), 503);
    assert_eq!(Status::BAD_REQUEST.http_status(), 502);
}

#[test]
fn an_exception_names_its_class_and_message() {
    let ex = Value::Object {
        class: Arc::new(ClassDef::new(
            "java.lang.IllegalStateException",
            ["detailMessage", "cause", "stackTrace"],
        )),
        fields: vec![
            Value::string("no user"),
            Value::Ref(0),
            Value::List {
                typ: Some("[java.lang.StackTraceElement".into()),
                items: vec![],
            },
        ],
    };
    let Message::Response { status, result, .. } =
        round_trip(Status::OK, Ok(Outcome::Exception(ex)), &[])
    else {
        panic!()
    };
    let e = invoke::result_json(result.clone(), status).unwrap_err();
    assert_eq!(
        e,
        CallError::Exception {
            class: "java.lang.IllegalStateException".into(),
            message: "no user".into()
        }
    );
    assert_eq!(e.http_status(), 500);
    assert!(invoke::dubbo_proxy_response(result, status).is_err());
}

#[test]
fn dubbo_proxy_request_is_apisix_map() {
    let svc = Service::new("org.apache.dubbo.backend.DemoService", "1.0.0");
    let headers: [(&str, &[u8]); 4] = [
        ("Host", b"gw"),
        ("X-A", b"1"),
        ("x-a", b"2"),
        ("X-Bin", b"\xff"),
    ];
    let req = invoke::dubbo_proxy_request(&svc, "hello", headers, b"");
    assert_eq!(req.param_types, "Ljava/util/Map;");
    assert_eq!(req.method, "hello");
    assert_eq!(
        req.args,
        vec![Value::string_map([
            ("host", Value::string("gw")),
            ("x-a", Value::string("2")),
            ("x-bin", Value::string("\u{fffd}")),
        ])]
    );
    let with_body = invoke::dubbo_proxy_request(&svc, "hello", [], b"{}");
    assert_eq!(
        with_body.args[0].get("body"),
        Some(&Value::Binary(b"{}".to_vec()))
    );
    assert_eq!(
        req.attachment("path").and_then(Value::as_str),
        Some("org.apache.dubbo.backend.DemoService")
    );
    assert_eq!(
        req.attachment("version").and_then(Value::as_str),
        Some("1.0.0")
    );
}

#[test]
fn dubbo_proxy_response_maps_status_headers_body() {
    let ok = |m: Value| invoke::dubbo_proxy_response(Ok(Outcome::Value(m)), Status::OK);
    let r = ok(Value::string_map([
        ("status", Value::string("503")),
        ("body", Value::Binary(b"dubbo fail\n".to_vec())),
        ("x-n", Value::Int(5)),
        ("x-null", Value::Null),
        ("x-evil", Value::string("a\r\nSet-Cookie: s=1")),
        ("bad name", Value::string("v")),
    ]))
    .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.body, b"dubbo fail\n");
    assert_eq!(r.headers, vec![("x-n".to_owned(), "5".to_owned())]);
    assert_eq!(
        ok(Value::string_map([("status", Value::Int(201))]))
            .unwrap()
            .status,
        201
    );
    let r = ok(Value::string_map([("body", Value::string("text"))])).unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"text"[..]));
    for bad in [
        Value::string_map([("status", Value::string("abc"))]),
        Value::string_map([("status", Value::Int(1000))]),
        Value::string("x"),
    ] {
        let e = ok(bad).unwrap_err();
        assert_eq!(e.http_status(), 502);
    }
    let e = invoke::dubbo_proxy_response(Ok(Outcome::Null), Status::OK).unwrap_err();
    assert!(matches!(e, CallError::BadResult(_)));
    let e =
        invoke::dubbo_proxy_response(Err("timeout".into()), Status::SERVER_TIMEOUT).unwrap_err();
    assert_eq!(e.http_status(), 504);
}

#[test]
fn generic_invoke_shape() {
    let mut svc = Service::new("org.apache.dubbo.samples.UserProvider", "1.0.0");
    svc.group = Some("g1".into());
    svc.timeout_ms = Some(3000);
    let req = invoke::generic_request(
        &svc,
        "GetUser",
        &[t("string"), t("com.x.User")],
        &[json!("A001"), json!({"age": 1})],
    )
    .unwrap();
    assert_eq!(req.method, "$invoke");
    assert_eq!(req.param_types, GENERIC_DESCRIPTOR);
    assert_eq!(req.args[0], Value::string("GetUser"));
    assert_eq!(
        req.args[1],
        Value::List {
            typ: Some("[string".into()),
            items: vec![
                Value::string("java.lang.String"),
                Value::string("com.x.User")
            ]
        }
    );
    assert_eq!(
        req.args[2],
        Value::List {
            typ: Some("[object".into()),
            items: vec![
                Value::string("A001"),
                Value::string_map([("age", Value::Int(1))])
            ]
        }
    );
    let att: Vec<&str> = req.attachments.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        att,
        [
            "path",
            "interface",
            "version",
            "group",
            "timeout",
            "generic"
        ]
    );
    assert_eq!(
        req.attachment("generic").and_then(Value::as_str),
        Some("true")
    );
    assert_eq!(
        req.attachment("timeout").and_then(Value::as_str),
        Some("3000")
    );
    // A no-arg method (Pixiu #617) is two empty lists, not an error.
    let none = invoke::generic_request(&svc, "Ping", &[], &[]).unwrap();
    assert_eq!(
        none.args[1],
        Value::List {
            typ: Some("[string".into()),
            items: vec![]
        }
    );
    let e = invoke::generic_request(&svc, "GetUser", &[t("string")], &[]).unwrap_err();
    assert_eq!(e.0, "0 argument(s) given for 1 declared parameter type(s)");
    let e = invoke::generic_request(&svc, "GetUser", &[t("long")], &[json!("x")]).unwrap_err();
    assert_eq!(e.0, "argument 1 (long): expected long, got \"x\"");
    // It encodes and decodes as a provider sees it.
    let mut out = Vec::new();
    protocol::encode_request(&req, 5, DEFAULT_MAX_PAYLOAD, &mut out).unwrap();
    let mut d = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    d.push(&out);
    let Message::Request { id, request, .. } =
        protocol::decode(&d.next_frame().unwrap().unwrap()).unwrap()
    else {
        panic!()
    };
    assert_eq!((id, request), (5, req));
}

#[test]
fn direct_typed_call_shape() {
    let svc = Service::new("com.x.UserService", "");
    let req = invoke::direct_request(
        &svc,
        "find",
        &[t("long"), t("com.x.Query")],
        &[json!("12"), json!({"q": "a"})],
    )
    .unwrap();
    assert_eq!(req.param_types, "JLcom/x/Query;");
    assert_eq!(req.args[0], Value::Long(12));
    assert_eq!(req.args[1].class_name(), Some("com.x.Query"));
    assert!(
        req.attachment("version").is_none(),
        "no version attachment when the service has none"
    );
}

#[test]
fn pixiu_universality_bodies() {
    let (types, values) =
        invoke::universality(&json!({"types": "string", "values": "tc"})).unwrap();
    assert_eq!((types, values), (vec![JavaType::String], vec![json!("tc")]));
    let (types, values) =
        invoke::universality(&json!({"types": ["int", "string"], "values": [1, "a"]})).unwrap();
    assert_eq!(types.len(), 2);
    assert_eq!(values, vec![json!(1), json!("a")]);
    let (_, values) = invoke::universality(&json!({"types": "string", "values": ["tc"]})).unwrap();
    assert_eq!(values, vec![json!("tc")]);
    let (_, values) = invoke::universality(&json!({"types": "int[]", "values": [1, 2]})).unwrap();
    assert_eq!(values, vec![json!([1, 2])]);
    let (_, values) = invoke::universality(&json!({"types": "int[]", "values": [[1, 2]]})).unwrap();
    assert_eq!(values, vec![json!([1, 2])]);
    let (types, values) = invoke::universality(&json!({})).unwrap();
    assert!(types.is_empty() && values.is_empty());
    assert!(invoke::universality(&json!([1])).is_err());
    assert!(invoke::universality(&json!({"types": 5})).is_err());
}
