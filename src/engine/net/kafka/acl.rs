//! The per-request permission check of the Kafka listener: the same roles and
//! patterns as the native listener ([`Principal::allows`], docs/PROTOCOL.md
//! "Authentication"), mapped onto Kafka's APIs:
//!
//! | API | needs |
//! |---|---|
//! | Produce | Produce on each topic |
//! | InitProducerId | Produce on the cluster (producer and admin keys) |
//! | Metadata, ListOffsets | Describe on each topic (a topic list holds only those) |
//! | Fetch | Consume on each topic |
//! | FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups | Group on the group |
//! | OffsetCommit, OffsetFetch | Group on the group and on each topic |
//! | ListGroups | lists only the groups the key may use |
//! | CreateTopics, DeleteTopics | Admin |
//!
//! A refused topic is answered TOPIC_AUTHORIZATION_FAILED per partition, a refused
//! group GROUP_AUTHORIZATION_FAILED, InitProducerId CLUSTER_AUTHORIZATION_FAILED, as
//! Kafka does; the refused parts are taken out of the request before it reaches the
//! broker, so nothing of them is written.

use kafka_protocol::messages::{
    ApiKey, BrokerId, FindCoordinatorResponse, GroupId, HeartbeatResponse, InitProducerIdResponse,
    JoinGroupResponse, LeaveGroupResponse, ProducerId, RequestKind, ResponseKind,
    SyncGroupResponse, TopicName,
};

use super::sasl::SaslState;
use super::server::{Ctx, Outcome};
use super::{code, sb};
use crate::engine::keys::{Action, Principal, Resource};

/// What the check made of a request.
pub(crate) enum Checked {
    /// Serve this (what is left of the request), then [`merge`] `After`.
    Go(Box<RequestKind>, After),
    /// Answer this instead.
    Answer(Outcome),
}

/// Topic-partitions taken out of a request.
type Parts = Vec<(TopicName, Vec<i32>)>;

/// What to add to or filter from the response of a checked request.
#[derive(Default)]
pub(crate) enum After {
    #[default]
    Nothing,
    Produce(Parts),
    Fetch(Parts),
    ListOffsets(Parts),
    /// Refused topics named; `true`: the request listed every topic.
    Metadata(Vec<TopicName>, bool),
    CreateTopics(Vec<TopicName>),
    DeleteTopics(Vec<TopicName>),
    /// Refused parts and their error code.
    OffsetCommit(Parts, i16),
    /// Refused parts; `true`: every topic was asked.
    OffsetFetch(Parts, bool),
    DescribeGroups(Vec<GroupId>),
    ListGroups,
}

fn allows(p: Option<&Principal>, action: Action, r: Resource<'_>) -> bool {
    p.is_none_or(|p| p.allows(action, r))
}

