//! A node whose data directory is new (started without `cluster.json`: a first
//! start, or a disk that was lost and replaced) gets its replicas back: it asks each
//! peer for the replicated topics placed on it ([`Rpc::Replicas`]) and creates its
//! replica of each, as `topics create` would have; the partitions' leaders then send
//! it their logs or a snapshot, as to any follower that is behind.
//!
//! Invariants:
//! - A topic is created again only once every other node of its placement has
//!   answered, and each of its groups starts with the highest vote those nodes hold
//!   (`raft.json`, written before the group opens). A Raft node must never vote twice
//!   in one term, and a replaced directory forgot its votes: any vote it gave went
//!   to a candidate of its group, which recorded that vote or a higher one itself, so
//!   starting from the highest vote of the others it grants none it could have
//!   granted before, and it still follows the current leader.
//! - Only topics this node does not have are created; a topic it has is left as it
//!   is. Nothing is deleted.
//! - The node asks until every peer has answered and each topic offered is created;
//!   a peer that is down is asked again every [`ASK_EVERY`].

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver as _;
use serde::{Deserialize, Serialize};

use super::{lock, CreateReplica, LogStores, Manager, Refusal};
use crate::engine::broker::Broker;
use crate::engine::replication::log_store::meta::{write_state, RaftState};
use crate::engine::replication::node::RAFT_DIR;
use crate::engine::replication::types::Vote;
use crate::format::keys::KeyEntry;
use crate::format::schemas::Subject;
use crate::format::topic::{TopicConfig, CONFIG_KEYS};
use crate::format::wire::raft::Rpc;
use crate::format::wire::ErrorCode;

/// How often the peers that have not answered are asked again.
const ASK_EVERY: Duration = Duration::from_secs(1);

