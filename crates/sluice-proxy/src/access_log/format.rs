//! nginx `log_format` strings compiled once into literal and variable segments, and rendered per request into a
//! worker's buffer. Only the variables a format names are ever computed; numbers are written without the `fmt`
//! machinery.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use sluice_http::{RequestHead, Version};

use crate::forward::{fmt_u16, fmt_u64, itoa_buf};

/// nginx's `escape=` parameter of `log_format` (APISIX `access_log_format_escape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// `"`, `\`, control bytes and bytes >= 0x7f as `\xHH`.
    Default,
    /// JSON string escaping.
    Json,
    None,
}

impl Escape {
    pub fn parse(s: &str) -> Result<Escape, String> {
        match s {
            "default" => Ok(Escape::Default),
            "json" => Ok(Escape::Json),
            "none" => Ok(Escape::None),
            o => Err(format!(
                "access_log_format_escape: {o:?} is not one of default, json, none"
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Var {
    RemoteAddr,
    RemotePort,
    RemoteUser,
    TimeLocal,
    TimeIso8601,
    Msec,
    Request,
    RequestMethod,
    RequestUri,
    Uri,
    Args,
    ServerProtocol,
    Scheme,
    Host,
    ServerAddr,
    ServerPort,
    Status,
    BodyBytesSent,
    BytesSent,
    RequestLength,
    RequestTime,
    UpstreamAddr,
    UpstreamStatus,
    UpstreamResponseTime,
    UpstreamScheme,
    UpstreamHost,
    UpstreamUri,
    RequestId,
    Pid,
    /// `$http_<name>`: the request header whose lower-cased name, `-` read as `_`, is `<name>`.
    Http(Box<[u8]>),
    /// `$arg_<name>`: the first query argument of that name (as sent, not decoded).
    Arg(Box<[u8]>),
    /// `$cookie_<name>`.
    Cookie(Box<[u8]>),
}

/// The variables a format may name, for the error message of an unknown one.
const KNOWN: &str = "remote_addr remote_port remote_user time_local time_iso8601 msec request request_method \
request_uri uri document_uri args query_string server_protocol scheme host server_addr server_port status \
body_bytes_sent bytes_sent request_length request_time upstream_addr upstream_status upstream_response_time \
upstream_scheme upstream_host upstream_uri request_id apisix_request_id pid http_<header> arg_<name> cookie_<name>";

fn var(name: &str) -> Option<Var> {
    Some(match name {
        "remote_addr" => Var::RemoteAddr,
        "remote_port" => Var::RemotePort,
        "remote_user" => Var::RemoteUser,
        "time_local" => Var::TimeLocal,
        "time_iso8601" => Var::TimeIso8601,
        "msec" => Var::Msec,
        "request" => Var::Request,
        "request_method" => Var::RequestMethod,
        "request_uri" => Var::RequestUri,
        "uri" | "document_uri" => Var::Uri,
        "args" | "query_string" => Var::Args,
        "server_protocol" => Var::ServerProtocol,
        "scheme" => Var::Scheme,
        "host" => Var::Host,
        "server_addr" => Var::ServerAddr,
        "server_port" => Var::ServerPort,
        "status" => Var::Status,
        "body_bytes_sent" => Var::BodyBytesSent,
        "bytes_sent" => Var::BytesSent,
        "request_length" => Var::RequestLength,
        "request_time" => Var::RequestTime,
        "upstream_addr" => Var::UpstreamAddr,
        "upstream_status" => Var::UpstreamStatus,
        "upstream_response_time" => Var::UpstreamResponseTime,
        "upstream_scheme" => Var::UpstreamScheme,
        "upstream_host" => Var::UpstreamHost,
        "upstream_uri" => Var::UpstreamUri,
        "request_id" | "apisix_request_id" => Var::RequestId,
        "pid" => Var::Pid,
        _ => {
            let sub = |p: &str| {
                name.strip_prefix(p)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.as_bytes().into())
            };
            if let Some(h) = sub("http_") {
                Var::Http(h)
            } else if let Some(a) = sub("arg_") {
                Var::Arg(a)
            } else if let Some(c) = sub("cookie_") {
                Var::Cookie(c)
            } else {
                return None;
            }
        }
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Lit(Box<[u8]>),
    Var(Var),
}

/// A compiled `log_format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    segs: Box<[Seg]>,
    escape: Escape,
}

/// One upstream attempt, for `$upstream_addr`, `$upstream_status` and `$upstream_response_time` (nginx lists
/// every attempt, comma-separated).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Try {
    pub addr: SocketAddr,
    /// The upstream's status; as nginx, 502 (504 after a timeout) when no response head arrived.
    pub status: u16,
    pub time: Duration,
}

/// What the upstream was sent, when the request was proxied.
pub(crate) struct Upstream<'a> {
    pub scheme: &'static str,
    pub host: &'a [u8],
    /// The request target as sent upstream (proxy-rewrite's `uri` when it set one).
    pub uri: Option<&'a Bytes>,
}

/// Everything a line may show about one request.
pub(crate) struct Line<'a> {
    pub peer: SocketAddr,
    pub client_ip: &'a str,
    pub local: SocketAddr,
    pub scheme: &'static str,
    pub h2: bool,
    /// `None` for a request whose head could not be read (400, 408, 414, 431...).
    pub head: Option<&'a RequestHead>,
    pub status: u16,
    pub bytes_sent: u64,
    pub body_bytes_sent: u64,
    pub request_length: u64,
    pub request_time: Duration,
    pub tries: &'a [Try],
    pub upstream: Option<Upstream<'a>>,
}

impl Format {
    /// Compiles `fmt`; an unknown or malformed `$variable` is refused, as nginx refuses to start.
    pub fn compile(fmt: &str, escape: Escape) -> Result<Format, String> {
        let mut segs = Vec::new();
        let mut lit: Vec<u8> = Vec::new();
        let b = fmt.as_bytes();
        let name_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'$' {
                lit.push(b[i]);
                i += 1;
                continue;
            }
            let (start, end, next) = if b.get(i + 1) == Some(&b'{') {
                let close = b[i + 2..]
                    .iter()
                    .position(|&c| c == b'}')
                    .ok_or_else(|| format!("access_log_format: unclosed \"${{\" at byte {i}"))?;
                (i + 2, i + 2 + close, i + 3 + close)
            } else {
                let n = b[i + 1..].iter().take_while(|&&c| name_char(c)).count();
                (i + 1, i + 1 + n, i + 1 + n)
            };
            let name = &fmt[start..end];
            if name.is_empty() || !name.bytes().all(name_char) {
                return Err(format!(
                    "access_log_format: invalid variable name {name:?} at byte {i}"
                ));
            }
            let v = var(name).ok_or_else(|| {
                format!("access_log_format: unknown variable \"${name}\" (known: {KNOWN})")
            })?;
            if !lit.is_empty() {
                segs.push(Seg::Lit(std::mem::take(&mut lit).into()));
            }
            segs.push(Seg::Var(v));
            i = next;
        }
        if !lit.is_empty() {
            segs.push(Seg::Lit(lit.into()));
        }
        Ok(Format {
            segs: segs.into(),
            escape,
        })
    }

    /// Appends one line (with its newline) to `out`.
    pub(crate) fn render(&self, l: &Line<'_>, out: &mut Vec<u8>) {
        let mut n = itoa_buf();
        for seg in self.segs.iter() {
            let v = match seg {
                Seg::Lit(s) => {
                    out.extend_from_slice(s);
                    continue;
                }
                Seg::Var(v) => v,
            };
            let head = l.head;
            match v {
                Var::RemoteAddr => self.put(out, l.client_ip.as_bytes()),
                Var::RemotePort => out.extend_from_slice(fmt_u16(l.peer.port(), &mut n)),
                Var::RemoteUser => match head.and_then(remote_user) {
                    Some(u) => self.put(out, &u),
                    None => out.push(b'-'),
                },
                Var::TimeLocal => time_local(out),
                Var::TimeIso8601 => time_iso8601(out),
                Var::Msec => {
                    let d = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    secs_millis(out, d.as_secs(), d.subsec_millis());
                }
                Var::Request => match head {
                    Some(h) => {
                        self.put(out, h.slice(h.method));
                        out.push(b' ');
                        self.put(out, h.slice(h.target));
                        out.push(b' ');
                        out.extend_from_slice(protocol(h, l.h2).as_bytes());
                    }
                    None => out.push(b'-'),
                },
                Var::RequestMethod => self.opt(out, head.map(|h| h.slice(h.method))),
                Var::RequestUri => self.opt(out, head.map(|h| h.slice(h.target))),
                Var::Uri => self.opt(out, head.map(|h| h.slice(h.path))),
                Var::Args => self.opt(out, head.and_then(|h| h.query.map(|q| h.slice(q)))),
                Var::ServerProtocol => match head {
                    Some(h) => out.extend_from_slice(protocol(h, l.h2).as_bytes()),
                    None => out.push(b'-'),
                },
                Var::Scheme => out.extend_from_slice(l.scheme.as_bytes()),
                Var::Host => match head.and_then(|h| h.host.map(|s| h.slice(s))) {
                    Some(h) => {
                        let h = host_only(h);
                        let start = out.len();
                        self.put(out, h);
                        out[start..].make_ascii_lowercase();
                    }
                    None => put_ip(out, l.local.ip()),
                },
                Var::ServerAddr => put_ip(out, l.local.ip()),
                Var::ServerPort => out.extend_from_slice(fmt_u16(l.local.port(), &mut n)),
                Var::Status => out.extend_from_slice(fmt_u16(l.status, &mut n)),
                Var::BodyBytesSent => out.extend_from_slice(fmt_u64(l.body_bytes_sent, &mut n)),
                Var::BytesSent => out.extend_from_slice(fmt_u64(l.bytes_sent, &mut n)),
                Var::RequestLength => out.extend_from_slice(fmt_u64(l.request_length, &mut n)),
                Var::RequestTime => {
                    let t = l.request_time;
                    secs_millis(out, t.as_secs(), t.subsec_millis());
                }
                Var::UpstreamAddr => self.tries(out, l.tries, |out, t| put_addr(out, t.addr)),
                Var::UpstreamStatus => self.tries(out, l.tries, |out, t| {
                    let mut n = itoa_buf();
                    out.extend_from_slice(fmt_u16(t.status, &mut n));
                }),
                Var::UpstreamResponseTime => self.tries(out, l.tries, |out, t| {
                    secs_millis(out, t.time.as_secs(), t.time.subsec_millis());
                }),
                // Unproxied requests show what APISIX's location presets: `http`, `$http_host` and "".
                Var::UpstreamScheme => out
                    .extend_from_slice(l.upstream.as_ref().map_or("http", |u| u.scheme).as_bytes()),
                Var::UpstreamHost => match &l.upstream {
                    Some(u) => self.put(out, u.host),
                    None => self.opt(out, head.and_then(|h| h.header("host"))),
                },
                Var::UpstreamUri => match (&l.upstream, head) {
                    (Some(u), _) if u.uri.is_some() => {
                        self.put(out, u.uri.map_or(&b""[..], |b| &b[..]))
                    }
                    (Some(_), Some(h)) => {
                        self.put(out, h.slice(h.path));
                        if let Some(q) = h.query {
                            out.push(b'?');
                            self.put(out, h.slice(q));
                        }
                    }
                    _ => {}
                },
                Var::RequestId => {
                    let id: u128 = rand::random();
                    let _ = write!(out, "{id:032x}");
                }
                Var::Pid => {
                    let _ = write!(out, "{}", std::process::id());
                }
                Var::Http(name) => self.opt(out, head.and_then(|h| header(h, name))),
                Var::Arg(name) => self.opt(out, head.and_then(|h| arg(h, name))),
                Var::Cookie(name) => self.opt(out, head.and_then(|h| cookie(h, name))),
            }
        }
        out.push(b'\n');
    }

    fn opt(&self, out: &mut Vec<u8>, v: Option<&[u8]>) {
        match v {
            Some(v) => self.put(out, v),
            None => out.push(b'-'),
        }
    }

    fn tries(&self, out: &mut Vec<u8>, tries: &[Try], f: impl Fn(&mut Vec<u8>, &Try)) {
        if tries.is_empty() {
            out.push(b'-');
        }
        for (i, t) in tries.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b", ");
            }
            f(out, t);
        }
    }

    /// Appends a variable's value, escaped as configured.
    fn put(&self, out: &mut Vec<u8>, v: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        match self.escape {
            Escape::None => out.extend_from_slice(v),
            Escape::Default => {
                // One pass: clean runs are copied whole, each other byte becomes `\xHH`.
                let mut from = 0;
                for (i, &c) in v.iter().enumerate() {
                    if !CLEAN[c as usize] {
                        out.extend_from_slice(&v[from..i]);
                        out.extend_from_slice(&[
                            b'\\',
                            b'x',
                            HEX[(c >> 4) as usize],
                            HEX[(c & 15) as usize],
                        ]);
                        from = i + 1;
                    }
                }
                out.extend_from_slice(&v[from..]);
            }
            Escape::Json => {
                for &c in v {
                    match c {
                        b'"' => out.extend_from_slice(b"\\\""),
                        b'\\' => out.extend_from_slice(b"\\\\"),
                        b'\n' => out.extend_from_slice(b"\\n"),
                        b'\r' => out.extend_from_slice(b"\\r"),
                        b'\t' => out.extend_from_slice(b"\\t"),
                        0x08 => out.extend_from_slice(b"\\b"),
                        0x0c => out.extend_from_slice(b"\\f"),
                        c if c < 0x20 => out.extend_from_slice(&[
                            b'\\',
                            b'u',
                            b'0',
                            b'0',
                            HEX[(c >> 4) as usize],
                            HEX[(c & 15) as usize],
                        ]),
                        c => out.push(c),
                    }
                }
            }
        }
    }
}