/// Takes out of `req` what the connection's key may not do.
pub(crate) fn check(ctx: &Ctx, state: &mut SaslState, api: ApiKey, req: RequestKind) -> Checked {
    let keys = ctx.broker.keys();
    if !keys.required() {
        return Checked::Go(Box::new(req), After::Nothing);
    }
    if !state.authenticated {
        return Checked::Answer(Outcome::Close(format!(
            "{api:?} before a SASL login: the broker requires an API key \
             (security.protocol=sasl_ssl, sasl.mechanisms=PLAIN, sasl.password=TOKEN)"
        )));
    }
    if keys.generation() != state.generation {
        state.generation = keys.generation();
        if let Some(p) = state.principal.take() {
            match keys.current(&p) {
                Some(now) => state.principal = Some(now),
                None => {
                    return Checked::Answer(Outcome::Close(format!(
                        "API key {} of this connection was revoked",
                        p.key_id()
                    )))
                }
            }
        }
    }
    let p = state.principal.as_ref();
    // Logs a refusal with the code the client is answered.
    let refuse = |c: i16, what: &str| {
        let msg = match p {
            Some(p) => format!(
                "API key {} ({} {:?}) may not {api:?}{what}",
                p.key_id(),
                p.role().as_str(),
                p.name()
            ),
            None => format!("{api:?}{what} refused"),
        };
        ctx.client_error(api, c, &msg);
    };
    let topic_ok = |a: Action, t: &TopicName| {
        let ok = allows(p, a, Resource::Topic(t.0.as_str()));
        if !ok {
            refuse(
                code::TOPIC_AUTHORIZATION_FAILED,
                &format!(" on topic {:?}", t.0.as_str()),
            );
        }
        ok
    };
    let group_ok = |g: &GroupId| {
        let ok = allows(p, Action::Group, Resource::Group(g.0.as_str()));
        if !ok {
            refuse(
                code::GROUP_AUTHORIZATION_FAILED,
                &format!(" on group {:?}", g.0.as_str()),
            );
        }
        ok
    };
    // CreateTopics and DeleteTopics: each topic is answered TOPIC_AUTHORIZATION_FAILED.
    let admin = || {
        let ok = allows(p, Action::Admin, Resource::Cluster);
        if !ok {
            refuse(code::TOPIC_AUTHORIZATION_FAILED, "");
        }
        ok
    };
    let reply = |r: ResponseKind| Checked::Answer(Outcome::reply(r));
    match req {
        RequestKind::Produce(mut r) => {
            let mut refused = Parts::new();
            r.topic_data.retain(|t| {
                let ok = topic_ok(Action::Produce, &t.name);
                if !ok {
                    let parts = t.partition_data.iter().map(|d| d.index).collect();
                    refused.push((t.name.clone(), parts));
                }
                ok
            });
            Checked::Go(Box::new(RequestKind::Produce(r)), After::Produce(refused))
        }
        RequestKind::Fetch(mut r) => {
            let mut refused = Parts::new();
            r.topics.retain(|t| {
                let ok = topic_ok(Action::Consume, &t.topic);
                if !ok {
                    let parts = t.partitions.iter().map(|d| d.partition).collect();
                    refused.push((t.topic.clone(), parts));
                }
                ok
            });
            Checked::Go(Box::new(RequestKind::Fetch(r)), After::Fetch(refused))
        }
        RequestKind::ListOffsets(mut r) => {
            let mut refused = Parts::new();
            r.topics.retain(|t| {
                let ok = topic_ok(Action::Describe, &t.name);
                if !ok {
                    let parts = t.partitions.iter().map(|d| d.partition_index).collect();
                    refused.push((t.name.clone(), parts));
                }
                ok
            });
            Checked::Go(
                Box::new(RequestKind::ListOffsets(r)),
                After::ListOffsets(refused),
            )
        }
        RequestKind::Metadata(mut r) => {
            let mut refused = Vec::new();
            let all = r.topics.is_none();
            if let Some(topics) = &mut r.topics {
                topics.retain(|t| match &t.name {
                    Some(n) if !allows(p, Action::Describe, Resource::Topic(n.0.as_str())) => {
                        refused.push(n.clone());
                        false
                    }
                    _ => true,
                });
            }
            if !allows(p, Action::Admin, Resource::Cluster) {
                r.allow_auto_topic_creation = false;
            }
            Checked::Go(
                Box::new(RequestKind::Metadata(r)),
                After::Metadata(refused, all),
            )
        }
        RequestKind::CreateTopics(mut r) => {
            if admin() {
                return Checked::Go(Box::new(RequestKind::CreateTopics(r)), After::Nothing);
            }
            let names = r.topics.drain(..).map(|t| t.name).collect();
            Checked::Go(
                Box::new(RequestKind::CreateTopics(r)),
                After::CreateTopics(names),
            )
        }
        RequestKind::DeleteTopics(mut r) => {
            if admin() {
                return Checked::Go(Box::new(RequestKind::DeleteTopics(r)), After::Nothing);
            }
            let mut names: Vec<TopicName> = r.topic_names.drain(..).collect();
            names.extend(r.topics.drain(..).filter_map(|t| t.name));
            Checked::Go(
                Box::new(RequestKind::DeleteTopics(r)),
                After::DeleteTopics(names),
            )
        }
        RequestKind::InitProducerId(r) => {
            if allows(p, Action::Produce, Resource::Cluster) {
                return Checked::Go(Box::new(RequestKind::InitProducerId(r)), After::Nothing);
            }
            refuse(code::CLUSTER_AUTHORIZATION_FAILED, "");
            let mut resp = InitProducerIdResponse::default();
            resp.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
            resp.producer_id = ProducerId(-1);
            resp.producer_epoch = -1;
            reply(ResponseKind::InitProducerId(resp))
        }
        RequestKind::FindCoordinator(r) => {
            // key_type 0: a group; a transaction coordinator is refused by the handler.
            if r.key_type != 0 || group_ok(&GroupId(r.key.clone())) {
                return Checked::Go(Box::new(RequestKind::FindCoordinator(r)), After::Nothing);
            }
            let mut resp = FindCoordinatorResponse::default();
            resp.error_code = code::GROUP_AUTHORIZATION_FAILED;
            resp.error_message = Some(sb("not authorized for this group"));
            resp.node_id = BrokerId(-1);
            resp.port = -1;
            reply(ResponseKind::FindCoordinator(resp))
        }
        RequestKind::JoinGroup(r) => {
            if group_ok(&r.group_id) {
                return Checked::Go(Box::new(RequestKind::JoinGroup(r)), After::Nothing);
            }
            let mut resp = JoinGroupResponse::default();
            resp.error_code = code::GROUP_AUTHORIZATION_FAILED;
            resp.generation_id = -1;
            reply(ResponseKind::JoinGroup(resp))
        }
        RequestKind::SyncGroup(r) => {
            if group_ok(&r.group_id) {
                return Checked::Go(Box::new(RequestKind::SyncGroup(r)), After::Nothing);
            }
            let mut resp = SyncGroupResponse::default();
            resp.error_code = code::GROUP_AUTHORIZATION_FAILED;
            reply(ResponseKind::SyncGroup(resp))
        }
        RequestKind::Heartbeat(r) => {
            if group_ok(&r.group_id) {
                return Checked::Go(Box::new(RequestKind::Heartbeat(r)), After::Nothing);
            }
            let mut resp = HeartbeatResponse::default();
            resp.error_code = code::GROUP_AUTHORIZATION_FAILED;
            reply(ResponseKind::Heartbeat(resp))
        }
        RequestKind::LeaveGroup(r) => {
            if group_ok(&r.group_id) {
                return Checked::Go(Box::new(RequestKind::LeaveGroup(r)), After::Nothing);
            }
            let mut resp = LeaveGroupResponse::default();
            resp.error_code = code::GROUP_AUTHORIZATION_FAILED;
            reply(ResponseKind::LeaveGroup(resp))
        }
        RequestKind::DescribeGroups(mut r) => {
            let mut refused = Vec::new();
            r.groups.retain(|g| {
                let ok = group_ok(g);
                if !ok {
                    refused.push(g.clone());
                }
                ok
            });
            Checked::Go(
                Box::new(RequestKind::DescribeGroups(r)),
                After::DescribeGroups(refused),
            )
        }
        RequestKind::ListGroups(r) => {
            Checked::Go(Box::new(RequestKind::ListGroups(r)), After::ListGroups)
        }
        RequestKind::OffsetCommit(mut r) => {
            let mut refused = Parts::new();
            let group = group_ok(&r.group_id);
            r.topics.retain(|t| {
                let ok = group && topic_ok(Action::Group, &t.name);
                if !ok {
                    let parts = t.partitions.iter().map(|d| d.partition_index).collect();
                    refused.push((t.name.clone(), parts));
                }
                ok
            });
            let err = if group {
                code::TOPIC_AUTHORIZATION_FAILED
            } else {
                code::GROUP_AUTHORIZATION_FAILED
            };
            Checked::Go(
                Box::new(RequestKind::OffsetCommit(r)),
                After::OffsetCommit(refused, err),
            )
        }
        RequestKind::OffsetFetch(mut r) => {
            if !group_ok(&r.group_id) {
                let mut resp = kafka_protocol::messages::OffsetFetchResponse::default();
                resp.error_code = code::GROUP_AUTHORIZATION_FAILED;
                for t in r.topics.iter().flatten() {
                    let mut tr = kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseTopic::default();
                    tr.name = t.name.clone();
                    tr.partitions = t
                        .partition_indexes
                        .iter()
                        .map(|i| {
                            let mut pr = kafka_protocol::messages::offset_fetch_response::OffsetFetchResponsePartition::default();
                            pr.partition_index = *i;
                            pr.committed_offset = -1;
                            pr.error_code = code::GROUP_AUTHORIZATION_FAILED;
                            pr
                        })
                        .collect();
                    resp.topics.push(tr);
                }
                return reply(ResponseKind::OffsetFetch(resp));
            }
            let mut refused = Parts::new();
            let all = r.topics.is_none();
            if let Some(topics) = &mut r.topics {
                topics.retain(|t| {
                    let ok = topic_ok(Action::Group, &t.name);
                    if !ok {
                        refused.push((t.name.clone(), t.partition_indexes.clone()));
                    }
                    ok
                });
            }
            Checked::Go(
                Box::new(RequestKind::OffsetFetch(r)),
                After::OffsetFetch(refused, all),
            )
        }
        other => Checked::Go(Box::new(other), After::Nothing),
    }
}

