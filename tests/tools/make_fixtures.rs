//! The generator of the committed data directories under `tests/fixtures/` (all but
//! `vectors/`, which come from an independent encoder). Deterministic: the same code
//! gives the same bytes.
//!
//! The fixtures are generated once and committed; normal tests never regenerate them.
//! `cargo test --test tools make_fixtures -- --ignored` rebuilds them in a temporary
//! directory and fails if they differ from the committed bytes;
//! with `SEGLOG_WRITE_FIXTURES=1` it writes them into `tests/fixtures/` instead
//! (only for a deliberate change; update tests/fixtures/README.md with it).

use std::fs;
use std::path::{Path, PathBuf};

use seglog::format::encode_record;
use seglog::format::marker::CompactionMarker;
use seglog::format::names::{index_file_name, log_file_name};
use seglog::format::topic::{CleanupPolicy, TopicConfig};

use crate::util::build::{self, Rec};

/// Roll a segment once its data reaches this many bytes (so every sealed segment's
/// index has two entries).
const ROLL_BYTES: usize = 4500;
const T0_MS: i64 = 1_700_000_000_000;

/// Deterministic filler text.
fn filler(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            b"abcdefghijklmnopqrstuvwxyz"[((x >> 33) % 26) as usize]
        })
        .collect()
}

/// The record stream of the `events` topic: every fourth record keyless, keys cycle
/// over five users.
fn event(i: u64) -> Rec {
    let key = (i % 4 != 0).then(|| format!("user-{}", i % 5).into_bytes());
    let mut value = format!("event {i}: ").into_bytes();
    value.extend(filler(i, 60 + (i as usize * 37) % 90));
    Rec {
        offset: i,
        timestamp_ms: T0_MS + i as i64 * 1000,
        key,
        value,
    }
}

/// One segment's bytes: header, records, and the index the rule gives.
fn segment(base: u64, generation: u64, recs: &[Rec]) -> (Vec<u8>, Vec<u8>) {
    let s = build::segment(base, generation, recs);
    (s.log, s.index)
}

/// Splits records into segments of about ROLL_BYTES, the last one holding `active` records.
fn split(recs: &[Rec], active: usize) -> Vec<Vec<Rec>> {
    let (sealed, tail) = recs.split_at(recs.len() - active);
    let mut out: Vec<Vec<Rec>> = Vec::new();
    let mut bytes = ROLL_BYTES;
    for r in sealed {
        if bytes >= ROLL_BYTES {
            out.push(Vec::new());
            bytes = 32;
        }
        bytes += 32 + r.key.as_ref().map_or(0, Vec::len) + r.value.len();
        out.last_mut().unwrap().push(r.clone());
    }
    out.push(tail.to_vec());
    out
}

struct Seg {
    base: u64,
    log: Vec<u8>,
    index: Vec<u8>,
    /// Positions of the records in `log`.
    positions: Vec<u64>,
}

/// Segments that tile (docs/FORMAT.md, Segment states): each base is the previous
/// segment's last offset + 1, so a segment's first record may lie above its base.
fn segments(recs: &[Rec], active: usize, generations: &[u64]) -> Vec<Seg> {
    let mut next_base = recs[0].offset;
    split(recs, active)
        .iter()
        .zip(generations.iter().cycle())
        .map(|(rs, &g)| {
            let base = next_base;
            next_base = rs.last().map_or(base, |r| r.offset + 1);
            let (log, index) = segment(base, g, rs);
            let mut positions = Vec::new();
            let mut pos = 32u64;
            for r in rs {
                positions.push(pos);
                pos += 32 + r.key.as_ref().map_or(0, Vec::len) as u64 + r.value.len() as u64;
            }
            Seg {
                base,
                log,
                index,
                positions,
            }
        })
        .collect()
}

