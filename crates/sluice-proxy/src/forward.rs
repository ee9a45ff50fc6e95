//! Writing the heads Sluice forwards: the request head to the upstream and the response head to the client.
//!
//! Header names, their case and order are copied byte for byte from what was received; only hop-by-hop fields
//! (RFC 9110 §7.6.1, including those listed in `Connection`) are dropped, `Host` is set per `pass_host`, and the
//! X-Forwarded-* family is added as APISIX's nginx template does. The framing the parser decided (Content-Length,
//! or Transfer-Encoding written fresh) and Host are never removed by a `Connection` option or a plugin edit: see
//! "Smuggling defences" in docs/http-conformance.md.

use bytes::{BufMut, BytesMut};
use sluice_http::{
    connection_tokens, BodyKind, ConnectionTokens, HeaderSpan, RequestHead, ResponseHead, Version,
};
use sluice_plugins::{Edits, RespEdits};

use crate::snapshot::{NodeRt, PassHost};

pub(crate) struct ForwardInfo<'a> {
    pub pass_host: &'a PassHost,
    pub node: &'a NodeRt,
    /// Client address as text (formatted once per connection).
    pub client_ip: &'a [u8],
    pub scheme: &'static [u8],
    /// Lower-cased host without port (APISIX `$host`), for X-Forwarded-Host.
    pub host: Option<&'a str>,
    /// The connection's own lines, formatted once per connection ([`FwdLines`]).
    pub lines: &'a FwdLines,
}

/// The X-Forwarded-* lines that depend only on the connection: written as one copy each per request.
#[derive(Debug)]
pub(crate) struct FwdLines {
    /// `X-Forwarded-For: ip`, `X-Real-IP: ip`, `X-Forwarded-Proto: scheme` (the lines of a request that sent
    /// none of them).
    lead: Box<[u8]>,
    /// `X-Forwarded-Port: port`.
    port: Box<[u8]>,
}

impl FwdLines {
    pub(crate) fn new(client_ip: &[u8], server_port: &[u8], scheme: &[u8]) -> Self {
        let mut lead = BytesMut::with_capacity(96);
        put_header(&mut lead, b"X-Forwarded-For", client_ip);
        put_header(&mut lead, b"X-Real-IP", client_ip);
        put_header(&mut lead, b"X-Forwarded-Proto", scheme);
        let mut port = BytesMut::with_capacity(32);
        put_header(&mut port, b"X-Forwarded-Port", server_port);
        FwdLines {
            lead: lead.to_vec().into_boxed_slice(),
            port: port.to_vec().into_boxed_slice(),
        }
    }
}

pub(crate) fn put_header(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// Field lines forwarded as received, gathered into runs of adjacent lines so a run is one copy. A line joins a
/// run only when its bytes are exactly what [`put_header`] would write (`name: value\r\n`, one space, no
/// trailing whitespace): the output is byte for byte the same as writing every line with `put_header`.
struct Runs<'b> {
    buf: &'b [u8],
    start: usize,
    end: usize,
}

impl<'b> Runs<'b> {
    fn new(buf: &'b [u8]) -> Self {
        Runs {
            buf,
            start: 0,
            end: 0,
        }
    }

    /// Forwards the field line `h` (after whatever was kept before it).
    #[inline]
    fn keep(&mut self, out: &mut BytesMut, h: &HeaderSpan) {
        let (ns, ne) = (h.name.0 as usize, h.name.1 as usize);
        let (vs, ve) = (h.value.0 as usize, h.value.1 as usize);
        let canonical = self.buf.get(ne..vs) == Some(b": ")
            && self.buf.get(ve..ve + 2) == Some(b"\r\n")
            && ns < ne;
        if !canonical {
            self.flush(out);
            let part = |a: usize, b: usize| self.buf.get(a..b).unwrap_or_default();
            return put_header(out, part(ns, ne), part(vs, ve));
        }
        if self.end != ns || self.end == 0 {
            self.flush(out);
            self.start = ns;
        }
        self.end = ve + 2;
    }

    /// Starts the first run with the start line `buf[..at] + tail` when the head has exactly `tail` at `at`.
    fn start_line(&mut self, at: usize, tail: &[u8]) -> bool {
        if self.buf.get(at..at + tail.len()) != Some(tail) {
            return false;
        }
        self.start = 0;
        self.end = at + tail.len();
        true
    }

