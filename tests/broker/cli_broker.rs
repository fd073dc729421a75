//! End-to-end tests of the broker commands: each test starts the real binary with
//! `seglog serve --listen 127.0.0.1:0` on a temporary directory, talks to it with
//! the client commands (or a raw socket), and stops it with SIGTERM, checking that
//! it exits 0.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use seglog::engine::net::client::partition_for_key;
use seglog::format::wire::{decode_response, encode_request, ErrorCode, Request};
use serde_json::Value;

use crate::util::bin::{json, json_lines, BIN};
use crate::util::serve::{Serve, PATIENCE};

/// (partition, offset) → value of every record in the topic.
fn read_all(b: &Serve, topic: &str) -> BTreeMap<(u64, u64), String> {
    json_lines(&b.ok(&["consume", topic, "--json"]))
        .into_iter()
        .map(|r| {
            assert_eq!(r["type"], "record");
            let key = (
                r["partition"].as_u64().unwrap(),
                r["offset"].as_u64().unwrap(),
            );
            (key, r["value"].as_str().unwrap().to_string())
        })
        .collect()
}

fn still_serving(b: &Serve) {
    let out = b.run(&["topics", "list"]);
    assert!(
        out.status.success(),
        "the broker stopped serving: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn round_trip_on_several_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    assert_eq!(
        b.ok(&["topics", "create", "events", "--partitions", "3"])
            .trim(),
        "created topic events with 3 partitions"
    );
    let input: String = (0..30).map(|i| format!("value-{i}\n")).collect();
    let acks =
        json_lines(&b.ok_with_stdin(&["produce", "events", "--json", "--batch", "7"], &input));
    assert_eq!(acks.len(), 30);
    let records = read_all(&b, "events");
    assert_eq!(records.len(), 30);
    for (i, ack) in acks.iter().enumerate() {
        assert_eq!(ack["type"], "ack");
        // Keyless records go round-robin from partition 0.
        assert_eq!(ack["partition"].as_u64(), Some(i as u64 % 3), "{ack}");
        let at = (
            ack["partition"].as_u64().unwrap(),
            ack["offset"].as_u64().unwrap(),
        );
        assert_eq!(records[&at], format!("value-{i}"));
    }
    // One partition, plain output, from an offset, with a count.
    let p1 = b.ok(&[
        "consume",
        "events",
        "--partition",
        "1",
        "--from",
        "2",
        "--count",
        "3",
    ]);
    assert_eq!(p1, "value-7\nvalue-10\nvalue-13\n");
    assert_eq!(b.ok(&["consume", "events", "--from", "latest"]), "");
    // --value with --partition.
    let ack = json(&b.ok(&[
        "produce",
        "events",
        "--partition",
        "2",
        "--value",
        "one",
        "--key",
        "k",
        "--json",
    ]));
    assert_eq!(
        (ack["partition"].as_u64(), ack["offset"].as_u64()),
        (Some(2), Some(10))
    );
    let last = json(&b.ok(&[
        "consume",
        "events",
        "--partition",
        "2",
        "--from",
        "10",
        "--json",
    ]));
    assert_eq!(
        (last["key"].as_str(), last["value"].as_str()),
        (Some("k"), Some("one"))
    );
    // Without --json, --value says on stderr what was acknowledged, as stdin does.
    let out = b.run(&["produce", "events", "--partition", "2", "--value", "two"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("seglog: 1 record acknowledged by"), "{err}");
    // A partition that does not exist.
    let out = b.run(&["produce", "events", "--partition", "3", "--value", "x"]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    b.stop();
}

#[test]
fn keys_go_to_a_stable_partition() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "users", "--partitions", "4"]);
    let input: String = (0..20)
        .map(|i| format!("user-{}:event-{i}\n", i % 5))
        .collect();
    let first = json_lines(&b.ok_with_stdin(
        &["produce", "users", "--key-separator", ":", "--json"],
        &input,
    ));
    let second = json_lines(&b.ok_with_stdin(
        &[
            "produce",
            "users",
            "--key-separator",
            ":",
            "--json",
            "--batch",
            "1",
        ],
        &input,
    ));
    assert_eq!(first.len(), 20);
    let mut seen: HashMap<String, u64> = HashMap::new();
    for (i, (a, b2)) in first.iter().zip(&second).enumerate() {
        let key = format!("user-{}", i % 5);
        let p = a["partition"].as_u64().unwrap();
        assert_eq!(
            b2["partition"].as_u64(),
            Some(p),
            "same key, same partition across runs"
        );
        assert_eq!(
            p,
            u64::from(partition_for_key(key.as_bytes(), 4)),
            "the documented hash"
        );
        assert_eq!(*seen.entry(key).or_insert(p), p);
    }
    // The records carry their keys.
    for r in json_lines(&b.ok(&["consume", "users", "--json"])) {
        let key = r["key"].as_str().unwrap();
        assert_eq!(
            r["partition"].as_u64(),
            Some(u64::from(partition_for_key(key.as_bytes(), 4)))
        );
    }
    // A line without the separator is refused after the earlier lines were sent.
    let mut child = b
        .cmd()
        .args(["produce", "users", "--key-separator", ":"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"a:1\nnoseparator\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    b.stop();
}

/// Reads one line from a child's stdout on a helper thread, failing after PATIENCE.
fn line_from(rx: &mpsc::Receiver<String>) -> String {
    rx.recv_timeout(PATIENCE).expect("a line from the follower")
}

fn lines_of(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[test]
fn follow_sees_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "live", "--partitions", "2"]);
    b.ok_with_stdin(&["produce", "live"], "a\nb\n");
    let mut follower = b
        .cmd()
        .args(["consume", "live", "--follow", "--count", "4"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(follower.stdout.take().unwrap());
    let mut got = vec![line_from(&rx), line_from(&rx)];
    got.sort();
    assert_eq!(got, ["a", "b"]);
    // The follower has caught up; these arrive only through its long-poll.
    b.ok_with_stdin(&["produce", "live"], "c\nd\n");
    let mut more = vec![line_from(&rx), line_from(&rx)];
    more.sort();
    assert_eq!(more, ["c", "d"]);
    let status = follower.wait().unwrap();
    assert!(status.success(), "--count 4 ends the follower: {status}");
    // Without --follow the consumer stops at the end.
    assert_eq!(b.ok(&["consume", "live", "--partition", "0"]), "a\nc\n");
    b.stop();
}

#[test]
fn topic_administration() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    let created = json(&b.ok(&[
        "topics",
        "create",
        "orders",
        "--partitions",
        "2",
        "--config",
        "retention_ms=-1",
        "--config",
        "cleanup_policy=compact",
        "--json",
    ]));
    assert_eq!(created["partitions"], 2);
    b.ok(&["topics", "create", "audit"]);
    assert_eq!(
        json(&b.ok(&["topics", "list", "--json"]))["topics"],
        serde_json::json!(["audit", "orders"])
    );
    assert_eq!(b.ok(&["topics", "list"]), "audit\norders\n");
    b.ok_with_stdin(&["produce", "orders", "--partition", "1"], "x\ny\nz\n");
    let d = json(&b.ok(&["topics", "describe", "orders", "--json"]));
    assert_eq!(d["topic"], "orders");
    let parts = d["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(
        (
            parts[1]["start_offset"].as_u64(),
            parts[1]["end_offset"].as_u64()
        ),
        (Some(0), Some(3))
    );
    assert_eq!(parts[0]["end_offset"].as_u64(), Some(0));
    assert!(parts[1]["segments"].as_u64().unwrap() >= 1);
    assert!(parts[1]["bytes"].as_u64().unwrap() > 0);
    assert_eq!(d["config"]["retention_ms"], -1);
    assert_eq!(d["config"]["cleanup_policy"], "compact");
    let text = b.ok(&["topics", "describe", "orders"]);
    assert!(
        text.contains("end_offset") && text.contains("segments") && text.contains("cleanup_policy"),
        "{text}"
    );
    let altered = json(&b.ok(&[
        "topics",
        "alter",
        "orders",
        "--config",
        "retention_ms=60000",
        "--json",
    ]));
    assert_eq!(altered["config"]["retention_ms"], 60000);
    assert_eq!(altered["config"]["cleanup_policy"], "compact");
    // Creating it again is refused (69), and names the topic.
    let out = b.run(&["topics", "create", "orders"]);
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("orders"));
    assert_eq!(
        json(&b.ok(&["topics", "delete", "audit", "--json"]))["deleted"],
        true
    );
    assert_eq!(b.ok(&["topics", "list"]), "orders\n");
    let out = b.run(&["topics", "describe", "audit"]);
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_topic"));
    // --config must be KEY=VALUE: a usage error before anything is sent.
    assert_eq!(
        b.run(&["topics", "alter", "orders", "--config", "retention_ms"])
            .status
            .code(),
        Some(64)
    );
    b.stop();
}

