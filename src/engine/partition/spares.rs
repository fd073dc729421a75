//! The node's pool of spare segment files (docs/FORMAT.md, Spares): segments that
//! retention would delete are kept in `DATA/spares/` and taken by any log at its next
//! roll, so their blocks are already allocated and written.
//!
//! Invariants:
//! - A file is in the pool's list only once its entry is complete: renamed into
//!   `spares/`, both directories fsynced, its header rewritten with
//!   `base_offset = u64::MAX` and `generation + 1`, and the file fsynced (rule 1). Every
//!   record left in it is then of an older generation, which readers and recovery
//!   reject.
//! - At startup every file found in `spares/` gets that header rewrite and fsync
//!   again before the pool hands it out (rule 2): a spare caught mid-reuse by a crash
//!   can hold valid records of its current generation.
//! - The pool holds at most `per_partition` spares per partition of the node (rule 4);
//!   a file that does not fit is deleted as before, and when the node's partitions
//!   become fewer (a topic deleted) the cleaner deletes the spares past the new cap. The cap is node-wide: the spares
//!   one partition returned may outnumber `per_partition` while others return fewer.
//!   An entry holds its place from its check to its listing (retention's and a
//!   compaction's entries run on different threads), so entries at once never pass it.
//! - Entry runs on the cleaner thread, never on a writer's path; taking a spare at a
//!   roll is no system call at all: the roll's group commit renames it (once the
//!   outgoing segment is durable) and fsyncs both directories before any record of
//!   the new segment is acknowledged.
//! - A segment enters only when no reader holds it or maps it (the caller checks its
//!   handles; [`SparePool::enter`] takes an exclusive `flock` on a fresh open).
//! - Every change goes through the I/O seam.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::lock;
use crate::engine::storage::io::{Storage, StorageFile};
use crate::engine::storage::reader::read_header;
use crate::format::names::{parse_spare_file_name, spare_file_name, SPARES_DIR};
use crate::format::{SegmentHeader, HEADER_LEN};

/// Default `serve --spares-per-partition`.
pub const SPARES_PER_PARTITION_DEFAULT: u64 = 4;
/// Default `serve --new-spares`: spares kept ready for rolls, made new when
/// retention and compaction return too few.
pub const NEW_SPARES_DEFAULT: u64 = 2;

/// A spare ready to be taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spare {
    pub path: PathBuf,
    /// The generation its header carries; records appended to it carry it too.
    pub generation: u64,
    /// Its length: bytes up to here hold an older generation's records.
    pub len: u64,
    /// The partition (topic, number) it came from; `None` for one found at startup
    /// or made new.
    pub origin: Option<(String, u32)>,
}

impl Spare {
    /// A spare that holds no old records (made new, or emptied): its blocks are not
    /// yet written, so it is worth less than a reused segment.
    pub fn is_empty(&self) -> bool {
        self.len <= HEADER_LEN as u64
    }
}

#[derive(Debug, Default)]
struct PoolState {
    /// `DATA/spares`; `None`: the pool is off.
    dir: Option<PathBuf>,
    /// The file system holding `dir` (its device id), when it could be read. A
    /// spare moves by `rename`, which cannot cross file systems: a log whose
    /// directory is on another one neither takes nor gives spares.
    file_system: Option<u64>,
    per_partition: u64,
    partitions: u64,
    ready: Vec<Spare>,
    /// Entries between their check against the cap and their listing in `ready`.
    entering: u64,
    /// Next file name's sequence number.
    next_seq: u64,
    /// Spares to keep ready, made new when too few are returned (0: none made).
    new_target: u64,
    /// The spare maker is to look at the pool (a roll took a spare, the cap grew,
    /// or the maker is to stop).
    maker_due: bool,
}

/// The node's spares and their counters, shared by every log of a broker.
#[derive(Debug, Default)]
pub struct SparePool {
    state: Mutex<PoolState>,
    /// Spares logs took at a roll.
    pub taken: AtomicU64,
    /// Segments that entered the pool.
    pub returned: AtomicU64,
    /// New, empty spares the spare maker made.
    pub made: AtomicU64,
    maker_wake: Condvar,
}

/// What startup found in `spares/`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restamped {
    /// Spares re-stamped and in the pool.
    pub kept: u64,
    /// Files removed (unreadable header, over the cap, not a spare's name).
    pub removed: u64,
}

