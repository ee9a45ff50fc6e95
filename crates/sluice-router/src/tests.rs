//! Router behaviour tests: each APISIX rule from the crate docs, one test (or more) per rule.

use crate::{MatchRequest, Params, RouteSpec, Router, Var};
use serde_json::json;
use std::borrow::Cow;
use std::net::IpAddr;

/// A fake request head: path, host, method, peer and a small var table.
#[derive(Debug, Clone)]
pub(crate) struct Req {
    pub path: String,
    pub host: Option<String>,
    pub method: String,
    pub addr: IpAddr,
    pub vars: Vec<(Var, String)>,
}

pub(crate) fn req(path: &str) -> Req {
    Req {
        path: path.into(),
        host: None,
        method: "GET".into(),
        addr: "127.0.0.1".parse().unwrap(),
        vars: Vec::new(),
    }
}

impl Req {
    pub fn host(mut self, h: &str) -> Self {
        self.host = Some(h.into());
        self
    }
    pub fn method(mut self, m: &str) -> Self {
        self.method = m.into();
        self
    }
    pub fn addr(mut self, a: &str) -> Self {
        self.addr = a.parse().unwrap();
        self
    }
    pub fn var(mut self, name: &str, v: &str) -> Self {
        self.vars.push((Var::parse(name), v.into()));
        self
    }
}

impl MatchRequest for Req {
    fn path(&self) -> &str {
        &self.path
    }
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
    fn method(&self) -> &str {
        &self.method
    }
    fn remote_addr(&self) -> IpAddr {
        self.addr
    }
    fn var(&self, var: &Var) -> Option<Cow<'_, str>> {
        match var {
            Var::Uri => Some(Cow::Borrowed(&self.path)),
            Var::RemoteAddr => Some(Cow::Owned(self.addr.to_string())),
            _ => self
                .vars
                .iter()
                .find(|(k, _)| k == var)
                .map(|(_, v)| Cow::Borrowed(v.as_str())),
        }
    }
    fn var_has(&self, var: &Var, item: &str) -> bool {
        self.vars.iter().any(|(k, v)| k == var && v == item)
    }
}

