//! Compaction: a seeded model test against a plain in-memory model, fault injection
//! on every mutation and every sync of the swap, and the `seglog compact` command.
//! Its benchmark is `compaction::` in the bench binary.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use seglog::engine::maintenance::check::{check_partition, CheckMode};
use seglog::engine::maintenance::compaction::{
    compact_partition, finish_compaction_marker, sealed_segments_unchanged, CompactionError,
    CompactionOptions, CompactionReport,
};
use seglog::engine::storage::io::{RealStorage, Storage};
use seglog::engine::storage::layout::{list_partition, resolve, PartitionRef};
use seglog::engine::storage::lock::DirLock;
use seglog::engine::storage::reader::{open_log, read_header, scan_segment};
use seglog::format::marker::CompactionMarker;
use seglog::format::names::{log_file_name, COMPACTION_MARKER};
use seglog::format::topic::{CleanupPolicy, TopicConfig, TopicMeta};
use seglog::testkit::storage::{FailOn, FailingStorage};

use crate::util::bin::seglog;
use crate::util::build::{segment, Rec};
use crate::util::fs::{copy_tree, files};
use crate::util::rng::{Rng, RngExt};

const NOW_MS: i64 = 1_700_000_000_000;

fn is_tombstone(r: &Rec) -> bool {
    r.key.is_some() && r.value.is_empty()
}

/// Writes one segment (log with a generation-`generation` header, and its rule-built
/// index) named after `base`.
fn write_segment(dir: &Path, base: u64, generation: u64, records: &[Rec]) {
    segment(base, generation, records).write(dir);
}

/// Every record of every segment in the partition, in file order.
fn read_partition(dir: &Path) -> Vec<Rec> {
    let listing = list_partition(dir).unwrap();
    let mut out = Vec::new();
    for seg in &listing.segments {
        let (file, len) = open_log(&seg.log).unwrap();
        let header = read_header(&file, len).unwrap().unwrap();
        assert_eq!(header.base_offset, seg.base_offset);
        scan_segment(&file, &header, len, |_, r| {
            out.push(Rec {
                offset: r.offset,
                timestamp_ms: r.timestamp_ms,
                key: r.key.map(<[u8]>::to_vec),
                value: r.value.to_vec(),
            });
        })
        .unwrap();
    }
    out
}

fn partition_ref(dir: &Path, segment_bytes: u64) -> PartitionRef {
    PartitionRef {
        dir: dir.to_path_buf(),
        topic: None,
        partition: None,
        config: TopicConfig {
            segment_bytes,
            cleanup_policy: CleanupPolicy::Compact,
            ..TopicConfig::default()
        },
        only_segment: None,
    }
}

/// A generated partition: sealed segments, then the active one.
struct Case {
    sealed: Vec<(u64, Vec<Rec>)>,
    active: (u64, Vec<Rec>),
    retention_ms: i64,
    segment_bytes: u64,
}

impl Case {
    fn generate(seed: u64) -> Case {
        Case::generate_sized(seed, 12, 40)
    }

    /// Up to `max_keys` distinct keys, up to `max_records` records per segment.
    fn generate_sized(seed: u64, max_keys: u64, max_records: u64) -> Case {
        let mut rng = Rng::new(seed);
        let keys = 1 + rng.below(max_keys);
        let retention_ms = 1 + rng.below(100_000) as i64;
        let segment_bytes = 1024 + rng.below(3000);
        let mut offset = rng.below(1000);
        let mut segments = Vec::new();
        let n_segments = 2 + rng.below(5);
        for _ in 0..n_segments {
            // Segments tile: each base is the previous segment's last offset + 1; the
            // first record may lie above it, as in a compaction output.
            let base = offset;
            if rng.chance(20) {
                offset += rng.below(10);
            }
            let mut recs = Vec::new();
            // The active segment may be empty; sealed ones hold at least one record.
            for i in 0..=rng.below(max_records) {
                if i > 0 || !recs.is_empty() {
                    // Gaps, as a log that was compacted before has.
                    offset += if rng.chance(10) { 1 + rng.below(5) } else { 1 };
                }
                let keyed = !rng.chance(20);
                let key = keyed.then(|| format!("key-{}", rng.below(keys)).into_bytes());
                let tombstone = keyed && rng.chance(20);
                let value = if tombstone {
                    Vec::new()
                } else {
                    let max = if rng.chance(5) { 1500 } else { 60 };
                    let len = 1 + rng.below(max) as usize;
                    (0..len).map(|_| b'a' + rng.below(26) as u8).collect()
                };
                recs.push(Rec {
                    offset,
                    timestamp_ms: NOW_MS - rng.below(2 * retention_ms as u64 + 2) as i64,
                    key,
                    value,
                });
            }
            offset += 1;
            segments.push((base, recs));
        }
        let mut active = segments.pop().unwrap_or_default();
        if rng.chance(30) {
            active.1.clear();
        }
        Case {
            sealed: segments,
            active,
            retention_ms,
            segment_bytes,
        }
    }

    fn write(&self, dir: &Path, seed: u64) {
        let mut rng = Rng::new(seed ^ 0xABCD);
        for (base, recs) in &self.sealed {
            // Some files are reused spares of a later generation.
            let generation = if rng.chance(30) { 1 + rng.below(5) } else { 0 };
            write_segment(dir, *base, generation, recs);
        }
        write_segment(dir, self.active.0, 0, &self.active.1);
    }

    fn all(&self) -> Vec<Rec> {
        let mut v: Vec<Rec> = self.sealed.iter().flat_map(|(_, r)| r.clone()).collect();
        v.extend(self.active.1.iter().cloned());
        v
    }

