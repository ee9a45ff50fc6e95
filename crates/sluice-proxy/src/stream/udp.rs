//! UDP on a stream listener: one session per client address, routed once when its first datagram arrives (by
//! `remote_addr`, `server_addr`, `server_port`; no SNI), with the stream plugins run then (limit-conn counts
//! sessions). A session owns a connected socket to the node the balancer picked: client datagrams go out on it,
//! its answers go back to the client from the listener's address. A session ends after its route's idle timeout
//! without a datagram either way. Each worker holds at most [`MAX_SESSIONS`]; past that, datagrams from new
//! clients are dropped until a session ends. The kernel's SO_REUSEPORT hash keeps a client on one worker.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;
use sluice_plugins::stream::{Preread, StreamConn, StreamHeld};
use sluice_upstream::{LbKind, Tried};
use tokio::net::UdpSocket;

use crate::server::Shared;

/// Sessions per worker and listener.
pub(crate) const MAX_SESSIONS: usize = 16 * 1024;
/// The largest datagram relayed (IPv4's maximum UDP payload).
const MAX_DATAGRAM: usize = 65_507;

struct Session {
    up: Rc<UdpSocket>,
    /// Datagrams moved either way (the idle watchdog's view).
    moved: Rc<Cell<u64>>,
}

/// Serves one worker's socket of a UDP listener until shutdown.
pub(crate) async fn serve(sock: UdpSocket, shared: Arc<Shared>) {
    let sock = Rc::new(sock);
    let local = match sock.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    let sessions: Rc<RefCell<AHashMap<SocketAddr, Session>>> = Rc::default();
    let mut shutdown = shared.shutdown.subscribe();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        if *shutdown.borrow() {
            return;
        }
        let (n, peer) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    // ICMP errors surface here on some systems; the socket stays usable.
                    tracing::debug!(error = %e, "stream udp: recv failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let existing = sessions
            .borrow()
            .get(&peer)
            .map(|s| (s.up.clone(), s.moved.clone()));
        if let Some((up, moved)) = existing {
            moved.set(moved.get() + 1);
            let _ = up.send(&buf[..n]).await;
            continue;
        }
        if sessions.borrow().len() >= MAX_SESSIONS {
            tracing::debug!(%peer, "stream udp: session table full; datagram dropped");
            continue;
        }
        let snap = shared.snapshot.load_full();
        let Some(r) = snap.stream.find(None, peer.ip(), local) else {
            continue;
        };
        let mut held = StreamHeld::default();
        if let Some(chain) = &r.plugins {
            let c = StreamConn {
                remote: peer,
                local,
                route_id: &r.id,
            };
            // A delay is not slept here (it would hold every other client's datagrams): UDP sessions are admitted
            // or refused.
            if let Preread::Close(by) = chain.preread(&c, &mut held) {
                tracing::debug!(%peer, route = &*r.id, plugin = by, "stream udp: refused by plugin");
                continue;
            }
        }
        let Some(up) = r.upstream.clone().filter(|u| u.missing.is_none()) else {
            continue;
        };
        let ip;
        let key = if up.balancer.kind() == LbKind::Chash {
            ip = super::canonical(peer.ip()).to_string();
            Some(ip.as_bytes())
        } else {
            None
        };
        let Some(i) = up.balancer.pick(key, &Tried::new()) else {
            continue;
        };
        let node = up.nodes[i].addr;
        let bind: SocketAddr = if node.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let upsock = match UdpSocket::bind(bind).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "stream udp: cannot open an upstream socket");
                continue;
            }
        };
        if let Err(e) = upsock.connect(node).await {
            tracing::warn!(%node, error = %e, "stream udp: cannot reach node");
            continue;
        }
        let upsock = Rc::new(upsock);
        let moved = Rc::new(Cell::new(1));
        let _ = upsock.send(&buf[..n]).await;
        sessions.borrow_mut().insert(
            peer,
            Session {
                up: upsock.clone(),
                moved: moved.clone(),
            },
        );
        let idle = r.idle_timeout;
        let (listener, table) = (sock.clone(), sessions.clone());
        let mut stop = shared.shutdown.subscribe();
        tokio::task::spawn_local(async move {
            let _held = held;
            let mut back = vec![0u8; MAX_DATAGRAM];
            let step = (idle / 8).max(Duration::from_millis(1));
            let (mut seen, mut quiet) = (moved.get(), Duration::ZERO);
            let mut tick = tokio::time::interval(step);
            tick.tick().await;
            loop {
                tokio::select! {
                    r = upsock.recv(&mut back) => {
                        // An error is an ICMP port unreachable from the node: the session stays until idle.
                        if let Ok(m) = r {
                            moved.set(moved.get() + 1);
                            let _ = listener.send_to(&back[..m], peer).await;
                        }
                    }
                    _ = tick.tick() => {
                        let now = moved.get();
                        if now == seen {
                            quiet += step;
                            if quiet >= idle {
                                break;
                            }
                        } else {
                            (seen, quiet) = (now, Duration::ZERO);
                        }
                    }
                    _ = stop.changed() => break,
                }
            }
            table.borrow_mut().remove(&peer);
        });
    }
}
