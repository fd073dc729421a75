//! Rebuilding index files from their logs.
//!
//! An index is derived data: the rule in docs/FORMAT.md (an entry for the first record,
//! then one for each record at least 4 KiB past the previous entry) gives exactly one
//! index for a log, so a rebuilt index is byte-identical to the one the writer made.
//! The plan comes from the shared partition check ([`crate::engine::maintenance::check`]); every write
//! goes through the I/O seam.
//!
//! Invariants:
//! - a segment whose header is unreadable gets no index (there is nothing to build
//!   it from); its old index, if any, is left alone;
//! - a corrupt sealed segment gets the index of its readable records only;
//! - a partition with a `compaction.marker` is not touched: its `.index.tmp` files
//!   belong to the unfinished swap, which `recover` finishes first.

use std::io;
use std::path::{Path, PathBuf};

use crate::format::index::{IndexEntry, IndexError};
use crate::format::names::COMPACTION_MARKER;

use crate::engine::maintenance::check::{
    check_partition_with, read_index_bytes, CheckMode, IndexState, PartitionCheck, ProblemKind,
    SegmentCheck,
};
use crate::engine::storage::io::Storage;
use crate::engine::storage::layout::{list_partition, PartitionRef, SegmentFiles};

/// Why an index is (re)written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No index file.
    Missing,
    /// The index file is not what the rule gives for the log.
    Invalid(IndexError),
    /// Valid, rewritten because every index was asked for (`--all`).
    Forced,
}

impl Reason {
    /// Stable machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::Missing => ProblemKind::MissingIndex.as_str(),
            Reason::Invalid(e) => ProblemKind::of_index_error(e).as_str(),
            Reason::Forced => "forced",
        }
    }

    /// One-line description.
    pub fn detail(&self) -> String {
        match self {
            Reason::Missing => "index file is missing".to_string(),
            Reason::Invalid(e) => e.to_string(),
            Reason::Forced => "index is valid; rewritten on request".to_string(),
        }
    }
}

/// What happens to one segment's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The index is valid and was not asked for.
    Keep,
    /// The index is (re)written with `bytes`.
    Write {
        reason: Reason,
        /// The rule's index for the segment's readable records.
        bytes: Vec<u8>,
        /// True when the segment has unreadable records: the index covers only the
        /// records before them.
        readable_only: bool,
    },
    /// The header is unreadable: there is nothing to build an index from.
    SkipBadHeader,
}

/// The plan for one segment.
#[derive(Clone, Debug)]
pub struct SegmentPlan {
    pub files: SegmentFiles,
    pub active: bool,
    /// Records the index covers (the readable ones).
    pub records: u64,
    /// Position just past the last readable record.
    pub data_end: u64,
    pub action: Action,
    /// Carrying out the action changes the index file (a forced rewrite of a valid
    /// index changes nothing, except on a corrupt segment whose old index has entries
    /// past the readable records).
    changes: bool,
    /// Entries in the index after the plan: the valid one kept, or the one written
    /// (0 when no index can be built).
    entries: usize,
}

impl SegmentPlan {
    /// True when carrying out the plan changes the index file's bytes.
    pub fn changes_file(&self) -> bool {
        self.changes
    }

    /// Entries in the index after the plan (kept or written).
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Frees the index bytes once written (the plan stays as a report).
    pub fn release_bytes(&mut self) {
        if let Action::Write { bytes, .. } = &mut self.action {
            *bytes = Vec::new();
        }
    }
}

/// The plan for one partition.
#[derive(Clone, Debug)]
pub struct PartitionPlan {
    pub dir: PathBuf,
    /// Set when the partition is left alone, with the reason.
    pub blocked: Option<String>,
    pub segments: Vec<SegmentPlan>,
}

/// The bytes of an index made of `entries`.
pub fn index_bytes(entries: &[IndexEntry]) -> Vec<u8> {
    crate::format::encode_index(entries)
}

fn plan_segment(seg: &SegmentCheck, all: bool) -> io::Result<SegmentPlan> {
    let mut plan = SegmentPlan {
        files: seg.files.clone(),
        active: seg.active,
        records: seg.records.unwrap_or(0),
        data_end: seg.data_end,
        action: Action::Keep,
        changes: false,
        entries: 0,
    };
    let Some(scan) = &seg.scan else {
        // No full scan: the header is unreadable (a check in full mode scans every
        // segment whose header decodes).
        plan.action = Action::SkipBadHeader;
        return Ok(plan);
    };
    let reason = match &seg.index {
        IndexState::Missing => Reason::Missing,
        IndexState::Invalid(e) => Reason::Invalid(e.clone()),
        IndexState::Valid if all => Reason::Forced,
        IndexState::Valid => {
            // A valid index has exactly the entries the scan derives.
            plan.entries = scan.index.len();
            return Ok(plan);
        }
        IndexState::NotChecked => {
            plan.action = Action::SkipBadHeader;
            return Ok(plan);
        }
    };
    let bytes = index_bytes(&scan.index);
    plan.entries = scan.index.len();
    plan.changes = match reason {
        Reason::Forced => !matches!(read_index_bytes(&seg.files.index)?, Some(Ok(b)) if b == bytes),
        Reason::Missing | Reason::Invalid(_) => true,
    };
    plan.action = Action::Write {
        reason,
        bytes,
        readable_only: seg.is_corrupt(),
    };
    Ok(plan)
}

