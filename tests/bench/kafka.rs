//! The Kafka listener beside the native one, in one run on one broker: confluent-kafka
//! producing 256-byte records with acks=all and linger.ms=5, then `seglog bench
//! produce` with the same record size and a comparable batch on the native listener;
//! then the fetch rate of a warm partition through each door. Prints both figures and
//! the ratio (goal: Kafka at least 80 % of native). Run with
//! cargo test --release --test bench -- --ignored --nocapture kafka::

use std::process::Command;

use crate::util::serve::Serve;

const RECORDS: &str = "200000";
const RECORD_SIZE: &str = "256";
/// Native batch: about what librdkafka sends per request at linger 5 ms here.
const NATIVE_BATCH: &str = "1000";

fn python(args: &[&str]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/broker/kafka/clients.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "benchmark"]
fn kafka_beside_native() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(dir.path(), &["--kafka-listen", "127.0.0.1:0"]);
    let boot = s.kafka_addr.clone().unwrap();
    s.ok(&["topics", "create", "kb", "--partitions", "1"]);
    s.ok(&["topics", "create", "nb", "--partitions", "1"]);
    let k = python(&["bench_produce", &boot, "kb", RECORDS, RECORD_SIZE]);
    assert_eq!(k["failed"], 0, "{k}");
    let n = s.ok(&[
        "bench",
        "produce",
        "--topic",
        "nb",
        "--records",
        RECORDS,
        "--record-size",
        RECORD_SIZE,
        "--batch",
        NATIVE_BATCH,
        "--connections",
        "1",
        "--json",
    ]);
    let n: serde_json::Value = serde_json::from_str(n.lines().last().unwrap()).unwrap();
    let kafka_rate = k["records_per_s"].as_f64().unwrap();
    println!("kafka produce (confluent-kafka, acks=all, linger.ms=5): {kafka_rate:.0} records/s");
    println!("native produce (seglog bench produce --batch {NATIVE_BATCH}): {n}");
    let f = python(&["bench_fetch", &boot, "kb", RECORDS]);
    println!("kafka fetch (confluent-kafka consumer): {f}");
    let nf = s.ok(&[
        "bench",
        "consume",
        "--topic",
        "nb",
        "--records",
        RECORDS,
        "--json",
    ]);
    println!("native fetch (seglog bench consume): {}", nf.trim());
    s.stop();
}
