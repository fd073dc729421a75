//! Crash recovery (docs/FORMAT.md, Recovery): one function that plans from the shared
//! partition check and reads only, one that executes a plan through the I/O seam.
//! `seglog recover` and the broker's startup both run them.
//!
//! Per partition, in this order:
//! 1. A `compaction.marker` that parses: the swap it records is finished first, then
//!    the partition is checked again. One that does not parse means the swap never
//!    started: its temporary files and the marker are removed. Temporary files with
//!    no marker, and index files without their log, are removed.
//! 2. A newest segment shorter than its header or with an all-zero header never
//!    became durable: it is removed (log and index), and the segment before it becomes
//!    the active one, checked and recovered as such (as the next start would). So is
//!    a newest segment whose header still marks an unassigned spare (a roll that took
//!    a spare, whose header rewrite never became durable).
//! 3. Sealed segments are trusted when their index passes the quick check, else they
//!    were scanned and their index is rebuilt. A corrupt record in a sealed segment is
//!    reported and left in place; an unfinished seal (zeros or stale records after the
//!    data) is cut off.
//! 4. The active segment's tail after its last valid record is cut off: `set_len`,
//!    then `sync_all`, before anything new is appended; its index is then rebuilt if it
//!    covered the cut range. Any other invalid header on the newest segment is left in
//!    place and the partition refuses writes.
//! 5. Segments that do not join up are reported; nothing is deleted for it.
//! 6. The next offset follows the highest valid record.
//!
//! Invariants: nothing is removed or cut without an [`Action`] that names the file,
//! the byte range and the offsets; with a backup directory every such byte range and
//! file is copied there and fsynced first. Every action is idempotent, so a crash
//! during recovery is repaired by running it again.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::format::marker::CompactionMarker;
use crate::format::names::{index_file_name, log_file_name, segment_stem, TMP_SUFFIX};
use crate::format::record::{claimed_encoded_len, LEN_FIELD};
use crate::format::{HeaderError, IndexEntry, SegmentHeader, INDEX_ENTRY_LEN};

use super::check::{
    check_partition, check_segment, CheckMode, IndexState, PartitionCheck, Problem, SegmentCheck,
    Severity,
};
use super::io::Storage;
use super::layout::{resolve, LayoutError, PartitionRef, SegmentFiles, Target};
use super::reindex::{index_bytes, write_index};
use super::segment::{open_log, read_full_at, read_header, Next, RecordReader};

/// Bytes copied per read/write when backing up.
const BACKUP_CHUNK_BYTES: usize = 1024 * 1024;
/// Most numbered variants tried for a backup file name that already exists.
const BACKUP_NAME_TRIES_MAX: u32 = 10_000;

/// What recovery will do to a partition, planned from a read-only check.
#[derive(Clone, Debug)]
pub struct RecoveryPlan {
    /// Directory the report's paths are relative to (the data directory).
    pub root: PathBuf,
    pub partitions: Vec<PartitionPlan>,
}

/// The plan for one partition.
#[derive(Clone, Debug)]
pub struct PartitionPlan {
    pub partition: PartitionRef,
    /// `topic/partition`, or the directory.
    pub label: String,
    pub dir: PathBuf,
    /// In the order they are executed.
    pub actions: Vec<Action>,
    /// The offset the next appended record takes.
    pub next_offset: u64,
    /// Corruption left in place (records that cannot be read back).
    pub corrupt: Vec<Damage>,
    /// Segments that do not join up (reported; nothing deleted).
    pub not_joined: Vec<Problem>,
    /// The newest segment cannot be appended to (bad header, or corrupt data at its
    /// end): the partition takes no writes until an operator deals with it.
    pub refuses_writes: bool,
    /// A compaction swap is finished first; the rest of the partition is planned
    /// again after it, from what the swap leaves.
    pub recheck_after_marker: bool,
    /// Worst severity the check found (`None` when clean).
    pub severity_before: Option<Severity>,
}

/// Corruption that recovery reports and leaves in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub problem: Problem,
    /// Byte range of the file that cannot be read (`from..to`).
    pub bytes: Option<(u64, u64)>,
    /// First offset that cannot be read back, and the last one when known (the next
    /// segment's first offset minus one).
    pub offsets: Option<(u64, Option<u64>)>,
}

/// Valid records found in a range that is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordsCut {
    pub first_offset: u64,
    pub last_offset: u64,
    pub count: u64,
}

