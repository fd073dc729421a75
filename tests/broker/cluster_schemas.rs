//! A topic's schemas in a 3-node cluster (real `seglog serve` processes): a schema
//! registered through one node is checked by the node that leads the partition, a
//! delete through a third node reaches every node, and a change made while a node is
//! down fails naming it and completes when asked again once it is back.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::process::Output;

use crate::util::cluster::Cluster;

const TOPIC: &str = "orders";

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The versions of the topic's schema node `id` lists (empty: none).
fn versions_on(c: &Cluster, id: u64) -> Vec<u64> {
    let out = c.run_on(id, &["schemas", "list", "--json"]).unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["topics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["topic"] == TOPIC)
        .map(|t| {
            t["versions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .collect()
        })
        .unwrap_or_default()
}

fn register_on(c: &Cluster, id: u64, schema: &str) -> Output {
    c.run_on(id, &["schemas", "register", TOPIC, "--file", schema])
        .unwrap()
}

fn produce_on(c: &Cluster, id: u64, value: &str) -> Output {
    c.run_on(id, &["produce", TOPIC, "--value", value]).unwrap()
}

/// Registers `schema` through node `via`; every node then lists version 1, and the
/// `leader` refuses a value the schema refuses.
fn register_and_check(c: &Cluster, via: u64, leader: u64, schema: &str) {
    let out = register_on(c, via, schema);
    assert!(out.status.success(), "{}", text(&out));
    for id in c.ids() {
        assert_eq!(versions_on(c, id), vec![1], "node {id}");
    }
    let out = produce_on(c, leader, r#"{"x":1}"#);
    assert_eq!(out.status.code(), Some(65), "{}", text(&out));
    assert!(
        text(&out).contains("does not match schema"),
        "{}",
        text(&out)
    );
}

#[test]
fn schemas_changed_through_any_node_are_checked_by_the_leader() {
    let mut c = Cluster::start(3);
    c.ok(&["topics", "create", TOPIC, "--replication-factor", "3"]);
    let leader = c.wait_leader(TOPIC, 0);
    let others: Vec<u64> = c.ids().into_iter().filter(|&i| i != leader).collect();
    let schema = c.root().join("order.json");
    std::fs::write(&schema, r#"{"type":"object","required":["id"]}"#).unwrap();
    let schema = schema.to_str().unwrap();

    // Registered through a follower; the leader refuses what the schema refuses.
    register_and_check(&c, others[0], leader, schema);
    let out = produce_on(&c, leader, r#"{"id":1}"#);
    assert!(out.status.success(), "{}", text(&out));

    // Deleted through the other follower: no node checks it any more.
    let out = c.run_on(others[1], &["schemas", "delete", TOPIC]).unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for id in c.ids() {
        assert_eq!(versions_on(&c, id), Vec::<u64>::new(), "node {id}");
    }
    let out = produce_on(&c, leader, r#"{"x":1}"#);
    assert!(out.status.success(), "{}", text(&out));

    // A node down: the change fails naming it, and asking again once it is back
    // completes it.
    let down = others[1];
    c.stop(down);
    let out = register_on(&c, others[0], schema);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains(&format!("on every node but node(s) [{down}]"))
            && said.contains("run the same command again"),
        "{said}"
    );
    c.restart(down);
    c.wait_cluster_id(down);
    // (Deleting every version dropped the topic's entry: numbering starts again.)
    register_and_check(&c, others[0], leader, schema);
    c.stop_all();
}
