//! Log compaction (FORMAT.md, Compaction): the one implementation shared by
//! `seglog compact` and the broker's background task.
//!
//! What survives, among the records of the *sealed* segments (every segment but the
//! newest; records in the active segment are neither compacted nor read):
//! - every record without a key, at its original offset;
//! - for each key, its newest record, unless that record is a tombstone (keyed, empty
//!   value) whose timestamp is more than `tombstone_retention_ms` before `now_ms`.
//!   A tombstone deletes every older record of its key; an expired one goes itself.
//!
//! Two streaming passes. Pass 1 reads every sealed segment and remembers, per key,
//! only the newest offset, in a map keyed by a 16-byte digest of the key (two SipHash
//! values under two random keys), so memory grows with the number of keys, never with
//! the data. Pass 2 reads again and copies the survivors into new segment files. A
//! pass 1 that finds nothing to drop ends the work (`skipped`). Any scan end other
//! than a clean end of file in a sealed segment aborts with an error and changes
//! nothing.
//!
//! Memory: 24 bytes per table slot (digest and offset), the table at most 3/4 full
//! and doubled when it would be fuller, so 32 to 64 bytes per distinct key, up to 96
//! while it doubles (about 75 MiB peak for a million keys), plus a few MiB of buffers.
//!
//! The digest keeps 127 bits (one is forced to mark used slots). Two distinct keys
//! share one with probability about n²/2¹²⁸ (n keys): for a billion keys, below
//! 10⁻²⁰. The SipHash keys are random per run, so nobody can choose keys that collide.
//!
//! Output segments hold at most `segment_bytes` each (a single larger record gets a
//! segment of its own). Naming: the first output segment takes the base offset of the
//! first replaced segment, so the partition's start offset does not move; every later
//! one takes the base of the replaced segment its first record comes from, raised to
//! one past the previous output's last offset when that is higher. So names strictly
//! increase, each name is at most its segment's first offset and above the previous
//! segment's last offset, and every name is below the active segment's base: a name
//! can only ever equal a replaced segment's, never one that stays.
//!
//! Swap protocol (FORMAT.md): the numbered steps are in [`PreparedCompaction`] and
//! [`compact_partition`]; every mutation goes through the [`Storage`] seam.

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::BuildHasher;
use std::io;
use std::path::{Path, PathBuf};

use crate::format::marker::CompactionMarker;
use crate::format::names::{index_file_name, log_file_name, COMPACTION_MARKER, TMP_SUFFIX};
use crate::format::record::RecordView;
use crate::format::topic::TopicConfig;
use crate::format::{encode_record, IndexBuilder, SegmentHeader, HEADER_LEN};

use super::io::{write_file_atomic, Storage, StorageFile};
use super::layout::{list_partition, PartitionRef, SegmentFiles};
use super::segment::{open_log, read_header, scan_segment, Next, RecordReader, ScanEnd};

/// Pending output bytes written per call.
const WRITE_CHUNK_BYTES: usize = 1024 * 1024;

/// Map values keep the offset in the low bits and two flags in the top bits.
const TOMBSTONE_BIT: u64 = 1 << 63;
const EXPIRED_BIT: u64 = 1 << 62;
/// Largest offset the key map can hold.
pub const COMPACT_OFFSET_MAX: u64 = EXPIRED_BIT - 1;

/// What a compaction run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionOptions {
    /// The clock for tombstone expiry, in milliseconds since the Unix epoch.
    pub now_ms: i64,
    /// A tombstone older than this (by its timestamp against `now_ms`) is dropped.
    pub tombstone_retention_ms: i64,
    /// Largest output segment file, header included.
    pub segment_bytes: u64,
    /// Run both passes to count, write nothing.
    pub dry_run: bool,
}

impl CompactionOptions {
    /// The options a topic's configuration gives.
    pub fn for_topic(config: &TopicConfig, now_ms: i64) -> Self {
        CompactionOptions {
            now_ms,
            tombstone_retention_ms: config.tombstone_retention_ms,
            segment_bytes: config.segment_bytes,
            dry_run: false,
        }
    }

