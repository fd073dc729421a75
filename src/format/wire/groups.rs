//! Consumer-group requests and responses (protocol version 3), as pure encode/decode
//! functions. docs/PROTOCOL.md, "Version 3", lays out every field.
//!
//! Types: `string` = u16 length + UTF-8, `bytes` = u32 length + bytes, counts u32.
//! Every count and length is checked against a named maximum and against the bytes
//! remaining before anything is allocated.

use super::{put_count, put_str, ApiKey, ProtocolError, Reader, TOPIC_BYTES_MAX};
use crate::format::group::OFFSET_METADATA_BYTES_MAX;
use crate::format::names::NAME_LEN_MAX;

/// Longest group name (as for topics).
pub const GROUP_BYTES_MAX: usize = NAME_LEN_MAX;
/// Longest member id, client id, protocol type, protocol name or state name.
pub const GROUP_ID_BYTES_MAX: usize = 255;
/// Longest offset metadata the wire carries; the broker stores at most
/// [`OFFSET_METADATA_BYTES_MAX`] and refuses longer ones with a clear error.
pub const METADATA_WIRE_BYTES_MAX: usize = 8 * OFFSET_METADATA_BYTES_MAX;
/// Largest protocol metadata or assignment.
pub const GROUP_BLOB_BYTES_MAX: u32 = 1 << 20;
/// Most protocols in one join.
pub const PROTOCOLS_MAX: u32 = 16;
/// Most members of a group.
pub const MEMBERS_MAX: u32 = 1000;
/// Most groups in a list.
pub const GROUPS_MAX: u32 = 10_000;
/// Most offsets in one commit, fetch or describe message.
pub const OFFSETS_MAX: u32 = 1 << 16;

const STRING_MIN: usize = 2;
const BLOB_MIN: usize = 4;
const COMMIT_ENTRY_MIN: usize = 4 + 8 + STRING_MIN;
const OFFSET_ENTRY_MIN: usize = STRING_MIN + 4 + 8 + STRING_MIN + 8;

/// A group request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupRequest<'a> {
    JoinGroup {
        group: &'a str,
        member_id: &'a str,
        client_id: &'a str,
        session_timeout_ms: u32,
        rebalance_timeout_ms: u32,
        protocol_type: &'a str,
        protocols: Vec<(&'a str, &'a [u8])>,
    },
    SyncGroup {
        group: &'a str,
        generation: i32,
        member_id: &'a str,
        assignments: Vec<(&'a str, &'a [u8])>,
    },
    Heartbeat {
        group: &'a str,
        generation: i32,
        member_id: &'a str,
    },
    LeaveGroup {
        group: &'a str,
        member_id: &'a str,
    },
    /// generation -1 with an empty member id: an admin commit (reset-offsets).
    OffsetCommit {
        group: &'a str,
        generation: i32,
        member_id: &'a str,
        topic: &'a str,
        offsets: Vec<CommitEntry<'a>>,
    },
    /// generation -1: no membership check; an empty topic: every topic.
    OffsetFetch {
        group: &'a str,
        generation: i32,
        member_id: &'a str,
        topic: &'a str,
    },
    ListGroups,
    DescribeGroup {
        group: &'a str,
    },
    DeleteGroup {
        group: &'a str,
    },
}

/// One offset of a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitEntry<'a> {
    pub partition: u32,
    pub offset: u64,
    pub metadata: &'a str,
}

/// One committed offset in a fetch or describe response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetEntry<'a> {
    pub topic: &'a str,
    pub partition: u32,
    pub offset: u64,
    pub metadata: &'a str,
    pub commit_ms: i64,
}

/// One member in a describe response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberEntry<'a> {
    pub member_id: &'a str,
    pub client_id: &'a str,
    pub assignment: &'a [u8],
}

/// The body of a successful group response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupResponse<'a> {
    JoinGroup {
        generation: i32,
        protocol: &'a str,
        leader: &'a str,
        member_id: &'a str,
        /// (member id, metadata): only in the leader's response.
        members: Vec<(&'a str, &'a [u8])>,
    },
    SyncGroup {
        assignment: &'a [u8],
    },
    Heartbeat,
    LeaveGroup,
    OffsetCommit,
    OffsetFetch {
        offsets: Vec<OffsetEntry<'a>>,
    },
    ListGroups {
        groups: Vec<(&'a str, &'a str)>,
    },
    DescribeGroup {
        state: &'a str,
        generation: i32,
        protocol_type: &'a str,
        protocol: &'a str,
        members: Vec<MemberEntry<'a>>,
        offsets: Vec<OffsetEntry<'a>>,
    },
    DeleteGroup,
}

