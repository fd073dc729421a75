//! Background cleanup in the broker: retention by age and by size, cold storage (and a
//! cold-storage directory that cannot be written), rolling a quiet partition by age,
//! compaction under a running producer and consumer, crashes in the middle of either,
//! and deleting a topic while clients use it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use seglog::engine::broker::{Broker, BrokerOptions, EngineError, FetchResult, NewRecord};
use seglog::engine::maintenance::check::{check_partition, CheckMode};
use seglog::engine::partition::now_ms;
use seglog::engine::storage::io::StorageRef;
use seglog::engine::storage::layout::PartitionRef;
use seglog::format::decode_record;
use seglog::format::topic::TopicConfig;
use seglog::testkit::storage::{FailOn, FailingStorage};

use crate::util::fs::copy_tree;
use crate::util::storage::real;

/// (offset, timestamp_ms, key, value)
type Rec = (u64, i64, Option<Vec<u8>>, Vec<u8>);

/// Background tasks that never run on their own: tests call the rounds directly.
fn manual() -> BrokerOptions {
    BrokerOptions {
        retention_check_interval: Duration::from_secs(3600),
        compaction_check_interval: Duration::from_secs(3600),
        ..BrokerOptions::default()
    }
}

fn config(pairs: &[(&str, &str)]) -> TopicConfig {
    let mut c = TopicConfig::default();
    for (k, v) in pairs {
        c.set(k, v).unwrap();
    }
    c
}

fn produce(b: &Broker, topic: &str, key: Option<&[u8]>, value: &[u8], ts: i64) -> u64 {
    b.produce(
        topic,
        0,
        &[NewRecord {
            key,
            value,
            timestamp_ms: ts,
        }],
    )
    .unwrap()
    .base_offset
}

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

/// Every record from `from` to the end.
fn fetch_all(b: &Broker, topic: &str, from: u64) -> Vec<Rec> {
    let mut out: Vec<Rec> = Vec::new();
    let mut pos = from;
    loop {
        let f = b.fetch(topic, 0, pos, 64 * 1024, Duration::ZERO).unwrap();
        let recs = decode_all(&f);
        match recs.last() {
            Some(last) => pos = last.0 + 1,
            None => break,
        }
        out.extend(recs);
    }
    out
}

fn files(dir: &Path, ext: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(ext))
        .collect();
    names.sort();
    names
}

fn partition_dir(data: &Path, topic: &str) -> PathBuf {
    data.join("topics").join(topic).join("0")
}

fn value(i: u64) -> Vec<u8> {
    format!("value-{i:06}-{}", "v".repeat(40)).into_bytes()
}

#[test]
fn retention_by_size_removes_the_oldest_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(dir.path(), real(), manual()).unwrap();
    b.create_topic(
        "t",
        1,
        config(&[("segment_bytes", "1024"), ("retention_bytes", "4096")]),
    )
    .unwrap();
    for i in 0..400u64 {
        produce(&b, "t", None, &value(i), -1);
    }
    let before = b.describe_topic("t").unwrap().partitions[0].clone();
    assert!(before.bytes > 4096 && before.segments > 10, "{before:?}");
    assert!(b.run_retention().is_empty());
    let after = b.describe_topic("t").unwrap().partitions[0].clone();
    assert!(after.bytes <= 4096, "{after:?}");
    assert!(
        after.bytes + 1024 > 4096,
        "removes no more than needed: {after:?}"
    );
    assert_eq!(after.end_offset, 400);
    assert!(after.start_offset > 0);
    let c = &after.cleanup;
    assert!(c.last_retention_ms > 0);
    assert_eq!(c.segments_deleted, before.segments - after.segments);
    assert_eq!(c.bytes_deleted, before.bytes - after.bytes);
    assert_eq!(c.last_error, None);
    // The files went, the start offset is the oldest file's name.
    let logs = files(&partition_dir(dir.path(), "t"), ".log");
    assert_eq!(logs.len() as u64, after.segments);
    assert_eq!(logs[0], format!("{:020}.log", after.start_offset));
    assert_eq!(
        files(&partition_dir(dir.path(), "t"), ".index").len(),
        logs.len()
    );
    // Below the start: out of range, naming the start.
    match b.fetch("t", 0, 0, 1 << 20, Duration::ZERO) {
        Err(EngineError::OffsetOutOfRange { start, end, .. }) => {
            assert_eq!((start, end), (after.start_offset, 400));
        }
        other => panic!("{other:?}"),
    }
    let recs = fetch_all(&b, "t", after.start_offset);
    assert_eq!(recs.len() as u64, 400 - after.start_offset);
    for r in &recs {
        assert_eq!(r.3, value(r.0));
    }
    // A second round finds nothing more to do; the new start survives a restart.
    assert!(b.run_retention().is_empty());
    assert_eq!(
        b.describe_topic("t").unwrap().partitions[0].start_offset,
        after.start_offset
    );
    drop(b);
    let b = Broker::open(dir.path(), real(), manual()).unwrap();
    assert_eq!(b.offsets("t", 0).unwrap(), (after.start_offset, 400));
}

