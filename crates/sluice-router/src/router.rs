//! [`Router`]: compiles [`RouteSpec`]s once and answers [`Router::find`] per request.
//!
//! Owns the two-level layout of APISIX's `radixtree_host_uri`: a trie over *reversed* hosts
//! (exact host = exact slot, `*.suffix` = prefix slot on the reversed suffix) whose payloads
//! are per-host URI tables, plus one URI table for routes without hosts, tried last. Each URI
//! table is a path trie whose payloads are buckets of candidates sorted at build time.
//! It does not own route payload semantics (`T` is opaque) nor config validation beyond what
//! matching needs (URIs, hosts, methods, addresses, vars).
//!
//! Hot path budget: no allocation (the host is walked back to front, not copied), no lock,
//! no hashing; see `benches/match.rs`.

use crate::addr::IpSet;
use crate::expr::Expr;
use crate::pattern::{Matcher, Pattern};
use crate::trie::{Slot, Trie, TrieBuilder};
use crate::{MatchRequest, Params, RouteSpec, RouterError};

/// DNS names are at most 253 bytes; a longer route host is a config error.
const MAX_HOST: usize = 255;

/// APISIX's method enum (route schema), one bit each.
const METHODS: [&str; 10] = [
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE", "PURGE",
];

#[inline]
fn method_bit(m: &str) -> u16 {
    METHODS
        .iter()
        .position(|x| *x == m)
        .map_or(0, |i| 1u16 << i)
}

/// Per-route conditions other than host and path.
#[derive(Debug)]
struct Filter {
    /// 0 = any method.
    methods: u16,
    addrs: IpSet,
    vars: Option<Expr>,
}

#[derive(Debug)]
struct Candidate {
    route: u32,
    key_len: u32,
    /// Copy of the route's method mask, so the common checks need no second lookup.
    methods: u16,
    /// Whether the route has `remote_addrs` or `vars` to check in `Router::filters`.
    filtered: bool,
    matcher: Matcher,
}

#[derive(Debug)]
struct UriTable {
    trie: Trie,
    buckets: Vec<Box<[Candidate]>>,
}

/// Routes compiled for one config snapshot. Immutable; share it behind an `Arc`.
pub struct Router<T> {
    values: Vec<T>,
    filters: Vec<Filter>,
    hosts: Trie,
    has_host_routes: bool,
    host_tables: Vec<UriTable>,
    any_host: UriTable,
}

impl<T> std::fmt::Debug for Router<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("routes", &self.values.len())
            .field("host_tables", &self.host_tables.len())
            .finish_non_exhaustive()
    }
}

// === impl Router ===

impl<T> Router<T> {
    /// Compiles `specs` (their order is the insertion order that breaks priority ties).
    pub fn build(specs: Vec<RouteSpec<T>>) -> Result<Self, RouterError> {
        let mut b = Build::with_capacity(specs.len());
        for (index, spec) in specs.into_iter().enumerate() {
            let RouteSpec {
                uris,
                hosts,
                methods,
                remote_addrs,
                vars,
                priority,
                value,
            } = spec;
            let view = RouteSpec {
                uris,
                hosts,
                methods,
                remote_addrs,
                vars,
                priority,
                value: (),
            };
            b.add(index, &view, value)?;
        }
        Ok(b.finish())
    }

