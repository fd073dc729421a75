//! The fsync fault (`SEGLOG_FAULT_FSYNC_FAIL`) in a real `seglog serve`: fsyncs of
//! one partition fail, that partition fail-stops, the others go on; on a cluster
//! the other replicas go on, and clients move past the failed node.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use seglog::engine::net::client::{Client, ClientError};
use seglog::engine::storage::io::FAULT_FSYNC_ENV;
use seglog::format::wire::{ErrorCode, PartitionBatch, WireRecord};

use crate::util::bin::{json_lines, BIN};
use crate::util::cluster::{partition_status, Cluster};
use crate::util::serve::{Serve, PATIENCE};

fn batch(partition: u32, value: &[u8]) -> Vec<PartitionBatch<'_>> {
    vec![PartitionBatch {
        partition,
        records: vec![WireRecord {
            timestamp_ms: 1,
            key: None,
            value,
        }],
    }]
}

#[test]
fn a_failing_fsync_fail_stops_only_its_partition() {
    let dir = tempfile::tempdir().unwrap();
    let b = Serve::start(dir.path());
    b.ok(&["topics", "create", "f", "--partitions", "2"]);
    b.stop();

    // Files in partition 0's directory: opening it fsyncs its one (active) segment
    // once, so the second fsync is the first produce's group commit.
    let needle = format!("{}/topics/f/0/", dir.path().display());
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("SEGLOG_FAULT_FSYNC_FAIL", format!("{needle}:2"));
    let b = Serve::spawn(cmd);
    let mut c = Client::connect(&b.addr, Duration::from_secs(30)).unwrap();

    let ok = c.produce("f", batch(1, b"fine")).unwrap();
    assert_eq!(ok[0].result, Ok((0, 0)));
    let failed = c.produce("f", batch(0, b"lost")).unwrap();
    let Err((code, message)) = &failed[0].result else {
        panic!("a produce whose fsync failed was acknowledged: {failed:?}");
    };
    assert!(
        [ErrorCode::STORAGE, ErrorCode::PARTITION_FAILED].contains(code),
        "{code:?} {message}"
    );
    // Fail-stopped: the next produce to it is refused without another try.
    let again = c.produce("f", batch(0, b"again")).unwrap();
    assert!(
        matches!(again[0].result, Err((code, _)) if code == ErrorCode::PARTITION_FAILED),
        "{again:?}"
    );
    // The other partition goes on.
    let ok = c.produce("f", batch(1, b"still")).unwrap();
    assert_eq!(ok[0].result, Ok((1, 1)));
    drop(c);
    drop(b);

    // Without the fault, a restart serves partition 0 again; nothing unacknowledged
    // is served as if it had been acknowledged at another offset.
    let b = Serve::start(dir.path());
    let mut c = Client::connect(&b.addr, Duration::from_secs(30)).unwrap();
    let ok = c.produce("f", batch(0, b"after")).unwrap();
    let Ok((base, _)) = ok[0].result else {
        panic!("{ok:?}");
    };
    assert!(base <= 1, "{base}");
}

/// Until node `want` leads `topic`/0: the leader, when another node, is stopped
/// (its followers elect a new one) and restarted. Node `want` itself is never
/// restarted (that would start its fault's fsync count again).
fn lead(c: &mut Cluster, topic: &str, want: u64) {
    for _ in 0..20 {
        let leader = c.wait_leader(topic, 0);
        if leader == want {
            return;
        }
        c.stop(leader);
        let began = Instant::now();
        while c.leader(topic, 0).is_none_or(|l| l == leader) {
            assert!(began.elapsed() < PATIENCE, "{}", c.describe());
            std::thread::sleep(Duration::from_millis(50));
        }
        c.restart(leader);
    }
    panic!("node {want} never led {topic}/0: {}", c.describe());
}

/// The `seglog produce --json` acks: (input index, offset).
fn acks_of(stdout: &str) -> Vec<(u64, u64)> {
    json_lines(stdout)
        .iter()
        .filter(|v| v["type"] == "ack")
        .map(|v| (v["seq"].as_u64().unwrap(), v["offset"].as_u64().unwrap()))
        .collect()
}

