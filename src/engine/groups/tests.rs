//! Coordinator state-machine tests, driven without threads: `tick` moves time.

use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::engine::storage::io::RealStorage;

struct Topics;
impl TopicLookup for Topics {
    fn partition_count(&self, topic: &str) -> Option<u32> {
        (topic == "t").then_some(4)
    }
}

fn coordinator(dir: &Path) -> GroupCoordinator {
    let opts = GroupOptions {
        session_timeout_min: Duration::from_millis(10),
        ..GroupOptions::default()
    };
    GroupCoordinator::open(dir, Arc::new(RealStorage), opts)
        .unwrap()
        .0
}

fn join_req(member: &str, session_ms: u32) -> JoinRequest {
    JoinRequest {
        group: "g".into(),
        member_id: member.into(),
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: session_ms,
        rebalance_timeout_ms: 60_000,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), b"meta".to_vec())],
        group_instance_id: None,
        listener: GroupListener::Kafka,
    }
}

fn done<T: std::fmt::Debug>(mut rx: Completion<T>) -> Result<T, GroupError> {
    rx.try_recv().expect("completed")
}

#[test]
fn join_sync_commit_and_generations() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let a = done(c.join(join_req("", 10_000))).unwrap();
    assert_eq!(a.generation, 1);
    assert_eq!(a.leader, a.member_id);
    assert_eq!(a.members.len(), 1);
    let asg = done(c.sync(
        "g",
        1,
        &a.member_id,
        None,
        vec![(a.member_id.clone(), b"p0".to_vec())],
    ));
    assert_eq!(asg.unwrap(), b"p0");
    c.heartbeat("g", 1, &a.member_id, None).unwrap();

    // A second member: the first learns of the rebalance through its heartbeat.
    let mut b_rx = c.join(join_req("", 10_000));
    assert!(
        b_rx.try_recv().is_err(),
        "waits for the first member to rejoin"
    );
    assert!(matches!(
        c.heartbeat("g", 1, &a.member_id, None),
        Err(GroupError::RebalanceInProgress { .. })
    ));
    // It may still commit what it read, with its generation, before rejoining.
    done(
        c.commit(&Topics, "g", 1, &a.member_id, None, "t", &[])
            .unwrap(),
    )
    .unwrap();
    assert!(matches!(
        c.commit(&Topics, "g", 0, &a.member_id, None, "t", &[]),
        Err(GroupError::IllegalGeneration { .. })
    ));
    let a2 = done(c.join(join_req(&a.member_id, 10_000))).unwrap();
    let b = done(b_rx).unwrap();
    assert_eq!((a2.generation, b.generation), (2, 2));
    assert_eq!(a2.members.len(), 2);
    assert!(b.members.is_empty());
    let b_sync = c.sync("g", 2, &b.member_id, None, vec![]);
    let a_asg = done(c.sync(
        "g",
        2,
        &a.member_id,
        None,
        vec![
            (a.member_id.clone(), b"A".to_vec()),
            (b.member_id.clone(), b"B".to_vec()),
        ],
    ));
    assert_eq!(a_asg.unwrap(), b"A");
    assert_eq!(done(b_sync).unwrap(), b"B");

    // Stale generation, unknown member, bad partition, oversized metadata.
    assert!(matches!(
        c.heartbeat("g", 1, &a.member_id, None),
        Err(GroupError::IllegalGeneration {
            generation: 1,
            current: 2,
            ..
        })
    ));
    assert!(matches!(
        c.heartbeat("g", 2, "nobody", None),
        Err(GroupError::UnknownMember { .. })
    ));
    let commit = |p, off, meta: &str| {
        c.commit(
            &Topics,
            "g",
            2,
            &b.member_id,
            None,
            "t",
            &[OffsetCommit {
                partition: p,
                offset: off,
                metadata: meta.into(),
            }],
        )
    };
    assert!(matches!(
        commit(4, 1, ""),
        Err(GroupError::UnknownPartition { .. })
    ));
    assert!(matches!(
        commit(0, 1, &"m".repeat(OFFSET_METADATA_BYTES_MAX + 1)),
        Err(GroupError::MetadataTooLarge { .. })
    ));
    assert!(matches!(
        c.commit(&Topics, "../g", 2, &b.member_id, None, "t", &[]),
        Err(GroupError::InvalidName(_))
    ));
    assert!(
        !dir.path().join("groups/g.json").exists() || {
            // Files written so far hold no offsets.
            let (_, l) = offsets::read_group_file(&dir.path().join("groups/g.json")).unwrap();
            l.offsets.is_empty()
        }
    );
    done(commit(3, 17, "x").unwrap()).unwrap();
    let (_, l) = offsets::read_group_file(&dir.path().join("groups/g.json")).unwrap();
    assert_eq!(l.offsets.len(), 1);
    assert_eq!((l.offsets[0].partition, l.offsets[0].offset), (3, 17));
    // An admin commit is refused while members live; deleting too.
    assert!(matches!(
        c.commit(&Topics, "g", -1, "", None, "t", &[]),
        Err(GroupError::GroupNotEmpty { members: 2, .. })
    ));
    assert!(matches!(
        c.delete("g"),
        Err(GroupError::GroupNotEmpty { .. })
    ));

    // Sessions: b stops heartbeating and is removed; a rejoins alone.
    c.leave("g", &a.member_id, None).unwrap();
    let d = c.describe("g").unwrap();
    assert_eq!(d.state, GroupState::PreparingRebalance);
    let mut b3 = c.join(join_req(&b.member_id, 10_000));
    let b3 = b3.try_recv().unwrap().unwrap();
    assert_eq!(b3.generation, 3);
    assert_eq!(b3.leader, b.member_id);

    // Reopen: offsets survive, members do not.
    c.leave("g", &b.member_id, None).unwrap();
    drop(c);
    let c = coordinator(dir.path());
    let d = c.describe("g").unwrap();
    assert_eq!(d.state, GroupState::Empty);
    assert!(d.members.is_empty());
    assert_eq!(d.offsets[0].offset, 17);
    done(c.delete("g").unwrap()).unwrap();
    assert!(!dir.path().join("groups/g.json").exists());
    assert!(matches!(
        c.describe("g"),
        Err(GroupError::UnknownGroup { .. })
    ));
}

