//! The one analysis of a partition directory, shared by `verify`, `dump`, `reindex`
//! and recovery: headers, records, CRCs, index files, segment continuity, leftover
//! temporary files and compaction markers, each problem with its file, byte position,
//! offset and severity.
//!
//! Severity follows docs/FORMAT.md: what recovery repairs without losing acknowledged data
//! is `Repairable` (torn tail of the active segment, missing or wrong index, unfinished
//! seal or compaction, leftover temp files); records that cannot be read back, and
//! segments that do not join up, are `Corrupt`. Legal states (a zeroed or stale tail
//! after the active segment's data) are `Info`.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::format::index::{decode_index, IndexBuilder, IndexEntry, IndexError, INDEX_ENTRY_LEN};
use crate::format::marker::{CompactionMarker, MarkerError, MARKER_BYTES_MAX};
use crate::format::names::{log_file_name, tmp_file_name};
use crate::format::record::{
    claimed_encoded_len, decode_record, peek_offset, RecordError, LEN_FIELD, MAX_RECORD_LEN,
};
use crate::format::{HeaderError, SegmentHeader, HEADER_LEN};

use crate::engine::storage::layout::{
    list_partition, PartitionRef, SegmentFiles, Target, TopicDamage,
};
use crate::engine::storage::noatime;
use crate::engine::storage::reader::{
    not_regular_file, open_log, range_is_zero, read_full_at, read_header, resync,
    scan_sealed_segment, scan_segment, Next, RecordReader, Resync, ScanEnd, ScanSummary,
};

/// Largest index file read into memory: one entry per 4 KiB of a 4 GiB segment, with room.
pub const INDEX_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// A legal state worth mentioning.
    Info,
    /// `recover` repairs it without losing acknowledged data.
    Repairable,
    /// Records cannot be read back, or segments do not join up.
    Corrupt,
}

impl Severity {
    pub fn as_str(&self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Repairable => "repairable",
            Severity::Corrupt => "corrupt",
        }
    }
}

/// What a problem is: one variant per finding the check reports. Each has a stable
/// snake_case name ([`ProblemKind::as_str`], the `kind` of the JSON and the tables) and
/// the severity it has by default ([`ProblemKind::severity`]). It serializes as its
/// name (two kinds share `zero_tail`, so the name is not derived from the variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProblemKind {
    // ----- topic level (docs/FORMAT.md, Data directory) -----
    /// A topic directory without `topic.json`.
    TopicJsonMissing,
    /// A `topic.json` that cannot be read or is not valid.
    TopicJsonUnreadable,
    /// A partition directory at or above the topic's partition count.
    PartitionOutsideCount,
    /// A partition directory below the topic's partition count is missing.
    PartitionDirMissing,
    /// A `DATA/schemas.json` that cannot be read or is not valid.
    SchemasJsonUnreadable,
    /// A `DATA/api_keys.json` that cannot be read or is not valid.
    KeysJsonUnreadable,
    /// A `DATA/cluster.json` that cannot be read or is not valid.
    ClusterJsonUnreadable,
    /// A replicated topic's `replication.json`, `applied-P.json` or
    /// `DATA/raft/T/P/raft.json` that cannot be read or is not valid.
    RaftStateUnreadable,
    /// A replicated partition's checkpoint (`applied-P.json`) is missing while its
    /// Raft log is purged: the node takes a peer's checkpoint at its next start.
    AppliedCheckpointMissing,

    // ----- partition level -----
    /// A compaction marker: the swap did not finish, or never started.
    UnfinishedCompaction,
    /// A `.tmp` file (of an unfinished compaction, or left with no marker).
    LeftoverTempFile,
    /// An `.index` whose `.log` is gone, below the first segment (a leftover of
    /// retention) or after the newest (a roll that never became durable).
    OrphanIndex,
    /// An `.index` whose `.log` is gone, between the first and the newest segment: a
    /// lost segment.
    LostSegment,
    /// A file seglog does not know; left alone.
    UnknownFile,
    /// A segment starts at or below the last offset of the one before.
    SegmentsOverlap,
    /// A segment's base is not the previous segment's last offset + 1: offsets are
    /// missing between them (in every topic, compacted or not).
    SegmentsDoNotJoin,
    /// A replicated topic's data partition ends before the records its node applied
    /// (`applied-P.json`): damage there was cut. The node takes them again, from its
    /// Raft log or from its peers, at its next start.
    AppliedRecordsMissing,

    // ----- segment header -----
    /// The header's base offset is not the file name's.
    BaseOffsetMismatch,
    /// The newest segment's header is short or zero: it never became durable.
    NeverDurableSegment,
    /// A header shorter than 32 bytes (not on the newest segment).
    ShortHeader,
    /// An all-zero header (not on the newest segment).
    ZeroHeader,
    /// A header that fails its checks (magic, version, length, flags, CRC).
    BadHeader,

    // ----- after the active segment's data -----
    /// Zero bytes up to the end of the file (unwritten or preallocated).
    ZeroTail,
    /// Records of an older generation (a reused spare).
    StaleTail,
    /// Anything else: a write that never completed, never acknowledged.
    TornTail,

    // ----- after a sealed segment's data -----
    /// Zero bytes or stale records up to the end of the file: a roll that did not
    /// finish its truncation.
    UnfinishedSeal,
    /// Zero bytes followed by something else. Reported as `zero_tail`, the name the
    /// record decoder gives a zero `record_len`; unlike [`ProblemKind::ZeroTail`] the
    /// data cannot be read past it.
    SealedZeroRun,
    /// A record cut short.
    TornRecord,
    /// A `record_len` outside the plausible range.
    ImplausibleLength,
    BadKeyLen,
    BadValueLen,
    CrcMismatch,
    /// A record of another generation than the segment's, before the end of its data.
    StaleGeneration,
    /// A record longer than `MAX_RECORD_LEN`.
    TooLarge,
    /// A valid record whose offset does not increase.
    OffsetOutOfOrder,

    // ----- index file -----
    MissingIndex,
    /// The index length is not a multiple of 16.
    PartialIndexEntry,
    IndexNotIncreasing,
    /// An entry points at or past the end of the valid data.
    IndexPastData,
    /// An entry differs from the one the rule gives.
    WrongIndexEntry,
    /// More or fewer entries than the rule gives.
    WrongIndexLength,
    /// A `groups/<group>.json` that cannot be read or fails its checks.
    GroupFileUnreadable,
    /// A `groups/<group>.json` whose offsets are good but whose stored membership
    /// fails its checks: the broker loads the group without members, who rejoin;
    /// recover rewrites the file without the membership.
    GroupMembershipRefused,
    /// `producers.journal` ends in an entry cut short (recover cuts it).
    JournalTornTail,
    /// A file in `DATA/spares/` named as a spare whose header does not decode (or
    /// whose generation cannot grow): the broker removes it at its next start.
    BadSpareHeader,
    /// A `producers.journal` entry fails its CRC or field checks, or the header or
    /// `producers.json` is unreadable.
    JournalCorrupt,
}

