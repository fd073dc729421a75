//! Produce and InitProducerId. Each Kafka record batch (decompressed within
//! [`KAFKA_BATCH_INFLATED_BYTES_MAX`], see `inflate`)
//! becomes one engine append; a batch with a producer id goes through the engine's
//! idempotent-producer table. With acks 1 or -1 the response waits, without holding
//! the event loop, until the records (and a producer's journal entry) are durable:
//! every acknowledged record is on disk. With acks 0 nothing is answered.
//!
//! A replicated partition (on a cluster node, of a topic replicated on several
//! nodes) takes the native produce's path instead: each Kafka batch is one Raft entry
//! ([`crate::engine::replication::Replicator::produce`]), proposed on the leader
//! only (elsewhere: NOT_LEADER_OR_FOLLOWER, so the client refreshes its metadata and
//! moves) and answered once committed and applied, whatever `acks` asked. A batch's
//! producer id, epoch and sequence travel in the entry and are checked at apply on
//! every replica, so a retry on a new leader is recognised as a duplicate. Plain
//! batches are queued to the partition's group as the request is read, in request
//! order ([`crate::engine::replication::Replicator::submit`]), so a connection that
//! pipelines has its answers deferred like a local produce's; an idempotent
//! producer's batches are proposed one after the other.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse,
    ProducerId, ResponseKind,
};
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder};

use super::inflate::{Inflater, KAFKA_BATCH_INFLATED_BYTES_MAX};
use super::server::{Ctx, Outcome};
use super::{code, engine_code, sb};
use crate::engine::broker::{AppendError, Broker, NewRecord};
use crate::engine::producers::{Decision, ProducerError};
use crate::engine::replication::types::{ProduceEntry, ProducerStamp};
use crate::engine::replication::Replicator;
use crate::format::names::validate_name;
use crate::format::wire::{
    PartitionBatch, WireRecord, PROTOCOL_VERSION, RECORDS_PER_PARTITION_MAX, RECORD_FIELD_BYTES_MAX,
};

/// The fewest bytes one record takes in an uncompressed batch (length, attributes,
/// timestamp delta, offset delta, key length, value length, header count).
const RECORD_BYTES_MIN: usize = 7;
/// Most records a compressed batch may claim (its records are decoded only then).
const COMPRESSED_BATCH_RECORDS_MAX: i32 = 1 << 17;

/// A partition's outcome: (base offset, error code, message).
type Answer = Result<u64, (i16, String)>;
type Wait = Pin<Box<dyn Future<Output = Result<(), (i16, String)>> + Send>>;
/// A replicated partition's batches: their answer once applied.
type Proposal = Pin<Box<dyn Future<Output = Answer> + Send + 'static>>;

/// How long a replicated produce waits for its entry when the request gives no
/// timeout.
const REPLICATED_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

fn producer_code(e: &ProducerError) -> i16 {
    match e {
        ProducerError::OutOfOrder { .. } => code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        ProducerError::Fenced { .. } => code::INVALID_PRODUCER_EPOCH,
        ProducerError::UnknownProducer { .. } => code::UNKNOWN_PRODUCER_ID,
        // Retriable: the client sends the batch again.
        ProducerError::InFlight { .. } => code::NOT_ENOUGH_REPLICAS,
        ProducerError::Storage(_) => code::KAFKA_STORAGE_ERROR,
        ProducerError::ShuttingDown => code::COORDINATOR_NOT_AVAILABLE,
    }
}

/// Awaits a producer-journal completion, giving up when the server stops.
async fn journal_wait(
    mut rx: crate::engine::producers::Durable,
    stop: &AtomicBool,
) -> Result<(), ProducerError> {
    loop {
        match tokio::time::timeout(super::server::POLL_INTERVAL, &mut rx).await {
            Ok(Ok(r)) => return r,
            Ok(Err(_)) => return Err(ProducerError::ShuttingDown),
            Err(_) if stop.load(Ordering::SeqCst) => return Err(ProducerError::ShuttingDown),
            Err(_) => {}
        }
    }
}

