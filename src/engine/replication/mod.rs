//! Replication: one Raft group (openraft) per replicated partition.
//!
//! [`log_store`] keeps each group's Raft log on disk in the segment format, so the
//! offline tools read it like any partition. [`types`] fixes openraft's type
//! configuration and the entry payload (one produce request); [`state_machine`]
//! applies committed entries to the data partition; [`network`] carries the groups'
//! RPCs between nodes; [`manager`] runs the groups of this node.

pub mod log_store;
pub mod manager;
pub mod node;

pub use node::start;
pub mod network;
pub mod peer_tls;
pub mod secret;
pub mod snapshot;
pub mod state_machine;
pub mod types;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::format::wire::ErrorCode;

/// A refusal as the protocol carries it: the error code and its message.
pub type Refusal = (ErrorCode, String);
/// A boxed future the request path awaits.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
/// A produce's offsets once its entry is applied, or why not.
pub type Applied = BoxFuture<Result<(u64, u64), Refusal>>;

/// What the request path asks of replication (implemented by [`manager::Manager`]);
/// a node without `--peers` has none, and serves every topic locally as before.
pub trait Replicator: Send + Sync + 'static {
    /// This node's id.
    fn node_id(&self) -> u64;
    /// Whether the topic is replicated (its requests go through [`Replicator`]).
    fn is_replicated(&self, topic: &str) -> bool;
    /// One produce request's records as one Raft entry; the offsets once applied.
    fn produce(
        self: Arc<Self>,
        topic: String,
        partition: u32,
        entry: types::ProduceEntry,
    ) -> BoxFuture<Result<(u64, u64), Refusal>>;
    /// [`Replicator::produce`] in two steps, for a connection that pipelines: once
    /// the outer future is ready the entry is queued behind every entry submitted
    /// before it; the inner future ends with its offsets once it is applied.
    fn submit(
        self: Arc<Self>,
        topic: String,
        partition: u32,
        entry: types::ProduceEntry,
    ) -> BoxFuture<Result<Applied, Refusal>>;
    /// `Ok` when this node leads the partition (reads are served by the leader).
    fn check_leader(&self, topic: &str, partition: u32) -> Result<(), Refusal>;
    /// The partition's leader as this node knows it, with its client address.
    fn leader_of(&self, topic: &str, partition: u32) -> Option<(u64, Option<String>)>;
    /// Creates a replicated topic across the cluster.
    fn create_topic(
        self: Arc<Self>,
        name: String,
        partitions: u32,
        settings: Vec<String>,
        factor: u32,
    ) -> BoxFuture<Result<(), Refusal>>;
    /// Deletes a replicated topic on every node holding a replica (this node last);
    /// a node holding none asks the others where it is.
    fn delete_topic(self: Arc<Self>, name: String) -> BoxFuture<Result<(), Refusal>>;
    /// For a topic this node holds no replica of (nor any local topic of that name):
    /// per partition asked, the refusal that sends a client to a node holding one
    /// (NOT_LEADER naming it, which names the leader in turn when it does not lead);
    /// `None` when no node that answered holds the topic.
    /// For a partition of a replicated topic whose placement leaves this node out:
    /// its start and end offsets as its leader answers them (the leader last heard
    /// of, else each holder in turn), or the NOT_LEADER refusal naming where it is
    /// when none answers. `None` when this node holds a replica (or the topic is not
    /// replicated here): the local partition answers.
    fn offsets_elsewhere(
        self: Arc<Self>,
        _topic: String,
        _partition: u32,
    ) -> BoxFuture<Option<Result<(u64, u64), Refusal>>> {
        Box::pin(async { None })
    }
    fn elsewhere(
        self: Arc<Self>,
        topic: String,
        partitions: Vec<u32>,
    ) -> BoxFuture<Option<Vec<Refusal>>>;
    /// Changes settings of a replicated topic on every node holding a replica (this
    /// node first, when it holds one; a node holding none asks the others where it
    /// is); the topic's configuration after.
    fn alter_topic(
        self: Arc<Self>,
        name: String,
        settings: Vec<(String, String)>,
    ) -> BoxFuture<Result<crate::format::topic::TopicConfig, Refusal>>;
    /// After a `schemas register` or `delete` of `topic` on this node: the same
    /// schemas on every other node (each node checks the produce it leads).
    fn share_schemas(self: Arc<Self>, _topic: String) -> BoxFuture<Result<(), Refusal>> {
        Box::pin(async { Ok(()) })
    }
    /// After a `keys create` or `revoke` on this node: the same change on every other
    /// node (a client logs in to whichever node leads its partitions). Returns the
    /// nodes it changed and those that did not answer, with why.
    fn share_key(self: Arc<Self>, _change: KeyChange) -> BoxFuture<KeyShared> {
        Box::pin(async { KeyShared::default() })
    }
    /// This node's view of the cluster (`cluster status --json`).
    fn status(&self) -> serde_json::Value;
    /// How many nodes the cluster has.
    fn nodes(&self) -> usize;
    /// Every node with a Kafka listener that this node knows of (itself included):
    /// (node id, HOST:PORT), by id.
    fn kafka_nodes(&self) -> Vec<(u64, String)>;
    /// What the Kafka door's Metadata says of a replicated partition (`None`: not
    /// replicated, or this node holds no replica of it).
    fn partition_view(&self, topic: &str, partition: u32) -> Option<PartitionView>;
    /// The node that coordinates the cluster's groups (the leader of the offsets
    /// topic's partition, `groups::OFFSETS_TOPIC`), when one is known.
    fn coordinator(&self) -> Option<u64> {
        None
    }
    /// Replicas this node holds whose Raft group is not open (waiting for records or
    /// a checkpoint from its peers, or refused, as `cluster status` says).
    fn closed_replicas(&self) -> usize;
}

/// A change of the API keys made on one node, as the others take it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyChange {
    /// A key created: its entry (id, secret hash, role, patterns).
    Put(crate::format::keys::KeyEntry),
    /// A key revoked: its id.
    Revoke(String),
}

/// What [`Replicator::share_key`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyShared {
    /// The nodes the change changed.
    pub changed: Vec<u64>,
    /// The nodes that did not take it, with why.
    pub failed: Vec<(u64, String)>,
}

/// A replicated partition as this node sees it, for the Kafka door's Metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionView {
    /// The leader this node knows, if any.
    pub leader: Option<u64>,
    /// The Raft term this node is in.
    pub term: u64,
    /// The placement: every replica, in placement order.
    pub replicas: Vec<u64>,
    /// The replicas in sync (Kafka's ISR): on the leader, as its replication metrics
    /// tell; elsewhere, as the leader last answered, else the leader alone.
    pub in_sync: Vec<u64>,
    /// Whether this node holds a replica; a node the placement leaves out knows the
    /// partition from what a holder last told it.
    pub held: bool,
}

impl std::fmt::Debug for dyn Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Replicator(node {})", self.node_id())
    }
}
