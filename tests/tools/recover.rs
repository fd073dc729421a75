//! Recovery (docs/FORMAT.md, Recovery) on damaged partitions built with the format encoder:
//! the exact bytes left, the report, the backups, a clean check afterwards (or exit 2
//! where corruption remains), a second run that changes nothing, fault injection at
//! every mutation and every sync, and the `seglog recover` command line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use seglog::engine::maintenance::check::{check_partition, CheckMode, Severity};
use seglog::engine::maintenance::recovery::{self, Action};
use seglog::engine::storage::io::RealStorage;
use seglog::engine::storage::layout::resolve;
use seglog::engine::storage::lock::DirLock;
use seglog::engine::storage::reader::{open_log, read_header, scan_segment};
use seglog::format::marker::CompactionMarker;
use seglog::format::names::{index_file_name, log_file_name, spare_file_name, SPARES_DIR};
use seglog::format::SegmentHeader;
use seglog::testkit::storage::{FailOn, FailingStorage};

use crate::util::bin::seglog;
use crate::util::build::{topic_json, Segment};
use crate::util::fs::{copy_tree, files};
use crate::util::rng::{seed_or, Rng};

const VALUE_LEN: usize = 200;

/// A segment of `offsets`: key `k{offset % 7}`, `VALUE_LEN` bytes of one letter,
/// timestamp = offset.
fn seg(base: u64, generation: u64, offsets: impl IntoIterator<Item = u64>) -> Segment {
    let mut s = Segment::new(base, generation);
    for o in offsets {
        let key = format!("k{}", o % 7);
        let value = vec![b'a' + (o % 26) as u8; VALUE_LEN];
        s.push(o, o as i64, Some(key.as_bytes()), &value);
    }
    s
}

struct Data {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    part: PathBuf,
}

fn data_dir(config: &str) -> Data {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let part = topic_json(
        &data,
        "t",
        &format!("{{\"partitions\": 1, \"config\": {{{config}}}}}"),
    );
    Data {
        _tmp: tmp,
        data,
        part,
    }
}

impl Data {
    fn new() -> Data {
        data_dir("")
    }
    fn put(&self, base: u64, log: &[u8], index: Option<&[u8]>) {
        fs::write(self.part.join(log_file_name(base)), log).unwrap();
        if let Some(i) = index {
            fs::write(self.part.join(index_file_name(base)), i).unwrap();
        }
    }
    fn log(&self, base: u64) -> PathBuf {
        self.part.join(log_file_name(base))
    }
    fn index(&self, base: u64) -> PathBuf {
        self.part.join(index_file_name(base))
    }
    fn backup(&self) -> PathBuf {
        self._tmp.path().join("backup")
    }
}

/// The offsets every segment of the partition holds, in file order.
fn offsets(part: &Path) -> Vec<u64> {
    let mut logs: Vec<PathBuf> = fs::read_dir(part)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    let mut out = Vec::new();
    for log in logs {
        let (f, len) = open_log(&log).unwrap();
        let Ok(h) = read_header(&f, len).unwrap() else {
            continue;
        };
        scan_segment(&f, &h, len, |_, r| out.push(r.offset)).unwrap();
    }
    out
}

/// What `verify` (a full check) says of the data directory.
fn full_severity(data: &Path) -> Option<Severity> {
    let t = resolve(data).unwrap();
    t.partitions
        .iter()
        .filter_map(|p| check_partition(p, CheckMode::Full).unwrap().severity())
        .max()
}

/// Runs `seglog recover DATA --json [extra]`; returns (exit code, JSON).
/// `seglog TOOL --json DATA`: the exit code and what it printed.
fn json_of(tool: &str, data: &Path) -> (i32, String) {
    let out = seglog().args([tool, "--json"]).arg(data).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

fn recover_cli(data: &Path, extra: &[&str]) -> (i32, Value) {
    let out = seglog()
        .arg("recover")
        .arg(data)
        .arg("--json")
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout:?} stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), v)
}

fn kinds(v: &Value) -> Vec<String> {
    v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Recovers with a backup, checks what the caller expects through `check`, then
/// asserts a clean (or corrupt) state and that a second run changes nothing.
fn recover_twice(d: &Data, expect_exit: i32) -> Value {
    let backup = d.backup();
    let (code, v) = recover_cli(&d.data, &["--backup-dir", backup.to_str().unwrap()]);
    assert_eq!(code, expect_exit, "{v:#}");
    let after = files(&d.data);
    let (code2, v2) = recover_cli(&d.data, &[]);
    assert_eq!(code2, expect_exit, "{v2:#}");
    assert!(kinds(&v2).is_empty(), "second run did something: {v2:#}");
    assert_eq!(files(&d.data), after, "second run changed bytes");
    let want = if expect_exit == 0 {
        None
    } else {
        Some(Severity::Corrupt)
    };
    assert_eq!(full_severity(&d.data), want, "{}", full_problems(&d.data));
    let verify = seglog().arg("verify").arg(&d.data).output().unwrap();
    assert_eq!(
        verify.status.code(),
        Some(expect_exit),
        "seglog verify: {}",
        String::from_utf8_lossy(&verify.stdout)
    );
    v
}

fn full_problems(data: &Path) -> String {
    let t = resolve(data).unwrap();
    let mut out = String::new();
    for p in &t.partitions {
        for pr in check_partition(p, CheckMode::Full).unwrap().all_problems() {
            let _ = writeln!(out, "{pr:?}");
        }
    }
    out
}

fn backup_file(d: &Data, rel: &str) -> Vec<u8> {
    fs::read(d.backup().join(rel)).unwrap_or_else(|e| {
        panic!(
            "backup {rel}: {e}; backup holds {:?}",
            files(&d.backup()).keys().collect::<Vec<_>>()
        )
    })
}

const P0: &str = "topics/t/0";

#[test]
fn torn_tail_is_cut_and_backed_up() {
    let d = Data::new();
    let s = seg(0, 0, 0..10);
    let whole = seg(0, 0, 0..11);
    let (_, pos10, len10) = whole.records[10];
    let mut log = whole.log.clone();
    log.truncate(pos10 as usize + len10 / 2);
    d.put(0, &log, Some(&s.index));
    let (code, _) = recover_cli(&d.data, &["--dry-run"]);
    assert_eq!(code, 1, "dry run exits with the verify code");
    assert_eq!(fs::read(d.log(0)).unwrap(), log, "dry run changed nothing");
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["cut_tail"]);
    let a = &v["actions"][0];
    assert_eq!(a["path"], format!("{P0}/{}", log_file_name(0)));
    assert_eq!(a["from"], pos10);
    assert_eq!(a["to"], log.len() as u64);
    assert_eq!(a["next_offset"], 10);
    assert_eq!(a["tail"], "torn_tail");
    assert_eq!(a["records_cut"], Value::Null);
    // Nothing whole behind the tear: only a write the crash interrupted.
    assert!(
        a["description"]
            .as_str()
            .unwrap()
            .ends_with("; never acknowledged"),
        "{a}"
    );
    assert_eq!(v["partitions"][0]["next_offset"], 10);
    assert_eq!(v["severity_after"], "clean");
    assert_eq!(fs::read(d.log(0)).unwrap(), s.log);
    assert_eq!(fs::read(d.index(0)).unwrap(), s.index);
    let name = format!("{P0}/{}.bytes-{pos10}-{}", log_file_name(0), log.len());
    assert_eq!(backup_file(&d, &name), &log[pos10 as usize..]);
    assert_eq!(offsets(&d.part), (0..10).collect::<Vec<_>>());
}

#[test]
fn damage_inside_the_active_segment_cuts_and_names_the_records_behind_it() {
    let d = Data::new();
    let s = seg(0, 0, 0..12);
    let mut log = s.log.clone();
    let (_, pos5, _) = s.records[5];
    log[pos5 as usize + 25] ^= 0x40;
    d.put(0, &log, Some(&s.index));
    // Whole records behind the damage may have been acknowledged (a flipped bit in
    // old data) or not (a crash tore their group commit): neither tool claims which.
    let (code, text) = json_of("verify", &d.data);
    assert_eq!(code, 1, "{text}");
    let may_be = "never acknowledged if a crash tore the group commit that wrote them, \
                  acknowledged if this is damage to older data";
    assert!(
        text.contains(&format!(
            "6 valid record(s), offsets 6..=11 follow it in the {} bytes from here ({may_be}); \
             recover cuts them all",
            log.len() as u64 - pos5
        )),
        "{text}"
    );
    assert!(!text.contains("were never acknowledged"), "{text}");
    let v = recover_twice(&d, 0);
    let a = &v["actions"][0];
    assert_eq!(a["kind"], "cut_tail");
    assert_eq!(a["from"], pos5);
    assert_eq!(a["next_offset"], 5);
    assert_eq!(
        a["records_cut"],
        serde_json::json!({"first_offset": 6, "last_offset": 11, "count": 6})
    );
    let description = a["description"].as_str().unwrap();
    assert!(
        description.contains(&format!(
            "6 valid record(s), offsets 6..=11 follow the damaged one and are cut with it ({may_be})"
        )),
        "{description}"
    );
    assert!(
        !description.contains("; never acknowledged"),
        "{description}"
    );
    assert_eq!(fs::read(d.log(0)).unwrap(), &s.log[..pos5 as usize]);
    let name = format!("{P0}/{}.bytes-{pos5}-{}", log_file_name(0), log.len());
    assert_eq!(backup_file(&d, &name), &log[pos5 as usize..]);
    assert_eq!(offsets(&d.part), (0..5).collect::<Vec<_>>());
}

