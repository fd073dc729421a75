//! The write path: zero-ahead against preallocation alone, and many rolls against
//! few. Ignored by default; run with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture write_path::
//! ```
//!
//! 1. fsync p50 with `--zero-ahead on` vs `off`: 1 KiB records at 1,000/s, batch 1,
//!    one connection, one partition (`--rate 1000`). Beside it, the disk's own figures
//!    for the same pattern without the broker (a 1 KiB `pwrite` + `fdatasync` every
//!    millisecond into a file written with zeros and fsynced first, and into blocks
//!    reserved with `fallocate`, size kept, as the broker reserves them): the ratio
//!    no write path can beat on this disk.
//! 2. 1 MiB segments vs 1 GiB: batch 10, 4 connections, 256-byte records, as fast as
//!    acknowledged: `roll stall max` and request p99.
//! 3. Durable produce (an fsync before every ack) vs `--flush-every-records 100000`:
//!    256-byte records, 16 connections, batch 100 and batch 10; on fresh directories
//!    (every block new), and in the steady state of a broker whose retention returns
//!    segments to the spare pool (rolls reuse written blocks).
//! 4. Consume of 256-byte records with large fetches (100,000 records) vs small ones
//!    (1,000 records).
//! 5. Durable produce, batch 1, 256-byte records, vs Redis Streams `XADD` with
//!    `appendonly yes`, `appendfsync always` (`redis-server` and `redis-benchmark` from
//!    the PATH; skipped when missing), 16 connections and 1.
//!
//! Each pair runs side by side in one run, alternating, `SEGLOG_BENCH_ROUNDS` rounds
//! (default 3), `SEGLOG_BENCH_SECS` seconds each (default 5); medians and their ratios
//! are printed. This measures; it asserts only that each run worked.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::bin::BIN;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One `seglog bench produce --embedded` run on a fresh directory; its JSON report.
fn bench(args: &[&str]) -> Value {
    let duration = format!("{}s", env_or("SEGLOG_BENCH_SECS", 5));
    let mut all = vec!["produce", "--duration", &duration];
    all.extend_from_slice(args);
    bench_mode(&all)
}

/// One `seglog bench MODE --embedded` run on a fresh directory (`args` starts with
/// the mode); its JSON report.
fn bench_mode(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let (mode, rest) = args.split_first().unwrap();
    let out = Command::new(BIN)
        .args(["bench", mode, "--json", "--embedded"])
        .arg(dir.path().join("data"))
        .args(rest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The p50 of 3,000 writes of 1 KiB, each followed by `fdatasync`, one every
/// millisecond, appended to a file whose first 8 MiB were written with zeros and
/// fsynced (`zeroed`) or reserved with `fallocate`, size kept (not `zeroed`).
fn raw_fsync_p50_ms(zeroed: bool) -> f64 {
    const SPACE: u64 = 8 << 20;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("raw");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    if zeroed {
        f.write_all_at(&vec![0u8; SPACE as usize], 0).unwrap();
        f.sync_all().unwrap();
    } else {
        rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::KEEP_SIZE, 0, SPACE).unwrap();
        f.sync_all().unwrap();
    }
    let record = [b'x'; 1024];
    let mut took = Vec::with_capacity(3000);
    let mut next = Instant::now();
    for i in 0..3000u64 {
        next += Duration::from_millis(1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let began = Instant::now();
        f.write_all_at(&record, i * 1024).unwrap();
        f.sync_data().unwrap();
        took.push(began.elapsed().as_secs_f64() * 1000.0);
    }
    median(took)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn field(v: &Value, name: &str) -> f64 {
    v[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} missing: {v}"))
}

#[test]
#[ignore]
fn zero_ahead_fsync_p50_and_roll_stalls() {
    let rounds = env_or("SEGLOG_BENCH_ROUNDS", 3);
    let steady = [
        "--record-size",
        "1024",
        "--batch",
        "1",
        "--connections",
        "1",
        "--partitions",
        "1",
        "--rate",
        "1000",
    ];
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (zero, out) in [("on", &mut on), ("off", &mut off)] {
            let mut args = steady.to_vec();
            args.extend(["--zero-ahead", zero]);
            let v = bench(&args);
            println!(
                "round {round} zero-ahead {zero:>3}: fsync p50 {:.3} ms, p99 {:.3} ms, {} records/s, zeroed {} bytes, fsyncs {}",
                field(&v, "fsync_p50_ms"),
                field(&v, "fsync_p99_ms"),
                field(&v, "records_per_sec").round(),
                field(&v, "zeroed_bytes"),
                field(&v, "fsyncs"),
            );
            assert!(field(&v, "records") > 0.0);
            out.push(v);
        }
    }
    let p50 = |v: &[Value]| median(v.iter().map(|x| field(x, "fsync_p50_ms")).collect());
    let (p_on, p_off) = (p50(&on), p50(&off));
    println!(
        "fsync p50 (median of {rounds}): zero-ahead on {p_on:.3} ms, off {p_off:.3} ms, ratio on/off {:.2}",
        p_on / p_off.max(1e-9)
    );
    let (mut zeroed, mut reserved) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        zeroed.push(raw_fsync_p50_ms(true));
        reserved.push(raw_fsync_p50_ms(false));
    }
    let (z, r) = (median(zeroed), median(reserved));
    println!(
        "the disk alone, 1 KiB pwrite + fdatasync at 1,000/s (median of {rounds}): pre-zeroed {z:.3} ms, fallocated {r:.3} ms, ratio {:.2}",
        z / r.max(1e-9)
    );

    let rolling = [
        "--record-size",
        "256",
        "--batch",
        "10",
        "--connections",
        "4",
        "--partitions",
        "1",
    ];
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (bytes, out) in [("1048576", &mut small), ("1073741824", &mut large)] {
            let mut args = rolling.to_vec();
            args.extend(["--segment-bytes", bytes]);
            let v = bench(&args);
            println!(
                "round {round} segment {bytes:>10}: rolls {}, roll stall max {:.3} ms, p99 {:.3} ms, {} records/s, fsync p50 {:.3} ms",
                field(&v, "rolls"),
                field(&v, "roll_stall_max_ms"),
                field(&v, "p99_ms"),
                field(&v, "records_per_sec").round(),
                field(&v, "fsync_p50_ms"),
            );
            out.push(v);
        }
    }
    let med = |v: &[Value], f: &str| median(v.iter().map(|x| field(x, f)).collect());
    let (stall, p99_small, p99_large) = (
        med(&small, "roll_stall_max_ms"),
        med(&small, "p99_ms"),
        med(&large, "p99_ms"),
    );
    // The goal is on the longest stall: the median of the runs' maxima hides a run
    // whose longest stall is far above the others', so the longest of all is shown
    // beside it, with how many runs passed 1 ms.
    let maxima: Vec<f64> = small
        .iter()
        .map(|x| field(x, "roll_stall_max_ms"))
        .collect();
    let longest = maxima.iter().copied().fold(0.0, f64::max);
    let over = maxima.iter().filter(|m| **m > 1.0).count();
    println!(
        "1 MiB segments: roll stall max {stall:.3} ms (median of {rounds}), longest of all {longest:.3} ms, {over} of {rounds} runs above 1 ms; p99 {p99_small:.3} ms vs {p99_large:.3} ms with 1 GiB, ratio {:.2}",
        p99_small / p99_large.max(1e-9)
    );
    assert!(med(&small, "rolls") > 0.0, "1 MiB segments rolled");
}

