//! The group coordinator: Kafka's classic consumer-group protocol (join, sync,
//! heartbeat, leave, generations, session and rebalance timeouts) and the groups'
//! committed offsets and Stable membership in `DATA/groups/<group>.json`.
//!
//! One coordinator serves every front door. Requests that complete later (join and
//! sync finish when the rebalance does; a commit when the file that covers it is
//! durable) return a [`Completion`], a `tokio::sync::oneshot` receiver: a thread waits
//! on it, an async task awaits it. Nothing inside the coordinator blocks waiting for
//! another request. Time moves through [`GroupCoordinator::tick`], which the broker's
//! flusher calls every [`TICK_INTERVAL`]; it expires sessions, ends rebalances whose
//! timeout passed, drops the offsets of deleted topics and expires empty groups. The
//! group files are written in the flusher's passes too ([`offsets`]): no thread of
//! the coordinator's own.
//!
//! Invariants:
//! - A group's state, members and generation change only under the `groups` lock.
//! - A commit is acknowledged only after a replace of the group's file that contains
//!   it is durable (write temp, fsync, rename, fsync dir); commits that wait together
//!   share one replace per group ([`offsets`]).
//! - Group names are validated before they touch the file system.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::engine::error::counted;
use crate::engine::storage::io::StorageRef;
use crate::format::group::{CommittedOffset, OFFSET_METADATA_BYTES_MAX};
use crate::format::names::validate_name;

mod coordinator;
pub mod offsets;
mod replicated;

pub use crate::format::group::GroupListener;
pub use coordinator::GroupState;
pub use replicated::{GroupRecords, ReplicaWrite};

/// Default per-member session timeout (Kafka's `session.timeout.ms`).
pub const SESSION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(45);
/// Default committed-offset retention of an empty group (7 days).
pub const OFFSETS_RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most members in one group (as many as a group file holds).
pub const MEMBERS_PER_GROUP_MAX: usize = crate::format::group::GROUP_MEMBERS_MAX;
/// Most groups one broker holds.
pub const GROUPS_MAX: usize = 10_000;
/// Most protocols one join may offer.
pub const PROTOCOLS_PER_JOIN_MAX: usize = crate::format::group::GROUP_PROTOCOLS_MAX;
/// Largest protocol metadata or member assignment.
pub const GROUP_BLOB_BYTES_MAX: usize = crate::format::group::GROUP_BLOB_BYTES_MAX;
/// Longest member id, client id, protocol type or protocol name.
pub const GROUP_ID_BYTES_MAX: usize = crate::format::group::GROUP_ID_BYTES_MAX;
/// How often the broker calls [`GroupCoordinator::tick`].
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);

/// Asks the broker's flusher for a pass (shared by the producer journal).
pub struct Waker(pub Box<dyn Fn() + Send + Sync>);

impl Waker {
    pub fn wake(&self) {
        (self.0)();
    }
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Waker")
    }
}

/// A result that arrives later.
pub type Completion<T> = oneshot::Receiver<Result<T, GroupError>>;

/// The coordinator's limits and timeouts.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// Smallest session timeout a member may ask for (Kafka's
    /// `group.min.session.timeout.ms`).
    pub session_timeout_min: Duration,
    /// Largest session timeout a member may ask for.
    pub session_timeout_max: Duration,
    /// How long an empty group keeps its committed offsets.
    pub offsets_retention: Duration,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            session_timeout_min: Duration::from_secs(6),
            session_timeout_max: Duration::from_secs(1800),
            offsets_retention: OFFSETS_RETENTION_DEFAULT,
        }
    }
}

