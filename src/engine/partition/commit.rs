//! Group commit: the first request that needs an fsync syncs the newest data it can
//! see; requests behind it find their write covered and return without a system call.

use super::*;
use crate::format::record::{claimed_encoded_len, decode_record, RecordError};

// ----- group commit -----

impl PartitionLog {
    /// Returns once every offset below `target` is durable. The first caller that
    /// finds it is not runs one fsync covering everything written so far; callers
    /// behind it wait and usually find their write covered without a system call.
    pub fn wait_durable(&self, target: u64) -> Result<(), EngineError> {
        self.wait_durable_waking(target, true)
    }

    /// [`PartitionLog::wait_durable`] for a thread that runs commits for an event
    /// loop: a publish of its own does not wake the log's async waiters (on another
    /// thread, every waiting task would be a wake-up of its own); the caller then
    /// wakes them with one [`PartitionLog::wake_waiters`], on the loop. Condition
    /// variable waiters, failures and closes are woken as always.
    pub fn wait_durable_quiet(&self, target: u64) -> Result<(), EngineError> {
        self.wait_durable_waking(target, false)
    }

    /// Wakes the async waiters for the durable end as it stands (after
    /// [`PartitionLog::wait_durable_quiet`]).
    pub fn wake_waiters(&self) {
        let s = lock(&self.sync);
        self.wake_async(s.durable_end);
    }

