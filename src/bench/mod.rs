//! The load generator behind `seglog bench produce|consume`, in the spirit of
//! kafka-producer-perf-test. Many connections from one process, each a task of one
//! event-loop thread ([`conn`]); with
//! an embedded target a broker and its server run in this process on a loopback port
//! and the load still goes over TCP. Measures records, value bytes (10^6 bytes of
//! record values make a MB), requests, fsyncs and every request's latency; the
//! command line and the rendering of a [`Report`] live in `cmd::bench`.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod conn;
mod follow;

use conn::Conn;
use follow::{Failure, Lanes, Pending, Sender};

use crate::engine::broker::{Broker, BrokerOptions, BrokerStats};
use crate::engine::error::EngineError;
use crate::engine::net::client::{Client, ClientError};
use crate::engine::net::server::{Server, ServerOptions};
use crate::engine::partition::zero::{quantile_us, PREALLOCATE_BYTES_DEFAULT};
use crate::engine::storage::io::RealStorage;
use crate::format::encoded_len;
use crate::format::wire::{
    ErrorCode, PartitionBatch, PartitionOffsets, StatsBody, WireRecord, FETCH_BYTES_MAX,
    RECORDS_PER_PARTITION_MAX,
};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Append records (each request acknowledged after the broker's flush policy).
    Produce,
    /// Fetch records from the start of the topic (produced first if missing).
    Consume,
}

/// Where the load goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A running broker at this address.
    Broker(String),
    /// A broker started in this process on `dir`, served on a loopback port.
    Embedded {
        dir: PathBuf,
        /// fsync once this many records wait (1: before every ack).
        flush_every_records: u64,
    },
}

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub target: Target,
    /// Records to send or read (`u64::MAX` with a duration: until it is over).
    pub records: u64,
    /// Produce only: stop sending after this long.
    pub duration: Option<Duration>,
    /// Bytes of each record's value.
    pub record_size: u32,
    /// Records per produce request, or per fetch.
    pub batch: u32,
    /// Connections, each a task of one event-loop thread (at least 1).
    pub connections: u32,
    /// Produce only: requests a connection sends before it waits for the oldest
    /// one's answer (at least 1; Kafka's producers default to 5).
    pub in_flight: u32,
    /// Partitions of the bench topic (created if missing; at least 1).
    pub partitions: u32,
    /// On a cluster: the client address of each partition's leader, where its
    /// requests go; a partition not named here is driven through the target. Each
    /// connection then is one per leader node (as a Kafka producer holds one per
    /// broker), and the write-path counters add up over those nodes.
    pub leaders: BTreeMap<u32, String>,
    /// On a cluster: every node's client address (`--broker A,B,...`). With two or
    /// more, a produce run follows leader changes and lost nodes
    /// ([`follow`]); empty or one: a failure ends the run.
    pub brokers: Vec<String>,
    pub topic: String,
    /// How long to wait to connect and for each response.
    pub timeout: Duration,
    /// Draw a progress bar on stderr while the workers run.
    pub progress_bar: bool,
    /// Produce only: idempotent produce requests (each connection its own producer id
    /// and per-partition sequences).
    pub idempotent: bool,
    /// Write-path settings of the run.
    pub write: WriteOptions,
    /// Produce only: produce this long first, unmeasured, then measure.
    pub warmup: Option<Duration>,
    /// The API key token each connection logs in with.
    pub token: Option<String>,
    /// Connect over TLS (a running broker only).
    pub tls: Option<crate::engine::net::tls::ClientTls>,
}

/// Write-path settings of a run: the topic's segment size, the embedded broker's
/// preallocation and zero-ahead, a fixed produce rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// `segment_bytes` of the bench topic when the run creates it.
    pub segment_bytes: Option<u64>,
    /// Replicas of each partition of the bench topic when the run creates it (more
    /// than 1 on a cluster only; 1: on the node created on alone).
    pub replication_factor: u32,
    /// Embedded broker: bytes preallocated ahead of each writer (default: serve's).
    pub preallocate_bytes: Option<u64>,
    /// Embedded broker: zero-ahead on or off (default: on, as serve).
    pub zero_ahead: Option<bool>,
    /// Embedded broker: the zero-ahead worker's bytes per second (default: serve's).
    pub zero_rate: Option<u64>,
    /// Embedded broker: empty spares kept ready for rolls (default: serve's).
    pub new_spares: Option<u64>,
    /// Produce: records per second over all connections (default: as fast as acked).
    pub rate: Option<u64>,
    /// `retention_bytes` of the bench topic when the run creates it.
    pub retention_bytes: Option<u64>,
    /// Embedded broker: how often retention visits the partitions (default: serve's).
    pub retention_check_interval: Option<Duration>,
}

