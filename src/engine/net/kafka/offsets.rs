//! ListOffsets (earliest, latest, by timestamp), OffsetCommit and OffsetFetch (the
//! engine's group coordinator keeps the committed offsets).

use std::time::Duration;

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, ListOffsetsRequest, ListOffsetsResponse, OffsetCommitRequest, OffsetCommitResponse,
    OffsetFetchRequest, OffsetFetchResponse, ResponseKind, TopicName,
};

use super::groups::{group_code, wait};
use super::server::{Ctx, Outcome};
use super::{code, engine_code, sb};
use crate::engine::broker::Broker;
use crate::engine::groups::OffsetCommit;
use crate::format::record::decode_record;

/// Kafka's special ListOffsets timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// Stored bytes read per step of a by-timestamp scan.
const SCAN_STEP_BYTES: u32 = 1 << 20;

/// The first record at or after `timestamp_ms` (offset, its timestamp), scanning the
/// partition from its start; `None` when every record is older.
async fn offset_for_time(
    broker: &Broker,
    topic: &str,
    partition: u32,
    timestamp_ms: i64,
) -> Result<Option<(u64, i64)>, crate::engine::error::EngineError> {
    let (mut at, end) = broker.offsets(topic, partition)?;
    while at < end {
        let f = broker
            .fetch_async(topic, partition, at, SCAN_STEP_BYTES, Duration::ZERO)
            .await?;
        let mut next = at;
        let mut found = None;
        for c in &f.chunks {
            let mut pos = 0usize;
            while let Some(rest) = c.bytes.get(pos..).filter(|r| !r.is_empty()) {
                let Ok(v) = decode_record(rest, pos as u64, c.generation) else {
                    break;
                };
                pos += v.encoded_len;
                if v.offset < at {
                    continue;
                }
                next = v.offset + 1;
                if found.is_none() && v.timestamp_ms >= timestamp_ms {
                    found = Some((v.offset, v.timestamp_ms));
                }
            }
        }
        for c in f.chunks {
            crate::engine::partition::buffers::give(c.bytes);
        }
        if found.is_some() {
            return Ok(found);
        }
        if next <= at {
            break;
        }
        at = next;
    }
    Ok(None)
}

/// The leader epoch answered with an offset: the Raft term of a replicated
/// partition, 0 otherwise (as Metadata says).
fn leader_epoch(ctx: &Ctx, topic: &str, partition: Option<u32>) -> i32 {
    partition
        .and_then(|p| ctx.replicated(topic)?.partition_view(topic, p))
        .map_or(0, |v| i32::try_from(v.term).unwrap_or(i32::MAX))
}

fn partition_index(
    p: &kafka_protocol::messages::list_offsets_request::ListOffsetsPartition,
) -> Option<u32> {
    u32::try_from(p.partition_index).ok()
}

