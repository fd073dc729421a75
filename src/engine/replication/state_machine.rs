//! The state machine of a replicated partition: its data partition
//! `DATA/topics/T/P`, to which every committed normal entry's records are appended in
//! log order, so that every replica holds the same offset → record mapping.
//!
//! Invariants:
//! - Apply is deterministic: an entry's records, timestamps included, are in the entry;
//!   the idempotent producers' state lives here and changes only at apply.
//! - The producers' state is bounded, and what it forgets is decided in the log's
//!   order: the log's clock is the latest proposal time of the entries applied
//!   ([`ProduceEntry::proposed_ms`], never a replica's own clock), a producer whose
//!   last batch is [`PRODUCER_EXPIRATION_MS`] behind it is unknown from then on, and
//!   past [`PRODUCERS_MAX`] the one whose last batch is oldest is forgotten. Expired
//!   producers are dropped lazily (at a checkpoint); since the clock never goes back,
//!   when that happens changes no later decision.
//! - Each entry's records belong at a known offset, the data partition's end after
//!   the entries before it (`next_offset`). Apply may meet records already on disk
//!   (applied before a crash, after the last checkpoint): it appends only those past
//!   the partition's end, so nothing is applied twice and nothing is skipped.
//! - The checkpoint `DATA/topics/T/applied-P.json` (replaced atomically) names the
//!   last applied log id, the membership, `next_offset` and the producers' state at
//!   that point, and is written only after the data partition's fsync covering it.
//!   openraft re-applies the entries after it on restart. The Raft log is never purged
//!   past it: a snapshot ([`super::snapshot`]) is the checkpoint written when it is
//!   built, and openraft purges only below a snapshot.
//! - An applied entry is answered once its records are written, without waiting for
//!   the data partition's fsync: the entry is committed, so durable in the Raft logs
//!   of a majority, and a crash before the fsync only makes this node apply it again
//!   from its log (or a peer's). The flusher runs that fsync at once; a read on the
//!   leader waits for it first ([`Broker::settle`]), so it sees every acknowledged
//!   record.
//! - The data partition's appends are synchronous, behind the I/O seam: apply hands
//!   them to a blocking thread.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use serde::{Deserialize, Serialize};

use super::snapshot::{
    install_staged, meta_of, PartitionSnapshot, Snapshot, SnapshotMeta, SnapshotSource,
};
use super::types::{ApplyResult, LogId, ProduceEntry, StoredMembership, TypeConfig};
use crate::engine::broker::{Broker, NewRecord};
use crate::engine::storage::io::write_file_atomic;
use crate::format::producers::BATCHES_KEPT;
use crate::format::wire::ErrorCode;

/// Longest a checkpoint waits behind the applied entries.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Largest checkpoint file read back (the producers' state at [`PRODUCERS_MAX`]
/// stays well below it; see the test `a_full_producer_table_fits_a_checkpoint`).
const CHECKPOINT_BYTES_MAX: u64 = 16 << 20;
/// A replicated partition forgets an idempotent producer whose last batch is this
/// far behind the log's clock (a fixed value, not `--producer-id-expiration`: every
/// replica must forget at the same entry). A batch of it at a sequence other than 0
/// is then refused as UNKNOWN_PRODUCER, and the client asks for a new id. The value
/// is the flag's default, a day.
#[expect(
    clippy::cast_possible_truncation,
    reason = "a day in milliseconds fits an i64"
)]
pub const PRODUCER_EXPIRATION_MS: i64 =
    crate::engine::producers::PRODUCER_ID_EXPIRATION_DEFAULT.as_millis() as i64;
/// Most idempotent producers a replicated partition remembers.
pub const PRODUCERS_MAX: usize = 10_000;

/// The last batch an idempotent producer had applied on this partition, and the
/// batches of the same epoch just before it, so that a retry of any of its last
/// [`BATCHES_KEPT`] batches is answered as a duplicate, as on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerSeen {
    pub epoch: u16,
    pub first_sequence: i32,
    pub next_sequence: i32,
    pub base_offset: u64,
    pub last_offset: u64,
    /// The log's clock when its last batch was applied.
    #[serde(default)]
    pub last_seen_ms: i64,
    /// Up to `BATCHES_KEPT - 1` earlier batches of this epoch, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<EarlierBatch>,
}

/// An applied batch before a producer's last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EarlierBatch {
    pub first_sequence: i32,
    pub base_offset: u64,
    pub last_offset: u64,
}

