//! APISIX-compatible route matching, compiled once per config snapshot.
//!
//! This crate owns the request → route decision of APISIX's default `radixtree_host_uri` router:
//! `uri`/`uris` (exact, prefix, `:param`), `hosts` (exact and `*.` wildcard), `methods`,
//! `remote_addrs` (IP/CIDR) and `vars` (lua-resty-expr, see [`expr`]), plus `priority`.
//! It deliberately does not know about APISIX resources, services, JSON schemas or IO: the
//! caller hands it [`RouteSpec`]s (already merged with their service) and a [`MatchRequest`].
//!
//! Cost: [`Router::find`] walks a compressed byte trie for the reversed host and one for the
//! path, so it depends on the host/path length and on the candidates that share a key, never
//! on the route count. It takes no lock and makes no heap allocation once [`Params`] has grown
//! to the largest route's capture count (it starts with room for 8 captures and 128 name
//! bytes); `tests/no_alloc.rs` asserts it. Measured with callgrind (release, the route mix
//! of `benches/match.rs`, with a Host header): a static hit costs ~800 instructions at 1,000
//! routes and ~940 at 100,000 (the difference is the two extra digits of `svc16660` in the
//! path, i.e. two more trie nodes), a param hit ~980 / ~1,130, a miss ~610 / ~690.
//! When not to rely on it: many routes sharing one static key (`/u/:id/a1` … `/u/:id/a9999`
//! all key on `/u/`) are scanned linearly, as in lua-resty-radixtree. One caveat: a `vars`
//! regex (`~~`, `~*`) is a `regex::Regex`, whose scratch cache comes from a sharded pool, so
//! threads other than the first one to use it may touch a (rarely contended) mutex.
//!
//! Matching order (checked against `apisix/http/router/radixtree_host_uri.lua` and
//! `lua-resty-radixtree`):
//! 1. routes that declare hosts, keyed by the request host: the exact host first, then wildcard
//!    hosts from the longest suffix to the shortest (`*.example.com` matches `a.example.com` and
//!    `a.b.example.com`, not `example.com`);
//! 2. then routes without hosts.
//!
//! Within each of those URI tables: the exact-URI candidates first, then the prefix/param
//! candidates from the longest static prefix key to the shortest. Candidates sharing a key are
//! ordered by `priority` (desc), then by the length of the declared URI (desc, as
//! lua-resty-radixtree's `sort_route`), then by insertion order. The first candidate whose
//! path pattern, method, remote address and vars all match wins.
//!
//! Deliberate differences from APISIX, each small:
//! - the path is matched as the caller passes it (APISIX matches nginx's decoded, normalised
//!   `$uri`); the proxy decides whether to normalise first;
//! - `vars` regexes use Rust `regex` syntax and an invalid one fails [`Router::build`]
//!   (APISIX accepts the route and the expression is false at run time);
//! - `has` asks [`MatchRequest::var_has`] (Lua needs a table-valued var);
//! - route hosts carrying a port never match (the request host has its port stripped);
//!   APISIX's `filter_func` is not supported;
//! - the legacy `[var, value]` form keeps `value`'s case (Lua lower-cases it as an operator).

mod addr;
pub mod expr;
mod params;
mod pattern;
mod router;
mod trie;
mod var;

pub use params::Params;
pub use router::Router;
pub use var::Var;

use std::borrow::Cow;
use std::net::IpAddr;

/// One route as the router sees it (APISIX route fields already merged with its service).
#[derive(Debug, Clone)]
pub struct RouteSpec<T> {
    /// APISIX `uri`/`uris`: exact `/hello`, prefix `/foo/*` or `/foo*`, params `/user/:id`,
    /// named wildcards `/files/*path`, catch-all `/*`.
    pub uris: Vec<String>,
    /// APISIX `host`/`hosts`: exact (case-insensitive) or a leading-`*` wildcard; empty = any.
    pub hosts: Vec<String>,
    /// Upper-case HTTP methods (APISIX's enum); empty = any.
    pub methods: Vec<String>,
    /// IPs or CIDRs, v4 or v6; empty = any.
    pub remote_addrs: Vec<String>,
    /// A lua-resty-expr rule array, compiled at build time.
    pub vars: Option<serde_json::Value>,
    /// Higher wins among candidates of the same URI key.
    pub priority: i32,
    /// Returned by [`Router::find`] on a match.
    pub value: T,
}

impl<T> RouteSpec<T> {
    /// A spec for `uri` with every other condition empty (any host, method, address).
    pub fn new(uri: impl Into<String>, value: T) -> Self {
        RouteSpec {
            uris: vec![uri.into()],
            hosts: Vec::new(),
            methods: Vec::new(),
            remote_addrs: Vec::new(),
            vars: None,
            priority: 0,
            value,
        }
    }
}

/// A route that could not be compiled: its position in the input and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("route #{index}: {reason}")]
pub struct RouterError {
    /// Position of the offending spec in the `Vec` given to [`Router::build`].
    pub index: usize,
    /// Human-readable reason, e.g. `invalid remote_addr "10.0.0.0/33"`.
    pub reason: String,
}

/// What the matcher needs from a request. The proxy implements this over its parsed head.
pub trait MatchRequest {
    /// Raw path without the query string, as received (not percent-decoded).
    fn path(&self) -> &str;
    /// Host header without port, already lower-cased by the caller.
    fn host(&self) -> Option<&str>;
    /// Request method as sent (APISIX compares it case-sensitively against upper-case names).
    fn method(&self) -> &str;
    /// Peer address (the caller applies real-ip logic first if it wants to).
    fn remote_addr(&self) -> IpAddr;
    /// Value of a request variable (APISIX `ctx.var`), `None` when absent.
    fn var(&self, var: &Var) -> Option<Cow<'_, str>>;
    /// Whether a multi-valued variable holds `item` (lua-resty-expr `has`). The default views
    /// the variable as a one-element list; override it for repeated args/headers.
    fn var_has(&self, var: &Var, item: &str) -> bool {
        self.var(var).as_deref() == Some(item)
    }
}

#[cfg(test)]
mod tests;
