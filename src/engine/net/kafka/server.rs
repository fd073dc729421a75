//! The Kafka listener: accepts connections and runs each one's request loop on the
//! runtime of the native listener (see [`crate::engine::net::server::Server::run_with`]).
//!
//! A connection reads one frame at a time, answers it, then reads the next: Kafka
//! answers the requests of a connection in order, and one in flight at a time keeps
//! that order without a queue. The exception is a client that sends requests ahead
//! of their answers: its plain produce requests are appended as soon as they are
//! whole in the read buffer, and their answers (futures that end once the records
//! are durable) go out in request order, at most [`PIPELINE_DEPTH_MAX`] outstanding;
//! any other request waits for them (`Connection::pipeline_step`). Frames are read
//! after their length is checked against
//! [`REQUEST_BYTES_MAX`], into a buffer grown in steps as bytes arrive. A frame that
//! does not decode, or asks for an API or version not served, is logged and the
//! connection closed (ApiVersions answers with its error first).
//!
//! TLS and logins: with [`ServerTls`] set ([`KafkaServer::with_tls`]) a connection
//! whose first byte is not a TLS ClientHello is logged and closed (Kafka clients
//! cannot read an error frame there) unless plaintext is allowed. While the broker
//! requires a login, a connection must authenticate with SASL PLAIN
//! ([`super::sasl`]) before any request other than ApiVersions, SaslHandshake and
//! SaslAuthenticate; any other request first closes the connection with a log line,
//! as Kafka does on its SASL listeners. After a login every request is checked
//! against the key ([`super::acl`]).
//!
//! Stopping: the accept loop ends, each connection finishes the request it serves
//! and closes at the next frame boundary; [`KafkaServer::serve`] returns once every
//! connection task has ended.

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesOrdered, StreamExt};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio::task::JoinSet;

use super::sasl::SaslState;
use super::{
    api_versions_body, code, decode_request, encode_response, DecodeError, LEN_FIELD,
    REQUEST_BYTES_MAX,
};
use crate::engine::broker::Broker;
use crate::engine::net::limits::{ConnectionGate, Limits};
use crate::engine::net::metrics::NetMetrics;
use crate::engine::net::tls::{Accepted, ServerTls, Stream};
use crate::engine::replication::Replicator;

/// How often waiting loops look at the stop flags.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Step by which a large frame's buffer grows while its bytes arrive.
const READ_STEP_BYTES: usize = 1 << 20;
/// The read buffer of a connection.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Settings of the Kafka listener.
#[derive(Clone, Debug)]
pub struct KafkaOptions {
    /// Host and port given to clients in Metadata and FindCoordinator.
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Connections served at once; further ones are closed at once (logged).
    pub max_connections: usize,
    /// Longest a peer may stall in the middle of a frame or while a response is sent.
    pub io_timeout: Duration,
    /// Log each closed connection and each error answered.
    pub log_errors: bool,
    /// TLS of the listener (`serve --tls-cert`); `None`: plaintext.
    pub tls: Option<ServerTls>,
    /// The limits shared with the native listener: connections per address, frame
    /// bytes, idle timeout.
    pub limits: Limits,
    /// Where failed logins are counted.
    pub metrics: Option<Arc<NetMetrics>>,
    /// The cluster's replication, on a node started with `--peers`.
    pub replication: Option<Arc<dyn Replicator>>,
}

/// The bound Kafka listener of one broker.
#[derive(Debug)]
pub struct KafkaServer {
    listener: TcpListener,
    local_addr: SocketAddr,
    broker: Arc<Broker>,
    opts: Arc<KafkaOptions>,
    gate: Arc<ConnectionGate>,
}

impl KafkaServer {
    /// Serves on a listener bound already; `advertised` (host:port) defaults to the
    /// bound address.
    pub fn from_listener(
        listener: TcpListener,
        broker: Arc<Broker>,
        advertised: Option<&str>,
        max_connections: usize,
        log_errors: bool,
    ) -> io::Result<KafkaServer> {
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let (advertised_host, advertised_port) = match advertised {
            Some(a) => split_host_port(a).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("advertised address {a:?} is not HOST:PORT"),
                )
            })?,
            None => (local_addr.ip().to_string(), i32::from(local_addr.port())),
        };
        Ok(KafkaServer {
            listener,
            local_addr,
            broker,
            opts: Arc::new(KafkaOptions {
                advertised_host,
                advertised_port,
                max_connections,
                io_timeout: Duration::from_secs(30),
                log_errors,
                tls: None,
                limits: Limits::default(),
                metrics: None,
                replication: None,
            }),
            gate: ConnectionGate::new(Arc::new(AtomicUsize::new(0)), max_connections, usize::MAX),
        })
    }

    /// Serves TLS (and plaintext only where `tls` allows it).
    pub fn with_tls(mut self, tls: Option<ServerTls>) -> KafkaServer {
        Arc::make_mut(&mut self.opts).tls = tls;
        self
    }

    /// Applies the listener limits of `serve` (connections per address, frame bytes,
    /// idle timeout) and its I/O timeout.
    pub fn with_limits(mut self, limits: Limits, io_timeout: Duration) -> KafkaServer {
        let opts = Arc::make_mut(&mut self.opts);
        self.gate = ConnectionGate::new(
            Arc::new(AtomicUsize::new(0)),
            opts.max_connections,
            limits.connections_per_address_max,
        );
        opts.limits = limits;
        opts.io_timeout = io_timeout;
        self
    }

    /// Counts failed logins into `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<NetMetrics>>) -> KafkaServer {
        Arc::make_mut(&mut self.opts).metrics = metrics;
        self
    }

    /// Routes the requests of replicated topics through `replication` (a cluster
    /// node), and names the cluster's nodes in Metadata.
    pub fn with_replication(mut self, replication: Option<Arc<dyn Replicator>>) -> KafkaServer {
        Arc::make_mut(&mut self.opts).replication = replication;
        self
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Accepts and serves until `stop` or `also_stop` is set, then waits for every
    /// connection to finish its request and close. Runs inside a tokio runtime.
    pub async fn serve(&self, stop: Arc<AtomicBool>, also_stop: &AtomicBool) -> io::Result<()> {
        let listener = tokio::net::TcpListener::from_std(self.listener.try_clone()?)?;
        let mut conns = JoinSet::new();
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stopping =
            |s: &AtomicBool| s.load(Ordering::SeqCst) || also_stop.load(Ordering::SeqCst);
        while !stopping(&stop) {
            let accepted = tokio::select! {
                _ = tick.tick() => continue,
                r = listener.accept() => r,
            };
            match accepted {
                Ok((stream, peer)) => {
                    while conns.try_join_next().is_some() {}
                    let admitted = match self.gate.admit(peer) {
                        Ok(a) => a,
                        Err(refusal) => {
                            tracing::warn!(%peer, "kafka: refused a connection: {}",
                                refusal.message());
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let broker = Arc::clone(&self.broker);
                    let opts = Arc::clone(&self.opts);
                    let stop = Arc::clone(&stop);
                    conns.spawn(async move {
                        let _admitted = admitted;
                        let stream = match &opts.tls {
                            None => Stream::Plain(stream),
                            Some(tls) => match tls.accept(stream, opts.io_timeout).await {
                                Accepted::Stream(s) => s,
                                Accepted::Plaintext(_) => {
                                    tracing::warn!(%peer, "kafka: closed a plaintext connection: \
                                        this listener requires TLS (security.protocol=ssl or \
                                        sasl_ssl; serve --allow-plaintext serves both)");
                                    return;
                                }
                                Accepted::Failed(e) => {
                                    tracing::warn!(%peer, error = %e,
                                        "kafka: TLS handshake failed");
                                    return;
                                }
                            },
                        };
                        Connection::new(stream, peer, broker, opts, stop)
                            .serve()
                            .await;
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(listen = %self.local_addr, error = %e, "kafka: accept failed");
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
            }
        }
        stop.store(true, Ordering::SeqCst);
        while conns.join_next().await.is_some() {}
        Ok(())
    }
}

/// A node id as a Kafka broker id (node ids are at most 32767, see `serve --peers`).
pub(crate) fn broker_id(node: u64) -> i32 {
    i32::try_from(node).unwrap_or(i32::MAX)
}

/// `host:port` (IPv6 in brackets) split; the port as Kafka's i32.
pub(crate) fn split_host_port(addr: &str) -> Option<(String, i32)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), i32::from(port)))
}

/// What the request path asks of the connection loop.
pub(crate) enum Outcome {
    /// Send this response body.
    Reply(Box<ResponseKind>),
    /// Send nothing (a produce with acks 0).
    NoReply,
    /// Log this and close the connection.
    Close(String),
    /// Send this response, then log the message and close (a failed login).
    ReplyClose(Box<ResponseKind>, String),
    /// The answer comes later, in request order: a pipelined produce whose commit is
    /// still running (see [`super::produce::produce`]); the `After` is merged into
    /// it then.
    Later(
        Pin<Box<dyn Future<Output = Outcome> + Send>>,
        super::acl::After,
    ),
}

/// An answer being waited for: the outcome, what to merge into it, and the
/// request's api, version and correlation id.
type Pending = Pin<Box<dyn Future<Output = (Outcome, super::acl::After, ApiKey, i16, i32)> + Send>>;

/// Produce requests of one connection appended and not yet answered, at most.
const PIPELINE_DEPTH_MAX: usize = 64;

impl Outcome {
    pub(crate) fn reply(body: ResponseKind) -> Outcome {
        Outcome::Reply(Box::new(body))
    }
}

/// What a request handler sees of its connection.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub broker: Arc<Broker>,
    pub opts: Arc<KafkaOptions>,
    pub stop: Arc<AtomicBool>,
    pub peer: SocketAddr,
}

