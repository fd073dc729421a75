//! Produce throughput with the metrics endpoint on and off. Ignored by default; run
//! with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture metrics::
//! ```
//!
//! One broker in this process (fsync before every acknowledgement) served by two
//! listeners: one counting requests and traffic for a metrics endpoint that a thread
//! scrapes every second during its runs, one keeping no metrics. 16 connections send
//! requests of 1 or 100 records of 256 bytes to one partition, for
//! `SEGLOG_BENCH_SECS` seconds per run (default 3); runs alternate (off, on, on, off, off, on),
//! three each, and the ratio of the mean records/s is printed. This measures; it
//! asserts only that every run worked and that the scrapes answered.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::load::{self, run_seconds, Load, CONNECTIONS};
use seglog::engine::broker::{Broker, BrokerOptions};
use seglog::engine::net::client::Client;
use seglog::engine::net::metrics::{registry, MetricsServer, NetMetrics};
use seglog::engine::net::server::{Server, ServerOptions};
use seglog::engine::storage::io::RealStorage;
use seglog::format::topic::TopicConfig;

const VALUE_BYTES: usize = 256;
const RUNS: usize = 3;

fn load(addr: &str, topic: &str, batch: usize, secs: u64) -> f64 {
    let addr = addr.to_string();
    let values = [vec![b'x'; VALUE_BYTES]];
    let shape = Load {
        topic,
        partitions: 1,
        batch,
        values: &values,
        secs,
    };
    load::produce(&shape, move || {
        Client::connect(&addr, Duration::from_secs(30)).unwrap()
    })
}

/// Scrapes `addr` once a second until `stop`; counts the answers that were 200.
fn scraper(addr: String, stop: Arc<AtomicBool>, ok: Arc<AtomicU64>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            if let Ok(mut c) = TcpStream::connect(&addr) {
                let _ = write!(
                    c,
                    "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                );
                let mut s = String::new();
                if c.read_to_string(&mut s).is_ok() && s.starts_with("HTTP/1.1 200") {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
            thread::sleep(Duration::from_secs(1));
        }
    })
}

struct Listener {
    addr: String,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<std::io::Result<()>>,
}

fn listen(broker: &Arc<Broker>, metrics: Option<Arc<NetMetrics>>) -> Listener {
    let opts = ServerOptions {
        log_errors: false,
        metrics,
        ..ServerOptions::default()
    };
    let server = Server::bind("127.0.0.1:0", Arc::clone(broker), opts).unwrap();
    let addr = server.local_addr().to_string();
    let stop = server.stop_handle();
    let thread = thread::spawn(move || server.run(&AtomicBool::new(false)));
    Listener { addr, stop, thread }
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn produce_with_and_without_metrics() {
    let secs = run_seconds();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = BrokerOptions {
        flush_every_records: 1,
        ..BrokerOptions::default()
    };
    let broker = Broker::open(dir.path(), Arc::new(RealStorage), opts).unwrap();
    let net = Arc::new(NetMetrics::default());
    let plain = listen(&broker, None);
    let counted = listen(&broker, Some(Arc::clone(&net)));
    let endpoint = MetricsServer::start(
        TcpListener::bind("127.0.0.1:0").unwrap(),
        registry(Arc::clone(&broker), net, None),
        Arc::clone(&counted.stop),
    )
    .unwrap();
    let scrapes_ok = Arc::new(AtomicU64::new(0));
    println!();
    println!(
        "{CONNECTIONS} connections, 1 partition, {VALUE_BYTES}-byte values, {secs} s per run, {RUNS} runs each, alternating"
    );
    println!(
        "{:>5} | {:>14} {:>14} | {:>7}",
        "batch", "off r/s", "on r/s", "on/off"
    );
    for batch in [1usize, 100] {
        let topic = format!("b{batch}");
        broker
            .create_topic(&topic, 1, TopicConfig::default())
            .unwrap();
        let mut off = Vec::new();
        let mut on = Vec::new();
        for run in 0..2 * RUNS {
            // Order off, on, on, off, off, on: neither side always runs first.
            if (run % 4 == 0) || (run % 4 == 3) {
                off.push(load(&plain.addr, &topic, batch, secs));
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            let s = scraper(
                endpoint.local_addr().to_string(),
                Arc::clone(&stop),
                Arc::clone(&scrapes_ok),
            );
            on.push(load(&counted.addr, &topic, batch, secs));
            stop.store(true, Ordering::SeqCst);
            s.join().unwrap();
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (a, b) = (mean(&off), mean(&on));
        println!(
            "{batch:>5} | {a:>14.0} {b:>14.0} | {:>6.1}%   (runs: {off:.0?} vs {on:.0?})",
            100.0 * b / a
        );
        assert!(a > 0.0 && b > 0.0);
    }
    assert!(scrapes_ok.load(Ordering::Relaxed) > 0, "no scrape answered");
    for l in [plain, counted] {
        l.stop.store(true, Ordering::SeqCst);
        let _ = l.thread.join();
    }
    endpoint.join();
    broker.shutdown().unwrap();
}
