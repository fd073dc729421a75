//! The partition log: one directory of segments, appended to under a write lock,
//! made durable by shared fsyncs (group commit), read by positional reads.
//!
//! Invariants:
//! - Offsets are assigned under the write lock and are consecutive.
//! - One produce request is one `write_at` on the active log (plus at most one on its
//!   index). A write that fails part-way is cut off and the cut fsynced before the
//!   error is returned; if that fails, or any fsync fails, the log is *failed*: it
//!   refuses writes until a restart runs recovery, and nothing written after the last
//!   good fsync is ever acknowledged or served.
//! - `durable_end` (next offset not yet durable) only grows, and only after an fsync
//!   that covers every record below it, including the syncs a roll left pending
//!   (docs/FORMAT.md, Segment states: the new segment's header, written only after
//!   the outgoing segment is durable, is the roll's commit record; a roll starts only
//!   once the previous roll is durable). Readers never see a record at or past it: each
//!   segment's `readable_end` is published before `durable_end` and only after the
//!   fsync that covers it.
//! - The segment list is an immutable snapshot swapped under a lock; a reader keeps the
//!   segments (and their open files) it took, whatever happens to the list after.
//! - Lock order: `write` → `sync` → `segments`. Nothing holds `sync` while taking
//!   `write`, and no fsync runs while `write` is held, except the fsync of a cut after a
//!   failed write (an error path).
//! - No sync of a log's file runs before the producer journal is durable as far as
//!   the log's records need ([`journal`]): a journalled append raises the log's need
//!   before its records are written, and every file sync helper runs the barrier
//!   just before its system call. The barrier takes only the journal's locks.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::engine::error::{AppendError, EngineError, FailureReason};
use crate::engine::storage::io::{Storage, StorageFile, StorageRef};
use crate::engine::storage::reader::{read_header, resync, scan_segment, RecordReader, ScanEnd};
use crate::format::index::{decode_index, lookup};
use crate::format::names::{
    classify_partition_file, index_file_name, log_file_name, PartitionFile,
};
use crate::format::record::{record_len, LEN_FIELD};
use crate::format::topic::TopicConfig;
use crate::format::{
    encode_index, encode_record, IndexBuilder, IndexEntry, RecordError, SegmentHeader, HEADER_LEN,
    INDEX_ENTRY_LEN, INDEX_INTERVAL_BYTES,
};

/// Largest produce request a log accepts, in encoded bytes.
pub const BATCH_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Largest `max_bytes` a fetch honours; larger requests are served this much.
pub use crate::format::wire::FETCH_BYTES_MAX;
/// Smallest read a fetch makes (beyond the scan from the index entry).
const FETCH_READ_MIN_BYTES: u64 = 64 * 1024;

/// One record to append.
#[derive(Clone, Copy, Debug)]
pub struct NewRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// Milliseconds since the epoch; -1: the log assigns the current time.
    pub timestamp_ms: i64,
}

/// Whole records in their on-disk encoding, all from one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchChunk {
    /// The segment's generation: decode with `format::decode_record(bytes, _, generation)`.
    pub generation: u64,
    pub bytes: Vec<u8>,
}

/// Counters and state shared by every log of a broker.
#[derive(Debug, Default)]
pub struct LogStats {
    pub fsyncs: AtomicU64,
    pub produce_requests: AtomicU64,
    pub records_appended: AtomicU64,
    /// Records each group commit made durable (one value per fsync that covered
    /// records).
    pub commit_records: zero::Pow2Histogram,
    /// The read handles of every log's sealed segments.
    pub files: Arc<FileCache>,
    /// Preallocation and zero-ahead settings and their counters.
    pub write_path: WritePath,
    /// The node's spare segment files.
    pub spares: SparePool,
    /// The idempotent producers' journal, once the broker opened it: a partition's
    /// data is never synced before the entries of its records ([`journal`]).
    pub journal: OnceLock<Arc<dyn Journal>>,
}

