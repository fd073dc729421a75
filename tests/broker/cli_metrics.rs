//! `serve --metrics-listen` against a real broker: known produce and fetch traffic,
//! then a scrape over HTTP parsed with a Prometheus text-format parser; counters
//! moved by exactly the traffic sent, gauges show the partition; another path is
//! 404; `promtool check metrics` accepts the scrape when promtool is installed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use prometheus_parse::{Sample, Scrape, Value};
use seglog::engine::net::client::Client;
use seglog::format::record::{record_len, LEN_FIELD};
use seglog::format::wire::{PartitionBatch, WireRecord};

use crate::util::serve::{Serve, PATIENCE};

/// The address from the `seglog: metrics listening on ADDR` line.
fn metrics_addr(s: &Serve) -> String {
    metrics_addr_in(&s.stderr())
}

/// The address from the `seglog: metrics listening on ADDR` line of `err`, a
/// broker's stderr.
pub(crate) fn metrics_addr_in(err: &str) -> String {
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("seglog: metrics listening on "))
        .unwrap_or_else(|| panic!("no metrics line in:\n{err}"));
    line.trim().to_string()
}

/// One HTTP/1.1 GET: (status, body).
pub(crate) fn get(addr: &str, path: &str) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    (status, body.to_string())
}

pub(crate) fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// The value of the one sample named `name` whose labels include `labels`.
pub(crate) fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    match &found[0].value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{name}: not a single value: {other:?}"),
    }
}

/// Count and sum of the histogram `name` (its `_count` and `_sum`, however the parser
/// groups them).
fn histogram(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> (f64, f64) {
    let mut count = None;
    let mut sum = None;
    for s in &scrape.samples {
        if s.metric != name || !labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)) {
            continue;
        }
        if let Value::Histogram(_) = &s.value {
            count = Some(s.value.clone());
        }
    }
    if let Some(Value::Histogram(buckets)) = count {
        let inf = buckets
            .iter()
            .find(|b| b.less_than.is_infinite())
            .map(|b| b.count);
        for s in &scrape.samples {
            if s.metric == format!("{name}_sum")
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            {
                if let Value::Untyped(v) | Value::Counter(v) | Value::Gauge(v) = s.value {
                    sum = Some(v);
                }
            }
        }
        return (
            inf.unwrap(),
            sum.unwrap_or_else(|| value(scrape, &format!("{name}_sum"), labels)),
        );
    }
    (
        value(scrape, &format!("{name}_count"), labels),
        value(scrape, &format!("{name}_sum"), labels),
    )
}

const PRODUCES: usize = 7;
const PER_PRODUCE: usize = 3;

