//! The flusher: with `--flush-every-records N > 1`, fsyncs every partition with
//! records waiting at least every `--flush-interval`. With N = 1 it runs the group
//! commits the event loop hands it (a produce to several partitions, a commit leader
//! that went away): each pass takes every partition asked for since the last one and
//! runs one fsync per partition covering everything written to it so far; the publish
//! wakes that partition's waiters only.

use super::*;

/// The background thread that fsyncs partitions whose records wait for one: on
/// request (N records waiting) and every `flush_interval` for all of them.
#[derive(Debug)]
pub(super) struct Flusher {
    pub(super) state: Mutex<FlushState>,
    pub(super) wake: Condvar,
    pub(super) interval: Duration,
}

#[derive(Debug, Default)]
pub(super) struct FlushState {
    pub(super) queue: Vec<Arc<PartitionLog>>,
    pub(super) stop: bool,
}

impl Flusher {
    pub(super) fn new(interval: Duration) -> Self {
        Flusher {
            state: Mutex::new(FlushState::default()),
            wake: Condvar::new(),
            interval,
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
        let was_empty = st.queue.is_empty();
        st.queue.push(log.clone());
        if was_empty {
            self.wake.notify_one();
        }
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
            if !st.queue.is_empty() || now >= deadline {
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
    /// the flusher goes on with the others.
    pub(super) fn run(&self, topics: &Topics) {
        let mut deadline = Instant::now() + self.interval;
        while let Some(batch) = self.next_batch(deadline) {
            for log in batch {
                let _ = log.flush();
            }
            if Instant::now() >= deadline {
                let all: Vec<Arc<Topic>> = read(topics).values().cloned().collect();
                for log in all.iter().flat_map(|t| t.logs()) {
                    if log.durable_end() < log.written_end() {
                        let _ = log.flush();
                    }
                }
                deadline = Instant::now() + self.interval;
            }
        }
    }
}
