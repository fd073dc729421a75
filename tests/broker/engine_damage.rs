//! Fetch around damage, against a model: a partition of several sealed segments gets
//! random bit flips (seeded), and fetches from every offset are checked against what
//! an independent decode of the original bytes says each flip touched.

use std::collections::BTreeSet;
use std::time::Duration;

use seglog::engine::broker::{Broker, BrokerOptions, EngineError, FetchResult};
use seglog::format::{decode_record, IndexEntry, HEADER_LEN, INDEX_ENTRY_LEN};

use crate::util::build::{topic_json, Segment};
use crate::util::fs::flip_in_place;
use crate::util::rng::{seed_or, with_seed, Rng};
use crate::util::storage::real;

/// Sealed segments of the partition, then the active one.
const SEALED: u64 = 4;
const PER_SEGMENT: u64 = 40;
const ACTIVE_RECORDS: u64 = 5;
const ROUNDS: u64 = 12;

fn offsets_of(f: &FetchResult) -> Vec<u64> {
    let mut out = Vec::new();
    for c in &f.chunks {
        let mut pos = 0;
        while pos < c.bytes.len() {
            let r = decode_record(&c.bytes[pos..], pos as u64, c.generation).unwrap();
            out.push(r.offset);
            pos += r.encoded_len;
        }
    }
    out
}

/// Each record of an undamaged log: (offset, position, encoded length), decoded from
/// its bytes.
fn decode_all(log: &[u8], generation: u64) -> Vec<(u64, usize, usize)> {
    let mut pos = HEADER_LEN;
    let mut out = Vec::new();
    while pos < log.len() {
        let r = decode_record(&log[pos..], pos as u64, generation).unwrap();
        out.push((r.offset, pos, r.encoded_len));
        pos += r.encoded_len;
    }
    out
}

/// The offset of the index entry at or before `offset` in a segment, else its base.
fn entry_at_or_before(seg: &Segment, offset: u64) -> u64 {
    seg.index
        .chunks_exact(INDEX_ENTRY_LEN)
        .filter_map(IndexEntry::decode)
        .map(|e| seg.base + e.relative_offset)
        .filter(|&o| o <= offset)
        .max()
        .unwrap_or(seg.base)
}

/// One partition, damaged and fetched from every offset; returns how many records
/// the flips damaged.
fn one_round(seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let part = topic_json(&data, "t", "{\"partitions\": 1, \"config\": {}}");
    let total = SEALED * PER_SEGMENT + ACTIVE_RECORDS;
    let mut segs = Vec::new();
    let mut base = 0;
    while base < total {
        let n = if base < SEALED * PER_SEGMENT {
            PER_SEGMENT
        } else {
            ACTIVE_RECORDS
        };
        let mut s = Segment::new(base, 2);
        for off in base..base + n {
            let len = 20 + rng.below(300) as usize;
            let value: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            let key = format!("k{}", rng.below(10));
            s.push(off, 1_000 + off as i64, Some(key.as_bytes()), &value);
        }
        segs.push(s);
        base += n;
    }
    // The model: which records the flips touch, from the original bytes.
    let mut damaged: BTreeSet<u64> = BTreeSet::new();
    for s in segs.iter_mut().take(SEALED as usize) {
        let records = decode_all(&s.log, s.generation);
        for _ in 0..rng.below(4) {
            let at = HEADER_LEN + rng.below((s.log.len() - HEADER_LEN) as u64) as usize;
            s.log[at] ^= 1 << rng.below(8);
            let (off, _, _) = records
                .iter()
                .find(|(_, p, l)| (*p..p + l).contains(&at))
                .unwrap();
            damaged.insert(*off);
        }
    }
    for s in &segs {
        s.write(&part);
    }
    let seg_of = |o: u64| &segs[(o / PER_SEGMENT).min(SEALED) as usize];
    let b = Broker::open(&data, real(), BrokerOptions::default()).unwrap();
    for o in 0..total {
        let got = b.fetch("t", 0, o, 1 << 20, Duration::ZERO);
        if damaged.contains(&o) {
            // The damaged run holding `o`, within its segment.
            let seg = seg_of(o);
            let mut run_start = o;
            while run_start > seg.base && damaged.contains(&(run_start - 1)) {
                run_start -= 1;
            }
            let mut run_end = o;
            while damaged.contains(&(run_end + 1)) && run_end + 1 < seg.base + PER_SEGMENT {
                run_end += 1;
            }
            // The fetch looks from the index entry at or before `o`.
            let first = run_start.max(entry_at_or_before(seg, o));
            match got {
                Err(EngineError::RecordsDamaged {
                    first: f, next: n, ..
                }) => {
                    assert_eq!(
                        (f, n),
                        (first, Some(run_end + 1)),
                        "fetch at {o}: damaged {damaged:?}"
                    );
                }
                other => panic!("fetch at {o}: {other:?}, damaged {damaged:?}"),
            }
        } else {
            let f = got.unwrap_or_else(|e| panic!("fetch at {o}: {e}, damaged {damaged:?}"));
            // Every readable record from `o` up to the next damaged one (or the end).
            let stop = damaged.range(o..).next().copied().unwrap_or(total);
            let want: Vec<u64> = (o..stop).collect();
            assert_eq!(offsets_of(&f), want, "fetch at {o}: damaged {damaged:?}");
        }
    }
    b.shutdown().unwrap();
    damaged.len()
}

