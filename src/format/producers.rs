//! `producers.journal` and `producers.json`: the idempotent producers' state.
//!
//! ```text
//! producers.journal
//! +-------+---------+----------+----------------------------+
//! | magic | version | reserved | entries …                  |
//! | SEGP  | u16 = 1 | u16 = 0  |                            |
//! +-------+---------+----------+----------------------------+
//! entry
//! +-----------+------+-------------+-------+-----------+-------+-----------+
//! | entry_len | kind | producer_id | epoch | topic_len | topic | partition |
//! | u32       | u8   | u64         | u16   | u16       |       | u32       |
//! +-----------+------+-------------+-------+-----------+-------+-----------+
//! +---------------+---------------+-------------+-------------+--------------+-------+
//! | base_sequence | last_sequence | base_offset | last_offset | timestamp_ms | crc32 |
//! | i32           | i32           | u64         | u64         | i64          | u32   |
//! +---------------+---------------+-------------+-------------+--------------+-------+
//! ```
//! Big-endian. `entry_len` counts the bytes after itself, crc included; `crc32` covers
//! `kind` … `timestamp_ms`. Kind 1: a batch accepted for (producer_id, topic,
//! partition) covering sequences `base_sequence..=last_sequence` at offsets
//! `base_offset..=last_offset`. Kind 2: a producer id handed out (`epoch` its epoch;
//! the topic is empty and the other fields zero). A reader stops at the first entry
//! that is cut short (a torn tail: cut there) and reports an entry whose CRC or
//! fields are wrong with its byte position (corruption).
//!
//! `producers.json` is the snapshot the journal is truncated after:
//! `{"version": 1, "next_producer_id": N, "producers": [{"producer_id", "epoch",
//! "last_seen_ms", "batches": [{"topic", "partition", "base_sequence",
//! "last_sequence", "base_offset", "last_offset"}]}]}`.

use serde::{Deserialize, Serialize};

use super::names::{validate_name, NAME_LEN_MAX};

pub const JOURNAL_FILE: &str = "producers.journal";
pub const SNAPSHOT_FILE: &str = "producers.json";
pub const JOURNAL_MAGIC: [u8; 4] = *b"SEGP";
pub const JOURNAL_VERSION: u16 = 1;
pub const JOURNAL_HEADER_LEN: usize = 8;
/// Bytes of an entry besides the topic name, `entry_len` included.
pub const ENTRY_FIXED_LEN: usize = 4 + 1 + 8 + 2 + 2 + 4 + 4 + 4 + 8 + 8 + 8 + 4;
/// Largest `entry_len`.
pub const ENTRY_LEN_MAX: usize = ENTRY_FIXED_LEN - 4 + NAME_LEN_MAX;
/// Batches kept per (producer, partition), as Kafka.
pub const BATCHES_KEPT: usize = 5;
/// Largest snapshot any reader accepts.
pub const SNAPSHOT_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Largest journal any reader accepts (checked before it is read). The broker
/// snapshots its table and cuts the journal back to its header every 100 000 entries
/// (`engine::producers::SNAPSHOT_EVERY_ENTRIES`), each at most `4 + ENTRY_LEN_MAX` =
/// 306 bytes: about 31 MB. The limit leaves 8 times that for the entries written in
/// the group commit that crosses the count and for snapshots that fail (retried at
/// every commit); the broker refuses entries that would take the journal past it.
pub const JOURNAL_BYTES_MAX: usize = 256 * 1024 * 1024;

const _: () = assert!(ENTRY_FIXED_LEN == 57);
const _: () = assert!(JOURNAL_HEADER_LEN == 8);

pub const KIND_BATCH: u8 = 1;
pub const KIND_INIT: u8 = 2;

/// One journal entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    pub kind: u8,
    pub producer_id: u64,
    pub epoch: u16,
    pub topic: String,
    pub partition: u32,
    pub base_sequence: i32,
    pub last_sequence: i32,
    pub base_offset: u64,
    pub last_offset: u64,
    pub timestamp_ms: i64,
}

