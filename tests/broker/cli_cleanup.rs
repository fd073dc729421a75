//! `seglog serve` with its background cleanup, end to end: retention on a short
//! interval with a cold-storage directory, `topics describe` showing what it did (text
//! and JSON), `consume --from earliest` starting at the moved start offset, and a
//! version-1 client still getting a version-1 describe response.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use seglog::format::wire::{decode_response_version, encode_request, Request, ResponseBody};
use serde_json::Value;

use crate::util::serve::{Serve, PATIENCE};

#[test]
fn retention_in_serve_shows_in_describe_and_consume_starts_at_the_new_start() {
    let data = tempfile::tempdir().unwrap();
    let cold = tempfile::tempdir().unwrap();
    let cold_arg = cold.path().to_str().unwrap();
    let s = Serve::start_with(
        data.path(),
        &[
            "--retention-check-interval",
            "50ms",
            "--compaction-check-interval",
            "1h",
            "--cold-storage-dir",
            cold_arg,
        ],
    );
    s.ok(&[
        "topics",
        "create",
        "t",
        "--config",
        "segment_bytes=1024",
        "--config",
        "retention_bytes=2048",
    ]);
    let lines: String = (0..300).map(|i| format!("line-{i:04}-padding\n")).collect();
    s.ok_with_stdin(&["produce", "t"], &lines);
    let deadline = Instant::now() + PATIENCE;
    let p = loop {
        let d: Value = serde_json::from_str(&s.ok(&["topics", "describe", "t", "--json"])).unwrap();
        let p = d["partitions"][0].clone();
        if p["cleanup"]["segments_deleted"].as_u64().unwrap() > 0 {
            break p;
        }
        assert!(Instant::now() < deadline, "retention never ran: {d}");
        thread::sleep(Duration::from_millis(50));
    };
    let c = &p["cleanup"];
    assert!(c["last_retention_ms"].as_i64().unwrap() > 0);
    assert_eq!(c["segments_archived"], c["segments_deleted"]);
    assert!(c["last_compaction_ms"].is_null());
    assert!(c["error"].is_null());
    let start = p["start_offset"].as_u64().unwrap();
    assert!(start > 0 && p["end_offset"] == 300);
    assert!(cold
        .path()
        .join("t/0")
        .join(format!("{:020}.log", 0))
        .exists());
    // earliest is the new start (retention may move it further while we read).
    let out = s.ok(&["consume", "t", "--from", "earliest", "--json"]);
    let offsets: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["offset"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(offsets[0] >= start);
    assert_eq!(*offsets.last().unwrap(), 299);
    assert!(offsets.windows(2).all(|w| w[1] == w[0] + 1));
    // Below the start: refused, naming the range.
    let refused = s.run(&["consume", "t", "--from", "0"]);
    assert_eq!(refused.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("out of range"));
    // The text form has the cleanup table.
    let text = s.ok(&["topics", "describe", "t"]);
    assert!(
        text.contains("segments_deleted") && text.contains("ago"),
        "{text}"
    );
    s.stop();
}

#[test]
fn a_version_1_client_gets_the_version_1_describe_response() {
    let data = tempfile::tempdir().unwrap();
    let s = Serve::start(data.path());
    s.ok(&["topics", "create", "t", "--partitions", "2"]);
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    let mut bytes = Vec::new();
    for (id, req) in [
        (
            1,
            Request::Handshake {
                min_version: 1,
                max_version: 1,
                token: None,
            },
        ),
        (2, Request::DescribeTopic { topic: "t" }),
    ] {
        encode_request(&mut bytes, id, &req).unwrap();
    }
    conn.write_all(&bytes).unwrap();
    let mut frames = Vec::new();
    for _ in 0..2 {
        let mut len = [0u8; 4];
        conn.read_exact(&mut len).unwrap();
        let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
        conn.read_exact(&mut frame).unwrap();
        frames.push(frame);
    }
    match decode_response_version(&frames[1], 1).unwrap().body {
        Some(ResponseBody::DescribeTopic {
            partitions,
            cleanup,
            ..
        }) => {
            assert_eq!(partitions.len(), 2);
            assert_eq!(
                cleanup, None,
                "no version-2 field on a version-1 connection"
            );
        }
        other => panic!("{other:?}"),
    }
    drop(conn);
    s.stop();
}
