//! External load generators the suite can drive instead of its own: wrk (`--driver wrk`) and
//! h2load (`--driver h2load`, HTTP/1.1 mode), both Debian packages. Owns the command lines and the
//! parsing of their text output into the same `Measured` shape the built-in generator yields.
//! Neither does fixed-rate open-loop runs (wrk2 is not packaged); those always use the built-in one.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::loadgen::Errors;
use crate::stats::Latency;

/// Which generator produced a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    Builtin,
    Wrk,
    H2load,
    /// ApacheBench (`ab -k -n N -c C`, Debian's apache2-utils): count-bound runs only (ngxway's method).
    Ab,
}

impl Driver {
    pub fn name(self) -> &'static str {
        match self {
            Driver::Builtin => "builtin",
            Driver::Wrk => "wrk",
            Driver::H2load => "h2load",
            Driver::Ab => "ab",
        }
    }
}

/// Figures from one external run (latency percentiles only where the tool reports them).
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub requests: u64,
    pub elapsed: Duration,
    pub bytes: u64,
    /// Body bytes alone (h2load's `data` figure; 0 for wrk), to check what the answers carried.
    pub data_bytes: u64,
    pub latency: Latency,
    pub errors: Errors,
}

/// Runs `wrk -t T -c C -d D --latency` against `addr` + `path`.
pub fn wrk(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    threads: usize,
    conns: usize,
    duration: Duration,
) -> Result<Measured, String> {
    let mut cmd = Command::new("wrk");
    cmd.arg(format!("-t{}", threads.clamp(1, conns.max(1))))
        .arg(format!("-c{}", conns.max(1)))
        .arg(format!("-d{}s", duration.as_secs().max(1)))
        .arg("--latency")
        .arg("--timeout")
        .arg("5s");
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    cmd.arg(format!("http://{addr}{path}"));
    let out = cmd.output().map_err(|e| format!("wrk: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "wrk failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

/// Parses wrk's summary (with `--latency`).
pub fn parse_wrk(text: &str) -> Result<Measured, String> {
    let mut m = Measured::default();
    let mut have_requests = false;
    for line in text.lines().map(str::trim) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if line.contains(" requests in ") && f.len() >= 6 {
            // "48835 requests in 1.00s, 51.79MB read"
            m.requests = f[0].parse().map_err(|_| format!("bad wrk line {line:?}"))?;
            m.elapsed = parse_wrk_duration(f[3].trim_end_matches(','))
                .ok_or_else(|| format!("bad wrk duration in {line:?}"))?;
            m.bytes = parse_size(f[4]).unwrap_or(0);
            have_requests = true;
        } else if let (Some(p), Some(v)) = (f.first(), f.get(1)) {
            let us = parse_wrk_duration(v).map(|d| d.as_nanos() as f64 / 1000.0);
            match (*p, us) {
                ("50%", Some(us)) => m.latency.p50 = us,
                ("75%", Some(us)) => m.latency.p75 = us,
                ("90%", Some(us)) => m.latency.p90 = us,
                ("99%", Some(us)) => m.latency.p99 = us,
                ("Latency", Some(_)) => {
                    m.latency.mean = parse_wrk_duration(v)
                        .map(|d| d.as_nanos() as f64 / 1000.0)
                        .unwrap_or(0.0);
                    m.latency.max = f
                        .get(3)
                        .and_then(|x| parse_wrk_duration(x))
                        .map(|d| d.as_nanos() as f64 / 1000.0)
                        .unwrap_or(0.0);
                }
                _ => {}
            }
        }
        if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            m.errors.non_2xx = rest.trim().parse().unwrap_or(0);
        }
        if let Some(rest) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in rest.split(',') {
                let mut it = part.split_whitespace();
                let (k, v) = (
                    it.next().unwrap_or(""),
                    it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0),
                );
                match k {
                    "connect" => m.errors.connect += v,
                    "read" | "write" => m.errors.io += v,
                    "timeout" => m.errors.timeout += v,
                    _ => {}
                }
            }
        }
    }
    if !have_requests {
        return Err("wrk output has no request count".into());
    }
    Ok(m)
}

fn parse_wrk_duration(s: &str) -> Option<Duration> {
    let (num, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        return None;
    };
    let v: f64 = num.parse().ok()?;
    Some(Duration::from_secs_f64(v * scale))
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim_end_matches(',');
    let (num, mul) = if let Some(n) = s.strip_suffix("GB") {
        (n, 1u64 << 30)
    } else if let Some(n) = s.strip_suffix("MB") {
        (n, 1 << 20)
    } else if let Some(n) = s.strip_suffix("KB") {
        (n, 1 << 10)
    } else if let Some(n) = s.strip_suffix('B') {
        (n, 1)
    } else {
        (s, 1)
    };
    Some((num.parse::<f64>().ok()? * mul as f64) as u64)
}