impl SparePool {
    /// Turns the pool on with its directory (`DATA/spares`, created by the caller)
    /// and its limit; `per_partition` 0 leaves it off.
    pub fn configure(&self, data_dir: &Path, per_partition: u64) {
        let mut s = lock(&self.state);
        s.per_partition = per_partition;
        s.dir = (per_partition > 0).then(|| data_dir.join(SPARES_DIR));
        s.file_system = s
            .dir
            .as_deref()
            .and_then(file_system_of)
            .or_else(|| file_system_of(data_dir));
    }

    /// True when a log whose directory is on file system `fs` cannot move files to
    /// or from the pool's directory (both known and different).
    fn elsewhere(s: &PoolState, fs: Option<u64>) -> bool {
        matches!((s.file_system, fs), (Some(a), Some(b)) if a != b)
    }

    /// The pool's directory, when it is on.
    pub fn dir(&self) -> Option<PathBuf> {
        lock(&self.state).dir.clone()
    }

    /// Partitions on the node (the cap is `per_partition` times this).
    pub fn set_partitions(&self, n: u64) {
        let grew = {
            let mut s = lock(&self.state);
            let grew = n > s.partitions;
            s.partitions = n;
            grew
        };
        if grew {
            self.wake_maker();
        }
    }

    /// How many spares the spare maker keeps ready (made new when retention and
    /// compaction return too few); 0: it makes none.
    pub fn set_new_target(&self, n: u64) {
        lock(&self.state).new_target = n;
        self.wake_maker();
    }

    /// Wakes the spare maker: a spare was taken, the cap grew, or it is to stop.
    pub fn wake_maker(&self) {
        let mut s = lock(&self.state);
        if !std::mem::replace(&mut s.maker_due, true) {
            self.maker_wake.notify_one();
        }
    }

    /// The spare maker's sleep: until [`SparePool::wake_maker`] or `timeout`.
    pub fn wait_maker_due(&self, timeout: Duration) {
        let s = lock(&self.state);
        let (mut s, _) = self
            .maker_wake
            .wait_timeout_while(s, timeout, |s| !s.maker_due)
            .unwrap_or_else(PoisonError::into_inner);
        s.maker_due = false;
    }

    /// Spares ready now.
    pub fn len(&self) -> usize {
        lock(&self.state).ready.len()
    }

    /// True when no spare is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Spares ready now that came from `topic`/`partition`.
    pub fn from_partition(&self, topic: &str, partition: u32) -> u64 {
        lock(&self.state)
            .ready
            .iter()
            .filter(|s| {
                s.origin
                    .as_ref()
                    .is_some_and(|(t, p)| t == topic && *p == partition)
            })
            .count() as u64
    }

    fn cap(s: &PoolState) -> u64 {
        s.per_partition.saturating_mul(s.partitions)
    }

    /// Places taken: the spares ready and the entries in progress.
    fn taken_places(s: &PoolState) -> u64 {
        (s.ready.len() as u64).saturating_add(s.entering)
    }

