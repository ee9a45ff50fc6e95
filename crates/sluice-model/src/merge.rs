//! APISIX's route/service/plugin_config merge (`apisix/plugin.lua` merge_service_route and merge_consumer_route's
//! route half): what a route effectively is once its references are resolved. Pure, so it is unit-tested here and
//! computed once per snapshot, never per request.

use crate::{Plugins, Route, Service, Upstream};

/// A route with its service (and plugin_config) folded in: what the compiler turns into a runtime route.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveRoute {
    pub route: Route,
    pub plugins: Plugins,
    /// The inline upstream, or `None` when `upstream_id` names a shared one. Shared with the route (or service)
    /// it came from, and with the upstream runtime compiled from it.
    pub upstream: Option<std::sync::Arc<Upstream>>,
    pub upstream_id: Option<crate::Id>,
    pub hosts: Vec<String>,
    pub enable_websocket: bool,
}

/// Merges a route with its service and plugin_config plugins as APISIX does: the service's plugins apply unless
/// the route configures the same plugin; plugin_config plugins are added under the route's own; the route's
/// upstream (inline or by id) wins over the service's; the route's hosts win over the service's.
pub fn merge_route_service(
    route: &Route,
    service: Option<&Service>,
    plugin_config: Option<&Plugins>,
) -> EffectiveRoute {
    let mut plugins = Plugins::new();
    if let Some(s) = service {
        plugins.extend(s.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if let Some(pc) = plugin_config {
        plugins.extend(pc.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    plugins.extend(route.plugins.iter().map(|(k, v)| (k.clone(), v.clone())));

    let (upstream, upstream_id) = if route.upstream.is_some() || route.upstream_id.is_some() {
        (route.upstream.clone(), route.upstream_id.clone())
    } else if let Some(s) = service {
        (s.upstream.clone(), s.upstream_id.clone())
    } else {
        (None, None)
    };

    let mut hosts = route.all_hosts();
    if hosts.is_empty() {
        if let Some(s) = service {
            hosts = s.hosts.clone();
        }
    }
    let enable_websocket = route
        .enable_websocket
        .or(service.and_then(|s| s.enable_websocket))
        .unwrap_or(false);

    EffectiveRoute {
        route: route.clone(),
        plugins,
        upstream,
        upstream_id,
        hosts,
        enable_websocket,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(v: serde_json::Value) -> Route {
        serde_json::from_value(v).unwrap()
    }
    fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn route_plugins_override_service_plugins_by_name() {
        let r = route(json!({"id": 1, "uri": "/a", "plugins": {"limit-count": {"count": 1}}}));
        let s = service(
            json!({"id": "s", "plugins": {"limit-count": {"count": 9}, "key-auth": {}},
                               "upstream": {"nodes": {"127.0.0.1:1": 1}}}),
        );
        let e = merge_route_service(&r, Some(&s), None);
        assert_eq!(e.plugins["limit-count"], json!({"count": 1}));
        assert!(e.plugins.contains_key("key-auth"));
        assert!(
            e.upstream.is_some(),
            "service upstream used when the route has none"
        );
    }

    #[test]
    fn route_upstream_id_beats_service_inline_upstream() {
        let r = route(json!({"id": 1, "uri": "/a", "upstream_id": "u1"}));
        let s = service(json!({"id": "s", "upstream": {"nodes": {"127.0.0.1:1": 1}}}));
        let e = merge_route_service(&r, Some(&s), None);
        assert!(e.upstream.is_none());
        assert_eq!(e.upstream_id.unwrap().0, "u1");
    }

    #[test]
    fn hosts_and_websocket_fall_back_to_service() {
        let r = route(json!({"id": 1, "uri": "/a"}));
        let s = service(json!({"id": "s", "hosts": ["a.com"], "enable_websocket": true}));
        let e = merge_route_service(&r, Some(&s), None);
        assert_eq!(e.hosts, vec!["a.com".to_string()]);
        assert!(e.enable_websocket);
        let r = route(json!({"id": 1, "uri": "/a", "host": "b.com", "enable_websocket": false}));
        let e = merge_route_service(&r, Some(&s), None);
        assert_eq!(e.hosts, vec!["b.com".to_string()]);
        assert!(!e.enable_websocket);
    }

    #[test]
    fn plugin_config_plugins_sit_under_the_routes_own() {
        let r = route(json!({"id": 1, "uri": "/a", "plugins": {"echo": {"body": "r"}}}));
        let pc: Plugins =
            serde_json::from_value(json!({"echo": {"body": "pc"}, "cors": {}})).unwrap();
        let e = merge_route_service(&r, None, Some(&pc));
        assert_eq!(e.plugins["echo"], json!({"body": "r"}));
        assert!(e.plugins.contains_key("cors"));
    }

    #[test]
    fn nodes_map_and_list_forms() {
        let u: Upstream =
            serde_json::from_value(json!({"nodes": {"127.0.0.1:1980": 2, "[::1]:80": 1}})).unwrap();
        let l = u.nodes.to_list().unwrap();
        assert_eq!(l.len(), 2);
        assert!(l
            .iter()
            .any(|n| n.host == "127.0.0.1" && n.port == Some(1980) && n.weight == 2));
        assert!(l.iter().any(|n| n.host == "::1" && n.port == Some(80)));
        let u: Upstream = serde_json::from_value(
            json!({"type": "chash", "key": "remote_addr", "nodes": [{"host": "a", "port": 1, "weight": 3, "priority": -1}]}),
        )
        .unwrap();
        assert_eq!(u.kind, "chash");
        assert_eq!(u.scheme, "http");
        assert_eq!(u.pass_host, "pass");
        assert_eq!(u.nodes.to_list().unwrap()[0].priority, -1);
        let bad: Upstream = serde_json::from_value(json!({"nodes": {"host:port": 1}})).unwrap();
        assert!(bad.nodes.to_list().is_err());
    }

    #[test]
    fn partial_keepalive_pool_takes_defaults() {
        let u: Upstream =
            serde_json::from_value(json!({"nodes": {"a:1": 1}, "keepalive_pool": {"size": 1024}}))
                .unwrap();
        assert_eq!(u.keepalive_pool.size, 1024);
        assert_eq!(u.keepalive_pool.idle_timeout, 60.0);
        assert_eq!(u.keepalive_pool.requests, 1000);
    }

    #[test]
    fn route_status_and_numeric_ids() {
        let r = route(json!({"id": 7, "uri": "/a"}));
        assert_eq!(r.id.0, "7");
        assert!(r.enabled());
        assert!(!route(json!({"id": 7, "uri": "/a", "status": 0})).enabled());
    }
}
