//! Client requests: JSON bodies, form bodies, query strings, routed through grpc-transcode and google.api.http.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_grpc::{compile, HttpRequest, HttpRouter, TranscodeConfig, Transcoder};

const PROTO: &str = r#"
syntax = "proto3";
package f;
import "google/api/annotations.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
service S {
  rpc A (M) returns (M) { option (google.api.http) = { post: "/v1/{s}/{sub.s=x/**}" body: "sub" }; }
  rpc B (M) returns (M) { option (google.api.http) = { get: "/v1/b/{i64}" additional_bindings { put: "/v1/b" body: "*" } }; }
}
enum E { E0 = 0; E1 = 1; }
message Sub { string s = 1; repeated int64 l = 2; Sub next = 3; }
message M {
  string s = 1; int32 i32 = 2; int64 i64 = 3; uint64 u64 = 4; bool b = 5; E e = 6; repeated string rs = 7;
  Sub sub = 8; repeated Sub subs = 9; map<string, Sub> m = 10; double d = 11; bytes by = 12;
  google.protobuf.Timestamp ts = 13; google.protobuf.Int32Value w = 14; google.protobuf.Struct st = 15;
  oneof o { string o1 = 16; Sub o2 = 17; }
}
"#;

fn setup() -> &'static (Transcoder, HttpRouter) {
    static S: OnceLock<(Transcoder, HttpRouter)> = OnceLock::new();
    S.get_or_init(|| {
        let set = compile("f.proto", PROTO, |_| None).unwrap();
        let t = Transcoder::new(&set, "f.S", "A", &TranscodeConfig::default()).unwrap();
        let r = HttpRouter::new(&set, &[], true, &TranscodeConfig::default()).unwrap();
        (t, r)
    })
}

fuzz_target!(|data: &[u8]| {
    let (t, router) = setup();
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let cut = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let (query, body) = (&rest[..cut], rest.get(cut + 1..).unwrap_or(&[]));
    let method = ["GET", "POST", "PUT", "PATCH"][sel as usize % 4];
    let ct = [
        "application/json",
        "application/x-www-form-urlencoded",
        "text/plain",
    ][(sel as usize / 4) % 3];
    let req = HttpRequest {
        method,
        content_type: Some(ct),
        query,
        body,
        params: &[],
    };
    let mut out = Vec::new();
    if t.encode_request(&req, &mut out).is_ok() {
        assert!(out.len() >= 5 && out[0] == 0);
    }
    let path = String::from_utf8_lossy(query);
    if let Some(m) = router.find(method, &path) {
        let _ = m.binding.encode_request(&m.captures, &req, &mut Vec::new());
    }
});
