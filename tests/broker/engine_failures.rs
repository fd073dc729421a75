//! The broker engine under failing storage: failed fsyncs poison a partition, failed
//! writes are cut off, torn tails refuse the open; plus a deterministic group-commit
//! check and a seeded model test against a `Vec` of records.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use seglog::engine::broker::{Broker, BrokerOptions, EngineError, FetchResult, NewRecord};
use seglog::format::decode_record;
use seglog::format::topic::TopicConfig;
use seglog::testkit::storage::{Call, FailOn, FailingStorage, Hook, HookStorage, Op, OpKind};

use crate::util::rng::{seed_or, with_seed, Rng};
use crate::util::storage::{is_log, real};

fn rec(value: &[u8]) -> NewRecord<'_> {
    NewRecord {
        key: None,
        value,
        timestamp_ms: 7,
    }
}

fn offsets_of(f: &FetchResult) -> Vec<u64> {
    let mut out = Vec::new();
    for c in &f.chunks {
        let mut pos = 0;
        while pos < c.bytes.len() {
            let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
            out.push(r.offset);
            pos += r.encoded_len;
        }
    }
    out
}

fn setup(dir: &Path, partitions: u32) {
    let b = Broker::open(dir, real(), BrokerOptions::default()).unwrap();
    b.create_topic("t", partitions, TopicConfig::default())
        .unwrap();
    b.shutdown().unwrap();
}

#[test]
fn a_failed_fsync_poisons_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), 2);
    // Opening fsyncs each partition's log and directory (4 calls); the 5th fails.
    let failing = FailingStorage::new(real(), 5, FailOn::Sync, false);
    let b = Broker::open(
        dir.path(),
        Arc::new(failing.clone()),
        BrokerOptions::default(),
    )
    .unwrap();
    assert_eq!(failing.calls(), 4);
    let r = b.produce("t", 0, &[rec(b"a")]);
    assert!(
        matches!(r, Err(EngineError::PartitionFailed { partition: 0, .. })),
        "{r:?}"
    );
    assert!(failing.has_failed());
    // Never retried, never acknowledged, never served.
    let r = b.produce("t", 0, &[rec(b"b")]);
    assert!(
        matches!(r, Err(EngineError::PartitionFailed { .. })),
        "{r:?}"
    );
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 0));
    let f = b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
    assert!(f.chunks.is_empty());
    assert!(b.describe_topic("t").unwrap().partitions[0].error.is_some());
    // The other partition is unharmed.
    assert_eq!(b.produce("t", 1, &[rec(b"c")]).unwrap().base_offset, 0);
    assert_eq!(
        offsets_of(&b.fetch("t", 1, 0, 1 << 20, Duration::ZERO).unwrap()),
        [0]
    );
    b.shutdown().unwrap();
}

#[test]
fn a_failed_fsync_at_open_leaves_the_partition_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), 2);
    let failing = FailingStorage::new(real(), 1, FailOn::Sync, false);
    let b = Broker::open(dir.path(), Arc::new(failing), BrokerOptions::default()).unwrap();
    assert!(b.startup_report().iter().any(|l| l.contains("t/0")));
    let r = b.produce("t", 0, &[rec(b"a")]);
    assert!(
        matches!(
            r,
            Err(EngineError::PartitionUnavailable { partition: 0, .. })
        ),
        "{r:?}"
    );
    assert_eq!(b.produce("t", 1, &[rec(b"b")]).unwrap().base_offset, 0);
    let d = b.describe_topic("t").unwrap();
    assert!(d.partitions[0].error.is_some() && d.partitions[1].error.is_none());
}

#[test]
fn a_failed_background_fsync_poisons_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), 1);
    let failing = FailingStorage::new(real(), 3, FailOn::Sync, false);
    let opts = BrokerOptions {
        flush_every_records: 3,
        flush_interval: Duration::from_millis(10),
        ..Default::default()
    };
    let b = Broker::open(dir.path(), Arc::new(failing), opts).unwrap();
    let mut refused = None;
    for _ in 0..2000 {
        match b.produce("t", 0, &[rec(b"x")]) {
            Ok(_) => thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    assert!(
        matches!(refused, Some(EngineError::PartitionFailed { .. })),
        "{refused:?}"
    );
    // Nothing written before the failed fsync is served.
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 0));
}

/// `.log` writes can be made to fail half-way, and truncates to fail.
#[derive(Debug, Default)]
struct Flaky {
    torn_writes: AtomicBool,
    failing_set_len: AtomicBool,
}