impl GroupRequest<'_> {
    pub fn api_key(&self) -> ApiKey {
        match self {
            GroupRequest::JoinGroup { .. } => ApiKey::JoinGroup,
            GroupRequest::SyncGroup { .. } => ApiKey::SyncGroup,
            GroupRequest::Heartbeat { .. } => ApiKey::Heartbeat,
            GroupRequest::LeaveGroup { .. } => ApiKey::LeaveGroup,
            GroupRequest::OffsetCommit { .. } => ApiKey::OffsetCommit,
            GroupRequest::OffsetFetch { .. } => ApiKey::OffsetFetch,
            GroupRequest::ListGroups => ApiKey::ListGroups,
            GroupRequest::DescribeGroup { .. } => ApiKey::DescribeGroup,
            GroupRequest::DeleteGroup { .. } => ApiKey::DeleteGroup,
        }
    }
}

impl GroupResponse<'_> {
    pub fn api_key(&self) -> ApiKey {
        match self {
            GroupResponse::JoinGroup { .. } => ApiKey::JoinGroup,
            GroupResponse::SyncGroup { .. } => ApiKey::SyncGroup,
            GroupResponse::Heartbeat => ApiKey::Heartbeat,
            GroupResponse::LeaveGroup => ApiKey::LeaveGroup,
            GroupResponse::OffsetCommit => ApiKey::OffsetCommit,
            GroupResponse::OffsetFetch { .. } => ApiKey::OffsetFetch,
            GroupResponse::ListGroups { .. } => ApiKey::ListGroups,
            GroupResponse::DescribeGroup { .. } => ApiKey::DescribeGroup,
            GroupResponse::DeleteGroup => ApiKey::DeleteGroup,
        }
    }
}

fn put_blob(out: &mut Vec<u8>, field: &'static str, b: &[u8]) -> Result<(), ProtocolError> {
    if b.len() > GROUP_BLOB_BYTES_MAX as usize {
        return Err(ProtocolError::Unencodable {
            field,
            len: b.len() as u64,
            max: u64::from(GROUP_BLOB_BYTES_MAX),
        });
    }
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
    Ok(())
}

fn put_pairs(
    out: &mut Vec<u8>,
    field: &'static str,
    pairs: &[(&str, &[u8])],
    max: u32,
) -> Result<(), ProtocolError> {
    put_count(out, field, pairs.len(), max)?;
    for (id, b) in pairs {
        put_str(out, field, id, GROUP_ID_BYTES_MAX)?;
        put_blob(out, field, b)?;
    }
    Ok(())
}

