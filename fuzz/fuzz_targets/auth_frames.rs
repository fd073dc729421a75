//! Fuzz target `auth_frames`: the property is `seglog::testkit::fuzzprops::auth_frames`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seglog::testkit::CappedAlloc;

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

fuzz_target!(|data: &[u8]| {
    seglog::testkit::fuzzprops::auth_frames(data);
});
