//! The fastjson wire of APISIX's `http-dubbo` (Dubbo serialization id 6, as Dubbo 2.7's fastjson and the
//! `dubbo-serialization-fastjson` 1.0.x extension write it): the Dubbo2 frame header, then one JSON text per
//! line. A request is the Dubbo version, the service, its version, the method, the JVM descriptor of the parameter
//! types, one line per argument and the attachments object; a response is its type (`0`..`5`, as hessian2's),
//! then the value or the exception, then (types 3 to 5) the attachments.

use serde_json::Value as Json;

use crate::protocol::{
    Header, ProtocolError, Status, DUBBO_VERSION, FLAG_REQUEST, FLAG_TWO_WAY, HEADER_LEN,
};

/// Dubbo's serialization id of fastjson.
pub const SERIALIZATION_FASTJSON: u8 = 6;

/// What a fastjson call sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    pub service: &'a str,
    pub version: &'a str,
    pub method: &'a str,
    /// The JVM descriptor of the parameter types (`Ljava/lang/String;I`), empty for none.
    pub params_type_desc: &'a str,
    /// The arguments, each one JSON text ending in `\n`.
    pub args: &'a [u8],
}

/// Appends a two-way request frame; fails (appending nothing) when the body exceeds `max_payload`.
pub fn encode_request(
    call: &Call<'_>,
    id: u64,
    max_payload: usize,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    let start = out.len();
    out.resize(start + HEADER_LEN, 0);
    for s in [
        DUBBO_VERSION,
        call.service,
        call.version,
        call.method,
        call.params_type_desc,
    ] {
        // A JSON string: always valid to write.
        serde_json::to_writer(&mut *out, s).unwrap_or_default();
        out.push(b'\n');
    }
    out.extend_from_slice(call.args);
    out.extend_from_slice(b"{}\n");
    let len = out.len() - start - HEADER_LEN;
    if len > max_payload || len > u32::MAX as usize {
        out.truncate(start);
        return Err(ProtocolError::TooLarge {
            len,
            max: max_payload,
        });
    }
    let h = Header {
        flags: FLAG_REQUEST | FLAG_TWO_WAY | SERIALIZATION_FASTJSON,
        status: Status(0),
        id,
        body_len: len as u32,
    };
    out[start..start + HEADER_LEN].copy_from_slice(&h.to_bytes());
    Ok(())
}

/// APISIX's non-serialized body: a JSON array (or object) whose items are the arguments, in order (an object's
/// in its key order). Returns the argument lines.
pub fn args_from_body(body: &[u8]) -> Result<Vec<u8>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let json: Json = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let items: Vec<&Json> = match &json {
        Json::Array(a) => a.iter().collect(),
        Json::Object(o) => o.values().collect(),
        _ => return Err("the body must be a JSON array of the arguments".into()),
    };
    let mut out = Vec::with_capacity(body.len() + items.len());
    for v in items {
        serde_json::to_writer(&mut out, v).map_err(|e| e.to_string())?;
        out.push(b'\n');
    }
    Ok(out)
}

/// APISIX's serialized body: the argument lines as they are, a final newline added when missing.
pub fn args_serialized(body: &[u8]) -> Vec<u8> {
    let mut out = body.to_vec();
    if !out.is_empty() && out.last() != Some(&b'\n') {
        out.push(b'\n');
    }
    out
}

/// A fastjson response's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The value's JSON text.
    Value(Vec<u8>),
    Null,
    /// The exception's class (fastjson's `@type`) and message, when the provider sent them.
    Exception {
        class: Option<String>,
        message: Option<String>,
    },
}

/// Reads the body of an OK response.
pub fn decode_response(body: &[u8]) -> Result<Answer, String> {
    let mut lines = body.split(|&b| b == b'\n');
    let kind = lines.next().unwrap_or_default();
    let value = lines.next().unwrap_or_default();
    match kind {
        b"1" | b"4" => Ok(Answer::Value(value.to_vec())),
        b"2" | b"5" => Ok(Answer::Null),
        b"0" | b"3" => {
            let e: Json = serde_json::from_slice(value).unwrap_or(Json::Null);
            let text = |k: &str| e.get(k).and_then(Json::as_str).map(str::to_owned);
            Ok(Answer::Exception {
                class: text("@type"),
                message: text("message"),
            })
        }
        other => Err(format!(
            "unknown fastjson response type {:?}",
            String::from_utf8_lossy(&other[..other.len().min(16)])
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_frame_is_apisix_s() {
        let mut out = Vec::new();
        let args = args_from_body(br#"["tc", 2]"#).unwrap();
        let call = Call {
            service: "a.B",
            version: "1.0.0",
            method: "greet",
            params_type_desc: "Ljava/lang/String;I",
            args: &args,
        };
        encode_request(&call, 7, 1 << 20, &mut out).unwrap();
        assert_eq!(&out[..4], b"\xda\xbb\xc6\x00");
        assert_eq!(&out[4..12], &7u64.to_be_bytes());
        let body = &out[16..];
        assert_eq!(
            u32::from_be_bytes(out[12..16].try_into().unwrap()) as usize,
            body.len()
        );
        assert_eq!(
            body,
            b"\"2.0.2\"\n\"a.B\"\n\"1.0.0\"\n\"greet\"\n\"Ljava/lang/String;I\"\n\"tc\"\n2\n{}\n"
        );
    }

    #[test]
    fn a_name_cannot_break_out_of_its_line() {
        let mut out = Vec::new();
        let call = Call {
            service: "a\n\"x",
            version: "1.0.0",
            method: "m",
            params_type_desc: "",
            args: b"",
        };
        encode_request(&call, 1, 1 << 20, &mut out).unwrap();
        assert_eq!(out[16..].split(|&b| b == b'\n').count(), 7);
    }

    #[test]
    fn bodies_and_answers() {
        assert_eq!(args_from_body(b"").unwrap(), b"");
        assert_eq!(
            args_from_body(b"[\"a\\nb\", null, {\"k\": 1}]").unwrap(),
            b"\"a\\nb\"\nnull\n{\"k\":1}\n"
        );
        assert!(args_from_body(b"[1,").is_err());
        assert!(args_from_body(b"1").is_err());
        assert_eq!(args_serialized(b"1\n2"), b"1\n2\n");
        assert_eq!(
            decode_response(b"4\n42\n{}\n").unwrap(),
            Answer::Value(b"42".to_vec())
        );
        assert_eq!(decode_response(b"5\n{}\n").unwrap(), Answer::Null);
        assert_eq!(
            decode_response(b"3\n{\"@type\":\"java.lang.X\",\"message\":\"m\"}\n{}\n").unwrap(),
            Answer::Exception {
                class: Some("java.lang.X".into()),
                message: Some("m".into())
            }
        );
        assert!(decode_response(b"9\n").is_err());
    }
}
