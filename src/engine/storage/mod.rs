//! The bottom layer of the engine: the I/O seam every mutation goes through
//! ([`io`]), the one windowed record reader and segment scan ([`reader`]) with its
//! read-only maps of sealed segments ([`map`]), where
//! things are in a data directory ([`layout`]) and `DATA/LOCK` ([`lock`]), and the
//! opening and listing for reading that leaves access times alone ([`noatime`]).

pub mod io;
pub mod layout;
pub mod lock;
pub mod map;
pub mod noatime;
pub mod reader;
