//! The read-only tools change no timestamp: `verify`, `dump` (human and `--json`),
//! `reindex --check`, `recover --dry-run` and `compact --dry-run` leave the access
//! time of every file and directory they read as it was. Every atime is first set
//! back before its mtime, so that a `relatime` mount (the default, and this test's
//! temporary directory's) would update it on any read or listing made without
//! `O_NOATIME`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD, UTIME_OMIT};
use seglog::engine::broker::{Broker, BrokerOptions, NewRecord};
use seglog::engine::groups::{GroupCoordinator, GroupOptions, OffsetCommit, TopicLookup};
use seglog::engine::producers::{
    Decision, PartitionEnd, ProducerTable, PRODUCER_ID_EXPIRATION_DEFAULT,
};
use seglog::engine::storage::io::RealStorage;
use seglog::format::schemas::{encode_schemas, SchemasDoc, SCHEMAS_FILE};
use seglog::format::topic::TopicConfig;

use crate::util::bin::run;
use crate::util::fs::{copy_tree, fixture};

/// 2001-09-09: older than any mtime or ctime in the tree.
const OLD_ATIME_SECS: i64 = 1_000_000_000;

struct Topics;
impl TopicLookup for Topics {
    fn partition_count(&self, topic: &str) -> Option<u32> {
        (topic == "t").then_some(2)
    }
}

/// A data directory written by the engine: two topics, segments with their indexes,
/// the producer journal, a group's file, `schemas.json`.
fn broker_data() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let b = Broker::open(tmp.path(), Arc::new(RealStorage), BrokerOptions::default()).unwrap();
    b.create_topic("t", 2, TopicConfig::default()).unwrap();
    b.create_topic("u", 1, TopicConfig::default()).unwrap();
    let records: Vec<NewRecord<'_>> = (0..20)
        .map(|_| NewRecord {
            key: Some(b"k"),
            value: b"value",
            timestamp_ms: 1_700_000_000_000,
        })
        .collect();
    b.produce("t", 0, &records).unwrap();
    b.produce("t", 1, &records[..3]).unwrap();
    b.produce("u", 0, &records[..7]).unwrap();
    drop(b);
    let (table, _) = ProducerTable::open(
        tmp.path(),
        Arc::new(RealStorage),
        PRODUCER_ID_EXPIRATION_DEFAULT,
        &|_, _| PartitionEnd::At(20),
    )
    .unwrap();
    let ((id, epoch), _) = table.init(None).unwrap();
    assert_eq!(
        table.check(id, epoch, "t", 0, 0, 5).unwrap(),
        Decision::Append
    );
    let mut done = table.accepted(id, epoch, "t", 0, 0, 5, 0, 4);
    done.try_recv().unwrap().unwrap();
    drop(table);
    let (groups, _) =
        GroupCoordinator::open(tmp.path(), Arc::new(RealStorage), GroupOptions::default()).unwrap();
    let commits = [OffsetCommit {
        partition: 1,
        offset: 2,
        metadata: String::new(),
    }];
    let mut done = groups
        .commit(&Topics, "g", -1, "", None, "t", &commits)
        .unwrap();
    done.try_recv().unwrap().unwrap();
    drop(groups);
    fs::write(
        tmp.path().join(SCHEMAS_FILE),
        encode_schemas(&SchemasDoc::default()),
    )
    .unwrap();
    tmp
}

/// Every file and directory below `dir`, and `dir` itself.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// Sets the atime of every path to [`OLD_ATIME_SECS`], leaving its mtime.
fn age(paths: &[PathBuf]) {
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: OLD_ATIME_SECS,
            tv_nsec: 0,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
    };
    for p in paths {
        utimensat(CWD, p, &times, AtFlags::SYMLINK_NOFOLLOW)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}

/// Each path's atime (seconds, nanoseconds), read with `lstat` (which changes none).
fn atimes(paths: &[PathBuf]) -> BTreeMap<PathBuf, (i64, i64)> {
    paths
        .iter()
        .map(|p| {
            let m = fs::symlink_metadata(p).unwrap();
            (p.clone(), (m.atime(), m.atime_nsec()))
        })
        .collect()
}

/// Runs each read-only command on `data` (a data directory), and each of `extra` (a
/// command whose last argument is a path relative to `data`), and asserts after each
/// that no atime in `data` changed.
fn assert_atimes_kept(data: &Path, extra: &[&[&str]]) {
    let paths = tree(data);
    let d = data.to_str().unwrap();
    let mut runs: Vec<Vec<String>> = Vec::new();
    let commands: [&[&str]; 7] = [
        &["verify"],
        &["verify", "--quick"],
        &["dump"],
        &["dump", "--json"],
        &["reindex", "--check"],
        &["recover", "--dry-run"],
        &["compact", "--dry-run"],
    ];
    for c in commands {
        let mut args: Vec<String> = c.iter().map(|s| (*s).to_owned()).collect();
        args.push(d.to_string());
        runs.push(args);
    }
    for c in extra {
        let (rel, args) = c.split_last().unwrap();
        let mut args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        args.push(data.join(rel).to_str().unwrap().to_string());
        runs.push(args);
    }
    for args in runs {
        age(&paths);
        let before = atimes(&paths);
        assert!(before.values().all(|&(s, _)| s == OLD_ATIME_SECS));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = run(&argv, data);
        // Damaged fixtures make the commands exit 1 or 2; a usage error is 64 or above.
        assert!(
            (0..64).contains(&code),
            "{args:?}: exit {code}\n{out}\n{err}"
        );
        let changed: Vec<String> = atimes(&paths)
            .into_iter()
            .filter(|(p, t)| before.get(p) != Some(t))
            .map(|(p, _)| p.strip_prefix(data).unwrap().display().to_string())
            .collect();
        assert!(
            changed.is_empty(),
            "`seglog {}` changed the atime of {changed:?}",
            args.join(" ")
        );
    }
}

#[test]
fn read_only_tools_keep_the_atimes_of_an_engine_written_data_directory() {
    let data = broker_data();
    assert_atimes_kept(
        data.path(),
        &[
            &["verify", "topics/t"],
            &["verify", "topics/t/0"],
            &["verify", "topics/t/0/00000000000000000000.log"],
            &["dump", "--json", "topics/t/0/00000000000000000000.log"],
            &["reindex", "--check", "topics/u/0"],
            &["dump", "producers.journal"],
            &["dump", "--json", "groups"],
            &["dump", "groups/g.json"],
        ],
    );
}

#[test]
fn read_only_tools_keep_the_atimes_of_every_fixture() {
    let mut names: Vec<String> = fs::read_dir(fixture(""))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir() && e.file_name() != "vectors")
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() > 10, "{names:?}");
    for name in names {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join(&name);
        copy_tree(&fixture(&name), &data);
        assert_atimes_kept(&data, &[]);
    }
}