#[test]
#[ignore]
fn durable_against_non_durable() {
    // SEGLOG_BENCH_ZERO_RATE=N: both runs of each pair with `--zero-rate N` (the
    // default 64 MiB/s is overtaken by a writer faster than that, and its fsyncs then
    // pay for new blocks).
    let zero_rate = std::env::var("SEGLOG_BENCH_ZERO_RATE").ok();
    let mut extra = Vec::new();
    if let Some(r) = &zero_rate {
        println!("--zero-rate {r}");
        extra.extend(["--zero-rate", r.as_str()]);
    }
    // One request in flight per connection, then five (a Kafka producer's default
    // max.in.flight.requests.per.connection; the broker pipelines them).
    durable_pairs("fresh directory", &extra, &["1", "5"]);
}

/// As [`durable_against_non_durable`], on a broker in its steady state: the topic
/// keeps 512 MiB (`retention_bytes`, checked every 500 ms), so retention returns
/// segments to the spare pool and rolls reuse them, and each run first produces for
/// `SEGLOG_BENCH_WARMUP_SECS` (default 4) unmeasured, long enough to fill the
/// retained bytes and the pool. The writer then appends into blocks that are already
/// written, as on a broker that has run for a while, rather than into new ones.
#[test]
#[ignore]
fn durable_against_non_durable_in_steady_state() {
    let warmup = format!("{}s", env_or("SEGLOG_BENCH_WARMUP_SECS", 4));
    let extra = [
        "--segment-bytes",
        "67108864",
        "--retention-bytes",
        "536870912",
        "--retention-check-interval",
        "500ms",
        "--warmup",
        warmup.as_str(),
    ];
    durable_pairs("steady state", &extra, &["1"]);
}

