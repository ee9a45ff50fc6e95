//! jwt-auth through the real proxy (APISIX 3.x docs and t/plugin/jwt-auth*.t): asymmetric algorithms with the
//! consumer's `public_key`, custom `header` / `query` / `cookie` names, `hide_credentials` on each source,
//! `key_claim_name`, `exp` / `nbf` with `lifetime_grace_period`, `claims_to_verify`, the 401 bodies with
//! `WWW-Authenticate`, anonymous consumers, and consumer credentials refused at compile time.

use serde_json::{json, Value};
use sluice_plugins::jwt_auth::{sign, Alg};

use crate::{consumer, route, Gw, Origin};

const RSA_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC4uUH9MRBoFfd6\nPjrpUwpdaut+3lZfmdWVIlOxjLZSlD7itibegqLcel9xsasUEciGJCOG6TFqOUJT\n1RBaegIL8IJUnDOVQdWygF1zmRot6uvXihE0m3QeWRIi+4Z2cwcty++NvaVLycmy\nOJBkH+1ANB0JMKnesoyHO43PM+F9GCqZGFwmrF1aFI9SaFmKM58GR5kp5/TjExQQ\nZMa9srCLP6Y6ktjxo7XGlTQE3QfIVEZzE7EpWn0kDML8BQT6bRqneOjXW1ul3xVm\nVkfn9JoVwsJqfuFKuxXNRJ0uew1xlFU0fSaPmkEmnL1YzgMyEXUQ4jXuwDKN5t3c\n2LxtYbd/AgMBAAECggEATjlBPP9Qc8tNk8oTd2fPXVTgKcbsa6qAvBkfuPGd6aVW\nZfn9xr8qSVRW45X5nNOVB1z5YHGSl+lscYSp2q6M/FJaVosY+u04mdDrAf9FC0nO\nmmUguRbVWt6cJA1AWRuH4DhalrrG6yulyl9Sodu1Q7ltzEz7uk8A3Gl3OVW+eJKP\naWSec1VMRhvYaCycGWgC7z7qMgJg9w7OpH3PptPHjgjutNxbhIngQvFVlMN1LQJt\nGT3KHJBQ08wZQ24df8Ltw61zjdAaVU2ka+zUg/VOunxin/H/vVw/5mOLQTUUQFhB\nOEMMnuqBrEBLCiglboeJwjSmUb74R8D4RNt2etJVkQKBgQD9jVSIwTFQxH2PjlrT\nHuct0deBtpUxb3DWJykpFMuIcu85eoegP/yzhis7qVWCZiHh1sA/4o0xV5v4hBOd\nwP2uicrjncIX77wHO2m+q3hXAtt69VCWvRFvRv7EV6bsLu6wpXM/UgiV7w85cRnn\nVlFA/Y8oam7JHU3H6Rkif3cKbwKBgQC6gdBYPx+TECKDZwGXPolE8sxnv+FmiPLl\n6YYcWddf8PCgkyEx8VHz1xWVzZ719VkaKLVbLk6mmQ6JZQ/P5Qq7s/m2sf55I9j1\nVJML0Zlv4hwl0WQu28GrHMPFw/KlBIZ6Q8Y9I20Ih1IwxB5lZfSffJgUJnF8Hy0z\nnpBKdpPr8QKBgHjU4XRKnTXgbfX74Uy7bXBokEtAt9jXQu7LutHZFyXvoBHEUt4L\noGHtjqzgBeAezAbUUMohLShWl/3W84I6dqq2//l5NQYzOWg46Cv1i2Pr+KygO8ea\nUrS1ILRxERt9QkLslf+XGIBbbOXzAGU+vXo7W/3muuUdEfQzIcdO92wBAoGBAJ+c\ndMbwzn628jJuNshOtn8RIqkvZyCu1uC3pxQgNtdehS+GeoQZN79sNIbNP9rSK3zd\nlccArEKa/fvLR2rtYvAcJ/qX/WWCrivWQzl8GMnNQbWDqy8G1okvxsM63C8o3kVI\nNyEfbjI8TLR7QmAYju7mW+fytnA45iAk9Osk65ahAoGABpLpY5vFzAGDBdRrjBVJ\nzTjKkgPjDODUXbrL93aBamQ5DB7r0CeR6rEbDvPthOEaIP4fgX/kKFBVEqczUWD5\nBkpMvVMgaU0MxOHgzAZCrl5MjazeQtBlcqIe5OtCzsuinyihM6bMc0rHdCXrj4V5\nOx4sJLegnhX5s2N/FiOglGk=\n-----END PRIVATE KEY-----\n";
const RSA_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAuLlB/TEQaBX3ej466VMK\nXWrrft5WX5nVlSJTsYy2UpQ+4rYm3oKi3HpfcbGrFBHIhiQjhukxajlCU9UQWnoC\nC/CCVJwzlUHVsoBdc5kaLerr14oRNJt0HlkSIvuGdnMHLcvvjb2lS8nJsjiQZB/t\nQDQdCTCp3rKMhzuNzzPhfRgqmRhcJqxdWhSPUmhZijOfBkeZKef04xMUEGTGvbKw\niz+mOpLY8aO1xpU0BN0HyFRGcxOxKVp9JAzC/AUE+m0ap3jo11tbpd8VZlZH5/Sa\nFcLCan7hSrsVzUSdLnsNcZRVNH0mj5pBJpy9WM4DMhF1EOI17sAyjebd3Ni8bWG3\nfwIDAQAB\n-----END PUBLIC KEY-----\n";
const P256_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgie608FkvExxK75DW\nMwTfarVBjD6IIlzmkOcHhceDMnChRANCAAQyfjlDLZaOoEQjl+UBTBityroxSEhA\njinFqqDm3W5EOzFEi2r1Wu+Dmlj45NcX6NVeSsIj8aL3IFAcGsh02Ns/\n-----END PRIVATE KEY-----\n";
const P256_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEMn45Qy2WjqBEI5flAUwYrcq6MUhI\nQI4pxaqg5t1uRDsxRItq9Vrvg5pY+OTXF+jVXkrCI/Gi9yBQHBrIdNjbPw==\n-----END PUBLIC KEY-----\n";
const ED_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIAzrebNkTg3dGNonAVC6eEcI2f+dwqWBBPX9DYoHzP71\n-----END PRIVATE KEY-----\n";
const ED_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAwTBRikLCJSg3EHtVR/fWB76+PO8tPzhf9mR9FxvylNI=\n-----END PUBLIC KEY-----\n";

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn cfg(origin: &Origin, plugins: Value, consumers: Value) -> Value {
    json!({"routes": [route("r1", "/hello", origin, plugins)], "consumers": consumers})
}

