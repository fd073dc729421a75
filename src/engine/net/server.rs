//! The TCP server: accepts connections and answers protocol requests by calling the
//! [`Broker`]. One thread per connection (bounded by `max_connections`); no async
//! runtime.
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
//!   frame boundary; `run` returns once every connection thread has ended. The caller
//!   then shuts the broker down.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::engine::broker::{Broker, NewRecord};
use crate::engine::error::EngineError;
use crate::engine::maintenance::compaction::CompactionError;
use crate::engine::storage::layout::LayoutError;
use crate::format::names::validate_name;
use crate::format::topic::{TopicConfig, CONFIG_KEYS};
use crate::format::wire::{
    check_frame_len, decode_request, encode_error, encode_response, frame_head, ApiKey, Chunk,
    CleanupInfo, ErrorCode, PartitionAck, PartitionBatch, PartitionDescription, PartitionOffsets,
    Request, ResponseBody, StatsBody, API_KEY_NONE, CLEANUP_INFO_VERSION, FRAME_BYTES_MAX,
    LEN_FIELD, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};

/// How often an idle connection and the accept loop look at the stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Sleep of the non-blocking accept loop when no connection is waiting.
const ACCEPT_SLEEP: Duration = Duration::from_millis(5);
/// Longest a long-poll fetch waits inside the broker before the server looks at
/// the stop flag again.
const FETCH_SLICE: Duration = Duration::from_millis(200);
/// Step by which a frame buffer grows while its bytes arrive.
const READ_STEP_BYTES: usize = 1 << 20;
/// How long a stopping server waits for a peer stalled in the middle of a frame.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// Largest buffer a connection keeps between requests.
const BUFFER_KEEP_BYTES: usize = 4 << 20;

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
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_connections: 1024,
            io_timeout: Duration::from_secs(30),
            log_errors: true,
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
        Ok(Server {
            listener,
            local_addr,
            broker,
            opts,
            stop: Arc::new(AtomicBool::new(false)),
            active: Arc::new(AtomicUsize::new(0)),
        })
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
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let result = self.accept_loop(also_stop, &mut threads);
        self.stop.store(true, Ordering::SeqCst);
        for t in threads {
            let _ = t.join();
        }
        result
    }

    fn accept_loop(
        &self,
        also_stop: &AtomicBool,
        threads: &mut Vec<JoinHandle<()>>,
    ) -> io::Result<()> {
        let mut starved = Starved::new();
        while !self.stop.load(Ordering::SeqCst) && !also_stop.load(Ordering::SeqCst) {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    starved.backoff = ACCEPT_BACKOFF_MIN;
                    threads.retain(|t| !t.is_finished());
                    self.start_connection(stream, peer, threads);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_SLEEP),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of file descriptors: refuse the waiting connection through the
                // spare descriptor, and back off; keep serving the others.
                Err(e) if is_out_of_descriptors(&e) => {
                    let refused = starved.refuse(&self.listener);
                    starved.note(&self.local_addr, &e, refused);
                    thread::sleep(starved.backoff);
                    starved.backoff = (starved.backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
                Err(e) => {
                    starved.note(&self.local_addr, &e, false);
                    thread::sleep(POLL_INTERVAL);
                }
            }
        }
        Ok(())
    }

    fn start_connection(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
        threads: &mut Vec<JoinHandle<()>>,
    ) {
        if self.active.load(Ordering::SeqCst) >= self.opts.max_connections {
            let mut out = Vec::new();
            let msg = format!(
                "the broker serves at most {} connections",
                self.opts.max_connections
            );
            encode_error(
                &mut out,
                0,
                API_KEY_NONE,
                ErrorCode::TOO_MANY_CONNECTIONS,
                &msg,
            );
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(POLL_INTERVAL));
            let _ = stream.write_all(&out);
            tracing::warn!(%peer, max_connections = self.opts.max_connections, "refused a connection");
            return;
        }
        self.active.fetch_add(1, Ordering::SeqCst);
        let conn = Connection {
            stream,
            peer,
            broker: Arc::clone(&self.broker),
            stop: Arc::clone(&self.stop),
            opts: self.opts.clone(),
            frame: Vec::new(),
            out: Vec::new(),
            handshaken: false,
            version: PROTOCOL_VERSION_MIN,
        };
        let active = Arc::clone(&self.active);
        let spawned = thread::Builder::new()
            .name(format!("seglog-conn-{peer}"))
            .spawn(move || {
                conn.serve();
                active.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                self.active.fetch_sub(1, Ordering::SeqCst);
                tracing::warn!(%peer, error = %e, "refused a connection: cannot start its thread");
            }
        }
    }
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
    fn refuse(&mut self, listener: &TcpListener) -> bool {
        if self.spare.take().is_none() {
            return false;
        }
        let refused = match listener.accept() {
            Ok((mut stream, _)) => {
                let mut out = Vec::new();
                encode_error(
                    &mut out,
                    0,
                    API_KEY_NONE,
                    ErrorCode::TOO_MANY_CONNECTIONS,
                    "the broker is out of file descriptors",
                );
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(POLL_INTERVAL));
                let _ = stream.write_all(&out);
                true
            }
            Err(_) => false,
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
}

