//! The PROXY protocol (HAProxy's, v1 text and v2 binary), as APISIX's `apisix.proxy_protocol` uses it:
//!
//! * on the listeners it names (`listen_http_port`, `listen_https_port`, and the stream listeners with
//!   `enable_tcp_pp`), every connection must open with a PROXY header; its source address becomes the
//!   connection's client address (`remote_addr`, ip-restriction, `X-Forwarded-For`, the access log, stream route
//!   matching). A connection whose opening is not a whole, valid header within the header timeout is closed
//!   unanswered, as nginx closes a `proxy_protocol` listener's connection on a "broken header".
//! * with `enable_tcp_pp_to_upstream`, the stream proxy opens each upstream connection with a v1 header naming
//!   the client and the listener (nginx stream's `proxy_protocol on`).
//!
//! Parsing is the `ppp` crate's (Apache-2.0); [`parse`] bounds it (107 bytes for v1 as the spec, [`MAX_V2`] for
//! v2) and is IO-free (fuzzed: `crates/sluice-proxy/fuzz`). [`read_header`] takes exactly the header's bytes off
//! the socket (peeking first), so what follows is read by HTTP, TLS or the stream proxy as if nothing came before.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ppp::{v1, v2, HeaderResult, PartialResult};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The longest v1 header (the spec's 107 bytes, CRLF included).
pub const MAX_V1: usize = 107;
/// The longest v2 header accepted, TLVs included (16 fixed bytes and up to 4080 of addresses and TLVs; HAProxy
/// sends a few dozen).
pub const MAX_V2: usize = 4096;

/// What the bytes received so far hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A prefix of a header that may still become valid: read more.
    Partial,
    /// A whole header of `len` bytes. `source` is the client it names (`None`: v1 `UNKNOWN`, v2 `LOCAL`, or an
    /// address family other than TCP/UDP over IPv4/IPv6: the connection's own peer stands).
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
    /// Not a PROXY header, or one that can never become valid: close.
    Invalid(&'static str),
}

const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// Parses the opening bytes of a connection.
pub fn parse(buf: &[u8]) -> Parsed {
    let starts = |sig: &[u8]| buf[..buf.len().min(sig.len())] == sig[..buf.len().min(sig.len())];
    if !starts(V2_SIGNATURE) {
        if !starts(b"PROXY ") {
            return Parsed::Invalid("not a PROXY protocol header");
        }
        // v1: the line is taken whole once its CRLF is in (a line cut anywhere, e.g. after a port's first digit,
        // is only a prefix), within the spec's 107 bytes.
        let Some(lf) = memchr::memchr(b'\n', &buf[..buf.len().min(MAX_V1)]) else {
            return if buf.len() >= MAX_V1 {
                Parsed::Invalid("PROXY header too long")
            } else {
                Parsed::Partial
            };
        };
        if lf == 0 || buf[lf - 1] != b'\r' {
            return Parsed::Invalid("PROXY v1 header not ended by CRLF");
        }
        return match HeaderResult::parse(&buf[..=lf]) {
            HeaderResult::V1(Ok(h)) => v1_parsed(&h),
            _ => Parsed::Invalid("malformed PROXY v1 header"),
        };
    }
    let res = HeaderResult::parse(buf);
    if res.is_incomplete() {
        let limit = match res {
            HeaderResult::V1(_) => MAX_V1,
            HeaderResult::V2(_) => MAX_V2,
        };
        // The v2 fixed part says how long the rest is: refuse an oversized one before reading it.
        if let HeaderResult::V2(_) = res {
            if buf.len() >= 16 && 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]])) > MAX_V2
            {
                return Parsed::Invalid("PROXY v2 header too long");
            }
        }
        return if buf.len() >= limit {
            Parsed::Invalid("PROXY header too long")
        } else {
            Parsed::Partial
        };
    }
    match res {
        HeaderResult::V1(_) => Parsed::Invalid("not a PROXY protocol header"),
        HeaderResult::V2(Ok(h)) => {
            let len = h.len();
            if len > MAX_V2 {
                return Parsed::Invalid("PROXY v2 header too long");
            }
            // Every TLV must fit its header (ppp checks this lazily, when they are iterated).
            if h.tlvs().any(|t| t.is_err()) {
                return Parsed::Invalid("PROXY v2 header with a malformed TLV");
            }
            let source = match (h.command, h.addresses) {
                (v2::Command::Local, _) => None,
                (_, v2::Addresses::IPv4(a)) => {
                    Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
                }
                (_, v2::Addresses::IPv6(a)) => {
                    Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
                }
                _ => None,
            };
            Parsed::Header { len, source }
        }
        HeaderResult::V2(Err(_)) => Parsed::Invalid("malformed PROXY v2 header"),
    }
}

