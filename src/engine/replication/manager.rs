//! The replication manager: runs one openraft group per replicated partition this
//! node holds a replica of, on the server's tokio runtime, and answers the peers'
//! calls for them.
//!
//! Invariants:
//! - A replicated topic is one whose directory holds `replication.json`
//!   ([`crate::format::replication`]); its placement never changes after creation.
//! - A produce to a replicated partition is one Raft entry, acknowledged once it is
//!   committed and applied ([`Manager::produce`]); a node that does not lead the
//!   partition refuses it with NOT_LEADER naming the leader it knows.
//! - A group snapshots every `--raft-snapshot-entries` applied entries (a snapshot is
//!   the applied checkpoint, [`super::snapshot`]) and purges its Raft log below the
//!   snapshot less [`SNAPSHOT_LOG_KEPT`] entries; a replica that falls behind the
//!   purged part catches up from a snapshot. The purge never touches the data
//!   partition. A topic whose cleanup policy compacts (its offsets have gaps a
//!   snapshot cannot carry) keeps its Raft log whole and never snapshots.
//! - Membership is fixed at creation: the group is initialised once, by the first
//!   replica, with every replica as a voter.
//! - A replica whose Raft group stopped (a storage error, such as a failed fsync of
//!   its Raft log or of its data partition at apply) or whose data partition failed
//!   is fail-stopped until a restart runs recovery ([`Manager::replica_failure`]):
//!   it leads nothing whatever its last metrics say, refuses produce and fetch with
//!   NOT_LEADER naming the leader the other replicas name (so clients move on), and
//!   `cluster status` shows it `failed`. A produce whose entry was proposed before
//!   the group stopped has an unknown outcome (the others may commit it): it is
//!   refused with NOT_LEADER too, never as a definite failure, so the client retries
//!   on the leader, where an idempotent producer's retry is a duplicate.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver as _;
use openraft::base::BoxStream;
use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::AppendEntriesRequest;
use openraft::storage::RaftLogStorage;
use openraft::Instant as _;
use openraft::{BasicNode, Config, RaftMetrics, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};

use super::network::{
    decode_append_request, encode_append_reply, AppendAnswers, CallError, CallHandler,
    GroupNetwork, Peers,
};
use super::snapshot::{
    meta_of, BeginRequest, BeginResponse, ChunkRequest, InstallRequest, PartitionSnapshot,
    SnapshotError, SnapshotSource, Staging,
};
use super::state_machine::PartitionStateMachine;
use super::types::{ApplyResult, ProduceEntry, RaftGroup, TypeConfig};
use super::{Applied, BoxFuture, PartitionView, Refusal, Replicator};
use crate::engine::broker::Broker;
use crate::engine::error::one_line;
use crate::format::replication::{Replication, REPLICATION_FILE};
use crate::format::topic::TopicConfig;
use crate::format::wire::raft::Rpc;
use crate::format::wire::{not_leader_message, ErrorCode};

mod groups;
mod keys;
mod mend;
mod rejoin;
mod repair;
mod schemas;

/// How long a call between nodes may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a node holding no replica of a topic waits for each other node's answer
/// to where the topic is.
const PLACEMENT_WAIT: Duration = Duration::from_secs(2);
/// Pause between asks of a peer that is not connected yet.
const UNREACHABLE_RETRY: Duration = Duration::from_millis(50);
/// How long a new group may take to elect its first leader before create returns.
const FIRST_LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a node asks the leaders of the groups it follows which replicas are in
/// sync (peer call `Status`), for its Kafka Metadata.
const IN_SYNC_REFRESH: Duration = Duration::from_secs(1);
/// How long a leader's answer stands for a follower's Metadata; older, or from
/// another term or leader, the follower names the leader alone.
const IN_SYNC_FRESH: Duration = Duration::from_secs(3);
/// A follower is in sync while it has answered the leader and held every committed
/// entry within this long (Kafka's `replica.lag.time.max.ms`): one a batch behind at
/// the moment asked stays in, a dead or stalled one drops out.
const IN_SYNC_LAG: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Opens the Raft log of one replicated partition (the log store lives in
/// [`super::log_store`]).
pub trait LogStores: Send + Sync + 'static {
    type Store: RaftLogStorage<TypeConfig>;
    /// Opens (creating if absent) the Raft log of `topic/partition`.
    fn open(&self, broker: &Arc<Broker>, topic: &str, partition: u32) -> io::Result<Self::Store>;
}

/// The election timeout's range. openraft also holds a leader's lease for
/// `election_timeout_max` after the last heartbeat, and a follower starts its election
/// only once the lease and then its own timeout have passed: a leader's death is
/// noticed `max + [min, max)` after its last heartbeat (here 1.5 to 2 s, so at least
/// 15 heartbeats missed in a row).
const ELECTION_TIMEOUT_MIN_MS: u64 = 500;
const ELECTION_TIMEOUT_MAX_MS: u64 = 1000;
/// Applied entries between two snapshots of a group, unless `--raft-snapshot-entries`
/// says otherwise.
pub const SNAPSHOT_ENTRIES_DEFAULT: u64 = 10_000;
/// Entries a snapshot covers that the Raft log still keeps (a follower a little
/// behind catches up from the log, not from a snapshot).
pub const SNAPSHOT_LOG_KEPT: u64 = 1_000;
/// Longest one snapshot call (a chunk, or the install) may take.
const SNAPSHOT_CALL_TIMEOUT_MS: u64 = 30_000;

/// openraft's settings for every group: a heartbeat well inside the election timeout,
/// with room for a loaded machine; a snapshot every [`SNAPSHOT_ENTRIES_DEFAULT`]
/// applied entries.
pub fn raft_config() -> Result<Arc<Config>, openraft::ConfigError> {
    raft_config_with(SNAPSHOT_ENTRIES_DEFAULT)
}

/// [`raft_config`] with a snapshot every `snapshot_entries` applied entries (0: never,
/// and the Raft log is kept whole), the log purged below a snapshot less
/// [`SNAPSHOT_LOG_KEPT`] entries (fewer when the interval is small).
pub fn raft_config_with(snapshot_entries: u64) -> Result<Arc<Config>, openraft::ConfigError> {
    let (snapshot_policy, kept) = match snapshot_entries {
        0 => (SnapshotPolicy::Never, u64::MAX),
        n => (
            SnapshotPolicy::LogsSinceLast(n),
            SNAPSHOT_LOG_KEPT.min(n / 2),
        ),
    };
    let c = Config {
        cluster_name: "seglog".into(),
        heartbeat_interval: 100,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        snapshot_policy,
        max_in_snapshot_log_to_keep: kept,
        install_snapshot_timeout: SNAPSHOT_CALL_TIMEOUT_MS,
        ..Config::default()
    };
    Ok(Arc::new(c.validate()?))
}

/// What a node is asked to create for a new replicated topic.
#[derive(Debug, Serialize, Deserialize)]
struct CreateReplica {
    partitions: u32,
    /// `KEY=VALUE` topic settings.
    settings: Vec<String>,
    replication: Replication,
}

/// This node's groups and the peers they talk to.
pub struct Manager<L: LogStores> {
    broker: Arc<Broker>,
    peers: Arc<Peers>,
    stores: L,
    config: Arc<Config>,
    /// Every node of the cluster: id → Raft address.
    nodes: BTreeMap<u64, String>,
    /// Replicated topics' placements.
    topics: Mutex<BTreeMap<String, Replication>>,
    /// Placements of replicated topics this node holds no replica of whose leaders
    /// it follows all the same (the offsets topic, on a node outside its placement:
    /// that node names the group coordinator too).
    watched: Mutex<BTreeMap<String, Replication>>,
    groups: Mutex<BTreeMap<(String, u32), RaftGroup>>,
    /// Snapshots being received, by group.
    staging: Mutex<BTreeMap<(String, u32), Staging>>,
    /// Serialises creates and group opens.
    admin: tokio::sync::Mutex<()>,
    /// The in-sync replicas of the groups this node follows, as their leaders last
    /// said ([`Manager::refresh_in_sync`]).
    leaders_in_sync: Mutex<BTreeMap<(String, u32), LeaderInSync>>,
    /// For the groups this node leads: when each follower was last seen holding every
    /// committed entry ([`Manager::leader_in_sync`]).
    caught_up: Mutex<BTreeMap<(String, u32, u64), Instant>>,
    /// The partitions of replicated topics this node holds no replica of, as a
    /// holder last told ([`Manager::refresh_in_sync`]).
    held_elsewhere: Mutex<BTreeMap<(String, u32), HeldElsewhere>>,
    /// The groups this node holds a replica of that are not open, and why (waiting
    /// for records or a checkpoint from its peers, or refused: [`repair`]).
    closed: Mutex<BTreeMap<(String, u32), String>>,
    /// Rounds of [`Manager::refresh_in_sync`], to ask the holders in turn.
    rounds: std::sync::atomic::AtomicUsize,
    /// Damaged sealed segments to mend from the peers ([`mend`]).
    mends: mend::MendQueue,
}

/// A leader's answer to which replicas of one of its groups are in sync.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LeaderInSync {
    leader: u64,
    term: u64,
    in_sync: Vec<u64>,
    at: Instant,
}

/// A partition this node holds no replica of, as a node holding one last told: the
/// leader and term, and the in-sync replicas when the leader itself answered. It
/// lets this node name the leader in a NOT_LEADER refusal, `cluster status` and
/// Kafka Metadata, so that a topic placed on fewer nodes than the cluster has is
/// reached through any node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HeldElsewhere {
    leader: u64,
    term: u64,
    in_sync: Option<Vec<u64>>,
    at: Instant,
}

/// A row of a peer's status about a group it runs (not one it only heard of): the
/// partition, its leader and its term; `None` without a known leader.
fn held_row(p: &serde_json::Value) -> Option<((String, u32), u64, u64)> {
    if p["held"] == false {
        return None;
    }
    let topic = p["topic"].as_str()?;
    let partition = u32::try_from(p["partition"].as_u64()?).ok()?;
    Some((
        (topic.to_string(), partition),
        p["leader"].as_u64()?,
        p["term"].as_u64()?,
    ))
}

