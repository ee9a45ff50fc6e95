//! basic-auth (priority 2520, rewrite): `Authorization: Basic base64(user:password)` checked against the
//! consumers' `basic-auth` credentials (compiled map, one probe). `hide_credentials` drops the header before
//! proxying; `anonymous_consumer` is used when authentication fails. 401 bodies and `WWW-Authenticate` as APISIX.

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::consumers::{anonymous_or_reject, ConsumerRt, Consumers};
use crate::registry::Entry;
use crate::util::{base64_decode, parse};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "basic-auth";
pub const PRIORITY: i32 = 2520;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: true,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &[],
        consumer: Some(&["password"]),
        metadata: &[],
    },
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "hide_credentials": {"type": "boolean", "default": false},
            "anonymous_consumer": {"type": "string", "minLength": 1}
        }
    })
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Conf {
    hide_credentials: bool,
    anonymous_consumer: Option<String>,
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

struct BasicAuth {
    hide: bool,
    anonymous: Option<Arc<ConsumerRt>>,
    consumers: Arc<Consumers>,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let consumers = env.consumers_rt()?;
    let anonymous = consumers.anonymous(c.anonymous_consumer.as_deref())?;
    Ok(Arc::new(BasicAuth {
        hide: c.hide_credentials,
        anonymous,
        consumers,
    }))
}

/// `Basic <b64>` -> (user, password) with whitespace removed, as APISIX's `extract_auth_header`.
fn credentials(header: &str) -> Option<(String, String)> {
    let b64 = header.trim_start().strip_prefix("Basic")?;
    if !b64.starts_with(char::is_whitespace) {
        return None;
    }
    let decoded = String::from_utf8(base64_decode(b64.trim())?).ok()?;
    let (u, p) = decoded.split_once(':')?;
    let strip = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    Some((strip(u), strip(p)))
}

impl BasicAuth {
    fn find(&self, ctx: &mut Ctx<'_>) -> Result<Arc<ConsumerRt>, &'static str> {
        let Some(h) = ctx.req.head.header("authorization") else {
            ctx.resp.set_headers.push((
                Bytes::from_static(b"WWW-Authenticate"),
                Bytes::from_static(b"Basic realm='.'"),
            ));
            return Err("Missing authorization in request");
        };
        let (user, pass) = std::str::from_utf8(h)
            .ok()
            .and_then(credentials)
            .ok_or("Invalid authorization in request")?;
        match self.consumers.basic.get(&user) {
            Some((p, c)) if *p == pass => Ok(c.clone()),
            _ => Err("Invalid user authorization"),
        }
    }
}

impl Plugin for BasicAuth {
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
            Ok(c) => {
                if self.hide {
                    ctx.edits
                        .remove_headers
                        .push(Bytes::from_static(b"authorization"));
                }
                c.attach(ctx);
            }
            Err(msg) => return anonymous_or_reject(self.anonymous.as_deref(), ctx, msg),
        }
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_basic_credentials() {
        assert_eq!(
            super::credentials("Basic Zm9vOmJhcg=="),
            Some(("foo".into(), "bar".into()))
        );
        assert_eq!(super::credentials("Bearer x"), None);
        assert_eq!(super::credentials("Basic Zm9v"), None);
    }
}
