//! Encrypted secrets through the real binary on a real etcd: a consumer an APISIX node with default settings wrote
//! (its key-auth key encrypted by `openssl enc` with APISIX's default keyring, AES-128-CBC, key as IV, base64) is
//! served by Sluice with the plain key, never with the ciphertext; what Sluice writes through its Admin API lands in
//! etcd encrypted, and `openssl enc -d` reads it back. Skipped with a message when etcd is not installed.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::etcd_outage::{admin, b64, start_node, Etcd, ETCD};
use crate::support::process::Mock;
use crate::support::Client;

/// APISIX's default `apisix.data_encryption.keyring[1]` (Sluice's default too).
const APISIX_KEY: &str = "qeddd145sfvddff3";

fn openssl(decrypt: bool, input: &str) -> String {
    let hex: String = APISIX_KEY.bytes().map(|b| format!("{b:02x}")).collect();
    let mut cmd = Command::new("openssl");
    cmd.args([
        "enc",
        "-aes-128-cbc",
        "-K",
        &hex,
        "-iv",
        &hex,
        "-base64",
        "-A",
    ]);
    if decrypt {
        cmd.arg("-d");
    }
    let mut child = cmd
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
    assert!(out.status.success(), "openssl enc failed");
    String::from_utf8(out.stdout).unwrap()
}

async fn get_with_key(gw: std::net::SocketAddr, key: Option<&str>) -> u16 {
    let extra = key.map_or(String::new(), |k| format!("apikey: {k}\r\n"));
    Client::connect(gw)
        .await
        .request("GET", "/hello", &extra, b"")
        .await
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apisix_encrypted_consumer_is_served_and_sluice_writes_ciphertext() {
    if !std::path::Path::new(ETCD).exists() {
        eprintln!("skipping: {ETCD} not installed (apt-get install -y etcd-server)");
        return;
    }
    tokio::time::timeout(Duration::from_secs(90), async {
        let mock = Mock::start(5).await;
        let mut etcd = Etcd::new();
        etcd.start().await;
        // Written as APISIX writes them, before Sluice starts.
        let route = json!({"uri": "/hello", "plugins": {"key-auth": {}},
                           "upstream": {"type": "roundrobin", "nodes": {mock.addr.to_string(): 1}}});
        etcd.put("/apisix/routes/1", &route).await;
        let encrypted = openssl(false, "S-jack-key");
        let jack = json!({"username": "jack", "plugins": {"key-auth": {"key": encrypted}}});
        etcd.put("/apisix/consumers/jack", &jack).await;

        let node = start_node(etcd.client).await;
        let end = Instant::now() + Duration::from_secs(15);
        while get_with_key(node.gw, Some("S-jack-key")).await != 200 {
            assert!(Instant::now() < end, "the decrypted key is not accepted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(get_with_key(node.gw, Some(&encrypted)).await, 401, "the ciphertext is no key");
        assert_eq!(get_with_key(node.gw, None).await, 401);

        // A write through Sluice's Admin API: etcd holds ciphertext that openssl decrypts.
        let body = json!({"username": "ann", "plugins": {"key-auth": {"key": "S-ann-key"}}}).to_string();
        let (st, v) = admin(&node, "PUT", "/apisix/admin/consumers/ann?wait=applied", &body).await;
        assert_eq!(st, 201, "{v}");
        assert_eq!(get_with_key(node.gw, Some("S-ann-key")).await, 200);
        let r = etcd
            .post("/v3/kv/range", json!({"key": b64(b"/apisix/consumers/ann")}))
            .await;
        let raw = r["kvs"][0]["value"].as_str().expect("ann in etcd");
        let raw = base64_decode(raw);
        assert!(!raw.contains("S-ann-key"), "{raw}");
        let stored: Value = serde_json::from_str(&raw).unwrap();
        let stored = stored["plugins"]["key-auth"]["key"].as_str().unwrap();
        assert_eq!(openssl(true, stored), "S-ann-key");
    })
    .await
    .expect("within 90 s");
}

fn base64_decode(s: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = A.iter().position(|a| *a == c).expect("base64") as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    String::from_utf8(out).unwrap()
}
