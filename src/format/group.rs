//! `groups/<group>.json`: a consumer group's committed offsets and, while the group
//! is Stable, its membership.
//!
//! ```text
//! {"version": 2, "group": "G", "generation": 7, "protocol_type": "consumer",
//!  "empty_since_ms": 0,
//!  "offsets": [{"topic": "t", "partition": 0, "offset": 42, "metadata": "",
//!               "commit_ms": 1700000000000}],
//!  "membership": {"protocol": "range", "leader": "c-1700000000000-1",
//!    "listener": "kafka",
//!    "members": [{"member_id": "c-1700000000000-1", "instance_id": "i-1",
//!                 "client_id": "c", "client_host": "/127.0.0.1",
//!                 "session_timeout_ms": 45000, "rebalance_timeout_ms": 300000,
//!                 "protocols": [{"name": "range", "metadata": "AAEC"}],
//!                 "assignment": "AAED"}]}}
//! ```
//! `membership` is present only while the group is Stable (the leader's sync handed
//! out the assignments): a broker that restarts brings such a group back Stable with
//! the same generation, protocol, leader and members, whose sessions start over, as
//! Kafka's coordinator reloads a group's metadata. A group that was empty or
//! rebalancing is written without it, and its members rejoin. Byte strings
//! (`metadata`, `assignment`) are standard base64 with padding. A file without
//! `membership` is written as version 1 (which older brokers read); one with it as
//! version 2; members are written in member-id order. `listener` (`native` or
//! `kafka`) is the listener the members joined through, so that after a restart the
//! group still refuses members of the other one; a membership without it (written
//! before it was stored) loads with the listener unknown, and the next join sets it.
//!
//! Invariants checked on decode: the file is at most [`GROUP_FILE_BYTES_MAX`] bytes,
//! `version` is 1 or 2, the group name and every topic name are valid names, `group`
//! matches the file name (checked by the caller), at most [`GROUP_OFFSETS_MAX`]
//! entries, each `metadata` at most [`OFFSET_METADATA_BYTES_MAX`] bytes, and no
//! (topic, partition) appears twice. `membership` (only in version 2): 1 to
//! [`GROUP_MEMBERS_MAX`] members with distinct non-empty ids; ids, instance ids,
//! client ids and hosts and protocol names at most [`GROUP_ID_BYTES_MAX`] bytes; 1 to
//! [`GROUP_PROTOCOLS_MAX`] protocols per member, each offered once; every byte string
//! at most [`GROUP_BLOB_BYTES_MAX`] bytes once decoded (its text is checked before it
//! is decoded); the leader is a member, every member offers the chosen protocol, and
//! `listener`, when present, is `native` or `kafka`.
//! A membership that fails these checks is refused on its own
//! ([`decode_group_file_keeping_offsets`]): the offsets stay readable.

use std::collections::BTreeSet;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::names::{validate_name, NameError};
use super::topic::PARTITIONS_MAX;

/// Directory under the data directory holding one file per group.
pub const GROUPS_DIR: &str = "groups";
/// Extension of a group file.
pub const GROUP_FILE_EXT: &str = "json";
/// The version of a file without membership (offsets only).
pub const GROUP_FILE_VERSION_OFFSETS: u32 = 1;
/// The version of a file with membership; the newest version.
pub const GROUP_FILE_VERSION: u32 = 2;
/// Longest metadata string stored with a committed offset (Kafka's
/// `offset.metadata.max.bytes` default).
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;
/// Most committed offsets one group may hold.
pub const GROUP_OFFSETS_MAX: usize = 1 << 16;
/// Largest group file any reader accepts.
pub const GROUP_FILE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Most members of one group.
pub const GROUP_MEMBERS_MAX: usize = 1000;
/// Most protocols one member may offer.
pub const GROUP_PROTOCOLS_MAX: usize = 16;
/// Largest protocol metadata or member assignment.
pub const GROUP_BLOB_BYTES_MAX: usize = 1 << 20;
/// Longest member id, instance id, client id, client host, protocol type or protocol
/// name.
pub const GROUP_ID_BYTES_MAX: usize = 255;

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

