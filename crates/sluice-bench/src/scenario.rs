//! The benchmark matrix: every scenario the suite knows, by name, and the short default subset
//! that `make bench` runs. A scenario is plain data (what to configure, which targets, how much
//! load); it does not start processes or measure (see `runner`).

use std::time::Duration;

use serde::Serialize;
use sluice_mock::Delay;

use crate::loadgen::Stop;

/// What a load run is aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// Straight to the mock upstream (the baseline).
    Direct,
    /// The Sluice gateway.
    Sluice,
    /// nginx as a plain reverse proxy, configured by the suite.
    Nginx,
    /// HAProxy as a plain reverse proxy, configured by the suite.
    Haproxy,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Direct => "direct",
            TargetKind::Sluice => "sluice",
            TargetKind::Nginx => "nginx",
            TargetKind::Haproxy => "haproxy",
        }
    }
}

/// Plugin set configured on every route of a scenario (APISIX names and confs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Plugins {
    None,
    LimitCount,
    KeyAuth,
    KeyAuthLimitCount,
    LimitCountPrometheus,
    /// grpc-transcode (`grpc-transcode` scenario only: it writes its own routes, see `grpc`).
    GrpcTranscode,
}

impl Plugins {
    /// Names as they appear in the route's `plugins` object.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Plugins::None => &[],
            Plugins::LimitCount => &["limit-count"],
            Plugins::KeyAuth => &["key-auth"],
            Plugins::KeyAuthLimitCount => &["key-auth", "limit-count"],
            Plugins::LimitCountPrometheus => &["limit-count", "prometheus"],
            Plugins::GrpcTranscode => &["grpc-transcode"],
        }
    }

    pub fn needs_key(self) -> bool {
        matches!(self, Plugins::KeyAuth | Plugins::KeyAuthLimitCount)
    }
}

/// Gateway worker count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workers {
    One,
    All,
}

/// One named benchmark case.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    /// Chart grouping: baseline, routes, plugins, workers, concurrency, requests, rate, drivers, instructions.
    pub group: &'static str,
    pub description: String,
    pub targets: Vec<TargetKind>,
    pub routes: usize,
    pub consumers: usize,
    pub plugins: Plugins,
    pub workers: Workers,
    pub concurrency: usize,
    #[serde(skip)]
    pub stop: Stop,
    /// Requests per run when the run is count-bound (`null` for timed runs).
    pub requests: Option<u64>,
    /// Total requests/s for open-loop runs.
    pub rate: Option<f64>,
    #[serde(serialize_with = "ser_delay")]
    pub mock_delay: Delay,
    /// Run both the built-in generator and wrk, to check they agree.
    pub compare_drivers: bool,
    /// Instruction-count (callgrind) run instead of a load run.
    pub callgrind: bool,
    /// Live-apply run through the Admin API (traditional mode, embedded store) instead of a plain load run.
    pub admin: Option<AdminLoad>,
    /// gRPC run (see `grpc`): a grpc-go greeter as the origin, h2load as the generator, SayHello called
    /// directly, proxied as gRPC and transcoded from JSON; no mock.
    pub grpc_transcode: bool,
    /// Dubbo run (see `dubbo`): dubbo-go-pixiu's benchmark, Sluice's dubbo-proxy side by side with Pixiu and a
    /// direct dubbo-go client against a dubbo-go provider; no mock.
    pub dubbo: bool,
    /// `--route-plugins`: the `plugins` object (JSON) of Sluice's routes instead of `plugins`'s, to measure one
    /// plugin's cost on the same scenario.
    pub route_plugins: Option<String>,
    /// `--header`: extra request headers the generator sends (e.g. `Accept-Encoding: br` for a compressor).
    pub extra_headers: Vec<(String, String)>,
    /// Cluster run (see `cluster`): etcd, a control plane and data planes under route churn.
    pub cluster: Option<crate::cluster::ClusterLoad>,
    /// Spread the load over every route and consumer (request k of a connection goes to route
    /// k mod routes with consumer k mod consumers' key) instead of sending every request to route 1.
    #[serde(default)]
    pub spread: bool,
    /// Load generator this scenario always uses (a preset's method), instead of `--driver`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<crate::drivers::Driver>,
}