#[test]
fn session_timeout_and_deleted_topics() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let a = done(c.join(join_req("", 20))).unwrap();
    done(c.sync("g", 1, &a.member_id, None, vec![])).unwrap();
    done(
        c.commit(
            &Topics,
            "g",
            1,
            &a.member_id,
            None,
            "t",
            &[OffsetCommit {
                partition: 0,
                offset: 5,
                metadata: String::new(),
            }],
        )
        .unwrap(),
    )
    .unwrap();
    let mut known = BTreeMap::new();
    known.insert("t".to_string(), 4u32);
    c.tick(Instant::now() + Duration::from_millis(50), Some(&known));
    let d = c.describe("g").unwrap();
    assert!(d.members.is_empty(), "expired: {d:?}");
    assert_eq!(d.state, GroupState::Empty);
    assert!(matches!(
        c.heartbeat("g", 1, &a.member_id, None),
        Err(GroupError::UnknownMember { .. })
    ));
    assert_eq!(d.offsets.len(), 1);
    // The topic is deleted: its offsets go, and then the empty group.
    c.tick(Instant::now(), Some(&BTreeMap::new()));
    c.tick(Instant::now(), Some(&BTreeMap::new()));
    assert!(matches!(
        c.describe("g"),
        Err(GroupError::UnknownGroup { .. })
    ));
    assert!(!dir.path().join("groups/g.json").exists());
}

#[test]
fn admin_commit_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let opts = GroupOptions {
        offsets_retention: Duration::ZERO,
        ..GroupOptions::default()
    };
    let c = GroupCoordinator::open(dir.path(), Arc::new(RealStorage), opts)
        .unwrap()
        .0;
    let reset = [OffsetCommit {
        partition: 1,
        offset: 9,
        metadata: String::new(),
    }];
    done(c.commit(&Topics, "g", -1, "", None, "t", &reset).unwrap()).unwrap();
    assert_eq!(c.fetch_offsets("g", Some("t"), None).unwrap()[0].offset, 9);
    // An offset past i64::MAX (Kafka's offsets are i64) is refused, and nothing changes.
    let past = [OffsetCommit {
        partition: 1,
        offset: i64::MAX as u64 + 1,
        metadata: String::new(),
    }];
    assert!(matches!(
        c.commit(&Topics, "g", -1, "", None, "t", &past),
        Err(GroupError::TooLarge { .. })
    ));
    assert_eq!(c.fetch_offsets("g", Some("t"), None).unwrap()[0].offset, 9);
    std::thread::sleep(Duration::from_millis(5));
    c.tick(Instant::now(), None);
    assert!(c.fetch_offsets("g", None, None).unwrap().is_empty());
}