/// Bytes nginx's default escaping leaves alone: printable ASCII except `"` and `\`.
const CLEAN: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0x20;
    while c < 0x7f {
        t[c] = c != b'"' as usize && c != b'\\' as usize;
        c += 1;
    }
    t
};

/// An address as text without the `fmt` machinery for IPv4, the common case (`Display` measured ~1.3k
/// instructions per call).
fn put_addr(out: &mut Vec<u8>, a: SocketAddr) {
    let mut n = itoa_buf();
    match a {
        SocketAddr::V4(v4) => {
            put_ip(out, std::net::IpAddr::V4(*v4.ip()));
            out.push(b':');
        }
        SocketAddr::V6(v6) => {
            let _ = write!(out, "[{}]:", v6.ip());
        }
    }
    out.extend_from_slice(fmt_u16(a.port(), &mut n));
}

fn put_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mut n = itoa_buf();
            for (i, o) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(fmt_u16(o as u16, &mut n));
            }
        }
        std::net::IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

fn protocol(h: &RequestHead, h2: bool) -> &'static str {
    match (h2, h.version) {
        (true, _) => "HTTP/2.0",
        (false, Version::Http11) => "HTTP/1.1",
        (false, Version::Http10) => "HTTP/1.0",
    }
}

/// `secs.mmm`, nginx's `$request_time` shape.
fn secs_millis(out: &mut Vec<u8>, secs: u64, millis: u32) {
    let mut n = itoa_buf();
    out.extend_from_slice(fmt_u64(secs, &mut n));
    out.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
    ]);
}

