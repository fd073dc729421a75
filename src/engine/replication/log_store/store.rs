//! [`RaftLog`]: openraft's log storage on a [`PartitionLog`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{OptionalSend, RaftTypeConfig};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::entry::{StoredEntry, StoredLeaderId, StoredLogId};
use super::key::{decode_entry_key, encode_entry_key, EntryKey, ENTRY_KEY_LEN};
use super::meta::{read_state, write_state, RaftState, StateFileError};
use crate::engine::error::EngineError;
use crate::engine::partition::{LogStats, NewRecord, PartitionLog, BATCH_BYTES_MAX};
use crate::engine::storage::io::StorageRef;
use crate::format::decode_record;
use crate::format::topic::TopicConfig;
use crate::format::wire::FETCH_BYTES_MAX;

/// The type configurations a [`RaftLog`] serves: `u64` terms and node ids, the
/// advanced (term, node id) leader id, entries the log can store ([`StoredEntry`]:
/// openraft's `Entry` over an [`super::EntryCodec`] payload) and a vote serde writes.
pub trait RaftLogTypes:
    RaftTypeConfig<
    NodeId = u64,
    Term = u64,
    LeaderId = StoredLeaderId,
    Entry: StoredEntry + Clone,
    Vote: Serialize + DeserializeOwned + Clone,
>
{
}

impl<C> RaftLogTypes for C where
    C: RaftTypeConfig<
        NodeId = u64,
        Term = u64,
        LeaderId = StoredLeaderId,
        Entry: StoredEntry + Clone,
        Vote: Serialize + DeserializeOwned + Clone,
    >
{
}

/// Longest the committed id in the state file lags the one openraft last gave.
const COMMITTED_SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// Largest record value (an entry's payload) the log takes and reads.
pub const ENTRY_VALUE_BYTES_MAX: u32 = 32 * 1024 * 1024;
/// Durable entries a log keeps in memory besides the unflushed ones (the newest,
/// which replication sends and the state machine applies next), in encoded bytes:
/// beyond it, reads go to disk. Each log keeps up to [`RECENT_BYTES_MIN`] whatever
/// the others hold, and up to [`RECENT_BYTES_MAX`] while the logs of the process
/// together hold less than [`PROCESS_RECENT_BYTES_MAX`]. (A 2 MiB cache made a
/// follower under a batch-100 load read a tenth of its entries back from disk to
/// apply them.)
const RECENT_BYTES_MIN: usize = 2 << 20;
const RECENT_BYTES_MAX: usize = 16 << 20;
const PROCESS_RECENT_BYTES_MAX: usize = 256 << 20;
/// What every log of the process holds in its `recent` cache.
static PROCESS_RECENT_BYTES: AtomicUsize = AtomicUsize::new(0);
const _: () = assert!(ENTRY_VALUE_BYTES_MAX as u64 + 64 <= BATCH_BYTES_MAX);

/// Why a Raft log cannot be opened or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RaftLogError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    State(#[from] StateFileError),
    #[error("creating {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("recovering {path}: {detail}")]
    Recovery { path: PathBuf, detail: String },
    #[error("{path}: entry {index}: {detail}")]
    BadEntry {
        path: PathBuf,
        index: u64,
        detail: String,
    },
}

/// The segment configuration of every Raft log: a record may carry a whole request.
pub fn raft_log_config() -> TopicConfig {
    TopicConfig {
        max_record_bytes: ENTRY_VALUE_BYTES_MAX + ENTRY_KEY_LEN as u32 + 64,
        retention_ms: -1,
        retention_bytes: -1,
        ..TopicConfig::default()
    }
}

/// What the store keeps in memory under one lock.
struct Shared<C: RaftLogTypes> {
    state: RaftState<C::Vote>,
    /// The newest entries by index, with their encoded sizes: every entry written but
    /// not yet known durable (reads serve them from here until the group commit that
    /// covers them publishes them on disk), and the durable ones before them up to
    /// the cache's budget ([`RECENT_BYTES_MAX`]). Always a contiguous run ending at
    /// the log's end. Changed only through the methods below, which keep
    /// [`PROCESS_RECENT_BYTES`] with it.
    recent: BTreeMap<u64, (C::Entry, usize)>,
    /// The sum of the sizes in `recent`.
    recent_bytes: usize,
    /// When the state file was last written (it carries the committed id).
    committed_saved: Option<Instant>,
}

