//! One record.
//!
//! | field        | type            | meaning                                        |
//! |--------------|-----------------|------------------------------------------------|
//! | record_len   | u32             | bytes that follow this field                   |
//! | offset       | u64             | absolute offset in the partition               |
//! | timestamp_ms | i64             | milliseconds since the Unix epoch              |
//! | key_len      | i32             | -1 = no key                                    |
//! | key          | [u8; key_len]   |                                                |
//! | value_len    | u32             |                                                |
//! | value        | [u8; value_len] | empty value on a keyed record = tombstone      |
//! | crc32        | u32             | CRC(offset..value) XOR low 32 bits of generation |
//!
//! A `record_len` of 0 is unwritten (zeroed) space: the end of the data, not damage.

use super::{be_u32, be_u64, crc32};

/// Largest `record_len` any reader accepts (16 MiB).
pub const MAX_RECORD_LEN: u32 = 16 * 1024 * 1024;
/// Size of the `record_len` field.
pub const LEN_FIELD: usize = 4;

const OFFSET_LEN: usize = 8;
const TIMESTAMP_LEN: usize = 8;
const KEY_LEN_LEN: usize = 4;
const VALUE_LEN_LEN: usize = 4;
const CRC_LEN: usize = 4;

const OFFSET_AT: usize = LEN_FIELD;
const TIMESTAMP_AT: usize = OFFSET_AT + OFFSET_LEN;
const KEY_LEN_AT: usize = TIMESTAMP_AT + TIMESTAMP_LEN;
const KEY_AT: usize = KEY_LEN_AT + KEY_LEN_LEN;

/// `record_len` of a record with no key bytes and an empty value.
pub const RECORD_OVERHEAD: u32 =
    (OFFSET_LEN + TIMESTAMP_LEN + KEY_LEN_LEN + VALUE_LEN_LEN + CRC_LEN) as u32;

const _: () = assert!(RECORD_OVERHEAD == 28);
const _: () = assert!(KEY_AT == 24);

/// A decoded record, borrowing key and value from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// Bytes the record takes on disk, `record_len` field included.
    pub encoded_len: usize,
}

impl RecordView<'_> {
    /// A keyed record with an empty value deletes its key.
    pub fn is_tombstone(&self) -> bool {
        self.key.is_some() && self.value.is_empty()
    }
}

/// Why the bytes at a position are not a valid record. `position` is where the
/// record's `record_len` field starts, in the caller's coordinates.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// `record_len` is 0 (or fewer than 4 bytes remain and they are zero): unwritten space.
    #[error("zero bytes at position {position}: end of data")]
    Zero { position: u64 },
    /// The record runs past the end of the input.
    #[error("torn record at position {position}: needs {needed} bytes, only {available} remain")]
    Truncated {
        position: u64,
        needed: u64,
        available: u64,
    },
    /// `record_len` is outside `28 ..= MAX_RECORD_LEN`.
    #[error("implausible record_len {record_len} at position {position} (allowed 28..={MAX_RECORD_LEN})")]
    ImplausibleLength { position: u64, record_len: u32 },
    /// `key_len` is neither -1 nor within the record.
    #[error("bad key_len {key_len} at position {position} for record_len {record_len}")]
    BadKeyLen {
        position: u64,
        key_len: i32,
        record_len: u32,
    },
    /// `value_len` does not fill the rest of the record exactly.
    #[error("bad value_len {value_len} at position {position} (the record leaves {expected})")]
    BadValueLen {
        position: u64,
        value_len: u32,
        expected: u32,
    },
    /// The CRC does not match the payload under this file's generation.
    #[error(
        "CRC mismatch at position {position}: stored {stored:#010x}, expected {expected:#010x}"
    )]
    CrcMismatch {
        position: u64,
        stored: u32,
        expected: u32,
        computed: u32,
    },
    /// A complete record that a previous generation of a reused file wrote.
    #[error("stale record of generation {writer_generation} at position {position} (file generation {generation})")]
    StaleGeneration {
        position: u64,
        writer_generation: u32,
        generation: u64,
    },
    /// Encoding: the record would exceed `MAX_RECORD_LEN`.
    #[error("record of {len} bytes exceeds the maximum record_len {MAX_RECORD_LEN}")]
    TooLarge { len: u64 },
}

