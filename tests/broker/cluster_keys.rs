//! API keys in a 3-node cluster with `--auth required` (real `seglog serve`
//! processes): a key created through one node logs in through every node, a key
//! revoked through another is refused by all, a create that cannot reach every node
//! creates nothing, and a revoke that cannot is named and finished when asked again.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::bin::BIN;
use crate::util::cluster::Cluster;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Writes a token to a 0600 file.
fn token_file(dir: &Path, name: &str, token: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, token.trim()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `args` against node `id` alone, logged in with `token`.
fn on(c: &Cluster, id: u64, token: &Path, args: &[&str]) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--token-file", token.to_str().unwrap()]);
    c.run_on(id, &all).unwrap()
}

/// The names of the keys node `id` lists.
fn names_on(c: &Cluster, id: u64, admin: &Path) -> Vec<String> {
    let out = on(c, id, admin, &["keys", "list", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut names: Vec<String> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Creates a producer key through node `id`; its token file.
fn create_producer(c: &Cluster, id: u64, admin: &Path, name: &str) -> Output {
    on(
        c,
        id,
        admin,
        &[
            "keys", "create", "--name", name, "--role", "producer", "--topic", "*",
        ],
    )
}

/// The first admin key, made offline on node 1's directory and copied to every
/// node's (`api_keys.json`), as the README says; its token file.
fn give_first_key(c: &Cluster) -> PathBuf {
    let first = c.node(1).dir.clone();
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(first.join("topics"))
        .unwrap();
    let out = Command::new(BIN)
        .args(["keys", "create", "--data-dir", first.to_str().unwrap()])
        .args(["--name", "ops", "--role", "admin"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let admin = token_file(
        c.root(),
        "ops.token",
        &String::from_utf8(out.stdout).unwrap(),
    );
    for id in [2, 3] {
        let dir = c.node(id).dir.clone();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(dir.join("topics"))
            .unwrap();
        std::fs::copy(first.join("api_keys.json"), dir.join("api_keys.json")).unwrap();
    }
    admin
}

#[test]
fn keys_created_or_revoked_through_one_node_hold_on_every_node() {
    let mut c = Cluster::prepare(3);
    let admin = give_first_key(&c);
    for id in c.ids() {
        c.node_mut(id).args = vec!["--auth".into(), "required".into()];
    }
    c.start_all();
    let out = on(
        &c,
        1,
        &admin,
        &["topics", "create", "t", "--replication-factor", "3"],
    );
    assert!(out.status.success(), "{}", text(&out));

    // Created through node 2: every node has it, and it logs in through each.
    let out = create_producer(&c, 2, &admin, "app");
    assert!(out.status.success(), "{}", text(&out));
    let app = token_file(
        c.root(),
        "app.token",
        &String::from_utf8(out.stdout.clone()).unwrap(),
    );
    let app_id = {
        let t = std::fs::read_to_string(&app).unwrap();
        t.split('_').nth(1).unwrap().to_string()
    };
    for id in c.ids() {
        assert_eq!(names_on(&c, id, &admin), ["app", "ops"], "node {id}");
        let out = on(&c, id, &app, &["produce", "t", "--value", "x"]);
        assert!(out.status.success(), "node {id}: {}", text(&out));
    }

    // Revoked through node 3: refused by every node.
    let out = on(&c, 3, &admin, &["keys", "revoke", &app_id]);
    assert!(out.status.success(), "{}", text(&out));
    for id in c.ids() {
        assert_eq!(names_on(&c, id, &admin), ["ops"], "node {id}");
        let out = on(&c, id, &app, &["produce", "t", "--value", "x"]);
        assert_eq!(out.status.code(), Some(77), "node {id}: {}", text(&out));
    }

    // Node 3 down: a create makes nothing, anywhere; a revoke is named.
    let out = create_producer(&c, 1, &admin, "kept");
    assert!(out.status.success(), "{}", text(&out));
    let kept = String::from_utf8(out.stdout).unwrap();
    let kept_id = kept.trim().split('_').nth(1).unwrap().to_string();
    c.stop(3);
    let out = create_producer(&c, 1, &admin, "late");
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(
        text(&out).contains("no key created: node(s) [3] did not answer"),
        "{}",
        text(&out)
    );
    assert!(
        !text(&out).contains("sgk_"),
        "a token was shown: {}",
        text(&out)
    );
    for id in [1, 2] {
        assert_eq!(names_on(&c, id, &admin), ["kept", "ops"], "node {id}");
    }
    let out = on(&c, 2, &admin, &["keys", "revoke", &kept_id]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert!(
        text(&out).contains("revoked on every node but node(s) [3], which still accept it"),
        "{}",
        text(&out)
    );
    c.restart(3);
    let began = std::time::Instant::now();
    while !on(&c, 3, &admin, &["cluster", "status", "--json"])
        .status
        .success()
    {
        assert!(
            began.elapsed() < crate::util::serve::PATIENCE,
            "node 3 does not answer"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(names_on(&c, 3, &admin), ["kept", "ops"]);
    // Asked again (through a node that no longer has the key), it finishes.
    let out = on(&c, 1, &admin, &["keys", "revoke", &kept_id]);
    assert!(out.status.success(), "{}", text(&out));
    for id in c.ids() {
        assert_eq!(names_on(&c, id, &admin), ["ops"], "node {id}");
    }
    c.stop_all();
}

#[test]
fn a_session_without_a_login_makes_no_key_in_a_cluster() {
    // No key anywhere yet: the nodes serve without logins, but a key made through
    // one would be taken by all, so none is made.
    let mut c = Cluster::start(3);
    let out = c
        .run_on(2, &["keys", "create", "--name", "x", "--role", "admin"])
        .unwrap();
    assert_eq!(out.status.code(), Some(77), "{}", text(&out));
    assert!(
        text(&out).contains("created and revoked by a session logged in with an admin key"),
        "{}",
        text(&out)
    );
    for id in c.ids() {
        assert!(
            !c.node(id).dir.join("api_keys.json").exists(),
            "node {id} has a key file"
        );
    }
    c.stop_all();
}

#[test]
fn a_node_without_keys_requires_logins_when_its_cluster_does() {
    // The first key copied to nodes 1 and 2 only (node 3's directory was replaced,
    // or the copy forgotten); no --auth flag anywhere: node 3 holds no key, yet once
    // it has met a peer that requires logins it serves no session without one.
    let mut c = Cluster::prepare(3);
    let admin = give_first_key(&c);
    std::fs::remove_file(c.node(3).dir.join("api_keys.json")).unwrap();
    c.start_all();
    assert!(
        c.node(3)
            .serve()
            .stderr_gets("requires logins: this node now requires them too"),
        "{}",
        c.node(3).stderr()
    );
    let out = c.run_on(3, &["topics", "list"]).unwrap();
    assert_eq!(out.status.code(), Some(77), "{}", text(&out));
    let out = c
        .run_on(3, &["topics", "create", "t", "--replication-factor", "3"])
        .unwrap();
    assert_eq!(out.status.code(), Some(77), "{}", text(&out));
    // The nodes that hold the key serve its sessions, and nothing was created.
    let out = on(&c, 1, &admin, &["topics", "list"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = on(&c, 1, &admin, &["topics", "describe", "t"]);
    assert!(!out.status.success(), "{}", text(&out));
    c.stop_all();
}