/// The write path's counters over a run (embedded broker only).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WritePathReport {
    /// Data fsyncs the log timed (group commits and rolls).
    pub timed_fsyncs: u64,
    pub fsync_p50_ms: f64,
    pub fsync_p99_ms: f64,
    pub rolls: u64,
    /// The longest a writer waited at a roll since the broker started.
    pub roll_stall_max_ms: f64,
    pub zeroed_bytes: u64,
    /// Spare files logs took at a roll, and segments that became spares.
    pub spares_taken: u64,
    pub spares_returned: u64,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The embedded broker's data directory is locked by another process.
    #[error("{0}")]
    Locked(Box<EngineError>),
    #[error("cannot open {}: {source}", dir.display())]
    Open {
        dir: PathBuf,
        source: Box<EngineError>,
    },
    #[error("cannot listen on a loopback port: {0}")]
    Listen(io::Error),
    #[error("shutting the broker down: {0}")]
    Shutdown(Box<EngineError>),
    /// A client call failed (unreachable broker, refused request, bad record).
    #[error("{0}")]
    Client(ClientError),
    #[error("topic {topic} exists with {have} partitions, not {want}; use --partitions {have} or another --topic")]
    PartitionCount { topic: String, have: u32, want: u32 },
    #[error("the broker at {addr} refused: {message} [{code}]")]
    ProduceRefused {
        addr: String,
        code: ErrorCode,
        message: String,
    },
    #[error("seeding the bench topic: {message} [{code}]")]
    SeedRefused { code: ErrorCode, message: String },
    #[error("fetch of {topic}/{partition} at offset {offset} returned nothing before {end}")]
    FetchEmpty {
        topic: String,
        partition: u32,
        offset: u64,
        end: u64,
    },
    #[error("a bench worker failed")]
    WorkerPanicked,
    /// A produce run stopped by a failure once under way (a leader killed or
    /// stalled): `report` counts what was acknowledged before it.
    #[error("{source}; {}", stopped_after(report))]
    Stopped {
        report: Box<Report>,
        source: Box<BenchError>,
    },
    #[error("cannot start the load generator's runtime: {0}")]
    Runtime(io::Error),
}

/// What a run stopped under way had done: `the bench stopped after N record(s)
/// acknowledged in M request(s)`.
pub fn stopped_after(report: &Report) -> String {
    format!(
        "the bench stopped after {} record(s) acknowledged in {} request(s)",
        report.records, report.requests
    )
}

impl From<ClientError> for BenchError {
    fn from(e: ClientError) -> Self {
        BenchError::Client(e)
    }
}

/// The measurements of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The address the load went to (the loopback port of an embedded broker); on a
    /// cluster whose partitions have several leaders, their addresses joined by
    /// commas, the target's first.
    pub broker: String,
    pub records: u64,
    pub requests: u64,
    pub value_bytes: u64,
    pub elapsed: Duration,
    pub fsyncs: u64,
    /// Request latencies, sorted.
    pub latencies: Vec<Duration>,
    /// Embedded broker only.
    pub write_path: Option<WritePathReport>,
    /// Produce on a cluster: requests sent again after their partition's leader
    /// changed or their connection failed (each counted once in `requests` when
    /// answered; without `--idempotent` a request sent again may be written twice).
    pub resent: u64,
    /// Nodes driven whose counters are left out of `fsyncs` (and `write_path` is
    /// then `None`): they did not answer before or after the run (a node killed
    /// during a run that followed its leaders).
    pub uncounted: Vec<String>,
}

impl Report {
    /// `n` per second of elapsed time (0 when no time passed).
    pub fn per_sec(&self, n: f64) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            n / s
        } else {
            0.0
        }
    }

    /// The latency at quantile `q` (nearest rank), in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let rank =
            ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies
            .get(rank - 1)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }
}

/// Runs the load against `config.target` and measures it. An embedded broker is
/// started first and shut down last; a failed shutdown outranks a failed run.
pub fn run(config: &Config) -> Result<Report, BenchError> {
    let (embedded, addr) = match &config.target {
        Target::Embedded {
            dir,
            flush_every_records,
        } => {
            let (e, addr) = Embedded::start(dir, *flush_every_records, &config.write)?;
            (Some(e), addr)
        }
        Target::Broker(addr) => (None, addr.clone()),
    };
    let routes = Routes::new(config, &addr);
    let result = bench(config, &routes, embedded.as_ref().map(|e| &e.broker));
    if let Some(e) = embedded {
        e.finish()?;
    }
    let mut report = match result {
        Err(BenchError::Stopped { mut report, source }) => {
            report.broker = routes.addrs.join(",");
            return Err(BenchError::Stopped { report, source });
        }
        other => other?,
    };
    report.broker = routes.addrs.join(",");
    Ok(report)
}

/// Where each partition's requests go: the distinct addresses, the target's first,
/// and per partition the index of its leader's address (the target's when its
/// leader is not known).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Routes {
    addrs: Vec<String>,
    of: Vec<usize>,
}

impl Routes {
    fn new(args: &Config, target: &str) -> Routes {
        let mut addrs = vec![target.to_string()];
        let of = (0..args.partitions)
            .map(|p| match args.leaders.get(&p) {
                None => 0,
                Some(a) => addrs.iter().position(|x| x == a).unwrap_or_else(|| {
                    addrs.push(a.clone());
                    addrs.len() - 1
                }),
            })
            .collect();
        Routes { addrs, of }
    }

    /// The index in `addrs` of `partition`'s address.
    fn of(&self, partition: u32) -> usize {
        self.of.get(partition as usize).copied().unwrap_or(0)
    }