/// Sends raw bytes and returns everything the broker answers until it closes.
fn raw_exchange(addr: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .expect("the broker closes the connection");
    answer
}

fn handshake() -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(
        &mut out,
        1,
        &Request::Handshake {
            min_version: 1,
            max_version: 1,
            token: None,
        },
    )
    .unwrap();
    out
}

/// Splits a byte stream into response frames and decodes each (code, message).
fn responses(bytes: &[u8]) -> Vec<(u32, ErrorCode, String)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let r = decode_response(&bytes[at + 4..at + 4 + len]).unwrap();
        out.push((r.request_id, r.code, r.message.to_string()));
        at += 4 + len;
    }
    out
}

#[test]
fn bad_requests_get_clear_errors_and_the_broker_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "ok"]);

    // A malformed frame: a produce whose record count runs past the frame.
    let mut bytes = handshake();
    bytes.extend_from_slice(&[
        0, 0, 0, 15, 0, 0, 0, 2, 0, 1, 0, 2, b'o', b'k', 0, 0, 0, 1, 0,
    ]);
    let r = responses(&raw_exchange(&b.addr, &bytes));
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[0].1, ErrorCode::NONE);
    assert_eq!((r[1].0, r[1].1), (2, ErrorCode::MALFORMED), "{r:?}");
    assert!(r[1].2.contains("produce"), "{}", r[1].2);
    still_serving(&b);

    // An oversized frame: refused from its length alone.
    let r = responses(&raw_exchange(&b.addr, &[0xff, 0xff, 0xff, 0xff, 1, 2, 3]));
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, ErrorCode::FRAME_TOO_LARGE);
    assert!(r[0].2.contains("4294967295"), "{}", r[0].2);
    still_serving(&b);

    // No handshake first.
    let mut bytes = Vec::new();
    encode_request(&mut bytes, 9, &Request::ListTopics).unwrap();
    let r = responses(&raw_exchange(&b.addr, &bytes));
    assert_eq!((r[0].0, r[0].1), (9, ErrorCode::HANDSHAKE_REQUIRED));
    // An unknown api key.
    let mut bytes = handshake();
    bytes.extend_from_slice(&[0, 0, 0, 6, 0, 0, 0, 3, 0x12, 0x34]);
    let r = responses(&raw_exchange(&b.addr, &bytes));
    assert_eq!((r[1].0, r[1].1), (3, ErrorCode::UNKNOWN_API));
    // A peer that disappears mid-frame.
    drop(
        TcpStream::connect(&b.addr)
            .unwrap()
            .write_all(&[0, 0, 1, 0, 0]),
    );
    still_serving(&b);

    // A path-like topic name never reaches the file system; the broker refuses it
    // as an invalid argument (64), as the client does a name it checks itself.
    for name in ["../x", "a/b", ".."] {
        let out = b.run(&["topics", "create", name]);
        assert_eq!(out.status.code(), Some(64), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("invalid topic name") && err.contains(&b.addr),
            "{err}"
        );
        assert_eq!(
            b.run(&["produce", name, "--value", "v"]).status.code(),
            Some(64)
        );
    }
    assert!(!dir.path().join("x").exists() && !dir.path().join("topics").join("a").exists());
    still_serving(&b);

    // An unknown configuration key, and a value out of range.
    let out = b.run(&["topics", "create", "cfg", "--config", "retention_msec=5"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown config key \"retention_msec\""));
    let out = b.run(&["topics", "alter", "ok", "--config", "segment_bytes=1"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("segment_bytes"));
    assert_eq!(b.ok(&["topics", "list"]), "ok\n", "nothing was created");

    // A record over the topic's max_record_bytes.
    b.ok(&["topics", "alter", "ok", "--config", "max_record_bytes=64"]);
    let out = b.run(&["produce", "ok", "--value", &"x".repeat(100)]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("record_too_large"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Reading an offset past the end.
    let out = b.run(&["consume", "ok", "--from", "5"]);
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("offset_out_of_range"));
    b.ok(&["produce", "ok", "--value", "short"]);
    assert_eq!(b.ok(&["consume", "ok"]), "short\n");
    b.stop();
}

#[test]
fn acknowledged_records_survive_kill_9() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    // The moment of the kill: 0..1000 ms after the first acknowledgement.
    let kill_after = Duration::from_millis(seed % 1000);
    eprintln!("kill -9 test: seed {seed}, kill after {kill_after:?}");
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "durable", "--partitions", "2"]);
    let mut producer = b
        .cmd()
        .args([
            "produce",
            "durable",
            "--json",
            "--batch",
            "16",
            "--timeout",
            "5s",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = producer.stdin.take().unwrap();
    let writer = thread::spawn(move || {
        for i in 0u64.. {
            if writeln!(stdin, "record-{i}").is_err() {
                return;
            }
        }
    });
    let rx = lines_of(producer.stdout.take().unwrap());
    // Streaming has begun once the first ack is in; the kill comes some time later.
    let first = line_from(&rx);
    thread::sleep(kill_after);
    b.kill9();
    let status = producer.wait().unwrap();
    let mut stderr = String::new();
    producer
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(
        status.code(),
        Some(69),
        "the producer reports the lost broker: {stderr}"
    );
    writer.join().unwrap();
    let acks: Vec<Value> = std::iter::once(first)
        .chain(rx.iter())
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect();
    eprintln!(
        "kill -9 test: {} records acknowledged before the kill",
        acks.len()
    );

    let b = Serve::start(dir.path());
    let records = read_all(&b, "durable");
    for ack in &acks {
        let at = (
            ack["partition"].as_u64().unwrap(),
            ack["offset"].as_u64().unwrap(),
        );
        let seq = ack["seq"].as_u64().unwrap();
        assert_eq!(
            records.get(&at).map(String::as_str),
            Some(format!("record-{seq}").as_str()),
            "seed {seed}: {ack}"
        );
    }
    // Offsets stay dense after recovery: appending continues after the survivors.
    let ack = json(&b.ok(&[
        "produce",
        "durable",
        "--partition",
        "0",
        "--value",
        "after",
        "--json",
    ]));
    let end0 = records.keys().filter(|(p, _)| *p == 0).count() as u64;
    assert_eq!(ack["offset"].as_u64(), Some(end0), "seed {seed}");
    b.stop();
}

#[test]
fn unreachable_broker_exits_69() {
    // A port that was free a moment ago and has no listener now.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    for args in [
        vec!["topics", "list"],
        vec!["produce", "t", "--value", "v"],
        vec!["consume", "t"],
        vec!["bench", "produce", "--records", "1"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .env("SEGLOG_BROKER", &addr)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(69), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&addr), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    // --broker wins over the environment.
    let out = Command::new(BIN)
        .args(["topics", "list", "--broker", &addr])
        .env("SEGLOG_BROKER", "127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&addr));
}

#[test]
fn a_broker_value_that_is_no_address_is_a_usage_error() {
    // No connection is tried: 64 names the value, where 69 would blame a broker.
    for bad in ["not an address", "host", "host:0", "h:99999", ""] {
        for args in [
            vec!["topics", "list", "--broker", bad],
            vec!["bench", "produce", "--records", "1", "--broker", bad],
        ] {
            let out = Command::new(BIN).args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        }
        // An empty SEGLOG_BROKER counts as unset (the default address).
        if bad.is_empty() {
            continue;
        }
        let out = Command::new(BIN)
            .args(["consume", "t"])
            .env("SEGLOG_BROKER", bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "SEGLOG_BROKER={bad:?}");
    }
}

#[test]
fn a_second_broker_on_the_same_directory_exits_73() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(73),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    still_serving(&b);
    b.stop();
    // Released on shutdown: a new broker starts and sees the data.
    let b = Serve::start(dir.path());
    b.stop();
}

#[test]
fn embedded_bench_reports_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "bench",
            "produce",
            "--records",
            "200",
            "--batch",
            "10",
            "--connections",
            "2",
            "--partitions",
            "2",
            "--zero-rate",
            "1073741824",
            "--new-spares",
            "1",
            "--json",
            "--embedded",
        ])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(r["records"], 200);
    assert_eq!(r["requests"], 20);
    for field in [
        "records_per_sec",
        "mb_per_sec",
        "requests_per_sec",
        "p50_ms",
        "p99_ms",
        "max_ms",
    ] {
        assert!(r[field].as_f64().is_some_and(|v| v > 0.0), "{field}: {r}");
    }
    assert!(r["fsyncs"].as_u64().is_some_and(|f| f >= 1), "{r}");
    let out = Command::new(BIN)
        .args([
            "bench",
            "consume",
            "--records",
            "200",
            "--batch",
            "50",
            "--partitions",
            "2",
            "--json",
            "--embedded",
        ])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(r["records"], 200);
}