/// What the checkpoint file holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    /// The data partition's end after the last applied entry.
    pub next_offset: u64,
    /// The log's clock: the latest proposal time of the entries applied (ms).
    #[serde(default)]
    pub clock_ms: i64,
    pub producers: BTreeMap<u64, ProducerSeen>,
}

impl Applied {
    /// Moves the log's clock to an entry's proposal time; it never goes back (a new
    /// leader's clock may be behind the last one's).
    fn advance(&mut self, proposed_ms: Option<i64>) {
        if let Some(t) = proposed_ms {
            self.clock_ms = self.clock_ms.max(t);
        }
    }

    fn expired(&self, seen: &ProducerSeen) -> bool {
        seen.last_seen_ms.saturating_add(PRODUCER_EXPIRATION_MS) <= self.clock_ms
    }

    /// The producer's state, unless it expired at the log's clock.
    fn producer(&self, producer_id: u64) -> Option<&ProducerSeen> {
        self.producers
            .get(&producer_id)
            .filter(|s| !self.expired(s))
    }

    /// Drops every producer expired at the log's clock.
    pub fn expire(&mut self) {
        let clock = self.clock_ms;
        self.producers
            .retain(|_, s| s.last_seen_ms.saturating_add(PRODUCER_EXPIRATION_MS) > clock);
    }

    /// Records `seen` as the producer's state; past [`PRODUCERS_MAX`] the expired
    /// producers go, then those whose last batch is oldest (lowest id first among
    /// equals), so every replica forgets the same ones.
    fn remember(&mut self, producer_id: u64, seen: ProducerSeen) {
        self.producers.insert(producer_id, seen);
        if self.producers.len() <= PRODUCERS_MAX {
            return;
        }
        self.expire();
        while self.producers.len() > PRODUCERS_MAX {
            let oldest = self
                .producers
                .iter()
                .filter(|(id, _)| **id != producer_id)
                .min_by_key(|(id, s)| (s.last_seen_ms, **id))
                .map(|(id, _)| *id);
            match oldest {
                Some(id) => {
                    self.producers.remove(&id);
                }
                None => break,
            }
        }
    }

    /// The producer part of applying `entry`, before its records: moves the clock
    /// and checks the stamp. `Ok(())` to append, or the result every replica gives
    /// without appending.
    fn admit(&mut self, entry: &ProduceEntry) -> Result<(), ApplyResult> {
        self.advance(entry.proposed_ms);
        match &entry.producer {
            Some(stamp) => check_producer(self.producer(stamp.producer_id), stamp),
            None => Ok(()),
        }
    }

    /// The producer part of applying `entry` after its `count` records were
    /// appended at `base..=last`.
    fn record(&mut self, entry: &ProduceEntry, count: u64, base: u64, last: u64) {
        if let Some(stamp) = &entry.producer {
            let prev = self
                .producers
                .remove(&stamp.producer_id)
                .filter(|s| !self.expired(s));
            let seen = remembered(prev, stamp, count, base, last, self.clock_ms);
            self.remember(stamp.producer_id, seen);
        }
    }
}

pub use crate::format::names::checkpoint_name;

/// One replicated partition's state machine.
pub struct PartitionStateMachine {
    broker: Arc<Broker>,
    topic: String,
    partition: u32,
    dir: PathBuf,
    applied: Applied,
    checkpointed: Instant,
    /// The current snapshot: the checkpoint last written by a build or an install
    /// (at open, the checkpoint on disk).
    snapshot: Option<Applied>,
}

impl std::fmt::Debug for PartitionStateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionStateMachine")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("last_applied", &self.applied.last_applied)
            .finish_non_exhaustive()
    }
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Reads a checkpoint file (`applied-P.json`), bounded before anything is allocated;
/// `None` when there is none (nothing applied yet). The error does not name the file.
pub fn read_checkpoint(path: &std::path::Path) -> Result<Option<Applied>, String> {
    let Some(bytes) =
        crate::engine::producers::read_state_file(path, CHECKPOINT_BYTES_MAX as usize)?
    else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| e.to_string())
}

