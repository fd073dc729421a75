//! Creating a replicated topic on three real `seglog serve` processes: with a node
//! down the create says which nodes have the topic and to ask again, and asking
//! again once the node is back finishes it (its partition gets a leader); a create
//! of a topic that exists is refused with topic_exists naming what differs. `seglog
//! bench produce` stopped by the leader's death reports what was acknowledged.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::util::bin::BIN;
use crate::util::cluster::{output_within, Cluster};
use crate::util::serve::PATIENCE;

/// `seglog ARGS` with `--broker` naming every node, bounded by [`PATIENCE`].
fn run(c: &Cluster, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).args(["--broker", &c.brokers()]);
    output_within(cmd, PATIENCE).expect("ended in time")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_create_with_a_node_down_names_what_it_left_and_the_same_create_finishes_it() {
    let mut c = Cluster::start(3);
    let create = ["topics", "create", "down3", "--replication-factor", "3"];
    c.kill9(3);
    let out = run(&c, &create);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("created on node(s) [1, 2] only"), "{err}");
    assert!(
        err.contains("run the same `topics create` again once node(s) [3] answer"),
        "{err}"
    );

    // Node 3 back: the same create finishes the topic, whose partition gets a leader.
    c.restart(3);
    let out = run(&c, &create);
    assert!(out.status.success(), "{}", stderr(&out));
    c.wait_leader("down3", 0);
    c.ok_with_stdin(&["produce", "down3"], "a\n");
    assert!(c.node(3).dir.join("topics").join("down3").is_dir());
    c.stop_all();
}

#[test]
fn a_create_of_an_existing_replicated_topic_is_refused_naming_what_differs() {
    let mut c = Cluster::start(3);
    c.ok(&["topics", "create", "orders", "--replication-factor", "3"]);
    c.wait_leader("orders", 0);
    // The same create again: the topic exists, as for a standalone topic.
    let out = run(
        &c,
        &["topics", "create", "orders", "--replication-factor", "3"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("topic \"orders\" already exists"), "{err}");
    assert!(err.contains("topic_exists (12)"), "{err}");
    // Other settings are named, and nothing changes.
    let out = run(
        &c,
        &[
            "topics",
            "create",
            "orders",
            "--replication-factor",
            "3",
            "--partitions",
            "2",
            "--config",
            "retention_ms=1000",
        ],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("1 partition (not 2)"), "{err}");
    assert!(err.contains("retention_ms=604800000 (not 1000)"), "{err}");
    let described = c.ok(&["topics", "describe", "orders", "--json"]);
    assert!(!described.contains("\"retention_ms\":1000,"), "{described}");
    c.stop_all();
}

#[test]
fn bench_produce_stopped_by_the_leaders_death_reports_what_was_acknowledged() {
    let mut c = Cluster::start(3);
    // The bench creates its topic with the replication factor asked (no records:
    // its load goes where the leader was before the topic existed).
    let out = run(
        &c,
        &[
            "bench",
            "produce",
            "--topic",
            "bt",
            "--records",
            "0",
            "--batch",
            "10",
            "--replication-factor",
            "3",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    for n in &c.nodes {
        assert!(
            n.dir.join("topics/bt/replication.json").is_file(),
            "node {}",
            n.id
        );
    }
    let leader = c.wait_leader("bt", 0);

    // With the leader's address alone there is no other node to follow the
    // partition to (with every node's, the run goes on: cluster_bench.rs).
    let mut bench = Command::new(BIN)
        .args([
            "bench", "produce", "--topic", "bt", "--json", "--batch", "1",
        ])
        .args([
            "--records",
            "100000000",
            "--broker",
            &c.node(leader).client_addr,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    c.kill9(leader);
    let began = std::time::Instant::now();
    while bench.try_wait().unwrap().is_none() {
        if began.elapsed() > PATIENCE {
            let _ = bench.kill();
            panic!("the bench did not end after its leader's death");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = bench.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("record(s) acknowledged"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert!(report["records"].as_u64().unwrap() > 0, "{report}");
    assert!(report["stopped"].is_string(), "{report}");
    c.stop_all();
}
