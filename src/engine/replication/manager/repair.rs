//! A replica whose data partition lost records it had applied gets them back before
//! its group opens. Damage inside the data partition's active segment is cut at the
//! node's start (FORMAT.md, recovery rule 4), and the records behind it go with it,
//! though the checkpoint (`applied-P.json`) says they were applied: applying the next
//! entry would then find the partition ending before the entry's offset, and the
//! group would stop for good. Those records are committed, and every replica holds
//! the same offset → record mapping, so the node takes them again:
//!
//! - **Re-applied from its own Raft log**, when that log still holds every entry up
//!   to the checkpoint's (never purged: a compacted topic's log, or one younger than
//!   its first snapshot): the state machine starts from nothing and openraft applies
//!   the log again; apply appends only the records past the partition's end, so the
//!   records before the damage are kept and those after it are written again.
//! - **Fetched from a peer** otherwise: the group stays closed (this node takes no
//!   part in it meanwhile) while the node asks its group's other replicas for the
//!   records from its partition's end up to the checkpoint's next offset
//!   ([`Rpc::Records`]), appends each at its own offset, fsyncs, and only then opens
//!   the group. A peer that is down, or has fewer of the records, is asked again
//!   every [`ASK_EVERY`] until the records are all here.
//!
//! Invariants:
//! - The Raft log and vote are never touched: this repairs the state machine only,
//!   so Raft's safety does not depend on it.
//! - Only records below the checkpoint's next offset are taken, each at its own
//!   offset, with no gap (a peer whose partition has one, a compacted topic's, is
//!   refused and the next asked); what the node holds is kept. As a snapshot install
//!   does, a peer whose retention removed the records from the partition's end on
//!   makes the partition restart empty at that peer's first retained offset.
//! - A crash during the repair leaves records at their own offsets below the
//!   checkpoint's next offset: the next start finds the partition still behind and
//!   goes on from its end.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use serde::{Deserialize, Serialize};

use super::{lock, LogStores, Manager};
use crate::engine::broker::{Broker, NewRecord};
use crate::engine::replication::snapshot::read_chunk;
use crate::engine::replication::state_machine::{checkpoint_name, read_checkpoint, Applied};
use crate::engine::replication::types::EntryRecord;
use crate::engine::storage::io::write_file_atomic;
use crate::format::wire::raft::Rpc;

/// How often a repair that could not finish asks the peers again.
const ASK_EVERY: Duration = Duration::from_secs(1);
/// Longest wait for one peer's answer to [`Rpc::Records`].
const RECORDS_WAIT: Duration = Duration::from_secs(10);

/// [`Rpc::Records`]'s payload.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RecordsRequest {
    pub from: u64,
    pub to: u64,
}

/// [`Rpc::Records`]'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RecordsAnswer {
    /// The answering node's first retained offset of the partition.
    pub start: u64,
    /// Its durable records from `max(from, start)` below `to`, in offset order
    /// (about 1 MiB at most: ask again from past the last).
    pub records: Vec<(u64, EntryRecord)>,
    /// Its partition's durable end (absent from a node of an earlier build).
    #[serde(default)]
    pub end: Option<u64>,
}

/// What a replica's data partition needs before its group opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Behind {
    /// Nothing: the partition holds every record the checkpoint says was applied.
    No,
    /// The Raft log holds every entry: re-apply it from the start.
    Reapply { end: u64, next: u64 },
    /// Fetch the records `end..next` from a peer first.
    Fetch { end: u64, next: u64 },
    /// The checkpoint is lost while the Raft log is purged up to `purged`: take a
    /// peer's checkpoint at or past it first.
    NoCheckpoint { purged: u64 },
}

impl<L: LogStores> Manager<L> {
    /// Whether the data partition of `topic/partition` ends before the records its
    /// checkpoint says were applied, and how they come back (`store`: the group's
    /// Raft log, opened).
    pub(super) async fn behind(
        &self,
        topic: &str,
        partition: u32,
        store: &mut L::Store,
    ) -> io::Result<Behind> {
        let path = self
            .broker
            .topic_dir(topic)
            .join(checkpoint_name(partition));
        let Some(applied) = read_checkpoint(&path)
            .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?
        else {
            // Nothing applied yet, or the checkpoint is lost: openraft applies the log
            // from its first entry, which it can only while nothing was purged (a purge
            // follows a snapshot, which writes the checkpoint first).
            let state = store.get_log_state().await?;
            return Ok(match state.last_purged_log_id {
                Some(p) => Behind::NoCheckpoint { purged: p.index },
                None => Behind::No,
            });
        };
        let next = applied.next_offset;
        let end = self
            .broker
            .written_end(topic, partition)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if end >= next {
            return Ok(Behind::No);
        }
        let state = store.get_log_state().await?;
        let whole = state.last_purged_log_id.is_none()
            && state.last_log_id.map(|l| l.index) >= applied.last_applied.map(|l| l.index);
        Ok(if whole {
            Behind::Reapply { end, next }
        } else {
            Behind::Fetch { end, next }
        })
    }

