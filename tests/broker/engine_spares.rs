//! Spare segment files (docs/FORMAT.md, Spares) through the engine: retention hands
//! segments to the node's pool, rolls take them, startup re-stamps them, and a failure
//! at every step of that which writes (the spare maker's creation, rename, directory
//! fsync, header rewrite) leaves a directory that recovers with nothing acknowledged
//! lost.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seglog::engine::broker::{Broker, BrokerOptions, NewRecord};
use seglog::engine::storage::reader::{open_log, read_header};
use seglog::format::decode_record;
use seglog::format::topic::TopicConfig;
use seglog::testkit::storage::{Call, Hook, HookStorage, Op};

use crate::util::storage::real;

/// The pool on, without empty spares made ahead: these tests count the segments
/// retention and compaction return.
fn opts() -> BrokerOptions {
    BrokerOptions {
        spares_per_partition: 4,
        new_spares: 0,
        retention_check_interval: Duration::from_secs(3600),
        ..BrokerOptions::default()
    }
}

fn config() -> TopicConfig {
    TopicConfig {
        segment_bytes: 1024,
        retention_ms: -1,
        retention_bytes: 2048,
        ..TopicConfig::default()
    }
}

fn value(n: u64) -> Vec<u8> {
    let mut v = format!("value-{n}-").into_bytes();
    v.resize(120, b'a' + (n % 26) as u8);
    v
}

/// Produces `count` records numbered from `from`; returns the acknowledged ones as
/// (offset, number), stopping at the first refusal.
fn produce(b: &Broker, from: u64, count: u64) -> Vec<(u64, u64)> {
    let mut acked = Vec::new();
    for n in from..from + count {
        let v = value(n);
        let rec = NewRecord {
            key: None,
            value: &v,
            timestamp_ms: 1,
        };
        match b.produce("t", 0, &[rec]) {
            Ok(r) => acked.push((r.base_offset, n)),
            Err(_) => break,
        }
    }
    acked
}

/// Every record of t/0 from its start, as (offset, value).
fn read_all(b: &Broker) -> Vec<(u64, Vec<u8>)> {
    let (start, _) = b.offsets("t", 0).unwrap();
    let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
    loop {
        let from = out.last().map_or(start, |(o, _)| o + 1);
        let f = b.fetch("t", 0, from, 1 << 20, Duration::ZERO).unwrap();
        let mut got = 0;
        for c in &f.chunks {
            let mut pos = 0;
            while pos < c.bytes.len() {
                let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
                out.push((r.offset, r.value.to_vec()));
                pos += r.encoded_len;
                got += 1;
            }
        }
        if got == 0 {
            return out;
        }
    }
}