    /// The model: what survives, and the report's counts. The last sealed record
    /// always survives, whatever it is, so the segments still tile.
    fn expected(&self) -> (Vec<Rec>, CompactionReport) {
        let sealed: Vec<&Rec> = self.sealed.iter().flat_map(|(_, r)| r.iter()).collect();
        let last_sealed = sealed.last().map(|r| r.offset);
        let mut newest: HashMap<&[u8], u64> = HashMap::new();
        for r in &sealed {
            if let Some(k) = &r.key {
                newest.insert(k, r.offset);
            }
        }
        let expired = |r: &Rec| is_tombstone(r) && NOW_MS - r.timestamp_ms > self.retention_ms;
        let mut kept = Vec::new();
        let mut report = CompactionReport {
            records_read: sealed.len() as u64,
            keys: newest.len() as u64,
            ..CompactionReport::default()
        };
        for r in &sealed {
            let keep = Some(r.offset) == last_sealed
                || match &r.key {
                    None => true,
                    Some(k) => newest[k.as_slice()] == r.offset && !expired(r),
                };
            if keep {
                kept.push((*r).clone());
            } else {
                report.records_dropped += 1;
                report.tombstones_dropped += u64::from(is_tombstone(r));
            }
        }
        report.records_kept = kept.len() as u64;
        report.skipped = report.records_dropped == 0;
        kept.extend(self.active.1.iter().cloned());
        (kept, report)
    }

    fn options(&self) -> CompactionOptions {
        CompactionOptions {
            now_ms: NOW_MS,
            tombstone_retention_ms: self.retention_ms,
            segment_bytes: self.segment_bytes,
            dry_run: false,
        }
    }
}

fn offline_compact(
    storage: &dyn Storage,
    p: &PartitionRef,
    opts: &CompactionOptions,
    published: &mut Vec<Vec<u64>>,
) -> Result<CompactionReport, CompactionError> {
    let dir = p.dir.clone();
    compact_partition(
        storage,
        p,
        opts,
        &|read| sealed_segments_unchanged(&dir, read),
        &mut |new| published.push(new.to_vec()),
    )
}

fn assert_clean(dir: &Path, segment_bytes: u64, what: &str) {
    let check = check_partition(&partition_ref(dir, segment_bytes), CheckMode::Full).unwrap();
    assert_eq!(
        check.severity(),
        None,
        "{what}: {:#?}",
        check.all_problems().collect::<Vec<_>>()
    );
}

/// Every segment's base is the previous segment's last offset + 1 (an empty segment
/// passes its base on), and its records lie at or above its base.
fn assert_tiles(dir: &Path, what: &str) {
    let listing = list_partition(dir).unwrap();
    let mut next_base: Option<u64> = None;
    for seg in &listing.segments {
        if let Some(want) = next_base {
            assert_eq!(
                seg.base_offset,
                want,
                "{what}: {} does not tile",
                seg.log.display()
            );
        }
        let (file, len) = open_log(&seg.log).unwrap();
        let header = read_header(&file, len).unwrap().unwrap();
        let scan = scan_segment(&file, &header, len, |_, _| {}).unwrap();
        if let Some(first) = scan.first_offset {
            assert!(
                first >= seg.base_offset,
                "{what}: {} starts below its base",
                seg.log.display()
            );
        }
        next_base = Some(scan.last_offset.map_or(seg.base_offset, |l| l + 1));
    }
}

/// The newest record of every key is still there, unless it is an expired tombstone
/// of a sealed segment that was not the last sealed record.
fn assert_newest_kept(case: &Case, dir: &Path, what: &str) {
    let left = read_partition(dir);
    let mut newest: BTreeMap<Vec<u8>, &Rec> = BTreeMap::new();
    for r in case.sealed.iter().flat_map(|(_, r)| r.iter()) {
        if let Some(k) = &r.key {
            newest.insert(k.clone(), r);
        }
    }
    let last_sealed = case
        .sealed
        .iter()
        .flat_map(|(_, r)| r.iter())
        .last()
        .map(|r| r.offset);
    for (k, r) in newest {
        let expired = is_tombstone(r) && NOW_MS - r.timestamp_ms > case.retention_ms;
        if expired && Some(r.offset) != last_sealed {
            assert!(!left.contains(r), "{what}: expired tombstone of {k:?} kept");
        } else {
            assert!(
                left.contains(r),
                "{what}: newest record of key {k:?} (offset {}) lost",
                r.offset
            );
        }
    }
}

fn model_case(seed: u64) {
    model_case_of(seed, Case::generate(seed));
}

/// A scratch directory on tmpfs when there is one: the model tests fsync thousands
/// of small files, which is slow on a shared disk and proves nothing about the model
/// (the crash-image test covers durability).
fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

