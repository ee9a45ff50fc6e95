//! grpc-web <-> gRPC, as APISIX's `grpc-web` plugin: request checks and CORS headers, `-text` base64 in both
//! directions, and the trailer frame (flag 0x80) appended to the response body.

use base64::Engine as _;

use crate::frame::{encode_frame_with_flag, Deframer, Frame, TRAILER_FLAG};

/// How a grpc-web body is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/grpc-web`, `application/grpc-web+proto`: frames as they are.
    Binary,
    /// `application/grpc-web-text`, `application/grpc-web-text+proto`: frames in base64.
    Text,
}

/// The content type sent to the upstream.
pub const UPSTREAM_CONTENT_TYPE: &str = "application/grpc";
/// APISIX's default `cors_allow_headers`.
pub const DEFAULT_CORS_ALLOW_HEADERS: &str = "content-type,x-grpc-web,x-user-agent";
/// APISIX's default `max_req_body_size` (64 MiB).
pub const DEFAULT_MAX_REQ_BODY_SIZE: usize = 64 * 1024 * 1024;

/// The encoding of a request `Content-Type`: exactly one of APISIX's four values (no parameters, as APISIX's
/// table lookup).
pub fn encoding_of(content_type: &str) -> Option<Encoding> {
    match content_type {
        "application/grpc-web" | "application/grpc-web+proto" => Some(Encoding::Binary),
        "application/grpc-web-text" | "application/grpc-web-text+proto" => Some(Encoding::Text),
        _ => None,
    }
}

/// What the plugin does with a request, before reading its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Proxy it: decode the body with [`decode_request_body`], send it as `application/grpc`.
    Proxy(Encoding),
    /// Answer with this status and no body: 204 for a CORS preflight (`OPTIONS`), 405 for a method other than
    /// POST, 400 for another content type. The response still gets [`cors_headers`].
    Respond(u16),
}

/// APISIX's access-phase checks.
pub fn admit(method: &str, content_type: Option<&str>) -> Admission {
    if method == "OPTIONS" {
        return Admission::Respond(204);
    }
    if method != "POST" {
        return Admission::Respond(405);
    }
    match content_type.and_then(encoding_of) {
        Some(e) => Admission::Proxy(e),
        None => Admission::Respond(400),
    }
}

/// The headers APISIX sets on every grpc-web response. `preflight`: the request was `OPTIONS`.
/// `origin_set_by_cors`: the `cors` plugin already chose `Access-Control-Allow-Origin`.
pub fn cors_headers(
    preflight: bool,
    cors_allow_headers: &str,
    origin_set_by_cors: bool,
) -> Vec<(&'static str, &str)> {
    let mut h = Vec::with_capacity(4);
    if preflight {
        h.push(("Access-Control-Allow-Methods", "POST"));
        h.push(("Access-Control-Allow-Headers", cors_allow_headers));
    }
    if !origin_set_by_cors {
        h.push(("Access-Control-Allow-Origin", "*"));
    }
    h.push(("Access-Control-Expose-Headers", "grpc-message,grpc-status"));
    h
}

/// The upstream path when the route captured the gRPC path in a trailing wildcard (`/grpc/web/*` with
/// `/grpc/web/pkg.Svc/Method` gives `/pkg.Svc/Method`). `None`: keep the request's path.
pub fn upstream_path(ext: &str) -> Option<String> {
    if ext.is_empty() {
        None
    } else if ext.starts_with('/') {
        Some(ext.to_owned())
    } else {
        Some(format!("/{ext}"))
    }
}

/// A grpc-web body that cannot be decoded: answer 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrpcWebError {
    #[error("grpc-web-text body is not valid base64")]
    Base64,
    #[error(transparent)]
    Frame(#[from] crate::frame::FrameError),
}

/// The gRPC body to send upstream. Text bodies may be several padded base64 chunks one after the other (the
/// grpc-web spec lets a client flush mid-stream); whitespace between chunks is ignored. APISIX's
/// `ngx.decode_base64` silently drops everything after the first `=`; Sluice decodes every chunk or refuses.
pub fn decode_request_body(encoding: Encoding, body: &[u8]) -> Result<Vec<u8>, GrpcWebError> {
    match encoding {
        Encoding::Binary => Ok(body.to_vec()),
        Encoding::Text => decode_text(body),
    }
}

