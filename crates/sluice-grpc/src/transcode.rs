//! APISIX `grpc-transcode`: one route = one RPC. HTTP request -> one gRPC frame; gRPC response -> JSON.

use prost::Message as _;
use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, MethodDescriptor,
    ReflectMessage, Value,
};

use crate::fields::{parse_query, set_path, BytesText};
use crate::frame::{Deframer, PREFIX_LEN};
use crate::options::PbOptions;
use crate::proto::{LookupError, ProtoSet};
use crate::status::{error_body, http_status, GrpcStatus, StatusBody};

/// APISIX's default `max_resp_body_size` (64 MiB).
pub const DEFAULT_MAX_RESP_BODY_SIZE: usize = 64 * 1024 * 1024;

/// A route's `grpc-transcode` settings besides `proto_id`/`service`/`method`.
#[derive(Debug, Clone)]
pub struct TranscodeConfig {
    pub pb_options: PbOptions,
    /// `deadline` in milliseconds; 0 sends no `grpc-timeout`.
    pub deadline_ms: f64,
    pub show_status_in_body: bool,
    pub status_detail_type: Option<String>,
    pub max_resp_body_size: usize,
}

impl Default for TranscodeConfig {
    fn default() -> Self {
        TranscodeConfig {
            pb_options: PbOptions::default(),
            deadline_ms: 0.0,
            show_status_in_body: false,
            status_detail_type: None,
            max_resp_body_size: DEFAULT_MAX_RESP_BODY_SIZE,
        }
    }
}

/// The parts of a client request the transcoder reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpRequest<'a> {
    /// `GET`, `POST`... (case-sensitive, as nginx reports it).
    pub method: &'a str,
    pub content_type: Option<&'a str>,
    /// The raw query string, without `?`.
    pub query: &'a [u8],
    pub body: &'a [u8],
    /// Route path parameters (`/users/:id` -> `("id", "42")`), already percent-decoded. A Sluice extension:
    /// each fills the field of the same name (dotted names reach nested fields) and wins over body and query.
    pub params: &'a [(&'a str, &'a str)],
}

/// A request that cannot be transcoded: answer 400 with this message (its `Display`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

impl RequestError {
    pub fn status(&self) -> u16 {
        400
    }
}

/// A route compiled for transcoding. Built at config time; `Send + Sync`, shared by all requests of the route.
#[derive(Debug, Clone)]
pub struct Transcoder {
    method: MethodDescriptor,
    path: String,
    grpc_timeout: Option<String>,
    pb: PbOptions,
    show_status_in_body: bool,
    /// `Err(name)` when `status_detail_type` names no message: APISIX only fails when a detail is decoded.
    detail_type: Option<Result<MessageDescriptor, String>>,
    max_resp_body_size: usize,
    response_body: Option<FieldDescriptor>,
}

impl Transcoder {
    /// Resolves `service`/`method` in the compiled proto.
    pub fn new(
        proto: &ProtoSet,
        service: &str,
        method: &str,
        config: &TranscodeConfig,
    ) -> Result<Self, LookupError> {
        Ok(Self::for_method(proto.method(service, method)?, config))
    }

    /// A transcoder for a method already looked up.
    pub fn for_method(m: MethodDescriptor, config: &TranscodeConfig) -> Self {
        let detail_type = config.status_detail_type.as_ref().map(|name| {
            m.parent_pool()
                .get_message_by_name(name)
                .ok_or_else(|| name.clone())
        });
        // APISIX: `dl .. "m"` with a Lua number; whole milliseconds are what gRPC's TimeoutValue allows.
        let grpc_timeout = (config.deadline_ms > 0.0)
            .then(|| format!("{}m", config.deadline_ms.ceil().min(99_999_999.0) as u64));
        Transcoder {
            path: format!("/{}/{}", m.parent_service().full_name(), m.name()),
            method: m,
            grpc_timeout,
            pb: config.pb_options,
            show_status_in_body: config.show_status_in_body,
            detail_type,
            max_resp_body_size: config.max_resp_body_size.max(1),
            response_body: None,
        }
    }

    /// google.api.http `response_body`: only this field of the response message is sent.
    pub(crate) fn with_response_body(mut self, field: Option<FieldDescriptor>) -> Self {
        self.response_body = field;
        self
    }

    pub fn method(&self) -> &MethodDescriptor {
        &self.method
    }

    /// The upstream request path: `/{package.Service}/{Method}` (sent with `POST`, `content-type:
    /// application/grpc`, `te: trailers`, and no query string).
    pub fn grpc_path(&self) -> &str {
        &self.path
    }

    /// `max_resp_body_size`: the most of a unary response body that is decoded.
    pub fn max_resp_body_size(&self) -> usize {
        self.max_resp_body_size
    }

    /// The `grpc-timeout` header value for the route's `deadline`, if any.
    pub fn grpc_timeout(&self) -> Option<&str> {
        self.grpc_timeout.as_deref()
    }

