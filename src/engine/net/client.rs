//! The blocking client: one TCP connection to a broker, one request in flight at a
//! time. `connect` performs the version handshake; every fetched record's CRC is
//! checked end to end with [`crate::format::decode_record`] before it is returned.
//!
//! Invariants: a response is accepted only when its request id and api key match the
//! request; after an error that closes the connection (or any I/O or protocol error)
//! the client refuses further requests instead of reading a desynchronised stream.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::format::wire::{
    self as wire, check_frame_len, decode_response_version, encode_request, ApiKey, CleanupInfo,
    ErrorCode, PartitionBatch, PartitionDescription, PartitionHealth, PartitionOffsets,
    ProtocolError, Request, Response, ResponseBody, StatsBody, LEN_FIELD, PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
};
use crate::format::{crc32, decode_record, RecordError};

/// Default broker address when neither `--broker` nor `SEGLOG_BROKER` is given.
pub const DEFAULT_BROKER: &str = "127.0.0.1:9494";

/// Largest frame the client reads before allocating in steps as bytes arrive.
const READ_RESERVE_BYTES: usize = 1 << 20;

/// The partition a keyed record goes to: CRC-32/ISO-HDLC of the key bytes, modulo
/// the partition count. Stable across runs, clients and versions (docs/PROTOCOL.md).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    crc32(key) % partitions.max(1)
}

/// Why a client call failed. Every message names the broker address.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("cannot connect to the broker at {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    /// Every address of a `--broker` list failed to connect; `why` says how (one
    /// reason for all, or each address's).
    #[error("cannot connect to any broker of {}: {why}", addrs.join(", "))]
    ConnectAny { addrs: Vec<String>, why: String },
    #[error("connection to the broker at {addr} failed: {source}")]
    Io { addr: String, source: io::Error },
    #[error("the broker at {addr} sent an invalid response: {detail}")]
    Protocol { addr: String, detail: String },
    /// The address is a cluster node's Raft listener: it answered with a refusal of
    /// the peer protocol.
    #[error(
        "{addr} is a cluster node's Raft listener (serve --raft-listen), not a client \
         listener: give --broker the node's --listen address"
    )]
    RaftListener { addr: String },
    #[error("the broker at {addr} refused the request: {message} [{code}]")]
    Refused {
        addr: String,
        code: ErrorCode,
        message: String,
    },
    #[error("invalid record from {addr} in {topic}/{partition} (fetched chunk of generation {generation}): {source}")]
    BadRecord {
        addr: String,
        topic: String,
        partition: u32,
        generation: u64,
        source: RecordError,
    },
    #[error("cannot encode the request: {0}")]
    Encode(ProtocolError),
    #[error("the connection to the broker at {addr} is closed after an earlier error")]
    Closed { addr: String },
    /// The socket's read (or write) timeout ran out: the broker took the connection
    /// but did not answer in time.
    #[error("no answer from the broker at {addr} within {waited:?} ({flag})")]
    Timeout {
        addr: String,
        waited: Duration,
        /// The flag that set the wait: `--timeout`, or `--connect-timeout` for a
        /// connection's setup.
        flag: &'static str,
    },
    #[error("TLS handshake with the broker at {addr} failed: {source}{hint}")]
    Tls {
        addr: String,
        source: io::Error,
        hint: &'static str,
    },
}

