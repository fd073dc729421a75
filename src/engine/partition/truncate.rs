//! Cutting a log's tail at an offset, and restarting an emptied log at a later
//! offset: the two operations a replicated log needs beyond appending (Raft cuts a
//! divergent uncommitted tail, and a log purged past its end continues after the
//! purge point). Both are durable before they return, and crash-safe: every crash
//! leaves a log that joins up (a prefix of the old one, or the new state).
//!
//! Neither runs concurrently with appends: the caller serialises them (the Raft log
//! store does, through `&mut self`). Both first make everything written durable, so
//! no group commit is left planned past the cut.

use super::*;

/// Which way a failed step left the files (for the failure reason).
fn cut_failed(path: &Path, e: io::Error) -> FailureReason {
    let e = Arc::new(e);
    FailureReason::CutFailed {
        path: path.to_path_buf(),
        write: e.clone(),
        cut: e,
    }
}

impl PartitionLog {
    /// Removes every record at or past `offset` (nothing when `offset` is at or past
    /// the end; everything when it is at or below the start, leaving the oldest
    /// segment empty). The fsync ordering:
    /// 1. make everything written durable (a group commit);
    /// 2. remove the segments whose base is at or past the cut, newest first: for
    ///    each, remove its index, fsync the directory, remove its log, fsync the
    ///    directory (a crash leaves a shorter log that still joins up);
    /// 3. truncate the segment holding the cut to the position of the first record
    ///    cut and `sync_all` it; its index is derived and rewritten from the scan
    ///    when the segment is reopened as the active one.
    ///
    /// A failed step fails the log (it refuses writes until a restart runs
    /// recovery, which sees one of the crash states above).
    pub fn cut_tail(&self, offset: u64) -> Result<(), EngineError> {
        self.check_writable()?;
        // 1.
        let mut w = self.lock_settled()?;
        if offset >= w.next_offset {
            return Ok(());
        }
        let segments = self.snapshot();
        let start = segments.first().map_or(0, |s| s.base_offset);
        let offset = offset.max(start);
        let keep = segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        let Some(kept) = segments.get(keep).cloned() else {
            return Ok(());
        };
        let newer = segments.get(keep + 1..).unwrap_or_default();
        w.active.zero.seal();
        // 2.
        for seg in newer.iter().rev() {
            let index = self.dir.join(index_file_name(seg.base_offset));
            self.remove_durably(&index)
                .map_err(|e| self.fail(cut_failed(&index, e)))?;
            self.remove_durably(&seg.path)
                .map_err(|e| self.fail(cut_failed(&seg.path, e)))?;
        }
        // 3.
        let position = self
            .position_of(&kept, offset)
            .map_err(|e| self.fail(cut_failed(&kept.path, e)))?;
        let cut = (|| {
            let f = self.storage.open(&kept.path)?;
            f.set_len(position)?;
            self.sync_all(&*f)
        })();
        cut.map_err(|e| self.fail(cut_failed(&kept.path, e)))?;
        let mut kept_list: Vec<Arc<Segment>> = segments.get(..keep).unwrap_or_default().to_vec();
        self.reopen_active(&mut w, kept.base_offset, &mut kept_list)?;
        assert_eq!(w.next_offset, offset, "the cut log does not end at the cut");
        Ok(())
    }

