//! A replica whose data partition lost records it had applied takes them back, on
//! three real `seglog serve` processes: a follower is stopped, a byte inside an early
//! record of its data partition's active segment is flipped (disk damage), and it is
//! started again. Its start cuts the damage and every record behind it (FORMAT's
//! recovery rule 4), though its checkpoint says they were applied; the node then
//! takes them back before its replica takes part in the group again: from a peer
//! when its Raft log was purged past their entries (a topic that snapshots), from
//! its own Raft log otherwise (a compacted topic, whose log is kept whole).
//! A third topic loses its checkpoint file on the same node while its Raft log is
//! purged: the node takes a peer's checkpoint in its place. Afterwards every replica
//! holds every acknowledged record at its offset, and `seglog verify` is clean on
//! every node's directory.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::path::Path;
use std::time::Duration;

use seglog::engine::net::cluster_client::ClusterClient;
use seglog::format::wire::WireRecord;

use crate::cli_metrics::{get, parse, value};
use crate::util::bin::run;
use crate::util::cluster::Cluster;
use crate::util::fs::flip_in_place;
use crate::util::replica_check::{check, Acked, Violation};

/// Snapshots often, so this topic's Raft logs are purged past the damaged records'
/// entries: they come back from a peer.
const FETCHED: &str = "fetched";
/// Compacted, so its Raft logs are never purged: they come back from the log.
const REAPPLIED: &str = "reapplied";
/// Snapshots often too; the victim's checkpoint of it is removed.
const LOST: &str = "lost";
const SNAPSHOT_ENTRIES: u64 = 16;
/// The record whose bytes are damaged.
const DAMAGED: u64 = 10;

fn produce(c: &mut ClusterClient, topic: &str, i: u64, acked: &mut Vec<Acked>) {
    let key = format!("k{i}");
    let value = format!("{topic}-{i}");
    let records = [WireRecord {
        timestamp_ms: -1,
        key: Some(key.as_bytes()),
        value: value.as_bytes(),
    }];
    let (base, last) = c.produce(topic, 0, &records).unwrap();
    assert_eq!(base, last);
    if topic == FETCHED || topic == LOST {
        acked.push(Acked {
            producer: 1,
            value: value.into_bytes(),
            partition: u32::from(topic == LOST),
            offset: base,
        });
    }
}