/// Durable produce (fsync before every ack) against `--flush-every-records 100000`,
/// 256-byte records, 16 connections, batch 100 and 10, for each of `in_flights`,
/// alternating, each run on a fresh directory with `extra` arguments; prints each run
/// (with the spares it took) and the medians and ratios.
fn durable_pairs(label: &str, extra: &[&str], in_flights: &[&str]) {
    let rounds = env_or("SEGLOG_BENCH_ROUNDS", 3);
    for &in_flight in in_flights {
        for batch in ["100", "10"] {
            let base = [
                "--record-size",
                "256",
                "--batch",
                batch,
                "--connections",
                "16",
                "--in-flight",
                in_flight,
            ];
            let (mut durable, mut loose) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                // The first run of each pair alternates, and each run has a fresh
                // directory, removed after it: on this virtual machine writes slow
                // down once the page cache grows past a few GB (see cluster.rs), and
                // a fixed order would put one setting in the slower phase more often.
                let mut order = [("1", &mut durable), ("100000", &mut loose)];
                if round % 2 == 1 {
                    order.reverse();
                }
                for (flush, out) in order {
                    let mut args = base.to_vec();
                    args.extend(["--flush-every-records", flush]);
                    args.extend_from_slice(extra);
                    let v = bench(&args);
                    println!(
                        "{label}: round {round} batch {batch:>3} in flight {in_flight} flush every {flush:>6}: {} records/s, fsyncs {}, fsync p50 {:.3} ms, p99 {:.3} ms, spares taken {}",
                        field(&v, "records_per_sec").round(),
                        field(&v, "fsyncs"),
                        field(&v, "fsync_p50_ms"),
                        field(&v, "p99_ms"),
                        field(&v, "spares_taken"),
                    );
                    assert!(field(&v, "records") > 0.0);
                    out.push(field(&v, "records_per_sec"));
                }
            }
            let pairs = median(
                durable
                    .iter()
                    .zip(&loose)
                    .map(|(d, l)| d / l.max(1e-9))
                    .collect(),
            );
            let (d, l) = (median(durable), median(loose));
            println!(
                "{label}: batch {batch}, 16 connections, {in_flight} in flight each: durable {d:.0} records/s, flush every 100000 {l:.0} (medians of {rounds}), ratio {:.2}; median of the {rounds} pairs' ratios {pairs:.2}",
                d / l.max(1e-9)
            );
        }
    }
}

#[test]
#[ignore]
fn large_fetches_against_small() {
    let rounds = env_or("SEGLOG_BENCH_ROUNDS", 3);
    let records = env_or("SEGLOG_BENCH_RECORDS", 2_000_000).to_string();
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (batch, out) in [("1000", &mut small), ("100000", &mut large)] {
            let v = bench_mode(&[
                "consume",
                "--records",
                &records,
                "--record-size",
                "256",
                "--batch",
                batch,
            ]);
            println!(
                "round {round} fetch of {batch:>6} records: {} records/s, p50 {:.3} ms",
                field(&v, "records_per_sec").round(),
                field(&v, "p50_ms"),
            );
            assert!(field(&v, "records") > 0.0);
            out.push(field(&v, "records_per_sec"));
        }
    }
    let (s, l) = (median(small), median(large));
    println!(
        "consume: fetches of 100000 records {l:.0} records/s, of 1000 {s:.0} (medians of {rounds}), ratio large/small {:.2}",
        l / s.max(1e-9)
    );
}

/// Whether `program` runs from the PATH.
fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A `redis-server` with every write fsynced before its reply, on a free port.
struct Redis {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir.path())
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Redis {
            child,
            port,
            _dir: dir,
        }
    }

    /// `XADD` of 256-byte values for about `secs` seconds; requests per second.
    fn xadd(&self, connections: u32, secs: u64) -> f64 {
        let value = "x".repeat(256);
        let requests = (u64::from(connections) * 1000).max(2000) * secs;
        let out = Command::new("redis-benchmark")
            .args(["-p", &self.port.to_string(), "-c", &connections.to_string()])
            .args(["-n", &requests.to_string(), "--csv"])
            .args(["XADD", "s", "*", "v", &value])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or_default();
        let rps = last.split("\",\"").nth(1).unwrap_or_default();
        rps.trim_matches('"').parse().unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore]
fn durable_batch_1_against_redis() {
    if !have("redis-server") || !have("redis-benchmark") {
        println!("skipped: redis-server and redis-benchmark are not on the PATH");
        return;
    }
    let rounds = env_or("SEGLOG_BENCH_ROUNDS", 3);
    let secs = env_or("SEGLOG_BENCH_SECS", 5);
    for connections in [16u32, 1] {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let c = connections.to_string();
            let seglog = || {
                let v = bench(&["--record-size", "256", "--batch", "1", "--connections", &c]);
                field(&v, "records_per_sec")
            };
            let redis = || {
                let redis = Redis::start();
                redis.xadd(connections, secs)
            };
            // The first of each pair alternates, as in the other comparisons.
            let (o, r) = if round % 2 == 0 {
                let o = seglog();
                (o, redis())
            } else {
                let r = redis();
                (seglog(), r)
            };
            println!(
                "round {round} {connections:>2} connections: seglog {} records/s, redis {r:.0}, ratio {:.2}",
                o.round(),
                o / r.max(1e-9)
            );
            ours.push(o);
            theirs.push(r);
        }
        let pairs = median(
            ours.iter()
                .zip(&theirs)
                .map(|(o, t)| o / t.max(1e-9))
                .collect(),
        );
        let (o, t) = (median(ours), median(theirs));
        println!(
            "batch 1, {connections} connections: seglog {o:.0} records/s, redis {t:.0} (medians of {rounds}), ratio {:.2}; median of the {rounds} pairs' ratios {pairs:.2}",
            o / t.max(1e-9)
        );
    }
}