    /// Builds the request message as APISIX's `util.lua` does and appends its gRPC frame to `out`.
    ///
    /// Source of the fields, first match wins (no merging, as APISIX):
    /// 1. the JSON body, if the method is POST/PUT/PATCH, `Content-Type` contains `application/json` and the
    ///    body is not empty. Unlike APISIX, a body that is not a JSON object is a 400, not silently ignored;
    /// 2. for POST, the `application/x-www-form-urlencoded` body fields (other bodies give an empty message);
    /// 3. the query arguments.
    ///
    /// Then route `params` fill their fields. Unknown keys are ignored. Text values are converted per field
    /// type: integers and floats in decimal, bools `true|false|1|0`, enums by name or number, repeated fields
    /// from repeated keys, nested fields by dotted keys (`a.b=1`), bytes as given.
    pub fn encode_request(
        &self,
        req: &HttpRequest<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), RequestError> {
        let msg = self.build_request(req)?;
        encode_message(&msg, out);
        Ok(())
    }

    /// For a client-streaming method: a JSON array body is the stream, one frame per element (Envoy's mapping); any
    /// other request is a stream of the one message [`Transcoder::encode_request`] builds. Route `params` fill
    /// every message.
    pub fn encode_stream_request(
        &self,
        req: &HttpRequest<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), RequestError> {
        let json = req
            .content_type
            .is_some_and(|ct| ct.contains("application/json"))
            && matches!(req.method, "POST" | "PUT" | "PATCH");
        let trimmed = req.body.trim_ascii_start();
        if !json || !trimmed.starts_with(b"[") {
            return self.encode_request(req, out);
        }
        let items: Vec<&serde_json::value::RawValue> = serde_json::from_slice(trimmed)
            .map_err(|e| RequestError(format!("failed to encode request data to protobuf: {e}")))?;
        for item in items {
            let mut msg = json_to_message(self.method.input(), item.get().as_bytes())?;
            fill_params(&mut msg, req.params)?;
            encode_message(&msg, out);
        }
        Ok(())
    }

    fn build_request(&self, req: &HttpRequest<'_>) -> Result<DynamicMessage, RequestError> {
        let desc = self.method.input();
        let json = req
            .content_type
            .is_some_and(|ct| ct.contains("application/json"))
            && matches!(req.method, "POST" | "PUT" | "PATCH")
            && !req.body.is_empty();
        let mut msg = if json {
            json_to_message(desc, req.body)?
        } else {
            let mut msg = DynamicMessage::new(desc);
            let args: &[u8] = if req.method == "POST" {
                if req.content_type.is_some_and(is_form) {
                    req.body
                } else {
                    b""
                }
            } else {
                req.query
            };
            let pairs = parse_query(args).map_err(RequestError)?;
            for (k, v) in &pairs {
                set_path(&mut msg, k, v.as_deref(), BytesText::Raw).map_err(RequestError)?;
            }
            msg
        };
        fill_params(&mut msg, req.params)?;
        Ok(msg)
    }

    /// A buffer for the upstream response of a unary call.
    pub fn unary_response(&self) -> UnaryResponse<'_> {
        UnaryResponse {
            t: self,
            body: Vec::new(),
            truncated: false,
        }
    }

    /// An incremental transcoder for a server-streaming response.
    pub fn stream_response(&self, format: StreamFormat) -> StreamResponse {
        StreamResponse {
            desc: self.method.output(),
            pb: self.pb,
            format,
            deframer: Deframer::new(self.max_resp_body_size),
            count: 0,
            done: false,
        }
    }
}

fn is_form(ct: &str) -> bool {
    let mime = ct.split(';').next().unwrap_or("").trim();
    mime.eq_ignore_ascii_case("application/x-www-form-urlencoded")
}

pub(crate) fn fill_params(
    msg: &mut DynamicMessage,
    params: &[(&str, &str)],
) -> Result<(), RequestError> {
    for (k, v) in params {
        set_path(msg, k, Some(v), BytesText::Raw).map_err(RequestError)?;
    }
    Ok(())
}

/// Decodes a JSON request body. Unknown keys are ignored (APISIX reads only declared fields), but a value that
/// does not fit its field, including an enum name the enum lacks, is an error (lua-protobuf fails the encode;
/// prost-reflect would drop unknown enum names when unknown fields are allowed, hence the strict pass).
pub(crate) fn json_to_message(
    desc: MessageDescriptor,
    body: &[u8],
) -> Result<DynamicMessage, RequestError> {
    let strict = DeserializeOptions::new().deny_unknown_fields(true);
    let fail = |e: serde_json::Error| {
        RequestError(format!("failed to encode request data to protobuf: {e}"))
    };
    // Fast path: no unknown keys, decoded straight from the bytes.
    let mut de = serde_json::Deserializer::from_slice(body);
    if let Ok(msg) = DynamicMessage::deserialize_with_options(desc.clone(), &mut de, &strict)
        .and_then(|m| de.end().map(|_| m))
    {
        return Ok(msg);
    }
    let mut value: serde_json::Value = serde_json::from_slice(body).map_err(fail)?;
    prune_unknown(&desc, &mut value);
    DynamicMessage::deserialize_with_options(desc, value, &strict).map_err(fail)
}

