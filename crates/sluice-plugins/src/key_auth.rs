//! key-auth (priority 2500, rewrite): the key comes from the `header` (default `apikey`) or else the `query`
//! argument (default `apikey`); the consumer is found in the snapshot's compiled key map. `hide_credentials`
//! removes the header or argument before proxying; `anonymous_consumer` names the consumer used when no valid
//! key is given. 401 bodies and `WWW-Authenticate` are APISIX's. Consumers' own `key-auth` objects are credentials (`{"key": ...}`).

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::consumers::{anonymous_or_reject, ConsumerRt, Consumers};
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "key-auth";
pub const PRIORITY: i32 = 2500;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: true,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &[],
        consumer: Some(&["key"]),
        metadata: &[],
    },
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "header": {"type": "string", "default": "apikey"},
            "query": {"type": "string", "default": "apikey"},
            "realm": {"type": "string", "default": "key"},
            "hide_credentials": {"type": "boolean", "default": false},
            "anonymous_consumer": {"type": "string", "minLength": 1}
        }
    })
}

#[derive(Deserialize)]
#[serde(default)]
struct Conf {
    header: String,
    query: String,
    realm: String,
    hide_credentials: bool,
    anonymous_consumer: Option<String>,
}

impl Default for Conf {
    fn default() -> Self {
        Conf {
            header: "apikey".into(),
            query: "apikey".into(),
            realm: "key".into(),
            hide_credentials: false,
            anonymous_consumer: None,
        }
    }
}

fn check(v: &Value) -> Result<(), String> {
    crate::util::parse::<Conf>(&schema(), v).map(drop)
}

struct KeyAuth {
    header: String,
    query: String,
    hide: bool,
    anonymous: Option<Arc<ConsumerRt>>,
    consumers: Arc<Consumers>,
    /// `apikey realm="<realm>"` (APISIX 3.15+ sends it with every 401), built once.
    challenge: Bytes,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = crate::util::parse(&schema(), v)?;
    let consumers = env.consumers_rt()?;
    let anonymous = consumers.anonymous(c.anonymous_consumer.as_deref())?;
    Ok(Arc::new(KeyAuth {
        header: c.header.to_ascii_lowercase(),
        query: c.query,
        hide: c.hide_credentials,
        anonymous,
        consumers,
        challenge: Bytes::from(format!("apikey realm=\"{}\"", c.realm)),
    }))
}

impl KeyAuth {
    fn find(&self, ctx: &mut Ctx<'_>) -> Result<&ConsumerRt, &'static str> {
        let (key, from_header) = match ctx.req.head.header(&self.header) {
            Some(k) => (k, true),
            None => match ctx.req.arg(&self.query) {
                Some(k) => (k.as_bytes(), false),
                None => return Err("Missing API key in request"),
            },
        };
        let keys = &self.consumers.keys;
        // Keys are UTF-8 (JSON strings): a header value that is not is looked up as the empty key, as it always
        // was, checked only on this miss path instead of on every request.
        let found = match keys.get(key) {
            Some(c) => c,
            None if std::str::from_utf8(key).is_err() => {
                keys.get(&b""[..]).ok_or("Invalid API key in request")?
            }
            None => return Err("Invalid API key in request"),
        };
        if self.hide {
            if from_header {
                ctx.edits
                    .remove_headers
                    .push(Bytes::from(self.header.clone()));
            } else {
                ctx.edits.uri = Some(Bytes::from(without_arg(ctx, &self.query)));
            }
        }
        Ok(found)
    }
}

/// The request-target without query argument `name` (current edits taken into account).
pub(crate) fn without_arg(ctx: &Ctx<'_>, name: &str) -> String {
    let target = match &ctx.edits.uri {
        Some(u) => String::from_utf8_lossy(u).into_owned(),
        None => ctx.req.head.target_str().to_owned(),
    };
    let Some((path, query)) = target.split_once('?') else {
        return target;
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| kv.split_once('=').map_or(*kv, |(k, _)| k) != name)
        .collect();
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

impl Plugin for KeyAuth {
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
            Err(msg) => {
                if self.anonymous.is_none() {
                    ctx.resp.set_headers.push((
                        Bytes::from_static(b"WWW-Authenticate"),
                        self.challenge.clone(),
                    ));
                }
                return anonymous_or_reject(self.anonymous.as_deref(), ctx, msg);
            }
        }
        Flow::Continue
    }
}