    /// [`Router::build`] over borrowed specs, each with its value (the specs' own values are ignored): a caller
    /// that keeps its specs (to compare them with the next configuration's) need not copy them.
    pub fn build_refs<'s, U: 's>(
        specs: impl IntoIterator<Item = (&'s RouteSpec<U>, T)>,
    ) -> Result<Self, RouterError> {
        let specs = specs.into_iter();
        let mut b = Build::with_capacity(specs.size_hint().0);
        for (index, (spec, value)) in specs.enumerate() {
            b.add(index, spec, value)?;
        }
        Ok(b.finish())
    }

    /// Number of routes (specs), not of URIs.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when built from no routes.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The matching route's value, filling `params` with its captures (cleared first).
    #[inline]
    pub fn find<'r, R: MatchRequest>(&'r self, req: &R, params: &mut Params) -> Option<&'r T> {
        params.clear();
        let path = req.path();
        let method = method_bit(req.method());
        if self.has_host_routes {
            if let Some(host) = req.host() {
                let hit = self.hosts.lookup_rev(host.as_bytes(), |t, _| {
                    let table = self.host_tables.get(t as usize)?;
                    self.find_in(table, req, path, method, params)
                });
                if let Some(i) = hit {
                    return self.values.get(i as usize);
                }
            }
        }
        let i = self.find_in(&self.any_host, req, path, method, params)?;
        self.values.get(i as usize)
    }

    #[inline]
    fn find_in<R: MatchRequest>(
        &self,
        table: &UriTable,
        req: &R,
        path: &str,
        method: u16,
        params: &mut Params,
    ) -> Option<u32> {
        table.trie.lookup(path.as_bytes(), |b, _slot| {
            let bucket = table.buckets.get(b as usize)?;
            bucket
                .iter()
                .find(|c| self.accepts(c, req, path, method, params))
                .map(|c| c.route)
        })
    }

    #[inline]
    fn accepts<R: MatchRequest>(
        &self,
        c: &Candidate,
        req: &R,
        path: &str,
        method: u16,
        params: &mut Params,
    ) -> bool {
        if c.methods != 0 && c.methods & method == 0 {
            return false;
        }
        if !c.filtered {
            return c.matcher.matches(path, c.key_len as usize, params);
        }
        let Some(f) = self.filters.get(c.route as usize) else {
            return false;
        };
        if !f.addrs.is_empty() && !f.addrs.contains(req.remote_addr()) {
            return false;
        }
        let mark = params.mark();
        if !c.matcher.matches(path, c.key_len as usize, params) {
            return false;
        }
        if let Some(vars) = &f.vars {
            if !vars.eval(req) {
                params.truncate(mark);
                return false;
            }
        }
        true
    }
}

/// A router being built: routes are added in insertion order.
struct Build<T> {
    b: Builder,
    values: Vec<T>,
    filters: Vec<Filter>,
}

impl<T> Build<T> {
    fn with_capacity(n: usize) -> Self {
        Build {
            b: Builder::default(),
            values: Vec::with_capacity(n),
            filters: Vec::with_capacity(n),
        }
    }

    fn add<U>(&mut self, index: usize, spec: &RouteSpec<U>, value: T) -> Result<(), RouterError> {
        let err = |reason: String| RouterError { index, reason };
        let route = u32::try_from(index).map_err(|_| err("too many routes".into()))?;
        let filter = compile_filter(spec).map_err(err)?;
        let (methods, filtered) = (
            filter.methods,
            !filter.addrs.is_empty() || filter.vars.is_some(),
        );
        self.filters.push(filter);
        if spec.uris.is_empty() {
            return Err(err("missing uri".into()));
        }
        let mut patterns = Vec::with_capacity(spec.uris.len());
        for uri in &spec.uris {
            let p = Pattern::compile(uri).map_err(|e| err(format!("uri {uri:?}: {e}")))?;
            patterns.push((p, uri.len()));
        }
        let hosts = spec
            .hosts
            .iter()
            .map(|h| compile_host(h))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        for (pattern, uri_len) in patterns {
            let cand = PendingCandidate {
                route,
                methods,
                filtered,
                priority: spec.priority,
                uri_len,
                pattern,
            };
            if hosts.is_empty() {
                self.b.any_host.add(cand);
            } else {
                for host in &hosts {
                    self.b.host_table(host).add(cand.clone());
                }
            }
        }
        self.values.push(value);
        Ok(())
    }

    fn finish(self) -> Router<T> {
        let Build { b, values, filters } = self;
        Router {
            values,
            filters,
            has_host_routes: !b.host_tables.is_empty(),
            hosts: b.hosts.finish(),
            host_tables: b
                .host_tables
                .into_iter()
                .map(TableBuilder::finish)
                .collect(),
            any_host: b.any_host.finish(),
        }
    }
}

