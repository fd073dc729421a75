//! The broker engine through its public API: produce/fetch round trips across rolls,
//! reopening, offset errors, group commit, long polls, topic administration, modes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use seglog::engine::broker::{Broker, BrokerOptions, EngineError, FetchResult, NewRecord};
use seglog::format::decode_record;
use seglog::format::topic::TopicConfig;

use crate::util::storage::real;

/// (offset, timestamp_ms, key, value)
type Rec = (u64, i64, Option<Vec<u8>>, Vec<u8>);

fn open(dir: &Path) -> Arc<Broker> {
    Broker::open(dir, real(), BrokerOptions::default()).unwrap()
}

fn small_segments(bytes: u64) -> TopicConfig {
    let mut c = TopicConfig::default();
    c.set("segment_bytes", &bytes.to_string()).unwrap();
    c
}

fn value(i: u64) -> Vec<u8> {
    format!("value-{i}-{}", "x".repeat((i % 97) as usize)).into_bytes()
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{}", i % 13).into_bytes()
}

/// Produces records `from..to` in batches of `batch`, checking the offsets given.
fn produce_range(b: &Broker, topic: &str, p: u32, from: u64, to: u64, batch: u64) {
    let mut i = from;
    while i < to {
        let n = batch.min(to - i);
        let keys: Vec<Vec<u8>> = (i..i + n).map(key).collect();
        let values: Vec<Vec<u8>> = (i..i + n).map(value).collect();
        let recs: Vec<NewRecord<'_>> = keys
            .iter()
            .zip(&values)
            .enumerate()
            .map(|(j, (k, v))| NewRecord {
                key: Some(k),
                value: v,
                timestamp_ms: 1000 + (i + j as u64) as i64,
            })
            .collect();
        let r = b.produce(topic, p, &recs).unwrap();
        assert_eq!((r.base_offset, r.last_offset), (i, i + n - 1));
        i += n;
    }
}

/// Decodes every record of a fetch, checking CRCs with each chunk's generation.
fn decode_all(f: &FetchResult) -> Vec<Rec> {
    let mut out = Vec::new();
    for chunk in &f.chunks {
        let mut pos = 0;
        while pos < chunk.bytes.len() {
            let r = decode_record(&chunk.bytes[pos..], pos as u64, chunk.generation).unwrap();
            out.push((
                r.offset,
                r.timestamp_ms,
                r.key.map(<[u8]>::to_vec),
                r.value.to_vec(),
            ));
            pos += r.encoded_len;
        }
    }
    out
}

/// Fetches everything from `from` with the given budget per request.
fn fetch_all(b: &Broker, topic: &str, p: u32, from: u64, max_bytes: u32) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let f = b.fetch(topic, p, next, max_bytes, Duration::ZERO).unwrap();
        let recs = decode_all(&f);
        let Some(last) = recs.last() else { break };
        next = last.0 + 1;
        out.extend(recs);
    }
    out
}

fn check_records(got: &[Rec], from: u64, to: u64) {
    assert_eq!(got.len() as u64, to - from, "record count");
    for (r, i) in got.iter().zip(from..to) {
        assert_eq!(r.0, i, "offsets are consecutive");
        assert_eq!(r.1, 1000 + i as i64);
        assert_eq!(r.2.as_deref(), Some(&key(i)[..]));
        assert_eq!(r.3, value(i), "value of offset {i}");
    }
}

