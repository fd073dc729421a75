//! The client side of the consumer-group requests (protocol version 3): owned
//! results, the same connection and error type as [`Client`].

use std::time::Duration;

use super::client::{Client, ClientError};
use crate::format::group::CommittedOffset;
use crate::format::wire::groups::{CommitEntry, GroupRequest, GroupResponse};
use crate::format::wire::{Request, ResponseBody};

/// The result of a join.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joined {
    pub generation: i32,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// (member id, metadata): filled only for the leader.
    pub members: Vec<(String, Vec<u8>)>,
}

/// A member of a described group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub client_id: String,
    pub assignment: Vec<u8>,
}

/// A described group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    pub state: String,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<GroupMember>,
    pub offsets: Vec<CommittedOffset>,
}

impl Client {
    fn group_call(
        &mut self,
        req: GroupRequest<'_>,
        wait: Duration,
    ) -> Result<GroupResponse<'_>, ClientError> {
        let body = self.call(&Request::Group(req), wait)?;
        match body {
            ResponseBody::Group(g) => Ok(g),
            _ => Err(ClientError::Protocol {
                addr: String::new(),
                detail: "a group request answered with another response".into(),
            }),
        }
    }

    /// Joins `group`; returns when the rebalance's join phase ends (waits up to
    /// `rebalance_timeout` besides the connection's timeout).
    #[expect(clippy::too_many_arguments, reason = "the fields of a join request")]
    pub fn join_group(
        &mut self,
        group: &str,
        member_id: &str,
        client_id: &str,
        session_timeout: Duration,
        rebalance_timeout: Duration,
        protocol_type: &str,
        protocols: &[(&str, &[u8])],
    ) -> Result<Joined, ClientError> {
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        let req = GroupRequest::JoinGroup {
            group,
            member_id,
            client_id,
            session_timeout_ms: ms(session_timeout),
            rebalance_timeout_ms: ms(rebalance_timeout),
            protocol_type,
            protocols: protocols.to_vec(),
        };
        match self.group_call(req, rebalance_timeout)? {
            GroupResponse::JoinGroup {
                generation,
                protocol,
                leader,
                member_id,
                members,
            } => Ok(Joined {
                generation,
                protocol: protocol.to_string(),
                leader: leader.to_string(),
                member_id: member_id.to_string(),
                members: members
                    .iter()
                    .map(|(id, m)| ((*id).to_string(), m.to_vec()))
                    .collect(),
            }),
            _ => Err(self.protocol("join answered with another response")),
        }
    }

    /// Syncs; the leader passes every member's assignment. Returns this member's.
    pub fn sync_group(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        assignments: &[(&str, &[u8])],
        wait: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let req = GroupRequest::SyncGroup {
            group,
            generation,
            member_id,
            assignments: assignments.to_vec(),
        };
        match self.group_call(req, wait)? {
            GroupResponse::SyncGroup { assignment } => Ok(assignment.to_vec()),
            _ => Err(self.protocol("sync answered with another response")),
        }
    }

    pub fn heartbeat(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
    ) -> Result<(), ClientError> {
        let req = GroupRequest::Heartbeat {
            group,
            generation,
            member_id,
        };
        self.group_call(req, Duration::ZERO).map(|_| ())
    }

    pub fn leave_group(&mut self, group: &str, member_id: &str) -> Result<(), ClientError> {
        let req = GroupRequest::LeaveGroup { group, member_id };
        self.group_call(req, Duration::ZERO).map(|_| ())
    }

    /// Commits offsets (partition, next offset, metadata) of `topic`. Generation -1
    /// with an empty member id is an admin commit (only while the group is empty).
    pub fn commit_offsets(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        topic: &str,
        offsets: &[(u32, u64, &str)],
    ) -> Result<(), ClientError> {
        let req = GroupRequest::OffsetCommit {
            group,
            generation,
            member_id,
            topic,
            offsets: offsets
                .iter()
                .map(|&(partition, offset, metadata)| CommitEntry {
                    partition,
                    offset,
                    metadata,
                })
                .collect(),
        };
        self.group_call(req, Duration::ZERO).map(|_| ())
    }

    /// Committed offsets of `group` (of `topic`, or every topic when empty). With a
    /// member and generation (>= 0), membership is checked.
    pub fn fetch_offsets(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        topic: &str,
    ) -> Result<Vec<CommittedOffset>, ClientError> {
        let req = GroupRequest::OffsetFetch {
            group,
            generation,
            member_id,
            topic,
        };
        match self.group_call(req, Duration::ZERO)? {
            GroupResponse::OffsetFetch { offsets } => Ok(owned_offsets(&offsets)),
            _ => Err(self.protocol("offset fetch answered with another response")),
        }
    }

    /// Every group and its state.
    pub fn list_groups(&mut self) -> Result<Vec<(String, String)>, ClientError> {
        match self.group_call(GroupRequest::ListGroups, Duration::ZERO)? {
            GroupResponse::ListGroups { groups } => Ok(groups
                .iter()
                .map(|(g, s)| ((*g).to_string(), (*s).to_string()))
                .collect()),
            _ => Err(self.protocol("list groups answered with another response")),
        }
    }

    pub fn describe_group(&mut self, group: &str) -> Result<GroupInfo, ClientError> {
        match self.group_call(GroupRequest::DescribeGroup { group }, Duration::ZERO)? {
            GroupResponse::DescribeGroup {
                state,
                generation,
                protocol_type,
                protocol,
                members,
                offsets,
            } => Ok(GroupInfo {
                state: state.to_string(),
                generation,
                protocol_type: protocol_type.to_string(),
                protocol: protocol.to_string(),
                members: members
                    .iter()
                    .map(|m| GroupMember {
                        member_id: m.member_id.to_string(),
                        client_id: m.client_id.to_string(),
                        assignment: m.assignment.to_vec(),
                    })
                    .collect(),
                offsets: owned_offsets(&offsets),
            }),
            _ => Err(self.protocol("describe group answered with another response")),
        }
    }

    pub fn delete_group(&mut self, group: &str) -> Result<(), ClientError> {
        self.group_call(GroupRequest::DeleteGroup { group }, Duration::ZERO)
            .map(|_| ())
    }
}

fn owned_offsets(offsets: &[crate::format::wire::groups::OffsetEntry<'_>]) -> Vec<CommittedOffset> {
    offsets
        .iter()
        .map(|o| CommittedOffset {
            topic: o.topic.to_string(),
            partition: o.partition,
            offset: o.offset,
            metadata: o.metadata.to_string(),
            commit_ms: o.commit_ms,
        })
        .collect()
}