    /// Takes a place for a new spare when the pool is on and has room; `None`
    /// otherwise.
    fn claim_place(&self, s: &mut PoolState) -> Option<Place<'_>> {
        s.dir.as_ref()?;
        if Self::taken_places(s) >= Self::cap(s) {
            return None;
        }
        s.entering += 1;
        Some(Place { pool: self })
    }

    /// Takes a place for a returned segment: when the pool is full, an empty spare
    /// (made new, its blocks never written) gives up its place, and its path is
    /// returned for the caller to delete: a reused segment is worth more.
    fn claim_place_evicting(&self, s: &mut PoolState) -> Option<(Place<'_>, Option<PathBuf>)> {
        s.dir.as_ref()?;
        let mut evicted = None;
        if Self::taken_places(s) >= Self::cap(s) {
            let i = s.ready.iter().position(Spare::is_empty)?;
            evicted = Some(s.ready.remove(i).path);
        }
        s.entering += 1;
        Some((Place { pool: self }, evicted))
    }

    /// Deletes an empty spare that gave up its place (no directory fsync: if it
    /// comes back after a crash, the next start re-stamps it or removes it over the
    /// cap).
    fn delete_evicted(storage: &dyn Storage, evicted: Option<PathBuf>) {
        if let Some(path) = evicted {
            if let Err(e) = storage.remove_file(&path) {
                tracing::warn!(spare = %path.display(), error = %e, "removing an empty spare failed; the next start removes it over the cap");
            }
        }
    }

    /// Makes new, empty spares until `new_target` are ready or the pool is full:
    /// each is created in `spares/` with a spare's header (`base_offset = u64::MAX`,
    /// generation 0) and fsynced, then the directory, and only then listed. Runs on
    /// the spare maker's thread, never on a writer's path. Returns how many it made.
    /// A failure removes the file it was making.
    pub fn refill(&self, storage: &dyn Storage) -> io::Result<u64> {
        let mut made = 0;
        loop {
            let (dir, seq, place) = {
                let mut s = lock(&self.state);
                let Some(dir) = s.dir.clone() else {
                    return Ok(made);
                };
                if Self::taken_places(&s) >= s.new_target {
                    return Ok(made);
                }
                let Some(place) = self.claim_place(&mut s) else {
                    return Ok(made);
                };
                let seq = s.next_seq;
                s.next_seq += 1;
                (dir, seq, place)
            };
            let path = dir.join(spare_file_name(seq));
            let header = SegmentHeader {
                base_offset: crate::format::header::SPARE_BASE_OFFSET,
                generation: 0,
                flags: 0,
            };
            // Only a file this call created is removed on failure: the name may be
            // taken by something that is no spare (left in place, see `restamp`).
            let f = storage.create(&path).map_err(|e| {
                io::Error::new(e.kind(), format!("making spare {}: {e}", path.display()))
            })?;
            let result = (|| {
                f.write_at(&header.encode(), 0)?;
                f.sync_all()?;
                storage.sync_dir(&dir)
            })();
            drop(f);
            if let Err(e) = result {
                let _ = storage.remove_file(&path);
                return Err(io::Error::new(
                    e.kind(),
                    format!("making spare {}: {e}", path.display()),
                ));
            }
            lock(&self.state).ready.push(Spare {
                path,
                generation: 0,
                len: HEADER_LEN as u64,
                origin: None,
            });
            drop(place);
            self.made.fetch_add(1, Ordering::Relaxed);
            made += 1;
        }
    }

    /// Startup (rule 2): every file in `spares/` gets its header rewritten with
    /// `base_offset = u64::MAX` and `generation + 1`, and is fsynced, before any log
    /// may take it. A file whose header does not decode (its generation is unknown),
    /// whose generation cannot grow, beyond the cap or not named as a spare is
    /// removed; the directory is fsynced after removals. Anything that is not a
    /// regular file (a directory, a FIFO, a symbolic link) is no spare and no file
    /// the broker wrote: it is left in place with a warning, never opened (a FIFO
    /// would block the start, a link would have its target's header rewritten).
    pub fn restamp(&self, storage: &dyn Storage) -> io::Result<Restamped> {
        let Some(dir) = self.dir() else {
            return Ok(Restamped::default());
        };
        let mut names: Vec<(Option<u64>, PathBuf)> = Vec::new();
        // New names (entries, new spares) follow every name in `spares/`, whatever it
        // is: `create` never reuses one.
        let mut next_seq = 0u64;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if let Some(seq) = entry.file_name().to_str().and_then(parse_spare_file_name) {
                next_seq = next_seq.max(seq.saturating_add(1));
            }
            if !entry.file_type()?.is_file() {
                tracing::warn!(
                    path = %entry.path().display(),
                    "not a regular file, so no spare: left in place, the spare pool ignores it"
                );
                continue;
            }
            let name = entry.file_name();
            let seq = name.to_str().and_then(parse_spare_file_name);
            names.push((seq, entry.path()));
        }
        names.sort();
        let mut done = Restamped::default();
        let mut ready = Vec::new();
        let cap = Self::cap(&lock(&self.state));
        for (seq, path) in names {
            let kept = match seq {
                Some(_) if (ready.len() as u64) < cap => restamp_file(storage, &path)?,
                _ => None,
            };
            match kept {
                Some(spare) => ready.push(spare),
                None => {
                    match storage.remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                    done.removed += 1;
                }
            }
        }
        if done.removed > 0 {
            storage.sync_dir(&dir)?;
        }
        done.kept = ready.len() as u64;
        let mut s = lock(&self.state);
        s.next_seq = s.next_seq.max(next_seq);
        s.ready = ready;
        Ok(done)
    }

    /// Deletes the spares ready beyond the cap (a topic was deleted: the node has
    /// fewer partitions), the oldest entries first kept; fsyncs the directory after
    /// removals. Returns how many files it removed. A file it could not remove is
    /// out of the pool all the same (the next start re-stamps or removes it).
    pub fn trim(&self, storage: &dyn Storage) -> io::Result<u64> {
        let (dir, excess) = {
            let mut s = lock(&self.state);
            let Some(dir) = s.dir.clone() else {
                return Ok(0);
            };
            let keep = usize::try_from(Self::cap(&s)).unwrap_or(usize::MAX);
            if s.ready.len() <= keep {
                return Ok(0);
            }
            let excess = s.ready.split_off(keep);
            (dir, excess)
        };
        let mut removed = 0;
        let mut first_error = None;
        for spare in excess {
            match storage.remove_file(&spare.path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_error.get_or_insert(io::Error::new(
                        e.kind(),
                        format!("removing {}: {e}", spare.path.display()),
                    ));
                }
            }
        }
        if removed > 0 {
            storage.sync_dir(&dir)?;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// Takes a spare for a new segment (a roll). The caller renames it to the
    /// segment's name, and the roll's group commit makes the new name and the spare
    /// directory's removal durable. `None` when the pool is off or empty.
    ///
    /// A reused segment is taken before an empty spare (its blocks are written, so
    /// the writer's fsyncs do not allocate). The caller wakes the spare maker
    /// ([`SparePool::wake_maker_if_low`]) once the roll is durable, so that the
    /// maker's fsyncs do not run beside the roll's.
    ///
    /// `fs` is the file system of the taking log's directory ([`file_system_of`]):
    /// a log on another file system than `spares/` gets `None`, since the rename
    /// at its roll's commit would fail.
    pub fn take(&self, fs: Option<u64>) -> Option<Spare> {
        let spare = {
            let mut s = lock(&self.state);
            s.dir.as_ref()?;
            if Self::elsewhere(&s, fs) {
                return None;
            }
            let i = s
                .ready
                .iter()
                .rposition(|sp| !sp.is_empty())
                .or_else(|| s.ready.len().checked_sub(1))?;
            s.ready.remove(i)
        };
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(spare)
    }

    /// Wakes the spare maker when fewer spares than its target are ready.
    pub fn wake_maker_if_low(&self) {
        let low = {
            let s = lock(&self.state);
            s.dir.is_some() && Self::taken_places(&s) < s.new_target
        };
        if low {
            self.wake_maker();
        }
    }

    /// Entry (rule 1) of a sealed segment file at `path` in `partition_dir` whose
    /// header carries `generation` and whose length is `len`:
    /// 1. rename it to `spares/spare-<seq>.log`;
    /// 2. fsync the partition directory, then the spare directory;
    /// 3. rewrite its header with `base_offset = u64::MAX` and `generation + 1`;
    /// 4. fsync the file; only then is it in the pool.
    ///
    /// Returns false, having changed nothing, when the pool is off or full,
    /// `partition_dir` is on another file system than `spares/`, the generation
    /// cannot grow, or someone holds a lock on the file (a reader maps it): the
    /// caller deletes it instead. A failure after step 1 leaves the file in
    /// `spares/`, outside the pool until the next start re-stamps it.
    pub fn enter(
        &self,
        storage: &dyn Storage,
        partition_dir: &Path,
        path: &Path,
        generation: u64,
        origin: (String, u32),
    ) -> io::Result<bool> {
        let fs = file_system_of(partition_dir);
        let (dir, seq, _place, evicted) = {
            let mut s = lock(&self.state);
            let Some(dir) = s.dir.clone() else {
                return Ok(false);
            };
            if Self::elsewhere(&s, fs) {
                return Ok(false);
            }
            let Some((place, evicted)) = self.claim_place_evicting(&mut s) else {
                return Ok(false);
            };
            let seq = s.next_seq;
            s.next_seq += 1;
            (dir, seq, place, evicted)
        };
        Self::delete_evicted(storage, evicted);
        let Some(next_generation) = generation.checked_add(1) else {
            return Ok(false);
        };
        let next_generation = if planted!(SPARE_WITHOUT_GENERATION_BUMP) {
            generation
        } else {
            next_generation
        };
        // Nobody may read the old bytes while they change: a reader that maps a
        // sealed file holds a shared lock on it.
        let probe = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e),
        };
        if rustix::fs::flock(&probe, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err()
        {
            return Ok(false);
        }
        let len = probe.metadata()?.len();
        if len < HEADER_LEN as u64 {
            return Ok(false);
        }
        let to = dir.join(spare_file_name(seq));
        // 1.
        match storage.rename(path, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e),
        }
        // 2.
        storage.sync_dir(partition_dir)?;
        storage.sync_dir(&dir)?;
        // 3. and 4.
        self.stamp(storage, to, next_generation, len, origin)?;
        drop(probe);
        Ok(true)
    }

    /// Steps 3 and 4 of [`SparePool::enter`]: rewrites the header of the file at
    /// `to` (in `spares/`, durable there) with `base_offset = u64::MAX` and
    /// `generation`, fsyncs it, and lists it in the pool.
    fn stamp(
        &self,
        storage: &dyn Storage,
        to: PathBuf,
        generation: u64,
        len: u64,
        origin: (String, u32),
    ) -> io::Result<()> {
        // 3.
        let f = storage.open(&to)?;
        let header = SegmentHeader {
            base_offset: crate::format::header::SPARE_BASE_OFFSET,
            generation,
            flags: 0,
        };
        f.write_at(&header.encode(), 0)?;
        // 4.
        f.sync_all()?;
        let mut s = lock(&self.state);
        s.ready.push(Spare {
            path: to,
            generation,
            len,
            origin: Some(origin),
        });
        self.returned.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Names in `spares/` for up to `n` segments a compaction swap is to move there
    /// itself (steps 1 and 2 of the entry, see
    /// `PreparedCompaction::swap_keeping`): as many as the pool has room for now.
    /// Returns the directory and the names (none when the pool is off or full, or
    /// `partition_dir` is on another file system than `spares/`).
    pub fn reserve(&self, n: usize, partition_dir: &Path) -> (Option<PathBuf>, Vec<PathBuf>) {
        let fs = file_system_of(partition_dir);
        let mut s = lock(&self.state);
        let Some(dir) = s.dir.clone() else {
            return (None, Vec::new());
        };
        if Self::elsewhere(&s, fs) {
            return (None, Vec::new());
        }
        // Empty spares give up their places to returned segments (see `admit`).
        let empty = s.ready.iter().filter(|sp| sp.is_empty()).count() as u64;
        let room = Self::cap(&s).saturating_sub(Self::taken_places(&s).saturating_sub(empty));
        let k = (n as u64).min(room);
        let names = (0..k)
            .map(|i| dir.join(spare_file_name(s.next_seq + i)))
            .collect();
        s.next_seq += k;
        (Some(dir), names)
    }

    /// Completes the entry (steps 3 and 4 of [`SparePool::enter`]) of a sealed
    /// segment's log that a compaction swap moved to `path` in `spares/` and made
    /// durable there (both directories fsynced), its header carrying `generation`.
    /// Returns false, having changed nothing, when the pool is full, the generation
    /// cannot grow, or someone holds a lock on the file: the caller removes it. A
    /// failure leaves the file in `spares/`, outside the pool until the next start
    /// re-stamps it (rule 2).
    pub fn admit(
        &self,
        storage: &dyn Storage,
        path: &Path,
        generation: u64,
        origin: (String, u32),
    ) -> io::Result<bool> {
        let Some((_place, evicted)) = self.claim_place_evicting(&mut lock(&self.state)) else {
            return Ok(false);
        };
        Self::delete_evicted(storage, evicted);
        let Some(next_generation) = generation.checked_add(1) else {
            return Ok(false);
        };
        let next_generation = if planted!(SPARE_WITHOUT_GENERATION_BUMP) {
            generation
        } else {
            next_generation
        };
        let probe = File::open(path)?;
        if rustix::fs::flock(&probe, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err()
        {
            return Ok(false);
        }
        let len = probe.metadata()?.len();
        if len < HEADER_LEN as u64 {
            return Ok(false);
        }
        self.stamp(storage, path.to_path_buf(), next_generation, len, origin)?;
        drop(probe);
        Ok(true)
    }
}

/// A place in the pool held by an entry in progress; given back when dropped (by
/// then the entry is listed in `ready`, or it failed).
struct Place<'a> {
    pool: &'a SparePool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.pool.state);
        s.entering = s.entering.saturating_sub(1);
    }
}

