//! Carrying out a recovery plan through the I/O seam, action by action, each step
//! made durable before the next.

use super::*;
use crate::format::names::{parse_spare_file_name, spare_file_name};

/// Executes a plan. With `backup_dir`, every byte range cut and every file removed is
/// copied there first and fsynced. Stops at the first failure (nothing after it is
/// attempted); running recovery again finishes the work.
pub fn execute(
    storage: &dyn Storage,
    plan: &RecoveryPlan,
    backup_dir: Option<&Path>,
) -> Result<RecoveryReport, RecoveryError> {
    let backup = backup_dir.map(|dir| Backup {
        dir,
        root: &plan.root,
    });
    let mut topics = Vec::with_capacity(plan.topics.len());
    for tp in &plan.topics {
        topics.push(execute_topic(storage, tp, backup)?);
    }
    let mut partitions = Vec::with_capacity(plan.partitions.len());
    for pp in &plan.partitions {
        partitions.push(execute_partition(storage, pp, backup)?);
    }
    Ok(RecoveryReport {
        root: plan.root.clone(),
        partitions,
        topics,
    })
}

pub(super) fn execute_partition(
    storage: &dyn Storage,
    pp: &PartitionPlan,
    backup: Option<Backup<'_>>,
) -> Result<PartitionReport, RecoveryError> {
    let mut done = Vec::new();
    for a in &pp.actions {
        done.push(run_action(storage, pp, a, backup)?);
    }
    let mut last = pp.clone();
    if pp.recheck_after_marker {
        // Step 1, continued: check again what the finished swap left.
        let again = plan_partition(&pp.partition)?;
        if let Some(Action::FinishCompaction { marker_path, .. }) = again.actions.first() {
            return Err(RecoveryError::MarkerAgain {
                label: pp.label.clone(),
                path: marker_path.clone(),
                detail: "the marker is still there after the swap was finished".into(),
            });
        }
        for a in &again.actions {
            done.push(run_action(storage, &again, a, backup)?);
        }
        last = again;
    }
    Ok(PartitionReport {
        label: last.label,
        dir: last.dir,
        actions: done,
        next_offset: last.next_offset,
        corrupt: last.corrupt,
        not_joined: last.not_joined,
        refuses_writes: last.refuses_writes,
    })
}

pub(super) fn run_action(
    storage: &dyn Storage,
    pp: &PartitionPlan,
    action: &Action,
    backup: Option<Backup<'_>>,
) -> Result<ActionDone, RecoveryError> {
    let wrap = |source: io::Error| RecoveryError::Action {
        label: pp.label.clone(),
        action: format!("{} {}", action.kind(), action.path().display()),
        source,
    };
    let mut backups = Vec::new();
    match action {
        Action::FinishCompaction { marker, .. } => {
            let f = finish_marker_with(storage, &pp.dir, marker, backup).map_err(wrap)?;
            backups = f.backups;
        }
        Action::RemoveMarker { path, .. }
        | Action::RemoveTempFile { path, .. }
        | Action::RemoveOrphanIndex { path, .. } => {
            remove_files(storage, &pp.dir, &[path.as_path()], backup, &mut backups)
                .map_err(wrap)?;
        }
        Action::RemoveNeverDurable {
            log,
            index,
            to_spares,
            ..
        } => {
            // 1. The index, and fsync the directory; 2. the log, and fsync again. A
            //    crash in between leaves the log, removed next time; never an index
            //    without its log, which above the first segment marks a lost segment
            //    (docs/FORMAT.md, Recovery step 5).
            //    A reused file goes back to the spares instead (FORMAT, Recovery step
            //    4): a crash before its rename is durable leaves it in either place,
            //    and both are handled (here again, or re-stamped at startup).
            if let Some(i) = index {
                remove_files(storage, &pp.dir, &[i.as_path()], backup, &mut backups)
                    .map_err(wrap)?;
            }
            match to_spares {
                Some(spares) if exists(log).map_err(wrap)? => {
                    if let Some(b) = backup {
                        backups.push(b.copy(storage, log, 0, file_len(log), true).map_err(wrap)?);
                    }
                    return_to_spares(storage, &pp.dir, log, spares).map_err(wrap)?;
                }
                _ => remove_files(storage, &pp.dir, &[log.as_path()], backup, &mut backups)
                    .map_err(wrap)?,
            }
        }
        Action::RewriteGroupFile { path, .. } => {
            rewrite_group_file(storage, path, backup, &mut backups).map_err(wrap)?;
        }
        Action::CutTail { log, from, to, .. }
        | Action::TrimSeal { log, from, to, .. }
        | Action::CutJournal {
            path: log,
            from,
            to,
            ..
        } => {
            cut(storage, log, *from, *to, backup, &mut backups).map_err(wrap)?;
        }
        Action::RebuildIndex {
            log,
            index,
            base_offset,
            entries,
            ..
        } => {
            let files = SegmentFiles {
                base_offset: *base_offset,
                log: log.clone(),
                index: index.clone(),
                has_index: true,
            };
            write_index(storage, &files, &index_bytes(entries)).map_err(wrap)?;
        }
    }
    Ok(ActionDone {
        action: action.clone(),
        backups,
    })
}

