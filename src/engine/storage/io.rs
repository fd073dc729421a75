//! The I/O seam: every file-system mutation the engine makes goes through
//! [`Storage`] and [`StorageFile`], so tests can fail any call or simulate a disk
//! that loses what was not yet synced. Reads of sealed data may use `std::fs`
//! directly; nothing that changes a byte, a name or a length may.
//!
//! Fault injection for tests of whole processes: `SEGLOG_FAULT_FSYNC_FAIL=SUBSTR:N`
//! (read once, on the first file opened) makes the N-th and every later fsync, counted
//! over all files and directories whose path contains `SUBSTR`, fail with EIO on
//! [`RealStorage`]. Unset, or not of that form, it has no effect.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

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

/// The environment variable of the fsync fault ([`FsyncFault`]).
pub const FAULT_FSYNC_ENV: &str = "SEGLOG_FAULT_FSYNC_FAIL";

/// A test aid for whole processes: the `from_n`-th and every later fsync of a path
/// containing `needle` (counted together over all such paths) fails with EIO.
#[derive(Debug)]
pub struct FsyncFault {
    needle: String,
    from_n: u64,
    seen: AtomicU64,
}

impl FsyncFault {
    /// Parses `SUBSTR:N` (N at least 1; the last `:` separates, so the substring may
    /// hold colons). `None` for anything else.
    pub fn parse(spec: &str) -> Option<FsyncFault> {
        let (needle, n) = spec.rsplit_once(':')?;
        let from_n: u64 = n.parse().ok()?;
        if needle.is_empty() || from_n == 0 {
            return None;
        }
        Some(FsyncFault {
            needle: needle.to_string(),
            from_n,
            seen: AtomicU64::new(0),
        })
    }

    /// The fault of this process, from [`FAULT_FSYNC_ENV`], read once.
    fn global() -> Option<&'static FsyncFault> {
        static FAULT: OnceLock<Option<FsyncFault>> = OnceLock::new();
        FAULT
            .get_or_init(|| {
                let spec = std::env::var(FAULT_FSYNC_ENV).ok()?;
                let fault = FsyncFault::parse(&spec);
                match &fault {
                    Some(_) => tracing::warn!("fault injection on: {FAULT_FSYNC_ENV}={spec}"),
                    None => tracing::warn!("{FAULT_FSYNC_ENV}={spec} ignored: not SUBSTR:N"),
                }
                fault
            })
            .as_ref()
    }

    /// The process's fault if it applies to `path`.
    fn for_path(path: &Path) -> Option<&'static FsyncFault> {
        let fault = FsyncFault::global()?;
        fault.matches(path).then_some(fault)
    }

    /// True if `path` contains the substring.
    pub fn matches(&self, path: &Path) -> bool {
        path.to_string_lossy().contains(self.needle.as_str())
    }

    /// Counts one fsync of a matching path; EIO from the `from_n`-th on.
    pub fn on_sync(&self) -> io::Result<()> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.from_n {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

/// A real file.
#[derive(Debug)]
pub struct RealFile {
    file: File,
    /// The fsync fault, when it applies to this file's path.
    fault: Option<&'static FsyncFault>,
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
        if let Some(fault) = self.fault {
            fault.on_sync()?;
        }
        self.file.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        if let Some(fault) = self.fault {
            fault.on_sync()?;
        }
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
        let fault = FsyncFault::for_path(path);
        Ok(Box::new(RealFile { file, fault }))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let fault = FsyncFault::for_path(path);
        Ok(Box::new(RealFile { file, fault }))
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
        if let Some(fault) = FsyncFault::for_path(path) {
            fault.on_sync()?;
        }
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

    #[test]
    fn fsync_fault_spec() {
        assert!(FsyncFault::parse("topics/t/0:3").is_some_and(|f| f.from_n == 3));
        let colon = FsyncFault::parse("a:b:2").unwrap();
        assert_eq!((colon.needle.as_str(), colon.from_n), ("a:b", 2));
        for bad in ["", "x", "x:", ":1", "x:0", "x:-1", "x:one"] {
            assert!(FsyncFault::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn fsync_fault_fails_the_nth_and_later_syncs_of_matching_files() {
        let dir = tempfile::tempdir().unwrap();
        let fault: &'static FsyncFault = Box::leak(Box::new(FsyncFault::parse("hit:2").unwrap()));
        let open = |name: &str| {
            let path = dir.path().join(name);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .unwrap();
            RealFile {
                file,
                fault: fault.matches(&path).then_some(fault),
            }
        };
        let hit = open("hit.log");
        let other = open("miss.log");
        assert!(other.fault.is_none());
        hit.write_at(b"x", 0).unwrap();
        hit.sync_data().unwrap();
        let err = hit.sync_all().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert_eq!(hit.sync_data().unwrap_err().raw_os_error(), Some(libc::EIO));
        // Another matching file shares the count: already past the second sync.
        let hit2 = open("hit2.log");
        assert!(hit2.sync_data().is_err());
        // Files that do not match are untouched.
        other.write_at(b"y", 0).unwrap();
        for _ in 0..4 {
            other.sync_data().unwrap();
            other.sync_all().unwrap();
        }
    }
}
