//! Per-request cost of jwt-auth by algorithm (token parse, consumer lookup, signature check, claims), without IO:
//! `cargo run --release -p sluice-plugins --example jwt_cost`. Prints ns per request for HS256, RS256 (2048-bit),
//! PS256, ES256 and EdDSA tokens against 100 consumers, and key-auth for comparison; an argument (`HS256`, ...)
//! runs that algorithm only.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::BytesMut;
use serde_json::json;
use sluice_plugins::jwt_auth::{sign, Alg};
use sluice_plugins::{Chain, CompileEnv, Ctx, Flow, ReqView, Shared};

const RSA_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC4uUH9MRBoFfd6\nPjrpUwpdaut+3lZfmdWVIlOxjLZSlD7itibegqLcel9xsasUEciGJCOG6TFqOUJT\n1RBaegIL8IJUnDOVQdWygF1zmRot6uvXihE0m3QeWRIi+4Z2cwcty++NvaVLycmy\nOJBkH+1ANB0JMKnesoyHO43PM+F9GCqZGFwmrF1aFI9SaFmKM58GR5kp5/TjExQQ\nZMa9srCLP6Y6ktjxo7XGlTQE3QfIVEZzE7EpWn0kDML8BQT6bRqneOjXW1ul3xVm\nVkfn9JoVwsJqfuFKuxXNRJ0uew1xlFU0fSaPmkEmnL1YzgMyEXUQ4jXuwDKN5t3c\n2LxtYbd/AgMBAAECggEATjlBPP9Qc8tNk8oTd2fPXVTgKcbsa6qAvBkfuPGd6aVW\nZfn9xr8qSVRW45X5nNOVB1z5YHGSl+lscYSp2q6M/FJaVosY+u04mdDrAf9FC0nO\nmmUguRbVWt6cJA1AWRuH4DhalrrG6yulyl9Sodu1Q7ltzEz7uk8A3Gl3OVW+eJKP\naWSec1VMRhvYaCycGWgC7z7qMgJg9w7OpH3PptPHjgjutNxbhIngQvFVlMN1LQJt\nGT3KHJBQ08wZQ24df8Ltw61zjdAaVU2ka+zUg/VOunxin/H/vVw/5mOLQTUUQFhB\nOEMMnuqBrEBLCiglboeJwjSmUb74R8D4RNt2etJVkQKBgQD9jVSIwTFQxH2PjlrT\nHuct0deBtpUxb3DWJykpFMuIcu85eoegP/yzhis7qVWCZiHh1sA/4o0xV5v4hBOd\nwP2uicrjncIX77wHO2m+q3hXAtt69VCWvRFvRv7EV6bsLu6wpXM/UgiV7w85cRnn\nVlFA/Y8oam7JHU3H6Rkif3cKbwKBgQC6gdBYPx+TECKDZwGXPolE8sxnv+FmiPLl\n6YYcWddf8PCgkyEx8VHz1xWVzZ719VkaKLVbLk6mmQ6JZQ/P5Qq7s/m2sf55I9j1\nVJML0Zlv4hwl0WQu28GrHMPFw/KlBIZ6Q8Y9I20Ih1IwxB5lZfSffJgUJnF8Hy0z\nnpBKdpPr8QKBgHjU4XRKnTXgbfX74Uy7bXBokEtAt9jXQu7LutHZFyXvoBHEUt4L\noGHtjqzgBeAezAbUUMohLShWl/3W84I6dqq2//l5NQYzOWg46Cv1i2Pr+KygO8ea\nUrS1ILRxERt9QkLslf+XGIBbbOXzAGU+vXo7W/3muuUdEfQzIcdO92wBAoGBAJ+c\ndMbwzn628jJuNshOtn8RIqkvZyCu1uC3pxQgNtdehS+GeoQZN79sNIbNP9rSK3zd\nlccArEKa/fvLR2rtYvAcJ/qX/WWCrivWQzl8GMnNQbWDqy8G1okvxsM63C8o3kVI\nNyEfbjI8TLR7QmAYju7mW+fytnA45iAk9Osk65ahAoGABpLpY5vFzAGDBdRrjBVJ\nzTjKkgPjDODUXbrL93aBamQ5DB7r0CeR6rEbDvPthOEaIP4fgX/kKFBVEqczUWD5\nBkpMvVMgaU0MxOHgzAZCrl5MjazeQtBlcqIe5OtCzsuinyihM6bMc0rHdCXrj4V5\nOx4sJLegnhX5s2N/FiOglGk=\n-----END PRIVATE KEY-----\n";
const RSA_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAuLlB/TEQaBX3ej466VMK\nXWrrft5WX5nVlSJTsYy2UpQ+4rYm3oKi3HpfcbGrFBHIhiQjhukxajlCU9UQWnoC\nC/CCVJwzlUHVsoBdc5kaLerr14oRNJt0HlkSIvuGdnMHLcvvjb2lS8nJsjiQZB/t\nQDQdCTCp3rKMhzuNzzPhfRgqmRhcJqxdWhSPUmhZijOfBkeZKef04xMUEGTGvbKw\niz+mOpLY8aO1xpU0BN0HyFRGcxOxKVp9JAzC/AUE+m0ap3jo11tbpd8VZlZH5/Sa\nFcLCan7hSrsVzUSdLnsNcZRVNH0mj5pBJpy9WM4DMhF1EOI17sAyjebd3Ni8bWG3\nfwIDAQAB\n-----END PUBLIC KEY-----\n";
const P256_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgie608FkvExxK75DW\nMwTfarVBjD6IIlzmkOcHhceDMnChRANCAAQyfjlDLZaOoEQjl+UBTBityroxSEhA\njinFqqDm3W5EOzFEi2r1Wu+Dmlj45NcX6NVeSsIj8aL3IFAcGsh02Ns/\n-----END PRIVATE KEY-----\n";
const P256_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEMn45Qy2WjqBEI5flAUwYrcq6MUhI\nQI4pxaqg5t1uRDsxRItq9Vrvg5pY+OTXF+jVXkrCI/Gi9yBQHBrIdNjbPw==\n-----END PUBLIC KEY-----\n";
const ED_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIAzrebNkTg3dGNonAVC6eEcI2f+dwqWBBPX9DYoHzP71\n-----END PRIVATE KEY-----\n";
const ED_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAwTBRikLCJSg3EHtVR/fWB76+PO8tPzhf9mR9FxvylNI=\n-----END PUBLIC KEY-----\n";

