//! Produce latency while the broker compacts a large partition. Ignored by default;
//! run with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture cleanup::
//! ```
//!
//! A broker (in this process, reached over TCP, `--flush-every-records 1`) holds a
//! topic `big` with one partition of about 256 MiB of sealed segments
//! (1 KiB values over 50 000 keys, so compaction drops about four records in five),
//! and a topic `load`. Four connections each send produce requests of 10 records of
//! 256 bytes to `load`, one request in flight each, and every request's latency is
//! recorded: first for `SEGLOG_BENCH_SECS` seconds (default 5) with nothing else
//! running, then from the moment `big` is altered to `cleanup_policy=compact` until
//! the broker's background compaction task (checking every 50 ms) has compacted it. Prints records/s and
//! p50/p99/max latency of both runs and the compaction's own time. The size of `big`
//! is `SEGLOG_BENCH_COMPACT_MIB` (default 256). This measures; it asserts only that
//! each run worked and that the compaction really swapped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use seglog::engine::broker::{Broker, BrokerOptions, NewRecord};
use seglog::engine::net::client::Client;
use seglog::engine::net::server::{Server, ServerOptions};
use seglog::engine::storage::io::RealStorage;
use seglog::format::topic::TopicConfig;
use seglog::format::wire::{PartitionBatch, WireRecord};

const CONNECTIONS: usize = 4;
const BATCH: usize = 10;
const RECORD_BYTES: usize = 256;
const KEYS: u64 = 50_000;
const VALUE_BYTES: usize = 1024;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

struct Run {
    records_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    requests: usize,
}

/// Four connections producing batches of 10 until `stop` is set (or `limit` passes).
fn load(addr: &str, stop: &AtomicBool, limit: Duration) -> Run {
    let start = Instant::now();
    let latencies: Vec<Vec<Duration>> = thread::scope(|s| {
        let handles: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                s.spawn(|| {
                    let mut c = Client::connect(addr, Duration::from_secs(30)).unwrap();
                    let value = [b'x'; RECORD_BYTES];
                    let mut lat = Vec::new();
                    while !stop.load(Ordering::Acquire) && start.elapsed() < limit {
                        let records = vec![
                            WireRecord {
                                timestamp_ms: -1,
                                key: None,
                                value: &value,
                            };
                            BATCH
                        ];
                        let t = Instant::now();
                        let acks = c
                            .produce(
                                "load",
                                vec![PartitionBatch {
                                    partition: 0,
                                    records,
                                }],
                            )
                            .unwrap();
                        lat.push(t.elapsed());
                        assert!(acks.iter().all(|a| a.result.is_ok()), "{acks:?}");
                    }
                    lat
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut all: Vec<Duration> = latencies.into_iter().flatten().collect();
    all.sort();
    let pct = |p: f64| {
        let i = ((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1;
        all[i].as_secs_f64() * 1000.0
    };
    Run {
        records_per_sec: (all.len() * BATCH) as f64 / secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: all.last().unwrap().as_secs_f64() * 1000.0,
        requests: all.len(),
    }
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn produce_latency_while_compacting_a_large_partition() {
    let secs = env_u64("SEGLOG_BENCH_SECS", 5);
    let mib = env_u64("SEGLOG_BENCH_COMPACT_MIB", 256);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = BrokerOptions {
        retention_check_interval: Duration::from_secs(3600),
        compaction_check_interval: Duration::from_millis(50),
        ..BrokerOptions::default()
    };
    let broker = Broker::open(dir.path(), Arc::new(RealStorage), opts).unwrap();
    let mut big = TopicConfig::default();
    big.set("segment_bytes", &(32 << 20).to_string()).unwrap();
    broker.create_topic("big", 1, big).unwrap();
    broker
        .create_topic("load", 1, TopicConfig::default())
        .unwrap();

    // Fill `big`: batches of 1000 records, keys cycling over KEYS.
    let t = Instant::now();
    let value = vec![b'v'; VALUE_BYTES];
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|k| format!("key-{k:08}").into_bytes())
        .collect();
    let target = mib << 20;
    let mut i = 0u64;
    loop {
        let records: Vec<NewRecord<'_>> = (0..1000)
            .map(|j| NewRecord {
                key: Some(&keys[((i + j) % KEYS) as usize]),
                value: &value,
                timestamp_ms: -1,
            })
            .collect();
        broker.produce("big", 0, &records).unwrap();
        i += 1000;
        let p = broker.describe_topic("big").unwrap().partitions[0].clone();
        // Sealed bytes: everything but the active segment (at most one segment).
        if p.bytes >= target + (32 << 20) {
            break;
        }
    }
    let before = broker.describe_topic("big").unwrap().partitions[0].clone();
    println!(
        "filled big: {} records, {} segments, {:.0} MiB in {:.1}s",
        i,
        before.segments,
        before.bytes as f64 / f64::from(1 << 20),
        t.elapsed().as_secs_f64()
    );

    let server = Server::bind("127.0.0.1:0", broker.clone(), ServerOptions::default()).unwrap();
    let addr = server.local_addr().to_string();
    let stop_server = server.stop_handle();
    let serving = thread::spawn(move || server.run(&AtomicBool::new(false)));

    // Warm-up, then the quiet run.
    let never = AtomicBool::new(false);
    load(&addr, &never, Duration::from_secs(1));
    let quiet = load(&addr, &never, Duration::from_secs(secs));

    // The loaded run: `big` becomes a compacted topic, and the background task (as
    // `serve` runs it, at its own lowered priority) compacts it at its next round.
    let done = AtomicBool::new(false);
    let t = Instant::now();
    broker
        .alter_topic("big", &[("cleanup_policy".into(), "compact".into())])
        .unwrap();
    let busy = thread::scope(|s| {
        s.spawn(|| {
            while broker.describe_topic("big").unwrap().partitions[0]
                .cleanup
                .compactions
                == 0
            {
                thread::sleep(Duration::from_millis(5));
            }
            done.store(true, Ordering::Release);
        });
        load(&addr, &done, Duration::from_secs(3600))
    });
    let compact_secs = t.elapsed().as_secs_f64();
    let after = broker.describe_topic("big").unwrap().partitions[0].clone();
    assert_eq!(after.cleanup.compactions, 1, "{after:?}");

    println!(
        "compaction: {:.0} MiB in {} segments -> {:.0} MiB in {}, {} records dropped, done {:.2}s after the alter",
        before.bytes as f64 / f64::from(1 << 20),
        before.segments,
        after.bytes as f64 / f64::from(1 << 20),
        after.segments,
        after.cleanup.records_dropped,
        compact_secs
    );
    println!(
        "{:<22} | {:>10} {:>9} {:>8} {:>8} {:>8}",
        "run (batch 10, 4 conn)", "records/s", "requests", "p50_ms", "p99_ms", "max_ms"
    );
    for (name, r) in [("quiet", &quiet), ("while compacting", &busy)] {
        println!(
            "{name:<22} | {:>10.0} {:>9} {:>8.3} {:>8.3} {:>8.3}",
            r.records_per_sec, r.requests, r.p50_ms, r.p99_ms, r.max_ms
        );
    }
    println!(
        "p99 while compacting / quiet p99: {:.2}x",
        busy.p99_ms / quiet.p99_ms
    );
    stop_server.store(true, Ordering::Release);
    serving.join().unwrap().unwrap();
    broker.shutdown().unwrap();
}