/// A bench that pipelines its produce requests (`--in-flight`) against a running
/// broker: every record is written once, at the end of the log, with fewer group
/// commits than requests; `--in-flight` is refused for consume.
#[test]
fn bench_with_requests_in_flight_writes_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    let out = b.ok(&[
        "bench",
        "produce",
        "--records",
        "2000",
        "--batch",
        "10",
        "--connections",
        "2",
        "--in-flight",
        "8",
        "--json",
    ]);
    let r = json(&out);
    assert_eq!(
        (r["records"].as_u64(), r["requests"].as_u64()),
        (Some(2000), Some(200))
    );
    assert_eq!(r["in_flight"], 8);
    let fsyncs = r["fsyncs"].as_u64().unwrap();
    assert!(
        (1..200).contains(&fsyncs),
        "{fsyncs} fsyncs for 200 requests"
    );
    let d = json(&b.ok(&["topics", "describe", "bench", "--json"]));
    let p = &d["partitions"][0];
    assert_eq!(
        (p["end_offset"].as_u64(), p["records"].as_u64()),
        (Some(2000), Some(2000)),
        "{d}"
    );
    let out = Command::new(BIN)
        .args(["bench", "consume", "--in-flight", "2", "--broker", &b.addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--in-flight"));
    // The embedded broker's write-path settings are refused against a running one.
    for flag in [
        ["--zero-rate", "1073741824"],
        ["--zero-ahead", "off"],
        ["--new-spares", "0"],
        ["--retention-check-interval", "1s"],
    ] {
        let out = Command::new(BIN)
            .args(["bench", "produce", "--broker", &b.addr])
            .args(flag)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flag:?}: {err}");
        assert!(err.contains(flag[0]), "{flag:?}: {err}");
    }
}