fn decode_text(body: &[u8]) -> Result<Vec<u8>, GrpcWebError> {
    let engine = &base64::engine::general_purpose::STANDARD;
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 3);
    let mut chunk: Vec<u8> = Vec::with_capacity(body.len().min(64 * 1024));
    let flush = |chunk: &mut Vec<u8>, out: &mut Vec<u8>| -> Result<(), GrpcWebError> {
        if !chunk.is_empty() {
            if !chunk.len().is_multiple_of(4) {
                return Err(GrpcWebError::Base64);
            }
            engine
                .decode_vec(&chunk[..], out)
                .map_err(|_| GrpcWebError::Base64)?;
            chunk.clear();
        }
        Ok(())
    };
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        i += 1;
        if b.is_ascii_whitespace() {
            continue;
        }
        chunk.push(b);
        // A padded quad ends a chunk.
        if b == b'=' && chunk.len().is_multiple_of(4) {
            flush(&mut chunk, &mut out)?;
        } else if b == b'=' && chunk.len() % 4 == 3 {
            // "xx=" so far: the next '=' completes the quad.
            match body[i..].iter().position(|c| !c.is_ascii_whitespace()) {
                Some(p) if body[i + p] == b'=' => {
                    chunk.push(b'=');
                    i += p + 1;
                    flush(&mut chunk, &mut out)?;
                }
                _ => return Err(GrpcWebError::Base64),
            }
        }
    }
    flush(&mut chunk, &mut out)?;
    Ok(out)
}

/// Turns the upstream gRPC response body into the grpc-web body, chunk by chunk (no buffering: each chunk is
/// base64-encoded on its own for `-text`, as APISIX does and the spec allows).
#[derive(Debug, Clone, Copy)]
pub struct ResponseEncoder {
    pub encoding: Encoding,
}

impl ResponseEncoder {
    pub fn new(encoding: Encoding) -> Self {
        ResponseEncoder { encoding }
    }

    /// Appends the client's bytes for an upstream body chunk.
    pub fn chunk(&self, data: &[u8], out: &mut Vec<u8>) {
        match self.encoding {
            Encoding::Binary => out.extend_from_slice(data),
            Encoding::Text => {
                let start = out.len();
                let len = base64::encoded_len(data.len(), true).expect("chunk length fits usize");
                out.resize(start + len, 0);
                let n = base64::engine::general_purpose::STANDARD
                    .encode_slice(data, &mut out[start..])
                    .expect("buffer sized by encoded_len");
                debug_assert_eq!(n, len);
            }
        }
    }

    /// At the end of the body: appends the trailer frame built from the upstream trailers, unless the upstream
    /// sent a trailers-only response (`grpc-status` among the response headers), whose metadata the client
    /// already has. Without a `grpc-status` the trailer says `2` / "upstream grpc status not received".
    pub fn finish(
        &self,
        trailers_only: bool,
        grpc_status: Option<&[u8]>,
        grpc_message: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) {
        if trailers_only {
            return;
        }
        let frame = match grpc_status.filter(|s| !s.is_empty()) {
            Some(s) => trailer_frame(s, grpc_message.unwrap_or(b"")),
            None => trailer_frame(b"2", b"upstream grpc status not received"),
        };
        self.chunk(&frame, out);
    }
}

/// The grpc-web trailer frame: `0x80 | len:u32be | "grpc-status:{s}\r\ngrpc-message:{m}\r\n"`. Header values
/// are copied as received; CR and LF are dropped so an upstream cannot add trailer lines.
pub fn trailer_frame(grpc_status: &[u8], grpc_message: &[u8]) -> Vec<u8> {
    let mut block = Vec::with_capacity(32 + grpc_message.len());
    let clean = |v: &[u8], block: &mut Vec<u8>| {
        block.extend(v.iter().copied().filter(|&c| c != b'\r' && c != b'\n'));
    };
    block.extend_from_slice(b"grpc-status:");
    clean(grpc_status, &mut block);
    block.extend_from_slice(b"\r\ngrpc-message:");
    clean(grpc_message, &mut block);
    block.extend_from_slice(b"\r\n");
    let mut out = Vec::with_capacity(5 + block.len());
    encode_frame_with_flag(TRAILER_FLAG, &block, &mut out);
    out
}

/// A decoded grpc-web response body (the client's view): messages and trailer lines. For tests, tools and
/// fuzzing; the gateway itself only encodes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DecodedBody {
    pub messages: Vec<Vec<u8>>,
    pub trailers: Vec<(String, String)>,
}

