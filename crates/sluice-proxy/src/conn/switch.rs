//! The protocol switches of a `Conn`: an `Upgrade` the upstream accepted (101, WebSocket: tunnelled by `ws`) and
//! requests whose upstream speaks HTTP/2 (`grpc`/`grpcs`, `h2c`/`h2`: exchanged by `h2::upstream`). Kept apart from the
//! HTTP/1.1 request path in `conn.rs`, which only dispatches here.

use std::time::Instant;

use bytes::BufMut;
use sluice_http::{parse_request, BodyKind, Limits, RequestHead, ResponseHead};
use sluice_plugins::{Chain, Ctx};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::{Conn, Done, Failure, Stage};
use crate::error::{Error, Kind};
use crate::forward::{self, OutFraming};
use crate::pool::Checkout;
use crate::snapshot::{CompiledRoute, UpstreamRt};

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// One attempt against an HTTP/2 upstream (`grpc`/`grpcs`, Sluice's `h2c`/`h2`); see `h2::upstream`. The head
    /// is first written exactly as for an HTTP/1.1 upstream (plugin edits, Host, X-Forwarded-*), then re-parsed and
    /// sent as h2, so both paths forward the same request.
    #[allow(clippy::too_many_arguments)] // the per-attempt state is borrowed piecewise from `handle`
    pub(super) async fn attempt_h2(
        &mut self,
        head: &RequestHead,
        host: Option<&str>,
        route: &CompiledRoute,
        node_idx: usize,
        body_consumed: &mut bool,
        pctx: Option<&mut Ctx<'_>>,
        chains: &[Option<&Chain>; 2],
    ) -> Result<Done, Failure> {
        use crate::h2::upstream::{exchange, Progress, RespFilter};
        let up: &UpstreamRt = &route.upstream;
        let node = &up.nodes[node_idx];
        self.upstream_head(head, up, node, host, pctx.as_deref().map(|c| &c.edits));
        // Edits and the X-Forwarded-* fields may lengthen a head that was within the limits.
        let l = self.w.shared.cfg.limits;
        let limits = Limits {
            max_headers: l.max_headers + 32,
            max_head_bytes: l.max_head_bytes + 8 * 1024,
            max_uri_bytes: l.max_uri_bytes + 8 * 1024,
        };
        let parsed = parse_request(&mut self.out, &limits);
        self.out.clear();
        let fwd = match parsed {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => {
                return Err(Failure {
                    err: Error::downstream(
                        Kind::BadRequest(400),
                        "request head after plugin edits",
                    ),
                    stage: Stage::BeforeSend,
                    body_consumed: *body_consumed,
                })
            }
        };
        let filter = pctx.map(|ctx| RespFilter { ctx, chains });
        let t0 = Instant::now();
        let r = exchange(
            &mut self.io,
            &mut self.rbuf,
            head,
            &fwd,
            up,
            node,
            route.timeouts,
            self.w.shared.cfg.header_timeout,
            filter,
        )
        .await;
        match r {
            Ok(x) => {
                up.balancer.health().report_http_status(node_idx, x.status);
                Ok(Done {
                    keep: head.keep_alive && !x.close && !self.w.shared.stopping(),
                    status: x.sent_status,
                    request_body: x.request_body,
                    response_bytes: x.response_bytes,
                    // The h2 exchange counts head and body together.
                    body_bytes: x.response_bytes,
                    upstream_latency: t0.elapsed(),
                })
            }
            Err((err, progress)) => {
                // A body streamed into an h2 stream cannot be replayed.
                *body_consumed |= progress != Progress::BeforeSend && head.body != BodyKind::Empty;
                let stage = match progress {
                    Progress::BeforeSend => Stage::BeforeSend,
                    Progress::Sent => Stage::Sent { stale: false },
                    Progress::Responding => Stage::Responding,
                };
                Err(Failure {
                    err,
                    stage,
                    body_consumed: *body_consumed,
                })
            }
        }
    }

    /// The upstream switched protocols: hand its 101 to the client and tunnel bytes until either side is done.
    /// A 101 to a request that asked for no upgrade is a protocol error (502), never passed on.
    pub(super) async fn switch_protocols(
        &mut self,
        resp: &ResponseHead,
        asked: bool,
        mut c: Checkout,
        route: &CompiledRoute,
        t_up: Instant,
    ) -> Result<Done, Error> {
        if !asked {
            return Err(Error::upstream(
                Kind::UpstreamProtocol,
                "101 to a request without an accepted upgrade",
            ));
        }
        self.out.clear();
        forward::response_head(
            resp,
            OutFraming::None,
            sluice_http::Version::Http11,
            true,
            None,
            &mut self.out,
        );
        self.out.truncate(self.out.len() - 2);
        if let Some(u) = resp.header("upgrade") {
            forward::put_header(&mut self.out, b"Upgrade", u);
        }
        self.out.put_slice(b"Connection: upgrade\r\n\r\n");
        let head_len = self.out.len() as u64;
        let upstream_latency = t_up.elapsed();
        self.io
            .write_all(&self.out)
            .await
            .map_err(|e| Error::downstream(Kind::ClientClosed, e.to_string()))?;
        self.out.clear();
        let carried = crate::ws::tunnel(
            &mut self.io,
            &mut self.rbuf,
            &mut c.conn,
            &mut self.ubuf,
            route.timeouts.read,
        )
        .await;
        Ok(Done {
            keep: false,
            status: 101,
            request_body: carried.up,
            response_bytes: head_len + carried.down,
            body_bytes: carried.down,
            upstream_latency,
        })
    }
}
