//! Topic metadata damage (docs/FORMAT.md, Data directory) through the real binary:
//! `verify`, `recover --dry-run`, `recover` and `recover --rebuild-topic-json` on the
//! committed fixtures, leftover temporary files of atomic replaces, and paths that are
//! not data directories.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::bin::run;
use crate::util::fs::{copy_tree, files, fixture};

/// The fixtures of this file (the generator's `META_NAMES`).
pub const FIXTURES: &[&str] = &crate::make_fixtures::META_NAMES;

fn copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join(name);
    copy_tree(&fixture(name), &data);
    (tmp, data)
}

fn json(args: &[&str], data: &Path) -> (i32, Value) {
    let mut all = args.to_vec();
    all.push(data.to_str().unwrap());
    let (code, out, err) = run(&all, data.parent().unwrap());
    let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    (code, v)
}

/// (fixture, [(kind, path)]) of the topic problems `verify` reports.
const EXPECTED: &[(&str, &[(&str, &str)])] = &[
    (
        "topic-json-missing",
        &[("topic_json_missing", "topics/events/topic.json")],
    ),
    (
        "topic-json-truncated",
        &[("topic_json_unreadable", "topics/events/topic.json")],
    ),
    (
        "topic-too-few-partitions",
        &[
            ("partition_outside_count", "topics/events/2"),
            ("partition_outside_count", "topics/events/3"),
        ],
    ),
    (
        "topic-too-many-partitions",
        &[
            ("partition_dir_missing", "topics/events/2"),
            ("partition_dir_missing", "topics/events/3"),
        ],
    ),
];

fn events_files(data: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    files(&data.join("topics/events"))
}

#[test]
fn verify_and_recover_report_the_topic_and_leave_its_files() {
    assert_eq!(EXPECTED.len(), FIXTURES.len());
    for (name, want) in EXPECTED {
        let (_tmp, data) = copy(name);
        let before = events_files(&data);
        let (code, v) = json(&["verify", "--json"], &data);
        assert_eq!(code, 2, "{name}: verify exit {v:#}");
        assert_eq!(v["severity"], "corrupt", "{name}");
        let got: Vec<(String, String)> = v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                assert_eq!(p["topic"], "events", "{name}: {p}");
                assert_eq!(p["severity"], "corrupt", "{name}: {p}");
                (
                    p["kind"].as_str().unwrap().to_string(),
                    p["path"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, p)| (k.to_string(), p.to_string()))
            .collect();
        assert_eq!(got, want, "{name}: problems");
        // The other topic is checked in full, and clean.
        let parts = v["partitions"].as_array().unwrap();
        assert_eq!(parts.len(), 1, "{name}: {v:#}");
        assert_eq!(parts[0]["topic"], "users");
        assert_eq!(parts[0]["severity"], "clean");

        let (code, v) = json(&["recover", "--dry-run", "--json"], &data);
        assert_eq!(code, 2, "{name}: recover --dry-run {v:#}");
        assert_eq!(v["severity_after"], "corrupt", "{name}");
        assert_eq!(v["offline_topics"].as_array().unwrap().len(), want.len());
        assert!(v["actions"].as_array().unwrap().is_empty(), "{name}: {v:#}");

        let (code, v) = json(&["recover", "--json"], &data);
        assert_eq!(code, 2, "{name}: recover {v:#}");
        assert_eq!(v["severity_after"], "corrupt", "{name}");
        let offline = v["offline_topics"].as_array().unwrap();
        assert_eq!(offline.len(), want.len(), "{name}: {v:#}");
        assert!(offline.iter().all(|p| p["topic"] == "events"));
        assert_eq!(
            events_files(&data),
            before,
            "{name}: files of events changed"
        );
    }
}

#[test]
fn a_truncated_topic_json_of_a_topic_path_is_reported_too() {
    let (_tmp, data) = copy("topic-json-truncated");
    let (code, v) = json(&["verify", "--json"], &data.join("topics/events"));
    assert_eq!(code, 2, "{v:#}");
    assert_eq!(v["problems"][0]["kind"], "topic_json_unreadable");
    let (code, v) = json(&["verify", "--json"], &data.join("topics/users"));
    assert_eq!(code, 0, "{v:#}");
}

