//! The offline tools (`verify`, `dump`, `reindex`) run as the real binary on copies
//! of the committed fixtures: exit codes, the problem each damaged fixture holds
//! (kind, file, byte position, offset), and that the read-only tools change nothing.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::SystemTime;

use serde_json::Value;

use seglog::engine::storage::lock::DirLock;
use seglog::format::names::index_file_name;

use crate::util::bin::{run, BIN};
use crate::util::build::Segment;
use crate::util::fs::{copy_tree, fixture};

/// A copy of a fixture in a fresh temporary directory; returns (guard, data dir).
fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join(name);
    copy_tree(&fixture(name), &data);
    (tmp, data)
}

/// Every file and directory below `dir` with its bytes (files), length and mtime.
/// `LOCK` is left out: tools that modify create it.
type Snapshot = BTreeMap<PathBuf, (Option<Vec<u8>>, SystemTime)>;

fn snapshot(dir: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let m = fs::metadata(&d).unwrap();
        out.insert(d.clone(), (None, m.modified().unwrap()));
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n == "LOCK") {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                let m = fs::metadata(&p).unwrap();
                out.insert(
                    p.clone(),
                    (Some(fs::read(&p).unwrap()), m.modified().unwrap()),
                );
            }
        }
    }
    out
}

fn assert_unchanged(before: &Snapshot, dir: &Path, what: &str) {
    let after = snapshot(dir);
    let names = |s: &Snapshot| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(before),
        names(&after),
        "{what}: the file list changed"
    );
    for (p, (bytes, mtime)) in before {
        let (b2, m2) = &after[p];
        assert!(bytes == b2, "{what}: {} changed", p.display());
        assert_eq!(mtime, m2, "{what}: mtime of {} changed", p.display());
    }
}

fn verify_json(data: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["verify", "--json"];
    args.extend_from_slice(extra);
    args.push(data.to_str().unwrap());
    let (code, out, err) = run(&args, data.parent().unwrap());
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    (code, v)
}

/// Every problem of a verify report: (kind, severity, path, position, offset).
/// (kind, severity, path, position, offset)
type Found = (String, String, String, Option<u64>, Option<u64>);
/// (kind, severity, file in the partition, position, offset)
type Expected = (
    &'static str,
    &'static str,
    &'static str,
    Option<u64>,
    Option<u64>,
);

fn problems(v: &Value) -> Vec<Found> {
    let mut all: Vec<&Value> = v["problems"].as_array().unwrap().iter().collect();
    for s in v["segments"].as_array().unwrap() {
        all.extend(s["problems"].as_array().unwrap());
    }
    let mut out: Vec<_> = all
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap().to_string(),
                p["severity"].as_str().unwrap().to_string(),
                p["path"].as_str().unwrap().to_string(),
                p["position"].as_u64(),
                p["offset"].as_u64(),
            )
        })
        .collect();
    out.sort();
    out
}

const P: &str = "topics/events/0/";

struct Case {
    name: &'static str,
    exit: i32,
    severity: &'static str,
    /// (kind, severity, file in the partition, position, offset)
    problems: &'static [Expected],
    /// `verify --quick` exit code.
    quick_exit: i32,
    /// `reindex --check` exit code.
    reindex_check_exit: i32,
}

const CASES: &[Case] = &[
    Case {
        name: "clean",
        exit: 0,
        severity: "clean",
        problems: &[],
        quick_exit: 0,
        reindex_check_exit: 0,
    },
    Case {
        name: "torn-tail",
        exit: 1,
        severity: "repairable",
        problems: &[(
            "torn_tail",
            "repairable",
            "00000000000000000060.log",
            Some(1559),
            Some(70),
        )],
        quick_exit: 1,
        reindex_check_exit: 0,
    },
    Case {
        name: "zero-tail",
        exit: 0,
        severity: "clean",
        problems: &[(
            "zero_tail",
            "info",
            "00000000000000000060.log",
            Some(1559),
            None,
        )],
        quick_exit: 0,
        reindex_check_exit: 0,
    },
    Case {
        name: "stale-tail",
        exit: 0,
        severity: "clean",
        problems: &[(
            "stale_tail",
            "info",
            "00000000000000000060.log",
            Some(1559),
            None,
        )],
        quick_exit: 0,
        reindex_check_exit: 0,
    },
    Case {
        name: "bit-flip-sealed",
        exit: 2,
        severity: "corrupt",
        problems: &[(
            "crc_mismatch",
            "corrupt",
            "00000000000000000000.log",
            Some(1489),
            Some(10),
        )],
        // The startup check trusts a sealed segment whose index, first record and
        // tail agree: a flip in its middle is only found by a full read.
        quick_exit: 0,
        reindex_check_exit: 0,
    },
    Case {
        name: "missing-index",
        exit: 1,
        severity: "repairable",
        problems: &[(
            "missing_index",
            "repairable",
            "00000000000000000000.index",
            None,
            None,
        )],
        quick_exit: 1,
        reindex_check_exit: 1,
    },
    Case {
        name: "wrong-index-entry",
        exit: 1,
        severity: "repairable",
        problems: &[(
            "wrong_index_entry",
            "repairable",
            "00000000000000000000.index",
            Some(16),
            None,
        )],
        quick_exit: 1,
        reindex_check_exit: 1,
    },
    Case {
        name: "partial-index-entry",
        exit: 1,
        severity: "repairable",
        problems: &[(
            "partial_index_entry",
            "repairable",
            "00000000000000000060.index",
            Some(16),
            None,
        )],
        quick_exit: 1,
        reindex_check_exit: 1,
    },
    Case {
        name: "leftover-temp",
        exit: 1,
        severity: "repairable",
        problems: &[(
            "leftover_temp_file",
            "repairable",
            "00000000000000000030.index.tmp",
            None,
            None,
        )],
        quick_exit: 1,
        reindex_check_exit: 0,
    },
    Case {
        name: "compaction-marker",
        exit: 1,
        severity: "repairable",
        problems: &[
            (
                "leftover_temp_file",
                "repairable",
                "00000000000000000000.index.tmp",
                None,
                None,
            ),
            (
                "leftover_temp_file",
                "repairable",
                "00000000000000000000.log.tmp",
                None,
                None,
            ),
            (
                "unfinished_compaction",
                "repairable",
                "compaction.marker",
                Some(0),
                None,
            ),
        ],
        quick_exit: 1,
        // reindex leaves a partition with a marker alone, and says so with 1.
        reindex_check_exit: 1,
    },
    Case {
        name: "bad-header-newest",
        exit: 2,
        severity: "corrupt",
        problems: &[(
            "bad_header",
            "corrupt",
            "00000000000000000060.log",
            Some(28),
            Some(60),
        )],
        quick_exit: 2,
        reindex_check_exit: 0,
    },
    Case {
        name: "unwritten-newest",
        exit: 1,
        severity: "repairable",
        problems: &[(
            "never_durable_segment",
            "repairable",
            "00000000000000000070.log",
            Some(0),
            None,
        )],
        quick_exit: 1,
        reindex_check_exit: 0,
    },
    Case {
        name: "unfinished-seal",
        exit: 1,
        severity: "repairable",
        problems: &[(
            "unfinished_seal",
            "repairable",
            "00000000000000000030.log",
            Some(4565),
            None,
        )],
        quick_exit: 1,
        reindex_check_exit: 0,
    },
    Case {
        name: "missing-middle-segment",
        exit: 2,
        severity: "corrupt",
        problems: &[(
            "segments_do_not_join",
            "corrupt",
            "00000000000000000060.log",
            Some(32),
            Some(30),
        )],
        quick_exit: 2,
        reindex_check_exit: 0,
    },
    Case {
        name: "bit-flip-last-record",
        exit: 2,
        severity: "corrupt",
        problems: &[(
            "crc_mismatch",
            "corrupt",
            "00000000000000000000.log",
            Some(4358),
            Some(29),
        )],
        // The last record lies after the last index entry: the startup check reads it.
        quick_exit: 2,
        reindex_check_exit: 0,
    },
    Case {
        name: "damaged-header-sealed",
        exit: 2,
        severity: "corrupt",
        problems: &[(
            "bad_header",
            "corrupt",
            "00000000000000000000.log",
            Some(0),
            Some(0),
        )],
        quick_exit: 2,
        reindex_check_exit: 0,
    },
    // Compacted topics: gaps inside segments are legal, but segments tile, so a lost
    // segment is found all the same.
    Case {
        name: "compacted-lost-middle-segment",
        exit: 2,
        severity: "corrupt",
        problems: &[(
            "segments_do_not_join",
            "corrupt",
            "00000000000000000070.log",
            Some(32),
            Some(35),
        )],
        quick_exit: 2,
        reindex_check_exit: 0,
    },
    Case {
        name: "compacted-lost-middle-log",
        exit: 2,
        severity: "corrupt",
        problems: &[
            (
                "lost_segment",
                "corrupt",
                "00000000000000000035.index",
                None,
                Some(35),
            ),
            (
                "segments_do_not_join",
                "corrupt",
                "00000000000000000070.log",
                Some(32),
                Some(35),
            ),
        ],
        quick_exit: 2,
        reindex_check_exit: 0,
    },
    Case {
        name: "compacted-lost-last-sealed",
        exit: 2,
        severity: "corrupt",
        problems: &[(
            "segments_do_not_join",
            "corrupt",
            "00000000000000000090.log",
            Some(32),
            Some(70),
        )],
        quick_exit: 2,
        reindex_check_exit: 0,
    },
];

