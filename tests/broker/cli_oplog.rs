//! The operator's side of `seglog serve`: the broker log (JSON lines read back for
//! each background action), SIGHUP, the file-descriptor limit (many partitions under
//! a low `ulimit -n`), and what `--data-dir` creates when serving fails.

use std::net::TcpListener;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use seglog::engine::net::client::Client;
use seglog::format::wire::{PartitionBatch, WireRecord};
use serde_json::Value;

use crate::util::bin::BIN;
use crate::util::serve::{Serve, PATIENCE};

/// The JSON log events on the broker's stderr so far.
fn events(s: &Serve) -> Vec<Value> {
    s.stderr()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// Waits for a log event with `message` (and `topic`); returns it.
fn wait_event(s: &Serve, message: &str, topic: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(e) = events(s)
            .into_iter()
            .find(|e| e["message"] == message && e["topic"] == topic)
        {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "no {message:?} event for {topic}: {}",
            s.stderr()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_json_log_has_a_line_for_each_background_action() {
    let data = tempfile::tempdir().unwrap();
    let cold = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        data.path(),
        &[
            "--log-format",
            "json",
            "--retention-check-interval",
            "50ms",
            "--compaction-check-interval",
            "50ms",
            "--cold-storage-dir",
            cold.path().to_str().unwrap(),
        ],
    );
    let started = events(&s);
    assert!(
        started
            .iter()
            .all(|e| e["timestamp"].is_string() && e["level"].is_string()),
        "{started:?}"
    );
    assert!(started
        .iter()
        .any(|e| e["message"] == "file descriptor limit (soft raised to hard)"));
    s.ok(&[
        "topics",
        "create",
        "del",
        "--config",
        "segment_bytes=1024",
        "--config",
        "retention_bytes=2048",
    ]);
    let lines: String = (0..300).map(|i| format!("line-{i:04}-padding\n")).collect();
    s.ok_with_stdin(&["produce", "del"], &lines);
    let roll = wait_event(&s, "rolled to a new segment", "del");
    assert_eq!(roll["partition"], 0);
    assert_eq!(roll["level"], "INFO");
    let copy = wait_event(&s, "copied a segment to cold storage", "del");
    assert_eq!(copy["base_offset"], 0);
    let removed = wait_event(&s, "retention removed segments", "del");
    assert!(removed["segments"].as_u64().unwrap() >= 1, "{removed}");
    assert!(removed["bytes"].as_u64().unwrap() > 0, "{removed}");

    s.ok(&[
        "topics",
        "create",
        "kv",
        "--config",
        "cleanup_policy=compact",
        "--config",
        "segment_bytes=1024",
    ]);
    let keyed: String = (0..200)
        .map(|i| format!("k{}=value-{i:04}\n", i % 5))
        .collect();
    s.ok_with_stdin(&["produce", "kv", "--key-separator", "="], &keyed);
    let compacted = wait_event(&s, "compaction swapped in new segments", "kv");
    assert!(
        compacted["records_dropped"].as_u64().unwrap() > 0,
        "{compacted}"
    );
    // Once each: one removal line per removal the broker counts.
    let d: Value = serde_json::from_str(&s.ok(&["topics", "describe", "del", "--json"])).unwrap();
    let deleted = d["partitions"][0]["cleanup"]["segments_deleted"]
        .as_u64()
        .unwrap();
    let logged: u64 = events(&s)
        .iter()
        .filter(|e| e["message"] == "retention removed segments" && e["topic"] == "del")
        .map(|e| e["segments"].as_u64().unwrap())
        .sum();
    assert!(
        logged <= deleted + 1 && logged + 1 >= deleted,
        "{logged} vs {deleted}"
    );
    s.stop();
}

#[test]
fn a_client_error_is_logged_and_sighup_keeps_the_broker_serving() {
    let data = tempfile::tempdir().unwrap();
    let mut s = Serve::start_with(data.path(), &["--log-format", "json"]);
    let out = s.run(&["consume", "nosuch", "--count", "1"]);
    assert!(!out.status.success());
    let deadline = Instant::now() + PATIENCE;
    while !events(&s).iter().any(|e| {
        e["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("client error"))
    }) {
        assert!(Instant::now() < deadline, "{}", s.stderr());
        thread::sleep(Duration::from_millis(50));
    }
    s.signal(rustix::process::Signal::HUP);
    let deadline = Instant::now() + PATIENCE;
    while !events(&s)
        .iter()
        .any(|e| e["message"] == "SIGHUP received: nothing to reopen, still serving")
    {
        assert!(Instant::now() < deadline, "{}", s.stderr());
        thread::sleep(Duration::from_millis(50));
    }
    assert!(s.running());
    s.ok(&["topics", "create", "t"]);
    s.ok_with_stdin(&["produce", "t"], "after-hup\n");
    assert_eq!(s.ok(&["consume", "t", "--count", "1"]), "after-hup\n");
    s.stop();
}

#[test]
fn the_bound_address_is_printed_with_quiet_too() {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["--quiet", "serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path());
    let s = Serve::spawn(cmd);
    s.ok(&["topics", "create", "q"]);
    s.stop();
}

#[test]
fn two_hundred_partitions_keep_serving_under_a_low_descriptor_limit() {
    const PARTITIONS: u64 = 200;
    const PER_PARTITION: u64 = 80;
    let data = tempfile::tempdir().unwrap();
    // Hard and soft limit 1024: each partition's active segment keeps 3 descriptors
    // (600), its ~4 sealed segments would need 800 more without the cache.
    let script = format!(
        "ulimit -n 1024 && exec {BIN} serve --listen 127.0.0.1:0 --log-format json \
         --data-dir {}",
        data.path().display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    let s = Serve::spawn(cmd);
    s.ok(&[
        "topics",
        "create",
        "wide",
        "--partitions",
        &PARTITIONS.to_string(),
        "--config",
        "segment_bytes=1024",
    ]);
    // Through one connection of the library client: hundreds of client processes
    // would fork this test process while other tests hold data-directory locks.
    let mut c = Client::connect(&s.addr, PATIENCE).unwrap();
    let value = |p: u64, i: u64| format!("p{p:03}-record-{i:04}-padding").into_bytes();
    for i in (0..PER_PARTITION).step_by(4) {
        let values: Vec<(u64, Vec<Vec<u8>>)> = (0..PARTITIONS)
            .map(|p| (p, (i..i + 4).map(|i| value(p, i)).collect()))
            .collect();
        let batches: Vec<PartitionBatch<'_>> = values
            .iter()
            .map(|(p, vs)| PartitionBatch {
                partition: *p as u32,
                records: vs
                    .iter()
                    .map(|v| WireRecord {
                        timestamp_ms: -1,
                        key: None,
                        value: v,
                    })
                    .collect(),
            })
            .collect();
        // One partition per request: a roll holds 2 more descriptors until its
        // fsync, so 200 rolls in one request would need 5 each at once.
        for batch in batches {
            let ack = c.produce("wide", vec![batch]).unwrap();
            assert!(ack[0].result.is_ok(), "{ack:?}");
        }
    }
    let sealed = walk_logs(data.path()) - PARTITIONS as usize;
    // Without the cache: 3 per active segment plus one per sealed one.
    let uncached = 3 * PARTITIONS as usize + sealed;
    assert!(
        uncached > 1024 + 256,
        "enough segments to exceed the limit: {sealed} sealed"
    );
    // Every partition still takes writes and serves its records from offset 0.
    for p in 0..PARTITIONS {
        let one = vec![PartitionBatch {
            partition: p as u32,
            records: vec![WireRecord {
                timestamp_ms: -1,
                key: None,
                value: b"one-more",
            }],
        }];
        assert!(c.produce("wide", one).unwrap()[0].result.is_ok());
        let mut got = Vec::new();
        while got.len() as u64 <= PER_PARTITION {
            let f = c
                .fetch("wide", p as u32, got.len() as u64, 1 << 20, PATIENCE)
                .unwrap();
            assert!(!f.records.is_empty(), "partition {p}");
            got.extend(f.records.into_iter().map(|r| r.value));
        }
        assert_eq!(got[0], value(p, 0), "partition {p}");
        assert_eq!(got[PER_PARTITION as usize - 1], value(p, PER_PARTITION - 1));
        assert_eq!(got.last().unwrap(), b"one-more");
    }
    // The command-line client too.
    let out = s.ok(&["consume", "wide", "--partition", "199", "--from", "0"]);
    assert_eq!(out.lines().count() as u64, PER_PARTITION + 1);
    let e = events(&s);
    assert!(
        !e.iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.contains("accepting connections failed"))),
        "{}",
        s.stderr()
    );
    s.stop();
}

/// `.log` files under `dir`.
fn walk_logs(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            n += walk_logs(&path);
        } else if path.extension().is_some_and(|e| e == "log") {
            n += 1;
        }
    }
    n
}

#[test]
fn a_missing_parent_of_the_data_dir_is_an_io_error_and_nothing_is_created() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("typo/x/y");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(74));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("typo/x"), "{err}");
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

