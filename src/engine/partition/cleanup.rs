//! Background cleanup in the running broker: rolling a
//! quiet partition by age, retention (by age and by size, with an optional copy to
//! cold storage first) and compaction, one partition at a time.
//!
//! Invariants:
//! - The active segment, and a sealed segment whose roll still waits for its fsyncs,
//!   are never deleted, copied or compacted ([`PartitionLog::settled_segments`]).
//! - Work on one partition is serialized by its [`PartitionCleanup`] lock: retention
//!   and compaction never overlap, and deleting a topic waits for the work in progress
//!   on its partitions (which then changes nothing, the log being closed).
//! - Retention removes only a prefix of the segment list, so the start offset only
//!   moves forward and segments always join up. With a cold-storage directory, a
//!   segment is removed only once its copy (log and index) and the directories holding
//!   it are fsynced; a failed copy keeps it (and every newer one) for the next round.
//! - Compaction is the shared [`crate::engine::maintenance::compaction`] with its swap protocol;
//!   step 2 runs under the partition's write lock ([`PartitionLog::sealed_unchanged`])
//!   and the new list is published by [`PartitionLog::replace_oldest`].
//! - Everything background work writes goes through `PacedStorage`: flushed every
//!   `PACE_FLUSH_BYTES`, at most `PACE_BYTES_PER_SEC`, and refused once the broker
//!   stops or the partition's log closes.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::engine::error::{EngineError, FailureReason};
use crate::engine::maintenance::compaction::{
    prepare_compaction, CompactionError, CompactionOptions, CompactionReport, Kept,
};
use crate::engine::partition::{PartitionLog, Segment};
use crate::engine::storage::io::Storage;
use crate::engine::storage::layout::PartitionRef;
use crate::format::names::{index_file_name, log_file_name};
use crate::format::topic::TopicConfig;

/// Bytes copied per read and write when copying a segment to cold storage.
const COPY_CHUNK_BYTES: usize = 1024 * 1024;
/// Background writes are flushed to disk after every this many bytes.
const PACE_FLUSH_BYTES: u64 = 1024 * 1024;
/// Background writes go at most this fast (bytes per second).
const PACE_BYTES_PER_SEC: u64 = 32 * 1024 * 1024;

/// What background cleanup did to one partition since the broker started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleanupStats {
    /// Wall-clock time (ms since the epoch) retention last visited; -1: never.
    pub last_retention_ms: i64,
    /// Segments retention removed.
    pub segments_deleted: u64,
    /// Bytes of the segments retention removed.
    pub bytes_deleted: u64,
    /// Segments copied to cold storage before their removal.
    pub segments_archived: u64,
    /// Wall-clock time compaction last visited; -1: never.
    pub last_compaction_ms: i64,
    /// Compactions that swapped in new segments.
    pub compactions: u64,
    /// Records compaction dropped.
    pub records_dropped: u64,
    /// Bytes compaction freed (segment bytes before minus after).
    pub bytes_compacted: u64,
    /// The last failure of retention or compaction on this partition, if the last
    /// visit failed.
    pub last_error: Option<String>,
    /// Retention visits, and those that failed.
    pub retention_runs: u64,
    pub retention_errors: u64,
    /// Compaction visits that did work or failed (not idle or cancelled ones), and
    /// those that failed.
    pub compaction_runs: u64,
    pub compaction_errors: u64,
}

impl Default for CleanupStats {
    fn default() -> Self {
        CleanupStats {
            last_retention_ms: -1,
            segments_deleted: 0,
            bytes_deleted: 0,
            segments_archived: 0,
            last_compaction_ms: -1,
            compactions: 0,
            records_dropped: 0,
            bytes_compacted: 0,
            last_error: None,
            retention_runs: 0,
            retention_errors: 0,
            compaction_runs: 0,
            compaction_errors: 0,
        }
    }
}

#[derive(Debug, Default)]
struct CleanupState {
    stats: CleanupStats,
    /// The settled segments a compaction left (or found nothing to drop in), and when:
    /// an unchanged set is not read again until a tombstone in it may have expired.
    compacted: Option<(Vec<u64>, i64)>,
}