#[test]
fn round_trip_across_rolls_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 2, small_segments(1024)).unwrap();
    produce_range(&b, "t", 0, 0, 300, 7);
    produce_range(&b, "t", 1, 0, 200, 1);
    let d = b.describe_topic("t").unwrap();
    assert!(
        d.partitions[0].segments > 10,
        "rolled: {:?}",
        d.partitions[0]
    );
    assert_eq!(
        (d.partitions[0].start_offset, d.partitions[0].end_offset),
        (0, 300)
    );
    for max_bytes in [0, 100, 700, 5000, 1 << 20] {
        check_records(&fetch_all(&b, "t", 0, 0, max_bytes), 0, 300);
    }
    check_records(&fetch_all(&b, "t", 0, 137, 3000), 137, 300);
    check_records(&fetch_all(&b, "t", 1, 0, 1 << 20), 0, 200);
    b.shutdown().unwrap();
    drop(b);

    let b = open(dir.path());
    assert_eq!(b.startup_report(), Vec::<String>::new());
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 300));
    check_records(&fetch_all(&b, "t", 0, 0, 2000), 0, 300);
    produce_range(&b, "t", 0, 300, 400, 9);
    check_records(&fetch_all(&b, "t", 0, 0, 1 << 20), 0, 400);
    // Partition 1 got one record per request: each sealed segment is as full as the
    // next record allowed, never over segment_bytes.
    let pdir = dir.path().join("topics/t/1");
    let mut logs: Vec<PathBuf> = fs::read_dir(&pdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    assert!(logs.len() > 5);
    for log in &logs[..logs.len() - 1] {
        let len = fs::metadata(log).unwrap().len();
        assert!(
            (1024 - 150..=1024).contains(&len),
            "sealed segment {} is {len} bytes",
            log.display()
        );
    }
}

#[test]
fn on_disk_index_follows_the_rule() {
    use seglog::engine::storage::reader::{open_log, read_header, scan_segment};
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("big", 1, small_segments(200_000)).unwrap();
    produce_range(&b, "big", 0, 0, 3000, 37);
    b.shutdown().unwrap();
    let pdir = dir.path().join("topics/big/0");
    let mut checked = 0;
    for e in fs::read_dir(&pdir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let (file, len) = open_log(&path).unwrap();
        let header = read_header(&file, len).unwrap().unwrap();
        let scan = scan_segment(&file, &header, len, |_, _| {}).unwrap();
        let mut want = Vec::new();
        for entry in &scan.index {
            entry.encode_into(&mut want);
        }
        assert_eq!(
            fs::read(path.with_extension("index")).unwrap(),
            want,
            "{}",
            path.display()
        );
        assert_eq!(scan.data_end, len);
        checked += 1;
    }
    assert!(checked > 1);
}

#[test]
fn fetch_in_the_middle_of_a_large_segment_uses_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    produce_range(&b, "t", 0, 0, 2000, 100);
    for start in [0, 1, 99, 100, 1234, 1999] {
        let f = b.fetch("t", 0, start, 1, Duration::ZERO).unwrap();
        let recs = decode_all(&f);
        assert_eq!(
            recs.len(),
            1,
            "at least one whole record even with max_bytes 1"
        );
        assert_eq!(recs[0].0, start);
        assert_eq!(recs[0].3, value(start));
    }
    let f = b.fetch("t", 0, 500, 10_000, Duration::ZERO).unwrap();
    let total: usize = f.chunks.iter().map(|c| c.bytes.len()).sum();
    assert!(total <= 10_000 && total > 5_000, "{total}");
    assert_eq!(f.end_offset, 2000);
}

