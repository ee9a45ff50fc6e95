//! gRPC status: the `grpc-status` -> HTTP status table and the `show_status_in_body` error body, as APISIX.

use prost_reflect::{DynamicMessage, MessageDescriptor, Value};

use crate::options::PbOptions;
use crate::transcode::write_json;

/// The `grpc-*` metadata of a response, raw header values as received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrpcStatus<'a> {
    /// `grpc-status`.
    pub code: Option<&'a [u8]>,
    /// `grpc-message`, percent-encoded on the wire.
    pub message: Option<&'a [u8]>,
    /// `grpc-status-details-bin`: base64 (padded or not) of a `google.rpc.Status`.
    pub details_bin: Option<&'a [u8]>,
}

impl GrpcStatus<'_> {
    /// The numeric status; `None` if absent or not a number.
    pub fn code_number(&self) -> Option<u32> {
        std::str::from_utf8(self.code?).ok()?.parse().ok()
    }

    /// `grpc-message` percent-decoded (invalid UTF-8 replaced), empty if absent.
    pub fn message(&self) -> String {
        self.message
            .map(|m| {
                percent_encoding::percent_decode(m)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default()
    }
}

/// APISIX's `status_rel` (after Google's API design guide): `grpc-status` -> HTTP status. `0` is 200; a value
/// outside the table (or not a number: APISIX compares the header text) is 599.
pub fn http_status(grpc_status: &[u8]) -> u16 {
    match grpc_status {
        b"0" => 200,
        b"1" => 499,
        b"2" => 500,
        b"3" => 400,
        b"4" => 504,
        b"5" => 404,
        b"6" => 409,
        b"7" => 403,
        b"8" => 429,
        b"9" => 400,
        b"10" => 409,
        b"11" => 400,
        b"12" => 501,
        b"13" => 500,
        b"14" => 503,
        b"15" => 500,
        b"16" => 401,
        _ => 599,
    }
}

pub(crate) enum StatusBody {
    Json(Vec<u8>),
    /// APISIX's plain-text failure message, sent as the body.
    Failed(Vec<u8>),
}

fn failed(msg: &str) -> StatusBody {
    StatusBody::Failed(msg.as_bytes().to_vec())
}

/// `{"error":{"code":N,"details":[...],"message":"..."}}` from `grpc-status-details-bin`, as APISIX's
/// `handle_error_response`: without `status_detail_type` each detail is `{"type_url":..,"value":..}` with the
/// value's raw bytes in the JSON string (as lua-cjson writes a binary Lua string); with it, every detail value is
/// decoded as that message type. An empty `details` is `[]` (APISIX writes `{}` when a type is set: a bug).
pub(crate) fn error_body(
    details_bin: &[u8],
    detail_type: Option<&Result<MessageDescriptor, String>>,
    pb: PbOptions,
) -> StatusBody {
    let Some(raw) = std::str::from_utf8(details_bin)
        .ok()
        .and_then(|s| crate::fields::decode_base64_any(s.trim()))
    else {
        return failed("grpc-status-details-bin is not base64 format");
    };
    let status_desc = crate::proto::bundled_pool()
        .get_message_by_name("google.rpc.Status")
        .expect("bundled google.rpc.Status");
    let Ok(status) = DynamicMessage::decode(status_desc, raw.as_slice()) else {
        return failed("failed to call pb.decode to decode grpc-status-details-bin");
    };
    let code = status
        .get_field_by_name("code")
        .and_then(|v| v.as_i32())
        .unwrap_or(0);
    let message = status
        .get_field_by_name("message")
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let details = status.get_field_by_name("details");
    let details: &[Value] = details.as_deref().and_then(Value::as_list).unwrap_or(&[]);

    let mut out = Vec::with_capacity(64 + raw.len() * 2);
    out.extend_from_slice(b"{\"error\":{\"code\":");
    out.extend_from_slice(code.to_string().as_bytes());
    out.extend_from_slice(b",\"details\":[");
    for (i, d) in details.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let any = d.as_message().expect("details are messages");
        let value = any
            .get_field_by_name("value")
            .and_then(|v| v.as_bytes().cloned())
            .unwrap_or_default();
        match detail_type {
            None => {
                let type_url = any
                    .get_field_by_name("type_url")
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                out.extend_from_slice(b"{\"type_url\":");
                write_json_bytes(type_url.as_bytes(), &mut out);
                out.extend_from_slice(b",\"value\":");
                write_json_bytes(&value, &mut out);
                out.push(b'}');
            }
            Some(Ok(desc)) => match DynamicMessage::decode(desc.clone(), value) {
                Ok(m) => write_json(&m, pb, &mut out),
                Err(_) => {
                    return failed(
                        "failed to call pb.decode to decode details in grpc-status-details-bin",
                    )
                }
            },
            Some(Err(_)) => {
                return failed(
                    "failed to call pb.decode to decode details in grpc-status-details-bin",
                )
            }
        }
    }
    out.extend_from_slice(b"],\"message\":");
    write_json_bytes(message.as_bytes(), &mut out);
    out.extend_from_slice(b"}}");
    StatusBody::Json(out)
}

/// A JSON string of arbitrary bytes, escaped as lua-cjson does with APISIX's settings (forward slash not
/// escaped): `"` `\` and control characters escaped, every other byte copied, valid UTF-8 or not. serde_json
/// only writes `str`, and APISIX's body for a binary detail value is exactly this.
fn write_json_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 15) as usize]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table_is_apisix_status_rel() {
        let expect = [
            200, 499, 500, 400, 504, 404, 409, 403, 429, 400, 409, 400, 501, 500, 503, 500, 401,
        ];
        for (code, want) in expect.iter().enumerate() {
            assert_eq!(
                http_status(code.to_string().as_bytes()),
                *want,
                "grpc-status {code}"
            );
        }
        for other in [&b"17"[..], b"-1", b"", b" 1", b"01", b"abc"] {
            assert_eq!(http_status(other), 599);
        }
    }

    #[test]
    fn message_is_percent_decoded() {
        let s = GrpcStatus {
            code: Some(b"3"),
            message: Some(b"bad%20arg%3A%20%E2%9C%93"),
            details_bin: None,
        };
        assert_eq!(s.message(), "bad arg: \u{2713}");
        assert_eq!(s.code_number(), Some(3));
        assert_eq!(GrpcStatus::default().code_number(), None);
    }

    #[test]
    fn json_bytes_escaping() {
        let mut out = Vec::new();
        write_json_bytes(b"a\"\\/\x00\x1f\x08\n\xff", &mut out);
        assert_eq!(out, b"\"a\\\"\\\\/\\u0000\\u001f\\b\\n\xff\"");
    }

    #[test]
    fn bad_details_bin() {
        let body = |b: &[u8]| match error_body(b, None, PbOptions::default()) {
            StatusBody::Json(j) => j,
            StatusBody::Failed(f) => f,
        };
        assert_eq!(
            body(b"***"),
            b"grpc-status-details-bin is not base64 format"
        );
        // Valid base64 of bytes that are not a Status (field 1 declared as a 10-byte length-delimited).
        assert_eq!(
            body(b"Cgo"),
            b"failed to call pb.decode to decode grpc-status-details-bin"
        );
        assert_eq!(
            body(b""),
            br#"{"error":{"code":0,"details":[],"message":""}}"#
        );
    }
}
