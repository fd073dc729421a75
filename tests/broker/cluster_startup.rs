//! A cluster node's start and first contact: `--peers` lists that cannot work are
//! refused before anything is written (exit 64, one line); a cluster node's data
//! directory is not served standalone; two nodes whose `--peers` lists name
//! different nodes refuse each other's Raft connections and both say why; a client
//! whose every `--broker` address is down names them all.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::bin::BIN;
use crate::util::cluster::{free_port, output_within, Cluster};

/// Long enough for a refusal at start; a node that runs instead is killed then.
const START_LIMIT: Duration = Duration::from_secs(10);

fn serve(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .args(extra);
    cmd
}

/// Asserts that `cmd` exits 64 within [`START_LIMIT`] with one stderr line holding
/// `want`; returns the line.
fn refused_at_start(cmd: Command, what: &str, want: &str) -> String {
    let out = output_within(cmd, START_LIMIT)
        .unwrap_or_else(|| panic!("{what}: the node started instead of refusing"));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(64), "{what}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
    assert!(stderr.contains(want), "{what}: {stderr}");
    stderr
}

#[test]
fn bad_peers_lists_are_refused_before_anything_is_written() {
    let root = tempfile::tempdir().unwrap();
    let a = format!("127.0.0.1:{}", free_port());
    let b = format!("127.0.0.1:{}", free_port());
    let other_port = format!("127.0.0.1:{}", free_port());
    let cases = [
        (
            format!("1={a},2=127.0.0.1:99999"),
            a.clone(),
            "\"127.0.0.1:99999\"",
        ),
        (
            format!("1={a},2=127.0.0.1"),
            a.clone(),
            "node 2: \"127.0.0.1\"",
        ),
        (
            format!("1=127.0.0.1,2={b}"),
            a.clone(),
            "node 1: \"127.0.0.1\"",
        ),
        (format!("1={a},,2={b}"), a.clone(), "entry 2"),
        (
            format!("1={a},2={a}"),
            a.clone(),
            "nodes 1 and 2 have the same address",
        ),
        (
            format!("1={a},2={b}"),
            other_port.clone(),
            "different ports",
        ),
    ];
    for (i, (peers, raft_listen, want)) in cases.iter().enumerate() {
        let dir = root.path().join(format!("n{i}"));
        let what = format!("--peers {peers} --raft-listen {raft_listen}");
        let cmd = serve(
            &dir,
            &[
                "--node-id",
                "1",
                "--raft-listen",
                raft_listen,
                "--peers",
                peers,
            ],
        );
        let line = refused_at_start(cmd, &what, want);
        assert!(line.contains("--peers"), "{what}: {line}");
        assert!(
            !dir.join("cluster.json").exists(),
            "{what}: a cluster.json was written"
        );
    }
}

#[test]
fn a_cluster_nodes_data_dir_is_not_served_standalone() {
    let mut c = Cluster::start(2);
    let cluster_id = c.wait_cluster_id(2);
    c.stop_all();
    let dir = c.node(2).dir.clone();
    let line = refused_at_start(serve(&dir, &[]), "node 2's directory", &cluster_id);
    assert!(line.contains("as node 2"), "{line}");
    assert!(line.contains("--peers"), "{line}");
    // Nor as another node of the cluster: it would take that node's place with
    // this node's Raft logs.
    let raft = format!("127.0.0.1:{}", free_port());
    let other = format!("127.0.0.1:{}", free_port());
    let peers = format!("1={other},2={raft}");
    let line = refused_at_start(
        serve(
            &dir,
            &["--node-id", "1", "--raft-listen", &other, "--peers", &peers],
        ),
        "node 2's directory as node 1",
        "as node 2 (cluster.json), not node 1: start it with --node-id 2",
    );
    assert!(line.contains(&cluster_id), "{line}");
    // As a node, with its flags, it starts again.
    c.start_all();
    assert_eq!(c.wait_cluster_id(2), cluster_id);
}

#[test]
fn a_client_whose_every_broker_is_down_names_them_all() {
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let list = addrs.join(",");
    for args in [&["topics", "list"][..], &["cluster", "status"][..]] {
        let mut cmd = Command::new(BIN);
        cmd.args(args).args(["--broker", &list, "--timeout", "2s"]);
        let out = output_within(cmd, START_LIMIT).expect("the client ends");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(69), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "cannot connect to any broker of {}",
                addrs.join(", ")
            )),
            "{args:?}: {stderr}"
        );
    }
}

/// Waits until `text()` contains `needle` (at most `limit`).
fn comes(limit: Duration, needle: &str, text: impl Fn() -> String) -> bool {
    let began = Instant::now();
    while began.elapsed() < limit {
        if text().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn nodes_whose_peers_lists_differ_refuse_each_other_and_say_why() {
    let mut c = Cluster::prepare(3);
    // Node 2 is told of nodes 1 and 2 only.
    let short: Vec<&str> = c
        .node(2)
        .peers
        .split(',')
        .filter(|e| !e.starts_with("3="))
        .collect();
    c.node_mut(2).peers = short.join(",");
    c.start_all();
    let limit = Duration::from_secs(20);
    let want = "--peers lists differ";
    for id in [1, 2] {
        assert!(
            comes(limit, want, || c.node(id).stderr()),
            "node {id} said nothing of the lists: {}",
            c.node(id).stderr()
        );
        let line = c
            .node(id)
            .stderr()
            .lines()
            .find(|l| l.contains(want))
            .unwrap()
            .to_string();
        assert!(line.contains("lacks 3"), "node {id}: {line}");
    }
    // Nodes 1 and 3 form the cluster; node 2 adopted no cluster id.
    c.wait_cluster_id(3);
    assert!(!c.node(2).dir.join("cluster.json").exists());
}
