//! The limits a listener enforces on its clients, in one place: how many connections
//! (in all and per source address), how large a frame, how many records in one
//! request, how many bytes a connection may hold read but unanswered, how many topics
//! and partitions, how large a key or value, and how long a connection may sit idle.
//! The native listener ([`super::server`]) applies them; another listener (Kafka)
//! calls the same [`Limits`] checks and [`ConnectionGate`].
//!
//! Invariants:
//! - Every configurable limit is at most the protocol's hard cap
//!   ([`crate::format::wire`]), checked by [`Limits::validate`]; the defaults are the
//!   hard caps (no limit tighter than before), except the per-address connection
//!   count, which defaults to the total.
//! - A request past a limit is refused whole, before anything is written, with
//!   [`ErrorCode::LIMIT_EXCEEDED`] or [`ErrorCode::RECORD_TOO_LARGE`] (key or value),
//!   and the connection stays open. A frame past the limit gets
//!   [`ErrorCode::FRAME_TOO_LARGE`] and closes its connection; a connection past a
//!   connection limit gets [`ErrorCode::TOO_MANY_CONNECTIONS`] and is closed.
//! - [`ConnectionGate`] counts a connection from [`ConnectionGate::admit`] until its
//!   [`Admitted`] guard drops, so a connection task that ends in any way frees its
//!   slot.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::format::topic::PARTITIONS_MAX;
use crate::format::wire::{
    ErrorCode, PartitionBatch, FRAME_BYTES_MAX, FRAME_HEAD_LEN, PARTITIONS_PER_MESSAGE_MAX,
    RECORDS_PER_PARTITION_MAX, RECORD_FIELD_BYTES_MAX, TOPICS_MAX,
};

/// Hard cap of records in one request: every partition of a message at its maximum.
pub const RECORDS_PER_REQUEST_HARD_MAX: u64 =
    RECORDS_PER_PARTITION_MAX as u64 * PARTITIONS_PER_MESSAGE_MAX as u64;

/// What a listener allows one client (see the README table "Limits").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections from one source IP address served at once.
    pub connections_per_address_max: usize,
    /// Largest `frame_len` of a request (also announced in the handshake).
    pub frame_bytes_max: u32,
    /// Records in one produce request, all partitions together.
    pub records_per_request_max: u64,
    /// Bytes a connection may hold read but not yet answered; the connection stops
    /// reading while it holds that many (at least `frame_bytes_max`).
    pub inflight_bytes_max: u64,
    /// Topics the broker holds; creating one more is refused.
    pub topics_max: u32,
    /// Partitions a topic may be created with.
    pub partitions_per_topic_max: u32,
    /// Largest record key.
    pub key_bytes_max: u32,
    /// Largest record value.
    pub value_bytes_max: u32,
    /// A connection that sends no request for this long is closed (`None`: never).
    pub idle_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_per_address_max: usize::MAX,
            frame_bytes_max: FRAME_BYTES_MAX,
            records_per_request_max: RECORDS_PER_REQUEST_HARD_MAX,
            inflight_bytes_max: u64::from(FRAME_BYTES_MAX),
            topics_max: TOPICS_MAX,
            partitions_per_topic_max: PARTITIONS_MAX,
            key_bytes_max: RECORD_FIELD_BYTES_MAX,
            value_bytes_max: RECORD_FIELD_BYTES_MAX,
            idle_timeout: None,
        }
    }
}

/// A limit set outside what the protocol allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} must be {min}..={max}, got {value}")]
pub struct LimitError {
    pub name: &'static str,
    pub value: u64,
    pub min: u64,
    pub max: u64,
}

/// The outcome of a check: nothing, or the error code and message to answer with.
pub type Refusal = (ErrorCode, String);

