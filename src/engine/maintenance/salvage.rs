//! Salvage (`seglog recover --salvage`): rewrites a sealed segment holding damage so
//! that it keeps every record that can still be read (docs/FORMAT.md, Recovery).
//!
//! After damage the records resume at the next position where a record decodes, its
//! CRC passes with the segment's generation and its offset lies between the last good
//! offset and the next segment's base ([`resync`], the one resynchronisation the
//! fetch path uses too). A segment whose header is damaged is rebuilt from its file
//! name (the base offset) and the generation its records' CRCs name, when two
//! consecutive records agree on it.
//!
//! Invariants: planning reads only; every damaged byte range is copied to the backup
//! directory and fsynced before the segment is replaced; the replace is atomic
//! (temporary file, fsync, rename, directory fsync), then the index is rewritten.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::engine::maintenance::backup::Backup;
use crate::engine::maintenance::check::{
    check_partition, CheckMode, PartitionCheck, ProblemKind, SegmentCheck, Severity,
};
use crate::engine::maintenance::reindex::{index_bytes, write_index};
use crate::engine::storage::io::{Storage, StorageFile};
use crate::engine::storage::layout::{PartitionRef, SegmentFiles};
use crate::engine::storage::reader::{
    open_log, read_full_at, resync, Next, RecordReader, SCAN_WINDOW_BYTES,
};
use crate::format::names::atomic_tmp_file_name;
use crate::format::record::{decode_record, peek_offset, record_generation};
use crate::format::{IndexBuilder, IndexEntry, SegmentHeader, HEADER_LEN};

/// Bytes copied per read/write while rewriting.
const COPY_CHUNK_BYTES: usize = 1024 * 1024;

/// Offsets a salvage cannot keep: `first..next` (`next` exclusive; `None`: up to the
/// end of the segment, with no next segment to bound it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostOffsets {
    pub first: u64,
    pub next: Option<u64>,
}

/// The rewrite of one sealed segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSalvage {
    pub files: SegmentFiles,
    pub generation: u64,
    /// The header was damaged and is rebuilt from the file name and the records.
    pub header_rebuilt: bool,
    /// Byte ranges of the old file kept, in order (`from..to`).
    pub kept: Vec<(u64, u64)>,
    /// Byte ranges of the old file dropped (the header's included when rebuilt).
    pub lost_bytes: Vec<(u64, u64)>,
    pub lost_offsets: Vec<LostOffsets>,
    pub records_kept: u64,
    /// The index of the rewritten segment.
    pub index: Vec<IndexEntry>,
    pub old_len: u64,
    pub new_len: u64,
}

/// A sealed segment with damage that salvage cannot rewrite, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotSalvaged {
    pub log: PathBuf,
    pub reason: String,
}

/// What salvage plans for one partition.
#[derive(Clone, Debug, Default)]
pub struct SalvagePlan {
    pub segments: Vec<SegmentSalvage>,
    pub not_salvaged: Vec<NotSalvaged>,
}

/// A segment rewritten, with the backups made first.
#[derive(Clone, Debug)]
pub struct Salvaged {
    pub salvage: SegmentSalvage,
    pub backups: Vec<PathBuf>,
}

/// Plans salvage of every damaged sealed segment of a partition (a full check).
/// Reads only.
pub fn plan_salvage(p: &PartitionRef) -> io::Result<SalvagePlan> {
    let check = check_partition(p, CheckMode::Full)?;
    plan_from_check(&check)
}

/// Damage to a sealed segment's header or records: what salvage (and a mend,
/// [`super::mend`]) rewrites.
pub fn is_salvageable_damage(kind: ProblemKind) -> bool {
    use ProblemKind as K;
    matches!(
        kind,
        K::ShortHeader
            | K::ZeroHeader
            | K::BadHeader
            | K::SealedZeroRun
            | K::TornRecord
            | K::ImplausibleLength
            | K::BadKeyLen
            | K::BadValueLen
            | K::CrcMismatch
            | K::StaleGeneration
            | K::TooLarge
            | K::OffsetOutOfOrder
    )
}

