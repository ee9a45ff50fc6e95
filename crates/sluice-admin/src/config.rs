//! The Admin API's node settings, read from `deployment.admin` in config.yaml as APISIX lays it out (`admin_key`
//! list with roles, `admin_key_required`, `allow_admin` CIDRs, `admin_listen`), plus the safety rule Sluice adds:
//! no non-loopback admin listener with an empty or sample key. Parsing only; enforcement lives in `http.rs`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ipnet::IpNet;
use serde_json::Value;
use sluice_model::NodeConfig;

/// The keys APISIX's sample configs ship with: well known, so never acceptable on a reachable listener.
pub const SAMPLE_KEYS: &[&str] = &[
    "edd1c9f034335f136f87ad84b625c8f1",
    "4054f7cf07e344346cd3f287985e76a2",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    /// Read-only: GET only.
    Viewer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminKey {
    pub name: String,
    pub key: String,
    pub role: Role,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub keys: Vec<AdminKey>,
    /// `admin_key_required: false` turns authentication off (APISIX's escape hatch).
    pub key_required: bool,
    /// Empty means every address may connect.
    pub allow: Vec<IpNet>,
    /// Standalone (yaml) mode: the configuration comes from a file, so resource writes are refused.
    pub standalone: bool,
    /// `enable_admin_cors` (APISIX's default: on): CORS headers on every answer, OPTIONS answered before auth.
    pub cors: bool,
    /// `enable_admin_ui` (APISIX 3.13+'s default: on): the dashboard at `/ui/` on this listener.
    pub ui: bool,
    /// `proxy_mode` includes `stream`: `stream_routes` are served (APISIX answers 400 otherwise).
    pub stream: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9180),
            keys: Vec::new(),
            key_required: true,
            // APISIX's default allow_admin, plus IPv6 loopback.
            allow: ["127.0.0.0/24", "::1/128"]
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect(),
            standalone: false,
            cors: true,
            ui: true,
            stream: false,
        }
    }
}

impl AdminConfig {
    /// Reads `deployment.admin`; refuses a non-loopback `admin_listen` while an admin key is empty or a sample key.
    pub fn from_node_config(cfg: &NodeConfig) -> Result<AdminConfig, String> {
        let mut out = AdminConfig {
            standalone: is_standalone(cfg),
            stream: cfg.apisix.proxy_modes().1,
            ..AdminConfig::default()
        };
        let empty = Value::Null;
        let admin = cfg.deployment.admin.as_ref().unwrap_or(&empty);
        if let Some(l) = admin.get("admin_listen") {
            let ip = l.get("ip").and_then(Value::as_str).unwrap_or("127.0.0.1");
            let port = l.get("port").and_then(Value::as_u64).unwrap_or(9180);
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| format!("deployment.admin.admin_listen.ip: invalid address {ip:?}"))?;
            let port = u16::try_from(port)
                .map_err(|_| format!("deployment.admin.admin_listen.port: invalid port {port}"))?;
            out.listen = SocketAddr::new(ip, port);
        }
        if let Some(b) = admin.get("admin_key_required").and_then(Value::as_bool) {
            out.key_required = b;
        }
        if let Some(b) = admin.get("enable_admin_cors").and_then(Value::as_bool) {
            out.cors = b;
        }
        if let Some(b) = admin.get("enable_admin_ui").and_then(Value::as_bool) {
            out.ui = b;
        }
        if let Some(list) = admin.get("admin_key").and_then(Value::as_array) {
            for (i, row) in list.iter().enumerate() {
                let field = |f: &str| row.get(f).and_then(Value::as_str).unwrap_or("").to_owned();
                let role = match field("role").as_str() {
                    "" | "admin" => Role::Admin,
                    "viewer" => Role::Viewer,
                    other => {
                        return Err(format!(
                            "deployment.admin.admin_key[{i}].role: unknown role {other:?}"
                        ))
                    }
                };
                out.keys.push(AdminKey {
                    name: field("name"),
                    key: field("key"),
                    role,
                });
            }
        }
        if let Some(list) = admin.get("allow_admin") {
            out.allow = parse_allow(list)?;
        }
        let weak = out.keys.is_empty()
            || out
                .keys
                .iter()
                .any(|k| k.key.is_empty() || SAMPLE_KEYS.contains(&k.key.as_str()));
        if !out.listen.ip().is_loopback() && (weak || !out.key_required) {
            return Err(format!(
                "refusing to start: the Admin API listens on {} (not loopback) while deployment.admin.admin_key \
                 is empty, a sample key, or not required; set a strong key or listen on 127.0.0.1",
                out.listen
            ));
        }
        Ok(out)
    }

    pub fn allowed(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.allow.is_empty() || self.allow.iter().any(|n| n.contains(&ip))
    }
}

fn parse_allow(v: &Value) -> Result<Vec<IpNet>, String> {
    let Some(list) = v.as_array() else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|s| {
            let s = s.as_str().unwrap_or("");
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("deployment.admin.allow_admin: invalid CIDR {s:?}"))
        })
        .collect()
}

fn is_standalone(cfg: &NodeConfig) -> bool {
    let d = &cfg.deployment;
    match d.role.as_str() {
        "data_plane" => d.role_data_plane.config_provider == "yaml",
        _ => d.role_traditional.config_provider == "yaml",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml_admin: Value) -> NodeConfig {
        let mut c = NodeConfig::default();
        c.deployment.admin = Some(yaml_admin);
        c
    }

    #[test]
    fn parses_keys_roles_and_allow_list() {
        let c = AdminConfig::from_node_config(&cfg(serde_json::json!({
            "admin_key": [{"name": "a", "key": "k1", "role": "admin"},
                          {"name": "v", "key": "k2", "role": "viewer"}],
            "allow_admin": ["10.0.0.0/8", "127.0.0.1"],
            "admin_listen": {"ip": "0.0.0.0", "port": 9999}
        })))
        .unwrap();
        assert_eq!(c.keys[1].role, Role::Viewer);
        assert_eq!(c.listen.port(), 9999);
        assert!(c.allowed("10.1.2.3".parse().unwrap()));
        assert!(c.allowed("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!c.allowed("192.168.0.1".parse().unwrap()));
    }

    #[test]
    fn refuses_public_listener_with_weak_key() {
        for key in ["", SAMPLE_KEYS[0]] {
            let e = AdminConfig::from_node_config(&cfg(serde_json::json!({
                "admin_key": [{"name": "a", "key": key, "role": "admin"}],
                "admin_listen": {"ip": "0.0.0.0", "port": 9180}
            })))
            .unwrap_err();
            assert!(e.contains("refusing to start"), "{e}");
        }
        // Loopback with the sample key is allowed, as is the default (no admin section at all).
        let c = AdminConfig::from_node_config(&cfg(serde_json::json!({
            "admin_key": [{"name": "a", "key": SAMPLE_KEYS[0]}],
            "admin_listen": {"ip": "127.0.0.1", "port": 9180}
        })))
        .unwrap();
        assert!(c.listen.ip().is_loopback());
        let d = AdminConfig::from_node_config(&NodeConfig::default()).unwrap();
        assert_eq!(d.listen.to_string(), "127.0.0.1:9180");
        assert!(!d.standalone);
        assert!(
            d.ui,
            "the dashboard is on by default, as APISIX's enable_admin_ui"
        );
        let off =
            AdminConfig::from_node_config(&cfg(serde_json::json!({"enable_admin_ui": false})))
                .unwrap();
        assert!(!off.ui);
    }
}