#[test]
fn fetch_around_random_bit_flips_matches_the_model() {
    let seed = seed_or(0x5eed_da3a);
    println!("seed {seed}");
    let mut hit = 0;
    for round in 0..ROUNDS {
        let s = seed.wrapping_add(round);
        let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n2 = n.clone();
        with_seed(s, move || {
            n2.store(one_round(s), std::sync::atomic::Ordering::Relaxed);
        });
        hit += n.load(std::sync::atomic::Ordering::Relaxed);
    }
    assert!(hit > 0, "seed {seed}: no round damaged a record");
}

/// Damage that appears on the disk after a sealed segment was first counted is found
/// by the scrub: `topics describe` keeps the first count until a pass reads the
/// segment again; the pass names the segment and the offsets, shows the partition
/// as damaged, and a later pass over the mended bytes shows it whole again. The
/// background thread runs passes on its own at `scrub_interval`.
#[test]
fn the_scrub_finds_damage_that_appears_after_the_first_count() {
    use seglog::engine::broker::PartitionState;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let part = topic_json(&data, "t", "{\"partitions\": 1, \"config\": {}}");
    let mut segs = Vec::new();
    for base in [0u64, 40, 80] {
        let mut s = Segment::new(base, 2);
        for off in base..base + 40 {
            s.push(
                off,
                1_000 + off as i64,
                None,
                format!("v{off:04}").as_bytes(),
            );
        }
        s.write(&part);
        segs.push(s);
    }
    let opts = BrokerOptions {
        scrub_interval: Some(Duration::from_millis(200)),
        ..BrokerOptions::default()
    };
    let b = Broker::open(&data, real(), opts).unwrap();
    let state = |b: &Broker| {
        let p = b.describe_topic("t").unwrap().partitions.remove(0);
        (p.state, p.detail, p.records)
    };
    assert_eq!(state(&b), (PartitionState::Ok, None, 120));
    // The background thread's passes find nothing.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while b.scrub_figures().passes < 2 {
        assert!(std::time::Instant::now() < deadline, "no scrub pass ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = b.scrub_figures();
    assert_eq!(before.damaged, 0);
    // Two sealed segments of 40 records each are read by every pass.
    assert!(before.bytes >= 2 * (segs[0].log.len() + segs[1].log.len()) as u64);

    // Record 50 of the second segment is damaged under the running broker.
    let records = decode_all(&segs[1].log, segs[1].generation);
    let (off, pos, _) = records[10];
    assert_eq!(off, 50);
    let path = part.join(format!("{:020}.log", 40));
    flip_in_place(&path, (pos + 20) as u64, 0x04);
    let found = b.run_scrub(u64::MAX);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(&format!(
            "{}: unreadable from offset 50, next readable offset 51",
            path.display()
        )),
        "{found:?}"
    );
    assert!(found[0].contains("seglog recover --salvage"), "{found:?}");
    let (s, detail, records) = state(&b);
    assert_eq!(s, PartitionState::Damaged);
    assert!(
        detail.unwrap().contains("unreadable from offset 50"),
        "the describe line names the damage"
    );
    assert_eq!(records, 119);
    assert!(b.scrub_figures().damaged > before.damaged);

    // The bytes put back (as a restore from a copy would): the next pass clears it.
    flip_in_place(&path, (pos + 20) as u64, 0x04);
    assert_eq!(b.run_scrub(u64::MAX), Vec::<String>::new());
    assert_eq!(state(&b), (PartitionState::Ok, None, 120));
    b.shutdown().unwrap();
}

/// A slow scrub gives way to the shutdown: a pass paced at 1 byte per second stops at
/// its next step instead of holding the broker open.
#[test]
fn a_paced_scrub_stops_with_the_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let part = topic_json(&data, "t", "{\"partitions\": 1, \"config\": {}}");
    for base in [0u64, 4000] {
        let mut s = Segment::new(base, 2);
        for off in base..base + 4000 {
            s.push(off, 1_000, None, &[7u8; 500]);
        }
        s.write(&part);
    }
    let opts = BrokerOptions {
        scrub_interval: Some(Duration::from_millis(10)),
        scrub_rate: 1,
        ..BrokerOptions::default()
    };
    let b = Broker::open(&data, real(), opts).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while b.scrub_figures().bytes == 0 {
        assert!(std::time::Instant::now() < deadline, "the scrub never read");
        std::thread::sleep(Duration::from_millis(10));
    }
    let began = std::time::Instant::now();
    b.shutdown().unwrap();
    // At 1 byte per second the 2 MB segment would take weeks.
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(b.scrub_figures().passes, 0);
}
