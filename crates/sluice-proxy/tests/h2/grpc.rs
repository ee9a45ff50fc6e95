//! gRPC pass-through: h2 downstream -> route with `scheme: grpc` -> an in-process h2 origin (the `h2` crate's
//! server) that echoes each DATA frame as it arrives and ends with `grpc-status` trailers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use sluice_proxy::ProxyConfig;

use super::{connect, rt, Gw};

/// Request heads the origin saw: (method, uri, te, content-type).
type Seen = Arc<Mutex<Vec<(String, String, Option<String>)>>>;

fn start_origin() -> (SocketAddr, Seen, Arc<AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let conns = Arc::new(AtomicUsize::new(0));
    let c2 = conns.clone();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let seen = s2.clone();
                c2.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        let seen = seen.clone();
                        tokio::spawn(async move {
                            seen.lock().unwrap().push((
                                req.method().to_string(),
                                req.uri().to_string(),
                                req.headers()
                                    .get("te")
                                    .map(|v| v.to_str().unwrap().to_owned()),
                            ));
                            let mut body = req.into_body();
                            let resp = http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(())
                                .unwrap();
                            let mut tx = respond.send_response(resp, false).unwrap();
                            while let Some(Ok(d)) = body.data().await {
                                let _ = body.flow_control().release_capacity(d.len());
                                if tx.send_data(d, false).is_err() {
                                    return;
                                }
                            }
                            let mut t = http::HeaderMap::new();
                            t.insert("grpc-status", "0".parse().unwrap());
                            t.insert("grpc-message", "all good".parse().unwrap());
                            let _ = tx.send_trailers(t);
                        });
                    }
                });
            }
        });
    });
    (addr, seen, conns)
}

fn grpc_route(addr: SocketAddr) -> serde_json::Value {
    json!({"routes": [{"id": "g", "uri": "/*", "upstream": {
        "scheme": "grpc", "type": "roundrobin", "nodes": {addr.to_string(): 1}}}]})
}

#[test]
fn grpc_bidi_stream_with_trailers_passes_through() {
    let (addr, seen, _) = start_origin();
    let gw = Gw::start(grpc_route(addr), ProxyConfig::default());
    let gw_addr = gw.addr;
    rt().block_on(async move {
        let c = connect(gw_addr).await;
        let mut c = c.ready().await.unwrap();
        let req = http::Request::post("http://svc.test/pkg.Echo/Say")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (resp, mut tx) = c.send_request(req, false).unwrap();
        tx.send_data(Bytes::from_static(b"\0\0\0\0\x01a"), false)
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), resp)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers().get("content-type").unwrap(),
            "application/grpc"
        );
        let mut body = resp.into_body();
        // The first message comes back before the client finished sending: streaming both ways.
        let d = tokio::time::timeout(Duration::from_secs(5), body.data())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(&d[..], b"\0\0\0\0\x01a");
        body.flow_control().release_capacity(d.len()).unwrap();
        tx.send_data(Bytes::from_static(b"\0\0\0\0\x01b"), true)
            .unwrap();
        let mut rest = Vec::new();
        while let Some(d) = body.data().await {
            let d = d.unwrap();
            body.flow_control().release_capacity(d.len()).unwrap();
            rest.extend_from_slice(&d);
        }
        assert_eq!(rest, b"\0\0\0\0\x01b");
        let trailers = body.trailers().await.unwrap().expect("trailers");
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        assert_eq!(trailers.get("grpc-message").unwrap(), "all good");
    });
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "POST");
    assert_eq!(seen[0].1, "http://svc.test/pkg.Echo/Say");
    assert_eq!(
        seen[0].2.as_deref(),
        Some("trailers"),
        "te: trailers must reach a gRPC upstream"
    );
}

#[test]
fn grpc_streams_share_one_upstream_connection_and_dead_node_is_502() {
    let (addr, seen, conns) = start_origin();
    let gw = Gw::start(grpc_route(addr), ProxyConfig::default());
    let gw_addr = gw.addr;
    rt().block_on(async move {
        let c = connect(gw_addr).await;
        let mut tasks = Vec::new();
        for i in 0..10 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = c.ready().await.unwrap();
                let req = http::Request::post(format!("http://svc/s/{i}"))
                    .header("te", "trailers")
                    .body(())
                    .unwrap();
                let (resp, mut tx) = c.send_request(req, false).unwrap();
                tx.send_data(Bytes::from(format!("m{i}")), true).unwrap();
                let resp = resp.await.unwrap();
                let mut body = resp.into_body();
                let mut got = Vec::new();
                while let Some(d) = body.data().await {
                    got.extend_from_slice(&d.unwrap());
                }
                let t = body.trailers().await.unwrap().unwrap();
                (
                    String::from_utf8(got).unwrap(),
                    t.get("grpc-status").cloned(),
                    i,
                )
            }));
        }
        for t in tasks {
            let (got, status, i) = t.await.unwrap();
            assert_eq!(got, format!("m{i}"));
            assert_eq!(status.unwrap(), "0");
        }
    });
    assert_eq!(seen.lock().unwrap().len(), 10);
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "one multiplexed upstream connection per node per worker"
    );
    drop(gw);

    // A node nobody listens on: the stream gets a 502 page, not a hang.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gw = Gw::start(grpc_route(dead), ProxyConfig::default());
    let gw_addr = gw.addr;
    rt().block_on(async move {
        let mut c = connect(gw_addr).await;
        let (s, _, _, _) = super::send(
            &mut c,
            http::Request::post("http://svc/x").body(()).unwrap(),
            &[b"x"],
        )
        .await;
        assert_eq!(s, 502);
    });
}
