//! Metadata (one broker, every partition led by it), CreateTopics and DeleteTopics.

use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, MetadataRequest, MetadataResponse, ResponseKind, TopicName,
};

use super::server::{Ctx, Outcome};
use super::{code, engine_code, sb, NODE_ID};
use crate::format::names::validate_name;
use crate::format::topic::TopicConfig;

/// The cluster id given to clients (one broker: fixed).
const CLUSTER_ID: &str = "seglog";

fn topic_entry(ctx: &Ctx, name: &str) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(TopicName(sb(name)));
    match ctx.broker.partition_count(name) {
        Ok(n) => {
            t.partitions = (0..n)
                .map(|p| {
                    let mut m = MetadataResponsePartition::default();
                    m.partition_index = p as i32;
                    m.leader_id = BrokerId(NODE_ID);
                    m.leader_epoch = 0;
                    m.replica_nodes = vec![BrokerId(NODE_ID)];
                    m.isr_nodes = vec![BrokerId(NODE_ID)];
                    m
                })
                .collect();
        }
        Err(e) => t.error_code = engine_code(&e),
    }
    t
}

pub(crate) fn metadata(ctx: &Ctx, r: MetadataRequest, version: i16) -> Outcome {
    let mut resp = MetadataResponse::default();
    let mut broker = MetadataResponseBroker::default();
    broker.node_id = BrokerId(NODE_ID);
    broker.host = sb(&ctx.opts.advertised_host);
    broker.port = ctx.opts.advertised_port;
    resp.brokers = vec![broker];
    if version >= 2 {
        resp.cluster_id = Some(sb(CLUSTER_ID));
    }
    resp.controller_id = BrokerId(NODE_ID);
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
    resp.topics = names.iter().map(|n| topic_entry(ctx, n)).collect();
    Outcome::reply(ResponseKind::Metadata(resp))
}

pub(crate) fn create_topics(ctx: &Ctx, r: CreateTopicsRequest, version: i16) -> Outcome {
    let mut resp = CreateTopicsResponse::default();
    for t in r.topics {
        let name = t.name.0.as_str().to_string();
        let mut result = CreatableTopicResult::default();
        result.name = t.name.clone();
        let outcome = create_one(ctx, &name, &t, r.validate_only);
        match outcome {
            Ok(partitions) => {
                if version >= 5 {
                    result.num_partitions = partitions as i32;
                    result.replication_factor = 1;
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

fn create_one(
    ctx: &Ctx,
    name: &str,
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    validate_only: bool,
) -> Result<u32, (i16, String)> {
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
    if t.replication_factor != -1 && t.replication_factor != 1 {
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
        config.set(c.name.as_str(), value.as_str()).map_err(|e| {
            (
                code::INVALID_CONFIG,
                format!("invalid topic configuration: {e}"),
            )
        })?;
    }
    if validate_only {
        return Ok(partitions);
    }
    ctx.broker
        .create_topic(name, partitions, config)
        .map_err(|e| (engine_code(&e), e.to_string()))?;
    Ok(partitions)
}

pub(crate) fn delete_topics(ctx: &Ctx, r: DeleteTopicsRequest, version: i16) -> Outcome {
    let mut resp = DeleteTopicsResponse::default();
    let mut names: Vec<TopicName> = r.topic_names;
    if version >= 6 {
        names.extend(r.topics.into_iter().filter_map(|t| t.name));
    }
    for name in names {
        let mut result = DeletableTopicResult::default();
        let outcome = validate_name(name.0.as_str())
            .map_err(|e| {
                (
                    code::INVALID_TOPIC_EXCEPTION,
                    format!("invalid topic name: {e}"),
                )
            })
            .and_then(|()| {
                ctx.broker
                    .delete_topic(name.0.as_str())
                    .map_err(|e| (engine_code(&e), e.to_string()))
            });
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
