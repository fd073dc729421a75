//! Where things are in a data directory, and what a path given to a tool names:
//! a data directory, a topic directory, a partition directory, or one `.log` file.
//!
//! ```text
//! DATA/LOCK
//! DATA/topics/<topic>/topic.json
//! DATA/topics/<topic>/<partition>/<20-digit base>.log|.index
//! ```

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::noatime;
use crate::format::names::{
    classify_partition_file, is_atomic_tmp_file_name, parse_stem, validate_name, PartitionFile,
    LOG_EXT, TOPICS_DIR, TOPIC_FILE,
};
use crate::format::topic::{TopicConfig, TopicError, TopicMeta, TOPIC_FILE_BYTES_MAX};

/// Why a path could not be resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error(
        "{path} is not a seglog data directory, topic directory, partition directory or .log file"
    )]
    NotSeglog { path: PathBuf },
    /// A file of the spare pool (`DATA/spares/spare-<n>.log`): a `.log` file, but no
    /// segment of any partition.
    #[error(
        "{path} is a spare of the segment pool (spares/), not a segment of a partition: \
         give the data directory, or a partition directory or segment"
    )]
    Spare { path: PathBuf },
    #[error("{path}: {source}")]
    Topic { path: PathBuf, source: TopicError },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What kind of thing a path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetKind {
    DataDir,
    Topic,
    Partition,
    LogFile,
}

/// One partition directory to work on.
#[derive(Clone, Debug)]
pub struct PartitionRef {
    /// The partition directory.
    pub dir: PathBuf,
    /// Topic name, when the directory sits in a topic.
    pub topic: Option<String>,
    /// Partition number, when the directory name is one.
    pub partition: Option<u32>,
    /// The topic's configuration, or the defaults when there is no `topic.json`.
    pub config: TopicConfig,
    /// When the path named a single `.log` file: its base offset.
    pub only_segment: Option<u64>,
}

impl PartitionRef {
    /// `topic/partition` for messages, or the directory.
    pub fn label(&self) -> String {
        match (&self.topic, self.partition) {
            (Some(t), Some(p)) => format!("{t}/{p}"),
            _ => self.dir.display().to_string(),
        }
    }
}

/// What is wrong with a topic's metadata (docs/FORMAT.md, Data directory). A topic
/// with any of these is corruption of that topic: its partitions are not listed in a
/// [`Target`] (nothing checks, repairs or serves them), every other topic is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopicDamage {
    /// The topic directory has no `topic.json`.
    MetaMissing,
    /// `topic.json` cannot be read or is not valid.
    MetaUnreadable { error: String },
    /// A partition directory at or above the count in `topic.json`.
    PartitionOutsideCount { partition: u32, count: u32 },
    /// A partition directory below the count in `topic.json` is missing.
    PartitionMissing { partition: u32, count: u32 },
}

/// One metadata problem of one topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicIssue {
    pub topic: String,
    /// The topic directory.
    pub dir: PathBuf,
    /// The file or directory concerned (`topic.json` or a partition directory).
    pub path: PathBuf,
    pub damage: TopicDamage,
}

impl TopicIssue {
    /// One line saying what is wrong, without the topic's name or path.
    pub fn detail(&self) -> String {
        match &self.damage {
            TopicDamage::MetaMissing => {
                "topic.json is missing: the partition count is unknown".to_string()
            }
            TopicDamage::MetaUnreadable { error } => {
                format!("topic.json cannot be used: {error}")
            }
            TopicDamage::PartitionOutsideCount { partition, count } => format!(
                "partition directory {partition} is outside the {count} partition(s) topic.json names"
            ),
            TopicDamage::PartitionMissing { partition, count } => format!(
                "partition directory {partition} of the {count} topic.json names is missing"
            ),
        }
    }
}

/// A topic directory as found on disk: its metadata, its partition directories, its
/// metadata problems and the leftover temporary files of atomic replaces in it.
#[derive(Clone, Debug)]
pub struct TopicListing {
    pub topic: String,
    pub dir: PathBuf,
    /// `topic.json`, when it is readable.
    pub meta: Option<TopicMeta>,
    /// Partition numbers of the directories found, ascending.
    pub partition_dirs: Vec<u32>,
    pub issues: Vec<TopicIssue>,
    /// Leftover temporary files of atomic replaces (`.<name>.<pid>.<seq>.tmp`).
    pub temp_files: Vec<PathBuf>,
    /// Entries seglog does not know (ignored and left alone): anything but
    /// `topic.json`, partition directories named by their number in decimal (`0`, `1`,
    /// …, no leading zeros), a Raft checkpoint `applied-<partition>.json` and the
    /// temporary files of atomic replaces; `01` or `abc` is no partition directory.
    pub unknown: Vec<PathBuf>,
}

