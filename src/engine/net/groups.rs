//! The native protocol's consumer-group requests, served by the engine's one group
//! coordinator. [`serve`] answers one request into `out`, awaiting the coordinator's
//! completions (a join or sync waits for the rebalance) without holding the event loop.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::engine::broker::Broker;
use crate::engine::groups::{Completion, GroupError, GroupListener, JoinRequest, OffsetCommit};
use crate::format::group::CommittedOffset;
use crate::format::wire::groups::{GroupRequest, GroupResponse, MemberEntry, OffsetEntry};
use crate::format::wire::{encode_error, encode_response, ErrorCode, ResponseBody, GROUPS_VERSION};

/// The wire code and message of a group error.
pub fn group_error(e: &GroupError) -> (ErrorCode, String) {
    let code = match e {
        GroupError::InvalidName(_) => ErrorCode::INVALID_NAME,
        GroupError::UnknownGroup { .. } => ErrorCode::UNKNOWN_GROUP,
        // Only Kafka clients name static instance ids.
        GroupError::UnknownMember { .. } | GroupError::FencedInstance { .. } => {
            ErrorCode::UNKNOWN_MEMBER
        }
        GroupError::IllegalGeneration { .. } => ErrorCode::ILLEGAL_GENERATION,
        GroupError::RebalanceInProgress { .. } => ErrorCode::REBALANCE_IN_PROGRESS,
        GroupError::GroupNotEmpty { .. } => ErrorCode::GROUP_NOT_EMPTY,
        GroupError::InvalidSessionTimeout { .. } => ErrorCode::INVALID_SESSION_TIMEOUT,
        GroupError::InconsistentProtocol { .. } => ErrorCode::INCONSISTENT_PROTOCOL,
        GroupError::MetadataTooLarge { .. } => ErrorCode::METADATA_TOO_LARGE,
        GroupError::UnknownTopic { .. } => ErrorCode::UNKNOWN_TOPIC,
        GroupError::UnknownPartition { .. } => ErrorCode::UNKNOWN_PARTITION,
        GroupError::TooLarge { .. } => ErrorCode::INVALID_REQUEST,
        GroupError::Storage { .. } => ErrorCode::STORAGE,
        GroupError::ShuttingDown => ErrorCode::SHUTTING_DOWN,
        // The message names the coordinator as a NOT_LEADER refusal names a leader.
        GroupError::NotCoordinator { .. } => ErrorCode::NOT_LEADER,
    };
    (code, e.to_string())
}

/// Awaits a completion, giving up when the server stops (checked every 100 ms).
async fn wait<T>(mut rx: Completion<T>, stop: &AtomicBool) -> Result<T, GroupError> {
    loop {
        match tokio::time::timeout(STOP_CHECK, &mut rx).await {
            Ok(Ok(r)) => return r,
            Ok(Err(_)) => return Err(GroupError::ShuttingDown),
            Err(_) if stop.load(Ordering::SeqCst) => return Err(GroupError::ShuttingDown),
            Err(_) => {}
        }
    }
}

/// How often a waiting request looks at the server's stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

fn offset_entries(offsets: &[CommittedOffset]) -> Vec<OffsetEntry<'_>> {
    offsets
        .iter()
        .map(|o| OffsetEntry {
            topic: &o.topic,
            partition: o.partition,
            offset: o.offset,
            metadata: &o.metadata,
            commit_ms: o.commit_ms,
        })
        .collect()
}