fn put_offsets(out: &mut Vec<u8>, offsets: &[OffsetEntry<'_>]) -> Result<(), ProtocolError> {
    put_count(out, "offsets", offsets.len(), OFFSETS_MAX)?;
    for o in offsets {
        put_str(out, "topic", o.topic, TOPIC_BYTES_MAX)?;
        out.extend_from_slice(&o.partition.to_be_bytes());
        out.extend_from_slice(&o.offset.to_be_bytes());
        put_str(out, "metadata", o.metadata, METADATA_WIRE_BYTES_MAX)?;
        out.extend_from_slice(&o.commit_ms.to_be_bytes());
    }
    Ok(())
}

/// Appends a group request's payload.
pub(super) fn encode_request(
    out: &mut Vec<u8>,
    req: &GroupRequest<'_>,
) -> Result<(), ProtocolError> {
    match req {
        GroupRequest::JoinGroup {
            group,
            member_id,
            client_id,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
        } => {
            put_str(out, "group", group, GROUP_BYTES_MAX)?;
            put_str(out, "member_id", member_id, GROUP_ID_BYTES_MAX)?;
            put_str(out, "client_id", client_id, GROUP_ID_BYTES_MAX)?;
            out.extend_from_slice(&session_timeout_ms.to_be_bytes());
            out.extend_from_slice(&rebalance_timeout_ms.to_be_bytes());
            put_str(out, "protocol_type", protocol_type, GROUP_ID_BYTES_MAX)?;
            put_pairs(out, "protocols", protocols, PROTOCOLS_MAX)?;
        }
        GroupRequest::SyncGroup {
            group,
            generation,
            member_id,
            assignments,
        } => {
            put_str(out, "group", group, GROUP_BYTES_MAX)?;
            out.extend_from_slice(&generation.to_be_bytes());
            put_str(out, "member_id", member_id, GROUP_ID_BYTES_MAX)?;
            put_pairs(out, "assignments", assignments, MEMBERS_MAX)?;
        }
        GroupRequest::Heartbeat {
            group,
            generation,
            member_id,
        } => {
            put_str(out, "group", group, GROUP_BYTES_MAX)?;
            out.extend_from_slice(&generation.to_be_bytes());
            put_str(out, "member_id", member_id, GROUP_ID_BYTES_MAX)?;
        }
        GroupRequest::LeaveGroup { group, member_id } => {
            put_str(out, "group", group, GROUP_BYTES_MAX)?;
            put_str(out, "member_id", member_id, GROUP_ID_BYTES_MAX)?;
        }
        GroupRequest::OffsetCommit {
            group,
            generation,
            member_id,
            topic,
            offsets,
        } => {
            put_str(out, "group", group, GROUP_BYTES_MAX)?;
            out.extend_from_slice(&generation.to_be_bytes());
            put_str(out, "member_id", member_id, GROUP_ID_BYTES_MAX)?;
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            put_count(out, "offsets", offsets.len(), OFFSETS_MAX)?;
            for o in offsets {
                out.extend_from_slice(&o.partition.to_be_bytes());
                out.extend_from_slice(&o.offset.to_be_bytes());
                put_str(out, "metadata", o.metadata, METADATA_WIRE_BYTES_MAX)?;
            }
        }
        GroupRequest::OffsetFetch {
            group,
            generation,
            member_id,
            topic,
        } => {
            put_str(out, "group", group, GROUP_BYTES_MAX)?;
            out.extend_from_slice(&generation.to_be_bytes());
            put_str(out, "member_id", member_id, GROUP_ID_BYTES_MAX)?;
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
        }
        GroupRequest::ListGroups => {}
        GroupRequest::DescribeGroup { group } | GroupRequest::DeleteGroup { group } => {
            put_str(out, "group", group, GROUP_BYTES_MAX)?;
        }
    }
    Ok(())
}

/// Appends a group response's body.
pub(super) fn encode_response(
    out: &mut Vec<u8>,
    body: &GroupResponse<'_>,
) -> Result<(), ProtocolError> {
    match body {
        GroupResponse::JoinGroup {
            generation,
            protocol,
            leader,
            member_id,
            members,
        } => {
            out.extend_from_slice(&generation.to_be_bytes());
            put_str(out, "protocol", protocol, GROUP_ID_BYTES_MAX)?;
            put_str(out, "leader", leader, GROUP_ID_BYTES_MAX)?;
            put_str(out, "member_id", member_id, GROUP_ID_BYTES_MAX)?;
            put_pairs(out, "members", members, MEMBERS_MAX)?;
        }
        GroupResponse::SyncGroup { assignment } => put_blob(out, "assignment", assignment)?,
        GroupResponse::Heartbeat
        | GroupResponse::LeaveGroup
        | GroupResponse::OffsetCommit
        | GroupResponse::DeleteGroup => {}
        GroupResponse::OffsetFetch { offsets } => put_offsets(out, offsets)?,
        GroupResponse::ListGroups { groups } => {
            put_count(out, "groups", groups.len(), GROUPS_MAX)?;
            for (g, state) in groups {
                put_str(out, "group", g, GROUP_BYTES_MAX)?;
                put_str(out, "state", state, GROUP_ID_BYTES_MAX)?;
            }
        }
        GroupResponse::DescribeGroup {
            state,
            generation,
            protocol_type,
            protocol,
            members,
            offsets,
        } => {
            put_str(out, "state", state, GROUP_ID_BYTES_MAX)?;
            out.extend_from_slice(&generation.to_be_bytes());
            put_str(out, "protocol_type", protocol_type, GROUP_ID_BYTES_MAX)?;
            put_str(out, "protocol", protocol, GROUP_ID_BYTES_MAX)?;
            put_count(out, "members", members.len(), MEMBERS_MAX)?;
            for m in members {
                put_str(out, "member_id", m.member_id, GROUP_ID_BYTES_MAX)?;
                put_str(out, "client_id", m.client_id, GROUP_ID_BYTES_MAX)?;
                put_blob(out, "assignment", m.assignment)?;
            }
            put_offsets(out, offsets)?;
        }
    }
    Ok(())
}

impl<'a> Reader<'a> {
    fn blob(&mut self, field: &'static str) -> Result<&'a [u8], ProtocolError> {
        let at = self.at;
        let len = self.u32(field)?;
        if len > GROUP_BLOB_BYTES_MAX {
            return Err(ProtocolError::TooLong {
                field,
                at,
                len: u64::from(len),
                max: u64::from(GROUP_BLOB_BYTES_MAX),
            });
        }
        self.take(field, len as usize)
    }

    fn pairs(
        &mut self,
        field: &'static str,
        max: u32,
    ) -> Result<Vec<(&'a str, &'a [u8])>, ProtocolError> {
        let n = self.count(field, max, STRING_MIN + BLOB_MIN)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.str(field, GROUP_ID_BYTES_MAX)?;
            v.push((id, self.blob(field)?));
        }
        Ok(v)
    }

    fn offset_entries(&mut self) -> Result<Vec<OffsetEntry<'a>>, ProtocolError> {
        let n = self.count("offsets", OFFSETS_MAX, OFFSET_ENTRY_MIN)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(OffsetEntry {
                topic: self.str("topic", TOPIC_BYTES_MAX)?,
                partition: self.u32("partition")?,
                offset: self.u64("offset")?,
                metadata: self.str("metadata", METADATA_WIRE_BYTES_MAX)?,
                commit_ms: self.i64("commit_ms")?,
            });
        }
        Ok(v)
    }
}

