//! Request smuggling, differentially: every ambiguous or malformed request is written byte for byte, followed by a
//! pipelined `GET /last`, and an independent origin (httparse plus its own RFC 9112 framing, the way a typical
//! server reads what it is sent) records the requests it parses from the raw bytes on each upstream connection.
//! Either the client gets a 4xx/5xx and the origin no complete request, or the origin parsed exactly the requests
//! the gateway answered, in the same order, with nothing left over. A desync shows as a request the client never
//! asked for (`/smuggled`), a missing one, or stray bytes.
//!
//! Also: the key-auth bypass through `Connection: Content-Length` with a second client on the pooled connection,
//! framing fields an upstream names in its `Connection`, trailers in both directions, and early responses.

use std::sync::Mutex;

use super::*;

/// A request the origin parsed.
#[derive(Debug, Clone)]
pub struct Seen {
    pub conn: usize,
    pub method: String,
    pub path: String,
    /// Names lower-cased, values as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub trailers: Vec<(String, String)>,
}

impl Seen {
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

#[derive(Default)]
struct Log {
    seen: Vec<Seen>,
    bytes: usize,
    conns: usize,
    open: usize,
    /// What an upstream connection held that was not a complete request when it ended.
    leftovers: Vec<String>,
}

/// How the recording origin answers a parsed request.
pub type Answer = Arc<dyn Fn(&Seen) -> Vec<u8> + Send + Sync>;

/// `200` with the request path as the body: the client can tell which request each response answers.
pub fn echo_path(s: &Seen) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}",
        s.path.len(),
        s.path
    )
    .into_bytes()
}

/// An origin that parses what it receives with its own reading of RFC 9112 and records every request.
pub struct Recorder {
    pub addr: SocketAddr,
    log: Arc<Mutex<Log>>,
}

impl Recorder {
    pub fn start(answer: impl Fn(&Seen) -> Vec<u8> + Send + Sync + 'static) -> Recorder {
        let answer: Answer = Arc::new(answer);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Log::default()));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let id = {
                    let mut g = log2.lock().unwrap();
                    g.conns += 1;
                    g.open += 1;
                    g.conns
                };
                let (log, answer) = (log2.clone(), answer.clone());
                std::thread::spawn(move || {
                    let left = record(c, id, &log, &*answer);
                    let mut g = log.lock().unwrap();
                    if let Some(l) = left {
                        g.leftovers.push(format!("conn {id}: {l}"));
                    }
                    g.open -= 1;
                });
            }
        });
        Recorder { addr, log }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().seen.clone()
    }

    pub fn paths(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.path).collect()
    }

    pub fn bytes(&self) -> usize {
        self.log.lock().unwrap().bytes
    }

    pub fn conns(&self) -> usize {
        self.log.lock().unwrap().conns
    }

    pub fn leftovers(&self) -> Vec<String> {
        self.log.lock().unwrap().leftovers.clone()
    }

    /// Waits (bounded) until every upstream connection was closed by the gateway.
    pub fn wait_closed(&self) {
        for _ in 0..500 {
            if self.log.lock().unwrap().open == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("upstream connections still open after 5 s");
    }
}

/// Reads more bytes into `buf`; false at EOF or error.
fn more(c: &mut TcpStream, buf: &mut Vec<u8>, log: &Mutex<Log>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    match c.read(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            log.lock().unwrap().bytes += n;
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// One line ending in CRLF, taken off the front of `buf` (reading more as needed).
fn line(c: &mut TcpStream, buf: &mut Vec<u8>, log: &Mutex<Log>) -> Option<Vec<u8>> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let l = buf[..i].to_vec();
            buf.drain(..i + 2);
            return Some(l);
        }
        if !more(c, buf, log) {
            return None;
        }
    }
}