/// Why the journal cannot be read at some position.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalError {
    #[error("journal header is invalid")]
    BadHeader,
    #[error("entry at byte {position} is cut short")]
    Torn { position: u64 },
    #[error("entry at byte {position}: length {len} is outside {min}..={max}")]
    BadLength {
        position: u64,
        len: usize,
        min: usize,
        max: usize,
    },
    #[error("entry at byte {position}: checksum {actual:#010x}, expected {expected:#010x}")]
    Checksum {
        position: u64,
        expected: u32,
        actual: u32,
    },
    #[error("entry at byte {position}: {detail}")]
    BadField { position: u64, detail: String },
}

/// The journal's first bytes.
pub fn journal_header() -> [u8; JOURNAL_HEADER_LEN] {
    let mut h = [0u8; JOURNAL_HEADER_LEN];
    for (d, s) in h
        .iter_mut()
        .zip(JOURNAL_MAGIC.iter().chain(&JOURNAL_VERSION.to_be_bytes()))
    {
        *d = *s;
    }
    h
}

/// Checks the journal header.
pub fn check_journal_header(bytes: &[u8]) -> Result<(), JournalError> {
    match bytes.get(..JOURNAL_HEADER_LEN) {
        Some(h) if h == journal_header() => Ok(()),
        _ => Err(JournalError::BadHeader),
    }
}