impl ClientError {
    /// Whether the connection was lost or never made (unreachable, reset, timed
    /// out, closed), as opposed to an answer: a client of a cluster tries the
    /// request again elsewhere.
    pub fn is_lost_connection(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::ConnectAny { .. }
                | ClientError::Io { .. }
                | ClientError::Timeout { .. }
                | ClientError::Closed { .. }
        )
    }

    /// The error of a `--broker` list none of whose addresses answered, from each
    /// address's error in list order: a [`ClientError::ConnectAny`] naming every
    /// address when they all failed to connect (one reason when they share it),
    /// else the last error that is not a failure to connect (it says more), else
    /// the one error there is.
    pub fn of_all(mut errors: Vec<ClientError>) -> Option<ClientError> {
        if errors.len() <= 1 {
            return errors.pop();
        }
        if let Some(i) = errors
            .iter()
            .rposition(|e| !matches!(e, ClientError::Connect { .. }))
        {
            return Some(errors.swap_remove(i));
        }
        let mut addrs = Vec::new();
        let mut reasons = Vec::new();
        for e in errors {
            if let ClientError::Connect { addr, source } = e {
                reasons.push((addr.clone(), source.to_string()));
                addrs.push(addr);
            }
        }
        let why = if reasons.iter().all(|(_, r)| *r == reasons[0].1) {
            reasons[0].1.clone()
        } else {
            reasons
                .iter()
                .map(|(a, r)| format!("{a}: {r}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        Some(ClientError::ConnectAny { addrs, why })
    }

    /// The broker's error code, when the broker refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The outcome of one partition of a produce request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub partition: u32,
    /// `(base_offset, last_offset)`, or the broker's error for this partition.
    pub result: Result<(u64, u64), (ErrorCode, String)>,
}

/// One fetched record, its CRC checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// What a fetch returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub start_offset: u64,
    /// Next durable offset of the partition when the broker answered.
    pub end_offset: u64,
    /// Records at or after the requested offset, in offset order.
    pub records: Vec<Record>,
    /// Bytes of record data received.
    pub bytes: usize,
}

/// A topic's description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    pub partitions: Vec<PartitionDescription>,
    /// What background cleanup did per partition (empty from a version-1 broker).
    pub cleanup: Vec<CleanupInfo>,
    /// Per partition: records present and the state of its data (empty from a broker
    /// older than protocol version 3).
    pub health: Vec<PartitionHealth>,
    /// The full configuration as `(key, value)` text.
    pub config: Vec<(String, String)>,
}

/// A client's connection: plain TCP or TLS over it.
#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    Tls(super::tls::BlockingTls),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// Why a TLS handshake failed, in a few words an operator can act on.
pub fn tls_hint(e: &io::Error) -> &'static str {
    let text = e.to_string();
    if text.contains("NotValidForName") || text.contains("not valid for name") {
        " (the broker's certificate does not name the host of --broker: connect by a name \
         or address the certificate lists)"
    } else if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") {
        " (is --tls-ca the CA that signed the broker's certificate?)"
    } else if text.contains("CertificateRequired") || text.contains("certificate required") {
        " (the broker requires a client certificate: --tls-cert and --tls-key)"
    } else if text.contains("corrupt message") || text.contains("InvalidContentType") {
        " (the broker answered in plaintext: it serves no TLS on this port, or refused the \
         connection at a connection limit)"
    } else {
        ""
    }
}

/// A connection to a broker.
#[derive(Debug)]
pub struct Client {
    stream: Stream,
    addr: String,
    timeout: Duration,
    next_id: u32,
    version: u16,
    broken: bool,
    out: Vec<u8>,
    frame: Vec<u8>,
}

impl Drop for Client {
    /// Ends a TLS session with close_notify, so the broker sees a clean close rather
    /// than a truncated stream. Best effort, within the write timeout; nothing is
    /// read back.
    fn drop(&mut self) {
        if let Stream::Tls(s) = &mut self.stream {
            s.conn.send_close_notify();
            while s.conn.wants_write() {
                if s.conn.write_tls(&mut s.sock).is_err() {
                    break;
                }
            }
        }
    }
}

/// Longest a connection's setup (TCP connect, TLS, the version handshake) takes by
/// default, however long the request timeout is (as Kafka clients'
/// `socket.connection.setup.timeout.ms`): a broker that accepts connections but
/// does not answer costs this much before the next address is tried.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

