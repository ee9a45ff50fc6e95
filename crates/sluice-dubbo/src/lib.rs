//! The Dubbo2 protocol (`dubbo://` with Hessian 2 serialization), without IO.
//!
//! Sluice's HTTP -> Dubbo conversion is built on this crate: it turns calls into frame bytes and frame bytes
//! into answers; connections, pooling and timers belong to the caller.
//!
//! * [`hessian`]: the Hessian 2 value model, encoder and decoder (hostile input: bounded nesting, lengths
//!   checked against the input, bounded reference expansion, no panics).
//! * [`java`]: declared Java types, JVM descriptors, and JSON <-> Hessian conversion.
//! * [`protocol`]: the 16-byte header, [`protocol::FrameDecoder`] (feed bytes, take complete frames),
//!   request/response/heartbeat bodies.
//! * [`invoke`]: the calls a gateway makes: APISIX `dubbo-proxy`'s map call, generic `$invoke`, direct typed
//!   calls, and how their answers become HTTP.
//!
//! ```
//! use sluice_dubbo::{invoke, java::JavaType, protocol};
//!
//! let svc = invoke::Service::new("org.apache.dubbo.samples.UserProvider", "1.0.0");
//! let req = invoke::generic_request(&svc, "GetUser", &[JavaType::parse("string")?], &[serde_json::json!("A001")])?;
//! let mut wire = Vec::new();
//! protocol::encode_request(&req, 1, protocol::DEFAULT_MAX_PAYLOAD, &mut wire)?;
//!
//! // What comes back is fed to a FrameDecoder (here: the request itself, decoded like a provider would).
//! let mut frames = protocol::FrameDecoder::new(protocol::DEFAULT_MAX_PAYLOAD);
//! frames.push(&wire);
//! let frame = frames.next_frame()?.expect("one complete frame");
//! match protocol::decode(&frame)? {
//!     protocol::Message::Request { request, .. } => assert_eq!(request.method, "$invoke"),
//!     other => panic!("{other:?}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod fastjson;
pub mod hessian;
pub mod invoke;
pub mod java;
pub mod protocol;
