//! Read handles of segment files. The active segment keeps its handle open; a sealed
//! segment's handle lives in a [`FileCache`] shared by every log of a broker, bounded
//! and least recently used first out, and is reopened on demand. So the number of
//! sealed segments (and so of partitions) is not capped by file descriptors.
//!
//! Invariants:
//! - A handle handed out is an `Arc<File>`: evicting it from the cache never closes a
//!   file a reader is using; the descriptor closes when the last reader drops it.
//! - Entries are keyed by a process-unique segment id, never by path: compaction
//!   writes a new segment under the name of one it replaces.
//! - Before a segment's files are removed or replaced on disk, its handle is *held*
//!   ([`SegmentFile::hold`]) for the rest of the segment's life, so readers that still
//!   hold the segment read the bytes it had.
//! - The cache mutex is held while a file is opened: a reader that misses the cache
//!   and finds the file gone (`NotFound`) looks at the held handle again, which a
//!   removal set before it removed the file.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// Sealed segment handles a cache keeps open unless told otherwise.
pub const OPEN_FILES_DEFAULT: usize = 1024;

/// Source of segment ids, unique within the process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Default)]
struct CacheState {
    /// Use counter: larger is more recent.
    tick: u64,
    /// Segment id → (handle, tick of its last use).
    files: HashMap<u64, (Arc<File>, u64)>,
    /// Tick of last use → segment id, oldest first.
    order: BTreeMap<u64, u64>,
}

/// A bounded, least-recently-used cache of sealed segments' read handles.
#[derive(Debug)]
pub struct FileCache {
    capacity: usize,
    state: Mutex<CacheState>,
    /// Files opened because their handle was not in the cache.
    opens: AtomicU64,
}

impl Default for FileCache {
    fn default() -> Self {
        FileCache::new(OPEN_FILES_DEFAULT)
    }
}

impl FileCache {
    /// A cache keeping at most `capacity` handles open (at least 1).
    pub fn new(capacity: usize) -> Self {
        FileCache {
            capacity: capacity.max(1),
            state: Mutex::new(CacheState::default()),
            opens: AtomicU64::new(0),
        }
    }

    /// Most handles kept open.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Handles open in the cache right now.
    pub fn len(&self) -> usize {
        self.lock().files.len()
    }

    /// True when the cache holds no handle.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files opened on a cache miss since the cache was made.
    pub fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The handle of segment `id`, opening `path` on a miss (and evicting the least
    /// recently used handle when full).
    fn get_or_open(&self, id: u64, path: &Path) -> io::Result<Arc<File>> {
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        if let Some((file, used)) = s.files.get_mut(&id) {
            let (file, old) = (file.clone(), std::mem::replace(used, tick));
            s.order.remove(&old);
            s.order.insert(tick, id);
            return Ok(file);
        }
        let file = Arc::new(File::open(path)?);
        self.opens.fetch_add(1, Ordering::Relaxed);
        insert(&mut s, self.capacity, id, file.clone(), tick);
        Ok(file)
    }

    /// Puts an open handle of segment `id` in the cache.
    fn put(&self, id: u64, file: Arc<File>) {
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        if let Some((_, old)) = s.files.remove(&id) {
            s.order.remove(&old);
        }
        insert(&mut s, self.capacity, id, file, tick);
    }

    fn forget(&self, id: u64) {
        let mut s = self.lock();
        if let Some((_, used)) = s.files.remove(&id) {
            s.order.remove(&used);
        }
    }
}

fn insert(s: &mut CacheState, capacity: usize, id: u64, file: Arc<File>, tick: u64) {
    while s.files.len() >= capacity {
        let Some((_, victim)) = s.order.pop_first() else {
            break;
        };
        s.files.remove(&victim);
    }
    s.files.insert(id, (file, tick));
    s.order.insert(tick, id);
}

/// The read handle of one segment: held open (the active segment, or a segment whose
/// files are about to go), or reopened on demand through the cache.
#[derive(Debug)]
pub(super) struct SegmentFile {
    id: u64,
    path: PathBuf,
    cache: Arc<FileCache>,
    held: RwLock<Option<Arc<File>>>,
}

impl SegmentFile {
    /// A handle kept open (the active segment).
    pub(super) fn held(path: PathBuf, file: File, cache: Arc<FileCache>) -> Self {
        SegmentFile {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            path,
            cache,
            held: RwLock::new(Some(Arc::new(file))),
        }
    }

    /// A sealed segment's handle: `file` (already open) goes into the cache.
    pub(super) fn cached(path: PathBuf, file: File, cache: Arc<FileCache>) -> Self {
        let seg = SegmentFile {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            path,
            cache,
            held: RwLock::new(None),
        };
        seg.cache.put(seg.id, Arc::new(file));
        seg
    }

    fn held_file(&self) -> Option<Arc<File>> {
        self.held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The open handle, reopened through the cache when it was evicted.
    pub(super) fn get(&self) -> io::Result<Arc<File>> {
        if let Some(f) = self.held_file() {
            return Ok(f);
        }
        match self.cache.get_or_open(self.id, &self.path) {
            Ok(f) => Ok(f),
            // Removed since: a removal holds the handle before the file goes.
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.held_file().ok_or(e),
            Err(e) => Err(e),
        }
    }

    /// Keeps the handle open for the rest of the segment's life: called before the
    /// segment's files are removed or replaced on disk.
    pub(super) fn hold(&self) -> io::Result<()> {
        if self.held_file().is_some() {
            return Ok(());
        }
        let file = self.cache.get_or_open(self.id, &self.path)?;
        *self.held.write().unwrap_or_else(PoisonError::into_inner) = Some(file);
        self.cache.forget(self.id);
        Ok(())
    }

    /// True when the handle is held and no reader shares it (nobody can read the
    /// file through this segment once the segment itself is gone).
    pub(super) fn unshared(&self) -> bool {
        self.held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|f| Arc::strong_count(f) == 1)
    }

    /// Hands a held handle to the cache: the segment was sealed.
    pub(super) fn release(&self) {
        let taken = self
            .held
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(file) = taken {
            self.cache.put(self.id, file);
        }
    }
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        self.cache.forget(self.id);
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn evicted_handles_reopen_and_held_ones_outlive_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Arc::new(FileCache::new(2));
        let segs: Vec<SegmentFile> = (0..4u8)
            .map(|i| {
                let path = dir.path().join(format!("{i}.log"));
                std::fs::write(&path, [i; 8]).unwrap();
                SegmentFile::cached(path.clone(), File::open(&path).unwrap(), cache.clone())
            })
            .collect();
        assert_eq!(cache.len(), 2, "bounded");
        let mut b = [0u8; 1];
        for (i, s) in segs.iter().enumerate() {
            let f = s.get().unwrap();
            f.read_at(&mut b, 0).unwrap();
            assert_eq!(usize::from(b[0]), i);
            assert!(cache.len() <= 2);
        }
        // A reader keeps its handle while the cache evicts it.
        let kept = segs[0].get().unwrap();
        segs[1].get().unwrap();
        segs[2].get().unwrap();
        kept.read_at(&mut b, 0).unwrap();
        assert_eq!(b[0], 0);
        // A held segment reads its bytes after its file is gone.
        segs[3].hold().unwrap();
        std::fs::remove_file(dir.path().join("3.log")).unwrap();
        segs[3].get().unwrap().read_at(&mut b, 0).unwrap();
        assert_eq!(b[0], 3);
        drop(segs);
        assert!(cache.is_empty(), "dropped segments leave the cache");
    }
}
