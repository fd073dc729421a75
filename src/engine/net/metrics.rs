//! Prometheus metrics: the counters the request path keeps ([`NetMetrics`]), a
//! collector that reads them and the broker's own figures at scrape time
//! ([`BrokerCollector`]), and the HTTP endpoint `GET /metrics` ([`MetricsServer`]).
//! The text is encoded by `prometheus-client` (OpenMetrics text, which Prometheus
//! scrapes natively).
//!
//! Invariants:
//! - Labels are only `api`, `topic`, `partition` and `group`: the series are bounded
//!   by the request types and the topics, partitions and consumer groups that exist,
//!   never by connections, keys or clients.
//! - The request path pays atomics only: per-api slots are a fixed array, and a
//!   session keeps the handle of the topic it last used, so the topic map's lock is
//!   taken once per topic per connection, not per request.
//! - Per-partition figures are not kept on the request path at all: the collector
//!   asks the broker for them when scraped.
//! - The endpoint runs on its own thread and runtime, so a slow scraper never delays
//!   the native listener; it serves at most [`HTTP_CONNECTIONS_MAX`] connections.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::engine::broker::{Broker, PartitionState};
use crate::engine::partition::zero::{count_below_pow2_us, Pow2Histogram};
use crate::engine::replication::{PartitionView, Replicator};
use crate::format::record::{len_prefix, record_len, LenPrefix, LEN_FIELD};
use crate::format::wire::ApiKey;

/// Request slots, indexed by api key; a key at or past the last slot (or one the
/// broker does not know) is counted in the last, labelled `unknown`.
const API_SLOTS: usize = 128;
/// Latency buckets exported, as powers of two of microseconds: 16 µs ..= 16.8 s.
const LATENCY_EXP_MIN: u32 = 4;
const LATENCY_EXP_MAX: u32 = 24;
/// Group-commit batch buckets exported, as powers of two of records: 1 ..= 65536.
const BATCH_EXP_MAX: u32 = 16;
/// Connections the metrics endpoint serves at once; more are closed at once.
pub const HTTP_CONNECTIONS_MAX: usize = 16;
/// Longest a scraper may take to send its request headers.
const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the endpoint's accept loop looks at the stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The content type of the OpenMetrics text format `prometheus-client` encodes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One request type's count and latency (µs).
#[derive(Debug, Default)]
struct ApiSlot {
    latency_us: Pow2Histogram,
}

/// Traffic of one topic, counted by the request path.
#[derive(Debug, Default)]
pub struct TopicCounters {
    produced_records: AtomicU64,
    produced_bytes: AtomicU64,
    fetched_records: AtomicU64,
    fetched_bytes: AtomicU64,
}

impl TopicCounters {
    /// Counts records produced, `bytes` of them in their stored encoding.
    pub fn produced(&self, records: u64, bytes: u64) {
        self.produced_records.fetch_add(records, Ordering::Relaxed);
        self.produced_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// The counters the request path keeps; shared by every session of a server and
/// read by [`BrokerCollector`].
#[derive(Debug)]
pub struct NetMetrics {
    apis: Box<[ApiSlot]>,
    topics: RwLock<BTreeMap<String, Arc<TopicCounters>>>,
    /// Connections open now (the server's own count).
    connections: RwLock<Option<Arc<AtomicUsize>>>,
    /// Failed logins (bad token or rate-limited address).
    auth_failures: AtomicU64,
    /// The server's connection gate: connections refused by a connection limit.
    gate: RwLock<Option<Arc<super::limits::ConnectionGate>>>,
}

impl Default for NetMetrics {
    fn default() -> Self {
        NetMetrics {
            apis: (0..API_SLOTS).map(|_| ApiSlot::default()).collect(),
            topics: RwLock::new(BTreeMap::new()),
            connections: RwLock::new(None),
            auth_failures: AtomicU64::new(0),
            gate: RwLock::new(None),
        }
    }
}

impl NetMetrics {
    /// Counts one request of `api_key` that took `took`.
    pub fn request(&self, api_key: u16, took: Duration) {
        let slot = match ApiKey::from_u16(api_key) {
            Some(_) => usize::from(api_key).min(API_SLOTS - 1),
            None => API_SLOTS - 1,
        };
        if let Some(s) = self.apis.get(slot) {
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            s.latency_us.record(us);
        }
    }

    /// The counters of `topic`, created on first use.
    pub fn topic(&self, topic: &str) -> Arc<TopicCounters> {
        if let Some(c) = self
            .topics
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topic)
        {
            return Arc::clone(c);
        }
        let mut map = self.topics.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(topic.to_string()).or_default())
    }

