//! `seglog bench produce|consume`: a load generator in the spirit of
//! kafka-producer-perf-test. Many connections from one process, a thread each; with
//! `--embedded DIR` a broker and its server run in this process on a loopback port
//! and the load still goes over TCP. Reports records/s, MB/s (10^6 bytes of record
//! values), requests/s, fsyncs and request latency p50/p99/max.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cmd::connect::{client_error, parse_duration};
use crate::cmd::{exit, ExitError, Global};
use crate::engine::broker::{Broker, BrokerOptions};
use crate::engine::net::client::{Client, DEFAULT_BROKER};
use crate::engine::net::server::{Server, ServerOptions};
use crate::engine::storage::io::RealStorage;
use crate::format::encoded_len;
use crate::format::record::MAX_RECORD_LEN;
use crate::format::wire::{
    ErrorCode, PartitionBatch, WireRecord, FETCH_BYTES_MAX, RECORDS_PER_PARTITION_MAX,
};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Append records (each request acknowledged after the broker's flush policy).
    Produce,
    /// Fetch records from the start of the topic (produced first if missing).
    Consume,
}

/// Arguments of `seglog bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(value_enum)]
    pub mode: Mode,
    /// Broker address (default $SEGLOG_BROKER, else 127.0.0.1:9494).
    #[arg(long, conflicts_with = "embedded")]
    pub broker: Option<String>,
    /// Start a broker in this process on DIR, served on a loopback port.
    #[arg(long, value_name = "DIR")]
    pub embedded: Option<PathBuf>,
    /// Records to send or read (with --duration: at most this many).
    #[arg(long)]
    pub records: Option<u64>,
    /// Produce only: stop sending after this long (500ms, 2s, 1m).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_RECORD_LEN / 2)))]
    pub record_size: u32,
    /// Records per produce request, or per fetch.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(RECORDS_PER_PARTITION_MAX)))]
    pub batch: u32,
    /// Connections, a thread each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
    /// Partitions of the bench topic (created if missing).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
    /// Embedded broker only: fsync once this many records wait (1: before every ack).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub flush_every_records: u64,
    /// Topic to use.
    #[arg(long, default_value = "bench")]
    pub topic: String,
    /// How long to wait to connect and for each response.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The measurements of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub records: u64,
    pub requests: u64,
    pub value_bytes: u64,
    pub elapsed: Duration,
    pub fsyncs: u64,
    /// Request latencies, sorted.
    pub latencies: Vec<Duration>,
}