/// Decodes the payload of a group request whose api key is `api`.
pub(super) fn decode_request<'a>(
    api: ApiKey,
    r: &mut Reader<'a>,
) -> Result<GroupRequest<'a>, ProtocolError> {
    Ok(match api {
        ApiKey::JoinGroup => GroupRequest::JoinGroup {
            group: r.str("group", GROUP_BYTES_MAX)?,
            member_id: r.str("member_id", GROUP_ID_BYTES_MAX)?,
            client_id: r.str("client_id", GROUP_ID_BYTES_MAX)?,
            session_timeout_ms: r.u32("session_timeout_ms")?,
            rebalance_timeout_ms: r.u32("rebalance_timeout_ms")?,
            protocol_type: r.str("protocol_type", GROUP_ID_BYTES_MAX)?,
            protocols: r.pairs("protocols", PROTOCOLS_MAX)?,
        },
        ApiKey::SyncGroup => GroupRequest::SyncGroup {
            group: r.str("group", GROUP_BYTES_MAX)?,
            generation: r.i32("generation")?,
            member_id: r.str("member_id", GROUP_ID_BYTES_MAX)?,
            assignments: r.pairs("assignments", MEMBERS_MAX)?,
        },
        ApiKey::Heartbeat => GroupRequest::Heartbeat {
            group: r.str("group", GROUP_BYTES_MAX)?,
            generation: r.i32("generation")?,
            member_id: r.str("member_id", GROUP_ID_BYTES_MAX)?,
        },
        ApiKey::LeaveGroup => GroupRequest::LeaveGroup {
            group: r.str("group", GROUP_BYTES_MAX)?,
            member_id: r.str("member_id", GROUP_ID_BYTES_MAX)?,
        },
        ApiKey::OffsetCommit => {
            let group = r.str("group", GROUP_BYTES_MAX)?;
            let generation = r.i32("generation")?;
            let member_id = r.str("member_id", GROUP_ID_BYTES_MAX)?;
            let topic = r.str("topic", TOPIC_BYTES_MAX)?;
            let n = r.count("offsets", OFFSETS_MAX, COMMIT_ENTRY_MIN)?;
            let mut offsets = Vec::with_capacity(n);
            for _ in 0..n {
                offsets.push(CommitEntry {
                    partition: r.u32("partition")?,
                    offset: r.u64("offset")?,
                    metadata: r.str("metadata", METADATA_WIRE_BYTES_MAX)?,
                });
            }
            GroupRequest::OffsetCommit {
                group,
                generation,
                member_id,
                topic,
                offsets,
            }
        }
        ApiKey::OffsetFetch => GroupRequest::OffsetFetch {
            group: r.str("group", GROUP_BYTES_MAX)?,
            generation: r.i32("generation")?,
            member_id: r.str("member_id", GROUP_ID_BYTES_MAX)?,
            topic: r.str("topic", TOPIC_BYTES_MAX)?,
        },
        ApiKey::ListGroups => GroupRequest::ListGroups,
        ApiKey::DescribeGroup => GroupRequest::DescribeGroup {
            group: r.str("group", GROUP_BYTES_MAX)?,
        },
        _ => GroupRequest::DeleteGroup {
            group: r.str("group", GROUP_BYTES_MAX)?,
        },
    })
}

