//! Which addresses the data plane listens on, from the node configuration: APISIX's `apisix.node_listen`
//! (cleartext) and `apisix.ssl` (TLS). Binding is `server::Listeners`; this only reads configuration.

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;
use sluice_model::NodeConfig;

use crate::accept::ListenerKind;

/// APISIX's default TLS port.
pub const DEFAULT_TLS_PORT: u16 = 9443;

/// Every data-plane listen address with its kind: `node_listen` entries as `Plain`, then `apisix.ssl.listen` as
/// `Tls`. `apisix.ssl.enable` defaults to true and `listen` to `[{ip: 0.0.0.0, port: 9443}]`, as in APISIX's
/// config-default.yaml; entries are `{ip, port}` objects or bare ports. Then `apisix.proxy_protocol`'s
/// `listen_http_port` and `listen_https_port` (all interfaces, as APISIX's `listen PORT proxy_protocol`), which must
/// differ from the other ports.
pub fn listen_addrs(node: &NodeConfig) -> Result<Vec<(SocketAddr, ListenerKind)>, String> {
    let mut out = node
        .apisix
        .node_listen
        .iter()
        .map(|l| l.socket_addr().map(|a| (a, ListenerKind::Plain)))
        .collect::<Result<Vec<_>, _>>()?;
    out.extend(tls_addrs(node.apisix.ssl.as_ref())?);
    if let Some(pp) = &node.apisix.proxy_protocol {
        for (port, kind, key) in [
            (pp.listen_http_port, ListenerKind::Plain, "listen_http_port"),
            (pp.listen_https_port, ListenerKind::Tls, "listen_https_port"),
        ] {
            let Some(port) = port else { continue };
            if out.iter().any(|(a, _)| a.port() == port) {
                return Err(format!(
                    "apisix.proxy_protocol.{key}: port {port} is already a listener of node_listen or ssl.listen"
                ));
            }
            let addr = SocketAddr::from(([0, 0, 0, 0], port));
            out.push((addr, kind.with_proxy_protocol(true)));
        }
    }
    Ok(out)
}

fn tls_addrs(ssl: Option<&Value>) -> Result<Vec<(SocketAddr, ListenerKind)>, String> {
    if ssl.and_then(|s| s.get("enable")).and_then(Value::as_bool) == Some(false) {
        return Ok(Vec::new());
    }
    let Some(list) = ssl.and_then(|s| s.get("listen")).and_then(Value::as_array) else {
        let any = SocketAddr::from(([0, 0, 0, 0], DEFAULT_TLS_PORT));
        return Ok(vec![(any, ListenerKind::Tls)]);
    };
    list.iter()
        .map(|l| {
            let (ip, port) = match l {
                Value::Number(p) => ("0.0.0.0", p.as_u64()),
                _ => (
                    l.get("ip").and_then(Value::as_str).unwrap_or("0.0.0.0"),
                    l.get("port").and_then(Value::as_u64),
                ),
            };
            let port = port
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| format!("apisix.ssl.listen: invalid entry {l}"))?;
            let ip: IpAddr = ip
                .trim_matches(|c| c == '[' || c == ']')
                .parse()
                .map_err(|e| format!("apisix.ssl.listen: invalid ip {ip:?}: {e}"))?;
            Ok((SocketAddr::new(ip, port), ListenerKind::Tls))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(ssl: Option<Value>) -> NodeConfig {
        let mut n = NodeConfig::default();
        n.apisix.ssl = ssl;
        n
    }

    #[test]
    fn defaults_to_9443_and_follows_apisix_ssl() {
        let all = listen_addrs(&node(None)).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].1, ListenerKind::Plain);
        assert_eq!(all[1], ("0.0.0.0:9443".parse().unwrap(), ListenerKind::Tls));
        assert_eq!(
            listen_addrs(&node(Some(json!({"enable": false}))))
                .unwrap()
                .len(),
            1
        );
        let two = listen_addrs(&node(Some(json!({
            "listen": [{"port": 8443}, {"ip": "127.0.0.1", "port": 9444}, 7443]
        }))))
        .unwrap();
        let tls: Vec<String> = two[1..].iter().map(|(a, _)| a.to_string()).collect();
        assert_eq!(tls, ["0.0.0.0:8443", "127.0.0.1:9444", "0.0.0.0:7443"]);
        assert!(listen_addrs(&node(Some(json!({"listen": [{"port": 70000}]})))).is_err());
        assert!(listen_addrs(&node(Some(json!({"listen": [{"ip": "x", "port": 1}]})))).is_err());
    }

    #[test]
    fn proxy_protocol_ports_are_extra_listeners() {
        let mut n = node(None);
        n.apisix.proxy_protocol = Some(sluice_model::ProxyProtocolSection {
            listen_http_port: Some(9181),
            listen_https_port: Some(9182),
            ..Default::default()
        });
        let all = listen_addrs(&n).unwrap();
        assert_eq!(
            all[2..],
            [
                (
                    "0.0.0.0:9181".parse().unwrap(),
                    ListenerKind::ProxyProtocol(crate::accept::Behind::Plain)
                ),
                (
                    "0.0.0.0:9182".parse().unwrap(),
                    ListenerKind::ProxyProtocol(crate::accept::Behind::Tls)
                ),
            ]
        );
        // Not a port the plain listeners already have.
        n.apisix.proxy_protocol.as_mut().unwrap().listen_http_port = Some(9080);
        assert!(listen_addrs(&n).is_err());
    }
}
