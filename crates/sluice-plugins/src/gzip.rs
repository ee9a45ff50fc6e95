//! gzip (priority 995): compresses responses as APISIX does with nginx's gzip filter. The plugin's header_filter
//! makes APISIX's checks (`types`, `min_length` against Content-Length, `http_version`, then `vary`); the output
//! stage in [`crate::filters`] makes nginx's on the final head (status 200/403/404, not already encoded, not HEAD,
//! Accept-Encoding allows gzip) and compresses after every plugin's body_filter, so a body response-rewrite
//! replaced is the one compressed. `buffers` is accepted and ignored: the encoder streams into a growing buffer
//! and hands out whatever it produced per piece. Not here: other encodings (brotli is APISIX's `brotli` plugin).

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::filters::BodyChunk;
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Phase, PhaseMask, Plugin};

pub const NAME: &str = "gzip";
pub const PRIORITY: i32 = 995;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "types": {
                "anyOf": [
                    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                    {"enum": ["*"]}
                ],
                "default": ["text/html"]
            },
            "min_length": {"type": "integer", "minimum": 1, "default": 20},
            "comp_level": {"type": "integer", "minimum": 1, "maximum": 9, "default": 1},
            "http_version": {"enum": [1.1, 1.0], "default": 1.1},
            "buffers": {
                "type": "object",
                "properties": {
                    "number": {"type": "integer", "minimum": 1, "default": 32},
                    "size": {"type": "integer", "minimum": 1, "default": 4096}
                },
                "default": {"number": 32, "size": 4096}
            },
            "vary": {"type": "boolean"}
        }
    })
}

#[derive(Deserialize)]
struct Conf {
    #[serde(default)]
    types: Option<Value>,
    #[serde(default = "default_min_length")]
    min_length: u64,
    #[serde(default = "default_comp_level")]
    comp_level: u32,
    #[serde(default)]
    http_version: Option<f64>,
    #[serde(default)]
    vary: bool,
}

fn default_min_length() -> u64 {
    20
}
fn default_comp_level() -> u32 {
    1
}

/// The compiled configuration, shared by every response the route compresses.
#[derive(Debug)]
pub(crate) struct GzipConf {
    /// `None`: `"*"`, every type.
    types: Option<Vec<String>>,
    min_length: u64,
    level: u32,
    /// `http_version: 1.0` admits HTTP/1.0 clients too.
    http10_ok: bool,
    vary: bool,
}

fn compile_conf(v: &Value) -> Result<GzipConf, String> {
    let c: Conf = crate::util::parse(&schema(), v)?;
    let types = match c.types {
        None => Some(vec!["text/html".to_owned()]),
        Some(Value::String(_)) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect(),
        ),
        Some(_) => return Err("invalid types".into()),
    };
    Ok(GzipConf {
        types,
        min_length: c.min_length,
        level: c.comp_level,
        http10_ok: c.http_version.is_some_and(|v| v < 1.05),
        vary: c.vary,
    })
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v).map(drop)
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(Gzip(Arc::new(compile_conf(v)?))))
}

struct Gzip(Arc<GzipConf>);

impl Plugin for Gzip {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    // BodyFilter puts the route on the proxy's filtering path; the compression itself is the output stage's.
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::HeaderFilter, Phase::BodyFilter])
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, _status: u16) {
        let c = &self.0;
        // Like nginx, no Content-Type means no gzip.
        let Some(ct) = ctx.response_header("content-type") else {
            return;
        };
        if let Some(types) = &c.types {
            let ct = ct.split(|&b| b == b';').next().unwrap_or_default();
            if !types.iter().any(|t| t.as_bytes() == ct) {
                return;
            }
        }
        // Like nginx, a response without Content-Length is not held to min_length.
        let len = ctx
            .response_header("content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        if len.is_some_and(|n| n < c.min_length) {
            return;
        }
        if ctx.req.head.version == sluice_http::Version::Http10 && !c.http10_ok {
            return;
        }
        ctx.request_gzip(self.0.clone());
        if c.vary {
            ctx.resp.add_headers.push((
                Bytes::from_static(b"Vary"),
                Bytes::from_static(b"Accept-Encoding"),
            ));
        }
    }
}