fn compile_filter<T>(spec: &RouteSpec<T>) -> Result<Filter, String> {
    let mut methods = 0u16;
    for m in &spec.methods {
        let bit = method_bit(m);
        if bit == 0 {
            return Err(format!("invalid method {m:?}"));
        }
        methods |= bit;
    }
    let addrs = IpSet::parse(spec.remote_addrs.iter().map(String::as_str))
        .map_err(|e| format!("remote_addrs: {e}"))?;
    let vars = match &spec.vars {
        None => None,
        Some(v) => Some(Expr::compile(v).map_err(|e| format!("failed to compile vars: {e}"))?),
    };
    Ok(Filter {
        methods,
        addrs,
        vars,
    })
}

/// A validated host: reversed, lower-cased key and whether it is a `*.` wildcard.
struct HostKey {
    reversed: Vec<u8>,
    wildcard: bool,
}

/// APISIX's `host_def`: `^\*?[0-9a-zA-Z-._\[\]:]+$`.
fn compile_host(h: &str) -> Result<HostKey, String> {
    let (wildcard, rest) = match h.strip_prefix('*') {
        Some(r) => (true, r),
        None => (false, h),
    };
    let valid = !rest.is_empty()
        && rest.len() <= MAX_HOST
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b));
    if !valid {
        return Err(format!("invalid host {h:?}"));
    }
    Ok(HostKey {
        reversed: rest.bytes().rev().map(|b| b.to_ascii_lowercase()).collect(),
        wildcard,
    })
}

// === build-time helpers ===

#[derive(Clone)]
struct PendingCandidate {
    route: u32,
    methods: u16,
    filtered: bool,
    priority: i32,
    uri_len: usize,
    pattern: Pattern,
}

#[derive(Default)]
struct TableBuilder {
    trie: TrieBuilder,
    buckets: Vec<Vec<PendingCandidate>>,
}

impl TableBuilder {
    fn add(&mut self, c: PendingCandidate) {
        let slot = if c.pattern.exact {
            Slot::Exact
        } else {
            Slot::Prefix
        };
        let next = self.buckets.len() as u32;
        let idx = *self
            .trie
            .slot_mut(c.pattern.key.as_bytes(), slot)
            .get_or_insert(next);
        if idx == next {
            self.buckets.push(Vec::new());
        }
        if let Some(b) = self.buckets.get_mut(idx as usize) {
            b.push(c);
        }
    }

    fn finish(self) -> UriTable {
        let buckets = self
            .buckets
            .into_iter()
            .map(|mut b| {
                // lua-resty-radixtree `sort_route`: priority desc, then longer declared URI;
                // the stable sort keeps insertion order for full ties.
                b.sort_by(|x, y| y.priority.cmp(&x.priority).then(y.uri_len.cmp(&x.uri_len)));
                b.into_iter()
                    .map(|c| Candidate {
                        route: c.route,
                        methods: c.methods,
                        filtered: c.filtered,
                        key_len: c.pattern.key.len() as u32,
                        matcher: c.pattern.matcher,
                    })
                    .collect()
            })
            .collect();
        UriTable {
            trie: self.trie.finish(),
            buckets,
        }
    }
}

#[derive(Default)]
struct Builder {
    hosts: TrieBuilder,
    host_tables: Vec<TableBuilder>,
    any_host: TableBuilder,
}

impl Builder {
    fn host_table(&mut self, h: &HostKey) -> &mut TableBuilder {
        let slot = if h.wildcard {
            Slot::Prefix
        } else {
            Slot::Exact
        };
        let next = self.host_tables.len() as u32;
        let idx = *self.hosts.slot_mut(&h.reversed, slot).get_or_insert(next);
        if idx == next {
            self.host_tables.push(TableBuilder::default());
        }
        &mut self.host_tables[idx as usize]
    }
}