/// Plans the rebuild of a partition from a full check
/// ([`crate::engine::maintenance::check::CheckMode::Full`]): every missing or invalid index, or every
/// index with `all`.
/// Reads the current index files of forced rewrites, to tell whether they change.
pub fn plan_partition(check: &PartitionCheck, all: bool) -> io::Result<PartitionPlan> {
    let blocked = check.marker.as_ref().map(|_| blocked_reason());
    let segments = if blocked.is_some() {
        Vec::new()
    } else {
        check
            .segments
            .iter()
            .map(|s| plan_segment(s, all))
            .collect::<io::Result<_>>()?
    };
    Ok(PartitionPlan {
        dir: check.partition.dir.clone(),
        blocked,
        segments,
    })
}

/// Temporary name an index is written under before it is renamed into place.
pub fn temp_path(files: &SegmentFiles) -> PathBuf {
    let mut name = files
        .index
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_default();
    name.push(crate::format::names::TMP_SUFFIX);
    files.index.with_file_name(name)
}

/// Replaces a segment's index with `bytes`, crash-safely: a crash leaves the old
/// index or the new one, never a mix (and at worst a `.index.tmp` that the check
/// reports and recovery removes).
pub fn write_index(storage: &dyn Storage, files: &SegmentFiles, bytes: &[u8]) -> io::Result<()> {
    let tmp = temp_path(files);
    let dir = files.index.parent().unwrap_or(Path::new("."));
    // 0. A directory or other special file where the index belongs is never removed
    //    (it may hold anything): the operator moves it away.
    if let Ok(meta) = std::fs::symlink_metadata(&files.index) {
        if !meta.file_type().is_file() {
            let what = if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the index is {what}; move it away and run again"),
            ));
        }
    }
    // 1. Remove a temporary file a crashed rebuild left (no marker owns it: callers
    //    skip partitions with a compaction marker).
    if tmp.exists() {
        storage.remove_file(&tmp)?;
    }
    let result = (|| {
        // 2. Write the new index under the temporary name.
        let f = storage.create(&tmp)?;
        f.write_at(bytes, 0)?;
        // 3. fsync it, so the rename can never expose a file with missing bytes.
        f.sync_all()?;
        drop(f);
        // 4. Rename it over the old index (atomic replace).
        storage.rename(&tmp, &files.index)?;
        // 5. fsync the directory, making the rename durable.
        storage.sync_dir(dir)
    })();
    if result.is_err() && tmp.exists() {
        let _ = storage.remove_file(&tmp);
    }
    result
}

/// Carries out a plan: writes every planned index. Returns the segments written.
pub fn apply(storage: &dyn Storage, plan: &PartitionPlan) -> io::Result<usize> {
    let mut written = 0;
    for seg in &plan.segments {
        written += usize::from(apply_segment(storage, seg)?);
    }
    Ok(written)
}

/// Writes one segment's planned index, if the plan writes one.
fn apply_segment(storage: &dyn Storage, seg: &SegmentPlan) -> io::Result<bool> {
    let Action::Write { bytes, .. } = &seg.action else {
        return Ok(false);
    };
    write_index(storage, &seg.files, bytes).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("rewriting {}: {e}", seg.files.index.display()),
        )
    })?;
    Ok(true)
}