/// What a live-apply scenario does through the Admin API (see `apply`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminLoad {
    /// Time `writes` sequential `PUT /apisix/admin/routes/2?wait=applied` per round, end to end.
    Apply { writes: usize },
    /// Proxy p99 under closed-loop load, without and then with `per_sec` PUTs/s to other routes.
    Writes { per_sec: f64 },
}

fn ser_delay<S: serde::Serializer>(d: &Delay, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&d.to_string())
}

const PEERS: [TargetKind; 3] = [TargetKind::Sluice, TargetKind::Nginx, TargetKind::Haproxy];

impl Scenario {
    pub(crate) fn base(
        name: &str,
        group: &'static str,
        description: &str,
        targets: &[TargetKind],
        duration: Duration,
    ) -> Self {
        Scenario {
            name: name.to_string(),
            group,
            description: description.to_string(),
            targets: targets.to_vec(),
            routes: 1,
            consumers: 0,
            plugins: Plugins::None,
            workers: Workers::One,
            concurrency: 32,
            stop: Stop::Duration(duration),
            requests: None,
            rate: None,
            mock_delay: Delay::Fixed(Duration::ZERO),
            compare_drivers: false,
            route_plugins: None,
            extra_headers: Vec::new(),
            callgrind: false,
            admin: None,
            grpc_transcode: false,
            dubbo: false,
            cluster: None,
            spread: false,
            driver: None,
        }
    }

    /// Whether the scenario runs load through a gateway-like target with no plugins.
    pub fn is_plain_proxy(&self) -> bool {
        self.plugins == Plugins::None && self.routes == 1
    }
}

