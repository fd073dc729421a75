//! Storages for failure tests, each a wrapper over another [`StorageRef`]:
//! [`HookStorage`] shows every mutation and sync to a [`Hook`] first, which may record
//! it, delay it, fail it or run it itself (a torn write), and is told after each call
//! that went through; [`FailingStorage`] is a hook that fails the Nth counted call
//! (and, if sticky, every later one). Reads, `open` and `len` always pass through.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::engine::storage::io::{Storage, StorageFile, StorageRef};

/// The kind of a mutation or sync, as seen by a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Create,
    CreateDir,
    Rename,
    /// `remove_file` or `remove_dir_all`.
    Remove,
    WriteAt,
    SetLen,
    Allocate,
    SyncData,
    SyncAll,
    SyncDir,
}

impl OpKind {
    /// sync_data, sync_all or sync_dir.
    pub fn is_sync(self) -> bool {
        matches!(self, OpKind::SyncData | OpKind::SyncAll | OpKind::SyncDir)
    }

    /// write_at, set_len, allocate, sync_data or sync_all: a call on an open file.
    pub fn is_file_call(self) -> bool {
        matches!(
            self,
            OpKind::WriteAt
                | OpKind::SetLen
                | OpKind::Allocate
                | OpKind::SyncData
                | OpKind::SyncAll
        )
    }
}

/// A mutation or sync with its arguments (the path is in [`Op::path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call<'a> {
    Create,
    CreateDir,
    Rename { to: &'a Path },
    RemoveFile,
    RemoveDirAll,
    SyncDir,
    WriteAt { buf: &'a [u8], pos: u64 },
    SetLen(u64),
    Allocate(u64),
    SyncData,
    SyncAll,
}

impl Call<'_> {
    /// The kind of the call, without its arguments.
    pub fn kind(&self) -> OpKind {
        match self {
            Call::Create => OpKind::Create,
            Call::CreateDir => OpKind::CreateDir,
            Call::Rename { .. } => OpKind::Rename,
            Call::RemoveFile | Call::RemoveDirAll => OpKind::Remove,
            Call::SyncDir => OpKind::SyncDir,
            Call::WriteAt { .. } => OpKind::WriteAt,
            Call::SetLen(_) => OpKind::SetLen,
            Call::Allocate(_) => OpKind::Allocate,
            Call::SyncData => OpKind::SyncData,
            Call::SyncAll => OpKind::SyncAll,
        }
    }
}

/// One call about to be made (or just made) on the inner storage.
#[derive(Clone, Copy, Debug)]
pub struct Op<'a> {
    pub call: Call<'a>,
    /// The file or directory the call acts on; for a rename, its source.
    pub path: &'a Path,
    /// The inner storage, for a hook that runs a storage call itself.
    pub storage: &'a dyn Storage,
    /// The inner file: set for file calls, and for a `create` once it succeeded.
    pub file: Option<&'a dyn StorageFile>,
}

impl Op<'_> {
    /// The kind of the call.
    pub fn kind(&self) -> OpKind {
        self.call.kind()
    }
}

/// What a test does around the calls of a [`HookStorage`]. Both methods default to
/// doing nothing, so the call runs unchanged.
pub trait Hook: Send + Sync {
    /// Before the call: `None` lets it run on the inner storage; `Some(result)`
    /// replaces it with `result` (a failure, or the outcome of the hook having made
    /// the call itself through [`Op::file`] or [`Op::storage`]). A replaced `create`
    /// that returns `Ok` hands back the file opened with the inner `open`.
    fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
        let _ = op;
        None
    }

    /// After the call ran on the inner storage and returned `Ok`; not called for a
    /// call that `before` replaced.
    fn after(&self, op: &Op<'_>) {
        let _ = op;
    }
}

/// A [`Hook`] made of one `before` closure.
struct BeforeFn<F>(F);

impl<F> Hook for BeforeFn<F>
where
    F: Fn(&Op<'_>) -> Option<io::Result<()>> + Send + Sync,
{
    fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
        (self.0)(op)
    }
}

