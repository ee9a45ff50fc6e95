//! TLS listener settings beyond certificate choice: `apisix.ssl.fallback_sni` (the name assumed when a client sends
//! no SNI), the mTLS chain depth limit `client.depth`, and `client.skip_mtls_uri_regex` over HTTP/1.1 and h2.

use super::*;

impl Pki {
    /// An intermediate CA signed by `self`.
    fn sub_ca(&self, name: &str) -> Pki {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        let key = ecdsa();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        Pki { cert, key }
    }
}

/// A client presenting `chain` (leaf first; the key is the leaf's).
fn client_chain(chain: &[&Pki]) -> Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let record = Arc::new(Record {
        seen: Mutex::new(None),
        schemes: None,
        provider: provider.clone(),
    });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(record.clone())
        .with_client_auth_cert(
            chain.iter().map(|p| p.cert.der().clone()).collect(),
            PrivateKeyDer::try_from(chain[0].key.serialize_der()).unwrap(),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Client {
        cfg: Arc::new(cfg),
        record,
    }
}

/// A client that sends no SNI extension at all.
fn no_sni() -> Client {
    let c = client();
    let mut cfg = (*c.cfg).clone();
    cfg.enable_sni = false;
    Client {
        cfg: Arc::new(cfg),
        record: c.record,
    }
}

#[test]
fn fallback_sni_serves_clients_that_send_no_sni() {
    let ca = Pki::ca("test ca");
    let fb = ca.leaf(&["fallback.test"], ecdsa());
    let other = ca.leaf(&["other.test"], ecdsa());
    let ssls = || {
        vec![
            ssl("1", &["fallback.test"], &[&fb]),
            ssl("2", &["other.test"], &[&other]),
        ]
    };
    // Without the setting, a client without SNI gets no certificate (no `*` ssl).
    let plain = Gw::start(ssls());
    assert!(no_sni().get(plain.addr, "x.test").is_err());
    drop(plain);

    // Read from config.yaml's shape: `apisix.ssl.fallback_sni` (case-insensitive, as SNI).
    let node: sluice_model::NodeConfig =
        serde_json::from_value(json!({"apisix": {"ssl": {"fallback_sni": "Fallback.Test"}}}))
            .unwrap();
    let cfg = ProxyConfig::from_node(&node);
    assert_eq!(cfg.fallback_sni.as_deref(), Some("fallback.test"));
    let gw = Gw::start_with(ssls(), cfg);
    let g = no_sni().get(gw.addr, "x.test").unwrap();
    assert_eq!(g.status, 200);
    assert_eq!(g.cert, fb.der(), "the fallback name's certificate");
    // A client that names a host still gets that host's certificate, and an unknown name is still refused.
    assert_eq!(
        client().get(gw.addr, "other.test").unwrap().cert,
        other.der()
    );
    assert!(client().get(gw.addr, "unknown.test").is_err());
}

#[test]
fn client_depth_bounds_the_intermediates_of_a_client_chain() {
    let ca = Pki::ca("server ca");
    let srv = ca.leaf(&["depth.test"], ecdsa());
    let root = Pki::ca("client root");
    let mid1 = root.sub_ca("client mid 1");
    let mid2 = mid1.sub_ca("client mid 2");
    let direct = root.leaf(&["c0.test"], ecdsa());
    let one = mid1.leaf(&["c1.test"], ecdsa());
    let two = mid2.leaf(&["c2.test"], ecdsa());
    let at = |depth: Option<u64>| {
        let mut m = ssl("1", &["depth.test"], &[&srv]);
        m["client"] = match depth {
            Some(d) => json!({"ca": root.cert.pem(), "depth": d}),
            None => json!({"ca": root.cert.pem()}),
        };
        Gw::start(vec![m])
    };
    let ok = |gw: &Gw, chain: &[&Pki]| {
        client_chain(chain)
            .get(gw.addr, "depth.test")
            .is_ok_and(|g| g.status == 200)
    };
    let gw = at(Some(0));
    assert!(ok(&gw, &[&direct]), "depth 0: signed by the CA itself");
    assert!(!ok(&gw, &[&one, &mid1]), "depth 0: no intermediate");
    drop(gw);
    // APISIX's default depth is 1.
    let gw = at(None);
    assert!(ok(&gw, &[&direct]));
    assert!(ok(&gw, &[&one, &mid1]), "depth 1: one intermediate");
    assert!(
        !ok(&gw, &[&two, &mid2, &mid1]),
        "depth 1: two intermediates"
    );
    drop(gw);
    let gw = at(Some(2));
    assert!(ok(&gw, &[&two, &mid2, &mid1]), "depth 2: two intermediates");
}