/// Damage that leaves no length to step over (a length field made huge, a zeroed
/// sector): the records behind it are found where they resume, and named.
#[test]
fn records_behind_damaged_lengths_or_zeros_are_named() {
    for zeros in [false, true] {
        let d = Data::new();
        let s = seg(0, 0, 0..12);
        let mut log = s.log.clone();
        let (_, pos5, _) = s.records[5];
        let (_, pos7, _) = s.records[7];
        if zeros {
            log[pos5 as usize..pos7 as usize].fill(0);
        } else {
            log[pos5 as usize] = 0x7f;
        }
        d.put(0, &log, Some(&s.index));
        let v = recover_twice(&d, 0);
        let a = &v["actions"][0];
        assert_eq!(a["kind"], "cut_tail", "{v:#}");
        assert_eq!(a["from"], pos5);
        let first = if zeros { 7 } else { 6 };
        assert_eq!(
            a["records_cut"],
            serde_json::json!({"first_offset": first, "last_offset": 11, "count": 12 - first}),
            "zeros: {zeros}"
        );
        assert_eq!(offsets(&d.part), (0..5).collect::<Vec<_>>());
    }
}

#[test]
fn an_index_that_covered_the_cut_range_is_rebuilt_after_the_cut() {
    let d = Data::new();
    let s = seg(0, 0, 0..40);
    // The record the last index entry points at is the torn one.
    let last_entry_pos = u64::from_be_bytes(s.index[s.index.len() - 8..].try_into().unwrap());
    let j = s
        .records
        .iter()
        .position(|r| r.1 == last_entry_pos)
        .unwrap();
    let log = &s.log[..last_entry_pos as usize + 10];
    d.put(0, log, Some(&s.index));
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["cut_tail", "rebuild_index"]);
    let want = seg(0, 0, 0..j as u64);
    assert_eq!(fs::read(d.log(0)).unwrap(), want.log);
    assert_eq!(fs::read(d.index(0)).unwrap(), want.index);
    assert_eq!(want.index.len() + 16, s.index.len());
}

#[test]
fn zero_tail_is_kept_and_a_clean_dry_run_exits_0() {
    // Preallocated, zeroed space after the active segment's data is kept: a restart
    // keeps the space, and zeros are never records.
    let d = Data::new();
    let s = seg(0, 0, 0..5);
    let mut log = s.log.clone();
    log.extend_from_slice(&[0u8; 4096]);
    d.put(0, &log, Some(&s.index));
    let (code, plan) = recover_cli(&d.data, &["--dry-run"]);
    assert_eq!(code, 0, "a zero tail is a legal state: {plan:#}");
    assert!(kinds(&plan).is_empty(), "{plan:#}");
    let v = recover_twice(&d, 0);
    assert!(kinds(&v).is_empty(), "{v:#}");
    assert_eq!(fs::read(d.log(0)).unwrap(), log);
    assert_eq!(offsets(&d.part), (0..5).collect::<Vec<_>>());
    assert_eq!(v["partitions"][0]["next_offset"], 5);
}

#[test]
fn zeros_followed_by_other_bytes_are_a_torn_tail_and_cut() {
    // A zero run that does not reach the end of the file is not preallocated space
    // (a torn write lost its first sector): cut, zeros and all.
    let d = Data::new();
    let s = seg(0, 0, 0..5);
    let mut log = s.log.clone();
    log.extend_from_slice(&[0u8; 600]);
    log.extend_from_slice(b"left over");
    d.put(0, &log, Some(&s.index));
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["cut_tail"]);
    assert_eq!(v["actions"][0]["tail"], "torn_tail");
    assert_eq!(fs::read(d.log(0)).unwrap(), s.log);
}

#[test]
fn stale_tail_is_cut_and_never_resurrected() {
    let d = Data::new();
    // Generation 3 holds 0..4; behind it, records 4..12 an earlier generation wrote.
    let s = seg(0, 3, 0..4);
    let old = seg(0, 2, 0..12);
    let mut log = s.log.clone();
    log.extend_from_slice(&old.log[s.log.len()..]);
    d.put(0, &log, Some(&s.index));
    let v = recover_twice(&d, 0);
    assert_eq!(v["actions"][0]["tail"], "stale_tail");
    assert_eq!(fs::read(d.log(0)).unwrap(), s.log);
    assert_eq!(offsets(&d.part), (0..4).collect::<Vec<_>>());
}

/// A reused active segment (generation 3) holding records 0..4 with values shorter
/// than those of the generation before it, followed by the bytes generation 2 left
/// there: the data ends inside one of its records, as after a crash of a writer on
/// a reused spare. Returns the segment of generation 3 and the whole file.
fn inside_an_older_record() -> (Segment, Vec<u8>) {
    let mut s = Segment::new(0, 3);
    for o in 0..4 {
        s.push(o, o as i64, Some(b"k"), b"short");
    }
    let old = seg(0, 2, 0..12);
    assert!(
        old.records
            .iter()
            .all(|&(_, pos, _)| pos != s.log.len() as u64),
        "the data must end inside an old record"
    );
    let mut log = s.log.clone();
    log.extend_from_slice(&old.log[s.log.len()..]);
    (s, log)
}

#[test]
fn data_ending_inside_an_older_generations_record_is_a_stale_tail() {
    let d = Data::new();
    let (s, log) = inside_an_older_record();
    d.put(0, &log, Some(&s.index));
    for tool in ["verify", "dump"] {
        let (code, text) = json_of(tool, &d.data);
        assert_eq!(code, 0, "{tool}: {text}");
        assert!(text.contains("stale_tail"), "{tool}: {text}");
        assert!(text.contains("generation 2"), "{tool}: {text}");
        assert!(!text.contains("torn_tail"), "{tool}: {text}");
    }
    let v = recover_twice(&d, 0);
    assert_eq!(v["actions"][0]["tail"], "stale_tail", "{v:#}");
    assert_eq!(fs::read(d.log(0)).unwrap(), s.log);
    assert_eq!(offsets(&d.part), (0..4).collect::<Vec<_>>());
}

#[test]
fn data_ending_inside_an_older_generations_last_record_is_a_stale_tail() {
    // As above, but the older generation's bytes end within the record the writer's
    // data ends in: no whole record follows.
    let (s, _) = inside_an_older_record();
    let k = (1..12u64)
        .find(|&k| seg(0, 2, 0..k).log.len() > s.log.len())
        .unwrap();
    let old = seg(0, 2, 0..k);
    let mut log = s.log.clone();
    log.extend_from_slice(&old.log[s.log.len()..]);
    let d = Data::new();
    d.put(0, &log, Some(&s.index));
    let (code, text) = json_of("verify", &d.data);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("the rest of the last record an older generation wrote"),
        "{text}"
    );
    let v = recover_twice(&d, 0);
    assert_eq!(v["actions"][0]["tail"], "stale_tail", "{v:#}");
    assert_eq!(fs::read(d.log(0)).unwrap(), s.log);
    // The writer's own last record with its offset damaged and its lengths intact
    // (a CRC that fails) is no stale tail.
    let mut damaged = s.log.clone();
    let (_, pos, _) = s.records[3];
    damaged[pos as usize + 11] ^= 0x10;
    damaged.extend_from_slice(&old.log[s.log.len()..]);
    verify_says_torn_tail(&damaged);
}

#[test]
fn a_torn_write_over_an_older_generations_records_stays_a_torn_tail() {
    // The writer's record 4 torn in its middle, the older bytes after it.
    let (_, old_tail) = inside_an_older_record();
    let mut five = Segment::new(0, 3);
    for o in 0..5 {
        five.push(o, o as i64, Some(b"k"), b"short but longer");
    }
    let (_, pos, len) = five.records[4];
    let torn_end = pos as usize + len / 2;
    let mut log = five.log[..torn_end].to_vec();
    log.extend_from_slice(&old_tail[torn_end..]);
    verify_says_torn_tail(&log);
    // Damage inside the writer's own data, records of its generation after it: no
    // stale tail either.
    let mut log = five.log.clone();
    let (_, pos2, _) = five.records[2];
    log[pos2 as usize..pos2 as usize + 4].copy_from_slice(&[0xff; 4]);
    log.extend_from_slice(&old_tail[log.len().min(old_tail.len())..]);
    verify_says_torn_tail(&log);
}

/// `verify` of a partition whose one segment is `log`: a torn tail, no stale one.
fn verify_says_torn_tail(log: &[u8]) {
    let d = Data::new();
    d.put(0, log, None);
    let (code, text) = json_of("verify", &d.data);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("torn_tail"), "{text}");
    assert!(!text.contains("stale_tail"), "{text}");
}

#[test]
fn unfinished_seal_is_cut_from_a_sealed_segment() {
    for stale in [false, true] {
        let d = Data::new();
        let s0 = seg(0, 1, 0..20);
        let s1 = seg(20, 0, 20..25);
        let mut log0 = s0.log.clone();
        if stale {
            let old = seg(0, 0, 0..30);
            log0.extend_from_slice(&old.log[s0.log.len()..]);
        } else {
            log0.extend_from_slice(&[0u8; 1000]);
        }
        d.put(0, &log0, Some(&s0.index));
        d.put(20, &s1.log, Some(&s1.index));
        let v = recover_twice(&d, 0);
        assert_eq!(kinds(&v), ["trim_seal"], "stale {stale}: {v:#}");
        assert_eq!(v["actions"][0]["from"], s0.log.len());
        assert_eq!(fs::read(d.log(0)).unwrap(), s0.log);
        assert_eq!(fs::read(d.log(20)).unwrap(), s1.log);
        let name = format!(
            "{P0}/{}.bytes-{}-{}",
            log_file_name(0),
            s0.log.len(),
            log0.len()
        );
        assert_eq!(backup_file(&d, &name), &log0[s0.log.len()..]);
        assert_eq!(offsets(&d.part), (0..25).collect::<Vec<_>>());
        assert_eq!(v["partitions"][0]["next_offset"], 25);
    }
}

