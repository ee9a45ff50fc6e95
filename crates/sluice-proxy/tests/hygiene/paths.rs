//! Path normalisation (nginx's `$uri`, which APISIX routes on) through the proxy, written as an attacker would: each
//! shape that a raw-path router would send past an auth route's plugins or to another route. Routes: `/admin` and
//! `/admin/*` behind key-auth to the "admin" origin, `/*` public to the "public" origin. Both origins echo the
//! request line they received, so the tests also see what was forwarded.

use std::sync::Mutex;

use super::*;

/// An origin that answers each request with `<name> <request line>` and remembers the request lines.
struct Echo {
    addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Echo {
    fn start(name: &'static str) -> Echo {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                            buf.drain(..end + 4);
                            let line = head.lines().next().unwrap_or("").to_string();
                            seen.lock().unwrap().push(line.clone());
                            let body = format!("{name} {line}");
                            let r = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if c.write_all(r.as_bytes()).is_err() {
                                return;
                            }
                        }
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        Echo { addr, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

fn gateway(admin: &Echo, public: &Echo, servlet: bool, extra: Value) -> Gw {
    let mut routes = vec![
        json!({"id": "admin", "uris": ["/admin", "/admin/*"], "plugins": {"key-auth": {}},
               "upstream": {"nodes": {admin.addr.to_string(): 1}}}),
        json!({"id": "public", "uri": "/*", "upstream": {"nodes": {public.addr.to_string(): 1}}}),
    ];
    if !extra.is_null() {
        routes.insert(0, extra);
    }
    let cfg = ProxyConfig {
        normalize_uri_like_servlet: servlet,
        ..ProxyConfig::default()
    };
    Gw::start(
        json!({"routes": routes,
               "consumers": [{"username": "ops", "plugins": {"key-auth": {"key": "k"}}}]}),
        cfg,
    )
}

fn get(gw: &Gw, path: &str, key: bool) -> Vec<u8> {
    let auth = if key { "apikey: k\r\n" } else { "" };
    exchange(
        gw.addr,
        format!("GET {path} HTTP/1.1\r\nHost: a\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
}

fn body(out: &[u8]) -> String {
    let s = String::from_utf8_lossy(out);
    s.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// Shapes that are `/admin...` once normalised: each must meet key-auth, never the public route.
const ADMIN_SHAPES: &[&str] = &[
    "/public/../admin",
    "/%61dmin",
    "//admin",
    "/./admin",
    "/public/%2e%2e/admin",
    "/public/.%2E/admin",
    "/public%2F..%2Fadmin",
    "/x/y/../../admin/",
    "/admin//users",
    "/%2Fadmin",
    "/admin%2Fusers",
    "/public/..//admin/users?x=1",
];

#[test]
fn bypass_shapes_meet_the_admin_routes_plugins() {
    let (admin, public) = (Echo::start("admin"), Echo::start("public"));
    let gw = gateway(&admin, &public, false, Value::Null);
    for p in ADMIN_SHAPES {
        let out = get(&gw, p, false);
        assert_eq!(
            status(&out),
            Some(401),
            "{p}: {}",
            String::from_utf8_lossy(&out)
        );
    }
    assert!(public.lines().is_empty(), "{:?}", public.lines());
    assert!(admin.lines().is_empty());
    // With the key they reach the admin origin, which receives the original bytes (APISIX's default upstream_uri).
    for p in ADMIN_SHAPES {
        let out = get(&gw, p, true);
        assert_eq!(status(&out), Some(200), "{p}");
        assert!(body(&out).starts_with("admin "), "{p}: {}", body(&out));
    }
    let sent: Vec<String> = admin.lines();
    assert_eq!(sent[0], "GET /public/../admin HTTP/1.1");
    assert_eq!(sent[1], "GET /%61dmin HTTP/1.1");
    assert!(public.lines().is_empty());
    // Public paths stay public, including ones that only look like admin before normalisation.
    for p in [
        "/public",
        "/adminx",
        "/admin/../public",
        "/%2561dmin",
        "/a/..%2Fadmin%2F..%2Fpublic",
    ] {
        let out = get(&gw, p, false);
        assert_eq!(status(&out), Some(200), "{p}");
        assert!(body(&out).starts_with("public "), "{p}: {}", body(&out));
    }
}

#[test]
fn unnormalisable_paths_get_400_and_reach_no_origin() {
    let (admin, public) = (Echo::start("admin"), Echo::start("public"));
    let gw = gateway(&admin, &public, false, Value::Null);
    // A raw `#` is refused by the parser already (nginx would cut the path there).
    for p in [
        "/admin#x",
        "/..",
        "/../admin",
        "/public/../../admin",
        "/%2e%2e/admin",
        "/..%2Fadmin",
        "/a%00b",
        "/a%zz",
        "/a%2",
    ] {
        let out = get(&gw, p, true);
        assert_eq!(
            status(&out),
            Some(400),
            "{p}: {}",
            String::from_utf8_lossy(&out)
        );
    }
    assert!(admin.lines().is_empty() && public.lines().is_empty());
}

#[test]
fn servlet_parameters_follow_normalize_uri_like_servlet() {
    let (admin, public) = (Echo::start("admin"), Echo::start("public"));
    // APISIX's default: `;x` is part of the segment, so `/admin;x` is not the admin route.
    let gw = gateway(&admin, &public, false, Value::Null);
    let out = get(&gw, "/admin;x", false);
    assert_eq!(status(&out), Some(200));
    assert_eq!(body(&out), "public GET /admin;x HTTP/1.1");
    drop(gw);
    // With normalize_uri_like_servlet, a servlet upstream's reading applies: it is the admin route.
    let gw = gateway(&admin, &public, true, Value::Null);
    for p in [
        "/admin;x",
        "/admin;jsessionid=1/users",
        "/public/../admin;x",
    ] {
        let out = get(&gw, p, false);
        assert_eq!(
            status(&out),
            Some(401),
            "{p}: {}",
            String::from_utf8_lossy(&out)
        );
    }
    for p in ["/..;/admin", "/public/..;/admin", "/;x/admin"] {
        let out = get(&gw, p, true);
        assert_eq!(
            status(&out),
            Some(400),
            "{p}: {}",
            String::from_utf8_lossy(&out)
        );
    }
    assert!(
        public.lines().iter().all(|l| l == "GET /admin;x HTTP/1.1"),
        "{:?}",
        public.lines()
    );
}

#[test]
fn uri_var_and_proxy_rewrite_see_the_normalised_path_and_cannot_split_the_request_line() {
    let (admin, public) = (Echo::start("admin"), Echo::start("public"));
    let r = json!({"id": "rw", "uri": "/rw/*", "vars": [["uri", "~~", "^/rw/[a-z ]+$"]],
        "plugins": {"proxy-rewrite": {"regex_uri": ["^/rw/(.*)", "/new/$1"]}},
        "upstream": {"nodes": {public.addr.to_string(): 1}}});
    let gw = gateway(&admin, &public, false, r);
    // `vars` sees the decoded path (`%20` is a space) and the rewrite is re-escaped on the wire.
    let out = get(&gw, "/rw/a%20b", false);
    assert_eq!(body(&out), "public GET /new/a%20b HTTP/1.1");
    let out = get(&gw, "/x/../rw/ab", false);
    assert_eq!(body(&out), "public GET /new/ab HTTP/1.1");
    // A decoded CR LF fails the `vars` check here; without it, the rewrite still could not inject a header.
    drop(gw);
    let r = json!({"id": "rw", "uri": "/rw/*",
        "plugins": {"proxy-rewrite": {"regex_uri": ["^/rw/(.*)", "/new/$1"]}},
        "upstream": {"nodes": {public.addr.to_string(): 1}}});
    let gw = gateway(&admin, &public, false, r);
    let out = get(&gw, "/rw/a%0D%0AX-Injected:%20y", false);
    assert_eq!(status(&out), Some(200));
    assert_eq!(
        body(&out),
        "public GET /new/a%0D%0AX-Injected:%20y HTTP/1.1"
    );
}

/// The statuses of every response in `out`, in order (an echoed body ends in `HTTP/1.1` without a space).
fn statuses(out: &[u8]) -> Vec<u16> {
    out.windows(13)
        .filter(|w| w.starts_with(b"HTTP/1.1 ") && w[12] == b' ')
        .filter_map(|w| std::str::from_utf8(&w[9..12]).ok()?.parse().ok())
        .collect()
}

/// A connection remembers its previous request's Host (routing skips re-checking the same bytes): a client that
/// switches Host on one keep-alive connection, to a name of the same length, in another case or with a port, must
/// meet the host route's key-auth every time it names that host and never inherit the previous request's route.
#[test]
fn a_host_switched_on_a_keep_alive_connection_is_routed_afresh() {
    let (admin, public) = (Echo::start("admin"), Echo::start("public"));
    let route = json!({"id": "admin-host", "uri": "/h", "host": "admin.example", "plugins": {"key-auth": {}},
                       "upstream": {"nodes": {admin.addr.to_string(): 1}}});
    let gw = gateway(&admin, &public, false, route);
    let hosts = [
        "adnim.example",
        "admin.example",
        "adnim.example",
        "ADMIN.example:8080",
        "admin.example",
        "adnim.example:80",
        "admin.example",
    ];
    let mut raw = String::new();
    for (i, h) in hosts.iter().enumerate() {
        let close = if i + 1 == hosts.len() {
            "Connection: close\r\n"
        } else {
            ""
        };
        raw.push_str(&format!("GET /h HTTP/1.1\r\nHost: {h}\r\n{close}\r\n"));
    }
    let out = exchange(gw.addr, raw.as_bytes());
    assert_eq!(
        statuses(&out),
        [200, 401, 200, 401, 401, 200, 401],
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(admin.lines().is_empty(), "{:?}", admin.lines());
    assert_eq!(public.lines().len(), 3, "{:?}", public.lines());
}
