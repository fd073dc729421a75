//! The two streaming passes: pass one builds the key table from the sealed segments;
//! pass two copies the records that survive into new segments (split at
//! `segment_bytes`, indexes built by the format's rule) in temporary files.

use super::*;

/// Records handled per batch: each batch prefetches its slots first, then uses them.
pub(super) const BATCH_RECORDS: usize = 32;

/// Bytes read between two progress reports.
pub(super) const PROGRESS_STEP_BYTES: u64 = 16 * 1024 * 1024;

/// Reports bytes read so far over both passes, out of twice the sealed bytes.
pub(super) struct Progress<'a> {
    pub(super) report: &'a dyn Fn(u64, u64),
    pub(super) total: u64,
    /// Bytes of the segments (and pass) already finished.
    pub(super) base: u64,
    pub(super) next: u64,
}

impl Progress<'_> {
    pub(super) fn at(&mut self, position_in_segment: u64) {
        let done = self.base + position_in_segment;
        if done >= self.next {
            (self.report)(done.min(self.total), self.total);
            self.next = done + PROGRESS_STEP_BYTES;
        }
    }

    pub(super) fn segment_done(&mut self, file_len: u64) {
        self.base += file_len;
        self.at(0);
    }

    pub(super) fn finished(&mut self) {
        self.base = self.total;
        self.next = 0;
        self.at(0);
    }
}

/// One sealed segment as read in pass 1.
#[derive(Clone, Debug)]
pub(super) struct SealedSegment {
    pub(super) files: SegmentFiles,
    pub(super) generation: u64,
    pub(super) file_len: u64,
}

/// Pass 1 result: the key map and the counts it implies.
pub(super) struct KeyIndex {
    pub(super) digester: Digester,
    pub(super) map: KeyTable,
    /// Keyed records digested and prefetched, waiting to be entered.
    pub(super) batch: Vec<(KeyDigest, u64)>,
    pub(super) records: u64,
    pub(super) superseded: u64,
    pub(super) superseded_tombstones: u64,
    /// Keys whose newest record is an expired tombstone.
    pub(super) expired_newest: u64,
    /// The last record read: its offset, and whether it is an expired tombstone.
    pub(super) last: Option<(u64, bool)>,
}

impl KeyIndex {
    /// Records pass 2 drops. The last record of the replaced range is always kept
    /// (it is the newest of its key, so only its expiry could drop it).
    pub(super) fn dropped(&self) -> u64 {
        let last_expired = self.last.is_some_and(|(_, expired)| expired);
        self.superseded + self.expired_newest - u64::from(last_expired)
    }

    pub(super) fn observe(&mut self, opts: &CompactionOptions, record: &RecordView<'_>) {
        self.records += 1;
        let expired =
            record.key.is_some() && record.is_tombstone() && opts.is_expired(record.timestamp_ms);
        self.last = Some((record.offset, expired));
        let Some(key) = record.key else { return };
        let mut value = record.offset;
        if record.is_tombstone() {
            value |= TOMBSTONE_BIT;
            if expired {
                value |= EXPIRED_BIT;
            }
        }
        let d = self.digester.digest(key);
        self.map.prefetch(&d);
        self.batch.push((d, value));
        if self.batch.len() >= BATCH_RECORDS {
            self.enter_batch();
        }
    }

    /// Enters the waiting records into the map, in order.
    pub(super) fn enter_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        for &(d, value) in &batch {
            if value & EXPIRED_BIT != 0 {
                self.expired_newest += 1;
            }
            if let Some(old) = self.map.insert(d, value) {
                self.superseded += 1;
                if old & TOMBSTONE_BIT != 0 {
                    self.superseded_tombstones += 1;
                }
                if old & EXPIRED_BIT != 0 {
                    self.expired_newest -= 1;
                }
            }
        }
        batch.clear();
        self.batch = batch;
    }

    /// Pass 2's decision, which pass 1's counts predict. The last record of the
    /// replaced range stays whatever it is, so the output ends where the range ended
    /// and the segments still tile (docs/FORMAT.md, Compaction).
    pub(super) fn keeps(&self, digest: Option<&KeyDigest>, offset: u64) -> bool {
        if self.last.is_some_and(|(last, _)| last == offset) {
            return true;
        }
        let Some(d) = digest else { return true };
        match self.map.get(d) {
            Some(v) => v & COMPACT_OFFSET_MAX == offset && v & EXPIRED_BIT == 0,
            None => false,
        }
    }
}