/// One step of recovery. Every variant names its files, byte ranges and offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Finish the compaction swap a marker records (rename what is still temporary,
    /// delete what is still replaced and not new, delete the marker).
    FinishCompaction {
        marker_path: PathBuf,
        marker: CompactionMarker,
    },
    /// A marker that does not parse: the swap never started.
    RemoveMarker {
        path: PathBuf,
        bytes: u64,
        reason: String,
    },
    /// A `*.tmp` file: an unfinished compaction or rewrite that never took effect.
    RemoveTempFile {
        path: PathBuf,
        bytes: u64,
        reason: String,
    },
    /// An `.index` whose `.log` is gone.
    RemoveOrphanIndex { path: PathBuf, bytes: u64 },
    /// Write the index the rule gives for the segment's valid records.
    RebuildIndex {
        log: PathBuf,
        index: PathBuf,
        base_offset: u64,
        entries: Vec<IndexEntry>,
        reason: String,
    },
    /// Cut the tail of the active segment after its last valid record.
    CutTail {
        log: PathBuf,
        from: u64,
        /// The file length when planned.
        to: u64,
        /// The offset the cut range would have started with.
        next_offset: u64,
        /// What the range holds (`torn_tail`, `zero_tail`, `stale_tail`).
        kind: &'static str,
        /// Valid records of the segment's generation behind the damaged one: cut
        /// with it (docs/FORMAT.md, Recovery step 4), so named here.
        records_cut: Option<RecordsCut>,
        reason: String,
    },
    /// Cut an unfinished seal (zeros or stale records) off a sealed segment.
    TrimSeal {
        log: PathBuf,
        from: u64,
        to: u64,
        reason: String,
    },
    /// Remove a newest segment that never became durable.
    RemoveNeverDurable {
        log: PathBuf,
        index: Option<PathBuf>,
        base_offset: u64,
        bytes: u64,
        reason: String,
    },
}

impl Action {
    /// Stable machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::FinishCompaction { .. } => "finish_compaction",
            Action::RemoveMarker { .. } => "remove_marker",
            Action::RemoveTempFile { .. } => "remove_temp_file",
            Action::RemoveOrphanIndex { .. } => "remove_orphan_index",
            Action::RebuildIndex { .. } => "rebuild_index",
            Action::CutTail { .. } => "cut_tail",
            Action::TrimSeal { .. } => "trim_seal",
            Action::RemoveNeverDurable { .. } => "remove_never_durable",
        }
    }

    /// The file the action is about.
    pub fn path(&self) -> &Path {
        match self {
            Action::FinishCompaction { marker_path, .. } => marker_path,
            Action::RemoveMarker { path, .. }
            | Action::RemoveTempFile { path, .. }
            | Action::RemoveOrphanIndex { path, .. } => path,
            Action::RebuildIndex { index, .. } => index,
            Action::CutTail { log, .. }
            | Action::TrimSeal { log, .. }
            | Action::RemoveNeverDurable { log, .. } => log,
        }
    }

    /// The byte range cut or removed, if any (`from..to`).
    pub fn byte_range(&self) -> Option<(u64, u64)> {
        match self {
            Action::RemoveMarker { bytes, .. }
            | Action::RemoveTempFile { bytes, .. }
            | Action::RemoveOrphanIndex { bytes, .. }
            | Action::RemoveNeverDurable { bytes, .. } => Some((0, *bytes)),
            Action::CutTail { from, to, .. } | Action::TrimSeal { from, to, .. } => {
                Some((*from, *to))
            }
            Action::FinishCompaction { .. } | Action::RebuildIndex { .. } => None,
        }
    }

    /// True for an action that may lose bytes a reader could once see (a cut or a
    /// removal of data), as opposed to derived or temporary files.
    pub fn removes_data(&self) -> bool {
        matches!(
            self,
            Action::CutTail { .. } | Action::TrimSeal { .. } | Action::RemoveNeverDurable { .. }
        )
    }

    /// One readable line; paths relative to `root`.
    pub fn describe(&self, root: &Path) -> String {
        let rel = |p: &Path| relative(root, p);
        match self {
            Action::FinishCompaction { marker_path, marker } => format!(
                "finish the compaction swap recorded in {}: new segment(s) {} replace {}",
                rel(marker_path),
                stems(&marker.new),
                stems(&marker.replaced)
            ),
            Action::RemoveMarker { path, bytes, reason } => {
                format!("remove {} ({bytes} bytes): {reason}", rel(path))
            }
            Action::RemoveTempFile { path, bytes, reason } => {
                format!("remove {} ({bytes} bytes): {reason}", rel(path))
            }
            Action::RemoveOrphanIndex { path, bytes } => format!(
                "remove {} ({bytes} bytes): index file without its .log",
                rel(path)
            ),
            Action::RebuildIndex {
                index,
                entries,
                reason,
                ..
            } => format!(
                "rebuild {} ({} entries, {} bytes): {reason}",
                rel(index),
                entries.len(),
                entries.len() * INDEX_ENTRY_LEN
            ),
            Action::CutTail {
                log,
                from,
                to,
                next_offset,
                records_cut,
                reason,
                ..
            } => format!(
                "cut {} bytes {from}..{to} ({} bytes, from where offset {next_offset} would start): {reason}{}",
                rel(log),
                to - from,
                records_cut.map_or_else(String::new, |r| format!(
                    "; {} valid record(s), offsets {}..={}, follow the damaged one and are cut with it",
                    r.count, r.first_offset, r.last_offset
                ))
            ),
            Action::TrimSeal {
                log,
                from,
                to,
                reason,
            } => format!(
                "cut {} bytes {from}..{to} ({} bytes): {reason}",
                rel(log),
                to - from
            ),
            Action::RemoveNeverDurable {
                log,
                index,
                base_offset,
                bytes,
                reason,
            } => format!(
                "remove {}{} ({bytes} bytes, base offset {base_offset}): {reason}",
                rel(log),
                index
                    .as_ref()
                    .map(|i| format!(" and {}", rel(i)))
                    .unwrap_or_default()
            ),
        }
    }
}

