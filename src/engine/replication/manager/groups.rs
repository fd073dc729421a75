//! The consumer groups of a cluster (`groups::replicated` has the model): the
//! offsets topic is created as soon as every node it is placed on answers (at the
//! cluster's first start, so that groups do not wait for a node that is down when
//! a client first asks for one); a node outside its placement follows its leader
//! (`Manager::watched`); the node leading its partition coordinates every group (it
//! reads the partition, then serves), a node that stops leading it steps down, and
//! the coordinator's changes are written to the partition through Raft like any
//! produce.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver as _;
use openraft::ServerState;

use super::{lock, LogStores, Manager};
use crate::engine::groups::{
    GroupCoordinator, GroupError, GroupRecords, ReplicaWrite, OFFSETS_TOPIC,
};
use crate::engine::partition::NewRecord;
use crate::engine::replication::types::ProduceEntry;
use crate::format::wire::{parse_not_leader, ErrorCode};

/// How often a node looks at who leads the offsets topic.
const ROUND: Duration = Duration::from_millis(200);
/// How long a failed create of the offsets topic waits before the next.
const CREATE_RETRY: Duration = Duration::from_secs(1);
/// How often a failed create wanted by a client is said on stderr at most.
const CREATE_SAID_EVERY: Duration = Duration::from_secs(30);
/// How long a new leader waits for the entries of the terms before its own to be
/// applied before it reads the groups (it tries again at the next round).
const APPLY_WAIT: Duration = Duration::from_secs(10);
/// The most value bytes one produce of group changes carries (a group larger than
/// that goes alone, up to the topic's `max_record_bytes`).
const WRITE_BYTES: usize = 4 * 1024 * 1024;
/// How many replicas the offsets topic has: three, or every node of a smaller
/// cluster (Kafka's `offsets.topic.replication.factor`).
const OFFSETS_REPLICATION: usize = 3;

/// The offsets topic's settings: compacted (a group's last record is what counts),
/// segments small enough that compaction keeps the partition small, and records as
/// large as the format allows (a group stored with its members).
pub fn offsets_topic_settings() -> Vec<String> {
    vec![
        "cleanup_policy=compact".to_string(),
        format!("segment_bytes={}", 16 * 1024 * 1024),
        format!("max_record_bytes={}", crate::format::record::MAX_RECORD_LEN),
    ]
}

/// Refuses a client's produce to, or delete of, the offsets topic: only the group
/// coordinator writes it (a record of another shape would be a group the coordinator
/// cannot load), and without it every group's offsets would be gone.
pub(super) fn clients_may_write(topic: &str) -> Result<(), super::Refusal> {
    if topic == OFFSETS_TOPIC {
        return Err((
            ErrorCode::INVALID_REQUEST,
            format!(
                "{OFFSETS_TOPIC} holds the cluster's consumer groups: only the group \
                 coordinator writes it, and it cannot be deleted (use `groups delete` for \
                 a group)"
            ),
        ));
    }
    Ok(())
}

