//! A replica whose data partition holds a damaged record in a sealed segment takes
//! the records the damage hides from a peer, and the segment reads whole again
//! ([`crate::engine::maintenance::mend`]). Without it such a replica serves the
//! records around the damage and refuses those inside it for good, even as the
//! group's leader, while its peers hold them: every replica holds the same offset →
//! record mapping, and a sealed segment's records were applied, so committed. A
//! lost sealed segment (its `.log` gone, its `.index` left) is written again the
//! same way.
//!
//! When: at the node's start, for every replicated partition it holds (the startup
//! check: a sealed segment whose index agrees with its first record and its tail is
//! trusted unread), and whenever a fetch on this node meets damage (a consumer, a
//! peer's [`Rpc::Records`], a snapshot being sent): then the segment holding the
//! damage is read in full. One mend runs at a time on the node; a mend that cannot
//! finish (no peer up, or none holding the records, or damage a mend cannot handle)
//! is tried again after [`RETRY_FIRST`], then at doubling intervals up to
//! [`RETRY_MAX`], while the node runs, with one warning per distinct reason.
//!
//! Invariants:
//! - The Raft log, vote and checkpoint are never touched, nor the active segment:
//!   only settled sealed segments, through compaction's swap.
//! - Only a peer's durable records are taken (its answer names its durable end, which
//!   must reach the damaged range's end), each at its own offset; see
//!   [`crate::engine::maintenance::mend`] for what a mend refuses.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::repair::{RecordsAnswer, RecordsRequest};
use super::{lock, LogStores, Manager};
use crate::engine::broker::PlannedMend;
use crate::engine::error::EngineError;
use crate::engine::maintenance::mend::GivenRecord;
use crate::format::wire::raft::Rpc;

/// The first wait before a mend that could not finish is tried again; it doubles
/// with each failure, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// Most bytes of damage one mend takes back (its records are held in memory).
const MEND_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Longest wait for one peer's answer.
const ASK_WAIT: Duration = Duration::from_secs(10);

/// What to mend: a partition, and the offset a fetch found damaged (`None`: check
/// every settled segment as at startup).
pub(super) type MendRequest = (String, u32, Option<u64>);

/// The queue of mends the node wants.
#[derive(Debug)]
pub(super) struct MendQueue {
    tx: tokio::sync::mpsc::UnboundedSender<MendRequest>,
    rx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<MendRequest>>>,
}

impl MendQueue {
    pub(super) fn new() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        MendQueue {
            tx,
            rx: std::sync::Mutex::new(Some(rx)),
        }
    }

    /// A sender for the broker's damage listener.
    pub(super) fn sender(&self) -> tokio::sync::mpsc::UnboundedSender<MendRequest> {
        self.tx.clone()
    }
}

/// Tells the broker a pass of mends ended, when dropped.
struct PassEnd<'a>(&'a crate::engine::broker::Broker);

impl Drop for PassEnd<'_> {
    fn drop(&mut self) {
        self.0.mends_tried();
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs a blocking step on the blocking pool; its error as a line.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())?
}

impl<L: LogStores> Manager<L> {
    /// Asks for the startup check of `topic/partition`'s sealed segments.
    pub(super) fn want_mend(&self, topic: &str, partition: u32) {
        let _ = self.mends.tx.send((topic.to_string(), partition, None));
    }

    /// Registers the broker's damage listener and runs the mends asked for, one at
    /// a time, until `stop`.
    pub(super) async fn mend_loop(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some(mut rx) = lock(&self.mends.rx).take() else {
            return;
        };
        let tx = self.mends.sender();
        // Weak: the broker outlives no manager, and holds this listener.
        let me = Arc::downgrade(&self);
        self.broker.on_damage(move |topic, partition, first| {
            me.upgrade()
                .is_some_and(|m| !m.other_replicas(topic, partition).is_empty())
                && tx.send((topic.to_string(), partition, Some(first))).is_ok()
        });
        // The last warning said per partition.
        let mut said: BTreeMap<(String, u32), String> = BTreeMap::new();
        // The mends to try again: when, and the wait after that (doubling).
        let mut due: BTreeMap<MendRequest, (tokio::time::Instant, Duration)> = BTreeMap::new();
        loop {
            let wake = due.values().map(|&(at, _)| at).min();
            let got = tokio::select! {
                r = rx.recv() => match r {
                    Some(r) => Some(r),
                    None => return,
                },
                () = sleep_until(wake) => None,
                _ = stop.changed() => return,
            };
            // A request already waiting for its retry (a consumer asking again at
            // the same damage) waits with it.
            let mut wanted: BTreeSet<MendRequest> =
                got.into_iter().filter(|r| !due.contains_key(r)).collect();
            while let Ok(more) = rx.try_recv() {
                if !due.contains_key(&more) {
                    wanted.insert(more);
                }
            }
            let now = tokio::time::Instant::now();
            let mut waits = BTreeMap::new();
            due.retain(|req, &mut (at, wait)| {
                let ready = at <= now;
                if ready {
                    wanted.insert(req.clone());
                    waits.insert(req.clone(), wait);
                }
                !ready
            });
            // Fetches waiting for this pass run again once it ends, whatever it did.
            let _pass = PassEnd(&self.broker);
            for req in wanted {
                if *stop.borrow() {
                    return;
                }
                let (topic, partition, at) = req.clone();
                let key = (topic.clone(), partition);
                if self.other_replicas(&topic, partition).is_empty() {
                    continue;
                }
                match self.mend(&topic, partition, at).await {
                    Ok(()) => {
                        said.remove(&key);
                    }
                    Err(e) => {
                        if said.get(&key) != Some(&e) {
                            tracing::warn!(topic, partition, error = %e,
                                "a damaged or lost sealed segment could not be mended from \
                                 the peers yet; trying again");
                            said.insert(key, e);
                        }
                        let wait = waits
                            .get(&req)
                            .map_or(RETRY_FIRST, |w| (*w * 2).min(RETRY_MAX));
                        due.insert(req, (tokio::time::Instant::now() + wait, wait));
                    }
                }
            }
        }
    }

