//! State and I/O: the I/O seam, segment files, scanning and checking, recovery,
//! compaction, the partition log, topics, and the broker with its network server.
//! Everything that touches the disk goes through [`io::Storage`] for mutations.

pub mod broker;
pub mod check;
pub mod cleanup;
pub mod client;
pub mod compaction;
pub mod error;
pub mod io;
pub mod layout;
pub mod lock;
pub mod log;
pub mod protocol;
pub mod recovery;
pub mod reindex;
pub mod segment;
pub mod server;
