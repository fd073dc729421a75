//! `groups/<group>.json`: a consumer group's committed offsets.
//!
//! ```text
//! {"version": 1, "group": "G", "generation": 7, "protocol_type": "consumer",
//!  "empty_since_ms": 1700000000000,
//!  "offsets": [{"topic": "t", "partition": 0, "offset": 42, "metadata": "",
//!               "commit_ms": 1700000000000}]}
//! ```
//! Membership is not stored: members rejoin after a restart, as they do after a Kafka
//! coordinator moves. Invariants checked on decode: the file is at most
//! [`GROUP_FILE_BYTES_MAX`] bytes, `version` is 1, the group name and every topic name
//! are valid names, `group` matches the file name (checked by the caller), at most
//! [`GROUP_OFFSETS_MAX`] entries, each `metadata` at most [`OFFSET_METADATA_BYTES_MAX`]
//! bytes, and no (topic, partition) appears twice.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::names::{validate_name, NameError};
use super::topic::PARTITIONS_MAX;

/// Directory under the data directory holding one file per group.
pub const GROUPS_DIR: &str = "groups";
/// Extension of a group file.
pub const GROUP_FILE_EXT: &str = "json";
/// The only version written and read.
pub const GROUP_FILE_VERSION: u32 = 1;
/// Longest metadata string stored with a committed offset (Kafka's
/// `offset.metadata.max.bytes` default).
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;
/// Most committed offsets one group may hold.
pub const GROUP_OFFSETS_MAX: usize = 1 << 16;
/// Largest group file any reader accepts.
pub const GROUP_FILE_BYTES_MAX: usize = 64 * 1024 * 1024;

const _: () =
    assert!(GROUP_OFFSETS_MAX * (OFFSET_METADATA_BYTES_MAX + 512) <= GROUP_FILE_BYTES_MAX * 5);

/// One committed offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommittedOffset {
    pub topic: String,
    pub partition: u32,
    /// The next offset the group reads (Kafka's convention).
    pub offset: u64,
    #[serde(default)]
    pub metadata: String,
    /// When the commit was made, ms since the epoch.
    pub commit_ms: i64,
}

/// The decoded content of a group file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupFile {
    pub version: u32,
    pub group: String,
    pub generation: i32,
    #[serde(default)]
    pub protocol_type: String,
    /// When the group last had no members (ms since the epoch), or 0 while it had.
    #[serde(default)]
    pub empty_since_ms: i64,
    pub offsets: Vec<CommittedOffset>,
}

/// Why a group file is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupFileError {
    #[error("group file is {len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("group file is not valid JSON of the expected shape: {0}")]
    Json(String),
    #[error("group file version {0} is not supported (only 1)")]
    Version(u32),
    #[error("invalid name in group file: {0}")]
    Name(#[from] NameError),
    #[error("group file holds {count} offsets, over the limit of {max}")]
    TooManyOffsets { count: usize, max: usize },
    #[error("metadata of {topic}/{partition} is {len} bytes, over the limit of {max}")]
    MetadataTooLarge {
        topic: String,
        partition: u32,
        len: usize,
        max: usize,
    },
    #[error("partition {partition} of {topic} is out of range")]
    BadPartition { topic: String, partition: u32 },
    #[error("{topic}/{partition} appears twice")]
    Duplicate { topic: String, partition: u32 },
}

/// The file name of `group`'s file (the name must be valid).
pub fn group_file_name(group: &str) -> String {
    format!("{group}.{GROUP_FILE_EXT}")
}

/// Serializes a group file (pretty JSON with a trailing newline).
pub fn encode_group_file(file: &GroupFile) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(file).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Parses and checks a group file.
pub fn decode_group_file(bytes: &[u8]) -> Result<GroupFile, GroupFileError> {
    if bytes.len() > GROUP_FILE_BYTES_MAX {
        return Err(GroupFileError::TooLarge {
            len: bytes.len(),
            max: GROUP_FILE_BYTES_MAX,
        });
    }
    let file: GroupFile =
        serde_json::from_slice(bytes).map_err(|e| GroupFileError::Json(e.to_string()))?;
    if file.version != GROUP_FILE_VERSION {
        return Err(GroupFileError::Version(file.version));
    }
    validate_name(&file.group)?;
    if file.offsets.len() > GROUP_OFFSETS_MAX {
        return Err(GroupFileError::TooManyOffsets {
            count: file.offsets.len(),
            max: GROUP_OFFSETS_MAX,
        });
    }
    let mut seen = BTreeSet::new();
    for o in &file.offsets {
        validate_name(&o.topic)?;
        if o.partition >= PARTITIONS_MAX {
            return Err(GroupFileError::BadPartition {
                topic: o.topic.clone(),
                partition: o.partition,
            });
        }
        if o.metadata.len() > OFFSET_METADATA_BYTES_MAX {
            return Err(GroupFileError::MetadataTooLarge {
                topic: o.topic.clone(),
                partition: o.partition,
                len: o.metadata.len(),
                max: OFFSET_METADATA_BYTES_MAX,
            });
        }
        if !seen.insert((o.topic.as_str(), o.partition)) {
            return Err(GroupFileError::Duplicate {
                topic: o.topic.clone(),
                partition: o.partition,
            });
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GroupFile {
        GroupFile {
            version: 1,
            group: "g".into(),
            generation: 3,
            protocol_type: "consumer".into(),
            empty_since_ms: 0,
            offsets: vec![CommittedOffset {
                topic: "t".into(),
                partition: 1,
                offset: 42,
                metadata: "m".into(),
                commit_ms: 5,
            }],
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let f = sample();
        assert_eq!(decode_group_file(&encode_group_file(&f)).unwrap(), f);
        let mut bad = sample();
        bad.group = "../x".into();
        assert!(matches!(
            decode_group_file(&encode_group_file(&bad)),
            Err(GroupFileError::Name(_))
        ));
        let mut bad = sample();
        bad.offsets[0].metadata = "x".repeat(OFFSET_METADATA_BYTES_MAX + 1);
        assert!(matches!(
            decode_group_file(&encode_group_file(&bad)),
            Err(GroupFileError::MetadataTooLarge { .. })
        ));
        let mut bad = sample();
        bad.offsets.push(bad.offsets[0].clone());
        assert!(matches!(
            decode_group_file(&encode_group_file(&bad)),
            Err(GroupFileError::Duplicate { .. })
        ));
        let mut bad = sample();
        bad.version = 2;
        assert!(matches!(
            decode_group_file(&encode_group_file(&bad)),
            Err(GroupFileError::Version(2))
        ));
        let bytes = encode_group_file(&f);
        for cut in 0..bytes.len() - 2 {
            assert!(decode_group_file(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