/// A protocol a member joined with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoredProtocol {
    pub name: String,
    #[serde(serialize_with = "b64")]
    pub metadata: Vec<u8>,
}

/// A member of a Stable group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoredMember {
    pub member_id: String,
    /// A static member's instance id (KIP-345).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: u32,
    pub rebalance_timeout_ms: u32,
    /// In the member's order of preference.
    pub protocols: Vec<StoredProtocol>,
    /// As the leader's sync gave it.
    #[serde(serialize_with = "b64")]
    pub assignment: Vec<u8>,
}

/// The listener a group's members joined through. Native consumers and Kafka
/// consumers encode subscriptions and assignments differently, so a group's members
/// all come through one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupListener {
    /// The native protocol (`seglog consume --group`).
    Native,
    /// The Kafka listener (`serve --kafka-listen`).
    Kafka,
}

impl GroupListener {
    /// The listener as the group file names it.
    pub fn name(self) -> &'static str {
        match self {
            GroupListener::Native => "native",
            GroupListener::Kafka => "kafka",
        }
    }

    /// The listener as a message names it.
    pub fn described(self) -> &'static str {
        match self {
            GroupListener::Native => "the native protocol",
            GroupListener::Kafka => "the Kafka listener",
        }
    }
}

/// The membership of a Stable group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoredMembership {
    /// The protocol chosen for the generation.
    pub protocol: String,
    /// The leader's member id.
    pub leader: String,
    /// The listener the members joined through; `None` in files written before it
    /// was stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener: Option<GroupListener>,
    /// In member-id order.
    pub members: Vec<StoredMember>,
}

/// The decoded content of a group file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupFile {
    pub version: u32,
    pub group: String,
    pub generation: i32,
    pub protocol_type: String,
    /// When the group last had no members (ms since the epoch), or 0 while it had.
    pub empty_since_ms: i64,
    pub offsets: Vec<CommittedOffset>,
    /// Present only while the group is Stable (then `version` is 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub membership: Option<StoredMembership>,
}

impl GroupFile {
    /// The version a file with (or without) membership is written as.
    pub fn version_for(membership: Option<&StoredMembership>) -> u32 {
        match membership {
            Some(_) => GROUP_FILE_VERSION,
            None => GROUP_FILE_VERSION_OFFSETS,
        }
    }
}

fn b64<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
}

