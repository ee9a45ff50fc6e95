//! TLS termination for the `Tls` listener kind (APISIX `apisix.ssl`, port 9443): certificates from `ssls`
//! resources, chosen by SNI.
//!
//! Every enabled `ssls` entry compiles, at snapshot compile, into one rustls `ServerConfig` holding all its
//! certificates (`cert`/`key` plus `certs`/`keys`, RSA and ECDSA side by side: the handshake picks the one whose key
//! can sign with a scheme the client offers) and, when `client.ca` is set, a client-certificate verifier (mTLS for
//! that SNI only). The [`SniTable`] maps exact names and `*.suffix` wildcards to those configs. Since the table lives
//! in the [`crate::Snapshot`], rotating a certificate is publishing a new snapshot: the next handshake reads the new
//! table, connections already established keep the key they negotiated.
//!
//! The handshake reads the ClientHello first (`LazyConfigAcceptor`) so the per-SNI config, including its client
//! verifier, is chosen before the server speaks. ALPN offers h2 then http/1.1; `h2` connections go to `crate::h2`. Session tickets come from one process-wide ticketer, so resumption
//! survives snapshot swaps. This module does not speak HTTP: `accept` hands the decrypted stream to `Conn`.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use ahash::AHashMap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use sluice_model::Ssl;
use tokio::net::TcpStream;
use tokio_rustls::LazyConfigAcceptor;

use crate::conn::Conn;
use crate::server::Worker;
use crate::slots::Slot;
use crate::tls::{certified_key, provider};

/// ALPN protocols offered on TLS listeners, preferred first (a client that offers none gets HTTP/1.1).
const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// One enabled `ssls` entry, compiled.
pub(crate) struct Site {
    pub config: Arc<ServerConfig>,
    /// `client.skip_mtls_uri_regex`: the client certificate is optional in the handshake, and a connection without
    /// one may only request paths these match (others get 400, as APISIX).
    pub skip_mtls: Option<Arc<SkipMtls>>,
}

/// The paths a connection without a client certificate may request (unanchored, as APISIX's `ngx.re.find`).
pub(crate) struct SkipMtls(Vec<regex::Regex>);

impl SkipMtls {
    pub(crate) fn allows(&self, path: &[u8]) -> bool {
        let path = std::str::from_utf8(path).unwrap_or("");
        self.0.iter().any(|r| r.is_match(path))
    }
}

/// Compiled `ssls`: SNI -> server configuration.
#[derive(Default)]
pub(crate) struct SniTable {
    exact: AHashMap<Box<str>, Arc<Site>>,
    /// Keyed by the suffix after `*.` (`*.example.com` -> `example.com`).
    wildcard: AHashMap<Box<str>, Arc<Site>>,
    /// `*` alone: any name, and clients that send no SNI (APISIX 3.14's catch-all).
    any: Option<Arc<Site>>,
}

impl std::fmt::Debug for SniTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniTable")
            .field("exact", &self.exact.keys().collect::<Vec<_>>())
            .field("wildcard", &self.wildcard.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl SniTable {
    /// Compiles every enabled `ssls` entry (`status` absent or 1). An error names the ssl at fault.
    pub(crate) fn compile(ssls: &[Ssl]) -> Result<SniTable, String> {
        let mut t = SniTable::default();
        // `type: "client"` entries are certificates for upstream mTLS (`tls.client_cert_id`), never served.
        let served = |s: &&Ssl| s.status.unwrap_or(1) == 1 && s.kind.as_deref() != Some("client");
        for s in ssls.iter().filter(served) {
            let cfg = site(s).map_err(|e| format!("ssl {}: {e}", s.id))?;
            let mut names: Vec<&str> = s.snis.iter().map(String::as_str).collect();
            names.extend(s.sni.as_deref());
            if names.is_empty() {
                return Err(format!("ssl {}: one of sni or snis is required", s.id));
            }
            for n in names {
                let n = n.to_ascii_lowercase();
                if n == "*" {
                    t.any = Some(cfg.clone());
                    continue;
                }
                match n.strip_prefix("*.") {
                    Some(suffix) => t.wildcard.insert(suffix.into(), cfg.clone()),
                    None => t.exact.insert(n.into(), cfg.clone()),
                };
            }
        }
        Ok(t)
    }

    /// Exact name first, then a wildcard covering exactly one leftmost label (APISIX's radixtree_sni and RFC 6125
    /// 6.4.3: `*.example.com` matches `a.example.com`, neither `example.com` nor `a.b.example.com`), then `*`.
    pub(crate) fn lookup(&self, sni: Option<&str>) -> Option<&Arc<Site>> {
        sni.and_then(|n| self.lookup_name(n)).or(self.any.as_ref())
    }

    fn lookup_name(&self, sni: &str) -> Option<&Arc<Site>> {
        // SNI is case-insensitive; clients almost always send lowercase, so only fold when needed.
        let lower;
        let sni = if sni.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = sni.to_ascii_lowercase();
            lower.as_str()
        } else {
            sni
        };
        if let Some(c) = self.exact.get(sni) {
            return Some(c);
        }
        let (_, suffix) = sni.split_once('.')?;
        self.wildcard.get(suffix)
    }
}

