//! Unit tests of jwt-auth's keys and token checks: every supported algorithm signs and verifies, keys refuse
//! algorithms of another type, and malformed or unsupported keys are refused at compile time.

use serde_json::json;

use super::keys::Key;
use super::{cred, sign, Alg};

pub(crate) const RSA_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC4uUH9MRBoFfd6\nPjrpUwpdaut+3lZfmdWVIlOxjLZSlD7itibegqLcel9xsasUEciGJCOG6TFqOUJT\n1RBaegIL8IJUnDOVQdWygF1zmRot6uvXihE0m3QeWRIi+4Z2cwcty++NvaVLycmy\nOJBkH+1ANB0JMKnesoyHO43PM+F9GCqZGFwmrF1aFI9SaFmKM58GR5kp5/TjExQQ\nZMa9srCLP6Y6ktjxo7XGlTQE3QfIVEZzE7EpWn0kDML8BQT6bRqneOjXW1ul3xVm\nVkfn9JoVwsJqfuFKuxXNRJ0uew1xlFU0fSaPmkEmnL1YzgMyEXUQ4jXuwDKN5t3c\n2LxtYbd/AgMBAAECggEATjlBPP9Qc8tNk8oTd2fPXVTgKcbsa6qAvBkfuPGd6aVW\nZfn9xr8qSVRW45X5nNOVB1z5YHGSl+lscYSp2q6M/FJaVosY+u04mdDrAf9FC0nO\nmmUguRbVWt6cJA1AWRuH4DhalrrG6yulyl9Sodu1Q7ltzEz7uk8A3Gl3OVW+eJKP\naWSec1VMRhvYaCycGWgC7z7qMgJg9w7OpH3PptPHjgjutNxbhIngQvFVlMN1LQJt\nGT3KHJBQ08wZQ24df8Ltw61zjdAaVU2ka+zUg/VOunxin/H/vVw/5mOLQTUUQFhB\nOEMMnuqBrEBLCiglboeJwjSmUb74R8D4RNt2etJVkQKBgQD9jVSIwTFQxH2PjlrT\nHuct0deBtpUxb3DWJykpFMuIcu85eoegP/yzhis7qVWCZiHh1sA/4o0xV5v4hBOd\nwP2uicrjncIX77wHO2m+q3hXAtt69VCWvRFvRv7EV6bsLu6wpXM/UgiV7w85cRnn\nVlFA/Y8oam7JHU3H6Rkif3cKbwKBgQC6gdBYPx+TECKDZwGXPolE8sxnv+FmiPLl\n6YYcWddf8PCgkyEx8VHz1xWVzZ719VkaKLVbLk6mmQ6JZQ/P5Qq7s/m2sf55I9j1\nVJML0Zlv4hwl0WQu28GrHMPFw/KlBIZ6Q8Y9I20Ih1IwxB5lZfSffJgUJnF8Hy0z\nnpBKdpPr8QKBgHjU4XRKnTXgbfX74Uy7bXBokEtAt9jXQu7LutHZFyXvoBHEUt4L\noGHtjqzgBeAezAbUUMohLShWl/3W84I6dqq2//l5NQYzOWg46Cv1i2Pr+KygO8ea\nUrS1ILRxERt9QkLslf+XGIBbbOXzAGU+vXo7W/3muuUdEfQzIcdO92wBAoGBAJ+c\ndMbwzn628jJuNshOtn8RIqkvZyCu1uC3pxQgNtdehS+GeoQZN79sNIbNP9rSK3zd\nlccArEKa/fvLR2rtYvAcJ/qX/WWCrivWQzl8GMnNQbWDqy8G1okvxsM63C8o3kVI\nNyEfbjI8TLR7QmAYju7mW+fytnA45iAk9Osk65ahAoGABpLpY5vFzAGDBdRrjBVJ\nzTjKkgPjDODUXbrL93aBamQ5DB7r0CeR6rEbDvPthOEaIP4fgX/kKFBVEqczUWD5\nBkpMvVMgaU0MxOHgzAZCrl5MjazeQtBlcqIe5OtCzsuinyihM6bMc0rHdCXrj4V5\nOx4sJLegnhX5s2N/FiOglGk=\n-----END PRIVATE KEY-----\n";
pub(crate) const RSA_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAuLlB/TEQaBX3ej466VMK\nXWrrft5WX5nVlSJTsYy2UpQ+4rYm3oKi3HpfcbGrFBHIhiQjhukxajlCU9UQWnoC\nC/CCVJwzlUHVsoBdc5kaLerr14oRNJt0HlkSIvuGdnMHLcvvjb2lS8nJsjiQZB/t\nQDQdCTCp3rKMhzuNzzPhfRgqmRhcJqxdWhSPUmhZijOfBkeZKef04xMUEGTGvbKw\niz+mOpLY8aO1xpU0BN0HyFRGcxOxKVp9JAzC/AUE+m0ap3jo11tbpd8VZlZH5/Sa\nFcLCan7hSrsVzUSdLnsNcZRVNH0mj5pBJpy9WM4DMhF1EOI17sAyjebd3Ni8bWG3\nfwIDAQAB\n-----END PUBLIC KEY-----\n";
pub(crate) const P256_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgie608FkvExxK75DW\nMwTfarVBjD6IIlzmkOcHhceDMnChRANCAAQyfjlDLZaOoEQjl+UBTBityroxSEhA\njinFqqDm3W5EOzFEi2r1Wu+Dmlj45NcX6NVeSsIj8aL3IFAcGsh02Ns/\n-----END PRIVATE KEY-----\n";
pub(crate) const P256_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEMn45Qy2WjqBEI5flAUwYrcq6MUhI\nQI4pxaqg5t1uRDsxRItq9Vrvg5pY+OTXF+jVXkrCI/Gi9yBQHBrIdNjbPw==\n-----END PUBLIC KEY-----\n";
pub(crate) const P384_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMIG2AgEAMBAGByqGSM49AgEGBSuBBAAiBIGeMIGbAgEBBDAx1RpokJJ0iHEPwG55\nJQiGKgDzN7wK6Coua3Es1V9Cep0qPGWQdrGLoXOiHe6kU9OhZANiAAThuqz1Eudp\nPUXIaKSqCAEsrc9o1B/48EfLZPdZF5TU7M8rN0t2P71dVJjIjChWG20uZNVP0iTE\njKcoSAgfm+dGRXdeQjeaUzhloMPNx9KX+smHxCLpeDWtM+LblJFj0Uw=\n-----END PRIVATE KEY-----\n";
pub(crate) const P384_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAE4bqs9RLnaT1FyGikqggBLK3PaNQf+PBH\ny2T3WReU1OzPKzdLdj+9XVSYyIwoVhttLmTVT9IkxIynKEgIH5vnRkV3XkI3mlM4\nZaDDzcfSl/rJh8Qi6Xg1rTPi25SRY9FM\n-----END PUBLIC KEY-----\n";
pub(crate) const ED_PRIV: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIAzrebNkTg3dGNonAVC6eEcI2f+dwqWBBPX9DYoHzP71\n-----END PRIVATE KEY-----\n";
pub(crate) const ED_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAwTBRikLCJSg3EHtVR/fWB76+PO8tPzhf9mR9FxvylNI=\n-----END PUBLIC KEY-----\n";
pub(crate) const RSA1024_PUB: &str = "-----BEGIN PUBLIC KEY-----\nMIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDSFIx8FPRzc622fA2VvSyCzhhR\nrGDaK56R2ZPFPsxPYasFocTlf3to0EoDCPNk/3URaKaNnvUTQePy9mDxBHO+0Rw6\nbZK/OZhYbcQAC5DVAAoaIxpdGjKbt1+qxSXq/TPlcYcZHIrG5XYv08WH8jwVZrSg\nhUyCuz1U4P1s5d5yJQIDAQAB\n-----END PUBLIC KEY-----\n";

