//! The write path: zero-ahead against preallocation alone, and many rolls against
//! few. Ignored by default; run with
//!
//! ```text
//! cargo test --release --test bench -- --ignored --nocapture write_path::
//! ```
//!
//! 1. fsync p50 with `--zero-ahead on` vs `off`: 1 KiB records at 1,000/s, batch 1,
//!    one connection, one partition (`--rate 1000`).
//! 2. 1 MiB segments vs 1 GiB: batch 10, 4 connections, 256-byte records, as fast as
//!    acknowledged: `roll stall max` and request p99.
//!
//! Each pair runs side by side in one run, alternating, `SEGLOG_BENCH_ROUNDS` rounds
//! (default 3), `SEGLOG_BENCH_SECS` seconds each (default 5); medians and their ratios
//! are printed. This measures; it asserts only that each run worked.

use std::process::Command;

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
    let dir = tempfile::tempdir().unwrap();
    let secs = env_or("SEGLOG_BENCH_SECS", 5).to_string();
    let out = Command::new(BIN)
        .args(["bench", "produce", "--json", "--embedded"])
        .arg(dir.path().join("data"))
        .args(["--duration", &format!("{secs}s")])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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
    println!(
        "1 MiB segments: roll stall max {stall:.3} ms (median of {rounds}); p99 {p99_small:.3} ms vs {p99_large:.3} ms with 1 GiB, ratio {:.2}",
        p99_small / p99_large.max(1e-9)
    );
    assert!(med(&small, "rolls") > 0.0, "1 MiB segments rolled");
}
