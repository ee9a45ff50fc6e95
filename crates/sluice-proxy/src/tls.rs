//! TLS towards upstreams (`scheme: https`/`grpcs`, https health probes): rustls client configurations, built once
//! per upstream at compile time. Verification uses the Mozilla roots (webpki-roots) unless `tls.verify` is false, as
//! APISIX's `tls.verify`. A client certificate (upstream mTLS) comes inline (`tls.client_cert` + `tls.client_key`)
//! or from an `ssls` resource of `type: "client"` (`tls.client_cert_id`); it is parsed and checked against its key
//! here, so a bad pair fails the compile instead of every handshake. Also owns PEM cert/key loading for
//! `tls_server`.

use std::sync::{Arc, OnceLock};

use ahash::AHashMap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};
use sluice_model::{Ssl, UpstreamTls};

/// `ssls` by id, for `tls.client_cert_id`.
pub(crate) type SslsById<'a> = AHashMap<&'a str, &'a Ssl>;

pub(crate) fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// The `ssls` entry a `tls.client_cert_id` names, in APISIX's words when it is missing or not a client cert.
pub(crate) fn client_ssl<'a>(
    tls: &UpstreamTls,
    ssls: &SslsById<'a>,
) -> Result<Option<&'a Ssl>, String> {
    let Some(id) = &tls.client_cert_id else {
        return Ok(None);
    };
    let ssl = ssls
        .get(id.0.as_str())
        .ok_or_else(|| format!("failed to fetch ssl info by ssl id [{id}], response code: 404"))?;
    if ssl.kind.as_deref() != Some("client") {
        return Err(format!(
            "failed to fetch ssl info by ssl id [{id}], wrong ssl type"
        ));
    }
    Ok(Some(ssl))
}

pub(crate) fn client_config(
    tls: Option<&UpstreamTls>,
    ssls: &SslsById<'_>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let verify = tls.and_then(|t| t.verify).unwrap_or(false);
    let builder = if verify {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        builder.with_root_certificates(roots)
    } else {
        // APISIX does not verify upstream certificates unless `tls.verify` is true.
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
    };
    let cert = match tls {
        Some(t) => match (client_ssl(t, ssls)?, &t.client_cert, &t.client_key) {
            (Some(s), _, _) => {
                Some(certified_key(&s.cert, &s.key).map_err(|e| format!("ssl {}: {e}", s.id))?)
            }
            (None, Some(c), Some(k)) => {
                Some(certified_key(c, k).map_err(|e| format!("tls.client_cert: {e}"))?)
            }
            (None, None, None) => None,
            _ => return Err("tls.client_cert and tls.client_key go together".into()),
        },
        None => None,
    };
    let cfg = match cert {
        Some(k) => builder.with_client_cert_resolver(Arc::new(ClientCert(k))),
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// Parses a PEM chain and its PEM private key into a signing key, refusing a key that is not the certificate's.
pub(crate) fn certified_key(cert: &str, key: &str) -> Result<Arc<CertifiedKey>, String> {
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("invalid cert: {e}"))?;
    if chain.is_empty() {
        return Err("cert holds no PEM certificate".into());
    }
    let der =
        PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| format!("invalid key: {e}"))?;
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("unsupported key: {e}"))?;
    let ck = CertifiedKey::new(chain, signing);
    // Catches a key that does not belong to its certificate at config time, not at the first handshake.
    ck.keys_match()
        .map_err(|e| format!("cert and key do not match: {e}"))?;
    Ok(Arc::new(ck))
}

/// The upstream's one client certificate, offered when the server asks and the key can sign a scheme it accepts.
#[derive(Debug)]
struct ClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for ClientCert {
    fn resolve(&self, _: &[&[u8]], schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.0.key.choose_scheme(schemes).map(|_| self.0.clone())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
