//! [`Router`]: compiles [`RouteSpec`]s once and answers [`Router::find`] per request.
//!
//! Owns the two-level layout of APISIX's `radixtree_host_uri`: a trie over *reversed* hosts
//! (exact host = exact slot, `*.suffix` = prefix slot on the reversed suffix) whose payloads
//! are per-host URI tables, plus one URI table for routes without hosts, tried last. Each URI
//! table is a path trie whose payloads are buckets of candidates kept in match order. Every
//! level is persistent (`Arc`s, copy-on-write): a route inserted into or removed from a clone
//! copies its keys' paths only.
//! It does not own route payload semantics (`T` is opaque) nor config validation beyond what
//! matching needs (URIs, hosts, methods, addresses, vars).
//!
//! Hot path budget: no allocation (the host is walked back to front, not copied), no lock,
//! no hashing; see `benches/match.rs`.

use crate::addr::IpSet;
use crate::expr::Expr;
use crate::pattern::{Matcher, Pattern};
use crate::trie::{Slot, Trie};
use crate::{MatchRequest, Params, RouteSpec, RouterError};
use std::sync::Arc;

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

/// One route in the router: its value and its filter. Where its candidates sit is not kept: [`Router::remove`]
/// finds them from the route's spec again (issue 16: ~110 bytes a route at 100k routes for the places and an
/// order-to-entry map).
struct Entry<T> {
    value: T,
    /// `None` when the route has neither `remote_addrs` nor `vars` (most routes: no per-route filter block; the
    /// method mask is copied into each candidate).
    filter: Option<Box<Filter>>,
}

struct Candidate<T> {
    entry: Arc<Entry<T>>,
    /// The tie-break: insertion order.
    order: u32,
    priority: i32,
    uri_len: u32,
    key_len: u32,
    /// Copy of the route's method mask, so the common checks need no second lookup.
    methods: u16,
    /// Whether the route has `remote_addrs` or `vars` to check in its filter.
    filtered: bool,
    matcher: Matcher,
}

impl<T> Clone for Candidate<T> {
    fn clone(&self) -> Self {
        Candidate {
            entry: self.entry.clone(),
            order: self.order,
            priority: self.priority,
            uri_len: self.uri_len,
            key_len: self.key_len,
            methods: self.methods,
            filtered: self.filtered,
            matcher: self.matcher.clone(),
        }
    }
}

impl<T> Candidate<T> {
    /// lua-resty-radixtree `sort_route`: priority desc, then longer declared URI, then insertion order.
    fn rank(&self) -> (std::cmp::Reverse<i32>, std::cmp::Reverse<u32>, u32) {
        (
            std::cmp::Reverse(self.priority),
            std::cmp::Reverse(self.uri_len),
            self.order,
        )
    }
}

/// Candidates sharing one URI key, in match order: an exactly sized slice (most keys have one candidate), copied
/// whole when one is added or removed.
type Bucket<T> = Arc<[Candidate<T>]>;
/// A path trie whose payloads are buckets.
type UriTable<T> = Trie<Bucket<T>>;

/// Routes compiled for one config snapshot. Share it behind an `Arc`; [`Router::insert`] and
/// [`Router::remove`] on a clone (O(1)) copy only the trie nodes and buckets on the route's keys,
/// so a successor differing by one route costs O(key length), not O(routes), and the original
/// keeps serving unchanged.
pub struct Router<T> {
    /// How many routes were inserted and not removed.
    routes: usize,
    /// Reversed hosts to their URI tables.
    hosts: Trie<Arc<UriTable<T>>>,
    has_host_routes: bool,
    any_host: UriTable<T>,
}

impl<T> Clone for Router<T> {
    fn clone(&self) -> Self {
        Router {
            routes: self.routes,
            hosts: self.hosts.clone(),
            has_host_routes: self.has_host_routes,
            any_host: self.any_host.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Router<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("routes", &self.routes)
            .field("host_routes", &self.has_host_routes)
            .finish_non_exhaustive()
    }
}

impl<T> Default for Router<T> {
    fn default() -> Self {
        Router {
            routes: 0,
            hosts: Trie::default(),
            has_host_routes: false,
            any_host: Trie::default(),
        }
    }
}

// === impl Router ===

impl<T> Router<T> {
    /// Compiles `specs` (their order is the insertion order that breaks priority ties).
    pub fn build(specs: Vec<RouteSpec<T>>) -> Result<Self, RouterError> {
        let mut r = Router::default();
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
            r.add(index, &view, value)?;
        }
        Ok(r)
    }