    /// Empties the log and makes it continue at `offset` (a log whose every record
    /// was purged, or a Raft log cut below its first record). The fsync ordering:
    /// 1. make everything written durable (a group commit);
    /// 2. remove every segment, oldest first: its index, then its log, each followed
    ///    by an fsync of the directory (a crash leaves a suffix of the log, or an
    ///    empty directory that opens as an empty log at offset 0: the caller, who
    ///    knows the offset it wanted, calls again);
    /// 3. create the segment at `offset`, `sync_all` it, fsync the directory.
    pub fn restart_at(&self, offset: u64) -> Result<(), EngineError> {
        self.check_writable()?;
        // 1.
        let mut w = self.lock_settled()?;
        let segments = self.snapshot();
        if segments.len() == 1 && w.next_offset == offset && w.active.seg.base_offset == offset {
            return Ok(());
        }
        w.active.zero.seal();
        // 2.
        for seg in segments.iter() {
            let index = self.dir.join(index_file_name(seg.base_offset));
            self.remove_durably(&index)
                .map_err(|e| self.fail(cut_failed(&index, e)))?;
            self.remove_durably(&seg.path)
                .map_err(|e| self.fail(cut_failed(&seg.path, e)))?;
        }
        // 3.
        let path = self.dir.join(log_file_name(offset));
        let made = (|| {
            let header = SegmentHeader::new(offset).encode();
            let (log, _index) = create_segment_files(&*self.storage, &self.dir, offset, &header)?;
            self.sync_all(&*log)?;
            self.sync_dir()
        })();
        made.map_err(|e| self.fail(cut_failed(&path, e)))?;
        self.reopen_active(&mut w, offset, &mut Vec::new())?;
        assert_eq!(
            w.next_offset, offset,
            "the restarted log does not begin at its offset"
        );
        Ok(())
    }

