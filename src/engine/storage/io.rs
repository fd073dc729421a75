//! The I/O seam: every file-system mutation the engine makes goes through
//! [`Storage`] and [`StorageFile`], so tests can fail any call or simulate a disk
//! that loses what was not yet synced. Reads of sealed data may use `std::fs`
//! directly; nothing that changes a byte, a name or a length may.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Mode of every file the engine creates.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory the engine creates.
pub const DIR_MODE: u32 = 0o700;

/// A file opened for writing through the seam.
#[expect(
    clippy::len_without_is_empty,
    reason = "a file length is an I/O call, not a collection size"
)]
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Writes all of `buf` at `pos`.
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// Reads up to `buf.len()` bytes at `pos`; returns the count read.
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves blocks up to `len` bytes without changing the visible length.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self) -> io::Result<()>;
    /// fsync.
    fn sync_all(&self) -> io::Result<()>;
    /// Current length.
    fn len(&self) -> io::Result<u64>;
}

/// The file-system operations on names and directories.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates a new file (mode 0600); fails if it exists.
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Creates a directory and its missing parents (mode 0700).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything below it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// fsyncs a directory, making creates, renames and removals in it durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
}

/// Shared handle to a storage implementation.
pub type StorageRef = Arc<dyn Storage>;

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealStorage;

/// A real file.
#[derive(Debug)]
pub struct RealFile {
    file: File,
}

impl RealFile {
    /// The underlying file, for reads.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl StorageFile for RealFile {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.file.write_all_at(buf, pos)
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.file.read_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len)
            .map_err(io::Error::from)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

impl Storage for RealStorage {
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(path)?;
        Ok(Box::new(RealFile { file }))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(RealFile { file }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
}

/// Replaces `dir/name` atomically with `bytes`:
/// 1. write a unique temporary file in `dir`, 2. fsync it, 3. rename it over `name`,
/// 4. fsync `dir`. A crash leaves the old or the new content, never a mix.
pub fn write_file_atomic(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(crate::format::names::atomic_tmp_file_name(
        name,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
    ));
    let result = (|| {
        // 1.
        let f = storage.create(&tmp)?;
        f.write_at(bytes, 0)?;
        // 2.
        f.sync_all()?;
        drop(f);
        // 3.
        storage.rename(&tmp, &dir.join(name))?;
        // 4.
        if planted!(SKIP_ATOMIC_DIR_FSYNC) {
            return Ok(());
        }
        storage.sync_dir(dir)
    })();
    if result.is_err() && tmp.exists() {
        let _ = storage.remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn modes_and_atomic_replace() {
        let dir = tempfile::tempdir().unwrap();
        let s = RealStorage;
        let sub = dir.path().join("a/b");
        s.create_dir_all(&sub).unwrap();
        assert_eq!(
            fs::metadata(&sub).unwrap().permissions().mode() & 0o777,
            0o700
        );
        write_file_atomic(&s, &sub, "x.json", b"one").unwrap();
        write_file_atomic(&s, &sub, "x.json", b"two").unwrap();
        assert_eq!(fs::read(sub.join("x.json")).unwrap(), b"two");
        assert_eq!(
            fs::metadata(sub.join("x.json"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        assert_eq!(fs::read_dir(&sub).unwrap().count(), 1);
    }
}
