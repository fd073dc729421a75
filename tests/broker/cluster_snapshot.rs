//! Snapshots and the Raft-log purge on three real `seglog serve` processes with a
//! small snapshot interval: a follower stopped while the leader snapshots and purges
//! its log past the follower's last entry catches up from a snapshot when it comes
//! back; every replica then holds the same offset → record mapping, and `seglog
//! verify` is clean on every node's data directory, purged Raft logs included.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::path::Path;
use std::time::{Duration, Instant};

use seglog::engine::net::cluster_client::ClusterClient;
use seglog::format::wire::WireRecord;

use crate::util::bin::run;
use crate::util::cluster::Cluster;
use crate::util::replica_check::{check, Acked, Violation};
use crate::util::serve::PATIENCE;

const TOPIC: &str = "snap";
/// Applied entries between two snapshots (the Raft log keeps half of it below one).
const SNAPSHOT_ENTRIES: u64 = 16;

/// The purged index of a group's Raft log, as its `raft.json` says.
fn purged_index(dir: &Path) -> Option<u64> {
    let path = dir.join("raft").join(TOPIC).join("0").join("raft.json");
    let bytes = std::fs::read(path).ok()?;
    let state: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    state["purged"]["index"].as_u64()
}

/// Produces one record, recording its acknowledged offset.
fn produce(c: &mut ClusterClient, value: String, acked: &mut Vec<Acked>) {
    let records = [WireRecord {
        timestamp_ms: -1,
        key: None,
        value: value.as_bytes(),
    }];
    let (base, last) = c.produce(TOPIC, 0, &records).unwrap();
    assert_eq!(base, last);
    acked.push(Acked {
        producer: 1,
        value: value.into_bytes(),
        partition: 0,
        offset: base,
    });
}

#[test]
fn a_follower_behind_the_purged_log_catches_up_from_a_snapshot() {
    let mut c = Cluster::start_with_args(3, |_| {
        vec![
            "--raft-snapshot-entries".to_string(),
            SNAPSHOT_ENTRIES.to_string(),
        ]
    });
    c.ok(&["topics", "create", TOPIC, "--replication-factor", "3"]);
    let leader = c.wait_leader(TOPIC, 0);
    let follower = c.ids().into_iter().find(|&i| i != leader).unwrap();
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let mut client = ClusterClient::new(addrs, Duration::from_secs(10), None, None);
    let mut acked = Vec::new();
    for i in 0..5 {
        produce(&mut client, format!("before-{i}"), &mut acked);
    }
    c.wait_caught_up(TOPIC, 1);

    c.stop(follower);
    // Enough entries that the leader snapshots several times and purges its log
    // past everything the stopped follower holds.
    let leader_dir = c.node(leader).dir.clone();
    let began = Instant::now();
    let mut i = 0;
    while purged_index(&leader_dir).is_none_or(|p| p < 4 * SNAPSHOT_ENTRIES) {
        for _ in 0..SNAPSHOT_ENTRIES {
            produce(&mut client, format!("during-{i}"), &mut acked);
            i += 1;
        }
        assert!(
            began.elapsed() < PATIENCE,
            "the leader never purged its Raft log: {:?}",
            purged_index(&leader_dir)
        );
    }
    assert_eq!(
        purged_index(&c.node(follower).dir),
        None,
        "the follower had purged nothing before it stopped"
    );

    c.restart(follower);
    c.wait_caught_up(TOPIC, 1);
    // The follower's log was moved past a snapshot (an install purges it up to the
    // snapshot), not replayed entry by entry.
    let followers_purge = purged_index(&c.node(follower).dir);
    assert!(
        followers_purge.is_some_and(|p| p >= 4 * SNAPSHOT_ENTRIES - SNAPSHOT_ENTRIES),
        "the follower did not install a snapshot: purged {followers_purge:?}"
    );
    for i in 0..5 {
        produce(&mut client, format!("after-{i}"), &mut acked);
    }
    c.wait_caught_up(TOPIC, 1);
    drop(client);
    c.stop_all();

    let replicas: Vec<_> = c.ids().into_iter().map(|id| c.dump(id, TOPIC, 1)).collect();
    assert_eq!(check(&acked, &replicas), Vec::<Violation>::new());
    for r in &replicas {
        assert_eq!(r.records.len(), acked.len(), "node {}", r.node);
    }
    for id in c.ids() {
        let dir = c.node(id).dir.clone();
        let d = dir.to_str().unwrap();
        let (code, out, err) = run(&["verify", d], c.root());
        assert_eq!(code, 0, "verify of node {id}: {out}{err}");
    }
    // Nothing left of the transfer on the follower.
    let staged = c
        .node(follower)
        .dir
        .join("raft")
        .join(TOPIC)
        .join("0")
        .join("snapshot.part");
    assert!(!staged.exists(), "{}", staged.display());
}