    /// Makes everything written durable and returns the write lock with no group
    /// commit left to run (no pending roll, every written record durable).
    fn lock_settled(&self) -> Result<MutexGuard<'_, WriteState>, EngineError> {
        loop {
            self.flush()?;
            let w = lock(&self.write);
            if w.pending.roll.is_none()
                && w.pending.sealed.is_empty()
                && !w.commit_claimed
                && lock(&self.sync).durable_end == w.next_offset
            {
                return Ok(w);
            }
            // An append or a claim came in between: settle it too.
            drop(w);
            std::thread::yield_now();
        }
    }

    /// Removes `path` (gone already is fine) and fsyncs the directory.
    fn remove_durably(&self, path: &Path) -> io::Result<()> {
        match self.storage.remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.sync_dir()
    }

    /// Position in `seg` of the first record at or past `offset` (the end of its data
    /// when there is none).
    fn position_of(&self, seg: &Segment, offset: u64) -> io::Result<u64> {
        let file = seg.file()?;
        let len = seg.bytes();
        let header = checked_header(&file, len, &seg.path, seg.base_offset)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let mut first_cut = None;
        let scan = scan_segment(&file, &header, len, |position, r| {
            if r.offset >= offset && first_cut.is_none() {
                first_cut = Some(position);
            }
        })?;
        Ok(first_cut.unwrap_or(scan.data_end))
    }

    /// Opens the segment at `base` as the active one after a cut or a restart and
    /// makes it, after `older`, the log's whole list.
    fn reopen_active(
        &self,
        w: &mut WriteState,
        base: u64,
        older: &mut Vec<Arc<Segment>>,
    ) -> Result<(), EngineError> {
        let mut notes = Vec::new();
        let opened = open_active(
            &*self.storage,
            &self.dir,
            base,
            &self.stats.files,
            &self.stats.write_path,
            &self.journal,
            w.active.zero.end_cap(),
            &mut notes,
        );
        let (active, next_offset) = match opened {
            Ok(v) => v,
            Err(e) => {
                let reason = FailureReason::NewSegmentStuck {
                    path: self.dir.join(log_file_name(base)),
                    open: Arc::new(io::Error::other(e.to_string())),
                    remove: Arc::new(io::Error::other("not removed: it holds the log's tail")),
                };
                return Err(self.fail(reason));
            }
        };
        older.push(active.seg.clone());
        w.active = active;
        w.next_offset = next_offset;
        w.pending = Pending::default();
        self.publish(std::mem::take(older));
        let mut s = lock(&self.sync);
        s.durable_end = next_offset;
        self.wake_async(s.durable_end);
        self.synced.notify_all();
        Ok(())
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;
    use crate::engine::maintenance::recovery::{execute, plan_partition, RecoveryPlan};
    use crate::engine::storage::io::RealStorage;
    use crate::engine::storage::layout::PartitionRef;
    use crate::format::decode_record;
    use crate::testkit::sim::{crash_states, DirModel, Materialiser, Rng, SimStorage};
    use crate::testkit::storage::{FailOn, FailingStorage};

    const RECORDS: u64 = 40;

    fn config() -> TopicConfig {
        TopicConfig {
            segment_bytes: 300,
            ..TopicConfig::default()
        }
    }

    fn value(offset: u64) -> Vec<u8> {
        format!("record-{offset:04}").into_bytes()
    }

    fn open(dir: &Path, storage: StorageRef) -> PartitionLog {
        PartitionLog::open("t", 0, dir, storage, Arc::new(LogStats::default()))
            .unwrap()
            .0
    }

    /// A log of [`RECORDS`] records over several segments, all durable.
    fn filled(dir: &Path) {
        let log = open(dir, Arc::new(RealStorage));
        for o in 0..RECORDS {
            let v = value(o);
            let r = [NewRecord {
                key: None,
                value: &v,
                timestamp_ms: 1,
            }];
            log.append(&r, &config()).unwrap();
        }
        log.flush().unwrap();
        assert!(log.snapshot().len() >= 4, "the test wants several segments");
    }

    /// Every record the log serves, as (offset, value).
    fn records(log: &PartitionLog) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut next = log.start_offset();
        while next < log.durable_end() {
            let f = log.fetch(next, 1 << 20, Duration::ZERO).unwrap();
            for c in &f.chunks {
                let mut pos = 0;
                while pos < c.bytes.len() {
                    let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
                    out.push((r.offset, r.value.to_vec()));
                    pos += r.encoded_len;
                    next = r.offset + 1;
                }
            }
        }
        out
    }

    /// Runs recovery on `dir` (as a restart does) and opens it.
    fn recover_and_open(dir: &Path) -> PartitionLog {
        let pref = PartitionRef {
            dir: dir.to_path_buf(),
            topic: None,
            partition: None,
            config: config(),
            only_segment: None,
        };
        let pp = plan_partition(&pref).unwrap();
        let plan = RecoveryPlan {
            root: dir.to_path_buf(),
            partitions: vec![pp],
            topics: Vec::new(),
        };
        execute(&RealStorage, &plan, None).unwrap();
        open(dir, Arc::new(RealStorage))
    }

    /// The log holds exactly the records `0..end` (from `start`), with their values.
    fn assert_prefix(log: &PartitionLog, start: u64, end: u64, what: &str) {
        let got = records(log);
        let want: Vec<(u64, Vec<u8>)> = (start..end).map(|o| (o, value(o))).collect();
        assert_eq!(got, want, "{what}");
        assert_eq!(log.written_end(), end, "{what}");
    }

    #[test]
    fn cut_at_every_offset_keeps_exactly_the_records_below() {
        for cut in 0..=RECORDS + 1 {
            let dir = tempfile::tempdir().unwrap();
            filled(dir.path());
            let log = open(dir.path(), Arc::new(RealStorage));
            log.cut_tail(cut).unwrap();
            let end = cut.min(RECORDS);
            assert_prefix(&log, 0, end, &format!("cut at {cut}"));
            // Appends continue at the cut, and a restart sees the same log.
            let v = value(end);
            let r = [NewRecord {
                key: None,
                value: &v,
                timestamp_ms: 1,
            }];
            let a = log.append(&r, &config()).unwrap();
            assert_eq!(a.base_offset, end);
            log.flush().unwrap();
            drop(log);
            let log = open(dir.path(), Arc::new(RealStorage));
            assert_prefix(
                &log,
                0,
                end + 1,
                &format!("reopened after the cut at {cut}"),
            );
        }
    }

    #[test]
    fn restart_empties_the_log_and_continues_at_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let log = open(dir.path(), Arc::new(RealStorage));
        log.restart_at(RECORDS + 10).unwrap();
        assert_eq!(log.start_offset(), RECORDS + 10);
        assert_prefix(&log, RECORDS + 10, RECORDS + 10, "restarted");
        drop(log);
        let log = open(dir.path(), Arc::new(RealStorage));
        assert_eq!(log.start_offset(), RECORDS + 10);
        assert_eq!(log.written_end(), RECORDS + 10);
        // Backwards too: the log is emptied either way.
        log.restart_at(3).unwrap();
        assert_prefix(&log, 3, 3, "restarted below its old start");
        assert_eq!(log.start_offset(), 3);
    }

    /// Fails each storage call of a cut in turn (the process dies there): the log
    /// refuses writes, and after recovery it holds every record below the cut and a
    /// prefix of the rest, never a gap.
    #[test]
    fn a_failure_at_every_step_of_a_cut_leaves_a_prefix() {
        let cut = 7;
        // Open's own calls come first: count them on a storage that never fails.
        let probe_dir = tempfile::tempdir().unwrap();
        filled(probe_dir.path());
        let probe = Arc::new(FailingStorage::new(
            Arc::new(RealStorage),
            u64::MAX,
            FailOn::Any,
            false,
        ));
        drop(open(probe_dir.path(), probe.clone() as StorageRef));
        let before = probe.calls();
        for n in 1.. {
            let dir = tempfile::tempdir().unwrap();
            filled(dir.path());
            let failing = Arc::new(FailingStorage::new(
                Arc::new(RealStorage),
                before + n,
                FailOn::Any,
                true,
            ));
            let log = open(dir.path(), failing.clone() as StorageRef);
            assert!(!failing.has_failed(), "open made more calls than counted");
            let result = log.cut_tail(cut);
            let failed = failing.has_failed();
            drop(log);
            let log = recover_and_open(dir.path());
            let end = log.written_end();
            assert!(
                (cut..=RECORDS).contains(&end),
                "call {n}: end {end} outside {cut}..={RECORDS}"
            );
            assert_prefix(&log, 0, end, &format!("failure at call {n}"));
            if !failed {
                result.unwrap();
                assert_eq!(end, cut, "the cut returned, so it is durable");
                assert!(n > 3, "the cut made storage calls");
                break;
            }
            // A failed best-effort call (a preallocation) may leave the cut done.
            assert!(
                result.is_err() || end == cut,
                "call {n}: the failure was neither reported nor harmless"
            );
            assert!(n < 1000, "the cut never finished");
        }
    }

    /// Every crash state of a cut across segments reopens (after recovery) as a
    /// prefix of the old log holding every record below the cut; once the cut has
    /// returned, exactly the records below it.
    #[test]
    fn every_crash_state_of_a_cut_is_a_prefix() {
        let cut = 9;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("p");
        std::fs::create_dir(&root).unwrap();
        filled(&root);
        let sim = SimStorage::new(&root).unwrap();
        let log = open(&root, Arc::new(sim.clone()));
        let opened = sim.len();
        log.cut_tail(cut).unwrap();
        drop(log);
        let trace = sim.trace();
        assert!(trace.ops.len() > opened);
        let dur = trace.durability();
        let mut mat = Materialiser::new(&trace);
        let mut rng = Rng::new(17);
        let n = trace.ops.len();
        let mut states = 0;
        for k in opened..=n {
            let pending = dur.pending(&trace, k);
            for model in [DirModel::InOrder, DirModel::AnyOrder] {
                for choices in crash_states(&trace, &pending, model, 256, 16, &mut rng) {
                    let img = mat.image(&dur, k, &pending, &choices);
                    let out = tempfile::tempdir().unwrap();
                    img.write_to(out.path()).unwrap();
                    let log = recover_and_open(out.path());
                    let end = log.written_end();
                    let what = format!("crash point {k}/{n} {model:?} {choices:?}");
                    assert!((cut..=RECORDS).contains(&end), "{what}: end {end}");
                    assert_prefix(&log, 0, end, &what);
                    if k == n {
                        assert_eq!(end, cut, "{what}: the cut returned");
                    }
                    states += 1;
                }
            }
        }
        assert!(states > n - opened);
    }
}
