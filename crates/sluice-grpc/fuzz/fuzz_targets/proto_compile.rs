//! Proto resource content from the Admin API: proto text or base64 descriptor sets, with imports.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_grpc::{compile, HttpRouter, TranscodeConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (root, import) = s.split_once('\0').unwrap_or((s, ""));
    if let Ok(set) = compile("a.proto", root, |name| {
        (name == "b.proto").then(|| import.to_owned())
    }) {
        let _ = HttpRouter::new(&set, &[], true, &TranscodeConfig::default());
    }
});