/// A commit whose file replace fails is not applied: fetch and the file keep the
/// offset before it, and the next commit is written whole.
#[test]
fn failed_replace_leaves_offsets_as_they_were() {
    use crate::testkit::storage::{FailOn, FailingStorage};
    let commit = |c: &GroupCoordinator, offset: u64| {
        let e = [OffsetCommit {
            partition: 2,
            offset,
            metadata: format!("m{offset}"),
        }];
        done(c.commit(&Topics, "g", -1, "", None, "t", &e).unwrap())
    };
    // Counts the calls an open and one commit make, then fails the next one.
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = FailingStorage::new(Arc::new(RealStorage), u64::MAX, FailOn::Any, false);
    let c = GroupCoordinator::open(
        probe_dir.path(),
        Arc::new(probe.clone()),
        GroupOptions::default(),
    )
    .unwrap()
    .0;
    commit(&c, 5).unwrap();
    let after_first = probe.calls();
    for step in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        let storage = FailingStorage::new(
            Arc::new(RealStorage),
            after_first + step,
            FailOn::Any,
            false,
        );
        let c = GroupCoordinator::open(
            dir.path(),
            Arc::new(storage.clone()),
            GroupOptions::default(),
        )
        .unwrap()
        .0;
        commit(&c, 5).unwrap();
        let failed = commit(&c, 9);
        assert!(storage.has_failed(), "step {step}");
        assert!(
            matches!(failed, Err(GroupError::Storage { .. })),
            "step {step}: {failed:?}"
        );
        let seen = c.fetch_offsets("g", Some("t"), None).unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].offset, seen[0].metadata.as_str()),
            (5, "m5"),
            "step {step}"
        );
        assert_eq!(c.describe("g").unwrap().offsets[0].offset, 5);
        // A restart reads what the file holds: the same.
        let reopened = coordinator(dir.path());
        assert_eq!(
            reopened.fetch_offsets("g", Some("t"), None).unwrap()[0].offset,
            5,
            "step {step}"
        );
        commit(&c, 12).unwrap();
        assert_eq!(c.fetch_offsets("g", Some("t"), None).unwrap()[0].offset, 12);
        assert_eq!(
            coordinator(dir.path())
                .fetch_offsets("g", Some("t"), None)
                .unwrap()[0]
                .offset,
            12
        );
    }
}

fn static_req(member: &str, instance: &str, session_ms: u32) -> JoinRequest {
    JoinRequest {
        group_instance_id: Some(instance.into()),
        listener: GroupListener::Kafka,
        ..join_req(member, session_ms)
    }
}

/// Two static members "ia" (the leader) and "ib", stable at generation 2 with
/// assignments "A" and "B": (a's id, b's id).
fn stable_static_pair(c: &GroupCoordinator) -> (String, String) {
    let a = done(c.join(static_req("", "ia", 10_000))).unwrap();
    done(c.sync("g", 1, &a.member_id, Some("ia"), vec![])).unwrap();
    let b_rx = c.join(static_req("", "ib", 10_000));
    done(c.join(static_req(&a.member_id, "ia", 10_000))).unwrap();
    let b = done(b_rx).unwrap();
    assert_eq!(b.generation, 2);
    let b_sync = c.sync("g", 2, &b.member_id, Some("ib"), vec![]);
    let given = vec![
        (a.member_id.clone(), b"A".to_vec()),
        (b.member_id.clone(), b"B".to_vec()),
    ];
    done(c.sync("g", 2, &a.member_id, Some("ia"), given)).unwrap();
    assert_eq!(done(b_sync).unwrap(), b"B");
    (a.member_id, b.member_id)
}