/// Flips a bit inside record `offset` of the partition in `dir` (one segment).
fn damage(dir: &Path, offset: u64) {
    let (code, out, err) = run(&["dump", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(code, 0, "{out}{err}");
    let pos = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["type"] == "record" && v["offset"] == offset)
        .and_then(|v| v["position"].as_u64())
        .expect("the record's position");
    let log = dir.join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[pos as usize + 20] ^= 0x08;
    std::fs::write(&log, bytes).unwrap();
}

fn purged_index(node_dir: &Path, topic: &str) -> Option<u64> {
    let path = node_dir
        .join("raft")
        .join(topic)
        .join("0")
        .join("raft.json");
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    state["purged"]["index"].as_u64()
}

#[test]
fn a_replica_whose_data_partition_lost_applied_records_takes_them_back() {
    let mut c = Cluster::start_with_args(3, |_| {
        vec![
            "--raft-snapshot-entries".to_string(),
            SNAPSHOT_ENTRIES.to_string(),
        ]
    });
    c.ok(&["topics", "create", FETCHED, "--replication-factor", "3"]);
    c.ok(&["topics", "create", LOST, "--replication-factor", "3"]);
    c.ok(&[
        "topics",
        "create",
        REAPPLIED,
        "--replication-factor",
        "3",
        "--config",
        "cleanup_policy=compact",
    ]);
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let mut client = ClusterClient::new(addrs, Duration::from_secs(10), None, None);
    let mut acked = Vec::new();
    let before = 4 * SNAPSHOT_ENTRIES;
    for i in 0..before {
        for topic in [FETCHED, REAPPLIED, LOST] {
            produce(&mut client, topic, i, &mut acked);
        }
    }
    for topic in [FETCHED, REAPPLIED, LOST] {
        c.wait_caught_up(topic, 1);
    }
    let leader = c.wait_leader(FETCHED, 0);
    let victim = c.ids().into_iter().find(|&i| i != leader).unwrap();
    c.stop(victim);
    let dir = c.node(victim).dir.clone();
    assert!(
        purged_index(&dir, FETCHED).is_some_and(|p| p > DAMAGED + 1),
        "{FETCHED}'s Raft log is purged past the damaged record's entry"
    );
    assert_eq!(
        purged_index(&dir, REAPPLIED),
        None,
        "a compacted topic's log is kept whole"
    );
    for topic in [FETCHED, REAPPLIED] {
        damage(&dir.join("topics").join(topic).join("0"), DAMAGED);
    }
    assert!(purged_index(&dir, LOST).is_some());
    std::fs::remove_file(dir.join("topics").join(LOST).join("applied-0.json")).unwrap();
    let last = before - 1;
    let (code, out, err) = run(&["verify", dir.to_str().unwrap()], c.root());
    assert_eq!(code, 1, "{out}{err}");
    let said = format!(
        "this node applied the records up to offset {last}, so offsets {DAMAGED}..={last} are \
         committed entries' records"
    );
    assert_eq!(out.matches(&said).count(), 2, "{out}");
    // `recover` cuts the damage (as the node's start would); verify then names what
    // is missing, and that the node takes it back.
    let (code, out, err) = run(&["recover", dir.to_str().unwrap()], c.root());
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&["verify", dir.to_str().unwrap()], c.root());
    assert_eq!(code, 0, "{out}{err}");
    let missing = format!(
        "applied_records_missing in topics/{FETCHED}/0/00000000000000000000.log (offset \
         {DAMAGED}): the data partition ends at offset {DAMAGED}, but this node applied the \
         records up to offset {last}"
    );
    assert!(out.contains(&missing), "{out}");
    assert!(
        out.contains("the node takes them again from its Raft log or its peers when it starts"),
        "{out}"
    );

    c.restart(victim);
    for i in before..before + 5 {
        for topic in [FETCHED, REAPPLIED, LOST] {
            produce(&mut client, topic, i, &mut acked);
        }
    }
    for topic in [FETCHED, REAPPLIED, LOST] {
        c.wait_caught_up(topic, 1);
    }
    let log = c.node(victim).stderr();
    assert!(
        log.contains("took a peer's checkpoint in place of the lost one"),
        "{log}"
    );
    assert!(
        log.contains("took records the data partition lacked from a peer"),
        "{log}"
    );
    assert!(
        log.contains("is applied again from the start (only the missing records are written)"),
        "{log}"
    );
    drop(client);
    c.stop_all();

    // The lost checkpoint's topic is dumped as partition 1 of the same check.
    let replicas: Vec<_> = c
        .ids()
        .into_iter()
        .map(|id| {
            let mut r = c.dump(id, FETCHED, 1);
            let lost = c.dump(id, LOST, 1);
            r.records.extend(lost.records.into_iter().map(|mut d| {
                d.partition = 1;
                d
            }));
            r
        })
        .collect();
    assert_eq!(check(&acked, &replicas), Vec::<Violation>::new());
    for r in &replicas {
        assert_eq!(r.records.len(), acked.len(), "node {}", r.node);
    }
    // The compacted topic: the same records on every node, the victim's included.
    let reapplied: Vec<_> = c
        .ids()
        .into_iter()
        .map(|id| c.dump(id, REAPPLIED, 1).records)
        .collect();
    assert_eq!(reapplied[0].len() as u64, before + 5);
    assert!(reapplied.iter().all(|r| *r == reapplied[0]));
    for id in c.ids() {
        let dir = c.node(id).dir.clone();
        let (code, out, err) = run(&["verify", dir.to_str().unwrap()], c.root());
        assert_eq!(code, 0, "verify of node {id}: {out}{err}");
        assert!(!out.contains("applied_records_missing"), "node {id}: {out}");
    }
}

