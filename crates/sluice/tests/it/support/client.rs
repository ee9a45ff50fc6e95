//! A tiny raw HTTP/1.1 client over a tokio `TcpStream`: the test writes exact bytes and reads one response at a
//! time, framed by Content-Length, chunked or close, so it sees precisely what Sluice sent (head bytes, framing,
//! header case). It does no redirects, no pooling and no pipelining of its own.

use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::t;

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// The head exactly as received, status line to the blank line.
    pub raw_head: String,
    pub headers: Vec<(String, String)>,
    /// The decoded body.
    pub body: Vec<u8>,
    /// The body came chunked.
    pub chunked: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// Which origin answered (`X-Origin`), or "-" for a response Sluice made itself.
    pub fn origin(&self) -> String {
        self.header("x-origin").unwrap_or("-").to_owned()
    }
    /// Whether the server announced it closes the connection.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

pub struct Client {
    pub s: TcpStream,
    buf: BytesMut,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let s = t(TcpStream::connect(addr))
            .await
            .expect("connect to gateway");
        let _ = s.set_nodelay(true);
        Client {
            s,
            buf: BytesMut::with_capacity(16 * 1024),
        }
    }

    pub async fn try_connect(addr: SocketAddr) -> std::io::Result<Client> {
        let s = TcpStream::connect(addr).await?;
        Ok(Client {
            s,
            buf: BytesMut::new(),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        t(self.s.write_all(bytes)).await.expect("write to gateway");
    }

    /// `GET path` with `Host: host`, keep-alive.
    pub async fn get_host(&mut self, path: &str, host: &str) -> Response {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        self.send(req.as_bytes()).await;
        self.read_response(false).await
    }

    pub async fn get(&mut self, path: &str) -> Response {
        self.get_host(path, "test.local").await
    }

    /// A request with a method, extra header lines (each ending in CRLF) and a Content-Length body.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        extra: &str,
        body: &[u8],
    ) -> Response {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: test.local\r\n{extra}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.send(&req).await;
        self.read_response(method == "HEAD").await
    }

    async fn fill(&mut self) -> usize {
        self.buf.reserve(64 * 1024);
        t(self.s.read_buf(&mut self.buf)).await.unwrap_or(0)
    }

    /// Bytes until EOF (for "the server closed": returns what arrived).
    pub async fn read_to_eof(&mut self) -> Vec<u8> {
        while self.fill().await > 0 {}
        self.buf.split().to_vec()
    }

    /// Raw bytes until `end` has arrived (or EOF).
    pub async fn read_to_eof_or(&mut self, end: &[u8]) -> Vec<u8> {
        while !self.buf.windows(end.len()).any(|w| w == end) {
            if self.fill().await == 0 {
                break;
            }
        }
        self.buf.split().to_vec()
    }

    /// Whether the server closed the connection (EOF or reset) without sending anything more.
    pub async fn is_closed(&mut self) -> bool {
        self.buf.is_empty() && self.fill().await == 0
    }

    /// Reads just a response head (for 1xx interim responses and streaming checks).
    pub async fn read_head(&mut self) -> (u16, String, Vec<(String, String)>) {
        loop {
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut hs);
            match r.parse(&self.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let status = r.code.expect("status");
                    let headers = r
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_owned(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    let raw = String::from_utf8_lossy(&self.buf[..n]).into_owned();
                    self.buf.advance(n);
                    return (status, raw, headers);
                }
                Ok(httparse::Status::Partial) => {
                    if self.fill().await == 0 {
                        panic!(
                            "connection closed before a response head; got {:?}",
                            String::from_utf8_lossy(&self.buf)
                        );
                    }
                }
                Err(e) => panic!(
                    "invalid response head: {e}: {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
    }

    /// Reads whatever body bytes are available now or soon (at least one read), raw.
    pub async fn read_some(&mut self) -> Vec<u8> {
        if self.buf.is_empty() {
            self.fill().await;
        }
        self.buf.split().to_vec()
    }

    /// Reads one complete response. `head_request`: the response has no body whatever its headers say.
    pub async fn read_response(&mut self, head_request: bool) -> Response {
        let (status, raw_head, headers) = self.read_head().await;
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.trim().to_ascii_lowercase())
        };
        let mut body = Vec::new();
        let chunked = get("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        if head_request || status == 204 || status == 304 || (100..200).contains(&status) {
        } else if chunked {
            loop {
                let line = self.line().await;
                let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                    .unwrap_or_else(|_| panic!("bad chunk size line {line:?}"));
                if size == 0 {
                    while !self.line().await.is_empty() {}
                    break;
                }
                self.exact(size, &mut body).await;
                assert_eq!(self.line().await, "", "chunk data must end with CRLF");
            }
        } else if let Some(n) = get("content-length") {
            let n: usize = n.parse().expect("content-length");
            self.exact(n, &mut body).await;
        } else {
            body = self.read_to_eof().await;
        }
        Response {
            status,
            raw_head,
            headers,
            body,
            chunked,
        }
    }

    async fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = self.buf.split_to(i + 2);
                return String::from_utf8_lossy(&l[..i]).into_owned();
            }
            assert!(self.fill().await > 0, "closed inside a chunked body");
        }
    }

    async fn exact(&mut self, n: usize, out: &mut Vec<u8>) {
        out.reserve(n);
        let mut left = n;
        while left > 0 {
            if self.buf.is_empty() {
                assert!(
                    self.fill().await > 0,
                    "closed with {left} body bytes missing"
                );
            }
            let k = left.min(self.buf.len());
            out.extend_from_slice(&self.buf[..k]);
            self.buf.advance(k);
            left -= k;
        }
    }
}

/// One request on a fresh connection.
pub async fn get_once(addr: SocketAddr, path: &str) -> Response {
    Client::connect(addr).await.get(path).await
}
