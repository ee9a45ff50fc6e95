//! request-id (priority 12015, rewrite + header_filter): keeps the request's `header_name` (X-Request-Id) or
//! generates one (`uuid` v4, `range_id`; `nanoid` is generated as a 21-char URL-safe id), sets it on the
//! upstream request and, with `include_in_response`, on the response. Published as the `request_id` variable.

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin};

pub const NAME: &str = "request-id";
pub const PRIORITY: i32 = 12015;

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
            "header_name": {"type": "string", "default": "X-Request-Id"},
            "include_in_response": {"type": "boolean", "default": true},
            "algorithm": {"type": "string", "enum": ["uuid", "nanoid", "range_id"], "default": "uuid"},
            "range_id": {"type": "object", "properties": {
                "char_set": {"type": "string", "minLength": 6,
                             "default": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"},
                "length": {"type": "integer", "minimum": 6, "default": 16}
            }, "default": {}}
        }
    })
}

#[derive(Deserialize)]
struct RangeId {
    #[serde(default = "charset")]
    char_set: String,
    #[serde(default = "sixteen")]
    length: usize,
}

impl Default for RangeId {
    fn default() -> Self {
        RangeId {
            char_set: charset(),
            length: 16,
        }
    }
}

fn charset() -> String {
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789".into()
}
fn sixteen() -> usize {
    16
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default = "header")]
    header_name: String,
    #[serde(default = "crate::limit_count::yes")]
    include_in_response: bool,
    #[serde(default = "uuid")]
    algorithm: String,
    #[serde(default)]
    range_id: RangeId,
}

fn header() -> String {
    "X-Request-Id".into()
}
fn uuid() -> String {
    "uuid".into()
}

fn check(v: &Value) -> Result<(), String> {
    parse::<Conf>(&schema(), v).map(drop)
}

enum Algo {
    Uuid,
    Chars(Vec<char>, usize),
}

struct RequestId {
    header: Bytes,
    lower: String,
    include: bool,
    algo: Algo,
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let algo = match c.algorithm.as_str() {
        "uuid" => Algo::Uuid,
        "nanoid" => Algo::Chars(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
                .chars()
                .collect(),
            21,
        ),
        _ => Algo::Chars(c.range_id.char_set.chars().collect(), c.range_id.length),
    };
    Ok(Arc::new(RequestId {
        lower: c.header_name.to_ascii_lowercase(),
        header: Bytes::from(c.header_name),
        include: c.include_in_response,
        algo,
    }))
}

pub(crate) fn uuid_v4() -> String {
    let r: u128 = rand::random();
    let r =
        (r & !(0xF000u128 << 64) | (0x4000u128 << 64)) & !(0xC000u128 << 48) | (0x8000u128 << 48);
    let h = format!("{r:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl RequestId {
    fn generate(&self) -> String {
        match &self.algo {
            Algo::Uuid => uuid_v4(),
            Algo::Chars(set, n) => (0..*n)
                .map(|_| set[rand::random::<usize>() % set.len().max(1)])
                .collect(),
        }
    }
}

impl Plugin for RequestId {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Rewrite, Phase::HeaderFilter])
    }
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        let id = match ctx.req.head.header(&self.lower) {
            Some(v) => String::from_utf8_lossy(v).into_owned(),
            None => {
                let id = self.generate();
                ctx.edits
                    .set_headers
                    .push((self.header.clone(), Bytes::from(id.clone())));
                id
            }
        };
        ctx.set_var("request_id", id);
        Flow::Continue
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, _status: u16) {
        if !self.include {
            return;
        }
        let id = ctx
            .vars
            .iter()
            .find(|(n, _)| *n == "request_id")
            .map(|(_, v)| Bytes::from(v.to_string()));
        if let Some(id) = id {
            ctx.resp.set_headers.push((self.header.clone(), id));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_shape() {
        let u = super::uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]), "{u}");
    }
}