impl RecordError {
    /// Byte position where the problem starts.
    pub fn position(&self) -> u64 {
        match *self {
            RecordError::Zero { position }
            | RecordError::Truncated { position, .. }
            | RecordError::ImplausibleLength { position, .. }
            | RecordError::BadKeyLen { position, .. }
            | RecordError::BadValueLen { position, .. }
            | RecordError::CrcMismatch { position, .. }
            | RecordError::StaleGeneration { position, .. } => position,
            RecordError::TooLarge { .. } => 0,
        }
    }

    /// Stable machine-readable name used in reports.
    pub fn kind(&self) -> &'static str {
        match self {
            RecordError::Zero { .. } => "zero_tail",
            RecordError::Truncated { .. } => "torn_record",
            RecordError::ImplausibleLength { .. } => "implausible_length",
            RecordError::BadKeyLen { .. } => "bad_key_len",
            RecordError::BadValueLen { .. } => "bad_value_len",
            RecordError::CrcMismatch { .. } => "crc_mismatch",
            RecordError::StaleGeneration { .. } => "stale_generation",
            RecordError::TooLarge { .. } => "too_large",
        }
    }
}

/// `record_len` for a key of `key_len` bytes (or none) and a value of `value_len`.
pub fn record_len(key_len: Option<usize>, value_len: usize) -> Option<u32> {
    let total = u64::from(RECORD_OVERHEAD)
        .checked_add(key_len.unwrap_or(0) as u64)?
        .checked_add(value_len as u64)?;
    u32::try_from(total).ok().filter(|&l| l <= MAX_RECORD_LEN)
}

/// Bytes a record takes on disk, `record_len` field included, or `None` if too large.
pub fn encoded_len(key_len: Option<usize>, value_len: usize) -> Option<usize> {
    record_len(key_len, value_len).map(|l| l as usize + LEN_FIELD)
}

/// What the `record_len` field at the start of a buffer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LenPrefix {
    /// Unwritten space, the end of the data: `record_len` is 0, or fewer than
    /// [`LEN_FIELD`] bytes remain and all of them are zero.
    Zero,
    /// `record_len` is outside `28 ..= MAX_RECORD_LEN`.
    Implausible { record_len: u32 },
    /// The buffer ends first: the record (or, before the whole field is there, its
    /// `record_len` field) takes `needed` bytes from the start of the buffer, which
    /// holds fewer. `needed` never exceeds `MAX_RECORD_LEN + LEN_FIELD`.
    Short { needed: usize },
    /// The buffer holds the whole record claimed: `encoded_len` bytes, `record_len`
    /// field included.
    Whole { encoded_len: usize },
}

/// Reads and classifies the `record_len` field at the start of `buf`: the one
/// parser of a record's length prefix.
pub fn len_prefix(buf: &[u8]) -> LenPrefix {
    let Some(record_len) = be_u32(buf, 0) else {
        if buf.iter().all(|&b| b == 0) {
            return LenPrefix::Zero;
        }
        return LenPrefix::Short { needed: LEN_FIELD };
    };
    if record_len == 0 {
        return LenPrefix::Zero;
    }
    if !(RECORD_OVERHEAD..=MAX_RECORD_LEN).contains(&record_len) {
        return LenPrefix::Implausible { record_len };
    }
    let encoded_len = record_len as usize + LEN_FIELD;
    if buf.len() < encoded_len {
        LenPrefix::Short {
            needed: encoded_len,
        }
    } else {
        LenPrefix::Whole { encoded_len }
    }
}

/// Whether the start of a record claimed at the beginning of `buf`, which may run
/// past its end, can still be a valid record: its `key_len`, and its `value_len`
/// when `buf` reaches it, agree with its `record_len` as [`decode_record`] requires.
/// `true` when `buf` is too short to tell. A search after damage uses it to skip a
/// candidate without reading the whole record it claims: over random bytes nearly
/// every candidate fails it.
pub fn plausible_start(buf: &[u8]) -> bool {
    let Some(record_len) = be_u32(buf, 0) else {
        return true;
    };
    if !(RECORD_OVERHEAD..=MAX_RECORD_LEN).contains(&record_len) {
        return false;
    }
    let Some(key_len) = be_u32(buf, KEY_LEN_AT).map(|k| k as i32) else {
        return true;
    };
    let key_bytes = match key_len {
        -1 => 0,
        k if k >= 0 && (k as u32) <= record_len - RECORD_OVERHEAD => k as u32,
        _ => return false,
    };
    match be_u32(buf, KEY_AT + key_bytes as usize) {
        Some(value_len) => value_len == record_len - RECORD_OVERHEAD - key_bytes,
        None => true,
    }
}