fn stems(bases: &[u64]) -> String {
    let v: Vec<String> = bases.iter().map(|&b| segment_stem(b)).collect();
    if v.is_empty() {
        "(none)".into()
    } else {
        v.join(", ")
    }
}

/// `path` relative to `root`, for reports.
pub fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Why recovery could not run or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("{}: cannot check partition: {source}", dir.display())]
    Check { dir: PathBuf, source: io::Error },
    #[error("{label}: {action} failed: {source}")]
    Action {
        label: String,
        action: String,
        source: io::Error,
    },
    #[error("{label}: {}: {detail}; planned again it still needs a compaction swap", path.display())]
    MarkerAgain {
        label: String,
        path: PathBuf,
        detail: String,
    },
}

/// One action done, with the backups made for it.
#[derive(Clone, Debug)]
pub struct ActionDone {
    pub action: Action,
    /// Files written to the backup directory before the action.
    pub backups: Vec<PathBuf>,
}

/// What recovery did to one partition.
#[derive(Clone, Debug)]
pub struct PartitionReport {
    pub label: String,
    pub dir: PathBuf,
    pub actions: Vec<ActionDone>,
    pub next_offset: u64,
    pub corrupt: Vec<Damage>,
    pub not_joined: Vec<Problem>,
    pub refuses_writes: bool,
}

impl PartitionReport {
    /// Nothing needs an operator.
    pub fn is_consistent(&self) -> bool {
        self.corrupt.is_empty() && self.not_joined.is_empty() && !self.refuses_writes
    }
}

/// What recovery did.
#[derive(Clone, Debug)]
pub struct RecoveryReport {
    pub root: PathBuf,
    pub partitions: Vec<PartitionReport>,
}

impl RecoveryReport {
    /// Every partition is consistent (no corruption remains).
    pub fn is_consistent(&self) -> bool {
        self.partitions.iter().all(PartitionReport::is_consistent)
    }

    /// Number of actions done.
    pub fn action_count(&self) -> usize {
        self.partitions.iter().map(|p| p.actions.len()).sum()
    }

    /// A human summary, one line per action and per problem left.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.partitions {
            for a in &p.actions {
                let mut line = format!("{}: {}", p.label, a.action.describe(&self.root));
                if !a.backups.is_empty() {
                    let names: Vec<String> =
                        a.backups.iter().map(|b| b.display().to_string()).collect();
                    line.push_str(&format!(" [backup: {}]", names.join(", ")));
                }
                out.push(line);
            }
            out.extend(damage_lines(
                &self.root,
                &p.label,
                &p.corrupt,
                &p.not_joined,
            ));
            if p.refuses_writes {
                out.push(format!(
                    "{}: the newest segment cannot be appended to; the partition takes no writes until an operator deals with it",
                    p.label
                ));
            }
        }
        if self.action_count() == 0 {
            out.push("nothing to do".into());
        }
        let remaining = self
            .partitions
            .iter()
            .filter(|p| !p.is_consistent())
            .count();
        if remaining > 0 {
            out.push(format!(
                "{remaining} partition(s) keep corruption that needs an operator"
            ));
        }
        out
    }
}

impl RecoveryPlan {
    /// Number of actions planned.
    pub fn action_count(&self) -> usize {
        self.partitions.iter().map(|p| p.actions.len()).sum()
    }

    /// The worst severity the check found, as `verify --quick` reports it.
    pub fn severity_before(&self) -> Option<Severity> {
        self.partitions
            .iter()
            .filter_map(|p| p.severity_before)
            .max()
    }

    /// A human summary of the plan.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.partitions {
            for a in &p.actions {
                out.push(format!("{}: would {}", p.label, a.describe(&self.root)));
            }
            if p.recheck_after_marker {
                out.push(format!(
                    "{}: then checks the partition again and plans the rest",
                    p.label
                ));
            }
            out.extend(damage_lines(
                &self.root,
                &p.label,
                &p.corrupt,
                &p.not_joined,
            ));
            if p.refuses_writes {
                out.push(format!(
                    "{}: the newest segment cannot be appended to; the partition would take no writes",
                    p.label
                ));
            }
        }
        if self.action_count() == 0 {
            out.push("nothing to do".into());
        }
        out
    }
}

fn damage_lines(
    root: &Path,
    label: &str,
    corrupt: &[Damage],
    not_joined: &[Problem],
) -> Vec<String> {
    let mut out = Vec::new();
    for d in corrupt {
        let bytes = d
            .bytes
            .map(|(f, t)| format!(" bytes {f}..{t} ({} bytes)", t - f))
            .unwrap_or_default();
        let offsets = match d.offsets {
            Some((a, Some(b))) if b >= a => format!(", offsets {a}..={b}"),
            Some((a, _)) => format!(", offsets from {a}"),
            None => String::new(),
        };
        out.push(format!(
            "{label}: left in place, cannot be read back: {}{bytes}{offsets}: {} ({})",
            relative(root, &d.problem.file),
            d.problem.detail,
            d.problem.kind
        ));
    }
    for p in not_joined {
        out.push(format!(
            "{label}: {}: {} ({}); nothing deleted",
            relative(root, &p.file),
            p.detail,
            p.kind
        ));
    }
    out
}

