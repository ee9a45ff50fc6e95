//! The stream access log (`nginx_config.stream`): one line per routed TCP connection in APISIX's default format,
//! written to a real file by the writer thread: a proxied echo (200, bytes both ways), a client refused by
//! ip-restriction (403) and an upstream that refuses connections (502).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use serde_json::json;
use sluice_model::NodeConfig;
use sluice_proxy::{AccessLog, ListenerKind, ProxyConfig};

use super::proxy_protocol::PpGw;
use super::{origin, read_all, refused, up, Mode, IO};

#[test]
fn one_line_per_connection_in_apisix_s_format() {
    let dir = std::env::temp_dir().join(format!(
        "sluice-stream-log-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut node = NodeConfig::default();
    node.nginx_config.stream.enable_access_log = true;
    node.nginx_config.stream.access_log = "stream.log".into();
    let (cfg, format) = sluice_proxy::stream_access_log(&node, &dir)
        .unwrap()
        .unwrap();
    let log = AccessLog::open(cfg).unwrap();
    let echo = origin(Mode::Echo);
    let res = json!({"stream_routes": [
        {"id": "denied", "remote_addr": "203.0.113.66", "upstream": up(&[echo.addr]),
         "plugins": {"ip-restriction": {"blacklist": ["203.0.113.66"]}}},
        {"id": "dead", "remote_addr": "203.0.113.5", "upstream": up(&[refused()])},
        {"id": "echo", "upstream": up(&[echo.addr])},
    ]});
    let gw_cfg = ProxyConfig {
        stream_access_log: Some((log.handle(), Arc::new(format))),
        ..ProxyConfig::default()
    };
    let gw = PpGw::start_with(ListenerKind::Stream, res, gw_cfg);
    let mut c = TcpStream::connect(gw.plain).unwrap();
    c.set_read_timeout(Some(IO)).unwrap();
    c.write_all(b"ping!").unwrap();
    let mut b = [0u8; 5];
    c.read_exact(&mut b).unwrap();
    drop(c);
    for who in ["203.0.113.66", "203.0.113.5"] {
        let mut s = TcpStream::connect(gw.pp).unwrap();
        s.write_all(format!("PROXY TCP4 {who} 127.0.0.1 1000 2000\r\n").as_bytes())
            .unwrap();
        assert_eq!(read_all(s), "");
    }
    // The workers hand their lines over as they exit; the writer writes them as it closes.
    drop(gw);
    log.close();
    let text = std::fs::read_to_string(dir.join("stream.log")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 3, "{text}");
    let fields = |l: &str| -> (String, String) {
        let (addr, rest) = l.split_once(" [").unwrap();
        let (_, rest) = rest.split_once("] ").unwrap();
        (addr.to_owned(), rest.to_owned())
    };
    let (addr, rest) = fields(lines[0]);
    assert_eq!(addr, "127.0.0.1");
    assert!(rest.starts_with("TCP 200 5 5 0."), "{rest}");
    assert_eq!(fields(lines[1]).0, "203.0.113.5");
    assert!(
        fields(lines[1]).1.starts_with("TCP 502 0 0 0."),
        "{}",
        lines[1]
    );
    assert!(
        fields(lines[2]).1.starts_with("TCP 403 0 0 0."),
        "{}",
        lines[2]
    );
    assert_eq!(fields(lines[2]).0, "203.0.113.66");
}
