//! Metadata, CreateTopics and DeleteTopics.
//!
//! A broker without `--peers` is broker [`NODE_ID`], the leader of every partition.
//! On a cluster node the brokers are the cluster's nodes that have a Kafka listener
//! (node id = broker id), and a replicated partition names its Raft leader, the Raft
//! term as its leader epoch, its placement as replicas and the in-sync replicas as
//! [`crate::engine::replication::PartitionView`] gives them; a partition of a topic
//! that is not replicated is led by the node that holds it.

use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, MetadataRequest, MetadataResponse, ResponseKind, TopicName,
};

use super::server::{broker_id, split_host_port, Ctx, Outcome};
use super::{code, engine_code, sb, NODE_ID};
use std::sync::Arc;

use crate::engine::error::EngineError;
use crate::engine::replication::Replicator;
use crate::format::names::validate_name;
use crate::format::topic::TopicConfig;
use crate::format::wire::ErrorCode;

/// The cluster id given to clients (one broker: fixed).
const CLUSTER_ID: &str = "seglog";

/// A replicated partition's entry; `listed` are the brokers of the response (a
/// leader not among them is not named).
fn replicated_partition(
    r: &dyn Replicator,
    topic: &str,
    p: u32,
    listed: &[i32],
) -> MetadataResponsePartition {
    let mut m = MetadataResponsePartition::default();
    m.partition_index = p as i32;
    let Some(v) = r.partition_view(topic, p) else {
        m.error_code = code::LEADER_NOT_AVAILABLE;
        m.leader_id = BrokerId(-1);
        m.leader_epoch = -1;
        return m;
    };
    let ids = |nodes: &[u64]| nodes.iter().map(|n| BrokerId(broker_id(*n))).collect();
    m.replica_nodes = ids(&v.replicas);
    m.isr_nodes = ids(&v.in_sync);
    m.leader_epoch = i32::try_from(v.term).unwrap_or(i32::MAX);
    match v.leader.map(broker_id).filter(|l| listed.contains(l)) {
        Some(l) => m.leader_id = BrokerId(l),
        None => {
            m.error_code = code::LEADER_NOT_AVAILABLE;
            m.leader_id = BrokerId(-1);
        }
    }
    m
}

fn topic_entry(ctx: &Ctx, name: &str, listed: &[i32]) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(TopicName(sb(name)));
    // As Kafka marks it: clients leave it out of pattern subscriptions.
    t.is_internal = name == crate::engine::groups::OFFSETS_TOPIC;
    let replicated = ctx.replicated(name);
    let me = ctx.node_id();
    match ctx.broker.partition_count(name) {
        Ok(n) => {
            t.partitions = (0..n)
                .map(|p| {
                    if let Some(r) = replicated {
                        return replicated_partition(&**r, name, p, listed);
                    }
                    let mut m = MetadataResponsePartition::default();
                    m.partition_index = p as i32;
                    m.leader_id = BrokerId(me);
                    m.leader_epoch = 0;
                    m.replica_nodes = vec![BrokerId(me)];
                    m.isr_nodes = vec![BrokerId(me)];
                    m
                })
                .collect();
        }
        Err(e) => t.error_code = engine_code(&e),
    }
    t
}

/// The brokers of a cluster node's Metadata: every node with a Kafka listener, this
/// one as it advertises itself.
fn cluster_brokers(ctx: &Ctx, r: &dyn Replicator) -> Vec<MetadataResponseBroker> {
    let me = r.node_id();
    let mut brokers = Vec::new();
    for (id, addr) in r.kafka_nodes() {
        let (host, port) = if id == me {
            (ctx.opts.advertised_host.clone(), ctx.opts.advertised_port)
        } else {
            match split_host_port(&addr) {
                Some(hp) => hp,
                None => continue,
            }
        };
        let mut b = MetadataResponseBroker::default();
        b.node_id = BrokerId(broker_id(id));
        b.host = sb(&host);
        b.port = port;
        brokers.push(b);
    }
    if !brokers.iter().any(|b| b.node_id.0 == broker_id(me)) {
        let mut b = MetadataResponseBroker::default();
        b.node_id = BrokerId(broker_id(me));
        b.host = sb(&ctx.opts.advertised_host);
        b.port = ctx.opts.advertised_port;
        brokers.push(b);
    }
    brokers
}

