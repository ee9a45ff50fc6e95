//! Dubbo 3 application-level service discovery, as a provider registered with `register-mode=instance` leaves it in
//! Zookeeper:
//!
//! * `{root}/mapping/{interface}`: the applications serving the interface, comma-separated (persistent);
//! * `{services_root}/{application}/{host:port}`: one ephemeral node per running instance, Curator's service
//!   instance JSON (`address`, `port`, `payload.metadata` with `dubbo.metadata.revision` and `dubbo.endpoints`);
//! * `{root}/metadata/{application}/{revision}`: the application's metadata for that revision (metadata-type
//!   remote): `services`, each with `name` (the interface), `group`, `version`, `protocol`, `port` and `params`.
//!
//! With Dubbo's default `metadata-type=local` there is no metadata node: the instance serves its metadata itself,
//! `MetadataService.getMetadataInfo(revision)` (group: the application, version 1.0.0) on the port its
//! `dubbo.metadata-service.url-params` name; [`metadata_request`] and [`parse_metadata_value`] are that call.
//!
//! These functions turn that text into [`Provider`]s (IO-free); [`crate::zookeeper`] reads and watches the nodes.
//! As with the interface-level entries, Zookeeper is trusted as the source of nodes, but anything that does not
//! parse is skipped (logged by the caller), never a failure.

use serde_json::Value;
use sluice_dubbo::invoke;
use sluice_dubbo::java::JavaType;
use sluice_dubbo::protocol::{Outcome, Request, Status};

use crate::provider::{Provider, DEFAULT_WEIGHT};

/// Larger node data is refused before parsing (Dubbo's instance nodes are under 1 KiB, metadata a few KiB per
/// service).
pub const MAX_DATA: usize = 1 << 20;
/// At most this many applications per interface are followed.
pub const MAX_APPS: usize = 64;

/// An application name usable as one path segment.
pub fn valid_app(a: &str) -> bool {
    !a.is_empty()
        && a.len() <= 256
        && a != "."
        && a != ".."
        && !a.contains('/')
        && !a.chars().any(char::is_control)
}

/// The applications a mapping node names (Dubbo 3 writes `app1,app2`); unusable names are dropped.
pub fn parse_mapping(data: &[u8]) -> Vec<String> {
    let mut apps: Vec<String> = String::from_utf8_lossy(data)
        .split(',')
        .map(str::trim)
        .filter(|a| valid_app(a))
        .map(str::to_owned)
        .collect();
    apps.sort();
    apps.dedup();
    apps.truncate(MAX_APPS);
    apps
}

/// A running instance of an application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// An IP address, IPv6 without brackets.
    pub host: String,
    /// The instance's port (its first protocol's).
    pub port: u16,
    /// The metadata revision its services are described under.
    pub revision: String,
    /// `dubbo.endpoints`: the port of each protocol it serves.
    pub endpoints: Vec<(String, u16)>,
    /// Where its `MetadataService` answers over the dubbo protocol (from `dubbo.metadata-service.url-params`), when
    /// it does.
    pub metadata_port: Option<u16>,
}

fn port_of(v: &Value) -> Option<u16> {
    let p = match v {
        Value::Number(n) => n.as_u64()?,
        Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    u16::try_from(p).ok().filter(|p| *p != 0)
}

/// Parses an instance node's data.
pub fn parse_instance(data: &[u8]) -> Result<Instance, String> {
    if data.len() > MAX_DATA {
        return Err(format!("instance data of {} bytes", data.len()));
    }
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("not JSON: {e}"))?;
    let address = v
        .get("address")
        .and_then(Value::as_str)
        .ok_or("no address")?;
    let bare = address
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or(address);
    // IP addresses only, as for interface-level entries: a name would be resolved while the snapshot compiles.
    let host = bare
        .parse::<std::net::IpAddr>()
        .map_err(|_| format!("address {address:?} is not an IP address"))?
        .to_string();
    let port = v.get("port").and_then(port_of).ok_or("no port")?;
    let meta = v.pointer("/payload/metadata");
    let text = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    let revision = text("dubbo.metadata.revision")
        .filter(|r| valid_app(r))
        .ok_or("no usable dubbo.metadata.revision")?
        .to_owned();
    let endpoints = text("dubbo.endpoints")
        .and_then(|e| serde_json::from_str::<Value>(e).ok())
        .and_then(|e| e.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            Some((
                e.get("protocol")?.as_str()?.to_owned(),
                port_of(e.get("port")?)?,
            ))
        })
        .collect();
    let metadata_port = text("dubbo.metadata-service.url-params")
        .and_then(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|u| u.get("protocol").and_then(Value::as_str).unwrap_or("dubbo") == "dubbo")
        .and_then(|u| u.get("port").and_then(port_of));
    Ok(Instance {
        host,
        port,
        revision,
        endpoints,
        metadata_port,
    })
}

