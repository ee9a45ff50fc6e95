//! Property tests: what goes in as JSON, query arguments or path segments comes back out unchanged.

use proptest::prelude::*;
use sluice_grpc::{compile, GrpcStatus, HttpRequest, HttpRouter, TranscodeConfig, Transcoder};

const PROTO: &str = r#"
syntax = "proto3";
package rt;
import "google/api/annotations.proto";
service S {
  rpc Echo (M) returns (M) {
    option (google.api.http) = { get: "/v1/{s}/x/{rest=**}" };
  }
}
enum E { E0 = 0; E1 = 1; E2 = 2; }
message Sub { string s = 1; repeated int64 l = 2; }
message M {
  string s = 1;
  int32 i32 = 2;
  int64 i64 = 3;
  uint64 u64 = 4;
  bool b = 5;
  E e = 6;
  repeated string rs = 7;
  Sub sub = 8;
  repeated Sub subs = 9;
  map<string, int32> m = 10;
  double d = 11;
  string rest = 12;
}
"#;

fn transcoder() -> Transcoder {
    let set = compile("rt.proto", PROTO, |_| None).unwrap();
    Transcoder::new(&set, "rt.S", "Echo", &TranscodeConfig::default()).unwrap()
}

fn echo(t: &Transcoder, req: HttpRequest<'_>) -> serde_json::Value {
    let mut frame = Vec::new();
    t.encode_request(&req, &mut frame).unwrap();
    // Input and output are the same type: the request frame is a valid reply.
    let mut r = t.unary_response();
    r.push(&frame);
    let out = r
        .finish(
            200,
            &GrpcStatus {
                code: Some(b"0"),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(out.status, 200);
    serde_json::from_slice(&out.body).unwrap()
}

fn sub() -> impl Strategy<Value = serde_json::Value> {
    (".*", proptest::collection::vec(any::<i64>(), 0..3))
        .prop_map(|(s, l)| serde_json::json!({"s": s, "l": l}))
}

prop_compose! {
    fn message()(s in ".*", i32v in any::<i32>(), i64v in any::<i64>(), u64v in any::<u64>(), b in any::<bool>(),
                 e in 0..3usize, rs in proptest::collection::vec(".*", 0..3), sub in sub(),
                 subs in proptest::collection::vec(sub(), 0..3),
                 m in proptest::collection::btree_map("[a-z]{0,4}", any::<i32>(), 0..3),
                 d in -1e300f64..1e300, rest in ".*") -> serde_json::Value {
        let e = ["E0", "E1", "E2"][e];
        serde_json::json!({
            "s": s, "i32": i32v, "i64": i64v, "u64": u64v, "b": b, "e": e, "rs": rs,
            "sub": sub, "subs": subs, "m": m, "d": d, "rest": rest,
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn json_body_round_trips(v in message()) {
        let t = transcoder();
        let body = serde_json::to_vec(&v).unwrap();
        let got = echo(&t, HttpRequest { method: "POST", content_type: Some("application/json"), body: &body, ..Default::default() });
        prop_assert_eq!(got, v);
    }

    #[test]
    fn query_args_round_trip(s in ".*", i in any::<i64>(), rs in proptest::collection::vec(".*", 0..4), b in any::<bool>()) {
        let t = transcoder();
        let enc = |x: &str| percent_encoding::utf8_percent_encode(x, percent_encoding::NON_ALPHANUMERIC).to_string();
        let mut q = format!("s={}&i64={i}&b={b}&sub.s={}", enc(&s), enc(&s));
        for r in &rs {
            q.push_str(&format!("&rs={}", enc(r)));
        }
        let got = echo(&t, HttpRequest { method: "GET", query: q.as_bytes(), ..Default::default() });
        prop_assert_eq!(&got["s"], &serde_json::json!(s));
        prop_assert_eq!(&got["sub"]["s"], &serde_json::json!(s));
        prop_assert_eq!(&got["i64"], &serde_json::json!(i));
        prop_assert_eq!(&got["b"], &serde_json::json!(b));
        prop_assert_eq!(&got["rs"], &serde_json::json!(rs));
    }

    #[test]
    fn path_captures_round_trip(seg in ".+", rest in proptest::collection::vec("[^/]*", 1..4)) {
        let set = compile("rt.proto", PROTO, |_| None).unwrap();
        let router = HttpRouter::new(&set, &[], false, &TranscodeConfig::default()).unwrap();
        // Path-segment encoding: everything but unreserved characters.
        let enc = |x: &str| percent_encoding::utf8_percent_encode(x, percent_encoding::NON_ALPHANUMERIC).to_string();
        let rest_path: Vec<String> = rest.iter().map(|r| enc(r)).collect();
        let path = format!("/v1/{}/x/{}", enc(&seg), rest_path.join("/"));
        let m = router.find("GET", &path).unwrap();
        prop_assert_eq!(&m.captures[0], &("s".to_owned(), seg.clone()));
        // Multi-segment captures keep an encoded '/' encoded.
        let decoded_rest: Vec<String> = rest.iter().map(|r| r.to_string()).collect();
        prop_assert_eq!(&m.captures[1].1, &decoded_rest.join("/"));
    }
}
