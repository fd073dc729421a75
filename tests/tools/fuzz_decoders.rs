//! A bounded randomized corpus for every decoder, run by `cargo test`: the same
//! properties the fuzz targets under `fuzz/` check (`seglog::testkit::fuzzprops`),
//! on random bytes and on valid encodings with bytes flipped, inserted and deleted;
//! damaged segments also go through recovery, which must leave nothing to redo.
//! Runs under an allocator that aborts on any single allocation over 80 MiB (the
//! `tools` binary installs it).
//!
//! `cargo test --release --test tools -- --ignored write_fuzz_seeds` writes
//! the seed inputs of each fuzz target into `fuzz/corpus/<target>/`.

use proptest::collection::vec;
use proptest::prelude::*;
use seglog::testkit::fuzzprops::{self, SegmentCase};

use crate::util::build::unhex;

/// One edit of a byte string.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, mask: u8 },
    Insert { at: usize, byte: u8 },
    Delete { at: usize },
    Truncate { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        2 => any::<usize>().prop_map(|at| Mutation::Delete { at }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn apply(bytes: &[u8], edits: &[Mutation]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for m in edits {
        let len = b.len();
        match *m {
            Mutation::Flip { at, mask } if len > 0 => b[at % len] ^= mask,
            Mutation::Insert { at, byte } => b.insert(at % (len + 1), byte),
            Mutation::Delete { at } if len > 0 => {
                b.remove(at % len);
            }
            Mutation::Truncate { at } => b.truncate(at % (len + 1)),
            _ => {}
        }
    }
    b
}

/// `tests/fixtures/vectors/records.json`, read once.
fn vectors() -> &'static serde_json::Value {
    static VECTORS: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    VECTORS.get_or_init(|| {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/vectors/records.json"
        ))
        .unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

/// The committed record vectors: (bytes, generation).
fn vector_records() -> Vec<(Vec<u8>, u64)> {
    let v = vectors();
    let records: Vec<(Vec<u8>, u64)> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                unhex(r["bytes_hex"].as_str().unwrap()),
                r["generation"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(records.len(), 8);
    records
}

/// The committed segment header vectors.
fn vector_headers() -> Vec<Vec<u8>> {
    vectors()["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| unhex(h["bytes_hex"].as_str().unwrap()))
        .collect()
}

/// A segment built from the committed vectors of one generation, as a clean log.
fn vector_segment(generation: u64) -> Vec<u8> {
    let mut log = seglog::format::SegmentHeader {
        base_offset: 0,
        generation,
        flags: 0,
    }
    .encode()
    .to_vec();
    for (offset, (bytes, g)) in (0u64..).zip(vector_records()) {
        let r = seglog::format::decode_record(&bytes, 0, g).unwrap();
        seglog::format::encode_record(&mut log, offset, r.timestamp_ms, r.key, r.value, generation)
            .unwrap();
    }
    log
}

#[test]
fn seeds_and_vectors_hold_the_properties() {
    for target in fuzzprops::TARGETS {
        let seeds = fuzzprops::seeds(target);
        assert!(!seeds.is_empty(), "{target} has no seeds");
        for s in seeds {
            fuzzprops::run_target(target, &s);
        }
    }
    for (bytes, generation) in vector_records() {
        // Each vector decodes (the re-encoding check is inside) under its generation.
        assert!(seglog::format::decode_record(&bytes, 32, generation).is_ok());
        fuzzprops::check_record(&bytes, 32, generation);
    }
    for h in vector_headers() {
        assert!(seglog::format::SegmentHeader::decode(&h).is_ok());
        fuzzprops::segment_header(&h);
    }
    for frame in fuzzprops::seed_request_frames() {
        assert!(seglog::format::wire::decode_request(&frame).is_ok());
    }
    for frame in fuzzprops::seed_response_frames() {
        // Each seed is valid under some protocol version (the describe-topic layout
        // differs between versions 1 and 2).
        use seglog::format::wire::{
            decode_response_version, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
        };
        assert!((PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION)
            .any(|v| decode_response_version(&frame, v).is_ok()));
    }
    // The scan recipes reach valid records, a sealed segment and an index.
    let cases: Vec<SegmentCase> = fuzzprops::seeds("segment_scan")
        .iter()
        .map(|s| fuzzprops::segment_case(s))
        .collect();
    let clean = fuzzprops::oracle_scan(&cases[0].log).unwrap();
    assert_eq!(clean.records.len(), 8);
    assert_eq!(clean.end, seglog::engine::storage::reader::ScanEnd::Eof);
    assert!(cases[0].next_base.is_some() && cases[0].index.is_some());
    let torn = fuzzprops::oracle_scan(&cases[1].log).unwrap();
    assert!(!torn.records.is_empty(), "{torn:?}");
    assert!(
        torn.end != seglog::engine::storage::reader::ScanEnd::Eof,
        "{torn:?}"
    );
    let log = vector_segment(5);
    fuzzprops::check_segment_case(&SegmentCase {
        base_offset: 0,
        index: Some(fuzzprops::rule_index_bytes(&log)),
        next_base: Some(8),
        log,
    });
}

/// Every input a fuzzer once crashed on, kept under `fuzz/regressions/<target>/`.
#[test]
fn fuzz_regressions_hold_the_properties() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut ran = 0;
    for target in fuzzprops::TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in dir {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            eprintln!("{}", path.display());
            fuzzprops::run_target(target, &data);
            ran += 1;
        }
    }
    assert!(ran > 0);
}

/// A valid record at offset `u64::MAX` followed by damage: the check has no next
/// offset to name (it once computed `u64::MAX + 1`).
#[test]
fn record_at_the_last_offset_then_a_torn_tail() {
    use seglog::engine::maintenance::check::{check_partition, CheckMode};
    use seglog::format::names::log_file_name;
    let base = u64::MAX - 1;
    let mut log = seglog::format::SegmentHeader::new(base).encode().to_vec();
    seglog::format::encode_record(&mut log, u64::MAX, 0, None, b"v", 0).unwrap();
    log.extend_from_slice(&[0, 0, 0, 40, 1]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(log_file_name(base)), &log).unwrap();
    let p = seglog::engine::storage::layout::PartitionRef {
        dir: dir.path().to_path_buf(),
        topic: None,
        partition: None,
        config: Default::default(),
        only_segment: None,
    };
    let check = check_partition(&p, CheckMode::Full).unwrap();
    let torn = check
        .all_problems()
        .find(|p| p.kind.as_str() == "torn_tail")
        .expect("torn tail reported");
    assert_eq!(torn.offset, None);
    assert_eq!(check.segments[0].last_offset, Some(u64::MAX));
    assert_eq!(check.next_offset(), Some(u64::MAX));
}

/// Recovery of a partition whose last valid record is at offset `u64::MAX`: there is
/// no offset to append at, so it refuses writes (it once computed `u64::MAX + 1`).
#[test]
fn recovery_after_a_record_at_the_last_offset() {
    use seglog::engine::maintenance::recovery::plan_partition;
    use seglog::format::names::log_file_name;
    let base = u64::MAX - 1;
    let mut log = seglog::format::SegmentHeader::new(base).encode().to_vec();
    seglog::format::encode_record(&mut log, u64::MAX, 0, None, b"v", 0).unwrap();
    log.extend_from_slice(&[0, 0, 0, 40, 1]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(log_file_name(base)), &log).unwrap();
    let p = seglog::engine::storage::layout::PartitionRef {
        dir: dir.path().to_path_buf(),
        topic: None,
        partition: None,
        config: Default::default(),
        only_segment: None,
    };
    let plan = plan_partition(&p).unwrap();
    assert_eq!(plan.next_offset, u64::MAX);
    assert!(plan.refuses_writes);
    assert!(
        matches!(
            plan.actions[0],
            seglog::engine::maintenance::recovery::Action::CutTail {
                next_offset: u64::MAX,
                ..
            }
        ),
        "{:?}",
        plan.actions
    );
}

#[test]
#[ignore = "writes seed files for the fuzzers; run by hand"]
fn write_fuzz_seeds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for target in fuzzprops::TARGETS {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in fuzzprops::seeds(target).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
    }
    let dir = root.join("record");
    for (i, (bytes, generation)) in vector_records().into_iter().enumerate() {
        let mut v = vec![6u8];
        v.extend_from_slice(&generation.to_be_bytes());
        v.extend_from_slice(&bytes);
        std::fs::write(dir.join(format!("vector-{i}")), v).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 8000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn record_random(data in vec(any::<u8>(), 0..200)) {
        fuzzprops::record(&data);
    }

    #[test]
    fn record_vectors_mutated(
        which in 0usize..8,
        edits in vec(mutation(), 1..4),
        fix_crc in any::<bool>(),
    ) {
        let (bytes, generation) = vector_records().swap_remove(which);
        let mut b = apply(&bytes, &edits);
        if fix_crc {
            fuzzprops::fix_record_crc(&mut b, generation);
        }
        fuzzprops::check_record(&b, 32, generation);
    }

    #[test]
    fn segment_header_random(data in vec(any::<u8>(), 0..48)) {
        fuzzprops::segment_header(&data);
    }

    #[test]
    fn segment_header_vectors_mutated(which in 0usize..3, edits in vec(mutation(), 1..3)) {
        let h = vector_headers().swap_remove(which);
        let b = apply(&h, &edits);
        fuzzprops::segment_header(&b);
        // A header with any byte changed in its first 32 bytes is refused.
        if b.len() >= 32 && b[..32] != h[..] {
            prop_assert!(seglog::format::SegmentHeader::decode(&b).is_err());
        }
    }

    #[test]
    fn index_random(
        entries in vec((0u64..5000, 0u64..100_000), 0..40),
        data_end in proptest::option::of(0u64..200_000),
        query in 0u64..6000,
        edits in vec(mutation(), 0..3),
        sorted in any::<bool>(),
    ) {
        let mut entries = entries;
        if sorted {
            entries.sort_unstable();
            entries.dedup_by_key(|e| e.0);
        }
        let mut bytes = Vec::new();
        for (rel, pos) in entries {
            seglog::format::IndexEntry { relative_offset: rel, position: pos }
                .encode_into(&mut bytes);
        }
        let bytes = apply(&bytes, &edits);
        fuzzprops::check_index(&bytes, data_end, query);
    }

    #[test]
    fn index_bytes(data in vec(any::<u8>(), 0..200)) {
        fuzzprops::index(&data);
    }

    #[test]
    fn json_mutated(which in 0usize..4, edits in vec(mutation(), 0..4)) {
        let (markers, topics) = fuzzprops::seed_json();
        if which < 2 {
            fuzzprops::compaction_marker(&apply(&markers[which], &edits));
        } else {
            fuzzprops::topic_json(&apply(&topics[which - 2], &edits));
        }
    }

    #[test]
    fn json_random(data in "[{}\\[\\]\":, 0-9a-z_\\-.]{0,80}") {
        fuzzprops::compaction_marker(data.as_bytes());
        fuzzprops::topic_json(data.as_bytes());
    }

    #[test]
    fn names_random(name in "[0-9a-z._/-]{0,30}", digits in "[0-9]{20}", ext in "(log|index)(\\.tmp)?") {
        fuzzprops::names(name.as_bytes());
        fuzzprops::names(digits.as_bytes());
        fuzzprops::names(format!("{digits}.{ext}").as_bytes());
    }

    #[test]
    fn auth_frames_random(data in vec(any::<u8>(), 0..120)) {
        fuzzprops::auth_frames(&data);
    }

    #[test]
    fn auth_frames_mutated(which in 0usize..4, edits in vec(mutation(), 1..4)) {
        let frames = fuzzprops::seed_auth_frames();
        fuzzprops::auth_frames(&frames[which]);
        fuzzprops::auth_frames(&apply(&frames[which], &edits));
    }

    #[test]
    fn protocol_random(data in vec(any::<u8>(), 0..120)) {
        fuzzprops::protocol_request(&data);
        fuzzprops::protocol_response(&data);
    }

    #[test]
    fn protocol_frames_mutated(which in 0usize..12, edits in vec(mutation(), 1..4)) {
        let requests = fuzzprops::seed_request_frames();
        let responses = fuzzprops::seed_response_frames();
        if let Some(frame) = requests.get(which) {
            fuzzprops::protocol_request(&apply(frame, &edits));
        }
        fuzzprops::protocol_response(&apply(&responses[which], &edits));
    }
}

proptest! {
    // Each case writes a partition directory: fewer cases.
    #![proptest_config(ProptestConfig {
        cases: 600,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn segment_scan_recipes(data in vec(any::<u8>(), 0..160)) {
        let mut data = data;
        if let Some(first) = data.first_mut() {
            *first |= 1;
        }
        fuzzprops::segment_scan(&data);
    }

    #[test]
    fn segment_scan_raw(data in vec(any::<u8>(), 0..200)) {
        let mut data = data;
        if let Some(first) = data.first_mut() {
            *first &= !1;
        }
        fuzzprops::segment_scan(&data);
    }

    #[test]
    fn segment_vectors_mutated(
        generation in prop_oneof![Just(0u64), Just(5), Just(u64::MAX)],
        edits in vec(mutation(), 1..4),
        with_index in any::<bool>(),
        sealed in any::<bool>(),
    ) {
        let clean = vector_segment(generation);
        let log = apply(&clean, &edits);
        // The empty next segment tiles (docs/FORMAT.md, Segment states): its base is
        // one past the last record the edits left.
        let next = fuzzprops::oracle_scan(&log)
            .and_then(|o| o.records.last().map(|r| r.1.saturating_add(1)))
            .unwrap_or(8);
        let case = SegmentCase {
            base_offset: 0,
            index: with_index.then(|| fuzzprops::rule_index_bytes(&clean)),
            next_base: sealed.then_some(next),
            log,
        };
        fuzzprops::check_segment_case(&case);
        fuzzprops::check_recovery(&case);
    }
}

/// A sealed segment without a record, followed by one at base + 1 (found by
/// `segment_scan_recipes`): the check must call it a segment that does not join.
#[test]
fn segment_scan_of_an_empty_sealed_segment() {
    fuzzprops::segment_scan(&[3, 144, 12, 0, 30, 160, 0, 16]);
}

#[test]
fn kafka_frames_decode_whole_and_refuse_every_cut() {
    for frame in fuzzprops::seed_kafka_frames() {
        let d = seglog::engine::net::kafka::decode_request(frame.clone().into());
        assert!(d.is_ok(), "{d:?}");
        fuzzprops::kafka_request(&frame);
        for cut in 0..frame.len() {
            fuzzprops::kafka_request(&frame[..cut]);
        }
    }
}

/// Requests whose first array claims far more elements than the frame has bytes (found
/// by `kafka_frames_mutated`): kafka-protocol 0.18 reserved room for the claimed count
/// before decoding an element, an allocation that aborts the process. The patched copy
/// (vendor/kafka-protocol) refuses the count, so these decode to an error.
#[test]
fn kafka_array_count_bombs_are_refused() {
    let frames: [&[u8]; 2] = [
        // Metadata v1: header (api 3, version 1, correlation 7, null client id), then
        // an Int32 topic count of 0x033c0c00 (54 268 928) and one byte of body.
        &[
            0, 3, 0, 1, 0, 0, 0, 7, 0xff, 0xff, 0x03, 0x3c, 0x0c, 0x00, 0xb6,
        ],
        // Metadata v9 (flexible): header v2, then a compact topic count of 2^32 - 2.
        &[
            0, 3, 0, 9, 0, 0, 0, 7, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0xb6,
        ],
    ];
    for frame in frames {
        let d = seglog::engine::net::kafka::decode_request(bytes::Bytes::from_static(frame));
        let e = d.expect_err("a count larger than the frame is an error");
        assert!(format!("{e:?}").contains("exceeds"), "{e:?}");
        fuzzprops::kafka_request(frame);
    }
}

proptest! {
    #[test]
    fn kafka_frames_mutated(which in 0usize..8, edits in vec(mutation(), 1..4)) {
        let frames = fuzzprops::seed_kafka_frames();
        fuzzprops::kafka_request(&apply(&frames[which % frames.len()], &edits));
    }
}