/// Plans recovery of every partition of `target`. Reads only.
pub fn plan(target: &Target) -> Result<RecoveryPlan, RecoveryError> {
    let mut partitions = Vec::with_capacity(target.partitions.len());
    for p in &target.partitions {
        partitions.push(plan_partition(p)?);
    }
    Ok(RecoveryPlan {
        root: target.root.clone(),
        partitions,
    })
}

/// Plans recovery of one partition from the quick check. Reads only.
pub fn plan_partition(p: &PartitionRef) -> Result<PartitionPlan, RecoveryError> {
    let mut check =
        check_partition(p, CheckMode::Quick).map_err(|source| RecoveryError::Check {
            dir: p.dir.clone(),
            source,
        })?;
    let removed = never_durable_newest(&check);
    let active = check.segments.len().checked_sub(removed + 1);
    if let Some(seg) = active.and_then(|i| check.segments.get_mut(i)) {
        if removed > 0 && !seg.active {
            // Step 2: the segment before the removed ones becomes the active one, and
            // is checked as such (scanned in full), exactly as the next start would.
            let files = seg.files.clone();
            *seg = check_segment(&files, true, CheckMode::Quick).map_err(|source| {
                RecoveryError::Check {
                    dir: p.dir.clone(),
                    source,
                }
            })?;
        }
    }
    let mut plan = plan_from_check(&check);
    for a in &mut plan.actions {
        if let Action::CutTail {
            log,
            from,
            to,
            kind: "torn_tail",
            records_cut,
            ..
        } = a
        {
            *records_cut =
                records_behind(log, *from, *to).map_err(|source| RecoveryError::Check {
                    dir: p.dir.clone(),
                    source,
                })?;
        }
    }
    Ok(plan)
}

/// The valid records of the segment's generation that follow the damaged record at
/// `from` (stepping over it by its claimed length), up to `to`.
fn records_behind(log: &Path, from: u64, to: u64) -> io::Result<Option<RecordsCut>> {
    let (file, len) = open_log(log)?;
    let Ok(header) = read_header(&file, len)? else {
        return Ok(None);
    };
    let mut len_field = [0u8; LEN_FIELD];
    let n = read_full_at(&file, &mut len_field, from)?;
    let Some(claimed) = claimed_encoded_len(len_field.get(..n).unwrap_or(&[])) else {
        return Ok(None);
    };
    let mut reader = RecordReader::new(&file, header.generation, from + claimed, to.min(len));
    let mut found: Option<RecordsCut> = None;
    while let Next::Record { record, .. } = reader.next_record()? {
        match &mut found {
            None => {
                found = Some(RecordsCut {
                    first_offset: record.offset,
                    last_offset: record.offset,
                    count: 1,
                })
            }
            Some(r) if record.offset > r.last_offset => {
                r.last_offset = record.offset;
                r.count += 1;
            }
            Some(_) => break,
        }
    }
    Ok(found)
}

/// How many of the newest segments never became durable (a header shorter than 32
/// bytes or all zero), counted from the newest while that holds.
fn never_durable_newest(check: &PartitionCheck) -> usize {
    if check.partition.only_segment.is_some() {
        return 0;
    }
    let newest_is_active = check.segments.last().is_some_and(|s| s.active);
    if !newest_is_active {
        return 0;
    }
    check
        .segments
        .iter()
        .rev()
        .take_while(|s| never_durable_header(&s.header))
        .count()
}