/// One service of an application's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub interface: String,
    pub version: Option<String>,
    pub group: Option<String>,
    pub protocol: String,
    /// The port the metadata gives, when it gives one.
    pub port: Option<u16>,
    pub weight: u32,
    pub disabled: bool,
}

/// Parses an application's metadata (`{"app", "revision", "services": {key: service}}`).
pub fn parse_metadata(data: &[u8]) -> Result<Vec<Service>, String> {
    if data.len() > MAX_DATA {
        return Err(format!("metadata of {} bytes", data.len()));
    }
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("not JSON: {e}"))?;
    metadata_of(&v)
}

/// The services of a metadata document (the JSON of the node, or of `MetadataInfo` as the instance returns it).
fn metadata_of(v: &Value) -> Result<Vec<Service>, String> {
    let services = v
        .get("services")
        .and_then(Value::as_object)
        .ok_or("no services")?;
    let mut out = Vec::new();
    for s in services.values() {
        let text = |k: &str| {
            s.get(k)
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
        };
        let param = |k: &str| {
            s.get("params")
                .and_then(|p| p.get(k))
                .and_then(Value::as_str)
        };
        let Some(interface) = text("name") else {
            continue;
        };
        let Ok(weight) = param("weight").map_or(Ok(DEFAULT_WEIGHT), str::parse::<u32>) else {
            continue;
        };
        out.push(Service {
            interface,
            version: text("version"),
            group: text("group"),
            protocol: text("protocol").unwrap_or_else(|| "dubbo".into()),
            port: s.get("port").and_then(port_of),
            weight,
            disabled: param("enabled") == Some("false") || param("disabled") == Some("true"),
        });
    }
    Ok(out)
}

/// The call that asks an instance of `app` for its metadata at `revision`.
pub fn metadata_request(app: &str, revision: &str) -> Request {
    let mut svc = invoke::Service::new("org.apache.dubbo.metadata.MetadataService", "1.0.0");
    svc.group = Some(app.to_owned());
    invoke::direct_request(
        &svc,
        "getMetadataInfo",
        &[JavaType::String],
        &[Value::String(revision.to_owned())],
    )
    .expect("a string argument for a String parameter")
}

/// The services of a `getMetadataInfo` answer (a `MetadataInfo` object).
pub fn parse_metadata_value(
    result: Result<Outcome, String>,
    status: Status,
) -> Result<Vec<Service>, String> {
    let v = invoke::result_json(result, status).map_err(|e| e.to_string())?;
    metadata_of(&v)
}