impl ProblemKind {
    /// The stable machine-readable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::TopicJsonMissing => "topic_json_missing",
            ProblemKind::TopicJsonUnreadable => "topic_json_unreadable",
            ProblemKind::PartitionOutsideCount => "partition_outside_count",
            ProblemKind::PartitionDirMissing => "partition_dir_missing",
            ProblemKind::SchemasJsonUnreadable => "schemas_json_unreadable",
            ProblemKind::KeysJsonUnreadable => "keys_json_unreadable",
            ProblemKind::ClusterJsonUnreadable => "cluster_json_unreadable",
            ProblemKind::RaftStateUnreadable => "raft_state_unreadable",
            ProblemKind::AppliedRecordsMissing => "applied_records_missing",
            ProblemKind::AppliedCheckpointMissing => "applied_checkpoint_missing",
            ProblemKind::UnfinishedCompaction => "unfinished_compaction",
            ProblemKind::LeftoverTempFile => "leftover_temp_file",
            ProblemKind::OrphanIndex => "orphan_index",
            ProblemKind::LostSegment => "lost_segment",
            ProblemKind::UnknownFile => "unknown_file",
            ProblemKind::SegmentsOverlap => "segments_overlap",
            ProblemKind::SegmentsDoNotJoin => "segments_do_not_join",
            ProblemKind::BaseOffsetMismatch => "base_offset_mismatch",
            ProblemKind::NeverDurableSegment => "never_durable_segment",
            ProblemKind::ShortHeader => "short_header",
            ProblemKind::ZeroHeader => "zero_header",
            ProblemKind::BadHeader => "bad_header",
            ProblemKind::ZeroTail | ProblemKind::SealedZeroRun => "zero_tail",
            ProblemKind::StaleTail => "stale_tail",
            ProblemKind::TornTail => "torn_tail",
            ProblemKind::UnfinishedSeal => "unfinished_seal",
            ProblemKind::TornRecord => "torn_record",
            ProblemKind::ImplausibleLength => "implausible_length",
            ProblemKind::BadKeyLen => "bad_key_len",
            ProblemKind::BadValueLen => "bad_value_len",
            ProblemKind::CrcMismatch => "crc_mismatch",
            ProblemKind::StaleGeneration => "stale_generation",
            ProblemKind::TooLarge => "too_large",
            ProblemKind::OffsetOutOfOrder => "offset_out_of_order",
            ProblemKind::MissingIndex => "missing_index",
            ProblemKind::PartialIndexEntry => "partial_index_entry",
            ProblemKind::IndexNotIncreasing => "index_not_increasing",
            ProblemKind::IndexPastData => "index_past_data",
            ProblemKind::WrongIndexEntry => "wrong_index_entry",
            ProblemKind::WrongIndexLength => "wrong_index_length",
            ProblemKind::GroupFileUnreadable => "group_file_unreadable",
            ProblemKind::GroupMembershipRefused => "group_membership_refused",
            ProblemKind::JournalTornTail => "journal_torn_tail",
            ProblemKind::BadSpareHeader => "bad_spare_header",
            ProblemKind::JournalCorrupt => "journal_corrupt",
        }
    }

    /// The severity a problem of this kind is reported with. Only the continuity
    /// problems of segments named by a compaction marker that parses are reported as
    /// repairable instead (recovery finishes the swap).
    pub fn severity(self) -> Severity {
        match self {
            ProblemKind::UnknownFile
            | ProblemKind::ZeroTail
            | ProblemKind::StaleTail
            | ProblemKind::BadSpareHeader
            | ProblemKind::AppliedRecordsMissing
            | ProblemKind::AppliedCheckpointMissing => Severity::Info,
            ProblemKind::UnfinishedCompaction
            | ProblemKind::LeftoverTempFile
            | ProblemKind::OrphanIndex
            | ProblemKind::NeverDurableSegment
            | ProblemKind::TornTail
            | ProblemKind::UnfinishedSeal
            | ProblemKind::MissingIndex
            | ProblemKind::PartialIndexEntry
            | ProblemKind::IndexNotIncreasing
            | ProblemKind::IndexPastData
            | ProblemKind::WrongIndexEntry
            | ProblemKind::WrongIndexLength
            | ProblemKind::GroupMembershipRefused
            | ProblemKind::JournalTornTail => Severity::Repairable,
            ProblemKind::TopicJsonMissing
            | ProblemKind::TopicJsonUnreadable
            | ProblemKind::PartitionOutsideCount
            | ProblemKind::PartitionDirMissing
            | ProblemKind::SchemasJsonUnreadable
            | ProblemKind::KeysJsonUnreadable
            | ProblemKind::ClusterJsonUnreadable
            | ProblemKind::RaftStateUnreadable
            | ProblemKind::SegmentsOverlap
            | ProblemKind::SegmentsDoNotJoin
            | ProblemKind::LostSegment
            | ProblemKind::BaseOffsetMismatch
            | ProblemKind::ShortHeader
            | ProblemKind::ZeroHeader
            | ProblemKind::BadHeader
            | ProblemKind::SealedZeroRun
            | ProblemKind::TornRecord
            | ProblemKind::ImplausibleLength
            | ProblemKind::BadKeyLen
            | ProblemKind::BadValueLen
            | ProblemKind::CrcMismatch
            | ProblemKind::StaleGeneration
            | ProblemKind::TooLarge
            | ProblemKind::OffsetOutOfOrder
            | ProblemKind::GroupFileUnreadable
            | ProblemKind::JournalCorrupt => Severity::Corrupt,
        }
    }

    /// The kind of a header that fails its checks (on any segment but a newest one
    /// that never became durable).
    pub fn of_header_error(e: &HeaderError) -> ProblemKind {
        match e {
            HeaderError::Short { .. } => ProblemKind::ShortHeader,
            HeaderError::AllZero => ProblemKind::ZeroHeader,
            HeaderError::BadMagic { .. }
            | HeaderError::BadVersion { .. }
            | HeaderError::BadHeaderLen { .. }
            | HeaderError::UnknownFlags { .. }
            | HeaderError::CrcMismatch { .. }
            | HeaderError::NotRegularFile { .. } => ProblemKind::BadHeader,
        }
    }

    /// The kind of an index file that is not what the rule gives.
    pub fn of_index_error(e: &IndexError) -> ProblemKind {
        match e {
            IndexError::PartialEntry { .. } => ProblemKind::PartialIndexEntry,
            IndexError::NotIncreasing { .. } => ProblemKind::IndexNotIncreasing,
            IndexError::PastData { .. } => ProblemKind::IndexPastData,
            IndexError::WrongEntry { .. } => ProblemKind::WrongIndexEntry,
            IndexError::WrongCount { .. }
            | IndexError::TooLarge { .. }
            | IndexError::NotRegularFile { .. } => ProblemKind::WrongIndexLength,
        }
    }

    /// The kind of what ends a sealed segment's valid data before the end of the file,
    /// when it is not an unfinished seal. `None` at the end of the file.
    fn of_sealed_end(end: &ScanEnd) -> Option<ProblemKind> {
        let kind = match end {
            ScanEnd::Eof => return None,
            ScanEnd::OffsetOrder { .. } => ProblemKind::OffsetOutOfOrder,
            ScanEnd::Record(e) => match e {
                RecordError::Zero { .. } => ProblemKind::SealedZeroRun,
                RecordError::Truncated { .. } => ProblemKind::TornRecord,
                RecordError::ImplausibleLength { .. } => ProblemKind::ImplausibleLength,
                RecordError::BadKeyLen { .. } => ProblemKind::BadKeyLen,
                RecordError::BadValueLen { .. } => ProblemKind::BadValueLen,
                RecordError::CrcMismatch { .. } => ProblemKind::CrcMismatch,
                RecordError::StaleGeneration { .. } => ProblemKind::StaleGeneration,
                RecordError::TooLarge { .. } => ProblemKind::TooLarge,
            },
        };
        Some(kind)
    }
}

impl serde::Serialize for ProblemKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl std::fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// `kind.severity()`, but for what [`excuse_swap_in_progress`] lowers.
    pub severity: Severity,
    /// The file the problem is in.
    pub file: PathBuf,
    /// Byte position in `file` where it starts.
    pub position: Option<u64>,
    /// The record offset involved, when known.
    pub offset: Option<u64>,
    pub detail: String,
    /// Damage inside a sealed segment: the records it makes unreadable and where
    /// reading resumes (docs/FORMAT.md, Reading around damage).
    pub unreadable: Option<Box<DamagedRange>>,
    /// A `torn_tail`'s whole records behind the damage, cut with it (recovery names
    /// them from here).
    pub behind: Option<Box<RecordsBehind>>,
}

/// The range damage makes unreadable in a sealed segment: from the bad record to the
/// position where [`resync`] finds the records resuming (docs/FORMAT.md, Reading around
/// damage), else to the end of the file, the records resuming in the next segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DamagedRange {
    /// The first offset that cannot be read (`None` after a record at `u64::MAX`).
    pub first_offset: Option<u64>,
    /// Where the damage starts: the position of the bad record.
    pub first_position: u64,
    /// Where the unreadable bytes end: the resync point, else the end of the file.
    pub end_position: u64,
    /// Where the records resume in the same segment, if they do.
    pub next: Option<Resync>,
    /// The next segment's base offset.
    pub next_base: Option<u64>,
}

impl DamagedRange {
    /// Finds the range that damage at `position` hides in a sealed segment whose last
    /// record read before it is `last` (`None`: the damage is at the first record):
    /// the resync of docs/FORMAT.md, Reading around damage, from the byte after it.
    pub fn find(
        file: &File,
        header: &SegmentHeader,
        position: u64,
        file_len: u64,
        last: Option<u64>,
        next_base: Option<u64>,
    ) -> io::Result<DamagedRange> {
        let first = last.map_or(Some(header.base_offset), |o| o.checked_add(1));
        let found = match first {
            Some(first) => resync(
                file,
                header.generation,
                position.saturating_add(1),
                file_len,
                first,
                next_base,
            )?,
            None => None,
        };
        Ok(DamagedRange {
            first_offset: first,
            first_position: position,
            end_position: found.map_or(file_len, |r| r.position),
            next: found,
            next_base,
        })
    }

    /// The first offset readable after the damage: in this segment, else the next
    /// segment's base.
    pub fn next_offset(&self) -> Option<u64> {
        self.next.map(|r| r.offset).or(self.next_base)
    }

    /// The offsets the damage makes unreadable, `first..=last` (`last` is `None` when
    /// no readable offset follows); `None` when it hides no offset (the bytes held no
    /// record, or the last record was at `u64::MAX`).
    pub fn lost_offsets(&self) -> Option<(u64, Option<u64>)> {
        let first = self.first_offset?;
        match self.next_offset() {
            Some(next) if next > first => Some((first, Some(next - 1))),
            Some(_) => None,
            None => Some((first, None)),
        }
    }

    /// The problem's detail naming the range, after what ends the records (`end`).
    pub fn describe(&self, end: &ScanEnd) -> String {
        let (pos, file_len) = (self.first_position, self.end_position);
        let offsets = match self.lost_offsets() {
            Some((a, Some(b))) if a == b => format!("offset {a} lost"),
            Some((a, Some(b))) => format!("offsets {a}..={b} lost"),
            Some((a, None)) => format!("offsets from {a} lost"),
            None => "no offset lost".to_string(),
        };
        match self.next {
            Some(r) => format!(
                "{}; bytes {pos}..{} of this sealed segment cannot be read ({offsets}), records resume at byte {} (offset {})",
                end.detail(),
                r.position,
                r.position,
                r.offset
            ),
            None => format!(
                "{}; bytes {pos}..{file_len} ({} bytes) of this sealed segment cannot be read ({offsets}){}",
                end.detail(),
                file_len.saturating_sub(pos),
                self.next_base.map_or_else(
                    || ", no record follows".to_string(),
                    |b| format!(", records resume in the next segment at offset {b}")
                )
            ),
        }
    }
}

/// A finding about a topic rather than one of its partitions: its metadata, or a
/// leftover temporary file of an atomic replace outside any partition directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicProblem {
    /// The topic, `None` for a file outside every topic directory.
    pub topic: Option<String>,
    pub problem: Problem,
}

impl ProblemKind {
    /// The kind of a topic metadata problem.
    pub fn of_topic_damage(d: &TopicDamage) -> ProblemKind {
        match d {
            TopicDamage::MetaMissing => ProblemKind::TopicJsonMissing,
            TopicDamage::MetaUnreadable { .. } => ProblemKind::TopicJsonUnreadable,
            TopicDamage::PartitionOutsideCount { .. } => ProblemKind::PartitionOutsideCount,
            TopicDamage::PartitionMissing { .. } => ProblemKind::PartitionDirMissing,
        }
    }
}

/// The topic-level findings of a target (docs/FORMAT.md, Data directory): each
/// metadata problem (corrupt: the topic stays offline and its partitions are not
/// checked) and each leftover temporary file of an atomic replace (repairable).
pub fn topic_problems(target: &Target) -> Vec<TopicProblem> {
    let mut out = Vec::new();
    let temp = |topic: Option<String>, path: &Path| TopicProblem {
        topic,
        problem: problem(
            ProblemKind::LeftoverTempFile,
            path,
            None,
            None,
            "leftover temporary file of an atomic replace (recover removes it)".to_string(),
        ),
    };
    for path in &target.temp_files {
        out.push(temp(None, path));
    }
    for path in &target.unknown {
        out.push(TopicProblem {
            topic: None,
            problem: problem(
                ProblemKind::UnknownFile,
                path,
                None,
                None,
                topics_dir_entry_detail(path),
            ),
        });
    }
    if target.root_is_data_dir {
        out.extend(schemas_problem(&target.root));
    }
    for t in &target.topics {
        for issue in &t.issues {
            let detail = format!(
                "topic {}: {}; the topic is offline and its partitions are not checked",
                issue.topic,
                issue.detail()
            );
            out.push(TopicProblem {
                topic: Some(issue.topic.clone()),
                problem: problem(
                    ProblemKind::of_topic_damage(&issue.damage),
                    &issue.path,
                    None,
                    None,
                    detail,
                ),
            });
        }
        if let (true, Some(meta)) = (t.issues.is_empty(), &t.meta) {
            out.extend(super::state::replication_problems(
                &t.dir,
                &t.topic,
                meta.partitions,
            ));
        }
        for path in &t.temp_files {
            out.push(temp(Some(t.topic.clone()), path));
        }
        for path in &t.unknown {
            let detail = if path.is_dir() {
                "directory seglog does not know: not a partition directory (a partition's directory is its number in decimal, 0, 1, 2 …, without leading zeros); the broker and the tools ignore it and leave it alone"
            } else {
                "file seglog does not know; the broker and the tools ignore it and leave it alone"
            };
            out.push(TopicProblem {
                topic: Some(t.topic.clone()),
                problem: problem(
                    ProblemKind::UnknownFile,
                    path,
                    None,
                    None,
                    detail.to_string(),
                ),
            });
        }
    }
    if target.root_is_data_dir
        && matches!(
            target.kind,
            crate::engine::storage::layout::TargetKind::DataDir
        )
    {
        out.extend(super::state::state_problems(&target.root));
        out.extend(spares_problems(&target.root));
    }
    out
}

