//! The openraft type configuration of a partition's Raft group, and the payload of a
//! normal entry: one produce request's records, with the idempotent producer's stamp
//! when it has one.
//!
//! An entry's bytes: version u8 (1), flags u8 (1: a producer stamp follows, 2: a
//! proposal time follows), record count u32; then the stamp (producer id u64, epoch
//! u16, first sequence i32), the proposal time (i64 ms), and each record (timestamp
//! i64, key flag u8, key length u32 and bytes when flagged, value length u32 and
//! bytes). All big-endian.
//!
//! Invariants: an entry carries everything its apply needs, so that every replica
//! applies it the same way (timestamps are fixed by the leader before it proposes,
//! never by the state machine); [`EntryCodec::decode`] checks every count and length
//! against a limit before it allocates.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::log_store::{EntryCodec, EntryCodecError};
use crate::engine::partition::NewRecord;
use crate::format::wire::{RECORDS_PER_PARTITION_MAX, RECORD_FIELD_BYTES_MAX};

openraft::declare_raft_types!(
    /// One Raft group per replicated partition; node ids are the `--node-id`s.
    pub TypeConfig:
        D = ProduceEntry,
        R = ApplyResult,
        NodeId = u64,
        Node = openraft::impls::BasicNode,
);

/// The Raft handle of one partition's group.
pub type RaftGroup = openraft::Raft<TypeConfig, super::state_machine::PartitionStateMachine>;
/// A log id of this configuration.
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
/// The membership as the state machine keeps it.
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
/// An entry of this configuration.
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
/// A vote of this configuration.
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;

/// The version byte that starts an encoded [`ProduceEntry`].
pub const ENTRY_VERSION: u8 = 1;
const FLAG_PRODUCER: u8 = 1;
/// The entry carries the time its proposer made it ([`ProduceEntry::proposed_ms`]).
const FLAG_PROPOSED: u8 = 2;
const FLAG_KEY: u8 = 1;
/// timestamp, key flag, value length (a key adds its own length and bytes).
const RECORD_MIN_LEN: usize = 8 + 1 + 4;

/// An idempotent producer's identity and the sequence of the entry's first record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStamp {
    pub producer_id: u64,
    pub epoch: u16,
    pub first_sequence: i32,
}

/// One record of an entry, its timestamp already fixed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRecord {
    pub timestamp_ms: i64,
    #[serde(with = "opt_b64")]
    pub key: Option<Vec<u8>>,
    #[serde(with = "b64")]
    pub value: Vec<u8>,
}

/// A normal entry: the records of one produce request to one partition.
///
/// The records are kept in their entry encoding, in one shared buffer: cloning an
/// entry (the Raft log's cache, each follower's AppendEntries) costs a reference
/// count, writing it one copy, and reading its records borrows from the buffer.
#[derive(Clone, PartialEq, Eq)]
pub struct ProduceEntry {
    pub producer: Option<ProducerStamp>,
    /// The proposer's clock when it made the entry (entries of older nodes have
    /// none): the time every replica's state machine goes by, so that what expires
    /// is decided in the log's order, the same on every replica.
    pub proposed_ms: Option<i64>,
    count: u32,
    /// Each record: timestamp, key flag, key length and bytes when flagged, value
    /// length and bytes; checked by [`ProduceEntry::new`] or [`EntryCodec::decode`].
    records: bytes::Bytes,
}

