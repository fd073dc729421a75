//! Produce and fetch: routing a request to its partition's log.

use super::*;

use crate::engine::partition::Appended;

/// What a produce still waits for before its acknowledgement: an fsync of one
/// partition covering `target`, under `flush_every_records = 1`.
#[derive(Debug)]
#[must_use = "the records are not acknowledged durable until the wait ends"]
pub struct DurableWait {
    log: Arc<PartitionLog>,
    target: u64,
}

/// A produce's part in its partition's next group commit ([`Broker::lead_or_follow`]).
#[derive(Debug)]
#[must_use = "the records are not acknowledged durable until the commit ends"]
pub enum Commit {
    /// Runs the commit.
    Lead(CommitLead),
    /// Covered by a leader's commit: wait with [`Broker::follow`].
    Follow(DurableWait),
}

/// The claim on a partition's next group commit. Dropped without
/// [`CommitLead::commit`], it releases the claim and asks the flusher for the fsync,
/// so the requests that follow it are never left waiting.
#[derive(Debug)]
#[must_use = "followers wait for this commit"]
pub struct CommitLead {
    log: Arc<PartitionLog>,
    flusher: Arc<Flusher>,
    committer: Arc<Committer>,
    _counted: LeadCount,
    done: bool,
}

/// Bytes a pass's commit covers from which its fsync goes off the event loop even
/// when no other partition's commit is pending ([`CommitLead::better_off_loop`]).
const OFF_LOOP_COMMIT_BYTES: u64 = 64 * 1024;

impl CommitLead {
    /// Releases the claim and runs (or waits for) one fsync covering every record
    /// written to the partition so far, on the calling thread.
    pub fn commit(mut self) -> Result<(), EngineError> {
        self.done = true;
        self.log.commit_claimed()
    }

    /// Releases the claim and has the node's commit thread run one fsync covering
    /// every record written to the partition so far, while the caller's event loop
    /// goes on serving (the next requests to the partition are written meanwhile and
    /// claim the commit after this one). The partition's followers are woken on the
    /// caller's thread once the fsync is published.
    pub async fn commit_off_loop(mut self) -> Result<(), EngineError> {
        self.done = true;
        let target = self.log.release_claim();
        let (done, rx) = tokio::sync::oneshot::channel();
        let job = CommitJob {
            log: Arc::clone(&self.log),
            target,
            done,
        };
        if let Err(job) = self.committer.submit(job) {
            return job.log.wait_durable(job.target);
        }
        CommitAnswer {
            rx,
            log: Arc::clone(&self.log),
        }
        .wait()
        .await
    }

    /// Whether this commit should run on the commit thread rather than on the
    /// caller's event loop: when another partition's commit is claimed or running on
    /// the node (the loop would otherwise run the pass's fsyncs one after another,
    /// writing nothing meanwhile), or when the commit covers at least
    /// [`OFF_LOOP_COMMIT_BYTES`] (its fsync is long enough for the loop to write the
    /// next batch meanwhile). Otherwise the fsync on the loop costs no wake-ups.
    pub fn better_off_loop(&self) -> bool {
        self.committer.leads() > 1 || self.log.unsynced_bytes() >= OFF_LOOP_COMMIT_BYTES
    }

    /// Whether the commit carries a roll's syncs (the outgoing segment, the new
    /// header, the directory): several fsyncs, better run off the event loop.
    pub fn carries_roll(&self) -> bool {
        self.log.roll_pending()
    }

    /// Releases the claim and hands the commit to the flusher thread; the returned
    /// wait (for [`Broker::follow`]) ends once it covers every record written so far.
    pub fn hand_off(mut self) -> DurableWait {
        self.done = true;
        let target = self.log.release_claim();
        self.flusher.request(&self.log);
        DurableWait {
            log: Arc::clone(&self.log),
            target,
        }
    }
}

impl Drop for CommitLead {
    fn drop(&mut self) {
        if !self.done {
            self.log.release_claim();
            self.flusher.request(&self.log);
        }
    }
}