/// Why an entry of `DATA/topics/` is no topic directory, and what becomes of it.
fn topics_dir_entry_detail(path: &Path) -> String {
    use crate::format::names::{TOPIC_CREATING_SUFFIX, TOPIC_DELETING_SUFFIX};
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // As the broker's start: a symbolic link, even to a directory, is no leftover.
    if !fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return "file seglog does not know in topics/ (topics are directories); the broker and the tools ignore it and leave it alone".to_string();
    }
    let interrupted = if name.ends_with(TOPIC_CREATING_SUFFIX) {
        Some("create")
    } else if name.ends_with(TOPIC_DELETING_SUFFIX) {
        Some("delete")
    } else {
        None
    };
    match (interrupted, crate::format::names::validate_name(&name)) {
        (Some(what), _) => format!(
            "directory left by an interrupted topic {what}, no topic: the broker removes it at its next start; the tools leave it"
        ),
        (None, Err(e)) => format!(
            "directory seglog does not know: not a topic directory ({e}); the broker and the tools ignore it and leave it alone"
        ),
        (None, Ok(())) => "directory seglog does not know: not a topic directory; the broker and the tools ignore it and leave it alone".to_string(),
    }
}

/// What in `DATA/spares/` the broker would not take as a spare (docs/FORMAT.md, Spare
/// files, rule 2): a name other than `spare-<20 digits>.log`, or a spare whose header
/// does not decode or whose generation cannot grow. Its startup removes such a file
/// (and, with the pool off, `spares/` whole); the tools only report it, as
/// information: a spare holds no record a reader is served. A spare over the pool's
/// cap is not reported (the cap is the broker's setting).
pub fn spares_problems(root: &Path) -> Vec<TopicProblem> {
    use crate::format::names::{parse_spare_file_name, SPARES_DIR};
    let dir = root.join(SPARES_DIR);
    let Ok(entries) = noatime::read_dir(&dir) else {
        return Vec::new();
    };
    let removed = "the broker removes it at its next start (with the spare pool off, it removes spares/ whole); the tools leave it";
    let ignored = "the broker leaves it in place and ignores it (with the spare pool off, it removes spares/ whole); the tools leave it";
    let mut found: Vec<(PathBuf, ProblemKind, String)> = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let spare_name = name.to_str().and_then(parse_spare_file_name).is_some();
        // As the broker's startup: what is not a regular file (a link is not
        // followed) is never opened as a spare.
        let what = match entry.file_type() {
            Ok(t) if t.is_file() => None,
            Ok(t) if t.is_dir() => Some("directory"),
            Ok(t) if t.is_symlink() => Some("symbolic link"),
            Ok(t) if t.is_fifo() => Some("FIFO"),
            Ok(t) if t.is_socket() => Some("socket"),
            Ok(_) => Some("device"),
            Err(e) => {
                found.push((
                    path,
                    ProblemKind::UnknownFile,
                    format!("cannot be read ({e})"),
                ));
                continue;
            }
        };
        if let Some(what) = what {
            found.push((
                path,
                ProblemKind::UnknownFile,
                format!("a {what} in spares/, no spare file: {ignored}"),
            ));
            continue;
        }
        let (kind, why) = match open_log(&path) {
            Err(e) => match not_regular_file(&e) {
                Some(n) => {
                    let why = format!("a {} in spares/, no spare file: {ignored}", n.what);
                    found.push((path, ProblemKind::UnknownFile, why));
                    continue;
                }
                None => (ProblemKind::UnknownFile, format!("cannot be read ({e})")),
            },
            Ok(_) if !spare_name => (
                ProblemKind::UnknownFile,
                "not a spare's name (spare-<20 digits>.log)".to_string(),
            ),
            Ok((file, len)) => match read_header(&file, len) {
                Ok(Err(e)) => (
                    ProblemKind::BadSpareHeader,
                    format!("spare whose header does not decode ({e})"),
                ),
                Ok(Ok(h)) if h.generation == u64::MAX => (
                    ProblemKind::BadSpareHeader,
                    "spare whose generation cannot grow (u64::MAX)".to_string(),
                ),
                Ok(Ok(_)) => continue,
                Err(e) => (ProblemKind::UnknownFile, format!("cannot be read ({e})")),
            },
        };
        found.push((path, kind, format!("{why}: {removed}")));
    }
    found.sort();
    found
        .into_iter()
        .map(|(path, kind, detail)| TopicProblem {
            topic: None,
            problem: problem(kind, &path, None, None, detail),
        })
        .collect()
}

/// `DATA/schemas.json`, if present, must parse as the schemas file (corrupt: the
/// broker does not start on it, since serving unchecked would let through what the
/// schemas refuse).
fn schemas_problem(root: &Path) -> Option<TopicProblem> {
    use crate::engine::schemas::SchemaError;
    use crate::format::schemas::SCHEMAS_FILE;
    let path = root.join(SCHEMAS_FILE);
    let detail = match crate::engine::schemas::read_file(root) {
        Ok(_) => return None,
        Err(SchemaError::Unreadable { detail, .. }) => detail,
        Err(e) => e.to_string(),
    };
    Some(TopicProblem {
        topic: None,
        problem: problem(
            ProblemKind::SchemasJsonUnreadable,
            &path,
            None,
            None,
            format!("{SCHEMAS_FILE} is unreadable: {detail}; the broker does not start until it is fixed or removed"),
        ),
    })
}

/// How much to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckMode {
    /// Every record of every segment.
    Full,
    /// The startup check: a sealed segment whose index agrees with its first record
    /// and its tail after the last index entry is trusted without reading the rest.
    Quick,
}

/// State of a segment's index file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexState {
    Valid,
    Missing,
    Invalid(IndexError),
    /// Not compared (the segment's header is bad).
    NotChecked,
}

/// What the check found in one segment.
#[derive(Clone, Debug)]
pub struct SegmentCheck {
    pub files: SegmentFiles,
    /// The newest segment of the partition.
    pub active: bool,
    pub file_len: u64,
    pub header: Result<SegmentHeader, HeaderError>,
    /// The full scan, when the segment was read in full.
    pub scan: Option<ScanSummary>,
    /// Quick mode: the index check passed and the middle was not read.
    pub trusted_by_index: bool,
    pub first_offset: Option<u64>,
    pub last_offset: Option<u64>,
    /// Records counted (None when trusted by the index without a full read).
    pub records: Option<u64>,
    /// Position just past the last valid record.
    pub data_end: u64,
    pub index: IndexState,
    pub problems: Vec<Problem>,
}

impl SegmentCheck {
    pub fn base_offset(&self) -> u64 {
        self.files.base_offset
    }

    /// Generation from the header, if it decoded.
    pub fn generation(&self) -> Option<u64> {
        self.header.as_ref().ok().map(|h| h.generation)
    }

    /// Frees the rule-built index of the full scan (16 bytes per 4 KiB of data), once
    /// it has been compared with the index file. Callers that only report keep memory
    /// flat this way; the index state and problems stay.
    pub fn release_scan_index(&mut self) {
        if let Some(scan) = &mut self.scan {
            scan.index = Vec::new();
        }
    }

    /// True when this segment holds records that cannot be read back.
    pub fn is_corrupt(&self) -> bool {
        self.problems
            .iter()
            .any(|p| p.severity == Severity::Corrupt)
    }
}

/// What the check found in one partition.
#[derive(Clone, Debug)]
pub struct PartitionCheck {
    pub partition: PartitionRef,
    pub segments: Vec<SegmentCheck>,
    pub marker: Option<(PathBuf, Result<CompactionMarker, MarkerError>)>,
    pub temp_files: Vec<PathBuf>,
    /// Index files without their log below the first segment (retention's leftovers)
    /// or after the newest (a roll that never became durable): removed by recovery.
    pub orphan_indexes: Vec<PathBuf>,
    /// Index files without their log between the first and the newest segment: each
    /// marks a lost segment (corruption, kept).
    pub lost_segments: Vec<PathBuf>,
    /// Partition-level problems: marker, temp files, orphan indexes, continuity.
    pub problems: Vec<Problem>,
}

impl PartitionCheck {
    /// Every problem, partition-level first, then per segment.
    pub fn all_problems(&self) -> impl Iterator<Item = &Problem> {
        self.problems
            .iter()
            .chain(self.segments.iter().flat_map(|s| s.problems.iter()))
    }

    /// The worst severity found, `None` when clean (info does not count).
    pub fn severity(&self) -> Option<Severity> {
        self.all_problems()
            .map(|p| p.severity)
            .filter(|s| *s > Severity::Info)
            .max()
    }

    /// The offset after the highest valid record, if any record exists. A record at
    /// offset `u64::MAX` (only a damaged or crafted file holds one) has no next offset:
    /// it saturates.
    pub fn next_offset(&self) -> Option<u64> {
        self.segments
            .iter()
            .filter_map(|s| s.last_offset)
            .max()
            .map(|o| o.saturating_add(1))
    }
}

fn problem(
    kind: ProblemKind,
    file: &Path,
    position: Option<u64>,
    offset: Option<u64>,
    detail: String,
) -> Problem {
    Problem {
        kind,
        severity: kind.severity(),
        file: file.to_path_buf(),
        position,
        offset,
        detail,
        unreadable: None,
        behind: None,
    }
}

/// Checks one partition directory.
pub fn check_partition(p: &PartitionRef, mode: CheckMode) -> io::Result<PartitionCheck> {
    check_partition_with(p, mode, &mut |_| {})
}