    /// The target's address.
    fn target(&self) -> &str {
        self.addrs.first().map_or("", String::as_str)
    }
}

/// An embedded broker and its server thread.
struct Embedded {
    broker: Arc<Broker>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<io::Result<()>>>,
}

impl Embedded {
    fn start(
        dir: &Path,
        flush_every_records: u64,
        write: &WriteOptions,
    ) -> Result<(Embedded, String), BenchError> {
        let opts = BrokerOptions {
            flush_every_records,
            preallocate_bytes: write.preallocate_bytes.unwrap_or(PREALLOCATE_BYTES_DEFAULT),
            zero_ahead: write.zero_ahead.unwrap_or(true),
            zero_rate: write
                .zero_rate
                .unwrap_or(crate::engine::partition::zero::ZERO_RATE_DEFAULT),
            spares_per_partition: crate::engine::partition::spares::SPARES_PER_PARTITION_DEFAULT,
            new_spares: write
                .new_spares
                .unwrap_or(crate::engine::partition::spares::NEW_SPARES_DEFAULT),
            ..BrokerOptions::default()
        };
        let opts = BrokerOptions {
            retention_check_interval: write
                .retention_check_interval
                .unwrap_or(opts.retention_check_interval),
            ..opts
        };
        let broker = Broker::open(dir, Arc::new(RealStorage), opts).map_err(|e| match e {
            EngineError::Locked { .. } => BenchError::Locked(Box::new(e)),
            source => BenchError::Open {
                dir: dir.to_path_buf(),
                source: Box::new(source),
            },
        })?;
        let server_opts = ServerOptions {
            log_errors: false,
            ..ServerOptions::default()
        };
        let server = Server::bind("127.0.0.1:0", Arc::clone(&broker), server_opts)
            .map_err(BenchError::Listen)?;
        let addr = server.local_addr().to_string();
        let stop = server.stop_handle();
        let never = AtomicBool::new(false);
        let thread = thread::spawn(move || server.run(&never));
        Ok((
            Embedded {
                broker,
                stop,
                thread: Some(thread),
            },
            addr,
        ))
    }

    fn finish(mut self) -> Result<(), BenchError> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.broker
            .shutdown()
            .map_err(|e| BenchError::Shutdown(Box::new(e)))
    }
}

/// Shared counters while the workers run.
struct Progress {
    records: AtomicU64,
}