impl Report {
    fn per_sec(&self, n: f64) -> f64 {
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

/// An embedded broker and its server thread.
struct Embedded {
    broker: Arc<Broker>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<io::Result<()>>>,
}

impl Embedded {
    fn start(
        dir: &std::path::Path,
        flush_every_records: u64,
    ) -> anyhow::Result<(Embedded, String)> {
        let opts = BrokerOptions {
            flush_every_records,
            ..BrokerOptions::default()
        };
        let broker = Broker::open(dir, Arc::new(RealStorage), opts).map_err(|e| match e {
            crate::engine::error::EngineError::Locked { .. } => {
                ExitError::new(exit::LOCKED, e.to_string())
            }
            other => ExitError::new(exit::IO, format!("cannot open {}: {other}", dir.display())),
        })?;
        let server_opts = ServerOptions {
            log_errors: false,
            ..ServerOptions::default()
        };
        let server =
            Server::bind("127.0.0.1:0", Arc::clone(&broker), server_opts).map_err(|e| {
                ExitError::new(exit::IO, format!("cannot listen on a loopback port: {e}"))
            })?;
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

    fn finish(mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.broker
            .shutdown()
            .map_err(|e| ExitError::new(exit::IO, format!("shutting the broker down: {e}")))?;
        Ok(())
    }
}

/// Shared counters while the workers run.
struct Progress {
    records: AtomicU64,
}

/// A progress bar on an interactive stderr; nothing otherwise.
fn progress_bar(total: Option<u64>, quiet: bool) -> Option<indicatif::ProgressBar> {
    if quiet || !io::stderr().is_terminal() {
        return None;
    }
    let bar = match total {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    Some(bar)
}

pub fn run(args: Args, global: Global) -> anyhow::Result<u8> {
    if args.mode == Mode::Consume && args.duration.is_some() {
        return Err(ExitError::usage("--duration applies to bench produce only"));
    }
    if args.embedded.is_none() && args.flush_every_records != 1 {
        return Err(ExitError::usage(
            "--flush-every-records applies to --embedded only (set it on seglog serve)",
        ));
    }
    let records = match (args.records, args.duration) {
        (Some(n), _) => n,
        (None, Some(_)) => u64::MAX,
        (None, None) => 100_000,
    };
    let (embedded, addr) = match &args.embedded {
        Some(dir) => {
            let (e, addr) = Embedded::start(dir, args.flush_every_records)?;
            (Some(e), addr)
        }
        None => {
            let addr = args
                .broker
                .clone()
                .or_else(|| std::env::var("SEGLOG_BROKER").ok())
                .unwrap_or(DEFAULT_BROKER.into());
            (None, addr)
        }
    };
    let result = bench(
        &args,
        &addr,
        records,
        embedded.as_ref().map(|e| &e.broker),
        global,
    );
    if let Some(e) = embedded {
        e.finish()?;
    }
    let report = result?;
    print_report(&args, &addr, &report)?;
    Ok(exit::OK)
}

fn fsync_count(
    addr: &str,
    timeout: Duration,
    embedded: Option<&Arc<Broker>>,
) -> anyhow::Result<u64> {
    match embedded {
        Some(b) => Ok(b.stats().fsyncs),
        None => Ok(Client::connect(addr, timeout)
            .and_then(|mut c| c.stats())
            .map_err(client_error)?
            .fsyncs),
    }
}

/// Creates the topic, or checks the partition count of an existing one.
fn ensure_topic(client: &mut Client, topic: &str, partitions: u32) -> anyhow::Result<()> {
    match client.create_topic(topic, partitions, &[]) {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some(ErrorCode::TOPIC_EXISTS) => {
            let have = client.list_offsets(topic).map_err(client_error)?.len() as u32;
            if have != partitions {
                return Err(ExitError::usage(format!(
                    "topic {topic} exists with {have} partitions, not {partitions}; use --partitions {have} or another --topic"
                )));
            }
            Ok(())
        }
        Err(e) => Err(client_error(e)),
    }
}

fn bench(
    args: &Args,
    addr: &str,
    records: u64,
    embedded: Option<&Arc<Broker>>,
    global: Global,
) -> anyhow::Result<Report> {
    let mut admin = Client::connect(addr, args.timeout).map_err(client_error)?;
    ensure_topic(&mut admin, &args.topic, args.partitions)?;
    match args.mode {
        Mode::Produce => {
            let fsyncs_before = fsync_count(addr, args.timeout, embedded)?;
            let mut report = produce(args, addr, records, global)?;
            report.fsyncs =
                fsync_count(addr, args.timeout, embedded)?.saturating_sub(fsyncs_before);
            Ok(report)
        }
        Mode::Consume => {
            seed(args, &mut admin, records)?;
            let fsyncs_before = fsync_count(addr, args.timeout, embedded)?;
            let mut report = consume(args, addr, &mut admin, records, global)?;
            report.fsyncs =
                fsync_count(addr, args.timeout, embedded)?.saturating_sub(fsyncs_before);
            Ok(report)
        }
    }
}

/// Runs `work(worker index)` on one thread per connection, all starting together;
/// returns each worker's result and the time from start to the last finish.
fn run_workers<T: Send>(
    connections: u32,
    total: Option<u64>,
    quiet: bool,
    progress: &Progress,
    work: impl Fn(u32, &Barrier) -> anyhow::Result<T> + Sync,
) -> anyhow::Result<(Vec<T>, Duration)> {
    let barrier = Barrier::new(connections as usize + 1);
    let bar = progress_bar(total, quiet);
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        let handles: Vec<_> = (0..connections)
            .map(|w| {
                let (work, barrier) = (&work, &barrier);
                s.spawn(move || work(w, barrier))
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let (ticker_bar, done_ref) = (bar.clone(), &done);
        let ticker = s.spawn(move || {
            while !done_ref.load(Ordering::Relaxed) {
                if let Some(b) = &ticker_bar {
                    b.set_position(progress.records.load(Ordering::Relaxed));
                }
                thread::sleep(Duration::from_millis(100));
            }
        });
        let mut results = Vec::with_capacity(handles.len());
        let mut first_error = None;
        for h in handles {
            match h.join() {
                Ok(Ok(r)) => results.push(r),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(ExitError::new(exit::IO, "a bench worker failed"));
                }
            }
        }
        let elapsed = start.elapsed();
        done.store(true, Ordering::Relaxed);
        let _ = ticker.join();
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok((results, elapsed)),
        }
    })
}

/// Worker `w` of `n` gets an even share of `total`.
fn share(total: u64, w: u32, n: u32) -> u64 {
    total / u64::from(n) + u64::from(u64::from(w) < total % u64::from(n))
}

struct WorkerResult {
    records: u64,
    requests: u64,
    latencies: Vec<Duration>,
}

fn produce(args: &Args, addr: &str, records: u64, global: Global) -> anyhow::Result<Report> {
    let value = vec![b'x'; args.record_size as usize];
    let deadline_after = args.duration;
    let progress = Progress {
        records: AtomicU64::new(0),
    };
    let total = (records != u64::MAX).then_some(records);
    let (results, elapsed) = run_workers(
        args.connections,
        total,
        global.quiet,
        &progress,
        |w, barrier| {
            let connected = Client::connect(addr, args.timeout).map_err(client_error);
            barrier.wait();
            let mut client = connected?;
            let deadline = deadline_after.map(|d| Instant::now() + d);
            let mut left = share(records, w, args.connections);
            let mut r = WorkerResult {
                records: 0,
                requests: 0,
                latencies: Vec::new(),
            };
            let mut turn = u64::from(w);
            while left > 0 && deadline.is_none_or(|d| Instant::now() < d) {
                let n = left.min(u64::from(args.batch));
                let partition = (turn % u64::from(args.partitions)) as u32;
                turn += 1;
                let batch = PartitionBatch {
                    partition,
                    records: (0..n)
                        .map(|_| WireRecord {
                            timestamp_ms: -1,
                            key: None,
                            value: &value,
                        })
                        .collect(),
                };
                let t = Instant::now();
                let acks = client
                    .produce(&args.topic, vec![batch])
                    .map_err(client_error)?;
                r.latencies.push(t.elapsed());
                if let Some(Err((code, message))) = acks.first().map(|a| &a.result) {
                    return Err(ExitError::new(
                        exit::UNAVAILABLE,
                        format!("the broker at {addr} refused: {message} [{code}]"),
                    ));
                }
                r.records += n;
                r.requests += 1;
                left -= n;
                progress.records.fetch_add(n, Ordering::Relaxed);
            }
            Ok(r)
        },
    )?;
    Ok(collect(results, elapsed, u64::from(args.record_size)))
}

fn collect(results: Vec<WorkerResult>, elapsed: Duration, value_bytes: u64) -> Report {
    let records: u64 = results.iter().map(|r| r.records).sum();
    let requests = results.iter().map(|r| r.requests).sum();
    let mut latencies: Vec<Duration> = results.into_iter().flat_map(|r| r.latencies).collect();
    latencies.sort_unstable();
    Report {
        records,
        requests,
        value_bytes: records * value_bytes,
        elapsed,
        fsyncs: 0,
        latencies,
    }
}

/// Makes sure every partition holds its share of `records` for the consume bench.
fn seed(args: &Args, client: &mut Client, records: u64) -> anyhow::Result<()> {
    let offsets = client.list_offsets(&args.topic).map_err(client_error)?;
    let value = vec![b'x'; args.record_size as usize];
    let per_request = 1000u64.min(u64::from(RECORDS_PER_PARTITION_MAX));
    for o in &offsets {
        let want = share(records, o.partition, args.partitions);
        let mut have = o.end_offset.saturating_sub(o.start_offset);
        while have < want {
            let n = (want - have).min(per_request);
            let batch = PartitionBatch {
                partition: o.partition,
                records: (0..n)
                    .map(|_| WireRecord {
                        timestamp_ms: -1,
                        key: None,
                        value: &value,
                    })
                    .collect(),
            };
            let acks = client
                .produce(&args.topic, vec![batch])
                .map_err(client_error)?;
            if let Some(Err((code, message))) = acks.first().map(|a| &a.result) {
                return Err(ExitError::new(
                    exit::UNAVAILABLE,
                    format!("seeding the bench topic: {message} [{code}]"),
                ));
            }
            have += n;
        }
    }
    Ok(())
}

fn consume(
    args: &Args,
    addr: &str,
    admin: &mut Client,
    records: u64,
    global: Global,
) -> anyhow::Result<Report> {
    let offsets = admin.list_offsets(&args.topic).map_err(client_error)?;
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
    let progress = Progress {
        records: AtomicU64::new(0),
    };
    let (results, elapsed) = run_workers(
        args.connections,
        Some(records),
        global.quiet,
        &progress,
        |w, barrier| {
            let connected = Client::connect(addr, args.timeout).map_err(client_error);
            barrier.wait();
            let mut client = connected?;
            let mut r = WorkerResult {
                records: 0,
                requests: 0,
                latencies: Vec::new(),
            };
            for &(partition, from, to) in tasks
                .iter()
                .skip(w as usize)
                .step_by(args.connections as usize)
            {
                let mut pos = from;
                while pos < to {
                    let t = Instant::now();
                    let f = client
                        .fetch(&args.topic, partition, pos, max_bytes, Duration::ZERO)
                        .map_err(client_error)?;
                    r.latencies.push(t.elapsed());
                    r.requests += 1;
                    let Some(last) = f.records.last() else {
                        return Err(ExitError::new(
                        exit::IO,
                        format!("fetch of {}/{partition} at offset {pos} returned nothing before {to}", args.topic),
                    ));
                    };
                    let got = f.records.iter().filter(|x| x.offset < to).count() as u64;
                    pos = last.offset + 1;
                    r.records += got;
                    progress.records.fetch_add(got, Ordering::Relaxed);
                }
            }
            Ok(r)
        },
    )?;
    Ok(collect(results, elapsed, u64::from(args.record_size)))
}

fn print_report(args: &Args, addr: &str, r: &Report) -> anyhow::Result<()> {
    let mode = match args.mode {
        Mode::Produce => "produce",
        Mode::Consume => "consume",
    };
    let records_per_sec = r.per_sec(r.records as f64);
    let mb_per_sec = r.per_sec(r.value_bytes as f64) / 1e6;
    let requests_per_sec = r.per_sec(r.requests as f64);
    let (p50, p99, max) = (r.quantile_ms(0.50), r.quantile_ms(0.99), r.quantile_ms(1.0));
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if args.json {
        let v = json!({
            "mode": mode,
            "broker": addr,
            "embedded": args.embedded.as_ref().map(|d| d.display().to_string()),
            "records": r.records,
            "record_size": args.record_size,
            "batch": args.batch,
            "connections": args.connections,
            "partitions": args.partitions,
            "flush_every_records": args.embedded.as_ref().map(|_| args.flush_every_records),
            "requests": r.requests,
            "elapsed_s": r.elapsed.as_secs_f64(),
            "records_per_sec": records_per_sec,
            "mb_per_sec": mb_per_sec,
            "requests_per_sec": requests_per_sec,
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max,
            "fsyncs": r.fsyncs,
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    let target = match &args.embedded {
        Some(d) => format!(
            "embedded broker on {} at {addr}, flush every {} record(s)",
            d.display(),
            args.flush_every_records
        ),
        None => format!("broker at {addr}"),
    };
    writeln!(
        out,
        "bench {mode}: {} records of {} bytes, batch {}, {} connection(s), {} partition(s), {target}",
        r.records, args.record_size, args.batch, args.connections, args.partitions
    )?;
    let mut t = comfy_table::Table::new();
    t.set_header(["measure", "value"]);
    t.add_row([
        "elapsed s".to_string(),
        format!("{:.3}", r.elapsed.as_secs_f64()),
    ]);
    t.add_row(["records/s".to_string(), format!("{records_per_sec:.0}")]);
    t.add_row(["MB/s".to_string(), format!("{mb_per_sec:.2}")]);
    t.add_row(["requests/s".to_string(), format!("{requests_per_sec:.0}")]);
    t.add_row(["fsyncs".to_string(), r.fsyncs.to_string()]);
    t.add_row(["latency p50 ms".to_string(), format!("{p50:.3}")]);
    t.add_row(["latency p99 ms".to_string(), format!("{p99:.3}")]);
    t.add_row(["latency max ms".to_string(), format!("{max:.3}")]);
    writeln!(out, "{t}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
            records: 0,
            requests: 0,
            value_bytes: 0,
            elapsed: Duration::from_secs(1),
            fsyncs: 0,
            latencies: (1..=100).map(Duration::from_millis).collect(),
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
