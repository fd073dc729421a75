//! Replication: one Raft group (openraft) per replicated partition.
//!
//! [`log_store`] keeps each group's Raft log on disk in the segment format, so the
//! offline tools read it like any partition.

pub mod log_store;
