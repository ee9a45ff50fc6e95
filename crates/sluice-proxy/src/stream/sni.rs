//! The SNI of a TLS ClientHello read ahead on a plain stream listener, without terminating TLS (passthrough): the
//! bytes read are kept and sent to the upstream first, so the upstream sees the handshake untouched.
//!
//! Hostile input is bounded: the whole hello (over as many TLS records as it spans) may hold at most
//! [`MAX_HELLO`] bytes and must arrive by a deadline; every length is checked against what encloses it.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The longest ClientHello accepted (handshake message body), larger than any real one (post-quantum key shares
/// included, ~2 KiB); a client sending more is closed.
pub(crate) const MAX_HELLO: usize = 16 * 1024;

/// At most this many reads to get a whole ClientHello.
const MAX_READS: u32 = 64;

/// What the opening bytes say.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// A complete ClientHello; its `server_name` (host_name) if it has one.
    Tls(Option<String>),
    /// Not a TLS handshake (or a malformed one): routed as a connection without SNI.
    NotTls,
    /// More bytes are needed.
    Partial,
    /// Larger than [`MAX_HELLO`]: closed.
    TooLarge,
}

/// Parses the bytes received so far.
pub(crate) fn parse(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::Partial;
    }
    if buf[0] != 0x16 {
        return Hello::NotTls;
    }
    // Reassemble the handshake layer from consecutive handshake records.
    let mut hs: Vec<u8> = Vec::new();
    let mut at = 0;
    loop {
        let Some(head) = buf.get(at..at + 5) else {
            return Hello::Partial;
        };
        if head[0] != 0x16 || head[1] != 0x03 {
            return Hello::NotTls;
        }
        let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if len == 0 || len > 16384 + 2048 {
            return Hello::NotTls;
        }
        let complete = buf.len() >= at + 5 + len;
        hs.extend_from_slice(&buf[at + 5..(at + 5 + len).min(buf.len())]);
        at += 5 + len;
        // The handshake header is judged as soon as its 4 bytes are in, even mid-record.
        if hs.len() >= 4 {
            if hs[0] != 0x01 {
                return Hello::NotTls;
            }
            let need = (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
            if need > MAX_HELLO {
                return Hello::TooLarge;
            }
            if hs.len() >= 4 + need {
                return match server_name(&hs[4..4 + need]) {
                    Ok(name) => Hello::Tls(name),
                    Err(()) => Hello::NotTls,
                };
            }
        }
        if !complete {
            return Hello::Partial;
        }
    }
}

