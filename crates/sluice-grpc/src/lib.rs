//! IO-free HTTP <-> gRPC transcoding for Sluice: the mechanism behind APISIX's `grpc-transcode` and `grpc-web`
//! plugins, the `/apisix/admin/protos` resource, and `google.api.http` bindings.
//!
//! Nothing here reads a socket or spawns a task: the proxy feeds bytes in and writes the bytes it gets back.
//!
//! # Flow
//!
//! **Config time** (Admin API write, snapshot compile):
//! 1. [`proto::compile`] turns a proto resource's `content` (`.proto` text, or base64 of a `FileDescriptorSet`,
//!    told apart as APISIX does: text first) into a [`ProtoSet`]; its error is the Admin API's 400 message.
//!    Imports resolve against other proto resources by name; `google/protobuf/*`, `google/api/*` and
//!    `google/rpc/*` are bundled.
//! 2. A `grpc-transcode` route becomes a [`Transcoder`] ([`Transcoder::new`]: `service` + `method` lookup,
//!    [`PbOptions::parse`] for `pb_option`, `deadline`, `show_status_in_body`, `status_detail_type`,
//!    `max_resp_body_size`). A route serving a whole annotated service becomes an [`HttpRouter`].
//!
//! **Per request**:
//! 3. [`Transcoder::encode_request`] (or [`HttpRouter::find`] + [`HttpBinding::encode_request`]) builds the
//!    request message from the JSON body / form / query / path captures and appends one gRPC frame; a
//!    [`RequestError`] is a 400. The upstream request is `POST` [`Transcoder::grpc_path`] with
//!    `content-type: application/grpc`, `te: trailers` and [`Transcoder::grpc_timeout`].
//! 4. Unary: [`Transcoder::unary_response`] collects the body, then [`UnaryResponse::finish`] takes the HTTP
//!    status and [`GrpcStatus`] (headers of a trailers-only response, else trailers) and returns status + JSON
//!    body (APISIX's `grpc-status` table in [`status::http_status`], `show_status_in_body` error bodies).
//!    Server streaming: [`Transcoder::stream_response`] turns frames into a JSON array, NDJSON or SSE as they
//!    arrive.
//! 5. grpc-web: [`grpc_web::admit`] checks method and content type, [`grpc_web::decode_request_body`] gives the
//!    gRPC body, [`grpc_web::ResponseEncoder`] re-encodes the response and appends the trailer frame.
//!
//! ```
//! use sluice_grpc::{compile, GrpcStatus, HttpRequest, TranscodeConfig, Transcoder};
//!
//! let proto = compile(
//!     "hello.proto",
//!     r#"syntax = "proto3"; package helloworld;
//!        service Greeter { rpc SayHello (HelloRequest) returns (HelloReply); }
//!        message HelloRequest { string name = 1; }
//!        message HelloReply { string message = 1; }"#,
//!     |_import| None,
//! )
//! .unwrap();
//! let t = Transcoder::new(&proto, "helloworld.Greeter", "SayHello", &TranscodeConfig::default()).unwrap();
//!
//! let mut frame = Vec::new();
//! t.encode_request(&HttpRequest { method: "GET", query: b"name=world", ..Default::default() }, &mut frame)
//!     .unwrap();
//! assert_eq!(frame, b"\x00\x00\x00\x00\x07\x0a\x05world");
//!
//! // The upstream answers with one frame (HelloReply{message: "Hello world"}) and grpc-status 0.
//! let mut resp = t.unary_response();
//! resp.push(b"\x00\x00\x00\x00\x0d\x0a\x0bHello world");
//! let out = resp.finish(200, &GrpcStatus { code: Some(b"0"), ..Default::default() }).unwrap();
//! assert_eq!((out.status, out.body.as_slice()), (200, &br#"{"message":"Hello world"}"#[..]));
//! ```
//!
//! # Differences from APISIX, on purpose
//! - A request body that is not valid JSON (with a JSON content type) is a 400, not silently replaced by the
//!   query arguments; an undecodable or oversized unary response is a 502 (APISIX has sent 200 already).
//! - Route path parameters fill fields; nested fields from dotted query keys; imports work.
//! - `int64_as_hexstring` is refused; 64-bit numbers are exact; see [`PbOptions`].
//! - Empty repeated fields are always `[]`.
//!
//! # Cost
//! Messages go through `prost_reflect::DynamicMessage` (allocates per field). Measure with
//! `cargo run --release -p sluice-grpc --example transcode_cost`.

mod fields;
pub mod frame;
pub mod grpc_web;
pub mod http_rule;
pub mod options;
pub mod proto;
pub mod status;
pub mod transcode;

pub use http_rule::{HttpBinding, HttpMatch, HttpRouter, PathTemplate};
pub use options::PbOptions;
pub use proto::{compile, CompileError, ContentKind, LookupError, ProtoSet};
pub use status::{http_status, GrpcStatus};
pub use transcode::{
    HttpRequest, RequestError, StreamError, StreamFormat, StreamResponse, TranscodeConfig,
    TranscodedResponse, Transcoder, UnaryResponse,
};

/// Re-exported so callers can name descriptors without depending on prost-reflect themselves.
pub use prost_reflect;
