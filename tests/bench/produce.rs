//! Throughput benchmark of the broker over loopback, with an fsync before every
//! acknowledgement (`--flush-every-records 1`). Ignored by default; run with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture produce::
//! ```
//!
//! Every case runs `seglog bench produce --embedded` (a broker in the bench process,
//! reached over TCP) for a fixed time with 256-byte records, for batch 1/10/100/1000 ×
//! connections 1/4/16 × partitions 1/4. The same run first measures a plain
//! append-and-fdatasync loop of 256-byte records on the same disk, and prints every
//! case's records/s as a multiple of that raw rate. `SEGLOG_BENCH_SECS` sets the
//! seconds per case (default 2). This measures; it asserts only that each run worked.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::bin::BIN;

const RECORD_BYTES: usize = 256;

fn case_seconds() -> u64 {
    std::env::var("SEGLOG_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

/// Appends 256-byte records to a new file, fdatasync after each, for `dur`.
/// Returns records (= fdatasyncs) per second.
fn raw_append_fdatasync(dir: &Path, dur: Duration) -> f64 {
    let path = dir.join("raw.log");
    let mut f = OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    let record = [b'x'; RECORD_BYTES];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        f.write_all(&record).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Overwrites 256-byte records in a file allocated up front, fdatasync after each:
/// no size change, so no metadata to journal (what a preallocating log pays).
fn raw_preallocated_fdatasync(dir: &Path, dur: Duration) -> f64 {
    use std::os::unix::fs::FileExt;
    let path = dir.join("raw-prealloc.log");
    let f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    let len: u64 = 64 << 20;
    f.write_all_at(&vec![0u8; len as usize], 0).unwrap();
    f.sync_all().unwrap();
    let record = [b'x'; RECORD_BYTES];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        f.write_all_at(&record, (n * RECORD_BYTES as u64) % len)
            .unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn produce_throughput_against_raw_fdatasync() {
    let secs = case_seconds();
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let raw = raw_append_fdatasync(base.path(), Duration::from_secs(secs));
    println!();
    println!(
        "disk: {} (same file system as every case)",
        base.path().display()
    );
    println!("raw append + fdatasync of {RECORD_BYTES}-byte records: {raw:.0} records/s (the 'x raw' reference)");
    let prealloc = raw_preallocated_fdatasync(base.path(), Duration::from_secs(secs));
    println!(
        "raw overwrite + fdatasync in a preallocated file: {prealloc:.0} records/s ({:.2} x raw)",
        prealloc / raw
    );
    println!();
    println!(
        "{:>5} {:>5} {:>5} | {:>10} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} | {:>8}",
        "batch",
        "conns",
        "parts",
        "records/s",
        "MB/s",
        "req/s",
        "fsyncs",
        "p50 ms",
        "p99 ms",
        "max ms",
        "x raw"
    );
    for batch in [1u32, 10, 100, 1000] {
        for connections in [1u32, 4, 16] {
            for partitions in [1u32, 4] {
                let dir = base
                    .path()
                    .join(format!("b{batch}-c{connections}-p{partitions}"));
                let out = Command::new(BIN)
                    .args([
                        "bench",
                        "produce",
                        "--json",
                        "--record-size",
                        "256",
                        "--flush-every-records",
                        "1",
                    ])
                    .args(["--duration", &format!("{secs}s")])
                    .args(["--batch", &batch.to_string()])
                    .args(["--connections", &connections.to_string()])
                    .args(["--partitions", &partitions.to_string()])
                    .arg("--embedded")
                    .arg(&dir)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
                println!(
                    "{batch:>5} {connections:>5} {partitions:>5} | {:>10.0} {:>8.2} {:>9.0} {:>8} {:>8.3} {:>8.3} {:>8.3} | {:>8.2}",
                    f("records_per_sec"),
                    f("mb_per_sec"),
                    f("requests_per_sec"),
                    r["fsyncs"],
                    f("p50_ms"),
                    f("p99_ms"),
                    f("max_ms"),
                    f("records_per_sec") / raw,
                );
                assert!(r["records"].as_u64().unwrap_or(0) > 0);
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}
