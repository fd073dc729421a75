//! What the replication layer needs of the broker: a partition's written end, an
//! fsync of one partition, the topic directory, and a topic created with its replica
//! placement beside `topic.json`.

use super::*;

impl Broker {
    /// The next offset the partition will assign (written, maybe not yet durable).
    pub fn written_end(&self, topic: &str, partition: u32) -> Result<u64, EngineError> {
        let (_, log) = self.partition(topic, partition)?;
        Ok(log.written_end())
    }

    /// Why the partition refuses writes until a restart runs recovery (a failed
    /// fsync, ...), if it does; `None` also for a partition this broker does not have.
    pub fn partition_failure(
        &self,
        topic: &str,
        partition: u32,
    ) -> Option<crate::engine::error::FailureReason> {
        let (_, log) = self.partition(topic, partition).ok()?;
        log.failure()
    }

    /// Fsyncs what is written to one partition.
    pub fn flush_partition(&self, topic: &str, partition: u32) -> Result<(), EngineError> {
        let (_, log) = self.partition(topic, partition)?;
        log.flush()
    }

    /// `DATA/topics/<topic>`.
    pub fn topic_dir(&self, topic: &str) -> PathBuf {
        self.topics_dir.join(topic)
    }

    /// The I/O seam the broker writes through.
    pub fn storage(&self) -> &StorageRef {
        &self.storage
    }
}

impl Broker {
    /// The counters every log of this broker adds to (the Raft logs share them).
    pub fn log_stats(&self) -> Arc<LogStats> {
        Arc::clone(&self.stats)
    }
}

impl Broker {
    /// Removes a replicated partition's records at or past `offset`, durably (a
    /// snapshot install cutting what lies beyond the snapshot). Retention and
    /// compaction of the partition wait meanwhile.
    pub fn cut_applied_tail(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<(), EngineError> {
        self.with_cleanup_held(topic, partition, |log| log.cut_tail(offset))
    }

    /// Empties a replicated partition and makes it continue at `offset`, durably (a
    /// snapshot install whose leader's retention removed every record the follower
    /// holds). Retention and compaction of the partition wait meanwhile.
    pub fn restart_applied_at(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
    ) -> Result<(), EngineError> {
        self.with_cleanup_held(topic, partition, |log| log.restart_at(offset))
    }

    /// Runs `f` on the partition's log while its retention and compaction wait.
    fn with_cleanup_held<T>(
        &self,
        topic: &str,
        partition: u32,
        f: impl FnOnce(&PartitionLog) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let (t, log) = self.partition(topic, partition)?;
        let _busy = t.cleanup.get(partition as usize).map(|c| c.exclusive());
        f(&log)
    }

    /// The topic's configuration now.
    pub fn topic_config(
        &self,
        topic: &str,
    ) -> Result<crate::format::topic::TopicConfig, EngineError> {
        let t = self.topic(topic)?;
        let config = read(&t.config).clone();
        Ok(config)
    }

    /// Whether the topic's cleanup policy compacts (its offsets may then have gaps).
    pub fn topic_compacts(&self, topic: &str) -> Result<bool, EngineError> {
        let t = self.topic(topic)?;
        let policy = read(&t.config).cleanup_policy;
        Ok(policy != crate::format::topic::CleanupPolicy::Delete)
    }
}
