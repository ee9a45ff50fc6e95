//! Downstream and upstream connection handling: pipelined requests, `Connection: close` and HTTP/1.0 clients,
//! absolute-form targets, stale pooled connections retried transparently, the body size limit, and snapshots
//! published in process while clients keep their connections.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::gateway::{one_route, rr, test_config};
use crate::support::{t, Client, Gw, Mode, Origin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_answer_in_order() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(one_route("/*", rr(&[o.addr])));
        let mut c = Client::connect(gw.addr).await;
        c.send(
            b"GET /delay/50 HTTP/1.1\r\nHost: t\r\n\r\nPOST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc\
              GET /third HTTP/1.1\r\nHost: t\r\n\r\n",
        )
        .await;
        let r1 = c.read_response(false).await;
        let r2 = c.read_response(false).await;
        let r3 = c.read_response(false).await;
        assert_eq!(r1.header("x-seen-target"), Some("/delay/50"));
        assert_eq!(r2.text(), "abc");
        assert_eq!(r3.header("x-seen-target"), Some("/third"));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_and_http10() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(one_route("/*", rr(&[o.addr])));
        let mut c = Client::connect(gw.addr).await;
        c.send(b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await;
        let r = c.read_response(false).await;
        assert_eq!(r.status, 200);
        assert!(r.closes(), "{}", r.raw_head);
        assert!(c.is_closed().await);
        // The upstream side stays keep-alive regardless of the client.
        assert!(!o.last().has_header("connection"));

        let mut c = Client::connect(gw.addr).await;
        c.send(b"GET /b HTTP/1.0\r\nHost: t\r\n\r\n").await;
        let r = c.read_response(false).await;
        assert_eq!(r.status, 200);
        assert!(c.is_closed().await, "HTTP/1.0 without keep-alive closes");

        let mut c = Client::connect(gw.addr).await;
        c.send(b"GET /c HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\n")
            .await;
        let r = c.read_response(false).await;
        assert_eq!(
            r.header("connection")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("keep-alive")
        );
        c.send(b"GET /d HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\n")
            .await;
        assert_eq!(c.read_response(false).await.status, 200);
        assert_eq!(o.accepted(), 1, "one upstream connection for all of it");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_target_becomes_origin_form() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start(one_route("/abs", rr(&[o.addr])));
        let mut c = Client::connect(gw.addr).await;
        c.send(b"GET http://abs.test/abs?x=1 HTTP/1.1\r\nHost: abs.test\r\n\r\n")
            .await;
        assert_eq!(c.read_response(false).await.status, 200);
        assert_eq!(o.last().target, "/abs?x=1");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_pooled_connection_is_retried_transparently() {
    t(async {
        let o = Origin::with_mode("o", Mode::CloseAfterResponse).await;
        let gw = Gw::start(one_route("/*", rr(&[o.addr])));
        let mut c = Client::connect(gw.addr).await;
        for i in 0..20 {
            let r = if i % 2 == 0 {
                c.get("/s").await
            } else {
                c.request("DELETE", "/s", "", b"").await
            };
            assert_eq!(r.status, 200, "request {i}");
            // Give the origin's close time to land, so the pooled connection really is stale.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(o.count(), 20, "no request was sent twice to the origin");
        // Every request after the first found its pooled connection closed and reconnected.
        assert_eq!(o.accepted(), 20);
        assert_eq!(gw.gateway.upstream_connects(), 20);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_the_limit_is_413() {
    t(async {
        let o = Origin::start("o").await;
        let mut cfg = test_config();
        cfg.max_body = 1000;
        let gw = Gw::start_with(one_route("/*", rr(&[o.addr])), 1, cfg);
        let mut c = Client::connect(gw.addr).await;
        let r = c.request("POST", "/echo", "", &[b'a'; 1000]).await;
        assert_eq!(r.status, 200);
        let r = c.request("POST", "/echo", "", &[b'a'; 1001]).await;
        assert_eq!(r.status, 413);
        assert_eq!(o.count(), 1, "the oversized body never reached the origin");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publish_under_load_in_process() {
    let a = Origin::start("A").await;
    let b = Origin::start("B").await;
    let gw = Gw::start_with(one_route("/*", rr(&[a.addr])), 2, test_config());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (addr, stop) = (gw.addr, stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut bad = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 100_000 {
                let r = c.get("/x").await;
                if r.status != 200 {
                    bad.push(r.status);
                }
                n += 1;
            }
            (n, bad)
        }));
    }
    t(async {
        for i in 0..50 {
            let to = if i % 2 == 0 { &b } else { &a };
            gw.publish(one_route("/*", rr(&[to.addr])));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for task in tasks {
        let (n, bad) = t(task).await.expect("client");
        assert!(bad.is_empty(), "failed statuses: {bad:?}");
        total += n;
    }
    assert!(total > 200, "{total}");
    assert!(
        a.count() > 0 && b.count() > 0,
        "both snapshots served: A {} B {}",
        a.count(),
        b.count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_pooled_connection_with_request_body() {
    t(async {
        let o = Origin::with_mode("o", Mode::CloseAfterResponse).await;
        let gw = Gw::start(one_route("/*", rr(&[o.addr])));
        let mut c = Client::connect(gw.addr).await;
        let mut codes = Vec::new();
        for _ in 0..6 {
            let mut c2 = Client::connect(gw.addr).await;
            codes.push(c2.request("PUT", "/echo", "", b"small body").await.status);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(c.get("/s").await.status, 200);
        // nginx buffers the request body and replays an idempotent request on a stale keep-alive connection.
        assert!(codes.iter().all(|&s| s == 200), "{codes:?}");
    })
    .await
}