/// `06/Nov/1994:08:49:37 +0000`, rearranged from the thread's cached `Date:` value (`Sun, 06 Nov 1994 08:49:37
/// GMT`): no calendar arithmetic per request. Sluice logs UTC.
pub(crate) fn time_local(out: &mut Vec<u8>) {
    let d = sluice_http::date::now();
    out.extend_from_slice(&d[5..7]);
    out.push(b'/');
    out.extend_from_slice(&d[8..11]);
    out.push(b'/');
    out.extend_from_slice(&d[12..16]);
    out.push(b':');
    out.extend_from_slice(&d[17..25]);
    out.extend_from_slice(b" +0000");
}

/// `1994-11-06T08:49:37+00:00`.
fn time_iso8601(out: &mut Vec<u8>) {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let d = sluice_http::date::now();
    let m = MONTHS.iter().position(|m| m[..] == d[8..11]).unwrap_or(0) + 1;
    out.extend_from_slice(&d[12..16]);
    out.extend_from_slice(&[b'-', b'0' + (m / 10) as u8, b'0' + (m % 10) as u8, b'-']);
    out.extend_from_slice(&d[5..7]);
    out.push(b'T');
    out.extend_from_slice(&d[17..25]);
    out.extend_from_slice(b"+00:00");
}

/// The Host value without its port (`[::1]:80` keeps its brackets).
fn host_only(h: &[u8]) -> &[u8] {
    if h.first() == Some(&b'[') {
        return h.iter().position(|&c| c == b']').map_or(h, |e| &h[..=e]);
    }
    h.iter().position(|&c| c == b':').map_or(h, |e| &h[..e])
}