#[test]
fn offset_errors() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    produce_range(&b, "t", 0, 0, 10, 10);
    let f = b.fetch("t", 0, 10, 1000, Duration::ZERO).unwrap();
    assert!(f.chunks.is_empty());
    assert_eq!((f.start_offset, f.end_offset), (0, 10));
    assert!(matches!(
        b.fetch("t", 0, 11, 1000, Duration::ZERO),
        Err(EngineError::OffsetOutOfRange {
            offset: 11,
            start: 0,
            end: 10,
            ..
        })
    ));
    assert!(matches!(
        b.fetch("t", 1, 0, 1000, Duration::ZERO),
        Err(EngineError::UnknownPartition { partition: 1, .. })
    ));
    assert!(matches!(
        b.fetch("nope", 0, 0, 1000, Duration::ZERO),
        Err(EngineError::UnknownTopic { .. })
    ));
    assert!(matches!(
        b.produce("t", 5, &[]),
        Err(EngineError::UnknownPartition { .. })
    ));
    assert!(matches!(
        b.produce("t", 0, &[]),
        Err(EngineError::InvalidRequest { .. })
    ));
    b.shutdown().unwrap();
    drop(b);

    // A partition whose oldest segment starts at 100 (as retention leaves it).
    let pdir = dir.path().join("topics/t/0");
    for e in fs::read_dir(&pdir).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    fs::write(
        pdir.join("00000000000000000100.log"),
        seglog::format::SegmentHeader::new(100).encode(),
    )
    .unwrap();
    fs::write(pdir.join("00000000000000000100.index"), b"").unwrap();
    let b = open(dir.path());
    assert_eq!(b.offsets("t", 0).unwrap(), (100, 100));
    assert!(matches!(
        b.fetch("t", 0, 99, 1000, Duration::ZERO),
        Err(EngineError::OffsetOutOfRange {
            offset: 99,
            start: 100,
            end: 100,
            ..
        })
    ));
    let r = b
        .produce(
            "t",
            0,
            &[NewRecord {
                key: None,
                value: b"v",
                timestamp_ms: -1,
            }],
        )
        .unwrap();
    assert_eq!(r.base_offset, 100);
    let recs = decode_all(&b.fetch("t", 0, 100, 1000, Duration::ZERO).unwrap());
    assert_eq!(recs.len(), 1);
    assert!(
        recs[0].1 > 1_600_000_000_000,
        "the broker assigned the time"
    );
}

#[test]
fn group_commit_shares_fsyncs_between_threads() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let before = b.stats();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let b = b.clone();
            thread::spawn(move || {
                for i in 0..25u64 {
                    let v = format!("{t}-{i}");
                    b.produce(
                        "t",
                        0,
                        &[NewRecord {
                            key: None,
                            value: v.as_bytes(),
                            timestamp_ms: -1,
                        }],
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let after = b.stats();
    let requests = after.produce_requests - before.produce_requests;
    let fsyncs = after.fsyncs - before.fsyncs;
    assert_eq!(requests, 400);
    assert_eq!(after.records_appended - before.records_appended, 400);
    assert!(fsyncs < requests, "{fsyncs} fsyncs for {requests} requests");
    let all = fetch_all(&b, "t", 0, 0, 1 << 20);
    assert_eq!(
        all.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..400).collect::<Vec<_>>()
    );
}

#[test]
fn long_poll_wakes_on_new_data() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let reader = {
        let b = b.clone();
        thread::spawn(move || {
            b.fetch("t", 0, 0, 1 << 20, Duration::from_secs(60))
                .unwrap()
        })
    };
    thread::sleep(Duration::from_millis(20));
    b.produce(
        "t",
        0,
        &[NewRecord {
            key: None,
            value: b"hello",
            timestamp_ms: 5,
        }],
    )
    .unwrap();
    let f = reader.join().unwrap();
    let recs = decode_all(&f);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].3, b"hello");
}

#[test]
fn deleting_a_topic_ends_a_waiting_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let reader = {
        let b = b.clone();
        thread::spawn(move || b.fetch("t", 0, 0, 1 << 20, Duration::from_secs(60)))
    };
    thread::sleep(Duration::from_millis(20));
    b.delete_topic("t").unwrap();
    let r = reader.join().unwrap();
    assert!(
        matches!(
            r,
            Err(EngineError::TopicDeleted { .. } | EngineError::UnknownTopic { .. })
        ),
        "{r:?}"
    );
}

