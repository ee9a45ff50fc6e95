//! One HTTP/1.1 connection of the mock upstream: parses pipelined requests in place, skips their
//! bodies (Content-Length or chunked), and answers each with the prebuilt response after the
//! configured delay. It deliberately does not validate much: it exists to be cheap, not strict.
//! `/status/NNN` answers with status NNN (used by tests and error-counting benchmarks). A connection
//! opening with the HTTP/2 preface is handed to `h2c`.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::delay::XorShift;
use crate::h2c::PREFACE;
use crate::MockConfig;

/// Upper bound on a request head; larger ones close the connection.
const MAX_HEAD: usize = 64 * 1024;

enum Framing {
    Length(usize),
    Chunked,
}

struct Parsed {
    head_len: usize,
    framing: Framing,
    close: bool,
    status: Option<u16>,
}

/// Serves one accepted connection until the peer closes, errs, or asks to close.
pub(crate) async fn handle(mut stream: TcpStream, cfg: Arc<MockConfig>, seed: u64) {
    let _ = stream.set_nodelay(true);
    let mut rng = XorShift::new(seed);
    let mut rbuf = BytesMut::with_capacity(8 * 1024);
    let mut wbuf: Vec<u8> = Vec::with_capacity(cfg.response.len() * 2);
    // Bytes of a request body still to skip, carried across reads.
    let mut skip: usize = 0;
    // Sniff the first bytes: the HTTP/2 preface switches the connection to h2c.
    while rbuf.len() < PREFACE.len() && PREFACE.starts_with(&rbuf) {
        match stream.read_buf(&mut rbuf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    if rbuf.starts_with(PREFACE) {
        return crate::h2c::serve(stream, rbuf.freeze(), cfg, seed).await;
    }
    let mut first = true;
    loop {
        if !first {
            match stream.read_buf(&mut rbuf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        first = false;
        let mut close = false;
        loop {
            if skip > 0 {
                let n = skip.min(rbuf.len());
                rbuf.advance(n);
                skip -= n;
                if skip > 0 {
                    break;
                }
            }
            let parsed = match parse(&rbuf) {
                Ok(Some(p)) => p,
                Ok(None) if rbuf.len() > MAX_HEAD => return,
                Ok(None) => break,
                Err(()) => return,
            };
            match parsed.framing {
                Framing::Length(n) => {
                    rbuf.advance(parsed.head_len);
                    skip = n;
                }
                Framing::Chunked => match chunked_len(&rbuf[parsed.head_len..]) {
                    Some(Ok(n)) => rbuf.advance(parsed.head_len + n),
                    Some(Err(())) => return,
                    None if rbuf.len() > MAX_HEAD * 16 => return,
                    None => break,
                },
            }
            if !cfg.delay.is_zero() {
                // Flush earlier pipelined answers first so the delay applies per request.
                if !wbuf.is_empty() && stream.write_all(&wbuf).await.is_err() {
                    return;
                }
                wbuf.clear();
                tokio::time::sleep(cfg.delay.sample(&mut rng)).await;
            }
            match parsed.status {
                Some(code) => wbuf.extend_from_slice(&cfg.build_response(code, parsed.close)),
                None if parsed.close => {
                    wbuf.extend_from_slice(&cfg.build_response(cfg.status, true))
                }
                None => wbuf.extend_from_slice(&cfg.response),
            }
            if parsed.close {
                close = true;
                break;
            }
        }
        if !wbuf.is_empty() {
            if stream.write_all(&wbuf).await.is_err() {
                return;
            }
            wbuf.clear();
        }
        if close {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

fn parse(buf: &[u8]) -> Result<Option<Parsed>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let mut framing = Framing::Length(0);
    let mut close = req.version == Some(0);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or(())?;
            framing = Framing::Length(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if h.value.eq_ignore_ascii_case(b"chunked") {
                framing = Framing::Chunked;
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            if h.value.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if h.value.eq_ignore_ascii_case(b"keep-alive") {
                close = false;
            }
        }
    }
    let status = req
        .path
        .and_then(|p| p.strip_prefix("/status/"))
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|c| (100..=999).contains(c));
    Ok(Some(Parsed {
        head_len,
        framing,
        close,
        status,
    }))
}

/// Length of a complete chunked body (chunks, last chunk and trailers) at the start of `buf`, `None` if incomplete.
pub fn chunked_len(buf: &[u8]) -> Option<Result<usize, ()>> {
    let mut pos = 0;
    loop {
        let line_end = buf[pos..].windows(2).position(|w| w == b"\r\n")? + pos;
        let line = &buf[pos..line_end];
        let hex_end = line.iter().position(|b| *b == b';').unwrap_or(line.len());
        let size_str = match std::str::from_utf8(&line[..hex_end]) {
            Ok(s) => s.trim(),
            Err(_) => return Some(Err(())),
        };
        let size = match usize::from_str_radix(size_str, 16) {
            Ok(s) => s,
            Err(_) => return Some(Err(())),
        };
        pos = line_end + 2;
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                let end = buf[pos..].windows(2).position(|w| w == b"\r\n")? + pos;
                let empty = end == pos;
                pos = end + 2;
                if empty {
                    return Some(Ok(pos));
                }
            }
        }
        if buf.len() < pos + size + 2 {
            return None;
        }
        pos += size + 2;
    }
}
