//! Request variable names (APISIX `ctx.var`), parsed once at build time into [`Var`].
//!
//! Owns only the name → variant mapping. Looking the value up is the caller's job
//! ([`crate::MatchRequest::var`]), so the proxy can answer from its typed request head with a
//! `match`, never a string-keyed map.

/// A request variable name compiled once: never a string lookup per request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Var {
    /// `uri`: the path without the query string.
    Uri,
    /// `request_uri`: path plus query, as received.
    RequestUri,
    /// `host`: lower-cased Host without port.
    Host,
    /// `remote_addr`: peer IP.
    RemoteAddr,
    /// `remote_port`: peer port.
    RemotePort,
    /// `server_port`: local port the request arrived on.
    ServerPort,
    /// `request_method`.
    RequestMethod,
    /// `scheme`: `http` or `https`.
    Scheme,
    /// `args`: the raw query string.
    Args,
    /// `arg_<name>`: first query argument `name` (name kept as written).
    Arg(Box<str>),
    /// `http_<name>`: request header, name lower-cased with `_` turned into `-`.
    Http(Box<str>),
    /// `cookie_<name>`: cookie `name`.
    Cookie(Box<str>),
    /// Any other APISIX/nginx variable, by its full name (e.g. `server_addr`, `post_arg_x`).
    Other(Box<str>),
}

impl Var {
    /// Parses an APISIX variable name: `"arg_foo"` → `Arg("foo")`,
    /// `"http_x_api_key"` → `Http("x-api-key")`, `"cookie_sid"` → `Cookie("sid")`.
    pub fn parse(name: &str) -> Var {
        match name {
            "uri" => return Var::Uri,
            "request_uri" => return Var::RequestUri,
            "host" => return Var::Host,
            "remote_addr" => return Var::RemoteAddr,
            "remote_port" => return Var::RemotePort,
            "server_port" => return Var::ServerPort,
            "request_method" => return Var::RequestMethod,
            "scheme" => return Var::Scheme,
            "args" => return Var::Args,
            _ => {}
        }
        if let Some(rest) = name.strip_prefix("arg_").filter(|r| !r.is_empty()) {
            return Var::Arg(rest.into());
        }
        if let Some(rest) = name.strip_prefix("http_").filter(|r| !r.is_empty()) {
            let header: String = rest
                .chars()
                .map(|c| {
                    if c == '_' {
                        '-'
                    } else {
                        c.to_ascii_lowercase()
                    }
                })
                .collect();
            return Var::Http(header.into());
        }
        if let Some(rest) = name.strip_prefix("cookie_").filter(|r| !r.is_empty()) {
            return Var::Cookie(rest.into());
        }
        Var::Other(name.into())
    }
}

#[cfg(test)]
mod tests {
    use super::Var;

    #[test]
    fn parses_apisix_names() {
        assert_eq!(Var::parse("uri"), Var::Uri);
        assert_eq!(Var::parse("request_uri"), Var::RequestUri);
        assert_eq!(Var::parse("host"), Var::Host);
        assert_eq!(Var::parse("remote_addr"), Var::RemoteAddr);
        assert_eq!(Var::parse("remote_port"), Var::RemotePort);
        assert_eq!(Var::parse("server_port"), Var::ServerPort);
        assert_eq!(Var::parse("request_method"), Var::RequestMethod);
        assert_eq!(Var::parse("scheme"), Var::Scheme);
        assert_eq!(Var::parse("args"), Var::Args);
        assert_eq!(Var::parse("arg_foo"), Var::Arg("foo".into()));
        assert_eq!(Var::parse("arg_Foo_Bar"), Var::Arg("Foo_Bar".into()));
        assert_eq!(Var::parse("http_x_api_key"), Var::Http("x-api-key".into()));
        assert_eq!(Var::parse("http_X_Api"), Var::Http("x-api".into()));
        assert_eq!(Var::parse("cookie_sid"), Var::Cookie("sid".into()));
        assert_eq!(Var::parse("arg_"), Var::Other("arg_".into()));
        assert_eq!(Var::parse("server_addr"), Var::Other("server_addr".into()));
    }
}
