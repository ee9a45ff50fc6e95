//! openid-connect (APISIX apisix/plugins/openid-connect.lua, docs/en/latest/plugins/openid-connect.md,
//! t/plugin/openid-connect*.t) through the real proxy against a real, certified OpenID provider: the npm
//! `oidc-provider` package (tools/oidc-provider: package.json, package-lock.json, provider.mjs), installed with
//! `npm ci` into `<target>/oidc-provider/` on first use (behind a stamp of those files and an exclusive `flock`) and
//! started on 127.0.0.1 with an ephemeral port for each test. Needs Node.js and npm; without them the tests skip,
//! or fail under `CI=true`. The provider exits when its stdin (a pipe from this process) closes.
//!
//! Tokens the provider would never issue (expired, another issuer, another key, `alg: none`, unknown `kid`) are
//! signed by the provider process itself on a test-only path, with its own signing key or an unrelated one.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::{request, Gw, Origin, Resp};

const CLIENT_ID: &str = "sluice-gw";
const CLIENT_SECRET: &str = "sluice-gw-client-secret-8b1f0c";
const SESSION_SECRET: &str = "a-session-secret-of-32-bytes-ok!";
const INSTALL_LOCK: Duration = Duration::from_secs(900);

fn tool_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/oidc-provider")
}

fn home() -> PathBuf {
    crate::target_dir().join("oidc-provider")
}

fn lock(path: &Path) -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open install lock");
    let end = Instant::now() + INSTALL_LOCK;
    loop {
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return f,
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                assert!(Instant::now() < end, "{} still locked", path.display());
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("flock {}: {e}", path.display()),
        }
    }
}

/// `<target>/oidc-provider` with node_modules installed by `npm ci` from the committed lockfile.
fn install() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let ok = |c: &str| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !ok("node") || !ok("npm") {
            crate::ci::skip_unless_ci("the OpenID provider needs Node.js and npm");
            return None;
        }
        let home = home();
        std::fs::create_dir_all(&home).expect("create <target>/oidc-provider");
        let _lock = lock(&home.join(".lock"));
        let mut h = DefaultHasher::new();
        let files = ["package.json", "package-lock.json", "provider.mjs"];
        for f in files {
            let body = std::fs::read(tool_dir().join(f))
                .unwrap_or_else(|e| panic!("read tools/oidc-provider/{f}: {e}"));
            body.hash(&mut h);
            std::fs::write(home.join(f), body).expect("copy the provider's files");
        }
        let stamp = format!("{:016x}", h.finish());
        let stamp_file = home.join(".sluice-stamp");
        if std::fs::read_to_string(&stamp_file).ok().as_deref() != Some(stamp.as_str()) {
            let out = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--omit=dev"])
                .current_dir(&home)
                .output()
                .expect("run npm ci");
            assert!(
                out.status.success(),
                "npm ci in {} failed:\n{}",
                home.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::write(&stamp_file, &stamp).expect("write stamp");
        }
        Some(home)
    })
    .clone()
}