/// Why a write outside the Raft state machine is refused on a replicated topic.
fn replicated_refusal(topic: &str) -> EngineError {
    EngineError::InvalidRequest {
        detail: format!(
            "topic {topic} is replicated: its records are written through its partitions' \
             Raft groups (the native protocol's produce, on the partition's leader)"
        ),
    }
}

impl Broker {
    /// Appends the records to one partition as one write; returns once they are
    /// durable under the flush policy. Offsets are assigned under the partition's
    /// write lock.
    pub fn produce(
        &self,
        topic: &str,
        partition: u32,
        records: &[NewRecord<'_>],
    ) -> Result<ProduceResult, EngineError> {
        let (result, wait) = self.append(topic, partition, records)?;
        if let Some(w) = wait {
            self.wait_durable_here(w)?;
        }
        Ok(result)
    }

    /// The write half of [`Broker::produce`]: appends and applies the flush policy,
    /// and returns the durability wait the acknowledgement still needs, if any (end
    /// it with [`Broker::wait_durable_here`] or [`Broker::durable`]).
    pub fn append(
        &self,
        topic: &str,
        partition: u32,
        records: &[NewRecord<'_>],
    ) -> Result<(ProduceResult, Option<DurableWait>), EngineError> {
        self.append_inner(topic, partition, records, false)
    }

    /// [`Broker::append`] for the Raft state machine of a replicated partition, the
    /// only writer of its records.
    pub fn append_applied(
        &self,
        topic: &str,
        partition: u32,
        records: &[NewRecord<'_>],
    ) -> Result<(ProduceResult, Option<DurableWait>), EngineError> {
        self.append_inner(topic, partition, records, true)
    }

    fn append_inner(
        &self,
        topic: &str,
        partition: u32,
        records: &[NewRecord<'_>],
        applied: bool,
    ) -> Result<(ProduceResult, Option<DurableWait>), EngineError> {
        self.check_running()?;
        let (t, log) = self.partition(topic, partition)?;
        if t.replicated && !applied {
            return Err(replicated_refusal(topic));
        }
        let config = read(&t.config).clone();
        let appended = log.append(records, &config)?;
        Ok(self.appended(log, &appended))
    }

    /// What an append leaves to do: the records' offsets, and the durability wait
    /// its acknowledgement needs (or a flush asked for, with
    /// `--flush-every-records` above 1).
    fn appended(
        &self,
        log: Arc<PartitionLog>,
        appended: &Appended,
    ) -> (ProduceResult, Option<DurableWait>) {
        let result = ProduceResult {
            base_offset: appended.base_offset,
            last_offset: appended.last_offset,
        };
        if self.opts.flush_every_records <= 1 {
            let target = appended.last_offset + 1;
            return (result, Some(DurableWait { log, target }));
        }
        if appended.unflushed >= self.opts.flush_every_records {
            self.flusher.request(&log);
        }
        (result, None)
    }

    /// [`Broker::append`] with `before_write` called under the partition's write
    /// lock with the records' offsets, before they are written (see
    /// [`PartitionLog::append_with`]): an idempotent producer's journal entry is
    /// written first, and its fsync shares the records' wait. If it fails nothing
    /// is written; if the records' write fails after it, the partition is failed.
    pub fn append_then<R, E>(
        &self,
        topic: &str,
        partition: u32,
        records: &[NewRecord<'_>],
        before_write: impl FnOnce(&ProduceResult) -> Result<R, E>,
    ) -> Result<(ProduceResult, Option<DurableWait>, R), AppendError<E>> {
        self.check_running()?;
        let (t, log) = self.partition(topic, partition)?;
        if t.replicated {
            return Err(replicated_refusal(topic).into());
        }
        let config = read(&t.config).clone();
        let (appended, r) = log.append_with(records, &config, |base_offset, last_offset| {
            before_write(&ProduceResult {
                base_offset,
                last_offset,
            })
        })?;
        let (result, wait) = self.appended(log, &appended);
        Ok((result, wait, r))
    }

    /// Ends a durability wait on the calling thread: the first waiter of the
    /// partition runs the group commit for everyone written so far.
    pub fn wait_durable_here(&self, wait: DurableWait) -> Result<(), EngineError> {
        wait.log.wait_durable(wait.target)
    }

    /// Ends a durability wait without holding a thread: asks the flusher for a group
    /// commit of the partition at once (one per flusher pass, covering every request
    /// appended meanwhile); the future waits for the partition's durable end to pass
    /// the records.
    pub fn durable(
        &self,
        wait: DurableWait,
    ) -> impl std::future::Future<Output = Result<(), EngineError>> + Send + 'static {
        self.flusher.request(&wait.log);
        async move { wait.log.durable(wait.target).await }
    }

    /// Asks the flusher for a group commit covering an applied entry's records and
    /// returns at once: a replicated partition's apply does not wait for its own
    /// fsync (the entry is durable in the Raft logs of a majority already); readers
    /// wait for it instead ([`Broker::settle`]).
    pub fn flush_soon(&self, wait: DurableWait) {
        self.flusher.request(&wait.log);
    }

    /// Returns once every record written to the partition is durable, and so
    /// readable: a read of a replicated partition on its leader settles first, so
    /// that every record applied (acknowledged) before the read is in its answer.
    /// Costs nothing when no fsync is owed.
    pub async fn settle(&self, topic: &str, partition: u32) -> Result<(), EngineError> {
        let (_, log) = self.partition(topic, partition)?;
        let target = log.written_end();
        if log.durable_end() >= target {
            return Ok(());
        }
        self.durable(DurableWait { log, target }).await
    }

    /// The event-loop way to end a durability wait: the first request of a pass to
    /// reach its partition's commit leads it ([`CommitLead::commit`] runs one fsync
    /// on the caller's thread for every record written to the partition until then);
    /// the others follow ([`Broker::follow`]), covered by the leader's fsync, with no
    /// hand-off to another thread.
    pub fn lead_or_follow(&self, wait: DurableWait) -> Commit {
        if wait.log.claim_commit() {
            Commit::Lead(CommitLead {
                log: wait.log,
                flusher: Arc::clone(&self.flusher),
                committer: Arc::clone(&self.committer),
                _counted: self.committer.count_lead(),
                done: false,
            })
        } else {
            Commit::Follow(wait)
        }
    }

    /// Waits, without a thread and without asking for an fsync, until the leader's
    /// commit covers `wait` (see [`Broker::lead_or_follow`]).
    pub async fn follow(&self, wait: DurableWait) -> Result<(), EngineError> {
        wait.log.durable(wait.target).await
    }

    /// [`Broker::fetch`] with the long poll as an async wait on the partition.
    pub async fn fetch_async(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<FetchResult, EngineError> {
        self.check_running()?;
        let (_, log) = self.partition(topic, partition)?;
        let first = log.fetch_async(offset, max_bytes, max_wait).await;
        let f = self
            .mended_or(topic, partition, first, || {
                log.fetch_async(offset, max_bytes, max_wait)
            })
            .await?;
        Ok(FetchResult {
            chunks: f.chunks,
            start_offset: f.start_offset,
            end_offset: f.end_offset,
        })
    }

    /// [`Broker::fetch_async`] with the records left in their files: validated file
    /// ranges to stream to the client (see [`PartitionLog::fetch_spans`]).
    ///
    /// [`PartitionLog::fetch_spans`]: crate::engine::partition::PartitionLog::fetch_spans
    pub async fn fetch_spans_async(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<LogFetchSpans, EngineError> {
        self.check_running()?;
        let (_, log) = self.partition(topic, partition)?;
        let first = log.fetch_spans_async(offset, max_bytes, max_wait).await;
        self.mended_or(topic, partition, first, || {
            log.fetch_spans_async(offset, max_bytes, max_wait)
        })
        .await
    }

    /// Durable records from `offset`, at most `max_bytes` (capped at
    /// [`crate::engine::partition::FETCH_BYTES_MAX`]; always at least one whole record if one
    /// exists), waiting up to `max_wait` for new durable data when `offset` is the end.
    pub fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait: Duration,
    ) -> Result<FetchResult, EngineError> {
        self.check_running()?;
        let (_, log) = self.partition(topic, partition)?;
        let f = self.noticed(topic, partition, log.fetch(offset, max_bytes, max_wait))?;
        Ok(FetchResult {
            chunks: f.chunks,
            start_offset: f.start_offset,
            end_offset: f.end_offset,
        })
    }

    /// (start offset, end offset = next durable offset) of a partition.
    pub fn offsets(&self, topic: &str, partition: u32) -> Result<(u64, u64), EngineError> {
        let (_, log) = self.partition(topic, partition)?;
        Ok((log.start_offset(), log.durable_end()))
    }

    /// Counters since the broker started.
    pub fn stats(&self) -> BrokerStats {
        BrokerStats {
            fsyncs: self.stats.fsyncs.load(Ordering::Relaxed),
            produce_requests: self.stats.produce_requests.load(Ordering::Relaxed),
            records_appended: self.stats.records_appended.load(Ordering::Relaxed),
            fsync_latency_us: self.stats.write_path.fsync_latency.counts(),
            rolls: self.stats.write_path.rolls.load(Ordering::Relaxed),
            roll_stall_max_us: self
                .stats
                .write_path
                .roll_stall_max_us
                .load(Ordering::Relaxed),
            zeroed_bytes: self.stats.write_path.zeroed_bytes.load(Ordering::Relaxed),
            spares_taken: self.stats.spares.taken.load(Ordering::Relaxed),
            spares_returned: self.stats.spares.returned.load(Ordering::Relaxed),
        }
    }

    /// Sum of the fsync latencies counted in [`BrokerStats::fsync_latency_us`], in
    /// microseconds.
    pub fn fsync_latency_sum_us(&self) -> u64 {
        self.stats.write_path.fsync_latency.sum_us()
    }

    /// Records made durable by each group commit.
    pub fn commit_batches(&self) -> &crate::engine::partition::zero::Pow2Histogram {
        &self.stats.commit_records
    }

    /// Stops taking requests, stops the flusher, fsyncs every partition, releases the
    /// lock. Idempotent. Returns the first failure of a final fsync (a partition that
    /// had failed before is skipped: nothing more of it will be acknowledged).
    pub fn shutdown(&self) -> Result<(), EngineError> {
        let mut done = lock(&self.shut);
        if *done {
            return Ok(());
        }
        self.shutting_down.store(true, Ordering::Release);
        self.groups.shutdown();
        self.cleaner.stop();
        for handle in std::mem::take(&mut *lock(&self.cleaner_threads)) {
            let _ = handle.join();
        }
        self.flusher.stop();
        if let Some(handle) = lock(&self.flusher_thread).take() {
            let _ = handle.join();
        }
        self.committer.stop();
        self.zeroer.stop();
        if let Some(handle) = lock(&self.zeroer_thread).take() {
            let _ = handle.join();
        }
        self.spare_maker.stop();
        if let Some(handle) = lock(&self.spare_maker_thread).take() {
            let _ = handle.join();
        }
        let mut first_error = None;
        let topics: Vec<Arc<Topic>> = read(&self.topics).values().cloned().collect();
        for log in topics.iter().flat_map(|t| t.logs()) {
            let failed_before = log.failure().is_some();
            log.close(Closed::ShuttingDown);
            match log.flush() {
                Err(e) => {
                    if !failed_before {
                        first_error.get_or_insert(e);
                    }
                }
                Ok(()) => {
                    if let Err(e) = log.trim_stale_tail() {
                        // Only tidiness: the next start cuts those bytes as well.
                        tracing::warn!(partition = %log.dir().display(), error = %e, "cutting a reused segment's old bytes at stop failed");
                    }
                }
            }
        }
        self.producers.shutdown();
        if let Err(e) = self.keys.flush() {
            tracing::warn!(error = %e, "writing the keys' last-used times failed");
        }
        lock(&self.dir_lock).take();
        *done = true;
        first_error.map_or(Ok(()), Err)
    }
}
