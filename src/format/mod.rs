//! The bytes on disk: segment header, record, index entry, file names and the
//! metadata JSON files. This module is the only code that knows a byte position.
//!
//! Everything here is a pure function over slices: no `File`, no clock, no imports
//! from `engine` or `cmd`. Decoders never panic and never index out of bounds; they
//! check every length against a named maximum before anything is allocated or
//! copied, and return borrowed views into the input.
//!
//! All integers are big-endian. CRC is CRC-32/ISO-HDLC (`crc32fast`).
//!
//! ```text
//! segment file (.log)
//! +--------+---------+------------+-------------+------------+-------+------------+
//! | magic  | version | header_len | base_offset | generation | flags | header_crc |
//! | "SEGL" | u16 = 1 | u16 = 32   | u64         | u64        | u32=0 | u32 (0..28)|
//! +--------+---------+------------+-------------+------------+-------+------------+
//!  0        4         6            8             16           24      28        32
//! then records back to back:
//! +------------+--------+--------------+---------+-----+-----------+-------+-------+
//! | record_len | offset | timestamp_ms | key_len | key | value_len | value | crc32 |
//! | u32        | u64    | i64          | i32     |     | u32       |       | u32   |
//! +------------+--------+--------------+---------+-----+-----------+-------+-------+
//! record_len = 28 + max(key_len, 0) + value_len
//! crc32 = crc(offset .. value) XOR low 32 bits of the segment's generation
//!
//! index file (.index): 16-byte entries (relative_offset u64, position u64)
//! ```
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::panic,
        clippy::expect_used
    )
)]

pub mod group;
pub mod header;
pub mod index;
pub mod keys;
pub mod marker;
pub mod names;
pub mod producers;
pub mod record;
pub mod replication;
pub mod schemas;
pub mod topic;
pub mod wire;

pub use header::{HeaderError, SegmentHeader, HEADER_LEN};
pub use index::{
    encode_index, IndexBuilder, IndexEntry, IndexError, INDEX_ENTRY_LEN, INDEX_INTERVAL_BYTES,
};
pub use record::{
    decode_record, encode_record, encoded_len, payload_crc, RecordError, RecordView,
    MAX_RECORD_LEN, RECORD_OVERHEAD,
};

/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;

/// CRC-32/ISO-HDLC of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    // A fresh hasher detects the CPU's features on every call, a cost comparable to
    // hashing a small record; one detected once is copied instead.
    static FRESH: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    let mut h = FRESH.get_or_init(crc32fast::Hasher::new).clone();
    h.update(bytes);
    h.finalize()
}

/// Reads a big-endian u16 at `at`, or `None` when the slice is too short.
pub(crate) fn be_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes(b.try_into().ok()?))
}

/// Reads a big-endian u32 at `at`, or `None` when the slice is too short.
pub(crate) fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(b.try_into().ok()?))
}

/// Reads a big-endian u64 at `at`, or `None` when the slice is too short.
pub(crate) fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc_check_value() {
        assert_eq!(super::crc32(b"123456789"), 0xCBF4_3926);
    }
}