impl Client {
    /// Connects to `addr` (host:port), waiting at most `timeout` for each response
    /// (and for the connection's setup, at most [`CONNECT_TIMEOUT_DEFAULT`]), and
    /// performs the version handshake.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Client, ClientError> {
        Client::connect_with(addr, timeout, None, None)
    }

    /// [`Client::connect`], logging in with an API key token in the handshake.
    pub fn connect_with_token(
        addr: &str,
        timeout: Duration,
        token: Option<&str>,
    ) -> Result<Client, ClientError> {
        Client::connect_with(addr, timeout, None, token)
    }

    /// [`Client::connect`], over TLS when `tls` is given, logging in with `token` when
    /// one is given. The connection's setup (TCP connect, TLS, the version
    /// handshake) takes at most [`CONNECT_TIMEOUT_DEFAULT`] or `timeout`, whichever is
    /// shorter.
    pub fn connect_with(
        addr: &str,
        timeout: Duration,
        tls: Option<&super::tls::ClientTls>,
        token: Option<&str>,
    ) -> Result<Client, ClientError> {
        Client::connect_within(addr, CONNECT_TIMEOUT_DEFAULT, timeout, tls, token)
    }

    /// [`Client::connect_with`] whose setup (TCP connect, TLS, the version
    /// handshake) takes at most `setup` (or `timeout`, if shorter); each later
    /// response is waited for `timeout`. A broker that accepts connections but does
    /// not answer (a paused process) then costs `setup` before a caller tries the
    /// next address, not a whole request timeout.
    pub fn connect_within(
        addr: &str,
        setup: Duration,
        timeout: Duration,
        tls: Option<&super::tls::ClientTls>,
        token: Option<&str>,
    ) -> Result<Client, ClientError> {
        let mut client = match Client::connect_setup(addr, setup.min(timeout), tls, token) {
            Ok(c) => c,
            Err(ClientError::Timeout { addr, waited, .. }) if setup < timeout => {
                return Err(ClientError::Timeout {
                    addr,
                    waited,
                    flag: "--connect-timeout",
                })
            }
            Err(e) => return Err(e),
        };
        client.set_timeout(timeout);
        Ok(client)
    }

    /// The TCP connection and the handshake, each waited for `timeout`.
    fn connect_setup(
        addr: &str,
        timeout: Duration,
        tls: Option<&super::tls::ClientTls>,
        token: Option<&str>,
    ) -> Result<Client, ClientError> {
        let err = |source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        };
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(err)?.collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing");
        let timeout = timeout.max(Duration::from_millis(1));
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let stream = stream.ok_or_else(|| err(last))?;
        Client::over_stream(stream, addr, timeout, tls, token)
    }

    /// Performs the handshake (over TLS when `tls` is given, with `token` if given) on
    /// a connected stream (a caller that binds its own source address).
    pub fn over_stream(
        stream: TcpStream,
        addr: &str,
        timeout: Duration,
        tls: Option<&super::tls::ClientTls>,
        token: Option<&str>,
    ) -> Result<Client, ClientError> {
        let err = |source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        };
        let timeout = timeout.max(Duration::from_millis(1));
        stream.set_nodelay(true).map_err(err)?;
        stream.set_write_timeout(Some(timeout)).map_err(err)?;
        let stream = match tls {
            None => Stream::Plain(stream),
            Some(tls) => {
                stream.set_read_timeout(Some(timeout)).map_err(err)?;
                let s = tls
                    .wrap_blocking(addr, stream)
                    .map_err(|source| ClientError::Tls {
                        addr: addr.to_string(),
                        hint: tls_hint(&source),
                        source,
                    })?;
                Stream::Tls(s)
            }
        };
        let mut client = Client {
            stream,
            addr: addr.to_string(),
            timeout,
            next_id: 1,
            version: 0,
            broken: false,
            out: Vec::new(),
            frame: Vec::new(),
        };
        let req = Request::Handshake {
            min_version: PROTOCOL_VERSION_MIN,
            max_version: PROTOCOL_VERSION,
            token,
        };
        let answer = client.call(&req, Duration::ZERO);
        let answer = match answer {
            // A TLS 1.3 server refuses a client certificate after the handshake; the
            // first read shows it.
            Err(ClientError::Io { addr, source })
                if tls.is_some() && source.kind() == io::ErrorKind::InvalidData =>
            {
                return Err(ClientError::Tls {
                    addr,
                    hint: tls_hint(&source),
                    source,
                })
            }
            other => other?,
        };
        match answer {
            ResponseBody::Handshake { version, .. } => client.version = version,
            _ => return Err(client.protocol("handshake answered with another response")),
        }
        Ok(client)
    }

    /// Waits `timeout` for each later response (and each write).
    fn set_timeout(&mut self, timeout: Duration) {
        let timeout = timeout.max(Duration::from_millis(1));
        self.timeout = timeout;
        // A failure leaves the setup's shorter write timeout: a slow write then
        // fails sooner, nothing worse.
        let _ = self.stream.tcp().set_write_timeout(Some(timeout));
    }

    /// The broker address as given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The protocol version agreed in the handshake.
    pub fn version(&self) -> u16 {
        self.version
    }

    pub(super) fn protocol(&mut self, detail: impl Into<String>) -> ClientError {
        self.broken = true;
        ClientError::Protocol {
            addr: self.addr.clone(),
            detail: detail.into(),
        }
    }

    /// A failed read or write; the connection is not used again. With a timeout on
    /// the socket, `WouldBlock` (EAGAIN) and `TimedOut` mean the broker did not answer
    /// within `waited`.
    fn io(&mut self, source: io::Error, waited: Duration) -> ClientError {
        self.broken = true;
        if matches!(
            source.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            return ClientError::Timeout {
                addr: self.addr.clone(),
                waited,
                flag: "--timeout",
            };
        }
        ClientError::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    /// Sends a request and reads its response frame into `self.frame`. `extra_wait`
    /// is added to the read timeout (a long-polling fetch).
    fn round_trip(&mut self, req: &Request<'_>, extra_wait: Duration) -> Result<u32, ClientError> {
        if self.broken {
            return Err(ClientError::Closed {
                addr: self.addr.clone(),
            });
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.out.clear();
        encode_request(&mut self.out, id, req).map_err(ClientError::Encode)?;
        let wait = self.timeout + extra_wait;
        if let Err(e) = self.stream.tcp().set_read_timeout(Some(wait)) {
            return Err(self.io(e, wait));
        }
        if let Err(e) = self
            .stream
            .write_all(&self.out)
            .and_then(|()| self.stream.flush())
        {
            return Err(self.io(e, self.timeout));
        }
        if let Err(e) = read_frame(&mut self.stream, &mut self.frame) {
            return Err(match e {
                ReadError::Io(e) => self.io(e, wait),
                ReadError::Protocol(p) => self.protocol(p.to_string()),
            });
        }
        Ok(id)
    }

    /// Sends `req` and returns the body of a successful response.
    pub(super) fn call(
        &mut self,
        req: &Request<'_>,
        extra_wait: Duration,
    ) -> Result<ResponseBody<'_>, ClientError> {
        let id = self.round_trip(req, extra_wait)?;
        let api = req.api_key();
        // Decode once to check the head; a successful body is decoded again below
        // with the borrow tied to the returned value.
        let version = self.version.max(PROTOCOL_VERSION_MIN);
        let (code, message, head_ok) = match decode_response_version(&self.frame, version) {
            Ok(resp) => (
                resp.code,
                resp.message.to_string(),
                check_head(&resp, id, api),
            ),
            Err(e) => {
                let raft = matches!(
                    crate::format::wire::raft::decode_peer_frame(&self.frame),
                    Ok(crate::format::wire::raft::PeerFrame::Refuse { .. })
                );
                if raft {
                    self.broken = true;
                    return Err(ClientError::RaftListener {
                        addr: self.addr.clone(),
                    });
                }
                return Err(self.protocol(e.to_string()));
            }
        };
        if !code.is_ok() {
            if code.closes_connection() {
                self.broken = true;
            } else if let Err(detail) = head_ok {
                return Err(self.protocol(detail));
            }
            return Err(ClientError::Refused {
                addr: self.addr.clone(),
                code,
                message,
            });
        }
        if let Err(detail) = head_ok {
            return Err(self.protocol(detail));
        }
        match decode_response_version(&self.frame, version) {
            Ok(Response {
                body: Some(body), ..
            }) => Ok(body),
            _ => Err(ClientError::Protocol {
                addr: self.addr.clone(),
                detail: "response without a body".into(),
            }),
        }
    }

    /// Appends records to one or more partitions. Each partition succeeds or fails
    /// on its own; an `Err` means the request as a whole failed.
    pub fn produce(
        &mut self,
        topic: &str,
        batches: Vec<PartitionBatch<'_>>,
    ) -> Result<Vec<Ack>, ClientError> {
        let sent: Vec<u32> = batches.iter().map(|b| b.partition).collect();
        let body = self.call(
            &Request::Produce {
                topic,
                partitions: batches,
            },
            Duration::ZERO,
        )?;
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

    /// Fetches records of `topic`/`partition` from `offset`, waiting up to `max_wait`
    /// for durable records to appear. Every record's CRC is checked; records before
    /// `offset` (the head of a segment's index window) are dropped.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<Fetched, ClientError> {
        let max_wait_ms = u32::try_from(max_wait.as_millis())
            .unwrap_or(u32::MAX)
            .min(wire::FETCH_WAIT_MS_MAX);
        let max_bytes = max_bytes.clamp(1, wire::FETCH_BYTES_MAX);
        let req = Request::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms,
        };
        let addr = self.addr.clone();
        let body = self.call(&req, Duration::from_millis(u64::from(max_wait_ms)))?;
        let ResponseBody::Fetch {
            start_offset,
            end_offset,
            chunks,
        } = body
        else {
            return Err(self.protocol("fetch answered with another response"));
        };
        let mut records = Vec::new();
        let mut bytes = 0;
        let mut last: Option<u64> = None;
        let mut order_error = None;
        for chunk in &chunks {
            let mut pos = 0usize;
            bytes += chunk.bytes.len();
            while let Some(rest) = chunk.bytes.get(pos..).filter(|r| !r.is_empty()) {
                let bad = |source| ClientError::BadRecord {
                    addr: addr.clone(),
                    topic: topic.to_string(),
                    partition,
                    generation: chunk.generation,
                    source,
                };
                let r = decode_record(rest, pos as u64, chunk.generation).map_err(bad)?;
                pos += r.encoded_len;
                if last.is_some_and(|l| r.offset <= l) {
                    order_error = Some(format!(
                        "offset {} follows offset {:?} in a fetch of {topic}/{partition}",
                        r.offset, last
                    ));
                    break;
                }
                last = Some(r.offset);
                if r.offset >= offset {
                    records.push(Record {
                        offset: r.offset,
                        timestamp_ms: r.timestamp_ms,
                        key: r.key.map(<[u8]>::to_vec),
                        value: r.value.to_vec(),
                    });
                }
            }
        }
        if let Some(detail) = order_error {
            return Err(self.protocol(detail));
        }
        Ok(Fetched {
            start_offset,
            end_offset,
            records,
            bytes,
        })
    }

    /// The broker's view of its cluster, as JSON (protocol version 3).
    pub fn cluster_status(&mut self) -> Result<String, ClientError> {
        match self.call(&Request::ClusterStatus, Duration::ZERO)? {
            ResponseBody::ClusterStatus { json } => Ok(json.to_string()),
            _ => Err(self.protocol("cluster status answered with another response")),
        }
    }

    /// Start and end offsets of every partition of `topic`, in partition order.
    pub fn list_offsets(&mut self, topic: &str) -> Result<Vec<PartitionOffsets>, ClientError> {
        match self.call(&Request::ListOffsets { topic }, Duration::ZERO)? {
            ResponseBody::ListOffsets { partitions } => Ok(partitions),
            _ => Err(self.protocol("list_offsets answered with another response")),
        }
    }

    pub fn create_topic(
        &mut self,
        topic: &str,
        partitions: u32,
        settings: &[(String, String)],
    ) -> Result<(), ClientError> {
        let settings = settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match self.call(
            &Request::CreateTopic {
                topic,
                partitions,
                settings,
            },
            Duration::ZERO,
        )? {
            ResponseBody::CreateTopic => Ok(()),
            _ => Err(self.protocol("create_topic answered with another response")),
        }
    }

    pub fn delete_topic(&mut self, topic: &str) -> Result<(), ClientError> {
        match self.call(&Request::DeleteTopic { topic }, Duration::ZERO)? {
            ResponseBody::DeleteTopic => Ok(()),
            _ => Err(self.protocol("delete_topic answered with another response")),
        }
    }

    pub fn list_topics(&mut self) -> Result<Vec<String>, ClientError> {
        match self.call(&Request::ListTopics, Duration::ZERO)? {
            ResponseBody::ListTopics { topics } => {
                Ok(topics.into_iter().map(str::to_string).collect())
            }
            _ => Err(self.protocol("list_topics answered with another response")),
        }
    }

    pub fn describe_topic(&mut self, topic: &str) -> Result<TopicInfo, ClientError> {
        match self.call(&Request::DescribeTopic { topic }, Duration::ZERO)? {
            ResponseBody::DescribeTopic {
                partitions,
                settings,
                cleanup,
                health,
            } => Ok(TopicInfo {
                partitions,
                cleanup: cleanup.unwrap_or_default(),
                health: health.unwrap_or_default(),
                config: owned(&settings),
            }),
            _ => Err(self.protocol("describe_topic answered with another response")),
        }
    }

    /// Changes settings; returns the topic's whole configuration afterwards.
    pub fn alter_topic(
        &mut self,
        topic: &str,
        settings: &[(String, String)],
    ) -> Result<Vec<(String, String)>, ClientError> {
        let settings = settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match self.call(&Request::AlterTopic { topic, settings }, Duration::ZERO)? {
            ResponseBody::AlterTopic { settings } => Ok(owned(&settings)),
            _ => Err(self.protocol("alter_topic answered with another response")),
        }
    }

    /// The broker's counters.
    pub fn stats(&mut self) -> Result<StatsBody, ClientError> {
        match self.call(&Request::Stats, Duration::ZERO)? {
            ResponseBody::Stats(s) => Ok(s),
            _ => Err(self.protocol("stats answered with another response")),
        }
    }
}