/// Why a group request failed. Each maps onto one of Kafka's error codes.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupError {
    #[error("invalid group name: {0}")]
    InvalidName(String),
    #[error("group {group} does not exist")]
    UnknownGroup { group: String },
    /// Kafka's UNKNOWN_MEMBER_ID.
    #[error("member {member:?} is not a member of group {group}")]
    UnknownMember { group: String, member: String },
    /// Kafka's FENCED_INSTANCE_ID: a newer member joined with the same static
    /// instance id and took this member's place.
    #[error("member {member:?} of group {group} was replaced by a newer member with instance id {instance:?}")]
    FencedInstance {
        group: String,
        instance: String,
        member: String,
    },
    /// Kafka's ILLEGAL_GENERATION.
    #[error("generation {generation} of group {group} is stale (the group is at {current})")]
    IllegalGeneration {
        group: String,
        generation: i32,
        current: i32,
    },
    /// Kafka's REBALANCE_IN_PROGRESS.
    #[error("group {group} is rebalancing; rejoin")]
    RebalanceInProgress { group: String },
    /// Kafka's NON_EMPTY_GROUP.
    #[error("group {group} has {}", counted(*members as u64, "live member", "live members"))]
    GroupNotEmpty { group: String, members: usize },
    /// Kafka's INVALID_SESSION_TIMEOUT.
    #[error("session timeout {ms} ms is outside the broker's {min}..={max} ms")]
    InvalidSessionTimeout { ms: u64, min: u64, max: u64 },
    /// Kafka's INCONSISTENT_GROUP_PROTOCOL.
    #[error("group {group}: {detail}")]
    InconsistentProtocol { group: String, detail: String },
    /// Kafka's OFFSET_METADATA_TOO_LARGE.
    #[error("offset metadata is {len} bytes, over the limit of {max}")]
    MetadataTooLarge { len: usize, max: usize },
    #[error("topic {topic} does not exist")]
    UnknownTopic { topic: String },
    #[error(
        "topic {topic} has {}; there is no partition {partition}",
        counted(*partitions, "partition", "partitions")
    )]
    UnknownPartition {
        topic: String,
        partition: u32,
        partitions: u32,
    },
    #[error("{what} is over the limit of {max}")]
    TooLarge { what: &'static str, max: usize },
    #[error("cannot write the file of group {group}: {detail}")]
    Storage { group: String, detail: String },
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// Kafka's NOT_COORDINATOR (COORDINATOR_NOT_AVAILABLE while no node is named):
    /// in a cluster the groups are served by the leader of the offsets topic's
    /// partition ([`OFFSETS_TOPIC`]), and this node is not it. The message ends as a
    /// NOT_LEADER refusal's does, naming the coordinator's client address.
    #[error("{}", not_coordinator_message(group, coordinator.as_ref()))]
    NotCoordinator {
        group: String,
        /// The coordinator's node id and client address, when known.
        coordinator: Option<(u64, String)>,
    },
}

/// The internal topic that holds the groups of a cluster: one record per change of
/// a group, keyed by the group's name, valued by its group file's bytes (an empty
/// value removes the group), compacted. Its partition 0's leader coordinates every
/// group (Kafka's `__consumer_offsets`, with one partition).
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

fn not_coordinator_message(group: &str, coordinator: Option<&(u64, String)>) -> String {
    let about = if group.is_empty() {
        "this node does not coordinate the groups".to_string()
    } else {
        format!("this node does not coordinate group {group}")
    };
    // The tail is a NOT_LEADER refusal's, so that clients find the address the same
    // way (`parse_not_leader`).
    match coordinator {
        Some((id, addr)) => {
            format!("{about}: the leader of {OFFSETS_TOPIC}/0 does; leader: node {id} at {addr}")
        }
        None => format!(
            "{about}: the leader of {OFFSETS_TOPIC}/0 does, and none is known (an election \
             under way, or the topic not created yet: the nodes' logs say why); leader: \
             unknown"
        ),
    }
}

/// What the coordinator needs to know about topics.
pub trait TopicLookup {
    /// The partition count of `topic`, or `None` if there is no such topic.
    fn partition_count(&self, topic: &str) -> Option<u32>;
}

/// A join request (Kafka's JoinGroup).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinRequest {
    pub group: String,
    /// Empty for a new member; the broker assigns one.
    pub member_id: String,
    pub client_id: String,
    /// The member's address as Kafka shows it (`/127.0.0.1`): only described.
    pub client_host: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    pub protocol_type: String,
    /// (name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Vec<u8>)>,
    /// A static member's instance id (Kafka's `group.instance.id`, KIP-345): a
    /// member that joins with a known one and no member id takes the place of the
    /// member that had it. `None` for a dynamic member (and on the native protocol).
    pub group_instance_id: Option<String>,
    /// The listener the request came through. A group with members takes joins from
    /// its members' listener only: native and Kafka consumers encode subscriptions
    /// and assignments differently (Kafka's INCONSISTENT_GROUP_PROTOCOL otherwise).
    pub listener: GroupListener,
}

/// A member's host as Kafka's DescribeGroups shows it: its connection's peer address
/// as Java prints an `InetAddress` (`/127.0.0.1`).
pub fn client_host(peer: std::net::SocketAddr) -> String {
    format!("/{}", peer.ip())
}

/// The answer to a join, once the rebalance completes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinResponse {
    pub generation: i32,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// Every member, its static instance id and its metadata for the chosen protocol:
    /// only for the leader.
    pub members: Vec<(String, Option<String>, Vec<u8>)>,
}

/// One offset to commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetCommit {
    pub partition: u32,
    pub offset: u64,
    pub metadata: String,
}

/// A member as described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: String,
    /// A static member's instance id.
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// The member's assignment as the leader gave it (empty before the first sync).
    pub assignment: Vec<u8>,
}

/// A group as described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDescription {
    pub group: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
    pub offsets: Vec<CommittedOffset>,
}

/// Counters since the coordinator started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Commit requests acknowledged.
    pub commits: u64,
    /// Group files replaced or removed.
    pub file_writes: u64,
    /// fsyncs of group files and the groups directory.
    pub fsyncs: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_ms() -> i64 {
    crate::engine::partition::now_ms()
}