fn spares_of(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir.join("spares"))
        .map(|r| r.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// (base_offset, generation) of each spare's header.
fn spare_headers(dir: &Path) -> Vec<(u64, u64)> {
    spare_headers_now(dir).expect("every spare's header decodes")
}

/// [`spare_headers`] beside a running spare maker: `None` while a spare it is making
/// has no header yet (it creates the file, then writes the header).
fn spare_headers_now(dir: &Path) -> Option<Vec<(u64, u64)>> {
    spares_of(dir)
        .iter()
        .map(|p| {
            let (f, len) = open_log(p).ok()?;
            let h = read_header(&f, len).ok()?.ok()?;
            Some((h.base_offset, h.generation))
        })
        .collect()
}

/// Every acknowledged record is read back with its value, in consecutive offsets
/// from the start.
fn assert_acked_kept(b: &Broker, acked: &[(u64, u64)]) {
    let (start, _) = b.offsets("t", 0).unwrap();
    let all = read_all(b);
    for w in all.windows(2) {
        assert_eq!(w[1].0, w[0].0 + 1, "offsets not consecutive");
    }
    for (offset, n) in acked.iter().filter(|(o, _)| *o >= start) {
        let got = all.iter().find(|(o, _)| o == offset);
        assert_eq!(
            got.map(|(_, v)| v.clone()),
            Some(value(*n)),
            "acknowledged offset {offset} lost"
        );
    }
}

#[test]
fn retention_fills_the_pool_rolls_take_from_it_and_startup_restamps() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    b.create_topic("t", 1, config()).unwrap();
    let mut acked = produce(&b, 0, 60);
    assert!(b.run_retention().is_empty());
    let s = b.stats();
    assert!(s.spares_returned > 0, "{s:?}");
    let headers = spare_headers(dir.path());
    assert_eq!(headers.len() as u64, s.spares_returned);
    // Rule 1: unassigned, one generation up.
    assert!(headers.iter().all(|h| *h == (u64::MAX, 1)), "{headers:?}");
    let d = b.describe_topic("t").unwrap();
    assert_eq!(d.partitions[0].spares, s.spares_returned);
    // The next rolls take them: the files leave the pool.
    acked.extend(produce(&b, 60, 30));
    let s2 = b.stats();
    assert!(s2.spares_taken > 0, "{s2:?}");
    assert_eq!(
        spare_headers(dir.path()).len() as u64,
        s2.spares_returned - s2.spares_taken
    );
    assert_acked_kept(&b, &acked);
    // A reused segment's records carry its generation.
    let gens: Vec<u64> = b
        .fetch(
            "t",
            0,
            b.offsets("t", 0).unwrap().0,
            1 << 20,
            Duration::ZERO,
        )
        .unwrap()
        .chunks
        .iter()
        .map(|c| c.generation)
        .collect();
    assert!(!gens.is_empty());
    // More retention returns more; then a restart re-stamps every spare (rule 2).
    assert!(b.run_retention().is_empty());
    let before = spare_headers(dir.path());
    assert!(!before.is_empty());
    b.shutdown().unwrap();
    drop(b);
    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    let after = spare_headers(dir.path());
    assert_eq!(after.len(), before.len());
    for (a, bf) in after.iter().zip(&before) {
        assert_eq!(*a, (u64::MAX, bf.1 + 1), "re-stamped at startup");
    }
    assert_acked_kept(&b, &acked);
    acked.extend(produce(&b, 90, 30));
    assert_acked_kept(&b, &acked);
    b.shutdown().unwrap();
}

#[test]
fn the_pool_is_capped_per_partition_and_off_at_zero() {
    let dir = tempfile::tempdir().unwrap();
    let capped = BrokerOptions {
        spares_per_partition: 1,
        ..opts()
    };
    let b = Broker::open(dir.path(), real(), capped).unwrap();
    let big = TopicConfig {
        retention_bytes: 0,
        ..config()
    };
    b.create_topic("t", 1, big).unwrap();
    produce(&b, 0, 60);
    assert!(b.run_retention().is_empty());
    assert_eq!(spare_headers(dir.path()).len(), 1, "one per partition");
    assert_eq!(b.stats().spares_returned, 1);
    b.shutdown().unwrap();
    drop(b);
    // Started again with the pool off: nothing is left in a pool nobody uses.
    let zero = BrokerOptions {
        spares_per_partition: 0,
        ..opts()
    };
    let b = Broker::open(dir.path(), real(), zero).unwrap();
    assert!(!dir.path().join("spares").exists());
    assert!(
        b.startup_report()
            .iter()
            .any(|l| l.contains("spare pool is off") && l.contains("1 file(s)")),
        "{:?}",
        b.startup_report()
    );
    b.shutdown().unwrap();
    drop(b);
    let off = tempfile::tempdir().unwrap();
    let b = Broker::open(off.path(), real(), BrokerOptions::default()).unwrap();
    b.create_topic("t", 1, big_config()).unwrap();
    produce(&b, 0, 60);
    assert!(b.run_retention().is_empty());
    assert_eq!(b.stats().spares_returned, 0);
    assert!(!off.path().join("spares").exists());
    b.shutdown().unwrap();
}

