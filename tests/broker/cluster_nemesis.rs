//! A 3-node cluster of real `seglog serve` processes under a seeded nemesis, and
//! membership and restart on it.
//!
//! The nemesis test: a topic with replication factor 3, several idempotent producers
//! that follow the leader and retry each batch until it is acknowledged, and a nemesis
//! that, by a schedule drawn from its seed, kills -9 the leader of a partition (and
//! restarts it from its data directory), pauses a follower past the election timeout,
//! isolates a node or cuts or black-holes the links between two nodes (through the
//! proxies between the Raft listeners), and heals. After `SEGLOG_NEMESIS_SECS`
//! (default 60) everything is healed, a produce to each partition must succeed, the
//! replicas must reach lag 0, the nodes are stopped and each node's data partitions
//! are dumped offline and checked ([`crate::util::replica_check`]). The seed is
//! printed; `SEGLOG_NEMESIS_SEED` replays one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::cluster::{partition_status, stderr_lines, Cluster, ClusterProducer, Sent};
use crate::util::replica_check::{check, Acked};
use crate::util::rng::Rng;
use crate::util::serve::PATIENCE;

const PRODUCERS: u64 = 4;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn client_addrs(c: &Cluster) -> Vec<String> {
    c.nodes.iter().map(|n| n.client_addr.clone()).collect()
}

/// Produces `count` batches of one record each to `topic`/`partition` with a fresh
/// producer, every one acknowledged; returns the acknowledgements.
fn produce_all(c: &Cluster, topic: &str, partition: u32, tag: &str, count: u64) -> Vec<Acked> {
    let mut p = ClusterProducer::new(client_addrs(c), CLIENT_TIMEOUT);
    let began = Instant::now();
    let in_time = || began.elapsed() < PATIENCE;
    assert!(p.init(&in_time), "no producer id within {PATIENCE:?}");
    let (pid, _) = p.id.unwrap();
    let mut acks = Vec::new();
    for i in 0..count {
        let value = format!("{tag}-{i}").into_bytes();
        match p.send(topic, partition, std::slice::from_ref(&value), &in_time) {
            Sent::Acked(offset) => acks.push(Acked {
                producer: pid,
                value,
                partition,
                offset,
            }),
            other => panic!("{topic}/{partition}: {tag}-{i} not acknowledged: {other:?}"),
        }
    }
    acks
}

