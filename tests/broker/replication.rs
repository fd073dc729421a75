//! Replication on three real `seglog serve` processes: an RF-3 topic, produce through
//! the leader-following client, SIGKILL of the leader, produce again on the new
//! leader, and every acknowledged record found at its offset on both survivors; a
//! follower's NOT_LEADER naming the leader; a node whose cluster id differs refused.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use seglog::engine::broker::{Broker, BrokerOptions};
use seglog::engine::net::client::{Client, ClientError};
use seglog::engine::net::cluster_client::ClusterClient;
use seglog::engine::storage::io::RealStorage;
use seglog::format::record::decode_record;
use seglog::format::wire::{parse_not_leader, ErrorCode, PartitionBatch, WireRecord};

use crate::util::port::free_port;
use crate::util::serve::{Serve, PATIENCE};

const TOPIC: &str = "rep";
const TIMEOUT: Duration = Duration::from_secs(10);

/// Free loopback addresses for the nodes' `--raft-listen` (outside the ephemeral
/// range, so no connection of another test takes one before the node binds it).
fn free_addrs(n: usize) -> Vec<String> {
    (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect()
}

fn start_node(dir: &Path, id: usize, raft: &[String]) -> Serve {
    let peers: Vec<String> = raft
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect();
    let id = id.to_string();
    let peers = peers.join(",");
    Serve::start_with(
        dir,
        &[
            "--node-id",
            &id,
            "--raft-listen",
            &raft[id.parse::<usize>().unwrap() - 1],
            "--peers",
            &peers,
        ],
    )
}

fn status(addr: &str) -> serde_json::Value {
    let mut c = Client::connect(addr, TIMEOUT).unwrap();
    serde_json::from_str(&c.cluster_status().unwrap()).unwrap()
}

/// Waits until `addr` names a leader of the partition; returns its node id.
fn leader_seen_by(addr: &str) -> u64 {
    let began = Instant::now();
    loop {
        let s = status(addr);
        let leader = s["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["topic"] == TOPIC)
            .and_then(|p| p["leader"].as_u64());
        if let Some(l) = leader {
            return l;
        }
        assert!(began.elapsed() < PATIENCE, "no leader: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn produce(c: &mut ClusterClient, value: &str, acked: &mut BTreeMap<u64, String>) {
    let records = [WireRecord {
        timestamp_ms: -1,
        key: None,
        value: value.as_bytes(),
    }];
    let (base, last) = c.produce(TOPIC, 0, &records).unwrap();
    assert_eq!(base, last);
    assert!(
        acked.insert(base, value.to_string()).is_none(),
        "offset {base} twice"
    );
}

/// Every record of partition 0 of a stopped node's data directory, by offset.
fn records_on_disk(dir: &Path) -> BTreeMap<u64, String> {
    let broker = Broker::open(dir, Arc::new(RealStorage), BrokerOptions::default()).unwrap();
    let mut out = BTreeMap::new();
    let mut offset = 0;
    loop {
        let f = broker
            .fetch(TOPIC, 0, offset, 1 << 20, Duration::ZERO)
            .unwrap();
        let mut got = false;
        for chunk in &f.chunks {
            let mut pos = 0;
            while let Some(rest) = chunk.bytes.get(pos..).filter(|r| !r.is_empty()) {
                let r = decode_record(rest, pos as u64, chunk.generation).unwrap();
                pos += r.encoded_len;
                if r.offset >= offset {
                    out.insert(r.offset, String::from_utf8(r.value.to_vec()).unwrap());
                    offset = r.offset + 1;
                    got = true;
                }
            }
        }
        if !got {
            break;
        }
    }
    broker.shutdown().unwrap();
    out
}

#[test]
fn rf3_survives_the_leaders_kill_with_every_acknowledged_record() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let raft = free_addrs(3);
    let mut nodes: Vec<Option<Serve>> = (0..3)
        .map(|i| Some(start_node(dirs[i].path(), i + 1, &raft)))
        .collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| n.as_ref().unwrap().addr.clone())
        .collect();
    let out =
        nodes[1]
            .as_ref()
            .unwrap()
            .ok(&["topics", "create", TOPIC, "--replication-factor", "3"]);
    assert!(out.contains("created topic rep"), "{out}");

    let mut client = ClusterClient::new(addrs.clone(), TIMEOUT, None, None);
    let mut acked = BTreeMap::new();
    for i in 0..20 {
        produce(&mut client, &format!("before-{i}"), &mut acked);
        // Read at once: the leader's answer holds the record just acknowledged (the
        // read waits for the data partition's fsync, which the apply does not).
        let (&offset, value) = acked.iter().next_back().unwrap();
        let f = client
            .fetch(TOPIC, 0, offset, 1 << 20, Duration::ZERO)
            .unwrap();
        assert!(f.end_offset > offset, "end {} after {offset}", f.end_offset);
        let got = f.records.first().map(|r| (r.offset, r.value.clone()));
        assert_eq!(
            got,
            Some((offset, value.as_bytes().to_vec())),
            "read after ack"
        );
    }
    let leader = leader_seen_by(&addrs[0]);
    let follower = (1..=3u64).find(|n| *n != leader).unwrap();

    // A follower refuses the produce, naming the leader's client address.
    let mut direct = Client::connect(&addrs[follower as usize - 1], TIMEOUT).unwrap();
    let batch = PartitionBatch {
        partition: 0,
        records: vec![WireRecord {
            timestamp_ms: -1,
            key: None,
            value: b"x",
        }],
    };
    let acks = direct.produce(TOPIC, vec![batch]).unwrap();
    let (code, message) = acks[0].result.clone().unwrap_err();
    assert_eq!(code, ErrorCode::NOT_LEADER, "{message}");
    let (named, named_addr) = parse_not_leader(&message).unwrap();
    assert_eq!(named, leader, "{message}");
    assert_eq!(named_addr, addrs[leader as usize - 1]);
    let fetched = direct.fetch(TOPIC, 0, 0, 1 << 20, Duration::ZERO);
    assert!(
        matches!(
            &fetched,
            Err(ClientError::Refused {
                code: ErrorCode::NOT_LEADER,
                ..
            })
        ),
        "{fetched:?}"
    );
    // A client that knows only the follower follows it to the leader.
    let mut via_follower = ClusterClient::new(
        vec![addrs[follower as usize - 1].clone()],
        TIMEOUT,
        None,
        None,
    );
    produce(&mut via_follower, "via-follower", &mut acked);

    nodes[leader as usize - 1].take().unwrap().kill9();
    for i in 0..20 {
        produce(&mut client, &format!("after-{i}"), &mut acked);
    }
    let survivors: Vec<usize> = (0..3).filter(|i| nodes[*i].is_some()).collect();
    let new_leader = leader_seen_by(&addrs[survivors[0]]);
    assert_ne!(new_leader, leader);
    // Both survivors apply everything committed: wait for the lag to reach 0.
    let began = Instant::now();
    loop {
        let s = status(&addrs[new_leader as usize - 1]);
        let p = s["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["topic"] == TOPIC)
            .cloned()
            .unwrap();
        let commit = p["commit_index"].as_u64().unwrap();
        let behind = survivors.iter().any(|i| {
            let a = status(&addrs[*i]);
            let q = a["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["topic"] == TOPIC)
                .cloned()
                .unwrap();
            q["applied_index"].as_u64().unwrap() < commit
        });
        if !behind {
            break;
        }
        assert!(began.elapsed() < PATIENCE, "survivors never caught up: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The new leader names the survivors in sync, and the killed node no more once
    // it has not answered for the lag window (10 s); a follower names none in its own
    // status (it learns them from the leader, for Metadata).
    let alive: Vec<u64> = survivors.iter().map(|i| *i as u64 + 1).collect();
    let topic_of = |s: &serde_json::Value| {
        s["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["topic"] == TOPIC)
            .cloned()
            .unwrap()
    };
    let began = Instant::now();
    loop {
        let p = topic_of(&status(&addrs[new_leader as usize - 1]));
        let mut in_sync: Vec<u64> = p["in_sync"]
            .as_array()
            .unwrap_or_else(|| panic!("{p}"))
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        in_sync.sort_unstable();
        if in_sync == alive {
            break;
        }
        assert!(in_sync.contains(&new_leader), "{p}");
        assert!(
            began.elapsed() < PATIENCE,
            "in sync {in_sync:?}, alive {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let other = alive.iter().find(|n| **n != new_leader).unwrap();
    let q = topic_of(&status(&addrs[*other as usize - 1]));
    assert!(q["in_sync"].is_null(), "{q}");
    for i in survivors {
        nodes[i].take().unwrap().stop();
        let on_disk = records_on_disk(dirs[i].path());
        for (offset, value) in &acked {
            assert_eq!(
                on_disk.get(offset),
                Some(value),
                "node {}: offset {offset}",
                i + 1
            );
        }
        assert_eq!(on_disk.len(), acked.len(), "node {}: {on_disk:?}", i + 1);
    }
}

#[test]
fn a_node_of_another_cluster_is_refused() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    // Each directory belongs to a cluster already (a node with a new directory takes
    // its peers' id, the founder included: see cluster_rejoin).
    std::fs::write(
        dirs[0].path().join("cluster.json"),
        br#"{"cluster_id":"fedcba9876543210"}"#,
    )
    .unwrap();
    std::fs::write(
        dirs[1].path().join("cluster.json"),
        br#"{"cluster_id":"0123456789abcdef"}"#,
    )
    .unwrap();
    let raft = free_addrs(2);
    let a = start_node(dirs[0].path(), 1, &raft);
    let b = start_node(dirs[1].path(), 2, &raft);
    assert!(
        a.stderr_gets("is not this node's cluster id"),
        "{}",
        a.stderr()
    );
    assert!(
        b.stderr_gets("is not this node's cluster id"),
        "{}",
        b.stderr()
    );
    let s = status(&a.addr);
    let other = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == 2)
        .cloned()
        .unwrap();
    assert_eq!(other["reachable"], false, "{s}");
    assert_eq!(other["alive"], false, "{s}");
    assert_eq!(other["addr"], other["raft_addr"], "{s}");
    let mine: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dirs[0].path().join("cluster.json")).unwrap())
            .unwrap();
    assert_eq!(mine["cluster_id"], "fedcba9876543210");
    // A replicated topic cannot be placed on a cluster that has one node reachable.
    let out = a.run(&["topics", "create", "t", "--replication-factor", "2"]);
    assert!(!out.status.success());
}
