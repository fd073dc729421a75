//! Test support, compiled only with the `testkit` feature (the tests and the fuzz
//! crate turn it on; release builds leave it off): planted bugs ([`planted`]), failing
//! and hook storages ([`storage`]), the crash simulator ([`sim`]), the properties every
//! decoder must satisfy ([`fuzzprops`]) and an allocator that aborts on any single
//! oversized allocation ([`CappedAlloc`]).
//! Not part of the public API; it may change with any release.

mod alloc;
pub mod fuzzprops;
pub mod planted;
pub mod sim;
pub mod storage;

pub use alloc::{CappedAlloc, ALLOCATION_BYTES_MAX};