impl PartitionStateMachine {
    /// Opens the state machine of `topic/partition` from its checkpoint (none: nothing
    /// applied yet).
    pub fn open(broker: Arc<Broker>, topic: &str, partition: u32) -> io::Result<Self> {
        let dir = broker.topic_dir(topic);
        let path = dir.join(checkpoint_name(partition));
        let applied = read_checkpoint(&path)
            .map_err(|e| other(format!("{}: {e}", path.display())))?
            .unwrap_or_default();
        let snapshot = applied.last_applied.is_some().then(|| applied.clone());
        Ok(PartitionStateMachine {
            broker,
            topic: topic.to_string(),
            partition,
            dir,
            applied,
            checkpointed: Instant::now(),
            snapshot,
        })
    }

    /// Opens the state machine of `topic/partition` as if nothing were applied, its
    /// checkpoint left on disk until the next one replaces it: openraft applies the
    /// Raft log again from its first entry, and apply appends only the records past
    /// the data partition's end. For a data partition that lost applied records while
    /// the Raft log holds every entry (`manager::repair`).
    pub fn open_empty(broker: Arc<Broker>, topic: &str, partition: u32) -> Self {
        let dir = broker.topic_dir(topic);
        PartitionStateMachine {
            broker,
            topic: topic.to_string(),
            partition,
            dir,
            applied: Applied::default(),
            checkpointed: Instant::now(),
            snapshot: None,
        }
    }

    /// What has been applied (the in-memory state, ahead of the checkpoint).
    pub fn applied(&self) -> &Applied {
        &self.applied
    }

    fn checkpoint(&mut self) -> io::Result<()> {
        let bytes = serde_json::to_vec(&self.applied).map_err(other)?;
        let storage = self.broker.storage();
        write_file_atomic(
            &**storage,
            &self.dir,
            &checkpoint_name(self.partition),
            &bytes,
        )?;
        self.checkpointed = Instant::now();
        Ok(())
    }
}

/// Decides an idempotent entry against the producer's last batch: `Ok(())` to append,
/// or the result every replica gives without appending. As a node's own producer
/// table does: a producer this partition does not know (never seen, or expired)
/// starts at sequence 0, and so does a higher epoch.
fn check_producer(
    seen: Option<&ProducerSeen>,
    stamp: &super::types::ProducerStamp,
) -> Result<(), ApplyResult> {
    let Some(seen) = seen else {
        if stamp.first_sequence == 0 {
            return Ok(());
        }
        return Err(ApplyResult::Refused {
            code: ErrorCode::UNKNOWN_PRODUCER.0,
            message: format!(
                "producer {} is unknown to this partition (expired or never seen) and its \
                 batch starts at sequence {}, not 0",
                stamp.producer_id, stamp.first_sequence
            ),
        });
    };
    if stamp.epoch > seen.epoch {
        if stamp.first_sequence == 0 {
            return Ok(());
        }
        return Err(ApplyResult::Refused {
            code: ErrorCode::OUT_OF_ORDER_SEQUENCE.0,
            message: format!(
                "producer {} epoch {} starts at sequence {} where 0 was expected",
                stamp.producer_id, stamp.epoch, stamp.first_sequence
            ),
        });
    }
    if stamp.epoch < seen.epoch {
        return Err(ApplyResult::Refused {
            code: ErrorCode::INVALID_PRODUCER_EPOCH.0,
            message: format!(
                "producer {} epoch {} is fenced by epoch {}",
                stamp.producer_id, stamp.epoch, seen.epoch
            ),
        });
    }
    if stamp.first_sequence == seen.next_sequence {
        return Ok(());
    }
    if stamp.first_sequence == seen.first_sequence {
        return Err(ApplyResult::Duplicate {
            base_offset: seen.base_offset,
            last_offset: seen.last_offset,
        });
    }
    if let Some(b) = seen
        .earlier
        .iter()
        .find(|b| b.first_sequence == stamp.first_sequence)
    {
        return Err(ApplyResult::Duplicate {
            base_offset: b.base_offset,
            last_offset: b.last_offset,
        });
    }
    Err(ApplyResult::Refused {
        code: ErrorCode::OUT_OF_ORDER_SEQUENCE.0,
        message: format!(
            "producer {} sequence {} where {} was expected",
            stamp.producer_id, stamp.first_sequence, seen.next_sequence
        ),
    })
}

