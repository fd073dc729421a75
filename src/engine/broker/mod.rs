//! The broker: topics, their partitions, and the API the network server calls.
//!
//! `DATA/topics/<name>/topic.json` holds a topic's partition count and configuration;
//! `DATA/topics/<name>/<p>/` holds partition `p`'s segments. Invariants:
//! - Names are validated before anything touches the file system.
//! - A topic appears on disk whole or not at all: it is built under `<name>~new` and
//!   renamed into place; it disappears by a rename to `<name>~del` before it is
//!   removed. Startup removes leftovers of both (neither is a valid topic name).
//! - Creates, deletes and alters are serialized by one admin lock; produce and fetch
//!   take only the topic map's read lock, then the partition's own locks.
//! - With `flush_every_records` = 1 a produce returns after the fsync that covers it;
//!   with N > 1 it returns after the write, and the flusher thread fsyncs a partition
//!   once N records wait and every partition at least every `flush_interval`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::engine::error::{AppendError, EngineError};
use crate::engine::partition::cleanup::{CleanupStats, CompactionDone, PartitionCleanup, Visit};
use crate::engine::partition::{create_first_segment, now_ms, Closed, LogStats, PartitionLog};
pub use crate::engine::partition::{FetchChunk, FetchSpan, LogFetchSpans, NewRecord};
use crate::engine::storage::io::{write_file_atomic, Storage, StorageRef};
use crate::engine::storage::layout;
use crate::engine::storage::lock::{DirLock, LockError};
use crate::format::names::{validate_name, TOPICS_DIR, TOPIC_FILE};
use crate::format::topic::{TopicConfig, TopicError, TopicMeta, PARTITIONS_MAX};

mod cleaner;
mod committer;
mod flusher;
mod mend;
mod open;
mod replicated;
mod requests;
mod schemas;
mod scrub;
mod spare_maker;
mod topics;
mod zeroer;

use cleaner::*;
use committer::*;
use flusher::*;
pub use mend::{DamageListener, PlannedMend};
use open::*;
pub use requests::{Commit, CommitLead, DurableWait};
pub use scrub::{ScrubFigures, SCRUB_RATE_DEFAULT};
use spare_maker::SpareMaker;
use zeroer::Zeroer;

use crate::format::names::{
    creating_topic_dir_name, deleting_topic_dir_name, TOPIC_CREATING_SUFFIX, TOPIC_DELETING_SUFFIX,
};

/// How the broker makes writes durable.
#[derive(Clone, Debug)]
pub struct BrokerOptions {
    /// 1: every produce is acknowledged after an fsync covering it (group commit).
    /// N > 1: fsync once N records wait; acknowledgements do not wait.
    pub flush_every_records: u64,
    /// Longest time written records wait for an fsync.
    pub flush_interval: Duration,
    /// Where retention copies segments before deleting them.
    pub cold_storage_dir: Option<PathBuf>,
    /// How often retention (and rolling by `segment_ms`) visits every partition.
    pub retention_check_interval: Duration,
    /// How often compaction visits every partition of a compacted topic.
    pub compaction_check_interval: Duration,
    /// How often the scrub reads every sealed segment through (`None`: never).
    pub scrub_interval: Option<Duration>,
    /// Bytes per second the scrub reads.
    pub scrub_rate: u64,
    /// Read handles of sealed segments kept open at once (least recently used first
    /// out); the active segment of each partition keeps its own handles besides.
    pub max_open_files: usize,
    /// Space reserved ahead of each active segment's writer (0: none); also the
    /// zero-ahead window.
    pub preallocate_bytes: u64,
    /// Whether the zero worker writes zeros ahead of each writer.
    pub zero_ahead: bool,
    /// Bytes per second the zero worker writes, for all segments together.
    pub zero_rate: u64,
    /// Spare segment files kept in `DATA/spares/` per partition of the node (0: none;
    /// segments retention removes are deleted).
    pub spares_per_partition: u64,
    /// Spares kept ready for rolls, made new (empty) when retention and compaction
    /// return too few; within `spares_per_partition` (0: none made).
    pub new_spares: u64,
    /// The group coordinator's timeouts and limits.
    pub groups: crate::engine::groups::GroupOptions,
    /// How long an idempotent producer unseen is remembered.
    pub producer_id_expiration: Duration,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions {
            flush_every_records: 1,
            flush_interval: Duration::from_secs(1),
            cold_storage_dir: None,
            retention_check_interval: Duration::from_secs(300),
            compaction_check_interval: Duration::from_secs(300),
            scrub_interval: None,
            scrub_rate: SCRUB_RATE_DEFAULT,
            max_open_files: crate::engine::partition::files::OPEN_FILES_DEFAULT,
            preallocate_bytes: 0,
            zero_ahead: false,
            zero_rate: crate::engine::partition::zero::ZERO_RATE_DEFAULT,
            spares_per_partition: 0,
            new_spares: crate::engine::partition::spares::NEW_SPARES_DEFAULT,
            groups: crate::engine::groups::GroupOptions::default(),
            producer_id_expiration: crate::engine::producers::PRODUCER_ID_EXPIRATION_DEFAULT,
        }
    }
}

