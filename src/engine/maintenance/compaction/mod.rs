//! Log compaction (docs/FORMAT.md, Compaction): the one implementation shared by
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
//! The last record of the sealed segments always survives (whatever its key, even an
//! expired tombstone), so the output ends where the replaced range ended and the
//! active segment's base still follows it.
//!
//! Output segments hold at most `segment_bytes` each (a single larger record gets a
//! segment of its own). Naming, so the outputs tile (docs/FORMAT.md, Segment states):
//! the first output segment takes the base offset of the first replaced segment, so the
//! partition's start offset does not move; every later one takes the previous output's
//! last offset + 1, so its first record may lie above its base. Names strictly increase,
//! each name is at most its segment's first offset, and every name is below the active
//! segment's base: a name can only ever equal a replaced segment's, never one that
//! stays.
//!
//! Swap protocol (docs/FORMAT.md): the numbered steps are in [`PreparedCompaction`] and
//! [`compact_partition`]; every mutation goes through the [`Storage`] seam.

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::BuildHasher;
use std::io;
use std::path::{Path, PathBuf};

use crate::format::marker::CompactionMarker;
use crate::format::names::{index_file_name, log_file_name, tmp_file_name, COMPACTION_MARKER};
use crate::format::record::RecordView;
use crate::format::topic::TopicConfig;
use crate::format::{
    encode_index, encode_record, IndexBuilder, IndexEntry, SegmentHeader, HEADER_LEN,
};

use crate::engine::storage::io::{write_file_atomic, Storage, StorageFile};
use crate::engine::storage::layout::{list_partition, PartitionRef, SegmentFiles};
use crate::engine::storage::reader::{
    open_log, read_header, scan_segment, Next, RecordReader, ScanEnd,
};

mod keys;
mod passes;
pub(crate) mod swap;

use keys::*;
use passes::*;

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

/// Compacts one partition: both passes, then the swap protocol of docs/FORMAT.md.
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
pub use swap::{finish_compaction_marker, Kept, MarkerFinish, PreparedCompaction};

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
    fn output_names_tile() {
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
        // Every later one the previous output's last offset + 1, wherever its first
        // record comes from.
        w.prev_last = Some(120);
        assert_eq!(w.name_for(130), 121);
        w.prev_last = Some(90);
        assert_eq!(w.name_for(130), 91);
        assert_eq!(w.name_for(250), 91);
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
        assert_eq!(w.done, vec![(0, 2032), (6, 132), (7, 932), (8, 132)]);
    }
}