#[test]
fn flush_every_n_records_acks_before_the_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOptions {
        flush_every_records: 10,
        flush_interval: Duration::from_millis(20),
        ..Default::default()
    };
    let b = Broker::open(dir.path(), real(), opts).unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let before = b.stats().fsyncs;
    for i in 0..25u64 {
        let v = value(i);
        let r = b
            .produce(
                "t",
                0,
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp_ms: 1,
                }],
            )
            .unwrap();
        assert_eq!(r.base_offset, i);
    }
    // The flusher makes them durable; a long poll sees them without spinning.
    let mut got = Vec::new();
    while got.len() < 25 {
        let f = b
            .fetch("t", 0, got.len() as u64, 1 << 20, Duration::from_secs(60))
            .unwrap();
        got.extend(decode_all(&f));
    }
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..25).collect::<Vec<_>>()
    );
    assert!(b.stats().fsyncs - before < 25);
    b.shutdown().unwrap();
    drop(b);
    let b = open(dir.path());
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 25));
}

#[test]
fn topic_administration() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    for bad in ["../x", "", ".", "..", "a/b", "a b", &"x".repeat(250)] {
        assert!(
            matches!(
                b.create_topic(bad, 1, TopicConfig::default()),
                Err(EngineError::InvalidName(_))
            ),
            "{bad:?}"
        );
    }
    assert!(!dir.path().join("x").exists());
    assert!(matches!(
        b.create_topic("t", 0, TopicConfig::default()),
        Err(EngineError::InvalidConfig(_))
    ));
    assert!(matches!(
        b.create_topic("t", 1025, TopicConfig::default()),
        Err(EngineError::InvalidConfig(_))
    ));
    let bad_config = TopicConfig {
        segment_bytes: 10,
        ..TopicConfig::default()
    };
    assert!(matches!(
        b.create_topic("t", 1, bad_config),
        Err(EngineError::InvalidConfig(_))
    ));
    b.create_topic("b-topic", 3, TopicConfig::default())
        .unwrap();
    b.create_topic("a.topic", 1, TopicConfig::default())
        .unwrap();
    assert!(matches!(
        b.create_topic("a.topic", 1, TopicConfig::default()),
        Err(EngineError::TopicExists { .. })
    ));
    assert_eq!(b.list_topics(), ["a.topic", "b-topic"]);
    assert_eq!(b.partition_count("b-topic").unwrap(), 3);

    let set = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    assert!(matches!(
        b.alter_topic("a.topic", &set("nope", "1")),
        Err(EngineError::InvalidConfig(_))
    ));
    assert!(matches!(
        b.alter_topic("a.topic", &set("partitions", "4")),
        Err(EngineError::InvalidConfig(_))
    ));
    assert!(matches!(
        b.alter_topic("a.topic", &set("segment_bytes", "5")),
        Err(EngineError::InvalidConfig(_))
    ));
    assert!(matches!(
        b.alter_topic("zzz", &set("segment_bytes", "5000")),
        Err(EngineError::UnknownTopic { .. })
    ));
    let c = b
        .alter_topic("a.topic", &set("max_record_bytes", "100"))
        .unwrap();
    assert_eq!(c.max_record_bytes, 100);
    let big = vec![0u8; 100];
    assert!(matches!(
        b.produce(
            "a.topic",
            0,
            &[NewRecord {
                key: None,
                value: &big,
                timestamp_ms: -1
            }]
        ),
        Err(EngineError::RecordTooLarge {
            size: 128,
            max: 100
        })
    ));
    b.produce(
        "a.topic",
        0,
        &[NewRecord {
            key: None,
            value: &big[..72],
            timestamp_ms: -1,
        }],
    )
    .unwrap();

    b.produce(
        "b-topic",
        2,
        &[NewRecord {
            key: None,
            value: b"gone soon",
            timestamp_ms: -1,
        }],
    )
    .unwrap();
    b.delete_topic("b-topic").unwrap();
    assert!(matches!(
        b.delete_topic("b-topic"),
        Err(EngineError::UnknownTopic { .. })
    ));
    assert!(matches!(
        b.delete_topic("../x"),
        Err(EngineError::InvalidName(_))
    ));
    assert!(matches!(
        b.produce("b-topic", 0, &[]),
        Err(EngineError::UnknownTopic { .. })
    ));
    assert!(!dir.path().join("topics/b-topic").exists());
    assert_eq!(fs::read_dir(dir.path().join("topics")).unwrap().count(), 1);
    b.create_topic("b-topic", 1, TopicConfig::default())
        .unwrap();
    assert_eq!(b.offsets("b-topic", 0).unwrap(), (0, 0));
    b.shutdown().unwrap();
    drop(b);

    let b = open(dir.path());
    assert_eq!(b.list_topics(), ["a.topic", "b-topic"]);
    assert_eq!(
        b.describe_topic("a.topic").unwrap().config.max_record_bytes,
        100
    );
    assert_eq!(b.offsets("a.topic", 0).unwrap(), (0, 1));
}

