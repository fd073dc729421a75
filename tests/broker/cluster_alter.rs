//! Altering a replicated topic on three real `seglog serve` processes: the settings
//! reach every node holding a replica, whichever of them is asked; with a holder down the alter stops there and says which nodes have
//! the new settings, and asking again completes it; the cleanup policy stays as
//! created. A node holding no replica finds the holders and alters or deletes the
//! topic there, and sends produce, consume and describe to a holder.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Output};

use serde_json::Value;

use crate::util::bin::BIN;
use crate::util::cluster::Cluster;

const TOPIC: &str = "altered";

/// `seglog ARGS` through node `id` alone.
fn through(c: &Cluster, id: u64, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .args(["--broker", &c.node(id).client_addr])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// `seglog topics alter TOPIC --config SETTING --json` through node `id` alone.
fn alter_through(c: &Cluster, id: u64, setting: &str) -> Output {
    through(
        c,
        id,
        &["topics", "alter", TOPIC, "--config", setting, "--json"],
    )
}

/// Node `id`'s `topic.json` config value of `key` (`None`: no replica there).
fn config_on(c: &Cluster, id: u64, key: &str) -> Option<serde_json::Value> {
    let file = c.node(id).dir.join("topics").join(TOPIC).join("topic.json");
    let bytes = std::fs::read(file).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    Some(v["config"][key].clone())
}

#[test]
fn a_replicated_topic_is_altered_on_every_replica_and_an_alter_cut_short_completes() {
    let mut c = Cluster::start(3);
    c.ok(&["topics", "create", TOPIC, "--replication-factor", "2"]);
    c.wait_leader(TOPIC, 0);
    let holders: Vec<u64> = (1..=3)
        .filter(|id| config_on(&c, *id, "retention_ms").is_some())
        .collect();
    assert_eq!(holders.len(), 2, "{holders:?}");
    let outsider = (1..=3).find(|id| !holders.contains(id)).unwrap();

    // Asked through either holder: both replicas change.
    let out = alter_through(&c, holders[1], "retention_ms=3600000");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["config"]["retention_ms"], 3_600_000, "{answer}");
    for id in &holders {
        assert_eq!(
            config_on(&c, *id, "retention_ms"),
            Some(3_600_000.into()),
            "node {id}"
        );
    }
    assert_eq!(config_on(&c, outsider, "retention_ms"), None);

    // A holder down: the alter through the other holder changes that one, names the
    // node it could not reach, and completes when asked again.
    let (asked, down) = (holders[0], holders[1]);
    c.stop(down);
    let out = alter_through(&c, asked, "max_record_bytes=4096");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "altered with node {down} down: {err}"
    );
    assert!(err.contains(&format!("node {down}")), "{err}");
    assert!(err.contains(&format!("[{asked}]")), "{err}");
    assert_eq!(config_on(&c, asked, "max_record_bytes"), Some(4096.into()));
    c.restart(down);
    assert_eq!(
        config_on(&c, down, "max_record_bytes"),
        Some(1_048_576.into())
    );
    let out = alter_through(&c, asked, "max_record_bytes=4096");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in &holders {
        assert_eq!(config_on(&c, *id, "max_record_bytes"), Some(4096.into()));
        assert_eq!(config_on(&c, *id, "retention_ms"), Some(3_600_000.into()));
    }

    // The cleanup policy is refused, and nothing changes.
    let out = alter_through(&c, asked, "cleanup_policy=compact");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cleanup_policy"), "{err}");
    for id in &holders {
        assert_eq!(config_on(&c, *id, "cleanup_policy"), Some("delete".into()));
    }

    // Through the node holding no replica: it asks the others where the topic is,
    // then alters both replicas and answers the first holder's configuration.
    let out = alter_through(&c, outsider, "retention_ms=7200000");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["config"]["retention_ms"], 7_200_000, "{answer}");
    assert_eq!(answer["config"]["max_record_bytes"], 4096, "{answer}");
    for id in &holders {
        assert_eq!(config_on(&c, *id, "retention_ms"), Some(7_200_000.into()));
    }
    assert_eq!(config_on(&c, outsider, "retention_ms"), None);
    // A bad setting is refused by the first holder before any replica changes.
    let out = alter_through(&c, outsider, "retention_ms=soon");
    assert!(!out.status.success());
    for id in &holders {
        assert_eq!(config_on(&c, *id, "retention_ms"), Some(7_200_000.into()));
    }

    // A topic no node holds is unknown (exit 69), through the outsider too.
    let out = through(
        &c,
        outsider,
        &["topics", "alter", "nowhere", "--config", "retention_ms=1"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("unknown topic nowhere"), "{err}");

    // Produce, consume and describe through the outsider alone: it names a holder,
    // and the clients move there (a follower names the leader in turn).
    for value in ["one", "two"] {
        let out = through(
            &c,
            outsider,
            &["produce", TOPIC, "--value", value, "--json"],
        );
        assert!(
            out.status.success(),
            "produce through node {outsider}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ack: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(ack["type"], "ack", "{ack}");
    }
    let out = through(&c, outsider, &["consume", TOPIC, "--json"]);
    assert!(
        out.status.success(),
        "consume through node {outsider}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let values: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["value"].clone())
        .collect();
    assert_eq!(values, ["one", "two"]);
    let out = through(&c, outsider, &["topics", "describe", TOPIC, "--json"]);
    assert!(
        out.status.success(),
        "describe through node {outsider}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["partitions"][0]["end_offset"], 2, "{d}");
    // The native answer itself: NOT_LEADER naming a holder.
    let mut raw = seglog::engine::net::client::Client::connect(
        &c.node(outsider).client_addr,
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    match raw.list_offsets(TOPIC) {
        Err(seglog::engine::net::client::ClientError::Refused { code, message, .. }) => {
            assert_eq!(
                code,
                seglog::format::wire::ErrorCode::NOT_LEADER,
                "{message}"
            );
            let (named, _) = seglog::format::wire::parse_not_leader(&message).unwrap();
            assert!(holders.contains(&named), "{message}");
        }
        other => panic!("list-offsets through node {outsider}: {other:?}"),
    }
    // A topic no node holds stays unknown for reads (exit 69).
    let out = through(&c, outsider, &["consume", "nowhere"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("unknown topic"), "{err}");

    // Deleted through the outsider: both replicas go.
    let out = through(&c, outsider, &["topics", "delete", TOPIC]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in 1..=3 {
        assert!(
            !c.node(id).dir.join("topics").join(TOPIC).exists(),
            "node {id} still has the topic"
        );
    }
}
