//! Proxy semantics: keep-alive on both sides and the keepalive_pool, pass_host, X-Forwarded-*/X-Real-IP,
//! hop-by-hop removal, header order and case, connect/read timeouts (504) and refused/reset/closed upstreams (502),
//! retries (next node on connect failure; only idempotent methods once the request was sent).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::gateway::{one_route, rr};
use crate::support::{refused_addr, t, Client, Gw, Mode, Origin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upstream_connection_serves_many_requests() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(one_route("/*", rr(&[o.addr])));
        let mut c = Client::connect(gw.addr).await;
        for i in 0..200 {
            let r = c.get(&format!("/ka/{i}")).await;
            assert_eq!(r.status, 200);
            assert!(!r.closes());
        }
        assert_eq!(o.count(), 200);
        assert_eq!(o.accepted(), 1, "the origin saw one connection");
        assert_eq!(gw.gateway.upstream_connects(), 1);
        assert_eq!(gw.gateway.accepted(), 1);
        assert!(o.requests().iter().all(|r| r.conn == 0));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_pool_requests_quota_and_reuse_across_clients() {
    t(async {
        let o = Origin::start("o").await;
        let mut u = rr(&[o.addr]);
        u["keepalive_pool"] = json!({"size": 4, "idle_timeout": 60, "requests": 10});
        let gw = Gw::start(one_route("/*", u));
        let mut c = Client::connect(gw.addr).await;
        for _ in 0..50 {
            assert_eq!(c.get("/q").await.status, 200);
        }
        assert_eq!(
            gw.gateway.upstream_connects(),
            5,
            "a connection serves `requests` requests"
        );
        assert_eq!(o.accepted(), 5);
        // Sequential clients on fresh downstream connections share the pooled upstream connection.
        let before = o.accepted();
        for _ in 0..5 {
            let mut c = Client::connect(gw.addr).await;
            assert_eq!(c.get("/q").await.status, 200);
        }
        assert!(
            o.accepted() <= before + 1,
            "pooled connections are reused across clients"
        );

        // idle_timeout: a connection idle longer than that is not reused.
        let mut u = rr(&[o.addr]);
        u["keepalive_pool"] = json!({"size": 4, "idle_timeout": 0.2, "requests": 1000});
        gw.publish(one_route("/*", u));
        let mut c = Client::connect(gw.addr).await;
        assert_eq!(c.get("/q").await.status, 200);
        let before = gw.gateway.upstream_connects();
        assert_eq!(c.get("/q").await.status, 200);
        assert_eq!(gw.gateway.upstream_connects(), before, "reused while fresh");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(c.get("/q").await.status, 200);
        assert_eq!(
            gw.gateway.upstream_connects(),
            before + 1,
            "not reused after idle_timeout"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_host_pass_node_rewrite() {
    t(async {
        let o = Origin::start("o").await;
        let node = o.addr.to_string();
        let gw = Gw::start(json!({"routes": [
            {"id": 1, "uri": "/pass", "upstream": {"nodes": {node.clone(): 1}, "pass_host": "pass"}},
            {"id": 2, "uri": "/node", "upstream": {"nodes": {node.clone(): 1}, "pass_host": "node"}},
            {"id": 3, "uri": "/rewrite", "upstream": {"nodes": {node.clone(): 1}, "pass_host": "rewrite",
                                                     "upstream_host": "rewritten.test"}},
        ]}));
        let mut c = Client::connect(gw.addr).await;
        assert_eq!(c.get_host("/pass", "Client.Test:8080").await.status, 200);
        assert_eq!(o.last().header("host"), Some("Client.Test:8080"));
        c.get_host("/node", "client.test").await;
        assert_eq!(o.last().header("host"), Some(node.as_str()));
        c.get_host("/rewrite", "client.test").await;
        assert_eq!(o.last().header("host"), Some("rewritten.test"));
        // Exactly one Host line reaches the origin.
        assert_eq!(o.last().headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("host")).count(), 1);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(one_route("/*", rr(&[o.addr])));
        let port = gw.addr.port().to_string();
        let mut c = Client::connect(gw.addr).await;
        c.get_host("/f", "Front.Test:1234").await;
        let r = o.last();
        assert_eq!(r.header("x-forwarded-for"), Some("127.0.0.1"));
        assert_eq!(r.header("x-real-ip"), Some("127.0.0.1"));
        assert_eq!(r.header("x-forwarded-proto"), Some("http"));
        assert_eq!(r.header("x-forwarded-host"), Some("front.test"));
        assert_eq!(r.header("x-forwarded-port"), Some(port.as_str()));

        // An incoming X-Forwarded-For is extended; a client's X-Real-IP is replaced.
        let req = "GET /f HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: 1.2.3.4\r\nX-Real-IP: 6.6.6.6\r\n\r\n";
        c.send(req.as_bytes()).await;
        c.read_response(false).await;
        let r = o.last();
        assert_eq!(r.header("x-forwarded-for"), Some("1.2.3.4, 127.0.0.1"));
        assert_eq!(r.header("x-real-ip"), Some("127.0.0.1"));
        assert_eq!(r.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("x-real-ip")).count(), 1);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_removed_order_and_case_preserved() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(one_route("/*", rr(&[o.addr])));
        let mut c = Client::connect(gw.addr).await;
        let req = "GET /hop HTTP/1.1\r\nHost: a.test\r\nx-lower: 1\r\nConnection: keep-alive, X-Private\r\n\
                   X-UPPER: 2\r\nKeep-Alive: timeout=5\r\nX-Private: secret\r\nTE: trailers\r\n\
                   Proxy-Connection: keep-alive\r\nX-Mixed-Case: 3\r\nUpgrade: h2c\r\nX-Dup: a\r\nX-Dup: b\r\n\r\n";
        c.send(req.as_bytes()).await;
        let resp = c.read_response(false).await;
        assert_eq!(resp.status, 200);
        let r = o.last();
        for gone in ["connection", "keep-alive", "x-private", "te", "upgrade"] {
            assert!(!r.has_header(gone), "{gone} must not be forwarded: {:?}", r.headers);
        }
        let names: Vec<&str> = r
            .headers
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| n.starts_with("x-") || n.starts_with("X-"))
            .filter(|n| !n.to_ascii_lowercase().starts_with("x-forwarded") && !n.eq_ignore_ascii_case("x-real-ip"))
            .collect();
        assert_eq!(names, ["x-lower", "X-UPPER", "X-Mixed-Case", "X-Dup", "X-Dup"]);
        let dups: Vec<&str> = r.headers.iter().filter(|(n, _)| n == "X-Dup").map(|(_, v)| v.as_str()).collect();
        assert_eq!(dups, ["a", "b"]);

        // Response side: the origin's hop-by-hop fields (and those it names in Connection) do not reach the client.
        assert!(resp.header("x-secret").is_none(), "{}", resp.raw_head);
        assert!(resp.header("keep-alive").is_none(), "{}", resp.raw_head);
        assert_eq!(resp.header("x-kept"), Some("yes"));
        // Response header case passes through.
        assert!(resp.raw_head.contains("\r\nX-Origin: o\r\n"), "{}", resp.raw_head);
        assert!(!resp.closes());
        assert_eq!(c.get("/again").await.status, 200, "keep-alive survives");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_timeout_gives_504_and_refused_gives_502() {
    t(async {
        let slow = Origin::start("slow").await;
        let dead = refused_addr();
        let gw = Gw::start(json!({"routes": [
            {"id": 1, "uri": "/slow/*", "timeout": {"connect": 1, "send": 1, "read": 0.3},
             "upstream": {"nodes": {slow.addr.to_string(): 1}}},
            {"id": 2, "uri": "/upslow/*",
             "upstream": {"nodes": {slow.addr.to_string(): 1}, "timeout": {"connect": 1, "send": 1, "read": 0.3}}},
            {"id": 3, "uri": "/dead", "upstream": {"nodes": {dead.to_string(): 1}}},
        ]}));
        let mut c = Client::connect(gw.addr).await;
        let t0 = Instant::now();
        let r = c.get("/slow/delay/2000").await;
        assert_eq!(r.status, 504);
        assert!(t0.elapsed() < Duration::from_millis(1500), "{:?}", t0.elapsed());
        assert!(r.text().contains("504 Gateway Time-out") || r.text().contains("504"));
        let mut c = Client::connect(gw.addr).await;
        assert_eq!(c.get("/upslow/delay/2000").await.status, 504, "upstream timeout applies");
        let mut c = Client::connect(gw.addr).await;
        assert_eq!(c.get("/slow/delay/10").await.status, 200, "under the timeout");
        let r = c.get("/dead").await;
        assert_eq!(r.status, 502);
        assert_eq!(c.get("/slow/delay/1").await.status, 200, "a 502 keeps the client connection");
    })
    .await
}

/// A listener whose accept queue is full: SYNs go unanswered, so connecting times out.
fn blackhole() -> (
    std::net::TcpListener,
    Vec<std::net::TcpStream>,
    std::net::SocketAddr,
) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    // std listens with a backlog of 128; fill it (never accepting).
    let mut fill = Vec::new();
    for _ in 0..200 {
        match std::net::TcpStream::connect_timeout(&a, Duration::from_millis(50)) {
            Ok(s) => fill.push(s),
            Err(_) => break,
        }
    }
    (l, fill, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_gives_504() {
    t(async {
        let (_l, fill, hole) = blackhole();
        assert!(fill.len() < 200, "could not fill the accept queue");
        let gw = Gw::start(json!({"routes": [
            {"id": 1, "uri": "/ct", "timeout": {"connect": 0.2, "send": 1, "read": 1},
             "upstream": {"nodes": {hole.to_string(): 1}, "retries": 0}},
        ]}));
        let mut c = Client::connect(gw.addr).await;
        let t0 = Instant::now();
        assert_eq!(c.get("/ct").await.status, 504);
        assert!(
            t0.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t0.elapsed()
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_close_without_response_give_502() {
    t(async {
        let reset = Origin::with_mode("reset", Mode::Reset).await;
        let closer = Origin::with_mode("closer", Mode::Close).await;
        let gw = Gw::start(json!({"routes": [
            {"id": 1, "uri": "/reset", "upstream": {"nodes": {reset.addr.to_string(): 1}}},
            {"id": 2, "uri": "/close", "upstream": {"nodes": {closer.addr.to_string(): 1}}},
        ]}));
        let mut c = Client::connect(gw.addr).await;
        assert_eq!(c.get("/reset").await.status, 502);
        assert_eq!(c.get("/close").await.status, 502);
        assert_eq!(reset.count(), 1, "a single node is not retried");
        assert_eq!(closer.count(), 1);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_next_node_on_connect_failure() {
    t(async {
        let b = Origin::start("B").await;
        let dead = refused_addr();
        let gw = Gw::start(one_route("/*", rr(&[dead, b.addr])));
        let mut c = Client::connect(gw.addr).await;
        for _ in 0..10 {
            let r = c.request("POST", "/r", "", b"payload").await;
            assert_eq!(r.status, 200, "connect failures are retried for any method");
            assert_eq!(r.origin(), "B");
        }
        assert_eq!(b.count(), 10);

        // retries: 0 -> the request that lands on the dead node fails.
        let mut u = rr(&[dead, b.addr]);
        u["retries"] = json!(0);
        gw.publish(one_route("/*", u));
        let mut c = Client::connect(gw.addr).await;
        let mut codes = Vec::new();
        for _ in 0..4 {
            codes.push(c.get("/r").await.status);
        }
        assert!(codes.contains(&502) && codes.contains(&200), "{codes:?}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_idempotent_methods_retry_after_sending() {
    t(async {
        let a = Origin::with_mode("A", Mode::Close).await;
        let b = Origin::start("B").await;
        let gw = Gw::start(one_route("/*", rr(&[a.addr, b.addr])));
        let mut c = Client::connect(gw.addr).await;
        for _ in 0..4 {
            let r = c.get("/idem").await;
            assert_eq!((r.status, r.origin().as_str()), (200, "B"));
        }
        let mut codes = Vec::new();
        for _ in 0..4 {
            let mut c = Client::connect(gw.addr).await;
            codes.push(c.request("POST", "/post", "", b"x").await.status);
        }
        let failed = codes.iter().filter(|&&s| s == 502).count();
        assert!(
            failed >= 1,
            "a POST the upstream received is not replayed: {codes:?}"
        );
        let posts_a = a.requests().iter().filter(|r| r.method == "POST").count();
        let posts_b = b.requests().iter().filter(|r| r.method == "POST").count();
        assert_eq!(
            posts_a, failed,
            "every failed POST reached A and nothing else"
        );
        assert_eq!(posts_b, 4 - failed, "no POST was replayed to B");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_timeout_gives_504() {
    t(async {
        let stall = Origin::with_mode("stall", Mode::Stall).await;
        let gw = Gw::start(json!({"routes": [
            {"id": 1, "uri": "/up", "timeout": {"connect": 1, "send": 0.3, "read": 5},
             "upstream": {"nodes": {stall.addr.to_string(): 1}}},
        ]}));
        let mut c = Client::connect(gw.addr).await;
        const BODY: usize = 256 << 20;
        c.send(
            format!("POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: {BODY}\r\n\r\n").as_bytes(),
        )
        .await;
        let (mut rd, mut wr) = c.s.into_split();
        // The body is written by a task: it stalls with the origin, the response is read here meanwhile.
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let block = vec![b'b'; 1 << 20];
            for _ in 0..(BODY >> 20) {
                if wr.write_all(&block).await.is_err() {
                    return;
                }
            }
        });
        let t0 = Instant::now();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            use tokio::io::AsyncReadExt;
            let n = rd.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed without a response");
            got.extend_from_slice(&buf[..n]);
        }
        writer.abort();
        let head = String::from_utf8_lossy(&got).into_owned();
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
        assert!(
            head.starts_with("HTTP/1.1 504"),
            "nginx answers a send timeout with 504: {head}"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mid_response_closes_the_client_connection() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(json!({"routes": [
            {"id": 1, "uri": "/*", "timeout": {"connect": 1, "send": 1, "read": 0.3},
             "upstream": {"nodes": {o.addr.to_string(): 1}}},
        ]}));
        // The upstream closes inside a Content-Length body: the client gets the head and a short body, then EOF.
        let mut c = Client::connect(gw.addr).await;
        c.send(b"GET /truncate/5000 HTTP/1.1\r\nHost: t\r\n\r\n")
            .await;
        let (status, _, headers) = c.read_head().await;
        assert_eq!(status, 200);
        assert!(
            headers
                .iter()
                .any(|(n, v)| n.eq_ignore_ascii_case("content-length") && v == "10000"),
            "{headers:?}"
        );
        let rest = c.read_to_eof().await;
        assert_eq!(
            rest.len(),
            5000,
            "what the upstream sent, then the connection closes"
        );

        // The upstream stalls inside a chunked body (it sends nothing more until the gateway hangs up, so nothing
        // but the 0.3 s read timeout can end the response): same, no terminating chunk. The origin used to resume
        // after a fixed 500 ms; on a loaded machine the timeout could fire after that, the body then completed and
        // the client waited for a close that never came.
        let mut c = Client::connect(gw.addr).await;
        let t0 = Instant::now();
        c.send(b"GET /stall HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let (status, _, _) = c.read_head().await;
        assert_eq!(status, 200);
        let rest = c.read_to_eof().await;
        assert!(
            t0.elapsed() >= Duration::from_millis(300),
            "closed before the read timeout: {:?}",
            t0.elapsed()
        );
        let rest = String::from_utf8_lossy(&rest).into_owned();
        assert!(
            rest.contains("first") && !rest.ends_with("0\r\n\r\n"),
            "{rest:?}"
        );
    })
    .await
}