/// Checks a partition in full and rebuilds its indexes segment by segment (with
/// `write`; without it only plans), so memory holds one segment's index at a time
/// whatever the partition's size. Returns the plan as a report, index bytes freed.
pub fn reindex_partition(
    storage: &dyn Storage,
    p: &PartitionRef,
    all: bool,
    write: bool,
) -> io::Result<PartitionPlan> {
    let mut out = PartitionPlan {
        dir: p.dir.clone(),
        blocked: None,
        segments: Vec::new(),
    };
    if list_partition(&p.dir)?.marker.is_some() {
        out.blocked = Some(blocked_reason());
        return Ok(out);
    }
    let mut failed: Option<io::Error> = None;
    let check = check_partition_with(p, CheckMode::Full, &mut |seg| {
        if failed.is_some() {
            return;
        }
        let step = plan_segment(seg, all).and_then(|mut plan| {
            if write {
                apply_segment(storage, &plan)?;
            }
            plan.release_bytes();
            Ok(plan)
        });
        match step {
            Ok(plan) => out.segments.push(plan),
            Err(e) => failed = Some(e),
        }
        seg.release_scan_index();
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    if check.marker.is_some() {
        // Appeared while reading (nothing else should write here: the caller holds
        // the lock when it writes).
        out.blocked = Some(blocked_reason());
    }
    Ok(out)
}

fn blocked_reason() -> String {
    format!(
        "{COMPACTION_MARKER} is present: an unfinished compaction owns the temporary files here; run `seglog recover` first"
    )
}

#[cfg(all(test, feature = "testkit"))]
mod tests {
    use super::*;
    use crate::engine::maintenance::check::{check_partition, CheckMode};
    use crate::engine::storage::io::RealStorage;
    use crate::engine::storage::layout::resolve;
    use crate::format::{encode_record, SegmentHeader};
    use crate::testkit::storage::{FailOn, FailingStorage};
    use std::fs;
    use std::sync::Arc;

    /// A partition of two segments with valid indexes, written by hand.
    fn partition(dir: &Path) {
        let mut off = 0u64;
        for base in [0u64, 60] {
            let mut log = SegmentHeader::new(base).encode().to_vec();
            let mut b = crate::format::IndexBuilder::new();
            let mut idx = Vec::new();
            while off < base + 60 {
                let pos = log.len() as u64;
                if let Some(e) = b.observe(base, off, pos) {
                    e.encode_into(&mut idx);
                }
                encode_record(&mut log, off, off as i64, Some(b"k"), &[b'v'; 200], 0).unwrap();
                off += 1;
            }
            fs::write(dir.join(crate::format::names::log_file_name(base)), &log).unwrap();
            fs::write(dir.join(crate::format::names::index_file_name(base)), &idx).unwrap();
        }
    }

    fn plan(dir: &Path, all: bool) -> PartitionPlan {
        let t = resolve(dir).unwrap();
        let c = check_partition(&t.partitions[0], CheckMode::Full).unwrap();
        plan_partition(&c, all).unwrap()
    }

    #[test]
    fn rebuilds_missing_and_wrong_indexes_byte_identical() {
        let d = tempfile::tempdir().unwrap();
        partition(d.path());
        let idx0 = d.path().join("00000000000000000000.index");
        let idx1 = d.path().join("00000000000000000060.index");
        let want0 = fs::read(&idx0).unwrap();
        let want1 = fs::read(&idx1).unwrap();
        assert!(want0.len() >= 32, "the test needs 2+ entries");
        assert!(plan(d.path(), false)
            .segments
            .iter()
            .all(|s| s.action == Action::Keep));
        fs::remove_file(&idx0).unwrap();
        let mut bad = want1.clone();
        bad[20] ^= 1;
        fs::write(&idx1, &bad).unwrap();
        let p = plan(d.path(), false);
        assert!(p.segments.iter().all(SegmentPlan::changes_file));
        assert_eq!(apply(&RealStorage, &p).unwrap(), 2);
        assert_eq!(fs::read(&idx0).unwrap(), want0);
        assert_eq!(fs::read(&idx1).unwrap(), want1);
        assert_eq!(
            fs::read_dir(d.path()).unwrap().count(),
            4,
            "no temp file left"
        );
        let p = plan(d.path(), true);
        assert!(p
            .segments
            .iter()
            .all(|s| !s.changes_file() && s.entries() > 0));
    }

    #[test]
    fn streaming_rebuild_matches_the_plan() {
        let d = tempfile::tempdir().unwrap();
        partition(d.path());
        let idx0 = d.path().join("00000000000000000000.index");
        let want = fs::read(&idx0).unwrap();
        fs::remove_file(&idx0).unwrap();
        let t = resolve(d.path()).unwrap();
        let p = reindex_partition(&RealStorage, &t.partitions[0], false, false).unwrap();
        assert!(
            p.segments[0].changes_file() && !idx0.exists(),
            "planning writes nothing"
        );
        let p = reindex_partition(&RealStorage, &t.partitions[0], false, true).unwrap();
        assert_eq!(p.segments[0].entries(), want.len() / 16);
        assert_eq!(fs::read(&idx0).unwrap(), want);
        // A failure stops the rebuild and is returned.
        fs::remove_file(&idx0).unwrap();
        let s = FailingStorage::new(Arc::new(RealStorage), 1, FailOn::Any, false);
        assert!(reindex_partition(&s, &t.partitions[0], false, true).is_err());
    }

    #[test]
    fn a_failed_step_leaves_the_old_index_or_the_new_one() {
        let d = tempfile::tempdir().unwrap();
        partition(d.path());
        let idx0 = d.path().join("00000000000000000000.index");
        let want = fs::read(&idx0).unwrap();
        fs::write(&idx0, b"junk").unwrap();
        // create, write, sync, rename, sync_dir: fail each in turn.
        for n in 1..=5 {
            let p = plan(d.path(), false);
            let s = FailingStorage::new(Arc::new(RealStorage), n, FailOn::Any, false);
            let r = apply(&s, &p);
            let now = fs::read(&idx0).unwrap();
            if r.is_err() {
                assert!(now == b"junk" || now == want, "step {n}: a mix");
                assert!(!temp_path(&p.segments[0].files).exists(), "step {n}");
            } else {
                assert_eq!(now, want);
            }
            fs::write(&idx0, b"junk").unwrap();
        }
    }
}