/// One version of a topic's schema, as the broker returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaText {
    pub version: u32,
    pub compatibility: String,
    /// The schema as compact JSON text.
    pub schema: String,
}

/// A topic with schemas, in a schema list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaListing {
    pub topic: String,
    pub compatibility: String,
    pub versions: Vec<u32>,
}

/// The schema registry requests (protocol version 3).
impl Client {
    fn schemas_spoken(&self) -> Result<(), ClientError> {
        if self.version >= wire::SCHEMAS_VERSION {
            return Ok(());
        }
        Err(ClientError::Protocol {
            addr: self.addr.clone(),
            detail: format!(
                "the broker speaks protocol version {}; schema requests need {}",
                self.version,
                wire::SCHEMAS_VERSION
            ),
        })
    }

    /// Registers `schema` (JSON text); `compatibility` first becomes the topic's rule.
    /// Returns the version.
    pub fn schema_register(
        &mut self,
        topic: &str,
        compatibility: Option<&str>,
        schema: &str,
    ) -> Result<u32, ClientError> {
        self.schemas_spoken()?;
        let req = Request::SchemaRegister {
            topic,
            compatibility: compatibility.unwrap_or(""),
            schema,
        };
        match self.call(&req, Duration::ZERO)? {
            ResponseBody::SchemaRegister { version } => Ok(version),
            _ => Err(self.protocol("schema_register answered with another response")),
        }
    }