#[test]
fn files_are_0600_and_directories_0700() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let b = open(&data);
    b.create_topic("t", 2, small_segments(1024)).unwrap();
    produce_range(&b, "t", 1, 0, 100, 3);
    b.alter_topic("t", &[("retention_ms".into(), "-1".into())])
        .unwrap();
    b.shutdown().unwrap();
    let mut seen = 0;
    let mut stack = vec![data.clone()];
    while let Some(d) = stack.pop() {
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700,
            "{}",
            d.display()
        );
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let meta = fs::metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p);
            } else {
                assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{}", p.display());
                seen += 1;
            }
        }
    }
    assert!(seen > 10);
}

#[test]
fn second_broker_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    assert!(matches!(
        Broker::open(dir.path(), real(), BrokerOptions::default()),
        Err(EngineError::Locked { .. })
    ));
    b.shutdown().unwrap();
    b.shutdown().unwrap();
    assert!(matches!(
        b.produce("t", 0, &[]),
        Err(EngineError::ShuttingDown)
    ));
    drop(b);
    open(dir.path()).shutdown().unwrap();
}

#[test]
fn segments_roll_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    let mut c = TopicConfig::default();
    c.set("segment_ms", "1").unwrap();
    b.create_topic("t", 1, c).unwrap();
    for i in 0..3u64 {
        let v = value(i);
        b.produce(
            "t",
            0,
            &[NewRecord {
                key: None,
                value: &v,
                timestamp_ms: -1,
            }],
        )
        .unwrap();
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.describe_topic("t").unwrap().partitions[0].segments, 3);
    assert_eq!(fetch_all(&b, "t", 0, 0, 1 << 20).len(), 3);
}

#[test]
fn interrupted_create_and_delete_are_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path()).shutdown().unwrap();
    fs::create_dir_all(dir.path().join("topics/half~new/0")).unwrap();
    fs::create_dir_all(dir.path().join("topics/old~del/0")).unwrap();
    let b = open(dir.path());
    let report = b.startup_report();
    assert_eq!(report.len(), 2, "{report:?}");
    assert!(b.list_topics().is_empty());
    assert_eq!(fs::read_dir(dir.path().join("topics")).unwrap().count(), 0);
}