#[test]
fn never_durable_newest_segment_is_removed() {
    // A spare taken at roll whose header rewrite never became durable still names
    // base u64::MAX; behind it, records of its earlier life.
    let mut spare = SegmentHeader {
        base_offset: u64::MAX,
        generation: 4,
        flags: 0,
    }
    .encode()
    .to_vec();
    spare.extend_from_slice(&seg(0, 3, 0..5).log[32..]);
    for newest in [vec![0u8; 32 + 4096], vec![0u8; 10], b"SEG".to_vec(), spare] {
        let d = Data::new();
        let s0 = seg(0, 0, 0..20);
        // The roll's truncation was not durable either: zeros after the data.
        let mut log0 = s0.log.clone();
        log0.extend_from_slice(&[0u8; 512]);
        d.put(0, &log0, Some(&s0.index));
        d.put(20, &newest, Some(b""));
        // A roll that did not finish is repairable, whichever header it left.
        let verify = seglog().arg("verify").arg(&d.data).output().unwrap();
        assert_eq!(
            verify.status.code(),
            Some(1),
            "{} bytes: {}",
            newest.len(),
            String::from_utf8_lossy(&verify.stdout)
        );
        let v = recover_twice(&d, 0);
        // Segment 0 is the active one again: its zeros are preallocated space, kept.
        assert_eq!(
            kinds(&v),
            ["remove_never_durable"],
            "{} bytes: {v:#}",
            newest.len()
        );
        assert!(!d.log(20).exists() && !d.index(20).exists());
        assert_eq!(fs::read(d.log(0)).unwrap(), log0);
        assert_eq!(
            backup_file(&d, &format!("{P0}/{}", log_file_name(20))),
            newest
        );
        assert_eq!(v["partitions"][0]["next_offset"], 20);
    }
}

#[test]
fn a_reused_file_that_never_became_durable_goes_back_to_the_spares() {
    // A spare (generation 4) taken at a roll: its header rewrite never became
    // durable, but records of generation 4 were appended behind it (never
    // acknowledged). The data directory has a pool, with spare 5 in it already.
    let d = Data::new();
    let spares = d.data.join(SPARES_DIR);
    fs::create_dir(&spares).unwrap();
    let pooled = SegmentHeader {
        base_offset: u64::MAX,
        generation: 2,
        flags: 0,
    }
    .encode();
    fs::write(spares.join(spare_file_name(5)), pooled).unwrap();
    let mut newest = SegmentHeader {
        base_offset: u64::MAX,
        generation: 4,
        flags: 0,
    }
    .encode()
    .to_vec();
    newest.extend_from_slice(&seg(20, 4, 20..25).log[32..]);
    let s0 = seg(0, 0, 0..20);
    d.put(0, &s0.log, Some(&s0.index));
    d.put(20, &newest, Some(b""));

    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["remove_never_durable"], "{v:#}");
    assert_eq!(v["actions"][0]["to_spares"], "spares", "{v:#}");
    assert!(!d.log(20).exists() && !d.index(20).exists());
    assert_eq!(fs::read(d.log(0)).unwrap(), s0.log);
    assert_eq!(v["partitions"][0]["next_offset"], 20);
    // It is the pool's next name, re-stamped (generation 5, still unassigned): the
    // records of generation 4 behind the header are stale now.
    let back = fs::read(spares.join(spare_file_name(6))).unwrap();
    let h = SegmentHeader::decode(&back).unwrap();
    assert!(h.is_spare() && h.generation == 5, "{h:?}");
    assert_eq!(back[32..], newest[32..]);
    assert_eq!(fs::read(spares.join(spare_file_name(5))).unwrap(), pooled);
    // Kept in the backup too, as every removal is.
    assert_eq!(
        backup_file(&d, &format!("{P0}/{}", log_file_name(20))),
        newest
    );
    // Without a pool in the data directory it is removed, as before.
    let d = Data::new();
    d.put(0, &s0.log, Some(&s0.index));
    d.put(20, &newest, Some(b""));
    let v = recover_twice(&d, 0);
    assert_eq!(v["actions"][0]["to_spares"], Value::Null, "{v:#}");
    assert!(!d.log(20).exists());
    assert!(!d.data.join(SPARES_DIR).exists());
}

#[test]
fn segment_that_becomes_the_newest_is_recovered_as_the_active_one() {
    // Once the never-durable segment is gone, the one before it is the newest: the
    // next start would scan it in full and cut its tail, so this run does too, and
    // `verify` calls that tail repairable (the writer had moved on to the new file
    // before the crash, so it was never acknowledged), not a sealed segment's damage.
    let d = Data::new();
    let s0 = seg(0, 0, 0..39);
    let whole = seg(0, 0, 0..40);
    let mut log0 = whole.log.clone();
    let (_, pos, _) = whole.records[39];
    log0[pos as usize + 20] ^= 1;
    d.put(0, &log0, Some(&whole.index));
    d.put(40, &[0u8; 3], None);
    let verify = seglog().arg("verify").arg(&d.data).output().unwrap();
    assert_eq!(
        verify.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["remove_never_durable", "cut_tail"]);
    assert_eq!(v["actions"][1]["from"], pos);
    assert_eq!(v["actions"][1]["next_offset"], 39);
    assert_eq!(v["partitions"][0]["next_offset"], 39);
    assert_eq!(fs::read(d.log(0)).unwrap(), s0.log);
    assert_eq!(fs::read(d.index(0)).unwrap(), s0.index);
}

#[test]
fn only_the_newest_segment_can_have_never_become_durable() {
    // A roll starts only once the previous one is durable, so a zero (or spare)
    // header below the newest segment is damage: that segment and its records are
    // kept and reported, and its offsets are not handed out again.
    // (A zeroed header on the newest segment itself cannot be told from a roll that
    // never became durable: FORMAT has it removed, as tested above.)
    let mut spare = SegmentHeader {
        base_offset: u64::MAX,
        generation: 2,
        flags: 0,
    }
    .encode()
    .to_vec();
    let s20 = seg(20, 1, 20..40);
    spare.extend_from_slice(&s20.log[32..]);
    let mut zeroed = s20.log.clone();
    zeroed[..32].fill(0);
    for damaged in [zeroed, spare] {
        let d = Data::new();
        let s0 = seg(0, 0, 0..20);
        d.put(0, &s0.log, Some(&s0.index));
        d.put(20, &damaged, Some(&s20.index));
        d.put(40, &[0u8; 64], None);
        let verify = seglog().arg("verify").arg(&d.data).output().unwrap();
        assert_eq!(
            verify.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&verify.stdout)
        );
        // Two headerless segments are no crash state: nothing is removed (were the
        // newest removed, the next run would take segment 20 for an unfinished roll).
        let v = recover_twice(&d, 2);
        assert_eq!(kinds(&v), Vec::<String>::new(), "{v:#}");
        assert_eq!(fs::read(d.log(40)).unwrap(), [0u8; 64]);
        assert_eq!(fs::read(d.log(20)).unwrap(), damaged);
        assert_eq!(fs::read(d.log(0)).unwrap(), s0.log);
    }
}

#[test]
fn a_flipped_crc_bit_in_a_reused_sealed_segment_is_damage_not_an_unfinished_seal() {
    // In a generation-1 file, flipping the CRC's lowest bit makes a record pass its
    // check as one of generation 0, like the stale records an unfinished seal leaves.
    // Records of generation 1 behind it show it is damage: kept, reported, not cut.
    // The last record (49) has nothing behind it, but the next segment's base (50)
    // shows the segment's own records must reach 49: an unfinished seal only follows
    // all of them.
    for damaged in [45, 49] {
        let d = Data::new();
        let s0 = seg(0, 1, 0..50);
        let mut log0 = s0.log.clone();
        let (_, pos, len) = s0.records[damaged];
        let crc_lsb = pos as usize + len - 1;
        log0[crc_lsb] ^= 1;
        d.put(0, &log0, Some(&s0.index));
        let s50 = seg(50, 0, 50..60);
        d.put(50, &s50.log, Some(&s50.index));
        let (code, v) = recover_cli(&d.data, &[]);
        assert_eq!(code, 2, "record {damaged}: {v:#}");
        assert!(
            !kinds(&v)
                .iter()
                .any(|k| k == "cut_tail" || k == "trim_seal"),
            "record {damaged}: {v:#}"
        );
        assert_eq!(fs::read(d.log(0)).unwrap(), log0, "record {damaged}");
        // verify and dump name the same damage and exit with its code.
        for tool in ["verify", "dump"] {
            let (code, text) = json_of(tool, &d.data);
            assert_eq!(code, 2, "{tool}, record {damaged}: {text}");
            assert!(
                !text.contains("unfinished_seal"),
                "{tool}, record {damaged}: {text}"
            );
            assert!(
                text.contains("stale_generation"),
                "{tool}, record {damaged}: {text}"
            );
        }
    }
}

#[test]
fn a_flipped_crc_bit_in_a_reused_active_segment_is_not_called_clean() {
    // The active segment of generation 1: record 5's CRC passes as generation 0's,
    // and records 6..20 of generation 1 follow. That is no stale tail past the data
    // (information only): verify calls it a damaged tail that recover cuts, and
    // recover names the valid records it cuts with it.
    let d = Data::new();
    let s0 = seg(0, 1, 0..20);
    let mut log0 = s0.log.clone();
    let (_, pos, len) = s0.records[5];
    log0[pos as usize + len - 1] ^= 1;
    d.put(0, &log0, Some(&s0.index));
    let (code, text) = json_of("verify", &d.data);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("torn_tail"), "{text}");
    assert!(!text.contains("stale_tail"), "{text}");
    let v = recover_twice(&d, 0);
    // The cut, and the index rebuilt for what is left.
    assert_eq!(kinds(&v), ["cut_tail", "rebuild_index"], "{v:#}");
    assert_eq!(v["actions"][0]["tail"], "torn_tail", "{v:#}");
    assert_eq!(v["actions"][0]["records_cut"]["count"], 14, "{v:#}");
    assert_eq!(offsets(&d.part), (0..5).collect::<Vec<_>>());
}