pub(super) fn unreadable(path: &Path, end: &ScanEnd, offset: Option<u64>) -> CompactionError {
    CompactionError::Unreadable {
        path: path.to_path_buf(),
        position: end.position(),
        offset,
        detail: end.detail(),
    }
}

pub(super) fn open_sealed(
    files: &SegmentFiles,
) -> Result<(File, SegmentHeader, u64), CompactionError> {
    let (file, file_len) = open_log(&files.log).map_err(io_at(&files.log))?;
    let header = read_header(&file, file_len).map_err(io_at(&files.log))?;
    match header {
        Ok(h) if h.base_offset == files.base_offset => Ok((file, h, file_len)),
        Ok(h) => Err(CompactionError::Unreadable {
            path: files.log.clone(),
            position: Some(8),
            offset: None,
            detail: format!(
                "header base_offset {} does not match the file name's {}",
                h.base_offset, files.base_offset
            ),
        }),
        Err(e) => Err(CompactionError::Unreadable {
            path: files.log.clone(),
            position: Some(e.position()),
            offset: None,
            detail: e.to_string(),
        }),
    }
}

/// Pass 1: every sealed segment in full, remembering each key's newest offset.
pub(super) fn pass_one(
    sealed: &[SealedSegment],
    opts: &CompactionOptions,
    progress: &mut Progress<'_>,
) -> Result<KeyIndex, CompactionError> {
    let mut keys = KeyIndex {
        digester: Digester::new(),
        map: KeyTable::new(),
        batch: Vec::with_capacity(BATCH_RECORDS),
        records: 0,
        superseded: 0,
        superseded_tombstones: 0,
        expired_newest: 0,
        last: None,
    };
    let mut prev_last: Option<u64> = None;
    for seg in sealed {
        let (file, header, file_len) = open_sealed(&seg.files)?;
        let mut too_large: Option<u64> = None;
        let scan = scan_segment(&file, &header, file_len, |position, record| {
            progress.at(position);
            if record.offset > COMPACT_OFFSET_MAX {
                too_large.get_or_insert(record.offset);
            } else if too_large.is_none() {
                keys.observe(opts, record);
            }
        })
        .map_err(io_at(&seg.files.log))?;
        if let Some(offset) = too_large {
            return Err(CompactionError::OffsetTooLarge {
                path: seg.files.log.clone(),
                offset,
            });
        }
        if scan.end != ScanEnd::Eof {
            return Err(unreadable(
                &seg.files.log,
                &scan.end,
                scan.last_offset.map(|o| o + 1),
            ));
        }
        if let (Some(prev), Some(first)) = (prev_last, scan.first_offset) {
            if first <= prev {
                return Err(CompactionError::Unreadable {
                    path: seg.files.log.clone(),
                    position: Some(HEADER_LEN as u64),
                    offset: Some(first),
                    detail: format!(
                        "first offset {first} is not above offset {prev} that the segment before ends with"
                    ),
                });
            }
        }
        if scan.last_offset.is_some() {
            prev_last = scan.last_offset;
        }
        debug_assert_eq!(seg.generation, header.generation);
        progress.segment_done(file_len);
    }
    keys.enter_batch();
    Ok(keys)
}

/// A new segment being written as `<name>.log.tmp`.
pub(super) struct OpenOutput {
    pub(super) name: u64,
    pub(super) log: Option<Box<dyn StorageFile>>,
    /// Bytes of the segment so far (header included).
    pub(super) len: u64,
    pub(super) pending: Vec<u8>,
    /// Position of `pending[0]`.
    pub(super) pending_at: u64,
    pub(super) index: Vec<IndexEntry>,
    pub(super) builder: IndexBuilder,
    pub(super) records: u64,
    pub(super) last_offset: u64,
}

/// Pass 2's output: a sequence of new segments, or (dry run) only their sizes.
pub(super) struct OutputWriter<'a> {
    pub(super) storage: Option<&'a dyn Storage>,
    pub(super) dir: &'a Path,
    pub(super) segment_bytes: u64,
    /// Bases of the replaced segments, ascending.
    pub(super) replaced: &'a [u64],
    pub(super) current: Option<OpenOutput>,
    pub(super) prev_last: Option<u64>,
    /// Finished segments: (name, log bytes).
    pub(super) done: Vec<(u64, u64)>,
    /// Every temporary file created, for cleanup.
    pub(super) temp_files: Vec<PathBuf>,
}