/// Every scenario, in report order. `duration` is the measured time of each timed run.
pub fn all(duration: Duration) -> Vec<Scenario> {
    use TargetKind::*;
    let mut v = Vec::new();
    v.push(Scenario::base(
        "direct",
        "baseline",
        "Load straight to the mock upstream (the baseline).",
        &[Direct],
        duration,
    ));
    let mut s = Scenario::base(
        "route-1",
        "routes",
        "1 route, no plugin; nginx/HAProxy side by side.",
        &PEERS,
        duration,
    );
    s.routes = 1;
    v.push(s);
    for (n, name) in [(100usize, "routes-100"), (100_000, "routes-100k")] {
        let mut s = Scenario::base(
            name,
            "routes",
            &format!("{n} routes, no plugin, request hits one of them."),
            &[Sluice],
            duration,
        );
        s.routes = n;
        v.push(s);
    }
    for (p, pname) in [
        (Plugins::LimitCount, "limit-count"),
        (Plugins::KeyAuth, "key-auth"),
        (Plugins::KeyAuthLimitCount, "key-auth+limit-count"),
        (Plugins::LimitCountPrometheus, "limit-count+prometheus"),
    ] {
        for n in [1usize, 100] {
            let spread = if n > 1 {
                " Requests rotate over every route and consumer key."
            } else {
                ""
            };
            let mut s = Scenario::base(
                &format!("{pname}-{n}"),
                "plugins",
                &format!(
                    "{pname} on {n} route(s), {n} consumer(s).{spread} nginx beside it with the equivalent config \
                     (one location per route, map-based key check -> 401, limit_req; no prometheus equivalent)."
                ),
                &[Sluice, Nginx],
                duration,
            );
            s.plugins = p;
            s.routes = n;
            s.consumers = n;
            s.spread = n > 1;
            v.push(s);
        }
    }
    for (w, name) in [(Workers::One, "workers-1"), (Workers::All, "workers-all")] {
        let mut s = Scenario::base(
            name,
            "workers",
            "1 route; gateway worker threads 1 vs all cores, c=256.",
            &PEERS,
            duration,
        );
        s.workers = w;
        s.concurrency = 256;
        v.push(s);
    }
    // APISIX's benchmark doc: wrk's defaults (10 connections), 1 worker vs all, no plugin vs limit-count +
    // prometheus (`--preset apisix`).
    for (w, wname) in [(Workers::One, "w1"), (Workers::All, "wall")] {
        for (p, pname, targets) in [
            (Plugins::None, "", &PEERS[..]),
            (
                Plugins::LimitCountPrometheus,
                "-lc-prom",
                &[Sluice, Nginx][..],
            ),
        ] {
            let mut s = Scenario::base(
                &format!("apisix-{wname}{pname}"),
                "workers",
                &format!(
                    "APISIX's benchmark method: c=10 (wrk's default), {} worker(s), {}.",
                    if w == Workers::One { "1" } else { "all" },
                    if p == Plugins::None {
                        "no plugin"
                    } else {
                        "limit-count + prometheus (nginx: limit_req)"
                    }
                ),
                targets,
                duration,
            );
            s.workers = w;
            s.plugins = p;
            s.concurrency = 10;
            v.push(s);
        }
    }
    for c in [600usize, 800, 1000, 1200] {
        let mut s = Scenario::base(
            &format!("sweep-c{c}"),
            "concurrency",
            &format!("Concurrency sweep: {c} connections against a 20 ms mock."),
            &[Direct, Sluice, Nginx, Haproxy],
            duration,
        );
        s.concurrency = c;
        s.mock_delay = Delay::Fixed(Duration::from_millis(20));
        v.push(s);
    }
    for n in [10_000u64, 100_000] {
        for c in [32usize, 128, 512, 1200] {
            let label = if n >= 1000 && n % 1000 == 0 {
                format!("{}k", n / 1000)
            } else {
                n.to_string()
            };
            let mut s = Scenario::base(
                &format!("reqs-{label}-c{c}"),
                "requests",
                &format!("Fixed request count n={n} at c={c}; throughput over the whole run."),
                &[Sluice],
                duration,
            );
            s.concurrency = c;
            s.stop = Stop::Requests(n);
            s.requests = Some(n);
            v.push(s);
        }
    }
    for r in [5_000.0f64, 10_000.0, 20_000.0] {
        let mut s = Scenario::base(
            &format!("rate-{}k", r as u64 / 1000),
            "rate",
            &format!("Open-loop fixed rate {r} req/s, latency corrected for coordinated omission."),
            &PEERS,
            duration,
        );
        s.rate = Some(r);
        s.concurrency = 64;
        v.push(s);
    }
    let mut s = Scenario::base(
        "driver-agreement",
        "drivers",
        "Each proxy with the built-in generator and with wrk: requests/s must agree within 10%.",
        &[Sluice, Nginx],
        duration,
    );
    s.compare_drivers = true;
    v.push(s);
    let mut s = Scenario::base(
        "instructions",
        "instructions",
        "valgrind callgrind: user-space instructions per request over a fixed request count, c=8.",
        &PEERS,
        duration,
    );
    s.callgrind = true;
    s.concurrency = 8;
    s.stop = Stop::Requests(20_000);
    s.requests = Some(20_000);
    v.push(s);
    for (n, name) in [
        (1_000usize, "admin-apply-1k"),
        (100_000, "admin-apply-100k"),
    ] {
        let mut s = Scenario::base(
            name,
            "admin",
            &format!(
                "{n} routes in the embedded store; PUT one route ?wait=applied, 20 sequential writes: PUT-to-applied time."
            ),
            &[Sluice],
            duration,
        );
        s.routes = n;
        s.admin = Some(AdminLoad::Apply { writes: 20 });
        v.push(s);
    }
    for (n, name) in [
        (1_000usize, "admin-writes-p99"),
        (100_000, "admin-writes-p99-100k"),
    ] {
        let mut s = Scenario::base(
            name,
            "admin",
            &format!(
                "{n} routes; closed-loop load on /hello without writes, then while 100 PUTs/s hit other routes: proxy p99 side by side."
            ),
            &[Sluice],
            duration,
        );
        s.routes = n;
        s.admin = Some(AdminLoad::Writes { per_sec: 100.0 });
        v.push(s);
    }
    let mut s = Scenario::base(
        "grpc-transcode",
        "grpc",
        "grpc-go greeter SayHello with h2load: direct gRPC, proxied as gRPC (scheme grpc), transcoded from JSON \
         (HTTP/1.1 and h2c); Sluice CPU and instructions per request. Needs Go and h2load.",
        &[TargetKind::Direct, TargetKind::Sluice],
        duration,
    );
    s.routes = 2;
    s.plugins = Plugins::GrpcTranscode;
    s.grpc_transcode = true;
    v.push(s);
    let mut s = Scenario::base(
        "dubbo",
        "dubbo",
        "dubbo-go-pixiu's benchmark report (POST {\"types\":\"object\",\"values\":{\"name\":\"tc\"}} to a generic \
         call, wrk -c20): Sluice's dubbo-proxy, dubbo-go-pixiu v1.1.0 (Zookeeper discovery) and a direct dubbo-go \
         client against one dubbo-go provider, in one run. Needs Go, wrk, curl; Pixiu also root (unshare -n) and \
         Debian's zookeeper.",
        &[TargetKind::Direct, TargetKind::Sluice],
        duration,
    );
    s.concurrency = crate::dubbo::CONCURRENCY;
    s.dubbo = true;
    v.push(s);
    v.extend(crate::cluster::scenarios(duration));
    v
}

