//! Mending a damaged sealed segment with records from elsewhere: a replicated
//! partition's replica whose sealed segment holds a bad record takes the records the
//! damage hides from a peer (every replica holds the same offset → record mapping),
//! so the segment reads whole again. Salvage ([`super::salvage`]) drops what it
//! cannot read; a mend puts it back.
//!
//! The plan is salvage's ([`plan_segment`]): the byte ranges that still read, and
//! the offsets each damaged range hides. [`MendWriter`] writes the new segment in
//! order: each kept range copied byte for byte, each damaged range replaced by the
//! records given for its offsets, encoded with the segment's generation (a record is
//! its offset, timestamp, key and value: the bytes are the ones the damage hit).
//! The result goes through compaction's swap ([`PreparedCompaction`]): temporary
//! files fsynced first, then `compaction.marker` naming the segment as both replaced
//! and new, the rename, the marker removed. A crash at any point leaves the old
//! segment or the mended one, never a mix: recovery finishes or drops the swap as it
//! does for a compaction.
//!
//! A lost segment (its `.log` gone, its `.index` left) is written again whole from
//! the records of its offsets ([`write_found`]).
//!
//! Invariants:
//! - The mended segment holds every record the old one still read, unchanged, at its
//!   offset, and for each damaged range only records of that range, in increasing
//!   offsets. For a topic that does not compact, the given records must be exactly the
//!   range's offsets (nothing invented, nothing skipped); a compacted topic's peer may
//!   have compacted some away, but the segment's last offset must be given (the
//!   segments tile: the next segment's base follows it).
//! - Nothing is written in the partition directory but the two temporary files until
//!   the swap.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::engine::maintenance::check::{check_segment, CheckMode, Severity};
use crate::engine::maintenance::compaction::PreparedCompaction;
use crate::engine::maintenance::salvage::{
    copy_range, is_salvageable_damage as is_record_damage, plan_segment, LostOffsets,
    SegmentSalvage,
};
use crate::engine::storage::io::{Storage, StorageFile};
use crate::engine::storage::layout::SegmentFiles;
use crate::engine::storage::reader::{open_log, read_full_at, Next, RecordReader};
use crate::format::names::{index_file_name, log_file_name, tmp_file_name};
use crate::format::{encode_index, encode_record, IndexBuilder, SegmentHeader, HEADER_LEN};

/// One record given for a damaged range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GivenRecord {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// A step of writing the mended segment, in file order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes `from..to` of the old file, copied.
    Keep { from: u64, to: u64 },
    /// The records of offsets `first..next`, given by the caller.
    Fill { first: u64, next: u64 },
}

/// A damaged sealed segment and how it is mended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MendPlan {
    pub salvage: SegmentSalvage,
    /// The next segment's base: the mended segment's last offset is just below it.
    pub next_base: u64,
    pub pieces: Vec<Piece>,
}

impl MendPlan {
    /// The offset ranges the damage hides (`first..next`).
    pub fn lost(&self) -> Vec<(u64, u64)> {
        self.pieces
            .iter()
            .filter_map(|p| match *p {
                Piece::Fill { first, next } => Some((first, next)),
                Piece::Keep { .. } => None,
            })
            .collect()
    }
}

/// What a check of a sealed segment says a mend can do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MendCheck {
    /// Its header and records read whole. `missing_from`: the offset after its last
    /// record when that is below the next segment's base (offsets `missing_from..
    /// next_base` are in no segment: a segment between is lost with both its files,
    /// or this one lost its last records whole); a mend writes them as a segment of
    /// their own.
    Whole { missing_from: Option<u64> },
    /// Damage to its records or header: the mend's plan, or why a mend cannot
    /// handle it.
    Damaged(Result<Box<MendPlan>, String>),
}

/// Checks the sealed segment `files` (followed by a segment based at `next_base`)
/// and plans its mend.
pub fn plan_mend(files: &SegmentFiles, next_base: u64, mode: CheckMode) -> io::Result<MendCheck> {
    let seg = check_segment(files, false, mode, Some(next_base))?;
    let damaged = seg.problems.iter().any(|p| {
        p.severity == Severity::Corrupt && p.file == files.log && is_record_damage(p.kind)
    });
    if !damaged {
        let reached = seg
            .last_offset
            .map_or(files.base_offset, |o| o.saturating_add(1));
        let whole = seg.problems.iter().all(|p| p.severity != Severity::Corrupt);
        return Ok(MendCheck::Whole {
            missing_from: (whole && reached > files.base_offset && reached < next_base)
                .then_some(reached),
        });
    }
    let salvage = match plan_segment(&seg, Some(next_base))? {
        Ok(s) => s,
        Err(why) => return Ok(MendCheck::Damaged(Err(why))),
    };
    Ok(MendCheck::Damaged(pieces(&salvage, next_base).map(
        |pieces| {
            Box::new(MendPlan {
                salvage,
                next_base,
                pieces,
            })
        },
    )))
}

