//! Head parser tests. Every case goes through `all_ways`: the whole input, byte by byte, and split in two at every
//! boundary must give the same head (or the same error), with `Ok(None)` before the head is complete.

use bytes::{BufMut, BytesMut};

use crate::{
    parse_request, parse_response, BodyKind, Limits, ParseError, RequestHead, ResponseHead, Version,
};

type Parsed<T> = Result<(T, Vec<u8>), ParseError>;

/// Feed `input` whole, byte by byte, and as every two-piece split; assert all agree; return the head and the
/// bytes left in the buffer (the start of the body). Large inputs are fed in 509-byte steps to bound test time.
fn all_ways<T: PartialEq + std::fmt::Debug>(
    input: &[u8],
    parse: impl Fn(&mut BytesMut) -> Result<Option<T>, ParseError>,
) -> Parsed<T> {
    let mut buf = BytesMut::from(input);
    let whole = match parse(&mut buf) {
        Ok(Some(h)) => Ok((h, buf.to_vec())),
        Ok(None) => panic!("incomplete input: {:?}", String::from_utf8_lossy(input)),
        Err(e) => Err(e),
    };
    let step = if input.len() > 4096 { 509 } else { 1 };

    // Byte by byte (or step by step): Ok(None) until the head is complete, then the same answer.
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let streamed = loop {
        assert!(
            fed < input.len(),
            "streaming never completed: {:?}",
            String::from_utf8_lossy(input)
        );
        let next = (fed + step).min(input.len());
        buf.put_slice(&input[fed..next]);
        fed = next;
        match parse(&mut buf) {
            Ok(None) => continue,
            Ok(Some(h)) => {
                buf.put_slice(&input[fed..]);
                break Ok((h, buf.to_vec()));
            }
            Err(e) => break Err(e),
        }
    };
    assert_eq!(
        streamed,
        whole,
        "byte-by-byte differs for {:?}",
        String::from_utf8_lossy(input)
    );

    // Every two-piece split.
    for k in (0..=input.len()).step_by(step) {
        let mut buf = BytesMut::from(&input[..k]);
        let got = match parse(&mut buf) {
            Ok(Some(h)) => {
                buf.put_slice(&input[k..]);
                Ok((h, buf.to_vec()))
            }
            Err(e) => Err(e),
            Ok(None) => {
                buf.put_slice(&input[k..]);
                match parse(&mut buf) {
                    Ok(Some(h)) => Ok((h, buf.to_vec())),
                    Ok(None) => panic!("split at {k} incomplete"),
                    Err(e) => Err(e),
                }
            }
        };
        assert_eq!(
            got,
            whole,
            "split at {k} differs for {:?}",
            String::from_utf8_lossy(input)
        );
    }
    whole
}

fn req_with(input: &[u8], limits: Limits) -> Parsed<RequestHead> {
    all_ways(input, |b| parse_request(b, &limits))
}

fn req(input: &[u8]) -> Parsed<RequestHead> {
    req_with(input, Limits::default())
}

fn ok_req(input: &[u8]) -> RequestHead {
    match req(input) {
        Ok((h, _)) => h,
        Err(e) => panic!("{:?} rejected: {e:?}", String::from_utf8_lossy(input)),
    }
}

fn err_req(input: &[u8]) -> ParseError {
    match req(input) {
        Ok((h, _)) => panic!("{:?} accepted: {h:?}", String::from_utf8_lossy(input)),
        Err(e) => e,
    }
}

fn res_with(input: &[u8], head: bool) -> Parsed<ResponseHead> {
    all_ways(input, |b| parse_response(b, &Limits::default(), head))
}

fn ok_res(input: &[u8]) -> ResponseHead {
    match res_with(input, false) {
        Ok((h, _)) => h,
        Err(e) => panic!("{:?} rejected: {e:?}", String::from_utf8_lossy(input)),
    }
}

fn err_res(input: &[u8]) -> ParseError {
    match res_with(input, false) {
        Ok((h, _)) => panic!("{:?} accepted: {h:?}", String::from_utf8_lossy(input)),
        Err(e) => e,
    }
}

/// `GET / HTTP/1.1` + Host + the given field lines.
fn with_fields(fields: &str) -> Vec<u8> {
    format!("POST /up HTTP/1.1\r\nHost: a.test\r\n{fields}\r\n").into_bytes()
}