/// The partition every damaged fixture starts from: `events/0`, three segments of
/// generations 0, 3 and 2 (the last one active).
fn base_partition() -> Vec<Seg> {
    let recs: Vec<Rec> = (0..70).map(event).collect();
    let segs = segments(&recs, 10, &[0, 3, 2]);
    assert_eq!(segs.len(), 3);
    for s in &segs[..2] {
        assert!(s.index.len() >= 32, "sealed segments need 2+ index entries");
    }
    segs
}

fn write_topic(data: &Path, topic: &str, partitions: u32, config: TopicConfig) -> PathBuf {
    build::topic(data, topic, partitions, config)
}

fn small_segments() -> TopicConfig {
    TopicConfig {
        segment_bytes: 4608,
        ..TopicConfig::default()
    }
}

fn write_partition(dir: &Path, segs: &[Seg]) {
    fs::create_dir_all(dir).unwrap();
    for s in segs {
        fs::write(dir.join(log_file_name(s.base)), &s.log).unwrap();
        fs::write(dir.join(index_file_name(s.base)), &s.index).unwrap();
    }
}

/// A data directory with one topic `events` (one partition) holding `segs`.
fn events_dir(data: &Path, segs: &[Seg], config: TopicConfig) -> PathBuf {
    let p = write_topic(data, "events", 1, config).join("0");
    write_partition(&p, segs);
    p
}

fn clean(data: &Path) {
    let topic = write_topic(data, "events", 2, small_segments());
    write_partition(&topic.join("0"), &base_partition());
    let recs: Vec<Rec> = (0..12)
        .map(|i| Rec {
            offset: i,
            timestamp_ms: T0_MS + 500 + i as i64 * 1000,
            key: Some(format!("device-{}", i % 3).into_bytes()),
            value: format!("{{\"reading\": {}}}", i * 7).into_bytes(),
        })
        .collect();
    write_partition(&topic.join("1"), &segments(&recs, 12, &[0]));
    // A compacted topic: the sealed segment has the gaps compaction leaves.
    let config = TopicConfig {
        cleanup_policy: CleanupPolicy::Compact,
        ..small_segments()
    };
    let users = write_topic(data, "users", 1, config);
    let recs: Vec<Rec> = (0..80u64)
        .filter(|i| i % 3 != 1 || *i >= 60)
        .map(|i| Rec {
            offset: i,
            timestamp_ms: T0_MS + i as i64 * 250,
            key: Some(format!("user-{}", i % 17).into_bytes()),
            value: if i % 11 == 5 {
                Vec::new()
            } else {
                let mut v = format!("profile {i} ").into_bytes();
                v.extend(filler(1000 + i, 40 + (i as usize * 13) % 70));
                v
            },
        })
        .collect();
    write_partition(&users.join("0"), &segments(&recs, 8, &[1]));
}