/// Decodes a partition's record batches, refusing what the engine cannot store.
pub(crate) fn decode_batches(records: Option<Bytes>) -> Result<Vec<Vec<Record>>, (i16, String)> {
    let Some(bytes) = records else {
        return Err((
            code::CORRUPT_MESSAGE,
            "the partition carries no records".into(),
        ));
    };
    let corrupt = |e: anyhow::Error| (code::CORRUPT_MESSAGE, format!("bad record batch: {e:#}"));
    // The headers first: record counts are checked before any record is decoded.
    let infos = RecordBatchDecoder::decode_batch_info(&mut bytes.clone()).map_err(corrupt)?;
    for i in &infos {
        let max = if i.compression == Compression::None {
            i32::try_from(bytes.len() / RECORD_BYTES_MIN).unwrap_or(i32::MAX)
        } else {
            COMPRESSED_BATCH_RECORDS_MAX
        };
        if i.record_count < 0 || i.record_count > max {
            return Err((
                code::CORRUPT_MESSAGE,
                format!("a batch claims {} records (at most {max})", i.record_count),
            ));
        }
        if i.transactional || i.control {
            return Err((
                code::INVALID_RECORD,
                "transactional and control batches are not supported".into(),
            ));
        }
    }
    // Compressed records inflate within one budget for the partition's batches.
    let inflater = Inflater::new(KAFKA_BATCH_INFLATED_BYTES_MAX);
    let inflate = |b: &mut Bytes, c| Ok(inflater.inflate(std::mem::take(b), c)?);
    let mut buf = bytes.clone();
    let mut sets = Vec::with_capacity(infos.len());
    while buf.has_remaining() {
        sets.push(
            RecordBatchDecoder::decode_with_custom_compression(&mut buf, Some(&inflate))
                .map_err(corrupt)?,
        );
    }
    let mut batches = Vec::with_capacity(sets.len());
    for s in sets {
        if s.records.iter().any(|r| !r.headers.is_empty()) {
            return Err((
                code::INVALID_RECORD,
                "record headers are not supported: the segment format stores none".into(),
            ));
        }
        if !s.records.is_empty() {
            batches.push(s.records);
        }
    }
    if batches.is_empty() {
        return Err((
            code::CORRUPT_MESSAGE,
            "the partition carries no records".into(),
        ));
    }
    Ok(batches)
}

fn new_records(batch: &[Record]) -> Vec<NewRecord<'_>> {
    batch
        .iter()
        .map(|r| NewRecord {
            key: r.key.as_deref(),
            value: r.value.as_deref().unwrap_or(&[]),
            timestamp_ms: r.timestamp,
        })
        .collect()
}

/// Values are checked against the topic's schema the way the native path checks them
/// (a large request on the node's checker threads, while the loop serves others).
async fn check_schema(
    broker: &Broker,
    topic: &str,
    partition: u32,
    batches: &[Vec<Record>],
) -> Result<(), (i16, String)> {
    let wire: Vec<PartitionBatch<'_>> = batches
        .iter()
        .map(|b| PartitionBatch {
            partition,
            records: b
                .iter()
                .map(|r| WireRecord {
                    timestamp_ms: r.timestamp,
                    key: r.key.as_deref(),
                    value: r.value.as_deref().unwrap_or(&[]),
                })
                .collect(),
        })
        .collect();
    broker
        .schemas()
        .check_produce_off_thread(topic, &wire)
        .await
        .map_err(|e| crate::engine::schemas::net::wire_error(e, PROTOCOL_VERSION))
        .map_err(|(_, msg)| (code::INVALID_RECORD, msg))
}