/// [`check_partition`], calling `on_segment` after each segment is checked (for
/// progress reports, or to drop what the caller does not need, such as
/// [`SegmentCheck::release_scan_index`], so memory stays flat on any partition size).
pub fn check_partition_with(
    p: &PartitionRef,
    mode: CheckMode,
    on_segment: &mut dyn FnMut(&mut SegmentCheck),
) -> io::Result<PartitionCheck> {
    let listing = list_partition(&p.dir)?;
    let bases = listing
        .segments
        .first()
        .zip(listing.segments.last())
        .map(|(f, l)| (f.base_offset, l.base_offset));
    let (orphan_indexes, lost_segments): (Vec<PathBuf>, Vec<PathBuf>) = listing
        .orphan_indexes
        .iter()
        .cloned()
        .partition(|idx| !between_segments(idx, bases));
    let mut out = PartitionCheck {
        partition: p.clone(),
        segments: Vec::new(),
        marker: None,
        temp_files: listing.temp_files.clone(),
        orphan_indexes,
        lost_segments,
        problems: Vec::new(),
    };
    if let Some(path) = &listing.marker {
        let bases: Vec<u64> = listing.segments.iter().map(|f| f.base_offset).collect();
        let marker = match read_marker(path) {
            Ok(m) => match marker_fits(&p.dir, &m, &bases)? {
                Ok(()) => Ok(m),
                Err(detail) => Err(MarkerError::DoesNotFit { detail }),
            },
            Err(e) => Err(e),
        };
        let detail = match &marker {
            Ok(m) => format!(
                "compaction swap not finished: {} new segment(s) replace {} (recover finishes it)",
                m.new.len(),
                m.replaced.len()
            ),
            Err(e @ MarkerError::DoesNotFit { .. }) => format!(
                "{e}; no swap wrote it (recover removes it and its temporary files and keeps every segment)"
            ),
            Err(e) => {
                format!("{e}; the swap never started (recover removes it and its temporary files)")
            }
        };
        out.problems.push(problem(
            ProblemKind::UnfinishedCompaction,
            path,
            Some(0),
            None,
            detail,
        ));
        out.marker = Some((path.clone(), marker));
    }
    for tmp in &listing.temp_files {
        let detail = if listing.marker.is_some() {
            "temporary file of the unfinished compaction".to_string()
        } else {
            "leftover temporary file with no compaction marker (recover removes it)".to_string()
        };
        out.problems.push(problem(
            ProblemKind::LeftoverTempFile,
            tmp,
            None,
            None,
            detail,
        ));
    }
    for idx in &out.orphan_indexes {
        let detail = match (index_base(idx), bases) {
            (Some(b), Some((first, _))) if b < first => {
                "index file without its .log below the first segment, left by retention (recover removes it)"
            }
            _ => "index file without its .log after the newest segment, of a roll that never became durable (recover removes it)",
        }
        .to_string();
        out.problems
            .push(problem(ProblemKind::OrphanIndex, idx, None, None, detail));
    }
    for idx in &out.lost_segments {
        let base = index_base(idx);
        let detail = match base {
            Some(b) => format!(
                "index file without its .log: the segment at base {b} is lost (its records cannot be read back; the index is kept)"
            ),
            None => "index file without its .log: a segment is lost (the index is kept)".to_string(),
        };
        out.problems
            .push(problem(ProblemKind::LostSegment, idx, None, base, detail));
    }
    for path in &listing.unknown {
        let detail = "file seglog does not know; left alone".to_string();
        out.problems
            .push(problem(ProblemKind::UnknownFile, path, None, None, detail));
    }
    let newest = listing.segments.last().map(|s| s.base_offset);
    // A newest segment that never became durable (a roll whose header was not yet
    // written) leaves the segment before it as the one that was being written: its
    // tail is checked as the active segment's, as recovery treats it (FORMAT,
    // Recovery step 4).
    let also_active = match listing.segments.as_slice() {
        [.., before, newest_files] if p.only_segment.is_none() => {
            newest_header_never_durable(newest_files)?.then_some(before.base_offset)
        }
        _ => None,
    };
    let applied = raft_applied_index(p);
    let applied_next = data_applied_next(p);
    for (i, files) in listing.segments.iter().enumerate() {
        if p.only_segment.is_some_and(|b| b != files.base_offset) {
            continue;
        }
        let newest_one = Some(files.base_offset) == newest;
        let active = newest_one || Some(files.base_offset) == also_active;
        // The next segment, or a lost one (its `.index` left) before it: what a
        // damaged tail hides stops at the lost segment's base, whose offsets are
        // reported with it.
        let next_base = listing
            .segments
            .get(i + 1)
            .map(|f| f.base_offset)
            .into_iter()
            .chain(
                out.lost_segments
                    .iter()
                    .filter_map(|idx| index_base(idx))
                    .filter(|&b| b > files.base_offset),
            )
            .min();
        let mut seg = check_segment(files, active, mode, next_base)?;
        if active && !newest_one {
            // Only the newest segment can lack its header: any other header problem
            // is damage, never a roll that did not finish.
            header_is_damage(&mut seg);
        }
        if newest_one
            && out.segments.last().is_some_and(|b| {
                Some(b.base_offset()) == also_active
                    && never_durable_header(b.base_offset(), &b.header)
            })
        {
            // Two segments without a header are no state a crash leaves (a roll
            // starts only once the previous one is durable): damage, both kept. Were
            // the newest removed, the next run would take the other for an
            // unfinished roll and remove its records too.
            header_is_damage(&mut seg);
        }
        for pr in &mut seg.problems {
            if !active
                && applied_next.is_some()
                && pr.severity == Severity::Corrupt
                && pr.file == seg.files.log
                && crate::engine::maintenance::salvage::is_salvageable_damage(pr.kind)
            {
                pr.detail.push_str(
                    "; a replica of a replicated partition: the node mends this segment with \
                     a peer's copy of the records when it starts or when a read meets the damage",
                );
            }
            if let (ProblemKind::TornTail, Some(first)) = (pr.kind, pr.offset) {
                let said = match (applied, applied_next) {
                    (Some(applied), _) => applied_entries_damaged(first, applied),
                    (None, Some(next)) => applied_records_damaged(first, next),
                    (None, None) => None,
                };
                if let Some(said) = said {
                    pr.detail.push_str("; ");
                    pr.detail.push_str(&said);
                }
            }
        }
        on_segment(&mut seg);
        out.segments.push(seg);
    }
    if p.only_segment.is_none() {
        let before = out.problems.len();
        check_continuity(&mut out);
        if applied_next.is_some() {
            for pr in out.problems.iter_mut().skip(before) {
                if pr.kind == ProblemKind::SegmentsDoNotJoin {
                    pr.detail.push_str(
                        "; a replica of a replicated partition: the node writes the missing \
                         offsets again from a peer's copy of the records when it starts",
                    );
                }
            }
        }
        excuse_swap_in_progress(&mut out);
        if let Some(next) = applied_next {
            applied_records_missing(&mut out, next);
        }
    }
    Ok(out)
}

/// For a replicated topic's data partition (`DATA/topics/T/P`), the offset after the
/// records its node applied, from `DATA/topics/T/applied-P.json`; `None` for any other
/// partition, when nothing was applied, or when the checkpoint does not read
/// (reported on its own, `raft_state_unreadable`).
pub fn data_applied_next(p: &PartitionRef) -> Option<u64> {
    use crate::engine::replication::state_machine::{checkpoint_name, read_checkpoint};
    let topic = p.topic.as_deref()?;
    if topic.starts_with(crate::engine::storage::layout::RAFT_DIR) {
        return None;
    }
    let path = p.dir.parent()?.join(checkpoint_name(p.partition?));
    let applied = read_checkpoint(&path).ok()??;
    applied.last_applied.map(|_| applied.next_offset)
}

/// What a replicated data partition's damaged tail from offset `first` on means when
/// its node applied the records below `next`: they are committed and were durable
/// before the checkpoint named them, so this is damage, unless a crash cut short the
/// node's taking them back (`manager::repair` writes below the checkpoint's next
/// offset); either way the node takes them again at its start.
pub fn applied_records_damaged(first: u64, next: u64) -> Option<String> {
    (first < next).then(|| {
        format!(
            "this node applied the records up to offset {}, so offsets {first}..={} are \
             committed entries' records, which its Raft log or its peers hold: this is \
             damage (or a crash while the node was taking them back after earlier damage), \
             and after the cut the node takes them again at its start",
            next - 1,
            next - 1
        )
    })
}

/// Reports a replicated data partition that, once what recovery cuts is gone (its
/// torn tail), ends before `next`, the offset after the records its node applied;
/// nothing when a torn tail already says so.
fn applied_records_missing(out: &mut PartitionCheck, next: u64) {
    let torn = out
        .segments
        .iter()
        .flat_map(|s| &s.problems)
        .any(|p| p.kind == ProblemKind::TornTail);
    if torn || out.severity() == Some(Severity::Corrupt) {
        return;
    }
    let Some(newest) = out.segments.last() else {
        return;
    };
    let end = out.next_offset().unwrap_or_else(|| newest.base_offset());
    if end >= next {
        return;
    }
    let detail = format!(
        "the data partition ends at offset {end}, but this node applied the records up to \
         offset {} (its checkpoint, applied-{}.json): offsets {end}..={} are missing here, \
         damage that was cut; they are committed, and the node takes them again from its \
         Raft log or its peers when it starts, before its replica takes part in the group",
        next - 1,
        out.partition.partition.unwrap_or_default(),
        next - 1
    );
    let log = newest.files.log.clone();
    out.problems.push(problem(
        ProblemKind::AppliedRecordsMissing,
        &log,
        None,
        Some(end),
        detail,
    ));
}

/// For a Raft log (`DATA/raft/T/P/log`, which the tools label `raft/T`), the index of
/// the last entry its node applied, from `DATA/topics/T/applied-P.json`; `None` for
/// any other partition, when nothing was applied, or when the checkpoint does not
/// read (reported on its own, `raft_state_unreadable`).
pub fn raft_applied_index(p: &PartitionRef) -> Option<u64> {
    use crate::engine::replication::state_machine::{checkpoint_name, read_checkpoint};
    let topic = p
        .topic
        .as_deref()?
        .strip_prefix(crate::engine::storage::layout::RAFT_DIR)?
        .strip_prefix('/')?;
    let partition = p.partition?;
    let data = p.dir.ancestors().nth(4)?;
    let path = data
        .join(crate::format::names::TOPICS_DIR)
        .join(topic)
        .join(checkpoint_name(partition));
    read_checkpoint(&path).ok()??.last_applied.map(|l| l.index)
}

