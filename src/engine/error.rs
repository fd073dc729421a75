//! Errors of the broker engine: what a produce, fetch or topic operation can meet.
//! Every message is one line naming the topic, partition, offset or path concerned.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::engine::maintenance::compaction::CompactionError;
use crate::engine::maintenance::recovery::RecoveryError;
use crate::engine::storage::layout::LayoutError;
use crate::format::names::NameError;
use crate::format::topic::TopicError;

/// Why a broker operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("unknown topic {topic:?}")]
    UnknownTopic { topic: String },
    #[error("topic {topic:?} has no partition {partition}")]
    UnknownPartition { topic: String, partition: u32 },
    #[error("topic {topic:?} already exists")]
    TopicExists { topic: String },
    #[error("topic {topic:?} was deleted while the request was in progress")]
    TopicDeleted { topic: String },
    #[error("invalid topic name: {0}")]
    InvalidName(#[from] NameError),
    #[error("invalid topic configuration: {0}")]
    InvalidConfig(#[from] TopicError),
    #[error("offset {offset} is out of range for {topic}/{partition}: available {start}..{end}")]
    OffsetOutOfRange {
        topic: String,
        partition: u32,
        offset: u64,
        start: u64,
        end: u64,
    },
    #[error("record of {size} bytes exceeds the limit of {max} bytes (max_record_bytes)")]
    RecordTooLarge { size: u64, max: u64 },
    #[error("produce batch of {size} bytes exceeds the limit of {max} bytes")]
    BatchTooLarge { size: u64, max: u64 },
    #[error("invalid request: {detail}")]
    InvalidRequest { detail: String },
    #[error(
        "partition {topic}/{partition} refuses writes until a restart runs recovery: {reason}"
    )]
    PartitionFailed {
        topic: String,
        partition: u32,
        reason: FailureReason,
    },
    #[error("partition {topic}/{partition} is unavailable: {reason}")]
    PartitionUnavailable {
        topic: String,
        partition: u32,
        reason: String,
    },
    #[error("data in {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// A fetch started at records that cannot be read: `first` is the first
    /// unreadable offset, `next` the next readable one (`None`: none follows).
    #[error("{}", damaged_message(topic, *partition, path, *first, *next, detail))]
    RecordsDamaged {
        topic: String,
        partition: u32,
        path: PathBuf,
        first: u64,
        next: Option<u64>,
        detail: String,
    },
    /// A fetch started at offsets of a lost segment (its `.log` gone, its `.index`
    /// kept, or both gone so that two segments do not join): `first..next` cannot be
    /// read; reading resumes at `next`.
    #[error("{}", missing_message(topic, *partition, index.as_deref(), *first, *next))]
    RecordsMissing {
        topic: String,
        partition: u32,
        /// The `.index` left of the lost segment; `None` when no file of it is left.
        index: Option<PathBuf>,
        first: u64,
        next: u64,
    },
    #[error("{path} is locked by a running broker or another tool")]
    Locked { path: PathBuf },
    #[error("the broker is shutting down")]
    ShuttingDown,
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    /// Recovery of the data directory at startup failed.
    #[error("data in {path} is corrupt: recovery failed: {source}")]
    Recovery {
        path: PathBuf,
        source: RecoveryError,
    },
    /// A background compaction of a partition failed (nothing changed, or the swap
    /// was interrupted and the log failed with it).
    #[error("{}", compaction_message(.0))]
    Compaction(#[source] CompactionError),
    /// A topic whose metadata has a problem (docs/FORMAT.md, Data directory): kept
    /// offline, its files untouched, until an operator repairs it.
    #[error("topic {topic:?} is offline: {problem}; its files are left untouched (see `seglog verify`; `seglog recover --rebuild-topic-json {topic}` writes a new topic.json)")]
    TopicOffline { topic: String, problem: String },
    /// A topic's `topic.json` could not be read or is not valid.
    #[error("{}", topic_meta_message(path, source))]
    TopicMeta {
        path: PathBuf,
        source: Box<LayoutError>,
    },
}

