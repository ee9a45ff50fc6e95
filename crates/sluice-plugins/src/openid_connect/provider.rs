//! openid-connect's view of the OpenID provider: the discovery document and the JWKS, fetched on first need and
//! cached (lock-free reads through `ArcSwap`), and the provider calls (token, userinfo, introspection) made with
//! forward-auth's HTTP/1.1 client (keep-alive pool per worker thread, rustls). The JWKS is fetched again when it
//! is older than `jwk_expires_in`, or when a token names a `kid` it does not hold (at most once per
//! [`KID_REFETCH`], so tokens with made-up `kid`s cannot make the gateway hammer the provider).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::Value;

use super::token::Jwks;
use crate::forward_auth::client::{self, Keepalive, Target};

/// The shortest time between two JWKS fetches caused by an unknown `kid`.
pub(crate) const KID_REFETCH: Duration = Duration::from_secs(5);

const KEEPALIVE: Keepalive = Keepalive {
    idle: Duration::from_secs(60),
    pool: 5,
};

/// The fields of the discovery document the plugin uses, endpoints parsed once.
pub(crate) struct Discovery {
    pub(crate) issuer: String,
    pub(crate) authorization_endpoint: Option<String>,
    pub(crate) token_endpoint: Option<Target>,
    pub(crate) userinfo_endpoint: Option<Target>,
    pub(crate) jwks_uri: Option<Target>,
    pub(crate) introspection_endpoint: Option<Target>,
    pub(crate) end_session_endpoint: Option<String>,
}

pub(crate) struct Provider {
    discovery_url: Target,
    ssl_verify: bool,
    timeout: Duration,
    jwk_ttl: Duration,
    disc: ArcSwapOption<Discovery>,
    jwks: ArcSwapOption<(Jwks, u64)>,
    /// Unix milliseconds of the last JWKS fetch an unknown `kid` caused.
    last_kid_fetch: AtomicU64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A provider answer: status and body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) fn json(&self) -> Option<Value> {
        serde_json::from_slice::<Value>(&self.body)
            .ok()
            .filter(Value::is_object)
    }
}

impl Provider {
    pub(crate) fn new(
        discovery: &str,
        ssl_verify: bool,
        timeout: Duration,
        jwk_ttl: Duration,
    ) -> Result<Provider, String> {
        Ok(Provider {
            discovery_url: Target::parse(discovery, ssl_verify)
                .map_err(|e| format!("discovery: {e}"))?,
            ssl_verify,
            timeout,
            jwk_ttl,
            disc: ArcSwapOption::empty(),
            jwks: ArcSwapOption::empty(),
            last_kid_fetch: AtomicU64::new(0),
        })
    }

    pub(crate) fn target(&self, url: &str) -> Result<Target, String> {
        Target::parse(url, self.ssl_verify)
    }

    /// The cached discovery document (no IO).
    pub(crate) fn cached_discovery(&self) -> Option<Arc<Discovery>> {
        self.disc.load_full()
    }

    /// The cached keys while they are fresh (no IO).
    pub(crate) fn cached_jwks(&self) -> Option<Arc<(Jwks, u64)>> {
        let j = self.jwks.load_full()?;
        (now_ms() < j.1 + self.jwk_ttl.as_millis() as u64).then_some(j)
    }

    /// One request to the provider, within `timeout`.
    pub(crate) async fn call(
        &self,
        t: &Target,
        method: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<Answer, String> {
        let mut out = BytesMut::with_capacity(256 + body.map_or(0, <[u8]>::len));
        out.put_slice(method.as_bytes());
        out.put_u8(b' ');
        out.put_slice(t.path.as_bytes());
        out.put_slice(b" HTTP/1.1\r\nHost: ");
        out.put_slice(t.host_header.as_bytes());
        out.put_slice(b"\r\nAccept: application/json\r\nUser-Agent: sluice openid-connect\r\n");
        for (n, v) in headers {
            out.put_slice(n.as_bytes());
            out.put_slice(b": ");
            out.put_slice(v.as_bytes());
            out.put_slice(b"\r\n");
        }
        if let Some(b) = body {
            out.put_slice(b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: ");
            out.put_slice(b.len().to_string().as_bytes());
            out.put_slice(b"\r\n\r\n");
            out.put_slice(b);
        } else {
            out.put_slice(b"\r\n");
        }
        let call = client::call(t, &out, Some(KEEPALIVE));
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(a)) => Ok(Answer {
                status: a.head.status,
                body: a.body,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("timeout".into()),
        }
    }

    async fn get_json(&self, t: &Target, what: &str) -> Result<Value, String> {
        let a = self
            .call(t, "GET", &[], None)
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        if a.status != 200 {
            return Err(format!("{what}: the provider answered {}", a.status));
        }
        a.json().ok_or_else(|| format!("{what}: not a JSON object"))
    }

    /// The discovery document, fetched once (and again after a failed fetch).
    pub(crate) async fn discovery(&self) -> Result<Arc<Discovery>, String> {
        if let Some(d) = self.disc.load_full() {
            return Ok(d);
        }
        let v = self.get_json(&self.discovery_url, "discovery").await?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let t = |k: &str| -> Result<Option<Target>, String> {
            s(k).map(|u| self.target(&u).map_err(|e| format!("discovery {k}: {e}")))
                .transpose()
        };
        let d = Arc::new(Discovery {
            issuer: s("issuer").ok_or("discovery: no issuer")?,
            authorization_endpoint: s("authorization_endpoint"),
            token_endpoint: t("token_endpoint")?,
            userinfo_endpoint: t("userinfo_endpoint")?,
            jwks_uri: t("jwks_uri")?,
            introspection_endpoint: t("introspection_endpoint")?,
            end_session_endpoint: s("end_session_endpoint"),
        });
        self.disc.store(Some(d.clone()));
        Ok(d)
    }

    /// The keys: cached ones while fresh, unless `unknown_kid` asks for a new fetch (rate-limited).
    pub(crate) async fn jwks(&self, unknown_kid: bool) -> Result<Arc<(Jwks, u64)>, String> {
        if let Some(j) = self.cached_jwks() {
            if !unknown_kid {
                return Ok(j);
            }
            let last = self.last_kid_fetch.load(Ordering::Relaxed);
            let now = now_ms();
            if now < last + KID_REFETCH.as_millis() as u64
                || self
                    .last_kid_fetch
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                return Ok(j);
            }
        }
        let d = self.discovery().await?;
        let uri = d.jwks_uri.as_ref().ok_or("discovery: no jwks_uri")?;
        let a = self
            .call(uri, "GET", &[], None)
            .await
            .map_err(|e| format!("jwks: {e}"))?;
        if a.status != 200 {
            return Err(format!("jwks: the provider answered {}", a.status));
        }
        let j = Arc::new((Jwks::parse(&a.body)?, now_ms()));
        self.jwks.store(Some(j.clone()));
        Ok(j)
    }
}
