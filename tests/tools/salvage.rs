//! Damage in sealed segments: what verify, recover (with and without --salvage) and
//! the broker's fetch do with a bit flip in the middle of a sealed segment, one in
//! its last record, and a damaged header; the records left are checked against the
//! records written.

use std::fs;
use std::path::{Path, PathBuf};

use seglog::format::names::log_file_name;
use seglog::format::{decode_record, HEADER_LEN};

use crate::util::bin::{json, run};
use crate::util::build::{segment, topic_json, Rec};
use crate::util::serve::Serve;

/// Records 0..45: segments at 0, 20 (sealed) and 40 (active).
fn written() -> Vec<Rec> {
    (0..45u64)
        .map(|i| Rec {
            offset: i,
            timestamp_ms: 1_000 + i as i64,
            key: Some(format!("k{i}").into_bytes()),
            value: format!("value-{i:03}-{}", "x".repeat(80)).into_bytes(),
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Damage {
    /// A bit of record 10's value in segment 0.
    Middle,
    /// A bit of record 19's value, the last of segment 0.
    LastRecord,
    /// A bit of segment 0's magic.
    Header,
}

struct Data {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    data: PathBuf,
    part: PathBuf,
}

fn damaged(damage: Damage) -> Data {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let data = root.join("data");
    let part = topic_json(&data, "t", "{\"partitions\": 1, \"config\": {}}");
    let recs = written();
    let mut seg0 = segment(0, 3, &recs[..20]);
    segment(20, 3, &recs[20..40]).write(&part);
    segment(40, 3, &recs[40..]).write(&part);
    let at = match damage {
        Damage::Middle => seg0.records[10].1 as usize + 40,
        Damage::LastRecord => seg0.records[19].1 as usize + 40,
        Damage::Header => 1,
    };
    seg0.log[at] ^= 0x10;
    seg0.write(&part);
    Data {
        _tmp: tmp,
        root,
        data,
        part,
    }
}

/// The offsets a segment file holds, read with the generation `generation`.
fn offsets_in(log: &Path, generation: u64) -> Vec<u64> {
    let bytes = fs::read(log).unwrap();
    let mut pos = HEADER_LEN;
    let mut out = Vec::new();
    while pos < bytes.len() {
        let r = decode_record(&bytes[pos..], pos as u64, generation).unwrap();
        out.push(r.offset);
        pos += r.encoded_len;
    }
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn lost(damage: Damage) -> Vec<u64> {
    match damage {
        Damage::Middle => vec![10],
        Damage::LastRecord => vec![19],
        Damage::Header => vec![],
    }
}

#[test]
fn verify_and_recover_without_salvage_leave_the_damage() {
    for damage in [Damage::Middle, Damage::LastRecord, Damage::Header] {
        let d = damaged(damage);
        let before = fs::read(d.part.join(log_file_name(0))).unwrap();
        let (code, out, _) = run(&["verify", s(&d.data)], &d.root);
        assert_eq!(code, 2, "{damage:?}: {out}");
        let (code, out, _) = run(&["recover", "--dry-run", s(&d.data)], &d.root);
        assert_eq!(code, 2, "{damage:?}: {out}");
        let (code, out, _) = run(&["recover", s(&d.data)], &d.root);
        assert_eq!(code, 2, "{damage:?}: {out}");
        assert_eq!(
            fs::read(d.part.join(log_file_name(0))).unwrap(),
            before,
            "{damage:?}"
        );
        let (code, _, err) = run(&["recover", "--salvage", s(&d.data)], &d.root);
        assert_eq!(code, 64, "{damage:?}");
        assert!(err.contains("--salvage needs --backup-dir"), "{err}");
    }
}

#[test]
fn salvage_keeps_every_readable_record() {
    for damage in [Damage::Middle, Damage::LastRecord, Damage::Header] {
        let d = damaged(damage);
        let backup = d.root.join("backup");
        let (code, out, err) = run(
            &[
                "recover",
                "--dry-run",
                "--salvage",
                "--backup-dir",
                s(&backup),
                "--json",
                s(&d.data),
            ],
            &d.root,
        );
        assert_eq!(code, 2, "{damage:?}: {out} {err}");
        let plan = json(&out);
        assert_eq!(plan["salvage"].as_array().unwrap().len(), 1, "{out}");
        let (code, out, err) = run(
            &[
                "recover",
                "--salvage",
                "--backup-dir",
                s(&backup),
                "--json",
                s(&d.data),
            ],
            &d.root,
        );
        // A lost last record leaves offsets missing between two segments, which the
        // continuity check still reports (exit 2, naming them).
        let joins = !matches!(damage, Damage::LastRecord);
        assert_eq!(code, if joins { 0 } else { 2 }, "{damage:?}: {out} {err}");
        let v = json(&out);
        let done = &v["salvaged"][0];
        let lost_reported: Vec<u64> = done["offsets_lost"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|l| l["first"].as_u64().unwrap()..l["next"].as_u64().unwrap())
            .collect();
        assert_eq!(lost_reported, lost(damage), "{damage:?}: {out}");
        assert_eq!(done["header_rebuilt"], matches!(damage, Damage::Header));
        assert!(!done["backups"].as_array().unwrap().is_empty());
        let want: Vec<u64> = (0..20).filter(|o| !lost(damage).contains(o)).collect();
        assert_eq!(offsets_in(&d.part.join(log_file_name(0)), 3), want);
        let (code, out, _) = run(&["verify", s(&d.data)], &d.root);
        assert_eq!(code, if joins { 0 } else { 2 }, "{damage:?}: {out}");
        // A second run finds nothing to salvage.
        let (code, out, _) = run(
            &[
                "recover",
                "--salvage",
                "--backup-dir",
                s(&backup),
                "--json",
                s(&d.data),
            ],
            &d.root,
        );
        assert_eq!(code, if joins { 0 } else { 2 }, "{out}");
        assert!(json(&out)["salvaged"].as_array().unwrap().is_empty());
    }
}

#[test]
fn recover_text_names_a_salvage_as_work() {
    let d = damaged(Damage::Middle);
    let backup = d.root.join("backup");
    let args = |dry: bool| {
        let mut a = vec!["recover"];
        if dry {
            a.push("--dry-run");
        }
        a.extend(["--salvage", "--backup-dir", s(&backup), s(&d.data)]);
        a
    };
    let (code, out, err) = run(&args(true), &d.root);
    assert_eq!(code, 2, "{out} {err}");
    assert!(out.contains("salvage"), "{out}");
    assert!(!out.contains("nothing to do"), "{out}");
    let (code, out, err) = run(&args(false), &d.root);
    assert_eq!(code, 0, "{out} {err}");
    assert!(out.contains("salvage"), "{out}");
    assert!(!out.contains("nothing to do"), "{out}");
    // Once salvaged, a second run has nothing to do and says so.
    let (code, out, _) = run(&args(false), &d.root);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing to do"), "{out}");
}

#[test]
fn dump_reads_around_damage() {
    for damage in [Damage::Middle, Damage::LastRecord, Damage::Header] {
        let d = damaged(damage);
        let before = fs::read(d.part.join(log_file_name(0))).unwrap();
        let (code, out, err) = run(&["dump", "--json", s(&d.data)], &d.root);
        assert_eq!(code, 2, "{damage:?}: {err}");
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let offsets: Vec<u64> = lines
            .iter()
            .filter(|l| l["type"] == "record")
            .map(|l| l["offset"].as_u64().unwrap())
            .collect();
        // A damaged header hides its segment (its generation is unknown); damage in
        // a record hides only that record.
        let hidden: Vec<u64> = match damage {
            Damage::Header => (0..20).collect(),
            _ => lost(damage),
        };
        let want: Vec<u64> = (0..45).filter(|o| !hidden.contains(o)).collect();
        assert_eq!(offsets, want, "{damage:?}");
        let problems: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l["type"] == "problem").collect();
        assert_eq!(problems.len(), 1, "{damage:?}: {out}");
        let p = problems[0];
        assert_eq!(p["severity"], "corrupt");
        match damage {
            Damage::Middle => {
                assert_eq!(p["kind"], "crc_mismatch");
                assert_eq!(p["first_unreadable_offset"], 10);
                assert_eq!(p["next_readable_offset"], 11);
                let at = lines.iter().position(|l| l["type"] == "problem").unwrap();
                assert_eq!(lines[at + 1]["offset"], 11);
                assert_eq!(p["next_readable_position"], lines[at + 1]["position"]);
                assert_eq!(p["first_unreadable_position"], p["position"]);
            }
            Damage::LastRecord => {
                assert_eq!(p["first_unreadable_offset"], 19);
                // Nothing readable after it in the segment: the next segment's base.
                assert_eq!(p["next_readable_offset"], 20);
                assert_eq!(p["next_readable_position"], serde_json::Value::Null);
            }
            Damage::Header => assert_eq!(p["kind"], "bad_header"),
        }
        assert_eq!(
            fs::read(d.part.join(log_file_name(0))).unwrap(),
            before,
            "{damage:?}: dump is read-only"
        );
        // The exit code is verify's.
        let (vcode, _, _) = run(&["verify", s(&d.data)], &d.root);
        assert_eq!(code, vcode, "{damage:?}");
    }
}

#[test]
fn consume_reads_around_damage_through_a_broker() {
    let d = damaged(Damage::Middle);
    let b = Serve::start(&d.data);
    let out = b.run(&["consume", "t", "--partition", "0"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stdout} {stderr}");
    assert_eq!(stdout.lines().count(), 10, "{stdout}");
    assert!(stderr.contains("offsets 10..11"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    let out = b.run(&["consume", "t", "--partition", "0", "--on-corrupt", "skip"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout} {stderr}");
    let got: Vec<&str> = stdout.lines().collect();
    let want: Vec<String> = written()
        .iter()
        .filter(|r| r.offset != 10)
        .map(|r| String::from_utf8(r.value.clone()).unwrap())
        .collect();
    assert_eq!(got, want);
    assert!(stderr.contains("skipped offsets 10..11"), "{stderr}");
    // A fetch starting after the damage is served.
    let out = b.run(&[
        "consume",
        "t",
        "--partition",
        "0",
        "--from",
        "11",
        "--count",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(0));
    b.stop();
}
