//! Cost of the Pixiu benchmark's call (`POST {"types":"string","values":"tc"}` -> generic `$invoke` of a
//! dubbo-go UserProvider) through this crate: ns per request encoded (body parsed, JSON converted, frame
//! written) and per answer decoded (frame cut, body decoded, result to JSON text).
//!
//! `cargo run --release -p sluice-dubbo --example dubbo_cost`

use std::hint::black_box;
use std::time::Instant;

use sluice_dubbo::hessian::Value;
use sluice_dubbo::invoke::{self, Service};
use sluice_dubbo::protocol::{self, FrameDecoder, Outcome, Status, DEFAULT_MAX_PAYLOAD};

fn main() {
    let iters: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let mut svc = Service::new("org.apache.dubbo.samples.UserProvider", "1.0.0");
    svc.timeout_ms = Some(3000);
    let http_body = br#"{"types":"string","values":"tc"}"#;

    let mut out = Vec::with_capacity(512);
    let encode = |out: &mut Vec<u8>, id: u64| {
        out.clear();
        let json: serde_json::Value = serde_json::from_slice(http_body).unwrap();
        let (types, values) = invoke::universality(&json).unwrap();
        let req = invoke::generic_request(&svc, "GetUser", &types, &values).unwrap();
        protocol::encode_request(&req, id, DEFAULT_MAX_PAYLOAD, out).unwrap();
    };

    // The answer: a User POJO as dubbo-go's sample returns it.
    let user = Value::object(
        "org.apache.dubbo.samples.User",
        [
            ("id", Value::string("A001")),
            ("name", Value::string("tc")),
            ("age", Value::Int(18)),
            ("time", Value::Date(1_700_000_000_000)),
        ],
    );
    let att = vec![("dubbo".to_owned(), Value::string("2.0.2"))];
    let mut answer = Vec::new();
    protocol::encode_response(1, Status::OK, &Ok(Outcome::Value(user)), &att, &mut answer).unwrap();
    let decode = |frames: &mut FrameDecoder| {
        frames.push(&answer);
        let f = frames.next_frame().unwrap().unwrap();
        let protocol::Message::Response { status, result, .. } = protocol::decode(&f).unwrap()
        else {
            unreachable!()
        };
        serde_json::to_vec(&invoke::result_json(result, status).unwrap()).unwrap()
    };

    encode(&mut out, 0);
    let mut frames = FrameDecoder::new(DEFAULT_MAX_PAYLOAD);
    println!(
        "request frame {} bytes, answer frame {} bytes, answer JSON {}",
        out.len(),
        answer.len(),
        String::from_utf8(decode(&mut frames)).unwrap()
    );

    for round in 0..3 {
        let t = Instant::now();
        for i in 0..iters {
            encode(&mut out, i as u64);
            black_box(&out);
        }
        let enc = t.elapsed().as_nanos() as f64 / iters as f64;
        let t = Instant::now();
        for _ in 0..iters {
            black_box(decode(&mut frames));
        }
        let dec = t.elapsed().as_nanos() as f64 / iters as f64;
        println!("round {round}: encode {enc:.0} ns/request, decode {dec:.0} ns/answer ({iters} iterations)");
    }
}
