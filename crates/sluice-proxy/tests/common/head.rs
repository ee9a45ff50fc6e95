//! For scripted origins in tests: read one request head off a connection. Included with `#[path]` by the test
//! binaries that need it.

use std::io::Read;

/// The bytes read until the end of the head (`\r\n\r\n`), or None when the peer closed or the read failed or
/// timed out first (the caller sets the timeout).
pub fn read_head(c: &mut impl Read) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buf)
}