pub fn decode_response_body(
    encoding: Encoding,
    body: &[u8],
    max_message: usize,
) -> Result<DecodedBody, GrpcWebError> {
    let raw = decode_request_body(encoding, body)?;
    let mut d = Deframer::grpc_web(max_message);
    d.push(&raw);
    let mut out = DecodedBody::default();
    while let Some(Frame { flag, payload }) = d.next_frame()? {
        if flag & TRAILER_FLAG == 0 {
            out.messages.push(payload.to_vec());
            continue;
        }
        for line in payload.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let text = String::from_utf8_lossy(line);
            let (k, v) = text.split_once(':').unwrap_or((&text, ""));
            out.trailers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    d.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_frame;
    use proptest::prelude::*;

    #[test]
    fn admission_as_apisix() {
        assert_eq!(admit("OPTIONS", None), Admission::Respond(204));
        assert_eq!(
            admit("GET", Some("application/grpc-web")),
            Admission::Respond(405)
        );
        assert_eq!(admit("POST", None), Admission::Respond(400));
        assert_eq!(
            admit("POST", Some("application/json")),
            Admission::Respond(400)
        );
        assert_eq!(
            admit("POST", Some("application/grpc-web; charset=x")),
            Admission::Respond(400)
        );
        assert_eq!(
            admit("POST", Some("application/grpc-web")),
            Admission::Proxy(Encoding::Binary)
        );
        assert_eq!(
            admit("POST", Some("application/grpc-web+proto")),
            Admission::Proxy(Encoding::Binary)
        );
        assert_eq!(
            admit("POST", Some("application/grpc-web-text")),
            Admission::Proxy(Encoding::Text)
        );
        assert_eq!(
            admit("POST", Some("application/grpc-web-text+proto")),
            Admission::Proxy(Encoding::Text)
        );
    }

    #[test]
    fn cors_headers_as_apisix() {
        assert_eq!(
            cors_headers(true, DEFAULT_CORS_ALLOW_HEADERS, false),
            vec![
                ("Access-Control-Allow-Methods", "POST"),
                (
                    "Access-Control-Allow-Headers",
                    "content-type,x-grpc-web,x-user-agent"
                ),
                ("Access-Control-Allow-Origin", "*"),
                ("Access-Control-Expose-Headers", "grpc-message,grpc-status"),
            ]
        );
        assert_eq!(
            cors_headers(false, "x", true),
            vec![("Access-Control-Expose-Headers", "grpc-message,grpc-status")]
        );
        assert_eq!(upstream_path("a.B/C").as_deref(), Some("/a.B/C"));
        assert_eq!(upstream_path("/a.B/C").as_deref(), Some("/a.B/C"));
        assert_eq!(upstream_path(""), None);
    }

    #[test]
    fn text_request_bodies() {
        assert_eq!(
            decode_request_body(Encoding::Text, b"AAAAAAJoaQ==").unwrap(),
            b"\0\0\0\0\x02hi"
        );
        // Two padded chunks one after the other, with a line break.
        assert_eq!(
            decode_request_body(Encoding::Text, b"aGk=\r\naGk=").unwrap(),
            b"hihi"
        );
        assert_eq!(
            decode_request_body(Encoding::Text, b"YQ==YQ==").unwrap(),
            b"aa"
        );
        for bad in [&b"aGk"[..], b"a===", b"!!!!", b"aGk=x", b"Y=Q="] {
            assert_eq!(
                decode_request_body(Encoding::Text, bad),
                Err(GrpcWebError::Base64),
                "{bad:?}"
            );
        }
        assert_eq!(
            decode_request_body(Encoding::Binary, b"\xff").unwrap(),
            b"\xff"
        );
    }

    #[test]
    fn trailer_frame_format() {
        assert_eq!(
            trailer_frame(b"0", b"OK"),
            b"\x80\x00\x00\x00\x20grpc-status:0\r\ngrpc-message:OK\r\n"
        );
        // An upstream cannot smuggle a trailer line.
        let f = trailer_frame(b"0", b"x\r\ngrpc-status:16");
        assert!(!f[5..].windows(2).any(|w| w == b"\n\n"));
        assert_eq!(f.iter().filter(|&&b| b == b'\n').count(), 2);
    }

    #[test]
    fn response_encoding_and_trailers() {
        let mut msg = Vec::new();
        encode_frame(b"hello", &mut msg);
        for enc in [Encoding::Binary, Encoding::Text] {
            let e = ResponseEncoder::new(enc);
            let mut out = Vec::new();
            e.chunk(&msg[..3], &mut out);
            e.chunk(&msg[3..], &mut out);
            e.finish(false, Some(b"0"), None, &mut out);
            let d = decode_response_body(enc, &out, 1024).unwrap();
            assert_eq!(d.messages, vec![b"hello".to_vec()]);
            assert_eq!(
                d.trailers,
                vec![
                    ("grpc-status".into(), "0".into()),
                    ("grpc-message".into(), "".into())
                ]
            );
            let mut out = Vec::new();
            e.finish(false, None, None, &mut out);
            let d = decode_response_body(enc, &out, 1024).unwrap();
            assert_eq!(d.trailers[0], ("grpc-status".into(), "2".into()));
            assert_eq!(d.trailers[1].1, "upstream grpc status not received");
            let mut out = Vec::new();
            e.finish(true, Some(b"5"), None, &mut out);
            assert!(out.is_empty());
        }
    }

    proptest! {
        #[test]
        fn text_round_trip(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..50), 0..6)) {
            let e = ResponseEncoder::new(Encoding::Text);
            let mut out = Vec::new();
            let mut all = Vec::new();
            for c in &chunks {
                e.chunk(c, &mut out);
                all.extend_from_slice(c);
            }
            prop_assert_eq!(decode_request_body(Encoding::Text, &out).unwrap(), all);
        }
    }
}
