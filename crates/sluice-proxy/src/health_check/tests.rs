//! `checks` parsing: APISIX defaults, validation.

use serde_json::json;

use super::{parse, ProbeKind};

#[test]
fn active_defaults_follow_apisix_schema() {
    let c = parse(&json!({"active": {}})).unwrap();
    let a = c.active.unwrap();
    assert_eq!(a.kind, ProbeKind::Http);
    assert_eq!(a.http_path, "/");
    assert_eq!(a.timeout.as_secs_f64(), 1.0);
    assert_eq!(a.healthy_successes, 2);
    assert_eq!(a.healthy_statuses, vec![200, 302]);
    assert_eq!((a.http_failures, a.tcp_failures, a.timeouts), (5, 2, 3));
    assert!(a.unhealthy_statuses.contains(&404));
    assert!(c.passive.is_none());
}

#[test]
fn active_and_passive_values() {
    let c = parse(&json!({
        "active": {"type": "tcp", "port": 8081, "timeout": 0.5, "host": "h",
                   "healthy": {"interval": 2, "successes": 1},
                   "unhealthy": {"interval": 1, "tcp_failures": 1, "http_statuses": [500]}},
        "passive": {"unhealthy": {"http_statuses": [502], "http_failures": 3}},
    }))
    .unwrap();
    let a = c.active.unwrap();
    assert_eq!(a.kind, ProbeKind::Tcp);
    assert_eq!(a.port, Some(8081));
    assert_eq!(a.host.as_deref(), Some("h"));
    assert_eq!(a.healthy_successes, 1);
    assert_eq!(a.unhealthy_statuses, vec![500]);
    let p = c.passive.unwrap();
    assert_eq!(p.unhealthy_http_statuses, vec![502]);
    assert_eq!(p.unhealthy_http_failures, 3);
    assert_eq!(p.unhealthy_tcp_failures, 2, "default kept");
}

#[test]
fn invalid_checks_rejected() {
    assert!(
        parse(&json!({"passive": {}})).is_err(),
        "passive needs active"
    );
    assert!(parse(&json!({"active": {"type": "udp"}})).is_err());
    assert!(parse(&json!({"active": {"port": 70000}})).is_err());
    assert!(parse(&json!({"active": {"healthy": {"successes": 300}}})).is_err());
    assert!(parse(&json!({"active": {"healthy": {"http_statuses": [99]}}})).is_err());
    assert!(parse(&json!([])).is_err());
}