/// KIP-345: a static member that rejoins without its member id takes its old
/// place at once; the old id is fenced; a stable group does not rebalance.
#[test]
fn static_member_rejoins_in_place_and_fences_its_old_id() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let (a, b) = stable_static_pair(&c);
    let j = done(c.join(static_req("", "ib", 10_000))).unwrap();
    assert_ne!(j.member_id, b);
    assert_eq!((j.generation, j.leader.as_str()), (2, a.as_str()));
    assert!(j.members.is_empty());
    // Its old assignment, no rebalance: the other member goes on as it was.
    assert_eq!(
        done(c.sync("g", 2, &j.member_id, Some("ib"), vec![])).unwrap(),
        b"B"
    );
    c.heartbeat("g", 2, &a, Some("ia")).unwrap();
    c.heartbeat("g", 2, &j.member_id, Some("ib")).unwrap();
    let d = c.describe("g").unwrap();
    assert_eq!((d.state, d.generation), (GroupState::Stable, 2));
    let mut instances: Vec<_> = d.members.iter().map(|m| m.instance_id.clone()).collect();
    instances.sort();
    assert_eq!(instances, [Some("ia".to_string()), Some("ib".to_string())]);
    // The old member id is fenced where it names its instance id, unknown where not.
    let fenced = |r: Result<(), GroupError>| {
        assert!(matches!(r, Err(GroupError::FencedInstance { .. })), "{r:?}");
    };
    fenced(c.heartbeat("g", 2, &b, Some("ib")));
    fenced(done(c.sync("g", 2, &b, Some("ib"), vec![])).map(|_| ()));
    fenced(
        c.commit(&Topics, "g", 2, &b, Some("ib"), "t", &[])
            .map(|_| ()),
    );
    fenced(c.leave("g", &b, Some("ib")));
    fenced(done(c.join(static_req(&b, "ib", 10_000))).map(|_| ()));
    assert!(matches!(
        c.heartbeat("g", 2, &b, None),
        Err(GroupError::UnknownMember { .. })
    ));
    assert!(matches!(
        c.heartbeat("g", 2, &a, Some("nobody")),
        Err(GroupError::UnknownMember { .. })
    ));

    // The leader restarts: the new id is told the old leader's id, so it does not
    // redo the assignment of a stable group; later rebalances know it as leader.
    let l = done(c.join(static_req("", "ia", 10_000))).unwrap();
    assert_eq!((l.generation, l.leader.as_str()), (2, a.as_str()));
    assert_eq!(
        done(c.sync("g", 2, &l.member_id, Some("ia"), vec![])).unwrap(),
        b"A"
    );
    // A later rebalance knows the new id as the leader.
    let mut late = c.join(join_req("", 10_000));
    let mut b_join = c.join(static_req(&j.member_id, "ib", 10_000));
    let l2 = done(c.join(static_req(&l.member_id, "ia", 10_000))).unwrap();
    assert_eq!(
        (l2.generation, l2.leader.as_str()),
        (3, l.member_id.as_str())
    );
    // The leader learns each member's instance id with its metadata.
    let mut instances: Vec<_> = l2.members.iter().map(|m| m.1.clone()).collect();
    instances.sort();
    assert_eq!(instances, [None, Some("ia".into()), Some("ib".into())]);
    assert!(matches!(late.try_recv(), Ok(Ok(_))));
    assert!(matches!(b_join.try_recv(), Ok(Ok(_))));
}

/// A static member that rejoins with a protocol that changes the group's, or
/// during a rebalance, rebalances the group; a pending join of the old id is fenced.
#[test]
fn static_member_rejoin_rebalances_when_it_must() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    // Alone in the group: rejoining with another protocol changes the group's.
    let a = done(c.join(static_req("", "ia", 10_000))).unwrap();
    done(c.sync("g", 1, &a.member_id, Some("ia"), vec![])).unwrap();
    let mut other = static_req("", "ia", 10_000);
    other.protocols = vec![("roundrobin".into(), b"m".to_vec())];
    let r = done(c.join(other)).unwrap();
    assert_eq!((r.generation, r.protocol.as_str()), (2, "roundrobin"));
    assert_eq!(r.leader, r.member_id);

    // During a rebalance the new id waits with the others, and the old id's
    // pending join is fenced.
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let (a, b) = stable_static_pair(&c);
    let mut newcomer = c.join(join_req("", 10_000));
    let mut b_join = c.join(static_req(&b, "ib", 10_000));
    assert!(b_join.try_recv().is_err(), "a has not rejoined");
    let mut replaced = c.join(static_req("", "ib", 10_000));
    assert!(matches!(
        b_join.try_recv(),
        Ok(Err(GroupError::FencedInstance { .. }))
    ));
    assert!(replaced.try_recv().is_err(), "waits for a");
    let a2 = done(c.join(static_req(&a, "ia", 10_000))).unwrap();
    let r = replaced.try_recv().unwrap().unwrap();
    assert_eq!((a2.generation, r.generation), (3, 3));
    assert_eq!(a2.members.len(), 3);
    assert!(matches!(newcomer.try_recv(), Ok(Ok(_))));
}

/// A static member's session timeout removes it; LeaveGroup names a static member
/// by its instance id alone.
#[test]
fn static_members_expire_and_leave_by_instance_id() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let a = done(c.join(static_req("", "ia", 20))).unwrap();
    done(c.sync("g", 1, &a.member_id, Some("ia"), vec![])).unwrap();
    c.tick(Instant::now() + Duration::from_millis(50), None);
    let d = c.describe("g").unwrap();
    assert!(d.members.is_empty(), "expired: {d:?}");
    assert!(matches!(
        c.heartbeat("g", 1, &a.member_id, Some("ia")),
        Err(GroupError::UnknownMember { .. })
    ));
    // Rejoining after that is a new member of a new generation.
    let a = done(c.join(static_req("", "ia", 10_000))).unwrap();
    assert_eq!(a.leader, a.member_id);
    assert!(matches!(
        c.leave("g", "", Some("nobody")),
        Err(GroupError::UnknownMember { .. })
    ));
    assert!(matches!(
        c.leave("g", "", None),
        Err(GroupError::UnknownMember { .. })
    ));
    c.leave("g", "", Some("ia")).unwrap();
    let d = c.describe("g").unwrap();
    assert!(d.members.is_empty());
    assert_eq!(d.state, GroupState::Empty);
}