/// The cap follows the node's partitions: once a topic is deleted, the next cleanup
/// round deletes the spares past the new cap (they were kept for good otherwise).
#[test]
fn a_deleted_topic_takes_its_share_of_the_pool_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let capped = BrokerOptions {
        spares_per_partition: 2,
        ..opts()
    };
    let b = Broker::open(dir.path(), real(), capped).unwrap();
    let big = TopicConfig {
        retention_bytes: 0,
        ..config()
    };
    b.create_topic("t", 2, big).unwrap();
    produce(&b, 0, 60);
    assert!(b.run_retention().is_empty());
    assert_eq!(spares_of(dir.path()).len(), 4, "two partitions' worth");
    b.create_topic("other", 1, TopicConfig::default()).unwrap();
    b.delete_topic("t").unwrap();
    assert!(b.run_retention().is_empty());
    assert_eq!(
        spares_of(dir.path()).len(),
        2,
        "one partition's worth is left"
    );
    b.shutdown().unwrap();
}

fn big_config() -> TopicConfig {
    TopicConfig {
        retention_bytes: 0,
        ..config()
    }
}

/// Fails the `n`-th call (1-based) of the spare steps that write: a rename, a
/// directory fsync, or a write or fsync of a file in `spares/` or renamed from there;
/// with `count_creates`, a file's creation in `spares/` too.
#[derive(Debug, Default)]
struct FailSpareStep {
    armed: AtomicBool,
    /// Also count file creations in `spares/` (the spare maker's first step).
    count_creates: AtomicBool,
    n: AtomicU64,
    seen: AtomicU64,
    failed: AtomicBool,
}

impl Hook for FailSpareStep {
    fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
        if !self.armed.load(Ordering::SeqCst) {
            return None;
        }
        let in_spares = op.path.components().any(|c| c.as_os_str() == "spares");
        let counted = match op.call {
            Call::Rename { to } => in_spares || to.components().any(|c| c.as_os_str() == "spares"),
            Call::SyncDir => true,
            Call::WriteAt { .. } | Call::SyncAll => in_spares,
            Call::Create => in_spares && self.count_creates.load(Ordering::SeqCst),
            _ => false,
        };
        if !counted {
            return None;
        }
        let k = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        if k == self.n.load(Ordering::SeqCst) {
            self.failed.store(true, Ordering::SeqCst);
            return Some(Err(io::Error::other(format!(
                "injected failure of spare step {k} ({:?} {})",
                op.kind(),
                op.path.display()
            ))));
        }
        None
    }
}

/// Restarts a broker on `dir` on real storage, without the spare maker (so that
/// `spares/` holds still): every acknowledged record is there, every spare is
/// unassigned, and the partition takes writes (added to `acked`). Stops it again.
fn restart_keeps_every_acknowledged_record(dir: &Path, acked: &mut Vec<(u64, u64)>, step: u64) {
    let b = Broker::open(dir, real(), opts()).unwrap();
    assert_acked_kept(&b, acked);
    assert!(
        spare_headers(dir).iter().all(|h| h.0 == u64::MAX),
        "step {step}: every spare unassigned"
    );
    let more = produce(&b, 1000, 8);
    assert_eq!(more.len(), 8, "step {step}: the partition takes writes");
    acked.extend(more);
    assert_acked_kept(&b, acked);
    b.shutdown().unwrap();
}

#[test]
fn a_failure_at_every_spare_step_recovers_with_nothing_acknowledged_lost() {
    let mut n = 1;
    loop {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(FailSpareStep::default());
        hook.n.store(n, Ordering::SeqCst);
        let storage = Arc::new(HookStorage::shared(real(), hook.clone()));
        let b = Broker::open(dir.path(), storage, opts()).unwrap();
        b.create_topic("t", 1, config()).unwrap();
        let mut acked = produce(&b, 0, 30);
        assert_eq!(acked.len(), 30);
        hook.armed.store(true, Ordering::SeqCst);
        // Entry (retention), then rolls that take spares, then entry again.
        let _ = b.run_retention();
        acked.extend(produce(&b, 40, 14));
        let _ = b.run_retention();
        acked.extend(produce(&b, 70, 4));
        hook.armed.store(false, Ordering::SeqCst);
        let failed = hook.failed.load(Ordering::SeqCst);
        let _ = b.shutdown();
        drop(b);
        // Restart on real storage: recovery, re-stamp, then every acknowledged
        // record is there and the partition takes writes.
        restart_keeps_every_acknowledged_record(dir.path(), &mut acked, n);
        if !failed {
            // Every step was failed once.
            assert!(n > 10, "the workload made only {} spare steps", n - 1);
            break;
        }
        n += 1;
    }
}

