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
//! 5. Segments that do not join up (an empty newest segment included) are reported;
//!    nothing is deleted or cut for it: the roll rule leaves no crash state with a
//!    gap, so a gap is always damage.
//! 6. The next offset follows the highest valid record.
//!
//! Invariants: nothing is removed or cut without an [`Action`] that names the file,
//! the byte range and the offsets; with a backup directory every such byte range and
//! file is copied there and fsynced first. Every action is idempotent, so a crash
//! during recovery is repaired by running it again.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::format::marker::CompactionMarker;
use crate::format::names::segment_stem;
use crate::format::{IndexEntry, INDEX_ENTRY_LEN};

use crate::engine::maintenance::check::{
    applied_entries_damaged, applied_records_damaged, check_partition, check_segment,
    data_applied_next, never_durable_header, raft_applied_index, CheckMode, IndexState,
    PartitionCheck, Problem, ProblemKind, SegmentCheck, Severity, RECORDS_BEHIND_MAY_BE,
};
use crate::engine::maintenance::reindex::{index_bytes, write_index};
use crate::engine::storage::io::Storage;
use crate::engine::storage::layout::{resolve, LayoutError, PartitionRef, SegmentFiles, Target};
use crate::engine::storage::reader::ScanEnd;

mod execute;
mod plan;
mod topic;

pub use crate::engine::maintenance::backup::Backup;
use crate::engine::maintenance::compaction::swap::finish_marker_with;
pub use crate::engine::maintenance::compaction::{finish_compaction_marker, MarkerFinish};
use crate::engine::maintenance::{exists, file_len};
pub use execute::execute;
use plan::*;
pub use plan::{plan, plan_partition};
pub use topic::{
    execute_topic, plan_topic_rebuild, plan_topics, rebuild_topic_json, RebuildError, TopicPlan,
    TopicRebuild, TopicReport,
};

