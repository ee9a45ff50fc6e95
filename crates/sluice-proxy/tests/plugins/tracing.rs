//! opentelemetry and zipkin through the real proxy, against a real trace backend (common/trace_receiver.rs: the
//! OpenTelemetry Collector's OTLP decoder and zipkin-go's model behind a small Go server). What the upstream got
//! is read from the recording origin; what was exported, from the backend.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_plugins::Shared;

use super::trace_receiver::Receiver;
use super::{request, route, Gw, Origin};

/// A shared state whose opentelemetry exporter posts to `addr` and flushes quickly.
fn otel_shared(addr: &str, extra: Value) -> Arc<Shared> {
    let mut attr = json!({"opentelemetry": {
        "collector": {"address": addr, "request_timeout": 2},
        "batch_span_processor": {"inactive_timeout": 0.05, "batch_timeout": 0.2}
    }});
    if let (Some(a), Some(e)) = (attr["opentelemetry"].as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            a.insert(k.clone(), v.clone());
        }
    }
    let attr = attr.as_object().cloned();
    Arc::new(Shared::default().with_plugin_attr(attr))
}

fn otel(sampler: Value) -> Value {
    json!({"opentelemetry": {"sampler": sampler}})
}

fn on() -> Value {
    json!({"name": "always_on"})
}

/// (trace id, span id, flags) of a traceparent the origin received.
fn tp(v: Option<&str>) -> (String, String, String) {
    let v = v.expect("the upstream got a traceparent");
    let p: Vec<&str> = v.split('-').collect();
    assert_eq!(p.len(), 4, "{v}");
    assert_eq!(p[0], "00", "{v}");
    assert!(
        p[1].len() == 32 && p[2].len() == 16 && p[3].len() == 2,
        "{v}"
    );
    assert!(
        v.bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{v}"
    );
    assert_ne!(p[1], "0".repeat(32));
    assert_ne!(p[2], "0".repeat(16));
    (p[1].into(), p[2].into(), p[3].into())
}

fn find<'a>(spans: &'a [Value], span_id: &str) -> Option<&'a Value> {
    spans.iter().find(|s| s["spanId"] == span_id)
}

#[test]
fn otel_span_reaches_the_backend_and_the_upstream_gets_its_context() {
    let Some(r) = Receiver::start() else { return };
    let o = Origin::start();
    let mut svc_route = route("r-svc", "/svc", &o, otel(on()));
    svc_route["service_id"] = "s1".into();
    svc_route["name"] = "named".into();
    let res = json!({
        "routes": [route("r1", "/hello", &o, otel(on())), svc_route],
        "services": [{"id": "s1", "name": "svc-one"}]
    });
    let gw = Gw::start_with(res, otel_shared(&r.otlp(), json!({})), 2).unwrap();
    let resp = gw.get("/hello?a=1", &[("User-Agent", "trace-test/1")]);
    assert_eq!(resp.status, 200);
    let (trace_id, span_id, flags) = tp(o.last().header("traceparent"));
    assert_eq!(flags, "01");
    // An upstream answering 503 makes an ERROR span.
    assert_eq!(gw.get("/svc?code=503", &[]).status, 503);
    let (_, svc_span, _) = tp(o.last().header("traceparent"));

    let spans = r.wait_for("APISIX", |s| {
        find(s, &span_id).is_some() && find(s, &svc_span).is_some()
    });
    let s = find(&spans, &span_id).unwrap_or_else(|| panic!("span {span_id} in {spans:?}"));
    assert_eq!(s["protocol"], "otlp");
    assert_eq!(s["traceId"], trace_id.as_str());
    assert_eq!(s["parentSpanId"], "", "a new trace's server span is a root");
    assert_eq!(s["name"], "GET /hello");
    assert_eq!(s["kind"], "Server");
    assert_eq!(s["scope"], "opentelemetry-lua");
    assert_eq!(s["statusCode"], "Unset");
    let a = &s["attributes"];
    assert_eq!(a["http.method"], "GET");
    assert_eq!(a["http.scheme"], "http");
    assert_eq!(a["http.target"], "/hello?a=1");
    assert_eq!(a["http.user_agent"], "trace-test/1");
    assert_eq!(a["net.host.name"], "test.local");
    assert_eq!(a["apisix.route_id"], "r1");
    assert_eq!(a["http.route"], "/hello");
    assert_eq!(a["http.status_code"], 200);
    assert_eq!(a["http.response.status_code"], 200);
    assert!(s["resource"]["hostname"].is_string(), "{s}");
    let (start, end) = (s["startNs"].as_u64().unwrap(), s["endNs"].as_u64().unwrap());
    assert!(start > 0 && end >= start, "{start}..{end}");

    let e = find(&spans, &svc_span).unwrap();
    assert_eq!(e["statusCode"], "Error");
    assert_eq!(e["statusMessage"], "upstream response status: 503");
    assert_eq!(e["attributes"]["http.status_code"], 503);
    assert_eq!(e["attributes"]["apisix.route_name"], "named");
    assert_eq!(e["attributes"]["apisix.service_id"], "s1");
    assert_eq!(e["attributes"]["apisix.service_name"], "svc-one");
    assert_eq!(e["name"], "GET /svc");
}