    /// Mends the damaged settled segments of `topic/partition` (the one holding `at`,
    /// or all under the startup check).
    async fn mend(&self, topic: &str, partition: u32, at: Option<u64>) -> Result<(), String> {
        let broker = Arc::clone(&self.broker);
        let t = topic.to_string();
        let plans = blocking(move || {
            broker
                .plan_mends(&t, partition, at)
                .map_err(|e| e.to_string())
        })
        .await?;
        let mut why = Vec::new();
        for planned in plans {
            let done = match planned {
                Ok(planned) => self.mend_one(topic, partition, Arc::new(planned)).await,
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                why.push(e);
            }
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("; "))
        }
    }

    /// Mends one segment with the records of the first peer that has them all.
    async fn mend_one(
        &self,
        topic: &str,
        partition: u32,
        planned: Arc<PlannedMend>,
    ) -> Result<(), String> {
        let lost = planned.lost();
        let log = planned.path().display().to_string();
        tracing::warn!(topic, partition, segment = log, lost = ?lost,
            "a sealed segment holds damaged records, or is lost; taking them from a peer");
        let mut why = Vec::new();
        // Peers answering now first: one that is down costs the ask's whole wait.
        let mut peers = self.other_replicas(topic, partition);
        peers.sort_by_key(|n| !self.peers.peers.get(n).is_some_and(|p| p.answering()));
        for node in peers {
            let ranges = match self.collect_from(node, topic, partition, &lost).await {
                Ok(r) => r,
                Err(e) => {
                    why.push(format!("node {node}: {e}"));
                    continue;
                }
            };
            let broker = Arc::clone(&self.broker);
            let p = Arc::clone(&planned);
            let t = topic.to_string();
            let done = tokio::task::spawn_blocking(move || {
                broker.mend_segment(&t, partition, &p, &ranges)
            })
            .await
            .map_err(|e| e.to_string())?;
            match done {
                Ok(()) => {
                    tracing::warn!(topic, partition, node, segment = log, lost = ?lost,
                        "mended a damaged or lost sealed segment with a peer's records");
                    return Ok(());
                }
                // This peer's records do not mend it: the next may.
                Err(e @ EngineError::Corrupt { .. }) => why.push(format!("node {node}: {e}")),
                Err(e) => return Err(format!("{log}: {e}")),
            }
        }
        if why.is_empty() {
            why.push("no other replica".into());
        }
        Err(format!("{log}, offsets {lost:?}: {}", why.join("; ")))
    }

    /// `node`'s records for each damaged range `first..next` of `lost`: asked from
    /// `first`, then from past the last record received, until `next` is reached or
    /// the node has no more below it (a compacted topic's).
    async fn collect_from(
        &self,
        node: u64,
        topic: &str,
        partition: u32,
        lost: &[(u64, u64)],
    ) -> Result<Vec<Vec<GivenRecord>>, String> {
        let mut ranges = Vec::with_capacity(lost.len());
        let mut bytes = 0usize;
        for &(first, next) in lost {
            let mut got: Vec<GivenRecord> = Vec::new();
            let mut from = first;
            while from < next {
                let answer = self.ask(node, topic, partition, from, next).await?;
                let before = got.len();
                got.extend(
                    answer
                        .records
                        .into_iter()
                        .filter(|(o, _)| *o >= from && *o < next)
                        .map(|(offset, r)| GivenRecord {
                            offset,
                            timestamp_ms: r.timestamp_ms,
                            key: r.key,
                            value: r.value,
                        }),
                );
                bytes += got
                    .get(before..)
                    .unwrap_or_default()
                    .iter()
                    .map(|r| r.value.len() + r.key.as_ref().map_or(0, Vec::len))
                    .sum::<usize>();
                if bytes as u64 > MEND_BYTES_MAX {
                    return Err(format!(
                        "offsets {first}..{next} hold more than {MEND_BYTES_MAX} bytes, more \
                         than a mend holds in memory; to get every record back, stop the \
                         node, move its data directory aside and start it on an empty one \
                         (it takes its replicas from its peers)"
                    ));
                }
                match got.get(before..).and_then(<[GivenRecord]>::last) {
                    Some(last) => from = last.offset + 1,
                    None => break,
                }
            }
            ranges.push(got);
        }
        Ok(ranges)
    }

    /// One [`Rpc::Records`] call for offsets `from..next`, refused unless the peer
    /// keeps `from` and holds durable records up to `next`.
    async fn ask(
        &self,
        node: u64,
        topic: &str,
        partition: u32,
        from: u64,
        next: u64,
    ) -> Result<RecordsAnswer, String> {
        let payload =
            serde_json::to_vec(&RecordsRequest { from, to: next }).map_err(|e| e.to_string())?;
        let answer = self
            .call_within(node, topic, partition, Rpc::Records, payload, ASK_WAIT)
            .await
            .map_err(|(_, m)| m)?;
        let answer: RecordsAnswer =
            serde_json::from_slice(&answer).map_err(|e| format!("unreadable answer: {e}"))?;
        if answer.start > from {
            return Err(format!(
                "its retention removed offsets {from}..{}",
                answer.start
            ));
        }
        match answer.end {
            Some(end) if end >= next => Ok(answer),
            Some(end) => Err(format!("its partition ends at offset {end}, before {next}")),
            None => Err("it does not say where its partition ends (an earlier build)".into()),
        }
    }
}
