//! WebSocket through the real proxy: an in-process gateway on 127.0.0.1:0, an in-process `tokio-tungstenite`
//! echo origin, and a `tokio-tungstenite` client. As APISIX, only routes with `enable_websocket` pass the upgrade
//! on; the tunnel closes after the route's read timeout without traffic.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_proxy::{Gateway, Listeners, ProxyConfig, Running, Snapshot};
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket echo origin on its own thread; counts handshakes it completed and requests it refused.
struct Origin {
    addr: SocketAddr,
    upgraded: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl Origin {
    fn start() -> Origin {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let upgraded = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (u, r) = (upgraded.clone(), refused.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(l).unwrap();
                loop {
                    let Ok((s, _)) = l.accept().await else { return };
                    let (u, r) = (u.clone(), r.clone());
                    tokio::spawn(async move {
                        match tokio_tungstenite::accept_async(s).await {
                            Ok(mut ws) => {
                                u.fetch_add(1, Ordering::SeqCst);
                                while let Some(Ok(m)) = ws.next().await {
                                    if m.is_text() || m.is_binary() {
                                        if ws.send(m).await.is_err() {
                                            return;
                                        }
                                    } else if m.is_close() {
                                        return;
                                    }
                                }
                            }
                            Err(_) => {
                                r.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    });
                }
            });
        });
        Origin {
            addr,
            upgraded,
            refused,
        }
    }
}

struct Gw {
    gw: Gateway,
    addr: SocketAddr,
    running: Option<Running>,
}

impl Gw {
    fn start(res: Value) -> Gw {
        let res: Resources = serde_json::from_value(res).expect("resources");
        let gw = Gateway::new(
            ProxyConfig::default(),
            Snapshot::compile(&res, 1).expect("compiles"),
        );
        let l = Listeners::bind(&["127.0.0.1:0".parse().unwrap()], 1).expect("bind");
        let addr = l.local_addrs[0];
        let running = gw.start(l).expect("start");
        Gw {
            gw,
            addr,
            running: Some(running),
        }
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.gw.shutdown();
        if let Some(r) = self.running.take() {
            r.join();
        }
    }
}

fn route(o: &Origin, websocket: Option<bool>, read_timeout: f64) -> Value {
    let mut r = json!({"id": "ws", "uri": "/ws", "upstream": {
        "type": "roundrobin", "nodes": {o.addr.to_string(): 1},
        "timeout": {"connect": 2, "send": 2, "read": read_timeout}}});
    if let Some(w) = websocket {
        r["enable_websocket"] = json!(w);
    }
    json!({"routes": [r]})
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn websocket_echo_through_enabled_route() {
    let o = Origin::start();
    let gw = Gw::start(route(&o, Some(true), 5.0));
    let url = format!("ws://{}/ws", gw.addr);
    rt().block_on(async move {
        let (mut ws, resp) = tokio::time::timeout(
            Duration::from_secs(5),
            tokio_tungstenite::connect_async(url),
        )
        .await
        .expect("handshake in time")
        .expect("handshake");
        assert_eq!(resp.status().as_u16(), 101);
        assert!(resp.headers().get("sec-websocket-accept").is_some());
        for i in 0..20 {
            let text = format!("hello {i}");
            ws.send(Message::text(text.clone())).await.unwrap();
            let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(m.into_text().unwrap().as_str(), text);
        }
        let big = vec![7u8; 300_000];
        ws.send(Message::binary(big.clone())).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(m.into_data(), big);
        ws.close(None).await.unwrap();
    });
    assert_eq!(o.upgraded.load(Ordering::SeqCst), 1);
}

#[test]
fn websocket_refused_without_enable_websocket_like_apisix() {
    // APISIX clears Upgrade/Connection towards the upstream unless the route enables websocket: the origin sees
    // a plain GET and refuses it, so the client's handshake fails.
    let o = Origin::start();
    for flag in [None, Some(false)] {
        let gw = Gw::start(route(&o, flag, 5.0));
        let url = format!("ws://{}/ws", gw.addr);
        let r = rt().block_on(async move {
            tokio::time::timeout(
                Duration::from_secs(5),
                tokio_tungstenite::connect_async(url),
            )
            .await
            .expect("in time")
        });
        assert!(
            r.is_err(),
            "handshake must fail with enable_websocket {flag:?}"
        );
    }
    // The origin counts a refusal after writing its answer, so the client can see the answer first.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while o.refused.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(o.upgraded.load(Ordering::SeqCst), 0);
    assert_eq!(o.refused.load(Ordering::SeqCst), 2);
}

#[test]
fn websocket_idle_tunnel_closes_after_read_timeout() {
    let o = Origin::start();
    let gw = Gw::start(route(&o, Some(true), 1.0));
    let url = format!("ws://{}/ws", gw.addr);
    rt().block_on(async move {
        let (mut ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("handshake");
        ws.send(Message::text("x")).await.unwrap();
        let m = ws.next().await.unwrap().unwrap();
        assert_eq!(m.into_text().unwrap().as_str(), "x");
        let t0 = std::time::Instant::now();
        // Silence: the gateway must end the tunnel after ~1s.
        let end = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("closed before 5s");
        assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(800), "{waited:?}");
    });
}
