//! The fsync fault (`SEGLOG_FAULT_FSYNC_FAIL`) in a real `seglog serve`: fsyncs of
//! one partition fail, that partition fail-stops, the others go on.

use std::process::Command;
use std::time::Duration;

use seglog::engine::net::client::Client;
use seglog::format::wire::{ErrorCode, PartitionBatch, WireRecord};

use crate::util::bin::BIN;
use crate::util::serve::Serve;

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
