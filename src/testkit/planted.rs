//! Planted bugs for the crash simulator: each flag, when set, makes the code under
//! test skip or reorder one durability step, so the crash tests can show that they
//! notice. All are false unless a test sets them; checking one costs a relaxed load.

use std::sync::atomic::AtomicBool;

/// log.rs: a roll's new segment names are not made durable (no directory fsync).
pub static SKIP_ROLL_DIR_FSYNC: AtomicBool = AtomicBool::new(false);
/// log.rs: a produce is acknowledged before the fsync that covers it.
pub static ACK_BEFORE_FSYNC: AtomicBool = AtomicBool::new(false);
/// recovery.rs: a torn tail is not truncated (only fsynced).
pub static SKIP_TORN_TAIL_TRUNCATE: AtomicBool = AtomicBool::new(false);
/// log.rs: a failed fsync is retried, and the retry's success acknowledges.
pub static RETRY_FAILED_FSYNC: AtomicBool = AtomicBool::new(false);
/// compaction.rs: the results are renamed into place before the marker is durable.
pub static RENAME_BEFORE_MARKER: AtomicBool = AtomicBool::new(false);
/// io.rs: an atomic file replace (topic.json, the marker) skips its directory fsync.
pub static SKIP_ATOMIC_DIR_FSYNC: AtomicBool = AtomicBool::new(false);
/// log.rs: retention removes segments without the directory fsync between them (a
/// newer segment's removal may persist while an older one's is lost).
pub static UNORDERED_RETENTION_REMOVALS: AtomicBool = AtomicBool::new(false);
/// log.rs: retention returns without the directory fsync after its removals (a
/// removed segment may come back after a crash).
pub static SKIP_RETENTION_DIR_FSYNC: AtomicBool = AtomicBool::new(false);
/// partition/roll.rs: a roll writes the new segment's header when it creates the file,
/// before the outgoing segment's last records are durable.
pub static ROLL_BEFORE_DATA_DURABLE: AtomicBool = AtomicBool::new(false);
/// partition/zero.rs: the zero worker starts its pieces page-aligned at or below the
/// writer's end, so zeros land on live data.
pub static ZEROS_OVER_LIVE_DATA: AtomicBool = AtomicBool::new(false);
/// partition/open.rs: opening the active segment reads its zero tail as records, so
/// the end of the data moves to the end of the preallocated space.
pub static ZEROS_AS_RECORDS: AtomicBool = AtomicBool::new(false);
/// producers: an idempotent batch is acknowledged before its journal entry is durable.
pub static ACK_BEFORE_JOURNAL_DURABLE: AtomicBool = AtomicBool::new(false);
/// producers: recovery replays journal entries past a partition's recovered end.
pub static REPLAY_PAST_RECOVERED_END: AtomicBool = AtomicBool::new(false);
/// partition/spares.rs: a segment enters the pool with its header rewritten but its
/// generation not increased (its old records stay valid).
pub static SPARE_WITHOUT_GENERATION_BUMP: AtomicBool = AtomicBool::new(false);
/// partition/spares.rs: startup takes the files in `spares/` as they are, without the
/// header rewrite (generation + 1).
pub static SPARE_NOT_RESTAMPED_AT_STARTUP: AtomicBool = AtomicBool::new(false);
/// partition/roll.rs: a roll that takes a spare writes the new segment's base offset
/// into its header at once, before the outgoing segment is durable.
pub static SPARE_BASE_BEFORE_DATA_DURABLE: AtomicBool = AtomicBool::new(false);
/// maintenance/compaction/swap.rs: a broker compaction moves the replaced segments'
/// logs to the spares before its marker is durable.
pub static KEEP_BEFORE_MARKER: AtomicBool = AtomicBool::new(false);
/// partition/append.rs: an append with a step before its write (an idempotent
/// producer's journal entry) writes the records first, then runs the step.
pub static WRITE_BEFORE_JOURNAL: AtomicBool = AtomicBool::new(false);
/// partition/journal.rs: a sync of a partition's data runs without first making the
/// producer journal durable up to the entries of the records it covers.
pub static PARTITION_SYNC_BEFORE_JOURNAL: AtomicBool = AtomicBool::new(false);