/// A progress bar on stderr when asked for; nothing otherwise.
fn progress_bar(total: Option<u64>, wanted: bool) -> Option<indicatif::ProgressBar> {
    if !wanted {
        return None;
    }
    let bar = match total {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    Some(bar)
}

/// The counters of the brokers driven: the embedded one's, else each node's of
/// `routes` (`None` for a node of a cluster that did not answer: a node killed
/// during a run that followed its leaders).
enum Counters {
    Embedded(BrokerStats),
    Nodes(Vec<Option<StatsBody>>),
}

fn counters(
    routes: &Routes,
    args: &Config,
    embedded: Option<&Arc<Broker>>,
) -> Result<Counters, BenchError> {
    if let Some(b) = embedded {
        return Ok(Counters::Embedded(b.stats()));
    }
    let mut nodes = Vec::with_capacity(routes.addrs.len());
    for addr in &routes.addrs {
        let s = Client::connect_with(addr, args.timeout, args.tls.as_ref(), args.token.as_deref())
            .and_then(|mut c| c.stats());
        match s {
            Ok(s) => nodes.push(Some(s)),
            // On a cluster a node may be down: its counters are left out.
            Err(_) if args.brokers.len() > 1 => nodes.push(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Counters::Nodes(nodes))
}

/// Sets `report`'s fsyncs and write-path counters from two counters: the write
/// path's are `None` when a broker is older than protocol version 3, which has
/// none. On a cluster only the nodes that answered both times count; the others
/// are named in `uncounted`, and the write path's counters are then `None`.
fn between(report: &mut Report, routes: &Routes, before: &Counters, after: &Counters) {
    let (fsyncs, write_path) = match (before, after) {
        (Counters::Embedded(b), Counters::Embedded(a)) => (
            a.fsyncs.saturating_sub(b.fsyncs),
            Some(write_path_report(b, a)),
        ),
        (Counters::Nodes(b), Counters::Nodes(a)) => {
            let (mut sum_b, mut sum_a) = (BrokerStats::default(), BrokerStats::default());
            let mut write = true;
            for ((b, a), addr) in b.iter().zip(a).zip(&routes.addrs) {
                let (Some(b), Some(a)) = (b, a) else {
                    report.uncounted.push(addr.clone());
                    write = false;
                    continue;
                };
                match (node_stats(b), node_stats(a)) {
                    (Some(b), Some(a)) => {
                        add_stats(&mut sum_b, &b);
                        add_stats(&mut sum_a, &a);
                    }
                    _ => {
                        write = false;
                        sum_b.fsyncs = sum_b.fsyncs.saturating_add(b.fsyncs);
                        sum_a.fsyncs = sum_a.fsyncs.saturating_add(a.fsyncs);
                    }
                }
            }
            (
                sum_a.fsyncs.saturating_sub(sum_b.fsyncs),
                write.then(|| write_path_report(&sum_b, &sum_a)),
            )
        }
        _ => (0, None),
    };
    report.fsyncs = fsyncs;
    report.write_path = write_path;
}

/// One node's counters as the embedded broker's are (`None` without write-path
/// counters).
fn node_stats(s: &StatsBody) -> Option<BrokerStats> {
    let w = s.write.as_ref()?;
    Some(BrokerStats {
        fsyncs: s.fsyncs,
        produce_requests: s.produce_requests,
        records_appended: s.records_appended,
        fsync_latency_us: w.fsync_latency_us.clone(),
        rolls: w.rolls,
        roll_stall_max_us: w.roll_stall_max_us,
        zeroed_bytes: w.zeroed_bytes,
        spares_taken: w.spares_taken,
        spares_returned: w.spares_returned,
    })
}

/// Adds one node's counters to `sum`: counts and histogram buckets add, the longest
/// roll stall is the longer one.
fn add_stats(sum: &mut BrokerStats, s: &BrokerStats) {
    sum.fsyncs = sum.fsyncs.saturating_add(s.fsyncs);
    sum.produce_requests = sum.produce_requests.saturating_add(s.produce_requests);
    sum.records_appended = sum.records_appended.saturating_add(s.records_appended);
    if sum.fsync_latency_us.len() < s.fsync_latency_us.len() {
        sum.fsync_latency_us.resize(s.fsync_latency_us.len(), 0);
    }
    for (a, b) in sum.fsync_latency_us.iter_mut().zip(&s.fsync_latency_us) {
        *a = a.saturating_add(*b);
    }
    sum.rolls = sum.rolls.saturating_add(s.rolls);
    sum.roll_stall_max_us = sum.roll_stall_max_us.max(s.roll_stall_max_us);
    sum.zeroed_bytes = sum.zeroed_bytes.saturating_add(s.zeroed_bytes);
    sum.spares_taken = sum.spares_taken.saturating_add(s.spares_taken);
    sum.spares_returned = sum.spares_returned.saturating_add(s.spares_returned);
}

/// The write-path counters between two stats of one broker.
fn write_path_report(before: &BrokerStats, after: &BrokerStats) -> WritePathReport {
    let hist: Vec<u64> = after
        .fsync_latency_us
        .iter()
        .zip(before.fsync_latency_us.iter().chain(std::iter::repeat(&0)))
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let ms = |us: u64| us as f64 / 1000.0;
    WritePathReport {
        timed_fsyncs: hist.iter().sum(),
        fsync_p50_ms: ms(quantile_us(&hist, 0.50)),
        fsync_p99_ms: ms(quantile_us(&hist, 0.99)),
        rolls: after.rolls.saturating_sub(before.rolls),
        roll_stall_max_ms: ms(after.roll_stall_max_us),
        zeroed_bytes: after.zeroed_bytes.saturating_sub(before.zeroed_bytes),
        spares_taken: after.spares_taken.saturating_sub(before.spares_taken),
        spares_returned: after.spares_returned.saturating_sub(before.spares_returned),
    }
}

/// Creates the topic, or checks the partition count of an existing one.
fn ensure_topic(
    client: &mut Client,
    topic: &str,
    partitions: u32,
    write: &WriteOptions,
) -> Result<(), BenchError> {
    let mut settings: Vec<(String, String)> = write
        .segment_bytes
        .map(|n| ("segment_bytes".to_string(), n.to_string()))
        .into_iter()
        .chain(
            write
                .retention_bytes
                .map(|n| ("retention_bytes".to_string(), n.to_string())),
        )
        .collect();
    if write.replication_factor > 1 {
        settings.push((
            crate::engine::net::dispatch::REPLICATION_FACTOR_SETTING.to_string(),
            write.replication_factor.to_string(),
        ));
    }
    match client.create_topic(topic, partitions, &settings) {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some(ErrorCode::TOPIC_EXISTS) => {
            let have = client.list_offsets(topic)?.len() as u32;
            if have != partitions {
                return Err(BenchError::PartitionCount {
                    topic: topic.to_string(),
                    have,
                    want: partitions,
                });
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

fn bench(
    args: &Config,
    routes: &Routes,
    embedded: Option<&Arc<Broker>>,
) -> Result<Report, BenchError> {
    let records = args.records;
    let mut admin = Client::connect_with(
        routes.target(),
        args.timeout,
        args.tls.as_ref(),
        args.token.as_deref(),
    )?;
    ensure_topic(&mut admin, &args.topic, args.partitions, &args.write)?;
    match args.mode {
        Mode::Produce => {
            if let Some(warmup) = args.warmup.filter(|d| !d.is_zero()) {
                // The same load for `warmup`, its report dropped (a run stopped
                // under way fails as the measured one would).
                let warm = Config {
                    duration: Some(warmup),
                    progress_bar: false,
                    ..args.clone()
                };
                produce(&warm, routes, u64::MAX)?;
            }
            let before = counters(routes, args, embedded)?;
            let mut report = produce(args, routes, records)?;
            let after = counters(routes, args, embedded)?;
            between(&mut report, routes, &before, &after);
            Ok(report)
        }
        Mode::Consume => {
            let mut clients = Clients::new(args, routes, admin);
            seed(args, &mut clients, records)?;
            let before = counters(routes, args, embedded)?;
            let mut report = consume(args, &mut clients, records)?;
            let after = counters(routes, args, embedded)?;
            between(&mut report, routes, &before, &after);
            report.write_path = None;
            Ok(report)
        }
    }
}

/// Blocking clients of the nodes of [`Routes`], connected when first used, for the
/// untimed parts of a consume run: each partition's offsets and seed records go to
/// its leader.
struct Clients<'a> {
    args: &'a Config,
    routes: &'a Routes,
    conns: Vec<Option<Client>>,
}

impl<'a> Clients<'a> {
    fn new(args: &'a Config, routes: &'a Routes, target: Client) -> Clients<'a> {
        let mut conns: Vec<Option<Client>> = routes.addrs.iter().map(|_| None).collect();
        if let Some(c) = conns.first_mut() {
            *c = Some(target);
        }
        Clients {
            args,
            routes,
            conns,
        }
    }

    /// The client of `partition`'s leader.
    fn of(&mut self, partition: u32) -> Result<&mut Client, BenchError> {
        // `Routes` names an index of `addrs` for every partition, and `conns` has
        // one slot per address.
        let i = self.routes.of(partition);
        let slot = &mut self.conns[i];
        match slot {
            Some(c) => Ok(c),
            None => {
                let args = self.args;
                Ok(slot.insert(Client::connect_with(
                    &self.routes.addrs[i],
                    args.timeout,
                    args.tls.as_ref(),
                    args.token.as_deref(),
                )?))
            }
        }
    }

    /// Every partition's offsets, each as its leader answers: one list-offsets per
    /// node, keeping the partitions routed to it.
    fn offsets(&mut self) -> Result<Vec<PartitionOffsets>, BenchError> {
        let topic = self.args.topic.clone();
        let mut all = Vec::with_capacity(self.args.partitions as usize);
        for i in 0..self.routes.addrs.len() {
            // Any partition routed to node `i` reaches its connection.
            let Some(first) = (0..self.args.partitions).find(|p| self.routes.of(*p) == i) else {
                continue;
            };
            let routes = self.routes;
            let offsets = self.of(first)?.list_offsets(&topic)?;
            all.extend(offsets.into_iter().filter(|o| routes.of(o.partition) == i));
        }
        all.sort_by_key(|o| o.partition);
        Ok(all)
    }
}

/// Connects every worker to every node of `routes`, then runs `work(worker index,
/// its connections in the order of `routes.addrs`)` for all of them side by side as
/// tasks of one current-thread runtime (one event loop, like redis-benchmark);
/// returns each worker's result and the time from start to the last finish.
/// Connecting is not timed.
fn run_workers<T, Fut>(
    args: &Config,
    routes: &Routes,
    total: Option<u64>,
    progress: &Arc<Progress>,
    work: impl Fn(u32, Vec<Conn>) -> Fut,
) -> Result<(Vec<T>, Duration), BenchError>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = Result<T, BenchError>> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let bar = progress_bar(total, args.progress_bar);
    rt.block_on(async {
        let mut conns = Vec::with_capacity(args.connections as usize);
        for _ in 0..args.connections {
            let mut mine = Vec::with_capacity(routes.addrs.len());
            for addr in &routes.addrs {
                mine.push(
                    Conn::connect(addr, args.timeout, args.token.as_deref(), args.tls.as_ref())
                        .await?,
                );
            }
            conns.push(mine);
        }
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for (w, conn) in (0u32..).zip(conns) {
            set.spawn(work(w, conn));
        }
        let ticker = bar.clone().map(|b| {
            let progress = Arc::clone(progress);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    b.set_position(progress.records.load(Ordering::Relaxed));
                }
            })
        });
        let mut results = Vec::with_capacity(args.connections as usize);
        let mut first_error = None;
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(Ok(r)) => results.push(r),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(BenchError::WorkerPanicked);
                }
            }
        }
        let elapsed = start.elapsed();
        if let Some(t) = ticker {
            t.abort();
        }
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok((results, elapsed)),
        }
    })
}

