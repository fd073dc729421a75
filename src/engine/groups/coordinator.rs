//! The group state machine, as in Kafka's classic protocol:
//!
//! ```text
//! Empty ──join──▶ PreparingRebalance ──all joined / rebalance timeout──▶ CompletingRebalance
//!   ▲                 ▲      ▲                                                │ leader's sync
//!   └─last leaves─────┘      └──join, leave, session expiry──── Stable ◀──────┘
//! ```
//! Invariants: the generation grows by one at every completed join phase; only members
//! of the current generation may sync, heartbeat or commit; a member that has not
//! rejoined when the rebalance timeout ends is removed; a member whose session timeout
//! passes without a heartbeat is removed and triggers a rebalance.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::offsets::Loaded;
use super::*;
use crate::format::group::{
    encode_group_file, GroupFile, StoredMember, StoredMembership, StoredProtocol,
    GROUP_FILE_BYTES_MAX,
};

/// A timeout as whole milliseconds (join requests carry them as `u32`).
fn duration_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Where a group is in its rebalance cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    /// Kafka's name for the state.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }

    pub fn parse(s: &str) -> Option<GroupState> {
        [
            GroupState::Empty,
            GroupState::PreparingRebalance,
            GroupState::CompletingRebalance,
            GroupState::Stable,
        ]
        .into_iter()
        .find(|g| g.name() == s)
    }
}

#[derive(Debug)]
pub(super) struct Member {
    /// A static member's instance id (KIP-345).
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Vec<u8>)>,
    last_heartbeat: Instant,
    join_waiter: Option<oneshot::Sender<Result<JoinResponse, GroupError>>>,
    sync_waiter: Option<oneshot::Sender<Result<Vec<u8>, GroupError>>>,
    assignment: Vec<u8>,
}

#[derive(Debug)]
pub(super) struct Group {
    name: String,
    pub(super) state: GroupState,
    pub(super) generation: i32,
    protocol_type: String,
    /// The listener the members joined through (`None`: not known, for a group
    /// loaded from a file that does not say; the next join sets it).
    listener: Option<GroupListener>,
    protocol: String,
    leader: String,
    members: BTreeMap<String, Member>,
    rebalance_deadline: Option<Instant>,
    pub(super) offsets: BTreeMap<(String, u32), CommittedOffset>,
    pub(super) empty_since_ms: i64,
    /// The file must be replaced (or removed, when `deleted`).
    pub(super) dirty: bool,
    pub(super) deleted: bool,
    /// Commits whose file replace is not durable yet, oldest first: applied to
    /// `offsets` once it is, dropped if it fails (memory stays as the file is).
    pub(super) staged: Vec<CommittedOffset>,
    pub(super) commit_waiters: Vec<oneshot::Sender<Result<(), GroupError>>>,
}

impl Group {
    fn new(name: String) -> Group {
        Group {
            name,
            state: GroupState::Empty,
            generation: 0,
            protocol_type: String::new(),
            listener: None,
            protocol: String::new(),
            leader: String::new(),
            members: BTreeMap::new(),
            rebalance_deadline: None,
            offsets: BTreeMap::new(),
            empty_since_ms: now_ms(),
            dirty: false,
            deleted: false,
            staged: Vec::new(),
            commit_waiters: Vec::new(),
        }
    }

    pub(super) fn loaded(name: String, l: Loaded) -> Group {
        let mut g = Group::new(name);
        g.generation = l.generation;
        g.protocol_type = l.protocol_type;
        g.empty_since_ms = if l.empty_since_ms > 0 {
            l.empty_since_ms
        } else {
            now_ms()
        };
        g.offsets = l
            .offsets
            .into_iter()
            .map(|o| ((o.topic.clone(), o.partition), o))
            .collect();
        if let Some(m) = l.membership {
            // As Kafka's coordinator after loading a group: Stable, no waiters, and
            // every session starts now (a member that never returns expires).
            let now = Instant::now();
            g.state = GroupState::Stable;
            g.protocol = m.protocol;
            g.leader = m.leader;
            g.listener = m.listener;
            g.members = m
                .members
                .into_iter()
                .map(|m| {
                    let member = Member {
                        instance_id: m.instance_id,
                        client_id: m.client_id,
                        client_host: m.client_host,
                        session_timeout: Duration::from_millis(u64::from(m.session_timeout_ms)),
                        rebalance_timeout: Duration::from_millis(u64::from(m.rebalance_timeout_ms)),
                        protocols: m
                            .protocols
                            .into_iter()
                            .map(|p| (p.name, p.metadata))
                            .collect(),
                        last_heartbeat: now,
                        join_waiter: None,
                        sync_waiter: None,
                        assignment: m.assignment,
                    };
                    (m.member_id, member)
                })
                .collect();
        }
        g
    }

