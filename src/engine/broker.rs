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

use super::cleanup::{CleanupStats, CompactionDone, PartitionCleanup, Visit};
pub use super::error::EngineError;
use super::io::{write_file_atomic, Storage, StorageRef};
use super::layout::{self, LayoutError};
use super::lock::{DirLock, LockError};
use super::log::{create_first_segment, now_ms, Closed, LogStats, PartitionLog};
pub use super::log::{FetchChunk, NewRecord};
use crate::format::names::{validate_name, TOPICS_DIR, TOPIC_FILE};
use crate::format::topic::{TopicConfig, TopicError, TopicMeta, PARTITIONS_MAX};

/// Suffix of a topic directory being built (not a valid topic name).
const CREATING_SUFFIX: &str = "~new";
/// Suffix of a topic directory being removed (not a valid topic name).
const DELETING_SUFFIX: &str = "~del";

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
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions {
            flush_every_records: 1,
            flush_interval: Duration::from_secs(1),
            cold_storage_dir: None,
            retention_check_interval: Duration::from_secs(300),
            compaction_check_interval: Duration::from_secs(300),
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
}

/// A topic's partitions and configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub partitions: Vec<PartitionInfo>,
    pub config: TopicConfig,
}

/// Counters since the broker started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BrokerStats {
    /// Every fsync, fdatasync and directory fsync the broker made.
    pub fsyncs: u64,
    pub produce_requests: u64,
    pub records_appended: u64,
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
}