/// A header that shows the segment never became durable: shorter than 32 bytes, all
/// zero, or still that of an unassigned spare (docs/FORMAT.md, Spares rule 3: the header
/// naming the segment's base is made durable before any record in it is
/// acknowledged).
fn never_durable_header(header: &Result<SegmentHeader, HeaderError>) -> bool {
    match header {
        Err(HeaderError::Short { .. } | HeaderError::AllZero) => true,
        Ok(h) => h.is_spare(),
        Err(_) => false,
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Builds the plan for one partition from its check (docs/FORMAT.md, Recovery). The
/// segment that becomes active after step 2 must have been checked as active.
fn plan_from_check(check: &PartitionCheck) -> PartitionPlan {
    let p = &check.partition;
    let mut plan = PartitionPlan {
        partition: p.clone(),
        label: p.label(),
        dir: p.dir.clone(),
        actions: Vec::new(),
        next_offset: 0,
        corrupt: Vec::new(),
        not_joined: Vec::new(),
        refuses_writes: false,
        recheck_after_marker: false,
        severity_before: check.severity(),
    };

    // Step 1.
    if plan_marker_and_temp_files(check, &mut plan) {
        // What the swap leaves is planned after it is finished.
        plan.recheck_after_marker = true;
        plan.next_offset = check.next_offset().unwrap_or(0);
        return plan;
    }

    // Step 2: newest segments that never became durable are removed, newest first;
    // the one before becomes the active segment.
    let segs = &check.segments;
    let kept = segs.len() - never_durable_newest(check);
    for seg in segs.iter().skip(kept).rev() {
        let why = match &seg.header {
            Err(e) => e.to_string(),
            Ok(h) => format!(
                "the header still marks an unassigned spare (base_offset {}, generation {})",
                h.base_offset, h.generation
            ),
        };
        let reason = format!(
            "{why}: the newest segment never became durable, no record in it was acknowledged"
        );
        plan.actions.push(Action::RemoveNeverDurable {
            log: seg.files.log.clone(),
            index: seg.files.index.exists().then(|| seg.files.index.clone()),
            base_offset: seg.base_offset(),
            bytes: seg.file_len,
            reason,
        });
    }

    // Steps 3 and 4, per remaining segment; step 6 on the way.
    let kept_segs = segs.get(..kept).unwrap_or(&[]);
    let mut next_offset = 0u64;
    for (i, seg) in kept_segs.iter().enumerate() {
        let is_active = i + 1 == kept_segs.len();
        if is_active {
            next_offset = next_offset.max(seg.base_offset());
        }
        if let Some(last) = seg.last_offset {
            // A record at u64::MAX (only a damaged or crafted file holds one) leaves no
            // offset to append at.
            plan.refuses_writes |= last == u64::MAX;
            next_offset = next_offset.max(last.saturating_add(1));
        }
        let next_first = kept_segs
            .get(i + 1)
            .map(|s| s.first_offset.unwrap_or(s.base_offset()));
        plan_segment(seg, is_active, next_first, &mut plan);
    }

    // Step 5: segments that do not join up are reported.
    plan.not_joined = check
        .problems
        .iter()
        .filter(|pr| pr.severity == Severity::Corrupt)
        .cloned()
        .collect();

    // Step 6.
    plan.next_offset = next_offset;
    plan
}

/// Step 1 without a marker to finish: temporary files (and an unparseable marker)
/// and orphan indexes are removed. Returns true when a marker parses: its swap is
/// finished first and the rest planned after it.
fn plan_marker_and_temp_files(check: &PartitionCheck, plan: &mut PartitionPlan) -> bool {
    let temp_reason = match &check.marker {
        Some((path, Ok(marker))) => {
            plan.actions.push(Action::FinishCompaction {
                marker_path: path.clone(),
                marker: marker.clone(),
            });
            return true;
        }
        Some(_) => "temporary file of a compaction swap that never started",
        None => "leftover temporary file with no compaction marker",
    };
    for tmp in &check.temp_files {
        plan.actions.push(Action::RemoveTempFile {
            path: tmp.clone(),
            bytes: file_len(tmp),
            reason: temp_reason.into(),
        });
    }
    // The marker after its temporary files: a crash in between leaves a marker that
    // still does not parse, so the next run ends the same way.
    if let Some((path, Err(e))) = &check.marker {
        plan.actions.push(Action::RemoveMarker {
            path: path.clone(),
            bytes: file_len(path),
            reason: format!("{e}: the swap never started"),
        });
    }
    for idx in &check.orphan_indexes {
        plan.actions.push(Action::RemoveOrphanIndex {
            path: idx.clone(),
            bytes: file_len(idx),
        });
    }
    false
}

/// Steps 3 and 4 for one segment that stays. `next_first` is the first offset of the
/// segment after it, if any.
fn plan_segment(
    seg: &SegmentCheck,
    is_active: bool,
    next_first: Option<u64>,
    plan: &mut PartitionPlan,
) {
    let lost_to = next_first.map(|n| n.saturating_sub(1));
    let header_ok = matches!(&seg.header, Ok(h) if h.base_offset == seg.base_offset());
    if !header_ok {
        // An invalid header (other than never durable on the newest): left in place.
        for pr in seg
            .problems
            .iter()
            .filter(|pr| pr.severity == Severity::Corrupt)
        {
            plan.corrupt.push(Damage {
                problem: pr.clone(),
                bytes: Some((0, seg.file_len)),
                offsets: Some((seg.base_offset(), lost_to)),
            });
        }
        plan.refuses_writes |= is_active;
        return;
    }
    let Some(scan) = &seg.scan else {
        // Trusted by its index: nothing to do.
        return;
    };
    if let Some(end) = scan.end.position() {
        let tail_problem = seg
            .problems
            .iter()
            .find(|pr| pr.file == seg.files.log && pr.position == Some(end));
        let kind = tail_problem.map_or("tail", |pr| pr.kind);
        let next_offset = seg
            .last_offset
            .map_or(seg.base_offset(), |o| o.saturating_add(1));
        if seg.active {
            let reason = match kind {
                "torn_tail" => format!("{}; never acknowledged", scan.end.detail()),
                "zero_tail" => "unwritten (zero) bytes after the data".to_string(),
                "stale_tail" => "records of an older generation after the data".to_string(),
                _ => scan.end.detail(),
            };
            plan.actions.push(Action::CutTail {
                log: seg.files.log.clone(),
                from: end,
                to: seg.file_len,
                next_offset,
                kind,
                records_cut: None,
                reason,
            });
        } else if kind == "unfinished_seal" {
            plan.actions.push(Action::TrimSeal {
                log: seg.files.log.clone(),
                from: end,
                to: seg.file_len,
                reason: tail_problem.map_or_else(String::new, |pr| pr.detail.clone()),
            });
        } else {
            for pr in seg
                .problems
                .iter()
                .filter(|pr| pr.severity == Severity::Corrupt)
            {
                plan.corrupt.push(Damage {
                    problem: pr.clone(),
                    bytes: Some((end, seg.file_len)),
                    offsets: Some((next_offset, lost_to)),
                });
            }
            // Records appended after unreadable bytes could never be read back.
            plan.refuses_writes |= is_active;
        }
    }
    let reason = match &seg.index {
        IndexState::Missing => Some("the index is missing".to_string()),
        IndexState::Invalid(e) => Some(e.to_string()),
        IndexState::Valid | IndexState::NotChecked => None,
    };
    if let Some(reason) = reason {
        plan.actions.push(Action::RebuildIndex {
            log: seg.files.log.clone(),
            index: seg.files.index.clone(),
            base_offset: seg.base_offset(),
            entries: scan.index.clone(),
            reason,
        });
    }
}

/// Where backups go: `<backup_dir>/<path relative to root>`, byte ranges as
/// `<file>.bytes-<from>-<to>`.
#[derive(Debug, Clone, Copy)]
pub struct Backup<'a> {
    pub dir: &'a Path,
    pub root: &'a Path,
}

impl Backup<'_> {
    fn target_for(&self, src: &Path, suffix: &str) -> PathBuf {
        let rel = src
            .strip_prefix(self.root)
            .unwrap_or_else(|_| Path::new(src.file_name().unwrap_or(src.as_os_str())));
        let mut name = rel.as_os_str().to_os_string();
        name.push(suffix);
        self.dir.join(name)
    }

    /// Copies `src[from..to]` into the backup directory and fsyncs it (file and
    /// directories); returns the backup's path.
    pub fn copy(
        &self,
        storage: &dyn Storage,
        src: &Path,
        from: u64,
        to: u64,
        whole: bool,
    ) -> io::Result<PathBuf> {
        let suffix = if whole {
            String::new()
        } else {
            format!(".bytes-{from}-{to}")
        };
        let want = self.target_for(src, &suffix);
        let parent = want.parent().unwrap_or(self.dir).to_path_buf();
        // 1. the directories, each made durable in its parent (the backup
        //    directory's own entry included).
        storage.create_dir_all(&parent)?;
        let mut d = parent.as_path();
        loop {
            storage.sync_dir(d)?;
            if d == self.dir {
                if let Some(up) = d.parent().filter(|u| !u.as_os_str().is_empty()) {
                    storage.sync_dir(up)?;
                }
                break;
            }
            match d.parent() {
                Some(up) if up.starts_with(self.dir) => d = up,
                _ => break,
            }
        }
        // 2. a name not taken yet (an earlier interrupted run may have made one).
        let mut path = want.clone();
        let mut n = 0u32;
        let out = loop {
            match storage.create(&path) {
                Ok(f) => break f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < BACKUP_NAME_TRIES_MAX => {
                    n += 1;
                    let mut s = want.as_os_str().to_os_string();
                    s.push(format!(".{n}"));
                    path = PathBuf::from(s);
                }
                Err(e) => return Err(e),
            }
        };
        // 3. the bytes.
        let file = File::open(src)?;
        let mut buf = vec![0u8; BACKUP_CHUNK_BYTES];
        let mut pos = from;
        while pos < to {
            let want_len = usize::try_from((to - pos).min(BACKUP_CHUNK_BYTES as u64))
                .unwrap_or(BACKUP_CHUNK_BYTES);
            let chunk = buf.get_mut(..want_len).unwrap_or(&mut []);
            let n = read_full_at(&file, chunk, pos)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: ends at {pos}, before {to}", src.display()),
                ));
            }
            out.write_at(chunk.get(..n).unwrap_or(&[]), pos - from)?;
            pos += n as u64;
        }
        // 4. the file, then its directory entry.
        out.sync_all()?;
        storage.sync_dir(&parent)?;
        Ok(path)
    }
}