impl Ctx {
    /// Logs an error answered to the client (not a closed connection).
    pub fn client_error(&self, api: ApiKey, code: i16, msg: &str) {
        if self.opts.log_errors {
            tracing::info!(peer = %self.peer, request = ?api, code, "kafka: client error: {msg}");
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// This broker's id in Metadata and FindCoordinator: [`super::NODE_ID`] alone,
    /// its `--node-id` in a cluster.
    pub fn node_id(&self) -> i32 {
        self.opts
            .replication
            .as_ref()
            .map_or(super::NODE_ID, |r| broker_id(r.node_id()))
    }

    /// The replication of `topic`, when this is a cluster node and the topic is
    /// replicated.
    pub fn replicated(&self, topic: &str) -> Option<&Arc<dyn Replicator>> {
        self.opts
            .replication
            .as_ref()
            .filter(|r| r.is_replicated(topic))
    }

    /// `Err` (NOT_LEADER_OR_FOLLOWER) when `topic` is replicated and this node does
    /// not lead `partition`: reads and writes of a replicated partition are served
    /// by its leader.
    pub fn check_leader(&self, topic: &str, partition: u32) -> Result<(), (i16, String)> {
        match self.replicated(topic) {
            Some(r) => r
                .check_leader(topic, partition)
                .map_err(|(c, msg)| (super::replicated_code(c), msg)),
            None => Ok(()),
        }
    }

    /// Waits until a replicated partition's applied records are durable here, so a
    /// read on its leader sees every acknowledged record ([`Broker::settle`]); at
    /// once for a topic that is not replicated.
    pub async fn settle(&self, topic: &str, partition: u32) -> Result<(), (i16, String)> {
        if self.replicated(topic).is_none() {
            return Ok(());
        }
        self.broker
            .settle(topic, partition)
            .await
            .map_err(|e| (super::engine_code(&e), e.to_string()))
    }
}

/// Why a response was not sent.
enum SendFailure {
    /// The peer closed its end first (reset, broken pipe).
    PeerClosed,
    Failed(io::Error),
    TimedOut,
}

/// True when `e` says the peer closed the connection.
fn peer_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

struct Connection {
    reader: BufReader<ReadHalf<Stream>>,
    writer: WriteHalf<Stream>,
    ctx: Ctx,
    out: BytesMut,
    sasl: SaslState,
    /// The client sent a request before the answer to the one before: its plain
    /// produce requests are pipelined from then on.
    pipelining: bool,
}

impl Connection {
    fn new(
        stream: Stream,
        peer: SocketAddr,
        broker: Arc<Broker>,
        opts: Arc<KafkaOptions>,
        stop: Arc<AtomicBool>,
    ) -> Connection {
        let (r, w) = tokio::io::split(stream);
        Connection {
            reader: BufReader::with_capacity(READ_BUFFER_BYTES, r),
            writer: w,
            ctx: Ctx {
                broker,
                opts,
                stop,
                peer,
            },
            out: BytesMut::new(),
            sasl: SaslState::default(),
            pipelining: false,
        }
    }

    /// Writes `self.out` and flushes it (TLS holds written bytes until a flush).
    async fn send_out(&mut self) -> Result<(), SendFailure> {
        let timeout = self.ctx.opts.io_timeout;
        let sent = tokio::time::timeout(timeout, async {
            self.writer.write_all(&self.out).await?;
            self.writer.flush().await
        })
        .await;
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if peer_closed(&e) => Err(SendFailure::PeerClosed),
            Ok(Err(e)) => Err(SendFailure::Failed(e)),
            Err(_) => Err(SendFailure::TimedOut),
        }
    }

    /// Logs why a response was not sent: a peer that closed its end (a consumer
    /// closed while its long-poll fetch waited) is not a fault, only a debug line.
    fn log_send_failure(&self, failure: SendFailure) {
        match failure {
            SendFailure::PeerClosed => {
                if self.ctx.opts.log_errors {
                    tracing::debug!(
                        peer = %self.ctx.peer,
                        "kafka: the peer closed the connection before its response was sent"
                    );
                }
            }
            SendFailure::Failed(e) => self.log_close(&format!("sending a response failed: {e}")),
            SendFailure::TimedOut => self.log_close(&format!(
                "sending a response timed out (after {}s)",
                self.ctx.opts.io_timeout.as_secs_f64()
            )),
        }
    }

    fn log_close(&self, detail: &str) {
        if self.ctx.opts.log_errors {
            tracing::warn!(peer = %self.ctx.peer, "kafka: closing the connection: {detail}");
        }
    }

    async fn serve(mut self) {
        let mut answers: FuturesOrdered<Pending> = FuturesOrdered::new();
        loop {
            if !answers.is_empty() {
                if self.pipeline_step(&mut answers).await {
                    continue;
                }
                return;
            }
            let frame = match self.read_frame().await {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(detail) => {
                    self.log_close(&detail);
                    return;
                }
            };
            self.pipelining |= !self.reader.buffer().is_empty();
            if self.sasl.expects_raw_token() {
                // After a SaslHandshake v0 the next frame is the bare PLAIN token;
                // success is answered with an empty token, a failure closes.
                match super::sasl::raw_token(&self.ctx, &mut self.sasl, &frame) {
                    Ok(()) => {
                        self.out.clear();
                        self.out.extend_from_slice(&0u32.to_be_bytes());
                        if let Err(f) = self.send_out().await {
                            self.log_send_failure(f);
                            return;
                        }
                        continue;
                    }
                    Err(detail) => {
                        self.log_close(&detail);
                        let _ = self.writer.shutdown().await;
                        return;
                    }
                }
            }
            let (outcome, api, version, id) = self.handle(frame).await;
            if let Outcome::Later(answer, after) = outcome {
                answers.push_back(Box::pin(
                    async move { (answer.await, after, api, version, id) },
                ));
                continue;
            }
            if !self.deliver(outcome, api, version, id).await {
                return;
            }
        }
    }

    /// Sends an outcome; false when the connection is to end.
    async fn deliver(&mut self, outcome: Outcome, api: ApiKey, version: i16, id: i32) -> bool {
        match outcome {
            Outcome::Reply(body) => {
                if let Err(e) = encode_response(&mut self.out, api, version, id, &body) {
                    self.log_close(&e.to_string());
                    return false;
                }
                if let Err(f) = self.send_out().await {
                    self.log_send_failure(f);
                    return false;
                }
                if self.out.capacity() > 4 * READ_STEP_BYTES {
                    self.out = BytesMut::new();
                }
                true
            }
            Outcome::ReplyClose(body, detail) => {
                if encode_response(&mut self.out, api, version, id, &body).is_ok() {
                    let _ = self.send_out().await;
                }
                self.log_close(&detail);
                let _ = self.writer.shutdown().await;
                false
            }
            Outcome::NoReply => true,
            Outcome::Close(detail) => {
                self.log_close(&detail);
                let _ = self.writer.shutdown().await;
                false
            }
            Outcome::Later(answer, after) => {
                let outcome = merged(&self.sasl, answer.await, after);
                Box::pin(self.deliver(outcome, api, version, id)).await
            }
        }
    }

    /// One step of a connection with answers outstanding (a client that pipelines
    /// produce requests): a produce request already whole in the read buffer is
    /// served at once (a plain one is appended and its answer queued behind the
    /// others); otherwise the oldest answer is sent once it is ready, and the buffer
    /// is refilled meanwhile when it is empty. Any other request, or one not yet
    /// whole, waits until every answer before it is sent and is then served as
    /// without pipelining. Returns false when the connection is to end.
    async fn pipeline_step(&mut self, answers: &mut FuturesOrdered<Pending>) -> bool {
        let taking = answers.len() < PIPELINE_DEPTH_MAX
            && !self.ctx.stopping()
            && !self.sasl.expects_raw_token();
        if taking {
            if let Some(frame) = self.buffered_produce() {
                let (outcome, api, version, id) = self.handle(frame).await;
                match outcome {
                    Outcome::Later(answer, after) => answers.push_back(Box::pin(async move {
                        (answer.await, after, api, version, id)
                    })),
                    Outcome::NoReply => {}
                    o @ (Outcome::Close(_) | Outcome::ReplyClose(..)) => {
                        // Every answer before it goes out first, then the close.
                        if self.drain(answers).await {
                            self.deliver(o, api, version, id).await;
                        }
                        return false;
                    }
                    o @ Outcome::Reply(_) => {
                        let nothing = super::acl::After::Nothing;
                        answers.push_back(Box::pin(std::future::ready((
                            o, nothing, api, version, id,
                        ))));
                    }
                }
                return true;
            }
        }
        let refill = taking && self.reader.buffer().is_empty();
        enum Event {
            Answer(Option<(Outcome, super::acl::After, ApiKey, i16, i32)>),
            Filled(io::Result<bool>),
        }
        let event = tokio::select! {
            biased;
            a = answers.next() => Event::Answer(a),
            // `fill_buf` is cancel-safe, and reads only into an empty buffer.
            r = self.reader.fill_buf(), if refill => Event::Filled(r.map(<[u8]>::is_empty)),
        };
        match event {
            Event::Answer(None) | Event::Filled(Ok(false)) => true,
            Event::Answer(Some((outcome, after, api, version, id))) => {
                let outcome = merged(&self.sasl, outcome, after);
                self.deliver(outcome, api, version, id).await
            }
            Event::Filled(Ok(true)) => {
                // The peer is done sending: it still gets every answer owed.
                self.drain(answers).await;
                false
            }
            Event::Filled(Err(e)) => {
                self.log_close(&format!("reading a request failed: {e}"));
                false
            }
        }
    }

    /// Sends every outstanding answer, in order; false when a send failed.
    async fn drain(&mut self, answers: &mut FuturesOrdered<Pending>) -> bool {
        while let Some((outcome, after, api, version, id)) = answers.next().await {
            let outcome = merged(&self.sasl, outcome, after);
            if !self.deliver(outcome, api, version, id).await {
                return false;
            }
        }
        true
    }

    /// The next frame when it is whole in the read buffer and a produce request
    /// (api key 0), taken out of the buffer; `None` otherwise.
    fn buffered_produce(&mut self) -> Option<Bytes> {
        let buf = self.reader.buffer();
        let len: [u8; LEN_FIELD] = buf.get(..LEN_FIELD)?.try_into().ok()?;
        let max = REQUEST_BYTES_MAX.min(self.ctx.opts.limits.frame_bytes_max);
        let len = u32::try_from(i32::from_be_bytes(len))
            .ok()
            .filter(|l| *l <= max)? as usize;
        let body = buf.get(LEN_FIELD..LEN_FIELD + len)?;
        if body.get(..2)? != (ApiKey::Produce as i16).to_be_bytes() {
            return None;
        }
        let frame = Bytes::copy_from_slice(body);
        self.reader.consume(LEN_FIELD + len);
        Some(frame)
    }

    /// Waits at a frame boundary for the next frame; `Ok(None)` when the peer closed
    /// or the server stops.
    async fn read_frame(&mut self) -> Result<Option<Bytes>, String> {
        let idle_since = std::time::Instant::now();
        loop {
            if self.ctx.stopping() {
                return Ok(None);
            }
            if let Some(idle) = self.ctx.opts.limits.idle_timeout {
                if idle_since.elapsed() >= idle {
                    return Err(format!(
                        "no request for {}s (idle timeout)",
                        idle.as_secs_f64()
                    ));
                }
            }
            // `fill_buf` is cancel-safe: a tick loses no bytes.
            let ready = tokio::select! {
                r = self.reader.fill_buf() => Some(r.map(<[u8]>::is_empty)),
                _ = tokio::time::sleep(POLL_INTERVAL) => None,
            };
            match ready {
                None => continue,
                Some(Ok(true)) => return Ok(None),
                Some(Ok(false)) => break,
                // A reset between requests is a close too (a client that closed with
                // a response unread).
                Some(Err(e)) if peer_closed(&e) => return Ok(None),
                Some(Err(e)) => return Err(format!("reading a request failed: {e}")),
            }
        }
        let timeout = self.ctx.opts.io_timeout;
        let mut len = [0u8; LEN_FIELD];
        match tokio::time::timeout(timeout, self.reader.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("reading a request failed: {e}")),
            Err(_) => return Err("peer stalled in a frame's length".into()),
        }
        let len = i32::from_be_bytes(len);
        let max = REQUEST_BYTES_MAX.min(self.ctx.opts.limits.frame_bytes_max);
        let Some(len) = u32::try_from(len).ok().filter(|l| *l <= max) else {
            return Err(format!(
                "request size {len} is outside 0..={max} bytes (frame_bytes_max)"
            ));
        };
        let len = len as usize;
        let mut body = Vec::with_capacity(len.min(READ_STEP_BYTES));
        while body.len() < len {
            let at = body.len();
            body.resize(len.min(at + READ_STEP_BYTES), 0);
            let dst = body.get_mut(at..).unwrap_or(&mut []);
            match tokio::time::timeout(timeout, self.reader.read_exact(dst)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("reading a request failed: {e}")),
                Err(_) => return Err("peer stalled in the middle of a request".into()),
            }
        }
        Ok(Some(Bytes::from(body)))
    }

    /// Decodes and answers one frame: (outcome, api, version, correlation id).
    async fn handle(&mut self, frame: Bytes) -> (Outcome, ApiKey, i16, i32) {
        let d = match decode_request(frame) {
            Ok(d) => d,
            Err(DecodeError::Unsupported {
                api: ApiKey::ApiVersions,
                version,
                correlation_id,
                ..
            }) => {
                // Kafka's rule: a version 0 response with UNSUPPORTED_VERSION and the
                // versions served, so the client retries with one of them.
                self.ctx.client_error(
                    ApiKey::ApiVersions,
                    code::UNSUPPORTED_VERSION,
                    &format!("ApiVersions v{version} asked; answering v0"),
                );
                let body = ResponseKind::ApiVersions(api_versions_body(code::UNSUPPORTED_VERSION));
                return (Outcome::reply(body), ApiKey::ApiVersions, 0, correlation_id);
            }
            Err(e) => {
                let id = e.correlation_id();
                return (Outcome::Close(e.to_string()), ApiKey::ApiVersions, 0, id);
            }
        };
        let (api, version, id) = (d.api, d.version, d.header.correlation_id);
        let client_id = d.header.client_id;
        let ctx = &self.ctx;
        let request = match d.request {
            RequestKind::SaslHandshake(r) => {
                let o = super::sasl::handshake(ctx, &mut self.sasl, r, version);
                return (o, api, version, id);
            }
            RequestKind::SaslAuthenticate(r) => {
                let o = super::sasl::authenticate(ctx, &mut self.sasl, r);
                return (o, api, version, id);
            }
            RequestKind::ApiVersions(_) => {
                let body = ResponseKind::ApiVersions(api_versions_body(code::NONE));
                return (Outcome::reply(body), api, version, id);
            }
            other => other,
        };
        let (request, after) = match super::acl::check(ctx, &mut self.sasl, api, request) {
            super::acl::Checked::Go(request, after) => (request, after),
            super::acl::Checked::Answer(outcome) => return (outcome, api, version, id),
        };
        let outcome = match *request {
            RequestKind::Metadata(r) => super::metadata::metadata(ctx, r, version),
            RequestKind::CreateTopics(r) => super::metadata::create_topics(ctx, r, version).await,
            RequestKind::DeleteTopics(r) => super::metadata::delete_topics(ctx, r, version).await,
            RequestKind::Produce(r) => {
                super::produce::produce(ctx, r, version, self.pipelining).await
            }
            RequestKind::InitProducerId(r) => super::produce::init_producer_id(ctx, r).await,
            RequestKind::Fetch(r) => super::fetch::fetch(ctx, r, version).await,
            RequestKind::ListOffsets(r) => super::offsets::list_offsets(ctx, r, version).await,
            RequestKind::OffsetCommit(r) => super::offsets::offset_commit(ctx, r).await,
            RequestKind::OffsetFetch(r) => super::offsets::offset_fetch(ctx, r, version),
            RequestKind::FindCoordinator(r) => super::groups::find_coordinator(ctx, r),
            RequestKind::JoinGroup(r) => {
                let client_id = client_id
                    .as_ref()
                    .map(kafka_protocol::protocol::StrBytes::as_str);
                super::groups::join(ctx, r, version, client_id).await
            }
            RequestKind::SyncGroup(r) => super::groups::sync(ctx, r).await,
            RequestKind::Heartbeat(r) => super::groups::heartbeat(ctx, r),
            RequestKind::LeaveGroup(r) => super::groups::leave(ctx, r, version),
            RequestKind::ListGroups(_) => super::groups::list(ctx),
            RequestKind::DescribeGroups(r) => super::groups::describe(ctx, r),
            other => Outcome::Close(format!(
                "{:?} v{version} is not served",
                std::mem::discriminant(&other)
            )),
        };
        let outcome = match outcome {
            // Merged once the answer is there.
            Outcome::Later(answer, _) => Outcome::Later(answer, after),
            other => merged(&self.sasl, other, after),
        };
        (outcome, api, version, id)
    }
}

