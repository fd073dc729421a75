//! Request dispatch: one decoded request → one engine call → one encoded response.
//! The connection layer ([`super::server`]) reads frames and writes responses; this
//! module is the only place that maps protocol requests to [`Broker`] calls, so a new
//! request type is one more arm in [`Session::dispatch`].
//!
//! Invariants:
//! - The first request on a connection must be a handshake; the version it agrees
//!   gates every later field. It also logs in ([`super::auth::login`]), and every
//!   later request passes [`super::auth::authorize`] before it reaches the broker.
//! - A frame that cannot be decoded gets one error response (request id 0 when the
//!   id itself could not be read) and the connection is to be closed.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::broker::{Broker, Commit, DurableWait, FetchSpan, NewRecord, PartitionState};
use crate::engine::error::EngineError;
use crate::engine::maintenance::compaction::CompactionError;
use crate::engine::net::metrics::{stored_len, NetMetrics, TopicCache};
use crate::engine::partition::buffers;
use crate::engine::replication::types::ProduceEntry;
use crate::engine::replication::{Refusal, Replicator};
use crate::engine::storage::layout::LayoutError;
use crate::format::names::validate_name;
use crate::format::topic::{TopicConfig, CONFIG_KEYS};
use crate::format::wire::producers::ProducerRequest;
use crate::format::wire::{
    decode_request, encode_error, encode_fetch_response_head, encode_response, frame_head, ApiKey,
    Chunk, CleanupInfo, ErrorCode, PartitionAck, PartitionBatch, PartitionDescription,
    PartitionOffsets, Request, ResponseBody, StatsBody, API_KEY_NONE, CLEANUP_INFO_VERSION,
    CLUSTER_VERSION, FETCH_BYTES_MAX, FRAME_BYTES_MAX, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};
use crate::format::wire::{
    HealthState, PartitionHealth, WriteStats, LATENCY_BUCKETS_MAX, PARTITION_HEALTH_VERSION,
    WRITE_STATS_VERSION,
};

// The broker's fsync histogram fits a stats response.
const _: () = assert!(crate::engine::partition::zero::FSYNC_BUCKETS as u32 <= LATENCY_BUCKETS_MAX);

/// Longest a long-poll fetch waits inside the broker before the server looks at
/// the stop flag again.
const FETCH_SLICE: Duration = Duration::from_millis(200);

/// A fetch asking for more than this is streamed ([`StreamedFetch`]): its records
/// are validated and then sent from their files a slice at a time, instead of being
/// copied into the response. Smaller ones fit the caches and go out in one write.
pub const STREAM_FETCH_MIN_BYTES: u32 = 1 << 20;

/// A fetch response whose records are sent from their segment files: the
/// session's response buffer holds the frame without the chunks' bytes, and
/// chunk `i` (the records of `spans[i]`) belongs at `splits[i]` in it
/// ([`encode_fetch_response_head`]). The bytes sent are exactly those of the
/// response encoded whole.
#[derive(Debug)]
pub struct StreamedFetch {
    pub splits: Vec<usize>,
    pub spans: Vec<FetchSpan>,
}

/// An answer that is not ready yet: the encoded response of a pipelined produce,
/// once its records are durable ([`Session::handle_frame_pipelined`]).
pub type Deferred = Pin<Box<dyn Future<Output = Vec<u8>> + Send>>;

/// One connection's protocol state: the handshake, the agreed version, and the
/// response buffer (reused from request to request).
pub struct Session {
    broker: Arc<Broker>,
    peer: SocketAddr,
    stop: Arc<AtomicBool>,
    log_errors: bool,
    /// Produce requests of the whole server between their append and their
    /// acknowledgement (see [`Session::produce`]).
    waiting: Arc<AtomicUsize>,
    out: Vec<u8>,
    /// The last response's streamed part, when it is a streamed fetch.
    stream: Option<StreamedFetch>,
    /// The frame being handled may be answered later ([`Session::handle_frame_pipelined`]).
    may_defer: bool,
    /// The last frame's answer, when it comes later (in a mutex only so that the
    /// session stays `Sync`: it is only reached through `&mut self`).
    deferred: std::sync::Mutex<Option<Deferred>>,
    handshaken: bool,
    /// The protocol version agreed in the handshake.
    version: u16,
    /// Request and traffic counters, when the server keeps them.
    metrics: Option<Arc<NetMetrics>>,
    topic_counters: TopicCache,
    /// The API key this connection logged in with.
    login: super::auth::Login,
    /// What a client may ask (checked before each request is served).
    limits: Arc<super::limits::Limits>,
    /// The cluster's replication, on a node started with `--peers`.
    replication: Option<Arc<dyn Replicator>>,
    /// The address the broker listens on, shown by a standalone broker's cluster
    /// status.
    listen_addr: Option<SocketAddr>,
}