#[test]
fn retention_by_age_keeps_segments_with_recent_records() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(dir.path(), real(), manual()).unwrap();
    b.create_topic(
        "t",
        1,
        config(&[("segment_bytes", "1024"), ("retention_ms", "60000")]),
    )
    .unwrap();
    let old = now_ms() - 3_600_000;
    for i in 0..100u64 {
        produce(&b, "t", None, &value(i), old + i as i64);
    }
    // The segment holding the boundary has a recent record: it stays, with what follows.
    for i in 100..200u64 {
        produce(&b, "t", None, &value(i), -1);
    }
    let before = b.describe_topic("t").unwrap().partitions[0].clone();
    assert!(b.run_retention().is_empty());
    let after = b.describe_topic("t").unwrap().partitions[0].clone();
    assert!(
        after.start_offset > 50 && after.start_offset <= 100,
        "{after:?}"
    );
    assert!(after.segments < before.segments);
    let recs = fetch_all(&b, "t", after.start_offset);
    assert_eq!(recs.first().unwrap().0, after.start_offset);
    assert_eq!(recs.len() as u64, 200 - after.start_offset);
}

#[test]
fn a_quiet_partition_rolls_by_age_and_its_data_ages_out() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(dir.path(), real(), manual()).unwrap();
    b.create_topic("t", 1, config(&[("retention_ms", "60000")]))
        .unwrap();
    let old = now_ms() - 3_600_000;
    for i in 0..10u64 {
        produce(&b, "t", None, &value(i), old);
    }
    // Everything sits in the active segment, which is never deleted.
    assert!(b.run_retention().is_empty());
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 10));
    b.alter_topic("t", &[("segment_ms".into(), "1".into())])
        .unwrap();
    thread::sleep(Duration::from_millis(5));
    // Now older than segment_ms: the visit rolls it, then retention removes it.
    assert!(b.run_retention().is_empty());
    assert_eq!(b.offsets("t", 0).unwrap(), (10, 10));
    let p = b.describe_topic("t").unwrap().partitions[0].clone();
    assert_eq!((p.segments, p.cleanup.segments_deleted), (1, 1));
    // An empty active segment is not rolled again.
    thread::sleep(Duration::from_millis(5));
    assert!(b.run_retention().is_empty());
    assert_eq!(files(&partition_dir(dir.path(), "t"), ".log").len(), 1);
    // Appends continue after the removed data.
    assert_eq!(produce(&b, "t", None, b"after", -1), 10);
    drop(b);
    let b = Broker::open(dir.path(), real(), manual()).unwrap();
    assert_eq!(b.offsets("t", 0).unwrap(), (10, 11));
}