/// A group file as parsed, before its membership is checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroupFile {
    version: u32,
    group: String,
    generation: i32,
    #[serde(default)]
    protocol_type: String,
    #[serde(default)]
    empty_since_ms: i64,
    offsets: Vec<CommittedOffset>,
    /// Parsed on its own, so that a bad membership leaves the offsets readable.
    #[serde(default)]
    membership: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMembership {
    protocol: String,
    leader: String,
    #[serde(default)]
    listener: Option<GroupListener>,
    members: Vec<RawMember>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMember {
    member_id: String,
    #[serde(default)]
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: u32,
    rebalance_timeout_ms: u32,
    protocols: Vec<RawProtocol>,
    assignment: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProtocol {
    name: String,
    metadata: String,
}

/// Why the membership of a group file is refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum MembershipError {
    #[error("not of the expected shape: {0}")]
    Json(String),
    #[error("present in a version 1 file")]
    InVersion1,
    #[error("holds {count} members, not 1..={max}")]
    MemberCount { count: usize, max: usize },
    #[error("member {index}: member id is empty")]
    EmptyMemberId { index: usize },
    #[error("member {member:?}: {what} is {len} bytes, over the limit of {max}")]
    TooLong {
        member: String,
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("member {member:?}: {what} is not valid base64: {detail}")]
    Base64 {
        member: String,
        what: &'static str,
        detail: String,
    },
    #[error("member {member:?} offers {count} protocols, not 1..={max}")]
    ProtocolCount {
        member: String,
        count: usize,
        max: usize,
    },
    #[error("member {member:?} offers protocol {protocol:?} twice")]
    DuplicateProtocol { member: String, protocol: String },
    #[error("member {member:?} does not offer the chosen protocol {protocol:?}")]
    ProtocolNotOffered { member: String, protocol: String },
    #[error("member {member:?} appears twice")]
    DuplicateMember { member: String },
    #[error("instance id {instance:?} is held by two members")]
    DuplicateInstance { instance: String },
    #[error("the chosen protocol is empty")]
    EmptyProtocol,
    #[error("leader {leader:?} is not a member")]
    LeaderNotMember { leader: String },
}

/// Why a group file is refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupFileError {
    #[error("group file is {len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("group file is not valid JSON of the expected shape: {0}")]
    Json(String),
    #[error("group file version {0} is not supported (only 1 and 2)")]
    Version(u32),
    #[error("membership of group {group}: {source}")]
    Membership {
        group: String,
        source: MembershipError,
    },
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

/// Parses and checks a group file; a bad membership refuses the whole file.
pub fn decode_group_file(bytes: &[u8]) -> Result<GroupFile, GroupFileError> {
    match decode_group_file_keeping_offsets(bytes)? {
        (file, None) => Ok(file),
        (_, Some(e)) => Err(e),
    }
}

/// Parses and checks a group file. A membership that fails its checks is dropped and
/// returned beside the file (whose offsets are good), as a
/// [`GroupFileError::Membership`].
pub fn decode_group_file_keeping_offsets(
    bytes: &[u8],
) -> Result<(GroupFile, Option<GroupFileError>), GroupFileError> {
    if bytes.len() > GROUP_FILE_BYTES_MAX {
        return Err(GroupFileError::TooLarge {
            len: bytes.len(),
            max: GROUP_FILE_BYTES_MAX,
        });
    }
    let raw: RawGroupFile =
        serde_json::from_slice(bytes).map_err(|e| GroupFileError::Json(e.to_string()))?;
    if raw.version != GROUP_FILE_VERSION_OFFSETS && raw.version != GROUP_FILE_VERSION {
        return Err(GroupFileError::Version(raw.version));
    }
    validate_name(&raw.group)?;
    check_offsets(&raw.offsets)?;
    let (membership, problem) = match raw.membership {
        None => (None, None),
        Some(v) => {
            let m = if raw.version == GROUP_FILE_VERSION_OFFSETS {
                Err(MembershipError::InVersion1)
            } else {
                decode_membership(v)
            };
            match m {
                Ok(m) => (Some(m), None),
                Err(source) => (
                    None,
                    Some(GroupFileError::Membership {
                        group: raw.group.clone(),
                        source,
                    }),
                ),
            }
        }
    };
    let file = GroupFile {
        version: raw.version,
        group: raw.group,
        generation: raw.generation,
        protocol_type: raw.protocol_type,
        empty_since_ms: raw.empty_since_ms,
        offsets: raw.offsets,
        membership,
    };
    Ok((file, problem))
}

fn check_offsets(offsets: &[CommittedOffset]) -> Result<(), GroupFileError> {
    if offsets.len() > GROUP_OFFSETS_MAX {
        return Err(GroupFileError::TooManyOffsets {
            count: offsets.len(),
            max: GROUP_OFFSETS_MAX,
        });
    }
    let mut seen = BTreeSet::new();
    for o in offsets {
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
    Ok(())
}

fn decode_membership(v: serde_json::Value) -> Result<StoredMembership, MembershipError> {
    let raw: RawMembership =
        serde_json::from_value(v).map_err(|e| MembershipError::Json(e.to_string()))?;
    if raw.members.is_empty() || raw.members.len() > GROUP_MEMBERS_MAX {
        return Err(MembershipError::MemberCount {
            count: raw.members.len(),
            max: GROUP_MEMBERS_MAX,
        });
    }
    if raw.protocol.is_empty() {
        return Err(MembershipError::EmptyProtocol);
    }
    let mut ids = BTreeSet::new();
    let mut instances = BTreeSet::new();
    let mut members = Vec::with_capacity(raw.members.len());
    for (index, m) in raw.members.into_iter().enumerate() {
        if m.member_id.is_empty() {
            return Err(MembershipError::EmptyMemberId { index });
        }
        let member = m.member_id.clone();
        let id_len = |what: &'static str, s: &str| {
            if s.len() > GROUP_ID_BYTES_MAX {
                return Err(MembershipError::TooLong {
                    member: member.clone(),
                    what,
                    len: s.len(),
                    max: GROUP_ID_BYTES_MAX,
                });
            }
            Ok(())
        };
        id_len("member id", &m.member_id)?;
        if let Some(i) = &m.instance_id {
            id_len("instance id", i)?;
        }
        id_len("client id", &m.client_id)?;
        id_len("client host", &m.client_host)?;
        if m.protocols.is_empty() || m.protocols.len() > GROUP_PROTOCOLS_MAX {
            return Err(MembershipError::ProtocolCount {
                member,
                count: m.protocols.len(),
                max: GROUP_PROTOCOLS_MAX,
            });
        }
        let mut names = BTreeSet::new();
        let mut protocols = Vec::with_capacity(m.protocols.len());
        for p in m.protocols {
            id_len("protocol name", &p.name)?;
            if !names.insert(p.name.clone()) {
                return Err(MembershipError::DuplicateProtocol {
                    member,
                    protocol: p.name,
                });
            }
            let metadata = decode_blob(&member, "protocol metadata", &p.metadata)?;
            protocols.push(StoredProtocol {
                name: p.name,
                metadata,
            });
        }
        if !names.contains(&raw.protocol) {
            return Err(MembershipError::ProtocolNotOffered {
                member,
                protocol: raw.protocol,
            });
        }
        let assignment = decode_blob(&member, "assignment", &m.assignment)?;
        if let Some(i) = &m.instance_id {
            if !instances.insert(i.clone()) {
                return Err(MembershipError::DuplicateInstance {
                    instance: i.clone(),
                });
            }
        }
        if !ids.insert(m.member_id.clone()) {
            return Err(MembershipError::DuplicateMember { member });
        }
        members.push(StoredMember {
            member_id: m.member_id,
            instance_id: m.instance_id,
            client_id: m.client_id,
            client_host: m.client_host,
            session_timeout_ms: m.session_timeout_ms,
            rebalance_timeout_ms: m.rebalance_timeout_ms,
            protocols,
            assignment,
        });
    }
    if !ids.contains(&raw.leader) {
        return Err(MembershipError::LeaderNotMember { leader: raw.leader });
    }
    members.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    Ok(StoredMembership {
        protocol: raw.protocol,
        leader: raw.leader,
        listener: raw.listener,
        members,
    })
}

/// Decodes one base64 byte string, its length checked before it is decoded.
fn decode_blob(member: &str, what: &'static str, text: &str) -> Result<Vec<u8>, MembershipError> {
    // Base64 with padding: 4 characters per 3 bytes (the last group padded).
    if text.len() > GROUP_BLOB_BYTES_MAX.div_ceil(3) * 4 {
        return Err(MembershipError::TooLong {
            member: member.to_string(),
            what,
            len: text.len() / 4 * 3,
            max: GROUP_BLOB_BYTES_MAX,
        });
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| MembershipError::Base64 {
            member: member.to_string(),
            what,
            detail: e.to_string(),
        })?;
    if bytes.len() > GROUP_BLOB_BYTES_MAX {
        return Err(MembershipError::TooLong {
            member: member.to_string(),
            what,
            len: bytes.len(),
            max: GROUP_BLOB_BYTES_MAX,
        });
    }
    Ok(bytes)
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
            membership: None,
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
        bad.version = 3;
        assert!(matches!(
            decode_group_file(&encode_group_file(&bad)),
            Err(GroupFileError::Version(3))
        ));
        let bytes = encode_group_file(&f);
        for cut in 0..bytes.len() - 2 {
            assert!(decode_group_file(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    fn member(id: &str, instance: Option<&str>) -> StoredMember {
        StoredMember {
            member_id: id.into(),
            instance_id: instance.map(Into::into),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 45_000,
            rebalance_timeout_ms: 300_000,
            protocols: vec![
                StoredProtocol {
                    name: "range".into(),
                    metadata: vec![0, 1, 2],
                },
                StoredProtocol {
                    name: "roundrobin".into(),
                    metadata: Vec::new(),
                },
            ],
            assignment: vec![0, 1, 3],
        }
    }

    fn with_members() -> GroupFile {
        GroupFile {
            version: GROUP_FILE_VERSION,
            membership: Some(StoredMembership {
                protocol: "range".into(),
                leader: "a".into(),
                listener: Some(GroupListener::Kafka),
                members: vec![member("a", Some("i-a")), member("b", None)],
            }),
            ..sample()
        }
    }

    /// The message of the membership problem of `f`, whose offsets stay readable.
    fn membership_problem(f: &GroupFile) -> String {
        let bytes = encode_group_file(f);
        let (kept, problem) = decode_group_file_keeping_offsets(&bytes).unwrap();
        assert_eq!(kept.offsets, f.offsets);
        assert_eq!(kept.membership, None);
        let problem = problem.expect("a membership problem");
        assert!(matches!(problem, GroupFileError::Membership { .. }));
        assert!(decode_group_file(&bytes).is_err());
        problem.to_string()
    }

    #[test]
    fn membership_round_trips_in_a_fixed_form() {
        let f = with_members();
        let bytes = encode_group_file(&f);
        assert_eq!(decode_group_file(&bytes).unwrap(), f);
        assert_eq!(
            encode_group_file(&decode_group_file(&bytes).unwrap()),
            bytes
        );
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains("\"metadata\": \"AAEC\""), "{text}");
        assert!(text.contains("\"assignment\": \"AAED\""), "{text}");
        assert!(text.contains("\"instance_id\": \"i-a\""), "{text}");
        // A dynamic member has no instance id field at all.
        assert_eq!(text.matches("instance_id").count(), 1, "{text}");
        assert_eq!(GroupFile::version_for(f.membership.as_ref()), 2);
        assert_eq!(GroupFile::version_for(None), 1);
    }

    /// The listener the members joined through is stored; a membership without it
    /// (written before it was) loads with the listener unknown; another value is
    /// refused as the membership's problem.
    #[test]
    fn membership_stores_the_listener() {
        let mut f = with_members();
        let text = String::from_utf8(encode_group_file(&f)).unwrap();
        assert!(text.contains("\"listener\": \"kafka\""), "{text}");
        f.membership.as_mut().unwrap().listener = Some(GroupListener::Native);
        let bytes = encode_group_file(&f);
        assert_eq!(decode_group_file(&bytes).unwrap(), f);
        f.membership.as_mut().unwrap().listener = None;
        let text = String::from_utf8(encode_group_file(&f)).unwrap();
        assert!(!text.contains("listener"), "{text}");
        assert_eq!(decode_group_file(text.as_bytes()).unwrap(), f);
        let mut bad: serde_json::Value = serde_json::from_str(&text).unwrap();
        bad["membership"]["listener"] = "http".into();
        let bad = bad.to_string();
        let (kept, problem) = decode_group_file_keeping_offsets(bad.as_bytes()).unwrap();
        assert_eq!(kept.membership, None);
        let problem = problem.expect("a membership problem").to_string();
        assert!(problem.contains("http"), "{problem}");
    }

    #[test]
    fn a_version_1_file_still_reads() {
        let v1 = br#"{"version": 1, "group": "g", "generation": 3, "protocol_type": "consumer",
            "empty_since_ms": 7, "offsets": [{"topic": "t", "partition": 1, "offset": 42,
            "metadata": "m", "commit_ms": 5}]}"#;
        let f = decode_group_file(v1).unwrap();
        assert_eq!((f.version, f.generation, f.empty_since_ms), (1, 3, 7));
        assert_eq!(f.offsets, sample().offsets);
        assert_eq!(f.membership, None);
        // Membership belongs to version 2.
        let mut bad = with_members();
        bad.version = 1;
        let msg = membership_problem(&bad);
        assert!(msg.contains("version 1"), "{msg}");
    }

    #[test]
    fn bad_membership_is_refused_with_its_reason_and_offsets_kept() {
        let edit = |f: &dyn Fn(&mut StoredMembership)| {
            let mut file = with_members();
            f(file.membership.as_mut().unwrap());
            membership_problem(&file)
        };
        let msg = edit(&|m| m.members.clear());
        assert!(msg.contains("holds 0 members, not 1..=1000"), "{msg}");
        let msg = edit(&|m| {
            let one = m.members[1].clone();
            m.members = (0..=GROUP_MEMBERS_MAX)
                .map(|i| StoredMember {
                    member_id: format!("m{i}"),
                    ..one.clone()
                })
                .collect();
            m.leader = "m0".into();
        });
        assert!(msg.contains("holds 1001 members"), "{msg}");
        let msg = edit(&|m| m.members[1].member_id.clear());
        assert!(msg.contains("member 1: member id is empty"), "{msg}");
        let msg = edit(&|m| m.members[1].member_id = "a".into());
        assert!(msg.contains("member \"a\" appears twice"), "{msg}");
        let msg = edit(&|m| m.members[1].instance_id = Some("i-a".into()));
        assert!(msg.contains("instance id \"i-a\" is held by two"), "{msg}");
        let msg = edit(&|m| m.leader = "z".into());
        assert!(msg.contains("leader \"z\" is not a member"), "{msg}");
        let msg = edit(&|m| m.protocol = "sticky".into());
        assert!(
            msg.contains("member \"a\" does not offer the chosen protocol \"sticky\""),
            "{msg}"
        );
        let msg = edit(&|m| m.members[1].client_id = "c".repeat(GROUP_ID_BYTES_MAX + 1));
        assert!(
            msg.contains("member \"b\": client id is 256 bytes, over the limit of 255"),
            "{msg}"
        );
        let msg = edit(&|m| m.members[0].assignment = vec![7; GROUP_BLOB_BYTES_MAX + 1]);
        assert!(
            msg.contains("member \"a\": assignment is 1048577 bytes, over the limit of 1048576"),
            "{msg}"
        );
        let msg = edit(&|m| m.members[0].protocols[1].metadata = vec![7; GROUP_BLOB_BYTES_MAX + 1]);
        assert!(msg.contains("protocol metadata is"), "{msg}");
        let msg = edit(&|m| {
            let p = m.members[0].protocols[0].clone();
            m.members[0].protocols = vec![p; GROUP_PROTOCOLS_MAX + 1];
        });
        assert!(msg.contains("offers 17 protocols, not 1..=16"), "{msg}");
        let msg = edit(&|m| {
            let p = m.members[0].protocols[0].clone();
            m.members[0].protocols[1] = p;
        });
        assert!(msg.contains("offers protocol \"range\" twice"), "{msg}");
        // Exactly at the limits is accepted.
        let mut f = with_members();
        let m = f.membership.as_mut().unwrap();
        m.members[0].assignment = vec![7; GROUP_BLOB_BYTES_MAX];
        m.members[0].client_id = "c".repeat(GROUP_ID_BYTES_MAX);
        assert_eq!(decode_group_file(&encode_group_file(&f)).unwrap(), f);
        // Text that is not base64, and a field the format does not know.
        let text = String::from_utf8(encode_group_file(&with_members())).unwrap();
        let bad = text.replacen("\"AAED\"", "\"A*ED\"", 1);
        let (_, p) = decode_group_file_keeping_offsets(bad.as_bytes()).unwrap();
        let msg = p.unwrap().to_string();
        assert!(
            msg.contains("member \"a\": assignment is not valid base64"),
            "{msg}"
        );
        // Text too long to hold 1 MiB is refused before it is decoded (as not
        // base64, it would be refused as such after).
        let long = "*".repeat(GROUP_BLOB_BYTES_MAX.div_ceil(3) * 4 + 4);
        let bad = text.replacen("\"AAED\"", &format!("\"{long}\""), 1);
        let (_, p) = decode_group_file_keeping_offsets(bad.as_bytes()).unwrap();
        let msg = p.unwrap().to_string();
        assert!(
            msg.contains("member \"a\": assignment is 1048581 bytes, over the limit of 1048576"),
            "{msg}"
        );
        let bad = text.replacen("\"leader\"", "\"extra\": 1, \"leader\"", 1);
        let (kept, p) = decode_group_file_keeping_offsets(bad.as_bytes()).unwrap();
        assert_eq!(kept.offsets, sample().offsets);
        let msg = p.unwrap().to_string();
        assert!(
            msg.starts_with(
                "membership of group g: not of the expected shape: unknown field `extra`"
            ),
            "{msg}"
        );
    }
}
