//! body-transformer through the real proxy (APISIX docs/en/latest/plugins/body-transformer.md,
//! t/plugin/body-transformer.t): request bodies rebuilt before they go upstream, response bodies rebuilt before
//! they reach the client, and what an attacker sends (malformed, huge, nested, entity bombs) stopped at the
//! gateway.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use serde_json::{json, Value};

use crate::{request, route, Gw, Origin};

fn gw(o: &Origin, plugins: Value) -> Gw {
    Gw::start(json!({"routes": [route("1", "/*", o, plugins)]}))
}

fn bt(conf: Value) -> Value {
    json!({"body-transformer": conf})
}

const SOAP: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<SOAP-ENV:Envelope xmlns:SOAP-ENV="http://schemas.xmlsoap.org/soap/envelope/">
  <SOAP-ENV:Body>
    <ns2:getCountryResponse xmlns:ns2="http://spring.io/guides/gs-producing-web-service">
      <ns2:country>
        <ns2:name>Spain</ns2:name>
        <ns2:population>46704314</ns2:population>
        <ns2:capital>Madrid</ns2:capital>
        <ns2:currency>EUR</ns2:currency>
      </ns2:country>
    </ns2:getCountryResponse>
  </SOAP-ENV:Body>
</SOAP-ENV:Envelope>"#;

/// An origin answering every request with `body` as `content_type` (one request per connection).
fn fixed_origin(content_type: &'static str, body: String) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let body = body.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                if crate::head::read_head(&mut c).is_none() {
                    return;
                }
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

fn to(addr: SocketAddr, plugins: Value) -> Gw {
    Gw::start(
        json!({"routes": [{"id": "1", "uri": "/*", "plugins": plugins,
        "upstream": {"type": "roundrobin", "nodes": {addr.to_string(): 1}}}]}),
    )
}

