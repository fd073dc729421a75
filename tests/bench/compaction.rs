//! Compaction of a 512 MiB partition with a million keys: the full scan in this
//! process, then `seglog compact --dry-run` and `seglog compact` as children, with
//! their time and peak memory.

use std::fs;
use std::path::PathBuf;

use seglog::engine::maintenance::check::{check_partition, CheckMode};
use seglog::engine::storage::layout::resolve;
use seglog::format::names::{index_file_name, log_file_name};
use seglog::format::topic::{CleanupPolicy, TopicConfig, TopicMeta};
use seglog::format::{encode_record, IndexBuilder, SegmentHeader};

use crate::util::bin::{json, BIN};
use crate::util::rng::{Rng, RngExt};

const NOW_MS: i64 = 1_700_000_000_000;

/// Peak resident memory (KiB) of a child, from wait4's rusage (the kernel's VmHWM).
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped with wait4, which also returns its peak memory"
)]
#[expect(unsafe_code, reason = "wait4 for the child's peak RSS")]
fn run_measured(cmd: &mut std::process::Command) -> (std::process::Output, u64, f64) {
    use std::io::Read;
    let start = std::time::Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let mut stderr = Vec::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet waited for; status and usage are valid.
    let r = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
    assert_eq!(r, pid);
    let secs = start.elapsed().as_secs_f64();
    let output = std::process::Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout,
        stderr,
    };
    (output, usage.ru_maxrss as u64, secs)
}

#[test]
#[ignore = "benchmark: cargo test --release --test bench -- --ignored --nocapture compaction"]
fn bench_compaction_memory_and_throughput() {
    const KEYS: u64 = 1_000_000;
    const TOTAL_BYTES: u64 = 512 * 1024 * 1024;
    const VALUE_LEN: usize = 230;
    // SEGLOG_BENCH_DIR keeps the generated data directory there (for profiling).
    let tmp = tempfile::tempdir().unwrap();
    let kept_dir = std::env::var_os("SEGLOG_BENCH_DIR").map(PathBuf::from);
    let data = kept_dir.as_deref().unwrap_or(tmp.path());
    let topic_dir = data.join("topics/kv");
    let part = topic_dir.join("0");
    fs::create_dir_all(&part).unwrap();
    let config = TopicConfig {
        cleanup_policy: CleanupPolicy::Compact,
        ..TopicConfig::default()
    };
    fs::write(
        topic_dir.join("topic.json"),
        TopicMeta {
            partitions: 1,
            config: config.clone(),
        }
        .encode(),
    )
    .unwrap();
    // Generate: every key once (1M distinct keys), then random updates until 512 MiB.
    let gen_start = std::time::Instant::now();
    let mut rng = Rng::new(42);
    let value: Vec<u8> = (0..VALUE_LEN).map(|i| b'a' + (i % 26) as u8).collect();
    let mut offset = 0u64;
    let mut written = 0u64;
    let mut base = 0u64;
    let mut log = SegmentHeader::new(0).encode().to_vec();
    let mut index = Vec::new();
    let mut builder = IndexBuilder::new();
    let mut segments = 0;
    while written < TOTAL_BYTES {
        let k = if offset < KEYS {
            offset
        } else {
            rng.below(KEYS)
        };
        let key = format!("key-{k:08}");
        let pos = log.len() as u64;
        if let Some(e) = builder.observe(base, offset, pos) {
            e.encode_into(&mut index);
        }
        let v = if offset >= KEYS && rng.chance(2) {
            &[][..]
        } else {
            &value[..]
        };
        let n = encode_record(&mut log, offset, NOW_MS, Some(key.as_bytes()), v, 0).unwrap();
        written += n as u64;
        offset += 1;
        if log.len() as u64 + 300 > config.segment_bytes || written >= TOTAL_BYTES {
            fs::write(part.join(log_file_name(base)), &log).unwrap();
            fs::write(part.join(index_file_name(base)), &index).unwrap();
            segments += 1;
            base = offset;
            log = SegmentHeader::new(base).encode().to_vec();
            index.clear();
            builder = IndexBuilder::new();
        }
    }
    // A small active segment.
    fs::write(part.join(log_file_name(base)), &log).unwrap();
    fs::write(part.join(index_file_name(base)), &index).unwrap();
    drop(log);
    eprintln!(
        "generated {} records, {:.1} MiB in {segments} sealed segments in {:.1}s",
        offset,
        written as f64 / 1048576.0,
        gen_start.elapsed().as_secs_f64()
    );

    // Full scan (what `seglog verify` reads), in this process.
    let p = resolve(&part).unwrap().partitions.remove(0);
    let t = std::time::Instant::now();
    let check = check_partition(&p, CheckMode::Full).unwrap();
    let scan_secs = t.elapsed().as_secs_f64();
    assert_eq!(check.severity(), None);
    let mb = written as f64 / 1e6;
    eprintln!(
        "full scan (verify-equivalent): {scan_secs:.2}s, {:.0} MB/s",
        mb / scan_secs
    );

    // Dry run then the real compaction, each in a child running the real binary.
    let bin = BIN;
    let runs: &[bool] = if kept_dir.is_some() {
        &[true]
    } else {
        &[true, false]
    };
    for &dry in runs {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["compact", "--json", "--now-ms", &NOW_MS.to_string()]);
        if dry {
            cmd.arg("--dry-run");
        }
        cmd.arg(data);
        let (out, maxrss_kib, secs) = run_measured(&mut cmd);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc = json(&String::from_utf8_lossy(&out.stdout));
        let r = &doc["partitions"][0];
        eprintln!(
            "compact{}: {secs:.2}s, {:.0} MB/s read, peak RSS {:.1} MiB; read {} kept {} dropped {} tombstones dropped {} keys {}, bytes {} -> {}",
            if dry { " --dry-run" } else { "" },
            mb / secs,
            maxrss_kib as f64 / 1024.0,
            r["records_read"], r["records_kept"], r["records_dropped"], r["tombstones_dropped"], r["keys"],
            r["bytes_before"], r["bytes_after"],
        );
        assert!(maxrss_kib < 128 * 1024, "peak memory {maxrss_kib} KiB");
        assert_eq!(r["keys"], KEYS);
    }
    let check = check_partition(&p, CheckMode::Full).unwrap();
    assert_eq!(check.severity(), None);
}