/// Appends one encoded entry. The topic must be a valid name (or empty for kind 2).
pub fn encode_entry(out: &mut Vec<u8>, e: &JournalEntry) {
    let topic = e
        .topic
        .as_bytes()
        .get(..e.topic.len().min(NAME_LEN_MAX))
        .unwrap_or(&[]);
    let start = out.len();
    out.extend_from_slice(&((ENTRY_FIXED_LEN - 4 + topic.len()) as u32).to_be_bytes());
    out.push(e.kind);
    out.extend_from_slice(&e.producer_id.to_be_bytes());
    out.extend_from_slice(&e.epoch.to_be_bytes());
    out.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    out.extend_from_slice(topic);
    out.extend_from_slice(&e.partition.to_be_bytes());
    out.extend_from_slice(&e.base_sequence.to_be_bytes());
    out.extend_from_slice(&e.last_sequence.to_be_bytes());
    out.extend_from_slice(&e.base_offset.to_be_bytes());
    out.extend_from_slice(&e.last_offset.to_be_bytes());
    out.extend_from_slice(&e.timestamp_ms.to_be_bytes());
    let crc = crc32fast::hash(out.get(start + 4..).unwrap_or(&[]));
    out.extend_from_slice(&crc.to_be_bytes());
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

/// Decodes the entry at `bytes[at..]`; returns it and its encoded length. `position`
/// is `at`'s byte position in the file (for errors).
pub fn decode_entry(bytes: &[u8], at: usize) -> Result<(JournalEntry, usize), JournalError> {
    let position = at as u64;
    let rest = bytes.get(at..).unwrap_or(&[]);
    if rest.len() < 4 {
        return Err(JournalError::Torn { position });
    }
    let len = u32::from_be_bytes(be(rest, 0)) as usize;
    let min = ENTRY_FIXED_LEN - 4;
    if len < min || len > ENTRY_LEN_MAX {
        return Err(JournalError::BadLength {
            position,
            len,
            min,
            max: ENTRY_LEN_MAX,
        });
    }
    let Some(body) = rest.get(4..4 + len) else {
        return Err(JournalError::Torn { position });
    };
    let (payload, crc) = body.split_at(len - 4);
    let expected = u32::from_be_bytes(be(crc, 0));
    let actual = crc32fast::hash(payload);
    if expected != actual {
        return Err(JournalError::Checksum {
            position,
            expected,
            actual,
        });
    }
    let kind = payload.first().copied().unwrap_or(0);
    let producer_id = u64::from_be_bytes(be(payload, 1));
    let epoch = u16::from_be_bytes(be(payload, 9));
    let topic_len = u16::from_be_bytes(be(payload, 11)) as usize;
    let bad = |detail: String| JournalError::BadField { position, detail };
    if topic_len != len - min {
        return Err(bad(format!(
            "topic length {topic_len} does not fit entry length {len}"
        )));
    }
    let topic = std::str::from_utf8(payload.get(13..13 + topic_len).unwrap_or(&[]))
        .map_err(|_| bad("topic is not UTF-8".into()))?
        .to_string();
    let f = 13 + topic_len;
    let e = JournalEntry {
        kind,
        producer_id,
        epoch,
        topic,
        partition: u32::from_be_bytes(be(payload, f)),
        base_sequence: i32::from_be_bytes(be(payload, f + 4)),
        last_sequence: i32::from_be_bytes(be(payload, f + 8)),
        base_offset: u64::from_be_bytes(be(payload, f + 12)),
        last_offset: u64::from_be_bytes(be(payload, f + 20)),
        timestamp_ms: i64::from_be_bytes(be(payload, f + 28)),
    };
    match e.kind {
        KIND_BATCH => {
            validate_name(&e.topic).map_err(|x| bad(x.to_string()))?;
            if e.base_sequence < 0
                || e.last_sequence < e.base_sequence
                || e.last_offset < e.base_offset
            {
                return Err(bad("sequence or offset range is inverted".into()));
            }
        }
        KIND_INIT if e.topic.is_empty() => {}
        k => return Err(bad(format!("unknown kind {k}"))),
    }
    Ok((e, 4 + len))
}

/// What a journal holds: its entries up to the first problem, the byte length of the
/// good prefix, and that problem (`Torn` = a tail to cut, anything else corruption).
///
/// Zeros from an entry's position to the end of the file are the journal's zero
/// tail (space the broker wrote ahead of its entries, so that appending does not grow
/// the file): the entries end there, and that is no problem. An entry that fails its
/// checks and is followed by zeros only, its own bytes ending in zeros, is an entry
/// written in part before a crash: `Torn`, like one the file's end cuts short.
pub fn scan_journal(bytes: &[u8]) -> (Vec<JournalEntry>, usize, Option<JournalError>) {
    if let Err(e) = check_journal_header(bytes) {
        return (Vec::new(), 0, Some(e));
    }
    let mut at = JOURNAL_HEADER_LEN;
    let mut out = Vec::new();
    while at < bytes.len() {
        match decode_entry(bytes, at) {
            Ok((e, n)) => {
                out.push(e);
                at += n;
            }
            Err(e) => {
                let rest = bytes.get(at..).unwrap_or(&[]);
                if rest.iter().all(|&b| b == 0) {
                    return (out, at, None);
                }
                let e = match e {
                    JournalError::Checksum { position, .. }
                    | JournalError::BadField { position, .. }
                        if written_in_part(rest) =>
                    {
                        JournalError::Torn { position }
                    }
                    e => e,
                };
                return (out, at, Some(e));
            }
        }
    }
    (out, at, None)
}

/// Whether `rest`, an entry that fails its checks and what follows it, looks like an
/// entry whose write stopped part-way before a zero tail: its length is valid, it
/// ends in a zero byte, and every byte after it is zero.
fn written_in_part(rest: &[u8]) -> bool {
    let Some(len) = rest.get(..4).map(|b| u32::from_be_bytes(be(b, 0)) as usize) else {
        return false;
    };
    if !(ENTRY_FIXED_LEN - 4..=ENTRY_LEN_MAX).contains(&len) {
        return false;
    }
    let end = 4 + len;
    rest.get(end - 1) == Some(&0) && rest.get(end..).is_some_and(|t| t.iter().all(|&b| b == 0))
}

/// One batch in the snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBatch {
    pub topic: String,
    pub partition: u32,
    pub base_sequence: i32,
    pub last_sequence: i32,
    pub base_offset: u64,
    pub last_offset: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotProducer {
    pub producer_id: u64,
    pub epoch: u16,
    pub last_seen_ms: i64,
    pub batches: Vec<SnapshotBatch>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    pub version: u32,
    pub next_producer_id: u64,
    pub producers: Vec<SnapshotProducer>,
}

pub fn encode_snapshot(s: &Snapshot) -> Vec<u8> {
    let mut v = serde_json::to_vec(s).unwrap_or_default();
    v.push(b'\n');
    v
}

pub fn decode_snapshot(bytes: &[u8]) -> Result<Snapshot, String> {
    if bytes.len() > SNAPSHOT_BYTES_MAX {
        return Err(format!(
            "{} bytes, over the limit of {SNAPSHOT_BYTES_MAX}",
            bytes.len()
        ));
    }
    let s: Snapshot = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if s.version != 1 {
        return Err(format!("version {} is not supported", s.version));
    }
    for p in &s.producers {
        for b in &p.batches {
            validate_name(&b.topic).map_err(|e| e.to_string())?;
        }
    }
    Ok(s)
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    fn entry() -> JournalEntry {
        JournalEntry {
            kind: KIND_BATCH,
            producer_id: 7,
            epoch: 1,
            topic: "t".into(),
            partition: 2,
            base_sequence: 10,
            last_sequence: 14,
            base_offset: 100,
            last_offset: 104,
            timestamp_ms: 5,
        }
    }

    #[test]
    fn round_trip_flip_and_cut() {
        let mut bytes = journal_header().to_vec();
        encode_entry(&mut bytes, &entry());
        assert_eq!(bytes.len(), JOURNAL_HEADER_LEN + ENTRY_FIXED_LEN + 1);
        let (es, good, problem) = scan_journal(&bytes);
        assert_eq!((es, good, problem), (vec![entry()], bytes.len(), None));
        for i in JOURNAL_HEADER_LEN..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            let (es, good, problem) = scan_journal(&b);
            assert!(es.is_empty(), "flip at {i}");
            assert_eq!(good, JOURNAL_HEADER_LEN);
            assert!(problem.is_some(), "flip at {i}");
        }
        for cut in JOURNAL_HEADER_LEN + 1..bytes.len() {
            let (es, good, problem) = scan_journal(&bytes[..cut]);
            assert!(es.is_empty());
            assert_eq!(good, JOURNAL_HEADER_LEN);
            if bytes[JOURNAL_HEADER_LEN..cut].iter().all(|&b| b == 0) {
                // The length's high bytes alone: zeros, read as the zero tail.
                assert_eq!(problem, None, "cut at {cut}");
                continue;
            }
            assert!(
                matches!(
                    problem,
                    Some(JournalError::Torn { position: 8 } | JournalError::BadLength { .. })
                ),
                "cut at {cut}: {problem:?}"
            );
        }
        assert!(matches!(
            scan_journal(b"SEGX\0\x01\0\0").2,
            Some(JournalError::BadHeader)
        ));
    }

    #[test]
    fn a_zero_tail_ends_the_entries_and_a_write_cut_short_before_it_is_torn() {
        let mut bytes = journal_header().to_vec();
        encode_entry(&mut bytes, &entry());
        let one = bytes.len();
        encode_entry(&mut bytes, &entry());
        let two = bytes.len();
        // Entries, then zeros: both entries, no problem.
        let mut z = bytes.clone();
        z.resize(two + 4096, 0);
        assert_eq!(scan_journal(&z), (vec![entry(), entry()], two, None));
        // The second entry written only in part (its end still zeros), zeros after.
        for kept in 4..two - one {
            let mut t = bytes[..one + kept].to_vec();
            t.resize(two + 100, 0);
            let (es, good, problem) = scan_journal(&t);
            assert_eq!((es.len(), good), (1, one), "kept {kept}");
            assert!(
                matches!(problem, Some(JournalError::Torn { position }) if position == one as u64),
                "kept {kept}: {problem:?}"
            );
        }
        // A whole entry that fails its checksum, zeros after: corruption, not a tail.
        let mut c = z.clone();
        c[one + 10] ^= 1;
        assert!(matches!(
            scan_journal(&c).2,
            Some(JournalError::Checksum { .. })
        ));
        // Zeros, then something that is not zero: a problem where the zeros start.
        let mut g = z.clone();
        g[two + 200] = 7;
        let (es, good, problem) = scan_journal(&g);
        assert_eq!((es.len(), good), (2, two));
        assert!(matches!(problem, Some(JournalError::BadLength { .. })));
    }

    #[test]
    fn golden_entry() {
        let mut b = Vec::new();
        encode_entry(&mut b, &entry());
        assert_eq!(&b[..4], &54u32.to_be_bytes());
        assert_eq!(b[4], KIND_BATCH);
        assert_eq!(&b[5..13], &7u64.to_be_bytes());
        assert_eq!(&b[15..17], &1u16.to_be_bytes());
        assert_eq!(b[17], b't');
    }
}