// --- requests: shapes that parse ---

#[test]
fn typical_get_spans_and_accessors() {
    let input = b"GET /a/b?x=1&y HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: t\r\nX-Dup: one\r\nx-dup:  two  \r\n\r\n";
    let h = ok_req(input);
    assert_eq!(h.method_str(), "GET");
    assert_eq!(h.target_str(), "/a/b?x=1&y");
    assert_eq!(h.path_str(), "/a/b");
    assert_eq!(h.query_str(), Some("x=1&y"));
    assert_eq!(h.host_str(), Some("example.com:8080"));
    assert_eq!(h.version, Version::Http11);
    assert_eq!(h.body, BodyKind::Empty);
    assert!(h.keep_alive && !h.expect_continue && !h.upgrade);
    assert_eq!(h.header("x-dup"), Some(&b"one"[..]));
    assert_eq!(h.header("USER-AGENT"), Some(&b"t"[..]));
    assert_eq!(h.header("missing"), None);
    let names: Vec<&[u8]> = h.headers_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec![&b"Host"[..], b"User-Agent", b"X-Dup", b"x-dup"]);
    let last = h.headers_iter().last().map(|(_, v)| v);
    assert_eq!(last, Some(&b"two"[..]), "OWS trimmed");
    assert_eq!(&h.buf[..], &input[..], "buf is the raw head");
}