/// Damage in a sealed segment: recover leaves it (exit 2, files unchanged);
/// `recover --salvage --backup-dir` rewrites the segment keeping every readable
/// record, with the exit code of what is left and the offsets it lost.
#[test]
fn recover_and_salvage_of_sealed_damage_fixtures() {
    // (fixture, exit after salvage, offsets lost, header rebuilt)
    type SalvageCase = (&'static str, i32, &'static [(u64, u64)], bool);
    let cases: [SalvageCase; 3] = [
        ("bit-flip-sealed", 0, &[(10, 11)], false),
        // Offset 29 is gone: the segments no longer join, which stays corrupt.
        ("bit-flip-last-record", 2, &[(29, 30)], false),
        ("damaged-header-sealed", 0, &[], true),
    ];
    for (name, exit_after, lost, header) in cases {
        let (tmp, data) = copy(name);
        let before = snapshot(&data);
        let d = data.to_str().unwrap();
        let (code, out, _) = run(&["verify", d], &data);
        assert_eq!(code, 2, "{name}: verify {out}");
        let (code, out, _) = run(&["recover", "--dry-run", d], &data);
        assert_eq!(code, 2, "{name}: recover --dry-run {out}");
        assert_eq!(snapshot(&data), before, "{name}: --dry-run changed files");
        let backup = tmp.path().join("backup");
        let b = backup.to_str().unwrap();
        let (code, out, err) = run(
            &["recover", "--salvage", "--backup-dir", b, "--json", d],
            &data,
        );
        assert_eq!(code, exit_after, "{name}: salvage {out} {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let done = v["salvaged"].as_array().unwrap();
        assert_eq!(done.len(), 1, "{name}: {out}");
        assert_eq!(done[0]["path"], "topics/events/0/00000000000000000000.log");
        let got: Vec<(u64, u64)> = done[0]["offsets_lost"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["first"].as_u64().unwrap(), l["next"].as_u64().unwrap()))
            .collect();
        assert_eq!(got, lost, "{name}: offsets lost");
        assert_eq!(done[0]["header_rebuilt"], header, "{name}");
        assert!(!done[0]["backups"].as_array().unwrap().is_empty(), "{name}");
        let (code, out, _) = run(&["verify", d], &data);
        assert_eq!(code, exit_after, "{name}: verify after salvage {out}");
    }
}

#[test]
fn every_fixture_has_a_case_and_a_readme_line() {
    let readme = fs::read_to_string(fixture("README.md")).unwrap();
    let mut on_disk: Vec<String> = fs::read_dir(fixture(""))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir() && e.file_name() != "vectors")
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut cases: Vec<String> = CASES.iter().map(|c| c.name.to_string()).collect();
    cases.extend(crate::topic_meta::FIXTURES.iter().map(ToString::to_string));
    cases.sort();
    assert_eq!(on_disk, cases);
    for name in crate::topic_meta::FIXTURES {
        assert!(
            readme.contains(&format!("`{name}/`")),
            "README.md has no line for {name}"
        );
    }
    for c in CASES {
        assert!(
            readme.contains(&format!("`{}/`", c.name)),
            "README.md has no line for {}",
            c.name
        );
    }
}

#[test]
fn verify_finds_each_fixtures_problem_and_changes_nothing() {
    for c in CASES {
        let (_tmp, data) = copy(c.name);
        let before = snapshot(&data);
        let (code, v) = verify_json(&data, &[]);
        assert_eq!(code, c.exit, "{}: exit", c.name);
        assert_eq!(v["severity"], c.severity, "{}", c.name);
        let want: Vec<_> = c
            .problems
            .iter()
            .map(|(k, s, f, pos, off)| {
                (k.to_string(), s.to_string(), format!("{P}{f}"), *pos, *off)
            })
            .collect();
        assert_eq!(problems(&v), want, "{}: problems", c.name);
        assert_unchanged(&before, &data, &format!("verify {}", c.name));

        let (code, _) = verify_json(&data, &["--quick"]);
        assert_eq!(code, c.quick_exit, "{}: verify --quick exit", c.name);
        let (code, out, _) = run(&["verify", data.to_str().unwrap()], &data);
        assert_eq!(code, c.exit, "{}: human verify exit", c.name);
        assert!(out.contains("segment") && out.contains("status"), "{out}");
        for (kind, ..) in c.problems {
            assert!(
                out.contains(kind),
                "{}: human output lacks {kind}:\n{out}",
                c.name
            );
        }
        assert_unchanged(&before, &data, &format!("verify --quick {}", c.name));
    }
}

#[test]
fn dump_reports_the_same_problems_and_changes_nothing() {
    for c in CASES {
        let (_tmp, data) = copy(c.name);
        let before = snapshot(&data);
        let (code, out, err) = run(&["dump", "--json", data.to_str().unwrap()], &data);
        assert_eq!(code, c.exit, "{}: dump exit ({err})", c.name);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        for (kind, sev, file, pos, _) in c.problems {
            assert!(
                lines.iter().any(|l| l["type"] == "problem"
                    && l["kind"] == *kind
                    && l["severity"] == *sev
                    && l["path"] == format!("{P}{file}")
                    && l["position"].as_u64() == *pos),
                "{}: dump has no {kind} line",
                c.name
            );
        }
        // Records come in offset order within each partition.
        let mut last: BTreeMap<(String, u64), u64> = BTreeMap::new();
        for l in lines.iter().filter(|l| l["type"] == "record") {
            let key = (
                l["topic"].as_str().unwrap().to_string(),
                l["partition"].as_u64().unwrap(),
            );
            let off = l["offset"].as_u64().unwrap();
            if let Some(prev) = last.insert(key, off) {
                assert!(off > prev, "{}: offset {off} after {prev}", c.name);
            }
        }
        let (code, _, _) = run(&["dump", data.to_str().unwrap()], &data);
        assert_eq!(code, c.exit, "{}: human dump exit", c.name);
        let (code, _, _) = run(
            &[
                "dump",
                "--json",
                "--index",
                "--header",
                "--bytes",
                "base64",
                data.to_str().unwrap(),
            ],
            &data,
        );
        assert_eq!(code, c.exit, "{}: dump --index --header exit", c.name);
        assert_unchanged(&before, &data, &format!("dump {}", c.name));
    }
}

#[test]
fn reindex_check_changes_nothing() {
    for c in CASES {
        let (_tmp, data) = copy(c.name);
        let before = snapshot(&data);
        let (code, out, err) = run(&["reindex", "--check", data.to_str().unwrap()], &data);
        assert_eq!(code, c.reindex_check_exit, "{}: {out} {err}", c.name);
        let (code, out, _) = run(
            &["reindex", "--check", "--json", data.to_str().unwrap()],
            &data,
        );
        assert_eq!(code, c.reindex_check_exit, "{}", c.name);
        let _: Value = serde_json::from_str(&out).unwrap();
        assert_unchanged(&before, &data, &format!("reindex --check {}", c.name));
        assert!(!data.join("LOCK").exists(), "reindex --check took the lock");
    }
}

