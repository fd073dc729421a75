//! Fuzz target `topic_json`: the property is `seglog::testkit::fuzzprops::topic_json`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seglog::testkit::CappedAlloc;

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

fuzz_target!(|data: &[u8]| {
    seglog::testkit::fuzzprops::topic_json(data);
});
