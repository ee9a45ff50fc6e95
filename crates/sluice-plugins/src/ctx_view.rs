//! The request as routing, balancing and plugins see it: a borrowed view over the parsed head plus the
//! connection facts. Variables are answered by `match` on the compiled [`Var`], never by a string-keyed map; only
//! the rarely used ones (cookies, the peer address as text) allocate.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use sluice_http::uri::{self, UriError};
use sluice_http::RequestHead;
use sluice_router::{MatchRequest, Var};

pub struct ReqView<'a> {
    pub head: &'a RequestHead,
    /// nginx's `$uri`: the path percent-decoded once, slashes merged, dot segments resolved
    /// (`sluice_http::uri::normalize`), and with `normalize_uri_like_servlet` also cut of `;` parameters. Routing,
    /// the `uri` variable and plugins see this; the original bytes are what is forwarded. Borrowed from the head on
    /// the fast path (a path with nothing to normalise).
    pub uri: Cow<'a, str>,
    /// Host without port, lower-cased (borrowed when it already is).
    pub host: Option<Cow<'a, str>>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub scheme: &'static str,
    /// The peer IP as text, formatted once per connection by the proxy: `remote_addr` is the most used key of
    /// limit-* plugins and chash, and formatting it per request costs more than the rest of limit-count.
    pub peer_text: Option<&'a str>,
}

impl<'a> ReqView<'a> {
    /// Lends the connection's formatted peer IP (see `peer_text`).
    pub fn with_peer_text(mut self, text: &'a str) -> Self {
        self.peer_text = Some(text);
        self
    }

    /// The view of a parsed head. Fails (the request gets 400, as from nginx) when its path cannot be normalised:
    /// a bad or NUL escape, or `..` above the root.
    pub fn new(
        head: &'a RequestHead,
        peer: SocketAddr,
        local: SocketAddr,
        scheme: &'static str,
    ) -> Result<Self, UriError> {
        let host = head.host_str().map(host_of);
        Self::with_host(head, peer, local, scheme, host)
    }

    /// [`ReqView::new`] with the host already worked out: `host` must be `head.host_str().map(host_of)` (the
    /// proxy takes it from the connection's [`HostMemo`]).
    pub fn with_host(
        head: &'a RequestHead,
        peer: SocketAddr,
        local: SocketAddr,
        scheme: &'static str,
        host: Option<Cow<'a, str>>,
    ) -> Result<Self, UriError> {
        let uri = uri::normalize(head.path_str())?;
        Ok(ReqView {
            head,
            uri,
            host,
            peer,
            local,
            scheme,
            peer_text: None,
        })
    }

    /// APISIX's `normalize_uri_like_servlet` on top: `/admin;jsessionid=x` routes as `/admin`.
    pub fn like_servlet(mut self) -> Result<Self, UriError> {
        if let Cow::Owned(s) = uri::servlet(&self.uri)? {
            self.uri = Cow::Owned(s);
        }
        Ok(self)
    }

    /// APISIX's `request_uri`: the normalised `uri` plus `?args` (the original is the raw target).
    pub fn request_uri(&self) -> Cow<'_, str> {
        let target = self.head.target_str();
        match (&self.uri, self.head.query_str()) {
            (Cow::Borrowed(_), _) if target.starts_with('/') => Cow::Borrowed(target),
            (u, Some(q)) => Cow::Owned(format!("{u}?{q}")),
            (u, None) => Cow::Borrowed(u),
        }
    }

    fn header_str(&self, lower: &str) -> Option<&str> {
        self.head
            .header(lower)
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.head
            .headers_iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(b"cookie"))
            .filter_map(|(_, v)| std::str::from_utf8(v).ok())
            .flat_map(|v| v.split(';'))
            .find_map(|kv| {
                let (k, v) = kv.trim().split_once('=')?;
                (k == name).then_some(v)
            })
    }

    /// A variable's value as an owned string (for plugins that keep it past the borrow).
    pub fn var_owned(&self, var: &Var) -> Option<String> {
        MatchRequest::var(self, var).map(|v| v.into_owned())
    }

    pub fn arg(&self, name: &str) -> Option<&str> {
        self.head.query_str()?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then_some(v)
        })
    }
}

/// The host as routing and plugins see it ([`ReqView::host`]) from the Host as sent: the port cut, lower-cased
/// (borrowed when it already is).
pub fn host_of(h: &str) -> Cow<'_, str> {
    let h = strip_port(h);
    if h.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(h.to_ascii_lowercase())
    } else {
        Cow::Borrowed(h)
    }
}

/// A connection's last Host as sent and as [`ReqView::host`] holds it. The requests of a keep-alive connection
/// nearly always send the same Host: comparing its bytes with the previous request's is cheaper than checking
/// them as UTF-8, cutting the port and looking for upper case again. A different Host is worked out as
/// [`ReqView::new`] does and remembered instead (one allocation).
#[derive(Debug, Clone, Default)]
pub struct HostMemo(Option<std::rc::Rc<HostText>>);