/// Plans from a full check: the sealed segments whose own problems include damage
/// to the header or to records.
pub fn plan_from_check(check: &PartitionCheck) -> io::Result<SalvagePlan> {
    let mut plan = SalvagePlan::default();
    let segs = &check.segments;
    for (i, seg) in segs.iter().enumerate() {
        if seg.active {
            continue;
        }
        let damaged = seg.problems.iter().any(|pr| {
            pr.severity == Severity::Corrupt
                && pr.file == seg.files.log
                && is_salvageable_damage(pr.kind)
        });
        if !damaged {
            continue;
        }
        let next_base = segs.get(i + 1).map(SegmentCheck::base_offset);
        match plan_segment(seg, next_base)? {
            Ok(s) => plan.segments.push(s),
            Err(reason) => plan.not_salvaged.push(NotSalvaged {
                log: seg.files.log.clone(),
                reason,
            }),
        }
    }
    Ok(plan)
}

/// Plans the rewrite of one sealed segment; `Err(reason)` when it cannot be done.
pub fn plan_segment(
    seg: &SegmentCheck,
    next_base: Option<u64>,
) -> io::Result<Result<SegmentSalvage, String>> {
    let base = seg.base_offset();
    if let Err(crate::format::HeaderError::NotRegularFile { what }) = &seg.header {
        return Ok(Err(format!(
            "it is not a regular file but a {what}, so no segment"
        )));
    }
    let (file, len) = open_log(&seg.files.log)?;
    let (generation, header_rebuilt) = match &seg.header {
        Ok(h) if h.base_offset == base => (h.generation, false),
        Ok(h) => {
            return Ok(Err(format!(
                "its header names base offset {} and the file name {base}; salvage does not choose between them",
                h.base_offset
            )))
        }
        Err(_) => match generation_from_records(&file, len, base, next_base)? {
            Some(g) => (u64::from(g), true),
            None => {
                return Ok(Err(
                    "its header is damaged and no two consecutive records agree on a generation"
                        .into(),
                ))
            }
        },
    };
    let mut s = SegmentSalvage {
        files: seg.files.clone(),
        generation,
        header_rebuilt,
        kept: Vec::new(),
        lost_bytes: Vec::new(),
        lost_offsets: Vec::new(),
        records_kept: 0,
        index: Vec::new(),
        old_len: len,
        new_len: HEADER_LEN as u64,
    };
    if header_rebuilt {
        s.lost_bytes.push((0, (HEADER_LEN as u64).min(len)));
    }
    let mut builder = IndexBuilder::new();
    let mut pos = HEADER_LEN as u64;
    // The lowest offset the next record may have.
    let mut min_offset = base;
    if header_rebuilt {
        // The first record may be damaged too: start where one decodes.
        match resync(&file, generation, pos, len, min_offset, next_base)? {
            Some(r) if r.position == pos => {}
            Some(r) => {
                s.lost_bytes.push((pos, r.position));
                s.lost_offsets.push(LostOffsets {
                    first: min_offset,
                    next: Some(r.offset),
                });
                pos = r.position;
            }
            None => return Ok(Err("no record of the segment can be read".into())),
        }
    }
    while pos < len {
        let mut reader = RecordReader::new(&file, generation, pos, len);
        let run_start = pos;
        let damage_at = loop {
            match reader.next_record()? {
                Next::Record { position, record } => {
                    let in_order =
                        record.offset >= min_offset && next_base.is_none_or(|n| record.offset < n);
                    if !in_order {
                        break Some(position);
                    }
                    if let Some(e) = builder.observe(base, record.offset, s.new_len) {
                        s.index.push(e);
                    }
                    s.new_len += record.encoded_len as u64;
                    s.records_kept += 1;
                    min_offset = record.offset.saturating_add(1);
                }
                Next::End(None) => break None,
                Next::End(Some(e)) => break Some(e.position()),
            }
        };
        let end = damage_at.unwrap_or(len);
        if end > run_start {
            s.kept.push((run_start, end));
        }
        let Some(at) = damage_at else {
            break;
        };
        let found = resync(&file, generation, at + 1, len, min_offset, next_base)?;
        let (to, next) = match found {
            Some(r) => (r.position, Some(r.offset)),
            None => (len, next_base),
        };
        s.lost_bytes.push((at, to));
        s.lost_offsets.push(LostOffsets {
            first: min_offset,
            next,
        });
        pos = to;
    }
    Ok(Ok(s))
}

