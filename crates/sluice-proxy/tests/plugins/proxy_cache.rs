//! proxy-cache through the real proxy (APISIX's t/plugin/proxy-cache/memory.t and disk.t, plus nginx's
//! proxy_cache rules for the disk strategy), and as an attacker would try it: poisoning through unkeyed headers,
//! private or cookie-carrying answers served to someone else, PURGE, path tricks, huge answers, torn files.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_model::{CacheZoneSection, ProxyCacheSection};
use sluice_plugins::{ProxyCacheZones, Shared};

use super::{request, Gw, Resp, Seen};

/// What the origin answers: status, headers, body, and whether to send the body chunked in pieces.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: bool,
}

impl Answer {
    fn ok(body: impl Into<Vec<u8>>) -> Answer {
        Answer {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            chunked: false,
        }
    }
    fn header(mut self, n: &str, v: &str) -> Answer {
        self.headers.push((n.into(), v.into()));
        self
    }
}

type Responder = Arc<dyn Fn(&Seen, usize) -> Answer + Send + Sync>;

/// An origin whose answers a test decides (`n` counts the requests it got, from 1).
struct CacheOrigin {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl CacheOrigin {
    fn start(f: impl Fn(&Seen, usize) -> Answer + Send + Sync + 'static) -> CacheOrigin {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let addr = l.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let f: Responder = Arc::new(f);
        let (h2, s2) = (hits.clone(), seen.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let (f, hits, seen) = (f.clone(), h2.clone(), s2.clone());
                std::thread::spawn(move || serve(c, f, hits, seen));
            }
        });
        CacheOrigin { addr, hits, seen }
    }
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }
}

fn serve(mut c: TcpStream, f: Responder, hits: Arc<AtomicUsize>, seen: Arc<Mutex<Vec<Seen>>>) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
            let body_len: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                .unwrap_or(0);
            let rec = Seen {
                method: req.method.unwrap_or("").to_owned(),
                target: req.path.unwrap_or("").to_owned(),
                headers: req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_owned(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect(),
                body: String::new(),
            };
            while buf.len() < n + body_len {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            }
            buf.drain(..n + body_len);
            let count = hits.fetch_add(1, Ordering::SeqCst) + 1;
            seen.lock().unwrap().push(rec.clone());
            let a = f(&rec, count);
            let mut head = format!("HTTP/1.1 {} X\r\nServer: origin\r\n", a.status);
            for (n, v) in &a.headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            let head_req = rec.method == "HEAD";
            if a.chunked {
                head.push_str("Transfer-Encoding: chunked\r\n\r\n");
                if c.write_all(head.as_bytes()).is_err() {
                    return;
                }
                for piece in a.body.chunks(64 << 10) {
                    let mut out = format!("{:x}\r\n", piece.len()).into_bytes();
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                    if c.write_all(&out).is_err() {
                        return;
                    }
                }
                if c.write_all(b"0\r\n\r\n").is_err() {
                    return;
                }
            } else {
                head.push_str(&format!("Content-Length: {}\r\n\r\n", a.body.len()));
                let mut out = head.into_bytes();
                if !head_req {
                    out.extend_from_slice(&a.body);
                }
                if c.write_all(&out).is_err() {
                    return;
                }
            }
            continue;
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
}

fn route_to(id: &str, uri: &str, origin: &CacheOrigin, plugins: Value) -> Value {
    json!({
        "id": id, "uri": uri, "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {origin.addr.to_string(): 1}}
    })
}

fn mem(extra: Value) -> Value {
    let mut c = json!({"cache_strategy": "memory", "cache_zone": "memory_cache"});
    if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    json!({ "proxy-cache": c })
}

fn status(r: &Resp) -> &str {
    r.header("Apisix-Cache-Status").unwrap_or("")
}

fn get(gw: &Gw, target: &str, headers: &[(&str, &str)]) -> Resp {
    request(gw.addr, "GET", target, headers, "")
}

/// A counter body: each origin answer differs, so a hit shows as the same body.
fn counting(_: &Seen, n: usize) -> Answer {
    Answer::ok(format!("answer {n}"))
}