#[test]
fn json_request_to_json() {
    let o = Origin::start();
    let g = gw(
        &o,
        bt(json!({"request": {"template": r#"{"foo":"{{name .. " world"}}","bar":{{age+10}}}"#}})),
    );
    let r = request(
        g.addr,
        "POST",
        "/anything",
        &[("Content-Type", "application/json")],
        r#"{"name":"hello","age":20}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let seen = o.last();
    assert_eq!(seen.body, r#"{"foo":"hello world","bar":30}"#);
    assert_eq!(seen.header("content-length"), Some("30"));
}

#[test]
fn get_args_encoded_and_ctx_vars() {
    let o = Origin::start();
    let g = gw(
        &o,
        bt(json!({"request": {"template":
            r#"{"message": "hello {{name}}", "arg": "{{_ctx.var.arg_name}}", "raw": {*_escape_json(name)*}}"#}})),
    );
    let r = g.get("/anything?name=ja%22ck", &[]);
    assert_eq!(r.status, 200);
    // `{{ }}` escapes for HTML as lua-resty-template does; `{* *}` writes raw.
    assert_eq!(
        o.last().body,
        r#"{"message": "hello ja&quot;ck", "arg": "ja%22ck", "raw": "ja\"ck"}"#
    );
    drop(g);

    let g = gw(
        &o,
        bt(json!({"request": {"input_format": "encoded",
                              "template": r#"{"foo":"{{name .. " world"}}","bar":{{age|int + 10}}}"#}})),
    );
    let r = request(
        g.addr,
        "POST",
        "/anything",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        "name=hello&age=20",
    );
    assert_eq!(r.status, 200);
    assert_eq!(o.last().body, r#"{"foo":"hello world","bar":30}"#);
}

#[test]
fn xml_response_to_json_and_base64_templates() {
    let up = fixed_origin("text/xml", SOAP.to_owned());
    let rsp = r#"{% set c = Envelope.Body.getCountryResponse.country %}{"status":"{{_ctx.var.status}}","name":"{{c.name}}","population":{{c.population}},"capital":"{{c.capital}}","currency":"{{c.currency}}"}"#;
    let g = to(up, bt(json!({"response": {"template": rsp}})));
    let r = g.get("/ws", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/xml"), "{r:?}");
    assert!(r.header("content-length").is_none());
    assert_eq!(
        serde_json::from_str::<Value>(&dechunk(&r)).unwrap_or_default(),
        json!({"status": "200", "name": "Spain", "population": 46704314, "capital": "Madrid", "currency": "EUR"})
    );
    drop(g);

    // The same template base64-encoded.
    use std::fmt::Write as _;
    let b64 = base64_encode(rsp.as_bytes());
    let mut conf = String::new();
    let _ = write!(conf, "{b64}");
    let g = to(
        up,
        bt(json!({"response": {"template": conf, "template_is_base64": true}})),
    );
    let r = g.get("/ws", &[]);
    assert_eq!(
        serde_json::from_str::<Value>(&dechunk(&r)).unwrap_or_default()["capital"],
        "Madrid"
    );
}

#[test]
fn json_to_xml_request() {
    let o = Origin::start();
    let tmpl = r#"<?xml version="1.0"?><soap-env:Envelope><soap-env:Body><ns0:getCountryRequest><ns0:name>{{_escape_xml(name)}}</ns0:name></ns0:getCountryRequest></soap-env:Body></soap-env:Envelope>"#;
    let g = gw(
        &o,
        bt(json!({"request": {"input_format": "json", "template": tmpl}})),
    );
    let r = request(g.addr, "POST", "/ws", &[], r#"{"name":"Sp<a>in"}"#);
    assert_eq!(r.status, 200);
    assert!(
        o.last()
            .body
            .contains("<ns0:name>Sp&amp;lt;a&amp;gt;in</ns0:name>"),
        "{}",
        o.last().body
    );
}

#[test]
fn malformed_bodies_answer_400_and_reach_nothing() {
    let o = Origin::start();
    let g = gw(&o, bt(json!({"request": {"template": "{{a}}"}})));
    let r = request(
        g.addr,
        "POST",
        "/x",
        &[("Content-Type", "application/json")],
        "{\"a\": ",
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"message": "request body decode: Expected value but found T_END at character 7"})
    );
    // Deeply nested JSON.
    let deep = "[".repeat(50_000);
    let r = request(
        g.addr,
        "POST",
        "/x",
        &[("Content-Type", "application/json")],
        &deep,
    );
    assert_eq!(r.status, 400, "{r:?}");
    drop(g);

    let g = gw(
        &o,
        bt(json!({"request": {"input_format": "xml", "template": "{{lolz}}"}})),
    );
    let laughs = format!(
        r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">{}]><lolz>&lol9;</lolz>"#,
        (1..10)
            .map(|i| format!(
                "<!ENTITY lol{i} \"{}\">",
                format!(
                    "&lol{};",
                    if i == 1 {
                        String::new()
                    } else {
                        (i - 1).to_string()
                    }
                )
                .repeat(10)
            ))
            .collect::<String>()
    );
    let r = request(
        g.addr,
        "POST",
        "/x",
        &[("Content-Type", "text/xml")],
        &laughs,
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.json()["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("request body decode: ")));
    let r = request(g.addr, "POST", "/x", &[], "<a><b></a>");
    assert_eq!(r.status, 400);
    let deep = format!("{}{}", "<a>".repeat(5000), "</a>".repeat(5000));
    let r = request(g.addr, "POST", "/x", &[], &deep);
    assert_eq!(r.status, 400);
    assert_eq!(o.count(), 0, "a rejected body went upstream");
}

#[test]
fn body_sizes_are_bounded() {
    let o = Origin::start();
    let g = gw(
        &o,
        bt(json!({"request": {"input_format": "plain", "template": "x"}, "max_req_body_size": 16})),
    );
    let r = request(g.addr, "POST", "/x", &[], &"a".repeat(17));
    assert_eq!(r.status, 413);
    assert_eq!(o.count(), 0);
    let r = request(g.addr, "POST", "/x", &[], &"a".repeat(16));
    assert_eq!(r.status, 200);
    assert_eq!(o.last().body, "x");
    drop(g);

    // A response past max_resp_body_size is truncated before the template sees it.
    let g = gw(
        &o,
        bt(
            json!({"response": {"input_format": "plain", "template": "[{{_body}}]"}, "max_resp_body_size": 4}),
        ),
    );
    let r = g.get("/x", &[]);
    assert_eq!(dechunk(&r), "[orig]");
}

#[test]
fn template_cannot_read_files_or_env() {
    let o = Origin::start();
    std::env::set_var("SLUICE_TEST_SECRET", "s3cr3t");
    for t in [
        r#"{% include "/etc/passwd" %}"#,
        "{{ env.SLUICE_TEST_SECRET }}{{ SLUICE_TEST_SECRET }}{{ _ctx.var.SLUICE_TEST_SECRET }}",
        "{{ _ctx.var.env }}{{ _ctx.__class__ }}{{ range.__globals__ }}",
    ] {
        let g = gw(&o, bt(json!({"request": {"template": t}})));
        let r = request(
            g.addr,
            "POST",
            "/x",
            &[("Content-Type", "application/json")],
            "{}",
        );
        if r.status == 200 {
            let b = o.last().body;
            assert!(!b.contains("s3cr3t") && !b.contains("root:"), "{t}: {b}");
        } else {
            assert_eq!(r.status, 503, "{t}: {r:?}");
            assert!(!r.body.contains("root:"));
        }
    }
}

/// The body of a chunked answer (the shared client reads until close and keeps the framing).
fn dechunk(r: &crate::Resp) -> String {
    if r.header("transfer-encoding") != Some("chunked") {
        return r.body.clone();
    }
    let mut out = String::new();
    let mut rest = r.body.as_str();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

fn base64_encode(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
