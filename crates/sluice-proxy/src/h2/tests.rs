//! How the dual-protocol port classifies a connection's opening bytes.

use std::time::Duration;

use super::{classify_line, next_pause, Opening, SNIFF_PAUSE_MAX};

#[test]
fn only_a_first_line_with_a_non_http_version_token_is_neither() {
    assert_eq!(
        classify_line(b"INVALID CONNECTION PREFACE\r\n\r\n"),
        Opening::Neither
    );
    assert_eq!(classify_line(b"GET / FTP/1.0\r\n"), Opening::Neither);
    for http1 in [
        &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"GET / http/1.1\r\n",
        b"GET / HTTP/2.0\r\n",
        b"GET /\r\n",
        b"GET / HTTP/1.1",
        b"INVALID CONNECTION",
        b"A B C D\r\n",
        b"",
    ] {
        assert_eq!(
            classify_line(http1),
            Opening::Http1,
            "{:?}",
            String::from_utf8_lossy(http1)
        );
    }
}

#[test]
fn partial_preface_rechecks_back_off_to_a_bounded_rate() {
    let mut p = Duration::from_millis(1);
    let mut waited = p;
    let mut checks = 1;
    // A client that stops mid-preface is re-checked until the header deadline: count the checks in 60 s.
    while waited < Duration::from_secs(60) {
        p = next_pause(p);
        waited += p;
        checks += 1;
    }
    assert_eq!(p, SNIFF_PAUSE_MAX);
    assert!(checks < 1_000, "{checks} re-checks in 60 s");
}