/// What a Raft log's damaged tail from entry `first` on means when its node applied
/// every entry up to `applied`: those entries were committed (on a majority's disks),
/// so the tail is damage rather than a write a crash tore. `None` when `first` is past
/// `applied`.
pub fn applied_entries_damaged(first: u64, applied: u64) -> Option<String> {
    (first <= applied).then(|| {
        format!(
            "this node applied the entries up to index {applied}, so entries {first}..={applied} \
             were committed on a majority of the group: this is damage, not a crash, and the \
             node's peers hold them"
        )
    })
}

/// A header that shows the segment never became durable: shorter than 32 bytes, all
/// zero, or still that of an unassigned spare (docs/FORMAT.md, Spares rule 3: the header
/// naming the segment's base is made durable before any record in it is
/// acknowledged). Only ever so for the newest segment. `base` is the file name's
/// base: a segment whose base really is u64::MAX has a spare-like header of its own.
pub fn never_durable_header(base: u64, header: &Result<SegmentHeader, HeaderError>) -> bool {
    match header {
        Err(HeaderError::Short { .. } | HeaderError::AllZero) => true,
        Ok(h) => h.is_spare() && h.base_offset != base,
        Err(_) => false,
    }
}

/// Reports `seg`'s header problem as damage (corrupt) rather than as a segment that
/// never became durable.
fn header_is_damage(seg: &mut SegmentCheck) {
    if let Err(p) = segment_header(&seg.files, false, seg.file_len, &seg.header) {
        seg.problems
            .retain(|q| q.kind != ProblemKind::NeverDurableSegment);
        if !seg.problems.iter().any(|q| q.kind == p.kind) {
            seg.problems.insert(0, p);
        }
    }
}

/// Whether the segment file has a header that never became durable.
fn newest_header_never_durable(files: &SegmentFiles) -> io::Result<bool> {
    let (file, len) = match open_log(&files.log) {
        Ok(f) => f,
        // No regular file: damage, reported by its own check.
        Err(e) if not_regular_file(&e).is_some() => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(never_durable_header(
        files.base_offset,
        &read_header(&file, len)?,
    ))
}

/// Half-way through a compaction swap (a marker that parses), new segments stand
/// beside the ones they replace, so segments overlap or skip: recovery finishes the
/// swap, so those problems are repairable, not corruption.
fn excuse_swap_in_progress(out: &mut PartitionCheck) {
    let Some((_, Ok(marker))) = &out.marker else {
        return;
    };
    let named: Vec<PathBuf> = marker
        .new
        .iter()
        .chain(marker.replaced.iter())
        .flat_map(|&b| {
            [
                crate::format::names::log_file_name(b),
                crate::format::names::index_file_name(b),
            ]
        })
        .map(|name| out.partition.dir.join(name))
        .collect();
    for p in &mut out.problems {
        let continuity = matches!(
            p.kind,
            ProblemKind::SegmentsOverlap
                | ProblemKind::SegmentsDoNotJoin
                | ProblemKind::LostSegment
        );
        if continuity && p.severity == Severity::Corrupt && named.contains(&p.file) {
            p.severity = Severity::Repairable;
            p.detail
                .push_str(" (part of the unfinished compaction swap; recover finishes it)");
        }
    }
}

/// The base offset an index file is named after.
fn index_base(idx: &Path) -> Option<u64> {
    let name = idx.file_name()?.to_string_lossy();
    match crate::format::names::classify_partition_file(&name) {
        crate::format::names::PartitionFile::Index(b) => Some(b),
        _ => None,
    }
}

/// An index without its log marks a lost segment when it lies between the first and
/// the newest segment (docs/FORMAT.md, Recovery step 5). Below the first it is
/// retention's leftover (retention removes the oldest segments, log first); after the
/// newest (or with no segment at all) it is a roll that never became durable: a roll
/// creates the new log and index without an fsync between them, so a crash may keep
/// either name, and nothing in that segment was acknowledged. (A newest segment lost
/// with its index leaves nothing to tell it from one never written either.)
fn between_segments(idx: &Path, bases: Option<(u64, u64)>) -> bool {
    matches!((index_base(idx), bases), (Some(b), Some((first, newest))) if first < b && b < newest)
}

fn read_marker(path: &Path) -> Result<CompactionMarker, MarkerError> {
    let len = fs::metadata(path).map_or(0, |m| m.len());
    if len > MARKER_BYTES_MAX as u64 {
        return Err(MarkerError::TooLarge { len: len as usize });
    }
    let bytes = noatime::read(path).map_err(|e| MarkerError::Json {
        detail: e.to_string(),
    })?;
    CompactionMarker::decode(&bytes)
}

/// Whether a marker that parses can be the swap of the segments listed (`bases`):
/// its new segments' logs (or their `.tmp`) exist, the first new segment takes the
/// first replaced one's base, and the last new segment ends where the replaced range
/// ended, just below the next segment on disk, which must exist: compaction replaces
/// sealed segments only, and keeps the last record of their range (FORMAT,
/// Compaction). A marker that fails is no swap's: finishing it could delete the only
/// copy of a replaced segment, so it is treated as one that never started (its
/// segments are kept).
fn marker_fits(dir: &Path, m: &CompactionMarker, bases: &[u64]) -> io::Result<Result<(), String>> {
    let (Some(&first_new), Some(&last_new)) = (m.new.iter().min(), m.new.iter().max()) else {
        // Compaction always keeps the last record of the replaced range.
        return Ok(if m.replaced.is_empty() {
            Ok(())
        } else {
            Err("it replaces segments with no new one".to_string())
        });
    };
    let stem = |b: u64| format!("{b:020}");
    for &n in &m.new {
        let log = dir.join(log_file_name(n));
        if !log.exists() && !dir.join(tmp_file_name(&log_file_name(n))).exists() {
            return Ok(Err(format!(
                "new segment {} has neither its .log nor its .log.tmp",
                stem(n)
            )));
        }
    }
    if let Some(&first_replaced) = m.replaced.iter().min() {
        if first_new != first_replaced {
            return Ok(Err(format!(
                "the first new segment {} does not take the first replaced segment's base {}",
                stem(first_new),
                stem(first_replaced)
            )));
        }
    }
    let top = m.replaced.iter().copied().max().unwrap_or(0).max(last_new);
    // Compaction replaces sealed segments only: the active one always follows them.
    let Some(next) = bases.iter().copied().filter(|&b| b > top).min() else {
        return Ok(Err(format!(
            "no segment follows the replaced range (up to {}), but compaction replaces sealed segments only",
            stem(top)
        )));
    };
    let tmp = dir.join(tmp_file_name(&log_file_name(last_new)));
    let path = if tmp.exists() {
        tmp
    } else {
        dir.join(log_file_name(last_new))
    };
    let (file, file_len) = open_log(&path)?;
    let last = match read_header(&file, file_len)? {
        Ok(h) if h.base_offset == last_new => {
            scan_sealed_segment(&file, &h, file_len, |_, _| {})?.last_offset
        }
        _ => None,
    };
    if last.and_then(|l| l.checked_add(1)) != Some(next) {
        let ends = last.map_or_else(
            || "no readable record".to_string(),
            |l| format!("offset {l}"),
        );
        return Ok(Err(format!(
            "new segment {} ends at {ends}, but the replaced segments end below the next segment {}",
            stem(last_new),
            stem(next)
        )));
    }
    Ok(Ok(()))
}

/// An index file's bytes, or why they were not read.
pub type IndexBytes = Result<Vec<u8>, IndexError>;

/// Reads an index file, bounded by [`INDEX_BYTES_MAX`]. `Ok(None)` when missing;
/// `Ok(Some(Err(TooLarge)))`, without reading it, when over the limit: an invalid
/// index like any other (derived data, rebuilt by `reindex` and `recover`).
pub fn read_index_bytes(path: &Path) -> io::Result<Option<IndexBytes>> {
    // Opened as a log is: a FIFO or other special file is an error naming it, never
    // a read that blocks.
    let (file, len) = match open_log(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return match not_regular_file(&e) {
                Some(n) => Ok(Some(Err(IndexError::NotRegularFile { what: n.what }))),
                None => Err(e),
            }
        }
    };
    if len > INDEX_BYTES_MAX {
        return Ok(Some(Err(IndexError::TooLarge {
            len,
            max: INDEX_BYTES_MAX,
        })));
    }
    let mut buf = vec![0u8; len as usize];
    let n = crate::engine::storage::reader::read_full_at(&file, &mut buf, 0)?;
    buf.truncate(n);
    Ok(Some(Ok(buf)))
}

/// Checks one segment: header, records (all, or only what the index check needs),
/// and its index.
pub fn check_segment(
    files: &SegmentFiles,
    active: bool,
    mode: CheckMode,
    next_base: Option<u64>,
) -> io::Result<SegmentCheck> {
    let (file, file_len) = match open_log(&files.log) {
        Ok(f) => f,
        Err(e) => return not_a_segment(files, active, e),
    };
    let header = read_header(&file, file_len)?;
    let mut seg = SegmentCheck {
        files: files.clone(),
        active,
        file_len,
        header: header.clone(),
        scan: None,
        trusted_by_index: false,
        first_offset: None,
        last_offset: None,
        records: None,
        data_end: (HEADER_LEN as u64).min(file_len),
        index: IndexState::NotChecked,
        problems: Vec::new(),
    };
    let header = match segment_header(files, active, file_len, &header) {
        Ok(h) => h,
        Err(p) => {
            seg.problems.push(p);
            return Ok(seg);
        }
    };
    if mode == CheckMode::Quick && !active {
        // Only the index's first and last entries are read here: the quick check
        // needs no more, and a trusted segment costs a few KiB of reads.
        if let Some((first_entry, last_entry)) = read_index_ends(&files.index, file_len)? {
            if let Some((first, last)) =
                quick_check_entries(&file, &header, file_len, first_entry, last_entry)?
            {
                seg.trusted_by_index = true;
                seg.first_offset = Some(first);
                seg.last_offset = Some(last);
                seg.data_end = file_len;
                seg.index = IndexState::Valid;
                return Ok(seg);
            }
        }
    }
    let index_bytes = read_index_bytes(&files.index)?;
    let scan = if active {
        scan_segment(&file, &header, file_len, |_, _| {})?
    } else {
        scan_sealed_segment(&file, &header, file_len, |_, _| {})?
    };
    seg.first_offset = scan.first_offset;
    seg.last_offset = scan.last_offset;
    seg.records = Some(scan.records);
    seg.data_end = scan.data_end;
    classify_end(&mut seg, &file, &scan, next_base)?;
    if !active {
        read_past_damage(&mut seg, &file, &header, &scan.end, next_base)?;
    }
    seg.index = compare_index(index_bytes.as_ref(), &scan, seg.is_corrupt());
    if let Some(p) = index_problem(&seg.index, files, active) {
        seg.problems.push(p);
    }
    seg.scan = Some(scan);
    Ok(seg)
}

