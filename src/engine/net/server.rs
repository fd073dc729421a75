//! The TCP server: accepts connections, reads request frames and writes responses;
//! [`super::dispatch`] answers each frame by calling the [`Broker`].
//!
//! One tokio runtime serves the listener: a task accepts, and each connection is a
//! task (bounded by `max_connections`). The runtime is `current_thread`: measured on
//! a two-core machine (durable produce, batch 1, 16 connections), one thread cost
//! 42 µs of CPU and 0.85 context switches per request, server and bench client
//! together, and two workers 52 µs and 1.15; one thread also keeps the appends of an
//! event-loop pass back to back, so one group commit covers them (README, "The
//! request path"). Storage stays synchronous: appends and reads are positional
//! writes and reads of the page cache on the runtime thread. The group commit of a
//! pass is led by the first produce of the pass to reach a partition: it runs the
//! fsync on the runtime thread, or, when other partitions' commits are pending or the
//! commit is large, hands it to the node's commit thread (the loop writes the next
//! requests meanwhile) and wakes that partition's tasks once it is published
//! (`Session::produce`).
//!
//! Pipelining: a connection whose client sent a request before the answer to the one
//! before (plain TCP) appends its produce requests as soon as they are whole in the
//! read buffer; their answers, futures that end once a group commit covers the
//! records (or, for a replicated topic, once its Raft entry, queued in request order,
//! is applied), are sent in request order while the connection reads on
//! (`Connection::pipeline_step`). Any other request waits for every answer before it.
//!
//! Invariants:
//! - The first request on a connection must be a handshake.
//! - A frame that cannot be read or decoded gets one error response (request id 0
//!   when the id itself could not be read) and that connection is closed; nothing
//!   else is disturbed.
//! - Frame lengths are checked against [`FRAME_BYTES_MAX`] before reading, and the
//!   read buffer grows only as bytes arrive.
//! - Stopping: the accept loop ends, each connection finishes the request it is
//!   serving (a long-poll fetch returns within one poll slice) and closes at the next
//!   frame boundary; `run` returns once every connection task has ended. The caller
//!   then shuts the broker down.
//!
//! - Limits ([`Limits`]): connections in all and per source address are counted by
//!   a [`ConnectionGate`] before anything is read; a connection reads ahead of the
//!   request it serves at most the in-flight limit, and holds at most
//!   [`PIPELINE_DEPTH_MAX`] pipelined produces unanswered (nothing is read while a
//!   request other than such a produce is being answered), so a client that
//!   pipelines faster than it is served meets TCP backpressure, not a growing buffer
//!   or queue; a response that the peer does not read
//!   within `io_timeout` drops the connection; a connection idle at a frame boundary
//!   for longer than the idle timeout is closed.
//! - TLS ([`ServerTls`]): the TLS handshake runs in the connection's task, bounded by
//!   `io_timeout`; a plaintext peer where TLS is required gets one TLS_REQUIRED error
//!   frame and is closed.
//!
//! [`FRAME_BYTES_MAX`]: crate::format::wire::FRAME_BYTES_MAX

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use super::dispatch::{config_settings, engine_error};
use super::dispatch::{Deferred, Session, StreamedFetch};
use super::limits::{Admitted, ConnectionGate, Limits};
use super::tls::{Accepted, ServerTls, Stream};
use crate::engine::broker::Broker;
use crate::format::wire::{encode_error, frame_head, ApiKey, ErrorCode, API_KEY_NONE, LEN_FIELD};

/// Produce requests of one connection appended and not yet answered, at most
/// (a client that pipelines deeper meets TCP backpressure).
const PIPELINE_DEPTH_MAX: usize = 64;
/// How often the accept loop looks at the stop flags.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Step by which a large frame's buffer grows while its bytes arrive.
const READ_STEP_BYTES: usize = 1 << 20;
/// A connection's read buffer: frames up to this size are read in place, several
/// at a time when the peer sends them back to back.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// How long a stopping server waits for a peer stalled in the middle of a frame.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// Largest buffer a connection keeps between requests whatever it holds; a larger
/// one is kept only while the requests fill at least a quarter of it (so a stream of
/// large fetches reuses one response buffer, and a single large one does not pin it).
const BUFFER_KEEP_BYTES: usize = 4 << 20;
/// One write of a streamed fetch ([`StreamedFetch`]): its records are read from the
/// file into the connection's slice buffer and written out before the next slice is
/// read, so they pass through the caches once instead of being copied into a
/// response of the fetch's whole size.
const STREAM_SLICE_BYTES: usize = 256 << 10;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Connections served at once; further ones get TOO_MANY_CONNECTIONS and are closed.
    pub max_connections: usize,
    /// Longest a peer may stall in the middle of a frame, or take to read a response.
    pub io_timeout: Duration,
    /// Log (through `tracing`) each connection closed because of a bad frame and each
    /// error response.
    pub log_errors: bool,
    /// Where the request path counts requests and traffic (`None`: nothing counted).
    pub metrics: Option<Arc<super::metrics::NetMetrics>>,
    /// What one client may ask of the broker (see [`Limits`]).
    pub limits: Limits,
    /// TLS, when configured.
    pub tls: Option<ServerTls>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_connections: 1024,
            io_timeout: Duration::from_secs(30),
            log_errors: true,
            metrics: None,
            limits: Limits::default(),
            tls: None,
        }
    }
}

/// A bound listener serving one broker.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    broker: Arc<Broker>,
    opts: ServerOptions,
    stop: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    /// Counts `active`, in all and per source address.
    gate: Arc<ConnectionGate>,
    limits: Arc<Limits>,
    /// Refusals being told over TLS right now, at most [`TLS_REFUSALS_MAX`].
    tls_refusals: Arc<tokio::sync::Semaphore>,
    /// Produce requests waiting for durability, across connections.
    waiting: Arc<AtomicUsize>,
    /// The cluster's replication (a node started with `--peers`).
    replication: Option<Arc<dyn crate::engine::replication::Replicator>>,
}

/// The runtime of the native listener (see the module documentation for why one
/// thread).
pub fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

impl Server {
    /// Binds `addr` (`127.0.0.1:0` picks a free port; see [`Server::local_addr`]).
    pub fn bind(addr: &str, broker: Arc<Broker>, opts: ServerOptions) -> io::Result<Server> {
        Server::from_listener(TcpListener::bind(addr)?, broker, opts)
    }

