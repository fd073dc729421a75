//! The multi-process harness of the replication tests ([`crate::util::cluster`]) on
//! standalone brokers: fixed ports kept across a kill -9 and restart from the data
//! directory, a paused node that does not answer (and the query bounded in time), a
//! resumed one that does, stop with exit 0, and the offline dump of what each holds.

use std::time::Duration;

use seglog::engine::net::client::Client;
use seglog::format::wire::{PartitionBatch, WireRecord};

use crate::util::cluster::Cluster;
use crate::util::replica_check::{check, Acked};

fn produce(addr: &str, topic: &str, partition: u32, values: &[&str]) -> (u64, u64) {
    let mut c = Client::connect(addr, Duration::from_secs(10)).unwrap();
    let acks = c
        .produce(
            topic,
            vec![PartitionBatch {
                partition,
                records: values
                    .iter()
                    .map(|v| WireRecord {
                        timestamp_ms: 1,
                        key: None,
                        value: v.as_bytes(),
                    })
                    .collect(),
            }],
        )
        .unwrap();
    acks[0].result.clone().unwrap()
}

#[test]
fn nodes_restart_on_their_ports_and_data_pause_and_dump() {
    let mut c = Cluster::standalone(2);
    for id in c.ids() {
        let out = c.run_on(id, &["topics", "create", "h", "--partitions", "2"]);
        assert!(out.is_some_and(|o| o.status.success()));
    }
    let addr1 = c.node(1).client_addr.clone();
    assert_eq!(produce(&addr1, "h", 0, &["a", "b"]), (0, 1));
    assert_eq!(produce(&addr1, "h", 1, &["c"]), (0, 0));

    // kill -9 and restart: the same port, the records still there.
    c.kill9(1);
    assert!(!c.node_mut(1).up());
    assert!(c
        .run_on(1, &["topics", "list"])
        .is_some_and(|o| !o.status.success()));
    c.restart(1);
    assert_eq!(c.node(1).client_addr, addr1);
    assert_eq!(c.node(1).serve().addr, addr1);
    assert_eq!(produce(&addr1, "h", 0, &["d"]), (2, 2));

    // A paused node accepts but does not answer; the query ends anyway.
    c.pause(2);
    assert!(c.node_mut(2).up());
    assert!(!c.node_mut(2).answering());
    assert!(c.run_on(2, &["topics", "list"]).is_none());
    c.resume(2);
    let out = c.run_on(2, &["topics", "list"]).expect("answers again");
    assert!(String::from_utf8_lossy(&out.stdout).contains('h'));

    // Offline dump after a clean stop: node 1 holds what was acknowledged.
    c.stop_all();
    let acks: Vec<Acked> = [("a", 0, 0), ("b", 0, 1), ("d", 0, 2), ("c", 1, 0)]
        .iter()
        .map(|&(v, partition, offset)| Acked {
            producer: 1,
            value: v.as_bytes().to_vec(),
            partition,
            offset,
        })
        .collect();
    let one = c.dump(1, "h", 2);
    assert_eq!(one.records.len(), 4);
    assert_eq!(check(&acks, std::slice::from_ref(&one)), vec![]);
    // Node 2 holds none of it: the checker says so for each record.
    let two = c.dump(2, "h", 2);
    assert!(two.records.is_empty());
    assert_eq!(check(&acks, &[one, two]).len(), 8);
}

#[test]
fn the_peers_list_routes_every_link_through_its_own_proxy() {
    let c = Cluster::prepare(3);
    for n in &c.nodes {
        let entries: Vec<&str> = n.peers.split(',').collect();
        assert_eq!(entries.len(), 3, "{}", n.peers);
        for (j, entry) in (1..=3u64).zip(&entries) {
            let (id, addr) = entry.split_once('=').unwrap();
            assert_eq!(id, j.to_string());
            if j == n.id {
                assert_eq!(addr, n.raft_addr);
            } else {
                assert_eq!(addr, c.link(n.id, j).addr);
                assert_ne!(addr, c.node(j).raft_addr);
            }
        }
    }
    let mut addrs: Vec<&str> = c.nodes.iter().map(|n| n.client_addr.as_str()).collect();
    addrs.extend(c.nodes.iter().map(|n| n.raft_addr.as_str()));
    let before = addrs.len();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), before, "ports must differ");
}