/// Stops every node, dumps each one's `topic` and checks the acknowledgements.
fn stop_and_check(c: &mut Cluster, topic: &str, partitions: u32, acks: &[Acked], what: &str) {
    c.stop_all();
    let replicas: Vec<_> = c
        .ids()
        .iter()
        .map(|&id| c.dump(id, topic, partitions))
        .collect();
    let violations = check(acks, &replicas);
    let held: Vec<usize> = replicas.iter().map(|r| r.records.len()).collect();
    assert!(
        violations.is_empty(),
        "{what}: {} violations (records held per node {held:?}, {} acknowledged):\n{}",
        violations.len(),
        acks.len(),
        violations
            .iter()
            .take(40)
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// What one producer thread did.
#[derive(Default)]
struct Tally {
    acked_batches: u64,
    producer_lost: Vec<String>,
    gave_up: u64,
    retries: u64,
}

fn producer_thread(
    addrs: Vec<String>,
    topic: &'static str,
    partitions: u32,
    thread_no: u64,
    seed: u64,
    acks: Arc<Mutex<Vec<Acked>>>,
    stop: Arc<AtomicBool>,
) -> Tally {
    let mut rng = Rng::new(seed ^ (thread_no << 32) ^ 0x9e37_79b9);
    let mut p = ClusterProducer::new(addrs, CLIENT_TIMEOUT);
    let go = || !stop.load(Ordering::Relaxed);
    let mut tally = Tally::default();
    let mut n = 0u64;
    'outer: while go() {
        if !p.init(&go) {
            break;
        }
        let (pid, _) = p.id.unwrap();
        while go() {
            let partition = rng.below(u64::from(partitions)) as u32;
            let count = 1 + rng.below(5);
            let values: Vec<Vec<u8>> = (0..count)
                .map(|_| {
                    n += 1;
                    format!("t{thread_no}-n{n}").into_bytes()
                })
                .collect();
            match p.send(topic, partition, &values, &go) {
                Sent::Acked(base) => {
                    tally.acked_batches += 1;
                    let mut a = acks.lock().unwrap();
                    for (i, value) in values.into_iter().enumerate() {
                        a.push(Acked {
                            producer: pid,
                            value,
                            partition,
                            offset: base + i as u64,
                        });
                    }
                }
                Sent::ProducerLost(code, message) => {
                    tally
                        .producer_lost
                        .push(format!("{topic}/{partition} {code:?}: {message}"));
                    continue 'outer;
                }
                Sent::GaveUp => tally.gave_up += 1,
            }
        }
    }
    tally.retries = p.retries;
    tally
}

/// The nemesis's record of its steps: each printed with its seed and time as it starts.
struct Log {
    seed: u64,
    began: Instant,
    steps: Vec<String>,
}

impl Log {
    fn push(&mut self, step: String) {
        eprintln!(
            "nemesis {} at {:.1}s: {step}",
            self.seed,
            self.began.elapsed().as_secs_f64()
        );
        self.steps.push(step);
    }
}

/// One step of the nemesis, drawn from its generator.
fn nemesis_step(c: &mut Cluster, rng: &mut Rng, topic: &str, partitions: u32, log: &mut Log) {
    let ids = c.ids();
    let pick = |rng: &mut Rng, from: &[u64]| from[rng.below(from.len() as u64) as usize];
    let partition = rng.below(u64::from(partitions)) as u32;
    let hold = Duration::from_millis(1000 + rng.below(2000));
    match rng.below(4) {
        0 => {
            let Some(leader) = c.leader(topic, partition) else {
                log.push(format!("no leader of {topic}/{partition} to kill"));
                return;
            };
            log.push(format!(
                "kill -9 node {leader} (leader of {topic}/{partition}), restart after {hold:?}"
            ));
            c.kill9(leader);
            thread::sleep(hold);
            c.restart(leader);
        }
        1 => {
            let leader = c.leader(topic, partition);
            let followers: Vec<u64> = ids.iter().copied().filter(|&i| Some(i) != leader).collect();
            let node = pick(rng, &followers);
            let hold = hold + Duration::from_millis(1000);
            log.push(format!(
                "pause node {node} (leader of {topic}/{partition}: {leader:?}) for {hold:?}"
            ));
            c.pause(node);
            thread::sleep(hold);
            c.resume(node);
        }
        2 => {
            let node = pick(rng, &ids);
            log.push(format!("isolate node {node} for {hold:?}"));
            c.isolate(node);
            thread::sleep(hold);
            c.heal_all();
        }
        _ => {
            let a = pick(rng, &ids);
            let others: Vec<u64> = ids.iter().copied().filter(|&i| i != a).collect();
            let b = pick(rng, &others);
            if rng.below(2) == 0 {
                log.push(format!("cut {a}<->{b} for {hold:?}"));
                c.cut_between(a, b);
            } else {
                log.push(format!("black-hole {a}<->{b} for {hold:?}"));
                c.drop_between(a, b);
            }
            thread::sleep(hold);
            c.heal_all();
        }
    }
}

#[test]

fn nemesis_keeps_every_acknowledged_record() {
    const TOPIC: &str = "nem";
    const PARTITIONS: u32 = 2;
    let seed = env_u64("SEGLOG_NEMESIS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let secs = env_u64("SEGLOG_NEMESIS_SECS").unwrap_or(60);
    eprintln!("nemesis: seed {seed} for {secs} s (replay with SEGLOG_NEMESIS_SEED={seed})");

    let mut c = Cluster::start(3);
    c.create_topic(TOPIC, PARTITIONS, 3);
    for p in 0..PARTITIONS {
        c.wait_leader(TOPIC, p);
    }
    let acks = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let (addrs, acks, stop) = (client_addrs(&c), Arc::clone(&acks), Arc::clone(&stop));
            thread::spawn(move || producer_thread(addrs, TOPIC, PARTITIONS, t, seed, acks, stop))
        })
        .collect();

    let mut rng = Rng::new(seed);
    let began = Instant::now();
    let mut log = Log {
        seed,
        began,
        steps: Vec::new(),
    };
    while began.elapsed() < Duration::from_secs(secs) {
        nemesis_step(&mut c, &mut rng, TOPIC, PARTITIONS, &mut log);
        thread::sleep(Duration::from_millis(200 + rng.below(800)));
    }
    stop.store(true, Ordering::Relaxed);
    let tallies: Vec<Tally> = producers.into_iter().map(|h| h.join().unwrap()).collect();

    c.heal_everything();
    let mut acks = std::mem::take(&mut *acks.lock().unwrap());
    for p in 0..PARTITIONS {
        c.wait_leader(TOPIC, p);
        acks.extend(produce_all(&c, TOPIC, p, &format!("after-{p}"), 3));
    }
    c.wait_caught_up(TOPIC, PARTITIONS);
    let batches: u64 = tallies.iter().map(|t| t.acked_batches).sum();
    let lost: Vec<&String> = tallies.iter().flat_map(|t| &t.producer_lost).collect();
    eprintln!(
        "nemesis {seed}: {} steps, {} records in {batches} acknowledged batches, {} retries, {} batches given up at the end, {} producer re-inits",
        log.steps.len(),
        acks.len(),
        tallies.iter().map(|t| t.retries).sum::<u64>(),
        tallies.iter().map(|t| t.gave_up).sum::<u64>(),
        lost.len()
    );
    for l in &lost {
        eprintln!("nemesis {seed}: producer state lost: {l}");
    }
    assert!(batches > 0, "seed {seed}: nothing was acknowledged");
    stop_and_check(&mut c, TOPIC, PARTITIONS, &acks, &format!("seed {seed}"));
}