/// Removes the keys no field of `desc` claims, recursively through message, repeated and map values. The
/// google.protobuf types have their own JSON forms (Struct, Any, wrappers...) and are left alone.
fn prune_unknown(desc: &MessageDescriptor, value: &mut serde_json::Value) {
    if desc.full_name().starts_with("google.protobuf.") {
        return;
    }
    let serde_json::Value::Object(map) = value else {
        return;
    };
    map.retain(|k, _| crate::fields::find_field(desc, k).is_some());
    for (k, v) in map.iter_mut() {
        let field = crate::fields::find_field(desc, k).expect("retained");
        if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                continue;
            };
            let value_field = entry.map_entry_value_field();
            if let (Kind::Message(m), serde_json::Value::Object(entries)) = (value_field.kind(), v)
            {
                for e in entries.values_mut() {
                    prune_unknown(&m, e);
                }
            }
            continue;
        }
        let Kind::Message(m) = field.kind() else {
            continue;
        };
        match v {
            serde_json::Value::Array(items) if field.is_list() => {
                for item in items {
                    prune_unknown(&m, item);
                }
            }
            v => prune_unknown(&m, v),
        }
    }
}

pub(crate) fn encode_message(msg: &DynamicMessage, out: &mut Vec<u8>) {
    let len = msg.encoded_len();
    out.reserve(PREFIX_LEN + len);
    out.push(0);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode_raw(out);
}

/// What to send the client instead of the upstream response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscodedResponse {
    pub status: u16,
    /// `None`: `application/json` (APISIX sets it before knowing the body). `Some`: the `content_type` of a
    /// `google.api.HttpBody` response.
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// Collects a unary response body (as APISIX's `hold_body_chunk`) and transcodes it at the end.
#[derive(Debug)]
pub struct UnaryResponse<'t> {
    t: &'t Transcoder,
    body: Vec<u8>,
    truncated: bool,
}

/// APISIX's body when the response message cannot be decoded.
pub const DECODE_FAILED: &str = "failed to decode response data by protobuf";

impl UnaryResponse<'_> {
    /// Adds response body bytes. At most `max_resp_body_size` bytes are kept (APISIX truncates there).
    pub fn push(&mut self, bytes: &[u8]) {
        let room = self.t.max_resp_body_size - self.body.len();
        if bytes.len() > room {
            self.truncated = true;
        }
        self.body.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The response to send, given the upstream's HTTP status and its `grpc-*` metadata (from the headers of a
    /// trailers-only response, else from the trailers). `None`: send the upstream response unchanged (its HTTP
    /// status was >= 300, which APISIX leaves alone).
    ///
    /// - `grpc-status` absent or `0`: 200 and the decoded message as JSON (no message decodes as an empty one,
    ///   as APISIX). Unlike APISIX, which has sent 200 already, an undecodable or truncated body is a 502 with
    ///   APISIX's body text.
    /// - otherwise: the mapped status ([`http_status`]); the body is the upstream's, unless `show_status_in_body`
    ///   and `grpc-status-details-bin` are set, which give `{"error":{"code":..,"details":[..],"message":..}}`.
    pub fn finish(self, upstream_status: u16, grpc: &GrpcStatus<'_>) -> Option<TranscodedResponse> {
        if upstream_status >= 300 {
            return None;
        }
        if let Some(code) = grpc.code.filter(|c| *c != b"0") {
            let status = http_status(code);
            let body = match (self.t.show_status_in_body, grpc.details_bin) {
                (true, Some(details)) => {
                    match error_body(details, self.t.detail_type.as_ref(), self.t.pb) {
                        StatusBody::Json(b) | StatusBody::Failed(b) => b,
                    }
                }
                _ => self.body,
            };
            return Some(TranscodedResponse {
                status,
                content_type: None,
                body,
            });
        }
        match self.decode() {
            Some((content_type, body)) => Some(TranscodedResponse {
                status: 200,
                content_type,
                body,
            }),
            None => Some(TranscodedResponse {
                status: 502,
                content_type: None,
                body: DECODE_FAILED.as_bytes().to_vec(),
            }),
        }
    }

    fn decode(&self) -> Option<(Option<String>, Vec<u8>)> {
        if self.truncated {
            return None;
        }
        let mut d = Deframer::new(self.t.max_resp_body_size);
        d.push(&self.body);
        let payload = match d.next_frame().ok()? {
            Some(f) => f.payload,
            None if self.body.is_empty() => bytes::Bytes::new(),
            None => return None,
        };
        if d.buffered() != 0 {
            return None;
        }
        let msg = DynamicMessage::decode(self.t.method.output(), payload).ok()?;
        Some(render_response(
            &msg,
            self.t.response_body.as_ref(),
            self.t.pb,
        ))
    }
}

