//! An idempotent batch and its producer-journal entry across failures: the entry is
//! written before the records, a batch a crash cut short is cut off whole at the next
//! start, a write that fails after the entry fails the partition, and no sync of a
//! partition's data starts before the journal entries of its records are durable.

use std::fs;
use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use seglog::engine::broker::{
    AppendError, Broker, BrokerOptions, DurableWait, EngineError, NewRecord,
};
use seglog::engine::producers::{Decision, Durable, ProducerError, ProducerTable};
use seglog::format::decode_record;
use seglog::format::record::record_len;
use seglog::format::topic::TopicConfig;
use seglog::testkit::storage::{Call, Hook, HookStorage, Op};

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

/// An idempotent batch on t/0 written, not yet acknowledged: its first offset, what
/// its records' durability waits for, and its entry's completion.
type Written = (u64, Option<DurableWait>, Durable);

/// One idempotent batch on t/0 written the way the servers write it: checked, then
/// journalled before its records are written.
fn journalled(
    b: &Broker,
    table: &ProducerTable,
    (pid, epoch): (u64, u16),
    seq: i32,
    values: &[&[u8]],
) -> Result<Written, AppendError<ProducerError>> {
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
    Ok((r.base_offset, wait, journal))
}

/// Waits until a [`journalled`] batch may be acknowledged: records and entry
/// durable.
fn acknowledged(b: &Broker, (base, wait, journal): Written) -> u64 {
    if let Some(w) = wait {
        b.wait_durable_here(w).unwrap();
    }
    journal.blocking_recv().unwrap().unwrap();
    base
}

/// One idempotent batch on t/0 the way the servers write it: checked, journalled
/// before its records are written, acknowledged once both are durable.
fn idempotent(
    b: &Broker,
    table: &ProducerTable,
    id: (u64, u16),
    seq: i32,
    values: &[&[u8]],
) -> Result<u64, AppendError<ProducerError>> {
    journalled(b, table, id, seq, values).map(|w| acknowledged(b, w))
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

/// What a [`SyncOrder`] storage saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// The test's note of what it does next.
    Note(&'static str),
    /// A write to the file returned.
    Wrote(PathBuf),
    /// A sync of the file (`sync_data` or `sync_all`) is about to run.
    Syncing(PathBuf),
    /// A sync of the file returned.
    Synced(PathBuf),
}

/// The flusher's syncs of the files below `dir` wait while `armed`: the n-th to
/// arrive goes on once `let_through` reaches n.
#[derive(Debug, Default)]
struct Gate {
    dir: PathBuf,
    armed: bool,
    arrived: u64,
    let_through: u64,
}

/// A hook that records writes and file syncs in order, can hold the flusher
/// thread's syncs of one partition at a gate (so that no pass of it makes the
/// journal durable meanwhile), and can fail the journal's syncs.
#[derive(Debug, Default)]
struct SyncOrder {
    seen: Mutex<Vec<Seen>>,
    /// Notified at every entry of `seen`.
    grew: Condvar,
    gate: Mutex<Gate>,
    moved: Condvar,
    fail_journal_syncs: AtomicBool,
}

impl Hook for SyncOrder {
    fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
        if !matches!(op.call, Call::SyncData | Call::SyncAll) {
            return None;
        }
        if std::thread::current().name() == Some("seglog-flusher") {
            let mut g = self.gate.lock().unwrap();
            if g.armed && op.path.starts_with(&g.dir) {
                g.arrived += 1;
                let me = g.arrived;
                self.moved.notify_all();
                while g.armed && g.let_through < me {
                    g = self.moved.wait(g).unwrap();
                }
            }
        }
        self.seen_now(Seen::Syncing(op.path.to_path_buf()));
        let journal = op.path.ends_with("producers.journal");
        (journal && self.fail_journal_syncs.load(Ordering::SeqCst))
            .then(|| Err(io::Error::other("journal sync refused")))
    }

    fn after(&self, op: &Op<'_>) {
        match op.call {
            Call::WriteAt { .. } => self.seen_now(Seen::Wrote(op.path.to_path_buf())),
            Call::SyncData | Call::SyncAll => {
                self.seen_now(Seen::Synced(op.path.to_path_buf()));
            }
            _ => {}
        }
    }
}

impl SyncOrder {
    fn seen_now(&self, s: Seen) {
        self.seen.lock().unwrap().push(s);
        self.grew.notify_all();
    }

