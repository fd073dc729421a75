//! The closed-loop produce load the side-by-side benchmarks share: `CONNECTIONS`
//! connections, each sending one request of `batch` records after the other for a
//! fixed time, every request acknowledged before the next.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use seglog::engine::net::client::Client;
use seglog::format::wire::{PartitionBatch, WireRecord};

/// Connections of every run.
pub const CONNECTIONS: usize = 16;

/// Seconds per run: `SEGLOG_BENCH_SECS`, default 3.
pub fn run_seconds() -> u64 {
    std::env::var("SEGLOG_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

/// One run's shape.
pub struct Load<'a> {
    pub topic: &'a str,
    /// Requests go to partitions 0..partitions in turn.
    pub partitions: u32,
    pub batch: usize,
    /// Record values, used in turn (connection `w` starts at value `w`).
    pub values: &'a [Vec<u8>],
    pub secs: u64,
}

/// Records per second of one run; `connect` opens each connection.
pub fn produce<F>(load: &Load, connect: F) -> f64
where
    F: Fn() -> Client + Send + Sync + 'static,
{
    assert!(!load.values.is_empty() && load.partitions > 0);
    let connect = Arc::new(connect);
    let barrier = Arc::new(Barrier::new(CONNECTIONS + 1));
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|w| {
            let barrier = Arc::clone(&barrier);
            let connect = Arc::clone(&connect);
            let topic = load.topic.to_string();
            let values = load.values.to_vec();
            let (partitions, batch, secs) = (load.partitions as usize, load.batch, load.secs);
            thread::spawn(move || {
                let mut c = connect();
                barrier.wait();
                let deadline = Instant::now() + Duration::from_secs(secs);
                let mut sent = 0u64;
                let mut turn = w;
                while Instant::now() < deadline {
                    let records = (0..batch)
                        .map(|i| WireRecord {
                            timestamp_ms: -1,
                            key: None,
                            value: &values[(turn + i) % values.len()],
                        })
                        .collect();
                    let b = PartitionBatch {
                        partition: (turn % partitions) as u32,
                        records,
                    };
                    turn += 1;
                    let acks = c.produce(&topic, vec![b]).unwrap();
                    assert!(acks.iter().all(|a| a.result.is_ok()), "{acks:?}");
                    sent += batch as u64;
                }
                sent
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    total as f64 / start.elapsed().as_secs_f64()
}