/// The body for a response message: the whole message, or its `response_body` field; a `google.api.HttpBody`
/// is sent raw with its own content type.
fn render_response(
    msg: &DynamicMessage,
    field: Option<&FieldDescriptor>,
    pb: PbOptions,
) -> (Option<String>, Vec<u8>) {
    let mut out = Vec::with_capacity(64);
    let Some(field) = field else {
        if let Some(raw) = http_body(msg) {
            return raw;
        }
        write_json(msg, pb, &mut out);
        return (None, out);
    };
    let value = msg.get_field(field);
    match value.as_ref() {
        Value::Message(m) if !field.is_list() => {
            if let Some(raw) = http_body(m) {
                return raw;
            }
            write_json(m, pb, &mut out);
        }
        _ => {
            // A scalar, list or map: render the message and take the field's JSON out of it.
            let mut only = DynamicMessage::new(msg.descriptor());
            only.set_field(field, value.into_owned());
            let opts = pb.serialize_options();
            let json = only
                .serialize_with_options(serde_json::value::Serializer, &opts)
                .expect("serializing to a Value cannot fail");
            let v = json
                .get(field.name())
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            serde_json::to_writer(&mut out, &v).expect("writing to a Vec cannot fail");
        }
    }
    (None, out)
}

pub(crate) const HTTP_BODY: &str = "google.api.HttpBody";

fn http_body(msg: &DynamicMessage) -> Option<(Option<String>, Vec<u8>)> {
    if msg.descriptor().full_name() != HTTP_BODY {
        return None;
    }
    let ct = msg.get_field_by_name("content_type")?.as_str()?.to_owned();
    let data = msg.get_field_by_name("data")?.as_bytes()?.to_vec();
    Some((Some(ct), data))
}

pub(crate) fn write_json(msg: &DynamicMessage, pb: PbOptions, out: &mut Vec<u8>) {
    let mut ser = serde_json::Serializer::new(out);
    msg.serialize_with_options(&mut ser, &pb.serialize_options())
        .expect("serializing a decoded message to a Vec cannot fail");
}

/// How a server-streaming response is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// One JSON array, elements written as they arrive (Envoy's format).
    JsonArray,
    /// One JSON object per line.
    Ndjson,
    /// Server-sent events: `data: {json}\n\n`.
    Sse,
}

impl StreamFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            StreamFormat::JsonArray => "application/json",
            StreamFormat::Ndjson => "application/x-ndjson",
            StreamFormat::Sse => "text/event-stream",
        }
    }
}

/// A streaming problem: the client has its 200 and part of the body already, so the caller ends the response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Frame(#[from] crate::frame::FrameError),
    #[error("{DECODE_FAILED}: {0}")]
    Decode(String),
}

/// Incremental server-streaming transcoder: `push` upstream bytes, get output bytes for each complete message.
#[derive(Debug)]
pub struct StreamResponse {
    desc: MessageDescriptor,
    pb: PbOptions,
    format: StreamFormat,
    deframer: Deframer,
    count: usize,
    done: bool,
}

