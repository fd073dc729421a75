//! The benchmarks, all ignored: they measure and print, and assert only what makes a
//! run meaningless if false. Run them all with
//! `cargo test --release --test bench -- --ignored --nocapture`, or one with a
//! filter (`produce::`, `tools::`, `cluster::`, `cleanup::`, `recovery::`, `compaction::`, `schemas::`, `metrics::`, `tls::`).

#[path = "../util/mod.rs"]
mod util;

mod auth;
mod cleanup;
mod cluster;
mod compaction;
mod groups;
mod kafka;
mod load;
mod metrics;
mod produce;
mod recovery;
mod schemas;
mod tls;
mod tools;
mod write_path;