/// A broker on `dir` whose t/0 rolled onto a spare: 40 records, retention (which
/// returns segments to the pool), then one record at a time until a roll takes a
/// spare. Returns the broker, the acknowledged records and the next record number.
fn rolled_onto_a_spare(dir: &Path) -> (Arc<Broker>, Vec<(u64, u64)>, u64) {
    let b = Broker::open(dir, real(), opts()).unwrap();
    b.create_topic("t", 1, config()).unwrap();
    let mut acked = produce(&b, 0, 40);
    assert!(b.run_retention().is_empty());
    let mut n = 40;
    while b.stats().spares_taken == 0 {
        acked.extend(produce(&b, n, 1));
        n += 1;
    }
    (b, acked, n)
}

#[test]
fn verify_and_dump_name_a_reused_files_stale_records_by_generation() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut acked, n) = rolled_onto_a_spare(dir.path());
    // A record in the reused file.
    acked.extend(produce(&b, n, 1));
    b.shutdown().unwrap();
    drop(b);
    let data = dir.path().to_str().unwrap();
    let (code, out, err) = crate::util::bin::run(&["verify", data], dir.path());
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("records of older generation 0"),
        "verify names the stale records: {out}"
    );
    let (code, out, err) = crate::util::bin::run(&["dump", "--json", data], dir.path());
    assert_eq!(code, 0, "{out}{err}");
    let stale: Vec<serde_json::Value> = crate::util::bin::json_lines(&out)
        .into_iter()
        .filter(|v| v["type"] == "problem" && v["kind"] == "stale_tail")
        .collect();
    assert_eq!(stale.len(), 1, "dump names the stale records: {out}");
    assert!(
        stale[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("older generation 0")),
        "{stale:?}"
    );
    // Recovery cuts at the first record of the older generation; nothing acknowledged
    // is lost.
    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    assert_acked_kept(&b, &acked);
    b.shutdown().unwrap();
}

#[test]
fn a_clean_stop_leaves_a_reused_segment_that_verifies_clean() {
    // Records of other sizes than the file's earlier life: the data ends inside an
    // older record, which a check could not tell from a torn write. The clean stop
    // cuts those bytes, so the stopped directory verifies clean (exit 0), and the
    // broker opens on it with every acknowledged record.
    let dir = tempfile::tempdir().unwrap();
    let (b, acked, _) = rolled_onto_a_spare(dir.path());
    let odd = |b: &Broker, n: u64| {
        let v = vec![b'x'; 20 + (n as usize * 37) % 61];
        let rec = NewRecord {
            key: None,
            value: &v,
            timestamp_ms: 1,
        };
        b.produce("t", 0, &[rec]).unwrap().base_offset
    };
    let mut odd_offsets = Vec::new();
    for k in 0..3 {
        odd_offsets.push(odd(&b, k));
    }
    b.shutdown().unwrap();
    drop(b);
    let data = dir.path().to_str().unwrap();
    let (code, out, err) = crate::util::bin::run(&["verify", data], dir.path());
    assert_eq!(code, 0, "{out}{err}");
    let b = Broker::open(dir.path(), real(), opts()).unwrap();
    assert_acked_kept(&b, &acked);
    let end = b.offsets("t", 0).unwrap().1;
    assert_eq!(end, odd_offsets[2] + 1);
    b.shutdown().unwrap();
}

fn compact_config() -> TopicConfig {
    TopicConfig {
        cleanup_policy: seglog::format::topic::CleanupPolicy::Compact,
        retention_bytes: -1,
        ..config()
    }
}

