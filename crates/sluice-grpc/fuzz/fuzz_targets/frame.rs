//! gRPC frames from an upstream or a client: any bytes, any split.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_grpc::frame::Deframer;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(1, |b| (*b as usize % 16) + 1);
    for web in [false, true] {
        let mut d = if web {
            Deframer::grpc_web(1 << 16)
        } else {
            Deframer::new(1 << 16)
        };
        let mut total = 0;
        for chunk in data.chunks(split) {
            d.push(chunk);
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => total += 5 + f.payload.len(),
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
        }
        assert!(total + d.buffered() == data.len());
        let _ = d.finish();
    }
});
