//! `topics describe` against a real broker: the records actually present (compacted
//! topics have gaps, retention and compaction change the count), the state of each
//! partition's data (a flipped byte in a sealed segment, a lost middle segment), a
//! fetch inside a lost segment's offsets told the missing range, and a version-2
//! client still getting the version-2 describe response.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use seglog::format::wire::{
    decode_response_version, encode_request, HealthState, Request, ResponseBody,
};
use seglog::format::{decode_record, SegmentHeader, HEADER_LEN};
use serde_json::Value;

use crate::util::fs::{copy_tree, fixture};
use crate::util::serve::{Serve, PATIENCE};

/// The records in the `.log` files of a partition directory, decoded independently
/// of the broker (each file read to its end; none of these is damaged).
fn records_on_disk(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "log") {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let h = SegmentHeader::decode(&bytes).unwrap();
        let mut pos = HEADER_LEN;
        while pos < bytes.len() {
            let r = decode_record(&bytes[pos..], pos as u64, h.generation).unwrap();
            n += 1;
            pos += r.encoded_len;
        }
    }
    n
}

fn describe(s: &Serve, topic: &str) -> Value {
    serde_json::from_str(&s.ok(&["topics", "describe", topic, "--json"])).unwrap()
}

#[test]
fn describe_counts_the_records_present_in_a_compacted_topic() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("clean");
    copy_tree(&fixture("clean"), &data);
    let s = Serve::start(&data);
    let d = describe(&s, "users");
    let parts = d["partitions"].as_array().unwrap();
    assert!(!parts.is_empty());
    for p in parts {
        let n = p["partition"].as_u64().unwrap();
        let want = records_on_disk(&data.join(format!("topics/users/{n}")));
        let span = p["end_offset"].as_u64().unwrap() - p["start_offset"].as_u64().unwrap();
        assert!(
            want < span,
            "the fixture has gaps: {want} records in {span} offsets"
        );
        assert_eq!(p["records"], want, "{p}");
        assert_eq!(p["state"], "ok", "{p}");
        assert!(p["detail"].is_null(), "{p}");
        assert_eq!(p["spares"], 0, "{p}");
        // The active segment's reservation past its data: serve's default
        // --preallocate-bytes (8 MiB), stopped at the topic's segment_bytes.
        let pdir = data.join(format!("topics/users/{n}"));
        let meta: Value =
            serde_json::from_slice(&std::fs::read(data.join("topics/users/topic.json")).unwrap())
                .unwrap();
        let segment_bytes = meta["config"]["segment_bytes"].as_u64().unwrap();
        let active = std::fs::read_dir(&pdir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .max()
            .unwrap();
        let data_len = std::fs::metadata(&active).unwrap().len();
        assert!(segment_bytes < 8 * 1024 * 1024);
        assert_eq!(p["preallocated_bytes"], segment_bytes - data_len, "{p}");
        // The existing keys stay.
        for key in ["start_offset", "end_offset", "segments", "bytes", "cleanup"] {
            assert!(p.get(key).is_some(), "{key} missing: {p}");
        }
    }
    let text = s.ok(&["topics", "describe", "users"]);
    let header = text.lines().find(|l| l.starts_with("| partition")).unwrap();
    assert!(
        header.contains("records") && header.contains("state"),
        "{text}"
    );
    let want0 = records_on_disk(&data.join("topics/users/0"));
    let row0 = text
        .lines()
        .find(|l| l.split('|').nth(1).map(str::trim) == Some("0"))
        .unwrap();
    let cells: Vec<&str> = row0.split('|').map(str::trim).collect();
    assert_eq!(cells[4], want0.to_string(), "{text}");
    assert_eq!(cells[7], "ok", "{text}");
    s.stop();
}

/// `(records, start, end)` of partition 0 and the records a consume from the start
/// reads, taken while cleanup left the partition alone.
fn settled_count(s: &Serve, topic: &str) -> (u64, u64, u64, u64) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let before = describe(s, topic)["partitions"][0].clone();
        let consumed = s
            .ok(&["consume", topic, "--from", "earliest"])
            .lines()
            .count() as u64;
        let after = describe(s, topic)["partitions"][0].clone();
        if before == after {
            let n = |k: &str| after[k].as_u64().unwrap();
            return (n("records"), n("start_offset"), n("end_offset"), consumed);
        }
        assert!(Instant::now() < deadline, "cleanup never settled: {after}");
    }
}