    /// The membership the group's file holds: only while the group is Stable.
    fn stored_membership(&self) -> Option<StoredMembership> {
        if self.state != GroupState::Stable || self.members.is_empty() {
            return None;
        }
        Some(StoredMembership {
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            listener: self.listener,
            members: self
                .members
                .iter()
                .map(|(id, m)| StoredMember {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: duration_ms(m.session_timeout),
                    rebalance_timeout_ms: duration_ms(m.rebalance_timeout),
                    protocols: m
                        .protocols
                        .iter()
                        .map(|(name, metadata)| StoredProtocol {
                            name: name.clone(),
                            metadata: metadata.clone(),
                        })
                        .collect(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        })
    }

    /// The content of the group's file, with the first `staged` staged commits, and
    /// with its membership when `membership` (and the group is Stable).
    pub(super) fn file(&self, staged: usize, membership: bool) -> GroupFile {
        let mut offsets = self.offsets.clone();
        for o in &self.staged[..staged.min(self.staged.len())] {
            offsets.insert((o.topic.clone(), o.partition), o.clone());
        }
        let membership = membership.then(|| self.stored_membership()).flatten();
        GroupFile {
            version: GroupFile::version_for(membership.as_ref()),
            group: self.name.clone(),
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            empty_since_ms: if self.members.is_empty() {
                self.empty_since_ms
            } else {
                0
            },
            offsets: offsets.into_values().collect(),
            membership,
        }
    }

    pub(super) fn fail_waiters(&mut self, e: &GroupError) {
        for m in self.members.values_mut() {
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(Err(e.clone()));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(Err(e.clone()));
            }
        }
    }

    fn is_empty_and_clean(&self) -> bool {
        self.members.is_empty() && self.offsets.is_empty() && self.staged.is_empty() && !self.dirty
    }

    fn check_member(&self, member: &str) -> Result<(), GroupError> {
        if self.members.contains_key(member) {
            Ok(())
        } else {
            Err(GroupError::UnknownMember {
                group: self.name.clone(),
                member: member.to_string(),
            })
        }
    }

    /// The id of the member that holds static instance id `instance`.
    fn static_member(&self, instance: &str) -> Option<&String> {
        self.members
            .iter()
            .find(|(_, m)| m.instance_id.as_deref() == Some(instance))
            .map(|(id, _)| id)
    }

    /// Checks the member a request names, as Kafka does: with an instance id, that
    /// id must be known and held by `member` (else the member was replaced by a newer
    /// one with the same instance id: fenced); without one, `member` must be known.
    fn check_current(&self, member: &str, instance: Option<&str>) -> Result<(), GroupError> {
        let Some(instance) = instance else {
            return self.check_member(member);
        };
        match self.static_member(instance) {
            None => Err(GroupError::UnknownMember {
                group: self.name.clone(),
                member: member.to_string(),
            }),
            Some(id) if id != member => Err(GroupError::FencedInstance {
                group: self.name.clone(),
                instance: instance.to_string(),
                member: member.to_string(),
            }),
            Some(_) => Ok(()),
        }
    }

    /// The protocol every member supports, in the leader's order of preference.
    fn choose_protocol(&self) -> Option<String> {
        let leader = self
            .members
            .get(&self.leader)
            .or_else(|| self.members.values().next())?;
        leader
            .protocols
            .iter()
            .map(|(n, _)| n)
            .find(|p| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == *p))
            })
            .cloned()
    }

    fn check_generation(&self, generation: i32) -> Result<(), GroupError> {
        if generation == self.generation {
            Ok(())
        } else {
            Err(GroupError::IllegalGeneration {
                group: self.name.clone(),
                generation,
                current: self.generation,
            })
        }
    }

    fn rebalancing(&self) -> GroupError {
        GroupError::RebalanceInProgress {
            group: self.name.clone(),
        }
    }

    /// Starts a rebalance (or restarts its clock): pending syncs are told to rejoin.
    fn prepare_rebalance(&mut self, now: Instant) {
        if self.members.is_empty() {
            self.become_empty();
            return;
        }
        let err = self.rebalancing();
        for m in self.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(Err(err.clone()));
            }
        }
        if self.state == GroupState::Stable {
            // The file holds the membership of a Stable group: rewrite it without.
            self.dirty = true;
        }
        if self.state != GroupState::PreparingRebalance {
            let timeout = self
                .members
                .values()
                .map(|m| m.rebalance_timeout)
                .max()
                .unwrap_or_default();
            self.rebalance_deadline = Some(now + timeout);
            self.state = GroupState::PreparingRebalance;
        }
    }

    fn become_empty(&mut self) {
        if self.state != GroupState::Empty {
            self.generation += 1;
            self.dirty = true;
        }
        self.state = GroupState::Empty;
        self.protocol.clear();
        self.leader.clear();
        self.rebalance_deadline = None;
        self.empty_since_ms = now_ms();
    }

    /// Ends the join phase when every member has rejoined, or when `force` (the
    /// rebalance timeout passed: members that did not rejoin are removed).
    fn maybe_complete_join(&mut self, force: bool) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let all = self.members.values().all(|m| m.join_waiter.is_some());
        if !all && !force {
            return;
        }
        self.members.retain(|_, m| m.join_waiter.is_some());
        if self.members.is_empty() {
            self.become_empty();
            return;
        }
        if !self.members.contains_key(&self.leader) {
            self.leader = self.members.keys().next().cloned().unwrap_or_default();
        }
        let chosen = self.choose_protocol();
        self.generation += 1;
        self.dirty = true;
        self.rebalance_deadline = None;
        let Some(protocol) = chosen else {
            // Cannot happen: joins with no common protocol are refused up front.
            let e = GroupError::InconsistentProtocol {
                group: self.name.clone(),
                detail: "no protocol common to every member".into(),
            };
            self.fail_waiters(&e);
            self.members.clear();
            self.become_empty();
            return;
        };
        self.protocol = protocol;
        self.state = GroupState::CompletingRebalance;
        let all_metadata: Vec<(String, Option<String>, Vec<u8>)> = self
            .members
            .iter()
            .map(|(id, m)| {
                let meta = m
                    .protocols
                    .iter()
                    .find(|(n, _)| *n == self.protocol)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_default();
                (id.clone(), m.instance_id.clone(), meta)
            })
            .collect();
        let now = Instant::now();
        for (id, m) in &mut self.members {
            m.last_heartbeat = now;
            m.assignment.clear();
            if let Some(w) = m.join_waiter.take() {
                let members = if *id == self.leader {
                    all_metadata.clone()
                } else {
                    Vec::new()
                };
                let _ = w.send(Ok(JoinResponse {
                    generation: self.generation,
                    protocol: self.protocol.clone(),
                    leader: self.leader.clone(),
                    member_id: id.clone(),
                    members,
                }));
            }
        }
        // The leader's sync must come within the rebalance timeout.
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        self.rebalance_deadline = Some(now + timeout);
    }

    /// A static member rejoined (no member id, a known instance id): the member
    /// `old` holds its place under the new id `new`. The old id is fenced: a join or
    /// sync it waits on is answered FENCED_INSTANCE_ID, and so are its later requests
    /// that name the instance id.
    fn replace_static_member(&mut self, old: &str, new: &str) {
        let Some(mut m) = self.members.remove(old) else {
            return;
        };
        let e = GroupError::FencedInstance {
            group: self.name.clone(),
            instance: m.instance_id.clone().unwrap_or_default(),
            member: old.to_string(),
        };
        if let Some(w) = m.join_waiter.take() {
            let _ = w.send(Err(e.clone()));
        }
        if let Some(w) = m.sync_waiter.take() {
            let _ = w.send(Err(e));
        }
        self.members.insert(new.to_string(), m);
        if self.leader == old {
            self.leader = new.to_string();
        }
    }

    fn remove_member(&mut self, member: &str, now: Instant) {
        if let Some(mut m) = self.members.remove(member) {
            let e = GroupError::UnknownMember {
                group: self.name.clone(),
                member: member.to_string(),
            };
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(Err(e.clone()));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(Err(e));
            }
        }
        self.prepare_rebalance(now);
        self.maybe_complete_join(false);
    }

    fn tick(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.join_waiter.is_none() && now.duration_since(m.last_heartbeat) > m.session_timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.name, member = %id, "session timeout: member removed");
            self.remove_member(&id, now);
        }
        if let Some(deadline) = self.rebalance_deadline {
            if now >= deadline {
                match self.state {
                    GroupState::PreparingRebalance => self.maybe_complete_join(true),
                    GroupState::CompletingRebalance => {
                        // The leader never synced: start over without it.
                        let leader = self.leader.clone();
                        self.remove_member(&leader, now);
                    }
                    _ => self.rebalance_deadline = None,
                }
            }
        }
    }
}