/// Adds the refused parts to `body`, and drops from a full listing what the key may
/// not see.
pub(crate) fn merge(state: &SaslState, after: After, body: &mut ResponseKind) {
    use kafka_protocol::messages::*;
    let p = state.principal.as_ref();
    const TOPIC: i16 = code::TOPIC_AUTHORIZATION_FAILED;
    match (after, body) {
        (After::Nothing, _) => {}
        (After::Produce(parts), ResponseKind::Produce(resp)) => {
            for (name, idx) in parts {
                let mut tr = produce_response::TopicProduceResponse::default();
                tr.name = name;
                tr.partition_responses = idx
                    .into_iter()
                    .map(|i| {
                        let mut pr = produce_response::PartitionProduceResponse::default();
                        pr.index = i;
                        pr.error_code = TOPIC;
                        pr.base_offset = -1;
                        pr.log_append_time_ms = -1;
                        pr.log_start_offset = -1;
                        pr.error_message = Some(sb("not authorized to produce to this topic"));
                        pr
                    })
                    .collect();
                resp.responses.push(tr);
            }
        }
        (After::Fetch(parts), ResponseKind::Fetch(resp)) => {
            for (name, idx) in parts {
                let mut tr = fetch_response::FetchableTopicResponse::default();
                tr.topic = name;
                tr.partitions = idx
                    .into_iter()
                    .map(|i| {
                        let mut pr = fetch_response::PartitionData::default();
                        pr.partition_index = i;
                        pr.error_code = TOPIC;
                        pr.high_watermark = -1;
                        pr.last_stable_offset = -1;
                        pr.log_start_offset = -1;
                        pr
                    })
                    .collect();
                resp.responses.push(tr);
            }
        }
        (After::ListOffsets(parts), ResponseKind::ListOffsets(resp)) => {
            for (name, idx) in parts {
                let mut tr = list_offsets_response::ListOffsetsTopicResponse::default();
                tr.name = name;
                tr.partitions = idx
                    .into_iter()
                    .map(|i| {
                        let mut pr = list_offsets_response::ListOffsetsPartitionResponse::default();
                        pr.partition_index = i;
                        pr.error_code = TOPIC;
                        pr.offset = -1;
                        pr.timestamp = -1;
                        pr
                    })
                    .collect();
                resp.topics.push(tr);
            }
        }
        (After::Metadata(refused, all), ResponseKind::Metadata(resp)) => {
            if all {
                resp.topics.retain(|t| {
                    t.name
                        .as_ref()
                        .is_some_and(|n| allows(p, Action::Describe, Resource::Topic(n.0.as_str())))
                });
            }
            for name in refused {
                let mut tr = metadata_response::MetadataResponseTopic::default();
                tr.error_code = TOPIC;
                tr.name = Some(name);
                resp.topics.push(tr);
            }
        }
        (After::CreateTopics(names), ResponseKind::CreateTopics(resp)) => {
            for name in names {
                let mut tr = create_topics_response::CreatableTopicResult::default();
                tr.name = name;
                tr.error_code = TOPIC;
                tr.error_message = Some(sb("creating topics needs an admin key"));
                tr.num_partitions = -1;
                tr.replication_factor = -1;
                resp.topics.push(tr);
            }
        }
        (After::DeleteTopics(names), ResponseKind::DeleteTopics(resp)) => {
            for name in names {
                let mut tr = delete_topics_response::DeletableTopicResult::default();
                tr.name = Some(name);
                tr.error_code = TOPIC;
                tr.error_message = Some(sb("deleting topics needs an admin key"));
                resp.responses.push(tr);
            }
        }
        (After::OffsetCommit(parts, err), ResponseKind::OffsetCommit(resp)) => {
            for (name, idx) in parts {
                let mut tr = offset_commit_response::OffsetCommitResponseTopic::default();
                tr.name = name;
                tr.partitions = idx
                    .into_iter()
                    .map(|i| {
                        let mut pr =
                            offset_commit_response::OffsetCommitResponsePartition::default();
                        pr.partition_index = i;
                        pr.error_code = err;
                        pr
                    })
                    .collect();
                resp.topics.push(tr);
            }
        }
        (After::OffsetFetch(parts, all), ResponseKind::OffsetFetch(resp)) => {
            if all {
                resp.topics
                    .retain(|t| allows(p, Action::Group, Resource::Topic(t.name.0.as_str())));
            }
            for (name, idx) in parts {
                let mut tr = offset_fetch_response::OffsetFetchResponseTopic::default();
                tr.name = name;
                tr.partitions = idx
                    .into_iter()
                    .map(|i| {
                        let mut pr = offset_fetch_response::OffsetFetchResponsePartition::default();
                        pr.partition_index = i;
                        pr.committed_offset = -1;
                        pr.error_code = TOPIC;
                        pr
                    })
                    .collect();
                resp.topics.push(tr);
            }
        }
        (After::DescribeGroups(groups), ResponseKind::DescribeGroups(resp)) => {
            for g in groups {
                let mut gr = describe_groups_response::DescribedGroup::default();
                gr.group_id = g;
                gr.error_code = code::GROUP_AUTHORIZATION_FAILED;
                gr.error_message = Some(sb("not authorized for this group"));
                resp.groups.push(gr);
            }
        }
        (After::ListGroups, ResponseKind::ListGroups(resp)) => {
            resp.groups
                .retain(|g| allows(p, Action::Group, Resource::Group(g.group_id.0.as_str())));
        }
        _ => {}
    }
}