/// The cleanup state of one partition.
#[derive(Debug, Default)]
pub struct PartitionCleanup {
    busy: Mutex<()>,
    state: Mutex<CleanupState>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PartitionCleanup {
    /// What cleanup did so far.
    pub fn stats(&self) -> CleanupStats {
        lock(&self.state).stats.clone()
    }

    /// Waits for the work in progress on the partition and keeps new work out while
    /// the guard lives.
    pub fn exclusive(&self) -> MutexGuard<'_, ()> {
        lock(&self.busy)
    }
}

/// One partition as a cleanup visit sees it.
#[derive(Clone, Copy, Debug)]
pub struct Visit<'a> {
    pub topic: &'a str,
    pub partition: u32,
    pub log: &'a Arc<PartitionLog>,
    pub cleanup: &'a PartitionCleanup,
    pub config: &'a TopicConfig,
    pub storage: &'a dyn Storage,
    /// The clock, in milliseconds since the epoch.
    pub now_ms: i64,
    /// Set when the broker stops: work in progress gives up at its next write.
    pub stopping: &'a Arc<AtomicBool>,
}

/// What one retention visit did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionDone {
    /// Base offsets of the segments removed.
    pub removed: Vec<u64>,
    pub bytes: u64,
    /// Segments copied to cold storage.
    pub archived: u64,
    /// Why a segment due for removal was kept (a failed cold-storage copy).
    pub kept_because: Option<String>,
}

/// What one compaction visit did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompactionDone {
    /// Nothing sealed, or the sealed segments are unchanged since the last run.
    Idle,
    /// Read everything; nothing to drop.
    Skipped(CompactionReport),
    /// New segments swapped in.
    Swapped(CompactionReport),
    /// The sealed segments changed while compacting; retried next round.
    Cancelled,
}