#[test]
fn memory_miss_hit_purge_expire() {
    let o = CacheOrigin::start(counting);
    let gw = Gw::start(json!({"routes": [route_to("1", "/*", &o, mem(json!({"cache_ttl": 1})))]}));
    let r = get(&gw, "/hello", &[]);
    assert_eq!(
        (r.status, status(&r), r.body.as_str()),
        (200, "MISS", "answer 1")
    );
    let r = get(&gw, "/hello", &[]);
    assert_eq!(
        (r.status, status(&r), r.body.as_str()),
        (200, "HIT", "answer 1")
    );
    assert_eq!(o.hits(), 1);
    assert!(r.header("Age").is_some(), "{:?}", r.headers);
    // One Server and one Date: the origin's.
    assert_eq!(
        r.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("server"))
            .count(),
        1
    );
    assert_eq!(r.header("Server"), Some("origin"));
    assert_eq!(
        r.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("date"))
            .count(),
        1
    );
    // HEAD is answered from the cache without a body.
    let r = request(gw.addr, "HEAD", "/hello", &[], "");
    assert_eq!((status(&r), r.header("Content-Length")), ("HIT", Some("8")));
    // PURGE (anyone may, as in APISIX), then nothing left to purge.
    let r = request(gw.addr, "PURGE", "/hello", &[], "");
    assert_eq!((r.status, r.body.as_str()), (200, ""));
    let r = request(gw.addr, "PURGE", "/hello", &[], "");
    assert_eq!(r.status, 404);
    let r = get(&gw, "/hello", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("MISS", "answer 2"));
    std::thread::sleep(Duration::from_millis(1100));
    let r = get(&gw, "/hello", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("EXPIRED", "answer 3"));
    let r = get(&gw, "/hello", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("HIT", "answer 3"));
    // A method not in cache_method: APISIX says MISS and goes to the upstream.
    let r = request(gw.addr, "POST", "/hello", &[], "x");
    assert_eq!((status(&r), r.body.as_str()), ("MISS", "answer 4"));
}

