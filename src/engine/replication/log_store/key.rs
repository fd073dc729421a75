//! The fixed 17-byte record key of a Raft log entry (docs/FORMAT.md, Raft logs):
//!
//! ```text
//! 0..8    term                   u64 big-endian
//! 8..16   leader node id         u64 big-endian (the entry's committed leader id)
//! 16      kind                   u8: 0 blank, 1 normal, 2 membership
//! ```
//!
//! Pure functions over bytes; decoding never panics.
#![deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::panic)]

/// Bytes of an entry key.
pub const ENTRY_KEY_LEN: usize = 17;
const _: () = assert!(ENTRY_KEY_LEN == 8 + 8 + 1);

/// What an entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// No payload (a new leader's first entry).
    Blank,
    /// An application payload ([`super::EntryCodec`] bytes).
    Normal,
    /// A membership change (JSON).
    Membership,
}

impl EntryKind {
    /// The kind's byte.
    pub fn byte(self) -> u8 {
        match self {
            EntryKind::Blank => 0,
            EntryKind::Normal => 1,
            EntryKind::Membership => 2,
        }
    }

    /// The kind of a byte, if it names one.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(EntryKind::Blank),
            1 => Some(EntryKind::Normal),
            2 => Some(EntryKind::Membership),
            _ => None,
        }
    }
}

/// A decoded entry key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryKey {
    pub term: u64,
    pub leader: u64,
    pub kind: EntryKind,
}

/// Why a record key is not an entry key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EntryKeyError {
    #[error("the record has no key")]
    Missing,
    #[error("entry key is {len} bytes, not {ENTRY_KEY_LEN}")]
    Length { len: usize },
    #[error("unknown entry kind {kind}")]
    Kind { kind: u8 },
}

/// Encodes a key.
pub fn encode_entry_key(key: &EntryKey) -> [u8; ENTRY_KEY_LEN] {
    let mut out = [0u8; ENTRY_KEY_LEN];
    let (term, rest) = out.split_at_mut(8);
    let (leader, kind) = rest.split_at_mut(8);
    term.copy_from_slice(&key.term.to_be_bytes());
    leader.copy_from_slice(&key.leader.to_be_bytes());
    if let Some(k) = kind.first_mut() {
        *k = key.kind.byte();
    }
    out
}

/// Decodes a record's key as an entry key.
pub fn decode_entry_key(key: Option<&[u8]>) -> Result<EntryKey, EntryKeyError> {
    let key = key.ok_or(EntryKeyError::Missing)?;
    let bytes: &[u8; ENTRY_KEY_LEN] = key
        .try_into()
        .map_err(|_| EntryKeyError::Length { len: key.len() })?;
    let (term, rest) = bytes.split_at(8);
    let (leader, kind) = rest.split_at(8);
    let word = |b: &[u8]| <[u8; 8]>::try_from(b).map(u64::from_be_bytes);
    let term = word(term).map_err(|_| EntryKeyError::Length { len: key.len() })?;
    let leader = word(leader).map_err(|_| EntryKeyError::Length { len: key.len() })?;
    let kind_byte = kind.first().copied().unwrap_or(u8::MAX);
    let kind = EntryKind::from_byte(kind_byte).ok_or(EntryKeyError::Kind { kind: kind_byte })?;
    Ok(EntryKey { term, leader, kind })
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes_and_round_trip() {
        let key = EntryKey {
            term: 0x0102_0304_0506_0708,
            leader: 3,
            kind: EntryKind::Membership,
        };
        let bytes = encode_entry_key(&key);
        assert_eq!(
            bytes,
            [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 3, 2],
            "layout"
        );
        assert_eq!(decode_entry_key(Some(&bytes)).unwrap(), key);
    }

    #[test]
    fn refuses_every_other_length_and_unknown_kinds() {
        assert!(matches!(
            decode_entry_key(None),
            Err(EntryKeyError::Missing)
        ));
        let bytes = encode_entry_key(&EntryKey {
            term: 1,
            leader: 1,
            kind: EntryKind::Blank,
        });
        for len in 0..ENTRY_KEY_LEN {
            assert!(matches!(
                decode_entry_key(Some(&bytes[..len])),
                Err(EntryKeyError::Length { len: l }) if l == len
            ));
        }
        let mut long = bytes.to_vec();
        long.push(0);
        assert!(matches!(
            decode_entry_key(Some(&long)),
            Err(EntryKeyError::Length { len: 18 })
        ));
        let mut bad = bytes;
        bad[16] = 3;
        assert!(matches!(
            decode_entry_key(Some(&bad)),
            Err(EntryKeyError::Kind { kind: 3 })
        ));
    }
}