fn check_len(what: &'static str, s: &str) -> Result<(), GroupError> {
    if s.len() > GROUP_ID_BYTES_MAX {
        return Err(GroupError::TooLarge {
            what,
            max: GROUP_ID_BYTES_MAX,
        });
    }
    Ok(())
}

impl GroupCoordinator {
    fn check_join(&self, req: &JoinRequest) -> Result<(), GroupError> {
        check_group_name(&req.group)?;
        check_len("member id", &req.member_id)?;
        check_len("client id", &req.client_id)?;
        check_len("client host", &req.client_host)?;
        if let Some(i) = &req.group_instance_id {
            check_len("group instance id", i)?;
        }
        check_len("protocol type", &req.protocol_type)?;
        if req.protocol_type.is_empty() {
            // As Kafka: a member must say what kind of group it joins.
            return Err(GroupError::InconsistentProtocol {
                group: req.group.clone(),
                detail: "a join names no protocol type".into(),
            });
        }
        let ms = u64::from(req.session_timeout_ms);
        let (min, max) = (
            self.opts.session_timeout_min.as_millis() as u64,
            self.opts.session_timeout_max.as_millis() as u64,
        );
        if ms < min || ms > max {
            return Err(GroupError::InvalidSessionTimeout { ms, min, max });
        }
        if req.protocols.is_empty() || req.protocols.len() > PROTOCOLS_PER_JOIN_MAX {
            return Err(GroupError::InconsistentProtocol {
                group: req.group.clone(),
                detail: format!(
                    "a join offers 1..={PROTOCOLS_PER_JOIN_MAX} protocols, not {}",
                    req.protocols.len()
                ),
            });
        }
        for (name, meta) in &req.protocols {
            check_len("protocol name", name)?;
            if meta.len() > GROUP_BLOB_BYTES_MAX {
                return Err(GroupError::TooLarge {
                    what: "protocol metadata",
                    max: GROUP_BLOB_BYTES_MAX,
                });
            }
        }
        Ok(())
    }