/// The salvage plan's kept and lost ranges in file order.
fn pieces(s: &SegmentSalvage, next_base: u64) -> Result<Vec<Piece>, String> {
    // A rebuilt header's bytes come first among the lost ones, with no offsets.
    let lost_bytes = s
        .lost_bytes
        .get(usize::from(s.header_rebuilt)..)
        .unwrap_or(&[]);
    if lost_bytes.len() != s.lost_offsets.len() {
        return Err("the damaged ranges do not match their offsets".into());
    }
    let mut at: Vec<(u64, Piece)> = s
        .kept
        .iter()
        .map(|&(from, to)| (from, Piece::Keep { from, to }))
        .collect();
    for (&(from, _), lost) in lost_bytes.iter().zip(&s.lost_offsets) {
        let LostOffsets { first, next } = *lost;
        let next = next.unwrap_or(next_base);
        if next < first {
            return Err(format!("damaged range of offsets {first}..{next}"));
        }
        at.push((from, Piece::Fill { first, next }));
    }
    at.sort_by_key(|&(pos, _)| pos);
    Ok(at.into_iter().map(|(_, p)| p).collect())
}

/// Writes the mend of `plan` with `ranges[i]`, the records given for its `i`-th
/// damaged range ([`MendPlan::lost`]), and makes it durable: the swap, ready for its
/// step 2. On refusal nothing is left behind.
pub fn write_mend<'a>(
    storage: &'a dyn Storage,
    plan: MendPlan,
    gaps_allowed: bool,
    ranges: &[Vec<GivenRecord>],
) -> Result<PreparedCompaction<'a>, String> {
    let label = plan.salvage.files.log.display().to_string();
    if ranges.len() != plan.lost().len() {
        return Err(format!(
            "{} damaged ranges, records given for {}",
            plan.lost().len(),
            ranges.len()
        ));
    }
    let mut w =
        MendWriter::begin(storage, plan, gaps_allowed).map_err(|e| format!("{label}: {e}"))?;
    for records in ranges {
        if let Err(e) = w.put(records).and_then(|()| w.fill_done()) {
            w.abandon(storage);
            return Err(e);
        }
    }
    w.finish(storage)
}

/// Writes a lost segment again (its `.log` gone; [`crate::engine::maintenance::check`]'s
/// `lost_segment`): `<first>.log` holding `records`, the records of offsets
/// `first..next` (a new file: generation 0), and its index. Each goes to a temporary
/// file, fsynced, renamed into place, then the directory is fsynced: a crash leaves
/// temporary files (recovery removes them), or the new log beside the old index
/// (recovery rebuilds a mismatched index), or both in place. Refused, with nothing
/// left behind, unless the records are in increasing offsets within the range, end
/// at `next - 1`, and (`gaps_allowed` false) are every offset of it.
pub fn write_found(
    storage: &dyn Storage,
    dir: &Path,
    first: u64,
    next: u64,
    records: &[GivenRecord],
    gaps_allowed: bool,
) -> Result<(), String> {
    let mut expect = first;
    for r in records {
        if r.offset < expect || r.offset >= next || (!gaps_allowed && r.offset != expect) {
            return Err(format!(
                "record at offset {} given where offset {expect} was due (offsets \
                 {first}..{next}); nothing is invented",
                r.offset
            ));
        }
        expect = r.offset + 1;
    }
    if records.last().map(|r| r.offset + 1) != Some(next) {
        return Err(format!(
            "the records given end at {:?}, not at offset {} just below the next segment's \
             base",
            records.last().map(|r| r.offset),
            next.saturating_sub(1)
        ));
    }
    let mut log = SegmentHeader::new(first).encode().to_vec();
    let mut builder = IndexBuilder::new();
    let mut entries = Vec::new();
    for r in records {
        if let Some(e) = builder.observe(first, r.offset, log.len() as u64) {
            entries.push(e);
        }
        encode_record(
            &mut log,
            r.offset,
            r.timestamp_ms,
            r.key.as_deref(),
            &r.value,
            0,
        )
        .map_err(|e| format!("offset {}: {e}", r.offset))?;
    }
    let index = encode_index(&entries);
    let files = [(log_file_name(first), log), (index_file_name(first), index)];
    let tmps: Vec<PathBuf> = files
        .iter()
        .map(|(name, _)| dir.join(tmp_file_name(name)))
        .collect();
    let result = (|| -> io::Result<()> {
        for ((_, bytes), tmp) in files.iter().zip(&tmps) {
            let f = storage.create(tmp)?;
            f.write_at(bytes, 0)?;
            f.sync_all()?;
        }
        for ((name, _), tmp) in files.iter().zip(&tmps) {
            storage.rename(tmp, &dir.join(name))?;
        }
        storage.sync_dir(dir)
    })();
    result.map_err(|e| {
        for t in &tmps {
            let _ = storage.remove_file(t);
        }
        format!("writing {}: {e}", dir.join(log_file_name(first)).display())
    })
}