#[test]
fn dump_of_the_clean_fixture() {
    let data = fixture("clean");
    let (code, out, err) = run(&["dump", "--json", data.to_str().unwrap()], &data);
    assert_eq!((code, err.as_str()), (0, ""));
    let records: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 70 + 12 + 60);
    assert!(records.iter().all(|r| r["type"] == "record"));
    let first = &records[0];
    assert_eq!(first["topic"], "events");
    assert_eq!(first["partition"], 0);
    assert_eq!(first["path"], format!("{P}00000000000000000000.log"));
    assert_eq!(first["position"], 32);
    assert_eq!(first["offset"], 0);
    assert_eq!(first["timestamp_ms"], 1_700_000_000_000i64);
    assert_eq!(first["key"], Value::Null);
    assert!(first["value"].as_str().unwrap().starts_with("event 0: "));
    assert_eq!(records[1]["key"], "user-1");
    // A tombstone of the compacted topic: a key and an empty value.
    assert!(records
        .iter()
        .any(|r| r["topic"] == "users" && r["value"] == "" && r["key"].is_string()));
}

#[test]
fn dump_from_to_limit_cross_segments() {
    let data = fixture("clean").join("topics/events/0");
    let offsets = |args: &[&str]| -> Vec<u64> {
        let mut a = vec!["dump", "--json"];
        a.extend_from_slice(args);
        a.push(data.to_str().unwrap());
        let (code, out, _) = run(&a, &data);
        assert_eq!(code, 0);
        out.lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["offset"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(
        offsets(&["--from", "25", "--to", "35"]),
        (25..=35).collect::<Vec<_>>()
    );
    assert_eq!(offsets(&["--from", "29", "--limit", "3"]), vec![29, 30, 31]);
    assert_eq!(offsets(&["--from", "65"]), (65..70).collect::<Vec<_>>());
    assert_eq!(offsets(&["--to", "2"]), vec![0, 1, 2]);
    assert_eq!(offsets(&["--from", "70"]), Vec::<u64>::new());
    // One .log file.
    let log = data.join("00000000000000000030.log");
    let (code, out, _) = run(&["dump", "--json", log.to_str().unwrap()], &data);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 30);
}

/// With --from/--to, dump reports the problems that concern offsets of the range,
/// and only those, whether it read past them or not: damage before --from (met
/// while reading up to it) and damage after --to (never read, or found by the
/// quick check at a segment's tail) are left out alike, and the exit code follows
/// what is reported. Nothing after where --limit stopped is reported.
#[test]
fn dump_reports_the_problems_of_its_range() {
    let cases: &[(&str, &[&str], i32)] = &[
        // crc_mismatch of offset 29, the last of sealed 00.log (the quick check
        // reads it).
        ("bit-flip-last-record", &[], 2),
        ("bit-flip-last-record", &["--from", "0", "--to", "5"], 0),
        ("bit-flip-last-record", &["--from", "25", "--to", "28"], 0),
        ("bit-flip-last-record", &["--to", "29"], 2),
        ("bit-flip-last-record", &["--from", "29", "--to", "29"], 2),
        ("bit-flip-last-record", &["--from", "20", "--to", "40"], 2),
        ("bit-flip-last-record", &["--limit", "3"], 0),
        // crc_mismatch of offset 10 inside sealed 00.log.
        ("bit-flip-sealed", &["--from", "0", "--to", "5"], 0),
        ("bit-flip-sealed", &["--from", "20", "--to", "25"], 0),
        ("bit-flip-sealed", &["--from", "11"], 0),
        ("bit-flip-sealed", &["--from", "5", "--to", "15"], 2),
        ("bit-flip-sealed", &["--from", "10", "--to", "10"], 2),
        // Offsets 30..=59 missing between 00.log and 60.log.
        ("missing-middle-segment", &[], 2),
        ("missing-middle-segment", &["--from", "0", "--to", "5"], 0),
        ("missing-middle-segment", &["--from", "65"], 0),
        ("missing-middle-segment", &["--from", "40", "--to", "45"], 2),
        ("missing-middle-segment", &["--from", "25", "--to", "35"], 2),
        // A torn tail after offset 69 of the active segment.
        ("torn-tail", &[], 1),
        ("torn-tail", &["--to", "65"], 0),
        ("torn-tail", &["--to", "69"], 0),
        ("torn-tail", &["--from", "65"], 1),
        // Zeros after the data of sealed 30.log (offsets 30..=59).
        ("unfinished-seal", &[], 1),
        ("unfinished-seal", &["--to", "35"], 0),
        ("unfinished-seal", &["--from", "55", "--to", "62"], 1),
    ];
    for &(name, flags, want) in cases {
        let data = fixture(name).join("topics/events/0");
        let mut args = vec!["dump", "--json"];
        args.extend_from_slice(flags);
        args.push(data.to_str().unwrap());
        let (code, out, err) = run(&args, &data);
        assert_eq!(code, want, "{name} {flags:?}: {out} {err}");
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let reported = lines
            .iter()
            .filter(|l| l["type"] == "problem" && l["severity"] != "info")
            .count();
        assert_eq!(reported > 0, want > 0, "{name} {flags:?}: {out}");
        // The same range in text: the problem lines on stderr, the same exit code.
        args.retain(|a| *a != "--json");
        let (code, _, err) = run(&args, &data);
        assert_eq!(code, want, "{name} {flags:?} (text): {err}");
        assert_eq!(err.is_empty(), want == 0, "{name} {flags:?} (text): {err}");
    }
}

#[test]
fn dump_index_and_header_lines() {
    let data = fixture("clean").join("topics/events/0");
    let (code, out, _) = run(
        &[
            "dump",
            "--json",
            "--index",
            "--header",
            data.to_str().unwrap(),
        ],
        &data,
    );
    assert_eq!(code, 0);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |t: &str| lines.iter().filter(|l| l["type"] == t).count();
    assert_eq!(
        (count("header"), count("index"), count("record")),
        (3, 5, 70)
    );
    let h = lines
        .iter()
        .find(|l| l["type"] == "header" && l["base_offset"] == 30)
        .unwrap();
    assert_eq!(h["generation"], 3);
    let idx: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "index" && l["path"] == format!("{P}00000000000000000000.index"))
        .collect();
    assert_eq!(idx[0]["position"], 32);
    // Every index entry points at the record it names.
    for e in lines.iter().filter(|l| l["type"] == "index") {
        assert!(lines.iter().any(|r| r["type"] == "record"
            && r["offset"] == e["offset"]
            && r["position"] == e["position"]));
    }
    let (code, out, _) = run(
        &[
            "dump",
            "--index",
            "--header",
            "--limit",
            "2",
            data.to_str().unwrap(),
        ],
        &data,
    );
    assert_eq!(code, 0);
    assert!(
        out.starts_with("# header topics/events/0/00000000000000000000.log: version 1"),
        "{out}"
    );
    assert!(
        out.contains("\n0  2023-11-14T22:13:20.000Z  -  event 0: "),
        "{out}"
    );
}

#[test]
fn dump_goes_on_after_a_corrupt_segment() {
    let data = fixture("bit-flip-sealed");
    let (code, out, _) = run(&["dump", "--json", data.to_str().unwrap()], &data);
    assert_eq!(code, 2);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let offsets: Vec<u64> = lines
        .iter()
        .filter(|l| l["type"] == "record")
        .map(|l| l["offset"].as_u64().unwrap())
        .collect();
    // The dump reads around the damaged record 10 and goes on in the same segment.
    let want: Vec<u64> = (0..10).chain(11..70).collect();
    assert_eq!(offsets, want);
    // The problem line sits between the last record before the damage and the first
    // after it, and names the damaged range.
    let at = lines.iter().position(|l| l["type"] == "problem").unwrap();
    assert_eq!(lines[at - 1]["offset"], 9);
    assert_eq!(lines[at + 1]["offset"], 11);
    let p = &lines[at];
    assert_eq!(p["kind"], "crc_mismatch");
    assert_eq!(p["first_unreadable_offset"], 10);
    assert_eq!(p["first_unreadable_position"], 1489);
    assert_eq!(p["next_readable_offset"], 11);
    assert_eq!(p["next_readable_position"], lines[at + 1]["position"]);
    assert_eq!(lines.iter().filter(|l| l["type"] == "problem").count(), 1);
    // Human output: records on stdout, the problem on stderr.
    let (code, out, err) = run(&["dump", data.to_str().unwrap()], &data);
    assert_eq!(code, 2);
    assert_eq!(out.lines().count(), 69);
    assert!(
        err.contains("crc_mismatch") && err.contains("at byte 1489"),
        "{err}"
    );
}

/// A partition of `n` records of `value_len` bytes, one segment per `per_segment`.
fn big_partition(dir: &Path, n: u64, per_segment: u64, value_len: usize) {
    fs::create_dir_all(dir).unwrap();
    let value = vec![b'x'; value_len];
    let mut base = 0;
    while base < n {
        let mut s = Segment::new(base, 0);
        for off in base..(base + per_segment).min(n) {
            s.push(off, off as i64, None, &value);
        }
        s.write(dir);
        base += per_segment;
    }
}