/// Damage inside a sealed segment hides only the records it touches (docs/FORMAT.md,
/// Reading around damage): from the byte after each bad record, reading resumes where
/// [`resync`] finds a whole record of the segment's generation with an offset above the
/// last valid one and below the next segment's base, and goes on from there. Each bad
/// record's problem gets the range it makes unreadable ([`Problem::unreadable`]); the
/// records read after it count with the segment's (`records`, `first_offset`,
/// `last_offset`). `data_end`, the scan and its index stay those of the records before
/// the first damage, which is what an index of a damaged segment covers.
fn read_past_damage(
    seg: &mut SegmentCheck,
    file: &File,
    header: &SegmentHeader,
    first_end: &ScanEnd,
    next_base: Option<u64>,
) -> io::Result<()> {
    let file_len = seg.file_len;
    let mut end = first_end.clone();
    let mut last = seg.last_offset;
    // Each round starts past the damage of the one before: at most one per byte.
    loop {
        let Some(position) = end.position() else {
            return Ok(());
        };
        let log = &seg.files.log;
        let Some(p) = seg.problems.iter_mut().rev().find(|p| {
            &p.file == log && p.position == Some(position) && p.severity == Severity::Corrupt
        }) else {
            // An unfinished seal (or nothing): no damage to read around.
            return Ok(());
        };
        let range = DamagedRange::find(file, header, position, file_len, last, next_base)?;
        let found = range.next;
        p.detail = range.describe(&end);
        p.unreadable = Some(Box::new(range));
        let Some(r) = found else {
            return Ok(());
        };
        let mut reader = RecordReader::new(file, header.generation, r.position, file_len);
        end = loop {
            match reader.next_record()? {
                Next::Record { position, record } => {
                    if last.is_some_and(|prev| record.offset <= prev) {
                        break ScanEnd::OffsetOrder {
                            position,
                            offset: record.offset,
                            previous: last,
                            base_offset: header.base_offset,
                        };
                    }
                    seg.records = Some(seg.records.unwrap_or(0) + 1);
                    seg.first_offset.get_or_insert(record.offset);
                    seg.last_offset = Some(record.offset);
                    last = Some(record.offset);
                }
                Next::End(None) => break ScanEnd::Eof,
                Next::End(Some(e)) => break ScanEnd::Record(e),
            }
        };
        let after = classify_scan_end(&seg.files, false, file, &end, last, file_len, next_base)?;
        if let Some(mut p) = after {
            if p.severity < Severity::Corrupt {
                // Zeros or stale records after the last records: recovery leaves the
                // damaged segment as it is, this tail included.
                p.detail = format!(
                    "{}; after damage earlier in this segment, so recover leaves it with the segment",
                    end.detail()
                );
            }
            seg.problems.push(p);
        }
    }
}

/// A segment path that is no regular file (a FIFO, a directory): corruption of that
/// segment, reported like an unreadable header and never read. Other errors pass.
fn not_a_segment(files: &SegmentFiles, active: bool, e: io::Error) -> io::Result<SegmentCheck> {
    let Some(n) = not_regular_file(&e) else {
        return Err(e);
    };
    let header = Err(HeaderError::NotRegularFile { what: n.what });
    let mut problem = header_problem(
        &HeaderError::NotRegularFile { what: n.what },
        files,
        active,
        0,
    );
    problem.detail = format!(
        "not a regular file but a {}, so no segment: recover leaves it for an operator",
        n.what
    );
    Ok(SegmentCheck {
        files: files.clone(),
        active,
        file_len: 0,
        header,
        scan: None,
        trusted_by_index: false,
        first_offset: None,
        last_offset: None,
        records: None,
        data_end: 0,
        index: IndexState::NotChecked,
        problems: vec![problem],
    })
}

/// The header of a segment, or the problem that makes it unreadable: a header that
/// fails its checks, or whose base offset is not the one in the file name.
pub fn segment_header(
    files: &SegmentFiles,
    active: bool,
    file_len: u64,
    header: &Result<SegmentHeader, HeaderError>,
) -> Result<SegmentHeader, Problem> {
    match header {
        Ok(h) if h.base_offset == files.base_offset => Ok(*h),
        Ok(h) if active && h.is_spare() && files.base_offset != h.base_offset => {
            let detail = format!(
                "the header still marks an unassigned spare (base_offset {}, generation {}): the newest segment never became durable ({file_len} bytes, no record acknowledged); recover removes it",
                h.base_offset, h.generation
            );
            Err(problem(
                ProblemKind::NeverDurableSegment,
                &files.log,
                Some(0),
                None,
                detail,
            ))
        }
        Ok(h) => {
            let detail = format!(
                "header base_offset {} does not match the file name's {}; no record in it can be trusted",
                h.base_offset, files.base_offset
            );
            Err(problem(
                ProblemKind::BaseOffsetMismatch,
                &files.log,
                Some(8),
                None,
                detail,
            ))
        }
        Err(e) => Err(header_problem(e, files, active, file_len)),
    }
}

fn header_problem(e: &HeaderError, files: &SegmentFiles, active: bool, file_len: u64) -> Problem {
    let never_durable = active && matches!(e, HeaderError::Short { .. } | HeaderError::AllZero);
    if never_durable {
        let detail = format!(
            "{e}: the newest segment never became durable ({file_len} bytes, no record acknowledged); recover removes it"
        );
        return problem(
            ProblemKind::NeverDurableSegment,
            &files.log,
            Some(0),
            None,
            detail,
        );
    }
    let detail = format!("{e}; the whole segment ({file_len} bytes) cannot be read");
    problem(
        ProblemKind::of_header_error(e),
        &files.log,
        Some(e.position()),
        Some(files.base_offset),
        detail,
    )
}

/// Sorts what ends the scan into a problem (or none).
fn classify_end(
    seg: &mut SegmentCheck,
    file: &File,
    scan: &ScanSummary,
    next_base: Option<u64>,
) -> io::Result<()> {
    let p = classify_scan_end(
        &seg.files,
        seg.active,
        file,
        &scan.end,
        scan.last_offset,
        scan.file_len,
        next_base,
    )?;
    seg.problems.extend(p);
    Ok(())
}

/// Sorts what ends a segment's valid data into a problem (or none when the data ends
/// exactly at the end of the file). `last_offset` is the last valid record's offset.
/// Shared by the check and by readers that stream records (`dump`), so both name a
/// damaged tail the same way.
pub fn classify_scan_end(
    files: &SegmentFiles,
    active: bool,
    file: &File,
    end: &ScanEnd,
    last_offset: Option<u64>,
    file_len: u64,
    next_base: Option<u64>,
) -> io::Result<Option<Problem>> {
    let (Some(position), Some(damage)) = (end.position(), ProblemKind::of_sealed_end(end)) else {
        return Ok(None);
    };
    let log = &files.log;
    let tail = file_len.saturating_sub(position);
    // No next offset after a record at u64::MAX.
    let next = match last_offset {
        Some(o) => o.checked_add(1),
        None => Some(files.base_offset),
    };
    let zero_to_end = matches!(end, ScanEnd::Record(RecordError::Zero { .. }))
        && range_is_zero(file, position, file_len)?;
    // A record that passes its CRC under an older generation starts an unfinished
    // seal's stale tail only when no record of the segment's own generation follows
    // it: a reused file's old records lie past everything the writer wrote, while a
    // flipped low bit of a CRC in the middle of the data looks the same at first.
    let stale_looking = match end {
        ScanEnd::Record(RecordError::StaleGeneration {
            position,
            generation,
            ..
        }) => !own_record_follows(file, *generation, *position, file_len)?,
        _ => false,
    };
    // An unfinished seal only ever follows all of the segment's records: the next
    // segment's header is written once they are durable (FORMAT, Segment states).
    // Records still missing below the next base mean the tail is damage where the
    // segment's own last records were, whatever it looks like.
    let holds_all = match next_base {
        Some(nb) => next == Some(nb),
        None => true,
    };
    let stale = !active && stale_looking && holds_all;
    let zero_seal = !active && zero_to_end && holds_all;
    let stale_in_active = active && stale_looking;
    // After a crash, a reused active segment's data may end inside a record the older
    // generation wrote (records of other lengths): the bytes there are no record at
    // all, yet no torn write either.
    let inside_stale = match end {
        ScanEnd::Record(e)
            if active && !zero_to_end && !matches!(e, RecordError::StaleGeneration { .. }) =>
        {
            stale_inside(file, position, file_len, next)?
        }
        _ => None,
    };
    let p = if active {
        match end {
            // Preallocated, zeroed space: kept, so a restart keeps it.
            ScanEnd::Record(RecordError::Zero { .. }) if zero_to_end => problem(
                ProblemKind::ZeroTail,
                log,
                Some(position),
                None,
                format!("{tail} unwritten (zero) bytes after the data (preallocated space); recover keeps them"),
            ),
            ScanEnd::Record(RecordError::StaleGeneration { writer_generation, .. }) if stale_in_active => problem(
                ProblemKind::StaleTail,
                log,
                Some(position),
                None,
                format!("{tail} bytes after the data hold records of older generation {writer_generation}; recover trims them"),
            ),
            _ if inside_stale.is_some() => problem(
                ProblemKind::StaleTail,
                log,
                Some(position),
                None,
                match inside_stale.flatten() {
                    Some(g) => format!(
                        "{tail} bytes after the data begin inside a record of an older generation and hold records of generation {g} after it (the writer's data ended there); recover trims them"
                    ),
                    None => format!(
                        "{tail} bytes after the data are the rest of the last record an older generation wrote (the writer's data ended inside it); recover trims them"
                    ),
                },
            ),
            end => {
                let behind = match (next, read_header(file, file_len)?) {
                    (Some(next), Ok(header)) => {
                        records_behind_in(file, header.generation, position, file_len, next)?
                    }
                    _ => None,
                };
                let mut p = problem(
                    ProblemKind::TornTail,
                    log,
                    Some(position),
                    next,
                    match behind {
                        None => format!(
                            "{}; the {tail} bytes from here were never acknowledged, recover cuts them",
                            end.detail()
                        ),
                        Some(r) => format!(
                            "{}; {} follow it in the {tail} bytes from here ({RECORDS_BEHIND_MAY_BE}); recover cuts them all ({CUT_TAIL_KEEP})",
                            end.detail(),
                            r.describe(),
                        ),
                    },
                );
                p.behind = behind.map(Box::new);
                p
            }
        }
    } else if zero_seal || stale {
        let what = if stale {
            "records of an older generation"
        } else {
            "zero bytes"
        };
        problem(
            ProblemKind::UnfinishedSeal,
            log,
            Some(position),
            None,
            format!("sealed segment ends with {tail} bytes of {what} after its data (an unfinished roll); recover cuts them"),
        )
    } else {
        problem(
            damage,
            log,
            Some(position),
            next,
            format!(
                "{}; bytes {position}..{file_len} ({tail} bytes) of this sealed segment cannot be read",
                end.detail(),
            ),
        )
    };
    Ok(Some(p))
}