#[test]
fn memory_apisix_rules() {
    let o = CacheOrigin::start(|s, n| {
        match s
            .target
            .split('?')
            .next()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap_or("")
        {
            "private" => Answer::ok(format!("p{n}")).header("Cache-Control", "private, max-age=60"),
            "nostore" => Answer::ok(format!("s{n}")).header("Cache-Control", "no-store"),
            "cookie" => Answer::ok(format!("c{n}")).header("Set-Cookie", &format!("sid=secret{n}")),
            "lang" => Answer::ok(format!(
                "lang {} {n}",
                s.header("accept-language").unwrap_or("-")
            ))
            .header("Vary", "Accept-Language"),
            "star" => Answer::ok(format!("v{n}")).header("Vary", "*"),
            "err" => Answer {
                status: 500,
                ..Answer::ok(format!("e{n}"))
            },
            "headers" => Answer::ok(format!("h{n}"))
                .header("Cache-Control", "max-age=60")
                .header("Expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
            _ => Answer::ok(format!("x{n}")),
        }
    });
    let gw = Gw::start(json!({"routes": [
        route_to("1", "/*", &o, mem(json!({"cache_bypass": ["$arg_bypass"], "no_cache": ["$arg_nocache"]}))),
        route_to("2", "/hidden/*", &o, mem(json!({"hide_cache_headers": true}))),
        route_to("3", "/cc/*", &o, mem(json!({"cache_control": true}))),
        route_to("4", "/opt/*", &o, mem(json!({"cache_set_cookie": true}))),
    ]}));
    let twice = |t: &str, h: &[(&str, &str)]| (get(&gw, t, h), get(&gw, t, h));
    // Never stored: private, no-store, Set-Cookie, Vary: *, a status not listed.
    for path in ["/private", "/nostore", "/cookie", "/star", "/err"] {
        let (a, b) = twice(path, &[]);
        assert_ne!(a.body, b.body, "{path} was served from the cache");
        assert_eq!(status(&b), "MISS", "{path}");
    }
    // The second client never gets the first one's cookie.
    let (a, b) = twice("/cookie", &[]);
    assert_ne!(a.header("Set-Cookie"), b.header("Set-Cookie"));
    // cache_set_cookie opts in.
    let (_, b) = twice("/opt/cookie", &[]);
    assert_eq!(status(&b), "HIT");
    // Vary: one answer per Accept-Language, never another's.
    let en = get(&gw, "/lang", &[("Accept-Language", "en")]);
    let fr = get(&gw, "/lang", &[("Accept-Language", "fr")]);
    assert_eq!((status(&en), status(&fr)), ("MISS", "MISS"));
    let en2 = get(&gw, "/lang", &[("Accept-Language", "en")]);
    let fr2 = get(&gw, "/lang", &[("Accept-Language", "fr")]);
    assert_eq!((status(&en2), en2.body.as_str()), ("HIT", en.body.as_str()));
    assert_eq!((status(&fr2), fr2.body.as_str()), ("HIT", fr.body.as_str()));
    assert!(fr2.body.starts_with("lang fr"));
    // cache_bypass and no_cache.
    let (_, b) = twice("/plain?bypass=1", &[]);
    assert_eq!(status(&b), "BYPASS");
    let (_, b) = twice("/plain?bypass=0", &[]);
    assert_eq!(status(&b), "HIT");
    let (_, b) = twice("/plain2?nocache=1", &[]);
    assert_eq!(status(&b), "MISS");
    // hide_cache_headers: Cache-Control and Expires never reach the client, stored or not.
    let (a, b) = twice("/hidden/headers", &[]);
    assert_eq!(status(&b), "HIT");
    for r in [&a, &b] {
        assert!(
            r.header("Cache-Control").is_none() && r.header("Expires").is_none(),
            "{:?}",
            r.headers
        );
    }
    let (_, b) = twice("/headers", &[]);
    assert_eq!(
        (status(&b), b.header("Cache-Control")),
        ("HIT", Some("max-age=60"))
    );
    // cache_control: the request's no-cache bypasses, only-if-cached answers 504 on a miss, max-age=0 is stale.
    let (_, b) = twice("/cc/headers", &[]);
    assert_eq!(status(&b), "HIT");
    let r = get(&gw, "/cc/headers", &[("Cache-Control", "no-cache")]);
    assert_eq!(status(&r), "BYPASS");
    let r = get(&gw, "/cc/other", &[("Cache-Control", "only-if-cached")]);
    assert_eq!(r.status, 504);
    std::thread::sleep(Duration::from_millis(1100));
    let r = get(&gw, "/cc/headers", &[("Cache-Control", "max-age=0")]);
    assert_eq!(status(&r), "STALE");
    // Without a freshness of its own, an answer is not stored under cache_control.
    let (_, b) = twice("/cc/plain", &[]);
    assert_eq!(status(&b), "MISS");
}

#[test]
fn poisoning_through_unkeyed_headers() {
    // The origin reflects what it was told about the host.
    let o = CacheOrigin::start(|s, _| {
        Answer::ok(format!(
            "host={} xfh={}",
            s.header("host").unwrap_or("-"),
            s.header("x-forwarded-host").unwrap_or("-")
        ))
    });
    let vary = CacheOrigin::start(|s, _| {
        Answer::ok(format!(
            "xfh={}",
            s.header("x-forwarded-host").unwrap_or("-")
        ))
        .header("Vary", "X-Forwarded-Host")
    });
    let gw = Gw::start(json!({"routes": [
        route_to("1", "/a/*", &o, mem(json!({}))),
        route_to("2", "/v/*", &vary, mem(json!({}))),
        route_to("3", "/k/*", &o, mem(json!({"cache_key": ["$host", "$request_uri", "$http_x_forwarded_host"]}))),
    ]}));
    // Host is in the key: an attacker's Host gets its own entry.
    let evil = get(&gw, "/a/x", &[("Host", "evil.example")]);
    let victim = get(&gw, "/a/x", &[("Host", "shop.example")]);
    assert_eq!(status(&victim), "MISS");
    assert!(victim.body.contains("host=shop.example"), "{}", victim.body);
    assert!(evil.body.contains("evil"));
    // Absolute-form request-target naming another host: its own key too.
    let r = get(&gw, "http://evil.example/a/y", &[("Host", "shop.example")]);
    let victim = get(&gw, "/a/y", &[("Host", "shop.example")]);
    assert_eq!(
        status(&victim),
        "MISS",
        "{:?} then {:?}",
        r.body,
        victim.body
    );
    // X-Forwarded-Host is forwarded and not keyed (as in APISIX): an origin that uses it must Vary on it...
    get(&gw, "/v/x", &[("X-Forwarded-Host", "evil.example")]);
    let victim = get(&gw, "/v/x", &[]);
    assert_eq!(status(&victim), "MISS");
    assert!(!victim.body.contains("evil"), "{}", victim.body);
    // ...or the route keys on it.
    get(&gw, "/k/x", &[("X-Forwarded-Host", "evil.example")]);
    let victim = get(&gw, "/k/x", &[]);
    assert_eq!(status(&victim), "MISS");
    assert!(!victim.body.contains("evil"), "{}", victim.body);
    // The hazard both guard against, with APISIX's default key and an origin that does neither.
    get(&gw, "/a/z", &[("X-Forwarded-Host", "evil.example")]);
    let victim = get(&gw, "/a/z", &[]);
    assert_eq!(status(&victim), "HIT");
    assert!(victim.body.ends_with("xfh=evil.example"));
}

#[test]
fn path_tricks_keep_keys_apart() {
    // The origin answers by the target it received, as sent.
    let o = CacheOrigin::start(|s, _| Answer::ok(format!("target={}", s.target)));
    let gw = Gw::start(json!({"routes": [route_to("1", "/*", &o, mem(json!({})))]}));
    get(&gw, "/secret", &[]);
    // Spellings that normalise to /secret reach the origin as sent and are keyed as sent ($request_uri is
    // nginx's, the raw target), so none is served /secret's answer, and none poisons /secret.
    for trick in [
        "/x/../secret",
        "/x/%2e%2e/secret",
        "//secret",
        "/%73ecret",
        "/secret?",
        "/secret?a=1",
    ] {
        let r = get(&gw, trick, &[]);
        assert_eq!(status(&r), "MISS", "{trick}");
        assert_eq!(r.body, format!("target={}", o.last().target), "{trick}");
    }
    let r = get(&gw, "/secret", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("HIT", "target=/secret"));
}

#[test]
fn consumers_get_their_own_entries() {
    let o = CacheOrigin::start(|s, _| {
        Answer::ok(format!(
            "for {}",
            s.header("x-consumer-username").unwrap_or("-")
        ))
    });
    let mut p = mem(json!({}));
    p["key-auth"] = json!({});
    let mut shared_key = mem(json!({"consumer_isolation": false}));
    shared_key["key-auth"] = json!({});
    let gw = Gw::start(json!({
        "consumers": [
            {"username": "alice", "plugins": {"key-auth": {"key": "ka"}}},
            {"username": "bob", "plugins": {"key-auth": {"key": "kb"}}}
        ],
        "routes": [route_to("1", "/me", &o, p), route_to("2", "/shared", &o, shared_key)]
    }));
    let a = get(&gw, "/me", &[("apikey", "ka")]);
    let b = get(&gw, "/me", &[("apikey", "kb")]);
    assert_eq!((a.body.as_str(), b.body.as_str()), ("for alice", "for bob"));
    assert_eq!(status(&b), "MISS");
    let a2 = get(&gw, "/me", &[("apikey", "ka")]);
    assert_eq!((status(&a2), a2.body.as_str()), ("HIT", "for alice"));
    // Without a key no answer at all, cached or not.
    assert_eq!(get(&gw, "/me", &[]).status, 401);
    // consumer_isolation off: one entry for everyone (the route's owner asked for it).
    get(&gw, "/shared", &[("apikey", "ka")]);
    let b = get(&gw, "/shared", &[("apikey", "kb")]);
    assert_eq!((status(&b), b.body.as_str()), ("HIT", "for alice"));
}

#[test]
fn huge_answers_stream_whole_and_are_not_stored() {
    let big: Arc<Vec<u8>> = Arc::new((0..3_000_000u32).map(|i| (i % 251) as u8).collect());
    let b2 = big.clone();
    let o = CacheOrigin::start(move |_, _| Answer {
        chunked: true,
        ..Answer::ok(b2.as_ref().clone())
    });
    let gw = Gw::start(json!({"routes": [
        route_to("1", "/*", &o, mem(json!({"max_resp_body_size": 1_000_000})))
    ]}));
    for _ in 0..2 {
        let (st, body) = raw_get(gw.addr, "/big");
        assert!(st.contains("Apisix-Cache-Status: MISS"), "{st}");
        assert_eq!(body.len(), big.len());
        assert!(body == *big, "the body arrived intact");
    }
    assert_eq!(o.hits(), 2);
}

/// GET on a fresh connection; the head as text and the de-chunked body.
fn raw_get(addr: SocketAddr, target: &str) -> (String, Vec<u8>) {
    raw_get_with(addr, target, "")
}

/// [`raw_get`] with more header lines (each ending in CRLF).
fn raw_get_with(addr: SocketAddr, target: &str, more: &str) -> (String, Vec<u8>) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET {target} HTTP/1.1\r\nHost: test.local\r\nConnection: close\r\n{more}\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    let at = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&all[..at]).into_owned();
    let mut body = Vec::new();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut rest = &all[at..];
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap().trim(), 16)
                .unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
            rest = &rest[nl + 2 + n + 2..];
        }
    } else {
        body.extend_from_slice(&all[at..]);
    }
    (head, body)
}