    /// Version `version` (`None`: the latest) of a topic's schema.
    pub fn schema_get(
        &mut self,
        topic: &str,
        version: Option<u32>,
    ) -> Result<SchemaText, ClientError> {
        self.schemas_spoken()?;
        let req = Request::SchemaGet {
            topic,
            version: version.unwrap_or(0),
        };
        match self.call(&req, Duration::ZERO)? {
            ResponseBody::SchemaGet {
                version,
                compatibility,
                schema,
            } => Ok(SchemaText {
                version,
                compatibility: compatibility.to_string(),
                schema: schema.to_string(),
            }),
            _ => Err(self.protocol("schema_get answered with another response")),
        }
    }

    /// Every topic with schemas.
    pub fn schema_list(&mut self) -> Result<Vec<SchemaListing>, ClientError> {
        self.schemas_spoken()?;
        match self.call(&Request::SchemaList, Duration::ZERO)? {
            ResponseBody::SchemaList { topics } => Ok(topics
                .into_iter()
                .map(|t| SchemaListing {
                    topic: t.topic.to_string(),
                    compatibility: t.compatibility.to_string(),
                    versions: t.versions,
                })
                .collect()),
            _ => Err(self.protocol("schema_list answered with another response")),
        }
    }

    /// `None` when `schema` is compatible with the topic's latest version, else why not.
    pub fn schema_check(
        &mut self,
        topic: &str,
        schema: &str,
    ) -> Result<Option<String>, ClientError> {
        self.schemas_spoken()?;
        match self.call(&Request::SchemaCheck { topic, schema }, Duration::ZERO)? {
            ResponseBody::SchemaCheck { compatible, reason } => {
                Ok((!compatible).then(|| reason.to_string()))
            }
            _ => Err(self.protocol("schema_check answered with another response")),
        }
    }

