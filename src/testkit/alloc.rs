//! [`CappedAlloc`]: the system allocator with a cap on any single allocation, so a
//! length trusted before it was checked aborts the test or fuzz run.
#![expect(unsafe_code, reason = "a global allocator implements an unsafe trait")]

use std::alloc::{GlobalAlloc, Layout, System};

/// Largest single allocation a decoder may make while under test. Above every
/// legitimate buffer: a maximal record (16 MiB), a scan window (1 MiB) and the index
/// read limit (64 MiB).
pub const ALLOCATION_BYTES_MAX: usize = 80 * 1024 * 1024;

/// The system allocator, except that one allocation (or reallocation) larger than
/// [`ALLOCATION_BYTES_MAX`] aborts the process with a message. A length read from
/// input and trusted before it was checked shows up as such an abort.
///
/// Install it in a test or fuzz binary with
/// `#[global_allocator] static ALLOC: CappedAlloc = CappedAlloc;`.
pub struct CappedAlloc;

impl CappedAlloc {
    fn refuse(size: usize) -> ! {
        // No allocation here: format into a stack buffer and write(2) it.
        let mut msg = *b"CappedAlloc: allocation of 00000000000000000000 bytes exceeds the limit\n";
        let mut n = size;
        let digits_end = 47;
        for i in (27..digits_end).rev() {
            if let Some(slot) = msg.get_mut(i) {
                *slot = b'0' + (n % 10) as u8;
            }
            n /= 10;
        }
        // SAFETY: writes a valid, initialised buffer to stderr.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
        }
        std::process::abort()
    }
}

// SAFETY: every call is forwarded unchanged to `System`, or the process aborts.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_BYTES_MAX {
            Self::refuse(layout.size());
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_BYTES_MAX {
            Self::refuse(layout.size());
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_BYTES_MAX {
            Self::refuse(new_size);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
