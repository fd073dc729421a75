//! Recovery at the topic level (docs/FORMAT.md, Data directory): leftover temporary
//! files of atomic replaces are removed; a topic whose metadata has a problem is
//! reported and left alone (its files untouched, its partitions not recovered) until
//! an operator rebuilds its `topic.json` ([`rebuild_topic_json`]) or repairs it. In the
//! data directory itself, a torn tail of `producers.journal` is cut, and a group file
//! whose stored membership is refused is rewritten without it, its offsets kept (the
//! broker's startup does both too).

use super::*;
use crate::engine::groups::offsets::read_group_file;
use crate::engine::maintenance::check::topic_problems;
use crate::engine::storage::io::write_file_atomic;
use crate::engine::storage::layout::{inspect_topic, TopicListing};
use crate::format::names::TOPIC_FILE;
use crate::format::topic::{TopicConfig, TopicMeta, PARTITIONS_MAX};

/// What recovery does and leaves at one topic (or, with no topic, in the data
/// directory outside every topic).
#[derive(Clone, Debug)]
pub struct TopicPlan {
    /// The topic's name, `None` for the data directory itself.
    pub topic: Option<String>,
    /// Removals of leftover temporary files; the cut of a torn journal tail; the
    /// rewrite of a group file whose membership is refused.
    pub actions: Vec<Action>,
    /// Metadata problems left for an operator: the topic stays offline.
    pub offline: Vec<Problem>,
}

impl TopicPlan {
    /// `topic` or `.` for messages.
    pub fn label(&self) -> &str {
        self.topic.as_deref().unwrap_or(".")
    }
}

/// What recovery did at one topic.
#[derive(Clone, Debug)]
pub struct TopicReport {
    pub topic: Option<String>,
    pub actions: Vec<ActionDone>,
    pub offline: Vec<Problem>,
}

impl TopicReport {
    pub fn label(&self) -> &str {
        self.topic.as_deref().unwrap_or(".")
    }
}

/// Plans the topic level of a target from [`topic_problems`]. Reads only.
pub fn plan_topics(target: &Target) -> Vec<TopicPlan> {
    let mut out: Vec<TopicPlan> = Vec::new();
    let damaged = |topic: &Option<String>| {
        target
            .topics
            .iter()
            .any(|t| Some(&t.topic) == topic.as_ref() && !t.issues.is_empty())
    };
    for mut tp in topic_problems(target) {
        let i = match out.iter().position(|p| p.topic == tp.topic) {
            Some(i) => i,
            None => {
                out.push(TopicPlan {
                    topic: tp.topic.clone(),
                    actions: Vec::new(),
                    offline: Vec::new(),
                });
                out.len() - 1
            }
        };
        let Some(plan) = out.get_mut(i) else { continue };
        if tp.problem.severity == Severity::Info {
            // Information (a file seglog does not know, a spare the broker's startup
            // removes): nothing for recovery to do, and nothing offline.
            continue;
        }
        if tp.problem.kind == ProblemKind::LeftoverTempFile && damaged(&tp.topic) {
            // It may hold the only copy of the lost metadata: left for the operator.
            tp.problem.detail =
                "temporary file of an atomic replace, left in place while the topic is offline"
                    .to_string();
            plan.offline.push(tp.problem);
        } else if let (ProblemKind::JournalTornTail, Some(from)) =
            (tp.problem.kind, tp.problem.position)
        {
            // The entry cut short starts where the good prefix ends.
            plan.actions.push(Action::CutJournal {
                to: file_len(&tp.problem.file),
                path: tp.problem.file,
                from,
                reason: "the last entry of the producer journal is cut short (never acknowledged)"
                    .to_string(),
            });
        } else if tp.problem.kind == ProblemKind::GroupMembershipRefused {
            // Read again for what the rewrite keeps; a file that no longer reads as
            // it did is left for the operator.
            match read_group_file(&tp.problem.file) {
                Ok((group, l)) if l.membership_problem.is_some() => {
                    plan.actions.push(Action::RewriteGroupFile {
                        bytes: file_len(&tp.problem.file),
                        path: tp.problem.file,
                        group,
                        offsets: l.offsets.len(),
                        reason: l
                            .membership_problem
                            .map(|p| p.to_string())
                            .unwrap_or_default(),
                    });
                }
                _ => plan.offline.push(tp.problem),
            }
        } else if tp.problem.kind == ProblemKind::LeftoverTempFile {
            plan.actions.push(Action::RemoveTempFile {
                bytes: file_len(&tp.problem.file),
                path: tp.problem.file,
                reason: "leftover temporary file of an atomic replace".to_string(),
            });
        } else {
            plan.offline.push(tp.problem);
        }
    }
    out
}