/// `outcome` with what the access check took out of its request merged in; a
/// produce with acks 0 that was refused closes the connection instead (it has no
/// answer to carry the refusal).
fn merged(sasl: &SaslState, outcome: Outcome, after: super::acl::After) -> Outcome {
    match (outcome, after) {
        (Outcome::Reply(mut body), after) => {
            super::acl::merge(sasl, after, &mut body);
            Outcome::Reply(body)
        }
        (Outcome::NoReply, super::acl::After::Produce(parts)) if !parts.is_empty() => {
            let topics: Vec<&str> = parts.iter().map(|(t, _)| t.0.as_str()).collect();
            let what = format!("not authorized for topics {topics:?}");
            Outcome::Close(super::produce::acks_0_failed(&what))
        }
        (other, _) => other,
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use bytes::BufMut;
    use kafka_protocol::messages::{
        ApiVersionsRequest, ApiVersionsResponse, DescribeConfigsRequest, RequestHeader,
        SaslHandshakeRequest, SaslHandshakeResponse,
    };
    use kafka_protocol::protocol::{Decodable, Encodable};

    use super::*;
    use crate::engine::broker::BrokerOptions;
    use crate::engine::storage::io::RealStorage;

    type Started = (
        tempfile::TempDir,
        String,
        Arc<AtomicBool>,
        std::thread::JoinHandle<()>,
    );

    /// A broker with only the Kafka listener, served on a thread.
    fn start() -> Started {
        start_with(None)
    }

    /// [`start`], on a cluster node whose replication is `replication`; topic "r"
    /// exists too.
    fn start_with(replication: Option<Arc<dyn Replicator>>) -> Started {
        let (dir, broker) = broker_with_t();
        if replication.is_some() {
            broker
                .create_topic("r", 2, crate::format::topic::TopicConfig::default())
                .unwrap();
        }
        let (addr, stop, t) = serve_kafka(Arc::clone(&broker), replication);
        let t = std::thread::spawn(move || {
            t.join().unwrap();
            broker.shutdown().unwrap();
        });
        (dir, addr, stop, t)
    }

    /// A broker on a temp dir with topic "t" (one partition).
    fn broker_with_t() -> (tempfile::TempDir, Arc<Broker>) {
        let dir = tempfile::tempdir().unwrap();
        let broker =
            Broker::open(dir.path(), Arc::new(RealStorage), BrokerOptions::default()).unwrap();
        broker
            .create_topic("t", 1, crate::format::topic::TopicConfig::default())
            .unwrap();
        (dir, broker)
    }

    /// The Kafka listener alone on `broker`, served on a thread until the flag is set.
    fn serve_kafka(
        broker: Arc<Broker>,
        replication: Option<Arc<dyn Replicator>>,
    ) -> (String, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let k = KafkaServer::from_listener(l, broker, None, 8, false)
            .unwrap()
            .with_replication(replication);
        let addr = k.local_addr().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let t = std::thread::spawn(move || {
            let rt = crate::engine::net::server::runtime().unwrap();
            rt.block_on(k.serve(s, &AtomicBool::new(false))).unwrap();
        });
        (addr, stop, t)
    }

    fn request(api: ApiKey, version: i16, body: &impl Encodable) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_u32(0);
        RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(9)
            .encode(&mut b, api.request_header_version(version))
            .unwrap();
        body.encode(&mut b, version).unwrap();
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        b.to_vec()
    }

    /// Sends `frame` and reads one response body (after size and correlation id);
    /// `None` when the connection was closed instead.
    fn exchange(addr: &str, frame: &[u8]) -> Option<Bytes> {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(frame).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        assert_eq!(&body[..4], &9i32.to_be_bytes());
        Some(Bytes::from(body).slice(4..))
    }

    /// CreateTopics with `validate_only` answers what the create would: an existing
    /// topic is refused, a new one passes and is not created.
    #[test]
    fn validate_only_create_refuses_an_existing_topic_and_creates_nothing() {
        use kafka_protocol::messages::create_topics_request::CreatableTopic;
        use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse, TopicName};
        let (_dir, addr, stop, t) = start();
        let create = |topic: &str, validate_only: bool| {
            let mut ct = CreateTopicsRequest::default();
            let mut one = CreatableTopic::default();
            one.name = TopicName(crate::engine::net::kafka::sb(topic));
            one.num_partitions = 1;
            one.replication_factor = 1;
            ct.topics = vec![one];
            ct.timeout_ms = 1000;
            ct.validate_only = validate_only;
            let mut body = exchange(&addr, &request(ApiKey::CreateTopics, 5, &ct))
                .unwrap()
                .slice(1..);
            CreateTopicsResponse::decode(&mut body, 5).unwrap().topics[0].error_code
        };
        assert_eq!(create("t", true), code::TOPIC_ALREADY_EXISTS);
        assert_eq!(create("fresh", true), code::NONE);
        assert_eq!(
            create("fresh", true),
            code::NONE,
            "validate_only created it"
        );
        assert_eq!(create("fresh", false), code::NONE);
        assert_eq!(create("fresh", true), code::TOPIC_ALREADY_EXISTS);
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    fn bad_frames_close_and_errors_are_answered() {
        let (_dir, addr, stop, t) = start();
        // A size over the limit closes the connection before anything is read.
        let mut huge = (REQUEST_BYTES_MAX + 1).to_be_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert!(exchange(&addr, &huge).is_none());
        // An API that is not served closes the connection (after a log line).
        let cfg = request(
            ApiKey::DescribeConfigs,
            1,
            &DescribeConfigsRequest::default(),
        );
        assert!(exchange(&addr, &cfg).is_none());
        // A newer ApiVersions is answered in version 0 with UNSUPPORTED_VERSION.
        let mut v4 = request(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
        v4[6..8].copy_from_slice(&4i16.to_be_bytes());
        let mut body = exchange(&addr, &v4).unwrap();
        let r = ApiVersionsResponse::decode(&mut body, 0).unwrap();
        assert_eq!(r.error_code, code::UNSUPPORTED_VERSION);
        assert_eq!(r.api_keys.len(), super::super::SERVED.len());
        // SASL: PLAIN is offered, nothing else.
        let mut sasl = SaslHandshakeRequest::default();
        sasl.mechanism = crate::engine::net::kafka::sb("SCRAM-SHA-256");
        let mut body = exchange(&addr, &request(ApiKey::SaslHandshake, 1, &sasl)).unwrap();
        let r = SaslHandshakeResponse::decode(&mut body, 1).unwrap();
        assert_eq!(r.error_code, code::UNSUPPORTED_SASL_MECHANISM);
        let offered: Vec<&str> = r
            .mechanisms
            .iter()
            .map(kafka_protocol::protocol::StrBytes::as_str)
            .collect();
        assert_eq!(offered, ["PLAIN"]);
        // The listener still serves after all of it.
        let ok = request(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
        let mut body = exchange(&addr, &ok).unwrap();
        assert_eq!(
            ApiVersionsResponse::decode(&mut body, 3)
                .unwrap()
                .error_code,
            0
        );
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    /// A Produce request for topic "t", partition 0, of one gzip batch holding `value`.
    fn produce_gzip(value: Bytes) -> Vec<u8> {
        produce_gzip_to(value, 1, 0)
    }

    /// [`produce_gzip`] with `acks`, to `partition`.
    fn produce_gzip_to(value: Bytes, acks: i16, partition: i32) -> Vec<u8> {
        let compression = kafka_protocol::records::Compression::Gzip;
        produce_request(&[&value], compression, acks, partition)
    }

    /// A Produce request (acks -1) for topic "t", partition 0, of one uncompressed
    /// batch holding `values`.
    fn produce_values(values: &[&[u8]]) -> Vec<u8> {
        produce_request(values, kafka_protocol::records::Compression::None, -1, 0)
    }

    /// A Produce request for topic "t", `partition`, of one batch holding `values`.
    fn produce_request(
        values: &[&[u8]],
        compression: kafka_protocol::records::Compression,
        acks: i16,
        partition: i32,
    ) -> Vec<u8> {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use kafka_protocol::messages::{ProduceRequest, TopicName};
        use kafka_protocol::records::{
            Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
        };
        let records: Vec<Record> = (0i32..)
            .zip(values)
            .map(|(i, v)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i64::from(i),
                sequence: i,
                timestamp: 1000,
                key: None,
                value: Some(Bytes::copy_from_slice(v)),
                headers: Default::default(),
            })
            .collect();
        let mut batch = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut batch, records.iter(), &options).unwrap();
        let mut p = ProduceRequest::default();
        p.acks = acks;
        p.timeout_ms = 30_000;
        let mut part = PartitionProduceData::default();
        part.index = partition;
        part.records = Some(batch.freeze());
        let mut t = TopicProduceData::default();
        t.name = TopicName(crate::engine::net::kafka::sb("t"));
        t.partition_data = vec![part];
        p.topic_data = vec![t];
        request(ApiKey::Produce, 9, &p)
    }

    /// A topic's schema refuses a Kafka produce whole, naming the record, whether the
    /// request is checked on the event loop (a few records) or on the checker threads
    /// (many); a request of valid values is stored.
    #[test]
    fn a_schema_refuses_a_kafka_produce_naming_the_record() {
        let (dir, broker) = broker_with_t();
        broker
            .register_schema(
                "t",
                &serde_json::json!({"type": "object", "required": ["n"],
                    "properties": {"n": {"type": "integer"}}}),
                None,
            )
            .unwrap();
        let (addr, stop, t) = serve_kafka(Arc::clone(&broker), None);
        let n = crate::engine::schemas::OFF_THREAD_RECORDS_MIN + 8;
        for (count, bad) in [(3, 1), (n, n - 3)] {
            let mut values: Vec<&[u8]> = vec![br#"{"n": 1}"#; count];
            values[bad] = br#"{"n": "one"}"#;
            let (code, msg, _) = produce_answer(&addr, &produce_values(&values));
            assert_eq!(code, code::INVALID_RECORD, "{count}: {msg}");
            assert!(
                msg.starts_with(&format!("record {bad} of partition 0 ")) && msg.contains("\"/n\""),
                "{count}: {msg}"
            );
        }
        assert_eq!(broker.offsets("t", 0).unwrap().1, 0, "nothing written");
        let good: Vec<&[u8]> = vec![br#"{"n": 2}"#; n];
        assert_eq!(produce_answer(&addr, &produce_values(&good)).0, code::NONE);
        assert_eq!(broker.offsets("t", 0).unwrap().1, n as u64);
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
        broker.shutdown().unwrap();
        drop(dir);
    }

    /// (error code, error message, base offset) of the one partition answered.
    fn produce_answer(addr: &str, frame: &[u8]) -> (i16, String, i64) {
        use kafka_protocol::messages::ProduceResponse;
        let body = exchange(addr, frame).expect("a produce answer");
        // Response header v1: no tagged fields after the correlation id.
        assert_eq!(body[0], 0);
        let r = ProduceResponse::decode(&mut body.slice(1..), 9).unwrap();
        let p = &r.responses[0].partition_responses[0];
        let msg = p.error_message.as_ref().map(ToString::to_string);
        (p.error_code, msg.unwrap_or_default(), p.base_offset)
    }

    /// A failed produce with acks 0 closes the connection, as Kafka does: that is the
    /// only way its client learns of it. A stored one leaves it open.
    #[test]
    fn a_failed_acks_0_produce_closes_the_connection() {
        let (_dir, addr, stop, t) = start();
        let acks_0 = |partition| produce_gzip_to(Bytes::from_static(b"v"), 0, partition);
        let versions = request(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
        for (partition, open) in [(0, true), (99, false)] {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s.write_all(&acks_0(partition)).unwrap();
            s.write_all(&versions).unwrap();
            let mut len = [0u8; 4];
            let answered = s.read_exact(&mut len).is_ok();
            assert_eq!(answered, open, "partition {partition}");
        }
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    fn a_gzip_bomb_is_refused_and_the_listener_still_serves() {
        use crate::engine::net::kafka::KAFKA_BATCH_INFLATED_BYTES_MAX;
        let (_dir, addr, stop, t) = start();
        // Zeros one MiB past the inflation limit compress to well under 1% of it.
        let zeros = Bytes::from(vec![0u8; KAFKA_BATCH_INFLATED_BYTES_MAX + (1 << 20)]);
        let bomb = produce_gzip(zeros);
        assert!(
            bomb.len() < KAFKA_BATCH_INFLATED_BYTES_MAX / 100,
            "{}",
            bomb.len()
        );
        let (code, msg, _) = produce_answer(&addr, &bomb);
        assert_eq!(code, code::CORRUPT_MESSAGE, "{msg}");
        assert!(msg.contains("KAFKA_BATCH_INFLATED_BYTES_MAX"), "{msg}");
        // A gzip batch within the limit is stored, at the first offset: nothing of the
        // bomb was appended.
        let (code, msg, base) = produce_answer(&addr, &produce_gzip(Bytes::from(vec![0u8; 4096])));
        assert_eq!((code, base), (0, 0), "{msg}");
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    /// Produce requests sent back to back on one connection (as librdkafka sends
    /// them) are appended ahead of their answers and answered in order, several per
    /// group commit; a request of another kind among them is answered in its place.
    #[test]
    fn pipelined_produce_requests_are_answered_in_order_with_one_commit_for_many() {
        use kafka_protocol::messages::ProduceResponse;
        let (_dir, broker) = broker_with_t();
        let (addr, stop, t) = serve_kafka(Arc::clone(&broker), None);
        let fsyncs_before = broker.stats().fsyncs;
        let mut out = Vec::new();
        for i in 0..12 {
            out.extend(produce_gzip(Bytes::from(format!("v{i}"))));
        }
        out.extend(request(
            ApiKey::ApiVersions,
            3,
            &ApiVersionsRequest::default(),
        ));
        for i in 12..16 {
            out.extend(produce_gzip(Bytes::from(format!("v{i}"))));
        }
        let mut c = TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(&out).unwrap();
        let mut read = || {
            let mut len = [0u8; 4];
            c.read_exact(&mut len).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            c.read_exact(&mut body).unwrap();
            Bytes::from(body).slice(4..)
        };
        let mut base_offsets = Vec::new();
        for i in 0..17 {
            let body = read();
            if i == 12 {
                let r = ApiVersionsResponse::decode(&mut body.clone(), 3).unwrap();
                assert_eq!(r.error_code, code::NONE);
                continue;
            }
            assert_eq!(body[0], 0);
            let r = ProduceResponse::decode(&mut body.slice(1..), 9).unwrap();
            let p = &r.responses[0].partition_responses[0];
            assert_eq!(p.error_code, code::NONE, "{p:?}");
            base_offsets.push(p.base_offset);
        }
        assert_eq!(base_offsets, (0..16).collect::<Vec<i64>>());
        // Every record is where its answer said.
        let f = broker.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
        let mut values: Vec<Vec<u8>> = Vec::new();
        for c in &f.chunks {
            let mut pos = 0;
            while let Some(rest) = c.bytes.get(pos..).filter(|r| !r.is_empty()) {
                let r = crate::format::decode_record(rest, pos as u64, c.generation).unwrap();
                pos += r.encoded_len;
                values.push(r.value.to_vec());
            }
        }
        let want: Vec<Vec<u8>> = (0..16).map(|i| format!("v{i}").into_bytes()).collect();
        assert_eq!(values, want);
        // Answered one at a time, the 16 produces would take 16 group commits. How
        // many they share depends on scheduling (more than 8 once, on a loaded machine), so
        // the test asserts only that they share.
        let fsyncs = broker.stats().fsyncs - fsyncs_before;
        assert!(fsyncs < 16, "{fsyncs} fsyncs for 16 pipelined produces");
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
        broker.shutdown().unwrap();
    }

    /// Writes `frame` on `s` and reads one whole response frame (`None`: closed).
    fn send(s: &mut TcpStream, frame: &[u8]) -> Option<Bytes> {
        s.write_all(frame).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).ok()?;
        Some(Bytes::from(body))
    }

    fn plain(token: &str) -> Vec<u8> {
        format!("\0user\0{token}").into_bytes()
    }

    #[test]
    fn sasl_plain_logs_in_with_an_api_key() {
        use kafka_protocol::messages::{
            MetadataRequest, MetadataResponse, SaslAuthenticateRequest, SaslAuthenticateResponse,
        };
        let dir = tempfile::tempdir().unwrap();
        let broker =
            Broker::open(dir.path(), Arc::new(RealStorage), BrokerOptions::default()).unwrap();
        let created = broker
            .keys()
            .create("app", "producer", &["orders".into()], &[])
            .unwrap();
        assert!(broker.keys().required());
        let metrics = Arc::new(NetMetrics::default());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let k = KafkaServer::from_listener(l, Arc::clone(&broker), None, 8, false)
            .unwrap()
            .with_metrics(Some(Arc::clone(&metrics)));
        let addr2 = k.local_addr().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = Arc::clone(&stop);
        let b2 = Arc::clone(&broker);
        let t = std::thread::spawn(move || {
            let rt = crate::engine::net::server::runtime().unwrap();
            rt.block_on(k.serve(s2, &AtomicBool::new(false))).unwrap();
            b2.shutdown().unwrap();
        });
        let connect = || {
            let s = TcpStream::connect(&addr2).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s
        };
        let metadata = request(ApiKey::Metadata, 9, &MetadataRequest::default());
        let mut hs = SaslHandshakeRequest::default();
        hs.mechanism = crate::engine::net::kafka::sb("PLAIN");
        let handshake_v1 = request(ApiKey::SaslHandshake, 1, &hs);
        let auth = |token: &str| {
            let mut a = SaslAuthenticateRequest::default();
            a.auth_bytes = Bytes::from(plain(token));
            request(ApiKey::SaslAuthenticate, 2, &a)
        };

        // Before a login: ApiVersions is answered, Metadata closes the connection.
        let mut s = connect();
        let ok = request(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
        assert!(send(&mut s, &ok).is_some());
        assert!(send(&mut s, &metadata).is_none());

        // A wrong token: SASL_AUTHENTICATION_FAILED with a message, then closed.
        let mut s = connect();
        let mut b = send(&mut s, &handshake_v1).unwrap().slice(4..);
        let r = SaslHandshakeResponse::decode(&mut b, 1).unwrap();
        assert_eq!(r.error_code, code::NONE);
        let wrong = format!("{}x", created.token);
        // Version 2 is flexible: the response header carries a tagged-field count.
        let mut b = send(&mut s, &auth(&wrong)).unwrap().slice(5..);
        let r = SaslAuthenticateResponse::decode(&mut b, 2).unwrap();
        assert_eq!(r.error_code, code::SASL_AUTHENTICATION_FAILED);
        assert!(r.error_message.unwrap().contains("authentication failed"));
        assert!(send(&mut s, &metadata).is_none());
        assert_eq!(metrics.auth_failures(), 1);

        // The right token (SaslAuthenticate v2), then Metadata is served.
        let mut s = connect();
        assert!(send(&mut s, &handshake_v1).is_some());
        let mut b = send(&mut s, &auth(&created.token)).unwrap().slice(5..);
        let r = SaslAuthenticateResponse::decode(&mut b, 2).unwrap();
        assert_eq!(r.error_code, code::NONE, "{:?}", r.error_message);
        let mut b = send(&mut s, &metadata).unwrap().slice(5..);
        assert!(MetadataResponse::decode(&mut b, 9).is_ok());

        // A version 0 handshake: the bare token follows, answered by an empty frame.
        let mut s = connect();
        assert!(send(&mut s, &request(ApiKey::SaslHandshake, 0, &hs)).is_some());
        let mut raw = (plain(&created.token).len() as u32).to_be_bytes().to_vec();
        raw.extend_from_slice(&plain(&created.token));
        assert_eq!(send(&mut s, &raw).unwrap().len(), 0);
        assert!(send(&mut s, &metadata).is_some());
        // A wrong bare token closes.
        let mut s = connect();
        assert!(send(&mut s, &request(ApiKey::SaslHandshake, 0, &hs)).is_some());
        let mut raw = (plain("nope").len() as u32).to_be_bytes().to_vec();
        raw.extend_from_slice(&plain("nope"));
        assert!(send(&mut s, &raw).is_none());
        assert_eq!(metrics.auth_failures(), 2);

        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    #[test]
    fn advertised_addresses_split() {
        use super::split_host_port;
        assert_eq!(split_host_port("h:9092"), Some(("h".into(), 9092)));
        assert_eq!(split_host_port("[::1]:1"), Some(("::1".into(), 1)));
        assert_eq!(split_host_port("h"), None);
        assert_eq!(split_host_port(":9"), None);
        assert_eq!(split_host_port("h:99999"), None);
    }

    /// Node 1 of a three-node cluster in which node 2 leads both partitions of the
    /// replicated topic "r" (term 7); "t" is not replicated.
    #[derive(Debug)]
    struct Follower;

    impl Replicator for Follower {
        fn node_id(&self) -> u64 {
            1
        }

        fn is_replicated(&self, topic: &str) -> bool {
            topic == "r"
        }

        fn produce(
            self: Arc<Self>,
            topic: String,
            partition: u32,
            _entry: crate::engine::replication::types::ProduceEntry,
        ) -> crate::engine::replication::BoxFuture<
            Result<(u64, u64), crate::engine::replication::Refusal>,
        > {
            let r = self.check_leader(&topic, partition).map(|()| (0, 0));
            Box::pin(async move { r })
        }

        fn submit(
            self: Arc<Self>,
            topic: String,
            partition: u32,
            _entry: crate::engine::replication::types::ProduceEntry,
        ) -> crate::engine::replication::BoxFuture<
            Result<crate::engine::replication::Applied, crate::engine::replication::Refusal>,
        > {
            let r = self.check_leader(&topic, partition);
            Box::pin(async move {
                r.map(|()| -> crate::engine::replication::BoxFuture<_> {
                    Box::pin(async { Ok((0, 0)) })
                })
            })
        }

        fn check_leader(
            &self,
            topic: &str,
            partition: u32,
        ) -> Result<(), crate::engine::replication::Refusal> {
            Err((
                crate::format::wire::ErrorCode::NOT_LEADER,
                crate::format::wire::not_leader_message(topic, partition, Some((2, "127.0.0.1:2"))),
            ))
        }

        fn leader_of(&self, _topic: &str, _partition: u32) -> Option<(u64, Option<String>)> {
            Some((2, Some("127.0.0.1:2".into())))
        }

        fn create_topic(
            self: Arc<Self>,
            name: String,
            _partitions: u32,
            _settings: Vec<String>,
            _factor: u32,
        ) -> crate::engine::replication::BoxFuture<Result<(), crate::engine::replication::Refusal>>
        {
            Box::pin(async move {
                Err((
                    crate::format::wire::ErrorCode::INVALID_CONFIG,
                    format!("{name}: replication factor 9 with 3 nodes"),
                ))
            })
        }

        fn elsewhere(
            self: Arc<Self>,
            _topic: String,
            _partitions: Vec<u32>,
        ) -> crate::engine::replication::BoxFuture<Option<Vec<crate::engine::replication::Refusal>>>
        {
            Box::pin(async { None })
        }

        fn delete_topic(
            self: Arc<Self>,
            name: String,
        ) -> crate::engine::replication::BoxFuture<Result<(), crate::engine::replication::Refusal>>
        {
            Box::pin(async move {
                Err((
                    crate::format::wire::ErrorCode::PARTITION_UNAVAILABLE,
                    format!("{name}: asking node 3: unreachable"),
                ))
            })
        }

        fn alter_topic(
            self: Arc<Self>,
            name: String,
            _settings: Vec<(String, String)>,
        ) -> crate::engine::replication::BoxFuture<
            Result<crate::format::topic::TopicConfig, crate::engine::replication::Refusal>,
        > {
            Box::pin(async move {
                Err((
                    crate::format::wire::ErrorCode::PARTITION_UNAVAILABLE,
                    format!("{name}: asking node 3: unreachable"),
                ))
            })
        }

        fn status(&self) -> serde_json::Value {
            serde_json::Value::Null
        }

        fn nodes(&self) -> usize {
            3
        }

        fn kafka_nodes(&self) -> Vec<(u64, String)> {
            // Node 3 has no Kafka listener.
            vec![(1, "ignored:1".into()), (2, "127.0.0.1:9002".into())]
        }

        fn partition_view(
            &self,
            topic: &str,
            _partition: u32,
        ) -> Option<crate::engine::replication::PartitionView> {
            (topic == "r").then(|| crate::engine::replication::PartitionView {
                leader: Some(2),
                term: 7,
                replicas: vec![2, 3, 1],
                in_sync: vec![2, 1],
                held: true,
            })
        }

        fn closed_replicas(&self) -> usize {
            0
        }
    }

    /// The leader of replicated topic "t": entries get offsets in the order they are
    /// submitted, and none is answered before [`GatedLeader::GATE`] are in (so a
    /// connection that waited for each answer before reading the next request would
    /// wait forever). Everything else as [`Follower`].
    #[derive(Debug)]
    struct GatedLeader {
        submitted: tokio::sync::watch::Sender<u64>,
    }

    impl GatedLeader {
        const GATE: u64 = 6;
    }

    impl Replicator for GatedLeader {
        fn node_id(&self) -> u64 {
            1
        }

        fn is_replicated(&self, topic: &str) -> bool {
            topic == "t"
        }

        fn produce(
            self: Arc<Self>,
            _topic: String,
            _partition: u32,
            _entry: crate::engine::replication::types::ProduceEntry,
        ) -> crate::engine::replication::BoxFuture<
            Result<(u64, u64), crate::engine::replication::Refusal>,
        > {
            Box::pin(std::future::pending())
        }

        fn submit(
            self: Arc<Self>,
            _topic: String,
            _partition: u32,
            _entry: crate::engine::replication::types::ProduceEntry,
        ) -> crate::engine::replication::BoxFuture<
            Result<crate::engine::replication::Applied, crate::engine::replication::Refusal>,
        > {
            let mut at = 0;
            self.submitted.send_modify(|n| {
                at = *n;
                *n += 1;
            });
            let mut all_in = self.submitted.subscribe();
            Box::pin(async move {
                Ok(Box::pin(async move {
                    let _ = all_in.wait_for(|n| *n >= Self::GATE).await;
                    Ok((at, at))
                }) as crate::engine::replication::Applied)
            })
        }

        fn check_leader(
            &self,
            _topic: &str,
            _partition: u32,
        ) -> Result<(), crate::engine::replication::Refusal> {
            Ok(())
        }

        fn leader_of(&self, _topic: &str, _partition: u32) -> Option<(u64, Option<String>)> {
            Some((1, None))
        }

        fn create_topic(
            self: Arc<Self>,
            name: String,
            partitions: u32,
            settings: Vec<String>,
            factor: u32,
        ) -> crate::engine::replication::BoxFuture<Result<(), crate::engine::replication::Refusal>>
        {
            Arc::new(Follower).create_topic(name, partitions, settings, factor)
        }

        fn elsewhere(
            self: Arc<Self>,
            _topic: String,
            _partitions: Vec<u32>,
        ) -> crate::engine::replication::BoxFuture<Option<Vec<crate::engine::replication::Refusal>>>
        {
            Box::pin(async { None })
        }

        fn delete_topic(
            self: Arc<Self>,
            name: String,
        ) -> crate::engine::replication::BoxFuture<Result<(), crate::engine::replication::Refusal>>
        {
            Arc::new(Follower).delete_topic(name)
        }

        fn alter_topic(
            self: Arc<Self>,
            name: String,
            settings: Vec<(String, String)>,
        ) -> crate::engine::replication::BoxFuture<
            Result<crate::format::topic::TopicConfig, crate::engine::replication::Refusal>,
        > {
            Arc::new(Follower).alter_topic(name, settings)
        }

        fn status(&self) -> serde_json::Value {
            serde_json::Value::Null
        }

        fn nodes(&self) -> usize {
            3
        }

        fn kafka_nodes(&self) -> Vec<(u64, String)> {
            Follower.kafka_nodes()
        }

        fn partition_view(
            &self,
            _topic: &str,
            _partition: u32,
        ) -> Option<crate::engine::replication::PartitionView> {
            None
        }

        fn closed_replicas(&self) -> usize {
            0
        }
    }

    /// Plain produce requests to a replicated partition sent back to back: each
    /// one's entry is queued as it is read, in request order, and the answers come
    /// in order once their entries are applied. The leader here answers no entry
    /// before six are queued, so serving one request at a time would never answer.
    #[test]
    fn pipelined_produces_to_a_replicated_partition_are_queued_in_order() {
        use kafka_protocol::messages::ProduceResponse;
        let (_dir, broker) = broker_with_t();
        let leader = Arc::new(GatedLeader {
            submitted: tokio::sync::watch::Sender::new(0),
        });
        let (addr, stop, t) = serve_kafka(Arc::clone(&broker), Some(leader.clone()));
        let n = GatedLeader::GATE;
        let mut out = Vec::new();
        for i in 0..n {
            out.extend(produce_gzip(Bytes::from(format!("v{i}"))));
        }
        let mut c = TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(&out).unwrap();
        let mut base_offsets = Vec::new();
        for _ in 0..n {
            let mut len = [0u8; 4];
            c.read_exact(&mut len).expect("an answer within 10 s");
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            c.read_exact(&mut body).unwrap();
            let body = Bytes::from(body).slice(4..);
            assert_eq!(body[0], 0);
            let r = ProduceResponse::decode(&mut body.slice(1..), 9).unwrap();
            let p = &r.responses[0].partition_responses[0];
            assert_eq!(p.error_code, code::NONE, "{p:?}");
            base_offsets.push(p.base_offset);
        }
        // The leader numbers entries in the order they reached it.
        assert_eq!(base_offsets, (0..6).collect::<Vec<i64>>());
        assert_eq!(*leader.submitted.borrow(), n);
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
        broker.shutdown().unwrap();
    }

    #[test]
    fn a_follower_names_the_leader_and_refuses_reads_and_writes() {
        use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
        use kafka_protocol::messages::list_offsets_request::{
            ListOffsetsPartition, ListOffsetsTopic,
        };
        use kafka_protocol::messages::{
            CreateTopicsRequest, CreateTopicsResponse, FetchRequest, FetchResponse,
            ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, TopicName,
        };
        let (_dir, addr, stop, t) = start_with(Some(Arc::new(Follower)));
        let port: i32 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
        let name = |s: &str| TopicName(crate::engine::net::kafka::sb(s));

        // Metadata of every topic (v9: flexible, the response header has a
        // tagged-field byte).
        let mut all = MetadataRequest::default();
        all.topics = None;
        let mut body = exchange(&addr, &request(ApiKey::Metadata, 9, &all))
            .unwrap()
            .slice(1..);
        let m = MetadataResponse::decode(&mut body, 9).unwrap();
        let brokers: Vec<(i32, String, i32)> = m
            .brokers
            .iter()
            .map(|b| (b.node_id.0, b.host.to_string(), b.port))
            .collect();
        assert_eq!(
            brokers,
            [
                (1, "127.0.0.1".to_string(), port),
                (2, "127.0.0.1".to_string(), 9002)
            ]
        );
        assert_eq!(m.controller_id.0, 1);
        let topic = |n: &str| {
            m.topics
                .iter()
                .find(|t| t.name.as_ref().map(|x| x.0.as_str()) == Some(n))
                .unwrap()
        };
        let r = topic("r");
        assert_eq!(r.partitions.len(), 2);
        for p in &r.partitions {
            assert_eq!(p.error_code, code::NONE);
            assert_eq!((p.leader_id.0, p.leader_epoch), (2, 7));
            let ids = |v: &[kafka_protocol::messages::BrokerId]| {
                v.iter().map(|b| b.0).collect::<Vec<_>>()
            };
            assert_eq!(ids(&p.replica_nodes), [2, 3, 1]);
            assert_eq!(ids(&p.isr_nodes), [2, 1]);
        }
        // A topic that is not replicated is led by the node holding it.
        let plain = &topic("t").partitions[0];
        assert_eq!((plain.leader_id.0, plain.leader_epoch), (1, 0));

        // Produce to "r" on this follower: NOT_LEADER_OR_FOLLOWER, nothing written.
        let mut produce = produce_gzip(Bytes::from_static(b"x"));
        let at = produce
            .windows(2)
            .position(|w| w == [2, b't'])
            .expect("the topic name in the request");
        produce[at + 1] = b'r';
        let (c, msg, base) = produce_answer(&addr, &produce);
        assert_eq!((c, base), (code::NOT_LEADER_OR_FOLLOWER, -1), "{msg}");
        assert!(msg.contains("leader: node 2"), "{msg}");

        // Fetch (v12) and ListOffsets (v6) of "r": the same.
        let mut f = FetchRequest::default();
        f.max_wait_ms = 0;
        f.max_bytes = 1 << 20;
        let mut ft = FetchTopic::default();
        ft.topic = name("r");
        let mut fp = FetchPartition::default();
        fp.partition = 1;
        fp.partition_max_bytes = 1 << 20;
        ft.partitions = vec![fp];
        f.topics = vec![ft];
        let mut body = exchange(&addr, &request(ApiKey::Fetch, 12, &f))
            .unwrap()
            .slice(1..);
        let fr = FetchResponse::decode(&mut body, 12).unwrap();
        assert_eq!(
            fr.responses[0].partitions[0].error_code,
            code::NOT_LEADER_OR_FOLLOWER
        );
        let mut lo = ListOffsetsRequest::default();
        let mut lt = ListOffsetsTopic::default();
        lt.name = name("r");
        let mut lp = ListOffsetsPartition::default();
        lp.partition_index = 0;
        lp.timestamp = -1;
        lt.partitions = vec![lp];
        lo.topics = vec![lt];
        let mut body = exchange(&addr, &request(ApiKey::ListOffsets, 6, &lo))
            .unwrap()
            .slice(1..);
        let lr = ListOffsetsResponse::decode(&mut body, 6).unwrap();
        assert_eq!(
            lr.topics[0].partitions[0].error_code,
            code::NOT_LEADER_OR_FOLLOWER
        );
        // "t" is served here as before.
        let (c, msg, base) = produce_answer(&addr, &produce_gzip(Bytes::from_static(b"y")));
        assert_eq!((c, base), (code::NONE, 0), "{msg}");

        // CreateTopics with a replication factor goes to the cluster; its refusal is
        // answered as Kafka's.
        let mut ct = CreateTopicsRequest::default();
        let mut one = kafka_protocol::messages::create_topics_request::CreatableTopic::default();
        one.name = name("big");
        one.num_partitions = 1;
        one.replication_factor = 9;
        ct.topics = vec![one];
        ct.timeout_ms = 1000;
        let mut body = exchange(&addr, &request(ApiKey::CreateTopics, 5, &ct))
            .unwrap()
            .slice(1..);
        let cr = CreateTopicsResponse::decode(&mut body, 5).unwrap();
        assert_eq!(cr.topics[0].error_code, code::INVALID_REPLICATION_FACTOR);
        let msg = cr.topics[0].error_message.as_ref().unwrap().to_string();
        assert!(msg.contains("replication factor 9 with 3 nodes"), "{msg}");

        // DeleteTopics of "r" goes to the cluster too (here a node does not answer):
        // Kafka's retriable code and the message naming the node.
        let mut dt = kafka_protocol::messages::DeleteTopicsRequest::default();
        dt.topic_names = vec![name("r")];
        dt.timeout_ms = 1000;
        let mut body = exchange(&addr, &request(ApiKey::DeleteTopics, 5, &dt))
            .unwrap()
            .slice(1..);
        let dr = kafka_protocol::messages::DeleteTopicsResponse::decode(&mut body, 5).unwrap();
        assert_eq!(dr.responses[0].error_code, code::NOT_ENOUGH_REPLICAS);
        let msg = dr.responses[0].error_message.as_ref().unwrap().to_string();
        assert!(msg.contains("node 3"), "{msg}");

        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }
}
