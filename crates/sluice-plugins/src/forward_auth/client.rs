//! forward-auth's HTTP/1.1 client: one request, one answer, on tokio, with a small keep-alive pool per worker
//! thread.
//!
//! Hand-written rather than hyper: the request is already serialised by the hook (it is built from the request
//! context, which the awaited future cannot borrow), and the answer is read with Sluice's own strict codec
//! (`sluice_http::parse_response` and its chunked decoder), so an auth service gets the same response hygiene as an
//! upstream: no bare LF, no CL+TE conflict, a bounded head. The body is capped at [`BODY_CAP`].
//!
//! The pool is `thread_local`: the future runs on the worker thread that started it (it is not `Send`), so no lock
//! is needed. Connections are keyed by scheme, address, server name and verification mode; at most
//! `keepalive_pool` idle ones per key and [`THREAD_CAP`] in all are kept; one idle past `keepalive_timeout` is
//! dropped when the pool is next used.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sluice_http::{BodyKind, Chunk, ChunkedDecoder, Limits, ResponseHead};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest auth answer body read (a deny's body goes to the client; nothing legitimate is near this).
pub(crate) const BODY_CAP: usize = 1024 * 1024;
/// Idle connections kept per worker thread across all forward-auth configurations.
const THREAD_CAP: usize = 64;

/// Where the auth requests go, parsed from `uri` when the plugin compiles.
#[derive(Debug)]
pub(crate) struct Target {
    /// The host as connected to and named for TLS (IPv6 without brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The `Host` header value (brackets for IPv6, `:port` unless the default).
    pub(crate) host_header: String,
    /// Path and query sent in the request line.
    pub(crate) path: String,
    /// `Some` for https: the client configuration for the `ssl_verify` mode.
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    /// Pool key: connections are shared only between identical targets and verification modes.
    pub(crate) key: Arc<str>,
}

/// Keep-alive settings (`keepalive: true`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keepalive {
    pub(crate) idle: Duration,
    pub(crate) pool: usize,
}

/// The auth service's answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) head: ResponseHead,
    pub(crate) body: Bytes,
}

impl Target {
    /// Parses `http(s)://host[:port][/path][?query]` (APISIX hands the string to lua-resty-http per request; here a
    /// bad one fails the compile).
    pub(crate) fn parse(uri: &str, ssl_verify: bool) -> Result<Target, String> {
        let bad = |why: &str| format!("invalid uri {uri:?}: {why}");
        let (tls, rest) = if let Some(r) = strip_prefix_ci(uri, "http://") {
            (false, r)
        } else if let Some(r) = strip_prefix_ci(uri, "https://") {
            (true, r)
        } else {
            return Err(bad("the scheme must be http:// or https://"));
        };
        let rest = rest.split('#').next().unwrap_or("");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        if authority.contains('@') {
            return Err(bad("user information is not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed IPv6 literal"))?;
            h.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("bad IPv6 literal"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("bad port"))?),
            };
            (h, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        let default_port = if tls { 443 } else { 80 };
        let port = match port {
            None => default_port,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("bad port"))?,
        };
        let v6 = authority.starts_with('[');
        if host.is_empty()
            || !v6
                && !host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        {
            return Err(bad("bad host"));
        }
        // The path goes into the request line as is: no byte that could end or split it.
        if !path.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err(bad("the path holds spaces or control characters"));
        }
        let path = match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        };
        let shown = if v6 {
            format!("[{host}]")
        } else {
            host.to_ascii_lowercase()
        };
        let host_header = if port == default_port {
            shown.clone()
        } else {
            format!("{shown}:{port}")
        };
        let tls = tls.then(|| tls_config(ssl_verify));
        let key = format!(
            "{}://{shown}:{port}#{}",
            if tls.is_some() { "https" } else { "http" },
            if ssl_verify { "verify" } else { "noverify" }
        );
        Ok(Target {
            host: if v6 {
                host.to_owned()
            } else {
                host.to_ascii_lowercase()
            },
            port,
            host_header,
            path,
            tls,
            key: key.into(),
        })
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

struct Idle {
    key: Arc<str>,
    io: Box<dyn Io>,
    until: Instant,
}