/// Runs `ab -k -n N -c C` (keep-alive, HTTP/1.0 as ab speaks it) against `addr` + `path`.
pub fn ab(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    conns: usize,
    requests: u64,
) -> Result<Measured, String> {
    let mut cmd = Command::new("ab");
    cmd.args(["-k", "-q", "-s", "5"])
        .arg("-n")
        .arg(requests.max(conns as u64).to_string())
        .arg("-c")
        .arg(conns.max(1).to_string());
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    cmd.arg(format!("http://{addr}{path}"));
    let out = cmd.output().map_err(|e| format!("ab: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ab failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_ab(&String::from_utf8_lossy(&out.stdout))
}

/// Parses ab's summary: counts, time taken, bytes, and its percentile table (whole milliseconds).
pub fn parse_ab(text: &str) -> Result<Measured, String> {
    let mut m = Measured::default();
    let mut complete = None;
    let mut failed = 0u64;
    for line in text.lines().map(str::trim) {
        let value = |prefix: &str| {
            line.strip_prefix(prefix)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
        };
        if let Some(v) = value("Complete requests:") {
            complete = Some(v as u64);
        } else if let Some(v) = value("Failed requests:") {
            failed = v as u64;
        } else if let Some(v) = value("Non-2xx responses:") {
            m.errors.non_2xx = v as u64;
        } else if let Some(v) = value("Time taken for tests:") {
            m.elapsed = Duration::from_secs_f64(v.max(1e-9));
        } else if let Some(v) = value("Total transferred:") {
            m.bytes = v as u64;
        } else if let Some(v) = value("HTML transferred:") {
            m.data_bytes = v as u64;
        } else if let Some((p, rest)) = line.split_once('%') {
            let ms = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok());
            if let Some(ms) = ms {
                let us = ms * 1000.0;
                match p.trim() {
                    "50" => m.latency.p50 = us,
                    "75" => m.latency.p75 = us,
                    "90" => m.latency.p90 = us,
                    "99" => m.latency.p99 = us,
                    "100" => m.latency.max = us,
                    _ => {}
                }
            }
        } else if line.starts_with("Total:") {
            // "Total:          0    1   0.4      1       9": min mean sd median max (ms).
            if let Some(mean) = line
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<f64>().ok())
            {
                m.latency.mean = mean * 1000.0;
            }
        }
    }
    m.requests = complete.ok_or("ab output has no request count")?;
    // ab counts a length mismatch as failed too; only the complete ones are answers.
    m.errors.io += failed;
    Ok(m)
}

/// Runs `h2load [--h1] -c C -t T -D secs` against `addr` + `path` (h2c prior knowledge without `--h1`).
pub fn h2load(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    threads: usize,
    conns: usize,
    duration: Duration,
    h2c: bool,
) -> Result<Measured, String> {
    let mut cmd = Command::new("h2load");
    if !h2c {
        cmd.arg("--h1");
    }
    cmd.arg("-c")
        .arg(conns.max(1).to_string())
        .arg("-t")
        .arg(threads.clamp(1, conns.max(1)).to_string())
        .arg("-D")
        .arg(duration.as_secs().max(1).to_string());
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    cmd.arg(format!("http://{addr}{path}"));
    let out = cmd.output().map_err(|e| format!("h2load: {e}"))?;
    parse_h2load(&String::from_utf8_lossy(&out.stdout), duration)
}

