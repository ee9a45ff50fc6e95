//! `Router::find` cost at 1, 1,000 and 100,000 routes: hits (param, static, prefix) and a miss.
//!
//! The route mix cycles through a static route (`/api/v1/svc{i}/status`), a param route
//! (`/api/v1/svc{i}/items/:id`, GET/POST only) and a prefix route (`/assets/{i}/*`); every
//! tenth route also carries a host. Run: `cargo bench -p sluice-router -- --warm-up-time 1
//! --measurement-time 3`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sluice_router::{MatchRequest, Params, RouteSpec, Router, Var};
use std::borrow::Cow;
use std::net::IpAddr;

struct Req {
    path: String,
    host: Option<String>,
}

impl MatchRequest for Req {
    fn path(&self) -> &str {
        &self.path
    }
    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }
    fn method(&self) -> &str {
        "GET"
    }
    fn remote_addr(&self) -> IpAddr {
        IpAddr::from([127, 0, 0, 1])
    }
    fn var(&self, _var: &Var) -> Option<Cow<'_, str>> {
        None
    }
}

fn routes(n: usize) -> Vec<RouteSpec<usize>> {
    (0..n)
        .map(|i| {
            let svc = i / 3;
            let mut s = match i % 3 {
                0 => RouteSpec::new(format!("/api/v1/svc{svc}/items/:id"), i),
                1 => RouteSpec::new(format!("/api/v1/svc{svc}/status"), i),
                _ => RouteSpec::new(format!("/assets/{svc}/*"), i),
            };
            if i % 3 == 0 {
                s.methods = vec!["GET".into(), "POST".into()];
            }
            if i % 10 == 9 {
                s.hosts = vec![format!("svc{svc}.example.com")];
            }
            s
        })
        .collect()
}

fn req(path: String) -> Req {
    req_at(path, "www.example.com")
}

fn req_at(path: String, host: &str) -> Req {
    Req {
        path,
        host: Some(host.into()),
    }
}

fn bench(c: &mut Criterion) {
    for n in [1usize, 1_000, 100_000] {
        let router = Router::build(routes(n)).expect("valid routes");
        // A service in the middle whose three routes (3*mid..3*mid+2) carry no host.
        let mid = n / 60 * 10;
        // Route 3*mid+9 is the param route of svc{mid+3}, with host svc{mid+3}.example.com.
        let hosted = mid + 3;
        let cases = [
            (
                "param_hit",
                req(format!("/api/v1/svc{mid}/items/12345")),
                true,
            ),
            ("static_hit", req(format!("/api/v1/svc{mid}/status")), n > 1),
            (
                "prefix_hit",
                req(format!("/assets/{mid}/css/site.css")),
                n > 2,
            ),
            (
                "host_hit",
                req_at(
                    format!("/api/v1/svc{hosted}/items/7"),
                    &format!("svc{hosted}.example.com"),
                ),
                n > 10,
            ),
            (
                "miss",
                req(format!("/api/v1/svc{}/items/1/x", n + 7)),
                false,
            ),
        ];
        let mut params = Params::new();
        for (name, r, hit) in &cases {
            assert_eq!(router.find(r, &mut params).is_some(), *hit, "{name} at {n}");
            if !*hit && *name != "miss" {
                continue; // too few routes for this case
            }
            c.bench_function(&format!("find/{name}/{n}"), |b| {
                b.iter(|| router.find(black_box(r), &mut params).copied())
            });
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
