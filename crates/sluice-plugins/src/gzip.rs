//! gzip (priority 995): compresses responses as APISIX does with nginx's gzip filter. The plugin's header_filter
//! makes APISIX's checks (`types`, `min_length` against Content-Length, `http_version`, then `vary`); the output
//! stage in [`crate::filters`] makes nginx's on the final head (status 200/403/404, not already encoded, not HEAD,
//! Accept-Encoding allows gzip) and compresses after every plugin's body_filter, so a body response-rewrite
//! replaced is the one compressed. `buffers` is accepted and ignored: the encoder streams into a growing buffer
//! and hands out whatever it produced per piece. Deflate state (~300 KiB) is reused from a small per-thread pool,
//! reset between responses: allocating it fresh cost ~20x the compression of a 1 KiB page. Not here: other
//! encodings (brotli is APISIX's `brotli` plugin).

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use flate2::{Compress, Compression, Crc, FlushCompress, Status};
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
    secrets: sluice_secrets::SecretFields::NONE,
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
    Some(Encoder::new(conf.level))
}

/// Whether an Accept-Encoding value lists gzip (or `*`) with a non-zero q.
fn accepts_gzip(v: &[u8]) -> bool {
    accepts_coding(v, "gzip")
}

/// Whether an Accept-Encoding value lists `coding` (or `*`) with a non-zero q (gzip and brotli share it).
pub(crate) fn accepts_coding(v: &[u8], wanted: &str) -> bool {
    let Ok(v) = std::str::from_utf8(v) else {
        return false;
    };
    v.split(',').any(|item| {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        if !(coding.eq_ignore_ascii_case(wanted) || coding == "*") {
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

/// gzip's member header (RFC 1952): deflate, no name or time, OS "Unix" as nginx writes it.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3];

/// Compressors kept per worker thread: enough for the responses one thread compresses at once in practice, and
/// a bound on the memory they hold.
const POOL_MAX: usize = 8;

thread_local! {
    static POOL: RefCell<Vec<(u32, Compress)>> = const { RefCell::new(Vec::new()) };
}

fn take_compressor(level: u32) -> Compress {
    let pooled = POOL
        .try_with(|p| {
            let mut p = p.try_borrow_mut().ok()?;
            let i = p.iter().position(|(l, _)| *l == level)?;
            Some(p.swap_remove(i).1)
        })
        .ok()
        .flatten();
    pooled.unwrap_or_else(|| Compress::new(Compression::new(level), false))
}

fn return_compressor(level: u32, mut c: Compress) {
    c.reset();
    let _ = POOL.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            if p.len() < POOL_MAX {
                p.push((level, c));
            }
        }
    });
}

/// A streaming gzip encoder for one response: raw deflate from the pool, framed with gzip's header and trailer.
pub(crate) struct Encoder {
    deflate: Option<Compress>,
    level: u32,
    crc: Crc,
    started: bool,
}

impl Encoder {
    fn new(level: u32) -> Self {
        Encoder {
            deflate: Some(take_compressor(level)),
            level,
            crc: Crc::new(),
            started: false,
        }
    }

    /// Compresses this piece; at eof finishes the stream. Hands out whatever compressed bytes are ready.
    pub(crate) fn filter(&mut self, chunk: &mut BodyChunk) {
        let Some(c) = self.deflate.as_mut() else {
            return;
        };
        let mut out = Vec::with_capacity(chunk.data.len() / 2 + 64);
        if !self.started {
            self.started = true;
            out.extend_from_slice(&GZIP_HEADER);
        }
        self.crc.update(&chunk.data);
        let flush = if chunk.eof {
            FlushCompress::Finish
        } else {
            FlushCompress::None
        };
        deflate(c, &chunk.data, &mut out, flush);
        if chunk.eof {
            out.extend_from_slice(&self.crc.sum().to_le_bytes());
            out.extend_from_slice(&self.crc.amount().to_le_bytes());
            if let Some(c) = self.deflate.take() {
                return_compressor(self.level, c);
            }
        }
        chunk.data = Bytes::from(out);
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        if let Some(c) = self.deflate.take() {
            return_compressor(self.level, c);
        }
    }
}

/// Feeds `input` to the compressor, growing `out` as needed; with `Finish`, until the stream ends.
fn deflate(c: &mut Compress, mut input: &[u8], out: &mut Vec<u8>, flush: FlushCompress) {
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(4096.max(input.len() / 2));
        }
        let (in0, out0) = (c.total_in(), c.total_out());
        let status = c.compress_vec(input, out, flush);
        let used = (c.total_in() - in0) as usize;
        input = input.get(used..).unwrap_or_default();
        let room_left = out.len() < out.capacity();
        match status {
            Ok(Status::StreamEnd) | Err(_) => return,
            Ok(_) if flush == FlushCompress::None && input.is_empty() && room_left => return,
            // No progress with room to spare: nothing more will come out.
            Ok(_) if used == 0 && c.total_out() == out0 && room_left => return,
            Ok(_) => {}
        }
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
        let mut e = Encoder::new(1);
        let mut out = Vec::new();
        let big = "0123456789abcdef".repeat(20_000);
        for (piece, eof) in [
            ("hello ", false),
            ("world", false),
            (big.as_str(), false),
            ("", true),
        ] {
            let mut c = BodyChunk {
                data: Bytes::copy_from_slice(piece.as_bytes()),
                eof,
            };
            e.filter(&mut c);
            out.extend_from_slice(&c.data);
        }
        let mut s = String::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, format!("hello world{big}"));
        // The compressor went back to the pool reset: a second stream from it is valid on its own.
        let mut e = Encoder::new(1);
        let mut c = BodyChunk {
            data: Bytes::from("again"),
            eof: true,
        };
        e.filter(&mut c);
        let mut s = String::new();
        flate2::read::GzDecoder::new(&c.data[..])
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "again");
    }
}
