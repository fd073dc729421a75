//! The background scrub: every `scrub_interval`, each settled sealed segment of every
//! partition is read through once more, paced to `scrub_rate` bytes per second, so
//! damage that appears on the disk after a segment was written (a bad sector, a
//! stray write) is found before a reader needs those records.
//!
//! What a pass does with damage it finds:
//! - the segment's tally is replaced, so `topics describe`, the health request and
//!   the metrics show the partition as damaged with the same line as after a start;
//! - the damage listener is told (a cluster node: the mend loop takes the records
//!   from a peer and writes the segment again, [`super::mend`]);
//! - one warning per damaged segment per pass names the segment, the unreadable
//!   offsets, and what happens next (mended from a peer, or the offline remedy).
//!
//! Invariants:
//! - The scrub only reads. Retention, compaction and rolls go on beside it; a segment
//!   that stopped being settled during its read is not reported.
//! - The active segment and segments not yet settled are never read (their bytes
//!   change, and the write path's own checks cover them).
//! - The thread runs at a lowered priority and stops at its next paced step when the
//!   broker shuts down.

use super::*;
use std::sync::atomic::AtomicU64;

use crate::engine::partition::{FoundDamage, Segment};

/// Bytes per second the scrub reads, by default.
pub const SCRUB_RATE_DEFAULT: u64 = 32 * 1024 * 1024;
/// Longest wait before the first pass after the broker starts: a node restarted
/// more often than the interval still gets scrubbed.
const FIRST_PASS_MAX_DELAY: Duration = Duration::from_secs(600);

/// What the scrub did since the broker started (the metrics read it).
#[derive(Debug, Default)]
pub(super) struct ScrubStats {
    passes: AtomicU64,
    bytes: AtomicU64,
    damaged: AtomicU64,
}

/// The scrub's figures since the broker started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubFigures {
    /// Passes over every partition that ran to their end.
    pub passes: u64,
    /// Bytes of sealed segments read.
    pub bytes: u64,
    /// Damaged sealed segments found (each pass counts a segment it finds damaged).
    pub damaged: u64,
}

/// What one pass found: one line per damaged segment.
#[derive(Debug, Default)]
pub(super) struct ScrubPass {
    pub(super) damaged: Vec<String>,
    /// Stopped before its end (the broker is shutting down).
    pub(super) stopped: bool,
}

/// Keeps the reads under `rate` bytes per second since the pass began.
struct Pacer<'a> {
    cleaner: &'a Cleaner,
    rate: u64,
    began: Instant,
    bytes: u64,
}

impl Pacer<'_> {
    /// Counts `n` more bytes read and sleeps until the rate allows them; false once
    /// the broker is stopping.
    fn read(&mut self, n: u64) -> bool {
        self.bytes = self.bytes.saturating_add(n);
        self.cleaner.scrubbed.bytes.fetch_add(n, Ordering::Relaxed);
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        match due.checked_sub(self.began.elapsed()) {
            Some(wait) if !wait.is_zero() => self.cleaner.sleep(wait),
            _ => !self.cleaner.stopped(),
        }
    }
}

