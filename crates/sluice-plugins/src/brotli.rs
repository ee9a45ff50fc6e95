//! brotli (priority 996, header_filter + body_filter), as APISIX's: compresses a response with brotli (the
//! `brotli` crate, a port of Google's encoder) when the client accepts `br` (Accept-Encoding parsed with q-values,
//! shared with gzip), the response has no Content-Encoding, a Content-Type in `types` (default `text/html`; `"*"`:
//! any), a Content-Length not below `min_length` (none: no check) and the request's HTTP version is at least
//! `http_version`. Then `vary` adds `Vary: Accept-Encoding`, Content-Length goes, `Content-Encoding: br` is set and
//! a strong ETag turns weak (an unquoted one is dropped). Each body piece is compressed and flushed, so a
//! streamed answer stays streamed; the stream is finished at eof. `comp_level` (quality 0-11), `mode` (generic,
//! text, font), `lgwin` and `lgblock` are the encoder's parameters.

use std::io::Write;
use std::sync::Arc;

use ::brotli::enc::backward_references::BrotliEncoderMode;
use ::brotli::enc::BrotliEncoderParams;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::filters::BodyChunk;
use crate::registry::Entry;
use crate::{CompileEnv, Ctx, Phase, PhaseMask, Plugin};

pub const NAME: &str = "brotli";
pub const PRIORITY: i32 = 996;

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
            "mode": {"type": "integer", "minimum": 0, "maximum": 2, "default": 0},
            "comp_level": {"type": "integer", "minimum": 0, "maximum": 11, "default": 6},
            "lgwin": {"type": "integer", "default": 19,
                      "enum": [0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]},
            "lgblock": {"type": "integer", "default": 0,
                        "enum": [0, 16, 17, 18, 19, 20, 21, 22, 23, 24]},
            "http_version": {"enum": [1.1, 1.0], "default": 1.1},
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
    #[serde(default)]
    mode: u8,
    #[serde(default = "default_comp_level")]
    comp_level: i32,
    #[serde(default = "default_lgwin")]
    lgwin: i32,
    #[serde(default)]
    lgblock: i32,
    #[serde(default)]
    http_version: Option<f64>,
    #[serde(default)]
    vary: bool,
}

fn default_min_length() -> u64 {
    20
}
fn default_comp_level() -> i32 {
    6
}
fn default_lgwin() -> i32 {
    19
}

struct Brotli {
    /// `None`: `"*"`, every type.
    types: Option<Vec<String>>,
    min_length: u64,
    http10_ok: bool,
    vary: bool,
    params: BrotliEncoderParams,
}

fn compile_conf(v: &Value) -> Result<Brotli, String> {
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
    let params = BrotliEncoderParams {
        quality: c.comp_level,
        // The encoder's own floor: ngx_brotli and the C library treat a smaller window as 10.
        lgwin: c.lgwin.max(10),
        lgblock: c.lgblock,
        mode: match c.mode {
            1 => BrotliEncoderMode::BROTLI_MODE_TEXT,
            2 => BrotliEncoderMode::BROTLI_MODE_FONT,
            _ => BrotliEncoderMode::BROTLI_MODE_GENERIC,
        },
        ..BrotliEncoderParams::default()
    };
    Ok(Brotli {
        types,
        min_length: c.min_length,
        http10_ok: c.http_version.is_some_and(|v| v < 1.05),
        vary: c.vary,
        params,
    })
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v).map(drop)
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(compile_conf(v)?))
}

/// The smallest window (10..=24 bits) that holds `len` bytes.
fn window_bits(len: u64) -> i32 {
    let bits = 64 - len.saturating_sub(1).leading_zeros() as i32;
    bits.clamp(10, 24)
}

/// The response's encoder, created when header_filter decides to compress.
#[derive(Default)]
struct State(Option<::brotli::CompressorWriter<Vec<u8>>>);

impl Brotli {
    fn key(&self) -> *const () {
        self as *const Self as *const ()
    }
}