fn model_case_of(seed: u64, case: Case) {
    let tmp = scratch_dir();
    let dir = tmp.path();
    case.write(dir, seed);
    let p = partition_ref(dir, case.segment_bytes);
    let (expected, want) = case.expected();

    // Dry run: the same counts, nothing written.
    let before = files(dir);
    let mut opts = case.options();
    opts.dry_run = true;
    let mut published = Vec::new();
    let dry = offline_compact(&RealStorage, &p, &opts, &mut published).unwrap();
    assert_eq!(files(dir), before, "dry run changed the directory");
    assert!(published.is_empty());

    let report = offline_compact(&RealStorage, &p, &case.options(), &mut published).unwrap();
    for r in [&dry, &report] {
        assert_eq!(
            (
                r.records_read,
                r.records_kept,
                r.records_dropped,
                r.tombstones_dropped,
                r.keys,
                r.skipped
            ),
            (
                want.records_read,
                want.records_kept,
                want.records_dropped,
                want.tombstones_dropped,
                want.keys,
                want.skipped
            ),
        );
    }
    assert_eq!(
        (dry.bytes_after, dry.segments_after, &dry.new),
        (report.bytes_after, report.segments_after, &report.new)
    );
    assert_eq!(read_partition(dir), expected, "surviving records");
    assert_clean(dir, case.segment_bytes, "after compaction");
    assert_tiles(dir, "after compaction");
    assert_newest_kept(&case, dir, "after compaction");
    let listing = list_partition(dir).unwrap();
    assert!(listing.temp_files.is_empty() && listing.marker.is_none());
    let bases: Vec<u64> = listing.segments.iter().map(|s| s.base_offset).collect();
    if report.skipped {
        assert!(published.is_empty());
        assert_eq!(files(dir), before, "a skipped run changed the directory");
    } else {
        assert_eq!(published, vec![report.new.clone()]);
        let mut want_bases = report.new.clone();
        want_bases.push(case.active.0);
        assert_eq!(bases, want_bases);
        // The partition's start offset does not move: the last sealed record always
        // survives.
        assert!(report.records_kept > 0);
        assert_eq!(bases[0], case.sealed[0].0);
        let sealed_bytes: u64 = listing
            .segments
            .iter()
            .take(listing.segments.len() - 1)
            .map(|s| {
                let len = fs::metadata(&s.log).unwrap().len();
                assert!(
                    len <= case.segment_bytes || read_partition_one(&s.log) == 1,
                    "segment {} is {len} bytes, over {}",
                    s.log.display(),
                    case.segment_bytes
                );
                len
            })
            .sum();
        assert_eq!(sealed_bytes, report.bytes_after);
    }
    // Compacting again drops nothing.
    let again = offline_compact(&RealStorage, &p, &case.options(), &mut Vec::new()).unwrap();
    assert!(again.skipped, "second run: {again:?}");
    assert_eq!(read_partition(dir), expected);
    assert_tiles(dir, "after the second run");
}

fn read_partition_one(log: &Path) -> u64 {
    let (file, len) = open_log(log).unwrap();
    let header = read_header(&file, len).unwrap().unwrap();
    scan_segment(&file, &header, len, |_, _| {})
        .unwrap()
        .records
}

#[test]
fn model_test_many_seeds() {
    let seeds: Vec<u64> = match std::env::var("SEGLOG_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (0..1000).collect(),
    };
    for seed in seeds {
        if std::panic::catch_unwind(|| model_case(seed)).is_err() {
            panic!("model test failed for seed {seed} (rerun with SEGLOG_SEED={seed})");
        }
    }
}

#[test]
fn model_test_thousands_of_keys() {
    // Enough keys for the key table to grow several times.
    let mut most_keys = 0;
    for seed in 1000..1006 {
        let mut case = Case::generate_sized(seed, 20_000, 4000);
        // Outputs of tens of KiB: a dozen segments rather than hundreds.
        case.segment_bytes *= 16;
        most_keys = most_keys.max(case.expected().1.keys);
        if std::panic::catch_unwind(|| model_case_of(seed, case)).is_err() {
            panic!("model test (many keys) failed for seed {seed}");
        }
    }
    assert!(most_keys > 4096, "{most_keys} keys");
}

#[test]
fn keys_in_the_active_segment_are_not_considered() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rec = |offset, key: &str, value: &str| Rec {
        offset,
        timestamp_ms: NOW_MS,
        key: Some(key.into()),
        value: value.into(),
    };
    write_segment(dir, 0, 0, &[rec(0, "a", "1"), rec(1, "a", "2")]);
    write_segment(dir, 2, 0, &[rec(2, "a", "3"), rec(3, "a", "")]);
    let p = partition_ref(dir, 1 << 20);
    let r = offline_compact(
        &RealStorage,
        &p,
        &CompactionOptions::for_topic(&p.config, NOW_MS),
        &mut Vec::new(),
    )
    .unwrap();
    assert_eq!((r.records_read, r.records_kept), (2, 1));
    assert_eq!(
        read_partition(dir),
        vec![rec(1, "a", "2"), rec(2, "a", "3"), rec(3, "a", "")]
    );
    // An expired tombstone as the newest sealed record stays all the same: it is the
    // last record of the replaced range, so the output still ends where the range ended
    // and the active segment's base follows it.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let old = |offset, value: &str| Rec {
        offset,
        timestamp_ms: NOW_MS - 10_000,
        key: Some(b"k".to_vec()),
        value: value.into(),
    };
    write_segment(dir, 5, 0, &[old(5, "x"), old(6, "")]);
    write_segment(dir, 7, 0, &[]);
    let p = partition_ref(dir, 1 << 20);
    let mut opts = CompactionOptions::for_topic(&p.config, NOW_MS);
    opts.tombstone_retention_ms = 1000;
    let r = offline_compact(&RealStorage, &p, &opts, &mut Vec::new()).unwrap();
    assert_eq!(
        (r.records_kept, r.tombstones_dropped, r.segments_after),
        (1, 0, 1)
    );
    assert_eq!(r.new, vec![5]);
    let listing = list_partition(dir).unwrap();
    let bases: Vec<u64> = listing.segments.iter().map(|s| s.base_offset).collect();
    assert_eq!(bases, vec![5, 7]);
    // The output's first record (6) lies above its base (5).
    assert_eq!(read_partition(dir), vec![old(6, "")]);
    assert_tiles(dir, "expired tombstone last");
    assert_clean(dir, 1 << 20, "expired tombstone last");
}

#[test]
fn unreadable_record_aborts_and_changes_nothing() {
    let case = Case::generate(7);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    case.write(dir, 7);
    // Flip a byte inside the last record of the second sealed segment.
    let victim = dir.join(log_file_name(case.sealed[1].0));
    let mut bytes = fs::read(&victim).unwrap();
    let at = bytes.len() - 6;
    bytes[at] ^= 0x55;
    fs::write(&victim, bytes).unwrap();
    let before = files(dir);
    let p = partition_ref(dir, case.segment_bytes);
    let err = offline_compact(&RealStorage, &p, &case.options(), &mut Vec::new()).unwrap_err();
    assert!(
        matches!(err, CompactionError::Unreadable { ref path, .. } if *path == victim),
        "{err}"
    );
    assert!(err.to_string().contains("nothing changed"), "{err}");
    assert_eq!(files(dir), before);
}

