//! hmac-auth (priority 2530, rewrite), APISIX 3.x scheme: `Authorization: Signature keyId="..",algorithm="..",
//! headers="@request-target date ..",signature="base64"`. The signing string is the keyId, then per listed
//! header `name: value` (or `METHOD request-uri` for `@request-target`), each line ending in "\n"; it is signed
//! with the consumer's `secret_key` (found by `key_id` in a compiled map). Checks `allowed_algorithms`,
//! `clock_skew` against the Date header (300 s default), and that `signed_headers` were all signed. Every
//! failure answers 401 `{"message":"client request can't be validated"}`, the reason only in the log, as APISIX.
//! hmac-sha1 and `validate_request_body` are refused at compile time (no SHA-1, no request body here yet).

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

pub const NAME: &str = "hmac-auth";
pub const PRIORITY: i32 = 2530;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: true,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &[],
        consumer: Some(&["secret_key"]),
        metadata: &[],
    },
};

const ALGOS: [&str; 3] = ["hmac-sha1", "hmac-sha256", "hmac-sha512"];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "allowed_algorithms": {"type": "array", "minItems": 1,
                "items": {"type": "string", "enum": ALGOS}, "default": ALGOS},
            "clock_skew": {"type": "integer", "default": 300, "minimum": 1},
            "signed_headers": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 50}},
            "validate_request_body": {"type": "boolean", "default": false},
            "hide_credentials": {"type": "boolean", "default": false},
            "anonymous_consumer": {"type": "string", "minLength": 1}
        }
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default = "all_algos")]
    allowed_algorithms: Vec<String>,
    #[serde(default = "skew")]
    clock_skew: i64,
    #[serde(default)]
    signed_headers: Vec<String>,
    #[serde(default)]
    validate_request_body: bool,
    #[serde(default)]
    hide_credentials: bool,
    anonymous_consumer: Option<String>,
}

fn all_algos() -> Vec<String> {
    ALGOS.iter().map(|s| (*s).to_owned()).collect()
}
fn skew() -> i64 {
    300
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    if c.validate_request_body {
        return Err(
            "validate_request_body is not supported yet (plugins cannot read the request body)"
                .into(),
        );
    }
    Ok(())
}

struct HmacAuth {
    allowed: Vec<String>,
    clock_skew: i64,
    signed_headers: Vec<String>,
    hide: bool,
    anonymous: Option<Arc<ConsumerRt>>,
    keys: KeyMap,
}

/// key_id -> (secret, consumer).
type KeyMap = HashMap<String, (Vec<u8>, Arc<ConsumerRt>)>;

fn keys(consumers: &Consumers) -> Result<KeyMap, String> {
    let mut out = HashMap::new();
    for (conf, rt) in consumers.auth_confs(NAME) {
        let field = |f: &str| {
            conf.get(f).and_then(Value::as_str).ok_or_else(|| {
                format!(
                    "consumer {}: hmac-auth: property \"{f}\" is required",
                    rt.consumer.username
                )
            })
        };
        out.insert(
            field("key_id")?.to_owned(),
            (field("secret_key")?.as_bytes().to_vec(), rt.clone()),
        );
    }
    Ok(out)
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    check(v)?;
    let c: Conf = parse(&schema(), v)?;
    let consumers = env.consumers_rt()?;
    let anonymous = consumers.anonymous(c.anonymous_consumer.as_deref())?;
    Ok(Arc::new(HmacAuth {
        allowed: c.allowed_algorithms,
        clock_skew: c.clock_skew,
        signed_headers: c
            .signed_headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
        hide: c.hide_credentials,
        anonymous,
        keys: keys(&consumers)?,
    }))
}

/// `keyId="a",algorithm="b",...` -> pairs.
fn fields(s: &str) -> HashMap<&str, &str> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            Some((k.trim(), v.trim().trim_matches('"')))
        })
        .collect()
}