/// A cursor over a byte slice whose reads fail past its end.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ()> {
        if self.0.len() < n {
            return Err(());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<usize, ()> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, ()> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Result<&'a [u8], ()> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Result<&'a [u8], ()> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// The host_name of a ClientHello body's server_name extension (RFC 6066 §3).
fn server_name(body: &[u8]) -> Result<Option<String>, ()> {
    let mut r = Rd(body);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.0.is_empty() {
        return Ok(None); // no extensions (SSL 3 / old TLS 1.0 clients)
    }
    let mut exts = Rd(r.vec16()?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != 0 {
            continue;
        }
        let mut list = Rd(Rd(data).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == 0 {
                if name.is_empty()
                    || name.len() > 253
                    || !name
                        .iter()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
                {
                    return Err(());
                }
                let s = std::str::from_utf8(name).map_err(drop)?;
                return Ok(Some(s.to_ascii_lowercase()));
            }
        }
        return Ok(None);
    }
    Ok(None)
}

/// What reading ahead gave: the bytes read (to send upstream first) and the SNI.
pub(crate) enum ReadAhead {
    Routed {
        buf: Vec<u8>,
        sni: Option<String>,
    },
    /// Close the connection (too large, or the client went away or stalled mid-hello).
    Close(&'static str),
}

/// Reads until the opening bytes tell a ClientHello (or not), within `deadline`. A client that sends nothing by
/// the deadline is routed without SNI (server-speaks-first protocols still work, after the wait); one that stalls
/// in the middle of a hello is closed.
pub(crate) async fn read_client_hello(stream: &mut TcpStream, deadline: Duration) -> ReadAhead {
    let mut buf = Vec::with_capacity(2048);
    let until = tokio::time::Instant::now() + deadline;
    // Real clients send a hello in one or two segments; a client dribbling it a few bytes at a time would make
    // each read re-parse everything so far: a bounded number of reads keeps that linear.
    let mut reads = 0;
    loop {
        match parse(&buf) {
            Hello::Tls(sni) => return ReadAhead::Routed { buf, sni },
            Hello::NotTls => return ReadAhead::Routed { buf, sni: None },
            Hello::TooLarge => return ReadAhead::Close("ClientHello too large"),
            Hello::Partial => {}
        }
        if buf.len() >= MAX_HELLO + 64 * 1024 {
            return ReadAhead::Close("ClientHello too large");
        }
        reads += 1;
        if reads > MAX_READS {
            return ReadAhead::Close("ClientHello sent in too many pieces");
        }
        buf.reserve(4096);
        match tokio::time::timeout_at(until, stream.read_buf(&mut buf)).await {
            Ok(Ok(0)) => return ReadAhead::Close("client closed before the ClientHello ended"),
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return ReadAhead::Close("read error"),
            Err(_) if buf.is_empty() => return ReadAhead::Routed { buf, sni: None },
            Err(_) => return ReadAhead::Close("ClientHello not complete in time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello made by rustls for `name`, as bytes on the wire.
    pub(crate) fn hello_for(name: &str) -> Vec<u8> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut c = rustls::ClientConnection::new(
            std::sync::Arc::new(cfg),
            rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        c.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn reads_the_sni_of_a_real_client_hello_at_every_split() {
        let h = hello_for("Db.Example.com");
        assert_eq!(parse(&h), Hello::Tls(Some("db.example.com".into())));
        for cut in 0..h.len() {
            assert_eq!(parse(&h[..cut]), Hello::Partial, "cut at {cut}");
        }
        // The same hello split over two records.
        let body = &h[5..];
        let mut two = vec![0x16, 3, 1, 0, 10];
        two.extend_from_slice(&body[..10]);
        let rest = body.len() - 10;
        two.extend_from_slice(&[0x16, 3, 1, (rest >> 8) as u8, rest as u8]);
        two.extend_from_slice(&body[10..]);
        assert_eq!(parse(&two), Hello::Tls(Some("db.example.com".into())));
    }

    #[test]
    fn hostile_openings() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(b"\x16\x03\x01\x00\x00"), Hello::NotTls);
        // A handshake that is not a ClientHello.
        assert_eq!(
            parse(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00"),
            Hello::NotTls
        );
        // A hello claiming more than the bound.
        assert_eq!(
            parse(b"\x16\x03\x01\x00\x04\x01\xff\xff\xff"),
            Hello::TooLarge
        );
        // Lengths pointing past their enclosure: every byte of a real hello flipped to 0xff in turn never
        // panics, and never yields a name that was not sent.
        let h = hello_for("a.example.com");
        for i in 5..h.len() {
            let mut m = h.clone();
            m[i] = 0xff;
            if let Hello::Tls(Some(n)) = parse(&m) {
                assert!(n == "a.example.com", "byte {i}: {n}");
            }
        }
        // A name with a byte DNS never has.
        let mut m = h.clone();
        let at = m.windows(13).position(|w| w == b"a.example.com").unwrap();
        m[at] = b'/';
        assert_eq!(parse(&m), Hello::NotTls);
        // A hello spread over many tiny records ends at its own length (here: garbage, so no SNI).
        let mut many = b"\x16\x03\x01\x00\x04\x01\x00\x40\x00".to_vec();
        for _ in 0..5000 {
            many.extend_from_slice(b"\x16\x03\x01\x00\x04AAAA");
        }
        assert_eq!(parse(&many), Hello::NotTls);
    }
}
