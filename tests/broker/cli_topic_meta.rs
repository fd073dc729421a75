//! `seglog serve` on data directories whose `events` topic has damaged metadata
//! (the committed fixtures of tests/fixtures/README.md, Topic metadata): that topic is
//! listed offline, every request on it fails in one line naming the problem, its files
//! stay byte for byte, and the `users` topic is served normally.

use crate::util::fs::{copy_tree, files, fixture};
use crate::util::serve::Serve;

#[test]
fn a_topic_with_damaged_metadata_is_offline_and_the_others_are_served() {
    for (name, problem) in [
        ("topic-json-missing", "topic.json is missing"),
        ("topic-json-truncated", "topic.json cannot be used"),
        (
            "topic-too-few-partitions",
            "partition directory 2 is outside",
        ),
        (
            "topic-too-many-partitions",
            "partition directory 2 of the 4",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join(name);
        copy_tree(&fixture(name), &data);
        let before = files(&data.join("topics/events"));
        let b = Serve::start(&data);

        let list = b.ok(&["topics", "list"]);
        assert!(list.lines().any(|l| l == "users"), "{name}: {list}");
        let events = list
            .lines()
            .find(|l| l.starts_with("events "))
            .unwrap_or("");
        assert!(
            events.contains("offline") && events.contains(problem),
            "{name}: {list}"
        );

        for args in [
            &["topics", "describe", "events"][..],
            &["produce", "events", "--value", "x"],
            &["consume", "events"],
            &["topics", "alter", "events", "--config", "retention_ms=1000"],
            &["topics", "delete", "events"],
        ] {
            let out = b.run(args);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_ne!(out.status.code(), Some(0), "{name}: {args:?} succeeded");
            assert!(
                err.contains("offline") && err.contains(problem),
                "{name}: {args:?}: {err}"
            );
            assert!(err.contains("corrupt_data"), "{name}: {args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{name}: {args:?}: {err}");
        }

        b.ok(&["produce", "users", "--key", "k", "--value", "new"]);
        let got = b.ok(&["consume", "users", "--json"]);
        assert!(got.contains("\"new\""), "{name}: {got}");
        b.stop();
        assert_eq!(
            files(&data.join("topics/events")),
            before,
            "{name}: the offline topic's files changed"
        );
    }
}
