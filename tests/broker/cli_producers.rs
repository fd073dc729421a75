//! Idempotent producers against a real broker: a produce whose response is lost
//! (the connection cut after the broker wrote the batch) is retried by
//! `seglog produce` and written once; a sequence gap and a fenced epoch are refused
//! and write nothing.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use seglog::engine::net::client::Client;
use seglog::format::wire::{ApiKey, ErrorCode, PartitionBatch, WireRecord};

use crate::util::port::free_port;
use crate::util::serve::{Serve, PATIENCE};

/// A TCP proxy to `target` that drops the connection instead of relaying the
/// response to the first `cut` idempotent produce requests (the broker has written
/// and acknowledged them; the client never hears it).
fn proxy(target: String, cut: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let cuts = Arc::new(AtomicUsize::new(0));
    let done = Arc::clone(&cuts);
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { break };
            let mut server = TcpStream::connect(&target).unwrap();
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut s2);
                let _ = s2.shutdown(Shutdown::Write);
            });
            let done = Arc::clone(&done);
            thread::spawn(move || loop {
                let mut len = [0u8; 4];
                if server.read_exact(&mut len).is_err() {
                    let _ = client.shutdown(Shutdown::Both);
                    return;
                }
                let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
                if server.read_exact(&mut frame).is_err() {
                    return;
                }
                let api = u16::from_be_bytes([frame[4], frame[5]]);
                if api == ApiKey::IdempotentProduce as u16 && done.load(Ordering::SeqCst) < cut {
                    done.fetch_add(1, Ordering::SeqCst);
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                    return;
                }
                if client
                    .write_all(&len)
                    .and_then(|()| client.write_all(&frame))
                    .is_err()
                {
                    return;
                }
            });
        }
    });
    (addr, cuts)
}

#[test]
fn a_retry_after_a_lost_acknowledgement_writes_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(dir.path());
    server.ok(&["topics", "create", "t", "--partitions", "1"]);
    let (addr, cuts) = proxy(server.addr.clone(), 2);
    let input: String = (0..50).map(|i| format!("r{i}\n")).collect();
    let mut cmd = server.cmd();
    let out = cmd
        .env("SEGLOG_BROKER", &addr)
        .args([
            "produce",
            "t",
            "--batch",
            "10",
            "--retry-backoff",
            "10ms",
            "--json",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = out;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        cuts.load(Ordering::SeqCst),
        2,
        "the proxy cut two acknowledgements"
    );
    // Every record acknowledged once, at its own offset, and stored exactly once.
    let acks = String::from_utf8_lossy(&out.stdout).to_string();
    let offsets: Vec<u64> = acks
        .lines()
        .map(|l| crate::util::bin::json(l)["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, (0..50).collect::<Vec<u64>>());
    let stored = server.ok(&["consume", "t"]);
    assert_eq!(stored, input);
    server.stop();
}

#[test]
fn a_gap_and_a_fenced_epoch_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(dir.path());
    server.ok(&["topics", "create", "t", "--partitions", "1"]);
    let mut c = Client::connect(&server.addr, PATIENCE).unwrap();
    let (pid, epoch) = c.init_producer(None).unwrap();
    let batch = |v: &'static [u8]| PartitionBatch {
        partition: 0,
        records: vec![WireRecord {
            timestamp_ms: -1,
            key: None,
            value: v,
        }],
    };
    let acks = c
        .produce_idempotent("t", pid, epoch, vec![(0, batch(b"a"))])
        .unwrap();
    assert_eq!(acks[0].result, Ok((0, 0)));
    // The same batch again: its original offsets, nothing written.
    let acks = c
        .produce_idempotent("t", pid, epoch, vec![(0, batch(b"a"))])
        .unwrap();
    assert_eq!(acks[0].result, Ok((0, 0)));
    // A gap.
    let acks = c
        .produce_idempotent("t", pid, epoch, vec![(5, batch(b"gap"))])
        .unwrap();
    let (code, message) = acks[0].result.clone().unwrap_err();
    assert_eq!(code, ErrorCode::OUT_OF_ORDER_SEQUENCE);
    assert!(message.contains("expected 1"), "{message}");
    // A newer epoch fences the old one.
    let (same, newer) = c.init_producer(Some((pid, epoch))).unwrap();
    assert_eq!((same, newer), (pid, epoch + 1));
    let acks = c
        .produce_idempotent("t", pid, epoch, vec![(1, batch(b"old"))])
        .unwrap();
    assert_eq!(
        acks[0].result.clone().unwrap_err().0,
        ErrorCode::INVALID_PRODUCER_EPOCH
    );
    // An id never handed out.
    let acks = c
        .produce_idempotent("t", pid + 100, 0, vec![(0, batch(b"x"))])
        .unwrap();
    assert_eq!(
        acks[0].result.clone().unwrap_err().0,
        ErrorCode::UNKNOWN_PRODUCER
    );
    assert_eq!(
        c.list_offsets("t").unwrap()[0].end_offset,
        1,
        "nothing else was written"
    );
    // The new epoch starts at sequence 0.
    let acks = c
        .produce_idempotent("t", pid, newer, vec![(0, batch(b"b"))])
        .unwrap();
    assert_eq!(acks[0].result, Ok((1, 1)));
    drop(c);
    // After a restart the table is rebuilt: the last batch is still a duplicate.
    server.stop();
    let server = Serve::start(dir.path());
    let mut c = Client::connect(&server.addr, PATIENCE).unwrap();
    let acks = c
        .produce_idempotent("t", pid, newer, vec![(0, batch(b"b"))])
        .unwrap();
    assert_eq!(acks[0].result, Ok((1, 1)));
    assert_eq!(server.ok(&["consume", "t"]), "a\nb\n");
    // --no-idempotent sends plain requests.
    server.ok_with_stdin(&["produce", "t", "--no-idempotent"], "c\n");
    assert_eq!(server.ok(&["consume", "t"]), "a\nb\nc\n");
    thread::sleep(Duration::from_millis(1));
    server.stop();
}