/// Storage that shows a [`Hook`] every mutation and sync (create, create_dir_all,
/// rename, remove_*, sync_dir, and on its files write_at, set_len, allocate, sync_*)
/// before and after it runs on the inner storage. Clones share the hook.
#[derive(Clone)]
pub struct HookStorage {
    inner: StorageRef,
    hook: Arc<dyn Hook>,
}

impl HookStorage {
    /// Wraps `inner` with `hook`.
    pub fn new(inner: StorageRef, hook: impl Hook + 'static) -> Self {
        Self::shared(inner, Arc::new(hook))
    }

    /// Wraps `inner` with a hook the caller keeps a handle to (to change or read it
    /// while the storage is in use).
    pub fn shared(inner: StorageRef, hook: Arc<dyn Hook>) -> Self {
        HookStorage { inner, hook }
    }

    /// Wraps `inner` with a hook that only has `before`.
    pub fn from_fn(
        inner: StorageRef,
        before: impl Fn(&Op<'_>) -> Option<io::Result<()>> + Send + Sync + 'static,
    ) -> Self {
        Self::new(inner, BeforeFn(before))
    }

    /// Runs `call` on `path` through the hook; `run` makes it on the inner storage.
    fn call(
        &self,
        call: Call<'_>,
        path: &Path,
        run: impl FnOnce(&dyn Storage) -> io::Result<()>,
    ) -> io::Result<()> {
        let op = Op {
            call,
            path,
            storage: &*self.inner,
            file: None,
        };
        if let Some(result) = self.hook.before(&op) {
            return result;
        }
        run(&*self.inner)?;
        self.hook.after(&op);
        Ok(())
    }

    fn wrap(&self, inner: Box<dyn StorageFile>, path: &Path) -> Box<dyn StorageFile> {
        Box::new(HookFile {
            inner,
            path: path.to_path_buf(),
            storage: self.clone(),
        })
    }
}

impl fmt::Debug for HookStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookStorage")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

struct HookFile {
    inner: Box<dyn StorageFile>,
    path: PathBuf,
    storage: HookStorage,
}

impl fmt::Debug for HookFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookFile")
            .field("inner", &self.inner)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl HookFile {
    /// Runs `call` on this file through the hook; `run` makes it on the inner file.
    fn call(
        &self,
        call: Call<'_>,
        run: impl FnOnce(&dyn StorageFile) -> io::Result<()>,
    ) -> io::Result<()> {
        let op = Op {
            call,
            path: &self.path,
            storage: &*self.storage.inner,
            file: Some(&*self.inner),
        };
        let hook = &self.storage.hook;
        if let Some(result) = hook.before(&op) {
            return result;
        }
        run(&*self.inner)?;
        hook.after(&op);
        Ok(())
    }
}

impl StorageFile for HookFile {
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.call(Call::WriteAt { buf, pos }, |f| f.write_at(buf, pos))
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.inner.read_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.call(Call::SetLen(len), |f| f.set_len(len))
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.call(Call::Allocate(len), |f| f.allocate(len))
    }
    fn sync_data(&self) -> io::Result<()> {
        self.call(Call::SyncData, |f| f.sync_data())
    }
    fn sync_all(&self) -> io::Result<()> {
        self.call(Call::SyncAll, |f| f.sync_all())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl Storage for HookStorage {
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let mut op = Op {
            call: Call::Create,
            path,
            storage: &*self.inner,
            file: None,
        };
        let file = match self.hook.before(&op) {
            Some(result) => {
                result?;
                self.inner.open(path)?
            }
            None => {
                let file = self.inner.create(path)?;
                op.file = Some(&*file);
                self.hook.after(&op);
                file
            }
        };
        Ok(self.wrap(file, path))
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let inner = self.inner.open(path)?;
        Ok(self.wrap(inner, path))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.call(Call::CreateDir, path, |s| s.create_dir_all(path))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.call(Call::Rename { to }, from, |s| s.rename(from, to))
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.call(Call::RemoveFile, path, |s| s.remove_file(path))
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.call(Call::RemoveDirAll, path, |s| s.remove_dir_all(path))
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.call(Call::SyncDir, path, |s| s.sync_dir(path))
    }
}

/// Which calls a [`FailingStorage`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailOn {
    /// Every mutation: create, write_at, set_len, allocate, sync_*, rename, remove, create_dir.
    Any,
    /// Only sync_data, sync_all and sync_dir.
    Sync,
}

