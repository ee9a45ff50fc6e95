//! jwt-auth (priority 2510, rewrite), as APISIX 3.x: a JWT from the `header` (default `authorization`, optional
//! `Bearer ` prefix), else the `query` argument (default `jwt`), else the `cookie` (default `jwt`);
//! `hide_credentials` strips it from wherever it came. The claim `key_claim_name` (default `key`) names the
//! consumer credential (compiled key map); the signature is checked with that credential's `secret` (HS256/384/512,
//! optionally `base64_secret`) or `public_key` (RS*, PS*, ES256, ES384, EdDSA; see [`keys`]), then the
//! `claims_to_verify` (`exp`, `nbf`) with `lifetime_grace_period`. Failures answer 401 with APISIX's messages and
//! `WWW-Authenticate: Bearer realm="<realm>"`, or attach `anonymous_consumer`. Not here: `store_in_ctx` (accepted;
//! no plugin reads the payload yet) and APISIX 2.x's signing endpoint.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::consumers::{ConsumerRt, Consumers};
use crate::registry::Entry;
use crate::util::{base64_decode, base64_encode, base64url_encode, parse};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub(crate) mod keys;
#[cfg(test)]
mod tests;

pub use keys::Alg;
use keys::Key;

pub const NAME: &str = "jwt-auth";
pub const PRIORITY: i32 = 2510;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: true,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &[],
        consumer: Some(&["secret"]),
        metadata: &[],
    },
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "header": {"type": "string", "default": "authorization"},
            "query": {"type": "string", "default": "jwt"},
            "cookie": {"type": "string", "default": "jwt"},
            "hide_credentials": {"type": "boolean", "default": false},
            "key_claim_name": {"type": "string", "default": "key", "minLength": 1},
            "store_in_ctx": {"type": "boolean", "default": false},
            "realm": {"type": "string", "default": "jwt", "minLength": 1},
            "anonymous_consumer": {"type": "string", "minLength": 1},
            "claims_to_verify": {
                "type": "array",
                "items": {"type": "string", "enum": ["exp", "nbf"]},
                "uniqueItems": true,
                "default": ["exp", "nbf"]
            }
        }
    })
}

#[derive(Deserialize)]
#[serde(default)]
struct Conf {
    header: String,
    query: String,
    cookie: String,
    hide_credentials: bool,
    key_claim_name: String,
    realm: String,
    anonymous_consumer: Option<String>,
    claims_to_verify: Vec<String>,
}

impl Default for Conf {
    fn default() -> Self {
        Conf {
            header: "authorization".into(),
            query: "jwt".into(),
            cookie: "jwt".into(),
            hide_credentials: false,
            key_claim_name: "key".into(),
            realm: "jwt".into(),
            anonymous_consumer: None,
            claims_to_verify: vec!["exp".into(), "nbf".into()],
        }
    }
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

/// The consumer-side schema (APISIX's `consumer_schema`).
pub(crate) fn consumer_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "key": {"type": "string", "minLength": 1},
            "secret": {"type": "string", "minLength": 1},
            "public_key": {"type": "string"},
            "algorithm": {"type": "string", "default": "HS256", "enum": [
                "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512",
                "PS256", "PS384", "PS512", "EdDSA"]},
            "exp": {"type": "integer", "minimum": 1, "default": 86400},
            "base64_secret": {"type": "boolean", "default": false},
            "lifetime_grace_period": {"type": "integer", "minimum": 0, "default": 0}
        },
        "required": ["key"]
    })
}

#[derive(Deserialize)]
struct CredConf {
    key: String,
    secret: Option<String>,
    public_key: Option<String>,
    #[serde(default = "hs256")]
    algorithm: String,
    #[serde(default)]
    base64_secret: bool,
    #[serde(default)]
    lifetime_grace_period: i64,
}

fn hs256() -> String {
    "HS256".into()
}

struct Cred {
    key: Key,
    grace: i64,
    consumer: Arc<ConsumerRt>,
}

