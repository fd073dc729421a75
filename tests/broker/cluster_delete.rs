//! Deleting a replicated topic on three real `seglog serve` processes: with a node
//! down the delete stops there, says which node and leaves the asking node's replica,
//! so asking again completes it; afterwards no node holds the topic's data or Raft
//! logs, and a new topic of the same name starts empty, at offset 0.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::process::Command;
use std::time::Duration;

use seglog::engine::net::cluster_client::ClusterClient;
use seglog::format::wire::WireRecord;

use crate::util::bin::BIN;
use crate::util::cluster::Cluster;

const TOPIC: &str = "gone";

fn produce(c: &mut ClusterClient, value: &str) -> u64 {
    let records = [WireRecord {
        timestamp_ms: -1,
        key: None,
        value: value.as_bytes(),
    }];
    let (base, _) = c.produce(TOPIC, 0, &records).unwrap();
    base
}

/// `seglog topics delete TOPIC` through node `id` alone.
fn delete_through(c: &Cluster, id: u64) -> std::process::Output {
    Command::new(BIN)
        .args(["topics", "delete", TOPIC])
        .args(["--broker", &c.node(id).client_addr])
        .output()
        .unwrap()
}

#[test]
fn a_replicated_topic_is_deleted_on_every_node_and_its_name_starts_afresh() {
    let mut c = Cluster::start(3);
    c.ok(&["topics", "create", TOPIC, "--replication-factor", "3"]);
    c.wait_leader(TOPIC, 0);
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let mut client = ClusterClient::new(addrs, Duration::from_secs(10), None, None);
    for i in 0..3 {
        assert_eq!(produce(&mut client, &format!("old-{i}")), i);
    }
    c.wait_caught_up(TOPIC, 1);

    // Node 3 down: the delete through node 1 stops at it and names it; node 1, which
    // deletes its own replica last, still has the topic to ask again with.
    c.stop(3);
    let out = delete_through(&c, 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "deleted with node 3 down: {err}");
    assert!(err.contains("node 3"), "{err}");
    assert!(c.node(1).dir.join("topics").join(TOPIC).is_dir());
    c.restart(3);
    let out = delete_through(&c, 1);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in &c.nodes {
        assert!(!n.dir.join("topics").join(TOPIC).exists(), "node {}", n.id);
        assert!(!n.dir.join("raft").join(TOPIC).exists(), "node {}", n.id);
        let out = c.run_on(n.id, &["topics", "list"]).unwrap();
        let listed = String::from_utf8_lossy(&out.stdout);
        assert!(!listed.lines().any(|l| l.trim() == TOPIC), "{listed}");
    }
    // Each peer's log says who asked it to delete its replica; the node that was
    // asked by the client logs the delete of its own.
    for id in [2, 3] {
        let log = c.node(id).stderr();
        assert!(
            log.contains(&format!(
                "a peer asks to delete this node's replica of the topic node=1 topic={TOPIC}"
            )),
            "node {id}: {log}"
        );
        assert!(
            log.contains(&format!("topic deleted topic=\"{TOPIC}\"")),
            "node {id}: {log}"
        );
    }
    assert!(c
        .node(1)
        .stderr()
        .contains(&format!("topic deleted topic=\"{TOPIC}\"")));
    // Again: nothing left to delete.
    assert!(!delete_through(&c, 2).status.success());

    // The name again: a new group from an empty log.
    c.ok(&["topics", "create", TOPIC, "--replication-factor", "3"]);
    c.wait_leader(TOPIC, 0);
    assert_eq!(produce(&mut client, "new-0"), 0);
    let got = c.ok(&["consume", TOPIC, "--from", "earliest", "--count", "1"]);
    assert_eq!(got.trim(), "new-0");
    c.stop_all();
}
