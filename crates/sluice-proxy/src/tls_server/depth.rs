//! `client.depth` for mTLS: a client certificate is accepted only if it chains to `client.ca` through at most
//! `depth` intermediates (OpenSSL's verify depth, which APISIX sets with `ssl_verify_depth`: 0 = signed directly by
//! a CA in `client.ca`). webpki builds the path from whatever intermediates the client sent; handing it only the
//! first `depth` of them (clients send the chain leaf-first, issuer next) bounds the path it can build. Everything
//! else is webpki's verifier unchanged.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

#[derive(Debug)]
pub(super) struct Limited {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub depth: usize,
}

impl ClientCertVerifier for Limited {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }
    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let usable = &intermediates[..intermediates.len().min(self.depth)];
        self.inner.verify_client_cert(end_entity, usable, now)
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