impl<L: LogStores> Manager<L> {
    /// Runs the cluster's groups on this node until `stop`.
    pub(super) async fn run_groups(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let coordinator = Arc::clone(self.broker.groups());
        let writer = tokio::spawn(Arc::clone(&self).write_groups(Arc::clone(&coordinator)));
        // Nodes other than the lowest wait a little before they create the topic,
        // so that a new cluster rarely has two nodes creating it.
        let stagger = Duration::from_millis(500 * self.node_id().saturating_sub(1).min(10));
        let mut next_create = Instant::now() + stagger;
        let mut load_failed: Option<String> = None;
        let mut create_said: Option<Instant> = None;
        let mut tick = tokio::time::interval(ROUND);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                break;
            }
            if self.leads_offsets() {
                if coordinator.coordinating() {
                    continue;
                }
                match self.load_groups().await {
                    Ok(records) => {
                        for line in &records.report {
                            tracing::warn!("{line}");
                            eprintln!("seglog: {line}");
                        }
                        let n = records.groups().len();
                        let imported = coordinator.take_over(records);
                        tracing::info!(
                            groups = n,
                            from_files = imported,
                            "this node coordinates the groups now (it leads {OFFSETS_TOPIC}/0)"
                        );
                        load_failed = None;
                    }
                    Err(e) => {
                        if load_failed.as_deref() != Some(e.as_str()) {
                            tracing::warn!(error = %e,
                                "this node leads {OFFSETS_TOPIC}/0 but cannot read the groups \
                                 yet; it tries again");
                            eprintln!(
                                "seglog: this node leads {OFFSETS_TOPIC}/0 but cannot read the \
                                 groups yet ({e}); it tries again"
                            );
                        }
                        load_failed = Some(e);
                    }
                }
                continue;
            }
            let named = self.offsets_leader();
            if coordinator.coordinating() {
                tracing::info!(coordinator = ?named.as_ref().map(|c| c.0),
                    "this node no longer leads {OFFSETS_TOPIC}/0: it stops coordinating the groups");
                coordinator.step_down(named.clone());
            } else {
                coordinator.set_coordinator(named.clone());
            }
            let known = lock(&self.topics).contains_key(OFFSETS_TOPIC)
                || lock(&self.watched).contains_key(OFFSETS_TOPIC);
            if !known && Instant::now() >= next_create {
                next_create = Instant::now() + CREATE_RETRY;
                // A client asked for a group meanwhile: a failed create is said.
                let wanted = coordinator.take_wanted();
                match self.placement(OFFSETS_TOPIC).await {
                    // Placed on other nodes only: this node follows its leader.
                    Ok(placement) => {
                        lock(&self.watched).insert(OFFSETS_TOPIC.to_string(), placement);
                    }
                    Err((ErrorCode::UNKNOWN_TOPIC, _)) => {
                        let say = wanted
                            && create_said.is_none_or(|at| at.elapsed() >= CREATE_SAID_EVERY);
                        if self.create_offsets_topic(say).await {
                            create_said = Some(Instant::now());
                        }
                    }
                    Err((_, msg)) => {
                        tracing::debug!(error = %msg, "cannot learn where {OFFSETS_TOPIC} is yet");
                    }
                }
            }
        }
        writer.abort();
    }

    /// Whether this node leads the offsets topic's partition now.
    fn leads_offsets(&self) -> bool {
        self.group(OFFSETS_TOPIC, 0).is_some() && self.check_leader(OFFSETS_TOPIC, 0).is_ok()
    }

    /// The leader of the offsets topic's partition as this node knows it, with its
    /// client address.
    fn offsets_leader(&self) -> Option<(u64, String)> {
        let (id, addr) = match self.leader_of(OFFSETS_TOPIC, 0) {
            Some(l) => l,
            None => {
                let id = self.leader_elsewhere(OFFSETS_TOPIC, 0)?;
                (id, self.peers.client_addr(id))
            }
        };
        Some((id, addr?))
    }

    /// Creates the offsets topic; a failure is said on stderr when `say` (a client
    /// wants a group), else only logged (peers not up yet at a cluster's start).
    /// True when a failure was said.
    async fn create_offsets_topic(&self, say: bool) -> bool {
        let factor = self.nodes.len().min(OFFSETS_REPLICATION) as u32;
        match self
            .create_topic(OFFSETS_TOPIC, 1, offsets_topic_settings(), factor)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    replication_factor = factor,
                    "created {OFFSETS_TOPIC}, the topic of the cluster's groups"
                );
                false
            }
            Err((ErrorCode::TOPIC_EXISTS, _)) => false,
            Err((_, msg)) if !say => {
                tracing::info!(error = %msg, "cannot create {OFFSETS_TOPIC} yet; trying again");
                false
            }
            Err((_, msg)) => {
                tracing::warn!(error = %msg,
                    "cannot create {OFFSETS_TOPIC} yet: groups are refused until it exists");
                eprintln!(
                    "seglog: cannot create {OFFSETS_TOPIC}, the topic of the cluster's groups, \
                     yet ({msg}); group requests are refused until it exists (tried again \
                     every {}s)",
                    CREATE_RETRY.as_secs()
                );
                true
            }
        }
    }

    /// Reads the groups from the offsets topic's partition, once every entry of the
    /// terms before this leader's is applied: the groups as the last coordinator
    /// left them.
    async fn load_groups(&self) -> Result<GroupRecords, String> {
        let raft = self
            .group(OFFSETS_TOPIC, 0)
            .ok_or_else(|| "its replica is not open".to_string())?;
        let deadline = Instant::now() + APPLY_WAIT;
        loop {
            let (leader, applied, last) = {
                let m = raft.metrics();
                let m = m.borrow_watched();
                (
                    m.state == ServerState::Leader,
                    m.last_applied.as_ref().map(|l| l.index),
                    m.last_log_index,
                )
            };
            if !leader {
                return Err("it no longer leads".into());
            }
            if applied.is_some() && applied >= last {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "entries up to {} are not applied after {}s",
                    last.unwrap_or(0),
                    APPLY_WAIT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let broker = Arc::clone(&self.broker);
        tokio::task::spawn_blocking(move || broker.flush_partition(OFFSETS_TOPIC, 0))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let (mut at, end) = self
            .broker
            .offsets(OFFSETS_TOPIC, 0)
            .map_err(|e| e.to_string())?;
        let mut records = GroupRecords::default();
        while at < end {
            let f = self
                .broker
                .fetch_async(OFFSETS_TOPIC, 0, at, 1024 * 1024, Duration::ZERO)
                .await
                .map_err(|e| e.to_string())?;
            let mut next = at;
            for c in &f.chunks {
                let mut pos = 0usize;
                while let Some(rest) = c.bytes.get(pos..).filter(|r| !r.is_empty()) {
                    let Ok(r) = crate::format::decode_record(rest, pos as u64, c.generation) else {
                        break;
                    };
                    pos += r.encoded_len;
                    if r.offset < at {
                        continue;
                    }
                    next = r.offset + 1;
                    records.add(r.offset, r.key, r.value);
                }
            }
            for c in f.chunks {
                crate::engine::partition::buffers::give(c.bytes);
            }
            if next <= at {
                // Nothing readable at `at` (damage): loading what comes before it
                // alone would bring back older offsets of the groups after it.
                return Err(format!(
                    "offsets {at}..{end} of {OFFSETS_TOPIC}/0 cannot be read"
                ));
            }
            at = next;
        }
        Ok(records.finish())
    }

    /// Writes the coordinator's changes, one produce at a time, until aborted.
    async fn write_groups(self: Arc<Self>, coordinator: Arc<GroupCoordinator>) {
        loop {
            coordinator.write_wanted().await;
            while let Some(w) = coordinator.take_writes() {
                for part in w.split(WRITE_BYTES) {
                    let result = self.write_group_records(&part).await;
                    if let Err(e) = &result {
                        tracing::warn!(groups = %part.names(), error = %e,
                            "a write of the groups to {OFFSETS_TOPIC} failed");
                    }
                    coordinator.finish_writes(part, result);
                }
            }
        }
    }

    async fn write_group_records(&self, w: &ReplicaWrite) -> Result<(), GroupError> {
        let records = w.records().map(|(key, value)| NewRecord {
            key: Some(key),
            value,
            timestamp_ms: -1,
        });
        let entry = ProduceEntry::new(None, records, crate::engine::partition::now_ms());
        match self.produce(OFFSETS_TOPIC, 0, entry).await {
            Ok(_) => Ok(()),
            Err((ErrorCode::NOT_LEADER, msg)) => Err(GroupError::NotCoordinator {
                group: String::new(),
                coordinator: parse_not_leader(&msg),
            }),
            Err((_, msg)) => Err(GroupError::Storage {
                group: w.names(),
                detail: format!("{OFFSETS_TOPIC}/0: {msg}"),
            }),
        }
    }
}
