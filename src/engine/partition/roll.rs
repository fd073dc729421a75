//! Rolling: the outgoing segment is sealed and a new active segment is created with a
//! zero header; the next group commit makes the outgoing segment durable, then writes
//! the new header (the roll's commit record) and makes it and the new name durable
//! (docs/FORMAT.md, Segment states). A roll starts only once the previous roll is
//! durable, so at most one segment, the newest, can lack its header after a crash.

use super::*;

// ----- rolling -----

/// A new segment's log, its index, and the spare the log was taken from, if any.
type NewSegmentFiles = (
    Arc<dyn StorageFile>,
    Arc<dyn StorageFile>,
    Option<spares::Spare>,
);

/// Creates `<base>.log` starting with `header` (a generation-0 header, or 32 zero
/// bytes at a roll) and an empty `<base>.index`. Nothing is fsynced here; on failure,
/// whatever was created is removed.
pub(super) fn create_segment_files(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    header: &[u8; HEADER_LEN],
) -> io::Result<(Arc<dyn StorageFile>, Arc<dyn StorageFile>)> {
    let log_path = dir.join(log_file_name(base));
    let index_path = dir.join(index_file_name(base));
    let log: Arc<dyn StorageFile> = Arc::from(storage.create(&log_path)?);
    let made = (|| {
        log.write_at(header, 0)?;
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
    /// segment is to be rolled while the previous roll is not yet durable, it runs a
    /// group commit without the lock and looks again, until the previous roll is
    /// durable or no roll is wanted: a roll starts only once the previous one is
    /// durable (docs/FORMAT.md, Segment states), so only the newest segment can lack
    /// its header after a crash. Each round either finds the roll durable or runs
    /// (or waits for) a group commit that covers it.
    pub(super) fn lock_for_roll(
        &self,
        wants_roll: impl Fn(&Active) -> bool,
    ) -> Result<MutexGuard<'_, WriteState>, EngineError> {
        loop {
            let w = lock(&self.write);
            self.check_writable()?;
            let outstanding = w.rolls > self.rolls_durable.load(Ordering::Acquire);
            if !(outstanding && wants_roll(&w.active)) {
                return Ok(w);
            }
            drop(w);
            self.sync_pending()?;
        }
    }

    /// The new segment's files at a roll: a spare from the node's pool renamed to
    /// `path` (its header still the spare's), else a new file with its 32 header
    /// bytes zero; and a new, empty index. Nothing is fsynced here.
    fn new_segment_files(&self, base: u64, path: &Path) -> io::Result<NewSegmentFiles> {
        let Some(spare) = self.stats.spares.take(&*self.storage, path) else {
            let first_bytes = if planted!(ROLL_BEFORE_DATA_DURABLE) {
                SegmentHeader::new(base).encode()
            } else {
                [0; HEADER_LEN]
            };
            let (log, index) = create_segment_files(&*self.storage, &self.dir, base, &first_bytes)?;
            return Ok((log, index, None));
        };
        let index_path = self.dir.join(index_file_name(base));
        let made = (|| {
            let log: Arc<dyn StorageFile> = Arc::from(self.storage.open(path)?);
            if planted!(SPARE_BASE_BEFORE_DATA_DURABLE) {
                let header = SegmentHeader {
                    base_offset: base,
                    generation: spare.generation,
                    flags: 0,
                };
                log.write_at(&header.encode(), 0)?;
            }
            let index: Arc<dyn StorageFile> = Arc::from(self.storage.create(&index_path)?);
            Ok((log, index))
        })();
        match made {
            Ok((log, index)) => Ok((log, index, Some(spare))),
            Err(e) => {
                // Its header still marks a spare: recovery would remove it too.
                let _ = self.storage.remove_file(path);
                let _ = self.storage.remove_file(&index_path);
                Err(e)
            }
        }
    }

    /// Seals the active segment and starts a new one at the next offset, without an
    /// fsync (writers append to the new segment at once):
    /// 1. stop zeroing the outgoing log and note where its data ends: the next group
    ///    commit truncates it there (a truncation waits for the file system's journal,
    ///    so it is kept off the writer's lock);
    /// 2. create the new log with its 32 header bytes zero (or take a spare, whose
    ///    header still marks it unassigned), and its index;
    /// 3. leave the rest to the next group commit (see [`PartitionLog::execute`]):
    ///    fsync the outgoing log and index, then write and fsync the new header, then
    ///    fsync the directory, before any record of the new segment is acknowledged or
    ///    served;
    /// 4. publish the new segment list.
    ///
    /// The caller holds the lock from [`PartitionLog::lock_for_roll`]: the previous
    /// roll is durable.
    pub(super) fn roll(&self, w: &mut WriteState, now: i64) -> Result<(), EngineError> {
        assert!(
            w.pending.roll.is_none(),
            "a roll starts only once the previous roll is durable"
        );
        let base = w.next_offset;
        let old = &w.active;
        // Only a segment that holds records is rolled: the new base is above the old.
        assert!(base > old.seg.base_offset && old.data_end > HEADER_LEN as u64);
        // 1. (no zeros may be in flight once it is cut: the worker stops first)
        let zeroed_end = old.zero.seal();
        let reserved = old.zero.allocated_end.load(Ordering::Acquire);
        let cut_to =
            (old.file_len.max(zeroed_end).max(reserved) > old.data_end).then_some(old.data_end);
        // 2.
        let path = self.dir.join(log_file_name(base));
        let (log, index, spare) = self.new_segment_files(base, &path).map_err(|e| {
            EngineError::io(
                format!(
                    "creating segment {} in {}",
                    log_file_name(base),
                    self.dir.display()
                ),
                e,
            )
        })?;
        let generation = spare.as_ref().map_or(0, |s| s.generation);
        // A reused file's old bytes are records of an older generation: zeroing
        // starts past them.
        let old_len = spare.as_ref().map_or(HEADER_LEN as u64, |s| s.len);
        let header = SegmentHeader {
            base_offset: base,
            generation,
            flags: 0,
        }
        .encode();
        let seg = Segment::new(
            base,
            generation,
            path.clone(),
            Vec::new(),
            HEADER_LEN as u64,
            &self.stats.files,
        );
        let seg = match seg {
            Ok(s) => Arc::new(s),
            Err(e) => {
                let removed = self.storage.remove_file(&path).and_then(|()| {
                    self.storage
                        .remove_file(&path.with_extension(crate::format::names::INDEX_EXT))
                });
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
            file_len: old_len,
            index_len: 0,
            builder: IndexBuilder::new(),
            born_ms: now,
            max_timestamp: None,
            zero: Arc::new(ZeroTarget::new(
                path.clone(),
                HEADER_LEN as u64,
                old_len,
                old_len,
                self.journal.clone(),
            )),
        };
        self.stats.write_path.register(&new.zero);
        let new_zero = new.zero.clone();
        let old = std::mem::replace(&mut w.active, new);
        let _ = old.seg.max_timestamp.set(old.max_timestamp);
        old.seg.seal_tally();
        // Sealed: its read handle joins the broker's bounded cache.
        old.seg.file.release();
        // 3.
        w.pending.roll = Some(PendingRoll {
            outgoing_log: old.log,
            cut_to,
            outgoing_index: old.index,
            new_log: log,
            new_zero,
            header,
            spares_dir: spare.and(self.stats.spares.dir()),
        });
        w.pending.sealed.push((old.seg, old.data_end));
        // 4.
        let mut list = self.snapshot().as_ref().clone();
        list.push(seg);
        self.publish(list);
        w.rolls += 1;
        self.stats.write_path.rolls.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            topic = %self.topic,
            partition = self.partition,
            base_offset = base,
            sealed_bytes = w.pending.sealed.last().map_or(0, |(_, end)| *end),
            "rolled to a new segment"
        );
        Ok(())
    }
}
