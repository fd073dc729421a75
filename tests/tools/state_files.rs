//! The state files beside the topics through the tools: `dump` of
//! `producers.journal`, `producers.json` and `groups/<group>.json` (human, --json,
//! --canonical), `verify` of a torn journal tail (repairable, at the entry's byte
//! position) and of a corrupt entry (corrupt, at its position), `recover` cutting
//! the torn tail, a broken or leftover group file, and a group file's stored
//! membership: dumped member by member, and, when refused, a repairable problem that
//! `recover` repairs by rewriting the file without it.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use seglog::engine::broker::{Broker, BrokerOptions, NewRecord};
use seglog::engine::groups::{GroupCoordinator, GroupOptions, OffsetCommit, TopicLookup};
use seglog::engine::producers::{
    Decision, PartitionEnd, ProducerTable, PRODUCER_ID_EXPIRATION_DEFAULT,
};
use seglog::engine::storage::io::RealStorage;
use seglog::format::group::{
    decode_group_file, encode_group_file, GroupListener, StoredMember, StoredMembership,
    StoredProtocol, GROUP_FILE_VERSION, GROUP_ID_BYTES_MAX,
};
use seglog::format::producers::{
    ENTRY_FIXED_LEN, JOURNAL_BYTES_MAX, JOURNAL_HEADER_LEN, SNAPSHOT_BYTES_MAX,
};
use seglog::format::topic::TopicConfig;
use serde_json::Value;

use crate::util::bin::{json, json_lines, run};

struct Topics;
impl TopicLookup for Topics {
    fn partition_count(&self, topic: &str) -> Option<u32> {
        (topic == "t").then_some(4)
    }
}

/// A data directory (made by a broker) whose journal holds an init and two batches
/// of producer 1 on t/0 and whose group `g` committed t/1 at 7 and t/3 at 2.
/// `recover --json --backup-dir BACKUP_DIR DATA_DIR`, which must succeed: its output
/// and the output parsed.
fn recover_with_backup(data_dir: &str, dir: &Path, backup_dir: &Path) -> (String, Value) {
    let (code, out, err) = run(
        &[
            "recover",
            "--json",
            "--backup-dir",
            backup_dir.to_str().unwrap(),
            data_dir,
        ],
        dir,
    );
    assert_eq!(code, 0, "{out} {err}");
    let v = json(&out);
    (out, v)
}

fn data() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let b = Broker::open(tmp.path(), Arc::new(RealStorage), BrokerOptions::default()).unwrap();
    b.create_topic("t", 4, TopicConfig::default()).unwrap();
    let records: Vec<NewRecord<'_>> = (0..10)
        .map(|_| NewRecord {
            key: None,
            value: b"v",
            timestamp_ms: 1_700_000_000_000,
        })
        .collect();
    b.produce("t", 0, &records).unwrap();
    // A topic named like the groups directory stays a topic for dump.
    b.create_topic("groups", 1, TopicConfig::default()).unwrap();
    b.produce("groups", 0, &records[..2]).unwrap();
    drop(b);
    let (table, _) = ProducerTable::open(
        tmp.path(),
        Arc::new(RealStorage),
        PRODUCER_ID_EXPIRATION_DEFAULT,
        &|_, _| PartitionEnd::At(10),
    )
    .unwrap();
    let ((id, epoch), _) = table.init(None).unwrap();
    for (seq, base) in [(0, 0u64), (5, 5)] {
        assert_eq!(
            table.check(id, epoch, "t", 0, seq, 5).unwrap(),
            Decision::Append
        );
        let mut done = table.accepted(id, epoch, "t", 0, seq, 5, base, base + 4);
        done.try_recv().unwrap().unwrap();
    }
    let (groups, _) =
        GroupCoordinator::open(tmp.path(), Arc::new(RealStorage), GroupOptions::default()).unwrap();
    let commits = [
        OffsetCommit {
            partition: 3,
            offset: 2,
            metadata: String::new(),
        },
        OffsetCommit {
            partition: 1,
            offset: 7,
            metadata: "m".into(),
        },
    ];
    let mut done = groups
        .commit(&Topics, "g", -1, "", None, "t", &commits)
        .unwrap();
    done.try_recv().unwrap().unwrap();
    tmp
}

fn p(dir: &Path, rel: &str) -> String {
    dir.join(rel).to_str().unwrap().to_string()
}

