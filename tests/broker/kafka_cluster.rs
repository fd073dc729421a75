//! The Kafka door of a three-node cluster (real `seglog serve` processes, each with
//! `--kafka-listen`): every node's Metadata names all three brokers and the same
//! Raft leader per partition; confluent-kafka's idempotent producer keeps producing
//! across a SIGKILL of a leader, and every acknowledged record is then read back
//! exactly once, at its acknowledged offset, in order per partition. Skipped when
//! confluent-kafka is not installed (except under CI=true, see `kafka_clients`).

#![expect(clippy::unwrap_used, reason = "tests")]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::kafka_clients::{have_python, python};
use crate::util::cluster::{free_port, Cluster};
use crate::util::serve::PATIENCE;

const TOPIC: &str = "kc";
const PARTITIONS: u32 = 2;
/// Records the failover run produces (half before the kill, half after).
const RECORDS: usize = 2000;

/// A started cluster whose node i also serves Kafka at the returned address.
fn kafka_cluster() -> (Cluster, BTreeMap<u64, String>) {
    let mut c = Cluster::prepare(3);
    let mut kafka = BTreeMap::new();
    for node in &mut c.nodes {
        let addr = format!("127.0.0.1:{}", free_port());
        node.args = vec!["--kafka-listen".into(), addr.clone()];
        kafka.insert(node.id, addr);
    }
    c.start_all();
    (c, kafka)
}