/// Produces `count` records numbered from `from`, keyed by number modulo 5; returns
/// the acknowledged ones as (offset, number), stopping at the first refusal.
fn produce_keyed(b: &Broker, from: u64, count: u64) -> Vec<(u64, u64)> {
    let mut acked = Vec::new();
    for n in from..from + count {
        let (k, v) = (format!("key-{}", n % 5), value(n));
        let rec = NewRecord {
            key: Some(k.as_bytes()),
            value: &v,
            timestamp_ms: 1,
        };
        match b.produce("t", 0, &[rec]) {
            Ok(r) => acked.push((r.base_offset, n)),
            Err(_) => break,
        }
    }
    acked
}

/// After compaction: every record read at an acknowledged offset is the one
/// acknowledged there (one whose produce failed may be there too: it was written,
/// only not acknowledged), and each key's newest acknowledged record is there.
fn assert_compacted_kept(b: &Broker, acked: &[(u64, u64)], step: u64) {
    let all = read_all(b);
    for (offset, v) in &all {
        match acked.iter().find(|(o, _)| o == offset) {
            Some((_, n)) => assert_eq!(&value(*n), v, "step {step}: offset {offset}"),
            None => {
                let n: Option<u64> = std::str::from_utf8(v)
                    .ok()
                    .and_then(|t| t.split('-').nth(1)?.parse().ok());
                assert_eq!(
                    n.map(value).as_ref(),
                    Some(v),
                    "step {step}: offset {offset}"
                );
            }
        }
    }
    for key in 0..5 {
        if let Some((offset, _)) = acked.iter().rfind(|(_, n)| n % 5 == key) {
            assert!(
                all.iter().any(|(o, _)| o == offset),
                "step {step}: key {key}'s newest record (offset {offset}) lost"
            );
        }
    }
}

/// Compaction in the broker hands the segments it replaces to the pool (the swap
/// moves their logs to `spares/` once its marker is durable; their headers are
/// rewritten once the swap is durable), a roll takes them, and a failure at every
/// step that writes leaves a directory that recovers with every key's newest record,
/// nothing invented, and every spare unassigned.
#[test]
fn compaction_feeds_the_pool_and_a_failure_at_every_step_loses_nothing() {
    let mut n = 1;
    loop {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(FailSpareStep::default());
        hook.n.store(n, Ordering::SeqCst);
        let storage = Arc::new(HookStorage::shared(real(), hook.clone()));
        let b = Broker::open(dir.path(), storage, opts()).unwrap();
        b.create_topic("t", 1, compact_config()).unwrap();
        let mut acked = produce_keyed(&b, 0, 40);
        assert_eq!(acked.len(), 40);
        hook.armed.store(true, Ordering::SeqCst);
        let warnings = b.run_compaction();
        let returned = b.stats().spares_returned;
        acked.extend(produce_keyed(&b, 40, 20));
        let taken = b.stats().spares_taken;
        hook.armed.store(false, Ordering::SeqCst);
        let failed = hook.failed.load(Ordering::SeqCst);
        if !failed {
            assert!(warnings.is_empty(), "{warnings:?}");
            assert!(returned > 0, "the replaced segments entered the pool");
            assert!(taken > 0, "rolls took them");
        }
        let _ = b.shutdown();
        drop(b);
        let b = Broker::open(dir.path(), real(), opts()).unwrap();
        assert_compacted_kept(&b, &acked, n);
        assert!(
            spare_headers(dir.path()).iter().all(|h| h.0 == u64::MAX),
            "step {n}: every spare unassigned"
        );
        let more = produce_keyed(&b, 1000, 8);
        assert_eq!(more.len(), 8, "step {n}: the partition takes writes");
        acked.extend(more);
        assert_compacted_kept(&b, &acked, n);
        b.shutdown().unwrap();
        if !failed {
            assert!(n > 5, "the workload made only {} steps", n - 1);
            break;
        }
        n += 1;
    }
}

