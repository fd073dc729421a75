//! Mending a damaged sealed segment in the running broker
//! ([`crate::engine::maintenance::mend`]): the plan from a check of the partition's
//! settled segments; the writing and the swap under the partition's cleanup lock (so
//! retention and compaction wait), its step 2 under the write lock, and the new list
//! published.
//! The records that fill the damage come from the caller (the replication layer asks
//! the replica's peers). A fetch that meets damage tells a registered listener
//! ([`Broker::on_damage`]), so damage found by a reader gets mended too.

use super::*;
use crate::engine::error::FailureReason;
use crate::engine::maintenance::check::CheckMode;
use crate::engine::maintenance::compaction::CompactionError;
use crate::engine::maintenance::mend::{
    plan_mend, write_found, write_mend, GivenRecord, MendCheck, MendPlan,
};
use crate::engine::partition::{LostSegment, Segment};
use crate::engine::storage::layout::list_partition;

/// Longest a fetch that met damage waits for the node's mend attempt.
const MEND_WAIT: Duration = Duration::from_secs(5);

/// A function told `(topic, partition, first unreadable offset)`; true when the node
/// will try to mend it.
type OnDamage = dyn Fn(&str, u32, u64) -> bool + Send + Sync;

/// Told `(topic, partition, first unreadable offset)` when a fetch or the scrub meets
/// damage; answers whether the node will try to mend it (a replicated partition with
/// other replicas).
pub struct DamageListener(Box<OnDamage>);

impl DamageListener {
    /// Tells the listener; true when the node will try to mend the damage.
    pub(super) fn tell(&self, topic: &str, partition: u32, first: u64) -> bool {
        (self.0)(topic, partition, first)
    }
}

impl std::fmt::Debug for DamageListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DamageListener")
    }
}

/// A damaged settled segment of a partition and its mend's plan, or a lost one.
#[derive(Debug)]
pub struct PlannedMend {
    /// The topic compacts: the records given may skip offsets.
    pub compacts: bool,
    what: Mend,
}

#[derive(Debug)]
enum Mend {
    Damaged {
        plan: MendPlan,
        seg: Arc<Segment>,
    },
    Lost(LostSegment),
    /// Offsets after the settled segment `after` and below the next segment's base,
    /// in no file (both files of a segment gone, or `after` lost its last records
    /// whole): written as a segment of their own, named by the first.
    Gap {
        lost: LostSegment,
        after: Arc<Segment>,
    },
}

impl PlannedMend {
    /// The offset ranges to take from elsewhere (`first..next`).
    pub fn lost(&self) -> Vec<(u64, u64)> {
        match &self.what {
            Mend::Damaged { plan, .. } => plan.lost(),
            Mend::Lost(l) | Mend::Gap { lost: l, .. } => vec![(l.first, l.next)],
        }
    }

    /// The file the mend writes.
    pub fn path(&self) -> PathBuf {
        match &self.what {
            Mend::Damaged { plan, .. } => plan.salvage.files.log.clone(),
            Mend::Lost(l) | Mend::Gap { lost: l, .. } => l.index.with_extension("log"),
        }
    }
}

/// The first offset a fetch's error says cannot be read: damaged records, or a
/// lost segment whose index is left (a mend can write either again).
fn unreadable_at<T>(r: &Result<T, EngineError>) -> Option<u64> {
    match r {
        Err(EngineError::RecordsDamaged { first, .. }) => Some(*first),
        Err(EngineError::RecordsMissing {
            index: Some(_),
            first,
            ..
        }) => Some(*first),
        _ => None,
    }
}

impl Broker {
    /// Registers the one listener told when a fetch meets damage (later calls are
    /// ignored).
    pub fn on_damage(&self, listener: impl Fn(&str, u32, u64) -> bool + Send + Sync + 'static) {
        let _ = self.cleaner.damage.set(DamageListener(Box::new(listener)));
    }

    /// An async fetch's result `first`; when it is damage and a listener is
    /// registered and will try a mend, the fetch waits (up to [`MEND_WAIT`]) for the
    /// node's next mend attempt to end, then runs once more (`again`): a reader
    /// meeting damage a peer's records mend gets the records, not an error.
    pub(super) async fn mended_or<T, F, Fut>(
        &self,
        topic: &str,
        partition: u32,
        first: Result<T, EngineError>,
        again: F,
    ) -> Result<T, EngineError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<T, EngineError>>,
    {
        let (Some(at), Some(l)) = (unreadable_at(&first), self.cleaner.damage.get()) else {
            return first;
        };
        let mut done = self.mends_done.subscribe();
        if !l.tell(topic, partition, at) {
            return first;
        }
        let _ = tokio::time::timeout(MEND_WAIT, done.changed()).await;
        self.noticed(topic, partition, again().await)
    }