/// One consumer credential, checked with APISIX's rules and messages (`check_schema` for TYPE_CONSUMER).
fn cred(conf: &Value) -> Result<(String, Key, i64), String> {
    let c: CredConf = parse(&consumer_schema(), conf)?;
    let alg = Alg::parse(&c.algorithm).ok_or("invalid algorithm")?;
    if matches!(alg, Alg::HS256 | Alg::HS512) && c.secret.is_none() {
        return Err(
            "property \"secret\" is required when \"algorithm\" is \"HS256\" or \"HS512\"".into(),
        );
    }
    let key = if alg.is_hmac() {
        let secret = match c.secret {
            Some(s) if c.base64_secret => base64_decode(&s).ok_or(
                "base64_secret required but the secret is not in base64 format".to_owned(),
            )?,
            Some(s) => s.into_bytes(),
            // APISIX generates a random secret for HS384 without one (no token can then verify).
            None => base64_encode(&rand::random::<[u8; 32]>()).into_bytes(),
        };
        Key::hmac(&secret)
    } else {
        let pem = c.public_key.ok_or("missing valid public key")?;
        let key = Key::public(&pem)?;
        if !key.fits(alg) {
            return Err(format!("public key does not fit algorithm {}", alg.name()));
        }
        key
    };
    Ok((c.key, key, c.lifetime_grace_period))
}

fn creds(consumers: &Consumers) -> Result<HashMap<String, Cred>, String> {
    let mut out = HashMap::new();
    for (conf, rt) in consumers.auth_confs(NAME) {
        let user = &rt.consumer.username;
        let (k, key, grace) = cred(conf).map_err(|e| format!("consumer {user}: jwt-auth: {e}"))?;
        let c = Cred {
            key,
            grace,
            consumer: rt.clone(),
        };
        // Last loaded wins, as in APISIX (the Admin API refuses duplicates across consumers).
        out.insert(k, c);
    }
    Ok(out)
}

struct JwtAuth {
    header: String,
    query: String,
    cookie: String,
    hide: bool,
    claim: String,
    exp: bool,
    nbf: bool,
    anonymous: Option<Arc<ConsumerRt>>,
    /// `Bearer realm="<realm>"`, built once.
    challenge: Bytes,
    creds: HashMap<String, Cred>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let consumers = env.consumers_rt()?;
    let anonymous = consumers.anonymous(c.anonymous_consumer.as_deref())?;
    Ok(Arc::new(JwtAuth {
        header: c.header.to_ascii_lowercase(),
        query: c.query,
        cookie: c.cookie,
        hide: c.hide_credentials,
        claim: c.key_claim_name,
        exp: c.claims_to_verify.iter().any(|x| x == "exp"),
        nbf: c.claims_to_verify.iter().any(|x| x == "nbf"),
        anonymous,
        challenge: Bytes::from(format!("Bearer realm=\"{}\"", c.realm)),
        creds: creds(&consumers)?,
    }))
}

/// The JOSE header: only `alg` matters (a header that is not a JSON object is an invalid token).
#[derive(Deserialize)]
struct JwsHeader<'a> {
    #[serde(borrow, default)]
    alg: Option<Cow<'a, str>>,
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs() as f64)
}

/// The `Cookie` header value without cookie `name` (hide_credentials).
fn cookies_without(ctx: &Ctx<'_>, name: &str) -> String {
    let mut kept = Vec::new();
    for (n, v) in ctx.req.head.headers_iter() {
        if !n.eq_ignore_ascii_case(b"cookie") {
            continue;
        }
        let v = String::from_utf8_lossy(v);
        for kv in v.split(';').map(str::trim).filter(|kv| !kv.is_empty()) {
            if kv.split_once('=').map_or(kv, |(k, _)| k) != name {
                kept.push(kv.to_owned());
            }
        }
    }
    kept.join("; ")
}

