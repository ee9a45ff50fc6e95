//! Renders the report as ONE self-contained HTML file: inline CSS, inline SVG charts (requests/s
//! per scenario, latency percentiles per scenario, requests/s and p99 per concurrency,
//! instructions per request), tables of every figure, and the environment. No scripts, no
//! external assets, so it can be mailed, archived or screenshotted as is.

use std::fmt::Write as _;

use super::{Report, ScenarioReport};

const W: f64 = 1240.0;

fn color(target: &str) -> &'static str {
    match target {
        "direct" => "#868e96",
        "sluice" => "#e8590c",
        "pixiu" => "#c2255c",
        "nginx" => "#2f9e44",
        "haproxy" => "#1c7ed6",
        _ => "#7048e8",
    }
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Label of a result series: the target, plus the driver when not the built-in one.
fn series_name(t: &super::TargetResult) -> String {
    if t.driver == "builtin" {
        t.target.clone()
    } else {
        format!("{} ({})", t.target, t.driver)
    }
}

pub(crate) fn render(r: &Report) -> String {
    let mut h = String::with_capacity(64 * 1024);
    h.push_str("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Sluice benchmark report</title><style>");
    h.push_str("body{font-family:system-ui,sans-serif;margin:24px;color:#212529;max-width:1300px}h1{margin-bottom:4px}");
    h.push_str("table{border-collapse:collapse;margin:8px 0 20px;font-size:12px}td,th{border:1px solid #dee2e6;padding:2px 5px;text-align:right}");
    h.push_str("th{background:#f1f3f5}td.l,th.l{text-align:left}.skip{color:#868e96}.sc{margin:18px 0;border-top:1px solid #ced4da;padding-top:6px}");
    h.push_str("svg text{font-size:12px;font-family:system-ui,sans-serif}.muted{color:#868e96;font-size:13px}</style></head><body>");
    let _ = write!(
        h,
        "<h1>Sluice benchmark report</h1><div class=\"muted\">{} · schema {} · {:.0} s · <code>{}</code></div>",
        esc(&r.generated_at),
        r.schema,
        r.total_seconds,
        esc(&r.command)
    );
    environment(&mut h, r);
    h.push_str("<h2>Requests/s (median of rounds)</h2>");
    let groups: Vec<(String, Vec<(String, f64)>)> = r
        .scenarios
        .iter()
        .filter(|s| !s.scenario.callgrind)
        .filter_map(|s| {
            let bars: Vec<(String, f64)> = s
                .results
                .iter()
                .filter_map(|t| t.median.as_ref().map(|m| (series_name(t), m.rps)))
                .collect();
            (!bars.is_empty()).then(|| (s.scenario.name.clone(), bars))
        })
        .collect();
    h.push_str(&bar_chart(&groups, "req/s"));
    let cg: Vec<(String, Vec<(String, f64)>)> = r
        .scenarios
        .iter()
        .filter(|s| s.scenario.callgrind)
        .map(|s| {
            let bars = s
                .results
                .iter()
                .filter_map(|t| {
                    t.median
                        .as_ref()
                        .and_then(|m| m.instructions_per_req)
                        .map(|v| (series_name(t), v))
                })
                .collect();
            (s.scenario.name.clone(), bars)
        })
        .filter(|(_, b): &(String, Vec<(String, f64)>)| !b.is_empty())
        .collect();
    if !cg.is_empty() {
        h.push_str("<h2>Instructions per request (callgrind, user space)</h2>");
        h.push_str(&bar_chart(&cg, "instructions/req"));
    }
    concurrency(&mut h, r);
    h.push_str("<h2>Scenarios</h2>");
    for s in &r.scenarios {
        scenario(&mut h, s);
    }
    h.push_str("</body></html>\n");
    h
}

