//! The gRPC scenario's pieces: the config compiles in the real data plane, the probes accept only the real reply
//! (over real sockets, against in-process servers that answer wrongly in each way), the run check, the overhead
//! note, and, when Go and h2load are installed, the greeter built, started and driven exactly as the scenario does.

use super::*;
use std::net::TcpListener;

use bytes::Bytes;

/// An h2c server answering every request with `body` and trailers `grpc-status: status` (or a trailers-only answer
/// when `body` is None).
fn grpc_origin(body: Option<Vec<u8>>, status: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).expect("listener");
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let body = body.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    while let Some(Ok((req, mut respond))) = conn.accept().await {
                        let mut rb = req.into_body();
                        while let Some(Ok(d)) = rb.data().await {
                            let _ = rb.flow_control().release_capacity(d.len());
                        }
                        let head =
                            http::Response::builder().header("content-type", "application/grpc");
                        match &body {
                            Some(b) => {
                                let resp = head.body(()).expect("resp");
                                let mut tx = respond.send_response(resp, false).expect("send");
                                let _ = tx.send_data(Bytes::from(b.clone()), false);
                                let mut t = http::HeaderMap::new();
                                t.insert("grpc-status", status.parse().expect("value"));
                                let _ = tx.send_trailers(t);
                            }
                            None => {
                                let resp =
                                    head.header("grpc-status", status).body(()).expect("resp");
                                let _ = respond.send_response(resp, true);
                            }
                        }
                    }
                });
            }
        });
    });
    addr
}

/// An HTTP/1.1 server answering each connection once with `response` (raw), then closing.
fn h1_origin(response: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            // The request head, then its Content-Length body.
            while let Ok(n @ 1..) = s.read(&mut chunk) {
                buf.extend_from_slice(&chunk[..n]);
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .split("\r\n")
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let _ = s.write_all(response.as_bytes());
        }
    });
    addr
}

#[test]
fn request_and_reply_frames() {
    assert_eq!(grpc_request(), b"\0\0\0\0\x07\x0a\x05bench");
    assert_eq!(grpc_reply(), b"\0\0\0\0\x0d\x0a\x0bHello bench");
}

#[test]
fn the_config_compiles_in_the_data_plane() {
    let y = standalone_yaml("127.0.0.1:50051".parse().expect("addr"), 64);
    let res = sluice_store::standalone::parse(&y).expect("apisix.yaml parses");
    assert_eq!(res.protos.len(), 1);
    assert_eq!(res.routes.len(), 2);
    let snap = sluice_proxy::Snapshot::compile(&res, 1)
        .expect("the data plane compiles the scenario's config");
    assert_eq!(snap.route_count(), 2);
    // A method the proto lacks must fail that compile, so the plugin really checked the proto given here.
    let bad = y.replace("method: SayHello", "method: SayGoodbye");
    let res = sluice_store::standalone::parse(&bad).expect("parses");
    let err = sluice_proxy::Snapshot::compile(&res, 1)
        .err()
        .expect("unknown method refused");
    assert!(err.contains("grpc-transcode"), "{err}");
}

#[test]
fn h2load_command_lines() {
    let addr: SocketAddr = "127.0.0.1:9000".parse().expect("addr");
    let f = Path::new("/w/say_hello.grpc");
    let a = h2load_args(
        Call::Grpc,
        addr,
        f,
        32,
        1,
        Until::Elapsed(Duration::from_secs(3)),
    );
    assert_eq!(
        a.join(" "),
        "-c 32 -m 1 -t 1 -D 3000ms -d /w/say_hello.grpc -H content-type: application/grpc -H te: trailers http://127.0.0.1:9000/helloworld.Greeter/SayHello"
    );
    let f = Path::new("/w/say_hello.json");
    let a = h2load_args(Call::Transcode, addr, f, 8, 4, Until::Requests(20_000));
    assert_eq!(
        a.join(" "),
        "--h1 -c 8 -m 1 -t 4 -n 20000 -d /w/say_hello.json -H content-type: application/json http://127.0.0.1:9000/hello"
    );
    let a = h2load_args(Call::TranscodeH2c, addr, f, 32, 1, Until::Requests(1));
    assert!(!a.contains(&"--h1".to_string()) && a.last().expect("url").ends_with("/hello"));
    assert_eq!(
        Call::Direct.body_file(Path::new("/w")),
        Path::new("/w/say_hello.grpc")
    );
}

#[test]
fn the_grpc_probe_accepts_only_the_real_reply() {
    let good = grpc_origin(Some(grpc_reply()), "0");
    assert_eq!(probe(Call::Direct, good), Ok(18));
    assert_eq!(probe(Call::Grpc, good), Ok(18));
    let failed = grpc_origin(Some(grpc_reply()), "13");
    let e = probe(Call::Direct, failed).expect_err("grpc-status 13");
    assert!(e.contains("grpc-status"), "{e}");
    let trailers_only = grpc_origin(None, "14");
    let e = probe(Call::Grpc, trailers_only).expect_err("trailers-only UNAVAILABLE");
    assert!(e.contains("\"14\""), "{e}");
    let other = grpc_origin(Some(grpc_frame(&string_field("Hello nobody"))), "0");
    let e = probe(Call::Direct, other).expect_err("another message");
    assert!(e.contains("not the HelloReply"), "{e}");
    // Nothing listening.
    let closed = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    assert!(probe(Call::Grpc, closed).is_err());
}

