//! The swap (docs/FORMAT.md, Compaction): the marker made durable first, then the
//! results renamed into place, the replaced segments removed, the marker removed, each
//! step numbered where it is performed. Recovery finishes an interrupted swap with
//! [`finish_compaction_marker`].

use super::*;
use crate::engine::maintenance::backup::Backup;
use crate::engine::maintenance::{exists, file_len};
use crate::format::names::segment_stem;

/// The result of both passes and step 1: new segments durable in their temporary
/// files, waiting for the swap. Dropping it without [`PreparedCompaction::swap`]
/// removes the temporary files.
#[derive(Debug)]
pub struct PreparedCompaction<'a> {
    pub(super) storage: &'a dyn Storage,
    pub(super) dir: PathBuf,
    pub(super) report: CompactionReport,
    pub(super) temp_files: Vec<PathBuf>,
}

impl<'a> PreparedCompaction<'a> {
    /// A swap that replaces the one segment `base` by a file of the same name,
    /// already durable in its temporary files `temp_files` (`<name>.log.tmp` and
    /// `<name>.index.tmp`, their directory fsynced): a mend
    /// ([`crate::engine::maintenance::mend`]). Its marker names `base` as both
    /// replaced and new.
    pub(crate) fn replacing_one(
        storage: &'a dyn Storage,
        dir: PathBuf,
        base: u64,
        bytes_before: u64,
        bytes_after: u64,
        temp_files: Vec<PathBuf>,
    ) -> Self {
        PreparedCompaction {
            storage,
            dir,
            report: CompactionReport {
                bytes_before,
                bytes_after,
                segments_before: 1,
                segments_after: 1,
                replaced: vec![base],
                new: vec![base],
                ..CompactionReport::default()
            },
            temp_files,
        }
    }

    /// The counts, as they will be once swapped.
    pub fn report(&self) -> &CompactionReport {
        &self.report
    }

    /// Base offsets of the sealed segments that were read, ascending: step 2 checks
    /// the partition's sealed segments are still exactly these.
    pub fn replaced(&self) -> &[u64] {
        &self.report.replaced
    }

    /// True when there is something to swap (not skipped, not a dry run).
    pub fn needs_swap(&self) -> bool {
        !self.report.skipped && !self.report.dry_run
    }

    /// The report, with nothing swapped (for skipped and dry runs); removes any
    /// temporary files.
    pub fn into_report(mut self) -> CompactionReport {
        self.remove_temp_files();
        std::mem::take(&mut self.report)
    }

    /// Cancels the swap: removes the temporary files.
    pub fn cancel(mut self) -> io::Result<()> {
        self.remove_temp_files_checked()
    }

    pub(super) fn remove_temp_files(&mut self) {
        let _ = self.remove_temp_files_checked();
    }