/// nginx's `$http_` lookup: header names compare lower-cased with `-` read as `_`.
fn header<'h>(h: &'h RequestHead, name: &[u8]) -> Option<&'h [u8]> {
    h.headers_iter()
        .find(|(n, _)| {
            n.len() == name.len()
                && n.iter().zip(name).all(|(&a, &b)| {
                    let a = if a == b'-' {
                        b'_'
                    } else {
                        a.to_ascii_lowercase()
                    };
                    a == b.to_ascii_lowercase()
                })
        })
        .map(|(_, v)| v)
}

fn arg<'h>(h: &'h RequestHead, name: &[u8]) -> Option<&'h [u8]> {
    let q = h.slice(h.query?);
    q.split(|&c| c == b'&').find_map(|kv| {
        let (k, v) = match kv.iter().position(|&c| c == b'=') {
            Some(i) => (&kv[..i], &kv[i + 1..]),
            None => (kv, &b""[..]),
        };
        k.eq_ignore_ascii_case(name).then_some(v)
    })
}

fn cookie<'h>(h: &'h RequestHead, name: &[u8]) -> Option<&'h [u8]> {
    h.headers_iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(b"cookie"))
        .flat_map(|(_, v)| v.split(|&c| c == b';'))
        .find_map(|kv| {
            let kv = kv.trim_ascii();
            let i = kv.iter().position(|&c| c == b'=')?;
            (&kv[..i] == name).then_some(&kv[i + 1..])
        })
}