/// Answers one group request from `peer` into `out` (a response frame, success or
/// error).
pub async fn serve(
    broker: &Broker,
    peer: SocketAddr,
    version: u16,
    stop: &AtomicBool,
    id: u32,
    req: GroupRequest<'_>,
    out: &mut Vec<u8>,
) {
    let api = req.api_key() as u16;
    out.clear();
    if version < GROUPS_VERSION {
        let msg = format!(
            "{} needs protocol version {GROUPS_VERSION}; this connection agreed on {version}",
            req.api_key().name()
        );
        encode_error(out, id, api, ErrorCode::INVALID_REQUEST, &msg);
        return;
    }
    let reply = |out: &mut Vec<u8>, body: GroupResponse<'_>| {
        if let Err(e) = encode_response(
            out,
            id,
            api,
            ErrorCode::NONE,
            "",
            Some(&ResponseBody::Group(body)),
        ) {
            let msg = format!("cannot encode the response: {e}");
            encode_error(out, id, api, ErrorCode::INTERNAL, &msg);
        }
    };
    let groups = broker.groups();
    let result: Result<(), GroupError> = async {
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
                let r = wait(
                    groups.join(JoinRequest {
                        group: group.to_string(),
                        member_id: member_id.to_string(),
                        client_id: client_id.to_string(),
                        client_host: crate::engine::groups::client_host(peer),
                        session_timeout_ms,
                        rebalance_timeout_ms,
                        protocol_type: protocol_type.to_string(),
                        protocols: protocols
                            .iter()
                            .map(|(n, m)| ((*n).to_string(), m.to_vec()))
                            .collect(),
                        group_instance_id: None,
                        listener: GroupListener::Native,
                    }),
                    stop,
                )
                .await?;
                let members = r
                    .members
                    .iter()
                    .map(|(id, _, m)| (id.as_str(), m.as_slice()))
                    .collect();
                reply(
                    out,
                    GroupResponse::JoinGroup {
                        generation: r.generation,
                        protocol: &r.protocol,
                        leader: &r.leader,
                        member_id: &r.member_id,
                        members,
                    },
                );
            }
            GroupRequest::SyncGroup {
                group,
                generation,
                member_id,
                assignments,
            } => {
                let given = assignments
                    .iter()
                    .map(|(id, a)| ((*id).to_string(), a.to_vec()))
                    .collect();
                let a = wait(groups.sync(group, generation, member_id, None, given), stop).await?;
                reply(out, GroupResponse::SyncGroup { assignment: &a });
            }
            GroupRequest::Heartbeat {
                group,
                generation,
                member_id,
            } => {
                groups.heartbeat(group, generation, member_id, None)?;
                reply(out, GroupResponse::Heartbeat);
            }
            GroupRequest::LeaveGroup { group, member_id } => {
                groups.leave(group, member_id, None)?;
                reply(out, GroupResponse::LeaveGroup);
            }
            GroupRequest::OffsetCommit {
                group,
                generation,
                member_id,
                topic,
                offsets,
            } => {
                let entries: Vec<OffsetCommit> = offsets
                    .iter()
                    .map(|o| OffsetCommit {
                        partition: o.partition,
                        offset: o.offset,
                        metadata: o.metadata.to_string(),
                    })
                    .collect();
                let rx =
                    groups.commit(broker, group, generation, member_id, None, topic, &entries)?;
                wait(rx, stop).await?;
                reply(out, GroupResponse::OffsetCommit);
            }
            GroupRequest::OffsetFetch {
                group,
                generation,
                member_id,
                topic,
            } => {
                let member = (generation >= 0).then_some((member_id, generation));
                let topic = (!topic.is_empty()).then_some(topic);
                let offsets = groups.fetch_offsets(group, topic, member)?;
                reply(
                    out,
                    GroupResponse::OffsetFetch {
                        offsets: offset_entries(&offsets),
                    },
                );
            }
            GroupRequest::ListGroups => {
                let list = match groups.list() {
                    Ok(list) => list,
                    // No node coordinates: the offsets topic does not exist yet (no
                    // group was ever asked for), or an election is under way.
                    Err(GroupError::NotCoordinator {
                        coordinator: None, ..
                    }) => Vec::new(),
                    Err(e) => return Err(e),
                };
                let groups = list.iter().map(|(g, s)| (g.as_str(), s.name())).collect();
                reply(out, GroupResponse::ListGroups { groups });
            }
            GroupRequest::DescribeGroup { group } => {
                let d = groups.describe(group)?;
                let members = d
                    .members
                    .iter()
                    .map(|m| MemberEntry {
                        member_id: &m.member_id,
                        client_id: &m.client_id,
                        assignment: &m.assignment,
                    })
                    .collect();
                reply(
                    out,
                    GroupResponse::DescribeGroup {
                        state: d.state.name(),
                        generation: d.generation,
                        protocol_type: &d.protocol_type,
                        protocol: &d.protocol,
                        members,
                        offsets: offset_entries(&d.offsets),
                    },
                );
            }
            GroupRequest::DeleteGroup { group } => {
                wait(groups.delete(group)?, stop).await?;
                reply(out, GroupResponse::DeleteGroup);
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let (code, msg) = group_error(&e);
        out.clear();
        encode_error(out, id, api, code, &msg);
    }
}
