//! Unit tests of the partition log.

use super::read::read_segment;
use super::*;
use crate::engine::storage::io::RealStorage;
use crate::format::decode_record;
use crate::testkit::storage::{HookStorage, OpKind};

/// The fsyncs a [`recorder`] storage made, in order, as (kind, file name).
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<(&'static str, String)>>);

impl Recorder {
    fn push(&self, kind: &'static str, name: &str) {
        self.0.lock().unwrap().push((kind, name.to_string()));
    }
    fn take(&self) -> Vec<(&'static str, String)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// Real storage that records every fsync into `rec`.
fn recorder(rec: Arc<Recorder>) -> StorageRef {
    Arc::new(HookStorage::from_fn(Arc::new(RealStorage), move |op| {
        let kind = match op.kind() {
            OpKind::SyncData => "sync_data",
            OpKind::SyncAll => "sync_all",
            OpKind::SyncDir => "sync_dir",
            _ => return None,
        };
        rec.push(kind, &file_name(op.path));
        None
    }))
}

fn new_log(dir: &Path, storage: StorageRef) -> PartitionLog {
    let stats = Arc::new(LogStats::default());
    create_first_segment(&*storage, dir, &stats).unwrap();
    PartitionLog::open("t", 0, dir, storage, stats).unwrap().0
}

fn config(segment_bytes: u64) -> TopicConfig {
    TopicConfig {
        segment_bytes,
        ..TopicConfig::default()
    }
}

/// Appends `n` records of `value` one at a time, each made durable, with
/// `segment_bytes` segments.
fn append_durable(log: &PartitionLog, n: usize, value: &[u8], segment_bytes: u64) {
    for _ in 0..n {
        let a = log
            .append(
                &[NewRecord {
                    key: None,
                    value,
                    timestamp_ms: 1,
                }],
                &config(segment_bytes),
            )
            .unwrap();
        log.wait_durable(a.last_offset + 1).unwrap();
    }
}

fn value_of(log: &PartitionLog, offset: u64, budget: u32) -> Vec<(u64, usize)> {
    let f = log.fetch(offset, budget, Duration::ZERO).unwrap();
    let mut out = Vec::new();
    for c in &f.chunks {
        let mut pos = 0;
        while pos < c.bytes.len() {
            let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
            out.push((r.offset, r.value.len()));
            pos += r.encoded_len;
        }
    }
    out
}

#[test]
fn a_roll_is_made_durable_before_the_new_segment_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let log = new_log(dir.path(), recorder(rec.clone()));
    let v = vec![7u8; 600];
    let a = log
        .append(
            &[NewRecord {
                key: None,
                value: &v,
                timestamp_ms: 1,
            }],
            &config(1024),
        )
        .unwrap();
    log.wait_durable(a.last_offset + 1).unwrap();
    rec.take();
    // Does not fit: rolls to segment 1. Nothing is synced by the roll itself.
    let b = log
        .append(
            &[NewRecord {
                key: None,
                value: &v,
                timestamp_ms: 1,
            }],
            &config(1024),
        )
        .unwrap();
    assert_eq!(b.base_offset, 1);
    assert_eq!(rec.take(), []);
    assert_eq!(
        std::fs::read(dir.path().join(log_file_name(1))).unwrap()[..HEADER_LEN],
        [0u8; HEADER_LEN],
        "the new header waits until the outgoing segment is durable"
    );
    assert_eq!(log.durable_end(), 1);
    assert_eq!(
        value_of(&log, 1, 1 << 20),
        [],
        "not served before it is durable"
    );
    log.wait_durable(2).unwrap();
    let old = log_file_name(0);
    let new = log_file_name(1);
    // The outgoing segment first, then the new header (written only now) with the
    // records behind it, then the directory; the active log is the new one, already
    // covered by its `sync_all`.
    assert_eq!(
        rec.take(),
        [
            ("sync_all", old),
            ("sync_all", index_file_name(0)),
            ("sync_all", new),
            ("sync_dir", file_name(dir.path())),
        ]
    );
    assert_eq!(value_of(&log, 0, 1 << 20), [(0, 600), (1, 600)]);
    assert_eq!(log.snapshot().len(), 2);
}

#[test]
fn records_larger_than_the_read_window_are_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let log = new_log(dir.path(), Arc::new(RealStorage));
    let big = vec![1u8; 300 * 1024];
    let small = vec![2u8; 10];
    let recs = [
        NewRecord {
            key: None,
            value: &small,
            timestamp_ms: 1,
        },
        NewRecord {
            key: None,
            value: &big,
            timestamp_ms: 1,
        },
        NewRecord {
            key: None,
            value: &big,
            timestamp_ms: 1,
        },
        NewRecord {
            key: None,
            value: &small,
            timestamp_ms: 1,
        },
    ];
    let a = log.append(&recs, &config(64 << 20)).unwrap();
    log.wait_durable(a.last_offset + 1).unwrap();
    assert_eq!(value_of(&log, 0, 1), [(0, 10)]);
    assert_eq!(value_of(&log, 1, 1), [(1, 300 * 1024)]);
    assert_eq!(
        value_of(&log, 1, 700 * 1024),
        [(1, 300 * 1024), (2, 300 * 1024), (3, 10)]
    );
    assert_eq!(
        value_of(&log, 0, 200 * 1024),
        [(0, 10)],
        "the budget stops before the big record"
    );
    assert_eq!(value_of(&log, 3, 1 << 20), [(3, 10)]);
}

#[test]
fn removed_and_replaced_segments_keep_serving_readers_that_hold_them() {
    let dir = tempfile::tempdir().unwrap();
    let log = new_log(dir.path(), Arc::new(RealStorage));
    let v = vec![5u8; 100];
    append_durable(&log, 30, &v, 1024);
    let held = log.snapshot();
    let settled = log.settled_segments();
    assert_eq!(settled.len(), held.len() - 1, "all but the active one");
    let oldest = held[0].clone();
    let bytes_before = read_segment(&oldest, 0, 1 << 20, true).unwrap().bytes;
    // Retention: the list no longer has it, its files are gone ...
    let gone = log.remove_oldest(&[oldest.base_offset]).unwrap();
    assert_eq!(gone.len(), 1);
    assert!(!oldest.path().exists());
    assert_eq!(log.start_offset(), held[1].base_offset);
    assert!(matches!(
        log.fetch(0, 1 << 20, Duration::ZERO),
        Err(EngineError::OffsetOutOfRange { start, .. }) if start == held[1].base_offset
    ));
    // ... yet a reader holding it reads the same bytes through its open file.
    assert_eq!(
        read_segment(&oldest, 0, 1 << 20, true).unwrap().bytes,
        bytes_before
    );
    // Only the oldest segments, in order, and never the active one.
    assert!(log.remove_oldest(&[held[2].base_offset]).is_err());
    let active = held.last().unwrap().base_offset;
    let all_but: Vec<u64> = held[1..].iter().map(|s| s.base_offset).collect();
    assert!(log.remove_oldest(&all_but).is_err());
    assert!(log.snapshot().iter().any(|s| s.base_offset == active));
}

#[test]
fn a_fetch_continues_into_the_next_segment() {
    let dir = tempfile::tempdir().unwrap();
    let log = new_log(dir.path(), Arc::new(RealStorage));
    let v = vec![3u8; 100];
    append_durable(&log, 40, &v, 1024);
    let segs = log.snapshot();
    assert!(segs.len() > 3);
    let boundary = segs[1].base_offset;
    let got = value_of(&log, boundary - 2, 1 << 20);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        (boundary - 2..40).collect::<Vec<_>>()
    );
    let f = log.fetch(boundary - 2, 1 << 20, Duration::ZERO).unwrap();
    assert_eq!(f.chunks.len(), segs.len(), "one chunk per segment read");
    assert_eq!((f.start_offset, f.end_offset), (0, 40));
}

