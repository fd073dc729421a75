//! The offline toolkit and the format, in one test binary: `verify`, `dump`,
//! `reindex`, `recover`, `compact` on built and committed data directories, the
//! golden vectors, the man pages, the bounded decoder corpus, and the (ignored)
//! fixture generator.
//!
//! The whole binary runs under [`CappedAlloc`]: any single allocation over
//! `ALLOCATION_BYTES_MAX` aborts, so a length trusted before it was checked shows up
//! in the decoder tests (and anywhere else). Run one part with a filter, e.g.
//! `cargo test --release --test tools recover::`.

use seglog::testkit::CappedAlloc;

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

#[path = "../util/mod.rs"]
mod util;

mod check_vectors;
mod ci_tools;
mod cli_tools;
mod compact;
mod fuzz_decoders;
mod make_fixtures;
mod man;
mod raft_logs;
mod read_only_atime;
mod recover;
mod release_build;
mod salvage;
mod state_files;
mod topic_meta;
mod vectors;