/// Bytes the record at the start of `buf` claims to take (`record_len` field
/// included) when its `record_len` is plausible (`28 ..= MAX_RECORD_LEN`), whether or
/// not the rest of it checks out: lets a tool step over a damaged record and report
/// what follows it.
pub fn claimed_encoded_len(buf: &[u8]) -> Option<u64> {
    if buf.len() < LEN_FIELD {
        return None;
    }
    match len_prefix(buf) {
        LenPrefix::Short { needed }
        | LenPrefix::Whole {
            encoded_len: needed,
        } => Some(needed as u64),
        LenPrefix::Zero | LenPrefix::Implausible { .. } => None,
    }
}

/// CRC of a record's payload (offset .. value), before the generation XOR.
pub fn payload_crc(payload: &[u8]) -> u32 {
    crc32(payload)
}

/// Appends one encoded record to `out`; returns the bytes written.
pub fn encode_record(
    out: &mut Vec<u8>,
    offset: u64,
    timestamp_ms: i64,
    key: Option<&[u8]>,
    value: &[u8],
    generation: u64,
) -> Result<usize, RecordError> {
    let len = record_len(key.map(<[u8]>::len), value.len()).ok_or(RecordError::TooLarge {
        len: u64::from(RECORD_OVERHEAD) + key.map_or(0, |k| k.len() as u64) + value.len() as u64,
    })?;
    let start = out.len();
    out.reserve(len as usize + LEN_FIELD);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&timestamp_ms.to_be_bytes());
    match key {
        // The length bound above keeps key.len() under 16 MiB, so it fits an i32.
        Some(k) => {
            out.extend_from_slice(&(k.len() as i32).to_be_bytes());
            out.extend_from_slice(k);
        }
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value);
    let crc = crc32(out.get(start + LEN_FIELD..).unwrap_or(&[])) ^ generation as u32;
    out.extend_from_slice(&crc.to_be_bytes());
    Ok(out.len() - start)
}

/// Decodes the record at the start of `buf`. `position` is where `buf` starts in the
/// file (for errors); `generation` is the segment's, whose low 32 bits are XOR-ed
/// into every record's CRC.
///
/// Checks, before anything is copied: 4 bytes remain and `28 <= record_len <=
/// MAX_RECORD_LEN`; `record_len` bytes remain; `key_len` is -1 or fits and
/// `value_len` is exactly the rest; the CRC matches.
pub fn decode_record(
    buf: &[u8],
    position: u64,
    generation: u64,
) -> Result<RecordView<'_>, RecordError> {
    let total = match len_prefix(buf) {
        LenPrefix::Zero => return Err(RecordError::Zero { position }),
        LenPrefix::Implausible { record_len } => {
            return Err(RecordError::ImplausibleLength {
                position,
                record_len,
            })
        }
        LenPrefix::Short { needed } => {
            return Err(RecordError::Truncated {
                position,
                needed: needed as u64,
                available: buf.len() as u64,
            })
        }
        LenPrefix::Whole { encoded_len } => encoded_len,
    };
    let Some(rec) = buf.get(..total) else {
        return Err(RecordError::Truncated {
            position,
            needed: total as u64,
            available: buf.len() as u64,
        });
    };
    // `len_prefix` bounds it by MAX_RECORD_LEN, so it fits a u32.
    let record_len = (total - LEN_FIELD) as u32;
    let key_len = be_u32(rec, KEY_LEN_AT).unwrap_or(0) as i32;
    let key_bytes = match key_len {
        -1 => None,
        k if k >= 0 && (k as u32) <= record_len - RECORD_OVERHEAD => Some(k as usize),
        _ => {
            return Err(RecordError::BadKeyLen {
                position,
                key_len,
                record_len,
            })
        }
    };
    let key_end = KEY_AT + key_bytes.unwrap_or(0);
    let value_len = be_u32(rec, key_end).unwrap_or(u32::MAX);
    let expected = record_len - RECORD_OVERHEAD - key_bytes.unwrap_or(0) as u32;
    if value_len != expected {
        return Err(RecordError::BadValueLen {
            position,
            value_len,
            expected,
        });
    }
    let value_at = key_end + VALUE_LEN_LEN;
    let crc_at = value_at + value_len as usize;
    let stored = be_u32(rec, crc_at).unwrap_or(0);
    let computed = crc32(rec.get(LEN_FIELD..crc_at).unwrap_or(&[]));
    let expected_crc = computed ^ generation as u32;
    if stored != expected_crc {
        let writer_generation = stored ^ computed;
        if writer_generation < generation as u32 {
            return Err(RecordError::StaleGeneration {
                position,
                writer_generation,
                generation,
            });
        }
        return Err(RecordError::CrcMismatch {
            position,
            stored,
            expected: expected_crc,
            computed,
        });
    }
    Ok(RecordView {
        offset: be_u64(rec, OFFSET_AT).unwrap_or(0),
        timestamp_ms: be_u64(rec, TIMESTAMP_AT).unwrap_or(0) as i64,
        key: key_bytes.and_then(|k| rec.get(KEY_AT..KEY_AT + k)),
        value: rec.get(value_at..crc_at).unwrap_or(&[]),
        encoded_len: total,
    })
}

