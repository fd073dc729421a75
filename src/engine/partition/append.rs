//! The write path: checking and encoding a batch, appending it under the write lock,
//! cutting off a write that failed part-way.

use super::*;

// ----- the write path -----

/// Checks sizes and returns the encoded length of the batch.
pub(super) fn check_batch(
    records: &[NewRecord<'_>],
    max_record_bytes: u32,
) -> Result<u64, EngineError> {
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
pub(super) struct Encoded {
    log_bytes: Vec<u8>,
    index_bytes: Vec<u8>,
    entries: Vec<IndexEntry>,
    builder: IndexBuilder,
    max_timestamp: Option<i64>,
}

pub(super) fn encode_batch(
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
    let index_bytes = encode_index(&entries);
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
        match self.append_inner(records, config, |_, _| Ok::<(), EngineError>(()), false) {
            Ok((a, ())) => Ok(a),
            Err(AppendError::Engine(e) | AppendError::Before(e)) => Err(e),
        }
    }

    /// [`PartitionLog::append`] with `before_write` run under the write lock once the
    /// batch's offsets (first, last) are known and before any of it is written: what
    /// it writes (an idempotent producer's journal entry) is in its file before the
    /// records are in theirs, so a process that dies between the two leaves an entry
    /// whose records are missing, never records without their entry. For a power
    /// loss, the log's journal need is raised to the journal's written position
    /// before the records are written: no sync of the log covers them before the
    /// journal is durable that far ([`super::journal`]). When it fails,
    /// nothing is written and no offset is used. When the write fails after it
    /// succeeded, the log is failed: the offsets it named must not be given to other
    /// records until a restart has dropped what names them.
    pub fn append_with<R, E>(
        &self,
        records: &[NewRecord<'_>],
        config: &TopicConfig,
        before_write: impl FnOnce(u64, u64) -> Result<R, E>,
    ) -> Result<(Appended, R), AppendError<E>> {
        self.append_inner(records, config, before_write, true)
    }

    /// The append; `names_offsets`: `before_write` wrote something that names the
    /// batch's offsets, so a failed write fails the log.
    fn append_inner<R, E>(
        &self,
        records: &[NewRecord<'_>],
        config: &TopicConfig,
        before_write: impl FnOnce(u64, u64) -> Result<R, E>,
        names_offsets: bool,
    ) -> Result<(Appended, R), AppendError<E>> {
        let batch_len = check_batch(records, config.max_record_bytes)?;
        let now = now_ms();
        let began = Instant::now();
        let mut w = self.lock_for_roll(|a| should_roll(a, batch_len, config, now))?;
        if should_roll(&w.active, batch_len, config, now) {
            self.roll(&mut w, now)?;
            let stall = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.stats
                .write_path
                .roll_stall_max_us
                .fetch_max(stall, Ordering::Relaxed);
        }
        if let Some(error) = w.active.zero.failure() {
            // A failed fsync of the zeros may have dropped this file's records too.
            return Err(AppendError::Engine(self.fail(FailureReason::FsyncFailed {
                dir: self.dir.clone(),
                error,
            })));
        }
        let base = w.next_offset;
        let count = records.len() as u64;
        let Some(next_offset) = base.checked_add(count) else {
            return Err(AppendError::Engine(EngineError::InvalidRequest {
                detail: format!(
                    "{}: offset {base} + {count} records would pass the largest offset",
                    self.dir.display()
                ),
            }));
        };
        let enc = encode_batch(records, &w.active, base, batch_len, now)?;
        assert!(
            base >= w.active.seg.base_offset,
            "offset below the active segment"
        );
        assert_eq!(
            enc.log_bytes.len() as u64,
            batch_len,
            "encoded batch differs from its checked size"
        );
        let (before, late) = if planted!(WRITE_BEFORE_JOURNAL) {
            (None, Some(before_write))
        } else {
            let r = before_write(base, next_offset - 1).map_err(AppendError::Before)?;
            // Before the records are written: every sync that may cover them makes
            // the journal durable up to the step's entry first.
            if names_offsets {
                self.journal.raise(self.stats.journal_written());
            }
            (Some(r), None)
        };
        // The segment rolls before its data passes `segment_bytes` (or after this
        // write, when one batch is larger): nothing past that is reserved or zeroed.
        w.active
            .zero
            .cap_at(config.segment_bytes.max(w.active.data_end + batch_len));
        // Announced before the write: the zero worker never claims space below it.
        let window = self
            .stats
            .write_path
            .preallocate_bytes
            .load(Ordering::Relaxed);
        if w.active
            .zero
            .before_write(w.active.data_end + batch_len, window)
        {
            self.stats.write_path.wake_zeroer();
        }
        if let Err(e) = self.write_batch(&w.active, &enc) {
            if !names_offsets {
                return Err(AppendError::Engine(e));
            }
            return Err(AppendError::Engine(self.fail(
                FailureReason::WriteAfterJournal {
                    path: w.active.seg.path.clone(),
                    base_offset: base,
                    last_offset: next_offset - 1,
                    error: Arc::new(e),
                },
            )));
        }
        let before = match (before, late) {
            (Some(r), _) => r,
            (None, Some(step)) => {
                let r = step(base, next_offset - 1).map_err(AppendError::Before)?;
                self.journal.raise(self.stats.journal_written());
                r
            }
            (None, None) => unreachable!("the step ran or is left"),
        };
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
        a.seg.records.fetch_add(count, Ordering::AcqRel);
        w.next_offset = next_offset;
        assert!(a_written_end_is_data_end(&w.active));
        self.stats.produce_requests.fetch_add(1, Ordering::Relaxed);
        self.stats
            .records_appended
            .fetch_add(count, Ordering::Relaxed);
        let durable_end = lock(&self.sync).durable_end;
        assert!(
            durable_end <= w.next_offset,
            "durable end {durable_end} past the next offset {}",
            w.next_offset
        );
        let unflushed = w.next_offset - durable_end;
        Ok((
            Appended {
                base_offset: base,
                last_offset: base + count - 1,
                unflushed,
            },
            before,
        ))
    }

    /// Why the log refuses writes (failed, deleted, shutting down), if it does.
    pub fn check_writable_pub(&self) -> Result<(), EngineError> {
        self.check_writable()
    }

    pub(super) fn check_writable(&self) -> Result<(), EngineError> {
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
    pub(super) fn write_batch(&self, a: &Active, enc: &Encoded) -> Result<(), EngineError> {
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
    pub(super) fn cut_back(&self, a: &Active, err: io::Error, what: &str) -> EngineError {
        // No zeros in flight while the file is cut; none after.
        a.zero.seal();
        let cut = (|| {
            // 1.
            a.log.set_len(a.data_end)?;
            a.index.set_len(a.index_len)?;
            // 2. (an index whose file the roll's commit has yet to create is in memory)
            self.sync_all(&*a.log)?;
            match a.index.file() {
                Some(index) => self.sync_all(&**index),
                None => Ok(()),
            }
        })();
        match cut {
            Ok(()) => EngineError::io(
                format!("{what} {} at position {}", a.seg.path.display(), a.data_end),
                err,
            ),
            Err(e) => self.fail(FailureReason::CutFailed {
                path: a.seg.path.clone(),
                write: Arc::new(err),
                cut: Arc::new(e),
            }),
        }
    }
}

/// The active segment's published end is the end of its data, inside the file.
fn a_written_end_is_data_end(a: &Active) -> bool {
    a.seg.written_end.load(Ordering::Acquire) == a.data_end
        && a.data_end <= a.file_len
        && a.data_end >= HEADER_LEN as u64
}

pub(super) fn should_roll(a: &Active, batch_len: u64, config: &TopicConfig, now: i64) -> bool {
    let empty = a.data_end <= HEADER_LEN as u64;
    let full = a.data_end.saturating_add(batch_len) > config.segment_bytes;
    let old = now.saturating_sub(a.born_ms) >= config.segment_ms;
    !empty && (full || old)
}