    fn is_expired(&self, timestamp_ms: i64) -> bool {
        self.now_ms.saturating_sub(timestamp_ms) > self.tombstone_retention_ms
    }
}

/// What a compaction of one partition read, kept and dropped. Counts cover the sealed
/// segments only; bytes are `.log` file sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactionReport {
    pub records_read: u64,
    pub records_kept: u64,
    pub records_dropped: u64,
    /// Tombstones among the dropped records (superseded or expired).
    pub tombstones_dropped: u64,
    /// Distinct keys seen.
    pub keys: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub segments_before: u64,
    pub segments_after: u64,
    /// Nothing would be dropped (or nothing is sealed): no pass 2, nothing written.
    pub skipped: bool,
    /// Counted only; nothing written.
    pub dry_run: bool,
    /// Base offsets of the segments read (replaced by a swap).
    pub replaced: Vec<u64>,
    /// Base offsets of the segments written.
    pub new: Vec<u64>,
}

/// Why a compaction did not happen. Every variant but `Interrupted` leaves the
/// partition exactly as it was (temporary files removed as far as the storage let us).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompactionError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// A sealed segment holds something other than valid records up to its end.
    #[error("{path}: {detail}; compaction aborted, nothing changed")]
    Unreadable {
        path: PathBuf,
        position: Option<u64>,
        offset: Option<u64>,
        detail: String,
    },
    /// A marker or temporary files are present: recovery must run first.
    #[error("{dir}: {detail}; run seglog recover first (compaction never runs on an unrecovered partition)")]
    NeedsRecovery { dir: PathBuf, detail: String },
    /// Step 2 found other sealed segments than the ones read; the swap was cancelled.
    #[error(
        "{dir}: the sealed segments changed while compacting; swap cancelled, nothing changed"
    )]
    SegmentsChanged { dir: PathBuf },
    #[error("{path}: record offset {offset} is above {COMPACT_OFFSET_MAX}, the largest compaction handles")]
    OffsetTooLarge { path: PathBuf, offset: u64 },
    /// Failed after `compaction.marker` was written: the next recovery finishes the swap.
    #[error("{dir}: compaction swap interrupted after its marker was written ({source}); recovery finishes it")]
    Interrupted { dir: PathBuf, source: io::Error },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> CompactionError + '_ {
    move |source| CompactionError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A 128-bit digest of a key: two SipHash-1-3 values under different random keys.
/// The low bit of the second word is forced to 1 so an all-zero slot means empty
/// (127 bits of digest remain).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KeyDigest([u64; 2]);

struct Digester {
    a: RandomState,
    b: RandomState,
}

impl Digester {
    fn new() -> Self {
        // Each RandomState gets its own SipHash key.
        Digester {
            a: RandomState::new(),
            b: RandomState::new(),
        }
    }
    fn digest(&self, key: &[u8]) -> KeyDigest {
        KeyDigest([self.a.hash_one(key), self.b.hash_one(key) | 1])
    }
}

/// One slot of the key table: 24 bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    digest: [u64; 2],
    value: u64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 24);

/// Open addressing with linear probing over `Slot`s, at most 3/4 full: the key map of
/// pass 1. A table of our own (rather than `HashMap`) keeps a slot in one array, so
/// the batched passes can prefetch it before they need it: at a million keys and
/// more, nearly every lookup is a cache miss, and overlapping them is most of the
/// speed.
struct KeyTable {
    slots: Vec<Slot>,
    len: usize,
}

impl KeyTable {
    const INITIAL_SLOTS: usize = 1024;