#[test]
fn backup_dir_inside_the_data_directory_is_refused() {
    let d = Data::new();
    let out = seglog()
        .arg("recover")
        .arg(&d.data)
        .arg("--backup-dir")
        .arg(d.data.join("bk"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn backup_dir_named_relative_inside_the_data_directory_is_refused() {
    let d = Data::new();
    let out = seglog()
        .current_dir(d.data.parent().unwrap())
        .args(["recover", "data", "--backup-dir", "./data/topics/../bk"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

#[test]
fn every_partition_of_every_topic_is_recovered() {
    let d = data_dir("");
    fs::write(
        d.data.join("topics/t/topic.json"),
        br#"{"partitions": 2, "config": {}}"#,
    )
    .unwrap();
    let p1 = d.data.join("topics/t/1");
    let pb = d.data.join("topics/u/0");
    fs::create_dir_all(&p1).unwrap();
    fs::create_dir_all(&pb).unwrap();
    fs::write(d.data.join("topics/u/topic.json"), br#"{"partitions": 1}"#).unwrap();
    let s = seg(0, 0, 0..5);
    d.put(0, &s.log, Some(&s.index));
    let mut torn = s.log.clone();
    torn.extend_from_slice(&[0, 0, 1]);
    fs::write(p1.join(log_file_name(0)), &torn).unwrap();
    fs::write(p1.join(index_file_name(0)), &s.index).unwrap();
    fs::write(pb.join(log_file_name(0)), &s.log).unwrap();
    let v = recover_twice(&d, 0);
    let labels: Vec<&str> = v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["t/0", "t/1", "u/0"]);
    // The vocabulary of verify and dump: topic and a numeric partition.
    let places: Vec<(&str, u64)> = v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["topic"].as_str().unwrap(),
                p["partition"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(places, [("t", 0), ("t", 1), ("u", 0)]);
    assert_eq!(kinds(&v), ["cut_tail", "rebuild_index"]);
    assert_eq!(v["actions"][0]["label"], "t/1");
    assert_eq!(
        (&v["actions"][0]["topic"], &v["actions"][0]["partition"]),
        (&json!("t"), &json!(1))
    );
    assert_eq!(
        v["actions"][1]["path"],
        format!("topics/u/0/{}", index_file_name(0))
    );
    assert_eq!(fs::read(p1.join(log_file_name(0))).unwrap(), s.log);
    assert_eq!(fs::read(pb.join(index_file_name(0))).unwrap(), s.index);
}

#[test]
fn bad_header_on_the_newest_segment_is_left_and_refuses_writes() {
    let d = Data::new();
    let s0 = seg(0, 0, 0..20);
    let mut s1 = seg(20, 0, 20..25).log;
    s1[0] = b'X';
    d.put(0, &s0.log, Some(&s0.index));
    d.put(20, &s1, None);
    let before = files(&d.data);
    let (code, _) = recover_cli(&d.data, &["--dry-run"]);
    assert_eq!(code, 2);
    let v = recover_twice(&d, 2);
    assert!(kinds(&v).is_empty(), "{v:#}");
    let p = &v["partitions"][0];
    assert_eq!(p["refuses_writes"], true);
    assert_eq!(p["corrupt"][0]["kind"], "bad_header");
    assert_eq!(
        p["corrupt"][0]["bytes_lost"],
        serde_json::json!([0, s1.len()])
    );
    assert_eq!(v["severity_after"], "corrupt");
    assert_eq!(
        files(&d.data).len(),
        before.len() + 1,
        "only LOCK was added"
    );
    assert_eq!(fs::read(d.log(20)).unwrap(), s1);
}

#[test]
fn bit_flip_in_a_sealed_segment_is_reported_and_left() {
    let d = Data::new();
    let s0 = seg(0, 0, 0..40);
    let s1 = seg(40, 0, 40..45);
    let mut log0 = s0.log.clone();
    // A record after the last index entry: the quick check reads it and fails.
    let (_, pos, _) = s0.records[38];
    log0[pos as usize + 30] ^= 0x10;
    d.put(0, &log0, Some(&s0.index));
    d.put(40, &s1.log, Some(&s1.index));
    let before = files(&d.data);
    let v = recover_twice(&d, 2);
    assert!(kinds(&v).is_empty(), "{v:#}");
    let c = &v["partitions"][0]["corrupt"][0];
    assert_eq!(c["kind"], "crc_mismatch");
    // Only the damaged record is lost: reading resumes at the next one (docs/FORMAT.md,
    // Reading around damage).
    let (_, next_pos, _) = s0.records[39];
    assert_eq!(c["bytes_lost"], serde_json::json!([pos, next_pos]));
    assert_eq!(c["offsets_lost"], serde_json::json!([38, 38]));
    assert_eq!(v["partitions"][0]["refuses_writes"], false);
    assert_eq!(v["partitions"][0]["next_offset"], 45);
    for (k, bytes) in &before {
        assert_eq!(&files(&d.data)[k], bytes, "{k} changed");
    }
}

#[test]
fn indexes_missing_wrong_or_partial_are_rebuilt() {
    let d = Data::new();
    let s0 = seg(0, 0, 0..40);
    let s1 = seg(40, 0, 40..80);
    let s2 = seg(80, 0, 80..90);
    assert!(s0.index.len() >= 32, "needs several index entries");
    // The last entry is wrong: the quick check reads from it and fails.
    let mut wrong = s1.index.clone();
    let last = wrong.len() - 1;
    wrong[last] ^= 1;
    d.put(0, &s0.log, None);
    d.put(40, &s1.log, Some(&wrong));
    d.put(80, &s2.log, Some(&s2.index[..s2.index.len().min(16) - 4]));
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["rebuild_index"; 3]);
    assert_eq!(fs::read(d.index(0)).unwrap(), s0.index);
    assert_eq!(fs::read(d.index(40)).unwrap(), s1.index);
    assert_eq!(fs::read(d.index(80)).unwrap(), s2.index);
    assert!(!d.part.join(format!("{}.tmp", index_file_name(0))).exists());
}

#[test]
fn a_wrong_middle_index_entry_is_beyond_the_quick_check() {
    // docs/FORMAT.md, Recovery step 2 trusts a sealed segment whose first record and tail
    // after the last entry check out; a wrong entry in between is found by verify
    // and repaired by reindex, not by recovery.
    let d = Data::new();
    let s0 = seg(0, 0, 0..60);
    let s1 = seg(60, 0, 60..61);
    assert!(s0.index.len() >= 48);
    let mut wrong = s0.index.clone();
    wrong[16 + 15] ^= 1;
    d.put(0, &s0.log, Some(&wrong));
    d.put(60, &s1.log, Some(&s1.index));
    let (code, _) = recover_cli(&d.data, &["--dry-run"]);
    assert_eq!(code, 1, "the dry run exits with the code verify gives");
    let (code, v) = recover_cli(&d.data, &[]);
    assert_eq!(code, 0);
    assert!(kinds(&v).is_empty());
    assert_eq!(v["severity_after"], "repairable");
    assert_eq!(v["problems_after"][0]["kind"], "wrong_index_entry");
    assert_eq!(full_severity(&d.data), Some(Severity::Repairable));
}

#[test]
fn corruption_in_the_middle_of_a_trusted_segment_is_found_by_the_full_check_after() {
    let d = Data::new();
    let s0 = seg(0, 0, 0..60);
    let s1 = seg(60, 0, 60..61);
    let mut log0 = s0.log.clone();
    let (_, pos, _) = s0.records[20];
    log0[pos as usize + 40] ^= 4;
    d.put(0, &log0, Some(&s0.index));
    d.put(60, &s1.log, Some(&s1.index));
    let (code, _) = recover_cli(&d.data, &["--dry-run"]);
    assert_eq!(code, 2);
    let v = recover_twice(&d, 2);
    assert!(kinds(&v).is_empty());
    assert_eq!(v["severity_after"], "corrupt");
    let crc = v["problems_after"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kind"] == "crc_mismatch")
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(crc["position"], pos);
    assert_eq!(crc["path"], format!("{P0}/{}", log_file_name(0)));
    assert_eq!(fs::read(d.log(0)).unwrap(), log0);
}

#[test]
fn leftover_temp_files_and_orphan_indexes_are_removed() {
    // The orphan index lies below the first segment: retention's leftover.
    let d = Data::new();
    let s0 = seg(100, 0, 100..105);
    d.put(100, &s0.log, Some(&s0.index));
    let tmp = d.part.join(format!("{}.tmp", log_file_name(200)));
    fs::write(&tmp, b"half a compaction").unwrap();
    fs::write(d.index(50), &s0.index).unwrap();
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["remove_temp_file", "remove_orphan_index"]);
    assert!(!tmp.exists() && !d.index(50).exists());
    assert_eq!(
        backup_file(&d, &format!("{P0}/{}.tmp", log_file_name(200))),
        b"half a compaction"
    );
    assert_eq!(
        backup_file(&d, &format!("{P0}/{}", index_file_name(50))),
        s0.index
    );
}

#[test]
fn an_index_without_its_log_above_the_first_segment_is_a_lost_segment_and_kept() {
    // In a compacted topic too: gaps are no excuse, the segments must tile.
    let d = data_dir("\"cleanup_policy\": \"compact\"");
    let s0 = seg(0, 0, 0..5);
    let s1 = seg(5, 0, 5..9);
    let s2 = seg(9, 0, 9..12);
    d.put(0, &s0.log, Some(&s0.index));
    d.put(9, &s2.log, Some(&s2.index));
    fs::write(d.index(5), &s1.index).unwrap();
    let v = recover_twice(&d, 2);
    assert!(kinds(&v).is_empty(), "{v:#}");
    let lost: Vec<&str> = v["partitions"][0]["not_joined"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(lost, ["lost_segment", "segments_do_not_join"], "{v:#}");
    assert_eq!(fs::read(d.index(5)).unwrap(), s1.index, "the index is kept");
    assert_eq!(full_severity(&d.data), Some(Severity::Corrupt));
}

/// A damaged last record of a segment followed by a lost one hides that record
/// only: the lost segment's offsets are reported with it, not twice.
#[test]
fn damage_before_a_lost_segment_hides_only_the_offsets_up_to_its_base() {
    let d = Data::new();
    let mut s0 = seg(0, 0, 0..5);
    let s1 = seg(5, 0, 5..9);
    let s2 = seg(9, 0, 9..12);
    let last = s0.log.len() - 10;
    s0.log[last] ^= 0x20;
    d.put(0, &s0.log, Some(&s0.index));
    d.put(9, &s2.log, Some(&s2.index));
    fs::write(d.index(5), &s1.index).unwrap();
    let t = resolve(&d.data).unwrap();
    let check = check_partition(&t.partitions[0], CheckMode::Full).unwrap();
    let hidden: Vec<(Option<u64>, Option<u64>)> = check
        .segments
        .iter()
        .flat_map(|s| &s.problems)
        .filter_map(|p| p.unreadable.as_ref())
        .map(|r| (r.first_offset, r.next_base))
        .collect();
    assert_eq!(hidden, [(Some(4), Some(5))], "{check:#?}");
    let text: Vec<String> = check
        .segments
        .iter()
        .flat_map(|s| &s.problems)
        .map(|p| p.detail.clone())
        .collect();
    assert!(
        text.iter()
            .all(|t| !t.contains("4..=8") && !t.contains("4..9")),
        "{text:#?}"
    );
}

#[test]
fn an_index_without_its_log_after_the_newest_segment_is_a_roll_that_never_became_durable() {
    // A roll creates the new log and index before the fsync that makes them durable; a
    // crash may keep the index's name and lose the log's. Nothing in it was acknowledged.
    let d = Data::new();
    let s0 = seg(0, 0, 0..5);
    d.put(0, &s0.log, Some(&s0.index));
    fs::write(d.index(5), b"").unwrap();
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["remove_orphan_index"]);
    assert!(!d.index(5).exists());
    assert_eq!(offsets(&d.part), (0..5).collect::<Vec<_>>());
}

/// A compacted partition mid-swap: old segments 0 (0..20) and 20 (20..40), the new
/// segment 0 keeps the odd offsets; the active segment 40 is untouched.
fn swap_partition(stage: u32) -> (Data, Segment) {
    let d = data_dir("\"cleanup_policy\": \"compact\"");
    let a = seg(0, 0, 0..20);
    let b = seg(20, 0, 20..40);
    let c = seg(40, 0, 40..45);
    let new = seg(0, 0, (0..40).filter(|o| o % 2 == 1));
    d.put(0, &a.log, Some(&a.index));
    d.put(20, &b.log, Some(&b.index));
    d.put(40, &c.log, Some(&c.index));
    let log_tmp = d.part.join(format!("{}.tmp", log_file_name(0)));
    let idx_tmp = d.part.join(format!("{}.tmp", index_file_name(0)));
    fs::write(&log_tmp, &new.log).unwrap();
    fs::write(&idx_tmp, &new.index).unwrap();
    let marker = CompactionMarker {
        new: vec![0],
        replaced: vec![0, 20],
    };
    fs::write(d.part.join("compaction.marker"), marker.encode()).unwrap();
    // Stages of the swap a crash may leave.
    if stage >= 1 {
        fs::rename(&log_tmp, d.log(0)).unwrap();
    }
    if stage >= 2 {
        fs::rename(&idx_tmp, d.index(0)).unwrap();
    }
    if stage >= 3 {
        fs::remove_file(d.index(20)).unwrap();
    }
    if stage >= 4 {
        fs::remove_file(d.log(20)).unwrap();
    }
    (d, new)
}

fn swap_expected() -> Vec<u64> {
    (0..40).filter(|o| o % 2 == 1).chain(40..45).collect()
}

#[test]
fn marker_with_temp_files_is_finished_at_every_stage() {
    for stage in 0..=4 {
        let (d, new) = swap_partition(stage);
        let v = recover_twice(&d, 0);
        assert_eq!(kinds(&v)[0], "finish_compaction", "stage {stage}: {v:#}");
        assert_eq!(fs::read(d.log(0)).unwrap(), new.log, "stage {stage}");
        assert_eq!(fs::read(d.index(0)).unwrap(), new.index, "stage {stage}");
        assert!(!d.log(20).exists() && !d.part.join("compaction.marker").exists());
        assert_eq!(offsets(&d.part), swap_expected(), "stage {stage}");
        assert_eq!(v["partitions"][0]["next_offset"], 45);
        // What the swap replaced is in the backup, as it was.
        if stage == 0 {
            let old0 = seg(0, 0, 0..20).log;
            assert_eq!(backup_file(&d, &format!("{P0}/{}", log_file_name(0))), old0);
        }
        if stage < 4 {
            let old20 = seg(20, 0, 20..40).log;
            assert_eq!(
                backup_file(&d, &format!("{P0}/{}", log_file_name(20))),
                old20
            );
        }
    }
}

#[test]
fn marker_that_does_not_parse_means_the_swap_never_started() {
    let (d, _) = swap_partition(0);
    fs::write(
        d.part.join("compaction.marker"),
        b"{\"version\": 1, \"new\": [\"0000",
    )
    .unwrap();
    let old = seg(0, 0, 0..20);
    let v = recover_twice(&d, 0);
    assert_eq!(
        kinds(&v),
        ["remove_temp_file", "remove_temp_file", "remove_marker"]
    );
    assert_eq!(fs::read(d.log(0)).unwrap(), old.log);
    assert_eq!(offsets(&d.part), (0..45).collect::<Vec<_>>());
    assert!(d.backup().join(P0).join("compaction.marker").exists());
}

#[test]
fn missing_middle_segment_is_reported_and_nothing_deleted() {
    let d = Data::new();
    let s0 = seg(0, 0, 0..10);
    let s2 = seg(20, 0, 20..30);
    d.put(0, &s0.log, Some(&s0.index));
    d.put(20, &s2.log, Some(&s2.index));
    let v = recover_twice(&d, 2);
    assert!(kinds(&v).is_empty());
    let nj = &v["partitions"][0]["not_joined"][0];
    assert_eq!(nj["kind"], "segments_do_not_join");
    assert_eq!(nj["offset"], 10);
    assert_eq!(v["partitions"][0]["next_offset"], 30);
    assert_eq!(offsets(&d.part), (0..10).chain(20..30).collect::<Vec<_>>());
}

#[test]
fn lock_held_exits_73_and_dry_run_needs_no_lock() {
    let d = Data::new();
    let s = seg(0, 0, 0..3);
    let mut log = s.log.clone();
    log.extend_from_slice(&[1, 2, 3]);
    d.put(0, &log, Some(&s.index));
    let lock = DirLock::acquire(&d.data).unwrap();
    let out = seglog().arg("recover").arg(&d.data).output().unwrap();
    assert_eq!(out.status.code(), Some(73));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&d.data.join("LOCK").display().to_string()),
        "{err}"
    );
    assert_eq!(fs::read(d.log(0)).unwrap(), log);
    let out = seglog()
        .args(["recover", "--dry-run"])
        .arg(&d.data)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("would cut"), "{text}");
    assert_eq!(fs::read(d.log(0)).unwrap(), log);
    drop(lock);
    let out = seglog().arg("recover").arg(&d.data).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("t/0: cut topics/t/0/"), "{text}");
    let out = seglog().arg("recover").arg(&d.data).output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "nothing to do\n");
}

#[test]
fn dry_run_changes_nothing_at_all() {
    // Mid-swap the new segment 0 overlaps the replaced segment 20: with a marker that
    // parses, the check calls that repairable (recovery finishes the swap).
    let (d, _) = swap_partition(1);
    let (code, _) = recover_cli(&d.data, &["--dry-run"]);
    assert_eq!(code, 1);
    let (d, _) = swap_partition(0);
    let before = files(&d.data);
    let mtimes: Vec<_> = fs::read_dir(&d.part)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    let (code, v) = recover_cli(&d.data, &["--dry-run"]);
    assert_eq!(code, 1);
    assert_eq!(v["dry_run"], true);
    assert_eq!(kinds(&v), ["finish_compaction"]);
    assert_eq!(v["partitions"][0]["recheck_after_marker"], true);
    assert_eq!(files(&d.data), before);
    let after: Vec<_> = fs::read_dir(&d.part)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().modified().unwrap())
        .collect();
    assert_eq!(mtimes, after);
}