impl Hook for Flaky {
    fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
        match (op.call, op.file) {
            (Call::WriteAt { buf, pos }, Some(file))
                if is_log(op.path) && self.torn_writes.load(Ordering::SeqCst) =>
            {
                if let Err(e) = file.write_at(&buf[..buf.len() / 2], pos) {
                    return Some(Err(e));
                }
                Some(Err(io::Error::other("injected: no space left on device")))
            }
            (Call::SetLen(_), _) if self.failing_set_len.load(Ordering::SeqCst) => {
                Some(Err(io::Error::other("injected: truncate failed")))
            }
            _ => None,
        }
    }
}

#[test]
fn a_torn_write_is_cut_off_and_the_offsets_reused() {
    let dir = tempfile::tempdir().unwrap();
    let flaky = Arc::new(Flaky::default());
    let b = Broker::open(
        dir.path(),
        Arc::new(HookStorage::shared(real(), flaky.clone())),
        BrokerOptions::default(),
    )
    .unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    b.produce("t", 0, &[rec(b"one"), rec(b"two")]).unwrap();
    let log = dir.path().join("topics/t/0/00000000000000000000.log");
    let len = fs::metadata(&log).unwrap().len();
    flaky.torn_writes.store(true, Ordering::SeqCst);
    let r = b.produce("t", 0, &[rec(b"lost-1"), rec(b"lost-2"), rec(b"lost-3")]);
    assert!(matches!(r, Err(EngineError::Io { .. })), "{r:?}");
    assert_eq!(
        fs::metadata(&log).unwrap().len(),
        len,
        "the torn write was cut off"
    );
    flaky.torn_writes.store(false, Ordering::SeqCst);
    assert_eq!(b.produce("t", 0, &[rec(b"three")]).unwrap().base_offset, 2);
    let f = b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
    assert_eq!(offsets_of(&f), [0, 1, 2]);
    b.shutdown().unwrap();
    drop(b);
    let b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    assert_eq!(
        offsets_of(&b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap()),
        [0, 1, 2]
    );
}

#[test]
fn a_write_that_cannot_be_cut_off_poisons_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let flaky = Arc::new(Flaky::default());
    let b = Broker::open(
        dir.path(),
        Arc::new(HookStorage::shared(real(), flaky.clone())),
        BrokerOptions::default(),
    )
    .unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    b.produce("t", 0, &[rec(b"one")]).unwrap();
    flaky.torn_writes.store(true, Ordering::SeqCst);
    flaky.failing_set_len.store(true, Ordering::SeqCst);
    let r = b.produce("t", 0, &[rec(b"lost")]);
    assert!(
        matches!(r, Err(EngineError::PartitionFailed { .. })),
        "{r:?}"
    );
    flaky.torn_writes.store(false, Ordering::SeqCst);
    flaky.failing_set_len.store(false, Ordering::SeqCst);
    let r = b.produce("t", 0, &[rec(b"later")]);
    assert!(
        matches!(r, Err(EngineError::PartitionFailed { .. })),
        "{r:?}"
    );
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 1));
}

#[test]
fn startup_recovery_cuts_a_torn_active_tail_and_appends_after_it() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), 2);
    let b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    b.produce("t", 0, &[rec(b"kept")]).unwrap();
    b.produce("t", 1, &[rec(b"kept")]).unwrap();
    b.shutdown().unwrap();
    drop(b);
    let log0 = dir.path().join("topics/t/0/00000000000000000000.log");
    let log1 = dir.path().join("topics/t/1/00000000000000000000.log");
    let clean0 = fs::read(&log0).unwrap();
    let mut bytes = clean0.clone();
    let torn: Vec<u8> = bytes[32..44].to_vec();
    bytes.extend_from_slice(&torn);
    fs::write(&log0, &bytes).unwrap();
    // A zero tail (preallocated space) is a legal state of an active segment.
    let mut bytes1 = fs::read(&log1).unwrap();
    bytes1.extend_from_slice(&[0u8; 100]);
    fs::write(&log1, &bytes1).unwrap();

    let b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    let report = b.startup_report();
    assert!(report.iter().any(|l| l.contains("t/0")), "{report:?}");
    // Recovery cut the torn bytes (truncate + fsync) before anything was appended.
    assert_eq!(&fs::read(&log0).unwrap()[..clean0.len()], &clean0[..]);
    assert_eq!(b.produce("t", 0, &[rec(b"x")]).unwrap().base_offset, 1);
    assert_eq!(
        offsets_of(&b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap()),
        [0, 1]
    );
    assert_eq!(b.produce("t", 1, &[rec(b"next")]).unwrap().base_offset, 1);
    assert_eq!(
        offsets_of(&b.fetch("t", 1, 0, 1 << 20, Duration::ZERO).unwrap()),
        [0, 1]
    );
}