/// The record count follows appends and rolls, and a reopened log counts its sealed
/// segments by a scan (with damage named and the records after it still counted).
#[test]
fn health_counts_records_through_rolls_reopen_and_damage() {
    let dir = tempfile::tempdir().unwrap();
    let log = new_log(dir.path(), Arc::new(RealStorage));
    let value = [7u8; 100];
    let mut appended = 0;
    for batch in 0..30u64 {
        let recs: Vec<NewRecord<'_>> = (0..=batch % 3)
            .map(|_| NewRecord {
                key: None,
                value: &value,
                timestamp_ms: 1,
            })
            .collect();
        let a = log.append(&recs, &config(1024)).unwrap();
        appended += recs.len() as u64;
        log.wait_durable(a.last_offset + 1).unwrap();
    }
    let segs = log.snapshot();
    assert!(segs.len() > 3, "{} segments", segs.len());
    assert_eq!(
        log.health(),
        LogHealth {
            records: appended,
            damage: vec![]
        }
    );
    let second = segs[1].clone();
    drop((segs, log));

    let log = PartitionLog::open(
        "t",
        0,
        dir.path(),
        Arc::new(RealStorage),
        Arc::new(LogStats::default()),
    )
    .unwrap()
    .0;
    assert_eq!(log.health().records, appended);
    drop(log);

    // One byte flipped in the value of the second segment's first record.
    let mut bytes = std::fs::read(second.path()).unwrap();
    let at = HEADER_LEN + 40;
    bytes[at] ^= 0x10;
    std::fs::write(second.path(), &bytes).unwrap();
    let log = PartitionLog::open(
        "t",
        0,
        dir.path(),
        Arc::new(RealStorage),
        Arc::new(LogStats::default()),
    )
    .unwrap()
    .0;
    let h = log.health();
    assert_eq!(h.records, appended - 1, "{h:?}");
    assert_eq!(h.damage.len(), 1, "{h:?}");
    let first = second.base_offset;
    assert!(
        h.damage[0].contains(&format!(
            "unreadable from offset {first}, next readable offset {}",
            first + 1
        )),
        "{h:?}"
    );
}

