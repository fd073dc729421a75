//! `DATA/LOCK`: an exclusive `flock` held by the broker and by every tool that
//! modifies a data directory. Read-only tools never take it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::format::names::LOCK_FILE;

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    #[error("{path} is locked by a running broker or another tool")]
    Held { path: PathBuf },
    #[error("cannot open lock file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// The held lock; released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

/// How long [`DirLock::acquire`] keeps trying a held lock, and in how many tries.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);
const LOCK_TRIES: u32 = 25;

impl DirLock {
    /// Whether `data_dir/LOCK` is held now (by a running broker, or a tool that
    /// changes the directory), tested without taking it for longer than the test
    /// and without creating it. `false` when it cannot be told (no `LOCK`).
    pub fn is_held(data_dir: &Path) -> bool {
        let Ok(file) = super::noatime::open_read(&data_dir.join(LOCK_FILE)) else {
            return false;
        };
        matches!(
            rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK
        )
    }

    /// Takes `data_dir/LOCK` exclusively, waiting at most `LOCK_PATIENCE`. The lock file is created
    /// (mode 0600) if missing; it holds no data, so it is not a storage mutation.
    pub fn acquire(data_dir: &Path) -> Result<DirLock, LockError> {
        let path = data_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(crate::engine::storage::io::FILE_MODE)
            .open(&path)
            .map_err(|source| LockError::Io {
                path: path.clone(),
                source,
            })?;
        // A lock just released can still be held for a moment by a child process this
        // process forked and has not yet exec'd (it shares the open file until exec):
        // try a few times over `LOCK_PATIENCE` before saying the directory is held.
        let mut tries = 0;
        loop {
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(DirLock { _file: file, path }),
                Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                    tries += 1;
                    if tries >= LOCK_TRIES {
                        return Err(LockError::Held { path });
                    }
                    std::thread::sleep(LOCK_PATIENCE / LOCK_TRIES);
                }
                Err(e) => {
                    return Err(LockError::Io {
                        path,
                        source: e.into(),
                    })
                }
            }
        }
    }

    /// Path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        assert!(matches!(
            DirLock::acquire(dir.path()),
            Err(LockError::Held { .. })
        ));
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
