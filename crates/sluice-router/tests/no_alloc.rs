//! Proves `Router::find` makes zero heap allocations on hits, misses, params, hosts and vars.
//!
//! Its own test binary (one test) so the instrumented global allocator sees no other test's
//! allocations.

use serde_json::json;
use sluice_router::{MatchRequest, Params, RouteSpec, Router, Var};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use std::alloc::System;
use std::borrow::Cow;
use std::net::IpAddr;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

struct Req {
    path: &'static str,
    host: Option<&'static str>,
    api_key: &'static str,
}

impl MatchRequest for Req {
    fn path(&self) -> &str {
        self.path
    }
    fn host(&self) -> Option<&str> {
        self.host
    }
    fn method(&self) -> &str {
        "GET"
    }
    fn remote_addr(&self) -> IpAddr {
        IpAddr::from([10, 1, 2, 3])
    }
    fn var(&self, var: &Var) -> Option<Cow<'_, str>> {
        match var {
            Var::Http(h) if &**h == "x-api-key" => Some(Cow::Borrowed(self.api_key)),
            _ => None,
        }
    }
}

#[test]
fn find_does_not_allocate() {
    let mut specs = Vec::new();
    for i in 0..500u32 {
        specs.push(RouteSpec::new(format!("/api/v1/svc{i}/items/:id"), i));
        specs.push(RouteSpec::new(format!("/static/{i}"), i));
        specs.push(RouteSpec::new(format!("/prefix/{i}/*"), i));
    }
    let mut hosted = RouteSpec::new("/h/:a/:b", 9000);
    hosted.hosts = vec!["*.example.com".into()];
    hosted.remote_addrs = vec!["10.0.0.0/8".into(), "fd00::/8".into()];
    hosted.methods = vec!["GET".into()];
    hosted.vars = Some(json!([
        ["http_x_api_key", "~~", "^k"],
        ["http_x_api_key", "in", ["k1"]]
    ]));
    specs.push(hosted);
    let router = Router::build(specs).unwrap();

    let reqs = [
        Req {
            path: "/api/v1/svc42/items/abc",
            host: None,
            api_key: "",
        },
        Req {
            path: "/static/7",
            host: None,
            api_key: "",
        },
        Req {
            path: "/prefix/3/a/b/c",
            host: None,
            api_key: "",
        },
        Req {
            path: "/nope/at/all",
            host: Some("x.example.com"),
            api_key: "",
        },
        Req {
            path: "/h/1/2",
            host: Some("a.b.example.com"),
            api_key: "k1",
        },
        Req {
            path: "/h/1/2",
            host: Some("a.b.example.com"),
            api_key: "zz",
        },
    ];
    let expected = [Some(42), Some(7), Some(3), None, Some(9000), None];
    let mut params = Params::new();
    // Warm-up: lets lazily-initialised regex caches settle outside the measured region.
    for r in &reqs {
        router.find(r, &mut params);
    }

    let region = Region::new(GLOBAL);
    let mut got = [None; 6];
    for _ in 0..100 {
        for (i, r) in reqs.iter().enumerate() {
            got[i] = router.find(r, &mut params).copied();
        }
    }
    let stats = region.change();
    assert_eq!(got, expected);
    assert_eq!(stats.allocations, 0, "{stats:?}");
    assert_eq!(stats.reallocations, 0, "{stats:?}");
}