/// Two entries into the pool at once (retention's and a compaction's run on
/// different threads) never pass its cap together: the second, made while the
/// first is between its rename and its listing, finds the pool's last place taken
/// and leaves its file to the caller, which deletes it.
#[test]
fn entries_at_once_never_pass_the_pool_cap() {
    use seglog::engine::partition::spares::SparePool;
    use seglog::format::SegmentHeader;
    use seglog::testkit::storage::OpKind;
    use std::sync::{Mutex, OnceLock};

    struct SecondEntry {
        pool: OnceLock<Arc<SparePool>>,
        dir: PathBuf,
        done: AtomicBool,
        entered: Mutex<Option<bool>>,
    }
    impl Hook for SecondEntry {
        fn before(&self, op: &Op<'_>) -> Option<io::Result<()>> {
            // The first entry's directory fsync: its file is renamed, not yet listed.
            if op.kind() == OpKind::SyncDir && !self.done.swap(true, Ordering::SeqCst) {
                let pool = self.pool.get().unwrap();
                let second = self.dir.join("00000000000000000010.log");
                let entered = pool
                    .enter(op.storage, &self.dir, &second, 0, ("t".to_string(), 0))
                    .unwrap();
                *self.entered.lock().unwrap() = Some(entered);
            }
            None
        }
    }

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics/t/0");
    fs::create_dir_all(&dir).unwrap();
    fs::create_dir_all(data.path().join("spares")).unwrap();
    let header = SegmentHeader {
        base_offset: 0,
        generation: 0,
        flags: 0,
    }
    .encode();
    let first = dir.join("00000000000000000000.log");
    fs::write(&first, header).unwrap();
    fs::write(dir.join("00000000000000000010.log"), header).unwrap();
    let pool = Arc::new(SparePool::default());
    pool.configure(data.path(), 1);
    pool.set_partitions(1);
    let hook = Arc::new(SecondEntry {
        pool: OnceLock::new(),
        dir: dir.clone(),
        done: AtomicBool::new(false),
        entered: Mutex::new(None),
    });
    let _ = hook.pool.set(Arc::clone(&pool));
    let storage = HookStorage::shared(real(), hook.clone());
    let entered = pool
        .enter(&storage, &dir, &first, 0, ("t".to_string(), 0))
        .unwrap();
    assert!(entered, "the first entry takes the pool's one place");
    assert_eq!(
        *hook.entered.lock().unwrap(),
        Some(false),
        "the second entry, made meanwhile, is refused"
    );
    assert_eq!(
        pool.len(),
        1,
        "at most 1 spare (1 per partition, 1 partition)"
    );
    assert_eq!(pool.from_partition("t", 0), 1);
    assert!(dir.join("00000000000000000010.log").exists());
    assert_eq!(fs::read_dir(data.path().join("spares")).unwrap().count(), 1);
}