fn token(alg: Alg, key_pem: &str, payload: Value) -> String {
    sign(alg, &payload, key_pem).expect("signs")
}

#[test]
fn asymmetric_algorithms_verify_with_the_consumer_public_key() {
    let o = Origin::start();
    let consumers = json!([
        consumer(
            "rsa",
            json!({"jwt-auth": {"key": "rsa-key", "algorithm": "RS256", "public_key": RSA_PUB}})
        ),
        consumer(
            "ec",
            json!({"jwt-auth": {"key": "ec-key", "algorithm": "ES256", "public_key": P256_PUB}})
        ),
        consumer(
            "ed",
            json!({"jwt-auth": {"key": "ed-key", "algorithm": "EdDSA", "public_key": ED_PUB}})
        ),
        consumer(
            "hs",
            json!({"jwt-auth": {"key": "hs-key", "algorithm": "HS384", "secret": "s3cr3t"}})
        ),
    ]);
    let gw = Gw::start(cfg(&o, json!({"jwt-auth": {}}), consumers));
    let exp = now() + 600;
    for (alg, key, claim, user) in [
        (Alg::RS256, RSA_PRIV, "rsa-key", "rsa"),
        (Alg::RS512, RSA_PRIV, "rsa-key", "rsa"),
        (Alg::PS256, RSA_PRIV, "rsa-key", "rsa"),
        (Alg::ES256, P256_PRIV, "ec-key", "ec"),
        (Alg::EdDSA, ED_PRIV, "ed-key", "ed"),
        (Alg::HS384, "s3cr3t", "hs-key", "hs"),
    ] {
        let t = token(alg, key, json!({"key": claim, "exp": exp}));
        let r = gw.get("/hello", &[("Authorization", &format!("Bearer {t}"))]);
        assert_eq!(r.status, 200, "{alg:?}: {}", r.body);
        assert_eq!(
            o.last().header("x-consumer-username"),
            Some(user),
            "{alg:?}"
        );
    }
    // A token signed by another key of the right type, and one whose alg does not fit the consumer's key.
    let forged = token(Alg::ES256, P256_PRIV, json!({"key": "rsa-key", "exp": exp}));
    let confused = token(Alg::HS256, RSA_PUB, json!({"key": "rsa-key", "exp": exp}));
    let other_rsa = token(Alg::RS256, RSA_PRIV, json!({"key": "ec-key", "exp": exp}));
    for t in [forged, confused, other_rsa] {
        let r = gw.get("/hello", &[("Authorization", &t)]);
        assert_eq!(
            (r.status, r.json()),
            (401, json!({"message": "failed to verify jwt"}))
        );
        assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"jwt\""));
    }
}

