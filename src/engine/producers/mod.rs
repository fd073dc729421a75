//! Idempotent producers on Kafka's model: an init hands out (producer_id, epoch);
//! each batch for a partition carries a base sequence; per (producer_id, partition)
//! the table keeps the last [`BATCHES_KEPT`] batches' sequence ranges and offsets.
//! A duplicate gets its original offsets and writes nothing, a gap is refused as out
//! of order, an older epoch is fenced.
//!
//! Durability: every accepted batch and every handed-out id is an entry of
//! `DATA/producers.journal` ([`crate::format::producers`]), and a batch is
//! acknowledged only once both its records and its entry are durable. An entry is
//! written (page cache) when its batch is accepted, just before the batch's records
//! (under the partition's write lock); entries are group-committed in the broker's
//! flusher passes ([`ProducerTable::sync_pending_through`]): each pass makes every
//! entry written before it durable, by one fdatasync shared with the partitions it
//! fsyncs, so a batch waits for one group commit. The table is also the partitions'
//! journal barrier ([`Journal`], [`crate::engine::partition::journal`]): every sync
//! of a partition's data (a pass's, a commit leader's, a roll's, the zero worker's)
//! first makes the journal durable as far as the partition's records need, by the
//! same coalesced fdatasync, and a pass completes its entries' waiters after its
//! partitions' fsyncs, usually finding them durable already. Power loss: an
//! entry is durable before any sync covers its records, so no power loss keeps a
//! batch's records without its entry, except pages the kernel writes out on its own
//! (writeback) and a record written while its partition's fsync already runs; after
//! such a power loss the retry of that batch is written again.
//!
//! After [`SNAPSHOT_EVERY_ENTRIES`] entries (and at shutdown) the table is written to
//! `producers.json` (atomic replace) and then the journal is cut back to its header.
//! Recovery: snapshot, then the journal's entries in order, dropping entries past a
//! partition's recovered end (their records were lost) and cutting a torn tail.
//!
//! Invariant: at most one batch per (producer_id, partition) is between its check and
//! its record in the table (`in_flight`); a second one is told to retry.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::engine::groups::Waker;
use crate::engine::partition::Journal;
use crate::engine::storage::io::{write_file_atomic, StorageFile, StorageRef};
use crate::format::producers::{
    decode_snapshot, encode_entry, encode_snapshot, journal_header, scan_journal, JournalEntry,
    JournalError, Snapshot, SnapshotBatch, SnapshotProducer, BATCHES_KEPT, ENTRY_LEN_MAX,
    JOURNAL_BYTES_MAX, JOURNAL_FILE, JOURNAL_HEADER_LEN, KIND_BATCH, KIND_INIT, SNAPSHOT_BYTES_MAX,
    SNAPSHOT_FILE,
};

/// Default `producer_id_expiration_ms`: a producer unseen this long is forgotten.
pub const PRODUCER_ID_EXPIRATION_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// Journal entries between snapshots.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 100_000;

// The journal a broker writes between two snapshots stays well inside what readers
// accept (see `JOURNAL_BYTES_MAX`).
const _: () =
    assert!(SNAPSHOT_EVERY_ENTRIES as usize * (4 + ENTRY_LEN_MAX) * 8 <= JOURNAL_BYTES_MAX);

/// Why a batch or init was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProducerError {
    /// Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER.
    #[error("producer {producer_id} on {topic}/{partition}: sequence {got} is out of order (expected {expected})")]
    OutOfOrder {
        producer_id: u64,
        topic: String,
        partition: u32,
        expected: i32,
        got: i32,
    },
    /// Kafka's INVALID_PRODUCER_EPOCH (fenced).
    #[error("producer {producer_id}: epoch {epoch} is fenced by epoch {current}")]
    Fenced {
        producer_id: u64,
        epoch: u16,
        current: u16,
    },
    /// Kafka's UNKNOWN_PRODUCER_ID.
    #[error("producer id {producer_id} is unknown (expired or never handed out)")]
    UnknownProducer { producer_id: u64 },
    /// Another batch of the same producer and partition is being written: retry.
    #[error("producer {producer_id} has a batch in flight on {topic}/{partition}; retry")]
    InFlight {
        producer_id: u64,
        topic: String,
        partition: u32,
    },
    #[error("producer journal: {0}")]
    Storage(String),
    #[error("the broker is shutting down")]
    ShuttingDown,
}