thread_local! {
    static POOL: RefCell<VecDeque<Idle>> = const { RefCell::new(VecDeque::new()) };
}

fn checkout(key: &str) -> Option<Box<dyn Io>> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let now = Instant::now();
        p.retain(|i| i.until > now);
        let at = p.iter().rposition(|i| &*i.key == key)?;
        p.remove(at).map(|i| i.io)
    })
}

fn checkin(key: &Arc<str>, io: Box<dyn Io>, ka: Keepalive) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let now = Instant::now();
        p.retain(|i| i.until > now);
        if p.iter().filter(|i| i.key == *key).count() >= ka.pool {
            if let Some(oldest) = p.iter().position(|i| i.key == *key) {
                p.remove(oldest);
            }
        }
        if p.len() >= THREAD_CAP {
            p.pop_front();
        }
        p.push_back(Idle {
            key: key.clone(),
            io,
            until: now + ka.idle,
        });
    });
}

/// A failed exchange; `answered` is false when nothing at all came back, so a pooled connection the server had
/// closed may be replaced by a new one.
struct Fail {
    msg: String,
    answered: bool,
}

impl Fail {
    fn silent(msg: impl ToString) -> Fail {
        Fail {
            msg: msg.to_string(),
            answered: false,
        }
    }
    fn answered(msg: impl ToString) -> Fail {
        Fail {
            msg: msg.to_string(),
            answered: true,
        }
    }
}

/// Sends `req` (a whole serialised request) to `t` and reads the answer. A pooled connection that fails before any
/// answer byte (the server closed it while idle) is replaced by a fresh one once.
pub(crate) async fn call(t: &Target, req: &[u8], ka: Option<Keepalive>) -> Result<Answer, String> {
    if ka.is_some() {
        if let Some(mut io) = checkout(&t.key) {
            match exchange(&mut io, req).await {
                Ok((answer, reusable)) => {
                    if let (true, Some(ka)) = (reusable, ka) {
                        checkin(&t.key, io, ka);
                    }
                    return Ok(answer);
                }
                Err(f) if f.answered => return Err(f.msg),
                Err(_) => {}
            }
        }
    }
    let mut io = connect(t).await?;
    let (answer, reusable) = exchange(&mut io, req).await.map_err(|f| f.msg)?;
    if let (true, Some(ka)) = (reusable, ka) {
        checkin(&t.key, io, ka);
    }
    Ok(answer)
}

async fn connect(t: &Target) -> Result<Box<dyn Io>, String> {
    let tcp = TcpStream::connect((t.host.as_str(), t.port))
        .await
        .map_err(|e| format!("connect {}:{}: {e}", t.host, t.port))?;
    let _ = tcp.set_nodelay(true);
    let Some(cfg) = &t.tls else {
        return Ok(Box::new(tcp));
    };
    let name = ServerName::try_from(t.host.clone()).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls handshake with {}: {e}", t.host))?;
    Ok(Box::new(tls))
}