fn environment(h: &mut String, r: &Report) {
    let e = &r.environment;
    let st = &r.settings;
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "not installed".into());
    let rows = [
        ("CPU", e.cpu_model.clone()),
        ("cores", e.cores.to_string()),
        ("kernel", e.kernel.clone()),
        ("OS", e.os.clone()),
        ("sluice", e.sluice_version.clone()),
        ("nginx", opt(&e.nginx_version)),
        ("HAProxy", opt(&e.haproxy_version)),
        ("wrk", opt(&e.wrk_version)),
        ("h2load", opt(&e.h2load_version)),
        ("valgrind", opt(&e.valgrind_version)),
        ("load average at start", e.load_average.clone()),
        (
            "runs",
            format!(
                "{} s measured after {} s warm-up, {} interleaved round(s), median reported; driver {}, {} generator thread(s), timeout {} s",
                st.duration_s, st.warmup_s, st.rounds, st.driver, st.generator_threads, st.timeout_s
            ),
        ),
        ("mock", format!("{} thread(s), {} B body", st.mock_threads, st.body_size)),
        (
            "CPU pinning",
            format!(
                "gateway {} · generator {} · mock {}",
                opt(&st.pin_gateway).replace("not installed", "none"),
                opt(&st.pin_generator).replace("not installed", "none"),
                opt(&st.pin_mock).replace("not installed", "none")
            ),
        ),
    ];
    h.push_str("<h2>Environment</h2><table>");
    for (k, v) in rows {
        let _ = write!(
            h,
            "<tr><th class=\"l\">{k}</th><td class=\"l\">{}</td></tr>",
            esc(&v)
        );
    }
    h.push_str("</table>");
}

fn concurrency(h: &mut String, r: &Report) {
    let sweep: Vec<&ScenarioReport> = r
        .scenarios
        .iter()
        .filter(|s| s.scenario.group == "concurrency" && s.status == "ok")
        .collect();
    if sweep.len() < 2 {
        return;
    }
    let xs: Vec<String> = sweep
        .iter()
        .map(|s| format!("c={}", s.scenario.concurrency))
        .collect();
    let mut names: Vec<String> = Vec::new();
    for s in &sweep {
        for t in &s.results {
            if t.median.is_some() && !names.contains(&t.target) {
                names.push(t.target.clone());
            }
        }
    }
    let series = |f: &dyn Fn(&super::RunResult) -> f64| -> Vec<(String, Vec<Option<f64>>)> {
        names
            .iter()
            .map(|n| {
                let ys = sweep
                    .iter()
                    .map(|s| {
                        s.results
                            .iter()
                            .find(|t| &t.target == n)
                            .and_then(|t| t.median.as_ref())
                            .map(f)
                    })
                    .collect();
                (n.clone(), ys)
            })
            .collect()
    };
    h.push_str("<h2>Concurrency sweep (20 ms mock)</h2><div style=\"display:flex;gap:10px\">");
    h.push_str(&line_chart("req/s", &xs, &series(&|m| m.rps), false, 610.0));
    h.push_str(&line_chart(
        "p99 latency µs",
        &xs,
        &series(&|m| m.latency_us.p99),
        false,
        610.0,
    ));
    h.push_str("</div>");
}

