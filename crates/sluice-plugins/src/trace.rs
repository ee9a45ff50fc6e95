//! What opentelemetry and zipkin share: trace and span ids, the strict parsers of the propagation headers a
//! client sends (W3C `traceparent`, B3), finished span records and the exporter that ships them in batches.
//!
//! The log phase hands a finished span to [`Exporter::submit`]: one `try_send` on a bounded queue, never a wait.
//! One background thread per exporter configuration drains the queue into batches (by size, by age, by
//! inactivity), encodes them (OTLP protobuf or Zipkin v2 JSON) and POSTs them with a timeout. A slow or dead
//! collector holds only that thread: meanwhile the queue fills and further spans are dropped (counted, logged at
//! most once a second), so the proxy path neither waits nor grows memory. The thread starts with the first span,
//! so a configuration that is only checked never spawns one.

pub(crate) mod export;
mod otlp;
pub(crate) mod zipkin_json;

pub(crate) use export::{ExportConf, Exporter, Exporters};

/// The spans a request has in progress (on [`crate::Ctx`], only for routes with a tracing plugin).
#[derive(Default)]
pub(crate) struct ReqTrace {
    pub otel: Option<crate::opentelemetry::ReqSpan>,
    pub zipkin: Option<crate::zipkin::ReqSpans>,
}

/// Sets a request header going upstream, replacing the client's and any earlier plugin's.
pub(crate) fn set_header(ctx: &mut crate::Ctx<'_>, name: &'static str, value: String) {
    let e = &mut ctx.edits;
    e.set_headers
        .retain(|(n, _)| !n.eq_ignore_ascii_case(name.as_bytes()));
    e.set_headers
        .push((bytes::Bytes::from_static(name.as_bytes()), value.into()));
}

/// Keeps the client's header `name` from going upstream.
pub(crate) fn remove_header(ctx: &mut crate::Ctx<'_>, name: &'static str) {
    let e = &mut ctx.edits;
    e.set_headers
        .retain(|(n, _)| !n.eq_ignore_ascii_case(name.as_bytes()));
    if !e
        .remove_headers
        .iter()
        .any(|n| n.eq_ignore_ascii_case(name.as_bytes()))
    {
        e.remove_headers
            .push(bytes::Bytes::from_static(name.as_bytes()));
    }
}