/// Serves one connection; returns a description of what was left when it ended inside a message.
fn record(
    mut c: TcpStream,
    id: usize,
    log: &Mutex<Log>,
    answer: &(dyn Fn(&Seen) -> Vec<u8> + Send + Sync),
) -> Option<String> {
    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    loop {
        // Head.
        let (method, path, headers, n) = loop {
            let mut slots = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut slots);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let headers: Vec<(String, String)> = req
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    break (
                        req.method.unwrap_or("").to_string(),
                        req.path.unwrap_or("").to_string(),
                        headers,
                        n,
                    );
                }
                Ok(httparse::Status::Partial) => {
                    if !more(&mut c, &mut buf, log) {
                        return (!buf.is_empty())
                            .then(|| format!("partial head {:?}", String::from_utf8_lossy(&buf)));
                    }
                }
                Err(e) => {
                    return Some(format!(
                        "unparsable ({e}): {:?}",
                        String::from_utf8_lossy(&buf)
                    ))
                }
            }
        };
        buf.drain(..n);
        // Framing as a typical origin reads it: Transfer-Encoding wins, then the first Content-Length.
        let te = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
        let cl = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.trim().parse::<usize>().ok());
        let mut body = Vec::new();
        let mut trailers = Vec::new();
        if te {
            loop {
                let Some(size_line) = line(&mut c, &mut buf, log) else {
                    return Some(format!("{path}: closed inside the chunked body"));
                };
                let s = String::from_utf8_lossy(&size_line);
                let hex = s.split(';').next().unwrap_or("").trim();
                let Ok(size) = usize::from_str_radix(hex, 16) else {
                    return Some(format!("{path}: bad chunk size {s:?}"));
                };
                if size == 0 {
                    loop {
                        let Some(t) = line(&mut c, &mut buf, log) else {
                            return Some(format!("{path}: closed inside the trailers"));
                        };
                        if t.is_empty() {
                            break;
                        }
                        let t = String::from_utf8_lossy(&t).into_owned();
                        let (n, v) = t.split_once(':').unwrap_or((&t, ""));
                        trailers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                    break;
                }
                while buf.len() < size + 2 {
                    if !more(&mut c, &mut buf, log) {
                        return Some(format!("{path}: closed inside a chunk"));
                    }
                }
                body.extend_from_slice(&buf[..size]);
                buf.drain(..size + 2);
            }
        } else if let Some(n) = cl {
            while buf.len() < n {
                if !more(&mut c, &mut buf, log) {
                    return Some(format!(
                        "{path}: closed with {} of {n} body bytes",
                        buf.len()
                    ));
                }
            }
            body = buf.drain(..n).collect();
        }
        let seen = Seen {
            conn: id,
            method,
            path,
            headers,
            body,
            trailers,
        };
        let reply = answer(&seen);
        log.lock().unwrap().seen.push(seen);
        if c.write_all(&reply).is_err() {
            return None;
        }
    }
}

/// One response the client read.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub trailers: Vec<(String, String)>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The final responses in `out`, in order (1xx skipped). A response without framing takes the rest; one whose
/// framing is broken ends the list.
pub fn parse_responses(mut out: &[u8]) -> Vec<Resp> {
    let mut v = Vec::new();
    loop {
        let mut slots = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut slots);
        let Ok(httparse::Status::Complete(n)) = r.parse(out) else {
            return v;
        };
        let status = r.code.unwrap_or(0);
        let headers: Vec<(String, String)> = r
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        out = &out[n..];
        if (100..200).contains(&status) {
            continue;
        }
        let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let mut trailers = Vec::new();
        let body = if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            let mut body = Vec::new();
            loop {
                let Some(i) = out.windows(2).position(|w| w == b"\r\n") else {
                    return v;
                };
                let s = String::from_utf8_lossy(&out[..i]).into_owned();
                let Ok(size) = usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16)
                else {
                    return v;
                };
                out = &out[i + 2..];
                if size == 0 {
                    loop {
                        let Some(i) = out.windows(2).position(|w| w == b"\r\n") else {
                            return v;
                        };
                        let t = String::from_utf8_lossy(&out[..i]).into_owned();
                        out = &out[i + 2..];
                        if t.is_empty() {
                            break;
                        }
                        let (n, val) = t.split_once(':').unwrap_or((&t, ""));
                        trailers.push((n.trim().to_ascii_lowercase(), val.trim().to_string()));
                    }
                    break body;
                }
                if out.len() < size + 2 {
                    return v;
                }
                body.extend_from_slice(&out[..size]);
                out = &out[size + 2..];
            }
        } else if let Some(n) = get("content-length").and_then(|v| v.trim().parse::<usize>().ok()) {
            if out.len() < n {
                return v;
            }
            let b = out[..n].to_vec();
            out = &out[n..];
            b
        } else {
            let b = out.to_vec();
            out = &[];
            b
        };
        v.push(Resp {
            status,
            headers,
            body,
            trailers,
        });
    }
}