/// Writes one batch; returns its base offset and what its acknowledgement waits for.
fn append_one(
    ctx: &Ctx,
    topic: &str,
    partition: u32,
    batch: &[Record],
    waits: &mut Vec<Wait>,
    idempotent: &mut bool,
) -> Answer {
    let broker = &ctx.broker;
    let records = new_records(batch);
    let Some(first) = batch.first() else {
        return Err((code::CORRUPT_MESSAGE, "an empty batch".into()));
    };
    *idempotent |= first.producer_id >= 0;
    if first.producer_id < 0 {
        let (p, wait) = broker
            .append(topic, partition, &records)
            .map_err(|e| (engine_code(&e), e.to_string()))?;
        if let Some(w) = wait {
            let f = broker.durable(w);
            waits.push(Box::pin(async move {
                f.await.map_err(|e| (engine_code(&e), e.to_string()))
            }));
        }
        return Ok(p.base_offset);
    }
    let producer_id = first.producer_id as u64;
    let epoch = u16::try_from(first.producer_epoch).map_err(|_| {
        (
            code::INVALID_PRODUCER_EPOCH,
            format!("epoch {}", first.producer_epoch),
        )
    })?;
    let seq = first.sequence;
    let count = u32::try_from(batch.len()).unwrap_or(u32::MAX);
    let table = broker.producers();
    let decision = table
        .check(producer_id, epoch, topic, partition, seq, count)
        .map_err(|e| (producer_code(&e), e.to_string()))?;
    match decision {
        Decision::Duplicate { base_offset, .. } => Ok(base_offset),
        Decision::Append => {
            // The journal entry is written before the records (under the
            // partition's write lock), so no crash of the process leaves the records
            // without it.
            let written = broker.append_then(topic, partition, &records, |p| {
                table.journal_batch(
                    producer_id,
                    epoch,
                    topic,
                    partition,
                    seq,
                    count,
                    p.base_offset,
                    p.last_offset,
                )
            });
            match written {
                Ok((p, data, (batch, journal))) => {
                    table.recorded(&batch);
                    let data = data.map(|w| broker.durable(w));
                    let stop = std::sync::Arc::clone(&ctx.stop);
                    waits.push(Box::pin(async move {
                        let journal = journal_wait(journal, &stop).await;
                        if let Some(d) = data {
                            d.await.map_err(|e| (engine_code(&e), e.to_string()))?;
                        }
                        journal.map_err(|e| (producer_code(&e), e.to_string()))
                    }));
                    Ok(p.base_offset)
                }
                Err(e) => {
                    table.abandoned(producer_id, epoch, topic, partition);
                    Err(match e {
                        AppendError::Before(e) => (producer_code(&e), e.to_string()),
                        AppendError::Engine(e) => (engine_code(&e), e.to_string()),
                    })
                }
            }
        }
    }
}

/// One Kafka batch as one Raft entry: its records (within the limits every
/// replica's decoder holds an entry to) and its producer stamp.
fn entry(batch: &[Record]) -> Result<ProduceEntry, (i16, String)> {
    let Some(first) = batch.first() else {
        return Err((code::CORRUPT_MESSAGE, "an empty batch".into()));
    };
    if batch.len() > RECORDS_PER_PARTITION_MAX as usize {
        return Err((
            code::MESSAGE_TOO_LARGE,
            format!(
                "a batch of {} records (at most {RECORDS_PER_PARTITION_MAX})",
                batch.len()
            ),
        ));
    }
    let field_max = RECORD_FIELD_BYTES_MAX as usize;
    let producer = if first.producer_id < 0 {
        None
    } else {
        let epoch = u16::try_from(first.producer_epoch).map_err(|_| {
            (
                code::INVALID_PRODUCER_EPOCH,
                format!("epoch {}", first.producer_epoch),
            )
        })?;
        Some(ProducerStamp {
            producer_id: first.producer_id as u64,
            epoch,
            first_sequence: first.sequence,
        })
    };
    let mut records = Vec::with_capacity(batch.len());
    for r in batch {
        let key = r.key.as_deref();
        let value = r.value.as_deref().unwrap_or(&[]);
        let longest = key.map_or(0, <[u8]>::len).max(value.len());
        if longest > field_max {
            return Err((
                code::MESSAGE_TOO_LARGE,
                format!("a key or value of {longest} bytes (at most {field_max})"),
            ));
        }
        records.push(NewRecord {
            key,
            value,
            timestamp_ms: r.timestamp,
        });
    }
    Ok(ProduceEntry::new(
        producer,
        records,
        crate::engine::partition::now_ms(),
    ))
}