    /// Counts one failed login.
    pub fn auth_failure(&self) {
        self.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Failed logins counted so far.
    pub fn auth_failures(&self) -> u64 {
        self.auth_failures.load(Ordering::Relaxed)
    }

    /// Lets the collector report `count` as the open connections.
    pub fn set_connections(&self, count: Arc<AtomicUsize>) {
        *self
            .connections
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(count);
    }

    /// Lets the collector report the connections `gate` refused.
    pub fn set_gate(&self, gate: Arc<super::limits::ConnectionGate>) {
        *self.gate.write().unwrap_or_else(PoisonError::into_inner) = Some(gate);
    }
}

/// A session's handle on the counters of the topic it used last.
#[derive(Debug, Default)]
pub struct TopicCache {
    last: Option<(String, Arc<TopicCounters>)>,
}

impl TopicCache {
    fn get(&mut self, metrics: &NetMetrics, topic: &str) -> &TopicCounters {
        if self.last.as_ref().is_some_and(|(name, _)| name != topic) {
            self.last = None;
        }
        &self
            .last
            .get_or_insert_with(|| (topic.to_string(), metrics.topic(topic)))
            .1
    }

    /// Counts records produced to `topic`, `bytes` of them in their stored encoding.
    pub fn produced(&mut self, metrics: &NetMetrics, topic: &str, records: u64, bytes: u64) {
        self.get(metrics, topic).produced(records, bytes);
    }

    /// `topic`'s counters, to count a produce that is answered later.
    pub fn counters(&mut self, metrics: &NetMetrics, topic: &str) -> Arc<TopicCounters> {
        self.get(metrics, topic);
        self.last
            .as_ref()
            .map_or_else(|| metrics.topic(topic), |(_, c)| Arc::clone(c))
    }

