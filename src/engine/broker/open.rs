//! Opening the broker: options checked, `DATA/LOCK` taken, recovery run, leftovers of
//! interrupted topic creations and deletions removed, every topic loaded.

use super::*;
use crate::engine::partition::files::FileCache;

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
        let stats = Arc::new(LogStats {
            files: Arc::new(FileCache::new(opts.max_open_files)),
            ..LogStats::default()
        });
        stats
            .write_path
            .preallocate_bytes
            .store(opts.preallocate_bytes, Ordering::Relaxed);
        let zero_ahead = opts.zero_ahead && opts.preallocate_bytes > 0;
        stats
            .write_path
            .zero_ahead
            .store(zero_ahead, Ordering::Relaxed);
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
        for line in &report {
            tracing::warn!(data_dir = %data_dir.display(), "recovery: {line}");
        }
        let (topics, notes) = load_topics(&storage, &topics_dir, &stats)?;
        report.extend(notes);
        let spares = open_spares(&*storage, data_dir, &opts, &stats, &topics)?;
        for line in &spares {
            tracing::warn!(data_dir = %data_dir.display(), "{line}");
        }
        report.extend(spares);
        let names: Vec<String> = topics.keys().cloned().collect();
        let schemas =
            crate::engine::schemas::SchemaRegistry::open(storage.clone(), data_dir, &names)
                .map_err(schemas::open_error)?;
        let keys = crate::engine::keys::KeyStore::open(storage.clone(), data_dir)
            .map_err(keys_open_error)?;
        let (groups, notes) = open_groups(data_dir, &storage, &opts)?;
        let (producers, more) = open_producers(data_dir, &storage, &opts, &topics)?;
        // What the groups' and producers' state files needed (a cut journal, a batch
        // cut off its partition) goes to the log too, as recovery's actions do.
        for line in notes.iter().chain(&more) {
            tracing::warn!(data_dir = %data_dir.display(), "{line}");
        }
        report.extend(notes);
        report.extend(more);
        // From the first journalled append on, no partition's data is synced before
        // the entries of its records (`partition::journal`).
        let journal: Arc<dyn crate::engine::partition::Journal> = producers.clone();
        let _ = stats.journal.set(journal);
        let flusher = Arc::new(Flusher::new(
            opts.flush_interval,
            producers.clone(),
            groups.clone(),
        ));
        share_commits(&flusher, &groups, &producers);
        let topics = Arc::new(RwLock::new(topics));
        let cleaner = Arc::new(Cleaner {
            topics: topics.clone(),
            storage: storage.clone(),
            cold: opts.cold_storage_dir.clone(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            stopping: Arc::new(AtomicBool::new(false)),
            spares: stats.clone(),
            damage: std::sync::OnceLock::new(),
            scrubbed: Default::default(),
        });
        let zeroer = Arc::new(Zeroer::new(stats.clone(), storage.clone(), opts.zero_rate));
        let spare_maker = Arc::new(SpareMaker::new(stats.clone(), storage.clone()));
        let pool_on = stats.spares.dir().is_some();
        stats
            .spares
            .set_new_target(if pool_on { opts.new_spares } else { 0 });
        // When a thread fails to start: stop and join those started, then close the
        // groups and producers.
        let abandon = |started: Vec<JoinHandle<()>>| {
            cleaner.stop();
            flusher.stop();
            zeroer.stop();
            spare_maker.stop();
            for t in started {
                let _ = t.join();
            }
            groups.shutdown();
            producers.shutdown();
        };
        let thread = match flusher.clone().start(topics.clone()) {
            Ok(t) => t,
            Err(e) => {
                abandon(Vec::new());
                return Err(e);
            }
        };
        let zeroer_thread = match zero_ahead.then(|| zeroer.clone().start()).transpose() {
            Ok(t) => t,
            Err(e) => {
                abandon(vec![thread]);
                return Err(e);
            }
        };
        let spare_maker_thread = match (pool_on && opts.new_spares > 0)
            .then(|| spare_maker.clone().start())
            .transpose()
        {
            Ok(t) => t,
            Err(e) => {
                abandon(
                    [Some(thread), zeroer_thread]
                        .into_iter()
                        .flatten()
                        .collect(),
                );
                return Err(e);
            }
        };
        let mut cleaner_threads = Vec::new();
        let background = [
            Background::Cleanup(CleanupKind::Retention, opts.retention_check_interval),
            Background::Cleanup(CleanupKind::Compaction, opts.compaction_check_interval),
        ]
        .into_iter()
        .chain(
            opts.scrub_interval
                .map(|every| Background::Scrub(every, opts.scrub_rate)),
        );
        for job in background {
            let started = match job {
                Background::Cleanup(kind, interval) => cleaner.clone().start(kind, interval),
                Background::Scrub(every, rate) => cleaner.clone().start_scrub(every, rate),
            };
            match started {
                Ok(t) => cleaner_threads.push(t),
                Err(e) => {
                    abandon(
                        [Some(thread), zeroer_thread, spare_maker_thread]
                            .into_iter()
                            .flatten()
                            .chain(cleaner_threads)
                            .collect(),
                    );
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
            committer: Arc::default(),
            zeroer,
            zeroer_thread: Mutex::new(zeroer_thread),
            spare_maker,
            spare_maker_thread: Mutex::new(spare_maker_thread),
            cleaner,
            cleaner_threads: Mutex::new(cleaner_threads),
            dir_lock: Mutex::new(Some(dir_lock)),
            mends_done: tokio::sync::watch::Sender::new(0),
            schemas,
            groups,
            producers,
            keys,
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

/// A background thread of the cleaner: a cleanup kind at its interval, or the scrub
/// (interval, bytes per second).
enum Background {
    Cleanup(CleanupKind, Duration),
    Scrub(Duration, u64),
}

/// Turns the spare pool on (`DATA/spares`, created 0700 if missing) and re-stamps
/// every spare found there (docs/FORMAT.md, Spares rule 2) before any log can roll.
fn open_spares(
    storage: &dyn Storage,
    data_dir: &Path,
    opts: &BrokerOptions,
    stats: &LogStats,
    topics: &BTreeMap<String, Arc<Topic>>,
) -> Result<Vec<String>, EngineError> {
    if opts.spares_per_partition == 0 {
        return remove_spares(storage, data_dir);
    }
    stats.spares.configure(data_dir, opts.spares_per_partition);
    let Some(dir) = stats.spares.dir() else {
        return Ok(Vec::new());
    };
    ensure_dir(storage, &dir, stats)?;
    stats
        .spares
        .set_partitions(topics.values().map(|t| t.partitions.len() as u64).sum());
    let done = stats
        .spares
        .restamp(storage)
        .map_err(|e| EngineError::io(format!("re-stamping the spares in {}", dir.display()), e))?;
    Ok(if done.removed > 0 {
        vec![format!(
            "{}: removed {} file(s) that cannot be spares or are past the pool's cap; {} spare(s) kept",
            dir.display(),
            done.removed,
            done.kept
        )]
    } else {
        Vec::new()
    })
}

/// With the pool off, `DATA/spares` left by an earlier start with it on holds no
/// file the broker will use: it is removed (its files hold only records retention,
/// compaction or an unfinished roll gave up), and the data directory fsynced, as
/// the pool deletes any spare over its cap.
fn remove_spares(storage: &dyn Storage, data_dir: &Path) -> Result<Vec<String>, EngineError> {
    let dir = data_dir.join(crate::format::names::SPARES_DIR);
    let files = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EngineError::io(format!("reading {}", dir.display()), e)),
    };
    storage
        .remove_dir_all(&dir)
        .and_then(|()| storage.sync_dir(data_dir))
        .map_err(|e| EngineError::io(format!("removing {}", dir.display()), e))?;
    Ok(vec![format!(
        "{}: the spare pool is off (--spares-per-partition 0): removed it and its {files} file(s)",
        dir.display()
    )])
}

fn keys_open_error(e: crate::engine::keys::KeyError) -> EngineError {
    use crate::engine::keys::KeyError;
    match e {
        KeyError::Unreadable { path, detail } => EngineError::Corrupt { path, detail },
        KeyError::Io { context, source } => EngineError::Io { context, source },
        other => EngineError::InvalidRequest {
            detail: other.to_string(),
        },
    }
}

/// Runs recovery (docs/FORMAT.md, Recovery: the same function as `seglog recover`) over the
/// data directory before any partition opens; returns its report as lines.
pub(super) fn run_recovery(
    storage: &dyn Storage,
    data_dir: &Path,
) -> Result<Vec<String>, EngineError> {
    let report =
        crate::engine::maintenance::recovery::recover(storage, data_dir).map_err(|source| {
            EngineError::Recovery {
                path: data_dir.to_path_buf(),
                source,
            }
        })?;
    if report.action_count() == 0 && report.is_consistent() {
        return Ok(Vec::new());
    }
    Ok(report.lines())
}

pub(super) fn check_options(opts: &BrokerOptions) -> Result<(), EngineError> {
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
    if opts.zero_ahead && opts.zero_rate == 0 {
        return Err(EngineError::InvalidRequest {
            detail: "zero_rate must be at least 1 byte per second".into(),
        });
    }
    if opts.scrub_interval.is_some_and(|d| d.is_zero()) || opts.scrub_rate == 0 {
        return Err(EngineError::InvalidRequest {
            detail: "the scrub interval must be longer than zero and its rate at least 1 byte per second".into(),
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
pub(super) fn ensure_dir(
    storage: &dyn Storage,
    dir: &Path,
    stats: &LogStats,
) -> Result<(), EngineError> {
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
///
/// Only real directories are the broker's own: a file or a symbolic link of such a
/// name is left alone (the tools report it as an unknown file).
pub(super) fn remove_leftovers(
    storage: &dyn Storage,
    topics_dir: &Path,
    stats: &LogStats,
) -> Result<Vec<String>, EngineError> {
    let mut report = Vec::new();
    for (name, path) in list_dir(topics_dir)? {
        let what = if name.ends_with(TOPIC_CREATING_SUFFIX) {
            "an interrupted topic create"
        } else if name.ends_with(TOPIC_DELETING_SUFFIX) {
            "an interrupted topic delete"
        } else {
            continue;
        };
        if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
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
pub(super) fn list_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>, EngineError> {
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
pub(super) fn read_topic_meta(dir: &Path) -> Result<TopicMeta, EngineError> {
    let path = dir.join(TOPIC_FILE);
    layout::read_topic_meta(&path).map_err(|source| EngineError::TopicMeta {
        path,
        source: Box::new(source),
    })
}

/// Opens every topic under `topics_dir`. A topic whose metadata has a problem
/// (docs/FORMAT.md, Data directory) is kept offline (and reported); a partition that
/// cannot open is kept as unavailable.
pub(super) fn load_topics(
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
            Err(e) => {
                tracing::error!(topic = %name, error = %e, "topic not loaded");
                notes.push(format!("topic {name} not loaded: {e}"));
            }
        }
    }
    Ok((topics, notes))
}

pub(super) fn load_topic(
    storage: &StorageRef,
    name: &str,
    dir: &Path,
    stats: &Arc<LogStats>,
    notes: &mut Vec<String>,
) -> Result<Topic, EngineError> {
    let listing = layout::inspect_topic(dir).map_err(|source| EngineError::TopicMeta {
        path: dir.to_path_buf(),
        source: Box::new(source),
    })?;
    if !listing.issues.is_empty() {
        let problem = listing
            .issues
            .iter()
            .map(|i| format!("{}: {}", i.path.display(), i.detail()))
            .collect::<Vec<_>>()
            .join("; ");
        notes.push(format!("topic {name} is offline: {problem}"));
        return Ok(Topic {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            config: RwLock::new(TopicConfig::default()),
            partitions: Vec::new(),
            cleanup: Vec::new(),
            offline: Some(problem),
            replicated: false,
        });
    }
    let meta = read_topic_meta(dir)?;
    let mut partitions = Vec::with_capacity(meta.partitions as usize);
    for p in 0..meta.partitions {
        let pdir = dir.join(p.to_string());
        let slot = if pdir.is_dir() {
            match PartitionLog::open_capped(
                name,
                p,
                &pdir,
                storage.clone(),
                stats.clone(),
                meta.config.segment_bytes,
            ) {
                Ok((log, more)) => {
                    for note in &more {
                        tracing::warn!(topic = name, partition = p, "{note}");
                    }
                    notes.extend(more);
                    Slot::Open(Arc::new(log))
                }
                Err(e) => Slot::Unavailable(e.to_string()),
            }
        } else {
            Slot::Unavailable(format!("partition directory {} is missing", pdir.display()))
        };
        if let Slot::Unavailable(reason) = &slot {
            tracing::error!(topic = name, partition = p, %reason, "partition unavailable");
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
        offline: None,
        replicated: dir
            .join(crate::format::replication::REPLICATION_FILE)
            .exists(),
    })
}

/// Opens the group coordinator over `DATA/groups/`.
fn open_groups(
    data_dir: &Path,
    storage: &StorageRef,
    opts: &BrokerOptions,
) -> Result<(Arc<crate::engine::groups::GroupCoordinator>, Vec<String>), EngineError> {
    let (groups, notes) = crate::engine::groups::GroupCoordinator::open(
        data_dir,
        storage.clone(),
        opts.groups.clone(),
    )
    .map_err(|e| EngineError::io("opening the groups directory", std::io::Error::other(e)))?;
    Ok((Arc::new(groups), notes))
}

/// The group files and the producer journal are made durable in the flusher's
/// passes; each asks for a pass through a weak handle (the flusher holds them).
fn share_commits(
    flusher: &Arc<Flusher>,
    groups: &crate::engine::groups::GroupCoordinator,
    producers: &crate::engine::producers::ProducerTable,
) {
    use crate::engine::groups::Waker;
    let waker = || {
        let f = Arc::downgrade(flusher);
        Waker(Box::new(move || {
            if let Some(f) = f.upgrade() {
                f.kick();
            }
        }))
    };
    groups.share_commits(waker());
    producers.share_commits(waker());
}

/// Opens the idempotent producers' table; journal entries past a partition's
/// recovered end are dropped, and a batch only partly in its partition is cut off.
fn open_producers(
    data_dir: &Path,
    storage: &StorageRef,
    opts: &BrokerOptions,
    topics: &TopicMap,
) -> Result<(Arc<crate::engine::producers::ProducerTable>, Vec<String>), EngineError> {
    use crate::engine::producers::PartitionEnd;
    let end_of = |topic: &str, partition: u32| -> PartitionEnd {
        let Some(t) = topics.get(topic) else {
            return PartitionEnd::Gone;
        };
        // An offline topic's files are never judged: its batches wait for the start
        // that opens it.
        if t.offline.is_some() {
            return PartitionEnd::Unknown;
        }
        match t.partitions.get(partition as usize) {
            Some(Slot::Open(log)) => PartitionEnd::At(log.durable_end()),
            Some(Slot::Unavailable(_)) => PartitionEnd::Unknown,
            None => PartitionEnd::Gone,
        }
    };
    // A batch cut short by a crash (its first records written, its entry too) is cut
    // off its partition: durably, before the entry goes. Never on a replicated
    // partition (only Raft cuts those; its batches have no journal entries).
    let cut = |topic: &str, partition: u32, base: u64| -> Result<(), String> {
        let t = topics.get(topic).ok_or("no such topic")?;
        if t.replicated {
            return Err("the partition is replicated".into());
        }
        match t.partitions.get(partition as usize) {
            Some(Slot::Open(log)) => log.cut_tail(base).map_err(|e| e.to_string()),
            _ => Err("the partition is not open".into()),
        }
    };
    let (table, notes) = crate::engine::producers::ProducerTable::open_cutting(
        data_dir,
        storage.clone(),
        opts.producer_id_expiration,
        &end_of,
        &cut,
    )
    .map_err(|e| EngineError::io("opening the producer journal", std::io::Error::other(e)))?;
    Ok((Arc::new(table), notes))
}