#[test]
fn otel_continues_a_client_trace_and_passes_tracestate() {
    let Some(r) = Receiver::start() else { return };
    let o = Origin::start();
    let conf = json!({"opentelemetry": {
        "sampler": {"name": "parent_base", "options": {"root": {"name": "always_on"}}},
        "additional_attributes": ["remote_addr", "$arg_who", "route_id"],
        "additional_header_prefix_attributes": ["x-tenant-*", "x-exact"]
    }});
    let res = json!({"routes": [route("r1", "/t", &o, conf)]});
    let gw = Gw::start_with(res, otel_shared(&r.otlp(), json!({})), 2).unwrap();
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let resp = gw.get(
        "/t?who=me",
        &[
            (
                "traceparent",
                &format!("00-{client_trace}-{client_span}-01"),
            ),
            ("tracestate", "congo=t61rcWkgMzE"),
            ("X-Tenant-Id", "t1"),
            ("x-exact", "e"),
            ("x-exactly-not", "n"),
        ],
    );
    assert_eq!(resp.status, 200);
    let seen = o.last();
    let (trace_id, span_id, flags) = tp(seen.header("traceparent"));
    assert_eq!(trace_id, client_trace);
    assert_ne!(
        span_id, client_span,
        "the upstream's parent is the gateway's span"
    );
    assert_eq!(flags, "01");
    assert_eq!(seen.header("tracestate"), Some("congo=t61rcWkgMzE"));

    let spans = r.wait_for("APISIX", |s| find(s, &span_id).is_some());
    let s = find(&spans, &span_id).expect("span exported");
    assert_eq!(s["traceId"], client_trace);
    assert_eq!(s["parentSpanId"], client_span);
    assert_eq!(s["traceState"], "congo=t61rcWkgMzE");
    let a = &s["attributes"];
    assert_eq!(a["remote_addr"], "127.0.0.1");
    assert_eq!(a["$arg_who"], "me");
    assert_eq!(a["route_id"], "r1");
    assert_eq!(a["x-tenant-id"], "t1");
    assert_eq!(a["x-exact"], "e");
    assert!(a.get("x-exactly-not").is_none(), "{a}");
}

/// Requests on unsampled routes export nothing: a sampled request sent after them through the same exporter
/// (one queue, one thread, in order) arrives alone.
#[test]
fn otel_unsampled_requests_export_nothing_and_propagate_the_flag() {
    let Some(r) = Receiver::start() else { return };
    let o = Origin::start();
    let parent = json!({"name": "parent_base", "options": {"root": {"name": "always_on"}}});
    let res = json!({"routes": [
        route("pb", "/pb", &o, otel(parent)),
        route("off", "/off", &o, otel(json!({"name": "always_off"}))),
        route("default", "/default", &o, json!({"opentelemetry": {}})),
        route("ratio0", "/ratio0", &o, otel(json!({"name": "trace_id_ratio", "options": {"fraction": 0}}))),
        route("on", "/on", &o, otel(on())),
    ]});
    let gw = Gw::start_with(res, otel_shared(&r.otlp(), json!({})), 2).unwrap();
    let client_trace = "0af7651916cd43dd8448eb211c80319c";
    let resp = gw.get(
        "/pb",
        &[(
            "traceparent",
            &format!("00-{client_trace}-b7ad6b7169203331-00"),
        )],
    );
    assert_eq!(resp.status, 200);
    let (t, _, flags) = tp(o.last().header("traceparent"));
    assert_eq!((t.as_str(), flags.as_str()), (client_trace, "00"));
    for path in ["/off", "/default", "/ratio0"] {
        for _ in 0..5 {
            assert_eq!(gw.get(path, &[]).status, 200);
            let (_, _, flags) = tp(o.last().header("traceparent"));
            assert_eq!(flags, "00", "{path}");
        }
    }
    assert_eq!(gw.get("/on", &[]).status, 200);
    let (sentinel, _, _) = tp(o.last().header("traceparent"));
    let spans = r.wait_for("", |s| s.iter().any(|x| x["traceId"] == sentinel.as_str()));
    let traces: Vec<&str> = spans.iter().filter_map(|s| s["traceId"].as_str()).collect();
    assert_eq!(
        traces,
        [sentinel.as_str()],
        "only the sampled request was exported"
    );
}