/// Two dynamic members stable at generation 2: a (the leader, session 60 s) and b
/// (session 20 ms, `b_instance` its static instance id), assignments "A" and "B",
/// and an offset committed: (a's id, b's id).
fn stable_pair_with_offset(c: &GroupCoordinator, b_instance: Option<&str>) -> (String, String) {
    let a = done(c.join(join_req("", 60_000))).unwrap();
    done(c.sync("g", 1, &a.member_id, None, vec![])).unwrap();
    let b_rx = c.join(JoinRequest {
        client_id: "cb".into(),
        group_instance_id: b_instance.map(Into::into),
        ..join_req("", 20)
    });
    done(c.join(join_req(&a.member_id, 60_000))).unwrap();
    let b = done(b_rx).unwrap();
    let b_sync = c.sync("g", 2, &b.member_id, b_instance, vec![]);
    let given = vec![
        (a.member_id.clone(), b"A".to_vec()),
        (b.member_id.clone(), b"B".to_vec()),
    ];
    done(c.sync("g", 2, &a.member_id, None, given)).unwrap();
    assert_eq!(done(b_sync).unwrap(), b"B");
    let offset = [OffsetCommit {
        partition: 1,
        offset: 9,
        metadata: String::new(),
    }];
    done(
        c.commit(&Topics, "g", 2, &b.member_id, b_instance, "t", &offset)
            .unwrap(),
    )
    .unwrap();
    (a.member_id, b.member_id)
}

/// As Kafka's coordinator reloads a group's metadata: a Stable group comes back
/// Stable after a restart, its members heartbeat on at their generation; a member
/// that never comes back expires after its session timeout, and the group then
/// rebalances (and is stored without members).
#[test]
fn stable_membership_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let (a, b) = stable_pair_with_offset(&c, None);
    let before = c.describe("g").unwrap();
    drop(c);

    let c = coordinator(dir.path());
    let d = c.describe("g").unwrap();
    assert_eq!(d, before);
    assert_eq!((d.state, d.generation), (GroupState::Stable, 2));
    assert_eq!(d.protocol, "range");
    let ids: Vec<_> = d.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(ids, [a.as_str(), b.as_str()]);
    // No UNKNOWN_MEMBER_ID, no rebalance.
    c.heartbeat("g", 2, &a, None).unwrap();
    c.heartbeat("g", 2, &b, None).unwrap();
    assert_eq!(done(c.sync("g", 2, &b, None, vec![])).unwrap(), b"B");
    done(c.commit(&Topics, "g", 2, &a, None, "t", &[]).unwrap()).unwrap();
    // A non-leader rejoining with its protocols gets the same generation at once.
    let j = done(c.join(join_req(&b, 20))).unwrap();
    assert_eq!((j.generation, j.leader.as_str()), (2, a.as_str()));
    // Sessions start at the restart: a tick now expires nobody.
    c.tick(Instant::now(), None);
    assert_eq!(c.describe("g").unwrap().state, GroupState::Stable);

    // b never heartbeats again: its 20 ms session ends and the group rebalances.
    c.tick(Instant::now() + Duration::from_millis(50), None);
    assert!(matches!(
        c.heartbeat("g", 2, &b, None),
        Err(GroupError::UnknownMember { .. })
    ));
    assert!(matches!(
        c.heartbeat("g", 2, &a, None),
        Err(GroupError::RebalanceInProgress { .. })
    ));
    drop(c);
    // A group that was rebalancing is not restored with members.
    let c = coordinator(dir.path());
    let d = c.describe("g").unwrap();
    assert_eq!((d.state, d.generation), (GroupState::Empty, 2));
    assert!(d.members.is_empty());
    assert_eq!(d.offsets.len(), 1);
    assert!(matches!(
        c.heartbeat("g", 2, &a, None),
        Err(GroupError::UnknownMember { .. })
    ));
}

/// A static member that takes its old place without a rebalance changes a member id:
/// the stored membership follows.
#[test]
fn a_replaced_static_member_is_stored_under_its_new_id() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let (a, b) = stable_pair_with_offset(&c, Some("ib"));
    let j = done(c.join(JoinRequest {
        group_instance_id: Some("ib".into()),
        ..join_req("", 20)
    }))
    .unwrap();
    assert_eq!(j.generation, 2);
    drop(c);
    let c = coordinator(dir.path());
    let d = c.describe("g").unwrap();
    assert_eq!((d.state, d.generation), (GroupState::Stable, 2));
    let mut ids: Vec<_> = d.members.iter().map(|m| m.member_id.clone()).collect();
    ids.sort();
    let mut want = vec![a.clone(), j.member_id.clone()];
    want.sort();
    assert_eq!(ids, want);
    c.heartbeat("g", 2, &j.member_id, Some("ib")).unwrap();
    assert!(matches!(
        c.heartbeat("g", 2, &b, Some("ib")),
        Err(GroupError::FencedInstance { .. })
    ));
    assert_eq!(
        done(c.sync("g", 2, &j.member_id, Some("ib"), vec![])).unwrap(),
        b"B"
    );
}

