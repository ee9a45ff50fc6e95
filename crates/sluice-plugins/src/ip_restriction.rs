//! ip-restriction (priority 3000, access): `whitelist` or `blacklist` of IPs and CIDRs matched against the
//! client address (`remote_addr`, or the one real-ip established). Rejects with `response_code` (403)
//! and `{"message": message}` (default "Your IP address is not allowed").

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response};

pub const NAME: &str = "ip-restriction";
pub const PRIORITY: i32 = 3000;

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
            "message": {"type": "string", "minLength": 1, "maxLength": 1024, "default": "Your IP address is not allowed"},
            "response_code": {"type": "integer", "minimum": 403, "maximum": 404, "default": 403},
            "whitelist": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "blacklist": {"type": "array", "items": {"type": "string"}, "minItems": 1}
        },
        "oneOf": [{"required": ["whitelist"]}, {"required": ["blacklist"]}]
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default = "default_message")]
    message: String,
    #[serde(default = "default_code")]
    response_code: u16,
    whitelist: Option<Vec<String>>,
    blacklist: Option<Vec<String>>,
}

fn default_message() -> String {
    "Your IP address is not allowed".into()
}
fn default_code() -> u16 {
    403
}

/// Parses `1.2.3.4`, `1.2.3.0/24`, `::1`, `fe80::/10`.
pub(crate) fn parse_nets(list: &[String]) -> Result<Vec<IpNet>, String> {
    list.iter()
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("invalid ip address: {s}"))
        })
        .collect()
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    parse_nets(
        c.whitelist
            .as_deref()
            .or(c.blacklist.as_deref())
            .unwrap_or(&[]),
    )
    .map(drop)
}

struct IpRestriction {
    nets: Vec<IpNet>,
    allow: bool,
    code: u16,
    message: String,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let (list, allow) = match (&c.whitelist, &c.blacklist) {
        (Some(w), _) => (w, true),
        (None, Some(b)) => (b, false),
        (None, None) => return Err("whitelist or blacklist is required".into()),
    };
    Ok(Arc::new(IpRestriction {
        nets: parse_nets(list)?,
        allow,
        code: c.response_code,
        message: c.message,
    }))
}

impl Plugin for IpRestriction {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Access])
    }
    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let ip = match ctx.remote_ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        let hit = self.nets.iter().any(|n| n.contains(&ip));
        if hit != self.allow {
            return Flow::Respond(Response::message(self.code, &self.message));
        }
        Flow::Continue
    }
}

/// The stream form (APISIX `apisix/stream/plugins/ip-restriction.lua`: the same schema, `restrict` run in
/// `preread`): a refused client's connection is closed.
pub(crate) mod stream {
    use ipnet::IpNet;
    use serde_json::Value;

    use crate::stream::{Preread, StreamConn, StreamHeld, StreamPlugin};

    pub(crate) struct Stream {
        nets: Vec<IpNet>,
        allow: bool,
    }

    pub(crate) fn compile(v: &Value) -> Result<Stream, String> {
        let c: super::Conf = crate::util::parse(&super::schema(), v)?;
        let (list, allow) = match (&c.whitelist, &c.blacklist) {
            (Some(w), _) => (w, true),
            (None, Some(b)) => (b, false),
            (None, None) => return Err("whitelist or blacklist is required".into()),
        };
        Ok(Stream {
            nets: super::parse_nets(list)?,
            allow,
        })
    }

    impl StreamPlugin for Stream {
        fn name(&self) -> &'static str {
            super::NAME
        }
        fn priority(&self) -> i32 {
            super::PRIORITY
        }
        fn preread(&self, c: &StreamConn<'_>, _held: &mut StreamHeld) -> Preread {
            let ip = match c.remote.ip() {
                std::net::IpAddr::V6(v6) => v6
                    .to_ipv4_mapped()
                    .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                v4 => v4,
            };
            if self.nets.iter().any(|n| n.contains(&ip)) != self.allow {
                return Preread::Close(super::NAME);
            }
            Preread::Continue(std::time::Duration::ZERO)
        }
    }
}
