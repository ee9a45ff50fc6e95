//! Configuration providers. Each provider produces versioned [`Resources`] on a `tokio::sync::watch` channel; the
//! binary compiles every new value into a data-plane snapshot and publishes it. Providers never touch the data
//! plane, and the data plane never depends on this crate.

pub mod api;
pub mod embedded;
pub mod etcd;
pub mod kv;
pub mod node;
pub mod standalone;

use std::sync::Arc;

use sluice_model::{CheckedConfig, NodeConfig, Resources};

/// One complete configuration as a provider saw it, with the revision it had there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Versioned {
    pub revision: u64,
    pub resources: Resources,
    /// Non-zero: `resources` is exactly the candidate the Admin API prepared under this token (see
    /// [`kv::Prepared`]), so whoever compiled that candidate for the dry run may publish that compile as is.
    pub token: u64,
}

pub type ConfigRx = tokio::sync::watch::Receiver<Arc<Versioned>>;
pub type ConfigTx = tokio::sync::watch::Sender<Arc<Versioned>>;

/// Parses `conf/config.yaml`. An empty file means all defaults. Warnings (ignored APISIX keys) are dropped: use
/// [`read_node_config`] to show them.
pub fn parse_node_config(text: &str) -> Result<NodeConfig, String> {
    read_node_config(text, "config.yaml").map(|c| c.config)
}

/// Reads config.yaml strictly (see `sluice_model::NodeConfig::from_doc`): a YAML syntax error says so with its
/// line, every other problem names its key. `origin` (the file's name) prefixes each message line.
pub fn read_node_config(text: &str, origin: &str) -> Result<CheckedConfig, String> {
    let doc: serde_yaml::Value = if text.trim().is_empty() {
        serde_yaml::Value::Null
    } else {
        serde_yaml::from_str(text).map_err(|e| format!("{origin}: YAML syntax error: {e}"))?
    };
    let doc = serde_json::to_value(&doc)
        .map_err(|e| format!("{origin}: unsupported YAML (keys must be strings): {e}"))?;
    NodeConfig::from_doc(&doc).map_err(|errs| {
        errs.iter()
            .map(|e| format!("{origin}: {e}"))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// APISIX's control API address from config.yaml: `apisix.enable_control` (default true) and `apisix.control.ip`
/// / `.port` (default 127.0.0.1:9090). Read from the raw text, since the node model does not carry it.
pub fn control_addr(text: &str) -> Result<Option<std::net::SocketAddr>, String> {
    let doc: serde_yaml::Value = if text.trim().is_empty() {
        serde_yaml::Value::Null
    } else {
        serde_yaml::from_str(text).map_err(|e| format!("invalid config.yaml: {e}"))?
    };
    let apisix = &doc["apisix"];
    if apisix["enable_control"].as_bool() == Some(false) {
        return Ok(None);
    }
    let control = &apisix["control"];
    let ip = control["ip"].as_str().unwrap_or("127.0.0.1");
    let port = control["port"].as_u64().unwrap_or(9090);
    let ip: std::net::IpAddr = ip
        .parse()
        .map_err(|_| format!("apisix.control.ip: invalid address {ip:?}"))?;
    let port =
        u16::try_from(port).map_err(|_| format!("apisix.control.port: invalid port {port}"))?;
    Ok(Some(std::net::SocketAddr::new(ip, port)))
}

/// Which provider the node configuration selects: `deployment.role_traditional.config_provider` (or
/// `role_data_plane` for data planes): `embedded` (Sluice's default), `etcd`, or `yaml` (standalone).
pub fn provider_name(cfg: &NodeConfig) -> &str {
    match cfg.deployment.role.as_str() {
        "data_plane" => &cfg.deployment.role_data_plane.config_provider,
        "control_plane" => &cfg.deployment.role_control_plane.config_provider,
        _ => &cfg.deployment.role_traditional.config_provider,
    }
}

/// `apisix.data_encryption` (keyring checked: 16 or 32 bytes per key) with the plugins' secret-field declarations.
pub fn data_encryption(
    cfg: &NodeConfig,
    plugins: sluice_secrets::PluginFields,
) -> Result<sluice_secrets::DataEncryption, String> {
    let d = &cfg.apisix.data_encryption;
    Ok(sluice_secrets::DataEncryption::new(
        sluice_secrets::Keyring::new(&d.keyring)?,
        d.enable_encrypt_fields,
        plugins,
    ))
}

/// Opens the read-write store the node configuration selects: the embedded store at `data_dir/sluice.redb`, or
/// etcd per `deployment.etcd`; `plugins` declares the plugins' secret fields (see [`data_encryption`]).
/// Standalone (`yaml`) has no read-write store: use [`standalone`] instead.
pub async fn open_store(
    cfg: &NodeConfig,
    data_dir: &std::path::Path,
    plugins: sluice_secrets::PluginFields,
) -> Result<Arc<dyn kv::Store>, String> {
    let de = Arc::new(data_encryption(cfg, plugins)?);
    match provider_name(cfg) {
        "embedded" => embedded::EmbeddedStore::open_with(&data_dir.join("sluice.redb"), de)
            .map(|s| Arc::new(s) as Arc<dyn kv::Store>)
            .map_err(|e| e.to_string()),
        "etcd" => {
            let mut ec = etcd::EtcdConfig::from_node_config(cfg)?;
            ec.last_known_good = Some(data_dir.join("etcd-last-known-good.json"));
            etcd::EtcdStore::connect_with(ec, de)
                .await
                .map(|s| Arc::new(s) as Arc<dyn kv::Store>)
                .map_err(|e| e.to_string())
        }
        other => Err(format!(
            "config_provider {other:?} has no read-write store (yaml is standalone mode)"
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn data_encryption_keys_defaults_and_errors() {
        let d = super::parse_node_config("").unwrap().apisix.data_encryption;
        assert!(d.enable_encrypt_fields);
        assert_eq!(d.keyring, ["qeddd145sfvddff3", "edd1c9f0985e76a2"]);
        let one = "apisix:\n  data_encryption:\n    keyring: abcdefghijklmnop\n";
        let d = super::parse_node_config(one)
            .unwrap()
            .apisix
            .data_encryption;
        assert_eq!(d.keyring, ["abcdefghijklmnop"]);
        assert!(d.enable_encrypt_fields);
        let off =
            "apisix:\n  data_encryption:\n    enable_encrypt_fields: false\n    keyring: []\n";
        let cfg = super::parse_node_config(off).unwrap();
        assert!(!cfg.apisix.data_encryption.enable_encrypt_fields);
        assert!(cfg.apisix.data_encryption.keyring.is_empty());
        assert!(super::data_encryption(&cfg, |_| None)
            .unwrap()
            .keyring()
            .is_empty());
        let bad = "apisix:\n  data_encryption:\n    keyring: [abcdefghijklmnop, short]\n";
        let e =
            super::data_encryption(&super::parse_node_config(bad).unwrap(), |_| None).unwrap_err();
        assert!(e.contains("keyring[1]"), "{e}");
    }

    #[test]
    fn control_addr_defaults_overrides_and_off() {
        let d = super::control_addr("").unwrap();
        assert_eq!(d.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9090"));
        let c = super::control_addr("apisix:\n  control:\n    ip: 127.0.0.2\n    port: 19090\n")
            .unwrap();
        assert_eq!(c.map(|a| a.to_string()).as_deref(), Some("127.0.0.2:19090"));
        assert_eq!(
            super::control_addr("apisix:\n  enable_control: false\n").unwrap(),
            None
        );
        assert!(super::control_addr("apisix:\n  control:\n    port: 70000\n").is_err());
    }
}