/// The file system holding `path` (its device id), or `None` when it cannot be
/// read (then nothing is refused for it: a rename reports its own error).
pub(crate) fn file_system_of(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.dev())
}

/// Rewrites one spare's header (base `u64::MAX`, generation + 1) and fsyncs it: at
/// startup, and by recovery when a reused file goes back to the pool. `None` when its
/// header does not decode or its generation cannot grow.
pub(crate) fn restamp_file(storage: &dyn Storage, path: &Path) -> io::Result<Option<Spare>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let Ok(header) = read_header(&file, len)? else {
        return Ok(None);
    };
    let Some(generation) = header.generation.checked_add(1) else {
        return Ok(None);
    };
    if !planted!(SPARE_NOT_RESTAMPED_AT_STARTUP) {
        let f: Box<dyn StorageFile> = storage.open(path)?;
        let header = SegmentHeader {
            base_offset: crate::format::header::SPARE_BASE_OFFSET,
            generation,
            flags: 0,
        };
        f.write_at(&header.encode(), 0)?;
        f.sync_all()?;
    }
    let generation = if planted!(SPARE_NOT_RESTAMPED_AT_STARTUP) {
        header.generation
    } else {
        generation
    };
    Ok(Some(Spare {
        path: path.to_path_buf(),
        generation,
        len,
        origin: None,
    }))
}