/// Parses h2load's summary; latency has only min/max/mean there (percentiles stay 0).
pub fn parse_h2load(text: &str, duration: Duration) -> Result<Measured, String> {
    let mut m = Measured {
        elapsed: duration,
        ..Measured::default()
    };
    let mut found = false;
    for line in text.lines().map(str::trim) {
        let num_before = |word: &str| -> u64 {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.iter()
                .position(|x| x.trim_end_matches(',') == word)
                .and_then(|i| i.checked_sub(1))
                .and_then(|i| f[i].parse().ok())
                .unwrap_or(0)
        };
        if line.starts_with("requests:") {
            m.requests = num_before("done");
            m.errors.timeout = num_before("timeout");
            m.errors.io = num_before("errored");
            found = true;
        } else if line.starts_with("status codes:") {
            m.errors.non_2xx = num_before("3xx") + num_before("4xx") + num_before("5xx");
        } else if let Some(rest) = line.strip_prefix("traffic:") {
            // "46.39MB (48642216) total, 2.38MB (2493807) headers (space savings …), 42.73MB (44801024) data"
            let exact = |label: &str| -> u64 {
                rest.split('(')
                    .filter_map(|p| p.split_once(')'))
                    .find(|(_, after)| after.trim_start().starts_with(label))
                    .and_then(|(n, _)| n.parse().ok())
                    .unwrap_or(0)
            };
            m.bytes = exact("total");
            m.data_bytes = exact("data");
        } else if let Some(rest) = line.strip_prefix("time for request:") {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let us = |s: Option<&&str>| {
                s.and_then(|x| parse_wrk_duration(x))
                    .map(|d| d.as_nanos() as f64 / 1000.0)
                    .unwrap_or(0.0)
            };
            m.latency.max = us(f.get(1));
            m.latency.mean = us(f.get(2));
        }
    }
    if !found {
        return Err("h2load output has no request summary".into());
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ab -q -s 5 -n 2000 -c 8 http://127.0.0.1:<mock>/hello` against `sluice mock`, on this machine.
    const AB: &str = "This is ApacheBench, Version 2.3 <$Revision$>
Benchmarking 127.0.0.1 (be patient).....done


Server Software:        sluice-mock
Server Hostname:        127.0.0.1
Server Port:            44649

Document Path:          /hello
Document Length:        1024 bytes

Concurrency Level:      8
Time taken for tests:   0.206 seconds
Complete requests:      2000
Failed requests:        0
Total transferred:      2262000 bytes
HTML transferred:       2048000 bytes
Requests per second:    9698.47 [#/sec] (mean)
Time per request:       0.825 [ms] (mean)
Time per request:       0.103 [ms] (mean, across all concurrent requests)
Transfer rate:          10711.89 [Kbytes/sec] received

Connection Times (ms)
              min  mean[+/-sd] median   max
Connect:        0    0   0.3      0       9
Processing:     0    1   0.4      0       4
Waiting:        0    0   0.3      0       4
Total:          0    1   0.4      1      10

Percentage of the requests served within a certain time (ms)
  50%      1
  66%      1
  75%      1
  80%      1
  90%      1
  95%      1
  98%      2
  99%      3
 100%     10 (longest request)
";

    #[test]
    fn parses_ab() {
        let m = parse_ab(AB).expect("parse");
        assert_eq!(m.requests, 2000);
        assert_eq!(m.elapsed, Duration::from_secs_f64(0.206));
        assert_eq!((m.bytes, m.data_bytes), (2_262_000, 2_048_000));
        assert_eq!(
            (m.latency.p50, m.latency.p90, m.latency.p99, m.latency.max),
            (1000.0, 1000.0, 3000.0, 10_000.0)
        );
        assert_eq!(m.latency.mean, 1000.0);
        assert_eq!(m.errors, Errors::default());
        let bad = AB
            .replace("Failed requests:        0", "Failed requests:        7")
            .replace(
                "Transfer rate:",
                "Non-2xx responses:      5\nTransfer rate:",
            );
        let m = parse_ab(&bad).expect("parse");
        assert_eq!((m.errors.io, m.errors.non_2xx), (7, 5));
        assert!(parse_ab("ab: invalid URL").is_err());
    }

    const WRK: &str = "Running 1s test @ http://127.0.0.1:19801/hello
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   146.47us   53.94us   1.35ms   64.73%
    Req/Sec    49.18k   793.52    50.45k    80.00%
  Latency Distribution
     50%  142.00us
     75%  192.00us
     90%  216.00us
     99%    2.69ms
  48835 requests in 1.00s, 51.79MB read
  Socket errors: connect 1, read 2, write 3, timeout 4
  Non-2xx or 3xx responses: 7
Requests/sec:  48774.13
Transfer/sec:     51.72MB
";

    #[test]
    fn parses_wrk_output() {
        let m = parse_wrk(WRK).expect("parse");
        assert_eq!(m.requests, 48835);
        assert_eq!(m.elapsed, Duration::from_secs(1));
        assert_eq!(m.bytes, (51.79 * 1048576.0) as u64);
        assert!((m.latency.p50 - 142.0).abs() < 1e-3 && (m.latency.p99 - 2690.0).abs() < 1e-3);
        assert!((m.latency.max - 1350.0).abs() < 1e-3 && (m.latency.mean - 146.47).abs() < 1e-3);
        assert_eq!(
            m.errors,
            Errors {
                non_2xx: 7,
                connect: 1,
                timeout: 4,
                io: 5
            }
        );
        assert!(parse_wrk("nothing").is_err());
    }

    #[test]
    fn parses_h2load_output() {
        let text = "finished in 1.00s, 43743.00 req/s, 46.39MB/s
requests: 43743 total, 43751 started, 43740 done, 43700 succeeded, 3 failed, 2 errored, 1 timeout
status codes: 43700 2xx, 0 3xx, 30 4xx, 10 5xx
traffic: 46.39MB (48642216) total, 2.38MB (2493807) headers (space savings 0.00%), 42.73MB (44801024) data
                     min         max         mean         sd        +/- sd
time for request:       63us      5.41ms       182us       166us    99.14%
";
        let m = parse_h2load(text, Duration::from_secs(1)).expect("parse");
        assert_eq!(m.requests, 43740);
        assert_eq!(m.bytes, 48642216);
        assert_eq!(m.data_bytes, 44801024);
        assert_eq!(
            m.errors,
            Errors {
                non_2xx: 40,
                connect: 0,
                timeout: 1,
                io: 2
            }
        );
        assert!((m.latency.max - 5410.0).abs() < 1e-3 && (m.latency.mean - 182.0).abs() < 1e-3);
    }
}
