//! Node-level TLS listener settings: `apisix.ssl.fallback_sni` (the name assumed when a client sends no SNI) and
//! the mTLS chain depth limit `client.depth`.

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
