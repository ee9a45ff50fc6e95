//! kafka-logger against a real Apache Kafka 3.9.1 broker (KRaft, broker and controller in one JVM, jars from
//! Maven Central through crates/sluice-proxy/tools/kafka-broker/pom.xml) on ephemeral loopback ports, with a
//! plain listener and a SASL/PLAIN one. Messages are read back with rskafka's fetch API.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rskafka::client::partition::{PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use serde_json::{json, Value};
use sluice_plugins::Shared;

use crate::redis::free_port;
use crate::{route, Gw, Origin};

const TOPIC: &str = "sluice-logs";
const PARTITIONS: i32 = 3;

/// The broker's classpath: Maven's copies of kafka_2.13 and its runtime dependencies, fetched once per pom
/// version into the target directory (a scratch directory renamed into place, so concurrent runs never see half).
fn classpath() -> Option<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/kafka-broker");
    let pom = std::fs::read(src.join("pom.xml")).unwrap();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in &pom {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    let out = crate::target_dir().join(format!("kafka-broker/{h:016x}"));
    if !out.join("lib").exists() {
        for tool in ["java", "mvn"] {
            if Command::new(tool)
                .arg("-version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
            {
                crate::ci::skip_unless_ci(&format!(
                    "the Kafka broker needs `{tool}` (Debian: openjdk-17-jdk-headless maven)"
                ));
                return None;
            }
        }
        let tmp = out.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::copy(src.join("pom.xml"), tmp.join("pom.xml")).unwrap();
        let st = Command::new("mvn")
            .args([
                "-q",
                "-B",
                "dependency:copy-dependencies",
                "-DoutputDirectory=lib",
            ])
            .current_dir(&tmp)
            .status()
            .expect("run mvn");
        assert!(st.success(), "mvn could not fetch the Kafka jars: {st}");
        if std::fs::rename(&tmp, &out).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    Some(format!("{}/*", out.join("lib").display()))
}

/// A Kafka broker in KRaft mode, killed on drop.
struct Kafka {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    sasl_port: u16,
}

impl Kafka {
    fn start() -> Option<Kafka> {
        let cp = classpath()?;
        let dir = std::env::temp_dir().join(format!(
            "sluice-kafka-{}-{:x}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (port, sasl_port, ctl) = (free_port(), free_port(), free_port());
        let props = format!(
            "process.roles=broker,controller\nnode.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{ctl}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port},CONTROLLER://127.0.0.1:{ctl}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}\n\
             controller.listener.names=CONTROLLER\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT\n\
             inter.broker.listener.name=PLAINTEXT\n\
             sasl.enabled.mechanisms=PLAIN\n\
             listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_logger=\"s3cret\";\n\
             log.dirs={}\nnum.partitions=1\noffsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\nauto.create.topics.enable=true\n",
            dir.join("data").display()
        );
        let conf = dir.join("server.properties");
        std::fs::write(&conf, props).unwrap();
        let java = |main: &str| {
            let mut c = Command::new("java");
            c.args([
                "-Xms64m",
                "-Xmx384m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .arg("-cp")
            .arg(&cp)
            .arg(main);
            c
        };
        let st = java("kafka.tools.StorageTool")
            .args(["format", "-t", "q1Sh-9_ISia_zwGINzRvyQ", "-c"])
            .arg(&conf)
            .stdout(Stdio::null())
            .status()
            .expect("run java");
        assert!(st.success(), "kafka storage format failed");
        let log = std::fs::File::create(dir.join("kafka.log")).unwrap();
        let child = java("kafka.Kafka")
            .arg(&conf)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kafka");
        let k = Kafka {
            child: Some(child),
            dir,
            port,
            sasl_port,
        };
        // Ready once the topic can be created through the plain listener (bounded).
        let t0 = Instant::now();
        let created = rt().block_on(async {
            while t0.elapsed() < Duration::from_secs(60) {
                if let Ok(c) = client(port).await {
                    if let Ok(ctl) = c.controller_client() {
                        if ctl.create_topic(TOPIC, PARTITIONS, 1, 5_000).await.is_ok() {
                            return true;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            false
        });
        assert!(
            created,
            "kafka did not come up in 60 s: {}",
            std::fs::read_to_string(k.dir.join("kafka.log")).unwrap_or_default()
        );
        eprintln!("kafka up in {:?}", t0.elapsed());
        Some(k)
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        .into()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn client(port: u16) -> Result<Client, String> {
    ClientBuilder::new(vec![format!("127.0.0.1:{port}")])
        .backoff_config(rskafka::BackoffConfig {
            deadline: Some(Duration::from_secs(2)),
            ..Default::default()
        })
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// Every message of the topic, per partition: (key, value).
fn read_all(port: u16) -> Vec<Vec<(Option<String>, String)>> {
    rt().block_on(async {
        let c = client(port).await.unwrap();
        let mut out = Vec::new();
        for p in 0..PARTITIONS {
            let pc: PartitionClient = c
                .partition_client(TOPIC, p, UnknownTopicHandling::Error)
                .await
                .unwrap();
            let (recs, _) = pc.fetch_records(0, 1..10_000_000, 100).await.unwrap();
            out.push(
                recs.into_iter()
                    .map(|r| {
                        (
                            r.record.key.map(|k| String::from_utf8(k).unwrap()),
                            String::from_utf8(r.record.value.unwrap_or_default()).unwrap(),
                        )
                    })
                    .collect(),
            );
        }
        out
    })
}

/// The values in partition 0 of `topic` (empty while it does not exist).
fn read_topic(port: u16, topic: &str) -> Vec<String> {
    rt().block_on(async {
        let c = client(port).await.unwrap();
        let Ok(pc) = c
            .partition_client(topic, 0, UnknownTopicHandling::Error)
            .await
        else {
            return Vec::new();
        };
        pc.fetch_records(0, 1..10_000_000, 100)
            .await
            .map(|(recs, _)| {
                recs.into_iter()
                    .map(|r| String::from_utf8(r.record.value.unwrap_or_default()).unwrap())
                    .collect()
            })
            .unwrap_or_default()
    })
}

fn json_of(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// lua-resty-kafka's partitioner: CRC-32 of the key modulo the partition count.
fn partition_of(key: &str) -> usize {
    let mut c = flate2::Crc::new();
    c.update(key.as_bytes());
    (c.sum() % PARTITIONS as u32) as usize
}

#[test]
fn kafka_logger_against_a_real_broker() {
    let Some(mut kafka) = Kafka::start() else {
        return;
    };
    let o = Origin::start();
    let shared = Arc::new(Shared::default());
    let brokers = json!([{"host": "127.0.0.1", "port": kafka.port}]);
    let gw = Gw::start_with(
        json!({"routes": [
            route("r1", "/hello", &o, json!({"kafka-logger": {
                "brokers": brokers, "kafka_topic": TOPIC, "key": "route-1", "required_acks": -1,
                "batch_max_size": 2, "inactive_timeout": 1}})),
            route("r2", "/origin", &o, json!({"kafka-logger": {
                "broker_list": {"127.0.0.1": kafka.port}, "kafka_topic": TOPIC, "key": "origin",
                "meta_format": "origin", "include_req_body": true, "batch_max_size": 1}})),
            route("r3", "/sasl", &o, json!({"kafka-logger": {
                "brokers": [{"host": "127.0.0.1", "port": kafka.sasl_port,
                             "sasl_config": {"mechanism": "PLAIN", "user": "logger", "password": "s3cret"}}],
                "kafka_topic": TOPIC, "key": "sasl", "batch_max_size": 1}})),
            route("r6", "/auto", &o, json!({"kafka-logger": {
                "brokers": brokers, "kafka_topic": "sluice-auto", "batch_max_size": 1}})),
            route("r4", "/badpass", &o, json!({"kafka-logger": {
                "brokers": [{"host": "127.0.0.1", "port": kafka.sasl_port,
                             "sasl_config": {"user": "logger", "password": "guess"}}],
                "kafka_topic": TOPIC, "key": "badpass", "batch_max_size": 1, "timeout": 2}})),
        ]}),
        shared.clone(),
        2,
    )
    .unwrap();
    for _ in 0..3 {
        assert_eq!(gw.get("/hello?a=1", &[]).status, 200);
    }
    assert_eq!(
        crate::request(
            gw.addr,
            "POST",
            "/origin?x=1",
            &[("X-Probe", "p1")],
            "body-1"
        )
        .status,
        200
    );
    assert_eq!(gw.get("/sasl", &[]).status, 200);
    assert_eq!(gw.get("/badpass", &[]).status, 200);
    assert_eq!(gw.get("/auto", &[]).status, 200);

    // route-1: a batch of two (a JSON array) and, after inactive_timeout, the third alone (still an array, as
    // batch_max_size is not 1), both on the key's partition.
    let mut parts = Vec::new();
    assert!(
        wait_for(|| {
            parts = read_all(kafka.port);
            parts.iter().flatten().count() >= 4
        }),
        "messages: {parts:?}"
    );
    let keyed = |k: &str| -> Vec<String> {
        parts[partition_of(k)]
            .iter()
            .filter(|(key, _)| key.as_deref() == Some(k))
            .map(|(_, v)| v.clone())
            .collect()
    };
    let hello = keyed("route-1");
    assert_eq!(hello.len(), 2, "{parts:?}");
    let first: Value = serde_json::from_str(&hello[0]).unwrap();
    let second: Value = serde_json::from_str(&hello[1]).unwrap();
    assert_eq!(first.as_array().map(Vec::len), Some(2), "{first}");
    assert_eq!(second.as_array().map(Vec::len), Some(1), "{second}");
    assert_eq!(first[0]["route_id"], "r1");
    assert_eq!(first[0]["request"]["uri"], "/hello?a=1");
    assert_eq!(first[0]["response"]["status"], 200);
    assert_eq!(first[0]["upstream"], o.addr.to_string());
    // Nothing under that key on another partition.
    for (i, p) in parts.iter().enumerate() {
        if i != partition_of("route-1") {
            assert!(!p.iter().any(|(k, _)| k.as_deref() == Some("route-1")));
        }
    }

    // meta_format origin, batch of one: the raw request itself, body included.
    let origin = keyed("origin");
    assert_eq!(origin.len(), 1, "{parts:?}");
    assert!(
        origin[0].starts_with("POST /origin?x=1 HTTP/1.1\r\n"),
        "{:?}",
        origin[0]
    );
    assert!(origin[0].contains("\r\nx-probe: p1\r\n"), "{:?}", origin[0]);
    assert!(origin[0].ends_with("\r\n\r\nbody-1"), "{:?}", origin[0]);

    // SASL/PLAIN with the right password delivers one object (batch_max_size 1); a wrong one delivers nothing.
    let sasl = keyed("sasl");
    assert_eq!(sasl.len(), 1, "{parts:?}");
    let s: Value = serde_json::from_str(&sasl[0]).unwrap();
    assert_eq!(s["route_id"], "r3");
    let stats = shared.log_stats("kafka-logger");
    assert!(
        wait_for(|| stats.failed.load(Ordering::Relaxed) >= 1),
        "{stats:?}"
    );
    assert!(keyed("badpass").is_empty());

    // A topic that does not exist yet is asked for by name, and the broker (auto.create.topics.enable) creates it.
    let mut auto = Vec::new();
    assert!(
        wait_for(|| {
            auto = read_topic(kafka.port, "sluice-auto");
            !auto.is_empty()
        }),
        "{stats:?}"
    );
    assert_eq!(json_of(&auto[0])["route_id"], "r6");

    // Broker down: requests are answered as before, each batch is tried 1 + max_retry_count times, then dropped.
    kafka.stop();
    let down = route(
        "r5",
        "/down",
        &o,
        json!({"kafka-logger": {"brokers": brokers, "kafka_topic": TOPIC, "batch_max_size": 1,
        "max_retry_count": 2, "retry_delay": 0, "timeout": 1, "name": "down"}}),
    );
    gw.reload(json!({"routes": [down]}), 2);
    let (errors0, failed0) = (
        stats.errors.load(Ordering::Relaxed),
        stats.failed.load(Ordering::Relaxed),
    );
    let t0 = Instant::now();
    for _ in 0..20 {
        assert_eq!(gw.get("/down", &[]).status, 200);
    }
    let took = t0.elapsed();
    // Waiting on the broker would take 20 x 3 x 1 s.
    assert!(
        took < Duration::from_secs(10),
        "20 requests with a dead broker took {took:?}"
    );
    assert!(
        wait_for(|| stats.failed.load(Ordering::Relaxed) >= failed0 + 3),
        "{stats:?}"
    );
    let errors = stats.errors.load(Ordering::Relaxed) - errors0;
    let failed = stats.failed.load(Ordering::Relaxed) - failed0;
    assert!(
        errors >= failed * 3,
        "each dropped batch was tried three times: {errors} errors for {failed} dropped"
    );
}

#[test]
fn kafka_logger_schema_as_apisix() {
    let o = Origin::start();
    let bad = [
        json!({"kafka_topic": "t"}),
        json!({"brokers": [{"host": "h", "port": 9092}]}),
        json!({"brokers": [], "kafka_topic": "t"}),
        json!({"brokers": [{"host": "h", "port": 70000}], "kafka_topic": "t"}),
        json!({"brokers": [{"host": "h", "port": 1}], "kafka_topic": "t", "required_acks": 0}),
        json!({"brokers": [{"host": "h", "port": 1}], "kafka_topic": "t", "meta_format": "raw"}),
        json!({"brokers": [{"host": "h", "port": 1, "sasl_config": {"user": "u"}}], "kafka_topic": "t"}),
        json!({"brokers": [{"host": "h", "port": 1, "sasl_config": {"user": "u", "password": "p",
               "mechanism": "GSSAPI"}}], "kafka_topic": "t"}),
        json!({"brokers": [{"host": "h", "port": 1}], "broker_list": {"h": 1}, "kafka_topic": "t"}),
        json!({"brokers": [{"host": "h", "port": 1}], "kafka_topic": "t", "batch_max_size": 0}),
    ];
    for b in bad {
        let r = Gw::try_start(json!({"routes": [route("r", "/", &o, json!({"kafka-logger": b}))]}));
        assert!(r.is_err(), "accepted {b}");
    }
    let schema = sluice_plugins::registry::find("kafka-logger").unwrap();
    assert_eq!(schema.priority, 403);
    let s = (schema.schema)();
    assert_eq!(s["properties"]["name"]["default"], "kafka logger");
    assert_eq!(s["properties"]["batch_max_size"]["default"], 1000);
    assert_eq!(s["properties"]["producer_batch_num"]["default"], 200);
}
