//! Client certificates towards upstreams (APISIX upstream `tls.client_cert`/`client_key` and `tls.client_cert_id`):
//! an in-process TLS origin that requires a certificate signed by its own CA (rustls with a client verifier) serves
//! HTTP/1.1 and h2 (by ALPN); requests reach it through a cleartext gateway listener on `https` and `grpcs` routes.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// A TLS origin that only completes handshakes with a client certificate `client_ca` signed. `served` counts the
/// requests that reached it (so a refused handshake provably forwarded nothing).
struct MtlsOrigin {
    addr: SocketAddr,
    served: Arc<AtomicUsize>,
}

fn mtls_origin(server: &Pki, client_ca: &Pki) -> MtlsOrigin {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(client_ca.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![server.cert.der().clone()],
            PrivateKeyDer::try_from(server.key.serialize_der()).unwrap(),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let s2 = served.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let (acceptor, served) = (acceptor.clone(), s2.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(s).await else {
                        return;
                    };
                    if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                        serve_h2(tls, served).await
                    } else {
                        serve_h1(tls, served).await
                    }
                });
            }
        });
    });
    MtlsOrigin { addr, served }
}

async fn serve_h1<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    served: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            served.fetch_add(1, Ordering::SeqCst);
            let r = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nmtls";
            if s.write_all(r).await.is_err() {
                return;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn serve_h2<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: S,
    served: Arc<AtomicUsize>,
) {
    let Ok(mut conn) = h2::server::handshake(s).await else {
        return;
    };
    while let Some(Ok((_req, mut respond))) = conn.accept().await {
        served.fetch_add(1, Ordering::SeqCst);
        let resp = http::Response::builder()
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let Ok(mut tx) = respond.send_response(resp, false) else {
            return;
        };
        let _ = tx.send_data(bytes::Bytes::from_static(b"h2mtls"), false);
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", "0".parse().unwrap());
        let _ = tx.send_trailers(t);
    }
}

/// A cleartext gateway whose route `/*` goes to `upstream`, with `ssls` alongside.
struct PlainGw {
    gw: Gateway,
    addr: SocketAddr,
    running: Option<Running>,
}

fn resources_with(upstream: Value, ssls: Vec<Value>) -> Result<Snapshot, String> {
    let res: Resources = serde_json::from_value(json!({
        "routes": [{"id": "1", "uri": "/*", "upstream": upstream}],
        "ssls": ssls,
    }))
    .unwrap();
    Snapshot::compile(&res, 1)
}

impl PlainGw {
    fn start(snap: Snapshot) -> PlainGw {
        let gw = Gateway::new(ProxyConfig::default(), snap);
        let l = Listeners::bind_kinds(&[("127.0.0.1:0".parse().unwrap(), ListenerKind::Plain)], 1)
            .unwrap();
        let addr = l.local_addrs[0];
        let running = Some(gw.start(l).unwrap());
        PlainGw { gw, addr, running }
    }