/// Whatever a client puts in traceparent, the upstream gets a fresh, well-formed one and the bad value never
/// travels on.
#[test]
fn otel_malformed_traceparents_start_a_new_trace() {
    let o = Origin::start();
    let res = json!({"routes": [route("r1", "/t", &o, otel(json!({"name": "parent_base"})))]});
    // No collector needed: nothing here is sampled (parent_base without a valid parent, root always_off).
    let gw = Gw::start_with(res, otel_shared("127.0.0.1:9", json!({})), 2).unwrap();
    let good_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let huge = format!("00-{good_trace}-00f067aa0ba902b7-01{}", "0".repeat(16_000));
    let bad: Vec<String> = vec![
        "".into(),
        "00".into(),
        format!("00-{good_trace}-00f067aa0ba902b7-0"),
        format!("00-{good_trace}-00f067aa0ba902b7-011"),
        format!("00-{good_trace}-00f067aa0ba902b7"),
        format!("ff-{good_trace}-00f067aa0ba902b7-01"),
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01".into(),
        format!("00-{good_trace}-0000000000000000-01"),
        format!("00-{}-00f067aa0ba902b7-01", good_trace.to_uppercase()),
        format!("00-{}g-00f067aa0ba902b7-01", &good_trace[..31]),
        format!("00+{good_trace}+00f067aa0ba902b7+01"),
        format!("0g-{good_trace}-00f067aa0ba902b7-01"),
        format!("00-{good_trace}-00f067aa0ba902b7-01-extra"),
        format!("00-{good_trace}-00f067aa 0ba902b7-01"),
        format!("00-{good_trace}-00f067aa0ba9\u{e9}-01"),
        huge,
    ];
    for b in &bad {
        let resp = gw.get(
            "/t",
            &[("traceparent", b.as_str()), ("tracestate", "evil=1")],
        );
        let short: String = b.chars().take(80).collect();
        if b.len() > 8000 {
            // Too big for the head limit is the gateway's 431/400 before any plugin; that is fine too.
            assert!(
                matches!(resp.status, 200 | 400 | 431),
                "{short}: {}",
                resp.status
            );
            if resp.status != 200 {
                continue;
            }
        } else {
            assert_eq!(resp.status, 200, "{short}");
        }
        let seen = o.last();
        let (t, _, flags) = tp(seen.header("traceparent"));
        assert_ne!(t, good_trace, "{short}: a bad traceparent is not continued");
        assert_eq!(flags, "00", "{short}");
        assert_eq!(
            seen.header("tracestate"),
            None,
            "{short}: a restarted trace drops tracestate"
        );
        assert_eq!(
            seen.headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("traceparent"))
                .count(),
            1,
            "{short}: one traceparent"
        );
    }
    // An overlong tracestate with a valid traceparent is dropped, not echoed.
    let resp = gw.get(
        "/t",
        &[
            (
                "traceparent",
                &format!("00-{good_trace}-00f067aa0ba902b7-00"),
            ),
            ("tracestate", &format!("k={}", "v".repeat(600))),
        ],
    );
    assert_eq!(resp.status, 200);
    let seen = o.last();
    assert_eq!(tp(seen.header("traceparent")).0, good_trace);
    assert_eq!(seen.header("tracestate"), None);
    assert_eq!(gw.get("/t", &[]).status, 200, "still serving");
}