pub(crate) fn metadata(ctx: &Ctx, r: MetadataRequest, version: i16) -> Outcome {
    let mut resp = MetadataResponse::default();
    match &ctx.opts.replication {
        Some(r) => resp.brokers = cluster_brokers(ctx, &**r),
        None => {
            let mut broker = MetadataResponseBroker::default();
            broker.node_id = BrokerId(NODE_ID);
            broker.host = sb(&ctx.opts.advertised_host);
            broker.port = ctx.opts.advertised_port;
            resp.brokers = vec![broker];
        }
    }
    if version >= 2 {
        resp.cluster_id = Some(sb(CLUSTER_ID));
    }
    // The node answering is alive: it is the controller it names.
    resp.controller_id = BrokerId(ctx.node_id());
    let listed: Vec<i32> = resp.brokers.iter().map(|b| b.node_id.0).collect();
    // v0: an empty list means every topic; v1+: null does.
    let wanted: Option<Vec<String>> = match r.topics {
        None => None,
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(
            t.into_iter()
                .filter_map(|t| t.name.map(|n| n.0.as_str().to_string()))
                .collect(),
        ),
    };
    let names = wanted.unwrap_or_else(|| ctx.broker.list_topics());
    resp.topics = names.iter().map(|n| topic_entry(ctx, n, &listed)).collect();
    Outcome::reply(ResponseKind::Metadata(resp))
}

pub(crate) async fn create_topics(ctx: &Ctx, r: CreateTopicsRequest, version: i16) -> Outcome {
    let mut resp = CreateTopicsResponse::default();
    for t in r.topics {
        let name = t.name.0.as_str().to_string();
        let mut result = CreatableTopicResult::default();
        result.name = t.name.clone();
        let outcome = create_one(ctx, &name, &t, r.validate_only).await;
        match outcome {
            Ok((partitions, factor)) => {
                if version >= 5 {
                    result.num_partitions = partitions as i32;
                    result.replication_factor = factor;
                }
            }
            Err((c, msg)) => {
                ctx.client_error(ApiKey::CreateTopics, c, &msg);
                result.error_code = c;
                result.error_message = Some(sb(&msg));
                if version >= 5 {
                    result.num_partitions = -1;
                    result.replication_factor = -1;
                }
            }
        }
        resp.topics.push(result);
    }
    Outcome::reply(ResponseKind::CreateTopics(resp))
}

/// Partitions of a topic created when the request asks for the default (-1).
const DEFAULT_PARTITIONS: u32 = 1;

/// Creates one topic: (partitions, replication factor).
async fn create_one(
    ctx: &Ctx,
    name: &str,
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    validate_only: bool,
) -> Result<(u32, i16), (i16, String)> {
    validate_name(name).map_err(|e| {
        (
            code::INVALID_TOPIC_EXCEPTION,
            format!("invalid topic name: {e}"),
        )
    })?;
    if !t.assignments.is_empty() {
        return Err((
            code::INVALID_REQUEST,
            "replica assignments are not supported (one broker)".into(),
        ));
    }
    let cluster = ctx.opts.replication.as_ref();
    let replicated = t.replication_factor > 1 && cluster.is_some();
    if t.replication_factor != -1 && t.replication_factor != 1 && !replicated {
        return Err((
            code::INVALID_REPLICATION_FACTOR,
            format!(
                "replication factor {} asked; this broker stores one copy (use 1 or -1)",
                t.replication_factor
            ),
        ));
    }
    let partitions = match t.num_partitions {
        -1 => DEFAULT_PARTITIONS,
        n => u32::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| (code::INVALID_PARTITIONS, format!("{n} partitions asked")))?,
    };
    let mut config = TopicConfig::default();
    for c in &t.configs {
        let Some(value) = &c.value else { continue };
        config
            .set(config_name(c.name.as_str()), value.as_str())
            .map_err(|e| {
                (
                    code::INVALID_CONFIG,
                    format!("invalid topic configuration: {e}"),
                )
            })?;
    }
    if validate_only && ctx.broker.partition_count(name).is_ok() {
        // What the create would answer (Kafka checks it too).
        return Err((
            code::TOPIC_ALREADY_EXISTS,
            format!("topic {name} already exists"),
        ));
    }
    if let (true, Some(r)) = (replicated, cluster) {
        // The same call `topics create --replication-factor` makes: every replica's
        // node creates the topic, then each partition's group elects a leader.
        let factor = t.replication_factor;
        if validate_only {
            return Ok((partitions, factor));
        }
        let settings = t
            .configs
            .iter()
            .filter_map(|c| {
                c.value
                    .as_ref()
                    .map(|v| format!("{}={}", config_name(c.name.as_str()), v.as_str()))
            })
            .collect();
        Arc::clone(r)
            .create_topic(name.to_string(), partitions, settings, factor as u32)
            .await
            .map_err(|(c, msg)| (create_code(c), msg))?;
        return Ok((partitions, factor));
    }
    if validate_only {
        return Ok((partitions, 1));
    }
    ctx.broker
        .create_topic(name, partitions, config)
        .map_err(|e| (engine_code(&e), e.to_string()))?;
    Ok((partitions, 1))
}

