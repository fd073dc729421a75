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
        self.long_poll(offset, max_wait).await?;
        self.fetch(offset, max_bytes, Duration::ZERO)
    }

    /// [`PartitionLog::fetch_spans`] with the long poll of
    /// [`PartitionLog::fetch_async`].
    pub async fn fetch_spans_async(
        &self,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<LogFetchSpans, EngineError> {
        self.long_poll(offset, max_wait).await?;
        self.fetch_spans(offset, max_bytes, Duration::ZERO)
    }

    /// Waits until a record at `offset` is durable, `max_wait` passes or the log
    /// closes (an offset out of range is an error at once).
    async fn long_poll(&self, offset: u64, max_wait: Duration) -> Result<(), EngineError> {
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
                return Ok(());
            }
            match deadline {
                Some(d) => {
                    if let Ok(Err(_)) = tokio::time::timeout_at(d, rx.changed()).await {
                        return Ok(());
                    }
                }
                None => {
                    if rx.changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::engine::storage::io::RealStorage;

    fn new_log(dir: &Path) -> Arc<PartitionLog> {
        let storage: StorageRef = Arc::new(RealStorage);
        let stats = Arc::new(LogStats::default());
        create_first_segment(&*storage, dir, &stats).unwrap();
        Arc::new(PartitionLog::open("t", 0, dir, storage, stats).unwrap().0)
    }

    fn append_one(log: &PartitionLog) -> u64 {
        let a = log
            .append(
                &[NewRecord {
                    key: None,
                    value: b"v",
                    timestamp_ms: 1,
                }],
                &TopicConfig::default(),
            )
            .unwrap();
        a.last_offset + 1
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Flushes `log` from another thread, as the flusher does.
    fn flush_elsewhere(log: &Arc<PartitionLog>) {
        let l = Arc::clone(log);
        std::thread::spawn(move || l.flush())
            .join()
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_durable_wait_ends_only_with_the_fsync_that_covers_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = new_log(dir.path());
        let target = append_one(&log);
        runtime().block_on(async {
            let mut wait = std::pin::pin!(log.durable(target));
            // Nothing syncs the log: the wait cannot end, however long it is given.
            let early = tokio::time::timeout(Duration::from_millis(20), &mut wait).await;
            assert!(early.is_err(), "acknowledged before any fsync");
            flush_elsewhere(&log);
            wait.await.unwrap();
        });
        assert!(log.durable_end() >= target);
    }

    #[test]
    fn a_durable_wait_ends_with_the_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let log = new_log(dir.path());
        let target = append_one(&log);
        runtime().block_on(async {
            let mut wait = std::pin::pin!(log.durable(target));
            let early = tokio::time::timeout(Duration::from_millis(20), &mut wait).await;
            assert!(early.is_err());
            log.close(Closed::Deleted);
            let r = wait.await;
            assert!(matches!(r, Err(EngineError::TopicDeleted { .. })), "{r:?}");
        });
    }

    #[test]
    fn a_long_poll_wakes_for_new_durable_data_and_times_out_without() {
        let dir = tempfile::tempdir().unwrap();
        let log = new_log(dir.path());
        runtime().block_on(async {
            // No data: the poll ends empty at its timeout.
            let f = log
                .fetch_async(0, 1 << 20, Duration::from_millis(10))
                .await
                .unwrap();
            assert!(f.chunks.is_empty());
            assert_eq!(f.end_offset, 0);
            let mut poll = std::pin::pin!(log.fetch_async(0, 1 << 20, Duration::from_secs(600)));
            let early = tokio::time::timeout(Duration::from_millis(20), &mut poll).await;
            assert!(early.is_err(), "answered before any record was durable");
            // Written but not durable: still waiting.
            let target = append_one(&log);
            let early = tokio::time::timeout(Duration::from_millis(20), &mut poll).await;
            assert!(early.is_err(), "served a record before its fsync");
            flush_elsewhere(&log);
            let f = poll.await.unwrap();
            assert_eq!(f.end_offset, target);
            assert!(f.chunks.iter().any(|c| !c.bytes.is_empty()));
        });
    }
}