    fn wait_durable_waking(&self, target: u64, wake: bool) -> Result<(), EngineError> {
        if planted!(ACK_BEFORE_FSYNC) {
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
                Ok(plan) => self.publish_synced_waking(&mut s, &plan, wake),
                // The topic was deleted while the fsync ran (its directory is gone):
                // the request ends as deleted, not as a failed partition.
                Err(_) if s.closed == Some(Closed::Deleted) => {}
                Err(reason) => {
                    self.set_failed(&mut s, reason);
                }
            }
            self.synced.notify_all();
        }
    }

    /// Claims the log's next group commit for a request whose records are written
    /// (an event-loop pass: the claim holder yields so the other ready connections
    /// append, then runs one fsync for all of them on its own thread). True when the
    /// caller now holds the claim and must end it with
    /// [`PartitionLog::commit_claimed`] or [`PartitionLog::release_claim`]; false
    /// when another request holds it: that request's commit covers the caller's
    /// records, written before the holder takes its target.
    pub fn claim_commit(&self) -> bool {
        let mut w = lock(&self.write);
        !std::mem::replace(&mut w.commit_claimed, true)
    }

    /// Ends a claim: releases it and takes as target everything written so far (so
    /// every request that found the claim held is covered), then runs
    /// [`PartitionLog::wait_durable`] for it.
    pub fn commit_claimed(&self) -> Result<(), EngineError> {
        let target = self.release_claim();
        self.wait_durable(target)
    }

    /// Bytes of the active segment written but not yet covered by an fsync.
    pub fn unsynced_bytes(&self) -> u64 {
        let w = lock(&self.write);
        w.active
            .data_end
            .saturating_sub(w.active.seg.readable_end.load(Ordering::Acquire))
    }

    /// Whether a roll waits for the next group commit (its syncs make that commit
    /// several fsyncs long).
    pub fn roll_pending(&self) -> bool {
        lock(&self.write).pending.roll.is_some()
    }

    /// Releases a claim without waiting; returns the next offset at the release:
    /// the holder, or whoever it hands the commit to, must make every offset below it
    /// durable.
    pub fn release_claim(&self) -> u64 {
        let mut w = lock(&self.write);
        assert!(w.commit_claimed, "a commit claim released twice");
        w.commit_claimed = false;
        w.next_offset
    }

    /// Makes everything written so far durable (the flusher and shutdown call this).
    pub fn flush(&self) -> Result<(), EngineError> {
        let target = self.written_end();
        self.wait_durable(target)
    }

    /// [`PartitionLog::flush`] without waking the async waiters (see
    /// [`PartitionLog::wait_durable_quiet`]): the caller wakes them with
    /// [`PartitionLog::wake_waiters`] once it has done what they also wait for.
    pub fn flush_quiet(&self) -> Result<(), EngineError> {
        let target = self.written_end();
        self.wait_durable_quiet(target)
    }

    /// At a clean stop, after [`PartitionLog::flush`]: cuts a reused active segment's
    /// file to the end of its data when the older generation's bytes past it do not
    /// start with a whole record of that generation. The writer's data ends anywhere
    /// inside an old record, and such a tail cannot be told from a torn write (a check
    /// would call the stopped directory repairable); the next start would cut it
    /// anyway. A tail that starts with a whole older record is a legal stale tail
    /// (`verify` names it by generation) and is kept, as is a zero tail.
    pub fn trim_stale_tail(&self) -> io::Result<()> {
        let mut w = lock(&self.write);
        if w.pending.roll.is_some() {
            return Ok(());
        }
        let a = &mut w.active;
        if a.zero.floor() <= a.data_end || a.file_len <= a.data_end {
            return Ok(());
        }
        let mut len_field = [0u8; crate::format::record::LEN_FIELD];
        let n = a.log.read_at(&mut len_field, a.data_end)?;
        let whole_old_record = match claimed_encoded_len(len_field.get(..n).unwrap_or(&[])) {
            Some(len) if len <= a.file_len - a.data_end => {
                // At most MAX_RECORD_LEN + 4 bytes: `claimed_encoded_len` is bounded.
                let mut buf = vec![0u8; len as usize];
                let got = a.log.read_at(&mut buf, a.data_end)?;
                matches!(
                    decode_record(buf.get(..got).unwrap_or(&[]), a.data_end, a.seg.generation),
                    Err(RecordError::StaleGeneration { .. })
                )
            }
            _ => false,
        };
        if whole_old_record {
            return Ok(());
        }
        a.log.set_len(a.data_end)?;
        self.sync_all(&*a.log)?;
        a.file_len = a.data_end;
        Ok(())
    }

    /// Takes a plan under the write lock and runs it without the lock. Returns the
    /// plan, to be published by [`PartitionLog::publish_synced`], or why the fsync
    /// failed.
    pub(super) fn sync_once(&self) -> Result<SyncPlan, FailureReason> {
        let plan = {
            let mut w = lock(&self.write);
            SyncPlan {
                target: w.next_offset,
                rolls: w.rolls,
                pending: std::mem::take(&mut w.pending),
                active_log: w.active.log.clone(),
                active_seg: w.active.seg.clone(),
                active_zero: w.active.zero.clone(),
                active_end: w.active.data_end,
            }
        };
        self.execute(&plan)
            .map_err(|e| match journal::not_durable(&e) {
                Some(why) => FailureReason::JournalNotDurable {
                    dir: self.dir.clone(),
                    why: why.0.clone(),
                },
                None => FailureReason::FsyncFailed {
                    dir: self.dir.clone(),
                    error: Arc::new(e),
                },
            })?;
        Ok(plan)
    }

    /// Publishes what a synced plan made readable, under the sync lock: the segments'
    /// readable ends and the durable end change together, so a reader that got a
    /// record from a readable end finds the durable end past it at its next request
    /// (which takes the sync lock), never an offset beyond the end.
    pub(super) fn publish_synced(&self, s: &mut SyncState, plan: &SyncPlan) {
        self.publish_synced_waking(s, plan, true);
    }

    /// [`PartitionLog::publish_synced`], waking the async waiters only when `wake`.
    fn publish_synced_waking(&self, s: &mut SyncState, plan: &SyncPlan, wake: bool) {
        // Group commits run one at a time, each planned after the one before published.
        assert!(plan.target >= s.durable_end, "durable end would shrink");
        assert!(plan.active_end <= plan.active_seg.written_end.load(Ordering::Acquire));
        for (seg, end) in &plan.pending.sealed {
            debug_assert!(*end <= seg.written_end.load(Ordering::Acquire));
            seg.readable_end.fetch_max(*end, Ordering::AcqRel);
        }
        plan.active_seg
            .readable_end
            .fetch_max(plan.active_end, Ordering::AcqRel);
        let covered = plan.target.saturating_sub(s.durable_end);
        if covered > 0 {
            self.stats.commit_records.record(covered);
        }
        s.durable_end = s.durable_end.max(plan.target);
        self.rolls_durable.fetch_max(plan.rolls, Ordering::AcqRel);
        if wake {
            self.wake_async(s.durable_end);
        }
    }

    /// Creates the index file of the active segment whose log is `log` (a roll onto
    /// a spare left it to this commit) and writes the index bytes appended so far.
    fn create_active_index(&self, log: &Arc<dyn StorageFile>, path: &Path) -> io::Result<()> {
        let index: Arc<dyn StorageFile> = Arc::from(self.storage.create(path)?);
        let w = lock(&self.write);
        // A roll starts only once this one is durable: the log is still the active one.
        assert!(
            Arc::ptr_eq(&w.active.log, log),
            "the active segment changed before its roll was durable"
        );
        w.active.index.install(index)
    }

    /// The fsync ordering of a group commit:
    /// 1. truncate the outgoing log of a pending roll to the end of its data (its
    ///    zero tail and reserved blocks) and `sync_all` it (its last data and the
    ///    truncation), then its index;
    /// 2. only then, for a roll that took a spare, rename it from `spares/` to the
    ///    new segment's name and create the new index (and write the index bytes
    ///    appended meanwhile); write the new segment's header (the roll's commit
    ///    record: it must never reach the disk before the records below its base) and
    ///    `sync_all` the new log;
    /// 3. fsync the partition directory (the new segment's names);
    /// 4. `sync_data` the active log, covering every record written before the plan
    ///    (already done by step 2 when the active log is the roll's new log).
    ///
    /// Space is reserved (`fallocate`, size kept) ahead of the active log's writer
    /// before the sync that covers the reservation: in step 2 for a new log, before
    /// step 4 when less than half the window is left.
    ///
    /// Only then may any record below the plan's target be acknowledged or served.
    /// Each of these file syncs first makes the producer journal durable as far as
    /// the log's records need ([`super::journal`]): records written after the plan
    /// was taken may be covered too.
    pub(super) fn execute(&self, plan: &SyncPlan) -> io::Result<()> {
        let mut active_synced = false;
        let window = self
            .stats
            .write_path
            .preallocate_bytes
            .load(Ordering::Relaxed);
        if let Some(roll) = &plan.pending.roll {
            // 1.
            if let Some(end) = roll.cut_to {
                roll.outgoing_log.set_len(end)?;
            }
            self.sync_all(&*roll.outgoing_log)?;
            self.sync_all(&*roll.outgoing_index)?;
            // 2.
            if let Some(place) = &roll.place {
                self.storage.rename(&place.from, &place.to).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "renaming spare {} to {}: {e}",
                            place.from.display(),
                            place.to.display()
                        ),
                    )
                })?;
                roll.new_zero.named();
                // Before the new log's sync, which then commits both names at once.
                self.create_active_index(&roll.new_log, &place.index)?;
            }
            roll.new_log.write_at(&roll.header, 0)?;
            zero::preallocate(&*roll.new_log, &roll.new_zero, HEADER_LEN as u64, window);
            self.sync_all(&*roll.new_log)?;
            active_synced = Arc::ptr_eq(&roll.new_log, &plan.active_log);
            // 3. (and the spare directory a reused file came from)
            if !planted!(SKIP_ROLL_DIR_FSYNC) {
                self.sync_dir()?;
                if let Some(dir) = &roll.spares_dir {
                    self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
                    self.storage.sync_dir(dir)?;
                }
            }
            if roll.spares_dir.is_some() {
                // The roll took a spare: the maker may make the next one now.
                self.stats.spares.wake_maker_if_low();
            }
        }
        // 4.
        if !active_synced && plan.active_end > plan.active_seg.readable_end.load(Ordering::Acquire)
        {
            zero::preallocate(
                &*plan.active_log,
                &plan.active_zero,
                plan.active_end,
                window,
            );
            let synced = self.sync_data(&*plan.active_log);
            if synced.is_err() && planted!(RETRY_FAILED_FSYNC) {
                return self.sync_data(&*plan.active_log);
            }
            synced?;
        }
        Ok(())
    }
}