/// One accepted connection, served on its own thread.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    broker: Arc<Broker>,
    stop: Arc<AtomicBool>,
    opts: ServerOptions,
    frame: Vec<u8>,
    out: Vec<u8>,
    handshaken: bool,
    /// The protocol version agreed in the handshake.
    version: u16,
}

impl Connection {
    fn serve(mut self) {
        let setup = self
            .stream
            .set_nonblocking(false)
            .and_then(|()| self.stream.set_nodelay(true))
            .and_then(|()| self.stream.set_read_timeout(Some(POLL_INTERVAL)))
            .and_then(|()| self.stream.set_write_timeout(Some(self.opts.io_timeout)));
        if setup.is_err() {
            return;
        }
        // A stopping server takes no new request, even one already sent.
        while !self.stop.load(Ordering::SeqCst) {
            match self.read_frame() {
                Ok(()) => {}
                Err(ReadEnd::Closed) => break,
                Err(ReadEnd::BadLength(detail)) => {
                    self.out.clear();
                    encode_error(
                        &mut self.out,
                        0,
                        API_KEY_NONE,
                        ErrorCode::FRAME_TOO_LARGE,
                        &detail,
                    );
                    self.log(&detail);
                    self.send_and_close();
                    return;
                }
                Err(ReadEnd::Failed(e)) => {
                    self.log(&format!("reading a request failed: {e}"));
                    break;
                }
            }
            let close = self.handle_frame();
            if close {
                self.send_and_close();
                return;
            }
            if self.stream.write_all(&self.out).is_err() {
                break;
            }
            // A large request or fetch does not pin its buffers for the life of
            // the connection.
            for buf in [&mut self.frame, &mut self.out] {
                if buf.capacity() > BUFFER_KEEP_BYTES {
                    *buf = Vec::new();
                }
            }
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn log(&self, detail: &str) {
        if self.opts.log_errors {
            tracing::warn!(peer = %self.peer, "closing the connection: {detail}");
        }
    }

    /// Sends the response in `out`, then closes: the write side first so the peer
    /// reads the response before the end of stream.
    fn send_and_close(&mut self) {
        let _ = self.stream.write_all(&self.out);
        let _ = self.stream.shutdown(Shutdown::Write);
        // Drain briefly so unread request bytes do not turn the close into a reset
        // that could discard the response before the peer reads it.
        let deadline = Instant::now() + POLL_INTERVAL * 5;
        let mut sink = [0u8; 4096];
        while Instant::now() < deadline {
            match self.stream.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if is_timeout(&e) => {}
                Err(_) => break,
            }
        }
    }

    /// Reads bytes into `buf[*filled..]` until full. At a frame boundary (nothing
    /// read yet) a stop request or a clean end of stream ends the connection.
    fn fill(&mut self, buf_len: usize, filled: &mut usize, boundary: bool) -> Result<(), ReadEnd> {
        let mut last_progress = Instant::now();
        while *filled < buf_len {
            let Some(dst) = self.frame.get_mut(*filled..buf_len) else {
                return Err(ReadEnd::Failed(io::Error::other("frame buffer too short")));
            };
            match self.stream.read(dst) {
                Ok(0) if boundary && *filled == 0 => return Err(ReadEnd::Closed),
                Ok(0) => return Err(ReadEnd::Failed(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => {
                    *filled += n;
                    last_progress = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {
                    if boundary && *filled == 0 {
                        if self.stop.load(Ordering::SeqCst) {
                            return Err(ReadEnd::Closed);
                        }
                    } else {
                        // Mid-frame: wait for a slow peer, but not long once stopping.
                        let patience = if self.stop.load(Ordering::SeqCst) {
                            STOP_GRACE.min(self.opts.io_timeout)
                        } else {
                            self.opts.io_timeout
                        };
                        if last_progress.elapsed() > patience {
                            return Err(ReadEnd::Failed(e));
                        }
                    }
                }
                Err(e) => return Err(ReadEnd::Failed(e)),
            }
        }
        Ok(())
    }

    /// Reads one frame (the bytes after `frame_len`) into `self.frame`.
    fn read_frame(&mut self) -> Result<(), ReadEnd> {
        self.frame.clear();
        self.frame.resize(LEN_FIELD, 0);
        let mut filled = 0;
        self.fill(LEN_FIELD, &mut filled, true)?;
        let mut len_bytes = [0u8; LEN_FIELD];
        len_bytes.copy_from_slice(self.frame.get(..LEN_FIELD).unwrap_or(&[0; LEN_FIELD]));
        let len = check_frame_len(u32::from_be_bytes(len_bytes))
            .map_err(|e| ReadEnd::BadLength(e.to_string()))?;
        // Grow in steps as bytes arrive: a peer announcing 64 MiB and sending
        // nothing holds at most one step.
        self.frame.clear();
        let mut filled = 0;
        while filled < len {
            let target = len.min(filled + READ_STEP_BYTES);
            self.frame.resize(target, 0);
            self.fill(target, &mut filled, false)?;
        }
        Ok(())
    }

    /// Decodes and answers the frame in `self.frame`, leaving the response in
    /// `self.out`. Returns true when the connection must close after it.
    fn handle_frame(&mut self) -> bool {
        self.out.clear();
        let (id, api_key) = frame_head(&self.frame).unwrap_or((0, API_KEY_NONE));
        let frame = std::mem::take(&mut self.frame);
        let close = match decode_request(&frame) {
            Err(e) => {
                let code = match e {
                    crate::format::wire::ProtocolError::UnknownApi { .. } => ErrorCode::UNKNOWN_API,
                    _ => ErrorCode::MALFORMED,
                };
                let detail = format!("malformed {} request: {e}", api_name(api_key));
                encode_error(&mut self.out, id, api_key, code, &detail);
                self.log(&detail);
                true
            }
            Ok((_, req)) => self.dispatch(id, req),
        };
        self.frame = frame;
        close
    }

    fn dispatch(&mut self, id: u32, req: Request<'_>) -> bool {
        let api = req.api_key() as u16;
        if let Request::Handshake {
            min_version,
            max_version,
        } = req
        {
            if min_version > PROTOCOL_VERSION
                || max_version < PROTOCOL_VERSION_MIN
                || min_version > max_version
            {
                let msg = format!(
                    "client speaks protocol versions {min_version}..={max_version}, the broker \
                     {PROTOCOL_VERSION_MIN}..={PROTOCOL_VERSION}"
                );
                encode_error(&mut self.out, id, api, ErrorCode::UNSUPPORTED_VERSION, &msg);
                return true;
            }
            self.handshaken = true;
            let version = max_version.min(PROTOCOL_VERSION);
            self.version = version;
            self.reply(
                id,
                api,
                &ResponseBody::Handshake {
                    version,
                    frame_bytes_max: FRAME_BYTES_MAX,
                },
            );
            return false;
        }
        if !self.handshaken {
            let msg = format!(
                "the first request must be a handshake, not {}",
                req.api_key().name()
            );
            encode_error(&mut self.out, id, api, ErrorCode::HANDSHAKE_REQUIRED, &msg);
            return true;
        }
        let result = match req {
            Request::Handshake { .. } => Ok(()),
            Request::Produce { topic, partitions } => self.produce(id, api, topic, &partitions),
            Request::Fetch {
                topic,
                partition,
                offset,
                max_bytes,
                max_wait_ms,
            } => self.fetch(id, api, topic, partition, offset, max_bytes, max_wait_ms),
            Request::ListOffsets { topic } => self.list_offsets(id, api, topic),
            Request::CreateTopic {
                topic,
                partitions,
                settings,
            } => self.create_topic(id, api, topic, partitions, &settings),
            Request::DeleteTopic { topic } => self.delete_topic(id, api, topic),
            Request::ListTopics => {
                let topics = self.broker.list_topics();
                let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                self.reply(id, api, &ResponseBody::ListTopics { topics: names });
                Ok(())
            }
            Request::DescribeTopic { topic } => self.describe_topic(id, api, topic),
            Request::AlterTopic { topic, settings } => self.alter_topic(id, api, topic, &settings),
            Request::Stats => {
                let s = self.broker.stats();
                let body = StatsBody {
                    fsyncs: s.fsyncs,
                    produce_requests: s.produce_requests,
                    records_appended: s.records_appended,
                };
                self.reply(id, api, &ResponseBody::Stats(body));
                Ok(())
            }
            Request::Group(g) => {
                super::groups::serve(&self.broker, self.version, &self.stop, id, g, &mut self.out);
                Ok(())
            }
            Request::Producer(p) => {
                super::producers::serve(
                    &self.broker,
                    self.version,
                    &self.stop,
                    id,
                    p,
                    &mut self.out,
                );
                Ok(())
            }
        };
        if let Err((code, msg)) = result {
            if self.opts.log_errors {
                tracing::info!(
                    peer = %self.peer,
                    request = api_name(api),
                    code = code.name(),
                    "client error: {msg}"
                );
            }
            self.out.clear();
            encode_error(&mut self.out, id, api, code, &msg);
        }
        false
    }

    /// Encodes a successful response into `out`.
    fn reply(&mut self, id: u32, api: u16, body: &ResponseBody<'_>) {
        self.out.clear();
        if let Err(e) = encode_response(&mut self.out, id, api, ErrorCode::NONE, "", Some(body)) {
            let msg = format!("cannot encode the {} response: {e}", api_name(api));
            encode_error(&mut self.out, id, api, ErrorCode::INTERNAL, &msg);
        }
    }

    fn produce(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        batches: &[PartitionBatch<'_>],
    ) -> Answer {
        name_ok(topic)?;
        let broker = &self.broker;
        let one = |batch: &PartitionBatch<'_>| -> Result<(u64, u64), EngineError> {
            let records: Vec<NewRecord<'_>> = batch
                .records
                .iter()
                .map(|r| NewRecord {
                    key: r.key,
                    value: r.value,
                    timestamp_ms: r.timestamp_ms,
                })
                .collect();
            broker
                .produce(topic, batch.partition, &records)
                .map(|p| (p.base_offset, p.last_offset))
        };
        // Each partition has its own files and fsyncs: serve them side by side.
        let results: Vec<Result<(u64, u64), (ErrorCode, String)>> = if batches.len() <= 1 {
            batches
                .iter()
                .map(|b| one(b).map_err(engine_error))
                .collect()
        } else {
            thread::scope(|s| {
                let handles: Vec<_> = batches.iter().map(|b| s.spawn(move || one(b))).collect();
                handles
                    .into_iter()
                    .map(|h| match h.join() {
                        Ok(r) => r.map_err(engine_error),
                        Err(_) => {
                            Err((ErrorCode::INTERNAL, "the produce worker failed".to_string()))
                        }
                    })
                    .collect()
            })
        };
        let acks = batches
            .iter()
            .zip(&results)
            .map(|(b, r)| match r {
                Ok((base_offset, last_offset)) => PartitionAck {
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
        self.reply(id, api, &ResponseBody::Produce { partitions: acks });
        Ok(())
    }

    #[expect(clippy::too_many_arguments, reason = "the fields of a fetch request")]
    fn fetch(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait_ms: u32,
    ) -> Answer {
        name_ok(topic)?;
        // Long-poll in slices so a stopping server is never held up by a waiting
        // consumer for more than one slice.
        let deadline = Instant::now() + Duration::from_millis(u64::from(max_wait_ms));
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(FETCH_SLICE);
            let r = self
                .broker
                .fetch(topic, partition, offset, max_bytes, slice)
                .map_err(engine_error)?;
            let has_data = r.chunks.iter().any(|c| !c.bytes.is_empty());
            if has_data || left <= slice || self.stop.load(Ordering::SeqCst) {
                break r;
            }
        };
        let chunks = result
            .chunks
            .iter()
            .map(|c| Chunk {
                generation: c.generation,
                bytes: &c.bytes,
            })
            .collect();
        let body = ResponseBody::Fetch {
            start_offset: result.start_offset,
            end_offset: result.end_offset,
            chunks,
        };
        self.reply(id, api, &body);
        Ok(())
    }

    fn list_offsets(&mut self, id: u32, api: u16, topic: &str) -> Answer {
        name_ok(topic)?;
        let n = self.broker.partition_count(topic).map_err(engine_error)?;
        let mut partitions = Vec::with_capacity(n as usize);
        for partition in 0..n {
            let (start_offset, end_offset) = self
                .broker
                .offsets(topic, partition)
                .map_err(engine_error)?;
            partitions.push(PartitionOffsets {
                partition,
                start_offset,
                end_offset,
            });
        }
        self.reply(id, api, &ResponseBody::ListOffsets { partitions });
        Ok(())
    }

    fn create_topic(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        partitions: u32,
        settings: &[(&str, &str)],
    ) -> Answer {
        name_ok(topic)?;
        let mut config = TopicConfig::default();
        for (k, v) in settings {
            config.set(k, v).map_err(|e| {
                (
                    ErrorCode::INVALID_CONFIG,
                    format!("invalid topic configuration: {e}"),
                )
            })?;
        }
        self.broker
            .create_topic(topic, partitions, config)
            .map_err(engine_error)?;
        self.reply(id, api, &ResponseBody::CreateTopic);
        Ok(())
    }

    fn delete_topic(&mut self, id: u32, api: u16, topic: &str) -> Answer {
        name_ok(topic)?;
        self.broker.delete_topic(topic).map_err(engine_error)?;
        self.reply(id, api, &ResponseBody::DeleteTopic);
        Ok(())
    }

    fn describe_topic(&mut self, id: u32, api: u16, topic: &str) -> Answer {
        name_ok(topic)?;
        let d = self.broker.describe_topic(topic).map_err(engine_error)?;
        let partitions = d
            .partitions
            .iter()
            .map(|p| PartitionDescription {
                partition: p.partition,
                start_offset: p.start_offset,
                end_offset: p.end_offset,
                segments: p.segments,
                bytes: p.bytes,
            })
            .collect();
        let cleanup = (self.version >= CLEANUP_INFO_VERSION).then(|| {
            d.partitions
                .iter()
                .map(|p| {
                    let c = &p.cleanup;
                    CleanupInfo {
                        partition: p.partition,
                        last_retention_ms: c.last_retention_ms,
                        segments_deleted: c.segments_deleted,
                        bytes_deleted: c.bytes_deleted,
                        segments_archived: c.segments_archived,
                        last_compaction_ms: c.last_compaction_ms,
                        compactions: c.compactions,
                        records_dropped: c.records_dropped,
                        bytes_compacted: c.bytes_compacted,
                        last_error: c.last_error.clone().unwrap_or_default(),
                    }
                })
                .collect()
        });
        let text = config_settings(&d.config);
        let settings = text.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.reply(
            id,
            api,
            &ResponseBody::DescribeTopic {
                partitions,
                settings,
                cleanup,
            },
        );
        Ok(())
    }

    fn alter_topic(&mut self, id: u32, api: u16, topic: &str, settings: &[(&str, &str)]) -> Answer {
        name_ok(topic)?;
        let owned: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config = self
            .broker
            .alter_topic(topic, &owned)
            .map_err(engine_error)?;
        let text = config_settings(&config);
        let settings = text.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.reply(id, api, &ResponseBody::AlterTopic { settings });
        Ok(())
    }
}

/// A handler's outcome: the response is in `out`, or the error to send instead.
type Answer = Result<(), (ErrorCode, String)>;

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn api_name(key: u16) -> &'static str {
    ApiKey::from_u16(key).map_or("unknown", ApiKey::name)
}

/// Topic names are checked at the network boundary too, so a path-like name never
/// reaches the engine.
fn name_ok(topic: &str) -> Result<(), (ErrorCode, String)> {
    validate_name(topic).map_err(|e| (ErrorCode::INVALID_NAME, format!("invalid topic name: {e}")))
}

/// Every configuration key with its value as text, in display order.
pub fn config_settings(config: &TopicConfig) -> Vec<(&'static str, String)> {
    let json = config.to_json();
    CONFIG_KEYS
        .iter()
        .map(|k| {
            let v = match json.get(*k) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            (*k, v)
        })
        .collect()
}

/// The wire error code and message for an engine error.
pub fn engine_error(e: EngineError) -> (ErrorCode, String) {
    let code = match &e {
        EngineError::UnknownTopic { .. } | EngineError::TopicDeleted { .. } => {
            ErrorCode::UNKNOWN_TOPIC
        }
        EngineError::UnknownPartition { .. } => ErrorCode::UNKNOWN_PARTITION,
        EngineError::TopicExists { .. } => ErrorCode::TOPIC_EXISTS,
        EngineError::InvalidName(_) => ErrorCode::INVALID_NAME,
        EngineError::InvalidConfig(_) => ErrorCode::INVALID_CONFIG,
        EngineError::OffsetOutOfRange { .. } => ErrorCode::OFFSET_OUT_OF_RANGE,
        EngineError::RecordTooLarge { .. } | EngineError::BatchTooLarge { .. } => {
            ErrorCode::RECORD_TOO_LARGE
        }
        EngineError::InvalidRequest { .. } => ErrorCode::INVALID_REQUEST,
        EngineError::PartitionFailed { .. } => ErrorCode::PARTITION_FAILED,
        EngineError::PartitionUnavailable { .. } => ErrorCode::PARTITION_UNAVAILABLE,
        EngineError::Corrupt { .. }
        | EngineError::RecordsDamaged { .. }
        | EngineError::TopicOffline { .. } => ErrorCode::CORRUPT_DATA,
        EngineError::ShuttingDown => ErrorCode::SHUTTING_DOWN,
        EngineError::Io { .. } => ErrorCode::STORAGE,
        EngineError::Recovery { .. } => ErrorCode::CORRUPT_DATA,
        EngineError::Compaction(c) => match c {
            CompactionError::Io { .. } => ErrorCode::STORAGE,
            CompactionError::Unreadable { .. } => ErrorCode::CORRUPT_DATA,
            _ => ErrorCode::INVALID_REQUEST,
        },
        EngineError::TopicMeta { source, .. } => match source.as_ref() {
            LayoutError::Io { .. } => ErrorCode::STORAGE,
            _ => ErrorCode::CORRUPT_DATA,
        },
        _ => ErrorCode::INTERNAL,
    };
    (code, e.to_string())
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;

    use super::*;
    use crate::engine::broker::BrokerOptions;
    use crate::engine::net::client::{Client, ClientError};
    use crate::engine::storage::io::RealStorage;
    use crate::format::wire::{decode_response, encode_request, PartitionBatch, WireRecord};

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
}