    /// Counts `records` fetched from `topic`, `bytes` of them in their stored encoding.
    pub fn fetched_counted(&mut self, metrics: &NetMetrics, topic: &str, records: u64, bytes: u64) {
        let c = self.get(metrics, topic);
        c.fetched_records.fetch_add(records, Ordering::Relaxed);
        c.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts the records of `chunks` (stored encoding) as fetched from `topic`.
    pub fn fetched<'a>(
        &mut self,
        metrics: &NetMetrics,
        topic: &str,
        chunks: impl Iterator<Item = &'a [u8]>,
    ) {
        let (mut records, mut bytes) = (0, 0);
        for c in chunks {
            records += count_records(c);
            bytes += c.len() as u64;
        }
        let c = self.get(metrics, topic);
        c.fetched_records.fetch_add(records, Ordering::Relaxed);
        c.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Bytes a record of `key` and `value` takes in its stored encoding.
pub fn stored_len(key: Option<&[u8]>, value: &[u8]) -> u64 {
    record_len(key.map(<[u8]>::len), value.len()).map_or(0, |l| u64::from(l) + LEN_FIELD as u64)
}

/// Whole records at the start of `buf` (stepping over their length prefixes only).
fn count_records(mut buf: &[u8]) -> u64 {
    let mut n = 0;
    while let LenPrefix::Whole { encoded_len } = len_prefix(buf) {
        n += 1;
        buf = buf.get(encoded_len..).unwrap_or(&[]);
    }
    n
}

/// Reads the broker's figures and the request counters when scraped, and on a
/// cluster node its replicated partitions as its Raft groups see them.
#[derive(Debug)]
pub struct BrokerCollector {
    broker: Arc<Broker>,
    net: Arc<NetMetrics>,
    replication: Option<Arc<dyn Replicator>>,
}

impl BrokerCollector {
    pub fn new(
        broker: Arc<Broker>,
        net: Arc<NetMetrics>,
        replication: Option<Arc<dyn Replicator>>,
    ) -> Self {
        BrokerCollector {
            broker,
            net,
            replication,
        }
    }
}

type Fmt = Result<(), std::fmt::Error>;

/// One metric family: its descriptor, then one sample per label set.
fn family<L, F>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric_type: MetricType,
    samples: &[(L, F)],
) -> Fmt
where
    L: prometheus_client::encoding::EncodeLabelSet,
    F: EncodeMetric,
{
    if samples.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, unit, metric_type)?;
    for (labels, metric) in samples {
        metric.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// One metric without labels.
fn single(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: &impl EncodeMetric,
) -> Fmt {
    metric.encode(enc.encode_descriptor(name, help, unit, metric.metric_type())?)
}

/// A value encoded at scrape time as a counter or a gauge.
#[derive(Debug)]
enum Value {
    Counter(u64),
    Gauge(i64),
}

impl EncodeMetric for Value {
    fn encode(&self, mut e: prometheus_client::encoding::MetricEncoder) -> Fmt {
        match self {
            Value::Counter(v) => e.encode_counter::<NoLabelSet, _, u64>(v, None),
            Value::Gauge(v) => e.encode_gauge(v),
        }
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Value::Counter(_) => MetricType::Counter,
            Value::Gauge(_) => MetricType::Gauge,
        }
    }
}

/// A histogram read at scrape time: the count of each bucket (not cumulative: the
/// encoder sums them) by upper bound, the last one `+Inf`; sum and count.
#[derive(Debug)]
struct Hist {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl Hist {
    /// From cumulative counts at each finite bound: adds the `+Inf` bucket.
    fn from_cumulative(cumulative: impl Iterator<Item = (f64, u64)>, sum: f64, count: u64) -> Hist {
        let mut buckets = Vec::new();
        let mut below = 0;
        for (bound, at_most) in cumulative {
            buckets.push((bound, at_most.saturating_sub(below)));
            below = below.max(at_most);
        }
        buckets.push((f64::MAX, count.saturating_sub(below)));
        Hist {
            buckets,
            sum,
            count,
        }
    }
}

impl EncodeMetric for Hist {
    fn encode(&self, mut e: prometheus_client::encoding::MetricEncoder) -> Fmt {
        e.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn seconds_of_us(us: u64) -> f64 {
    us as f64 / 1e6
}

fn latency_hist(h: &Pow2Histogram) -> Hist {
    Hist::from_cumulative(
        (LATENCY_EXP_MIN..=LATENCY_EXP_MAX)
            .map(|e| (seconds_of_us(1 << e), h.count_at_most_pow2(e))),
        seconds_of_us(h.sum()),
        h.count(),
    )
}

impl Collector for BrokerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Fmt {
        self.encode_requests(&mut enc)?;
        self.encode_topics(&mut enc)?;
        self.encode_write_path(&mut enc)?;
        self.encode_partitions(&mut enc)?;
        self.encode_replication(&mut enc)?;
        single(
            &mut enc,
            "seglog_auth_failures",
            "Failed logins of the native protocol (bad token or rate-limited address)",
            None,
            &Value::Counter(self.net.auth_failures.load(Ordering::Relaxed)),
        )?;
        let open = self
            .net
            .connections
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |c| c.load(Ordering::Relaxed));
        let refused = self
            .net
            .gate
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |g| g.refused());
        single(
            &mut enc,
            "seglog_connections_refused",
            "Connections of the native protocol refused by a connection limit",
            None,
            &Value::Counter(refused),
        )?;
        single(
            &mut enc,
            "seglog_open_connections",
            "Connections of the native protocol open now",
            None,
            &Value::Gauge(i64::try_from(open).unwrap_or(i64::MAX)),
        )
    }
}

impl BrokerCollector {
    fn encode_requests(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let mut counts = Vec::new();
        let mut latencies = Vec::new();
        for (i, slot) in self.net.apis.iter().enumerate() {
            let n = slot.latency_us.count();
            if n == 0 {
                continue;
            }
            let name = u16::try_from(i)
                .ok()
                .filter(|_| i < API_SLOTS - 1)
                .and_then(ApiKey::from_u16)
                .map_or("unknown", ApiKey::name);
            counts.push(([("api", name)], Value::Counter(n)));
            latencies.push(([("api", name)], latency_hist(&slot.latency_us)));
        }
        family(
            enc,
            "seglog_requests",
            "Requests of the native protocol answered, by request type",
            None,
            MetricType::Counter,
            &counts,
        )?;
        family(
            enc,
            "seglog_request_duration",
            "Time from a request's frame read to its response encoded, by request type",
            Some(&Unit::Seconds),
            MetricType::Histogram,
            &latencies,
        )
    }

