//! APISIX standalone mode: resources come from `conf/apisix.yaml`, re-read when it changes. As in APISIX, a file is
//! only taken once it ends with the `#END` marker (so a half-written file is never applied), and a file that fails
//! to parse or to check leaves the running configuration untouched.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sluice_model::Resources;
use tokio::sync::watch;

use crate::{ConfigRx, Versioned};

/// Decides whether a parsed configuration may be applied; the binary passes the data-plane compiler here so that a
/// file the data plane would refuse never replaces a working one.
pub type Checker = Arc<dyn Fn(&Resources) -> Result<(), String> + Send + Sync>;

const END_MARKER: &str = "#END";

/// Parses apisix.yaml text. Refuses a file without the trailing `#END` marker.
pub fn parse(text: &str) -> Result<Resources, String> {
    let trimmed = text.trim_end();
    if !trimmed.ends_with(END_MARKER) {
        return Err(format!(
            "apisix.yaml is incomplete: it must end with {END_MARKER}"
        ));
    }
    let body = &trimmed[..trimmed.len() - END_MARKER.len()];
    if body.trim().is_empty() {
        return Ok(Resources::default());
    }
    serde_yaml::from_str(body).map_err(|e| format!("invalid apisix.yaml: {e}"))
}

/// Loads the file once: the configuration the gateway starts with.
pub fn load(path: &Path, check: &Checker) -> Result<Versioned, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let resources = parse(&text)?;
    check(&resources)?;
    Ok(Versioned {
        revision: 1,
        resources,
        token: 0,
    })
}

/// Watches the file (by modification time and length, polled) and publishes each new valid configuration.
pub struct Watcher {
    path: PathBuf,
    interval: Duration,
    check: Checker,
}

impl Watcher {
    pub fn new(path: PathBuf, interval: Duration, check: Checker) -> Self {
        Watcher {
            path,
            interval,
            check,
        }
    }

    /// Starts with `initial` and spawns the polling task on the current tokio runtime.
    pub fn spawn(self, initial: Versioned) -> ConfigRx {
        let seen = stamp(&self.path);
        self.spawn_after(initial, seen)
    }

    /// As `spawn`, with the file's stamp taken before `initial` was read ([`file_stamp`]), so a write landing
    /// between the first read and the watcher's start is still seen.
    pub fn spawn_after(self, initial: Versioned, seen: Option<Stamp>) -> ConfigRx {
        let (tx, rx) = watch::channel(Arc::new(initial));
        tokio::spawn(async move {
            let mut seen = seen;
            let mut revision = tx.borrow().revision;
            let mut tick = tokio::time::interval(self.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if tx.is_closed() {
                    return;
                }
                let now = stamp(&self.path);
                if now == seen {
                    continue;
                }
                let text = match tokio::fs::read_to_string(&self.path).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(path = %self.path.display(), error = %e, "cannot read apisix.yaml");
                        continue;
                    }
                };
                match parse(&text).and_then(|r| (self.check)(&r).map(|_| r)) {
                    Ok(resources) => {
                        seen = now;
                        revision += 1;
                        tracing::info!(
                            revision,
                            routes = resources.routes.len(),
                            "apisix.yaml reloaded"
                        );
                        let _ = tx.send(Arc::new(Versioned {
                            revision,
                            resources,
                            token: 0,
                        }));
                    }
                    // An incomplete file is being written: look again next tick without recording the stamp.
                    Err(e) if e.contains(END_MARKER) => {}
                    Err(e) => {
                        seen = now;
                        tracing::error!(error = %e, "apisix.yaml rejected; keeping the running configuration");
                    }
                }
            }
        });
        rx
    }
}

/// A file's modification time and length: what the watcher compares.
pub type Stamp = (SystemTime, u64);

/// The stamp of `path` now; take it before reading the file.
pub fn file_stamp(path: &Path) -> Option<Stamp> {
    stamp(path)
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = "routes:\n  - id: 1\n    uri: /hello\n    upstream:\n      nodes:\n        \"127.0.0.1:1980\": 1\n#END\n";

    fn accept_all() -> Checker {
        Arc::new(|_| Ok(()))
    }

    #[test]
    fn parses_apisix_standalone_format() {
        let r = parse(ONE).unwrap();
        assert_eq!(r.routes.len(), 1);
        assert_eq!(r.routes[0].uri.as_deref(), Some("/hello"));
        assert!(parse("#END").unwrap().routes.is_empty());
        // APISIX's `stream_routes:` section.
        let r = parse(
            "stream_routes:\n  - id: 1\n    server_port: 9100\n    sni: a.test\n    upstream:\n      nodes:\n        \"127.0.0.1:1995\": 1\n#END\n",
        )
        .unwrap();
        assert_eq!(r.stream_routes.len(), 1);
        assert_eq!(r.stream_routes[0].server_port, Some(9100));
        assert_eq!(r.stream_routes[0].sni.as_deref(), Some("a.test"));
    }

    #[test]
    fn refuses_missing_end_marker_and_bad_yaml() {
        assert!(parse("routes: []\n").unwrap_err().contains("#END"));
        assert!(parse("routes: {bad\n#END")
            .unwrap_err()
            .contains("invalid apisix.yaml"));
        assert!(parse("routes:\n  - uri: 5\n    priority: high\n#END").is_err());
    }

    #[tokio::test]
    async fn watcher_applies_valid_changes_and_keeps_old_config_on_errors() {
        let dir = std::env::temp_dir().join(format!("sluice-standalone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("apisix.yaml");
        std::fs::write(&path, ONE).unwrap();
        let check: Checker = Arc::new(|r: &Resources| {
            if r.routes
                .iter()
                .any(|r| r.uri.as_deref() == Some("/refused"))
            {
                Err("refused by checker".into())
            } else {
                Ok(())
            }
        });
        let initial = load(&path, &accept_all()).unwrap();
        let mut rx = Watcher::new(path.clone(), Duration::from_millis(20), check).spawn(initial);

        // A refused file and an incomplete file change nothing.
        std::fs::write(&path, ONE.replace("/hello", "/refused")).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        std::fs::write(&path, "routes: []\n").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            rx.borrow_and_update().resources.routes[0].uri.as_deref(),
            Some("/hello")
        );

        std::fs::write(&path, ONE.replace("/hello", "/world")).unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap()
            .unwrap();
        let v = rx.borrow().clone();
        assert_eq!(v.resources.routes[0].uri.as_deref(), Some("/world"));
        assert_eq!(v.revision, 2);
        std::fs::remove_dir_all(&dir).ok();
    }
}
