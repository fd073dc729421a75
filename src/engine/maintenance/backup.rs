//! Backups of what recovery (and the finishing of an interrupted compaction swap)
//! removes or cuts, so an operator can inspect or restore it:
//! `<backup>/<relative path>.bytes-<from>-<to>` and whole files by name, all fsynced.

use std::io;
use std::path::{Path, PathBuf};

use std::fs::File;

use crate::engine::storage::io::Storage;
use crate::engine::storage::reader::read_full_at;

/// Bytes copied per read/write when backing up.
const BACKUP_CHUNK_BYTES: usize = 1024 * 1024;
/// Most numbered variants tried for a backup file name that already exists.
const BACKUP_NAME_TRIES_MAX: u32 = 10_000;

/// Where backups go: `<backup_dir>/<path relative to root>`, byte ranges as
/// `<file>.bytes-<from>-<to>`.
#[derive(Debug, Clone, Copy)]
pub struct Backup<'a> {
    pub dir: &'a Path,
    pub root: &'a Path,
}

impl Backup<'_> {
    fn target_for(&self, src: &Path, suffix: &str) -> PathBuf {
        let rel = src
            .strip_prefix(self.root)
            .unwrap_or_else(|_| Path::new(src.file_name().unwrap_or(src.as_os_str())));
        let mut name = rel.as_os_str().to_os_string();
        name.push(suffix);
        self.dir.join(name)
    }

    /// Copies `src[from..to]` into the backup directory and fsyncs it (file and
    /// directories); returns the backup's path. An error names the backup directory:
    /// the file being repaired is not what failed.
    pub fn copy(
        &self,
        storage: &dyn Storage,
        src: &Path,
        from: u64,
        to: u64,
        whole: bool,
    ) -> io::Result<PathBuf> {
        self.copy_into(storage, src, from, to, whole).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot write the backup in {}: {e}", self.dir.display()),
            )
        })
    }

    fn copy_into(
        &self,
        storage: &dyn Storage,
        src: &Path,
        from: u64,
        to: u64,
        whole: bool,
    ) -> io::Result<PathBuf> {
        let suffix = if whole {
            String::new()
        } else {
            format!(".bytes-{from}-{to}")
        };
        let want = self.target_for(src, &suffix);
        let parent = want.parent().unwrap_or(self.dir).to_path_buf();
        // 1. the directories, each made durable in its parent (the backup
        //    directory's own entry included).
        storage.create_dir_all(&parent)?;
        let mut d = parent.as_path();
        loop {
            storage.sync_dir(d)?;
            if d == self.dir {
                if let Some(up) = d.parent().filter(|u| !u.as_os_str().is_empty()) {
                    storage.sync_dir(up)?;
                }
                break;
            }
            match d.parent() {
                Some(up) if up.starts_with(self.dir) => d = up,
                _ => break,
            }
        }
        // 2. a name not taken yet (an earlier interrupted run may have made one).
        let mut path = want.clone();
        let mut n = 0u32;
        let out = loop {
            match storage.create(&path) {
                Ok(f) => break f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < BACKUP_NAME_TRIES_MAX => {
                    n += 1;
                    let mut s = want.as_os_str().to_os_string();
                    s.push(format!(".{n}"));
                    path = PathBuf::from(s);
                }
                Err(e) => return Err(e),
            }
        };
        // 3. the bytes.
        let file = File::open(src)?;
        let mut buf = vec![0u8; BACKUP_CHUNK_BYTES];
        let mut pos = from;
        while pos < to {
            let want_len = usize::try_from((to - pos).min(BACKUP_CHUNK_BYTES as u64))
                .unwrap_or(BACKUP_CHUNK_BYTES);
            let chunk = buf.get_mut(..want_len).unwrap_or(&mut []);
            let n = read_full_at(&file, chunk, pos)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: ends at {pos}, before {to}", src.display()),
                ));
            }
            out.write_at(chunk.get(..n).unwrap_or(&[]), pos - from)?;
            pos += n as u64;
        }
        // 4. the file, then its directory entry.
        out.sync_all()?;
        storage.sync_dir(&parent)?;
        Ok(path)
    }
}