    fn encode_topics(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let live = self.broker.list_topics();
        let topics: Vec<(String, Arc<TopicCounters>)> = {
            let map = self
                .net
                .topics
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            live.iter()
                .filter_map(|t| map.get(t).map(|c| (t.clone(), Arc::clone(c))))
                .collect()
        };
        type Field = fn(&TopicCounters) -> &AtomicU64;
        let specs: [(&str, &str, Option<Unit>, Field); 4] = [
            (
                "seglog_produced_records",
                "Records produced (acknowledged) per topic",
                None,
                |c| &c.produced_records,
            ),
            (
                "seglog_produced",
                "Bytes of the records produced per topic, in their stored encoding",
                Some(Unit::Bytes),
                |c| &c.produced_bytes,
            ),
            (
                "seglog_fetched_records",
                "Records sent in fetch responses per topic",
                None,
                |c| &c.fetched_records,
            ),
            (
                "seglog_fetched",
                "Bytes of the records sent in fetch responses per topic, in their stored encoding",
                Some(Unit::Bytes),
                |c| &c.fetched_bytes,
            ),
        ];
        for (name, help, unit, field) in &specs {
            let samples: Vec<_> = topics
                .iter()
                .map(|(t, c)| {
                    (
                        [("topic", t.as_str())],
                        Value::Counter(field(c).load(Ordering::Relaxed)),
                    )
                })
                .collect();
            family(
                enc,
                name,
                help,
                unit.as_ref(),
                MetricType::Counter,
                &samples,
            )?;
        }
        Ok(())
    }

    fn encode_write_path(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let stats = self.broker.stats();
        let fsync_counts = &stats.fsync_latency_us;
        let fsync = Hist::from_cumulative(
            (LATENCY_EXP_MIN..=LATENCY_EXP_MAX)
                .map(|e| (seconds_of_us(1 << e), count_below_pow2_us(fsync_counts, e))),
            seconds_of_us(self.broker.fsync_latency_sum_us()),
            fsync_counts.iter().sum(),
        );
        single(
            enc,
            "seglog_fsync_duration",
            "Latency of the fsyncs of log data (group commits and rolls)",
            Some(&Unit::Seconds),
            &fsync,
        )?;
        let batches = self.broker.commit_batches();
        let batch = Hist::from_cumulative(
            (0..=BATCH_EXP_MAX).map(|e| (f64::from(1u32 << e), batches.count_at_most_pow2(e))),
            batches.sum() as f64,
            batches.count(),
        );
        single(
            enc,
            "seglog_group_commit_records",
            "Records made durable by each group commit (one value per fsync that covered records)",
            None,
            &batch,
        )?;
        single(
            enc,
            "seglog_fsyncs",
            "Every fsync, fdatasync and directory fsync the broker made",
            None,
            &Value::Counter(stats.fsyncs),
        )
    }