#[test]
fn dump_into_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("0");
    big_partition(&dir, 20_000, 5_000, 200);
    for json in [false, true] {
        let mut cmd = StdCommand::new(BIN);
        cmd.arg("dump").arg(&dir);
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "json {json}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "json {json}");
    }
}

fn index_of(data: &Path, base: u64) -> PathBuf {
    data.join(P).join(index_file_name(base))
}

#[test]
fn reindex_rebuilds_byte_identical_indexes() {
    let clean = fixture("clean");
    for (name, base) in [
        ("missing-index", 0u64),
        ("wrong-index-entry", 0),
        ("partial-index-entry", 60),
    ] {
        let (_tmp, data) = copy(name);
        let (code, out, err) = run(&["reindex", data.to_str().unwrap()], &data);
        assert_eq!(code, 0, "{name}: {out} {err}");
        assert!(out.contains("rebuilt"), "{out}");
        assert_eq!(
            fs::read(index_of(&data, base)).unwrap(),
            fs::read(index_of(&clean, base)).unwrap(),
            "{name}"
        );
        let (code, _) = verify_json(&data, &[]);
        assert_eq!(code, 0, "{name}: verify after reindex");
        let tmps: Vec<_> = fs::read_dir(data.join(P))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .collect();
        assert!(tmps.is_empty(), "{name}: temporary file left");
        // Now nothing would change.
        let (code, _, _) = run(&["reindex", "--check", data.to_str().unwrap()], &data);
        assert_eq!(code, 0);
    }
}

/// An index over `INDEX_BYTES_MAX` is an invalid index like any other (derived data):
/// verify reports it as repairable and goes on with the rest, dump ignores it, and
/// `reindex` and `recover` rebuild it; it is never read into memory.
#[test]
fn an_oversized_index_is_repairable_and_rebuilt() {
    use seglog::engine::maintenance::check::INDEX_BYTES_MAX;
    let clean = fixture("clean");
    for tool in ["reindex", "recover"] {
        let (_tmp, data) = copy("clean");
        let d = data.to_str().unwrap();
        // Sparse: takes no disk space.
        fs::OpenOptions::new()
            .write(true)
            .open(index_of(&data, 0))
            .unwrap()
            .set_len(INDEX_BYTES_MAX + 1)
            .unwrap();
        let (code, v) = verify_json(&data, &[]);
        assert_eq!(code, 1, "{v}");
        let found = problems(&v);
        assert!(
            found.contains(&(
                "wrong_index_length".into(),
                "repairable".into(),
                format!("{P}{}", index_file_name(0)),
                Some(INDEX_BYTES_MAX),
                None
            )),
            "{found:?}"
        );
        for args in [
            &["dump", d][..],
            &["dump", "--from", "3", d],
            &["dump", "--index", d],
            &["recover", "--dry-run", d],
            &["reindex", "--check", d],
        ] {
            let (code, out, err) = run(args, &data);
            assert_eq!(code, 1, "{args:?}: {out} {err}");
            // No abort for the whole directory (the old error said "more than N").
            assert!(
                !err.contains(&format!("more than {INDEX_BYTES_MAX}")),
                "{args:?}: {err}"
            );
        }
        let (code, out, err) = run(&[tool, d], &data);
        assert_eq!(code, 0, "{tool}: {out} {err}");
        assert_eq!(
            fs::read(index_of(&data, 0)).unwrap(),
            fs::read(index_of(&clean, 0)).unwrap(),
            "{tool}"
        );
        let (code, v) = verify_json(&data, &[]);
        assert_eq!(code, 0, "{tool}: {v}");
    }
}

