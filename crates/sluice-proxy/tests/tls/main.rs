//! TLS termination through the real proxy: certificates generated per test (rcgen; RSA keys from the openssl CLI,
//! which ring cannot generate), an in-process gateway on a `Tls` listener, an in-process cleartext origin, and a
//! blocking rustls client that records the certificate it was shown. Covers SNI exact/wildcard selection, RSA vs
//! ECDSA per SNI, rotation by publishing a snapshot, mTLS accept/reject, TLS 1.2/1.3 and session resumption;
//! `listener.rs` the node-level settings (`fallback_sni`, `client.depth`), `upstream.rs` client certificates
//! towards upstreams.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde_json::{json, Value};
use sluice_model::Resources;
use sluice_proxy::{Gateway, ListenerKind, Listeners, ProxyConfig, Running, Snapshot};

mod listener;
mod smuggling;
mod upstream;

/// A CA, or a leaf it signed.
struct Pki {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Pki {
    fn ca(name: &str) -> Pki {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Pki { cert, key }
    }

    fn leaf(&self, names: &[&str], key: KeyPair) -> Pki {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let p = CertificateParams::new(names).unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        Pki { cert, key }
    }

    fn der(&self) -> Vec<u8> {
        self.cert.der().to_vec()
    }
}

fn ecdsa() -> KeyPair {
    KeyPair::generate().unwrap()
}

fn rsa() -> KeyPair {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl CLI (RSA key generation)");
    assert!(out.status.success(), "openssl genpkey failed");
    let pem = String::from_utf8(out.stdout).unwrap();
    KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256).unwrap()
}

/// An origin answering `200 origin` on every request of every connection.
fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\norigin";
                        if c.write_all(r).is_err() {
                            return;
                        }
                    }
                    match c.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

fn ssl(id: &str, snis: &[&str], certs: &[&Pki]) -> Value {
    let mut v = json!({
        "id": id,
        "snis": snis,
        "cert": certs[0].cert.pem(),
        "key": certs[0].key.serialize_pem(),
    });
    if certs.len() > 1 {
        v["certs"] = json!(certs[1..].iter().map(|c| c.cert.pem()).collect::<Vec<_>>());
        v["keys"] = json!(certs[1..]
            .iter()
            .map(|c| c.key.serialize_pem())
            .collect::<Vec<_>>());
    }
    v
}

fn resources(origin: SocketAddr, ssls: Vec<Value>) -> Resources {
    serde_json::from_value(json!({
        "routes": [{"id": "1", "uri": "/*", "upstream": {"nodes": {origin.to_string(): 1}}}],
        "ssls": ssls,
    }))
    .unwrap()
}

struct Gw {
    gw: Gateway,
    addr: SocketAddr,
    origin: SocketAddr,
    running: Option<Running>,
}

impl Gw {
    fn start(ssls: Vec<Value>) -> Gw {
        Gw::start_with(ssls, ProxyConfig::default())
    }

    fn start_with(ssls: Vec<Value>, cfg: ProxyConfig) -> Gw {
        let origin = origin();
        let snap = Snapshot::compile(&resources(origin, ssls), 1).expect("compiles");
        let gw = Gateway::new(cfg, snap);
        let l = Listeners::bind_kinds(&[("127.0.0.1:0".parse().unwrap(), ListenerKind::Tls)], 1)
            .unwrap();
        let addr = l.local_addrs[0];
        let running = Some(gw.start(l).unwrap());
        Gw {
            gw,
            addr,
            origin,
            running,
        }
    }

    fn publish(&self, ssls: Vec<Value>, rev: u64) {
        let prev = self.gw.snapshot();
        let snap = Snapshot::compile_next(
            &resources(self.origin, ssls),
            rev,
            &Default::default(),
            Some(&prev),
        )
        .unwrap();
        self.gw.publish(snap);
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.gw.shutdown();
        if let Some(r) = self.running.take() {
            r.join();
        }
    }
}

