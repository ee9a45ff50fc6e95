//! zipkin (priority 11011, as apisix/plugins/zipkin.lua declares; config-default.yaml's comment says 12011):
//! B3 propagation in and out and Zipkin v2 JSON spans POSTed in batches to `endpoint`.
//!
//! In: the single `b3` header (`{trace}-{span}[-{sampled}[-{parent}]]`, or `0`; not passed upstream; one without
//! a span id answers 400 as APISIX does) or the `x-b3-*` headers. `x-b3-flags: 1` or a `d` sampled field forces
//! sampling, `x-b3-sampled` / the b3 sampled field `1`/`true` or `0`/`false` decides it, else `sample_ratio`. An id
//! that is not hex of the right length starts a new trace (APISIX's extractor ignores the context).
//! Out: an unsampled request carries `x-b3-sampled: 0`; a sampled one `x-b3-traceid`, `x-b3-spanid` (the proxy
//! span), `x-b3-parentspanid` (the request span) and `x-b3-sampled: 1` (or the client's `x-b3-flags`).
//! Spans: `apisix.request` (SERVER, child of the client's span) with, for `span_version` 2, `apisix.proxy` (rewrite
//! to the response head) and `apisix.response_span` (response head to log); for 1, `apisix.rewrite`,
//! `apisix.access`, `apisix.proxy` and its child `apisix.body_filter`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::registry::Entry;
use crate::trace::{self, export::Format, ExportConf, Exporter, Kind, SpanRecord};
use crate::util::parse;
use crate::{CompileEnv, Ctx, Flow, LogInfo, Phase, PhaseMask, Plugin};

pub const NAME: &str = "zipkin";
pub const PRIORITY: i32 = 11011;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &[],
        consumer: None,
        metadata: &[],
    },
};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "endpoint": {"type": "string"},
            "sample_ratio": {"type": "number", "minimum": 0.00001, "maximum": 1},
            "service_name": {"type": "string", "description": "service name for zipkin reporter",
                             "default": "APISIX"},
            "server_addr": {"type": "string",
                            "description": "default is $server_addr, you can specify your external ip address",
                            "pattern": "^[0-9]{1,3}.[0-9]{1,3}.[0-9]{1,3}.[0-9]{1,3}$"},
            "span_version": {"enum": [1, 2], "default": 2}
        },
        "required": ["endpoint", "sample_ratio"]
    })
}

#[derive(Deserialize)]
struct Conf {
    endpoint: String,
    sample_ratio: f64,
    #[serde(default = "apisix")]
    service_name: String,
    server_addr: Option<String>,
    #[serde(default = "two")]
    span_version: u8,
}

fn apisix() -> String {
    "APISIX".into()
}
fn two() -> u8 {
    2
}

fn check(v: &Value) -> Result<(), String> {
    let c: Conf = parse(&schema(), v)?;
    ExportConf::endpoint(&c.endpoint, "/api/v2/spans").map(drop)
}

struct Zipkin {
    ratio: f64,
    service: Box<str>,
    server_addr: Option<Box<str>>,
    v1: bool,
    exporter: Arc<Exporter>,
}

/// One request's spans: ids fixed in rewrite, times taken as its phases pass.
pub(crate) struct ReqSpans {
    trace_id: [u8; 16],
    request: [u8; 8],
    /// The client's span: the request span's parent.
    parent: Option<[u8; 8]>,
    proxy: [u8; 8],
    /// Rewrite start; access end (v1); response head.
    t_rewrite: u64,
    t_access: u64,
    t_head: u64,
    /// Debug sampling (`x-b3-flags: 1` or a `d` sampled field): `x-b3-flags: 1` goes upstream instead of
    /// `x-b3-sampled`.
    debug: bool,
}

fn compile(v: &Value, env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    let c: Conf = parse(&schema(), v)?;
    let (addr, host, path) = ExportConf::endpoint(&c.endpoint, "/api/v2/spans")?;
    let exporter = env.shared.exporters.get(ExportConf {
        format: Format::ZipkinV2,
        addr,
        host,
        path,
        timeout: std::time::Duration::from_secs(3),
        headers: Vec::new(),
        max_queue: 4096,
        batch_size: 1000,
        batch_timeout: std::time::Duration::from_secs(5),
        inactive: std::time::Duration::from_secs(1),
        resource: Vec::new(),
    });
    Ok(Arc::new(Zipkin {
        ratio: c.sample_ratio,
        service: c.service_name.into(),
        server_addr: c.server_addr.filter(|s| !s.is_empty()).map(Into::into),
        v1: c.span_version == 1,
        exporter,
    }))
}

