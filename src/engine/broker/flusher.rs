//! The flusher: with `--flush-every-records N > 1`, fsyncs every partition with
//! records waiting at least every `--flush-interval`. With N = 1 it runs the group
//! commits the event loop hands it (a produce to several partitions, a commit leader
//! that went away, a commit that carries a roll, an idempotent batch): each pass takes
//! every partition asked for since the last one and runs one fsync per partition
//! covering everything written to it so far; the publish wakes that partition's
//! waiters only.
//!
//! The producer journal and the group files share these passes (no fsync thread of
//! their own): a pass 1. makes durable every journal entry written before it and
//! completes their waiters, 2. fsyncs the partitions asked for, 3. moves the group
//! coordinator's time on (every [`TICK_INTERVAL`]) and replaces every dirty group
//! file once. Step 1 ends after step 2: a partition's fsync first runs the journal
//! barrier (`partition::journal`), one fdatasync of the journal covering every entry
//! written until then, so the pass's own entries are usually durable by the time
//! step 1 looks, and it makes no system call. (Run first, step 1's fdatasync would be
//! followed by a barrier's for the entries written while it ran: two in series.) An
//! idempotent batch's entry is written just before its records (under the
//! partition's write lock) and so before its partition is queued: the pass that
//! makes the records durable for its acknowledgement makes the entry durable first,
//! and the batch waits for one group commit.

use super::*;
use crate::engine::groups::{GroupCoordinator, TICK_INTERVAL};
use crate::engine::producers::ProducerTable;

/// The background thread that fsyncs partitions whose records wait for one: on
/// request (N records waiting) and every `flush_interval` for all of them.
#[derive(Debug)]
pub(super) struct Flusher {
    pub(super) state: Mutex<FlushState>,
    pub(super) wake: Condvar,
    pub(super) interval: Duration,
    /// Journal entries waiting for the pass's fdatasync.
    pub(super) producers: Arc<ProducerTable>,
    /// Group files to replace in the pass, and the coordinator's clock.
    pub(super) groups: Arc<GroupCoordinator>,
}

#[derive(Debug, Default)]
pub(super) struct FlushState {
    pub(super) queue: Vec<Arc<PartitionLog>>,
    /// A journal entry or a group file waits: run a pass even with an empty queue.
    pub(super) kicked: bool,
    pub(super) stop: bool,
}

impl Flusher {
    pub(super) fn new(
        interval: Duration,
        producers: Arc<ProducerTable>,
        groups: Arc<GroupCoordinator>,
    ) -> Self {
        Flusher {
            state: Mutex::new(FlushState::default()),
            wake: Condvar::new(),
            interval,
            producers,
            groups,
        }
    }

    pub(super) fn start(
        self: Arc<Self>,
        topics: Arc<Topics>,
    ) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name("seglog-flusher".into())
            .spawn(move || self.run(&topics))
            .map_err(|e| EngineError::io("starting the flusher thread", e))
    }

    /// Asks for an fsync of `log` soon. Only the request that makes the queue
    /// non-empty wakes the thread: it waits only with an empty queue, under the
    /// lock, so later requests of the same pass need no wake-up of their own.
    pub(super) fn request(&self, log: &Arc<PartitionLog>) {
        let mut st = lock(&self.state);
        if st.queue.iter().any(|l| Arc::ptr_eq(l, log)) {
            return;
        }
        let was_idle = st.queue.is_empty() && !st.kicked;
        st.queue.push(log.clone());
        if was_idle {
            self.wake.notify_one();
        }
    }

    /// Asks for a pass soon without a partition: a journal entry or a group file
    /// waits. As with [`Flusher::request`], only the first ask of a pass wakes.
    pub(super) fn kick(&self) {
        let mut st = lock(&self.state);
        if st.queue.is_empty() && !st.kicked {
            self.wake.notify_one();
        }
        st.kicked = true;
    }

    pub(super) fn stop(&self) {
        lock(&self.state).stop = true;
        self.wake.notify_all();
    }

    /// Waits for a request or the next interval; returns the requested logs, or
    /// `None` once stopped.
    pub(super) fn next_batch(&self, deadline: Instant) -> Option<Vec<Arc<PartitionLog>>> {
        let mut st = lock(&self.state);
        loop {
            if st.stop {
                return None;
            }
            let now = Instant::now();
            if !st.queue.is_empty() || st.kicked || now >= deadline {
                st.kicked = false;
                return Some(std::mem::take(&mut st.queue));
            }
            st = self
                .wake
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A failed fsync is recorded in its partition (which then refuses writes);
    /// the flusher goes on with the others. The numbered steps are the module's.
    pub(super) fn run(&self, topics: &Topics) {
        let mut deadline = Instant::now() + self.interval;
        let mut tick_at = Instant::now() + TICK_INTERVAL;
        while let Some(batch) = self.next_batch(deadline.min(tick_at)) {
            // 1. The entries written before the pass; their waiters are completed
            // after the partitions' fsyncs, whose journal barriers make them durable
            // first (one fdatasync covering every entry written until then).
            let entries = self.producers.positions().0;
            // 2. The partitions' waiters are woken once, after step 1: an idempotent
            // batch's answer waits for both.
            for log in &batch {
                let _ = log.flush_quiet();
            }
            // 1. (an fdatasync of its own only when no barrier covered them)
            self.producers.sync_pending_through(entries);
            for log in &batch {
                log.wake_waiters();
            }
            let now = Instant::now();
            if now >= deadline {
                let all: Vec<Arc<Topic>> = read(topics).values().cloned().collect();
                for log in all.iter().flat_map(|t| t.logs()) {
                    if log.durable_end() < log.written_end() {
                        let _ = log.flush();
                    }
                }
                deadline = Instant::now() + self.interval;
            }
            // 3.
            if now >= tick_at {
                let known: BTreeMap<String, u32> = read(topics)
                    .values()
                    .filter(|t| t.offline.is_none())
                    .map(|t| (t.name.clone(), t.partitions.len() as u32))
                    .collect();
                self.groups.tick(now, Some(&known));
                tick_at = now + TICK_INTERVAL;
            }
            self.groups.flush_if_dirty();
        }
    }
}