fn make(root: &Path) {
    let base = base_partition();
    let d = |name: &str| root.join(name);

    clean(&d("clean"));

    let mut segs = base_partition();
    let next = event(70);
    let mut rec = Vec::new();
    encode_record(
        &mut rec,
        next.offset,
        next.timestamp_ms,
        next.key.as_deref(),
        &next.value,
        2,
    )
    .unwrap();
    segs[2].log.extend_from_slice(&rec[..20]);
    events_dir(&d("torn-tail"), &segs, small_segments());

    let mut segs = base_partition();
    segs[2].log.extend_from_slice(&[0; 1024]);
    events_dir(&d("zero-tail"), &segs, small_segments());

    let mut segs = base_partition();
    for i in 0..3u64 {
        // What an earlier life (generation 1) of the reused file held there.
        let r = event(500 + i);
        encode_record(
            &mut segs[2].log,
            r.offset,
            r.timestamp_ms,
            r.key.as_deref(),
            &r.value,
            1,
        )
        .unwrap();
    }
    events_dir(&d("stale-tail"), &segs, small_segments());

    let mut segs = base_partition();
    let victim = segs[0].positions[10] as usize + 40;
    segs[0].log[victim] ^= 0x04;
    events_dir(&d("bit-flip-sealed"), &segs, small_segments());

    let p = events_dir(&d("missing-index"), &base, small_segments());
    fs::remove_file(p.join(index_file_name(0))).unwrap();

    let mut segs = base_partition();
    // Entry 1's position (bytes 24..32) points 8 bytes into its record.
    segs[0].index[31] = segs[0].index[31].wrapping_add(8);
    events_dir(&d("wrong-index-entry"), &segs, small_segments());

    let mut segs = base_partition();
    let extra = segs[2].index[..8].to_vec();
    segs[2].index.extend_from_slice(&extra);
    events_dir(&d("partial-index-entry"), &segs, small_segments());

    let p = events_dir(&d("leftover-temp"), &base, small_segments());
    fs::write(
        p.join(format!("{}.tmp", index_file_name(base[1].base))),
        &base[1].index,
    )
    .unwrap();

    // Compaction stopped after step 3 (marker durable), before the renames.
    let config = TopicConfig {
        cleanup_policy: CleanupPolicy::Compact,
        ..small_segments()
    };
    let p = events_dir(&d("compaction-marker"), &base, config);
    let sealed: Vec<Rec> = (0..base[2].base).map(event).collect();
    let survivors: Vec<Rec> = sealed
        .iter()
        .filter(|r| match &r.key {
            None => true,
            Some(k) => !sealed[r.offset as usize + 1..]
                .iter()
                .any(|later| later.key.as_ref() == Some(k)),
        })
        .cloned()
        .collect();
    let (log, index) = segment(0, 0, &survivors);
    fs::write(p.join(format!("{}.tmp", log_file_name(0))), &log).unwrap();
    fs::write(p.join(format!("{}.tmp", index_file_name(0))), &index).unwrap();
    let marker = CompactionMarker {
        new: vec![0],
        replaced: vec![base[0].base, base[1].base],
    };
    fs::write(p.join("compaction.marker"), marker.encode()).unwrap();

    let mut segs = base_partition();
    segs[2].log[12] ^= 0x10; // a bit of base_offset: the header CRC no longer matches
    events_dir(&d("bad-header-newest"), &segs, small_segments());

    let p = events_dir(&d("unwritten-newest"), &base, small_segments());
    let next_base = 70;
    fs::write(p.join(log_file_name(next_base)), vec![0u8; 4096]).unwrap();

    let mut segs = base_partition();
    segs[1].log.extend_from_slice(&[0; 600]);
    events_dir(&d("unfinished-seal"), &segs, small_segments());

    let mut segs = base_partition();
    let victim = segs[0].positions[29] as usize + 40;
    segs[0].log[victim] ^= 0x04;
    events_dir(&d("bit-flip-last-record"), &segs, small_segments());

    let mut segs = base_partition();
    segs[0].log[1] ^= 0x10; // a bit of the magic of a sealed segment
    events_dir(&d("damaged-header-sealed"), &segs, small_segments());

    let p = events_dir(&d("missing-middle-segment"), &base, small_segments());
    fs::remove_file(p.join(log_file_name(base[1].base))).unwrap();
    fs::remove_file(p.join(index_file_name(base[1].base))).unwrap();

    lost_segments(&d);
}

/// A compacted partition of four segments that tile, with the gaps compaction leaves
/// (sealed `…00`, `…35`, `…70`, active `…90`; see tests/fixtures/README.md).
fn compacted_partition() -> Vec<Seg> {
    let recs: Vec<Rec> = (0..100u64)
        .filter(|i| i % 7 != 3 || *i >= 90)
        .map(event)
        .collect();
    let segs = segments(&recs, 10, &[0, 3, 2, 1]);
    assert_eq!(segs.len(), 4);
    segs
}

