//! TLS on the Raft connections (`serve --raft-tls-cert/--raft-tls-key/--raft-tls-ca`),
//! with real `seglog serve` processes whose links go through proxies that watch the
//! bytes: a cluster replicates over TLS and no record crosses a link in the clear
//! (the same record does on a plaintext cluster); a node without TLS, or with a
//! certificate another CA signed, or with one that does not name its host, is
//! refused and both sides say why on stderr; with the cluster's certificate again it
//! catches up; with certificates that name their node ids (`seglog-node-N`), one
//! naming the host only is refused; bad TLS files, and a certificate naming another
//! node's id, stop `serve` before it starts.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::path::{Path, PathBuf};
use std::process::Command;

use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};

use crate::cli_tls::{ca, issue, write_ca};
use crate::util::bin::BIN;
use crate::util::cluster::Cluster;

/// What every Raft TLS refusal names.
const FLAGS: &str = "--raft-tls-cert/--raft-tls-key/--raft-tls-ca";

struct Files {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    node: (PathBuf, PathBuf),
    stranger: (PathBuf, PathBuf),
    server_only: (PathBuf, PathBuf),
    /// The cluster CA's certificate for a host no node has.
    elsewhere: (PathBuf, PathBuf),
    /// Node N's own certificate (index N - 1): 127.0.0.1 and `seglog-node-N`.
    own: Vec<(PathBuf, PathBuf)>,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let root = ca("cluster CA");
    let other = ca("another CA");
    // One certificate for every node: each is dialled at 127.0.0.1 (its proxy).
    let node = issue(
        dir.path(),
        &root,
        "node",
        &["127.0.0.1"],
        &[ServerAuth, ClientAuth],
    );
    let stranger = issue(
        dir.path(),
        &other,
        "stranger",
        &["127.0.0.1"],
        &[ServerAuth, ClientAuth],
    );
    let server_only = issue(
        dir.path(),
        &root,
        "server-only",
        &["127.0.0.1"],
        &[ServerAuth],
    );
    let elsewhere = issue(
        dir.path(),
        &root,
        "elsewhere",
        &["node9.invalid"],
        &[ServerAuth, ClientAuth],
    );
    let own = (1..=3)
        .map(|n| {
            issue(
                dir.path(),
                &root,
                &format!("node{n}"),
                &["127.0.0.1", &format!("seglog-node-{n}")],
                &[ServerAuth, ClientAuth],
            )
        })
        .collect();
    Files {
        ca: write_ca(dir.path(), &root, "ca"),
        own,
        elsewhere,
        node,
        stranger,
        server_only,
        _dir: dir,
    }
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn tls_args(cert: &(PathBuf, PathBuf), ca: &Path) -> Vec<String> {
    vec![
        "--raft-tls-cert".into(),
        s(&cert.0),
        "--raft-tls-key".into(),
        s(&cert.1),
        "--raft-tls-ca".into(),
        s(ca),
    ]
}

fn restart_with(c: &mut Cluster, id: u64, args: Vec<String>) {
    c.stop(id);
    c.node_mut(id).args = args;
    c.restart(id);
}

/// Watches every link of the cluster for `needle`.
fn watch(c: &Cluster, needle: &str) {
    for a in c.ids() {
        for b in c.ids() {
            if a != b {
                c.link(a, b).watch_for(needle.as_bytes());
            }
        }
    }
}

/// The links (from, to) that carried the needle of [`watch`].
fn links_that_saw(c: &Cluster) -> Vec<(u64, u64)> {
    let mut saw = Vec::new();
    for a in c.ids() {
        for b in c.ids() {
            if a != b && c.link(a, b).saw() {
                saw.push((a, b));
            }
        }
    }
    saw
}

#[test]
fn a_cluster_replicates_over_tls_and_refuses_nodes_without_its_ca() {
    let f = files();
    let mut c = Cluster::prepare(3);
    for node in &mut c.nodes {
        node.args = tls_args(&f.node, &f.ca);
    }
    c.start_all();
    c.create_topic("t", 1, 3);
    let secret = "tls-needle-5f0c1e";
    watch(&c, secret);
    c.ok_with_stdin(&["produce", "t"], &format!("{secret}-a\n{secret}-b\n"));
    c.wait_caught_up("t", 1);
    assert_eq!(
        links_that_saw(&c),
        Vec::<(u64, u64)>::new(),
        "a record crossed a link in the clear"
    );
    let out = c.ok(&["consume", "t", "--from", "earliest", "--count", "2"]);
    assert!(out.contains(&format!("{secret}-b")), "{out}");

    // Node 3 without TLS: its peers refuse it, and it refuses theirs; both say why.
    restart_with(&mut c, 3, Vec::new());
    assert!(
        c.node(3)
            .serve()
            .stderr_gets(&format!("requires it ({FLAGS})")),
        "{}",
        c.node(3).stderr()
    );
    assert!(
        c.node(3)
            .serve()
            .stderr_gets("dials with TLS and node 3 has no"),
        "{}",
        c.node(3).stderr()
    );
    assert!(
        c.node(1)
            .serve()
            .stderr_gets("dials without TLS and node 1 requires it"),
        "{}",
        c.node(1).stderr()
    );
    // The two others go on.
    c.ok_with_stdin(&["produce", "t"], "c\n");

    // Node 3 with a certificate another CA signed: refused both ways.
    restart_with(&mut c, 3, tls_args(&f.stranger, &f.ca));
    assert!(
        c.node(1)
            .serve()
            .stderr_gets("its certificate must be signed by this node's --raft-tls-ca"),
        "{}",
        c.node(1).stderr()
    );
    assert!(
        c.node(3)
            .serve()
            .stderr_gets("the TLS handshake with 127.0.0.1"),
        "{}",
        c.node(3).stderr()
    );
    assert!(c.node(3).stderr().contains(FLAGS), "{}", c.node(3).stderr());

    // A certificate that cannot be a client's: the acceptor refuses it when dialled.
    restart_with(&mut c, 3, tls_args(&f.server_only, &f.ca));
    assert!(
        c.node(3).serve().stderr_gets(FLAGS),
        "{}",
        c.node(3).stderr()
    );

    // The cluster CA's certificate for another host: node 3's hello says it is node
    // 3, whose address in --peers is 127.0.0.1, and its certificate does not name
    // that host, so its peers refuse it as a dialer (and it is refused as an
    // acceptor by the dialer's own check).
    restart_with(&mut c, 3, tls_args(&f.elsewhere, &f.ca));
    assert!(
        c.node(1)
            .serve()
            .stderr_gets("node 3's TLS certificate does not name 127.0.0.1, the host of its address in --peers ("),
        "{}",
        c.node(1).stderr()
    );
    assert!(c.node(1).stderr().contains(FLAGS), "{}", c.node(1).stderr());

    // With the cluster's certificate again node 3 catches up.
    restart_with(&mut c, 3, tls_args(&f.node, &f.ca));
    c.wait_caught_up("t", 1);

    // Certificates that name their node ids: a node whose own does requires its
    // peers' to name theirs. Node 3 with the shared certificate (its host only) is
    // refused as a dialer, and as an acceptor by its peers' dials.
    c.stop_all();
    for id in c.ids() {
        c.node_mut(id).args = tls_args(&f.own[id as usize - 1], &f.ca);
    }
    c.start_all();
    c.ok_with_stdin(&["produce", "t"], "d\n");
    restart_with(&mut c, 3, tls_args(&f.node, &f.ca));
    assert!(
        c.node(1)
            .serve()
            .stderr_gets("node 3's TLS certificate does not name seglog-node-3, its node id"),
        "{}",
        c.node(1).stderr()
    );
    assert!(c.node(1).stderr().contains(FLAGS), "{}", c.node(1).stderr());
    c.ok_with_stdin(&["produce", "t"], "e\n");
    restart_with(&mut c, 3, tls_args(&f.own[2], &f.ca));
    c.wait_caught_up("t", 1);
    c.stop_all();
    let replica = c.dump(3, "t", 1);
    assert_eq!(replica.records.len(), 5, "{:?}", replica.records);

    // The control: on the same cluster without TLS the watched bytes are seen, so
    // the watch above could fail.
    for id in c.ids() {
        c.node_mut(id).args = Vec::new();
    }
    c.start_all();
    let plain = "plain-needle-93ab";
    watch(&c, plain);
    c.ok_with_stdin(&["produce", "t"], &format!("{plain}\n"));
    c.wait_caught_up("t", 1);
    assert!(!links_that_saw(&c).is_empty(), "the watch saw nothing");
    c.stop_all();
}

#[test]
fn bad_raft_tls_files_are_refused_before_serving() {
    let f = files();
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let run = |extra: &[String]| {
        let out = Command::new(BIN)
            .args([
                "serve",
                "--data-dir",
                dir.path().join("data").to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--node-id",
                "1",
                "--raft-listen",
                "127.0.0.1:0",
                "--peers",
                "1=127.0.0.1:1,2=127.0.0.1:2",
            ])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let missing = (dir.path().join("missing.crt"), f.node.1.clone());
    let (code, err) = run(&tls_args(&missing, &f.ca));
    assert_eq!(code, Some(74), "{err}");
    assert!(err.contains("missing.crt"), "{err}");
    assert!(err.contains("--raft-tls-"), "{err}");
    let (code, err) = run(&tls_args(&f.node, &empty));
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("empty.pem"), "{err}");
    // Node 1 with node 2's certificate (it names seglog-node-2).
    let (code, err) = run(&tls_args(&f.own[1], &f.ca));
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("node2.crt: names seglog-node-2, the id of node 2: give each node"),
        "{err}"
    );
    // One flag without the others.
    let (code, err) = run(&["--raft-tls-cert".to_string(), s(&f.node.0)]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--raft-tls-key"), "{err}");
    assert!(
        !dir.path().join("data").join("cluster.json").exists(),
        "nothing was written"
    );
}