impl Session {
    /// A session before its handshake.
    pub fn new(
        broker: Arc<Broker>,
        peer: SocketAddr,
        stop: Arc<AtomicBool>,
        log_errors: bool,
        waiting: Arc<AtomicUsize>,
    ) -> Self {
        Session {
            broker,
            peer,
            stop,
            log_errors,
            waiting,
            out: Vec::new(),
            stream: None,
            may_defer: false,
            deferred: std::sync::Mutex::new(None),
            handshaken: false,
            version: PROTOCOL_VERSION_MIN,
            metrics: None,
            topic_counters: TopicCache::default(),
            login: super::auth::Login::default(),
            limits: Arc::default(),
            replication: None,
            listen_addr: None,
        }
    }

    /// The address this session's listener is bound to.
    pub fn with_listen_addr(mut self, addr: SocketAddr) -> Self {
        self.listen_addr = Some(addr);
        self
    }

    /// Routes the requests of replicated topics through `replication`.
    pub fn with_replication(mut self, replication: Option<Arc<dyn Replicator>>) -> Self {
        self.replication = replication;
        self
    }

    /// The replication of `topic`, when it is a replicated topic.
    fn replicated(&self, topic: &str) -> Option<Arc<dyn Replicator>> {
        self.replication
            .as_ref()
            .filter(|r| r.is_replicated(topic))
            .cloned()
    }

    /// For a topic this node has no replica of, in a cluster: per partition, the
    /// refusal that sends the client to a node holding one ([`Replicator::elsewhere`]).
    /// `None` when this node has the topic, is not in a cluster, or no node holds it
    /// (the request is then answered as for any unknown topic).
    async fn held_elsewhere(&self, topic: &str, partitions: Vec<u32>) -> Option<Vec<Refusal>> {
        held_elsewhere(&self.broker, self.replication.as_ref(), topic, partitions).await
    }

    /// Checks every request against `limits`.
    pub fn with_limits(mut self, limits: Arc<super::limits::Limits>) -> Self {
        self.limits = limits;
        self
    }

    /// Counts this session's requests and traffic in `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<NetMetrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The response to the last frame handled (a whole frame, `frame_len` included).
    pub fn response(&self) -> &[u8] {
        &self.out
    }

    /// The response buffer, for the connection layer to fill with its own errors or
    /// to shrink.
    pub fn response_mut(&mut self) -> &mut Vec<u8> {
        self.stream = None;
        &mut self.out
    }

    /// The streamed part of the last response, when it is a streamed fetch: the
    /// connection layer sends [`Session::response`] with the spans' bytes spliced in.
    pub fn take_stream(&mut self) -> Option<StreamedFetch> {
        self.stream.take()
    }

    fn log(&self, detail: &str) {
        if self.log_errors {
            tracing::warn!(peer = %self.peer, "closing the connection: {detail}");
        }
    }

    /// Decodes and answers one frame (the bytes after `frame_len`), leaving the
    /// response in [`Session::response`]. Returns true when the connection must close after it.
    pub async fn handle_frame(&mut self, frame: &[u8]) -> bool {
        let began = self.metrics.is_some().then(Instant::now);
        let close = self.handle_frame_inner(frame).await;
        if let (Some(m), Some(t)) = (self.metrics.clone(), began) {
            let api_key = frame_head(frame).map_or(API_KEY_NONE, |(_, k)| k);
            match self.take_deferred() {
                Some(answer) => {
                    self.set_deferred(Box::pin(async move {
                        let out = answer.await;
                        m.request(api_key, t.elapsed());
                        out
                    }));
                }
                None => m.request(api_key, t.elapsed()),
            }
        }
        close
    }

    /// [`Session::handle_frame`] for a client that sends requests ahead of their
    /// answers (the connection layer answers them in order): a produce whose records
    /// this node writes is appended now, and its answer, which waits for their group
    /// commit, is left in [`Session::take_deferred`] instead of the response buffer,
    /// so the connection can read and append the next requests meanwhile. Any other
    /// request is answered as by `handle_frame`.
    pub async fn handle_frame_pipelined(&mut self, frame: &[u8]) -> bool {
        self.may_defer = true;
        let close = self.handle_frame(frame).await;
        self.may_defer = false;
        close
    }

