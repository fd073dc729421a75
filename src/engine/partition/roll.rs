//! Rolling: the outgoing segment is sealed and a new active segment is created; the
//! syncs the roll leaves are carried by the next group commit (docs/FORMAT.md,
//! Segment states).

use super::*;

// ----- rolling -----

/// Creates `<base>.log` with a generation-0 header and an empty `<base>.index`.
/// Nothing is fsynced here; on failure, whatever was created is removed.
pub(super) fn create_segment_files(
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
    pub(super) fn lock_for_roll(
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
    pub(super) fn roll(&self, w: &mut WriteState, now: i64) -> Result<(), EngineError> {
        let base = w.next_offset;
        let old = &mut w.active;
        // Only a segment that holds records is rolled: the new base is above the old.
        assert!(base > old.seg.base_offset && old.data_end > HEADER_LEN as u64);
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
                    Err(r) => self.fail(FailureReason::NewSegmentStuck {
                        path: path.clone(),
                        open: Arc::new(e),
                        remove: Arc::new(r),
                    }),
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