/// Writes a mended segment to temporary files, piece by piece ([`MendPlan::pieces`]
/// in order), then [`MendWriter::finish`] makes them durable for the swap.
#[derive(Debug)]
pub struct MendWriter {
    plan: MendPlan,
    src: File,
    out: Box<dyn StorageFile>,
    tmp_log: PathBuf,
    tmp_index: PathBuf,
    /// Where the next byte goes in the new file.
    at: u64,
    /// The next piece to write.
    next_piece: usize,
    /// The range being filled, and the lowest offset its next record may have.
    filling: Option<(u64, u64, u64)>,
    /// Records of a fill may skip offsets (a compacted topic).
    gaps_allowed: bool,
    buf: Vec<u8>,
    done: bool,
}

impl MendWriter {
    /// Creates the temporary files (removing leftovers of the same name) and writes
    /// the header. `gaps_allowed`: the topic compacts, so a peer may lack offsets.
    pub fn begin(storage: &dyn Storage, plan: MendPlan, gaps_allowed: bool) -> io::Result<Self> {
        let files = &plan.salvage.files;
        let dir = files.log.parent().unwrap_or(Path::new(".")).to_path_buf();
        let base = files.base_offset;
        let tmp_log = dir.join(tmp_file_name(&log_file_name(base)));
        let tmp_index = dir.join(tmp_file_name(&index_file_name(base)));
        for t in [&tmp_log, &tmp_index] {
            match storage.remove_file(t) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let (src, _) = open_log(&files.log)?;
        let out = storage.create(&tmp_log)?;
        let mut w = MendWriter {
            src,
            out,
            tmp_log,
            tmp_index,
            at: HEADER_LEN as u64,
            next_piece: 0,
            filling: None,
            gaps_allowed,
            buf: Vec::new(),
            done: false,
            plan,
        };
        let header = if w.plan.salvage.header_rebuilt {
            SegmentHeader {
                base_offset: base,
                generation: w.plan.salvage.generation,
                flags: 0,
            }
            .encode()
            .to_vec()
        } else {
            let mut h = [0u8; HEADER_LEN];
            let n = read_full_at(&w.src, &mut h, 0)?;
            h.get(..n).unwrap_or(&[]).to_vec()
        };
        w.out.write_at(&header, 0)?;
        w.copy_kept()?;
        Ok(w)
    }

    /// The range whose records are wanted now (`first..next`, `first` the lowest
    /// offset still to come), or `None` when every piece is written.
    pub fn wanted(&self) -> Option<(u64, u64)> {
        self.filling.map(|(_, next, from)| (from, next))
    }

    /// Copies kept pieces until a fill (or the end) comes.
    fn copy_kept(&mut self) -> io::Result<()> {
        while let Some(&piece) = self.plan.pieces.get(self.next_piece) {
            match piece {
                Piece::Keep { from, to } => {
                    self.copy(from, to)?;
                    self.next_piece += 1;
                }
                Piece::Fill { first, next } => {
                    self.filling = Some((first, next, first));
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn copy(&mut self, from: u64, to: u64) -> io::Result<()> {
        let log = &self.plan.salvage.files.log;
        copy_range(&self.src, log, &*self.out, (from, to), &mut self.at)
    }

    /// Writes records of the range being filled, in increasing offsets, each within
    /// it and (unless gaps are allowed) each the next offset. Once the range is
    /// complete ([`MendWriter::fill_done`]) the writer goes on to the next pieces.
    pub fn put(&mut self, records: &[GivenRecord]) -> Result<(), String> {
        let Some((first, next, mut from)) = self.filling else {
            return Err("no damaged range is being filled".into());
        };
        self.buf.clear();
        let generation = self.plan.salvage.generation;
        for r in records {
            if r.offset < from || r.offset >= next {
                return Err(format!(
                    "record at offset {} given where offsets {from}..{next} were due",
                    r.offset
                ));
            }
            if !self.gaps_allowed && r.offset != from {
                return Err(format!(
                    "the records jump from offset {from} to {} (a topic that does not \
                     compact has every offset); nothing is invented",
                    r.offset
                ));
            }
            encode_record(
                &mut self.buf,
                r.offset,
                r.timestamp_ms,
                r.key.as_deref(),
                &r.value,
                generation,
            )
            .map_err(|e| format!("offset {}: {e}", r.offset))?;
            from = r.offset + 1;
        }
        self.out
            .write_at(&self.buf, self.at)
            .map_err(|e| format!("{}: {e}", self.tmp_log.display()))?;
        self.at += self.buf.len() as u64;
        self.filling = Some((first, next, from));
        Ok(())
    }

    /// Ends the range being filled: with gaps not allowed, every offset must have
    /// come. Then copies the kept bytes after it.
    pub fn fill_done(&mut self) -> Result<(), String> {
        let Some((first, next, from)) = self.filling.take() else {
            return Err("no damaged range is being filled".into());
        };
        if !self.gaps_allowed && from != next {
            self.filling = Some((first, next, from));
            return Err(format!(
                "offsets {from}..{next} were not given; nothing is invented"
            ));
        }
        self.next_piece += 1;
        self.copy_kept()
            .map_err(|e| format!("{}: {e}", self.plan.salvage.files.log.display()))
    }

    /// Ends the writing: the segment must end at the offset just below the next
    /// segment's base; then the log is cut to its data and fsynced, the index built
    /// from the written file and fsynced, and the directory fsynced. Returns the
    /// swap, ready for its step 2 (the caller checks the segment is still the one
    /// read, under the partition's write lock).
    pub fn finish(mut self, storage: &dyn Storage) -> Result<PreparedCompaction<'_>, String> {
        match self.make_durable(storage) {
            Ok(()) => {}
            Err(e) => {
                self.remove_temp(storage);
                return Err(e);
            }
        }
        self.done = true;
        let dir = self
            .tmp_log
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        Ok(PreparedCompaction::replacing_one(
            storage,
            dir,
            self.plan.salvage.files.base_offset,
            self.plan.salvage.old_len,
            self.at,
            vec![self.tmp_log.clone(), self.tmp_index.clone()],
        ))
    }

    fn make_durable(&mut self, storage: &dyn Storage) -> Result<(), String> {
        let path = |p: &Path, e: io::Error| format!("{}: {e}", p.display());
        if self.filling.is_some() || self.next_piece < self.plan.pieces.len() {
            return Err("the mended segment is not complete".into());
        }
        self.out
            .set_len(self.at)
            .map_err(|e| path(&self.tmp_log, e))?;
        let (index, last) = self.build_index().map_err(|e| path(&self.tmp_log, e))?;
        let want = self.plan.next_base.checked_sub(1);
        if last != want {
            return Err(format!(
                "the mended segment would end at offset {last:?}, not {want:?} just below \
                 the next segment's base: the segments would not tile"
            ));
        }
        self.out.sync_all().map_err(|e| path(&self.tmp_log, e))?;
        let idx = storage
            .create(&self.tmp_index)
            .map_err(|e| path(&self.tmp_index, e))?;
        idx.write_at(&index, 0)
            .map_err(|e| path(&self.tmp_index, e))?;
        idx.sync_all().map_err(|e| path(&self.tmp_index, e))?;
        let dir = self.tmp_log.parent().unwrap_or(Path::new("."));
        storage.sync_dir(dir).map_err(|e| path(dir, e))
    }

    /// The index of the written file and its last offset, read back from it (every
    /// record must decode).
    fn build_index(&self) -> io::Result<(Vec<u8>, Option<u64>)> {
        let file = File::open(&self.tmp_log)?;
        let base = self.plan.salvage.files.base_offset;
        let mut reader = RecordReader::new(
            &file,
            self.plan.salvage.generation,
            HEADER_LEN as u64,
            self.at,
        );
        let mut builder = IndexBuilder::new();
        let mut entries = Vec::new();
        let mut last = None;
        loop {
            match reader.next_record()? {
                Next::Record { position, record } => {
                    last = Some(record.offset);
                    if let Some(e) = builder.observe(base, record.offset, position) {
                        entries.push(e);
                    }
                }
                Next::End(None) => break,
                Next::End(Some(e)) => {
                    return Err(io::Error::other(format!(
                        "the mended segment does not read back at byte {}",
                        e.position()
                    )))
                }
            }
        }
        Ok((encode_index(&entries), last))
    }

    /// Removes the temporary files (a mend given up).
    pub fn abandon(mut self, storage: &dyn Storage) {
        self.remove_temp(storage);
    }

    fn remove_temp(&mut self, storage: &dyn Storage) {
        if self.done {
            return;
        }
        self.done = true;
        for t in [&self.tmp_log, &self.tmp_index] {
            let _ = storage.remove_file(t);
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::storage::io::RealStorage;
    use crate::engine::storage::layout::{list_partition, PartitionRef};

    fn record(o: u64) -> GivenRecord {
        GivenRecord {
            offset: o,
            timestamp_ms: 1_700_000_000_000 + o as i64,
            key: (o % 3 == 0).then(|| format!("k{o}").into_bytes()),
            value: format!("value of {o}").repeat(20).into_bytes(),
        }
    }

    /// Writes segments `0..n` and `n..n+1` (the active one) to `dir`; returns the
    /// positions of the first segment's records.
    fn write_segments(dir: &Path, n: u64) -> Vec<u64> {
        let mut log = SegmentHeader::new(0).encode().to_vec();
        let mut idx = Vec::new();
        let mut b = IndexBuilder::new();
        let mut at = Vec::new();
        for o in 0..n {
            let r = record(o);
            at.push(log.len() as u64);
            if let Some(e) = b.observe(0, o, log.len() as u64) {
                e.encode_into(&mut idx);
            }
            encode_record(&mut log, o, r.timestamp_ms, r.key.as_deref(), &r.value, 0).unwrap();
        }
        std::fs::write(dir.join(log_file_name(0)), &log).unwrap();
        std::fs::write(dir.join(index_file_name(0)), &idx).unwrap();
        let mut next = SegmentHeader::new(n).encode().to_vec();
        let r = record(n);
        encode_record(&mut next, n, r.timestamp_ms, r.key.as_deref(), &r.value, 0).unwrap();
        std::fs::write(dir.join(log_file_name(n)), &next).unwrap();
        at
    }

    fn flip(dir: &Path, pos: u64) {
        let path = dir.join(log_file_name(0));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[pos as usize] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
    }

    fn plan(dir: &Path, next_base: u64) -> Option<Result<MendPlan, String>> {
        let listing = list_partition(dir).unwrap();
        match plan_mend(&listing.segments[0], next_base, CheckMode::Full).unwrap() {
            MendCheck::Whole { .. } => None,
            MendCheck::Damaged(plan) => Some(plan.map(|p| *p)),
        }
    }

    /// A sealed segment that reads whole but ends before the next base (its last
    /// records cut off whole) names the offsets in no file; one that ends at the next
    /// base names none; Quick and Full agree.
    #[test]
    fn a_whole_segment_that_ends_short_names_the_missing_offsets() {
        let tmp = tempfile::tempdir().unwrap();
        let at = write_segments(tmp.path(), 40);
        let listing = list_partition(tmp.path()).unwrap();
        for mode in [CheckMode::Quick, CheckMode::Full] {
            assert_eq!(
                plan_mend(&listing.segments[0], 40, mode).unwrap(),
                MendCheck::Whole { missing_from: None }
            );
        }
        // Records 37..40 cut off at a record boundary, the index trimmed to match.
        let path = tmp.path().join(log_file_name(0));
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(at[37]).unwrap();
        drop(f);
        std::fs::remove_file(tmp.path().join(index_file_name(0))).unwrap();
        let listing = list_partition(tmp.path()).unwrap();
        assert_eq!(
            plan_mend(&listing.segments[0], 40, CheckMode::Full).unwrap(),
            MendCheck::Whole {
                missing_from: Some(37)
            }
        );
    }

    fn fill_all(w: &mut MendWriter, give: impl Fn(u64, u64) -> Vec<GivenRecord>) {
        while let Some((from, next)) = w.wanted() {
            w.put(&give(from, next)).unwrap();
            w.fill_done().unwrap();
        }
    }

    #[test]
    fn a_segment_with_damage_is_mended_to_the_original_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let at = write_segments(d, 40);
        let original = std::fs::read(d.join(log_file_name(0))).unwrap();
        assert_eq!(plan(d, 40), None, "no damage, no plan");
        // Two damaged records, and the last one.
        flip(d, at[7] + 14);
        flip(d, at[25] + 14);
        flip(d, at[39] + 14);
        let p = plan(d, 40).unwrap().unwrap();
        let lost = p.lost();
        assert_eq!(lost.len(), 3, "{lost:?}");
        assert!(lost.iter().all(|&(f, n)| f < n), "{lost:?}");
        assert_eq!(lost[2].1, 40, "the last range reaches the next segment");
        let mut w = MendWriter::begin(&RealStorage, p, false).unwrap();
        fill_all(&mut w, |from, next| (from..next).map(record).collect());
        let prepared = w.finish(&RealStorage).unwrap();
        let report = prepared.swap(&mut |_| {}).unwrap();
        assert_eq!(report.new, vec![0]);
        assert_eq!(std::fs::read(d.join(log_file_name(0))).unwrap(), original);
        assert_eq!(plan(d, 40), None, "mended whole");
        let names: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| !n.ends_with(".tmp") && !n.contains("marker")),
            "{names:?}"
        );
    }

    #[test]
    fn missing_or_stray_records_are_refused_and_nothing_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let at = write_segments(d, 40);
        for pos in &at[10..13] {
            flip(d, pos + 14);
        }
        let damaged = std::fs::read(d.join(log_file_name(0))).unwrap();
        let p = plan(d, 40).unwrap().unwrap();
        let (first, next) = p.lost()[0];
        assert_eq!((first, next), (10, 13));
        // A gap.
        let mut w = MendWriter::begin(&RealStorage, p.clone(), false).unwrap();
        let e = w.put(&[record(first), record(first + 2)]).unwrap_err();
        assert!(
            e.contains(&format!("jump from offset {} to {}", first + 1, first + 2)),
            "{e}"
        );
        // Too few.
        let mut w2 = MendWriter::begin(&RealStorage, p.clone(), false).unwrap();
        w2.put(&[record(first)]).unwrap();
        let e = w2.fill_done().unwrap_err();
        assert!(e.contains("offsets 11..13 were not given"), "{e}");
        w2.abandon(&RealStorage);
        // Outside the range.
        let mut w3 = MendWriter::begin(&RealStorage, p.clone(), false).unwrap();
        let e = w3.put(&[record(next)]).unwrap_err();
        assert!(e.contains("were due"), "{e}");
        w3.abandon(&RealStorage);
        w.abandon(&RealStorage);
        // The one call: refused as a whole, nothing left behind.
        let e = write_mend(&RealStorage, p.clone(), false, &[]).unwrap_err();
        assert!(e.contains("1 damaged ranges, records given for 0"), "{e}");
        let e = write_mend(&RealStorage, p, false, &[vec![record(10), record(12)]]).unwrap_err();
        assert!(e.contains("jump from offset 11 to 12"), "{e}");
        let names: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        assert_eq!(std::fs::read(d.join(log_file_name(0))).unwrap(), damaged);
    }

    /// A crash after the mend's marker is durable (before the rename) is finished by
    /// recovery's marker rule into the mended segment; one before it leaves the
    /// damaged segment and temporary files recovery removes.
    #[test]
    fn a_crash_during_the_swap_leaves_the_old_or_the_mended_segment() {
        use crate::engine::maintenance::check::check_partition;
        use crate::engine::maintenance::compaction::finish_compaction_marker;
        use crate::format::marker::CompactionMarker;
        use crate::format::marker::MarkerError;
        use crate::format::names::COMPACTION_MARKER;
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let at = write_segments(d, 40);
        let original = std::fs::read(d.join(log_file_name(0))).unwrap();
        flip(d, at[20] + 14);
        let damaged = std::fs::read(d.join(log_file_name(0))).unwrap();
        let mended = |d: &Path| {
            let mut w =
                MendWriter::begin(&RealStorage, plan(d, 40).unwrap().unwrap(), false).unwrap();
            fill_all(&mut w, |from, next| (from..next).map(record).collect());
            // The process dies with the swap prepared: nothing removes its files.
            std::mem::forget(w.finish(&RealStorage).unwrap());
        };
        let p = PartitionRef {
            dir: d.to_path_buf(),
            topic: None,
            partition: None,
            config: crate::format::topic::TopicConfig::default(),
            only_segment: None,
        };
        // Before the marker: the old segment, and temporary files.
        mended(d);
        let check = check_partition(&p, CheckMode::Full).unwrap();
        assert_eq!(check.temp_files.len(), 2);
        assert!(check.marker.is_none());
        assert_eq!(std::fs::read(d.join(log_file_name(0))).unwrap(), damaged);
        for t in &check.temp_files {
            std::fs::remove_file(t).unwrap();
        }
        // After it: the marker fits, and finishing it gives the mended segment.
        mended(d);
        let m = CompactionMarker {
            new: vec![0],
            replaced: vec![0],
        };
        std::fs::write(d.join(COMPACTION_MARKER), m.encode()).unwrap();
        let check = check_partition(&p, CheckMode::Full).unwrap();
        match &check.marker {
            Some((_, Ok(got))) => assert_eq!(*got, m),
            Some((_, Err(e @ MarkerError::DoesNotFit { .. }))) => panic!("{e:?}"),
            other => panic!("{other:?}"),
        }
        finish_compaction_marker(&RealStorage, d, &m).unwrap();
        assert_eq!(std::fs::read(d.join(log_file_name(0))).unwrap(), original);
        assert_eq!(plan(d, 40), None);
    }

    /// Every crash state of a mend (the temporary files, the marker, the rename, the
    /// marker's removal, with their fsyncs), recovered as the broker's start does,
    /// holds the damaged segment or the mended one; once the swap returned, the
    /// mended one. Failing storage at each of its mutations leaves the same.
    #[test]
    fn every_crash_state_of_a_mend_recovers_to_the_old_or_the_mended_segment() {
        use crate::engine::maintenance::recovery::recover;
        use crate::testkit::sim::{crash_states, DirModel, Materialiser, Rng, SimStorage};
        use crate::testkit::storage::{FailOn, FailingStorage};
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("p");
        std::fs::create_dir(&root).unwrap();
        let at = write_segments(&root, 40);
        let original = std::fs::read(root.join(log_file_name(0))).unwrap();
        flip(&root, at[20] + 14);
        let damaged = std::fs::read(root.join(log_file_name(0))).unwrap();
        let given = vec![vec![record(20)]];
        let pristine = tmp.path().join("pristine");
        crate::testkit::sim::Image::from_dir(&root)
            .unwrap()
            .0
            .write_to(&pristine)
            .unwrap();

        let sim = SimStorage::new(&root).unwrap();
        let p = plan(&root, 40).unwrap().unwrap();
        write_mend(&sim, p, false, &given)
            .unwrap()
            .swap(&mut |_| {})
            .unwrap();
        let trace = sim.trace();
        let dur = trace.durability();
        let mut mat = Materialiser::new(&trace);
        let mut rng = Rng::new(11);
        let n = trace.ops.len();
        let mut states = 0;
        for k in 0..=n {
            let pending = dur.pending(&trace, k);
            for model in [DirModel::InOrder, DirModel::AnyOrder] {
                for choices in crash_states(&trace, &pending, model, 1024, 32, &mut rng) {
                    let img = mat.image(&dur, k, &pending, &choices);
                    let dir = tmp.path().join(format!("state{states}"));
                    img.write_to(&dir).unwrap();
                    recover(&RealStorage, &dir)
                        .unwrap_or_else(|e| panic!("crash point {k}/{n} {choices:?}: {e}"));
                    let bytes = std::fs::read(dir.join(log_file_name(0))).unwrap();
                    assert!(
                        bytes == damaged || bytes == original,
                        "crash point {k}/{n} {choices:?}"
                    );
                    if k == n {
                        assert_eq!(bytes, original, "the swap returned: durable");
                    }
                    let left: Vec<String> = std::fs::read_dir(&dir)
                        .unwrap()
                        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .filter(|n| n.ends_with(".tmp") || n.contains("marker"))
                        .collect();
                    assert!(left.is_empty(), "crash point {k}/{n}: {left:?}");
                    std::fs::remove_dir_all(&dir).unwrap();
                    states += 1;
                }
            }
        }
        assert!(states > n, "{states} crash states of {n} operations");

        // Failing storage: each mutation in turn fails (and every one after it).
        for fail_at in 1.. {
            let dir = tmp.path().join(format!("fail{fail_at}"));
            crate::testkit::sim::Image::from_dir(&pristine)
                .unwrap()
                .0
                .write_to(&dir)
                .unwrap();
            let failing = FailingStorage::new(Arc::new(RealStorage), fail_at, FailOn::Any, true);
            let p = plan(&dir, 40).unwrap().unwrap();
            let done = write_mend(&failing, p, false, &given)
                .and_then(|prepared| prepared.swap(&mut |_| {}).map_err(|e| e.to_string()));
            if !failing.has_failed() {
                done.unwrap();
                assert_eq!(std::fs::read(dir.join(log_file_name(0))).unwrap(), original);
                break;
            }
            assert!(done.is_err(), "call {fail_at} failed, the mend said done");
            recover(&RealStorage, &dir).unwrap();
            let bytes = std::fs::read(dir.join(log_file_name(0))).unwrap();
            assert!(
                bytes == damaged || bytes == original,
                "failed call {fail_at}"
            );
        }
    }

    /// A lost segment (its `.log` gone, its `.index` left) written again from the
    /// records is the file it was; every crash state of the writing recovers to
    /// the lost segment or the whole one; wrong records are refused.
    #[test]
    fn a_lost_segment_is_written_again_and_every_crash_state_recovers() {
        use crate::engine::maintenance::recovery::recover;
        use crate::testkit::sim::{crash_states, DirModel, Materialiser, Rng, SimStorage};
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("p");
        std::fs::create_dir(&root).unwrap();
        write_segments(&root, 40);
        let original = std::fs::read(root.join(log_file_name(0))).unwrap();
        std::fs::remove_file(root.join(log_file_name(0))).unwrap();
        let all: Vec<GivenRecord> = (0..40).map(record).collect();
        // Refused: a gap, a short range, a stray offset; nothing left behind.
        let mut gap = all.clone();
        gap.remove(7);
        for (bad, why) in [
            (gap, "offset 8 given where offset 7 was due"),
            (all[..39].to_vec(), "not at offset 39"),
            ((0..41).map(record).collect(), "offset 40 given"),
        ] {
            let e = write_found(&RealStorage, &root, 0, 40, &bad, false).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        assert!(!root.join(log_file_name(0)).exists());
        let sim = SimStorage::new(&root).unwrap();
        write_found(&sim, &root, 0, 40, &all, false).unwrap();
        assert_eq!(
            std::fs::read(root.join(log_file_name(0))).unwrap(),
            original
        );
        let trace = sim.trace();
        let dur = trace.durability();
        let mut mat = Materialiser::new(&trace);
        let mut rng = Rng::new(13);
        let n = trace.ops.len();
        for k in 0..=n {
            let pending = dur.pending(&trace, k);
            for model in [DirModel::InOrder, DirModel::AnyOrder] {
                for choices in crash_states(&trace, &pending, model, 1024, 32, &mut rng) {
                    let img = mat.image(&dur, k, &pending, &choices);
                    let dir = tmp.path().join("state");
                    img.write_to(&dir).unwrap();
                    recover(&RealStorage, &dir)
                        .unwrap_or_else(|e| panic!("crash point {k}/{n} {choices:?}: {e}"));
                    match std::fs::read(dir.join(log_file_name(0))) {
                        Ok(bytes) => assert_eq!(bytes, original, "crash point {k}/{n}"),
                        Err(_) => assert!(k < n, "the write returned: durable"),
                    }
                    std::fs::remove_dir_all(&dir).unwrap();
                }
            }
        }
    }

    #[test]
    fn a_compacted_peer_may_lack_offsets_but_not_the_segments_last() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let at = write_segments(d, 40);
        flip(d, at[39] + 14);
        let p = plan(d, 40).unwrap().unwrap();
        let (first, next) = p.lost()[0];
        assert_eq!((first, next), (39, 40));
        // The peer compacted offset 39 away: the segments would not tile.
        let mut w = MendWriter::begin(&RealStorage, p.clone(), true).unwrap();
        w.put(&[]).unwrap();
        w.fill_done().unwrap();
        let e = w.finish(&RealStorage).unwrap_err();
        assert!(e.contains("would not tile"), "{e}");
        // With it, fine, gaps before it allowed.
        flip(d, at[20] + 14);
        let p = plan(d, 40).unwrap().unwrap();
        let mut w = MendWriter::begin(&RealStorage, p, true).unwrap();
        fill_all(&mut w, |from, next| {
            (from..next).filter(|o| o % 2 == 1).map(record).collect()
        });
        let prepared = w.finish(&RealStorage).unwrap();
        prepared.swap(&mut |_| {}).unwrap();
        assert_eq!(plan(d, 40), None);
    }
}
