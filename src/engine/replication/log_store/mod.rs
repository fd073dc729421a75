//! The Raft log of one replicated partition, kept on disk in the segment format.
//!
//! A group's log lives in its own directory (`DATA/raft/<topic>/<partition>/`,
//! docs/FORMAT.md, Raft logs): the segments of a [`PartitionLog`] whose record at
//! offset `i` is the entry at Raft index `i`, with a fixed 17-byte key ([`key`]: term,
//! leader node id, kind) and the payload as value (normal entries:
//! [`EntryCodec::encode`]; membership entries: JSON), and beside `log/`, `raft.json` ([`meta`]):
//! the vote, the committed log id and the last purged log id, replaced atomically.
//!
//! The API:
//! - [`RaftLog::open`]`(dir, storage, stats) -> Result<RaftLog<C>, RaftLogError>`
//!   recovers the directory (a torn tail is cut as for any partition) and opens it;
//! - [`RaftLog`] implements openraft's [`openraft::storage::RaftLogStorage`] and
//!   [`openraft::storage::RaftLogReader`] for every `C:` [`RaftLogTypes`] (the bounds,
//!   stated once); it is `Clone` (its reader is a clone);
//! - [`RaftLog::partition_log`], [`RaftLog::state`], [`RaftLog::dir`] for status and
//!   tools.
//!
//! Invariants:
//! - `append` returns after the write; openraft's flushed callback is called only
//!   after the group-commit fsync covering the entries (one fsync for every append
//!   queued meanwhile). Until then reads serve the entries from memory.
//! - `truncate_after` and `purge` are durable before they return; the purge point is
//!   recorded before any segment is deleted, and only whole segments at or below it
//!   go. A log purged past its end continues at the purge point + 1.
//! - Every length read from disk is checked against a limit before allocating
//!   ([`meta::STATE_FILE_BYTES_MAX`], [`ENTRY_VALUE_BYTES_MAX`], the segment reader's).

use std::path::Path;

use crate::engine::maintenance::recovery::{execute, plan_partition, RecoveryPlan};
use crate::engine::storage::io::Storage;
use crate::engine::storage::layout::PartitionRef;

pub mod entry;
pub mod key;
pub mod meta;
mod store;

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests;

pub use entry::{StoredEntry, StoredLeaderId, StoredLogId};
pub use store::{raft_log_config, RaftLog, RaftLogError, RaftLogTypes, ENTRY_VALUE_BYTES_MAX};

/// The directory of a Raft log's segments, inside the log's directory (beside
/// [`meta::STATE_FILE`]): it holds segment files only, so the offline tools check it
/// as any partition.
pub const LOG_DIR: &str = crate::engine::storage::layout::RAFT_LOG_DIR;

/// How a Raft entry's application payload is turned into the bytes of a record value
/// and back. Decoding reads bytes from disk or the network: it checks every length
/// against a limit before it allocates, and refuses what it cannot read with an error,
/// never a panic.
pub trait EntryCodec: Sized {
    /// Appends the payload's encoding to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Decodes a payload that [`EntryCodec::encode`] wrote.
    fn decode(bytes: &[u8]) -> Result<Self, EntryCodecError>;
}

/// A payload that could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("bad Raft entry payload: {0}")]
pub struct EntryCodecError(pub String);

/// Runs the partition recovery (the one `seglog recover` and broker startup run) on a
/// Raft log's directory, when it holds segments: a torn or corrupt tail is cut.
pub(crate) fn recover_dir(storage: &dyn Storage, dir: &Path) -> Result<(), RaftLogError> {
    let has_segments = std::fs::read_dir(dir)
        .map_err(|source| RaftLogError::Create {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().ends_with(".log"));
    if !has_segments {
        return Ok(());
    }
    let recovery = |detail: String| RaftLogError::Recovery {
        path: dir.to_path_buf(),
        detail,
    };
    let pref = PartitionRef {
        dir: dir.to_path_buf(),
        topic: None,
        partition: None,
        config: raft_log_config(),
        only_segment: None,
    };
    let pp = plan_partition(&pref).map_err(|e| recovery(e.to_string()))?;
    if pp.refuses_writes {
        return Err(recovery("the newest segment cannot be appended to".into()));
    }
    if pp.actions.is_empty() {
        return Ok(());
    }
    let plan = RecoveryPlan {
        root: dir.to_path_buf(),
        partitions: vec![pp],
        topics: Vec::new(),
    };
    execute(storage, &plan, None).map_err(|e| recovery(e.to_string()))?;
    Ok(())
}
