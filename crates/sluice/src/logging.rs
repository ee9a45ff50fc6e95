//! The error log (tracing) and the SIGUSR1 reopen of both logs.
//!
//! Level: `SLUICE_LOG` or `RUST_LOG` (tracing's filter syntax) when set, else `nginx_config.error_log_level`
//! mapped from nginx's levels. Destination: `nginx_config.error_log` when set, else stderr (APISIX writes
//! `logs/error.log`; Sluice runs in the foreground, where the terminal or the supervisor collects stderr). Colour
//! codes go only to a terminal, never to a file or a pipe.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use sluice_proxy::AccessLogHandle;

/// APISIX's prefix: the directory holding `conf/`. Relative log paths are taken from it.
pub fn prefix(config: &Path) -> PathBuf {
    config
        .parent()
        .and_then(Path::parent)
        .map_or_else(PathBuf::new, Path::to_path_buf)
}

/// nginx's error_log levels as tracing levels (notice has no tracing counterpart: info; crit, alert and emerg
/// are errors).
pub fn level(nginx: &str) -> Result<&'static str, String> {
    Ok(match nginx {
        "debug" => "debug",
        "info" | "notice" => "info",
        "warn" => "warn",
        "error" | "crit" | "alert" | "emerg" => "error",
        o => {
            return Err(format!(
                "nginx_config.error_log_level: {o:?} is not one of debug, info, notice, warn, error, crit, alert, emerg"
            ))
        }
    })
}

struct ErrorFile {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

static ERROR_FILE: OnceLock<ErrorFile> = OnceLock::new();

fn open(p: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
}

/// Writes one formatted event to the error log file (tracing's fmt layer hands over a whole event per write).
struct FileWriter;

impl Write for FileWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match ERROR_FILE.get() {
            Some(f) => match f.file.lock() {
                Ok(mut g) => g.write(buf),
                Err(p) => p.into_inner().write(buf),
            },
            None => Ok(buf.len()),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the error log for `sluice start -c config`. A config file that cannot be read or parsed leaves the
/// defaults (stderr, warn): `start` reports that error itself.
pub fn init(config: &Path) -> Result<(), String> {
    let node = std::fs::read_to_string(config)
        .ok()
        .and_then(|t| sluice_store::parse_node_config(&t).ok())
        .unwrap_or_default();
    let env = ["SLUICE_LOG", "RUST_LOG"]
        .into_iter()
        .find(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    let filter = match env {
        Some(var) => {
            tracing_subscriber::EnvFilter::try_from_env(var).map_err(|e| format!("{var}: {e}"))?
        }
        None => tracing_subscriber::EnvFilter::new(level(&node.nginx_config.error_log_level)?),
    };
    let path = node
        .nginx_config
        .error_log
        .as_deref()
        .filter(|p| !matches!(*p, "stderr" | "/dev/stderr"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match path {
        None => {
            let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(ansi).with_writer(std::io::stderr).init();
        }
        Some(p) => {
            let path = prefix(config).join(p);
            let file = open(&path)
                .map_err(|e| format!("opening the error log {}: {e}", path.display()))?;
            let _ = ERROR_FILE.set(ErrorFile {
                path,
                file: Mutex::new(file),
            });
            builder.with_ansi(false).with_writer(|| FileWriter).init();
        }
    }
    Ok(())
}

/// Opens the error log file again (after logrotate renamed it).
fn reopen_error_log() {
    let Some(f) = ERROR_FILE.get() else { return };
    match open(&f.path) {
        Ok(new) => match f.file.lock() {
            Ok(mut g) => *g = new,
            Err(p) => *p.into_inner() = new,
        },
        Err(e) => {
            tracing::error!(path = %f.path.display(), error = %e, "cannot reopen the error log")
        }
    }
}

/// nginx's `kill -USR1`: reopen the error log and the access log, for logrotate's rename-then-signal.
pub async fn reopen_on_usr1(access: Option<AccessLogHandle>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
        tracing::error!("cannot listen for SIGUSR1: logs will not be reopened");
        return;
    };
    while usr1.recv().await.is_some() {
        reopen_error_log();
        if let Some(a) = &access {
            a.reopen();
        }
        tracing::info!("SIGUSR1: logs reopened");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_levels_map_to_tracing() {
        assert_eq!(level("warn"), Ok("warn"));
        assert_eq!(level("notice"), Ok("info"));
        assert_eq!(level("emerg"), Ok("error"));
        assert!(level("verbose").is_err());
        assert_eq!(
            prefix(Path::new("/opt/sluice/conf/config.yaml")),
            Path::new("/opt/sluice")
        );
        assert_eq!(prefix(Path::new("conf/config.yaml")), Path::new(""));
    }
}