#[test]
fn refuses_a_partition_with_a_marker_or_temp_files() {
    let case = Case::generate(3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    case.write(dir, 3);
    let p = partition_ref(dir, case.segment_bytes);
    fs::write(dir.join("00000000000000000000.log.tmp"), b"x").unwrap();
    let err = offline_compact(&RealStorage, &p, &case.options(), &mut Vec::new()).unwrap_err();
    assert!(
        matches!(err, CompactionError::NeedsRecovery { .. }),
        "{err}"
    );
}

#[test]
fn swap_is_cancelled_when_the_sealed_segments_changed() {
    let case = Case::generate(11);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    case.write(dir, 11);
    let before = files(dir);
    let p = partition_ref(dir, case.segment_bytes);
    let mut published = Vec::new();
    let (_, want) = case.expected();
    assert!(!want.skipped, "seed 11 must drop something");
    let err = compact_partition(&RealStorage, &p, &case.options(), &|_| false, &mut |n| {
        published.push(n.to_vec());
    })
    .unwrap_err();
    assert!(
        matches!(err, CompactionError::SegmentsChanged { .. }),
        "{err}"
    );
    assert!(published.is_empty());
    assert_eq!(files(dir), before);
}

/// What recovery does first: finish a present marker, then remove temporary files.
fn recover_like_startup(dir: &Path) {
    let marker_path = dir.join(COMPACTION_MARKER);
    if let Ok(bytes) = fs::read(&marker_path) {
        match CompactionMarker::decode(&bytes) {
            Ok(m) => {
                finish_compaction_marker(&RealStorage, dir, &m).unwrap();
            }
            Err(_) => fs::remove_file(&marker_path).unwrap(),
        }
    }
    for tmp in list_partition(dir).unwrap().temp_files {
        fs::remove_file(tmp).unwrap();
    }
}

/// A case whose compaction renames over a replaced name, adds a new name and deletes
/// a replaced one, split over several output segments.
fn fault_case() -> (Case, u64) {
    for seed in 0.. {
        let case = Case::generate(seed);
        let (_, want) = case.expected();
        if want.skipped || case.sealed.len() < 3 || want.records_kept < 10 {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        case.write(tmp.path(), seed);
        let mut opts = case.options();
        opts.dry_run = true;
        let p = partition_ref(tmp.path(), case.segment_bytes);
        let r = offline_compact(&RealStorage, &p, &opts, &mut Vec::new()).unwrap();
        let renames_over = r.new.iter().any(|n| r.replaced.contains(n));
        let adds_name = r.new.iter().any(|n| !r.replaced.contains(n));
        let deletes = r.replaced.iter().any(|n| !r.new.contains(n));
        if r.new.len() >= 2 && renames_over && adds_name && deletes {
            return (case, seed);
        }
    }
    unreachable!()
}

#[test]
fn every_failed_mutation_leaves_old_or_new_records() {
    let (case, seed) = fault_case();
    let template = tempfile::tempdir().unwrap();
    case.write(template.path(), seed);
    let old = case.all();
    let (new, _) = case.expected();
    assert_ne!(old, new);

    // Count the mutations and syncs of a successful run.
    let counts = |fail_on| {
        let tmp = tempfile::tempdir().unwrap();
        copy_tree(template.path(), tmp.path());
        let s = FailingStorage::new(Arc::new(RealStorage), u64::MAX, fail_on, false);
        let p = partition_ref(tmp.path(), case.segment_bytes);
        offline_compact(&s, &p, &case.options(), &mut Vec::new()).unwrap();
        assert_eq!(read_partition(tmp.path()), new);
        s.calls()
    };
    let (mutations, syncs) = (counts(FailOn::Any), counts(FailOn::Sync));
    assert!(
        mutations > 10 && syncs >= 5,
        "{mutations} mutations, {syncs} syncs"
    );
    eprintln!("seed {seed}: {mutations} mutations, {syncs} syncs per compaction");

    let mut outcomes = BTreeMap::new();
    for fail_on in [FailOn::Any, FailOn::Sync] {
        let total = if fail_on == FailOn::Any {
            mutations
        } else {
            syncs
        };
        for sticky in [true, false] {
            for n in 1..=total {
                let tmp = tempfile::tempdir().unwrap();
                let dir = tmp.path();
                copy_tree(template.path(), dir);
                let s = FailingStorage::new(Arc::new(RealStorage), n, fail_on, sticky);
                let p = partition_ref(dir, case.segment_bytes);
                let mut published = Vec::new();
                let result = offline_compact(&s, &p, &case.options(), &mut published);
                let what = format!("{fail_on:?} call {n}/{total} sticky={sticky}: {result:?}");
                assert!(s.has_failed(), "{what}");
                assert!(result.is_err(), "{what}");
                assert!(published.is_empty(), "{what}");
                let interrupted = matches!(result, Err(CompactionError::Interrupted { .. }));
                recover_like_startup(dir);
                let got = read_partition(dir);
                let state = if got == old {
                    "old"
                } else if got == new {
                    "new"
                } else {
                    panic!(
                        "{what}: the partition holds neither the old nor the new records: {got:#?}"
                    );
                };
                assert_eq!(
                    state == "new",
                    interrupted,
                    "{what}: new records exactly when the marker was written"
                );
                *outcomes.entry(state).or_insert(0) += 1;
                assert_clean(dir, case.segment_bytes, &what);
                assert!(list_partition(dir).unwrap().temp_files.is_empty(), "{what}");
            }
        }
    }
    // Failures before the marker keep the old records, after it the new ones.
    eprintln!("outcomes: {outcomes:?}");
    assert!(
        outcomes.get("old").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("new").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
}

#[test]
fn finishing_a_marker_is_idempotent_at_every_point() {
    let (case, seed) = fault_case();
    let template = tempfile::tempdir().unwrap();
    case.write(template.path(), seed);
    let (new, _) = case.expected();
    // Crash inside the finishing itself (sticky failure of its Nth mutation), then
    // finish again: always the new records.
    for n in 1.. {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        copy_tree(template.path(), dir);
        let p = partition_ref(dir, case.segment_bytes);
        // Stop the swap right after the marker is durable: fail the first rename of a
        // temporary segment file.
        let swap_fail_at = {
            let probe = tempfile::tempdir().unwrap();
            copy_tree(template.path(), probe.path());
            let s = FailingStorage::new(Arc::new(RealStorage), u64::MAX, FailOn::Any, false);
            let pp = partition_ref(probe.path(), case.segment_bytes);
            let prepared = seglog::engine::maintenance::compaction::prepare_compaction(
                &s,
                &pp,
                &case.options(),
            )
            .unwrap();
            let before_swap = s.calls();
            drop(prepared);
            // Marker: create, write, sync, rename, sync_dir = 5 calls.
            before_swap + 6
        };
        let s = FailingStorage::new(Arc::new(RealStorage), swap_fail_at, FailOn::Any, true);
        let r = offline_compact(&s, &p, &case.options(), &mut Vec::new());
        assert!(
            matches!(r, Err(CompactionError::Interrupted { .. })),
            "{r:?}"
        );
        let marker =
            CompactionMarker::decode(&fs::read(dir.join(COMPACTION_MARKER)).unwrap()).unwrap();
        let s = FailingStorage::new(Arc::new(RealStorage), n, FailOn::Any, true);
        let first = finish_compaction_marker(&s, dir, &marker);
        finish_compaction_marker(&RealStorage, dir, &marker).unwrap();
        assert_eq!(read_partition(dir), new, "finish failing at call {n}");
        assert!(!dir.join(COMPACTION_MARKER).exists());
        assert_clean(dir, case.segment_bytes, "finished twice");
        if first.is_ok() {
            break;
        }
    }
}

// ---- the command line ----

/// DATA/topics/<topic>/<p>/ with `topic.json` of the given policy, holding `case`.
fn data_dir_with(
    root: &Path,
    topic: &str,
    policy: CleanupPolicy,
    case: &Case,
    seed: u64,
) -> PathBuf {
    let topic_dir = root.join("topics").join(topic);
    let part = topic_dir.join("0");
    fs::create_dir_all(&part).unwrap();
    let meta = TopicMeta {
        partitions: 1,
        config: TopicConfig {
            cleanup_policy: policy,
            segment_bytes: case.segment_bytes,
            tombstone_retention_ms: case.retention_ms,
            ..TopicConfig::default()
        },
    };
    fs::write(topic_dir.join("topic.json"), meta.encode()).unwrap();
    case.write(&part, seed);
    part
}

fn json_of(out: &[u8]) -> serde_json::Value {
    serde_json::from_slice(out).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(out)))
}

#[test]
fn cli_reports_the_numbers_and_leaves_a_clean_partition() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let seed = 11;
    let case = Case::generate(seed);
    let part = data_dir_with(data, "kv", CleanupPolicy::Compact, &case, seed);
    let other = data_dir_with(data, "events", CleanupPolicy::Delete, &case, seed);
    let other_before = files(&other);
    let (expected, want) = case.expected();

    let out = seglog()
        .args(["compact", "--json", "--now-ms", &NOW_MS.to_string()])
        .arg(data)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json_of(&out.stdout);
    let parts = doc["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1, "only the compacted topic: {doc}");
    let p = &parts[0];
    assert_eq!(p["topic"], "kv");
    assert_eq!(p["partition"], 0);
    assert_eq!(p["status"], "compacted");
    assert_eq!(p["records_read"], want.records_read);
    assert_eq!(p["records_kept"], want.records_kept);
    assert_eq!(p["records_dropped"], want.records_dropped);
    assert_eq!(p["tombstones_dropped"], want.tombstones_dropped);
    let sealed_len = |dir: &Path| -> u64 {
        let l = list_partition(dir).unwrap();
        l.segments[..l.segments.len() - 1]
            .iter()
            .map(|s| fs::metadata(&s.log).unwrap().len())
            .sum()
    };
    assert_eq!(p["bytes_before"], sealed_len(&other));
    assert_eq!(p["bytes_after"], sealed_len(&part));
    assert_eq!(read_partition(&part), expected);
    assert_eq!(
        files(&other),
        other_before,
        "a delete-policy topic was compacted"
    );
    let check = check_partition(&resolve(&part).unwrap().partitions[0], CheckMode::Full).unwrap();
    assert_eq!(
        check.severity(),
        None,
        "{:?}",
        check.all_problems().collect::<Vec<_>>()
    );

    // Named explicitly, the delete-policy topic is compacted too; human output.
    let out = seglog()
        .args(["compact", "--now-ms", &NOW_MS.to_string()])
        .arg(data.join("topics/events"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("tombstones dropped") && text.contains("events/0"),
        "{text}"
    );
    assert!(
        text.contains(&format!(" {} ", want.records_dropped)),
        "{text}"
    );
    assert_eq!(read_partition(&other), expected);

    // A second run drops nothing and says so.
    let out = seglog()
        .args(["compact", "--json", "--now-ms", &NOW_MS.to_string()])
        .arg(&part)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let doc = json_of(&out.stdout);
    assert_eq!(doc["partitions"][0]["status"], "skipped");
    assert_eq!(doc["partitions"][0]["skipped"], true);
}

/// A marker that replaces the newest segment was written by no swap (compaction
/// replaces sealed segments only): recover removes it and keeps every segment.
#[test]
fn a_marker_replacing_the_newest_segment_is_removed_and_every_segment_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let case = Case::generate(11);
    let part = data_dir_with(data, "kv", CleanupPolicy::Compact, &case, 11);
    let records = read_partition(&part);
    let segments = list_partition(&part).unwrap().segments;
    assert!(segments.len() >= 2, "{segments:?}");
    let [.., before_newest, newest] = &segments[..] else {
        unreachable!()
    };
    let marker = format!(
        r#"{{"version":1,"new":["{:020}"],"replaced":["{:020}","{:020}"]}}"#,
        before_newest.base_offset, before_newest.base_offset, newest.base_offset
    );
    fs::write(part.join(COMPACTION_MARKER), marker).unwrap();
    let out = seglog().arg("verify").arg(data).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("no segment follows the replaced range"),
        "{text}"
    );
    let out = seglog().arg("recover").arg(data).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!part.join(COMPACTION_MARKER).exists());
    assert_eq!(list_partition(&part).unwrap().segments, segments);
    assert_eq!(read_partition(&part), records);
}

