//! Cost of one unary transcode, request (HTTP -> gRPC frame) and response (gRPC frame -> JSON), for a
//! HelloRequest-sized message and a ~1 KiB one: nanoseconds and heap allocations per operation.
//!
//! `cargo run --release -p sluice-grpc --example transcode_cost [iterations]`
// A counting global allocator is the only way to count allocations without an external profiler.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sluice_grpc::{compile, GrpcStatus, HttpRequest, TranscodeConfig, Transcoder};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const PROTO: &str = r#"
syntax = "proto3";
package helloworld;
service Greeter {
  rpc SayHello (HelloRequest) returns (HelloReply);
  rpc Big (BigMessage) returns (BigMessage);
}
message HelloRequest { string name = 1; }
message HelloReply { string message = 1; }
message Person { string name = 1; int32 age = 2; }
message BigMessage {
  string id = 1;
  string text = 2;
  repeated int64 nums = 3;
  repeated Person persons = 4;
  bool flag = 5;
  double score = 6;
}
"#;

fn measure(label: &str, bytes: usize, iters: u64, mut f: impl FnMut()) {
    for _ in 0..iters / 10 {
        f();
    }
    let a0 = ALLOCS.load(Ordering::Relaxed);
    let t0 = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = t0.elapsed().as_nanos() as f64 / iters as f64;
    let allocs = (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / iters as f64;
    println!("{label:<44} {bytes:>6} B  {ns:>9.0} ns/op  {allocs:>6.1} allocs/op");
}

fn frame_of(t: &Transcoder, json: &str) -> Vec<u8> {
    let mut out = Vec::new();
    t.encode_request(
        &HttpRequest {
            method: "POST",
            content_type: Some("application/json"),
            body: json.as_bytes(),
            ..Default::default()
        },
        &mut out,
    )
    .unwrap();
    out
}

fn main() {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let set = compile("hello.proto", PROTO, |_| None).unwrap();
    let config = TranscodeConfig::default();
    let hello = Transcoder::new(&set, "helloworld.Greeter", "SayHello", &config).unwrap();
    let big = Transcoder::new(&set, "helloworld.Greeter", "Big", &config).unwrap();
    let ok = GrpcStatus {
        code: Some(b"0"),
        ..Default::default()
    };

    let big_json = format!(
        r#"{{"id":"req-0123456789","text":"{}","nums":[{}],"persons":[{}],"flag":true,"score":0.75}}"#,
        "x".repeat(577),
        (0..40)
            .map(|i| (i * 1_000_003).to_string())
            .collect::<Vec<_>>()
            .join(","),
        (0..12)
            .map(|i| format!(r#"{{"name":"person-number-{i}","age":{}}}"#, 20 + i))
            .collect::<Vec<_>>()
            .join(","),
    );
    let hello_json = r#"{"name":"world"}"#;
    let hello_reply = {
        // HelloReply{message:"Hello world"} framed.
        let mut f = vec![0, 0, 0, 0, 13, 0x0a, 11];
        f.extend_from_slice(b"Hello world");
        f
    };
    let big_frame = frame_of(&big, &big_json);

    println!("iterations: {iters}; size = the input (JSON body, query string or gRPC frame)");
    let mut out = Vec::with_capacity(4096);
    measure(
        "request  JSON body -> frame (HelloRequest)",
        hello_json.len(),
        iters,
        || {
            out.clear();
            hello
                .encode_request(
                    &HttpRequest {
                        method: "POST",
                        content_type: Some("application/json"),
                        body: black_box(hello_json.as_bytes()),
                        ..Default::default()
                    },
                    &mut out,
                )
                .unwrap();
            black_box(&out);
        },
    );
    measure(
        "request  query args -> frame (HelloRequest)",
        10,
        iters,
        || {
            out.clear();
            hello
                .encode_request(
                    &HttpRequest {
                        method: "GET",
                        query: black_box(b"name=world"),
                        ..Default::default()
                    },
                    &mut out,
                )
                .unwrap();
            black_box(&out);
        },
    );
    measure(
        "response frame -> JSON (HelloReply)",
        hello_reply.len(),
        iters,
        || {
            let mut r = hello.unary_response();
            r.push(black_box(&hello_reply));
            black_box(r.finish(200, &ok).unwrap());
        },
    );
    let big_iters = (iters / 5).max(1);
    measure(
        "request  JSON body -> frame (1 KiB message)",
        big_frame.len(),
        big_iters,
        || {
            out.clear();
            big.encode_request(
                &HttpRequest {
                    method: "POST",
                    content_type: Some("application/json"),
                    body: black_box(big_json.as_bytes()),
                    ..Default::default()
                },
                &mut out,
            )
            .unwrap();
            black_box(&out);
        },
    );
    measure(
        "response frame -> JSON (1 KiB message)",
        big_frame.len(),
        big_iters,
        || {
            let mut r = big.unary_response();
            r.push(black_box(&big_frame));
            black_box(r.finish(200, &ok).unwrap());
        },
    );
}