/// One replicated partition: decode and check here, then its batches as entries,
/// each answered once committed and applied (or after `timeout`). Batches of an
/// idempotent producer are proposed one after the other, each once the one before
/// is applied (a refused sequence stops the rest); plain batches are queued to the
/// partition's Raft group now, in order, before this returns, so the entries of
/// pipelined requests are in the log in request order. The flag says whether any
/// batch is idempotent.
async fn propose(
    ctx: &Ctx,
    r: &Arc<dyn Replicator>,
    topic: &str,
    index: i32,
    records: Option<Bytes>,
    timeout: Duration,
) -> Result<(Proposal, bool), (i16, String)> {
    validate_name(topic).map_err(|e| {
        (
            code::INVALID_TOPIC_EXCEPTION,
            format!("invalid topic name: {e}"),
        )
    })?;
    let p = u32::try_from(index).map_err(|_| {
        (
            code::UNKNOWN_TOPIC_OR_PARTITION,
            format!("partition {index}"),
        )
    })?;
    ctx.check_leader(topic, p)?;
    let batches = decode_batches(records)?;
    check_schema(&ctx.broker, topic, p, &batches).await?;
    let entries = batches
        .iter()
        .map(|b| entry(b))
        .collect::<Result<Vec<_>, _>>()?;
    let idempotent = batches
        .iter()
        .any(|b| b.first().is_some_and(|r| r.producer_id >= 0));
    let r = Arc::clone(r);
    let topic = topic.to_string();
    if !idempotent {
        let mut queued = Vec::with_capacity(entries.len());
        for e in entries {
            let applied = Arc::clone(&r)
                .submit(topic.clone(), p, e)
                .await
                .map_err(|(c, msg)| (super::replicated_code(c), msg))?;
            queued.push(applied);
        }
        return Ok((Box::pin(first_applied(queued, topic, p, timeout)), false));
    }
    // Each proposed only once the one before is applied: the iterator makes the
    // next proposal when `first_applied` asks for it.
    let t = topic.clone();
    let proposals = entries
        .into_iter()
        .map(move |e| Arc::clone(&r).produce(t.clone(), p, e));
    Ok((Box::pin(first_applied(proposals, topic, p, timeout)), true))
}

/// Awaits a partition's entries one after the other, each within `timeout`; the
/// base offset of the first, or the first error.
async fn first_applied(
    entries: impl IntoIterator<Item = crate::engine::replication::Applied>,
    topic: String,
    p: u32,
    timeout: Duration,
) -> Answer {
    let mut base = None;
    for applied in entries {
        let (at, _) = match tokio::time::timeout(timeout, applied).await {
            Ok(done) => done.map_err(|(c, msg)| (super::replicated_code(c), msg))?,
            Err(_) => {
                return Err((
                    code::REQUEST_TIMED_OUT,
                    format!("{topic}/{p}: not committed within {timeout:?}"),
                ))
            }
        };
        base.get_or_insert(at);
    }
    base.ok_or_else(|| (code::CORRUPT_MESSAGE, "no records".into()))
}

/// One partition: decode, check, then every batch appended in order.
async fn partition(
    ctx: &Ctx,
    topic: &str,
    index: i32,
    records: Option<Bytes>,
    waits: &mut Vec<Wait>,
    idempotent: &mut bool,
) -> Answer {
    validate_name(topic).map_err(|e| {
        (
            code::INVALID_TOPIC_EXCEPTION,
            format!("invalid topic name: {e}"),
        )
    })?;
    let p = u32::try_from(index).map_err(|_| {
        (
            code::UNKNOWN_TOPIC_OR_PARTITION,
            format!("partition {index}"),
        )
    })?;
    let batches = decode_batches(records)?;
    check_schema(&ctx.broker, topic, p, &batches).await?;
    let mut base = None;
    for b in &batches {
        let at = append_one(ctx, topic, p, b, waits, idempotent)?;
        base.get_or_insert(at);
    }
    base.ok_or_else(|| (code::CORRUPT_MESSAGE, "no records".into()))
}