#[test]
fn a_port_in_use_creates_no_data_directory() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["serve", "--listen", &addr, "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(74));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
    assert!(!dir.exists(), "nothing created");
}

/// `serve --cold-storage-dir DIR`, expected to refuse to start: its exit code and
/// stderr; a broker that starts instead is stopped and its code is `None`.
fn serve_with_cold(data: &std::path::Path, cold: &std::path::Path) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .arg("--cold-storage-dir")
        .arg(cold)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + PATIENCE;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    (code, reader.join().unwrap())
}

#[test]
fn a_bad_cold_storage_dir_is_refused_at_startup() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    // A missing parent: refused, nothing created (neither the cold path nor the data
    // directory).
    let typo = root.path().join("no/such/cold");
    let (code, err) = serve_with_cold(&data, &typo);
    assert_eq!(code, Some(74), "{err}");
    // One error line (the broker log before it is INFO lines).
    assert_eq!(
        err.lines().filter(|l| l.starts_with("seglog:")).count(),
        1,
        "{err}"
    );
    assert!(err.contains(&typo.display().to_string()), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(!root.path().join("no").exists());
    assert!(!data.exists());
    // A regular file.
    let file = root.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let (code, err) = serve_with_cold(&data, &file);
    assert_eq!(code, Some(74), "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(err.contains("not a directory"), "{err}");
    assert!(!data.exists());
}

#[test]
fn a_missing_cold_storage_dir_is_created_0700_at_startup() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let cold = root.path().join("cold");
    let s = Serve::start_with(
        &root.path().join("data"),
        &["--cold-storage-dir", cold.to_str().unwrap()],
    );
    let mode = std::fs::metadata(&cold).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    s.stop();
}

#[test]
fn a_second_broker_on_a_held_data_dir_and_the_same_address_exits_73() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let s = Serve::start(&data);
    let out = Command::new(BIN)
        .args(["serve", "--listen", &s.addr, "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(73), "{err}");
    assert!(err.contains("is locked by a running broker"), "{err}");
    assert!(err.contains("LOCK"), "{err}");
    s.stop();
}