/// A replica whose Raft state file is lost (its vote with it) is not opened, since a
/// node that forgot its vote could vote twice in one term; the node's other replicas
/// open, and the group goes on with the two others.
#[test]
fn a_replica_whose_vote_is_lost_is_not_opened_and_the_nodes_others_are() {
    const VOTELESS: &str = "voteless";
    const KEPT: &str = "kept";
    let mut c = Cluster::prepare(3);
    let mut metrics = Vec::new();
    for node in &mut c.nodes {
        let addr = format!("127.0.0.1:{}", crate::util::port::free_port());
        node.args = vec!["--metrics-listen".into(), addr.clone()];
        metrics.push((node.id, addr));
    }
    c.start_all();
    for topic in [VOTELESS, KEPT] {
        c.ok(&["topics", "create", topic, "--replication-factor", "3"]);
    }
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let mut client = ClusterClient::new(addrs, Duration::from_secs(10), None, None);
    let mut acked = Vec::new();
    for i in 0..5 {
        for topic in [VOTELESS, KEPT] {
            produce(&mut client, topic, i, &mut acked);
        }
    }
    c.wait_caught_up(VOTELESS, 1);
    c.wait_caught_up(KEPT, 1);
    let leader = c.wait_leader(VOTELESS, 0);
    let victim = c.ids().into_iter().find(|&i| i != leader).unwrap();
    c.stop(victim);
    let dir = c.node(victim).dir.clone();
    let state = dir.join("raft").join(VOTELESS).join("0").join("raft.json");
    std::fs::remove_file(&state).unwrap();
    let (code, out, err) = run(&["verify", dir.to_str().unwrap()], c.root());
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("its vote is lost"), "{out}");

    c.restart(victim);
    for i in 5..10 {
        for topic in [VOTELESS, KEPT] {
            produce(&mut client, topic, i, &mut acked);
        }
    }
    c.wait_caught_up(KEPT, 1);
    let log = c.node(victim).stderr();
    assert!(
        log.contains(&format!(
            "{}: missing, while this replica holds entry",
            state.display()
        )) && log.contains("so this replica is not opened"),
        "{log}"
    );
    assert!(!state.exists(), "nothing wrote a fresh state file");
    let closed = |id: u64| {
        let addr = &metrics.iter().find(|(n, _)| *n == id).unwrap().1;
        let (code, text) = get(addr, "/metrics");
        assert_eq!(code, 200, "{text}");
        value(&parse(&text), "seglog_closed_replicas", &[])
    };
    assert_eq!(closed(victim), 1.0);
    assert_eq!(closed(leader), 0.0);
    let out = c.run_on(victim, &["cluster", "status"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("{VOTELESS}/0: this node's replica is not open: "))
            && text.contains("its vote is lost"),
        "{text}"
    );
}

/// The position of record `offset` in the partition directory `dir`, and its
/// segment file (`dump --json` of a stopped node).
fn record_at(dir: &Path, offset: u64) -> (std::path::PathBuf, u64) {
    let (code, out, err) = run(&["dump", "--json", dir.to_str().unwrap()], dir);
    assert_eq!(code, 0, "{out}{err}");
    out.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["type"] == "record" && v["offset"] == offset)
        .map(|v| {
            let name = Path::new(v["path"].as_str().unwrap())
                .file_name()
                .unwrap()
                .to_owned();
            (dir.join(name), v["position"].as_u64().unwrap())
        })
        .expect("the record's position")
}

/// Produces `batches` batches of 40 records to partition 0 of `topic`, record `i`
/// holding `value(i)`; returns them as acknowledged.
fn produce_acked(
    client: &mut ClusterClient,
    topic: &str,
    batches: u64,
    value: impl Fn(u64) -> String,
) -> Vec<Acked> {
    let mut acked = Vec::new();
    for batch in 0..batches {
        let values: Vec<String> = (batch * 40..(batch + 1) * 40).map(&value).collect();
        let records: Vec<WireRecord> = values
            .iter()
            .map(|v| WireRecord {
                timestamp_ms: -1,
                key: None,
                value: v.as_bytes(),
            })
            .collect();
        let (base, last) = client.produce(topic, 0, &records).unwrap();
        assert_eq!(last - base + 1, 40);
        for (i, v) in values.into_iter().enumerate() {
            acked.push(Acked {
                producer: 1,
                value: v.into_bytes(),
                partition: 0,
                offset: base + i as u64,
            });
        }
    }
    acked
}

