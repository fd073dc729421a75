//! The limits of `seglog serve` (README, "Limits"), each at its edge (accepted) and
//! just past it (refused with a clear error) while the broker keeps serving others:
//! frame bytes, records per request, topics, partitions per topic, key and value
//! bytes, connections per source address; the idle timeout; in-flight bytes
//! (pipelined requests are answered, not buffered without bound); 200 connections
//! stalled mid-frame next to a normal producer; a client that never reads its
//! responses is dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use seglog::engine::net::client::{read_frame, Client};
use seglog::format::wire::producers::ProducerRequest;
use seglog::format::wire::{
    decode_response, encode_request, ErrorCode, PartitionBatch, Request, ResponseBody, WireRecord,
};

use crate::util::serve::{Serve, PATIENCE};

/// Encodes `req` as a whole frame.
fn frame(id: u32, req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, id, req).unwrap();
    out
}

fn handshake_frame() -> Vec<u8> {
    frame(
        1,
        &Request::Handshake {
            min_version: 1,
            max_version: 3,
            token: None,
        },
    )
}

/// A raw connection after its handshake; returns the frame limit the broker announced.
fn raw(stream: &mut TcpStream) -> u32 {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.set_write_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(&handshake_frame()).unwrap();
    let mut buf = Vec::new();
    read_frame(stream, &mut buf).map_err(|_| "read").unwrap();
    match decode_response(&buf).unwrap().body {
        Some(ResponseBody::Handshake {
            frame_bytes_max, ..
        }) => frame_bytes_max,
        other => panic!("{other:?}"),
    }
}

/// Reads one response; returns its code and message.
fn answer(stream: &mut TcpStream) -> (ErrorCode, String) {
    let mut buf = Vec::new();
    read_frame(stream, &mut buf).map_err(|_| "read").unwrap();
    let r = decode_response(&buf).unwrap();
    (r.code, r.message.to_string())
}

fn produce_frame(id: u32, topic: &str, value: &[u8]) -> Vec<u8> {
    frame(
        id,
        &Request::Produce {
            topic,
            partitions: vec![PartitionBatch {
                partition: 0,
                records: vec![WireRecord {
                    timestamp_ms: -1,
                    key: None,
                    value,
                }],
            }],
        },
    )
}

/// A produce request whose frame (after `frame_len`) is exactly `len` bytes.
fn produce_of_len(topic: &str, len: usize) -> Vec<u8> {
    let base = produce_frame(2, topic, b"").len() - 4;
    produce_frame(2, topic, &vec![b'v'; len - base])
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn frame_bytes_at_the_edge_and_past_it() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(data.path(), &["--max-frame-bytes", "1000"]);
    b.ok(&["topics", "create", "t"]);
    let mut s = TcpStream::connect(&b.addr).unwrap();
    assert_eq!(raw(&mut s), 1000, "the handshake announces the limit");
    let at = produce_of_len("t", 1000);
    assert_eq!(at.len(), 1004);
    s.write_all(&at).unwrap();
    assert_eq!(answer(&mut s).0, ErrorCode::NONE);
    let past = produce_of_len("t", 1001);
    s.write_all(&past).unwrap();
    let (code, message) = answer(&mut s);
    assert_eq!(code, ErrorCode::FRAME_TOO_LARGE, "{message}");
    assert!(message.contains("frame_bytes_max"), "{message}");
    // That connection is closed; the broker serves the others.
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).unwrap_or(0), 0);
    let value_len = at.len() - produce_frame(2, "t", b"").len();
    assert_eq!(b.ok(&["consume", "t"]).len(), value_len + 1);
    b.stop();
}

/// A produce of `n` one-byte records over two partitions: plain, or idempotent.
fn produce_n(id: u32, n: usize, idempotent: bool) -> Vec<u8> {
    let rec = WireRecord {
        timestamp_ms: -1,
        key: None,
        value: b"r",
    };
    let half = n / 2;
    let batches = vec![
        PartitionBatch {
            partition: 0,
            records: vec![rec; half],
        },
        PartitionBatch {
            partition: 1,
            records: vec![rec; n - half],
        },
    ];
    if idempotent {
        let partitions = batches.into_iter().map(|b| (0, b)).collect();
        frame(
            id,
            &Request::Producer(ProducerRequest::Produce {
                topic: "t",
                producer_id: 1,
                epoch: 0,
                partitions,
            }),
        )
    } else {
        frame(
            id,
            &Request::Produce {
                topic: "t",
                partitions: batches,
            },
        )
    }
}