/// What finishing a compaction marker did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkerFinish {
    /// Temporary files renamed into place (`from`, `to`).
    pub renamed: Vec<(PathBuf, PathBuf)>,
    /// Replaced segment files deleted.
    pub removed: Vec<PathBuf>,
    /// Files copied to the backup directory first.
    pub backups: Vec<PathBuf>,
}

/// Finishes the compaction swap `marker` records in `partition_dir` (docs/FORMAT.md,
/// Compaction). Idempotent: a crash at any point is finished by calling it again.
pub fn finish_compaction_marker(
    storage: &dyn Storage,
    partition_dir: &Path,
    marker: &CompactionMarker,
) -> io::Result<MarkerFinish> {
    finish_marker_with(storage, partition_dir, marker, None)
}

fn exists(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn finish_marker_with(
    storage: &dyn Storage,
    dir: &Path,
    marker: &CompactionMarker,
    backup: Option<Backup<'_>>,
) -> io::Result<MarkerFinish> {
    let mut out = MarkerFinish::default();
    // Before anything is renamed: every new segment's log must be somewhere, or
    // deleting the replaced ones would lose their records.
    for &n in &marker.new {
        let log = dir.join(log_file_name(n));
        let tmp = tmp_path(&log);
        if !exists(&tmp)? && !exists(&log)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "compaction marker in {} names new segment {} but neither {} nor its .tmp exists; nothing done",
                    dir.display(),
                    segment_stem(n),
                    log.display()
                ),
            ));
        }
    }
    // 1. rename what is still temporary (log first, then its index).
    for &n in &marker.new {
        for name in [log_file_name(n), index_file_name(n)] {
            let to = dir.join(name);
            let from = tmp_path(&to);
            if !exists(&from)? {
                continue;
            }
            if let Some(b) = backup {
                if exists(&to)? {
                    out.backups
                        .push(b.copy(storage, &to, 0, file_len(&to), true)?);
                }
            }
            storage.rename(&from, &to)?;
            out.renamed.push((from, to));
        }
    }
    // 2. delete what is still replaced and not new.
    for &r in marker.replaced.iter().filter(|r| !marker.new.contains(r)) {
        for name in [index_file_name(r), log_file_name(r)] {
            let path = dir.join(name);
            if !exists(&path)? {
                continue;
            }
            if let Some(b) = backup {
                out.backups
                    .push(b.copy(storage, &path, 0, file_len(&path), true)?);
            }
            storage.remove_file(&path)?;
            out.removed.push(path);
        }
    }
    // 3. fsync the directory: renames and deletions are durable.
    storage.sync_dir(dir)?;
    // 4. delete the marker.
    let marker_path = dir.join(crate::format::names::COMPACTION_MARKER);
    if exists(&marker_path)? {
        storage.remove_file(&marker_path)?;
    }
    // 5. fsync the directory.
    storage.sync_dir(dir)?;
    Ok(out)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(TMP_SUFFIX);
    PathBuf::from(s)
}