/// A running provider.
struct Op {
    issuer: String,
    addr: SocketAddr,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Op {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Op {
    fn start(redirect_uri: &str, post_logout: &str) -> Option<Op> {
        let dir = install()?;
        let mut child = Command::new("node")
            .arg("provider.mjs")
            .args([CLIENT_ID, CLIENT_SECRET, redirect_uri, post_logout])
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn node provider.mjs");
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let issuer = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("the OpenID provider did not start: {line:?}"))
            .to_owned();
        let addr = issuer.trim_start_matches("http://").parse().unwrap();
        Some(Op {
            issuer,
            addr,
            child,
            stdin,
        })
    }

    fn discovery(&self) -> String {
        format!("{}/.well-known/openid-configuration", self.issuer)
    }

    fn host(&self) -> String {
        self.addr.to_string()
    }

    fn post_form(&self, path: &str, auth: bool, form: &str) -> Resp {
        let basic = format!(
            "Basic {}",
            b64(format!("{CLIENT_ID}:{CLIENT_SECRET}").as_bytes())
        );
        let host = self.host();
        let mut h = vec![
            ("Host", host.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ];
        if auth {
            h.push(("Authorization", basic.as_str()));
        }
        request(self.addr, "POST", path, &h, form)
    }

    /// An access token from the client credentials grant: a JWT for `resource=urn:sluice:api`, else opaque.
    fn client_token(&self, scope: &str, jwt: bool) -> String {
        let mut form = format!(
            "grant_type=client_credentials&scope={}",
            scope.replace(' ', "+")
        );
        if jwt {
            form.push_str("&resource=urn%3Asluice%3Aapi");
        }
        let r = self.post_form("/token", true, &form);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["access_token"].as_str().unwrap().to_owned()
    }

    /// A token signed by the provider process: `key` "good" (its signing key) or "other".
    fn sign(&self, payload: Value, kid: Option<&str>, key: &str, alg: &str) -> String {
        let body = json!({"payload": payload, "kid": kid, "key": key, "alg": alg}).to_string();
        let host = self.host();
        let r = request(
            self.addr,
            "POST",
            "/__test/sign",
            &[("Host", &host), ("Content-Type", "application/json")],
            &body,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    }

    fn stats(&self) -> Value {
        let host = self.host();
        request(self.addr, "GET", "/__test/stats", &[("Host", &host)], "").json()
    }
}

fn b64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in s.trim_end_matches('=').as_bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            _ => 63,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A gateway whose address is known before the provider starts (the provider needs the redirect URI), then
/// configured with `routes`.
fn gateway() -> Gw {
    Gw::start(json!({"routes": []}))
}

fn bearer_get(gw: &Gw, path: &str, token: &str) -> Resp {
    gw.get(path, &[("Authorization", &format!("Bearer {token}"))])
}

#[test]
fn bearer_tokens_checked_against_the_providers_jwks() {
    let origin = Origin::start();
    let gw = gateway();
    let Some(op) = Op::start("http://127.0.0.1:9/cb", "http://127.0.0.1:9/bye") else {
        return;
    };
    let up = json!({"type": "roundrobin", "nodes": {origin.addr.to_string(): 1}});
    let base = json!({"client_id": CLIENT_ID, "discovery": op.discovery(), "bearer_only": true, "use_jwks": true});
    let mut scoped = base.clone();
    scoped["required_scopes"] = json!(["api:write"]);
    let mut aud = base.clone();
    aud["claim_validator"] = json!({"audience": {"match_with_client_id": true}});
    gw.reload(
        json!({"routes": [
            {"id": "jwks", "uri": "/api/*", "plugins": {"openid-connect": base}, "upstream": up},
            {"id": "scoped", "uri": "/scoped/*", "plugins": {"openid-connect": scoped}, "upstream": up},
            {"id": "aud", "uri": "/aud/*", "plugins": {"openid-connect": aud}, "upstream": up},
        ]}),
        2,
    );

    // No token: APISIX's challenge.
    let r = gw.get("/api/x", &[]);
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer realm=\"apisix\"")
    );
    assert_eq!(origin.count(), 0);

    // A JWT access token the provider issued: accepted, headers for the upstream.
    let tok = op.client_token("api:read", true);
    let r = bearer_get(&gw, "/api/x", &tok);
    assert_eq!(r.status, 200, "{r:?}");
    let seen = origin.last();
    assert_eq!(seen.header("x-access-token"), Some(tok.as_str()));
    let info: Value =
        serde_json::from_slice(&b64_decode(seen.header("x-userinfo").unwrap())).unwrap();
    assert_eq!(info["client_id"], CLIENT_ID);
    assert_eq!(info["iss"], op.issuer.as_str());
    let fetched = op.stats();
    assert_eq!(
        (fetched["discovery"].as_u64(), fetched["jwks"].as_u64()),
        (Some(1), Some(1))
    );
    // Cached: the next check asks the provider nothing.
    let before = origin.count();
    assert_eq!(bearer_get(&gw, "/api/y", &tok).status, 200);
    assert_eq!(origin.count(), before + 1);
    assert_eq!(op.stats()["jwks"], 1);

    // A client cannot pose as authenticated by sending the output headers itself.
    let r = gw.get(
        "/api/x",
        &[
            ("Authorization", &format!("Bearer {tok}")),
            ("X-Userinfo", "forged"),
            ("X-ID-Token", "forged"),
        ],
    );
    assert_eq!(r.status, 200);
    let seen = origin.last();
    assert_ne!(seen.header("x-userinfo"), Some("forged"));
    assert_eq!(seen.header("x-id-token"), None);

    let good = |exp: u64| json!({"iss": op.issuer, "sub": "svc", "aud": "urn:sluice:api", "exp": exp, "iat": now(), "scope": "api:read"});
    // The test's own signature with the provider's key and kid verifies (so the refusals below are about
    // what each one changes).
    let t = op.sign(good(now() + 300), Some("sluice-test-key"), "good", "RS256");
    assert_eq!(bearer_get(&gw, "/api/x", &t).status, 200);

    let refused = |t: &str, why: &str| {
        let n = origin.count();
        let r = bearer_get(&gw, "/api/x", t);
        assert_eq!(r.status, 401, "{why}: {r:?}");
        let ch = r.header("www-authenticate").unwrap_or("");
        assert!(
            ch.starts_with("Bearer realm=\"apisix\", error=\"invalid_token\""),
            "{why}: {ch}"
        );
        assert_eq!(origin.count(), n, "{why}: reached the upstream");
    };
    refused(
        &op.sign(good(now() - 10), Some("sluice-test-key"), "good", "RS256"),
        "expired",
    );
    let mut no_exp = good(0);
    no_exp.as_object_mut().unwrap().remove("exp");
    refused(
        &op.sign(no_exp, Some("sluice-test-key"), "good", "RS256"),
        "no exp",
    );
    let mut nbf = good(now() + 300);
    nbf["nbf"] = json!(now() + 120);
    refused(
        &op.sign(nbf, Some("sluice-test-key"), "good", "RS256"),
        "not yet valid",
    );
    let mut other_iss = good(now() + 300);
    other_iss["iss"] = json!("https://evil.example.com");
    refused(
        &op.sign(other_iss, Some("sluice-test-key"), "good", "RS256"),
        "wrong issuer",
    );
    refused(
        &op.sign(good(now() + 300), Some("sluice-test-key"), "other", "RS256"),
        "signed with another key under the provider's kid",
    );
    refused(
        &op.sign(good(now() + 300), Some("sluice-test-key"), "good", "none"),
        "alg none",
    );
    refused(
        &op.sign(good(now() + 300), None, "good", "none"),
        "alg none, no kid",
    );
    // The provider's token with its payload swapped for one with more scopes: the signature no longer holds.
    let parts: Vec<&str> = tok.split('.').collect();
    let forged_payload = {
        let mut p: Value = serde_json::from_slice(&b64_decode(parts[1])).unwrap();
        p["scope"] = json!("api:read api:write");
        let s = b64(p.to_string().as_bytes());
        s.trim_end_matches('=').replace('+', "-").replace('/', "_")
    };
    refused(
        &format!("{}.{forged_payload}.{}", parts[0], parts[2]),
        "tampered payload",
    );
    refused("not-a-jwt", "garbage");

    // A verified token is remembered (its signature is not checked again), but never past its `exp`.
    let exp = now() + 2;
    let short = op.sign(good(exp), Some("sluice-test-key"), "good", "RS256");
    assert_eq!(bearer_get(&gw, "/api/x", &short).status, 200);
    assert_eq!(bearer_get(&gw, "/api/x", &short).status, 200);
    while now() < exp {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    refused(&short, "expired after it was verified and remembered");

    // An unknown kid makes the gateway fetch the JWKS again (a key rotation), then refuses the token.
    let jwks_before = op.stats()["jwks"].as_u64().unwrap();
    refused(
        &op.sign(good(now() + 300), Some("rotated-key"), "other", "RS256"),
        "unknown kid",
    );
    assert_eq!(op.stats()["jwks"].as_u64().unwrap(), jwks_before + 1);
    // ...but not for every made-up kid: at most once per 5 s.
    for i in 0..5 {
        refused(
            &op.sign(
                good(now() + 300),
                Some(&format!("made-up-{i}")),
                "other",
                "RS256",
            ),
            "made-up kid",
        );
    }
    assert_eq!(op.stats()["jwks"].as_u64().unwrap(), jwks_before + 1);

    // Malformed Authorization: 400.
    assert_eq!(gw.get("/api/x", &[("Authorization", "Bearer")]).status, 400);

    // required_scopes: 403 with APISIX's body.
    let r = bearer_get(&gw, "/scoped/x", &tok);
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json(),
        json!({"error": "required scopes api:write not present"})
    );
    let rw = op.client_token("api:read api:write", true);
    assert_eq!(bearer_get(&gw, "/scoped/x", &rw).status, 200);

    // claim_validator.audience.match_with_client_id: the token's aud is the resource, not the client.
    let r = bearer_get(&gw, "/aud/x", &tok);
    assert_eq!(r.status, 403);
    assert_eq!(r.json(), json!({"error": "mismatched audience"}));
    let mut for_client = good(now() + 300);
    for_client["aud"] = json!(["other", CLIENT_ID]);
    let t = op.sign(for_client, Some("sluice-test-key"), "good", "RS256");
    assert_eq!(bearer_get(&gw, "/aud/x", &t).status, 200);
}

#[test]
fn bearer_tokens_checked_by_introspection() {
    let origin = Origin::start();
    let gw = gateway();
    let Some(op) = Op::start("http://127.0.0.1:9/cb", "http://127.0.0.1:9/bye") else {
        return;
    };
    let up = json!({"type": "roundrobin", "nodes": {origin.addr.to_string(): 1}});
    let conf = |method: &str, secret: &str| {
        json!({"client_id": CLIENT_ID, "client_secret": secret, "discovery": op.discovery(),
            "bearer_only": true, "introspection_endpoint": format!("{}/token/introspection", op.issuer),
            "introspection_endpoint_auth_method": method})
    };
    let mut down = conf("client_secret_basic", CLIENT_SECRET);
    // A closed port (the discard port is not served here).
    down["introspection_endpoint"] = json!("http://127.0.0.1:9/introspect");
    down["timeout"] = json!(1);
    gw.reload(
        json!({"routes": [
            {"id": "i", "uri": "/i/*", "plugins": {"openid-connect": conf("client_secret_basic", CLIENT_SECRET)}, "upstream": up},
            {"id": "p", "uri": "/p/*", "plugins": {"openid-connect": conf("client_secret_post", CLIENT_SECRET)}, "upstream": up},
            {"id": "bad", "uri": "/bad/*", "plugins": {"openid-connect": conf("client_secret_basic", "wrong-secret")}, "upstream": up},
            {"id": "down", "uri": "/down/*", "plugins": {"openid-connect": down}, "upstream": up},
        ]}),
        2,
    );
    let tok = op.client_token("api:read", false);
    assert!(!tok.contains('.'), "an opaque token: {tok}");
    for path in ["/i/x", "/p/x"] {
        let r = bearer_get(&gw, path, &tok);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        let seen = origin.last();
        assert_eq!(seen.header("x-access-token"), Some(tok.as_str()));
        let info: Value =
            serde_json::from_slice(&b64_decode(seen.header("x-userinfo").unwrap())).unwrap();
        assert_eq!(info["active"], true);
        assert_eq!(info["scope"], "api:read");
    }
    // X-Access-Token is a bearer input too (APISIX), and is not passed on as the client sent it.
    assert_eq!(gw.get("/i/x", &[("X-Access-Token", &tok)]).status, 200);
    let asked = op.stats()["introspection"].as_u64().unwrap();
    assert_eq!(asked, 3);

    // Inactive: a token the provider never issued, and one it revoked.
    let n = origin.count();
    let r = bearer_get(&gw, "/i/x", "made-up-opaque-token");
    assert_eq!(r.status, 401);
    assert!(r
        .header("www-authenticate")
        .unwrap()
        .contains("error_description=\"invalid token\""));
    let r = op.post_form("/token/revocation", true, &format!("token={tok}"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(bearer_get(&gw, "/i/x", &tok).status, 401);
    // The provider refuses the gateway's client credentials: no access either.
    let fresh = op.client_token("api:read", false);
    let r = bearer_get(&gw, "/bad/x", &fresh);
    assert_eq!(r.status, 401);
    // Why the provider could not be asked is logged, not told to the client.
    assert!(r
        .header("www-authenticate")
        .unwrap()
        .ends_with("error_description=\"token validation unavailable\""));
    let r = bearer_get(&gw, "/down/x", &fresh);
    assert_eq!(r.status, 401);
    let ch = r.header("www-authenticate").unwrap();
    assert!(
        ch.contains("token validation unavailable") && !ch.contains("127.0.0.1"),
        "{ch}"
    );
    assert_eq!(origin.count(), n);
}

/// A minimal cookie jar: name -> value, per party.
#[derive(Default, Debug)]
struct Jar(Vec<(String, String)>);

impl Jar {
    fn take(&mut self, r: &Resp) {
        for (n, v) in &r.headers {
            if !n.eq_ignore_ascii_case("set-cookie") {
                continue;
            }
            let first = v.split(';').next().unwrap_or("");
            let Some((name, value)) = first.split_once('=') else {
                continue;
            };
            let gone = v.to_ascii_lowercase().contains("max-age=0") || value.is_empty();
            self.0.retain(|(n, _)| n != name.trim());
            if !gone {
                self.0.push((name.trim().to_owned(), value.to_owned()));
            }
        }
    }
    fn header(&self) -> String {
        self.0
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn split_url(u: &str) -> (SocketAddr, String) {
    let rest = u.strip_prefix("http://").expect("http URL");
    let (auth, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    (auth.parse().expect("an IP:port URL"), path.to_owned())
}

fn get_with(addr: SocketAddr, path: &str, jar: &Jar) -> Resp {
    let host = addr.to_string();
    let cookie = jar.header();
    let mut h = vec![("Host", host.as_str())];
    if !cookie.is_empty() {
        h.push(("Cookie", cookie.as_str()));
    }
    request(addr, "GET", path, &h, "")
}

fn location(r: &Resp) -> String {
    r.header("location")
        .unwrap_or_else(|| panic!("no Location: {r:?}"))
        .to_owned()
}

fn absolute(op: &Op, loc: &str) -> String {
    if loc.starts_with('/') {
        format!("{}{loc}", op.issuer)
    } else {
        loc.to_owned()
    }
}

/// Follows the provider's redirects from the authorization request through its login form to the redirect back
/// to the gateway; returns that last Location.
fn log_in_at_provider(op: &Op, auth_url: &str) -> String {
    let mut jar = Jar::default();
    let (_, path) = split_url(auth_url);
    let mut r = get_with(op.addr, &path, &jar);
    jar.take(&r);
    let mut logged_in = false;
    for _ in 0..10 {
        match r.status {
            303 | 302 => {
                let loc = absolute(op, &location(&r));
                if !loc.starts_with(&op.issuer) {
                    return loc;
                }
                let (_, path) = split_url(&loc);
                r = get_with(op.addr, &path, &jar);
                jar.take(&r);
            }
            200 if r.body.contains("<form") && !logged_in => {
                let action = r
                    .body
                    .split("action=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .expect("the login form's action")
                    .to_owned();
                let host = op.host();
                let cookie = jar.header();
                r = request(
                    op.addr,
                    "POST",
                    &action,
                    &[
                        ("Host", &host),
                        ("Cookie", &cookie),
                        ("Content-Type", "application/x-www-form-urlencoded"),
                    ],
                    "login=alice&password=wonderland",
                );
                jar.take(&r);
                logged_in = true;
            }
            _ => panic!("unexpected answer from the provider: {r:?}"),
        }
    }
    panic!("too many redirects at the provider");
}

fn query_param(url: &str, name: &str) -> Option<String> {
    let q = url.split_once('?')?.1;
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.to_owned())
    })
}

#[test]
fn authorization_code_flow_with_session_cookie() {
    let origin = Origin::start();
    let gw = gateway();
    let gw_base = format!("http://{}", gw.addr);
    let redirect_uri = format!("{gw_base}/callback");
    let bye = format!("{gw_base}/bye");
    let Some(op) = Op::start(&redirect_uri, &bye) else {
        return;
    };
    let up = json!({"type": "roundrobin", "nodes": {origin.addr.to_string(): 1}});
    let conf = json!({
        "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "discovery": op.discovery(),
        "scope": "openid email profile", "redirect_uri": redirect_uri, "post_logout_redirect_uri": bye,
        "use_pkce": true, "use_nonce": true, "set_refresh_token_header": true,
        "session": {"secret": SESSION_SECRET}
    });
    let mut deny = conf.clone();
    deny["unauth_action"] = json!("deny");
    let mut pass = conf.clone();
    pass["unauth_action"] = json!("pass");
    // Asks for a refresh token; its access tokens (600 s) always count as expired, so each request renews.
    let mut renew = conf.clone();
    renew["scope"] = json!("openid offline_access");
    renew["authorization_params"] = json!({"prompt": "consent"});
    renew["access_token_expires_leeway"] = json!(600);
    let mut other_secret = deny.clone();
    other_secret["session"] = json!({"secret": "another-secret-another-secret"});
    gw.reload(
        json!({"routes": [
            {"id": "app", "uris": ["/app/*", "/callback", "/logout"], "plugins": {"openid-connect": conf}, "upstream": up},
            {"id": "deny", "uri": "/deny/*", "plugins": {"openid-connect": deny}, "upstream": up},
            {"id": "pass", "uri": "/pass/*", "plugins": {"openid-connect": pass}, "upstream": up},
            {"id": "other", "uri": "/other/*", "plugins": {"openid-connect": other_secret}, "upstream": up},
            {"id": "renew", "uri": "/renew/*", "plugins": {"openid-connect": renew}, "upstream": up},
        ]}),
        2,
    );
    let mut browser = Jar::default();

    // unauth_action deny / pass.
    assert_eq!(get_with(gw.addr, "/deny/x", &browser).status, 401);
    assert_eq!(get_with(gw.addr, "/pass/x", &browser).status, 200);
    let seen = origin.last();
    assert_eq!(seen.header("x-access-token"), None);

    // 1. No session: to the provider, with state, nonce and a PKCE challenge.
    let r = get_with(gw.addr, "/app/page?a=1", &browser);
    assert_eq!(r.status, 302, "{r:?}");
    let auth_url = location(&r);
    assert!(
        auth_url.starts_with(&format!("{}/auth?", op.issuer)),
        "{auth_url}"
    );
    for p in [
        "state",
        "nonce",
        "code_challenge",
        "client_id",
        "redirect_uri",
    ] {
        assert!(query_param(&auth_url, p).is_some(), "{p} in {auth_url}");
    }
    assert_eq!(
        query_param(&auth_url, "code_challenge_method").as_deref(),
        Some("S256")
    );
    browser.take(&r);
    let pending_cookie = browser.get("session").expect("a session cookie").to_owned();
    let set_cookie = r.header("set-cookie").unwrap();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Lax"),
        "{set_cookie}"
    );
    let n = origin.count();

    // 2. Log in at the provider, which sends the browser back with a code.
    let back = log_in_at_provider(&op, &auth_url);
    assert!(back.starts_with(&redirect_uri), "{back}");
    let (_, callback) = split_url(&back);

    // A callback whose state does not match is not accepted: the flow restarts at the original URL.
    let wrong_state = callback.replace(
        &format!("state={}", query_param(&back, "state").unwrap()),
        "state=forged",
    );
    let r = get_with(gw.addr, &wrong_state, &browser);
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(location(&r), format!("{gw_base}/app/page?a=1"));
    // Without the browser's session cookie (a callback planted by someone else): refused.
    assert_eq!(get_with(gw.addr, &callback, &Jar::default()).status, 500);
    assert_eq!(
        op.stats()["token"],
        0,
        "no code exchange for a bad callback"
    );

    // 3. The real callback: the code is exchanged, the session sealed, back to the original URL.
    let r = get_with(gw.addr, &callback, &browser);
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(location(&r), format!("{gw_base}/app/page?a=1"));
    browser.take(&r);
    assert_ne!(browser.get("session").unwrap(), pending_cookie);
    assert_eq!(origin.count(), n, "the upstream saw none of the flow");

    // 4. The session cookie admits requests and passes the headers.
    let r = get_with(gw.addr, "/app/page?a=1", &browser);
    assert_eq!(r.status, 200, "{r:?}");
    let seen = origin.last();
    assert_eq!(seen.target, "/app/page?a=1");
    let at = seen.header("x-access-token").expect("X-Access-Token");
    assert!(!at.is_empty());
    let id: Value =
        serde_json::from_slice(&b64_decode(seen.header("x-id-token").unwrap())).unwrap();
    assert_eq!(id["sub"], "alice");
    assert_eq!(id["aud"], CLIENT_ID);
    assert_eq!(id["iss"], op.issuer.as_str());
    let user: Value =
        serde_json::from_slice(&b64_decode(seen.header("x-userinfo").unwrap())).unwrap();
    assert_eq!(user["email"], "alice@example.com");
    assert_eq!(
        seen.header("x-refresh-token"),
        None,
        "no offline_access asked"
    );
    // The cookie carries no token in the clear.
    assert!(!browser.get("session").unwrap().contains(at));
    // The access token in the session is the provider's: its userinfo endpoint accepts it.
    let host = op.host();
    let r = request(
        op.addr,
        "GET",
        "/me",
        &[("Host", &host), ("Authorization", &format!("Bearer {at}"))],
        "",
    );
    assert_eq!(r.json()["sub"], "alice");

    // 5. The code cannot be used twice (the pre-login cookie still holds the matching state).
    let mut old = Jar::default();
    old.0.push(("session".into(), pending_cookie.clone()));
    let r = get_with(gw.addr, &callback, &old);
    assert_eq!(r.status, 500, "{r:?}");
    assert!(r.header("set-cookie").is_none());

    // 6. A tampered cookie is no session: back to the provider, nothing reaches the upstream.
    let good_cookie = browser.get("session").unwrap().to_owned();
    let n = origin.count();
    let mut bytes = good_cookie.clone().into_bytes();
    for at in [10, bytes.len() / 2, bytes.len() - 3] {
        let mut t = bytes.clone();
        t[at] = if t[at] == b'A' { b'B' } else { b'A' };
        let mut jar = Jar::default();
        jar.0
            .push(("session".into(), String::from_utf8(t).unwrap()));
        let r = get_with(gw.addr, "/app/page", &jar);
        assert_eq!(r.status, 302, "tampered at {at}: {r:?}");
        assert!(location(&r).starts_with(&op.issuer));
    }
    bytes.truncate(bytes.len() - 1);
    let mut jar = Jar::default();
    jar.0
        .push(("session".into(), String::from_utf8(bytes).unwrap()));
    assert_eq!(get_with(gw.addr, "/app/page", &jar).status, 302);
    // The same cookie where the session secret differs is no session either; where it is the same, it is.
    let mut same = Jar::default();
    same.0.push(("session".into(), good_cookie.clone()));
    assert_eq!(get_with(gw.addr, "/other/x", &same).status, 401);
    assert_eq!(origin.count(), n);
    assert_eq!(get_with(gw.addr, "/deny/x", &same).status, 200);
    assert_eq!(origin.count(), n + 1);

    // 7. Logout: the cookie is cleared and the browser goes to the provider's end_session_endpoint.
    let r = get_with(gw.addr, "/logout", &browser);
    assert_eq!(r.status, 302, "{r:?}");
    let loc = location(&r);
    assert!(
        loc.starts_with(&format!("{}/session/end?", op.issuer)),
        "{loc}"
    );
    assert!(query_param(&loc, "id_token_hint").is_some());
    assert!(query_param(&loc, "post_logout_redirect_uri").is_some());
    browser.take(&r);
    assert_eq!(browser.get("session"), None);
    let r = get_with(gw.addr, "/app/page", &browser);
    assert_eq!(r.status, 302);
    assert!(location(&r).starts_with(&op.issuer));

    // 8. An expired access token is renewed with the refresh token; the renewed session goes out as a cookie.
    let mut b = Jar::default();
    let r = get_with(gw.addr, "/renew/x", &b);
    assert_eq!(r.status, 302, "{r:?}");
    b.take(&r);
    let auth_url = location(&r);
    assert_eq!(query_param(&auth_url, "prompt").as_deref(), Some("consent"));
    let back = log_in_at_provider(&op, &auth_url);
    let r = get_with(gw.addr, &split_url(&back).1, &b);
    assert_eq!(r.status, 302, "{r:?}");
    b.take(&r);
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let before = op.stats()["token"].as_u64().unwrap();
        let r = get_with(gw.addr, "/renew/x", &b);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(
            op.stats()["token"].as_u64().unwrap(),
            before + 1,
            "one refresh"
        );
        assert!(r
            .header("set-cookie")
            .is_some_and(|c| c.starts_with("session=")));
        b.take(&r);
        let seen = origin.last();
        assert!(seen.header("x-refresh-token").is_some());
        tokens.push(seen.header("x-access-token").unwrap().to_owned());
    }
    assert_ne!(tokens[0], tokens[1], "a new access token each time");
}

#[test]
fn configuration_errors_are_apisix_ones() {
    let origin = Origin::start();
    let up = json!({"type": "roundrobin", "nodes": {origin.addr.to_string(): 1}});
    let start = |conf: Value| {
        Gw::try_start(json!({"routes": [
            {"id": "r", "uri": "/*", "plugins": {"openid-connect": conf}, "upstream": up}
        ]}))
        .err()
        .unwrap_or_default()
    };
    let d = "https://idp.example.com/.well-known/openid-configuration";
    assert!(
        start(json!({"client_id": "a", "client_secret": "b", "discovery": d}))
            .contains("property \"session.secret\" is required when \"bearer_only\" is false")
    );
    assert!(
        start(json!({"client_id": "a", "discovery": d, "bearer_only": true}))
            .contains("property \"client_secret\" is required")
    );
    assert!(start(
        json!({"client_id": "a", "discovery": d, "bearer_only": true, "use_jwks": true})
    )
    .is_empty());
    assert!(start(
        json!({"client_id": "a", "client_secret": "b", "discovery": d,
        "session": {"secret": "short"}})
    )
    .contains("session"));
    assert!(start(
        json!({"client_id": "a", "client_secret": "b", "discovery": d, "bearer_only": true,
        "unauth_action": "maybe"})
    )
    .contains("unauth_action"));
}