/// Real storage whose first `sync_data` waits until `writers` log writes happened:
/// it proves other producers append while an fsync runs.
#[derive(Debug)]
struct Gate {
    writes: Mutex<u64>,
    wrote: Condvar,
    writers: u64,
    syncs: AtomicU64,
}

impl Hook for Gate {
    fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
        if op.call == Call::SyncData && self.syncs.fetch_add(1, Ordering::SeqCst) == 0 {
            let writes = self.writes.lock().unwrap();
            // The bound only keeps a broken implementation from hanging the test.
            let _ = self
                .wrote
                .wait_timeout_while(writes, Duration::from_secs(30), |w| *w < self.writers);
        }
        None
    }

    fn after(&self, op: &Op<'_>) {
        if op.kind() == OpKind::WriteAt && is_log(op.path) {
            *self.writes.lock().unwrap() += 1;
            self.wrote.notify_all();
        }
    }
}

#[test]
fn writers_append_while_an_fsync_runs_and_share_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), 1);
    let gate = Arc::new(Gate {
        writes: Mutex::new(0),
        wrote: Condvar::new(),
        writers: 16,
        syncs: AtomicU64::new(0),
    });
    let b = Broker::open(
        dir.path(),
        Arc::new(HookStorage::shared(real(), gate.clone())),
        BrokerOptions::default(),
    )
    .unwrap();
    let before = b.stats();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let b = b.clone();
            thread::spawn(move || b.produce("t", 0, &[rec(b"v")]).unwrap())
        })
        .collect();
    let mut bases: Vec<u64> = threads
        .into_iter()
        .map(|t| t.join().unwrap().base_offset)
        .collect();
    bases.sort_unstable();
    assert_eq!(bases, (0..16).collect::<Vec<_>>());
    assert_eq!(*gate.writes.lock().unwrap(), 16);
    let fsyncs = b.stats().fsyncs - before.fsyncs;
    assert!(fsyncs <= 2, "{fsyncs} fsyncs for 16 requests");
    assert_eq!(gate.syncs.load(Ordering::SeqCst), fsyncs);
}

type Model = Vec<Vec<(Option<Vec<u8>>, Vec<u8>)>>;

fn model_run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed);
    let mut b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    let mut config = TopicConfig::default();
    config.set("segment_bytes", "4096").unwrap();
    b.create_topic("m", 2, config).unwrap();
    let mut model: Model = vec![Vec::new(), Vec::new()];
    for step in 0..200 {
        let p = rng.below(2) as u32;
        match rng.below(10) {
            0..=4 => {
                let n = 1 + rng.below(8) as usize;
                let recs: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..n)
                    .map(|_| {
                        let key = (rng.below(3) > 0).then(|| vec![b'k'; rng.below(20) as usize]);
                        (key, vec![rng.below(256) as u8; rng.below(400) as usize])
                    })
                    .collect();
                let batch: Vec<NewRecord<'_>> = recs
                    .iter()
                    .map(|(k, v)| NewRecord {
                        key: k.as_deref(),
                        value: v,
                        timestamp_ms: 1,
                    })
                    .collect();
                let r = b.produce("m", p, &batch).unwrap();
                assert_eq!(
                    r.base_offset,
                    model[p as usize].len() as u64,
                    "seed {seed} step {step}"
                );
                model[p as usize].extend(recs);
            }
            5..=8 => {
                let len = model[p as usize].len() as u64;
                let from = rng.below(len + 1);
                let max_bytes = rng.below(3000) as u32;
                let f = b.fetch("m", p, from, max_bytes, Duration::ZERO).unwrap();
                assert_eq!(f.end_offset, len, "seed {seed} step {step}");
                let mut next = from;
                for c in &f.chunks {
                    let mut pos = 0;
                    while pos < c.bytes.len() {
                        let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
                        let want = &model[p as usize][next as usize];
                        assert_eq!(r.offset, next, "seed {seed} step {step}");
                        assert_eq!(
                            (r.key, r.value),
                            (want.0.as_deref(), &want.1[..]),
                            "seed {seed} step {step}"
                        );
                        next += 1;
                        pos += r.encoded_len;
                    }
                }
                assert_eq!(
                    next > from,
                    from < len,
                    "seed {seed} step {step}: some record iff one exists"
                );
            }
            _ => {
                b.shutdown().unwrap();
                drop(b);
                b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
                let report = b.startup_report();
                assert!(report.is_empty(), "seed {seed} step {step}: {report:?}");
            }
        }
    }
}

