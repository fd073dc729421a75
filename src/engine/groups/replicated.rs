//! A cluster's groups: kept in the offsets topic ([`OFFSETS_TOPIC`], replicated like
//! any topic) instead of this node's `DATA/groups/`, and served by one node only,
//! the leader of the topic's partition 0, as Kafka's group coordinator is the leader
//! of a `__consumer_offsets` partition.
//!
//! - Every node's coordinator starts in the replica role ([`GroupCoordinator::replicate`])
//!   serving nothing: a request is refused with [`GroupError::NotCoordinator`] naming
//!   the coordinator the cluster knows, so clients go there.
//! - The node that becomes the partition's leader reads the partition's committed
//!   records (the last record of each group wins, an empty value removes it),
//!   [`decode_records`], and takes over with them ([`GroupCoordinator::take_over`]):
//!   committed offsets, and the membership of groups stored Stable, whose members go
//!   on heartbeating to the new coordinator.
//! - A change that the group file would hold (a commit, a group becoming or leaving
//!   Stable, a removal) is written as one record per group, the dirty groups of a
//!   pass in one produce ([`GroupCoordinator::take_writes`]); a commit is answered
//!   once that produce is committed on a majority and applied
//!   ([`GroupCoordinator::finish_writes`]). One write is in flight at a time, so the
//!   topic holds a group's changes in the order they were made.
//! - A node that stops leading the partition steps down
//!   ([`GroupCoordinator::step_down`]): every group is dropped from memory and every
//!   waiting join, sync and commit is refused with NOT_COORDINATOR.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::coordinator::Group;
use super::offsets::{Loaded, Pending};
use super::{lock, GroupCoordinator, GroupError};
use crate::format::group::{decode_group_file_keeping_offsets, GROUP_FILE_BYTES_MAX};
use crate::format::names::validate_name;

pub use super::OFFSETS_TOPIC;

/// Where a coordinator's groups live.
#[derive(Debug)]
pub(super) enum Role {
    /// In `DATA/groups/` (a single broker, or a node without `--peers`).
    Files,
    /// In the cluster's offsets topic.
    Replica {
        /// This node leads the offsets topic's partition and has loaded the groups.
        serving: bool,
        /// The coordinator to name in refusals (node id, client address).
        coordinator: Option<(u64, String)>,
    },
}

/// The groups a pass writes to the offsets topic, and the commits they answer.
#[derive(Debug)]
pub struct ReplicaWrite {
    pending: Vec<Pending>,
    /// The take-over it was made in: a write that ends after a step-down (and
    /// maybe a new take-over) answers its commits but changes no group in memory.
    term: u64,
}

impl ReplicaWrite {
    /// One record per group: (key, value); an empty value removes the group.
    pub fn records(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.pending
            .iter()
            .map(|p| (p.group.as_bytes(), p.bytes.as_deref().unwrap_or_default()))
    }

    /// How many groups the write holds.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Splits into writes of at most `max_bytes` of values each (a group larger
    /// than that goes alone), in order.
    pub fn split(self, max_bytes: usize) -> Vec<ReplicaWrite> {
        let mut out: Vec<ReplicaWrite> = Vec::new();
        let mut size = 0usize;
        for p in self.pending {
            let n = p.group.len() + p.bytes.as_ref().map_or(0, Vec::len);
            match out.last_mut() {
                Some(w) if size + n <= max_bytes => {
                    size += n;
                    w.pending.push(p);
                }
                _ => {
                    size = n;
                    out.push(ReplicaWrite {
                        pending: vec![p],
                        term: self.term,
                    });
                }
            }
        }
        out
    }

    /// The groups' names, for a message.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.pending.iter().map(|p| p.group.as_str()).collect();
        names.join(", ")
    }
}

impl GroupCoordinator {
    /// Keeps the groups in the cluster's offsets topic from now on: nothing is
    /// served until [`GroupCoordinator::take_over`]. Called before the listeners
    /// start; the groups loaded from `DATA/groups/` are dropped (a cluster node
    /// reads none: see docs/PROTOCOL.md).
    pub fn replicate(&self) {
        let mut groups = lock(&self.groups);
        groups.clear();
        *lock(&self.role) = Role::Replica {
            serving: false,
            coordinator: None,
        };
    }

