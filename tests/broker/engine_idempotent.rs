//! An idempotent batch and its producer-journal entry across failures: the entry is
//! written before the records, a batch a crash cut short is cut off whole at the next
//! start, and a write that fails after the entry fails the partition.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seglog::engine::broker::{AppendError, Broker, BrokerOptions, EngineError, NewRecord};
use seglog::engine::producers::{Decision, ProducerTable};
use seglog::format::decode_record;
use seglog::format::record::record_len;
use seglog::format::topic::TopicConfig;
use seglog::testkit::storage::{Call, HookStorage};

use crate::util::storage::{is_log, real};

/// No reserved or zeroed space past the data: the log file ends at its last record.
fn opts() -> BrokerOptions {
    BrokerOptions {
        preallocate_bytes: 0,
        zero_ahead: false,
        ..BrokerOptions::default()
    }
}

fn records<'a>(values: &[&'a [u8]]) -> Vec<NewRecord<'a>> {
    values
        .iter()
        .map(|v| NewRecord {
            key: None,
            value: v,
            timestamp_ms: 7,
        })
        .collect()
}

/// One idempotent batch on t/0 the way the servers write it: checked, journalled
/// before its records are written, acknowledged once both are durable.
fn idempotent(
    b: &Broker,
    table: &ProducerTable,
    (pid, epoch): (u64, u16),
    seq: i32,
    values: &[&[u8]],
) -> Result<u64, AppendError<seglog::engine::producers::ProducerError>> {
    let count = values.len() as u32;
    assert_eq!(
        table.check(pid, epoch, "t", 0, seq, count).unwrap(),
        Decision::Append
    );
    let written = b.append_then("t", 0, &records(values), |r| {
        table.journal_batch(pid, epoch, "t", 0, seq, count, r.base_offset, r.last_offset)
    });
    let (r, wait, (batch, journal)) = match written {
        Ok(w) => w,
        Err(e) => {
            table.abandoned(pid, epoch, "t", 0);
            return Err(e);
        }
    };
    table.recorded(&batch);
    if let Some(w) = wait {
        b.wait_durable_here(w).unwrap();
    }
    journal.blocking_recv().unwrap().unwrap();
    Ok(r.base_offset)
}

fn values(b: &Broker) -> Vec<Vec<u8>> {
    let f = b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
    let mut out = Vec::new();
    for c in &f.chunks {
        let mut pos = 0;
        while pos < c.bytes.len() {
            let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
            out.push(r.value.to_vec());
            pos += r.encoded_len;
        }
    }
    out
}

fn segment(dir: &Path) -> std::path::PathBuf {
    dir.join("topics/t/0/00000000000000000000.log")
}

#[test]
fn a_batch_a_crash_cut_short_is_cut_off_whole_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let table = b.producers().clone();
    let (id, init) = table.init(None).unwrap();
    init.blocking_recv().unwrap().unwrap();
    assert_eq!(idempotent(&b, &table, id, 0, &[b"a0", b"a1"]).unwrap(), 0);
    assert_eq!(
        idempotent(&b, &table, id, 2, &[b"b0", b"b1", b"b2"]).unwrap(),
        2
    );
    b.shutdown().unwrap();
    drop(table);
    // The second batch's write cut short by the crash: its last record never made
    // it, its first two did (whole records, which recovery keeps).
    let seg = segment(dir.path());
    let len = fs::metadata(&seg).unwrap().len();
    let last = u64::from(record_len(None, 2).unwrap());
    fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - last)
        .unwrap();

    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    // The batch is gone whole: never acknowledged, it is retried whole.
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 2));
    let report = b.startup_report().join("\n");
    assert!(
        report.contains("offsets 2..=4 is only partly in t/0")
            && report.contains("cut the partition back to offset 2"),
        "{report}"
    );
    let table = b.producers().clone();
    assert_eq!(
        idempotent(&b, &table, id, 2, &[b"b0", b"b1", b"b2"]).unwrap(),
        2
    );
    let want: Vec<Vec<u8>> = ["a0", "a1", "b0", "b1", "b2"]
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect();
    assert_eq!(values(&b), want);
    // The first batch was never in doubt: its retry is a duplicate.
    assert_eq!(
        table.check(id.0, id.1, "t", 0, 0, 2).unwrap(),
        Decision::Duplicate {
            base_offset: 0,
            last_offset: 1
        }
    );
    b.shutdown().unwrap();
    // The cut and the dropped entry hold across another start.
    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    assert_eq!(values(&b), want);
    assert!(b
        .startup_report()
        .iter()
        .all(|l| !l.contains("only partly")));
}

