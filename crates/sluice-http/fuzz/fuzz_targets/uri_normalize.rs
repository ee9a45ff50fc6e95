//! `cargo +nightly fuzz run uri_normalize` (from crates/sluice-http): the path normaliser parses untrusted bytes.
//! Checks the invariants routing relies on, not only the absence of panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::uri::{escape_path, normalize, servlet};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let path = format!("/{s}");
    if let Ok(n) = normalize(&path) {
        assert!(n.starts_with('/'));
        assert!(!n.contains("//"), "{path:?} -> {n:?}");
        assert!(n.split('/').all(|seg| seg != "." && seg != ".."), "{path:?} -> {n:?}");
        if let Ok(v) = servlet(&n) {
            assert!(v.split('/').all(|seg| seg != "." && seg != ".."), "{n:?} -> {v:?}");
        }
        let e = escape_path(&n);
        assert!(e.bytes().all(|b| b > b' ' && b < 0x7f && b != b'?' && b != b'#'));
    }
});