    /// Refuses to open a group whose Raft state file (`raft.json`: its vote, commit
    /// and purge points) is missing while its log holds an entry of a term past 0:
    /// such an entry was appended only after a vote of its term was made durable, so
    /// the vote was lost, and a node that forgot its vote could vote twice in one
    /// term. (Entries of term 0 only: a group initialized and stopped before any
    /// vote, whose state file may not exist yet.)
    pub(super) async fn check_vote_kept(
        &self,
        topic: &str,
        partition: u32,
        store: &mut L::Store,
    ) -> io::Result<()> {
        use crate::engine::replication::log_store::meta::STATE_FILE;
        let path = self.raft_dir(topic, partition).join(STATE_FILE);
        if std::fs::symlink_metadata(&path).is_ok() {
            return Ok(());
        }
        let state = store.get_log_state().await?;
        // The checkpoint's last applied entry tells too (a log purged whole).
        let checkpoint = self
            .broker
            .topic_dir(topic)
            .join(checkpoint_name(partition));
        let applied = read_checkpoint(&checkpoint)
            .ok()
            .flatten()
            .and_then(|a| a.last_applied);
        let evidence = [state.last_log_id, applied]
            .into_iter()
            .flatten()
            .filter(|l| l.leader_id.term > 0)
            .max();
        match evidence {
            Some(last) => Err(io::Error::other(format!(
                "{}: missing, while this replica holds entry {} of term {}: its vote is lost, \
                 and a node that forgot its vote could vote twice in one term, so this replica \
                 is not opened (its peers go on without it); to bring it back, stop the node, \
                 move its data directory aside and start it on an empty one: it gets its \
                 replicas back from its peers",
                path.display(),
                last.index,
                last.leader_id.term
            ))),
            None => Ok(()),
        }
    }