/// The low 32 bits of the generation the records of a segment with a damaged header
/// were written with: the first position (in the first scan window) holding a record
/// whose offset lies in the segment's range and that the record after it (if any)
/// confirms with the same generation.
fn generation_from_records(
    file: &File,
    len: u64,
    base: u64,
    next_base: Option<u64>,
) -> io::Result<Option<u32>> {
    let want = usize::try_from(len.saturating_sub(HEADER_LEN as u64))
        .unwrap_or(SCAN_WINDOW_BYTES)
        .min(SCAN_WINDOW_BYTES * 2);
    let mut buf = vec![0u8; want];
    let n = read_full_at(file, &mut buf, HEADER_LEN as u64)?;
    buf.truncate(n);
    let in_range = |o: u64| o >= base && next_base.is_none_or(|m| o < m);
    for at in 0..buf.len() {
        let avail = buf.get(at..).unwrap_or(&[]);
        if !peek_offset(avail).is_some_and(in_range) {
            continue;
        }
        let Some(g) = record_generation(avail) else {
            continue;
        };
        let Ok(r) = decode_record(avail, 0, u64::from(g)) else {
            continue;
        };
        let after = avail.get(r.encoded_len..).unwrap_or(&[]);
        let at_end = HEADER_LEN as u64 + (at + r.encoded_len) as u64 == len;
        let confirmed = at_end
            || decode_record(after, 0, u64::from(g))
                .is_ok_and(|n| n.offset > r.offset && in_range(n.offset));
        if confirmed {
            return Ok(Some(g));
        }
    }
    Ok(None)
}

/// Rewrites the planned segments:
/// 1. copy every lost byte range to the backup directory (fsynced),
/// 2. write the kept records (after a new header when it is rebuilt) to a unique
///    temporary file in the partition directory, 3. fsync it, 4. rename it over the
///    segment, 5. fsync the directory, 6. write the index (its own atomic replace).
///
/// A crash before 4 leaves the old segment and a leftover temporary file (recover
/// removes it); after 5 and before 6, an index that does not match the log, which
/// the startup check rebuilds.
pub fn execute_salvage(
    storage: &dyn Storage,
    plan: &SalvagePlan,
    backup: Backup<'_>,
) -> io::Result<Vec<Salvaged>> {
    let mut done = Vec::new();
    for s in &plan.segments {
        let mut backups = Vec::new();
        // 1.
        for &(from, to) in &s.lost_bytes {
            backups.push(backup.copy(storage, &s.files.log, from, to, false)?);
        }
        rewrite(storage, s)?;
        // 6.
        write_index(storage, &s.files, &index_bytes(&s.index))?;
        done.push(Salvaged {
            salvage: s.clone(),
            backups,
        });
    }
    Ok(done)
}

/// Copies bytes `from..to` of `src` (the file at `path`, named in errors) to `out`
/// at `*at`, moving `*at` past them: a salvage's or a mend's kept bytes.
pub(crate) fn copy_range(
    src: &File,
    path: &Path,
    out: &dyn StorageFile,
    (from, to): (u64, u64),
    at: &mut u64,
) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_CHUNK_BYTES];
    let mut pos = from;
    while pos < to {
        let want =
            usize::try_from((to - pos).min(COPY_CHUNK_BYTES as u64)).unwrap_or(COPY_CHUNK_BYTES);
        let chunk = buf.get_mut(..want).unwrap_or(&mut []);
        let n = read_full_at(src, chunk, pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: ends at {pos}, before {to}", path.display()),
            ));
        }
        out.write_at(chunk.get(..n).unwrap_or(&[]), *at)?;
        pos += n as u64;
        *at += n as u64;
    }
    Ok(())
}

fn rewrite(storage: &dyn Storage, s: &SegmentSalvage) -> io::Result<()> {
    let log = &s.files.log;
    let dir = log.parent().unwrap_or(Path::new("."));
    let name = log
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(atomic_tmp_file_name(&name, std::process::id(), 0));
    let result = (|| {
        let src = File::open(log)?;
        // 2.
        let out = storage.create(&tmp)?;
        let header = SegmentHeader {
            base_offset: s.files.base_offset,
            generation: s.generation,
            flags: 0,
        };
        if s.header_rebuilt {
            out.write_at(&header.encode(), 0)?;
        } else {
            let mut h = [0u8; HEADER_LEN];
            let n = read_full_at(&src, &mut h, 0)?;
            out.write_at(h.get(..n).unwrap_or(&[]), 0)?;
        }
        let mut at = HEADER_LEN as u64;
        for &(from, to) in &s.kept {
            copy_range(&src, log, &*out, (from, to), &mut at)?;
        }
        out.set_len(at)?;
        // 3.
        out.sync_all()?;
        drop(out);
        // 4.
        storage.rename(&tmp, log)?;
        // 5.
        storage.sync_dir(dir)
    })();
    if result.is_err() && tmp.exists() {
        let _ = storage.remove_file(&tmp);
    }
    result
}