/// A batch of `n` records of `value` for `partition`.
fn batch_of(partition: u32, n: u64, value: &[u8]) -> PartitionBatch<'_> {
    PartitionBatch {
        partition,
        records: (0..n)
            .map(|_| WireRecord {
                timestamp_ms: -1,
                key: None,
                value,
            })
            .collect(),
    }
}

/// The next batch of a fixed-rate load: how many records (at most `batch` and
/// `left`, and with a `window` (`--duration`) no more than fit in it at `rate`) and
/// when it is due, counted from the worker's start. A batch is due when the last of
/// its records' turn comes, `(sent + n) / rate`, so at no time t more than
/// `rate * t` records have gone: no batch at t = 0 ahead of the schedule, none past
/// the window. `None`: nothing left to send (or nothing more fits in the window).
fn paced_batch(
    rate: f64,
    sent: u64,
    left: u64,
    batch: u64,
    window: Option<Duration>,
) -> Option<(u64, Duration)> {
    let mut n = left.min(batch);
    if let Some(w) = window {
        // The tolerance keeps 100/s over 1s at 100 records despite rounding.
        let fit = (rate * w.as_secs_f64() + 1e-6).floor() as u64;
        n = n.min(fit.saturating_sub(sent));
    }
    if n == 0 || rate <= 0.0 {
        return None;
    }
    Some((n, Duration::from_secs_f64((sent + n) as f64 / rate)))
}