/// Decodes the body of a successful group response whose api key is `api`.
pub(super) fn decode_response<'a>(
    api: ApiKey,
    r: &mut Reader<'a>,
) -> Result<GroupResponse<'a>, ProtocolError> {
    Ok(match api {
        ApiKey::JoinGroup => GroupResponse::JoinGroup {
            generation: r.i32("generation")?,
            protocol: r.str("protocol", GROUP_ID_BYTES_MAX)?,
            leader: r.str("leader", GROUP_ID_BYTES_MAX)?,
            member_id: r.str("member_id", GROUP_ID_BYTES_MAX)?,
            members: r.pairs("members", MEMBERS_MAX)?,
        },
        ApiKey::SyncGroup => GroupResponse::SyncGroup {
            assignment: r.blob("assignment")?,
        },
        ApiKey::Heartbeat => GroupResponse::Heartbeat,
        ApiKey::LeaveGroup => GroupResponse::LeaveGroup,
        ApiKey::OffsetCommit => GroupResponse::OffsetCommit,
        ApiKey::OffsetFetch => GroupResponse::OffsetFetch {
            offsets: r.offset_entries()?,
        },
        ApiKey::ListGroups => {
            let n = r.count("groups", GROUPS_MAX, 2 * STRING_MIN)?;
            let mut groups = Vec::with_capacity(n);
            for _ in 0..n {
                let g = r.str("group", GROUP_BYTES_MAX)?;
                groups.push((g, r.str("state", GROUP_ID_BYTES_MAX)?));
            }
            GroupResponse::ListGroups { groups }
        }
        ApiKey::DescribeGroup => {
            let state = r.str("state", GROUP_ID_BYTES_MAX)?;
            let generation = r.i32("generation")?;
            let protocol_type = r.str("protocol_type", GROUP_ID_BYTES_MAX)?;
            let protocol = r.str("protocol", GROUP_ID_BYTES_MAX)?;
            let n = r.count("members", MEMBERS_MAX, 2 * STRING_MIN + BLOB_MIN)?;
            let mut members = Vec::with_capacity(n);
            for _ in 0..n {
                members.push(MemberEntry {
                    member_id: r.str("member_id", GROUP_ID_BYTES_MAX)?,
                    client_id: r.str("client_id", GROUP_ID_BYTES_MAX)?,
                    assignment: r.blob("assignment")?,
                });
            }
            GroupResponse::DescribeGroup {
                state,
                generation,
                protocol_type,
                protocol,
                members,
                offsets: r.offset_entries()?,
            }
        }
        _ => GroupResponse::DeleteGroup,
    })
}

/// The assignment and subscription payloads of the `consumer` protocol type, as the
/// seglog client encodes them inside join metadata and sync assignments:
/// `count u32, then per topic: string topic, count u32, partitions u32…` (a
/// subscription lists topics with no partitions).
pub fn encode_topic_partitions(items: &[(&str, Vec<u32>)]) -> Result<Vec<u8>, ProtocolError> {
    let mut out = Vec::new();
    put_count(&mut out, "topics", items.len(), OFFSETS_MAX)?;
    for (t, ps) in items {
        put_str(&mut out, "topic", t, TOPIC_BYTES_MAX)?;
        put_count(
            &mut out,
            "partitions",
            ps.len(),
            super::PARTITIONS_PER_MESSAGE_MAX,
        )?;
        for p in ps {
            out.extend_from_slice(&p.to_be_bytes());
        }
    }
    Ok(out)
}