    pub(super) fn replicated(&self) -> bool {
        matches!(*lock(&self.role), Role::Replica { .. })
    }

    /// Whether this node serves the groups now (always, outside a cluster).
    pub fn coordinating(&self) -> bool {
        matches!(
            *lock(&self.role),
            Role::Files | Role::Replica { serving: true, .. }
        )
    }

    /// The groups' map, if this node serves them; else the refusal naming the
    /// coordinator. The role is read under the groups' lock, so no request slips
    /// between a step-down and the groups it drops.
    pub(super) fn serve_lock(
        &self,
        group: &str,
    ) -> Result<MutexGuard<'_, BTreeMap<String, Group>>, GroupError> {
        let groups = lock(&self.groups);
        match &*lock(&self.role) {
            Role::Files | Role::Replica { serving: true, .. } => Ok(groups),
            Role::Replica {
                serving: false,
                coordinator,
            } => Err({
                // A request about a group (not a listing) when no node coordinates:
                // the offsets topic may not exist yet, and a failed create is said.
                if coordinator.is_none() && !group.is_empty() {
                    self.wanted.store(true, Ordering::Release);
                }
                GroupError::NotCoordinator {
                    group: group.to_string(),
                    coordinator: coordinator.clone(),
                }
            }),
        }
    }

    /// The coordinator to name in refusals while this node does not serve.
    pub fn set_coordinator(&self, coordinator: Option<(u64, String)>) {
        if let Role::Replica {
            serving: false,
            coordinator: c,
        } = &mut *lock(&self.role)
        {
            *c = coordinator;
        }
    }

    /// Starts serving `topic`, the groups as the offsets topic holds them. A group
    /// of this node's `DATA/groups/` that the topic never named (its groups from
    /// before the node was in a cluster, or from a version that kept a cluster's
    /// groups per node) is taken too and written to the topic, so that no committed
    /// offset is lost to the change. Returns how many groups were taken from files.
    pub fn take_over(&self, topic: GroupRecords) -> usize {
        let (files, _) = super::offsets::load_dir(&self.dir);
        let mut groups = lock(&self.groups);
        for g in groups.values_mut() {
            g.fail_waiters(&GroupError::ShuttingDown);
        }
        groups.clear();
        let mut imported = 0;
        for (name, l) in files {
            if !topic.named(&name) {
                let mut g = Group::loaded(name.clone(), l);
                g.dirty = true;
                groups.insert(name, g);
                imported += 1;
            }
        }
        for (name, l) in topic.groups {
            groups.insert(name.clone(), Group::loaded(name, l));
        }
        *lock(&self.role) = Role::Replica {
            serving: true,
            coordinator: None,
        };
        self.term.fetch_add(1, Ordering::AcqRel);
        self.dirty.store(imported > 0, Ordering::Release);
        drop(groups);
        if imported > 0 {
            self.replica_wake.notify_one();
        }
        imported
    }

    /// Notes that a client looks for the coordinator and none is known (Kafka's
    /// FindCoordinator): the offsets topic may not exist yet, and a failed create of
    /// it is then said on stderr.
    pub fn want(&self) {
        self.wanted.store(true, Ordering::Release);
    }

    /// Whether a request was refused for want of any coordinator since the last
    /// call (the offsets topic may not exist yet).
    pub fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::AcqRel)
    }

    /// Stops serving: every group is dropped, every waiting join, sync and commit is
    /// refused naming `coordinator`.
    pub fn step_down(&self, coordinator: Option<(u64, String)>) {
        let mut groups = lock(&self.groups);
        for (name, g) in groups.iter_mut() {
            let e = GroupError::NotCoordinator {
                group: name.clone(),
                coordinator: coordinator.clone(),
            };
            g.fail_waiters(&e);
            for w in g.commit_waiters.drain(..) {
                let _ = w.send(Err(e.clone()));
            }
        }
        groups.clear();
        *lock(&self.role) = Role::Replica {
            serving: false,
            coordinator,
        };
        self.term.fetch_add(1, Ordering::AcqRel);
    }

    /// Waits until a group may need writing (or the coordinator shuts down).
    pub async fn write_wanted(&self) {
        self.replica_wake.notified().await;
    }

    /// The dirty groups, to be written to the offsets topic as one produce; `None`
    /// when nothing is to be written (or this node does not serve).
    pub fn take_writes(&self) -> Option<ReplicaWrite> {
        if !self.dirty.swap(false, Ordering::AcqRel) || !self.coordinating() {
            return None;
        }
        // Read before the groups are taken: a step-down in between makes the write
        // one of an older term, which changes no group.
        let term = self.term.load(Ordering::Acquire);
        let pending = self.take_dirty();
        (!pending.is_empty()).then_some(ReplicaWrite { pending, term })
    }

    /// After the produce of `w`: its commits are applied and answered (`Ok`), or
    /// dropped and refused with the produce's error.
    pub fn finish_writes(&self, w: ReplicaWrite, result: Result<(), GroupError>) {
        let current = w.term == self.term.load(Ordering::Acquire);
        let mut removed = Vec::new();
        for p in w.pending {
            if result.is_ok() {
                self.file_writes.fetch_add(1, Ordering::Relaxed);
            }
            removed.extend(self.complete(p, &result, current));
        }
        self.forget_deleted(&removed);
    }

    /// Refuses every commit still waiting for its write (shutdown).
    pub(super) fn fail_unwritten(&self, e: &GroupError) {
        for g in lock(&self.groups).values_mut() {
            for w in g.commit_waiters.drain(..) {
                let _ = w.send(Err(e.clone()));
            }
        }
    }
}