fn scenario(h: &mut String, s: &ScenarioReport) {
    let sc = &s.scenario;
    let load = match (sc.rate, sc.requests) {
        (Some(rate), _) => format!("open loop {rate:.0} req/s, c={}", sc.concurrency),
        (None, Some(n)) => format!("n={n}, c={}", sc.concurrency),
        (None, None) => format!("closed loop, c={}", sc.concurrency),
    };
    let _ = write!(
        h,
        "<div class=\"sc\"><h3>{} <span class=\"muted\">({}, {} route(s), plugins [{}], mock delay {}, {load})</span></h3><div class=\"muted\">{}</div>",
        esc(&sc.name),
        sc.group,
        sc.routes,
        sc.plugins.names().join(", "),
        sc.mock_delay,
        esc(&sc.description)
    );
    if s.status != "ok" {
        let _ = write!(
            h,
            "<p class=\"skip\">skipped: {}</p></div>",
            esc(s.skip_reason.as_deref().unwrap_or("?"))
        );
        return;
    }
    for n in &s.notes {
        let _ = write!(h, "<p><b>{}</b></p>", esc(n));
    }
    let labels: Vec<String> = ["p50", "p75", "p90", "p99", "p99.9", "p99.99", "max"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let series: Vec<(String, Vec<Option<f64>>)> = s
        .results
        .iter()
        .filter_map(|t| {
            t.median.as_ref().map(|m| {
                (
                    series_name(t),
                    m.latency_us
                        .points()
                        .iter()
                        .map(|(_, v)| (*v > 0.0).then_some(*v))
                        .collect(),
                )
            })
        })
        .collect();
    if !sc.callgrind {
        h.push_str(&line_chart(
            "latency µs (log)",
            &labels,
            &series,
            true,
            620.0,
        ));
    }
    h.push_str("<table><tr><th class=\"l\">target</th><th>driver</th><th>workers</th><th>pinned</th><th>req/s</th><th>% direct</th><th>MB/s</th>");
    h.push_str("<th>p50 µs</th><th>p75</th><th>p90</th><th>p99</th><th>p99.9</th><th>p99.99</th><th>max</th>");
    h.push_str("<th>non-2xx</th><th>connect</th><th>timeout</th><th>io</th><th>CPU µs/req</th><th>origin CPU µs/req</th><th>peak RSS MiB</th><th>instr/req</th><th>rounds req/s</th></tr>");
    for t in &s.results {
        let Some(m) = &t.median else {
            let _ = write!(
                h,
                "<tr class=\"skip\"><td class=\"l\">{}</td><td class=\"l\" colspan=\"22\">skipped: {}</td></tr>",
                esc(&t.target),
                esc(t.skip_reason.as_deref().unwrap_or("?"))
            );
            continue;
        };
        let l = &m.latency_us;
        let o =
            |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "–".into());
        // Per round: req/s, p99, foreign CPU; a contaminated round is marked (see noise.rs).
        let rounds: Vec<String> = t
            .rounds
            .iter()
            .map(|r| {
                let noise = r
                    .noise
                    .map(|n| {
                        format!(
                            " foreign {:.0}% load {:.1}",
                            n.foreign_cpu_pct, n.load_avg_1m
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "{} (p99 {:.0}{noise}){}",
                    fmt_num(r.rps),
                    r.latency_us.p99,
                    if r.contaminated { " CONTAMINATED" } else { "" }
                )
            })
            .collect();
        let pct = match m.pct_of_baseline {
            Some(v) if v > 100.0 => format!("{v:.0} ⚠ above 100%: baseline measured low"),
            v => o(v, 0),
        };
        let _ = write!(
            h,
            "<tr><td class=\"l\" style=\"color:{}\"><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{:.1}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            color(&t.target),
            esc(&t.target),
            t.driver,
            t.workers,
            esc(t.pinned_cpus.as_deref().unwrap_or("–")),
            m.rps,
            pct,
            m.bytes_per_s / 1_048_576.0,
            l.p50,
            l.p75,
            l.p90,
            l.p99,
            l.p99_9,
            l.p99_99,
            l.max,
            m.errors.non_2xx,
            m.errors.connect,
            m.errors.timeout,
            m.errors.io,
            o(m.cpu_us_per_req, 2),
            o(m.origin_cpu_us_per_req, 1),
            o(m.peak_rss_kib.map(|k| k as f64 / 1024.0), 1),
            o(m.instructions_per_req, 0),
            rounds.join("; ")
        );
    }
    h.push_str("</table></div>");
}

/// Horizontal grouped bars: one group per scenario, one bar per target.
fn bar_chart(groups: &[(String, Vec<(String, f64)>)], unit: &str) -> String {
    let bar_h = 14.0;
    let left = 190.0;
    let right = 90.0;
    let max = groups
        .iter()
        .flat_map(|(_, b)| b.iter().map(|x| x.1))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let height: f64 = groups
        .iter()
        .map(|(_, b)| b.len() as f64 * bar_h + 10.0)
        .sum::<f64>()
        + 30.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" role=\"img\">"
    );
    let mut y = 20.0;
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"12\" fill=\"#868e96\">{} (max {})</text>",
        esc(unit),
        fmt_num(max)
    );
    for (name, bars) in groups {
        let gh = bars.len() as f64 * bar_h;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            left - 8.0,
            y + gh / 2.0 + 4.0,
            esc(name)
        );
        for (target, v) in bars {
            let w = (v / max * (W - left - right)).max(1.0);
            let base = target.split(' ').next().unwrap_or(target);
            let _ = write!(
                s,
                "<rect x=\"{left}\" y=\"{y}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"><title>{}: {v:.0}</title></rect><text x=\"{:.1}\" y=\"{:.1}\">{} {}</text>",
                bar_h - 2.0,
                color(base),
                esc(target),
                left + w + 4.0,
                y + bar_h - 4.0,
                esc(target),
                fmt_num(*v)
            );
            y += bar_h;
        }
        y += 10.0;
    }
    s.push_str("</svg>");
    s
}