/// Executes a topic plan: each removal, cut or rewritten file backed up first (if
/// asked), then the directory (or the cut file) fsynced.
pub fn execute_topic(
    storage: &dyn Storage,
    plan: &TopicPlan,
    backup: Option<Backup<'_>>,
) -> Result<TopicReport, RecoveryError> {
    let mut done = Vec::new();
    for a in &plan.actions {
        let path = a.path();
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut backups = Vec::new();
        match a {
            // The cut range backed up first (if asked), then cut and fsynced.
            Action::CutJournal { from, to, .. } => {
                execute::cut(storage, path, *from, *to, backup, &mut backups)
            }
            Action::RewriteGroupFile { .. } => {
                execute::rewrite_group_file(storage, path, backup, &mut backups)
            }
            _ => execute::remove_files(storage, dir, &[path], backup, &mut backups),
        }
        .map_err(|source| RecoveryError::Action {
            label: plan.label().to_string(),
            action: format!("{} {}", a.kind(), path.display()),
            source,
        })?;
        done.push(ActionDone {
            action: a.clone(),
            backups,
        });
    }
    Ok(TopicReport {
        topic: plan.topic.clone(),
        actions: done,
        offline: plan.offline.clone(),
    })
}

/// A `topic.json` to be written by [`rebuild_topic_json`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicRebuild {
    pub topic: String,
    pub path: PathBuf,
    /// The partition count found on disk: one more than the highest partition
    /// directory.
    pub partitions: u32,
    /// Partition directories found on disk.
    pub partition_dirs: Vec<u32>,
    /// What the file held before, when it could be read (its configuration is lost).
    pub replaced: Option<TopicMeta>,
    /// The file existed (readable or not) and is replaced.
    pub existed: bool,
}

impl TopicRebuild {
    /// One line for reports.
    pub fn describe(&self, root: &Path) -> String {
        let before = match (&self.replaced, self.existed) {
            (Some(m), _) => format!(
                "replacing one with {} partition(s) and its configuration",
                m.partitions
            ),
            (None, true) => "replacing an unreadable one".to_string(),
            (None, false) => "none was there".to_string(),
        };
        format!(
            "write {} with the default configuration and {} partition(s), the count found on disk ({before})",
            relative(root, &self.path),
            self.partitions
        )
    }
}

/// Why `topic.json` cannot be rebuilt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RebuildError {
    #[error("{}: no such topic directory", dir.display())]
    NoTopic { dir: PathBuf },
    #[error("{}: {count} partition directories found, more than the {max} a topic may have", dir.display(), max = PARTITIONS_MAX)]
    TooManyPartitions { dir: PathBuf, count: u32 },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("writing {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Plans a rebuild of `topic_dir/topic.json`: the default configuration and the
/// partition count found on disk. Reads only.
pub fn plan_topic_rebuild(topic_dir: &Path) -> Result<TopicRebuild, RebuildError> {
    if !topic_dir.is_dir() {
        return Err(RebuildError::NoTopic {
            dir: topic_dir.to_path_buf(),
        });
    }
    let listing: TopicListing = inspect_topic(topic_dir)?;
    let partitions = listing.count_on_disk();
    if partitions > PARTITIONS_MAX || listing.partition_dirs.last() == Some(&u32::MAX) {
        return Err(RebuildError::TooManyPartitions {
            dir: topic_dir.to_path_buf(),
            count: partitions,
        });
    }
    let path = topic_dir.join(TOPIC_FILE);
    Ok(TopicRebuild {
        topic: listing.topic,
        existed: path.exists(),
        path,
        partitions,
        partition_dirs: listing.partition_dirs,
        replaced: listing.meta,
    })
}

/// Writes the planned `topic.json` by an atomic replace through the I/O seam (a
/// unique temporary file, fsynced, renamed over the old one, the directory fsynced).
/// The caller holds `DATA/LOCK`.
pub fn rebuild_topic_json(
    storage: &dyn Storage,
    rebuild: &TopicRebuild,
) -> Result<(), RebuildError> {
    let meta = TopicMeta {
        partitions: rebuild.partitions,
        config: TopicConfig::default(),
    };
    let dir = rebuild.path.parent().unwrap_or(Path::new("."));
    write_file_atomic(storage, dir, TOPIC_FILE, &meta.encode()).map_err(|source| RebuildError::Io {
        path: rebuild.path.clone(),
        source,
    })
}
