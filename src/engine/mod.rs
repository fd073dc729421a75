//! State and I/O. Each folder is one layer; a layer uses only the layers below it.
//!
//! ```text
//! net/          TCP server and client of the native protocol (bytes: format::wire)
//!   ↓
//! broker/       topics, their partitions, the flusher and the background cleaner
//!   ↓
//! partition/    one partition's log: append, roll, group commit, read, open,
//!               retention, background cleanup of one partition
//!   ↓
//! maintenance/  check, reindex, recovery, compaction: shared by tools and startup
//!   ↓
//! storage/      the I/O seam, the windowed record reader and scan, layout, DATA/LOCK
//! ```
//! [`error`] holds the broker-facing error type and its typed failure reasons.
//!
//! Lock order, outermost first (nothing takes an outer lock while holding an inner one):
//! 1. `DATA/LOCK`, the process's `flock` on the data directory (held for its lifetime);
//! 2. broker: `admin` (serialises create, delete, alter) → the topic map (`RwLock`,
//!    held only to look up, insert or remove) → a topic's `config`;
//! 3. partition cleanup: `busy` (one background visit per partition at a time);
//! 4. partition log: `write` → `sync` → `segments`. No fsync runs while `write` is
//!    held, except the cut after a failed write (an error path).
//!
//! The schema registry ([`schemas`]): broker `admin` → registry `change` → its `doc` →
//! its `cache`; a produce takes only `doc`/`cache` for reading, before any partition
//! lock, and releases them before appending.
//!
//! The API keys ([`keys`]): `change` → `state` → `limiter`; a login takes `state`
//! for reading and the limiter only, never a partition lock.
//!
//! Every file-system mutation goes through [`storage::io::Storage`].

pub mod broker;
pub mod error;
pub mod groups;
pub mod keys;
pub mod maintenance;
pub mod net;
pub mod partition;
pub mod producers;
pub mod replication;
pub mod schemas;
pub mod storage;