/// What to do with a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Write it; then call [`ProducerTable::accepted`] or [`ProducerTable::abandoned`].
    Append,
    /// Already written: these were its offsets.
    Duplicate { base_offset: u64, last_offset: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Batch {
    base_sequence: i32,
    last_sequence: i32,
    base_offset: u64,
    last_offset: u64,
}

#[derive(Debug, Default)]
struct PartitionState {
    batches: VecDeque<Batch>,
    in_flight: bool,
    /// The in-flight batch once its journal entry is written, until
    /// [`ProducerTable::recorded`]: a snapshot that cuts the journal meanwhile
    /// keeps it, so a restart knows it if its records survive.
    journalled: Option<Batch>,
}

#[derive(Debug)]
struct Producer {
    epoch: u16,
    last_seen_ms: i64,
    partitions: HashMap<(String, u32), PartitionState>,
}

/// Result of a journal write.
pub type Durable = oneshot::Receiver<Result<(), ProducerError>>;

/// A batch whose journal entry is written ([`ProducerTable::journal_batch`]) and
/// whose records are being written; [`ProducerTable::recorded`] takes it once they
/// are.
#[derive(Debug)]
#[must_use = "record the batch once its records are written"]
pub struct Journalled(JournalEntry);

/// Bytes of zeros written ahead of the journal's end at a time: appending an entry
/// then overwrites written blocks, so the group fdatasync commits no new file size
/// (about 15 000 entries a step).
const JOURNAL_ZERO_AHEAD: u64 = 1 << 20;

/// The journal's file as its writer sees it.
#[derive(Debug)]
struct JournalFile {
    f: Box<dyn StorageFile>,
    /// Where the next entry goes: the end of the entries.
    end: u64,
    /// The file's length: the bytes from `end` to it are zeros.
    zeroed: u64,
    /// Set once writing zeros failed: the journal then grows entry by entry.
    zero_failed: bool,
}

impl JournalFile {
    /// After the entry write at `end` of `len` bytes failed (`e`): it may still have
    /// written part or all of the entry, and a whole entry there would be replayed
    /// at the next start, a batch the broker refused counted as written. So its bytes
    /// are zeroed (a zero tail is legal); the journal then goes on at `end`. When the
    /// zeros cannot be written either, the journal fails (`poisoned`): no later entry
    /// is written and no fdatasync runs, so that the refused entry is not made
    /// durable by this process. Returns why the entry failed.
    fn undo_failed_write(
        &mut self,
        poisoned: &Mutex<Option<String>>,
        end: u64,
        len: usize,
        e: &std::io::Error,
    ) -> String {
        let why = format!("writing {JOURNAL_FILE} at byte {end}: {e}");
        match self.f.write_at(&vec![0; len], end) {
            Ok(()) => {
                self.zeroed = self.zeroed.max(end + len as u64);
                tracing::warn!("{why}; the entry's bytes were zeroed, the journal goes on");
                why
            }
            Err(z) => {
                let why = format!(
                    "{why}; zeroing its bytes failed too ({z}): the journal fails until a restart"
                );
                *lock(poisoned) = Some(why.clone());
                why
            }
        }
    }

    /// Writes zeros ahead of `end` when the entry of `len` bytes would pass them
    /// (up to [`JOURNAL_BYTES_MAX`]). A failure only stops zeroing: the entry is
    /// written past the zeros, and the file grows with it.
    fn zero_ahead(&mut self, len: u64) {
        if self.zero_failed || self.end + len <= self.zeroed {
            return;
        }
        static ZEROS: [u8; JOURNAL_ZERO_AHEAD as usize] = [0; JOURNAL_ZERO_AHEAD as usize];
        let from = self.zeroed.max(self.end);
        let to = (from + JOURNAL_ZERO_AHEAD).min(JOURNAL_BYTES_MAX as u64);
        let Some(zeros) = ZEROS.get(..(to.saturating_sub(from)) as usize) else {
            return;
        };
        match self.f.write_at(zeros, from) {
            Ok(()) => self.zeroed = to,
            Err(e) => {
                tracing::warn!(error = %e, "writing zeros ahead of {JOURNAL_FILE} failed; it grows with each entry from now on");
                self.zero_failed = true;
            }
        }
    }
}

#[derive(Debug, Default)]
struct JournalState {
    /// Each waiter with its entry's [`Journal`] position.
    waiters: Vec<(u64, oneshot::Sender<Result<(), ProducerError>>)>,
}

/// The producer-state table and its journal.
#[derive(Debug)]
pub struct ProducerTable {
    dir: PathBuf,
    storage: StorageRef,
    expiration: Duration,
    producers: Mutex<HashMap<u64, Producer>>,
    next_id: AtomicU64,
    journal: Mutex<JournalState>,
    /// The journal, its end and its zero tail: entries are written under this lock.
    file: Mutex<Option<JournalFile>>,
    /// A second handle of the journal, for the group fdatasync.
    sync_file: Box<dyn StorageFile>,
    /// [`Journal`] positions: `written` counts the entries written since the table
    /// opened (raised under `file`, once the write returned), `durable` how many of
    /// them are known durable. Both only grow; `durable <= written`.
    written: AtomicU64,
    durable: AtomicU64,
    /// Held for each group fdatasync: callers that wait for it find their entries
    /// covered and make no system call of their own.
    syncing: Mutex<()>,
    entries_since_snapshot: AtomicU64,
    /// Asks the broker's flusher for a pass (without one, an entry syncs at once).
    wake: Mutex<Option<Waker>>,
    stop: AtomicBool,
    poisoned: Mutex<Option<String>>,
    /// fsyncs of the journal, the snapshot and the data directory.
    pub fsyncs: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the replay of the producers' batches knows of a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionEnd {
    /// Recovered: its records end just before this offset.
    At(u64),
    /// No such partition (its topic was deleted, or has fewer partitions): its
    /// batches are dropped.
    Gone,
    /// Its files are there but were not opened (an offline topic, an unavailable
    /// partition): its batches are kept as they are, for the start that opens it.
    /// Dropping them would lose the duplicate detection of its producers for good.
    Unknown,
}

/// A batch past its partition's recovered `end` (`at`: topic, partition, first and
/// last offset) that starts below it was cut short: its first records are cut off
/// the partition, so that a retry does not write them twice.
fn cut_partial(
    cut: &dyn Fn(&str, u32, u64) -> Result<(), String>,
    end: Option<u64>,
    producer_id: u64,
    at: (&str, u32, u64, u64),
    out: &mut Replay,
) {
    let (topic, partition, base, last) = at;
    let Some(end) = end.filter(|end| base < *end) else {
        return;
    };
    let what = format!(
        "producer {producer_id}'s batch at offsets {base}..={last} is only partly in {topic}/{partition} (its end is {end})"
    );
    out.report.push(match cut(topic, partition, base) {
        Ok(()) => format!("{JOURNAL_FILE}: {what}: cut the partition back to offset {base}"),
        Err(e) => format!(
            "{JOURNAL_FILE}: {what}, and cutting it back to offset {base} failed ({e}): a retry of the batch writes its first {} again",
            crate::engine::error::counted(end - base, "record", "records")
        ),
    });
}

fn now_ms() -> i64 {
    crate::engine::partition::now_ms()
}

/// What recovery did, as report lines.
pub type Report = Vec<String>;

/// Reads the snapshot and journal of `data_dir` (for the tools): the snapshot, the
/// journal's good entries, the good prefix length and the first problem.
/// (snapshot, good entries, good prefix length, first problem, journal exists).
pub type State = (
    Option<Snapshot>,
    Vec<JournalEntry>,
    usize,
    Option<JournalError>,
    bool,
);

/// Why a state file (`producers.json`, `producers.journal`) could not be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{file}: {detail}")]
pub struct StateFileError {
    /// The file's name in the data directory.
    pub file: &'static str,
    pub detail: String,
}

/// Reads a state file whole, after checking that it is a regular file of at most
/// `max` bytes (so a huge or special file is refused before anything is allocated
/// or a read blocks). `Ok(None)` when it does not exist.
pub fn read_state_file(path: &Path, max: usize) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    if meta.len() > max as u64 {
        return Err(format!(
            "file is {} bytes, over the limit of {max}",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    crate::engine::storage::noatime::open_read(path)
        .and_then(|f| f.take(max as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    if bytes.len() > max {
        return Err(format!("file grew past the limit of {max} bytes"));
    }
    Ok(Some(bytes))
}

pub fn read_state(data_dir: &Path) -> Result<State, StateFileError> {
    let err = |file: &'static str| move |detail: String| StateFileError { file, detail };
    let snap = match read_state_file(&data_dir.join(SNAPSHOT_FILE), SNAPSHOT_BYTES_MAX)
        .map_err(err(SNAPSHOT_FILE))?
    {
        Some(b) => Some(decode_snapshot(&b).map_err(err(SNAPSHOT_FILE))?),
        None => None,
    };
    match read_state_file(&data_dir.join(JOURNAL_FILE), JOURNAL_BYTES_MAX)
        .map_err(err(JOURNAL_FILE))?
    {
        Some(b) => {
            let (entries, good, problem) = scan_journal(&b);
            Ok((snap, entries, good, problem, true))
        }
        None => Ok((snap, Vec::new(), 0, None, false)),
    }
}

/// What replaying a snapshot and journal gives: the producers' state, the next
/// producer id, how many batches were dropped (past their partition's end) and what
/// was done, as report lines.
#[derive(Debug)]
struct Replay {
    producers: HashMap<u64, Producer>,
    next_id: u64,
    dropped: u64,
    report: Report,
}

/// Replays the snapshot, then the journal's entries in order (docs/FORMAT.md,
/// Idempotent producers, Recovery). `end_of(topic, partition)` is the partition's
/// recovered end (`None`: no such partition); a batch at or past it is dropped, and
/// one that starts below it is cut off its partition with `cut(topic, partition,
/// base_offset)` first. The broker replays at startup, after its partitions are
/// recovered. Touches no file: `cut` does.
fn replay(
    snap: Option<Snapshot>,
    entries: Vec<JournalEntry>,
    end_of: &dyn Fn(&str, u32) -> PartitionEnd,
    cut: &dyn Fn(&str, u32, u64) -> Result<(), String>,
) -> Replay {
    let mut out = Replay {
        producers: HashMap::new(),
        next_id: 1,
        dropped: 0,
        report: Vec::new(),
    };
    if let Some(s) = snap {
        out.next_id = s.next_producer_id.max(1);
        for p in s.producers {
            let mut partitions: HashMap<(String, u32), PartitionState> = HashMap::new();
            for b in p.batches {
                // A snapshot may be taken while a batch's records are not yet
                // durable: one past the recovered end is dropped like an entry.
                let end = match end_of(&b.topic, b.partition) {
                    PartitionEnd::At(end) => Some(end),
                    PartitionEnd::Gone => None,
                    // Kept: no offset is past an unknown end.
                    PartitionEnd::Unknown => Some(u64::MAX),
                };
                if end.is_none_or(|end| b.last_offset >= end) {
                    let at = (b.topic.as_str(), b.partition, b.base_offset, b.last_offset);
                    cut_partial(cut, end, p.producer_id, at, &mut out);
                    out.dropped += 1;
                    continue;
                }
                partitions
                    .entry((b.topic, b.partition))
                    .or_default()
                    .batches
                    .push_back(Batch {
                        base_sequence: b.base_sequence,
                        last_sequence: b.last_sequence,
                        base_offset: b.base_offset,
                        last_offset: b.last_offset,
                    });
            }
            out.producers.insert(
                p.producer_id,
                Producer {
                    epoch: p.epoch,
                    last_seen_ms: p.last_seen_ms,
                    partitions,
                },
            );
        }
    }
    for e in entries {
        out.next_id = out.next_id.max(e.producer_id + 1);
        let p = out
            .producers
            .entry(e.producer_id)
            .or_insert_with(|| Producer {
                epoch: e.epoch,
                last_seen_ms: e.timestamp_ms,
                partitions: HashMap::new(),
            });
        if e.epoch > p.epoch {
            // A bumped epoch (an init, or a batch that bumped it) starts its
            // sequences again.
            p.epoch = e.epoch;
            p.partitions.clear();
        } else if e.epoch < p.epoch {
            // A batch of a fenced epoch, accepted while the bump was being made:
            // its records were written, but it is no part of the current
            // epoch's sequences (in memory it was not recorded either).
            continue;
        }
        p.last_seen_ms = p.last_seen_ms.max(e.timestamp_ms);
        if e.kind != KIND_BATCH {
            continue;
        }
        let end = match end_of(&e.topic, e.partition) {
            PartitionEnd::At(end) => Some(end),
            PartitionEnd::Gone => None,
            // Kept: no offset is past an unknown end.
            PartitionEnd::Unknown => Some(u64::MAX),
        };
        let past_end = end.is_none_or(|end| e.last_offset >= end);
        if past_end && !planted!(REPLAY_PAST_RECOVERED_END) {
            let at = (e.topic.as_str(), e.partition, e.base_offset, e.last_offset);
            cut_partial(cut, end, e.producer_id, at, &mut out);
            out.dropped += 1;
            continue;
        }
        let st = p
            .partitions
            .entry((e.topic.clone(), e.partition))
            .or_default();
        let b = Batch {
            base_sequence: e.base_sequence,
            last_sequence: e.last_sequence,
            base_offset: e.base_offset,
            last_offset: e.last_offset,
        };
        if !st
            .batches
            .iter()
            .any(|x| x.base_sequence == b.base_sequence)
        {
            st.batches.push_back(b);
            while st.batches.len() > BATCHES_KEPT {
                st.batches.pop_front();
            }
        }
    }
    if out.dropped > 0 {
        let dropped = out.dropped;
        out.report.push(format!(
            "{JOURNAL_FILE}: dropped {dropped} entries past their partition's recovered end"
        ));
    }
    out
}

impl ProducerTable {
    /// Rebuilds the table from snapshot + journal. `end_of(topic, partition)` is what
    /// is known of the partition ([`PartitionEnd`]): entries at or past its recovered
    /// end, or of a partition that is gone, are dropped; those of a partition not
    /// opened are kept. A torn journal tail is cut; a corrupt entry stops the
    /// replay there and is reported with its position (the rest is cut too, after
    /// the report: the batches it covered can be retried as new).
    pub fn open(
        data_dir: &Path,
        storage: StorageRef,
        expiration: Duration,
        end_of: &dyn Fn(&str, u32) -> PartitionEnd,
    ) -> Result<(ProducerTable, Report), ProducerError> {
        Self::open_cutting(data_dir, storage, expiration, end_of, &|_, _, _| {
            Err("nothing may be cut here".into())
        })
    }

    /// [`ProducerTable::open`], where a batch only partly in its partition (its
    /// entry starts below the recovered end and ends at or past it: a write cut short
    /// by a crash, whose records before the cut survived) is cut off the partition
    /// with `cut(topic, partition, base_offset)`, durably, before its entry is
    /// dropped. A batch is then in its partition whole or not at all, as a Kafka
    /// batch is: never acknowledged, its retry writes it again and duplicates
    /// nothing. A failed cut is reported and the entry dropped all the same.
    pub fn open_cutting(
        data_dir: &Path,
        storage: StorageRef,
        expiration: Duration,
        end_of: &dyn Fn(&str, u32) -> PartitionEnd,
        cut: &dyn Fn(&str, u32, u64) -> Result<(), String>,
    ) -> Result<(ProducerTable, Report), ProducerError> {
        let io = |what: &str, e: std::io::Error| ProducerError::Storage(format!("{what}: {e}"));
        let (snap, entries, good, problem, exists) =
            read_state(data_dir).map_err(|e| ProducerError::Storage(e.to_string()))?;
        // Entries already in the journal count towards the next snapshot: without
        // them, restarts could let the journal grow past `JOURNAL_BYTES_MAX`.
        let replayed = entries.len() as u64;
        let Replay {
            producers,
            next_id,
            dropped,
            mut report,
            ..
        } = replay(snap, entries, end_of, cut);
        let path = data_dir.join(JOURNAL_FILE);
        let file = if exists && good >= JOURNAL_HEADER_LEN {
            let f = storage
                .open(&path)
                .map_err(|e| io("opening the journal", e))?;
            let mut len = f.len().map_err(|e| io("reading the journal", e))?;
            if let Some(p) = &problem {
                report.push(format!(
                    "{JOURNAL_FILE}: {p}; cut from {} to {good} bytes",
                    len
                ));
                f.set_len(good as u64)
                    .map_err(|e| io("cutting the journal", e))?;
                f.sync_all().map_err(|e| io("syncing the journal", e))?;
                len = good as u64;
            }
            // Past `good`, what is left is the zero tail.
            (f, good as u64, len.max(good as u64))
        } else {
            if exists {
                report.push(format!(
                    "{JOURNAL_FILE}: {}; replaced by an empty journal",
                    problem.map_or("unreadable".to_string(), |p| p.to_string())
                ));
                storage
                    .remove_file(&path)
                    .map_err(|e| io("removing the journal", e))?;
            }
            let f = storage
                .create(&path)
                .map_err(|e| io("creating the journal", e))?;
            f.write_at(&journal_header(), 0)
                .map_err(|e| io("writing the journal", e))?;
            f.sync_all().map_err(|e| io("syncing the journal", e))?;
            storage
                .sync_dir(data_dir)
                .map_err(|e| io("syncing the data directory", e))?;
            (f, JOURNAL_HEADER_LEN as u64, JOURNAL_HEADER_LEN as u64)
        };
        let file = JournalFile {
            f: file.0,
            end: file.1,
            zeroed: file.2,
            zero_failed: false,
        };
        let sync_file = storage
            .open(&path)
            .map_err(|e| io("opening the journal", e))?;
        let table = ProducerTable {
            dir: data_dir.to_path_buf(),
            storage,
            expiration,
            producers: Mutex::new(producers),
            next_id: AtomicU64::new(next_id),
            journal: Mutex::new(JournalState::default()),
            sync_file,
            written: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            syncing: Mutex::new(()),
            file: Mutex::new(Some(file)),
            entries_since_snapshot: AtomicU64::new(replayed),
            wake: Mutex::new(None),
            stop: AtomicBool::new(false),
            poisoned: Mutex::new(None),
            fsyncs: AtomicU64::new(0),
        };
        if dropped > 0 {
            // The dropped entries must not stay in the journal: once new records
            // fill those offsets, a later recovery would take them for the lost
            // batches. The snapshot holds what was kept; then the journal is cut.
            table.snapshot()?;
        }
        Ok((table, report))
    }

    /// Hands the journal's fdatasync to the broker's group commit: `waker` asks for
    /// a pass, which calls [`ProducerTable::sync_pending`].
    pub fn share_commits(&self, waker: Waker) {
        *lock(&self.wake) = Some(waker);
    }

    /// Syncs what waits, snapshots and cuts the journal; later entries are refused.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        lock(&self.wake).take();
        self.sync_pending();
        let _ = self.snapshot();
    }

    /// Hands out new producer ids from `base` on (unless past it already): a cluster
    /// node takes `node_id << 48`, so ids from different nodes never meet in a
    /// replicated partition.
    pub fn reserve_ids_from(&self, base: u64) {
        self.next_id.fetch_max(base, Ordering::AcqRel);
    }

    /// Hands out a new producer id with epoch 0 or, given the current (id, epoch) of
    /// a known producer, bumps its epoch (fencing the old one; its sequences start
    /// again at 0). Completes once the id is durable.
    pub fn init(
        &self,
        existing: Option<(u64, u16)>,
    ) -> Result<((u64, u16), Durable), ProducerError> {
        if self.stop.load(Ordering::Acquire) {
            return Err(ProducerError::ShuttingDown);
        }
        let at = now_ms();
        let (id, epoch) = match existing {
            None => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                lock(&self.producers).insert(
                    id,
                    Producer {
                        epoch: 0,
                        last_seen_ms: at,
                        partitions: HashMap::new(),
                    },
                );
                (id, 0)
            }
            Some((producer_id, epoch)) => {
                let mut producers = lock(&self.producers);
                let p = producers
                    .get_mut(&producer_id)
                    .ok_or(ProducerError::UnknownProducer { producer_id })?;
                if p.epoch != epoch || epoch == u16::MAX {
                    return Err(ProducerError::Fenced {
                        producer_id,
                        epoch,
                        current: p.epoch,
                    });
                }
                p.epoch += 1;
                p.last_seen_ms = at;
                p.partitions.clear();
                (producer_id, p.epoch)
            }
        };
        let rx = self.journal(&JournalEntry {
            kind: KIND_INIT,
            producer_id: id,
            epoch,
            topic: String::new(),
            partition: 0,
            base_sequence: 0,
            last_sequence: 0,
            base_offset: 0,
            last_offset: 0,
            timestamp_ms: at,
        });
        Ok(((id, epoch), rx))
    }

    /// Checks a batch of `count` records with `base_sequence` against the table.
    ///
    /// As Kafka's producer state does since KIP-360, a batch at sequence 0 starts a
    /// new state: of an id the table does not know (its state expired, or was never
    /// here), if it is one this broker could have handed out (below the next id to
    /// hand out, so an init never hands out an id in use), and of a known producer at
    /// a higher epoch (the client bumped it itself; the older epoch is fenced from
    /// then on). A higher epoch at another sequence is out of order; an unknown id at
    /// another sequence, or past the ids handed out, is unknown.
    pub fn check(
        &self,
        producer_id: u64,
        epoch: u16,
        topic: &str,
        partition: u32,
        base_sequence: i32,
        count: u32,
    ) -> Result<Decision, ProducerError> {
        let mut producers = lock(&self.producers);
        let issued = (1..self.next_id.load(Ordering::Acquire)).contains(&producer_id);
        let p = match producers.entry(producer_id) {
            std::collections::hash_map::Entry::Occupied(p) => p.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) if issued && base_sequence == 0 => v
                .insert(Producer {
                    epoch,
                    last_seen_ms: now_ms(),
                    partitions: HashMap::new(),
                }),
            std::collections::hash_map::Entry::Vacant(_) => {
                return Err(ProducerError::UnknownProducer { producer_id })
            }
        };
        if epoch < p.epoch {
            return Err(ProducerError::Fenced {
                producer_id,
                epoch,
                current: p.epoch,
            });
        }
        if epoch > p.epoch {
            if base_sequence != 0 {
                return Err(ProducerError::OutOfOrder {
                    producer_id,
                    topic: topic.to_string(),
                    partition,
                    expected: 0,
                    got: base_sequence,
                });
            }
            // The bumped epoch's sequences start again, on every partition (as an
            // init's bump); batches of the old epoch still in flight are written
            // but no longer recorded ([`ProducerTable::accepted`]).
            p.epoch = epoch;
            p.partitions.clear();
        }
        p.last_seen_ms = now_ms();
        let st = p
            .partitions
            .entry((topic.to_string(), partition))
            .or_default();
        let last_sequence = base_sequence.saturating_add(count.saturating_sub(1) as i32);
        if let Some(b) = st
            .batches
            .iter()
            .find(|b| b.base_sequence == base_sequence && b.last_sequence == last_sequence)
        {
            return Ok(Decision::Duplicate {
                base_offset: b.base_offset,
                last_offset: b.last_offset,
            });
        }
        if st.in_flight {
            return Err(ProducerError::InFlight {
                producer_id,
                topic: topic.to_string(),
                partition,
            });
        }
        let expected = st
            .batches
            .back()
            .map_or(0, |b| b.last_sequence.wrapping_add(1));
        if base_sequence != expected {
            return Err(ProducerError::OutOfOrder {
                producer_id,
                topic: topic.to_string(),
                partition,
                expected,
                got: base_sequence,
            });
        }
        st.in_flight = true;
        Ok(Decision::Append)
    }

    /// The batch checked with [`Decision::Append`] at `epoch` was not written.
    pub fn abandoned(&self, producer_id: u64, epoch: u16, topic: &str, partition: u32) {
        if let Some(st) = lock(&self.producers)
            .get_mut(&producer_id)
            .filter(|p| p.epoch == epoch)
            .and_then(|p| p.partitions.get_mut(&(topic.to_string(), partition)))
        {
            st.in_flight = false;
        }
    }

    /// Journals a batch checked with [`Decision::Append`] that is about to be written
    /// at `base_offset..=last_offset`: the entry is written to the journal's file now,
    /// before the records are written to theirs (under the partition's write lock,
    /// see [`crate::engine::partition::PartitionLog::append_with`]), so a process
    /// that dies in between leaves an entry past its partition's end, which the next
    /// start drops, and never records whose retry would be written again. Hand the
    /// [`Journalled`] batch to [`ProducerTable::recorded`] once the records are
    /// written. The completion fires once the entry is durable. On an error nothing
    /// was journalled.
    #[expect(clippy::too_many_arguments, reason = "the fields of a journal entry")]
    pub fn journal_batch(
        &self,
        producer_id: u64,
        epoch: u16,
        topic: &str,
        partition: u32,
        base_sequence: i32,
        count: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Result<(Journalled, Durable), ProducerError> {
        let entry = JournalEntry {
            kind: KIND_BATCH,
            producer_id,
            epoch,
            topic: topic.to_string(),
            partition,
            base_sequence,
            last_sequence: base_sequence.saturating_add(count.saturating_sub(1) as i32),
            base_offset,
            last_offset,
            timestamp_ms: now_ms(),
        };
        let durable = self.write_entry_then(&entry, || {
            let batch = Batch {
                base_sequence: entry.base_sequence,
                last_sequence: entry.last_sequence,
                base_offset,
                last_offset,
            };
            if let Some(st) = lock(&self.producers)
                .get_mut(&producer_id)
                .filter(|p| p.epoch == epoch)
                .and_then(|p| p.partitions.get_mut(&(topic.to_string(), partition)))
            {
                st.journalled = Some(batch);
            }
        })?;
        Ok((Journalled(entry), durable))
    }

    /// The batch journalled with [`ProducerTable::journal_batch`] was written: a
    /// retry of it is a duplicate from now on.
    pub fn recorded(&self, batch: &Journalled) {
        let e = &batch.0;
        // A batch of an epoch bumped since its check is written but not recorded:
        // the new epoch's state is not its.
        if let Some(st) = lock(&self.producers)
            .get_mut(&e.producer_id)
            .filter(|p| p.epoch == e.epoch)
            .and_then(|p| p.partitions.get_mut(&(e.topic.clone(), e.partition)))
        {
            st.in_flight = false;
            st.journalled = None;
            st.batches.push_back(Batch {
                base_sequence: e.base_sequence,
                last_sequence: e.last_sequence,
                base_offset: e.base_offset,
                last_offset: e.last_offset,
            });
            while st.batches.len() > BATCHES_KEPT {
                st.batches.pop_front();
            }
        }
    }

    /// [`ProducerTable::journal_batch`] then [`ProducerTable::recorded`], for a batch
    /// already written (tests; the server journals before writing). A failed entry
    /// comes back through the completion.
    #[expect(clippy::too_many_arguments, reason = "the fields of a journal entry")]
    pub fn accepted(
        &self,
        producer_id: u64,
        epoch: u16,
        topic: &str,
        partition: u32,
        base_sequence: i32,
        count: u32,
        base_offset: u64,
        last_offset: u64,
    ) -> Durable {
        let journalled = self.journal_batch(
            producer_id,
            epoch,
            topic,
            partition,
            base_sequence,
            count,
            base_offset,
            last_offset,
        );
        match journalled {
            Ok((batch, durable)) => {
                self.recorded(&batch);
                durable
            }
            Err(err) => {
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(Err(err));
                rx
            }
        }
    }

    /// [`ProducerTable::write_entry`], a failure coming back through the completion.
    fn journal(&self, e: &JournalEntry) -> Durable {
        self.write_entry(e).unwrap_or_else(|err| {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Err(err));
            rx
        })
    }

    /// Writes the entry at the journal's end now (a crash of the process keeps what
    /// was written), then queues its waiter for the next group fdatasync.
    fn write_entry(&self, e: &JournalEntry) -> Result<Durable, ProducerError> {
        self.write_entry_then(e, || {})
    }

    /// [`ProducerTable::write_entry`], running `written` once the entry is written,
    /// still under the journal's lock: no snapshot cuts the entry before `written`
    /// has put what it records in the table.
    fn write_entry_then(
        &self,
        e: &JournalEntry,
        written: impl FnOnce(),
    ) -> Result<Durable, ProducerError> {
        let (tx, rx) = oneshot::channel();
        let mut bytes = Vec::with_capacity(128);
        encode_entry(&mut bytes, e);
        let position;
        {
            let mut file = lock(&self.file);
            if let Some(why) = &*lock(&self.poisoned) {
                return Err(ProducerError::Storage(why.clone()));
            }
            let Some(jf) = file.as_mut() else {
                return Err(ProducerError::ShuttingDown);
            };
            let end = jf.end;
            if end + bytes.len() as u64 > JOURNAL_BYTES_MAX as u64 {
                // Only when snapshots keep failing: a longer journal would be
                // refused at the next start.
                return Err(ProducerError::Storage(format!(
                    "{JOURNAL_FILE} is full ({end} bytes, at most {JOURNAL_BYTES_MAX}): the snapshot that cuts it keeps failing"
                )));
            }
            jf.zero_ahead(bytes.len() as u64);
            if let Err(e) = jf.f.write_at(&bytes, end) {
                return Err(ProducerError::Storage(jf.undo_failed_write(
                    &self.poisoned,
                    end,
                    bytes.len(),
                    &e,
                )));
            }
            jf.end += bytes.len() as u64;
            jf.zeroed = jf.zeroed.max(jf.end);
            position = self.written.fetch_add(1, Ordering::AcqRel) + 1;
            written();
        }
        if planted!(ACK_BEFORE_JOURNAL_DURABLE) {
            let _ = tx.send(Ok(()));
        } else {
            lock(&self.journal).waiters.push((position, tx));
        }
        match &*lock(&self.wake) {
            Some(w) => w.wake(),
            None => self.sync_pending(),
        }
        Ok(rx)
    }

    /// Group commit for every entry written so far: makes them durable and
    /// completes their waiters ([`ProducerTable::sync_pending_through`]).
    pub fn sync_pending(&self) {
        self.sync_pending_through(self.written.load(Ordering::Acquire));
    }

    /// Group commit, one pass: 1. take the waiters whose entries are at positions up
    /// to `upto` or already durable (each one's entry was written and counted before
    /// it was queued), 2. make the entries up to `upto` durable
    /// ([`ProducerTable::sync_through`]: no system call when a partition's journal
    /// barrier already did), 3. complete the waiters. A waiter of a later entry not
    /// yet durable stays queued for the next pass (its writer asked for one after
    /// writing it). A failed sync poisons the journal: later entries fail too.
    pub fn sync_pending_through(&self, upto: u64) {
        // 1.
        let reach = upto.max(self.durable.load(Ordering::Acquire));
        let waiters: Vec<_> = {
            let mut j = lock(&self.journal);
            if j.waiters.iter().all(|(p, _)| *p <= reach) {
                std::mem::take(&mut j.waiters)
            } else {
                let (now, later) = std::mem::take(&mut j.waiters)
                    .into_iter()
                    .partition(|(p, _)| *p <= reach);
                j.waiters = later;
                now
            }
        };
        if waiters.is_empty() {
            return;
        }
        // 2.
        let result = self.sync_through(upto);
        // 3.
        let durable = self.durable.load(Ordering::Acquire);
        let n = waiters.len() as u64;
        for (p, w) in waiters {
            let _ = w.send(if p <= durable { Ok(()) } else { result.clone() });
        }
        if result.is_ok()
            && self.entries_since_snapshot.fetch_add(n, Ordering::Relaxed) + n
                >= SNAPSHOT_EVERY_ENTRIES
        {
            let _ = self.snapshot();
        }
    }

    /// Makes every entry up to position `upto` durable: at once when they are; else
    /// one fdatasync, through a handle of its own so writers go on meanwhile, that
    /// covers every entry counted before it (the count is read under the file lock,
    /// so no entry is half written). One runs at a time: a caller that waited for
    /// another's usually finds its entries covered. A failed fdatasync poisons the
    /// journal; entries durable before it stay durable.
    fn sync_through(&self, upto: u64) -> Result<(), ProducerError> {
        if self.durable.load(Ordering::Acquire) >= upto {
            return Ok(());
        }
        let _one = lock(&self.syncing);
        if self.durable.load(Ordering::Acquire) >= upto {
            return Ok(());
        }
        if let Some(why) = &*lock(&self.poisoned) {
            return Err(ProducerError::Storage(why.clone()));
        }
        let covered = {
            let _file = lock(&self.file);
            self.written.load(Ordering::Acquire)
        };
        self.sync_file.sync_data().map_err(|e| {
            let why = format!("syncing {JOURNAL_FILE}: {e}");
            *lock(&self.poisoned) = Some(why.clone());
            ProducerError::Storage(why)
        })?;
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.durable.fetch_max(covered, Ordering::AcqRel);
        Ok(())
    }

    /// Entries written since the table opened, and how many of them are known
    /// durable ([`Journal`] positions).
    pub fn positions(&self) -> (u64, u64) {
        (
            self.written.load(Ordering::Acquire),
            self.durable.load(Ordering::Acquire),
        )
    }

    /// Writes `producers.json` (dropping expired producers), then cuts the journal to
    /// its header. Order: 1. snapshot replaced atomically (durable), 2. journal cut
    /// and fsynced. A crash between them replays entries the snapshot already holds,
    /// which is harmless (replay skips batches it has).
    pub fn snapshot(&self) -> Result<(), ProducerError> {
        let mut file = lock(&self.file);
        let cutoff = now_ms() - self.expiration.as_millis() as i64;
        let snap = {
            let mut producers = lock(&self.producers);
            producers.retain(|_, p| p.last_seen_ms >= cutoff);
            let mut list: Vec<SnapshotProducer> = producers
                .iter()
                .map(|(id, p)| SnapshotProducer {
                    producer_id: *id,
                    epoch: p.epoch,
                    last_seen_ms: p.last_seen_ms,
                    batches: p
                        .partitions
                        .iter()
                        // A batch journalled and not yet recorded is kept too: its
                        // entry leaves the journal with this cut.
                        .flat_map(|((t, part), st)| {
                            st.batches
                                .iter()
                                .chain(&st.journalled)
                                .map(move |b| SnapshotBatch {
                                    topic: t.clone(),
                                    partition: *part,
                                    base_sequence: b.base_sequence,
                                    last_sequence: b.last_sequence,
                                    base_offset: b.base_offset,
                                    last_offset: b.last_offset,
                                })
                        })
                        .collect(),
                })
                .collect();
            list.sort_by_key(|p| p.producer_id);
            Snapshot {
                version: 1,
                next_producer_id: self.next_id.load(Ordering::Relaxed),
                producers: list,
            }
        };
        let err = |e: std::io::Error| ProducerError::Storage(e.to_string());
        // 1.
        write_file_atomic(
            &*self.storage,
            &self.dir,
            SNAPSHOT_FILE,
            &encode_snapshot(&snap),
        )
        .map_err(err)?;
        self.fsyncs.fetch_add(2, Ordering::Relaxed);
        // 2.
        if let Some(jf) = file.as_mut() {
            jf.f.set_len(JOURNAL_HEADER_LEN as u64).map_err(err)?;
            jf.f.sync_all().map_err(err)?;
            self.fsyncs.fetch_add(1, Ordering::Relaxed);
            jf.end = JOURNAL_HEADER_LEN as u64;
            jf.zeroed = jf.end;
            // What the cut entries recorded is in the durable snapshot (the file lock
            // keeps the count still).
            self.durable
                .fetch_max(self.written.load(Ordering::Acquire), Ordering::AcqRel);
        }
        self.entries_since_snapshot.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Forgets every batch of `topic` and makes that durable with a snapshot (which
    /// also cuts the journal), before the topic's files are deleted. Without it a
    /// topic created again under the same name would meet the old topic's batches
    /// at the next start, and recovery would take the new records for a batch only
    /// partly written and cut them (acknowledged records lost). The topic's logs are
    /// closed first, so no batch of it is being journalled.
    pub fn forget_topic(&self, topic: &str) -> Result<(), ProducerError> {
        for p in lock(&self.producers).values_mut() {
            p.partitions.retain(|(t, _), _| t != topic);
        }
        self.snapshot()
    }

    /// Producers known: id → (epoch, partitions with state).
    pub fn describe(&self) -> BTreeMap<u64, (u16, usize)> {
        lock(&self.producers)
            .iter()
            .map(|(id, p)| (*id, (p.epoch, p.partitions.len())))
            .collect()
    }
}

/// The partitions' journal barrier ([`crate::engine::partition::journal`]): a
/// partition's data is synced only once the entries of its records are durable.
impl Journal for ProducerTable {
    fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    fn sync_to(&self, upto: u64) -> Result<(), String> {
        self.sync_through(upto).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests;