impl Topic {
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
    cleaner: Arc<Cleaner>,
    cleaner_threads: Mutex<Vec<JoinHandle<()>>>,
    dir_lock: Mutex<Option<DirLock>>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

// ----- opening -----

impl Broker {
    /// Creates `data_dir` (0700) if missing, takes `DATA/LOCK`, removes leftovers of
    /// interrupted topic creates and deletes, runs recovery, opens every topic and
    /// partition, and starts the flusher thread.
    pub fn open(
        data_dir: &Path,
        storage: StorageRef,
        opts: BrokerOptions,
    ) -> Result<Arc<Broker>, EngineError> {
        check_options(&opts)?;
        let stats = Arc::new(LogStats::default());
        ensure_dir(&*storage, data_dir, &stats)?;
        let dir_lock = DirLock::acquire(data_dir).map_err(|e| match e {
            LockError::Held { path } => EngineError::Locked { path },
            LockError::Io { path, source } => {
                EngineError::io(format!("locking {}", path.display()), source)
            }
        })?;
        let topics_dir = data_dir.join(TOPICS_DIR);
        ensure_dir(&*storage, &topics_dir, &stats)?;
        let mut report = remove_leftovers(&*storage, &topics_dir, &stats)?;
        // RECOVERY CALL SITE: recovery must run here, with the lock held and before
        // any partition is opened.
        report.extend(run_recovery(&*storage, data_dir)?);
        let (topics, notes) = load_topics(&storage, &topics_dir, &stats)?;
        report.extend(notes);
        let flusher = Arc::new(Flusher::new(opts.flush_interval));
        let topics = Arc::new(RwLock::new(topics));
        let thread = flusher.clone().start(topics.clone())?;
        let cleaner = Arc::new(Cleaner {
            topics: topics.clone(),
            storage: storage.clone(),
            cold: opts.cold_storage_dir.clone(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            stopping: Arc::new(AtomicBool::new(false)),
        });
        let mut cleaner_threads = Vec::new();
        for (kind, interval) in [
            (CleanupKind::Retention, opts.retention_check_interval),
            (CleanupKind::Compaction, opts.compaction_check_interval),
        ] {
            match cleaner.clone().start(kind, interval) {
                Ok(t) => cleaner_threads.push(t),
                Err(e) => {
                    cleaner.stop();
                    flusher.stop();
                    let _ = thread.join();
                    for t in cleaner_threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Arc::new(Broker {
            data_dir: data_dir.to_path_buf(),
            topics_dir,
            storage,
            opts,
            topics,
            admin: Mutex::new(()),
            stats,
            report,
            shutting_down: AtomicBool::new(false),
            shut: Mutex::new(false),
            flusher,
            flusher_thread: Mutex::new(Some(thread)),
            cleaner,
            cleaner_threads: Mutex::new(cleaner_threads),
            dir_lock: Mutex::new(Some(dir_lock)),
        }))
    }

    /// Human-readable lines about what recovery and opening repaired or refused
    /// (empty if nothing).
    pub fn startup_report(&self) -> Vec<String> {
        self.report.clone()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

/// Runs recovery (FORMAT.md, Recovery: the same function as `seglog recover`) over the
/// data directory before any partition opens; returns its report as lines.
fn run_recovery(storage: &dyn Storage, data_dir: &Path) -> Result<Vec<String>, EngineError> {
    let report =
        crate::engine::recovery::recover(storage, data_dir).map_err(|e| EngineError::Corrupt {
            path: data_dir.to_path_buf(),
            detail: format!("recovery failed: {e}"),
        })?;
    if report.action_count() == 0 && report.is_consistent() {
        return Ok(Vec::new());
    }
    Ok(report.lines())
}

fn check_options(opts: &BrokerOptions) -> Result<(), EngineError> {
    if opts.flush_every_records == 0 {
        return Err(EngineError::InvalidRequest {
            detail: "flush_every_records must be at least 1".into(),
        });
    }
    if opts.flush_interval.is_zero() {
        return Err(EngineError::InvalidRequest {
            detail: "flush_interval must be longer than zero".into(),
        });
    }
    if opts.retention_check_interval.is_zero() || opts.compaction_check_interval.is_zero() {
        return Err(EngineError::InvalidRequest {
            detail: "retention and compaction check intervals must be longer than zero".into(),
        });
    }
    Ok(())
}

/// Creates `dir` (0700) if missing: 1. create it, 2. fsync its parent.
fn ensure_dir(storage: &dyn Storage, dir: &Path, stats: &LogStats) -> Result<(), EngineError> {
    if dir.is_dir() {
        return Ok(());
    }
    let ctx = || format!("creating directory {}", dir.display());
    // 1.
    storage
        .create_dir_all(dir)
        .map_err(|e| EngineError::io(ctx(), e))?;
    // 2.
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    stats.fsyncs.fetch_add(1, Ordering::Relaxed);
    storage
        .sync_dir(parent)
        .map_err(|e| EngineError::io(ctx(), e))
}

/// Removes `<name>~new` and `<name>~del` directories left by a crash:
/// 1. remove each, 2. fsync the topics directory once.
fn remove_leftovers(
    storage: &dyn Storage,
    topics_dir: &Path,
    stats: &LogStats,
) -> Result<Vec<String>, EngineError> {
    let mut report = Vec::new();
    for (name, path) in list_dir(topics_dir)? {
        let what = if name.ends_with(CREATING_SUFFIX) {
            "an interrupted topic create"
        } else if name.ends_with(DELETING_SUFFIX) {
            "an interrupted topic delete"
        } else {
            continue;
        };
        // 1.
        storage
            .remove_dir_all(&path)
            .map_err(|e| EngineError::io(format!("removing {}", path.display()), e))?;
        report.push(format!("removed {} left by {what}", path.display()));
    }
    if !report.is_empty() {
        // 2.
        stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        storage
            .sync_dir(topics_dir)
            .map_err(|e| EngineError::io(format!("syncing {}", topics_dir.display()), e))?;
    }
    Ok(report)
}

/// The entries of a directory as (name, path), names lossily decoded.
fn list_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>, EngineError> {
    let ctx = || format!("listing {}", dir.display());
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| EngineError::io(ctx(), e))? {
        let entry = entry.map_err(|e| EngineError::io(ctx(), e))?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            entry.path(),
        ));
    }
    out.sort();
    Ok(out)
}

/// Reads and validates `dir/topic.json` (through the layout module, the one reader).
fn read_topic_meta(dir: &Path) -> Result<TopicMeta, EngineError> {
    let path = dir.join(TOPIC_FILE);
    layout::read_topic_meta(&path).map_err(|e| match e {
        LayoutError::Io { path, source } => {
            EngineError::io(format!("reading {}", path.display()), source)
        }
        other => EngineError::Corrupt {
            path,
            detail: other.to_string(),
        },
    })
}

/// Opens every topic under `topics_dir`. A topic whose `topic.json` is unreadable is
/// left out (and reported); a partition that cannot open is kept as unavailable.
fn load_topics(
    storage: &StorageRef,
    topics_dir: &Path,
    stats: &Arc<LogStats>,
) -> Result<(TopicMap, Vec<String>), EngineError> {
    let mut topics = BTreeMap::new();
    let mut notes = Vec::new();
    for (name, path) in list_dir(topics_dir)? {
        if validate_name(&name).is_err() || !path.is_dir() {
            notes.push(format!(
                "ignoring {}: not a topic directory",
                path.display()
            ));
            continue;
        }
        match load_topic(storage, &name, &path, stats, &mut notes) {
            Ok(topic) => {
                topics.insert(name, Arc::new(topic));
            }
            Err(e) => notes.push(format!("topic {name} not loaded: {e}")),
        }
    }
    Ok((topics, notes))
}

fn load_topic(
    storage: &StorageRef,
    name: &str,
    dir: &Path,
    stats: &Arc<LogStats>,
    notes: &mut Vec<String>,
) -> Result<Topic, EngineError> {
    let meta = read_topic_meta(dir)?;
    let mut partitions = Vec::with_capacity(meta.partitions as usize);
    for p in 0..meta.partitions {
        let pdir = dir.join(p.to_string());
        let slot = if !pdir.is_dir() {
            Slot::Unavailable(format!("partition directory {} is missing", pdir.display()))
        } else {
            match PartitionLog::open(name, p, &pdir, storage.clone(), stats.clone()) {
                Ok((log, more)) => {
                    notes.extend(more);
                    Slot::Open(Arc::new(log))
                }
                Err(e) => Slot::Unavailable(e.to_string()),
            }
        };
        if let Slot::Unavailable(reason) = &slot {
            notes.push(format!("partition {name}/{p} is unavailable: {reason}"));
        }
        partitions.push(slot);
    }
    Ok(Topic {
        name: name.to_string(),
        dir: dir.to_path_buf(),
        config: RwLock::new(meta.config),
        cleanup: partitions
            .iter()
            .map(|_| Arc::new(PartitionCleanup::default()))
            .collect(),
        partitions,
    })
}

// ----- topics -----

impl Broker {
    fn check_running(&self) -> Result<(), EngineError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }

    fn topic(&self, name: &str) -> Result<Arc<Topic>, EngineError> {
        read(&self.topics)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownTopic {
                topic: name.to_string(),
            })
    }

    fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<(Arc<Topic>, Arc<PartitionLog>), EngineError> {
        let t = self.topic(topic)?;
        let log = match t.partitions.get(partition as usize) {
            Some(Slot::Open(log)) => log.clone(),
            Some(Slot::Unavailable(reason)) => {
                return Err(EngineError::PartitionUnavailable {
                    topic: topic.to_string(),
                    partition,
                    reason: reason.clone(),
                })
            }
            None => {
                return Err(EngineError::UnknownPartition {
                    topic: topic.to_string(),
                    partition,
                })
            }
        };
        Ok((t, log))
    }

    fn count_fsyncs(&self, n: u64) {
        self.stats.fsyncs.fetch_add(n, Ordering::Relaxed);
    }

    /// Creates a topic with `partitions` partitions, each with an empty segment 0.
    /// Returns once the whole topic is durable.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: TopicConfig,
    ) -> Result<(), EngineError> {
        validate_name(name)?;
        if !(1..=PARTITIONS_MAX).contains(&partitions) {
            return Err(TopicError::Partitions {
                value: partitions.to_string(),
            }
            .into());
        }
        // Values set directly on the struct get the same range checks as KEY=VALUE.
        let config = TopicConfig::from_json(&config.to_json())?;
        self.check_running()?;
        let _admin = lock(&self.admin);
        let dir = self.topics_dir.join(name);
        if read(&self.topics).contains_key(name) || dir.exists() {
            return Err(EngineError::TopicExists {
                topic: name.to_string(),
            });
        }
        let meta = TopicMeta { partitions, config };
        self.build_topic_dir(name, &meta)?;
        let mut notes = Vec::new();
        let topic = load_topic(&self.storage, name, &dir, &self.stats, &mut notes)?;
        write(&self.topics).insert(name.to_string(), Arc::new(topic));
        Ok(())
    }