fn v1_parsed(h: &v1::Header<'_>) -> Parsed {
    let source = match h.addresses {
        v1::Addresses::Tcp4(a) => {
            Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
        }
        v1::Addresses::Tcp6(a) => {
            Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
        }
        v1::Addresses::Unknown => None,
    };
    Parsed::Header {
        len: h.header.len(),
        source,
    }
}

/// Reads the PROXY header a connection must open with, within `wait`; returns the client it names (the peer
/// itself for `UNKNOWN`/`LOCAL`), or why the connection is to be closed. Only the header's bytes are consumed.
pub(crate) async fn read_header(
    stream: &mut TcpStream,
    peer: SocketAddr,
    wait: Duration,
) -> Result<SocketAddr, &'static str> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = vec![0u8; MAX_V2];
    // `peek` returns at once while bytes are queued, so a partial header is looked at again on a timer whose
    // pause doubles up to 64 ms: a client that stops mid-header costs a few wake-ups a second until the deadline.
    let mut pause = Duration::from_millis(1);
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(0)) => return Err("closed before the PROXY header"),
            Ok(Ok(n)) => n,
            Ok(Err(_)) => return Err("read error"),
            Err(_) => return Err("PROXY header not received in time"),
        };
        match parse(&buf[..n]) {
            Parsed::Header { len, source } => {
                stream
                    .read_exact(&mut buf[..len])
                    .await
                    .map_err(|_| "read error")?;
                return Ok(source.unwrap_or(peer));
            }
            Parsed::Invalid(why) => return Err(why),
            Parsed::Partial => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err("PROXY header not received in time");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(64));
    }
}