impl super::PartitionLog {
    /// After a compaction swap that moved the replaced logs `kept` to `spares/` (made
    /// durable there) and published the new segment list: each whose segment nobody
    /// holds any more (no reader, no shared handle) enters the pool
    /// ([`SparePool::admit`]); the others are removed, a reader keeping its open file,
    /// and `spares/` is fsynced after removals. A failure is logged and leaves the
    /// file in `spares/` for the next start to re-stamp (rule 2): the swap itself is
    /// done.
    pub(super) fn admit_kept(
        &self,
        replaced: Vec<std::sync::Arc<super::Segment>>,
        kept: &crate::engine::maintenance::compaction::Kept,
    ) {
        let mut removed = false;
        for seg in replaced {
            let Some((_, path)) = kept.logs.iter().find(|(b, _)| *b == seg.base_offset) else {
                continue;
            };
            let unheld = std::sync::Arc::strong_count(&seg) == 1 && seg.file.unshared();
            let generation = seg.generation;
            drop(seg);
            let origin = (self.topic.clone(), self.partition);
            let entered = match unheld {
                true => self
                    .stats
                    .spares
                    .admit(&*self.storage, path, generation, origin),
                false => Ok(false),
            };
            let result = match entered {
                Ok(true) => Ok(()),
                Ok(false) => self.storage.remove_file(path).map(|()| removed = true),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(
                    topic = self.topic,
                    partition = self.partition,
                    spare = %path.display(),
                    error = %e,
                    "a compacted segment did not enter the spares; the next start re-stamps it"
                );
            }
        }
        if let (true, Some(dir)) = (removed, &kept.dir) {
            if let Err(e) = self.storage.sync_dir(dir) {
                tracing::warn!(spares = %dir.display(), error = %e, "syncing the spares failed");
            }
        }
    }

    /// Bytes reserved for the active segment past the end of its data: preallocated
    /// (`fallocate`), zeroed, or a reused file's old length.
    pub fn preallocated_bytes(&self) -> u64 {
        let w = lock(&self.write);
        let a = &w.active;
        let reserved = a
            .zero
            .reserved_end
            .load(Ordering::Acquire)
            .max(a.file_len)
            .max(a.zero.zeroed_end());
        reserved.saturating_sub(a.data_end)
    }

    /// The preallocation window (`--preallocate-bytes`).
    pub fn preallocate_window(&self) -> u64 {
        self.stats
            .write_path
            .preallocate_bytes
            .load(Ordering::Relaxed)
    }

    /// The longest log that may become a spare, for segments of `segment_bytes`
    /// (docs/FORMAT.md, Spare files, rule 4: a segment plus the preallocation).
    pub fn spare_bytes_max(&self, segment_bytes: u64) -> u64 {
        segment_bytes.saturating_add(self.preallocate_window())
    }

    /// Spares in the node's pool that came from this partition.
    pub fn spares(&self) -> u64 {
        self.stats
            .spares
            .from_partition(&self.topic, self.partition)
    }
}
