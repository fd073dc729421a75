//! FindCoordinator (this broker), JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! ListGroups and DescribeGroups through the engine's one group coordinator; a join
//! or sync awaits the rebalance without holding the event loop.

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsResponse, ResponseKind,
    SyncGroupRequest, SyncGroupResponse,
};

use super::server::{Ctx, Outcome, POLL_INTERVAL};
use super::{code, sb};
use crate::engine::groups::{Completion, GroupError, GroupListener, JoinRequest};

/// The Kafka code and message of a group error.
pub(crate) fn group_code(e: &GroupError) -> (i16, String) {
    let c = match e {
        GroupError::InvalidName(_) => code::INVALID_GROUP_ID,
        GroupError::UnknownGroup { .. } => code::GROUP_ID_NOT_FOUND,
        GroupError::UnknownMember { .. } => code::UNKNOWN_MEMBER_ID,
        GroupError::FencedInstance { .. } => code::FENCED_INSTANCE_ID,
        GroupError::IllegalGeneration { .. } => code::ILLEGAL_GENERATION,
        GroupError::RebalanceInProgress { .. } => code::REBALANCE_IN_PROGRESS,
        GroupError::GroupNotEmpty { .. } => code::NON_EMPTY_GROUP,
        GroupError::InvalidSessionTimeout { .. } => code::INVALID_SESSION_TIMEOUT,
        GroupError::InconsistentProtocol { .. } => code::INCONSISTENT_GROUP_PROTOCOL,
        GroupError::MetadataTooLarge { .. } => code::OFFSET_METADATA_TOO_LARGE,
        GroupError::UnknownTopic { .. } | GroupError::UnknownPartition { .. } => {
            code::UNKNOWN_TOPIC_OR_PARTITION
        }
        GroupError::TooLarge { .. } => code::INVALID_REQUEST,
        GroupError::Storage { .. } => code::KAFKA_STORAGE_ERROR,
        GroupError::ShuttingDown => code::COORDINATOR_NOT_AVAILABLE,
        // The client asks FindCoordinator again.
        GroupError::NotCoordinator {
            coordinator: Some(_),
            ..
        } => code::NOT_COORDINATOR,
        GroupError::NotCoordinator {
            coordinator: None, ..
        } => code::COORDINATOR_NOT_AVAILABLE,
    };
    (c, e.to_string())
}

/// A request's static instance id (JoinGroup v5+, SyncGroup and Heartbeat v3+,
/// LeaveGroup v3+, OffsetCommit v7+): `None` when absent (null) or empty.
pub(crate) fn instance_id(id: Option<&kafka_protocol::protocol::StrBytes>) -> Option<&str> {
    id.map(kafka_protocol::protocol::StrBytes::as_str)
        .filter(|s| !s.is_empty())
}

/// Awaits a coordinator completion, giving up when the server stops.
pub(crate) async fn wait<T>(mut rx: Completion<T>, stop: &AtomicBool) -> Result<T, GroupError> {
    loop {
        match tokio::time::timeout(POLL_INTERVAL, &mut rx).await {
            Ok(Ok(r)) => return r,
            Ok(Err(_)) => return Err(GroupError::ShuttingDown),
            Err(_) if stop.load(Ordering::SeqCst) => return Err(GroupError::ShuttingDown),
            Err(_) => {}
        }
    }
}

pub(crate) fn find_coordinator(ctx: &Ctx, r: FindCoordinatorRequest) -> Outcome {
    let mut resp = FindCoordinatorResponse::default();
    if r.key_type == 1 {
        // A transaction coordinator: refused as Kafka refuses a transactional id the
        // client may not use, which clients treat as final, with the reason
        // (librdkafka's init_transactions() fails at once and shows the message).
        let c = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        ctx.client_error(ApiKey::FindCoordinator, c, super::NO_TRANSACTIONS);
        resp.error_code = c;
        resp.error_message = Some(sb(super::NO_TRANSACTIONS));
        resp.node_id = BrokerId(-1);
        resp.port = -1;
        return Outcome::reply(ResponseKind::FindCoordinator(resp));
    }
    let (host, port) = match ctx.opts.replication.as_ref() {
        None => (ctx.opts.advertised_host.clone(), ctx.opts.advertised_port),
        // In a cluster: the leader of the offsets topic's partition, at its Kafka
        // address; none known yet (an election, or the topic is being created):
        // COORDINATOR_NOT_AVAILABLE, after which clients ask again.
        Some(r) => match coordinator_at(ctx, &**r) {
            Some((id, host, port)) => {
                resp.node_id = BrokerId(super::server::broker_id(id));
                (host, port)
            }
            None => {
                ctx.broker.groups().want();
                let c = code::COORDINATOR_NOT_AVAILABLE;
                let msg = "no node coordinates the groups yet (the offsets topic has no \
                           leader): ask again";
                ctx.client_error(ApiKey::FindCoordinator, c, msg);
                resp.error_code = c;
                resp.error_message = Some(sb(msg));
                resp.node_id = BrokerId(-1);
                resp.port = -1;
                return Outcome::reply(ResponseKind::FindCoordinator(resp));
            }
        },
    };
    if ctx.opts.replication.is_none() {
        resp.node_id = BrokerId(ctx.node_id());
    }
    resp.host = sb(&host);
    resp.port = port;
    resp.error_message = None;
    Outcome::reply(ResponseKind::FindCoordinator(resp))
}