/// The v1 header nginx stream's `proxy_protocol on` sends: the client and the address it connected to
/// (`PROXY UNKNOWN` when their families differ).
pub fn v1_header(client: SocketAddr, local: SocketAddr) -> String {
    let canon = |a: SocketAddr| SocketAddr::new(crate::stream::canonical(a.ip()), a.port());
    let (c, l) = (canon(client), canon(local));
    match (c, l) {
        (SocketAddr::V4(c), SocketAddr::V4(l)) => format!(
            "PROXY TCP4 {} {} {} {}\r\n",
            c.ip(),
            l.ip(),
            c.port(),
            l.port()
        ),
        (SocketAddr::V6(c), SocketAddr::V6(l)) => format!(
            "PROXY TCP6 {} {} {} {}\r\n",
            c.ip(),
            l.ip(),
            c.port(),
            l.port()
        ),
        _ => "PROXY UNKNOWN\r\n".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
        let mut b = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        b.push(0x20 | cmd);
        b.push(fam);
        b.extend_from_slice(&(body.len() as u16).to_be_bytes());
        b.extend_from_slice(body);
        b
    }

    fn v4_body(tlvs: &[u8]) -> Vec<u8> {
        let mut body = vec![203, 0, 113, 7, 10, 0, 0, 1];
        body.extend_from_slice(&40000u16.to_be_bytes());
        body.extend_from_slice(&443u16.to_be_bytes());
        body.extend_from_slice(tlvs);
        body
    }

    #[test]
    fn v1_tcp4_tcp6_unknown() {
        let h = b"PROXY TCP4 192.0.2.10 10.0.0.1 51234 9181\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(h),
            Parsed::Header {
                len: 43,
                source: Some("192.0.2.10:51234".parse().unwrap())
            }
        );
        let h = b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 443\r\n";
        assert_eq!(
            parse(h),
            Parsed::Header {
                len: h.len(),
                source: Some("[2001:db8::7]:4000".parse().unwrap())
            }
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\nrest"),
            Parsed::Header {
                len: 15,
                source: None
            }
        );
    }

    #[test]
    fn every_prefix_of_a_header_is_partial() {
        let whole = b"PROXY TCP4 192.0.2.10 10.0.0.1 51234 9181\r\n";
        for n in 0..whole.len() {
            assert_eq!(parse(&whole[..n]), Parsed::Partial, "{n} bytes");
        }
        let whole = v2(1, 0x11, &v4_body(&[]));
        for n in 0..whole.len() {
            assert_eq!(parse(&whole[..n]), Parsed::Partial, "{n} bytes");
        }
    }

    #[test]
    fn v2_with_tlvs_and_local() {
        // An ALPN TLV and an authority TLV, as HAProxy sends them.
        let mut tlvs = vec![0x01, 0, 2];
        tlvs.extend_from_slice(b"h2");
        tlvs.extend_from_slice(&[0x02, 0, 11]);
        tlvs.extend_from_slice(b"example.com");
        let h = v2(1, 0x11, &v4_body(&tlvs));
        let mut with_data = h.clone();
        with_data.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(
            parse(&with_data),
            Parsed::Header {
                len: h.len(),
                source: Some("203.0.113.7:40000".parse().unwrap())
            }
        );
        // LOCAL (a health check from the balancer itself): the peer stands.
        let local = v2(0, 0x00, &[]);
        assert_eq!(
            parse(&local),
            Parsed::Header {
                len: 16,
                source: None
            }
        );
        let mut v6 = vec![0u8; 36];
        v6[15] = 9;
        v6[32..34].copy_from_slice(&8080u16.to_be_bytes());
        assert_eq!(
            parse(&v2(1, 0x21, &v6)),
            Parsed::Header {
                len: 52,
                source: Some("[::9]:8080".parse().unwrap())
            }
        );
    }

    #[test]
    fn what_an_attacker_sends_is_invalid() {
        let huge_v2 = v2(1, 0x11, &vec![0u8; MAX_V2]);
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 99999 2\r\n",
            b"PROXY TCP4 999.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 ::1 ::1 1 2\r\n",
            b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
            b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            // Version 1 in the v2 signature's version nibble; an unknown command.
            &[b"\r\n\r\n\0\r\nQUIT\n".as_slice(), &[0x11, 0x11, 0, 0]].concat(),
            &[b"\r\n\r\n\0\r\nQUIT\n".as_slice(), &[0x2f, 0x11, 0, 12]].concat(),
            &huge_v2,
        ] {
            assert!(
                matches!(parse(bad), Parsed::Invalid(_)),
                "{:?} accepted: {:?}",
                String::from_utf8_lossy(bad),
                parse(bad)
            );
        }
        // A v1 line that never ends is cut at 107 bytes.
        let long = format!("PROXY UNKNOWN {}", " ".repeat(200));
        assert!(matches!(parse(long.as_bytes()), Parsed::Invalid(_)));
        // A v2 length naming more than the cap is refused from its 16 fixed bytes, before the rest arrives.
        assert!(matches!(
            parse(&huge_v2[..16]),
            Parsed::Invalid("PROXY v2 header too long")
        ));
        // A v2 IPv4 header too short for its addresses; a TLV longer than what is left.
        assert!(matches!(
            parse(&v2(1, 0x11, &[1, 2, 3])),
            Parsed::Invalid(_)
        ));
        assert!(matches!(
            parse(&v2(1, 0x11, &v4_body(&[0x01, 0, 9, b'x']))),
            Parsed::Invalid(_)
        ));
    }

    /// The fuzz target's properties over every one-byte change of a few headers: no panic, a header's every
    /// prefix is `Partial`, an invalid opening stays invalid with more bytes.
    #[test]
    fn one_byte_changes_keep_the_invariants() {
        let mut tlvs = vec![0x01, 0, 2];
        tlvs.extend_from_slice(b"h2");
        let bases = [
            b"PROXY TCP4 192.0.2.10 10.0.0.1 51234 9181\r\nGET".to_vec(),
            b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 443\r\n".to_vec(),
            b"PROXY UNKNOWN\r\n".to_vec(),
            v2(1, 0x11, &v4_body(&tlvs)),
        ];
        for base in &bases {
            for i in 0..base.len() {
                for x in [0u8, 1, b' ', b'\r', b'\n', b'9', 0x20, 0x21, 0xff] {
                    let mut m = base.clone();
                    m[i] = x;
                    match parse(&m) {
                        Parsed::Header { len, .. } => {
                            assert!(len <= m.len());
                            for n in 0..len {
                                assert_eq!(parse(&m[..n]), Parsed::Partial, "{m:?} at {n}");
                            }
                        }
                        Parsed::Invalid(_) => {
                            let mut more = m.clone();
                            more.extend_from_slice(b"\r\n");
                            assert!(matches!(parse(&more), Parsed::Invalid(_)), "{m:?}");
                        }
                        Parsed::Partial => {}
                    }
                }
            }
        }
    }

    #[test]
    fn header_for_upstreams() {
        let c = "192.0.2.10:51234".parse().unwrap();
        let l = "10.0.0.1:9100".parse().unwrap();
        assert_eq!(
            v1_header(c, l),
            "PROXY TCP4 192.0.2.10 10.0.0.1 51234 9100\r\n"
        );
        let mapped = "[::ffff:192.0.2.10]:51234".parse().unwrap();
        assert_eq!(
            v1_header(mapped, l),
            "PROXY TCP4 192.0.2.10 10.0.0.1 51234 9100\r\n"
        );
        let v6 = "[2001:db8::7]:4000".parse().unwrap();
        assert_eq!(v1_header(v6, l), "PROXY UNKNOWN\r\n");
        let out = v1_header(c, l);
        assert!(matches!(parse(out.as_bytes()), Parsed::Header { .. }));
    }
}
