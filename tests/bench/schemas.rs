//! Produce throughput with schema validation on and off. Ignored by default; run with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture schemas::
//! ```
//!
//! A broker in this process (fsync before every acknowledgement) on a loopback port;
//! 16 connections each send requests of 100 records of 256-byte JSON objects with 10
//! properties to a topic, for `SEGLOG_BENCH_SECS` seconds per run (default 3). The
//! same load runs on a topic without a schema and on one whose schema checks all 10
//! properties (types, an enum, bounds, required fields, a closed model), in pairs of
//! adjacent runs (`SEGLOG_BENCH_ROUNDS`, default 5) whose first run alternates. Each
//! pair's ratio is printed, then the median over the pairs, of records/s and of the
//! process's CPU time per record (steadier than records/s on a shared machine). Pairs,
//! not means over all runs: on this virtual machine writes slow down once the page
//! cache grows past a few GB (into memory the host has not backed yet; see
//! cluster.rs), and whichever configuration ran in the slower phase would look slower.
//! `SEGLOG_BENCH_PARTITIONS=N` runs topics of N partitions only (default: 1, then 4);
//! `SEGLOG_BENCH_FLUSH_EVERY_RECORDS=N` flushes every N records instead of before every
//! acknowledgement, to compare the two without the disk's fsyncs.
//! This measures; it asserts only that every run worked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use seglog::engine::broker::{Broker, BrokerOptions};
use seglog::engine::net::client::Client;
use seglog::engine::net::server::{Server, ServerOptions};
use seglog::engine::schemas::in_place::{InPlace, Parsed};
use seglog::engine::storage::io::RealStorage;
use seglog::format::topic::TopicConfig;
use seglog::format::wire::{PartitionBatch, WireRecord};
use serde_json::json;

const VALUE_BYTES: usize = 256;
const BATCH: usize = 100;
const CONNECTIONS: usize = 16;

fn run_seconds() -> u64 {
    std::env::var("SEGLOG_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "name": {"type": "string", "maxLength": 64},
            "email": {"type": "string"},
            "age": {"type": "integer", "minimum": 0, "maximum": 200},
            "active": {"type": "boolean"},
            "score": {"type": "number"},
            "kind": {"enum": ["basic", "gold", "platinum"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "city": {"type": "string"},
            "note": {"type": "string"}
        },
        "required": ["id", "name", "email", "kind", "active"],
        "additionalProperties": false
    })
}

/// `n` distinct valid values of exactly [`VALUE_BYTES`] bytes.
fn values(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let kind = ["basic", "gold", "platinum"][i % 3];
            let mut v = json!({
                "id": i, "name": format!("user {i}"), "email": format!("u{i}@example.com"),
                "age": 20 + i % 50, "active": i % 2 == 0, "score": i as f64 * 0.5,
                "kind": kind, "tags": ["a", "bb", "ccc"],
                "city": "Lisbon", "note": ""
            });
            let len = serde_json::to_vec(&v).unwrap().len();
            v["note"] = json!("n".repeat(VALUE_BYTES - len));
            let bytes = serde_json::to_vec(&v).unwrap();
            assert_eq!(bytes.len(), VALUE_BYTES);
            bytes
        })
        .collect()
}

/// CPU seconds (user and system) this process has used, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command name, which is in parentheses: utime and stime are
    // the 14th and 15th fields of the line, in clock ticks.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    let per_second = rustix::param::clock_ticks_per_second() as f64;
    ticks / per_second
}