    /// Deletes version `version` (`None`: every version); returns the versions deleted.
    pub fn schema_delete(
        &mut self,
        topic: &str,
        version: Option<u32>,
    ) -> Result<Vec<u32>, ClientError> {
        self.schemas_spoken()?;
        let req = Request::SchemaDelete {
            topic,
            version: version.unwrap_or(0),
        };
        match self.call(&req, Duration::ZERO)? {
            ResponseBody::SchemaDelete { versions } => Ok(versions),
            _ => Err(self.protocol("schema_delete answered with another response")),
        }
    }
}

fn owned(settings: &[(&str, &str)]) -> Vec<(String, String)> {
    settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A response must echo the request id and api key.
fn check_head(resp: &Response<'_>, id: u32, api: ApiKey) -> Result<(), String> {
    if resp.request_id != id {
        return Err(format!(
            "response to request {} while waiting for request {id}",
            resp.request_id
        ));
    }
    if resp.api_key != api as u16 {
        return Err(format!(
            "response api key {} to a {} request",
            resp.api_key,
            api.name()
        ));
    }
    Ok(())
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    Protocol(ProtocolError),
}

/// Reads one frame (the bytes after `frame_len`) into `buf`. The length is checked
/// against the limit first, and the buffer grows only as bytes arrive, so a peer
/// that announces a large frame and sends nothing costs no memory.
pub fn read_frame(stream: &mut impl Read, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    let mut len = [0u8; LEN_FIELD];
    stream.read_exact(&mut len).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => ReadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the broker closed the connection",
        )),
        _ => ReadError::Io(e),
    })?;
    let len = check_frame_len(u32::from_be_bytes(len)).map_err(ReadError::Protocol)?;
    buf.clear();
    buf.reserve(len.min(READ_RESERVE_BYTES));
    let got = stream
        .take(len as u64)
        .read_to_end(buf)
        .map_err(ReadError::Io)?;
    if got != len {
        return Err(ReadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection closed after {got} of {len} frame bytes"),
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hash_is_stable() {
        // CRC-32 of "123456789" is 0xCBF43926 = 3421780262.
        assert_eq!(partition_for_key(b"123456789", 1), 0);
        assert_eq!(partition_for_key(b"123456789", 7), 3_421_780_262 % 7);
        assert_eq!(partition_for_key(b"123456789", 1000), 262);
        assert_eq!(partition_for_key(b"", 4), 0);
        assert_eq!(
            partition_for_key(b"x", 0),
            0,
            "a zero count is treated as one partition"
        );
    }

    #[test]
    fn read_frame_checks_the_length_first() {
        let mut buf = Vec::new();
        let mut big = &[0xffu8, 0xff, 0xff, 0xff][..];
        assert!(matches!(
            read_frame(&mut big, &mut buf),
            Err(ReadError::Protocol(_))
        ));
        assert!(
            buf.capacity() == 0,
            "nothing allocated for a refused length"
        );
        let mut short = &[0u8, 0, 0, 8, 1, 2, 3][..];
        assert!(matches!(
            read_frame(&mut short, &mut buf),
            Err(ReadError::Io(_))
        ));
        let mut ok = &[0u8, 0, 0, 6, 1, 2, 3, 4, 5, 6, 9][..];
        assert!(read_frame(&mut ok, &mut buf).is_ok());
        assert_eq!(buf, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn tls_hints_name_what_to_check() {
        let refused = |e: rustls::Error| tls_hint(&io::Error::new(io::ErrorKind::InvalidData, e));
        let name = refused(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName,
        ));
        assert!(name.contains("does not name the host"), "{name}");
        assert!(!name.contains("--tls-ca"), "{name}");
        let issuer = refused(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        assert!(issuer.contains("--tls-ca"), "{issuer}");
    }

    #[test]
    fn unreachable_broker_names_the_address() {
        // Port 1 on loopback: nothing listens there in a test environment.
        let e = Client::connect("127.0.0.1:1", Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, ClientError::Connect { .. }));
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
        let e = Client::connect("no-such-host.invalid:9494", Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().contains("no-such-host.invalid:9494"), "{e}");
    }

    #[test]
    fn a_list_of_unreachable_brokers_names_every_address() {
        let refused = |addr: &str, kind: io::ErrorKind| ClientError::Connect {
            addr: addr.to_string(),
            source: io::Error::from(kind),
        };
        let same = ClientError::of_all(vec![
            refused("h:1", io::ErrorKind::ConnectionRefused),
            refused("h:2", io::ErrorKind::ConnectionRefused),
        ])
        .unwrap();
        assert_eq!(
            same.to_string(),
            "cannot connect to any broker of h:1, h:2: connection refused"
        );
        let mixed = ClientError::of_all(vec![
            refused("h:1", io::ErrorKind::ConnectionRefused),
            refused("h:2", io::ErrorKind::TimedOut),
        ])
        .unwrap();
        assert_eq!(
            mixed.to_string(),
            "cannot connect to any broker of h:1, h:2: h:1: connection refused; h:2: timed out"
        );
        // One address: as before. A broker that answered but failed otherwise says more.
        let one = ClientError::of_all(vec![refused("h:1", io::ErrorKind::ConnectionRefused)]);
        assert!(matches!(one, Some(ClientError::Connect { .. })));
        let other = ClientError::of_all(vec![
            ClientError::Closed { addr: "h:1".into() },
            refused("h:2", io::ErrorKind::ConnectionRefused),
        ]);
        assert!(matches!(other, Some(ClientError::Closed { .. })));
        assert!(ClientError::of_all(Vec::new()).is_none());
    }
}

#[cfg(test)]
mod fake_server_tests {
    use std::net::TcpListener;
    use std::thread;

    use super::*;
    use crate::format::encode_record;
    use crate::format::wire::{decode_request, encode_response, Chunk};

    /// A one-connection server that answers the handshake, then one request with
    /// `answer(request_id)`.
    fn fake(answer: impl FnOnce(u32) -> Vec<u8> + Send + 'static) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = Vec::new();
            read_frame(&mut s, &mut buf).map_err(|_| "read").unwrap();
            let (id, _) = decode_request(&buf).unwrap();
            let mut out = Vec::new();
            let body = ResponseBody::Handshake {
                version: 1,
                frame_bytes_max: wire::FRAME_BYTES_MAX,
            };
            encode_response(&mut out, id, 0, ErrorCode::NONE, "", Some(&body)).unwrap();
            s.write_all(&out).unwrap();
            read_frame(&mut s, &mut buf).map_err(|_| "read").unwrap();
            let (id, _) = decode_request(&buf).unwrap();
            s.write_all(&answer(id)).unwrap();
        });
        addr
    }

    fn fetch_answer(id: u32, generation: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let body = ResponseBody::Fetch {
            start_offset: 0,
            end_offset: 3,
            chunks: vec![Chunk { generation, bytes }],
        };
        encode_response(
            &mut out,
            id,
            ApiKey::Fetch as u16,
            ErrorCode::NONE,
            "",
            Some(&body),
        )
        .unwrap();
        out
    }

    fn records(generation: u64) -> Vec<u8> {
        let mut b = Vec::new();
        for (o, v) in [(0u64, &b"zero"[..]), (1, b"one"), (2, b"two")] {
            encode_record(&mut b, o, 5, Some(b"k"), v, generation).unwrap();
        }
        b
    }

    fn fetch(addr: &str, offset: u64) -> Result<Fetched, ClientError> {
        let mut c = Client::connect(addr, Duration::from_secs(30))?;
        c.fetch("t", 0, offset, 1 << 20, Duration::ZERO)
    }

    #[test]
    fn fetched_records_are_checked_and_trimmed_to_the_offset() {
        let addr = fake(|id| fetch_answer(id, 9, &records(9)));
        let f = fetch(&addr, 1).unwrap();
        let got: Vec<(u64, &[u8])> = f
            .records
            .iter()
            .map(|r| (r.offset, r.value.as_slice()))
            .collect();
        assert_eq!(got, [(1, &b"one"[..]), (2, b"two")]);
    }

    #[test]
    fn a_flipped_byte_fails_the_crc_end_to_end() {
        let mut bytes = records(9);
        let last = bytes.len() - 6;
        bytes[last] ^= 0x20;
        let addr = fake(move |id| fetch_answer(id, 9, &bytes));
        let e = fetch(&addr, 0).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::BadRecord {
                    source: RecordError::CrcMismatch { .. },
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn the_wrong_generation_fails_the_crc() {
        let addr = fake(|id| fetch_answer(id, 8, &records(9)));
        assert!(matches!(
            fetch(&addr, 0),
            Err(ClientError::BadRecord { .. })
        ));
    }

    #[test]
    fn a_torn_chunk_is_refused() {
        let mut bytes = records(0);
        bytes.truncate(bytes.len() - 1);
        let addr = fake(move |id| fetch_answer(id, 0, &bytes));
        let e = fetch(&addr, 0).unwrap_err();
        assert!(
            matches!(
                e,
                ClientError::BadRecord {
                    source: RecordError::Truncated { .. },
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_broker_that_stops_answering_is_a_timeout() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // Answers the handshake, then reads the request and says nothing until told.
        let addr = fake(move |_| {
            let _ = rx.recv();
            Vec::new()
        });
        let mut c = Client::connect(&addr, Duration::from_millis(300)).unwrap();
        let e = c.list_topics().unwrap_err();
        tx.send(()).unwrap();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("no answer from the broker at {addr} within 300ms (--timeout)")
        );
        assert!(matches!(c.list_topics(), Err(ClientError::Closed { .. })));
    }

    #[test]
    fn a_response_to_another_request_is_a_protocol_error() {
        let addr = fake(|id| fetch_answer(id + 1, 0, &records(0)));
        assert!(matches!(fetch(&addr, 0), Err(ClientError::Protocol { .. })));
    }
}