/// A partition with work for every kind of step: a leftover temp file, a sealed
/// segment with an unfinished seal and no index, an active segment with a torn
/// tail and an index that covers the torn range.
fn many_repairs() -> (Data, Vec<u64>, BTreeMap<String, Vec<u8>>) {
    let d = Data::new();
    let s0 = seg(0, 0, 0..30);
    let mut log0 = s0.log.clone();
    log0.extend_from_slice(&[0u8; 700]);
    d.put(0, &log0, None);
    let s1 = seg(30, 0, 30..60);
    let longer = seg(30, 0, 30..61);
    let (_, p, n) = longer.records[30];
    let mut log1 = longer.log.clone();
    log1.truncate(p as usize + n - 3);
    d.put(30, &log1, Some(&longer.index));
    fs::write(d.part.join("junk.tmp"), b"x").unwrap();
    // What a clean recovery leaves.
    let mut want = BTreeMap::new();
    want.insert(log_file_name(0), s0.log);
    want.insert(index_file_name(0), s0.index);
    want.insert(log_file_name(30), s1.log);
    want.insert(index_file_name(30), s1.index);
    (d, (0..60).collect(), want)
}

/// A compaction marker that does not parse with its temporary files, a sealed
/// segment with an unfinished seal, and a newest segment that never became durable.
fn never_started_swap_and_removals() -> (Data, Vec<u64>, BTreeMap<String, Vec<u8>>) {
    let d = Data::new();
    let s0 = seg(0, 0, 0..30);
    let mut log0 = s0.log.clone();
    log0.extend_from_slice(&[0u8; 333]);
    d.put(0, &log0, Some(&s0.index));
    d.put(30, &[0u8; 4096], Some(b""));
    fs::write(d.part.join("compaction.marker"), b"{\"version\": 1, \"ne").unwrap();
    fs::write(
        d.part.join(format!("{}.tmp", log_file_name(0))),
        &s0.log[..100],
    )
    .unwrap();
    fs::write(d.part.join(format!("{}.tmp", index_file_name(0))), b"").unwrap();
    let mut want = BTreeMap::new();
    // Segment 0 becomes the active one: its zero tail is kept.
    want.insert(log_file_name(0), log0);
    want.insert(index_file_name(0), s0.index);
    (d, (0..30).collect(), want)
}

