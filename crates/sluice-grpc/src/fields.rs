//! Setting message fields from text (query args, form fields, path captures), and query-string splitting.

use std::borrow::Cow;

use base64::Engine as _;
use percent_encoding::percent_decode;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage, Value,
};
use serde::de::DeserializeSeed as _;

/// How `bytes` fields are read from text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BytesText {
    /// The text's bytes as they are (APISIX: query/form values go to lua-protobuf untouched).
    Raw,
    /// Base64, standard or URL-safe, padded or not (proto3 JSON, google.api.http query parameters).
    Base64,
}

/// Finds a field by proto name, then by JSON name.
pub(crate) fn find_field(desc: &MessageDescriptor, name: &str) -> Option<FieldDescriptor> {
    desc.get_field_by_name(name)
        .or_else(|| desc.get_field_by_json_name(name))
}

/// Sets the field at dotted `path` (`a.b.c`) of `msg` from `text`. A repeated field gets `text` appended.
/// `None` text is a bare query key (`?flag`): `true` for a bool field, the empty string otherwise.
/// Returns `Ok(false)` if the path names no field (callers ignore unknown arguments, as APISIX does).
/// Deepest dotted path accepted: a key like `next.next.next...` on a recursive message would otherwise recurse
/// once per dot of an attacker-sized query string.
pub(crate) const MAX_PATH_DEPTH: usize = 32;

pub(crate) fn set_path(
    msg: &mut DynamicMessage,
    path: &str,
    text: Option<&str>,
    bytes: BytesText,
) -> Result<bool, String> {
    if path.bytes().filter(|&b| b == b'.').count() >= MAX_PATH_DEPTH {
        return Err(format!(
            "field path \"{}...\" is deeper than {MAX_PATH_DEPTH} levels",
            &path[..path.len().min(64)]
        ));
    }
    set_path_in(msg, path, path, text, bytes)
}

fn set_path_in(
    msg: &mut DynamicMessage,
    full: &str,
    path: &str,
    text: Option<&str>,
    bytes: BytesText,
) -> Result<bool, String> {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let Some(field) = find_field(&msg.descriptor(), head) else {
        return Ok(false);
    };
    match rest {
        Some(rest) => {
            let Kind::Message(_) = field.kind() else {
                return Ok(false);
            };
            if field.is_list() || field.is_map() {
                return Err(format!(
                    "field \"{head}\" is repeated: its members cannot be set by path \"{full}\""
                ));
            }
            let sub = msg
                .get_field_mut(&field)
                .as_message_mut()
                .expect("message kind holds a message");
            set_path_in(sub, full, rest, text, bytes)
        }
        None => {
            if field.is_map() {
                return Err(format!(
                    "map field \"{full}\" cannot be set from a query or path parameter"
                ));
            }
            let value = parse_value(&field.kind(), text, bytes)
                .map_err(|e| format!("invalid value for field \"{full}\": {e}"))?;
            if field.is_list() {
                msg.get_field_mut(&field)
                    .as_list_mut()
                    .expect("list field holds a list")
                    .push(value);
            } else {
                msg.set_field(&field, value);
            }
            Ok(true)
        }
    }
}

fn parse_value(kind: &Kind, text: Option<&str>, bytes: BytesText) -> Result<Value, String> {
    let s = text.unwrap_or("");
    fn num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
        s.trim()
            .parse::<T>()
            .map_err(|_| format!("\"{s}\" is not a valid number"))
    }
    Ok(match kind {
        Kind::Bool => match text {
            None | Some("true") | Some("1") => Value::Bool(true),
            Some("false") | Some("0") => Value::Bool(false),
            Some(other) => return Err(format!("\"{other}\" is not a boolean")),
        },
        Kind::String => Value::String(s.to_owned()),
        Kind::Bytes => Value::Bytes(match bytes {
            BytesText::Raw => bytes::Bytes::copy_from_slice(s.as_bytes()),
            BytesText::Base64 => decode_base64_any(s)
                .ok_or_else(|| format!("\"{s}\" is not base64"))?
                .into(),
        }),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(num(s)?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(num(s)?),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(num(s)?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(num(s)?),
        Kind::Float => Value::F32(num(s)?),
        Kind::Double => Value::F64(num(s)?),
        Kind::Enum(e) => match e.get_value_by_name(s) {
            Some(v) => Value::EnumNumber(v.number()),
            None => {
                let n: i32 = s
                    .parse()
                    .map_err(|_| format!("\"{s}\" is not a value of enum {}", e.full_name()))?;
                Value::EnumNumber(n)
            }
        },
        Kind::Message(m) => {
            if is_wrapper(m.full_name()) {
                let inner = m.get_field_by_name("value").expect("wrapper has value");
                let v = parse_value(&inner.kind(), text, bytes)?;
                let mut msg = DynamicMessage::new(m.clone());
                msg.set_field(&inner, v);
                Value::Message(msg)
            } else {
                // Timestamp, Duration, FieldMask...: their proto3 JSON form is a string.
                let json = serde_json::Value::String(s.to_owned());
                let msg = m.clone().deserialize(json).map_err(|e| format!("{e}"))?;
                Value::Message(msg)
            }
        }
    })
}

fn is_wrapper(name: &str) -> bool {
    matches!(
        name,
        "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue"
    )
}

pub(crate) fn decode_base64_any(s: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    use base64::engine::DecodePaddingMode;
    const CFG: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STD: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, CFG);
    const URL: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, CFG);
    STD.decode(s).or_else(|_| URL.decode(s)).ok()
}

/// Splits a query string (or an `application/x-www-form-urlencoded` body) into decoded `(key, value)` pairs;
/// `+` is a space, as nginx's args decoding. A key without `=` has no value.
pub(crate) fn parse_query(query: &[u8]) -> Result<Vec<(String, Option<String>)>, String> {
    let mut out = Vec::new();
    for pair in query.split(|&b| b == b'&') {
        if pair.is_empty() {
            continue;
        }
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], Some(&pair[i + 1..])),
            None => (pair, None),
        };
        let key = decode_component(k)?;
        if key.is_empty() {
            continue;
        }
        let value = v.map(decode_component).transpose()?;
        out.push((key, value));
    }
    Ok(out)
}

fn decode_component(raw: &[u8]) -> Result<String, String> {
    let plus: Cow<[u8]> = if raw.contains(&b'+') {
        Cow::Owned(
            raw.iter()
                .map(|&b| if b == b'+' { b' ' } else { b })
                .collect(),
        )
    } else {
        Cow::Borrowed(raw)
    };
    let decoded: Cow<[u8]> = percent_decode(&plus).into();
    String::from_utf8(decoded.into_owned())
        .map_err(|_| "query argument is not valid UTF-8 after percent-decoding".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_splitting() {
        let q = parse_query(b"a=1&b=x+y%2Fz&&flag&=skip&c=").unwrap();
        assert_eq!(
            q,
            vec![
                ("a".into(), Some("1".into())),
                ("b".into(), Some("x y/z".into())),
                ("flag".into(), None),
                ("c".into(), Some("".into())),
            ]
        );
        assert!(parse_query(b"a=%ff").is_err());
    }

    #[test]
    fn base64_variants() {
        assert_eq!(decode_base64_any("aGk").unwrap(), b"hi");
        assert_eq!(decode_base64_any("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64_any("-_8").unwrap(), vec![0xfb, 0xff]);
        assert!(decode_base64_any("!!").is_none());
    }
}