    /// Returns once a sync of a file below `dir` has returned after the note `from`.
    fn wait_synced(&self, from: &'static str, dir: &Path) {
        let mut seen = self.seen.lock().unwrap();
        loop {
            let after = seen.iter().skip_while(|s| **s != Seen::Note(from));
            if after
                .into_iter()
                .any(|s| matches!(s, Seen::Synced(p) if p.starts_with(dir)))
            {
                return;
            }
            seen = self.grew.wait(seen).unwrap();
        }
    }

    fn note(&self, what: &'static str) {
        self.seen_now(Seen::Note(what));
    }

    /// From now on the flusher's syncs of files below `dir` wait at the gate.
    fn hold_flusher(&self, dir: PathBuf) {
        let mut g = self.gate.lock().unwrap();
        *g = Gate {
            dir,
            armed: true,
            ..Gate::default()
        };
    }

    /// Returns once `n` syncs have arrived at the gate.
    fn wait_arrived(&self, n: u64) {
        let mut g = self.gate.lock().unwrap();
        while g.arrived < n {
            g = self.moved.wait(g).unwrap();
        }
    }

    /// Lets the first `n` syncs at the gate go on; later ones still wait.
    fn let_through(&self, n: u64) {
        self.gate.lock().unwrap().let_through = n;
        self.moved.notify_all();
    }

    /// Opens the gate for good.
    fn release(&self) {
        self.gate.lock().unwrap().armed = false;
        self.moved.notify_all();
    }

    /// What was seen after the note `from`.
    fn seen_after(&self, from: &'static str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        let at = seen
            .iter()
            .position(|s| *s == Seen::Note(from))
            .expect("the note");
        seen[at + 1..].to_vec()
    }

    /// After the note `from`: an entry written to `journal`, then records to a file
    /// below `part`; the first sync of a file below `part` after them starts only once
    /// a sync of the journal that started after the entry has returned.
    fn assert_journal_synced_first(&self, from: &'static str, journal: &Path, part: &Path) {
        let seen = self.seen_after(from);
        let find = |start: usize, want: &dyn Fn(&Seen) -> bool| {
            seen.iter().skip(start).position(want).map(|i| i + start)
        };
        let entry = find(0, &|s| matches!(s, Seen::Wrote(p) if p == journal)).expect("entry");
        let recs = find(
            entry,
            &|s| matches!(s, Seen::Wrote(p) if p.starts_with(part)),
        )
        .expect("records");
        let data_sync = find(
            recs,
            &|s| matches!(s, Seen::Syncing(p) if p.starts_with(part)),
        )
        .expect("a sync of the partition");
        let journal_sync = find(entry, &|s| matches!(s, Seen::Syncing(p) if p == journal))
            .and_then(|i| find(i, &|s| matches!(s, Seen::Synced(p) if p == journal)));
        assert!(
            journal_sync.is_some_and(|j| j < data_sync),
            "the partition's sync (at {data_sync}) started before the journal entry (at {entry}) was durable: {seen:#?}"
        );
    }
}

/// A broker on `dir` over a [`SyncOrder`] storage, with topic t (two partitions)
/// and an idempotent producer.
fn sync_ordered(dir: &Path) -> (Arc<Broker>, Arc<ProducerTable>, (u64, u16), Arc<SyncOrder>) {
    sync_ordered_with(dir, opts())
}

fn sync_ordered_with(
    dir: &Path,
    opts: BrokerOptions,
) -> (Arc<Broker>, Arc<ProducerTable>, (u64, u16), Arc<SyncOrder>) {
    let order = Arc::new(SyncOrder::default());
    let storage = HookStorage::shared(real(), order.clone());
    let b = Broker::open(dir, Arc::new(storage), opts).unwrap();
    b.create_topic("t", 2, TopicConfig::default()).unwrap();
    let table = b.producers().clone();
    let (id, init) = table.init(None).unwrap();
    init.blocking_recv().unwrap().unwrap();
    (b, table, id, order)
}

/// Asks the flusher for a pass that fsyncs t/1 (one record written to it first).
fn flush_other_partition(b: &Broker, value: &[u8]) {
    let (_, wait) = b.append("t", 1, &records(&[value])).unwrap();
    b.flush_soon(wait.unwrap());
}

#[test]
fn a_produce_commit_makes_the_journal_durable_before_it_syncs_idempotent_records() {
    let dir = tempfile::tempdir().unwrap();
    let (b, table, id, order) = sync_ordered(dir.path());
    // The flusher is held inside a pass (at its fsync of t/1) until the end: no pass
    // of its makes the journal durable meanwhile.
    order.hold_flusher(dir.path().join("topics/t/1"));
    flush_other_partition(&b, b"q");
    order.wait_arrived(1);
    order.note("idempotent");
    let pending = journalled(&b, &table, id, 0, &[b"i0", b"i1"]).unwrap();
    // A plain produce to the same partition: its group commit, run on this thread,
    // fsyncs t/0, the idempotent records with it.
    assert_eq!(
        b.produce("t", 0, &records(&[b"plain"]))
            .unwrap()
            .base_offset,
        2
    );
    order.release();
    assert_eq!(acknowledged(&b, pending), 0);
    order.assert_journal_synced_first(
        "idempotent",
        &dir.path().join("producers.journal"),
        &dir.path().join("topics/t/0"),
    );
    b.shutdown().unwrap();
}