    /// Writes the pending run; call before writing anything else.
    #[inline]
    fn flush(&mut self, out: &mut BytesMut) {
        if let Some(run) = self.buf.get(self.start..self.end) {
            out.put_slice(run);
        }
        self.start = 0;
        self.end = 0;
    }
}

/// The request head for the upstream, always HTTP/1.1 keep-alive.
pub(crate) fn request_head(
    head: &RequestHead,
    info: &ForwardInfo<'_>,
    edits: Option<&Edits>,
    out: &mut BytesMut,
) {
    let edits = edits.filter(|e| !e.is_empty());
    out.reserve(head.buf.len() + 160);
    let target = head.slice(head.target);
    let mut runs = Runs::new(&head.buf);
    // An origin-form HTTP/1.1 request line no plugin changed goes out as received (`method SP target SP
    // HTTP/1.1 CRLF`, checked byte for byte): it starts the first run of copied lines.
    let copied = edits.is_none_or(|e| e.method.is_none() && e.uri.is_none())
        && target.first() == Some(&b'/')
        && head.method.0 == 0
        && head.target.0 == head.method.1 + 1
        && head.slice((head.method.1, head.target.0)) == b" "
        && runs.start_line(head.target.1 as usize, b" HTTP/1.1\r\n");
    if !copied {
        match edits.and_then(|e| e.method.as_ref()) {
            Some(m) => out.put_slice(m),
            None => out.put_slice(head.slice(head.method)),
        }
        out.put_u8(b' ');
        // Absolute-form targets become origin-form: an origin server is not a proxy (RFC 9112 §3.2.2).
        if let Some(uri) = edits.and_then(|e| e.uri.as_ref()) {
            out.put_slice(uri);
        } else if target.first() == Some(&b'/') || target == b"*" {
            out.put_slice(target);
        } else {
            out.put_slice(head.slice(head.path));
            if let Some(q) = head.query {
                out.put_u8(b'?');
                out.put_slice(head.slice(q));
            }
        }
        out.put_slice(b" HTTP/1.1\r\n");
    }

    let tokens = head
        .connection_options
        .then(|| connection_tokens(&head.buf, &head.headers));
    let mut xff: Option<(usize, usize)> = None; // where the joined X-Forwarded-For value goes
    let (mut has_xfp, mut has_xfh, mut has_xfport, mut wrote_host) = (false, false, false, false);
    let mut wrote_length = false;
    for h in &head.headers {
        let name = head.slice(h.name);
        let value = head.slice(h.value);
        // What the parser decided from these two fields is what goes out: neither a `Connection` option nor a
        // plugin edit can remove them (a dropped Content-Length would turn the body into a second request).
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => {
                runs.flush(out);
                if !wrote_host {
                    write_host(out, name, value, info, edits);
                    wrote_host = true;
                }
                continue;
            }
            // Only present when the body is length-framed (CL with TE is refused by the parser). The length goes
            // out as decided (a plugin's replacement body has its own).
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                runs.flush(out);
                match head.body {
                    BodyKind::Length(n) => {
                        put_header(out, name, fmt_u64(n, &mut itoa_buf()));
                    }
                    _ => put_header(out, name, value),
                }
                wrote_length = true;
                continue;
            }
            _ => {}
        }
        if hop_by_hop(&tokens, name) || name.eq_ignore_ascii_case(b"expect") {
            continue;
        }
        if edits.is_some_and(|e| e.drops(name)) {
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            runs.flush(out);
            // Several X-Forwarded-For fields are one list (RFC 9110 §5.3); keep the first field's position.
            match xff {
                None => {
                    out.put_slice(name);
                    out.put_slice(b": ");
                    let start = out.len();
                    out.put_slice(value);
                    xff = Some((start, out.len()));
                    out.put_slice(b"\r\n");
                }
                Some(_) => {
                    append_xff(out, &mut xff, value);
                }
            }
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-real-ip") {
            continue;
        }
        has_xfp |= name.eq_ignore_ascii_case(b"x-forwarded-proto");
        has_xfh |= name.eq_ignore_ascii_case(b"x-forwarded-host");
        has_xfport |= name.eq_ignore_ascii_case(b"x-forwarded-port");
        runs.keep(out, h);
    }
    runs.flush(out);
    if !wrote_host {
        write_host(out, b"Host", b"", info, edits);
    }
    if let Some(e) = edits {
        for (name, value) in &e.set_headers {
            if !is_owned_request_field(name) {
                put_header(out, name, value);
            }
        }
    }
    match xff {
        None if !has_xfp => out.put_slice(&info.lines.lead),
        Some(_) => append_xff(out, &mut xff, info.client_ip),
        None => put_header(out, b"X-Forwarded-For", info.client_ip),
    }
    if xff.is_some() || has_xfp {
        put_header(out, b"X-Real-IP", info.client_ip);
        if !has_xfp {
            put_header(out, b"X-Forwarded-Proto", info.scheme);
        }
    }
    if !has_xfh {
        if let Some(h) = info.host {
            put_header(out, b"X-Forwarded-Host", h.as_bytes());
        }
    }
    if !has_xfport {
        out.put_slice(&info.lines.port);
    }
    match head.body {
        BodyKind::Chunked => out.put_slice(b"Transfer-Encoding: chunked\r\n"),
        // A body that was chunked (or absent) from the client and replaced by a plugin.
        BodyKind::Length(n) if !wrote_length => {
            put_header(out, b"Content-Length", fmt_u64(n, &mut itoa_buf()))
        }
        _ => {}
    }
    out.put_slice(b"\r\n");
}