    fn new() -> Self {
        KeyTable {
            slots: vec![Slot::default(); Self::INITIAL_SLOTS],
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn home(&self, d: &KeyDigest) -> usize {
        // The length is a power of two.
        (d.0[0] as usize) & (self.slots.len() - 1)
    }

    /// Asks the CPU to start loading the slot `d` starts probing at.
    #[inline]
    fn prefetch(&self, d: &KeyDigest) {
        #[cfg(target_arch = "x86_64")]
        if let Some(slot) = self.slots.get(self.home(d)) {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = (slot as *const Slot).cast::<i8>();
            // SAFETY: a prefetch is a hint: it never faults and changes nothing
            // observable; `p` and `p + 23` lie inside the slot.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(std::mem::size_of::<Slot>() - 1));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = d;
    }

    fn find(&self, d: &KeyDigest) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(d);
        loop {
            match self.slots.get(i) {
                Some(s) if s.digest == d.0 || s.digest[1] == 0 => return i,
                Some(_) => i = (i + 1) & mask,
                None => unreachable!("slot index is masked to the table"),
            }
        }
    }

    fn get(&self, d: &KeyDigest) -> Option<u64> {
        let s = self.slots.get(self.find(d))?;
        (s.digest[1] != 0).then_some(s.value)
    }

    /// Sets `d`'s value; returns the previous one.
    fn insert(&mut self, d: KeyDigest, value: u64) -> Option<u64> {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let i = self.find(&d);
        let slot = self.slots.get_mut(i)?;
        if slot.digest[1] == 0 {
            *slot = Slot { digest: d.0, value };
            self.len += 1;
            None
        } else {
            Some(std::mem::replace(&mut slot.value, value))
        }
    }

    fn grow(&mut self) {
        let doubled = vec![Slot::default(); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        for s in old.into_iter().filter(|s| s.digest[1] != 0) {
            let i = self.find(&KeyDigest(s.digest));
            if let Some(slot) = self.slots.get_mut(i) {
                *slot = s;
            }
        }
    }
}

/// Records handled per batch: each batch prefetches its slots first, then uses them.
const BATCH_RECORDS: usize = 32;

/// Bytes read between two progress reports.
const PROGRESS_STEP_BYTES: u64 = 16 * 1024 * 1024;

/// Reports bytes read so far over both passes, out of twice the sealed bytes.
struct Progress<'a> {
    report: &'a dyn Fn(u64, u64),
    total: u64,
    /// Bytes of the segments (and pass) already finished.
    base: u64,
    next: u64,
}

impl Progress<'_> {
    fn at(&mut self, position_in_segment: u64) {
        let done = self.base + position_in_segment;
        if done >= self.next {
            (self.report)(done.min(self.total), self.total);
            self.next = done + PROGRESS_STEP_BYTES;
        }
    }

    fn segment_done(&mut self, file_len: u64) {
        self.base += file_len;
        self.at(0);
    }

    fn finished(&mut self) {
        self.base = self.total;
        self.next = 0;
        self.at(0);
    }
}

/// One sealed segment as read in pass 1.
#[derive(Clone, Debug)]
struct SealedSegment {
    files: SegmentFiles,
    generation: u64,
    file_len: u64,
}

/// Pass 1 result: the key map and the counts it implies.
struct KeyIndex {
    digester: Digester,
    map: KeyTable,
    /// Keyed records digested and prefetched, waiting to be entered.
    batch: Vec<(KeyDigest, u64)>,
    records: u64,
    superseded: u64,
    superseded_tombstones: u64,
    /// Keys whose newest record is an expired tombstone.
    expired_newest: u64,
}

impl KeyIndex {
    fn dropped(&self) -> u64 {
        self.superseded + self.expired_newest
    }

