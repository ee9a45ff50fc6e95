//! openid-connect's session: what lua-resty-session keeps for lua-resty-openidc (the pending authorization's
//! state, nonce, PKCE verifier and original URL; then the tokens, ID token claims and userinfo), sealed into one
//! cookie with AES-256-GCM (`ring`). The key is derived once per configuration from `session.secret` with
//! HKDF-SHA256; every cookie has a fresh random 96-bit nonce, and the cookie name is the associated data, so a
//! value cannot be moved to another cookie name. A cookie that does not open (tampered, truncated, another
//! secret, too old) is simply no session.
//!
//! Not here: lua-resty-session's chunking of cookies over 4 KB (a session that would not fit is refused) and its
//! Redis storage.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::util::{base64_decode, base64url_encode};

/// The largest sealed cookie value written (browsers keep about 4096 bytes per cookie, name and attributes
/// included).
pub(crate) const MAX_COOKIE: usize = 3800;

/// An authorization request in flight (lua-resty-openidc's `state`, `nonce`, `code_verifier`, `original_url`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Pending {
    pub(crate) state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) nonce: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) verifier: Option<String>,
    pub(crate) original_url: String,
    /// Authorization flows restarted after a failed callback (APISIX's `auth_flow_restarts`).
    #[serde(default)]
    pub(crate) restarts: u8,
}

/// An authenticated user.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Authed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) access_token: Option<String>,
    /// When the access token expires (unix seconds), from the token answer's `expires_in`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) access_expires: Option<u64>,
    /// The ID token's verified claims.
    pub(crate) id_token: Value,
    /// The signed ID token itself (`X-Raw-ID-Token`, logout's `id_token_hint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) enc_id_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) refresh_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<Value>,
    /// The scopes the token endpoint granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) scope: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Session {
    /// Absolute expiry (unix seconds): the cookie is worthless after it, whatever its `Max-Age`.
    pub(crate) exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pending: Option<Pending>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) authed: Option<Authed>,
}

/// The sealing key and the cookie's attributes, built once per configuration.
pub(crate) struct Sealer {
    key: LessSafeKey,
    pub(crate) name: String,
    /// `; Path=/; HttpOnly; SameSite=Lax...`, appended to every Set-Cookie.
    attrs: String,
    pub(crate) lifetime: u64,
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

pub(crate) struct CookieConf<'a> {
    pub(crate) name: &'a str,
    pub(crate) path: &'a str,
    pub(crate) domain: Option<&'a str>,
    pub(crate) secure: Option<bool>,
    pub(crate) http_only: bool,
    pub(crate) same_site: &'a str,
    pub(crate) lifetime: u64,
}

impl Sealer {
    pub(crate) fn new(secret: &[u8], c: &CookieConf<'_>) -> Sealer {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"sluice openid-connect session v1");
        let mut k = [0u8; 32];
        salt.extract(secret)
            .expand(&[b"aes-256-gcm"], Len(32))
            .and_then(|okm| okm.fill(&mut k))
            .expect("HKDF-SHA256 yields 32 bytes");
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k).expect("a 32-byte key"));
        let mut attrs = format!("; Path={}", c.path);
        if let Some(d) = c.domain {
            attrs.push_str("; Domain=");
            attrs.push_str(d);
        }
        // lua-resty-session: SameSite=None needs Secure; otherwise Secure only when asked.
        if c.secure.unwrap_or(c.same_site == "None") {
            attrs.push_str("; Secure");
        }
        if c.http_only {
            attrs.push_str("; HttpOnly");
        }
        if c.same_site != "Default" {
            attrs.push_str("; SameSite=");
            attrs.push_str(c.same_site);
        }
        Sealer {
            key,
            name: c.name.to_owned(),
            attrs,
            lifetime: c.lifetime,
        }
    }

    /// The session sealed as a cookie value (`None`: too large for a cookie).
    pub(crate) fn seal(&self, s: &Session) -> Option<String> {
        let mut buf = serde_json::to_vec(s).ok()?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.name.as_bytes()),
                &mut buf,
            )
            .ok()?;
        let mut out = Vec::with_capacity(NONCE_LEN + buf.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        let v = base64url_encode(&out);
        (v.len() <= MAX_COOKIE).then_some(v)
    }

    /// Opens a cookie value; `None` for anything that is not a live session sealed with this key.
    pub(crate) fn open(&self, value: &str, now: u64) -> Option<Session> {
        if value.len() > MAX_COOKIE * 2 {
            return None;
        }
        let raw = base64_decode(value)?;
        // Only the canonical encoding: the unused low bits of the last character must not give a second
        // spelling of the same cookie.
        if base64url_encode(&raw) != value {
            return None;
        }
        if raw.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return None;
        }
        let (n, ct) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(n).ok()?;
        let mut ct = ct.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(self.name.as_bytes()), &mut ct)
            .ok()?;
        let s: Session = serde_json::from_slice(plain).ok()?;
        (s.exp > now).then_some(s)
    }

    /// `Set-Cookie` value carrying `sealed`.
    pub(crate) fn set_cookie(&self, sealed: &str) -> String {
        format!(
            "{}={sealed}{}; Max-Age={}",
            self.name, self.attrs, self.lifetime
        )
    }

    /// `Set-Cookie` value that removes the session.
    pub(crate) fn clear_cookie(&self) -> String {
        format!(
            "{}={}; Max-Age=0; Expires=Thu, 01 Jan 1970 00:00:01 GMT",
            self.name, self.attrs
        )
    }
}

/// `n` random bytes, base64url (state, nonce, PKCE verifier: 32 bytes, 256 bits).
pub(crate) fn random_token() -> String {
    let mut b = [0u8; 32];
    // SystemRandom only fails when the OS has no entropy source, where nothing secure can be done anyway.
    SystemRandom::new()
        .fill(&mut b)
        .expect("the OS random source");
    base64url_encode(&b)
}

/// RFC 7636 S256: base64url(SHA-256(verifier)).
pub(crate) fn pkce_challenge(verifier: &str) -> String {
    base64url_encode(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref())
}