/// The coordinator of a cluster's groups: node id and Kafka host and port.
fn coordinator_at(
    ctx: &Ctx,
    r: &dyn crate::engine::replication::Replicator,
) -> Option<(u64, String, i32)> {
    let id = r.coordinator()?;
    if id == r.node_id() {
        return Some((
            id,
            ctx.opts.advertised_host.clone(),
            ctx.opts.advertised_port,
        ));
    }
    let addr = r.kafka_nodes().into_iter().find(|(n, _)| *n == id)?.1;
    let (host, port) = super::server::split_host_port(&addr)?;
    Some((id, host, port))
}

/// A JoinGroup; `client_id` is the request header's.
pub(crate) async fn join(
    ctx: &Ctx,
    r: JoinGroupRequest,
    version: i16,
    client_id: Option<&str>,
) -> Outcome {
    let mut resp = JoinGroupResponse::default();
    let session = u32::try_from(r.session_timeout_ms).unwrap_or(0);
    let rebalance = if version >= 1 {
        u32::try_from(r.rebalance_timeout_ms).unwrap_or(session)
    } else {
        session
    };
    let req = JoinRequest {
        group: r.group_id.0.as_str().to_string(),
        member_id: r.member_id.as_str().to_string(),
        client_id: client_id.unwrap_or_default().to_string(),
        client_host: crate::engine::groups::client_host(ctx.peer),
        session_timeout_ms: session,
        rebalance_timeout_ms: rebalance,
        protocol_type: r.protocol_type.as_str().to_string(),
        protocols: r
            .protocols
            .iter()
            .map(|p| (p.name.as_str().to_string(), p.metadata.to_vec()))
            .collect(),
        group_instance_id: instance_id(r.group_instance_id.as_ref()).map(str::to_string),
        listener: GroupListener::Kafka,
    };
    match wait(ctx.broker.groups().join(req), &ctx.stop).await {
        Ok(j) => {
            resp.generation_id = j.generation;
            resp.protocol_name = Some(sb(&j.protocol));
            if version >= 7 {
                resp.protocol_type = Some(r.protocol_type.clone());
            }
            resp.leader = sb(&j.leader);
            resp.member_id = sb(&j.member_id);
            resp.members = j
                .members
                .iter()
                .map(|(id, instance, m)| {
                    let mut e = JoinGroupResponseMember::default();
                    e.member_id = sb(id);
                    // Only encoded from version 5 on.
                    e.group_instance_id = instance.as_deref().map(sb);
                    e.metadata = Bytes::copy_from_slice(m);
                    e
                })
                .collect();
        }
        Err(e) => {
            let (c, msg) = group_code(&e);
            ctx.client_error(ApiKey::JoinGroup, c, &msg);
            resp.error_code = c;
            resp.generation_id = -1;
            resp.member_id = r.member_id.clone();
            resp.protocol_name = if version >= 7 { None } else { Some(sb("")) };
        }
    }
    Outcome::reply(ResponseKind::JoinGroup(resp))
}

