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

use crate::format::names::{
    classify_partition_file, parse_stem, validate_name, PartitionFile, LOCK_FILE, LOG_EXT,
    TOPICS_DIR, TOPIC_FILE,
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
}

impl Target {
    /// `path` relative to the root, for reports.
    pub fn relative(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
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
    let bytes = fs::read(path).map_err(io_err(path))?;
    TopicMeta::decode(&bytes).map_err(|source| LayoutError::Topic {
        path: path.into(),
        source,
    })
}

fn looks_like_partition(dir: &Path) -> io::Result<bool> {
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        if !matches!(
            classify_partition_file(&name.to_string_lossy()),
            PartitionFile::Unknown
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

/// Partition directories of a topic, in partition order.
pub fn topic_partitions(topic_dir: &Path) -> Result<Vec<PartitionRef>, LayoutError> {
    let meta = read_topic_meta(&topic_dir.join(TOPIC_FILE))?;
    let topic = topic_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let mut parts = Vec::new();
    for entry in fs::read_dir(topic_dir).map_err(io_err(topic_dir))? {
        let entry = entry.map_err(io_err(topic_dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(p) = name.parse::<u32>() else { continue };
        if p.to_string() != name || !entry.path().is_dir() {
            continue;
        }
        parts.push(PartitionRef {
            dir: entry.path(),
            topic: topic.clone(),
            partition: Some(p),
            config: meta.config.clone(),
            only_segment: None,
        });
    }
    parts.sort_by_key(|p| p.partition);
    Ok(parts)
}

/// Topic directories of a data directory, by name.
pub fn data_dir_topics(data_dir: &Path) -> Result<Vec<PathBuf>, LayoutError> {
    let topics = data_dir.join(TOPICS_DIR);
    if !topics.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in fs::read_dir(&topics).map_err(io_err(&topics))? {
        let entry = entry.map_err(io_err(&topics))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if validate_name(&name).is_ok() && entry.path().join(TOPIC_FILE).is_file() {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Works out what `path` names and lists the partitions below it.
pub fn resolve(path: &Path) -> Result<Target, LayoutError> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => LayoutError::NotFound { path: path.into() },
        _ => LayoutError::Io {
            path: path.into(),
            source: e,
        },
    })?;
    if meta.is_file() {
        return resolve_log_file(path);
    }
    let is_empty = fs::read_dir(path).map_err(io_err(path))?.next().is_none();
    if path.join(TOPICS_DIR).is_dir() || path.join(LOCK_FILE).is_file() || is_empty {
        let mut partitions = Vec::new();
        for topic in data_dir_topics(path)? {
            partitions.extend(topic_partitions(&topic)?);
        }
        return Ok(Target {
            kind: TargetKind::DataDir,
            root: path.into(),
            root_is_data_dir: true,
            partitions,
        });
    }
    if path.join(TOPIC_FILE).is_file() {
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
        return Ok(Target {
            kind: TargetKind::Topic,
            root,
            root_is_data_dir,
            partitions: topic_partitions(path)?,
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
        });
    }
    Err(LayoutError::NotSeglog { path: path.into() })
}

fn resolve_log_file(path: &Path) -> Result<Target, LayoutError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
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
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        match classify_partition_file(&entry.file_name().to_string_lossy()) {
            PartitionFile::Log(b) => logs.push(b),
            PartitionFile::Index(b) => indexes.push(b),
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