#[test]
fn records_per_request_at_the_edge_and_past_it() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(data.path(), &["--max-records-per-request", "5"]);
    b.ok(&["topics", "create", "t", "--partitions", "2"]);
    let mut s = TcpStream::connect(&b.addr).unwrap();
    raw(&mut s);
    s.write_all(&produce_n(2, 5, false)).unwrap();
    assert_eq!(answer(&mut s).0, ErrorCode::NONE);
    for idempotent in [false, true] {
        s.write_all(&produce_n(3, 6, idempotent)).unwrap();
        let (code, message) = answer(&mut s);
        assert_eq!(code, ErrorCode::LIMIT_EXCEEDED, "{message}");
        assert!(message.contains("records_per_request_max"), "{message}");
    }
    // The connection stays open; nothing of the refused requests was written.
    s.write_all(&frame(4, &Request::ListTopics)).unwrap();
    assert_eq!(answer(&mut s).0, ErrorCode::NONE);
    assert_eq!(b.ok(&["consume", "t"]).lines().count(), 5);
    b.stop();
}

#[test]
fn topics_and_partitions_at_the_edge_and_past_it() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(
        data.path(),
        &["--max-topics", "2", "--max-partitions-per-topic", "4"],
    );
    b.ok(&["topics", "create", "a", "--partitions", "4"]);
    let out = b.run(&["topics", "create", "b", "--partitions", "5"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        stderr_of(&out).contains("partitions_per_topic_max"),
        "{}",
        stderr_of(&out)
    );
    b.ok(&["topics", "create", "b"]);
    let out = b.run(&["topics", "create", "c"]);
    assert_eq!(out.status.code(), Some(64));
    let err = stderr_of(&out);
    assert!(
        err.contains("at most 2 topics") && err.contains("topics_max"),
        "{err}"
    );
    assert_eq!(b.ok(&["topics", "list"]), "a\nb\n");
    b.ok(&["topics", "delete", "b"]);
    b.ok(&["topics", "create", "c"]);
    b.stop();
}

#[test]
fn key_and_value_bytes_at_the_edge_and_past_it() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(
        data.path(),
        &["--max-key-bytes", "8", "--max-value-bytes", "16"],
    );
    b.ok(&["topics", "create", "t"]);
    b.ok(&[
        "produce",
        "t",
        "--key",
        "12345678",
        "--value",
        "0123456789abcdef",
    ]);
    let out = b.run(&["produce", "t", "--key", "123456789", "--value", "v"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        stderr_of(&out).contains("key_bytes_max"),
        "{}",
        stderr_of(&out)
    );
    let out = b.run(&["produce", "t", "--value", "0123456789abcdefg"]);
    assert_eq!(out.status.code(), Some(64));
    let err = stderr_of(&out);
    assert!(
        err.contains("value_bytes_max") && err.contains("record_too_large"),
        "{err}"
    );
    assert_eq!(b.ok(&["consume", "t"]), "0123456789abcdef\n");
    b.stop();
}