fn partition_files(part: &Path) -> BTreeMap<String, Vec<u8>> {
    files(part)
}

#[test]
fn a_failure_at_any_mutation_or_sync_is_repaired_by_running_again() {
    type Scenario = fn() -> (Data, Vec<u64>, BTreeMap<String, Vec<u8>>);
    let scenarios: [Scenario; 2] = [many_repairs, never_started_swap_and_removals];
    for scenario in scenarios {
        for fail_on in [FailOn::Any, FailOn::Sync] {
            for with_backup in [false, true] {
                let mut n = 1;
                loop {
                    let (d, want_offsets, want_files) = scenario();
                    let target = resolve(&d.data).unwrap();
                    let plan = recovery::plan(&target).unwrap();
                    let failing = FailingStorage::new(Arc::new(RealStorage), n, fail_on, true);
                    let backup = d.backup();
                    let r =
                        recovery::execute(&failing, &plan, with_backup.then_some(backup.as_path()));
                    if !failing.has_failed() {
                        assert!(r.is_ok(), "{r:?}");
                        assert!(n > 5, "{fail_on:?}: only {n} calls");
                        break;
                    }
                    assert!(r.is_err(), "{fail_on:?} call {n}: failure not reported");
                    // Whatever the failure left, no valid record is lost and none beyond
                    // a cut point comes back.
                    assert_eq!(offsets(&d.part), want_offsets, "{fail_on:?} call {n}");
                    let report = recovery::recover(&RealStorage, &d.data).unwrap();
                    assert!(report.is_consistent());
                    assert_eq!(
                        report.partitions[0].next_offset,
                        want_offsets.last().unwrap() + 1
                    );
                    assert_eq!(partition_files(&d.part), want_files, "{fail_on:?} call {n}");
                    assert_eq!(full_severity(&d.data), None);
                    let again = recovery::recover(&RealStorage, &d.data).unwrap();
                    assert_eq!(again.action_count(), 0, "{fail_on:?} call {n}");
                    n += 1;
                }
            }
        }
    }
}

#[test]
fn a_failure_while_finishing_a_marker_is_repaired_by_running_again() {
    for fail_on in [FailOn::Any, FailOn::Sync] {
        let mut n = 1;
        loop {
            let (d, new) = swap_partition(0);
            let target = resolve(&d.data).unwrap();
            let plan = recovery::plan(&target).unwrap();
            assert!(matches!(
                plan.partitions[0].actions[0],
                Action::FinishCompaction { .. }
            ));
            let failing = FailingStorage::new(Arc::new(RealStorage), n, fail_on, true);
            let r = recovery::execute(&failing, &plan, None);
            if !failing.has_failed() {
                assert!(r.is_ok(), "{r:?}");
                break;
            }
            assert!(r.is_err());
            recovery::recover(&RealStorage, &d.data).unwrap();
            assert_eq!(fs::read(d.log(0)).unwrap(), new.log, "{fail_on:?} call {n}");
            assert_eq!(offsets(&d.part), swap_expected(), "{fail_on:?} call {n}");
            assert_eq!(full_severity(&d.data), None);
            n += 1;
        }
    }
}

#[test]
fn recover_reports_per_partition_for_the_broker() {
    let d = Data::new();
    let s = seg(5, 0, 5..9);
    d.put(5, &s.log, None);
    let r = recovery::recover(&RealStorage, &d.data).unwrap();
    assert_eq!(r.partitions.len(), 1);
    assert_eq!(r.partitions[0].label, "t/0");
    assert_eq!(r.partitions[0].next_offset, 9);
    assert!(!r.partitions[0].refuses_writes);
    assert_eq!(r.partitions[0].actions.len(), 1);
    assert!(r.lines()[0].contains("rebuild topics/t/0/00000000000000000005.index"));
    // An empty active segment: the next offset is its base offset.
    let d = Data::new();
    d.put(7, &SegmentHeader::new(7).encode(), Some(b""));
    let r = recovery::recover(&RealStorage, &d.data).unwrap();
    assert_eq!(r.partitions[0].next_offset, 7);
    assert_eq!(r.lines(), ["nothing to do"]);
}

#[test]
fn active_segment_torn_at_every_length_keeps_exactly_the_whole_records() {
    let s = seg(0, 2, 0..4);
    for len in 32..=s.log.len() {
        for pad in [0usize, 100] {
            let d = Data::new();
            let mut log = s.log[..len].to_vec();
            log.extend(std::iter::repeat_n(0u8, pad));
            d.put(0, &log, Some(&s.index));
            let r = recovery::recover(&RealStorage, &d.data).unwrap();
            let whole: Vec<&(u64, u64, usize)> = s
                .records
                .iter()
                .filter(|(_, p, n)| *p as usize + n <= len)
                .collect();
            let end = whole.last().map_or(32, |(_, p, n)| *p as usize + n);
            // A tail of zeros only (preallocated space, or a torn write whose bytes so
            // far are zeros) holds no record: kept. Anything else after `end` is cut.
            let zeros_only = log[end..].iter().all(|&b| b == 0);
            let want: &[u8] = if zeros_only { &log } else { &s.log[..end] };
            assert_eq!(fs::read(d.log(0)).unwrap(), want, "len {len} pad {pad}");
            assert_eq!(
                offsets(&d.part),
                whole.iter().map(|r| r.0).collect::<Vec<_>>()
            );
            assert_eq!(r.partitions[0].next_offset, whole.len() as u64);
            assert!(r.is_consistent());
            let again = recovery::recover(&RealStorage, &d.data).unwrap();
            assert_eq!(again.action_count(), 0, "len {len} pad {pad}");
            assert_eq!(full_severity(&d.data), None, "len {len} pad {pad}");
        }
    }
}

/// A small deterministic generator (SplitMix64) so failures name their seed.
#[test]
fn random_damage_to_the_active_segment_leaves_a_prefix_of_its_records() {
    let seed = seed_or(0x5EED);
    let mut rng = Rng::new(seed);
    let sealed = seg(0, 0, 0..20);
    for round in 0..60 {
        let n = 1 + rng.below(12);
        let s = seg(20, rng.below(3), 20..20 + n);
        let mut log = s.log.clone();
        // One to three damaged bytes in the data, and maybe a cut or zero padding.
        for _ in 0..1 + rng.below(3) {
            let at = 32 + rng.below(log.len() as u64 - 32) as usize;
            log[at] ^= 1 << rng.below(8);
        }
        match rng.below(3) {
            0 => log.truncate(32 + rng.below(log.len() as u64 - 31) as usize),
            1 => log.extend(std::iter::repeat_n(0u8, rng.below(5000) as usize)),
            _ => {}
        }
        let d = Data::new();
        d.put(0, &sealed.log, Some(&sealed.index));
        d.put(20, &log, Some(&s.index));
        let r = recovery::recover(&RealStorage, &d.data).unwrap();
        let ctx = format!("seed {seed} round {round}");
        let left = fs::read(d.log(20)).unwrap();
        let kept = s
            .records
            .iter()
            .take_while(|(_, p, m)| *p as usize + m <= left.len())
            .count();
        let end = s
            .records
            .get(..kept)
            .and_then(|k| k.last())
            .map_or(32, |(_, p, m)| *p as usize + m);
        assert_eq!(left.len(), end, "{ctx}: the cut is at a record boundary");
        assert_eq!(
            left,
            &s.log[..end],
            "{ctx}: what is left is the original prefix"
        );
        assert_eq!(
            fs::read(d.log(0)).unwrap(),
            sealed.log,
            "{ctx}: sealed untouched"
        );
        let want: Vec<u64> = (0..20).chain(20..20 + kept as u64).collect();
        assert_eq!(offsets(&d.part), want, "{ctx}");
        assert_eq!(r.partitions[0].next_offset, 20 + kept as u64, "{ctx}");
        assert_eq!(full_severity(&d.data), None, "{ctx}");
        let again = recovery::recover(&RealStorage, &d.data).unwrap();
        assert_eq!(again.action_count(), 0, "{ctx}");
    }
}