pub(crate) async fn sync(ctx: &Ctx, r: SyncGroupRequest) -> Outcome {
    let mut resp = SyncGroupResponse::default();
    let given = r
        .assignments
        .iter()
        .map(|a| (a.member_id.as_str().to_string(), a.assignment.to_vec()))
        .collect();
    let rx = ctx.broker.groups().sync(
        r.group_id.0.as_str(),
        r.generation_id,
        r.member_id.as_str(),
        instance_id(r.group_instance_id.as_ref()),
        given,
    );
    match wait(rx, &ctx.stop).await {
        Ok(a) => resp.assignment = Bytes::from(a),
        Err(e) => {
            let (c, msg) = group_code(&e);
            ctx.client_error(ApiKey::SyncGroup, c, &msg);
            resp.error_code = c;
        }
    }
    Outcome::reply(ResponseKind::SyncGroup(resp))
}

pub(crate) fn heartbeat(ctx: &Ctx, r: HeartbeatRequest) -> Outcome {
    let mut resp = HeartbeatResponse::default();
    if let Err(e) = ctx.broker.groups().heartbeat(
        r.group_id.0.as_str(),
        r.generation_id,
        r.member_id.as_str(),
        instance_id(r.group_instance_id.as_ref()),
    ) {
        let (c, msg) = group_code(&e);
        if c != code::REBALANCE_IN_PROGRESS {
            ctx.client_error(ApiKey::Heartbeat, c, &msg);
        }
        resp.error_code = c;
    }
    Outcome::reply(ResponseKind::Heartbeat(resp))
}

pub(crate) fn leave(ctx: &Ctx, r: LeaveGroupRequest, version: i16) -> Outcome {
    let mut resp = LeaveGroupResponse::default();
    let group = r.group_id.0.as_str();
    let leave_one = |member: &str, instance: Option<&str>| {
        match ctx.broker.groups().leave(group, member, instance) {
            Ok(()) => code::NONE,
            // As Kafka: a group the coordinator does not know has none of the
            // members (not GROUP_ID_NOT_FOUND).
            Err(GroupError::UnknownGroup { .. }) => {
                let msg = format!("group {group} has no member {member:?}");
                ctx.client_error(ApiKey::LeaveGroup, code::UNKNOWN_MEMBER_ID, &msg);
                code::UNKNOWN_MEMBER_ID
            }
            Err(e) => {
                let (c, msg) = group_code(&e);
                ctx.client_error(ApiKey::LeaveGroup, c, &msg);
                c
            }
        }
    };
    if version >= 3 {
        for m in &r.members {
            let mut mr = MemberResponse::default();
            mr.member_id = m.member_id.clone();
            mr.group_instance_id = m.group_instance_id.clone();
            mr.error_code = leave_one(
                m.member_id.as_str(),
                instance_id(m.group_instance_id.as_ref()),
            );
            resp.members.push(mr);
        }
    } else {
        resp.error_code = leave_one(r.member_id.as_str(), None);
    }
    Outcome::reply(ResponseKind::LeaveGroup(resp))
}

pub(crate) fn list(ctx: &Ctx) -> Outcome {
    let mut resp = ListGroupsResponse::default();
    let coordinator = ctx.broker.groups();
    // As in Kafka, each broker lists the groups it coordinates: a cluster node that
    // does not coordinate lists none.
    for (name, state) in coordinator.list().unwrap_or_default() {
        let mut g = ListedGroup::default();
        g.protocol_type = coordinator
            .describe(&name)
            .map_or_else(|_| sb(""), |d| sb(&d.protocol_type));
        g.group_id = GroupId(sb(&name));
        g.group_state = sb(state.name());
        resp.groups.push(g);
    }
    Outcome::reply(ResponseKind::ListGroups(resp))
}

pub(crate) fn describe(ctx: &Ctx, r: DescribeGroupsRequest) -> Outcome {
    let mut resp = DescribeGroupsResponse::default();
    for group in r.groups {
        let mut g = DescribedGroup::default();
        match ctx.broker.groups().describe(group.0.as_str()) {
            Ok(d) => {
                g.group_state = sb(d.state.name());
                g.protocol_type = sb(&d.protocol_type);
                g.protocol_data = sb(&d.protocol);
                g.members = d
                    .members
                    .iter()
                    .map(|m| {
                        let mut e = DescribedGroupMember::default();
                        e.member_id = sb(&m.member_id);
                        // Only encoded from version 4 on.
                        e.group_instance_id = m.instance_id.as_deref().map(sb);
                        e.client_id = sb(&m.client_id);
                        e.client_host = sb(&m.client_host);
                        e.member_assignment = Bytes::copy_from_slice(&m.assignment);
                        e
                    })
                    .collect();
            }
            // Kafka describes a group it does not know as Dead, without an error.
            Err(GroupError::UnknownGroup { .. }) => g.group_state = sb("Dead"),
            Err(e) => {
                let (c, msg) = group_code(&e);
                ctx.client_error(ApiKey::DescribeGroups, c, &msg);
                g.error_code = c;
            }
        }
        g.group_id = group;
        resp.groups.push(g);
    }
    Outcome::reply(ResponseKind::DescribeGroups(resp))
}

