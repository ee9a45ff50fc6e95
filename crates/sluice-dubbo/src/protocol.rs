//! Dubbo2 frames (`dubbo://`): the 16-byte header, an incremental frame decoder, and request, response and
//! event (heartbeat) bodies in Hessian 2.

use bytes::{Buf, Bytes, BytesMut};

use crate::hessian::{DecodeError, Decoder, Encoder, Value};
use crate::java::parse_descriptors;

pub const MAGIC: [u8; 2] = [0xda, 0xbb];
pub const HEADER_LEN: usize = 16;
pub const FLAG_REQUEST: u8 = 0x80;
pub const FLAG_TWO_WAY: u8 = 0x40;
pub const FLAG_EVENT: u8 = 0x20;
/// The low 5 bits of the flag byte: the serialization id.
pub const SERIALIZATION_MASK: u8 = 0x1f;
pub const SERIALIZATION_HESSIAN2: u8 = 2;
/// Dubbo's default `payload` limit: 8 MiB of body.
pub const DEFAULT_MAX_PAYLOAD: usize = 8 << 20;
/// The protocol version a Dubbo 2.7/3.x consumer writes first in a request body.
pub const DUBBO_VERSION: &str = "2.0.2";

/// Response body flags (the first value of an OK response body).
pub const RESPONSE_WITH_EXCEPTION: i32 = 0;
pub const RESPONSE_VALUE: i32 = 1;
pub const RESPONSE_NULL_VALUE: i32 = 2;
pub const RESPONSE_WITH_EXCEPTION_WITH_ATTACHMENTS: i32 = 3;
pub const RESPONSE_VALUE_WITH_ATTACHMENTS: i32 = 4;
pub const RESPONSE_NULL_VALUE_WITH_ATTACHMENTS: i32 = 5;

/// The status byte of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u8);

impl Status {
    pub const OK: Status = Status(20);
    pub const CLIENT_TIMEOUT: Status = Status(30);
    pub const SERVER_TIMEOUT: Status = Status(31);
    pub const BAD_REQUEST: Status = Status(40);
    pub const BAD_RESPONSE: Status = Status(50);
    pub const SERVICE_NOT_FOUND: Status = Status(60);
    pub const SERVICE_ERROR: Status = Status(70);
    pub const SERVER_ERROR: Status = Status(80);
    pub const CLIENT_ERROR: Status = Status(90);
    pub const SERVER_THREADPOOL_EXHAUSTED_ERROR: Status = Status(100);

    pub fn name(self) -> &'static str {
        match self.0 {
            20 => "OK",
            30 => "CLIENT_TIMEOUT",
            31 => "SERVER_TIMEOUT",
            40 => "BAD_REQUEST",
            50 => "BAD_RESPONSE",
            60 => "SERVICE_NOT_FOUND",
            70 => "SERVICE_ERROR",
            80 => "SERVER_ERROR",
            90 => "CLIENT_ERROR",
            100 => "SERVER_THREADPOOL_EXHAUSTED_ERROR",
            _ => "UNKNOWN",
        }
    }

    /// The HTTP status a gateway answers with: 200 for OK, 504 for a timeout, 503 when its thread pool is
    /// exhausted, 502 otherwise. BAD_REQUEST is 502 too: the gateway built that request (the client's bad input is
    /// refused before anything is sent), and a Java provider answers it for a service it does not export.
    pub fn http_status(self) -> u16 {
        match self {
            Status::OK => 200,
            Status::CLIENT_TIMEOUT | Status::SERVER_TIMEOUT => 504,
            Status::SERVER_THREADPOOL_EXHAUSTED_ERROR => 503,
            _ => 502,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("dubbo: bad magic 0x{:02x}{:02x}", .0[0], .0[1])]
    BadMagic([u8; 2]),
    #[error("dubbo: body of {len} bytes exceeds the {max}-byte payload limit")]
    TooLarge { len: usize, max: usize },
    #[error("dubbo: serialization id {0} is not supported (only hessian2 = 2)")]
    UnsupportedSerialization(u8),
    #[error("dubbo: bad body: {0}")]
    Body(#[from] DecodeError),
    #[error("dubbo: bad body: {0}")]
    Malformed(String),
}

/// The 16-byte frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub flags: u8,
    pub status: Status,
    pub id: u64,
    pub body_len: u32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, ProtocolError> {
        if b[..2] != MAGIC {
            return Err(ProtocolError::BadMagic([b[0], b[1]]));
        }
        Ok(Header {
            flags: b[2],
            status: Status(b[3]),
            id: u64::from_be_bytes(b[4..12].try_into().unwrap_or_default()),
            body_len: u32::from_be_bytes(b[12..16].try_into().unwrap_or_default()),
        })
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0; HEADER_LEN];
        b[..2].copy_from_slice(&MAGIC);
        b[2] = self.flags;
        b[3] = self.status.0;
        b[4..12].copy_from_slice(&self.id.to_be_bytes());
        b[12..].copy_from_slice(&self.body_len.to_be_bytes());
        b
    }

    pub fn is_request(&self) -> bool {
        self.flags & FLAG_REQUEST != 0
    }

    pub fn is_two_way(&self) -> bool {
        self.flags & FLAG_TWO_WAY != 0
    }

    pub fn is_event(&self) -> bool {
        self.flags & FLAG_EVENT != 0
    }

    pub fn serialization(&self) -> u8 {
        self.flags & SERIALIZATION_MASK
    }
}