/// What recovery leaves, the partition log opens (it refuses any tail only recovery
/// may cut), continues at the offset recovery names, and appends to.
#[test]
fn the_partition_log_opens_what_recovery_leaves() {
    use seglog::engine::partition::{LogStats, NewRecord, PartitionLog};
    use seglog::format::topic::TopicConfig;
    type Damage = fn(&Data);
    let torn: Damage = |d| {
        let s = seg(0, 0, 0..12);
        d.put(0, &s.log[..s.log.len() - 5], Some(&s.index));
    };
    let stale: Damage = |d| {
        let s = seg(0, 2, 0..4);
        let mut log = s.log.clone();
        log.extend_from_slice(&seg(0, 1, 0..9).log[s.log.len()..]);
        d.put(0, &log, None);
    };
    let never_durable: Damage = |d| {
        let s = seg(0, 0, 0..20);
        let mut log = s.log.clone();
        log.extend_from_slice(&[0; 64]);
        d.put(0, &log, Some(&s.index));
        d.put(20, &[0; 32], None);
    };
    let unfinished_seal: Damage = |d| {
        let s0 = seg(0, 0, 0..20);
        let mut log = s0.log.clone();
        log.extend_from_slice(&[0; 64]);
        d.put(0, &log, None);
        let s1 = seg(20, 0, 20..22);
        d.put(20, &s1.log, Some(&s1.index));
    };
    for (name, damage, next) in [
        ("torn", torn, 11u64),
        ("stale", stale, 4),
        ("never durable", never_durable, 20),
        ("unfinished seal", unfinished_seal, 22),
    ] {
        let d = Data::new();
        damage(&d);
        let r = recovery::recover(&RealStorage, &d.data).unwrap();
        assert_eq!(r.partitions[0].next_offset, next, "{name}");
        let (log, _notes) = PartitionLog::open(
            "t",
            0,
            &d.part,
            Arc::new(RealStorage),
            Arc::new(LogStats::default()),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(log.written_end(), next, "{name}");
        let a = log
            .append(
                &[NewRecord {
                    key: None,
                    value: b"after recovery",
                    timestamp_ms: 1,
                }],
                &TopicConfig::default(),
            )
            .unwrap();
        assert_eq!(a.base_offset, next, "{name}");
        log.flush().unwrap();
        drop(log);
        let again = recovery::recover(&RealStorage, &d.data).unwrap();
        assert_eq!(again.lines(), ["nothing to do"], "{name}");
        assert_eq!(again.partitions[0].next_offset, next + 1, "{name}");
    }
}

mod crash {
    //! A storage that keeps what was made durable apart from what was not: every
    //! mutation is recorded with what undoes it, a file's writes and length changes
    //! become durable at its fsync, names (create, rename, remove) at the fsync of
    //! their directory. `crash` undoes, newest first, everything not yet durable: the
    //! disk image a power loss at that point may leave.

    use std::fs;
    use std::io;
    use std::os::unix::fs::FileExt;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use seglog::engine::storage::io::{RealStorage, Storage, StorageFile};

    #[derive(Debug)]
    enum Undo {
        Created(PathBuf),
        Renamed {
            from: PathBuf,
            to: PathBuf,
            replaced: Option<Vec<u8>>,
        },
        Removed(PathBuf, Vec<u8>),
        Written {
            path: PathBuf,
            pos: u64,
            old: Vec<u8>,
            old_len: u64,
        },
        Resized {
            path: PathBuf,
            old_len: u64,
            tail: Vec<u8>,
        },
    }

    #[derive(Debug)]
    struct Entry {
        undo: Undo,
        /// The file whose fsync makes it durable, or the directory whose fsync does.
        file: Option<PathBuf>,
        dir: Option<PathBuf>,
        durable: bool,
    }

    #[derive(Debug, Default)]
    struct State {
        entries: Mutex<Vec<Entry>>,
        count: AtomicU64,
    }

    /// Lets `allowed` mutations through; the next one and all later fail.
    #[derive(Debug, Clone)]
    pub struct CrashStorage {
        allowed: u64,
        state: Arc<State>,
    }

    fn parent(p: &Path) -> PathBuf {
        p.parent().unwrap().to_path_buf()
    }

    impl CrashStorage {
        pub fn new(allowed: u64) -> Self {
            CrashStorage {
                allowed,
                state: Arc::default(),
            }
        }

        /// Mutations attempted so far.
        pub fn attempted(&self) -> u64 {
            self.state.count.load(Ordering::SeqCst)
        }

        fn gate(&self, what: &str) -> io::Result<()> {
            let n = self.state.count.fetch_add(1, Ordering::SeqCst) + 1;
            if n > self.allowed {
                return Err(io::Error::other(format!(
                    "crash before mutation {n} ({what})"
                )));
            }
            Ok(())
        }

        fn push(&self, undo: Undo, file: Option<PathBuf>, dir: Option<PathBuf>) {
            self.state.entries.lock().unwrap().push(Entry {
                undo,
                file,
                dir,
                durable: false,
            });
        }

        fn made_durable(&self, file: Option<&Path>, dir: Option<&Path>) {
            for e in self.state.entries.lock().unwrap().iter_mut() {
                if (file.is_some() && e.file.as_deref() == file)
                    || (dir.is_some() && e.dir.as_deref() == dir)
                {
                    e.durable = true;
                }
            }
        }

        /// What was not made durable yet.
        pub fn not_durable(&self) -> Vec<String> {
            let entries = self.state.entries.lock().unwrap();
            entries
                .iter()
                .filter(|e| !e.durable)
                .map(|e| format!("{:?}", e.undo))
                .collect()
        }

        /// Undoes everything not durable, newest first. With `newest_name_kept`, the
        /// newest change of a name (create, rename, remove) that no directory fsync
        /// covered survives while everything older that was not durable is lost: a
        /// file system may persist directory changes out of order.
        pub fn crash(&self, newest_name_kept: bool) {
            let mut entries = self.state.entries.lock().unwrap();
            if newest_name_kept {
                if let Some(e) = entries
                    .iter_mut()
                    .rev()
                    .find(|e| !e.durable && e.dir.is_some())
                {
                    e.durable = true;
                }
            }
            while let Some(e) = entries.pop() {
                if e.durable {
                    continue;
                }
                match e.undo {
                    Undo::Created(p) => {
                        let _ = fs::remove_file(p);
                    }
                    Undo::Renamed { from, to, replaced } => {
                        fs::rename(&to, &from).unwrap();
                        if let Some(b) = replaced {
                            fs::write(&to, b).unwrap();
                        }
                    }
                    Undo::Removed(p, bytes) => fs::write(p, bytes).unwrap(),
                    Undo::Written {
                        path,
                        pos,
                        old,
                        old_len,
                    } => {
                        if let Ok(f) = fs::OpenOptions::new().write(true).open(&path) {
                            f.write_all_at(&old, pos).unwrap();
                            f.set_len(old_len).unwrap();
                        }
                    }
                    Undo::Resized {
                        path,
                        old_len,
                        tail,
                    } => {
                        if let Ok(f) = fs::OpenOptions::new().write(true).open(&path) {
                            let len = f.metadata().unwrap().len();
                            f.set_len(old_len).unwrap();
                            f.write_all_at(&tail, len).unwrap();
                        }
                    }
                }
            }
        }
    }

    #[derive(Debug)]
    struct CrashFile {
        inner: Box<dyn StorageFile>,
        path: PathBuf,
        storage: CrashStorage,
    }

    fn read_range(path: &Path, from: u64, to: u64) -> Vec<u8> {
        let f = fs::File::open(path).unwrap();
        let mut buf = vec![0u8; to.saturating_sub(from) as usize];
        let n = f.read_at(&mut buf, from).unwrap_or(0);
        buf.truncate(n);
        buf
    }

    impl StorageFile for CrashFile {
        fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
            self.storage.gate("write_at")?;
            let old_len = self.inner.len()?;
            let old = read_range(&self.path, pos, (pos + buf.len() as u64).min(old_len));
            self.inner.write_at(buf, pos)?;
            let undo = Undo::Written {
                path: self.path.clone(),
                pos,
                old,
                old_len,
            };
            self.storage.push(undo, Some(self.path.clone()), None);
            Ok(())
        }
        fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
            self.inner.read_at(buf, pos)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.storage.gate("set_len")?;
            let old_len = self.inner.len()?;
            let tail = read_range(&self.path, len, old_len);
            self.inner.set_len(len)?;
            let undo = Undo::Resized {
                path: self.path.clone(),
                old_len,
                tail,
            };
            self.storage.push(undo, Some(self.path.clone()), None);
            Ok(())
        }
        fn allocate(&self, len: u64) -> io::Result<()> {
            self.storage.gate("allocate")?;
            self.inner.allocate(len)
        }
        fn sync_data(&self) -> io::Result<()> {
            self.sync_all()
        }
        fn sync_all(&self) -> io::Result<()> {
            self.storage.gate("sync")?;
            self.inner.sync_all()?;
            self.storage.made_durable(Some(&self.path), None);
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
    }

    impl Storage for CrashStorage {
        fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
            self.gate("create")?;
            let inner = RealStorage.create(path)?;
            self.push(Undo::Created(path.into()), None, Some(parent(path)));
            Ok(Box::new(CrashFile {
                inner,
                path: path.into(),
                storage: self.clone(),
            }))
        }
        fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
            let inner = RealStorage.open(path)?;
            Ok(Box::new(CrashFile {
                inner,
                path: path.into(),
                storage: self.clone(),
            }))
        }
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            self.gate("create_dir_all")?;
            RealStorage.create_dir_all(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.gate("rename")?;
            let replaced = fs::read(to).ok();
            RealStorage.rename(from, to)?;
            let undo = Undo::Renamed {
                from: from.into(),
                to: to.into(),
                replaced,
            };
            self.push(undo, None, Some(parent(to)));
            Ok(())
        }
        fn remove_file(&self, path: &Path) -> io::Result<()> {
            self.gate("remove_file")?;
            let bytes = fs::read(path)?;
            RealStorage.remove_file(path)?;
            self.push(Undo::Removed(path.into(), bytes), None, Some(parent(path)));
            Ok(())
        }
        fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
            self.gate("remove_dir_all")?;
            RealStorage.remove_dir_all(path)
        }
        fn sync_dir(&self, path: &Path) -> io::Result<()> {
            self.gate("sync_dir")?;
            RealStorage.sync_dir(path)?;
            self.made_durable(None, Some(path));
            Ok(())
        }
    }
}