impl Plugin for Brotli {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::HeaderFilter, Phase::BodyFilter])
    }
    fn header_filter(&self, ctx: &mut Ctx<'_>, status: u16) {
        if !ctx
            .req
            .head
            .header("accept-encoding")
            .is_some_and(|v| crate::gzip::accepts_coding(v, "br"))
        {
            return;
        }
        // No body to compress (APISIX would still emit an empty brotli stream on these).
        if ctx.req.head.method_str() == "HEAD" || matches!(status, 204 | 304) {
            return;
        }
        if ctx.response_header("content-encoding").is_some() {
            return;
        }
        let Some(ct) = ctx.response_header("content-type") else {
            return;
        };
        if let Some(types) = &self.types {
            let ct = ct.split(|&b| b == b';').next().unwrap_or_default();
            if !types.iter().any(|t| t.as_bytes() == ct) {
                return;
            }
        }
        let len = ctx
            .response_header("content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        if len.is_some_and(|n| n < self.min_length) {
            return;
        }
        if ctx.req.head.version == sluice_http::Version::Http10 && !self.http10_ok {
            return;
        }
        if self.vary {
            ctx.resp.add_headers.push((
                Bytes::from_static(b"Vary"),
                Bytes::from_static(b"Accept-Encoding"),
            ));
        }
        let etag = ctx.response_header("etag").map(<[u8]>::to_vec);
        let e = &mut ctx.resp;
        e.body_modified = true;
        e.remove("content-length");
        e.set(
            Bytes::from_static(b"Content-Encoding"),
            Bytes::from_static(b"br"),
        );
        if let Some(tag) = etag {
            let quoted = |t: &[u8]| t.len() >= 2 && t[0] == b'"' && t[t.len() - 1] == b'"';
            if tag.starts_with(b"W/") && quoted(&tag[2..]) {
                // Already weak.
            } else if quoted(&tag) {
                let mut w = b"W/".to_vec();
                w.extend_from_slice(&tag);
                e.set(Bytes::from_static(b"ETag"), Bytes::from(w));
            } else {
                e.remove("etag");
            }
        }
        let writer = match len {
            // A window past the answer's size buys nothing, and the encoder allocates and clears hash tables
            // sized by it: the default lgwin 19 cost ~2.2M instructions per 1 KiB answer, a 16-bit window ~0.24M.
            Some(len) => {
                let mut p = self.params.clone();
                p.lgwin = p.lgwin.min(window_bits(len));
                p.size_hint = usize::try_from(len).unwrap_or(usize::MAX);
                ::brotli::CompressorWriter::with_params(Vec::new(), 4096, &p)
            }
            None => ::brotli::CompressorWriter::with_params(Vec::new(), 4096, &self.params),
        };
        ctx.body_state::<State>(self.key()).0 = Some(writer);
    }
    fn body_filter(&self, ctx: &mut Ctx<'_>, chunk: &mut BodyChunk) {
        let state = ctx.body_state::<State>(self.key());
        let Some(w) = state.0.as_mut() else {
            return;
        };
        // Writes into a Vec cannot fail.
        if !chunk.data.is_empty() {
            let _ = w.write_all(&chunk.data);
            let _ = w.flush();
        }
        let out = if chunk.eof {
            state.0.take().map(|w| w.into_inner()).unwrap_or_default()
        } else {
            std::mem::take(w.get_mut())
        };
        chunk.data = Bytes::from(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_defaults_and_errors() {
        let c = compile_conf(&json!({})).unwrap();
        assert_eq!(c.types.as_deref(), Some(&["text/html".to_owned()][..]));
        assert_eq!((c.min_length, c.http10_ok, c.vary), (20, false, false));
        assert_eq!(
            (c.params.quality, c.params.lgwin, c.params.lgblock),
            (6, 19, 0)
        );
        assert!(compile_conf(&json!({"types": "*"}))
            .unwrap()
            .types
            .is_none());
        for bad in [
            json!({"comp_level": 12}),
            json!({"comp_level": -1}),
            json!({"mode": 3}),
            json!({"lgwin": 9}),
            json!({"lgblock": 15}),
            json!({"min_length": 0}),
            json!({"types": []}),
            json!({"types": "text/html"}),
            json!({"http_version": 2}),
            json!({"vary": "yes"}),
        ] {
            assert!(check(&bad).is_err(), "{bad}");
        }
        assert!(check(&json!({"lgwin": 0, "lgblock": 16, "mode": 1, "comp_level": 0})).is_ok());
    }

    #[test]
    fn window_fits_the_answer() {
        assert_eq!(window_bits(0), 10);
        assert_eq!(window_bits(1024), 10);
        assert_eq!(window_bits(1025), 11);
        assert_eq!(window_bits(65_536), 16);
        assert_eq!(window_bits(65_537), 17);
        assert_eq!(window_bits(u64::MAX), 24);
    }

    #[test]
    fn streamed_pieces_decode_to_the_body() {
        let c = compile_conf(&json!({"comp_level": 11, "mode": 1})).unwrap();
        let mut w = ::brotli::CompressorWriter::with_params(Vec::new(), 4096, &c.params);
        let big = "brotli body ".repeat(10_000);
        let mut out = Vec::new();
        for piece in ["hello ", big.as_str()] {
            w.write_all(piece.as_bytes()).unwrap();
            w.flush().unwrap();
            out.extend(std::mem::take(w.get_mut()));
        }
        // After a flush, what was written so far decodes on its own (streaming).
        let mut partial = Vec::new();
        let mut d = ::brotli::Decompressor::new(&out[..], 4096);
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = std::io::Read::read(&mut d, &mut buf) {
            partial.extend_from_slice(&buf[..n]);
        }
        assert_eq!(partial.len(), 6 + big.len());
        out.extend(w.into_inner());
        let mut full = Vec::new();
        ::brotli::BrotliDecompress(&mut &out[..], &mut full).unwrap();
        assert_eq!(String::from_utf8(full).unwrap(), format!("hello {big}"));
    }
}