/// Why a log stopped taking requests for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Its topic was deleted.
    Deleted,
    /// The broker is shutting down.
    ShuttingDown,
}

/// What an append did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: u64,
    pub last_offset: u64,
    /// Records written but not yet covered by an fsync, this batch included.
    pub unflushed: u64,
}

/// One segment as readers see it: its own read handle and its index in memory.
#[derive(Debug)]
pub struct Segment {
    pub base_offset: u64,
    pub generation: u64,
    path: PathBuf,
    file: SegmentFile,
    /// Index entries; only the active segment's grow (under the log's write lock).
    index: RwLock<Vec<IndexEntry>>,
    /// End of the data written so far.
    written_end: AtomicU64,
    /// End of the data covered by an fsync: readers stop here.
    readable_end: AtomicU64,
    /// Largest record timestamp, once the segment is sealed (`None`: no records).
    /// Set at the roll for segments this process sealed, else by a scan on demand.
    max_timestamp: OnceLock<Option<i64>>,
    /// Records in the segment: from the scan at open (active segment), kept up to
    /// date by appends; for a sealed segment opened from disk, set by its tally.
    records: AtomicU64,
    /// Set once a sealed segment is counted (or sealed by this process): the damage
    /// its scan met, if any (`tally.rs`); a scrub's scan replaces it.
    tally: RwLock<Option<Option<read::SegmentDamage>>>,
}

impl Segment {
    /// A new segment at `path`, its file opened at `open_at` (a spare's name until
    /// the roll's group commit renames it to `path`).
    fn new(
        base_offset: u64,
        generation: u64,
        path: PathBuf,
        open_at: &Path,
        data_end: u64,
        cache: &Arc<FileCache>,
    ) -> io::Result<Self> {
        let file = SegmentFile::held(path.clone(), File::open(open_at)?, cache.clone());
        Ok(Segment {
            base_offset,
            generation,
            path,
            file,
            index: RwLock::new(Vec::new()),
            written_end: AtomicU64::new(data_end),
            readable_end: AtomicU64::new(data_end),
            max_timestamp: OnceLock::new(),
            records: AtomicU64::new(0),
            tally: RwLock::new(None),
        })
    }

    /// Path of the segment's `.log` file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of data written to the segment, header included.
    pub fn bytes(&self) -> u64 {
        self.written_end.load(Ordering::Acquire)
    }

    /// The segment's read handle: the file it was opened as, even once unlinked
    /// (reopened by path when a sealed segment's handle left the cache).
    pub fn file(&self) -> io::Result<Arc<File>> {
        self.file.get()
    }