fn spec(uri: &str, value: &'static str) -> RouteSpec<&'static str> {
    RouteSpec::new(uri, value)
}

fn router(specs: Vec<RouteSpec<&'static str>>) -> Router<&'static str> {
    Router::build(specs).unwrap()
}

fn find(r: &Router<&'static str>, q: &Req) -> Option<&'static str> {
    let mut p = Params::new();
    r.find(q, &mut p).copied()
}

#[test]
fn exact_beats_prefix_regardless_of_priority() {
    let mut pre = spec("/foo*", "prefix");
    pre.priority = 100;
    let r = router(vec![pre, spec("/foo", "exact")]);
    assert_eq!(find(&r, &req("/foo")), Some("exact"));
    assert_eq!(find(&r, &req("/foobar")), Some("prefix"));
    assert_eq!(find(&r, &req("/fo")), None);
}

#[test]
fn slash_star_and_bare_star_prefixes() {
    let r = router(vec![spec("/foo/*", "slash")]);
    // lua-resty-radixtree stores `/foo/*` as prefix `/foo/`: `/foo` itself does not match.
    assert_eq!(find(&r, &req("/foo")), None);
    assert_eq!(find(&r, &req("/foo/")), Some("slash"));
    assert_eq!(find(&r, &req("/foo/a/b")), Some("slash"));
    assert_eq!(find(&r, &req("/foobar")), None);

    let r = router(vec![spec("/foo*", "bare")]);
    assert_eq!(find(&r, &req("/foo")), Some("bare"));
    assert_eq!(find(&r, &req("/foobar")), Some("bare"));
    assert_eq!(find(&r, &req("/foo/x")), Some("bare"));
    assert_eq!(find(&r, &req("/fo")), None);

    let r = router(vec![spec("/*", "all")]);
    assert_eq!(find(&r, &req("/")), Some("all"));
    assert_eq!(find(&r, &req("/anything/at/all")), Some("all"));
}

#[test]
fn exact_uri_is_exact() {
    let r = router(vec![spec("/hello", "h")]);
    assert_eq!(find(&r, &req("/hello")), Some("h"));
    assert_eq!(find(&r, &req("/hello/")), None);
    assert_eq!(find(&r, &req("/hell")), None);
    assert_eq!(find(&r, &req("/hello2")), None);
}

#[test]
fn longest_prefix_first_then_fallback_to_shorter() {
    let mut deep = spec("/a/b/*", "deep");
    deep.methods = vec!["POST".into()];
    let r = router(vec![spec("/a/*", "shallow"), deep, spec("/*", "root")]);
    assert_eq!(find(&r, &req("/a/b/c").method("POST")), Some("deep"));
    // The longer prefix fails on method: fall back to the next shorter prefix.
    assert_eq!(find(&r, &req("/a/b/c")), Some("shallow"));
    assert_eq!(find(&r, &req("/z")), Some("root"));
}

#[test]
fn fallback_from_failing_exact_to_prefix() {
    let mut exact = spec("/login", "exact");
    exact.methods = vec!["POST".into()];
    let r = router(vec![exact, spec("/log*", "prefix")]);
    assert_eq!(find(&r, &req("/login").method("POST")), Some("exact"));
    assert_eq!(find(&r, &req("/login")), Some("prefix"));
}

#[test]
fn priority_then_insertion_order_within_a_key() {
    let mut low = spec("/p", "low");
    low.priority = 1;
    let mut high = spec("/p", "high");
    high.priority = 5;
    let r = router(vec![low.clone(), high.clone()]);
    assert_eq!(find(&r, &req("/p")), Some("high"));
    let r = router(vec![high.clone(), low.clone()]);
    assert_eq!(find(&r, &req("/p")), Some("high"));

    // Equal priority: the first inserted wins.
    let r = router(vec![spec("/p", "first"), spec("/p", "second")]);
    assert_eq!(find(&r, &req("/p")), Some("first"));

    // Higher priority that fails its filter yields to the next candidate.
    let mut picky = spec("/p", "picky");
    picky.priority = 9;
    picky.vars = Some(json!([["arg_v", "==", "1"]]));
    let r = router(vec![spec("/p", "plain"), picky]);
    assert_eq!(find(&r, &req("/p").var("arg_v", "1")), Some("picky"));
    assert_eq!(find(&r, &req("/p")), Some("plain"));

    // Negative priorities sort below the default 0.
    let mut neg = spec("/n*", "neg");
    neg.priority = -1;
    let r = router(vec![neg, spec("/n*", "zero")]);
    assert_eq!(find(&r, &req("/nx")), Some("zero"));
}

#[test]
fn same_key_prefers_longer_declared_uri_at_equal_priority() {
    // `/user/:id` and `/user/*` share the key `/user/`; radixtree tries the longer one first.
    let r = router(vec![spec("/user/*", "wild"), spec("/user/:id", "param")]);
    assert_eq!(find(&r, &req("/user/7")), Some("param"));
    assert_eq!(find(&r, &req("/user/7/x")), Some("wild"));
    let mut wild = spec("/user/*", "wild");
    wild.priority = 1;
    let r = router(vec![wild, spec("/user/:id", "param")]);
    assert_eq!(find(&r, &req("/user/7")), Some("wild"));
}

#[test]
fn params_capture_segments_and_are_reset() {
    let r = router(vec![
        spec("/user/:id", "user"),
        spec("/user/:id/posts/:post", "post"),
        spec("/files/*path", "files"),
    ]);
    let mut p = Params::new();
    let q = req("/user/42/posts/abc");
    assert_eq!(r.find(&q, &mut p), Some(&"post"));
    assert_eq!(p.get("id", q.path()), Some("42"));
    assert_eq!(p.get("post", q.path()), Some("abc"));
    assert_eq!(p.len(), 2);

    let q = req("/user/9");
    assert_eq!(r.find(&q, &mut p), Some(&"user"));
    assert_eq!(p.len(), 1, "find clears the previous captures");
    assert_eq!(p.get("id", q.path()), Some("9"));
    assert_eq!(p.get("post", q.path()), None);

    let q = req("/files/a/b/c.txt");
    assert_eq!(r.find(&q, &mut p), Some(&"files"));
    assert_eq!(p.get("path", q.path()), Some("a/b/c.txt"));
    let names: Vec<_> = p.iter().map(|(n, _)| n.to_owned()).collect();
    assert_eq!(names, vec!["path"]);

    // A param segment never matches an empty segment or spans a slash.
    assert_eq!(r.find(&req("/user/"), &mut p), None);
    assert!(p.is_empty());
    assert_eq!(r.find(&req("/user/1/2"), &mut p), None);
}

#[test]
fn captures_of_a_rejected_candidate_do_not_leak() {
    let mut picky = spec("/item/:id", "picky");
    picky.vars = Some(json!([["arg_ok", "==", "1"]]));
    let r = router(vec![picky, spec("/item/*", "fallback")]);
    let mut p = Params::new();
    let q = req("/item/5");
    assert_eq!(r.find(&q, &mut p), Some(&"fallback"));
    assert_eq!(p.get("id", q.path()), None);
    assert_eq!(p.get(":ext", q.path()), Some("5"));
}

#[test]
fn host_exact_is_case_insensitive_and_wildcard_is_multi_level() {
    let mut exact = spec("/*", "exact");
    exact.hosts = vec!["Foo.Example.COM".into()];
    let mut wild = spec("/*", "wild");
    wild.hosts = vec!["*.example.com".into()];
    let r = router(vec![wild, exact]);
    // Exact host beats wildcard even though the wildcard route was inserted first.
    assert_eq!(find(&r, &req("/").host("foo.example.com")), Some("exact"));
    assert_eq!(find(&r, &req("/").host("bar.example.com")), Some("wild"));
    assert_eq!(find(&r, &req("/").host("a.b.example.com")), Some("wild"));
    assert_eq!(find(&r, &req("/").host("example.com")), None);
    assert_eq!(find(&r, &req("/").host("example.org")), None);
    assert_eq!(find(&r, &req("/")), None, "no Host header: no host route");
}

#[test]
fn longer_wildcard_suffix_first_and_fallback_between_hosts() {
    let mut broad = spec("/*", "broad");
    broad.hosts = vec!["*.com".into()];
    let mut narrow = spec("/api/*", "narrow");
    narrow.hosts = vec!["*.example.com".into()];
    let r = router(vec![broad, narrow]);
    assert_eq!(
        find(&r, &req("/api/x").host("a.example.com")),
        Some("narrow")
    );
    // The narrower host table has no matching URI: fall back to the broader wildcard.
    assert_eq!(
        find(&r, &req("/other").host("a.example.com")),
        Some("broad")
    );
}

#[test]
fn host_routes_before_hostless_routes_then_fallback() {
    let mut hosted = spec("/*", "hosted");
    hosted.hosts = vec!["api.test".into()];
    let r = router(vec![spec("/exact", "any-host"), hosted]);
    // radixtree_host_uri: a host route wins even against an exact URI of a host-less route.
    assert_eq!(find(&r, &req("/exact").host("api.test")), Some("hosted"));
    assert_eq!(
        find(&r, &req("/exact").host("other.test")),
        Some("any-host")
    );
    assert_eq!(find(&r, &req("/exact")), Some("any-host"));

    let mut hosted = spec("/only", "hosted");
    hosted.hosts = vec!["api.test".into()];
    let r = router(vec![hosted, spec("/*", "any-host")]);
    assert_eq!(find(&r, &req("/only").host("api.test")), Some("hosted"));
    // The host's own table has no match: fall back to host-less routes.
    assert_eq!(find(&r, &req("/else").host("api.test")), Some("any-host"));
}

#[test]
fn multiple_hosts_and_uris_per_route() {
    let mut s = spec("/a", "multi");
    s.uris.push("/b/*".into());
    s.hosts = vec!["x.test".into(), "*.y.test".into()];
    let r = router(vec![s]);
    assert_eq!(find(&r, &req("/a").host("x.test")), Some("multi"));
    assert_eq!(find(&r, &req("/b/1").host("q.y.test")), Some("multi"));
    assert_eq!(find(&r, &req("/b/1").host("z.test")), None);
    assert_eq!(r.len(), 1);
}

#[test]
fn methods_filter() {
    let mut s = spec("/m", "m");
    s.methods = vec!["GET".into(), "PURGE".into()];
    let r = router(vec![s]);
    assert_eq!(find(&r, &req("/m")), Some("m"));
    assert_eq!(find(&r, &req("/m").method("PURGE")), Some("m"));
    assert_eq!(find(&r, &req("/m").method("POST")), None);
    assert_eq!(
        find(&r, &req("/m").method("get")),
        None,
        "methods are case-sensitive"
    );
    assert_eq!(find(&r, &req("/m").method("BREW")), None);
    let r = router(vec![spec("/m", "any")]);
    assert_eq!(find(&r, &req("/m").method("BREW")), Some("any"));
}

#[test]
fn remote_addrs_v4_and_v6_cidrs() {
    let mut s = spec("/ip", "ip");
    s.remote_addrs = vec!["10.0.0.0/8".into(), "192.168.1.1".into(), "fd00::/8".into()];
    let r = router(vec![s]);
    assert_eq!(find(&r, &req("/ip").addr("10.2.3.4")), Some("ip"));
    assert_eq!(find(&r, &req("/ip").addr("192.168.1.1")), Some("ip"));
    assert_eq!(find(&r, &req("/ip").addr("192.168.1.2")), None);
    assert_eq!(find(&r, &req("/ip").addr("fd12::1")), Some("ip"));
    assert_eq!(find(&r, &req("/ip").addr("fe80::1")), None);
    assert_eq!(find(&r, &req("/ip").addr("::ffff:10.0.0.1")), Some("ip"));
}

#[test]
fn route_vars_are_evaluated() {
    let mut s = spec("/v", "v");
    s.vars = Some(json!([["http_x_env", "==", "prod"], ["arg_n", ">", 3]]));
    let r = router(vec![s]);
    assert_eq!(
        find(&r, &req("/v").var("http_x_env", "prod").var("arg_n", "4")),
        Some("v")
    );
    assert_eq!(
        find(&r, &req("/v").var("http_x_env", "prod").var("arg_n", "3")),
        None
    );
    assert_eq!(find(&r, &req("/v").var("arg_n", "9")), None);
}

#[test]
fn invalid_input_is_a_positioned_build_error() {
    let cases: Vec<(RouteSpec<&str>, &str)> = vec![
        (spec("", "x"), "empty uri"),
        (
            RouteSpec {
                uris: vec![],
                ..spec("/", "x")
            },
            "missing uri",
        ),
        (
            RouteSpec {
                hosts: vec!["a b.com".into()],
                ..spec("/", "x")
            },
            "invalid host",
        ),
        (
            RouteSpec {
                hosts: vec!["a.*.com".into()],
                ..spec("/", "x")
            },
            "invalid host",
        ),
        (
            RouteSpec {
                methods: vec!["FETCH".into()],
                ..spec("/", "x")
            },
            "invalid method",
        ),
        (
            RouteSpec {
                remote_addrs: vec!["10.0.0.0/40".into()],
                ..spec("/", "x")
            },
            "remote_addrs",
        ),
        (
            RouteSpec {
                vars: Some(json!([["arg_a", "~~", "(unclosed"]])),
                ..spec("/", "x")
            },
            "invalid regex",
        ),
        (
            RouteSpec {
                vars: Some(json!(["arg_a", "==", "1"])),
                ..spec("/", "x")
            },
            "wrapped inside brackets",
        ),
    ];
    for (bad, why) in cases {
        let err = Router::build(vec![spec("/ok", "ok"), spec("/ok2", "ok"), bad]).unwrap_err();
        assert_eq!(err.index, 2, "{err}");
        let text = err.to_string();
        assert!(text.starts_with("route #2: "), "{text}");
        assert!(text.contains(why), "{text} should mention {why}");
    }
}

#[test]
fn empty_router_and_len() {
    let r: Router<u32> = Router::build(Vec::new()).unwrap();
    assert!(r.is_empty());
    assert_eq!(r.find(&req("/"), &mut Params::new()), None);
    let r = router(vec![spec("/a", "a"), spec("/b", "b"), spec("/c/*", "c")]);
    assert_eq!(r.len(), 3);
}

#[test]
fn many_routes_still_resolve_each_one() {
    let mut specs = Vec::new();
    for i in 0..2000u32 {
        let mut s = RouteSpec::new(format!("/api/v1/svc{i}/items/:id"), i);
        s.uris.push(format!("/static/{i}"));
        specs.push(s);
    }
    let r = Router::build(specs).unwrap();
    let mut p = Params::new();
    for i in (0..2000u32).step_by(97) {
        let q = req(&format!("/api/v1/svc{i}/items/x{i}"));
        assert_eq!(r.find(&q, &mut p), Some(&i));
        assert_eq!(p.get("id", q.path()), Some(format!("x{i}").as_str()));
        assert_eq!(r.find(&req(&format!("/static/{i}")), &mut p), Some(&i));
    }
    assert_eq!(r.find(&req("/api/v1/svc1/items/"), &mut p), None);
    assert_eq!(r.find(&req("/static/2000"), &mut p), None);
}

#[test]
fn router_is_shareable_across_threads() {
    fn assert_send_sync<X: Send + Sync>() {}
    assert_send_sync::<Router<u32>>();
    assert_send_sync::<Params>();
}

#[test]
fn priority_never_beats_a_longer_prefix_key() {
    let mut short = spec("/a/*", "short");
    short.priority = 100;
    let r = router(vec![short, spec("/a/b/*", "long")]);
    // Priority only orders candidates of one key; the longer key is always tried first.
    assert_eq!(find(&r, &req("/a/b/c")), Some("long"));
    assert_eq!(find(&r, &req("/a/c")), Some("short"));
}

#[test]
fn wildcard_host_table_keeps_uri_order() {
    let mut prefix = spec("/p/*", "prefix");
    prefix.hosts = vec!["*.t".into()];
    prefix.priority = 3;
    let mut exact = spec("/p/x", "exact");
    exact.hosts = vec!["*.t".into()];
    let r = router(vec![prefix, exact]);
    assert_eq!(find(&r, &req("/p/x").host("a.t")), Some("exact"));
    assert_eq!(find(&r, &req("/p/y").host("a.t")), Some("prefix"));
}

/// Issue 16: a router changed route by route (`insert`, `remove`, replace) on clones answers every request exactly as
/// `Router::build` over the same routes in the same order, and the versions it was cloned from keep answering as
/// before. Random specs from small pools, so keys, hosts, priorities and tie-breaks collide often.
#[test]
fn incremental_updates_match_a_rebuild() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    const URIS: &[&str] = &[
        "/a",
        "/a/*",
        "/a*",
        "/a/:id",
        "/a/b",
        "/a/b/*",
        "/b",
        "/b*",
        "/*",
        "/a/:id/c",
        "/c/:x/*rest",
        "/a/b/c",
        "/ab",
    ];
    const HOSTS: &[&str] = &["example.com", "*.example.com", "a.example.com", "*.com"];
    const PATHS: &[&str] = &[
        "/", "/a", "/a/", "/a/x", "/a/b", "/a/b/c", "/a/x/c", "/ab", "/abc", "/b", "/bz",
        "/c/1/z/y", "/zz",
    ];
    const REQ_HOSTS: &[Option<&str>] = &[
        None,
        Some("example.com"),
        Some("a.example.com"),
        Some("x.example.com"),
        Some("foo.com"),
    ];
    fn random_spec(rng: &mut StdRng, value: u32) -> RouteSpec<u32> {
        let pick = |rng: &mut StdRng, from: &[&str], max: usize| -> Vec<String> {
            let n = rng.gen_range(0..=max);
            (0..n)
                .map(|_| from[rng.gen_range(0..from.len())].to_owned())
                .collect()
        };
        let mut uris = pick(rng, URIS, 2);
        if uris.is_empty() {
            uris.push(URIS[rng.gen_range(0..URIS.len())].to_owned());
        }
        RouteSpec {
            uris,
            hosts: if rng.gen_bool(0.4) {
                pick(rng, HOSTS, 2)
            } else {
                Vec::new()
            },
            methods: if rng.gen_bool(0.3) {
                vec!["POST".into()]
            } else {
                Vec::new()
            },
            remote_addrs: if rng.gen_bool(0.2) {
                vec!["10.0.0.0/8".into()]
            } else {
                Vec::new()
            },
            vars: None,
            priority: [0, 0, 1, -1][rng.gen_range(0..4)],
            value,
        }
    }
    /// The value found and its captures.
    type Answer = Option<(u32, Vec<(String, std::ops::Range<usize>)>)>;
    fn answers(r: &Router<u32>) -> Vec<Answer> {
        let mut out = Vec::new();
        let mut p = Params::new();
        for path in PATHS {
            for host in REQ_HOSTS {
                for (method, addr) in [("GET", "10.1.1.1"), ("POST", "192.168.1.1")] {
                    let mut q = req(path).method(method).addr(addr);
                    q.host = host.map(str::to_owned);
                    out.push(r.find(&q, &mut p).map(|v| {
                        let params = p.iter().map(|(k, r)| (k.to_owned(), r)).collect();
                        (*v, params)
                    }));
                }
            }
        }
        out
    }
    fn rebuild(model: &BTreeMap<u32, RouteSpec<u32>>) -> Router<u32> {
        Router::build(model.values().cloned().collect()).unwrap()
    }

    let mut next_value = 0u32;
    for seed in 0..16u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model: BTreeMap<u32, RouteSpec<u32>> = BTreeMap::new();
        let mut router: Router<u32> = Router::default();
        // Earlier versions with what they answered: a change to a clone must never reach them.
        let mut kept: Vec<(Router<u32>, Vec<_>)> = Vec::new();
        for step in 0..60 {
            let order = rng.gen_range(0..24u32);
            let mut next = router.clone();
            if rng.gen_bool(0.65) {
                next_value += 1;
                let spec = random_spec(&mut rng, next_value);
                // A replacement: the old route leaves first, found by its own spec.
                if let Some(old) = model.get(&order) {
                    assert!(next.remove(order, old));
                }
                next.insert(order, &spec, next_value).unwrap();
                model.insert(order, spec);
            } else {
                match model.remove(&order) {
                    Some(old) => assert!(next.remove(order, &old)),
                    // Nothing at that order: a spec finds nothing to remove.
                    None => assert!(!next.remove(order, &random_spec(&mut rng, 0))),
                }
            }
            assert_eq!(next.len(), model.len());
            assert_eq!(
                answers(&next),
                answers(&rebuild(&model)),
                "seed {seed} step {step}: incremental and rebuilt routers differ"
            );
            if step % 10 == 0 {
                let a = answers(&router);
                kept.push((router, a));
            }
            router = next;
        }
        for (old, a) in &kept {
            assert_eq!(&answers(old), a, "seed {seed}: an earlier version changed");
        }
        // Removing every route leaves an empty router that matches nothing.
        for (order, spec) in &model {
            assert!(router.remove(*order, spec));
            assert!(!router.remove(*order, spec), "removed twice");
        }
        assert!(router.is_empty());
        assert!(answers(&router).iter().all(Option::is_none));
    }
}

/// A spec that does not compile changes nothing.
#[test]
fn a_failed_insert_changes_nothing() {
    let mut r: Router<u32> = Router::default();
    r.insert(1, &RouteSpec::new("/a", 1), 1).unwrap();
    let mut bad = RouteSpec::new("/b", 2);
    bad.methods = vec!["FETCH".into()];
    let e = r.insert(2, &bad, 2).unwrap_err();
    assert_eq!(e.index, 2);
    assert_eq!(r.len(), 1);
    let mut p = Params::new();
    assert_eq!(r.find(&req("/a"), &mut p), Some(&1));
    assert_eq!(r.find(&req("/b"), &mut p), None);
}
