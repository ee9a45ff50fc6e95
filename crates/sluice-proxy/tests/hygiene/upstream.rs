//! A malicious or broken upstream: its response is checked like a request (no response splitting).

use super::*;

/// An origin that answers every connection with `raw` once, then closes.
fn scripted(raw: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                if crate::head::read_head(&mut c).is_none() {
                    return;
                }
                let _ = c.write_all(raw);
            });
        }
    });
    addr
}

#[test]
fn malformed_upstream_heads_become_502_and_nothing_is_smuggled() {
    let cases: &[(&str, &'static [u8])] = &[
        ("CL + TE", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"),
        ("conflicting CL", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Length: 47\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"),
        ("obs-fold", b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n"),
        ("header injection bare CR", b"HTTP/1.1 200 OK\r\nX-A: a\rSet-Cookie: x=1\r\nContent-Length: 0\r\n\r\n"),
        ("space before colon", b"HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n"),
        ("bad status", b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n"),
        ("not HTTP", b"SSH-2.0-OpenSSH\r\n\r\n"),
        ("TE gzip", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
    ];
    for (what, raw) in cases {
        let up = scripted(raw);
        let gw = Gw::start(
            route_to(json!({up.to_string(): 1}), json!({"retries": 0})),
            ProxyConfig::default(),
        );
        let out = exchange(
            gw.addr,
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        );
        let text = String::from_utf8_lossy(&out);
        assert_eq!(status(&out), Some(502), "{what}: {text}");
        assert_eq!(responses(&out), 1, "{what}: {text}");
        assert!(!text.contains("smuggled"), "{what}: {text}");
    }
}

#[test]
fn bad_chunk_from_upstream_never_completes_a_response() {
    let up = scripted(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled");
    let gw = Gw::start(
        route_to(json!({up.to_string(): 1}), json!({"retries": 0})),
        ProxyConfig::default(),
    );
    let out = exchange(gw.addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    let text = String::from_utf8_lossy(&out);
    // Either refused before the head went out (502), or the head went out and the connection was cut without a
    // terminating chunk: the client can tell the response is incomplete. Never a second response.
    assert!(responses(&out) <= 1, "{text}");
    assert!(!text.contains("smuggled"), "{text}");
    assert!(!text.contains("hello"), "{text}");
    match status(&out) {
        Some(200) => assert!(
            !text.ends_with("0\r\n\r\n"),
            "a truncated body must not look complete: {text}"
        ),
        // Closed before anything was written (the head goes out with the first body bytes): also incomplete.
        None => assert!(out.is_empty(), "{text}"),
        other => assert_eq!(other, Some(502), "{text}"),
    }
}

/// An upstream `type` Sluice has no balancer for loads (APISIX accepts any type when it is written): a lone node is
/// served (APISIX picks it without a balancer), several nodes answer 500 (APISIX's balancer `require` fails), and
/// nothing reaches them.
#[test]
fn unknown_upstream_type_loads_a_lone_node_serves_several_answer_500() {
    let origin = Origin::start("hello");
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let res = json!({"routes": [
        {"id": "many", "uri": "/many", "upstream": {"type": "my_balancer",
            "nodes": {origin.addr.to_string(): 1, dead.to_string(): 1}}},
        {"id": "one", "uri": "/one", "upstream": {"type": "my_balancer", "nodes": {origin.addr.to_string(): 1}}}
    ]});
    let gw = Gw::start(res, ProxyConfig::default());
    let out = exchange(
        gw.addr,
        b"GET /many HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&out), Some(500), "{}", String::from_utf8_lossy(&out));
    assert_eq!(origin.conns.load(std::sync::atomic::Ordering::SeqCst), 0);
    let out = exchange(
        gw.addr,
        b"GET /one HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&out), Some(200), "{}", String::from_utf8_lossy(&out));
    assert!(String::from_utf8_lossy(&out).ends_with("hello"));
}

/// A length body sent in pieces of 513 bytes to 15 KB (each leaves in one vectored write) to a client that reads
/// late, so the gateway's writes come back partial: every byte arrives once and in order, and what the upstream
/// sends past its Content-Length (a second response) never reaches the client. (A partial write that ends inside
/// the head is `body::tests::a_length_body_behind_a_head_survives_partial_vectored_writes`.)
#[test]
fn length_body_in_pieces_to_a_late_reader_arrives_whole_and_alone() {
    const LEN: usize = 6 << 20;
    let body: Arc<Vec<u8>> = Arc::new(
        (0..LEN as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect(),
    );
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let up = l.local_addr().unwrap();
    let sent = body.clone();
    std::thread::spawn(move || {
        let Ok((mut c, _)) = l.accept() else { return };
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        if crate::head::read_head(&mut c).is_none() {
            return;
        }
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {LEN}\r\n\r\n");
        if c.write_all(head.as_bytes()).is_err() {
            return;
        }
        let (mut at, mut i) = (0, 0);
        while at < LEN {
            let n = [700, 3000, 9000, 513, 15000][i % 5].min(LEN - at);
            if c.write_all(&sent[at..at + n]).is_err() {
                return;
            }
            at += n;
            i += 1;
            if i % 16 == 0 {
                std::thread::sleep(Duration::from_micros(300));
            }
        }
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled");
    });
    let gw = Gw::start(
        route_to(json!({up.to_string(): 1}), json!({"retries": 0})),
        ProxyConfig::default(),
    );
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    // Not reading yet: the gateway fills the socket buffers and its writes come back partial.
    std::thread::sleep(Duration::from_millis(400));
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 65536];
    loop {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
    }
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    assert_eq!(status(&out), Some(200));
    assert_eq!(out.len() - end, LEN, "body length");
    assert!(out[end..] == body[..], "body bytes differ");
}
