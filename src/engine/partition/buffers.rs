//! Fetch buffers kept per thread: the read window and the records' bytes of a fetch
//! reuse storage that earlier fetches on the same thread touched, so a large fetch
//! costs no fresh zero-filled pages (page faults cost more than the copy itself).
//! Bounded: at most [`KEEP_BUFFERS`] buffers a thread, each at most
//! [`KEEP_BYTES_MAX`], together at most [`KEEP_TOTAL_BYTES`]; the rest is freed.

use std::cell::RefCell;

use crate::format::wire::FETCH_BYTES_MAX;

/// Buffers a thread keeps: a fetch's read window and its records' bytes, and one
/// more for a fetch that spans a segment boundary.
const KEEP_BUFFERS: usize = 3;
/// Largest buffer kept: one fetch's window (budget plus an index interval) fits.
const KEEP_BYTES_MAX: usize = 2 * FETCH_BYTES_MAX as usize;
/// Most bytes of storage a thread keeps in all.
const KEEP_TOTAL_BYTES: usize = 3 * FETCH_BYTES_MAX as usize;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer from this thread's pool (its length and bytes are stale), or a new one.
pub fn take() -> Vec<u8> {
    POOL.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// Returns a buffer to this thread's pool (dropped when the pool is full or the
/// buffer too large).
pub fn give(buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > KEEP_BYTES_MAX {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let kept: usize = p.iter().map(Vec::capacity).sum();
        if p.len() < KEEP_BUFFERS && kept + buf.capacity() <= KEEP_TOTAL_BYTES {
            p.push(buf);
        }
    });
}
