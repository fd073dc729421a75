//! Support shared by every integration-test binary: one seeded generator ([`rng`]),
//! segment, partition and data-directory builders over `seglog::format` ([`build`]),
//! the real binary run and compared ([`bin`]), `seglog serve` as a child process
//! ([`serve`]), helpers over the testkit storages ([`storage`]), and file-tree
//! helpers ([`fs`]), one hand-made Kafka request ([`kafka_raw`]), ports outside the kernel's ephemeral range for processes on a fixed
//! address ([`port`]); for replication, a fault-injecting TCP proxy ([`proxy`]), a
//! multi-process cluster ([`cluster`]) and the replica checker ([`replica_check`]).
//!
//! Each binary includes this module with `#[path = "../util/mod.rs"] mod util;` and
//! uses only part of it.
#![allow(dead_code, reason = "each test binary uses a part of it")]

pub mod bin;
pub mod build;
pub mod cluster;
pub mod fs;
pub mod kafka_raw;
pub mod port;
pub mod proxy;
pub mod replica_check;
pub mod rng;
pub mod serve;
pub mod storage;