/// Waits (at most 20 s) until `DATA/spares/` holds exactly `want` files.
fn wait_for_spares(dir: &Path, want: usize) -> Vec<(u64, u64)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let headers = spare_headers_now(dir).unwrap_or_default();
        if headers.len() == want {
            return headers;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "spares/ holds {headers:?}, not {want} spares"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn empty_spares_are_made_ahead_taken_by_rolls_and_give_way_to_returned_segments() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOptions {
        new_spares: 2,
        ..opts()
    };
    let b = Broker::open(dir.path(), real(), opts.clone()).unwrap();
    // No partition yet: the cap is 0, and nothing is made.
    std::thread::sleep(Duration::from_millis(50));
    assert!(spare_headers(dir.path()).is_empty());
    // One partition: a cap of 4, and 2 empty spares made at once (not at the next
    // cleaner round), each an unassigned spare of generation 0 holding no record.
    b.create_topic("t", 1, config()).unwrap();
    let made = wait_for_spares(dir.path(), 2);
    assert!(made.iter().all(|h| *h == (u64::MAX, 0)), "{made:?}");
    assert!(spares_of(dir.path())
        .iter()
        .all(|p| fs::metadata(p).unwrap().len() == 32));
    // Rolls take them (records of generation 0, in files renamed into place) and the
    // maker makes more.
    let mut acked = produce(&b, 0, 60);
    assert_eq!(acked.len(), 60);
    let s = b.stats();
    assert!(s.rolls >= 5 && s.spares_taken >= 5, "{s:?}");
    assert_acked_kept(&b, &acked);
    wait_for_spares(dir.path(), 2);
    // Retention returns more segments than the pool has free places: the empty
    // spares give way, and the pool holds 4 reused files, none empty.
    assert!(b.run_retention().is_empty());
    let s = b.stats();
    assert!(s.spares_returned >= 4, "{s:?}");
    let headers = spare_headers(dir.path());
    assert_eq!(headers.len(), 4, "{headers:?}");
    assert!(headers.iter().all(|h| *h == (u64::MAX, 1)), "{headers:?}");
    // The next roll takes a reused file before an empty one would be made.
    acked.extend(produce(&b, 60, 20));
    assert_acked_kept(&b, &acked);
    b.shutdown().unwrap();
    drop(b);
    // verify calls the directory clean (spares are information at most), and a
    // restart re-stamps every spare and keeps every record.
    let data = dir.path().to_str().unwrap();
    let (code, out, err) = crate::util::bin::run(&["verify", data], dir.path());
    assert_eq!(code, 0, "{out}{err}");
    let b = Broker::open(dir.path(), real(), opts).unwrap();
    assert_acked_kept(&b, &acked);
    acked.extend(produce(&b, 80, 20));
    assert_acked_kept(&b, &acked);
    b.shutdown().unwrap();
}

/// Waits up to `ms` for `DATA/spares/` to hold `want` files, or for `hook` to have
/// failed a step; returns whether the spares are there.
fn spares_or_failure(dir: &Path, want: usize, hook: &FailSpareStep, ms: u64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_millis(ms);
    while std::time::Instant::now() < deadline {
        if spares_of(dir).len() >= want {
            return true;
        }
        if hook.failed.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// The spare maker's steps (create, header write, fsync, directory fsync) and the
/// roll commit's placing of an empty spare (rename, directory fsyncs), each failed
/// once in turn: the broker goes on or stops, and a restart on real storage keeps
/// every acknowledged record, leaves only unassigned spares, verifies clean and
/// takes writes.
#[test]
fn a_failure_at_every_step_of_making_and_placing_an_empty_spare_loses_nothing() {
    let making = BrokerOptions {
        new_spares: 2,
        ..opts()
    };
    let mut n = 1;
    loop {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(FailSpareStep::default());
        hook.n.store(n, Ordering::SeqCst);
        // Creations in `spares/` count too: they are the maker's first step.
        hook.count_creates.store(true, Ordering::SeqCst);
        let storage = Arc::new(HookStorage::shared(real(), hook.clone()));
        let b = Broker::open(dir.path(), storage, making.clone()).unwrap();
        b.create_topic("t", 1, big_config()).unwrap();
        hook.armed.store(true, Ordering::SeqCst);
        spares_or_failure(dir.path(), 2, &hook, 2000);
        // Rolls take the empty spares (or create their files when none is ready);
        // the maker makes more meanwhile.
        let mut acked = produce(&b, 0, 40);
        spares_or_failure(dir.path(), 2, &hook, 300);
        acked.extend(produce(&b, 100, 20));
        hook.armed.store(false, Ordering::SeqCst);
        let failed = hook.failed.load(Ordering::SeqCst);
        let _ = b.shutdown();
        drop(b);
        restart_keeps_every_acknowledged_record(dir.path(), &mut acked, n);
        let data = dir.path().to_str().unwrap();
        let (code, out, err) = crate::util::bin::run(&["verify", data], dir.path());
        assert_eq!(code, 0, "step {n}: {out}{err}");
        if !failed {
            assert!(n > 8, "the workload made only {} spare steps", n - 1);
            break;
        }
        n += 1;
    }
}