impl<C: RaftLogTypes> Shared<C> {
    /// Caches entry `index` of `bytes` encoded bytes.
    fn remember(&mut self, index: u64, entry: C::Entry, bytes: usize) {
        if let Some((_, old)) = self.recent.insert(index, (entry, bytes)) {
            self.forget_bytes(old);
        }
        self.recent_bytes += bytes;
        PROCESS_RECENT_BYTES.fetch_add(bytes, Ordering::Relaxed);
    }

    fn forget_bytes(&mut self, bytes: usize) {
        self.recent_bytes -= bytes;
        PROCESS_RECENT_BYTES.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Whether the cache is past its budget: [`RECENT_BYTES_MAX`], or
    /// [`RECENT_BYTES_MIN`] while the process's logs hold too much together.
    fn over_budget(&self) -> bool {
        self.recent_bytes > RECENT_BYTES_MAX
            || (self.recent_bytes > RECENT_BYTES_MIN
                && PROCESS_RECENT_BYTES.load(Ordering::Relaxed) > PROCESS_RECENT_BYTES_MAX)
    }

    /// Drops the oldest durable entries (below `durable`) past the memory budget.
    fn trim_recent(&mut self, durable: u64) {
        while self.over_budget() {
            let Some(entry) = self.recent.first_entry() else {
                break;
            };
            if *entry.key() >= durable {
                break;
            }
            let (_, (_, n)) = entry.remove_entry();
            self.forget_bytes(n);
        }
    }

    /// Keeps the entries below `cut` (a truncation).
    fn keep_recent_below(&mut self, cut: u64) {
        for (_, (_, n)) in self.recent.split_off(&cut) {
            self.forget_bytes(n);
        }
    }

    /// Keeps the entries from `first` on (a purge, a restart at `first`).
    fn keep_recent_from(&mut self, first: u64) {
        let kept = self.recent.split_off(&first);
        let dropped: usize = std::mem::replace(&mut self.recent, kept)
            .values()
            .map(|(_, n)| *n)
            .sum();
        self.forget_bytes(dropped);
    }
}

impl<C: RaftLogTypes> Drop for Shared<C> {
    fn drop(&mut self) {
        PROCESS_RECENT_BYTES.fetch_sub(self.recent_bytes, Ordering::Relaxed);
    }
}

enum Job<C: RaftTypeConfig> {
    /// Call back once every offset below `target` is durable.
    Flush { target: u64, done: IOFlushed<C> },
    /// Answer once every job before it is done.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

struct Inner<C: RaftLogTypes> {
    dir: PathBuf,
    storage: StorageRef,
    log: Arc<PartitionLog>,
    config: TopicConfig,
    shared: Arc<Mutex<Shared<C>>>,
    jobs: Mutex<mpsc::Sender<Job<C>>>,
}

/// One Raft group's log: openraft's [`RaftLogStorage`] and [`RaftLogReader`] on a
/// [`PartitionLog`] in `dir`. Cloning gives another handle on the same log (the
/// reader openraft asks for is one).
pub struct RaftLog<C: RaftLogTypes> {
    inner: Arc<Inner<C>>,
}

impl<C: RaftLogTypes> Clone for RaftLog<C> {
    fn clone(&self) -> Self {
        RaftLog {
            inner: self.inner.clone(),
        }
    }
}

impl<C: RaftLogTypes> Debug for RaftLog<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLog")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl<C: RaftLogTypes> RaftLog<C> {
    /// Opens (creating it when missing) the Raft log in `dir`: runs recovery on its
    /// segments first (a torn tail is cut as for any partition), reads its state file,
    /// and brings a log purged past its end to continue after the purge point.
    pub fn open(
        dir: &Path,
        storage: StorageRef,
        stats: Arc<LogStats>,
    ) -> Result<Self, RaftLogError> {
        Self::open_with(dir, storage, stats, raft_log_config())
    }