/// A data directory with `topics/t/0` and `spares/`, and stats whose spare pool is on
/// there for one partition (4 spares).
fn with_spare_pool() -> (tempfile::TempDir, PathBuf, Arc<LogStats>) {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("topics/t/0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(data.path().join(crate::format::names::SPARES_DIR)).unwrap();
    let stats = Arc::new(LogStats::default());
    stats.spares.configure(data.path(), 4);
    stats.spares.set_partitions(1);
    (data, dir, stats)
}

/// A log whose directory is on another file system than `spares/` (an operator's
/// mount or symlink inside the data directory) neither takes a spare at its rolls
/// nor gives its retired segments to the pool: a `rename` cannot cross file systems,
/// and a failed rename at a roll's commit would stop the partition. Needs `/dev/shm`
/// on another file system than the temporary directory.
#[test]
fn a_log_on_another_file_system_neither_takes_nor_gives_spares() {
    let (_data, dir, stats) = with_spare_pool();
    let Ok(other) = tempfile::tempdir_in("/dev/shm") else {
        println!("skipped: no /dev/shm");
        return;
    };
    let (here, there) = (
        spares::file_system_of(&dir),
        spares::file_system_of(other.path()),
    );
    if here.is_none() || here == there {
        println!("skipped: /dev/shm is on the temporary directory's file system");
        return;
    }
    let storage: StorageRef = Arc::new(RealStorage);
    let append = |log: &PartitionLog, fill: u8| {
        let v = vec![fill; 300];
        let record = NewRecord {
            key: None,
            value: &v,
            timestamp_ms: 1,
        };
        let a = log.append(&[record], &config(1024)).unwrap();
        log.wait_durable(a.last_offset + 1).unwrap();
    };
    let open = |partition: u32, dir: &Path| {
        create_first_segment(&*storage, dir, &stats).unwrap();
        PartitionLog::open("t", partition, dir, storage.clone(), stats.clone())
            .unwrap()
            .0
    };
    // A log beside the pool gives it one spare.
    let near = open(0, &dir);
    for _ in 0..12 {
        append(&near, 1);
    }
    let oldest = near.settled_segments()[0].base_offset;
    near.retire_oldest(&[oldest]).unwrap();
    assert_eq!(stats.spares.len(), 1);

    // The log on the other file system rolls onto new files and keeps taking writes.
    let far_dir = other.path().join("t-1");
    std::fs::create_dir_all(&far_dir).unwrap();
    let far = open(1, &far_dir);
    for _ in 0..24 {
        append(&far, 2);
    }
    assert!(far.snapshot().len() >= 4, "the log rolled");
    assert_eq!(stats.spares.taken.load(Ordering::Relaxed), 0);
    assert_eq!(stats.spares.len(), 1, "the spare is still in the pool");
    // Its retired segments are deleted, not moved to `spares/`.
    let oldest = far.settled_segments()[0].base_offset;
    let path = far.snapshot()[0].path().to_path_buf();
    far.retire_oldest(&[oldest]).unwrap();
    assert!(!path.exists(), "{} is deleted", path.display());
    assert_eq!(stats.spares.len(), 1);
    assert_eq!(stats.spares.returned.load(Ordering::Relaxed), 1);
    // The log beside the pool still takes the spare at its next roll.
    while stats.spares.taken.load(Ordering::Relaxed) == 0 {
        append(&near, 3);
    }
    append(&far, 4);
}

#[test]
fn a_reused_files_stale_tail_is_never_served() {
    let (_data, dir, stats) = with_spare_pool();
    let storage: StorageRef = Arc::new(RealStorage);
    create_first_segment(&*storage, &dir, &stats).unwrap();
    let log = PartitionLog::open("t", 0, &dir, storage, stats.clone())
        .unwrap()
        .0;
    let append = |n: usize, fill: u8| {
        let v = vec![fill; n];
        let a = log
            .append(
                &[NewRecord {
                    key: None,
                    value: &v,
                    timestamp_ms: 1,
                }],
                &config(1024),
            )
            .unwrap();
        log.wait_durable(a.last_offset + 1).unwrap();
        a.base_offset
    };
    // Large records fill the oldest segment; it becomes a spare.
    for _ in 0..12 {
        append(300, 1);
    }
    let oldest = log.settled_segments()[0].base_offset;
    log.retire_oldest(&[oldest]).unwrap();
    assert_eq!(stats.spares.len(), 1);
    let spare_len = stats.spares.dir().map_or(0, |d| {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum::<u64>()
    });
    assert!(spare_len > 600, "the spare keeps its old records");
    // Roll until the spare is taken, then one small record in the reused file.
    while stats.spares.taken.load(Ordering::Relaxed) == 0 {
        append(300, 2);
    }
    let active = log.snapshot().last().unwrap().clone();
    assert_eq!(active.generation, 1, "the reused file's generation");
    let small = append(10, 3);
    let on_disk = std::fs::metadata(active.path()).unwrap().len();
    assert!(
        on_disk > active.bytes(),
        "stale bytes lie past the data: {on_disk} vs {}",
        active.bytes()
    );
    // Only the records written to it are served, never the older generation's.
    let got = value_of(&log, active.base_offset, 1 << 20);
    let mine: Vec<(u64, usize)> = got
        .iter()
        .copied()
        .filter(|(o, _)| *o >= active.base_offset)
        .collect();
    let want: Vec<(u64, usize)> = (active.base_offset..small)
        .map(|o| (o, 300))
        .chain([(small, 10)])
        .collect();
    assert_eq!(mine, want);
    let f = log.fetch(small, 1 << 20, Duration::ZERO).unwrap();
    assert!(f.chunks.iter().all(|c| c.generation == 1));
    // A fetch from the last record returns it alone: the stale bytes behind it
    // (records of generation 0) are not served.
    assert_eq!(value_of(&log, small, 1 << 20), vec![(small, 10)]);
    assert_eq!(
        f.chunks.iter().map(|c| c.bytes.len()).sum::<usize>(),
        10 + 28 + 4
    );
}

/// A fetch's spans hold the bytes its chunks would: the same records from the same
/// segments, the same ends, the same errors, across rolls, around damage and for
/// records larger than the spans' read window.
#[test]
fn spans_name_exactly_the_records_a_fetch_copies() {
    fn span_bytes(s: &FetchSpan) -> Vec<u8> {
        let mut out = vec![0u8; s.len as usize];
        let mut done = 0;
        // Read in small slices, as a stream does.
        while done < out.len() {
            let end = (done + 1000).min(out.len());
            let n = s.read_at(done as u64, &mut out[done..end]).unwrap();
            assert!(n > 0);
            done += n;
        }
        out
    }
    fn same(log: &PartitionLog, offset: u64, budget: u32) {
        let chunks = log.fetch(offset, budget, Duration::ZERO);
        let spans = log.fetch_spans(offset, budget, Duration::ZERO);
        match (chunks, spans) {
            (Ok(c), Ok(s)) => {
                let want: Vec<(u64, Vec<u8>)> = c
                    .chunks
                    .iter()
                    .map(|c| (c.generation, c.bytes.clone()))
                    .collect();
                let got: Vec<(u64, Vec<u8>)> = s
                    .spans
                    .iter()
                    .map(|s| (s.generation, span_bytes(s)))
                    .collect();
                assert_eq!(got, want, "offset {offset}, budget {budget}");
                for s in &s.spans {
                    let b = span_bytes(s);
                    let mut n = 0;
                    let mut pos = 0;
                    while pos < b.len() {
                        pos += decode_record(&b[pos..], pos as u64, s.generation)
                            .unwrap()
                            .encoded_len;
                        n += 1;
                    }
                    assert_eq!(n, s.records, "offset {offset}, budget {budget}");
                }
                assert_eq!(
                    (s.start_offset, s.end_offset),
                    (c.start_offset, c.end_offset)
                );
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("offset {offset}, budget {budget}: {a:?} against {b:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let log = new_log(dir.path(), Arc::new(RealStorage));
    let small = [7u8; 100];
    let big = vec![9u8; 300 << 10];
    for i in 0..40u64 {
        let value: &[u8] = if i == 25 { &big } else { &small };
        let a = log
            .append(
                &[NewRecord {
                    key: None,
                    value,
                    timestamp_ms: 1,
                }],
                &config(1024),
            )
            .unwrap();
        log.wait_durable(a.last_offset + 1).unwrap();
    }
    let budgets = [1, 150, 1000, 5000, 400 << 10, 8 << 20];
    for offset in [0, 1, 7, 24, 25, 26, 39, 40] {
        for budget in budgets {
            same(&log, offset, budget);
        }
    }
    let second = log.snapshot()[1].clone();
    drop(log);
    // One byte flipped in the second segment's first record.
    let mut bytes = std::fs::read(second.path()).unwrap();
    bytes[HEADER_LEN + 40] ^= 0x10;
    std::fs::write(second.path(), &bytes).unwrap();
    let log = PartitionLog::open(
        "t",
        0,
        dir.path(),
        Arc::new(RealStorage),
        Arc::new(LogStats::default()),
    )
    .unwrap()
    .0;
    let first = second.base_offset;
    assert!(log.fetch_spans(first, 1 << 20, Duration::ZERO).is_err());
    for offset in [0, first.saturating_sub(1), first, first + 1, 30] {
        for budget in budgets {
            same(&log, offset, budget);
        }
    }
}

/// An index entry between the first and the last that names the wrong record (the
/// startup check reads only those two) neither skips records nor fakes damage: the
/// reader sees the record it finds is not the one named and reads the segment from
/// its start.
#[test]
fn a_wrong_middle_index_entry_skips_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = new_log(dir.path(), Arc::new(RealStorage));
    let v = vec![5u8; 200];
    append_durable(&log, 200, &v, 32 * 1024);
    let sealed = log.snapshot()[0].base_offset;
    drop(log);
    let index = dir.path().join(index_file_name(sealed));
    let bytes = std::fs::read(&index).unwrap();
    assert!(bytes.len() >= 3 * 16, "entries: {}", bytes.len() / 16);
    let named = u64::from_be_bytes(bytes[16..24].try_into().unwrap());
    assert!(named > 2);
    for (entry, wrong_offset) in [(1usize, 1u64), (1, named + 1)] {
        let mut damaged = bytes.clone();
        damaged[entry * 16..entry * 16 + 8].copy_from_slice(&wrong_offset.to_be_bytes());
        std::fs::write(&index, &damaged).unwrap();
        let stats = Arc::new(LogStats::default());
        let (log, _) =
            PartitionLog::open("t", 0, dir.path(), Arc::new(RealStorage), stats).unwrap();
        for from in [1, named - 1, named, named + 1] {
            let got = value_of(&log, from, 1 << 20);
            assert_eq!(
                got.first().map(|r| r.0),
                Some(from),
                "entry {entry} names {wrong_offset}: a fetch from {from}"
            );
            let offsets: Vec<u64> = got.iter().map(|r| r.0).collect();
            assert!(
                offsets.windows(2).all(|w| w[1] == w[0] + 1),
                "entry {entry} names {wrong_offset}: a fetch from {from} skips records"
            );
        }
    }
}

/// A roll onto a spare makes no directory change while writers wait: the spare
/// stays in `spares/` under its own name and no index is created until the roll's
/// group commit, which renames it only after the outgoing log is durable, creates
/// the index with the entries appended meanwhile, writes the header, and fsyncs the
/// log and both directories.
#[test]
fn a_roll_onto_a_spare_leaves_every_directory_change_to_its_commit() {
    let (_data, dir, stats) = with_spare_pool();
    let ops: Arc<Mutex<Vec<(OpKind, String)>>> = Arc::default();
    let seen = ops.clone();
    let storage: StorageRef = Arc::new(HookStorage::from_fn(Arc::new(RealStorage), move |op| {
        seen.lock().unwrap().push((op.kind(), file_name(op.path)));
        None
    }));
    stats.spares.set_new_target(1);
    assert_eq!(stats.spares.refill(&*storage).unwrap(), 1);
    let spare = std::fs::read_dir(stats.spares.dir().unwrap())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    create_first_segment(&*storage, &dir, &stats).unwrap();
    let log = PartitionLog::open("t", 0, &dir, storage, stats.clone())
        .unwrap()
        .0;
    let config = config(64 * 1024);
    let v = vec![5u8; 1000];
    let rec = [NewRecord {
        key: None,
        value: &v,
        timestamp_ms: 1,
    }];
    // Durable appends until one rolls; that one and 9 more (over two index
    // intervals) without a commit.
    let mut last;
    loop {
        ops.lock().unwrap().clear();
        let a = log.append(&rec, &config).unwrap();
        last = a.last_offset;
        if stats.write_path.rolls.load(Ordering::Relaxed) > 0 {
            break;
        }
        log.wait_durable(a.last_offset + 1).unwrap();
    }
    for _ in 0..9 {
        last = log.append(&rec, &config).unwrap().last_offset;
    }
    let new = log.snapshot().last().unwrap().clone();
    let base = new.base_offset;
    let (log_name, index_name) = (log_file_name(base), index_file_name(base));
    let during: Vec<(OpKind, String)> = ops.lock().unwrap().clone();
    assert!(
        during
            .iter()
            .all(|(k, _)| matches!(k, OpKind::WriteAt | OpKind::Allocate)),
        "the roll and the appends after it only write: {during:?}"
    );
    assert!(spare.exists(), "the spare keeps its name until the commit");
    assert!(!dir.join(&log_name).exists() && !dir.join(&index_name).exists());
    let entries = new.index_bytes();
    assert!(entries.len() >= 2 * INDEX_ENTRY_LEN, "{}", entries.len());
    // The commit.
    ops.lock().unwrap().clear();
    log.wait_durable(last + 1).unwrap();
    let commit: Vec<(OpKind, String)> = ops.lock().unwrap().clone();
    let at = |kind: OpKind, name: &str| {
        commit
            .iter()
            .position(|(k, n)| *k == kind && n == name)
            .unwrap_or_else(|| panic!("no {kind:?} of {name} in {commit:?}"))
    };
    let outgoing = log_file_name(log.snapshot()[0].base_offset);
    let spare_name = file_name(&spare);
    assert!(at(OpKind::SyncAll, &outgoing) < at(OpKind::Rename, &spare_name));
    assert!(at(OpKind::Rename, &spare_name) < at(OpKind::Create, &index_name));
    assert!(at(OpKind::Create, &index_name) < at(OpKind::SyncAll, &spare_name));
    assert!(at(OpKind::SyncAll, &spare_name) < at(OpKind::SyncDir, "0"));
    assert!(at(OpKind::SyncDir, "0") < at(OpKind::SyncDir, "spares"));
    assert!(!spare.exists());
    let (f, len) = crate::engine::storage::reader::open_log(&dir.join(&log_name)).unwrap();
    let header = read_header(&f, len).unwrap().unwrap();
    assert_eq!((header.base_offset, header.generation), (base, 0));
    assert_eq!(std::fs::read(dir.join(&index_name)).unwrap(), entries);
    // Every record reads back, after a reopen too.
    let want: Vec<(u64, usize)> = (0..=last).map(|o| (o, 1000)).collect();
    let mut got = Vec::new();
    while got.len() < want.len() {
        let from = got.last().map_or(0, |(o, _): &(u64, usize)| o + 1);
        got.extend(value_of(&log, from, 1 << 20));
    }
    assert_eq!(got, want);
    drop(log);
    let stats = Arc::new(LogStats::default());
    let log = PartitionLog::open("t", 0, &dir, Arc::new(RealStorage), stats)
        .unwrap()
        .0;
    assert_eq!(value_of(&log, base, 1 << 20).len() as u64, last + 1 - base);
}