impl Visit<'_> {
    fn label(&self) -> String {
        format!("{}/{}", self.topic, self.partition)
    }

    /// The storage background writes go through: paced, and giving up once the
    /// broker stops or the partition closes (its topic deleted).
    fn paced(&self) -> PacedStorage<'_> {
        PacedStorage {
            inner: self.storage,
            log: self.log.clone(),
            stopping: self.stopping.clone(),
        }
    }

    /// Why work that gave up did so, as the error its caller expects.
    fn given_up(&self) -> Option<EngineError> {
        if self.stopping.load(Ordering::Acquire) {
            return Some(EngineError::ShuttingDown);
        }
        self.log.check_writable_pub().err()
    }

    /// Rolls the active segment by age (any cleanup policy), so a quiet partition's
    /// data can age out and be compacted.
    pub fn roll_if_due(&self) -> Result<bool, EngineError> {
        let _busy = self.cleanup.exclusive();
        self.log.roll_if_due(self.config, self.now_ms)
    }

    /// Retention on one partition: picks the oldest settled segments that are past
    /// `retention_ms` (by their newest record) or needed to bring the partition under
    /// `retention_bytes`, copies them to `cold` when given, and removes them.
    pub fn retention(&self, cold: Option<&Path>) -> Result<RetentionDone, EngineError> {
        let _busy = self.cleanup.exclusive();
        let result = self.retention_locked(cold);
        let mut st = lock(&self.cleanup.state);
        st.stats.last_retention_ms = self.now_ms;
        st.stats.retention_runs += 1;
        st.stats.retention_errors += u64::from(result.is_err());
        match &result {
            Ok(done) => {
                st.stats.segments_deleted += done.removed.len() as u64;
                st.stats.bytes_deleted += done.bytes;
                st.stats.segments_archived += done.archived;
                st.stats.last_error = done.kept_because.clone();
            }
            Err(e) => st.stats.last_error = Some(format!("retention: {e}")),
        }
        result
    }

    fn retention_locked(&self, cold: Option<&Path>) -> Result<RetentionDone, EngineError> {
        let config = self.config;
        let mut done = RetentionDone::default();
        self.log.retry_removals()?;
        if config.retention_ms < 0 && config.retention_bytes < 0 {
            return Ok(done);
        }
        let settled = self.log.settled_segments();
        let mut left: u64 = self.log.snapshot().iter().map(|s| s.bytes()).sum();
        let mut due: Vec<&Segment> = Vec::new();
        for seg in &settled {
            let by_size = u64::try_from(config.retention_bytes).is_ok_and(|max| left > max);
            let by_age = config.retention_ms >= 0
                && match seg.max_timestamp()? {
                    Some(ts) => self.now_ms.saturating_sub(ts) > config.retention_ms,
                    None => true,
                };
            if !(by_size || by_age) {
                break;
            }
            left = left.saturating_sub(seg.bytes());
            due.push(seg);
        }
        if let Some(dir) = cold {
            let mut copied = 0;
            for seg in &due {
                if let Err(e) = archive(&self.paced(), dir, self.topic, self.partition, seg) {
                    if let Some(why) = self.given_up() {
                        return Err(why);
                    }
                    done.kept_because = Some(format!(
                        "copying {} to cold storage {} failed, the segment stays (retried next round): {e}",
                        seg.path().display(),
                        dir.display()
                    ));
                    break;
                }
                tracing::info!(
                    topic = self.topic,
                    partition = self.partition,
                    base_offset = seg.base_offset,
                    bytes = seg.bytes(),
                    cold_storage = %dir.display(),
                    "copied a segment to cold storage"
                );
                copied += 1;
            }
            due.truncate(copied);
            done.archived = copied as u64;
        }
        if due.is_empty() {
            return Ok(done);
        }
        let bases: Vec<u64> = due.iter().map(|s| s.base_offset).collect();
        if cold.is_some() {
            let removed = self.log.remove_oldest(&bases)?;
            done.bytes = removed.iter().map(|s| s.bytes()).sum();
        } else {
            // Without cold storage the files may become spares: no segment of them
            // may still be held here.
            drop(due);
            drop(settled);
            let spare_bytes_max = self.log.spare_bytes_max(config.segment_bytes);
            done.bytes = self.log.retire_oldest_within(&bases, spare_bytes_max)?;
        }
        tracing::info!(
            topic = self.topic,
            partition = self.partition,
            segments = bases.len(),
            base_offsets = ?bases,
            bytes = done.bytes,
            start_offset = self.log.start_offset(),
            "retention removed segments"
        );
        done.removed = bases;
        Ok(done)
    }

    /// Compaction on one partition (docs/FORMAT.md, Compaction), with the topic's
    /// `tombstone_retention_ms` and `segment_bytes` and the visit's clock.
    pub fn compaction(&self) -> Result<CompactionDone, EngineError> {
        let _busy = self.cleanup.exclusive();
        let result = self.compaction_locked();
        let mut st = lock(&self.cleanup.state);
        st.stats.last_compaction_ms = self.now_ms;
        if !matches!(result, Ok(CompactionDone::Idle | CompactionDone::Cancelled)) {
            st.stats.compaction_runs += 1;
        }
        st.stats.compaction_errors += u64::from(result.is_err());
        match &result {
            Ok(CompactionDone::Swapped(r)) => {
                st.stats.compactions += 1;
                st.stats.records_dropped += r.records_dropped;
                st.stats.bytes_compacted += r.bytes_before.saturating_sub(r.bytes_after);
                st.stats.last_error = None;
                st.compacted = Some((r.new.clone(), self.now_ms));
            }
            Ok(CompactionDone::Skipped(r)) => {
                st.stats.last_error = None;
                st.compacted = Some((r.replaced.clone(), self.now_ms));
            }
            Ok(CompactionDone::Idle | CompactionDone::Cancelled) => {}
            Err(e) => st.stats.last_error = Some(format!("compaction: {e}")),
        }
        result
    }

    fn compaction_locked(&self) -> Result<CompactionDone, EngineError> {
        let log = self.log;
        // Leftover files of an earlier retention would look like sealed segments.
        log.retry_removals()?;
        // Rolls waiting for their fsyncs would make the newest sealed segment unsettled.
        log.sync_pending()?;
        let settled: Vec<u64> = log
            .settled_segments()
            .iter()
            .map(|s| s.base_offset)
            .collect();
        if settled.is_empty() {
            return Ok(CompactionDone::Idle);
        }
        if let Some((bases, at)) = &lock(&self.cleanup.state).compacted {
            let expiry = self.config.tombstone_retention_ms.max(0);
            if *bases == settled && self.now_ms.saturating_sub(*at) <= expiry {
                return Ok(CompactionDone::Idle);
            }
        }
        let p = PartitionRef {
            dir: log.dir().to_path_buf(),
            topic: Some(self.topic.to_string()),
            partition: Some(self.partition),
            config: self.config.clone(),
            only_segment: None,
        };
        let opts = CompactionOptions::for_topic(self.config, self.now_ms);
        let paced = self.paced();
        let prepared = match prepare_compaction(&paced, &p, &opts) {
            Ok(prepared) => prepared,
            Err(e) => return Err(self.given_up().unwrap_or(EngineError::Compaction(e))),
        };
        if !prepared.needs_swap() {
            return Ok(CompactionDone::Skipped(prepared.into_report()));
        }
        let replaced = prepared.replaced().to_vec();
        // 2. Under the write lock: the sealed segments are still the ones read.
        if !log.sealed_unchanged(&replaced) {
            prepared.cancel().map_err(|e| {
                EngineError::io(
                    format!("removing compaction output in {}", p.dir.display()),
                    e,
                )
            })?;
            return Ok(CompactionDone::Cancelled);
        }
        if let Err(e) = log.hold_files(&replaced) {
            prepared.cancel().map_err(|e| {
                EngineError::io(
                    format!("removing compaction output in {}", p.dir.display()),
                    e,
                )
            })?;
            return Err(e);
        }
        // The replaced segments' logs may become spares (docs/FORMAT.md, Spares):
        // those within rule 4's size, as many as the pool has room for. The swap
        // moves them to `spares/`; they enter the pool once the swap is durable and
        // published, if nobody holds them by then.
        let spare_bytes_max = log.spare_bytes_max(self.config.segment_bytes);
        let replaced_segs: Vec<Arc<Segment>> = log
            .snapshot()
            .iter()
            .filter(|s| replaced.contains(&s.base_offset))
            .cloned()
            .collect();
        let fitting: Vec<u64> = replaced_segs
            .iter()
            .filter(|s| s.bytes() <= spare_bytes_max)
            .map(|s| s.base_offset)
            .collect();
        let (spares_dir, names) = log.stats.spares.reserve(fitting.len(), log.dir());
        let kept = Kept {
            dir: spares_dir,
            logs: fitting.into_iter().zip(names).collect(),
        };
        let mut new = Vec::new();
        match prepared.swap_keeping(&mut |bases| new = bases.to_vec(), &kept) {
            Ok(report) => {
                log.replace_oldest(&replaced, &new)?;
                log.admit_kept(replaced_segs, &kept);
                tracing::info!(
                    topic = self.topic,
                    partition = self.partition,
                    records_dropped = report.records_dropped,
                    bytes_before = report.bytes_before,
                    bytes_after = report.bytes_after,
                    replaced = ?report.replaced,
                    new = ?report.new,
                    "compaction swapped in new segments"
                );
                Ok(CompactionDone::Swapped(report))
            }
            Err(e @ CompactionError::Interrupted { .. }) => {
                Err(log.mark_failed(FailureReason::CompactionInterrupted {
                    label: self.label(),
                    error: Arc::new(e),
                }))
            }
            Err(e) => Err(EngineError::Compaction(e)),
        }
    }
}