/// What a producer's state becomes once its batch of `count` records at
/// `base..=last` is applied at the log's clock `now_ms`: the batch is the last one,
/// and the batches of the same epoch before it stay, up to [`BATCHES_KEPT`] in all.
fn remembered(
    prev: Option<ProducerSeen>,
    stamp: &super::types::ProducerStamp,
    count: u64,
    base: u64,
    last: u64,
    now_ms: i64,
) -> ProducerSeen {
    let earlier = match prev {
        Some(mut prev) if prev.epoch == stamp.epoch => {
            prev.earlier.push(EarlierBatch {
                first_sequence: prev.first_sequence,
                base_offset: prev.base_offset,
                last_offset: prev.last_offset,
            });
            let extra = prev.earlier.len().saturating_sub(BATCHES_KEPT - 1);
            prev.earlier.drain(..extra);
            prev.earlier
        }
        _ => Vec::new(),
    };
    ProducerSeen {
        epoch: stamp.epoch,
        first_sequence: stamp.first_sequence,
        next_sequence: stamp.first_sequence.wrapping_add(count as i32),
        base_offset: base,
        last_offset: last,
        last_seen_ms: now_ms,
        earlier,
    }
}

/// Applies one normal entry on a blocking thread's behalf: appends the records that
/// are not on disk yet. Returns the result and the durability wait still owed.
fn apply_entry(
    broker: &Broker,
    topic: &str,
    partition: u32,
    applied: &mut Applied,
    entry: &ProduceEntry,
) -> io::Result<(ApplyResult, Option<crate::engine::broker::DurableWait>)> {
    if let Err(r) = applied.admit(entry) {
        return Ok((r, None));
    }
    let count = entry.len() as u64;
    if count == 0 {
        return Ok((
            ApplyResult::Refused {
                code: ErrorCode::INVALID_REQUEST.0,
                message: "an empty batch".into(),
            },
            None,
        ));
    }
    let base = applied.next_offset;
    let end = broker.written_end(topic, partition).map_err(other)?;
    // Records of this entry already on disk (applied before a restart).
    let present = end.saturating_sub(base).min(count);
    if end < base {
        return Err(other(format!(
            "{topic}/{partition}: the data partition ends at {end}, before the applied \
             offset {base}"
        )));
    }
    let mut wait = None;
    if present < count {
        let records: Vec<NewRecord<'_>> = entry.records().skip(present as usize).collect();
        let (p, w) = broker
            .append_applied(topic, partition, &records)
            .map_err(other)?;
        if p.base_offset != base + present {
            return Err(other(format!(
                "{topic}/{partition}: appended at {} where {} was due",
                p.base_offset,
                base + present
            )));
        }
        wait = w;
    }
    let last = base + count - 1;
    applied.next_offset = last + 1;
    applied.record(entry, count, base, last);
    Ok((
        ApplyResult::Appended {
            base_offset: base,
            last_offset: last,
        },
        wait,
    ))
}