/// Damage inside a replica's sealed segment is mended with a peer's records: found
/// by the node's startup check (a follower's segment damaged while it was down), and
/// found by a consumer's fetch (the leader's segment damaged while it runs, where
/// the startup check would not look: between the first and the last index entry),
/// which waits for the mend and gets the records.
/// Afterwards the segments read whole, every replica holds every acknowledged record
/// at its offset, and `verify` is clean on every node.
#[test]
fn a_damaged_sealed_segment_is_mended_from_a_peer() {
    const SEALED: &str = "sealed";
    // Index entries every 4 KiB: the startup check reads a segment's first record
    // and what follows its last entry.
    let mut c = Cluster::start(3);
    c.ok(&[
        "topics",
        "create",
        SEALED,
        "--replication-factor",
        "3",
        "--config",
        "segment_bytes=16384",
    ]);
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let mut client = ClusterClient::new(addrs, Duration::from_secs(10), None, None);
    let value = |i: u64| format!("{SEALED}-{i:05}-{}", "x".repeat(40));
    let acked = produce_acked(&mut client, SEALED, 30, value);
    c.wait_caught_up(SEALED, 1);
    let leader = c.wait_leader(SEALED, 0);
    let victim = c.ids().into_iter().find(|&i| i != leader).unwrap();
    c.stop(victim);
    let dirs: Vec<(u64, std::path::PathBuf)> =
        c.nodes.iter().map(|n| (n.id, n.dir.clone())).collect();
    let part = |id: u64| {
        let dir = &dirs.iter().find(|(n, _)| *n == id).unwrap().1;
        dir.join("topics").join(SEALED).join("0")
    };
    let victim_dir = c.node(victim).dir.clone();
    // The victim's first segment loses its last record, which the startup check reads.
    let second = {
        let listing: Vec<String> = std::fs::read_dir(part(victim))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log"))
            .collect();
        let mut bases: Vec<u64> = listing
            .iter()
            .map(|n| n.trim_end_matches(".log").parse().unwrap())
            .collect();
        bases.sort_unstable();
        assert!(bases.len() >= 3, "several sealed segments: {bases:?}");
        bases[1]
    };
    let tail = second - 1;
    let (seg0, pos) = record_at(&part(victim), tail);
    flip_in_place(&seg0, pos + 20, 0x08);
    // And its second segment is lost (its `.log` gone, its `.index` left).
    let lost_log = part(victim).join(format!("{second:020}.log"));
    let lost_bytes = std::fs::read(&lost_log).unwrap();
    std::fs::remove_file(&lost_log).unwrap();
    let (code, out, err) = run(&["verify", victim_dir.to_str().unwrap()], c.root());
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains(&format!(".log at byte {} (offset {tail})", pos)),
        "{out}"
    );
    assert!(out.contains("lost_segment"), "{out}");
    assert!(
        out.contains("the node mends this segment with a peer's copy of the records"),
        "{out}"
    );
    c.restart(victim);
    let mended = "mended a damaged or lost sealed segment with a peer's records";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while c.node(victim).stderr().matches(mended).count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            c.node(victim).stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    assert_eq!(
        std::fs::read(&lost_log).unwrap(),
        lost_bytes,
        "written again"
    );

    // The leader's first segment is damaged while it runs, at a record the startup
    // check trusts unread. The segments are the same bytes on every node.
    let leader = c.wait_leader(SEALED, 0);
    let peer = c.ids().into_iter().find(|&i| i != leader).unwrap();
    let first = std::fs::read(part(peer).join(seg0.file_name().unwrap())).unwrap();
    let leader_seg = part(leader).join(seg0.file_name().unwrap());
    assert_eq!(std::fs::read(&leader_seg).unwrap(), first);
    let hidden = 10;
    let (_, pos) = record_at(&part(victim), hidden);
    flip_in_place(&leader_seg, pos + 20, 0x08);
    // The fetch that meets the damage waits for the mend and gets the records.
    let got = client
        .fetch(SEALED, 0, hidden, 1 << 16, Duration::ZERO)
        .unwrap_or_else(|e| panic!("{e}\n{}", c.node(leader).stderr()));
    assert!(c.node(leader).stderr().contains(mended));
    assert_eq!(got.records[0].offset, hidden);
    assert_eq!(got.records[0].value, value(hidden).into_bytes());
    assert_eq!(
        std::fs::read(&leader_seg).unwrap(),
        first,
        "the same bytes again"
    );
    drop(client);
    c.stop_all();
    c.assert_every_replica_holds(SEALED, 1, &acked);
}

