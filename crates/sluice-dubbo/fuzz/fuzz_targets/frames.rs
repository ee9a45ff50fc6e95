//! Any bytes from a Dubbo peer, in any split: frames are cut exactly, every body decodes or fails cleanly, and
//! answers map to HTTP without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_dubbo::invoke;
use sluice_dubbo::protocol::{self, FrameDecoder, Message};

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(1, |b| (*b as usize % 32) + 1);
    let mut d = FrameDecoder::new(1 << 16);
    let mut total = 0;
    for chunk in data.chunks(split) {
        d.push(chunk);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => {
                    total += protocol::HEADER_LEN + f.body.len();
                    if let Ok(Message::Response { status, result, .. }) = protocol::decode(&f) {
                        let _ = invoke::dubbo_proxy_response(result.clone(), status);
                        let _ = invoke::result_json(result, status);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    assert_eq!(total + d.buffered(), data.len());
});