/// Decodes [`encode_topic_partitions`].
pub fn decode_topic_partitions(bytes: &[u8]) -> Result<Vec<(String, Vec<u32>)>, ProtocolError> {
    let mut r = Reader::new(bytes, 0);
    let n = r.count("topics", OFFSETS_MAX, STRING_MIN + 4)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = r.str("topic", TOPIC_BYTES_MAX)?.to_string();
        let m = r.count("partitions", super::PARTITIONS_PER_MESSAGE_MAX, 4)?;
        let mut ps = Vec::with_capacity(m);
        for _ in 0..m {
            ps.push(r.u32("partition")?);
        }
        v.push((t, ps));
    }
    r.finish()?;
    Ok(v)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
pub(super) mod tests {
    use super::*;

    /// One of each group request; the parent module's tests round-trip them and cut
    /// them at every length.
    pub(crate) fn sample_requests() -> Vec<GroupRequest<'static>> {
        vec![
            GroupRequest::JoinGroup {
                group: "g",
                member_id: "",
                client_id: "c",
                session_timeout_ms: 45_000,
                rebalance_timeout_ms: 60_000,
                protocol_type: "consumer",
                protocols: vec![("range", b"sub"), ("roundrobin", b"")],
            },
            GroupRequest::SyncGroup {
                group: "g",
                generation: 3,
                member_id: "m",
                assignments: vec![("m", b"a"), ("n", b"")],
            },
            GroupRequest::Heartbeat {
                group: "g",
                generation: -1,
                member_id: "m",
            },
            GroupRequest::LeaveGroup {
                group: "g",
                member_id: "m",
            },
            GroupRequest::OffsetCommit {
                group: "g",
                generation: 2,
                member_id: "m",
                topic: "t",
                offsets: vec![CommitEntry {
                    partition: 1,
                    offset: 9,
                    metadata: "x",
                }],
            },
            GroupRequest::OffsetFetch {
                group: "g",
                generation: -1,
                member_id: "",
                topic: "",
            },
            GroupRequest::ListGroups,
            GroupRequest::DescribeGroup { group: "g" },
            GroupRequest::DeleteGroup { group: "g" },
        ]
    }

    pub(crate) fn sample_responses() -> Vec<GroupResponse<'static>> {
        let offsets = vec![OffsetEntry {
            topic: "t",
            partition: 2,
            offset: 7,
            metadata: "",
            commit_ms: 5,
        }];
        vec![
            GroupResponse::JoinGroup {
                generation: 1,
                protocol: "range",
                leader: "m",
                member_id: "m",
                members: vec![("m", b"sub")],
            },
            GroupResponse::SyncGroup { assignment: b"abc" },
            GroupResponse::Heartbeat,
            GroupResponse::LeaveGroup,
            GroupResponse::OffsetCommit,
            GroupResponse::OffsetFetch {
                offsets: offsets.clone(),
            },
            GroupResponse::ListGroups {
                groups: vec![("g", "Stable")],
            },
            GroupResponse::DescribeGroup {
                state: "Stable",
                generation: 4,
                protocol_type: "consumer",
                protocol: "range",
                members: vec![MemberEntry {
                    member_id: "m",
                    client_id: "c",
                    assignment: b"a",
                }],
                offsets,
            },
            GroupResponse::DeleteGroup,
        ]
    }

    #[test]
    fn topic_partitions_round_trip_and_refuse_garbage() {
        let items = vec![("t", vec![0u32, 3]), ("u", vec![])];
        let bytes = encode_topic_partitions(&items).unwrap();
        let back = decode_topic_partitions(&bytes).unwrap();
        assert_eq!(
            back,
            vec![("t".to_string(), vec![0, 3]), ("u".to_string(), vec![])]
        );
        for cut in 0..bytes.len() {
            assert!(decode_topic_partitions(&bytes[..cut]).is_err());
        }
        // A count far beyond the bytes present is refused before allocating.
        assert!(matches!(
            decode_topic_partitions(&[0, 0, 0xFF, 0xFF]),
            Err(ProtocolError::Truncated { .. })
        ));
    }
}
