//! seglog: a durable, partitioned log broker and the offline toolkit for its data
//! directories. `format` fixes the bytes on disk, `engine` owns state and I/O, `cmd`
//! holds one module per subcommand, `bench` is the load generator behind `seglog bench`.
//! Dependencies point down only: cmd → bench → engine → format.

#[macro_use]
mod macros;

pub mod bench;
pub mod cmd;
pub mod engine;
pub mod format;
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub mod testkit;