/// A stored membership that fails its checks: the group loads with its offsets and
/// without members, and the startup report says why.
#[test]
fn a_bad_membership_loads_the_offsets_without_members() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    stable_pair_with_offset(&c, None);
    drop(c);
    let path = dir.path().join("groups/g.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let bad = text.replacen("\"leader\": \"", "\"leader\": \"x", 1);
    assert_ne!(bad, text);
    std::fs::write(&path, bad).unwrap();
    let opts = GroupOptions {
        session_timeout_min: Duration::from_millis(10),
        ..GroupOptions::default()
    };
    let (c, report) = GroupCoordinator::open(dir.path(), Arc::new(RealStorage), opts).unwrap();
    assert_eq!(report.len(), 1, "{report:?}");
    assert!(
        report[0].starts_with("groups/g.json: membership of group g: leader \"x"),
        "{report:?}"
    );
    assert!(
        report[0].ends_with("is not a member; the group is loaded without members, who rejoin"),
        "{report:?}"
    );
    let d = c.describe("g").unwrap();
    assert_eq!((d.state, d.generation), (GroupState::Empty, 2));
    assert!(d.members.is_empty());
    assert_eq!(d.offsets.len(), 1);
}

fn native_req(member: &str, session_ms: u32) -> JoinRequest {
    JoinRequest {
        listener: GroupListener::Native,
        ..join_req(member, session_ms)
    }
}

/// The message of a join refused with INCONSISTENT_GROUP_PROTOCOL.
fn refused_inconsistent(r: Result<JoinResponse, GroupError>) -> String {
    match r {
        Err(e @ GroupError::InconsistentProtocol { .. }) => e.to_string(),
        other => panic!("not refused: {other:?}"),
    }
}

/// Native and Kafka consumers both join with protocol type `consumer` and the same
/// protocol names but encode subscriptions and assignments differently: a group with
/// members takes joins through its members' listener only (Kafka's
/// INCONSISTENT_GROUP_PROTOCOL for the other), and leaves its members as they were.
/// An empty group, committed offsets or not, is taken by either.
#[test]
fn a_group_with_members_takes_joins_through_their_listener_only() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let n = done(c.join(native_req("", 60_000))).unwrap();
    done(c.sync("g", 1, &n.member_id, None, vec![])).unwrap();
    let msg = refused_inconsistent(done(c.join(join_req("", 60_000))));
    assert_eq!(
        msg,
        "group g: its members joined through the native protocol, and a member cannot join \
         it through the Kafka listener (the two encode subscriptions and assignments \
         differently); use another group, or join once it has no members"
    );
    // Nothing changed for the member: no rebalance, no second member.
    c.heartbeat("g", 1, &n.member_id, None).unwrap();
    let d = c.describe("g").unwrap();
    assert_eq!(
        (d.state, d.generation, d.members.len()),
        (GroupState::Stable, 1, 1)
    );
    // A rebalancing group refuses too (its member rejoins, alone).
    let mut again = c.join(native_req("", 60_000));
    assert!(again.try_recv().is_err(), "waits for the first member");
    let msg = refused_inconsistent(done(c.join(join_req("", 60_000))));
    assert!(msg.contains("through the native protocol"), "{msg}");
    c.leave("g", &n.member_id, None).unwrap();
    let second = done(again).unwrap();
    c.leave("g", &second.member_id, None).unwrap();
    assert_eq!(c.describe("g").unwrap().state, GroupState::Empty);

    // Empty, with committed offsets: a Kafka member takes it.
    let offset = [OffsetCommit {
        partition: 0,
        offset: 5,
        metadata: String::new(),
    }];
    done(c.commit(&Topics, "g", -1, "", None, "t", &offset).unwrap()).unwrap();
    let k = done(c.join(join_req("", 60_000))).unwrap();
    done(c.sync("g", k.generation, &k.member_id, None, vec![])).unwrap();
    let msg = refused_inconsistent(done(c.join(native_req("", 60_000))));
    assert!(
        msg.contains("its members joined through the Kafka listener, and a member cannot join it through the native protocol"),
        "{msg}"
    );
    // A native member that names a Kafka member's id is refused the same way.
    let msg = refused_inconsistent(done(c.join(native_req(&k.member_id, 60_000))));
    assert!(msg.contains("the Kafka listener"), "{msg}");
    assert_eq!(c.describe("g").unwrap().members.len(), 1);
    // Once the Kafka member leaves, a native one takes the group and its offsets.
    c.leave("g", &k.member_id, None).unwrap();
    let n = done(c.join(native_req("", 60_000))).unwrap();
    assert_eq!(n.leader, n.member_id);
    let offsets = c
        .fetch_offsets("g", Some("t"), Some((&n.member_id, n.generation)))
        .unwrap();
    assert_eq!(offsets[0].offset, 5);
}