/// Line chart over categorical x; `log` uses a log10 y axis.
fn line_chart(
    title: &str,
    xs: &[String],
    series: &[(String, Vec<Option<f64>>)],
    log: bool,
    width: f64,
) -> String {
    let (hgt, l, r, t, b) = (280.0, 70.0, 110.0, 26.0, 30.0);
    let vals: Vec<f64> = series
        .iter()
        .flat_map(|(_, ys)| ys.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let (mut lo, mut hi) = (
        vals.iter().copied().fold(f64::MAX, f64::min),
        vals.iter().copied().fold(0.0f64, f64::max),
    );
    if vals.is_empty() {
        (lo, hi) = (1.0, 10.0);
    }
    let tf = |v: f64| if log { v.max(1e-3).log10() } else { v };
    let (a, z) = if log {
        (tf(lo).floor(), tf(hi).ceil().max(tf(lo).floor() + 1.0))
    } else {
        (0.0, hi * 1.1)
    };
    let py = |v: f64| t + (hgt - t - b) * (1.0 - (tf(v) - a) / (z - a).max(1e-9));
    let n = xs.len().max(2) as f64 - 1.0;
    let px = |i: usize| l + (width - l - r) * i as f64 / n;
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{hgt}\" role=\"img\">");
    let _ = write!(
        s,
        "<text x=\"{l}\" y=\"14\" fill=\"#495057\">{}</text>",
        esc(title)
    );
    // Grid: decades on a log axis, quarters on a linear one.
    let ticks: Vec<f64> = if log {
        (a as i32..=z as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=4).map(|i| z * i as f64 / 4.0).collect()
    };
    for v in ticks {
        let y = py(v);
        let _ = write!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e9ecef\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#868e96\">{}</text>",
            width - r,
            l - 6.0,
            y + 4.0,
            fmt_num(v)
        );
    }
    for (i, x) in xs.iter().enumerate() {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#495057\">{}</text>",
            px(i),
            hgt - 10.0,
            esc(x)
        );
    }
    for (k, (name, ys)) in series.iter().enumerate() {
        let base = name.split(' ').next().unwrap_or(name);
        let pts: Vec<String> = ys
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", px(i), py(v))))
            .collect();
        let c = color(base);
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        for (i, v) in ys.iter().enumerate() {
            if let Some(v) = v {
                let _ = write!(s, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"><title>{}: {v:.1}</title></circle>", px(i), py(*v), esc(name));
            }
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>",
            width - r + 8.0,
            t + 14.0 * k as f64 + 8.0,
            esc(name)
        );
    }
    s.push_str("</svg>");
    s
}
