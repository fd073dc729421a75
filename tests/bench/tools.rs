//! Speed of the offline tools, measured, never asserted:
//! `cargo test --release --test bench -- --ignored --nocapture tools::`.
//!
//! Builds a 512 MiB partition (64 MiB segments, 4 KiB values) and a 256 MiB one of
//! 256-byte records in a temporary directory with the format encoder, warms the page
//! cache, then times side by side: `cat` of the segment files into /dev/null,
//! `seglog verify` (the ratio of the two, for both record sizes), `seglog verify
//! --quick` and `seglog dump --json`; and the peak RSS of verify and dump on 64 MiB
//! and 512 MiB, which must stay flat as the data grows. Set `SEGLOG_BENCH_DIR` to build the data
//! somewhere other than the system temporary directory, and `SEGLOG_BENCH_KEEP=1` to
//! keep it afterwards (to profile a tool on it). Set `SEGLOG_BENCH_BASELINE` to the
//! path of another `seglog` binary to time its `verify` in the same run (before and
//! after a change).

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seglog::format::names::{index_file_name, log_file_name};
use seglog::format::{encode_record, IndexBuilder, SegmentHeader, HEADER_LEN};

use crate::util::bin::BIN;

const MIB: u64 = 1024 * 1024;
const SEGMENT_BYTES: u64 = 64 * MIB;
const VALUE_BYTES: usize = 4096;
/// Record size of the small-record partition: 256 bytes on disk, framing included.
const SMALL_RECORD_BYTES: usize = 256;
/// The newest (active) segment is small, as in a running broker shortly after a roll.
const ACTIVE_BYTES: u64 = MIB;

/// Writes a partition of about `total` bytes of sealed segments plus a small active
/// segment into `dir`, with values of `value_bytes`; returns its log files.
fn build(dir: &Path, total: u64, value_bytes: usize) -> Vec<PathBuf> {
    let total_with_active = total + ACTIVE_BYTES;
    fs::create_dir_all(dir).unwrap();
    let mut logs = Vec::new();
    let mut offset = 0u64;
    let mut value = vec![0u8; value_bytes];
    let mut written = 0u64;
    while written < total_with_active {
        let limit = if written >= total {
            ACTIVE_BYTES
        } else {
            SEGMENT_BYTES
        };
        let base = offset;
        let path = dir.join(log_file_name(base));
        let mut log = BufWriter::with_capacity(4 * MIB as usize, File::create(&path).unwrap());
        log.write_all(&SegmentHeader::new(base).encode()).unwrap();
        let mut pos = HEADER_LEN as u64;
        let mut index = Vec::new();
        let mut b = IndexBuilder::new();
        let mut rec = Vec::with_capacity(value_bytes + 64);
        while pos < limit && (written >= total || written + pos < total) {
            for (i, byte) in value.iter_mut().enumerate().step_by(64) {
                *byte = (offset as usize + i) as u8;
            }
            rec.clear();
            let key = format!("key-{:03}", offset % 1000);
            encode_record(
                &mut rec,
                offset,
                1_700_000_000_000 + offset as i64,
                Some(key.as_bytes()),
                &value,
                0,
            )
            .unwrap();
            if let Some(e) = b.observe(base, offset, pos) {
                e.encode_into(&mut index);
            }
            log.write_all(&rec).unwrap();
            pos += rec.len() as u64;
            offset += 1;
        }
        log.flush().unwrap();
        fs::write(dir.join(index_file_name(base)), &index).unwrap();
        written += pos;
        logs.push(path);
    }
    logs
}

struct Run {
    wall: Duration,
    code: i32,
}

/// Runs a command with stdout into /dev/null; returns its wall time and exit code.
fn measure(program: &str, args: &[&str]) -> Run {
    let devnull = File::create("/dev/null").unwrap();
    let start = Instant::now();
    let status = Command::new(program)
        .args(args)
        .stdout(Stdio::from(devnull))
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    Run {
        wall: start.elapsed(),
        code: status.code().unwrap_or(-1),
    }
}

/// Peak RSS of a command in KiB, from `/usr/bin/time` (wait4's `ru_maxrss` of a child
/// spawned from this process also counts the memory of the test harness it was
/// cloned from, so it cannot tell a small tool apart).
fn peak_rss_kb(program: &str, args: &[&str]) -> String {
    let out = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M")
        .arg(program)
        .args(args)
        .stdout(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("?")
            .trim()
            .to_string(),
        _ => "n/a".to_string(),
    }
}

/// The best of `n` runs (least disturbed by other work on the machine).
fn best(n: usize, program: &str, args: &[&str]) -> Run {
    let mut runs: Vec<Run> = (0..n).map(|_| measure(program, args)).collect();
    runs.sort_by_key(|r| r.wall);
    runs.remove(0)
}

fn mb_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

/// Bytes of the log files.
fn total_len(logs: &[PathBuf]) -> u64 {
    logs.iter().map(|p| fs::metadata(p).unwrap().len()).sum()
}