    /// [`RaftLog::open`] with the segment settings `config` (tests: small segments).
    pub(crate) fn open_with(
        dir: &Path,
        storage: StorageRef,
        stats: Arc<LogStats>,
        config: TopicConfig,
    ) -> Result<Self, RaftLogError> {
        let log_dir = dir.join(super::LOG_DIR);
        storage
            .create_dir_all(&log_dir)
            .map_err(|source| RaftLogError::Create {
                path: log_dir.clone(),
                source,
            })?;
        super::recover_dir(&*storage, &log_dir)?;
        let state: RaftState<C::Vote> = read_state(dir)?;
        let label = dir.display().to_string();
        let (log, notes) = PartitionLog::open(&label, 0, &log_dir, storage.clone(), stats)?;
        for note in notes {
            tracing::info!(dir = %dir.display(), "{note}");
        }
        let log = Arc::new(log);
        if let Some(p) = &state.purged {
            let next = p.index.saturating_add(1);
            if log.written_end() <= next {
                log.restart_at(next)?;
            }
        }
        let shared = Arc::new(Mutex::new(Shared {
            state,
            recent: BTreeMap::new(),
            recent_bytes: 0,
            committed_saved: None,
        }));
        let (tx, rx) = mpsc::channel();
        let flusher_log = log.clone();
        let flusher_shared = shared.clone();
        std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || flusher::<C>(rx, flusher_log, flusher_shared))
            .map_err(|source| RaftLogError::Create {
                path: dir.to_path_buf(),
                source,
            })?;
        Ok(RaftLog {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                storage,
                log,
                config,
                shared,
                jobs: Mutex::new(tx),
            }),
        })
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The segment log under the Raft log (index i is record offset i).
    pub fn partition_log(&self) -> &Arc<PartitionLog> {
        &self.inner.log
    }

    /// The state file's content as this process holds it.
    pub fn state(&self) -> RaftState<C::Vote> {
        lock(&self.inner.shared).state.clone()
    }

    fn send(&self, job: Job<C>) -> io::Result<()> {
        lock(&self.inner.jobs)
            .send(job)
            .map_err(|_| io_err("the Raft log's flusher stopped"))
    }

    /// Waits until every flush asked for so far has been answered.
    async fn barrier(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Job::Barrier(tx))?;
        rx.await
            .map_err(|_| io_err("the Raft log's flusher stopped"))
    }

    fn save_state(&self, change: impl FnOnce(&mut RaftState<C::Vote>)) -> io::Result<()> {
        let mut sh = lock(&self.inner.shared);
        let mut next = sh.state.clone();
        change(&mut next);
        write_state(&*self.inner.storage, &self.inner.dir, &next)?;
        sh.state = next;
        sh.committed_saved = Some(Instant::now());
        Ok(())
    }

    /// The first index a read can return.
    fn first_index(&self, sh: &Shared<C>) -> u64 {
        let purged_next = sh
            .state
            .purged
            .as_ref()
            .map_or(0, |p| p.index.saturating_add(1));
        purged_next.max(self.inner.log.start_offset())
    }

    /// Entries in `[lo, hi)` (clamped to what the log holds), in order.
    fn read_range(&self, lo: u64, hi: u64) -> io::Result<Vec<C::Entry>> {
        let (lo, hi, cached) = {
            let sh = lock(&self.inner.shared);
            let lo = lo.max(self.first_index(&sh));
            let hi = hi.min(self.inner.log.written_end());
            if lo >= hi {
                return Ok(Vec::new());
            }
            let mut cached: Vec<C::Entry> = sh
                .recent
                .range(lo..hi)
                .map(|(_, (e, _))| e.clone())
                .collect();
            // Only a contiguous run ending at `hi` is served from memory (always the
            // case); anything before it is durable, and read from disk.
            let mut from = cached.len();
            let mut next_hi = hi;
            while let Some(e) = from.checked_sub(1).and_then(|i| cached.get(i)) {
                if e.stored_log_id().index.saturating_add(1) != next_hi {
                    break;
                }
                next_hi -= 1;
                from -= 1;
            }
            cached.drain(..from);
            (lo, hi, cached)
        };
        // Every written entry not in the cache taken under the lock is durable.
        let disk_hi = cached.first().map_or(hi, |e| e.stored_log_id().index);
        let mut out = Vec::with_capacity(usize::try_from(hi - lo).unwrap_or(0).min(4096));
        let mut next = lo;
        while next < disk_hi {
            let got = self
                .inner
                .log
                .fetch(next, FETCH_BYTES_MAX, Duration::ZERO)
                .map_err(io_err)?;
            if got.chunks.is_empty() {
                return Err(io_err(format!(
                    "{}: entry {next} is missing",
                    self.inner.dir.display()
                )));
            }
            for chunk in &got.chunks {
                let mut rest = chunk.bytes.as_slice();
                while !rest.is_empty() && next < disk_hi {
                    let r = decode_record(rest, 0, chunk.generation).map_err(io_err)?;
                    if r.offset != next {
                        return Err(io_err(format!(
                            "{}: found record {} where entry {next} belongs",
                            self.inner.dir.display(),
                            r.offset
                        )));
                    }
                    out.push(self.decode_entry(next, r.key, r.value)?);
                    next += 1;
                    rest = rest.get(r.encoded_len..).unwrap_or_default();
                }
            }
        }
        out.extend(cached);
        Ok(out)
    }

    fn decode_entry(&self, index: u64, key: Option<&[u8]>, value: &[u8]) -> io::Result<C::Entry> {
        let bad = |detail: String| {
            io_err(RaftLogError::BadEntry {
                path: self.inner.dir.clone(),
                index,
                detail,
            })
        };
        if value.len() > ENTRY_VALUE_BYTES_MAX as usize {
            return Err(bad(format!("value of {} bytes", value.len())));
        }
        let key = decode_entry_key(key).map_err(|e| bad(e.to_string()))?;
        C::Entry::decode(index, &key, value).map_err(|e| bad(e.to_string()))
    }

    fn last_log_id(&self) -> io::Result<Option<StoredLogId>> {
        let (end, purged) = {
            let sh = lock(&self.inner.shared);
            (self.inner.log.written_end(), sh.state.purged)
        };
        let first = purged.as_ref().map_or(0, |p| p.index + 1);
        if end > first {
            if let Some(e) = self.read_range(end - 1, end)?.pop() {
                return Ok(Some(e.stored_log_id()));
            }
        }
        Ok(purged)
    }
}

