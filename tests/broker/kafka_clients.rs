//! Real Kafka clients against `seglog serve --kafka-listen`: kcat (librdkafka),
//! confluent-kafka and kafka-python (tests/broker/kafka/clients.py). A client that is
//! not installed skips its test, except under CI=true, where `.ci/run` installs them
//! and a missing one fails.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::util::serve::Serve;

/// True when `tool --version`-style probe `args` runs; otherwise skips (false) or,
/// under CI=true, fails.
pub(crate) fn have(tool: &str, args: &[&str]) -> bool {
    let ok = Command::new(tool)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is not installed (.ci/run installs it)"
        );
        eprintln!("skipped: {tool} {args:?} does not run here");
    }
    ok
}

pub(crate) fn have_kcat() -> bool {
    have("kcat", &["-V"])
}

pub(crate) fn have_python(module: &str) -> bool {
    have("python3", &["-c", &format!("import {module}")])
}

fn start(dir: &Path) -> (Serve, String) {
    let s = Serve::start_with(dir, &["--kafka-listen", "127.0.0.1:0"]);
    let k = s.kafka_addr.clone().expect("kafka listening line");
    (s, k)
}

fn kcat(boot: &str, args: &[&str], input: Option<&str>) -> Output {
    let mut child = Command::new("kcat")
        .args(["-b", boot])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kcat");
    let mut stdin = child.stdin.take().unwrap();
    if let Some(text) = input {
        stdin.write_all(text.as_bytes()).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kcat {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Consumes every partition from the beginning: partition → [(offset, key, value)].
fn kcat_all(boot: &str, topic: &str) -> BTreeMap<u32, Vec<(u64, String, String)>> {
    let out = kcat(
        boot,
        &[
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p\t%o\t%k\t%s\n",
        ],
        None,
    );
    let mut parts: BTreeMap<u32, Vec<(u64, String, String)>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Vec<&str> = line.splitn(4, '\t').collect();
        assert_eq!(f.len(), 4, "{line}");
        parts.entry(f[0].parse().unwrap()).or_default().push((
            f[1].parse().unwrap(),
            f[2].to_string(),
            f[3].to_string(),
        ));
    }
    parts
}

pub(crate) fn python(mode: &str, args: &[&str]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/broker/kafka/clients.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(mode)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{mode}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn kcat_lists_produces_and_consumes_exactly() {
    if !have_kcat() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "t", "--partitions", "3"]);
    let meta = String::from_utf8(kcat(&boot, &["-L"], None).stdout).unwrap();
    assert!(meta.contains("topic \"t\" with 3 partitions"), "{meta}");
    assert!(meta.contains(&format!("broker 0 at {boot}")), "{meta}");
    let lines: Vec<(String, String)> = (0..1000)
        .map(|i| (format!("key{}", i % 17), format!("value {i}")))
        .collect();
    let input: String = lines.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    kcat(&boot, &["-P", "-t", "t", "-K:"], Some(&input));
    let parts = kcat_all(&boot, "t");
    assert_eq!(parts.values().map(Vec::len).sum::<usize>(), 1000);
    for (p, recs) in &parts {
        // Offsets from 0 without gaps; records of a key all in one partition, in the
        // order they were given.
        let offsets: Vec<u64> = recs.iter().map(|r| r.0).collect();
        assert_eq!(
            offsets,
            (0..recs.len() as u64).collect::<Vec<_>>(),
            "partition {p}"
        );
        let keys: std::collections::BTreeSet<&str> = recs.iter().map(|r| r.1.as_str()).collect();
        let expected: Vec<(&str, &str)> = lines
            .iter()
            .filter(|(k, _)| keys.contains(k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let got: Vec<(&str, &str)> = recs.iter().map(|r| (r.1.as_str(), r.2.as_str())).collect();
        assert_eq!(got, expected, "partition {p}");
        // The native door reads the same records.
        let native = s.ok(&["consume", "t", "--partition", &p.to_string(), "--json"]);
        let values: Vec<String> = native
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["value"].as_str().unwrap().to_string()
            })
            .collect();
        let kvalues: Vec<&str> = recs.iter().map(|r| r.2.as_str()).collect();
        assert_eq!(values, kvalues, "partition {p}");
    }
    // And the other way: records produced natively come back through Kafka.
    s.ok(&["topics", "create", "n", "--partitions", "1"]);
    s.ok_with_stdin(&["produce", "n", "--key-separator", "="], "a=1\nb=2\nc=3\n");
    let back = kcat_all(&boot, "n");
    let got: Vec<(u64, &str, &str)> = back[&0]
        .iter()
        .map(|(o, k, v)| (*o, k.as_str(), v.as_str()))
        .collect();
    assert_eq!(got, [(0, "a", "1"), (1, "b", "2"), (2, "c", "3")]);
    s.stop();
}

/// Records produced through Kafka, uncompressed and in each codec kcat writes, are on
/// disk exactly: `seglog dump` of the stopped broker's data directory prints every one
/// at the offset and with the timestamp Kafka reported, with its key and value bytes.
#[test]
fn kcat_records_are_dumped_exactly() {
    if !have_kcat() {
        return;
    }
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "d", "--partitions", "4"]);
    let codecs = ["none", "gzip", "snappy", "lz4"];
    let mut sent: BTreeMap<u32, Vec<(String, String)>> = BTreeMap::new();
    for (p, codec) in codecs.iter().enumerate() {
        let lines: Vec<(String, String)> = (0..300)
            .map(|i| {
                (
                    format!("k{p}.{i}"),
                    format!("{codec} värde {i} {}", "x".repeat(i % 40)),
                )
            })
            .collect();
        let input: String = lines.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let part = p.to_string();
        let mut args = vec!["-P", "-t", "d", "-p", &part, "-K:"];
        if *codec != "none" {
            args.extend(["-z", codec]);
        }
        kcat(&boot, &args, Some(&input));
        sent.insert(u32::try_from(p).unwrap(), lines);
    }
    // What Kafka reports: partition → [(offset, timestamp)].
    let out = kcat(
        &boot,
        &[
            "-C",
            "-t",
            "d",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p\t%o\t%T\n",
        ],
        None,
    );
    let mut reported: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 3, "{line}");
        reported
            .entry(f[0].parse().unwrap())
            .or_default()
            .push((f[1].parse().unwrap(), f[2].parse().unwrap()));
    }
    s.stop();
    let data = dir.path().to_str().unwrap();
    let (code, out, err) = crate::util::bin::run(
        &["dump", "--json", "--bytes", "hex", "--quiet", data],
        dir.path(),
    );
    assert_eq!(code, 0, "{err}");
    // partition → [(offset, timestamp, key, value)] as on disk.
    let mut dumped: BTreeMap<u32, Vec<(u64, u64, String, String)>> = BTreeMap::new();
    for l in crate::util::bin::json_lines(&out) {
        if l["type"] != "record" || l["topic"] != "d" {
            continue;
        }
        let p = u32::try_from(l["partition"].as_u64().unwrap()).unwrap();
        dumped.entry(p).or_default().push((
            l["offset"].as_u64().unwrap(),
            l["timestamp_ms"].as_u64().unwrap(),
            l["key"].as_str().unwrap().to_string(),
            l["value"].as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(dumped.len(), codecs.len(), "{out}");
    for (p, lines) in &sent {
        let want: Vec<(u64, u64, String, String)> = lines
            .iter()
            .zip(&reported[p])
            .map(|((k, v), (o, t))| (*o, *t, hex(k), hex(v)))
            .collect();
        assert_eq!(reported[p].len(), lines.len(), "partition {p}");
        assert_eq!(
            want.iter().map(|r| r.0).collect::<Vec<_>>(),
            (0..300).collect::<Vec<u64>>(),
            "partition {p}"
        );
        assert_eq!(dumped[p], want, "partition {p} ({})", codecs[*p as usize]);
    }
}

#[test]
fn confluent_idempotent_producer_and_group() {
    if !have_python("confluent_kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "c", "--partitions", "4"]);
    let r = python("confluent_idempotent", &[&boot, "c", "10000"]);
    assert_eq!(r["reports"], 10000, "{r}");
    assert_eq!(r["with_offsets"], 10000, "{r}");
    assert_eq!(r["errors"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(r["contiguous"], true, "{r}");
    let g = python("confluent_group", &[&boot, "c", "g1", "10000"]);
    let split = g["split"].as_array().expect("both members got partitions");
    let (a, b) = (split[0].as_array().unwrap(), split[1].as_array().unwrap());
    assert!(
        !a.is_empty() && !b.is_empty() && a.len() + b.len() == 4,
        "{g}"
    );
    let after = g["after_close"]
        .as_array()
        .expect("the rebalance after a close");
    assert_eq!(after.len(), 4, "{g}");
    assert_eq!(g["seen"], 10000, "{g}");
    assert_eq!(
        g["committed"], true,
        "the last commit was never acknowledged: {g}"
    );
    // The commits are the group's offsets on the native side. A member's last commit
    // may still be on its way when its process has exited (librdkafka's close does not
    // always wait for it): wait for the group to reach the end.
    let began = std::time::Instant::now();
    let (total, d) = loop {
        let d = s.ok(&["groups", "describe", "g1", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&d).unwrap();
        let total: u64 = v["offsets"]
            .as_array()
            .unwrap_or_else(|| panic!("{d}"))
            .iter()
            .map(|o| o["committed"].as_u64().unwrap())
            .sum();
        if total == 10000 || began.elapsed() > std::time::Duration::from_secs(30) {
            break (total, d);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(total, 10000, "{d}");
    s.stop();
}

#[test]
fn kafka_python_compression_and_admin() {
    if !have_python("kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    let r = python("kafka_python", &[&boot]);
    assert_eq!(r["created"], true, "{r}");
    assert_eq!(r["deleted"], true, "{r}");
    for codec in ["gzip", "lz4", "zstd"] {
        assert_eq!(r["codecs"][codec], "ok", "{codec}: {r}");
    }
    let snappy = r["codecs"]["snappy"].as_str().unwrap();
    assert!(snappy == "ok" || snappy.starts_with("unavailable"), "{r}");
    s.stop();
}

#[test]
fn confluent_headers_timestamps_and_transactions() {
    if !have_python("confluent_kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "e", "--partitions", "1"]);
    let r = python("confluent_edges", &[&boot, "e"]);
    assert_eq!(r["headers_is_invalid_record"], true, "{r}");
    // Three records at 1000, 2000, 3000 ms (offsets 0..=2; the refused one took none).
    assert_eq!(r["by_time"], serde_json::json!([1, 2, -1]), "{r}");
    assert_eq!(r["watermarks"], serde_json::json!([0, 3]), "{r}");
    // Refused at once, as final, with the reason: not retried until the timeout
    // (librdkafka retried INVALID_REQUEST every 500 ms).
    let tx = r["transactions"].as_str().unwrap();
    assert!(
        tx.starts_with("refused") && tx.contains("transactional ids are not supported"),
        "{r}"
    );
    assert_eq!(
        r["transactions_code"], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "{r}"
    );
    assert_eq!(r["transactions_fatal"], true, "{r}");
    // Before init_transactions' own 10 s deadline.
    assert!(r["transactions_s"].as_f64().unwrap() < 9.0, "{r}");
    assert!(s.stderr().contains("record headers are not supported"));
    s.stop();
}

#[test]
fn confluent_describe_group_names_client_id_and_host() {
    if !have_python("confluent_kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "d", "--partitions", "2"]);
    let r = python("confluent_describe_group", &[&boot, "d", "dg"]);
    // As Kafka: the request header's client id, and the peer's address as
    // InetAddress prints it.
    assert_eq!(
        r["members"],
        serde_json::json!([{"client_id": "describe-me", "host": "/127.0.0.1", "partitions": [0, 1]}]),
        "{r}"
    );
    s.stop();
}

/// Static membership (KIP-345): a member that restarts with its `group.instance.id`
/// takes its old place at once, with its old partitions, and the other member's
/// partitions are not revoked (no rebalance).
#[test]
fn confluent_static_member_restarts_without_a_rebalance() {
    if !have_python("confluent_kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "st", "--partitions", "4"]);
    let r = python("confluent_static_members", &[&boot, "st", "sg"]);
    let before = r["before"].as_array().unwrap();
    assert!(
        before.iter().all(|a| !a.as_array().unwrap().is_empty()),
        "{r}"
    );
    assert_eq!(r["after"], r["before"], "{r}");
    assert_eq!(r["c1_after_restart"], serde_json::json!([]), "{r}");
    // DescribeGroups (v4+) names the instance ids.
    assert_eq!(r["instances"], serde_json::json!(["i1", "i2"]), "{r}");
    assert_eq!(
        r["c2_again"],
        serde_json::json!([["assign", before[1]]]),
        "{r}"
    );
    // No rebalance: c1 saw no revocation, so the restarted member did not wait
    // for the old one's session to expire (`took_s` is printed with the rest,
    // never asserted: no timing thresholds in tests).
    s.stop();
}

/// As Kafka's coordinator reloads its groups: a member of a Stable group goes on
/// across a broker restart (same data directory and port) without a rebalance; its
/// commit at its generation is accepted and DescribeGroups shows it again.
#[test]
fn confluent_member_keeps_its_place_across_a_broker_restart() {
    use std::io::BufRead;
    if !have_python("confluent_kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "rt", "--partitions", "2"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/broker/kafka/clients.py");
    let mut child = Command::new("python3")
        .args([script, "confluent_member_across_restart", &boot, "rt", "rg"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> serde_json::Value {
        let line = lines.next().expect("a line from the client").unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let stable = next();
    assert_eq!(stable["assignment"], serde_json::json!([0, 1]), "{stable}");
    assert_eq!(stable["members"].as_array().unwrap().len(), 1, "{stable}");
    s.stop();
    let s = Serve::start_with(dir.path(), &["--kafka-listen", &boot]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"restarted\n").unwrap();
    stdin.flush().unwrap();
    let after = next();
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert_eq!(after["commit"], "ok", "{after}");
    assert_eq!(after["events"], serde_json::json!([]), "{after}");
    assert_eq!(after["state"], "STABLE", "{after}");
    assert_eq!(after["members"], stable["members"], "{after}");
    assert_eq!(after["assignment"], serde_json::json!([0, 1]), "{after}");
    s.stop();
}

/// As Kafka: LeaveGroup for a group the broker does not know answers
/// UNKNOWN_MEMBER_ID (25), per member from version 3 on (was GROUP_ID_NOT_FOUND).
#[test]
fn leave_group_of_an_unknown_group_is_unknown_member() {
    if !have_python("kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    let r = python("raw_leave_unknown_group", &[&boot]);
    assert_eq!(r, serde_json::json!({"v0": [25], "v3": [25, 25]}));
    s.stop();
}

/// KIP-360: an idempotent batch at sequence 0 starts a new state at a higher epoch
/// (a client that bumped its epoch itself) or for an id whose state expired; a
/// higher epoch at another sequence is OUT_OF_ORDER_SEQUENCE_NUMBER (45). The new
/// states are in the producer journal: duplicates and the fencing of the old epoch
/// hold across a restart. InitProducerId naming an expired id hands out a new id.
#[test]
fn idempotent_epoch_bump_and_expired_id_across_restarts() {
    if !have_python("kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let expire = [
        "--kafka-listen",
        "127.0.0.1:0",
        "--producer-id-expiration",
        "2s",
    ];
    let s = Serve::start_with(dir.path(), &expire);
    s.ok(&["topics", "create", "idem", "--partitions", "1"]);
    let boot = s.kafka_addr.clone().unwrap();
    let one = python("raw_idempotent_epochs", &[&boot, "idem", "one"]);
    let pids: Vec<String> = one["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    let pids: Vec<&str> = pids.iter().map(String::as_str).collect();
    let answers = |v: &serde_json::Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("pids");
        v
    };
    assert_eq!(
        answers(&one),
        serde_json::json!({
            "a_first": [0, 0],
            "a_bump_seq1": [45, -1],
            "a_bump_seq0": [0, 2],
            "a_old_epoch": [47, -1],
            "b_first": [0, 3],
            "never_handed_out": [59, -1],
        })
    );
    s.stop();
    let s = Serve::start_with(dir.path(), &expire);
    let boot = s.kafka_addr.clone().unwrap();
    let args = |phase| [&[boot.as_str(), "idem", phase][..], &pids[..]].concat();
    let two = python("raw_idempotent_epochs", &args("two"));
    assert_eq!(
        two,
        serde_json::json!({"a_bump_dup": [0, 2], "a_bump_seq1": [0, 4], "a_old_epoch": [47, -1]})
    );
    // Both producers unseen for longer than the expiration when the broker stops:
    // the snapshot drops them.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    s.stop();
    let s = Serve::start_with(dir.path(), &expire);
    let boot = s.kafka_addr.clone().unwrap();
    let args = |phase| [&[boot.as_str(), "idem", phase][..], &pids[..]].concat();
    let three = python("raw_idempotent_epochs", &args("three"));
    assert_eq!(
        three,
        serde_json::json!({
            "b_expired_init": [0, true, 0],
            "b_expired_seq1": [59, -1],
            "b_expired_seq0": [0, 5],
            "b_seq1": [0, 6]
        })
    );
    s.stop();
}

/// A record with timestamp -1 (Kafka's NO_TIMESTAMP) is stamped with the broker's
/// clock when it is written, as the native produce's -1 is, and read back so
/// (Kafka would return -1): the format's timestamp is milliseconds since the epoch
/// and time-based retention and ListOffsets read it as such. README and
/// docs/PROTOCOL.md say so.
#[test]
fn a_record_without_timestamp_reads_back_with_the_brokers_time() {
    if !have_python("kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "ts", "--partitions", "1"]);
    let r = python("raw_no_timestamp", &[&boot, "ts"]);
    assert_eq!(r["error"], 0, "{r}");
    assert_eq!(r["timestamp_type"], 0, "CreateTime: {r}");
    let ts = r["timestamp"].as_i64().unwrap();
    assert!(
        r["before_ms"].as_i64().unwrap() <= ts && ts <= r["after_ms"].as_i64().unwrap(),
        "{r}"
    );
    s.stop();
}

#[test]
fn confluent_close_during_a_long_poll_is_not_a_warning() {
    if !have_python("confluent_kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "w", "--partitions", "1"]);
    python("confluent_close_during_fetch", &[&boot, "w"]);
    // The fetch pending at the close is answered within its 3 s wait; the answer
    // finds the connection closed by the peer.
    std::thread::sleep(std::time::Duration::from_secs(5));
    let log = s.stderr();
    assert!(!log.contains("kafka: closing the connection"), "{log}");
    s.stop();
}

#[test]
fn confluent_creates_a_topic_with_kafka_config_names() {
    if !have_python("confluent_kafka") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    let r = python("confluent_create_kafka_configs", &[&boot, "kc"]);
    assert_eq!(r["created"], true, "{r}");
    let d: serde_json::Value =
        serde_json::from_str(&s.ok(&["topics", "describe", "kc", "--json"])).unwrap();
    let c = &d["config"];
    assert_eq!(c["retention_ms"], 3_600_000, "{d}");
    assert_eq!(c["retention_bytes"], 1_048_576, "{d}");
    assert_eq!(c["segment_bytes"], 1_048_576, "{d}");
    assert_eq!(c["segment_ms"], 60_000, "{d}");
    assert_eq!(c["cleanup_policy"], "compact", "{d}");
    assert_eq!(c["tombstone_retention_ms"], 5_000, "{d}");
    assert_eq!(c["max_record_bytes"], 65_536, "{d}");
    s.stop();
}

/// Reads a child's stream into a shared string.
fn collect(r: impl std::io::Read + Send + 'static) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::BufRead;
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&text);
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            let mut t = sink.lock().unwrap();
            t.push_str(&line);
            t.push('\n');
        }
    });
    text
}

/// The partitions of the last "assigned:" line kcat logged.
fn last_assignment(stderr: &str) -> Option<Vec<String>> {
    let line = stderr.lines().rev().find(|l| l.contains("assigned:"))?;
    let list = line.split("assigned:").nth(1)?;
    Some(
        list.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
    )
}

#[test]
fn kcat_group_members_split_partitions_and_resume() {
    if !have_kcat() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, boot) = start(dir.path());
    s.ok(&["topics", "create", "g", "--partitions", "4"]);
    let input: String = (0..400).map(|i| format!("k{i}:v{i}\n")).collect();
    kcat(&boot, &["-P", "-t", "g", "-K:"], Some(&input));
    let member = || {
        let mut c = Command::new("kcat")
            .args([
                "-b",
                &boot,
                "-G",
                "kg",
                "g",
                "-u",
                // Not `-o beginning`: in group mode kcat applies it at every
                // assignment, so a member handed a partition in a rebalance would
                // re-read it from offset 0 and could commit a lower offset than its
                // predecessor's. The reset applies only where nothing is committed.
                "-X",
                "auto.offset.reset=earliest",
                "-f",
                "%p %o\n",
            ])
            .args(["-X", "auto.commit.interval.ms=100"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kcat -G");
        let out = collect(c.stdout.take().unwrap());
        let err = collect(c.stderr.take().unwrap());
        (c, out, err)
    };
    let (mut a, a_out, a_err) = member();
    let (mut b, b_out, b_err) = member();
    let deadline = std::time::Instant::now() + crate::util::serve::PATIENCE;
    let split = loop {
        let (ea, eb) = (a_err.lock().unwrap().clone(), b_err.lock().unwrap().clone());
        let seen = a_out.lock().unwrap().lines().count() + b_out.lock().unwrap().lines().count();
        if let (Some(x), Some(y)) = (last_assignment(&ea), last_assignment(&eb)) {
            if !x.is_empty() && !y.is_empty() && x.len() + y.len() == 4 && seen >= 400 {
                break (x, y);
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no split: {ea}\n{eb}\n{seen} records seen"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // Let the auto-commit run, then stop both members (kcat commits as it closes).
    std::thread::sleep(std::time::Duration::from_millis(500));
    for c in [&mut a, &mut b] {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(c),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        c.wait().unwrap();
    }
    let mut all: Vec<String> = a_out.lock().unwrap().lines().map(String::from).collect();
    all.extend(b_out.lock().unwrap().lines().map(String::from));
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 400, "{split:?}");
    // A new member resumes from the committed offsets: only records produced since.
    let more: String = (400..410).map(|i| format!("k{i}:v{i}\n")).collect();
    kcat(&boot, &["-P", "-t", "g", "-K:"], Some(&more));
    let out = kcat(&boot, &["-G", "kg", "g", "-e", "-q", "-f", "%s\n"], None);
    let mut got: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    got.sort();
    let mut want: Vec<String> = (400..410).map(|i| format!("v{i}")).collect();
    want.sort();
    assert_eq!(
        got,
        want,
        "split {split:?}\ncommitted: {}\nmember a: {}\nmember b: {}\nresumed: {}\nbroker: {}",
        s.ok(&["groups", "describe", "kg", "--json"]),
        a_err.lock().unwrap(),
        b_err.lock().unwrap(),
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
    s.stop();
}

/// A broker with TLS and API keys on both listeners, topics `orders` and `secret`,
/// an admin key, a producer key and a consumer key for `orders*`.
struct Secured {
    _dir: tempfile::TempDir,
    pki: crate::cli_tls::Pki,
    serve: Serve,
    boot: String,
    admin: String,
    producer: String,
    consumer: String,
}

fn secured() -> Secured {
    let dir = tempfile::tempdir().unwrap();
    // Topics made before any key exists, then the keys offline.
    let plain = Serve::start(dir.path());
    plain.ok(&["topics", "create", "orders", "--partitions", "1"]);
    plain.ok(&["topics", "create", "secret", "--partitions", "1"]);
    plain.stop();
    let create = |args: &[&str]| {
        let mut all = vec!["keys", "create", "--json", "--data-dir"];
        all.push(dir.path().to_str().unwrap());
        all.extend_from_slice(args);
        let (code, out, err) = crate::util::bin::run(&all, dir.path());
        assert_eq!(code, 0, "{err}");
        crate::util::bin::json(&out)["token"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let admin = create(&["--name", "ops", "--role", "admin"]);
    let producer = create(&["--name", "app", "--role", "producer", "--topic", "orders*"]);
    let consumer = create(&[
        "--name", "reader", "--role", "consumer", "--topic", "orders*", "--group", "*",
    ]);
    let pki = crate::cli_tls::pki();
    let serve = Serve::start_with(
        dir.path(),
        &[
            "--kafka-listen",
            "127.0.0.1:0",
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
        ],
    );
    let boot = serve.kafka_addr.clone().expect("kafka listening line");
    Secured {
        _dir: dir,
        pki,
        serve,
        boot,
        admin,
        producer,
        consumer,
    }
}

impl Secured {
    /// A native client command as the admin key, over TLS.
    fn admin(&self, args: &[&str]) -> String {
        let out = self
            .serve
            .cmd()
            .args(args)
            .args(["--tls", "--tls-ca", self.pki.ca.to_str().unwrap()])
            .env("SEGLOG_TOKEN", &self.admin)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// kcat over SASL_SSL with `token` as the PLAIN password.
    fn kcat(&self, token: &str, args: &[&str], input: Option<&str>) -> Output {
        let mut all = vec![
            "-X",
            "security.protocol=sasl_ssl",
            "-X",
            "sasl.mechanisms=PLAIN",
            "-X",
            "sasl.username=u",
        ];
        let password = format!("sasl.password={token}");
        let ca = format!("ssl.ca.location={}", self.pki.ca.display());
        all.extend_from_slice(&["-X", &password, "-X", &ca]);
        all.extend_from_slice(args);
        let mut child = Command::new("kcat")
            .args(["-b", &self.boot])
            .args(&all)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kcat");
        let mut stdin = child.stdin.take().unwrap();
        if let Some(text) = input {
            stdin.write_all(text.as_bytes()).unwrap();
        }
        drop(stdin);
        child.wait_with_output().unwrap()
    }

    /// Values of partition 0 of `topic`, read natively.
    fn values(&self, topic: &str) -> Vec<String> {
        self.admin(&["consume", topic, "--partition", "0", "--json"])
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["value"].as_str().unwrap().to_string()
            })
            .collect()
    }
}

#[test]
fn kcat_sasl_ssl_with_api_keys() {
    if !have_kcat() {
        return;
    }
    let b = secured();
    // The producer key produces to a topic it matches, the consumer key reads it.
    let o = b.kcat(
        &b.producer,
        &["-P", "-t", "orders"],
        Some("one\ntwo\nthree\n"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = b.kcat(
        &b.consumer,
        &["-C", "-t", "orders", "-o", "beginning", "-e", "-q"],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8(o.stdout).unwrap(), "one\ntwo\nthree\n");
    assert_eq!(b.values("orders"), ["one", "two", "three"]);
    // A producer key on a topic it does not match: refused, nothing written.
    let o = b.kcat(&b.producer, &["-P", "-t", "secret"], Some("leak\n"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("authorization failed"),
        "{err}"
    );
    assert!(b.values("secret").is_empty());
    // A consumer key does not produce.
    let o = b.kcat(&b.consumer, &["-P", "-t", "orders"], Some("four\n"));
    assert!(!o.status.success());
    assert_eq!(b.values("orders").len(), 3);
    // A wrong token fails the login.
    let wrong = format!("{}x", b.producer);
    let o = b.kcat(&wrong, &["-L", "-m", "3"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        b.serve.stderr().contains("kafka: failed login"),
        "{}",
        b.serve.stderr()
    );
    // Plaintext is closed without an answer.
    let mut tcp = std::net::TcpStream::connect(&b.boot).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    tcp.write_all(&[0, 0, 0, 8, 0, 18, 0, 0, 0, 0, 0, 1])
        .unwrap();
    let mut buf = [0u8; 16];
    let n = std::io::Read::read(&mut tcp, &mut buf).unwrap_or(0);
    assert_eq!(n, 0);
    b.serve.stop();
}

#[test]
fn confluent_produces_over_sasl_ssl() {
    if !have_python("confluent_kafka") {
        return;
    }
    let b = secured();
    let ca = b.pki.ca.to_str().unwrap().to_string();
    let r = python(
        "confluent_sasl",
        &[&b.boot, "orders", &b.producer, &ca, "20"],
    );
    assert_eq!(r["reports"], 20, "{r}");
    assert_eq!(r["errors"].as_array().unwrap().len(), 0, "{r}");
    let offsets: Vec<u64> = r["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets, (0..20).collect::<Vec<_>>());
    assert_eq!(b.values("orders").len(), 20);
    b.serve.stop();
}

/// A refusal is logged with the code the client was answered.
#[test]
fn confluent_refusals_log_the_code_answered() {
    if !have_python("confluent_kafka") {
        return;
    }
    let b = secured();
    let ca = b.pki.ca.to_str().unwrap().to_string();
    let r = python(
        "confluent_sasl_refusals",
        &[&b.boot, "orders", &b.producer, &b.consumer, &ca],
    );
    assert_eq!(r["group"], "GROUP_AUTHORIZATION_FAILED", "{r}");
    assert!(
        b.serve.stderr_gets("request=FindCoordinator code=30"),
        "{}",
        b.serve.stderr()
    );
    assert!(
        b.serve.stderr_gets("request=InitProducerId code=31"),
        "{r}: {}",
        b.serve.stderr()
    );
    let log = b.serve.stderr();
    assert!(!log.contains("request=FindCoordinator code=29"), "{log}");
    assert!(!log.contains("request=InitProducerId code=29"), "{log}");
    b.serve.stop();
}