#[test]
fn seeded_model() {
    let base = seed_or(0x5eed_0001);
    with_seed(base, || {
        for i in 0..3 {
            model_run(base.wrapping_add(i * 7919));
        }
    });
}

/// A record at the largest offset leaves no offset to append at: the partition is
/// refused with an error (no overflow, no wrapped offsets), the others keep working.
#[test]
fn a_record_at_the_last_offset_refuses_the_partition_without_overflow() {
    use seglog::format::{encode_record, SegmentHeader};
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), 2);
    let b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    b.shutdown().unwrap();
    drop(b);
    let log0 = dir.path().join("topics/t/0/00000000000000000000.log");
    let mut bytes = SegmentHeader::new(0).encode().to_vec();
    encode_record(&mut bytes, 0, 1, None, b"first", 0).unwrap();
    encode_record(&mut bytes, u64::MAX, 1, None, b"last", 0).unwrap();
    fs::write(&log0, &bytes).unwrap();
    let _ = fs::remove_file(dir.path().join("topics/t/0/00000000000000000000.index"));

    let b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    let r = b.produce("t", 0, &[rec(b"x")]);
    assert!(r.is_err(), "{r:?}");
    assert_eq!(b.produce("t", 1, &[rec(b"y")]).unwrap().base_offset, 0);
}

// ----- the write path: preallocation and zero-ahead under failing storage -----

const ZEROER: &str = "seglog-zeroer";

fn zero_ahead_opts(preallocate_bytes: u64) -> BrokerOptions {
    BrokerOptions {
        preallocate_bytes,
        zero_ahead: true,
        ..BrokerOptions::default()
    }
}

fn on_zeroer() -> bool {
    thread::current().name() == Some(ZEROER)
}

/// Produces records of 1000 bytes to t/0 until its segments hold `bytes`; returns
/// how many.
fn produce_bytes(b: &Broker, bytes: u64) -> u64 {
    let value = vec![b'v'; 1000];
    let mut n = 0;
    while b.describe_topic("t").unwrap().partitions[0].bytes < bytes {
        b.produce("t", 0, &[rec(&value)]).unwrap();
        n += 1;
    }
    n
}