#[test]

fn a_restarted_node_catches_up() {
    const TOPIC: &str = "rs";
    let mut c = Cluster::start(3);
    c.create_topic(TOPIC, 1, 3);
    let leader = c.wait_leader(TOPIC, 0);
    let mut acks = produce_all(&c, TOPIC, 0, "before", 50);
    let follower = c.ids().into_iter().find(|&i| i != leader).unwrap();
    c.kill9(follower);
    acks.extend(produce_all(&c, TOPIC, 0, "while-down", 100));
    // The leader sees the dead follower behind.
    let leader = c.wait_leader(TOPIC, 0);
    let s = c.status(leader).expect("the leader answers");
    let ps = partition_status(&s, TOPIC, 0).expect("the partition in the status");
    let behind = ps["replicas"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["node"].as_u64() == Some(follower)))
        .and_then(|r| r["lag"].as_u64());
    assert!(behind.is_some_and(|lag| lag >= 100), "{ps}");
    c.restart(follower);
    c.wait_caught_up(TOPIC, 1);
    acks.extend(produce_all(&c, TOPIC, 0, "after", 10));
    c.wait_caught_up(TOPIC, 1);
    stop_and_check(&mut c, TOPIC, 1, &acks, "restart");
}

#[test]

fn a_node_of_another_cluster_refuses_to_join() {
    const TOPIC: &str = "own";
    // Cluster B, formed once and stopped: its node 3 holds B's cluster id.
    let mut b = Cluster::start(3);
    let b_id = b.wait_cluster_id(3);
    b.stop_all();
    let foreign = b.node(3).dir.clone();

    let mut a = Cluster::start(3);
    a.create_topic(TOPIC, 1, 3);
    a.wait_leader(TOPIC, 0);
    let a_id = a.wait_cluster_id(3);
    assert_ne!(a_id, b_id, "two clusters got the same id");
    a.stop(3);
    // A's node 3, with B's node 3 data directory.
    a.node_mut(3).dir = foreign.clone();
    let mut child = a
        .node(3)
        .command()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stderr_lines(&mut child);
    let began = Instant::now();
    let mut said = None;
    while began.elapsed() < PATIENCE {
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line.to_lowercase().contains("cluster id") => {
                said = Some(line);
                break;
            }
            _ => {}
        }
    }
    // Nodes 1 and 2 go on without it, and nothing of A reaches it.
    let acks = produce_all(&a, TOPIC, 0, "a", 20);
    let _ = child.kill();
    let _ = child.wait();
    let said = said.expect("the node of cluster B said nothing about the cluster id");
    assert!(!said.contains('\n'));
    assert!(
        !foreign.join("topics").join(TOPIC).exists(),
        "cluster A's topic reached the node of cluster B"
    );
    assert_eq!(acks.len(), 20);
}

#[test]

fn a_node_whose_fsyncs_fail_fail_stops_while_the_others_go_on() {
    const TOPIC: &str = "fsfail";
    let mut c = Cluster::start(3);
    c.create_topic(TOPIC, 1, 3);
    c.wait_leader(TOPIC, 0);
    let mut acks = produce_all(&c, TOPIC, 0, "before", 20);
    c.wait_caught_up(TOPIC, 1);
    // Node 3 comes back on a disk whose every fsync under the topic fails (its Raft
    // log and its data partition both have the topic's name in their paths).
    c.stop(3);
    c.node_mut(3).env = vec![("SEGLOG_FAULT_FSYNC_FAIL".into(), format!("{TOPIC}:1"))];
    c.restart(3);
    acks.extend(produce_all(&c, TOPIC, 0, "during", 50));
    assert!(
        c.node(3).serve().stderr_gets("Input/output error"),
        "node 3 did not report the failed fsync: {}",
        c.node(3).stderr()
    );
    let leader = c.wait_leader(TOPIC, 0);
    assert_ne!(leader, 3, "a node that cannot fsync leads");
    // Without the fault node 3 recovers and catches up.
    c.kill9(3);
    c.node_mut(3).env.clear();
    c.restart(3);
    c.wait_caught_up(TOPIC, 1);
    stop_and_check(&mut c, TOPIC, 1, &acks, "fsync fault");
}