/// RFC 7231 IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) -> unix seconds.
fn parse_http_date(s: &str) -> Option<i64> {
    let p: Vec<&str> = s.split_whitespace().collect();
    let [_, day, mon, year, time, "GMT"] = p.as_slice() else {
        return None;
    };
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = months.iter().position(|x| x == mon)? as i64 + 1;
    let (d, y): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let t: Vec<i64> = time.split(':').filter_map(|x| x.parse().ok()).collect();
    let [hh, mm, ss] = t.as_slice() else {
        return None;
    };
    // Days from civil (Howard Hinnant's algorithm).
    let (y2, m2) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn mac(algo: &str, key: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    Some(match algo {
        "hmac-sha256" => {
            let mut m = <Hmac<sha2::Sha256>>::new_from_slice(key).ok()?;
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        "hmac-sha512" => {
            let mut m = <Hmac<sha2::Sha512>>::new_from_slice(key).ok()?;
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        _ => return None,
    })
}

impl HmacAuth {
    fn find(&self, ctx: &mut Ctx<'_>) -> Result<Arc<ConsumerRt>, String> {
        let head = ctx.req.head;
        let auth = head
            .header("authorization")
            .and_then(|v| std::str::from_utf8(v).ok())
            .ok_or("missing Authorization header")?;
        let rest = auth
            .strip_prefix("Signature ")
            .ok_or("Authorization header does not start with 'Signature'")?;
        let f = fields(rest);
        let (Some(key_id), Some(sig)) = (f.get("keyId"), f.get("signature")) else {
            return Err("keyId or signature missing".into());
        };
        let algo = f.get("algorithm").ok_or("algorithm missing")?;
        let (secret, consumer) = self.keys.get(*key_id).ok_or("Invalid key_id")?;
        if !self.allowed.iter().any(|a| a == algo) {
            return Err("Invalid algorithm".into());
        }
        if self.clock_skew > 0 {
            let date = head
                .header("date")
                .and_then(|v| std::str::from_utf8(v).ok())
                .ok_or("Date header missing. failed to validate clock skew")?;
            let t = parse_http_date(date).ok_or("Invalid GMT format time")?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            if (now - t).abs() > self.clock_skew {
                return Err("Clock skew exceeded".into());
            }
        }
        let signed: Vec<String> = f
            .get("headers")
            .map(|h| h.split_whitespace().map(str::to_ascii_lowercase).collect())
            .unwrap_or_default();
        for h in &self.signed_headers {
            if !signed.contains(h) {
                return Err(format!("expected header \"{h}\" missing in signing"));
            }
        }
        let mut text = format!("{key_id}\n");
        for h in &signed {
            match head.header(h) {
                Some(v) => {
                    text.push_str(h);
                    text.push_str(": ");
                    text.push_str(&String::from_utf8_lossy(v));
                    text.push('\n');
                }
                None if h == "@request-target" => {
                    text.push_str(&format!("{} {}\n", head.method_str(), head.target_str()));
                }
                None => {}
            }
        }
        let want = mac(algo, secret, text.as_bytes()).ok_or("Invalid algorithm")?;
        let got = base64_decode(sig).ok_or("Invalid signature")?;
        let same = want.len() == got.len()
            && want.iter().zip(&got).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0;
        if !same {
            return Err("Invalid signature".into());
        }
        if self.hide {
            ctx.edits
                .remove_headers
                .push(Bytes::from_static(b"authorization"));
        }
        Ok(consumer.clone())
    }
}

impl Plugin for HmacAuth {
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
            Err(reason) => {
                tracing::warn!(%reason, "client request can't be validated");
                return anonymous_or_reject(
                    self.anonymous.as_deref(),
                    ctx,
                    "client request can't be validated",
                );
            }
        }
        Flow::Continue
    }
}

/// Signs like a client would (tests and tooling): returns the Authorization header value.
pub fn sign(key_id: &str, secret: &str, algorithm: &str, lines: &[(&str, &str)]) -> String {
    let mut text = format!("{key_id}\n");
    let mut names = Vec::new();
    for (n, v) in lines {
        names.push(*n);
        if *n == "@request-target" {
            text.push_str(&format!("{v}\n"));
        } else {
            text.push_str(&format!("{n}: {v}\n"));
        }
    }
    let sig = mac(algorithm, secret.as_bytes(), text.as_bytes()).unwrap_or_default();
    format!(
        "Signature keyId=\"{key_id}\",algorithm=\"{algorithm}\",headers=\"{}\",signature=\"{}\"",
        names.join(" "),
        crate::util::base64_encode(&sig)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_imf_fixdate() {
        assert_eq!(
            super::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(super::parse_http_date("garbage"), None);
    }
}