#[test]
fn otel_trace_id_from_x_request_id() {
    let Some(r) = Receiver::start() else { return };
    let o = Origin::start();
    let res = json!({"routes": [route("r1", "/t", &o, otel(on()))]});
    let shared = otel_shared(&r.otlp(), json!({"trace_id_source": "x-request-id"}));
    let gw = Gw::start_with(res, shared, 2).unwrap();
    gw.get(
        "/t",
        &[("X-Request-Id", "6ba7b810-9dad-11d1-80b4-00c04fd430c8")],
    );
    assert_eq!(
        tp(o.last().header("traceparent")).0,
        "6ba7b8109dad11d180b400c04fd430c8"
    );
    // Not a 128-bit hex id (or zero): a random trace id, never the header echoed.
    for bad in [
        "not-an-id",
        "6ba7b8109dad11d180b400c04fd430c8ff",
        "00000000-0000-0000-0000-000000000000",
    ] {
        assert_eq!(gw.get("/t", &[("X-Request-Id", bad)]).status, 200);
        let (t, _, _) = tp(o.last().header("traceparent"));
        assert_ne!(t, "6ba7b8109dad11d180b400c04fd430c8");
        assert!(
            !t.starts_with("6ba7b8109dad") && t != "0".repeat(32),
            "{bad}: {t}"
        );
    }
}

/// A collector that refuses connections, or accepts and never answers: every request still completes, and the
/// exporter's queue stays at its bound (spans beyond it are counted as dropped).
#[test]
fn otel_dead_or_blackholed_collector_never_holds_requests() {
    let o = Origin::start();
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    // Accepts and reads, never answers (the connections are kept open).
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_addr = hole.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in hole.incoming().flatten() {
            held.push(c);
        }
    });
    for (what, addr) in [("dead", closed), ("blackholed", hole_addr)] {
        let res = json!({"routes": [route("r1", "/t", &o, otel(on()))]});
        let shared = otel_shared(
            &addr.to_string(),
            json!({"collector": {"address": addr.to_string(), "request_timeout": 30},
                   "batch_span_processor": {"max_queue_size": 8, "max_export_batch_size": 4,
                                            "inactive_timeout": 0.01, "batch_timeout": 0.01}}),
        );
        let gw = Gw::start_with(res, shared.clone(), 2).unwrap();
        let n = 300;
        let started = Instant::now();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let addr = gw.addr;
                std::thread::spawn(move || {
                    (0..n / 4)
                        .map(|_| request(addr, "GET", "/t", &[], "").status)
                        .filter(|s| *s == 200)
                        .count()
                })
            })
            .collect();
        let ok: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(ok, n, "{what}: every request answered 200");
        // Generous: a request held by the exporter would take the collector's 30 s timeout.
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "{what}: {n} requests took {:?}",
            started.elapsed()
        );
        assert_eq!(shared.trace_spans().0, 0, "{what}: nothing exported");
        match what {
            // The thread is stuck in one POST (30 s timeout): at most a batch in flight plus the queue; the rest
            // is dropped (the last requests' log phase may still be running after their responses: wait for it).
            "blackholed" => {
                let bound = (n - 8 - 4) as u64;
                let end = Instant::now() + Duration::from_secs(20);
                while shared.trace_spans().1 < bound && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let (_, dropped, failed) = shared.trace_spans();
                assert!(
                    dropped >= bound,
                    "{what}: queue bounded, dropped {dropped}, failed {failed}"
                );
            }
            // Connects fail at once: spans are drained and counted as failed, or dropped while the queue is full.
            _ => {
                let end = Instant::now() + Duration::from_secs(20);
                while shared.trace_spans().1 + shared.trace_spans().2 < n as u64
                    && Instant::now() < end
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let (_, d, f) = shared.trace_spans();
                assert_eq!(d + f, n as u64, "{what}: every span accounted for");
                assert!(f > 0, "{what}: the exporter tried");
            }
        }
    }
}

// ---- zipkin ----

fn zipkin(r: &Receiver, ratio: f64, extra: Value) -> Value {
    let mut c = json!({"endpoint": r.zipkin(), "sample_ratio": ratio});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    json!({ "zipkin": c })
}

/// Waits for the three v2 spans of the request whose upstream got `seen_trace`.
fn zipkin_spans(r: &Receiver, service: &str, trace: &str, count: usize) -> Vec<Value> {
    let spans = r.wait_for(service, |s| {
        s.iter().filter(|x| x["traceId"] == trace).count() >= count
    });
    spans
        .into_iter()
        .filter(|x| x["traceId"] == trace)
        .collect()
}

fn named<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    spans
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {spans:?}"))
}