    /// Builds the topic under `<name>~new` and renames it into place:
    /// 1. create each partition directory with segment 0, fsync each log and
    ///    partition directory;
    /// 2. write `topic.json` atomically (fsyncs the file and the staging directory);
    /// 3. rename `<name>~new` to `<name>`;
    /// 4. fsync the topics directory.
    fn build_topic_dir(&self, name: &str, meta: &TopicMeta) -> Result<(), EngineError> {
        let staging = self.topics_dir.join(format!("{name}{CREATING_SUFFIX}"));
        let dir = self.topics_dir.join(name);
        let s = &*self.storage;
        let built = (|| {
            let ctx = |what: &str| format!("creating topic {name}: {what}");
            if staging.exists() {
                s.remove_dir_all(&staging)
                    .map_err(|e| EngineError::io(ctx("removing a stale staging directory"), e))?;
            }
            // 1.
            for p in 0..meta.partitions {
                let pdir = staging.join(p.to_string());
                s.create_dir_all(&pdir)
                    .map_err(|e| EngineError::io(ctx("creating a partition directory"), e))?;
                create_first_segment(s, &pdir, &self.stats)?;
            }
            // 2.
            self.count_fsyncs(2);
            write_file_atomic(s, &staging, TOPIC_FILE, &meta.encode())
                .map_err(|e| EngineError::io(ctx("writing topic.json"), e))?;
            // 3.
            s.rename(&staging, &dir)
                .map_err(|e| EngineError::io(ctx("renaming the staging directory"), e))?;
            // 4.
            self.count_fsyncs(1);
            s.sync_dir(&self.topics_dir)
                .map_err(|e| EngineError::io(ctx("syncing the topics directory"), e))
        })();
        if built.is_err() && staging.exists() {
            let _ = s.remove_dir_all(&staging);
        }
        built
    }

    /// Deletes a topic. Requests in progress on it end with `TopicDeleted`.
    pub fn delete_topic(&self, name: &str) -> Result<(), EngineError> {
        validate_name(name)?;
        self.check_running()?;
        let _admin = lock(&self.admin);
        let topic = write(&self.topics)
            .remove(name)
            .ok_or_else(|| EngineError::UnknownTopic {
                topic: name.to_string(),
            })?;
        for log in topic.logs() {
            log.close(Closed::Deleted);
        }
        // Background work in progress on its partitions finishes first (it changes
        // nothing more: the logs are closed), and none starts while the files go.
        let _busy: Vec<_> = topic.cleanup.iter().map(|c| c.exclusive()).collect();
        if let Err(e) = self.remove_topic_dir(&topic.dir) {
            // Still in place: bring the topic back as it is on disk.
            let mut notes = Vec::new();
            if let Ok(t) = load_topic(&self.storage, name, &topic.dir, &self.stats, &mut notes) {
                write(&self.topics).insert(name.to_string(), Arc::new(t));
            }
            return Err(e);
        }
        Ok(())
    }

    /// Removes a topic directory: 1. rename it to `<name>~del`, 2. fsync the topics
    /// directory (the topic is gone from here, even after a crash), 3. remove the
    /// renamed directory, 4. fsync the topics directory. A failure after step 2 leaves
    /// a leftover that the next start removes.
    fn remove_topic_dir(&self, dir: &Path) -> Result<(), EngineError> {
        let s = &*self.storage;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let doomed = self.topics_dir.join(format!("{name}{DELETING_SUFFIX}"));
        let ctx = |what: &str| format!("deleting topic {name}: {what}");
        if doomed.exists() {
            // A leftover of an earlier delete whose removal failed.
            s.remove_dir_all(&doomed)
                .map_err(|e| EngineError::io(ctx("removing an earlier leftover"), e))?;
        }
        // 1.
        s.rename(dir, &doomed)
            .map_err(|e| EngineError::io(ctx("renaming its directory"), e))?;
        // 2.
        self.count_fsyncs(1);
        s.sync_dir(&self.topics_dir)
            .map_err(|e| EngineError::io(ctx("syncing the topics directory"), e))?;
        // 3. and 4.: the topic is already gone; a failure only leaves a leftover.
        if s.remove_dir_all(&doomed).is_ok() {
            self.count_fsyncs(1);
            let _ = s.sync_dir(&self.topics_dir);
        }
        Ok(())
    }