/// One run: records per second, and CPU microseconds per record of the whole process
/// (broker and clients; the clients' share is the same with and without a schema).
/// On a machine shared with other work the second is the steadier figure.
fn load(
    broker: &Broker,
    addr: &str,
    topic: &str,
    partitions: u32,
    values: &[Vec<u8>],
    secs: u64,
) -> (f64, f64) {
    let fsyncs = broker.stats().fsyncs;
    let barrier = Arc::new(Barrier::new(CONNECTIONS + 1));
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|w| {
            let barrier = Arc::clone(&barrier);
            let (addr, topic, values) = (addr.to_string(), topic.to_string(), values.to_vec());
            thread::spawn(move || {
                let mut c = Client::connect(&addr, Duration::from_secs(30)).unwrap();
                barrier.wait();
                let deadline = Instant::now() + Duration::from_secs(secs);
                let mut sent = 0u64;
                let mut turn = w;
                while Instant::now() < deadline {
                    let records = (0..BATCH)
                        .map(|i| WireRecord {
                            timestamp_ms: -1,
                            key: None,
                            value: &values[(turn + i) % values.len()],
                        })
                        .collect();
                    let batch = PartitionBatch {
                        partition: (turn % partitions as usize) as u32,
                        records,
                    };
                    turn += 1;
                    let acks = c.produce(&topic, vec![batch]).unwrap();
                    assert!(acks.iter().all(|a| a.result.is_ok()), "{acks:?}");
                    sent += BATCH as u64;
                }
                sent
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let cpu = cpu_seconds();
    let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let cpu_us_per_record = (cpu_seconds() - cpu) * 1e6 / total as f64;
    let fsyncs = broker.stats().fsyncs - fsyncs;
    println!(
        "  {topic}: {total} records, {fsyncs} fsyncs, {:.0} records per fsync",
        total as f64 / fsyncs.max(1) as f64
    );
    (
        total as f64 / start.elapsed().as_secs_f64(),
        cpu_us_per_record,
    )
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn produce_with_and_without_a_schema() {
    let secs = run_seconds();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // `SEGLOG_BENCH_FLUSH_EVERY_RECORDS=N` (default 1, an fsync before every
    // acknowledgement) takes the disk out of the comparison with a large N.
    let flush_every_records = std::env::var("SEGLOG_BENCH_FLUSH_EVERY_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let opts = BrokerOptions {
        flush_every_records,
        ..BrokerOptions::default()
    };
    let broker = Broker::open(dir.path(), Arc::new(RealStorage), opts).unwrap();
    let server_opts = ServerOptions {
        log_errors: false,
        ..ServerOptions::default()
    };
    let server = Server::bind("127.0.0.1:0", Arc::clone(&broker), server_opts).unwrap();
    let addr = server.local_addr().to_string();
    let stop = server.stop_handle();
    let thread = thread::spawn(move || server.run(&AtomicBool::new(false)));
    let values = values(64);
    let rounds: usize = std::env::var("SEGLOG_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!();
    println!(
        "{CONNECTIONS} connections, batch {BATCH}, {VALUE_BYTES}-byte JSON values, 10-property schema, {secs} s per run, {rounds} pairs"
    );
    println!(
        "{:>5} | {:>14} {:>14} | {:>7}",
        "parts", "no schema r/s", "schema r/s", "ratio"
    );
    // `SEGLOG_BENCH_PARTITIONS=4` runs one of the two topic shapes only.
    let shapes: Vec<u32> = match std::env::var("SEGLOG_BENCH_PARTITIONS") {
        Ok(p) => vec![p
            .parse()
            .expect("SEGLOG_BENCH_PARTITIONS: a partition count")],
        Err(_) => vec![1, 4],
    };
    for partitions in shapes {
        let (plain, checked) = (
            format!("plain-{partitions}"),
            format!("checked-{partitions}"),
        );
        for t in [&plain, &checked] {
            broker
                .create_topic(t, partitions, TopicConfig::default())
                .unwrap();
        }
        broker.register_schema(&checked, &schema(), None).unwrap();
        // Pairs of adjacent runs, the first of each pair alternating, so that both
        // configurations see the same state of the machine: writes that slow down
        // once the page cache has grown would otherwise favour whichever ran first.
        let mut pairs = Vec::new();
        for round in 0..rounds {
            let run = |topic: &str| load(&broker, &addr, topic, partitions, &values, secs);
            let (without, with) = if round % 2 == 0 {
                let a = run(&plain);
                (a, run(&checked))
            } else {
                let b = run(&checked);
                (run(&plain), b)
            };
            println!(
                "{partitions:>5} | {:>14.0} {:>14.0} | {:>6.1}%   CPU us/record {:.2} vs {:.2}: {:.1}%",
                without.0,
                with.0,
                100.0 * with.0 / without.0,
                without.1,
                with.1,
                100.0 * without.1 / with.1,
            );
            pairs.push((without, with));
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let rate = median(pairs.iter().map(|(a, b)| b.0 / a.0).collect());
        let cpu = median(pairs.iter().map(|(a, b)| a.1 / b.1).collect());
        let (a, b) = (
            median(pairs.iter().map(|p| p.0 .0).collect()),
            median(pairs.iter().map(|p| p.1 .0).collect()),
        );
        println!(
            "{partitions:>5} partition(s), median of {rounds} pairs: records/s with a schema / without {:.1}%; CPU per record without / with {:.1}%",
            100.0 * rate,
            100.0 * cpu
        );
        assert!(a > 0.0 && b > 0.0);
    }
    stop.store(true, Ordering::SeqCst);
    let _ = thread.join();
    broker.shutdown().unwrap();
}

/// Nanoseconds per call of `f` over `values`, best of 5 rounds of `rounds` passes.
fn per_value_ns(values: &[Vec<u8>], rounds: usize, mut f: impl FnMut(&[u8])) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..rounds {
            for v in values {
                f(v);
            }
        }
        let ns = start.elapsed().as_nanos() as f64 / (rounds * values.len()) as f64;
        best = best.min(ns);
    }
    best
}

/// Where the time of checking one value goes: the parse, the validation, and the whole
/// check the broker runs. Run with
/// `cargo test --release --test bench -- --ignored --nocapture schemas::per_record`.
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn per_record_parse_and_validate() {
    let values = values(64);
    let schema = schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let compiled = seglog::engine::schemas::compile(&schema, 1).unwrap();
    let rounds = std::env::var("SEGLOG_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let parse_ignored = per_value_ns(&values, rounds, |v| {
        std::hint::black_box(serde_json::from_slice::<serde::de::IgnoredAny>(v).unwrap());
    });
    let parse_value = per_value_ns(&values, rounds, |v| {
        std::hint::black_box(serde_json::from_slice::<serde_json::Value>(v).unwrap());
    });
    let parsed: Vec<serde_json::Value> = values
        .iter()
        .map(|v| serde_json::from_slice(v).unwrap())
        .collect();
    let mut i = 0;
    let validate = per_value_ns(&values, rounds, |_| {
        assert!(validator.is_valid(&parsed[i % parsed.len()]));
        i += 1;
    });
    // Each value is read in place into one reused arena, as the broker does.
    let in_place = jsonschema::options_for::<InPlace>().build(&schema).unwrap();
    let all: &[Vec<u8>] = &values;
    let mut parsed = Parsed::default();
    let mut i = 0;
    let parse_in_place = per_value_ns(all, rounds, |_| {
        parsed.parse(&all[i % all.len()]).unwrap();
        i += 1;
    });
    let validate_in_place = per_value_ns(all, rounds, |_| {
        parsed.parse(&all[i % all.len()]).unwrap();
        assert!(in_place.is_valid(parsed.root().unwrap()));
        i += 1;
    }) - parse_in_place;
    let check = per_value_ns(all, rounds, |_| {
        assert!(compiled
            .check_value_in(&mut parsed, &all[i % all.len()])
            .is_ok());
        i += 1;
    });
    println!();
    println!("{VALUE_BYTES}-byte JSON values, 10-property schema, ns per value (best of 5):");
    println!("  parse, nothing kept (serde IgnoredAny): {parse_ignored:>7.0}");
    println!("  parse into serde_json::Value:           {parse_value:>7.0}");
    println!("  validate a parsed Value (is_valid):     {validate:>7.0}");
    println!("  parse in place (reused arena):          {parse_in_place:>7.0}");
    println!("  validate in place (is_valid):           {validate_in_place:>7.0}");
    println!("  the broker's check of one value:        {check:>7.0}");
}