/// Every offset of t/0, fetched from 0 to the end.
fn all_offsets(b: &Broker) -> Vec<u64> {
    let mut out = Vec::new();
    loop {
        let from = out.last().map_or(0, |o| o + 1);
        let f = b.fetch("t", 0, from, 1 << 20, Duration::ZERO).unwrap();
        let got = offsets_of(&f);
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

fn wait_for(flag: &AtomicBool) {
    for _ in 0..2500 {
        if flag.load(Ordering::SeqCst) {
            return;
        }
        thread::sleep(Duration::from_millis(2));
    }
    panic!("the zero worker never made the call");
}

#[test]
fn a_failed_preallocation_is_only_logged() {
    let dir = tempfile::tempdir().unwrap();
    let allocations = Arc::new(AtomicU64::new(0));
    let seen = allocations.clone();
    let storage = HookStorage::from_fn(real(), move |op| match op.call {
        Call::Allocate(_) => {
            seen.fetch_add(1, Ordering::SeqCst);
            Some(Err(io::Error::other("no space for a reservation")))
        }
        _ => None,
    });
    let b = Broker::open(dir.path(), Arc::new(storage), zero_ahead_opts(64 * 1024)).unwrap();
    let config = TopicConfig {
        segment_bytes: 16 * 1024,
        ..TopicConfig::default()
    };
    b.create_topic("t", 1, config).unwrap();
    // Across several rolls: each new segment asks for a reservation.
    let n = produce_bytes(&b, 60 * 1024);
    assert!(allocations.load(Ordering::SeqCst) >= 3);
    assert_eq!(all_offsets(&b), (0..n).collect::<Vec<_>>());
    assert!(b.describe_topic("t").unwrap().partitions[0].error.is_none());
    b.shutdown().unwrap();
}

#[test]
fn a_failed_zero_write_turns_zeroing_off_and_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let failed = Arc::new(AtomicBool::new(false));
    let flag = failed.clone();
    let storage = HookStorage::from_fn(real(), move |op| match op.call {
        Call::WriteAt { .. } if on_zeroer() => {
            flag.store(true, Ordering::SeqCst);
            Some(Err(io::Error::other("zero write refused")))
        }
        _ => None,
    });
    let b = Broker::open(dir.path(), Arc::new(storage), zero_ahead_opts(256 * 1024)).unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    let first = produce_bytes(&b, 70 * 1024);
    wait_for(&failed);
    let more = produce_bytes(&b, 200 * 1024);
    assert_eq!(all_offsets(&b), (0..first + more).collect::<Vec<_>>());
    assert_eq!(b.stats().zeroed_bytes, 0);
    b.shutdown().unwrap();
    // Nothing past the data: the log is exactly its records.
    let b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    assert_eq!(b.offsets("t", 0).unwrap(), (0, first + more));
}

#[test]
fn a_failed_zero_fsync_fails_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let failed = Arc::new(AtomicBool::new(false));
    let flag = failed.clone();
    let storage = HookStorage::from_fn(real(), move |op| match op.call {
        Call::SyncData | Call::SyncAll if on_zeroer() => {
            flag.store(true, Ordering::SeqCst);
            Some(Err(io::Error::other("fsync of zeros failed")))
        }
        _ => None,
    });
    let b = Broker::open(dir.path(), Arc::new(storage), zero_ahead_opts(256 * 1024)).unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    // Zeroing starts at 64 KiB; from the failed fsync of zeros on, the kernel may have
    // dropped the writer's pages too: no more acks.
    let value = vec![b'v'; 1000];
    let mut n = 0u64;
    let err = loop {
        match b.produce("t", 0, &[rec(&value)]) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100_000, "the partition never failed");
    };
    assert!(failed.load(Ordering::SeqCst));
    assert!(n * 1000 >= 60 * 1024, "failed after only {n} records");
    assert!(
        matches!(err, EngineError::PartitionFailed { .. }),
        "{err:?}"
    );
    let err = b.produce("t", 0, &[rec(&value)]).unwrap_err();
    assert!(matches!(err, EngineError::PartitionFailed { .. }));
    let _ = b.shutdown();
    drop(b);
    // A restart recovers what was acknowledged.
    let b = Broker::open(dir.path(), real(), BrokerOptions::default()).unwrap();
    assert_eq!(b.offsets("t", 0).unwrap(), (0, n));
}

/// Holds every `sync_data` of a log file while armed, telling `entered` each time one
/// starts waiting; `fail` makes them fail instead.
#[derive(Default)]
struct SyncGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    armed: bool,
    fail: bool,
    entered: Option<std::sync::mpsc::Sender<()>>,
}

impl SyncGate {
    fn arm(&self) -> std::sync::mpsc::Receiver<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut s = self.state.lock().unwrap();
        s.armed = true;
        s.entered = Some(tx);
        rx
    }

    fn release(&self, fail: bool) {
        let mut s = self.state.lock().unwrap();
        s.armed = false;
        s.fail = fail;
        self.cv.notify_all();
    }
}

impl Hook for SyncGate {
    fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
        if op.kind() != OpKind::SyncData || !is_log(op.path) {
            return None;
        }
        let mut s = self.state.lock().unwrap();
        if s.armed {
            if let Some(tx) = &s.entered {
                let _ = tx.send(());
            }
        }
        while s.armed {
            s = self.cv.wait(s).unwrap();
        }
        s.fail
            .then(|| Err(io::Error::other("injected fsync failure")))
    }
}

fn gated_broker(dir: &Path) -> (Arc<Broker>, Arc<SyncGate>) {
    let gate = Arc::new(SyncGate::default());
    let storage = HookStorage::shared(real(), gate.clone());
    let b = Broker::open(dir, Arc::new(storage), BrokerOptions::default()).unwrap();
    b.create_topic("t", 1, TopicConfig::default()).unwrap();
    (b, gate)
}

fn record(v: &[u8]) -> NewRecord<'_> {
    NewRecord {
        key: None,
        value: v,
        timestamp_ms: -1,
    }
}

