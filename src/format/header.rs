//! The 32-byte segment header.
//!
//! | bytes  | field       | value                                   |
//! |--------|-------------|-----------------------------------------|
//! | 0..4   | magic       | `SEGL`                                  |
//! | 4..6   | version     | u16 `1`                                 |
//! | 6..8   | header_len  | u16 `32`                                |
//! | 8..16  | base_offset | u64; `u64::MAX` for an unassigned spare |
//! | 16..24 | generation  | u64; +1 each time the file is reused    |
//! | 24..28 | flags       | u32 `0`; unknown bits are rejected      |
//! | 28..32 | header_crc  | u32 CRC of bytes 0..28                  |

use super::{be_u16, be_u32, be_u64, crc32, FORMAT_VERSION};

/// Length of the segment header; records start here.
pub const HEADER_LEN: usize = 32;
/// The magic bytes that open every segment file.
pub const MAGIC: [u8; 4] = *b"SEGL";
/// `base_offset` of a spare file not yet assigned to a log.
pub const SPARE_BASE_OFFSET: u64 = u64::MAX;
/// Flag bits this version understands (none).
pub const KNOWN_FLAGS: u32 = 0;

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + MAGIC.len();
const HEADER_LEN_AT: usize = VERSION_AT + 2;
const BASE_OFFSET_AT: usize = HEADER_LEN_AT + 2;
const GENERATION_AT: usize = BASE_OFFSET_AT + 8;
const FLAGS_AT: usize = GENERATION_AT + 8;
/// Where the header CRC sits; it covers the bytes before it.
const HEADER_CRC_AT: usize = FLAGS_AT + 4;

const _: () = assert!(HEADER_CRC_AT + 4 == HEADER_LEN);
const _: () = assert!(HEADER_LEN == 32);
// The error messages name these bytes.
const _: () = assert!(VERSION_AT == 4 && HEADER_LEN_AT == 6 && BASE_OFFSET_AT == 8);
const _: () = assert!(GENERATION_AT == 16 && FLAGS_AT == 24 && HEADER_CRC_AT == 28);

/// A decoded segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub base_offset: u64,
    pub generation: u64,
    pub flags: u32,
}

/// Why a header was rejected. Every variant names what was found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    #[error("header is {len} bytes, shorter than the {HEADER_LEN}-byte segment header")]
    Short { len: usize },
    #[error("header is all zero bytes (never written)")]
    AllZero,
    #[error("bad magic {found:02x?} at byte 0 (expected \"SEGL\")")]
    BadMagic { found: [u8; 4] },
    #[error(
        "unsupported format version {found} at byte 4 (this build reads version {FORMAT_VERSION})"
    )]
    BadVersion { found: u16 },
    #[error("header_len {found} at byte 6 (expected {HEADER_LEN})")]
    BadHeaderLen { found: u16 },
    #[error("unknown flag bits {found:#010x} at byte 24")]
    UnknownFlags { found: u32 },
    #[error("header CRC mismatch at byte 28: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    /// The path named like a segment is no regular file (a FIFO, a directory, a
    /// device): it holds no segment and is never read.
    #[error("not a regular file but a {what}, so no segment")]
    NotRegularFile { what: &'static str },
}

impl HeaderError {
    /// Byte position within the file where the problem starts.
    pub fn position(&self) -> u64 {
        match self {
            HeaderError::Short { .. }
            | HeaderError::AllZero
            | HeaderError::BadMagic { .. }
            | HeaderError::NotRegularFile { .. } => 0,
            HeaderError::BadVersion { .. } => VERSION_AT as u64,
            HeaderError::BadHeaderLen { .. } => HEADER_LEN_AT as u64,
            HeaderError::UnknownFlags { .. } => FLAGS_AT as u64,
            HeaderError::CrcMismatch { .. } => HEADER_CRC_AT as u64,
        }
    }

    /// Stable machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            HeaderError::Short { .. } => "short_header",
            HeaderError::AllZero => "zero_header",
            _ => "bad_header",
        }
    }
}

impl SegmentHeader {
    /// A header for a new (generation 0) segment starting at `base_offset`.
    pub fn new(base_offset: u64) -> Self {
        SegmentHeader {
            base_offset,
            generation: 0,
            flags: 0,
        }
    }

