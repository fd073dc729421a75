//! Fetch: durable records re-framed as Kafka RecordBatch v2 (CRC-32C, by the crate's
//! encoder), one batch per partition answered. Offsets, keys, values and timestamps
//! are the stored ones; a compacted partition's gaps show as offset deltas. A keyed
//! record with an empty value (a seglog tombstone) is given back with a null value.
//!
//! Long poll: a request with less than `min_bytes` ready waits up to `max_wait_ms`
//! for any of its partitions to grow, in slices so a stopping server is not held up.
//!
//! A replicated partition is read on its leader only (elsewhere: NOT_LEADER_OR_FOLLOWER),
//! and its data partition holds only committed, applied records.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ResponseKind};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tokio::task::JoinSet;

use super::server::{Ctx, Outcome};
use super::{code, engine_code};
use crate::engine::broker::Broker;
use crate::format::record::decode_record;

/// Longest wait inside one slice of a long poll.
const FETCH_SLICE: Duration = Duration::from_millis(200);
/// Largest response the listener builds (the request's `max_bytes` is capped here).
const RESPONSE_BYTES_MAX: u32 = 32 << 20;

/// One partition's answer: (error code, start offset, durable end, records, bytes).
struct Part {
    code: i16,
    start: i64,
    end: i64,
    records: Option<Bytes>,
}

/// Reads durable records of one partition from `offset`, at most about `max_bytes`
/// stored bytes (always at least one record when there is one), and frames them.
async fn read_partition(
    broker: &Broker,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: u32,
) -> Part {
    let fail = |c: i16| Part {
        code: c,
        start: -1,
        end: -1,
        records: None,
    };
    let (Ok(p), Ok(off)) = (u32::try_from(partition), u64::try_from(offset)) else {
        return fail(code::OFFSET_OUT_OF_RANGE);
    };
    let r = match broker
        .fetch_async(topic, p, off, max_bytes.max(1), Duration::ZERO)
        .await
    {
        Ok(r) => r,
        Err(e) => return fail(engine_code(&e)),
    };
    let mut records = Vec::new();
    for c in &r.chunks {
        let mut at = 0usize;
        while let Some(rest) = c.bytes.get(at..) {
            if rest.is_empty() {
                break;
            }
            let Ok(v) = decode_record(rest, at as u64, c.generation) else {
                break;
            };
            at += v.encoded_len;
            if v.offset < off {
                continue;
            }
            let key = v.key.map(Bytes::copy_from_slice);
            let value = if v.is_tombstone() {
                None
            } else {
                Some(Bytes::copy_from_slice(v.value))
            };
            records.push(Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: v.offset as i64,
                // Constant offset minus sequence keeps every record in one batch.
                sequence: v.offset as i32,
                timestamp: v.timestamp_ms,
                key,
                value,
                headers: Default::default(),
            });
        }
    }
    for c in r.chunks {
        crate::engine::partition::buffers::give(c.bytes);
    }
    let mut framed = BytesMut::new();
    if !records.is_empty() {
        let opts = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        if let Err(e) = RecordBatchEncoder::encode(&mut framed, records.iter(), &opts) {
            tracing::error!(topic, partition, error = %e, "kafka: cannot frame fetched records");
            return fail(code::UNKNOWN_SERVER_ERROR);
        }
    }
    Part {
        code: code::NONE,
        start: r.start_offset as i64,
        end: r.end_offset as i64,
        records: Some(framed.freeze()),
    }
}

pub(crate) async fn fetch(ctx: &Ctx, r: FetchRequest, version: i16) -> Outcome {
    let deadline =
        Instant::now() + Duration::from_millis(u64::try_from(r.max_wait_ms).unwrap_or(0));
    let min_bytes = usize::try_from(r.min_bytes).unwrap_or(0);
    let total_max = u32::try_from(r.max_bytes)
        .unwrap_or(0)
        .min(RESPONSE_BYTES_MAX);
    loop {
        let mut parts: Vec<Vec<Part>> = Vec::with_capacity(r.topics.len());
        let mut bytes = 0usize;
        let mut left = if version >= 3 {
            total_max
        } else {
            RESPONSE_BYTES_MAX
        };
        for t in &r.topics {
            let mut ps = Vec::with_capacity(t.partitions.len());
            for p in &t.partitions {
                let topic = t.topic.0.as_str();
                let led = match u32::try_from(p.partition) {
                    Ok(i) => match ctx.check_leader(topic, i) {
                        Ok(()) => ctx.settle(topic, i).await,
                        Err(e) => Err(e),
                    },
                    Err(_) => Ok(()),
                };
                if let Err((c, _)) = led {
                    ps.push(Part {
                        code: c,
                        start: -1,
                        end: -1,
                        records: None,
                    });
                    continue;
                }
                let max = u32::try_from(p.partition_max_bytes).unwrap_or(0).min(left);
                let part = read_partition(
                    &ctx.broker,
                    t.topic.0.as_str(),
                    p.partition,
                    p.fetch_offset,
                    max,
                )
                .await;
                let n = part.records.as_ref().map_or(0, Bytes::len);
                bytes += n;
                left = left.saturating_sub(u32::try_from(n).unwrap_or(u32::MAX));
                ps.push(part);
            }
            parts.push(ps);
        }
        let now = Instant::now();
        if bytes >= min_bytes.max(1) || now >= deadline || ctx.stopping() {
            return Outcome::reply(ResponseKind::Fetch(response(&r, parts)));
        }
        wait_for_any(&ctx.broker, &r, (deadline - now).min(FETCH_SLICE)).await;
    }
}

/// Waits until one of the request's partitions has durable records past its fetch
/// offset, or `slice` passes.
async fn wait_for_any(broker: &std::sync::Arc<Broker>, r: &FetchRequest, slice: Duration) {
    let mut set = JoinSet::new();
    for t in &r.topics {
        for p in &t.partitions {
            let (Ok(partition), Ok(offset)) =
                (u32::try_from(p.partition), u64::try_from(p.fetch_offset))
            else {
                continue;
            };
            let b = std::sync::Arc::clone(broker);
            let topic = t.topic.0.as_str().to_string();
            set.spawn(async move {
                if let Ok(f) = b.fetch_async(&topic, partition, offset, 1, slice).await {
                    for c in f.chunks {
                        crate::engine::partition::buffers::give(c.bytes);
                    }
                }
            });
        }
    }
    if set.is_empty() {
        tokio::time::sleep(slice).await;
        return;
    }
    let _ = tokio::time::timeout(slice + Duration::from_millis(10), set.join_next()).await;
    set.abort_all();
}

fn response(r: &FetchRequest, parts: Vec<Vec<Part>>) -> FetchResponse {
    let mut resp = FetchResponse::default();
    for (t, ps) in r.topics.iter().zip(parts) {
        let mut tr = FetchableTopicResponse::default();
        tr.topic = t.topic.clone();
        tr.topic_id = t.topic_id;
        for (p, part) in t.partitions.iter().zip(ps) {
            let mut pd = PartitionData::default();
            pd.partition_index = p.partition;
            pd.error_code = part.code;
            pd.high_watermark = part.end;
            pd.last_stable_offset = part.end;
            pd.log_start_offset = part.start;
            pd.records = part.records.or_else(|| Some(Bytes::new()));
            tr.partitions.push(pd);
        }
        resp.responses.push(tr);
    }
    resp
}