    /// [`Router::build`] over borrowed specs, each with its value (the specs' own values are ignored): a caller
    /// that keeps its specs (to compare them with the next configuration's) need not copy them.
    pub fn build_refs<'s, U: 's>(
        specs: impl IntoIterator<Item = (&'s RouteSpec<U>, T)>,
    ) -> Result<Self, RouterError> {
        let mut r = Router::default();
        for (index, (spec, value)) in specs.into_iter().enumerate() {
            r.add(index, spec, value)?;
        }
        Ok(r)
    }

    fn add<U>(&mut self, index: usize, spec: &RouteSpec<U>, value: T) -> Result<(), RouterError> {
        let order = u32::try_from(index).map_err(|_| RouterError {
            index,
            reason: "too many routes".into(),
        })?;
        self.insert(order, spec, value)
    }

    /// Adds `spec` with `value` as the route of insertion order `order` (the tie-break among candidates of equal
    /// priority and URI length: lower first), which no route may hold: to replace a route, [`Router::remove`] it
    /// first. The result matches exactly what [`Router::build`] gives for every route ordered by `order`. On
    /// error (the spec does not compile; the error's `index` is `order`) nothing changes.
    pub fn insert<U>(
        &mut self,
        order: u32,
        spec: &RouteSpec<U>,
        value: T,
    ) -> Result<(), RouterError> {
        let index = order as usize;
        let err = |reason: String| RouterError { index, reason };
        let filter = compile_filter(spec).map_err(err)?;
        let (patterns, host_keys) = places_of(spec).map_err(err)?;
        let (methods, filtered) = (
            filter.methods,
            !filter.addrs.is_empty() || filter.vars.is_some(),
        );
        let filter = filtered.then(|| Box::new(filter));
        let entry = Arc::new(Entry { value, filter });
        for (pattern, uri_len) in patterns {
            let slot = slot_of(&pattern);
            let cand = Candidate {
                entry: entry.clone(),
                order,
                priority: spec.priority,
                uri_len: uri_len as u32,
                key_len: pattern.key.len() as u32,
                methods,
                filtered,
                matcher: pattern.matcher,
            };
            for h in &host_keys {
                self.with_table(h.as_ref(), |t| {
                    t.update(pattern.key.as_bytes(), slot, |b| {
                        let old: &[Candidate<T>] = b.as_deref().unwrap_or(&[]);
                        let rank = cand.rank();
                        let at = old.partition_point(|c| c.rank() <= rank);
                        let next: Bucket<T> = old[..at]
                            .iter()
                            .cloned()
                            .chain(std::iter::once(cand.clone()))
                            .chain(old[at..].iter().cloned())
                            .collect();
                        *b = Some(next);
                    })
                });
            }
        }
        self.routes += 1;
        Ok(())
    }

    /// Removes the route of insertion order `order`, inserted with `spec` (its candidates are where `spec`
    /// puts them); false when there was none.
    pub fn remove<U>(&mut self, order: u32, spec: &RouteSpec<U>) -> bool {
        let Ok((patterns, host_keys)) = places_of(spec) else {
            return false;
        };
        let mut found = false;
        for (pattern, _) in &patterns {
            let slot = slot_of(pattern);
            for h in &host_keys {
                self.with_table(h.as_ref(), |t| {
                    t.update(pattern.key.as_bytes(), slot, |b| {
                        if let Some(bucket) = b {
                            if bucket.iter().any(|c| c.order == order) {
                                found = true;
                                let rest: Bucket<T> = bucket
                                    .iter()
                                    .filter(|c| c.order != order)
                                    .cloned()
                                    .collect();
                                *b = (!rest.is_empty()).then_some(rest);
                            }
                        }
                    })
                });
            }
        }
        if found {
            self.routes -= 1;
        }
        found
    }

    /// Runs `f` on the URI table of `host` (`None`: the any-host table), created if needed, dropped when empty.
    fn with_table(&mut self, host: Option<&HostKey>, f: impl FnOnce(&mut UriTable<T>)) {
        let Some(h) = host else {
            return f(&mut self.any_host);
        };
        let slot = if h.wildcard {
            Slot::Prefix
        } else {
            Slot::Exact
        };
        self.hosts.update(&h.reversed, slot, |t| {
            let table = Arc::make_mut(t.get_or_insert_with(Default::default));
            f(table);
            if table.is_empty() {
                *t = None;
            }
        });
        self.has_host_routes = !self.hosts.is_empty();
    }

    /// Number of routes (specs), not of URIs.
    pub fn len(&self) -> usize {
        self.routes
    }

    /// True when built from no routes.
    pub fn is_empty(&self) -> bool {
        self.routes == 0
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
                    find_in(t, req, path, method, params)
                });
                if let Some(e) = hit {
                    return Some(&e.value);
                }
            }
        }
        find_in(&self.any_host, req, path, method, params).map(|e| &e.value)
    }
}

#[inline]
fn find_in<'r, T, R: MatchRequest>(
    table: &'r UriTable<T>,
    req: &R,
    path: &str,
    method: u16,
    params: &mut Params,
) -> Option<&'r Entry<T>> {
    table.lookup(path.as_bytes(), |bucket, _slot| {
        bucket
            .iter()
            .find(|c| accepts(c, req, path, method, params))
            .map(|c| &*c.entry)
    })
}

#[inline]
fn accepts<T, R: MatchRequest>(
    c: &Candidate<T>,
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
    let Some(f) = c.entry.filter.as_deref() else {
        return c.matcher.matches(path, c.key_len as usize, params);
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
#[derive(Clone)]
struct HostKey {
    reversed: Vec<u8>,
    wildcard: bool,
}

/// The trie slot a URI pattern's candidates sit in.
fn slot_of(p: &Pattern) -> Slot {
    if p.exact {
        Slot::Exact
    } else {
        Slot::Prefix
    }
}

/// Where a spec's candidates go: its compiled URI patterns (with each URI's length) and host keys (`None`: the
/// any-host table).
#[allow(clippy::type_complexity)]
fn places_of<U>(
    spec: &RouteSpec<U>,
) -> Result<(Vec<(Pattern, usize)>, Vec<Option<HostKey>>), String> {
    if spec.uris.is_empty() {
        return Err("missing uri".into());
    }
    let mut patterns = Vec::with_capacity(spec.uris.len());
    for uri in &spec.uris {
        let p = Pattern::compile(uri).map_err(|e| format!("uri {uri:?}: {e}"))?;
        patterns.push((p, uri.len()));
    }
    let hosts = spec
        .hosts
        .iter()
        .map(|h| compile_host(h))
        .collect::<Result<Vec<_>, _>>()?;
    let host_keys = if hosts.is_empty() {
        vec![None]
    } else {
        hosts.into_iter().map(Some).collect()
    };
    Ok((patterns, host_keys))
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