impl TopicListing {
    /// The partitions to work on; none when the topic has a metadata problem.
    pub fn partitions(&self) -> Vec<PartitionRef> {
        let Some(meta) = self.meta.as_ref().filter(|_| self.issues.is_empty()) else {
            return Vec::new();
        };
        self.partition_dirs
            .iter()
            .map(|&p| PartitionRef {
                dir: self.dir.join(p.to_string()),
                topic: Some(self.topic.clone()),
                partition: Some(p),
                config: meta.config.clone(),
                only_segment: None,
            })
            .collect()
    }

    /// The partition count a rebuilt `topic.json` takes: one more than the highest
    /// partition directory on disk (at least 1).
    pub fn count_on_disk(&self) -> u32 {
        self.partition_dirs
            .last()
            .map_or(1, |&p| p.saturating_add(1))
    }
}

/// Lists a topic directory and checks its metadata against the partition
/// directories: the one analysis `verify`, recovery and the broker's startup share.
/// Fails only on an I/O error listing the directory.
pub fn inspect_topic(topic_dir: &Path) -> Result<TopicListing, LayoutError> {
    let topic = topic_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut partition_dirs = Vec::new();
    let mut temp_files = Vec::new();
    let mut unknown = Vec::new();
    for entry in noatime::read_dir(topic_dir).map_err(io_err(topic_dir))? {
        let entry = entry.map_err(io_err(topic_dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_atomic_tmp_file_name(&name) && entry.path().is_file() {
            temp_files.push(entry.path());
            continue;
        }
        // The broker's own files beside the partitions: the topic's metadata, and a
        // replicated topic's replica placement and Raft checkpoints.
        if name == TOPIC_FILE
            || name == crate::format::replication::REPLICATION_FILE
            || crate::format::names::parse_checkpoint_name(&name).is_some()
        {
            continue;
        }
        match name.parse::<u32>() {
            Ok(p) if p.to_string() == name && entry.path().is_dir() => partition_dirs.push(p),
            _ => unknown.push(entry.path()),
        }
    }
    partition_dirs.sort_unstable();
    temp_files.sort();
    unknown.sort();
    let meta_path = topic_dir.join(TOPIC_FILE);
    let issue = |path: PathBuf, damage| TopicIssue {
        topic: topic.clone(),
        dir: topic_dir.to_path_buf(),
        path,
        damage,
    };
    let mut issues = Vec::new();
    let meta = if meta_path.exists() {
        match read_topic_meta(&meta_path) {
            Ok(m) => Some(m),
            Err(e) => {
                let error = match e {
                    LayoutError::Topic { source, .. } => source.to_string(),
                    LayoutError::Io { source, .. } => source.to_string(),
                    other => other.to_string(),
                };
                issues.push(issue(
                    meta_path.clone(),
                    TopicDamage::MetaUnreadable { error },
                ));
                None
            }
        }
    } else {
        issues.push(issue(meta_path.clone(), TopicDamage::MetaMissing));
        None
    };
    if let Some(m) = &meta {
        let count = m.partitions;
        for p in (0..count).filter(|p| partition_dirs.binary_search(p).is_err()) {
            let path = topic_dir.join(p.to_string());
            issues.push(issue(
                path,
                TopicDamage::PartitionMissing {
                    partition: p,
                    count,
                },
            ));
        }
        for &p in partition_dirs.iter().filter(|&&p| p >= count) {
            let path = topic_dir.join(p.to_string());
            issues.push(issue(
                path,
                TopicDamage::PartitionOutsideCount {
                    partition: p,
                    count,
                },
            ));
        }
    }
    Ok(TopicListing {
        topic,
        dir: topic_dir.to_path_buf(),
        meta,
        partition_dirs,
        issues,
        temp_files,
        unknown,
    })
}

/// Leftover temporary files of atomic replaces directly in `dir` (the data directory,
/// or its `topics/`).
fn atomic_temp_files(dir: &Path) -> Result<Vec<PathBuf>, LayoutError> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    for entry in noatime::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        if is_atomic_tmp_file_name(&entry.file_name().to_string_lossy()) && entry.path().is_file() {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// A resolved path.
#[derive(Clone, Debug)]
pub struct Target {
    pub kind: TargetKind,
    /// The data directory (or, for a partition or file outside one, the directory
    /// reports are relative to).
    pub root: PathBuf,
    /// True when `root` is a real data directory (it may hold `LOCK`).
    pub root_is_data_dir: bool,
    pub partitions: Vec<PartitionRef>,
    /// The topics examined (a data or topic directory), each with its metadata
    /// problems; the partitions of a topic with one are not in `partitions`.
    pub topics: Vec<TopicListing>,
    /// Leftover temporary files of atomic replaces outside topic and partition
    /// directories (in the data directory and its `topics/`).
    pub temp_files: Vec<PathBuf>,
    /// Entries of the data directory's `topics/` that are no topic directory (a
    /// name the topic-name rules refuse, a file) and no leftover temporary file:
    /// reported as information, never removed.
    pub unknown: Vec<PathBuf>,
}

impl Target {
    /// `path` relative to the root, for reports.
    pub fn relative(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Every topic metadata problem found.
    pub fn topic_issues(&self) -> impl Iterator<Item = &TopicIssue> {
        self.topics.iter().flat_map(|t| t.issues.iter())
    }
}

/// Reads and validates a `topic.json`.
pub fn read_topic_meta(path: &Path) -> Result<TopicMeta, LayoutError> {
    let len = fs::metadata(path).map_err(io_err(path))?.len();
    if len > TOPIC_FILE_BYTES_MAX as u64 {
        return Err(LayoutError::Topic {
            path: path.into(),
            source: TopicError::TooLarge { len: len as usize },
        });
    }
    let bytes = noatime::read(path).map_err(io_err(path))?;
    TopicMeta::decode(&bytes).map_err(|source| LayoutError::Topic {
        path: path.into(),
        source,
    })
}

fn looks_like_partition(dir: &Path) -> io::Result<bool> {
    for entry in noatime::read_dir(dir)? {
        let name = entry?.file_name();
        // A temporary name alone (`notes.tmp`, `x.tmp-1`) says nothing: a directory of
        // someone else's files is no partition, and the tools must not remove them.
        if !matches!(
            classify_partition_file(&name.to_string_lossy()),
            PartitionFile::Unknown | PartitionFile::OtherTmp
        ) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn topic_config_above(
    partition_dir: &Path,
) -> Result<(Option<String>, TopicConfig, Option<PathBuf>), LayoutError> {
    let Some(topic_dir) = partition_dir.parent() else {
        return Ok((None, TopicConfig::default(), None));
    };
    let meta_path = topic_dir.join(TOPIC_FILE);
    if !meta_path.is_file() {
        return Ok((None, TopicConfig::default(), None));
    }
    let meta = read_topic_meta(&meta_path)?;
    let name = topic_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let root = topic_dir
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    Ok((name, meta.config, root))
}

/// Partition directories of a topic, in partition order; an error when its
/// metadata has a problem ([`inspect_topic`] says which).
pub fn topic_partitions(topic_dir: &Path) -> Result<Vec<PartitionRef>, LayoutError> {
    let listing = inspect_topic(topic_dir)?;
    if let Some(issue) = listing.issues.first() {
        return Err(LayoutError::Topic {
            path: issue.path.clone(),
            source: TopicError::Json {
                detail: issue.detail(),
            },
        });
    }
    Ok(listing.partitions())
}

/// Topic directories of a data directory, by name: every directory of `topics/`
/// with a valid topic name, with or without a `topic.json`.
pub fn data_dir_topics(data_dir: &Path) -> Result<Vec<PathBuf>, LayoutError> {
    Ok(list_topics_dir(data_dir)?.0)
}

/// The entries of a data directory's `topics/`, by name: the topic directories (as
/// [`data_dir_topics`]), and every other entry but the leftover temporary files of
/// atomic replaces (a name the topic-name rules refuse, a file): seglog does not
/// know these, and the broker does not load them.
fn list_topics_dir(data_dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), LayoutError> {
    let topics = data_dir.join(TOPICS_DIR);
    if !topics.is_dir() {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    for entry in noatime::read_dir(&topics).map_err(io_err(&topics))? {
        let entry = entry.map_err(io_err(&topics))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if validate_name(&name).is_ok() && path.is_dir() {
            out.push(path);
        } else if !(is_atomic_tmp_file_name(&name) && path.is_file()) {
            unknown.push(path);
        }
    }
    out.sort();
    unknown.sort();
    Ok((out, unknown))
}

/// Directory of a data directory holding the Raft logs of replicated partitions
/// (docs/FORMAT.md, Raft logs).
pub const RAFT_DIR: &str = "raft";
/// Directory of a Raft log's segments, inside `raft/<topic>/<partition>/`.
pub const RAFT_LOG_DIR: &str = "log";

/// The Raft logs of a data directory, `raft/<topic>/<partition>/log/`, each as a
/// partition (labelled `raft/<topic>/<partition>`) the tools check like any other.
pub fn data_dir_raft_logs(data_dir: &Path) -> Result<Vec<PartitionRef>, LayoutError> {
    let raft = data_dir.join(RAFT_DIR);
    if !raft.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut topics: Vec<PathBuf> = Vec::new();
    for entry in noatime::read_dir(&raft).map_err(io_err(&raft))? {
        let entry = entry.map_err(io_err(&raft))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if validate_name(&name).is_ok() && entry.path().is_dir() {
            topics.push(entry.path());
        }
    }
    topics.sort();
    for topic in topics {
        let name = topic
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut parts: Vec<(u32, PathBuf)> = Vec::new();
        for entry in noatime::read_dir(&topic).map_err(io_err(&topic))? {
            let entry = entry.map_err(io_err(&topic))?;
            let log = entry.path().join(RAFT_LOG_DIR);
            let number = entry.file_name().to_string_lossy().parse::<u32>();
            if let (Ok(p), true) = (number, log.is_dir()) {
                parts.push((p, log));
            }
        }
        parts.sort();
        for (p, dir) in parts {
            out.push(PartitionRef {
                dir,
                topic: Some(format!("{RAFT_DIR}/{name}")),
                partition: Some(p),
                config: TopicConfig::default(),
                only_segment: None,
            });
        }
    }
    Ok(out)
}

/// Works out what `path` names and lists the partitions below it. A relative path,
/// or one with a `..`, is made absolute first (symbolic links resolved): the data
/// directory above a partition or topic named as `.`, `0` or `../0` is found, and
/// with it `LOCK`.
pub fn resolve(path: &Path) -> Result<Target, LayoutError> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => LayoutError::NotFound { path: path.into() },
        _ => LayoutError::Io {
            path: path.into(),
            source: e,
        },
    })?;
    let absolute;
    let path = if path.is_relative()
        || path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
        absolute = fs::canonicalize(path).map_err(io_err(path))?;
        absolute.as_path()
    } else {
        path
    };
    if meta.is_file() {
        return resolve_log_file(path);
    }
    if !meta.is_dir() {
        // A device, a FIFO or a socket: nothing seglog reads.
        return Err(LayoutError::NotSeglog { path: path.into() });
    }
    if path.join(TOPICS_DIR).is_dir() {
        let mut partitions = Vec::new();
        let mut topics = Vec::new();
        let (topic_dirs, unknown) = list_topics_dir(path)?;
        for topic in topic_dirs {
            let listing = inspect_topic(&topic)?;
            partitions.extend(listing.partitions());
            topics.push(listing);
        }
        partitions.extend(data_dir_raft_logs(path)?);
        let mut temp_files = atomic_temp_files(path)?;
        temp_files.extend(atomic_temp_files(&path.join(TOPICS_DIR))?);
        return Ok(Target {
            kind: TargetKind::DataDir,
            root: path.into(),
            root_is_data_dir: true,
            partitions,
            topics,
            temp_files,
            unknown,
        });
    }
    if path.join(TOPIC_FILE).is_file() || in_topics_dir(path) {
        let root = path
            .parent()
            .and_then(Path::parent)
            .map_or_else(|| path.to_path_buf(), Path::to_path_buf);
        let root_is_data_dir = root.join(TOPICS_DIR).is_dir() && root != path;
        let root = if root_is_data_dir {
            root
        } else {
            path.to_path_buf()
        };
        let listing = inspect_topic(path)?;
        return Ok(Target {
            kind: TargetKind::Topic,
            root,
            root_is_data_dir,
            partitions: listing.partitions(),
            topics: vec![listing],
            temp_files: Vec::new(),
            unknown: Vec::new(),
        });
    }
    if looks_like_partition(path).map_err(io_err(path))? {
        let (topic, config, data_root) = topic_config_above(path)?;
        let root_is_data_dir = data_root
            .as_ref()
            .is_some_and(|r| r.join(TOPICS_DIR).is_dir());
        let root = if root_is_data_dir {
            data_root.unwrap_or_else(|| path.to_path_buf())
        } else {
            path.to_path_buf()
        };
        let partition = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok());
        let p = PartitionRef {
            dir: path.into(),
            topic,
            partition,
            config,
            only_segment: None,
        };
        return Ok(Target {
            kind: TargetKind::Partition,
            root,
            root_is_data_dir,
            partitions: vec![p],
            topics: Vec::new(),
            temp_files: Vec::new(),
            unknown: Vec::new(),
        });
    }
    Err(LayoutError::NotSeglog { path: path.into() })
}

/// True for a directory with a valid topic name directly in a data directory's
/// `topics/` (a topic directory, even without its `topic.json`).
fn in_topics_dir(path: &Path) -> bool {
    let valid = path
        .file_name()
        .is_some_and(|n| validate_name(&n.to_string_lossy()).is_ok());
    let parent = path.parent();
    valid
        && parent.is_some_and(|p| p.file_name().is_some_and(|n| n == TOPICS_DIR))
        && !looks_like_partition(path).unwrap_or(true)
}

fn resolve_log_file(path: &Path) -> Result<Target, LayoutError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if crate::format::names::parse_spare_file_name(&name).is_some() {
        return Err(LayoutError::Spare { path: path.into() });
    }
    let base = name
        .strip_suffix(&format!(".{LOG_EXT}"))
        .and_then(parse_stem)
        .ok_or_else(|| LayoutError::NotSeglog { path: path.into() })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (topic, config, data_root) = topic_config_above(&dir)?;
    let root_is_data_dir = data_root
        .as_ref()
        .is_some_and(|r| r.join(TOPICS_DIR).is_dir());
    let root = if root_is_data_dir {
        data_root.unwrap_or_else(|| dir.clone())
    } else {
        dir.clone()
    };
    let partition = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok());
    let p = PartitionRef {
        dir,
        topic,
        partition,
        config,
        only_segment: Some(base),
    };
    Ok(Target {
        kind: TargetKind::LogFile,
        root,
        root_is_data_dir,
        partitions: vec![p],
        topics: Vec::new(),
        temp_files: Vec::new(),
        unknown: Vec::new(),
    })
}