/// Whether a field stops at this hop: statically, or listed in `Connection` (`tokens` is only collected when the
/// parser saw a Connection option other than keep-alive/upgrade, whose fields are statically hop-by-hop).
#[inline]
fn hop_by_hop(tokens: &Option<ConnectionTokens>, name: &[u8]) -> bool {
    sluice_http::is_hop_by_hop(name) || tokens.as_ref().is_some_and(|t| t.contains(name))
}

/// Fields Sluice writes itself from what it decided (Host per `pass_host` or a plugin's `host`, the framing, the
/// connection handling): a plugin's header edit naming one is ignored.
fn is_owned_request_field(name: &[u8]) -> bool {
    sluice_http::is_hop_by_hop(name)
        || name.eq_ignore_ascii_case(b"host")
        || name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(b"expect")
}

/// Response fields a plugin's header edit cannot set: the framing and the connection handling are Sluice's.
pub(crate) fn is_owned_response_field(name: &[u8]) -> bool {
    sluice_http::is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"content-length")
}

/// Appends `, value` to the X-Forwarded-For value written at `xff`, shifting what follows it.
fn append_xff(out: &mut BytesMut, xff: &mut Option<(usize, usize)>, value: &[u8]) {
    let Some((start, end)) = *xff else { return };
    let tail = out.split_off(end);
    if end > start {
        out.put_slice(b", ");
    }
    out.put_slice(value);
    let new_end = out.len();
    out.unsplit(tail);
    *xff = Some((start, new_end));
}

fn write_host(
    out: &mut BytesMut,
    name: &[u8],
    client_value: &[u8],
    info: &ForwardInfo<'_>,
    edits: Option<&Edits>,
) {
    if let Some(h) = edits.and_then(|e| e.host.as_ref()) {
        return put_header(out, name, h);
    }
    let value: &[u8] = match info.pass_host {
        PassHost::Pass if !client_value.is_empty() => client_value,
        PassHost::Pass | PassHost::Node => &info.node.host_header,
        PassHost::Rewrite(h) => h,
    };
    put_header(out, name, value);
}

/// How the response body is framed towards the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutFraming {
    None,
    Length,
    Chunked,
    /// Delimited by closing the connection (HTTP/1.0 clients of chunked or read-to-close responses).
    Close,
}

pub(crate) fn out_framing(resp: &ResponseHead, client: Version) -> OutFraming {
    match (resp.body, client) {
        (BodyKind::Empty, _) => OutFraming::None,
        (BodyKind::Length(_), _) => OutFraming::Length,
        (BodyKind::Chunked | BodyKind::Eof, Version::Http11) => OutFraming::Chunked,
        (BodyKind::Chunked | BodyKind::Eof, Version::Http10) => OutFraming::Close,
    }
}