/// FORMAT, Spares rule 1: `log` is renamed into `spares` under the next free spare
/// name, both directories are fsynced, then its header is re-stamped (base
/// `u64::MAX`, generation + 1) and the file fsynced.
fn return_to_spares(
    storage: &dyn Storage,
    partition_dir: &Path,
    log: &Path,
    spares: &Path,
) -> io::Result<()> {
    let mut next = 0u64;
    for entry in std::fs::read_dir(spares)? {
        let name = entry?.file_name();
        if let Some(seq) = name.to_str().and_then(parse_spare_file_name) {
            next = next.max(seq.saturating_add(1));
        }
    }
    let to = spares.join(spare_file_name(next));
    storage.rename(log, &to)?;
    storage.sync_dir(spares)?;
    storage.sync_dir(partition_dir)?;
    // A header that cannot be re-stamped here (it was checked as a spare's when the
    // plan was made) is left for the broker's startup, which removes such a file.
    crate::engine::partition::spares::restamp_file(storage, &to).map(drop)
}

/// Removes files (each backed up first, if asked), then fsyncs the directory.
/// A file already gone counts as removed (an earlier run got that far).
pub(super) fn remove_files(
    storage: &dyn Storage,
    dir: &Path,
    files: &[&Path],
    backup: Option<Backup<'_>>,
    backups: &mut Vec<PathBuf>,
) -> io::Result<()> {
    for &path in files {
        if !exists(path)? {
            continue;
        }
        // 1. backup, fsynced.
        if let Some(b) = backup {
            backups.push(b.copy(storage, path, 0, file_len(path), true)?);
        }
        // 2. remove.
        storage.remove_file(path)?;
    }
    // 3. the removals durable.
    storage.sync_dir(dir)
}

/// Cuts `log` at `from` (its length must still be `to`): backup of `from..to` if
/// asked, `set_len`, then `sync_all` before anything else may append.
pub(super) fn cut(
    storage: &dyn Storage,
    log: &Path,
    from: u64,
    to: u64,
    backup: Option<Backup<'_>>,
    backups: &mut Vec<PathBuf>,
) -> io::Result<()> {
    // Readers that map the sealed log hold it until they are done (no SIGBUS).
    let _cut_lock = crate::engine::storage::map::lock_log_for_cut(log)?;
    let f = storage.open(log)?;
    let len = f.len()?;
    if len == from {
        // Cut by an earlier run whose fsync may not have happened: fsync again.
        return f.sync_all();
    }
    if len != to {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {len} bytes, not the {to} bytes it had when the cut was planned; nothing cut",
                log.display()
            ),
        ));
    }
    // 1. backup of the range, fsynced.
    if let Some(b) = backup {
        backups.push(b.copy(storage, log, from, to, false)?);
    }
    // 2. truncate.
    if !planted!(SKIP_TORN_TAIL_TRUNCATE) {
        f.set_len(from)?;
    }
    // 3. fsync: the cut is durable before anything new is appended.
    f.sync_all()
}

/// Rewrites the group file `path` without its refused membership: 1. the whole file
/// backed up (if asked), fsynced; 2. the same group, generation, protocol type,
/// empty-since time and committed offsets, without membership (so as version 1),
/// written atomically (temporary file, fsync, rename, fsync of `groups/`). A file
/// already gone, or whose membership is no longer refused, is left as it is (an
/// earlier run got that far); one that no longer reads is an error.
pub(super) fn rewrite_group_file(
    storage: &dyn Storage,
    path: &Path,
    backup: Option<Backup<'_>>,
    backups: &mut Vec<PathBuf>,
) -> io::Result<()> {
    use crate::engine::groups::offsets::{read_group_file, GroupFileProblem};
    use crate::engine::storage::io::write_file_atomic;
    use crate::format::group::{encode_group_file, group_file_name, GroupFile};
    let (group, l) = match read_group_file(path) {
        Ok(x) => x,
        Err(GroupFileProblem::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
    };
    if l.membership_problem.is_none() {
        return Ok(());
    }
    // 1.
    if let Some(b) = backup {
        backups.push(b.copy(storage, path, 0, file_len(path), true)?);
    }
    // 2.
    let file = GroupFile {
        version: GroupFile::version_for(None),
        generation: l.generation,
        protocol_type: l.protocol_type,
        empty_since_ms: l.empty_since_ms,
        offsets: l.offsets,
        membership: None,
        group,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    write_file_atomic(
        storage,
        dir,
        &group_file_name(&file.group),
        &encode_group_file(&file),
    )
}