/// Valid records found behind damage (and cut with it when the damage is the active
/// segment's tail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordsBehind {
    pub first_offset: u64,
    pub last_offset: u64,
    pub count: u64,
}

impl RecordsBehind {
    /// "N valid record(s), offsets a..=b".
    pub fn describe(&self) -> String {
        format!(
            "{} valid record(s), offsets {}..={}",
            self.count, self.first_offset, self.last_offset
        )
    }
}

/// What whole records behind an active segment's damaged tail may be: a crash during
/// one group commit can leave later pages of its write durable and an earlier one not
/// (none of them acknowledged), while damage to data older than the last crash (a
/// flipped bit, a bad sector) looks the same, and then they were acknowledged.
/// FORMAT's recovery cuts them either way; the wording never claims to know which.
pub const RECORDS_BEHIND_MAY_BE: &str = "never acknowledged if a crash tore the group commit that wrote them, acknowledged if this is damage to older data";

/// How an operator keeps what recovery cuts from an active segment's damaged tail.
pub const CUT_TAIL_KEEP: &str =
    "the broker's start cuts them too; `seglog recover --backup-dir DIR` keeps a copy first";

/// The valid records of `generation` that follow the damaged record at `from`
/// (where offset `next_offset` would start), up to `limit`: stepping over it by its
/// claimed length, else, when that length is damaged too (or finds nothing), from
/// the first position after it where a record of an offset from `next_offset` on
/// decodes (docs/FORMAT.md, Reading around damage), searched for within
/// [`MAX_RECORD_LEN`] bytes of the damage. Zeros or a torn write at the tail find
/// none. Used by the check to word an active segment's damaged tail and by
/// recovery to name what its cut takes.
pub fn records_behind_in(
    file: &File,
    generation: u64,
    from: u64,
    limit: u64,
    next_offset: u64,
) -> io::Result<Option<RecordsBehind>> {
    let records_from = |at: u64| -> io::Result<Option<RecordsBehind>> {
        let mut reader = RecordReader::new(file, generation, at, limit);
        let mut found: Option<RecordsBehind> = None;
        while let Next::Record { record, .. } = reader.next_record()? {
            match &mut found {
                None => {
                    found = Some(RecordsBehind {
                        first_offset: record.offset,
                        last_offset: record.offset,
                        count: 1,
                    });
                }
                Some(r) if record.offset > r.last_offset => {
                    r.last_offset = record.offset;
                    r.count += 1;
                }
                Some(_) => break,
            }
        }
        Ok(found)
    };
    let mut len_field = [0u8; LEN_FIELD];
    let n = read_full_at(file, &mut len_field, from)?;
    if let Some(claimed) = claimed_encoded_len(len_field.get(..n).unwrap_or(&[])) {
        if let Some(found) = records_from(from + claimed)? {
            return Ok(Some(found));
        }
    }
    // Searched for within one largest record past the damage: a preallocated or
    // reused tail can be long, and this only names what the cut takes.
    let search_end = limit.min(from.saturating_add(u64::from(MAX_RECORD_LEN)));
    // The active segment's offsets follow one another, one record (more than one
    // byte) each: a record `k` bytes past the damage holds an offset below
    // `next_offset + k`. The bound makes the search skip nearly every position of
    // random bytes without reading the record it claims (unbounded, 20 MiB of random
    // bytes took 13 s of reads).
    let max_offset = next_offset.checked_add(search_end.saturating_sub(from));
    match resync(
        file,
        generation,
        from + 1,
        search_end,
        next_offset,
        max_offset,
    )? {
        Some(r) => records_from(r.position),
        None => Ok(None),
    }
}

/// Whether a valid record of `generation` follows the (whole, stale-looking) record
/// at `position`, before `file_len`.
/// Bytes past the end of a reused active segment's data searched for a whole record
/// by [`stale_inside`] (the record itself may run up to as far again).
const STALE_SEARCH_BYTES: u64 = 1024 * 1024;

/// Whether the bytes at `position`, where a reused active segment's valid data ends
/// on bytes that are no record, are the rest of a record an older generation wrote.
/// Never when they start a record of the next offset `next` (a torn write of the
/// writer's). They are when the first whole record found past `position` (starting
/// within [`STALE_SEARCH_BYTES`]) is of an older generation (`Some(Some(its
/// generation's low 32 bits))`), or when no whole record is found in the rest of the
/// file and the bytes at `position` are no record by their lengths (`Some(None)`:
/// the rest of the older generation's last record). A record of the file's own
/// generation found first means damage inside the writer's data (`None`); so does
/// a file of generation 0 (never reused).
fn stale_inside(
    file: &File,
    position: u64,
    file_len: u64,
    next: Option<u64>,
) -> io::Result<Option<Option<u32>>> {
    let Ok(header) = read_header(file, file_len)? else {
        return Ok(None);
    };
    if header.generation == 0 || position >= file_len {
        return Ok(None);
    }
    // At most 2 MiB, whatever the file's length.
    let want = (file_len - position).min(2 * STALE_SEARCH_BYTES);
    let mut buf = vec![0u8; usize::try_from(want).unwrap_or(0)];
    let n = read_full_at(file, &mut buf, position)?;
    buf.truncate(n);
    // The writer's own record of the next offset, torn or damaged (whatever its
    // length field says).
    if next.is_some() && peek_offset(&buf) == next {
        return Ok(None);
    }
    let search = buf
        .len()
        .min(usize::try_from(STALE_SEARCH_BYTES).unwrap_or(usize::MAX));
    for at in 1..search {
        let Some(avail) = buf.get(at..) else {
            break;
        };
        match decode_record(avail, position + at as u64, header.generation) {
            Ok(_) => return Ok(None),
            Err(RecordError::StaleGeneration {
                writer_generation, ..
            }) => return Ok(Some(Some(writer_generation))),
            Err(_) => {}
        }
    }
    // No whole record at all in the rest of the file: the writer's data ended inside
    // the last record the older generation wrote (a spare ends where its data
    // ended). Only when the bytes at `position` are no record by their lengths
    // either: lengths that hold and a CRC that fails are a record of the writer's,
    // damaged.
    let searched_all =
        (buf.len() as u64) == file_len - position && file_len - position <= STALE_SEARCH_BYTES;
    let shapeless = matches!(
        decode_record(&buf, position, header.generation),
        Err(RecordError::ImplausibleLength { .. }
            | RecordError::BadKeyLen { .. }
            | RecordError::BadValueLen { .. }
            | RecordError::Truncated { .. }
            | RecordError::Zero { .. })
    );
    Ok((searched_all && shapeless).then_some(None))
}

fn own_record_follows(
    file: &File,
    generation: u64,
    position: u64,
    file_len: u64,
) -> io::Result<bool> {
    let mut len_field = [0u8; LEN_FIELD];
    let n = read_full_at(file, &mut len_field, position)?;
    let Some(claimed) = claimed_encoded_len(len_field.get(..n).unwrap_or(&[])) else {
        return Ok(false);
    };
    let Some(next) = position.checked_add(claimed).filter(|&p| p < file_len) else {
        return Ok(false);
    };
    let mut reader = RecordReader::new(file, generation, next, file_len);
    Ok(matches!(reader.next_record()?, Next::Record { .. }))
}

/// The startup check of a sealed segment against its index: the first record and
/// every record after the last index entry decode, pass their CRC, increase, need no
/// further index entry, and end exactly at the end of the file. Returns the first and
/// last offsets when it passes.
pub fn quick_check(
    file: &File,
    header: &SegmentHeader,
    file_len: u64,
    index: &[u8],
) -> io::Result<Option<(u64, u64)>> {
    let Ok(entries) = decode_index(index, Some(file_len)) else {
        return Ok(None);
    };
    let (Some(first_entry), Some(last_entry)) = (entries.first(), entries.last()) else {
        return Ok(None);
    };
    quick_check_entries(file, header, file_len, *first_entry, *last_entry)
}

/// Bytes read per system call by the quick check: the first record, and the tail
/// after the last index entry (at most 4 KiB plus one record; a longer record is
/// read in full all the same).
pub const QUICK_WINDOW_BYTES: usize = 8 * 1024;