    /// Changes configuration keys (`KEY`, `VALUE` as in `--config KEY=VALUE`); unknown
    /// keys and out-of-range values are refused and nothing changes. Returns the new
    /// configuration once `topic.json` is durably replaced.
    pub fn alter_topic(
        &self,
        name: &str,
        settings: &[(String, String)],
    ) -> Result<TopicConfig, EngineError> {
        validate_name(name)?;
        self.check_running()?;
        let _admin = lock(&self.admin);
        let topic = self.topic(name)?;
        let mut config = read(&topic.config).clone();
        for (key, value) in settings {
            config.set(key, value)?;
        }
        let meta = TopicMeta {
            partitions: topic.partitions.len() as u32,
            config: config.clone(),
        };
        self.count_fsyncs(2);
        write_file_atomic(&*self.storage, &topic.dir, TOPIC_FILE, &meta.encode()).map_err(|e| {
            EngineError::io(
                format!("writing {}", topic.dir.join(TOPIC_FILE).display()),
                e,
            )
        })?;
        *write(&topic.config) = config.clone();
        Ok(config)
    }

    /// Topic names, sorted.
    pub fn list_topics(&self) -> Vec<String> {
        read(&self.topics).keys().cloned().collect()
    }

    /// Per partition: start and end offsets, segment count, bytes; and the config.
    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, EngineError> {
        let topic = self.topic(name)?;
        let partitions = topic
            .partitions
            .iter()
            .zip(&topic.cleanup)
            .enumerate()
            .map(|(p, (slot, cleanup))| partition_info(p as u32, slot, cleanup.stats()))
            .collect();
        let config = read(&topic.config).clone();
        Ok(TopicDescription {
            name: topic.name.clone(),
            partitions,
            config,
        })
    }

    /// Number of partitions of a topic.
    pub fn partition_count(&self, topic: &str) -> Result<u32, EngineError> {
        Ok(self.topic(topic)?.partitions.len() as u32)
    }
}

fn partition_info(partition: u32, slot: &Slot, cleanup: CleanupStats) -> PartitionInfo {
    match slot {
        Slot::Open(log) => {
            let segs = log.snapshot();
            PartitionInfo {
                partition,
                start_offset: log.start_offset(),
                end_offset: log.durable_end(),
                segments: segs.len() as u64,
                bytes: segs.iter().map(|s| s.bytes()).sum(),
                error: log.failure(),
                cleanup,
            }
        }
        Slot::Unavailable(reason) => PartitionInfo {
            partition,
            start_offset: 0,
            end_offset: 0,
            segments: 0,
            bytes: 0,
            error: Some(reason.clone()),
            cleanup,
        },
    }
}

// ----- produce and fetch -----

impl Broker {
    /// Appends the records to one partition as one write; returns once they are
    /// durable under the flush policy. Offsets are assigned under the partition's
    /// write lock.
    pub fn produce(
        &self,
        topic: &str,
        partition: u32,
        records: &[NewRecord<'_>],
    ) -> Result<ProduceResult, EngineError> {
        self.check_running()?;
        let (t, log) = self.partition(topic, partition)?;
        let config = read(&t.config).clone();
        let appended = log.append(records, &config)?;
        if self.opts.flush_every_records <= 1 {
            log.wait_durable(appended.last_offset + 1)?;
        } else if appended.unflushed >= self.opts.flush_every_records {
            self.flusher.request(&log);
        }
        Ok(ProduceResult {
            base_offset: appended.base_offset,
            last_offset: appended.last_offset,
        })
    }

    /// Durable records from `offset`, at most `max_bytes` (capped at
    /// [`super::log::FETCH_BYTES_MAX`]; always at least one whole record if one
    /// exists), waiting up to `max_wait` for new durable data when `offset` is the end.
    pub fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<FetchResult, EngineError> {
        self.check_running()?;
        let (_, log) = self.partition(topic, partition)?;
        let f = log.fetch(offset, max_bytes, max_wait)?;
        Ok(FetchResult {
            chunks: f.chunks,
            start_offset: f.start_offset,
            end_offset: f.end_offset,
        })
    }

    /// (start offset, end offset = next durable offset) of a partition.
    pub fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), EngineError> {
        let (_, log) = self.partition(topic, partition)?;
        Ok((log.start_offset(), log.durable_end()))
    }