/// Accepts any server certificate and records the leaf; offers only `schemes` when set.
#[derive(Debug)]
struct Record {
    seen: Mutex<Option<Vec<u8>>>,
    schemes: Option<Vec<SignatureScheme>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Record {
    fn verify_server_cert(
        &self,
        end: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.seen.lock().unwrap() = Some(end.to_vec());
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            m,
            c,
            d,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            m,
            c,
            d,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone().unwrap_or_else(|| {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        })
    }
}

struct Client {
    cfg: Arc<rustls::ClientConfig>,
    record: Arc<Record>,
}

fn client_with(
    versions: &[&'static rustls::SupportedProtocolVersion],
    schemes: Option<Vec<SignatureScheme>>,
    auth: Option<&Pki>,
) -> Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let record = Arc::new(Record {
        seen: Mutex::new(None),
        schemes,
        provider: provider.clone(),
    });
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(record.clone());
    let mut cfg = match auth {
        Some(p) => b
            .with_client_auth_cert(
                vec![p.cert.der().clone()],
                PrivateKeyDer::try_from(p.key.serialize_der()).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Client {
        cfg: Arc::new(cfg),
        record,
    }
}

fn client() -> Client {
    client_with(rustls::DEFAULT_VERSIONS, None, None)
}

/// What one HTTPS GET through the gateway gave.
#[derive(Debug)]
struct Got {
    status: u16,
    cert: Vec<u8>,
    resumed: bool,
    version: Option<rustls::ProtocolVersion>,
    alpn: Option<Vec<u8>>,
}

impl Client {
    fn get(&self, addr: SocketAddr, sni: &str) -> Result<Got, String> {
        let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let name = ServerName::try_from(sni.to_string()).unwrap();
        let conn = rustls::ClientConnection::new(self.cfg.clone(), name).unwrap();
        let mut s = rustls::StreamOwned::new(conn, tcp);
        let req = format!("GET /x HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        // The gateway closes after the response; a missing close_notify is fine here.
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
        let status = text
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no response: {text:?}"))?;
        Ok(Got {
            status,
            cert: self.record.seen.lock().unwrap().take().unwrap_or_default(),
            resumed: s.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
            version: s.conn.protocol_version(),
            alpn: s.conn.alpn_protocol().map(<[u8]>::to_vec),
        })
    }
}

#[test]
fn sni_selects_exact_then_wildcard_and_refuses_unknown() {
    let ca = Pki::ca("test ca");
    let exact = ca.leaf(&["api.example.com"], ecdsa());
    let wild = ca.leaf(&["*.example.com"], ecdsa());
    let other = ca.leaf(&["other.test"], ecdsa());
    let gw = Gw::start(vec![
        ssl("1", &["*.example.com"], &[&wild]),
        ssl("2", &["api.example.com"], &[&exact]),
        ssl("3", &["other.test"], &[&other]),
    ]);
    // A fresh client each time: a resumed session shows no certificate.
    let g = client().get(gw.addr, "api.example.com").unwrap();
    assert_eq!(g.status, 200);
    assert_eq!(g.cert, exact.der(), "exact SNI wins over the wildcard");
    let g = client().get(gw.addr, "www.example.com").unwrap();
    assert_eq!(g.cert, wild.der());
    // Case-insensitive.
    let g = client().get(gw.addr, "WWW.Example.COM").unwrap();
    assert_eq!(g.cert, wild.der());
    assert_eq!(
        client().get(gw.addr, "other.test").unwrap().cert,
        other.der()
    );
    // A wildcard covers one label only; unknown names get no certificate.
    assert!(client().get(gw.addr, "a.b.example.com").is_err());
    assert!(client().get(gw.addr, "example.com").is_err());
    assert!(client().get(gw.addr, "nobody.test").is_err());
}

#[test]
fn rsa_and_ecdsa_certificates_for_one_sni() {
    let ca = Pki::ca("test ca");
    let ec = ca.leaf(&["dual.test"], ecdsa());
    let rs = ca.leaf(&["dual.test"], rsa());
    let gw = Gw::start(vec![ssl("1", &["dual.test"], &[&rs, &ec])]);
    use SignatureScheme::*;
    let only_ec = client_with(
        rustls::DEFAULT_VERSIONS,
        Some(vec![ECDSA_NISTP256_SHA256]),
        None,
    );
    let only_rsa = client_with(
        rustls::DEFAULT_VERSIONS,
        Some(vec![RSA_PSS_SHA256, RSA_PKCS1_SHA256]),
        None,
    );
    assert_eq!(only_ec.get(gw.addr, "dual.test").unwrap().cert, ec.der());
    assert_eq!(only_rsa.get(gw.addr, "dual.test").unwrap().cert, rs.der());
    let g = only_rsa.get(gw.addr, "dual.test").unwrap();
    assert_eq!(g.status, 200);
}

#[test]
fn certificate_rotation_by_publishing_without_restart() {
    let ca = Pki::ca("test ca");
    let old = ca.leaf(&["rot.test"], ecdsa());
    let new = ca.leaf(&["rot.test"], ecdsa());
    let gw = Gw::start(vec![ssl("1", &["rot.test"], &[&old])]);
    let c = client();
    assert_eq!(c.get(gw.addr, "rot.test").unwrap().cert, old.der());
    assert!(c.get(gw.addr, "new.test").is_err());
    gw.publish(
        vec![
            ssl("1", &["rot.test"], &[&new]),
            ssl("2", &["new.test"], &[&new]),
        ],
        2,
    );
    // Fresh client: no resumption of the old session.
    let c = client();
    let g = c.get(gw.addr, "rot.test").unwrap();
    assert_eq!(g.cert, new.der(), "the published certificate is served");
    assert_eq!(g.status, 200);
    assert_eq!(c.get(gw.addr, "new.test").unwrap().status, 200);
    // Removing the ssl removes the name.
    gw.publish(vec![ssl("2", &["new.test"], &[&new])], 3);
    assert!(client().get(gw.addr, "rot.test").is_err());
}

#[test]
fn mtls_per_sni_accepts_trusted_clients_and_rejects_others() {
    let ca = Pki::ca("server ca");
    let client_ca = Pki::ca("client ca");
    let rogue_ca = Pki::ca("rogue ca");
    let srv = ca.leaf(&["mtls.test"], ecdsa());
    let open = ca.leaf(&["open.test"], ecdsa());
    let mut m = ssl("1", &["mtls.test"], &[&srv]);
    m["client"] = json!({"ca": client_ca.cert.pem(), "depth": 1});
    let gw = Gw::start(vec![m, ssl("2", &["open.test"], &[&open])]);

    let good = client_ca.leaf(&["client.test"], ecdsa());
    let bad = rogue_ca.leaf(&["client.test"], ecdsa());
    let with_good = client_with(rustls::DEFAULT_VERSIONS, None, Some(&good));
    let with_bad = client_with(rustls::DEFAULT_VERSIONS, None, Some(&bad));
    assert_eq!(with_good.get(gw.addr, "mtls.test").unwrap().status, 200);
    assert!(
        with_bad.get(gw.addr, "mtls.test").is_err(),
        "untrusted client cert"
    );
    assert!(
        client().get(gw.addr, "mtls.test").is_err(),
        "no client cert"
    );
    // Only that SNI asks for a client certificate.
    assert_eq!(client().get(gw.addr, "open.test").unwrap().status, 200);
    for v in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let c = client_with(&[v], None, Some(&good));
        assert_eq!(c.get(gw.addr, "mtls.test").unwrap().status, 200);
        let c = client_with(&[v], None, None);
        assert!(c.get(gw.addr, "mtls.test").is_err());
    }
}

#[test]
fn tls12_and_tls13_with_session_resumption_and_http11_alpn() {
    let ca = Pki::ca("test ca");
    let leaf = ca.leaf(&["res.test"], ecdsa());
    let gw = Gw::start(vec![ssl("1", &["res.test"], &[&leaf])]);
    for (v, want) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let c = client_with(&[v], None, None);
        let first = c.get(gw.addr, "res.test").unwrap();
        assert_eq!(first.version, Some(want));
        assert!(!first.resumed);
        assert_eq!(first.alpn.as_deref(), Some(&b"http/1.1"[..]));
        let second = c.get(gw.addr, "res.test").unwrap();
        assert_eq!(second.status, 200);
        assert!(second.resumed, "{want:?}: second handshake resumes");
    }
}

#[test]
fn alpn_prefers_h2_and_falls_back_to_http11() {
    let ca = Pki::ca("test ca");
    let leaf = ca.leaf(&["alpn.test"], ecdsa());
    let gw = Gw::start(vec![ssl("1", &["alpn.test"], &[&leaf])]);
    let alpn = |offer: Vec<Vec<u8>>| {
        let mut cfg = (*client().cfg).clone();
        cfg.alpn_protocols = offer;
        let tcp = TcpStream::connect(gw.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let name = ServerName::try_from("alpn.test").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        let mut tcp = tcp;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).unwrap();
        }
        conn.alpn_protocol().map(<[u8]>::to_vec)
    };
    assert_eq!(
        alpn(vec![b"h2".to_vec(), b"http/1.1".to_vec()]).as_deref(),
        Some(&b"h2"[..])
    );
    assert_eq!(
        alpn(vec![b"http/1.1".to_vec()]).as_deref(),
        Some(&b"http/1.1"[..])
    );
    assert_eq!(alpn(vec![]), None);
}

#[test]
fn invalid_ssl_resources_do_not_compile() {
    let ca = Pki::ca("test ca");
    let a = ca.leaf(&["a.test"], ecdsa());
    let b = ca.leaf(&["a.test"], ecdsa());
    let origin: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let mut mismatched = ssl("1", &["a.test"], &[&a]);
    mismatched["key"] = json!(b.key.serialize_pem());
    let err = Snapshot::compile(&resources(origin, vec![mismatched]), 1)
        .err()
        .expect("mismatched key rejected");
    assert!(err.contains("ssl 1"), "{err}");
    let mut garbage = ssl("2", &["a.test"], &[&a]);
    garbage["cert"] = json!("not a pem");
    assert!(Snapshot::compile(&resources(origin, vec![garbage]), 1).is_err());
    // Disabled ssls are skipped.
    let mut off = ssl("3", &["a.test"], &[&a]);
    off["cert"] = json!("not a pem");
    off["status"] = json!(0);
    assert!(Snapshot::compile(&resources(origin, vec![off]), 1).is_ok());
}

#[test]
fn slow_handshake_is_cut_by_the_header_timeout() {
    let ca = Pki::ca("test ca");
    let leaf = ca.leaf(&["slow.test"], ecdsa());
    let origin = origin();
    let snap = Snapshot::compile(
        &resources(origin, vec![ssl("1", &["slow.test"], &[&leaf])]),
        1,
    )
    .unwrap();
    let cfg = ProxyConfig {
        header_timeout: Duration::from_millis(300),
        ..ProxyConfig::default()
    };
    let gw = Gateway::new(cfg, snap);
    let l =
        Listeners::bind_kinds(&[("127.0.0.1:0".parse().unwrap(), ListenerKind::Tls)], 1).unwrap();
    let addr = l.local_addrs[0];
    let running = gw.start(l).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Half a TLS record header, then silence.
    s.write_all(&[0x16, 0x03]).unwrap();
    let t = std::time::Instant::now();
    let mut b = [0u8; 64];
    let n = s.read(&mut b).unwrap_or(0);
    assert_eq!(n, 0, "closed without a response");
    assert!(t.elapsed() < Duration::from_secs(3));
    gw.shutdown();
    running.join();
}
