//! A node whose data directory is lost and replaced by an empty one (a disk changed)
//! joins its cluster again and gets its replicas back, on three real `seglog serve`
//! processes: the cluster's founder (node 1, which makes the cluster id of a new
//! cluster) is stopped, its directory removed, and started again. It takes the
//! cluster's id, creates its replicas of the replicated topics placed on it, and
//! the leaders send it everything, from a snapshot where their Raft logs are purged.
//! Afterwards every replica holds every acknowledged record at its offset and
//! `seglog verify` is clean on every node's directory.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::time::Duration;

use seglog::engine::net::cluster_client::ClusterClient;
use seglog::format::wire::WireRecord;

use crate::util::cluster::Cluster;
use crate::util::replica_check::Acked;

const TOPIC: &str = "rejoin";
const PARTITIONS: u32 = 2;
/// Applied entries between two snapshots, so that the leaders purge their logs.
const SNAPSHOT_ENTRIES: u64 = 16;

/// Produces one record, `value` as a JSON string (the topic's schema asks for one).
fn produce(c: &mut ClusterClient, partition: u32, value: String, acked: &mut Vec<Acked>) {
    let value = format!("{value:?}");
    let records = [WireRecord {
        timestamp_ms: -1,
        key: None,
        value: value.as_bytes(),
    }];
    let (base, last) = c.produce(TOPIC, partition, &records).unwrap();
    assert_eq!(base, last);
    acked.push(Acked {
        producer: 1,
        value: value.into_bytes(),
        partition,
        offset: base,
    });
}

fn cluster_id(c: &Cluster, id: u64) -> serde_json::Value {
    let bytes = std::fs::read(c.node(id).dir.join("cluster.json")).unwrap();
    serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["cluster_id"].clone()
}

#[test]
fn a_node_whose_directory_was_replaced_gets_its_replicas_back() {
    let mut c = Cluster::start_with_args(3, |_| {
        vec![
            "--raft-snapshot-entries".to_string(),
            SNAPSHOT_ENTRIES.to_string(),
        ]
    });
    c.ok(&[
        "topics",
        "create",
        TOPIC,
        "--replication-factor",
        "3",
        "--partitions",
        &PARTITIONS.to_string(),
        "--config",
        "retention_bytes=1000000000",
    ]);
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.client_addr.clone()).collect();
    let mut client = ClusterClient::new(addrs, Duration::from_secs(10), None, None);
    let mut acked = Vec::new();
    for i in 0..3 * SNAPSHOT_ENTRIES {
        for p in 0..PARTITIONS {
            produce(&mut client, p, format!("before-{p}-{i}"), &mut acked);
        }
    }
    let schema = c.root().join("schema.json");
    std::fs::write(&schema, r#"{"type":"string"}"#).unwrap();
    c.ok(&[
        "schemas",
        "register",
        TOPIC,
        "--file",
        schema.to_str().unwrap(),
    ]);
    c.wait_caught_up(TOPIC, PARTITIONS);
    let id_before = cluster_id(&c, 2);
    assert_eq!(cluster_id(&c, 1), id_before);

    // The disk of node 1 is replaced: an empty directory at the same path.
    c.stop(1);
    std::fs::remove_dir_all(&c.node(1).dir).unwrap();
    for i in 0..SNAPSHOT_ENTRIES {
        produce(&mut client, 0, format!("while-away-{i}"), &mut acked);
    }
    c.restart(1);
    c.wait_caught_up(TOPIC, PARTITIONS);
    assert_eq!(cluster_id(&c, 1), id_before, "node 1 took the cluster's id");
    // And the topic's schemas, which it checks when it leads.
    let out = c.run_on(1, &["schemas", "get", TOPIC]).unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("string"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        c.node(1).stderr().contains("data directory is new"),
        "{}",
        c.node(1).stderr()
    );
    // Node 1 is a full replica again: what is produced now reaches it too.
    for i in 0..5 {
        for p in 0..PARTITIONS {
            produce(&mut client, p, format!("after-{p}-{i}"), &mut acked);
        }
    }
    c.wait_caught_up(TOPIC, PARTITIONS);
    drop(client);
    c.stop_all();

    c.assert_every_replica_holds(TOPIC, PARTITIONS, &acked);
}