#[test]
fn cli_dry_run_changes_nothing_and_takes_no_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let seed = 11;
    let case = Case::generate(seed);
    let part = data_dir_with(data, "kv", CleanupPolicy::Compact, &case, seed);
    let (_, want) = case.expected();
    let before = files(&part);
    let _held = DirLock::acquire(data).unwrap();
    let out = seglog()
        .args([
            "compact",
            "--dry-run",
            "--json",
            "--now-ms",
            &NOW_MS.to_string(),
        ])
        .arg(data)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json_of(&out.stdout);
    assert_eq!(doc["dry_run"], true);
    let p = &doc["partitions"][0];
    assert_eq!(p["status"], "dry_run");
    assert_eq!(p["records_dropped"], want.records_dropped);
    assert_eq!(p["records_kept"], want.records_kept);
    assert_eq!(files(&part), before);
}

#[test]
fn cli_exits_73_while_the_lock_is_held() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let case = Case::generate(11);
    let part = data_dir_with(data, "kv", CleanupPolicy::Compact, &case, 11);
    let before = files(&part);
    let held = DirLock::acquire(data).unwrap();
    let out = seglog().arg("compact").arg(data).output().unwrap();
    assert_eq!(out.status.code(), Some(73));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("LOCK") && err.lines().count() == 1, "{err}");
    // A relative path finds the data directory above it, and its lock, too.
    let topic_dir = part.parent().unwrap();
    for (cwd, arg) in [
        (&part, "."),
        (&part, "../0"),
        (&topic_dir.to_path_buf(), "0"),
    ] {
        for cmd in ["compact", "recover", "reindex"] {
            let out = seglog().current_dir(cwd).args([cmd, arg]).output().unwrap();
            assert_eq!(out.status.code(), Some(73), "{cmd} {arg}: {out:?}");
        }
    }
    assert_eq!(files(&part), before);
    drop(held);
    seglog().arg("compact").arg(data).assert().code(0);
}

