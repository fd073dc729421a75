//! Benchmark (ignored by default): planning recovery of a data directory with 512 MiB
//! in sealed segments that have valid indexes must read only a little of each
//! segment. Measures bytes read (`rchar` of /proc/self/io) as well as time.
//!
//! `cargo test --release --test bench -- --ignored --nocapture recovery::`

use std::fs;
use std::io::Write;
use std::time::Instant;

use seglog::engine::maintenance::recovery;
use seglog::engine::storage::layout::resolve;
use seglog::format::names::{index_file_name, log_file_name};

use crate::util::build::Segment;

const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
const SEGMENTS: u64 = 8;
const VALUE_LEN: usize = 1000;

fn rchar() -> u64 {
    let s = fs::read_to_string("/proc/self/io").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
#[ignore = "benchmark: writes 512 MiB"]
fn plan_reads_little_of_sealed_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let part = data.join("topics/t/0");
    fs::create_dir_all(&part).unwrap();
    fs::write(data.join("topics/t/topic.json"), br#"{"partitions": 1}"#).unwrap();
    let mut offset = 0u64;
    let mut sealed_bytes = 0u64;
    let mut active_base = 0u64;
    for s in 0..=SEGMENTS {
        let base = offset;
        let mut seg = Segment::new(base, 0);
        let limit = if s == SEGMENTS {
            1024 * 1024
        } else {
            SEGMENT_BYTES
        };
        let value = vec![b'v'; VALUE_LEN];
        while (seg.log.len() as u64) + (VALUE_LEN as u64) + 64 <= limit {
            seg.push(offset, offset as i64, Some(b"key"), &value);
            offset += 1;
        }
        let (log, index) = (seg.log, seg.index);
        if s < SEGMENTS {
            sealed_bytes += log.len() as u64;
        } else {
            active_base = base;
        }
        let mut f = fs::File::create(part.join(log_file_name(base))).unwrap();
        f.write_all(&log).unwrap();
        fs::write(part.join(index_file_name(base)), &index).unwrap();
    }
    let target = resolve(&data).unwrap();
    let before = rchar();
    let t = Instant::now();
    let plan = recovery::plan(&target).unwrap();
    let elapsed = t.elapsed();
    let read = rchar() - before;
    assert_eq!(plan.action_count(), 0);
    assert_eq!(plan.partitions[0].next_offset, offset);
    // The active segment is read in full (and its tail checked); the rest is what
    // the sealed segments cost.
    let active_bytes = fs::metadata(part.join(log_file_name(active_base)))
        .unwrap()
        .len();
    let sealed_read = read.saturating_sub(active_bytes);
    println!(
        "plan: {SEGMENTS} sealed segments ({} MiB) + active segment ({} KiB): read {read} bytes in {elapsed:?}; \
         sealed segments: {sealed_read} bytes, {:.1} KiB per segment",
        sealed_bytes / (1024 * 1024),
        active_bytes / 1024,
        sealed_read as f64 / SEGMENTS as f64 / 1024.0,
    );
    assert!(
        sealed_read / SEGMENTS < 64 * 1024,
        "a trusted sealed segment should cost a few KiB, not {} bytes",
        sealed_read / SEGMENTS
    );
    // Far less than the data: the sealed segments are trusted by their indexes.
    assert!(read < sealed_bytes / 20, "read {read} of {sealed_bytes}");
}