impl ProduceEntry {
    /// An entry of `records`, in order, proposed at `now_ms`; a negative timestamp
    /// becomes `now_ms` (the node proposing fixes every timestamp, so that each
    /// replica applies the same).
    pub fn new<'a>(
        producer: Option<ProducerStamp>,
        records: impl IntoIterator<Item = NewRecord<'a>>,
        now_ms: i64,
    ) -> ProduceEntry {
        let mut e = Self::encoded(producer, records, Some(now_ms));
        e.proposed_ms = Some(now_ms);
        e
    }

    /// An entry of `records`; with `now_ms`, a negative timestamp becomes it.
    fn encoded<'a>(
        producer: Option<ProducerStamp>,
        records: impl IntoIterator<Item = NewRecord<'a>>,
        now_ms: Option<i64>,
    ) -> ProduceEntry {
        let mut out = Vec::new();
        let mut count = 0u32;
        for r in records {
            let ts = match now_ms {
                Some(now) if r.timestamp_ms < 0 => now,
                _ => r.timestamp_ms,
            };
            out.extend_from_slice(&ts.to_be_bytes());
            match r.key {
                Some(k) => {
                    out.push(FLAG_KEY);
                    out.extend_from_slice(&(k.len() as u32).to_be_bytes());
                    out.extend_from_slice(k);
                }
                None => out.push(0),
            }
            out.extend_from_slice(&(r.value.len() as u32).to_be_bytes());
            out.extend_from_slice(r.value);
            count += 1;
        }
        ProduceEntry {
            producer,
            proposed_ms: None,
            count,
            records: bytes::Bytes::from(out),
        }
    }

    /// How many records the entry holds.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the entry holds no record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The bytes of the records' encoding (a size estimate for buffers).
    pub fn encoded_len(&self) -> usize {
        self.records.len()
    }

    /// The records, borrowed from the entry.
    pub fn records(&self) -> Records<'_> {
        Records {
            cursor: Cursor {
                bytes: &self.records,
                at: 0,
            },
            left: self.count,
        }
    }
}

/// The records of a [`ProduceEntry`], in order.
pub struct Records<'a> {
    cursor: Cursor<'a>,
    left: u32,
}

impl<'a> Iterator for Records<'a> {
    type Item = NewRecord<'a>;

    fn next(&mut self) -> Option<NewRecord<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Checked when the entry was built or decoded: a failure here cannot happen,
        // and ends the records rather than panicking.
        read_record(&mut self.cursor).ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left as usize))
    }
}

/// One record at the cursor.
fn read_record<'a>(c: &mut Cursor<'a>) -> Result<NewRecord<'a>, EntryCodecError> {
    let timestamp_ms = c.u64("timestamp")? as i64;
    let key = match c.u8("key flag")? {
        0 => None,
        FLAG_KEY => Some(c.field("key")?),
        other => return Err(EntryCodecError(format!("bad key flag {other}"))),
    };
    let value = c.field("value")?;
    Ok(NewRecord {
        key,
        value,
        timestamp_ms,
    })
}

impl fmt::Debug for ProduceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProduceEntry")
            .field("producer", &self.producer)
            .field("proposed_ms", &self.proposed_ms)
            .field("records", &self.count)
            .field("bytes", &self.records.len())
            .finish()
    }
}

/// The JSON form of an entry (the JSON Raft RPCs): the producer and each record with
/// its bytes in base64.
#[derive(Serialize, Deserialize)]
struct EntryJson {
    producer: Option<ProducerStamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    proposed_ms: Option<i64>,
    records: Vec<EntryRecord>,
}

impl Serialize for ProduceEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EntryJson {
            producer: self.producer,
            proposed_ms: self.proposed_ms,
            records: self
                .records()
                .map(|r| EntryRecord {
                    timestamp_ms: r.timestamp_ms,
                    key: r.key.map(<[u8]>::to_vec),
                    value: r.value.to_vec(),
                })
                .collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ProduceEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let j = EntryJson::deserialize(d)?;
        if j.records.len() > RECORDS_PER_PARTITION_MAX as usize {
            return Err(serde::de::Error::custom(format!(
                "record count {} exceeds {RECORDS_PER_PARTITION_MAX}",
                j.records.len()
            )));
        }
        let too_long = j.records.iter().find(|r| {
            r.value.len() > RECORD_FIELD_BYTES_MAX as usize
                || r.key
                    .as_ref()
                    .is_some_and(|k| k.len() > RECORD_FIELD_BYTES_MAX as usize)
        });
        if too_long.is_some() {
            return Err(serde::de::Error::custom(format!(
                "a key or value longer than {RECORD_FIELD_BYTES_MAX} bytes"
            )));
        }
        // The timestamps were fixed by the proposer: kept as they are.
        let mut e = ProduceEntry::encoded(
            j.producer,
            j.records.iter().map(|r| NewRecord {
                key: r.key.as_deref(),
                value: &r.value,
                timestamp_ms: r.timestamp_ms,
            }),
            None,
        );
        e.proposed_ms = j.proposed_ms;
        Ok(e)
    }
}