    /// Encodes the header into its 32 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        let (head, crc_field) = out.split_at_mut(HEADER_CRC_AT);
        let (magic, rest) = head.split_at_mut(VERSION_AT);
        magic.copy_from_slice(&MAGIC);
        let (version, rest) = rest.split_at_mut(HEADER_LEN_AT - VERSION_AT);
        version.copy_from_slice(&FORMAT_VERSION.to_be_bytes());
        let (hlen, rest) = rest.split_at_mut(BASE_OFFSET_AT - HEADER_LEN_AT);
        hlen.copy_from_slice(&(HEADER_LEN as u16).to_be_bytes());
        let (base, rest) = rest.split_at_mut(GENERATION_AT - BASE_OFFSET_AT);
        base.copy_from_slice(&self.base_offset.to_be_bytes());
        let (generation, flags) = rest.split_at_mut(FLAGS_AT - GENERATION_AT);
        generation.copy_from_slice(&self.generation.to_be_bytes());
        flags.copy_from_slice(&self.flags.to_be_bytes());
        let crc = crc32(head);
        crc_field.copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes and checks the header at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, HeaderError> {
        let Some(h) = bytes.get(..HEADER_LEN) else {
            return Err(HeaderError::Short { len: bytes.len() });
        };
        if h.iter().all(|&b| b == 0) {
            return Err(HeaderError::AllZero);
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(h.get(MAGIC_AT..VERSION_AT).unwrap_or(&[0; 4]));
        if magic != MAGIC {
            return Err(HeaderError::BadMagic { found: magic });
        }
        let version = be_u16(h, VERSION_AT).unwrap_or(0);
        if version != FORMAT_VERSION {
            return Err(HeaderError::BadVersion { found: version });
        }
        let header_len = be_u16(h, HEADER_LEN_AT).unwrap_or(0);
        if usize::from(header_len) != HEADER_LEN {
            return Err(HeaderError::BadHeaderLen { found: header_len });
        }
        let stored = be_u32(h, HEADER_CRC_AT).unwrap_or(0);
        let computed = crc32(h.get(..HEADER_CRC_AT).unwrap_or(&[]));
        if stored != computed {
            return Err(HeaderError::CrcMismatch { stored, computed });
        }
        let flags = be_u32(h, FLAGS_AT).unwrap_or(0);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(HeaderError::UnknownFlags { found: flags });
        }
        Ok(SegmentHeader {
            base_offset: be_u64(h, BASE_OFFSET_AT).unwrap_or(0),
            generation: be_u64(h, GENERATION_AT).unwrap_or(0),
            flags,
        })
    }

    /// True for a spare file that no log has taken yet.
    pub fn is_spare(&self) -> bool {
        self.base_offset == SPARE_BASE_OFFSET
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = SegmentHeader {
            base_offset: 147,
            generation: 2,
            flags: 0,
        };
        let bytes = h.encode();
        assert_eq!(SegmentHeader::decode(&bytes).unwrap(), h);
    }

    #[test]
    fn every_byte_flip_is_rejected() {
        let bytes = SegmentHeader {
            base_offset: 9,
            generation: 3,
            flags: 0,
        }
        .encode();
        for i in 0..HEADER_LEN {
            for bit in 0..8 {
                let mut b = bytes;
                b[i] ^= 1 << bit;
                assert!(
                    SegmentHeader::decode(&b).is_err(),
                    "flip byte {i} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = SegmentHeader::new(0).encode();
        for len in 0..HEADER_LEN {
            assert!(matches!(
                SegmentHeader::decode(&bytes[..len]),
                Err(HeaderError::Short { .. })
            ));
        }
    }

    #[test]
    fn zero_header_is_named() {
        assert!(matches!(
            SegmentHeader::decode(&[0u8; 40]),
            Err(HeaderError::AllZero)
        ));
    }

    #[test]
    fn unknown_flags_are_rejected_even_with_good_crc() {
        let mut b = SegmentHeader {
            base_offset: 1,
            generation: 0,
            flags: 0,
        }
        .encode();
        b[27] = 1;
        let crc = crc32(&b[..28]);
        b[28..].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            SegmentHeader::decode(&b),
            Err(HeaderError::UnknownFlags { found: 1 })
        ));
    }
}