#[test]
fn retention_copies_to_cold_storage_first() {
    let dir = tempfile::tempdir().unwrap();
    let cold = tempfile::tempdir().unwrap();
    let cold_dir = cold.path().join("archive");
    let opts = BrokerOptions {
        cold_storage_dir: Some(cold_dir.clone()),
        ..manual()
    };
    let b = Broker::open(dir.path(), real(), opts).unwrap();
    b.create_topic(
        "t",
        1,
        config(&[("segment_bytes", "1024"), ("retention_bytes", "2048")]),
    )
    .unwrap();
    for i in 0..200u64 {
        let k = format!("k{}", i % 7);
        produce(&b, "t", Some(k.as_bytes()), &value(i), -1);
    }
    assert!(b.run_retention().is_empty());
    let p = b.describe_topic("t").unwrap().partitions[0].clone();
    assert!(p.start_offset > 0);
    assert_eq!(p.cleanup.segments_archived, p.cleanup.segments_deleted);
    let archived = cold_dir.join("t").join("0");
    let logs = files(&archived, ".log");
    assert_eq!(logs.len() as u64, p.cleanup.segments_deleted);
    assert_eq!(files(&archived, ".index").len(), logs.len());
    assert!(files(&archived, ".tmp").is_empty());
    // The copies check clean and hold exactly the removed records.
    let check = check_partition(
        &PartitionRef {
            dir: archived.clone(),
            topic: Some("t".into()),
            partition: Some(0),
            config: TopicConfig::default(),
            only_segment: None,
        },
        CheckMode::Full,
    )
    .unwrap();
    assert_eq!(check.severity(), None, "{:?}", check.problems);
    assert_eq!(check.next_offset(), Some(p.start_offset));
    let counted: u64 = check.segments.iter().map(|s| s.records.unwrap()).sum();
    assert_eq!(counted, p.start_offset);
    // Byte for byte: the first copied record is record 0.
    let bytes = fs::read(archived.join(&logs[0])).unwrap();
    let r = decode_record(&bytes[32..], 32, 0).unwrap();
    assert_eq!((r.offset, r.value), (0, &value(0)[..]));
}

#[test]
fn an_unwritable_cold_storage_keeps_the_segments_and_retries() {
    let dir = tempfile::tempdir().unwrap();
    let cold = tempfile::tempdir().unwrap();
    // A regular file where a directory should be: even root cannot create below it.
    let blocker = cold.path().join("blocker");
    fs::write(&blocker, b"not a directory").unwrap();
    let opts = BrokerOptions {
        cold_storage_dir: Some(blocker.join("cold")),
        ..manual()
    };
    let b = Broker::open(dir.path(), real(), opts).unwrap();
    b.create_topic(
        "t",
        1,
        config(&[("segment_bytes", "1024"), ("retention_bytes", "2048")]),
    )
    .unwrap();
    for i in 0..100u64 {
        produce(&b, "t", None, &value(i), 1);
    }
    let segments = b.describe_topic("t").unwrap().partitions[0].segments;
    let warnings = b.run_retention();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("cold storage"), "{warnings:?}");
    let p = b.describe_topic("t").unwrap().partitions[0].clone();
    assert_eq!((p.start_offset, p.segments), (0, segments));
    assert!(p.cleanup.last_error.as_deref().unwrap().contains("retried"));
    assert_eq!(fetch_all(&b, "t", 0).len(), 100);
    // Fixed: the next round copies and removes.
    fs::remove_file(&blocker).unwrap();
    assert!(b.run_retention().is_empty());
    let p = b.describe_topic("t").unwrap().partitions[0].clone();
    assert!(p.start_offset > 0);
    assert_eq!(p.cleanup.last_error, None);
    assert_eq!(
        files(&blocker.join("cold/t/0"), ".log").len() as u64,
        p.cleanup.segments_deleted
    );
}

#[test]
fn the_background_task_runs_on_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOptions {
        retention_check_interval: Duration::from_millis(50),
        ..manual()
    };
    let b = Broker::open(dir.path(), real(), opts).unwrap();
    b.create_topic(
        "t",
        1,
        config(&[("segment_bytes", "1024"), ("retention_bytes", "2048")]),
    )
    .unwrap();
    for i in 0..100u64 {
        produce(&b, "t", None, &value(i), 1);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = b.describe_topic("t").unwrap().partitions[0].clone();
        // Rounds may also run while the records go in; in the end the partition is
        // under the limit.
        if p.cleanup.segments_deleted > 0 && p.start_offset > 0 && p.bytes <= 2048 {
            break;
        }
        assert!(Instant::now() < deadline, "retention never ran: {p:?}");
        thread::sleep(Duration::from_millis(20));
    }
    b.shutdown().unwrap();
}

