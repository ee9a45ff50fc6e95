//! csrf (priority 2980; access, header_filter), APISIX's apisix/plugins/csrf.lua: the double-submit cookie. Every
//! response sets the cookie `name=<token>;path=/;Expires=<now + expires>`; a request other than GET must carry the
//! same token in the header `name` and in the cookie, and the token must be one this key signed, else 401 with
//! APISIX's `error_msg` texts.
//!
//! The token keeps APISIX's shape (base64 of `{"random","expires","sign"}`) with two fixes, since a token is
//! only ever checked by the gateway that issued it: `sign` is an HMAC-SHA256 keyed with `key` (APISIX hashes a
//! JSON text holding the key, whose field order depends on the Lua table), compared in constant time, and
//! `expires` is the token's end as a unix time, checked (APISIX stores the configured duration and never checks
//! it, so a stolen token works forever).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::{base64_decode, base64_encode, parse, reject};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "csrf";
pub const PRIORITY: i32 = 2980;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields::NONE,
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "key": {"description": "use to generate csrf token", "type": "string"},
            "expires": {"description": "expires time(s) for csrf token", "type": "integer", "default": 7200},
            "name": {"description": "the csrf token name", "type": "string", "default": "apisix-csrf-token"}
        },
        "required": ["key"]
    })
}

#[derive(Deserialize)]
struct Conf {
    key: String,
    #[serde(default = "two_hours")]
    expires: i64,
    #[serde(default = "default_name")]
    name: String,
}

fn two_hours() -> i64 {
    7200
}

fn default_name() -> String {
    "apisix-csrf-token".into()
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

struct Csrf {
    key: Vec<u8>,
    expires: i64,
    /// The header name, lower-cased for lookup.
    header: String,
    name: String,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(Csrf {
        key: c.key.into_bytes(),
        expires: c.expires,
        header: c.name.to_ascii_lowercase(),
        name: c.name,
    }))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Csrf {
    fn mac(&self, random: &str, expires: i64) -> Hmac<sha2::Sha256> {
        let mut m =
            <Hmac<sha2::Sha256>>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        m.update(random.as_bytes());
        m.update(b"\n");
        m.update(expires.to_string().as_bytes());
        m
    }

    fn token(&self, now: i64) -> String {
        let random = format!("{:016x}", rand::random::<u64>());
        let expires = now.saturating_add(self.expires);
        let sign = base64_encode(&self.mac(&random, expires).finalize().into_bytes());
        let t = json!({"random": random, "expires": expires, "sign": sign});
        base64_encode(t.to_string().as_bytes())
    }

    /// The token is this key's signature of its random and end time, and has not ended.
    fn valid(&self, token: &str, now: i64) -> bool {
        let Some(text) = base64_decode(token) else {
            return false;
        };
        let Ok(t) = serde_json::from_slice::<Value>(&text) else {
            return false;
        };
        let (Some(random), Some(expires), Some(sign)) = (
            t.get("random").and_then(Value::as_str),
            t.get("expires").and_then(Value::as_i64),
            t.get("sign").and_then(Value::as_str),
        ) else {
            return false;
        };
        let Some(sign) = base64_decode(sign) else {
            return false;
        };
        expires > now && self.mac(random, expires).verify_slice(&sign).is_ok()
    }
}

impl Plugin for Csrf {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access, Phase::HeaderFilter])
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        if ctx.req.head.method_str() == "GET" {
            return Flow::Continue;
        }
        let Some(header) = ctx
            .req
            .head
            .header(&self.header)
            .and_then(|v| std::str::from_utf8(v).ok())
        else {
            return Flow::Respond(reject(401, Some("no csrf token in headers")));
        };
        let Some(cookie) = ctx.req.cookie(&self.name) else {
            return Flow::Respond(reject(401, Some("no csrf cookie")));
        };
        if header != cookie {
            return Flow::Respond(reject(401, Some("csrf token mismatch")));
        }
        if !self.valid(cookie, now()) {
            return Flow::Respond(reject(
                401,
                Some("Failed to verify the csrf token signature"),
            ));
        }
        Flow::Continue
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, _status: u16) {
        let now = now();
        let until = httpdate_cookie(now.saturating_add(self.expires));
        let cookie = format!("{}={};path=/;Expires={until}", self.name, self.token(now));
        ctx.resp
            .add_headers
            .push((Bytes::from_static(b"Set-Cookie"), Bytes::from(cookie)));
    }
}

/// nginx's `ngx.cookie_time`: `Thu, 18-Nov-10 11:27:35 GMT`.
fn httpdate_cookie(t: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = t.max(0);
    let (days, secs) = (t / 86_400, t % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{}, {:02}-{}-{:02} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        d,
        MONTHS[(m - 1) as usize],
        y % 100,
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(expires: i64) -> Csrf {
        Csrf {
            key: b"userkey".to_vec(),
            expires,
            header: "apisix-csrf-token".into(),
            name: "apisix-csrf-token".into(),
        }
    }

    #[test]
    fn cookie_time_is_nginx_s() {
        assert_eq!(
            httpdate_cookie(1_290_079_655),
            "Thu, 18-Nov-10 11:27:35 GMT"
        );
        assert_eq!(httpdate_cookie(0), "Thu, 01-Jan-70 00:00:00 GMT");
        assert_eq!(httpdate_cookie(951_782_400), "Tue, 29-Feb-00 00:00:00 GMT");
    }

    #[test]
    fn tokens_verify_until_they_end_and_only_under_their_key() {
        let p = plugin(60);
        let t = p.token(1_000);
        assert!(p.valid(&t, 1_059));
        assert!(!p.valid(&t, 1_060), "ended");
        let other = Csrf {
            key: b"otherkey".to_vec(),
            ..plugin(60)
        };
        assert!(!other.valid(&t, 1_001), "another key's token");
    }

    #[test]
    fn forged_and_altered_tokens_are_refused() {
        let p = plugin(60);
        let t = p.token(1_000);
        let mut v: Value = serde_json::from_slice(&base64_decode(&t).unwrap()).unwrap();
        v["expires"] = json!(9_999_999_999i64);
        let stretched = base64_encode(v.to_string().as_bytes());
        assert!(
            !p.valid(&stretched, 1_001),
            "a longer life breaks the signature"
        );
        for bad in [
            "",
            "!!!",
            "e30=",
            &base64_encode(b"{\"random\":1,\"expires\":2,\"sign\":\"x\"}"),
        ] {
            assert!(!p.valid(bad, 1_001), "{bad}");
        }
    }
}