/// What recovery will do to a partition, planned from a read-only check.
#[derive(Clone, Debug)]
pub struct RecoveryPlan {
    /// Directory the report's paths are relative to (the data directory).
    pub root: PathBuf,
    pub partitions: Vec<PartitionPlan>,
    /// The topic level: leftover temporary files, topics kept offline.
    pub topics: Vec<TopicPlan>,
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
pub use crate::engine::maintenance::check::RecordsBehind as RecordsCut;

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
        /// What the check found the range to hold ([`ProblemKind::TornTail`],
        /// [`ProblemKind::ZeroTail`], [`ProblemKind::StaleTail`]); `None` when it
        /// reported no problem there.
        kind: Option<ProblemKind>,
        /// Valid records of the segment's generation behind the damaged one: cut
        /// with it (docs/FORMAT.md, Recovery step 4), so named here.
        records_cut: Option<RecordsCut>,
        reason: String,
    },
    /// Cut the torn tail (an entry cut short, never acknowledged) off
    /// `producers.journal`.
    CutJournal {
        path: PathBuf,
        from: u64,
        /// The file length when planned.
        to: u64,
        reason: String,
    },
    /// Replace a group file whose stored membership is refused with one holding the
    /// same group, generation and committed offsets and no membership (written
    /// atomically, as the broker writes group files). The members rejoin, as they
    /// would after the broker loaded the file.
    RewriteGroupFile {
        path: PathBuf,
        group: String,
        /// The committed offsets the file holds, all kept.
        offsets: usize,
        /// The file length when planned.
        bytes: u64,
        reason: String,
    },
    /// Cut an unfinished seal (zeros or stale records) off a sealed segment.
    TrimSeal {
        log: PathBuf,
        from: u64,
        to: u64,
        reason: String,
    },
    /// Remove a newest segment that never became durable. A reused file (its header
    /// still a spare's) goes back to the spare pool when `to_spares` names the data
    /// directory's `spares/`: renamed there, both directories fsynced, its header
    /// re-stamped (FORMAT, Spares rule 1).
    RemoveNeverDurable {
        log: PathBuf,
        index: Option<PathBuf>,
        base_offset: u64,
        bytes: u64,
        to_spares: Option<PathBuf>,
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
            Action::CutJournal { .. } => "cut_journal",
            Action::RewriteGroupFile { .. } => "rewrite_group_file",
            Action::RemoveNeverDurable { .. } => "remove_never_durable",
        }
    }

    /// The file the action is about.
    pub fn path(&self) -> &Path {
        match self {
            Action::FinishCompaction { marker_path, .. } => marker_path,
            Action::RemoveMarker { path, .. }
            | Action::RemoveTempFile { path, .. }
            | Action::RemoveOrphanIndex { path, .. }
            | Action::CutJournal { path, .. }
            | Action::RewriteGroupFile { path, .. } => path,
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
            Action::CutTail { from, to, .. }
            | Action::TrimSeal { from, to, .. }
            | Action::CutJournal { from, to, .. } => Some((*from, *to)),
            // A replaced file: nothing is cut.
            Action::FinishCompaction { .. }
            | Action::RebuildIndex { .. }
            | Action::RewriteGroupFile { .. } => None,
        }
    }

    /// True for an action that may lose bytes a reader could once see (a cut or a
    /// removal of data), as opposed to derived or temporary files.
    pub fn removes_data(&self) -> bool {
        matches!(
            self,
            Action::CutTail { .. }
                | Action::TrimSeal { .. }
                | Action::RemoveNeverDurable { .. }
                | Action::CutJournal { .. }
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
                    "; {} follow the damaged one and are cut with it ({RECORDS_BEHIND_MAY_BE})",
                    r.describe()
                ))
            ),
            Action::TrimSeal {
                log: path,
                from,
                to,
                reason,
            }
            | Action::CutJournal {
                path,
                from,
                to,
                reason,
            } => format!(
                "cut {} bytes {from}..{to} ({} bytes): {reason}",
                rel(path),
                to - from
            ),
            Action::RewriteGroupFile {
                path,
                offsets,
                bytes,
                reason,
                ..
            } => format!(
                "rewrite {} ({bytes} bytes) without its membership, keeping its {offsets} committed offset(s): {reason}",
                rel(path)
            ),
            Action::RemoveNeverDurable {
                log,
                index,
                base_offset,
                bytes,
                to_spares,
                reason,
            } => format!(
                "remove {}{} ({bytes} bytes, base offset {base_offset}){}: {reason}",
                rel(log),
                index
                    .as_ref()
                    .map(|i| format!(" and {}", rel(i)))
                    .unwrap_or_default(),
                to_spares
                    .as_ref()
                    .map(|d| format!(", the log back to {}/", rel(d)))
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
    pub topics: Vec<TopicReport>,
}

impl RecoveryReport {
    /// Every partition is consistent (no corruption remains).
    pub fn is_consistent(&self) -> bool {
        self.partitions.iter().all(PartitionReport::is_consistent)
            && self.topics.iter().all(|t| t.offline.is_empty())
    }

    /// Number of actions done.
    pub fn action_count(&self) -> usize {
        self.partitions
            .iter()
            .map(|p| p.actions.len())
            .sum::<usize>()
            + self.topics.iter().map(|t| t.actions.len()).sum::<usize>()
    }