/// One complete frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: Header,
    pub body: Bytes,
}

/// Cuts a byte stream into frames: feed what the socket gave, take the complete frames; a partial frame waits
/// for more. A bad magic or an oversized length is an error after which the stream is unusable (close it).
pub struct FrameDecoder {
    buf: BytesMut,
    max_payload: usize,
}

impl FrameDecoder {
    /// `max_payload`: the largest body accepted ([`DEFAULT_MAX_PAYLOAD`] is Dubbo's default).
    pub fn new(max_payload: usize) -> Self {
        FrameDecoder {
            buf: BytesMut::new(),
            max_payload,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The buffer itself, for reading from a socket into it without a copy.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes held that do not make a complete frame yet.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        let Some(head) = self.buf.get(..HEADER_LEN) else {
            // Fail a wrong peer at once instead of waiting for 16 bytes.
            if self.buf.len() >= 2 && self.buf[..2] != MAGIC {
                return Err(ProtocolError::BadMagic([self.buf[0], self.buf[1]]));
            }
            return Ok(None);
        };
        let header = Header::parse(head.try_into().unwrap_or(&[0; HEADER_LEN]))?;
        let len = header.body_len as usize;
        if len > self.max_payload {
            return Err(ProtocolError::TooLarge {
                len,
                max: self.max_payload,
            });
        }
        if self.buf.len() < HEADER_LEN + len {
            self.buf.reserve(HEADER_LEN + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let body = self.buf.split_to(len).freeze();
        Ok(Some(Frame { header, body }))
    }
}

/// A call: what a consumer sends in a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The protocol version, [`DUBBO_VERSION`].
    pub dubbo_version: String,
    /// The service path (the interface name).
    pub service: String,
    /// The service version (`0.0.0` when the service has none).
    pub version: String,
    pub method: String,
    /// Concatenated JVM descriptors of the parameters (`Ljava/lang/String;J`).
    pub param_types: String,
    pub args: Vec<Value>,
    /// `path`, `interface`, `version`, `group`, `timeout`, `generic`, ...
    pub attachments: Vec<(String, Value)>,
}

impl Request {
    pub fn attachment(&self, key: &str) -> Option<&Value> {
        self.attachments
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// What an OK response carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Value(Value),
    Null,
    /// The thrown `Throwable` (an object; see [`Value::exception_message`]).
    Exception(Value),
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request {
        id: u64,
        two_way: bool,
        request: Request,
    },
    Response {
        id: u64,
        status: Status,
        /// For a status other than OK, the provider's error message.
        result: Result<Outcome, String>,
        attachments: Vec<(String, Value)>,
    },
    /// An event: a heartbeat (`data` null) or Dubbo's read-only notice (`data` `"R"`).
    Event {
        id: u64,
        request: bool,
        two_way: bool,
        data: Value,
    },
}

fn finish_frame(
    out: &mut Vec<u8>,
    start: usize,
    flags: u8,
    status: Status,
    id: u64,
    max: usize,
) -> Result<(), ProtocolError> {
    let len = out.len() - start - HEADER_LEN;
    if len > max || len > u32::MAX as usize {
        out.truncate(start);
        return Err(ProtocolError::TooLarge { len, max });
    }
    let h = Header {
        flags,
        status,
        id,
        body_len: len as u32,
    };
    out[start..start + HEADER_LEN].copy_from_slice(&h.to_bytes());
    Ok(())
}

fn write_attachments(e: &mut Encoder, attachments: &[(String, Value)]) {
    e.write_map_begin(None);
    for (k, v) in attachments {
        e.write_str(k);
        e.write(v);
    }
    e.write_map_end();
}

/// Appends a two-way request frame; fails (appending nothing) when the body exceeds `max_payload`.
pub fn encode_request(
    req: &Request,
    id: u64,
    max_payload: usize,
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    let start = out.len();
    out.resize(start + HEADER_LEN, 0);
    let mut e = Encoder::new(out);
    e.write_str(&req.dubbo_version);
    e.write_str(&req.service);
    e.write_str(&req.version);
    e.write_str(&req.method);
    e.write_str(&req.param_types);
    for a in &req.args {
        e.write(a);
    }
    write_attachments(&mut e, &req.attachments);
    let flags = FLAG_REQUEST | FLAG_TWO_WAY | SERIALIZATION_HESSIAN2;
    finish_frame(out, start, flags, Status(0), id, max_payload)
}

/// Appends a response frame. `result` is the outcome for OK, or the error message for another status.
pub fn encode_response(
    id: u64,
    status: Status,
    result: &Result<Outcome, String>,
    attachments: &[(String, Value)],
    out: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    let start = out.len();
    out.resize(start + HEADER_LEN, 0);
    let mut e = Encoder::new(out);
    match result {
        Ok(outcome) => {
            let with = if attachments.is_empty() { 0 } else { 3 };
            match outcome {
                Outcome::Value(v) => {
                    e.write_int(RESPONSE_VALUE + with);
                    e.write(v);
                }
                Outcome::Null => e.write_int(RESPONSE_NULL_VALUE + with),
                Outcome::Exception(v) => {
                    e.write_int(RESPONSE_WITH_EXCEPTION + with);
                    e.write(v);
                }
            }
            if !attachments.is_empty() {
                write_attachments(&mut e, attachments);
            }
        }
        Err(msg) => e.write_str(msg),
    }
    finish_frame(out, start, SERIALIZATION_HESSIAN2, status, id, usize::MAX)
}

/// Appends a heartbeat: a two-way request (`request`) or the answer to one.
pub fn encode_heartbeat(id: u64, request: bool, out: &mut Vec<u8>) {
    let flags = if request {
        FLAG_REQUEST | FLAG_TWO_WAY | FLAG_EVENT | SERIALIZATION_HESSIAN2
    } else {
        FLAG_EVENT | SERIALIZATION_HESSIAN2
    };
    let status = if request { Status(0) } else { Status::OK };
    let h = Header {
        flags,
        status,
        id,
        body_len: 1,
    };
    out.extend_from_slice(&h.to_bytes());
    out.push(b'N');
}

fn read_attachments(d: &mut Decoder) -> Result<Vec<(String, Value)>, ProtocolError> {
    match d.read()? {
        Value::Null => Ok(Vec::new()),
        Value::Map { entries, .. } => entries
            .into_iter()
            .map(|(k, v)| match k {
                Value::String(k) => Ok((k, v)),
                other => Err(ProtocolError::Malformed(format!(
                    "attachment key {other:?} is not a string"
                ))),
            })
            .collect(),
        other => Err(ProtocolError::Malformed(format!(
            "attachments are not a map: {other:?}"
        ))),
    }
}

fn string(d: &mut Decoder, what: &str) -> Result<String, ProtocolError> {
    match d.read()? {
        Value::String(s) => Ok(s),
        Value::Null => Ok(String::new()),
        other => Err(ProtocolError::Malformed(format!(
            "{what} is not a string: {other:?}"
        ))),
    }
}

/// Decodes a frame's body according to its header.
pub fn decode(frame: &Frame) -> Result<Message, ProtocolError> {
    decode_with(frame, true)
}

/// [`decode`] for a caller that reads no response attachments: an answer's attachments (the last thing in its
/// body) are neither decoded nor checked, and the `attachments` of a [`Message::Response`] are empty. dubbo-go
/// providers send a dozen or more with every answer; decoding them was most of an answer's decoding cost.
pub fn decode_without_response_attachments(frame: &Frame) -> Result<Message, ProtocolError> {
    decode_with(frame, false)
}

fn decode_with(frame: &Frame, response_attachments: bool) -> Result<Message, ProtocolError> {
    let h = &frame.header;
    if h.serialization() != SERIALIZATION_HESSIAN2 {
        return Err(ProtocolError::UnsupportedSerialization(h.serialization()));
    }
    let mut d = Decoder::new(&frame.body);
    if h.is_event() {
        let data = if frame.body.is_empty() {
            Value::Null
        } else {
            d.read()?
        };
        return Ok(Message::Event {
            id: h.id,
            request: h.is_request(),
            two_way: h.is_two_way(),
            data,
        });
    }
    if h.is_request() {
        return Ok(Message::Request {
            id: h.id,
            two_way: h.is_two_way(),
            request: decode_request_body(&mut d)?,
        });
    }
    if h.status != Status::OK {
        let msg = if frame.body.is_empty() {
            String::new()
        } else {
            string(&mut d, "error message")?
        };
        return Ok(Message::Response {
            id: h.id,
            status: h.status,
            result: Err(msg),
            attachments: Vec::new(),
        });
    }
    let flag = d.read_int()?;
    let (outcome, with_attachments) = match flag {
        RESPONSE_VALUE | RESPONSE_VALUE_WITH_ATTACHMENTS => (Outcome::Value(d.read()?), flag > 2),
        RESPONSE_NULL_VALUE | RESPONSE_NULL_VALUE_WITH_ATTACHMENTS => (Outcome::Null, flag > 2),
        RESPONSE_WITH_EXCEPTION | RESPONSE_WITH_EXCEPTION_WITH_ATTACHMENTS => {
            (Outcome::Exception(d.read()?), flag > 2)
        }
        other => {
            return Err(ProtocolError::Malformed(format!(
                "unknown response flag {other}"
            )))
        }
    };
    // Bytes after the last value are ignored, as Java's DecodeableRpcResult does (dubbo-go 3.3 writes one more).
    let attachments = if with_attachments && response_attachments {
        read_attachments(&mut d)?
    } else {
        Vec::new()
    };
    Ok(Message::Response {
        id: h.id,
        status: h.status,
        result: Ok(outcome),
        attachments,
    })
}

fn decode_request_body(d: &mut Decoder) -> Result<Request, ProtocolError> {
    let dubbo_version = string(d, "dubbo version")?;
    let service = string(d, "service path")?;
    let version = string(d, "service version")?;
    let method = string(d, "method")?;
    let param_types = string(d, "parameter types")?;
    let n = parse_descriptors(&param_types)
        .map_err(|e| ProtocolError::Malformed(e.0))?
        .len();
    let mut args = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        args.push(d.read()?);
    }
    let attachments = if d.is_empty() {
        Vec::new()
    } else {
        read_attachments(d)?
    };
    Ok(Request {
        dubbo_version,
        service,
        version,
        method,
        param_types,
        args,
        attachments,
    })
}