    /// One HTTP/1.1 request; returns the whole response text.
    fn get(&self) -> String {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(
            b"GET /x HTTP/1.1\r\nHost: origin.test\r\nTE: trailers\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Drop for PlainGw {
    fn drop(&mut self) {
        self.gw.shutdown();
        if let Some(r) = self.running.take() {
            r.join();
        }
    }
}

fn upstream(scheme: &str, origin: SocketAddr, tls: Value) -> Value {
    json!({
        "scheme": scheme,
        "pass_host": "rewrite", "upstream_host": "origin.test",
        "nodes": [{"host": "127.0.0.1", "port": origin.port(), "weight": 1}],
        "tls": tls,
        "retries": 0,
    })
}

fn inline(p: &Pki) -> Value {
    json!({"client_cert": p.cert.pem(), "client_key": p.key.serialize_pem()})
}

#[test]
fn https_upstream_presents_the_inline_client_certificate() {
    let ca = Pki::ca("origin ca");
    let client_ca = Pki::ca("client ca");
    let origin = mtls_origin(&ca.leaf(&["origin.test"], ecdsa()), &client_ca);
    let good = client_ca.leaf(&["gateway.test"], ecdsa());
    let rogue = Pki::ca("rogue ca").leaf(&["gateway.test"], ecdsa());

    let gw = PlainGw::start(
        resources_with(upstream("https", origin.addr, inline(&good)), vec![]).unwrap(),
    );
    let r = gw.get();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.ends_with("mtls"), "{r}");
    assert_eq!(origin.served.load(Ordering::SeqCst), 1);

    // Without a certificate, and with one the origin does not trust: the handshake fails, nothing is forwarded.
    for tls in [json!({}), inline(&rogue)] {
        let gw =
            PlainGw::start(resources_with(upstream("https", origin.addr, tls), vec![]).unwrap());
        let r = gw.get();
        assert!(r.starts_with("HTTP/1.1 502"), "{r}");
    }
    assert_eq!(
        origin.served.load(Ordering::SeqCst),
        1,
        "refused handshakes forwarded nothing"
    );
}

#[test]
fn client_cert_id_names_a_client_ssl_and_is_validated() {
    let ca = Pki::ca("origin ca");
    let client_ca = Pki::ca("client ca");
    let origin = mtls_origin(&ca.leaf(&["origin.test"], ecdsa()), &client_ca);
    let good = client_ca.leaf(&["gateway.test"], ecdsa());
    let client_ssl = json!({"id": "c1", "type": "client", "cert": good.cert.pem(), "key": good.key.serialize_pem()});
    let by_id = json!({"client_cert_id": "c1"});

    let snap = resources_with(
        upstream("https", origin.addr, by_id.clone()),
        vec![client_ssl.clone()],
    )
    .unwrap();
    let gw = PlainGw::start(snap);
    let r = gw.get();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // A client ssl is never served by SNI (it has none): it does not make the TLS listener's table fail.
    drop(gw);

    let e = resources_with(
        upstream("https", origin.addr, json!({"client_cert_id": "nope"})),
        vec![],
    )
    .err()
    .unwrap();
    assert!(
        e.contains("failed to fetch ssl info by ssl id [nope], response code: 404"),
        "{e}"
    );
    let mut server_ssl = ssl("s1", &["gateway.test"], &[&good]);
    server_ssl["type"] = json!("server");
    let e = resources_with(
        upstream("https", origin.addr, json!({"client_cert_id": "s1"})),
        vec![server_ssl],
    )
    .err()
    .unwrap();
    assert!(e.contains("wrong ssl type"), "{e}");
    let mut mismatched = inline(&good);
    mismatched["client_key"] = json!(ecdsa().serialize_pem());
    let e = resources_with(upstream("https", origin.addr, mismatched), vec![])
        .err()
        .unwrap();
    assert!(e.contains("do not match"), "{e}");
}

#[test]
fn grpcs_upstream_presents_the_client_certificate() {
    let ca = Pki::ca("origin ca");
    let client_ca = Pki::ca("client ca");
    let origin = mtls_origin(&ca.leaf(&["origin.test"], ecdsa()), &client_ca);
    let good = client_ca.leaf(&["gateway.test"], ecdsa());
    let gw = PlainGw::start(
        resources_with(upstream("grpcs", origin.addr, inline(&good)), vec![]).unwrap(),
    );
    let r = gw.get();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("h2mtls") && r.contains("grpc-status: 0"), "{r}");
    let gw =
        PlainGw::start(resources_with(upstream("grpcs", origin.addr, json!({})), vec![]).unwrap());
    let r = gw.get();
    assert!(r.starts_with("HTTP/1.1 502"), "{r}");
    assert_eq!(origin.served.load(Ordering::SeqCst), 1);
}

#[test]
fn https_active_probes_present_the_client_certificate() {
    let ca = Pki::ca("origin ca");
    let client_ca = Pki::ca("client ca");
    let origin = mtls_origin(&ca.leaf(&["origin.test"], ecdsa()), &client_ca);
    let good = client_ca.leaf(&["gateway.test"], ecdsa());
    let checks = json!({"active": {
        "type": "https", "http_path": "/health", "timeout": 0.5,
        "healthy": {"interval": 0.05, "successes": 1},
        "unhealthy": {"interval": 0.05, "http_failures": 1, "tcp_failures": 1},
    }});
    // Two upstreams on the same origin, with and without the certificate.
    let res: Resources = serde_json::from_value(json!({
        "upstreams": [
            {"id": "with", "checks": checks, "tls": inline(&good),
             "nodes": [{"host": "127.0.0.1", "port": origin.addr.port(), "weight": 1}]},
            {"id": "without", "checks": checks,
             "nodes": [{"host": "127.0.0.1", "port": origin.addr.port(), "weight": 1}]},
        ],
        "routes": [{"id": "1", "uri": "/a", "upstream_id": "with"},
                   {"id": "2", "uri": "/b", "upstream_id": "without"}],
    }))
    .unwrap();
    let gw = PlainGw::start(Snapshot::compile(&res, 1).unwrap());
    let fut = gw.gw.run_health_checks();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(fut)
    });
    let state = |key: &str| {
        gw.gw
            .node_health()
            .into_iter()
            .find(|u| u.key == key)
            .map(|u| {
                (
                    u.nodes[0].status.healthy,
                    origin.served.load(Ordering::SeqCst),
                )
            })
    };
    let t = std::time::Instant::now();
    loop {
        let (with, without) = (state("u:with"), state("u:without"));
        if with.is_some_and(|(h, served)| h && served >= 3) && without.is_some_and(|(h, _)| !h) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "probes: with {with:?}, without {without:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
