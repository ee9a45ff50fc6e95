//! Load generator against the in-process mock on 127.0.0.1: counts, rate control, error kinds.

use super::*;
use sluice_mock::{Delay, MockConfig};

/// Starts the mock on its own thread and runtime; returns its address.
pub(crate) fn mock(delay: Delay, status: u16) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).expect("listener");
            sluice_mock::serve(l, Arc::new(MockConfig::new(1024, delay, status))).await
        });
    });
    addr
}

const NO_DELAY: Delay = Delay::Fixed(Duration::ZERO);

#[test]
fn closed_loop_sends_exactly_n_requests() {
    let addr = mock(NO_DELAY, 200);
    let mut spec = LoadSpec::new(addr, "/hello", 8, Stop::Requests(3000));
    spec.threads = 2;
    let r = run_load(&spec).expect("run");
    assert_eq!(r.requests, 3000);
    assert_eq!(r.errors, Errors::default());
    assert_eq!(r.hist.len(), 3000);
    // Every answer is the same size: head + 1024-byte body.
    assert_eq!(r.bytes % 3000, 0);
    assert!(r.bytes / 3000 > 1024);
    assert!(r.rps() > 100.0, "{}", r.rps());
}

#[test]
fn fixed_rate_hits_its_target() {
    let addr = mock(NO_DELAY, 200);
    let mut spec = LoadSpec::new(addr, "/", 16, Stop::Duration(Duration::from_secs(2)));
    spec.rate = Some(2000.0);
    spec.warmup = Duration::from_millis(200);
    let r = run_load(&spec).expect("run");
    let rps = r.rps();
    assert!(
        (rps - 2000.0).abs() < 2000.0 * 0.05,
        "rate {rps} not within 5% of 2000"
    );
    assert_eq!(r.errors.failures(), 0);
}

#[test]
fn fixed_rate_latency_is_corrected_for_coordinated_omission() {
    // One connection, 50 ms per answer, asked for 100/s: the schedule falls behind by ~40 ms per
    // request, so latency measured from the schedule grows far past the 50 ms service time.
    let addr = mock(Delay::Fixed(Duration::from_millis(50)), 200);
    let mut spec = LoadSpec::new(addr, "/", 1, Stop::Duration(Duration::from_secs(1)));
    spec.rate = Some(100.0);
    let r = run_load(&spec).expect("run");
    let l = crate::stats::Latency::from_histogram(&r.hist);
    assert!(r.requests >= 15 && r.requests <= 21, "{}", r.requests);
    assert!(l.p50 < 50_000.0 * 0.9 || l.max > 400_000.0, "{l:?}");
    assert!(
        l.max > 400_000.0,
        "uncorrected latency would stay near 50 ms: {l:?}"
    );
    // The same load closed-loop sees only the service time.
    spec.rate = None;
    let r = run_load(&spec).expect("run");
    let l = crate::stats::Latency::from_histogram(&r.hist);
    assert!(l.max < 150_000.0, "{l:?}");
}

#[test]
fn counts_non_2xx() {
    let addr = mock(NO_DELAY, 200);
    let r = run_load(&LoadSpec::new(addr, "/status/503", 2, Stop::Requests(100))).expect("run");
    assert_eq!(r.requests, 100);
    assert_eq!(r.errors.non_2xx, 100);
    assert_eq!(r.errors.failures(), 0);
}

#[test]
fn counts_connect_refused() {
    // A port that was just released: nothing listens on it (a reuse race is harmless here:
    // nobody else on this test binds it by number).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let r = run_load(&LoadSpec::new(addr, "/", 2, Stop::Requests(10))).expect("run");
    assert_eq!(r.requests, 0);
    assert_eq!(r.errors.connect, 10);
}