    fn observe(&mut self, opts: &CompactionOptions, record: &RecordView<'_>) {
        self.records += 1;
        let Some(key) = record.key else { return };
        let mut value = record.offset;
        if record.is_tombstone() {
            value |= TOMBSTONE_BIT;
            if opts.is_expired(record.timestamp_ms) {
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
    fn enter_batch(&mut self) {
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

    /// Pass 2's decision, which pass 1's counts predict.
    fn keeps(&self, digest: Option<&KeyDigest>, offset: u64) -> bool {
        let Some(d) = digest else { return true };
        match self.map.get(d) {
            Some(v) => v & COMPACT_OFFSET_MAX == offset && v & EXPIRED_BIT == 0,
            None => false,
        }
    }
}

fn unreadable(path: &Path, end: &ScanEnd, offset: Option<u64>) -> CompactionError {
    CompactionError::Unreadable {
        path: path.to_path_buf(),
        position: end.position(),
        offset,
        detail: end.detail(),
    }
}

fn open_sealed(files: &SegmentFiles) -> Result<(File, SegmentHeader, u64), CompactionError> {
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
fn pass_one(
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
struct OpenOutput {
    name: u64,
    log: Option<Box<dyn StorageFile>>,
    /// Bytes of the segment so far (header included).
    len: u64,
    pending: Vec<u8>,
    /// Position of `pending[0]`.
    pending_at: u64,
    index: Vec<u8>,
    builder: IndexBuilder,
    records: u64,
    last_offset: u64,
}

/// Pass 2's output: a sequence of new segments, or (dry run) only their sizes.
struct OutputWriter<'a> {
    storage: Option<&'a dyn Storage>,
    dir: &'a Path,
    segment_bytes: u64,
    /// Bases of the replaced segments, ascending.
    replaced: &'a [u64],
    current: Option<OpenOutput>,
    prev_last: Option<u64>,
    /// Finished segments: (name, log bytes).
    done: Vec<(u64, u64)>,
    /// Every temporary file created, for cleanup.
    temp_files: Vec<PathBuf>,
}

fn tmp_path(dir: &Path, file_name: &str) -> PathBuf {
    dir.join(format!("{file_name}{TMP_SUFFIX}"))
}

impl OutputWriter<'_> {
    /// Name of an output segment whose first record has `first_offset` (module doc).
    fn name_for(&self, first_offset: u64) -> u64 {
        let first_replaced = self.replaced.first().copied().unwrap_or(first_offset);
        let Some(prev_last) = self.prev_last else {
            return first_replaced.min(first_offset);
        };
        let idx = self.replaced.partition_point(|&b| b <= first_offset);
        let within = idx
            .checked_sub(1)
            .and_then(|i| self.replaced.get(i))
            .copied()
            .unwrap_or(first_offset);
        within.max(prev_last + 1)
    }

    /// Appends one surviving record: `encoded` is its generation-0 encoding (empty
    /// in a dry run), `len` its size on disk.
    fn add(&mut self, offset: u64, encoded: &[u8], len: u64) -> Result<(), CompactionError> {
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
            e.encode_into(&mut cur.index);
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

    fn start(&mut self, first_offset: u64) -> Result<(), CompactionError> {
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
    fn finish_current(&mut self) -> Result<(), CompactionError> {
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
                index.write_at(&cur.index, 0).map_err(io_at(&index_path))?;
            }
            index.sync_all().map_err(io_at(&index_path))?;
        }
        self.done.push((cur.name, cur.len));
        Ok(())
    }
}

fn flush(cur: &mut OpenOutput, dir: &Path) -> Result<(), CompactionError> {
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
struct Pending {
    digest: Option<KeyDigest>,
    offset: u64,
    tombstone: bool,
    /// Size on disk.
    len: u64,
    /// Its generation-0 encoding in the batch buffer (empty range in a dry run).
    at: std::ops::Range<usize>,
}

/// Pass 2's batch: records read and prefetched, decided together.
struct Batch {
    pending: Vec<Pending>,
    bytes: Vec<u8>,
    encode: bool,
}

impl Batch {
    fn push(
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
    fn drain(
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
fn pass_two(
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

/// The result of both passes and step 1: new segments durable in their temporary
/// files, waiting for the swap. Dropping it without [`PreparedCompaction::swap`]
/// removes the temporary files.
#[derive(Debug)]
pub struct PreparedCompaction<'a> {
    storage: &'a dyn Storage,
    dir: PathBuf,
    report: CompactionReport,
    temp_files: Vec<PathBuf>,
}

impl<'a> PreparedCompaction<'a> {
    /// The counts, as they will be once swapped.
    pub fn report(&self) -> &CompactionReport {
        &self.report
    }

    /// Base offsets of the sealed segments that were read, ascending: step 2 checks
    /// the partition's sealed segments are still exactly these.
    pub fn replaced(&self) -> &[u64] {
        &self.report.replaced
    }

    /// True when there is something to swap (not skipped, not a dry run).
    pub fn needs_swap(&self) -> bool {
        !self.report.skipped && !self.report.dry_run
    }

    /// The report, with nothing swapped (for skipped and dry runs); removes any
    /// temporary files.
    pub fn into_report(mut self) -> CompactionReport {
        self.remove_temp_files();
        std::mem::take(&mut self.report)
    }

    /// Cancels the swap: removes the temporary files.
    pub fn cancel(mut self) -> io::Result<()> {
        self.remove_temp_files_checked()
    }

    fn remove_temp_files(&mut self) {
        let _ = self.remove_temp_files_checked();
    }

    fn remove_temp_files_checked(&mut self) -> io::Result<()> {
        let mut first_err = None;
        for path in std::mem::take(&mut self.temp_files) {
            match self.storage.remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Steps 3 and 4 of the swap. The caller has done step 2 (checked, under the
    /// partition's write lock, that the sealed segments are still
    /// [`PreparedCompaction::replaced`]) and holds that lock until this returns.
    /// `publish` gets the new segments' base offsets once they are in place.
    pub fn swap(
        mut self,
        publish: &mut dyn FnMut(&[u64]),
    ) -> Result<CompactionReport, CompactionError> {
        assert!(self.needs_swap(), "swap of a skipped or dry compaction");
        let storage = self.storage;
        let dir = self.dir.clone();
        let marker = CompactionMarker {
            new: self.report.new.clone(),
            replaced: self.report.replaced.clone(),
        };
        // 3. Write compaction.marker, fsync it and the directory (temporary file,
        //    fsync, rename, directory fsync: the marker is whole or absent). From
        //    here a crash is finished at the next start.
        let marker_path = dir.join(COMPACTION_MARKER);
        if let Err(e) = write_file_atomic(storage, &dir, COMPACTION_MARKER, &marker.encode()) {
            if marker_path.exists() {
                // The marker is in place (perhaps not durable): the temporary files
                // must stay for the recovery that finishes it.
                self.temp_files.clear();
                return Err(CompactionError::Interrupted { dir, source: e });
            }
            self.remove_temp_files();
            return Err(CompactionError::Io {
                path: marker_path,
                source: e,
            });
        }
        // From here on the temporary files belong to the marker.
        self.temp_files.clear();
        // 4. Rename the results into place (a new segment may take a replaced one's
        //    name), delete the replaced segments whose names are not new, fsync the
        //    directory, delete the marker, fsync the directory: the one function that
        //    recovery also uses. Then publish the new segment list.
        //    The list is published after the marker is gone rather than just before:
        //    publishing is in memory, so the order cannot be seen on disk, and this
        //    way the swap and its recovery share a single finishing function.
        finish_compaction_marker(storage, &dir, &marker)
            .map_err(|source| CompactionError::Interrupted { dir, source })?;
        publish(&self.report.new);
        Ok(std::mem::take(&mut self.report))
    }
}

impl Drop for PreparedCompaction<'_> {
    fn drop(&mut self) {
        self.remove_temp_files();
    }
}

/// Both passes and step 1 of the swap: reads the sealed segments, and unless nothing
/// would be dropped or this is a dry run, writes the new segments to temporary files
/// and fsyncs them. Refuses a partition with a compaction marker or temporary files
/// (recovery must run first).
pub fn prepare_compaction<'a>(
    storage: &'a dyn Storage,
    p: &PartitionRef,
    opts: &CompactionOptions,
) -> Result<PreparedCompaction<'a>, CompactionError> {
    prepare_compaction_with_progress(storage, p, opts, &|_, _| {})
}

/// [`prepare_compaction`], calling `progress(bytes_read, bytes_total)` every few MiB
/// (both passes count: the total is twice the sealed segments' bytes).
pub fn prepare_compaction_with_progress<'a>(
    storage: &'a dyn Storage,
    p: &PartitionRef,
    opts: &CompactionOptions,
    progress: &dyn Fn(u64, u64),
) -> Result<PreparedCompaction<'a>, CompactionError> {
    let dir = p.dir.clone();
    let listing = list_partition(&dir).map_err(io_at(&dir))?;
    if listing.marker.is_some() || !listing.temp_files.is_empty() {
        let detail = if listing.marker.is_some() {
            "an unfinished compaction (compaction.marker) is present".to_string()
        } else {
            format!(
                "{} leftover temporary file(s) are present",
                listing.temp_files.len()
            )
        };
        return Err(CompactionError::NeedsRecovery { dir, detail });
    }
    let sealed_files = listing
        .segments
        .split_last()
        .map_or(&[][..], |(_, sealed)| sealed);
    let mut sealed = Vec::with_capacity(sealed_files.len());
    for files in sealed_files {
        let (_, header, file_len) = open_sealed(files)?;
        sealed.push(SealedSegment {
            files: files.clone(),
            generation: header.generation,
            file_len,
        });
    }
    let mut report = CompactionReport {
        dry_run: opts.dry_run,
        bytes_before: sealed.iter().map(|s| s.file_len).sum(),
        segments_before: sealed.len() as u64,
        replaced: sealed.iter().map(|s| s.files.base_offset).collect(),
        ..CompactionReport::default()
    };
    let mut prepared = PreparedCompaction {
        storage,
        dir: dir.clone(),
        report: CompactionReport::default(),
        temp_files: Vec::new(),
    };
    let mut progress = Progress {
        report: progress,
        total: 2 * report.bytes_before,
        base: 0,
        next: 0,
    };
    // Pass 1.
    let keys = pass_one(&sealed, opts, &mut progress)?;
    report.records_read = keys.records;
    report.keys = keys.map.len() as u64;
    if keys.dropped() == 0 {
        report.skipped = true;
        report.records_kept = keys.records;
        report.bytes_after = report.bytes_before;
        report.segments_after = report.segments_before;
        report.new = report.replaced.clone();
        prepared.report = report;
        progress.finished();
        return Ok(prepared);
    }
    // Pass 2, and step 1: write results to `<name>.log.tmp` and `<name>.index.tmp`,
    // fsync each (in `finish_current`) ...
    let replaced = report.replaced.clone();
    let mut writer = OutputWriter {
        storage: (!opts.dry_run).then_some(storage),
        dir: &dir,
        segment_bytes: opts.segment_bytes.max(HEADER_LEN as u64 + 1),
        replaced: &replaced,
        current: None,
        prev_last: None,
        done: Vec::new(),
        temp_files: Vec::new(),
    };
    let result = pass_two(&sealed, &keys, &mut writer, &mut report, &mut progress);
    prepared.temp_files = std::mem::take(&mut writer.temp_files);
    result?;
    drop(keys);
    report.records_dropped = report.records_read - report.records_kept;
    report.new = writer.done.iter().map(|&(name, _)| name).collect();
    report.bytes_after = writer.done.iter().map(|&(_, len)| len).sum();
    report.segments_after = writer.done.len() as u64;
    // ... and fsync the directory, so their names are durable before the marker.
    if !opts.dry_run {
        storage.sync_dir(&dir).map_err(io_at(&dir))?;
    }
    prepared.report = report;
    progress.finished();
    Ok(prepared)
}

/// Compacts one partition: both passes, then the swap protocol of FORMAT.md.
///
/// `still_sealed` is step 2: given the base offsets read, it answers (under the
/// partition's write lock, for a broker) whether the partition's sealed segments are
/// still exactly those; `false` cancels the swap. `publish` receives the new
/// segments' base offsets once they are in place. A skipped or dry run calls neither.
pub fn compact_partition(
    storage: &dyn Storage,
    p: &PartitionRef,
    opts: &CompactionOptions,
    still_sealed: &dyn Fn(&[u64]) -> bool,
    publish: &mut dyn FnMut(&[u64]),
) -> Result<CompactionReport, CompactionError> {
    compact_partition_with_progress(storage, p, opts, still_sealed, publish, &|_, _| {})
}

/// [`compact_partition`] with progress reports as [`prepare_compaction_with_progress`].
pub fn compact_partition_with_progress(
    storage: &dyn Storage,
    p: &PartitionRef,
    opts: &CompactionOptions,
    still_sealed: &dyn Fn(&[u64]) -> bool,
    publish: &mut dyn FnMut(&[u64]),
    progress: &dyn Fn(u64, u64),
) -> Result<CompactionReport, CompactionError> {
    let prepared = prepare_compaction_with_progress(storage, p, opts, progress)?;
    if !prepared.needs_swap() {
        return Ok(prepared.into_report());
    }
    // 2. The sealed segments must be exactly the ones read; anything else cancels
    //    the swap (the temporary files are deleted).
    if !still_sealed(prepared.replaced()) {
        let dir = p.dir.clone();
        prepared.cancel().map_err(io_at(&dir))?;
        return Err(CompactionError::SegmentsChanged { dir });
    }
    prepared.swap(publish)
}

/// The step-2 check of the offline tool (which holds `DATA/LOCK`): re-lists the
/// directory; true when there is no marker and the sealed segments (all but the
/// newest) are exactly `read`.
pub fn sealed_segments_unchanged(dir: &Path, read: &[u64]) -> bool {
    let Ok(listing) = list_partition(dir) else {
        return false;
    };
    let bases: Vec<u64> = listing.segments.iter().map(|s| s.base_offset).collect();
    listing.marker.is_none() && bases.split_last().is_some_and(|(_, sealed)| sealed == read)
}

/// Finishing a marker (swap step 4, and recovery step 1) is one function, owned by
/// recovery: rename what is still temporary, delete what is still replaced and not
/// new, fsync, delete the marker, fsync.
pub use super::recovery::{finish_compaction_marker, MarkerFinish};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn key_table_agrees_with_a_hash_map_through_growth_and_collisions() {
        let mut table = KeyTable::new();
        let mut model: HashMap<[u64; 2], u64> = HashMap::new();
        let mut x = 0x1234_5678_9abc_def0_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let digest = |next: &mut dyn FnMut() -> u64| {
            // One in four digests shares one of a few home slots: probe runs that
            // collide and wrap around.
            let d0 = if next() % 4 == 0 { next() % 16 } else { next() };
            KeyDigest([d0, (next() % 30_000) | 1])
        };
        for i in 0..40_000u64 {
            let d = digest(&mut next);
            assert_eq!(table.insert(d, i), model.insert(d.0, i), "insert {i}");
            if i % 7 == 0 {
                let q = digest(&mut next);
                assert_eq!(table.get(&q), model.get(&q.0).copied());
            }
        }
        assert_eq!(table.len(), model.len());
        for (d, v) in &model {
            assert_eq!(table.get(&KeyDigest(*d)), Some(*v));
        }
        assert!(table.slots.len() * 3 >= table.len() * 4);
    }

    #[test]
    fn digests_differ_per_key_and_never_look_empty() {
        let dg = Digester::new();
        let a = dg.digest(b"a");
        assert_eq!(a, dg.digest(b"a"));
        assert_ne!(a, dg.digest(b"b"));
        assert_ne!(dg.digest(b"").0[1], 0);
    }

    #[test]
    fn output_names_increase_and_stay_among_the_replaced_ranges() {
        let replaced = [0u64, 100, 200];
        let dir = Path::new("/nonexistent");
        let mut w = OutputWriter {
            storage: None,
            dir,
            segment_bytes: 1024,
            replaced: &replaced,
            current: None,
            prev_last: None,
            done: Vec::new(),
            temp_files: Vec::new(),
        };
        // The first output takes the first replaced base, even if its first record
        // comes from a later segment.
        assert_eq!(w.name_for(150), 0);
        w.prev_last = Some(120);
        assert_eq!(w.name_for(130), 121, "raised past the previous last offset");
        w.prev_last = Some(90);
        assert_eq!(w.name_for(130), 100, "the base of the segment it starts in");
        assert_eq!(w.name_for(250), 200);
        // Sizes: a record larger than segment_bytes gets a segment of its own.
        let mut w = OutputWriter {
            prev_last: None,
            ..w
        };
        w.add(5, &[], 2000).unwrap();
        w.add(6, &[], 100).unwrap();
        w.add(7, &[], 900).unwrap();
        w.add(150, &[], 100).unwrap();
        w.finish_current().unwrap();
        assert_eq!(w.done, vec![(0, 2032), (6, 132), (7, 932), (100, 132)]);
    }
}
