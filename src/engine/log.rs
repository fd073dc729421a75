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
//!   (docs/FORMAT.md, Segment states). Readers never see a record at or past it: each
//!   segment's `readable_end` is published before `durable_end` and only after the
//!   fsync that covers it.
//! - The segment list is an immutable snapshot swapped under a lock; a reader keeps the
//!   segments (and their open files) it took, whatever happens to the list after.
//! - Lock order: `write` → `sync` → `segments`. Nothing holds `sync` while taking
//!   `write`, and no fsync runs while `write` is held, except the fsync of a cut after a
//!   failed write (an error path).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::error::EngineError;
use super::io::{Storage, StorageFile, StorageRef};
use super::segment::{read_full_at, read_header, scan_segment, ScanEnd};
use crate::format::index::{decode_index, lookup};
use crate::format::names::{
    classify_partition_file, index_file_name, log_file_name, PartitionFile,
};
use crate::format::record::{record_len, LEN_FIELD, MAX_RECORD_LEN};
use crate::format::topic::TopicConfig;
use crate::format::{
    decode_record, encode_record, IndexBuilder, IndexEntry, RecordError, SegmentHeader, HEADER_LEN,
    INDEX_ENTRY_LEN, INDEX_INTERVAL_BYTES,
};

/// Largest produce request a log accepts, in encoded bytes.
pub const BATCH_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Largest `max_bytes` a fetch honours; larger requests are served this much.
pub const FETCH_BYTES_MAX: u32 = 32 * 1024 * 1024;
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

/// Counters shared by every log of a broker.
#[derive(Debug, Default)]
pub struct LogStats {
    pub fsyncs: AtomicU64,
    pub produce_requests: AtomicU64,
    pub records_appended: AtomicU64,
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
    file: File,
    /// Index entries; only the active segment's grow (under the log's write lock).
    index: RwLock<Vec<IndexEntry>>,
    /// End of the data written so far.
    written_end: AtomicU64,
    /// End of the data covered by an fsync: readers stop here.
    readable_end: AtomicU64,
    /// Largest record timestamp, once the segment is sealed (`None`: no records).
    /// Set at the roll for segments this process sealed, else by a scan on demand.
    max_timestamp: OnceLock<Option<i64>>,
}