/// Appends a produce request's batches and answers it once they are durable. With
/// `defer` (a connection that pipelines), a request whose batches are all plain
/// (no idempotent producer) and that waits for a commit or for replicated entries
/// (queued already, in request order) is answered by [`Outcome::Later`] instead: the
/// connection reads and appends its next requests meanwhile, and sends the answers
/// in order.
/// Idempotent batches keep one request at a time: the producer table has one batch
/// in flight per producer and partition.
pub(crate) async fn produce(ctx: &Ctx, r: ProduceRequest, version: i16, defer: bool) -> Outcome {
    let refuse_all = if r.transactional_id.as_ref().is_some_and(|t| !t.0.is_empty()) {
        Some((
            code::INVALID_REQUEST,
            "transactions are not supported".to_string(),
        ))
    } else if !matches!(r.acks, -1..=1) {
        Some((
            code::INVALID_REQUIRED_ACKS,
            format!("acks {} (use 0, 1 or -1)", r.acks),
        ))
    } else {
        None
    };
    let timeout = u64::try_from(r.timeout_ms)
        .ok()
        .filter(|t| *t > 0)
        .map_or(REPLICATED_TIMEOUT_DEFAULT, Duration::from_millis);
    // Every partition's write first, then the durability waits side by side.
    let mut answers: Vec<(usize, i32, Answer, usize)> = Vec::new();
    let mut waits: Vec<Wait> = Vec::new();
    let mut proposals: Vec<(usize, Proposal)> = Vec::new();
    let mut idempotent = false;
    for (ti, t) in r.topic_data.iter().enumerate() {
        for p in &t.partition_data {
            let first_wait = waits.len();
            let topic = t.name.0.as_str();
            let a = match (&refuse_all, ctx.replicated(topic)) {
                (Some(e), _) => Err(e.clone()),
                (None, Some(rep)) => {
                    match propose(ctx, rep, topic, p.index, p.records.clone(), timeout).await {
                        Ok((f, idem)) => {
                            idempotent |= idem;
                            proposals.push((answers.len(), f));
                            Ok(0)
                        }
                        Err(e) => Err(e),
                    }
                }
                (None, None) => {
                    partition(
                        ctx,
                        topic,
                        p.index,
                        p.records.clone(),
                        &mut waits,
                        &mut idempotent,
                    )
                    .await
                }
            };
            answers.push((ti, p.index, a, first_wait));
        }
    }
    let replicated = !proposals.is_empty();
    if defer && r.acks != 0 && !idempotent && (replicated || !waits.is_empty()) {
        let ctx = ctx.clone();
        let later = async move {
            applied(proposals, &mut answers).await;
            answer(&ctx, &r, version, answers, waits).await
        };
        return Outcome::Later(Box::pin(later), super::acl::After::Nothing);
    }
    applied(proposals, &mut answers).await;
    if r.acks == 0 {
        // No answer to carry an error: as Kafka does, a failure closes the
        // connection, which is how the client learns of it (librdkafka then
        // refreshes its metadata).
        let failed: Vec<String> = answers
            .iter()
            .filter_map(|(ti, index, a, _)| {
                let (c, msg) = a.as_ref().err()?;
                let topic = r.topic_data.get(*ti).map_or("", |t| t.name.0.as_str());
                Some(format!("{topic}/{index}: code {c}: {msg}"))
            })
            .collect();
        if !failed.is_empty() {
            return Outcome::Close(acks_0_failed(&failed.join("; ")));
        }
        return Outcome::NoReply;
    }
    answer(ctx, &r, version, answers, waits).await
}

/// The log line of a connection closed for a failed produce with acks 0.
pub(crate) fn acks_0_failed(what: &str) -> String {
    format!(
        "a produce with acks 0 failed ({what}); closing the connection so the client \
         notices, as Kafka does"
    )
}

/// Replicated partitions' entries, side by side (acks 0 and 1 wait as -1 does): each
/// one's answer in its slot of `answers`.
async fn applied(proposals: Vec<(usize, Proposal)>, answers: &mut [(usize, i32, Answer, usize)]) {
    let (at, futures): (Vec<usize>, Vec<Proposal>) = proposals.into_iter().unzip();
    for (i, a) in at
        .into_iter()
        .zip(futures_util::future::join_all(futures).await)
    {
        if let Some(slot) = answers.get_mut(i) {
            slot.2 = a;
        }
    }
}