/// The response head for the client. `keep_alive` is whether this connection stays open afterwards.
pub(crate) fn response_head(
    resp: &ResponseHead,
    framing: OutFraming,
    client: Version,
    keep_alive: bool,
    edits: Option<&RespEdits>,
    out: &mut BytesMut,
) {
    let edits = edits.filter(|e| !e.is_empty());
    out.reserve(resp.buf.len() + 64);
    let mut runs = Runs::new(&resp.buf);
    // An HTTP/1.1 status line no plugin changed goes out as received (`HTTP/1.1 SP code SP reason CRLF`, checked
    // byte for byte): it starts the first run of copied lines.
    let status_edit = edits.and_then(|e| e.status);
    let copied = status_edit.is_none()
        && resp.buf.starts_with(b"HTTP/1.1 ")
        && resp.reason.0 == 13
        && resp.buf.get(12) == Some(&b' ')
        && runs.start_line(resp.reason.1 as usize, b"\r\n");
    if !copied {
        out.put_slice(b"HTTP/1.1 ");
        let mut code = itoa_buf();
        // A plugin's new status (response-rewrite `status_code`) goes out with its standard reason phrase.
        match status_edit {
            Some(s) => {
                out.put_slice(fmt_u16(s, &mut code));
                out.put_u8(b' ');
                out.put_slice(sluice_http::status_reason(s).as_bytes());
            }
            None => {
                out.put_slice(fmt_u16(resp.status, &mut code));
                out.put_u8(b' ');
                out.put_slice(resp.slice(resp.reason));
            }
        }
        out.put_slice(b"\r\n");
    }
    let tokens = resp
        .connection_options
        .then(|| connection_tokens(&resp.buf, &resp.headers));
    for h in &resp.headers {
        let name = resp.slice(h.name);
        if name.len() == 14 && name.eq_ignore_ascii_case(b"content-length") {
            // The length the body is framed with goes out whatever the upstream's `Connection` or a plugin says; a
            // re-framed body carries none. Without a body (HEAD, 304) it describes the representation and passes.
            let keep = match framing {
                OutFraming::Length => true,
                OutFraming::None => !edits.is_some_and(|e| e.drops(name)),
                OutFraming::Chunked | OutFraming::Close => false,
            };
            if keep {
                runs.keep(out, h);
            }
            continue;
        }
        if hop_by_hop(&tokens, name) || edits.is_some_and(|e| e.drops(name)) {
            continue;
        }
        runs.keep(out, h);
    }
    runs.flush(out);
    if let Some(e) = edits {
        for (name, value) in e.set_headers.iter().chain(&e.add_headers) {
            if !is_owned_response_field(name) {
                put_header(out, name, value);
            }
        }
    }
    if framing == OutFraming::Chunked {
        out.put_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if !keep_alive {
        out.put_slice(b"Connection: close\r\n");
    } else if client == Version::Http10 {
        out.put_slice(b"Connection: keep-alive\r\n");
    }
    out.put_slice(b"\r\n");
}

pub(crate) fn itoa_buf() -> [u8; 20] {
    [0u8; 20]
}

pub(crate) fn fmt_u16(mut n: u16, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

pub(crate) fn fmt_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(raw: &[u8]) -> ResponseHead {
        let mut b = BytesMut::from(raw);
        sluice_http::parse_response(&mut b, &sluice_http::Limits::default(), false)
            .expect("valid")
            .expect("complete")
    }

    fn written(raw: &[u8]) -> Vec<u8> {
        let r = resp(raw);
        let mut out = BytesMut::new();
        response_head(
            &r,
            out_framing(&r, Version::Http11),
            Version::Http11,
            true,
            None,
            &mut out,
        );
        out.to_vec()
    }

    /// Lines copied in runs come out exactly as `put_header` writes them; lines in any other shape (no space,
    /// two spaces, trailing whitespace, empty values) are rewritten as before, and dropped lines split runs.
    #[test]
    fn response_head_is_byte_for_byte_what_put_header_writes() {
        let got = written(
            b"HTTP/1.1 200 OK\r\nA: 1\r\nB:2\r\nC:  3 \r\nD: \r\nE:\r\nConnection: X-Drop\r\nx-drop: y\r\nF: 6\r\nG: obs-\xff\xfe text\r\nKeep-Alive: timeout=5\r\nH: 8\r\nContent-Length: 2\r\n\r\n",
        );
        let want: &[u8] = b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: \r\nE: \r\nF: 6\r\nG: obs-\xff\xfe text\r\nH: 8\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
        assert_eq!(got, want);
    }

    /// An upstream naming a field in Connection gets it dropped in any case and any Connection line, also after
    /// keep-alive (the lookup is skipped only when nothing but keep-alive/upgrade is listed).
    #[test]
    fn response_connection_options_drop_their_fields() {
        let got = written(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nX-A: 1\r\nconnection: x-a, CLOSE\r\nClose: 1\r\nX-B: 2\r\nContent-Length: 0\r\n\r\n",
        );
        assert_eq!(
            String::from_utf8_lossy(&got),
            "HTTP/1.1 200 OK\r\nX-B: 2\r\nContent-Length: 0\r\n\r\n"
        );
    }
}