    /// Fetches the records the data partition of `topic/partition` lacks from the
    /// group's other replicas, then opens the group; asks again every [`ASK_EVERY`]
    /// until done, or until `stop`.
    pub(super) async fn repair_then_open(
        self: Arc<Self>,
        topic: String,
        partition: u32,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut said = String::new();
        loop {
            if !lock(&self.topics).contains_key(&topic) {
                // Deleted meanwhile.
                return;
            }
            let step = match self.adopt_checkpoint(&topic, partition).await {
                Ok(true) => self.fetch_missing(&topic, partition).await,
                Ok(false) => Ok(false),
                Err(e) => Err(e),
            };
            match step {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    if e != said {
                        tracing::warn!(topic, partition, error = %e,
                            "the data partition's missing records could not be fetched yet; \
                             asking again");
                        said = e;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(ASK_EVERY) => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
        }
        // Opened under the lock a delete takes, so a topic deleted meanwhile is not
        // opened again.
        let _admin = self.admin.lock().await;
        if !lock(&self.topics).contains_key(&topic) {
            return;
        }
        match self.open_group(&topic, partition).await {
            Ok(_) => tracing::info!(
                topic,
                partition,
                "the data partition holds every applied record again; its group is open"
            ),
            Err(e) => {
                tracing::error!(topic, partition, error = %e, "cannot open the Raft group");
                eprintln!("seglog: {topic}/{partition}: cannot open its Raft group: {e}");
            }
        }
    }

    /// When the partition's checkpoint is lost, takes a peer's in its place: the
    /// state of the group's state machine at the peer's last checkpointed entry, the
    /// same on every replica (apply is deterministic), from which openraft applies
    /// this node's log on. Only a checkpoint at or past this node's purged index
    /// serves (the entries after it must be in the log). `Ok(true)` once this node has
    /// a checkpoint.
    async fn adopt_checkpoint(&self, topic: &str, partition: u32) -> Result<bool, String> {
        use crate::engine::replication::log_store::meta::read_state;
        use crate::engine::replication::types::Vote;
        let dir = self.broker.topic_dir(topic);
        if read_checkpoint(&dir.join(checkpoint_name(partition)))?.is_some() {
            return Ok(true);
        }
        let purged = read_state::<Vote>(&self.raft_dir(topic, partition))
            .map_err(|e| e.to_string())?
            .purged
            .map(|p| p.index);
        let mut why = Vec::new();
        for node in self.other_replicas(topic, partition) {
            let answer = match self
                .call_within(
                    node,
                    topic,
                    partition,
                    Rpc::Checkpoint,
                    Vec::new(),
                    RECORDS_WAIT,
                )
                .await
            {
                Ok(a) => a,
                Err((_, m)) => {
                    why.push(format!("node {node}: {m}"));
                    continue;
                }
            };
            let theirs: Option<Applied> = match serde_json::from_slice(&answer) {
                Ok(a) => a,
                Err(e) => {
                    why.push(format!("node {node}: unreadable checkpoint: {e}"));
                    continue;
                }
            };
            let Some(theirs) = theirs else {
                why.push(format!("node {node} has no checkpoint"));
                continue;
            };
            let at = theirs.last_applied.map(|l| l.index);
            if at < purged {
                why.push(format!(
                    "node {node}'s checkpoint is at entry {at:?}, before this node's purged \
                     entry {purged:?}"
                ));
                continue;
            }
            let bytes = serde_json::to_vec(&theirs).map_err(|e| e.to_string())?;
            let broker = Arc::clone(&self.broker);
            let name = checkpoint_name(partition);
            tokio::task::spawn_blocking(move || {
                write_file_atomic(&**broker.storage(), &dir, &name, &bytes)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
            tracing::warn!(
                topic,
                partition,
                node,
                entry = at,
                next_offset = theirs.next_offset,
                "took a peer's checkpoint in place of the lost one"
            );
            return Ok(true);
        }
        Err(format!("no peer's checkpoint serves: {}", why.join("; ")))
    }

    /// Answers [`Rpc::Checkpoint`]: this node's checkpoint of the partition as on
    /// its disk (written after the data partition's fsync), or `null`.
    pub(super) fn checkpoint_for_peer(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Vec<u8>, String> {
        let path = self
            .broker
            .topic_dir(topic)
            .join(checkpoint_name(partition));
        let applied = read_checkpoint(&path)?;
        serde_json::to_vec(&applied).map_err(|e| e.to_string())
    }

    /// One round of asking: `Ok(true)` once the partition holds every record its
    /// checkpoint says was applied (fsynced).
    async fn fetch_missing(&self, topic: &str, partition: u32) -> Result<bool, String> {
        let path = self
            .broker
            .topic_dir(topic)
            .join(checkpoint_name(partition));
        let Some(applied) = read_checkpoint(&path)? else {
            return Ok(true);
        };
        let next = applied.next_offset;
        let mut why = Vec::new();
        for node in self.other_replicas(topic, partition) {
            let first = self
                .broker
                .written_end(topic, partition)
                .map_err(|e| e.to_string())?;
            let stopped = self.fetch_from(node, topic, partition, next).await;
            let end = self
                .broker
                .written_end(topic, partition)
                .map_err(|e| e.to_string())?;
            if end > first {
                tracing::info!(
                    topic,
                    partition,
                    node,
                    from = first,
                    to = end,
                    "took records the data partition lacked from a peer"
                );
            }
            match stopped {
                None => {
                    let broker = Arc::clone(&self.broker);
                    let t = topic.to_string();
                    tokio::task::spawn_blocking(move || broker.flush_partition(&t, partition))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                    return Ok(true);
                }
                Some(e) => why.push(e),
            }
        }
        if why.is_empty() {
            why.push("no other replica".into());
        }
        Err(format!(
            "records from offset {} below {next}: {}",
            self.broker
                .written_end(topic, partition)
                .map_err(|e| e.to_string())?,
            why.join("; ")
        ))
    }

    /// Takes records from `node` until the partition reaches `next` (`None`) or the
    /// node cannot give more (why).
    async fn fetch_from(
        &self,
        node: u64,
        topic: &str,
        partition: u32,
        next: u64,
    ) -> Option<String> {
        loop {
            let end = match self.broker.written_end(topic, partition) {
                Ok(end) => end,
                Err(e) => return Some(e.to_string()),
            };
            if end >= next {
                return None;
            }
            let payload = match serde_json::to_vec(&RecordsRequest {
                from: end,
                to: next,
            }) {
                Ok(p) => p,
                Err(e) => return Some(e.to_string()),
            };
            let answer = match self
                .call_within(node, topic, partition, Rpc::Records, payload, RECORDS_WAIT)
                .await
            {
                Ok(a) => a,
                Err((_, m)) => return Some(format!("node {node}: {m}")),
            };
            let answer: RecordsAnswer = match serde_json::from_slice(&answer) {
                Ok(a) => a,
                Err(e) => return Some(format!("node {node}: unreadable answer: {e}")),
            };
            let broker = Arc::clone(&self.broker);
            let t = topic.to_string();
            let took =
                tokio::task::spawn_blocking(move || take(&broker, &t, partition, answer, next))
                    .await;
            match took {
                Ok(Ok(0)) => {
                    return Some(format!("node {node} holds none of offsets {end}..{next}"))
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Some(format!("node {node}: {e}")),
                Err(e) => return Some(e.to_string()),
            }
        }
    }

    /// The group's replicas other than this node, as its placement lists them.
    pub(super) fn other_replicas(&self, topic: &str, partition: u32) -> Vec<u64> {
        lock(&self.topics)
            .get(topic)
            .and_then(|r| r.replicas.get(partition as usize).cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|&n| n != self.node_id())
            .collect()
    }

    /// Answers [`Rpc::Records`] from this node's data partition.
    pub(super) async fn records_for_peer(
        &self,
        topic: &str,
        partition: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let req: RecordsRequest =
            serde_json::from_slice(payload).map_err(|e| format!("bad records request: {e}"))?;
        let broker = Arc::clone(&self.broker);
        let t = topic.to_string();
        let answer = tokio::task::spawn_blocking(move || -> Result<RecordsAnswer, String> {
            // Durable records only (a fetch reads no others).
            let (start, end) = broker.offsets(&t, partition).map_err(|e| e.to_string())?;
            let from = req.from.max(start);
            let to = req.to.min(end);
            let records = if from < to {
                read_chunk(&broker, &t, partition, from, to).map_err(|e| e.to_string())?
            } else {
                Vec::new()
            };
            Ok(RecordsAnswer {
                start,
                records,
                end: Some(end),
            })
        })
        .await
        .map_err(|e| e.to_string())??;
        serde_json::to_vec(&answer).map_err(|e| e.to_string())
    }
}

/// Appends a peer's answer to the data partition: the records at and past its end,
/// below `next`, each at its own offset. Returns how far the partition's end moved
/// (0: the answer held nothing it lacks).
fn take(
    broker: &Broker,
    topic: &str,
    partition: u32,
    answer: RecordsAnswer,
    next: u64,
) -> Result<u64, String> {
    let mut end = broker
        .written_end(topic, partition)
        .map_err(|e| e.to_string())?;
    let before = end;
    if end < answer.start {
        let at = answer.start.min(next);
        tracing::warn!(
            topic,
            partition,
            end,
            start = answer.start,
            "the peer's retention removed the records from the partition's end on: the \
             partition restarts empty at the peer's first retained offset"
        );
        broker
            .restart_applied_at(topic, partition, at)
            .map_err(|e| e.to_string())?;
        end = at;
    }
    let mut fresh: Vec<NewRecord<'_>> = Vec::new();
    for (offset, r) in &answer.records {
        if *offset < end || *offset >= next {
            continue;
        }
        let expected = end + fresh.len() as u64;
        if *offset != expected {
            return Err(format!(
                "its records jump from offset {expected} to {offset} (compacted or damaged); \
                 nothing is invented"
            ));
        }
        fresh.push(NewRecord {
            key: r.key.as_deref(),
            value: &r.value,
            timestamp_ms: r.timestamp_ms,
        });
    }
    if fresh.is_empty() {
        return Ok(end - before);
    }
    let (p, _wait) = broker
        .append_applied(topic, partition, &fresh)
        .map_err(|e| e.to_string())?;
    if p.base_offset != end {
        return Err(format!(
            "appended at offset {} where {end} was due",
            p.base_offset
        ));
    }
    Ok(end + fresh.len() as u64 - before)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::engine::broker::BrokerOptions;
    use crate::engine::storage::io::RealStorage;
    use crate::format::replication::{Replication, REPLICATION_FILE};
    use crate::format::topic::TopicConfig;

    const TOPIC: &str = "t";

    fn open(dir: &Path) -> Arc<Broker> {
        let b = Broker::open(dir, Arc::new(RealStorage), BrokerOptions::default()).unwrap();
        let r = Replication::place(&[1, 2, 3], 1, 3).unwrap().encode();
        b.create_topic_with(
            TOPIC,
            1,
            TopicConfig::default(),
            Some((REPLICATION_FILE, &r)),
        )
        .unwrap();
        b
    }

    fn record(i: u64) -> EntryRecord {
        EntryRecord {
            timestamp_ms: 1_700_000_000_000 + i as i64,
            key: (i % 2 == 0).then(|| format!("k{i}").into_bytes()),
            value: format!("value {i}").into_bytes(),
        }
    }

    fn fill(b: &Broker, from: u64, to: u64) {
        let rs: Vec<EntryRecord> = (from..to).map(record).collect();
        let nr: Vec<NewRecord<'_>> = rs
            .iter()
            .map(|r| NewRecord {
                key: r.key.as_deref(),
                value: &r.value,
                timestamp_ms: r.timestamp_ms,
            })
            .collect();
        b.append_applied(TOPIC, 0, &nr).unwrap();
    }

    /// A fresh replicated partition holding records `0..n`.
    fn holding(n: u64) -> (tempfile::TempDir, Arc<Broker>) {
        let tmp = tempfile::tempdir().unwrap();
        let b = open(tmp.path());
        fill(&b, 0, n);
        (tmp, b)
    }

    fn answer(start: u64, offsets: impl IntoIterator<Item = u64>) -> RecordsAnswer {
        RecordsAnswer {
            start,
            records: offsets.into_iter().map(|o| (o, record(o))).collect(),
            end: None,
        }
    }

    fn held(b: &Broker) -> Vec<(u64, EntryRecord)> {
        b.flush_partition(TOPIC, 0).unwrap();
        let end = b.written_end(TOPIC, 0).unwrap();
        let (start, _) = b.offsets(TOPIC, 0).unwrap();
        if start >= end {
            return Vec::new();
        }
        read_chunk(b, TOPIC, 0, start, end).unwrap()
    }

    #[test]
    fn records_past_the_end_are_taken_at_their_offsets_and_no_further() {
        let (_tmp, b) = holding(20);
        // The peer also sends records the partition holds and some at or past
        // `next`: only 20..40 are taken.
        assert_eq!(take(&b, TOPIC, 0, answer(0, 15..45), 40).unwrap(), 20);
        assert_eq!(b.written_end(TOPIC, 0).unwrap(), 40);
        let want: Vec<_> = (0..40).map(|o| (o, record(o))).collect();
        assert_eq!(held(&b), want);
        // Nothing new: nothing moves.
        assert_eq!(take(&b, TOPIC, 0, answer(0, 30..40), 40).unwrap(), 0);
        assert_eq!(take(&b, TOPIC, 0, answer(0, []), 40).unwrap(), 0);
    }

    #[test]
    fn a_gap_in_the_peers_records_is_refused_and_nothing_after_it_taken() {
        let (_tmp, b) = holding(20);
        let e = take(&b, TOPIC, 0, answer(0, (20..25).chain(27..30)), 40).unwrap_err();
        assert!(e.contains("jump from offset 25 to 27"), "{e}");
        assert_eq!(b.written_end(TOPIC, 0).unwrap(), 20, "nothing appended");
        let e = take(&b, TOPIC, 0, answer(0, 21..30), 40).unwrap_err();
        assert!(e.contains("jump from offset 20 to 21"), "{e}");
    }

    #[test]
    fn a_peer_whose_retention_removed_the_missing_records_restarts_the_partition() {
        let (_tmp, b) = holding(20);
        // The peer keeps 30.. only: 20..30 are gone there by retention.
        assert_eq!(take(&b, TOPIC, 0, answer(30, 30..40), 40).unwrap(), 20);
        assert_eq!(b.offsets(TOPIC, 0).unwrap().0, 30);
        let want: Vec<_> = (30..40).map(|o| (o, record(o))).collect();
        assert_eq!(held(&b), want);
        // A peer that kept nothing below `next`: the partition restarts there.
        let (_tmp, b) = holding(5);
        assert_eq!(take(&b, TOPIC, 0, answer(50, []), 40).unwrap(), 35);
        assert_eq!(b.written_end(TOPIC, 0).unwrap(), 40);
        assert_eq!(held(&b), Vec::new());
    }
}