    /// A human summary, one line per action and per problem left.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.topics {
            for a in &t.actions {
                let mut line = format!("{}: {}", t.label(), a.action.describe(&self.root));
                if !a.backups.is_empty() {
                    let names: Vec<String> =
                        a.backups.iter().map(|b| b.display().to_string()).collect();
                    let _ = write!(line, " [backup: {}]", names.join(", "));
                }
                out.push(line);
            }
            out.extend(offline_lines(&self.root, &t.offline));
        }
        for p in &self.partitions {
            for a in &p.actions {
                let mut line = format!("{}: {}", p.label, a.action.describe(&self.root));
                if !a.backups.is_empty() {
                    let names: Vec<String> =
                        a.backups.iter().map(|b| b.display().to_string()).collect();
                    let _ = write!(line, " [backup: {}]", names.join(", "));
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
        let remaining = self
            .partitions
            .iter()
            .filter(|p| !p.is_consistent())
            .count();
        // The entry without a topic holds the state files beside the topics (group
        // files, the producer journal): damage there takes no topic offline.
        let offline = self
            .topics
            .iter()
            .filter(|t| t.topic.is_some() && !t.offline.is_empty())
            .count();
        let state_files: usize = self
            .topics
            .iter()
            .filter(|t| t.topic.is_none())
            .map(|t| t.offline.len())
            .sum();
        if offline > 0 {
            out.push(format!(
                "{offline} topic(s) stay offline: their metadata needs an operator"
            ));
        }
        if state_files > 0 {
            out.push(format!(
                "{state_files} problem(s) in the files beside the topics need an operator"
            ));
        }
        if self.action_count() == 0 && remaining == 0 {
            out.push("nothing to do".into());
        }
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
        self.partitions
            .iter()
            .map(|p| p.actions.len())
            .sum::<usize>()
            + self.topics.iter().map(|t| t.actions.len()).sum::<usize>()
    }

    /// The worst severity the check found, as `verify --quick` reports it.
    pub fn severity_before(&self) -> Option<Severity> {
        let topics = self.topics.iter().flat_map(|t| {
            t.offline
                .iter()
                .map(|p| p.severity)
                .chain(t.actions.iter().map(|_| Severity::Repairable))
        });
        self.partitions
            .iter()
            .filter_map(|p| p.severity_before)
            .chain(topics)
            .max()
    }

    /// A topic stays offline (its metadata needs an operator).
    pub fn has_offline_topics(&self) -> bool {
        self.topics.iter().any(|t| !t.offline.is_empty())
    }

    /// A human summary of the plan.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.topics {
            for a in &t.actions {
                out.push(format!("{}: would {}", t.label(), a.describe(&self.root)));
            }
            out.extend(offline_lines(&self.root, &t.offline));
        }
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
        let damaged = self
            .partitions
            .iter()
            .filter(|p| !p.corrupt.is_empty() || !p.not_joined.is_empty() || p.refuses_writes)
            .count();
        match (self.action_count(), damaged) {
            (0, 0) => out.push("nothing to do".into()),
            (0, n) => out.push(format!(
                "nothing recover can repair: {n} partition(s) keep the damage above for an operator"
            )),
            (_, 0) => {}
            (_, n) => out.push(format!(
                "{n} partition(s) would keep the damage above for an operator"
            )),
        }
        out
    }
}

/// One line per topic metadata problem left in place.
fn offline_lines(root: &Path, offline: &[Problem]) -> Vec<String> {
    offline
        .iter()
        .map(|p| {
            // A file beside the topics (a group file, the producer journal, the
            // schemas, the API keys, the cluster id) takes no topic offline.
            let stays = if matches!(
                p.kind,
                ProblemKind::GroupFileUnreadable
                    | ProblemKind::JournalCorrupt
                    | ProblemKind::SchemasJsonUnreadable
                    | ProblemKind::KeysJsonUnreadable
                    | ProblemKind::ClusterJsonUnreadable
            ) {
                "left in place for an operator"
            } else {
                "left in place, the topic stays offline"
            };
            format!(
                "{} ({}, {}): {stays}",
                p.detail,
                p.kind,
                relative(root, &p.file)
            )
        })
        .collect()
}

/// Plans and executes recovery on a whole data directory (the broker's startup; the
/// caller holds `DATA/LOCK`).
pub fn recover(storage: &dyn Storage, data_dir: &Path) -> Result<RecoveryReport, RecoveryError> {
    let target = resolve(data_dir)?;
    let plan = plan(&target)?;
    execute(storage, &plan, None)
}
