//! `serve --metrics-listen` on a three-node cluster: every node exports each
//! replicated partition it holds (leader or not, term, replicas, in-sync replicas);
//! once a node is killed, the partitions' leaders count them under-replicated and
//! name two replicas in sync, within the in-sync lag window (10 s).

#![expect(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prometheus_parse::Scrape;

use crate::cli_metrics::{get, metrics_addr_in, parse, promtool_check, value};
use crate::util::cluster::Cluster;
use crate::util::serve::PATIENCE;

const TOPIC: &str = "rm";
const PARTITIONS: u32 = 2;

fn scrape(addr: &str) -> (Scrape, String) {
    let (status, text) = get(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    (parse(&text), text)
}

/// Scrapes `nodes` until `done` holds for their scrapes (by node id).
fn wait_scrapes(
    metrics: &BTreeMap<u64, String>,
    nodes: &[u64],
    what: &str,
    done: impl Fn(&BTreeMap<u64, Scrape>) -> bool,
) {
    let began = Instant::now();
    loop {
        let scrapes: BTreeMap<u64, Scrape> = nodes
            .iter()
            .map(|id| (*id, scrape(&metrics[id]).0))
            .collect();
        if done(&scrapes) {
            return;
        }
        assert!(began.elapsed() < PATIENCE, "never: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn labels(p: u32) -> [(&'static str, String); 2] {
    [("topic", TOPIC.to_string()), ("partition", p.to_string())]
}

fn gauge(s: &Scrape, name: &str, p: u32) -> f64 {
    let l = labels(p);
    value(s, name, &[(l[0].0, &l[0].1), (l[1].0, &l[1].1)])
}

#[test]
fn every_node_exports_its_replicas_and_leaders_count_a_dead_node_under_replicated() {
    let mut c = Cluster::prepare(3);
    for node in &mut c.nodes {
        node.args = vec!["--metrics-listen".into(), "127.0.0.1:0".into()];
    }
    c.start_all();
    c.create_topic(TOPIC, PARTITIONS, 3);
    let leaders: Vec<u64> = (0..PARTITIONS).map(|p| c.wait_leader(TOPIC, p)).collect();
    // The offsets topic's partition (made at the cluster's start) is counted too.
    c.wait_leader("__consumer_offsets", 0);
    let metrics: BTreeMap<u64, String> = c
        .nodes
        .iter()
        .map(|n| (n.id, metrics_addr_in(&n.stderr())))
        .collect();
    let ids = c.ids();

    // Every node holds every partition: three replicas, all in sync (a follower once
    // it has its leader's answer), the leader gauge set on the leader only, and
    // nothing under-replicated.
    wait_scrapes(&metrics, &ids, "every node names three in sync", |s| {
        s.values().all(|m| {
            (0..PARTITIONS).all(|p| {
                gauge(m, "seglog_replicas", p) == 3.0
                    && gauge(m, "seglog_in_sync_replicas", p) == 3.0
            }) && value(m, "seglog_under_replicated_partitions", &[]) == 0.0
        })
    });
    for (p, leader) in (0..PARTITIONS).zip(&leaders) {
        for id in &ids {
            let (m, text) = scrape(&metrics[id]);
            let leads = gauge(&m, "seglog_replica_leader", p);
            assert_eq!(leads, f64::from(id == leader), "node {id}, partition {p}");
            assert!(gauge(&m, "seglog_raft_term", p) >= 1.0);
            promtool_check(&text);
        }
    }

    // Kill a node that does not lead partition 0; whichever partitions it led elect
    // again. The leaders then name the survivors in sync and count every partition
    // under-replicated (the offsets topic's too); the followers name two in sync.
    let victim = *ids.iter().find(|id| **id != leaders[0]).unwrap();
    c.kill9(victim);
    let survivors: Vec<u64> = ids.iter().copied().filter(|id| *id != victim).collect();
    let leaders: Vec<u64> = (0..PARTITIONS).map(|p| c.wait_leader(TOPIC, p)).collect();
    assert!(!leaders.contains(&victim));
    wait_scrapes(
        &metrics,
        &survivors,
        "the survivors count every partition under-replicated",
        |s| {
            let under: f64 = s
                .values()
                .map(|m| value(m, "seglog_under_replicated_partitions", &[]))
                .sum();
            under == f64::from(PARTITIONS + 1)
                && s.values()
                    .all(|m| (0..PARTITIONS).all(|p| gauge(m, "seglog_in_sync_replicas", p) == 2.0))
        },
    );
    for (p, leader) in (0..PARTITIONS).zip(&leaders) {
        let led: f64 = survivors
            .iter()
            .map(|id| gauge(&scrape(&metrics[id]).0, "seglog_replica_leader", p))
            .sum();
        assert_eq!(led, 1.0, "partition {p}: one leader among the survivors");
        let (m, _) = scrape(&metrics[leader]);
        assert_eq!(gauge(&m, "seglog_replica_leader", p), 1.0);
    }
    for id in survivors {
        c.stop(id);
    }
}