impl fmt::Display for ProduceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "produce({} records)", self.count)
    }
}

/// What applying a normal entry gave: its records' offsets, or the typed refusal every
/// replica reached the same way (an idempotent producer's sequence out of order, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyResult {
    /// The records were appended at `base_offset..=last_offset`.
    Appended { base_offset: u64, last_offset: u64 },
    /// A retry of an entry already applied: its first offsets.
    Duplicate { base_offset: u64, last_offset: u64 },
    /// Nothing was appended: the protocol's error code and message.
    Refused { code: u16, message: String },
    /// A blank or membership entry.
    None,
}

impl EntryCodec for ProduceEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(ENTRY_VERSION);
        let mut flags = 0;
        if self.producer.is_some() {
            flags |= FLAG_PRODUCER;
        }
        if self.proposed_ms.is_some() {
            flags |= FLAG_PROPOSED;
        }
        out.push(flags);
        out.extend_from_slice(&self.count.to_be_bytes());
        if let Some(p) = &self.producer {
            out.extend_from_slice(&p.producer_id.to_be_bytes());
            out.extend_from_slice(&p.epoch.to_be_bytes());
            out.extend_from_slice(&p.first_sequence.to_be_bytes());
        }
        if let Some(t) = self.proposed_ms {
            out.extend_from_slice(&t.to_be_bytes());
        }
        out.extend_from_slice(&self.records);
    }

    fn decode(bytes: &[u8]) -> Result<Self, EntryCodecError> {
        let mut c = Cursor { bytes, at: 0 };
        let version = c.u8("version")?;
        if version != ENTRY_VERSION {
            return Err(EntryCodecError(format!("unknown entry version {version}")));
        }
        let flags = c.u8("flags")?;
        if flags & !(FLAG_PRODUCER | FLAG_PROPOSED) != 0 {
            return Err(EntryCodecError(format!("unknown entry flags {flags:#x}")));
        }
        let count = c.u32("record count")?;
        if count > RECORDS_PER_PARTITION_MAX {
            return Err(EntryCodecError(format!(
                "record count {count} exceeds {RECORDS_PER_PARTITION_MAX}"
            )));
        }
        let producer = if flags & FLAG_PRODUCER != 0 {
            Some(ProducerStamp {
                producer_id: c.u64("producer id")?,
                epoch: c.u16("epoch")?,
                first_sequence: c.u32("sequence")? as i32,
            })
        } else {
            None
        };
        let proposed_ms = if flags & FLAG_PROPOSED != 0 {
            Some(c.u64("proposal time")? as i64)
        } else {
            None
        };
        let remaining = bytes.len().saturating_sub(c.at);
        if (count as usize).saturating_mul(RECORD_MIN_LEN) > remaining {
            return Err(EntryCodecError(format!(
                "{count} records cannot fit in {remaining} bytes"
            )));
        }
        let first = c.at;
        for _ in 0..count {
            read_record(&mut c)?;
        }
        if c.at != bytes.len() {
            return Err(EntryCodecError(format!(
                "{} bytes after the entry",
                bytes.len() - c.at
            )));
        }
        Ok(ProduceEntry {
            producer,
            proposed_ms,
            count,
            records: bytes::Bytes::copy_from_slice(bytes.get(first..).unwrap_or_default()),
        })
    }
}

/// A bounds-checked reader over an encoded entry.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], EntryCodecError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err(EntryCodecError(format!(
                "truncated {what} at byte {}: needs {n}, {} remain",
                self.at,
                self.bytes.len().saturating_sub(self.at)
            )));
        };
        let s = self.bytes.get(self.at..end).unwrap_or_default();
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], EntryCodecError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8, EntryCodecError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, EntryCodecError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, EntryCodecError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, EntryCodecError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn field(&mut self, what: &str) -> Result<&'a [u8], EntryCodecError> {
        let len = self.u32(what)?;
        if len > RECORD_FIELD_BYTES_MAX {
            return Err(EntryCodecError(format!(
                "{what} length {len} exceeds {RECORD_FIELD_BYTES_MAX}"
            )));
        }
        self.take(len as usize, what)
    }
}