/// The groups the offsets topic's records hold, read in offset order
/// ([`GroupRecords::add`]): the last record of each group wins, an empty value
/// removes the group. Only the last value of each group is kept while reading.
#[derive(Debug, Default)]
pub struct GroupRecords {
    last: BTreeMap<String, (u64, Vec<u8>)>,
    /// Lines for the log: records that are not a group's, or do not decode.
    pub report: Vec<String>,
    groups: Vec<(String, Loaded)>,
    /// Every group the topic named, removed ones included.
    named: std::collections::BTreeSet<String>,
}

impl GroupRecords {
    /// One record at `offset`.
    pub fn add(&mut self, offset: u64, key: Option<&[u8]>, value: &[u8]) {
        match key
            .and_then(|k| std::str::from_utf8(k).ok())
            .filter(|k| validate_name(k).is_ok())
        {
            Some(k) => {
                self.last.insert(k.to_string(), (offset, value.to_vec()));
            }
            None => self.report.push(format!(
                "{OFFSETS_TOPIC}/0 offset {offset}: the key is not a group name; record ignored"
            )),
        }
    }

    /// Decodes each group's last record. A record that does not decode (or names
    /// another group than its key) is reported and its group left out: an older
    /// record would bring back offsets the group has moved past.
    pub fn finish(mut self) -> GroupRecords {
        let last = std::mem::take(&mut self.last);
        for (name, (offset, value)) in last {
            self.named.insert(name.clone());
            if value.is_empty() {
                continue;
            }
            if value.len() > GROUP_FILE_BYTES_MAX {
                self.report.push(format!(
                    "{OFFSETS_TOPIC}/0 offset {offset}: group {name}: {} bytes, over the limit \
                     of {GROUP_FILE_BYTES_MAX}; the group is not loaded",
                    value.len()
                ));
                continue;
            }
            match decode_group_file_keeping_offsets(&value) {
                Ok((f, _)) if f.group != name => self.report.push(format!(
                    "{OFFSETS_TOPIC}/0 offset {offset}: names group {:?}, not its key \
                     {name:?}; the group is not loaded",
                    f.group
                )),
                Ok((f, membership_problem)) => {
                    if let Some(p) = &membership_problem {
                        self.report.push(format!(
                            "{OFFSETS_TOPIC}/0 offset {offset}: group {name}: {p}; the group \
                             is loaded without members, who rejoin"
                        ));
                    }
                    self.groups
                        .push((name, Loaded::from_file(f, membership_problem)));
                }
                Err(e) => self.report.push(format!(
                    "{OFFSETS_TOPIC}/0 offset {offset}: group {name}: {e}; the group is not \
                     loaded"
                )),
            }
        }
        self
    }

    /// The groups decoded by [`GroupRecords::finish`].
    pub fn groups(&self) -> &[(String, Loaded)] {
        &self.groups
    }

    fn named(&self, group: &str) -> bool {
        self.named.contains(group)
    }
}
