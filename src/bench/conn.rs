//! The bench's own connection: the native protocol over a tokio `TcpStream`, one
//! request in flight or several produce requests pipelined, so every connection of a run is a task on one event-loop
//! thread (as redis-benchmark drives Redis) instead of a thread each, and the run
//! measures the broker rather than the load generator's thread switches. Only what
//! the measured loops need: handshake, produce, fetch. Set-up and counters go through
//! the blocking [`crate::engine::net::client::Client`].
//!
//! Invariants: a frame's length is checked against the protocol limit before its
//! buffer grows; a response is taken only when its request id matches; every fetched
//! record's CRC is checked, as the blocking client does.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::engine::net::client::ClientError;
use crate::format::decode_record;
use crate::format::wire::producers::ProducerRequest;
use crate::format::wire::{
    check_frame_len, decode_response_version, encode_request, PartitionBatch, Request,
    ResponseBody, LEN_FIELD, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};

/// A connection's byte stream: plain TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One connection of a bench run.
pub(super) struct Conn {
    stream: Box<dyn Io>,
    /// True over TLS, where a write goes through the session and needs a flush.
    tls: bool,
    addr: String,
    timeout: Duration,
    next_id: u32,
    version: u16,
    out: Vec<u8>,
    frame: Vec<u8>,
}

/// What one fetch brought.
pub(super) struct Fetched {
    /// Records in the requested range.
    pub(super) records: u64,
    /// The last offset read (of any record in the response).
    pub(super) last_offset: Option<u64>,
}