/// One Host: the bytes as sent and `host_of` of them.
#[derive(Debug)]
pub struct HostText {
    raw: Box<[u8]>,
    text: Box<str>,
}

impl HostText {
    /// The host for [`ReqView::with_host`].
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl HostMemo {
    /// The host of a request whose Host (as sent) is `raw`.
    pub fn get(&mut self, raw: &[u8]) -> std::rc::Rc<HostText> {
        if let Some(m) = &self.0 {
            if *m.raw == *raw {
                return m.clone();
            }
        }
        // As `RequestHead::host_str` reads a span: "" when it is not UTF-8 (the parser admits none such).
        let text = host_of(std::str::from_utf8(raw).unwrap_or_default());
        let m = std::rc::Rc::new(HostText {
            raw: raw.into(),
            text: text.into(),
        });
        self.0 = Some(m.clone());
        m
    }
}

/// `example.com:8080` -> `example.com`; `[::1]:80` -> `[::1]`.
fn strip_port(h: &str) -> &str {
    let b = h.as_bytes();
    if b.first() == Some(&b'[') {
        return b.iter().position(|&c| c == b']').map_or(h, |i| &h[..=i]);
    }
    // A byte scan (the host is ASCII after the parser's check; `:` is never inside a UTF-8 sequence anyway):
    // `rsplit_once` runs the general string searcher, several times this for a short host.
    b.iter().rposition(|&c| c == b':').map_or(h, |i| &h[..i])
}

impl MatchRequest for ReqView<'_> {
    fn path(&self) -> &str {
        &self.uri
    }
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
    fn method(&self) -> &str {
        self.head.method_str()
    }
    fn remote_addr(&self) -> IpAddr {
        self.peer.ip()
    }
    fn var(&self, var: &Var) -> Option<Cow<'_, str>> {
        match var {
            Var::Uri => Some(Cow::Borrowed(&self.uri)),
            Var::RequestUri => Some(self.request_uri()),
            Var::Host => self.host.as_deref().map(Cow::Borrowed),
            Var::RemoteAddr => Some(match self.peer_text {
                Some(t) => Cow::Borrowed(t),
                None => Cow::Owned(self.peer.ip().to_string()),
            }),
            Var::RemotePort => Some(Cow::Owned(self.peer.port().to_string())),
            Var::ServerPort => Some(Cow::Owned(self.local.port().to_string())),
            Var::RequestMethod => Some(Cow::Borrowed(self.head.method_str())),
            Var::Scheme => Some(Cow::Borrowed(self.scheme)),
            Var::Args => self.head.query_str().map(Cow::Borrowed),
            Var::Arg(name) => self.arg(name).map(Cow::Borrowed),
            Var::Http(name) => self.header_str(name).map(Cow::Borrowed),
            Var::Cookie(name) => self.cookie(name).map(Cow::Borrowed),
            Var::Other(name) => match name.as_ref() {
                "server_addr" => Some(Cow::Owned(self.local.ip().to_string())),
                "server_protocol" => Some(Cow::Borrowed(match self.head.version {
                    sluice_http::Version::Http10 => "HTTP/1.0",
                    sluice_http::Version::Http11 => "HTTP/1.1",
                })),
                "http_host" => self.head.host_str().map(Cow::Borrowed),
                _ => None,
            },
        }
    }
    fn var_has(&self, var: &Var, item: &str) -> bool {
        match var {
            Var::Http(name) => self
                .head
                .headers_iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
                .any(|(_, v)| v == item.as_bytes()),
            _ => self.var(var).as_deref() == Some(item),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::strip_port;

    #[test]
    fn strips_ports() {
        assert_eq!(strip_port("a.com:80"), "a.com");
        assert_eq!(strip_port("a.com"), "a.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
    }
}

#[cfg(test)]
mod host_memo_tests {
    use super::*;

    /// The memo gives what `ReqView::new` computes, for the bytes of this request, whatever the previous one sent.
    #[test]
    fn the_memo_answers_as_the_view_does_for_every_host() {
        let mut memo = HostMemo::default();
        let hosts: [&[u8]; 9] = [
            b"a.example",
            b"a.example",
            b"b.example",
            b"B.example:80",
            b"b.example",
            b"[::1]:8080",
            b"",
            b"a.example\xff",
            b"a.example",
        ];
        for raw in hosts {
            let want = host_of(std::str::from_utf8(raw).unwrap_or_default()).into_owned();
            assert_eq!(memo.get(raw).text(), want, "{raw:?}");
        }
        let first = memo.get(b"c.example");
        assert!(std::rc::Rc::ptr_eq(&first, &memo.get(b"c.example")));
        assert!(!std::rc::Rc::ptr_eq(&first, &memo.get(b"C.example")));
    }
}
