//! Read-only memory maps of sealed segment files: a scan checks the records where the
//! page cache holds them instead of copying them into a buffer first.
//!
//! Only sealed segments are mapped, never the active one, whose length changes while
//! it is read. A map is released when dropped; [`SealedMap::release_before`] drops the
//! pages a sequential reader has passed from the resident set, so the memory of a
//! scan stays flat however long the segment is.

use std::fs::File;
use std::io;
use std::path::Path;

use memmap2::{Advice, Mmap, MmapOptions, UncheckedAdvice};

/// A read-only map of a whole sealed segment file.
#[derive(Debug)]
pub struct SealedMap {
    map: Mmap,
}

impl SealedMap {
    /// Maps the `len` bytes of a sealed segment file (its length when opened), for
    /// sequential reading. `None` when it cannot be mapped (an empty file, a length
    /// beyond the address space, or a failed `mmap`): the caller reads with `pread`.
    pub fn sealed(file: &File, len: u64) -> Option<SealedMap> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        let map = map_sealed_file(file, len).ok()?;
        // Only a hint to read ahead and drop pages early: failing it changes nothing.
        let _ = map.advise(Advice::Sequential);
        Some(SealedMap { map })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Drops the pages wholly before `end` from this process's resident set. They stay
    /// in the page cache, and reading them again faults them back in unchanged.
    pub fn release_before(&self, end: usize) {
        let page = page_bytes();
        let end = end.min(self.map.len()) / page * page;
        if end == 0 {
            return;
        }
        // SAFETY: the map is shared and read-only: MADV_DONTNEED only unmaps its pages
        // from this process, and a later access reads the same bytes from the file
        // again (nothing was written through the map, so nothing is discarded).
        #[expect(unsafe_code, reason = "madvise(MADV_DONTNEED) on a read-only map")]
        let r = unsafe {
            self.map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, 0, end)
        };
        // Only memory accounting depends on it.
        let _ = r;
    }
}

/// Maps `len` bytes of a sealed segment file read-only.
fn map_sealed_file(file: &File, len: usize) -> io::Result<Mmap> {
    // SAFETY: a map is only sound while no one changes or shortens the file under it
    // (a write would change bytes a `&[u8]` borrows; a truncation makes access SIGBUS).
    // Only sealed segments are mapped, and nothing writes a sealed log: a segment is
    // cut to its data end by its roll before the next segment's files exist, so one
    // that a listing shows as sealed was cut already; retention and compaction unlink
    // or rename sealed files, which leaves a mapped inode intact. The one in-place cut
    // of a sealed log, `recover` (under DATA/LOCK) cutting an unfinished seal or a
    // damaged tail, first takes an exclusive `flock` on that log file
    // ([`lock_log_for_cut`]); the shared one taken here, held while the file stays
    // open, keeps it waiting until the reader is done. A file already locked for a cut
    // is not mapped.
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockShared)?;
    #[expect(unsafe_code, reason = "mmap of a sealed segment file")]
    let map = unsafe { MmapOptions::new().len(len).map(file) };
    map
}

/// Opens a sealed log for an in-place cut: waits for the readers that map it (see
/// [`SealedMap::sealed`]) and keeps new ones from mapping it until the returned file
/// is closed. Taking a lock changes no byte, name or length. `None` when the file is
/// not there to lock (the cut itself then reports it).
pub fn lock_log_for_cut(path: &Path) -> io::Result<Option<File>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
    Ok(Some(file))
}

/// The system's page size.
fn page_bytes() -> usize {
    rustix::param::page_size()
}