#[test]
fn compaction_under_a_running_producer_and_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOptions {
        compaction_check_interval: Duration::from_millis(20),
        ..manual()
    };
    let b = Broker::open(dir.path(), real(), opts).unwrap();
    b.create_topic(
        "c",
        1,
        config(&[("segment_bytes", "4096"), ("cleanup_policy", "compact")]),
    )
    .unwrap();
    const KEYS: u64 = 40;
    const TOTAL: u64 = 6000;
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let b = b.clone();
        thread::spawn(move || {
            for i in 0..TOTAL {
                let k = format!("key-{}", i % KEYS);
                let v = format!("{i}");
                let recs: Vec<NewRecord<'_>> = vec![NewRecord {
                    key: Some(k.as_bytes()),
                    value: v.as_bytes(),
                    timestamp_ms: -1,
                }];
                b.produce("c", 0, &recs).unwrap();
            }
        })
    };
    let compactor = {
        let (b, done) = (b.clone(), done.clone());
        thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                assert_eq!(b.run_compaction(), Vec::<String>::new());
            }
        })
    };
    // The consumer reads from 0 in small fetches while segments are swapped under it.
    let mut latest: BTreeMap<Vec<u8>, (u64, Vec<u8>)> = BTreeMap::new();
    let mut pos = 0u64;
    let mut fetches = 0u64;
    loop {
        let f = b
            .fetch("c", 0, pos, 256, Duration::from_millis(100))
            .unwrap();
        fetches += 1;
        let recs = decode_all(&f);
        for r in &recs {
            assert!(r.0 >= pos, "offsets go forward");
            pos = r.0 + 1;
            latest.insert(r.2.clone().unwrap(), (r.0, r.3.clone()));
        }
        if recs.is_empty() && producer.is_finished() && pos >= b.offsets("c", 0).unwrap().1 {
            break;
        }
    }
    producer.join().unwrap();
    done.store(true, Ordering::Release);
    compactor.join().unwrap();
    assert!(fetches > 10);
    // Every key's newest value was seen.
    assert_eq!(latest.len() as u64, KEYS);
    for k in 0..KEYS {
        let newest = TOTAL - KEYS + k;
        let key = format!("key-{k}").into_bytes();
        assert_eq!(latest[&key], (newest, newest.to_string().into_bytes()));
    }
    // And compaction did run and drop something while all this went on.
    assert!(b.run_compaction().is_empty());
    let p = b.describe_topic("c").unwrap().partitions[0].clone();
    assert!(
        p.cleanup.compactions > 0 && p.cleanup.records_dropped > 0,
        "{p:?}"
    );
    assert!(p.cleanup.last_compaction_ms > 0);
    // The sealed segments hold each key once now.
    let all = fetch_all(&b, "c", 0);
    let active_base: u64 = files(&partition_dir(dir.path(), "c"), ".log")
        .last()
        .unwrap()
        .trim_end_matches(".log")
        .parse()
        .unwrap();
    let sealed: Vec<&Rec> = all.iter().filter(|r| r.0 < active_base).collect();
    let keys: std::collections::BTreeSet<_> = sealed.iter().map(|r| r.2.clone()).collect();
    assert_eq!(keys.len(), sealed.len());
    assert!(files(&partition_dir(dir.path(), "c"), ".tmp").is_empty());
}