fn one_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Waits (off the runtime thread, so its tasks keep running) until a held fsync
/// has started.
async fn fsync_started(entered: std::sync::mpsc::Receiver<()>) {
    tokio::task::spawn_blocking(move || entered.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("no fsync started");
}

#[test]
fn an_off_loop_commit_lets_the_next_batch_be_written_while_it_syncs() {
    use seglog::engine::broker::Commit;
    let dir = tempfile::tempdir().unwrap();
    let (b, gate) = gated_broker(dir.path());
    let (_, w1) = b.append("t", 0, &[record(b"lead")]).unwrap();
    let Commit::Lead(lead) = b.lead_or_follow(w1.unwrap()) else {
        panic!("the first request leads");
    };
    let (_, w2) = b.append("t", 0, &[record(b"follow")]).unwrap();
    let Commit::Follow(follow) = b.lead_or_follow(w2.unwrap()) else {
        panic!("the commit is led");
    };
    let entered = gate.arm();
    one_thread_runtime().block_on(async {
        let first = tokio::spawn(lead.commit_off_loop());
        fsync_started(entered).await;
        // The first commit's fsync is held on the commit thread. This thread is free:
        // the next batch is written and leads the next commit.
        let (_, w3) = b.append("t", 0, &[record(b"next")]).unwrap();
        let Commit::Lead(next) = b.lead_or_follow(w3.unwrap()) else {
            panic!("the claim was not released when the fsync was handed off");
        };
        let second = tokio::spawn(next.commit_off_loop());
        let mut follower = std::pin::pin!(b.follow(follow));
        let early = tokio::time::timeout(Duration::from_millis(20), &mut follower).await;
        assert!(early.is_err(), "acknowledged before its fsync ended");
        assert_eq!(b.offsets("t", 0).unwrap(), (0, 0));
        let f = b.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
        assert!(f.chunks.iter().all(|c| c.bytes.is_empty()), "{f:?}");
        gate.release(false);
        first.await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(60), follower)
            .await
            .expect("the follower was not woken")
            .unwrap();
        second.await.unwrap().unwrap();
    });
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 3));
    b.shutdown().unwrap();
}

#[test]
fn a_leader_gone_during_its_off_loop_commit_leaves_no_follower_waiting() {
    use seglog::engine::broker::Commit;
    let dir = tempfile::tempdir().unwrap();
    let (b, gate) = gated_broker(dir.path());
    let (_, w1) = b.append("t", 0, &[record(b"lead")]).unwrap();
    let Commit::Lead(lead) = b.lead_or_follow(w1.unwrap()) else {
        panic!("the first request leads");
    };
    let (_, w2) = b.append("t", 0, &[record(b"follow")]).unwrap();
    let Commit::Follow(follow) = b.lead_or_follow(w2.unwrap()) else {
        panic!("the commit is led");
    };
    let entered = gate.arm();
    one_thread_runtime().block_on(async {
        let leader = tokio::spawn(lead.commit_off_loop());
        fsync_started(entered).await;
        // The leader's connection goes away while its fsync runs.
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        gate.release(false);
        tokio::time::timeout(Duration::from_secs(60), b.follow(follow))
            .await
            .expect("the follower was left waiting")
            .unwrap();
    });
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 2));
    b.shutdown().unwrap();
}

#[test]
fn a_failed_off_loop_commit_acknowledges_nobody() {
    use seglog::engine::broker::Commit;
    let dir = tempfile::tempdir().unwrap();
    let (b, gate) = gated_broker(dir.path());
    let (_, w1) = b.append("t", 0, &[record(b"lead")]).unwrap();
    let Commit::Lead(lead) = b.lead_or_follow(w1.unwrap()) else {
        panic!("the first request leads");
    };
    let (_, w2) = b.append("t", 0, &[record(b"follow")]).unwrap();
    let Commit::Follow(follow) = b.lead_or_follow(w2.unwrap()) else {
        panic!("the commit is led");
    };
    let entered = gate.arm();
    one_thread_runtime().block_on(async {
        let leader = tokio::spawn(lead.commit_off_loop());
        fsync_started(entered).await;
        gate.release(true);
        let led = leader.await.unwrap();
        assert!(
            matches!(led, Err(EngineError::PartitionFailed { .. })),
            "{led:?}"
        );
        let followed = tokio::time::timeout(Duration::from_secs(60), b.follow(follow))
            .await
            .expect("the follower was left waiting");
        assert!(
            matches!(followed, Err(EngineError::PartitionFailed { .. })),
            "{followed:?}"
        );
    });
    assert_eq!(b.offsets("t", 0).unwrap(), (0, 0));
    assert!(b.produce("t", 0, &[record(b"after")]).is_err());
}
