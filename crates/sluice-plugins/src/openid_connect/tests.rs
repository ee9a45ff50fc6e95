//! Unit tests of openid-connect: the schema and APISIX's cross-field rules, JWK parsing, token checks and the
//! sealed session cookie.

use serde_json::{json, Value};

use super::session::{CookieConf, Pending, Sealer, Session};
use super::token::{self, Expect, Jwks, Refused};
use super::{check, compile_conf, path_of, Unauth};
use crate::jwt_auth::{sign, Alg};
use crate::util::base64url_encode;

const D: &str = "https://idp.example.com/.well-known/openid-configuration";

#[test]
fn schema_and_cross_field_rules_match_apisix() {
    // t/plugin/openid-connect.t: client_id and discovery are required; a session secret unless bearer_only.
    assert_eq!(
        check(&json!({"client_id": "a", "client_secret": "b", "discovery": D})).unwrap_err(),
        "property \"session.secret\" is required when \"bearer_only\" is false"
    );
    assert_eq!(
        check(&json!({"client_secret": "b", "discovery": D, "bearer_only": true})).unwrap_err(),
        "property \"client_id\" is required"
    );
    assert_eq!(
        check(&json!({"client_id": "a", "discovery": D, "bearer_only": true})).unwrap_err(),
        "property \"client_secret\" is required"
    );
    // The client secret's exemptions: local verification for bearer_only, PKCE for the code flow.
    assert!(check(
        &json!({"client_id": "a", "discovery": D, "bearer_only": true, "use_jwks": true})
    )
    .is_ok());
    assert!(
        check(&json!({"client_id": "a", "discovery": D, "use_pkce": true,
        "session": {"secret": "0123456789abcdef"}}))
        .is_ok()
    );
    assert!(check(
        &json!({"client_id": "a", "client_secret": "b", "discovery": D,
        "session": {"secret": "short"}})
    )
    .is_err());
    assert!(check(
        &json!({"client_id": "a", "client_secret": "b", "discovery": D,
        "session": {"secret": "0123456789abcdef", "unknown": 1}})
    )
    .is_err());
    for bad in [
        json!({"unauth_action": "maybe"}),
        json!({"timeout": 0}),
        json!({"introspection_addon_headers": []}),
        json!({"introspection_addon_headers": ["a:b"]}),
        json!({"use_par": true}),
        json!({"par": {"enabled": true}}),
        json!({"dpop": {"enabled": true}}),
        json!({"proxy_opts": {"http_proxy": "http://p:80"}}),
        json!({"token_endpoint_auth_method": "private_key_jwt"}),
        json!({"token_signing_alg_values_expected": "HS256"}),
        json!({"public_key": "not a key"}),
        json!({"discovery": "ftp://x/"}),
    ] {
        let mut c =
            json!({"client_id": "a", "client_secret": "b", "discovery": D, "bearer_only": true});
        for (k, v) in bad.as_object().unwrap() {
            c[k] = v.clone();
        }
        assert!(check(&c).is_err(), "{bad}");
    }
    // The old `ssl_verify: "no"` still means false.
    let i = compile_conf(
        &json!({"client_id": "a", "client_secret": "b", "discovery": D,
        "bearer_only": true, "ssl_verify": "no"}),
        false,
    );
    assert!(i.is_ok());
}

#[test]
fn defaults_are_apisix_ones() {
    let i = compile_conf(
        &json!({"client_id": "a", "client_secret": "b", "discovery": D,
            "session": {"secret": "0123456789abcdef"}}),
        false,
    )
    .unwrap();
    assert_eq!(i.scope, "openid");
    assert_eq!(i.realm, "apisix");
    assert_eq!(i.logout_path, "/logout");
    assert_eq!(i.unauth, Unauth::Auth);
    assert_eq!(i.timeout, std::time::Duration::from_secs(3));
    assert!(i.set_access && i.set_id && i.set_userinfo);
    assert!(!i.set_refresh && !i.set_raw_id && !i.access_in_auth);
    assert!(!i.bearer_only && !i.bearer_mode && !i.use_pkce && !i.use_nonce);
    assert!(i.token_basic && i.intro_basic);
    assert_eq!(i.iat_slack, 120);
    assert_eq!(i.session.as_ref().unwrap().name, "session");
    assert!(i.is_callback("/app/.apisix/redirect"));
    assert!(!i.is_callback("/app"));
}

