//! Prometheus text exposition of [`Metrics`] and the tiny HTTP server that serves it. Rendering walks the
//! registry once under its read lock; it never blocks a request (requests touch only their cached series).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Hist, Labels, Metrics};
use crate::Shared;

const LAT_TYPES: [&str; 3] = ["request", "upstream", "apisix"];

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

fn ms(us: u64) -> String {
    let v = us as f64 / 1000.0;
    format!("{v}")
}

fn fmt_bound(b: f64) -> String {
    format!("{b}")
}

pub(super) fn render(m: &Metrics) -> String {
    let mut out = String::with_capacity(4096);
    // Loaded before the series are read (Acquire pairs with `record`'s Release): the series shown include at
    // least these requests.
    let total = m.requests.load(Ordering::Acquire);
    let bounds = m.bounds().to_vec();
    let series: Vec<(Labels, Arc<super::Series>)> = match m.series.read() {
        Ok(map) => map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Err(_) => Vec::new(),
    };
    let conns = m.conns.read().ok().and_then(|g| g.as_ref().map(|f| f()));
    let _ = writeln!(out, "# HELP apisix_http_requests_total The total number of client requests since APISIX started");
    let _ = writeln!(out, "# TYPE apisix_http_requests_total gauge");
    let _ = writeln!(out, "apisix_http_requests_total {total}");
    if let Some(c) = conns {
        let _ = writeln!(
            out,
            "# HELP apisix_nginx_http_current_connections Number of HTTP connections"
        );
        let _ = writeln!(out, "# TYPE apisix_nginx_http_current_connections gauge");
        for (state, v) in [
            ("accepted", c.accepted),
            ("active", c.active),
            ("handled", c.handled),
            ("reading", c.reading),
            ("waiting", c.waiting),
            ("writing", c.writing),
        ] {
            let _ = writeln!(
                out,
                "apisix_nginx_http_current_connections{{state=\"{state}\"}} {v}"
            );
        }
    }
    let _ = writeln!(out, "# HELP apisix_node_info Info of APISIX node");
    let _ = writeln!(out, "# TYPE apisix_node_info gauge");
    let _ = writeln!(
        out,
        "apisix_node_info{{hostname=\"{}\",version=\"{}\"}} 1",
        esc(&hostname()),
        env!("CARGO_PKG_VERSION")
    );

    let _ = writeln!(
        out,
        "# HELP apisix_http_status HTTP status codes per service in APISIX"
    );
    let _ = writeln!(out, "# TYPE apisix_http_status counter");
    let mut sorted = series.clone();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (l, s) in &sorted {
        let _ = writeln!(
            out,
            "apisix_http_status{{code=\"{}\",route=\"{}\",matched_uri=\"{}\",matched_host=\"{}\",service=\"{}\",consumer=\"{}\",node=\"{}\"}} {}",
            l.code,
            esc(&l.route),
            esc(&l.matched_uri),
            esc(&l.matched_host),
            esc(&l.service),
            esc(&l.consumer),
            esc(&l.node),
            s.status.load(Ordering::Relaxed)
        );
    }

    // Latency and bandwidth have no `code` or `matched_*` labels: sum the series per (route, service, consumer,
    // node).
    type Key = (Box<str>, Box<str>, Box<str>, Box<str>);
    type Agg = (Vec<[u64; 3]>, [u64; 3], [u64; 3], u64, u64);
    let mut agg: BTreeMap<Key, Agg> = BTreeMap::new();
    for (l, s) in &sorted {
        let e = agg
            .entry((
                l.route.clone(),
                l.service.clone(),
                l.consumer.clone(),
                l.node.clone(),
            ))
            .or_insert_with(|| (vec![[0; 3]; bounds.len() + 1], [0; 3], [0; 3], 0, 0));
        for (t, h) in s.latency.iter().enumerate() {
            add_hist(h, t, &mut e.0, &mut e.1, &mut e.2);
        }
        e.3 += s.ingress.load(Ordering::Relaxed);
        e.4 += s.egress.load(Ordering::Relaxed);
    }
    let _ = writeln!(
        out,
        "# HELP apisix_http_latency HTTP request latency in milliseconds per service in APISIX"
    );
    let _ = writeln!(out, "# TYPE apisix_http_latency histogram");
    for ((route, service, consumer, node), (buckets, sums, counts, _, _)) in &agg {
        for (t, ty) in LAT_TYPES.iter().enumerate() {
            if counts[t] == 0 {
                continue;
            }
            let labels = format!(
                "type=\"{ty}\",route=\"{}\",service=\"{}\",consumer=\"{}\",node=\"{}\"",
                esc(route),
                esc(service),
                esc(consumer),
                esc(node)
            );
            let mut acc = 0;
            for (i, b) in bounds.iter().enumerate() {
                acc += buckets[i][t];
                let _ = writeln!(
                    out,
                    "apisix_http_latency_bucket{{{labels},le=\"{}\"}} {acc}",
                    fmt_bound(*b)
                );
            }
            acc += buckets[bounds.len()][t];
            let _ = writeln!(
                out,
                "apisix_http_latency_bucket{{{labels},le=\"+Inf\"}} {acc}"
            );
            let _ = writeln!(out, "apisix_http_latency_sum{{{labels}}} {}", ms(sums[t]));
            let _ = writeln!(out, "apisix_http_latency_count{{{labels}}} {}", counts[t]);
        }
    }
    let _ = writeln!(
        out,
        "# HELP apisix_bandwidth Total bandwidth in bytes consumed per service in APISIX"
    );
    let _ = writeln!(out, "# TYPE apisix_bandwidth counter");
    for ((route, service, consumer, node), (_, _, _, ingress, egress)) in &agg {
        for (ty, v) in [("egress", egress), ("ingress", ingress)] {
            let _ = writeln!(
                out,
                "apisix_bandwidth{{type=\"{ty}\",route=\"{}\",service=\"{}\",consumer=\"{}\",node=\"{}\"}} {v}",
                esc(route),
                esc(service),
                esc(consumer),
                esc(node)
            );
        }
    }
    if let Ok(srcs) = m.text.read() {
        for f in srcs.iter() {
            f(&mut out);
        }
    }
    out
}