/// Runs the binary with a deadline: `None` when it had not ended after 20 s (killed).
fn run_with_deadline(args: &[&str], dir: &Path) -> Option<(i32, String, String)> {
    let mut child = StdCommand::new(BIN)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Some((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A FIFO or a directory named like a segment (a sealed one, or the newest) is
/// corruption of that segment, named in the report: no tool blocks on it or aborts
/// for the whole directory, and `recover` leaves it in place.
#[test]
fn a_fifo_or_directory_named_like_a_segment_is_corruption_of_that_segment() {
    use seglog::format::names::log_file_name;
    for (what, base) in [("fifo", 30u64), ("dir", 30), ("fifo", 90), ("dir", 90)] {
        let (_tmp, data) = copy("clean");
        let d = data.to_str().unwrap();
        let rel = format!("{P}{}", log_file_name(base));
        let path = data.join(&rel);
        let _ = fs::remove_file(&path);
        if what == "dir" {
            fs::create_dir(&path).unwrap();
        } else {
            let ok = StdCommand::new("mkfifo").arg(&path).status().unwrap();
            assert!(ok.success());
        }
        let case = format!("{what} at {rel}");
        let (code, out, err) = run_with_deadline(&["verify", "--json", d], &data)
            .unwrap_or_else(|| panic!("{case}: verify blocked"));
        assert_eq!(code, 2, "{case}: {out} {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let found = problems(&v);
        assert!(
            found
                .iter()
                .any(|f| f.0 == "bad_header" && f.1 == "corrupt" && f.2 == rel),
            "{case}: {found:?}"
        );
        for args in [
            &["dump", d][..],
            &["recover", "--dry-run", d],
            &["reindex", "--check", d],
            &["recover", d],
        ] {
            let (code, out, err) = run_with_deadline(args, &data)
                .unwrap_or_else(|| panic!("{case}: {args:?} blocked"));
            assert!(
                matches!(code, 0..=2),
                "{case}: {args:?} exit {code}: {out} {err}"
            );
            if args[0] != "reindex" {
                assert_eq!(code, 2, "{case}: {args:?}: {out} {err}");
            }
        }
        let t = fs::symlink_metadata(&path).unwrap().file_type();
        assert!(!t.is_file(), "{case}: recover replaced it");
        // The broker's startup does not block on it either.
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = data.clone();
        std::thread::spawn(move || {
            let b = seglog::engine::broker::Broker::open(
                &dir,
                std::sync::Arc::new(seglog::engine::storage::io::RealStorage),
                seglog::engine::broker::BrokerOptions::default(),
            );
            let _ = tx.send(b.is_ok());
        });
        rx.recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{case}: the broker's startup blocked"));
    }
}

#[test]
fn reindex_all_rewrites_the_same_bytes() {
    let (_tmp, data) = copy("clean");
    let before = snapshot(&data);
    let (code, out, _) = run(
        &["reindex", "--all", "--json", data.to_str().unwrap()],
        &data,
    );
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["totals"]["written"], 7);
    assert_eq!(v["totals"]["would_change"], 0);
    let after = snapshot(&data);
    for (p, (bytes, _)) in &before {
        assert!(after[p].0 == *bytes, "{} differs", p.display());
    }
}

#[test]
fn reindex_of_a_corrupt_sealed_segment_covers_its_readable_records() {
    let (_tmp, data) = copy("bit-flip-sealed");
    // The old index is valid for what can be read: kept without --all.
    let (code, out, _) = run(&["reindex", "--check", data.to_str().unwrap()], &data);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = run(&["reindex", "--all", data.to_str().unwrap()], &data);
    assert_eq!(code, 0);
    assert!(
        out.contains("covers only the readable records before byte 1489"),
        "{out}"
    );
    // Ten readable records, all within the first 4 KiB: one entry.
    assert_eq!(fs::read(index_of(&data, 0)).unwrap().len(), 16);
}

#[test]
fn reindex_skips_a_segment_whose_header_is_bad_and_a_partition_with_a_marker() {
    let (_tmp, data) = copy("bad-header-newest");
    let before = snapshot(&data);
    let (code, out, _) = run(&["reindex", "--all", data.to_str().unwrap()], &data);
    assert_eq!(code, 0);
    assert!(
        out.contains("00000000000000000060.index: the header of"),
        "{out}"
    );
    assert_eq!(
        fs::read(index_of(&data, 60)).unwrap(),
        before[&index_of(&data, 60)].0.clone().unwrap()
    );

    let (_tmp, data) = copy("compaction-marker");
    drop(DirLock::acquire(&data).unwrap()); // LOCK exists before the snapshot
    let before = snapshot(&data);
    let (code, out, _) = run(&["reindex", "--all", data.to_str().unwrap()], &data);
    assert_eq!(code, 1);
    assert!(out.contains("run `seglog recover` first"), "{out}");
    assert_unchanged(&before, &data, "reindex with a marker");
}

/// A partition left alone (a compaction marker) makes reindex exit 1, with or without
/// --check, and the summary line says so and why: it said "0 index file(s) would
/// change" and nothing else, which read as a clean check.
#[test]
fn reindex_summary_says_a_partition_was_left_alone() {
    let (_tmp, data) = copy("compaction-marker");
    let d = data.to_str().unwrap();
    let (code, out, _) = run(&["reindex", "--check", d], &data);
    assert_eq!(code, 1, "{out}");
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("0 index file(s) would change, ")
            && last.contains("; 1 partition(s) left alone, their indexes not checked: compaction.marker is present")
            && last.ends_with("run `seglog recover` first"),
        "{out}"
    );
    let (code, out, _) = run(&["reindex", d], &data);
    assert_eq!(code, 1, "{out}");
    let last = out.lines().last().unwrap();
    assert!(last.contains("; 1 partition(s) left alone"), "{out}");
    // Without a partition left alone the summary is as before.
    let (_tmp2, clean) = copy("clean");
    let (code, out, _) = run(&["reindex", "--check", clean.to_str().unwrap()], &clean);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("left alone"), "{out}");
}

/// A checkpoint of a Raft group that applied nothing (`applied-<p>.json`).
const APPLIED_NOTHING: &[u8] = br#"{"last_applied":null,"membership":{"log_id":null,"membership":{"configs":[[1]],"nodes":{"1":{"addr":"127.0.0.1:1"}}}},"next_offset":0,"clock_ms":0,"producers":{}}"#;

/// Garbage in `DATA/spares/` and stray directories in a topic directory are reported,
/// as information, with what the broker does with them; the tools delete nothing.
/// `01` is no partition directory (partitions are named by their number in decimal,
/// without leading zeros). A spare whose header decodes, and a Raft checkpoint
/// `applied-<p>.json`, are not reported. The broker's startup removes what the report
/// says it removes and keeps the stray directories.
#[test]
fn garbage_spares_and_stray_topic_entries_are_reported_and_kept() {
    let (_tmp, data) = copy("clean");
    let spares = data.join("spares");
    fs::create_dir(&spares).unwrap();
    fs::write(spares.join("spare-1.log"), b"garbage!").unwrap();
    fs::write(spares.join("spare-2.log"), b"").unwrap();
    fs::write(spares.join("foo.txt"), b"hello\n").unwrap();
    fs::write(spares.join("spare-00000000000000000003.log"), b"8 bytes.").unwrap();
    // A good spare: a sealed segment's file renamed into the pool.
    fs::copy(
        data.join(P).join("00000000000000000000.log"),
        spares.join("spare-00000000000000000004.log"),
    )
    .unwrap();
    let topic = data.join("topics/events");
    fs::create_dir(topic.join("01")).unwrap();
    fs::create_dir(topic.join("abc")).unwrap();
    fs::write(topic.join("applied-0.json"), APPLIED_NOTHING).unwrap();
    // A replicated topic's replica placement is the broker's own file too (both are
    // read as the broker reads them: they must be valid).
    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(topic.join("topic.json")).unwrap()).unwrap();
    let partitions = meta["partitions"].as_u64().unwrap() as usize;
    let placement = serde_json::json!({"replication_factor": 1, "replicas": vec![[1]; partitions]});
    fs::write(topic.join("replication.json"), placement.to_string()).unwrap();
    drop(DirLock::acquire(&data).unwrap()); // LOCK exists before the snapshot
    let before = snapshot(&data);
    let (code, v) = verify_json(&data, &[]);
    assert_eq!(code, 0, "{v:#}");
    let got: Vec<(String, String, String)> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap().to_string(),
                p["kind"].as_str().unwrap().to_string(),
                p["severity"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        ("topics/events/01", "unknown_file"),
        ("topics/events/abc", "unknown_file"),
        ("spares/foo.txt", "unknown_file"),
        ("spares/spare-00000000000000000003.log", "bad_spare_header"),
        ("spares/spare-1.log", "unknown_file"),
        ("spares/spare-2.log", "unknown_file"),
    ];
    let want: Vec<(String, String, String)> = want
        .iter()
        .map(|(p, k)| (p.to_string(), k.to_string(), "info".to_string()))
        .collect();
    assert_eq!(got, want, "{v:#}");
    for p in v["problems"].as_array().unwrap() {
        let detail = p["detail"].as_str().unwrap();
        if p["path"].as_str().unwrap().starts_with("spares/") {
            assert!(
                detail.contains("the broker removes it at its next start"),
                "{detail}"
            );
        } else {
            assert!(detail.contains("not a partition directory"), "{detail}");
        }
    }
    let d = data.to_str().unwrap();
    let (code, out, _) = run(&["verify", d], &data);
    assert_eq!(code, 0);
    assert!(out.contains("0 corrupt, 0 repairable, 6 info"), "{out}");
    // recover has nothing to do with them, and deletes none of them.
    let (code, out, _) = run(&["recover", "--dry-run", d], &data);
    assert_eq!((code, out.trim()), (0, "nothing to do"));
    let (code, out, err) = run(&["recover", d], &data);
    assert_eq!(code, 0, "{out} {err}");
    assert_unchanged(&before, &data, "recover with garbage spares");
    // The broker does what the report says.
    crate::util::serve::Serve::start(&data).stop();
    let mut left: Vec<String> = fs::read_dir(&spares)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    // The good spare stays; the rest are empty spares the spare maker made (a
    // spare's header and nothing else), named after every name it found.
    assert_eq!(
        left.first().map(String::as_str),
        Some("spare-00000000000000000004.log"),
        "{left:?}"
    );
    for name in &left[1..] {
        assert!(name.as_str() > "spare-00000000000000000004.log", "{left:?}");
        assert_eq!(fs::metadata(spares.join(name)).unwrap().len(), 32, "{name}");
    }
    assert!(topic.join("01").is_dir() && topic.join("abc").is_dir());
    let (code, v) = verify_json(&data, &[]);
    assert_eq!(code, 0);
    assert_eq!(v["problems"].as_array().unwrap().len(), 2, "{v:#}");
}

/// Entries of `DATA/topics/` that are no topic directory (a name the topic-name
/// rules refuse, a file) are reported as `unknown_file`, information, by `verify`
/// and `dump` alike, with what the broker does with them; nothing removes them.
#[test]
fn stray_entries_of_the_topics_directory_are_reported_and_kept() {
    let (_tmp, data) = copy("clean");
    let topics = data.join("topics");
    // A name with a space and a '!', holding what looks like a partition.
    fs::create_dir_all(topics.join("bad name!/0")).unwrap();
    fs::copy(
        data.join(P).join("00000000000000000000.log"),
        topics.join("bad name!/0/00000000000000000000.log"),
    )
    .unwrap();
    fs::create_dir(topics.join("..x~")).unwrap();
    fs::write(topics.join("notes.txt"), b"hello\n").unwrap();
    drop(DirLock::acquire(&data).unwrap()); // LOCK exists before the snapshot
    let before = snapshot(&data);
    let want = [
        (
            "topics/..x~",
            "directory seglog does not know: not a topic directory",
        ),
        (
            "topics/bad name!",
            "directory seglog does not know: not a topic directory",
        ),
        ("topics/notes.txt", "file seglog does not know in topics/"),
    ];
    let (code, v) = verify_json(&data, &[]);
    assert_eq!(code, 0, "{v:#}");
    let problems = v["problems"].as_array().unwrap();
    assert_eq!(problems.len(), want.len(), "{v:#}");
    for (p, (path, detail)) in problems.iter().zip(want) {
        assert_eq!(p["path"], path, "{p:#}");
        assert_eq!(p["kind"], "unknown_file", "{p:#}");
        assert_eq!(p["severity"], "info", "{p:#}");
        assert_eq!(p["topic"], Value::Null, "{p:#}");
        let d = p["detail"].as_str().unwrap();
        assert!(d.starts_with(detail), "{d}");
        assert!(d.ends_with("leave it alone"), "{d}");
    }
    assert_eq!(v["totals"]["info"], 3, "{v:#}");
    let d = data.to_str().unwrap();
    let (code, out, _) = run(&["verify", d], &data);
    assert_eq!(code, 0);
    assert!(out.contains("0 corrupt, 0 repairable, 3 info"), "{out}");
    assert!(out.contains("topics/bad name!"), "{out}");
    // dump: the same problems as problem lines, then the records as before.
    let (code, out, err) = run(&["dump", "--json", d], &data);
    assert_eq!((code, err.as_str()), (0, ""));
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stray: Vec<&Value> = lines.iter().filter(|l| l["type"] == "problem").collect();
    assert_eq!(stray.len(), 3, "{out}");
    for (p, (path, _)) in stray.iter().zip(want) {
        assert_eq!(
            (&p["path"], &p["kind"]),
            (&Value::from(path), &Value::from("unknown_file"))
        );
    }
    assert_eq!(
        lines.iter().filter(|l| l["type"] == "record").count(),
        70 + 12 + 60
    );
    // Text dump: information is not printed.
    let (code, _, err) = run(&["dump", d], &data);
    assert_eq!((code, err.as_str()), (0, ""));
    let (code, out, _) = run(&["recover", "--dry-run", d], &data);
    assert_eq!((code, out.trim()), (0, "nothing to do"));
    let (code, out, err) = run(&["recover", d], &data);
    assert_eq!(code, 0, "{out} {err}");
    assert_unchanged(&before, &data, "recover with stray entries in topics/");
    crate::util::serve::Serve::start(&data).stop();
    assert!(topics
        .join("bad name!/0/00000000000000000000.log")
        .is_file());
    assert!(topics.join("..x~").is_dir() && topics.join("notes.txt").is_file());
}