#[test]
fn body_bytes_stay_in_the_buffer() {
    let (h, rest) =
        req(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET").expect("ok");
    assert_eq!(h.body, BodyKind::Length(5));
    assert_eq!(rest, b"helloGET");
}

#[test]
fn content_length_zero_is_empty_and_max_fits() {
    assert_eq!(
        ok_req(&with_fields("Content-Length: 0\r\n")).body,
        BodyKind::Empty
    );
    let max = format!("Content-Length: {}\r\n", u64::MAX);
    assert_eq!(ok_req(&with_fields(&max)).body, BodyKind::Length(u64::MAX));
}

#[test]
fn chunked_request() {
    let h = ok_req(&with_fields("Transfer-Encoding: chunked\r\n"));
    assert_eq!(h.body, BodyKind::Chunked);
    let h = ok_req(&with_fields("Transfer-Encoding: , Chunked ,\r\n"));
    assert_eq!(
        h.body,
        BodyKind::Chunked,
        "case-insensitive, empty elements ignored"
    );
    assert_eq!(
        err_req(&with_fields(
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"
        )),
        ParseError::UnsupportedTransferCoding,
        "lines combine into one list"
    );
}

#[test]
fn leading_empty_lines_are_skipped() {
    let h = ok_req(b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(h.method_str(), "GET");
    assert!(h.buf.starts_with(b"GET "));
    assert_eq!(
        err_req(b"\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::BareLf
    );
    assert_eq!(
        err_req(b"\rGET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::BareCr
    );
}

#[test]
fn keep_alive_per_version_and_connection() {
    assert!(!ok_req(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
    assert!(ok_req(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
    assert!(!ok_req(b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").keep_alive);
    assert!(!ok_req(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: x, CLOSE\r\n\r\n").keep_alive);
    assert!(ok_req(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n\r\n").keep_alive);
}

#[test]
fn http10_without_host_is_fine() {
    let h = ok_req(b"GET /x HTTP/1.0\r\n\r\n");
    assert_eq!(h.version, Version::Http10);
    assert_eq!(h.host, None);
}

#[test]
fn expect_continue_only_on_http11() {
    assert!(
        ok_req(&with_fields(
            "Expect: 100-Continue\r\nContent-Length: 3\r\n"
        ))
        .expect_continue
    );
    assert!(!ok_req(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n").expect_continue);
    assert!(!ok_req(&with_fields("Expect: something\r\n")).expect_continue);
}

#[test]
fn upgrade_needs_connection_token_and_upgrade_field() {
    assert!(
        ok_req(&with_fields(
            "Connection: Upgrade\r\nUpgrade: websocket\r\n"
        ))
        .upgrade
    );
    assert!(!ok_req(&with_fields("Upgrade: websocket\r\n")).upgrade);
    assert!(!ok_req(&with_fields("Connection: upgrade\r\n")).upgrade);
    assert!(
        !ok_req(b"GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n").upgrade
    );
}

#[test]
fn obs_text_in_values_is_kept() {
    let h = ok_req(&with_fields("X-Name: caf\u{e9}\r\n"));
    assert_eq!(h.header("x-name"), Some("caf\u{e9}".as_bytes()));
}

// --- request-target forms ---

#[test]
fn absolute_form_takes_host_from_target() {
    let h = ok_req(b"GET http://Example.com:80/p/q?k=v HTTP/1.1\r\nHost: example.com:80\r\n\r\n");
    assert_eq!(h.host_str(), Some("Example.com:80"));
    assert_eq!(h.path_str(), "/p/q");
    assert_eq!(h.query_str(), Some("k=v"));
    assert_eq!(h.target_str(), "http://Example.com:80/p/q?k=v");
    let h = ok_req(b"GET HTTPS://a.test HTTP/1.1\r\nHost: a.test\r\n\r\n");
    assert_eq!(h.path_str(), "", "no path: empty, treated as /");
    let h = ok_req(b"GET http://a.test?x HTTP/1.0\r\n\r\n");
    assert_eq!((h.host_str(), h.query_str()), (Some("a.test"), Some("x")));
}

#[test]
fn absolute_form_rejects() {
    assert_eq!(
        err_req(b"GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n"),
        ParseError::HostMismatch
    );
    assert_eq!(
        err_req(b"GET http://a.test/ HTTP/1.1\r\nHost: a.test:80\r\n\r\n"),
        ParseError::HostMismatch
    );
    assert_eq!(
        err_req(b"GET http://a.test/ HTTP/1.1\r\n\r\n"),
        ParseError::MissingHost
    );
    assert_eq!(
        err_req(b"GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
        ParseError::InvalidAbsoluteForm
    );
    assert_eq!(
        err_req(b"GET http://u:p@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
        ParseError::InvalidAbsoluteForm
    );
    assert_eq!(
        err_req(b"GET http:///x HTTP/1.1\r\nHost: \r\n\r\n"),
        ParseError::InvalidAbsoluteForm
    );
    assert_eq!(
        err_req(b"GET http://:80/x HTTP/1.1\r\nHost: :80\r\n\r\n"),
        ParseError::InvalidAbsoluteForm
    );
}

#[test]
fn authority_form_only_with_connect() {
    let h = ok_req(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n");
    assert_eq!(h.target_str(), "a.test:443");
    assert_eq!(h.path_str(), "");
    assert_eq!(h.host_str(), Some("a.test:443"));
    assert_eq!(
        ok_req(b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n").path_str(),
        ""
    );
    assert_eq!(
        err_req(b"GET a.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n"),
        ParseError::AuthorityFormNotConnect
    );
    assert_eq!(
        err_req(b"CONNECT /x HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::ConnectWithoutAuthority
    );
    assert_eq!(
        err_req(b"CONNECT a.test HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::ConnectWithoutAuthority
    );
    assert_eq!(
        err_req(b"CONNECT * HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::ConnectWithoutAuthority
    );
    assert_eq!(
        err_req(b"GET foo HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::InvalidTarget
    );
}

#[test]
fn asterisk_form_only_with_options() {
    let h = ok_req(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!((h.path_str(), h.query), ("*", None));
    assert_eq!(
        err_req(b"GET * HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::AsteriskFormNotOptions
    );
}

#[test]
fn fragment_is_rejected() {
    assert_eq!(
        err_req(b"GET /a#f HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::FragmentInTarget
    );
    assert_eq!(
        err_req(b"GET /a?q#f HTTP/1.1\r\nHost: a\r\n\r\n"),
        ParseError::FragmentInTarget
    );
}

#[test]
fn bare_question_mark_is_an_empty_query() {
    let h = ok_req(b"GET /a? HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!((h.path_str(), h.query_str()), ("/a", Some("")));
}

// --- Host ---

#[test]
fn host_rules() {
    assert_eq!(err_req(b"GET / HTTP/1.1\r\n\r\n"), ParseError::MissingHost);
    assert_eq!(
        err_req(b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n"),
        ParseError::MultipleHost
    );
    for bad in ["a b", "a/b", "a@b", "a:x", "[::1", "[zz]:1", "a:123456"] {
        let input = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
        assert_eq!(err_req(input.as_bytes()), ParseError::InvalidHost, "{bad}");
    }
    for good in [
        "a",
        "a.test:8080",
        "[::1]",
        "[::1]:80",
        "10.0.0.1:1",
        "xn--d1a.test",
        "a:",
    ] {
        let input = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
        assert_eq!(ok_req(input.as_bytes()).host_str(), Some(good));
    }
    assert_eq!(
        ok_req(b"GET / HTTP/1.1\r\nHost:\r\n\r\n").host_str(),
        Some(""),
        "empty Host is valid"
    );
}

// --- framing hygiene ---

#[test]
fn content_length_and_transfer_encoding_conflict() {
    let e = err_req(&with_fields(
        "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
    ));
    assert_eq!(
        (e, e.status()),
        (ParseError::ContentLengthAndTransferEncoding, 400)
    );
    let e = err_req(&with_fields(
        "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
    ));
    assert_eq!(e, ParseError::ContentLengthAndTransferEncoding);
}

#[test]
fn content_length_shapes() {
    use ParseError::*;
    let cases: &[(&str, ParseError)] = &[
        (
            "Content-Length: 1\r\nContent-Length: 2\r\n",
            ConflictingContentLength,
        ),
        (
            "Content-Length: 7\r\nContent-Length: 7\r\n",
            DuplicateContentLength,
        ),
        ("Content-Length: 7, 7\r\n", ContentLengthList),
        ("Content-Length: 7,8\r\n", ContentLengthList),
        ("Content-Length: abc\r\n", InvalidContentLength),
        ("Content-Length: +5\r\n", InvalidContentLength),
        ("Content-Length: -1\r\n", InvalidContentLength),
        ("Content-Length: 0x10\r\n", InvalidContentLength),
        ("Content-Length: 1 2\r\n", InvalidContentLength),
        ("Content-Length:\r\n", InvalidContentLength),
        (
            "Content-Length: 18446744073709551616\r\n",
            ContentLengthOverflow,
        ),
        (
            "Content-Length: 99999999999999999999999\r\n",
            ContentLengthOverflow,
        ),
    ];
    for (fields, want) in cases {
        let e = err_req(&with_fields(fields));
        assert_eq!(e, *want, "{fields:?}");
        assert_eq!(e.status(), 400);
    }
}

#[test]
fn transfer_encoding_shapes() {
    use ParseError::*;
    let cases: &[(&str, ParseError, u16)] = &[
        ("Transfer-Encoding: gzip\r\n", ChunkedNotFinal, 400),
        ("Transfer-Encoding: chunked, gzip\r\n", ChunkedNotFinal, 400),
        ("Transfer-Encoding: foo\r\n", UnknownTransferCoding, 501),
        (
            "Transfer-Encoding: foo, chunked\r\n",
            UnknownTransferCoding,
            501,
        ),
        (
            "Transfer-Encoding: chunked;x=1\r\n",
            UnknownTransferCoding,
            501,
        ),
        (
            "Transfer-Encoding: gzip, chunked\r\n",
            UnsupportedTransferCoding,
            501,
        ),
        (
            "Transfer-Encoding: x-gzip, deflate, chunked\r\n",
            UnsupportedTransferCoding,
            501,
        ),
        ("Transfer-Encoding: chunked, chunked\r\n", ChunkedTwice, 400),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            ChunkedTwice,
            400,
        ),
        ("Transfer-Encoding:\r\n", EmptyTransferEncoding, 400),
        ("Transfer-Encoding: , ,\r\n", EmptyTransferEncoding, 400),
    ];
    for (fields, want, status) in cases {
        let e = err_req(&with_fields(fields));
        assert_eq!((e, e.status()), (*want, *status), "{fields:?}");
    }
    let e = err_req(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(e, ParseError::TransferEncodingHttp10);
}

// --- field syntax hygiene ---

#[test]
fn obs_fold_is_rejected() {
    assert_eq!(
        err_req(&with_fields("X-A: one\r\n two\r\n")),
        ParseError::ObsFold
    );
    assert_eq!(
        err_req(&with_fields("X-A: one\r\n\ttwo\r\n")),
        ParseError::ObsFold
    );
    assert_eq!(
        err_req(b"GET / HTTP/1.1\r\n Host: a\r\n\r\n"),
        ParseError::ObsFold
    );
}

#[test]
fn whitespace_before_colon_is_rejected() {
    assert_eq!(
        err_req(&with_fields("Content-Length : 5\r\n")),
        ParseError::WhitespaceBeforeColon
    );
    assert_eq!(
        err_req(&with_fields("X-A\t: 1\r\n")),
        ParseError::WhitespaceBeforeColon
    );
    assert_eq!(
        err_req(b"GET / HTTP/1.1\r\nHost : a\r\n\r\n"),
        ParseError::WhitespaceBeforeColon
    );
}

#[test]
fn invalid_name_bytes_are_rejected() {
    for fields in [
        "X-F@o: 1\r\n",
        ": 1\r\n",
        "X(a): 1\r\n",
        "X-\u{e9}: 1\r\n",
        "NoColon\r\n",
        "X\"y: 1\r\n",
    ] {
        assert_eq!(
            err_req(&with_fields(fields)),
            ParseError::InvalidHeaderName,
            "{fields:?}"
        );
    }
}

#[test]
fn control_bytes_in_values_are_rejected() {
    for fields in [
        "X-A: a\rb\r\n",
        "X-A: a\0b\r\n",
        "X-A: a\x01b\r\n",
        "X-A: a\x7fb\r\n",
        "X-A: \x1b\r\n",
    ] {
        let e = err_req(&with_fields(fields));
        assert_eq!(
            (e, e.status()),
            (ParseError::InvalidHeaderValue, 400),
            "{fields:?}"
        );
    }
}

#[test]
fn bare_lf_and_cr_line_ends_are_rejected() {
    assert_eq!(
        err_req(b"GET / HTTP/1.1\nHost: a\r\n\r\n"),
        ParseError::BareLf
    );
    assert_eq!(
        err_req(b"GET / HTTP/1.1\r\nHost: a\n\r\n"),
        ParseError::BareLf
    );
    assert_eq!(
        err_req(b"GET / HTTP/1.1\r\nHost: a\r\n\n"),
        ParseError::BareLf
    );
    assert_eq!(err_req(b"GET / HTTP/1.0\n\n"), ParseError::BareLf);
    assert_eq!(
        err_req(b"GET / HTTP/1.1\r\nHost: a\r\n\rX\r\n\r\n"),
        ParseError::BareCr
    );
}

// --- start line ---

#[test]
fn versions() {
    use ParseError::*;
    let cases: &[(&[u8], ParseError, u16)] = &[
        (
            b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
            UnsupportedVersion,
            505,
        ),
        (b"GET / HTTP/3\r\n\r\n", UnsupportedVersion, 505),
        (b"GET / HTTP/0.9\r\n\r\n", UnsupportedVersion, 505),
        (
            b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
            UnsupportedVersion,
            505,
        ),
        // The HTTP/2 prior-knowledge preface sent to an HTTP/1.1 listener.
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", UnsupportedVersion, 505),
        (b"GET /\r\n\r\n", MissingVersion, 400),
        (b"GET / http/1.1\r\nHost: a\r\n\r\n", MalformedVersion, 400),
        (b"GET / HTTP/11\r\nHost: a\r\n\r\n", MalformedVersion, 400),
        (b"GET / HTTP/1.1x\r\nHost: a\r\n\r\n", MalformedVersion, 400),
        (b"GET / HTTP/x.1\r\nHost: a\r\n\r\n", MalformedVersion, 400),
        (
            b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
            MalformedStartLine,
            400,
        ),
    ];
    for (input, want, status) in cases {
        let e = err_req(input);
        assert_eq!(
            (e, e.status()),
            (*want, *status),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn request_line_shapes() {
    use ParseError::*;
    let cases: &[(&[u8], ParseError)] = &[
        (b"G@T / HTTP/1.1\r\nHost: a\r\n\r\n", InvalidMethod),
        (b" GET / HTTP/1.1\r\nHost: a\r\n\r\n", InvalidMethod),
        (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", MalformedStartLine),
        (b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n", InvalidTarget),
        (b"GET /\xff HTTP/1.1\r\nHost: a\r\n\r\n", InvalidTarget),
    ];
    for (input, want) in cases {
        assert_eq!(
            err_req(input),
            *want,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
    assert_eq!(
        ok_req(b"PURGE /x HTTP/1.1\r\nHost: a\r\n\r\n").method_str(),
        "PURGE"
    );
}

// --- limits ---

fn small() -> Limits {
    Limits {
        max_headers: 4,
        max_head_bytes: 256,
        max_uri_bytes: 64,
    }
}

#[test]
fn uri_too_long_is_414() {
    let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(64));
    let e = req_with(long.as_bytes(), small()).expect_err("too long");
    assert_eq!((e, e.status()), (ParseError::UriTooLong, 414));
    let fits = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(63));
    assert!(req_with(fits.as_bytes(), small()).is_ok());
    // Default limits with a 9 KiB target, streamed: 414 as soon as the target passes the limit.
    let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9 * 1024));
    assert_eq!(
        req(long.as_bytes()).expect_err("too long"),
        ParseError::UriTooLong
    );
}

#[test]
fn head_too_large_is_431() {
    let big = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "b".repeat(256)
    );
    let e = req_with(big.as_bytes(), small()).expect_err("too big");
    assert_eq!((e, e.status()), (ParseError::HeadTooLarge, 431));
    let big = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "b".repeat(40 * 1024)
    );
    assert_eq!(
        req(big.as_bytes()).expect_err("too big"),
        ParseError::HeadTooLarge
    );
    // Incomplete and already over the limit: an error, not Ok(None).
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nX: "[..]);
    buf.put_slice(&[b'x'; 300]);
    assert_eq!(
        parse_request(&mut buf, &small()),
        Err(ParseError::HeadTooLarge)
    );
}

#[test]
fn too_many_headers_is_431() {
    let ok = with_fields("A: 1\r\nB: 2\r\nC: 3\r\n");
    assert_eq!(req_with(&ok, small()).map(|(h, _)| h.headers.len()), Ok(4));
    let many = with_fields("A: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n");
    let e = req_with(&many, small()).expect_err("too many");
    assert_eq!((e, e.status()), (ParseError::TooManyHeaders, 431));
    let hundred_one: String = (0..100).map(|i| format!("X-{i}: v\r\n")).collect();
    assert_eq!(
        err_req(&with_fields(&hundred_one)),
        ParseError::TooManyHeaders
    );
}

#[test]
fn max_headers_above_the_stack_slots_uses_the_heap() {
    let limits = Limits {
        max_headers: 300,
        ..Limits::default()
    };
    let fields: String = (0..250).map(|i| format!("X-{i}: v\r\n")).collect();
    let h = req_with(&with_fields(&fields), limits).expect("ok").0;
    assert_eq!(h.headers.len(), 251);
    assert_eq!(h.header("x-249"), Some(&b"v"[..]));
}

#[test]
fn errors_have_statuses_and_messages() {
    for e in [
        ParseError::MissingHost,
        ParseError::UriTooLong,
        ParseError::UnknownTransferCoding,
    ] {
        assert!(!e.to_string().is_empty());
    }
    assert_eq!(ParseError::ObsFold.status(), 400);
    assert_eq!(ParseError::TooManyHeaders.status(), 431);
    assert!(ParseError::InvalidChunkSize.is_body_error());
    assert!(!ParseError::ObsFold.is_body_error());
}

// --- responses ---

#[test]
fn response_with_length() {
    let (h, rest) = res_with(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nServer: o\r\n\r\nhiHTTP",
        false,
    )
    .expect("ok");
    assert_eq!(
        (h.status, h.reason_str(), h.version),
        (200, "OK", Version::Http11)
    );
    assert_eq!(h.body, BodyKind::Length(2));
    assert!(h.keep_alive);
    assert_eq!(h.header("server"), Some(&b"o"[..]));
    assert_eq!(rest, b"hiHTTP");
}

#[test]
fn response_framing() {
    let eof = ok_res(b"HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!((eof.body, eof.keep_alive), (BodyKind::Eof, false));
    let ch = ok_res(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!((ch.body, ch.keep_alive), (BodyKind::Chunked, true));
    for status in [
        "100 Continue",
        "101 Switching Protocols",
        "204 No Content",
        "304 Not Modified",
    ] {
        let input = format!("HTTP/1.1 {status}\r\nContent-Length: 10\r\n\r\n");
        assert_eq!(ok_res(input.as_bytes()).body, BodyKind::Empty, "{status}");
    }
    let head = res_with(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", true)
        .expect("ok")
        .0;
    assert_eq!((head.body, head.keep_alive), (BodyKind::Empty, true));
    assert_eq!(
        ok_res(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").body,
        BodyKind::Empty
    );
}

#[test]
fn response_keep_alive() {
    assert!(!ok_res(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n").keep_alive);
    assert!(
        ok_res(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n")
            .keep_alive
    );
    assert!(
        !ok_res(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n").keep_alive
    );
}

#[test]
fn response_framing_attacks_are_rejected() {
    use ParseError::*;
    let cases: &[(&[u8], ParseError)] = &[
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            ContentLengthAndTransferEncoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            ConflictingContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            DuplicateContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1,1\r\n\r\n",
            ContentLengthList,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            InvalidContentLength,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            ChunkedTwice,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: br, chunked\r\n\r\n",
            UnknownTransferCoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            UnsupportedTransferCoding,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            UnsupportedTransferCoding,
        ),
        (
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            TransferEncodingHttp10,
        ),
        (
            b"HTTP/1.1 204 No Content\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            ContentLengthAndTransferEncoding,
        ),
        (b"HTTP/1.1 200 OK\r\nX: a\n\r\n", BareLf),
        (b"HTTP/1.1 200 OK\nX: a\r\n\r\n", BareLf),
        (b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", ObsFold),
        (b"HTTP/1.1 200 OK\r\nX : a\r\n\r\n", WhitespaceBeforeColon),
        (b"HTTP/1.1 200 OK\r\nX: a\0\r\n\r\n", InvalidHeaderValue),
    ];
    for (input, want) in cases {
        assert_eq!(
            err_res(input),
            *want,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn response_status_lines() {
    use ParseError::*;
    let h = ok_res(b"HTTP/1.1 599\r\nContent-Length: 0\r\n\r\n");
    assert_eq!((h.status, h.reason_str()), (599, ""));
    let h = ok_res(b"HTTP/1.1 200 \xe9t\xe9\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(
        h.slice(h.reason),
        b"\xe9t\xe9",
        "obs-text reason kept as bytes"
    );
    let h = ok_res(b"HTTP/1.1 404 Not Found Here\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(h.reason_str(), "Not Found Here");
    let cases: &[(&[u8], ParseError)] = &[
        (b"HTTP/1.1 20 OK\r\n\r\n", InvalidStatus),
        (b"HTTP/1.1 099 X\r\n\r\n", InvalidStatus),
        (b"HTTP/1.1 600 X\r\n\r\n", InvalidStatus),
        (b"HTTP/1.1 2000 X\r\n\r\n", InvalidStatus),
        (b"HTTP/2.0 200 OK\r\n\r\n", UnsupportedVersion),
        (b"HTTP/1.1x 200 OK\r\n\r\n", MalformedVersion),
        (b"http/1.1 200 OK\r\n\r\n", MalformedVersion),
    ];
    for (input, want) in cases {
        assert_eq!(
            err_res(input),
            *want,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn pipelined_responses_parse_in_turn() {
    let mut buf = BytesMut::from(
        &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 204 No Content\r\n\r\n"[..],
    );
    let first = parse_response(&mut buf, &Limits::default(), false)
        .expect("ok")
        .expect("complete");
    assert_eq!(first.body, BodyKind::Length(3));
    let _body = buf.split_to(3);
    let second = parse_response(&mut buf, &Limits::default(), false)
        .expect("ok")
        .expect("complete");
    assert_eq!((second.status, second.body), (204, BodyKind::Empty));
    assert!(buf.is_empty());
}

// --- robustness ---

/// Deterministic xorshift so the mutation test needs no extra dependency and always runs the same cases.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Apply 1-3 random replace/insert/delete edits drawn from bytes that matter to the grammar.
fn mutate(seed: &[u8], state: &mut u64) -> Vec<u8> {
    const BYTES: &[u8] = b" \t\r\n:;,/?#@[]*0019aAzZ\x00\x7f\x80\xff";
    let mut input = seed.to_vec();
    for _ in 0..1 + xorshift(state) % 3 {
        let at = (xorshift(state) as usize) % input.len();
        let b = BYTES[(xorshift(state) as usize) % BYTES.len()];
        match xorshift(state) % 3 {
            0 => input[at] = b,
            1 => input.insert(at, b),
            _ => {
                input.remove(at);
            }
        }
    }
    input
}

/// Mutated heads never panic, and whole vs byte-by-byte vs split parsing agree on every one of them.
#[test]
fn mutated_heads_parse_consistently() {
    const SEEDS: &[&[u8]] = &[
        b"GET /a?b=c HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        b"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.0\r\nX: y\r\n\r\n",
    ];
    let mut state = 0x5eed_u64;
    for seed in SEEDS {
        for _ in 0..300 {
            let input = mutate(seed, &mut state);
            // Only complete heads are comparable; an incomplete one must simply stay Ok(None).
            let mut probe = BytesMut::from(&input[..]);
            if matches!(parse_request(&mut probe, &Limits::default()), Ok(None)) {
                continue;
            }
            let _ = req(&input);
        }
    }
}

/// The same for response heads (HEAD and non-HEAD requests).
#[test]
fn mutated_response_heads_parse_consistently() {
    const SEEDS: &[&[u8]] = &[
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nabc",
        b"HTTP/1.0 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
    ];
    let mut state = 0xfeed_u64;
    for seed in SEEDS {
        for i in 0..300 {
            let input = mutate(seed, &mut state);
            let mut probe = BytesMut::from(&input[..]);
            if matches!(
                parse_response(&mut probe, &Limits::default(), false),
                Ok(None)
            ) {
                continue;
            }
            let _ = res_with(&input, i % 2 == 0);
        }
    }
}

/// The word-wise compare used on hot-path names is exactly `eq_ignore_ascii_case` on every byte httparse accepts.
#[test]
fn eq_lower_matches_eq_ignore_ascii_case_on_accepted_bytes() {
    use super::fields::eq_lower;
    let accepted = (0u8..=255).filter(|&b| b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80);
    let targets: Vec<u8> = (b'a'..=b'z').chain(b'0'..=b'9').chain([b'-']).collect();
    for b in accepted {
        for &t in &targets {
            // Single bytes exercise the remainder path, 9-byte strings the 8-byte word path.
            assert_eq!(
                eq_lower(&[b], &[t]),
                b.eq_ignore_ascii_case(&t),
                "{b:#x} vs {t:#x}"
            );
            let x = [b; 9];
            let y = [t; 9];
            assert_eq!(
                eq_lower(&x, &y),
                x.eq_ignore_ascii_case(&y),
                "{b:#x} vs {t:#x}"
            );
        }
    }
    assert!(eq_lower(b"Transfer-Encoding", b"transfer-encoding"));
    assert!(!eq_lower(b"Transfer-Encodinf", b"transfer-encoding"));
    assert!(!eq_lower(b"chunked", b"chunk"));
}

#[test]
fn response_leading_empty_lines_and_spans() {
    let h = ok_res(b"\r\nHTTP/1.1 201 Created\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n");
    assert!(h.buf.starts_with(b"HTTP/1.1 201"));
    assert_eq!((h.status, h.reason_str()), (201, "Created"));
    assert_eq!(h.header("location"), Some(&b"/x"[..]));
}

#[test]
fn connection_options_flag_only_for_names_beyond_keep_alive_and_upgrade() {
    // The forwarder skips the per-field Connection lookup when this is false: it must be true whenever any
    // Connection field, in any case, names something other than keep-alive/upgrade (close included).
    for (fields, want) in [
        ("", false),
        ("Connection: keep-alive\r\n", false),
        ("Connection: Keep-Alive, UPGRADE\r\nUpgrade: x\r\n", false),
        ("Connection: ,, keep-alive ,\r\n", false),
        ("Connection: close\r\n", true),
        ("Connection: keep-alive\r\nconnection: X-Secret\r\n", true),
        ("CONNECTION: keep-alive, x-secret\r\n", true),
        ("Connection: keep-alivex\r\n", true),
    ] {
        let h = ok_req(&with_fields(fields));
        assert_eq!(h.connection_options, want, "request {fields:?}");
        let r = ok_res(format!("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n{fields}\r\n").as_bytes());
        assert_eq!(r.connection_options, want, "response {fields:?}");
    }
}

#[test]
fn method_str_maps_standard_methods_and_keeps_any_other_token() {
    for m in [
        "GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PURGE", "get",
        "M-SEARCH",
    ] {
        let h = ok_req(format!("{m} / HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
        assert_eq!(h.method_str(), m);
        assert_eq!(h.is_head(), m == "HEAD");
    }
}
