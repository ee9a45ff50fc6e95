//! An upstream that answers before it has the whole request body: the answer reaches the client at once, the rest
//! of the body is not sent, that upstream connection is never reused (the upstream would read the rest of the body
//! as its next request), and the client connection closes because its body was not read to the end.

use std::sync::Mutex;

use super::smuggling::{parse_responses, read_one};
use super::*;

/// Per upstream connection, the request lines the origin parsed (or `garbage` when it could not).
type ConnLog = Arc<Mutex<Vec<Vec<String>>>>;

/// An origin that answers `POST /upload` with 413 as soon as it has the head and never reads that body: whatever
/// follows on the connection is parsed as the next request, as an out-of-step server would. Other requests get
/// `200` + their path. With `interim`, every request is first answered `100 Continue`, and bodies are read.
fn early_origin(interim: bool) -> (SocketAddr, ConnLog) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let log: ConnLog = Arc::default();
    let log2 = log.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let idx = {
                let mut g = log2.lock().unwrap();
                g.push(Vec::new());
                g.len() - 1
            };
            let log = log2.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(20)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let mut slots = [httparse::EMPTY_HEADER; 32];
                    let mut req = httparse::Request::new(&mut slots);
                    match req.parse(&buf) {
                        Ok(httparse::Status::Complete(n)) => {
                            let path = req.path.unwrap_or("").to_string();
                            let len: usize = req
                                .headers
                                .iter()
                                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                                .unwrap_or(0);
                            log.lock().unwrap()[idx].push(path.clone());
                            buf.drain(..n);
                            if interim {
                                let _ = c.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
                            }
                            let reply = if path == "/upload" && !interim {
                                "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n\r\nnope"
                                    .to_string()
                            } else {
                                while buf.len() < len {
                                    match c.read(&mut chunk) {
                                        Ok(0) | Err(_) => return,
                                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                                    }
                                }
                                let body = format!("{path} {len}");
                                buf.drain(..len);
                                format!(
                                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                                    body.len()
                                )
                            };
                            if c.write_all(reply.as_bytes()).is_err() {
                                return;
                            }
                            continue;
                        }
                        Ok(httparse::Status::Partial) => {}
                        Err(_) => {
                            log.lock().unwrap()[idx].push("garbage".into());
                            return;
                        }
                    }
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                }
            });
        }
    });
    (addr, log)
}

fn gateway(origin: SocketAddr) -> Gw {
    Gw::start(
        route_to(
            json!({origin.to_string(): 1}),
            json!({"retries": 0, "timeout": {"connect": 5, "send": 30, "read": 30}}),
        ),
        ProxyConfig::default(),
    )
}

/// The rest of what the gateway sends on `c` until it closes (EOF or reset), bounded by the read timeout.
fn until_close(c: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match c.read(&mut chunk) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(out),
            Err(e) => return Err(format!("not closed: {e}")),
        }
    }
}

/// The next request goes out on a fresh upstream connection, and the origin never parsed body bytes as a request.
fn next_request_is_clean(gw: &Gw, log: &ConnLog) {
    let out = exchange(
        gw.addr,
        b"GET /next HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    let r = parse_responses(&out);
    assert_eq!(r.len(), 1, "{:?}", String::from_utf8_lossy(&out));
    assert_eq!((r[0].status, &r[0].body[..]), (200, &b"/next 0"[..]));
    let conns = log.lock().unwrap().clone();
    assert!(
        conns.iter().all(|c| !c.iter().any(|p| p == "garbage")),
        "the origin parsed body bytes as a request: {conns:?}"
    );
    let upload = conns
        .iter()
        .position(|c| c.contains(&"/upload".to_string()));
    let next = conns.iter().position(|c| c.contains(&"/next".to_string()));
    assert!(
        upload.is_some() && next.is_some() && upload != next,
        "the early-answered connection was reused: {conns:?}"
    );
}

#[test]
fn early_answer_while_the_client_is_still_sending_reaches_it_and_the_connection_is_not_reused() {
    let (origin, log) = early_origin(false);
    let gw = gateway(origin);
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    c.write_all(&[b'x'; 1000]).unwrap();
    // The client waits for an answer before sending the rest: the gateway must pass the early one on.
    let got = read_one(&mut c);
    let text = String::from_utf8_lossy(&got).into_owned();
    let r = parse_responses(&got);
    assert_eq!(r.len(), 1, "no early answer: {text:?}");
    assert_eq!((r[0].status, &r[0].body[..]), (413, &b"nope"[..]), "{text}");
    assert_eq!(r[0].header("connection"), Some("close"), "{text}");
    // The rest of the body was never read: the client connection ends.
    let rest = until_close(&mut c).unwrap();
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    next_request_is_clean(&gw, &log);
}

#[test]
fn early_answer_while_the_upstream_stopped_reading_reaches_the_client() {
    let (origin, log) = early_origin(false);
    let gw = gateway(origin);
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // More than the socket buffers between gateway and origin hold: the gateway's write blocks.
    const BODY: usize = 32 << 20;
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let head = format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {BODY}\r\n\r\n");
        if w.write_all(head.as_bytes()).is_err() {
            return;
        }
        let block = vec![b'x'; 64 * 1024];
        for _ in 0..BODY / block.len() {
            if w.write_all(&block).is_err() {
                return;
            }
        }
    });
    let got = read_one(&mut c);
    let text = String::from_utf8_lossy(&got).into_owned();
    let r = parse_responses(&got);
    assert_eq!(r.len(), 1, "no early answer: {text:?}");
    assert_eq!((r[0].status, &r[0].body[..]), (413, &b"nope"[..]), "{text}");
    assert_eq!(r[0].header("connection"), Some("close"), "{text}");
    until_close(&mut c).unwrap();
    drop(c);
    writer.join().unwrap();
    next_request_is_clean(&gw, &log);
}

#[test]
fn interim_answers_while_sending_do_not_stop_the_body() {
    let (origin, log) = early_origin(true);
    let gw = gateway(origin);
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n")
        .unwrap();
    c.write_all(&[b'x'; 1000]).unwrap();
    // Give the origin's `100 Continue` time to arrive while the gateway waits for the rest of the body.
    std::thread::sleep(Duration::from_millis(200));
    c.write_all(&[b'x'; 1000]).unwrap();
    c.write_all(b"GET /again HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let out = until_close(&mut c).unwrap();
    let r = parse_responses(&out);
    let got: Vec<(u16, String)> = r
        .iter()
        .map(|r| (r.status, String::from_utf8_lossy(&r.body).into_owned()))
        .collect();
    assert_eq!(
        got,
        [
            (200, "/upload 2000".to_string()),
            (200, "/again 0".to_string())
        ],
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(
        log.lock().unwrap().clone(),
        [vec!["/upload".to_string(), "/again".to_string()]],
        "one upstream connection, kept"
    );
}