/// The coordinator. Shared as `Arc<GroupCoordinator>`.
#[derive(Debug)]
pub struct GroupCoordinator {
    dir: PathBuf,
    storage: StorageRef,
    opts: GroupOptions,
    groups: Mutex<BTreeMap<String, coordinator::Group>>,
    /// Asks the broker for a pass that writes the dirty groups (set by
    /// [`GroupCoordinator::share_commits`]; without one, a commit writes at once).
    waker: Mutex<Option<Waker>>,
    /// Some group is dirty: the next pass writes.
    dirty: AtomicBool,
    stop: AtomicBool,
    next_member: AtomicU64,
    commits: AtomicU64,
    file_writes: AtomicU64,
    fsyncs: AtomicU64,
    /// Where the groups live: this node's files, or a cluster's offsets topic.
    role: Mutex<replicated::Role>,
    /// Told when a group must be written and the groups live in the offsets topic.
    replica_wake: tokio::sync::Notify,
    /// A request found no coordinator to name (the offsets topic may be missing).
    wanted: AtomicBool,
    /// Counts take-overs and step-downs ([`ReplicaWrite`]'s term).
    term: AtomicU64,
}

impl GroupCoordinator {
    /// Loads every `DATA/groups/*.json` (creating the directory if missing); a file
    /// that cannot be read is reported in the returned lines and left alone (its
    /// group is then refused until an operator repairs it). A group stored with its
    /// membership comes back Stable, each member's session starting now; one whose
    /// membership is refused comes back without members (reported too).
    pub fn open(
        data_dir: &Path,
        storage: StorageRef,
        opts: GroupOptions,
    ) -> Result<(GroupCoordinator, Vec<String>), GroupError> {
        let dir = data_dir.join(crate::format::group::GROUPS_DIR);
        let io_err = |e: std::io::Error| GroupError::Storage {
            group: String::new(),
            detail: format!("{}: {e}", dir.display()),
        };
        if !dir.is_dir() {
            storage.create_dir_all(&dir).map_err(io_err)?;
            storage.sync_dir(data_dir).map_err(io_err)?;
        }
        let (loaded, report) = offsets::load_dir(&dir);
        let mut groups = BTreeMap::new();
        for (name, loaded) in loaded {
            groups.insert(name.clone(), coordinator::Group::loaded(name, loaded));
        }
        Ok((
            GroupCoordinator {
                dir,
                storage,
                opts,
                groups: Mutex::new(groups),
                waker: Mutex::new(None),
                dirty: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                next_member: AtomicU64::new(1),
                commits: AtomicU64::new(0),
                file_writes: AtomicU64::new(0),
                fsyncs: AtomicU64::new(0),
                role: Mutex::new(replicated::Role::Files),
                replica_wake: tokio::sync::Notify::new(),
                wanted: AtomicBool::new(false),
                term: AtomicU64::new(0),
            },
            report,
        ))
    }

    /// Hands the writing of group files to the broker's group commit: `waker` asks
    /// for a pass, which calls [`GroupCoordinator::flush_if_dirty`].
    pub fn share_commits(&self, waker: Waker) {
        *lock(&self.waker) = Some(waker);
    }

    /// Writes what waits (from now on a commit is written at once, or refused once
    /// stopped); every pending join and sync gets [`GroupError::ShuttingDown`].
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        lock(&self.waker).take();
        if self.replicated() {
            self.fail_unwritten(&GroupError::ShuttingDown);
            self.replica_wake.notify_one();
        } else {
            self.flush_dirty();
        }
        for g in lock(&self.groups).values_mut() {
            g.fail_waiters(&GroupError::ShuttingDown);
        }
    }

    /// One pass of the group commit: if a group is dirty, replaces each dirty
    /// group's file once and then completes the commits it covered.
    pub fn flush_if_dirty(&self) {
        // A cluster's groups are written by the offsets topic's writer instead.
        if self.replicated() {
            return;
        }
        if self.dirty.swap(false, Ordering::AcqRel) {
            self.flush_dirty();
        }
    }

    /// Counters since start.
    pub fn stats(&self) -> GroupStats {
        GroupStats {
            commits: self.commits.load(Ordering::Relaxed),
            file_writes: self.file_writes.load(Ordering::Relaxed),
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
        }
    }

    fn wake_committer(&self) {
        self.dirty.store(true, Ordering::Release);
        if self.replicated() {
            self.replica_wake.notify_one();
            return;
        }
        match &*lock(&self.waker) {
            Some(w) => w.wake(),
            // Not shared (tests that drive the coordinator alone, or shut down):
            // write now.
            None => self.flush_if_dirty(),
        }
    }
}

/// Checks a group name; the error names what is wrong.
pub fn check_group_name(group: &str) -> Result<(), GroupError> {
    validate_name(group).map_err(|e| GroupError::InvalidName(e.to_string()))
}

fn check_metadata(metadata: &str) -> Result<(), GroupError> {
    if metadata.len() > OFFSET_METADATA_BYTES_MAX {
        return Err(GroupError::MetadataTooLarge {
            len: metadata.len(),
            max: OFFSET_METADATA_BYTES_MAX,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