/// The scenarios a `--preset pixiu` (dubbo-go-pixiu's benchmark report) runs.
pub const PIXIU: &[&str] = &["dubbo"];

/// Names of the short default matrix (`sluice bench` with no scenario flags).
pub const SHORT: &[&str] = &[
    "direct",
    "route-1",
    "routes-100",
    "routes-100k",
    "key-auth+limit-count-1",
    "key-auth+limit-count-100",
    "workers-all",
    "sweep-c1000",
    "rate-10k",
    // Skipped with its reason where valgrind is missing.
    "instructions",
];

/// Selects scenarios: explicit names (with `*` suffix globs), else the full or the short matrix.
pub fn select(names: &[String], full: bool, duration: Duration) -> Result<Vec<Scenario>, String> {
    let all = all(duration);
    if names.is_empty() {
        if full {
            return Ok(all);
        }
        return Ok(all
            .into_iter()
            .filter(|s| SHORT.contains(&s.name.as_str()))
            .collect());
    }
    let mut out = Vec::new();
    for n in names {
        let hits: Vec<&Scenario> = match n.strip_suffix('*') {
            Some(prefix) => all.iter().filter(|s| s.name.starts_with(prefix)).collect(),
            None => all.iter().filter(|s| &s.name == n).collect(),
        };
        if hits.is_empty() {
            let known: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
            return Err(format!(
                "unknown scenario {n:?}; known: {}",
                known.join(", ")
            ));
        }
        for h in hits {
            if !out.iter().any(|s: &Scenario| s.name == h.name) {
                out.push(h.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_short_matrix_exists() {
        let all = all(Duration::from_secs(1));
        let mut names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate scenario names");
        for s in SHORT {
            assert!(
                all.iter().any(|x| x.name == *s),
                "short matrix names unknown scenario {s}"
            );
        }
        assert_eq!(
            select(&[], false, Duration::from_secs(1))
                .expect("short")
                .len(),
            SHORT.len()
        );
        assert_eq!(
            select(&[], true, Duration::from_secs(1))
                .expect("full")
                .len(),
            n
        );
        let sweep = select(&["sweep-*".into()], false, Duration::from_secs(1)).expect("glob");
        assert_eq!(
            sweep.iter().map(|s| s.concurrency).collect::<Vec<_>>(),
            vec![600, 800, 1000, 1200]
        );
        assert!(select(&["nope".into()], false, Duration::from_secs(1)).is_err());
    }
}
