use super::*;

fn health(n: usize) -> Health {
    Health::new(n, PassiveConfig::default())
}

#[test]
fn consecutive_tcp_failures_mark_unhealthy() {
    let h = health(2);
    h.report_failure(0, FailureKind::Tcp);
    assert!(h.is_healthy(0), "one tcp failure of 2 must not trip");
    h.report_failure(0, FailureKind::Tcp);
    assert!(!h.is_healthy(0));
    assert!(h.is_healthy(1));
    assert_eq!(h.unhealthy_count(), 1);
}

#[test]
fn success_between_failures_resets_the_count() {
    let h = health(1);
    h.report_failure(0, FailureKind::Tcp);
    h.report_success(0);
    h.report_failure(0, FailureKind::Tcp);
    assert!(h.is_healthy(0), "failures must be consecutive");
    h.report_failure(0, FailureKind::Tcp);
    assert!(!h.is_healthy(0));
}

#[test]
fn timeouts_use_their_own_threshold() {
    let h = health(1);
    for _ in 0..6 {
        h.report_failure(0, FailureKind::Timeout);
    }
    assert!(h.is_healthy(0));
    assert_eq!(h.snapshot()[0].timeouts, 6);
    h.report_failure(0, FailureKind::Timeout);
    assert!(!h.is_healthy(0));
}

#[test]
fn http_statuses_are_classified() {
    let h = health(1);
    for _ in 0..10 {
        h.report_http_status(0, 404); // in neither list: ignored
    }
    assert!(h.is_healthy(0));
    assert_eq!(h.snapshot()[0].http_failures, 0);
    for _ in 0..4 {
        h.report_http_status(0, 500);
    }
    assert_eq!(h.snapshot()[0].http_failures, 4);
    h.report_http_status(0, 200); // success resets
    assert_eq!(h.snapshot()[0].http_failures, 0);
    for _ in 0..5 {
        h.report_http_status(0, 503);
    }
    assert!(!h.is_healthy(0));
    // out-of-range statuses do not panic and are ignored
    h.report_http_status(0, 65535);
    h.report_http_status(0, 99);
}

#[test]
fn invalid_response_counts_as_http_failure() {
    let h = health(1);
    for _ in 0..5 {
        h.report_http_status(0, 0);
    }
    assert!(!h.is_healthy(0));
}

#[test]
fn successes_restore_and_failures_reset_them() {
    let h = health(1);
    h.set_healthy(0, false);
    assert_eq!(h.unhealthy_count(), 1);
    for _ in 0..4 {
        h.report_success(0);
    }
    assert_eq!(h.snapshot()[0].successes, 4);
    h.report_failure(0, FailureKind::Http);
    assert_eq!(
        h.snapshot()[0].successes,
        0,
        "successes must be consecutive"
    );
    assert!(!h.is_healthy(0));
    for _ in 0..5 {
        h.report_success(0);
    }
    assert!(h.is_healthy(0));
    assert_eq!(h.unhealthy_count(), 0);
    assert_eq!(
        h.snapshot()[0],
        NodeStatus {
            index: 0,
            healthy: true,
            successes: 0,
            http_failures: 0,
            tcp_failures: 0,
            timeouts: 0
        }
    );
}

#[test]
fn disabled_config_ignores_reports() {
    let h = Health::new(1, PassiveConfig::disabled());
    for _ in 0..300 {
        h.report_failure(0, FailureKind::Tcp);
        h.report_http_status(0, 500);
    }
    assert!(h.is_healthy(0));
    h.set_healthy(0, false); // the active-checker seam still works
    assert!(!h.is_healthy(0));
}

#[test]
fn set_healthy_clears_counters_and_keeps_count_exact() {
    let h = health(3);
    h.report_failure(1, FailureKind::Tcp);
    h.set_healthy(1, true);
    assert_eq!(h.snapshot()[1].tcp_failures, 0);
    h.set_healthy(0, false);
    h.set_healthy(0, false);
    h.set_healthy(2, false);
    assert_eq!(h.unhealthy_count(), 2);
    h.set_healthy(0, true);
    h.set_healthy(0, true);
    assert_eq!(h.unhealthy_count(), 1);
    // unknown indices are ignored / unhealthy
    h.set_healthy(9, false);
    h.report_failure(9, FailureKind::Tcp);
    assert!(!h.is_healthy(9));
    assert_eq!(h.unhealthy_count(), 1);
}

#[test]
fn concurrent_failures_count_one_transition() {
    let h = std::sync::Arc::new(Health::new(
        1,
        PassiveConfig {
            unhealthy_tcp_failures: 50,
            ..PassiveConfig::default()
        },
    ));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let h = h.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    h.report_failure(0, FailureKind::Tcp);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert!(!h.is_healthy(0));
    assert_eq!(h.unhealthy_count(), 1);
}

#[test]
fn upstreams_without_passive_checks_share_one_rule_set_and_keep_their_own_state() {
    // Issue 16: the disabled rules are one shared value, not ~180 bytes per upstream; node state stays per Health.
    let a = Health::new(1, PassiveConfig::disabled());
    let b = Health::new(3, PassiveConfig::disabled());
    assert!(Arc::ptr_eq(&a.rules, &b.rules));
    assert_eq!(b.config(), &PassiveConfig::disabled());
    b.set_healthy(2, false);
    assert!(a.is_healthy(0) && !b.is_healthy(2));
    // Disabled: a failing status counts nothing.
    a.report_http_status(0, 500);
    assert!(a.is_healthy(0));
    // A configured one gets its own rules and classifies with them.
    let c = health(1);
    assert!(!Arc::ptr_eq(&a.rules, &c.rules));
    for _ in 0..5 {
        c.report_http_status(0, 500);
    }
    assert!(!c.is_healthy(0));
}