/// A broker on `dir` with topic t and an idempotent producer, whose writes to the
/// files `refused` picks fail once the returned flag is set.
fn refusing_writes(
    dir: &Path,
    refused: impl Fn(&Path) -> bool + Send + Sync + 'static,
) -> (Arc<Broker>, Arc<ProducerTable>, (u64, u16), Arc<AtomicBool>) {
    let refuse = Arc::new(AtomicBool::new(false));
    let flag = refuse.clone();
    let storage = HookStorage::from_fn(real(), move |op| match op.call {
        Call::WriteAt { .. } if refused(op.path) && flag.load(Ordering::SeqCst) => {
            Some(Err(io::Error::other("write refused")))
        }
        _ => None,
    });
    let b = Broker::open(dir, Arc::new(storage), opts()).unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let table = b.producers().clone();
    let (id, init) = table.init(None).unwrap();
    init.blocking_recv().unwrap().unwrap();
    (b, table, id, refuse)
}

#[test]
fn a_failed_write_after_the_journal_entry_fails_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (b, table, id, refuse) = refusing_writes(dir.path(), is_log);
    refuse.store(true, Ordering::SeqCst);
    let r = idempotent(&b, &table, id, 0, &[b"x"]);
    match r {
        Err(AppendError::Engine(EngineError::PartitionFailed { reason, .. })) => {
            let why = reason.to_string();
            assert!(
                why.contains("offsets 0..=0") && why.contains("journal entry"),
                "{why}"
            );
        }
        other => panic!("expected the partition to fail: {other:?}"),
    }
    refuse.store(false, Ordering::SeqCst);
    // Offset 0 is named by the entry: no other record may take it now.
    let r = b.produce("t", 0, &records(&[b"other"]));
    assert!(
        matches!(r, Err(EngineError::PartitionFailed { .. })),
        "{r:?}"
    );
    assert!(b.describe_topic("t").unwrap().partitions[0].error.is_some());
    b.shutdown().unwrap();
    drop(table);

    // After the restart the entry is gone (the shutdown's snapshot left out the
    // batch, which was never recorded; after a crash the start drops it, as its
    // records are not there) before anything is written.
    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 0));
    assert_eq!(
        b.produce("t", 0, &records(&[b"other"]))
            .unwrap()
            .base_offset,
        0
    );
    let table = b.producers().clone();
    // The batch was never written: its retry is written, after the other record.
    assert_eq!(idempotent(&b, &table, id, 0, &[b"x"]).unwrap(), 1);
    assert_eq!(values(&b), [b"other".to_vec(), b"x".to_vec()]);
}

#[test]
fn a_failed_journal_write_writes_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let (b, table, id, refuse) = refusing_writes(dir.path(), |p| p.ends_with("producers.journal"));
    refuse.store(true, Ordering::SeqCst);
    let r = idempotent(&b, &table, id, 0, &[b"x"]);
    assert!(matches!(r, Err(AppendError::Before(_))), "{r:?}");
    // Nothing written, no offset used; the partition itself is fine.
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 0));
    assert_eq!(
        b.produce("t", 0, &records(&[b"plain"]))
            .unwrap()
            .base_offset,
        0
    );
    assert_eq!(values(&b), [b"plain".to_vec()]);
}
