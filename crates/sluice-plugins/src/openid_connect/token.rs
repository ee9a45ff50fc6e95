//! openid-connect's JWTs: a provider's JWKS turned into verification keys once per fetch (RSA `n`/`e` into the
//! PKCS#1 form `ring` takes, EC `x`/`y` into an uncompressed point, OKP Ed25519), and a compact JWS checked
//! against them: the `alg` must be one the configuration allows and fit the key (never `none`, never HMAC: the
//! public key is not a secret), the `kid` picks the key, then `exp` (required), `nbf` and `iss`.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use crate::jwt_auth::keys::Key;
use crate::jwt_auth::Alg;
use crate::util::base64_decode;

/// A provider's signing keys by `kid` (keys without one under the empty name).
#[derive(Default)]
pub(crate) struct Jwks {
    pub(crate) keys: HashMap<String, Key>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<Value>,
}

/// DER length octets.
fn der_len(out: &mut Vec<u8>, n: usize) {
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let b = n.to_be_bytes();
        let skip = b.iter().take_while(|x| **x == 0).count();
        out.push(0x80 | (b.len() - skip) as u8);
        out.extend_from_slice(&b[skip..]);
    }
}

/// A DER INTEGER from an unsigned big-endian magnitude.
fn der_uint(out: &mut Vec<u8>, mag: &[u8]) {
    let start = mag
        .iter()
        .take_while(|b| **b == 0)
        .count()
        .min(mag.len().saturating_sub(1));
    let mag = &mag[start..];
    let pad = mag.first().is_some_and(|b| b & 0x80 != 0);
    out.push(0x02);
    der_len(out, mag.len() + usize::from(pad));
    if pad {
        out.push(0);
    }
    out.extend_from_slice(mag);
}

/// `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }`.
fn rsa_pkcs1(n: &[u8], e: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(n.len() + e.len() + 16);
    der_uint(&mut body, n);
    der_uint(&mut body, e);
    let mut out = Vec::with_capacity(body.len() + 8);
    out.push(0x30);
    der_len(&mut out, body.len());
    out.extend_from_slice(&body);
    out
}

fn field(k: &Value, name: &str) -> Option<Vec<u8>> {
    base64_decode(k.get(name)?.as_str()?)
}

/// One JWK as a verification key; `None` for keys that are not for signatures or that `ring` cannot use.
pub(crate) fn jwk_key(k: &Value) -> Option<Key> {
    if k.get("use")
        .and_then(Value::as_str)
        .is_some_and(|u| u != "sig")
    {
        return None;
    }
    let key = match k.get("kty")?.as_str()? {
        "RSA" => {
            let n = field(k, "n")?;
            let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
            if !(2048..=8192 + 8).contains(&bits) {
                return None;
            }
            Key::Rsa(rsa_pkcs1(&n, &field(k, "e")?))
        }
        "EC" => {
            let (x, y) = (field(k, "x")?, field(k, "y")?);
            let size = match k.get("crv")?.as_str()? {
                "P-256" => 32,
                "P-384" => 48,
                _ => return None,
            };
            if x.len() != size || y.len() != size {
                return None;
            }
            let mut p = Vec::with_capacity(1 + 2 * size);
            p.push(4);
            p.extend_from_slice(&x);
            p.extend_from_slice(&y);
            if size == 32 {
                Key::P256(p)
            } else {
                Key::P384(p)
            }
        }
        "OKP" if k.get("crv")?.as_str()? == "Ed25519" => {
            let x = field(k, "x")?;
            (x.len() == 32).then_some(())?;
            Key::Ed25519(x)
        }
        _ => return None,
    };
    Some(key)
}

impl Jwks {
    /// Parses a JWKS document; keys that cannot verify signatures are left out.
    pub(crate) fn parse(body: &[u8]) -> Result<Jwks, String> {
        let raw: RawJwks =
            serde_json::from_slice(body).map_err(|e| format!("invalid JWKS: {e}"))?;
        let mut keys = HashMap::new();
        for k in &raw.keys {
            if let Some(key) = jwk_key(k) {
                let kid = k.get("kid").and_then(Value::as_str).unwrap_or("");
                keys.entry(kid.to_owned()).or_insert(key);
            }
        }
        Ok(Jwks { keys })
    }
}