/// A connection to `addr` from the source address `src` (another 127.0.0.x).
fn connect_from(src: &str, addr: &str) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(format!("{src}:0").parse().unwrap()).unwrap();
        sock.connect(addr.parse().unwrap()).await.unwrap()
    });
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// `seglog_connections_refused_total` from the broker's metrics endpoint.
fn refused_connections(b: &Serve) -> u64 {
    let err = b.stderr();
    let addr = err
        .lines()
        .find_map(|l| l.strip_prefix("seglog: metrics listening on "))
        .unwrap_or_else(|| panic!("no metrics line in:\n{err}"))
        .trim()
        .to_string();
    let mut c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("seglog_connections_refused_total "))
        .unwrap_or_else(|| panic!("no refused count in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn connections_per_address_at_the_edge_and_past_it() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(
        data.path(),
        &[
            "--max-connections-per-address",
            "2",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let timeout = Duration::from_secs(30);
    let first = Client::connect(&b.addr, timeout).unwrap();
    let mut second = Client::connect(&b.addr, timeout).unwrap();
    let e = Client::connect(&b.addr, timeout).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::TOO_MANY_CONNECTIONS), "{e}");
    assert!(e.to_string().contains("from one address"), "{e}");
    // Another source address is served meanwhile, and so are the two admitted.
    let mut other = connect_from("127.0.0.2", &b.addr);
    raw(&mut other);
    other.write_all(&frame(2, &Request::ListTopics)).unwrap();
    assert_eq!(answer(&mut other).0, ErrorCode::NONE);
    assert!(second.list_topics().unwrap().is_empty());
    // A freed slot is taken again.
    drop(first);
    let mut again = None;
    for _ in 0..600 {
        match Client::connect(&b.addr, timeout) {
            Ok(c) => {
                again = Some(c);
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::TOO_MANY_CONNECTIONS), "{e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    assert!(again.unwrap().list_topics().unwrap().is_empty());
    // Each refusal is counted (one above, and any of the retries).
    let refused = refused_connections(&b);
    assert!(refused >= 1, "{refused}");
    b.stop();
}

#[test]
fn an_idle_connection_is_closed_and_others_are_served() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(data.path(), &["--idle-timeout", "1s"]);
    let mut idle = TcpStream::connect(&b.addr).unwrap();
    raw(&mut idle);
    // The broker closes it: the read ends (EOF) instead of waiting out PATIENCE.
    let mut rest = Vec::new();
    let n = idle.read_to_end(&mut rest).unwrap();
    assert_eq!(n, 0);
    assert!(b.stderr_gets("idle_timeout"), "{}", b.stderr());
    b.ok(&["topics", "create", "t"]);
    b.stop();
}

#[test]
fn pipelined_requests_past_the_inflight_limit_are_all_answered() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(
        data.path(),
        &["--max-frame-bytes", "4096", "--max-inflight-bytes", "4096"],
    );
    b.ok(&["topics", "create", "t"]);
    let mut s = TcpStream::connect(&b.addr).unwrap();
    raw(&mut s);
    // 300 requests of 1 KiB sent at once, far more than the 4 KiB the broker holds:
    // it reads as it answers (TCP holds the rest), and answers every one in order.
    const N: u32 = 300;
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..N {
            w.write_all(&produce_frame(10 + i, "t", &[b'x'; 1024]))
                .unwrap();
        }
    });
    for i in 0..N {
        let mut buf = Vec::new();
        read_frame(&mut s, &mut buf).map_err(|_| "read").unwrap();
        let r = decode_response(&buf).unwrap();
        assert_eq!((r.request_id, r.code), (10 + i, ErrorCode::NONE));
    }
    writer.join().unwrap();
    // A value over the in-flight limit cannot be sent at all (it is over the frame
    // limit too): refused, and the broker goes on.
    let out = b.run(&["produce", "t", "--value", &"y".repeat(5000)]);
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(b.ok(&["consume", "t"]).lines().count(), N as usize);
    // Past the frame limit, the in-flight limit is refused at start.
    let out = std::process::Command::new(crate::util::bin::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("other"))
        .args(["--max-frame-bytes", "4096", "--max-inflight-bytes", "4095"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        stderr_of(&out).contains("--max-inflight-bytes"),
        "{}",
        stderr_of(&out)
    );
    b.stop();
}

#[test]
fn stalled_half_frames_do_not_stop_a_normal_producer() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start(data.path());
    b.ok(&["topics", "create", "t"]);
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(&b.addr).unwrap();
        raw(&mut s);
        // Half a produce frame, then nothing.
        let f = produce_frame(2, "t", &[b'z'; 200]);
        s.write_all(&f[..f.len() / 2]).unwrap();
        stalled.push(s);
    }
    let input: String = (0..100).map(|i| format!("r{i}\n")).collect();
    b.ok_with_stdin(&["produce", "t", "--batch", "10"], &input);
    assert_eq!(b.ok(&["consume", "t"]), input);
    drop(stalled);
    b.stop();
}

#[test]
fn a_client_that_never_reads_is_dropped_and_others_are_served() {
    let data = tempfile::tempdir().unwrap();
    let b = Serve::start_with(data.path(), &["--io-timeout", "1s"]);
    b.ok(&["topics", "create", "big"]);
    // 4 MiB of records to fetch.
    let value = "v".repeat(64 << 10);
    let input: String = (0..64).map(|_| format!("{value}\n")).collect();
    b.ok_with_stdin(&["produce", "big", "--batch", "8"], &input);
    let mut s = TcpStream::connect(&b.addr).unwrap();
    raw(&mut s);
    let fetch = frame(
        3,
        &Request::Fetch {
            topic: "big",
            partition: 0,
            offset: 0,
            max_bytes: 4 << 20,
            max_wait_ms: 0,
        },
    );
    // Ask for the 4 MiB again and again and never read: the broker's writes stall,
    // it drops the connection after --io-timeout, and our writes then fail.
    let writer = std::thread::spawn(move || loop {
        if let Err(e) = s.write_all(&fetch) {
            return e;
        }
    });
    // Meanwhile (and after) another client is served.
    b.ok_with_stdin(&["produce", "big"], "small\n");
    // A write blocked for PATIENCE would end in a timeout: the broker kept it.
    let e = writer.join().unwrap();
    assert!(
        !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "the broker never dropped the connection: {e}"
    );
    assert!(b.stderr_gets("writing a response failed"), "{}", b.stderr());
    assert_eq!(b.ok(&["consume", "big", "--from", "64"]), "small\n");
    b.stop();
}
