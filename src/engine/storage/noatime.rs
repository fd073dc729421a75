//! Opening files and listing directories for reading without changing their access
//! times: the read-only tools (`verify`, `dump`, `reindex --check`, `recover
//! --dry-run`, `compact --dry-run`) change no byte and no timestamp, and on a
//! `relatime` mount a plain read or directory listing may update the atime.
//!
//! Everything is opened with `O_NOATIME`. The kernel allows that flag only to the
//! file's owner or a process with `CAP_FOWNER`, and refuses it to anyone else with
//! `EPERM`; the open is then made again without it, since a user who does not own a
//! file has no way to read it without the kernel possibly updating its atime (the
//! mount's `noatime` or `relatime` options decide). The files of a data directory are
//! owned by the user the broker runs as: read as that user (or as root), none of their
//! atimes changes.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub use rustix::fs::FileType;

/// Opens `path` read-only without changing its access time (see the module's
/// documentation for the files of other users).
pub fn open_read(path: &Path) -> io::Result<File> {
    open_read_with(path, 0)
}

/// [`open_read`] with further `open(2)` flags (`O_NONBLOCK`, `O_DIRECTORY`). With
/// `O_NOATIME` refused (`EPERM`: the process neither owns the file nor has
/// `CAP_FOWNER`), it opens again without it: the best a reader who does not own the
/// file can do.
pub fn open_read_with(path: &Path, flags: i32) -> io::Result<File> {
    let open = |more: i32| {
        OpenOptions::new()
            .read(true)
            .custom_flags(flags | more)
            .open(path)
    };
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        other => other,
    }
}

/// Reads a whole file, as `std::fs::read`, without changing its access time.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open_read(path)?;
    let hint = file
        .metadata()
        .ok()
        .and_then(|m| usize::try_from(m.len()).ok());
    let mut bytes = Vec::new();
    if let Some(n) = hint {
        bytes.try_reserve_exact(n)?;
    }
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Lists a directory, as `std::fs::read_dir` (without `.` and `..`, in the order the
/// file system gives), without changing its access time.
pub fn read_dir(path: &Path) -> io::Result<ReadDir> {
    let file = open_read_with(path, libc::O_DIRECTORY)?;
    let dir = rustix::fs::Dir::new(file)?;
    Ok(ReadDir {
        dir,
        path: path.to_path_buf(),
    })
}

/// The entries of a directory listed by [`read_dir`].
#[derive(Debug)]
pub struct ReadDir {
    dir: rustix::fs::Dir,
    path: PathBuf,
}

impl Iterator for ReadDir {
    type Item = io::Result<DirEntry>;

    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        loop {
            let entry = match self.dir.read()? {
                Ok(e) => e,
                Err(e) => return Some(Err(e.into())),
            };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            return Some(Ok(DirEntry {
                path: self.path.join(std::ffi::OsStr::from_bytes(name)),
                file_type: entry.file_type(),
            }));
        }
    }
}

/// One entry of a [`ReadDir`].
#[derive(Clone, Debug)]
pub struct DirEntry {
    path: PathBuf,
    file_type: FileType,
}

impl DirEntry {
    /// The entry's full path: the listed directory joined with its name.
    pub fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The entry's name.
    pub fn file_name(&self) -> OsString {
        self.path
            .file_name()
            .map(OsString::from)
            .unwrap_or_default()
    }

    /// The entry's type, not following a symbolic link. From the listing when the file
    /// system gives it, else from an `lstat` of the entry.
    pub fn file_type(&self) -> io::Result<FileType> {
        if self.file_type != FileType::Unknown {
            return Ok(self.file_type);
        }
        let meta = std::fs::symlink_metadata(&self.path)?;
        Ok(FileType::from_raw_mode(meta.mode()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_reads_like_std() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"bytes").unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let mut got: Vec<(OsString, FileType)> = read_dir(dir.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                assert_eq!(e.path(), dir.path().join(e.file_name()));
                (e.file_name(), e.file_type().unwrap())
            })
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            vec![
                ("a".into(), FileType::RegularFile),
                ("d".into(), FileType::Directory)
            ]
        );
        assert_eq!(read(&dir.path().join("a")).unwrap(), b"bytes");
        assert_eq!(
            read(&dir.path().join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(read_dir(&dir.path().join("a")).is_err());
    }
}
