//! The offline tools on a node's Raft logs (`DATA/raft/<topic>/<partition>/`, written
//! by the Raft log store itself): `verify` checks them with the topics, `dump` reads
//! their entries, and `recover` cuts a torn tail, after which every flushed entry is
//! still there.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::type_config::TypeConfigExt;
use openraft::{Entry, EntryPayload, LogId, Vote};

use seglog::engine::partition::LogStats;
use seglog::engine::replication::log_store::{
    EntryCodec, EntryCodecError, RaftLog, StoredLeaderId,
};
use seglog::engine::storage::io::RealStorage;

use crate::util::bin::seglog;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Payload(Vec<u8>);

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

impl EntryCodec for Payload {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0);
    }
    fn decode(bytes: &[u8]) -> Result<Self, EntryCodecError> {
        Ok(Payload(bytes.to_vec()))
    }
}

openraft::declare_raft_types!(
    pub Cfg:
        D = Payload,
        R = (),
);

const ENTRIES: u64 = 30;

fn entry(i: u64) -> Entry<StoredLeaderId, EntryPayload<Payload, u64, openraft::impls::BasicNode>> {
    let log_id = LogId::new(
        StoredLeaderId {
            term: 2,
            node_id: 1,
        },
        i,
    );
    let payload = if i == 0 {
        EntryPayload::Blank
    } else {
        EntryPayload::Normal(Payload(format!("entry-{i}").into_bytes()))
    };
    Entry { log_id, payload }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn open(dir: &Path) -> RaftLog<Cfg> {
    RaftLog::open(dir, Arc::new(RealStorage), Arc::new(LogStats::default())).unwrap()
}

/// Writes `ENTRIES` entries and a vote, waiting for every flushed callback.
fn write_log(dir: &Path) {
    runtime().block_on(async {
        let mut log = open(dir);
        let mut waits = Vec::new();
        for i in 0..ENTRIES {
            let (tx, rx) = Cfg::oneshot();
            log.append([entry(i)], IOFlushed::signal(tx)).await.unwrap();
            waits.push(rx);
        }
        for rx in waits {
            rx.await.unwrap().unwrap();
        }
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
    });
}

fn read_all(dir: &Path) -> Vec<String> {
    runtime().block_on(async {
        let mut log = open(dir);
        let entries = log.try_get_log_entries(0..).await.unwrap();
        entries.iter().map(ToString::to_string).collect()
    })
}

/// The newest segment file of a Raft log's directory.
fn newest_segment(log_dir: &Path) -> std::path::PathBuf {
    fs::read_dir(log_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap()
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = seglog().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verify_dump_and_recover_cover_the_raft_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    fs::create_dir_all(data.join("topics")).unwrap();
    let group = data.join("raft").join("t").join("0");
    write_log(&group);
    let before = read_all(&group);
    assert_eq!(before.len() as u64, ENTRIES);
    let d = data.to_str().unwrap();

    let (code, out, err) = run(&["verify", "--json", d]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["severity"], "clean", "{out}");
    let paths: Vec<String> = v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["path"].as_str().unwrap().to_string())
        .collect();
    assert!(
        paths.iter().any(|p| p.starts_with("raft/t/0/log/")),
        "the Raft log is checked: {paths:?}"
    );

    let log_dir = group.join("log");
    let (code, out, err) = run(&["dump", "--json", log_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let records: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["type"] == "record")
        .collect();
    assert_eq!(records.len() as u64, ENTRIES);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["offset"], i as u64, "index i is offset i");
    }

    // A torn tail: half a record past the last one.
    let active = newest_segment(&log_dir);
    let mut bytes = fs::read(&active).unwrap();
    bytes.extend_from_slice(&[0x00, 0x00, 0x01, 0x00, 0xde, 0xad, 0xbe, 0xef, 7, 7, 7]);
    fs::write(&active, &bytes).unwrap();
    let (code, out, err) = run(&["verify", d]);
    assert_ne!(code, 0, "a torn tail is found: {out}{err}");
    assert!(out.contains("raft/t/0"), "{out}");
    let (code, out, err) = run(&["recover", d]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&["verify", d]);
    assert_eq!(code, 0, "clean after recovery: {out}{err}");
    assert_eq!(read_all(&group), before, "every flushed entry survives");
}

/// The store itself runs the same recovery when it opens a log with a torn tail.
#[test]
fn open_cuts_a_torn_tail_and_keeps_every_flushed_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let group = tmp.path().join("raft").join("t").join("0");
    write_log(&group);
    let before = read_all(&group);
    let log_dir = group.join("log");
    let active = newest_segment(&log_dir);
    let mut bytes = fs::read(&active).unwrap();
    bytes.extend_from_slice(&[0x00, 0x00, 0x00, 0x40, 1, 2, 3]);
    fs::write(&active, &bytes).unwrap();
    assert_eq!(read_all(&group), before);
}

/// A Raft log damaged below the entries its node applied (`applied-P.json`): those
/// entries were committed on a majority, so `verify` and `recover` call the tail
/// damage rather than a write a crash tore, and name the entries.
#[test]
fn damage_below_the_applied_entries_is_named_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("clean");
    crate::util::fs::copy_tree(&crate::util::fs::fixture("clean"), &data);
    let topic = data.join("topics").join("users");
    fs::write(
        topic.join("replication.json"),
        br#"{"replication_factor":1,"replicas":[[1]]}"#,
    )
    .unwrap();
    let applied = |index: u64| {
        format!(
            r#"{{"last_applied":{{"leader_id":{{"term":2,"node_id":1}},"index":{index}}},"membership":{{"log_id":null,"membership":{{"configs":[[1]],"nodes":{{"1":{{"addr":"127.0.0.1:1"}}}}}}}},"next_offset":0,"clock_ms":0,"producers":{{}}}}"#
        )
    };
    let group = data.join("raft").join("users").join("0");
    write_log(&group);
    let log_dir = group.join("log");
    let active = newest_segment(&log_dir);
    let bytes = fs::read(&active).unwrap();
    // Entry 20's record: found by dumping the log.
    let (code, out, err) = run(&["dump", "--json", log_dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let pos20 = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["type"] == "record" && v["offset"] == 20)
        .and_then(|v| v["position"].as_u64())
        .expect("entry 20's position");
    let mut damaged = bytes.clone();
    damaged[pos20 as usize + 20] ^= 0x08;
    let d = data.to_str().unwrap();
    let said = "entries 20..=25 were committed on a majority of the group: this is damage, \
                not a crash, and the node's peers hold them";
    for (index, named) in [(25, true), (19, false)] {
        fs::write(topic.join("applied-0.json"), applied(index)).unwrap();
        fs::write(&active, &damaged).unwrap();
        let (code, out, err) = run(&["verify", d]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.contains("torn_tail"), "{out}");
        assert_eq!(out.contains(said), named, "applied {index}: {out}");
        assert!(
            out.contains("9 valid record(s), offsets 21..=29 follow it"),
            "{out}"
        );
        let (code, out, err) = run(&["recover", "--dry-run", d]);
        assert_eq!(code, 1, "{out}{err}");
        assert_eq!(out.contains(said), named, "applied {index}: {out}");
    }
    let (code, out, err) = run(&["recover", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(read_all(&group).len(), 20, "entries 0..=19 are left");
}
