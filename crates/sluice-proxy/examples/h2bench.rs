//! A gateway (1 worker, h2c + HTTP/1.1 on one port) in front of a minimal keep-alive HTTP/1.1 origin, for load
//! tools: `cargo run --release -p sluice-proxy --example h2bench` prints the port, then e.g.
//! `h2load -n 50000 -c 10 -m 10 http://127.0.0.1:PORT/` (h2c) or `h2load --h1 -n 50000 -c 10 ...` (HTTP/1.1).
//! With `H2BENCH_UPSTREAM=h2c` the origin speaks h2 (prior knowledge) and the route uses `scheme: h2c`, to measure
//! the HTTP/2-upstream path (`h2::upstream`) against the pooled HTTP/1.1 one.

use std::io::{Read, Write};

use sluice_model::Resources;
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Snapshot};

fn main() {
    let origin = std::net::TcpListener::bind("127.0.0.1:0").expect("bind origin");
    let oaddr = origin.local_addr().expect("origin addr");
    std::thread::spawn(move || {
        for c in origin.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let _ = c.set_nodelay(true);
                let mut buf = vec![0u8; 16384];
                let mut have = Vec::new();
                loop {
                    let n = match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    have.extend_from_slice(&buf[..n]);
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        have.drain(..end + 4);
                        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok";
                        if c.write_all(r).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let (oaddr, scheme) = match std::env::var("H2BENCH_UPSTREAM").as_deref() {
        Ok("h2c") => (h2_origin(), "h2c"),
        _ => (oaddr, "http"),
    };
    let res: Resources = serde_json::from_value(serde_json::json!({"routes": [
        {"id": "1", "uri": "/*", "upstream": {"type": "roundrobin", "scheme": scheme,
                                              "nodes": {oaddr.to_string(): 1}}}]}))
    .expect("resources");
    let gw = Gateway::new(
        ProxyConfig::default(),
        Snapshot::compile(&res, 1).expect("compiles"),
    );
    let l = Listeners::bind(&["127.0.0.1:0".parse().expect("addr")], 1).expect("bind");
    println!("{}", l.local_addrs[0].port());
    let running = gw.start(l).expect("start");
    running.join();
}

/// An h2 origin answering `ok` (content-length 2) to every stream.
fn h2_origin() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind h2 origin");
    l.set_nonblocking(true).expect("nonblocking");
    let addr = l.local_addr().expect("h2 origin addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).expect("listener");
            while let Ok((s, _)) = l.accept().await {
                let _ = s.set_nodelay(true);
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    while let Some(Ok((_req, mut respond))) = conn.accept().await {
                        let resp = http::Response::builder()
                            .header("content-length", "2")
                            .header("content-type", "text/plain")
                            .body(())
                            .expect("response");
                        if let Ok(mut tx) = respond.send_response(resp, false) {
                            let _ = tx.send_data(bytes::Bytes::from_static(b"ok"), true);
                        }
                    }
                });
            }
        });
    });
    addr
}