/// A segment's files in a partition directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFiles {
    pub base_offset: u64,
    pub log: PathBuf,
    pub index: PathBuf,
    pub has_index: bool,
}

/// Everything found in a partition directory.
#[derive(Clone, Debug, Default)]
pub struct PartitionListing {
    /// Segments with a `.log`, by base offset.
    pub segments: Vec<SegmentFiles>,
    /// `.index` files without a `.log`.
    pub orphan_indexes: Vec<PathBuf>,
    /// `*.tmp` files (compaction results, interrupted rewrites).
    pub temp_files: Vec<PathBuf>,
    /// `compaction.marker`, if present.
    pub marker: Option<PathBuf>,
    /// Anything else.
    pub unknown: Vec<PathBuf>,
}

/// Lists a partition directory.
pub fn list_partition(dir: &Path) -> io::Result<PartitionListing> {
    let mut out = PartitionListing::default();
    let mut logs = Vec::new();
    let mut indexes = Vec::new();
    for entry in noatime::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        match classify_partition_file(&entry.file_name().to_string_lossy()) {
            PartitionFile::Log(b) => logs.push(b),
            PartitionFile::Index(b) => indexes.push(b),
            // A directory with a temporary file's name is nothing seglog wrote: left
            // alone, as any unknown entry (removing it would fail, and block recovery).
            PartitionFile::LogTmp(_) | PartitionFile::IndexTmp(_) | PartitionFile::OtherTmp
                if entry.file_type()?.is_dir() =>
            {
                out.unknown.push(path);
            }
            PartitionFile::LogTmp(_) | PartitionFile::IndexTmp(_) | PartitionFile::OtherTmp => {
                out.temp_files.push(path);
            }
            PartitionFile::Marker => out.marker = Some(path),
            PartitionFile::Unknown => out.unknown.push(path),
        }
    }
    logs.sort_unstable();
    indexes.sort_unstable();
    for &b in &logs {
        out.segments.push(SegmentFiles {
            base_offset: b,
            log: dir.join(crate::format::names::log_file_name(b)),
            index: dir.join(crate::format::names::index_file_name(b)),
            has_index: indexes.binary_search(&b).is_ok(),
        });
    }
    for b in indexes {
        if logs.binary_search(&b).is_err() {
            out.orphan_indexes
                .push(dir.join(crate::format::names::index_file_name(b)));
        }
    }
    out.temp_files.sort();
    out.unknown.sort();
    Ok(out)
}