#[test]
fn deleting_a_topic_while_a_producer_and_a_consumer_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOptions {
        retention_check_interval: Duration::from_millis(10),
        compaction_check_interval: Duration::from_millis(10),
        ..BrokerOptions::default()
    };
    let b = Broker::open(dir.path(), real(), opts).unwrap();
    let busy = config(&[
        ("segment_bytes", "1024"),
        ("retention_bytes", "8192"),
        ("cleanup_policy", "compact,delete"),
    ]);
    b.create_topic("doomed", 2, busy.clone()).unwrap();
    b.create_topic("other", 1, busy).unwrap();
    for i in 0..50u64 {
        produce(&b, "other", Some(b"k"), &value(i), -1);
    }
    let producer = {
        let b = b.clone();
        thread::spawn(move || {
            let mut n = 0u64;
            loop {
                let v = value(n);
                let k = format!("k{}", n % 5);
                let r = b.produce(
                    "doomed",
                    (n % 2) as u32,
                    &[NewRecord {
                        key: Some(k.as_bytes()),
                        value: &v,
                        timestamp_ms: -1,
                    }],
                );
                match r {
                    Ok(_) => n += 1,
                    Err(e) => return (n, e),
                }
            }
        })
    };
    let consumer = {
        let b = b.clone();
        thread::spawn(move || {
            let mut pos = 0u64;
            let mut n = 0u64;
            loop {
                match b.fetch("doomed", 1, pos, 4096, Duration::from_millis(200)) {
                    Ok(f) => {
                        if let Some(r) = decode_all(&f).last() {
                            pos = r.0 + 1;
                        }
                        n += 1;
                    }
                    // Retention moved the start past us: continue from there.
                    Err(EngineError::OffsetOutOfRange { start, .. }) if start > pos => pos = start,
                    Err(e) => return (n, e),
                }
            }
        })
    };
    thread::sleep(Duration::from_millis(300));
    b.delete_topic("doomed").unwrap();
    let (produced, perr) = producer.join().unwrap();
    let (fetched, ferr) = consumer.join().unwrap();
    assert!(produced > 0 && fetched > 0);
    for e in [&perr, &ferr] {
        assert!(
            matches!(
                e,
                EngineError::TopicDeleted { .. } | EngineError::UnknownTopic { .. }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("doomed"), "{e}");
    }
    // The files are gone, leftovers included; the other topic is untouched.
    let names: Vec<String> = fs::read_dir(dir.path().join("topics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["other"]);
    assert_eq!(b.list_topics(), ["other"]);
    assert_eq!(b.offsets("other", 0).unwrap().1, 50);
    assert_eq!(produce(&b, "other", Some(b"k"), b"more", -1), 50);
    // The name can be used again at once.
    b.create_topic("doomed", 1, TopicConfig::default()).unwrap();
    assert_eq!(produce(&b, "doomed", None, b"fresh", -1), 0);
    b.shutdown().unwrap();
}

// ----- crashes in the middle of background work -----

/// Opens the broker on `storage` failing mutation `n` (sticky: the process "dies"
/// there), runs one round of `work`, and drops it. Returns false when the failure
/// was never reached (the whole round ran).
fn crash_at(data: &Path, n: u64, work: &dyn Fn(&Broker) -> Vec<String>) -> bool {
    let failing = Arc::new(FailingStorage::new(real(), n, FailOn::Any, true));
    let storage: StorageRef = failing.clone();
    match Broker::open(data, storage, manual()) {
        Ok(b) => {
            let _ = work(&b);
            let _ = b.shutdown();
        }
        Err(_) => assert!(failing.has_failed()),
    }
    failing.has_failed()
}

#[test]
fn a_crash_during_retention_loses_nothing_it_should_keep() {
    let template = tempfile::tempdir().unwrap();
    {
        let b = Broker::open(template.path(), real(), manual()).unwrap();
        b.create_topic(
            "t",
            1,
            config(&[("segment_bytes", "1024"), ("retention_bytes", "3000")]),
        )
        .unwrap();
        for i in 0..150u64 {
            produce(&b, "t", None, &value(i), 1);
        }
        b.shutdown().unwrap();
    }
    // What a whole round keeps.
    let clean = tempfile::tempdir().unwrap();
    copy_tree(template.path(), clean.path());
    let kept_from = {
        let b = Broker::open(clean.path(), real(), manual()).unwrap();
        assert!(b.run_retention().is_empty());
        b.offsets("t", 0).unwrap().0
    };
    assert!(kept_from > 0);
    let mut crashes = 0;
    for n in 1.. {
        let work = tempfile::tempdir().unwrap();
        copy_tree(template.path(), work.path());
        let failed = crash_at(work.path(), n, &|b| b.run_retention());
        let b = Broker::open(work.path(), real(), manual()).unwrap();
        let (start, end) = b.offsets("t", 0).unwrap();
        assert_eq!(end, 150, "crash at mutation {n}");
        assert!(start <= kept_from, "crash at mutation {n}: start {start}");
        let recs = fetch_all(&b, "t", start);
        assert_eq!(recs.len() as u64, 150 - start, "crash at mutation {n}");
        for r in &recs {
            assert_eq!(r.3, value(r.0));
        }
        // Finishing the work after the crash ends where a whole round ends.
        assert!(b.run_retention().is_empty());
        assert_eq!(b.offsets("t", 0).unwrap(), (kept_from, 150), "crash at {n}");
        drop(b);
        if !failed {
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 5, "{crashes}");
}

#[test]
fn a_crash_during_compaction_keeps_every_newest_value_and_no_replaced_segment() {
    let template = tempfile::tempdir().unwrap();
    let mut newest: BTreeMap<Vec<u8>, (u64, Vec<u8>)> = BTreeMap::new();
    {
        let b = Broker::open(template.path(), real(), manual()).unwrap();
        b.create_topic(
            "c",
            1,
            config(&[("segment_bytes", "1024"), ("cleanup_policy", "compact")]),
        )
        .unwrap();
        for i in 0..300u64 {
            let k = format!("k{}", i % 9).into_bytes();
            let v = value(i);
            let o = produce(&b, "c", Some(&k), &v, -1);
            newest.insert(k, (o, v));
        }
        b.shutdown().unwrap();
    }
    let original = {
        let b = Broker::open(template.path(), real(), manual()).unwrap();
        fetch_all(&b, "c", 0)
    };
    let clean = tempfile::tempdir().unwrap();
    copy_tree(template.path(), clean.path());
    let compacted = {
        let b = Broker::open(clean.path(), real(), manual()).unwrap();
        assert!(b.run_compaction().is_empty());
        fetch_all(&b, "c", 0)
    };
    assert!(compacted.len() < original.len());
    let mut crashes = 0;
    for n in 1.. {
        let work = tempfile::tempdir().unwrap();
        copy_tree(template.path(), work.path());
        let failed = crash_at(work.path(), n, &|b| b.run_compaction());
        let b = Broker::open(work.path(), real(), manual()).unwrap();
        let got = fetch_all(&b, "c", 0);
        // Either the swap happened whole or not at all; never both sets of segments.
        assert!(
            got == original || got == compacted,
            "crash at mutation {n}: {} records",
            got.len()
        );
        for (k, (o, v)) in &newest {
            assert!(got
                .iter()
                .any(|r| r.0 == *o && r.2.as_ref() == Some(k) && &r.3 == v));
        }
        let check = check_partition(
            &PartitionRef {
                dir: partition_dir(work.path(), "c"),
                topic: Some("c".into()),
                partition: Some(0),
                config: TopicConfig::default(),
                only_segment: None,
            },
            CheckMode::Full,
        )
        .unwrap();
        assert_eq!(check.severity(), None, "crash at {n}: {:?}", check.problems);
        assert!(check.marker.is_none() && check.temp_files.is_empty());
        assert_eq!(b.offsets("c", 0).unwrap().1, 300);
        drop(b);
        if !failed {
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 5, "{crashes}");
}

#[test]
fn stopping_the_broker_cuts_a_compaction_short_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(dir.path(), real(), manual()).unwrap();
    b.create_topic(
        "c",
        1,
        config(&[
            ("segment_bytes", &(4 << 20).to_string()),
            ("cleanup_policy", "compact"),
        ]),
    )
    .unwrap();
    // 24 MiB over 2 000 keys, each written twice: about 12 MiB to write back, which
    // the paced writer (32 MiB/s) needs well over a third of a second for.
    let v = vec![b'v'; 6 * 1024];
    let keys: Vec<Vec<u8>> = (0..2000u32).map(|k| k.to_be_bytes().to_vec()).collect();
    for round in 0..2 {
        for chunk in keys.chunks(100) {
            let recs: Vec<NewRecord<'_>> = chunk
                .iter()
                .map(|k| NewRecord {
                    key: Some(k),
                    value: &v,
                    timestamp_ms: round,
                })
                .collect();
            b.produce("c", 0, &recs).unwrap();
        }
    }
    let end = b.offsets("c", 0).unwrap().1;
    let compactor = {
        let b = b.clone();
        thread::spawn(move || b.run_compaction())
    };
    thread::sleep(Duration::from_millis(100));
    b.shutdown().unwrap();
    let warnings = compactor.join().unwrap();
    assert!(
        warnings.is_empty(),
        "stopping is not a failure: {warnings:?}"
    );
    let p = b.describe_topic("c").unwrap().partitions[0].clone();
    assert_eq!(p.cleanup.compactions, 0, "{p:?}");
    drop(b);
    let pdir = partition_dir(dir.path(), "c");
    assert!(files(&pdir, ".tmp").is_empty());
    assert!(!pdir.join("compaction.marker").exists());
    let b = Broker::open(dir.path(), real(), manual()).unwrap();
    assert_eq!(b.offsets("c", 0).unwrap(), (0, end));
    assert_eq!(fetch_all(&b, "c", 0).len() as u64, end);
}