/// nginx's gzip header filter on the final head: `Some` when this response is compressed (and the head edited).
pub(crate) fn decide(conf: &GzipConf, ctx: &mut Ctx<'_>, status: u16) -> Option<Encoder> {
    if !matches!(status, 200 | 403 | 404) || ctx.req.head.method_str() == "HEAD" {
        return None;
    }
    if ctx
        .response_header("content-encoding")
        .is_some_and(|v| !v.is_empty())
    {
        return None;
    }
    if !accepts_gzip(ctx.req.head.header("accept-encoding")?) {
        return None;
    }
    // nginx turns a strong ETag weak: the bytes change, the entity does not.
    let weak = ctx
        .response_header("etag")
        .filter(|v| v.first() == Some(&b'"'))
        .map(|v| {
            let mut w = b"W/".to_vec();
            w.extend_from_slice(v);
            Bytes::from(w)
        });
    let e = &mut ctx.resp;
    e.body_modified = true;
    e.remove("content-length");
    e.remove("accept-ranges");
    if let Some(w) = weak {
        e.set(Bytes::from_static(b"ETag"), w);
    }
    e.set(
        Bytes::from_static(b"Content-Encoding"),
        Bytes::from_static(b"gzip"),
    );
    Some(Encoder(GzEncoder::new(
        Vec::with_capacity(4096),
        Compression::new(conf.level),
    )))
}

/// Whether an Accept-Encoding value lists gzip (or `*`) with a non-zero q.
fn accepts_gzip(v: &[u8]) -> bool {
    let Ok(v) = std::str::from_utf8(v) else {
        return false;
    };
    v.split(',').any(|item| {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        if !(coding.eq_ignore_ascii_case("gzip") || coding == "*") {
            return false;
        }
        parts.all(|p| {
            let p = p.trim();
            match p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                Some(q) => q.trim().parse::<f32>().is_ok_and(|q| q > 0.0),
                None => true,
            }
        })
    })
}

/// A streaming gzip encoder for one response.
pub(crate) struct Encoder(GzEncoder<Vec<u8>>);

impl Encoder {
    /// Compresses this piece; at eof finishes the stream. Hands out whatever compressed bytes are ready.
    pub(crate) fn filter(&mut self, chunk: &mut BodyChunk) {
        // Writing into a Vec cannot fail.
        let _ = self.0.write_all(&chunk.data);
        if chunk.eof {
            let _ = self.0.try_finish();
        }
        let out = std::mem::take(self.0.get_mut());
        chunk.data = Bytes::from(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_q_values() {
        assert!(accepts_gzip(b"gzip"));
        assert!(accepts_gzip(b"deflate, gzip;q=0.5"));
        assert!(accepts_gzip(b"*"));
        assert!(!accepts_gzip(b"gzip;q=0"));
        assert!(!accepts_gzip(b"br, deflate"));
        assert!(!accepts_gzip(b"identity"));
    }

    #[test]
    fn schema_defaults_and_errors() {
        let c = compile_conf(&json!({})).unwrap();
        assert_eq!(c.types.as_deref(), Some(&["text/html".to_owned()][..]));
        assert_eq!(
            (c.min_length, c.level, c.http10_ok, c.vary),
            (20, 1, false, false)
        );
        assert!(compile_conf(&json!({"types": "*"}))
            .unwrap()
            .types
            .is_none());
        assert!(
            compile_conf(&json!({"http_version": 1.0}))
                .unwrap()
                .http10_ok
        );
        assert!(compile_conf(&json!({"comp_level": 10})).is_err());
        assert!(compile_conf(&json!({"min_length": 0})).is_err());
        assert!(compile_conf(&json!({"types": "text/html"})).is_err());
        assert!(compile_conf(&json!({"types": []})).is_err());
        assert!(compile_conf(&json!({"http_version": 2})).is_err());
    }

    #[test]
    fn encoder_round_trip() {
        use std::io::Read;
        let mut e = Encoder(GzEncoder::new(Vec::new(), Compression::new(1)));
        let mut out = Vec::new();
        for (piece, eof) in [("hello ", false), ("world", false), ("", true)] {
            let mut c = BodyChunk {
                data: Bytes::from(piece),
                eof,
            };
            e.filter(&mut c);
            out.extend_from_slice(&c.data);
        }
        let mut s = String::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "hello world");
    }
}