#[test]
fn cli_refuses_a_partition_that_needs_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path();
    let case = Case::generate(11);
    let part = data_dir_with(data, "kv", CleanupPolicy::Compact, &case, 11);
    // A torn record at the end of the active segment.
    let active = part.join(log_file_name(case.active.0));
    let mut bytes = fs::read(&active).unwrap();
    bytes.extend_from_slice(&[0, 0, 0, 200, 1, 2, 3]);
    fs::write(&active, bytes).unwrap();
    let before = files(&part);
    let out = seglog().arg("compact").arg(data).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("recover") && err.contains("torn_tail"),
        "{err}"
    );
    assert_eq!(files(&part), before);

    // A leftover compaction marker: refused too.
    let tmp = tempfile::tempdir().unwrap();
    let part = data_dir_with(tmp.path(), "kv", CleanupPolicy::Compact, &case, 11);
    fs::write(
        part.join(COMPACTION_MARKER),
        CompactionMarker {
            new: vec![],
            replaced: vec![],
        }
        .encode(),
    )
    .unwrap();
    let out = seglog().arg("compact").arg(&part).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cli_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let case = Case::generate(11);
    let part = data_dir_with(tmp.path(), "kv", CleanupPolicy::Compact, &case, 11);
    seglog()
        .arg("compact")
        .arg(part.join(log_file_name(case.sealed[0].0)))
        .assert()
        .code(64);
    seglog()
        .arg("compact")
        .arg(tmp.path().join("nope"))
        .assert()
        .code(64);
    seglog()
        .args(["compact", "--tombstone-retention-ms", "-5"])
        .arg(&part)
        .assert()
        .code(64);
}

// ---- benchmark ----