/// The in-sync replicas a node that does not lead a group names: its leader's last
/// answer when that is fresh and from the leader and term this node knows, else the
/// leader alone (the one replica sure to hold every committed entry), else none.
fn follower_in_sync(
    known: Option<&LeaderInSync>,
    leader: Option<u64>,
    term: u64,
    now: Instant,
) -> Vec<u64> {
    let Some(leader) = leader else {
        return Vec::new();
    };
    match known {
        Some(k)
            if k.leader == leader
                && k.term == term
                && now.saturating_duration_since(k.at) < IN_SYNC_FRESH =>
        {
            k.in_sync.clone()
        }
        _ => vec![leader],
    }
}

impl<L: LogStores> std::fmt::Debug for Manager<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("node_id", &self.peers.ident.node_id)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl<L: LogStores> Manager<L> {
    /// A manager for `broker` on a cluster of `nodes` (id, Raft address), itself
    /// included. Nothing runs until [`Manager::run`].
    pub fn new(
        broker: Arc<Broker>,
        peers: Arc<Peers>,
        stores: L,
        nodes: &[(u64, String)],
    ) -> Result<Arc<Self>, openraft::ConfigError> {
        Self::new_with(broker, peers, stores, nodes, raft_config()?)
    }

    /// [`Manager::new`] with these openraft settings ([`raft_config_with`]).
    pub fn new_with(
        broker: Arc<Broker>,
        peers: Arc<Peers>,
        stores: L,
        nodes: &[(u64, String)],
        config: Arc<Config>,
    ) -> Result<Arc<Self>, openraft::ConfigError> {
        Ok(Arc::new(Manager {
            broker,
            peers,
            stores,
            config,
            nodes: nodes.iter().cloned().collect(),
            topics: Mutex::new(BTreeMap::new()),
            watched: Mutex::new(BTreeMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            staging: Mutex::new(BTreeMap::new()),
            admin: tokio::sync::Mutex::new(()),
            leaders_in_sync: Mutex::new(BTreeMap::new()),
            caught_up: Mutex::new(BTreeMap::new()),
            held_elsewhere: Mutex::new(BTreeMap::new()),
            closed: Mutex::new(BTreeMap::new()),
            rounds: std::sync::atomic::AtomicUsize::new(0),
            mends: mend::MendQueue::new(),
        }))
    }

    fn node_id(&self) -> u64 {
        self.peers.ident.node_id
    }

    /// Connects to the peers, opens the groups of every replicated topic on disk, and
    /// serves the peers' calls on `listener` until `stop` turns true. Runs on the
    /// server's runtime.
    pub async fn run(
        self: Arc<Self>,
        listener: std::net::TcpListener,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        self.peers.start();
        let mut repairs = Vec::new();
        for topic in self.broker.list_topics() {
            match self.open_topic(&topic).await {
                Ok(waiting) => {
                    for p in waiting {
                        repairs.push(tokio::spawn(Arc::clone(&self).repair_then_open(
                            topic.clone(),
                            p,
                            stop.clone(),
                        )));
                    }
                }
                Err(e) => {
                    tracing::error!(topic, error = %e, "cannot open the topic's Raft groups");
                    eprintln!("seglog: topic {topic}: cannot open its Raft groups: {e}");
                }
            }
        }
        // Every held replica's sealed segments get the startup check for damage a
        // peer's records can mend.
        for (topic, r) in lock(&self.topics).iter() {
            for (p, replicas) in r.replicas.iter().enumerate() {
                if replicas.contains(&self.node_id()) {
                    self.want_mend(topic, p as u32);
                }
            }
        }
        let mends = tokio::spawn(Arc::clone(&self).mend_loop(stop.clone()));
        let refresh = tokio::spawn(Arc::clone(&self).refresh_in_sync(stop.clone()));
        let groups = tokio::spawn(Arc::clone(&self).run_groups(stop.clone()));
        let restore = self
            .peers
            .ident
            .new_directory()
            .then(|| tokio::spawn(Arc::clone(&self).restore_replicas(stop.clone())));
        let peers = Arc::clone(&self.peers);
        super::network::serve(listener, peers, Arc::clone(&self), stop).await;
        refresh.abort();
        groups.abort();
        mends.abort();
        if let Some(r) = restore {
            r.abort();
        }
        for r in repairs {
            r.abort();
        }
        let groups: Vec<RaftGroup> = lock(&self.groups).values().cloned().collect();
        for g in groups {
            let _ = g.shutdown().await;
        }
        lock(&self.groups).clear();
        Ok(())
    }

    /// Reads a topic's placement and opens the groups this node holds. Returns the
    /// partitions whose groups wait for records their data partition lacks
    /// ([`repair`]): the caller starts [`Manager::repair_then_open`] for each.
    async fn open_topic(&self, topic: &str) -> io::Result<Vec<u32>> {
        let dir = self.broker.topic_dir(topic);
        let path = dir.join(REPLICATION_FILE);
        let bytes = match crate::engine::producers::read_state_file(
            &path,
            crate::format::replication::REPLICATION_FILE_BYTES_MAX,
        ) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(Vec::new()),
            Err(e) => return Err(io::Error::other(format!("{}: {e}", path.display()))),
        };
        let partitions = self
            .broker
            .partition_count(topic)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let r = Replication::decode(&bytes, partitions)
            .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
        lock(&self.topics).insert(topic.to_string(), r.clone());
        let mut waiting = Vec::new();
        let mut failed = Vec::new();
        for (p, replicas) in r.replicas.iter().enumerate() {
            if !replicas.contains(&self.node_id()) {
                continue;
            }
            // One group that cannot open leaves the topic's others open.
            match self.open_group(topic, p as u32).await {
                Ok(true) => {}
                Ok(false) => waiting.push(p as u32),
                Err(e) => {
                    lock(&self.closed).insert((topic.to_string(), p as u32), e.to_string());
                    failed.push(format!("partition {p}: {e}"));
                }
            }
        }
        if !failed.is_empty() {
            return Err(io::Error::other(failed.join("; ")));
        }
        Ok(waiting)
    }

    /// Opens the group of `topic/partition` unless it is open: `Ok(false)` when it
    /// must first fetch records its data partition lacks from a peer ([`repair`]).
    async fn open_group(&self, topic: &str, partition: u32) -> io::Result<bool> {
        let key = (topic.to_string(), partition);
        if lock(&self.groups).contains_key(&key) {
            return Ok(true);
        }
        let mut store = self.stores.open(&self.broker, topic, partition)?;
        self.check_vote_kept(topic, partition, &mut store).await?;
        let sm = match self.behind(topic, partition, &mut store).await? {
            repair::Behind::No => {
                PartitionStateMachine::open(Arc::clone(&self.broker), topic, partition)?
            }
            repair::Behind::Reapply { end, next } => {
                tracing::warn!(
                    topic,
                    partition,
                    end,
                    next,
                    "the data partition ends before the records it applied (damage cut at \
                     start): its Raft log holds every entry, which is applied again from \
                     the start (only the missing records are written)"
                );
                PartitionStateMachine::open_empty(Arc::clone(&self.broker), topic, partition)
            }
            repair::Behind::NoCheckpoint { purged } => {
                return Ok(self.wait_closed(
                    key,
                    format!(
                        "waiting for a peer's checkpoint: its own (applied-{partition}.json) is \
                         missing while its Raft log is purged up to entry {purged}"
                    ),
                ));
            }
            repair::Behind::Fetch { end, next } => {
                return Ok(self.wait_closed(
                    key,
                    format!(
                        "waiting for offsets {end}..{next} from its peers: its data partition \
                         lost records it had applied (damage cut at start), and its Raft log \
                         no longer holds their entries"
                    ),
                ));
            }
        };
        let network = GroupNetwork {
            peers: Arc::clone(&self.peers),
            topic: topic.to_string(),
            partition,
        };
        let config = self.group_config(topic)?;
        let raft = RaftGroup::new(self.node_id(), config, network, store, sm)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        lock(&self.closed).remove(&key);
        lock(&self.groups).insert(key, raft);
        Ok(true)
    }

    /// Keeps a group closed until [`Manager::repair_then_open`] opens it, saying why
    /// (the log, and `cluster status`); `false`, for [`Manager::open_group`].
    fn wait_closed(&self, key: (String, u32), why: String) -> bool {
        tracing::warn!(
            topic = key.0,
            partition = key.1,
            "the group stays closed: {why}"
        );
        lock(&self.closed).insert(key, why);
        false
    }

    /// The settings of a topic's groups: a compacted topic never snapshots (a
    /// snapshot carries records at consecutive offsets), so its log is kept whole.
    fn group_config(&self, topic: &str) -> io::Result<Arc<Config>> {
        let compacts = self
            .broker
            .topic_compacts(topic)
            .map_err(|e| io::Error::other(e.to_string()))?;
        if !compacts || self.config.snapshot_policy == SnapshotPolicy::Never {
            return Ok(Arc::clone(&self.config));
        }
        let c = Config {
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: u64::MAX,
            ..(*self.config).clone()
        };
        Ok(Arc::new(
            c.validate().map_err(|e| io::Error::other(e.to_string()))?,
        ))
    }

    /// The Raft directory of a group (`DATA/raft/<topic>/<partition>/`).
    fn raft_dir(&self, topic: &str, partition: u32) -> std::path::PathBuf {
        self.broker
            .data_dir()
            .join(super::node::RAFT_DIR)
            .join(topic)
            .join(partition.to_string())
    }

    /// A leader begins sending a snapshot: a new staging file replaces any other
    /// transfer's; the answer says where the data partition ends.
    fn snapshot_begin(
        &self,
        topic: &str,
        partition: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let req: BeginRequest = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let data_end = self
            .broker
            .written_end(topic, partition)
            .map_err(|e| e.to_string())?;
        let staging = Staging::begin(
            &**self.broker.storage(),
            &self.raft_dir(topic, partition),
            req.transfer,
        )
        .map_err(|e| e.to_string())?;
        tracing::info!(topic, partition, transfer = req.transfer, data_end,
            last_log_id = ?req.last_log_id, "receiving a snapshot");
        lock(&self.staging).insert((topic.to_string(), partition), staging);
        serde_json::to_vec(&BeginResponse { data_end }).map_err(|e| e.to_string())
    }

    /// Stages one chunk of the transfer in progress.
    fn snapshot_chunk(
        &self,
        topic: &str,
        partition: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let req: ChunkRequest = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let mut staging = lock(&self.staging);
        let s = staging.get_mut(&(topic.to_string(), partition));
        match s {
            Some(s) if s.transfer() == req.transfer => {
                s.push(&req.records).map_err(|e| e.to_string())?;
                Ok(b"null".to_vec())
            }
            other => Err(SnapshotError::OtherTransfer {
                got: req.transfer,
                expected: other.map(|s| s.transfer()),
            }
            .to_string()),
        }
    }