fn verifies(alg: Alg, priv_pem: &str, pub_pem: &str) -> bool {
    let t = sign(alg, &json!({"key": "k"}), priv_pem).expect("signs");
    let (signed, s) = t.rsplit_once('.').expect("three parts");
    let sig = crate::util::base64_decode(s).expect("base64url");
    Key::public(pub_pem)
        .expect("public key")
        .verify(alg, signed.as_bytes(), &sig)
}

#[test]
fn every_supported_algorithm_round_trips() {
    for alg in [
        Alg::RS256,
        Alg::RS384,
        Alg::RS512,
        Alg::PS256,
        Alg::PS384,
        Alg::PS512,
    ] {
        assert!(verifies(alg, RSA_PRIV, RSA_PUB), "{alg:?}");
    }
    assert!(verifies(Alg::ES256, P256_PRIV, P256_PUB));
    assert!(verifies(Alg::ES384, P384_PRIV, P384_PUB));
    assert!(verifies(Alg::EdDSA, ED_PRIV, ED_PUB));
}

#[test]
fn a_key_refuses_other_key_types_and_tampering() {
    // An EC token checked against the RSA key, and an RSA signature under a P-256 key.
    assert!(!verifies(Alg::ES256, P256_PRIV, RSA_PUB));
    assert!(!verifies(Alg::RS256, RSA_PRIV, P256_PUB));
    // HMAC keyed with the public key's text (the classic confusion) never passes for a public key.
    let t = sign(Alg::HS256, &json!({"key": "k"}), RSA_PUB).expect("signs");
    let (signed, s) = t.rsplit_once('.').expect("three parts");
    let sig = crate::util::base64_decode(s).expect("b64");
    let k = Key::public(RSA_PUB).expect("key");
    assert!(!k.verify(Alg::HS256, signed.as_bytes(), &sig));
    // A flipped payload byte breaks an otherwise good RS256 signature.
    let t = sign(Alg::RS256, &json!({"key": "k"}), RSA_PRIV).expect("signs");
    let (signed, s) = t.rsplit_once('.').expect("three parts");
    let sig = crate::util::base64_decode(s).expect("b64");
    let mut bad = signed.as_bytes().to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(k.verify(Alg::RS256, signed.as_bytes(), &sig));
    assert!(!k.verify(Alg::RS256, &bad, &sig));
}