impl StreamResponse {
    pub fn content_type(&self) -> &'static str {
        self.format.content_type()
    }

    /// Feeds upstream body bytes; appends the output for every message completed by them to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), StreamError> {
        self.deframer.push(bytes);
        while let Some(frame) = self.deframer.next_frame()? {
            let msg = DynamicMessage::decode(self.desc.clone(), frame.payload)
                .map_err(|e| StreamError::Decode(e.to_string()))?;
            self.open_element(out);
            write_json(&msg, self.pb, out);
            self.close_element(out);
        }
        Ok(())
    }

    fn open_element(&mut self, out: &mut Vec<u8>) {
        match self.format {
            StreamFormat::JsonArray => out.push(if self.count == 0 { b'[' } else { b',' }),
            StreamFormat::Ndjson => {}
            StreamFormat::Sse => out.extend_from_slice(b"data: "),
        }
        self.count += 1;
    }

    fn close_element(&self, out: &mut Vec<u8>) {
        match self.format {
            StreamFormat::JsonArray => {}
            StreamFormat::Ndjson => out.push(b'\n'),
            StreamFormat::Sse => out.extend_from_slice(b"\n\n"),
        }
    }

    /// Ends the stream with the upstream's trailers. A non-OK status becomes a last element
    /// `{"error":{"code":N,"message":"..."}}` (`grpc-message` percent-decoded); for SSE an `event: error`.
    pub fn finish(&mut self, grpc: &GrpcStatus<'_>, out: &mut Vec<u8>) -> Result<(), StreamError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let truncated = self.deframer.finish();
        let code = grpc.code_number();
        let error = match (code, &truncated) {
            (Some(0), Ok(())) => None,
            (Some(0), Err(e)) => Some((13, e.to_string())),
            (Some(c), _) => Some((c, grpc.message())),
            (None, _) => Some((2, "upstream grpc status not received".to_owned())),
        };
        if let Some((code, message)) = error {
            let body = serde_json::json!({"error": {"code": code, "message": message}});
            if self.format == StreamFormat::Sse {
                out.extend_from_slice(b"event: error\n");
            }
            self.open_element(out);
            serde_json::to_writer(&mut *out, &body).expect("writing to a Vec cannot fail");
            self.close_element(out);
        }
        if self.format == StreamFormat::JsonArray {
            if self.count == 0 {
                out.push(b'[');
            }
            out.push(b']');
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_frame;
    use crate::proto::compile;

    pub(crate) const PROTO: &str = r#"
        syntax = "proto3";
        package helloworld;
        service Greeter {
          rpc SayHello (HelloRequest) returns (HelloReply) {}
          rpc Plus (PlusRequest) returns (PlusReply) {}
          rpc Stream (HelloRequest) returns (stream HelloReply) {}
        }
        enum Gender { GENDER_UNKNOWN = 0; GENDER_MALE = 1; GENDER_FEMALE = 2; }
        message Person { string name = 1; int32 age = 2; Person next = 3; }
        message HelloRequest {
          string name = 1;
          repeated string items = 2;
          Gender gender = 3;
          Person person = 4;
          repeated Person persons = 5;
          bool flag = 6;
          bytes raw = 7;
          map<string, string> labels = 8;
        }
        message HelloReply {
          string message = 1;
          repeated string items = 2;
          Gender gender = 3;
          Person person = 4;
          map<string, Person> members = 5;
        }
        message PlusRequest { int64 a = 1; int64 b = 2; }
        message PlusReply { int64 result = 1; }
        message ErrorDetail { int64 code = 1; string message = 2; string type = 3; }
    "#;

    fn transcoder(method: &str, config: TranscodeConfig) -> Transcoder {
        let set = compile("hello.proto", PROTO, |_| None).unwrap();
        Transcoder::new(&set, "helloworld.Greeter", method, &config).unwrap()
    }

    fn request(t: &Transcoder, req: HttpRequest<'_>) -> Result<serde_json::Value, RequestError> {
        let mut out = Vec::new();
        t.encode_request(&req, &mut out)?;
        assert_eq!(out[0], 0);
        let len = u32::from_be_bytes(out[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 5);
        let msg = DynamicMessage::decode(t.method().input(), &out[5..]).unwrap();
        let mut json = Vec::new();
        write_json(
            &msg,
            PbOptions {
                skip_default_values: true,
                ..PbOptions::default()
            },
            &mut json,
        );
        Ok(serde_json::from_slice(&json).unwrap())
    }

    fn json_post(body: &str) -> HttpRequest<'_> {
        HttpRequest {
            method: "POST",
            content_type: Some("application/json; charset=utf-8"),
            body: body.as_bytes(),
            ..Default::default()
        }
    }

    #[test]
    fn compiled_config_is_shareable_across_workers() {
        fn shared<T: Send + Sync + Clone + 'static>() {}
        shared::<Transcoder>();
        shared::<crate::HttpRouter>();
        shared::<crate::ProtoSet>();
    }

    #[test]
    fn path_and_timeout() {
        let t = transcoder(
            "SayHello",
            TranscodeConfig {
                deadline_ms: 1500.0,
                ..Default::default()
            },
        );
        assert_eq!(t.grpc_path(), "/helloworld.Greeter/SayHello");
        assert_eq!(t.grpc_timeout(), Some("1500m"));
        assert_eq!(
            transcoder("SayHello", Default::default()).grpc_timeout(),
            None
        );
    }

    #[test]
    fn json_body_with_nested_and_repeated_messages() {
        let t = transcoder("SayHello", Default::default());
        let v = request(
            &t,
            json_post(r#"{"name":"world","persons":[{"name":"Joe","age":1},{"name":"Jake","age":"2"}],"unknown":1}"#),
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"name":"world","persons":[{"name":"Joe","age":1},{"name":"Jake","age":2}]})
        );
    }

    #[test]
    fn enum_by_name_or_number_and_bad_enum_is_400() {
        let t = transcoder("SayHello", Default::default());
        assert_eq!(
            request(&t, json_post(r#"{"gender":2}"#)).unwrap()["gender"],
            "GENDER_FEMALE"
        );
        assert_eq!(
            request(&t, json_post(r#"{"gender":"GENDER_MALE"}"#)).unwrap()["gender"],
            "GENDER_MALE"
        );
        let e = request(&t, json_post(r#"{"gender":"GENDER_MA"}"#)).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(
            e.0.starts_with("failed to encode request data to protobuf"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_ignored_at_every_depth() {
        let t = transcoder("SayHello", Default::default());
        let v = request(
            &t,
            json_post(
                r#"{"x":{"y":1},"person":{"name":"a","zz":[1]},"persons":[{"age":3,"q":null}]}"#,
            ),
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"person":{"name":"a"},"persons":[{"age":3}]})
        );
        // The strict pass still reports bad values next to unknown keys.
        assert!(request(&t, json_post(r#"{"x":1,"gender":"NOPE"}"#)).is_err());
    }

    #[test]
    fn bad_json_and_wrong_types_are_400() {
        let t = transcoder("SayHello", Default::default());
        for body in [
            r#"{"name":"#,
            r#"[1,2]"#,
            r#""str""#,
            r#"{"name":1}"#,
            r#"{"person":"x"}"#,
            r#"{"items":"notalist"}"#,
            r#"{"name":"a"} trailing"#,
        ] {
            let e = request(&t, json_post(body)).unwrap_err();
            assert!(e.0.contains("failed to encode request data"), "{body}: {e}");
        }
        let t = transcoder("Plus", Default::default());
        assert!(request(&t, json_post(r#"{"a":"12x"}"#)).is_err());
        assert_eq!(request(&t, json_post(r#"{"a":"12"}"#)).unwrap()["a"], 12);
    }

    #[test]
    fn query_args_for_get() {
        let t = transcoder("SayHello", Default::default());
        let v = request(
            &t,
            HttpRequest {
                method: "GET",
                query: b"name=wor+ld%21&items=a&items=b&gender=1&person.age=7&flag&raw=%00x&nope=1",
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"name":"wor ld!","items":["a","b"],"gender":"GENDER_MALE",
                               "person":{"age":7},"flag":true,"raw":"AHg="})
        );
        let e = request(
            &t,
            HttpRequest {
                method: "GET",
                query: b"person.age=old",
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.0.contains("person.age"), "{e}");
        assert!(request(
            &t,
            HttpRequest {
                method: "GET",
                query: b"labels=x",
                ..Default::default()
            }
        )
        .is_err());
        assert!(request(
            &t,
            HttpRequest {
                method: "GET",
                query: b"flag=yes",
                ..Default::default()
            }
        )
        .is_err());
    }

    #[test]
    fn hostile_depth_is_refused_not_a_stack_overflow() {
        let t = transcoder("SayHello", Default::default());
        // A dotted query key one level per dot on a recursive message.
        let key = format!("person{}.name", ".next".repeat(100_000));
        let query = format!("{key}=x");
        let e = request(
            &t,
            HttpRequest {
                method: "GET",
                query: query.as_bytes(),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.0.contains("deeper than"), "{e}");
        let ok = format!("person{}.name=x", ".next".repeat(30));
        assert!(request(
            &t,
            HttpRequest {
                method: "GET",
                query: ok.as_bytes(),
                ..Default::default()
            }
        )
        .is_ok());
        // JSON nesting past serde_json's recursion limit.
        let deep = format!(
            "{{\"person\":{}{}}}",
            "{\"next\":".repeat(10_000),
            "}".repeat(10_000)
        );
        assert!(request(&t, json_post(&deep)).is_err());
    }

    #[test]
    fn deeply_nested_response_message_is_a_decode_error() {
        let t = transcoder("SayHello", Default::default());
        // HelloReply.person (4) { next (3) { next { ... } } }, 100k levels, built inside out.
        let mut inner: Vec<u8> = Vec::new();
        for i in 0..100_000 {
            let tag = if i == 99_999 { 0x22 } else { 0x1a };
            let mut len = Vec::new();
            let mut n = inner.len();
            loop {
                let b = (n & 0x7f) as u8;
                n >>= 7;
                if n == 0 {
                    len.push(b);
                    break;
                }
                len.push(b | 0x80);
            }
            let mut next = vec![tag];
            next.extend(len);
            next.extend(inner);
            inner = next;
        }
        let mut wire = Vec::new();
        encode_frame(&inner, &mut wire);
        let mut r = t.unary_response();
        r.push(&wire);
        assert_eq!(r.finish(200, &OK).unwrap().status, 502);
    }

    #[test]
    fn source_precedence_as_apisix() {
        let t = transcoder("SayHello", Default::default());
        // POST form: body fields, query ignored.
        let v = request(
            &t,
            HttpRequest {
                method: "POST",
                content_type: Some("application/x-www-form-urlencoded"),
                query: b"name=fromquery",
                body: b"name=world",
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(v["name"], "world");
        // POST with another content type: an empty message (APISIX's get_post_args gives nothing).
        let v = request(
            &t,
            HttpRequest {
                method: "POST",
                content_type: Some("text/plain"),
                query: b"name=fromquery",
                body: b"name=world",
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(v, serde_json::json!({}));
        // JSON content type on GET: query args.
        let v = request(
            &t,
            HttpRequest {
                method: "GET",
                content_type: Some("application/json"),
                query: b"name=q",
                body: br#"{"name":"b"}"#,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(v["name"], "q");
        // PUT JSON with an empty body falls through to the query.
        let v = request(
            &t,
            HttpRequest {
                method: "PUT",
                content_type: Some("application/json"),
                query: b"name=q",
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(v["name"], "q");
    }

    #[test]
    fn route_params_win() {
        let t = transcoder("SayHello", Default::default());
        let v = request(
            &t,
            HttpRequest {
                params: &[("name", "param"), ("person.name", "p")],
                ..json_post(r#"{"name":"body"}"#)
            },
        )
        .unwrap();
        assert_eq!(v, serde_json::json!({"name":"param","person":{"name":"p"}}));
    }

    fn reply(t: &Transcoder, json: &str) -> Vec<u8> {
        let mut de = serde_json::Deserializer::from_str(json);
        let msg = DynamicMessage::deserialize(t.method().output(), &mut de).unwrap();
        let mut out = Vec::new();
        encode_frame(&msg.encode_to_vec(), &mut out);
        out
    }

    const OK: GrpcStatus<'static> = GrpcStatus {
        code: Some(b"0"),
        message: None,
        details_bin: None,
    };

    #[test]
    fn unary_response_defaults_and_empty_repeated() {
        let t = transcoder("SayHello", Default::default());
        let mut r = t.unary_response();
        let wire = reply(&t, r#"{"message":"Hello world"}"#);
        // Split across pushes.
        r.push(&wire[..3]);
        r.push(&wire[3..]);
        let out = r.finish(200, &OK).unwrap();
        assert_eq!(out.status, 200);
        assert_eq!(
            String::from_utf8(out.body).unwrap(),
            r#"{"message":"Hello world","items":[],"gender":"GENDER_UNKNOWN","members":{}}"#
        );
    }

    #[test]
    fn unary_response_options() {
        let t = transcoder(
            "Plus",
            TranscodeConfig {
                pb_options: PbOptions::parse(&["int64_as_string"]).unwrap(),
                ..Default::default()
            },
        );
        let mut r = t.unary_response();
        r.push(&reply(&t, r#"{"result":"2251799813685261"}"#));
        assert_eq!(
            r.finish(200, &OK).unwrap().body,
            br#"{"result":"2251799813685261"}"#
        );
        let t = transcoder("Plus", Default::default());
        let mut r = t.unary_response();
        r.push(&reply(&t, r#"{"result":"2251799813685261"}"#));
        assert_eq!(
            r.finish(200, &OK).unwrap().body,
            br#"{"result":2251799813685261}"#
        );
        let t = transcoder(
            "SayHello",
            TranscodeConfig {
                pb_options: PbOptions::parse(&["enum_as_value", "no_default_values"]).unwrap(),
                ..Default::default()
            },
        );
        let mut r = t.unary_response();
        r.push(&reply(&t, r#"{"gender":"GENDER_FEMALE"}"#));
        assert_eq!(r.finish(200, &OK).unwrap().body, br#"{"gender":2}"#);
    }

    #[test]
    fn unary_response_no_message_and_garbage() {
        let t = transcoder("SayHello", Default::default());
        let r = t.unary_response();
        let out = r.finish(200, &GrpcStatus::default()).unwrap();
        assert_eq!(out.status, 200);
        assert!(out.body.starts_with(br#"{"message":"""#));
        for bad in [
            &b"\x00\x00\x00\x00\x05ab"[..],
            b"\x00\x00\x00\x00\x01\xff",
            b"\x01\x00\x00\x00\x00",
            b"xyz",
        ] {
            let mut r = t.unary_response();
            r.push(bad);
            let out = r.finish(200, &OK).unwrap();
            assert_eq!(
                (out.status, out.body.as_slice()),
                (502, DECODE_FAILED.as_bytes()),
                "{bad:?}"
            );
        }
        // Two messages for a unary call.
        let mut r = t.unary_response();
        r.push(&reply(&t, "{}"));
        r.push(&reply(&t, "{}"));
        assert_eq!(r.finish(200, &OK).unwrap().status, 502);
    }

    #[test]
    fn max_resp_body_size_truncates() {
        let t = transcoder(
            "SayHello",
            TranscodeConfig {
                max_resp_body_size: 10,
                ..Default::default()
            },
        );
        let mut r = t.unary_response();
        r.push(&reply(&t, r#"{"message":"a long enough message"}"#));
        assert_eq!(r.finish(200, &OK).unwrap().status, 502);
        let mut r = t.unary_response();
        r.push(&reply(&t, r#"{"message":"ab"}"#));
        assert_eq!(r.finish(200, &OK).unwrap().status, 200);
    }

    #[test]
    fn error_status_mapping_and_passthrough() {
        let t = transcoder("SayHello", Default::default());
        let mut r = t.unary_response();
        r.push(b"upstream body");
        let out = r
            .finish(
                200,
                &GrpcStatus {
                    code: Some(b"14"),
                    message: Some(b"Out of service"),
                    details_bin: Some(b"CA4SDk91dCBvZiBzZXJ2aWNl"),
                },
            )
            .unwrap();
        // show_status_in_body is off: the body is left alone.
        assert_eq!(
            (out.status, out.body.as_slice()),
            (503, &b"upstream body"[..])
        );
        assert!(t.unary_response().finish(502, &OK).is_none());
    }

    // APISIX t/plugin/grpc-transcode3.t TEST 4-10: the same grpc-status-details-bin and expected bodies.
    const DETAILS: &[u8] = b"CA4SDk91dCBvZiBzZXJ2aWNlGlcKKnR5cGUuZ29vZ2xlYXBpcy5jb20vaGVsbG93b3JsZC5FcnJvckRldGFpbBIpCAESHFRoZSBzZXJ2ZXIgaXMgb3V0IG9mIHNlcnZpY2UaB3NlcnZpY2U";

    fn error_response(detail_type: Option<&str>) -> TranscodedResponse {
        let t = transcoder(
            "SayHello",
            TranscodeConfig {
                show_status_in_body: true,
                status_detail_type: detail_type.map(str::to_owned),
                ..Default::default()
            },
        );
        t.unary_response()
            .finish(
                200,
                &GrpcStatus {
                    code: Some(b"14"),
                    message: Some(b"Out of service"),
                    details_bin: Some(DETAILS),
                },
            )
            .unwrap()
    }

    #[test]
    fn status_in_body_as_apisix() {
        let out = error_response(None);
        assert_eq!(out.status, 503);
        assert_eq!(
            String::from_utf8(out.body).unwrap(),
            r#"{"error":{"code":14,"details":[{"type_url":"type.googleapis.com/helloworld.ErrorDetail","value":"\b\u0001\u0012\u001cThe server is out of service\u001a\u0007service"}],"message":"Out of service"}}"#
        );
        let out = error_response(Some("helloworld.ErrorDetail"));
        assert_eq!(
            String::from_utf8(out.body).unwrap(),
            r#"{"error":{"code":14,"details":[{"code":1,"message":"The server is out of service","type":"service"}],"message":"Out of service"}}"#
        );
        let out = error_response(Some("helloworld.Nope"));
        assert_eq!(out.status, 503);
        assert_eq!(
            out.body,
            b"failed to call pb.decode to decode details in grpc-status-details-bin"
        );
        assert_eq!(out.content_type, None);
    }

    #[test]
    fn server_stream_formats() {
        let t = transcoder("Stream", Default::default());
        let mut wire = reply(&t, r#"{"message":"a"}"#);
        wire.extend(reply(&t, r#"{"message":"b"}"#));
        let pb = PbOptions::parse(&["no_default_values"]).unwrap();
        let run = |format, status: GrpcStatus<'_>| {
            let mut s = t.stream_response(format);
            s.pb = pb;
            let mut out = Vec::new();
            for chunk in wire.chunks(4) {
                s.push(chunk, &mut out).unwrap();
            }
            s.finish(&status, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            run(StreamFormat::JsonArray, OK),
            r#"[{"message":"a"},{"message":"b"}]"#
        );
        assert_eq!(
            run(StreamFormat::Ndjson, OK),
            "{\"message\":\"a\"}\n{\"message\":\"b\"}\n"
        );
        assert_eq!(
            run(StreamFormat::Sse, OK),
            "data: {\"message\":\"a\"}\n\ndata: {\"message\":\"b\"}\n\n"
        );
        let failed = GrpcStatus {
            code: Some(b"13"),
            message: Some(b"boom%20here"),
            details_bin: None,
        };
        assert_eq!(
            run(StreamFormat::JsonArray, failed),
            r#"[{"message":"a"},{"message":"b"},{"error":{"code":13,"message":"boom here"}}]"#
        );
        let mut s = t.stream_response(StreamFormat::JsonArray);
        let mut out = Vec::new();
        s.finish(&OK, &mut out).unwrap();
        assert_eq!(out, b"[]");
        let mut s = t.stream_response(StreamFormat::Sse);
        let mut out = Vec::new();
        s.finish(&GrpcStatus::default(), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "event: error\ndata: {\"error\":{\"code\":2,\"message\":\"upstream grpc status not received\"}}\n\n"
        );
    }

    #[test]
    fn stream_rejects_hostile_frames() {
        let t = transcoder("Stream", Default::default());
        let mut s = t.stream_response(StreamFormat::Ndjson);
        let mut out = Vec::new();
        assert!(s.push(b"\x00\x00\x00\x00\x02\xff\xff", &mut out).is_err());
        let mut s = t.stream_response(StreamFormat::Ndjson);
        assert!(s.push(b"\x01\x00\x00\x00\x00", &mut out).is_err());
    }
}