/// Kafka's name of a topic setting as seglog's (`retention.ms` is `retention_ms`);
/// seglog's own names and any other name pass unchanged (an unknown one is refused
/// by [`TopicConfig::set`]). `delete.retention.ms` is how long Kafka keeps a
/// tombstone, seglog's `tombstone_retention_ms`; `max.message.bytes`, Kafka's limit
/// on a record batch, is seglog's limit on one record, `max_record_bytes`.
fn config_name(name: &str) -> &str {
    match name {
        "max.message.bytes" => "max_record_bytes",
        "retention.ms" => "retention_ms",
        "retention.bytes" => "retention_bytes",
        "segment.bytes" => "segment_bytes",
        "segment.ms" => "segment_ms",
        "cleanup.policy" => "cleanup_policy",
        "delete.retention.ms" => "tombstone_retention_ms",
        other => other,
    }
}

/// The Kafka error code of a refused replicated create.
fn create_code(c: ErrorCode) -> i16 {
    match c {
        // A factor larger than the cluster, or settings refused.
        ErrorCode::INVALID_CONFIG => code::INVALID_REPLICATION_FACTOR,
        other => super::replicated_code(other),
    }
}

pub(crate) async fn delete_topics(ctx: &Ctx, r: DeleteTopicsRequest, version: i16) -> Outcome {
    let mut resp = DeleteTopicsResponse::default();
    let mut names: Vec<TopicName> = r.topic_names;
    if version >= 6 {
        names.extend(r.topics.into_iter().filter_map(|t| t.name));
    }
    for name in names {
        let mut result = DeletableTopicResult::default();
        let outcome = match validate_name(name.0.as_str()) {
            Err(e) => Err((
                code::INVALID_TOPIC_EXCEPTION,
                format!("invalid topic name: {e}"),
            )),
            // Every node holding a replica deletes it, this one last.
            Ok(()) => match ctx.replicated(name.0.as_str()) {
                Some(r) => Arc::clone(r)
                    .delete_topic(name.0.as_str().to_string())
                    .await
                    .map_err(|(c, msg)| (super::replicated_code(c), msg)),
                None => match (
                    ctx.broker.delete_topic(name.0.as_str()),
                    &ctx.opts.replication,
                ) {
                    // A replicated topic with no replica here: the nodes holding one
                    // delete it.
                    (Err(EngineError::UnknownTopic { .. }), Some(r)) => Arc::clone(r)
                        .delete_topic(name.0.as_str().to_string())
                        .await
                        .map_err(|(c, msg)| (super::replicated_code(c), msg)),
                    (outcome, _) => outcome.map_err(|e| (engine_code(&e), e.to_string())),
                },
            },
        };
        if let Err((c, msg)) = outcome {
            ctx.client_error(ApiKey::DeleteTopics, c, &msg);
            result.error_code = c;
            if version >= 5 {
                result.error_message = Some(sb(&msg));
            }
        }
        result.name = Some(name);
        resp.responses.push(result);
    }
    Outcome::reply(ResponseKind::DeleteTopics(resp))
}