#[test]
fn counts_timeouts() {
    let addr = mock(Delay::Fixed(Duration::from_secs(3)), 200);
    let mut spec = LoadSpec::new(addr, "/", 2, Stop::Requests(4));
    spec.timeout = Duration::from_millis(150);
    let t = Instant::now();
    let r = run_load(&spec).expect("run");
    assert_eq!(r.requests, 0);
    assert_eq!(r.errors.timeout, 4);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn parses_heads() {
    let (n, st, body, close) = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
        .expect("ok")
        .expect("complete");
    assert_eq!((n, st, close), (38, 200, false));
    assert!(matches!(body, Body::Length(3)));
    let (_, _, body, close) = parse_head(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        .expect("ok")
        .expect("complete");
    assert!(matches!(body, Body::Chunked) && close);
    assert!(parse_head(b"HTTP/1.1 200 OK\r\nConte")
        .expect("ok")
        .is_none());
    assert!(parse_head(b"garbage\r\n\r\n").is_err());
}

#[test]
#[ignore = "needs wrk on PATH and an optimized build: cargo test --release -p sluice-bench -- --ignored"]
fn builtin_and_wrk_agree() {
    let addr = mock(NO_DELAY, 200);
    let mut spec = LoadSpec::new(addr, "/", 32, Stop::Duration(Duration::from_secs(3)));
    spec.warmup = Duration::from_millis(500);
    let builtin = run_load(&spec).expect("run").rps();
    let w = crate::drivers::wrk(addr, "/", &[], 1, 32, Duration::from_secs(3)).expect("wrk");
    let wrk = w.requests as f64 / w.elapsed.as_secs_f64();
    let diff = (builtin - wrk).abs() / wrk;
    assert!(
        diff <= 0.10,
        "builtin {builtin:.0} req/s vs wrk {wrk:.0} req/s: {:.1}% apart",
        diff * 100.0
    );
}

#[test]
fn h2c_requests_and_status_counting() {
    let addr = mock(NO_DELAY, 200);
    let mut spec = LoadSpec::new(addr, "/", 4, Stop::Requests(400));
    spec.h2c = true;
    let r = run_load(&spec).expect("run");
    assert_eq!(r.requests, 400);
    assert_eq!(r.errors, Errors::default());
    assert_eq!(r.bytes, 400 * 1024, "h2c counts body bytes");
    spec.path = "/status/500".into();
    spec.stop = Stop::Requests(50);
    let r = run_load(&spec).expect("run");
    assert_eq!((r.requests, r.errors.non_2xx), (50, 50));
}

/// Requests seen by `recorder`, by (path, apikey).
type Seen = Arc<std::sync::Mutex<std::collections::HashMap<(String, String), u64>>>;

/// A recording upstream: answers every HTTP/1.1 request with an empty 200 and counts (path, apikey) pairs.
fn recorder() -> (SocketAddr, Seen) {
    use std::io::{BufRead, BufReader, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let seen = s2.clone();
            std::thread::spawn(move || {
                let mut w = c.try_clone().expect("clone");
                let mut r = BufReader::new(c);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    let mut key = String::new();
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some(v) = h.strip_prefix("apikey: ") {
                            key = v.trim().to_string();
                        }
                    }
                    *seen.lock().expect("lock").entry((path, key)).or_default() += 1;
                    if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[test]
fn spread_rotates_over_every_route_and_key_evenly() {
    let (addr, seen) = recorder();
    let mut spec = LoadSpec::new(addr, "/hello", 8, Stop::Requests(2000));
    spec.headers = vec![("X-Extra".into(), "1".into())];
    spec.spread = (0..100)
        .map(|k| {
            (
                format!("/r/{}", k + 1),
                vec![("apikey".to_string(), format!("auth-{k}"))],
            )
        })
        .collect();
    let r = run_load(&spec).expect("run");
    assert_eq!((r.requests, r.errors), (2000, Errors::default()));
    let seen = seen.lock().expect("lock").clone();
    // 100 distinct (route, key) pairs, each the pair the rotation defines, none hit twice as often as another.
    assert_eq!(seen.len(), 100, "{seen:?}");
    for k in 0..100 {
        let n = seen
            .get(&(format!("/r/{}", k + 1), format!("auth-{k}")))
            .copied()
            .unwrap_or(0);
        assert!((10..=30).contains(&n), "pair {k}: {n} requests");
    }
    assert_eq!(seen.values().sum::<u64>(), 2000);
}

#[test]
fn no_spread_sends_one_request() {
    let (addr, seen) = recorder();
    let spec = LoadSpec::new(addr, "/hello", 4, Stop::Requests(300));
    assert_eq!(run_load(&spec).expect("run").requests, 300);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen.get(&("/hello".to_string(), String::new())), Some(&300));
}
