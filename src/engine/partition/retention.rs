//! Background work on one partition's log: rolling by age, retention (oldest
//! settled segments first, a directory fsync between removals) and the compaction
//! swap under the log's own lock.

use super::*;
use crate::format::names::{INDEX_EXT, LOG_EXT};

// ----- background work: rolling by age, retention, compaction -----

/// A file retention dropped from the list, still to delete (or, for a log file with
/// `spare` set, to hand to the node's spare pool).
#[derive(Debug)]
pub(super) struct Doomed {
    path: PathBuf,
    /// The log's generation, when the segment may become a spare (no reader held it).
    spare: Option<u64>,
}

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
                let reason = self.set_failed(&mut s, reason);
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

    pub(super) fn settled_locked(&self, w: &WriteState) -> Vec<Arc<Segment>> {
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
    pub(super) fn check_changeable(&self) -> Result<(), EngineError> {
        self.check_writable()
    }

    /// True when `bases` are the oldest settled segments, in order (checked under the
    /// write lock).
    pub(super) fn is_settled_prefix(&self, w: &WriteState, bases: &[u64]) -> bool {
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

    /// The settled segment holding `offset` (the newest settled one based at or
    /// below it) and the base of the segment after it, listed or lost; `None` when
    /// the offset lies in no settled segment (the active one, one whose seal is not
    /// durable, or a lost one). For a mend ([`crate::engine::maintenance::mend`]).
    pub fn settled_holding(&self, offset: u64) -> Option<(Arc<Segment>, u64)> {
        let w = lock(&self.write);
        let settled = self.settled_locked(&w);
        let list = self.snapshot();
        let seg = settled.iter().rev().find(|s| s.base_offset <= offset)?;
        // A lost segment (its `.log` gone) bounds it too.
        let lost = self.lost.read().unwrap_or_else(PoisonError::into_inner);
        let next = list
            .iter()
            .map(|s| s.base_offset)
            .chain(lost.iter().map(|l| l.first))
            .filter(|&b| b > seg.base_offset)
            .min()?;
        (offset < next).then(|| (Arc::clone(seg), next))
    }

    /// Step 2 of a mend's swap, under the write lock: `seg` is still one of the
    /// settled segments (the same one: a compaction publishes new ones), and the log
    /// takes writes.
    pub fn still_settled(&self, seg: &Arc<Segment>) -> bool {
        let w = lock(&self.write);
        self.check_changeable().is_ok()
            && self.settled_locked(&w).iter().any(|s| Arc::ptr_eq(s, seg))
    }

    /// Publishes a mend's swap: the segment `old` gives way to the file now on disk
    /// under its name. As [`PartitionLog::replace_oldest`]: opened first, then the
    /// list replaced under the write lock; readers already in `old` keep its bytes;
    /// if the new file cannot be opened, or `old` is no longer listed, the log is
    /// failed (its list would no longer match the directory).
    pub fn replace_mended(&self, old: &Arc<Segment>) -> Result<(), EngineError> {
        let mut notes = Vec::new();
        let base = old.base_offset;
        let seg = match open_sealed(&self.dir, base, &self.stats.files, &mut notes) {
            Ok(seg) => Arc::new(seg),
            Err(e) => {
                return Err(self.fail(FailureReason::CompactedSegmentUnopenable {
                    name: log_file_name(base),
                    error: Arc::new(e),
                }))
            }
        };
        let w = lock(&self.write);
        let list = self.snapshot();
        if !self.settled_locked(&w).iter().any(|s| Arc::ptr_eq(s, old)) {
            drop(w);
            return Err(self.fail(FailureReason::CompactionRaced {
                dir: self.dir.clone(),
            }));
        }
        let new: Vec<Arc<Segment>> = list
            .iter()
            .map(|s| {
                if Arc::ptr_eq(s, old) {
                    Arc::clone(&seg)
                } else {
                    Arc::clone(s)
                }
            })
            .collect();
        self.publish(new);
        Ok(())
    }

    /// The segments found lost at open (their `.log` gone, their `.index` kept) and
    /// not written again since.
    pub fn lost_segments(&self) -> Vec<LostSegment> {
        self.lost
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Publishes a lost segment a mend wrote again (`<first>.log`, durable): opened
    /// first, then put in the list under the write lock, and no longer lost. Refused
    /// (the log failed: its list would not match the directory) when the segment
    /// following it is gone meanwhile or one of its name is listed.
    pub fn insert_found(&self, lost: &LostSegment) -> Result<(), EngineError> {
        let mut notes = Vec::new();
        let seg = match open_sealed(&self.dir, lost.first, &self.stats.files, &mut notes) {
            Ok(seg) => Arc::new(seg),
            Err(e) => {
                return Err(self.fail(FailureReason::CompactedSegmentUnopenable {
                    name: log_file_name(lost.first),
                    error: Arc::new(e),
                }))
            }
        };
        let _w = lock(&self.write);
        let list = self.snapshot();
        let fits = list.iter().any(|s| s.base_offset == lost.next)
            && !list.iter().any(|s| s.base_offset == lost.first);
        if !fits {
            return Err(self.fail(FailureReason::CompactionRaced {
                dir: self.dir.clone(),
            }));
        }
        let mut new: Vec<Arc<Segment>> = list.iter().cloned().collect();
        let at = new.partition_point(|s| s.base_offset < lost.first);
        new.insert(at, seg);
        self.publish(new);
        self.lost
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|l| l.first != lost.first);
        Ok(())
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
        let removed = self.unlist_oldest(bases)?;
        let mut doomed = lock(&self.doomed);
        for seg in &removed {
            doomed.push(Doomed {
                path: seg.path.clone(),
                spare: None,
            });
            doomed.push(Doomed {
                path: seg.path.with_extension(INDEX_EXT),
                spare: None,
            });
        }
        self.delete_doomed(&mut doomed)?;
        Ok(removed)
    }

    /// Retention as [`PartitionLog::remove_oldest`], but each removed segment's log
    /// that no reader holds becomes a spare (docs/FORMAT.md, Spares) when the pool
    /// has room, instead of being deleted; its entry replaces the deletion in step 2
    /// and keeps its order (a directory fsync before each segment's log but the
    /// first; the entry fsyncs the partition directory after its rename). The caller
    /// holds no segment of `bases`. Returns the bytes of the segments removed.
    pub fn retire_oldest(&self, bases: &[u64]) -> Result<u64, EngineError> {
        self.retire_oldest_within(bases, u64::MAX)
    }

    /// [`PartitionLog::retire_oldest`] where only a log of at most `spare_bytes_max`
    /// bytes may become a spare (docs/FORMAT.md, Spare files, rule 4).
    pub fn retire_oldest_within(
        &self,
        bases: &[u64],
        spare_bytes_max: u64,
    ) -> Result<u64, EngineError> {
        let removed = self.unlist_oldest(bases)?;
        let bytes = removed.iter().map(|s| s.bytes()).sum();
        let mut doomed = lock(&self.doomed);
        for seg in removed {
            // Only this list holds the segment, and no reader shares its handle: once
            // it is dropped nobody reads the old bytes through this process.
            let unheld = Arc::strong_count(&seg) == 1
                && seg.file.unshared()
                && seg.bytes() <= spare_bytes_max;
            doomed.push(Doomed {
                path: seg.path.clone(),
                spare: unheld.then_some(seg.generation),
            });
            doomed.push(Doomed {
                path: seg.path.with_extension(INDEX_EXT),
                spare: None,
            });
        }
        self.delete_doomed(&mut doomed)?;
        Ok(bytes)
    }

    /// Step 1 of [`PartitionLog::remove_oldest`].
    fn unlist_oldest(&self, bases: &[u64]) -> Result<Vec<Arc<Segment>>, EngineError> {
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
            assert_eq!(
                gone.len(),
                bases.len(),
                "settled prefix longer than the list"
            );
            let gone = gone.to_vec();
            for seg in &gone {
                seg.file
                    .hold()
                    .map_err(|e| EngineError::io(format!("opening {}", seg.path.display()), e))?;
            }
            self.publish(kept.to_vec());
            gone
        };
        Ok(removed)
    }

    /// Steps 2 and 3 of [`PartitionLog::remove_oldest`] for every file still waiting.
    pub(super) fn delete_doomed(&self, doomed: &mut Vec<Doomed>) -> Result<(), EngineError> {
        if doomed.is_empty() {
            return Ok(());
        }
        // 2.
        let mut removed_one = false;
        while let Some(Doomed { path, spare }) = doomed.first() {
            // The removals must persist oldest first: a newer segment's log gone
            // while an older one's is back after a crash would leave offsets missing
            // between the segments. Directory operations need not persist in the
            // order they were made, so the ones before a segment's log are made
            // durable before it goes.
            if removed_one
                && path.extension().is_some_and(|e| e == LOG_EXT)
                && !planted!(UNORDERED_RETENTION_REMOVALS)
            {
                self.sync_dir()
                    .map_err(|e| EngineError::io(format!("syncing {}", self.dir.display()), e))?;
            }
            if let Some(generation) = *spare {
                let origin = (self.topic.clone(), self.partition);
                let entered = self
                    .stats
                    .spares
                    .enter(&*self.storage, &self.dir, path, generation, origin)
                    .map_err(|e| {
                        EngineError::io(format!("moving {} to the spares", path.display()), e)
                    })?;
                if entered {
                    removed_one = true;
                    doomed.remove(0);
                    continue;
                }
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
        if planted!(SKIP_RETENTION_DIR_FSYNC) {
            return Ok(());
        }
        self.sync_dir()
            .map_err(|e| EngineError::io(format!("syncing {}", self.dir.display()), e))
    }

    /// Retries deleting files an earlier retention could not delete.
    pub fn retry_removals(&self) -> Result<(), EngineError> {
        self.delete_doomed(&mut lock(&self.doomed))
    }

    /// Keeps the read handles of the segments `bases` open for the rest of their
    /// lives (see [`files`](super::files)): called before a compaction swap replaces
    /// their files, so readers holding them keep reading the bytes they had.
    pub fn hold_files(&self, bases: &[u64]) -> Result<(), EngineError> {
        for seg in self
            .snapshot()
            .iter()
            .filter(|s| bases.contains(&s.base_offset))
        {
            seg.file
                .hold()
                .map_err(|e| EngineError::io(format!("opening {}", seg.path.display()), e))?;
        }
        Ok(())
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
            match open_sealed(&self.dir, base, &self.stats.files, &mut notes) {
                Ok(seg) => opened.push(Arc::new(seg)),
                Err(e) => {
                    return Err(self.fail(FailureReason::CompactedSegmentUnopenable {
                        name: log_file_name(base),
                        error: Arc::new(e),
                    }))
                }
            }
        }
        let w = lock(&self.write);
        if !self.is_settled_prefix(&w, replaced) {
            drop(w);
            return Err(self.fail(FailureReason::CompactionRaced {
                dir: self.dir.clone(),
            }));
        }
        let list = self.snapshot();
        opened.extend(list.iter().skip(replaced.len()).cloned());
        self.publish(opened);
        Ok(())
    }
}