    /// Serves on a listener bound already (so a caller can bind before it opens the
    /// broker).
    pub fn from_listener(
        listener: TcpListener,
        broker: Arc<Broker>,
        opts: ServerOptions,
    ) -> io::Result<Server> {
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let active = Arc::new(AtomicUsize::new(0));
        if let Some(m) = &opts.metrics {
            m.set_connections(Arc::clone(&active));
        }
        opts.limits
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let gate = ConnectionGate::new(
            Arc::clone(&active),
            opts.max_connections,
            opts.limits.connections_per_address_max,
        );
        if let Some(m) = &opts.metrics {
            m.set_gate(Arc::clone(&gate));
        }
        let limits = Arc::new(opts.limits.clone());
        Ok(Server {
            listener,
            local_addr,
            broker,
            opts,
            stop: Arc::new(AtomicBool::new(false)),
            active,
            gate,
            limits,
            tls_refusals: Arc::new(tokio::sync::Semaphore::new(TLS_REFUSALS_MAX)),
            waiting: Arc::new(AtomicUsize::new(0)),
            replication: None,
        })
    }

    /// Routes the requests of replicated topics through `replication`.
    pub fn with_replication(
        mut self,
        replication: Arc<dyn crate::engine::replication::Replicator>,
    ) -> Self {
        self.replication = Some(replication);
        self
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A flag that stops [`Server::run`] when set (from any thread).
    pub fn stop_handle(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Connections being served right now.
    pub fn connections(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Accepts and serves connections until the stop handle or `also_stop` is set,
    /// then waits for every connection to finish its in-flight request and close.
    pub fn run(&self, also_stop: &AtomicBool) -> io::Result<()> {
        self.run_with(also_stop, std::future::ready(Ok(())))
    }

    /// [`Server::run`], driving `beside` (another listener's serving future, which
    /// ends once this server's stop handle is set) on the same runtime; returns once
    /// both have ended.
    pub fn run_with(
        &self,
        also_stop: &AtomicBool,
        beside: impl std::future::Future<Output = io::Result<()>>,
    ) -> io::Result<()> {
        let rt = runtime()?;
        rt.block_on(async {
            let (native, beside) = tokio::join!(self.serve_native(also_stop), beside);
            native.and(beside)
        })
    }

    async fn serve_native(&self, also_stop: &AtomicBool) -> io::Result<()> {
        {
            let listener = tokio::net::TcpListener::from_std(self.listener.try_clone()?)?;
            let (stop_tx, stop_rx) = watch::channel(false);
            let mut conns = JoinSet::new();
            let result = self
                .accept_loop(&listener, also_stop, &stop_rx, &mut conns)
                .await;
            self.stop.store(true, Ordering::SeqCst);
            stop_tx.send_replace(true);
            while conns.join_next().await.is_some() {}
            result
        }
    }

    async fn accept_loop(
        &self,
        listener: &tokio::net::TcpListener,
        also_stop: &AtomicBool,
        stop_rx: &watch::Receiver<bool>,
        conns: &mut JoinSet<()>,
    ) -> io::Result<()> {
        let mut starved = Starved::new();
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.stop.load(Ordering::SeqCst) && !also_stop.load(Ordering::SeqCst) {
            let accepted = tokio::select! {
                _ = tick.tick() => continue,
                r = listener.accept() => r,
            };
            match accepted {
                Ok((stream, peer)) => {
                    starved.backoff = ACCEPT_BACKOFF_MIN;
                    while conns.try_join_next().is_some() {}
                    self.start_connection(stream, peer, stop_rx, conns).await;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of file descriptors: refuse the waiting connection through the
                // spare descriptor, and back off; keep serving the others.
                Err(e) if is_out_of_descriptors(&e) => {
                    let refused = starved.refuse(listener).await;
                    starved.note(&self.local_addr, &e, refused);
                    tokio::time::sleep(starved.backoff).await;
                    starved.backoff = (starved.backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
                Err(e) => {
                    starved.note(&self.local_addr, &e, false);
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
            }
        }
        Ok(())
    }

    async fn start_connection(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
        stop_rx: &watch::Receiver<bool>,
        conns: &mut JoinSet<()>,
    ) {
        let admitted = match self.gate.admit(peer) {
            Ok(a) => a,
            Err(refusal) => {
                tracing::warn!(%peer, "refused a connection: {}", refusal.message());
                match (
                    &self.opts.tls,
                    self.tls_refusals.clone().try_acquire_owned(),
                ) {
                    // A TLS client is told over TLS, by a task of its own (a few at
                    // once; past them the connection is only closed).
                    (Some(tls), Ok(permit)) => {
                        let tls = tls.clone();
                        conns.spawn(async move {
                            let _permit = permit;
                            refuse_tls(tls, stream, &refusal.message()).await;
                        });
                    }
                    (Some(_), Err(_)) => {}
                    (None, _) => refuse_with(&mut stream, &refusal.message()).await,
                }
                return;
            }
        };
        let tls = self.opts.tls.clone();
        let io_timeout = self.opts.io_timeout;
        let log_errors = self.opts.log_errors;
        let mut conn = Connection {
            stream: Stream::Plain(stream),
            peer,
            session: Session::new(
                Arc::clone(&self.broker),
                peer,
                Arc::clone(&self.stop),
                self.opts.log_errors,
                Arc::clone(&self.waiting),
            )
            .with_metrics(self.opts.metrics.clone())
            .with_limits(Arc::clone(&self.limits))
            .with_replication(self.replication.clone())
            .with_listen_addr(self.local_addr),
            limits: Arc::clone(&self.limits),
            stop: Arc::clone(&self.stop),
            stop_rx: stop_rx.clone(),
            opts: self.opts.clone(),
            buf: Vec::new(),
            start: 0,
            end: 0,
            big: Vec::new(),
            slice: Vec::new(),
        };
        let mut handshake_stop = stop_rx.clone();
        let stopping = Arc::clone(&self.stop);
        conns.spawn(async move {
            let _admitted: Admitted = admitted;
            if tls.is_some() && stopping.load(Ordering::SeqCst) {
                return;
            }
            if let Some(tls) = tls {
                let Stream::Plain(tcp) = conn.stream else {
                    return;
                };
                // A stopping server does not wait out a handshake.
                let accepted = tokio::select! {
                    a = tls.accept(tcp, io_timeout) => a,
                    _ = handshake_stop.changed() => return,
                };
                match accepted {
                    Accepted::Stream(s) => conn.stream = s,
                    Accepted::Plaintext(mut tcp) => {
                        refuse_plaintext(&mut tcp, io_timeout).await;
                        if log_errors {
                            tracing::warn!(%peer, "refused a plaintext connection: TLS is required");
                        }
                        return;
                    }
                    Accepted::Failed(e) => {
                        if log_errors {
                            tracing::warn!(%peer, "TLS handshake failed: {e}");
                        }
                        return;
                    }
                }
            }
            conn.serve().await;
        });
    }
}

/// Whether `frame` is a produce request (pipelined: see [`Session::handle_frame_pipelined`]).
fn is_produce(frame: &[u8]) -> bool {
    frame_head(frame).is_some_and(|(_, key)| key == ApiKey::Produce as u16)
}

/// Refused connections of a TLS listener told why at once (each costs a handshake).
const TLS_REFUSALS_MAX: usize = 16;

/// Tells a refused peer of a TLS listener why (TOO_MANY_CONNECTIONS, request id 0),
/// over TLS when it speaks TLS, within a second in all.
async fn refuse_tls(tls: ServerTls, tcp: TcpStream, msg: &str) {
    let mut out = Vec::new();
    encode_error(
        &mut out,
        0,
        API_KEY_NONE,
        ErrorCode::TOO_MANY_CONNECTIONS,
        msg,
    );
    let _ = tokio::time::timeout(POLL_INTERVAL * 10, async {
        let mut stream = match tls.accept(tcp, POLL_INTERVAL * 10).await {
            Accepted::Stream(s) => s,
            Accepted::Plaintext(tcp) => Stream::Plain(tcp),
            Accepted::Failed(_) => return,
        };
        if stream.write_all(&out).await.is_ok() && stream.flush().await.is_ok() {
            let _ = stream.shutdown().await;
        }
    })
    .await;
}

/// Tells a plaintext peer of a TLS-only listener to use TLS (TLS_REQUIRED, request
/// id 0), then closes after a short drain (so the peer reads the frame, not a reset).
async fn refuse_plaintext(stream: &mut TcpStream, io_timeout: Duration) {
    let mut out = Vec::new();
    encode_error(
        &mut out,
        0,
        API_KEY_NONE,
        ErrorCode::TLS_REQUIRED,
        "this listener requires TLS (connect with --tls and --tls-ca)",
    );
    let _ = tokio::time::timeout(io_timeout, stream.write_all(&out)).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(POLL_INTERVAL * 5, async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// Tells a refused peer why (TOO_MANY_CONNECTIONS, request id 0); the stream closes
/// when dropped.
async fn refuse_with(stream: &mut TcpStream, msg: &str) {
    let mut out = Vec::new();
    encode_error(
        &mut out,
        0,
        API_KEY_NONE,
        ErrorCode::TOO_MANY_CONNECTIONS,
        msg,
    );
    let _ = tokio::time::timeout(POLL_INTERVAL, stream.write_all(&out)).await;
}

/// First and longest sleep of the accept loop while descriptors run out.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Accept failures are logged at most once per this interval (with a count).
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(1);

fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The accept loop's state while accepting fails.
struct Starved {
    /// A descriptor kept in reserve: closed to accept (and at once close) a
    /// connection the process has no descriptor for, so the peer is told instead of
    /// waiting in the backlog.
    spare: Option<std::fs::File>,
    backoff: Duration,
    /// Failures since the last log line, and when that was.
    unlogged: u64,
    refused: u64,
    logged_at: Option<Instant>,
}

impl Starved {
    fn new() -> Self {
        Starved {
            spare: std::fs::File::open("/dev/null").ok(),
            backoff: ACCEPT_BACKOFF_MIN,
            unlogged: 0,
            refused: 0,
            logged_at: None,
        }
    }

    /// Frees the spare descriptor, accepts one connection on it, tells the peer
    /// why and closes it, then takes the spare again. True when one was refused.
    async fn refuse(&mut self, listener: &tokio::net::TcpListener) -> bool {
        if self.spare.take().is_none() {
            return false;
        }
        let refused = match tokio::time::timeout(POLL_INTERVAL, listener.accept()).await {
            Ok(Ok((mut stream, _))) => {
                refuse_with(&mut stream, "the broker is out of file descriptors").await;
                true
            }
            _ => false,
        };
        self.spare = std::fs::File::open("/dev/null").ok();
        refused
    }

    /// Counts a failure; logs at most one line per [`ACCEPT_LOG_INTERVAL`].
    fn note(&mut self, addr: &SocketAddr, e: &io::Error, refused: bool) {
        self.unlogged += 1;
        self.refused += u64::from(refused);
        if self
            .logged_at
            .is_some_and(|t| t.elapsed() < ACCEPT_LOG_INTERVAL)
        {
            return;
        }
        tracing::warn!(
            listen = %addr,
            error = %e,
            failures = self.unlogged,
            refused = self.refused,
            backoff_ms = u64::try_from(self.backoff.as_millis()).unwrap_or(u64::MAX),
            "accepting connections failed; refusing new ones until descriptors free up"
        );
        self.unlogged = 0;
        self.refused = 0;
        self.logged_at = Some(Instant::now());
    }
}

/// How reading a request frame ended, when it did not produce one.
enum ReadEnd {
    /// The peer closed, or the server is stopping, at a frame boundary.
    Closed,
    /// `frame_len` outside the allowed range.
    BadLength(String),
    /// The connection failed or stalled mid-frame.
    Failed(io::Error),
    /// No request came within the idle timeout.
    Idle(Duration),
}

/// Where the frame just read lies.
enum Frame {
    /// `buf[start..end]`.
    InPlace(usize, usize),
    /// All of `big`.
    Big,
}

/// One accepted connection, served as one task.
struct Connection {
    stream: Stream,
    peer: SocketAddr,
    session: Session,
    limits: Arc<Limits>,
    stop: Arc<AtomicBool>,
    /// Changes once, when the server starts stopping.
    stop_rx: watch::Receiver<bool>,
    opts: ServerOptions,
    /// Bytes read and not yet consumed are `buf[start..end]`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// A frame larger than `buf`, grown in steps as its bytes arrive.
    big: Vec<u8>,
    /// Slices of streamed fetches pass through here ([`STREAM_SLICE_BYTES`], allocated
    /// at the connection's first one).
    slice: Vec<u8>,
}

impl Connection {
    async fn serve(mut self) {
        if self.stream.tcp().set_nodelay(true).is_err() {
            return;
        }
        // Answers of pipelined produce requests, in the order of the requests.
        let mut answers: FuturesOrdered<Deferred> = FuturesOrdered::new();
        // Set once the client sends a request before the answer to the one before
        // (plain TCP): from then on its produce requests are pipelined.
        let mut pipelining = false;
        loop {
            if !answers.is_empty() {
                if self.pipeline_step(&mut answers).await {
                    continue;
                }
                return;
            }
            // A stopping server takes no new request, even one already sent.
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let frame = match self.read_frame().await {
                Ok(f) => f,
                Err(ReadEnd::Closed) => break,
                Err(ReadEnd::BadLength(detail)) => {
                    let out = self.session.response_mut();
                    out.clear();
                    encode_error(out, 0, API_KEY_NONE, ErrorCode::FRAME_TOO_LARGE, &detail);
                    self.log(&detail);
                    self.send_and_close().await;
                    return;
                }
                Err(ReadEnd::Failed(e)) => {
                    self.log(&format!("reading a request failed: {e}"));
                    break;
                }
                Err(ReadEnd::Idle(t)) => {
                    self.log(&format!(
                        "no request for {} ms (idle_timeout)",
                        t.as_millis()
                    ));
                    break;
                }
            };
            pipelining |= self.end > self.start && matches!(self.stream, Stream::Plain(_));
            let bytes = match frame {
                Frame::InPlace(a, b) => self.buf.get(a..b).unwrap_or(&[]),
                Frame::Big => &self.big,
            };
            let close = if pipelining && is_produce(bytes) {
                self.session.handle_frame_pipelined(bytes).await
            } else {
                self.session.handle_frame(bytes).await
            };
            if close {
                self.send_and_close().await;
                return;
            }
            if let Some(answer) = self.session.take_deferred() {
                answers.push_back(answer);
                continue;
            }
            if let Err(e) = self.send().await {
                self.log(&format!("writing a response failed: {e}"));
                break;
            }
            // A large request or fetch does not pin its buffers for the life of
            // the connection.
            if self.big.capacity() > BUFFER_KEEP_BYTES {
                self.big = Vec::new();
            }
            let out = self.session.response_mut();
            if out.capacity() > BUFFER_KEEP_BYTES && out.len() < out.capacity() / 4 {
                *out = Vec::new();
            }
        }
    }

    /// One step of a connection with answers outstanding (a client that pipelines
    /// produce requests): a produce request already whole in the read buffer is
    /// appended at once (its answer queued behind the others); otherwise the oldest
    /// answer is sent once it is ready, and bytes that arrive meanwhile are read
    /// into the buffer. Any other request, or one that does not fit the buffer,
    /// waits until every answer before it is sent, so it is served exactly as
    /// without pipelining. Returns false when the connection is to end.
    async fn pipeline_step(&mut self, answers: &mut FuturesOrdered<Deferred>) -> bool {
        let taking = answers.len() < PIPELINE_DEPTH_MAX && !self.stop.load(Ordering::SeqCst);
        let whole = self.whole_frame();
        if let Some((a, b)) = whole.filter(|_| taking) {
            let bytes = self.buf.get(a..b).unwrap_or(&[]);
            if is_produce(bytes) {
                let close = self.session.handle_frame_pipelined(bytes).await;
                self.start = b;
                if close {
                    // The error goes out after every answer before it, then the
                    // connection closes (send_and_close with nothing left to send).
                    let out = std::mem::take(self.session.response_mut());
                    answers.push_back(Box::pin(std::future::ready(out)));
                    if self.drain(answers).await.is_ok() {
                        self.send_and_close().await;
                    }
                    return false;
                }
                let answer = match self.session.take_deferred() {
                    Some(answer) => answer,
                    None => Box::pin(std::future::ready(self.session.response().to_vec())),
                };
                answers.push_back(answer);
                return true;
            }
        }
        let room = if taking && whole.is_none() {
            self.read_room()
        } else {
            None
        };
        enum Event {
            Answer(Option<Vec<u8>>),
            Readable(io::Result<()>),
        }
        let event = {
            let readable = async {
                match (&self.stream, &room) {
                    (Stream::Plain(tcp), Some(_)) => tcp.readable().await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                out = answers.next() => Event::Answer(out),
                r = readable => Event::Readable(r),
            }
        };
        match event {
            Event::Answer(None) => true,
            Event::Answer(Some(out)) => match self.send_bytes(&out).await {
                Ok(()) => true,
                Err(e) => {
                    self.log(&format!("writing a response failed: {e}"));
                    false
                }
            },
            Event::Readable(Err(e)) => {
                self.log(&format!("reading a request failed: {e}"));
                false
            }
            Event::Readable(Ok(())) => {
                let (Stream::Plain(tcp), Some(room)) = (&self.stream, room) else {
                    return true;
                };
                let Some(dst) = self.buf.get_mut(room) else {
                    return true;
                };
                match tcp.try_read(dst) {
                    Ok(0) => {
                        // The peer is done sending: it still gets every answer owed.
                        if let Err(e) = self.drain(answers).await {
                            self.log(&format!("writing a response failed: {e}"));
                        }
                        false
                    }
                    Ok(n) => {
                        self.end += n;
                        true
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
                    Err(e) => {
                        self.log(&format!("reading a request failed: {e}"));
                        false
                    }
                }
            }
        }
    }

    /// Sends every outstanding answer, in order.
    async fn drain(&mut self, answers: &mut FuturesOrdered<Deferred>) -> io::Result<()> {
        while let Some(out) = answers.next().await {
            self.send_bytes(&out).await?;
        }
        Ok(())
    }

    /// The next frame (the bytes after `frame_len`) when it is whole in the read
    /// buffer and its length is allowed; `None` otherwise (it is then read, or
    /// refused, by [`Connection::read_frame`]).
    fn whole_frame(&self) -> Option<(usize, usize)> {
        let len = self.next_frame_len()?;
        let a = self.start + LEN_FIELD;
        let b = a.checked_add(len)?;
        (b <= self.end).then_some((a, b))
    }

    /// The length of the next frame, when its `frame_len` is buffered and allowed.
    fn next_frame_len(&self) -> Option<usize> {
        let head: [u8; LEN_FIELD] = self
            .buf
            .get(self.start..self.start + LEN_FIELD)
            .filter(|_| self.end - self.start >= LEN_FIELD)?
            .try_into()
            .ok()?;
        self.limits.check_frame_len(u32::from_be_bytes(head)).ok()
    }

    /// Where the next read may go while answers are outstanding: after the buffered
    /// bytes, at most the in-flight window past the next frame's start (its bytes
    /// moved to the front when the tail is short). `None` when the next frame does
    /// not fit the buffer, or its length is not allowed: it is read (or refused)
    /// once every answer before it is out.
    fn read_room(&mut self) -> Option<std::ops::Range<usize>> {
        if self.buf.is_empty() {
            self.buf = vec![0; READ_BUFFER_BYTES];
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let need = if self.end - self.start >= LEN_FIELD {
            LEN_FIELD.checked_add(self.next_frame_len()?)?
        } else {
            LEN_FIELD
        };
        if need > self.buf.len() {
            return None;
        }
        if self.buf.len() - self.start < need {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let window = self.limits.read_window(self.buf.len()).max(need);
        let until = (self.start + window).min(self.buf.len());
        (self.end < until).then_some(self.end..until)
    }

    fn log(&self, detail: &str) {
        if self.opts.log_errors {
            tracing::warn!(peer = %self.peer, "closing the connection: {detail}");
        }
    }

    /// Writes the response: one `send` when the socket takes it whole (the usual
    /// case, and no timer is armed), else the rest within `io_timeout`.
    async fn send(&mut self) -> io::Result<()> {
        if let Some(streamed) = self.session.take_stream() {
            let io_timeout = self.opts.io_timeout;
            let write = self.send_streamed(streamed);
            return match tokio::time::timeout(io_timeout, write).await {
                Ok(r) => r,
                Err(_) => Err(io::ErrorKind::TimedOut.into()),
            };
        }
        let out = self.session.response();
        Self::write_response(&mut self.stream, out, self.opts.io_timeout).await
    }

    /// Writes one encoded answer (see [`Connection::send`]).
    async fn send_bytes(&mut self, out: &[u8]) -> io::Result<()> {
        Self::write_response(&mut self.stream, out, self.opts.io_timeout).await
    }

    /// One `send` when the socket takes `out` whole, else the rest within
    /// `io_timeout`.
    async fn write_response(
        stream: &mut Stream,
        out: &[u8],
        io_timeout: Duration,
    ) -> io::Result<()> {
        let sent = match stream.try_write_plain(out) {
            Some(Ok(n)) => n,
            Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Some(Err(e)) => return Err(e),
            None => 0,
        };
        let rest = out.get(sent..).unwrap_or(&[]);
        if rest.is_empty() {
            return Ok(());
        }
        let write = async move {
            stream.write_all(rest).await?;
            stream.flush().await
        };
        match tokio::time::timeout(io_timeout, write).await {
            Ok(r) => r,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }

    /// Writes a streamed fetch: the response buffer's pieces with each span's bytes
    /// spliced in, a slice at a time (positional reads of the page cache into the
    /// slice buffer, each slice written before the next is read; a head piece rides
    /// in the same write as the slice after it). A span that can no longer be read
    /// whole fails the connection: its frame length is already sent.
    async fn send_streamed(&mut self, streamed: StreamedFetch) -> io::Result<()> {
        if let Stream::Plain(tcp) = &mut self.stream {
            return send_streamed_plain(tcp, self.session.response(), &streamed).await;
        }
        if self.slice.len() < STREAM_SLICE_BYTES {
            self.slice = vec![0; STREAM_SLICE_BYTES];
        }
        let head = self.session.response();
        let (stream, slice) = (&mut self.stream, &mut self.slice);
        let mut at = 0;
        for (&split, span) in streamed.splits.iter().zip(&streamed.spans) {
            let mut piece = head.get(at..split).unwrap_or(&[]);
            at = split;
            let mut done = 0u64;
            while done < span.len || !piece.is_empty() {
                let lead = piece.len().min(STREAM_SLICE_BYTES / 2);
                let (front, rest) = slice.split_at_mut(lead);
                front.copy_from_slice(piece.get(..lead).unwrap_or(&[]));
                piece = piece.get(lead..).unwrap_or(&[]);
                let n = if piece.is_empty() {
                    span.read_at(done, rest)?
                } else {
                    0
                };
                done += n as u64;
                stream
                    .write_all(slice.get(..lead + n).unwrap_or(&[]))
                    .await?;
            }
        }
        stream.write_all(head.get(at..).unwrap_or(&[])).await?;
        stream.flush().await
    }

    /// Sends the response, then closes: the write side first so the peer reads the
    /// response before the end of stream.
    async fn send_and_close(&mut self) {
        let _ = self.send().await;
        let _ = self.stream.shutdown().await;
        // Drain briefly so unread request bytes do not turn the close into a reset
        // that could discard the response before the peer reads it.
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(POLL_INTERVAL * 5, async {
            while let Ok(n) = self.stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }

    /// One read into `dst`. `idle`: at a frame boundary with nothing buffered, where
    /// the connection waits as long as the peer likes and a stop ends it; otherwise
    /// mid-frame, where a peer silent for longer than `io_timeout` (the stop grace
    /// once stopping) fails the connection.
    #[expect(clippy::too_many_arguments, reason = "the state one read needs")]
    async fn read_some(
        stream: &mut Stream,
        stop: &AtomicBool,
        stop_rx: &mut watch::Receiver<bool>,
        io_timeout: Duration,
        idle_timeout: Option<Duration>,
        dst: &mut [u8],
        idle: bool,
        last_progress: Instant,
    ) -> Result<usize, ReadEnd> {
        loop {
            let stopping = stop.load(Ordering::SeqCst);
            let r = if idle {
                if stopping {
                    return Err(ReadEnd::Closed);
                }
                let idle_deadline =
                    idle_timeout.map(|t| tokio::time::Instant::from_std(last_progress + t));
                tokio::select! {
                    r = stream.read(dst) => r,
                    _ = stop_rx.changed() => continue,
                    () = sleep_until_some(idle_deadline) => {
                        return Err(ReadEnd::Idle(idle_timeout.unwrap_or_default()));
                    }
                }
            } else {
                let patience = if stopping {
                    STOP_GRACE.min(io_timeout)
                } else {
                    io_timeout
                };
                let deadline = tokio::time::Instant::from_std(last_progress + patience);
                tokio::select! {
                    r = stream.read(dst) => r,
                    _ = tokio::time::sleep_until(deadline) => {
                        return Err(ReadEnd::Failed(io::ErrorKind::TimedOut.into()));
                    }
                    _ = stop_rx.changed(), if !stopping => continue,
                }
            };
            return match r {
                Ok(0) if idle => Err(ReadEnd::Closed),
                // A TLS peer that ends the connection between requests without
                // close_notify: nothing of a request was lost, so a normal close (rustls
                // reports a missing close_notify as an unexpected end of stream).
                Err(e) if idle && e.kind() == io::ErrorKind::UnexpectedEof => {
                    tracing::debug!("the peer closed the connection without TLS close_notify");
                    Err(ReadEnd::Closed)
                }
                Ok(0) => Err(ReadEnd::Failed(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(ReadEnd::Failed(e)),
            };
        }
    }

    /// Reads until `buf[start..end]` holds at least `n` bytes (`n` at most the
    /// buffer's size), moving the unread bytes to the front when the tail is short.
    async fn fill(&mut self, n: usize, boundary: bool) -> Result<(), ReadEnd> {
        if self.buf.is_empty() {
            self.buf = vec![0; READ_BUFFER_BYTES];
        }
        let mut last_progress = Instant::now();
        while self.end - self.start < n {
            if self.buf.len() - self.start < n {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let idle = boundary && self.end == self.start;
            // Read ahead at most the in-flight limit past the frame's start.
            let window = self.limits.read_window(self.buf.len()).max(n);
            let until = (self.start + window).min(self.buf.len());
            let Some(dst) = self.buf.get_mut(self.end..until) else {
                return Err(ReadEnd::Failed(io::Error::other("read buffer too short")));
            };
            let got = Self::read_some(
                &mut self.stream,
                &self.stop,
                &mut self.stop_rx,
                self.opts.io_timeout,
                self.limits.idle_timeout,
                dst,
                idle,
                last_progress,
            )
            .await?;
            self.end += got;
            last_progress = Instant::now();
        }
        Ok(())
    }

    /// Reads one frame (the bytes after `frame_len`): in place when it fits the
    /// read buffer, else into `big`, grown in steps as its bytes arrive (a peer
    /// announcing 64 MiB and sending nothing holds at most one step).
    async fn read_frame(&mut self) -> Result<Frame, ReadEnd> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        self.fill(LEN_FIELD, true).await?;
        let mut len_bytes = [0u8; LEN_FIELD];
        len_bytes.copy_from_slice(
            self.buf
                .get(self.start..self.start + LEN_FIELD)
                .unwrap_or(&[0; LEN_FIELD]),
        );
        let len = self
            .limits
            .check_frame_len(u32::from_be_bytes(len_bytes))
            .map_err(ReadEnd::BadLength)?;
        self.start += LEN_FIELD;
        if len <= self.buf.len() {
            self.fill(len, false).await?;
            let frame = Frame::InPlace(self.start, self.start + len);
            self.start += len;
            return Ok(frame);
        }
        self.big.clear();
        let buffered = (self.end - self.start).min(len);
        self.big.extend_from_slice(
            self.buf
                .get(self.start..self.start + buffered)
                .unwrap_or(&[]),
        );
        self.start += buffered;
        let mut last_progress = Instant::now();
        while self.big.len() < len {
            let filled = self.big.len();
            let target = len.min(filled + READ_STEP_BYTES);
            self.big.resize(target, 0);
            let mut at = filled;
            while at < target {
                let dst = self.big.get_mut(at..target).unwrap_or(&mut []);
                let got = Self::read_some(
                    &mut self.stream,
                    &self.stop,
                    &mut self.stop_rx,
                    self.opts.io_timeout,
                    None,
                    dst,
                    false,
                    last_progress,
                )
                .await;
                match got {
                    Ok(n) => {
                        at += n;
                        last_progress = Instant::now();
                    }
                    Err(e) => {
                        self.big.truncate(at);
                        return Err(e);
                    }
                }
            }
        }
        Ok(Frame::Big)
    }
}

/// [`Connection::send_streamed`] on plain TCP: each span goes from its file to the
/// socket with `sendfile` (the page cache copied once, into the socket), the pieces
/// of `head` between them with ordinary writes. The TLS path needs the bytes in user
/// space to encrypt them and reads them a slice at a time instead.
async fn send_streamed_plain(
    tcp: &mut TcpStream,
    head: &[u8],
    streamed: &StreamedFetch,
) -> io::Result<()> {
    use std::os::fd::AsFd;
    let mut at = 0;
    for (&split, span) in streamed.splits.iter().zip(&streamed.spans) {
        tcp.write_all(head.get(at..split).unwrap_or(&[])).await?;
        at = split;
        let mut done = 0u64;
        while done < span.len {
            let sent = tcp.try_io(tokio::io::Interest::WRITABLE, || {
                span.send_at(done, tcp.as_fd(), usize::MAX)
            });
            match sent {
                Ok(n) => done += n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await?,
                Err(e) => return Err(e),
            }
        }
    }
    tcp.write_all(head.get(at..).unwrap_or(&[])).await?;
    tcp.flush().await
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::thread::{self, JoinHandle};

    use super::*;
    use crate::engine::broker::BrokerOptions;
    use crate::engine::net::client::{Client, ClientError};
    use crate::engine::storage::io::RealStorage;
    use crate::format::wire::{
        decode_response, encode_request, PartitionBatch, Request, ResponseBody, WireRecord,
        FRAME_BYTES_MAX, PROTOCOL_VERSION,
    };

    /// A broker on a temp dir and its server running on a thread.
    struct Running {
        _dir: tempfile::TempDir,
        broker: Arc<Broker>,
        addr: String,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<io::Result<()>>>,
    }

    impl Running {
        fn start(opts: ServerOptions) -> Running {
            let dir = tempfile::tempdir().unwrap();
            let broker =
                Broker::open(dir.path(), Arc::new(RealStorage), BrokerOptions::default()).unwrap();
            Running::serve(dir, broker, opts)
        }

        fn serve(dir: tempfile::TempDir, broker: Arc<Broker>, opts: ServerOptions) -> Running {
            let server = Server::bind("127.0.0.1:0", Arc::clone(&broker), opts).unwrap();
            let addr = server.local_addr().to_string();
            let stop = server.stop_handle();
            let thread = thread::spawn(move || server.run(&AtomicBool::new(false)));
            Running {
                _dir: dir,
                broker,
                addr,
                stop,
                thread: Some(thread),
            }
        }

        fn client(&self) -> Client {
            Client::connect(&self.addr, Duration::from_secs(30)).unwrap()
        }

        fn stop(mut self) {
            self.stop.store(true, Ordering::SeqCst);
            self.thread.take().unwrap().join().unwrap().unwrap();
            self.broker.shutdown().unwrap();
        }
    }

    fn quiet() -> ServerOptions {
        ServerOptions {
            log_errors: false,
            ..ServerOptions::default()
        }
    }

    #[test]
    fn too_many_connections_is_refused_and_others_go_on() {
        let r = Running::start(ServerOptions {
            max_connections: 1,
            ..quiet()
        });
        let mut first = r.client();
        let e = Client::connect(&r.addr, Duration::from_secs(30)).unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::TOO_MANY_CONNECTIONS), "{e}");
        assert!(first.list_topics().unwrap().is_empty());
        r.stop();
    }

    #[test]
    fn unsupported_versions_are_refused() {
        let r = Running::start(quiet());
        for (min, max) in [(PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 5), (0, 0), (1, 0)] {
            let mut s = TcpStream::connect(&r.addr).unwrap();
            let mut out = Vec::new();
            encode_request(
                &mut out,
                4,
                &Request::Handshake {
                    min_version: min,
                    max_version: max,
                    token: None,
                },
            )
            .unwrap();
            s.write_all(&out).unwrap();
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).unwrap();
            let resp = decode_response(answer.get(4..).unwrap()).unwrap();
            assert_eq!(
                (resp.request_id, resp.code),
                (4, ErrorCode::UNSUPPORTED_VERSION),
                "{min}..={max}"
            );
        }
        // A range that includes the newest version is answered with it.
        let mut s = TcpStream::connect(&r.addr).unwrap();
        let mut out = Vec::new();
        encode_request(
            &mut out,
            5,
            &Request::Handshake {
                min_version: 1,
                max_version: 9,
                token: None,
            },
        )
        .unwrap();
        s.write_all(&out).unwrap();
        let mut buf = Vec::new();
        crate::engine::net::client::read_frame(&mut s, &mut buf)
            .map_err(|_| "read")
            .unwrap();
        let resp = decode_response(&buf).unwrap();
        assert_eq!(
            resp.body,
            Some(ResponseBody::Handshake {
                version: PROTOCOL_VERSION,
                frame_bytes_max: FRAME_BYTES_MAX
            })
        );
        r.stop();
    }

    #[test]
    fn produce_to_several_partitions_reports_each() {
        let r = Running::start(quiet());
        let mut c = r.client();
        c.create_topic("t", 2, &[]).unwrap();
        let rec = |v: &'static [u8]| WireRecord {
            timestamp_ms: -1,
            key: None,
            value: v,
        };
        let acks = c
            .produce(
                "t",
                vec![
                    PartitionBatch {
                        partition: 1,
                        records: vec![rec(b"a"), rec(b"b")],
                    },
                    PartitionBatch {
                        partition: 7,
                        records: vec![rec(b"c")],
                    },
                    PartitionBatch {
                        partition: 0,
                        records: vec![rec(b"d")],
                    },
                ],
            )
            .unwrap();
        assert_eq!(acks[0].result, Ok((0, 1)));
        assert!(
            matches!(&acks[1].result, Err((ErrorCode::UNKNOWN_PARTITION, m)) if m.contains('7'))
        );
        assert_eq!(acks[2].result, Ok((0, 0)));
        let f = c.fetch("t", 1, 0, 1 << 20, Duration::ZERO).unwrap();
        let values: Vec<&[u8]> = f.records.iter().map(|r| r.value.as_slice()).collect();
        assert_eq!(values, [b"a", b"b"]);
        assert_eq!(c.stats().unwrap().records_appended, 3);
        // Unknown topic: per partition too; the connection stays usable.
        let acks = c
            .produce(
                "nope",
                vec![PartitionBatch {
                    partition: 0,
                    records: vec![rec(b"x")],
                }],
            )
            .unwrap();
        assert!(matches!(acks[0].result, Err((ErrorCode::UNKNOWN_TOPIC, _))));
        assert_eq!(c.list_topics().unwrap(), ["t"]);
        r.stop();
    }

    #[test]
    fn stopping_ends_idle_connections_and_long_polls() {
        let r = Running::start(quiet());
        let mut idle = r.client();
        let mut waiting = r.client();
        waiting.create_topic("t", 1, &[]).unwrap();
        let poll = thread::spawn(move || waiting.fetch("t", 0, 0, 1024, Duration::from_secs(60)));
        thread::sleep(Duration::from_millis(100));
        r.stop();
        // The long poll was answered (empty) or cut short; either way it returned.
        let polled = poll.join().unwrap();
        assert!(
            polled.as_ref().is_ok_and(|f| f.records.is_empty()) || polled.is_err(),
            "{polled:?}"
        );
        assert!(matches!(idle.list_topics(), Err(ClientError::Io { .. })));
    }

    /// A raw connection after its handshake (request id 1).
    fn handshaken(addr: &str) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        let mut out = Vec::new();
        let hello = Request::Handshake {
            min_version: PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            token: None,
        };
        encode_request(&mut out, 1, &hello).unwrap();
        s.write_all(&out).unwrap();
        let frame = read_frame(&mut s);
        assert_eq!(decode_response(&frame[4..]).unwrap().code, ErrorCode::NONE);
        s
    }

    /// Encodes a produce of `values` to one partition of `topic` as request `id`.
    fn produce_request(out: &mut Vec<u8>, id: u32, topic: &str, partition: u32, values: &[&[u8]]) {
        let records = values
            .iter()
            .map(|v| WireRecord {
                timestamp_ms: -1,
                key: None,
                value: v,
            })
            .collect();
        let req = Request::Produce {
            topic,
            partitions: vec![PartitionBatch { partition, records }],
        };
        encode_request(out, id, &req).unwrap();
    }

    /// One partition's answer in a produce response: Ok((base, last)) or the code.
    type Ack = (u32, Result<(u64, u64), ErrorCode>);

    /// The request id and each partition's answer of a produce response.
    fn acks(frame: &[u8]) -> (u32, Vec<Ack>) {
        let resp = decode_response(&frame[4..]).unwrap();
        let Some(ResponseBody::Produce { partitions }) = resp.body else {
            panic!("not a produce answer: {resp:?}");
        };
        let acks = partitions
            .iter()
            .map(|a| {
                let r = if a.code.is_ok() {
                    Ok((a.base_offset, a.last_offset))
                } else {
                    Err(a.code)
                };
                (a.partition, r)
            })
            .collect();
        (resp.request_id, acks)
    }

    /// Requests sent back to back without waiting for answers: produces are appended
    /// ahead of their answers (one group commit covers many), and everything is
    /// answered in the order it was sent. A fetch among them is served after the
    /// produces before it are answered, so it reads their records; a produce to
    /// several partitions, one refused at once, and a malformed frame keep their
    /// places; the malformed frame's error is the last answer before the close.
    #[test]
    fn pipelined_requests_are_answered_in_order_with_one_commit_for_many() {
        let r = Running::start(quiet());
        let mut c = r.client();
        c.create_topic("t", 1, &[]).unwrap();
        c.create_topic("u", 2, &[]).unwrap();
        let fsyncs_before = c.stats().unwrap().fsyncs;
        let mut s = handshaken(&r.addr);
        let values: Vec<Vec<u8>> = (0..75).map(|i| format!("v{i}").into_bytes()).collect();
        let three = |k: usize| -> Vec<&[u8]> {
            values[3 * k..3 * k + 3].iter().map(Vec::as_slice).collect()
        };
        let mut out = Vec::new();
        for k in 0..20 {
            produce_request(&mut out, 10 + k as u32, "t", 0, &three(k));
        }
        let fetch = Request::Fetch {
            topic: "t",
            partition: 0,
            offset: 0,
            max_bytes: 1 << 20,
            max_wait_ms: 0,
        };
        encode_request(&mut out, 30, &fetch).unwrap();
        let rec = |v: &'static [u8]| WireRecord {
            timestamp_ms: -1,
            key: None,
            value: v,
        };
        let two = Request::Produce {
            topic: "u",
            partitions: vec![
                PartitionBatch {
                    partition: 1,
                    records: vec![rec(b"a"), rec(b"b")],
                },
                PartitionBatch {
                    partition: 0,
                    records: vec![rec(b"c")],
                },
            ],
        };
        encode_request(&mut out, 31, &two).unwrap();
        produce_request(&mut out, 32, "nope", 0, &[b"x"]);
        for k in 20..25 {
            produce_request(&mut out, 13 + k as u32, "t", 0, &three(k));
        }
        // A frame of a known length with an unknown API key.
        out.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 99, 0xff, 0xee, 0, 0]);
        s.write_all(&out).unwrap();

        for k in 0..20u64 {
            let (id, a) = acks(&read_frame(&mut s));
            assert_eq!((id, a), (10 + k as u32, vec![(0, Ok((3 * k, 3 * k + 2)))]));
        }
        let fetched = read_frame(&mut s);
        let resp = decode_response(&fetched[4..]).unwrap();
        assert_eq!(resp.request_id, 30);
        let Some(ResponseBody::Fetch { end_offset, .. }) = resp.body else {
            panic!("not a fetch answer: {resp:?}");
        };
        assert_eq!(
            end_offset, 60,
            "the fetch reads every record answered before it"
        );
        assert_eq!(
            acks(&read_frame(&mut s)),
            (31, vec![(1, Ok((0, 1))), (0, Ok((0, 0)))])
        );
        assert_eq!(
            acks(&read_frame(&mut s)),
            (32, vec![(0, Err(ErrorCode::UNKNOWN_TOPIC))])
        );
        for k in 20..25u64 {
            let (id, a) = acks(&read_frame(&mut s));
            assert_eq!((id, a), (13 + k as u32, vec![(0, Ok((3 * k, 3 * k + 2)))]));
        }
        let last = read_frame(&mut s);
        let resp = decode_response(&last[4..]).unwrap();
        assert_eq!(resp.code, ErrorCode::UNKNOWN_API, "{resp:?}");
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "nothing after the error: {rest:?}");

        // Every record is where its answer said, and durable.
        let f = c.fetch("t", 0, 0, 1 << 20, Duration::ZERO).unwrap();
        let got: Vec<&[u8]> = f.records.iter().map(|r| r.value.as_slice()).collect();
        let want: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        assert_eq!(got, want);
        // Answered one at a time, the 25 produces to t would take 25 group commits
        // (and u's two more); appended ahead of their answers they share a few.
        let fsyncs = c.stats().unwrap().fsyncs - fsyncs_before;
        assert!(fsyncs <= 12, "{fsyncs} fsyncs for 26 pipelined produces");
        r.stop();
    }

    /// A pipelined produce whose group commit fails is answered with the failure, as
    /// is every produce after it, in order; none of their records is served.
    #[test]
    fn pipelined_produces_whose_commit_fails_are_each_refused_in_order() {
        use crate::testkit::storage::{FailOn, FailingStorage};
        let dir = tempfile::tempdir().unwrap();
        let b = Broker::open(dir.path(), Arc::new(RealStorage), BrokerOptions::default()).unwrap();
        b.create_topic("t", 1, crate::format::topic::TopicConfig::default())
            .unwrap();
        b.shutdown().unwrap();
        // Opening syncs the partition's log and directory; the third sync fails.
        let failing = FailingStorage::new(Arc::new(RealStorage), 3, FailOn::Sync, false);
        let broker = Broker::open(
            dir.path(),
            Arc::new(failing.clone()),
            BrokerOptions::default(),
        )
        .unwrap();
        assert_eq!(failing.calls(), 2);
        let r = Running::serve(dir, broker, quiet());
        let mut s = handshaken(&r.addr);
        let mut out = Vec::new();
        for id in 10..18 {
            produce_request(&mut out, id, "t", 0, &[b"a", b"b"]);
        }
        s.write_all(&out).unwrap();
        for id in 10..18 {
            let (got, a) = acks(&read_frame(&mut s));
            assert_eq!(got, id);
            assert!(
                matches!(a.as_slice(), [(0, Err(code))] if !code.is_ok()),
                "request {id}: {a:?}"
            );
        }
        assert!(failing.has_failed());
        let f = r.client().fetch("t", 0, 0, 1 << 20, Duration::ZERO);
        assert!(f.map_or(true, |f| f.records.is_empty()));
        r.stop();
    }

    /// Reads one response frame (`frame_len` included).
    fn read_frame(s: &mut TcpStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut frame = len.to_vec();
        frame.resize(4 + u32::from_be_bytes(len) as usize, 0);
        s.read_exact(&mut frame[4..]).unwrap();
        frame
    }

    /// A large fetch is streamed from the segment files, and the bytes on the wire
    /// are exactly the response encoded whole from the same fetch: over several
    /// segments, twice on one connection, then a small fetch and another request.
    #[test]
    fn a_streamed_fetch_sends_exactly_the_whole_response() {
        use crate::engine::broker::NewRecord;
        use crate::format::topic::TopicConfig;
        use crate::format::wire::{encode_response, ApiKey, Chunk};

        let r = Running::start(quiet());
        let config = TopicConfig {
            segment_bytes: 1 << 20,
            ..TopicConfig::default()
        };
        r.broker.create_topic("t", 1, config).unwrap();
        let value = vec![5u8; 1000];
        let recs: Vec<NewRecord<'_>> = (0..100)
            .map(|_| NewRecord {
                key: None,
                value: &value,
                timestamp_ms: 1,
            })
            .collect();
        for _ in 0..35 {
            r.broker.produce("t", 0, &recs).unwrap();
        }
        let mut s = TcpStream::connect(&r.addr).unwrap();
        let mut out = Vec::new();
        let hello = Request::Handshake {
            min_version: 1,
            max_version: PROTOCOL_VERSION,
            token: None,
        };
        encode_request(&mut out, 1, &hello).unwrap();
        s.write_all(&out).unwrap();
        read_frame(&mut s);
        for (id, offset, max_bytes) in [
            (9u32, 10u64, 8u32 << 20),
            (10, 1500, 2 << 20),
            (11, 3, 1000),
            (12, 3499, 8 << 20),
        ] {
            let f = r
                .broker
                .fetch("t", 0, offset, max_bytes, Duration::ZERO)
                .unwrap();
            if max_bytes > super::super::dispatch::STREAM_FETCH_MIN_BYTES {
                assert!(f.chunks.len() >= 2 || offset == 3499, "{}", f.chunks.len());
            }
            let body = ResponseBody::Fetch {
                start_offset: f.start_offset,
                end_offset: f.end_offset,
                chunks: f
                    .chunks
                    .iter()
                    .map(|c| Chunk {
                        generation: c.generation,
                        bytes: &c.bytes,
                    })
                    .collect(),
            };
            let mut want = Vec::new();
            let api = ApiKey::Fetch as u16;
            encode_response(&mut want, id, api, ErrorCode::NONE, "", Some(&body)).unwrap();
            let fetch = Request::Fetch {
                topic: "t",
                partition: 0,
                offset,
                max_bytes,
                max_wait_ms: 0,
            };
            out.clear();
            encode_request(&mut out, id, &fetch).unwrap();
            s.write_all(&out).unwrap();
            let got = read_frame(&mut s);
            assert_eq!(got.len(), want.len(), "fetch {id}");
            assert!(got == want, "fetch {id}: the bytes differ");
        }
        out.clear();
        encode_request(&mut out, 13, &Request::ListTopics).unwrap();
        s.write_all(&out).unwrap();
        let resp = read_frame(&mut s);
        let resp = decode_response(&resp[4..]).unwrap();
        assert_eq!((resp.request_id, resp.code), (13, ErrorCode::NONE));
        r.stop();
    }
}