    /// Installs the transfer in progress through openraft (which checks the vote,
    /// calls the state machine's install, then moves its log past the snapshot).
    async fn snapshot_install(
        &self,
        topic: &str,
        partition: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let req: InstallRequest = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        let raft = self
            .group(topic, partition)
            .ok_or_else(|| format!("no Raft group {topic}/{partition} on this node"))?;
        let path = {
            let mut staging = lock(&self.staging);
            let key = (topic.to_string(), partition);
            match staging.get(&key) {
                Some(s) if s.transfer() == req.transfer => {
                    staging.remove(&key).map(|s| s.path().to_path_buf())
                }
                other => {
                    return Err(SnapshotError::OtherTransfer {
                        got: req.transfer,
                        expected: other.map(Staging::transfer),
                    }
                    .to_string())
                }
            }
        };
        let Some(path) = path else {
            return Err("no snapshot being received".into());
        };
        // openraft refuses (by panicking) a snapshot past the sender's leadership:
        // such a message is refused here first.
        let past_vote = req
            .applied
            .last_applied
            .as_ref()
            .is_some_and(|l| l.leader_id.term > req.vote.leader_id.term);
        if past_vote {
            return Err(format!(
                "{topic}/{partition}: a snapshot at {:?} past the sender's vote {:?}",
                req.applied.last_applied, req.vote
            ));
        }
        let snapshot = super::snapshot::Snapshot {
            meta: meta_of(&req.applied),
            snapshot: PartitionSnapshot {
                applied: req.applied,
                source: SnapshotSource::Staged {
                    path,
                    first_offset: req.first_offset,
                },
            },
        };
        let resp = raft
            .install_full_snapshot(req.vote, snapshot)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::to_vec(&resp).map_err(|e| e.to_string())
    }

    fn group(&self, topic: &str, partition: u32) -> Option<RaftGroup> {
        lock(&self.groups)
            .get(&(topic.to_string(), partition))
            .cloned()
    }

    /// The refusal of a request for a partition whose group this node does not run:
    /// on a node the placement leaves out, the leader a holder last named, else a
    /// holder (which names the leader in turn); else the leader is unknown (the
    /// group is not open yet, or the topic is gone).
    fn no_group(&self, topic: &str, partition: u32) -> Refusal {
        let known = lock(&self.held_elsewhere)
            .get(&(topic.to_string(), partition))
            .filter(|v| v.at.elapsed() < IN_SYNC_FRESH)
            .map(|v| v.leader);
        if known.is_some() {
            return self.not_leader(topic, partition, known);
        }
        let placement = lock(&self.topics).get(topic).cloned();
        match placement {
            Some(placement)
                if placement
                    .replicas
                    .get(partition as usize)
                    .is_some_and(|r| !r.contains(&self.node_id())) =>
            {
                self.sent_to_holder(topic, partition, &placement)
            }
            _ => self.not_leader(topic, partition, None),
        }
    }

    fn not_leader(&self, topic: &str, partition: u32, leader: Option<u64>) -> Refusal {
        let named = leader
            .filter(|l| *l != self.node_id())
            .and_then(|l| self.peers.client_addr(l).map(|a| (l, a)));
        let msg = not_leader_message(
            topic,
            partition,
            named.as_ref().map(|(l, a)| (*l, a.as_str())),
        );
        (ErrorCode::NOT_LEADER, msg)
    }

    /// Proposes one produce request's records as one entry and waits until it is
    /// committed and applied.
    pub async fn produce(
        &self,
        topic: &str,
        partition: u32,
        entry: ProduceEntry,
    ) -> Result<(u64, u64), Refusal> {
        let Some(raft) = self.group(topic, partition) else {
            return Err(self.no_group(topic, partition));
        };
        if let Some(why) = self.fail_stop(topic, partition, &raft).await {
            return Err(self.stopped(topic, partition, &why));
        }
        match raft.client_write(entry).await {
            Ok(resp) => self.written(topic, partition, Ok(resp)),
            Err(RaftError::APIError(e)) => self.written(topic, partition, Err(e)),
            Err(RaftError::Fatal(e)) => Err(self.unknown_outcome(topic, partition, &e)),
        }
    }

    /// The refusal of a produce whose entry was handed to the group before the group
    /// stopped: the entry may be in the other replicas' logs and be committed there,
    /// so this is no definite refusal. NOT_LEADER sends the client to the leader,
    /// where an idempotent producer's retry is recognised as a duplicate (a plain
    /// produce's retry may write the records twice, as after a lost connection).
    fn unknown_outcome(&self, topic: &str, partition: u32, e: &dyn std::fmt::Display) -> Refusal {
        let (code, msg) =
            self.not_leader(topic, partition, self.leader_elsewhere(topic, partition));
        (
            code,
            format!(
                "node {}'s replica of {topic}/{partition} stopped ({}) after the entry was \
                 proposed: its outcome is unknown, retry on the leader; {msg}",
                self.node_id(),
                one_line(&e.to_string())
            ),
        )
    }

    /// The refusal of a request to a fail-stopped replica ([`Manager::replica_failure`]):
    /// NOT_LEADER naming the leader the other replicas name, if any.
    fn stopped(&self, topic: &str, partition: u32, why: &str) -> Refusal {
        let (code, msg) =
            self.not_leader(topic, partition, self.leader_elsewhere(topic, partition));
        (
            code,
            format!(
                "node {}'s replica of {topic}/{partition} is stopped until a restart runs \
                 recovery ({why}); {msg}",
                self.node_id()
            ),
        )
    }

    /// Why this node's replica of a group is fail-stopped, if it is: its Raft core
    /// stopped (openraft then keeps its last metrics, which may still name this node
    /// leader: they are not to be believed), or its data partition refuses writes, so
    /// that the next entry's apply would stop the core anyway.
    fn replica_failure(
        &self,
        topic: &str,
        partition: u32,
        m: &RaftMetrics<TypeConfig>,
    ) -> Option<String> {
        if let Err(e) = &m.running_state {
            return Some(format!(
                "its Raft group stopped: {}",
                one_line(&e.to_string())
            ));
        }
        self.broker
            .partition_failure(topic, partition)
            .map(|r| format!("its data partition failed: {}", one_line(&r.to_string())))
    }