/// Every object with a "kind" in a verify report: (kind, severity, path, position).
fn problems(v: &Value) -> Vec<(String, String, String, Option<u64>)> {
    let mut out = Vec::new();
    fn walk(v: &Value, out: &mut Vec<(String, String, String, Option<u64>)>) {
        match v {
            Value::Object(m) => {
                if let (Some(k), Some(s)) = (m.get("kind"), m.get("severity")) {
                    out.push((
                        k.as_str().unwrap_or("").to_string(),
                        s.as_str().unwrap_or("").to_string(),
                        m.get("path")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        m.get("position").and_then(Value::as_u64),
                    ));
                }
                m.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(v, &mut out);
    out
}

const ENTRY_INIT: usize = ENTRY_FIXED_LEN;
const ENTRY_T: usize = ENTRY_FIXED_LEN + 1;

#[test]
fn dump_shows_journal_entries_with_their_positions() {
    let d = data();
    let dir = d.path();
    let (code, out, err) = run(&["dump", "--json", &p(dir, "producers.journal")], dir);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3, "{out}");
    let first = JOURNAL_HEADER_LEN as u64;
    let second = first + ENTRY_INIT as u64;
    let third = second + ENTRY_T as u64;
    assert_eq!(lines[0]["type"], "journal_entry");
    assert_eq!(lines[0]["kind"], "init");
    assert_eq!(lines[0]["position"], first);
    assert_eq!(lines[0]["path"], "producers.journal");
    for (l, (pos, seq, off)) in lines[1..].iter().zip([(second, 0, 0), (third, 5, 5)]) {
        assert_eq!(l["kind"], "batch", "{l}");
        assert_eq!(l["position"], pos, "{l}");
        assert_eq!(l["producer_id"], lines[0]["producer_id"]);
        assert_eq!(
            (l["topic"].as_str(), l["partition"].as_u64()),
            (Some("t"), Some(0))
        );
        assert_eq!(l["base_sequence"], seq);
        assert_eq!(l["last_sequence"], seq + 4);
        assert_eq!(l["base_offset"], off);
        assert_eq!(l["last_offset"], off + 4);
    }
    let (code, human, _) = run(&["dump", &p(dir, "producers.journal")], dir);
    assert_eq!(code, 0);
    assert!(
        human.contains(&format!(
            "{second}  batch  producer 1 epoch 0  t/0  seq 0..4  offsets 0..4"
        )),
        "{human}"
    );
    // --canonical: byte-identical for a copy elsewhere, with an end line.
    let (code, canon, _) = run(&["dump", "--canonical", &p(dir, "producers.journal")], dir);
    assert_eq!(code, 0);
    let copy = tempfile::tempdir().unwrap();
    fs::copy(
        dir.join("producers.journal"),
        copy.path().join("producers.journal"),
    )
    .unwrap();
    let (_, canon2, _) = run(
        &["dump", "--canonical", &p(copy.path(), "producers.journal")],
        copy.path(),
    );
    assert_eq!(canon, canon2);
    let last = canon.lines().last().unwrap();
    assert_eq!(last, r#"{"type":"end","records":3,"severity":"clean"}"#);
    assert!(
        canon
            .lines()
            .next()
            .unwrap()
            .starts_with(r#"{"type":"journal_header","#),
        "{canon}"
    );
    // --limit caps the entries.
    let (_, limited, _) = run(
        &[
            "dump",
            "--json",
            "--limit",
            "1",
            &p(dir, "producers.journal"),
        ],
        dir,
    );
    assert_eq!(json_lines(&limited).len(), 1);
}

/// Where the journal's entries end: the broker writes zeros ahead of them.
fn entries_end(journal: &Path) -> u64 {
    let bytes = fs::read(journal).unwrap();
    let (_, good, problem) = seglog::format::producers::scan_journal(&bytes);
    assert_eq!(problem, None);
    assert!(bytes[good..].iter().all(|&b| b == 0));
    good as u64
}

#[test]
fn a_torn_journal_tail_is_repairable_and_recover_cuts_it() {
    let d = data();
    let dir = d.path();
    let journal = dir.join("producers.journal");
    let good = entries_end(&journal);
    assert!(fs::metadata(&journal).unwrap().len() > good, "a zero tail");
    let last = good - ENTRY_T as u64;
    // The last entry written only in part: its last bytes are still the zeros
    // written ahead of it.
    let mut bytes = fs::read(&journal).unwrap();
    bytes[good as usize - 3..good as usize].fill(0);
    fs::write(&journal, &bytes).unwrap();
    let (code, out, _) = run(&["verify", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(code, 1, "{out}");
    let found = problems(&json(&out));
    assert!(
        found.contains(&(
            "journal_torn_tail".into(),
            "repairable".into(),
            "producers.journal".into(),
            Some(last)
        )),
        "{found:?}"
    );
    // dump: the entries before it, then the problem at its position.
    let (code, out, _) = run(&["dump", "--json", &p(dir, "producers.journal")], dir);
    assert_eq!(code, 1, "{out}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[2]["type"], "problem");
    assert_eq!(lines[2]["kind"], "journal_torn_tail");
    assert_eq!(lines[2]["position"], last);
    let (code, _, err) = run(&["dump", &p(dir, "producers.journal")], dir);
    assert_eq!(code, 1);
    assert!(err.contains(&format!("at byte {last}")), "{err}");

    let (code, out, err) = run(&["recover", dir.to_str().unwrap()], dir);
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(fs::metadata(&journal).unwrap().len(), last);
    let (code, out, _) = run(&["verify", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(code, 0, "{out}");
}

/// The cut of a torn journal tail is part of recover's plan and report: the dry-run
/// lists it with its byte range (text and JSON) and changes nothing, and the real run
/// copies the cut bytes to --backup-dir before cutting them.
#[test]
fn recover_plans_reports_and_backs_up_the_journal_cut() {
    let d = data();
    let dir = d.path();
    let data_dir = dir.to_str().unwrap();
    let journal = dir.join("producers.journal");
    // The last entry cut short by the file's end (a journal without a zero tail).
    let good = entries_end(&journal);
    let last = good - ENTRY_T as u64;
    let torn = good - 3;
    fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(torn)
        .unwrap();
    let before = fs::read(&journal).unwrap();
    let is_cut = |a: &Value| {
        a["kind"] == "cut_journal"
            && a["path"] == "producers.journal"
            && a["from"] == last
            && a["to"] == torn
    };

    let (code, out, err) = run(&["recover", "--dry-run", data_dir], dir);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        out.contains(&format!(
            ".: would cut producers.journal bytes {last}..{torn} ({} bytes)",
            torn - last
        )),
        "{out}"
    );
    assert!(!out.contains("nothing to do"), "{out}");
    let (code, out, _) = run(&["recover", "--dry-run", "--json", data_dir], dir);
    assert_eq!(code, 1, "{out}");
    let v = json(&out);
    assert!(v["actions"].as_array().unwrap().iter().any(is_cut), "{out}");
    assert_eq!(v["severity_before"], "repairable", "{out}");
    assert_eq!(fs::read(&journal).unwrap(), before);

    let backup = tempfile::tempdir().unwrap();
    let backup_dir = backup.path().join("b");
    let (out, v) = recover_with_backup(data_dir, dir, &backup_dir);
    let actions = v["actions"].as_array().unwrap();
    let cut = actions.iter().find(|a| is_cut(a)).expect(&out);
    let copy = backup_dir.join(format!("producers.journal.bytes-{last}-{torn}"));
    assert_eq!(
        cut["backups"][0].as_str(),
        Some(copy.to_str().unwrap()),
        "{out}"
    );
    assert_eq!(fs::read(&copy).unwrap(), &before[last as usize..]);
    assert_eq!(fs::metadata(&journal).unwrap().len(), last);
    // Done: a second run finds nothing.
    let (code, out, _) = run(&["recover", data_dir], dir);
    assert_eq!((code, out.trim()), (0, "nothing to do"));
}

#[test]
fn a_corrupt_journal_entry_is_reported_with_its_position() {
    let d = data();
    let dir = d.path();
    let journal = dir.join("producers.journal");
    let mut bytes = fs::read(&journal).unwrap();
    let second = JOURNAL_HEADER_LEN + ENTRY_INIT;
    // A bit of the first batch's base_offset.
    bytes[second + ENTRY_T - 12] ^= 0x10;
    fs::write(&journal, &bytes).unwrap();
    let (code, out, _) = run(&["verify", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(code, 2, "{out}");
    let found = problems(&json(&out));
    assert!(
        found.contains(&(
            "journal_corrupt".into(),
            "corrupt".into(),
            "producers.journal".into(),
            Some(second as u64)
        )),
        "{found:?}"
    );
    let (code, out, _) = run(&["dump", "--canonical", &p(dir, "producers.journal")], dir);
    assert_eq!(code, 2, "{out}");
    let lines = json_lines(&out);
    // The header, the init entry, the problem, the end.
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[1]["kind"], "init");
    assert_eq!(lines[2]["type"], "problem");
    assert_eq!(lines[2]["position"], second as u64);
    assert_eq!(lines[3]["severity"], "corrupt");
    // recover leaves a corrupt entry for the broker's recovery, which reports it.
    let (_, out, err) = run(&["recover", dir.to_str().unwrap()], dir);
    assert_eq!(fs::read(&journal).unwrap(), bytes);
    // The summary names the state file's problem, and takes no topic offline.
    let said = format!("{out}{err}");
    assert!(!said.contains("topic(s) stay offline"), "{said}");
    assert!(
        said.contains("1 problem(s) in the files beside the topics need an operator"),
        "{said}"
    );
}

/// A journal or snapshot over its size limit (a sparse file) is never read into
/// memory: verify reports it as `journal_corrupt` naming the file and both sizes, a
/// dump of the file reports the same, and the broker refuses to start with it.
#[test]
fn an_oversized_journal_or_snapshot_is_refused_unread() {
    for (file, max) in [
        ("producers.journal", JOURNAL_BYTES_MAX),
        ("producers.json", SNAPSHOT_BYTES_MAX),
    ] {
        let d = data();
        let dir = d.path();
        let len = max as u64 + 1;
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(file))
            .unwrap()
            .set_len(len)
            .unwrap();
        let said = format!("{file}: file is {len} bytes, over the limit of {max}");
        let (code, out, _) = run(&["verify", "--json", dir.to_str().unwrap()], dir);
        assert_eq!(code, 2, "{out}");
        let v = json(&out);
        let found = problems(&v);
        assert!(
            found.contains(&(
                "journal_corrupt".into(),
                "corrupt".into(),
                file.into(),
                None
            )),
            "{found:?}"
        );
        assert!(out.contains(&said), "{out}");
        let (code, out, err) = run(&["dump", "--json", &p(dir, file)], dir);
        assert_eq!(code, 2, "{out} {err}");
        assert!(out.contains(&said), "{out}");
        let Err(e) = Broker::open(dir, Arc::new(RealStorage), BrokerOptions::default()) else {
            panic!("the broker starts with an oversized {file}");
        };
        assert!(e.to_string().contains(&said), "{e}");
    }
}

#[test]
fn dump_shows_the_snapshot() {
    let d = data();
    let dir = d.path();
    // A broker's shutdown writes the snapshot and cuts the journal.
    drop(Broker::open(dir, Arc::new(RealStorage), BrokerOptions::default()).unwrap());
    assert_eq!(
        fs::metadata(dir.join("producers.journal")).unwrap().len(),
        JOURNAL_HEADER_LEN as u64
    );
    let (code, out, err) = run(&["dump", "--json", &p(dir, "producers.json")], dir);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["type"], "snapshot");
    assert_eq!(lines[0]["producers"], 1);
    assert_eq!(lines[1]["type"], "producer");
    assert_eq!(lines[1]["epoch"], 0);
    let batches = lines[1]["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[1]["base_offset"], 5);
    let (code, human, _) = run(&["dump", &p(dir, "producers.json")], dir);
    assert_eq!(code, 0);
    assert!(human.contains("  t/0  seq 5..9  offsets 5..9"), "{human}");
    let (code, out, _) = run(&["dump", "--json", &p(dir, "producers.journal")], dir);
    assert_eq!((code, out.as_str()), (0, ""));
}

#[test]
fn dump_shows_group_files_and_their_problems() {
    let d = data();
    let dir = d.path();
    let (code, out, err) = run(&["dump", "--json", &p(dir, "groups/g.json")], dir);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0]["type"], "group");
    assert_eq!(lines[0]["group"], "g");
    assert_eq!(lines[0]["offsets"], 2);
    assert_eq!(lines[0]["path"], "groups/g.json");
    assert_eq!(
        (lines[1]["partition"].as_u64(), lines[1]["offset"].as_u64()),
        (Some(1), Some(7))
    );
    assert_eq!(lines[1]["metadata"], "m");
    assert_eq!(
        (lines[2]["partition"].as_u64(), lines[2]["offset"].as_u64()),
        (Some(3), Some(2))
    );
    let (code, out, _) = run(&["dump", "--json", &p(dir, "topics/groups")], dir);
    assert_eq!(code, 0, "{out}");
    let records = json_lines(&out);
    assert_eq!(records.len(), 2, "{out}");
    assert!(records.iter().all(|l| l["type"] == "record"), "{out}");
    let (_, human, _) = run(&["dump", &p(dir, "groups/g.json")], dir);
    assert!(human.contains("t/1  7  m  "), "{human}");
    let (code, canon, _) = run(&["dump", "--canonical", &p(dir, "groups")], dir);
    assert_eq!(code, 0);
    assert_eq!(
        canon.lines().last().unwrap(),
        r#"{"type":"end","records":2,"severity":"clean"}"#
    );

    // A broken group file beside it, and a leftover of a replace.
    fs::write(dir.join("groups/h.json"), b"{not json").unwrap();
    fs::write(dir.join("groups/.g.json.tmp-1"), b"{}").unwrap();
    let (code, out, _) = run(&["dump", "--json", &p(dir, "groups/h.json")], dir);
    assert_eq!(code, 2, "{out}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["kind"], "group_file_unreadable");
    assert_eq!(lines[0]["path"], "groups/h.json");
    let (code, out, _) = run(&["dump", "--json", &p(dir, "groups")], dir);
    assert_eq!(code, 2, "{out}");
    let kinds: Vec<String> = json_lines(&out)
        .iter()
        .map(|l| {
            l["kind"]
                .as_str()
                .unwrap_or(l["type"].as_str().unwrap())
                .to_string()
        })
        .collect();
    for want in ["leftover_temp_file", "group_file_unreadable", "offset"] {
        assert!(kinds.iter().any(|k| k == want), "{want}: {kinds:?}");
    }

    let (code, out, _) = run(&["verify", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(code, 2, "{out}");
    let found = problems(&json(&out));
    assert!(
        found
            .iter()
            .any(|f| f.0 == "group_file_unreadable" && f.1 == "corrupt" && f.2 == "groups/h.json"),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|f| f.0 == "leftover_temp_file" && f.2 == "groups/.g.json.tmp-1"),
        "{found:?}"
    );
    // recover removes the leftover and leaves the broken file for an operator.
    let (_, _, err) = run(&["recover", dir.to_str().unwrap()], dir);
    assert!(!dir.join("groups/.g.json.tmp-1").exists(), "{err}");
    assert!(dir.join("groups/h.json").exists());
    assert!(dir.join("groups/g.json").exists());
}

/// The problems of a `verify --json` report (not the report's own kind and severity).
fn verify_problems(out: &str) -> Vec<(String, String, String, Option<u64>)> {
    let mut found = problems(&json(out));
    found.retain(|f| f.0 != "data_dir");
    found
}

/// A member of the membership [`with_members`] stores.
fn member(id: &str, instance: Option<&str>, assignment: &[u8]) -> StoredMember {
    StoredMember {
        member_id: id.into(),
        instance_id: instance.map(Into::into),
        client_id: format!("client {id}"),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 45_000,
        rebalance_timeout_ms: 300_000,
        protocols: vec![
            StoredProtocol {
                name: "range".into(),
                metadata: vec![0, 1, 2],
            },
            StoredProtocol {
                name: "roundrobin".into(),
                metadata: vec![9; 5],
            },
        ],
        assignment: assignment.to_vec(),
    }
}

/// Stores in `groups/g.json` (the broker's, with its two offsets) a Stable
/// membership of two members, `a` (static, the leader) and `b`, edited by `edit`,
/// through the crate's encoder; returns the file's text.
fn with_members(dir: &Path, edit: impl FnOnce(&mut StoredMembership)) -> String {
    let path = dir.join("groups/g.json");
    let mut f = decode_group_file(&fs::read(&path).unwrap()).unwrap();
    let mut m = StoredMembership {
        protocol: "range".into(),
        leader: "a".into(),
        listener: Some(GroupListener::Kafka),
        members: vec![
            member("a", Some("i-a"), &[0, 1, 3]),
            member("b", None, &[7; 10]),
        ],
    };
    edit(&mut m);
    // As a Stable group's file: a generation, and never empty.
    f.generation = 1;
    f.protocol_type = "consumer".into();
    f.empty_since_ms = 0;
    f.version = GROUP_FILE_VERSION;
    f.membership = Some(m);
    let bytes = encode_group_file(&f);
    fs::write(&path, &bytes).unwrap();
    String::from_utf8(bytes).unwrap()
}

/// `dump` of a group file with a stored membership: the group line names the
/// protocol, the leader and the member count, then one line per member (its byte
/// strings as sizes), counted by --limit as the offsets are; `verify` finds the file
/// clean.
#[test]
fn dump_shows_a_stored_membership_member_by_member() {
    let d = data();
    let dir = d.path();
    let text = with_members(dir, |_| {});
    assert!(text.contains("\"AAED\""), "{text}");
    let (code, out, err) = run(&["dump", "--json", &p(dir, "groups/g.json")], dir);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(lines[0]["type"], "group");
    assert_eq!(
        (&lines[0]["members"], &lines[0]["offsets"]),
        (&Value::from(2), &Value::from(2)),
        "{out}"
    );
    assert_eq!(lines[0]["protocol"], "range");
    assert_eq!(lines[0]["leader"], "a");
    let a = &lines[1];
    assert_eq!(a["type"], "member", "{out}");
    assert_eq!(a["path"], "groups/g.json");
    assert_eq!(a["group"], "g");
    assert_eq!(a["member_id"], "a");
    assert_eq!(a["instance_id"], "i-a");
    assert_eq!(a["leader"], true);
    assert_eq!(a["client_id"], "client a");
    assert_eq!(a["client_host"], "/127.0.0.1");
    assert_eq!(a["session_timeout_ms"], 45_000);
    assert_eq!(a["rebalance_timeout_ms"], 300_000);
    assert_eq!(a["assignment_bytes"], 3);
    // The metadata of the chosen protocol, and every protocol offered.
    assert_eq!(a["metadata_bytes"], 3);
    assert_eq!(
        a["protocols"],
        serde_json::json!([
            {"name": "range", "metadata_bytes": 3},
            {"name": "roundrobin", "metadata_bytes": 5}
        ])
    );
    let b = &lines[2];
    assert_eq!(
        (&b["type"], &b["member_id"]),
        (&"member".into(), &"b".into())
    );
    assert_eq!(b["instance_id"], Value::Null);
    assert_eq!(b["leader"], false);
    assert_eq!(b["assignment_bytes"], 10);
    // Never the bytes themselves.
    assert!(!out.contains("AAED") && !out.contains("AAEC"), "{out}");
    assert_eq!(
        (&lines[3]["type"], &lines[4]["type"]),
        (&"offset".into(), &"offset".into())
    );

    // --limit counts the members, then the offsets.
    let (code, out, _) = run(
        &["dump", "--json", "--limit", "3", &p(dir, "groups/g.json")],
        dir,
    );
    assert_eq!(code, 0);
    let types: Vec<Value> = json_lines(&out).iter().map(|l| l["type"].clone()).collect();
    assert_eq!(types, ["group", "member", "member", "offset"], "{out}");
    let (code, out, _) = run(
        &["dump", "--json", "--limit", "1", &p(dir, "groups/g.json")],
        dir,
    );
    assert_eq!(code, 0);
    let types: Vec<Value> = json_lines(&out).iter().map(|l| l["type"].clone()).collect();
    assert_eq!(types, ["group", "member"], "{out}");
    let (code, canon, _) = run(&["dump", "--canonical", &p(dir, "groups")], dir);
    assert_eq!(code, 0);
    assert_eq!(
        canon.lines().last().unwrap(),
        r#"{"type":"end","records":4,"severity":"clean"}"#
    );

    let (code, human, err) = run(&["dump", &p(dir, "groups/g.json")], dir);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(
        lines[0], "# group g (groups/g.json): generation 1, protocol type \"consumer\", 2 offsets",
        "{human}"
    );
    assert_eq!(
        lines[1], "# membership: protocol \"range\", leader \"a\", 2 members",
        "{human}"
    );
    assert_eq!(
        lines[2],
        "member \"a\"  instance \"i-a\"  client \"client a\" \"/127.0.0.1\"  session 45000 ms  \
         rebalance 300000 ms  assignment 3 bytes  metadata 3 bytes  \
         protocols \"range\" 3 bytes, \"roundrobin\" 5 bytes",
        "{human}"
    );
    assert!(
        lines[3].starts_with("member \"b\"  client \"client b\" ")
            && lines[3].contains("  assignment 10 bytes  "),
        "{human}"
    );
    assert!(lines[4].starts_with("t/1  7  m  "), "{human}");

    for args in [&["verify"][..], &["verify", "--json"]] {
        let mut args = args.to_vec();
        args.push(dir.to_str().unwrap());
        let (code, out, err) = run(&args, dir);
        assert_eq!(code, 0, "{out} {err}");
    }
    let (_, out, _) = run(&["verify", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(json(&out)["severity"], "clean", "{out}");
    assert!(verify_problems(&out).is_empty(), "{out}");
}

/// A stored membership that fails its checks (here: an assignment that is not
/// base64) is a repairable problem of the group file: verify and dump report it and
/// exit 1, and recover rewrites the file without the membership, its offsets kept
/// (planned by --dry-run, which changes nothing; the old file backed up).
#[test]
fn a_refused_membership_is_repairable_and_recover_rewrites_the_file() {
    let d = data();
    let dir = d.path();
    let data_dir = dir.to_str().unwrap();
    let path = dir.join("groups/g.json");
    let offsets_before = decode_group_file(&fs::read(&path).unwrap())
        .unwrap()
        .offsets;
    let text = with_members(dir, |_| {});
    let bad = text.replacen("\"AAED\"", "\"A*ED\"", 1);
    assert_ne!(bad, text);
    fs::write(&path, &bad).unwrap();
    let want = (
        "group_membership_refused".to_string(),
        "repairable".to_string(),
        "groups/g.json".to_string(),
        None,
    );

    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 1, "{out}");
    assert_eq!(json(&out)["severity"], "repairable", "{out}");
    assert_eq!(verify_problems(&out), [want], "{out}");
    assert!(
        out.contains("member \\\"a\\\": assignment is not valid base64"),
        "{out}"
    );
    let (code, out, err) = run(&["verify", data_dir], dir);
    assert_eq!(code, 1, "{out} {err}");
    assert!(out.contains("group_membership_refused"), "{out}");
    assert!(out.contains("groups/g.json"), "{out}");

    // dump: the problem, then the group with its offsets and no members.
    for target in ["groups/g.json", "groups"] {
        let (code, out, _) = run(&["dump", "--json", &p(dir, target)], dir);
        assert_eq!(code, 1, "{target}: {out}");
        let lines = json_lines(&out);
        let types: Vec<Value> = lines.iter().map(|l| l["type"].clone()).collect();
        assert_eq!(types, ["problem", "group", "offset", "offset"], "{out}");
        assert_eq!(lines[0]["kind"], "group_membership_refused");
        assert_eq!(lines[0]["severity"], "repairable");
        assert_eq!(lines[0]["path"], "groups/g.json");
        assert_eq!(lines[1]["members"], 0);
        assert_eq!(lines[1]["protocol"], Value::Null);
    }
    let (code, out, err) = run(&["dump", &p(dir, "groups/g.json")], dir);
    assert_eq!(code, 1);
    assert!(err.contains("not valid base64"), "{err}");
    assert!(!out.contains("membership"), "{out}");

    // recover --dry-run plans the rewrite and changes nothing.
    let (code, out, err) = run(&["recover", "--dry-run", data_dir], dir);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        out.contains(&format!(
            ".: would rewrite groups/g.json ({} bytes) without its membership, keeping its 2 committed offset(s): membership of group g: member \"a\": assignment is not valid base64",
            bad.len()
        )),
        "{out}"
    );
    let (code, out, _) = run(&["recover", "--dry-run", "--json", data_dir], dir);
    assert_eq!(code, 1, "{out}");
    let v = json(&out);
    let is_rewrite = |a: &Value| {
        a["kind"] == "rewrite_group_file"
            && a["path"] == "groups/g.json"
            && a["group"] == "g"
            && a["offsets"] == 2
    };
    assert!(
        v["actions"].as_array().unwrap().iter().any(is_rewrite),
        "{out}"
    );
    assert_eq!(v["severity_before"], "repairable", "{out}");
    assert_eq!(fs::read_to_string(&path).unwrap(), bad);

    let backup = tempfile::tempdir().unwrap();
    let backup_dir = backup.path().join("b");
    let (out, v) = recover_with_backup(data_dir, dir, &backup_dir);
    let done = v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| is_rewrite(a))
        .expect(&out);
    let copy = backup_dir.join("groups/g.json");
    assert_eq!(
        done["backups"][0].as_str(),
        Some(copy.to_str().unwrap()),
        "{out}"
    );
    assert_eq!(fs::read_to_string(&copy).unwrap(), bad);
    let after = decode_group_file(&fs::read(&path).unwrap()).unwrap();
    assert_eq!((after.version, after.membership), (1, None));
    assert_eq!(after.offsets, offsets_before);
    assert_eq!(after.group, "g");
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 0, "{out}");
    assert!(verify_problems(&out).is_empty(), "{out}");
    // Done: a second run finds nothing.
    let (code, out, _) = run(&["recover", data_dir], dir);
    assert_eq!((code, out.trim()), (0, "nothing to do"));
}

/// A membership over a limit is refused as well, and the broker's startup (the same
/// recovery) rewrites the file: the group comes back with its offsets.
#[test]
fn a_membership_over_a_limit_is_refused_and_the_broker_startup_rewrites_it() {
    let d = data();
    let dir = d.path();
    let long = "c".repeat(GROUP_ID_BYTES_MAX + 1);
    with_members(dir, |m| m.members[1].client_id = long.clone());
    let (code, out, _) = run(&["verify", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        verify_problems(&out),
        [(
            "group_membership_refused".to_string(),
            "repairable".to_string(),
            "groups/g.json".to_string(),
            None
        )],
        "{out}"
    );
    assert!(
        out.contains("client id is 256 bytes, over the limit of 255"),
        "{out}"
    );
    let b = Broker::open(dir, Arc::new(RealStorage), BrokerOptions::default()).unwrap();
    drop(b);
    let f = decode_group_file(&fs::read(dir.join("groups/g.json")).unwrap()).unwrap();
    assert_eq!((f.membership, f.offsets.len()), (None, 2));
    let (code, out, _) = run(&["verify", dir.to_str().unwrap()], dir);
    assert_eq!(code, 0, "{out}");
}

/// `groups describe --data-dir` shows a group as a broker started on the directory
/// does: with a stored membership, Stable with its members and their partitions
/// (`groups list --data-dir` says Stable); with a membership the broker refuses,
/// Empty and no member, saying why on stderr. Online describe, on a broker started on
/// the same directory, prints the same.
#[test]
fn groups_describe_offline_shows_the_stored_membership_as_online() {
    use seglog::format::wire::groups::encode_topic_partitions;
    let d = data();
    let dir = d.path();
    let data_dir = dir.to_str().unwrap();
    with_members(dir, |m| {
        m.members[0].assignment = encode_topic_partitions(&[("t", vec![0, 1])]).unwrap();
        m.members[1].assignment = encode_topic_partitions(&[("t", vec![2, 3])]).unwrap();
    });
    let describe = ["groups", "describe", "g", "--data-dir", data_dir];
    let (code, out, err) = run(&[&describe[..], &["--json"]].concat(), dir);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    let offline = json(&out);
    assert_eq!(offline["state"], "Stable", "{out}");
    assert_eq!(offline["generation"], 1, "{out}");
    assert_eq!(
        offline["members"],
        serde_json::json!([
            {"member_id": "a", "client_id": "client a",
             "partitions": [{"topic": "t", "partition": 0}, {"topic": "t", "partition": 1}]},
            {"member_id": "b", "client_id": "client b",
             "partitions": [{"topic": "t", "partition": 2}, {"topic": "t", "partition": 3}]},
        ]),
        "{out}"
    );
    // Every assigned partition has a row, with its end offset.
    let ends: Vec<(u64, Value)> = offline["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["partition"].as_u64().unwrap(), o["end"].clone()))
        .collect();
    assert_eq!(
        ends,
        [(0, 10.into()), (1, 0.into()), (2, 0.into()), (3, 0.into())],
        "{out}"
    );
    let (code, offline_text, _) = run(&describe, dir);
    assert_eq!(code, 0);
    assert!(
        offline_text.starts_with("group g: Stable (generation 1), 2 members\n"),
        "{offline_text}"
    );
    let (code, out, _) = run(&["groups", "list", "--data-dir", data_dir, "--json"], dir);
    assert_eq!(code, 0);
    assert_eq!(
        json(&out),
        serde_json::json!({"groups": [{"group": "g", "state": "Stable"}]})
    );

    let server = crate::util::serve::Serve::start(dir);
    let online = json(&server.ok(&["groups", "describe", "g", "--json"]));
    let online_text = server.ok(&["groups", "describe", "g"]);
    server.stop();
    assert_eq!(online, offline);
    assert_eq!(online_text, offline_text);

    // A membership the broker refuses: loaded without members, offline as online.
    with_members(dir, |m| m.protocol = "nope".into());
    let (code, out, err) = run(&[&describe[..], &["--json"]].concat(), dir);
    assert_eq!(code, 0, "{err}");
    let offline = json(&out);
    assert_eq!(offline["state"], "Empty", "{out}");
    assert_eq!(offline["members"], serde_json::json!([]), "{out}");
    assert!(
        err.contains("groups/g.json: membership of group g: ")
            && err.contains("the broker loads the group without members, who rejoin"),
        "{err}"
    );
    let server = crate::util::serve::Serve::start(dir);
    let online = json(&server.ok(&["groups", "describe", "g", "--json"]));
    server.stop();
    assert_eq!(online, offline);
}

/// `api_keys.json` and `cluster.json` that do not read keep the broker from
/// starting, so `verify` reports them (corrupt) and `recover` leaves them for an
/// operator, naming them, instead of calling the directory clean.
#[test]
fn unreadable_keys_and_cluster_files_are_corrupt_and_left_for_an_operator() {
    let d = data();
    let dir = d.path();
    let data_dir = dir.to_str().unwrap();
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 0, "{out}");
    let keys = dir.join("api_keys.json");
    let cluster = dir.join("cluster.json");
    fs::write(&keys, b"{\"format\": 1, \"keys\": [").unwrap();
    // Over the 4096-byte limit: refused unread, like every file read from disk.
    fs::File::create(&cluster)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 2, "{out}");
    let found = verify_problems(&out);
    assert_eq!(
        found,
        vec![
            (
                "keys_json_unreadable".into(),
                "corrupt".into(),
                "api_keys.json".into(),
                None
            ),
            (
                "cluster_json_unreadable".into(),
                "corrupt".into(),
                "cluster.json".into(),
                None
            ),
        ],
        "{out}"
    );
    assert!(out.contains("larger than 4096 bytes"), "{out}");
    // A FIFO is refused without being opened (opening it would wait for a writer).
    let fifo = tempfile::tempdir().unwrap();
    let fifo_dir = fifo.path().to_str().unwrap();
    fs::create_dir(fifo.path().join("topics")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(fifo.path().join("cluster.json"))
        .status()
        .unwrap();
    assert!(made.success());
    for name in ["api_keys.json", "schemas.json"] {
        let made = std::process::Command::new("mkfifo")
            .arg(fifo.path().join(name))
            .status()
            .unwrap();
        assert!(made.success());
    }
    let (code, out, _) = run(&["verify", "--json", fifo_dir], fifo.path());
    assert_eq!(code, 2, "{out}");
    for name in ["cluster.json", "api_keys.json", "schemas.json"] {
        assert!(
            out.contains(&format!("{name} is unreadable: not a regular file")),
            "{name}: {out}"
        );
    }
    let (code, out, err) = run(&["recover", data_dir], dir);
    assert_eq!(code, 2, "{out} {err}");
    let said = format!("{out}{err}");
    assert!(!said.contains("stay offline"), "{said}");
    assert!(
        said.contains("(keys_json_unreadable, api_keys.json): left in place for an operator"),
        "{said}"
    );
    assert!(
        said.contains("2 problem(s) in the files beside the topics need an operator"),
        "{said}"
    );
    assert_eq!(
        fs::read(&keys).unwrap(),
        b"{\"format\": 1, \"keys\": [".to_vec()
    );
    assert_eq!(fs::metadata(&cluster).unwrap().len(), 1 << 30);
    let serve = |dir: &Path| {
        let o = std::process::Command::new(crate::util::bin::BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = serve(dir);
    assert_eq!(code, Some(74), "{err}");
    assert!(err.contains("cluster.json"), "{err}");
    fs::remove_file(&cluster).unwrap();
    let (code, err) = serve(dir);
    assert_eq!(code, Some(74), "{err}");
    assert!(err.contains("api_keys.json"), "{err}");
    fs::remove_file(&keys).unwrap();
    // A good cluster file is no problem; a keys file with a key the broker would
    // refuse (a bad glob) is one.
    fs::write(&cluster, b"{\"cluster_id\": \"c-1\", \"node_id\": 1}").unwrap();
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 0, "{out}");
    let (code, out, err) = run(
        &[
            "keys",
            "create",
            "--data-dir",
            data_dir,
            "--name",
            "a",
            "--role",
            "admin",
        ],
        dir,
    );
    assert_eq!(code, 0, "{out} {err}");
    let mut doc: Value = serde_json::from_slice(&fs::read(&keys).unwrap()).unwrap();
    doc["keys"][0]["role"] = "producer".into();
    doc["keys"][0]["topics"] = serde_json::json!(["["]);
    fs::write(&keys, serde_json::to_vec(&doc).unwrap()).unwrap();
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 2, "{out}");
    assert_eq!(verify_problems(&out)[0].0, "keys_json_unreadable", "{out}");
}

/// A replicated topic's Raft files that do not read (its placement, a partition's
/// checkpoint, a Raft log's state) keep the node from opening the topic's Raft
/// groups: `verify` reports each (`raft_state_unreadable`, corrupt, naming the file
/// and why) and `recover` leaves them in place. Before, `verify` called the
/// directory clean.
#[test]
fn unreadable_raft_state_files_are_corrupt() {
    let d = data();
    let dir = d.path();
    let data_dir = dir.to_str().unwrap();
    let topic = dir.join("topics/t");
    let placement = topic.join("replication.json");
    let checkpoint = topic.join("applied-2.json");
    let state = dir.join("raft/t/1/raft.json");
    fs::write(
        &placement,
        br#"{"replication_factor":1,"replicas":[[1],[1],[1],[1]]}"#,
    )
    .unwrap();
    fs::write(&checkpoint, br#"{"last_applied":null,"membership":{"log_id":null,"membership":{"configs":[[1]],"nodes":{"1":{"addr":"127.0.0.1:1"}}}},"next_offset":0,"clock_ms":0,"producers":{}}"#).unwrap();
    fs::create_dir_all(state.parent().unwrap()).unwrap();
    fs::write(
        &state,
        br#"{"version":1,"vote":null,"committed":null,"purged":null}"#,
    )
    .unwrap();
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 0, "{out}");
    for (file, bad, why) in [
        (
            &placement,
            &br#"{"replication_factor":1,"replicas":[[1]]}"#[..],
            "1 replica lists for 4 partitions",
        ),
        (&checkpoint, b"{", "EOF while parsing"),
        (&state, br#"{"version":1,"vote":7}"#, "invalid type"),
    ] {
        let good = fs::read(file).unwrap();
        fs::write(file, bad).unwrap();
        let (code, out, _) = run(&["verify", "--json", data_dir], dir);
        assert_eq!(code, 2, "{out}");
        let rel = file
            .strip_prefix(dir)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(
            verify_problems(&out),
            vec![(
                "raft_state_unreadable".into(),
                "corrupt".into(),
                rel.clone(),
                None
            )],
            "{out}"
        );
        assert!(out.contains(why), "{out}");
        let (code, out, err) = run(&["recover", data_dir], dir);
        assert_eq!(code, 2, "{out} {err}");
        assert!(
            format!("{out}{err}")
                .contains(&format!("(raft_state_unreadable, {rel}): left in place")),
            "{out}{err}"
        );
        assert_eq!(fs::read(file).unwrap(), bad);
        fs::write(file, good).unwrap();
    }
}

/// A Raft state file (`raft.json`) missing while the replica holds an entry of a term
/// past 0 means its vote is lost (the broker then does not open that group):
/// `raft_state_unreadable`, corrupt. Missing while only term 0 is known (a group
/// initialized before any vote) is no problem. A checkpoint missing while the Raft log
/// is purged is reported as information (`applied_checkpoint_missing`: the broker
/// takes a peer's at its start).
#[test]
fn a_lost_vote_and_a_lost_checkpoint_are_named() {
    let d = data();
    let dir = d.path();
    let data_dir = dir.to_str().unwrap();
    let topic = dir.join("topics/t");
    fs::write(
        topic.join("replication.json"),
        br#"{"replication_factor":1,"replicas":[[1],[1],[1],[1]]}"#,
    )
    .unwrap();
    let checkpoint = |term: u64| {
        format!(
            r#"{{"last_applied":{{"leader_id":{{"term":{term},"node_id":1}},"index":7}},"membership":{{"log_id":null,"membership":{{"configs":[[1]],"nodes":{{"1":{{"addr":"127.0.0.1:1"}}}}}}}},"next_offset":0,"clock_ms":0,"producers":{{}}}}"#
        )
    };
    fs::create_dir_all(dir.join("raft/t/1")).unwrap();
    fs::write(topic.join("applied-1.json"), checkpoint(0)).unwrap();
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 0, "term 0 only: {out}");
    assert_eq!(verify_problems(&out), Vec::new(), "{out}");

    fs::write(topic.join("applied-1.json"), checkpoint(3)).unwrap();
    let (code, out, _) = run(&["verify", data_dir], dir);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(
            "raft_state_unreadable in raft/t/1/raft.json: missing, while this replica holds \
             entry 7 of term 3: its vote is lost, and a node that forgot its vote could vote \
             twice in one term; this node cannot open partition 1's Raft group"
        ),
        "{out}"
    );
    fs::remove_file(topic.join("applied-1.json")).unwrap();

    fs::create_dir_all(dir.join("raft/t/2")).unwrap();
    fs::write(
        dir.join("raft/t/2/raft.json"),
        br#"{"version":1,"vote":null,"committed":null,"purged":{"leader_id":{"term":2,"node_id":1},"index":40}}"#,
    )
    .unwrap();
    let (code, out, _) = run(&["verify", "--json", data_dir], dir);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        verify_problems(&out),
        vec![(
            "applied_checkpoint_missing".into(),
            "info".into(),
            "topics/t/applied-2.json".into(),
            None
        )],
        "{out}"
    );
    assert!(out.contains("purged up to entry 40"), "{out}");
}
