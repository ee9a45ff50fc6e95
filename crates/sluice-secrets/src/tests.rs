use std::io::Write;
use std::process::{Command, Stdio};

use std::borrow::Cow;

use serde_json::{json, Value};

use super::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `openssl enc` with APISIX's parameters: key = keyring entry, IV = its first 16 bytes, PKCS#7, base64.
fn openssl(decrypt: bool, key: &str, input: &str) -> String {
    let cipher = if key.len() == 32 {
        "-aes-256-cbc"
    } else {
        "-aes-128-cbc"
    };
    let mut args = vec![
        "enc".to_owned(),
        cipher.to_owned(),
        "-K".into(),
        hex(key.as_bytes()),
        "-iv".into(),
        hex(&key.as_bytes()[..16]),
        "-base64".into(),
        "-A".into(),
    ];
    if decrypt {
        args.push("-d".into());
    }
    let mut child = Command::new("openssl")
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl CLI");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

const K1: &str = "qeddd145sfvddff3";
const K2: &str = "edd1c9f0985e76a2";
const K256: &str = "qeddd145sfvddff3qeddd145sfvddff3";

#[test]
fn interoperates_with_openssl_both_ways() {
    for key in [K1, K256] {
        let ring = Keyring::new(&[key]).unwrap();
        for plain in [
            "hello world",
            "",
            "exactly16bytes!!",
            "-----BEGIN PRIVATE KEY-----\nMIIE\n",
        ] {
            let theirs = openssl(false, key, plain);
            assert_eq!(ring.decrypt(&theirs).as_deref(), Some(plain), "{key}");
            let ours = ring.encrypt(plain).unwrap();
            assert_eq!(ours, theirs, "same key, IV and padding give the same bytes");
            assert_eq!(openssl(true, key, &ours), plain);
        }
    }
}

#[test]
fn rotation_reads_old_data_and_writes_with_the_new_key() {
    let old = Keyring::new(&[K1]).unwrap();
    let written_before = old.encrypt("s3cret").unwrap();
    let rotated = Keyring::new(&[K256, K1]).unwrap();
    assert_eq!(rotated.decrypt(&written_before).as_deref(), Some("s3cret"));
    let written_after = rotated.encrypt("s3cret").unwrap();
    assert_eq!(openssl(true, K256, &written_after), "s3cret");
    // The old key alone cannot read what the new one wrote.
    assert_eq!(old.decrypt(&written_after), None);
}

#[test]
fn bad_keys_and_undecryptable_values() {
    let e = Keyring::new(&[K1, "short"]).unwrap_err();
    assert!(e.contains("keyring[1]") && e.contains("got 5 bytes"), "{e}");
    assert!(Keyring::new(&["x".repeat(24)]).is_err());
    let ring = Keyring::new(&[K1]).unwrap();
    // Not base64, not whole blocks, wrong key: no plaintext.
    for v in [
        "not base64!",
        "abcd",
        "",
        &Keyring::new(&[K2]).unwrap().encrypt("x").unwrap(),
    ] {
        assert_eq!(ring.decrypt(v), None, "{v:?}");
    }
    assert_eq!(Keyring::default().encrypt("x"), None);
    assert_eq!(format!("{ring:?}"), "Keyring(1 keys)");
}

static KEY_AUTH: SecretFields = SecretFields {
    conf: &[],
    consumer: Some(&["key"]),
    metadata: &[],
};
static LIMIT: SecretFields = SecretFields {
    conf: &["redis_password", "nested.items.pw"],
    consumer: None,
    metadata: &["token"],
};

fn fields(name: &str) -> Option<&'static SecretFields> {
    match name {
        "key-auth" => Some(&KEY_AUTH),
        "limit-count" => Some(&LIMIT),
        "echo" => Some(&SecretFields::NONE),
        _ => None,
    }
}

fn de(keys: &[&str], encrypt_fields: bool) -> DataEncryption {
    DataEncryption::new(Keyring::new(keys).unwrap(), encrypt_fields, fields)
}

const PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIBVQ\n-----END PRIVATE KEY-----\n";

fn texts(v: &Value) -> String {
    v.to_string()
}