#[test]
fn custom_sources_hide_credentials_and_key_claim_name() {
    let o = Origin::start();
    let consumers = json!([consumer(
        "jack",
        json!({"jwt-auth": {"key": "user-key", "secret": "my-secret-key"}})
    )]);
    let plugins = json!({"jwt-auth": {
        "header": "jwt-header", "query": "jwt-query", "cookie": "jwt-cookie",
        "hide_credentials": true, "key_claim_name": "iss", "realm": "gw"
    }});
    let gw = Gw::start(cfg(&o, plugins, consumers));
    let t = token(
        Alg::HS256,
        "my-secret-key",
        json!({"iss": "user-key", "exp": now() + 600}),
    );
    // The default names are not consulted any more.
    let r = gw.get("/hello", &[("Authorization", &t)]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "Missing JWT token in request"}))
    );
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"gw\""));

    assert_eq!(
        gw.get("/hello", &[("jwt-header", &format!("bearer {t}"))])
            .status,
        200
    );
    assert_eq!(
        o.last().header("jwt-header"),
        None,
        "hidden from the upstream"
    );

    assert_eq!(
        gw.get(&format!("/hello?a=1&jwt-query={t}&b=2"), &[]).status,
        200
    );
    assert_eq!(o.last().target, "/hello?a=1&b=2");

    let cookie = format!("a=b; jwt-cookie={t}; c=d");
    assert_eq!(gw.get("/hello", &[("Cookie", &cookie)]).status, 200);
    assert_eq!(o.last().header("cookie"), Some("a=b; c=d"));
    assert_eq!(
        gw.get("/hello", &[("Cookie", &format!("jwt-cookie={t}"))])
            .status,
        200
    );
    assert_eq!(o.last().header("cookie"), None);

    // The key claim is `iss` now: a token carrying only `key` misses it.
    let only_key = token(Alg::HS256, "my-secret-key", json!({"key": "user-key"}));
    let r = gw.get("/hello", &[("jwt-header", &only_key)]);
    assert_eq!(
        (r.status, r.json()),
        (401, json!({"message": "missing user key in JWT token"}))
    );
}

