//! This node's identity for the node registry, in APISIX's `server_info` shape (apisix/plugins/server-info.lua):
//! `id`, `hostname`, `version`, `boot_time`, `up_time`, `last_report_time`, `etcd_version`, to which Sluice adds
//! `applied_revision`. The id is kept in a file (APISIX: `conf/apisix.uid`; Sluice: `sluice.uid` in the data
//! directory) so it survives restarts.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

/// The id stored in `data_dir/sluice.uid`, created (a random UUID v4, as APISIX's) when missing or empty.
pub fn node_id(data_dir: &Path) -> Result<String, String> {
    let path = data_dir.join("sluice.uid");
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    }
    let id = uuid_v4(rand::random());
    std::fs::write(&path, &id).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(id)
}

/// RFC 4122 version 4 text form of 16 random bytes.
fn uuid_v4(mut b: [u8; 16]) -> String {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The kernel's host name (what APISIX's `gethostname` returns), or `unknown`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The fields that do not change while the node runs; `up_time`, `last_report_time` and `applied_revision` are
/// set at each report.
pub fn server_info(id: &str, version: &str, boot_time: u64) -> Map<String, Value> {
    let v = json!({
        "id": id,
        "hostname": hostname(),
        "version": version,
        "boot_time": boot_time,
        "etcd_version": "unknown",
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `info` as reported now: with `up_time`, `last_report_time` and `applied_revision`.
pub fn report(info: &Map<String, Value>, applied: u64) -> Map<String, Value> {
    let now = unix_now();
    let boot = info.get("boot_time").and_then(Value::as_u64).unwrap_or(now);
    let mut m = info.clone();
    m.insert("up_time".into(), json!(now.saturating_sub(boot)));
    m.insert("last_report_time".into(), json!(now));
    m.insert("applied_revision".into(), json!(applied));
    m
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_id_is_created_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("sluice-uid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join("sluice.uid"));
        let a = super::node_id(&dir).unwrap();
        assert_eq!(a.len(), 36, "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert_eq!(super::node_id(&dir).unwrap(), a);
        std::fs::write(dir.join("sluice.uid"), "my-node\n").unwrap();
        assert_eq!(super::node_id(&dir).unwrap(), "my-node");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