#[test]
fn zipkin_spans_reach_the_backend_and_b3_goes_upstream() {
    let Some(r) = Receiver::start() else { return };
    let o = Origin::start();
    let res = json!({"routes": [
        route("z", "/z", &o, zipkin(&r, 1.0, json!({"service_name": "edge"}))),
        route("z1", "/z1", &o, zipkin(&r, 1.0, json!({"service_name": "edge-v1", "span_version": 1,
                                                       "server_addr": "10.1.2.3"}))),
    ]});
    let gw = Gw::start_with(res, Arc::new(Shared::default()), 2).unwrap();
    assert_eq!(gw.get("/z?q=1", &[]).status, 200);
    let seen = o.last();
    let trace = seen
        .header("x-b3-traceid")
        .expect("x-b3-traceid")
        .to_owned();
    let proxy = seen.header("x-b3-spanid").expect("x-b3-spanid").to_owned();
    let request_span = seen.header("x-b3-parentspanid").expect("parent").to_owned();
    assert_eq!(seen.header("x-b3-sampled"), Some("1"));
    assert_eq!(trace.len(), 32);
    let spans = zipkin_spans(&r, "edge", &trace, 3);
    let root = named(&spans, "apisix.request");
    assert_eq!(root["protocol"], "zipkin");
    assert_eq!(root["kind"], "SERVER");
    assert_eq!(root["spanId"], request_span.as_str());
    assert_eq!(root["parentSpanId"], "");
    let t = &root["attributes"];
    assert_eq!(t["component"], "apisix");
    assert_eq!(t["http.method"], "GET");
    assert_eq!(t["http.url"], "/z?q=1");
    assert_eq!(t["http.status_code"], "200");
    assert_eq!(t["peer.ipv4"], "127.0.0.1");
    assert_eq!(root["localEndpoint"]["ipv4"], "127.0.0.1");
    assert_eq!(root["localEndpoint"]["port"], gw.addr.port().to_string());
    let proxy_span = named(&spans, "apisix.proxy");
    assert_eq!(proxy_span["spanId"], proxy.as_str());
    assert_eq!(proxy_span["parentSpanId"], request_span.as_str());
    assert_eq!(
        named(&spans, "apisix.response_span")["parentSpanId"],
        request_span.as_str()
    );

    // span_version 1: rewrite, access, proxy and its body_filter child.
    assert_eq!(gw.get("/z1", &[]).status, 200);
    let seen = o.last();
    let trace = seen.header("x-b3-traceid").unwrap().to_owned();
    let spans = zipkin_spans(&r, "edge-v1", &trace, 5);
    let root = named(&spans, "apisix.request");
    assert_eq!(root["localEndpoint"]["ipv4"], "10.1.2.3");
    for n in ["apisix.rewrite", "apisix.access", "apisix.proxy"] {
        assert_eq!(named(&spans, n)["parentSpanId"], root["spanId"], "{n}");
    }
    assert_eq!(
        named(&spans, "apisix.body_filter")["parentSpanId"],
        seen.header("x-b3-spanid").unwrap()
    );
}