    /// Per-partition figures, read from the broker now, and the consumer groups' lag
    /// per partition (labelled by group too: the broker bounds the groups and their
    /// committed offsets).
    fn encode_partitions(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let mut rows = Vec::new();
        let mut failed = 0i64;
        let mut damaged = 0u64;
        for topic in self.broker.list_topics() {
            // A topic deleted since the list, or offline, has no partitions to show.
            let Ok(d) = self.broker.describe_topic(&topic) else {
                continue;
            };
            for p in d.partitions {
                failed += i64::from(p.state == PartitionState::Failed);
                damaged += u64::from(p.state == PartitionState::Damaged);
                rows.push((topic.clone(), p.partition.to_string(), p));
            }
        }
        type Pick = fn(&crate::engine::broker::PartitionInfo) -> Value;
        let gauge = |v: u64| Value::Gauge(i64::try_from(v).unwrap_or(i64::MAX));
        let specs: [(&str, &str, Option<Unit>, MetricType, Pick); 10] = [
            (
                "seglog_partition",
                "Bytes of a partition's segments, headers included",
                Some(Unit::Bytes),
                MetricType::Gauge,
                |p| Value::Gauge(i64::try_from(p.bytes).unwrap_or(i64::MAX)),
            ),
            (
                "seglog_partition_segments",
                "Segments of a partition",
                None,
                MetricType::Gauge,
                |p| Value::Gauge(i64::try_from(p.segments).unwrap_or(i64::MAX)),
            ),
            (
                "seglog_partition_start_offset",
                "First offset of a partition",
                None,
                MetricType::Gauge,
                |p| Value::Gauge(i64::try_from(p.start_offset).unwrap_or(i64::MAX)),
            ),
            (
                "seglog_partition_end_offset",
                "Next durable offset of a partition",
                None,
                MetricType::Gauge,
                |p| Value::Gauge(i64::try_from(p.end_offset).unwrap_or(i64::MAX)),
            ),
            (
                "seglog_retention_runs",
                "Retention visits of a partition",
                None,
                MetricType::Counter,
                |p| Value::Counter(p.cleanup.retention_runs),
            ),
            (
                "seglog_retention_deleted",
                "Bytes of the segments retention removed",
                Some(Unit::Bytes),
                MetricType::Counter,
                |p| Value::Counter(p.cleanup.bytes_deleted),
            ),
            (
                "seglog_retention_errors",
                "Retention visits that failed",
                None,
                MetricType::Counter,
                |p| Value::Counter(p.cleanup.retention_errors),
            ),
            (
                "seglog_compaction_runs",
                "Compaction visits of a partition that did work or failed",
                None,
                MetricType::Counter,
                |p| Value::Counter(p.cleanup.compaction_runs),
            ),
            (
                "seglog_compaction_freed",
                "Bytes compaction freed (segment bytes before minus after)",
                Some(Unit::Bytes),
                MetricType::Counter,
                |p| Value::Counter(p.cleanup.bytes_compacted),
            ),
            (
                "seglog_compaction_errors",
                "Compaction visits that failed",
                None,
                MetricType::Counter,
                |p| Value::Counter(p.cleanup.compaction_errors),
            ),
        ];
        for (name, help, unit, metric_type, pick) in &specs {
            let samples: Vec<_> = rows
                .iter()
                .map(|(t, n, p)| ([("topic", t.as_str()), ("partition", n.as_str())], pick(p)))
                .collect();
            family(enc, name, help, unit.as_ref(), *metric_type, &samples)?;
        }
        self.encode_group_lag(enc, &rows)?;
        single(
            enc,
            "seglog_failed_partitions",
            "Partitions that refuse writes (failed, or could not be opened)",
            None,
            &gauge(u64::try_from(failed).unwrap_or(0)),
        )?;
        single(
            enc,
            "seglog_damaged_partitions",
            "Partitions served with records that cannot be read (a damaged or lost segment)",
            None,
            &gauge(damaged),
        )?;
        let scrub = self.broker.scrub_figures();
        single(
            enc,
            "seglog_scrub_passes",
            "Scrub passes over every sealed segment that ran to their end",
            None,
            &Value::Counter(scrub.passes),
        )?;
        single(
            enc,
            "seglog_scrub_read",
            "Bytes of sealed segments the scrub read",
            Some(&Unit::Bytes),
            &Value::Counter(scrub.bytes),
        )?;
        single(
            enc,
            "seglog_scrub_damaged_segments",
            "Damaged sealed segments the scrub found (counted by every pass that finds one)",
            None,
            &Value::Counter(scrub.damaged),
        )
    }
}

impl BrokerCollector {
    /// On a cluster node, per partition of a replicated topic it holds a replica of:
    /// whether it leads, the Raft term, the replicas and the in-sync replicas (as its
    /// Kafka Metadata names them); and the partitions it leads with fewer replicas in
    /// sync than placed (Kafka's UnderReplicatedPartitions). Nothing without
    /// `--peers`.
    fn encode_replication(&self, enc: &mut DescriptorEncoder) -> Fmt {
        let Some(r) = &self.replication else {
            return Ok(());
        };
        let mut views = Vec::new();
        for topic in self.broker.list_topics() {
            if !r.is_replicated(&topic) {
                continue;
            }
            let Ok(n) = self.broker.partition_count(&topic) else {
                continue;
            };
            for p in 0..n {
                // Only this node's replicas: a partition placed elsewhere is the
                // holders' to report.
                if let Some(v) = r.partition_view(&topic, p).filter(|v| v.held) {
                    views.push((topic.clone(), p.to_string(), v));
                }
            }
        }
        let me = r.node_id();
        let gauge = |v: usize| Value::Gauge(i64::try_from(v).unwrap_or(i64::MAX));
        type Pick = fn(&PartitionView, u64) -> Value;
        let specs: [(&str, &str, Pick); 4] = [
            (
                "seglog_replica_leader",
                "1 when this node leads the replicated partition, else 0",
                |v, me| Value::Gauge(i64::from(v.leader == Some(me))),
            ),
            (
                "seglog_raft_term",
                "The Raft term this node's replica of the partition is in",
                |v, _| Value::Gauge(i64::try_from(v.term).unwrap_or(i64::MAX)),
            ),
            (
                "seglog_replicas",
                "Replicas of the partition (its replication factor)",
                |v, _| Value::Gauge(i64::try_from(v.replicas.len()).unwrap_or(i64::MAX)),
            ),
            (
                "seglog_in_sync_replicas",
                "Replicas in sync, as this node's Kafka Metadata names them",
                |v, _| Value::Gauge(i64::try_from(v.in_sync.len()).unwrap_or(i64::MAX)),
            ),
        ];
        for (name, help, pick) in &specs {
            let samples: Vec<_> = views
                .iter()
                .map(|(t, n, v)| {
                    (
                        [("topic", t.as_str()), ("partition", n.as_str())],
                        pick(v, me),
                    )
                })
                .collect();
            family(enc, name, help, None, MetricType::Gauge, &samples)?;
        }
        let under = views
            .iter()
            .filter(|(_, _, v)| v.leader == Some(me) && v.in_sync.len() < v.replicas.len())
            .count();
        single(
            enc,
            "seglog_under_replicated_partitions",
            "Replicated partitions this node leads with fewer replicas in sync than placed",
            None,
            &gauge(under),
        )?;
        single(
            enc,
            "seglog_closed_replicas",
            "Replicas this node holds whose Raft group is not open (cluster status says why)",
            None,
            &gauge(r.closed_replicas()),
        )
    }

