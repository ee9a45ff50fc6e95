//! google.api.http path templates (from proto resources) and request paths matched against them.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_grpc::PathTemplate;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (template, path) = s.split_once('\n').unwrap_or((s, "/v1/a/b:c"));
    if let Ok(t) = PathTemplate::parse(template) {
        let _ = t.matches(path);
        let _ = t.matches(template);
    }
    // As a request path against fixed templates.
    for t in [
        "/v1/{name=shelves/*/books/*}",
        "/v1/{a.b}/x/{rest=**}:verb",
        "/v1/**",
    ] {
        let _ = PathTemplate::parse(t).unwrap().matches(s);
    }
});