#[test]
fn exp_and_nbf_with_grace_period_and_claims_to_verify() {
    let o = Origin::start();
    let consumers = json!([
        consumer(
            "strict",
            json!({"jwt-auth": {"key": "strict", "secret": "s"}})
        ),
        consumer(
            "lenient",
            json!({"jwt-auth": {"key": "lenient", "secret": "s", "lifetime_grace_period": 100}})
        ),
    ]);
    let gw = Gw::start(cfg(&o, json!({"jwt-auth": {}}), consumers));
    let n = now();
    let status = |gw: &Gw, p: Value| {
        let t = token(Alg::HS256, "s", p);
        gw.get("/hello", &[("Authorization", &t)]).status
    };
    assert_eq!(status(&gw, json!({"key": "strict", "exp": n - 30})), 401);
    assert_eq!(status(&gw, json!({"key": "lenient", "exp": n - 30})), 200);
    assert_eq!(status(&gw, json!({"key": "lenient", "exp": n - 300})), 401);
    assert_eq!(status(&gw, json!({"key": "strict", "nbf": n + 30})), 401);
    assert_eq!(status(&gw, json!({"key": "lenient", "nbf": n + 30})), 200);
    assert_eq!(status(&gw, json!({"key": "lenient", "nbf": n + 300})), 401);
    // A claim that is not a number fails; no exp at all is accepted (APISIX checks only present claims).
    assert_eq!(status(&gw, json!({"key": "strict", "exp": "soon"})), 401);
    assert_eq!(status(&gw, json!({"key": "strict"})), 200);
    drop(gw);
    // claims_to_verify: ["nbf"] lets an expired token through but still checks nbf.
    let consumers = json!([consumer(
        "strict",
        json!({"jwt-auth": {"key": "strict", "secret": "s"}})
    )]);
    let gw = Gw::start(cfg(
        &o,
        json!({"jwt-auth": {"claims_to_verify": ["nbf"]}}),
        consumers,
    ));
    assert_eq!(status(&gw, json!({"key": "strict", "exp": n - 30})), 200);
    assert_eq!(status(&gw, json!({"key": "strict", "nbf": n + 30})), 401);
}

#[test]
fn anonymous_consumer_and_config_errors() {
    let o = Origin::start();
    let consumers = json!([
        consumer(
            "jack",
            json!({"jwt-auth": {"key": "user-key", "secret": "my-secret-key"}})
        ),
        consumer(
            "anon",
            json!({"limit-count": {"count": 1, "time_window": 60}})
        ),
    ]);
    let gw = Gw::start(cfg(
        &o,
        json!({"jwt-auth": {"anonymous_consumer": "anon"}}),
        consumers.clone(),
    ));
    assert_eq!(gw.get("/hello", &[]).status, 200);
    assert_eq!(o.last().header("x-consumer-username"), Some("anon"));
    // The anonymous consumer's own plugins apply: its limit-count allows one request.
    assert_eq!(
        gw.get("/hello", &[("Authorization", "garbage")]).status,
        503
    );
    let t = token(Alg::HS256, "my-secret-key", json!({"key": "user-key"}));
    assert_eq!(gw.get("/hello", &[("Authorization", &t)]).status, 200);
    assert_eq!(o.last().header("x-consumer-username"), Some("jack"));
    drop(gw);

    let bad = |conf: Value| {
        let consumers = json!([consumer("c", json!({"jwt-auth": conf}))]);
        Gw::try_start(cfg(&o, json!({"jwt-auth": {}}), consumers))
            .err()
            .expect("refused")
    };
    let e = bad(json!({"key": "k", "algorithm": "RS256"}));
    assert!(e.contains("missing valid public key"), "{e}");
    let e = bad(json!({"key": "k", "algorithm": "HS512"}));
    assert!(e.contains("property \"secret\" is required"), "{e}");
    let e = bad(
        json!({"key": "k", "algorithm": "ES256", "public_key": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----"}),
    );
    assert!(e.contains("invalid public key"), "{e}");
    let e = bad(json!({"key": "k", "algorithm": "ES384", "public_key": P256_PUB}));
    assert!(e.contains("does not fit"), "{e}");
    let e = Gw::try_start(cfg(
        &o,
        json!({"jwt-auth": {"claims_to_verify": ["iat"]}}),
        json!([]),
    ))
    .err()
    .expect("refused");
    assert!(e.contains("claims_to_verify"), "{e}");
}