pub(crate) async fn list_offsets(ctx: &Ctx, r: ListOffsetsRequest, version: i16) -> Outcome {
    let mut resp = ListOffsetsResponse::default();
    for t in &r.topics {
        let mut tr = ListOffsetsTopicResponse::default();
        tr.name = t.name.clone();
        let topic = t.name.0.as_str();
        for p in &t.partitions {
            let mut pr = ListOffsetsPartitionResponse::default();
            pr.partition_index = p.partition_index;
            pr.timestamp = -1;
            pr.offset = -1;
            let answer = match u32::try_from(p.partition_index) {
                Err(_) => Err((
                    code::UNKNOWN_TOPIC_OR_PARTITION,
                    "negative partition".into(),
                )),
                Ok(partition) => match ctx.check_leader(topic, partition) {
                    Err(e) => Err(e),
                    Ok(()) => match ctx.settle(topic, partition).await {
                        Err(e) => Err(e),
                        Ok(()) => match p.timestamp {
                            LATEST => ctx
                                .broker
                                .offsets(topic, partition)
                                .map(|(_, end)| Some((end, -1))),
                            EARLIEST => ctx
                                .broker
                                .offsets(topic, partition)
                                .map(|(start, _)| Some((start, -1))),
                            ts => offset_for_time(&ctx.broker, topic, partition, ts).await,
                        }
                        .map_err(|e| (engine_code(&e), e.to_string())),
                    },
                },
            };
            match answer {
                Ok(Some((offset, ts))) => {
                    pr.offset = offset as i64;
                    pr.timestamp = ts;
                    if version >= 4 {
                        pr.leader_epoch = leader_epoch(ctx, topic, partition_index(p));
                    }
                }
                Ok(None) => {}
                Err((c, msg)) => {
                    ctx.client_error(ApiKey::ListOffsets, c, &msg);
                    pr.error_code = c;
                }
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Outcome::reply(ResponseKind::ListOffsets(resp))
}

pub(crate) async fn offset_commit(ctx: &Ctx, r: OffsetCommitRequest) -> Outcome {
    let mut resp = OffsetCommitResponse::default();
    let group = r.group_id.0.as_str();
    let coordinator = ctx.broker.groups();
    for t in &r.topics {
        let mut tr = OffsetCommitResponseTopic::default();
        tr.name = t.name.clone();
        let entries: Result<Vec<OffsetCommit>, (i16, String)> = t
            .partitions
            .iter()
            .map(|p| {
                let partition = u32::try_from(p.partition_index).map_err(|_| {
                    (
                        code::UNKNOWN_TOPIC_OR_PARTITION,
                        "negative partition".to_string(),
                    )
                })?;
                let offset = u64::try_from(p.committed_offset).map_err(|_| {
                    (
                        code::INVALID_REQUEST,
                        format!("offset {}", p.committed_offset),
                    )
                })?;
                Ok(OffsetCommit {
                    partition,
                    offset,
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map_or_else(String::new, |m| m.as_str().to_string()),
                })
            })
            .collect();
        let result = match entries {
            Ok(entries) => {
                match coordinator.commit(
                    ctx.broker.as_ref(),
                    group,
                    r.generation_id_or_member_epoch,
                    r.member_id.as_str(),
                    super::groups::instance_id(r.group_instance_id.as_ref()),
                    t.name.0.as_str(),
                    &entries,
                ) {
                    Ok(rx) => wait(rx, &ctx.stop).await.map_err(|e| group_code(&e)),
                    Err(e) => Err(group_code(&e)),
                }
            }
            Err(e) => Err(e),
        };
        let c = match result {
            Ok(()) => code::NONE,
            Err((c, msg)) => {
                ctx.client_error(ApiKey::OffsetCommit, c, &msg);
                c
            }
        };
        for p in &t.partitions {
            let mut pr = OffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            pr.error_code = c;
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Outcome::reply(ResponseKind::OffsetCommit(resp))
}

pub(crate) fn offset_fetch(ctx: &Ctx, r: OffsetFetchRequest, version: i16) -> Outcome {
    let mut resp = OffsetFetchResponse::default();
    let group = r.group_id.0.as_str();
    let committed = match ctx.broker.groups().fetch_offsets(group, None, None) {
        Ok(c) => c,
        Err(e) => {
            let (c, msg) = group_code(&e);
            ctx.client_error(ApiKey::OffsetFetch, c, &msg);
            if version >= 2 {
                resp.error_code = c;
            }
            Vec::new()
        }
    };
    let lookup = |topic: &str, partition: i32| {
        committed
            .iter()
            .find(|o| o.topic == topic && i64::from(o.partition) == i64::from(partition))
    };
    let entry = |topic: &str, partition: i32| {
        let mut pr = OffsetFetchResponsePartition::default();
        pr.partition_index = partition;
        pr.committed_offset = -1;
        pr.committed_leader_epoch = -1;
        pr.metadata = Some(sb(""));
        if let Some(o) = lookup(topic, partition) {
            pr.committed_offset = o.offset as i64;
            pr.metadata = Some(sb(&o.metadata));
        }
        pr
    };
    match &r.topics {
        Some(topics) => {
            for t in topics {
                let mut tr = OffsetFetchResponseTopic::default();
                tr.name = t.name.clone();
                tr.partitions = t
                    .partition_indexes
                    .iter()
                    .map(|p| entry(t.name.0.as_str(), *p))
                    .collect();
                resp.topics.push(tr);
            }
        }
        None => {
            let mut names: Vec<&str> = committed.iter().map(|o| o.topic.as_str()).collect();
            names.dedup();
            for name in names {
                let mut tr = OffsetFetchResponseTopic::default();
                tr.name = TopicName(sb(name));
                tr.partitions = committed
                    .iter()
                    .filter(|o| o.topic == name)
                    .map(|o| entry(name, o.partition as i32))
                    .collect();
                resp.topics.push(tr);
            }
        }
    }
    Outcome::reply(ResponseKind::OffsetFetch(resp))
}