fn cost(chain: &Chain, header: &str, value: &str, n: u32) -> f64 {
    let mut raw = BytesMut::from(
        format!("GET /r1 HTTP/1.1\r\nHost: bench.local\r\n{header}: {value}\r\n\r\n").as_bytes(),
    );
    let head = sluice_http::parse_request(&mut raw, &sluice_http::Limits::default())
        .unwrap()
        .unwrap();
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let local: SocketAddr = "127.0.0.1:9080".parse().unwrap();
    let view = ReqView::new(&head, peer, local, "http").expect("a normal path");
    let run = |n: u32| {
        let t0 = Instant::now();
        for _ in 0..n {
            let mut ctx = Ctx::new(&view, "r1");
            assert!(matches!(chain.run_request(&mut ctx), Flow::Continue));
        }
        t0.elapsed().as_nanos() as f64 / f64::from(n)
    };
    run(n / 10);
    run(n)
}

fn main() {
    let mut consumers: Vec<sluice_model::Consumer> = (0..96)
        .map(|j| {
            serde_json::from_value(json!({"username": format!("c{j}"), "plugins": {
                "jwt-auth": {"key": format!("hs-{j}"), "secret": format!("secret-{j}")},
                "key-auth": {"key": format!("key-{j}")}}}))
            .unwrap()
        })
        .collect();
    for (name, alg, public) in [
        ("rsa", "RS256", RSA_PUB),
        ("pss", "PS256", RSA_PUB),
        ("ec", "ES256", P256_PUB),
        ("ed", "EdDSA", ED_PUB),
    ] {
        consumers.push(
            serde_json::from_value(json!({"username": name, "plugins": {
                "jwt-auth": {"key": name, "algorithm": alg, "public_key": public}}}))
            .unwrap(),
        );
    }
    let shared = Shared::default();
    let env = CompileEnv::new(&shared, &consumers, None);
    let compile = |p: serde_json::Value| {
        Chain::compile(p.as_object().unwrap(), &env)
            .unwrap()
            .unwrap()
    };
    let jwt = compile(json!({"jwt-auth": {}}));
    let key = compile(json!({"key-auth": {}}));
    let exp = 4_000_000_000u64;
    // An argument picks one algorithm (e.g. under callgrind); none runs all.
    let only = std::env::args().nth(1);
    println!(
        "key-auth : {:.0} ns/request",
        cost(&key, "apikey", "key-42", 200_000)
    );
    for (label, alg, k, claim, n) in [
        ("HS256", Alg::HS256, "secret-42", "hs-42", 200_000),
        ("RS256", Alg::RS256, RSA_PRIV, "rsa", 20_000),
        ("PS256", Alg::PS256, RSA_PRIV, "pss", 20_000),
        ("ES256", Alg::ES256, P256_PRIV, "ec", 20_000),
        ("EdDSA", Alg::EdDSA, ED_PRIV, "ed", 20_000),
    ] {
        if only.as_deref().is_some_and(|o| o != label) {
            continue;
        }
        let t = sign(alg, &json!({"key": claim, "exp": exp}), k).unwrap();
        println!(
            "jwt {label}: {:.0} ns/request",
            cost(&jwt, "authorization", &format!("Bearer {t}"), n)
        );
    }
}