#[test]
fn capture_does_not_hold_the_client_back() {
    // The origin sends a first piece, then waits until the client has it before it ends the body.
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = c.read(&mut buf);
        c.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            .unwrap();
        let _ = rx.lock().unwrap().recv_timeout(Duration::from_secs(5));
        c.write_all(b"6\r\nsecond\r\n0\r\n\r\n").unwrap();
    });
    let gw = Gw::start(json!({"routes": [{
        "id": "1", "uri": "/s", "plugins": mem(json!({})),
        "upstream": {"type": "roundrobin", "nodes": {addr.to_string(): 1}}
    }]}));
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    c.write_all(b"GET /s HTTP/1.1\r\nHost: test.local\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("first") {
        let n = c
            .read(&mut buf)
            .expect("the first piece arrives before the origin ends the body");
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    tx.send(()).unwrap();
    c.read_to_end(&mut got).unwrap();
    assert!(String::from_utf8_lossy(&got).contains("second"));
    // And the whole body was stored.
    let r = get(&gw, "/s", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("HIT", "firstsecond"));
}

fn disk_shared(dir: &Path, disk_size: &str, ttl: Option<&str>) -> Arc<Shared> {
    let zones = ProxyCacheZones::from_conf(Some(&ProxyCacheSection {
        cache_ttl: ttl.map(|t| sluice_model::NginxTime::parse(t).unwrap()),
        zones: vec![CacheZoneSection {
            name: "disk_cache_one".into(),
            memory_size: Some("1m".into()),
            disk_size: Some(disk_size.into()),
            disk_path: Some(dir.to_string_lossy().into_owned()),
            cache_levels: Some("1:2".into()),
        }],
    }))
    .unwrap();
    Arc::new(Shared::default().with_proxy_cache(Arc::new(zones)))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-pc-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Every cache file under `dir` (nginx's levels 1:2).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn disk_zone_nginx_rules_restart_and_torn_files() {
    let dir = tmpdir("disk");
    let o = CacheOrigin::start(|s, n| match s.target.as_str() {
        "/zero" => Answer::ok(format!("z{n}")).header("Cache-Control", "max-age=0"),
        "/past" => Answer::ok(format!("p{n}")).header("Expires", "Thu, 01 Jan 1970 00:00:01 GMT"),
        "/accel" => Answer::ok(format!("a{n}"))
            .header("X-Accel-Expires", "0")
            .header("Cache-Control", "max-age=60"),
        "/cookie" => Answer::ok(format!("c{n}")).header("Set-Cookie", "sid=1"),
        "/short" => Answer::ok(format!("s{n}")).header("Cache-Control", "max-age=1"),
        _ => Answer::ok(format!("answer {n}")),
    });
    let plugins = json!({"proxy-cache": {"cache_bypass": ["$arg_bypass"]}});
    let res = json!({"routes": [route_to("1", "/*", &o, plugins)]});
    let gw = Gw::start_with(res.clone(), disk_shared(&dir, "1m", None), 2).unwrap();
    let r = get(&gw, "/hello", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("MISS", "answer 1"));
    let r = get(&gw, "/hello", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("HIT", "answer 1"));
    assert_eq!(r.header("Server"), Some("origin"));
    assert_eq!(files(&dir).len(), 1);
    // nginx's rules: none of these is stored.
    for path in ["/zero", "/past", "/accel", "/cookie"] {
        let a = get(&gw, path, &[]);
        let b = get(&gw, path, &[]);
        assert_ne!(a.body, b.body, "{path} served from the cache");
    }
    // cache_bypass goes to the upstream (and stores its answer, as nginx's proxy_cache_bypass).
    let r = get(&gw, "/hello?bypass=1", &[]);
    assert_eq!(status(&r), "BYPASS");
    assert_eq!(o.last().target, "/hello?bypass=1");
    // Freshness from max-age.
    get(&gw, "/short", &[]);
    assert_eq!(status(&get(&gw, "/short", &[])), "HIT");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(status(&get(&gw, "/short", &[])), "EXPIRED");
    drop(gw);

    // A restart finds the files again.
    let gw = Gw::start_with(res.clone(), disk_shared(&dir, "1m", None), 2).unwrap();
    let r = get(&gw, "/hello", &[]);
    assert_eq!((status(&r), r.body.as_str()), ("HIT", "answer 1"));
    drop(gw);
    // A torn file (a crash mid-write, a full disk) is never served: it counts as a miss and is replaced.
    let hits = o.hits();
    for f in files(&dir) {
        let data = std::fs::read(&f).unwrap();
        let text = String::from_utf8_lossy(&data);
        if text.contains("test.local/hello") && !text.contains("bypass") {
            std::fs::write(&f, &data[..data.len() - 5]).unwrap();
        }
    }
    let gw = Gw::start_with(res.clone(), disk_shared(&dir, "1m", None), 2).unwrap();
    let r = get(&gw, "/hello", &[]);
    assert_eq!(status(&r), "MISS");
    assert_eq!(o.hits(), hits + 1);
    assert_ne!(r.body, "answer 1");
    assert_eq!(status(&get(&gw, "/hello", &[])), "HIT");
    // PURGE removes the file (APISIX computes nginx's path).
    let before = files(&dir).len();
    assert_eq!(request(gw.addr, "PURGE", "/hello", &[], "").status, 200);
    assert_eq!(files(&dir).len(), before - 1);
    assert_eq!(request(gw.addr, "PURGE", "/hello", &[], "").status, 404);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn disk_zone_bounded_and_huge_answers() {
    let dir = tmpdir("bound");
    let o = CacheOrigin::start(|s, _| {
        let n: usize = s.target.trim_start_matches("/n/").parse().unwrap_or(1000);
        Answer {
            chunked: true,
            ..Answer::ok(vec![b'x'; n])
        }
    });
    let res = json!({"routes": [route_to("1", "/n/*", &o, json!({"proxy-cache": {}}))]});
    let gw = Gw::start_with(res, disk_shared(&dir, "64k", None), 2).unwrap();
    for i in 0..40 {
        let (_, body) = raw_get(gw.addr, &format!("/n/{}", 5000 + i));
        assert_eq!(body.len(), 5000 + i);
    }
    let total: u64 = files(&dir)
        .iter()
        .map(|f| f.metadata().unwrap().len())
        .sum();
    assert!(total <= 64 << 10, "{total} bytes on disk");
    // Larger than the zone: streamed to the client whole, never stored.
    for _ in 0..2 {
        let (head, body) = raw_get(gw.addr, "/n/200000");
        assert!(head.contains("Apisix-Cache-Status: MISS"), "{head}");
        assert_eq!(body.len(), 200_000);
    }
    assert!(files(&dir)
        .iter()
        .all(|f| !f.to_string_lossy().ends_with(".tmp")));
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn zones_are_checked_as_apisix_does() {
    let o = CacheOrigin::start(counting);
    let e = Gw::try_start(json!({"routes": [route_to("1", "/*", &o,
        json!({"proxy-cache": {"cache_zone": "nope"}}))]}))
    .err()
    .unwrap();
    assert!(e.contains("cache_zone nope not found"), "{e}");
    let e = Gw::try_start(json!({"routes": [route_to("1", "/*", &o,
        json!({"proxy-cache": {"cache_strategy": "memory", "cache_zone": "disk_cache_one"}}))]}))
    .err()
    .unwrap();
    assert!(
        e.contains("invalid or empty cache_zone for cache_strategy: memory"),
        "{e}"
    );
    let e = Gw::try_start(json!({"routes": [route_to("1", "/*", &o,
        json!({"proxy-cache": {"cache_key": ["$request_method"]}}))]}))
    .err()
    .unwrap();
    assert!(
        e.contains("cache_key variable $request_method unsupported"),
        "{e}"
    );
}

/// REDbot from PyPI in a venv under `<target>/redbot` (pinned in tools/redbot/requirements.txt), made once.
fn redbot() -> Option<PathBuf> {
    static BIN: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let home = super::target_dir().join("redbot");
        let venv = home.join("venv");
        let bin = venv.join("bin/redbot");
        let req = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/redbot/requirements.txt");
        let want = std::fs::read_to_string(&req).ok()?;
        let stamp = venv.join(".requirements");
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(want.as_str()) || !bin.exists() {
            let _ = std::fs::remove_dir_all(&venv);
            std::fs::create_dir_all(&home).ok()?;
            let ok = std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .is_ok_and(|s| s.success())
                && std::process::Command::new(venv.join("bin/python"))
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "-q",
                        "-r",
                    ])
                    .arg(&req)
                    .status()
                    .is_ok_and(|s| s.success());
            if !ok {
                return None;
            }
            std::fs::write(&stamp, &want).ok()?;
        }
        Some(bin)
    })
    .clone()
}