impl Conn {
    /// Connects and performs the handshake, within `timeout` each.
    pub(super) async fn connect(
        addr: &str,
        timeout: Duration,
        token: Option<&str>,
        tls: Option<&crate::engine::net::tls::ClientTls>,
    ) -> Result<Conn, ClientError> {
        let connect_err = |source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        };
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(r) => r.map_err(connect_err)?,
            Err(_) => return Err(connect_err(io::ErrorKind::TimedOut.into())),
        };
        stream.set_nodelay(true).map_err(connect_err)?;
        let stream: Box<dyn Io> = match tls {
            None => Box::new(stream),
            Some(tls) => match tokio::time::timeout(timeout, tls.wrap_async(addr, stream)).await {
                Ok(Ok(s)) => Box::new(s),
                Ok(Err(source)) => {
                    return Err(ClientError::Tls {
                        addr: addr.to_string(),
                        hint: crate::engine::net::client::tls_hint(&source),
                        source,
                    })
                }
                Err(_) => return Err(connect_err(io::ErrorKind::TimedOut.into())),
            },
        };
        let mut conn = Conn {
            stream,
            tls: tls.is_some(),
            addr: addr.to_string(),
            timeout,
            next_id: 1,
            version: PROTOCOL_VERSION_MIN,
            out: Vec::new(),
            frame: Vec::new(),
        };
        let req = Request::Handshake {
            min_version: PROTOCOL_VERSION_MIN,
            max_version: PROTOCOL_VERSION,
            token,
        };
        let ResponseBody::Handshake { version, .. } = conn.call(&req).await? else {
            return Err(conn.protocol("handshake answered with another response"));
        };
        conn.version = version;
        Ok(conn)
    }

    fn protocol(&self, detail: impl Into<String>) -> ClientError {
        ClientError::Protocol {
            addr: self.addr.clone(),
            detail: detail.into(),
        }
    }

    fn io(&self, source: io::Error) -> ClientError {
        ClientError::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    /// Sends `req`, reads the response frame, and returns its body when it succeeded.
    async fn call(&mut self, req: &Request<'_>) -> Result<ResponseBody<'_>, ClientError> {
        let id = self.send(req).await?;
        self.receive(id).await
    }

    /// Sends `req` without waiting for its answer; returns its request id. Answers
    /// come in the order of the requests ([`Conn::receive`] takes them).
    async fn send(&mut self, req: &Request<'_>) -> Result<u32, ClientError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.out.clear();
        encode_request(&mut self.out, id, req).map_err(ClientError::Encode)?;
        let write = async {
            self.stream.write_all(&self.out).await?;
            if self.tls {
                self.stream.flush().await?;
            }
            Ok::<(), io::Error>(())
        };
        match tokio::time::timeout(self.timeout, write).await {
            Ok(Ok(())) => Ok(id),
            Ok(Err(e)) => Err(self.io(e)),
            Err(_) => Err(self.io(io::ErrorKind::TimedOut.into())),
        }
    }

    /// Reads the next response frame, which must answer request `id`, and returns
    /// its body when it succeeded.
    async fn receive(&mut self, id: u32) -> Result<ResponseBody<'_>, ClientError> {
        match tokio::time::timeout(self.timeout, self.read_frame()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(self.io(io::ErrorKind::TimedOut.into())),
        }
        let resp = match decode_response_version(&self.frame, self.version) {
            Ok(r) => r,
            Err(e) => {
                return Err(ClientError::Protocol {
                    addr: self.addr.clone(),
                    detail: e.to_string(),
                })
            }
        };
        if resp.request_id != id {
            return Err(ClientError::Protocol {
                addr: self.addr.clone(),
                detail: format!("response to request {} for {id}", resp.request_id),
            });
        }
        if !resp.code.is_ok() {
            return Err(ClientError::Refused {
                addr: self.addr.clone(),
                code: resp.code,
                message: resp.message.to_string(),
            });
        }
        resp.body.ok_or_else(|| ClientError::Protocol {
            addr: self.addr.clone(),
            detail: "response without a body".into(),
        })
    }

    async fn read_frame(&mut self) -> Result<(), ClientError> {
        let mut len = [0u8; LEN_FIELD];
        if let Err(e) = self.stream.read_exact(&mut len).await {
            return Err(self.io(e));
        }
        let len =
            check_frame_len(u32::from_be_bytes(len)).map_err(|e| self.protocol(e.to_string()))?;
        self.frame.resize(len, 0);
        if let Err(e) = self.stream.read_exact(&mut self.frame).await {
            return Err(self.io(e));
        }
        Ok(())
    }

    /// Sends one produce request without waiting for its answer; returns its id.
    pub(super) async fn send_produce(
        &mut self,
        topic: &str,
        batch: PartitionBatch<'_>,
    ) -> Result<u32, ClientError> {
        let req = Request::Produce {
            topic,
            partitions: vec![batch],
        };
        self.send(&req).await
    }

    /// The answer to produce request `id` (the oldest not yet answered);
    /// `Err((code, message))` inside when the partition refused.
    pub(super) async fn receive_produce(
        &mut self,
        id: u32,
    ) -> Result<Result<(), (crate::format::wire::ErrorCode, String)>, ClientError> {
        let body = self.receive(id).await?;
        let ResponseBody::Produce { partitions } = body else {
            return Err(self.protocol("produce answered with another response"));
        };
        match partitions.first() {
            Some(a) if a.code.is_ok() => Ok(Ok(())),
            Some(a) => Ok(Err((a.code, a.message.to_string()))),
            None => Err(self.protocol("produce response without its partition")),
        }
    }

    /// A new idempotent producer: (producer_id, epoch).
    pub(super) async fn init_producer(&mut self) -> Result<(u64, u16), ClientError> {
        let req = Request::Producer(ProducerRequest::InitProducer {
            producer_id: -1,
            epoch: 0,
        });
        match self.call(&req).await? {
            ResponseBody::InitProducer { producer_id, epoch } => Ok((producer_id, epoch)),
            _ => Err(self.protocol("init producer answered with another response")),
        }
    }

    /// Sends one idempotent produce request, with its batch's base sequence, without
    /// waiting for its answer ([`Conn::receive_produce`]); returns its id.
    pub(super) async fn send_produce_idempotent(
        &mut self,
        topic: &str,
        (producer_id, epoch): (u64, u16),
        base_sequence: i32,
        batch: PartitionBatch<'_>,
    ) -> Result<u32, ClientError> {
        let req = Request::Producer(ProducerRequest::Produce {
            topic,
            producer_id,
            epoch,
            partitions: vec![(base_sequence, batch)],
        });
        self.send(&req).await
    }

    /// Fetches without waiting; checks every record's CRC and counts those in
    /// `offset..end`.
    pub(super) async fn fetch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        end: u64,
    ) -> Result<Fetched, ClientError> {
        let req = Request::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms: 0,
        };
        let addr = self.addr.clone();
        let body = self.call(&req).await?;
        let ResponseBody::Fetch { chunks, .. } = body else {
            return Err(ClientError::Protocol {
                addr,
                detail: "fetch answered with another response".into(),
            });
        };
        let mut fetched = Fetched {
            records: 0,
            last_offset: None,
        };
        for chunk in &chunks {
            let mut pos = 0usize;
            while let Some(rest) = chunk.bytes.get(pos..).filter(|r| !r.is_empty()) {
                let r = decode_record(rest, pos as u64, chunk.generation).map_err(|source| {
                    ClientError::BadRecord {
                        addr: addr.clone(),
                        topic: topic.to_string(),
                        partition,
                        generation: chunk.generation,
                        source,
                    }
                })?;
                pos += r.encoded_len;
                fetched.last_offset = Some(r.offset);
                fetched.records += u64::from(r.offset >= offset && r.offset < end);
            }
        }
        Ok(fetched)
    }
}