    /// Says that the node's mends asked so far were tried (each mend pass ends with
    /// it): fetches waiting in [`Broker::mended_or`] run again.
    pub fn mends_tried(&self) {
        self.mends_done.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A fetch's result, the listener told when it is damage.
    pub(super) fn noticed<T>(
        &self,
        topic: &str,
        partition: u32,
        result: Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        if let (Some(at), Some(l)) = (unreadable_at(&result), self.cleaner.damage.get()) {
            l.tell(topic, partition, at);
        }
        result
    }

    /// Plans the mends of a partition's damaged settled segments: the one holding
    /// `at` (read in full), or with `None` every settled segment under the startup
    /// check (a segment whose index agrees with its first record and its tail is
    /// trusted unread). Damage a mend cannot handle comes as `Err(why)`.
    pub fn plan_mends(
        &self,
        topic: &str,
        partition: u32,
        at: Option<u64>,
    ) -> Result<Vec<Result<PlannedMend, String>>, EngineError> {
        let (t, log) = self.partition(topic, partition)?;
        let compacts = read(&t.config).cleanup_policy.compacts();
        let settled: Vec<(Arc<Segment>, u64, CheckMode)> = match at {
            Some(offset) => log
                .settled_holding(offset)
                .map(|(seg, next)| (seg, next, CheckMode::Full))
                .into_iter()
                .collect(),
            None => {
                let list = log.settled_segments();
                let mut out = Vec::new();
                for seg in list {
                    if let Some((s, next)) = log.settled_holding(seg.base_offset) {
                        out.push((s, next, CheckMode::Quick));
                    }
                }
                out
            }
        };
        let mut out: Vec<Result<PlannedMend, String>> = log
            .lost_segments()
            .into_iter()
            .filter(|l| at.is_none_or(|o| o >= l.first && o < l.next))
            .map(|l| {
                Ok(PlannedMend {
                    compacts,
                    what: Mend::Lost(l),
                })
            })
            .collect();
        if settled.is_empty() {
            return Ok(out);
        }
        let dir = log.dir().to_path_buf();
        let listing = list_partition(&dir)
            .map_err(|e| EngineError::io(format!("listing {}", dir.display()), e))?;
        for (seg, next_base, mode) in settled {
            let Some(files) = listing
                .segments
                .iter()
                .find(|f| f.base_offset == seg.base_offset)
            else {
                continue;
            };
            let planned = plan_mend(files, next_base, mode)
                .map_err(|e| EngineError::io(format!("checking {}", files.log.display()), e))?;
            match planned {
                MendCheck::Whole { missing_from: None } => {}
                MendCheck::Whole {
                    missing_from: Some(first),
                } => out.push(Ok(PlannedMend {
                    compacts,
                    what: Mend::Gap {
                        lost: LostSegment {
                            index: dir.join(crate::format::names::index_file_name(first)),
                            first,
                            next: next_base,
                        },
                        after: seg,
                    },
                })),
                MendCheck::Damaged(Ok(plan)) => out.push(Ok(PlannedMend {
                    compacts,
                    what: Mend::Damaged { plan: *plan, seg },
                })),
                MendCheck::Damaged(Err(why)) => out.push(Err(format!(
                    "{}: cannot be mended: {why}",
                    files.log.display()
                ))),
            }
        }
        Ok(out)
    }

    /// Writes the mend of `planned` with `ranges` (the records given for each damaged
    /// range) and swaps it in, all under the partition's cleanup lock (retention and
    /// compaction wait, and no compaction's temporary files meet the mend's): step 2
    /// first (the segment is still the settled one planned, else nothing is done),
    /// the new file and index written and fsynced, the marker, the rename, the new
    /// list published. `Err(Corrupt)` when the records given do not mend it.
    pub fn mend_segment(
        &self,
        topic: &str,
        partition: u32,
        planned: &PlannedMend,
        ranges: &[Vec<GivenRecord>],
    ) -> Result<(), EngineError> {
        let (t, log) = self.partition(topic, partition)?;
        let cleanup = t.cleanup.get(partition as usize).cloned().ok_or_else(|| {
            EngineError::UnknownPartition {
                topic: topic.to_string(),
                partition,
            }
        })?;
        let _busy = cleanup.exclusive();
        let dir = log.dir().to_path_buf();
        let changed =
            || EngineError::Compaction(CompactionError::SegmentsChanged { dir: dir.clone() });
        let (plan, seg) = match &planned.what {
            Mend::Damaged { plan, seg } => (plan, seg),
            Mend::Lost(_) | Mend::Gap { .. } => {
                let lost = match &planned.what {
                    Mend::Gap { lost, after } => {
                        // Still the settled segment checked, so the offsets after it
                        // are still in no file.
                        if !log.still_settled(after) {
                            return Err(changed());
                        }
                        lost
                    }
                    Mend::Lost(lost) if log.lost_segments().contains(lost) => lost,
                    _ => return Ok(()),
                };
                let records = ranges.first().map_or(&[][..], Vec::as_slice);
                write_found(
                    &*self.storage,
                    &dir,
                    lost.first,
                    lost.next,
                    records,
                    planned.compacts,
                )
                .map_err(|detail| EngineError::Corrupt {
                    path: planned.path(),
                    detail: format!("the mend was refused: {detail}"),
                })?;
                return log.insert_found(lost);
            }
        };
        if !log.still_settled(seg) {
            return Err(changed());
        }
        let path = plan.salvage.files.log.clone();
        let prepared = write_mend(&*self.storage, plan.clone(), planned.compacts, ranges).map_err(
            |detail| EngineError::Corrupt {
                path: path.clone(),
                detail: format!("the mend was refused: {detail}"),
            },
        )?;
        // 2.
        if !log.still_settled(seg) {
            prepared.cancel().map_err(|e| {
                EngineError::io(format!("removing mend output in {}", dir.display()), e)
            })?;
            return Err(changed());
        }
        log.hold_files(&[seg.base_offset])?;
        match prepared.swap(&mut |_| {}) {
            Ok(_) => log.replace_mended(seg),
            Err(e @ CompactionError::Interrupted { .. }) => {
                Err(log.mark_failed(FailureReason::CompactionInterrupted {
                    label: format!("{topic}/{partition}"),
                    error: Arc::new(e),
                }))
            }
            Err(e) => Err(EngineError::Compaction(e)),
        }
    }
}
