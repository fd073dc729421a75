//! The native protocol's idempotent-producer requests, served by the engine's one
//! producer table. A batch is acknowledged once its records and its journal entry
//! are both durable; the journal entry is handed in right after the records are
//! written, so its fsync runs alongside the partition's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::server::engine_error;
use crate::engine::broker::{AppendError, Broker, NewRecord};
use crate::engine::producers::{Decision, Durable, ProducerError};
use crate::engine::replication::types::{ProduceEntry, ProducerStamp};
use crate::engine::replication::Replicator;
use crate::format::wire::producers::ProducerRequest;
use crate::format::wire::{
    encode_error, encode_response, ErrorCode, PartitionAck, PartitionBatch, ResponseBody,
    GROUPS_VERSION,
};

/// The wire code and message of a producer error.
pub fn producer_error(e: &ProducerError) -> (ErrorCode, String) {
    let code = match e {
        ProducerError::OutOfOrder { .. } => ErrorCode::OUT_OF_ORDER_SEQUENCE,
        ProducerError::Fenced { .. } => ErrorCode::INVALID_PRODUCER_EPOCH,
        ProducerError::UnknownProducer { .. } => ErrorCode::UNKNOWN_PRODUCER,
        ProducerError::InFlight { .. } => ErrorCode::PRODUCER_BUSY,
        ProducerError::Storage(_) => ErrorCode::STORAGE,
        ProducerError::ShuttingDown => ErrorCode::SHUTTING_DOWN,
    };
    (code, e.to_string())
}

async fn wait(mut rx: Durable, stop: &AtomicBool) -> Result<(), ProducerError> {
    loop {
        match tokio::time::timeout(STOP_CHECK, &mut rx).await {
            Ok(Ok(r)) => return r,
            Ok(Err(_)) => return Err(ProducerError::ShuttingDown),
            Err(_) if stop.load(Ordering::SeqCst) => return Err(ProducerError::ShuttingDown),
            Err(_) => {}
        }
    }
}

/// How often a waiting request looks at the server's stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// A batch's (base offset, last offset, newly written), or its wire error.
type BatchResult = Result<(u64, u64, bool), (ErrorCode, String)>;

/// Answers one producer request into `out`; returns the records and stored bytes it
/// wrote (for the metrics).
pub async fn serve(
    broker: &Broker,
    version: u16,
    stop: &AtomicBool,
    id: u32,
    req: ProducerRequest<'_>,
    out: &mut Vec<u8>,
    replication: Option<Arc<dyn Replicator>>,
) -> (u64, u64) {
    let api = req.api_key() as u16;
    out.clear();
    if version < GROUPS_VERSION {
        let msg = format!(
            "{} needs protocol version {GROUPS_VERSION}; this connection agreed on {version}",
            req.api_key().name()
        );
        encode_error(out, id, api, ErrorCode::INVALID_REQUEST, &msg);
        return (0, 0);
    }
    let table = broker.producers();
    let body = match req {
        ProducerRequest::InitProducer { producer_id, epoch } => {
            let existing = u64::try_from(producer_id).ok().map(|p| (p, epoch));
            let init = match table.init(existing) {
                Ok((ids, rx)) => wait(rx, stop).await.map(|()| ids),
                Err(e) => Err(e),
            };
            match init {
                Ok((producer_id, epoch)) => ResponseBody::InitProducer { producer_id, epoch },
                Err(e) => {
                    let (code, msg) = producer_error(&e);
                    encode_error(out, id, api, code, &msg);
                    return (0, 0);
                }
            }
        }
        ProducerRequest::Produce {
            topic,
            producer_id,
            epoch,
            partitions,
        } => {
            // A topic's schema refuses the whole request before anything is written,
            // as for a plain produce.
            if let Err((code, msg)) = crate::engine::schemas::net::check_produce(
                broker,
                version,
                topic,
                partitions.iter().map(|(_, b)| b),
            )
            .await
            {
                encode_error(out, id, api, code, &msg);
                return (0, 0);
            }
            let mut results: Vec<BatchResult> = Vec::with_capacity(partitions.len());
            let asked = partitions.iter().map(|(_, b)| b.partition).collect();
            let elsewhere =
                super::dispatch::held_elsewhere(broker, replication.as_ref(), topic, asked).await;
            match replication.filter(|r| r.is_replicated(topic)) {
                // Held by other nodes only: each partition names one of them.
                _ if elsewhere.is_some() => {
                    results.extend(elsewhere.into_iter().flatten().map(Err));
                }
                // A replicated topic: the de-duplication happens at apply, on every
                // replica, so a retry on a new leader is recognised.
                Some(r) => {
                    for (seq, b) in &partitions {
                        let stamp = ProducerStamp {
                            producer_id,
                            epoch,
                            first_sequence: *seq,
                        };
                        let entry = ProduceEntry::new(
                            Some(stamp),
                            b.records.iter().map(|r| NewRecord {
                                key: r.key,
                                value: r.value,
                                timestamp_ms: r.timestamp_ms,
                            }),
                            crate::engine::partition::now_ms(),
                        );
                        let done = Arc::clone(&r)
                            .produce(topic.to_string(), b.partition, entry)
                            .await;
                        results.push(done.map(|(base, last)| (base, last, true)));
                    }
                }
                None => {
                    for (seq, b) in &partitions {
                        results.push(one(broker, stop, topic, producer_id, epoch, *seq, b).await);
                    }
                }
            }
            // Records and stored bytes newly written (a duplicate writes nothing).
            let mut written = (0u64, 0u64);
            for ((_, b), r) in partitions.iter().zip(&results) {
                if let Ok((_, _, true)) = r {
                    written.0 += b.records.len() as u64;
                    written.1 += b
                        .records
                        .iter()
                        .map(|r| super::metrics::stored_len(r.key, r.value))
                        .sum::<u64>();
                }
            }
            let acks = partitions
                .iter()
                .zip(&results)
                .map(|((_, b), r)| match r {
                    Ok((base_offset, last_offset, _)) => PartitionAck {
                        partition: b.partition,
                        code: ErrorCode::NONE,
                        message: "",
                        base_offset: *base_offset,
                        last_offset: *last_offset,
                    },
                    Err((code, message)) => PartitionAck {
                        partition: b.partition,
                        code: *code,
                        message,
                        base_offset: 0,
                        last_offset: 0,
                    },
                })
                .collect();
            if let Err(e) = encode_response(
                out,
                id,
                api,
                ErrorCode::NONE,
                "",
                Some(&ResponseBody::Produce { partitions: acks }),
            ) {
                let msg = format!("cannot encode the response: {e}");
                encode_error(out, id, api, ErrorCode::INTERNAL, &msg);
            }
            return written;
        }
    };
    if let Err(e) = encode_response(out, id, api, ErrorCode::NONE, "", Some(&body)) {
        let msg = format!("cannot encode the response: {e}");
        encode_error(out, id, api, ErrorCode::INTERNAL, &msg);
    }
    (0, 0)
}