#[test]
fn encrypts_exactly_the_declared_fields_and_decrypts_them_back() {
    let d = de(&[K1], true);
    let mut route = json!({
        "uri": "/x",
        "upstream": {"tls": {"client_cert": "CERT", "client_key": PEM}},
        "plugins": {
            "limit-count": {"redis_password": "pw1", "count": 1,
                            "nested": {"items": [{"pw": "a"}, {"pw": ["b", "c"]}, {"pw": {"m": "d"}}]}},
            "key-auth": {"key": "route-side-key-is-not-secret"},
            "unknown": {"password": "zzz"}
        }
    });
    let orig = route.clone();
    d.encrypt("routes/1", &mut route);
    let p = &route["plugins"]["limit-count"];
    assert_eq!(
        p["redis_password"],
        json!(Keyring::new(&[K1]).unwrap().encrypt("pw1").unwrap())
    );
    assert_eq!(p["count"], 1);
    for plain in [
        "\"pw1\"",
        "\"a\"",
        "\"b\"",
        "\"c\"",
        "\"d\"",
        "BEGIN PRIVATE",
    ] {
        assert!(!texts(&route).contains(plain), "{plain} left in {route}");
    }
    // Only consumers' key-auth holds the key; unknown plugins cannot be encrypted (their fields are unknown).
    assert_eq!(route["plugins"]["key-auth"], orig["plugins"]["key-auth"]);
    assert_eq!(route["plugins"]["unknown"], orig["plugins"]["unknown"]);
    assert_eq!(route["upstream"]["tls"]["client_cert"], "CERT");
    // Decrypting twice, or an already plain value, changes nothing more.
    let mut back = route.clone();
    d.decrypt("routes/1", &mut back);
    assert_eq!(back, orig);
    d.decrypt("routes/1", &mut back);
    assert_eq!(back, orig);
    assert_eq!(*d.decrypted("routes/1", &route), orig);
    // Values without a secret field are not copied.
    let plain = json!({"uri": "/y", "upstream": {"nodes": {"a:1": 1}}, "plugins": {"echo": {}, "key-auth": {}}});
    assert!(matches!(d.decrypted("routes/2", &plain), Cow::Borrowed(_)));
    assert!(matches!(d.decrypted("routes/1", &route), Cow::Owned(_)));

    let mut consumer = json!({"username": "jack", "plugins": {"key-auth": {"key": "k-1"},
                                                              "limit-count": {"redis_password": "pw"}}});
    d.encrypt("consumers/jack/credentials/c1", &mut consumer);
    assert_ne!(consumer["plugins"]["key-auth"]["key"], "k-1");
    assert_ne!(consumer["plugins"]["limit-count"]["redis_password"], "pw");
    let mut vault = json!({"uri": "http://v", "token": "hvs.secret"});
    d.encrypt("secrets/vault/1", &mut vault);
    assert_eq!(vault["uri"], "http://v");
    assert_eq!(
        openssl(true, K1, vault["token"].as_str().unwrap()),
        "hvs.secret"
    );
    let mut view = vault.clone();
    d.admin_view("secrets/vault/1", &mut view);
    assert_eq!(view["token"], "hvs.secret");
    let mut meta = json!({"token": "t", "other": "o"});
    d.encrypt("plugin_metadata/limit-count", &mut meta);
    assert_ne!(meta["token"], "t");
    assert_eq!(meta["other"], "o");
}

#[test]
fn ssl_keys_follow_the_keyring_plugin_fields_follow_the_switch() {
    let off = de(&[K1], false);
    let mut ssl = json!({"cert": "C", "key": PEM, "keys": [PEM, "already-encrypted"]});
    off.encrypt("ssls/1", &mut ssl);
    assert!(!texts(&ssl).contains("BEGIN PRIVATE"), "{ssl}");
    assert_eq!(ssl["keys"][1], "already-encrypted", "only PEM is encrypted");
    let mut route = json!({"plugins": {"limit-count": {"redis_password": "pw"}}});
    off.encrypt("routes/1", &mut route);
    assert_eq!(route["plugins"]["limit-count"]["redis_password"], "pw");
    off.decrypt("ssls/1", &mut ssl);
    assert_eq!(ssl["key"], PEM);
    // No keyring: nothing is encrypted at all.
    let none = DataEncryption::new(Keyring::default(), true, fields);
    let mut s2 = json!({"key": PEM});
    none.encrypt("ssls/1", &mut s2);
    assert_eq!(s2["key"], PEM);
}

#[test]
fn admin_view_is_apisix_get_and_redaction_hides_everything() {
    let d = de(&[K1], true);
    let mut ssl = json!({"cert": "C", "key": PEM, "keys": [PEM]});
    d.encrypt("ssls/1", &mut ssl);
    let mut view = ssl.clone();
    d.admin_view("ssls/1", &mut view);
    assert_eq!(view, json!({"cert": "C"}));

    let mut up = json!({"tls": {"client_key": PEM}});
    d.encrypt("upstreams/1", &mut up);
    let mut view = up.clone();
    d.admin_view("upstreams/1", &mut view);
    assert_eq!(view, up, "APISIX's GET leaves an upstream key encrypted");

    let mut c = json!({"plugins": {"key-auth": {"key": "k-1"}}});
    d.encrypt("consumers/jack", &mut c);
    let mut view = c.clone();
    d.admin_view("consumers/jack", &mut view);
    assert_eq!(
        view["plugins"]["key-auth"]["key"], "k-1",
        "APISIX decrypts plugin fields on GET"
    );

    let mut r = c.clone();
    d.redact("consumers/jack", &mut r);
    assert_eq!(r["plugins"]["key-auth"]["key"], REDACTED);
    let mut r = json!({"key": PEM, "keys": [PEM], "cert": "C"});
    d.redact("ssls/1", &mut r);
    assert_eq!(r, json!({"key": REDACTED, "keys": [REDACTED], "cert": "C"}));
    let mut r = json!({"plugins": {"unknown": {"a": {"b": ["s"]}, "n": 1}, "echo": {"body": "b"}}});
    d.redact("global_rules/1", &mut r);
    assert_eq!(
        r["plugins"]["unknown"],
        json!({"a": {"b": [REDACTED]}, "n": 1})
    );
    assert_eq!(r["plugins"]["echo"]["body"], "b");
    let mut r = json!({"uri": "http://v", "prefix": "p", "token": "hvs.x"});
    d.redact("secrets/vault/1", &mut r);
    assert_eq!(r["token"], REDACTED);
    assert_eq!(r["uri"], "http://v");
    let mut r = json!({"anything": "x"});
    d.redact("secrets/other/1", &mut r);
    assert_eq!(r["anything"], REDACTED);
    let mut r = json!({"token": "t"});
    d.redact("plugin_metadata/unknown", &mut r);
    assert_eq!(r["token"], REDACTED);
}