/// The group commit: takes every flush queued, makes the newest target durable with
/// one commit of the partition log (appends that came meanwhile ride along), then
/// answers each flush in order.
fn flusher<C: RaftLogTypes>(
    rx: mpsc::Receiver<Job<C>>,
    log: Arc<PartitionLog>,
    shared: Arc<Mutex<Shared<C>>>,
) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let target = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Flush { target, .. } => Some(*target),
                Job::Barrier(_) => None,
            })
            .max();
        let result = match target {
            // A target past the end belonged to entries cut since: never wait for it.
            Some(t) => log
                .wait_durable(t.min(log.written_end()))
                .map_err(|e| e.to_string()),
            None => Ok(()),
        };
        if result.is_ok() {
            let durable = log.durable_end();
            let mut sh = lock(&shared);
            sh.trim_recent(durable);
        }
        for job in jobs {
            match job {
                Job::Flush { done, .. } => done.io_completed(result.clone().map_err(io_err)),
                Job::Barrier(tx) => {
                    let _ = tx.send(());
                }
            }
        }
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let lo = match range.start_bound() {
        Bound::Included(v) => *v,
        Bound::Excluded(v) => v.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let hi = match range.end_bound() {
        Bound::Included(v) => v.saturating_add(1),
        Bound::Excluded(v) => *v,
        Bound::Unbounded => u64::MAX,
    };
    (lo, hi)
}

impl<C: RaftLogTypes> RaftLogReader<C> for RaftLog<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, io::Error> {
        let (lo, hi) = bounds(&range);
        self.read_range(lo, hi)
    }

    async fn read_vote(&mut self) -> Result<Option<C::Vote>, io::Error> {
        Ok(lock(&self.inner.shared).state.vote.clone())
    }
}

