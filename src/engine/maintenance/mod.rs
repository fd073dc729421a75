//! The analyses and repairs shared by the offline tools and by broker startup: the
//! one partition check ([`check`]), index rebuilding ([`reindex`]), crash recovery
//! ([`recovery`]), log compaction ([`compaction`]), salvage ([`salvage`]) and the
//! mend of a replica's damaged or lost segment with its peers' records ([`mend`]).
//! There is one implementation of each; `seglog recover` runs what `serve` runs at
//! startup, `seglog compact` what the background task runs.

pub mod backup;
pub mod check;
pub mod compaction;
pub mod mend;
pub mod recovery;
pub mod reindex;
pub mod salvage;
pub mod state;

use std::io;
use std::path::Path;

/// Length of the file at `path`, or 0 when it cannot be read.
pub(crate) fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Whether anything (a file, a directory, a dangling link) is at `path`.
pub(crate) fn exists(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}