/// Terminates TLS on an accepted connection and serves HTTP/1.1 over it. The handshake (ClientHello included) must
/// finish within the header timeout from the accept, which is also the first request head's deadline. A client that sends no SNI is served as if it had sent
/// `apisix.ssl.fallback_sni` (when set); an unknown or missing name ends the connection with an alert, as APISIX does.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    slot: Rc<Slot>,
    w: Rc<Worker>,
) {
    let deadline = slot.opened + w.shared.cfg.header_timeout;
    let handshake = async {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
        let snap = w.shared.snapshot.load();
        let hello = start.client_hello();
        let sni = hello.server_name().or(w.shared.cfg.fallback_sni.as_deref());
        let site = snap.tls.lookup(sni).cloned();
        drop(snap);
        let Some(site) = site else {
            return Err(std::io::Error::other(
                "no certificate for the requested SNI",
            ));
        };
        let tls = start.into_stream(site.config.clone()).await?;
        // Without a certificate, a site with skip_mtls_uri_regex serves only the paths it lists.
        let gate = match tls.get_ref().1.peer_certificates() {
            Some(_) => None,
            None => site.skip_mtls.clone(),
        };
        Ok((tls, gate))
    };
    match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok((tls, gate))) => {
            if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                slot.set_busy();
                crate::h2::serve_gated(tls, peer, local, "https", w, gate).await
            } else {
                Conn::new(tls, peer, local, "https", w)
                    .with_slot(slot)
                    .with_mtls_gate(gate)
                    .run()
                    .await
            }
        }
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
    }
}

/// One ticketer for the process: tickets issued before a snapshot swap still resume after it.
fn ticketer() -> Result<Arc<dyn rustls::server::ProducesTickets>, String> {
    static T: OnceLock<Arc<dyn rustls::server::ProducesTickets>> = OnceLock::new();
    if let Some(t) = T.get() {
        return Ok(t.clone());
    }
    let t = rustls::crypto::ring::Ticketer::new().map_err(|e| e.to_string())?;
    Ok(T.get_or_init(|| t).clone())
}

/// Session-id cache shared by every config (TLS 1.2 clients without ticket support).
fn session_cache() -> Arc<dyn rustls::server::StoresServerSessions> {
    static C: OnceLock<Arc<rustls::server::ServerSessionMemoryCache>> = OnceLock::new();
    C.get_or_init(|| rustls::server::ServerSessionMemoryCache::new(16 * 1024))
        .clone()
}

fn site(s: &Ssl) -> Result<Arc<Site>, String> {
    let skip: Vec<regex::Regex> = match s.client.as_ref().and_then(|c| c.get("skip_mtls_uri_regex"))
    {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .ok_or("client.skip_mtls_uri_regex must be an array")?
            .iter()
            .map(|r| {
                let r = r
                    .as_str()
                    .ok_or("client.skip_mtls_uri_regex holds a non-string")?;
                regex::Regex::new(r).map_err(|e| format!("client.skip_mtls_uri_regex {r:?}: {e}"))
            })
            .collect::<Result<_, String>>()?,
    };
    let skip_mtls = (!skip.is_empty() && s.client.is_some()).then(|| Arc::new(SkipMtls(skip)));
    Ok(Arc::new(Site {
        config: server_config(s, skip_mtls.is_some())?,
        skip_mtls,
    }))
}

fn server_config(s: &Ssl, optional_client_cert: bool) -> Result<Arc<ServerConfig>, String> {
    let mut keys = vec![certified_key(&s.cert, &s.key)?];
    if s.certs.len() != s.keys.len() {
        return Err("certs and keys must have the same length".into());
    }
    for (c, k) in s.certs.iter().zip(&s.keys) {
        keys.push(certified_key(c, k)?);
    }
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let builder = match client_ca(s, optional_client_cert)? {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(Arc::new(MultiCert(keys)));
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    cfg.ticketer = ticketer()?;
    cfg.session_storage = session_cache();
    Ok(Arc::new(cfg))
}

/// `client.ca` (PEM): client certificates are required and verified against it, through at most `client.depth`
/// intermediates (default 1, as APISIX and nginx's `ssl_verify_depth`). With `optional` (skip_mtls_uri_regex) a
/// client may send none; one it sends must still verify.
fn client_ca(
    s: &Ssl,
    optional: bool,
) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, String> {
    let Some(ca) = s
        .client
        .as_ref()
        .and_then(|c| c.get("ca"))
        .and_then(|c| c.as_str())
    else {
        return Ok(None);
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        let c = c.map_err(|e| format!("invalid client.ca: {e}"))?;
        roots
            .add(c)
            .map_err(|e| format!("invalid client.ca: {e}"))?;
    }
    if roots.is_empty() {
        return Err("client.ca holds no PEM certificate".into());
    }
    let depth = match s.client.as_ref().and_then(|c| c.get("depth")) {
        None => 1,
        Some(d) => d
            .as_u64()
            .ok_or("client.depth must be a non-negative integer")? as usize,
    };
    let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    let b = if optional {
        b.allow_unauthenticated()
    } else {
        b
    };
    let v = b.build().map_err(|e| format!("client.ca: {e}"))?;
    Ok(Some(Arc::new(depth::Limited { inner: v, depth })))
}

/// Every certificate of one `ssls` entry; the first whose key can sign with a scheme the client offers wins, so an
/// ECDSA-only client gets the ECDSA certificate and an RSA-only one the RSA certificate.
#[derive(Debug)]
struct MultiCert(Vec<Arc<CertifiedKey>>);

impl ResolvesServerCert for MultiCert {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let offered = hello.signature_schemes();
        self.0
            .iter()
            .find(|k| k.key.choose_scheme(offered).is_some())
            .cloned()
    }
}

mod depth;
#[cfg(test)]
mod tests;
