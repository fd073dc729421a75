//! A storage over the real file system that shows every call to a [`Hook`] first:
//! the hook may record it, delay it, or replace it with its own result (a failure, a
//! torn write). Counting failures of the Nth call stay with `FailingStorage`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use seglog::engine::storage::io::{RealStorage, Storage, StorageFile};

/// One call on a file opened through a [`HookStorage`].
#[derive(Debug)]
pub enum FileCall<'a> {
    WriteAt { buf: &'a [u8], pos: u64 },
    SetLen(u64),
    Allocate(u64),
    SyncData,
    SyncAll,
}

/// What a test does around the calls of a [`HookStorage`]. Every method defaults to
/// letting the call through unchanged.
pub trait Hook: Send + Sync + fmt::Debug {
    /// Before `call` on the file at `path`: `Some(result)` replaces the call (the hook
    /// may have used `file` itself), `None` lets it run.
    fn before(
        &self,
        path: &Path,
        call: &FileCall<'_>,
        file: &dyn StorageFile,
    ) -> Option<io::Result<()>> {
        let _ = (path, call, file);
        None
    }

    /// After `call` on the file at `path` ran and returned `Ok`.
    fn after(&self, path: &Path, call: &FileCall<'_>) {
        let _ = (path, call);
    }
}

/// The real file system with `H` around every file call.
#[derive(Debug)]
pub struct HookStorage<H: Hook>(pub Arc<H>);

impl<H: Hook + 'static> HookStorage<H> {
    pub fn new(hook: Arc<H>) -> Self {
        HookStorage(hook)
    }

    fn wrap(&self, path: &Path, inner: Box<dyn StorageFile>) -> Box<dyn StorageFile> {
        Box::new(HookFile {
            inner,
            path: path.to_path_buf(),
            hook: self.0.clone(),
        })
    }
}

#[derive(Debug)]
struct HookFile<H: Hook> {
    inner: Box<dyn StorageFile>,
    path: PathBuf,
    hook: Arc<H>,
}

impl<H: Hook> HookFile<H> {
    fn call(
        &self,
        call: FileCall<'_>,
        run: impl FnOnce(&dyn StorageFile) -> io::Result<()>,
    ) -> io::Result<()> {
        if let Some(result) = self.hook.before(&self.path, &call, self.inner.as_ref()) {
            return result;
        }
        run(self.inner.as_ref())?;
        self.hook.after(&self.path, &call);
        Ok(())
    }
}

impl<H: Hook> StorageFile for HookFile<H> {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.call(FileCall::WriteAt { buf, pos }, |f| f.write_at(buf, pos))
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.inner.read_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.call(FileCall::SetLen(len), |f| f.set_len(len))
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.call(FileCall::Allocate(len), |f| f.allocate(len))
    }
    fn sync_data(&self) -> io::Result<()> {
        self.call(FileCall::SyncData, |f| f.sync_data())
    }
    fn sync_all(&self) -> io::Result<()> {
        self.call(FileCall::SyncAll, |f| f.sync_all())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl<H: Hook + 'static> Storage for HookStorage<H> {
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        Ok(self.wrap(path, RealStorage.create(path)?))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        Ok(self.wrap(path, RealStorage.open(path)?))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        RealStorage.create_dir_all(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealStorage.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealStorage.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        RealStorage.remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        RealStorage.sync_dir(path)
    }
}

/// True for a segment log file (`.log`).
pub fn is_log(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "log")
}

/// The real file system as the engine takes it.
pub fn real() -> seglog::engine::storage::io::StorageRef {
    Arc::new(RealStorage)
}
