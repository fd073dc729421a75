//! Produce throughput with authentication on and off. Ignored by default; run with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture auth::
//! ```
//!
//! A broker in this process (fsync before every acknowledgement) on a loopback port;
//! 16 connections each send requests of 1 or 100 records of 256 bytes to one topic,
//! for `SEGLOG_BENCH_SECS` seconds per run (default 3). With auth on, each connection
//! logs in with a producer key whose topic pattern is a glob, so every request pays
//! the permission check; with auth off nothing is checked. Runs alternate, twice
//! each, and the ratio of the mean records/s is printed. This measures; it asserts
//! only that every run worked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::load::{self, run_seconds, Load, CONNECTIONS};
use seglog::engine::broker::{Broker, BrokerOptions};
use seglog::engine::keys::AuthMode;
use seglog::engine::net::auth::{self, Login};
use seglog::engine::net::client::Client;
use seglog::engine::net::server::{Server, ServerOptions};
use seglog::engine::storage::io::RealStorage;
use seglog::format::topic::TopicConfig;
use seglog::format::wire::{PartitionBatch, Request, WireRecord};

const VALUE_BYTES: usize = 256;

/// Records per second of one run.
fn load(addr: &str, topic: &str, batch: usize, token: Option<&str>, secs: u64) -> f64 {
    let (addr, token) = (addr.to_string(), token.map(str::to_string));
    let values = [vec![b'v'; VALUE_BYTES]];
    let shape = Load {
        topic,
        partitions: 1,
        batch,
        values: &values,
        secs,
    };
    load::produce(&shape, move || {
        Client::connect_with_token(&addr, Duration::from_secs(30), token.as_deref()).unwrap()
    })
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn produce_with_and_without_auth() {
    let secs = run_seconds();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = BrokerOptions {
        flush_every_records: 1,
        ..BrokerOptions::default()
    };
    let broker = Broker::open(dir.path(), Arc::new(RealStorage), opts).unwrap();
    broker
        .create_topic("bench.auth", 1, TopicConfig::default())
        .unwrap();
    let key = broker
        .keys()
        .create(
            "bench",
            "producer",
            &["other".into(), "bench.*".into()],
            &[],
        )
        .unwrap();
    let server_opts = ServerOptions {
        log_errors: false,
        ..ServerOptions::default()
    };
    let server = Server::bind("127.0.0.1:0", Arc::clone(&broker), server_opts).unwrap();
    let addr = server.local_addr().to_string();
    let stop = server.stop_handle();
    let thread = thread::spawn(move || server.run(&AtomicBool::new(false)));
    println!();
    println!(
        "{CONNECTIONS} connections, {VALUE_BYTES}-byte values, fsync per ack, {secs} s per run"
    );
    println!(
        "{:>5} | {:>14} {:>14} | {:>7}",
        "batch", "auth off r/s", "auth on r/s", "ratio"
    );
    for batch in [1usize, 100] {
        let mut off = Vec::new();
        let mut on = Vec::new();
        for _ in 0..2 {
            broker.keys().set_mode(AuthMode::Off);
            off.push(load(&addr, "bench.auth", batch, None, secs));
            broker.keys().set_mode(AuthMode::Required);
            on.push(load(&addr, "bench.auth", batch, Some(&key.token), secs));
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (a, b) = (mean(&off), mean(&on));
        println!(
            "{batch:>5} | {a:>14.0} {b:>14.0} | {:>6.1}%   (runs: {off:.0?} vs {on:.0?})",
            100.0 * b / a
        );
        assert!(a > 0.0 && b > 0.0);
    }
    // The check alone, in this process: what auth adds to each request.
    let mut login = Login::default();
    let peer = "127.0.0.1:1".parse().unwrap();
    auth::login(broker.keys(), Some(&key.token), peer, None, &mut login).unwrap();
    let value = vec![b'v'; VALUE_BYTES];
    let req = Request::Produce {
        topic: "bench.auth",
        partitions: vec![PartitionBatch {
            partition: 0,
            records: vec![WireRecord {
                timestamp_ms: -1,
                key: None,
                value: &value,
            }],
        }],
    };
    let n = 1_000_000u32;
    let start = Instant::now();
    for _ in 0..n {
        auth::authorize(broker.keys(), &mut login, std::hint::black_box(&req)).unwrap();
    }
    let per_check = start.elapsed() / n;
    let start = Instant::now();
    for _ in 0..1000 {
        broker.keys().authenticate(&key.token, peer.ip()).unwrap();
    }
    let per_login = start.elapsed() / 1000;
    println!("permission check {per_check:?} per request; login {per_login:?}");
    stop.store(true, Ordering::SeqCst);
    let _ = thread.join();
    broker.shutdown().unwrap();
}
