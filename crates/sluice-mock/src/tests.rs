//! Real-socket tests of the mock on 127.0.0.1 with bounded timeouts.

use super::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn start(cfg: MockConfig) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(serve(l, Arc::new(cfg)));
    addr
}

/// Reads until `n` complete responses (Content-Length framed) have arrived; returns their status codes.
async fn read_responses(s: &mut TcpStream, n: usize) -> Vec<u16> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n {
        let mut chunk = [0u8; 4096];
        let r = tokio::time::timeout_at(deadline.into(), s.read(&mut chunk))
            .await
            .expect("timeout")
            .expect("read");
        assert!(r > 0, "unexpected EOF after {} responses", out.len());
        buf.extend_from_slice(&chunk[..r]);
        loop {
            let mut h = [httparse::EMPTY_HEADER; 16];
            let mut resp = httparse::Response::new(&mut h);
            let Ok(httparse::Status::Complete(head)) = resp.parse(&buf) else {
                break;
            };
            let len: usize = resp
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| {
                    std::str::from_utf8(h.value)
                        .expect("utf8")
                        .parse()
                        .expect("len")
                })
                .expect("content-length");
            if buf.len() < head + len {
                break;
            }
            out.push(resp.code.expect("code"));
            buf.drain(..head + len);
        }
    }
    out
}

#[tokio::test]
async fn keep_alive_pipelining_and_bodies() {
    let addr = start(MockConfig::new(100, Delay::Fixed(Duration::ZERO), 200)).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    // Three pipelined requests: plain GET, POST with a length body, chunked POST; then /status/503.
    let reqs = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n\
POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
GET /status/503 HTTP/1.1\r\nHost: x\r\n\r\n";
    // Split the write to exercise partial heads and bodies across reads.
    for part in reqs.chunks(7) {
        s.write_all(part).await.expect("write");
    }
    assert_eq!(read_responses(&mut s, 4).await, vec![200, 200, 200, 503]);
    // Still alive afterwards.
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_responses(&mut s, 1).await, vec![200]);
}

#[tokio::test]
async fn connection_close_is_honoured() {
    let addr = start(MockConfig::new(10, Delay::Fixed(Duration::ZERO), 200)).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut all))
        .await
        .expect("timeout")
        .expect("read");
    let text = String::from_utf8_lossy(&all);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("Connection: close"), "{text}");
    assert!(text.ends_with("xxxxxxxxxx"), "{text}");
}

#[tokio::test]
async fn delay_and_default_status_apply() {
    let addr = start(MockConfig::new(
        0,
        Delay::Fixed(Duration::from_millis(50)),
        204,
    ))
    .await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let t = Instant::now();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_responses(&mut s, 2).await, vec![204, 204]);
    // Each pipelined request gets its own delay.
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn run_binds_several_reuseport_listeners() {
    let a = bind_reuseport("127.0.0.1:0".parse().expect("addr")).expect("first");
    let addr = a.local_addr().expect("addr");
    let b = bind_reuseport(addr).expect("second listener on the same port");
    assert_eq!(b.local_addr().expect("addr"), addr);
}

#[test]
fn chunked_length() {
    assert_eq!(
        conn::chunked_len(b"5\r\nhello\r\n0\r\n\r\nNEXT"),
        Some(Ok(15))
    );
    assert_eq!(conn::chunked_len(b"5\r\nhel"), None);
    assert_eq!(conn::chunked_len(b"zz\r\n"), Some(Err(())));
}

#[tokio::test]
async fn serves_h2c_with_prior_knowledge() {
    let addr = start(MockConfig::new(100, Delay::Fixed(Duration::ZERO), 200)).await;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    for (path, want) in [("/", 200u16), ("/status/503", 503), ("/again", 200)] {
        let mut client = client.clone().ready().await.expect("ready");
        let req = http::Request::get(format!("http://{addr}{path}"))
            .body(())
            .expect("request");
        let (resp, _) = client.send_request(req, true).expect("send");
        let resp = tokio::time::timeout(Duration::from_secs(5), resp)
            .await
            .expect("timeout")
            .expect("response");
        assert_eq!(resp.status().as_u16(), want);
        let mut body = resp.into_body();
        let mut n = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("data");
            n += chunk.len();
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        assert_eq!(n, 100);
    }
}