fn add_hist(
    h: &Hist,
    t: usize,
    buckets: &mut [[u64; 3]],
    sums: &mut [u64; 3],
    counts: &mut [u64; 3],
) {
    for (i, b) in h.buckets.iter().enumerate() {
        buckets[i][t] += b.load(Ordering::Relaxed);
    }
    sums[t] += h.sum_us.load(Ordering::Relaxed);
    counts[t] += h.count.load(Ordering::Relaxed);
}

/// Serves `GET /apisix/prometheus/metrics` on `listener` until the task is dropped. Other paths get 404. The
/// binary spawns it on its own runtime with the same [`Shared`] it compiles snapshots with.
pub async fn serve_metrics(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                true
            })
            .await;
            if !matches!(read, Ok(true)) {
                return;
            }
            let line = buf.split(|b| *b == b'\n').next().unwrap_or(&[]);
            let line = String::from_utf8_lossy(line);
            let mut parts = line.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let path = path.split('?').next().unwrap_or("");
            let (status, ctype, body) =
                if path == "/apisix/prometheus/metrics" && (method == "GET" || method == "HEAD") {
                    (
                        "200 OK",
                        "text/plain; version=0.0.4",
                        shared.metrics().render(),
                    )
                } else {
                    ("404 Not Found", "text/plain", "404 Not Found\n".to_owned())
                };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            if method != "HEAD" {
                let _ = sock.write_all(body.as_bytes()).await;
            }
            let _ = sock.shutdown().await;
        });
    }
}