/// Highest version of Kafka's consumer-protocol assignment
/// (`ConsumerProtocolAssignment`) the crate decodes.
const CONSUMER_ASSIGNMENT_VERSION_MAX: i16 = 3;

/// The (topic, partitions) of a Kafka consumer's assignment: the bytes the group's
/// leader hands each member in SyncGroup under protocol type `consumer` (Kafka's
/// `ConsumerProtocolAssignment`: an i16 version, then the assigned partitions and
/// the user data). `None` for bytes that are not one (empty before the first sync,
/// cut short, a negative version or partition). As Kafka's consumers, a version
/// above 3 is read as version 3 (later versions only add fields at the end) and
/// bytes after the known fields are ignored. The decode reads only the given bytes
/// and reserves no more than they can hold (vendor/kafka-protocol, PATCHES.md).
pub fn consumer_assignment_partitions(bytes: &[u8]) -> Option<Vec<(String, Vec<u32>)>> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;

    let version = i16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]);
    if version < 0 {
        return None;
    }
    let mut body = Bytes::copy_from_slice(bytes.get(2..)?);
    let a =
        ConsumerProtocolAssignment::decode(&mut body, version.min(CONSUMER_ASSIGNMENT_VERSION_MAX))
            .ok()?;
    a.assigned_partitions
        .into_iter()
        .map(|tp| {
            let ps = tp
                .partitions
                .into_iter()
                .map(|p| u32::try_from(p).ok())
                .collect::<Option<Vec<u32>>>()?;
            Some((tp.topic.0.to_string(), ps))
        })
        .collect()
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolAssignment, TopicName};
    use kafka_protocol::protocol::Encodable;

    use super::*;

    /// `version` as the i16 prefix, then an assignment of `parts` encoded at
    /// `encoded_as`.
    fn assignment(version: i16, encoded_as: i16, parts: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = bytes::BytesMut::new();
        b.extend_from_slice(&version.to_be_bytes());
        ConsumerProtocolAssignment::default()
            .with_assigned_partitions(
                parts
                    .iter()
                    .map(|(t, ps)| {
                        TopicPartition::default()
                            .with_topic(TopicName(sb(t)))
                            .with_partitions(ps.to_vec())
                    })
                    .collect(),
            )
            .with_user_data(Some(Bytes::from_static(b"user")))
            .encode(&mut b, encoded_as)
            .unwrap();
        b.to_vec()
    }

    #[test]
    fn consumer_assignments_of_every_version_decode() {
        let parts: &[(&str, &[i32])] = &[("t", &[0, 2]), ("u", &[])];
        let want = vec![("t".to_string(), vec![0, 2]), ("u".to_string(), vec![])];
        for v in 0..=CONSUMER_ASSIGNMENT_VERSION_MAX {
            let b = assignment(v, v, parts);
            assert_eq!(
                consumer_assignment_partitions(&b),
                Some(want.clone()),
                "v{v}"
            );
        }
        // A later version is read as the latest known, its added fields ignored.
        let mut b = assignment(7, 3, parts);
        b.extend_from_slice(b"later fields");
        assert_eq!(consumer_assignment_partitions(&b), Some(want));
    }

    #[test]
    fn bytes_that_are_no_consumer_assignment_decode_to_none() {
        let b = assignment(1, 1, &[("t", &[0, 1]), ("topic", &[3])]);
        // Cut short anywhere, the empty bytes of a member before its sync included.
        for n in 0..b.len() {
            assert_eq!(consumer_assignment_partitions(&b[..n]), None, "{n} bytes");
        }
        assert_eq!(
            consumer_assignment_partitions(&assignment(-1, 0, &[])),
            None
        );
        assert_eq!(
            consumer_assignment_partitions(&assignment(0, 0, &[("t", &[-1])])),
            None
        );
        // A count that claims more topics than the bytes hold is refused at once.
        let hostile = [0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 1, b't'];
        assert_eq!(consumer_assignment_partitions(&hostile), None);
    }
}