#[test]
fn bad_keys_are_refused_with_a_reason() {
    assert!(Key::public("not a pem").is_err());
    let e = Key::public(RSA1024_PUB).err().expect("1024-bit refused");
    assert!(e.contains("1024 bits"), "{e}");
    // A private key where a public one is expected.
    assert!(Key::public(RSA_PRIV).is_err());
}

#[test]
fn consumer_credentials_follow_apisix_checks() {
    let err = |v| cred(&v).err().expect("refused");
    assert_eq!(
        err(json!({"key": "k", "algorithm": "HS512"})),
        "property \"secret\" is required when \"algorithm\" is \"HS256\" or \"HS512\""
    );
    assert_eq!(
        err(json!({"key": "k", "algorithm": "RS256"})),
        "missing valid public key"
    );
    assert_eq!(
        err(json!({"key": "k", "secret": "***", "base64_secret": true})),
        "base64_secret required but the secret is not in base64 format"
    );
    assert!(err(json!({"secret": "s"})).contains("key"));
    assert!(
        err(json!({"key": "k", "algorithm": "ES256", "public_key": RSA_PUB}))
            .contains("does not fit")
    );
    assert!(err(json!({"key": "k", "algorithm": "XS1", "secret": "s"})).contains("algorithm"));
    assert!(
        cred(&json!({"key": "k", "algorithm": "HS384"})).is_ok(),
        "random secret as APISIX"
    );
    assert!(cred(&json!({"key": "k", "algorithm": "PS256", "public_key": RSA_PUB})).is_ok());
}
