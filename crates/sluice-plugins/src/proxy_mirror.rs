//! proxy-mirror (priority 1010, rewrite): for `sample_ratio` of the requests, a copy (method, headers, body) goes
//! to `host`, at the request's uri, `path` instead of it (`path_concat_mode: replace`, the query kept) or `path`
//! before it (`prefix`). The hook only decides and records the copy's address and target ([`Mirror`]); the
//! proxy sends it on its own task, never delaying or failing the main request, and ignores the mirror's answer.
//! Not here: sending (sluice-proxy's `mirror.rs`), its concurrency bound and body limit.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "proxy-mirror";
pub const PRIORITY: i32 = 1010;

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
            "host": {
                "type": "string",
                "pattern": "^(http(s)?|grpc(s)?):\\/\\/([\\da-zA-Z.-]+|\\[[\\da-fA-F:]+\\])(:\\d+)?$"
            },
            "path": {"type": "string", "pattern": "^/[^?&]+$"},
            "path_concat_mode": {"type": "string", "default": "replace", "enum": ["replace", "prefix"]},
            "sample_ratio": {"type": "number", "minimum": 0.00001, "maximum": 1, "default": 1}
        },
        "required": ["host"]
    })
}

#[derive(Deserialize)]
struct Conf {
    host: String,
    path: Option<String>,
    #[serde(default = "replace")]
    path_concat_mode: String,
    #[serde(default = "one")]
    sample_ratio: f64,
}

fn replace() -> String {
    "replace".into()
}

fn one() -> f64 {
    1.0
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    target(&c.host).map(drop)
}

/// `http://host[:port]` to the address the copies go to, resolved once per compile.
fn target(host: &str) -> Result<SocketAddr, String> {
    let Some(authority) = host.strip_prefix("http://") else {
        return Err(format!(
            "only http:// mirrors are supported, got {host:?} (https and grpc mirrors are not)"
        ));
    };
    let (name, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("invalid port in {host:?}"))?,
        ),
        _ => (authority, 80),
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    (name, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {name}: {e}"))?
        .next()
        .ok_or_else(|| format!("{name} resolves to no address"))
}

/// A copy of the request the proxy is to send: where, and the request-target to use.
#[derive(Debug, Clone)]
pub struct Mirror {
    pub addr: SocketAddr,
    pub target: Box<str>,
}

struct ProxyMirror {
    addr: SocketAddr,
    path: Option<String>,
    prefix: bool,
    sample_ratio: f64,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(ProxyMirror {
        addr: target(&c.host)?,
        path: c.path,
        prefix: c.path_concat_mode == "prefix",
        sample_ratio: c.sample_ratio,
    }))
}

impl Plugin for ProxyMirror {
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
        if self.sample_ratio < 1.0 && rand::random::<f64>() >= self.sample_ratio {
            return Flow::Continue;
        }
        // The uri as the client sent it: proxy-rewrite (priority 1008) has not run yet, as in APISIX.
        let head = &ctx.req.head;
        let target = match &self.path {
            None => head.target_str().into(),
            Some(p) if self.prefix => format!("{p}{}", head.target_str()).into(),
            Some(p) => match head.query_str() {
                Some(q) => format!("{p}?{q}").into(),
                None => p.as_str().into(),
            },
        };
        ctx.mirror = Some(Mirror {
            addr: self.addr,
            target,
        });
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn targets_are_http_host_and_port() {
        assert_eq!(
            super::target("http://127.0.0.1:1986").unwrap(),
            "127.0.0.1:1986".parse().unwrap()
        );
        assert_eq!(super::target("http://[::1]").unwrap().port(), 80);
        assert!(super::target("https://127.0.0.1:1986")
            .unwrap_err()
            .contains("only http://"));
    }
}
