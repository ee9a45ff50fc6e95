//! Cross-checks against `protoc` (Debian's protobuf-compiler, a separate implementation): descriptor sets it
//! builds are accepted, messages Sluice encodes are what protoc decodes, and protoc's encodings transcode to the
//! expected JSON.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use sluice_grpc::{compile, GrpcStatus, HttpRequest, HttpRouter, TranscodeConfig, Transcoder};

const PROTO: &str = r#"
syntax = "proto3";
package interop;
import "google/api/annotations.proto";
import "google/protobuf/timestamp.proto";

service Echo {
  rpc Say (Req) returns (Reply) {
    option (google.api.http) = { post: "/v1/say/{id}" body: "*" };
  }
}
enum Mood { MOOD_UNKNOWN = 0; HAPPY = 1; }
message Inner { string tag = 1; repeated int32 nums = 2; }
message Req {
  string id = 1;
  int64 big = 2;
  Mood mood = 3;
  repeated Inner inners = 4;
  map<string, int32> counts = 5;
  google.protobuf.Timestamp at = 6;
  oneof choice { string a = 7; int32 b = 8; }
  double ratio = 9;
  bytes blob = 10;
}
message Reply { string text = 1; repeated string items = 2; int64 big = 3; Mood mood = 4; Inner inner = 5; }
"#;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn setup(tag: &str) -> Dir {
    let dir = std::env::temp_dir().join(format!("sluice-grpc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("interop.proto"), PROTO).unwrap();
    for (name, text) in sluice_grpc::proto::bundled_files() {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    Dir(dir)
}

fn protoc(dir: &Path, args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let mut child = Command::new("protoc")
        .arg(format!("-I{}", dir.display()))
        .arg("-I/usr/include")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("protoc must be installed (Debian package protobuf-compiler)");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "protoc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn protoc_descriptor_set_is_accepted_with_its_http_rules() {
    let dir = setup("set");
    protoc(
        &dir.0,
        &[
            "--include_imports",
            "--descriptor_set_out=set.pb",
            "interop.proto",
        ],
        b"",
    );
    let pb = std::fs::read(dir.0.join("set.pb")).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(pb);
    let set = compile("1", &b64, |_| None).unwrap();
    assert_eq!(set.kind(), sluice_grpc::ContentKind::DescriptorSet);
    set.method("interop.Echo", "Say").unwrap();
    let router = HttpRouter::new(&set, &[], false, &TranscodeConfig::default()).unwrap();
    let m = router
        .find("POST", "/v1/say/42")
        .expect("binding read from protoc's options");
    assert_eq!(m.captures, vec![("id".to_owned(), "42".to_owned())]);

    // Without --include_imports the bundled dependencies fill in.
    protoc(
        &dir.0,
        &["--descriptor_set_out=bare.pb", "interop.proto"],
        b"",
    );
    let pb = std::fs::read(dir.0.join("bare.pb")).unwrap();
    let set = compile(
        "1",
        &base64::engine::general_purpose::STANDARD.encode(pb),
        |_| None,
    )
    .unwrap();
    let router = HttpRouter::new(&set, &[], false, &TranscodeConfig::default()).unwrap();
    assert!(router.find("POST", "/v1/say/1").is_some());
}

#[test]
fn requests_sluice_encodes_are_what_protoc_decodes() {
    let dir = setup("req");
    let set = compile("interop.proto", PROTO, |_| None).unwrap();
    let t = Transcoder::new(&set, "interop.Echo", "Say", &TranscodeConfig::default()).unwrap();
    let body = br#"{"id":"x","big":"9007199254740993","mood":"HAPPY",
        "inners":[{"tag":"t1","nums":[1,2]},{"tag":"t2"}],"counts":{"k":3},
        "at":"2024-01-02T03:04:05Z","b":7,"ratio":0.5,"blob":"AAE="}"#;
    let mut frame = Vec::new();
    t.encode_request(
        &HttpRequest {
            method: "POST",
            content_type: Some("application/json"),
            body,
            ..Default::default()
        },
        &mut frame,
    )
    .unwrap();
    let text = protoc(
        &dir.0,
        &["--decode=interop.Req", "interop.proto"],
        &frame[5..],
    );
    let text = String::from_utf8(text).unwrap();
    for want in [
        "id: \"x\"",
        "big: 9007199254740993",
        "mood: HAPPY",
        "tag: \"t1\"",
        "nums: 1",
        "nums: 2",
        "tag: \"t2\"",
        "key: \"k\"",
        "value: 3",
        "seconds: 1704164645",
        "b: 7",
        "ratio: 0.5",
        "blob: \"\\000\\001\"",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn protoc_encoded_replies_transcode_to_json() {
    let dir = setup("resp");
    let wire = protoc(
        &dir.0,
        &["--encode=interop.Reply", "interop.proto"],
        b"text: \"hi\" big: 9007199254740993 mood: HAPPY inner { tag: \"z\" }",
    );
    let set = compile("interop.proto", PROTO, |_| None).unwrap();
    let t = Transcoder::new(&set, "interop.Echo", "Say", &TranscodeConfig::default()).unwrap();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(wire.len() as u32).to_be_bytes());
    framed.extend_from_slice(&wire);
    let mut r = t.unary_response();
    r.push(&framed);
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
    assert_eq!(
        String::from_utf8(out.body).unwrap(),
        r#"{"text":"hi","items":[],"big":9007199254740993,"mood":"HAPPY","inner":{"tag":"z","nums":[]}}"#
    );
}