/// `text` on one line, its runs of white space (newlines included) made one space:
/// for messages that carry another library's text (a decoder's error, a refusal).
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `n` and the noun that goes with it: `1 partition`, `2 partitions`, `0 members`.
pub fn counted(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What a client is told of a failed compaction: an I/O error names what was being
/// compacted, unreadable data is corruption, anything else a refused request.
fn compaction_message(e: &CompactionError) -> String {
    match e {
        CompactionError::Io { path, source } => format!("compacting {}: {source}", path.display()),
        CompactionError::Unreadable { path, detail, .. } => {
            format!("data in {} is corrupt: {detail}", path.display())
        }
        other => format!("invalid request: {other}"),
    }
}

/// The one line a client is told of damaged records; [`damaged_range`] reads the
/// offsets back from it.
fn damaged_message(
    topic: &str,
    partition: u32,
    path: &std::path::Path,
    first: u64,
    next: Option<u64>,
    detail: &str,
) -> String {
    let next = next.map_or_else(|| "none".to_string(), |n| n.to_string());
    format!(
        "damaged records in {topic}/{partition}: first unreadable offset {first}, next readable offset {next} ({}: {detail}); run `seglog recover --salvage --backup-dir DIR DATA` to keep every readable record",
        path.display()
    )
}

/// The one line a client is told of a lost segment; [`damaged_range`] reads its
/// offsets back too.
fn missing_message(
    topic: &str,
    partition: u32,
    index: Option<&std::path::Path>,
    first: u64,
    next: u64,
) -> String {
    let why = match index {
        Some(index) => format!("the .log of {} is gone; its index is kept", index.display()),
        None => format!("no segment holds them: the segment ending before {first} and the one starting at {next} do not join"),
    };
    format!(
        "missing records in {topic}/{partition}: offsets {first}..={} are lost with their segment, first unreadable offset {first}, next readable offset {next} ({why}); see `seglog verify`",
        next.saturating_sub(1),
    )
}

/// The first unreadable and the next readable offset named by the message of a
/// [`EngineError::RecordsDamaged`] or [`EngineError::RecordsMissing`] (as a client
/// receives it), if it is one.
pub fn damaged_range(message: &str) -> Option<(u64, Option<u64>)> {
    let number_after = |tag: &str| -> Option<&str> {
        let rest = message.split_once(tag)?.1;
        rest.split(|c: char| !c.is_ascii_alphanumeric()).next()
    };
    let first = number_after("first unreadable offset ")?.parse().ok()?;
    let next = match number_after("next readable offset ")? {
        "none" => None,
        n => Some(n.parse().ok()?),
    };
    Some((first, next))
}

/// `topic.json` at `path`: an I/O error names the file read, anything else is
/// corruption of that file.
fn topic_meta_message(path: &std::path::Path, e: &LayoutError) -> String {
    match e {
        LayoutError::Io { path, source } => format!("reading {}: {source}", path.display()),
        other => format!("data in {} is corrupt: {other}", path.display()),
    }
}

/// Why a partition log is failed: it refuses writes until a restart runs recovery.
/// The first reason is kept for good; the I/O errors are shared by every error that
/// reports it.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FailureReason {
    /// A group-commit fsync failed (it is never retried).
    #[error("fsync in {} failed: {error}", dir.display())]
    FsyncFailed { dir: PathBuf, error: Arc<io::Error> },
    /// A write failed part-way and cutting it off (truncate, fsync) failed too.
    #[error("write to {} failed ({write}) and could not be cut off: {cut}", path.display())]
    CutFailed {
        path: PathBuf,
        write: Arc<io::Error>,
        cut: Arc<io::Error>,
    },
    /// A roll created a segment it could neither open nor remove.
    #[error("cannot open new segment {} ({open}) nor remove it ({remove})", path.display())]
    NewSegmentStuck {
        path: PathBuf,
        open: Arc<io::Error>,
        remove: Arc<io::Error>,
    },
    /// A finished compaction swap wrote a segment the log cannot open.
    #[error("cannot open segment {name} written by compaction: {error}")]
    CompactedSegmentUnopenable {
        name: String,
        error: Arc<EngineError>,
    },
    /// The segments a compaction replaced on disk were no longer the log's oldest.
    #[error("{}: the segments a compaction replaced are no longer the oldest", dir.display())]
    CompactionRaced { dir: PathBuf },
    /// A compaction swap failed after its marker was written.
    #[error("{label}: {error}")]
    CompactionInterrupted {
        label: String,
        error: Arc<CompactionError>,
    },
    /// Writing a batch failed after what names its offsets elsewhere (an idempotent
    /// producer's journal entry) was written: those offsets may not be given to
    /// other records before a restart drops that entry.
    #[error(
        "write of offsets {base_offset}..={last_offset} to {} failed ({error}) after their producer journal entry was written",
        path.display()
    )]
    WriteAfterJournal {
        path: PathBuf,
        base_offset: u64,
        last_offset: u64,
        error: Arc<EngineError>,
    },
    /// A group commit was not run: the producer journal entries of records it would
    /// have made durable could not be made durable first (the journal failed), and
    /// records must never be durable before their entries.
    #[error(
        "group commit in {} not run: the producer journal entries of its records could not be made durable first ({why})",
        dir.display()
    )]
    JournalNotDurable { dir: PathBuf, why: String },
}

/// Why an append with a step before its write ([`PartitionLog::append_with`])
/// failed: the step refused (nothing was written), or the append did.
///
/// [`PartitionLog::append_with`]: crate::engine::partition::PartitionLog::append_with
#[derive(Debug)]
pub enum AppendError<E> {
    /// The step before the write failed; no record was written.
    Before(E),
    /// The append failed.
    Engine(EngineError),
}

impl<E> From<EngineError> for AppendError<E> {
    fn from(e: EngineError) -> Self {
        AppendError::Engine(e)
    }
}

impl EngineError {
    /// An I/O error with a one-line description of what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> EngineError {
        EngineError::Io {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line() {
        let errors = [
            EngineError::UnknownTopic { topic: "t".into() },
            EngineError::OffsetOutOfRange {
                topic: "t".into(),
                partition: 0,
                offset: 9,
                start: 0,
                end: 5,
            },
            EngineError::PartitionFailed {
                topic: "t".into(),
                partition: 1,
                reason: FailureReason::FsyncFailed {
                    dir: "d".into(),
                    error: Arc::new(io::Error::other("disk full")),
                },
            },
            EngineError::io("writing x", io::Error::other("disk full")),
            EngineError::RecordsDamaged {
                topic: "t".into(),
                partition: 0,
                path: "d/00000000000000000000.log".into(),
                first: 7,
                next: Some(9),
                detail: "crc".into(),
            },
            EngineError::TopicOffline {
                topic: "t".into(),
                problem: "topics/t/topic.json: topic.json is missing".into(),
            },
        ];
        for e in errors {
            let text = e.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(!text.is_empty());
        }
    }

    #[test]
    fn damaged_range_reads_back_the_message() {
        for next in [Some(12), None] {
            let e = EngineError::RecordsDamaged {
                topic: "t".into(),
                partition: 3,
                path: "d/x.log".into(),
                first: 10,
                next,
                detail: "crc mismatch at position 5".into(),
            };
            assert_eq!(damaged_range(&e.to_string()), Some((10, next)));
        }
        assert_eq!(damaged_range("data in x is corrupt"), None);
    }
}
