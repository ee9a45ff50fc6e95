//! Any opening bytes of a connection on a PROXY protocol listener: no panic; a header is never longer than its
//! cap or than the bytes given; every prefix of a whole header is `Partial` or that same header (a header split
//! over reads is read the same), and an invalid opening stays invalid as more bytes arrive.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_proxy::proxy_protocol::{parse, Parsed, MAX_V1, MAX_V2};

fuzz_target!(|data: &[u8]| {
    let whole = parse(data);
    if let Parsed::Header { len, .. } = &whole {
        assert!(*len <= data.len() && *len <= MAX_V1.max(MAX_V2));
        for n in 0..*len {
            assert_eq!(parse(&data[..n]), Parsed::Partial, "prefix of {n} bytes");
        }
        assert_eq!(parse(&data[..*len]), whole);
    }
    if let Parsed::Invalid(_) = whole {
        let mut more = data.to_vec();
        more.extend_from_slice(b"\r\n");
        assert!(matches!(parse(&more), Parsed::Invalid(_)));
    }
});