#[test]
fn cli_compacts_the_independent_vector_partition_as_the_model_says() {
    // The expected records come from the vectors' own listing, not from our encoder.
    let listing = fs::read_to_string("tests/fixtures/vectors/partition.expected.jsonl").unwrap();
    let unhex = |v: &serde_json::Value| -> Option<Vec<u8>> {
        let s = v.as_str()?;
        Some(
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect(),
        )
    };
    let mut sealed = Vec::new();
    let mut active = Vec::new();
    for line in listing.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let rec = Rec {
            offset: v["offset"].as_u64().unwrap(),
            timestamp_ms: v["timestamp_ms"].as_i64().unwrap(),
            key: unhex(&v["key_hex"]),
            value: unhex(&v["value_hex"]).unwrap(),
        };
        if v["base_offset"] == 0 {
            sealed.push(rec);
        } else {
            active.push(rec);
        }
    }
    let case = Case {
        sealed: vec![(0, sealed)],
        active: (600, active),
        retention_ms: 30_000,
        segment_bytes: 4096,
    };
    let now_ms = 1_700_000_040_000;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("0");
    fs::create_dir(&dir).unwrap();
    copy_tree(Path::new("tests/fixtures/vectors/partition"), &dir);
    let out = seglog()
        .args(["compact", "--json", "--now-ms", &now_ms.to_string()])
        .args(["--tombstone-retention-ms", "30000"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json_of(&out.stdout);
    // The model of `Case::expected`, with this clock.
    let sealed_recs = &case.sealed[0].1;
    let mut newest: HashMap<&[u8], u64> = HashMap::new();
    for r in sealed_recs {
        if let Some(k) = &r.key {
            newest.insert(k, r.offset);
        }
    }
    let mut want: Vec<Rec> = sealed_recs
        .iter()
        .filter(|r| match &r.key {
            None => true,
            Some(k) => {
                newest[k.as_slice()] == r.offset
                    && !(is_tombstone(r) && now_ms - r.timestamp_ms > case.retention_ms)
            }
        })
        .cloned()
        .collect();
    let dropped_tombstones = sealed_recs.iter().filter(|r| is_tombstone(r)).count()
        - want.iter().filter(|r| is_tombstone(r)).count();
    // Every tombstone in the vectors has a newer record of its key.
    assert_eq!(dropped_tombstones, 12);
    let p = &doc["partitions"][0];
    assert_eq!(p["records_read"], 600);
    assert_eq!(p["records_kept"], want.len());
    assert_eq!(p["tombstones_dropped"], dropped_tombstones);
    want.extend(case.active.1.iter().cloned());
    assert_eq!(read_partition(&dir), want);
    // Default segment_bytes is large, so one sealed segment, named 0, then the active.
    let bases: Vec<u64> = list_partition(&dir)
        .unwrap()
        .segments
        .iter()
        .map(|s| s.base_offset)
        .collect();
    assert_eq!(bases, vec![0, 600]);
    let check = check_partition(&resolve(&dir).unwrap().partitions[0], CheckMode::Full).unwrap();
    assert_eq!(
        check.severity(),
        None,
        "{:?}",
        check.all_problems().collect::<Vec<_>>()
    );
}

// ---- crash images ----

/// Storage that tracks what may survive a power cut: a file's content only as of its
/// last fsync; a directory's names as of its last fsync plus any prefix of the
/// creates, renames and removals made since (a journaling file system keeps their
/// order). Before counted mutation `crash_at` runs, it records every such image and
/// fails that mutation and every later one (the process died there).
#[derive(Debug)]
struct CrashStorage {
    dir: PathBuf,
    crash_at: u64,
    state: std::sync::Mutex<CrashState>,
}

#[derive(Debug, Default)]
struct CrashState {
    calls: u64,
    next_inode: u64,
    /// Names in the directory now, and as of its last fsync.
    names: BTreeMap<String, u64>,
    durable_names: BTreeMap<String, u64>,
    /// File content as of each file's last fsync.
    durable_data: HashMap<u64, Vec<u8>>,
    /// Name changes since the directory's last fsync, in order.
    pending: Vec<NameOp>,
    images: Option<Vec<BTreeMap<String, Vec<u8>>>>,
}

#[derive(Clone, Debug)]
enum NameOp {
    Create(String, u64),
    Rename(String, String),
    Remove(String),
}

impl CrashState {
    /// The directory after its durable names and the first `k` pending changes.
    fn image(&self, k: usize) -> BTreeMap<String, Vec<u8>> {
        let mut names = self.durable_names.clone();
        for op in &self.pending[..k] {
            match op {
                NameOp::Create(n, inode) => {
                    names.insert(n.clone(), *inode);
                }
                NameOp::Rename(f, t) => {
                    if let Some(inode) = names.remove(f) {
                        names.insert(t.clone(), inode);
                    }
                }
                NameOp::Remove(n) => {
                    names.remove(n);
                }
            }
        }
        names
            .into_iter()
            .map(|(name, inode)| {
                (
                    name,
                    self.durable_data.get(&inode).cloned().unwrap_or_default(),
                )
            })
            .collect()
    }
}

#[derive(Debug)]
struct CrashFile {
    inner: Box<dyn seglog::engine::storage::io::StorageFile>,
    inode: u64,
    storage: Arc<CrashStorage>,
}

impl CrashStorage {
    fn new(dir: &Path, crash_at: u64) -> Arc<CrashStorage> {
        let mut state = CrashState::default();
        for (name, bytes) in files(dir) {
            state.next_inode += 1;
            state.names.insert(name.clone(), state.next_inode);
            state.durable_names.insert(name, state.next_inode);
            state.durable_data.insert(state.next_inode, bytes);
        }
        Arc::new(CrashStorage {
            dir: dir.to_path_buf(),
            crash_at,
            state: std::sync::Mutex::new(state),
        })
    }

    fn name(&self, path: &Path) -> String {
        assert_eq!(
            path.parent(),
            Some(self.dir.as_path()),
            "{}",
            path.display()
        );
        path.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Counts a mutation; at the crash point records the durable image and fails.
    fn step(&self) -> std::io::Result<std::sync::MutexGuard<'_, CrashState>> {
        let mut s = self.state.lock().unwrap();
        s.calls += 1;
        if s.calls >= self.crash_at {
            if s.images.is_none() {
                let images = (0..=s.pending.len()).map(|k| s.image(k)).collect();
                s.images = Some(images);
            }
            return Err(std::io::Error::other("crashed"));
        }
        Ok(s)
    }

    fn images(&self) -> Option<Vec<BTreeMap<String, Vec<u8>>>> {
        self.state.lock().unwrap().images.clone()
    }
}

impl seglog::engine::storage::io::StorageFile for CrashFile {
    fn write_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
        drop(self.storage.step()?);
        self.inner.write_at(buf, pos)
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        drop(self.storage.step()?);
        self.inner.set_len(len)
    }
    fn allocate(&self, len: u64) -> std::io::Result<()> {
        drop(self.storage.step()?);
        self.inner.allocate(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.sync_all()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        let mut s = self.storage.step()?;
        self.inner.sync_all()?;
        let mut data = vec![0u8; self.inner.len()? as usize];
        let n = self.inner.read_at(&mut data, 0)?;
        data.truncate(n);
        s.durable_data.insert(self.inode, data);
        Ok(())
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
}

/// `Storage` for an `Arc<CrashStorage>` (files keep a handle to it).
#[derive(Debug, Clone)]
struct Crash(Arc<CrashStorage>);

impl Storage for Crash {
    fn create(
        &self,
        path: &Path,
    ) -> std::io::Result<Box<dyn seglog::engine::storage::io::StorageFile>> {
        let name = self.0.name(path);
        let mut s = self.0.step()?;
        let inner = RealStorage.create(path)?;
        s.next_inode += 1;
        let inode = s.next_inode;
        s.names.insert(name.clone(), inode);
        s.pending.push(NameOp::Create(name, inode));
        Ok(Box::new(CrashFile {
            inner,
            inode,
            storage: self.0.clone(),
        }))
    }
    fn open(
        &self,
        path: &Path,
    ) -> std::io::Result<Box<dyn seglog::engine::storage::io::StorageFile>> {
        let name = self.0.name(path);
        let inode = *self.0.state.lock().unwrap().names.get(&name).unwrap();
        Ok(Box::new(CrashFile {
            inner: RealStorage.open(path)?,
            inode,
            storage: self.0.clone(),
        }))
    }
    fn create_dir_all(&self, _path: &Path) -> std::io::Result<()> {
        unreachable!("compaction creates no directory")
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let (f, t) = (self.0.name(from), self.0.name(to));
        let mut s = self.0.step()?;
        RealStorage.rename(from, to)?;
        let inode = s.names.remove(&f).unwrap();
        s.names.insert(t.clone(), inode);
        s.pending.push(NameOp::Rename(f, t));
        Ok(())
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        let name = self.0.name(path);
        let mut s = self.0.step()?;
        RealStorage.remove_file(path)?;
        s.names.remove(&name);
        s.pending.push(NameOp::Remove(name));
        Ok(())
    }
    fn remove_dir_all(&self, _path: &Path) -> std::io::Result<()> {
        unreachable!("compaction removes no directory")
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        assert_eq!(path, self.0.dir.as_path());
        let mut s = self.0.step()?;
        RealStorage.sync_dir(path)?;
        s.durable_names = s.names.clone();
        s.pending.clear();
        Ok(())
    }
}

#[test]
fn every_crash_image_holds_old_or_new_records() {
    let (case, seed) = fault_case();
    let template = tempfile::tempdir().unwrap();
    case.write(template.path(), seed);
    let old = case.all();
    let (new, _) = case.expected();
    let mut outcomes = BTreeMap::new();
    for crash_at in 1.. {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        copy_tree(template.path(), dir);
        let storage = Crash(CrashStorage::new(dir, crash_at));
        let p = partition_ref(dir, case.segment_bytes);
        let result = offline_compact(&storage, &p, &case.options(), &mut Vec::new());
        let Some(images) = storage.0.images() else {
            // No crash: the run went through.
            result.unwrap();
            assert_eq!(read_partition(dir), new);
            assert!(crash_at > 10, "only {crash_at} mutations");
            break;
        };
        assert!(result.is_err());
        // Materialise each state the disk may hold after the crash, and start up on it.
        for (k, image) in images.iter().enumerate() {
            let what = format!("crash before mutation {crash_at}, {k} unsynced name changes kept");
            let after = tempfile::tempdir().unwrap();
            for (name, bytes) in image {
                fs::write(after.path().join(name), bytes).unwrap();
            }
            recover_like_startup(after.path());
            let got = read_partition(after.path());
            let state = if got == old {
                "old"
            } else if got == new {
                "new"
            } else {
                panic!("{what}: neither the old nor the new records: {got:#?}");
            };
            *outcomes.entry(state).or_insert(0) += 1;
            assert_clean(after.path(), case.segment_bytes, &what);
        }
    }
    eprintln!("crash images: {outcomes:?}");
    assert!(
        outcomes.contains_key("old") && outcomes.contains_key("new"),
        "{outcomes:?}"
    );
}

#[test]
fn cli_exits_2_on_a_corrupt_record_the_startup_check_does_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("0");
    fs::create_dir(&dir).unwrap();
    let recs: Vec<Rec> = (0..300)
        .map(|i| Rec {
            offset: i,
            timestamp_ms: NOW_MS,
            key: Some(format!("k{}", i % 10).into_bytes()),
            value: vec![b'v'; 100],
        })
        .collect();
    write_segment(&dir, 0, 0, &recs);
    write_segment(&dir, 300, 0, &[]);
    // A byte in the middle of the sealed segment, far from its first record and its
    // last index entry: the index-trusting startup check does not read it.
    let log = dir.join(log_file_name(0));
    let mut bytes = fs::read(&log).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0xFF;
    fs::write(&log, bytes).unwrap();
    let p = resolve(&dir).unwrap().partitions.remove(0);
    assert_eq!(
        check_partition(&p, CheckMode::Quick).unwrap().severity(),
        None
    );
    let before = files(&dir);
    let out = seglog().arg("compact").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("00000000000000000000.log") && err.contains("nothing changed"),
        "{err}"
    );
    assert_eq!(files(&dir), before);
}

#[test]
fn progress_counts_both_passes_up_to_twice_the_sealed_bytes() {
    use seglog::engine::maintenance::compaction::compact_partition_with_progress;
    let case = Case::generate_sized(5, 50, 3000);
    let tmp = scratch_dir();
    case.write(tmp.path(), 5);
    let p = partition_ref(tmp.path(), case.segment_bytes * 64);
    let seen = std::cell::RefCell::new(Vec::new());
    let dir = p.dir.clone();
    let r = compact_partition_with_progress(
        &RealStorage,
        &p,
        &case.options(),
        &|read| sealed_segments_unchanged(&dir, read),
        &mut |_| {},
        &|done, total| seen.borrow_mut().push((done, total)),
    )
    .unwrap();
    assert!(!r.skipped);
    let seen = seen.into_inner();
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    assert!(seen.iter().all(|&(d, t)| t == 2 * r.bytes_before && d <= t));
    assert_eq!(seen.last().unwrap().0, 2 * r.bytes_before);
}