impl Limits {
    /// Checks every limit against its hard cap.
    pub fn validate(&self) -> Result<(), LimitError> {
        let check = |name, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(LimitError {
                    name,
                    value,
                    min,
                    max,
                })
            }
        };
        check(
            "connections_per_address_max",
            self.connections_per_address_max as u64,
            1,
            u64::MAX,
        )?;
        let frame = u64::from(self.frame_bytes_max);
        check(
            "frame_bytes_max",
            frame,
            FRAME_HEAD_LEN as u64,
            u64::from(FRAME_BYTES_MAX),
        )?;
        check(
            "records_per_request_max",
            self.records_per_request_max,
            1,
            RECORDS_PER_REQUEST_HARD_MAX,
        )?;
        check(
            "inflight_bytes_max",
            self.inflight_bytes_max,
            frame,
            u64::from(u32::MAX),
        )?;
        check(
            "topics_max",
            u64::from(self.topics_max),
            1,
            u64::from(TOPICS_MAX),
        )?;
        check(
            "partitions_per_topic_max",
            u64::from(self.partitions_per_topic_max),
            1,
            u64::from(PARTITIONS_MAX),
        )?;
        check(
            "key_bytes_max",
            u64::from(self.key_bytes_max),
            0,
            u64::from(RECORD_FIELD_BYTES_MAX),
        )?;
        check(
            "value_bytes_max",
            u64::from(self.value_bytes_max),
            0,
            u64::from(RECORD_FIELD_BYTES_MAX),
        )?;
        Ok(())
    }

    /// The records of one produce request (plain or idempotent): their count, and
    /// each key and value against its limit.
    pub fn check_records<'a, 'b: 'a>(
        &self,
        batches: impl Iterator<Item = &'a PartitionBatch<'b>>,
    ) -> Result<(), Refusal> {
        let mut count: u64 = 0;
        for b in batches {
            count += b.records.len() as u64;
            if count > self.records_per_request_max {
                return Err((
                    ErrorCode::LIMIT_EXCEEDED,
                    format!(
                        "a produce request may carry at most {} records (records_per_request_max)",
                        self.records_per_request_max
                    ),
                ));
            }
            for r in &b.records {
                let key = r.key.map_or(0, <[u8]>::len);
                if key > self.key_bytes_max as usize {
                    return Err((
                        ErrorCode::RECORD_TOO_LARGE,
                        format!(
                            "a key of {key} bytes in partition {} is over the limit of {} bytes \
                             (key_bytes_max)",
                            b.partition, self.key_bytes_max
                        ),
                    ));
                }
                if r.value.len() > self.value_bytes_max as usize {
                    return Err((
                        ErrorCode::RECORD_TOO_LARGE,
                        format!(
                            "a value of {} bytes in partition {} is over the limit of {} bytes \
                             (value_bytes_max)",
                            r.value.len(),
                            b.partition,
                            self.value_bytes_max
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A topic to be created with `partitions`, while `existing` topics exist.
    pub fn check_new_topic(&self, existing: usize, partitions: u32) -> Result<(), Refusal> {
        if existing >= self.topics_max as usize {
            return Err((
                ErrorCode::LIMIT_EXCEEDED,
                format!(
                    "the broker holds at most {} topics (topics_max)",
                    self.topics_max
                ),
            ));
        }
        if partitions > self.partitions_per_topic_max {
            return Err((
                ErrorCode::LIMIT_EXCEEDED,
                format!(
                    "a topic may have at most {} partitions (partitions_per_topic_max), asked for {partitions}",
                    self.partitions_per_topic_max
                ),
            ));
        }
        Ok(())
    }

    /// A frame of `len` bytes (after `frame_len`).
    pub fn check_frame_len(&self, len: u32) -> Result<usize, String> {
        if (len as usize) < FRAME_HEAD_LEN || len > self.frame_bytes_max {
            return Err(format!(
                "frame length {len} is outside {FRAME_HEAD_LEN}..={} (frame_bytes_max)",
                self.frame_bytes_max
            ));
        }
        Ok(len as usize)
    }

    /// Bytes a connection may read ahead beyond the frame it is reading: what the
    /// in-flight limit leaves, at most `buffer` bytes.
    pub fn read_window(&self, buffer: usize) -> usize {
        usize::try_from(self.inflight_bytes_max)
            .unwrap_or(usize::MAX)
            .min(buffer)
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateRefusal {
    /// The listener serves its maximum already.
    Total { max: usize },
    /// This source address has its maximum already.
    PerAddress { addr: IpAddr, max: usize },
}

impl GateRefusal {
    /// The message sent to the refused peer.
    pub fn message(&self) -> String {
        match self {
            GateRefusal::Total { max } => format!("the broker serves at most {max} connections"),
            GateRefusal::PerAddress { addr, max } => format!(
                "the broker serves at most {max} connections from one address ({addr}) \
                 (connections_per_address_max)"
            ),
        }
    }
}

/// Counts a listener's connections, in all and per source address.
#[derive(Debug)]
pub struct ConnectionGate {
    active: Arc<AtomicUsize>,
    max: usize,
    per_address_max: usize,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    /// Connections refused by either limit, for the metrics.
    refused: AtomicU64,
}

impl ConnectionGate {
    /// A gate counting into `active` (read elsewhere as the live connection count).
    pub fn new(active: Arc<AtomicUsize>, max: usize, per_address_max: usize) -> Arc<Self> {
        Arc::new(ConnectionGate {
            active,
            max,
            per_address_max,
            per_address: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        })
    }

    /// Admits a connection from `peer`, or says which limit refuses it.
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<Admitted, GateRefusal> {
        let ip = peer.ip();
        let mut map = self
            .per_address
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.active.load(Ordering::SeqCst) >= self.max {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(GateRefusal::Total { max: self.max });
        }
        let n = map.entry(ip).or_insert(0);
        if *n >= self.per_address_max {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(GateRefusal::PerAddress {
                addr: ip,
                max: self.per_address_max,
            });
        }
        *n += 1;
        self.active.fetch_add(1, Ordering::SeqCst);
        Ok(Admitted {
            gate: Arc::clone(self),
            ip,
        })
    }

    /// Connections refused so far by a connection limit.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections served right now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }
}

/// One admitted connection; frees its slot when dropped.
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<ConnectionGate>,
    ip: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut map = self
            .gate
            .per_address
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
        self.gate.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Checks one native-protocol request against `limits`: the records of a produce
/// (plain or idempotent) and a topic to be created.
pub fn check_request(
    limits: &Limits,
    broker: &crate::engine::broker::Broker,
    req: &crate::format::wire::Request<'_>,
) -> Result<(), Refusal> {
    use crate::format::wire::producers::ProducerRequest;
    use crate::format::wire::Request;
    match req {
        Request::Produce { partitions, .. } => limits.check_records(partitions.iter()),
        Request::Producer(ProducerRequest::Produce { partitions, .. }) => {
            limits.check_records(partitions.iter().map(|(_, b)| b))
        }
        Request::CreateTopic { partitions, .. } => {
            limits.check_new_topic(broker.list_topics().len(), *partitions)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::wire::WireRecord;

    #[test]
    fn defaults_are_the_hard_caps_and_valid() {
        let l = Limits::default();
        l.validate().unwrap();
        assert_eq!(l.frame_bytes_max, FRAME_BYTES_MAX);
        let past = Limits {
            frame_bytes_max: FRAME_BYTES_MAX + 1,
            ..Limits::default()
        };
        assert_eq!(past.validate().unwrap_err().name, "frame_bytes_max");
        let small_inflight = Limits {
            frame_bytes_max: 1000,
            inflight_bytes_max: 999,
            ..Limits::default()
        };
        assert_eq!(
            small_inflight.validate().unwrap_err().name,
            "inflight_bytes_max"
        );
        let partitions = Limits {
            partitions_per_topic_max: PARTITIONS_MAX + 1,
            ..Limits::default()
        };
        assert!(partitions.validate().is_err());
    }

    #[test]
    fn records_keys_and_values_at_and_past_the_edge() {
        let l = Limits {
            records_per_request_max: 2,
            key_bytes_max: 3,
            value_bytes_max: 4,
            ..Limits::default()
        };
        let rec = |k: Option<&'static [u8]>, v: &'static [u8]| WireRecord {
            timestamp_ms: -1,
            key: k,
            value: v,
        };
        let ok = [PartitionBatch {
            partition: 0,
            records: vec![rec(Some(b"abc"), b"abcd"), rec(None, b"")],
        }];
        assert_eq!(l.check_records(ok.iter()), Ok(()));
        let three = [
            PartitionBatch {
                partition: 0,
                records: vec![rec(None, b"a"), rec(None, b"b")],
            },
            PartitionBatch {
                partition: 1,
                records: vec![rec(None, b"c")],
            },
        ];
        assert_eq!(
            l.check_records(three.iter()).unwrap_err().0,
            ErrorCode::LIMIT_EXCEEDED
        );
        let key = [PartitionBatch {
            partition: 0,
            records: vec![rec(Some(b"abcd"), b"")],
        }];
        let e = l.check_records(key.iter()).unwrap_err();
        assert_eq!(e.0, ErrorCode::RECORD_TOO_LARGE);
        assert!(e.1.contains("key_bytes_max"), "{}", e.1);
        let value = [PartitionBatch {
            partition: 0,
            records: vec![rec(None, b"abcde")],
        }];
        let e = l.check_records(value.iter()).unwrap_err();
        assert!(e.1.contains("value_bytes_max"), "{}", e.1);
    }

    #[test]
    fn topics_partitions_and_frames() {
        let l = Limits {
            topics_max: 2,
            partitions_per_topic_max: 4,
            frame_bytes_max: 100,
            ..Limits::default()
        };
        assert!(l.check_new_topic(1, 4).is_ok());
        assert_eq!(
            l.check_new_topic(2, 1).unwrap_err().0,
            ErrorCode::LIMIT_EXCEEDED
        );
        assert!(l.check_new_topic(0, 5).unwrap_err().1.contains("at most 4"));
        assert_eq!(l.check_frame_len(100), Ok(100));
        assert!(l.check_frame_len(101).is_err());
        assert!(l.check_frame_len(FRAME_HEAD_LEN as u32 - 1).is_err());
    }

    #[test]
    fn the_gate_counts_per_address_and_frees_on_drop() {
        let gate = ConnectionGate::new(Arc::new(AtomicUsize::new(0)), 3, 2);
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let a2: SocketAddr = "127.0.0.1:1001".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:1000".parse().unwrap();
        let first = gate.admit(a).unwrap();
        let _second = gate.admit(a2).unwrap();
        assert!(matches!(
            gate.admit(a),
            Err(GateRefusal::PerAddress { max: 2, .. })
        ));
        let _third = gate.admit(b).unwrap();
        assert!(matches!(gate.admit(b), Err(GateRefusal::Total { max: 3 })));
        assert_eq!(gate.refused(), 2);
        drop(first);
        assert_eq!(gate.active(), 2);
        let _again = gate.admit(a).unwrap();
    }
}