    /// [`Manager::replica_failure`] of a running group; a group whose data partition
    /// failed while its core still runs is shut down here, so that, leader or not, it
    /// stops answering its peers and the others elect a leader among themselves (a
    /// leader's heartbeats would otherwise hold them off until its next apply fails).
    async fn fail_stop(&self, topic: &str, partition: u32, raft: &RaftGroup) -> Option<String> {
        // On every produce: the metrics are read in place, not cloned.
        let (why, running) = {
            let metrics = raft.metrics();
            let m = metrics.borrow_watched();
            (
                self.replica_failure(topic, partition, &m),
                m.running_state.is_ok(),
            )
        };
        let why = why?;
        if running {
            tracing::error!(topic, partition, reason = %why,
                "stopping this node's replica: it serves nothing until a restart runs recovery");
            eprintln!(
                "seglog: {topic}/{partition}: this node's replica stops until a restart runs \
                 recovery: {why}"
            );
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(topic, partition, error = %e, "shutting the group down failed");
            }
        }
        Some(why)
    }

    /// The leader of a partition as the other nodes last named it (fresh only, and
    /// never this node): for a node holding no replica, or whose replica stopped.
    fn leader_elsewhere(&self, topic: &str, partition: u32) -> Option<u64> {
        lock(&self.held_elsewhere)
            .get(&(topic.to_string(), partition))
            .filter(|v| v.at.elapsed() < IN_SYNC_FRESH && v.leader != self.node_id())
            .map(|v| v.leader)
    }

    /// [`Manager::produce`] in two steps, for a connection that pipelines: when the
    /// returned future is ready the entry is queued to the partition's Raft core
    /// behind every entry submitted before it (so entries of one connection are in
    /// the log in request order); the future it yields ends once the entry is
    /// committed and applied, with the offsets.
    pub async fn submit(
        self: Arc<Self>,
        topic: String,
        partition: u32,
        entry: ProduceEntry,
    ) -> Result<Applied, Refusal> {
        let Some(raft) = self.group(&topic, partition) else {
            return Err(self.no_group(&topic, partition));
        };
        if let Some(why) = self.fail_stop(&topic, partition, &raft).await {
            return Err(self.stopped(&topic, partition, &why));
        }
        let (responder, answer) = openraft::impls::ProgressResponder::complete_only();
        if let Err(e) = raft.client_write_ff(entry, Some(responder)).await {
            return Err(self.unknown_outcome(&topic, partition, &e));
        }
        Ok(Box::pin(async move {
            match answer.await {
                Ok(result) => self.written(&topic, partition, result),
                // The core ended without answering (it stopped): the entry may be
                // committed by the others.
                Err(_) => {
                    let why = raft
                        .metrics()
                        .borrow_watched()
                        .running_state
                        .clone()
                        .err()
                        .map_or_else(|| "its Raft group stopped".to_string(), |e| e.to_string());
                    Err(self.unknown_outcome(&topic, partition, &why))
                }
            }
        }))
    }

    /// The answer to a produce from what its entry's write came to.
    fn written(
        &self,
        topic: &str,
        partition: u32,
        result: Result<
            openraft::raft::ClientWriteResponse<TypeConfig>,
            ClientWriteError<TypeConfig>,
        >,
    ) -> Result<(u64, u64), Refusal> {
        match result {
            Ok(resp) => match resp.data {
                ApplyResult::Appended {
                    base_offset,
                    last_offset,
                }
                | ApplyResult::Duplicate {
                    base_offset,
                    last_offset,
                } => Ok((base_offset, last_offset)),
                ApplyResult::Refused { code, message } => Err((ErrorCode(code), message)),
                ApplyResult::None => Err((ErrorCode::INTERNAL, "applied as no entry".into())),
            },
            Err(ClientWriteError::ForwardToLeader(f) | ClientWriteError::LogEntryDiscarded(f)) => {
                Err(self.not_leader(topic, partition, f.leader_id))
            }
            Err(e) => Err((ErrorCode::INTERNAL, e.to_string())),
        }
    }

    /// `Ok` when this node leads the partition now (reads are served there only).
    pub fn check_leader(&self, topic: &str, partition: u32) -> Result<(), Refusal> {
        let Some(raft) = self.group(topic, partition) else {
            return Err(self.no_group(topic, partition));
        };
        let m = raft.metrics().borrow_watched().clone();
        if let Some(why) = self.replica_failure(topic, partition, &m) {
            return Err(self.stopped(topic, partition, &why));
        }
        if m.state == ServerState::Leader && m.current_leader == Some(self.node_id()) {
            Ok(())
        } else {
            Err(self.not_leader(topic, partition, m.current_leader))
        }
    }

    /// The leader this node knows for the partition, with its client address.
    pub fn leader_of(&self, topic: &str, partition: u32) -> Option<(u64, Option<String>)> {
        let raft = self.group(topic, partition)?;
        let m = raft.metrics().borrow_watched().clone();
        let leader = match self.replica_failure(topic, partition, &m) {
            Some(_) => self.leader_elsewhere(topic, partition)?,
            None => m.current_leader?,
        };
        Some((leader, self.peers.client_addr(leader)))
    }

    /// Every node with a Kafka listener this node knows of, itself included.
    pub fn kafka_nodes(&self) -> Vec<(u64, String)> {
        self.nodes
            .keys()
            .filter_map(|id| self.peers.kafka_addr(*id).map(|a| (*id, a)))
            .collect()
    }

    /// The partition's leader, term, placement and in-sync replicas as this node
    /// sees them: a leader from its replication metrics, another node from what the
    /// leader last said ([`follower_in_sync`]).
    pub fn partition_view(&self, topic: &str, partition: u32) -> Option<PartitionView> {
        let replicas = lock(&self.topics)
            .get(topic)?
            .replicas
            .get(partition as usize)?
            .clone();
        let Some(raft) = self.group(topic, partition) else {
            // A partition placed on other nodes only: as a holder last told.
            let v = lock(&self.held_elsewhere)
                .get(&(topic.to_string(), partition))
                .filter(|v| v.at.elapsed() < IN_SYNC_FRESH)
                .cloned()?;
            return Some(PartitionView {
                leader: Some(v.leader),
                term: v.term,
                replicas,
                in_sync: v.in_sync.unwrap_or_else(|| vec![v.leader]),
                held: false,
            });
        };
        let m = raft.metrics().borrow_watched().clone();
        if self.replica_failure(topic, partition, &m).is_some() {
            // A stopped replica leads nothing: the leader as the others name it.
            let v = lock(&self.held_elsewhere)
                .get(&(topic.to_string(), partition))
                .filter(|v| v.at.elapsed() < IN_SYNC_FRESH && v.leader != self.node_id())
                .cloned();
            return Some(match v {
                Some(v) => PartitionView {
                    leader: Some(v.leader),
                    term: v.term.max(m.current_term),
                    replicas,
                    in_sync: v.in_sync.unwrap_or_else(|| vec![v.leader]),
                    held: true,
                },
                None => PartitionView {
                    leader: None,
                    term: m.current_term,
                    replicas,
                    in_sync: Vec::new(),
                    held: true,
                },
            });
        }
        let in_sync = match self.leader_in_sync(topic, partition, &replicas, &m) {
            Some(in_sync) => in_sync,
            None => follower_in_sync(
                lock(&self.leaders_in_sync).get(&(topic.to_string(), partition)),
                m.current_leader,
                m.current_term,
                Instant::now(),
            ),
        };
        Some(PartitionView {
            leader: m.current_leader,
            term: m.current_term,
            replicas,
            in_sync,
            held: true,
        })
    }

    /// The replicas of a group this node leads that are in sync, in placement order:
    /// voters that are this node, or that answered it within [`IN_SYNC_LAG`] and were
    /// seen holding every committed entry within it (seen here, when asked, and by
    /// [`Manager::refresh_in_sync`] every second). `None` when this node does not lead
    /// the group.
    fn leader_in_sync(
        &self,
        topic: &str,
        partition: u32,
        replicas: &[u64],
        m: &RaftMetrics<TypeConfig>,
    ) -> Option<Vec<u64>> {
        let matched = m.replication.as_ref()?;
        if m.state != ServerState::Leader {
            return None;
        }
        let committed = m.local_committed.as_ref().map_or(0, |l| l.index);
        let voters: BTreeSet<u64> = m.membership_config.voter_ids().collect();
        let now = Instant::now();
        let mut caught_up = lock(&self.caught_up);
        let mut in_sync = Vec::new();
        for &id in replicas.iter().filter(|id| voters.contains(id)) {
            if id == self.node_id() {
                in_sync.push(id);
                continue;
            }
            let key = (topic.to_string(), partition, id);
            let holds_all = matched
                .get(&id)
                .and_then(|l| l.as_ref())
                .is_some_and(|l| l.index >= committed);
            if holds_all {
                caught_up.insert(key.clone(), now);
            }
            let answered = m
                .heartbeat
                .as_ref()
                .and_then(|h| h.get(&id))
                .and_then(|at| at.as_ref())
                .is_some_and(|at| at.elapsed() < IN_SYNC_LAG);
            let recent = caught_up
                .get(&key)
                .is_some_and(|at| now.saturating_duration_since(*at) < IN_SYNC_LAG);
            if answered && recent {
                in_sync.push(id);
            }
        }
        Some(in_sync)
    }

    /// Every [`IN_SYNC_REFRESH`] until `stop`, asks the leader of each group this
    /// node follows for its in-sync replicas ([`Manager::refresh_in_sync_once`]).
    async fn refresh_in_sync(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(IN_SYNC_REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
            self.refresh_in_sync_once().await;
        }
    }

    /// One round: one `Status` call per leader of a group this node follows; each
    /// group that leader leads in the term this node knows gets its answer. A leader
    /// that does not answer leaves its groups' last answers to age out. The same
    /// calls (and one per other node needed) ask, for each partition of a replicated
    /// topic this node holds no replica of, its leader as last heard of, else one of
    /// its holders, in turn from round to round so that a dead holder does not hide
    /// the others ([`HeldElsewhere`]).
    async fn refresh_in_sync_once(&self) {
        let mut followed: BTreeMap<u64, BTreeMap<(String, u32), u64>> = BTreeMap::new();
        let groups: Vec<((String, u32), RaftGroup)> = lock(&self.groups)
            .iter()
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect();
        // The groups whose replica here is fail-stopped: their leader is asked of
        // the other replicas, as for a partition placed elsewhere.
        let mut stopped = BTreeSet::new();
        for (key, raft) in groups {
            if self.fail_stop(&key.0, key.1, &raft).await.is_some() {
                stopped.insert(key);
                continue;
            }
            let m = raft.metrics().borrow_watched().clone();
            if m.current_leader == Some(self.node_id()) {
                // Samples which followers hold every committed entry now.
                let placement = lock(&self.topics)
                    .get(&key.0)
                    .and_then(|r| r.replicas.get(key.1 as usize).cloned())
                    .unwrap_or_default();
                self.leader_in_sync(&key.0, key.1, &placement, &m);
            }
            match m.current_leader {
                Some(leader) if leader != self.node_id() => {
                    followed
                        .entry(leader)
                        .or_default()
                        .insert(key, m.current_term);
                }
                _ => {}
            }
        }
        let now = Instant::now();
        lock(&self.leaders_in_sync).retain(|_, k| now.duration_since(k.at) < IN_SYNC_FRESH);
        lock(&self.caught_up).retain(|_, at| now.duration_since(*at) < IN_SYNC_LAG);
        lock(&self.held_elsewhere).retain(|_, v| now.duration_since(v.at) < IN_SYNC_FRESH);
        let asked = self.elsewhere_to_ask(&stopped);
        let nodes: BTreeSet<u64> = followed.keys().chain(asked.keys()).copied().collect();
        for node in nodes {
            let wanted: BTreeSet<&(String, u32)> = followed
                .get(&node)
                .into_iter()
                .flat_map(BTreeMap::keys)
                .chain(asked.get(&node).into_iter().flatten())
                .collect();
            let Ok(filter) = serde_json::to_vec(&wanted) else {
                continue;
            };
            let Ok(answer) = self
                .call_within(node, "", 0, Rpc::Status, filter, IN_SYNC_REFRESH)
                .await
            else {
                // A leader that does not answer is not named any more: the next
                // round asks the holders, and refusals name a holder meanwhile.
                lock(&self.held_elsewhere).retain(|_, v| v.leader != node);
                continue;
            };
            let Ok(status) = serde_json::from_slice::<serde_json::Value>(&answer) else {
                continue;
            };
            if let Some(keys) = asked.get(&node) {
                self.heard_of_elsewhere(node, keys, &status);
            }
            let Some(groups) = followed.get(&node) else {
                continue;
            };
            let leader = node;
            let at = Instant::now();
            let mut known = lock(&self.leaders_in_sync);
            for p in status["partitions"].as_array().into_iter().flatten() {
                let Some((key, row_leader, term)) = held_row(p) else {
                    continue;
                };
                let Some(in_sync) = p["in_sync"].as_array() else {
                    continue;
                };
                if row_leader != leader || groups.get(&key) != Some(&term) {
                    continue;
                }
                let in_sync = in_sync
                    .iter()
                    .filter_map(serde_json::Value::as_u64)
                    .collect();
                known.insert(
                    key,
                    LeaderInSync {
                        leader,
                        term,
                        in_sync,
                        at,
                    },
                );
            }
        }
    }

    /// The partitions of replicated topics whose placement leaves this node out, and
    /// those of `stopped` (this node's replica is fail-stopped), by the node to ask
    /// about them: the leader last heard of while that is fresh, else one of the
    /// other holders, a different one each round.
    fn elsewhere_to_ask(
        &self,
        stopped: &BTreeSet<(String, u32)>,
    ) -> BTreeMap<u64, BTreeSet<(String, u32)>> {
        let me = self.node_id();
        let round = self
            .rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let leaders: BTreeMap<(String, u32), u64> = lock(&self.held_elsewhere)
            .iter()
            .map(|(k, v)| (k.clone(), v.leader))
            .collect();
        let mut asked: BTreeMap<u64, BTreeSet<(String, u32)>> = BTreeMap::new();
        let mut placements = lock(&self.topics).clone();
        for (topic, placement) in lock(&self.watched).iter() {
            placements
                .entry(topic.clone())
                .or_insert_with(|| placement.clone());
        }
        for (topic, placement) in &placements {
            for (partition, replicas) in (0u32..).zip(&placement.replicas) {
                let key = (topic.clone(), partition);
                if replicas.contains(&me) && !stopped.contains(&key) {
                    continue;
                }
                let others: Vec<u64> = replicas.iter().copied().filter(|n| *n != me).collect();
                if others.is_empty() {
                    continue;
                }
                let node = match leaders.get(&key) {
                    Some(l) if others.contains(l) => *l,
                    _ => others[(round + partition as usize) % others.len()],
                };
                asked.entry(node).or_default().insert(key);
            }
        }
        asked
    }

    /// Keeps what `node`'s status says of the partitions of `keys` (which it holds):
    /// their leader and term, and their in-sync replicas when `node` leads them.
    fn heard_of_elsewhere(
        &self,
        node: u64,
        keys: &BTreeSet<(String, u32)>,
        status: &serde_json::Value,
    ) {
        let at = Instant::now();
        let mut known = lock(&self.held_elsewhere);
        for p in status["partitions"].as_array().into_iter().flatten() {
            let Some((key, leader, term)) = held_row(p) else {
                continue;
            };
            if !keys.contains(&key) {
                continue;
            }
            let in_sync = (leader == node).then(|| {
                p["in_sync"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(serde_json::Value::as_u64)
                    .collect()
            });
            known.insert(
                key,
                HeldElsewhere {
                    leader,
                    term,
                    in_sync,
                    at,
                },
            );
        }
    }

    /// Creates a replicated topic on every node holding a replica, then forms each
    /// partition's group on its first replica and waits for its first leader.
    ///
    /// A topic that already exists is refused with TOPIC_EXISTS (naming what differs
    /// when the request asks for other partitions, replication factor or settings),
    /// unless the create finishes one an earlier create left half done: a node that
    /// did not answer stops a create before any group is formed (the groups need
    /// every replica), the error names the nodes that have the topic and asks for
    /// the same create again once that node answers, as `delete` and `alter` do.
    /// `Ok(true)` when this create finished such a topic.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        settings: Vec<String>,
        factor: u32,
    ) -> Result<bool, Refusal> {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        let replication = Replication::place(&ids, partitions, factor)
            .map_err(|e| (ErrorCode::INVALID_CONFIG, e.to_string()))?;
        // The settings are checked here first, so that no node creates anything for
        // a request every node would refuse.
        let config = settings_config(&settings)?;
        let req = CreateReplica {
            partitions,
            settings,
            replication: replication.clone(),
        };
        // This node's own copy of the topic, if any, refuses first what differs.
        self.existing(name, &req, &config)?;
        let payload = serde_json::to_vec(&req).map_err(|e| (ErrorCode::INTERNAL, e.to_string()))?;
        let holders: BTreeSet<u64> = replication.replicas.iter().flatten().copied().collect();
        let (mut created, mut existed, mut missing) = (Vec::new(), Vec::new(), Vec::new());
        for node in &holders {
            let answer = if *node == self.node_id() {
                self.create_replica(name, &payload).await
            } else {
                match self
                    .call(*node, name, 0, Rpc::CreateReplica, payload.clone())
                    .await
                {
                    Ok(answer) => Ok(created_answer(&answer)),
                    Err(e) => Err(e),
                }
            };
            match answer {
                Ok(true) => created.push(*node),
                Ok(false) => existed.push(*node),
                // A node that does not answer: the others still get the topic, so
                // that asking again needs that node only.
                Err((ErrorCode::PARTITION_UNAVAILABLE, msg)) => missing.push((*node, msg)),
                Err(e) => return Err(e),
            }
        }
        if !missing.is_empty() {
            let have = join_ids(created.iter().chain(&existed));
            let down = join_ids(missing.iter().map(|(n, _)| n));
            let why: Vec<&str> = missing.iter().map(|(_, m)| m.as_str()).collect();
            let state = if created.is_empty() {
                format!("topic {name} is on node(s) [{have}]; if it was not complete before")
            } else {
                format!("topic {name} is created on node(s) [{have}] only and")
            };
            return Err((
                ErrorCode::PARTITION_UNAVAILABLE,
                format!(
                    "{}; {state} its partitions have no leader until node(s) [{down}] have \
                     it: run the same `topics create` again once node(s) [{down}] answer",
                    why.join("; ")
                ),
            ));
        }
        let mut formed = false;
        for (p, replicas) in replication.replicas.iter().enumerate() {
            let Some(first) = replicas.first().copied() else {
                continue;
            };
            let members =
                serde_json::to_vec(replicas).map_err(|e| (ErrorCode::INTERNAL, e.to_string()))?;
            let now = if first == self.node_id() {
                self.initialize(name, p as u32, &members).await
            } else {
                self.call(first, name, p as u32, Rpc::Initialize, members)
                    .await
                    .map(|answer| created_answer(&answer))
            }
            .map_err(|(code, msg)| {
                (
                    code,
                    format!(
                        "{msg}; topic {name} is created on every node of [{}] but partition \
                         {p} has no leader yet: run the same `topics create` again",
                        join_ids(&holders)
                    ),
                )
            })?;
            formed |= now;
        }
        if created.is_empty() && !formed {
            return Err((
                ErrorCode::TOPIC_EXISTS,
                format!("topic {name:?} already exists"),
            ));
        }
        Ok(!existed.is_empty() || !formed)
    }

    /// Whether this node has the topic `req` would create: `Ok(false)` when it has
    /// not, `Ok(true)` when it has it as asked (a create left half done), else
    /// TOPIC_EXISTS naming what differs.
    fn existing(
        &self,
        name: &str,
        req: &CreateReplica,
        config: &TopicConfig,
    ) -> Result<bool, Refusal> {
        let exists = |detail: String| {
            Err((
                ErrorCode::TOPIC_EXISTS,
                format!("topic {name:?} already exists{detail}"),
            ))
        };
        let known = lock(&self.topics).get(name).cloned();
        let Some(known) = known else {
            if self.broker.has_topic(name) {
                return exists(" (not replicated)".into());
            }
            return Ok(false);
        };
        let mut differs = Vec::new();
        let have = known.replicas.len();
        if have != req.replication.replicas.len() {
            differs.push(format!(
                "{} (not {})",
                crate::engine::error::counted(have as u64, "partition", "partitions"),
                req.partitions
            ));
        }
        let (f, want) = (known.replication_factor, req.replication.replication_factor);
        if f != want {
            differs.push(format!("replication factor {f} (not {want})"));
        }
        if let Ok(now) = self.broker.topic_config(name) {
            let (now, asked) = (now.to_json(), config.to_json());
            for key in crate::format::topic::CONFIG_KEYS {
                if now[key] != asked[key] {
                    differs.push(format!("{key}={} (not {})", now[key], asked[key]));
                }
            }
        }
        if differs.is_empty() && known != req.replication {
            differs.push("another placement".into());
        }
        if differs.is_empty() {
            Ok(true)
        } else {
            exists(format!(" with {}", differs.join(", ")))
        }
    }

    /// Deletes a replicated topic on every node holding a replica: the others first,
    /// this node last, so that a delete that stops at an unreachable node can be asked
    /// again here (a node that no longer has the topic answers success).
    pub async fn delete_topic(&self, name: &str) -> Result<(), Refusal> {
        let replication = self.placement(name).await?;
        let holders: BTreeSet<u64> = replication.replicas.iter().flatten().copied().collect();
        for node in holders.iter().filter(|n| **n != self.node_id()) {
            self.call(*node, name, 0, Rpc::DeleteReplica, Vec::new())
                .await
                .map_err(|(code, msg)| {
                    (
                        code,
                        format!(
                            "{msg}; the topic is not deleted everywhere: ask again through \
                             node {} once node {node} answers",
                            self.node_id()
                        ),
                    )
                })?;
        }
        if holders.contains(&self.node_id()) {
            self.delete_replica(name).await?;
        }
        Ok(())
    }

    /// Changes settings of a replicated topic on every node holding a replica: this
    /// node first (it refuses what every node would), then the others; an alter that
    /// stops at an unreachable node can be asked again (it changes nothing twice).
    /// The cleanup policy stays as created: the topic's Raft groups keep or purge
    /// their logs by it.
    pub async fn alter_topic(
        &self,
        name: &str,
        settings: &[(String, String)],
    ) -> Result<TopicConfig, Refusal> {
        let replication = self.placement(name).await?;
        if settings.iter().any(|(k, _)| k == "cleanup_policy") {
            return Err((
                ErrorCode::INVALID_CONFIG,
                format!(
                    "cleanup_policy of replicated topic {name} stays as created (its Raft \
                     groups keep or purge their logs by it)"
                ),
            ));
        }
        let payload = serde_json::to_vec(settings)
            .map_err(|e| (ErrorCode::INTERNAL, format!("encoding the settings: {e}")))?;
        let holders: BTreeSet<u64> = replication.replicas.iter().flatten().copied().collect();
        // The first node altered refuses what every node would: this node when it
        // holds a replica, else the first holder.
        let mut altered = Vec::new();
        let mut config = None;
        if holders.contains(&self.node_id()) {
            config = Some(self.alter_replica(name, settings).await?);
            altered.push(self.node_id().to_string());
        }
        for node in holders.iter().filter(|n| **n != self.node_id()) {
            let answer = self
                .call(*node, name, 0, Rpc::AlterReplica, payload.clone())
                .await
                .map_err(|(code, msg)| {
                    let altered = altered.join(", ");
                    (
                        code,
                        format!(
                            "{msg}; the topic is altered on node(s) [{altered}] only: ask \
                             again once node {node} answers"
                        ),
                    )
                })?;
            if config.is_none() {
                config = Some(config_answer(&answer).map_err(|e| {
                    (
                        ErrorCode::INTERNAL,
                        format!("{name}: node {node} answered the alter with {e}"),
                    )
                })?);
            }
            altered.push(node.to_string());
        }
        config.ok_or_else(|| (ErrorCode::INTERNAL, format!("{name}: no replica to alter")))
    }

    /// The placement of a replicated topic: this node's when it holds a replica, else
    /// the first other node's that does (peer call `Placement`). A node that does not
    /// answer within [`PLACEMENT_WAIT`] is named when no node that answered holds it.
    async fn placement(&self, name: &str) -> Result<Replication, Refusal> {
        if let Some(r) = lock(&self.topics).get(name).cloned() {
            return Ok(r);
        }
        let mut silent = Vec::new();
        for node in self.nodes.keys().filter(|n| **n != self.node_id()) {
            let Ok(answer) = self
                .call_within(*node, name, 0, Rpc::Placement, Vec::new(), PLACEMENT_WAIT)
                .await
            else {
                silent.push(node.to_string());
                continue;
            };
            match placement_answer(&answer) {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => {
                    return Err((
                        ErrorCode::INTERNAL,
                        format!("{name}: node {node} answered its placement with {e}"),
                    ))
                }
            }
        }
        let msg = if silent.is_empty() {
            format!("unknown topic {name}")
        } else {
            format!(
                "unknown topic {name} (node(s) [{}] did not answer and may hold it)",
                silent.join(", ")
            )
        };
        Err((ErrorCode::UNKNOWN_TOPIC, msg))
    }

    /// For a topic this node holds no replica of: per partition asked, a refusal
    /// that sends the client to a node holding one (NOT_LEADER naming it, or
    /// UNKNOWN_PARTITION past the topic's partitions). `None` when no node that
    /// answered holds the topic: the request is then answered as for any unknown
    /// topic.
    async fn elsewhere(&self, topic: &str, partitions: &[u32]) -> Option<Vec<Refusal>> {
        let placement = self.placement(topic).await.ok()?;
        Some(
            partitions
                .iter()
                .map(|&p| self.sent_to_holder(topic, p, &placement))
                .collect(),
        )
    }

    /// See [`Replicator::offsets_elsewhere`].
    async fn offsets_elsewhere(
        &self,
        topic: &str,
        partition: u32,
    ) -> Option<Result<(u64, u64), Refusal>> {
        // A replica fail-stopped here cannot answer (its data partition may have
        // failed): like a node holding none, it asks the leader.
        let stopped = match self.group(topic, partition) {
            Some(raft) => {
                let m = raft.metrics().borrow_watched().clone();
                self.replica_failure(topic, partition, &m)?;
                true
            }
            None => false,
        };
        let replicas = lock(&self.topics)
            .get(topic)?
            .replicas
            .get(partition as usize)?
            .clone();
        if replicas.contains(&self.node_id()) && !stopped {
            return None;
        }
        let known = self.leader_elsewhere(topic, partition);
        let mut asked = Vec::new();
        for node in known.into_iter().chain(replicas) {
            if asked.contains(&node) || node == self.node_id() {
                continue;
            }
            asked.push(node);
            let Ok(answer) = self
                .call_within(
                    node,
                    topic,
                    partition,
                    Rpc::Offsets,
                    Vec::new(),
                    PLACEMENT_WAIT,
                )
                .await
            else {
                continue;
            };
            if let Ok([start, end]) = serde_json::from_slice::<[u64; 2]>(&answer) {
                return Some(Ok((start, end)));
            }
        }
        if stopped {
            let why = self.group(topic, partition).and_then(|raft| {
                let m = raft.metrics().borrow_watched().clone();
                self.replica_failure(topic, partition, &m)
            });
            let why = why.unwrap_or_else(|| "it failed".into());
            return Some(Err(self.stopped(topic, partition, &why)));
        }
        Some(Err(self.no_group(topic, partition)))
    }

    /// The refusal of [`Manager::elsewhere`] for one partition.
    fn sent_to_holder(&self, topic: &str, partition: u32, placement: &Replication) -> Refusal {
        let Some(replicas) = placement.replicas.get(partition as usize) else {
            return (
                ErrorCode::UNKNOWN_PARTITION,
                format!(
                    "topic {topic} has {}; there is no partition {partition}",
                    crate::engine::error::counted(
                        placement.replicas.len() as u64,
                        "partition",
                        "partitions"
                    )
                ),
            );
        };
        // A holder that is not the leader names the leader in turn. One this node
        // reaches and that answers comes first: a client sent to a dead or paused
        // node only comes back.
        let reachable = |n: &u64| self.peers.peers.get(n).is_some_and(|p| p.answering());
        let others: Vec<u64> = replicas
            .iter()
            .copied()
            .filter(|n| *n != self.node_id())
            .collect();
        let holder = others
            .iter()
            .filter(|n| reachable(n))
            .chain(others.iter().filter(|n| !reachable(n)))
            .find_map(|n| self.peers.client_addr(*n).map(|a| (*n, a)));
        let held_by = replicas
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let msg = not_leader_message(
            topic,
            partition,
            holder.as_ref().map(|(n, a)| (*n, a.as_str())),
        );
        (
            ErrorCode::NOT_LEADER,
            format!(
                "node {} holds no replica (nodes [{held_by}] do); {msg}",
                self.node_id()
            ),
        )
    }

    /// Changes settings of this node's replica of a topic.
    async fn alter_replica(
        &self,
        name: &str,
        settings: &[(String, String)],
    ) -> Result<TopicConfig, Refusal> {
        let _admin = self.admin.lock().await;
        if !lock(&self.topics).contains_key(name) {
            return Err((ErrorCode::UNKNOWN_TOPIC, format!("unknown topic {name}")));
        }
        let broker = Arc::clone(&self.broker);
        let n = name.to_string();
        let settings = settings.to_vec();
        tokio::task::spawn_blocking(move || broker.alter_topic(&n, &settings))
            .await
            .map_err(|e| (ErrorCode::INTERNAL, e.to_string()))?
            .map_err(crate::engine::net::dispatch::engine_error)
    }

    /// Deletes this node's replica of a topic: stops its groups, deletes the topic
    /// (data partitions, checkpoints, placement), then its Raft logs. A topic this
    /// node does not know is no error (deleted already).
    async fn delete_replica(&self, name: &str) -> Result<(), Refusal> {
        let _admin = self.admin.lock().await;
        lock(&self.closed).retain(|(t, _), _| t != name);
        if lock(&self.topics).remove(name).is_none() {
            return Ok(());
        }
        let groups: Vec<RaftGroup> = {
            let mut groups = lock(&self.groups);
            let keys: Vec<(String, u32)> =
                groups.keys().filter(|(t, _)| t == name).cloned().collect();
            keys.iter().filter_map(|k| groups.remove(k)).collect()
        };
        for g in groups {
            let _ = g.shutdown().await;
        }
        let broker = Arc::clone(&self.broker);
        let n = name.to_string();
        tokio::task::spawn_blocking(move || {
            // The placement goes with the topic directory first: after a crash
            // between the two steps, what is left is a Raft directory of no topic,
            // which a new topic of the same name removes before it starts.
            broker
                .delete_topic(&n)
                .map_err(|e| (ErrorCode::STORAGE, e.to_string()))?;
            remove_raft_dir(&broker, &n).map_err(|e| (ErrorCode::STORAGE, e.to_string()))
        })
        .await
        .map_err(|e| (ErrorCode::INTERNAL, e.to_string()))?
    }

    async fn call(
        &self,
        node: u64,
        topic: &str,
        partition: u32,
        rpc: Rpc,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, Refusal> {
        self.call_within(node, topic, partition, rpc, payload, CALL_TIMEOUT)
            .await
    }

    /// The same call to every peer at once (a peer not connected is waited for up to
    /// [`PLACEMENT_WAIT`]): each peer's id with its answer.
    async fn call_every_peer(
        &self,
        topic: &str,
        rpc: Rpc,
        payload: &[u8],
    ) -> Vec<(u64, Result<Vec<u8>, Refusal>)> {
        let peers: Vec<u64> = self
            .nodes
            .keys()
            .copied()
            .filter(|&n| n != self.node_id())
            .collect();
        let answers =
            futures_util::future::join_all(peers.iter().map(|&node| {
                self.call_within(node, topic, 0, rpc, payload.to_vec(), PLACEMENT_WAIT)
            }))
            .await;
        peers.into_iter().zip(answers).collect()
    }

    /// [`Manager::call`], a peer not connected waited for up to `wait`.
    async fn call_within(
        &self,
        node: u64,
        topic: &str,
        partition: u32,
        rpc: Rpc,
        payload: Vec<u8>,
        wait: Duration,
    ) -> Result<Vec<u8>, Refusal> {
        let Some(peer) = self.peers.peers.get(&node) else {
            return Err((ErrorCode::INTERNAL, format!("node {node} is not a peer")));
        };
        // A peer not connected yet (a cluster just started, a connection being
        // redialled) is waited for up to `wait`: these admin calls are idempotent,
        // so asking again is safe.
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match peer
                .call(topic, partition, rpc, payload.clone(), wait)
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(CallError::Unreachable(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(UNREACHABLE_RETRY).await;
                }
                Err(e) => {
                    return Err((
                        ErrorCode::PARTITION_UNAVAILABLE,
                        format!("{topic}: asking node {node}: {e}"),
                    ))
                }
            }
        }
    }

    /// Creates this node's replica of a topic and opens its groups: `Ok(true)` when
    /// created now, `Ok(false)` when it was there as asked (an earlier create left
    /// half done); a topic of that name with other settings is refused
    /// ([`Manager::existing`]).
    async fn create_replica(&self, name: &str, payload: &[u8]) -> Result<bool, Refusal> {
        self.create_replica_seeded(name, payload, None).await
    }

    /// [`Manager::create_replica`]; when it creates the topic and `votes` are given,
    /// each group of this node starts from its partition's vote ([`rejoin`]).
    async fn create_replica_seeded(
        &self,
        name: &str,
        payload: &[u8],
        votes: Option<Vec<Option<super::types::Vote>>>,
    ) -> Result<bool, Refusal> {
        let req: CreateReplica = serde_json::from_slice(payload)
            .map_err(|e| (ErrorCode::INVALID_REQUEST, format!("bad create: {e}")))?;
        let _admin = self.admin.lock().await;
        let config = settings_config(&req.settings)?;
        let bytes = req.replication.encode();
        let created = !self.existing(name, &req, &config)?;
        if created {
            let broker = Arc::clone(&self.broker);
            let broker_node = self.node_id();
            let n = name.to_string();
            tokio::task::spawn_blocking(move || {
                // Raft logs of an earlier topic of this name whose delete was
                // cut short never serve the new one.
                if broker.partition_count(&n).is_err() {
                    remove_raft_dir(&broker, &n)?;
                }
                let me = broker_node;
                for (p, vote) in votes.iter().flatten().enumerate() {
                    let placed = req
                        .replication
                        .replicas
                        .get(p)
                        .is_some_and(|r| r.contains(&me));
                    if let (true, Some(vote)) = (placed, vote) {
                        rejoin::seed_vote(&broker, &n, p as u32, vote).map_err(|e| {
                            crate::engine::error::EngineError::io(
                                format!("writing the first vote of {n}/{p}'s Raft log"),
                                e,
                            )
                        })?;
                    }
                }
                broker.create_topic_with(
                    &n,
                    req.partitions,
                    config,
                    Some((REPLICATION_FILE, &bytes)),
                )
            })
            .await
            .map_err(|e| (ErrorCode::INTERNAL, e.to_string()))?
            .map_err(crate::engine::net::dispatch::engine_error)?;
        }
        // A partition waiting for records (a topic this node held at its start) is
        // opened by the repair its start began.
        let _waiting = self
            .open_topic(name)
            .await
            .map_err(|e| (ErrorCode::STORAGE, e.to_string()))?;
        Ok(created)
    }

    /// Forms the partition's group (every replica a voter) unless it is formed
    /// already, and waits for its first leader: `Ok(true)` when formed now.
    async fn initialize(
        &self,
        topic: &str,
        partition: u32,
        payload: &[u8],
    ) -> Result<bool, Refusal> {
        let ids: Vec<u64> = serde_json::from_slice(payload)
            .map_err(|e| (ErrorCode::INVALID_REQUEST, format!("bad members: {e}")))?;
        let Some(raft) = self.group(topic, partition) else {
            return Err(self.not_leader(topic, partition, None));
        };
        let members: BTreeMap<u64, BasicNode> = ids
            .iter()
            .map(|id| {
                let addr = self.nodes.get(id).cloned().unwrap_or_default();
                (*id, BasicNode { addr })
            })
            .collect();
        let formed = match raft.initialize(members).await {
            Ok(()) => true,
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => false,
            Err(e) => return Err((ErrorCode::INTERNAL, e.to_string())),
        };
        raft.wait(Some(FIRST_LEADER_TIMEOUT))
            .metrics(|m| m.current_leader.is_some(), "a first leader")
            .await
            .map_err(|e| {
                (
                    ErrorCode::PARTITION_UNAVAILABLE,
                    format!("{topic}/{partition}: {e}"),
                )
            })?;
        Ok(formed)
    }

    /// This node's view of the cluster, as `cluster status --json` prints it.
    pub fn status(&self) -> serde_json::Value {
        self.status_of(None)
    }

    /// [`Manager::status`] with only the partitions of `only` when given (the rows
    /// of groups this node runs; no `held: false` rows), as peer call `Status` with
    /// a payload asks: a node refreshing what it knows needs a few partitions, not
    /// every group of the node.
    fn status_of(&self, only: Option<&BTreeSet<(String, u32)>>) -> serde_json::Value {
        // `addr` and `alive` are the contract's names (the node's `--peers` address
        // and whether it answers); `raft_addr` and `reachable` say the same.
        let own_raft = self.nodes.get(&self.node_id()).cloned().unwrap_or_default();
        let mut nodes = vec![serde_json::json!({
            "id": self.node_id(),
            "addr": own_raft,
            "alive": true,
            "raft_addr": own_raft,
            "client_addr": self.peers.ident.client_addr,
            "reachable": true,
        })];
        for p in self.peers.peers.values() {
            // Connected and answering: a paused node keeps its connections open.
            let reachable = p.answering();
            nodes.push(serde_json::json!({
                "id": p.id,
                "addr": p.raft_addr,
                "alive": reachable,
                "raft_addr": p.raft_addr,
                "client_addr": self.peers.client_addr(p.id),
                "reachable": reachable,
            }));
        }
        nodes.sort_by_key(|n| n["id"].as_u64());
        let groups: Vec<((String, u32), RaftGroup)> = lock(&self.groups)
            .iter()
            .filter(|(k, _)| only.is_none_or(|o| o.contains(*k)))
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect();
        let partitions: Vec<serde_json::Value> = groups
            .into_iter()
            .map(|((topic, partition), raft)| {
                let m = raft.metrics().borrow_watched().clone();
                if let Some(why) = self.replica_failure(&topic, partition, &m) {
                    // Fail-stopped: its last metrics may name this node leader; the
                    // row names the leader the others name instead, and why.
                    let known = lock(&self.held_elsewhere)
                        .get(&(topic.clone(), partition))
                        .filter(|v| v.at.elapsed() < IN_SYNC_FRESH)
                        .filter(|v| v.leader != self.node_id())
                        .map(|v| (v.leader, v.term));
                    return serde_json::json!({
                        "topic": topic,
                        "partition": partition,
                        "held": true,
                        "leader": known.map(|(l, _)| l),
                        "term": known.map_or(m.current_term, |(_, t)| t.max(m.current_term)),
                        "commit_index": m.local_committed.as_ref().map_or(0, |l| l.index),
                        "applied_index": m.last_applied.as_ref().map_or(0, |l| l.index),
                        "replicas": [],
                        "in_sync": null,
                        "failed": why,
                    });
                }
                let placement = lock(&self.topics)
                    .get(&topic)
                    .and_then(|r| r.replicas.get(partition as usize).cloned())
                    .unwrap_or_default();
                let in_sync = self.leader_in_sync(&topic, partition, &placement, &m);
                let last = m.last_log_index.unwrap_or(0);
                let replicas: Vec<serde_json::Value> = m
                    .replication
                    .iter()
                    .flatten()
                    .map(|(node, matched)| {
                        let matched = matched.as_ref().map_or(0, |l| l.index);
                        serde_json::json!({
                            "node": node,
                            "match_index": matched,
                            "lag": last.saturating_sub(matched),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "topic": topic,
                    "partition": partition,
                    "held": true,
                    "leader": m.current_leader,
                    "term": m.current_term,
                    "commit_index": m.local_committed.as_ref().map_or(0, |l| l.index),
                    "applied_index": m.last_applied.as_ref().map_or(0, |l| l.index),
                    "replicas": replicas,
                    "in_sync": in_sync,
                    "failed": null,
                })
            })
            .collect();
        // Replicas this node holds whose groups are not open.
        let mut partitions = partitions;
        let closed: Vec<((String, u32), String)> = lock(&self.closed)
            .iter()
            .filter(|(k, _)| only.is_none_or(|o| o.contains(*k)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((topic, partition), why) in closed {
            let known = lock(&self.held_elsewhere)
                .get(&(topic.clone(), partition))
                .filter(|v| v.at.elapsed() < IN_SYNC_FRESH)
                .map(|v| (v.leader, v.term));
            partitions.push(serde_json::json!({
                "topic": topic,
                "partition": partition,
                "held": true,
                "leader": known.map(|(l, _)| l),
                "term": known.map(|(_, t)| t),
                "commit_index": null,
                "applied_index": null,
                "replicas": [],
                "in_sync": null,
                "failed": null,
                "closed": why,
            }));
        }
        // Partitions placed on other nodes only, as a holder last told.
        // (A fail-stopped replica's partition is known the same way; its row is above.)
        let mut held: BTreeSet<(String, u32)> = lock(&self.groups).keys().cloned().collect();
        held.extend(lock(&self.closed).keys().cloned());
        let elsewhere: Vec<((String, u32), HeldElsewhere)> = lock(&self.held_elsewhere)
            .iter()
            .filter(|(k, v)| only.is_none() && v.at.elapsed() < IN_SYNC_FRESH && !held.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((topic, partition), v) in elsewhere {
            partitions.push(serde_json::json!({
                "topic": topic,
                "partition": partition,
                "held": false,
                "leader": v.leader,
                "term": v.term,
                "commit_index": null,
                "applied_index": null,
                "replicas": [],
                "in_sync": null,
                "failed": null,
            }));
        }
        partitions.sort_by(|a, b| {
            (a["topic"].as_str(), a["partition"].as_u64())
                .cmp(&(b["topic"].as_str(), b["partition"].as_u64()))
        });
        serde_json::json!({
            "cluster_id": self.peers.ident.cluster_id(),
            "node_id": self.node_id(),
            "standalone": false,
            "nodes": nodes,
            "partitions": partitions,
        })
    }

    async fn answer(
        &self,
        topic: &str,
        partition: u32,
        rpc: Rpc,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        fn json<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
            serde_json::to_vec(v).map_err(|e| e.to_string())
        }
        let group = || {
            self.group(topic, partition)
                .ok_or_else(|| format!("no Raft group {topic}/{partition} on this node"))
        };
        match rpc {
            Rpc::AppendEntries => {
                let req = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
                json(
                    &group()?
                        .append_entries(req)
                        .await
                        .map_err(|e| e.to_string())?,
                )
            }
            Rpc::AppendEntriesBinary | Rpc::AppendStream => {
                let req = decode_append_request(payload).map_err(|e| e.to_string())?;
                let resp = group()?
                    .append_entries(req)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(encode_append_reply(&resp))
            }
            Rpc::Vote => {
                let req = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
                json(&group()?.vote(req).await.map_err(|e| e.to_string())?)
            }
            Rpc::PreVote => {
                let req = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
                json(&group()?.pre_vote(req).await.map_err(|e| e.to_string())?)
            }
            Rpc::CreateReplica => {
                let created = self
                    .create_replica(topic, payload)
                    .await
                    .map_err(|(_, m)| m)?;
                json(&created)
            }
            Rpc::AlterReplica => {
                let settings: Vec<(String, String)> =
                    serde_json::from_slice(payload).map_err(|e| format!("bad alter: {e}"))?;
                let config = self
                    .alter_replica(topic, &settings)
                    .await
                    .map_err(|(_, m)| m)?;
                json(&config.to_json())
            }
            Rpc::DeleteReplica => {
                self.delete_replica(topic).await.map_err(|(_, m)| m)?;
                Ok(b"null".to_vec())
            }
            Rpc::Initialize => {
                let formed = self
                    .initialize(topic, partition, payload)
                    .await
                    .map_err(|(_, m)| m)?;
                json(&formed)
            }
            Rpc::Status => {
                // A payload (JSON `[[topic, partition], ...]`) narrows the answer.
                let only: Option<BTreeSet<(String, u32)>> = if payload.is_empty() {
                    None
                } else {
                    Some(
                        serde_json::from_slice(payload)
                            .map_err(|e| format!("bad status filter: {e}"))?,
                    )
                };
                json(&self.status_of(only.as_ref()))
            }
            Rpc::Offsets => {
                self.check_leader(topic, partition).map_err(|(_, m)| m)?;
                self.broker
                    .settle(topic, partition)
                    .await
                    .map_err(|e| e.to_string())?;
                let (start, end) = self
                    .broker
                    .offsets(topic, partition)
                    .map_err(|e| e.to_string())?;
                json(&[start, end])
            }
            Rpc::Schemas => self.take_schemas(payload).await,
            Rpc::Keys => self.take_key(payload).await,
            Rpc::Replicas => {
                let asker: u64 =
                    serde_json::from_slice(payload).map_err(|e| format!("bad node id: {e}"))?;
                self.offers_for(asker).await
            }
            Rpc::Placement => Ok(lock(&self.topics)
                .get(topic)
                .map_or_else(|| b"null".to_vec(), Replication::encode)),
            Rpc::SnapshotBegin => self.snapshot_begin(topic, partition, payload),
            Rpc::SnapshotChunk => self.snapshot_chunk(topic, partition, payload),
            Rpc::SnapshotInstall => self.snapshot_install(topic, partition, payload).await,
            Rpc::Records => self.records_for_peer(topic, partition, payload).await,
            Rpc::Checkpoint => self.checkpoint_for_peer(topic, partition),
        }
    }
}

/// A peer's answer to `Placement`: its placement of the topic, or `None` (`null`).
fn placement_answer(answer: &[u8]) -> Result<Option<Replication>, String> {
    if answer == b"null" {
        return Ok(None);
    }
    if answer.len() > crate::format::replication::REPLICATION_FILE_BYTES_MAX {
        return Err(format!(
            "{} bytes, more than a placement holds",
            answer.len()
        ));
    }
    let parsed: Replication = serde_json::from_slice(answer).map_err(|e| e.to_string())?;
    let partitions = u32::try_from(parsed.replicas.len()).map_err(|e| e.to_string())?;
    Replication::decode(answer, partitions)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// A peer's answer to `CreateReplica` (created now) or `Initialize` (formed now):
/// `true` or `false`; an older node's `null` counts as `true`.
fn created_answer(answer: &[u8]) -> bool {
    serde_json::from_slice::<bool>(answer).unwrap_or(true)
}

/// Node ids as `1, 2`.
fn join_ids<'a>(ids: impl IntoIterator<Item = &'a u64>) -> String {
    ids.into_iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A peer's answer to `AlterReplica`: the topic's configuration after.
fn config_answer(answer: &[u8]) -> Result<TopicConfig, String> {
    let v: serde_json::Value = serde_json::from_slice(answer).map_err(|e| e.to_string())?;
    TopicConfig::from_json(&v).map_err(|e| e.to_string())
}

/// The topic configuration `KEY=VALUE` settings give.
/// Removes `DATA/raft/<topic>/` and makes that durable (the directory is gone,
/// then `DATA/raft/` is fsynced); no error when there is none.
fn remove_raft_dir(broker: &Broker, topic: &str) -> Result<(), crate::engine::error::EngineError> {
    use crate::engine::error::EngineError;
    let parent = broker.data_dir().join(super::node::RAFT_DIR);
    let dir = parent.join(topic);
    if !dir.exists() {
        return Ok(());
    }
    let s = &**broker.storage();
    s.remove_dir_all(&dir)
        .map_err(|e| EngineError::io(format!("removing the Raft logs {}", dir.display()), e))?;
    s.sync_dir(&parent)
        .map_err(|e| EngineError::io(format!("syncing {}", parent.display()), e))
}

fn settings_config(settings: &[String]) -> Result<TopicConfig, Refusal> {
    let mut config = TopicConfig::default();
    for s in settings {
        config
            .set_pair(s)
            .map_err(|e| (ErrorCode::INVALID_CONFIG, e.to_string()))?;
    }
    Ok(config)
}

impl<L: LogStores> CallHandler for Manager<L> {
    async fn handle(
        self: Arc<Self>,
        from: u64,
        topic: String,
        partition: u32,
        rpc: Rpc,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        // What a peer changes on this node is logged with who asked, so a replica
        // that appears or goes is explained in this node's log.
        let asked = match rpc {
            Rpc::CreateReplica => Some("create this node's replica of the topic"),
            Rpc::DeleteReplica => Some("delete this node's replica of the topic"),
            Rpc::AlterReplica => Some("change the configuration of this node's replica"),
            Rpc::Initialize => Some("form the partition's Raft group"),
            _ => None,
        };
        let shown = || crate::format::wire::raft::peer_text(&topic);
        if let Some(what) = asked {
            tracing::info!(node = from, topic = %shown(), partition, "a peer asks to {what}");
        }
        let answer = self.answer(&topic, partition, rpc, &payload).await;
        if let (Some(what), Err(e)) = (asked, &answer) {
            tracing::warn!(node = from, topic = %shown(), partition, error = %e, "refused a peer's request to {what}");
        }
        answer
    }

    fn append_stream(
        &self,
        topic: &str,
        partition: u32,
        input: BoxStream<'static, AppendEntriesRequest<TypeConfig>>,
    ) -> Option<AppendAnswers> {
        use futures_util::StreamExt;
        let answers = self
            .group(topic, partition)?
            .stream_append(input)
            .map(|r| r.map_err(|stopped| stopped.to_string()));
        Some(Box::pin(answers))
    }
}

impl<L: LogStores> Replicator for Manager<L> {
    fn node_id(&self) -> u64 {
        Manager::node_id(self)
    }

    fn closed_replicas(&self) -> usize {
        lock(&self.closed).len()
    }

    fn coordinator(&self) -> Option<u64> {
        if self.broker.groups().coordinating() {
            return Some(Manager::node_id(self));
        }
        self.leader_of(crate::engine::groups::OFFSETS_TOPIC, 0)
            .map(|(id, _)| id)
            .or_else(|| self.leader_elsewhere(crate::engine::groups::OFFSETS_TOPIC, 0))
    }

    fn share_key(self: Arc<Self>, change: super::KeyChange) -> BoxFuture<super::KeyShared> {
        Box::pin(async move { self.send_key(&change).await })
    }

    fn share_schemas(self: Arc<Self>, topic: String) -> BoxFuture<Result<(), Refusal>> {
        Box::pin(async move { self.send_schemas(&topic).await })
    }

    fn is_replicated(&self, topic: &str) -> bool {
        lock(&self.topics).contains_key(topic)
    }

    fn produce(
        self: Arc<Self>,
        topic: String,
        partition: u32,
        entry: ProduceEntry,
    ) -> BoxFuture<Result<(u64, u64), Refusal>> {
        Box::pin(async move {
            groups::clients_may_write(&topic)?;
            Manager::produce(&self, &topic, partition, entry).await
        })
    }

    fn submit(
        self: Arc<Self>,
        topic: String,
        partition: u32,
        entry: ProduceEntry,
    ) -> BoxFuture<Result<Applied, Refusal>> {
        if let Err(e) = groups::clients_may_write(&topic) {
            return Box::pin(async move { Err(e) });
        }
        Box::pin(Manager::submit(self, topic, partition, entry))
    }

    fn check_leader(&self, topic: &str, partition: u32) -> Result<(), Refusal> {
        Manager::check_leader(self, topic, partition)
    }

    fn leader_of(&self, topic: &str, partition: u32) -> Option<(u64, Option<String>)> {
        Manager::leader_of(self, topic, partition)
    }

    fn create_topic(
        self: Arc<Self>,
        name: String,
        partitions: u32,
        settings: Vec<String>,
        factor: u32,
    ) -> BoxFuture<Result<(), Refusal>> {
        Box::pin(async move {
            let finished =
                Manager::create_topic(&self, &name, partitions, settings, factor).await?;
            if finished {
                tracing::info!(
                    topic = name,
                    "finished creating a topic an earlier create left half done"
                );
            }
            Ok(())
        })
    }

    fn delete_topic(self: Arc<Self>, name: String) -> BoxFuture<Result<(), Refusal>> {
        Box::pin(async move {
            groups::clients_may_write(&name)?;
            Manager::delete_topic(&self, &name).await
        })
    }

    fn offsets_elsewhere(
        self: Arc<Self>,
        topic: String,
        partition: u32,
    ) -> BoxFuture<Option<Result<(u64, u64), Refusal>>> {
        Box::pin(async move { Manager::offsets_elsewhere(&self, &topic, partition).await })
    }

    fn elsewhere(
        self: Arc<Self>,
        topic: String,
        partitions: Vec<u32>,
    ) -> BoxFuture<Option<Vec<Refusal>>> {
        Box::pin(async move { Manager::elsewhere(&self, &topic, &partitions).await })
    }

    fn alter_topic(
        self: Arc<Self>,
        name: String,
        settings: Vec<(String, String)>,
    ) -> BoxFuture<Result<TopicConfig, Refusal>> {
        Box::pin(async move { Manager::alter_topic(&self, &name, &settings).await })
    }

    fn status(&self) -> serde_json::Value {
        Manager::status(self)
    }

    fn nodes(&self) -> usize {
        self.nodes.len()
    }

    fn kafka_nodes(&self) -> Vec<(u64, String)> {
        Manager::kafka_nodes(self)
    }

    fn partition_view(&self, topic: &str, partition: u32) -> Option<PartitionView> {
        Manager::partition_view(self, topic, partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(leader: u64, term: u64, at: Instant) -> LeaderInSync {
        LeaderInSync {
            leader,
            term,
            in_sync: vec![2, 3],
            at,
        }
    }

    #[test]
    fn a_follower_names_the_leaders_fresh_answer_else_the_leader_alone() {
        let now = Instant::now();
        let fresh = known(2, 7, now);
        // The leader's answer, while fresh and for the same leader and term.
        assert_eq!(follower_in_sync(Some(&fresh), Some(2), 7, now), vec![2, 3]);
        let later = now + IN_SYNC_FRESH - Duration::from_millis(1);
        assert_eq!(
            follower_in_sync(Some(&fresh), Some(2), 7, later),
            vec![2, 3]
        );
        // Too old, another term or another leader: the leader alone.
        let stale = now + IN_SYNC_FRESH;
        assert_eq!(follower_in_sync(Some(&fresh), Some(2), 7, stale), vec![2]);
        assert_eq!(follower_in_sync(Some(&fresh), Some(2), 8, now), vec![2]);
        assert_eq!(follower_in_sync(Some(&fresh), Some(3), 7, now), vec![3]);
        // No answer yet: the leader alone; no leader known: none.
        assert_eq!(follower_in_sync(None, Some(2), 7, now), vec![2]);
        assert!(follower_in_sync(Some(&fresh), None, 7, now).is_empty());
    }
}