/// The providers of `interface` that `instance` serves, per its application's metadata.
pub fn providers(interface: &str, instance: &Instance, services: &[Service]) -> Vec<Provider> {
    services
        .iter()
        .filter(|s| s.interface == interface)
        .map(|s| {
            let endpoint = instance
                .endpoints
                .iter()
                .find(|(p, _)| *p == s.protocol)
                .map(|(_, port)| *port);
            Provider {
                protocol: s.protocol.clone(),
                host: instance.host.clone(),
                port: s.port.or(endpoint).unwrap_or(instance.port),
                version: s.version.clone(),
                group: s.group.clone(),
                weight: s.weight,
                disabled: s.disabled,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // As a Dubbo 3.3.5 Java provider writes them (register-mode instance, metadata-type remote).
    const INSTANCE: &str = r#"{"name":"app-one","id":"[::1]:37061","address":"[::1]","port":37061,"sslPort":null,"payload":{"@class":"org.apache.dubbo.registry.zookeeper.ZookeeperInstance","id":"[::1]:37061","name":"app-one","metadata":{"dubbo.endpoints":"[{\"port\":37061,\"protocol\":\"dubbo\"},{\"port\":50051,\"protocol\":\"tri\"}]","dubbo.metadata.revision":"527195993ff82f77ff2c35004cb4726b","dubbo.metadata.storage-type":"remote","meta-v":"1.0.0","timestamp":"1795800942383"}},"registrationTimeUTC":1795800942627,"serviceType":"DYNAMIC","uriSpec":null}"#;
    const METADATA: &str = r#"{"app":"app-one","revision":"527195993ff82f77ff2c35004cb4726b","services":{"g1/org.sluice.peer.DemoService:1.0.0:dubbo":{"group":"g1","name":"org.sluice.peer.DemoService","params":{"side":"provider","version":"1.0.0","group":"g1"},"path":"org.sluice.peer.DemoService","port":37061,"protocol":"dubbo","version":"1.0.0"},"org.sluice.peer.DemoService:2.0.0:tri":{"name":"org.sluice.peer.DemoService","params":{"weight":"7"},"protocol":"tri","version":"2.0.0"},"org.sluice.peer.TypesService:dubbo":{"name":"org.sluice.peer.TypesService","params":{"enabled":"false"},"protocol":"dubbo","port":"37061"}}}"#;

    #[test]
    fn a_java_provider_s_nodes_become_providers() {
        let i = parse_instance(INSTANCE.as_bytes()).unwrap();
        assert_eq!((i.host.as_str(), i.port), ("::1", 37061));
        assert_eq!(i.metadata_port, None);
        assert_eq!(i.revision, "527195993ff82f77ff2c35004cb4726b");
        assert_eq!(
            i.endpoints,
            [("dubbo".into(), 37061), ("tri".to_owned(), 50051)]
        );
        let services = parse_metadata(METADATA.as_bytes()).unwrap();
        let mut p = providers("org.sluice.peer.DemoService", &i, &services);
        p.sort_by(|a, b| a.protocol.cmp(&b.protocol));
        assert_eq!(
            p,
            [
                Provider {
                    protocol: "dubbo".into(),
                    host: "::1".into(),
                    port: 37061,
                    version: Some("1.0.0".into()),
                    group: Some("g1".into()),
                    weight: 100,
                    disabled: false,
                },
                // No port in the metadata: the endpoint of its protocol.
                Provider {
                    protocol: "tri".into(),
                    host: "::1".into(),
                    port: 50051,
                    version: Some("2.0.0".into()),
                    group: None,
                    weight: 7,
                    disabled: false,
                },
            ]
        );
        let t = providers("org.sluice.peer.TypesService", &i, &services);
        assert!(t.len() == 1 && t[0].disabled && t[0].version.is_none());
        assert!(providers("org.other.Service", &i, &services).is_empty());
    }

    #[test]
    fn a_local_metadata_instance_names_its_metadata_service() {
        // metadata-type local: the port of the instance's MetadataService.
        let local = r#"{"name":"app-local","address":"[::1]","port":20882,"payload":{"metadata":{"dubbo.endpoints":"[{\"port\":20882,\"protocol\":\"dubbo\"}]","dubbo.metadata-service.url-params":"{\"serialization\":\"hessian2\",\"version\":\"1.0.0\",\"port\":\"20883\",\"protocol\":\"dubbo\"}","dubbo.metadata.revision":"b1777e79","dubbo.metadata.storage-type":"local"}}}"#;
        let i = parse_instance(local.as_bytes()).unwrap();
        assert_eq!(i.metadata_port, Some(20883));
        let tri = local.replace(r#"\"protocol\":\"dubbo\"}""#, r#"\"protocol\":\"tri\"}""#);
        assert_eq!(parse_instance(tri.as_bytes()).unwrap().metadata_port, None);
        let req = metadata_request("app-local", "b1777e79");
        assert_eq!(req.service, "org.apache.dubbo.metadata.MetadataService");
        assert_eq!(
            (req.method.as_str(), req.param_types.as_str()),
            ("getMetadataInfo", "Ljava/lang/String;")
        );
        assert_eq!(
            req.attachment("group"),
            Some(&sluice_dubbo::hessian::Value::string("app-local"))
        );
    }

    #[test]
    fn bad_nodes_are_refused() {
        for bad in [
            "",
            "[]",
            "{nope",
            r#"{"address":"db.example","port":1,"payload":{"metadata":{"dubbo.metadata.revision":"r"}}}"#,
            r#"{"address":"10.0.0.1","port":0,"payload":{"metadata":{"dubbo.metadata.revision":"r"}}}"#,
            r#"{"address":"10.0.0.1","port":70000,"payload":{"metadata":{"dubbo.metadata.revision":"r"}}}"#,
            r#"{"address":"10.0.0.1","port":1,"payload":{"metadata":{}}}"#,
            // A revision is a path segment: it may not climb out of the metadata node.
            r#"{"address":"10.0.0.1","port":1,"payload":{"metadata":{"dubbo.metadata.revision":"../../x"}}}"#,
        ] {
            assert!(parse_instance(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(parse_instance(&vec![b' '; MAX_DATA + 1]).is_err());
        assert!(parse_metadata(b"{}").is_err());
        assert!(parse_metadata(b"[1]").is_err());
        // A service without a name or with a bad weight is skipped, the others kept.
        let m = parse_metadata(
            br#"{"services":{"a":{"version":"1"},"b":{"name":"x.Y","params":{"weight":"-1"}},"c":{"name":"x.Z"}}}"#,
        )
        .unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].interface.as_str(), m[0].protocol.as_str()),
            ("x.Z", "dubbo")
        );
    }

    #[test]
    fn mappings_name_usable_applications_only() {
        assert_eq!(parse_mapping(b"b, a,,a"), ["a", "b"]);
        assert!(parse_mapping(b"../x,a/b,.,..").is_empty());
        assert_eq!(parse_mapping(b"").len(), 0);
    }
}
