//! Graceful shutdown: a request in flight when shutdown begins completes (200, announced `Connection: close`),
//! idle keep-alive connections are closed, the process exits 0 and the port refuses new connections afterwards.
//! Once through the binary with SIGQUIT (nginx's graceful stop; SIGTERM is the fast stop, tests/it/operations.rs),
//! once in process with `Gateway::shutdown`.

use std::time::{Duration, Instant};

use crate::support::gateway::{one_route, rr};
use crate::support::process::Sluice;
use crate::support::{t, Client, Gw, Origin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_drains_in_flight_request_and_exits_zero() {
    t(async {
        let o = Origin::start("o").await;
        let yaml = format!(
            "routes:\n  - uri: /*\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n#END\n",
            o.addr
        );
        let mut gw = Sluice::start(&yaml, 2).await;
        let mut idle = Client::connect(gw.addr).await;
        assert_eq!(idle.get("/warm").await.status, 200);
        let mut c = Client::connect(gw.addr).await;
        c.send(b"GET /delay/500 HTTP/1.1\r\nHost: t\r\n\r\n").await;
        // Wait until the origin holds the request, then ask the process to stop.
        let end = Instant::now() + Duration::from_secs(5);
        while o.in_flight() == 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(o.in_flight(), 1);
        let t0 = Instant::now();
        gw.signal("QUIT");
        let r = c.read_response(false).await;
        assert_eq!((r.status, r.text().as_str()), (200, "o"), "the in-flight request completes");
        assert!(r.closes(), "the drained connection is announced closed: {}", r.raw_head);
        assert!(c.is_closed().await);
        assert!(idle.is_closed().await, "idle keep-alive connections are closed");
        let st = gw.wait_exit(Duration::from_secs(8)).await;
        assert!(st.success(), "exit status {st}");
        assert!(t0.elapsed() < Duration::from_secs(5), "drain took {:?}", t0.elapsed());
        assert!(Client::try_connect(gw.addr).await.is_err(), "new connections are refused");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_shutdown_finishes_in_flight_and_stops_accepting() {
    t(async {
        let o = Origin::start("o").await;
        let gw = Gw::start_with(
            one_route("/*", rr(&[o.addr])),
            2,
            crate::support::gateway::test_config(),
        );
        let addr = gw.addr;
        let gateway = gw.gateway.clone();
        let mut c = Client::connect(addr).await;
        c.send(b"GET /delay/500 HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let end = Instant::now() + Duration::from_secs(5);
        while o.in_flight() == 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let reader = tokio::spawn(async move { c.read_response(false).await });
        gw.shutdown().await;
        let r = t(reader).await.expect("reader");
        assert_eq!(r.status, 200);
        assert_eq!(gateway.connections(), 0);
        assert!(
            Client::try_connect(addr).await.is_err(),
            "listeners are closed after join"
        );
    })
    .await
}
