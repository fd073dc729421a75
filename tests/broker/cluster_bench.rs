//! `seglog bench produce` on a cluster follows its partition's leader: with every
//! node in `--broker`, a leader killed -9 in the middle of a run does not end it;
//! the requests it held are sent again to the new leader, and with `--idempotent`
//! none is written twice.

#![expect(clippy::unwrap_used, reason = "tests")]

use std::process::Command;
use std::time::Duration;

use crate::util::bin::BIN;
use crate::util::cluster::{output_within, Cluster};

#[test]
fn bench_produce_follows_a_leader_killed_under_way() {
    let mut c = Cluster::start(3);
    c.create_topic("bf", 1, 3);
    let leader = c.wait_leader("bf", 0);
    let mut cmd = Command::new(BIN);
    cmd.args([
        "bench",
        "produce",
        "--topic",
        "bf",
        "--duration",
        "6s",
        "--connections",
        "4",
        "--in-flight",
        "2",
        "--batch",
        "10",
        "--idempotent",
        "--json",
        "--broker",
        &c.brokers(),
    ]);
    let run = std::thread::spawn(move || output_within(cmd, Duration::from_secs(90)));
    std::thread::sleep(Duration::from_secs(2));
    c.kill9(leader);
    let out = run.join().unwrap().expect("bench ended within 90 s");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    println!("{report}");
    let records = report["records"].as_u64().unwrap();
    assert!(records > 0, "{report}");
    assert!(
        report["resent"].as_u64().unwrap() >= 1,
        "nothing was sent again: was the leader killed under way? {report}"
    );
    assert!(report["stopped"].is_null(), "{report}");
    // The killed leader's counters could not be read after the run: said, and
    // the write path's counters are left out rather than understated.
    assert_eq!(
        report["uncounted"],
        serde_json::json!([c.node(leader).client_addr]),
        "{report}"
    );
    assert!(report["fsync_p50_ms"].is_null(), "{report}");

    // The new leader holds exactly what was acknowledged: no request sent again
    // was written twice.
    let new = c.wait_leader("bf", 0);
    assert_ne!(new, leader);
    c.stop_all();
    let held = c.dump(new, "bf", 1).records.len() as u64;
    assert_eq!(held, records, "{report}");
}