/// The client's B3 context as sent: (trace, span, sampled, parent), each still raw.
type Wire<'a> = (
    Option<&'a [u8]>,
    Option<&'a [u8]>,
    Option<&'a [u8]>,
    Option<&'a [u8]>,
);

/// The single `b3` header; `Err` when it lacks a trace or span id.
fn parse_b3(b3: &[u8]) -> Result<Wire<'_>, ()> {
    if b3 == b"0" {
        return Ok((None, None, Some(b"0"), None));
    }
    let mut it = b3.splitn(4, |b| *b == b'-');
    let trace_id = it.next().filter(|t| !t.is_empty()).ok_or(())?;
    let span = it.next().filter(|t| !t.is_empty()).ok_or(())?;
    Ok((Some(trace_id), Some(span), it.next(), it.next()))
}

/// A B3 trace id as it goes out: 16 digits when the high half is zero (a 64-bit trace), else 32.
fn b3_trace(id: &[u8; 16]) -> String {
    if id[..8] == [0; 8] {
        trace::hex(&id[8..])
    } else {
        trace::hex(id)
    }
}

impl Plugin for Zipkin {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[
            Phase::Rewrite,
            Phase::Access,
            Phase::HeaderFilter,
            Phase::Log,
        ])
    }

    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        let head = ctx.req.head;
        let mut forced = head.header("x-b3-flags") == Some(b"1");
        let (trace_id, span, sampled, parent) = match head.header("b3") {
            Some(b3) => {
                trace::remove_header(ctx, "b3");
                let Ok(mut w) = parse_b3(b3) else {
                    tracing::warn!("zipkin: invalid b3 header, request refused");
                    return Flow::Respond(crate::util::error_page(400));
                };
                if w.2 == Some(b"d") {
                    trace::set_header(ctx, "x-b3-flags", "1".into());
                    forced = true;
                    w.2 = Some(b"1");
                }
                w
            }
            None => (
                head.header("x-b3-traceid"),
                head.header("x-b3-spanid"),
                head.header("x-b3-sampled"),
                head.header("x-b3-parentspanid"),
            ),
        };
        let ratio = match sampled {
            _ if forced => 1.0,
            Some(b"1" | b"true") => 1.0,
            Some(b"0" | b"false") => 0.0,
            _ => self.ratio,
        };
        if ratio <= 0.0 || rand::random::<f64>() >= ratio {
            trace::set_header(ctx, "x-b3-sampled", "0".into());
            return Flow::Continue;
        }
        // APISIX's extractor: any malformed id discards the client's context.
        let parent_ok = parent.is_none_or(|p| trace::parse_b3_span_id(p).is_some());
        let wire = match (trace_id.and_then(trace::parse_b3_trace_id), span) {
            (Some(t), Some(s)) if parent_ok => trace::parse_b3_span_id(s).map(|s| (t, s)),
            (Some(t), None) if parent_ok => Some((t, [0; 8])),
            _ => None,
        };
        if wire.is_none() && trace_id.is_some() {
            tracing::debug!("zipkin: invalid B3 ids, a new trace starts");
        }
        let (trace_id, parent) = match wire {
            Some((t, s)) => (t, (s != [0; 8]).then_some(s)),
            None => (trace::new_trace_id(), None),
        };
        let now = trace::now_ns();
        ctx.trace.get_or_insert_with(Default::default).zipkin = Some(ReqSpans {
            trace_id,
            request: trace::new_span_id(),
            parent,
            proxy: trace::new_span_id(),
            t_rewrite: now,
            t_access: now,
            t_head: 0,
            debug: forced,
        });
        Flow::Continue
    }

    fn access(&self, ctx: &mut Ctx<'_>) -> Flow {
        let Some(s) = ctx.trace.as_mut().and_then(|t| t.zipkin.as_mut()) else {
            return Flow::Continue;
        };
        s.t_access = trace::now_ns();
        let (t, req, proxy, debug) = (b3_trace(&s.trace_id), s.request, s.proxy, s.debug);
        trace::set_header(ctx, "x-b3-traceid", t);
        trace::set_header(ctx, "x-b3-parentspanid", trace::hex(&req));
        trace::set_header(ctx, "x-b3-spanid", trace::hex(&proxy));
        if debug {
            // The debug flag travels on (it implies sampling).
            trace::set_header(ctx, "x-b3-flags", "1".into());
            trace::remove_header(ctx, "x-b3-sampled");
        } else {
            trace::remove_header(ctx, "x-b3-flags");
            trace::set_header(ctx, "x-b3-sampled", "1".into());
        }
        Flow::Continue
    }

    fn header_filter(&self, ctx: &mut Ctx<'_>, _status: u16) {
        if let Some(s) = ctx.trace.as_mut().and_then(|t| t.zipkin.as_mut()) {
            s.t_head = trace::now_ns();
        }
    }

    fn log(&self, ctx: &Ctx<'_>, info: &LogInfo) {
        let Some(s) = ctx.trace.as_ref().and_then(|t| t.zipkin.as_ref()) else {
            return;
        };
        let end = trace::now_ns();
        // The request span starts when the request head arrived (ngx.req.start_time()).
        let start = end
            .saturating_sub(info.latency.as_nanos() as u64)
            .min(s.t_rewrite);
        let head = if s.t_head == 0 { end } else { s.t_head };
        let ip = match &self.server_addr {
            Some(a) => a.clone(),
            None => match ctx.req.local.ip() {
                std::net::IpAddr::V4(v4) => v4.to_string().into(),
                std::net::IpAddr::V6(_) => "".into(),
            },
        };
        let local = Some((self.service.clone(), ip, ctx.req.local.port()));
        let req = ctx.req;
        let status = info.upstream_status.unwrap_or(info.status);
        let tag = |k: &str, v: String| (k.into(), trace::Attr::Str(v.into()));
        let tags = vec![
            tag("component", "apisix".into()),
            tag(
                "http.method",
                sluice_router::MatchRequest::method(req).into(),
            ),
            tag("http.url", req.request_uri().into_owned()),
            tag("peer.ipv4", ctx.remote_ip().to_string()),
            tag("peer.port", req.peer.port().to_string()),
            tag("http.status_code", status.to_string()),
        ];
        let span =
            |id: [u8; 8], parent: Option<[u8; 8]>, name: &str, from: u64, to: u64| SpanRecord {
                trace_id: s.trace_id,
                span_id: id,
                parent,
                name: name.into(),
                kind: Kind::Internal,
                start_ns: from,
                end_ns: to.max(from),
                attrs: Vec::new(),
                error: None,
                trace_state: None,
                local: local.clone(),
            };
        let mut root = span(s.request, s.parent, "apisix.request", start, end);
        root.kind = Kind::Server;
        root.attrs = tags;
        self.exporter.submit(root);
        if self.v1 {
            let (rw, ac) = (trace::new_span_id(), trace::new_span_id());
            let rq = Some(s.request);
            self.exporter
                .submit(span(rw, rq, "apisix.rewrite", start, s.t_rewrite));
            self.exporter
                .submit(span(ac, rq, "apisix.access", s.t_rewrite, s.t_access));
            self.exporter
                .submit(span(s.proxy, rq, "apisix.proxy", s.t_access, end));
            self.exporter.submit(span(
                trace::new_span_id(),
                Some(s.proxy),
                "apisix.body_filter",
                head,
                end,
            ));
        } else {
            let rq = Some(s.request);
            self.exporter
                .submit(span(s.proxy, rq, "apisix.proxy", s.t_rewrite, head));
            self.exporter.submit(span(
                trace::new_span_id(),
                rq,
                "apisix.response_span",
                head,
                end,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_b3;

    #[test]
    fn b3_single_header() {
        assert_eq!(parse_b3(b"0"), Ok((None, None, Some(&b"0"[..]), None)));
        let (t, s, d, p) =
            parse_b3(b"80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90")
                .unwrap();
        assert_eq!(t, Some(&b"80f198ee56343ba864fe8b2a57d3eff7"[..]));
        assert_eq!(s, Some(&b"e457b5a2e4d86bd1"[..]));
        assert_eq!(d, Some(&b"1"[..]));
        assert_eq!(p, Some(&b"05e3ac9a4f6e3b90"[..]));
        assert!(parse_b3(b"80f198ee56343ba864fe8b2a57d3eff7").is_err());
        assert!(parse_b3(b"-e457b5a2e4d86bd1").is_err());
        assert!(parse_b3(b"").is_err());
    }
}