/// Executes a plan. With `backup_dir`, every byte range cut and every file removed is
/// copied there first and fsynced. Stops at the first failure (nothing after it is
/// attempted); running recovery again finishes the work.
pub fn execute(
    storage: &dyn Storage,
    plan: &RecoveryPlan,
    backup_dir: Option<&Path>,
) -> Result<RecoveryReport, RecoveryError> {
    let backup = backup_dir.map(|dir| Backup {
        dir,
        root: &plan.root,
    });
    let mut partitions = Vec::with_capacity(plan.partitions.len());
    for pp in &plan.partitions {
        partitions.push(execute_partition(storage, pp, backup)?);
    }
    Ok(RecoveryReport {
        root: plan.root.clone(),
        partitions,
    })
}

fn execute_partition(
    storage: &dyn Storage,
    pp: &PartitionPlan,
    backup: Option<Backup<'_>>,
) -> Result<PartitionReport, RecoveryError> {
    let mut done = Vec::new();
    for a in &pp.actions {
        done.push(run_action(storage, pp, a, backup)?);
    }
    let mut last = pp.clone();
    if pp.recheck_after_marker {
        // Step 1, continued: check again what the finished swap left.
        let again = plan_partition(&pp.partition)?;
        if let Some(Action::FinishCompaction { marker_path, .. }) = again.actions.first() {
            return Err(RecoveryError::MarkerAgain {
                label: pp.label.clone(),
                path: marker_path.clone(),
                detail: "the marker is still there after the swap was finished".into(),
            });
        }
        for a in &again.actions {
            done.push(run_action(storage, &again, a, backup)?);
        }
        last = again;
    }
    Ok(PartitionReport {
        label: last.label,
        dir: last.dir,
        actions: done,
        next_offset: last.next_offset,
        corrupt: last.corrupt,
        not_joined: last.not_joined,
        refuses_writes: last.refuses_writes,
    })
}

fn run_action(
    storage: &dyn Storage,
    pp: &PartitionPlan,
    action: &Action,
    backup: Option<Backup<'_>>,
) -> Result<ActionDone, RecoveryError> {
    let wrap = |source: io::Error| RecoveryError::Action {
        label: pp.label.clone(),
        action: format!("{} {}", action.kind(), action.path().display()),
        source,
    };
    let mut backups = Vec::new();
    match action {
        Action::FinishCompaction { marker, .. } => {
            let f = finish_marker_with(storage, &pp.dir, marker, backup).map_err(wrap)?;
            backups = f.backups;
        }
        Action::RemoveMarker { path, .. }
        | Action::RemoveTempFile { path, .. }
        | Action::RemoveOrphanIndex { path, .. } => {
            remove_files(storage, &pp.dir, &[path.as_path()], backup, &mut backups)
                .map_err(wrap)?;
        }
        Action::RemoveNeverDurable { log, index, .. } => {
            // The index first: a crash in between leaves the log, removed next time.
            let mut files: Vec<&Path> = Vec::new();
            if let Some(i) = index {
                files.push(i);
            }
            files.push(log);
            remove_files(storage, &pp.dir, &files, backup, &mut backups).map_err(wrap)?;
        }
        Action::CutTail { log, from, to, .. } | Action::TrimSeal { log, from, to, .. } => {
            cut(storage, log, *from, *to, backup, &mut backups).map_err(wrap)?;
        }
        Action::RebuildIndex {
            log,
            index,
            base_offset,
            entries,
            ..
        } => {
            let files = SegmentFiles {
                base_offset: *base_offset,
                log: log.clone(),
                index: index.clone(),
                has_index: true,
            };
            write_index(storage, &files, &index_bytes(entries)).map_err(wrap)?;
        }
    }
    Ok(ActionDone {
        action: action.clone(),
        backups,
    })
}