/// Worker `w` of `n` gets an even share of `total`.
fn share(total: u64, w: u32, n: u32) -> u64 {
    total / u64::from(n) + u64::from(u64::from(w) < total % u64::from(n))
}

#[derive(Default)]
struct WorkerResult {
    records: u64,
    requests: u64,
    latencies: Vec<Duration>,
    /// Requests sent again after their leader changed or their connection failed.
    resent: u64,
}

/// What the produce workers acknowledged, each with when it started and ended.
type Partials = Arc<std::sync::Mutex<Vec<(WorkerResult, Instant, Instant)>>>;

/// A produce worker's counts, handed to [`Partials`] when the worker ends, whether
/// it finished or failed (a run stopped under way reports what was acknowledged).
struct Partial {
    result: WorkerResult,
    started: Instant,
    into: Partials,
}

impl Partial {
    fn new(into: &Partials) -> Partial {
        Partial {
            result: WorkerResult::default(),
            started: Instant::now(),
            into: Arc::clone(into),
        }
    }
}

impl std::ops::Deref for Partial {
    type Target = WorkerResult;
    fn deref(&self) -> &WorkerResult {
        &self.result
    }
}

impl std::ops::DerefMut for Partial {
    fn deref_mut(&mut self) -> &mut WorkerResult {
        &mut self.result
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        let result = std::mem::take(&mut self.result);
        let mut all = self
            .into
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.push((result, self.started, Instant::now()));
    }
}