    /// Counters since the broker started.
    pub fn stats(&self) -> BrokerStats {
        BrokerStats {
            fsyncs: self.stats.fsyncs.load(Ordering::Relaxed),
            produce_requests: self.stats.produce_requests.load(Ordering::Relaxed),
            records_appended: self.stats.records_appended.load(Ordering::Relaxed),
        }
    }

    /// Stops taking requests, stops the flusher, fsyncs every partition, releases the
    /// lock. Idempotent. Returns the first failure of a final fsync (a partition that
    /// had failed before is skipped: nothing more of it will be acknowledged).
    pub fn shutdown(&self) -> Result<(), EngineError> {
        let mut done = lock(&self.shut);
        if *done {
            return Ok(());
        }
        self.shutting_down.store(true, Ordering::Release);
        self.cleaner.stop();
        for handle in std::mem::take(&mut *lock(&self.cleaner_threads)) {
            let _ = handle.join();
        }
        self.flusher.stop();
        if let Some(handle) = lock(&self.flusher_thread).take() {
            let _ = handle.join();
        }
        let mut first_error = None;
        let topics: Vec<Arc<Topic>> = read(&self.topics).values().cloned().collect();
        for log in topics.iter().flat_map(|t| t.logs()) {
            let failed_before = log.failure().is_some();
            log.close(Closed::ShuttingDown);
            if let Err(e) = log.flush() {
                if !failed_before {
                    first_error.get_or_insert(e);
                }
            }
        }
        lock(&self.dir_lock).take();
        *done = true;
        first_error.map_or(Ok(()), Err)
    }
}

// ----- the flusher -----

/// The background thread that fsyncs partitions whose records wait for one: on
/// request (N records waiting) and every `flush_interval` for all of them.
#[derive(Debug)]
struct Flusher {
    state: Mutex<FlushState>,
    wake: Condvar,
    interval: Duration,
}

#[derive(Debug, Default)]
struct FlushState {
    queue: Vec<Arc<PartitionLog>>,
    stop: bool,
}

impl Flusher {
    fn new(interval: Duration) -> Self {
        Flusher {
            state: Mutex::new(FlushState::default()),
            wake: Condvar::new(),
            interval,
        }
    }

    fn start(self: Arc<Self>, topics: Arc<Topics>) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name("seglog-flusher".into())
            .spawn(move || self.run(&topics))
            .map_err(|e| EngineError::io("starting the flusher thread", e))
    }

    /// Asks for an fsync of `log` soon.
    fn request(&self, log: &Arc<PartitionLog>) {
        let mut st = lock(&self.state);
        if !st.queue.iter().any(|l| Arc::ptr_eq(l, log)) {
            st.queue.push(log.clone());
        }
        self.wake.notify_one();
    }

    fn stop(&self) {
        lock(&self.state).stop = true;
        self.wake.notify_all();
    }

    /// Waits for a request or the next interval; returns the requested logs, or
    /// `None` once stopped.
    fn next_batch(&self, deadline: Instant) -> Option<Vec<Arc<PartitionLog>>> {
        let mut st = lock(&self.state);
        loop {
            if st.stop {
                return None;
            }
            let now = Instant::now();
            if !st.queue.is_empty() || now >= deadline {
                return Some(std::mem::take(&mut st.queue));
            }
            st = self
                .wake
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A failed fsync is recorded in its partition (which then refuses writes);
    /// the flusher goes on with the others.
    fn run(&self, topics: &Topics) {
        let mut deadline = Instant::now() + self.interval;
        while let Some(batch) = self.next_batch(deadline) {
            for log in batch {
                let _ = log.flush();
            }
            if Instant::now() >= deadline {
                let all: Vec<Arc<Topic>> = read(topics).values().cloned().collect();
                for log in all.iter().flat_map(|t| t.logs()) {
                    if log.durable_end() < log.written_end() {
                        let _ = log.flush();
                    }
                }
                deadline = Instant::now() + self.interval;
            }
        }
    }
}

// ----- background cleanup -----

/// Which background task a cleaner thread runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CleanupKind {
    Retention,
    Compaction,
}