/// A file or a symbolic link named like a leftover of an interrupted create or delete
/// is not the broker's: the start leaves it (it failed, unable to remove a file as a
/// directory).
#[test]
fn files_named_like_leftovers_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path()).shutdown().unwrap();
    let topics = dir.path().join("topics");
    fs::write(topics.join("x~new"), b"mine").unwrap();
    fs::create_dir(dir.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), topics.join("y~del")).unwrap();
    let b = open(dir.path());
    let report = b.startup_report();
    assert_eq!(report.len(), 2, "{report:?}");
    assert!(
        report
            .iter()
            .all(|l| l.starts_with("ignoring ") && l.ends_with("not a topic directory")),
        "{report:?}"
    );
    assert_eq!(fs::read(topics.join("x~new")).unwrap(), b"mine");
    assert!(fs::symlink_metadata(topics.join("y~del"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(dir.path().join("elsewhere").is_dir());
}

/// A compacted topic that lost a segment (the committed fixtures): the broker starts,
/// reports the loss as corruption at startup, deletes nothing (the lost segment's
/// index included), and serves what is left around the hole.
#[test]
fn a_lost_segment_of_a_compacted_topic_is_reported_at_start_and_nothing_deleted() {
    use crate::util::fs::{copy_tree, files, fixture};
    let cases: &[(&str, &[&str], std::ops::Range<u64>)] = &[
        (
            "compacted-lost-middle-segment",
            &["segments_do_not_join", "offsets 35..=69"],
            35..70,
        ),
        (
            "compacted-lost-middle-log",
            &[
                "lost_segment",
                "00000000000000000035.index",
                "offsets 35..=69",
            ],
            35..70,
        ),
        (
            "compacted-lost-last-sealed",
            &["segments_do_not_join", "offsets 70..=89"],
            70..90,
        ),
    ];
    for (name, want, lost) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join(name);
        copy_tree(&fixture(name), &data);
        let part = data.join("topics/events/0");
        let before = files(&part);
        let b = open(&data);
        let report = b.startup_report().join("\n");
        for w in *want {
            assert!(
                report.contains(w),
                "{name}: startup report lacks {w:?}:\n{report}"
            );
        }
        assert_eq!(
            files(&part),
            before,
            "{name}: the broker changed the partition"
        );
        // The records before the hole are served, and the log continues after the
        // highest record. The fetch that reaches the hole is told the missing range
        // (whether the lost segment's index is left or not), then the rest after it.
        let mut got: Vec<u64> = Vec::new();
        let mut next = 0;
        let mut missing = Vec::new();
        loop {
            match b.fetch("events", 0, next, 1 << 20, Duration::ZERO) {
                Ok(f) => {
                    let recs = decode_all(&f);
                    let Some(last) = recs.last() else { break };
                    next = last.0 + 1;
                    got.extend(recs.iter().map(|r| r.0));
                }
                Err(EngineError::RecordsMissing { first, next: n, .. }) => {
                    missing.push(first..n);
                    next = n;
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        // Both kinds of loss are named: with the index left, and with no file left
        // (the segments around the hole do not join).
        assert_eq!(missing, vec![lost.clone()], "{name}");
        let want_before: Vec<u64> = (0..lost.start).filter(|i| i % 7 != 3).collect();
        assert_eq!(
            got.get(..want_before.len()),
            Some(&want_before[..]),
            "{name}"
        );
        assert!(got.iter().all(|o| !lost.contains(o)), "{name}: {got:?}");
        assert_eq!(got.last(), Some(&99), "{name}");
        assert_eq!(b.offsets("events", 0).unwrap(), (0, 100), "{name}");
        drop(b);
    }
}

fn one(v: &[u8]) -> NewRecord<'_> {
    NewRecord {
        key: None,
        value: v,
        timestamp_ms: -1,
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_led_commit_covers_its_followers_and_nothing_is_served_before_it() {
    use seglog::engine::broker::Commit;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let (_, w1) = b.append("t", 0, &[one(b"lead")]).unwrap();
    let Commit::Lead(lead) = b.lead_or_follow(w1.unwrap()) else {
        panic!("the first request of a pass leads its partition's commit");
    };
    let (_, w2) = b.append("t", 0, &[one(b"follow")]).unwrap();
    let Commit::Follow(follow) = b.lead_or_follow(w2.unwrap()) else {
        panic!("a request appended while the commit is led follows it");
    };
    // Written, not durable: nothing is served yet.
    let f = b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
    assert!(f.chunks.iter().all(|c| c.bytes.is_empty()), "{f:?}");
    current_thread().block_on(async {
        let mut waiting = std::pin::pin!(b.follow(follow));
        let early = tokio::time::timeout(Duration::from_millis(20), &mut waiting).await;
        assert!(
            early.is_err(),
            "a follower acknowledged before the leader's fsync"
        );
        lead.commit().unwrap();
        waiting.await.unwrap();
    });
    let f = b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
    assert_eq!(decode_all(&f).len(), 2);
    // The claim is free again: the next request leads.
    let (_, w3) = b.append("t", 0, &[one(b"next")]).unwrap();
    assert!(matches!(b.lead_or_follow(w3.unwrap()), Commit::Lead(_)));
}

#[test]
fn a_dropped_commit_leader_hands_the_fsync_to_the_flusher() {
    use seglog::engine::broker::Commit;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let (_, w1) = b.append("t", 0, &[one(b"lead")]).unwrap();
    let lead = b.lead_or_follow(w1.unwrap());
    assert!(matches!(lead, Commit::Lead(_)));
    let (_, w2) = b.append("t", 0, &[one(b"follow")]).unwrap();
    let Commit::Follow(follow) = b.lead_or_follow(w2.unwrap()) else {
        panic!("the commit is led");
    };
    drop(lead);
    current_thread().block_on(async {
        tokio::time::timeout(Duration::from_secs(60), b.follow(follow))
            .await
            .expect("the follower was left waiting")
            .unwrap();
    });
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 2));
}

#[test]
fn a_commit_that_carries_a_roll_is_handed_to_the_flusher() {
    use seglog::engine::broker::Commit;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 1, small_segments(1024)).unwrap();
    let big = vec![b'x'; 600];
    b.produce("t", 0, &[one(&big)]).unwrap();
    // Past 1024 bytes: this append rolls, and its commit carries the roll's syncs.
    let (p, w) = b.append("t", 0, &[one(&big)]).unwrap();
    assert_eq!(p.base_offset, 1);
    let Commit::Lead(lead) = b.lead_or_follow(w.unwrap()) else {
        panic!("nobody else leads");
    };
    assert!(lead.carries_roll());
    let wait = lead.hand_off();
    current_thread().block_on(async {
        tokio::time::timeout(Duration::from_secs(60), b.follow(wait))
            .await
            .expect("the flusher did not run the handed-off commit")
            .unwrap();
    });
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 2));
    // The roll is durable: the next commit carries none.
    let (_, w) = b.append("t", 0, &[one(b"next")]).unwrap();
    let Commit::Lead(lead) = b.lead_or_follow(w.unwrap()) else {
        panic!("nobody else leads");
    };
    assert!(!lead.carries_roll());
    lead.commit().unwrap();
}