    /// Joins (or rejoins) a group. Completes when the join phase of the rebalance
    /// ends: at once for a known member of a stable group whose protocols did not
    /// change and who is not the leader, else once every member rejoined or the
    /// rebalance timeout passed.
    pub fn join(&self, req: JoinRequest) -> Completion<JoinResponse> {
        let group = req.group.clone();
        let rx = self.join_locked(req);
        self.wake_if_dirty(&group);
        rx
    }

    /// Asks for a pass of the group commit if `group` must be written (it became or
    /// stopped being Stable), so that its file follows without waiting for a tick.
    fn wake_if_dirty(&self, group: &str) {
        let dirty = lock(&self.groups).get(group).is_some_and(|g| g.dirty);
        if dirty {
            self.wake_committer();
        }
    }

    fn join_locked(&self, req: JoinRequest) -> Completion<JoinResponse> {
        let (tx, rx) = oneshot::channel();
        if let Err(e) = self.check_join(&req) {
            let _ = tx.send(Err(e));
            return rx;
        }
        if self.stop.load(Ordering::Acquire) {
            let _ = tx.send(Err(GroupError::ShuttingDown));
            return rx;
        }
        let now = Instant::now();
        let mut groups = match self.serve_lock(&req.group) {
            Ok(g) => g,
            Err(e) => {
                let _ = tx.send(Err(e));
                return rx;
            }
        };
        if !groups.contains_key(&req.group) && groups.len() >= GROUPS_MAX {
            let _ = tx.send(Err(GroupError::TooLarge {
                what: "number of groups",
                max: GROUPS_MAX,
            }));
            return rx;
        }
        let g = groups
            .entry(req.group.clone())
            .or_insert_with(|| Group::new(req.group.clone()));
        if g.deleted {
            // A group deleted and not yet removed from disk: start it afresh.
            g.deleted = false;
            g.offsets.clear();
        }
        if !g.members.is_empty()
            && !g.protocol_type.is_empty()
            && g.protocol_type != req.protocol_type
        {
            let _ = tx.send(Err(GroupError::InconsistentProtocol {
                group: req.group.clone(),
                detail: format!(
                    "protocol type {:?} differs from the group's {:?}",
                    req.protocol_type, g.protocol_type
                ),
            }));
            return rx;
        }
        if let Some(theirs) = g
            .listener
            .filter(|l| *l != req.listener && !g.members.is_empty())
        {
            // The members' subscriptions and assignments would not decode: refuse, as
            // Kafka refuses a member whose protocols the group cannot use.
            tracing::info!(group = %req.group, members = theirs.name(), joining = req.listener.name(),
                "join refused: the group's members joined through the other listener");
            let _ = tx.send(Err(GroupError::InconsistentProtocol {
                group: req.group.clone(),
                detail: format!(
                    "its members joined through {}, and a member cannot join it through {} \
                     (the two encode subscriptions and assignments differently); use another \
                     group, or join once it has no members",
                    theirs.described(),
                    req.listener.described()
                ),
            }));
            return rx;
        }
        let is_new = req.member_id.is_empty();
        let instance = req.group_instance_id.as_deref();
        // A static member rejoining without its member id takes the place of the
        // member that holds its instance id (Kafka's KIP-345).
        let replacing = instance
            .filter(|_| is_new)
            .and_then(|i| g.static_member(i))
            .cloned();
        if !is_new {
            if let Some(i) = instance {
                if g.static_member(i).is_some_and(|id| *id != req.member_id) {
                    let _ = tx.send(Err(GroupError::FencedInstance {
                        group: req.group.clone(),
                        instance: i.to_string(),
                        member: req.member_id.clone(),
                    }));
                    return rx;
                }
            }
        }
        if !g.members.is_empty() {
            let common = req.protocols.iter().any(|(n, _)| {
                g.members
                    .iter()
                    .filter(|(id, _)| **id != req.member_id && Some(*id) != replacing.as_ref())
                    .all(|(_, m)| m.protocols.iter().any(|(p, _)| p == n))
            });
            if !common {
                let _ = tx.send(Err(GroupError::InconsistentProtocol {
                    group: req.group.clone(),
                    detail: "none of the offered protocols is supported by every member".into(),
                }));
                return rx;
            }
        }
        // The leader as it was before a static member's place changed hands: a
        // replaced leader's successor is told of the old id, so it does not take
        // itself for the leader of a stable group (whose assignment it would redo
        // for nothing).
        let leader_before = g.leader.clone();
        let member_id = if is_new {
            if replacing.is_none() && g.members.len() >= MEMBERS_PER_GROUP_MAX {
                let _ = tx.send(Err(GroupError::TooLarge {
                    what: "number of members",
                    max: MEMBERS_PER_GROUP_MAX,
                }));
                return rx;
            }
            let n = self.next_member.fetch_add(1, Ordering::Relaxed);
            let client = if req.client_id.is_empty() {
                "member"
            } else {
                req.client_id.as_str()
            };
            let id = format!("{}-{}-{n}", &client[..client.len().min(64)], now_ms());
            match &replacing {
                Some(old) => {
                    tracing::info!(group = %req.group, old = %old, new = %id,
                        instance = instance.unwrap_or_default(),
                        "static member rejoined: its new member id replaces the old one");
                    g.replace_static_member(old, &id);
                }
                None => {
                    g.members.insert(
                        id.clone(),
                        Member {
                            instance_id: req.group_instance_id.clone(),
                            client_id: req.client_id.clone(),
                            client_host: req.client_host.clone(),
                            session_timeout: Duration::from_millis(u64::from(
                                req.session_timeout_ms,
                            )),
                            rebalance_timeout: Duration::from_millis(u64::from(
                                req.rebalance_timeout_ms,
                            )),
                            protocols: req.protocols.clone(),
                            last_heartbeat: now,
                            join_waiter: None,
                            sync_waiter: None,
                            assignment: Vec::new(),
                        },
                    );
                }
            }
            id
        } else if !g.members.contains_key(&req.member_id) {
            let _ = tx.send(Err(GroupError::UnknownMember {
                group: req.group.clone(),
                member: req.member_id.clone(),
            }));
            return rx;
        } else {
            req.member_id.clone()
        };
        g.protocol_type.clone_from(&req.protocol_type);
        g.listener = Some(req.listener);
        let is_leader = g.leader == member_id;
        let Some(m) = g.members.get_mut(&member_id) else {
            return rx;
        };
        let same_protocols = m.protocols == req.protocols;
        m.protocols = req.protocols;
        m.client_id = req.client_id;
        m.client_host = req.client_host;
        m.session_timeout = Duration::from_millis(u64::from(req.session_timeout_ms));
        m.rebalance_timeout = Duration::from_millis(u64::from(req.rebalance_timeout_ms));
        m.last_heartbeat = now;
        if let Some(old) = m.join_waiter.take() {
            let _ = old.send(Err(GroupError::RebalanceInProgress {
                group: req.group.clone(),
            }));
        }
        let immediate = match (&replacing, g.state) {
            // As Kafka: a stable group whose protocol the rejoined static member
            // leaves as it is goes on without a rebalance; the member gets the
            // current generation and, at its sync, its predecessor's assignment.
            (Some(_), GroupState::Stable) => {
                g.choose_protocol().as_deref() == Some(g.protocol.as_str())
            }
            // Assignments handed out now would name the old member id: rebalance.
            (Some(_), _) => false,
            (None, GroupState::Stable) => !is_new && same_protocols && !is_leader,
            (None, GroupState::CompletingRebalance) => !is_new && same_protocols,
            (None, _) => false,
        };
        if immediate {
            if g.state == GroupState::Stable {
                // A member id or a member's details changed: the stored membership
                // follows (written in the next pass).
                g.dirty = true;
            }
            let leader = if replacing.is_some() {
                leader_before
            } else {
                g.leader.clone()
            };
            let _ = tx.send(Ok(JoinResponse {
                generation: g.generation,
                protocol: g.protocol.clone(),
                leader,
                member_id,
                members: Vec::new(),
            }));
            return rx;
        }
        let Some(m) = g.members.get_mut(&member_id) else {
            return rx;
        };
        m.join_waiter = Some(tx);
        g.prepare_rebalance(now);
        g.maybe_complete_join(false);
        rx
    }