/// A directory, a FIFO and a symbolic link named like spares are no spares: `verify`
/// names each as information, and the broker starts, leaves them in place and never
/// opens them (a directory stopped its start, a FIFO would block it, and the link's
/// target, here a copy of a sealed segment, had its header rewritten as a spare's).
#[test]
fn odd_entries_in_spares_are_left_in_place_by_verify_and_the_broker() {
    let (tmp, data) = copy("clean");
    let spares = data.join("spares");
    fs::create_dir(&spares).unwrap();
    let dir = spares.join("spare-00000000000000000001.log");
    fs::create_dir(&dir).unwrap();
    let fifo = spares.join("spare-00000000000000000002.log");
    assert!(StdCommand::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let target = tmp.path().join("outside.log");
    fs::copy(data.join(P).join("00000000000000000000.log"), &target).unwrap();
    let target_bytes = fs::read(&target).unwrap();
    let link = spares.join("spare-00000000000000000003.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (code, v) = verify_json(&data, &[]);
    assert_eq!(code, 0, "{v:#}");
    let got: Vec<(&str, &str, &str)> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap(),
                p["kind"].as_str().unwrap(),
                p["severity"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "spares/spare-00000000000000000001.log",
                "unknown_file",
                "info"
            ),
            (
                "spares/spare-00000000000000000002.log",
                "unknown_file",
                "info"
            ),
            (
                "spares/spare-00000000000000000003.log",
                "unknown_file",
                "info"
            ),
        ],
        "{v:#}"
    );
    for (p, what) in
        v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .zip(["a directory", "a FIFO", "a symbolic link"])
    {
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.starts_with(what), "{detail}");
        assert!(
            detail.contains("the broker leaves it in place and ignores it"),
            "{detail}"
        );
    }
    crate::util::serve::Serve::start(&data).stop();
    assert!(dir.is_dir());
    let kind = |p: &Path| fs::symlink_metadata(p).unwrap().file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind(&fifo)));
    assert!(kind(&link).is_symlink());
    assert!(
        fs::read(&target).unwrap() == target_bytes,
        "the link's target was written"
    );
}