/// The listener of a Stable group's members is stored with its membership: after a
/// restart the group still refuses the other listener. A membership stored without
/// it loads with the listener unknown, and the next join sets it.
#[test]
fn the_members_listener_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let (a, b) = stable_pair_with_offset(&c, None);
    drop(c);
    let path = dir.path().join("groups/g.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"listener\": \"kafka\""), "{text}");

    let c = coordinator(dir.path());
    let msg = refused_inconsistent(done(c.join(native_req("", 60_000))));
    assert!(msg.contains("through the Kafka listener"), "{msg}");
    c.heartbeat("g", 2, &a, None).unwrap();
    drop(c);

    let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(old["membership"]
        .as_object_mut()
        .unwrap()
        .remove("listener")
        .is_some());
    std::fs::write(&path, old.to_string()).unwrap();
    let c = coordinator(dir.path());
    assert_eq!(c.describe("g").unwrap().members.len(), 2);
    // b rejoins through the Kafka listener, as it always did: the group is Kafka's.
    let j = done(c.join(join_req(&b, 60_000))).unwrap();
    assert_eq!(j.generation, 2);
    let msg = refused_inconsistent(done(c.join(native_req("", 60_000))));
    assert!(msg.contains("through the Kafka listener"), "{msg}");
}

/// A join that names no protocol type is refused (Kafka's INCONSISTENT_GROUP_PROTOCOL)
/// and makes no group.
#[test]
fn a_join_without_a_protocol_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    let req = JoinRequest {
        protocol_type: String::new(),
        ..join_req("", 60_000)
    };
    let msg = refused_inconsistent(done(c.join(req)));
    assert!(msg.contains("names no protocol type"), "{msg}");
    assert!(matches!(
        c.describe("g"),
        Err(GroupError::UnknownGroup { .. })
    ));
}

/// The records a replica write would produce, as the offsets topic would hold them
/// from `first` on.
fn as_records(w: &ReplicaWrite, first: u64) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    w.records()
        .enumerate()
        .map(|(i, (k, v))| (first + i as u64, k.to_vec(), v.to_vec()))
        .collect()
}

fn read_back(records: &[(u64, Vec<u8>, Vec<u8>)]) -> GroupRecords {
    let mut r = GroupRecords::default();
    for (o, k, v) in records {
        r.add(*o, Some(k), v);
    }
    r.finish()
}

