//! Idempotent-producer requests (protocol version 3): init-producer and the
//! idempotent produce, whose partition batches carry a base sequence under the
//! request's (producer_id, epoch). The idempotent produce is answered with the
//! produce response's body. docs/PROTOCOL.md, "Version 3", lays out every field.

use super::{
    put_count, put_record, put_str, ApiKey, PartitionBatch, ProtocolError, Reader,
    PARTITIONS_PER_MESSAGE_MAX, PARTITION_BATCH_MIN, RECORDS_PER_PARTITION_MAX, RECORD_WIRE_MIN,
    TOPIC_BYTES_MAX,
};

/// A producer request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProducerRequest<'a> {
    /// producer_id -1: a new id; else the current (id, epoch) of a producer whose
    /// epoch is to be bumped.
    InitProducer { producer_id: i64, epoch: u16 },
    Produce {
        topic: &'a str,
        producer_id: u64,
        epoch: u16,
        /// (base_sequence, batch) per partition.
        partitions: Vec<(i32, PartitionBatch<'a>)>,
    },
}

impl ProducerRequest<'_> {
    pub fn api_key(&self) -> ApiKey {
        match self {
            ProducerRequest::InitProducer { .. } => ApiKey::InitProducer,
            ProducerRequest::Produce { .. } => ApiKey::IdempotentProduce,
        }
    }
}

pub(super) fn encode_request(
    out: &mut Vec<u8>,
    req: &ProducerRequest<'_>,
) -> Result<(), ProtocolError> {
    match req {
        ProducerRequest::InitProducer { producer_id, epoch } => {
            out.extend_from_slice(&producer_id.to_be_bytes());
            out.extend_from_slice(&epoch.to_be_bytes());
        }
        ProducerRequest::Produce {
            topic,
            producer_id,
            epoch,
            partitions,
        } => {
            put_str(out, "topic", topic, TOPIC_BYTES_MAX)?;
            out.extend_from_slice(&producer_id.to_be_bytes());
            out.extend_from_slice(&epoch.to_be_bytes());
            put_count(
                out,
                "partitions",
                partitions.len(),
                PARTITIONS_PER_MESSAGE_MAX,
            )?;
            for (seq, b) in partitions {
                out.extend_from_slice(&b.partition.to_be_bytes());
                out.extend_from_slice(&seq.to_be_bytes());
                put_count(out, "records", b.records.len(), RECORDS_PER_PARTITION_MAX)?;
                for r in &b.records {
                    put_record(out, r)?;
                }
            }
        }
    }
    Ok(())
}

pub(super) fn decode_request<'a>(
    api: ApiKey,
    r: &mut Reader<'a>,
) -> Result<ProducerRequest<'a>, ProtocolError> {
    Ok(match api {
        ApiKey::InitProducer => ProducerRequest::InitProducer {
            producer_id: r.i64("producer_id")?,
            epoch: r.u16("epoch")?,
        },
        _ => {
            let topic = r.str("topic", TOPIC_BYTES_MAX)?;
            let producer_id = r.u64("producer_id")?;
            let epoch = r.u16("epoch")?;
            let n = r.count(
                "partitions",
                PARTITIONS_PER_MESSAGE_MAX,
                PARTITION_BATCH_MIN + 4,
            )?;
            let mut partitions = Vec::with_capacity(n);
            for _ in 0..n {
                let partition = r.u32("partition")?;
                let at = r.at;
                let seq = r.i32("base_sequence")?;
                if seq < 0 {
                    return Err(ProtocolError::BadValue {
                        field: "base_sequence",
                        at,
                        value: i64::from(seq),
                    });
                }
                let m = r.count("records", RECORDS_PER_PARTITION_MAX, RECORD_WIRE_MIN)?;
                let mut records = Vec::with_capacity(m);
                for _ in 0..m {
                    records.push(r.record()?);
                }
                partitions.push((seq, PartitionBatch { partition, records }));
            }
            ProducerRequest::Produce {
                topic,
                producer_id,
                epoch,
                partitions,
            }
        }
    })
}

/// The init-producer response body: (producer_id, epoch).
pub(super) fn encode_init_response(out: &mut Vec<u8>, producer_id: u64, epoch: u16) {
    out.extend_from_slice(&producer_id.to_be_bytes());
    out.extend_from_slice(&epoch.to_be_bytes());
}

pub(super) fn decode_init_response(r: &mut Reader<'_>) -> Result<(u64, u16), ProtocolError> {
    Ok((r.u64("producer_id")?, r.u16("epoch")?))
}
