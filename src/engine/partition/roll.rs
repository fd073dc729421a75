//! Rolling: the outgoing segment is sealed and a new active segment starts, either in
//! a spare from the node's pool (opened where it lies in `spares/`, its header still
//! the spare's) or in a new file with a zero header; the next group commit makes the
//! outgoing segment durable, then (for a spare) renames it into place, writes the
//! new header (the roll's commit record), creates the index a spare lacks, and makes
//! the new names durable (docs/FORMAT.md, Segment states and Spares). So a roll onto
//! a spare makes no system call while writers wait. A roll starts only once the
//! previous roll is durable, so at most one segment, the newest, can lack its header
//! after a crash.

use super::*;

// ----- rolling -----

/// A new segment's files at a roll.
struct NewSegmentFiles {
    log: Arc<dyn StorageFile>,
    index: ActiveIndex,
    /// Where the log is now: `<base>.log`, or a spare's name in `spares/` until the
    /// roll's group commit renames it.
    open_at: PathBuf,
    /// What the roll's group commit renames and creates, for a spare still in
    /// `spares/`.
    place: Option<PlaceSpare>,
    /// The spare the log is, if any.
    spare: Option<spares::Spare>,
}

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

    /// The new segment's files at a roll: a spare from the node's pool, opened where
    /// it is (its header still the spare's; the roll's group commit renames it to
    /// `path` and creates the index, so the roll itself touches no directory), else
    /// a new file at `path` with its 32 header bytes zero and a new, empty index.
    /// Nothing is fsynced here.
    fn new_segment_files(&self, base: u64, path: &Path) -> io::Result<NewSegmentFiles> {
        let index_path = self.dir.join(index_file_name(base));
        if let Some(spare) = self.stats.spares.take(self.file_system) {
            if planted!(SPARE_BASE_BEFORE_DATA_DURABLE) {
                return self.place_spare_now(spare, base, path, &index_path);
            }
            match self.storage.open(&spare.path) {
                Ok(log) => {
                    return Ok(NewSegmentFiles {
                        log: Arc::from(log),
                        index: ActiveIndex::later(),
                        open_at: spare.path.clone(),
                        place: Some(PlaceSpare {
                            from: spare.path.clone(),
                            to: path.to_path_buf(),
                            index: index_path,
                        }),
                        spare: Some(spare),
                    });
                }
                // Out of the pool; the next start re-stamps or removes it.
                Err(e) => {
                    tracing::warn!(spare = %spare.path.display(), error = %e, "taking a spare failed");
                }
            }
        }
        let first_bytes = if planted!(ROLL_BEFORE_DATA_DURABLE) {
            SegmentHeader::new(base).encode()
        } else {
            [0; HEADER_LEN]
        };
        let (log, index) = create_segment_files(&*self.storage, &self.dir, base, &first_bytes)?;
        Ok(NewSegmentFiles {
            log,
            index: ActiveIndex::open(index),
            open_at: path.to_path_buf(),
            place: None,
            spare: None,
        })
    }

    /// The planted bug `SPARE_BASE_BEFORE_DATA_DURABLE`: the spare is renamed at the
    /// roll and its header gets the new base at once, before the outgoing segment is
    /// durable.
    fn place_spare_now(
        &self,
        spare: spares::Spare,
        base: u64,
        path: &Path,
        index_path: &Path,
    ) -> io::Result<NewSegmentFiles> {
        self.storage.rename(&spare.path, path)?;
        let made = (|| {
            let log: Arc<dyn StorageFile> = Arc::from(self.storage.open(path)?);
            let header = SegmentHeader {
                base_offset: base,
                generation: spare.generation,
                flags: 0,
            };
            log.write_at(&header.encode(), 0)?;
            let index: Arc<dyn StorageFile> = Arc::from(self.storage.create(index_path)?);
            Ok((log, index))
        })();
        match made {
            Ok((log, index)) => Ok(NewSegmentFiles {
                log,
                index: ActiveIndex::open(index),
                open_at: path.to_path_buf(),
                place: None,
                spare: Some(spare),
            }),
            Err(e) => {
                let _ = self.storage.remove_file(path);
                let _ = self.storage.remove_file(index_path);
                Err(e)
            }
        }
    }

    /// Seals the active segment and starts a new one at the next offset, without an
    /// fsync (writers append to the new segment at once):
    /// 1. stop zeroing the outgoing log and note where its data ends: the next group
    ///    commit truncates it there (a truncation waits for the file system's journal,
    ///    so it is kept off the writer's lock);
    /// 2. take a spare, opened where it lies (its header still marks it unassigned;
    ///    the commit renames it and creates its index), or create the new log with
    ///    its 32 header bytes zero, and its index;
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
        // The previous roll's commit created the outgoing index (it is durable).
        let outgoing_index = old.index.file().cloned().ok_or_else(|| {
            EngineError::io(
                format!("rolling {}", self.dir.display()),
                io::Error::other("the outgoing segment's index file was never created"),
            )
        })?;
        // 1. (no zeros may be in flight once it is cut: the worker stops first)
        let zeroed_end = old.zero.seal();
        let reserved = old.zero.allocated_end.load(Ordering::Acquire);
        let cut_to =
            (old.file_len.max(zeroed_end).max(reserved) > old.data_end).then_some(old.data_end);
        // 2.
        let path = self.dir.join(log_file_name(base));
        let new_files = self.new_segment_files(base, &path).map_err(|e| {
            EngineError::io(
                format!(
                    "creating segment {} in {}",
                    log_file_name(base),
                    self.dir.display()
                ),
                e,
            )
        })?;
        let NewSegmentFiles {
            log,
            index,
            open_at,
            place,
            spare,
        } = new_files;
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
            &open_at,
            HEADER_LEN as u64,
            &self.stats.files,
        );
        let seg = match seg {
            Ok(s) => Arc::new(s),
            Err(e) => {
                // A spare not yet renamed is removed where it is (its header still
                // marks a spare; the next start would re-stamp it).
                let removed = match &place {
                    Some(p) => self.storage.remove_file(&p.from),
                    None => self.storage.remove_file(&path).and_then(|()| {
                        self.storage
                            .remove_file(&path.with_extension(crate::format::names::INDEX_EXT))
                    }),
                };
                return Err(match removed {
                    Ok(()) => EngineError::io(format!("opening {}", open_at.display()), e),
                    Err(r) => self.fail(FailureReason::NewSegmentStuck {
                        path: open_at.clone(),
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
        if place.is_some() {
            // The zero worker opens the file by its segment name: not before the
            // commit renamed it.
            new.zero.wait_for_name();
        }
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
            outgoing_index,
            new_log: log,
            place,
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