/// `--warmup` produces first and measures after it, and `--retention-bytes` makes the
/// topic's retention return segments to the spare pool for later rolls to take: the
/// steady state of a broker that has run for a while.
#[test]
fn a_warmed_up_bench_with_retention_reuses_spares() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start_with(dir.path(), &["--retention-check-interval", "100ms"]);
    let out = b.ok(&[
        "bench",
        "produce",
        "--warmup",
        "1s",
        "--duration",
        "1s",
        "--batch",
        "10",
        "--connections",
        "2",
        "--segment-bytes",
        "65536",
        "--retention-bytes",
        "262144",
        "--json",
    ]);
    let r = json(&out);
    assert_eq!(
        (r["warmup_s"].as_f64(), r["retention_bytes"].as_u64()),
        (Some(1.0), Some(262_144)),
        "{r}"
    );
    // Retention returned segments and rolls took them while the run was measured.
    for field in ["spares_returned", "spares_taken"] {
        assert!(r[field].as_u64().is_some_and(|n| n > 0), "{field}: {r}");
    }
    // The warm-up's records are in the log but not in the report.
    let d = json(&b.ok(&["topics", "describe", "bench", "--json"]));
    let end = d["partitions"][0]["end_offset"].as_u64().unwrap();
    let measured = r["records"].as_u64().unwrap();
    assert!(
        measured > 0 && end > measured,
        "measured {measured}, end {end}"
    );
    assert_eq!(d["config"]["retention_bytes"], 262_144, "{d}");
    let out = Command::new(BIN)
        .args(["bench", "consume", "--warmup", "1s", "--broker", &b.addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--warmup"));
    b.stop();
}

/// Against a running broker (protocol version 3) the bench reports the write path's
/// counters too: they come in the stats response.
#[test]
fn bench_against_a_broker_reports_the_write_path() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    let out = b.ok(&[
        "bench",
        "produce",
        "--records",
        "400",
        "--batch",
        "10",
        "--segment-bytes",
        "4096",
        "--json",
    ]);
    let r = json(&out);
    assert_eq!(r["records"], 400, "{r}");
    // 400 records of 100 bytes and more in segments of 4 KiB: several rolls.
    assert!(r["rolls"].as_u64().is_some_and(|n| n >= 5), "{r}");
    for field in ["fsync_p50_ms", "fsync_p99_ms", "roll_stall_max_ms"] {
        assert!(r[field].as_f64().is_some_and(|v| v > 0.0), "{field}: {r}");
    }
    assert!(r["zeroed_bytes"].as_u64().is_some(), "{r}");
    b.stop();
}