/// The user of `Authorization: Basic`, as nginx's `$remote_user`.
fn remote_user(h: &RequestHead) -> Option<Vec<u8>> {
    use base64::Engine;
    let v = h.header("authorization")?;
    let b64 = v
        .get(..6)
        .filter(|s| s.eq_ignore_ascii_case(b"basic "))
        .map(|_| v[6..].trim_ascii())?;
    let mut dec = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let colon = dec.iter().position(|&c| c == b':')?;
    dec.truncate(colon);
    Some(dec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[u8]) -> RequestHead {
        let mut b = bytes::BytesMut::from(raw);
        sluice_http::parse_request(&mut b, &sluice_http::Limits::default())
            .unwrap()
            .unwrap()
    }

    fn line<'a>(h: Option<&'a RequestHead>, tries: &'a [Try]) -> Line<'a> {
        Line {
            peer: "10.1.2.3:5555".parse().unwrap(),
            client_ip: "10.1.2.3",
            local: "127.0.0.1:9080".parse().unwrap(),
            scheme: "http",
            h2: false,
            head: h,
            status: 200,
            bytes_sent: 150,
            body_bytes_sent: 100,
            request_length: 80,
            request_time: Duration::from_micros(3_456),
            tries,
            upstream: None,
        }
    }

    fn render_raw(fmt: &str, esc: Escape, l: &Line<'_>) -> Vec<u8> {
        let f = Format::compile(fmt, esc).unwrap();
        let mut out = Vec::new();
        f.render(l, &mut out);
        out
    }

    fn render(fmt: &str, esc: Escape, l: &Line<'_>) -> String {
        String::from_utf8(render_raw(fmt, esc, l)).unwrap()
    }

    #[test]
    fn default_format_for_a_proxied_request() {
        let h = head(b"GET /a?b=1 HTTP/1.1\r\nHost: Example.com:9080\r\nUser-Agent: curl/8\r\nAuthorization: Basic dXNlcjpwYXNz\r\n\r\n");
        let tries = [
            Try {
                addr: "127.0.0.1:1980".parse().unwrap(),
                status: 502,
                time: Duration::from_millis(1),
            },
            Try {
                addr: "127.0.0.1:1981".parse().unwrap(),
                status: 200,
                time: Duration::from_millis(2),
            },
        ];
        let mut l = line(Some(&h), &tries);
        l.upstream = Some(Upstream {
            scheme: "http",
            host: b"Example.com:9080",
            uri: None,
        });
        let s = render(
            &sluice_model::NodeConfig::default()
                .nginx_config
                .http
                .access_log_format,
            Escape::Default,
            &l,
        );
        let (before, after) = s.split_once(" [").unwrap();
        assert_eq!(before, "10.1.2.3 - user");
        let after = &after[after.find(']').unwrap()..];
        assert_eq!(
            after,
            "] Example.com:9080 \"GET /a?b=1 HTTP/1.1\" 200 100 0.003 \"-\" \"curl/8\" 127.0.0.1:1980, 127.0.0.1:1981 502, 200 0.001, 0.002 \"http://Example.com:9080/a?b=1\"\n"
        );
    }

    #[test]
    fn addresses_as_display_writes_them() {
        for a in [
            "10.0.0.1:80",
            "255.255.255.255:65535",
            "0.0.0.0:0",
            "[::1]:8080",
            "[2001:db8::2]:1",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let mut out = Vec::new();
            put_addr(&mut out, a);
            assert_eq!(String::from_utf8(out).unwrap(), a.to_string());
            let mut out = Vec::new();
            put_ip(&mut out, a.ip());
            assert_eq!(String::from_utf8(out).unwrap(), a.ip().to_string());
        }
    }

    #[test]
    fn time_local_shape() {
        let s = render(
            "$time_local|$time_iso8601",
            Escape::Default,
            &line(None, &[]),
        );
        let (local, iso) = s.trim_end().split_once('|').unwrap();
        assert_eq!(local.len(), 26, "{local}");
        assert!(local.ends_with(" +0000") && &local[2..3] == "/" && &local[6..7] == "/");
        assert_eq!(iso.len(), 25, "{iso}");
        assert!(iso.ends_with("+00:00") && &iso[10..11] == "T");
    }

    #[test]
    fn unparsed_request_and_unproxied_upstream_vars() {
        let s = render(
            "\"$request\" $status $upstream_addr \"$upstream_scheme://$upstream_host$upstream_uri\" $http_host",
            Escape::Default,
            &line(None, &[]),
        );
        assert_eq!(s, "\"-\" 200 - \"http://-\" -\n");
    }

    #[test]
    fn escapes_client_bytes() {
        let h = head(b"GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: x\"y\\z\x80\xff\r\n\r\n");
        let l = line(Some(&h), &[]);
        assert_eq!(
            render("$http_user_agent", Escape::Default, &l),
            "x\\x22y\\x5Cz\\x80\\xFF\n"
        );
        assert_eq!(
            render_raw("$http_user_agent", Escape::Json, &l),
            b"x\\\"y\\\\z\x80\xff\n"
        );
        assert_eq!(
            render_raw("$http_user_agent", Escape::None, &l),
            b"x\"y\\z\x80\xff\n"
        );
        // Literals are the operator's: never escaped.
        assert_eq!(render("\"$status\"", Escape::Default, &l), "\"200\"\n");
    }

    #[test]
    fn custom_variables() {
        let h = head(b"POST /p/q?x=1&Name=v HTTP/1.0\r\nHost: H\r\nX-Trace-Id: t1\r\nCookie: a=1; sid=abc\r\n\r\n");
        let l = line(Some(&h), &[]);
        assert_eq!(
            render(
                "${request_method} $uri $args $arg_name $cookie_sid $http_x_trace_id $host $server_protocol $remote_port $server_port $bytes_sent $request_length",
                Escape::Default,
                &l
            ),
            "POST /p/q x=1&Name=v v abc t1 h HTTP/1.0 5555 9080 150 80\n"
        );
    }

    #[test]
    fn refuses_unknown_and_malformed_variables() {
        let e = Format::compile("$nope", Escape::Default).unwrap_err();
        assert!(e.contains("unknown variable \"$nope\""), "{e}");
        assert!(Format::compile("a $ b", Escape::Default).is_err());
        assert!(Format::compile("${status", Escape::Default).is_err());
        assert!(Format::compile("$http_", Escape::Default).is_err());
        assert!(Escape::parse("xml").is_err());
    }
}