    pub(super) fn remove_temp_files_checked(&mut self) -> io::Result<()> {
        let mut first_err = None;
        for path in std::mem::take(&mut self.temp_files) {
            match self.storage.remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Steps 3 and 4 of the swap. The caller has done step 2 (checked, under the
    /// partition's write lock, that the sealed segments are still
    /// [`PreparedCompaction::replaced`]) and holds that lock until this returns.
    /// `publish` gets the new segments' base offsets once they are in place.
    pub fn swap(
        self,
        publish: &mut dyn FnMut(&[u64]),
    ) -> Result<CompactionReport, CompactionError> {
        self.swap_keeping(publish, &Kept::default())
    }

    /// [`PreparedCompaction::swap`] where the logs of the replaced segments named in
    /// `kept` are moved out of the partition directory (to become spares) instead of
    /// being deleted: in step 4, after the marker is durable and before the results
    /// are renamed into place (a result may take a replaced segment's name), and made
    /// durable by step 4's directory fsync, followed by one of `kept.dir`, before the
    /// marker goes. Every record of a moved log is in the results, which are durable
    /// since step 1, so a crash at any point loses nothing: recovery finishes the
    /// marker as for any swap.
    pub fn swap_keeping(
        mut self,
        publish: &mut dyn FnMut(&[u64]),
        kept: &Kept,
    ) -> Result<CompactionReport, CompactionError> {
        assert!(self.needs_swap(), "swap of a skipped or dry compaction");
        let storage = self.storage;
        let dir = self.dir.clone();
        let marker = CompactionMarker {
            new: self.report.new.clone(),
            replaced: self.report.replaced.clone(),
        };
        // 3. Write compaction.marker, fsync it and the directory (temporary file,
        //    fsync, rename, directory fsync: the marker is whole or absent). From
        //    here a crash is finished at the next start.
        let marker_path = dir.join(COMPACTION_MARKER);
        if planted!(RENAME_BEFORE_MARKER) {
            let _ = finish_compaction_marker(storage, &dir, &marker);
        }
        if planted!(KEEP_BEFORE_MARKER) {
            let _ = move_kept(storage, &dir, &marker, kept, &mut MarkerFinish::default());
        }
        if let Err(e) = write_file_atomic(storage, &dir, COMPACTION_MARKER, &marker.encode()) {
            if marker_path.exists() {
                // The marker is in place (perhaps not durable): the temporary files
                // must stay for the recovery that finishes it.
                self.temp_files.clear();
                return Err(CompactionError::Interrupted { dir, source: e });
            }
            self.remove_temp_files();
            return Err(CompactionError::Io {
                path: marker_path,
                source: e,
            });
        }
        // From here on the temporary files belong to the marker.
        self.temp_files.clear();
        // 4. Rename the results into place (a new segment may take a replaced one's
        //    name), delete the replaced segments whose names are not new, fsync the
        //    directory, delete the marker, fsync the directory: the one function that
        //    recovery also uses. Then publish the new segment list.
        //    The list is published after the marker is gone rather than just before:
        //    publishing is in memory, so the order cannot be seen on disk, and this
        //    way the swap and its recovery share a single finishing function.
        finish_marker_keeping(storage, &dir, &marker, None, kept)
            .map_err(|source| CompactionError::Interrupted { dir, source })?;
        publish(&self.report.new);
        Ok(std::mem::take(&mut self.report))
    }
}

impl Drop for PreparedCompaction<'_> {
    fn drop(&mut self) {
        self.remove_temp_files();
    }
}
/// What finishing a compaction marker did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkerFinish {
    /// Temporary files renamed into place (`from`, `to`).
    pub renamed: Vec<(PathBuf, PathBuf)>,
    /// Replaced segment files deleted.
    pub removed: Vec<PathBuf>,
    /// Files copied to the backup directory first.
    pub backups: Vec<PathBuf>,
    /// Replaced segment logs moved out instead of deleted (`from`, `to`), see
    /// [`PreparedCompaction::swap_keeping`].
    pub kept: Vec<(PathBuf, PathBuf)>,
}

/// Replaced segment logs a swap moves out of the partition directory instead of
/// deleting them: (base offset, new path), all in `dir`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The directory they go to (fsynced once they are there).
    pub dir: Option<PathBuf>,
    pub logs: Vec<(u64, PathBuf)>,
}

/// Step 4a of [`PreparedCompaction::swap_keeping`]: moves each kept log that is still
/// in the partition directory, replaced and present, to its new path.
fn move_kept(
    storage: &dyn Storage,
    dir: &Path,
    marker: &CompactionMarker,
    kept: &Kept,
    out: &mut MarkerFinish,
) -> io::Result<()> {
    for (base, to) in kept
        .logs
        .iter()
        .filter(|(b, _)| marker.replaced.contains(b))
    {
        let from = dir.join(log_file_name(*base));
        if !exists(&from)? {
            continue;
        }
        storage.rename(&from, to)?;
        out.kept.push((from, to.clone()));
    }
    Ok(())
}

/// Finishes the compaction swap `marker` records in `partition_dir` (docs/FORMAT.md,
/// Compaction). Idempotent: a crash at any point is finished by calling it again.
pub fn finish_compaction_marker(
    storage: &dyn Storage,
    partition_dir: &Path,
    marker: &CompactionMarker,
) -> io::Result<MarkerFinish> {
    finish_marker_with(storage, partition_dir, marker, None)
}

pub(crate) fn finish_marker_with(
    storage: &dyn Storage,
    dir: &Path,
    marker: &CompactionMarker,
    backup: Option<Backup<'_>>,
) -> io::Result<MarkerFinish> {
    finish_marker_keeping(storage, dir, marker, backup, &Kept::default())
}