/// Copies a segment (its log through its own read handle, its index from memory) to
/// `cold/<topic>/<partition>/`:
/// 1. create the directories (0700);
/// 2. per file: write `<name>.tmp`, fsync it, rename it to `<name>`;
/// 3. fsync the partition directory, and each directory above it up to `cold` (and
///    `cold`'s parent), so the copy survives a crash before the local removal.
pub fn archive(
    storage: &dyn Storage,
    cold: &Path,
    topic: &str,
    partition: u32,
    seg: &Segment,
) -> io::Result<()> {
    let topic_dir = cold.join(topic);
    let dir = topic_dir.join(partition.to_string());
    // 1.
    storage.create_dir_all(&dir)?;
    // 2.
    let file = seg.file()?;
    copy_file(storage, &dir, &log_file_name(seg.base_offset), |f| {
        let len = seg.bytes();
        let mut buf = vec![0u8; COPY_CHUNK_BYTES];
        let mut pos = 0u64;
        while pos < len {
            let want =
                usize::try_from(len - pos).map_or(COPY_CHUNK_BYTES, |n| n.min(COPY_CHUNK_BYTES));
            let chunk = buf.get_mut(..want).unwrap_or(&mut []);
            let n = crate::engine::storage::reader::read_full_at(&file, chunk, pos)?;
            if n < want {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{} ends before {len} bytes", seg.path().display()),
                ));
            }
            f.write_at(chunk, pos)?;
            pos += n as u64;
        }
        Ok(())
    })?;
    let index = seg.index_bytes();
    copy_file(storage, &dir, &index_file_name(seg.base_offset), |f| {
        f.write_at(&index, 0)
    })?;
    // 3.
    let parent = cold
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    for d in [dir.as_path(), topic_dir.as_path(), cold, parent.as_path()] {
        storage.sync_dir(d)?;
    }
    Ok(())
}