/// Exit codes follow the kind of mistake, not which side notices it: every invalid
/// argument is 64 (one line on stderr), a missing topic or a broker failure 69.
#[test]
fn invalid_arguments_exit_64_whichever_side_finds_them() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "ok"]);
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let long = "n".repeat(250);
    let cases: [(&[&str], &str); 7] = [
        (&["topics", "create", "../evil"], "invalid topic name"),
        (&["topics", "create", &long], "topic of 250 bytes"),
        (
            &["topics", "create", "p0", "--partitions", "0"],
            "partitions",
        ),
        (
            &["topics", "create", "k", "--config", "nope=1"],
            "unknown config key",
        ),
        (
            &["topics", "create", "r", "--config", "retention_ms=abc"],
            "is not a number",
        ),
        (
            &["topics", "alter", "ok", "--config", "max_record_bytes=0"],
            "out of range",
        ),
        (
            &["produce", "ok", "--partition", "9", "--value", "v"],
            "partition 9",
        ),
    ];
    for (args, want) in cases {
        let out = b.run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    // retention_ms=abc is not a number, not a value out of range.
    let err = stderr(&b.run(&["topics", "create", "r", "--config", "retention_ms=abc"]));
    assert!(!err.contains("out of range"), "{err}");
    // A value over the topic's max_record_bytes is 64 like one over 16 MiB.
    b.ok(&["topics", "alter", "ok", "--config", "max_record_bytes=64"]);
    for size in [100, 17 << 20] {
        let line = format!("{}\n", "x".repeat(size));
        let out = b.run_with_stdin(&["produce", "ok"], Some(&line));
        assert_eq!(out.status.code(), Some(64), "{size}: {}", stderr(&out));
    }
    // Not invalid arguments: no such topic, topic exists (69).
    for args in [
        &["topics", "describe", "missing"][..],
        &["topics", "create", "ok"],
    ] {
        let out = b.run(args);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(b.ok(&["topics", "list"]), "ok\n", "nothing was created");

    // A part-way failure says how many records were acknowledged before it.
    let mut input = String::from("a\nb\nc\n");
    input.push_str(&"x".repeat(100));
    input.push('\n');
    let out = b.run_with_stdin(&["produce", "ok", "--batch", "1"], Some(&input));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("record_too_large"), "{err}");
    assert!(
        err.contains("3 records were acknowledged before it"),
        "{err}"
    );
    b.stop();
}