/// Waits for a produce's commits and builds its response: per partition the base
/// offset, or the error of its append or of its commit.
async fn answer(
    ctx: &Ctx,
    r: &ProduceRequest,
    version: i16,
    answers: Vec<(usize, i32, Answer, usize)>,
    waits: Vec<Wait>,
) -> Outcome {
    let mut waited = Vec::with_capacity(waits.len());
    for w in waits {
        waited.push(w.await);
    }
    let mut resp = ProduceResponse::default();
    for t in &r.topic_data {
        let mut tr = TopicProduceResponse::default();
        tr.name = t.name.clone();
        resp.responses.push(tr);
    }
    let n = answers.len();
    for (i, (ti, index, a, first_wait)) in answers.iter().enumerate() {
        let last_wait = answers.get(i + 1).map_or(waited.len(), |x| x.3);
        let failed_wait = waited
            .get(*first_wait..last_wait)
            .unwrap_or(&[])
            .iter()
            .find_map(|w| w.as_ref().err().cloned());
        let a = match (a, failed_wait) {
            (Ok(_), Some(e)) => Err(e),
            (a, _) => a.clone(),
        };
        let mut pr = PartitionProduceResponse::default();
        pr.index = *index;
        pr.log_append_time_ms = -1;
        match a {
            Ok(base) => {
                pr.base_offset = base as i64;
                if version >= 5 {
                    let topic = r.topic_data.get(*ti).map_or("", |t| t.name.0.as_str());
                    if let Ok(p) = u32::try_from(*index) {
                        if let Ok((start, _)) = ctx.broker.offsets(topic, p) {
                            pr.log_start_offset = start as i64;
                        }
                    }
                }
            }
            Err((c, msg)) => {
                ctx.client_error(ApiKey::Produce, c, &msg);
                pr.error_code = c;
                pr.base_offset = -1;
                if version >= 8 {
                    pr.error_message = Some(sb(&msg));
                }
            }
        }
        if let Some(tr) = resp.responses.get_mut(*ti) {
            tr.partition_responses.push(pr);
        }
    }
    debug_assert_eq!(n, answers.len());
    Outcome::reply(ResponseKind::Produce(resp))
}

pub(crate) async fn init_producer_id(ctx: &Ctx, r: InitProducerIdRequest) -> Outcome {
    let mut resp = InitProducerIdResponse::default();
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    if r.transactional_id.as_ref().is_some_and(|t| !t.0.is_empty()) {
        // Kafka's answer to a transactional id the producer may not use: clients
        // treat it as final (librdkafka retries INVALID_REQUEST every 500 ms for
        // ever). The response has no message; FindCoordinator carries one.
        let c = code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        ctx.client_error(ApiKey::InitProducerId, c, super::NO_TRANSACTIONS);
        resp.error_code = c;
        return Outcome::reply(ResponseKind::InitProducerId(resp));
    }
    let existing = match (
        u64::try_from(r.producer_id.0),
        u16::try_from(r.producer_epoch),
    ) {
        (Ok(id), Ok(epoch)) => Some((id, epoch)),
        _ => None,
    };
    let table = ctx.broker.producers();
    let mut asked = table.init(existing);
    // An id the broker does not know (its state expired, or, in a cluster, another
    // node gave it): as Kafka does for a producer without a transactional id, it gets
    // a new id (a new id's sequences are checked from its first batch).
    if matches!(asked, Err(ProducerError::UnknownProducer { .. })) {
        asked = table.init(None);
    }
    let init = match asked {
        Ok((ids, rx)) => journal_wait(rx, &ctx.stop).await.map(|()| ids),
        Err(e) => Err(e),
    };
    match init {
        Ok((id, epoch)) => match (i64::try_from(id), i16::try_from(epoch)) {
            (Ok(id), Ok(epoch)) => {
                resp.producer_id = ProducerId(id);
                resp.producer_epoch = epoch;
            }
            _ => resp.error_code = code::UNKNOWN_SERVER_ERROR,
        },
        Err(e) => {
            let c = producer_code(&e);
            ctx.client_error(ApiKey::InitProducerId, c, &e.to_string());
            resp.error_code = c;
        }
    }
    Outcome::reply(ResponseKind::InitProducerId(resp))
}