impl RaftStateMachine<TypeConfig> for PartitionStateMachine {
    type SnapshotData = PartitionSnapshot;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.applied.last_applied, self.applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + Send,
    {
        let mut batch = Vec::new();
        while let Some(item) = entries.next().await {
            batch.push(item?);
        }
        if batch.is_empty() {
            return Ok(());
        }
        let broker = Arc::clone(&self.broker);
        let topic = self.topic.clone();
        let partition = self.partition;
        let mut applied = std::mem::take(&mut self.applied);
        let due = self.checkpointed.elapsed() >= CHECKPOINT_INTERVAL;
        let dir = self.dir.clone();
        // The data partition's writes, off the event loop.
        let joined = tokio::task::spawn_blocking(move || {
            let mut results = Vec::with_capacity(batch.len());
            let mut last_wait = None;
            let mut failed = None;
            for (entry, responder) in batch {
                let result = match &entry.payload {
                    EntryPayload::Blank => ApplyResult::None,
                    EntryPayload::Normal(p) => {
                        match apply_entry(&broker, &topic, partition, &mut applied, p) {
                            Ok((r, w)) => {
                                if w.is_some() {
                                    last_wait = w;
                                }
                                r
                            }
                            Err(e) => {
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    EntryPayload::Membership(m) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                        ApplyResult::None
                    }
                };
                applied.last_applied = Some(entry.log_id);
                results.push((responder, result));
            }
            // The entries are durable in a majority's Raft logs: the answer does not
            // wait for the data partition's fsync, which the flusher runs at once
            // (a read settles on it first). The checkpoint names only durable
            // records: it is written after an fsync of its own.
            if let Some(w) = last_wait {
                broker.flush_soon(w);
            }
            let outcome = match failed {
                Some(e) => Err(e),
                None => Ok(()),
            };
            let checkpoint = if outcome.is_ok() && due {
                applied.expire();
                broker
                    .flush_partition(&topic, partition)
                    .map_err(other)
                    .and_then(|()| serde_json::to_vec(&applied).map_err(other))
                    .and_then(|bytes| {
                        write_file_atomic(
                            &**broker.storage(),
                            &dir,
                            &checkpoint_name(partition),
                            &bytes,
                        )
                    })
                    .map(|()| true)
            } else {
                Ok(false)
            };
            (applied, results, outcome, checkpoint)
        })
        .await
        .map_err(other)?;
        let (applied, results, outcome, checkpoint) = joined;
        self.applied = applied;
        outcome?;
        if checkpoint? {
            self.checkpointed = Instant::now();
        }
        for (responder, result) in results {
            if let Some(r) = responder {
                r.send(result);
            }
        }
        Ok(())
    }

    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<SnapshotBuilder> {
        match self.take_snapshot().await {
            Ok(b) => Some(b),
            Err(e) if force => Some(SnapshotBuilder::Failed(e.to_string())),
            Err(e) => {
                tracing::warn!(topic = %self.topic, partition = self.partition, error = %e,
                    "writing the snapshot's checkpoint failed; the snapshot is deferred");
                None
            }
        }
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        match self.take_snapshot().await {
            Ok(b) => b,
            Err(e) => SnapshotBuilder::Failed(e.to_string()),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: PartitionSnapshot,
    ) -> Result<(), io::Error> {
        self.install(meta, snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        Ok(self
            .snapshot
            .as_ref()
            .map(|applied| self.local_snapshot(applied.clone())))
    }
}

impl PartitionStateMachine {
    fn local_snapshot(&self, applied: Applied) -> Snapshot {
        Snapshot {
            meta: meta_of(&applied),
            snapshot: PartitionSnapshot {
                applied,
                source: SnapshotSource::Local {
                    broker: Arc::clone(&self.broker),
                    topic: self.topic.clone(),
                    partition: self.partition,
                },
            },
        }
    }

    /// Takes a snapshot at the last applied entry: fsyncs the data partition and
    /// writes the checkpoint, which becomes the current snapshot. Runs in the state
    /// machine's worker, so no apply runs meanwhile; copies no record.
    async fn take_snapshot(&mut self) -> io::Result<SnapshotBuilder> {
        self.applied.expire();
        let applied = self.applied.clone();
        let broker = Arc::clone(&self.broker);
        let dir = self.dir.clone();
        let partition = self.partition;
        let bytes = serde_json::to_vec(&applied).map_err(other)?;
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || {
            broker.flush_partition(&topic, partition).map_err(other)?;
            write_file_atomic(
                &**broker.storage(),
                &dir,
                &checkpoint_name(partition),
                &bytes,
            )
        })
        .await
        .map_err(other)??;
        self.checkpointed = Instant::now();
        self.snapshot = Some(applied.clone());
        Ok(SnapshotBuilder::Built(Box::new(
            self.local_snapshot(applied),
        )))
    }

    /// Installs a snapshot received from the leader ([`install_staged`] steps 1-4),
    /// then 5. replaces the checkpoint atomically with the snapshot's, and 6. removes
    /// the staging file; only then is the install reported done.
    async fn install(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: PartitionSnapshot,
    ) -> io::Result<()> {
        let PartitionSnapshot { applied, source } = snapshot;
        if applied.last_applied != meta.last_log_id {
            return Err(other(format!(
                "{}/{}: the snapshot's checkpoint is at {:?}, its metadata at {:?}",
                self.topic, self.partition, applied.last_applied, meta.last_log_id
            )));
        }
        let (path, first_offset) = match source {
            SnapshotSource::Staged { path, first_offset } => (path, first_offset),
            SnapshotSource::Local { .. } => {
                // This node's own snapshot (openraft restoring at start): the
                // checkpoint it was taken from is on disk, at or past it.
                if self.applied.last_applied >= applied.last_applied {
                    return Ok(());
                }
                return Err(other(format!(
                    "{}/{}: a local snapshot at {:?} is ahead of the checkpoint at {:?}",
                    self.topic, self.partition, applied.last_applied, self.applied.last_applied
                )));
            }
        };
        let broker = Arc::clone(&self.broker);
        let topic = self.topic.clone();
        let partition = self.partition;
        let dir = self.dir.clone();
        let installed = applied.clone();
        tokio::task::spawn_blocking(move || -> io::Result<()> {
            install_staged(&broker, &topic, partition, &installed, &path, first_offset)?;
            // 5.
            let bytes = serde_json::to_vec(&installed).map_err(other)?;
            write_file_atomic(
                &**broker.storage(),
                &dir,
                &checkpoint_name(partition),
                &bytes,
            )?;
            // 6.
            match broker.storage().remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await
        .map_err(other)??;
        self.checkpointed = Instant::now();
        self.applied = applied.clone();
        self.snapshot = Some(applied);
        Ok(())
    }
}

impl Drop for PartitionStateMachine {
    fn drop(&mut self) {
        if self.applied.last_applied.is_some() {
            self.applied.expire();
            if let Err(e) = self
                .broker
                .flush_partition(&self.topic, self.partition)
                .map_err(other)
                .and_then(|()| self.checkpoint())
            {
                tracing::warn!(topic = %self.topic, partition = self.partition, error = %e,
                    "writing the applied checkpoint at close failed; the entries after the \
                     last one are applied again at the next start");
            }
        }
    }
}

/// What builds a snapshot: the checkpoint is written when the builder is made (in
/// the state machine's worker), so building only hands the snapshot over.
#[derive(Debug)]
pub enum SnapshotBuilder {
    Built(Box<Snapshot>),
    /// Writing the checkpoint failed.
    Failed(String),
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = PartitionSnapshot;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        match std::mem::replace(self, SnapshotBuilder::Failed("built already".into())) {
            SnapshotBuilder::Built(s) => Ok(*s),
            SnapshotBuilder::Failed(e) => Err(other(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::replication::types::ProducerStamp;

    fn seen() -> ProducerSeen {
        ProducerSeen {
            epoch: 1,
            first_sequence: 10,
            next_sequence: 15,
            base_offset: 100,
            last_offset: 104,
            last_seen_ms: 0,
            earlier: vec![EarlierBatch {
                first_sequence: 7,
                base_offset: 90,
                last_offset: 92,
            }],
        }
    }

    fn stamp(epoch: u16, seq: i32) -> ProducerStamp {
        ProducerStamp {
            producer_id: 4,
            epoch,
            first_sequence: seq,
        }
    }

    fn refused_with(r: Result<(), ApplyResult>, want: ErrorCode) -> bool {
        matches!(r, Err(ApplyResult::Refused { code, .. }) if code == want.0)
    }

    #[test]
    fn producer_checks() {
        assert_eq!(check_producer(None, &stamp(0, 0)), Ok(()));
        assert_eq!(check_producer(Some(&seen()), &stamp(1, 15)), Ok(()));
        assert_eq!(check_producer(Some(&seen()), &stamp(2, 0)), Ok(()));
        // An unknown producer, and a higher epoch, start at sequence 0 only.
        assert!(refused_with(
            check_producer(None, &stamp(0, 7)),
            ErrorCode::UNKNOWN_PRODUCER
        ));
        assert!(refused_with(
            check_producer(Some(&seen()), &stamp(2, 15)),
            ErrorCode::OUT_OF_ORDER_SEQUENCE
        ));
        assert_eq!(
            check_producer(Some(&seen()), &stamp(1, 10)),
            Err(ApplyResult::Duplicate {
                base_offset: 100,
                last_offset: 104
            })
        );
        // A retry of an earlier batch of the window gets that batch's offsets.
        assert_eq!(
            check_producer(Some(&seen()), &stamp(1, 7)),
            Err(ApplyResult::Duplicate {
                base_offset: 90,
                last_offset: 92
            })
        );
        assert!(matches!(
            check_producer(Some(&seen()), &stamp(1, 8)),
            Err(ApplyResult::Refused { code, .. }) if code == ErrorCode::OUT_OF_ORDER_SEQUENCE.0
        ));
        assert!(matches!(
            check_producer(Some(&seen()), &stamp(1, 16)),
            Err(ApplyResult::Refused { code, .. }) if code == ErrorCode::OUT_OF_ORDER_SEQUENCE.0
        ));
        assert!(matches!(
            check_producer(Some(&seen()), &stamp(0, 15)),
            Err(ApplyResult::Refused { code, .. }) if code == ErrorCode::INVALID_PRODUCER_EPOCH.0
        ));
    }
    /// The last five batches of an epoch are remembered; a new epoch starts afresh.
    #[test]
    fn the_window_keeps_five_batches_of_an_epoch() {
        let mut seen: Option<ProducerSeen> = None;
        for i in 0..8u64 {
            let s = remembered(
                seen.take(),
                &stamp(1, (i * 2) as i32),
                2,
                i * 2,
                i * 2 + 1,
                0,
            );
            seen = Some(s);
        }
        let s = seen.clone().unwrap();
        assert_eq!(s.first_sequence, 14);
        assert_eq!(s.next_sequence, 16);
        assert_eq!(
            s.earlier
                .iter()
                .map(|b| b.first_sequence)
                .collect::<Vec<_>>(),
            vec![6, 8, 10, 12]
        );
        for seq in [6, 8, 10, 12, 14] {
            assert_eq!(
                check_producer(Some(&s), &stamp(1, seq)),
                Err(ApplyResult::Duplicate {
                    base_offset: seq as u64,
                    last_offset: seq as u64 + 1
                }),
                "{seq}"
            );
        }
        assert!(matches!(
            check_producer(Some(&s), &stamp(1, 4)),
            Err(ApplyResult::Refused { code, .. }) if code == ErrorCode::OUT_OF_ORDER_SEQUENCE.0
        ));
        let bumped = remembered(seen, &stamp(2, 0), 3, 16, 18, 0);
        assert!(bumped.earlier.is_empty());
        assert_eq!((bumped.epoch, bumped.next_sequence), (2, 3));
    }

    fn entry(producer_id: u64, epoch: u16, seq: i32, proposed_ms: i64) -> ProduceEntry {
        ProduceEntry::new(
            Some(ProducerStamp {
                producer_id,
                epoch,
                first_sequence: seq,
            }),
            [NewRecord {
                key: None,
                value: b"v",
                timestamp_ms: 1,
            }],
            proposed_ms,
        )
    }

    /// Applies `e` as the state machine does, without a data partition: the result,
    /// and the offset the next entry takes.
    fn apply_to(applied: &mut Applied, e: &ProduceEntry) -> ApplyResult {
        if let Err(r) = applied.admit(e) {
            return r;
        }
        let base = applied.next_offset;
        let last = base + e.len() as u64 - 1;
        applied.next_offset = last + 1;
        applied.record(e, e.len() as u64, base, last);
        ApplyResult::Appended {
            base_offset: base,
            last_offset: last,
        }
    }

    const DAY: i64 = PRODUCER_EXPIRATION_MS;

    #[test]
    fn a_producer_expires_by_the_logs_clock_not_the_replicas() {
        let mut a = Applied::default();
        let t0 = 1_000_000;
        assert!(matches!(
            apply_to(&mut a, &entry(9, 0, 0, t0)),
            ApplyResult::Appended { .. }
        ));
        // Its retry, a day less a millisecond later in the log: still a duplicate.
        assert!(matches!(
            apply_to(&mut a, &entry(9, 0, 0, t0 + DAY - 1)),
            ApplyResult::Duplicate { .. }
        ));
        // An entry of another producer a day on moves the clock: producer 9 is
        // unknown from then on, though it is still in the table (not swept yet).
        apply_to(&mut a, &entry(10, 0, 0, t0 + DAY));
        assert!(a.producers.contains_key(&9));
        assert!(refused_with(
            a.admit(&entry(9, 0, 1, t0 + DAY)),
            ErrorCode::UNKNOWN_PRODUCER
        ));
        // At sequence 0 it starts again, with a fresh window.
        assert!(matches!(
            apply_to(&mut a, &entry(9, 0, 0, t0 + DAY)),
            ApplyResult::Appended { .. }
        ));
        assert_eq!(a.producers[&9].last_seen_ms, t0 + DAY);
        // A proposer whose clock is behind does not move the clock back.
        apply_to(&mut a, &entry(11, 0, 0, t0));
        assert_eq!(a.clock_ms, t0 + DAY);
        // An entry of an older node (no proposal time) leaves the clock alone.
        let mut old = entry(12, 0, 0, 0);
        old.proposed_ms = None;
        apply_to(&mut a, &old);
        assert_eq!(a.clock_ms, t0 + DAY);
        // Producers 9 to 12 were last seen at the clock t0 + DAY (11 and 12 too,
        // whatever their proposers said). The sweep drops only what has expired.
        apply_to(&mut a, &entry(13, 0, 0, t0 + 2 * DAY - 1));
        a.expire();
        let left: Vec<u64> = a.producers.keys().copied().collect();
        assert_eq!(left, vec![9, 10, 11, 12, 13]);
        apply_to(&mut a, &entry(14, 0, 0, t0 + 2 * DAY));
        a.expire();
        let left: Vec<u64> = a.producers.keys().copied().collect();
        assert_eq!(left, vec![13, 14]);
    }

    /// Replicas sweep expired producers at different entries (each at its own
    /// checkpoints): every decision, and the producers they remember, stay the same.
    #[test]
    fn when_a_replica_sweeps_changes_no_decision() {
        let mut lazy = Applied::default();
        let mut eager = Applied::default();
        let mut next_seq = std::collections::HashMap::<u64, i32>::new();
        // A seeded walk: producers come and go over several days of log time, some
        // retry, some go silent past the expiry and come back mid-sequence.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut step = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut clock = 0i64;
        let mut expired_seen = 0;
        for i in 0..4000 {
            clock += (step() % (DAY as u64 / 20)) as i64;
            let id = step() % 40;
            let seq = *next_seq.get(&id).unwrap_or(&0);
            let seq = match step() % 10 {
                0 => seq.saturating_sub(1), // a retry
                1 => seq + 3,               // a gap
                _ => seq,
            };
            let e = entry(id, 0, seq, clock);
            let r1 = apply_to(&mut lazy, &e);
            let r2 = apply_to(&mut eager, &e);
            assert_eq!(r1, r2, "entry {i}");
            if let ApplyResult::Appended { .. } = r1 {
                next_seq.insert(id, seq + 1);
            }
            if let ApplyResult::Refused { code, .. } = r1 {
                if code == ErrorCode::UNKNOWN_PRODUCER.0 {
                    expired_seen += 1;
                    next_seq.insert(id, 0);
                }
            }
            eager.expire();
            if step() % 50 == 0 {
                lazy.expire();
            }
        }
        // The walk did make producers expire, and come back.
        assert!(expired_seen > 50, "{expired_seen}");
        lazy.expire();
        assert_eq!(lazy.producers, eager.producers);
        assert_eq!(lazy.next_offset, eager.next_offset);
    }

    #[test]
    fn past_the_cap_the_producer_seen_longest_ago_is_forgotten() {
        let mut a = Applied::default();
        for id in 0..PRODUCERS_MAX as u64 {
            apply_to(&mut a, &entry(id, 0, 0, 1_000 + id as i64));
        }
        assert_eq!(a.producers.len(), PRODUCERS_MAX);
        // Producer 0 writes again: it is now the newest; producer 1 is the oldest.
        apply_to(&mut a, &entry(0, 0, 1, 50_000));
        apply_to(&mut a, &entry(u64::MAX, 0, 0, 50_001));
        assert_eq!(a.producers.len(), PRODUCERS_MAX);
        assert!(a.producers.contains_key(&0));
        assert!(!a.producers.contains_key(&1));
        assert!(a.producers.contains_key(&u64::MAX));
        // The forgotten producer's next batch is refused as unknown.
        assert!(refused_with(
            a.admit(&entry(1, 0, 1, 50_002)),
            ErrorCode::UNKNOWN_PRODUCER
        ));
    }

    #[test]
    fn a_full_producer_table_fits_a_checkpoint() {
        let earlier = EarlierBatch {
            first_sequence: i32::MIN,
            base_offset: u64::MAX,
            last_offset: u64::MAX,
        };
        let widest = ProducerSeen {
            epoch: u16::MAX,
            first_sequence: i32::MIN,
            next_sequence: i32::MIN,
            base_offset: u64::MAX,
            last_offset: u64::MAX,
            last_seen_ms: i64::MIN,
            earlier: vec![earlier; BATCHES_KEPT - 1],
        };
        let applied = Applied {
            next_offset: u64::MAX,
            clock_ms: i64::MIN,
            producers: (0..PRODUCERS_MAX as u64)
                .map(|i| (u64::MAX - i, widest.clone()))
                .collect(),
            ..Applied::default()
        };
        let bytes = serde_json::to_vec(&applied).unwrap();
        assert!(
            (bytes.len() as u64) < CHECKPOINT_BYTES_MAX / 2,
            "{} bytes",
            bytes.len()
        );
    }
}