    /// `seglog_group_lag{group, topic, partition}`: a partition's end offset minus
    /// the group's committed offset (0 when the commit is at or past the end), for
    /// every committed offset of a partition that exists.
    fn encode_group_lag(
        &self,
        enc: &mut DescriptorEncoder,
        rows: &[(String, String, crate::engine::broker::PartitionInfo)],
    ) -> Fmt {
        let ends: std::collections::HashMap<(&str, u32), u64> = rows
            .iter()
            .map(|(t, _, p)| ((t.as_str(), p.partition), p.end_offset))
            .collect();
        let groups = self.broker.groups();
        let mut lags = Vec::new();
        // A cluster node that does not coordinate the groups has none to report.
        for (group, _) in groups.list().unwrap_or_default() {
            let Ok(offsets) = groups.fetch_offsets(&group, None, None) else {
                continue;
            };
            for o in offsets {
                if let Some(end) = ends.get(&(o.topic.as_str(), o.partition)) {
                    let lag = end.saturating_sub(o.offset);
                    lags.push((group.clone(), o.topic, o.partition.to_string(), lag));
                }
            }
        }
        let samples: Vec<_> = lags
            .iter()
            .map(|(g, t, p, lag)| {
                (
                    [
                        ("group", g.as_str()),
                        ("topic", t.as_str()),
                        ("partition", p.as_str()),
                    ],
                    Value::Gauge(i64::try_from(*lag).unwrap_or(i64::MAX)),
                )
            })
            .collect();
        family(
            enc,
            "seglog_group_lag",
            "Records of a partition after a consumer group's committed offset",
            None,
            MetricType::Gauge,
            &samples,
        )
    }
}

/// The registry of a broker's metrics: the collector over `broker`, `net` and, on
/// a cluster node, its replication.
pub fn registry(
    broker: Arc<Broker>,
    net: Arc<NetMetrics>,
    replication: Option<Arc<dyn Replicator>>,
) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(BrokerCollector::new(broker, net, replication)));
    r
}

