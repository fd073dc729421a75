//! The I/O seam: every file-system mutation the engine makes goes through
//! [`Storage`] and [`StorageFile`], so tests can fail any call or simulate a disk
//! that loses what was not yet synced. Reads of sealed data may use `std::fs`
//! directly; nothing that changes a byte, a name or a length may.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
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

/// Which mutations a [`FailingStorage`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailOn {
    /// Every mutation: create, write_at, set_len, allocate, sync_*, rename, remove, create_dir.
    Any,
    /// Only sync_data, sync_all and sync_dir.
    Sync,
}

/// The kind of a mutation, as counted by [`FailingStorage`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    Open,
    CreateDir,
    Rename,
    Remove,
    WriteAt,
    SetLen,
    Allocate,
    SyncData,
    SyncAll,
    SyncDir,
}

impl Op {
    fn is_sync(self) -> bool {
        matches!(self, Op::SyncData | Op::SyncAll | Op::SyncDir)
    }
    fn is_mutation(self) -> bool {
        !matches!(self, Op::Open)
    }
}

#[derive(Debug)]
struct FailState {
    calls: AtomicU64,
    fail_at: u64,
    fail_on: FailOn,
    /// After the chosen call fails, fail every later one too (the process "died").
    sticky: bool,
    failed: AtomicU64,
    kind: io::ErrorKind,
}

impl FailState {
    fn check(&self, op: Op, what: &Path) -> io::Result<()> {
        let counted = op.is_mutation() && (self.fail_on == FailOn::Any || op.is_sync());
        if !counted {
            return Ok(());
        }
        if self.sticky && self.failed.load(Ordering::SeqCst) > 0 {
            return Err(io::Error::new(
                self.kind,
                format!(
                    "injected failure after call {} ({op:?} {})",
                    self.fail_at,
                    what.display()
                ),
            ));
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::new(
                self.kind,
                format!("injected failure of call {n} ({op:?} {})", what.display()),
            ));
        }
        Ok(())
    }
}

/// Storage that fails the Nth counted mutation with a chosen error (and, if sticky,
/// every one after it). Counts start at 1.
#[derive(Debug, Clone)]
pub struct FailingStorage {
    inner: StorageRef,
    state: Arc<FailState>,
}

impl FailingStorage {
    /// Fails call number `fail_at` (1-based) of the kind `fail_on`.
    pub fn new(inner: StorageRef, fail_at: u64, fail_on: FailOn, sticky: bool) -> Self {
        FailingStorage {
            inner,
            state: Arc::new(FailState {
                calls: AtomicU64::new(0),
                fail_at,
                fail_on,
                sticky,
                failed: AtomicU64::new(0),
                kind: io::ErrorKind::Other,
            }),
        }
    }

    /// Counted calls made so far.
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::SeqCst)
    }

    /// Whether the injected failure has happened.
    pub fn has_failed(&self) -> bool {
        self.state.failed.load(Ordering::SeqCst) > 0
    }
}

#[derive(Debug)]
struct FailingFile {
    inner: Box<dyn StorageFile>,
    path: PathBuf,
    state: Arc<FailState>,
}

impl StorageFile for FailingFile {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.state.check(Op::WriteAt, &self.path)?;
        self.inner.write_at(buf, pos)
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.inner.read_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.state.check(Op::SetLen, &self.path)?;
        self.inner.set_len(len)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.state.check(Op::Allocate, &self.path)?;
        self.inner.allocate(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.state.check(Op::SyncData, &self.path)?;
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.state.check(Op::SyncAll, &self.path)?;
        self.inner.sync_all()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl Storage for FailingStorage {
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.state.check(Op::Create, path)?;
        let inner = self.inner.create(path)?;
        Ok(Box::new(FailingFile {
            inner,
            path: path.to_path_buf(),
            state: self.state.clone(),
        }))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.state.check(Op::Open, path)?;
        let inner = self.inner.open(path)?;
        Ok(Box::new(FailingFile {
            inner,
            path: path.to_path_buf(),
            state: self.state.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.state.check(Op::CreateDir, path)?;
        self.inner.create_dir_all(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.state.check(Op::Rename, from)?;
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.state.check(Op::Remove, path)?;
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.state.check(Op::Remove, path)?;
        self.inner.remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.state.check(Op::SyncDir, path)?;
        self.inner.sync_dir(path)
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
        if crate::testkit::planted::SKIP_ATOMIC_DIR_FSYNC.load(std::sync::atomic::Ordering::Relaxed)
        {
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

    #[test]
    fn failing_storage_fails_the_nth_call() {
        let dir = tempfile::tempdir().unwrap();
        for n in 1..=5 {
            let s = FailingStorage::new(Arc::new(RealStorage), n, FailOn::Any, false);
            let r = write_file_atomic(&s, dir.path(), "m.json", b"new");
            assert!(r.is_err(), "call {n} should fail");
            assert!(s.has_failed());
        }
        let s = FailingStorage::new(Arc::new(RealStorage), 6, FailOn::Any, false);
        write_file_atomic(&s, dir.path(), "m.json", b"new").unwrap();
        assert!(!s.has_failed());
        let s = FailingStorage::new(Arc::new(RealStorage), 1, FailOn::Sync, false);
        assert!(write_file_atomic(&s, dir.path(), "m.json", b"x").is_err());
        assert_eq!(fs::read(dir.path().join("m.json")).unwrap(), b"new");
    }
}
