//! Bodies: chunked both ways (re-chunked, decoded content intact), large bodies streamed in both directions
//! without being buffered whole (the first bytes reach the client before the origin has finished), read-to-close
//! responses, 100-continue, HEAD.

use std::time::{Duration, Instant};

use crate::support::gateway::{one_route, rr};
use crate::support::origin::pattern;
use crate::support::{t, Client, Gw, Origin};

async fn gw_for(o: &Origin) -> Gw {
    Gw::start(one_route("/*", rr(&[o.addr])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_and_response() {
    t(async {
        let o = Origin::start("o").await;
        let gw = gw_for(&o).await;
        let mut c = Client::connect(gw.addr).await;
        let req = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
                   5\r\nhello\r\n1;ext=1\r\n,\r\n6\r\n world\r\n0\r\n\r\n";
        c.send(req.as_bytes()).await;
        let r = c.read_response(false).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "hello, world");
        let got = o.last();
        assert_eq!(got.body, b"hello, world");
        assert!(got.chunked, "a chunked request is forwarded chunked");
        assert!(!got.has_header("content-length"));
        assert_eq!(
            got.headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
                .count(),
            1
        );

        // A chunked response reaches an HTTP/1.1 client chunked, content intact; the connection stays usable.
        let r = c.get("/chunked/50").await;
        assert!(r.chunked, "{}", r.raw_head);
        let want: String = (0..50).map(|i| format!("chunk-{i}\n")).collect();
        assert_eq!(r.text(), want);
        // A read-to-close response is re-framed chunked for the client, which keeps its connection.
        let r = c.get("/eof/100000").await;
        assert!(r.chunked, "{}", r.raw_head);
        assert_eq!(r.body.len(), 100_000);
        assert!(r
            .body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i as u64)));
        assert_eq!(c.get("/after").await.status, 200);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_client_gets_close_delimited_body() {
    t(async {
        let o = Origin::start("o").await;
        let gw = gw_for(&o).await;
        let mut c = Client::connect(gw.addr).await;
        c.send(b"GET /chunked/3 HTTP/1.0\r\nHost: t\r\n\r\n").await;
        let r = c.read_response(false).await;
        assert!(!r.chunked, "HTTP/1.0 cannot take chunked: {}", r.raw_head);
        assert_eq!(r.text(), "chunk-0\nchunk-1\nchunk-2\n");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_both_ways() {
    t(async {
        let o = Origin::start("o").await;
        let gw = gw_for(&o).await;
        let mut c = Client::connect(gw.addr).await;
        const DOWN: u64 = 8 << 20;
        let r = c.get(&format!("/large/{DOWN}")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len() as u64, DOWN);
        assert!(
            r.body
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(i as u64)),
            "corrupted"
        );

        // 4 MiB up with Content-Length, and 2 MiB chunked in odd-sized chunks.
        let up: Vec<u8> = (0..4u64 << 20).map(pattern).collect();
        let sum: u64 = up.iter().map(|&b| u64::from(b)).sum();
        let r = c.request("PUT", "/len", "", &up).await;
        assert_eq!(r.text(), format!("len={} sum={sum}", up.len()));
        let part = &up[..2 << 20];
        let mut req =
            b"POST /len HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for ch in part.chunks(70_001) {
            req.extend_from_slice(format!("{:x}\r\n", ch.len()).as_bytes());
            req.extend_from_slice(ch);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"0\r\n\r\n");
        c.send(&req).await;
        let r = c.read_response(false).await;
        let sum: u64 = part.iter().map(|&b| u64::from(b)).sum();
        assert_eq!(r.text(), format!("len={} sum={sum}", part.len()));
        assert_eq!(o.accepted(), 1, "all of it over one upstream connection");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_is_streamed_not_buffered() {
    t(async {
        let o = Origin::start("o").await;
        let gw = gw_for(&o).await;
        let mut c = Client::connect(gw.addr).await;
        let t0 = Instant::now();
        c.send(b"GET /slowstream HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let (status, _, _) = c.read_head().await;
        assert_eq!(status, 200);
        let first = c.read_some().await;
        let early = t0.elapsed();
        assert!(
            String::from_utf8_lossy(&first).contains("first"),
            "{first:?}"
        );
        assert!(
            early < Duration::from_millis(400),
            "first chunk took {early:?}: buffered?"
        );
        let rest = String::from_utf8_lossy(&c.read_to_eof_or(b"0\r\n\r\n").await).into_owned();
        assert!(rest.contains("second"), "{rest:?}");
        assert!(t0.elapsed() >= Duration::from_millis(450));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue() {
    t(async {
        let o = Origin::start("o").await;
        let gw = gw_for(&o).await;
        let mut c = Client::connect(gw.addr).await;
        c.send(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 7\r\n\r\n",
        )
        .await;
        let (status, _, _) = c.read_head().await;
        assert_eq!(
            status, 100,
            "the client is told to continue before it sends the body"
        );
        c.send(b"payload").await;
        let r = c.read_response(false).await;
        assert_eq!((r.status, r.text().as_str()), (200, "payload"));
        assert!(!o.last().has_header("expect"), "Expect is not forwarded");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_response_has_no_body() {
    t(async {
        let o = Origin::start("o").await;
        let gw = gw_for(&o).await;
        let mut c = Client::connect(gw.addr).await;
        c.send(b"HEAD /large/5000 HTTP/1.1\r\nHost: t\r\n\r\n")
            .await;
        let r = c.read_response(true).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), Some("5000"));
        // Nothing but the next response follows on the connection.
        let r = c.get("/next").await;
        assert_eq!((r.status, r.text().as_str()), (200, "o"));
    })
    .await
}
