//! grpc-web bodies from a browser: base64 text and frames with trailer blocks.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_grpc::grpc_web::{decode_request_body, decode_response_body, Encoding, ResponseEncoder};

fuzz_target!(|data: &[u8]| {
    if let Ok(raw) = decode_request_body(Encoding::Text, data) {
        // Whatever decodes re-encodes to something that decodes to the same bytes.
        let mut out = Vec::new();
        ResponseEncoder::new(Encoding::Text).chunk(&raw, &mut out);
        assert_eq!(decode_request_body(Encoding::Text, &out).unwrap(), raw);
    }
    let _ = decode_response_body(Encoding::Binary, data, 1 << 16);
    let _ = decode_response_body(Encoding::Text, data, 1 << 16);
});
