//! The groups' files: loading `DATA/groups/*.json` at startup and the group commit
//! that writes them. A group's file is replaced when a commit is made and when the
//! group becomes Stable or stops being Stable (its membership is stored only while it
//! is Stable); heartbeats write nothing.
//!
//! Group commit: every commit marks its group dirty and asks the broker's flusher for
//! a pass; the pass takes every dirty group at once, replaces each group's file once
//! (however many commits it holds), and only then completes the commits it took. A
//! commit is staged until then: applied to the group's offsets once its replace is
//! durable, dropped if the replace fails, so memory never holds a commit the file
//! may not (a failed write fails exactly those commits and leaves the group's
//! offsets as they were; the next commit writes the whole file again).

use std::path::Path;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::{GroupCoordinator, GroupError};
use crate::engine::storage::io::write_file_atomic;
use crate::format::group::{
    decode_group_file_keeping_offsets, group_file_name, CommittedOffset, GroupFile, GroupFileError,
    StoredMembership, GROUP_FILE_BYTES_MAX, GROUP_FILE_EXT,
};
use crate::format::names::{is_atomic_tmp_file_name, validate_name};

/// What a group file held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub generation: i32,
    pub protocol_type: String,
    pub empty_since_ms: i64,
    pub offsets: Vec<CommittedOffset>,
    /// The members of a group that was Stable when its file was written.
    pub membership: Option<StoredMembership>,
    /// Why the file's membership was refused (the group loads without members).
    pub membership_problem: Option<GroupFileError>,
}

/// A group file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupFileProblem {
    #[error("{file}: cannot read: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {source}")]
    Bad {
        file: String,
        source: GroupFileError,
    },
    #[error("{file}: names group {inside:?}, not the file's name")]
    NameMismatch { file: String, inside: String },
}

impl GroupFileProblem {
    /// The name of the file in the groups directory.
    pub fn file(&self) -> &str {
        match self {
            GroupFileProblem::Io { file, .. }
            | GroupFileProblem::Bad { file, .. }
            | GroupFileProblem::NameMismatch { file, .. } => file,
        }
    }
}

/// One entry of `DATA/groups/` as a tool sees it.
#[derive(Debug)]
pub enum GroupEntry {
    Group(String, Loaded),
    /// A leftover temporary file of an atomic replace (repairable: remove it).
    Leftover(String),
    Problem(GroupFileProblem),
}

/// Reads one group file (the name is checked against its content).
pub fn read_group_file(path: &Path) -> Result<(String, Loaded), GroupFileProblem> {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bytes = read_bounded(path).map_err(|source| GroupFileProblem::Io {
        file: file.clone(),
        source,
    })?;
    let (f, membership_problem) =
        decode_group_file_keeping_offsets(&bytes).map_err(|source| GroupFileProblem::Bad {
            file: file.clone(),
            source,
        })?;
    if group_file_name(&f.group) != file {
        return Err(GroupFileProblem::NameMismatch {
            file,
            inside: f.group,
        });
    }
    let group = f.group.clone();
    Ok((group, Loaded::from_file(f, membership_problem)))
}

impl Loaded {
    /// What a decoded group file holds.
    pub(super) fn from_file(f: GroupFile, membership_problem: Option<GroupFileError>) -> Loaded {
        Loaded {
            generation: f.generation,
            protocol_type: f.protocol_type,
            empty_since_ms: f.empty_since_ms,
            offsets: f.offsets,
            membership: f.membership,
            membership_problem,
        }
    }
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = crate::engine::storage::noatime::open_read(path)?;
    let mut bytes = Vec::new();
    f.take(GROUP_FILE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Every entry of a groups directory, in name order (empty when it is missing).
pub fn scan_dir(dir: &Path) -> Vec<GroupEntry> {
    let Ok(rd) = crate::engine::storage::noatime::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let suffix = format!(".{GROUP_FILE_EXT}");
    names
        .into_iter()
        .map(|name| {
            let path = dir.join(&name);
            match name.strip_suffix(&suffix) {
                Some(stem) if validate_name(stem).is_ok() => match read_group_file(&path) {
                    Ok((g, l)) => GroupEntry::Group(g, l),
                    Err(p) => GroupEntry::Problem(p),
                },
                _ if is_atomic_tmp_file_name(&name) => GroupEntry::Leftover(name),
                _ => GroupEntry::Problem(GroupFileProblem::Bad {
                    file: name.clone(),
                    source: GroupFileError::Json("not a group file name".into()),
                }),
            }
        })
        .collect()
}

/// Loads the groups of a directory; problems come back as report lines.
pub(super) fn load_dir(dir: &Path) -> (Vec<(String, Loaded)>, Vec<String>) {
    let mut groups = Vec::new();
    let mut report = Vec::new();
    for e in scan_dir(dir) {
        match e {
            GroupEntry::Group(g, l) => {
                if let Some(p) = &l.membership_problem {
                    report.push(format!(
                        "groups/{}: {p}; the group is loaded without members, who rejoin",
                        group_file_name(&g)
                    ));
                }
                groups.push((g, l));
            }
            GroupEntry::Leftover(name) => {
                report.push(format!("groups/{name}: leftover temporary file (ignored)"));
            }
            GroupEntry::Problem(p) => report.push(format!("groups/{p}")),
        }
    }
    (groups, report)
}

/// A group file to write, and the commits it covers.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) group: String,
    /// `None`: remove the file.
    pub(super) bytes: Option<Vec<u8>>,
    /// How many of the group's staged commits the bytes hold.
    pub(super) staged: usize,
    pub(super) waiters: Vec<oneshot::Sender<Result<(), GroupError>>>,
}

impl GroupCoordinator {
    /// Writes every dirty group once, then completes the commits it covered.
    pub(super) fn flush_dirty(&self) {
        let pending = self.take_dirty();
        if pending.is_empty() {
            return;
        }
        let mut removed = Vec::new();
        for p in pending {
            let result = self.write_one(&p);
            removed.extend(self.complete(p, &result, true));
        }
        self.forget_deleted(&removed);
    }

    /// After the write of `p`: its staged commits are applied or dropped (when
    /// `settle`), its waiters answered with `result`. Returns the group's name when
    /// its removal is now durable.
    pub(super) fn complete(
        &self,
        p: Pending,
        result: &Result<(), GroupError>,
        settle: bool,
    ) -> Option<String> {
        if settle {
            self.settle(&p, result.is_ok());
        }
        let n = p.waiters.len() as u64;
        for w in p.waiters {
            let _ = w.send(result.clone());
        }
        if result.is_ok() {
            self.commits.fetch_add(n, Ordering::Relaxed);
        }
        (settle && result.is_ok() && p.bytes.is_none()).then_some(p.group)
    }

    fn write_one(&self, p: &Pending) -> Result<(), GroupError> {
        let name = group_file_name(&p.group);
        let err = |e: std::io::Error| GroupError::Storage {
            group: p.group.clone(),
            detail: e.to_string(),
        };
        self.file_writes.fetch_add(1, Ordering::Relaxed);
        match &p.bytes {
            Some(bytes) => {
                // The numbered steps are in `write_file_atomic`: temp, fsync, rename,
                // fsync dir. Two fsyncs per replace.
                write_file_atomic(&*self.storage, &self.dir, &name, bytes).map_err(err)?;
                self.fsyncs.fetch_add(2, Ordering::Relaxed);
            }
            None => {
                // 1. unlink, 2. fsync the directory.
                match self.storage.remove_file(&self.dir.join(&name)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(err(e)),
                }
                self.storage.sync_dir(&self.dir).map_err(err)?;
                self.fsyncs.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