#[test]
fn a_scrape_counts_exactly_the_traffic_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Serve::start_with(tmp.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let maddr = metrics_addr(&s);

    let mut c = Client::connect(&s.addr, Duration::from_secs(30)).unwrap();
    c.create_topic("m", 2, &[]).unwrap();
    let mut bytes = 0u64;
    let values: Vec<Vec<u8>> = (0..PRODUCES * PER_PRODUCE)
        .map(|i| vec![b'v'; 10 + i * 7])
        .collect();
    for chunk in values.chunks(PER_PRODUCE) {
        let records: Vec<WireRecord<'_>> = chunk
            .iter()
            .enumerate()
            .map(|(i, v)| WireRecord {
                timestamp_ms: -1,
                key: (i % 2 == 0).then_some(b"key".as_slice()),
                value: v,
            })
            .collect();
        for r in &records {
            bytes += u64::from(record_len(r.key.map(<[u8]>::len), r.value.len()).unwrap())
                + LEN_FIELD as u64;
        }
        let acks = c
            .produce(
                "m",
                vec![PartitionBatch {
                    partition: 0,
                    records,
                }],
            )
            .unwrap();
        assert!(acks[0].result.is_ok(), "{acks:?}");
    }
    let total = (PRODUCES * PER_PRODUCE) as u64;
    let f = c.fetch("m", 0, 0, 1 << 20, Duration::ZERO).unwrap();
    assert_eq!(f.records.len() as u64, total);
    assert_eq!(f.bytes as u64, bytes);
    // A fetch of the empty partition counts a request and no records.
    let empty = c.fetch("m", 1, 0, 1 << 20, Duration::ZERO).unwrap();
    assert!(empty.records.is_empty());

    let (status, text) = get(&maddr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let m = parse(&text);
    let t = [("topic", "m")];
    assert_eq!(value(&m, "seglog_produced_records_total", &t), total as f64);
    assert_eq!(value(&m, "seglog_produced_bytes_total", &t), bytes as f64);
    assert_eq!(value(&m, "seglog_fetched_records_total", &t), total as f64);
    assert_eq!(value(&m, "seglog_fetched_bytes_total", &t), bytes as f64);
    assert_eq!(
        value(&m, "seglog_requests_total", &[("api", "produce")]),
        PRODUCES as f64
    );
    assert_eq!(value(&m, "seglog_requests_total", &[("api", "fetch")]), 2.0);
    assert_eq!(
        value(&m, "seglog_requests_total", &[("api", "create_topic")]),
        1.0
    );
    assert_eq!(
        value(&m, "seglog_requests_total", &[("api", "handshake")]),
        1.0
    );
    let (n, _) = histogram(&m, "seglog_request_duration_seconds", &[("api", "produce")]);
    assert_eq!(n, PRODUCES as f64);
    // Every record was made durable by exactly one group commit.
    let (commits, covered) = histogram(&m, "seglog_group_commit_records", &[]);
    assert!((1.0..=PRODUCES as f64).contains(&commits), "{commits}");
    assert_eq!(covered, total as f64);
    let (fsyncs, _) = histogram(&m, "seglog_fsync_duration_seconds", &[]);
    assert!(fsyncs >= commits, "{fsyncs} < {commits}");

    let p0 = [("topic", "m"), ("partition", "0")];
    let p1 = [("topic", "m"), ("partition", "1")];
    assert_eq!(value(&m, "seglog_partition_end_offset", &p0), total as f64);
    assert_eq!(value(&m, "seglog_partition_start_offset", &p0), 0.0);
    assert_eq!(value(&m, "seglog_partition_end_offset", &p1), 0.0);
    assert_eq!(value(&m, "seglog_partition_segments", &p0), 1.0);
    assert!(value(&m, "seglog_partition_bytes", &p0) >= bytes as f64);
    assert_eq!(value(&m, "seglog_retention_runs_total", &p0), 0.0);
    assert_eq!(value(&m, "seglog_compaction_errors_total", &p0), 0.0);
    assert_eq!(value(&m, "seglog_failed_partitions", &[]), 0.0);
    assert_eq!(value(&m, "seglog_open_connections", &[]), 1.0);
    // No label but api, topic and partition.
    for sample in &m.samples {
        for (k, _) in sample.labels.iter() {
            assert!(
                ["api", "topic", "partition", "le"].contains(&k.as_str()),
                "{sample:?}"
            );
        }
    }

    // A broker without --peers has no replication figures.
    let replication = [
        "seglog_replica_leader",
        "seglog_raft_term",
        "seglog_replicas",
        "seglog_in_sync_replicas",
        "seglog_under_replicated_partitions",
        "seglog_closed_replicas",
    ];
    assert!(
        !m.samples
            .iter()
            .any(|s| replication.contains(&s.metric.as_str())),
        "{text}"
    );

    // The scrape itself is not native traffic: a second one shows the same counts.
    let (_, again) = get(&maddr, "/metrics");
    let m2 = parse(&again);
    assert_eq!(
        value(&m2, "seglog_produced_records_total", &t),
        total as f64
    );

    let (status, _) = get(&maddr, "/other");
    assert_eq!(status, 404);
    let (status, _) = get(&maddr, "/");
    assert_eq!(status, 404);

    promtool_check(&text);
    drop(c);
    s.stop();
}

/// `promtool check metrics` on the scrape, when promtool is on PATH.
pub(crate) fn promtool_check(text: &str) {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        println!("promtool not on PATH: skipping `promtool check metrics`");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        return;
    }
    // promtool reads the classic text format, where a counter's HELP and TYPE name
    // the sample (`x_total`); OpenMetrics, which prometheus-client writes and
    // Prometheus scrapes natively, names the family (`x`). Exit 3 (lint problems, not
    // a parse error) with only that note for counters declared here is accepted;
    // anything else fails.
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let counter_note_only = report.lines().all(|l| {
        l.strip_suffix(" no help text")
            .and_then(|n| n.strip_suffix("_total"))
            .is_some_and(|family| {
                text.contains(&format!("# TYPE {family} counter\n"))
                    && text.contains(&format!("# HELP {family} "))
            })
    });
    assert!(
        out.status.code() == Some(3) && counter_note_only,
        "promtool check metrics failed ({:?}):\n{report}\n--- scrape:\n{text}",
        out.status
    );
    println!("promtool: only the OpenMetrics counter-naming note:\n{report}");
}

#[test]
fn metrics_are_off_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Serve::start(tmp.path());
    assert!(!s.stderr().contains("metrics listening"), "{}", s.stderr());
    s.stop();
}

/// `seglog_group_lag` is a partition's end offset minus the group's committed
/// offset, per group, topic and partition.
#[test]
fn group_lag_per_partition() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Serve::start_with(tmp.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let maddr = metrics_addr(&s);
    let mut c = Client::connect(&s.addr, Duration::from_secs(30)).unwrap();
    c.create_topic("lag", 2, &[]).unwrap();
    for (partition, n) in [(0u32, 10usize), (1, 3)] {
        let records: Vec<WireRecord<'_>> = (0..n)
            .map(|_| WireRecord {
                timestamp_ms: -1,
                key: None,
                value: b"v",
            })
            .collect();
        let acks = c
            .produce("lag", vec![PartitionBatch { partition, records }])
            .unwrap();
        assert!(acks[0].result.is_ok(), "{acks:?}");
    }
    let (_, text) = get(&maddr, "/metrics");
    assert!(!text.contains("seglog_group_lag"), "no group yet: {text}");
    s.ok(&[
        "groups",
        "reset-offsets",
        "g",
        "--topic",
        "lag",
        "--to",
        "4",
    ]);
    let (status, text) = get(&maddr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let m = parse(&text);
    fn at(p: &str) -> [(&str, &str); 3] {
        [("group", "g"), ("topic", "lag"), ("partition", p)]
    }
    assert_eq!(value(&m, "seglog_group_lag", &at("0")), 6.0);
    // Reset to 4 on a partition of 3 records commits its end (clamped): no lag.
    assert_eq!(value(&m, "seglog_group_lag", &at("1")), 0.0);
    promtool_check(&text);
    drop(c);
    s.stop();
}
