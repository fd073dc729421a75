//! Index files: a sequence of 16-byte entries `(relative_offset u64, position u64)`,
//! no header. `relative_offset = offset - base_offset`; `position` is where the
//! record's `record_len` field starts in the `.log`.
//!
//! The rule is deterministic, so a rebuilt index equals the writer's byte for byte:
//! an entry for the first record, then one for each record whose position is at
//! least [`INDEX_INTERVAL_BYTES`] past the previous entry's position.

use super::{be_u64, HEADER_LEN};

/// Size of one index entry.
pub const INDEX_ENTRY_LEN: usize = 16;
/// Minimum distance in bytes between the positions of two consecutive entries.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;

const RELATIVE_OFFSET_AT: usize = 0;
const POSITION_AT: usize = RELATIVE_OFFSET_AT + 8;

const _: () = assert!(POSITION_AT + 8 == INDEX_ENTRY_LEN);
const _: () = assert!(INDEX_ENTRY_LEN == 16);

/// One index entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub relative_offset: u64,
    pub position: u64,
}

/// Why an index file is not valid for its log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    #[error("index length {len} is not a multiple of {INDEX_ENTRY_LEN} (partial entry at byte {})", len - len % INDEX_ENTRY_LEN as u64)]
    PartialEntry { len: u64 },
    #[error("index entry at byte {at} does not increase: relative_offset {relative_offset}, position {position}")]
    NotIncreasing {
        at: u64,
        relative_offset: u64,
        position: u64,
    },
    #[error("index entry at byte {at} points at position {position}, outside the log's data (..{data_end})")]
    PastData {
        at: u64,
        position: u64,
        data_end: u64,
    },
    #[error("index entry at byte {at} is ({found_relative_offset}, {found_position}), the log gives ({relative_offset}, {position})")]
    WrongEntry {
        at: u64,
        found_relative_offset: u64,
        found_position: u64,
        relative_offset: u64,
        position: u64,
    },
    #[error("index has {found} entries, the log gives {expected}; first missing or extra entry at byte {at}")]
    WrongCount { at: u64, found: u64, expected: u64 },
    /// Longer than any index a reader accepts: not read at all (no log under the
    /// segment size limit gives one this long).
    #[error("index file is {len} bytes, more than the {max} any index may have")]
    TooLarge { len: u64, max: u64 },
    /// A directory, FIFO or other special file where the index should be: not read.
    #[error("the index is a {what}, not a regular file")]
    NotRegularFile { what: &'static str },
}

impl IndexError {
    /// Byte position in the index file where the problem starts.
    pub fn position(&self) -> u64 {
        match *self {
            IndexError::PartialEntry { len } => len - len % INDEX_ENTRY_LEN as u64,
            IndexError::NotIncreasing { at, .. }
            | IndexError::PastData { at, .. }
            | IndexError::WrongEntry { at, .. }
            | IndexError::WrongCount { at, .. } => at,
            IndexError::TooLarge { max, .. } => max,
            IndexError::NotRegularFile { .. } => 0,
        }
    }

    /// Stable machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            IndexError::PartialEntry { .. } => "partial_index_entry",
            IndexError::NotIncreasing { .. } => "index_not_increasing",
            IndexError::PastData { .. } => "index_past_data",
            IndexError::WrongEntry { .. } => "wrong_index_entry",
            IndexError::WrongCount { .. }
            | IndexError::TooLarge { .. }
            | IndexError::NotRegularFile { .. } => "wrong_index_length",
        }
    }
}

impl IndexEntry {
    /// The entry's 16 bytes.
    pub fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut out = [0u8; INDEX_ENTRY_LEN];
        let (rel, pos) = out.split_at_mut(POSITION_AT);
        rel.copy_from_slice(&self.relative_offset.to_be_bytes());
        pos.copy_from_slice(&self.position.to_be_bytes());
        out
    }

    /// Appends the entry to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }

    /// Decodes the entry at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Option<IndexEntry> {
        Some(IndexEntry {
            relative_offset: be_u64(bytes, RELATIVE_OFFSET_AT)?,
            position: be_u64(bytes, POSITION_AT)?,
        })
    }
}

/// Encodes entries as the bytes of an index file: the one producer of index bytes.
pub fn encode_index(entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len().saturating_mul(INDEX_ENTRY_LEN));
    for e in entries {
        e.encode_into(&mut out);
    }
    out
}