const H: &str = "Host: a.test\r\n";
/// The pipelined request that ends every forwarded case (and the client connection).
const LAST: &str = "GET /last HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n";
/// What a desync would make the origin see as a request of its own.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: a.test\r\n\r\n";

#[derive(Debug, Clone, Copy)]
enum Want {
    /// The gateway answers this status and closes; the origin receives no byte.
    Refused(u16),
    /// The head was acceptable but the body is not: the client gets this status, the origin at most an incomplete
    /// request (never a complete one).
    BadBody(u16),
    /// The origin parses exactly these requests, and the client gets their answers in this order.
    Forwarded(&'static [&'static str]),
}

type Check = fn(&Seen) -> Result<(), String>;

struct Case {
    what: &'static str,
    raw: Vec<u8>,
    want: Want,
    /// Extra checks on the first request the origin parsed.
    check: Option<Check>,
}

fn case(what: &'static str, raw: String, want: Want) -> Case {
    Case {
        what,
        raw: raw.into_bytes(),
        want,
        check: None,
    }
}

fn checked(what: &'static str, raw: String, want: Want, check: Check) -> Case {
    Case {
        what,
        raw: raw.into_bytes(),
        want,
        check: Some(check),
    }
}

fn chunked(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n0\r\n\r\n", data.len())
}

/// The first request carried `SMUGGLED` as its body, with a matching Content-Length.
fn body_is_smuggled_text(s: &Seen) -> Result<(), String> {
    if s.body != SMUGGLED.as_bytes() {
        return Err(format!("body {:?}", String::from_utf8_lossy(&s.body)));
    }
    Ok(())
}

fn length_and_body(s: &Seen) -> Result<(), String> {
    let cl = s.all("content-length");
    if cl.len() != 1 || cl[0].trim().parse::<usize>().ok() != Some(SMUGGLED.len()) {
        return Err(format!("Content-Length fields {cl:?}"));
    }
    body_is_smuggled_text(s)
}

fn host_is_the_clients(s: &Seen) -> Result<(), String> {
    match s.all("host").as_slice() {
        ["a.test"] => Ok(()),
        other => Err(format!("Host fields {other:?}")),
    }
}

const FORWARDED: Want = Want::Forwarded(&["/c", "/last"]);

