//! Fuzz target `kafka_request`: the property is `seglog::testkit::fuzzprops::kafka_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seglog::testkit::CappedAlloc;

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

fuzz_target!(|data: &[u8]| {
    seglog::testkit::fuzzprops::kafka_request(data);
});
