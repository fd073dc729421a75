//! The active segment's index file. A roll onto a spare creates no file under the
//! write lock: the roll's group commit creates `<base>.index` (with the rename of the
//! spare to `<base>.log`) before it fsyncs the directory. Until then the index bytes
//! the writer appends are kept in memory and written to the file when it is
//! installed.
//!
//! Invariants:
//! - Every write and length change happens under the log's write lock, and so does
//!   [`ActiveIndex::install`]: the bytes kept before the file existed and the writes
//!   after reach the file in order, at their positions.
//! - The kept bytes are at most the index of one segment (16 bytes per 4 KiB of
//!   data), and only until the next group commit.

use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use super::lock;
use crate::engine::storage::io::StorageFile;

#[derive(Debug, Default)]
pub(super) struct ActiveIndex {
    file: OnceLock<Arc<dyn StorageFile>>,
    /// The index's bytes while its file does not exist yet.
    early: Mutex<Vec<u8>>,
}

impl ActiveIndex {
    /// An index whose file exists.
    pub(super) fn open(file: Arc<dyn StorageFile>) -> Self {
        let index = ActiveIndex::default();
        let _ = index.file.set(file);
        index
    }

    /// An index whose file the roll's group commit creates.
    pub(super) fn later() -> Self {
        ActiveIndex::default()
    }

    /// The file, once it exists.
    pub(super) fn file(&self) -> Option<&Arc<dyn StorageFile>> {
        self.file.get()
    }

    /// Writes `bytes` at `pos` (the index's length: appends only).
    pub(super) fn write_at(&self, bytes: &[u8], pos: u64) -> io::Result<()> {
        if let Some(f) = self.file.get() {
            return f.write_at(bytes, pos);
        }
        let mut early = lock(&self.early);
        let at = usize::try_from(pos).map_err(|_| io::Error::other("index position too large"))?;
        if at > early.len() {
            return Err(io::Error::other(format!(
                "index write at {pos} past its end {}",
                early.len()
            )));
        }
        early.truncate(at);
        early.extend_from_slice(bytes);
        Ok(())
    }

    /// Cuts the index to `len` bytes.
    pub(super) fn set_len(&self, len: u64) -> io::Result<()> {
        if let Some(f) = self.file.get() {
            return f.set_len(len);
        }
        let mut early = lock(&self.early);
        let keep = usize::try_from(len).unwrap_or(usize::MAX);
        early.truncate(keep);
        Ok(())
    }

    /// Makes `file` (new and empty) the index: writes the bytes kept so far to it.
    /// The caller holds the log's write lock. Nothing is fsynced here.
    pub(super) fn install(&self, file: Arc<dyn StorageFile>) -> io::Result<()> {
        if self.file.get().is_some() {
            return Err(io::Error::other("the index file exists already"));
        }
        let mut early = lock(&self.early);
        if !early.is_empty() {
            file.write_at(&early, 0)?;
        }
        early.clear();
        early.shrink_to_fit();
        self.file
            .set(file)
            .map_err(|_| io::Error::other("the index file exists already"))
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::engine::storage::io::{RealStorage, Storage};

    #[test]
    fn bytes_kept_before_the_file_reach_it_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.index");
        let index = ActiveIndex::later();
        index.write_at(&[1; 16], 0).unwrap();
        index.write_at(&[2; 16], 16).unwrap();
        // A failed write is cut back.
        index.write_at(&[9; 16], 32).unwrap();
        index.set_len(32).unwrap();
        assert!(index.write_at(&[3; 16], 48).is_err(), "a hole is refused");
        index.write_at(&[3; 16], 32).unwrap();
        let file: Arc<dyn StorageFile> = Arc::from(RealStorage.create(&path).unwrap());
        index.install(file.clone()).unwrap();
        assert!(index.install(file).is_err(), "installed once");
        index.write_at(&[4; 16], 48).unwrap();
        let got = std::fs::read(&path).unwrap();
        let want: Vec<u8> = [1u8, 2, 3, 4].iter().flat_map(|b| [*b; 16]).collect();
        assert_eq!(got, want);
    }
}