/// Removes files (each backed up first, if asked), then fsyncs the directory.
/// A file already gone counts as removed (an earlier run got that far).
fn remove_files(
    storage: &dyn Storage,
    dir: &Path,
    files: &[&Path],
    backup: Option<Backup<'_>>,
    backups: &mut Vec<PathBuf>,
) -> io::Result<()> {
    for &path in files {
        if !exists(path)? {
            continue;
        }
        // 1. backup, fsynced.
        if let Some(b) = backup {
            backups.push(b.copy(storage, path, 0, file_len(path), true)?);
        }
        // 2. remove.
        storage.remove_file(path)?;
    }
    // 3. the removals durable.
    storage.sync_dir(dir)
}

/// Cuts `log` at `from` (its length must still be `to`): backup of `from..to` if
/// asked, `set_len`, then `sync_all` before anything else may append.
fn cut(
    storage: &dyn Storage,
    log: &Path,
    from: u64,
    to: u64,
    backup: Option<Backup<'_>>,
    backups: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let f = storage.open(log)?;
    let len = f.len()?;
    if len == from {
        // Cut by an earlier run whose fsync may not have happened: fsync again.
        return f.sync_all();
    }
    if len != to {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {len} bytes, not the {to} bytes it had when the cut was planned; nothing cut",
                log.display()
            ),
        ));
    }
    // 1. backup of the range, fsynced.
    if let Some(b) = backup {
        backups.push(b.copy(storage, log, from, to, false)?);
    }
    // 2. truncate.
    if !super::planted::SKIP_TORN_TAIL_TRUNCATE.load(std::sync::atomic::Ordering::Relaxed) {
        f.set_len(from)?;
    }
    // 3. fsync: the cut is durable before anything new is appended.
    f.sync_all()
}

/// Plans and executes recovery on a whole data directory (the broker's startup; the
/// caller holds `DATA/LOCK`).
pub fn recover(storage: &dyn Storage, data_dir: &Path) -> Result<RecoveryReport, RecoveryError> {
    let target = resolve(data_dir)?;
    let plan = plan(&target)?;
    execute(storage, &plan, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::io::RealStorage;
    use crate::format::{encode_record, SegmentHeader};

    fn segment(base: u64, n: u64) -> (Vec<u8>, Vec<u8>) {
        let mut log = SegmentHeader::new(base).encode().to_vec();
        let mut b = crate::format::IndexBuilder::new();
        let mut idx = Vec::new();
        for o in base..base + n {
            let pos = log.len() as u64;
            encode_record(&mut log, o, 0, None, &[7u8; 300], 0).unwrap();
            if let Some(e) = b.observe(base, o, pos) {
                e.encode_into(&mut idx);
            }
        }
        (log, idx)
    }

    #[test]
    fn marker_finish_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (old0, old0i) = segment(0, 10);
        let (old1, old1i) = segment(10, 10);
        let (new0, new0i) = segment(0, 20);
        std::fs::write(d.join(log_file_name(0)), &old0).unwrap();
        std::fs::write(d.join(index_file_name(0)), &old0i).unwrap();
        std::fs::write(d.join(log_file_name(10)), &old1).unwrap();
        std::fs::write(d.join(index_file_name(10)), &old1i).unwrap();
        std::fs::write(d.join(format!("{}.tmp", log_file_name(0))), &new0).unwrap();
        std::fs::write(d.join(format!("{}.tmp", index_file_name(0))), &new0i).unwrap();
        let m = CompactionMarker {
            new: vec![0],
            replaced: vec![0, 10],
        };
        std::fs::write(d.join("compaction.marker"), m.encode()).unwrap();
        let f = finish_compaction_marker(&RealStorage, d, &m).unwrap();
        assert_eq!(f.renamed.len(), 2);
        assert_eq!(f.removed.len(), 2);
        let again = finish_compaction_marker(&RealStorage, d, &m).unwrap();
        assert_eq!(again, MarkerFinish::default());
        let mut names: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, vec![index_file_name(0), log_file_name(0)]);
        assert_eq!(std::fs::read(d.join(log_file_name(0))).unwrap(), new0);
    }

    #[test]
    fn marker_naming_a_missing_new_segment_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (old0, _) = segment(0, 10);
        std::fs::write(d.join(log_file_name(5)), &old0).unwrap();
        let m = CompactionMarker {
            new: vec![0],
            replaced: vec![5],
        };
        assert!(finish_compaction_marker(&RealStorage, d, &m).is_err());
        assert!(d.join(log_file_name(5)).exists());
    }
}