pub(super) fn tmp_path(dir: &Path, file_name: &str) -> PathBuf {
    dir.join(tmp_file_name(file_name))
}

impl OutputWriter<'_> {
    /// Name of an output segment whose first record has `first_offset` (module doc):
    /// the first output takes the first replaced segment's base, every later one the
    /// previous output's last offset + 1, so the outputs tile.
    pub(super) fn name_for(&self, first_offset: u64) -> u64 {
        match self.prev_last {
            Some(prev_last) => prev_last + 1,
            None => self
                .replaced
                .first()
                .copied()
                .unwrap_or(first_offset)
                .min(first_offset),
        }
    }

    /// Appends one surviving record: `encoded` is its generation-0 encoding (empty
    /// in a dry run), `len` its size on disk.
    pub(super) fn add(
        &mut self,
        offset: u64,
        encoded: &[u8],
        len: u64,
    ) -> Result<(), CompactionError> {
        let full = self
            .current
            .as_ref()
            .is_some_and(|c| c.records > 0 && c.len + len > self.segment_bytes);
        if full {
            self.finish_current()?;
        }
        if self.current.is_none() {
            self.start(offset)?;
        }
        let Some(cur) = self.current.as_mut() else {
            unreachable!("an output segment was just started")
        };
        if let Some(e) = cur.builder.observe(cur.name, offset, cur.len) {
            cur.index.push(e);
        }
        cur.len += len;
        cur.records += 1;
        cur.last_offset = offset;
        if cur.log.is_some() {
            cur.pending.extend_from_slice(encoded);
            if cur.pending.len() >= WRITE_CHUNK_BYTES {
                flush(cur, self.dir)?;
            }
        }
        Ok(())
    }

    pub(super) fn start(&mut self, first_offset: u64) -> Result<(), CompactionError> {
        let name = self.name_for(first_offset);
        let mut out = OpenOutput {
            name,
            log: None,
            len: HEADER_LEN as u64,
            pending: Vec::new(),
            pending_at: 0,
            index: Vec::new(),
            builder: IndexBuilder::new(),
            records: 0,
            last_offset: first_offset,
        };
        if let Some(storage) = self.storage {
            let path = tmp_path(self.dir, &log_file_name(name));
            let file = storage.create(&path).map_err(io_at(&path))?;
            self.temp_files.push(path);
            out.log = Some(file);
            out.pending
                .extend_from_slice(&SegmentHeader::new(name).encode());
            out.pending.reserve(WRITE_CHUNK_BYTES);
        }
        self.current = Some(out);
        Ok(())
    }

    /// Step 1 for one segment: the rest of its log and its index to the temporary
    /// files, both fsynced.
    pub(super) fn finish_current(&mut self) -> Result<(), CompactionError> {
        let Some(mut cur) = self.current.take() else {
            return Ok(());
        };
        self.prev_last = Some(cur.last_offset);
        if let Some(storage) = self.storage {
            let log_path = tmp_path(self.dir, &log_file_name(cur.name));
            flush(&mut cur, self.dir)?;
            if let Some(log) = &cur.log {
                log.sync_all().map_err(io_at(&log_path))?;
            }
            let index_path = tmp_path(self.dir, &index_file_name(cur.name));
            let index = storage.create(&index_path).map_err(io_at(&index_path))?;
            self.temp_files.push(index_path.clone());
            if !cur.index.is_empty() {
                index
                    .write_at(&encode_index(&cur.index), 0)
                    .map_err(io_at(&index_path))?;
            }
            index.sync_all().map_err(io_at(&index_path))?;
        }
        self.done.push((cur.name, cur.len));
        Ok(())
    }
}

pub(super) fn flush(cur: &mut OpenOutput, dir: &Path) -> Result<(), CompactionError> {
    if cur.pending.is_empty() {
        return Ok(());
    }
    if let Some(log) = &cur.log {
        log.write_at(&cur.pending, cur.pending_at)
            .map_err(|e| CompactionError::Io {
                path: tmp_path(dir, &log_file_name(cur.name)),
                source: e,
            })?;
    }
    cur.pending_at += cur.pending.len() as u64;
    cur.pending.clear();
    Ok(())
}

