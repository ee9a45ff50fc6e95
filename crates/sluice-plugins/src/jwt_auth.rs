//! jwt-auth (priority 2510, rewrite): a JWT from the `header` (default `authorization`, optional `Bearer `),
//! else the `query` argument `jwt`, else the `cookie` `jwt`. The claim `key_claim_name` (default `key`) names the
//! consumer (compiled key map); the signature is checked with that consumer's `secret` (HS256 / HS512, optionally
//! `base64_secret`), then `exp` / `nbf` with `lifetime_grace_period`. `hide_credentials` drops the header, and
//! `anonymous_consumer` is used when authentication fails. 401 bodies as APISIX. RS256 / ES256 consumers are
//! refused at compile time (no public-key crypto here yet).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::consumers::{anonymous_or_reject, ConsumerRt, Consumers};
use crate::registry::Entry;
use crate::util::{base64_decode, parse};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "jwt-auth";
pub const PRIORITY: i32 = 2510;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: true,
    schema,
    check,
    compile,
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
            "anonymous_consumer": {"type": "string", "minLength": 1},
            "store_in_ctx": {"type": "boolean", "default": false}
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
    anonymous_consumer: Option<String>,
}

impl Default for Conf {
    fn default() -> Self {
        Conf {
            header: "authorization".into(),
            query: "jwt".into(),
            cookie: "jwt".into(),
            hide_credentials: false,
            key_claim_name: "key".into(),
            anonymous_consumer: None,
        }
    }
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

#[derive(Clone, Copy)]
enum Alg {
    Hs256,
    Hs512,
}

struct Cred {
    secret: Vec<u8>,
    alg: Alg,
    grace: i64,
    consumer: Arc<ConsumerRt>,
}

struct JwtAuth {
    header: String,
    query: String,
    cookie: String,
    hide: bool,
    claim: String,
    anonymous: Option<Arc<ConsumerRt>>,
    creds: HashMap<String, Cred>,
}

fn creds(consumers: &Consumers) -> Result<HashMap<String, Cred>, String> {
    let mut out = HashMap::new();
    for rt in &consumers.list {
        let Some(conf) = rt.consumer.plugins.get(NAME) else {
            continue;
        };
        let user = &rt.consumer.username;
        let key = conf
            .get("key")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("consumer {user}: jwt-auth: property \"key\" is required"))?;
        let alg = match conf
            .get("algorithm")
            .and_then(Value::as_str)
            .unwrap_or("HS256")
        {
            "HS256" => Alg::Hs256,
            "HS512" => Alg::Hs512,
            other => {
                return Err(format!(
                    "consumer {user}: jwt-auth: algorithm {other} is not supported yet"
                ))
            }
        };
        let secret = conf.get("secret").and_then(Value::as_str).unwrap_or("");
        let secret = if conf
            .get("base64_secret")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            base64_decode(secret)
                .ok_or_else(|| format!("consumer {user}: jwt-auth: invalid base64 secret"))?
        } else {
            secret.as_bytes().to_vec()
        };
        let grace = conf
            .get("lifetime_grace_period")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        out.insert(
            key.to_owned(),
            Cred {
                secret,
                alg,
                grace,
                consumer: rt.clone(),
            },
        );
    }
    Ok(out)
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
        anonymous,
        creds: creds(&consumers)?,
    }))
}

fn sign(alg: Alg, secret: &[u8], data: &[u8]) -> Vec<u8> {
    match alg {
        Alg::Hs256 => {
            let mut m =
                <Hmac<sha2::Sha256>>::new_from_slice(secret).expect("hmac takes any key length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        Alg::Hs512 => {
            let mut m =
                <Hmac<sha2::Sha512>>::new_from_slice(secret).expect("hmac takes any key length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
    }
}

/// Constant-time comparison of two signatures.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl JwtAuth {
    fn token(&self, ctx: &Ctx<'_>) -> Option<(String, bool)> {
        if let Some(h) = ctx.req.head.header(&self.header) {
            let t = String::from_utf8_lossy(h);
            let t = t
                .strip_prefix("Bearer ")
                .or_else(|| t.strip_prefix("bearer "))
                .unwrap_or(&t)
                .to_owned();
            return Some((t, true));
        }
        if let Some(q) = ctx.req.arg(&self.query) {
            return Some((q.to_owned(), false));
        }
        ctx.req.cookie(&self.cookie).map(|c| (c.to_owned(), false))
    }

    fn find(&self, ctx: &mut Ctx<'_>) -> Result<Arc<ConsumerRt>, &'static str> {
        let (token, from_header) = self.token(ctx).ok_or("Missing JWT token in request")?;
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("JWT token invalid");
        };
        let decode =
            |x: &str| base64_decode(x).and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let (Some(header), Some(payload), Some(sig)) = (decode(h), decode(p), base64_decode(s))
        else {
            return Err("JWT token invalid");
        };
        if !header.is_object() || !payload.is_object() {
            return Err("JWT token invalid");
        }
        let key = payload
            .get(&self.claim)
            .and_then(Value::as_str)
            .ok_or("missing user key in JWT token")?;
        let cred = self.creds.get(key).ok_or("Invalid user key in JWT token")?;
        let want = match (header.get("alg").and_then(Value::as_str), cred.alg) {
            (Some("HS256"), Alg::Hs256) | (Some("HS512"), Alg::Hs512) => cred.alg,
            _ => return Err("failed to verify jwt"),
        };
        let signed = &token[..h.len() + 1 + p.len()];
        if !same(&sign(want, &cred.secret, signed.as_bytes()), &sig) {
            return Err("failed to verify jwt");
        }
        let now = now_secs();
        if let Some(exp) = payload.get("exp") {
            if exp.as_f64().is_none_or(|e| (e as i64) + cred.grace <= now) {
                return Err("failed to verify jwt");
            }
        }
        if let Some(nbf) = payload.get("nbf") {
            if nbf.as_f64().is_none_or(|n| (n as i64) - cred.grace > now) {
                return Err("failed to verify jwt");
            }
        }
        if self.hide && from_header {
            ctx.edits
                .remove_headers
                .push(Bytes::from(self.header.clone()));
        }
        Ok(cred.consumer.clone())
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
            Ok(c) => c.attach(ctx),
            Err(msg) => return anonymous_or_reject(self.anonymous.as_deref(), ctx, msg),
        }
        Flow::Continue
    }
}

/// Builds an HS256 token (tests and tooling).
pub fn sign_hs256(payload: &Value, secret: &str) -> String {
    let enc = |b: &[u8]| crate::util::base64url_encode(b);
    let head = enc(br#"{"typ":"JWT","alg":"HS256"}"#);
    let body = enc(payload.to_string().as_bytes());
    let signing = format!("{head}.{body}");
    let sig = sign(Alg::Hs256, secret.as_bytes(), signing.as_bytes());
    format!("{signing}.{}", enc(&sig))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hs256_matches_the_rfc7515_shape() {
        let t = super::sign_hs256(
            &serde_json::json!({"key": "user-key", "exp": 1}),
            "my-secret-key",
        );
        assert_eq!(t.split('.').count(), 3);
        assert!(!t.contains('='), "unpadded base64url");
    }
}