impl<C: RaftLogTypes> RaftLogStorage<C> for RaftLog<C> {
    type LogReader = RaftLog<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        let last_log_id = self.last_log_id()?;
        let last_purged_log_id = lock(&self.inner.shared).state.purged;
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &C::Vote) -> Result<(), io::Error> {
        let vote = vote.clone();
        self.save_state(|s| s.vote = Some(vote))
    }

    async fn save_committed(&mut self, committed: Option<StoredLogId>) -> Result<(), io::Error> {
        // The committed id on disk is a lower bound only (openraft learns the rest from
        // the leader; the state machine keeps its own checkpoint), so it is written at
        // most once per COMMITTED_SAVE_INTERVAL rather than at every commit, which would
        // cost two fsyncs on the group's core task each time. Every other state write
        // carries the newest value too.
        let due = {
            let mut sh = lock(&self.inner.shared);
            sh.state.committed = committed;
            sh.committed_saved
                .is_none_or(|t| t.elapsed() >= COMMITTED_SAVE_INTERVAL)
        };
        if due {
            self.save_state(|_| {})?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<StoredLogId>, io::Error> {
        Ok(lock(&self.inner.shared).state.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<C::Entry> = entries.into_iter().collect();
        let Some(first) = entries.first() else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let first_index = first.stored_log_id().index;
        let mut keys = Vec::with_capacity(entries.len());
        let mut values = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let id = e.stored_log_id();
            if id.index != first_index + i as u64 {
                return Err(io_err(format!(
                    "entries not consecutive: {} after {first_index}+{i}",
                    id.index
                )));
            }
            let mut value = Vec::new();
            let kind = e.encode_value(&mut value).map_err(io_err)?;
            if value.len() > ENTRY_VALUE_BYTES_MAX as usize {
                return Err(io_err(format!(
                    "entry {} is {} bytes (at most {ENTRY_VALUE_BYTES_MAX})",
                    id.index,
                    value.len()
                )));
            }
            keys.push(encode_entry_key(&EntryKey {
                term: id.leader_id.term,
                leader: id.leader_id.node_id,
                kind,
            }));
            values.push(value);
        }
        let records: Vec<NewRecord<'_>> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| NewRecord {
                key: Some(k.as_slice()),
                value: v,
                timestamp_ms: -1,
            })
            .collect();
        let target = {
            let mut sh = lock(&self.inner.shared);
            let mut end = self.inner.log.written_end();
            if first_index > end && end <= self.first_index(&sh) {
                // A log holding no entry takes its first at any index.
                self.inner.log.restart_at(first_index).map_err(io_err)?;
                sh.keep_recent_from(first_index);
                end = first_index;
            }
            if first_index != end {
                return Err(io_err(format!(
                    "{}: entry {first_index} appended where entry {end} is next",
                    self.inner.dir.display()
                )));
            }
            let appended = self
                .inner
                .log
                .append(&records, &self.inner.config)
                .map_err(io_err)?;
            for (e, v) in entries.into_iter().zip(&values) {
                sh.remember(e.stored_log_id().index, e, v.len());
            }
            appended.last_offset + 1
        };
        self.send(Job::Flush {
            target,
            done: callback,
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<StoredLogId>) -> Result<(), io::Error> {
        let cut = last_log_id.map_or(0, |l| l.index.saturating_add(1));
        self.barrier().await?;
        let log = &self.inner.log;
        if cut >= log.written_end() {
            return Ok(());
        }
        let mut sh = lock(&self.inner.shared);
        if cut < log.start_offset() {
            log.restart_at(cut).map_err(io_err)?;
            sh.keep_recent_from(cut);
        } else {
            log.cut_tail(cut).map_err(io_err)?;
        }
        sh.keep_recent_below(cut);
        Ok(())
    }

    async fn purge(&mut self, log_id: StoredLogId) -> Result<(), io::Error> {
        let next = log_id.index.saturating_add(1);
        // 1. The purge point is durable before any segment goes.
        let keep = log_id;
        self.save_state(|s| {
            if s.purged.as_ref().is_none_or(|p| p.index < keep.index) {
                s.purged = Some(keep);
            }
        })?;
        self.barrier().await?;
        let log = &self.inner.log;
        let mut sh = lock(&self.inner.shared);
        sh.keep_recent_from(next);
        if log.written_end() <= next {
            // 2. Nothing above the purge point: the log continues after it.
            log.restart_at(next).map_err(io_err)?;
            return Ok(());
        }
        // 2. Whole sealed segments wholly at or below the purge point go. Like
        // retention's, they become spares while the node's pool has room: deleting them
        // frees their blocks, and on a file system mounted with `discard` the next
        // journal commit, which every fsync of the node waits for, discards them
        // first (170 ms stalls of replicated produce measured at each purge).
        let bases: Vec<u64> = {
            let segments = log.snapshot();
            segments
                .windows(2)
                .take_while(|p| matches!(p, [_, b] if b.base_offset <= next))
                .filter_map(|p| p.first().map(|s| s.base_offset))
                .collect()
        };
        if !bases.is_empty() {
            let spare_bytes_max = log.spare_bytes_max(self.inner.config.segment_bytes);
            log.retire_oldest_within(&bases, spare_bytes_max)
                .map_err(io_err)?;
        }
        Ok(())
    }
}
