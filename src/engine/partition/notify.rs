//! Waiting without a thread: async request tasks wait on a watch of this log's
//! durable end instead of parking a thread on [`PartitionLog::wait_durable`]'s
//! condition variable. The watch is bumped under the sync lock by every publish of a
//! group commit, by the first failure and by a close, so a waiter wakes only for its
//! own partition and then re-checks the state under the sync lock (the watch carries
//! no decision of its own). The fsync itself is someone else's: the flusher thread,
//! or a request that runs [`PartitionLog::wait_durable`] on its own path.

use super::*;

impl PartitionLog {
    /// Wakes this log's async waiters. Called with the sync lock held.
    pub(super) fn wake_async(&self, durable_end: u64) {
        self.durable_tx.send_replace(durable_end);
    }

    /// Returns once every offset below `target` is durable, or with the error that
    /// [`PartitionLog::wait_durable`] would return (failed log, deleted topic). Runs
    /// no fsync: whoever asked for the wait also asked the flusher for one.
    pub async fn durable(&self, target: u64) -> Result<(), EngineError> {
        if planted!(ACK_BEFORE_FSYNC) {
            return Ok(());
        }
        // Subscribed before the check: a publish between the two marks the watch
        // changed, so it is never missed.
        let mut rx = self.durable_tx.subscribe();
        loop {
            {
                let s = lock(&self.sync);
                if s.durable_end >= target {
                    return Ok(());
                }
                if let Some(reason) = &s.failed {
                    return Err(self.failed_error(reason));
                }
                if s.closed == Some(Closed::Deleted) {
                    return Err(self.closed_error(Closed::Deleted));
                }
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as the log; a closed watch means the log
                // is going away.
                return Err(EngineError::ShuttingDown);
            }
        }
    }

    /// [`PartitionLog::fetch`] with its long poll as an async wait: checks `offset`,
    /// waits until a record at `offset` is durable, `max_wait` passes or the log
    /// closes, then reads (positional reads of page-cached data, on the caller's
    /// thread).
    pub async fn fetch_async(
        &self,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<LogFetch, EngineError> {
        let deadline = tokio::time::Instant::now().checked_add(max_wait);
        let mut rx = self.durable_tx.subscribe();
        loop {
            let left = deadline.map_or(max_wait, |d| {
                d.saturating_duration_since(tokio::time::Instant::now())
            });
            // A zero wait checks the range and tells whether data or a close is there.
            let (_, end) = self.wait_for_data(offset, Duration::ZERO)?;
            let closed = lock(&self.sync).closed.is_some();
            if offset < end || closed || left.is_zero() {
                return self.fetch(offset, max_bytes, Duration::ZERO);
            }
            match deadline {
                Some(d) => {
                    if let Ok(Err(_)) = tokio::time::timeout_at(d, rx.changed()).await {
                        return self.fetch(offset, max_bytes, Duration::ZERO);
                    }
                }
                None => {
                    if rx.changed().await.is_err() {
                        return self.fetch(offset, max_bytes, Duration::ZERO);
                    }
                }
            }
        }
    }
}
