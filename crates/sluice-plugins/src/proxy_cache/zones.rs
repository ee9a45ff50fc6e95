//! `apisix.proxy_cache` (config.yaml): the zones proxy-cache stores into, built once per process and kept in
//! [`crate::Shared`] so a reload keeps every cached answer. A zone opens on the first route that names it (a disk
//! zone then scans its directory, as nginx's cache loader does), so an unused default zone never touches the disk.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_model::{CacheZoneSection, ProxyCacheSection};

use super::disk::DiskZone;
use super::memory::MemZone;

/// A zone's settings, checked.
#[derive(Debug, Clone)]
pub(crate) struct ZoneConf {
    pub name: String,
    pub memory_size: u64,
    pub disk: Option<DiskConf>,
}

#[derive(Debug, Clone)]
pub(crate) struct DiskConf {
    pub path: PathBuf,
    pub size: u64,
    /// nginx's `levels`: the widths (1 or 2 hex digits) of the sub-directories, taken from the end of the md5.
    pub levels: Vec<usize>,
}

/// An open zone.
pub(crate) enum Zone {
    Memory(MemZone),
    Disk(DiskZone),
}

/// Every configured zone (see the module docs).
pub struct Zones {
    /// `apisix.proxy_cache.cache_ttl`: how long a disk zone keeps an answer that carries no freshness of its own
    /// (nginx's `proxy_cache_valid any`).
    pub(crate) cache_ttl: Duration,
    confs: Vec<ZoneConf>,
    open: Mutex<Vec<(String, Arc<Zone>)>>,
}

impl Default for Zones {
    /// APISIX's defaults (apisix/cli/config.lua): `disk_cache_one` (50m index, 1G on disk under
    /// /tmp/disk_cache_one, levels 1:2), `memory_cache` (50m), `cache_ttl: 10s`.
    fn default() -> Self {
        let section = ProxyCacheSection {
            cache_ttl: None,
            zones: vec![
                CacheZoneSection {
                    name: "disk_cache_one".into(),
                    memory_size: Some("50m".into()),
                    disk_size: Some("1G".into()),
                    disk_path: Some("/tmp/disk_cache_one".into()),
                    cache_levels: Some("1:2".into()),
                },
                CacheZoneSection {
                    name: "memory_cache".into(),
                    memory_size: Some("50m".into()),
                    ..Default::default()
                },
            ],
        };
        // The defaults are valid.
        Zones::from_conf(Some(&section)).unwrap_or_else(|_| Zones {
            cache_ttl: Duration::from_secs(10),
            confs: Vec::new(),
            open: Mutex::default(),
        })
    }
}

/// An nginx size: bytes, or a number with `k`, `m` or `g` (either case).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid size {s:?}"))
}

/// nginx's `levels`: one to three widths of 1 or 2, separated by `:`.
pub(crate) fn parse_levels(s: &str) -> Result<Vec<usize>, String> {
    let bad =
        || format!("invalid cache_levels {s:?} (nginx's levels: 1 to 3 of 1 or 2, as \"1:2\")");
    let levels: Vec<usize> = s
        .split(':')
        .map(|p| match p.trim() {
            "1" => Ok(1),
            "2" => Ok(2),
            _ => Err(bad()),
        })
        .collect::<Result<_, _>>()?;
    if levels.is_empty() || levels.len() > 3 {
        return Err(bad());
    }
    Ok(levels)
}

impl Zones {
    /// Checks `apisix.proxy_cache` (`None`: APISIX's defaults). A zone with a `disk_path` is a disk zone; APISIX
    /// declares it only when `disk_size` and `cache_levels` are set too, so Sluice asks for them.
    pub fn from_conf(section: Option<&ProxyCacheSection>) -> Result<Zones, String> {
        let Some(section) = section else {
            return Ok(Zones::default());
        };
        let cache_ttl = section
            .cache_ttl
            .map(|t| t.0)
            .unwrap_or(Duration::from_secs(10));
        let mut confs: Vec<ZoneConf> = Vec::new();
        for z in &section.zones {
            let at = |e: String| format!("apisix.proxy_cache.zones {:?}: {e}", z.name);
            if z.name.is_empty() {
                return Err("apisix.proxy_cache.zones: a zone has no name".into());
            }
            if confs.iter().any(|c| c.name == z.name) {
                return Err(at("declared twice".into()));
            }
            let memory_size = parse_size(z.memory_size.as_deref().unwrap_or("50m")).map_err(at)?;
            let disk = match &z.disk_path {
                None => None,
                Some(p) => {
                    let size = z
                        .disk_size
                        .as_deref()
                        .ok_or_else(|| at("disk_path without disk_size".into()))?;
                    let levels = z
                        .cache_levels
                        .as_deref()
                        .ok_or_else(|| at("disk_path without cache_levels".into()))?;
                    Some(DiskConf {
                        path: PathBuf::from(p),
                        size: parse_size(size).map_err(at)?,
                        levels: parse_levels(levels).map_err(at)?,
                    })
                }
            };
            confs.push(ZoneConf {
                name: z.name.clone(),
                memory_size,
                disk,
            });
        }
        Ok(Zones {
            cache_ttl,
            confs,
            open: Mutex::default(),
        })
    }

    /// The zone's settings, if it is declared.
    pub(crate) fn conf(&self, name: &str) -> Option<&ZoneConf> {
        self.confs.iter().find(|c| c.name == name)
    }

    /// The open zone, opened on first use (a disk zone creates and scans its directory).
    pub(crate) fn open(&self, name: &str) -> Result<Arc<Zone>, String> {
        let conf = self
            .conf(name)
            .ok_or_else(|| format!("cache_zone {name} not found"))?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, z)) = open.iter().find(|(n, _)| n == name) {
            return Ok(z.clone());
        }
        let zone = Arc::new(match &conf.disk {
            None => Zone::Memory(MemZone::new(conf.memory_size)),
            Some(d) => Zone::Disk(DiskZone::open(d, conf.memory_size)?),
        });
        open.push((name.to_owned(), zone.clone()));
        Ok(zone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_levels_as_nginx_writes_them() {
        assert_eq!(parse_size("50m"), Ok(50 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("100"), Ok(100));
        for bad in ["", "m", "-1m", "1t", "0"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_levels("1:2"), Ok(vec![1, 2]));
        assert_eq!(parse_levels("2"), Ok(vec![2]));
        for bad in ["", "3", "1:2:1:1", "1:", "a"] {
            assert!(parse_levels(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn disk_zones_need_size_and_levels() {
        let z = |disk_size: Option<&str>, levels: Option<&str>| {
            Zones::from_conf(Some(&ProxyCacheSection {
                cache_ttl: None,
                zones: vec![CacheZoneSection {
                    name: "d".into(),
                    memory_size: Some("1m".into()),
                    disk_size: disk_size.map(Into::into),
                    disk_path: Some("/nonexistent".into()),
                    cache_levels: levels.map(Into::into),
                }],
            }))
        };
        assert!(z(Some("1m"), Some("1:2")).is_ok());
        assert!(z(None, Some("1:2")).is_err());
        assert!(z(Some("1m"), None).is_err());
        assert!(Zones::default().conf("memory_cache").is_some());
        assert!(Zones::default().conf("disk_cache_one").is_some());
    }
}