#[test]
fn a_replica_serves_only_while_it_coordinates_and_answers_commits_once_written() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    c.replicate();
    // Not coordinating: refused, naming the coordinator once one is known.
    assert!(matches!(
        done(c.join(join_req("", 10_000))),
        Err(GroupError::NotCoordinator {
            coordinator: None,
            ..
        })
    ));
    assert!(
        c.take_wanted(),
        "a refusal with no coordinator asks for the topic"
    );
    c.set_coordinator(Some((2, "127.0.0.1:9402".into())));
    let e = c.describe("g").unwrap_err();
    assert_eq!(
        crate::format::wire::parse_not_leader(&e.to_string()),
        Some((2, "127.0.0.1:9402".into())),
        "{e}"
    );
    assert!(!c.take_wanted());

    c.take_over(GroupRecords::default());
    let a = done(c.join(join_req("", 10_000))).unwrap();
    done(c.sync(
        "g",
        1,
        &a.member_id,
        None,
        vec![(a.member_id.clone(), b"p".to_vec())],
    ))
    .unwrap();
    let commit = |offset| {
        let e = [OffsetCommit {
            partition: 0,
            offset,
            metadata: String::new(),
        }];
        c.commit(&Topics, "g", 1, &a.member_id, None, "t", &e)
            .unwrap()
    };
    let mut first = commit(5);
    // Not on disk: no group file is written by a replica.
    c.flush_if_dirty();
    assert!(std::fs::read_dir(dir.path().join("groups"))
        .unwrap()
        .next()
        .is_none());
    assert!(first.try_recv().is_err(), "answered before its write");
    let w = c.take_writes().expect("the group is to be written");
    let mut topic = as_records(&w, 0);
    assert!(
        c.fetch_offsets("g", None, None).unwrap().is_empty(),
        "staged only"
    );
    c.finish_writes(w, Ok(()));
    done(first).unwrap();
    assert_eq!(c.fetch_offsets("g", None, None).unwrap()[0].offset, 5);

    // A failed write drops its commit, and memory stays as the topic is.
    let second = commit(9);
    let w = c.take_writes().unwrap();
    c.finish_writes(
        w,
        Err(GroupError::Storage {
            group: "g".into(),
            detail: "no majority".into(),
        }),
    );
    assert!(done(second).is_err());
    assert_eq!(c.fetch_offsets("g", None, None).unwrap()[0].offset, 5);

    // A step-down refuses what waits and forgets the groups; another node's
    // take-over from the topic's records has the offsets and the Stable members.
    let third = commit(7);
    c.step_down(Some((3, "127.0.0.1:9403".into())));
    assert!(matches!(
        done(third),
        Err(GroupError::NotCoordinator { .. })
    ));
    assert!(c.heartbeat("g", 1, &a.member_id, None).is_err());
    let dir2 = tempfile::tempdir().unwrap();
    let other = coordinator(dir2.path());
    other.replicate();
    topic.push((1, b"not a group!".to_vec(), b"x".to_vec()));
    let loaded = read_back(&topic);
    assert_eq!(loaded.report.len(), 1, "{:?}", loaded.report);
    assert_eq!(other.take_over(loaded), 0);
    assert_eq!(other.fetch_offsets("g", None, None).unwrap()[0].offset, 5);
    other.heartbeat("g", 1, &a.member_id, None).unwrap();

    // A write that ends after a step-down and a new take-over answers its commit
    // but leaves the groups as the new take-over read them.
    let e = [OffsetCommit {
        partition: 0,
        offset: 11,
        metadata: String::new(),
    }];
    let late = other
        .commit(&Topics, "g", 1, &a.member_id, None, "t", &e)
        .unwrap();
    let w = other.take_writes().unwrap();
    other.step_down(None);
    other.take_over(read_back(&topic));
    other.finish_writes(w, Ok(()));
    done(late).unwrap();
    assert_eq!(other.fetch_offsets("g", None, None).unwrap()[0].offset, 5);
}

#[test]
fn the_last_record_of_a_group_wins_and_an_empty_one_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path());
    c.replicate();
    c.take_over(GroupRecords::default());
    let mut topic = Vec::new();
    for (group, offset) in [("a", 1), ("b", 2), ("a", 3)] {
        let e = [OffsetCommit {
            partition: 0,
            offset,
            metadata: String::new(),
        }];
        let rx = c.commit(&Topics, group, -1, "", None, "t", &e).unwrap();
        let w = c.take_writes().unwrap();
        let at = topic.len() as u64;
        topic.extend(as_records(&w, at));
        c.finish_writes(w, Ok(()));
        done(rx).unwrap();
    }
    let rx = c.delete("b").unwrap();
    let w = c.take_writes().unwrap();
    let at = topic.len() as u64;
    let removal = as_records(&w, at);
    assert!(removal[0].2.is_empty(), "a removal is an empty value");
    topic.extend(removal);
    c.finish_writes(w, Ok(()));
    done(rx).unwrap();
    let loaded = read_back(&topic);
    let names: Vec<&str> = loaded.groups().iter().map(|(g, _)| g.as_str()).collect();
    assert_eq!(names, ["a"]);
    assert_eq!(loaded.groups()[0].1.offsets[0].offset, 3);
    // A record that does not decode hides its group rather than bring back an older
    // offset.
    topic.push((99, b"a".to_vec(), b"{broken".to_vec()));
    let loaded = read_back(&topic);
    assert!(loaded.groups().is_empty());
    assert_eq!(loaded.report.len(), 1, "{:?}", loaded.report);
}

#[test]
fn a_take_over_brings_in_the_groups_of_files_the_topic_never_named() {
    let dir = tempfile::tempdir().unwrap();
    {
        // The node's groups from before it was in a cluster.
        let c = coordinator(dir.path());
        let e = [OffsetCommit {
            partition: 1,
            offset: 42,
            metadata: String::new(),
        }];
        done(c.commit(&Topics, "old", -1, "", None, "t", &e).unwrap()).unwrap();
        done(c.commit(&Topics, "gone", -1, "", None, "t", &e).unwrap()).unwrap();
    }
    let c = coordinator(dir.path());
    c.replicate();
    // The topic removed "gone": its file does not bring it back.
    let loaded = read_back(&[(0, b"gone".to_vec(), Vec::new())]);
    assert_eq!(c.take_over(loaded), 1);
    assert_eq!(c.fetch_offsets("old", None, None).unwrap()[0].offset, 42);
    assert!(c.fetch_offsets("gone", None, None).unwrap().is_empty());
    let w = c
        .take_writes()
        .expect("the imported group is written to the topic");
    assert_eq!(w.names(), "old");
}