/// One partition's batch: checked against the table, written unless a duplicate,
/// acknowledged once records and journal entry are durable.
async fn one(
    broker: &Broker,
    stop: &AtomicBool,
    topic: &str,
    producer_id: u64,
    epoch: u16,
    seq: i32,
    b: &PartitionBatch<'_>,
) -> BatchResult {
    if b.records.is_empty() {
        return Err((
            ErrorCode::INVALID_REQUEST,
            "an idempotent batch needs records".into(),
        ));
    }
    let count = b.records.len() as u32;
    let table = broker.producers();
    match table
        .check(producer_id, epoch, topic, b.partition, seq, count)
        .map_err(|e| producer_error(&e))?
    {
        Decision::Duplicate {
            base_offset,
            last_offset,
        } => Ok((base_offset, last_offset, false)),
        Decision::Append => {
            let records: Vec<NewRecord<'_>> = b
                .records
                .iter()
                .map(|r| NewRecord {
                    key: r.key,
                    value: r.value,
                    timestamp_ms: r.timestamp_ms,
                })
                .collect();
            // The journal entry is written before the records (under the
            // partition's write lock), so no crash of the process leaves the records
            // without it.
            let written = broker.append_then(topic, b.partition, &records, |p| {
                table.journal_batch(
                    producer_id,
                    epoch,
                    topic,
                    b.partition,
                    seq,
                    count,
                    p.base_offset,
                    p.last_offset,
                )
            });
            match written {
                Ok((p, data, (batch, journal))) => {
                    table.recorded(&batch);
                    // The records' fsync and the journal entry's are asked for
                    // together; the batch is acknowledged once both are durable.
                    let data = data.map(|w| broker.durable(w));
                    let journal = wait(journal, stop).await;
                    if let Some(data) = data {
                        data.await.map_err(engine_error)?;
                    }
                    journal.map_err(|e| producer_error(&e))?;
                    Ok((p.base_offset, p.last_offset, true))
                }
                Err(e) => {
                    table.abandoned(producer_id, epoch, topic, b.partition);
                    Err(match e {
                        AppendError::Before(e) => producer_error(&e),
                        AppendError::Engine(e) => engine_error(e),
                    })
                }
            }
        }
    }
}
