//! A cluster's consumer groups live in the replicated offsets topic
//! (`__consumer_offsets`), coordinated by the leader of its partition: a group's
//! committed offsets survive a SIGKILL of the node that coordinated it (before, a
//! group lived on the node its members first asked, and its offsets died with it),
//! a member reading across that kill goes on, and every node answers group
//! requests by sending the client to the coordinator.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::process::{Command, Stdio};

use crate::util::bin::BIN;
use crate::util::cluster::{output_within, output_within_from, Cluster};
use crate::util::serve::PATIENCE;

const TOPIC: &str = "orders";
const OFFSETS: &str = "__consumer_offsets";

fn lines(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("{i}\n")).collect()
}

fn values(out: &str) -> Vec<u32> {
    out.lines().map(|l| l.parse::<u32>().unwrap()).collect()
}

/// The committed offset of `group` for `TOPIC`/0 as `groups describe --json`
/// through node `id` alone gives it.
fn committed_through(c: &Cluster, id: u64, group: &str) -> u64 {
    let out = c
        .run_on(id, &["groups", "describe", group, "--json"])
        .expect("groups describe answers");
    assert!(
        out.status.success(),
        "groups describe through node {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["topic"] == TOPIC && o["partition"] == 0)
        .and_then(|o| o["committed"].as_u64())
        .unwrap_or_else(|| panic!("no committed offset in {v}"))
}

#[test]
fn a_group_keeps_its_committed_offsets_when_its_coordinator_is_killed() {
    let mut c = Cluster::start(3);
    c.create_topic(TOPIC, 1, 3);
    c.ok_with_stdin(&["produce", TOPIC], &lines(1, 30));
    let first = c.ok(&[
        "consume", TOPIC, "--group", "g", "--from", "earliest", "--count", "8",
    ]);
    assert_eq!(values(&first), (1..=8).collect::<Vec<_>>());
    let coordinator = c.wait_leader(OFFSETS, 0);
    // Clients neither write the offsets topic nor delete it.
    for args in [
        &["produce", OFFSETS][..],
        &["topics", "delete", OFFSETS][..],
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(args).args(["--broker", &c.brokers()]);
        let file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut &file, b"a record\n").unwrap();
        std::io::Seek::rewind(&mut &file).unwrap();
        let out = output_within_from(cmd, Stdio::from(file), PATIENCE).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("holds the cluster's consumer groups"),
            "{args:?}: {stderr}"
        );
    }
    // Every node answers for the group, whichever it is asked through.
    for id in c.ids() {
        assert_eq!(committed_through(&c, id, "g"), 8, "through node {id}");
    }

    c.kill9(coordinator);
    let next = c.ok(&[
        "consume", TOPIC, "--group", "g", "--from", "earliest", "--count", "5",
    ]);
    assert_eq!(
        values(&next),
        (9..=13).collect::<Vec<_>>(),
        "the group goes on from its committed offset after node {coordinator}'s death"
    );
    let now = c.wait_leader(OFFSETS, 0);
    assert_ne!(now, coordinator);
    let other = c
        .ids()
        .into_iter()
        .find(|id| *id != now && *id != coordinator)
        .unwrap();
    assert_eq!(committed_through(&c, other, "g"), 13);

    // The killed node comes back as a follower of the offsets topic, and answers
    // for the group through the new coordinator.
    c.restart(coordinator);
    assert_eq!(committed_through(&c, coordinator, "g"), 13);
    let listed = c.ok(&["groups", "list"]);
    assert!(listed.lines().any(|l| l.starts_with("g ")), "{listed}");
}

#[test]
fn a_member_reading_across_a_coordinator_kill_goes_on() {
    let mut c = Cluster::start(3);
    c.create_topic(TOPIC, 1, 3);
    c.ok_with_stdin(&["produce", TOPIC], &lines(1, 20));
    // The group exists (and has its coordinator) before the member starts.
    c.ok(&[
        "consume", TOPIC, "--group", "live", "--from", "earliest", "--count", "1",
    ]);
    let coordinator = c.wait_leader(OFFSETS, 0);
    let mut member = Command::new(BIN);
    member
        .args(["consume", TOPIC, "--group", "live", "--count", "39"])
        .args(["--commit-interval", "200ms", "--broker", &c.brokers()])
        .stdin(Stdio::null());
    let reader = std::thread::spawn(move || output_within(member, PATIENCE * 3));
    std::thread::sleep(std::time::Duration::from_secs(2));
    c.kill9(coordinator);
    c.ok_with_stdin(&["produce", TOPIC], &lines(21, 40));
    let out = reader.join().unwrap().expect("the member ends in time");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let got = values(&String::from_utf8(out.stdout).unwrap());
    let mut distinct = got.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct,
        (2..=40).collect::<Vec<_>>(),
        "every record after the committed one, across the kill: {got:?} ({stderr})"
    );
}

/// The nodes whose `cluster status` shows a replica of the offsets topic's
/// partition, once every node of a 4-node cluster answers and three of them do.
fn offsets_holders(c: &mut Cluster) -> Vec<u64> {
    let began = std::time::Instant::now();
    loop {
        let mut holders = Vec::new();
        for id in c.ids() {
            let status = c.status(id).unwrap_or_default();
            let held = status["partitions"].as_array().is_some_and(|ps| {
                ps.iter()
                    .any(|p| p["topic"] == OFFSETS && p["held"] == true && !p["leader"].is_null())
            });
            if held {
                holders.push(id);
            }
        }
        if holders.len() == 3 {
            return holders;
        }
        assert!(
            began.elapsed() < PATIENCE,
            "the offsets topic is not on three nodes of four: {holders:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn groups_work_with_a_node_down_at_their_first_use_and_through_a_node_outside_the_offsets_topic() {
    // The offsets topic is made when the cluster first starts, before any client
    // asks for a group: on three nodes of four.
    let mut c = Cluster::start(4);
    let holders = offsets_holders(&mut c);
    let outside = c
        .ids()
        .into_iter()
        .find(|id| !holders.contains(id))
        .unwrap();
    let coordinator = c.wait_leader(OFFSETS, 0);
    c.create_topic(TOPIC, 1, 3);
    c.ok_with_stdin(&["produce", TOPIC], &lines(1, 20));
    // A holder that does not coordinate dies before any group is used: the groups
    // are served all the same (before, the topic was made at the first group
    // request, and that needed every node it is placed on).
    let down = holders
        .iter()
        .copied()
        .find(|id| *id != coordinator)
        .unwrap();
    c.kill9(down);
    // Through the node outside the topic's placement alone: it names the
    // coordinator, and the client follows.
    let only = c.node(outside).client_addr.clone();
    let out = output_within(
        {
            let mut cmd = Command::new(BIN);
            cmd.args([
                "consume", TOPIC, "--group", "g", "--from", "earliest", "--count", "6", "--broker",
                &only,
            ]);
            cmd
        },
        PATIENCE,
    )
    .expect("consume --group ends");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        values(&String::from_utf8_lossy(&out.stdout)),
        (1..=6).collect::<Vec<_>>()
    );
    assert_eq!(committed_through(&c, outside, "g"), 6);
    assert_eq!(committed_through(&c, coordinator, "g"), 6);
    c.restart(down);
    c.stop_all();
}