#[test]
fn redbot_on_a_cached_answer() {
    let Some(bin) = redbot() else {
        super::ci::skip_unless_ci("REDbot needs python3 with venv and PyPI's redbot");
        return;
    };
    let o = CacheOrigin::start(|_, _| {
        Answer::ok("<html><body>cached page</body></html>")
            .header("Content-Type", "text/html; charset=utf-8")
            .header("Cache-Control", "public, max-age=600")
            .header("ETag", "\"v1\"")
            .header("Last-Modified", "Thu, 26 Nov 2026 00:00:00 GMT")
            .header("Date", &httpdate_now())
    });
    let gw = Gw::start(json!({"routes": [route_to("1", "/*", &o, mem(json!({})))]}));
    let url = format!("http://{}/page", gw.addr);
    // REDbot's Host is the address: its key.
    let host = gw.addr.to_string();
    assert_eq!(status(&get(&gw, "/page", &[("Host", &host)])), "MISS");
    let out = std::process::Command::new(&bin)
        .args(["-o", "text", &url])
        .output()
        .expect("run redbot");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("REDbot on the cached answer:\n{text}");
    assert!(
        text.contains("Apisix-Cache-Status: HIT"),
        "REDbot's request was a hit:\n{text}"
    );
    for good in [
        "The Content-Length header is correct.",
        "This response allows all caches to store it.",
    ] {
        assert!(text.contains(good), "REDbot did not say {good:?}:\n{text}");
    }
    for bad in [
        "Date header",
        "more than once",
        "isn't correct",
        "has a syntax error",
        // Conditional requests on a hit get 304, as from nginx's cache.
        "returned the full content unchanged",
    ] {
        assert!(!text.contains(bad), "REDbot complained ({bad:?}):\n{text}");
    }
}