#[derive(Debug)]
struct FailState {
    calls: AtomicU64,
    fail_at: u64,
    fail_on: FailOn,
    /// After the chosen call fails, fail every later one too (the process "died").
    sticky: bool,
    failed: AtomicU64,
}

impl FailState {
    fn check(&self, op: &Op) -> Option<io::Error> {
        let counted = self.fail_on == FailOn::Any || op.kind().is_sync();
        if !counted {
            return None;
        }
        let (kind, path) = (op.kind(), op.path.display());
        if self.sticky && self.failed.load(Ordering::SeqCst) > 0 {
            return Some(io::Error::other(format!(
                "injected failure after call {} ({kind:?} {path})",
                self.fail_at
            )));
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Some(io::Error::other(format!(
                "injected failure of call {n} ({kind:?} {path})"
            )));
        }
        None
    }
}

/// Storage that fails the Nth counted mutation (and, if sticky, every one after it).
/// Counts start at 1. Clones share the count.
#[derive(Debug, Clone)]
pub struct FailingStorage {
    hooked: HookStorage,
    state: Arc<FailState>,
}

impl FailingStorage {
    /// Fails call number `fail_at` (1-based) of the kind `fail_on`.
    pub fn new(inner: StorageRef, fail_at: u64, fail_on: FailOn, sticky: bool) -> Self {
        let state = Arc::new(FailState {
            calls: AtomicU64::new(0),
            fail_at,
            fail_on,
            sticky,
            failed: AtomicU64::new(0),
        });
        let hook_state = Arc::clone(&state);
        FailingStorage {
            hooked: HookStorage::from_fn(inner, move |op| hook_state.check(op).map(Err)),
            state,
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

impl Storage for FailingStorage {
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.hooked.create(path)
    }
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.hooked.open(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.hooked.create_dir_all(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.hooked.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.hooked.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.hooked.remove_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.hooked.sync_dir(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::storage::io::{write_file_atomic, RealStorage};
    use std::fs;
    use std::sync::Mutex;

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

    #[test]
    fn a_sticky_failure_fails_every_later_call() {
        let dir = tempfile::tempdir().unwrap();
        let s = FailingStorage::new(Arc::new(RealStorage), 2, FailOn::Any, true);
        assert!(write_file_atomic(&s, dir.path(), "m.json", b"new").is_err());
        assert!(s.has_failed());
        let calls = s.calls();
        assert!(s.create_dir_all(&dir.path().join("d")).is_err());
        assert_eq!(s.calls(), calls, "calls after the failure are not counted");
        assert!(!dir.path().join("d").exists());
    }

    #[test]
    fn a_hook_sees_every_mutation_and_can_fail_one() {
        let dir = tempfile::tempdir().unwrap();
        let seen: Arc<Mutex<Vec<(OpKind, PathBuf)>>> = Arc::default();
        let log = Arc::clone(&seen);
        let s = HookStorage::from_fn(Arc::new(RealStorage), move |op| {
            log.lock().unwrap().push((op.kind(), op.path.to_path_buf()));
            (op.kind() == OpKind::SyncDir).then(|| Err(io::Error::other("no dir fsync")))
        });
        let r = write_file_atomic(&s, dir.path(), "m.json", b"new");
        assert!(matches!(r, Err(e) if e.to_string() == "no dir fsync"));
        // The rename happened before the failed directory fsync.
        assert_eq!(fs::read(dir.path().join("m.json")).unwrap(), b"new");
        let kinds: Vec<OpKind> = seen.lock().unwrap().iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                OpKind::Create,
                OpKind::WriteAt,
                OpKind::SyncAll,
                OpKind::Rename,
                OpKind::SyncDir
            ]
        );
        let seen = seen.lock().unwrap();
        assert_eq!(seen.last().map(|(_, p)| p.as_path()), Some(dir.path()));
    }
}