impl Cleaner {
    /// Starts the scrub thread: a pass `min(every, 10 min)` after the start, then one
    /// every `every` (at once when a pass took longer).
    pub(super) fn start_scrub(
        self: Arc<Self>,
        every: Duration,
        rate: u64,
    ) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name("seglog-scrub".into())
            .spawn(move || {
                lower_priority();
                let mut wait = every.min(FIRST_PASS_MAX_DELAY);
                while self.sleep(wait) {
                    let began = Instant::now();
                    if self.scrub_pass(rate).stopped {
                        return;
                    }
                    wait = every.saturating_sub(began.elapsed());
                }
            })
            .map_err(|e| EngineError::io("starting the scrub thread".to_string(), e))
    }

    /// One pass over every open partition's settled sealed segments.
    pub(super) fn scrub_pass(&self, rate: u64) -> ScrubPass {
        let mut pass = ScrubPass::default();
        let mut pacer = Pacer {
            cleaner: self,
            rate: rate.max(1),
            began: Instant::now(),
            bytes: 0,
        };
        let topics: Vec<Arc<Topic>> = read(&self.topics).values().cloned().collect();
        for topic in topics {
            for (p, slot) in topic.partitions.iter().enumerate() {
                let Slot::Open(log) = slot else { continue };
                for seg in log.settled_segments() {
                    if self.stopped() {
                        pass.stopped = true;
                        return pass;
                    }
                    // The bound a reader of this segment uses (the next segment or
                    // lost segment); a segment no longer settled is skipped.
                    let Some((seg, next)) = log
                        .settled_holding(seg.base_offset)
                        .filter(|(s, _)| Arc::ptr_eq(s, &seg))
                    else {
                        continue;
                    };
                    let found = scrub_segment(&seg, next, &mut pacer);
                    if !log.still_settled(&seg) {
                        continue;
                    }
                    match found {
                        Ok(None) => {
                            pass.stopped = true;
                            return pass;
                        }
                        Ok(Some(None)) => {}
                        Ok(Some(Some(d))) => {
                            self.scrubbed.damaged.fetch_add(1, Ordering::Relaxed);
                            pass.damaged.push(self.report(&topic, p as u32, &d));
                        }
                        Err(EngineError::TopicDeleted { .. } | EngineError::ShuttingDown) => {}
                        Err(e) => tracing::warn!(
                            topic = %topic.name,
                            partition = p,
                            segment = %seg.path().display(),
                            error = %e,
                            "scrub: could not read a sealed segment"
                        ),
                    }
                }
            }
        }
        self.scrubbed.passes.fetch_add(1, Ordering::Relaxed);
        pass
    }

    /// Says what the scrub found in one segment and tells the damage listener; the
    /// line logged.
    fn report(&self, topic: &Topic, partition: u32, d: &FoundDamage) -> String {
        let mending = topic.replicated
            && self
                .damage
                .get()
                .is_some_and(|l| l.tell(&topic.name, partition, d.first));
        let then = if mending {
            "a replica of a replicated partition: the node takes the records from a peer \
             and writes the segment again"
        } else {
            "no other copy on this node: stop the broker, run `seglog verify` on the data \
             directory, and `seglog recover --salvage --backup-dir DIR` to keep every record \
             that can still be read"
        };
        let line = format!("{}; {then}", d.line);
        tracing::warn!(topic = %topic.name, partition, "scrub: {line}");
        format!("{}/{partition}: {line}", topic.name)
    }
}

/// Reads `seg` through, paced; `Ok(None)` when the broker stopped meanwhile.
fn scrub_segment(
    seg: &Segment,
    next: u64,
    pacer: &mut Pacer<'_>,
) -> Result<Option<Option<FoundDamage>>, EngineError> {
    let mut told = 0u64;
    let found = seg.rescan(Some(next), &mut |position| {
        let n = position.saturating_sub(told);
        told = position;
        pacer.read(n)
    })?;
    if found.is_some() && !pacer.read(seg.bytes().saturating_sub(told)) {
        return Ok(None);
    }
    Ok(found)
}

impl Broker {
    /// Runs one scrub pass now at `rate` bytes per second, as the background thread
    /// does every `scrub_interval`; one line per damaged segment found.
    pub fn run_scrub(&self, rate: u64) -> Vec<String> {
        self.cleaner.scrub_pass(rate).damaged
    }

    /// What the scrub did since the broker started.
    pub fn scrub_figures(&self) -> ScrubFigures {
        let s = &self.cleaner.scrubbed;
        ScrubFigures {
            passes: s.passes.load(Ordering::Relaxed),
            bytes: s.bytes.load(Ordering::Relaxed),
            damaged: s.damaged.load(Ordering::Relaxed),
        }
    }
}
