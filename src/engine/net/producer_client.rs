//! The client side of the idempotent-producer requests (protocol version 3).

use std::time::Duration;

use super::client::{Ack, Client, ClientError};
use crate::format::wire::producers::ProducerRequest;
use crate::format::wire::{PartitionBatch, Request, ResponseBody};

impl Client {
    /// A new (producer_id, epoch), or with `existing` the same id with its epoch
    /// bumped (the old epoch is fenced).
    pub fn init_producer(
        &mut self,
        existing: Option<(u64, u16)>,
    ) -> Result<(u64, u16), ClientError> {
        let (producer_id, epoch) = existing.map_or((-1, 0), |(p, e)| (p as i64, e));
        let req = Request::Producer(ProducerRequest::InitProducer { producer_id, epoch });
        match self.call(&req, Duration::ZERO)? {
            ResponseBody::InitProducer { producer_id, epoch } => Ok((producer_id, epoch)),
            _ => Err(self.protocol("init producer answered with another response")),
        }
    }

    /// An idempotent produce: each batch with its base sequence. Each partition
    /// succeeds or fails on its own; a duplicate is acknowledged with its original
    /// offsets.
    pub fn produce_idempotent(
        &mut self,
        topic: &str,
        producer_id: u64,
        epoch: u16,
        partitions: Vec<(i32, PartitionBatch<'_>)>,
    ) -> Result<Vec<Ack>, ClientError> {
        let sent: Vec<u32> = partitions.iter().map(|(_, b)| b.partition).collect();
        let req = Request::Producer(ProducerRequest::Produce {
            topic,
            producer_id,
            epoch,
            partitions,
        });
        let body = self.call(&req, Duration::ZERO)?;
        let ResponseBody::Produce { partitions } = body else {
            return Err(self.protocol("produce answered with another response"));
        };
        let acks: Vec<Ack> = partitions
            .iter()
            .map(|a| Ack {
                partition: a.partition,
                result: if a.code.is_ok() {
                    Ok((a.base_offset, a.last_offset))
                } else {
                    Err((a.code, a.message.to_string()))
                },
            })
            .collect();
        if acks.iter().map(|a| a.partition).ne(sent.iter().copied()) {
            return Err(self.protocol("produce response partitions do not match the request"));
        }
        Ok(acks)
    }
}