/// Byte strings as base64 text in the JSON of the Raft RPCs.
mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(serde::de::Error::custom)
    }
}

mod opt_b64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => super::b64::serialize(b, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        use base64::Engine as _;
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec<'a>(timestamp_ms: i64, key: Option<&'a [u8]>, value: &'a [u8]) -> NewRecord<'a> {
        NewRecord {
            key,
            value,
            timestamp_ms,
        }
    }

    fn sample_with(producer: Option<ProducerStamp>) -> ProduceEntry {
        ProduceEntry::new(
            producer,
            [
                rec(1_700_000_000_000, Some(b"k"), b"hello"),
                rec(5, None, b""),
            ],
            0,
        )
    }

    fn sample() -> ProduceEntry {
        sample_with(Some(ProducerStamp {
            producer_id: 7,
            epoch: 2,
            first_sequence: 41,
        }))
    }

    #[test]
    fn entry_round_trips() {
        let e = sample();
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(ProduceEntry::decode(&out).unwrap(), e);
        let plain = sample_with(None);
        out.clear();
        plain.encode(&mut out);
        let back = ProduceEntry::decode(&out).unwrap();
        assert_eq!(back, plain);
        let recs: Vec<_> = back.records().collect();
        assert_eq!(back.len(), 2);
        assert_eq!(recs[0].key, Some(&b"k"[..]));
        assert_eq!(recs[0].value, b"hello");
        assert_eq!(recs[0].timestamp_ms, 1_700_000_000_000);
        assert_eq!(recs[1].key, None);
        assert_eq!(recs[1].value, b"");
    }

    #[test]
    fn a_negative_timestamp_becomes_the_proposers_clock() {
        let e = ProduceEntry::new(None, [rec(-1, None, b"a"), rec(9, None, b"b")], 1234);
        let ts: Vec<i64> = e.records().map(|r| r.timestamp_ms).collect();
        assert_eq!(ts, [1234, 9]);
    }

    #[test]
    fn golden_bytes() {
        let e = ProduceEntry::new(None, [rec(1, None, b"v")], 0x0102);
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(
            out,
            [
                1, 2, 0, 0, 0, 1, // version, flags (a proposal time), count
                0, 0, 0, 0, 0, 0, 1, 2, // proposed at
                0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, b'v' // the record
            ]
        );
    }

    #[test]
    fn an_entry_without_a_proposal_time_still_decodes() {
        let old = [
            1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, b'v',
        ];
        let e = ProduceEntry::decode(&old).unwrap();
        assert_eq!(e.proposed_ms, None);
        assert_eq!(e.len(), 1);
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(out, old);
        // Unknown flags are still refused.
        let mut bad = old;
        bad[1] = 4;
        assert!(ProduceEntry::decode(&bad).is_err());
    }

    #[test]
    fn every_cut_is_refused() {
        let mut out = Vec::new();
        sample().encode(&mut out);
        for len in 0..out.len() {
            assert!(ProduceEntry::decode(&out[..len]).is_err(), "cut at {len}");
        }
        out.push(0);
        assert!(ProduceEntry::decode(&out).is_err());
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut out = vec![ENTRY_VERSION, 0];
        out.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(ProduceEntry::decode(&out).is_err());
        let mut out = vec![ENTRY_VERSION, 0];
        out.extend_from_slice(&1000u32.to_be_bytes());
        out.extend_from_slice(&[0; 20]);
        let e = ProduceEntry::decode(&out).unwrap_err();
        assert!(e.0.contains("cannot fit"), "{e}");
    }

    #[test]
    fn json_carries_bytes_as_base64() {
        let e = ProduceEntry::new(None, [rec(-3, Some(b"k"), b"hello")], 0);
        let e = ProduceEntry::decode(&{
            let mut out = Vec::new();
            e.encode(&mut out);
            // A timestamp a proposer left negative stays as it is through JSON.
            out[14..22].copy_from_slice(&(-3i64).to_be_bytes());
            out
        })
        .unwrap();
        let j = serde_json::to_string(&e).unwrap();
        assert!(j.contains("\"aGVsbG8=\""), "{j}");
        let back: ProduceEntry = serde_json::from_str(&j).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.proposed_ms, Some(0));
    }
}