/// A record of pass 2 waiting in a batch while its key's slot is prefetched.
pub(super) struct Pending {
    pub(super) digest: Option<KeyDigest>,
    pub(super) offset: u64,
    pub(super) tombstone: bool,
    /// Size on disk.
    pub(super) len: u64,
    /// Its generation-0 encoding in the batch buffer (empty range in a dry run).
    pub(super) at: std::ops::Range<usize>,
}

/// Pass 2's batch: records read and prefetched, decided together.
pub(super) struct Batch {
    pub(super) pending: Vec<Pending>,
    pub(super) bytes: Vec<u8>,
    pub(super) encode: bool,
}

impl Batch {
    pub(super) fn push(
        &mut self,
        keys: &KeyIndex,
        source: &Path,
        record: &RecordView<'_>,
    ) -> Result<(), CompactionError> {
        let digest = record.key.map(|k| keys.digester.digest(k));
        if let Some(d) = &digest {
            keys.map.prefetch(d);
        }
        let start = self.bytes.len();
        if self.encode {
            encode_record(
                &mut self.bytes,
                record.offset,
                record.timestamp_ms,
                record.key,
                record.value,
                0,
            )
            .map_err(|e| CompactionError::Unreadable {
                path: source.to_path_buf(),
                position: None,
                offset: Some(record.offset),
                detail: e.to_string(),
            })?;
        }
        self.pending.push(Pending {
            digest,
            offset: record.offset,
            tombstone: record.is_tombstone(),
            len: record.encoded_len as u64,
            at: start..self.bytes.len(),
        });
        Ok(())
    }

    /// Decides every waiting record, in order, and hands the survivors to the writer.
    pub(super) fn drain(
        &mut self,
        keys: &KeyIndex,
        writer: &mut OutputWriter<'_>,
        report: &mut CompactionReport,
    ) -> Result<(), CompactionError> {
        for p in &self.pending {
            if keys.keeps(p.digest.as_ref(), p.offset) {
                report.records_kept += 1;
                let encoded = self.bytes.get(p.at.clone()).unwrap_or(&[]);
                writer.add(p.offset, encoded, p.len)?;
            } else if p.tombstone {
                report.tombstones_dropped += 1;
            }
        }
        self.pending.clear();
        self.bytes.clear();
        Ok(())
    }
}

/// Pass 2: copies the survivors into new segments (or only counts them).
pub(super) fn pass_two(
    sealed: &[SealedSegment],
    keys: &KeyIndex,
    writer: &mut OutputWriter<'_>,
    report: &mut CompactionReport,
    progress: &mut Progress<'_>,
) -> Result<(), CompactionError> {
    let mut read = 0u64;
    let mut batch = Batch {
        pending: Vec::with_capacity(BATCH_RECORDS),
        bytes: Vec::new(),
        encode: writer.storage.is_some(),
    };
    for seg in sealed {
        let (file, header, file_len) = open_sealed(&seg.files)?;
        let mut reader = RecordReader::new(&file, header.generation, HEADER_LEN as u64, file_len);
        let mut prev: Option<u64> = None;
        loop {
            match reader.next_record().map_err(io_at(&seg.files.log))? {
                Next::Record { position, record } => {
                    if prev.is_some_and(|p| record.offset <= p) {
                        let end = ScanEnd::OffsetOrder {
                            position,
                            offset: record.offset,
                            previous: prev,
                            base_offset: header.base_offset,
                        };
                        return Err(unreadable(&seg.files.log, &end, Some(record.offset)));
                    }
                    prev = Some(record.offset);
                    read += 1;
                    progress.at(position);
                    batch.push(keys, &seg.files.log, &record)?;
                    if batch.pending.len() >= BATCH_RECORDS {
                        batch.drain(keys, writer, report)?;
                    }
                }
                Next::End(None) => break,
                Next::End(Some(e)) => {
                    return Err(unreadable(
                        &seg.files.log,
                        &ScanEnd::Record(e),
                        prev.map(|o| o + 1),
                    ))
                }
            }
        }
        progress.segment_done(file_len);
    }
    batch.drain(keys, writer, report)?;
    writer.finish_current()?;
    let expected_kept = keys.records - keys.dropped();
    if read != keys.records || report.records_kept != expected_kept {
        let dir = writer.dir.to_path_buf();
        return Err(CompactionError::Unreadable {
            path: dir,
            position: None,
            offset: None,
            detail: format!(
                "the sealed segments changed between the two passes ({} then {read} records, {expected_kept} then {} kept)",
                keys.records, report.records_kept
            ),
        });
    }
    Ok(())
}