#[test]
fn redirect_paths() {
    assert_eq!(path_of("https://h:1/cb?x=1"), "/cb");
    assert_eq!(path_of("https://h"), "/");
    assert_eq!(path_of("/cb#f"), "/cb");
    assert_eq!(super::default_redirect("/app/"), "/app/.apisix/redirect");
    assert_eq!(super::default_redirect("/app"), "/app/.apisix/redirect");
}

/// A P-256 test key (the one jwt-auth's tests use), as PKCS#8 and as a JWK derived from its public half.
const EC_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgie608FkvExxK75DW\nMwTfarVBjD6IIlzmkOcHhceDMnChRANCAAQyfjlDLZaOoEQjl+UBTBityroxSEhA\njinFqqDm3W5EOzFEi2r1Wu+Dmlj45NcX6NVeSsIj8aL3IFAcGsh02Ns/\n-----END PRIVATE KEY-----\n";
const EC_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEMn45Qy2WjqBEI5flAUwYrcq6MUhI\nQI4pxaqg5t1uRDsxRItq9Vrvg5pY+OTXF+jVXkrCI/Gi9yBQHBrIdNjbPw==\n-----END PUBLIC KEY-----\n";

fn ec_jwk(kid: &str) -> Value {
    let Ok(crate::jwt_auth::keys::Key::P256(p)) = crate::jwt_auth::keys::Key::public(EC_PUB) else {
        panic!("a P-256 key");
    };
    json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
        "x": base64url_encode(&p[1..33]), "y": base64url_encode(&p[33..])})
}

fn es256(payload: &Value, kid: Option<&str>) -> String {
    // jwt_auth::sign writes no kid: sign the same input with a header that has one.
    let mut h = json!({"alg": "ES256", "typ": "JWT"});
    if let Some(k) = kid {
        h["kid"] = json!(k);
    }
    let head = base64url_encode(h.to_string().as_bytes());
    let body = base64url_encode(payload.to_string().as_bytes());
    let input = format!("{head}.{body}");
    let sig = crate::jwt_auth::keys::sign(Alg::ES256, EC_PRIV, input.as_bytes()).unwrap();
    format!("{input}.{}", base64url_encode(&sig))
}

fn now() -> u64 {
    super::now()
}

