//! The Admin API's view of the running data plane ([`sluice_admin::DataPlane`]): live counters, the control
//! API's health view, the request tester and effective chains, all answered by the gateway itself.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;
use sluice_admin::{DataPlane, EffectiveError, MatchQuery, Matched, PluginRun, StatsFeed};
use sluice_proxy::{ChainEntry, Gateway, InspectError, ListenerKind, MatchInput};
use sluice_store::ConfigRx;

pub struct GatewayPlane {
    pub gateway: Gateway,
    /// The provider's configuration, for the health view's resource list (as the control API reads it).
    pub config: ConfigRx,
    /// The first plain listener, as the request tester's sends reach it (see [`proxy_target`]).
    pub proxy: Option<SocketAddr>,
}

/// Where the Admin API's request tester connects: the first `node_listen` address, on loopback when it listens on
/// every address (`0.0.0.0` / `::`). Listeners do not change on reload, so this is fixed at start.
pub fn proxy_target(addrs: &[(SocketAddr, ListenerKind)]) -> Option<SocketAddr> {
    let (a, _) = addrs.iter().find(|(_, k)| *k == ListenerKind::Plain)?;
    let ip = match a.ip() {
        IpAddr::V4(v) if v.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v) if v.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Some(SocketAddr::new(ip, a.port()))
}

struct Feed(tokio::sync::broadcast::Receiver<Arc<sluice_stats::Sample>>);

impl StatsFeed for Feed {
    fn next(&mut self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        Box::pin(async move {
            loop {
                match self.0.recv().await {
                    Ok(s) => return Some(s.to_json().to_string()),
                    // A slow reader skips the seconds it missed; the series endpoint has them.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }
}

fn runs(list: Vec<ChainEntry>) -> Vec<PluginRun> {
    list.into_iter()
        .map(|c| PluginRun {
            name: c.name.to_owned(),
            priority: c.priority,
            source: c.source,
            source_id: c.source_id,
        })
        .collect()
}

impl DataPlane for GatewayPlane {
    fn stats(&self, seconds: usize) -> Vec<Value> {
        self.gateway
            .stats_series(seconds)
            .iter()
            .map(|s| s.to_json())
            .collect()
    }

    fn stream_stats(&self) -> Vec<Value> {
        self.gateway
            .stream_stats()
            .iter()
            .map(|s| s.to_json())
            .collect()
    }

    fn stats_feed(&self) -> Box<dyn StatsFeed> {
        Box::new(Feed(self.gateway.stats_subscribe()))
    }

    fn healthcheck(&self) -> Value {
        let res = self.config.borrow().clone();
        crate::control::route(
            "/v1/healthcheck",
            &res.resources,
            &self.gateway.node_health(),
        )
        .1
    }

    fn match_request(&self, q: &MatchQuery) -> Result<Option<Matched>, String> {
        let input = MatchInput {
            method: &q.method,
            host: q.host.as_deref(),
            uri: &q.uri,
            headers: &q.headers,
            remote: q.remote_addr,
            consumer: q.consumer.as_deref(),
        };
        match self.gateway.match_request(&input) {
            Ok(m) => Ok(m.map(|m| Matched {
                route_id: m.route_id,
                plugins: runs(m.plugins),
                node: m.node,
            })),
            Err(InspectError::BadRequest(e) | InspectError::Internal(e)) => Err(e),
            Err(InspectError::UnknownConsumer) => Err(format!(
                "consumer {} not found",
                q.consumer.as_deref().unwrap_or("")
            )),
        }
    }

    fn effective(
        &self,
        id: &str,
        consumer: Option<&str>,
    ) -> Result<Option<Vec<PluginRun>>, EffectiveError> {
        match self.gateway.effective(id, consumer) {
            Ok(list) => Ok(list.map(runs)),
            Err(InspectError::UnknownConsumer) => Err(EffectiveError::UnknownConsumer),
            Err(InspectError::BadRequest(e) | InspectError::Internal(e)) => {
                Err(EffectiveError::Other(e))
            }
        }
    }

    fn proxy_addr(&self) -> Option<SocketAddr> {
        self.proxy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tester_sends_to_the_first_plain_listener_on_loopback() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let tls = (a("0.0.0.0:9443"), ListenerKind::Tls);
        let plain = |s: &str| (a(s), ListenerKind::Plain);
        assert_eq!(
            proxy_target(&[tls, plain("0.0.0.0:9080"), plain("10.1.1.1:9081")]),
            Some(a("127.0.0.1:9080"))
        );
        assert_eq!(proxy_target(&[plain("[::]:9080")]), Some(a("[::1]:9080")));
        assert_eq!(
            proxy_target(&[plain("10.1.1.1:9081"), plain("0.0.0.0:9080")]),
            Some(a("10.1.1.1:9081"))
        );
        assert_eq!(proxy_target(&[tls]), None);
    }
}
