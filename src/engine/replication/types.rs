//! The openraft type configuration of a partition's Raft group, and the payload of a
//! normal entry: one produce request's records, with the idempotent producer's stamp
//! when it has one.
//!
//! Invariants: an entry carries everything its apply needs, so that every replica
//! applies it the same way (timestamps are fixed by the leader before it proposes,
//! never by the state machine); [`EntryCodec::decode`] checks every count and length
//! against a limit before it allocates.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::log_store::{EntryCodec, EntryCodecError};
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProduceEntry {
    pub producer: Option<ProducerStamp>,
    pub records: Vec<EntryRecord>,
}

impl fmt::Display for ProduceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "produce({} records)", self.records.len())
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
        out.push(if self.producer.is_some() {
            FLAG_PRODUCER
        } else {
            0
        });
        out.extend_from_slice(&(self.records.len() as u32).to_be_bytes());
        if let Some(p) = &self.producer {
            out.extend_from_slice(&p.producer_id.to_be_bytes());
            out.extend_from_slice(&p.epoch.to_be_bytes());
            out.extend_from_slice(&p.first_sequence.to_be_bytes());
        }
        for r in &self.records {
            out.extend_from_slice(&r.timestamp_ms.to_be_bytes());
            match &r.key {
                Some(k) => {
                    out.push(FLAG_KEY);
                    out.extend_from_slice(&(k.len() as u32).to_be_bytes());
                    out.extend_from_slice(k);
                }
                None => out.push(0),
            }
            out.extend_from_slice(&(r.value.len() as u32).to_be_bytes());
            out.extend_from_slice(&r.value);
        }
    }

    fn decode(bytes: &[u8]) -> Result<Self, EntryCodecError> {
        let mut c = Cursor { bytes, at: 0 };
        let version = c.u8("version")?;
        if version != ENTRY_VERSION {
            return Err(EntryCodecError(format!("unknown entry version {version}")));
        }
        let flags = c.u8("flags")?;
        if flags & !FLAG_PRODUCER != 0 {
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
        let remaining = bytes.len().saturating_sub(c.at);
        if (count as usize).saturating_mul(RECORD_MIN_LEN) > remaining {
            return Err(EntryCodecError(format!(
                "{count} records cannot fit in {remaining} bytes"
            )));
        }
        let mut records = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let timestamp_ms = c.u64("timestamp")? as i64;
            let key = match c.u8("key flag")? {
                0 => None,
                FLAG_KEY => Some(c.field("key")?.to_vec()),
                other => return Err(EntryCodecError(format!("bad key flag {other}"))),
            };
            let value = c.field("value")?.to_vec();
            records.push(EntryRecord {
                timestamp_ms,
                key,
                value,
            });
        }
        if c.at != bytes.len() {
            return Err(EntryCodecError(format!(
                "{} bytes after the entry",
                bytes.len() - c.at
            )));
        }
        Ok(ProduceEntry { producer, records })
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

    fn sample() -> ProduceEntry {
        ProduceEntry {
            producer: Some(ProducerStamp {
                producer_id: 7,
                epoch: 2,
                first_sequence: 41,
            }),
            records: vec![
                EntryRecord {
                    timestamp_ms: 1_700_000_000_000,
                    key: Some(b"k".to_vec()),
                    value: b"hello".to_vec(),
                },
                EntryRecord {
                    timestamp_ms: 5,
                    key: None,
                    value: Vec::new(),
                },
            ],
        }
    }

    #[test]
    fn entry_round_trips() {
        let e = sample();
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(ProduceEntry::decode(&out).unwrap(), e);
        let plain = ProduceEntry {
            producer: None,
            ..sample()
        };
        out.clear();
        plain.encode(&mut out);
        assert_eq!(ProduceEntry::decode(&out).unwrap(), plain);
    }

    #[test]
    fn golden_bytes() {
        let e = ProduceEntry {
            producer: None,
            records: vec![EntryRecord {
                timestamp_ms: 1,
                key: None,
                value: b"v".to_vec(),
            }],
        };
        let mut out = Vec::new();
        e.encode(&mut out);
        assert_eq!(
            out,
            [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, b'v']
        );
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
        let e = sample();
        let j = serde_json::to_string(&e).unwrap();
        assert!(j.contains("\"aGVsbG8=\""), "{j}");
        let back: ProduceEntry = serde_json::from_str(&j).unwrap();
        assert_eq!(back, e);
    }
}