/// One `GET path` over a fresh TLS connection; the status, or why there was none.
fn status_of(c: &Client, addr: SocketAddr, sni: &str, path: &str) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(c.cfg.clone(), name).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let req = format!("GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if out.is_empty() => return Err(e.to_string()),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&out);
    text.get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no response: {text:?}"))
}

#[test]
fn skip_mtls_uri_regex_lets_listed_paths_through_without_a_certificate() {
    let ca = Pki::ca("server ca");
    let srv = ca.leaf(&["skip.test"], ecdsa());
    let client_ca = Pki::ca("client ca");
    let good = client_ca.leaf(&["c.test"], ecdsa());
    let rogue = Pki::ca("rogue").leaf(&["c.test"], ecdsa());
    let mut m = ssl("1", &["skip.test"], &[&srv]);
    m["client"] =
        json!({"ca": client_ca.cert.pem(), "skip_mtls_uri_regex": ["^/public/", "/health$"]});
    let gw = Gw::start(vec![m]);
    let anon = client();
    assert_eq!(status_of(&anon, gw.addr, "skip.test", "/public/a"), Ok(200));
    assert_eq!(
        status_of(&anon, gw.addr, "skip.test", "/svc/health"),
        Ok(200)
    );
    assert_eq!(
        status_of(&anon, gw.addr, "skip.test", "/private"),
        Ok(400),
        "other paths need the certificate"
    );
    let with_good = client_with(rustls::DEFAULT_VERSIONS, None, Some(&good));
    assert_eq!(
        status_of(&with_good, gw.addr, "skip.test", "/private"),
        Ok(200)
    );
    // A certificate that is sent must verify (APISIX answers 400 there; the handshake fails here).
    let with_rogue = client_with(rustls::DEFAULT_VERSIONS, None, Some(&rogue));
    assert!(status_of(&with_rogue, gw.addr, "skip.test", "/public/a").is_err());
    // The same gate on every h2 stream of a connection without a certificate.
    let statuses = h2_statuses(gw.addr, "skip.test", &["/public/a", "/private"]);
    assert_eq!(statuses, [200, 400]);
    // An invalid regex fails the compile.
    let mut bad = ssl("2", &["bad.test"], &[&srv]);
    bad["client"] = json!({"ca": client_ca.cert.pem(), "skip_mtls_uri_regex": ["("]});
    let origin: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let e = Snapshot::compile(&resources(origin, vec![bad]), 1)
        .err()
        .unwrap();
    assert!(e.contains("skip_mtls_uri_regex"), "{e}");
}

/// The status of a GET per path, as streams of one h2 connection (ALPN h2, no client certificate).
fn h2_statuses(addr: SocketAddr, sni: &str, paths: &[&str]) -> Vec<u16> {
    let mut cfg = (*client().cfg).clone();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
            .unwrap();
        let (client, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut out = Vec::new();
        for p in paths {
            let mut c = client.clone().ready().await.unwrap();
            let req = http::Request::get(format!("https://{sni}{p}"))
                .body(())
                .unwrap();
            let (resp, _) = c.send_request(req, true).unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(5), resp)
                .await
                .unwrap()
                .unwrap();
            out.push(resp.status().as_u16());
        }
        out
    })
}