fn produce(args: &Config, routes: &Routes, records: u64) -> Result<Report, BenchError> {
    let value: Arc<[u8]> = vec![b'x'; args.record_size as usize].into();
    let progress = Arc::new(Progress {
        records: AtomicU64::new(0),
    });
    let total = (records != u64::MAX).then_some(records);
    let deadline = args.duration.map(|d| Instant::now() + d);
    let partials: Partials = Arc::default();
    let outcome = run_workers(args, routes, total, &progress, |w, conns| {
        let (value, progress) = (Arc::clone(&value), Arc::clone(&progress));
        let partials = Arc::clone(&partials);
        let (topic, routes) = (args.topic.clone(), routes.clone());
        let (batch, partitions, connections) = (args.batch, args.partitions, args.connections);
        let idempotent = args.idempotent;
        let in_flight = args.in_flight.max(1) as usize;
        let per_conn = args
            .write
            .rate
            .map(|r| (r as f64 / f64::from(connections.max(1))).max(1e-3));
        let window = args.duration;
        let brokers = args.brokers.clone();
        let dial = follow::Dial {
            timeout: args.timeout,
            token: args.token.clone(),
            tls: args.tls.clone(),
        };
        async move {
            let mut left = share(records, w, connections);
            // Kept on failure too: a run stopped under way reports what was acked.
            let mut r = Partial::new(&partials);
            let mut turn = u64::from(w);
            // With a fixed rate each connection sends its share on a schedule.
            let started = Instant::now();
            let mut sent = 0u64;
            let route = (0..partitions).map(|p| routes.of(p)).collect();
            let mut lanes = Lanes::new(routes.addrs.clone(), conns, route, &brokers, dial);
            // One producer id for all nodes: a cluster's nodes hand out disjoint ids.
            let producer = match (idempotent, lanes.first()) {
                (true, Some(conn)) => Some(conn.init_producer().await?),
                _ => None,
            };
            let sender = Sender {
                topic,
                producer,
                value,
            };
            let mut sequences = vec![0i32; partitions as usize];
            // Requests sent and not yet answered, oldest first.
            let mut unanswered: VecDeque<Pending> = VecDeque::new();
            loop {
                // A fixed rate stops on its own schedule (`paced_batch`): the batch
                // due at the end of the window is the last one; a load that fell
                // behind stops once the window is over.
                let more = left > 0
                    && match per_conn {
                        Some(_) => window.is_none_or(|w| started.elapsed() <= w),
                        None => deadline.is_none_or(|d| Instant::now() < d),
                    };
                if more && unanswered.len() < in_flight {
                    let n = match per_conn {
                        Some(rate) => {
                            let Some((n, due)) =
                                paced_batch(rate, sent, left, u64::from(batch), window)
                            else {
                                left = 0;
                                continue;
                            };
                            let due = started + due;
                            let now = Instant::now();
                            if due > now {
                                tokio::time::sleep(due - now).await;
                            }
                            n
                        }
                        None => left.min(u64::from(batch)),
                    };
                    sent += n;
                    left -= n;
                    let partition = (turn % u64::from(partitions)) as u32;
                    turn += 1;
                    let sequence = sequences.get(partition as usize).copied().unwrap_or(0);
                    if let Some(s) = sequences.get_mut(partition as usize) {
                        *s = sequence.saturating_add(i32::try_from(n).unwrap_or(i32::MAX));
                    }
                    let pending = Pending {
                        lane: 0,
                        generation: 0,
                        id: 0,
                        sent: Instant::now(),
                        partition,
                        records: n,
                        sequence,
                    };
                    unanswered.push_back(lanes.send(pending, &sender).await?);
                    continue;
                }
                let Some(p) = unanswered.pop_front() else {
                    break;
                };
                let ack = match lanes.conn_of(&p) {
                    Some(conn) => conn.receive_produce(p.id).await,
                    // Its connection was dropped when a later send on it failed:
                    // taken as lost, so it and the others sent on it go again.
                    None => Err(ClientError::Closed {
                        addr: lanes.addr(p.lane).to_string(),
                    }),
                };
                let failure = match ack {
                    Ok(Ok(())) => {
                        lanes.answered(p.partition);
                        r.latencies.push(p.sent.elapsed());
                        r.records += p.records;
                        r.requests += 1;
                        progress.records.fetch_add(p.records, Ordering::Relaxed);
                        continue;
                    }
                    Ok(Err((code, message))) => Failure::Refused(code, message),
                    Err(e) => Failure::Lost(e),
                };
                if !lanes.follows(&failure, p.partition) {
                    return Err(match failure {
                        Failure::Refused(code, message) => BenchError::ProduceRefused {
                            addr: lanes.addr(p.lane).to_string(),
                            code,
                            message,
                        },
                        Failure::Lost(e) => e.into(),
                    });
                }
                lanes.recover(p, &failure, &mut unanswered, &sender).await?;
                r.resent = lanes.resent;
            }
            Ok(())
        }
    });
    let done: Vec<(WorkerResult, Instant, Instant)> = std::mem::take(
        &mut *partials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let value_bytes = u64::from(args.record_size);
    match outcome {
        Ok((_, elapsed)) => Ok(collect(
            done.into_iter().map(|(r, _, _)| r).collect(),
            elapsed,
            value_bytes,
        )),
        // Failed before any worker ran (connecting): nothing to report.
        Err(e) if done.is_empty() => Err(e),
        Err(source) => {
            let start = done.iter().map(|(_, s, _)| *s).min();
            let end = done.iter().map(|(_, _, e)| *e).max();
            let elapsed = match (start, end) {
                (Some(s), Some(e)) => e.saturating_duration_since(s),
                _ => Duration::ZERO,
            };
            let results = done.into_iter().map(|(r, _, _)| r).collect();
            Err(BenchError::Stopped {
                report: Box::new(collect(results, elapsed, value_bytes)),
                source: Box::new(source),
            })
        }
    }
}

fn collect(results: Vec<WorkerResult>, elapsed: Duration, value_bytes: u64) -> Report {
    let records: u64 = results.iter().map(|r| r.records).sum();
    let requests = results.iter().map(|r| r.requests).sum();
    let resent = results.iter().map(|r| r.resent).sum();
    let mut latencies: Vec<Duration> = results.into_iter().flat_map(|r| r.latencies).collect();
    latencies.sort_unstable();
    Report {
        broker: String::new(),
        records,
        requests,
        value_bytes: records * value_bytes,
        elapsed,
        fsyncs: 0,
        latencies,
        write_path: None,
        resent,
        uncounted: Vec::new(),
    }
}

/// Makes sure every partition holds its share of `records` for the consume bench.
fn seed(args: &Config, clients: &mut Clients<'_>, records: u64) -> Result<(), BenchError> {
    let offsets = clients.offsets()?;
    let value = vec![b'x'; args.record_size as usize];
    let per_request = 1000u64.min(u64::from(RECORDS_PER_PARTITION_MAX));
    for o in &offsets {
        let want = share(records, o.partition, args.partitions);
        let mut have = o.end_offset.saturating_sub(o.start_offset);
        while have < want {
            let n = (want - have).min(per_request);
            let batch = batch_of(o.partition, n, &value);
            let acks = clients.of(o.partition)?.produce(&args.topic, vec![batch])?;
            if let Some(Err((code, message))) = acks.first().map(|a| &a.result) {
                return Err(BenchError::SeedRefused {
                    code: *code,
                    message: message.clone(),
                });
            }
            have += n;
        }
    }
    // With `--flush-every-records` above 1 the last records were acknowledged before
    // their fsync, and a fetch serves durable records only: wait (untimed) for the
    // flusher's next pass, or the consumers would find the durable end before the
    // records they are to read and stop there.
    let deadline = Instant::now() + args.timeout;
    while Instant::now() < deadline {
        let offsets = clients.offsets()?;
        let durable = offsets.iter().all(|o| {
            o.end_offset.saturating_sub(o.start_offset)
                >= share(records, o.partition, args.partitions)
        });
        if durable {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn consume(args: &Config, clients: &mut Clients<'_>, records: u64) -> Result<Report, BenchError> {
    let offsets = clients.offsets()?;
    let routes = clients.routes;
    // Tasks: each partition's share, split into as many ranges as connections per
    // partition; tasks go to workers round-robin.
    let pieces = (args.connections / args.partitions).max(1);
    let mut tasks: Vec<(u32, u64, u64)> = Vec::new();
    for o in &offsets {
        let want = share(records, o.partition, args.partitions);
        let mut from = o.start_offset;
        for piece in 0..pieces {
            let n = share(want, piece, pieces);
            if n > 0 {
                tasks.push((o.partition, from, from + n));
            }
            from += n;
        }
    }
    let per_record = encoded_len(None, args.record_size as usize).unwrap_or(1) as u64;
    let max_bytes =
        (u64::from(args.batch) * per_record).clamp(1, u64::from(FETCH_BYTES_MAX)) as u32;
    let progress = Arc::new(Progress {
        records: AtomicU64::new(0),
    });
    let tasks: Arc<[(u32, u64, u64)]> = tasks.into();
    let (results, elapsed) =
        run_workers(args, routes, Some(records), &progress, |w, mut conns| {
            let (tasks, progress) = (Arc::clone(&tasks), Arc::clone(&progress));
            let routes = routes.clone();
            let topic = args.topic.clone();
            let connections = args.connections as usize;
            async move {
                let mut r = WorkerResult::default();
                for &(partition, from, to) in tasks.iter().skip(w as usize).step_by(connections) {
                    let mut pos = from;
                    while pos < to {
                        let t = Instant::now();
                        let conn = &mut conns[routes.of(partition)];
                        let f = conn.fetch(&topic, partition, pos, max_bytes, to).await?;
                        r.latencies.push(t.elapsed());
                        r.requests += 1;
                        let Some(last) = f.last_offset else {
                            return Err(BenchError::FetchEmpty {
                                topic,
                                partition,
                                offset: pos,
                                end: to,
                            });
                        };
                        pos = last + 1;
                        r.records += f.records;
                        progress.records.fetch_add(f.records, Ordering::Relaxed);
                    }
                }
                Ok(r)
            }
        })?;
    Ok(collect(results, elapsed, u64::from(args.record_size)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every batch `paced_batch` hands out until it says stop: (records, due in s).
    fn schedule(rate: f64, records: u64, batch: u64, window: Option<f64>) -> Vec<(u64, f64)> {
        let (mut sent, mut left, mut out) = (0, records, Vec::new());
        let window = window.map(Duration::from_secs_f64);
        while let Some((n, due)) = paced_batch(rate, sent, left, batch, window) {
            out.push((n, due.as_secs_f64()));
            sent += n;
            left -= n;
        }
        out
    }

    #[test]
    fn a_fixed_rate_sends_each_batch_when_its_last_record_is_due() {
        // 300 records at 100/s in batches of 100: at 1, 2 and 3 s (3 s, 100/s).
        assert_eq!(
            schedule(100.0, 300, 100, None),
            [(100, 1.0), (100, 2.0), (100, 3.0)]
        );
        // --duration 1s at 100/s: 100 records, the last batch due at the deadline.
        let one_second = schedule(100.0, u64::MAX, 100, Some(1.0));
        assert_eq!(one_second, [(100, 1.0)]);
        let small = schedule(100.0, u64::MAX, 10, Some(1.0));
        assert_eq!(small.len(), 10);
        assert_eq!(small.iter().map(|b| b.0).sum::<u64>(), 100);
        assert!((small[0].1 - 0.1).abs() < 1e-9, "{small:?}");
        // A batch larger than the window holds: cut to what fits.
        assert_eq!(schedule(100.0, u64::MAX, 1000, Some(2.5)), [(250, 2.5)]);
        // Never ahead of the schedule.
        for (rate, batch) in [(7.0, 3), (1000.0, 64), (0.5, 1)] {
            let mut sent = 0;
            for (n, due) in schedule(rate, 50, batch, Some(200.0)) {
                sent += n;
                assert!(
                    sent as f64 <= rate * due + 1e-6,
                    "{rate} {batch}: {sent} by {due}"
                );
            }
        }
    }

    #[test]
    fn shares_add_up() {
        for total in [0u64, 1, 7, 100, 101] {
            for n in [1u32, 3, 4, 16] {
                let sum: u64 = (0..n).map(|w| share(total, w, n)).sum();
                assert_eq!(sum, total, "{total} over {n}");
            }
        }
    }

    #[test]
    fn quantiles() {
        let r = Report {
            broker: String::new(),
            records: 0,
            requests: 0,
            value_bytes: 0,
            elapsed: Duration::from_secs(1),
            fsyncs: 0,
            latencies: (1..=100).map(Duration::from_millis).collect(),
            write_path: None,
            resent: 0,
            uncounted: Vec::new(),
        };
        assert_eq!(r.quantile_ms(0.5), 50.0);
        assert_eq!(r.quantile_ms(0.99), 99.0);
        assert_eq!(r.quantile_ms(1.0), 100.0);
        let empty = Report {
            latencies: vec![],
            ..r
        };
        assert_eq!(empty.quantile_ms(0.5), 0.0);
    }
}