/// An answer to [`Rpc::Replicas`].
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Answer {
    topics: Vec<Offer>,
    /// The API keys of the answering node.
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

/// One topic of an answer to [`Rpc::Replicas`].
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Offer {
    topic: String,
    create: CreateReplica,
    /// Per partition, the answering node's vote; `None` where it holds no replica.
    votes: Vec<Option<Vote>>,
    /// The topic's schemas on the answering node, if any.
    #[serde(default)]
    schemas: Option<Subject>,
}

/// A topic's settings as `KEY=VALUE` pairs, every key present.
fn settings_of(config: &TopicConfig) -> Vec<String> {
    let json = config.to_json();
    CONFIG_KEYS
        .iter()
        .map(|key| match &json[key] {
            serde_json::Value::String(s) => format!("{key}={s}"),
            v => format!("{key}={v}"),
        })
        .collect()
}

/// Per partition, the highest of the offered votes.
fn highest_votes(offers: &[&Offer], partitions: usize) -> Vec<Option<Vote>> {
    (0..partitions)
        .map(|p| {
            offers
                .iter()
                .filter_map(|o| o.votes.get(p).cloned().flatten())
                .fold(None, |best: Option<Vote>, v| match best {
                    Some(b) if v.partial_cmp(&b) != Some(std::cmp::Ordering::Greater) => Some(b),
                    _ => Some(v),
                })
        })
        .collect()
}

/// The keys every answer holds (the same id and secret hash in each).
fn common_keys(answers: &[&Answer]) -> Vec<KeyEntry> {
    let Some((first, rest)) = answers.split_first() else {
        return Vec::new();
    };
    first
        .keys
        .iter()
        .filter(|k| {
            rest.iter().all(|a| {
                a.keys
                    .iter()
                    .any(|o| o.id == k.id && o.secret_sha256 == k.secret_sha256)
            })
        })
        .cloned()
        .collect()
}

/// Writes `vote` as the state of a group's Raft log that does not exist yet, durably
/// (the directories above it included).
pub(super) fn seed_vote(
    broker: &Broker,
    topic: &str,
    partition: u32,
    vote: &Vote,
) -> io::Result<()> {
    let s = &**broker.storage();
    let raft = broker.data_dir().join(RAFT_DIR);
    let topic_dir = raft.join(topic);
    let dir = topic_dir.join(partition.to_string());
    s.create_dir_all(&dir)?;
    let state: RaftState<Vote> = RaftState {
        vote: Some(*vote),
        ..RaftState::default()
    };
    write_state(s, &dir, &state)?;
    for d in [&topic_dir, &raft, broker.data_dir()] {
        s.sync_dir(Path::new(d))?;
    }
    Ok(())
}

impl<L: LogStores> Manager<L> {
    /// The answer to [`Rpc::Replicas`] for node `asker`: the topics this node holds
    /// whose placement includes it. Each group this node leads that has `asker` as a
    /// replica is told to take `asker`'s log going back to empty once (openraft's
    /// `allow_next_revert`): without it a leader that still counts the entries the
    /// lost directory held would never send them again.
    pub(super) async fn offers_for(&self, asker: u64) -> Result<Vec<u8>, String> {
        let placed: Vec<(String, crate::format::replication::Replication)> = lock(&self.topics)
            .iter()
            .filter(|(_, r)| r.replicas.iter().any(|p| p.contains(&asker)))
            .map(|(t, r)| (t.clone(), r.clone()))
            .collect();
        let mut offers = Vec::new();
        for (topic, replication) in placed {
            // A topic deleted meanwhile is no longer offered.
            let Ok(config) = self.broker.topic_config(&topic) else {
                continue;
            };
            let schemas = self.broker.schemas().snapshot().topics.get(&topic).cloned();
            let partitions = replication.replicas.len();
            let mut votes = Vec::with_capacity(partitions);
            for (p, replicas) in replication.replicas.iter().enumerate() {
                let Some(group) = self.group(&topic, p as u32) else {
                    votes.push(None);
                    continue;
                };
                let m = group.metrics().borrow_watched().clone();
                if replicas.contains(&asker) && m.state == openraft::ServerState::Leader {
                    match group.trigger().allow_next_revert(&asker, true).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::info!(topic, partition = p, node = asker, error = %e, "not resetting the replication of a node whose data directory is new");
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
                votes.push(Some(m.vote));
            }
            offers.push(Offer {
                topic,
                create: CreateReplica {
                    partitions: partitions as u32,
                    settings: settings_of(&config),
                    replication,
                },
                votes,
                schemas,
            });
        }
        serde_json::to_vec(&Answer {
            topics: offers,
            keys: self.broker.keys().list(),
        })
        .map_err(|e| e.to_string())
    }

    /// Asks the peers for the topics placed on this node and creates each that this
    /// node lacks (see the module's invariants); ends once done, or at `stop`.
    pub(super) async fn restore_replicas(
        self: Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let me = self.node_id();
        let Ok(payload) = serde_json::to_vec(&me) else {
            return;
        };
        let peers: BTreeSet<u64> = self.nodes.keys().copied().filter(|&n| n != me).collect();
        let mut answered: BTreeMap<u64, Answer> = BTreeMap::new();
        let mut keys_done = false;
        let mut done: BTreeSet<String> = BTreeSet::new();
        let mut told: BTreeSet<(String, Vec<u64>)> = BTreeSet::new();
        loop {
            for &node in &peers {
                if answered.contains_key(&node) {
                    continue;
                }
                let Ok(answer) = self
                    .call_within(node, "", 0, Rpc::Replicas, payload.clone(), ASK_EVERY)
                    .await
                else {
                    continue;
                };
                match serde_json::from_slice::<Answer>(&answer) {
                    Ok(a) => {
                        answered.insert(node, a);
                    }
                    Err(e) => {
                        tracing::warn!(node, error = %e, "cannot read a peer's replicas of this node");
                    }
                }
            }
            let mut topics: BTreeMap<&str, Vec<&Offer>> = BTreeMap::new();
            if !keys_done && answered.len() == peers.len() {
                keys_done = self.restore_keys(&answered).await;
            }
            for offer in answered.values().flat_map(|a| &a.topics) {
                topics.entry(offer.topic.as_str()).or_default().push(offer);
            }
            for (topic, offers) in &topics {
                if done.contains(*topic) {
                    continue;
                }
                let Some(first) = offers.first() else {
                    continue;
                };
                let waiting: Vec<u64> = first
                    .create
                    .replication
                    .replicas
                    .iter()
                    .flatten()
                    .copied()
                    .collect::<BTreeSet<u64>>()
                    .into_iter()
                    .filter(|n| *n != me && !answered.contains_key(n))
                    .collect();
                if !waiting.is_empty() {
                    if told.insert((topic.to_string(), waiting.clone())) {
                        tracing::warn!(
                            topic,
                            waiting = ?waiting,
                            "this node's data directory is new: its replica of the topic is created again once every other replica's node answers"
                        );
                    }
                    continue;
                }
                let votes = highest_votes(offers, first.create.replication.replicas.len());
                // The schemas with the most versions ever registered: the newest.
                let schemas = offers
                    .iter()
                    .filter_map(|o| o.schemas.as_ref())
                    .max_by_key(|s| s.next_version)
                    .cloned();
                match self
                    .restore_topic(topic, &first.create, votes, schemas)
                    .await
                {
                    Ok(created) => {
                        if created {
                            tracing::info!(
                                topic,
                                "this node's data directory is new: its replica of the topic is created again; the leaders send it the data"
                            );
                        }
                        done.insert(topic.to_string());
                    }
                    Err((_, msg)) => {
                        tracing::warn!(topic, error = %msg, "cannot create this node's replica of the topic again; asking again");
                    }
                }
            }
            if keys_done && topics.keys().all(|t| done.contains(*t)) {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(ASK_EVERY) => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    }

    /// Takes the API keys every peer has (the same id and secret hash on each): a key
    /// only some peers have is one whose revoke has not reached them all, or a create
    /// that was undone, and is not taken. Returns whether that is done.
    async fn restore_keys(&self, answered: &BTreeMap<u64, Answer>) -> bool {
        let common = common_keys(&answered.values().collect::<Vec<_>>());
        if common.is_empty() {
            return true;
        }
        let broker = Arc::clone(&self.broker);
        let taken = tokio::task::spawn_blocking(move || {
            let mut n = 0usize;
            for k in common {
                if broker.keys().take(k)? {
                    n += 1;
                }
            }
            Ok::<usize, crate::engine::keys::KeyError>(n)
        })
        .await;
        match taken {
            Ok(Ok(n)) => {
                if n > 0 {
                    tracing::info!(
                        keys = n,
                        "this node's data directory is new: took the API keys every other node has"
                    );
                }
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot take the cluster's API keys; asking again");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot take the cluster's API keys; asking again");
                false
            }
        }
    }

    /// Creates this node's replica of `topic` as `create` says, its groups starting
    /// from `votes`, unless the node has the topic (`Ok(true)` when created now), and
    /// gives it the schemas `schemas` if it has none.
    async fn restore_topic(
        &self,
        topic: &str,
        create: &CreateReplica,
        votes: Vec<Option<Vote>>,
        schemas: Option<Subject>,
    ) -> Result<bool, Refusal> {
        let payload =
            serde_json::to_vec(create).map_err(|e| (ErrorCode::INTERNAL, e.to_string()))?;
        let created = self
            .create_replica_seeded(topic, &payload, Some(votes))
            .await?;
        // Also when an earlier round created the topic but could not set these.
        let none_here = !self.broker.schemas().snapshot().topics.contains_key(topic);
        if schemas.is_some() && none_here {
            self.set_schemas(topic.to_string(), schemas)
                .await
                .map_err(|e| (ErrorCode::STORAGE, e))?;
        }
        Ok(created)
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn vote(term: u64, node: u64, committed: bool) -> Vote {
        let mut v = Vote::new(term, node);
        if committed {
            v = Vote::new_committed(term, node);
        }
        v
    }

    fn offer(votes: Vec<Option<Vote>>) -> Offer {
        Offer {
            topic: "t".into(),
            create: CreateReplica {
                partitions: votes.len() as u32,
                settings: Vec::new(),
                replication: crate::format::replication::Replication::place(
                    &[1, 2, 3],
                    votes.len() as u32,
                    3,
                )
                .unwrap(),
            },
            votes,
            schemas: None,
        }
    }

    #[test]
    fn each_partition_starts_from_the_highest_vote_offered() {
        let a = offer(vec![Some(vote(3, 1, true)), None, Some(vote(2, 2, false))]);
        let b = offer(vec![Some(vote(4, 2, false)), None, Some(vote(2, 2, true))]);
        let got = highest_votes(&[&a, &b], 3);
        assert_eq!(
            got,
            vec![Some(vote(4, 2, false)), None, Some(vote(2, 2, true))]
        );
        assert_eq!(highest_votes(&[&b, &a], 3), got);
    }

    #[test]
    fn only_the_keys_every_peer_has_are_taken() {
        let key = |id: &str, hash: char| KeyEntry {
            id: id.into(),
            name: "k".into(),
            role: crate::format::keys::Role::Admin,
            topics: Vec::new(),
            groups: Vec::new(),
            created_ms: 0,
            last_used_ms: 5,
            secret_sha256: hash.to_string().repeat(64),
        };
        let a = Answer {
            topics: Vec::new(),
            keys: vec![key("a", '1'), key("b", '2'), key("c", '3')],
        };
        // "b" was revoked on this peer only; "c" has another secret here.
        let b = Answer {
            topics: Vec::new(),
            keys: vec![key("c", '4'), key("a", '1')],
        };
        let got: Vec<String> = common_keys(&[&a, &b]).into_iter().map(|k| k.id).collect();
        assert_eq!(got, ["a"]);
        assert!(common_keys(&[]).is_empty());
        assert_eq!(common_keys(&[&a]).len(), 3);
    }

    #[test]
    fn settings_round_trip_through_a_create() {
        let mut config = TopicConfig::default();
        config.set_pair("retention_bytes=1234").unwrap();
        config.set_pair("cleanup_policy=compact").unwrap();
        let settings = settings_of(&config);
        assert_eq!(settings.len(), CONFIG_KEYS.len());
        let mut again = TopicConfig::default();
        for s in &settings {
            again.set_pair(s).unwrap();
        }
        assert_eq!(again, config);
    }
}