impl Segment {
    fn new(
        base_offset: u64,
        generation: u64,
        path: PathBuf,
        index: Vec<IndexEntry>,
        data_end: u64,
    ) -> io::Result<Self> {
        let file = File::open(&path)?;
        Ok(Segment {
            base_offset,
            generation,
            path,
            file,
            index: RwLock::new(index),
            written_end: AtomicU64::new(data_end),
            readable_end: AtomicU64::new(data_end),
            max_timestamp: OnceLock::new(),
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

    /// The segment's read handle (the file it was opened as, even once unlinked).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The segment's index as it is held in memory, encoded as in a `.index` file.
    pub fn index_bytes(&self) -> Vec<u8> {
        let index = self.index.read().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::with_capacity(index.len() * INDEX_ENTRY_LEN);
        for e in index.iter() {
            e.encode_into(&mut out);
        }
        out
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
        let header = checked_header(&self.file, len, &self.path, self.base_offset)?;
        let scan = scan_segment(&self.file, &header, len, |_, _| {}).map_err(io_err)?;
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
    index: Arc<dyn StorageFile>,
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
}

/// Syncs that rolls left for the next group commit.
#[derive(Debug, Default)]
struct Pending {
    /// To `sync_all`: outgoing logs and indexes (last data, truncation), new logs (header).
    files: Vec<Arc<dyn StorageFile>>,
    /// The partition directory holds new names.
    dir: bool,
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
}

#[derive(Debug)]
struct SyncState {
    /// Every offset below this is durable.
    durable_end: u64,
    /// A thread is running an fsync for this log.
    syncing: bool,
    /// Set by the first failed fsync (or failed cut); never cleared.
    failed: Option<String>,
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
    segments: RwLock<Arc<Vec<Arc<Segment>>>>,
    /// Files of segments retention dropped from the list but could not delete yet.
    doomed: Mutex<Vec<PathBuf>>,
    /// Rolls whose new segment (name, header) and outgoing segment are durable.
    rolls_durable: AtomicU64,
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
        let mut notes = Vec::new();
        let bases = list_segments(dir)?;
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
            segments.push(Arc::new(open_sealed(dir, base, &mut notes)?));
        }
        let (active, next_offset) = open_active(&*storage, dir, active_base, &mut notes)?;
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
            }),
            sync: Mutex::new(SyncState {
                durable_end: next_offset,
                syncing: false,
                failed: None,
                closed: None,
            }),
            synced: Condvar::new(),
            segments: RwLock::new(Arc::new(segments)),
            doomed: Mutex::new(Vec::new()),
            rolls_durable: AtomicU64::new(0),
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
    pub fn failure(&self) -> Option<String> {
        lock(&self.sync).failed.clone()
    }

    fn failed_error(&self, reason: &str) -> EngineError {
        EngineError::PartitionFailed {
            topic: self.topic.clone(),
            partition: self.partition,
            reason: reason.to_string(),
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
    fn fail(&self, reason: String) -> EngineError {
        let mut s = lock(&self.sync);
        let reason = s.failed.get_or_insert(reason).clone();
        self.synced.notify_all();
        self.failed_error(&reason)
    }

    /// Puts the log into the failed state (it refuses writes until a restart runs
    /// recovery) when background work left its files out of line with its list.
    pub fn mark_failed(&self, reason: String) -> EngineError {
        self.fail(reason)
    }

    /// Refuses every later write and wakes waiters. Takes the write lock, so a write
    /// in progress finishes first.
    pub fn close(&self, why: Closed) {
        let _w = lock(&self.write);
        let mut s = lock(&self.sync);
        s.closed.get_or_insert(why);
        self.synced.notify_all();
    }

    // ----- fsync helpers: each call is one counted system call -----

    fn sync_all(&self, f: &dyn StorageFile) -> io::Result<()> {
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        f.sync_all()
    }

    fn sync_data(&self, f: &dyn StorageFile) -> io::Result<()> {
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        f.sync_data()
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.storage.sync_dir(&self.dir)
    }
}

// ----- the write path -----

/// Checks sizes and returns the encoded length of the batch.
fn check_batch(records: &[NewRecord<'_>], max_record_bytes: u32) -> Result<u64, EngineError> {
    if records.is_empty() {
        return Err(EngineError::InvalidRequest {
            detail: "produce request without records".into(),
        });
    }
    let mut total = 0u64;
    for r in records {
        let size = record_len(r.key.map(<[u8]>::len), r.value.len());
        let logical = 28 + r.key.map_or(0, |k| k.len() as u64) + r.value.len() as u64;
        match size {
            Some(len) if len <= max_record_bytes => total += u64::from(len) + LEN_FIELD as u64,
            _ => {
                return Err(EngineError::RecordTooLarge {
                    size: logical,
                    max: u64::from(max_record_bytes),
                })
            }
        }
    }
    if total > BATCH_BYTES_MAX {
        return Err(EngineError::BatchTooLarge {
            size: total,
            max: BATCH_BYTES_MAX,
        });
    }
    Ok(total)
}

/// A batch encoded for the active segment.
struct Encoded {
    log_bytes: Vec<u8>,
    index_bytes: Vec<u8>,
    entries: Vec<IndexEntry>,
    builder: IndexBuilder,
    max_timestamp: Option<i64>,
}

fn encode_batch(
    records: &[NewRecord<'_>],
    a: &Active,
    base: u64,
    batch_len: u64,
    now: i64,
) -> Result<Encoded, EngineError> {
    let mut log_bytes = Vec::with_capacity(usize::try_from(batch_len).unwrap_or(0));
    let mut builder = a.builder.clone();
    let mut entries = Vec::new();
    let mut max_timestamp = None;
    for (i, r) in records.iter().enumerate() {
        let offset = base + i as u64;
        let position = a.data_end + log_bytes.len() as u64;
        let ts = if r.timestamp_ms == -1 {
            now
        } else {
            r.timestamp_ms
        };
        max_timestamp = max_timestamp.max(Some(ts));
        encode_record(&mut log_bytes, offset, ts, r.key, r.value, a.seg.generation).map_err(
            |e| EngineError::InvalidRequest {
                detail: e.to_string(),
            },
        )?;
        entries.extend(builder.observe(a.seg.base_offset, offset, position));
    }
    let mut index_bytes = Vec::with_capacity(entries.len() * INDEX_ENTRY_LEN);
    for e in &entries {
        e.encode_into(&mut index_bytes);
    }
    Ok(Encoded {
        log_bytes,
        index_bytes,
        entries,
        builder,
        max_timestamp,
    })
}

impl PartitionLog {
    /// Appends `records` as one write, assigning consecutive offsets. Returns once
    /// written, not once durable: call [`PartitionLog::wait_durable`] for that.
    pub fn append(
        &self,
        records: &[NewRecord<'_>],
        config: &TopicConfig,
    ) -> Result<Appended, EngineError> {
        let batch_len = check_batch(records, config.max_record_bytes)?;
        let now = now_ms();
        let mut w = self.lock_for_roll(|a| should_roll(a, batch_len, config, now))?;
        if should_roll(&w.active, batch_len, config, now) {
            self.roll(&mut w, now)?;
        }
        let base = w.next_offset;
        let count = records.len() as u64;
        let Some(next_offset) = base.checked_add(count) else {
            return Err(EngineError::InvalidRequest {
                detail: format!(
                    "{}: offset {base} + {count} records would pass the largest offset",
                    self.dir.display()
                ),
            });
        };
        let enc = encode_batch(records, &w.active, base, batch_len, now)?;
        self.write_batch(&w.active, &enc)?;
        let a = &mut w.active;
        a.data_end += enc.log_bytes.len() as u64;
        a.file_len = a.file_len.max(a.data_end);
        a.index_len += enc.index_bytes.len() as u64;
        a.builder = enc.builder;
        a.max_timestamp = a.max_timestamp.max(enc.max_timestamp);
        a.seg
            .index
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(enc.entries);
        a.seg.written_end.store(a.data_end, Ordering::Release);
        w.next_offset = next_offset;
        self.stats.produce_requests.fetch_add(1, Ordering::Relaxed);
        self.stats
            .records_appended
            .fetch_add(count, Ordering::Relaxed);
        let unflushed = w.next_offset - lock(&self.sync).durable_end;
        Ok(Appended {
            base_offset: base,
            last_offset: base + count - 1,
            unflushed,
        })
    }

    /// Why the log refuses writes (failed, deleted, shutting down), if it does.
    pub fn check_writable_pub(&self) -> Result<(), EngineError> {
        self.check_writable()
    }

    fn check_writable(&self) -> Result<(), EngineError> {
        let s = lock(&self.sync);
        if let Some(reason) = &s.failed {
            return Err(self.failed_error(reason));
        }
        if let Some(c) = s.closed {
            return Err(self.closed_error(c));
        }
        Ok(())
    }

    /// One write to the log, at most one to the index. On failure both are cut back.
    fn write_batch(&self, a: &Active, enc: &Encoded) -> Result<(), EngineError> {
        if let Err(e) = a.log.write_at(&enc.log_bytes, a.data_end) {
            return Err(self.cut_back(a, e, "appending to"));
        }
        if !enc.index_bytes.is_empty() {
            if let Err(e) = a.index.write_at(&enc.index_bytes, a.index_len) {
                return Err(self.cut_back(a, e, "appending to the index of"));
            }
        }
        Ok(())
    }

    /// Cuts a failed write off the files: 1. truncate the log to the end of its data
    /// and the index to its entries, 2. fsync both, so no part of the failed write can
    /// come back after a crash. If either step fails the log is failed.
    fn cut_back(&self, a: &Active, err: io::Error, what: &str) -> EngineError {
        let path = a.seg.path.display();
        let cut = (|| {
            // 1.
            a.log.set_len(a.data_end)?;
            a.index.set_len(a.index_len)?;
            // 2.
            self.sync_all(&*a.log)?;
            self.sync_all(&*a.index)
        })();
        match cut {
            Ok(()) => EngineError::io(format!("{what} {path} at position {}", a.data_end), err),
            Err(e) => self.fail(format!(
                "write to {path} failed ({err}) and could not be cut off: {e}"
            )),
        }
    }
}

fn should_roll(a: &Active, batch_len: u64, config: &TopicConfig, now: i64) -> bool {
    let empty = a.data_end <= HEADER_LEN as u64;
    let full = a.data_end.saturating_add(batch_len) > config.segment_bytes;
    let old = now.saturating_sub(a.born_ms) >= config.segment_ms;
    !empty && (full || old)
}

// ----- rolling -----

/// Creates `<base>.log` with a generation-0 header and an empty `<base>.index`.
/// Nothing is fsynced here; on failure, whatever was created is removed.
fn create_segment_files(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
) -> io::Result<(Arc<dyn StorageFile>, Arc<dyn StorageFile>)> {
    let log_path = dir.join(log_file_name(base));
    let index_path = dir.join(index_file_name(base));
    let log: Arc<dyn StorageFile> = Arc::from(storage.create(&log_path)?);
    let made = (|| {
        log.write_at(&SegmentHeader::new(base).encode(), 0)?;
        let index: Arc<dyn StorageFile> = Arc::from(storage.create(&index_path)?);
        Ok(index)
    })();
    match made {
        Ok(index) => Ok((log, index)),
        Err(e) => {
            drop(log);
            let _ = storage.remove_file(&log_path);
            let _ = storage.remove_file(&index_path);
            Err(e)
        }
    }
}

impl PartitionLog {
    /// Takes the write lock for an append or roll. When `wants_roll` says the active
    /// segment is to be rolled while an earlier roll is not yet durable, it first runs
    /// a group commit without the lock: directory entries may reach the disk in any
    /// order, and a second new segment whose name survives a crash without the first
    /// one's would leave a hole in the offsets. At most a few attempts; a roll that
    /// races in between is then made as before.
    fn lock_for_roll(
        &self,
        wants_roll: impl Fn(&Active) -> bool,
    ) -> Result<MutexGuard<'_, WriteState>, EngineError> {
        for _ in 0..3 {
            let w = lock(&self.write);
            self.check_writable()?;
            let outstanding = w.rolls > self.rolls_durable.load(Ordering::Acquire);
            if !(outstanding && wants_roll(&w.active)) {
                return Ok(w);
            }
            drop(w);
            self.sync_pending()?;
        }
        let w = lock(&self.write);
        self.check_writable()?;
        Ok(w)
    }

    /// Seals the active segment and starts a new one at the next offset:
    /// 1. truncate the outgoing log to the end of its data;
    /// 2. create the new log (generation-0 header) and its index;
    /// 3. leave their fsyncs (outgoing log and index, new log, directory) to the next
    ///    group commit, which runs them before any record of the new segment is
    ///    acknowledged or served (see [`PartitionLog::execute`]);
    /// 4. publish the new segment list.
    fn roll(&self, w: &mut WriteState, now: i64) -> Result<(), EngineError> {
        let base = w.next_offset;
        let old = &mut w.active;
        // 1.
        if old.file_len > old.data_end {
            old.log.set_len(old.data_end).map_err(|e| {
                EngineError::io(format!("truncating {}", old.seg.path.display()), e)
            })?;
            old.file_len = old.data_end;
        }
        // 2.
        let (log, index) = create_segment_files(&*self.storage, &self.dir, base).map_err(|e| {
            EngineError::io(
                format!(
                    "creating segment {} in {}",
                    log_file_name(base),
                    self.dir.display()
                ),
                e,
            )
        })?;
        let path = self.dir.join(log_file_name(base));
        let seg = Segment::new(base, 0, path.clone(), Vec::new(), HEADER_LEN as u64);
        let seg = match seg {
            Ok(s) => Arc::new(s),
            Err(e) => {
                let removed = self
                    .storage
                    .remove_file(&path)
                    .and_then(|()| self.storage.remove_file(&path.with_extension("index")));
                return Err(match removed {
                    Ok(()) => EngineError::io(format!("opening {}", path.display()), e),
                    Err(r) => self.fail(format!(
                        "cannot open new segment {} ({e}) nor remove it ({r})",
                        path.display()
                    )),
                });
            }
        };
        let new = Active {
            seg: seg.clone(),
            log: log.clone(),
            index,
            data_end: HEADER_LEN as u64,
            file_len: HEADER_LEN as u64,
            index_len: 0,
            builder: IndexBuilder::new(),
            born_ms: now,
            max_timestamp: None,
        };
        let old = std::mem::replace(&mut w.active, new);
        let _ = old.seg.max_timestamp.set(old.max_timestamp);
        // 3.
        w.pending.files.extend([old.log, old.index, log]);
        w.pending.dir = true;
        w.pending.sealed.push((old.seg, old.data_end));
        // 4.
        let mut list = self.snapshot().as_ref().clone();
        list.push(seg);
        self.publish(list);
        w.rolls += 1;
        Ok(())
    }
}

// ----- group commit -----

impl PartitionLog {
    /// Returns once every offset below `target` is durable. The first caller that
    /// finds it is not runs one fsync covering everything written so far; callers
    /// behind it wait and usually find their write covered without a system call.
    pub fn wait_durable(&self, target: u64) -> Result<(), EngineError> {
        if super::planted::ACK_BEFORE_FSYNC.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let mut s = lock(&self.sync);
        loop {
            if s.durable_end >= target {
                return Ok(());
            }
            if let Some(reason) = &s.failed {
                return Err(self.failed_error(reason));
            }
            if s.closed == Some(Closed::Deleted) {
                return Err(self.closed_error(Closed::Deleted));
            }
            if s.syncing {
                s = self.synced.wait(s).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            s.syncing = true;
            drop(s);
            let result = self.sync_once();
            s = lock(&self.sync);
            s.syncing = false;
            match result {
                Ok(plan) => self.publish_synced(&mut s, &plan),
                // The topic was deleted while the fsync ran (its directory is gone):
                // the request ends as deleted, not as a failed partition.
                Err(_) if s.closed == Some(Closed::Deleted) => {}
                Err(reason) => {
                    s.failed.get_or_insert(reason);
                }
            }
            self.synced.notify_all();
        }
    }

    /// Makes everything written so far durable (the flusher and shutdown call this).
    pub fn flush(&self) -> Result<(), EngineError> {
        let target = self.written_end();
        self.wait_durable(target)
    }

    /// Takes a plan under the write lock and runs it without the lock. Returns the
    /// plan, to be published by [`PartitionLog::publish_synced`], or why the fsync
    /// failed.
    fn sync_once(&self) -> Result<SyncPlan, String> {
        let plan = {
            let mut w = lock(&self.write);
            SyncPlan {
                target: w.next_offset,
                rolls: w.rolls,
                pending: std::mem::take(&mut w.pending),
                active_log: w.active.log.clone(),
                active_seg: w.active.seg.clone(),
                active_end: w.active.data_end,
            }
        };
        self.execute(&plan)
            .map_err(|e| format!("fsync in {} failed: {e}", self.dir.display()))?;
        Ok(plan)
    }

    /// Publishes what a synced plan made readable, under the sync lock: the segments'
    /// readable ends and the durable end change together, so a reader that got a
    /// record from a readable end finds the durable end past it at its next request
    /// (which takes the sync lock), never an offset beyond the end.
    fn publish_synced(&self, s: &mut SyncState, plan: &SyncPlan) {
        for (seg, end) in &plan.pending.sealed {
            seg.readable_end.fetch_max(*end, Ordering::AcqRel);
        }
        plan.active_seg
            .readable_end
            .fetch_max(plan.active_end, Ordering::AcqRel);
        s.durable_end = s.durable_end.max(plan.target);
        self.rolls_durable.fetch_max(plan.rolls, Ordering::AcqRel);
    }

    /// The fsync ordering of a group commit:
    /// 1. `sync_all` every file a roll left: outgoing logs (last data and truncation),
    ///    their indexes, new logs (header);
    /// 2. fsync the partition directory (the new segments' names);
    /// 3. `sync_data` the active log, covering every record written before the plan.
    ///
    /// Only then may any record below the plan's target be acknowledged or served.
    fn execute(&self, plan: &SyncPlan) -> io::Result<()> {
        // 1.
        for f in &plan.pending.files {
            self.sync_all(&**f)?;
        }
        // 2.
        if plan.pending.dir
            && !super::planted::SKIP_ROLL_DIR_FSYNC.load(std::sync::atomic::Ordering::Relaxed)
        {
            self.sync_dir()?;
        }
        // 3.
        if plan.active_end > plan.active_seg.readable_end.load(Ordering::Acquire) {
            let synced = self.sync_data(&*plan.active_log);
            if synced.is_err()
                && super::planted::RETRY_FAILED_FSYNC.load(std::sync::atomic::Ordering::Relaxed)
            {
                return self.sync_data(&*plan.active_log);
            }
            synced?;
        }
        Ok(())
    }
}

// ----- background work: rolling by age, retention, compaction -----

impl PartitionLog {
    /// Rolls the active segment when it holds records and is older than the topic's
    /// `segment_ms` (a quiet partition's data can then age out), and runs the syncs the
    /// roll left at once. Returns whether it rolled.
    pub fn roll_if_due(&self, config: &TopicConfig, now: i64) -> Result<bool, EngineError> {
        {
            let due = |a: &Active| {
                a.data_end > HEADER_LEN as u64 && now.saturating_sub(a.born_ms) >= config.segment_ms
            };
            let mut w = self.lock_for_roll(due)?;
            if !due(&w.active) {
                return Ok(false);
            }
            self.roll(&mut w, now)?;
        }
        self.sync_pending()?;
        Ok(true)
    }

    /// Runs one group commit even when no record waits for it, so the syncs rolls
    /// left (file, header, directory) are done when this returns.
    pub fn sync_pending(&self) -> Result<(), EngineError> {
        let mut s = lock(&self.sync);
        loop {
            if let Some(reason) = &s.failed {
                return Err(self.failed_error(reason));
            }
            if !s.syncing {
                break;
            }
            s = self.synced.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.syncing = true;
        drop(s);
        let result = self.sync_once();
        let mut s = lock(&self.sync);
        s.syncing = false;
        let out = match result {
            Ok(plan) => {
                self.publish_synced(&mut s, &plan);
                Ok(())
            }
            Err(_) if s.closed == Some(Closed::Deleted) => Err(self.closed_error(Closed::Deleted)),
            Err(reason) => {
                let reason = s.failed.get_or_insert(reason).clone();
                Err(self.failed_error(&reason))
            }
        };
        self.synced.notify_all();
        out
    }

    /// The sealed segments whose seal is durable, oldest first: neither the active
    /// segment nor a segment whose roll still waits for its fsyncs (nor anything after
    /// such a segment). Background work acts on these only.
    pub fn settled_segments(&self) -> Vec<Arc<Segment>> {
        let w = lock(&self.write);
        self.settled_locked(&w)
    }

    fn settled_locked(&self, w: &WriteState) -> Vec<Arc<Segment>> {
        let unsettled = w
            .pending
            .sealed
            .first()
            .map_or(w.active.seg.base_offset, |(seg, _)| seg.base_offset);
        // A segment leaves `pending` when a group commit takes it, before that commit's
        // fsync is done: it is settled only once readable (published as durable) to its end.
        self.snapshot()
            .iter()
            .take_while(|seg| {
                seg.base_offset < unsettled
                    && seg.readable_end.load(Ordering::Acquire)
                        >= seg.written_end.load(Ordering::Acquire)
            })
            .cloned()
            .collect()
    }

    /// Refuses background changes to a log that refuses writes (failed, deleted or
    /// shutting down).
    fn check_changeable(&self) -> Result<(), EngineError> {
        self.check_writable()
    }

    /// True when `bases` are the oldest settled segments, in order (checked under the
    /// write lock).
    fn is_settled_prefix(&self, w: &WriteState, bases: &[u64]) -> bool {
        let settled = self.settled_locked(w);
        settled.len() >= bases.len()
            && settled
                .iter()
                .zip(bases)
                .all(|(seg, &base)| seg.base_offset == base)
    }

    /// Step 2 of the compaction swap (docs/FORMAT.md, Compaction), under the write lock:
    /// true when the segments `read` are still the oldest sealed segments, their seals
    /// durable, and the log takes writes. Segments sealed since the read may follow
    /// them: they are newer than anything compacted and every new segment's name lies
    /// below theirs, so the swap cannot touch them.
    pub fn sealed_unchanged(&self, read: &[u64]) -> bool {
        let w = lock(&self.write);
        self.check_changeable().is_ok() && self.is_settled_prefix(&w, read)
    }

    /// Retention: removes the oldest segments `bases`
    /// (settled, a prefix of the list):
    /// 1. under the write lock, publish the list without them: the start offset moves
    ///    to the next segment and new readers no longer pick them (readers already in
    ///    them keep reading through their open handles);
    /// 2. delete each `.log`, then its `.index`, oldest segment first, with a
    ///    directory fsync before each segment's `.log` but the first (so only a
    ///    prefix of the segments can be gone after a crash);
    /// 3. fsync the partition directory.
    ///
    /// A crash between the steps leaves whole segments or an index without its log,
    /// which recovery removes; the start offset on disk only ever moves forward.
    /// Files that could not be deleted are retried by the next call.
    pub fn remove_oldest(&self, bases: &[u64]) -> Result<Vec<Arc<Segment>>, EngineError> {
        // 1.
        let removed = {
            let w = lock(&self.write);
            self.check_changeable()?;
            if !self.is_settled_prefix(&w, bases) {
                return Err(EngineError::InvalidRequest {
                    detail: format!(
                        "{}: segments to remove are not the oldest sealed ones",
                        self.dir.display()
                    ),
                });
            }
            let list = self.snapshot();
            let (gone, kept) = list.split_at(bases.len().min(list.len()));
            let gone = gone.to_vec();
            self.publish(kept.to_vec());
            gone
        };
        let mut doomed = lock(&self.doomed);
        for seg in &removed {
            doomed.push(seg.path.clone());
            doomed.push(seg.path.with_extension("index"));
        }
        self.delete_doomed(&mut doomed)?;
        Ok(removed)
    }

    /// Steps 2 and 3 of [`PartitionLog::remove_oldest`] for every file still waiting.
    fn delete_doomed(&self, doomed: &mut Vec<PathBuf>) -> Result<(), EngineError> {
        if doomed.is_empty() {
            return Ok(());
        }
        // 2.
        let mut removed_one = false;
        while let Some(path) = doomed.first() {
            // The removals must persist oldest first: a newer segment's log gone
            // while an older one's is back after a crash would leave offsets missing
            // between the segments. Directory operations need not persist in the
            // order they were made, so the ones before a segment's log are made
            // durable before it goes.
            if removed_one
                && path.extension().is_some_and(|e| e == "log")
                && !super::planted::UNORDERED_RETENTION_REMOVALS
                    .load(std::sync::atomic::Ordering::Relaxed)
            {
                self.sync_dir()
                    .map_err(|e| EngineError::io(format!("syncing {}", self.dir.display()), e))?;
            }
            match self.storage.remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(EngineError::io(format!("removing {}", path.display()), e)),
            }
            removed_one = true;
            doomed.remove(0);
        }
        // 3.
        if super::planted::SKIP_RETENTION_DIR_FSYNC.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        self.sync_dir()
            .map_err(|e| EngineError::io(format!("syncing {}", self.dir.display()), e))
    }

    /// Retries deleting files an earlier retention could not delete.
    pub fn retry_removals(&self) -> Result<(), EngineError> {
        self.delete_doomed(&mut lock(&self.doomed))
    }

    /// Publishes a finished compaction swap: the oldest segments `replaced` give way
    /// to the segments now on disk under the names `new`. The new segments are opened
    /// first; the list is then replaced under the write lock. Readers already in a
    /// replaced segment keep reading it from the same bytes (their `Arc<Segment>`
    /// holds its open file). If the new segments cannot be opened, the log is failed:
    /// its list no longer matches the directory, and a restart reopens it from disk.
    pub fn replace_oldest(&self, replaced: &[u64], new: &[u64]) -> Result<(), EngineError> {
        let mut notes = Vec::new();
        let mut opened = Vec::with_capacity(new.len());
        for &base in new {
            match open_sealed(&self.dir, base, &mut notes) {
                Ok(seg) => opened.push(Arc::new(seg)),
                Err(e) => {
                    return Err(self.fail(format!(
                        "cannot open segment {} written by compaction: {e}",
                        log_file_name(base)
                    )))
                }
            }
        }
        let w = lock(&self.write);
        if !self.is_settled_prefix(&w, replaced) {
            drop(w);
            return Err(self.fail(format!(
                "{}: the segments a compaction replaced are no longer the oldest",
                self.dir.display()
            )));
        }
        let list = self.snapshot();
        opened.extend(list.iter().skip(replaced.len()).cloned());
        self.publish(opened);
        Ok(())
    }
}

// ----- the read path -----

/// What one fetch returns from a log.
#[derive(Debug)]
pub struct LogFetch {
    pub chunks: Vec<FetchChunk>,
    pub start_offset: u64,
    pub end_offset: u64,
}

impl PartitionLog {
    /// Durable records from `offset`, at most `max_bytes` of them (at least one whole
    /// record if one exists), waiting up to `max_wait` when `offset` is the durable end.
    pub fn fetch(
        &self,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<LogFetch, EngineError> {
        let (start, end) = self.wait_for_data(offset, max_wait)?;
        let mut fetched = LogFetch {
            chunks: Vec::new(),
            start_offset: start,
            end_offset: end,
        };
        if offset >= end {
            return Ok(fetched);
        }
        let (chunks, last) = self.read(offset, max_bytes.min(FETCH_BYTES_MAX))?;
        fetched.chunks = chunks;
        if let Some(last) = last {
            // The readable ends may already show a newer fsync than `end` did.
            fetched.end_offset = fetched.end_offset.max(last.saturating_add(1));
        }
        Ok(fetched)
    }

    /// Checks `offset` against the log's range, then waits (no spinning) until a record
    /// at `offset` is durable, `max_wait` passes, or the log closes. Returns (start, end).
    fn wait_for_data(&self, offset: u64, max_wait: Duration) -> Result<(u64, u64), EngineError> {
        let deadline = Instant::now().checked_add(max_wait);
        let mut s = lock(&self.sync);
        loop {
            if s.closed == Some(Closed::Deleted) {
                return Err(self.closed_error(Closed::Deleted));
            }
            let start = self.start_offset();
            if offset < start || offset > s.durable_end {
                return Err(EngineError::OffsetOutOfRange {
                    topic: self.topic.clone(),
                    partition: self.partition,
                    offset,
                    start,
                    end: s.durable_end,
                });
            }
            let now = Instant::now();
            let left = deadline.map_or(max_wait, |d| d.saturating_duration_since(now));
            if offset < s.durable_end || s.closed.is_some() || left.is_zero() {
                return Ok((start, s.durable_end));
            }
            s = self
                .synced
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Reads whole records from `offset` across segments, within `budget` bytes (but
    /// at least one record). Returns the chunks and the last offset read.
    fn read(
        &self,
        offset: u64,
        budget: u32,
    ) -> Result<(Vec<FetchChunk>, Option<u64>), EngineError> {
        let segs = self.snapshot();
        let mut i = segs
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        let mut left = u64::from(budget);
        let mut chunks = Vec::new();
        let mut next = offset;
        let mut last = None;
        while let Some(seg) = segs.get(i) {
            let out = read_segment(seg, next, left, chunks.is_empty())?;
            if let Some(l) = out.last_offset {
                left = left.saturating_sub(out.bytes.len() as u64);
                next = l + 1;
                last = Some(l);
                chunks.push(FetchChunk {
                    generation: seg.generation,
                    bytes: out.bytes,
                });
            }
            if out.budget_hit {
                break;
            }
            i += 1;
        }
        Ok((chunks, last))
    }
}

/// Records read from one segment.
struct SegmentRead {
    bytes: Vec<u8>,
    last_offset: Option<u64>,
    /// Stopped because the next record did not fit the budget.
    budget_hit: bool,
}

/// A read buffer over `[pos, pos + buf.len())` of a file, refilled by large reads.
struct Window<'f> {
    file: &'f File,
    pos: u64,
    buf: Vec<u8>,
    limit: u64,
    read_bytes: u64,
}

impl Window<'_> {
    /// Bytes available from `at` (which must lie in the window).
    fn from(&self, at: u64) -> &[u8] {
        let i = usize::try_from(at.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        self.buf.get(i..).unwrap_or(&[])
    }

    /// Drops what lies before `at` and reads on until `needed` bytes from `at` are
    /// buffered (or the limit is reached). Returns false if nothing more could be read.
    fn fill(&mut self, at: u64, needed: u64) -> io::Result<bool> {
        let drop_n = usize::try_from(at.saturating_sub(self.pos))
            .unwrap_or(usize::MAX)
            .min(self.buf.len());
        self.buf.drain(..drop_n);
        self.pos += drop_n as u64;
        let end = self.pos + self.buf.len() as u64;
        let want = needed
            .max(self.read_bytes)
            .saturating_sub(self.buf.len() as u64)
            .min(self.limit.saturating_sub(end));
        let Ok(want) = usize::try_from(want) else {
            return Ok(false);
        };
        if want == 0 {
            return Ok(false);
        }
        let old = self.buf.len();
        self.buf.resize(old + want, 0);
        let n = read_full_at(self.file, self.buf.get_mut(old..).unwrap_or(&mut []), end)?;
        self.buf.truncate(old + n);
        Ok(n > 0)
    }
}

/// Reads whole records with offsets ≥ `offset` from one segment, up to its readable
/// end: index lookup, one large read from the entry, scan forward.
fn read_segment(
    seg: &Segment,
    offset: u64,
    budget: u64,
    take_one: bool,
) -> Result<SegmentRead, EngineError> {
    let limit = seg.readable_end.load(Ordering::Acquire);
    let rel = offset.saturating_sub(seg.base_offset);
    let entry = lookup(
        &seg.index.read().unwrap_or_else(PoisonError::into_inner),
        rel,
    );
    let start = entry
        .map_or(HEADER_LEN as u64, |e| e.position)
        .max(HEADER_LEN as u64);
    let read_bytes = (budget + INDEX_INTERVAL_BYTES).max(FETCH_READ_MIN_BYTES);
    let mut win = Window {
        file: &seg.file,
        pos: start,
        buf: Vec::new(),
        limit,
        read_bytes,
    };
    let mut out = SegmentRead {
        bytes: Vec::new(),
        last_offset: None,
        budget_hit: false,
    };
    let mut pos = start;
    let corrupt = |detail: String| EngineError::Corrupt {
        path: seg.path.clone(),
        detail,
    };
    let io_err = |e: io::Error| EngineError::io(format!("reading {}", seg.path.display()), e);
    while pos < limit {
        let avail = win.from(pos);
        let need = needed_len(avail);
        let more_on_disk = pos + (avail.len() as u64) < limit;
        if (avail.len() as u64) < need && more_on_disk {
            if !win.fill(pos, need).map_err(io_err)? {
                return Err(corrupt(format!(
                    "file ends before its durable data does ({limit} bytes)"
                )));
            }
            continue;
        }
        let record =
            decode_record(avail, pos, seg.generation).map_err(|e| corrupt(e.to_string()))?;
        let len = record.encoded_len as u64;
        if record.offset >= offset {
            let fits = out.bytes.len() as u64 + len <= budget;
            if !(fits || take_one && out.bytes.is_empty()) {
                out.budget_hit = true;
                break;
            }
            out.bytes
                .extend_from_slice(avail.get(..record.encoded_len).unwrap_or(&[]));
            out.last_offset = Some(record.offset);
        }
        pos += len;
    }
    Ok(out)
}

/// Bytes the record at the start of `avail` needs: its length field, then its whole
/// length (bounded by the largest record, so an implausible length is never read for;
/// the decoder reports it).
fn needed_len(avail: &[u8]) -> u64 {
    match avail
        .get(..LEN_FIELD)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
    {
        Some(b) => u64::from(u32::from_be_bytes(b).min(MAX_RECORD_LEN)) + LEN_FIELD as u64,
        None => LEN_FIELD as u64,
    }
}

// ----- opening -----

/// The base offsets of the `.log` files in `dir`, sorted. Refuses a directory with
/// an unfinished compaction swap (recovery finishes it).
fn list_segments(dir: &Path) -> Result<Vec<u64>, EngineError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| EngineError::io(format!("listing {}", dir.display()), e))?;
    let mut bases = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| EngineError::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name();
        match classify_partition_file(&name.to_string_lossy()) {
            PartitionFile::Log(b) => bases.push(b),
            PartitionFile::Marker => {
                return Err(EngineError::Corrupt {
                    path: dir.to_path_buf(),
                    detail: "an unfinished compaction swap (compaction.marker) is present; run `seglog recover`".into(),
                })
            }
            _ => {}
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// Creates segment 0 in an empty partition directory and makes it durable:
/// 1. create the log (header) and index, 2. fsync the log, 3. fsync the directory.
pub(crate) fn create_first_segment(
    storage: &dyn Storage,
    dir: &Path,
    stats: &LogStats,
) -> Result<(), EngineError> {
    let ctx = || format!("creating the first segment in {}", dir.display());
    // 1.
    let (log, _index) =
        create_segment_files(storage, dir, 0).map_err(|e| EngineError::io(ctx(), e))?;
    // 2.
    stats.fsyncs.fetch_add(2, Ordering::Relaxed);
    log.sync_all().map_err(|e| EngineError::io(ctx(), e))?;
    // 3.
    storage.sync_dir(dir).map_err(|e| EngineError::io(ctx(), e))
}

/// What is on disk at open may be only in the page cache (a process that was killed
/// wrote it and never fsynced), yet it is about to be served as durable:
/// 1. fsync every sealed log, 2. fsync the active log, 3. fsync the directory.
///
/// On a clean shutdown these find nothing dirty and are cheap.
fn sync_on_open(
    storage: &dyn Storage,
    dir: &Path,
    segments: &[Arc<Segment>],
    active: &dyn StorageFile,
    stats: &LogStats,
) -> Result<(), EngineError> {
    let ctx = |p: &Path| format!("syncing {} at open", p.display());
    // 1.
    for seg in segments.iter().rev().skip(1) {
        let f = storage
            .open(&seg.path)
            .map_err(|e| EngineError::io(ctx(&seg.path), e))?;
        stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        f.sync_all()
            .map_err(|e| EngineError::io(ctx(&seg.path), e))?;
    }
    // 2.
    stats.fsyncs.fetch_add(2, Ordering::Relaxed);
    active
        .sync_all()
        .map_err(|e| EngineError::io(ctx(dir), e))?;
    // 3.
    storage
        .sync_dir(dir)
        .map_err(|e| EngineError::io(ctx(dir), e))
}

/// Reads and checks a segment's header; its base must match the file name.
fn checked_header(
    file: &File,
    len: u64,
    path: &Path,
    base: u64,
) -> Result<SegmentHeader, EngineError> {
    let header = read_header(file, len)
        .map_err(|e| EngineError::io(format!("reading {}", path.display()), e))?
        .map_err(|e| EngineError::Corrupt {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if header.base_offset != base {
        return Err(EngineError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "header base offset {} does not match the file name",
                header.base_offset
            ),
        });
    }
    Ok(header)
}

/// Reads an index file into memory, bounded by what the log's size allows.
fn read_index_file(path: &Path, data_end: u64) -> Option<Vec<IndexEntry>> {
    let max_len = (data_end / INDEX_INTERVAL_BYTES + 1) * INDEX_ENTRY_LEN as u64;
    let len = std::fs::metadata(path).ok()?.len();
    if len > max_len {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    decode_index(&bytes, Some(data_end)).ok()
}

/// Opens a sealed segment: its data ends at the end of the file; its index is read
/// from disk, or rebuilt in memory by a scan if unreadable.
fn open_sealed(dir: &Path, base: u64, notes: &mut Vec<String>) -> Result<Segment, EngineError> {
    let path = dir.join(log_file_name(base));
    let io_err = |e| EngineError::io(format!("opening {}", path.display()), e);
    let file = File::open(&path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    let header = checked_header(&file, len, &path, base)?;
    let index = match read_index_file(&dir.join(index_file_name(base)), len) {
        Some(index) => index,
        None => {
            let scan = scan_segment(&file, &header, len, |_, _| {}).map_err(io_err)?;
            notes.push(format!(
                "{}: index missing or invalid, rebuilt in memory",
                path.display()
            ));
            scan.index
        }
    };
    Ok(Segment {
        base_offset: base,
        generation: header.generation,
        path,
        file,
        index: RwLock::new(index),
        written_end: AtomicU64::new(len),
        readable_end: AtomicU64::new(len),
        max_timestamp: OnceLock::new(),
    })
}

/// Opens the active segment: scans it in full, refuses a torn or corrupt tail,
/// brings its index file in line with the scan. Returns it and the next offset.
fn open_active(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    notes: &mut Vec<String>,
) -> Result<(Active, u64), EngineError> {
    let path = dir.join(log_file_name(base));
    let io_err = |e| EngineError::io(format!("opening {}", path.display()), e);
    let log: Arc<dyn StorageFile> = Arc::from(storage.open(&path).map_err(io_err)?);
    let file = File::open(&path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    let header = checked_header(&file, len, &path, base)?;
    let mut first_ts = None;
    let scan = scan_segment(&file, &header, len, |_, r| {
        first_ts.get_or_insert(r.timestamp_ms);
    })
    .map_err(io_err)?;
    if !matches!(
        scan.end,
        ScanEnd::Eof | ScanEnd::Record(RecordError::Zero { .. })
    ) {
        return Err(EngineError::Corrupt {
            path,
            detail: format!(
                "active segment ends in a bad tail ({}); run `seglog recover`",
                scan.end.detail()
            ),
        });
    }
    let index = sync_index_file(storage, dir, base, &scan.index, notes)?;
    let seg = Segment {
        base_offset: base,
        generation: header.generation,
        path,
        file,
        index: RwLock::new(scan.index.clone()),
        written_end: AtomicU64::new(scan.data_end),
        readable_end: AtomicU64::new(scan.data_end),
        max_timestamp: OnceLock::new(),
    };
    let now = now_ms();
    let active = Active {
        seg: Arc::new(seg),
        log,
        index,
        data_end: scan.data_end,
        file_len: len,
        index_len: (scan.index.len() * INDEX_ENTRY_LEN) as u64,
        builder: IndexBuilder::resume(scan.index.last().copied()),
        // The segment's age counts from its first record (clamped to now), like Kafka.
        born_ms: first_ts.map_or(now, |t: i64| t.min(now)),
        max_timestamp: scan.max_timestamp_ms,
    };
    // A record at u64::MAX leaves no offset to append at: refuse the partition.
    let next = match scan.last_offset {
        None => base,
        Some(last) => last.checked_add(1).ok_or_else(|| EngineError::Corrupt {
            path: dir.join(log_file_name(base)),
            detail: format!("a record has offset {last}, leaving no next offset"),
        })?,
    };
    Ok((active, next))
}

/// Makes the active segment's index file equal to `entries` (the index is derived
/// data, so no fsync: a crash leaves something recovery rebuilds).
fn sync_index_file(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    entries: &[IndexEntry],
    notes: &mut Vec<String>,
) -> Result<Arc<dyn StorageFile>, EngineError> {
    let path = dir.join(index_file_name(base));
    let io_err = |e| EngineError::io(format!("writing {}", path.display()), e);
    let mut want = Vec::with_capacity(entries.len() * INDEX_ENTRY_LEN);
    for e in entries {
        e.encode_into(&mut want);
    }
    let opened = match storage.open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => storage.create(&path).map_err(io_err)?,
        Err(e) => return Err(io_err(e)),
    };
    let file: Arc<dyn StorageFile> = Arc::from(opened);
    let len = file.len().map_err(io_err)?;
    let mut have = vec![0u8; usize::try_from(len.min(want.len() as u64)).unwrap_or(0)];
    let n = file.read_at(&mut have, 0).map_err(io_err)?;
    let prefix = n == have.len() && want.starts_with(&have);
    if len == want.len() as u64 && prefix {
        return Ok(file);
    }
    if prefix {
        file.write_at(want.get(have.len()..).unwrap_or(&[]), len)
            .map_err(io_err)?;
    } else {
        file.set_len(0).map_err(io_err)?;
        file.write_at(&want, 0).map_err(io_err)?;
    }
    file.set_len(want.len() as u64).map_err(io_err)?;
    notes.push(format!(
        "{}: index brought in line with the log ({} entries)",
        path.display(),
        entries.len()
    ));
    Ok(file)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use crate::engine::io::RealStorage;

    /// Real storage that records every fsync, in order, as (kind, file name).
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<(&'static str, String)>>);

    #[derive(Debug)]
    struct RecFile {
        inner: Box<dyn StorageFile>,
        name: String,
        rec: Arc<Recorder>,
    }

    impl Recorder {
        fn push(&self, kind: &'static str, name: &str) {
            self.0.lock().unwrap().push((kind, name.to_string()));
        }
        fn take(&self) -> Vec<(&'static str, String)> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    fn file_name(p: &Path) -> String {
        p.file_name().unwrap().to_string_lossy().into_owned()
    }

    impl StorageFile for RecFile {
        fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
            self.inner.write_at(buf, pos)
        }
        fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
            self.inner.read_at(buf, pos)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
        fn allocate(&self, len: u64) -> io::Result<()> {
            self.inner.allocate(len)
        }
        fn sync_data(&self) -> io::Result<()> {
            self.rec.push("sync_data", &self.name);
            self.inner.sync_data()
        }
        fn sync_all(&self) -> io::Result<()> {
            self.rec.push("sync_all", &self.name);
            self.inner.sync_all()
        }
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
    }

    #[derive(Debug)]
    struct RecStorage(Arc<Recorder>);

    impl Storage for RecStorage {
        fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
            Ok(Box::new(RecFile {
                inner: RealStorage.create(path)?,
                name: file_name(path),
                rec: self.0.clone(),
            }))
        }
        fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
            Ok(Box::new(RecFile {
                inner: RealStorage.open(path)?,
                name: file_name(path),
                rec: self.0.clone(),
            }))
        }
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            RealStorage.create_dir_all(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            RealStorage.rename(from, to)
        }
        fn remove_file(&self, path: &Path) -> io::Result<()> {
            RealStorage.remove_file(path)
        }
        fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
            RealStorage.remove_dir_all(path)
        }
        fn sync_dir(&self, path: &Path) -> io::Result<()> {
            self.0.push("sync_dir", &file_name(path));
            RealStorage.sync_dir(path)
        }
    }

    fn new_log(dir: &Path, storage: StorageRef) -> PartitionLog {
        let stats = Arc::new(LogStats::default());
        create_first_segment(&*storage, dir, &stats).unwrap();
        PartitionLog::open("t", 0, dir, storage, stats).unwrap().0
    }

    fn config(segment_bytes: u64) -> TopicConfig {
        TopicConfig {
            segment_bytes,
            ..TopicConfig::default()
        }
    }

    fn value_of(log: &PartitionLog, offset: u64, budget: u32) -> Vec<(u64, usize)> {
        let f = log.fetch(offset, budget, Duration::ZERO).unwrap();
        let mut out = Vec::new();
        for c in &f.chunks {
            let mut pos = 0;
            while pos < c.bytes.len() {
                let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
                out.push((r.offset, r.value.len()));
                pos += r.encoded_len;
            }
        }
        out
    }

    #[test]
    fn a_roll_is_made_durable_before_the_new_segment_is_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Arc::new(Recorder::default());
        let log = new_log(dir.path(), Arc::new(RecStorage(rec.clone())));
        let v = vec![7u8; 600];
        let a = log
            .append(
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp_ms: 1,
                }],
                &config(1024),
            )
            .unwrap();
        log.wait_durable(a.last_offset + 1).unwrap();
        rec.take();
        // Does not fit: rolls to segment 1. Nothing is synced by the roll itself.
        let b = log
            .append(
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp_ms: 1,
                }],
                &config(1024),
            )
            .unwrap();
        assert_eq!(b.base_offset, 1);
        assert_eq!(rec.take(), []);
        assert_eq!(log.durable_end(), 1);
        assert_eq!(
            value_of(&log, 1, 1 << 20),
            [],
            "not served before it is durable"
        );
        log.wait_durable(2).unwrap();
        let old = log_file_name(0);
        let new = log_file_name(1);
        assert_eq!(
            rec.take(),
            [
                ("sync_all", old),
                ("sync_all", index_file_name(0)),
                ("sync_all", new.clone()),
                ("sync_dir", file_name(dir.path())),
                ("sync_data", new),
            ]
        );
        assert_eq!(value_of(&log, 0, 1 << 20), [(0, 600), (1, 600)]);
        assert_eq!(log.snapshot().len(), 2);
    }

    #[test]
    fn records_larger_than_the_read_window_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = new_log(dir.path(), Arc::new(RealStorage));
        let big = vec![1u8; 300 * 1024];
        let small = vec![2u8; 10];
        let recs = [
            NewRecord {
                key: None,
                value: &small,
                timestamp_ms: 1,
            },
            NewRecord {
                key: None,
                value: &big,
                timestamp_ms: 1,
            },
            NewRecord {
                key: None,
                value: &big,
                timestamp_ms: 1,
            },
            NewRecord {
                key: None,
                value: &small,
                timestamp_ms: 1,
            },
        ];
        let a = log.append(&recs, &config(64 << 20)).unwrap();
        log.wait_durable(a.last_offset + 1).unwrap();
        assert_eq!(value_of(&log, 0, 1), [(0, 10)]);
        assert_eq!(value_of(&log, 1, 1), [(1, 300 * 1024)]);
        assert_eq!(
            value_of(&log, 1, 700 * 1024),
            [(1, 300 * 1024), (2, 300 * 1024), (3, 10)]
        );
        assert_eq!(
            value_of(&log, 0, 200 * 1024),
            [(0, 10)],
            "the budget stops before the big record"
        );
        assert_eq!(value_of(&log, 3, 1 << 20), [(3, 10)]);
    }

    #[test]
    fn removed_and_replaced_segments_keep_serving_readers_that_hold_them() {
        let dir = tempfile::tempdir().unwrap();
        let log = new_log(dir.path(), Arc::new(RealStorage));
        let v = vec![5u8; 100];
        for _ in 0..30 {
            let a = log
                .append(
                    &[NewRecord {
                        key: None,
                        value: &v,
                        timestamp_ms: 1,
                    }],
                    &config(1024),
                )
                .unwrap();
            log.wait_durable(a.last_offset + 1).unwrap();
        }
        let held = log.snapshot();
        let settled = log.settled_segments();
        assert_eq!(settled.len(), held.len() - 1, "all but the active one");
        let oldest = held[0].clone();
        let bytes_before = read_segment(&oldest, 0, 1 << 20, true).unwrap().bytes;
        // Retention: the list no longer has it, its files are gone ...
        let gone = log.remove_oldest(&[oldest.base_offset]).unwrap();
        assert_eq!(gone.len(), 1);
        assert!(!oldest.path().exists());
        assert_eq!(log.start_offset(), held[1].base_offset);
        assert!(matches!(
            log.fetch(0, 1 << 20, Duration::ZERO),
            Err(EngineError::OffsetOutOfRange { start, .. }) if start == held[1].base_offset
        ));
        // ... yet a reader holding it reads the same bytes through its open file.
        assert_eq!(
            read_segment(&oldest, 0, 1 << 20, true).unwrap().bytes,
            bytes_before
        );
        // Only the oldest segments, in order, and never the active one.
        assert!(log.remove_oldest(&[held[2].base_offset]).is_err());
        let active = held.last().unwrap().base_offset;
        let all_but: Vec<u64> = held[1..].iter().map(|s| s.base_offset).collect();
        assert!(log.remove_oldest(&all_but).is_err());
        assert!(log.snapshot().iter().any(|s| s.base_offset == active));
    }

    #[test]
    fn a_fetch_continues_into_the_next_segment() {
        let dir = tempfile::tempdir().unwrap();
        let log = new_log(dir.path(), Arc::new(RealStorage));
        let v = vec![3u8; 100];
        for _ in 0..40 {
            let a = log
                .append(
                    &[NewRecord {
                        key: None,
                        value: &v,
                        timestamp_ms: 1,
                    }],
                    &config(1024),
                )
                .unwrap();
            log.wait_durable(a.last_offset + 1).unwrap();
        }
        let segs = log.snapshot();
        assert!(segs.len() > 3);
        let boundary = segs[1].base_offset;
        let got = value_of(&log, boundary - 2, 1 << 20);
        assert_eq!(
            got.iter().map(|r| r.0).collect::<Vec<_>>(),
            (boundary - 2..40).collect::<Vec<_>>()
        );
        let f = log.fetch(boundary - 2, 1 << 20, Duration::ZERO).unwrap();
        assert_eq!(f.chunks.len(), segs.len(), "one chunk per segment read");
        assert_eq!((f.start_offset, f.end_offset), (0, 40));
    }
}