fn serve_on(dir: &std::path::Path, addr: &str) -> Serve {
    let mut cmd = std::process::Command::new(crate::util::bin::BIN);
    cmd.args(["serve", "--listen", addr, "--data-dir"]).arg(dir);
    Serve::spawn(cmd)
}

#[test]
fn kill_9_during_idempotent_production_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let server = serve_on(dir.path(), &addr);
    server.ok(&["topics", "create", "t", "--partitions", "2"]);
    let mut child = server
        .cmd()
        .args([
            "produce",
            "t",
            "--batch",
            "5",
            "--retries",
            "1000",
            "--retry-backoff",
            "20ms",
            "--timeout",
            "5s",
            "--json",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let total = 3000;
    let writer = thread::spawn(move || {
        for i in 0..total {
            writeln!(stdin, "v{i}").unwrap();
            if i % 5 == 0 {
                thread::sleep(Duration::from_millis(3));
            }
        }
    });
    // Kill the broker twice while records stream, restarting it on the same address.
    let mut server = server;
    for _ in 0..2 {
        thread::sleep(Duration::from_millis(600));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the producer still runs"
        );
        server.kill9();
        thread::sleep(Duration::from_millis(200));
        server = serve_on(dir.path(), &addr);
    }
    writer.join().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let acks = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(acks, total, "every record acknowledged");
    let stored = server.ok(&["consume", "t"]);
    let mut counts = std::collections::BTreeMap::new();
    for v in stored.lines() {
        *counts.entry(v.to_string()).or_insert(0) += 1;
    }
    let missing: Vec<String> = (0..total)
        .map(|i| format!("v{i}"))
        .filter(|v| !counts.contains_key(v))
        .collect();
    assert!(missing.is_empty(), "acknowledged and lost: {missing:?}");
    let twice: Vec<(&String, &i32)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "written more than once: {twice:?}");
    assert_eq!(counts.len(), total);
    server.stop();
}

/// A batch only partly in its partition after a crash (its last record torn, cut by
/// recovery) is cut off the partition at the next start, and the broker's log says
/// so.
#[test]
fn a_batch_cut_off_at_startup_is_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let s = Serve::start(&data);
    s.ok(&["topics", "create", "t"]);
    let input: String = (0..30).map(|i| format!("record {i}\n")).collect();
    s.ok_with_stdin(&["produce", "t", "--batch", "10", "-q"], &input);
    s.stop();
    let log = data.join("topics/t/0/00000000000000000000.log");
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    // The last record's end: the data is followed by a zero tail, or not.
    let bytes = std::fs::read(&log).unwrap();
    let end = bytes.iter().rposition(|b| *b != 0).unwrap() as u64 + 1;
    f.set_len(end - 6).unwrap();
    drop(f);
    let out = std::process::Command::new(crate::util::bin::BIN)
        .args(["recover", "-q"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = Serve::start(&data);
    assert!(s.stderr_gets("is only partly in t/0"), "{}", s.stderr());
    // The batch's first records are gone: the partition ends where the log says.
    let err = s.stderr();
    let cut: usize = err
        .split("cut the partition back to offset ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(cut < 29, "{err}");
    let out = s.ok(&["consume", "t", "--from", "0", "--timeout", "1s"]);
    assert_eq!(out.lines().count(), cut, "{out}");
    s.stop();
}

/// A topic deleted and created again under the same name starts with none of the old
/// topic's batches: before, the next start took the new topic's records for the end of
/// an old batch only partly written, and cut acknowledged records off the partition.
#[test]
fn a_topic_created_again_keeps_its_records_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let s = Serve::start(&data);
    s.ok(&["topics", "create", "x"]);
    let old: String = (0..100).map(|i| format!("old {i}\n")).collect();
    s.ok_with_stdin(&["produce", "x", "--batch", "100", "-q"], &old);
    s.ok(&["topics", "delete", "x"]);
    s.ok(&["topics", "create", "x"]);
    let new: String = (0..50).map(|i| format!("new {i}\n")).collect();
    s.ok_with_stdin(&["produce", "x", "--batch", "1", "-q"], &new);
    s.stop();
    let s = Serve::start(&data);
    let out = s.ok(&["consume", "x", "--from", "0"]);
    assert_eq!(out, new, "{}", s.stderr());
    assert!(!s.stderr().contains("only partly"), "{}", s.stderr());
    s.stop();
}