    /// The segment's index as it is held in memory, encoded as in a `.index` file.
    pub fn index_bytes(&self) -> Vec<u8> {
        encode_index(&self.index.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The largest record timestamp of a *sealed* segment (`None` when it holds no
    /// records). Known from the roll for segments this process sealed; otherwise the
    /// first call scans the segment through its read handle, and the answer is kept.
    pub fn max_timestamp(&self) -> Result<Option<i64>, EngineError> {
        if let Some(ts) = self.max_timestamp.get() {
            return Ok(*ts);
        }
        let io_err = |e| EngineError::io(format!("reading {}", self.path.display()), e);
        let len = self.bytes();
        let file = self.file().map_err(io_err)?;
        let header = checked_header(&file, len, &self.path, self.base_offset)?;
        let scan = scan_segment(&file, &header, len, |_, _| {}).map_err(io_err)?;
        if !matches!(scan.end, ScanEnd::Eof) {
            return Err(EngineError::Corrupt {
                path: self.path.clone(),
                detail: format!(
                    "sealed segment does not read to its end ({})",
                    scan.end.detail()
                ),
            });
        }
        Ok(*self.max_timestamp.get_or_init(|| scan.max_timestamp_ms))
    }
}

/// The segment being appended to, with its write handles.
#[derive(Debug)]
struct Active {
    seg: Arc<Segment>,
    log: Arc<dyn StorageFile>,
    index: ActiveIndex,
    /// End of the valid data: the next record goes here.
    data_end: u64,
    /// Length of the log file (may exceed `data_end` by a zero tail).
    file_len: u64,
    index_len: u64,
    builder: IndexBuilder,
    /// Wall-clock time the segment began, for `segment_ms`.
    born_ms: i64,
    /// Largest record timestamp written to it so far.
    max_timestamp: Option<i64>,
    /// Its zero-ahead and preallocation state, shared with the zero worker.
    zero: Arc<ZeroTarget>,
}

/// What a roll left for the next group commit (docs/FORMAT.md, Segment states).
#[derive(Debug)]
struct PendingRoll {
    /// To truncate to `cut_to` (when its file is longer than its data) and `sync_all`
    /// first: the last data and the truncation.
    outgoing_log: Arc<dyn StorageFile>,
    cut_to: Option<u64>,
    outgoing_index: Arc<dyn StorageFile>,
    /// Created with a zero header (or a spare's); `header` is written to it only
    /// once the outgoing segment is durable, then fsynced, then the directory.
    new_log: Arc<dyn StorageFile>,
    /// A spare the roll took, still in `spares/` under its own name: the commit
    /// renames it to the new segment's name (after the outgoing segment is durable,
    /// before the header), and creates `new_index`.
    place: Option<PlaceSpare>,
    new_zero: Arc<ZeroTarget>,
    header: [u8; HEADER_LEN],
    /// The spare directory the new log was renamed from (fsynced with the
    /// partition directory), when the roll took a spare.
    spares_dir: Option<PathBuf>,
}

/// A spare a roll took: renamed from `from` (in `spares/`) to `to` (`<base>.log`) by
/// the roll's group commit, which also creates `index` (`<base>.index`).
#[derive(Debug)]
struct PlaceSpare {
    from: PathBuf,
    to: PathBuf,
    index: PathBuf,
}

/// Syncs that a roll left for the next group commit.
#[derive(Debug, Default)]
struct Pending {
    /// At most one: a roll starts only once the previous roll is durable.
    roll: Option<PendingRoll>,
    /// Segments sealed since, with their final data end.
    sealed: Vec<(Arc<Segment>, u64)>,
}

#[derive(Debug)]
struct WriteState {
    active: Active,
    next_offset: u64,
    pending: Pending,
    /// Rolls made since the log opened.
    rolls: u64,
    /// An event-loop request holds this log's next group commit
    /// ([`PartitionLog::claim_commit`]): a request that appends meanwhile is covered
    /// by it, since the holder takes its target only when it releases the claim.
    commit_claimed: bool,
}

#[derive(Debug)]
struct SyncState {
    /// Every offset below this is durable.
    durable_end: u64,
    /// A thread is running an fsync for this log.
    syncing: bool,
    /// Set by the first failed fsync (or failed cut); never cleared.
    failed: Option<FailureReason>,
    closed: Option<Closed>,
}

/// What one group-commit fsync covers, taken under the write lock.
struct SyncPlan {
    target: u64,
    /// Rolls the plan's syncs cover (every roll made before it was taken).
    rolls: u64,
    pending: Pending,
    active_log: Arc<dyn StorageFile>,
    active_seg: Arc<Segment>,
    active_zero: Arc<ZeroTarget>,
    active_end: u64,
}

/// One partition's log.
#[derive(Debug)]
pub struct PartitionLog {
    topic: String,
    partition: u32,
    dir: PathBuf,
    storage: StorageRef,
    stats: Arc<LogStats>,
    write: Mutex<WriteState>,
    sync: Mutex<SyncState>,
    /// Notified after every fsync attempt, failure and close.
    synced: Condvar,
    /// The durable end for async waiters ([`notify`]): bumped by every publish,
    /// failure and close.
    durable_tx: tokio::sync::watch::Sender<u64>,
    segments: RwLock<Arc<Vec<Arc<Segment>>>>,
    /// Files of segments retention dropped from the list but could not delete yet
    /// (a log file with its generation may go to the spare pool instead).
    doomed: Mutex<Vec<Doomed>>,
    /// Rolls whose new segment (name, header) and outgoing segment are durable.
    rolls_durable: AtomicU64,
    /// Segments found lost at open (their `.log` gone, their `.index` kept), in
    /// offset order: a fetch never reads across them silently. One leaves once a
    /// mend writes it again ([`PartitionLog::insert_found`]).
    lost: RwLock<Vec<LostSegment>>,
    /// How far the journal must be durable before this log's data is synced.
    journal: Arc<JournalNeed>,
    /// The file system holding `dir`, read once at open: a roll takes a spare only
    /// from a pool on the same one ([`spares::SparePool::take`]).
    file_system: Option<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl PartitionLog {
    /// Opens the log in `dir` as recovery left it: sealed segments are trusted with
    /// their index (rebuilt in memory if unreadable), the active segment is scanned in
    /// full, and everything is fsynced before it is served as durable. A torn or
    /// corrupt tail in the active segment refuses the open: only recovery cuts data.
    /// Returns the log and notes for the startup report.
    pub fn open(
        topic: &str,
        partition: u32,
        dir: &Path,
        storage: StorageRef,
        stats: Arc<LogStats>,
    ) -> Result<(PartitionLog, Vec<String>), EngineError> {
        Self::open_capped(topic, partition, dir, storage, stats, u64::MAX)
    }

    /// [`PartitionLog::open`] for a topic whose segments roll at `segment_bytes`: the
    /// active segment's reservation stops there, as it does once appends run (an
    /// append past it rolls).
    pub fn open_capped(
        topic: &str,
        partition: u32,
        dir: &Path,
        storage: StorageRef,
        stats: Arc<LogStats>,
        segment_bytes: u64,
    ) -> Result<(PartitionLog, Vec<String>), EngineError> {
        let mut notes = Vec::new();
        let (bases, lost) = list_segments(dir)?;
        let (sealed, active_base) = match bases.split_last() {
            Some((last, sealed)) => (sealed.to_vec(), *last),
            None => {
                create_first_segment(&*storage, dir, &stats)?;
                notes.push(format!(
                    "{}: no segment found, created an empty one at offset 0",
                    dir.display()
                ));
                (Vec::new(), 0)
            }
        };
        let mut segments = Vec::with_capacity(sealed.len() + 1);
        for base in sealed {
            segments.push(Arc::new(open_sealed(dir, base, &stats.files, &mut notes)?));
        }
        let journal = Arc::new(JournalNeed::default());
        let (active, next_offset) = open_active(
            &*storage,
            dir,
            active_base,
            &stats.files,
            &stats.write_path,
            &journal,
            segment_bytes,
            &mut notes,
        )?;
        segments.push(active.seg.clone());
        sync_on_open(&*storage, dir, &segments, &*active.log, &stats)?;
        let log = PartitionLog {
            topic: topic.to_string(),
            partition,
            dir: dir.to_path_buf(),
            storage,
            stats,
            write: Mutex::new(WriteState {
                active,
                next_offset,
                pending: Pending::default(),
                rolls: 0,
                commit_claimed: false,
            }),
            sync: Mutex::new(SyncState {
                durable_end: next_offset,
                syncing: false,
                failed: None,
                closed: None,
            }),
            synced: Condvar::new(),
            durable_tx: tokio::sync::watch::Sender::new(next_offset),
            segments: RwLock::new(Arc::new(segments)),
            doomed: Mutex::new(Vec::new()),
            rolls_durable: AtomicU64::new(0),
            lost: RwLock::new(lost),
            journal,
            file_system: spares::file_system_of(dir),
        };
        Ok((log, notes))
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current segment list.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Segment>>> {
        self.segments
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn publish(&self, segments: Vec<Arc<Segment>>) {
        assert!(!segments.is_empty(), "a log keeps its active segment");
        debug_assert!(
            segments
                .windows(2)
                .all(|p| matches!(p, [a, b] if a.base_offset < b.base_offset)),
            "segment list not sorted by base offset"
        );
        *self
            .segments
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(segments);
    }

    /// First offset of the log (the base of its oldest segment).
    pub fn start_offset(&self) -> u64 {
        self.snapshot().first().map_or(0, |s| s.base_offset)
    }

    /// Next offset not yet durable.
    pub fn durable_end(&self) -> u64 {
        lock(&self.sync).durable_end
    }

    /// Next offset to be assigned.
    pub fn written_end(&self) -> u64 {
        lock(&self.write).next_offset
    }

    /// Why the log refuses writes, if it does.
    pub fn failure(&self) -> Option<FailureReason> {
        lock(&self.sync).failed.clone()
    }

    fn failed_error(&self, reason: &FailureReason) -> EngineError {
        EngineError::PartitionFailed {
            topic: self.topic.clone(),
            partition: self.partition,
            reason: reason.clone(),
        }
    }

    fn closed_error(&self, closed: Closed) -> EngineError {
        match closed {
            Closed::Deleted => EngineError::TopicDeleted {
                topic: self.topic.clone(),
            },
            Closed::ShuttingDown => EngineError::ShuttingDown,
        }
    }

    /// Puts the log into the failed state (first reason wins) and wakes every waiter.
    fn fail(&self, reason: FailureReason) -> EngineError {
        let mut s = lock(&self.sync);
        let reason = self.set_failed(&mut s, reason);
        self.synced.notify_all();
        self.failed_error(&reason)
    }

    /// Records the first failure (logged once); returns the reason in force.
    fn set_failed(&self, s: &mut SyncState, reason: FailureReason) -> FailureReason {
        if s.failed.is_none() {
            tracing::error!(
                topic = %self.topic,
                partition = self.partition,
                %reason,
                "partition failed: it refuses writes until a restart runs recovery"
            );
        }
        let reason = s.failed.get_or_insert(reason).clone();
        self.wake_async(s.durable_end);
        reason
    }

    /// Puts the log into the failed state (it refuses writes until a restart runs
    /// recovery) when background work left its files out of line with its list.
    pub fn mark_failed(&self, reason: FailureReason) -> EngineError {
        self.fail(reason)
    }

    /// Refuses every later write and wakes waiters. Takes the write lock, so a write
    /// in progress finishes first.
    pub fn close(&self, why: Closed) {
        let _w = lock(&self.write);
        let mut s = lock(&self.sync);
        s.closed.get_or_insert(why);
        self.wake_async(s.durable_end);
        self.synced.notify_all();
    }

    // ----- fsync helpers: each call is one counted system call -----
    // A file sync may cover records: the journal barrier runs first (see [`journal`]).

    fn sync_all(&self, f: &dyn StorageFile) -> io::Result<()> {
        self.stats.journal_barrier(&self.journal)?;
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let r = f.sync_all();
        self.stats.write_path.fsync_latency.record(began.elapsed());
        r
    }

    fn sync_data(&self, f: &dyn StorageFile) -> io::Result<()> {
        self.stats.journal_barrier(&self.journal)?;
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let r = f.sync_data();
        self.stats.write_path.fsync_latency.record(began.elapsed());
        r
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.storage.sync_dir(&self.dir)
    }
}

mod active_index;
mod append;
pub mod buffers;
pub mod cleanup;
mod commit;
pub mod files;
pub mod journal;
mod notify;
mod open;
mod read;
mod retention;
mod roll;
pub mod spares;
mod tally;
mod truncate;
pub mod zero;

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests;

use active_index::ActiveIndex;
use files::{FileCache, SegmentFile};
pub use journal::{Journal, JournalNeed, JournalNotDurable};
pub use open::LostSegment;
use open::{checked_header, list_segments, open_active, open_sealed, sync_on_open};
use retention::Doomed;
use roll::create_segment_files;
pub use spares::SparePool;
pub use zero::{WritePath, ZeroTarget};

pub(crate) use open::create_first_segment;
pub use read::{FetchSpan, LogFetch, LogFetchSpans};
pub use tally::{FoundDamage, LogHealth};