/// `cat` and `verify` of one partition, best of `n` each, run alternately so both see
/// the same machine load; also `verify` of the baseline binary when one is given.
fn cat_vs_verify(
    n: usize,
    logs: &[PathBuf],
    dir: &str,
    baseline: Option<&str>,
) -> (Run, Run, Option<Run>) {
    let log_args: Vec<&str> = logs.iter().map(|p| p.to_str().unwrap()).collect();
    let mut cats = Vec::new();
    let mut verifies = Vec::new();
    let mut olds = Vec::new();
    for _ in 0..n {
        cats.push(measure("cat", &log_args));
        verifies.push(measure(BIN, &["verify", dir]));
        if let Some(b) = baseline {
            olds.push(measure(b, &["verify", dir]));
        }
    }
    cats.sort_by_key(|r| r.wall);
    verifies.sort_by_key(|r| r.wall);
    olds.sort_by_key(|r| r.wall);
    let old = (!olds.is_empty()).then(|| olds.remove(0));
    (cats.remove(0), verifies.remove(0), old)
}

fn print_cat_vs_verify(label: &str, bytes: u64, cat: &Run, verify: &Run) {
    println!(
        "  {label:<30} cat {:>7.3}s {:>6.0} MiB/s   verify {:>7.3}s {:>6.0} MiB/s   verify/cat speed {:.0}%",
        cat.wall.as_secs_f64(),
        mb_per_s(bytes, cat.wall),
        verify.wall.as_secs_f64(),
        mb_per_s(bytes, verify.wall),
        100.0 * cat.wall.as_secs_f64() / verify.wall.as_secs_f64()
    );
}

#[test]
#[ignore = "benchmark: builds 832 MiB of data; run with --ignored --nocapture"]
fn verify_and_dump_speed_and_memory() {
    let seglog = BIN;
    let root = std::env::var_os("SEGLOG_BENCH_DIR").map(PathBuf::from);
    let tmp = match &root {
        Some(r) => tempfile::tempdir_in(r).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let big = tmp.path().join("big/0");
    let small = tmp.path().join("small/0");
    let tiny = tmp.path().join("tiny-records/0");
    let t = Instant::now();
    let logs = build(&big, 512 * MIB, VALUE_BYTES);
    build(&small, 64 * MIB, VALUE_BYTES);
    // 32 bytes of framing and a 7-byte key around the value: 256 bytes a record.
    let tiny_logs = build(&tiny, 256 * MIB, SMALL_RECORD_BYTES - 39);
    let bytes = total_len(&logs);
    let tiny_bytes = total_len(&tiny_logs);
    println!(
        "built {} + {} segments, {} + {} MiB in {:.1}s",
        logs.len(),
        tiny_logs.len(),
        bytes / MIB,
        tiny_bytes / MIB,
        t.elapsed().as_secs_f64()
    );
    let log_args: Vec<&str> = logs.iter().map(|p| p.to_str().unwrap()).collect();
    let big_s = big.to_str().unwrap();
    let small_s = small.to_str().unwrap();
    let tiny_s = tiny.to_str().unwrap();

    // Warm the page cache.
    measure("cat", &log_args);
    measure(seglog, &["verify", big_s]);
    measure(seglog, &["verify", tiny_s]);

    let baseline = std::env::var("SEGLOG_BENCH_BASELINE").ok();
    let baseline = baseline.as_deref();
    let n = 5;
    let (cat, verify, old) = cat_vs_verify(n, &logs, big_s, baseline);
    let (tiny_cat, tiny_verify, tiny_old) = cat_vs_verify(n, &tiny_logs, tiny_s, baseline);
    let quick = best(n, seglog, &["verify", "--quick", big_s]);
    let dump = best(1, seglog, &["dump", "--json", big_s]);
    assert_eq!(verify.code, 0);
    assert_eq!(tiny_verify.code, 0);
    assert_eq!(quick.code, 0);
    assert_eq!(dump.code, 0);
    println!("warm cache, best of {n}, cat > /dev/null against seglog verify:");
    print_cat_vs_verify(
        &format!("{VALUE_BYTES} B values, {} MiB", bytes / MIB),
        bytes,
        &cat,
        &verify,
    );
    print_cat_vs_verify(
        &format!("{SMALL_RECORD_BYTES} B records, {} MiB", tiny_bytes / MIB),
        tiny_bytes,
        &tiny_cat,
        &tiny_verify,
    );
    if let (Some(b), Some(old), Some(tiny_old)) = (baseline, &old, &tiny_old) {
        println!("  the same, verify of the baseline {b}:");
        print_cat_vs_verify("  4 KiB values", bytes, &cat, old);
        print_cat_vs_verify("  256 B records", tiny_bytes, &tiny_cat, tiny_old);
    }
    println!(
        "  seglog verify --quick  {:>8.3}s  ({:.1}% of full verify)",
        quick.wall.as_secs_f64(),
        100.0 * quick.wall.as_secs_f64() / verify.wall.as_secs_f64()
    );
    println!(
        "  seglog dump --json     {:>8.3}s  {:>7.0} MiB/s (one run)",
        dump.wall.as_secs_f64(),
        mb_per_s(bytes, dump.wall)
    );

    println!("peak RSS (KiB)              64 MiB    512 MiB");
    for args in [
        &["verify"][..],
        &["verify", "--quick"],
        &["dump", "--json"],
        &["reindex", "--check", "--all"],
    ] {
        let with = |dir: &str| {
            let mut a = args.to_vec();
            a.push(dir);
            peak_rss_kb(seglog, &a)
        };
        println!(
            "  {:<22} {:>10} {:>10}",
            args.join(" "),
            with(small_s),
            with(big_s)
        );
    }
    if std::env::var_os("SEGLOG_BENCH_KEEP").is_some_and(|v| v == "1") {
        println!("data kept in {} (for profiling)", tmp.keep().display());
    }
}
