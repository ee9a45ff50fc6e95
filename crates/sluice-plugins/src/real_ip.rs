//! real-ip (priority 23000, rewrite): takes the client address from `source` (a variable such as
//! `http_x_forwarded_for` or `arg_realip`) when the peer is in `trusted_addresses` (any peer when unset). For a
//! comma-separated list it takes the last address, or with `recursive` the last one that is not trusted (nginx
//! realip). The address becomes `remote_addr` for later plugins (ip-restriction, limit keys, loggers); the
//! router and balancer still see the peer.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_router::Var;

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "real-ip";
pub const PRIORITY: i32 = 23000;

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
            "trusted_addresses": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "source": {"type": "string", "minLength": 1},
            "recursive": {"type": "boolean", "default": false}
        },
        "required": ["source"]
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    trusted_addresses: Vec<String>,
    source: String,
    #[serde(default)]
    recursive: bool,
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    crate::ip_restriction::parse_nets(&c.trusted_addresses).map(drop)
}

struct RealIp {
    trusted: Vec<IpNet>,
    source: Var,
    recursive: bool,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    Ok(Arc::new(RealIp {
        trusted: crate::ip_restriction::parse_nets(&c.trusted_addresses)?,
        source: Var::parse(&c.source),
        recursive: c.recursive,
    }))
}

/// `1.2.3.4`, `1.2.3.4:80`, `[::1]:80`, `::1`.
fn parse_addr(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Some(sa.ip());
    }
    s.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

impl RealIp {
    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }
}

impl Plugin for RealIp {
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
        if !self.trusted.is_empty() && !self.trusted(ctx.req.peer.ip()) {
            return Flow::Continue;
        }
        let Some(value) = ctx.req.var_owned(&self.source) else {
            return Flow::Continue;
        };
        let parts: Vec<&str> = value.split(',').map(str::trim).collect();
        let pick = if self.recursive && !self.trusted.is_empty() {
            parts
                .iter()
                .rev()
                .filter_map(|p| parse_addr(p))
                .find(|ip| !self.trusted(*ip))
                .or_else(|| parts.first().and_then(|p| parse_addr(p)))
        } else {
            parts.last().and_then(|p| parse_addr(p))
        };
        if let Some(ip) = pick {
            ctx.real_ip = Some(ip);
        }
        Flow::Continue
    }
}
