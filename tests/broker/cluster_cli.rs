//! The command-line clients on a three-node cluster whose partitions are led by
//! different nodes: `produce` sends each partition's records to its leader and
//! `consume` reads each partition from its leader, whole, through every node's
//! address or one follower's; a `consume --follow` and a `produce` both go on
//! across a SIGKILL of a partition's leader; `consume --group` reads every
//! partition from its leader; `bench` given every node's address
//! drives each partition's leader. Before, a request spanning partitions went to one
//! node and its other partitions were refused with NOT_LEADER.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use crate::util::bin::BIN;
use crate::util::cluster::{output_within, Cluster};
use crate::util::serve::PATIENCE;

const TOPIC: &str = "spread";
const PARTITIONS: u32 = 3;

fn lines(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("{i}\n")).collect()
}

/// The lines `out` gives, as they come.
fn stdout_lines(out: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The values of `out` (one per line), checking none is there twice.
fn values(out: &str) -> BTreeSet<u32> {
    let mut seen = BTreeSet::new();
    for l in out.lines() {
        assert!(seen.insert(l.parse::<u32>().unwrap()), "{l} twice in {out}");
    }
    seen
}

#[test]
fn produce_and_consume_span_partitions_led_by_different_nodes_and_a_leader_kill() {
    let mut c = Cluster::start_direct(3);
    c.create_topic(TOPIC, PARTITIONS, 3);
    let leaders: Vec<u64> = (0..PARTITIONS).map(|p| c.wait_leader(TOPIC, p)).collect();
    let distinct: BTreeSet<u64> = leaders.iter().copied().collect();
    assert!(
        distinct.len() > 1,
        "one node leads every partition: {leaders:?}"
    );

    // One produce of 30 lines, round-robin over the three partitions: every record
    // acknowledged, by the leaders.
    c.ok_with_stdin(&["produce", TOPIC], &lines(1, 30));
    let all = c.ok(&["consume", TOPIC, "--from", "earliest"]);
    assert_eq!(values(&all), (1..=30).collect(), "{all}");
    // Round-robin from partition 0: partition p holds p+1, p+4, ... in order.
    for p in 0..PARTITIONS {
        let part = c.ok(&[
            "consume",
            TOPIC,
            "--partition",
            &p.to_string(),
            "--from",
            "earliest",
        ]);
        let want: Vec<String> = (p + 1..=30).step_by(3).map(|v| v.to_string()).collect();
        assert_eq!(part.lines().collect::<Vec<_>>(), want, "partition {p}");
    }
    // Through one follower of partition 0 alone.
    let follower = c.ids().into_iter().find(|id| *id != leaders[0]).unwrap();
    let mut one = Command::new(BIN);
    one.args(["consume", TOPIC, "--from", "earliest"])
        .args(["--broker", &c.node(follower).client_addr]);
    let out = output_within(one, PATIENCE).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        values(&String::from_utf8(out.stdout).unwrap()),
        (1..=30).collect()
    );

    // A consumer group reads every partition from its leader (the group itself
    // lives on the node first asked).
    let grouped = c.ok(&["consume", TOPIC, "--group", "g", "--count", "30"]);
    assert_eq!(values(&grouped), (1..=30).collect(), "{grouped}");

    // `bench --broker` with every node's address drives the leader of the topic's
    // partition 0 (the list was taken as one host name).
    c.create_topic("b", 1, 3);
    let leader = c.wait_leader("b", 0);
    let report = c.ok(&[
        "bench",
        "produce",
        "--topic",
        "b",
        "--records",
        "200",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["records"], 200, "{report}");
    assert_eq!(
        report["broker"],
        c.node(leader).client_addr.as_str(),
        "{report}"
    );

    // On a topic whose partitions have different leaders, `bench` sends each
    // partition's requests to its leader (before, every one went to partition 0's
    // leader, which refused the others with NOT_LEADER), and its report names
    // every leader and adds up their fsyncs.
    c.create_topic("bspread", PARTITIONS, 3);
    let bleaders: Vec<u64> = (0..PARTITIONS)
        .map(|p| c.wait_leader("bspread", p))
        .collect();
    let bleaders: BTreeSet<String> = bleaders
        .into_iter()
        .map(|id| c.node(id).client_addr.clone())
        .collect();
    for mode in ["produce", "consume"] {
        let report = c.ok(&[
            "bench",
            mode,
            "--topic",
            "bspread",
            "--partitions",
            &PARTITIONS.to_string(),
            "--connections",
            "2",
            "--records",
            "600",
            "--json",
        ]);
        let report: serde_json::Value = serde_json::from_str(&report).unwrap();
        assert_eq!(report["records"], 600, "{report}");
        let named: BTreeSet<String> = report["broker"]
            .as_str()
            .unwrap()
            .split(',')
            .map(str::to_string)
            .collect();
        assert_eq!(named, bleaders, "{report}");
        if mode == "produce" {
            // At least one group commit on each leader.
            assert!(
                report["fsyncs"].as_u64().unwrap() >= bleaders.len() as u64,
                "{report}"
            );
        }
    }
    for p in 0..PARTITIONS {
        let n = c.ok(&[
            "consume",
            "bspread",
            "--partition",
            &p.to_string(),
            "--from",
            "earliest",
        ]);
        assert_eq!(n.lines().count(), 200, "partition {p} of bspread");
    }

    // A follow consumer from the start; once it has read the first 30, partition
    // 1's leader is killed and 30 more lines are produced: it reads all 60.
    let mut follow = Command::new(BIN)
        .args(["consume", TOPIC, "--from", "earliest", "--follow"])
        .args(["--count", "60", "--broker", &c.brokers()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = stdout_lines(follow.stdout.take().unwrap());
    let mut seen = Vec::new();
    let mut take = |n: usize, what: &str| {
        while seen.len() < n {
            match read.recv_timeout(PATIENCE) {
                Ok(l) => seen.push(l),
                Err(_) => panic!(
                    "consume --follow read {} records, not {n} {what}",
                    seen.len()
                ),
            }
        }
    };
    take(30, "before the kill");
    let killed = leaders[1];
    c.kill9(killed);
    c.ok_with_stdin(&["produce", TOPIC], &lines(31, 60));
    take(60, "after it");
    let out = follow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(values(&seen.join("\n")), (1..=60).collect());
    let all = c.ok(&["consume", TOPIC, "--from", "earliest"]);
    assert_eq!(values(&all), (1..=60).collect(), "{all}");
    for id in c.ids().into_iter().filter(|id| *id != killed) {
        c.stop(id);
    }
}

/// A topic placed on fewer nodes than the cluster has: with 2 partitions at
/// factor 2 on 3 nodes, each node holds some partitions and not others. Every node
/// learns the leaders of the partitions it does not hold from their holders: its
/// `cluster status` names them, a request for one is refused with NOT_LEADER naming
/// its leader, and so `produce`, `consume` and `consume --group` work through any
/// one node's address. Before, such a node answered "leader: unknown": a produce of
/// 10 lines through every address had half its records refused, and a group
/// consumer through a node failed at the first partition it did not hold.
#[test]
fn a_topic_on_fewer_nodes_than_the_cluster_is_reached_through_any_node() {
    let topic = "two";
    let mut c = Cluster::start_direct(3);
    c.create_topic(topic, 2, 2);
    let leaders: Vec<u64> = (0..2).map(|p| c.wait_leader(topic, p)).collect();
    // Every node names each partition's leader, a non-holder once it has asked
    // (about a second).
    let began = std::time::Instant::now();
    for id in c.ids() {
        loop {
            let s = c.status(id).unwrap_or_default();
            let named: Vec<Option<u64>> = (0..2u32)
                .map(|p| {
                    s["partitions"].as_array().and_then(|ps| {
                        ps.iter()
                            .find(|x| x["topic"] == topic && x["partition"] == p)
                            .and_then(|x| x["leader"].as_u64())
                    })
                })
                .collect();
            if named == leaders.iter().map(|l| Some(*l)).collect::<Vec<_>>() {
                break;
            }
            assert!(
                began.elapsed() < PATIENCE,
                "node {id} names leaders {named:?}, not {leaders:?}: {s}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    c.ok_with_stdin(&["produce", topic], &lines(1, 10));
    // Ten lines through each node's address alone: a node refuses the partition it
    // does not hold, naming its leader, and the records are resent there.
    for id in c.ids() {
        let from = 1 + 10 * id as u32;
        through(&c, id, &["produce", topic], Some(&lines(from, from + 9)));
    }
    for id in c.ids() {
        let all = through(&c, id, &["consume", topic, "--from", "earliest"], None);
        assert_eq!(values(&all), (1..=40).collect(), "through node {id}");
        // `topics describe` through this node gives each partition's offsets as its
        // leader does, and says where a partition it does not hold is.
        let d = through(&c, id, &["topics", "describe", topic, "--json"], None);
        let d: serde_json::Value = serde_json::from_str(&d).unwrap();
        for p in d["partitions"].as_array().unwrap() {
            assert_eq!(p["end_offset"], 20, "through node {id}: {d}");
            assert_eq!(p["records"], 20, "through node {id}: {d}");
            let held = c.status(id).unwrap()["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| {
                    x["topic"] == topic && x["partition"] == p["partition"] && x["held"] == true
                });
            assert_eq!(
                p["detail"].as_str().is_some_and(|s| s.contains("not held")),
                !held,
                "through node {id}: {d}"
            );
        }
        let group = format!("g{id}");
        let grouped = through(
            &c,
            id,
            &["consume", topic, "--group", &group, "--count", "40"],
            None,
        );
        assert_eq!(
            values(&grouped),
            (1..=40).collect(),
            "group through node {id}"
        );
    }
}

/// The standard output of `seglog ARGS --broker ADDR` with node `id`'s address
/// alone (and `input` on its standard input), which must succeed.
fn through(c: &Cluster, id: u64, args: &[&str], input: Option<&str>) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(args).args(["--broker", &c.node(id).client_addr]);
    let stdin = input.map_or_else(Stdio::null, stdin_of);
    let out = crate::util::cluster::output_within_from(cmd, stdin, PATIENCE).unwrap();
    assert!(
        out.status.success(),
        "{args:?} through node {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `input` as a child's standard input.
fn stdin_of(input: &str) -> Stdio {
    let file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut &file, input.as_bytes()).unwrap();
    std::io::Seek::rewind(&mut &file).unwrap();
    Stdio::from(file)
}

/// A paused node (SIGSTOP) keeps its connections open, yet `cluster status` on the
/// other nodes says it is not reachable within seconds (idle connections are probed:
/// no topic exists here, so no group sends it anything), and reachable again once
/// it resumes.
#[test]
fn cluster_status_sees_a_paused_node() {
    let mut c = Cluster::start(3);
    let reachable = |c: &mut Cluster, on: u64, of: u64| -> Option<bool> {
        let s = c.status(on)?;
        s["nodes"].as_array()?.iter().find(|n| n["id"] == of)?["reachable"].as_bool()
    };
    let wait_for = |c: &mut Cluster, want: bool| {
        let began = std::time::Instant::now();
        while reachable(c, 1, 3) != Some(want) || reachable(c, 2, 3) != Some(want) {
            assert!(
                began.elapsed() < PATIENCE,
                "node 3 reachable: {:?} on node 1, {:?} on node 2, want {want}",
                reachable(c, 1, 3),
                reachable(c, 2, 3)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    wait_for(&mut c, true);
    c.pause(3);
    wait_for(&mut c, false);
    c.resume(3);
    wait_for(&mut c, true);
    c.stop_all();
}