    /// The last frame's answer when it comes later ([`Session::handle_frame_pipelined`]);
    /// `None` when it is in [`Session::response`].
    pub fn take_deferred(&mut self) -> Option<Deferred> {
        self.deferred
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn set_deferred(&mut self, answer: Deferred) {
        *self
            .deferred
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(answer);
    }

    async fn handle_frame_inner(&mut self, frame: &[u8]) -> bool {
        self.out.clear();
        self.stream = None;
        self.take_deferred();
        let (id, api_key) = frame_head(frame).unwrap_or((0, API_KEY_NONE));
        match decode_request(frame) {
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
            Ok((_, req)) => self.dispatch(id, req).await,
        }
    }

    async fn dispatch(&mut self, id: u32, req: Request<'_>) -> bool {
        let api = req.api_key() as u16;
        if let Request::Handshake {
            min_version,
            max_version,
            token,
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
            let keys = self.broker.keys();
            let metrics = self.metrics.as_ref();
            if let Err((code, msg)) =
                super::auth::login(keys, token, self.peer, metrics, &mut self.login)
            {
                encode_error(&mut self.out, id, api, code, &msg);
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
                    frame_bytes_max: self.limits.frame_bytes_max.min(FRAME_BYTES_MAX),
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
        if let Err(refused) = super::auth::authorize(self.broker.keys(), &mut self.login, &req) {
            self.refuse(id, api, refused);
            return false;
        }
        let limited = super::limits::check_request(&self.limits, &self.broker, &req);
        let result = match req {
            _ if limited.is_err() => limited,
            Request::Handshake { .. } => Ok(()),
            Request::Produce { topic, partitions } => {
                self.produce(id, api, topic, &partitions).await
            }
            Request::Fetch {
                topic,
                partition,
                offset,
                max_bytes,
                max_wait_ms,
            } => {
                self.fetch(id, api, topic, partition, offset, max_bytes, max_wait_ms)
                    .await
            }
            Request::ListOffsets { topic } => self.list_offsets(id, api, topic).await,
            Request::CreateTopic {
                topic,
                partitions,
                settings,
            } => {
                self.create_topic(id, api, topic, partitions, &settings)
                    .await
            }
            Request::DeleteTopic { topic } => self.delete_topic(id, api, topic).await,
            Request::ListTopics => {
                let topics = self.broker.list_topics();
                let keys = self.broker.keys();
                let names: Vec<&str> = topics
                    .iter()
                    .map(String::as_str)
                    .filter(|t| super::auth::may_see(keys, &self.login, t))
                    .collect();
                self.reply(id, api, &ResponseBody::ListTopics { topics: names });
                Ok(())
            }
            Request::DescribeTopic { topic } => self.describe_topic(id, api, topic).await,
            Request::AlterTopic { topic, settings } => {
                self.alter_topic(id, api, topic, &settings).await
            }
            Request::Stats => {
                let s = self.broker.stats();
                let write = (self.version >= WRITE_STATS_VERSION).then(|| WriteStats {
                    fsync_latency_us: s.fsync_latency_us.clone(),
                    rolls: s.rolls,
                    roll_stall_max_us: s.roll_stall_max_us,
                    zeroed_bytes: s.zeroed_bytes,
                    spares_taken: s.spares_taken,
                    spares_returned: s.spares_returned,
                });
                let body = StatsBody {
                    fsyncs: s.fsyncs,
                    produce_requests: s.produce_requests,
                    records_appended: s.records_appended,
                    write,
                };
                self.reply(id, api, &ResponseBody::Stats(body));
                Ok(())
            }
            Request::ClusterStatus => self.cluster_status(id, api),
            Request::Group(g) => {
                let (broker, peer) = (&self.broker, self.peer);
                super::groups::serve(broker, peer, self.version, &self.stop, id, g, &mut self.out)
                    .await;
                Ok(())
            }
            Request::Producer(p) => {
                let topic = match &p {
                    ProducerRequest::Produce { topic, .. } => Some(*topic),
                    ProducerRequest::InitProducer { .. } => None,
                };
                let (records, bytes) = super::producers::serve(
                    &self.broker,
                    self.version,
                    &self.stop,
                    id,
                    p,
                    &mut self.out,
                    self.replication.clone(),
                )
                .await;
                if let (Some(m), Some(topic)) = (&self.metrics, topic) {
                    if records > 0 {
                        self.topic_counters.produced(m, topic, records, bytes);
                    }
                }
                Ok(())
            }
            r @ (Request::SchemaRegister { .. }
            | Request::SchemaGet { .. }
            | Request::SchemaList
            | Request::SchemaCheck { .. }
            | Request::SchemaDelete { .. }) => {
                let changed = match &r {
                    Request::SchemaRegister { topic, .. } | Request::SchemaDelete { topic, .. } => {
                        Some(topic.to_string())
                    }
                    _ => None,
                };
                let answered = crate::engine::schemas::net::answer(&self.broker, self.version, &r);
                // In a cluster every node checks what it leads: a change goes to the
                // others before it is answered.
                let shared = match (&answered, changed, self.replication.clone()) {
                    (Ok(_), Some(topic), Some(replication)) => {
                        replication.share_schemas(topic).await
                    }
                    _ => Ok(()),
                };
                answered.and_then(|a| {
                    shared?;
                    self.reply(id, api, &a.body());
                    Ok(())
                })
            }
            Request::Key(k) => {
                let keys = self.broker.keys();
                let logged_in = self.login.principal().is_some();
                match self.replication.clone() {
                    Some(cluster) => {
                        super::auth::serve_key_in_cluster(
                            keys,
                            self.version,
                            &k,
                            logged_in,
                            cluster,
                        )
                        .await
                    }
                    None => super::auth::serve_key(keys, self.version, &k),
                }
                .map(|body| self.reply(id, api, &ResponseBody::Key(body.as_wire())))
            }
        };
        if let Err(refused) = result {
            self.refuse(id, api, refused);
        }
        false
    }

    /// Logs a refused request and encodes its error response.
    fn refuse(&mut self, id: u32, api: u16, (code, msg): (ErrorCode, String)) {
        if self.log_errors {
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

    /// Encodes a successful response into `out`.
    fn reply(&mut self, id: u32, api: u16, body: &ResponseBody<'_>) {
        self.out.clear();
        if let Err(e) = encode_response(&mut self.out, id, api, ErrorCode::NONE, "", Some(body)) {
            let msg = format!("cannot encode the {} response: {e}", api_name(api));
            encode_error(&mut self.out, id, api, ErrorCode::INTERNAL, &msg);
        }
    }

    async fn produce(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        batches: &[PartitionBatch<'_>],
    ) -> Answer {
        name_ok(topic)?;
        crate::engine::schemas::net::check_produce(&self.broker, self.version, topic, batches)
            .await?;
        let asked = batches.iter().map(|b| b.partition).collect();
        if let Some(refusals) = self.held_elsewhere(topic, asked).await {
            let results: Vec<PartitionResult> = refusals.into_iter().map(Err).collect();
            self.finish_produce(id, api, topic, batches, &results);
            return Ok(());
        }
        if let Some(r) = self.replicated(topic) {
            if self.may_defer {
                self.defer_replicated(id, api, topic, batches, r).await;
                return Ok(());
            }
            let results = produce_replicated(r, topic, batches).await;
            self.finish_produce(id, api, topic, batches, &results);
            return Ok(());
        }
        // Every partition's write first (page-cache writes, on this thread), then the
        // durability waits side by side: one group commit per partition covers them.
        let mut results: Vec<PartitionResult> = Vec::with_capacity(batches.len());
        let mut waits = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            let records: Vec<NewRecord<'_>> = batch
                .records
                .iter()
                .map(|r| NewRecord {
                    key: r.key,
                    value: r.value,
                    timestamp_ms: r.timestamp_ms,
                })
                .collect();
            match self.broker.append(topic, batch.partition, &records) {
                Ok((p, wait)) => {
                    results.push(Ok((p.base_offset, p.last_offset)));
                    if let Some(w) = wait {
                        waits.push((i, w));
                    }
                }
                Err(e) => results.push(Err(engine_error(e))),
            }
        }
        if self.may_defer && !waits.is_empty() {
            self.defer_produce(id, api, topic, batches, results, waits);
            return Ok(());
        }
        // Group commit per pass: the first request of a pass to reach its partition
        // leads the commit and yields once so every connection that is ready appends
        // first (each finds the commit led and follows it). When another
        // partition's commit is pending too, or the commit is large, the leader then
        // hands the fsync to the node's commit thread and the loop goes on: the next
        // requests are written (and claim the next commit) while this one syncs, and
        // several partitions' commits do not block the loop one after another; the
        // leader wakes its followers on the loop. Otherwise (and always with one
        // connection) it runs the fsync on this thread, where it costs no wake-up; a
        // commit that carries a roll then goes to the flusher. A request that writes
        // to several partitions asks the flusher for one fsync per partition instead,
        // and waits for them side by side.
        let _waiting = WaitingGuard::enter(&self.waiting);
        if waits.len() == 1 {
            for (i, w) in waits {
                let done = match self.broker.lead_or_follow(w) {
                    Commit::Lead(lead) => {
                        let others = self.others_may_be_ready();
                        if others {
                            tokio::task::yield_now().await;
                        }
                        if others && lead.better_off_loop() {
                            lead.commit_off_loop().await
                        } else if lead.carries_roll() {
                            // A roll's syncs are several fsyncs: the flusher runs
                            // them while the loop goes on serving the new segment.
                            self.broker.follow(lead.hand_off()).await
                        } else {
                            lead.commit()
                        }
                    }
                    Commit::Follow(w) => self.broker.follow(w).await,
                };
                if let Err(e) = done {
                    set_error(&mut results, i, engine_error(e));
                }
            }
        } else {
            // Every commit is asked for before the first wait, so waiting for them
            // in turn takes as long as the slowest.
            let pending: Vec<_> = waits
                .into_iter()
                .map(|(i, w)| (i, self.broker.durable(w)))
                .collect();
            for (i, wait) in pending {
                if let Err(e) = wait.await {
                    set_error(&mut results, i, engine_error(e));
                }
            }
        }
        self.finish_produce(id, api, topic, batches, &results);
        Ok(())
    }

    /// Counts a produce's records and encodes its response.
    fn finish_produce(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        batches: &[PartitionBatch<'_>],
        results: &[PartitionResult],
    ) {
        if let Some(m) = &self.metrics {
            let (records, bytes) = produced(batches, results);
            if records > 0 {
                self.topic_counters.produced(m, topic, records, bytes);
            }
        }
        self.out.clear();
        let partitions = batches.iter().map(|b| b.partition);
        encode_produce(&mut self.out, id, api, partitions, results);
    }

    /// Leaves the answer of a produce whose records are written in
    /// [`Session::deferred`]: a future that waits for the group commits covering
    /// `waits` (entries of `results`), then counts and encodes the response. A
    /// single partition's commit is claimed when the future first runs, that is once
    /// the connection has appended every request it holds: the first of them to
    /// claim leads and at once hands the fsync to the node's commit thread (the loop
    /// goes on reading and appending; what others append meanwhile claims the next
    /// commit, queued behind it); the others follow it. Several partitions ask the flusher for one commit each.
    fn defer_produce(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        batches: &[PartitionBatch<'_>],
        mut results: Vec<PartitionResult>,
        waits: Vec<(usize, DurableWait)>,
    ) {
        let partitions: Vec<u32> = batches.iter().map(|b| b.partition).collect();
        let counted = self.count_later(topic, batches);
        let broker = Arc::clone(&self.broker);
        let waiting = WaitingGuard::enter(&self.waiting);
        let flushed: Vec<_> = if waits.len() > 1 {
            // Asked for now, waited for side by side.
            waits
                .into_iter()
                .map(|(i, w)| (i, Err(broker.durable(w))))
                .collect()
        } else {
            waits.into_iter().map(|(i, w)| (i, Ok(w))).collect()
        };
        self.set_deferred(Box::pin(async move {
            for (i, wait) in flushed {
                let done = match wait {
                    Err(flush) => flush.await,
                    Ok(w) => match broker.lead_or_follow(w) {
                        Commit::Lead(lead) => {
                            // No yield while holding the claim: the connection may
                            // next await something else (a replicated produce)
                            // before it polls this answer again.
                            if lead.carries_roll() {
                                broker.follow(lead.hand_off()).await
                            } else {
                                lead.commit_off_loop().await
                            }
                        }
                        Commit::Follow(w) => broker.follow(w).await,
                    },
                };
                if let Err(e) = done {
                    set_error(&mut results, i, engine_error(e));
                }
            }
            drop(waiting);
            if let Some(c) = counted {
                c.count(&results);
            }
            let mut out = Vec::new();
            encode_produce(&mut out, id, api, partitions.into_iter(), &results);
            out
        }));
    }

    /// Leaves the answer of a produce to a replicated topic in
    /// [`Session::deferred`]: each partition's entry is queued to its Raft group
    /// now, in request order, so the entries of a pipelining connection are in the
    /// log in the order of its requests; the answer waits until every entry is
    /// committed and applied, then counts and encodes the response.
    async fn defer_replicated(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        batches: &[PartitionBatch<'_>],
        r: Arc<dyn Replicator>,
    ) {
        let mut results: Vec<PartitionResult> = Vec::with_capacity(batches.len());
        let mut applied = Vec::new();
        for (i, b) in batches.iter().enumerate() {
            let submitted = Arc::clone(&r)
                .submit(topic.to_string(), b.partition, entry_of(b))
                .await;
            match submitted {
                Ok(answer) => {
                    results.push(Ok((0, 0)));
                    applied.push((i, answer));
                }
                Err(refusal) => results.push(Err(refusal)),
            }
        }
        let partitions: Vec<u32> = batches.iter().map(|b| b.partition).collect();
        let counted = self.count_later(topic, batches);
        self.set_deferred(Box::pin(async move {
            for (i, answer) in applied {
                if let Some(slot) = results.get_mut(i) {
                    *slot = answer.await;
                }
            }
            if let Some(c) = counted {
                c.count(&results);
            }
            let mut out = Vec::new();
            encode_produce(&mut out, id, api, partitions.into_iter(), &results);
            out
        }));
    }

    /// What a produce answered later counts once its results are known (`None`
    /// without metrics).
    fn count_later(&mut self, topic: &str, batches: &[PartitionBatch<'_>]) -> Option<CountLater> {
        let m = self.metrics.clone()?;
        let sizes = batches
            .iter()
            .map(|b| produced(std::slice::from_ref(b), &[Ok((0, 0))]))
            .collect();
        Some(CountLater {
            counters: self.topic_counters.counters(&m, topic),
            sizes,
        })
    }

    /// Whether another task of this event loop may have a request to append before
    /// this one's commit: another connection, or another produce waiting. With one
    /// connection alone the yield would cost a pass of the loop and batch nothing.
    fn others_may_be_ready(&self) -> bool {
        let tasks = tokio::runtime::Handle::try_current()
            .map_or(usize::MAX, |h| h.metrics().num_alive_tasks());
        tasks > 1 || self.waiting.load(Ordering::SeqCst) > 1
    }

    #[expect(clippy::too_many_arguments, reason = "the fields of a fetch request")]
    async fn fetch(
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
        if let Some(mut refusals) = self.held_elsewhere(topic, vec![partition]).await {
            if let Some(r) = refusals.pop() {
                return Err(r);
            }
        }
        // A replicated partition is read on its leader, from its applied (committed)
        // records only, once they are durable there.
        if let Some(r) = self.replicated(topic) {
            r.check_leader(topic, partition)?;
            self.broker
                .settle(topic, partition)
                .await
                .map_err(engine_error)?;
        }
        if max_bytes.min(FETCH_BYTES_MAX) > STREAM_FETCH_MIN_BYTES {
            return self
                .fetch_streamed(id, api, topic, partition, offset, max_bytes, max_wait_ms)
                .await;
        }
        // Long-poll in slices so a stopping server is never held up by a waiting
        // consumer for more than one slice.
        let deadline = Instant::now() + Duration::from_millis(u64::from(max_wait_ms));
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(FETCH_SLICE);
            let r = self
                .broker
                .fetch_async(topic, partition, offset, max_bytes, slice)
                .await
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
        if let Some(m) = &self.metrics {
            let chunks = result.chunks.iter().map(|c| c.bytes.as_slice());
            self.topic_counters.fetched(m, topic, chunks);
        }
        for c in result.chunks {
            buffers::give(c.bytes);
        }
        Ok(())
    }

    /// [`Session::fetch`] of a large fetch: the same records and response bytes, the
    /// records left in their files for the connection layer to stream
    /// ([`StreamedFetch`]).
    #[expect(clippy::too_many_arguments, reason = "the fields of a fetch request")]
    async fn fetch_streamed(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait_ms: u32,
    ) -> Answer {
        let deadline = Instant::now() + Duration::from_millis(u64::from(max_wait_ms));
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(FETCH_SLICE);
            let r = self
                .broker
                .fetch_spans_async(topic, partition, offset, max_bytes, slice)
                .await
                .map_err(engine_error)?;
            if !r.spans.is_empty() || left <= slice || self.stop.load(Ordering::SeqCst) {
                break r;
            }
        };
        let heads: Vec<(u64, u64)> = result.spans.iter().map(|s| (s.generation, s.len)).collect();
        self.out.clear();
        match encode_fetch_response_head(
            &mut self.out,
            id,
            api,
            result.start_offset,
            result.end_offset,
            &heads,
        ) {
            Ok(splits) => {
                if let Some(m) = &self.metrics {
                    let records = result.spans.iter().map(|s| s.records).sum();
                    let bytes = heads.iter().map(|h| h.1).sum();
                    self.topic_counters
                        .fetched_counted(m, topic, records, bytes);
                }
                self.stream = Some(StreamedFetch {
                    splits,
                    spans: result.spans,
                });
            }
            Err(e) => {
                let msg = format!("cannot encode the {} response: {e}", api_name(api));
                encode_error(&mut self.out, id, api, ErrorCode::INTERNAL, &msg);
            }
        }
        Ok(())
    }

    fn cluster_status(&mut self, id: u32, api: u16) -> Answer {
        if self.version < CLUSTER_VERSION {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!("cluster status needs protocol version {CLUSTER_VERSION}"),
            ));
        }
        let json = match &self.replication {
            Some(r) => r.status().to_string(),
            None => standalone_status(self.listen_addr).to_string(),
        };
        self.reply(id, api, &ResponseBody::ClusterStatus { json: &json });
        Ok(())
    }

    async fn list_offsets(&mut self, id: u32, api: u16, topic: &str) -> Answer {
        name_ok(topic)?;
        if let Some(mut refusals) = self.held_elsewhere(topic, vec![0]).await {
            if let Some(r) = refusals.pop() {
                return Err(r);
            }
        }
        let n = self.broker.partition_count(topic).map_err(engine_error)?;
        let replicated = self.replicated(topic);
        let mut partitions = Vec::with_capacity(n as usize);
        for partition in 0..n {
            if let Some(r) = &replicated {
                // A partition placed on other nodes only: as its leader answers.
                match Arc::clone(r)
                    .offsets_elsewhere(topic.to_string(), partition)
                    .await
                {
                    Some(Ok((start_offset, end_offset))) => {
                        partitions.push(PartitionOffsets {
                            partition,
                            start_offset,
                            end_offset,
                        });
                        continue;
                    }
                    Some(Err(refusal)) => return Err(refusal),
                    None => {}
                }
            }
            // The end of a replicated partition counts every acknowledged record.
            if replicated.is_some() {
                self.broker
                    .settle(topic, partition)
                    .await
                    .map_err(engine_error)?;
            }
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

    async fn create_topic(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        partitions: u32,
        settings: &[(&str, &str)],
    ) -> Answer {
        name_ok(topic)?;
        let (factor, settings) = replication_factor(settings)?;
        if factor > 1 {
            let Some(r) = self.replication.clone() else {
                return Err((
                    ErrorCode::INVALID_CONFIG,
                    format!(
                        "replication factor {factor} needs a cluster; this broker runs \
                         alone (no --peers)"
                    ),
                ));
            };
            let pairs = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            r.create_topic(topic.to_string(), partitions, pairs, factor)
                .await?;
            self.reply(id, api, &ResponseBody::CreateTopic);
            return Ok(());
        }
        let mut config = TopicConfig::default();
        for (k, v) in &settings {
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

    async fn delete_topic(&mut self, id: u32, api: u16, topic: &str) -> Answer {
        name_ok(topic)?;
        if let Some(r) = self.replicated(topic) {
            r.delete_topic(topic.to_string()).await?;
            self.reply(id, api, &ResponseBody::DeleteTopic);
            return Ok(());
        }
        match (self.broker.delete_topic(topic), &self.replication) {
            // A replicated topic with no replica here: the nodes holding one delete it.
            (Err(EngineError::UnknownTopic { .. }), Some(r)) => {
                Arc::clone(r).delete_topic(topic.to_string()).await?;
            }
            (outcome, _) => outcome.map_err(engine_error)?,
        }
        self.reply(id, api, &ResponseBody::DeleteTopic);
        Ok(())
    }

    async fn describe_topic(&mut self, id: u32, api: u16, topic: &str) -> Answer {
        name_ok(topic)?;
        if let Some(mut refusals) = self.held_elsewhere(topic, vec![0]).await {
            if let Some(r) = refusals.pop() {
                return Err(r);
            }
        }
        let d = self.broker.describe_topic(topic).map_err(engine_error)?;
        // Partitions a replicated topic's placement leaves off this node: the local
        // directory is an empty stand-in, so the offsets are the leader's and the
        // detail says where the partition is.
        let mut elsewhere: BTreeMap<u32, (Option<(u64, u64)>, String)> = BTreeMap::new();
        if let Some(r) = self.replicated(topic) {
            for p in &d.partitions {
                let Some(offsets) = Arc::clone(&r)
                    .offsets_elsewhere(topic.to_string(), p.partition)
                    .await
                else {
                    continue;
                };
                let holders = r
                    .partition_view(topic, p.partition)
                    .map(|v| {
                        let ids: Vec<String> = v.replicas.iter().map(u64::to_string).collect();
                        format!(" (its replicas are on nodes {})", ids.join(", "))
                    })
                    .unwrap_or_default();
                let detail = match &offsets {
                    Ok(_) => {
                        format!("not held on this node{holders}; offsets as its leader gives them")
                    }
                    Err((_, m)) => format!("not held on this node{holders}; offsets unknown: {m}"),
                };
                elsewhere.insert(p.partition, (offsets.ok(), detail));
            }
        }
        let partitions = d
            .partitions
            .iter()
            .map(|p| match elsewhere.get(&p.partition) {
                Some((offsets, _)) => {
                    let (start_offset, end_offset) = offsets.unwrap_or_default();
                    PartitionDescription {
                        partition: p.partition,
                        start_offset,
                        end_offset,
                        segments: 0,
                        bytes: 0,
                    }
                }
                None => PartitionDescription {
                    partition: p.partition,
                    start_offset: p.start_offset,
                    end_offset: p.end_offset,
                    segments: p.segments,
                    bytes: p.bytes,
                },
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
        let health = (self.version >= PARTITION_HEALTH_VERSION).then(|| {
            d.partitions
                .iter()
                .map(|p| match elsewhere.get(&p.partition) {
                    Some((offsets, detail)) => PartitionHealth {
                        partition: p.partition,
                        records: offsets.map_or(0, |(s, e)| e.saturating_sub(s)),
                        state: HealthState::Ok,
                        detail: detail.clone(),
                        spares: 0,
                        preallocated_bytes: 0,
                    },
                    None => PartitionHealth {
                        partition: p.partition,
                        records: p.records,
                        state: match p.state {
                            PartitionState::Ok => HealthState::Ok,
                            PartitionState::Damaged => HealthState::Damaged,
                            PartitionState::Failed => HealthState::Failed,
                        },
                        detail: p.detail.clone().unwrap_or_default(),
                        spares: p.spares,
                        preallocated_bytes: p.preallocated_bytes,
                    },
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
                health,
            },
        );
        Ok(())
    }

    async fn alter_topic(
        &mut self,
        id: u32,
        api: u16,
        topic: &str,
        settings: &[(&str, &str)],
    ) -> Answer {
        name_ok(topic)?;
        let owned: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let config = match self.replicated(topic) {
            Some(r) => r.alter_topic(topic.to_string(), owned).await?,
            None => match (self.broker.alter_topic(topic, &owned), &self.replication) {
                // A replicated topic with no replica here: the nodes holding one
                // alter it.
                (Err(EngineError::UnknownTopic { .. }), Some(r)) => {
                    Arc::clone(r).alter_topic(topic.to_string(), owned).await?
                }
                (outcome, _) => outcome.map_err(engine_error)?,
            },
        };
        let text = config_settings(&config);
        let settings = text.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.reply(id, api, &ResponseBody::AlterTopic { settings });
        Ok(())
    }
}

/// Counts a produce as waiting for durability until dropped.
struct WaitingGuard(Arc<AtomicUsize>);

impl WaitingGuard {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        WaitingGuard(Arc::clone(count))
    }
}

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One partition's outcome in a produce: (base, last) offsets, or the error.
type PartitionResult = Result<(u64, u64), (ErrorCode, String)>;

/// Records and stored bytes of the partitions of a produce that succeeded.
fn produced(batches: &[PartitionBatch<'_>], results: &[PartitionResult]) -> (u64, u64) {
    let (mut records, mut bytes) = (0, 0);
    for (b, _) in batches.iter().zip(results).filter(|(_, r)| r.is_ok()) {
        records += b.records.len() as u64;
        bytes += b
            .records
            .iter()
            .map(|r| stored_len(r.key, r.value))
            .sum::<u64>();
    }
    (records, bytes)
}

/// Encodes a produce response into `out` (cleared by the caller): one
/// acknowledgement per partition, in the request's order.
fn encode_produce(
    out: &mut Vec<u8>,
    id: u32,
    api: u16,
    partitions: impl Iterator<Item = u32>,
    results: &[PartitionResult],
) {
    let acks = partitions
        .zip(results)
        .map(|(partition, r)| match r {
            Ok((base_offset, last_offset)) => PartitionAck {
                partition,
                code: ErrorCode::NONE,
                message: "",
                base_offset: *base_offset,
                last_offset: *last_offset,
            },
            Err((code, message)) => PartitionAck {
                partition,
                code: *code,
                message,
                base_offset: 0,
                last_offset: 0,
            },
        })
        .collect();
    let body = ResponseBody::Produce { partitions: acks };
    if let Err(e) = encode_response(out, id, api, ErrorCode::NONE, "", Some(&body)) {
        out.clear();
        let msg = format!("cannot encode the {} response: {e}", api_name(api));
        encode_error(out, id, api, ErrorCode::INTERNAL, &msg);
    }
}

/// The create-topic setting that asks for a replicated topic. It is not a topic
/// configuration key: the placement it leads to is kept in `replication.json`.
pub const REPLICATION_FACTOR_SETTING: &str = "replication.factor";

/// A create's `KEY=VALUE` settings.
type Settings<'a> = Vec<(&'a str, &'a str)>;

/// Takes the replication factor (default 1) out of a create's settings.
fn replication_factor<'a>(
    settings: &[(&'a str, &'a str)],
) -> Result<(u32, Settings<'a>), (ErrorCode, String)> {
    let mut factor = 1;
    let mut rest = Vec::with_capacity(settings.len());
    for (k, v) in settings {
        if *k == REPLICATION_FACTOR_SETTING {
            factor = v.parse().ok().filter(|f| *f >= 1).ok_or_else(|| {
                (
                    ErrorCode::INVALID_CONFIG,
                    format!("invalid topic configuration: {k}={v}: not a positive integer"),
                )
            })?;
        } else {
            rest.push((*k, *v));
        }
    }
    Ok((factor, rest))
}

/// Each partition's batch as one Raft entry, proposed side by side.
async fn produce_replicated(
    r: Arc<dyn Replicator>,
    topic: &str,
    batches: &[PartitionBatch<'_>],
) -> Vec<PartitionResult> {
    let proposals = batches
        .iter()
        .map(|b| Arc::clone(&r).produce(topic.to_string(), b.partition, entry_of(b)));
    futures_util::future::join_all(proposals).await
}

/// One partition's records of a produce request as one Raft entry.
fn entry_of(b: &PartitionBatch<'_>) -> ProduceEntry {
    ProduceEntry::new(
        None,
        b.records.iter().map(|r| NewRecord {
            key: r.key,
            value: r.value,
            timestamp_ms: r.timestamp_ms,
        }),
        crate::engine::partition::now_ms(),
    )
}

/// The metrics of a produce answered later: its topic's counters and, per
/// partition of the request, the records and bytes it carries.
struct CountLater {
    counters: Arc<super::metrics::TopicCounters>,
    sizes: Vec<(u64, u64)>,
}

impl CountLater {
    /// Counts the partitions whose records were written (and made durable or
    /// applied).
    fn count(self, results: &[PartitionResult]) {
        let (records, bytes) = self
            .sizes
            .iter()
            .zip(results)
            .filter(|(_, r)| r.is_ok())
            .fold((0, 0), |(n, b), ((rn, rb), _)| (n + rn, b + rb));
        if records > 0 {
            self.counters.produced(records, bytes);
        }
    }
}

/// Replaces a partition's result with the error its durability wait ended in.
fn set_error(results: &mut [PartitionResult], i: usize, e: (ErrorCode, String)) {
    if let Some(r) = results.get_mut(i) {
        *r = Err(e);
    }
}

/// A handler's outcome: the response is in `out`, or the error to send instead.
type Answer = Result<(), (ErrorCode, String)>;

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
        | EngineError::RecordsMissing { .. }
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

/// [`Session::held_elsewhere`], for the other request paths (idempotent produce).
pub async fn held_elsewhere(
    broker: &Broker,
    replication: Option<&Arc<dyn Replicator>>,
    topic: &str,
    partitions: Vec<u32>,
) -> Option<Vec<Refusal>> {
    let r = replication?;
    if broker.has_topic(topic) || r.is_replicated(topic) {
        return None;
    }
    Arc::clone(r).elsewhere(topic.to_string(), partitions).await
}

/// The cluster status of a broker started without `--peers`: one node (id 0, the id
/// the Kafka listener gives it), no cluster id, no replicated partitions, and
/// `"standalone": true`.
fn standalone_status(listen_addr: Option<SocketAddr>) -> serde_json::Value {
    let addr = listen_addr.map(|a| a.to_string());
    serde_json::json!({
        "cluster_id": null,
        "node_id": 0,
        "standalone": true,
        "nodes": [{
            "id": 0,
            "addr": null,
            "alive": true,
            "raft_addr": null,
            "client_addr": addr,
            "reachable": true,
        }],
        "partitions": [],
    })
}