/// Damage that appears inside a follower's sealed segment while the node runs,
/// between two index entries (where the startup check does not look) and where no
/// reader goes, is found by the scrub (`--scrub-interval 1s`) and mended with a
/// peer's records: the segment is the same bytes as the leader's again. Then a
/// segment whose two files are both gone (only the offsets missing between its
/// neighbours tell) is written again at the node's next start.
#[test]
fn the_scrub_finds_and_mends_latent_damage_in_a_replica() {
    const LATENT: &str = "latent";
    let mut c = Cluster::start_with_args(3, |_| vec!["--scrub-interval".into(), "1s".into()]);
    c.ok(&[
        "topics",
        "create",
        LATENT,
        "--replication-factor",
        "3",
        "--config",
        "segment_bytes=16384",
    ]);
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let mut client = ClusterClient::new(addrs, Duration::from_secs(10), None, None);
    let acked = produce_acked(&mut client, LATENT, 20, |i| {
        format!("{LATENT}-{i:05}-{}", "y".repeat(40))
    });
    drop(client);
    c.wait_caught_up(LATENT, 1);
    let leader = c.wait_leader(LATENT, 0);
    let victim = c.ids().into_iter().find(|&i| i != leader).unwrap();
    let dirs: Vec<(u64, std::path::PathBuf)> =
        c.nodes.iter().map(|n| (n.id, n.dir.clone())).collect();
    let part = |id: u64| {
        let dir = &dirs.iter().find(|(n, _)| *n == id).unwrap().1;
        dir.join("topics").join(LATENT).join("0")
    };
    let first = format!("{:020}.log", 0);
    let original = std::fs::read(part(leader).join(&first)).unwrap();
    let victim_seg = part(victim).join(&first);
    assert_eq!(std::fs::read(&victim_seg).unwrap(), original);
    let (_, pos) = record_at(&part(victim), 10);
    flip_in_place(&victim_seg, pos + 20, 0x08);
    let mended = "mended a damaged or lost sealed segment with a peer's records";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let err = c.node(victim).stderr();
        if err.contains(mended) && std::fs::read(&victim_seg).unwrap() == original {
            assert!(
                err.contains("scrub: ") && err.contains("unreadable from offset 10"),
                "{err}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{err}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Both files of a segment in the middle gone while the node was down: no index
    // is left to name them, only the offsets missing between its neighbours.
    c.stop(victim);
    let mut bases: Vec<u64> = std::fs::read_dir(part(victim))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".log").map(|b| b.parse().unwrap()))
        .collect();
    bases.sort_unstable();
    assert!(bases.len() >= 4, "{bases:?}");
    let gone = part(victim).join(format!("{:020}.log", bases[1]));
    let gone_bytes = std::fs::read(&gone).unwrap();
    std::fs::remove_file(&gone).unwrap();
    std::fs::remove_file(gone.with_extension("index")).unwrap();
    let (code, out, err) = run(&["verify", c.node(victim).dir.to_str().unwrap()], c.root());
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("segments_do_not_join"), "{out}");
    assert!(
        out.contains("the node writes the missing offsets again from a peer's copy"),
        "{out}"
    );
    c.restart(victim);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::fs::read(&gone).ok().as_ref() != Some(&gone_bytes) {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            c.node(victim).stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.stop_all();
    let (code, out, err) = run(&["verify", c.node(victim).dir.to_str().unwrap()], c.root());
    assert_eq!(code, 0, "{out}{err}");
    c.assert_every_replica_holds(LATENT, 1, &acked);
}