/// Offsets given to a produce request's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProduceResult {
    pub base_offset: u64,
    pub last_offset: u64,
}

/// What a fetch returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchResult {
    /// Whole records in offset order, one chunk per segment read.
    pub chunks: Vec<FetchChunk>,
    /// First offset of the partition.
    pub start_offset: u64,
    /// Next durable offset of the partition.
    pub end_offset: u64,
}

/// One partition in a topic description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: u32,
    pub start_offset: u64,
    /// Next durable offset.
    pub end_offset: u64,
    pub segments: u64,
    /// Bytes of data in the segments, headers included.
    pub bytes: u64,
    /// Why the partition refuses writes (or everything), if it does.
    pub error: Option<String>,
    /// What retention and compaction did to it since the broker started.
    pub cleanup: CleanupStats,
    /// Records present (compacted topics have gaps, so not `end - start`).
    pub records: u64,
    /// Whether its data is whole, damaged or the partition failed.
    pub state: PartitionState,
    /// One line naming the failure or the (first) damaged file and offsets.
    pub detail: Option<String>,
    /// Spares in the node's pool that came from this partition.
    pub spares: u64,
    /// Bytes reserved for the active segment past the end of its data.
    pub preallocated_bytes: u64,
}

/// The state of a partition's data as `topics describe` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionState {
    /// Every segment reads to its end and none is lost.
    Ok,
    /// Served, but some records cannot be read (a damaged or a lost segment).
    Damaged,
    /// Refuses writes (or every request): failed, or could not be opened.
    Failed,
}

impl PartitionState {
    /// The name `topics describe` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionState::Ok => "ok",
            PartitionState::Damaged => "damaged",
            PartitionState::Failed => "failed",
        }
    }
}

/// A topic's partitions and configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub partitions: Vec<PartitionInfo>,
    pub config: TopicConfig,
}

/// Counters since the broker started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerStats {
    /// Every fsync, fdatasync and directory fsync the broker made.
    pub fsyncs: u64,
    pub produce_requests: u64,
    pub records_appended: u64,
    /// Fsyncs of log data timed by the write path, per latency bucket (see
    /// `partition::zero::LatencyHistogram`).
    pub fsync_latency_us: Vec<u64>,
    pub rolls: u64,
    /// Longest a writer waited at a roll, in microseconds.
    pub roll_stall_max_us: u64,
    /// Zeros written and fsynced ahead of writers.
    pub zeroed_bytes: u64,
    /// Spare files logs took at a roll.
    pub spares_taken: u64,
    /// Segments that became spares instead of being deleted.
    pub spares_returned: u64,
}