/// The host name for the `hostname` resource attribute.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A finished span, as both encoders need it.
#[derive(Debug, Clone)]
pub(crate) struct SpanRecord {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: Box<str>,
    pub kind: Kind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Vec<(Box<str>, Attr)>,
    /// Set: the span's status is ERROR with this message.
    pub error: Option<Box<str>>,
    /// The W3C `tracestate` the trace came with.
    pub trace_state: Option<Box<str>>,
    /// Zipkin's `localEndpoint`: (service name, IPv4, port).
    pub local: Option<(Box<str>, Box<str>, u16)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Internal,
    Server,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Attr {
    Str(Box<str>),
    Int(i64),
    Double(f64),
    Bool(bool),
}

impl std::fmt::Display for Attr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attr::Str(s) => f.write_str(s),
            Attr::Int(i) => write!(f, "{i}"),
            Attr::Double(d) => write!(f, "{d}"),
            Attr::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A random trace id, never all zero (an invalid id in both W3C and B3).
pub(crate) fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

pub(crate) fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes`, appended to `out`.
pub(crate) fn put_hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    put_hex(&mut s, bytes);
    s
}

fn nibble(c: u8, upper_ok: bool) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' if upper_ok => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Exactly `2 * N` hex digits (lower-case only unless `upper_ok`) into `N` bytes.
pub(crate) fn parse_hex<const N: usize>(s: &[u8], upper_ok: bool) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = nibble(s[2 * i], upper_ok)? << 4 | nibble(s[2 * i + 1], upper_ok)?;
    }
    Some(out)
}

/// A valid W3C `traceparent` (Trace Context level 1, §3.2): `version-traceid-parentid-flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Parses a `traceparent` value; `None` for anything the spec says to ignore (then a new trace starts): wrong
/// lengths or separators, upper-case or non-hex digits, version `ff`, all-zero ids, and for version 00 any
/// trailing data. A later version may append `-...` fields, which are ignored.
pub(crate) fn parse_traceparent(v: &[u8]) -> Option<TraceParent> {
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version: [u8; 1] = parse_hex(&v[..2], false)?;
    match version[0] {
        0xff => return None,
        0 if v.len() != 55 => return None,
        _ if v.len() > 55 && v[55] != b'-' => return None,
        _ => {}
    }
    let trace_id: [u8; 16] = parse_hex(&v[3..35], false)?;
    let parent_id: [u8; 8] = parse_hex(&v[36..52], false)?;
    let flags: [u8; 1] = parse_hex(&v[53..55], false)?;
    if trace_id == [0; 16] || parent_id == [0; 8] {
        return None;
    }
    Some(TraceParent {
        trace_id,
        parent_id,
        flags: flags[0],
    })
}

/// `00-<trace>-<span>-<flags>`.
pub(crate) fn format_traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> String {
    let mut s = String::with_capacity(55);
    s.push_str("00-");
    put_hex(&mut s, trace_id);
    s.push('-');
    put_hex(&mut s, span_id);
    s.push_str(if sampled { "-01" } else { "-00" });
    s
}

/// A `tracestate` worth passing on: at most 512 bytes (what the spec asks vendors to keep) of printable ASCII.
/// Anything else is dropped rather than echoed.
pub(crate) fn valid_tracestate(v: &[u8]) -> Option<&str> {
    if v.is_empty() || v.len() > 512 || !v.iter().all(|b| (0x20..0x7f).contains(b)) {
        return None;
    }
    std::str::from_utf8(v).ok()
}

/// B3 trace id: 16 or 32 hex digits (a 64-bit id is the low half of a 128-bit one).
pub(crate) fn parse_b3_trace_id(v: &[u8]) -> Option<[u8; 16]> {
    match v.len() {
        32 => parse_hex::<16>(v, true),
        16 => {
            let low: [u8; 8] = parse_hex(v, true)?;
            let mut id = [0u8; 16];
            id[8..].copy_from_slice(&low);
            Some(id)
        }
        _ => None,
    }
    .filter(|id| *id != [0; 16])
}

pub(crate) fn parse_b3_span_id(v: &[u8]) -> Option<[u8; 8]> {
    parse_hex::<8>(v, true).filter(|id| *id != [0; 8])
}

/// Nanoseconds since the Unix epoch.
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_accepts_the_spec_example() {
        let tp = parse_traceparent(GOOD.as_bytes()).unwrap();
        assert_eq!(hex(&tp.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&tp.parent_id), "00f067aa0ba902b7");
        assert!(tp.sampled());
        assert_eq!(format_traceparent(&tp.trace_id, &tp.parent_id, true), GOOD);
        // A future version may carry more fields.
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-ever";
        assert!(!parse_traceparent(future.as_bytes()).unwrap().sampled());
    }

    #[test]
    fn traceparent_refuses_what_the_spec_says_to_ignore() {
        let bad = [
            "",
            "00",
            &GOOD[..54],
            &format!("{GOOD}0"),
            &format!("{GOOD}-00"),
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0z",
            "00-4bf92f3577b34da6a3ce929d0e0e47\u{e9}-00f067aa0ba902b7-01",
        ];
        for b in bad {
            assert_eq!(parse_traceparent(b.as_bytes()), None, "{b:?}");
        }
    }

    #[test]
    fn b3_ids() {
        assert_eq!(
            parse_b3_trace_id(b"463ac35c9f6413ad").map(|i| hex(&i)),
            Some("0000000000000000463ac35c9f6413ad".into())
        );
        assert!(parse_b3_trace_id(b"463AC35C9F6413AD48485A3953BB6124").is_some());
        for bad in [
            &b"463ac35c9f6413a"[..],
            b"463ac35c9f6413adz",
            b"0000000000000000",
            b"463ac35c9f6413ad463ac35c9f6413ad00",
            b"",
        ] {
            assert_eq!(parse_b3_trace_id(bad), None);
        }
        assert!(parse_b3_span_id(b"a2fb4a1d1a96d312").is_some());
        assert!(parse_b3_span_id(b"a2fb4a1d1a96d31").is_none());
        assert!(parse_b3_span_id(b"0000000000000000").is_none());
    }

    #[test]
    fn tracestate_is_bounded() {
        assert_eq!(
            valid_tracestate(b"congo=t61rcWkgMzE"),
            Some("congo=t61rcWkgMzE")
        );
        assert_eq!(valid_tracestate(&[b'a'; 513]), None);
        assert_eq!(valid_tracestate(b"a=\x01"), None);
    }
}