#[test]
fn rebuild_topic_json_takes_the_count_on_disk() {
    for (name, partitions) in [
        ("topic-json-missing", 2),
        ("topic-json-truncated", 2),
        ("topic-too-few-partitions", 4),
        ("topic-too-many-partitions", 2),
    ] {
        let (_tmp, data) = copy(name);
        let (code, v) = json(
            &[
                "recover",
                "--dry-run",
                "--json",
                "--rebuild-topic-json",
                "events",
            ],
            &data,
        );
        assert_eq!(code, 2, "{name}: dry run {v:#}");
        assert_eq!(v["rebuild_topic_json"]["partitions"], partitions, "{name}");
        assert_eq!(v["rebuild_topic_json"]["done"], false);
        let (code, v) = json(
            &["recover", "--json", "--rebuild-topic-json", "events"],
            &data,
        );
        assert_eq!(code, 0, "{name}: recover {v:#}");
        assert_eq!(v["rebuild_topic_json"]["partitions"], partitions, "{name}");
        assert_eq!(v["rebuild_topic_json"]["config"], "default");
        let text = fs::read_to_string(data.join("topics/events/topic.json")).unwrap();
        let meta: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(meta["partitions"], partitions, "{name}: {text}");
        let leftovers: Vec<_> = fs::read_dir(data.join("topics/events"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let (code, v) = json(&["verify", "--json"], &data);
        assert_eq!(code, 0, "{name}: verify after the rebuild {v:#}");
    }
}

#[test]
fn rebuild_topic_json_of_an_unknown_topic_is_a_usage_error() {
    let (_tmp, data) = copy("topic-json-missing");
    let (code, _, err) = run(
        &[
            "recover",
            "--rebuild-topic-json",
            "nope",
            data.to_str().unwrap(),
        ],
        &data,
    );
    assert_eq!(code, 64, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn leftover_atomic_replace_temp_files_are_repairable_and_removed() {
    let (_tmp, data) = copy("clean");
    // FORMAT's leftovers are `*.tmp-*` (what the broker writes now); the hidden
    // `.<name>.<pid>.<seq>.tmp` of earlier versions is still recognised.
    let planted = [
        ".groups.json.4242.8.tmp",
        "schemas.json.tmp-4242-9",
        "topics/events/.topic.json.4242.7.tmp",
        "topics/events/topic.json.tmp-99",
    ];
    for p in planted {
        fs::write(data.join(p), b"{\"partitions\": 2").unwrap();
    }
    let (code, v) = json(&["verify", "--json"], &data);
    assert_eq!(code, 1, "{v:#}");
    let kinds: Vec<(&str, &str)> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap(), p["path"].as_str().unwrap()))
        .collect();
    let want: Vec<(&str, &str)> = planted.iter().map(|p| ("leftover_temp_file", *p)).collect();
    assert_eq!(kinds, want);
    let (code, v) = json(&["recover", "--dry-run", "--json"], &data);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["actions"].as_array().unwrap().len(), 4, "{v:#}");
    assert!(planted.iter().all(|p| data.join(p).exists()));
    let (code, v) = json(&["recover", "--json"], &data);
    assert_eq!(code, 0, "{v:#}");
    assert!(v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["kind"] == "remove_temp_file"));
    assert!(planted.iter().all(|p| !data.join(p).exists()));
    let (code, _) = json(&["verify", "--json"], &data);
    assert_eq!(code, 0);
}

#[test]
fn a_temp_file_in_an_offline_topic_is_left_in_place() {
    let (_tmp, data) = copy("topic-json-missing");
    let tmp = data.join("topics/events/.topic.json.4242.7.tmp");
    fs::write(&tmp, b"{\"partitions\": 2}").unwrap();
    let (code, v) = json(&["recover", "--json"], &data);
    assert_eq!(code, 2, "{v:#}");
    assert!(
        tmp.exists(),
        "the temp file of an offline topic was removed"
    );
}

#[test]
fn a_path_that_is_not_a_data_directory_is_64_and_nothing_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let other = tmp.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("notes.txt"), b"hello").unwrap();
    // Names that only look temporary are someone else's files too: nothing removed.
    let temps = tmp.path().join("temps");
    fs::create_dir(&temps).unwrap();
    fs::write(temps.join("notes.tmp"), b"important").unwrap();
    fs::write(temps.join("backup.tar.gz.tmp-old"), b"x").unwrap();
    for dir in [&empty, &other, &temps] {
        let before = files(dir);
        for args in [
            &["verify"][..],
            &["verify", "--json"],
            &["recover"],
            &["recover", "--dry-run"],
            &["recover", "--json"],
        ] {
            let mut all = args.to_vec();
            all.push(dir.to_str().unwrap());
            let (code, out, err) = run(&all, tmp.path());
            assert_eq!(code, 64, "{args:?} {}: {out} {err}", dir.display());
            assert!(err.contains("not a seglog data directory"), "{err}");
            assert_eq!(files(dir), before, "{args:?} created something");
        }
    }
}

/// `dump` of a data directory with a damaged topic names the damage (a problem line,
/// the verify exit code, and the canonical end line's severity) instead of leaving
/// the topic out in silence.
#[test]
fn dump_names_the_topic_it_cannot_read() {
    for (name, want) in EXPECTED {
        let (_tmp, data) = copy(name);
        let (code, out, _) = run(
            &["dump", "--canonical", data.to_str().unwrap()],
            data.parent().unwrap(),
        );
        assert_eq!(code, 2, "{name}: {out}");
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let problems: Vec<(String, String)> = lines
            .iter()
            .filter(|v| v["type"] == "problem")
            .map(|v| {
                assert_eq!(v["topic"], "events", "{name}: {v}");
                (
                    v["kind"].as_str().unwrap().to_string(),
                    v["path"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, p)| (k.to_string(), p.to_string()))
            .collect();
        assert_eq!(problems, want, "{name}");
        assert_eq!(lines.last().unwrap()["severity"], "corrupt", "{name}");
        let (code, _, err) = run(&["dump", data.to_str().unwrap()], data.parent().unwrap());
        assert_eq!(code, 2, "{name}");
        assert!(err.contains("topics/events"), "{name}: {err}");
    }
}