    /// Sync: the leader hands in every member's assignment; each member gets its
    /// own once the leader's sync arrived. `instance`: the static instance id the
    /// request names (Kafka's SyncGroup v3+).
    pub fn sync(
        &self,
        group: &str,
        generation: i32,
        member: &str,
        instance: Option<&str>,
        assignments: Vec<(String, Vec<u8>)>,
    ) -> Completion<Vec<u8>> {
        let (tx, rx) = oneshot::channel();
        let mut became_stable = false;
        let result = (|| {
            check_group_name(group)?;
            let mut groups = self.serve_lock(group)?;
            let g = groups
                .get_mut(group)
                .ok_or_else(|| GroupError::UnknownMember {
                    group: group.to_string(),
                    member: member.to_string(),
                })?;
            g.check_current(member, instance)?;
            g.check_generation(generation)?;
            if assignments
                .iter()
                .any(|(_, a)| a.len() > GROUP_BLOB_BYTES_MAX)
            {
                return Err(GroupError::TooLarge {
                    what: "assignment",
                    max: GROUP_BLOB_BYTES_MAX,
                });
            }
            match g.state {
                GroupState::Empty | GroupState::PreparingRebalance => Err(g.rebalancing()),
                GroupState::Stable => {
                    let a = g.members.get(member).map(|m| m.assignment.clone());
                    Ok(Some(a.unwrap_or_default()))
                }
                GroupState::CompletingRebalance => {
                    if member == g.leader {
                        let mut given: BTreeMap<String, Vec<u8>> =
                            assignments.into_iter().collect();
                        for (id, m) in &mut g.members {
                            m.assignment = given.remove(id).unwrap_or_default();
                            if let Some(w) = m.sync_waiter.take() {
                                let _ = w.send(Ok(m.assignment.clone()));
                            }
                        }
                        g.state = GroupState::Stable;
                        g.rebalance_deadline = None;
                        // The file now holds the membership.
                        g.dirty = true;
                        became_stable = true;
                        let a = g.members.get(member).map(|m| m.assignment.clone());
                        Ok(Some(a.unwrap_or_default()))
                    } else {
                        Ok(None)
                    }
                }
            }
        })();
        if became_stable {
            self.wake_committer();
        }
        match result {
            Ok(Some(a)) => {
                let _ = tx.send(Ok(a));
            }
            Ok(None) => {
                let mut groups = lock(&self.groups);
                match groups
                    .get_mut(group)
                    .and_then(|g| g.members.get_mut(member))
                {
                    Some(m) => m.sync_waiter = Some(tx),
                    None => {
                        let _ = tx.send(Err(GroupError::UnknownMember {
                            group: group.to_string(),
                            member: member.to_string(),
                        }));
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
        rx
    }

    /// A member's heartbeat. `RebalanceInProgress` tells it to rejoin. `instance`:
    /// the static instance id the request names (Kafka's Heartbeat v3+).
    pub fn heartbeat(
        &self,
        group: &str,
        generation: i32,
        member: &str,
        instance: Option<&str>,
    ) -> Result<(), GroupError> {
        check_group_name(group)?;
        let mut groups = self.serve_lock(group)?;
        let g = groups
            .get_mut(group)
            .ok_or_else(|| GroupError::UnknownMember {
                group: group.to_string(),
                member: member.to_string(),
            })?;
        g.check_current(member, instance)?;
        if let Some(m) = g.members.get_mut(member) {
            m.last_heartbeat = Instant::now();
        }
        if g.state == GroupState::PreparingRebalance {
            return Err(g.rebalancing());
        }
        g.check_generation(generation)?;
        if g.state == GroupState::CompletingRebalance {
            return Err(g.rebalancing());
        }
        Ok(())
    }

    /// A member leaves; the others rebalance. As in Kafka's LeaveGroup v3+, a
    /// static member may be named by its `instance` id alone (an empty `member`);
    /// with both, the instance id must be the member's.
    pub fn leave(
        &self,
        group: &str,
        member: &str,
        instance: Option<&str>,
    ) -> Result<(), GroupError> {
        check_group_name(group)?;
        let mut groups = self.serve_lock(group)?;
        let g = groups
            .get_mut(group)
            .ok_or_else(|| GroupError::UnknownGroup {
                group: group.to_string(),
            })?;
        let id = match instance {
            Some(i) if member.is_empty() => {
                g.static_member(i)
                    .cloned()
                    .ok_or_else(|| GroupError::UnknownMember {
                        group: group.to_string(),
                        member: format!("(instance {i:?})"),
                    })?
            }
            _ => {
                g.check_current(member, instance)?;
                member.to_string()
            }
        };
        g.remove_member(&id, Instant::now());
        drop(groups);
        self.wake_if_dirty(group);
        Ok(())
    }

    /// Commits offsets of `topic` (Kafka's OffsetCommit). A member commits with its generation and id
    /// (and `instance`, a static member's instance id, from OffsetCommit v7+); an
    /// admin commit (generation -1, empty member) is accepted only while the group
    /// has no members. The completion fires once the group file holding the commit
    /// is durable.
    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of Kafka's OffsetCommit"
    )]
    pub fn commit(
        &self,
        topics: &dyn TopicLookup,
        group: &str,
        generation: i32,
        member: &str,
        instance: Option<&str>,
        topic: &str,
        entries: &[OffsetCommit],
    ) -> Result<Completion<()>, GroupError> {
        check_group_name(group)?;
        let partitions = match topics.partition_count(topic) {
            Some(n) => n,
            // A cluster's topic may be held by other nodes only: its partitions are
            // not checked here.
            None if self.replicated() => u32::MAX,
            None => {
                return Err(GroupError::UnknownTopic {
                    topic: topic.to_string(),
                })
            }
        };
        for e in entries {
            check_metadata(&e.metadata)?;
            // Kafka's offsets are i64: a larger one could not be told to its clients.
            if e.offset > i64::MAX as u64 {
                return Err(GroupError::TooLarge {
                    what: "committed offset",
                    max: i64::MAX as usize,
                });
            }
            if e.partition >= partitions {
                return Err(GroupError::UnknownPartition {
                    topic: topic.to_string(),
                    partition: e.partition,
                    partitions,
                });
            }
        }
        if self.stop.load(Ordering::Acquire) {
            return Err(GroupError::ShuttingDown);
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut groups = self.serve_lock(group)?;
            let admin = generation < 0 && member.is_empty();
            if admin {
                if !groups.contains_key(group) && groups.len() >= GROUPS_MAX {
                    return Err(GroupError::TooLarge {
                        what: "number of groups",
                        max: GROUPS_MAX,
                    });
                }
                let g = groups
                    .entry(group.to_string())
                    .or_insert_with(|| Group::new(group.to_string()));
                if !g.members.is_empty() {
                    return Err(GroupError::GroupNotEmpty {
                        group: group.to_string(),
                        members: g.members.len(),
                    });
                }
                g.deleted = false;
            } else {
                let g = groups
                    .get_mut(group)
                    .ok_or_else(|| GroupError::UnknownMember {
                        group: group.to_string(),
                        member: member.to_string(),
                    })?;
                g.check_current(member, instance)?;
                g.check_generation(generation)?;
                // As in Kafka: members of the current generation may commit while the
                // next rebalance prepares (they commit before giving partitions up),
                // not while assignments are being handed out.
                if g.state == GroupState::CompletingRebalance {
                    return Err(g.rebalancing());
                }
            }
            let Some(g) = groups.get_mut(group) else {
                return Err(GroupError::UnknownGroup {
                    group: group.to_string(),
                });
            };
            let new_keys = g
                .staged
                .iter()
                .map(|o| (o.topic.as_str(), o.partition))
                .chain(entries.iter().map(|e| (topic, e.partition)))
                .filter(|(t, p)| !g.offsets.contains_key(&(t.to_string(), *p)))
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            if g.offsets.len() + new_keys > crate::format::group::GROUP_OFFSETS_MAX {
                return Err(GroupError::TooLarge {
                    what: "number of committed offsets",
                    max: crate::format::group::GROUP_OFFSETS_MAX,
                });
            }
            let at = now_ms();
            // Staged: visible (fetch, describe) once the file holding them is durable.
            for e in entries {
                g.staged.push(CommittedOffset {
                    topic: topic.to_string(),
                    partition: e.partition,
                    offset: e.offset,
                    metadata: e.metadata.clone(),
                    commit_ms: at,
                });
            }
            g.dirty = true;
            g.commit_waiters.push(tx);
        }
        self.wake_committer();
        Ok(rx)
    }

    /// Committed offsets of `group` (of one topic, or all); `None` for a group the
    /// broker does not know. With a member and generation, they are checked.
    pub fn fetch_offsets(
        &self,
        group: &str,
        topic: Option<&str>,
        member: Option<(&str, i32)>,
    ) -> Result<Vec<CommittedOffset>, GroupError> {
        check_group_name(group)?;
        let groups = self.serve_lock(group)?;
        let Some(g) = groups.get(group).filter(|g| !g.deleted) else {
            return match member {
                Some((m, _)) => Err(GroupError::UnknownMember {
                    group: group.to_string(),
                    member: m.to_string(),
                }),
                None => Ok(Vec::new()),
            };
        };
        if let Some((m, generation)) = member {
            g.check_member(m)?;
            g.check_generation(generation)?;
        }
        Ok(g.offsets
            .values()
            .filter(|o| topic.is_none_or(|t| o.topic == t))
            .cloned()
            .collect())
    }

    /// Every group: name and state.
    pub fn list(&self) -> Result<Vec<(String, GroupState)>, GroupError> {
        Ok(self
            .serve_lock("")?
            .values()
            .filter(|g| !g.deleted)
            .map(|g| (g.name.clone(), g.state))
            .collect())
    }

    /// One group's state, members and committed offsets.
    pub fn describe(&self, group: &str) -> Result<GroupDescription, GroupError> {
        check_group_name(group)?;
        let groups = self.serve_lock(group)?;
        let g =
            groups
                .get(group)
                .filter(|g| !g.deleted)
                .ok_or_else(|| GroupError::UnknownGroup {
                    group: group.to_string(),
                })?;
        Ok(GroupDescription {
            group: g.name.clone(),
            state: g.state,
            generation: g.generation,
            protocol_type: g.protocol_type.clone(),
            protocol: g.protocol.clone(),
            members: g
                .members
                .iter()
                .map(|(id, m)| MemberDescription {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
            offsets: g.offsets.values().cloned().collect(),
        })
    }

    /// Deletes a group without members: its offsets and its file. The completion
    /// fires once the removal is durable.
    pub fn delete(&self, group: &str) -> Result<Completion<()>, GroupError> {
        check_group_name(group)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut groups = self.serve_lock(group)?;
            let g = groups
                .get_mut(group)
                .filter(|g| !g.deleted)
                .ok_or_else(|| GroupError::UnknownGroup {
                    group: group.to_string(),
                })?;
            if !g.members.is_empty() {
                return Err(GroupError::GroupNotEmpty {
                    group: group.to_string(),
                    members: g.members.len(),
                });
            }
            // Commits still waiting for their file are superseded by the removal.
            g.offsets.clear();
            g.staged.clear();
            g.deleted = true;
            g.dirty = true;
            g.commit_waiters.push(tx);
        }
        self.wake_committer();
        Ok(rx)
    }

    /// Moves time on: session expiry, rebalance timeouts, and (with `topics`, the
    /// partition counts of existing topics) offsets of deleted topics and of
    /// partitions that no longer exist are dropped; empty groups past the offsets
    /// retention lose their offsets.
    pub fn tick(&self, now: Instant, topics: Option<&BTreeMap<String, u32>>) {
        // A cluster node knows the topics it holds only: offsets are not dropped
        // for topics it does not have.
        let topics = topics.filter(|_| !self.replicated());
        let mut wake = false;
        {
            let mut groups = lock(&self.groups);
            let retention_ms = self.opts.offsets_retention.as_millis() as i64;
            let wall = now_ms();
            for g in groups.values_mut() {
                g.tick(now);
                if let Some(known) = topics {
                    let before = g.offsets.len();
                    g.offsets
                        .retain(|(t, p), _| known.get(t).is_some_and(|n| p < n));
                    if g.offsets.len() != before {
                        g.dirty = true;
                    }
                }
                if g.members.is_empty() && !g.offsets.is_empty() && g.state == GroupState::Empty {
                    let newest = g.offsets.values().map(|o| o.commit_ms).max().unwrap_or(0);
                    if wall.saturating_sub(newest.max(g.empty_since_ms)) > retention_ms {
                        g.offsets.clear();
                        g.dirty = true;
                    }
                }
                if g.is_empty_and_clean() && g.state == GroupState::Empty && !g.deleted {
                    // Nothing left to keep: remove the file.
                    g.deleted = true;
                    g.dirty = true;
                }
                wake |= g.dirty;
            }
        }
        if wake {
            self.wake_committer();
        }
    }

    /// Takes what must be written: (group, file bytes or `None` to remove, waiters).
    pub(super) fn take_dirty(&self) -> Vec<offsets::Pending> {
        let mut groups = lock(&self.groups);
        let mut out = Vec::new();
        for g in groups.values_mut().filter(|g| g.dirty) {
            g.dirty = false;
            let staged = g.staged.len();
            let bytes = (!g.deleted).then(|| {
                let bytes = encode_group_file(&g.file(staged, true));
                if bytes.len() <= GROUP_FILE_BYTES_MAX {
                    return bytes;
                }
                // A file no reader would accept: keep the offsets, and the members
                // rejoin after a restart.
                tracing::warn!(group = %g.name, bytes = bytes.len(),
                    "group file with membership over the size limit: membership not stored");
                encode_group_file(&g.file(staged, false))
            });
            out.push(offsets::Pending {
                group: g.name.clone(),
                bytes,
                staged,
                waiters: std::mem::take(&mut g.commit_waiters),
            });
        }
        out
    }

    /// After the write of `p`: its staged commits are applied (`ok`) or dropped, so
    /// that memory holds what the file holds.
    pub(super) fn settle(&self, p: &offsets::Pending, ok: bool) {
        let mut groups = lock(&self.groups);
        let Some(g) = groups.get_mut(&p.group) else {
            return;
        };
        let n = p.staged.min(g.staged.len());
        for o in g.staged.drain(..n) {
            if ok {
                g.offsets.insert((o.topic.clone(), o.partition), o);
            }
        }
    }

    /// Forgets groups whose removal is durable and that nobody rejoined since.
    pub(super) fn forget_deleted(&self, names: &[String]) {
        let mut groups = lock(&self.groups);
        for n in names {
            if groups
                .get(n)
                .is_some_and(|g| g.deleted && !g.dirty && g.members.is_empty())
            {
                groups.remove(n);
            }
        }
    }
}
