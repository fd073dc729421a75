//! The replication checker ([`crate::util::replica_check`]) on synthetic inputs: a
//! clean history passes, and each kind of violation is found and named.

use crate::util::replica_check::{check, parse_dump, Acked, Dumped, Replica, Violation};

fn ack(producer: u64, value: &str, partition: u32, offset: u64) -> Acked {
    Acked {
        producer,
        value: value.as_bytes().to_vec(),
        partition,
        offset,
    }
}

fn replica(node: u64, records: &[(u32, u64, &str)]) -> Replica {
    Replica {
        node,
        records: records
            .iter()
            .map(|&(partition, offset, v)| Dumped {
                partition,
                offset,
                value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// Three identical replicas holding every acknowledged record, plus one record that
/// was committed but whose acknowledgement was lost (allowed).
fn clean() -> (Vec<Acked>, Vec<Replica>) {
    let acks = vec![
        ack(1, "p1-0", 0, 0),
        ack(2, "p2-0", 0, 1),
        ack(1, "p1-1", 1, 0),
    ];
    let held = [
        (0, 0, "p1-0"),
        (0, 1, "p2-0"),
        (0, 2, "p2-1"),
        (1, 0, "p1-1"),
    ];
    let replicas = (1..=3).map(|n| replica(n, &held)).collect();
    (acks, replicas)
}

#[test]
fn a_clean_history_passes() {
    let (acks, replicas) = clean();
    assert_eq!(check(&acks, &replicas), Vec::<Violation>::new());
    // No acknowledgements at all: only agreement is checked.
    assert_eq!(check(&[], &replicas), Vec::<Violation>::new());
}

#[test]
fn a_lost_record_is_found_on_the_node_that_lost_it() {
    let (acks, mut replicas) = clean();
    replicas[1]
        .records
        .retain(|d| d.offset != 1 || d.partition != 0);
    let v = check(&acks, &replicas);
    assert!(
        v.contains(&Violation::Lost {
            node: 2,
            partition: 0,
            offset: 1,
            want: "p2-0".into(),
            got: None,
        }),
        "{v:?}"
    );
    assert!(v.iter().any(|x| matches!(
        x,
        Violation::Diverged {
            partition: 0,
            offset: 1,
            ..
        }
    )));
}

#[test]
fn a_record_at_another_offset_is_lost_at_its_acknowledged_one() {
    let (acks, _) = clean();
    // Every node holds p2-0 one offset further on: the same on all, still wrong.
    let held = [(0, 0, "p1-0"), (0, 1, "x"), (0, 2, "p2-0"), (1, 0, "p1-1")];
    let replicas: Vec<Replica> = (1..=3).map(|n| replica(n, &held)).collect();
    let v = check(&acks, &replicas);
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(v.iter().all(|x| matches!(
        x,
        Violation::Lost { partition: 0, offset: 1, got: Some(g), .. } if g == "x"
    )));
}

#[test]
fn replicas_that_disagree_on_an_unacknowledged_offset_diverge() {
    let (acks, mut replicas) = clean();
    replicas[2].records[2].value = b"other".to_vec();
    let v = check(&acks, &replicas);
    assert_eq!(
        v,
        vec![Violation::Diverged {
            partition: 0,
            offset: 2,
            by_node: vec![
                (1, Some("p2-1".into())),
                (2, Some("p2-1".into())),
                (3, Some("other".into())),
            ],
        }]
    );
    // A replica with a longer tail diverges too.
    let (acks, mut replicas) = clean();
    replicas[0].records.push(Dumped {
        partition: 1,
        offset: 1,
        value: b"extra".to_vec(),
    });
    let v = check(&acks, &replicas);
    assert!(
        matches!(
            v.as_slice(),
            [Violation::Diverged {
                partition: 1,
                offset: 1,
                ..
            }]
        ),
        "{v:?}"
    );
}

#[test]
fn two_records_at_one_offset() {
    let (acks, mut replicas) = clean();
    replicas[0].records.push(Dumped {
        partition: 0,
        offset: 2,
        value: b"twin".to_vec(),
    });
    let v = check(&acks, &replicas);
    assert!(
        v.contains(&Violation::TwoRecords {
            node: 1,
            partition: 0,
            offset: 2,
            values: vec!["p2-1".into(), "twin".into()],
        }),
        "{v:?}"
    );
    // Two acknowledgements of different values at one offset.
    let (mut acks, replicas) = clean();
    acks.push(ack(3, "p3-0", 0, 1));
    let v = check(&acks, &replicas);
    assert!(
        v.contains(&Violation::AckedTwice {
            partition: 0,
            offset: 1,
            values: vec!["p2-0".into(), "p3-0".into()],
        }),
        "{v:?}"
    );
}

#[test]
fn a_retry_applied_twice_is_a_duplicate() {
    // The retry landed at offset 3 on every node: the replicas agree, but the value
    // is there twice.
    let (acks, _) = clean();
    let held = [
        (0, 0, "p1-0"),
        (0, 1, "p2-0"),
        (0, 2, "p2-1"),
        (0, 3, "p2-0"),
        (1, 0, "p1-1"),
    ];
    let replicas: Vec<Replica> = (1..=3).map(|n| replica(n, &held)).collect();
    let v = check(&acks, &replicas);
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(v.iter().all(|x| matches!(
        x,
        Violation::StoredTwice { value, at, .. } if value == "p2-0" && at == &vec![(0, 1), (0, 3)]
    )));
    // Acknowledged at two offsets: the retry's answer named new offsets.
    let (mut acks, replicas) = clean();
    acks.push(ack(2, "p2-0", 0, 2));
    let v = check(&acks, &replicas);
    assert!(v.contains(&Violation::AckedAtTwoOffsets {
        value: "p2-0".into(),
        at: vec![(0, 1), (0, 2)],
    }));
}

#[test]
fn violations_read_plainly() {
    let v = Violation::Lost {
        node: 2,
        partition: 0,
        offset: 7,
        want: "a".into(),
        got: None,
    };
    assert_eq!(
        v.to_string(),
        "node 2: acknowledged \"a\" at 0/7, holds None"
    );
}

#[test]
fn dump_lines_parse() {
    let text = concat!(
        r#"{"type":"header","path":"x"}"#,
        "\n",
        r#"{"type":"record","topic":"t","partition":1,"offset":5,"value":"6869","key":null}"#,
        "\n",
    );
    assert_eq!(
        parse_dump(text).unwrap(),
        vec![Dumped {
            partition: 1,
            offset: 5,
            value: b"hi".to_vec(),
        }]
    );
    let problem = r#"{"type":"problem","kind":"torn_tail","severity":"repairable"}"#;
    assert!(parse_dump(problem).unwrap_err().contains("problem"));
    let note = r#"{"type":"problem","kind":"zero_tail","severity":"info"}"#;
    assert_eq!(parse_dump(note).unwrap(), vec![]);
    let odd = r#"{"type":"record","partition":1,"offset":5,"value":"686"}"#;
    assert!(parse_dump(odd).is_err());
    assert!(parse_dump("not json").is_err());
}