/// A listen address that is no HOST:PORT is a usage error (64), told apart from one
/// that cannot be bound (74); nothing is created.
#[test]
fn a_listen_value_that_is_no_address_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for flag in ["--listen", "--kafka-listen", "--metrics-listen"] {
        for bad in ["bogus", "", "127.0.0.1:99999", "x:y"] {
            let out = Command::new(BIN)
                .args(["serve", "--data-dir"])
                .arg(&data)
                .args([flag, bad])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{flag} {bad:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains(flag), "{err}");
        }
    }
    assert!(!data.exists());
}

/// A zero `serve` interval is a usage error (64) in one line with a --help hint, and
/// nothing is created.
#[test]
fn zero_serve_intervals_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for flag in [
        "--flush-interval",
        "--retention-check-interval",
        "--compaction-check-interval",
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .args([flag, "0s"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flag}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(flag) && err.contains("longer than zero"),
            "{err}"
        );
        assert!(err.ends_with("(see 'seglog serve --help')\n"), "{err}");
        assert!(!err.contains("cannot open the data directory"), "{err}");
    }
    assert!(!data.exists());
}

/// `cluster status` against a broker started without `--peers` is not a mistake of
/// the user's: it answers a one-node view marked standalone, in text and JSON, exit 0.
#[test]
fn cluster_status_of_a_standalone_broker_shows_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let out = s.run(&["cluster", "status"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        "standalone broker (started without --peers): node 0 only, no replicated partitions"
    );
    // The node as a bordered table, like the other commands' tables.
    let cells = |l: &str| -> Vec<String> { l.split('|').map(|c| c.trim().to_string()).collect() };
    let row = stdout
        .lines()
        .find(|l| l.contains(&s.addr))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(
        cells(row),
        ["", "0", "-", s.addr.as_str(), "true", ""],
        "{stdout}"
    );
    // No partitions table under the nodes.
    assert!(
        !stdout
            .lines()
            .any(|l| l.trim_start().starts_with("partition")),
        "{stdout}"
    );
    let v = json(&s.ok(&["cluster", "status", "--json"]));
    assert_eq!(v["standalone"], true, "{v}");
    assert_eq!(v["node_id"], 0, "{v}");
    assert!(v["cluster_id"].is_null(), "{v}");
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{v}");
    assert_eq!(nodes[0]["id"], 0, "{v}");
    assert_eq!(nodes[0]["client_addr"], s.addr.as_str(), "{v}");
    assert_eq!(nodes[0]["alive"], true, "{v}");
    assert_eq!(v["partitions"], serde_json::json!([]), "{v}");
    s.stop();
}