#[test]
fn zipkin_continues_b3_and_refuses_bad_ids() {
    let Some(r) = Receiver::start() else { return };
    let o = Origin::start();
    let res = json!({"routes": [route("z", "/z", &o, zipkin(&r, 0.00001, json!({"service_name": "b3"})))]});
    let gw = Gw::start_with(res, Arc::new(Shared::default()), 2).unwrap();

    // Multi-header B3, sampled by the client: continued.
    let t = "463ac35c9f6413ad48485a3953bb6124";
    let s = "a2fb4a1d1a96d312";
    gw.get(
        "/z",
        &[
            ("X-B3-TraceId", t),
            ("X-B3-SpanId", s),
            ("X-B3-Sampled", "1"),
        ],
    );
    let seen = o.last();
    assert_eq!(seen.header("x-b3-traceid"), Some(t));
    let spans = zipkin_spans(&r, "b3", t, 3);
    assert_eq!(named(&spans, "apisix.request")["parentSpanId"], s);

    // Single b3 header with a 64-bit trace id: continued, the b3 header itself not passed on.
    gw.get("/z", &[("b3", "80f198ee56343ba8-e457b5a2e4d86bd1-1")]);
    let seen = o.last();
    assert_eq!(seen.header("b3"), None);
    assert_eq!(seen.header("x-b3-traceid"), Some("80f198ee56343ba8"));
    let spans = zipkin_spans(&r, "b3", "000000000000000080f198ee56343ba8", 3);
    assert_eq!(
        named(&spans, "apisix.request")["parentSpanId"],
        "e457b5a2e4d86bd1"
    );

    // Debug flag `d`: sampled, and x-b3-flags: 1 travels upstream instead of x-b3-sampled.
    gw.get(
        "/z",
        &[("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-d")],
    );
    let seen = o.last();
    assert_eq!(seen.header("x-b3-flags"), Some("1"));
    assert_eq!(seen.header("x-b3-sampled"), None);

    // Not sampled by the client: x-b3-sampled: 0 goes upstream, nothing is exported (checked below).
    let unsampled = "11111111111111111111111111111111";
    gw.get(
        "/z",
        &[
            ("X-B3-TraceId", unsampled),
            ("X-B3-SpanId", s),
            ("X-B3-Sampled", "0"),
        ],
    );
    assert_eq!(o.last().header("x-b3-sampled"), Some("0"));
    gw.get("/z", &[("b3", "0")]);
    assert_eq!(o.last().header("x-b3-sampled"), Some("0"));

    // Malformed ids (sampled, so a span is made): a new trace, the bad values not echoed.
    let mut last = String::new();
    let bad_ids: [(&str, &str); 5] = [
        ("463ac35c9f6413ad48485a3953bb612", s),
        ("463ac35c9f6413ad48485a3953bb6124zz", s),
        (&"f".repeat(4000), s),
        (t, "a2fb4a1d1a96d31"),
        ("00000000000000000000000000000000", s),
    ];
    for (bt, bs) in bad_ids {
        let resp = gw.get(
            "/z",
            &[
                ("X-B3-TraceId", bt),
                ("X-B3-SpanId", bs),
                ("X-B3-Sampled", "1"),
            ],
        );
        assert_eq!(resp.status, 200);
        let seen = o.last();
        let got = seen.header("x-b3-traceid").unwrap();
        assert!(got != bt && got != t, "{got}");
        assert_eq!(got.len(), 32);
        assert!(got.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(seen.header("x-b3-spanid"), Some(bs));
        last = got.to_owned();
    }
    // A bad parent span id likewise discards the context.
    gw.get(
        "/z",
        &[
            ("X-B3-TraceId", t),
            ("X-B3-SpanId", s),
            ("X-B3-ParentSpanId", "xyz"),
            ("X-B3-Sampled", "1"),
        ],
    );
    assert_ne!(o.last().header("x-b3-traceid"), Some(t));

    // A b3 header without a span id is APISIX's 400, and nothing goes upstream.
    let before = o.count();
    assert_eq!(
        gw.get("/z", &[("b3", "80f198ee56343ba864fe8b2a57d3eff7")])
            .status,
        400
    );
    assert_eq!(o.count(), before);

    // The exporter keeps order: once the last sampled request's spans are in, an unsampled one would be too.
    let all = r.wait_for("b3", |s| s.iter().any(|x| x["traceId"] == last.as_str()));
    assert!(all.iter().any(|x| x["traceId"] == last.as_str()));
    assert!(
        !all.iter().any(|x| x["traceId"] == unsampled),
        "an unsampled request was exported"
    );
}

/// A `plugin_metadata` object for opentelemetry (newer APISIX's place for the node settings) is used over
/// `plugin_attr`.
#[test]
fn otel_plugin_metadata_overrides_plugin_attr() {
    let Some(r) = Receiver::start() else { return };
    let o = Origin::start();
    let res = json!({
        "routes": [route("r1", "/m", &o, otel(on()))],
        "plugin_metadata": [{"id": "opentelemetry",
                             "collector": {"address": r.otlp()},
                             "resource": {"service.name": "from-metadata", "deployment": "test"},
                             "batch_span_processor": {"inactive_timeout": 0.05}}]
    });
    // plugin_attr names a closed port: were it used, nothing would arrive.
    let gw = Gw::start_with(res, otel_shared("127.0.0.1:9", json!({})), 2).unwrap();
    assert_eq!(gw.get("/m", &[]).status, 200);
    let (_, span_id, _) = tp(o.last().header("traceparent"));
    let spans = r.wait_for("from-metadata", |s| find(s, &span_id).is_some());
    let s = find(&spans, &span_id).expect("span exported to the metadata's collector");
    assert_eq!(s["resource"]["deployment"], "test");
    assert_eq!(s["resource"]["service.name"], "from-metadata");
}