/// Finishing a marker, with the replaced logs in `kept` moved out rather than
/// deleted (see [`PreparedCompaction::swap_keeping`]).
fn finish_marker_keeping(
    storage: &dyn Storage,
    dir: &Path,
    marker: &CompactionMarker,
    backup: Option<Backup<'_>>,
    kept: &Kept,
) -> io::Result<MarkerFinish> {
    let mut out = MarkerFinish::default();
    // Before anything is renamed: every new segment's log must be somewhere, or
    // deleting the replaced ones would lose their records.
    for &n in &marker.new {
        let log = dir.join(log_file_name(n));
        let tmp = passes::tmp_path(dir, &log_file_name(n));
        if !exists(&tmp)? && !exists(&log)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "compaction marker in {} names new segment {} but neither {} nor its .tmp exists; nothing done",
                    dir.display(),
                    segment_stem(n),
                    log.display()
                ),
            ));
        }
    }
    // 0. move the kept logs out, before a result may take a replaced one's name.
    move_kept(storage, dir, marker, kept, &mut out)?;
    // 1. rename what is still temporary (log first, then its index).
    for &n in &marker.new {
        for name in [log_file_name(n), index_file_name(n)] {
            let from = passes::tmp_path(dir, &name);
            let to = dir.join(name);
            if !exists(&from)? {
                continue;
            }
            if let Some(b) = backup {
                if exists(&to)? {
                    out.backups
                        .push(b.copy(storage, &to, 0, file_len(&to), true)?);
                }
            }
            storage.rename(&from, &to)?;
            out.renamed.push((from, to));
        }
    }
    // 2. delete what is still replaced and not new.
    for &r in marker.replaced.iter().filter(|r| !marker.new.contains(r)) {
        for name in [index_file_name(r), log_file_name(r)] {
            let path = dir.join(name);
            if !exists(&path)? {
                continue;
            }
            if let Some(b) = backup {
                out.backups
                    .push(b.copy(storage, &path, 0, file_len(&path), true)?);
            }
            storage.remove_file(&path)?;
            out.removed.push(path);
        }
    }
    // 3. fsync the directory: renames and deletions are durable (and the directory
    //    the kept logs went to: both sides of their renames).
    storage.sync_dir(dir)?;
    if let (Some(to), false) = (&kept.dir, out.kept.is_empty()) {
        storage.sync_dir(to)?;
    }
    // 4. delete the marker.
    let marker_path = dir.join(crate::format::names::COMPACTION_MARKER);
    if exists(&marker_path)? {
        storage.remove_file(&marker_path)?;
    }
    // 5. fsync the directory.
    storage.sync_dir(dir)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::storage::io::RealStorage;
    use crate::format::names::{index_file_name, log_file_name};
    use crate::format::{encode_record, SegmentHeader};

    fn segment(base: u64, n: u64) -> (Vec<u8>, Vec<u8>) {
        let mut log = SegmentHeader::new(base).encode().to_vec();
        let mut b = crate::format::IndexBuilder::new();
        let mut idx = Vec::new();
        for o in base..base + n {
            let pos = log.len() as u64;
            encode_record(&mut log, o, 0, None, &[7u8; 300], 0).unwrap();
            if let Some(e) = b.observe(base, o, pos) {
                e.encode_into(&mut idx);
            }
        }
        (log, idx)
    }

    #[test]
    fn marker_finish_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (old0, old0i) = segment(0, 10);
        let (old1, old1i) = segment(10, 10);
        let (new0, new0i) = segment(0, 20);
        std::fs::write(d.join(log_file_name(0)), &old0).unwrap();
        std::fs::write(d.join(index_file_name(0)), &old0i).unwrap();
        std::fs::write(d.join(log_file_name(10)), &old1).unwrap();
        std::fs::write(d.join(index_file_name(10)), &old1i).unwrap();
        std::fs::write(d.join(tmp_file_name(&log_file_name(0))), &new0).unwrap();
        std::fs::write(d.join(tmp_file_name(&index_file_name(0))), &new0i).unwrap();
        let m = CompactionMarker {
            new: vec![0],
            replaced: vec![0, 10],
        };
        std::fs::write(d.join(COMPACTION_MARKER), m.encode()).unwrap();
        let f = finish_compaction_marker(&RealStorage, d, &m).unwrap();
        assert_eq!(f.renamed.len(), 2);
        assert_eq!(f.removed.len(), 2);
        let again = finish_compaction_marker(&RealStorage, d, &m).unwrap();
        assert_eq!(again, MarkerFinish::default());
        let mut names: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, vec![index_file_name(0), log_file_name(0)]);
        assert_eq!(std::fs::read(d.join(log_file_name(0))).unwrap(), new0);
    }

    #[test]
    fn marker_naming_a_missing_new_segment_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (old0, _) = segment(0, 10);
        std::fs::write(d.join(log_file_name(5)), &old0).unwrap();
        let m = CompactionMarker {
            new: vec![0],
            replaced: vec![5],
        };
        assert!(finish_compaction_marker(&RealStorage, d, &m).is_err());
        assert!(d.join(log_file_name(5)).exists());
    }
}
