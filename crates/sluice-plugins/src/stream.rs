//! Stream (L4) plugins: APISIX's `stream_plugins` run in the `preread` phase of a TCP connection or UDP session,
//! before the upstream is dialled. Sluice has the two the issue asks for, each in its plugin's own file next to the
//! HTTP form it reuses: ip-restriction (`ip_restriction::stream`) and limit-conn (`limit_conn::stream`). A stream
//! route's `plugins` compile into a [`StreamChain`] once per snapshot; a refusal closes the connection (APISIX's
//! `ngx.exit` with a status in the stream subsystem sends nothing).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::Shared;

/// Stream plugins Sluice serves, by APISIX's name.
pub const STREAM_PLUGINS: &[&str] = &[crate::ip_restriction::NAME, crate::limit_conn::NAME];

/// APISIX stream plugins Sluice does not have (refused with a message rather than "unknown plugin").
const NOT_HERE: &[&str] = &["mqtt-proxy", "syslog", "prometheus", "traffic-split"];

/// What a stream plugin sees of a connection.
#[derive(Debug, Clone, Copy)]
pub struct StreamConn<'a> {
    pub remote: SocketAddr,
    pub local: SocketAddr,
    pub route_id: &'a str,
}

/// A preread decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preread {
    /// Proceed (after sleeping this long: limit-conn's delay for connections past `conn`).
    Continue(Duration),
    /// Close the connection unanswered; the plugin's name.
    Close(&'static str),
}

pub(crate) trait StreamPlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn priority(&self) -> i32;
    fn preread(&self, c: &StreamConn<'_>, held: &mut StreamHeld) -> Preread;
}

/// Slots a connection holds (limit-conn): released when the connection ends (dropped).
#[derive(Default)]
pub struct StreamHeld {
    pub(crate) slots: Vec<Arc<AtomicI64>>,
}

impl Drop for StreamHeld {
    fn drop(&mut self) {
        for s in &self.slots {
            s.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A stream route's plugins, by priority (highest first).
pub struct StreamChain {
    plugins: Vec<Box<dyn StreamPlugin>>,
}

impl std::fmt::Debug for StreamChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.plugins.iter().map(|p| p.name()))
            .finish()
    }
}

impl StreamChain {
    /// Compiles a stream route's `plugins` (`None` when empty), with APISIX's `stream_plugin_checker` texts.
    pub fn compile(
        plugins: &Map<String, Value>,
        shared: &Shared,
    ) -> Result<Option<StreamChain>, String> {
        if plugins.is_empty() {
            return Ok(None);
        }
        let mut out: Vec<Box<dyn StreamPlugin>> = Vec::with_capacity(plugins.len());
        for (name, conf) in plugins {
            let fail = |e: String| {
                format!("failed to check the configuration of stream plugin [{name}]: {e}")
            };
            let p: Box<dyn StreamPlugin> = match name.as_str() {
                crate::ip_restriction::NAME => {
                    Box::new(crate::ip_restriction::stream::compile(conf).map_err(fail)?)
                }
                crate::limit_conn::NAME => {
                    Box::new(crate::limit_conn::stream::compile(conf, shared).map_err(fail)?)
                }
                n if NOT_HERE.contains(&n) => {
                    return Err(format!("stream plugin [{n}] is not supported by Sluice"))
                }
                n => return Err(format!("unknown plugin [{n}]")),
            };
            out.push(p);
        }
        out.sort_by_key(|p| std::cmp::Reverse(p.priority()));
        Ok(Some(StreamChain { plugins: out }))
    }

    /// Runs every plugin's preread in order; delays add up, the first refusal ends it.
    pub fn preread(&self, c: &StreamConn<'_>, held: &mut StreamHeld) -> Preread {
        let mut delay = Duration::ZERO;
        for p in &self.plugins {
            match p.preread(c, held) {
                Preread::Continue(d) => delay += d,
                close => return close,
            }
        }
        Preread::Continue(delay)
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.name()).collect()
    }
}

/// A stream variable (`remote_addr`, `remote_port`, `server_addr`, `server_port`), as nginx's stream module
/// names them; any other is empty.
pub(crate) fn var(c: &StreamConn<'_>, name: &str) -> Option<String> {
    let ip = |a: SocketAddr| match a.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.to_string(), |v4| v4.to_string()),
        v4 => v4.to_string(),
    };
    match name {
        "remote_addr" => Some(ip(c.remote)),
        "remote_port" => Some(c.remote.port().to_string()),
        "server_addr" => Some(ip(c.local)),
        "server_port" => Some(c.local.port().to_string()),
        _ => None,
    }
}