/// A partition as the broker holds it.
#[derive(Debug)]
enum Slot {
    Open(Arc<PartitionLog>),
    /// The partition could not be opened (corrupt, or left for recovery).
    Unavailable(String),
}

#[derive(Debug)]
struct Topic {
    name: String,
    dir: PathBuf,
    config: RwLock<TopicConfig>,
    partitions: Vec<Slot>,
    /// Per partition, the state of its background cleanup.
    cleanup: Vec<Arc<PartitionCleanup>>,
    /// Why the topic is offline (its metadata has a problem): it then has no
    /// partitions open and every request on it fails naming this.
    offline: Option<String>,
    /// Replicated (`replication.json`): records are written only by the Raft
    /// state machine's apply ([`Broker::append_applied`]).
    replicated: bool,
}

impl Topic {
    /// `Err(TopicOffline)` for an offline topic.
    fn online(&self) -> Result<(), EngineError> {
        match &self.offline {
            Some(problem) => Err(EngineError::TopicOffline {
                topic: self.name.clone(),
                problem: problem.clone(),
            }),
            None => Ok(()),
        }
    }

    fn logs(&self) -> impl Iterator<Item = &Arc<PartitionLog>> {
        self.partitions.iter().filter_map(|s| match s {
            Slot::Open(log) => Some(log),
            Slot::Unavailable(_) => None,
        })
    }
}

type TopicMap = BTreeMap<String, Arc<Topic>>;
type Topics = RwLock<TopicMap>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// The broker engine. Shared as `Arc<Broker>`; every method takes `&self`.
#[derive(Debug)]
pub struct Broker {
    data_dir: PathBuf,
    topics_dir: PathBuf,
    storage: StorageRef,
    opts: BrokerOptions,
    topics: Arc<Topics>,
    admin: Mutex<()>,
    stats: Arc<LogStats>,
    report: Vec<String>,
    shutting_down: AtomicBool,
    /// Held while shutting down; true once done.
    shut: Mutex<bool>,
    flusher: Arc<Flusher>,
    flusher_thread: Mutex<Option<JoinHandle<()>>>,
    /// Runs event-loop leaders' group commits off the loop.
    committer: Arc<Committer>,
    zeroer: Arc<Zeroer>,
    zeroer_thread: Mutex<Option<JoinHandle<()>>>,
    spare_maker: Arc<SpareMaker>,
    spare_maker_thread: Mutex<Option<JoinHandle<()>>>,
    cleaner: Arc<Cleaner>,
    cleaner_threads: Mutex<Vec<JoinHandle<()>>>,
    dir_lock: Mutex<Option<DirLock>>,
    /// The topics' JSON Schemas (`DATA/schemas.json`).
    schemas: crate::engine::schemas::SchemaRegistry,
    /// Consumer groups and their committed offsets.
    groups: Arc<crate::engine::groups::GroupCoordinator>,
    /// Idempotent producers' state.
    producers: Arc<crate::engine::producers::ProducerTable>,
    /// The API keys (`DATA/api_keys.json`).
    keys: crate::engine::keys::KeyStore,
    /// Counts the passes of the node's mends ([`Broker::mends_tried`]).
    mends_done: tokio::sync::watch::Sender<u64>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl Broker {
    /// The group coordinator.
    pub fn groups(&self) -> &Arc<crate::engine::groups::GroupCoordinator> {
        &self.groups
    }

    /// The idempotent producers' table.
    pub fn producers(&self) -> &Arc<crate::engine::producers::ProducerTable> {
        &self.producers
    }

    /// The API keys and the login check.
    pub fn keys(&self) -> &crate::engine::keys::KeyStore {
        &self.keys
    }
}

impl crate::engine::groups::TopicLookup for Broker {
    fn partition_count(&self, topic: &str) -> Option<u32> {
        Broker::partition_count(self, topic).ok()
    }
}