#[test]
fn a_commit_goes_off_the_loop_only_beside_another_partitions_or_when_large() {
    use seglog::engine::broker::Commit;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path());
    b.create_topic("t", 2, TopicConfig::default()).unwrap();
    let lead = |p: u32, value: &[u8]| {
        let (_, w) = b.append("t", p, &[one(value)]).unwrap();
        match b.lead_or_follow(w.unwrap()) {
            Commit::Lead(lead) => lead,
            Commit::Follow(_) => panic!("nobody else leads partition {p}"),
        }
    };
    // Alone and small: the fsync stays on the caller's loop.
    let l0 = lead(0, b"small");
    assert!(!l0.better_off_loop());
    // Another partition's commit is claimed: both go to the commit thread.
    let l1 = lead(1, b"small");
    assert!(l0.better_off_loop() && l1.better_off_loop());
    l1.commit().unwrap();
    // Ended: partition 0 is alone again.
    assert!(!l0.better_off_loop());
    l0.commit().unwrap();
    // A large commit goes off the loop even alone.
    let big = vec![b'x'; 64 * 1024];
    let l0 = lead(0, &big);
    assert!(l0.better_off_loop());
    current_thread().block_on(l0.commit_off_loop()).unwrap();
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 2));
    assert_eq!(b.offsets("t", 1).unwrap(), (0, 1));
}