/// Decodes a whole index file. Checks the length is a multiple of 16 and that both
/// fields strictly increase; `data_end` (if known) bounds every position.
pub fn decode_index(bytes: &[u8], data_end: Option<u64>) -> Result<Vec<IndexEntry>, IndexError> {
    let len = bytes.len() as u64;
    if len % INDEX_ENTRY_LEN as u64 != 0 {
        return Err(IndexError::PartialEntry { len });
    }
    let mut out = Vec::with_capacity(bytes.len() / INDEX_ENTRY_LEN);
    let mut prev: Option<IndexEntry> = None;
    for (i, chunk) in bytes.chunks_exact(INDEX_ENTRY_LEN).enumerate() {
        let at = (i * INDEX_ENTRY_LEN) as u64;
        let Some(e) = IndexEntry::decode(chunk) else {
            break;
        };
        if let Some(p) = prev {
            if e.relative_offset <= p.relative_offset || e.position <= p.position {
                return Err(IndexError::NotIncreasing {
                    at,
                    relative_offset: e.relative_offset,
                    position: e.position,
                });
            }
        }
        if e.position < HEADER_LEN as u64 || data_end.is_some_and(|end| e.position >= end) {
            return Err(IndexError::PastData {
                at,
                position: e.position,
                data_end: data_end.unwrap_or(0),
            });
        }
        out.push(e);
        prev = Some(e);
    }
    Ok(out)
}

/// Applies the index rule to records as they are written or scanned, in order.
#[derive(Clone, Debug, Default)]
pub struct IndexBuilder {
    last_position: Option<u64>,
}

impl IndexBuilder {
    /// A builder for an empty segment.
    pub fn new() -> Self {
        IndexBuilder {
            last_position: None,
        }
    }

    /// A builder that continues after an existing last entry.
    pub fn resume(last: Option<IndexEntry>) -> Self {
        IndexBuilder {
            last_position: last.map(|e| e.position),
        }
    }

    /// Position of the newest entry, if any.
    pub fn last_position(&self) -> Option<u64> {
        self.last_position
    }

    /// Records a record at `position` with `offset`; returns the entry the rule
    /// requires for it, if any.
    pub fn observe(&mut self, base_offset: u64, offset: u64, position: u64) -> Option<IndexEntry> {
        let due = match self.last_position {
            None => true,
            Some(last) => position >= last.saturating_add(INDEX_INTERVAL_BYTES),
        };
        if !due {
            return None;
        }
        self.last_position = Some(position);
        Some(IndexEntry {
            relative_offset: offset.wrapping_sub(base_offset),
            position,
        })
    }
}

/// Finds the last entry whose relative offset is at or before `relative_offset`.
pub fn lookup(entries: &[IndexEntry], relative_offset: u64) -> Option<IndexEntry> {
    let idx = entries.partition_point(|e| e.relative_offset <= relative_offset);
    idx.checked_sub(1).and_then(|i| entries.get(i)).copied()
}

/// Looks up in raw index bytes without decoding the whole file; entries that do not
/// decode end the search.
pub fn lookup_bytes(bytes: &[u8], relative_offset: u64) -> Option<IndexEntry> {
    let n = bytes.len() / INDEX_ENTRY_LEN;
    let entry = |i: usize| {
        bytes
            .get(i * INDEX_ENTRY_LEN..)
            .and_then(IndexEntry::decode)
    };
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match entry(mid) {
            Some(e) if e.relative_offset <= relative_offset => lo = mid + 1,
            _ => hi = mid,
        }
    }
    lo.checked_sub(1).and_then(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_and_round_trip() {
        let mut b = IndexBuilder::new();
        let mut entries = Vec::new();
        let mut pos = 32u64;
        for off in 100..400u64 {
            if let Some(e) = b.observe(100, off, pos) {
                entries.push(e);
            }
            pos += 100;
        }
        assert_eq!(
            entries[0],
            IndexEntry {
                relative_offset: 0,
                position: 32
            }
        );
        for w in entries.windows(2) {
            assert!(w[1].position - w[0].position >= INDEX_INTERVAL_BYTES);
            assert!(w[1].position - w[0].position < INDEX_INTERVAL_BYTES + 100);
        }
        let bytes = encode_index(&entries);
        assert_eq!(decode_index(&bytes, Some(pos)).unwrap(), entries);
        assert_eq!(lookup(&entries, 0), Some(entries[0]));
        assert_eq!(lookup(&entries, 299), entries.last().copied());
        assert_eq!(lookup_bytes(&bytes, 299), entries.last().copied());
        assert_eq!(lookup_bytes(&bytes, 45), lookup(&entries, 45));
    }

    #[test]
    fn partial_and_non_increasing_rejected() {
        let e = IndexEntry {
            relative_offset: 0,
            position: 32,
        };
        let mut bytes = e.encode().to_vec();
        bytes.extend_from_slice(&e.encode());
        assert!(matches!(
            decode_index(&bytes, None),
            Err(IndexError::NotIncreasing { at: 16, .. })
        ));
        assert!(matches!(
            decode_index(&bytes[..20], None),
            Err(IndexError::PartialEntry { len: 20 })
        ));
        assert!(matches!(
            decode_index(&bytes[..16], Some(32)),
            Err(IndexError::PastData { .. })
        ));
    }
}