impl JwtAuth {
    /// The token (borrowed from the request when it can be) and, under `hide_credentials`, the edit that
    /// removes it from the upstream request.
    fn token<'a>(&self, ctx: &mut Ctx<'a>) -> Option<Cow<'a, str>> {
        let req: &'a crate::ReqView<'a> = ctx.req;
        if let Some(h) = req.head.header(&self.header) {
            let h = h
                .strip_prefix(b"Bearer ")
                .or_else(|| h.strip_prefix(b"bearer "))
                .unwrap_or(h);
            let t = String::from_utf8_lossy(h);
            if self.hide {
                ctx.edits
                    .remove_headers
                    .push(Bytes::from(self.header.clone()));
            }
            return Some(t);
        }
        if let Some(q) = req.arg(&self.query) {
            if self.hide {
                let uri = crate::key_auth::without_arg(ctx, &self.query);
                ctx.edits.uri = Some(Bytes::from(uri));
            }
            return Some(Cow::Borrowed(q));
        }
        let c = Cow::Borrowed(req.cookie(&self.cookie)?);
        if self.hide {
            let rest = cookies_without(ctx, &self.cookie);
            if rest.is_empty() {
                ctx.edits.remove_headers.push(Bytes::from_static(b"cookie"));
            } else {
                let name = Bytes::from_static(b"Cookie");
                ctx.edits.set_headers.push((name, Bytes::from(rest)));
            }
        }
        Some(c)
    }

    fn find(&self, ctx: &mut Ctx<'_>) -> Result<&Cred, &'static str> {
        let token = self.token(ctx).ok_or("Missing JWT token in request")?;
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("JWT token invalid");
        };
        let header = base64_decode(h).ok_or("JWT token invalid")?;
        let header: JwsHeader<'_> =
            serde_json::from_slice(&header).map_err(|_| "JWT token invalid")?;
        let payload = base64_decode(p)
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .filter(Value::is_object)
            .ok_or("JWT token invalid")?;
        let key = match payload.get(&self.claim) {
            None | Some(Value::Null) => return Err("missing user key in JWT token"),
            Some(Value::String(k)) => k.as_str(),
            Some(_) => return Err("Invalid user key in JWT token"),
        };
        let cred = self.creds.get(key).ok_or("Invalid user key in JWT token")?;
        let alg = header
            .alg
            .as_deref()
            .and_then(Alg::parse)
            .ok_or("failed to verify jwt")?;
        let sig = base64_decode(s).ok_or("failed to verify jwt")?;
        let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
        if !cred.key.verify(alg, signed, &sig) {
            return Err("failed to verify jwt");
        }
        let now = now_secs();
        let grace = cred.grace as f64;
        let claim = |name: &str, ok: fn(f64, f64, f64) -> bool| match payload.get(name) {
            None | Some(Value::Null) => true,
            Some(v) => v.as_f64().is_some_and(|x| ok(x, now, grace)),
        };
        if self.exp && !claim("exp", |exp, now, g| exp > now - g) {
            return Err("failed to verify jwt");
        }
        if self.nbf && !claim("nbf", |nbf, now, g| nbf < now + g) {
            return Err("failed to verify jwt");
        }
        Ok(cred)
    }
}

impl Plugin for JwtAuth {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Rewrite])
    }
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        match self.find(ctx) {
            Ok(c) => c.consumer.clone().attach(ctx),
            Err(msg) => match &self.anonymous {
                Some(a) => a.attach(ctx),
                None => {
                    let mut r = Response::message(401, msg);
                    r.headers.push((
                        Bytes::from_static(b"WWW-Authenticate"),
                        self.challenge.clone(),
                    ));
                    return Flow::Respond(r);
                }
            },
        }
        Flow::Continue
    }
}

/// Builds a signed token: `key` is the HMAC secret, or a PKCS#8 `PRIVATE KEY` PEM for RS*/PS*/ES*/EdDSA
/// (tests and tooling).
pub fn sign(alg: Alg, payload: &Value, key: &str) -> Result<String, String> {
    let head = base64url_encode(
        json!({"typ": "JWT", "alg": alg.name()})
            .to_string()
            .as_bytes(),
    );
    let body = base64url_encode(payload.to_string().as_bytes());
    let signing = format!("{head}.{body}");
    let sig = keys::sign(alg, key, signing.as_bytes())?;
    Ok(format!("{signing}.{}", base64url_encode(&sig)))
}

/// Builds an HS256 token (tests and tooling).
pub fn sign_hs256(payload: &Value, secret: &str) -> String {
    sign(Alg::HS256, payload, secret).unwrap_or_default()
}
