//! Upstream responses: frames, trailers and grpc-status-details-bin, unary and streaming.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_grpc::{compile, GrpcStatus, StreamFormat, TranscodeConfig, Transcoder};

const PROTO: &str = r#"
syntax = "proto3";
package f;
service S { rpc A (M) returns (stream M); }
message Sub { string s = 1; repeated int64 l = 2; Sub next = 3; }
message M { string s = 1; int64 i64 = 3; repeated Sub subs = 9; map<string, Sub> m = 10; bytes by = 12; }
"#;

fn transcoder() -> &'static Transcoder {
    static T: OnceLock<Transcoder> = OnceLock::new();
    T.get_or_init(|| {
        let set = compile("f.proto", PROTO, |_| None).unwrap();
        let config = TranscodeConfig {
            show_status_in_body: true,
            status_detail_type: Some("f.Sub".into()),
            max_resp_body_size: 1 << 16,
            ..Default::default()
        };
        Transcoder::new(&set, "f.S", "A", &config).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let t = transcoder();
    let cut = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let (details, body) = (&data[..cut], data.get(cut + 1..).unwrap_or(&[]));
    let mut r = t.unary_response();
    r.push(body);
    let _ = r.finish(
        200,
        &GrpcStatus {
            code: Some(b"0"),
            ..Default::default()
        },
    );
    let r = t.unary_response();
    let status = GrpcStatus {
        code: Some(b"3"),
        message: Some(details),
        details_bin: Some(details),
    };
    let out = r.finish(200, &status).unwrap();
    assert_eq!(out.status, 400);
    for format in [
        StreamFormat::JsonArray,
        StreamFormat::Ndjson,
        StreamFormat::Sse,
    ] {
        let mut s = t.stream_response(format);
        let mut out = Vec::new();
        for chunk in body.chunks(7) {
            if s.push(chunk, &mut out).is_err() {
                break;
            }
        }
        let _ = s.finish(&status, &mut out);
    }
});