impl CleanupKind {
    fn name(self) -> &'static str {
        match self {
            CleanupKind::Retention => "retention",
            CleanupKind::Compaction => "compaction",
        }
    }
}

/// What the cleanup threads share with the broker.
#[derive(Debug)]
struct Cleaner {
    topics: Arc<Topics>,
    storage: StorageRef,
    cold: Option<PathBuf>,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Set with `stop`: a compaction or copy in progress gives up at its next write.
    stopping: Arc<AtomicBool>,
}

impl Cleaner {
    fn start(
        self: Arc<Self>,
        kind: CleanupKind,
        interval: Duration,
    ) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name(format!("seglog-{}", kind.name()))
            .spawn(move || {
                lower_priority();
                while self.sleep(interval) {
                    for line in self.round(kind) {
                        eprintln!("seglog: {line}");
                    }
                }
            })
            .map_err(|e| EngineError::io(format!("starting the {} thread", kind.name()), e))
    }

    /// Waits `interval`; false once stopped.
    fn sleep(&self, interval: Duration) -> bool {
        let deadline = Instant::now() + interval;
        let mut stop = lock(&self.stop);
        loop {
            if *stop {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            stop = self
                .wake
                .wait_timeout(stop, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        *lock(&self.stop) = true;
        self.wake.notify_all();
    }

    fn stopped(&self) -> bool {
        *lock(&self.stop)
    }

    /// One visit of every partition: roll by age, then retention or compaction where
    /// the topic's `cleanup_policy` asks for it. Returns warnings (failures) as lines.
    fn round(&self, kind: CleanupKind) -> Vec<String> {
        let mut warnings = Vec::new();
        let topics: Vec<Arc<Topic>> = read(&self.topics).values().cloned().collect();
        for topic in topics {
            let config = read(&topic.config).clone();
            for (p, (slot, cleanup)) in topic.partitions.iter().zip(&topic.cleanup).enumerate() {
                if self.stopped() {
                    return warnings;
                }
                let Slot::Open(log) = slot else { continue };
                let visit = Visit {
                    topic: &topic.name,
                    partition: p as u32,
                    log,
                    cleanup,
                    config: &config,
                    storage: &*self.storage,
                    now_ms: now_ms(),
                    stopping: &self.stopping,
                };
                let label = format!("{}/{p}", topic.name);
                let result = visit.roll_if_due().and_then(|_| match kind {
                    CleanupKind::Retention if config.cleanup_policy.deletes() => {
                        visit.retention(self.cold.as_deref()).map(|done| {
                            if let Some(why) = done.kept_because {
                                warnings.push(format!("retention of {label}: {why}"));
                            }
                        })
                    }
                    CleanupKind::Compaction if config.cleanup_policy.compacts() => {
                        visit.compaction().map(|_: CompactionDone| ())
                    }
                    _ => Ok(()),
                });
                match result {
                    Ok(()) => {}
                    // The topic went, or the broker is stopping: nothing to report.
                    Err(EngineError::TopicDeleted { .. } | EngineError::ShuttingDown) => {}
                    Err(e) => warnings.push(format!("{} of {label} failed: {e}", kind.name())),
                }
            }
        }
        warnings
    }
}

/// Background cleanup gives way to request threads: the calling thread gets nice 10
/// (on Linux, priorities are per thread). Failure only means it keeps its priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers; this changes
        // only the calling thread's scheduling priority.
        unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
        }
    }
}

impl Broker {
    /// Runs one retention round now (rolling by age too), as the background task
    /// does every `retention_check_interval`. Returns the warnings it printed would be.
    pub fn run_retention(&self) -> Vec<String> {
        self.cleaner.round(CleanupKind::Retention)
    }

    /// Runs one compaction round now, as the background task does every
    /// `compaction_check_interval`. Returns warnings (failures).
    pub fn run_compaction(&self) -> Vec<String> {
        self.cleaner.round(CleanupKind::Compaction)
    }
}