/// One request/answer on `io`; the flag says whether the connection may carry another.
async fn exchange(io: &mut Box<dyn Io>, req: &[u8]) -> Result<(Answer, bool), Fail> {
    io.write_all(req).await.map_err(Fail::silent)?;
    io.flush().await.map_err(Fail::silent)?;
    let mut buf = BytesMut::with_capacity(4096);
    let limits = Limits::default();
    let mut got_bytes = false;
    let head = loop {
        match sluice_http::parse_response(&mut buf, &limits, false) {
            Ok(Some(h)) if h.status == 101 => return Err(Fail::answered("unexpected 101")),
            // 1xx interim answers are skipped, as lua-resty-http does.
            Ok(Some(h)) if h.status < 200 => continue,
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(e) => return Err(Fail::answered(format!("bad response head: {e}"))),
        }
        match io.read_buf(&mut buf).await {
            Ok(0) if !got_bytes => return Err(Fail::silent("closed")),
            Ok(0) => return Err(Fail::answered("closed inside the response head")),
            Ok(_) => got_bytes = true,
            Err(e) if !got_bytes => return Err(Fail::silent(e)),
            Err(e) => return Err(Fail::answered(e)),
        }
    };
    let mut reusable = head.keep_alive;
    let body = match head.body {
        BodyKind::Empty => Bytes::new(),
        BodyKind::Length(n) => {
            let n = usize::try_from(n)
                .ok()
                .filter(|n| *n <= BODY_CAP)
                .ok_or_else(|| Fail::answered("response body too large"))?;
            while buf.len() < n {
                buf.reserve(n - buf.len());
                match io.read_buf(&mut buf).await {
                    Ok(0) => return Err(Fail::answered("closed inside the response body")),
                    Ok(_) => {}
                    Err(e) => return Err(Fail::answered(e)),
                }
            }
            buf.split_to(n).freeze()
        }
        BodyKind::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let mut body = BytesMut::new();
            loop {
                match dec.decode(&mut buf) {
                    Ok(Some(Chunk::Data(d))) => {
                        if body.len() + d.len() > BODY_CAP {
                            return Err(Fail::answered("response body too large"));
                        }
                        body.extend_from_slice(&d);
                        continue;
                    }
                    Ok(Some(Chunk::End { .. })) => break,
                    Ok(None) => {}
                    Err(e) => return Err(Fail::answered(format!("bad chunked body: {e}"))),
                }
                match io.read_buf(&mut buf).await {
                    Ok(0) => return Err(Fail::answered("closed inside the response body")),
                    Ok(_) => {}
                    Err(e) => return Err(Fail::answered(e)),
                }
            }
            body.freeze()
        }
        BodyKind::Eof => {
            reusable = false;
            loop {
                if buf.len() > BODY_CAP {
                    return Err(Fail::answered("response body too large"));
                }
                match io.read_buf(&mut buf).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => return Err(Fail::answered(e)),
                }
            }
            buf.split().freeze()
        }
    };
    // Bytes past the answer mean the server is out of step with us: never reuse that connection.
    reusable &= buf.is_empty();
    Ok((Answer { head, body }, reusable))
}

fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// The client configuration for `ssl_verify` (built once per process per mode): the Mozilla roots, or with
/// `ssl_verify: false` a verifier that accepts any certificate, as lua-resty-http's `ssl_verify = false` does.
pub(crate) fn tls_config(verify: bool) -> Arc<rustls::ClientConfig> {
    static VERIFY: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    static ANY: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let build = || {
        let provider = provider();
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions");
        let builder = if verify {
            let mut roots = rustls::RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            builder.with_root_certificates(roots)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
        };
        Arc::new(builder.with_no_client_auth())
    };
    if verify { &VERIFY } else { &ANY }
        .get_or_init(build)
        .clone()
}

/// `ssl_verify: false` only: DANGEROUS by design, the operator asked not to check the auth service's certificate
/// (self-signed internal services). The handshake signatures are still checked, so the session is at least bound
/// to the key the server presented.
#[derive(Debug)]
struct AcceptAnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_like_resty_http() {
        let t = Target::parse("http://127.0.0.1:1984/auth?x=1", true).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 1984));
        assert_eq!(t.host_header, "127.0.0.1:1984");
        assert_eq!(t.path, "/auth?x=1");
        assert!(t.tls.is_none());
        let t = Target::parse("HTTPS://Auth.Example.com", false).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("auth.example.com", 443));
        assert_eq!(
            (t.host_header.as_str(), t.path.as_str()),
            ("auth.example.com", "/")
        );
        assert!(t.tls.is_some());
        let t = Target::parse("http://[::1]:8080?q#frag", true).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 8080));
        assert_eq!(
            (t.host_header.as_str(), t.path.as_str()),
            ("[::1]:8080", "/?q")
        );
        assert_ne!(
            Target::parse("https://a", true).unwrap().key,
            Target::parse("https://a", false).unwrap().key
        );
        for bad in [
            "ftp://a/",
            "127.0.0.1:80/auth",
            "http://",
            "http://a:0/",
            "http://a:99999/",
            "http://u:p@a/",
            "http://a b/",
            "http://a/x y",
            "http://a/x\r\nInjected: 1",
            "http://[::1/",
        ] {
            assert!(Target::parse(bad, true).is_err(), "{bad:?}");
        }
    }
}
