//! Live reload of apisix.yaml under load through the real binary: 4 client tasks hammer a route that exists in
//! every version while the file is atomically rewritten 12 times (plus one invalid file); every request must
//! succeed, each version's new route must become live, and the invalid file must change nothing.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::process::Sluice;
use crate::support::{t, Client, Origin};

fn version(i: usize, a: &Origin, b: &Origin) -> String {
    // The stable route's upstream alternates between the two origins, so each reload changes what it serves.
    let stable = if i.is_multiple_of(2) { a } else { b };
    let mut y = format!(
        "routes:\n  - id: stable\n    uri: /stable\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n",
        stable.addr
    );
    y.push_str(&format!(
        "  - id: v{i}\n    uri: /v{i}\n    upstream:\n      type: roundrobin\n      nodes:\n        \"{}\": 1\n",
        a.addr
    ));
    y.push_str("#END\n");
    y
}

/// Polls (bounded) until `path` answers 200 and, if given, from `origin`.
async fn wait_live(addr: std::net::SocketAddr, path: &str, origin: Option<&str>) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    let mut c = Client::connect(addr).await;
    while Instant::now() < end {
        let r = c.get(path).await;
        if r.status == 200 && origin.is_none_or(|o| r.origin() == o) {
            return true;
        }
        if r.closes() {
            c = Client::connect(addr).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reload_under_load_has_zero_failures() {
    let a = Origin::start("A").await;
    let b = Origin::start("B").await;
    let gw = Sluice::start(&version(0, &a, &b), 2).await;
    let addr = gw.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for k in 0..4 {
        let (stop, ok) = (stop.clone(), ok.clone());
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut c = Client::connect(addr).await;
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) && n < 200_000 {
                // Half the clients also open fresh connections now and then.
                if k % 2 == 1 && n.is_multiple_of(25) {
                    c = Client::connect(addr).await;
                }
                let r = c.get("/stable").await;
                if r.status == 200 && (r.origin() == "A" || r.origin() == "B") {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failures.push(format!("{} {}", r.status, r.origin()));
                }
                if r.closes() {
                    c = Client::connect(addr).await;
                }
                n += 1;
            }
            failures
        }));
    }

    t(async {
        for i in 1..=12 {
            gw.write_config(&version(i, &a, &b));
            let want = if i.is_multiple_of(2) { "A" } else { "B" };
            assert!(
                wait_live(addr, &format!("/v{i}"), None).await,
                "version {i}: /v{i} never became live"
            );
            assert!(
                wait_live(addr, "/stable", Some(want)).await,
                "version {i}: /stable not moved to {want}"
            );
            if i == 6 {
                // An invalid file (it has the #END marker) is rejected and the running config stays.
                gw.write_config("routes:\n  - id: x\n    uri: 5\n    upstream: nope\n#END\n");
                tokio::time::sleep(Duration::from_millis(400)).await;
                let mut c = Client::connect(addr).await;
                assert_eq!(
                    c.get("/v6").await.status,
                    200,
                    "a bad file must keep the old config"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The old routes are gone once replaced.
        let mut c = Client::connect(addr).await;
        assert_eq!(c.get("/v1").await.status, 404);
        assert_eq!(c.get("/v12").await.status, 200);
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for task in tasks {
        failures.extend(t(task).await.expect("client task"));
    }
    let total = ok.load(Ordering::Relaxed);
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        total + failures.len(),
        &failures[..failures.len().min(10)]
    );
    assert!(total > 500, "too little load to mean anything: {total}");
    assert!(a.count() > 0 && b.count() > 0);
}