#[test]
fn a_flusher_pass_makes_the_journal_durable_again_for_records_written_after_its_first_step() {
    let dir = tempfile::tempdir().unwrap();
    let (b, table, id, order) = sync_ordered(dir.path());
    order.hold_flusher(dir.path().join("topics/t/1"));
    // Pass 1 is held at its fsync of t/1 while the next pass's partitions are asked
    // for: t/1, then t/0.
    flush_other_partition(&b, b"q0");
    order.wait_arrived(1);
    flush_other_partition(&b, b"q1");
    let (_, wait) = b.append("t", 0, &records(&[b"plain"])).unwrap();
    b.flush_soon(wait.unwrap());
    order.let_through(1);
    // Pass 2 ran its step 1 (the journal) and is held at its fsync of t/1, before
    // t/0's: the idempotent batch is written between the two steps.
    order.wait_arrived(2);
    order.note("idempotent");
    let pending = journalled(&b, &table, id, 0, &[b"i0", b"i1"]).unwrap();
    order.release();
    // The pass's fsync of t/0 covers the batch: no commit of this thread's runs.
    let part = dir.path().join("topics/t/0");
    order.wait_synced("idempotent", &part);
    assert_eq!(acknowledged(&b, pending), 1);
    order.assert_journal_synced_first("idempotent", &dir.path().join("producers.journal"), &part);
    b.shutdown().unwrap();
}

#[test]
fn the_zero_workers_fsync_makes_the_journal_durable_before_it_writes_out_idempotent_records() {
    let dir = tempfile::tempdir().unwrap();
    let zeroing = BrokerOptions {
        preallocate_bytes: 1 << 20,
        zero_ahead: true,
        ..BrokerOptions::default()
    };
    let (b, table, id, order) = sync_ordered_with(dir.path(), zeroing);
    order.hold_flusher(dir.path().join("topics/t/1"));
    flush_other_partition(&b, b"q");
    order.wait_arrived(1);
    // Just short of the 64 KiB from which a segment is zeroed ahead.
    let plain = vec![b'p'; 60 * 1024];
    b.produce("t", 0, &records(&[&plain])).unwrap();
    order.note("idempotent");
    // The batch takes the segment past it: the zero worker starts, and its fsync of
    // the file writes out the batch's records as well.
    let value = vec![b'i'; 8 * 1024];
    let pending = journalled(&b, &table, id, 0, &[&value]).unwrap();
    let part = dir.path().join("topics/t/0");
    order.wait_synced("idempotent", &part);
    order.release();
    assert_eq!(acknowledged(&b, pending), 1);
    order.assert_journal_synced_first("idempotent", &dir.path().join("producers.journal"), &part);
    b.shutdown().unwrap();
}

#[test]
fn a_partition_is_not_synced_when_its_records_entries_cannot_be_made_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (b, table, id, order) = sync_ordered(dir.path());
    order.fail_journal_syncs.store(true, Ordering::SeqCst);
    order.note("idempotent");
    let (_, _wait, journal) = journalled(&b, &table, id, 0, &[b"i0"]).unwrap();
    // The plain produce's group commit would make the idempotent record durable
    // without its entry: it is not run, and the partition fails.
    match b.produce("t", 0, &records(&[b"plain"])) {
        Err(EngineError::PartitionFailed { reason, .. }) => {
            let why = reason.to_string();
            assert!(
                why.contains("not run") && why.contains("journal sync refused"),
                "{why}"
            );
        }
        other => panic!("expected the partition to fail: {other:?}"),
    }
    assert!(journal.blocking_recv().unwrap().is_err());
    let part = dir.path().join("topics/t/0");
    let seen = order.seen_after("idempotent");
    assert!(
        !seen
            .iter()
            .any(|s| matches!(s, Seen::Syncing(p) if p.starts_with(&part))),
        "{seen:#?}"
    );
    // The other partition holds no idempotent records: it goes on.
    assert_eq!(
        b.produce("t", 1, &records(&[b"other"]))
            .unwrap()
            .base_offset,
        0
    );
    drop(b);
}