/// For every point a power loss may hit recovery, the disk image it leaves
/// (everything not yet fsynced undone) is recovered by the next run to exactly the
/// same result; and a finished run leaves nothing that is not durable.
#[test]
fn a_power_loss_at_any_step_of_recovery_is_recovered_by_the_next_run() {
    type Scenario = fn() -> (Data, Vec<u64>, BTreeMap<String, Vec<u8>>);
    let swap: Scenario = || {
        let (d, new) = swap_partition(0);
        let mut want = BTreeMap::new();
        want.insert(log_file_name(0), new.log);
        want.insert(index_file_name(0), new.index);
        let c = seg(40, 0, 40..45);
        want.insert(log_file_name(40), c.log);
        want.insert(index_file_name(40), c.index);
        (d, swap_expected(), want)
    };
    let scenarios: [(&str, Scenario); 3] = [
        ("many repairs", many_repairs),
        ("never started swap", never_started_swap_and_removals),
        ("compaction swap", swap),
    ];
    for (name, scenario) in scenarios {
        for (with_backup, newest_name_kept) in [(false, false), (true, false), (false, true)] {
            let mut n = 0;
            loop {
                let (d, want_offsets, want_files) = scenario();
                let plan = recovery::plan(&resolve(&d.data).unwrap()).unwrap();
                let storage = crash::CrashStorage::new(n);
                let backup = d.backup();
                let r = recovery::execute(&storage, &plan, with_backup.then_some(backup.as_path()));
                let finished = storage.attempted() <= n;
                if finished {
                    assert!(r.is_ok(), "{name}: {r:?}");
                    assert_eq!(
                        storage.not_durable(),
                        Vec::<String>::new(),
                        "{name}: a finished recovery left changes that are not durable"
                    );
                }
                storage.crash(newest_name_kept);
                let ctx = format!(
                    "{name}, backup {with_backup}, newest name change kept {newest_name_kept}, crash after {n} mutations"
                );
                recovery::recover(&RealStorage, &d.data).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(partition_files(&d.part), want_files, "{ctx}");
                assert_eq!(offsets(&d.part), want_offsets, "{ctx}");
                assert_eq!(full_severity(&d.data), None, "{ctx}");
                if finished {
                    break;
                }
                n += 1;
            }
        }
    }
}

/// The committed fixtures (tests/fixtures/README.md), each recovered by the real
/// binary: the actions, the exit code, `seglog verify` afterwards, a no-op second run.
#[test]
fn committed_fixtures_recover_as_their_readme_says() {
    let cases: &[(&str, &[&str], i32)] = &[
        ("clean", &[], 0),
        ("torn-tail", &["cut_tail"], 0),
        ("zero-tail", &[], 0),
        ("stale-tail", &["cut_tail"], 0),
        ("bit-flip-sealed", &[], 2),
        ("missing-index", &["rebuild_index"], 0),
        ("wrong-index-entry", &["rebuild_index"], 0),
        ("partial-index-entry", &["rebuild_index"], 0),
        ("leftover-temp", &["remove_temp_file"], 0),
        ("compaction-marker", &["finish_compaction"], 0),
        ("bad-header-newest", &[], 2),
        ("unwritten-newest", &["remove_never_durable"], 0),
        ("unfinished-seal", &["trim_seal"], 0),
        ("missing-middle-segment", &[], 2),
        ("compacted-lost-middle-segment", &[], 2),
        ("compacted-lost-middle-log", &[], 2),
        ("compacted-lost-last-sealed", &[], 2),
    ];
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for &(name, want_kinds, want_exit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join(name);
        copy_tree(&fixtures.join(name), &data);
        let (code, v) = recover_cli(&data, &[]);
        assert_eq!(code, want_exit, "{name}: {v:#}");
        assert_eq!(kinds(&v), want_kinds, "{name}: {v:#}");
        let (code2, v2) = recover_cli(&data, &[]);
        assert_eq!(code2, want_exit, "{name}");
        assert!(kinds(&v2).is_empty(), "{name}: second run: {v2:#}");
        let verify = seglog().arg("verify").arg(&data).output().unwrap();
        assert_eq!(verify.status.code(), Some(want_exit), "{name}: verify");
        let events0 = v["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["topic"] == "events" && p["partition"] == 0)
            .unwrap();
        // The newest segment's header is unreadable: what it held cannot be counted.
        let want_next = match name {
            "bad-header-newest" => 60,
            n if n.starts_with("compacted-lost-") => 100,
            _ => 70,
        };
        assert_eq!(events0["next_offset"], want_next, "{name}");
        assert_eq!(
            events0["refuses_writes"],
            name == "bad-header-newest",
            "{name}"
        );
    }
}

#[test]
fn a_path_seglog_does_not_know_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = seglog()
        .arg("recover")
        .arg(tmp.path().join("missing"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("missing: no such file or directory"), "{err}");
    let d = Data::new();
    let s = seg(0, 0, 0..2);
    d.put(0, &s.log, Some(&s.index));
    let out = seglog().arg("recover").arg(d.log(0)).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn hole_before_an_empty_newest_segment_is_reported_and_nothing_deleted() {
    // The newest segment has a valid header and no records: its base is where the next
    // record goes, so offsets 10..=13 are missing, in verify, recover and at startup.
    let d = Data::new();
    let s0 = seg(0, 0, 0..10);
    let s1 = seg(14, 0, 14..14);
    d.put(0, &s0.log, Some(&s0.index));
    d.put(14, &s1.log, Some(b""));
    let v = recover_twice(&d, 2);
    assert!(kinds(&v).is_empty(), "{v:#}");
    let nj = &v["partitions"][0]["not_joined"][0];
    assert_eq!(nj["kind"], "segments_do_not_join");
    assert_eq!(nj["offset"], 10);
    assert_eq!(offsets(&d.part), (0..10).collect::<Vec<_>>());
    assert!(d.log(14).exists() && d.log(0).exists());
    let b = seglog::engine::broker::Broker::open(
        &d.data,
        Arc::new(RealStorage),
        seglog::engine::broker::BrokerOptions::default(),
    )
    .unwrap();
    let report = b.startup_report().join("\n");
    assert!(
        report.contains("segments_do_not_join") && report.contains("offsets 10..=13"),
        "{report}"
    );
    drop(b);
    assert!(d.log(14).exists() && d.log(0).exists());
}

#[test]
fn an_empty_newest_segment_that_joins_up_is_clean() {
    let d = Data::new();
    let s0 = seg(0, 0, 0..10);
    let s1 = seg(10, 0, 10..10);
    d.put(0, &s0.log, Some(&s0.index));
    d.put(10, &s1.log, Some(b""));
    let v = recover_twice(&d, 0);
    assert!(kinds(&v).is_empty(), "{v:#}");
    assert_eq!(v["partitions"][0]["next_offset"], 10);
}

#[test]
fn a_wrong_middle_index_entry_makes_dump_from_skip_nothing() {
    // The quick check reads an index's first and last entries only. Entry 1 names
    // offset 1 at the position of a later record: `dump --from` must not start there.
    let d = Data::new();
    let s0 = seg(0, 0, 0..300);
    assert!(s0.index.len() >= 3 * 16, "entries: {}", s0.index.len() / 16);
    let named = u64::from_be_bytes(s0.index[16..24].try_into().unwrap());
    let mut index = s0.index.clone();
    index[16..24].copy_from_slice(&1u64.to_be_bytes());
    d.put(0, &s0.log, Some(&index));
    let s300 = seg(300, 0, 300..310);
    d.put(300, &s300.log, Some(&s300.index));
    for from in [1, named - 1] {
        let out = seglog()
            .args(["dump", "--json", "--from", &from.to_string(), "--to", "299"])
            .arg(&d.part)
            .output()
            .unwrap();
        let got: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["offset"].as_u64())
            .collect();
        assert_eq!(got, (from..300).collect::<Vec<_>>(), "dump --from {from}");
    }
    let out = seglog().arg("verify").arg(&d.data).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("seglog reindex"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_marker_whose_new_segment_is_no_swap_output_deletes_nothing() {
    // A marker naming segment 0 as the output that replaces 0 and 31, with no
    // temporary files: segment 0 is the original (it ends at 30, not where the
    // replaced range ends, 60). Finishing it would delete segment 31, the only copy
    // of offsets 31..=60: it is treated as a marker no swap wrote.
    let d = Data::new();
    for (base, range) in [(0, 0..31), (31, 31..61), (61, 61..70)] {
        let s = seg(base, 0, range);
        d.put(base, &s.log, Some(&s.index));
    }
    let marker = format!(
        r#"{{"version": 1, "new": ["{:020}"], "replaced": ["{:020}", "{:020}"]}}"#,
        0, 0, 31
    );
    fs::write(d.part.join("compaction.marker"), marker).unwrap();
    let (code, text) = json_of("verify", &d.data);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("does not fit"), "{text}");
    let v = recover_twice(&d, 0);
    assert_eq!(kinds(&v), ["remove_marker"], "{v:#}");
    assert_eq!(offsets(&d.part), (0..70).collect::<Vec<_>>());
}

#[test]
fn backup_dir_whose_parent_is_missing_is_refused_and_nothing_is_created() {
    // Something to cut, so a backup would be written.
    let d = Data::new();
    let s0 = seg(0, 1, 0..20);
    let mut log0 = s0.log.clone();
    let (_, pos, len) = s0.records[5];
    log0[pos as usize + len - 1] ^= 1;
    d.put(0, &log0, Some(&s0.index));
    let missing = d.backup().join("no/such");
    let out = seglog()
        .arg("recover")
        .arg(&d.data)
        .arg("--backup-dir")
        .arg(&missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(74), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("{}", d.backup().join("no").display())),
        "{err}"
    );
    assert!(!d.backup().exists(), "no parent created");
    assert_eq!(fs::read(d.log(0)).unwrap(), log0, "nothing cut");
    // Only the last component missing: created, and the cut backed up there.
    let last = d.backup();
    let out = seglog()
        .arg("recover")
        .arg(&d.data)
        .arg("--backup-dir")
        .arg(&last)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(last.is_dir());
}