/// `verify` beside a running broker: bytes past the active segment's data that do
/// not read as a record (a record being written, a reused file's old bytes) are
/// information while the broker holds `LOCK`; the same bytes with no broker are a
/// torn tail to repair (exit 1).
#[test]
fn verify_beside_a_running_broker_takes_the_active_tail_for_information() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let log = data.join("topics/t/0/00000000000000000000.log");
    let garble = || {
        let bytes = std::fs::read(&log).unwrap();
        let end = bytes.iter().rposition(|b| *b != 0).unwrap() as u64 + 1;
        let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0x7f; 20], end).unwrap();
    };
    let verify = || {
        let out = Command::new(BIN)
            .args(["verify", "--json"])
            .arg(&data)
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };
    let s = Serve::start(&data);
    s.ok(&["topics", "create", "t"]);
    s.ok(&["produce", "t", "--value", "a"]);
    garble();
    let (code, v) = verify();
    assert_eq!(code, Some(0), "{v:#}");
    assert!(v.to_string().contains("LOCK is held"), "{v:#}");
    s.stop();
    garble();
    let (code, v) = verify();
    assert_eq!(code, Some(1), "{v:#}");
    assert!(!v.to_string().contains("LOCK is held"), "{v:#}");
}

/// What the start does to the spare pool goes to the broker's log: the files it
/// removes as no spares, and the whole pool when it is off.
#[test]
fn the_start_logs_what_it_does_to_the_spare_pool() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let b = Serve::start(&data);
    b.stop();
    let spares = data.join("spares");
    std::fs::create_dir_all(&spares).unwrap();
    // Not a header: no spare.
    std::fs::write(spares.join("spare-00000000000000000001.log"), b"junk").unwrap();
    let b = Serve::start(&data);
    assert!(
        b.stderr_gets("removed 1 file(s) that cannot be spares"),
        "{}",
        b.stderr()
    );
    b.stop();
    std::fs::write(spares.join("spare-00000000000000000002.log"), b"junk").unwrap();
    let b = Serve::start_with(&data, &["--spares-per-partition", "0"]);
    assert!(
        b.stderr_gets(
            "the spare pool is off (--spares-per-partition 0): removed it and its 1 file(s)"
        ),
        "{}",
        b.stderr()
    );
    assert!(!spares.exists());
    b.stop();
}

/// A topic's creation, configuration change and deletion each leave a line in the
/// broker's log, whoever asked.
#[test]
fn topic_changes_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "audited", "--partitions", "2"]);
    b.ok(&[
        "topics",
        "alter",
        "audited",
        "--config",
        "retention_ms=60000",
    ]);
    b.ok(&["topics", "delete", "audited"]);
    for needle in [
        "topic created topic=\"audited\" partitions=2",
        "topic configuration changed topic=\"audited\" changed=retention_ms=60000",
        "topic deleted topic=\"audited\"",
    ] {
        assert!(b.stderr_gets(needle), "{needle}: {}", b.stderr());
    }
    b.stop();
}