fn httpdate_now() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%a, %d %b %Y %H:%M:%S GMT"])
        .env("LC_ALL", "C")
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn conditional_requests_on_a_hit() {
    let o = CacheOrigin::start(|_, n| {
        Answer::ok(format!("v{n}"))
            .header("ETag", "\"v1\"")
            .header("Last-Modified", "Thu, 26 Nov 2026 00:00:00 GMT")
    });
    let gw = Gw::start(json!({"routes": [route_to("1", "/*", &o, mem(json!({})))]}));
    assert_eq!(status(&get(&gw, "/c", &[])), "MISS");
    for (name, value, code) in [
        ("If-None-Match", "\"v1\"", 304),
        ("If-None-Match", "W/\"v1\"", 304),
        ("If-None-Match", "\"x\", \"v1\"", 304),
        ("If-None-Match", "*", 304),
        ("If-None-Match", "\"v2\"", 200),
        ("If-Modified-Since", "Thu, 26 Nov 2026 00:00:00 GMT", 304),
        ("If-Modified-Since", "Wed, 25 Nov 2026 00:00:00 GMT", 200),
    ] {
        let (head, body) = raw_get_with(gw.addr, "/c", &format!("{name}: {value}\r\n"));
        assert!(
            head.starts_with(&format!("HTTP/1.1 {code} ")),
            "{name}: {value}: {head}"
        );
        assert!(head.contains("Apisix-Cache-Status: HIT"), "{head}");
        if code == 304 {
            assert!(
                body.is_empty() && !head.contains("Content-Length"),
                "{head}"
            );
            assert!(head.contains("ETag: \"v1\""), "{head}");
        } else {
            assert_eq!(body, b"v1");
        }
    }
    assert_eq!(o.hits(), 1);
}