/// Encodes `registry` in the text format.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// The HTTP endpoint: `GET /metrics`; every other path is 404, another method on
/// /metrics 405.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    thread: JoinHandle<()>,
}

impl MetricsServer {
    /// Serves `registry` on `listener` (bound already) from its own thread until
    /// `stop` is set.
    pub fn start(
        listener: TcpListener,
        registry: Registry,
        stop: Arc<AtomicBool>,
    ) -> io::Result<MetricsServer> {
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let rt = super::server::runtime()?;
        let registry = Arc::new(registry);
        let thread = std::thread::Builder::new()
            .name("seglog-metrics".into())
            .spawn(move || {
                rt.block_on(async move {
                    if let Err(e) = accept_loop(listener, registry, &stop).await {
                        tracing::error!(error = %e, "the metrics endpoint stopped");
                    }
                });
            })?;
        Ok(MetricsServer { local_addr, thread })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits for the thread to end (after the stop flag was set).
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

async fn accept_loop(
    listener: TcpListener,
    registry: Arc<Registry>,
    stop: &AtomicBool,
) -> io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let open = Arc::new(AtomicUsize::new(0));
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::SeqCst) {
        let accepted = tokio::select! {
            _ = tick.tick() => continue,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
        };
        if open.load(Ordering::SeqCst) >= HTTP_CONNECTIONS_MAX {
            continue;
        }
        open.fetch_add(1, Ordering::SeqCst);
        let open = Arc::clone(&open);
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, Infallible>(answer(&req, &registry)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HTTP_HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

fn answer<B>(req: &Request<B>, registry: &Registry) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics\n");
    }
    match encode(registry) {
        Ok(text) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            if let Ok(v) = hyper::header::HeaderValue::from_str(CONTENT_TYPE) {
                r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
            }
            r
        }
        Err(_) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::encode_record;

    #[test]
    fn records_are_counted_by_their_prefixes_and_sizes_match_the_encoding() {
        let mut buf = Vec::new();
        let a = encode_record(&mut buf, 0, 0, Some(b"k"), b"abc", 0).unwrap();
        let b = encode_record(&mut buf, 1, 0, None, b"", 0).unwrap();
        assert_eq!(count_records(&buf), 2);
        assert_eq!(count_records(&buf[..buf.len() - 1]), 1);
        assert_eq!(count_records(&[]), 0);
        assert_eq!(stored_len(Some(b"k"), b"abc"), a as u64);
        assert_eq!(stored_len(None, b""), b as u64);
    }

    #[test]
    fn histogram_buckets_are_given_per_bucket_with_the_rest_in_inf() {
        let h = Hist::from_cumulative([(1.0, 2), (2.0, 2), (4.0, 5)].into_iter(), 9.0, 7);
        assert_eq!(h.buckets, [(1.0, 2), (2.0, 0), (4.0, 3), (f64::MAX, 2)]);
    }

    #[test]
    fn unknown_api_keys_share_one_slot() {
        let m = NetMetrics::default();
        m.request(ApiKey::Fetch as u16, Duration::from_micros(20));
        m.request(999, Duration::from_micros(20));
        m.request(77, Duration::from_micros(20));
        assert_eq!(m.apis[ApiKey::Fetch as usize].latency_us.count(), 1);
        assert_eq!(m.apis[API_SLOTS - 1].latency_us.count(), 2);
    }
}
