//! SNI table compilation and lookup rules.

use serde_json::json;
use sluice_model::Ssl;

use super::SniTable;

fn ssl(id: &str, snis: &[&str]) -> Ssl {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["x.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    serde_json::from_value(json!({
        "id": id, "snis": snis, "cert": cert.pem(), "key": key.serialize_pem(),
    }))
    .unwrap()
}

#[test]
fn lookup_exact_then_one_label_wildcard() {
    let t =
        SniTable::compile(&[ssl("1", &["*.a.test"]), ssl("2", &["x.a.test", "B.test"])]).unwrap();
    let wild = t.lookup(Some("y.a.test")).unwrap();
    let exact = t.lookup(Some("x.a.test")).unwrap();
    assert!(!std::sync::Arc::ptr_eq(wild, exact));
    assert!(std::sync::Arc::ptr_eq(
        t.lookup(Some("b.test")).unwrap(),
        t.lookup(Some("B.TEST")).unwrap()
    ));
    assert!(t.lookup(Some("a.test")).is_none());
    assert!(t.lookup(Some("z.y.a.test")).is_none());
    assert!(t.lookup(Some("")).is_none());
    assert!(t.lookup(Some("test")).is_none());
}

#[test]
fn sni_required_and_certs_keys_paired() {
    assert!(SniTable::compile(&[ssl("1", &[])])
        .unwrap_err()
        .contains("sni"));
    let mut s = ssl("2", &["a.test"]);
    s.certs = vec![s.cert.clone()];
    assert!(SniTable::compile(&[s]).unwrap_err().contains("same length"));
}

#[test]
fn star_catches_every_name_and_no_sni() {
    let t = SniTable::compile(&[ssl("1", &["*"]), ssl("2", &["x.test"])]).unwrap();
    let any = t.lookup(None).unwrap();
    assert!(std::sync::Arc::ptr_eq(
        t.lookup(Some("a.b.c")).unwrap(),
        any
    ));
    assert!(!std::sync::Arc::ptr_eq(
        t.lookup(Some("x.test")).unwrap(),
        any
    ));
    let none = SniTable::compile(&[ssl("2", &["x.test"])]).unwrap();
    assert!(none.lookup(None).is_none());
}
