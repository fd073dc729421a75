//! The journal barrier: an idempotent producer's journal entry is written just before
//! its batch's records ([`PartitionLog::append_with`]) and made durable by a group
//! fdatasync of its own, so the records must never become durable first. Every fsync
//! or fdatasync that may cover a partition's records (a group commit, whoever runs
//! it, the syncs a roll left to it, the cut of a failed write, the cut of a stale
//! tail at a stop, a cut of the tail, the zero worker's) first makes the journal
//! durable up to the partition's [`JournalNeed`]; a power loss then keeps no record
//! without its entry, except what the kernel writes out on its own (see below).
//!
//! Invariants:
//! - A partition's need only grows. It is raised under the partition's write lock,
//!   after the step that wrote the entry and before the records are written, to the
//!   journal's written position at that moment (the entry's, or later).
//! - The need is read just before each system call, never earlier: every record
//!   written before the read is covered by the journal sync it asks for.
//! - A partition that never took a journalled append costs one atomic load per sync.
//! - When the journal cannot be made durable (it failed), the partition's sync is not
//!   run: it fails with [`JournalNotDurable`], and the log with it (its records could
//!   never be made durable without their entries).
//!
//! Not ordered by this: the kernel's own writeback, which may write a record's pages
//! at any time, and a record written while an fsync of its partition is already
//! running (after that fsync read the need), which that fsync may write out too.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::LogStats;

/// A journal whose entries must be durable before the records they name. Positions
/// count the entries written since it opened (the first is 1; 0: none).
pub trait Journal: Send + Sync + std::fmt::Debug {
    /// The position of the last entry written so far.
    fn written(&self) -> u64;

    /// Returns once every entry up to `upto` is durable: at once when they are, else
    /// after one fdatasync that covers every entry written before it (callers waiting
    /// meanwhile share it). Err: why they cannot be made durable.
    fn sync_to(&self, upto: u64) -> Result<(), String>;
}

/// How far the journal must be durable before a sync of one partition's data: the
/// journal position its newest journalled records need (0: none). Shared by the log
/// and the zero targets of its active segments.
#[derive(Debug, Default)]
pub struct JournalNeed(AtomicU64);

impl JournalNeed {
    /// Records about to be written need the journal durable up to `upto`.
    pub(super) fn raise(&self, upto: u64) {
        self.0.fetch_max(upto, Ordering::SeqCst);
    }
}

/// Why a sync of a partition's data was not run.
#[derive(Debug, thiserror::Error)]
#[error(
    "not synced: the producer journal entries of its records could not be made durable first ({0})"
)]
pub struct JournalNotDurable(pub String);

/// The [`JournalNotDurable`] an I/O error carries, if it does.
pub(super) fn not_durable(e: &io::Error) -> Option<&JournalNotDurable> {
    e.get_ref()?.downcast_ref::<JournalNotDurable>()
}

impl LogStats {
    /// Run just before every fsync or fdatasync that may cover records of the
    /// partition `need` belongs to: makes the broker's journal durable up to what its
    /// records need. Err ([`JournalNotDurable`]): the sync must not run.
    pub fn journal_barrier(&self, need: &JournalNeed) -> io::Result<()> {
        let upto = need.0.load(Ordering::SeqCst);
        if upto == 0 || planted!(PARTITION_SYNC_BEFORE_JOURNAL) {
            return Ok(());
        }
        let Some(journal) = self.journal.get() else {
            return Ok(());
        };
        journal
            .sync_to(upto)
            .map_err(|why| io::Error::other(JournalNotDurable(why)))
    }

    /// The journal's written position, to raise a partition's need to after a step
    /// that wrote an entry (0 without a journal).
    pub(super) fn journal_written(&self) -> u64 {
        self.journal.get().map_or(0, |j| j.written())
    }
}