#[test]
fn the_transcode_probe_accepts_only_the_transcoded_reply() {
    let good = h1_origin(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 25\r\n\r\n{\"message\":\"Hello bench\"}",
    );
    assert_eq!(probe(Call::Transcode, good), Ok(25));
    let e = probe(
        Call::Transcode,
        h1_origin("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nnope"),
    )
    .expect_err("503");
    assert!(e.contains("503"), "{e}");
    let e = probe(
        Call::Transcode,
        h1_origin("HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{\"message\":1}"),
    )
    .expect_err("another body");
    assert!(e.contains("not the transcoded reply"), "{e}");
    let e = probe(
        Call::Transcode,
        h1_origin("HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{\"message\":\"Hello bench\"}"),
    )
    .expect_err("cut short");
    assert!(e.contains("cut short"), "{e}");
}

#[test]
fn runs_whose_answers_were_not_the_reply_are_rejected() {
    let m = |requests, data_bytes, non_2xx| Measured {
        requests,
        data_bytes,
        errors: crate::loadgen::Errors {
            non_2xx,
            ..Default::default()
        },
        ..Measured::default()
    };
    assert!(check_answers(&m(1000, 18_000, 0), 18).is_ok());
    // A few answers cut by the end of a timed run are within 1%.
    assert!(check_answers(&m(1000, 17_990, 0), 18).is_ok());
    // Trailers-only errors (200, no body) on a tenth of the calls.
    let e = check_answers(&m(1000, 16_200, 0), 18).expect_err("short");
    assert!(e.contains("16.2 body bytes"), "{e}");
    assert!(check_answers(&m(1000, 18_000, 3), 18).is_err());
}

#[test]
fn overhead_is_transcoded_over_proxied() {
    let t = |name: &str, cpu: &[f64], ir: Option<f64>| {
        let mut t = TargetResult::skipped(name, "h2load", 1, String::new());
        t.skip_reason = None;
        t.rounds = cpu
            .iter()
            .map(|c| RunResult {
                cpu_us_per_req: Some(*c),
                ..RunResult::default()
            })
            .collect();
        t.finish();
        if let Some(m) = t.median.as_mut() {
            m.instructions_per_req = ir;
        }
        t
    };
    let results = vec![
        t("direct", &[], None),
        t("sluice-grpc", &[40.0, 50.0, 45.0], Some(40_000.0)),
        t("sluice-transcode", &[50.0, 60.0, 54.0], Some(50_000.0)),
        t("sluice-transcode-h2c", &[70.0, 80.0, 90.0], None),
    ];
    let notes = overhead_notes(&results);
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert_eq!(
        notes[0],
        "sluice-transcode vs sluice-grpc: CPU 54.0 vs 45.0 µs/request, transcoding overhead +20.0% (under the 30% target); per round +25.0% +20.0% +20.0%"
    );
    assert_eq!(
        notes[1],
        "sluice-transcode vs sluice-grpc: 50000 vs 40000 instructions/request, +25.0%"
    );
    assert!(
        notes[2].contains("+77.8% (OVER the 30% target)"),
        "{}",
        notes[2]
    );
    assert!(overhead_notes(&results[2..]).is_empty());
}

#[test]
fn cpu_lists() {
    assert_eq!(cpu_count("1"), 1);
    assert_eq!(cpu_count("0-2"), 3);
    assert_eq!(cpu_count("0,3,5-6"), 4);
}

/// What the scenario does with the origin, for real: build grpc-go's greeter from the pinned module, start it, probe
/// it, drive it with h2load and check the answers. Skips without Go or h2load (fails under CI=true).
#[test]
fn greeter_builds_starts_and_answers_h2load() {
    let missing = if !installed("h2load") {
        Some("h2load")
    } else if find_go().is_none() {
        Some("Go >= 1.25")
    } else {
        None
    };
    if let Some(what) = missing {
        if matches!(std::env::var("CI").as_deref(), Ok("true" | "1")) {
            panic!("{what} missing: CI=true requires this test to run");
        }
        eprintln!("skipping: {what} not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sluice-bench-greeter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let go = find_go().expect("go");
    let bin = build_greeter(&go, &dir).expect("go build greeter_server");
    // The stamp makes a second call reuse the binary.
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .expect("mtime");
    assert_eq!(build_greeter(&go, &dir).expect("again"), bin);
    assert_eq!(
        std::fs::metadata(&bin)
            .and_then(|m| m.modified())
            .expect("mtime"),
        built
    );
    let mut greeter = Greeter::start(&bin, None).expect("greeter starts");
    let addr = greeter.addr;
    assert!(greeter.exited().is_none());
    assert_eq!(probe(Call::Direct, addr), Ok(18));
    let body = Call::Direct.body_file(&dir);
    std::fs::write(&body, Call::Direct.body()).expect("body file");
    let until = Until::Requests(500);
    let m = h2load(&h2load_args(Call::Direct, addr, &body, 4, 1, until), until).expect("h2load");
    assert_eq!(m.requests, 500);
    assert_eq!(m.data_bytes, 500 * 18);
    check_answers(&m, 18).expect("every answer was the reply");
    // A dead origin is noticed, with its exit status and last words (the greeter logs each call).
    let pid = greeter.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill")
        .success());
    let end = Instant::now() + Duration::from_secs(10);
    let why = loop {
        if let Some(why) = greeter.exited() {
            break why;
        }
        assert!(Instant::now() < end, "the killed greeter still runs");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        why.contains("SIGKILL") && why.contains("Received: bench"),
        "{why}"
    );
    drop(greeter);
    let _ = std::fs::remove_dir_all(&dir);
}