/// A leader whose data partition's fsync fails at apply: its partition fail-stops
/// and the other two elect a leader. The failed node must not go on presenting
/// itself as the leader nor refuse requests as if the partition were lost: it
/// answers NOT_LEADER, so a producer and a consumer whose broker list starts with
/// it move on. The produce whose entry was proposed when the group stopped has an
/// unknown outcome (the others commit it): the producer's retry is a duplicate,
/// so every record is written once.
#[test]
fn a_leader_whose_fsync_fails_sends_clients_on_to_the_new_leader() {
    const TOPIC: &str = "fz";
    // Fsyncs of node 1's data partition of fz/0 (the topic's creation and the
    // first records' group commits come first) fail from the 12th on.
    let mut c = Cluster::prepare(3);
    let needle = format!("{}/topics/{TOPIC}/0/", c.node(1).dir.display());
    c.node_mut(1).env = vec![(FAULT_FSYNC_ENV.into(), format!("{needle}:12"))];
    c.start_all();
    c.create_topic(TOPIC, 1, 3);
    lead(&mut c, TOPIC, 1);

    // One idempotent producer, one record per request, node 1 first in its list.
    assert!(c.brokers().starts_with(&c.node(1).client_addr));
    let input: String = (0..30).map(|i| format!("v{i}\n")).collect();
    let out = c.ok_with_stdin(
        &[
            "produce",
            TOPIC,
            "--partition",
            "0",
            "--batch",
            "1",
            "--json",
        ],
        &input,
    );
    let mut acked: BTreeMap<u64, String> = BTreeMap::new();
    for (seq, offset) in acks_of(&out) {
        assert!(acked.insert(offset, format!("v{seq}")).is_none(), "{out}");
    }
    assert_eq!(acked.len(), 30, "{out}");

    // The fault did hit node 1 while it led: its replica is shown failed, not
    // leading; the others have a leader of their own.
    assert!(
        c.node(1).serve().stderr_gets("Input/output error"),
        "the fault never hit node 1: {}",
        c.node(1).stderr()
    );
    let s = c.status(1).expect("node 1 answers its status");
    let row = partition_status(&s, TOPIC, 0)
        .expect("node 1's row of fz/0")
        .clone();
    assert!(row["failed"].is_string(), "{row}");
    assert_ne!(row["leader"].as_u64(), Some(1), "{row}");
    let leader = c.wait_leader(TOPIC, 0);
    assert_ne!(leader, 1);

    // Asked directly, node 1 refuses produce and fetch with NOT_LEADER (no longer
    // partition_failed, which clients take as final).
    let mut direct = Client::connect(&c.node(1).client_addr, Duration::from_secs(10)).unwrap();
    let refused = direct.produce(TOPIC, batch(0, b"direct")).unwrap();
    assert!(
        matches!(&refused[0].result, Err((code, _)) if *code == ErrorCode::NOT_LEADER),
        "{refused:?}"
    );
    match direct.fetch(TOPIC, 0, 0, 1 << 20, Duration::ZERO) {
        Err(ClientError::Refused {
            code: ErrorCode::NOT_LEADER,
            ..
        }) => {}
        other => panic!("node 1 answered a fetch with {other:?}"),
    }

    // A new producer through the same list is acknowledged by the new leader.
    let out = c.ok_with_stdin(&["produce", TOPIC, "--partition", "0", "--json"], "after\n");
    let after = acks_of(&out);
    assert_eq!(after.len(), 1, "{out}");
    assert!(acked.insert(after[0].1, "after".into()).is_none(), "{out}");

    // Read through the same list: every acknowledged record once, at its offset,
    // and nothing else (no record written twice).
    let out = c.ok(&["consume", TOPIC, "--from", "earliest", "--json"]);
    let read: Vec<(u64, String)> = json_lines(&out)
        .iter()
        .filter(|v| v["type"] == "record")
        .map(|v| {
            (
                v["offset"].as_u64().unwrap(),
                v["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(u64, String)> = acked.into_iter().collect();
    assert_eq!(read, expected, "{out}");
}