/// The first and last entries of an index file, read without the rest: `None` when
/// the file is missing, empty or no regular file, its length is not a multiple of 16,
/// or the two entries are not in order inside `..file_len`.
pub fn read_index_ends(path: &Path, file_len: u64) -> io::Result<Option<(IndexEntry, IndexEntry)>> {
    let (file, len) = match open_log(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound || not_regular_file(&e).is_some() => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let entry_len = INDEX_ENTRY_LEN as u64;
    if len == 0 || len % entry_len != 0 || len > INDEX_BYTES_MAX {
        return Ok(None);
    }
    let mut buf = [0u8; INDEX_ENTRY_LEN];
    let mut entry_at = |pos: u64| -> io::Result<Option<IndexEntry>> {
        let n = crate::engine::storage::reader::read_full_at(&file, &mut buf, pos)?;
        Ok(buf.get(..n).and_then(IndexEntry::decode))
    };
    let (Some(first), Some(last)) = (entry_at(0)?, entry_at(len - entry_len)?) else {
        return Ok(None);
    };
    let ordered = len == entry_len
        || (last.relative_offset > first.relative_offset && last.position > first.position);
    if !ordered || last.position >= file_len {
        return Ok(None);
    }
    Ok(Some((first, last)))
}

/// [`quick_check`] given the index's first and last entries.
pub fn quick_check_entries(
    file: &File,
    header: &SegmentHeader,
    file_len: u64,
    first_entry: IndexEntry,
    last_entry: IndexEntry,
) -> io::Result<Option<(u64, u64)>> {
    let (first_entry, last_entry) = (&first_entry, &last_entry);
    if first_entry.position != HEADER_LEN as u64 {
        return Ok(None);
    }
    let mut reader = RecordReader::with_window(
        file,
        header.generation,
        HEADER_LEN as u64,
        file_len,
        QUICK_WINDOW_BYTES,
    );
    let first = match reader.next_record()? {
        Next::Record { record, .. }
            if record.offset.checked_sub(header.base_offset)
                == Some(first_entry.relative_offset) =>
        {
            record.offset
        }
        _ => return Ok(None),
    };
    let mut reader = RecordReader::with_window(
        file,
        header.generation,
        last_entry.position,
        file_len,
        QUICK_WINDOW_BYTES,
    );
    let mut builder = IndexBuilder::resume(Some(*last_entry));
    let mut last: Option<u64> = None;
    loop {
        match reader.next_record()? {
            Next::Record { position, record } => {
                match last {
                    None if record.offset.checked_sub(header.base_offset)
                        != Some(last_entry.relative_offset) =>
                    {
                        return Ok(None)
                    }
                    Some(prev) if record.offset <= prev => return Ok(None),
                    Some(_)
                        if builder
                            .observe(header.base_offset, record.offset, position)
                            .is_some() =>
                    {
                        return Ok(None)
                    }
                    _ => {}
                }
                last = Some(record.offset);
            }
            Next::End(None) => break,
            Next::End(Some(_)) => return Ok(None),
        }
    }
    Ok(last.map(|l| (first, l)))
}

/// Compares an index file with the index the rule gives for the scanned records.
/// For a segment with corrupt data, only entries inside the readable data count.
fn compare_index(bytes: Option<&IndexBytes>, scan: &ScanSummary, corrupt: bool) -> IndexState {
    let bytes = match bytes {
        None => return IndexState::Missing,
        Some(Err(e)) => return IndexState::Invalid(e.clone()),
        Some(Ok(b)) => b,
    };
    let len = bytes.len() as u64;
    if len % INDEX_ENTRY_LEN as u64 != 0 {
        return IndexState::Invalid(IndexError::PartialEntry { len });
    }
    let found: Vec<IndexEntry> = bytes
        .chunks_exact(INDEX_ENTRY_LEN)
        .filter_map(IndexEntry::decode)
        .collect();
    let found: &[IndexEntry] = if corrupt {
        let n = found
            .iter()
            .take_while(|e| e.position < scan.data_end)
            .count();
        found.get(..n).unwrap_or(&[])
    } else {
        &found
    };
    for (i, (f, want)) in found.iter().zip(scan.index.iter()).enumerate() {
        if f != want {
            let at = (i * INDEX_ENTRY_LEN) as u64;
            if f.position >= scan.data_end {
                return IndexState::Invalid(IndexError::PastData {
                    at,
                    position: f.position,
                    data_end: scan.data_end,
                });
            }
            return IndexState::Invalid(IndexError::WrongEntry {
                at,
                found_relative_offset: f.relative_offset,
                found_position: f.position,
                relative_offset: want.relative_offset,
                position: want.position,
            });
        }
    }
    if found.len() != scan.index.len() {
        let at = (found.len().min(scan.index.len()) * INDEX_ENTRY_LEN) as u64;
        if let Some(extra) = found.get(scan.index.len()) {
            if extra.position >= scan.data_end {
                return IndexState::Invalid(IndexError::PastData {
                    at,
                    position: extra.position,
                    data_end: scan.data_end,
                });
            }
        }
        return IndexState::Invalid(IndexError::WrongCount {
            at,
            found: found.len() as u64,
            expected: scan.index.len() as u64,
        });
    }
    IndexState::Valid
}

fn index_problem(state: &IndexState, files: &SegmentFiles, active: bool) -> Option<Problem> {
    let which = if active { "active" } else { "sealed" };
    match state {
        IndexState::Valid | IndexState::NotChecked => None,
        IndexState::Missing => Some(problem(
            ProblemKind::MissingIndex,
            &files.index,
            None,
            None,
            format!("index of the {which} segment is missing (reindex or recover rebuilds it)"),
        )),
        IndexState::Invalid(e) => Some(problem(
            ProblemKind::of_index_error(e),
            &files.index,
            Some(e.position()),
            None,
            // recover rebuilds it only when the startup check's reads (the first and
            // last entries) meet the damage; reindex always does. Neither removes a
            // directory or other special file: that is the operator's to move away.
            match e {
                IndexError::NotRegularFile { .. } => {
                    format!("{e} (move it away, then `seglog reindex` rebuilds the index)")
                }
                _ => format!("{e} (`seglog reindex` rebuilds it)"),
            },
        )),
    }
}

/// Segments tile the offsets (docs/FORMAT.md, Segment states), in every topic,
/// compacted or not: each segment's base is the previous segment's last record + 1,
/// and its records lie in `base ..` the next base − 1 (the scan already stops at a
/// record below the base). A segment without records and with a valid header (an
/// empty newest segment) tiles with its base: the next record goes there.
///
/// A segment whose header is unreadable, or never became durable, is not compared:
/// its records are unknown (a never-durable newest segment may be named after records
/// of the segment before that were lost with it, never acknowledged). Offsets missing
/// after a corrupt segment are that corruption, already reported, not a second problem.
fn check_continuity(out: &mut PartitionCheck) {
    // The offset the next segment's base must be, and the segment that gives it.
    let mut prev: Option<(u64, &SegmentCheck)> = None;
    let mut gap_explained = false;
    let mut found = Vec::new();
    for seg in &out.segments {
        let valid_header =
            matches!(&seg.header, Ok(h) if h.base_offset == seg.base_offset() && !h.is_spare());
        if !valid_header {
            gap_explained |= seg.is_corrupt();
            continue;
        }
        let base = seg.base_offset();
        if let Some((next_base, p)) = prev {
            let p_name = p
                .files
                .log
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if base < next_base {
                let detail = match p.last_offset {
                    Some(last) => format!(
                        "segment base {base} is not above offset {last} that {p_name} ends with (a segment's records lie below the next base)"
                    ),
                    None => format!(
                        "segment base {base} is not above the base {next_base} of the empty segment {p_name}"
                    ),
                };
                found.push(problem(
                    ProblemKind::SegmentsOverlap,
                    &seg.files.log,
                    Some(HEADER_LEN as u64),
                    Some(seg.first_offset.unwrap_or(base)),
                    detail,
                ));
            } else if !gap_explained && base != next_base {
                found.push(problem(
                    ProblemKind::SegmentsDoNotJoin,
                    &seg.files.log,
                    Some(HEADER_LEN as u64),
                    Some(next_base),
                    format!(
                        "offsets {next_base}..={} are missing between this segment and the one before (a segment is lost)",
                        base - 1
                    ),
                ));
            }
        }
        match seg.last_offset {
            Some(last) => prev = Some((last.saturating_add(1), seg)),
            None if !seg.is_corrupt() => prev = Some((base, seg)),
            None => {}
        }
        gap_explained = seg.is_corrupt();
    }
    out.problems.extend(found);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the check reports for decoder errors are the names the decoders give
    /// them, so reports and decoders never disagree.
    #[test]
    fn kinds_of_decoder_errors_keep_the_decoders_names() {
        let headers = [
            HeaderError::Short { len: 3 },
            HeaderError::AllZero,
            HeaderError::BadMagic { found: [0; 4] },
            HeaderError::BadVersion { found: 9 },
            HeaderError::BadHeaderLen { found: 9 },
            HeaderError::UnknownFlags { found: 1 },
            HeaderError::CrcMismatch {
                stored: 1,
                computed: 2,
            },
        ];
        for e in &headers {
            assert_eq!(ProblemKind::of_header_error(e).as_str(), e.kind(), "{e:?}");
        }
        let indexes = [
            IndexError::PartialEntry { len: 3 },
            IndexError::NotIncreasing {
                at: 0,
                relative_offset: 0,
                position: 0,
            },
            IndexError::PastData {
                at: 0,
                position: 0,
                data_end: 0,
            },
            IndexError::WrongEntry {
                at: 0,
                found_relative_offset: 0,
                found_position: 0,
                relative_offset: 0,
                position: 0,
            },
            IndexError::WrongCount {
                at: 0,
                found: 0,
                expected: 0,
            },
        ];
        for e in &indexes {
            assert_eq!(ProblemKind::of_index_error(e).as_str(), e.kind(), "{e:?}");
        }
        let ends = [
            ScanEnd::Record(RecordError::Zero { position: 32 }),
            ScanEnd::Record(RecordError::Truncated {
                position: 32,
                needed: 9,
                available: 1,
            }),
            ScanEnd::Record(RecordError::ImplausibleLength {
                position: 32,
                record_len: 1,
            }),
            ScanEnd::Record(RecordError::BadKeyLen {
                position: 32,
                key_len: 7,
                record_len: 30,
            }),
            ScanEnd::Record(RecordError::BadValueLen {
                position: 32,
                value_len: 7,
                expected: 1,
            }),
            ScanEnd::Record(RecordError::CrcMismatch {
                position: 32,
                stored: 1,
                expected: 2,
                computed: 3,
            }),
            ScanEnd::Record(RecordError::StaleGeneration {
                position: 32,
                writer_generation: 1,
                generation: 2,
            }),
            ScanEnd::Record(RecordError::TooLarge { len: u64::MAX }),
            ScanEnd::OffsetOrder {
                position: 32,
                offset: 1,
                previous: Some(2),
                base_offset: 0,
            },
        ];
        for end in &ends {
            let kind = ProblemKind::of_sealed_end(end);
            assert_eq!(kind.map(ProblemKind::as_str), Some(end.kind()), "{end:?}");
            assert_eq!(kind.map(ProblemKind::severity), Some(Severity::Corrupt));
        }
        assert_eq!(ProblemKind::of_sealed_end(&ScanEnd::Eof), None);
    }

    #[test]
    fn json_names_are_the_stable_names() {
        for kind in [
            ProblemKind::UnfinishedCompaction,
            ProblemKind::SegmentsDoNotJoin,
            ProblemKind::NeverDurableSegment,
            ProblemKind::TornTail,
            ProblemKind::ZeroTail,
            ProblemKind::SealedZeroRun,
            ProblemKind::OffsetOutOfOrder,
            ProblemKind::WrongIndexLength,
        ] {
            let json = serde_json::to_value(kind).unwrap_or_default();
            assert_eq!(json.as_str(), Some(kind.as_str()), "{kind:?}");
            assert_eq!(kind.to_string(), kind.as_str());
        }
    }
}