#[test]
fn reindex_refuses_while_the_lock_is_held() {
    let (_tmp, data) = copy("missing-index");
    let lock = DirLock::acquire(&data).unwrap();
    let before = snapshot(&data);
    let (code, _, err) = run(&["reindex", data.to_str().unwrap()], &data);
    assert_eq!(code, 73, "{err}");
    assert!(
        err.contains(&data.join("LOCK").display().to_string()),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_unchanged(&before, &data, "locked reindex");
    // --check works beside a broker.
    let (code, _, _) = run(&["reindex", "--check", data.to_str().unwrap()], &data);
    assert_eq!(code, 1);
    drop(lock);
    // A child process another test forks at this moment holds a copy of the lock's
    // descriptor until it execs: wait that out.
    let mut code = 73;
    for _ in 0..100 {
        code = run(&["reindex", data.to_str().unwrap()], &data).0;
        if code != 73 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(code, 0);
}

#[test]
fn paths_a_topic_a_partition_and_one_log_file() {
    let clean = fixture("clean");
    let (code, v) = verify_json(&clean.join("topics/users"), &[]);
    assert_eq!(code, 0);
    assert_eq!(v["kind"], "topic");
    assert_eq!(v["segments"].as_array().unwrap().len(), 3);
    assert_eq!(
        v["segments"][0]["path"],
        "topics/users/0/00000000000000000000.log"
    );
    let (code, v) = verify_json(&clean.join("topics/events/1"), &[]);
    assert_eq!((code, v["kind"].as_str()), (0, Some("partition")));
    let log = fixture("bit-flip-sealed")
        .join(P)
        .join("00000000000000000000.log");
    let (code, v) = verify_json(&log, &[]);
    assert_eq!((code, v["kind"].as_str()), (2, Some("log_file")));
    assert_eq!(v["segments"].as_array().unwrap().len(), 1);
    // The vector partition has no topic.json: the default configuration applies and
    // paths are relative to the partition directory.
    let vectors = fixture("vectors/partition");
    let (code, v) = verify_json(&vectors, &[]);
    assert_eq!(code, 0);
    assert_eq!(v["segments"][0]["path"], "00000000000000000000.log");
    assert_eq!(v["totals"]["records"], 700);
}

#[test]
fn usage_errors_exit_64() {
    let here = fixture("clean");
    for args in [
        &["verify"][..],
        &["verify", "--bogus", "x"],
        &["dump", "--limit", "many", "x"],
        &["dump", "--from", "5", "--to", "2", here.to_str().unwrap()],
        &["dump", "--bytes", "octal", here.to_str().unwrap()],
        &["reindex", "--check", "/no/such/dir"],
        &["verify", fixture("").join("README.md").to_str().unwrap()],
    ] {
        let (code, _, err) = run(args, &here);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn verify_json_shape() {
    let data = fixture("torn-tail");
    let (_, v) = verify_json(&data, &[]);
    let seg = &v["segments"][2];
    for field in [
        "path",
        "first_offset",
        "last_offset",
        "records",
        "bytes",
        "problems",
    ] {
        assert!(seg.get(field).is_some(), "segment field {field}");
    }
    assert_eq!(seg["first_offset"], 60);
    assert_eq!(seg["last_offset"], 69);
    assert_eq!(seg["records"], 10);
    assert_eq!(seg["bytes"], 1579);
    assert_eq!(seg["active"], true);
    assert_eq!(seg["generation"], 2);
    let p = &seg["problems"][0];
    for field in ["kind", "position", "offset", "detail"] {
        assert!(p.get(field).is_some(), "problem field {field}");
    }
    assert_eq!(v["totals"]["records"], 70);
    assert_eq!(v["totals"]["repairable"], 1);
    assert_eq!(v["totals"]["segments"], 3);
    // stdout is exactly one JSON object.
    let (_, out, _) = run(&["verify", "--json", data.to_str().unwrap()], &data);
    assert!(serde_json::from_str::<Value>(&out).is_ok());
    let _ = std::io::stdout().flush();
}

#[test]
fn a_corrupt_segment_is_not_also_reported_as_a_gap() {
    // A bad header in the middle segment: its offsets are unreadable, which is the
    // one problem; the offsets "missing" around it are not a second one.
    let (_tmp, data) = copy("clean");
    let log = data.join(P).join("00000000000000000030.log");
    let mut bytes = fs::read(&log).unwrap();
    bytes[0] = b'X';
    fs::write(&log, &bytes).unwrap();
    let (code, v) = verify_json(&data, &[]);
    assert_eq!(code, 2);
    let found = problems(&v);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "bad_header");
    assert_eq!(found[0].3, Some(0));
    // A real gap after a clean segment is still reported.
    let (_tmp2, data) = copy("missing-middle-segment");
    let (_, v) = verify_json(&data, &[]);
    assert_eq!(problems(&v)[0].0, "segments_do_not_join");
}

/// `recover --dry-run` and `recover` of a compacted topic that lost a segment: the
/// loss is reported as corruption (exit 2), nothing is deleted or changed, and the
/// lost segment's index is kept.
#[test]
fn recover_reports_a_lost_segment_of_a_compacted_topic_and_keeps_every_file() {
    /// (kind, file in the partition, offset) of each problem recover reports.
    type Lost = (&'static str, &'static str, u64);
    let cases: &[(&str, &[Lost])] = &[
        (
            "compacted-lost-middle-segment",
            &[("segments_do_not_join", "00000000000000000070.log", 35)],
        ),
        (
            "compacted-lost-middle-log",
            &[
                ("lost_segment", "00000000000000000035.index", 35),
                ("segments_do_not_join", "00000000000000000070.log", 35),
            ],
        ),
        (
            "compacted-lost-last-sealed",
            &[("segments_do_not_join", "00000000000000000090.log", 70)],
        ),
    ];
    for &(name, want) in cases {
        let (_tmp, data) = copy(name);
        // `topics/`: recover creates `DATA/LOCK`, which changes the data directory.
        let before = snapshot(&data.join("topics"));
        for dry in [true, false] {
            let mut args = vec!["recover", "--json"];
            if dry {
                args.push("--dry-run");
            }
            args.push(data.to_str().unwrap());
            let (code, out, err) = run(&args, data.parent().unwrap());
            assert_eq!(code, 2, "{name} dry {dry}: {out} {err}");
            let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
            assert_eq!(v["dry_run"], dry, "{name}");
            assert_eq!(v["actions"], serde_json::json!([]), "{name}");
            assert_eq!(v["severity_before"], "corrupt", "{name}");
            assert_eq!(v["severity_after"], "corrupt", "{name}");
            let p = &v["partitions"][0];
            assert_eq!(p["label"], "events/0", "{name}");
            assert_eq!(p["topic"], "events", "{name}");
            assert_eq!(p["partition"], 0, "{name}");
            assert_eq!(p["next_offset"], 100, "{name}");
            assert_eq!(p["refuses_writes"], false, "{name}");
            assert_eq!(p["corrupt"], serde_json::json!([]), "{name}");
            let found: Vec<(String, String, u64, String)> = p["not_joined"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| {
                    (
                        x["kind"].as_str().unwrap().to_string(),
                        x["path"].as_str().unwrap().to_string(),
                        x["offset"].as_u64().unwrap(),
                        x["severity"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            let want: Vec<(String, String, u64, String)> = want
                .iter()
                .map(|(k, f, o)| (k.to_string(), format!("{P}{f}"), *o, "corrupt".to_string()))
                .collect();
            assert_eq!(found, want, "{name} dry {dry}");
            // Nothing deleted, nothing changed (the lost segment's index stays).
            assert_unchanged(
                &before,
                &data.join("topics"),
                &format!("recover {name} dry {dry}"),
            );
        }
        let (code, _) = verify_json(&data, &[]);
        assert_eq!(code, 2, "{name}: verify after recover");
    }
}

/// Usage errors are one line: clap's message and where the help is.
#[test]
fn usage_errors_are_one_line_with_a_help_hint() {
    let here = fixture("clean");
    let cases: [(&[&str], &str); 4] = [
        (&["verify"], "(see 'seglog verify --help')"),
        (
            &["dump", "--limit", "many", "x"],
            "(see 'seglog dump --help')",
        ),
        (&["bogus"], "(see 'seglog --help')"),
        (
            &["topics", "create", "t", "--partitions", "x"],
            "(see 'seglog topics create --help')",
        ),
    ];
    for (args, hint) in cases {
        let (code, out, err) = run(args, &here);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.trim_end().ends_with(hint), "{args:?}: {err}");
    }
}

/// `seglog --help` (and so `man seglog`) lists every exit code; `topics create
/// --help` every configuration key with its default.
#[test]
fn help_lists_exit_codes_and_config_keys() {
    let here = fixture("clean");
    let (code, help, _) = run(&["--help"], &here);
    assert_eq!(code, 0);
    for c in ["0 ", "1 ", "2 ", "64 ", "69 ", "73 ", "74 "] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(c)),
            "{c}: {help}"
        );
    }
    let (code, help, _) = run(&["topics", "create", "--help"], &here);
    assert_eq!(code, 0);
    for key in seglog::format::topic::CONFIG_KEYS {
        assert!(help.contains(key), "{key}: {help}");
    }
    let man = fs::read_to_string(fixture("").join("../../man/seglog.1")).unwrap();
    assert!(
        man.contains("64  usage error"),
        "man/seglog.1 has no exit-code table"
    );
}

/// recover --json names partitions as verify and dump do: `topic` and a numeric
/// `partition`.
#[test]
fn recover_json_uses_topic_and_partition() {
    let (_tmp, data) = copy("torn-tail");
    let (code, out, err) = run(
        &["recover", "--dry-run", "--json", data.to_str().unwrap()],
        &data,
    );
    assert_eq!(code, 1, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    for x in v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .chain(v["partitions"].as_array().unwrap())
    {
        assert_eq!(x["topic"], "events", "{x}");
        assert_eq!(x["partition"], 0, "{x}");
    }
    let (_, verify) = verify_json(&data, &[]);
    assert_eq!(
        verify["segments"][0]["path"]
            .as_str()
            .map(|p| p.starts_with("topics/events/0/")),
        Some(true)
    );
}

/// recover --dry-run of a corrupt directory says what it cannot repair.
#[test]
fn recover_dry_run_names_what_it_cannot_repair() {
    let (_tmp, data) = copy("bit-flip-sealed");
    let (code, out, err) = run(&["recover", "--dry-run", data.to_str().unwrap()], &data);
    assert_eq!(code, 2, "{err}");
    assert!(!out.contains("nothing to do"), "{out}");
    assert!(
        out.contains("crc_mismatch") && out.contains("cannot repair"),
        "{out}"
    );
    let (code, out, _) = run(
        &["recover", "--dry-run", "--json", data.to_str().unwrap()],
        &data,
    );
    assert_eq!(code, 2);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cannot_repair"][0]["kind"], "crc_mismatch", "{v}");
    assert_eq!(v["severity_after"], "corrupt", "{v}");
    let (_tmp2, gap) = copy("missing-middle-segment");
    let (code, out, _) = run(&["recover", "--dry-run", gap.to_str().unwrap()], &gap);
    assert_eq!(code, 2);
    assert!(
        !out.contains("nothing to do") && out.contains("nothing recover can repair"),
        "{out}"
    );
}

/// recover --dry-run on an unfinished compaction swap says what recover does with each
/// of its temporary files: finishing the swap renames the ones the marker names, and a
/// temporary file it does not name is removed once the swap is finished. Neither is
/// something recover "leaves" or that `seglog reindex` repairs (it refuses a partition
/// with a marker), and neither is among what recover cannot repair.
#[test]
fn recover_dry_run_says_what_the_swap_does_with_its_temporary_files() {
    let (_tmp, data) = copy("compaction-marker");
    let part = data.join(P);
    fs::write(part.join("00000000000000000030.log.tmp"), b"stray").unwrap();
    let d = data.to_str().unwrap();
    let (code, out, err) = run(&["recover", "--dry-run", d], &data);
    assert_eq!(code, 1, "{out} {err}");
    for (tmp, then) in [
        (
            "00000000000000000000.log.tmp",
            "finishing the compaction swap renames it to 00000000000000000000.log",
        ),
        (
            "00000000000000000000.index.tmp",
            "finishing the compaction swap renames it to 00000000000000000000.index",
        ),
        (
            "00000000000000000030.log.tmp",
            "the marker does not name it: recover removes it once the swap is finished",
        ),
    ] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("{P}{tmp}:")))
            .unwrap_or_else(|| panic!("no line for {tmp}: {out}"));
        assert!(
            line.starts_with("events/0: ") && line.ends_with(then),
            "{line}"
        );
    }
    assert!(!out.contains("reindex"), "{out}");
    assert!(!out.contains("recover leaves it"), "{out}");
    assert!(
        !out.contains("beyond what the startup check reads"),
        "{out}"
    );
    let (code, out, _) = run(&["recover", "--dry-run", "--json", d], &data);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cannot_repair"], serde_json::json!([]), "{v}");
    let mut then: Vec<(String, String)> = v["after_swap"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["path"].as_str().unwrap().to_string(),
                x["then"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    then.sort();
    assert_eq!(then.len(), 3, "{v}");
    assert_eq!(then[0].0, format!("{P}00000000000000000000.index.tmp"));
    assert!(then[2].1.contains("removes it"), "{then:?}");
    // And recover does what the dry run said.
    let new_log = fs::read(part.join("00000000000000000000.log.tmp")).unwrap();
    let (code, out, err) = run(&["recover", d], &data);
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(
        fs::read(part.join("00000000000000000000.log")).unwrap(),
        new_log
    );
    for tmp in [
        "00000000000000000000.log.tmp",
        "00000000000000000000.index.tmp",
        "00000000000000000030.log.tmp",
    ] {
        assert!(!part.join(tmp).exists(), "{tmp} is still there");
    }
}

/// A --backup-dir that cannot be one is reported as what it is, before anything is cut.
#[test]
fn a_bad_backup_dir_is_named() {
    let (tmp, data) = copy("torn-tail");
    let file = tmp.path().join("file");
    fs::write(&file, b"x").unwrap();
    let active = data
        .join("topics/events/0")
        .join(seglog::format::names::log_file_name(60));
    let before = fs::read(&active).unwrap();
    for dir in [file.clone(), file.join("sub")] {
        let (code, _, err) = run(
            &[
                "recover",
                "--backup-dir",
                dir.to_str().unwrap(),
                data.to_str().unwrap(),
            ],
            &data,
        );
        assert_eq!(code, 64, "{err}");
        assert!(
            err.contains("--backup-dir") && err.contains("is not a directory"),
            "{err}"
        );
        assert!(!err.contains("cut_tail"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert_eq!(fs::read(&active).unwrap(), before, "nothing was cut");
}

/// reindex --json counts the entries of the indexes it keeps, not 0.
#[test]
fn reindex_json_counts_kept_entries() {
    let data = fixture("clean");
    let (code, out, err) = run(
        &["reindex", "--check", "--json", data.to_str().unwrap()],
        &data,
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    for s in v["segments"].as_array().unwrap() {
        assert_eq!(s["action"], "keep", "{s}");
        let path = data.join(s["path"].as_str().unwrap());
        let want = fs::metadata(&path).unwrap().len() / 16;
        assert_eq!(s["entries"], want, "{s}");
    }
}

/// Every table is ASCII (compact drew UTF-8).
#[test]
fn tables_are_ascii() {
    let data = fixture("clean");
    let d = data.to_str().unwrap();
    for args in [
        &["compact", "--dry-run", d][..],
        &["verify", d],
        &["reindex", "--check", d],
    ] {
        let (_, out, err) = run(args, &data);
        assert!(out.is_ascii(), "{args:?}: {out}{err}");
    }
}

/// A FIFO named like an index: the tools end (naming the file) instead of blocking
/// on its read.
#[test]
fn a_fifo_named_like_an_index_blocks_no_tool() {
    use seglog::format::names::index_file_name;
    let (_tmp, data) = copy("clean");
    let d = data.to_str().unwrap();
    let rel = format!("{P}{}", index_file_name(30));
    let path = data.join(&rel);
    fs::remove_file(&path).unwrap();
    assert!(StdCommand::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap()
        .success());
    for args in [
        &["verify", d][..],
        &["verify", "--quick", d],
        &["dump", "--from", "35", d],
        &["recover", "--dry-run", d],
        &["reindex", "--check", d],
    ] {
        let (code, out, err) =
            run_with_deadline(args, &data).unwrap_or_else(|| panic!("{args:?} blocked"));
        assert_ne!(code, 0, "{args:?}: {out} {err}");
        assert!(
            err.contains(&rel) || out.contains(&rel),
            "{args:?} does not name {rel}: {out} {err}"
        );
    }
}

/// An index that is a directory is a bad index of its segment, not an I/O error that
/// stops the tools: `verify --json` reports it and checks every other partition,
/// and `dump` reads the segment from its log.
#[test]
fn an_index_that_is_a_directory_is_reported_and_the_rest_checked() {
    let (_tmp, data) = copy("clean");
    let index = data.join(P).join("00000000000000000000.index");
    fs::remove_file(&index).unwrap();
    fs::create_dir(&index).unwrap();
    let d = data.to_str().unwrap();
    let (code, out, err) = run(&["verify", "--json", d], &data);
    assert_eq!(code, 1, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(
        out.contains("the index is a directory, not a regular file"),
        "{v:#}"
    );
    assert!(
        out.contains("move it away, then `seglog reindex` rebuilds the index"),
        "the hint says what to do with a directory: {v:#}"
    );
    assert!(
        out.contains("users"),
        "the other topic is checked too: {v:#}"
    );
    let (code, _, err) = run(&["dump", d], &data);
    assert_eq!(code, 1, "{err}");
    // recover and reindex never remove a directory: they stop, naming it and what to do.
    for cmd in ["recover", "reindex"] {
        let (code, _, err) = run(&[cmd, d], &data);
        assert_eq!(code, 74, "{cmd}: {err}");
        assert!(
            err.contains("00000000000000000000.index")
                && err.contains("the index is a directory; move it away and run again")
                && err.lines().count() == 1,
            "{cmd}: {err}"
        );
        assert!(index.is_dir(), "{cmd} left the directory alone");
    }
}

/// A device (or a FIFO, a socket) given as the path is refused as no seglog data
/// (64), like any other file that is not a `.log`; before, the tools tried to list it
/// as a directory and failed with an I/O error (74, "Not a directory").
#[test]
fn a_device_is_no_seglog_data() {
    let tmp = tempfile::tempdir().unwrap();
    for cmd in ["verify", "dump", "recover", "reindex", "compact"] {
        let (code, out, err) = run(&[cmd, "/dev/null"], tmp.path());
        assert_eq!(code, 64, "{cmd}: {err}");
        assert_eq!(out, "", "{cmd}");
        assert_eq!(
            err.trim_end(),
            "seglog: /dev/null is not a seglog data directory, topic directory, partition directory or .log file",
            "{cmd}"
        );
    }
}

#[test]
fn a_spare_file_is_named_a_spare_not_a_non_log_file() {
    let (_tmp, data) = copy("clean");
    let spares = data.join("spares");
    fs::create_dir_all(&spares).unwrap();
    let spare = spares.join("spare-00000000000000000001.log");
    fs::write(&spare, vec![0u8; 64]).unwrap();
    let path = spare.to_str().unwrap();
    for args in [vec!["verify", path], vec!["dump", path]] {
        let (code, out, err) = run(&args, &data);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert_eq!(out, "");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("is a spare of the segment pool"), "{err}");
        assert!(!err.contains("is not a seglog"), "{err}");
    }
}

#[test]
fn data_directories_that_are_files_or_lack_a_parent_are_refused_creating_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let file = root.join("afile");
    fs::write(&file, b"x").unwrap();
    let missing = root.join("no/such");
    let f = file.to_str().unwrap();
    let m = missing.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["serve", "--listen", "127.0.0.1:0", "--data-dir", f],
            "afile is not a directory",
        ),
        (
            &["bench", "produce", "--records", "1", "--embedded", f],
            "afile is not a directory",
        ),
        (
            &["bench", "produce", "--records", "1", "--embedded", m],
            "the parent directory",
        ),
        (
            &["serve", "--listen", "127.0.0.1:0", "--data-dir", m],
            "the parent directory",
        ),
    ];
    for (args, said) in cases {
        let (code, _, err) = run(args, root);
        assert_eq!(code, 74, "{args:?}: {err}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("seglog:")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {err}");
        assert!(errors[0].contains(said), "{args:?}: {err}");
        if said.starts_with("the parent") {
            assert!(
                errors[0].contains(root.join("no").to_str().unwrap()),
                "{err}"
            );
        }
        assert!(!root.join("no").exists(), "{args:?} created a parent");
        assert_eq!(fs::read(&file).unwrap(), b"x");
    }
}

#[test]
fn a_log_level_that_is_no_level_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = data.to_str().unwrap();
    for level in ["infoo", "seglog", "info,seglog=loud"] {
        let args = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            d,
            "--log-level",
            level,
        ];
        let (code, _, err) = run(&args, tmp.path());
        assert_eq!(code, 64, "{level}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("--log-level"), "{err}");
        assert!(!data.exists(), "{level}: nothing created");
    }
}

#[test]
fn an_empty_seglog_broker_counts_as_unset() {
    let tmp = tempfile::tempdir().unwrap();
    // The default address is used: the command connects there (or fails to, 69
    // naming it), and never fails on the empty value (64).
    for args in [
        &["topics", "list", "--timeout", "1s"][..],
        &["bench", "produce", "--records", "1", "--timeout", "1s"],
    ] {
        let out = StdCommand::new(BIN)
            .args(args)
            .env("SEGLOG_BROKER", "")
            .current_dir(tmp.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(!err.contains("invalid value"), "{args:?}: {err}");
        assert!(
            err.contains("127.0.0.1:9494") || out.status.success(),
            "{args:?}: {err}"
        );
    }
}