/// The `offset` field of a record starting at `buf[0]`, read without checking the
/// record: lets a reader looking for the next record after damage skip positions
/// whose claimed offset cannot be the one it wants before decoding them.
pub fn peek_offset(buf: &[u8]) -> Option<u64> {
    be_u64(buf, OFFSET_AT)
}

/// The low 32 bits of the generation a structurally whole record at `buf[0]` was
/// written with, read back from its CRC (`stored_crc XOR crc(payload)`): the
/// generation of a segment whose header is lost. `None` when the bytes are not a
/// whole record.
pub fn record_generation(buf: &[u8]) -> Option<u32> {
    match decode_record(buf, 0, 0) {
        Ok(_) => Some(0),
        Err(RecordError::CrcMismatch {
            stored, computed, ..
        }) => Some(stored ^ computed),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plausible_start_refuses_only_what_decode_refuses() {
        for key in [None, Some(&b""[..]), Some(&b"key"[..])] {
            let mut buf = Vec::new();
            encode_record(&mut buf, 7, 1, key, b"value bytes", 3).unwrap();
            // Every prefix of a valid record passes.
            for k in 0..=buf.len() {
                assert!(plausible_start(&buf[..k]), "{key:?} prefix {k}");
            }
            let key_len_at = KEY_LEN_AT;
            let value_len_at = KEY_AT + key.map_or(0, <[u8]>::len);
            // A key length or value length that disagrees with record_len fails as
            // soon as the prefix holds it, and decode says so too.
            for (at, bad) in [
                (key_len_at, 1000u32),
                (key_len_at, (-2i32) as u32),
                (value_len_at, 9),
            ] {
                let mut b = buf.clone();
                b[at..at + 4].copy_from_slice(&bad.to_be_bytes());
                assert!(decode_record(&b, 0, 3).is_err());
                assert!(plausible_start(&b[..at]), "not yet known at {at}");
                assert!(!plausible_start(&b[..at + 4]), "{key:?} {bad} at {at}");
            }
        }
        assert!(!plausible_start(&[0, 0, 0, 1]), "record_len too small");
        assert!(!plausible_start(&[0xff, 0, 0, 0]), "record_len too large");
    }

    #[test]
    fn claimed_len_steps_over_a_damaged_record() {
        let mut buf = Vec::new();
        let n = encode_record(&mut buf, 5, 0, None, b"abc", 0).unwrap();
        *buf.last_mut().unwrap() ^= 1;
        assert_eq!(claimed_encoded_len(&buf), Some(n as u64));
        assert_eq!(claimed_encoded_len(&[0, 0, 0, 0]), None);
        assert_eq!(claimed_encoded_len(&[0, 0, 0]), None);
        assert_eq!(claimed_encoded_len(&[0xff, 0, 0, 0]), None);
    }

    #[test]
    fn len_prefix_classes() {
        let mut buf = Vec::new();
        let n = encode_record(&mut buf, 5, 0, None, b"abc", 0).unwrap();
        assert_eq!(len_prefix(&buf), LenPrefix::Whole { encoded_len: n });
        assert_eq!(len_prefix(&buf[..n - 1]), LenPrefix::Short { needed: n });
        assert_eq!(len_prefix(&buf[..4]), LenPrefix::Short { needed: n });
        assert_eq!(len_prefix(&buf[..3]), LenPrefix::Zero);
        assert_eq!(
            len_prefix(&[0, 0, 1]),
            LenPrefix::Short { needed: LEN_FIELD }
        );
        assert_eq!(len_prefix(&[]), LenPrefix::Zero);
        assert_eq!(len_prefix(&[0; 8]), LenPrefix::Zero);
        assert_eq!(
            len_prefix(&27u32.to_be_bytes()),
            LenPrefix::Implausible { record_len: 27 }
        );
        assert_eq!(
            len_prefix(&(MAX_RECORD_LEN + 1).to_be_bytes()),
            LenPrefix::Implausible {
                record_len: MAX_RECORD_LEN + 1
            }
        );
    }

    fn one(key: Option<&[u8]>, value: &[u8], generation: u64) -> Vec<u8> {
        let mut v = Vec::new();
        encode_record(&mut v, 42, 1_700_000_000_000, key, value, generation).unwrap();
        v
    }

    #[test]
    fn round_trip_shapes() {
        for key in [None, Some(&b""[..]), Some(&b"k"[..])] {
            for value in [&b""[..], b"v", &[0u8; 300][..]] {
                for generation in [0, 1, 7, u64::MAX] {
                    let bytes = one(key, value, generation);
                    let r = decode_record(&bytes, 100, generation).unwrap();
                    assert_eq!((r.offset, r.key, r.value), (42, key, value));
                    assert_eq!(r.encoded_len, bytes.len());
                    let mut again = Vec::new();
                    encode_record(
                        &mut again,
                        r.offset,
                        r.timestamp_ms,
                        r.key,
                        r.value,
                        generation,
                    )
                    .unwrap();
                    assert_eq!(again, bytes);
                }
            }
        }
    }

    #[test]
    fn every_byte_flip_is_rejected() {
        let bytes = one(Some(b"user-42"), b"{\"n\":1}", 3);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                let r = decode_record(&b, 0, 3);
                assert!(r.is_err(), "flip of byte {i} bit {bit} accepted: {r:?}");
            }
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = one(Some(b"key"), b"value", 0);
        for len in 1..bytes.len() {
            let r = decode_record(&bytes[..len], 0, 0);
            if bytes[..len].iter().all(|&b| b == 0) {
                // The high bytes of a small record_len are zero: indistinguishable from unwritten space.
                assert!(matches!(r, Err(RecordError::Zero { .. })), "cut at {len}");
            } else {
                assert!(
                    matches!(r, Err(RecordError::Truncated { .. })),
                    "cut at {len}"
                );
            }
        }
        assert!(matches!(
            decode_record(&[], 0, 0),
            Err(RecordError::Zero { .. })
        ));
    }

    #[test]
    fn lengths_at_and_past_limits() {
        let mut b = vec![0u8; 64];
        for (len, ok) in [
            (27u32, false),
            (28, true),
            (MAX_RECORD_LEN, true),
            (MAX_RECORD_LEN + 1, false),
            (u32::MAX, false),
        ] {
            b[..4].copy_from_slice(&len.to_be_bytes());
            let r = decode_record(&b, 0, 0);
            if ok {
                assert!(
                    !matches!(r, Err(RecordError::ImplausibleLength { .. })),
                    "{len}"
                );
            } else {
                assert!(
                    matches!(r, Err(RecordError::ImplausibleLength { .. })),
                    "{len}"
                );
            }
        }
        let too_big = vec![0u8; MAX_RECORD_LEN as usize - 27];
        assert!(matches!(
            encode_record(&mut Vec::new(), 0, 0, None, &too_big, 0),
            Err(RecordError::TooLarge { .. })
        ));
        let just_fits = vec![0u8; MAX_RECORD_LEN as usize - 28];
        let bytes = one(None, &just_fits, 0);
        assert_eq!(
            decode_record(&bytes, 0, 0).unwrap().value.len(),
            just_fits.len()
        );
    }

    #[test]
    fn key_len_bounds() {
        let mut bytes = one(Some(b"abc"), b"xy", 0);
        for bad in [-2i32, 6, i32::MAX, i32::MIN] {
            bytes[20..24].copy_from_slice(&bad.to_be_bytes());
            assert!(
                matches!(
                    decode_record(&bytes, 0, 0),
                    Err(RecordError::BadKeyLen { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn stale_generation_is_named() {
        let bytes = one(Some(b"k"), b"v", 3);
        match decode_record(&bytes, 9, 5) {
            Err(RecordError::StaleGeneration {
                position: 9,
                writer_generation: 3,
                generation: 5,
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode_record(&bytes, 9, 2),
            Err(RecordError::CrcMismatch { .. })
        ));
    }

    #[test]
    fn zeros_mark_the_end() {
        assert!(matches!(
            decode_record(&[0; 100], 5, 0),
            Err(RecordError::Zero { position: 5 })
        ));
        assert!(matches!(
            decode_record(&[0; 3], 5, 0),
            Err(RecordError::Zero { .. })
        ));
        assert!(matches!(
            decode_record(&[0, 1], 5, 0),
            Err(RecordError::Truncated { .. })
        ));
    }
}