fn corpus() -> Vec<Case> {
    let sm = SMUGGLED;
    let n = sm.len();
    let many: Vec<String> = (0..12).map(|i| format!("x-opt-{i}")).collect();
    let many = many.join(", ");
    vec![
        // `Connection` naming what the parser decided: the framing, Host, the forwarding fields.
        checked("Connection: Content-Length", format!("POST /c HTTP/1.1\r\n{H}Connection: Content-Length\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, length_and_body),
        checked("Connection: content-length, lower case, second field", format!("POST /c HTTP/1.1\r\n{H}Connection: keep-alive\r\nconnection: content-length\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, length_and_body),
        checked("Connection: many tokens, then CONTENT-LENGTH", format!("POST /c HTTP/1.1\r\n{H}Connection: {many}, CONTENT-LENGTH\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, length_and_body),
        checked("Connection: Content-Length on a GET with a body", format!("GET /c HTTP/1.1\r\n{H}Content-Length: {n}\r\nConnection: Content-Length\r\n\r\n{sm}{LAST}"), FORWARDED, length_and_body),
        checked("Connection: Transfer-Encoding", format!("POST /c HTTP/1.1\r\n{H}Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n{}{LAST}", chunked(sm)), FORWARDED, body_is_smuggled_text),
        checked("Connection: Host", format!("GET /c HTTP/1.1\r\n{H}Connection: Host\r\n\r\n{LAST}"), FORWARDED, host_is_the_clients),
        checked("Connection: Host, Content-Length, Transfer-Encoding", format!("POST /c HTTP/1.1\r\n{H}Connection: Host, Content-Length, Transfer-Encoding\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, |s| {
            host_is_the_clients(s)?;
            length_and_body(s)
        }),
        checked("Connection: X-Forwarded-For, X-Real-IP", format!("GET /c HTTP/1.1\r\n{H}X-Forwarded-For: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nConnection: X-Forwarded-For, X-Real-IP\r\n\r\n{LAST}"), FORWARDED, |s| {
            // Whatever the client asked, the last X-Forwarded-For element and X-Real-IP are the peer.
            let xff = s.all("x-forwarded-for");
            if xff.len() != 1 || !xff[0].ends_with("127.0.0.1") {
                return Err(format!("X-Forwarded-For {xff:?}"));
            }
            match s.all("x-real-ip").as_slice() {
                ["127.0.0.1"] => Ok(()),
                other => Err(format!("X-Real-IP {other:?}")),
            }
        }),
        checked("Connection: Upgrade, Content-Length on a plain route", format!("POST /c HTTP/1.1\r\n{H}Connection: Upgrade, Content-Length\r\nUpgrade: websocket\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, |s| {
            if !s.all("upgrade").is_empty() || !s.all("connection").is_empty() {
                return Err(format!("hop-by-hop fields reached the origin: {:?}", s.headers));
            }
            length_and_body(s)
        }),
        // The forwarder looks Connection options up only when the parser saw one other than keep-alive/upgrade:
        // an option in a later Connection field, in upper case, or after keep-alive must still drop its field.
        checked("Connection options after keep-alive, in a second field, any case", format!("GET /c HTTP/1.1\r\n{H}Connection: keep-alive\r\nX-Drop-A: 1\r\nKeep-Alive: timeout=5\r\nconnection: Upgrade, X-DROP-A\r\nConnection: KEEP-ALIVE,x-drop-b\r\nX-Drop-B: 2\r\nUpgrade: websocket\r\nX-Keep: 3\r\n\r\n{LAST}"), FORWARDED, |s| {
            for f in ["x-drop-a", "x-drop-b", "keep-alive", "upgrade", "connection"] {
                if !s.all(f).is_empty() {
                    return Err(format!("{f} reached the origin: {:?}", s.headers));
                }
            }
            match s.all("x-keep").as_slice() {
                ["3"] => Ok(()),
                other => Err(format!("X-Keep {other:?}")),
            }
        }),
        checked("Connection: close names a field too", format!("GET /c HTTP/1.1\r\n{H}Close: 1\r\nConnection: Close\r\nX-Keep: 3\r\n\r\n{LAST}"), Want::Forwarded(&["/c"]), |s| {
            if !s.all("close").is_empty() || !s.all("connection").is_empty() {
                return Err(format!("Close reached the origin: {:?}", s.headers));
            }
            match s.all("x-keep").as_slice() {
                ["3"] => Ok(()),
                other => Err(format!("X-Keep {other:?}")),
            }
        }),
        // Well-formed shapes whose framing must survive the trip unchanged.
        checked("body that is a request", format!("POST /c HTTP/1.1\r\n{H}Content-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, length_and_body),
        checked("chunked body that is a request", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n{}{LAST}", chunked(sm)), FORWARDED, body_is_smuggled_text),
        checked("chunked with extensions", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n{n:x};a=b;c=\"d\"\r\n{sm}\r\n0;e\r\n\r\n{LAST}"), FORWARDED, body_is_smuggled_text),
        checked("Transfer-Encoding: CHUNKED", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: CHUNKED\r\n\r\n{}{LAST}", chunked(sm)), FORWARDED, body_is_smuggled_text),
        checked("Content-Length with leading zeros", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 000{n}\r\n\r\n{sm}{LAST}"), FORWARDED, body_is_smuggled_text),
        checked("Content-Length: 0 then a request", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 0\r\n\r\n{LAST}"), FORWARDED, |s| if s.body.is_empty() { Ok(()) } else { Err("body".into()) }),
        checked("Expect: 100-continue", format!("POST /c HTTP/1.1\r\n{H}Expect: 100-continue\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, |s| {
            if !s.all("expect").is_empty() {
                return Err("Expect reached the origin".into());
            }
            length_and_body(s)
        }),
        checked("HTTP/1.0 keep-alive with a body", format!("POST /c HTTP/1.0\r\n{H}Connection: keep-alive, Content-Length\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, length_and_body),
        checked("absolute-form", format!("POST http://a.test/c HTTP/1.1\r\n{H}Content-Length: {n}\r\n\r\n{sm}{LAST}"), FORWARDED, length_and_body),
        checked("trailers naming framing and routing fields", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: {n}\r\nTransfer-Encoding: chunked\r\nHost: evil.test\r\nX-Forwarded-For: 6.6.6.6\r\nAuthorization: Basic Zm9vOmJhcg==\r\nX-Checksum: abc\r\n\r\n{LAST}"), FORWARDED, |s| {
            if s.trailers != [("x-checksum".to_string(), "abc".to_string())] {
                return Err(format!("trailers {:?}", s.trailers));
            }
            Ok(())
        }),
        // Ambiguous framing: refused before anything is forwarded.
        case("CL + TE", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("TE + CL", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("CL + TE named in Connection", format!("POST /c HTTP/1.1\r\n{H}Connection: Transfer-Encoding\r\nContent-Length: {n}\r\nTransfer-Encoding: chunked\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("duplicate CL", format!("POST /c HTTP/1.1\r\n{H}Content-Length: {n}\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("conflicting CL", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 0\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("CL list", format!("POST /c HTTP/1.1\r\n{H}Content-Length: {n}, {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("CL with inner space", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 4 0\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("CL signed", format!("POST /c HTTP/1.1\r\n{H}Content-Length: +{n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("CL hex", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 0x28\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("CL overflow", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 18446744073709551656\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("Content_Length (underscore)", format!("POST /c HTTP/1.1\r\n{H}Content_Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("Transfer_Encoding (underscore)", format!("POST /c HTTP/1.1\r\n{H}Transfer_Encoding: chunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("TE chunked twice", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked, chunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("TE on two lines", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("TE chunked not last", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked, gzip\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("TE identity", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: identity\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("TE identity alone", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: identity\r\n\r\n{sm}{LAST}"), Want::Refused(501)),
        case("TE xchunked", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: xchunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(501)),
        case("TE chunked with a parameter", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked;a=b\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(501)),
        case("TE with vertical tab", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding:\x0bchunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("TE space before colon", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding : chunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("TE obs-fold", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding:\r\n chunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("CL obs-fold", format!("POST /c HTTP/1.1\r\n{H}Content-Length: 0\r\n {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("TE in HTTP/1.0", format!("POST /c HTTP/1.0\r\n{H}Transfer-Encoding: chunked\r\n\r\n{}{LAST}", chunked(sm)), Want::Refused(400)),
        case("bare LF line ends", format!("POST /c HTTP/1.1\n{H}Content-Length: {n}\n\n{sm}{LAST}"), Want::Refused(400)),
        case("bare LF before CL", format!("POST /c HTTP/1.1\r\n{H}X-A: b\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("bare CR before CL", format!("POST /c HTTP/1.1\r\n{H}X-A: b\rContent-Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("NUL in a value", format!("POST /c HTTP/1.1\r\n{H}X-A: a\0b\r\nContent-Length: {n}\r\n\r\n{sm}{LAST}"), Want::Refused(400)),
        case("NUL in the target", format!("GET /c\0/x HTTP/1.1\r\n{H}\r\n{LAST}"), Want::Refused(400)),
        case("two Host fields", format!("GET /c HTTP/1.1\r\n{H}Host: b.test\r\n\r\n{LAST}"), Want::Refused(400)),
        case("absolute-form other host", format!("GET http://b.test/c HTTP/1.1\r\n{H}\r\n{LAST}"), Want::Refused(400)),
        case("space in the target", format!("GET /c HTTP/1.1 /x HTTP/1.1\r\n{H}\r\n{LAST}"), Want::Refused(400)),
        // Acceptable head, broken chunked body: the origin may see the head and part of the body, never a whole
        // request, and the connection to it is not reused.
        case("chunk size not hex", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\nzz\r\n{sm}\r\n0\r\n\r\n{LAST}"), Want::BadBody(400)),
        case("chunk size overflow", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n10000000000000028\r\n{sm}\r\n0\r\n\r\n{LAST}"), Want::BadBody(400)),
        case("chunk size with a sign", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n-28\r\n{sm}\r\n0\r\n\r\n{LAST}"), Want::BadBody(400)),
        case("chunk data longer than its size", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n2\r\n{sm}\r\n0\r\n\r\n{LAST}"), Want::BadBody(400)),
        case("bare LF after the chunk size", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n{n:x}\n{sm}\r\n0\r\n\r\n{LAST}"), Want::BadBody(400)),
        case("bare LF in the trailers", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n0\r\nX-A: b\n\r\n{sm}{LAST}"), Want::BadBody(400)),
        case("trailer without a colon", format!("POST /c HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n0\r\n{sm}{LAST}"), Want::BadBody(400)),
    ]
}

fn run_case(c: &Case) -> Result<(), String> {
    let origin = Recorder::start(echo_path);
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({"retries": 0})),
        ProxyConfig::default(),
    );
    let out = exchange(gw.addr, &c.raw);
    drop(gw);
    origin.wait_closed();
    let resps = parse_responses(&out);
    let seen = origin.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    let text = String::from_utf8_lossy(&out);
    if paths.iter().any(|p| p.contains("smuggled")) {
        return Err(format!("the origin parsed a smuggled request: {paths:?}"));
    }
    match c.want {
        Want::Refused(st) | Want::BadBody(st) => {
            let got: Vec<u16> = resps.iter().map(|r| r.status).collect();
            if got != [st] {
                return Err(format!("want only {st}, got {got:?}: {text:?}"));
            }
            if !seen.is_empty() {
                return Err(format!("the origin parsed requests {paths:?}"));
            }
            if matches!(c.want, Want::Refused(_)) && origin.bytes() != 0 {
                return Err(format!("the origin received {} bytes", origin.bytes()));
            }
            if origin.leftovers().len() > 1 {
                return Err(format!(
                    "more than one upstream message: {:?}",
                    origin.leftovers()
                ));
            }
        }
        Want::Forwarded(want) => {
            let answered: Vec<String> = resps
                .iter()
                .map(|r| format!("{} {}", r.status, String::from_utf8_lossy(&r.body)))
                .collect();
            let want_answers: Vec<String> = want.iter().map(|p| format!("200 {p}")).collect();
            if answered != want_answers {
                return Err(format!(
                    "client got {answered:?}, want {want_answers:?}: {text:?}"
                ));
            }
            if paths != want {
                return Err(format!("the origin parsed {paths:?}, want {want:?}"));
            }
            if !origin.leftovers().is_empty() {
                return Err(format!("stray upstream bytes: {:?}", origin.leftovers()));
            }
            if let Some(check) = c.check {
                check(&seen[0]).map_err(|e| format!("first request: {e}; {:?}", seen[0]))?;
            }
        }
    }
    Ok(())
}

#[test]
fn differential_corpus_origin_parses_exactly_what_the_gateway_answered() {
    let mut wrong = Vec::new();
    let cases = corpus();
    for c in &cases {
        if let Err(e) = run_case(c) {
            wrong.push(format!("{}: {e}", c.what));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

/// Reads one response (head plus Content-Length body) from `c`, or what arrived before EOF / 5 s.
pub fn read_one(c: &mut impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if out.len() >= end + 4 + len {
                return out;
            }
        }
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
    }
}

/// `/public` open, `/admin/*` behind key-auth, one upstream.
pub fn key_auth_routes(origin: SocketAddr) -> Value {
    let up = json!({"nodes": {origin.to_string(): 1}, "retries": 0});
    json!({
        "routes": [
            {"id": "public", "uri": "/public", "upstream": up},
            {"id": "admin", "uri": "/admin/*", "upstream": up, "plugins": {"key-auth": {}}},
        ],
        "consumers": [{"username": "ops", "plugins": {"key-auth": {"key": "the-key"}}}],
    })
}

/// The reported exploit, byte for byte (the smuggled request is 39 bytes).
pub const EXPLOIT: &[u8] = b"POST /public HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\nContent-Length: 39\r\n\r\nGET /admin/secret HTTP/1.1\r\nHost: a\r\n\r\n";

#[test]
fn connection_content_length_cannot_bypass_key_auth_or_poison_the_pool() {
    let origin = Recorder::start(echo_path);
    let gw = Gw::start(key_auth_routes(origin.addr), ProxyConfig::default());
    // The attacker keeps its connection open, so nothing is closed under the pooled upstream connection.
    let mut attacker = TcpStream::connect(gw.addr).unwrap();
    attacker
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    attacker.write_all(EXPLOIT).unwrap();
    let first = read_one(&mut attacker);
    let r = parse_responses(&first);
    assert_eq!(r.len(), 1, "{:?}", String::from_utf8_lossy(&first));
    assert_eq!((r[0].status, &r[0].body[..]), (200, &b"/public"[..]));
    // A victim's request goes out on the pooled upstream connection.
    let mut victim = TcpStream::connect(gw.addr).unwrap();
    victim
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    victim
        .write_all(b"GET /public HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let got = read_one(&mut victim);
    let text = String::from_utf8_lossy(&got);
    assert!(
        !text.contains("secret"),
        "the victim got the smuggled answer: {text}"
    );
    let r = parse_responses(&got);
    assert_eq!(r.len(), 1, "{text}");
    assert_eq!(
        (r[0].status, &r[0].body[..]),
        (200, &b"/public"[..]),
        "{text}"
    );
    drop((attacker, victim, gw));
    origin.wait_closed();
    assert_eq!(origin.paths(), ["/public", "/public"]);
    let seen = origin.seen();
    assert_eq!(seen[0].all("content-length"), ["39"]);
    assert_eq!(seen[0].body, &EXPLOIT[EXPLOIT.len() - 39..]);
    assert!(origin.leftovers().is_empty(), "{:?}", origin.leftovers());
    // The route itself still wants the key.
    let out = exchange(
        Gw::start(key_auth_routes(origin.addr), ProxyConfig::default()).addr,
        b"GET /admin/secret HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status(&out), Some(401));
}

/// Two pipelined GETs on one client connection, the second closing it.
fn two_gets(addr: SocketAddr) -> Vec<u8> {
    exchange(
        addr,
        b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
}

#[test]
fn upstream_connection_option_cannot_remove_the_response_framing() {
    let origin = Recorder::start(|s: &Seen| {
        format!(
            "HTTP/1.1 200 OK\r\nConnection: Content-Length, X-Drop\r\nX-Drop: 1\r\nContent-Length: {}\r\n\r\n{}",
            s.path.len(),
            s.path
        )
        .into_bytes()
    });
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        ProxyConfig::default(),
    );
    let out = two_gets(gw.addr);
    let text = String::from_utf8_lossy(&out);
    let r = parse_responses(&out);
    assert_eq!(r.len(), 2, "{text}");
    for (resp, path) in r.iter().zip(["/one", "/two"]) {
        assert_eq!(resp.body, path.as_bytes(), "{text}");
        assert_eq!(resp.header("content-length"), Some("4"), "{text}");
        assert_eq!(
            resp.header("x-drop"),
            None,
            "other listed fields still stop: {text}"
        );
    }
}

#[test]
fn response_trailers_lose_the_fields_trailers_must_not_carry() {
    let origin = Recorder::start(|_: &Seen| {
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 99\r\nSet-Cookie: a=b\r\nHost: evil\r\nX-Forwarded-For: 1.2.3.4\r\nTransfer-Encoding: chunked\r\nX-Checksum: abc\r\n\r\n".to_vec()
    });
    let gw = Gw::start(
        route_to(json!({origin.addr.to_string(): 1}), json!({})),
        ProxyConfig::default(),
    );
    let out = two_gets(gw.addr);
    let text = String::from_utf8_lossy(&out);
    let r = parse_responses(&out);
    assert_eq!(r.len(), 2, "{text}");
    for resp in &r {
        assert_eq!(resp.body, b"hello", "{text}");
        assert_eq!(
            resp.trailers,
            [("x-checksum".to_string(), "abc".to_string())],
            "{text}"
        );
    }
    drop(gw);
    origin.wait_closed();
    assert_eq!(origin.conns(), 1, "the upstream connection was reused");
    assert_eq!(origin.seen()[1].conn, 1);
    assert_eq!(origin.seen()[0].method, "GET");
}
