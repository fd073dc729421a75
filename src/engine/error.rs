//! Errors of the broker engine: what a produce, fetch or topic operation can meet.
//! Every message is one line naming the topic, partition, offset or path concerned.

use std::io;
use std::path::PathBuf;

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
        reason: String,
    },
    #[error("partition {topic}/{partition} is unavailable: {reason}")]
    PartitionUnavailable {
        topic: String,
        partition: u32,
        reason: String,
    },
    #[error("data in {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("{path} is locked by a running broker or another tool")]
    Locked { path: PathBuf },
    #[error("the broker is shutting down")]
    ShuttingDown,
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
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
                reason: "fsync failed".into(),
            },
            EngineError::io("writing x", io::Error::other("disk full")),
        ];
        for e in errors {
            let text = e.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(!text.is_empty());
        }
    }
}