/// Waits until partition 0's cleanup counter `key` is above zero.
fn wait_for_cleanup(s: &Serve, topic: &str, key: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let p = describe(s, topic)["partitions"][0].clone();
        if p["cleanup"][key].as_u64().unwrap() > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{key} stayed 0: {p}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn describe_counts_the_records_left_by_compaction_and_retention() {
    let data = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        data.path(),
        &[
            "--retention-check-interval",
            "50ms",
            "--compaction-check-interval",
            "50ms",
        ],
    );
    s.ok(&[
        "topics",
        "create",
        "t",
        "--config",
        "segment_bytes=1024",
        "--config",
        "cleanup_policy=compact",
    ]);
    let lines = |from: u32, to: u32| -> String {
        (from..to)
            .map(|i| format!("k{}:value-{i:04}-padding\n", i % 7))
            .collect()
    };
    let produce = ["produce", "t", "--key-separator", ":", "--batch", "5"];
    s.ok_with_stdin(&produce, &lines(0, 300));
    wait_for_cleanup(&s, "t", "compactions");
    let (records, start, end, consumed) = settled_count(&s, "t");
    assert_eq!(records, consumed, "after compaction: {start}..{end}");
    assert!(
        records < end - start,
        "compaction left gaps: {records} of {start}..{end}"
    );

    s.ok(&[
        "topics",
        "alter",
        "t",
        "--config",
        "cleanup_policy=delete",
        "--config",
        "retention_bytes=2048",
    ]);
    s.ok_with_stdin(&produce, &lines(300, 600));
    wait_for_cleanup(&s, "t", "segments_deleted");
    let (records, start, end, consumed) = settled_count(&s, "t");
    assert!(start > 0, "retention moved the start");
    assert_eq!(records, consumed, "after retention: {start}..{end}");
    s.stop();
}

#[test]
fn describe_shows_a_flipped_byte_in_a_sealed_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    copy_tree(&fixture("bit-flip-sealed"), &data);
    let s = Serve::start(&data);
    let p = describe(&s, "events")["partitions"][0].clone();
    assert_eq!(p["state"], "damaged", "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("00000000000000000000.log")
            && detail.contains("from offset 10")
            && detail.contains("next readable offset 11"),
        "{detail}"
    );
    // Offsets 0-69, record 10 unreadable: every other record is counted.
    assert_eq!(p["records"], 69, "{p}");
    let text = s.ok(&["topics", "describe", "events"]);
    assert!(text.contains("damaged"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("partition 0 damaged: ") && l.contains("from offset 10")),
        "{text}"
    );
    s.stop();
}

#[test]
fn describe_shows_a_lost_middle_segment_and_counts_what_is_left() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    copy_tree(&fixture("compacted-lost-middle-log"), &data);
    let s = Serve::start(&data);
    let p = describe(&s, "events")["partitions"][0].clone();
    assert_eq!(p["state"], "damaged", "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("35..=69") && detail.contains("00000000000000000035.index"),
        "{detail}"
    );
    assert_eq!(
        p["records"],
        records_on_disk(&data.join("topics/events/0")),
        "{p}"
    );
    s.stop();
}

/// A segment lost with its index leaves two segments that do not join: describe names
/// the offsets no segment holds.
#[test]
fn describe_shows_segments_that_do_not_join() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    copy_tree(&fixture("compacted-lost-middle-segment"), &data);
    let s = Serve::start(&data);
    let p = describe(&s, "events")["partitions"][0].clone();
    assert_eq!(p["state"], "damaged", "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("unreadable from offset 35, next readable offset 70")
            && detail.contains("no segment holds"),
        "{detail}"
    );
    assert_eq!(
        p["records"],
        records_on_disk(&data.join("topics/events/0")),
        "{p}"
    );
    s.stop();
}