#[test]
fn tokens_are_checked_like_an_attacker_would_try() {
    let jwks = Jwks::parse(
        json!({"keys": [ec_jwk("k1"), {"kty": "oct", "k": "c2VjcmV0"}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(jwks.keys.len(), 1, "symmetric keys are never used");
    let iss = ["https://idp".to_owned()];
    let x = Expect {
        algs: token::ASYMMETRIC,
        issuers: &iss,
        now: now(),
        leeway: 0,
    };
    let claims = json!({"iss": "https://idp", "exp": now() + 60, "sub": "a"});
    let v = |t: &str| token::verify(t, Some(&jwks), None, &x);
    assert_eq!(v(&es256(&claims, Some("k1"))).unwrap()["sub"], "a");
    // No kid: the only fitting key.
    assert!(v(&es256(&claims, None)).is_ok());
    assert_eq!(v(&es256(&claims, Some("k2"))), Err(Refused::UnknownKid));
    let mut c = claims.clone();
    c["exp"] = json!(now() - 1);
    assert!(matches!(
        v(&es256(&c, Some("k1"))),
        Err(Refused::Invalid(_))
    ));
    c["exp"] = json!("tomorrow");
    assert!(matches!(
        v(&es256(&c, Some("k1"))),
        Err(Refused::Invalid(_))
    ));
    c = claims.clone();
    c["iss"] = json!("https://idp.evil");
    assert!(matches!(
        v(&es256(&c, Some("k1"))),
        Err(Refused::Invalid(_))
    ));
    // HS256 signed with the public key's bytes (the classic confusion) and alg none.
    let hs = sign(
        Alg::HS256,
        &claims,
        "EVs_o5-uQbTjL3chynL4wXgUg2R9q9UU8I5mEovUf84",
    )
    .unwrap();
    assert!(matches!(v(&hs), Err(Refused::Invalid(_))));
    let none = format!(
        "{}.{}.",
        base64url_encode(br#"{"alg":"none","kid":"k1"}"#),
        base64url_encode(claims.to_string().as_bytes())
    );
    assert!(matches!(v(&none), Err(Refused::Invalid(_))));
    // Only the configured algorithm.
    let only_rs = Expect {
        algs: &[Alg::RS256],
        ..x
    };
    assert!(matches!(
        token::verify(&es256(&claims, Some("k1")), Some(&jwks), None, &only_rs),
        Err(Refused::Invalid(_))
    ));
    for bad in ["", "a.b", "a.b.c.d", "!!.!!.!!"] {
        assert!(matches!(v(bad), Err(Refused::Invalid(_))), "{bad:?}");
    }
}

#[test]
fn rsa_jwks_become_pkcs1_keys() {
    // A 2048-bit modulus with the top bit set needs the DER sign octet.
    let n = base64url_encode(&[0xc0; 256]);
    let k = token::jwk_key(&json!({"kty": "RSA", "n": n, "e": "AQAB"})).unwrap();
    assert!(k.fits(Alg::RS256) && !k.fits(Alg::ES256));
    // Too small to be accepted.
    let n = base64url_encode(&[0xc0; 128]);
    assert!(token::jwk_key(&json!({"kty": "RSA", "n": n, "e": "AQAB"})).is_none());
    assert!(
        token::jwk_key(&json!({"kty": "RSA", "n": "AQAB", "e": "AQAB", "use": "enc"})).is_none()
    );
}

fn sealer(secret: &str) -> Sealer {
    Sealer::new(
        secret.as_bytes(),
        &CookieConf {
            name: "session",
            path: "/",
            domain: None,
            secure: None,
            http_only: true,
            same_site: "Lax",
            lifetime: 3600,
        },
    )
}

#[test]
fn sessions_are_sealed() {
    let s = sealer("0123456789abcdef0123");
    let sess = Session {
        exp: now() + 60,
        pending: Some(Pending {
            state: "st".into(),
            nonce: Some("n".into()),
            verifier: None,
            original_url: "http://h/x".into(),
            restarts: 0,
        }),
        authed: None,
    };
    let v = s.seal(&sess).unwrap();
    assert_eq!(s.open(&v, now()).unwrap(), sess);
    assert!(!v.contains("http"), "sealed, not encoded");
    // Fresh nonce each time.
    assert_ne!(s.seal(&sess).unwrap(), v);
    // Every single-byte change is refused.
    for i in 0..v.len() {
        let mut t = v.clone().into_bytes();
        t[i] = if t[i] == b'A' { b'B' } else { b'A' };
        assert!(
            s.open(std::str::from_utf8(&t).unwrap(), now()).is_none(),
            "byte {i}"
        );
    }
    assert!(s.open(&v[..v.len() - 1], now()).is_none());
    assert!(s.open("", now()).is_none());
    // Another secret, another cookie name, or past its expiry: no session.
    assert!(sealer("another-secret-0123").open(&v, now()).is_none());
    let other_name = Sealer::new(
        b"0123456789abcdef0123",
        &CookieConf {
            name: "other",
            path: "/",
            domain: None,
            secure: None,
            http_only: true,
            same_site: "Lax",
            lifetime: 3600,
        },
    );
    assert!(other_name.open(&v, now()).is_none());
    assert!(s.open(&v, now() + 61).is_none());
    assert!(s
        .set_cookie(&v)
        .ends_with("; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600"));
    assert!(s.clear_cookie().starts_with("session=; Path=/"));
}