/// Why a token was refused. `UnknownKid` is the one case where fetching the keys again may help.
#[derive(Debug, PartialEq)]
pub(crate) enum Refused {
    UnknownKid,
    Invalid(&'static str),
}

#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    kid: Option<std::borrow::Cow<'a, str>>,
}

/// What the claims must satisfy besides the signature.
pub(crate) struct Expect<'a> {
    /// Allowed `alg`s (`token_signing_alg_values_expected`, else every asymmetric one).
    pub(crate) algs: &'a [Alg],
    /// Accepted issuers; empty: not checked.
    pub(crate) issuers: &'a [String],
    pub(crate) now: u64,
    /// Seconds of clock skew allowed on `exp` / `nbf`.
    pub(crate) leeway: u64,
}

/// The asymmetric algorithms `ring` verifies.
pub(crate) const ASYMMETRIC: &[Alg] = &[
    Alg::RS256,
    Alg::RS384,
    Alg::RS512,
    Alg::PS256,
    Alg::PS384,
    Alg::PS512,
    Alg::ES256,
    Alg::ES384,
    Alg::EdDSA,
];

/// The key a token names: its `kid`, or with no `kid` the only key that fits its `alg`.
fn pick<'k>(
    keys: &'k HashMap<String, Key>,
    kid: Option<&str>,
    alg: Alg,
) -> Result<&'k Key, Refused> {
    match kid {
        Some(kid) => keys.get(kid).ok_or(Refused::UnknownKid),
        None => {
            let mut fit = keys.values().filter(|k| k.fits(alg));
            match (fit.next(), fit.next()) {
                (Some(k), None) => Ok(k),
                (None, _) => Err(Refused::UnknownKid),
                _ => Err(Refused::Invalid(
                    "token has no kid and the keys are ambiguous",
                )),
            }
        }
    }
}

/// Verifies a compact JWS with `keys` (a JWKS) or `single` (a configured `public_key`) and returns its claims.
pub(crate) fn verify(
    token: &str,
    keys: Option<&Jwks>,
    single: Option<&Key>,
    x: &Expect<'_>,
) -> Result<Value, Refused> {
    let bad = Refused::Invalid;
    let mut parts = token.splitn(4, '.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("invalid jwt: not a JWS compact serialization"));
    };
    let head = base64_decode(h).ok_or(bad("invalid jwt: bad header encoding"))?;
    let head: Header<'_> =
        serde_json::from_slice(&head).map_err(|_| bad("invalid jwt: bad header"))?;
    let alg_name = head.alg.as_deref().unwrap_or("");
    let alg = Alg::parse(alg_name)
        .filter(|a| x.algs.contains(a))
        .ok_or(bad("token signed with an algorithm that is not accepted"))?;
    let key = match (single, keys) {
        (Some(k), _) => k,
        (None, Some(j)) => pick(&j.keys, head.kid.as_deref(), alg)?,
        (None, None) => return Err(Refused::UnknownKid),
    };
    let sig = base64_decode(s).ok_or(bad("invalid jwt: bad signature encoding"))?;
    if !key.verify(alg, &token.as_bytes()[..h.len() + 1 + p.len()], &sig) {
        return Err(bad("signature mismatch"));
    }
    let claims = base64_decode(p)
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .filter(Value::is_object)
        .ok_or(bad("invalid jwt: bad payload"))?;
    let num = |name: &str| claims.get(name).map(|v| v.as_f64().unwrap_or(f64::NAN));
    let now = x.now as f64;
    let leeway = x.leeway as f64;
    match num("exp") {
        None => return Err(bad("token has no exp claim")),
        Some(exp) if exp.is_nan() || exp + leeway <= now => return Err(bad("token expired")),
        _ => {}
    }
    if let Some(nbf) = num("nbf") {
        if nbf.is_nan() || nbf - leeway > now {
            return Err(bad("token not valid yet"));
        }
    }
    if !x.issuers.is_empty() {
        let iss = claims.get("iss").and_then(Value::as_str).unwrap_or("");
        if !x.issuers.iter().any(|i| i == iss) {
            return Err(bad("token issued by an issuer that is not accepted"));
        }
    }
    Ok(claims)
}