/// Writes `dir/<name>` by way of `<name>.tmp`: create, fill, fsync, rename.
fn copy_file(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&dyn crate::engine::storage::io::StorageFile) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = dir.join(crate::format::names::tmp_file_name(name));
    match storage.remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let result = (|| {
        let f = storage.create(&tmp)?;
        fill(&*f)?;
        f.sync_all()?;
        drop(f);
        storage.rename(&tmp, &dir.join(name))
    })();
    if result.is_err() && tmp.exists() {
        let _ = storage.remove_file(&tmp);
    }
    result
}

/// The storage background compaction and cold-storage copies write through: a file
/// it creates is flushed
/// (`sync_data`) after every [`PACE_FLUSH_BYTES`] written, and writes go no faster
/// than [`PACE_BYTES_PER_SEC`], so its data reaches the disk in small pieces rather
/// than as one burst at its final fsync. A burst of tens
/// of MiB would sit in the device queue (and, on ext4, in the journal commit) ahead of
/// the fsyncs produce requests wait for.
///
/// Writes fail (`Interrupted`) once the broker stops or the partition's log closes, so
/// a shutdown or a topic delete does not wait for a long compaction or copy: before
/// its marker a compaction that gives up changes nothing.
#[derive(Debug)]
struct PacedStorage<'a> {
    inner: &'a dyn Storage,
    log: Arc<PartitionLog>,
    stopping: Arc<AtomicBool>,
}

#[derive(Debug)]
struct PacedFile {
    inner: Box<dyn crate::engine::storage::io::StorageFile>,
    log: Arc<PartitionLog>,
    stopping: Arc<AtomicBool>,
    unflushed: AtomicU64,
    /// When the file was created: its bytes may be written at the paced rate since.
    started: Instant,
    written: AtomicU64,
}

impl crate::engine::storage::io::StorageFile for PacedFile {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        if self.stopping.load(Ordering::Acquire) || self.log.check_writable_pub().is_err() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "background work gave up: the broker is stopping or the topic was deleted",
            ));
        }
        self.inner.write_at(buf, pos)?;
        let n = self
            .unflushed
            .fetch_add(buf.len() as u64, Ordering::Relaxed)
            + buf.len() as u64;
        let total = self.written.fetch_add(buf.len() as u64, Ordering::Relaxed) + buf.len() as u64;
        if n >= PACE_FLUSH_BYTES {
            self.unflushed.store(0, Ordering::Relaxed);
            self.inner.sync_data()?;
            let due = Duration::from_secs_f64(total as f64 / PACE_BYTES_PER_SEC as f64);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        Ok(())
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
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl Storage for PacedStorage<'_> {
    fn create(&self, path: &Path) -> io::Result<Box<dyn crate::engine::storage::io::StorageFile>> {
        Ok(Box::new(PacedFile {
            inner: self.inner.create(path)?,
            log: self.log.clone(),
            stopping: self.stopping.clone(),
            unflushed: AtomicU64::new(0),
            started: Instant::now(),
            written: AtomicU64::new(0),
        }))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn crate::engine::storage::io::StorageFile>> {
        self.inner.open(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
}