/// (brokers id → HOST:PORT, partition → leader) of node `addr`'s Metadata of
/// `topic`.
fn metadata(addr: &str, topic: &str) -> (BTreeMap<String, String>, BTreeMap<String, i64>) {
    let m = python("confluent_metadata", &[addr, topic]);
    let brokers = m["brokers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let leaders = m["partitions"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["leader"].as_i64().unwrap()))
        .collect();
    (brokers, leaders)
}

/// Waits until every node in `nodes` names `want` as the leaders of `topic` in its
/// Metadata.
fn wait_metadata_leaders(kafka: &BTreeMap<u64, String>, topic: &str, nodes: &[u64], want: &[u64]) {
    let want: BTreeMap<String, i64> = want
        .iter()
        .enumerate()
        .map(|(p, l)| (p.to_string(), i64::try_from(*l).unwrap()))
        .collect();
    let brokers: BTreeMap<String, String> = kafka
        .iter()
        .map(|(id, a)| (id.to_string(), a.clone()))
        .collect();
    let began = Instant::now();
    for id in nodes {
        loop {
            let (b, leaders) = metadata(&kafka[id], topic);
            assert_eq!(b, brokers, "node {id} names the cluster's Kafka brokers");
            if leaders == want {
                break;
            }
            assert!(
                began.elapsed() < PATIENCE,
                "node {id} names leaders {leaders:?}, the cluster says {want:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn kafka_metadata_names_the_leader_and_idempotent_produce_survives_a_leader_kill() {
    if !have_python("confluent_kafka") {
        return;
    }
    let (mut c, kafka) = kafka_cluster();
    c.create_topic(TOPIC, PARTITIONS, 3);
    let leaders: Vec<u64> = (0..PARTITIONS).map(|p| c.wait_leader(TOPIC, p)).collect();
    wait_metadata_leaders(&kafka, TOPIC, &c.ids(), &leaders);

    // Produce half, kill partition 0's leader as the second half starts, produce on.
    let boot: Vec<&str> = kafka.values().map(String::as_str).collect();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/broker/kafka/clients.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args(["confluent_failover", &boot.join(","), TOPIC])
        .arg(RECORDS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line == "ready" {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(PATIENCE)
        .expect("the first half was never acknowledged");
    let killed = leaders[0];
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    c.kill9(killed);
    let out = child.wait_with_output().unwrap();
    let err = log.join().unwrap();
    assert!(out.status.success(), "confluent_failover: {err}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));

    // Every record was acknowledged, without an error.
    let reports = r["reports"].as_array().unwrap();
    assert_eq!(reports.len(), RECORDS, "{err}");
    let failed: Vec<&serde_json::Value> = reports.iter().filter(|x| !x[0].is_null()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    // Read back: each partition from offset 0 without a gap, each value once, values
    // of a partition in the order they were produced.
    let mut consumed: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
    for x in r["consumed"].as_array().unwrap() {
        consumed
            .entry(x[0].as_u64().unwrap())
            .or_default()
            .push((x[1].as_u64().unwrap(), x[2].as_str().unwrap().to_string()));
    }
    let mut values = BTreeSet::new();
    for (p, recs) in &consumed {
        let offsets: Vec<u64> = recs.iter().map(|x| x.0).collect();
        assert_eq!(offsets, (0..recs.len() as u64).collect::<Vec<_>>(), "{p}");
        let order: Vec<usize> = recs.iter().map(|x| x.1[1..].parse().unwrap()).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "partition {p}: {order:?}"
        );
        for (_, v) in recs {
            assert!(values.insert(v.clone()), "{v} read twice");
        }
    }
    assert_eq!(values.len(), RECORDS, "every acknowledged record, once");
    for x in reports {
        let (p, offset, v) = (
            x[1].as_u64().unwrap(),
            x[2].as_u64().unwrap(),
            x[3].as_str().unwrap(),
        );
        let at = consumed[&p].get(offset as usize).map(|x| x.1.as_str());
        assert_eq!(at, Some(v), "acknowledged at {p}/{offset}");
    }

    // The survivors name the new leader of partition 0 in their Metadata.
    let new_leader = c.wait_leader(TOPIC, 0);
    assert_ne!(new_leader, killed);
    let survivors: Vec<u64> = c.ids().into_iter().filter(|id| *id != killed).collect();
    let (_, seen) = metadata(&kafka[&survivors[0]], TOPIC);
    assert_eq!(seen["0"], i64::try_from(new_leader).unwrap(), "{seen:?}");
    // Every survivor, the follower too, names the survivors as each partition's ISR
    // (the killed node falls out once entries commit without it), as Kafka's brokers
    // all give the controller's ISR.
    let alive: BTreeSet<i64> = survivors
        .iter()
        .map(|n| i64::try_from(*n).unwrap())
        .collect();
    for id in &survivors {
        let began = Instant::now();
        loop {
            let m = python("confluent_metadata", &[&kafka[id], TOPIC]);
            let isrs: Vec<BTreeSet<i64>> = (0..PARTITIONS)
                .map(|p| {
                    m["partitions"][p.to_string()]["isrs"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|n| n.as_i64().unwrap())
                        .collect()
                })
                .collect();
            if isrs.iter().all(|s| *s == alive) {
                break;
            }
            assert!(
                began.elapsed() < PATIENCE,
                "node {id} names ISRs {isrs:?}, the survivors are {alive:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    for id in survivors {
        c.stop(id);
    }
}

/// A topic on fewer nodes than the cluster has (2 partitions at factor 2 on 3
/// nodes): each node holds no replica of some partition, and its Metadata still
/// names that partition's leader (learnt from a holder), so an idempotent producer
/// bootstrapped from any one node writes every record. Before, such a node answered
/// LEADER_NOT_AVAILABLE for the partitions it does not hold.
#[test]
fn kafka_metadata_of_a_topic_on_fewer_nodes_names_every_leader_from_every_node() {
    if !have_python("confluent_kafka") {
        return;
    }
    let topic = "k2";
    let (mut c, kafka) = kafka_cluster();
    c.create_topic(topic, 2, 2);
    let leaders: Vec<u64> = (0..2).map(|p| c.wait_leader(topic, p)).collect();
    // Each node's own answer (a Kafka client may ask any broker, so confluent-kafka
    // alone would not show one node's): every node names both leaders, once a node
    // without a replica has asked a holder (about a second).
    let want: BTreeMap<i32, i32> = (0i32..)
        .zip(&leaders)
        .map(|(p, l)| (p, i32::try_from(*l).unwrap()))
        .collect();
    for id in c.ids() {
        let began = Instant::now();
        loop {
            let named = direct_leaders(&kafka[&id], topic);
            if named == want {
                break;
            }
            assert!(
                began.elapsed() < PATIENCE,
                "node {id} names leaders {named:?}, not {want:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    wait_metadata_leaders(&kafka, topic, &c.ids(), &leaders);
    for id in c.ids() {
        let r = python("confluent_idempotent", &[&kafka[&id], topic, "1000"]);
        assert_eq!(r["with_offsets"], 1000, "through node {id}: {r}");
        assert_eq!(
            r["errors"].as_array().unwrap().len(),
            0,
            "through node {id}: {r}"
        );
        assert_eq!(r["partitions"], serde_json::json!([0, 1]), "{r}");
    }
    for id in c.ids() {
        c.stop(id);
    }
}

/// Partition → leader of `topic` in the Metadata (version 9) that the node at `addr`
/// answers itself, on one connection.
fn direct_leaders(addr: &str, topic: &str) -> BTreeMap<i32, i32> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let mut body = crate::util::kafka_raw::call(&mut conn, ApiKey::Metadata, 9, |b, v| {
        MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
                TopicName(StrBytes::from_string(topic.to_string())),
            ))]))
            .encode(b, v)
            .unwrap();
    });
    let m = MetadataResponse::decode(&mut body, 9).unwrap();
    m.topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.partition_index, p.leader_id.0))
        .collect()
}

/// A confluent-kafka group member's committed offsets survive a SIGKILL of the node
/// coordinating the group: FindCoordinator names the leader of
/// `__consumer_offsets`'s partition (before, the node asked, whose groups died with
/// it), and the next member goes on from the commit.
#[test]
fn a_kafka_group_goes_on_from_its_commit_after_its_coordinator_is_killed() {
    if !have_python("confluent_kafka") {
        return;
    }
    let (mut c, kafka) = kafka_cluster();
    c.create_topic("kg", 1, 3);
    let input: String = (1..=20).map(|i| format!("{i}\n")).collect();
    c.ok_with_stdin(&["produce", "kg"], &input);
    let boot: Vec<&str> = kafka.values().map(String::as_str).collect();
    let boot = boot.join(",");
    let read = |want: usize| {
        let r = python(
            "confluent_group_reads",
            &[&boot, "kg", "kg-readers", &want.to_string()],
        );
        let values: Vec<u32> = r["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().parse().unwrap())
            .collect();
        (values, r)
    };
    let (first, r) = read(8);
    assert_eq!(first, (1..=8).collect::<Vec<_>>(), "{r}");
    assert_eq!(r["committed"]["0"], 8, "{r}");
    let coordinator = c.wait_leader("__consumer_offsets", 0);
    c.kill9(coordinator);
    let (next, r) = read(5);
    assert_eq!(
        next,
        (9..=13).collect::<Vec<_>>(),
        "after node {coordinator}, the coordinator, was killed: {r}"
    );
    assert_eq!(r["committed"]["0"], 13, "{r}");
}