#[test]
fn a_fetch_inside_a_lost_segment_names_the_missing_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    copy_tree(&fixture("compacted-lost-middle-log"), &data);
    let s = Serve::start(&data);
    let offsets = |out: &[u8]| -> Vec<u64> {
        String::from_utf8_lossy(out)
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["offset"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };

    // Inside the range: nothing from the next segment, exit 2 naming the range.
    let out = s.run(&["consume", "events", "--from", "40", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("35..=69") && err.contains("missing"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    // From before it: the records before, then the same stop.
    let out = s.run(&["consume", "events", "--from", "0", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    let got = offsets(&out.stdout);
    assert!(!got.is_empty() && got.iter().all(|&o| o < 35), "{got:?}");
    assert!(err.contains("35..=69"), "{err}");

    // Skip: goes on at the next segment and says what it skipped.
    let out = s.run(&[
        "consume",
        "events",
        "--from",
        "earliest",
        "--on-corrupt",
        "skip",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("skipped offsets 35..70") && err.contains("missing records"),
        "{err}"
    );
    let got = offsets(&out.stdout);
    assert!(got.iter().all(|o| !(35..70).contains(o)), "{got:?}");
    assert!(got.iter().any(|&o| o >= 70), "{got:?}");
    assert_eq!(
        got.len() as u64,
        records_on_disk(&data.join("topics/events/0"))
    );
    s.stop();
}

/// A raw handshake at `version`, then a describe of `topic`: the decoded body.
fn describe_at(s: &Serve, version: u16, topic: &str) -> ResponseBody<'static> {
    let mut conn = TcpStream::connect(&s.addr).unwrap();
    let mut bytes = Vec::new();
    for (id, req) in [
        (
            1,
            Request::Handshake {
                min_version: version,
                max_version: version,
                token: None,
            },
        ),
        (2, Request::DescribeTopic { topic }),
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
    let frame: &'static [u8] = Box::leak(frames.pop().unwrap().into_boxed_slice());
    decode_response_version(frame, version)
        .unwrap()
        .body
        .unwrap()
}

#[test]
fn a_version_2_client_still_decodes_describe() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    copy_tree(&fixture("bit-flip-sealed"), &data);
    let s = Serve::start(&data);
    match describe_at(&s, 2, "events") {
        ResponseBody::DescribeTopic {
            partitions,
            cleanup,
            health,
            ..
        } => {
            assert_eq!(partitions.len(), 1);
            assert_eq!(cleanup.map(|c| c.len()), Some(1));
            assert_eq!(health, None, "no version-3 field on a version-2 connection");
        }
        other => panic!("{other:?}"),
    }
    match describe_at(&s, 3, "events") {
        ResponseBody::DescribeTopic { health, .. } => {
            let h = health.unwrap();
            assert_eq!(h.len(), 1);
            assert_eq!(h[0].state, HealthState::Damaged);
            assert_eq!(h[0].records, 69);
        }
        other => panic!("{other:?}"),
    }
    s.stop();
}

#[test]
fn describe_shows_the_spares_a_partition_returned() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(dir.path(), &["--retention-check-interval", "20ms"]);
    s.ok(&[
        "topics",
        "create",
        "events",
        "--config",
        "segment_bytes=1024",
        "--config",
        "retention_bytes=2048",
        "--config",
        "retention_ms=-1",
    ]);
    let input: String = (0..60).map(|i| format!("{i:0>100}\n")).collect();
    s.ok_with_stdin(&["produce", "events", "--batch", "2"], &input);
    // Retention runs every 20 ms: wait until it has returned segments to the pool.
    let began = Instant::now();
    let spares = loop {
        let d = describe(&s, "events");
        let n = d["partitions"][0]["spares"].as_u64().unwrap();
        if n > 0 || began.elapsed() > PATIENCE {
            break n;
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert!(spares > 0, "no spare after retention");
    assert!(
        spares <= 4,
        "at most --spares-per-partition (4) per partition"
    );
    // Retention may still be returning segments: the count described and the files
    // in DATA/spares agree once it is done.
    let count_files = || {
        std::fs::read_dir(dir.path().join("spares"))
            .unwrap()
            .count() as u64
    };
    let began = Instant::now();
    let (spares, files) = loop {
        let d = describe(&s, "events");
        let n = d["partitions"][0]["spares"].as_u64().unwrap();
        let files = count_files();
        if n == files || began.elapsed() > PATIENCE {
            break (n, files);
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(files, spares);
    assert!(spares <= 4);
    let text = s.ok(&["topics", "describe", "events"]);
    let header = text.lines().find(|l| l.starts_with("| partition")).unwrap();
    assert!(
        header.contains("spares") && header.contains("preallocated_bytes"),
        "{text}"
    );
    s.stop();
}

/// With acknowledgements that do not wait for an fsync, records written but not yet
/// durable are counted by neither `end_offset` nor `records`: `records` never passes
/// `end_offset - start_offset`, and both move together once the records are durable.
#[test]
fn describe_counts_only_durable_records() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        dir.path(),
        &["--flush-every-records", "1000", "--flush-interval", "1h"],
    );
    s.ok(&["topics", "create", "lazy"]);
    s.ok_with_stdin(&["produce", "lazy", "-q"], "1\n2\n3\n4\n5\n");
    let d = describe(&s, "lazy");
    let p = &d["partitions"][0];
    assert_eq!(p["end_offset"], 0, "nothing is durable yet: {p}");
    assert_eq!(
        p["records"], 0,
        "records not yet durable are not counted: {p}"
    );
    // A clean stop fsyncs them; after the restart all five are durable and counted.
    s.stop();
    let s = Serve::start(dir.path());
    let d = describe(&s, "lazy");
    let p = &d["partitions"][0];
    assert_eq!(p["end_offset"], 5, "{p}");
    assert_eq!(p["records"], 5, "{p}");
    s.stop();
}

/// The active segment's reservation never passes its topic's `segment_bytes`: not at
/// creation, not after a restart (the default window is 8 MiB).
#[test]
fn the_reservation_stops_at_the_topics_segment_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let reserved = |s: &Serve| describe(s, "small")["partitions"][0]["preallocated_bytes"].as_u64();
    let s = Serve::start(&data);
    s.ok(&[
        "topics",
        "create",
        "small",
        "--config",
        "segment_bytes=4096",
    ]);
    assert!(reserved(&s).is_some_and(|b| b < 4096), "{:?}", reserved(&s));
    s.ok(&["produce", "small", "--value", "a"]);
    assert!(reserved(&s).is_some_and(|b| b < 4096), "{:?}", reserved(&s));
    s.stop();
    let s = Serve::start(&data);
    assert!(reserved(&s).is_some_and(|b| b < 4096), "{:?}", reserved(&s));
    let log = data.join("topics/small/0/00000000000000000000.log");
    assert!(std::fs::metadata(&log).unwrap().len() <= 4096);
    s.stop();
}