/// Segments lost from a compacted topic: gaps are no excuse, every segment tiles.
fn lost_segments(d: &dyn Fn(&str) -> PathBuf) {
    let config = TopicConfig {
        cleanup_policy: CleanupPolicy::Compact,
        ..small_segments()
    };
    let segs = compacted_partition();
    let p = events_dir(&d("compacted-lost-middle-segment"), &segs, config.clone());
    fs::remove_file(p.join(log_file_name(segs[1].base))).unwrap();
    fs::remove_file(p.join(index_file_name(segs[1].base))).unwrap();

    let p = events_dir(&d("compacted-lost-middle-log"), &segs, config.clone());
    fs::remove_file(p.join(log_file_name(segs[1].base))).unwrap();

    let p = events_dir(&d("compacted-lost-last-sealed"), &segs, config);
    fs::remove_file(p.join(log_file_name(segs[2].base))).unwrap();
    fs::remove_file(p.join(index_file_name(segs[2].base))).unwrap();
}

/// The topic metadata fixtures (docs/FORMAT.md, Data directory): `clean` with the
/// `events` topic's metadata damaged; `users` stays whole.
fn make_meta(root: &Path) {
    let d = |name: &str| root.join(name);
    let meta = |partitions| {
        seglog::format::topic::TopicMeta {
            partitions,
            config: small_segments(),
        }
        .encode()
    };
    let events = |name: &str| d(name).join("topics/events");

    clean(&d("topic-json-missing"));
    fs::remove_file(events("topic-json-missing").join("topic.json")).unwrap();

    clean(&d("topic-json-truncated"));
    let full = meta(2);
    fs::write(
        events("topic-json-truncated").join("topic.json"),
        &full[..full.len() / 2],
    )
    .unwrap();

    // Directories 0-3 on disk, "partitions": 2.
    clean(&d("topic-too-few-partitions"));
    let dir = events("topic-too-few-partitions");
    for p in [2u64, 3] {
        let recs: Vec<Rec> = (0..5)
            .map(|i| event(100 * p + i))
            .map(|mut r| {
                r.offset -= 100 * p;
                r
            })
            .collect();
        write_partition(&dir.join(p.to_string()), &segments(&recs, 5, &[0]));
    }

    // "partitions": 4, directories 0-1 on disk.
    clean(&d("topic-too-many-partitions"));
    fs::write(
        events("topic-too-many-partitions").join("topic.json"),
        meta(4),
    )
    .unwrap();
}

/// Every file below `dir`, relative, with its bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

const NAMES: [&str; 19] = [
    "clean",
    "torn-tail",
    "zero-tail",
    "stale-tail",
    "bit-flip-sealed",
    "missing-index",
    "wrong-index-entry",
    "partial-index-entry",
    "leftover-temp",
    "compaction-marker",
    "bad-header-newest",
    "unwritten-newest",
    "unfinished-seal",
    "missing-middle-segment",
    "compacted-lost-middle-segment",
    "compacted-lost-middle-log",
    "compacted-lost-last-sealed",
    "bit-flip-last-record",
    "damaged-header-sealed",
];

/// The fixtures [`make_meta`] writes.
pub const META_NAMES: [&str; 4] = [
    "topic-json-missing",
    "topic-json-truncated",
    "topic-too-few-partitions",
    "topic-too-many-partitions",
];

#[test]
#[ignore = "generates the committed fixtures; run deliberately"]
fn make_fixtures() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    if std::env::var_os("SEGLOG_WRITE_FIXTURES").is_some_and(|v| v == "1") {
        for name in NAMES.iter().chain(&META_NAMES) {
            let _ = fs::remove_dir_all(fixtures.join(name));
        }
        make(&fixtures);
        make_meta(&fixtures);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    make(tmp.path());
    make_meta(tmp.path());
    for name in NAMES.iter().chain(&META_NAMES) {
        let fresh = tree(&tmp.path().join(name));
        let committed = tree(&fixtures.join(name));
        let names = |t: &[(PathBuf, Vec<u8>)]| t.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
        assert_eq!(names(&committed), names(&fresh), "{name}: file list");
        for ((p, a), (_, b)) in committed.iter().zip(fresh.iter()) {
            assert!(
                a == b,
                "{name}/{}: committed bytes differ from the generator",
                p.display()
            );
        }
    }
}
