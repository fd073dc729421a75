//! Topic administration: create (built under `<name>~new`, then renamed), list,
//! describe, alter, delete (renamed to `<name>~del`, then removed).

use super::*;

impl Broker {
    pub(super) fn check_running(&self) -> Result<(), EngineError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }

    pub(super) fn topic(&self, name: &str) -> Result<Arc<Topic>, EngineError> {
        read(&self.topics)
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownTopic {
                topic: name.to_string(),
            })
    }

    /// Whether this node has a topic of that name (open or not).
    pub fn has_topic(&self, name: &str) -> bool {
        read(&self.topics).contains_key(name)
    }

    pub(super) fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<(Arc<Topic>, Arc<PartitionLog>), EngineError> {
        let t = self.topic(topic)?;
        t.online()?;
        let log = match t.partitions.get(partition as usize) {
            Some(Slot::Open(log)) => log.clone(),
            Some(Slot::Unavailable(reason)) => {
                return Err(EngineError::PartitionUnavailable {
                    topic: topic.to_string(),
                    partition,
                    reason: reason.clone(),
                })
            }
            None => {
                return Err(EngineError::UnknownPartition {
                    topic: topic.to_string(),
                    partition,
                })
            }
        };
        Ok((t, log))
    }

    pub(super) fn count_fsyncs(&self, n: u64) {
        self.stats.fsyncs.fetch_add(n, Ordering::Relaxed);
    }

    /// Creates a topic with `partitions` partitions, each with an empty segment 0.
    /// Returns once the whole topic is durable.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        config: TopicConfig,
    ) -> Result<(), EngineError> {
        self.create_topic_with(name, partitions, config, None)
    }

    /// [`Broker::create_topic`], with one more file (`(name, bytes)`) written in the
    /// topic directory before it is renamed into place (a replicated topic's
    /// placement).
    pub fn create_topic_with(
        &self,
        name: &str,
        partitions: u32,
        config: TopicConfig,
        extra: Option<(&str, &[u8])>,
    ) -> Result<(), EngineError> {
        validate_name(name)?;
        if !(1..=PARTITIONS_MAX).contains(&partitions) {
            return Err(TopicError::Partitions {
                value: partitions.to_string(),
            }
            .into());
        }
        // Values set directly on the struct get the same range checks as KEY=VALUE.
        let config = TopicConfig::from_json(&config.to_json())?;
        self.check_running()?;
        let _admin = lock(&self.admin);
        let dir = self.topics_dir.join(name);
        if read(&self.topics).contains_key(name) || dir.exists() {
            return Err(EngineError::TopicExists {
                topic: name.to_string(),
            });
        }
        let meta = TopicMeta { partitions, config };
        self.build_topic_dir(name, &meta, extra)?;
        let mut notes = Vec::new();
        let topic = load_topic(&self.storage, name, &dir, &self.stats, &mut notes)?;
        write(&self.topics).insert(name.to_string(), Arc::new(topic));
        self.count_partitions_for_spares();
        tracing::info!(topic = name, partitions, "topic created");
        Ok(())
    }

    /// Tells the spare pool how many partitions the node has (its cap), at once
    /// rather than at the next cleaner round.
    fn count_partitions_for_spares(&self) {
        let n = read(&self.topics)
            .values()
            .map(|t| t.partitions.len() as u64)
            .sum();
        self.stats.spares.set_partitions(n);
    }

    /// Builds the topic under `<name>~new` and renames it into place:
    /// 1. create each partition directory with segment 0, fsync each log and
    ///    partition directory;
    /// 2. write `topic.json` atomically (fsyncs the file and the staging directory);
    /// 3. rename `<name>~new` to `<name>`;
    /// 4. fsync the topics directory.
    pub(super) fn build_topic_dir(
        &self,
        name: &str,
        meta: &TopicMeta,
        extra: Option<(&str, &[u8])>,
    ) -> Result<(), EngineError> {
        let staging = self.topics_dir.join(creating_topic_dir_name(name));
        let dir = self.topics_dir.join(name);
        let s = &*self.storage;
        let built = (|| {
            let ctx = |what: &str| format!("creating topic {name}: {what}");
            if staging.exists() {
                s.remove_dir_all(&staging)
                    .map_err(|e| EngineError::io(ctx("removing a stale staging directory"), e))?;
            }
            // 1.
            for p in 0..meta.partitions {
                let pdir = staging.join(p.to_string());
                s.create_dir_all(&pdir)
                    .map_err(|e| EngineError::io(ctx("creating a partition directory"), e))?;
                create_first_segment(s, &pdir, &self.stats)?;
            }
            // 2.
            if let Some((file, bytes)) = extra {
                self.count_fsyncs(2);
                write_file_atomic(s, &staging, file, bytes)
                    .map_err(|e| EngineError::io(ctx(&format!("writing {file}")), e))?;
            }
            self.count_fsyncs(2);
            write_file_atomic(s, &staging, TOPIC_FILE, &meta.encode())
                .map_err(|e| EngineError::io(ctx("writing topic.json"), e))?;
            // 3.
            s.rename(&staging, &dir)
                .map_err(|e| EngineError::io(ctx("renaming the staging directory"), e))?;
            // 4.
            self.count_fsyncs(1);
            s.sync_dir(&self.topics_dir)
                .map_err(|e| EngineError::io(ctx("syncing the topics directory"), e))
        })();
        if built.is_err() && staging.exists() {
            let _ = s.remove_dir_all(&staging);
        }
        built
    }

    /// Deletes a topic. Requests in progress on it end with `TopicDeleted`.
    pub fn delete_topic(&self, name: &str) -> Result<(), EngineError> {
        validate_name(name)?;
        self.check_running()?;
        let _admin = lock(&self.admin);
        // An offline topic's files are never touched, not even to delete them.
        self.topic(name)?.online()?;
        let topic = write(&self.topics)
            .remove(name)
            .ok_or_else(|| EngineError::UnknownTopic {
                topic: name.to_string(),
            })?;
        for log in topic.logs() {
            log.close(Closed::Deleted);
        }
        // Background work in progress on its partitions finishes first (it changes
        // nothing more: the logs are closed), and none starts while the files go.
        let _busy: Vec<_> = topic.cleanup.iter().map(|c| c.exclusive()).collect();
        // The idempotent producers forget the topic's batches durably before its files
        // go: a topic created again under this name starts with none of them.
        let forgotten = self.producers.forget_topic(name).map_err(|e| {
            EngineError::io(
                format!("deleting topic {name}: writing the producers' state"),
                std::io::Error::other(e),
            )
        });
        if let Err(e) = forgotten.and_then(|()| self.remove_topic_dir(&topic.dir)) {
            // Still in place: bring the topic back as it is on disk.
            let mut notes = Vec::new();
            if let Ok(t) = load_topic(&self.storage, name, &topic.dir, &self.stats, &mut notes) {
                tracing::warn!(topic = name, error = %e, "deleting the topic failed; re-opened it");
                write(&self.topics).insert(name.to_string(), Arc::new(t));
            }
            return Err(e);
        }
        self.drop_schemas(name);
        self.count_partitions_for_spares();
        tracing::info!(topic = name, "topic deleted");
        Ok(())
    }

    /// Removes a topic directory: 1. rename it to `<name>~del`, 2. fsync the topics
    /// directory (the topic is gone from here, even after a crash), 3. remove the
    /// renamed directory, 4. fsync the topics directory. A failure after step 2 leaves
    /// a leftover that the next start removes.
    pub(super) fn remove_topic_dir(&self, dir: &Path) -> Result<(), EngineError> {
        let s = &*self.storage;
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let doomed = self.topics_dir.join(deleting_topic_dir_name(&name));
        let ctx = |what: &str| format!("deleting topic {name}: {what}");
        if doomed.exists() {
            // A leftover of an earlier delete whose removal failed.
            s.remove_dir_all(&doomed)
                .map_err(|e| EngineError::io(ctx("removing an earlier leftover"), e))?;
        }
        // 1.
        s.rename(dir, &doomed)
            .map_err(|e| EngineError::io(ctx("renaming its directory"), e))?;
        // 2.
        self.count_fsyncs(1);
        s.sync_dir(&self.topics_dir)
            .map_err(|e| EngineError::io(ctx("syncing the topics directory"), e))?;
        // 3. and 4.: the topic is already gone; a failure only leaves a leftover.
        if s.remove_dir_all(&doomed).is_ok() {
            self.count_fsyncs(1);
            let _ = s.sync_dir(&self.topics_dir);
        }
        Ok(())
    }

    /// Changes configuration keys (`KEY`, `VALUE` as in `--config KEY=VALUE`); unknown
    /// keys and out-of-range values are refused and nothing changes. Returns the new
    /// configuration once `topic.json` is durably replaced.
    pub fn alter_topic(
        &self,
        name: &str,
        settings: &[(String, String)],
    ) -> Result<TopicConfig, EngineError> {
        validate_name(name)?;
        self.check_running()?;
        let _admin = lock(&self.admin);
        let topic = self.topic(name)?;
        topic.online()?;
        let mut config = read(&topic.config).clone();
        for (key, value) in settings {
            config.set(key, value)?;
        }
        let meta = TopicMeta {
            partitions: topic.partitions.len() as u32,
            config: config.clone(),
        };
        self.count_fsyncs(2);
        write_file_atomic(&*self.storage, &topic.dir, TOPIC_FILE, &meta.encode()).map_err(|e| {
            EngineError::io(
                format!("writing {}", topic.dir.join(TOPIC_FILE).display()),
                e,
            )
        })?;
        *write(&topic.config) = config.clone();
        let changed = settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ");
        tracing::info!(topic = name, %changed, "topic configuration changed");
        Ok(config)
    }

    /// Topic names, sorted (offline topics included).
    pub fn list_topics(&self) -> Vec<String> {
        read(&self.topics).keys().cloned().collect()
    }

    /// Offline topics (their metadata has a problem) with the problem, sorted.
    pub fn offline_topics(&self) -> Vec<(String, String)> {
        read(&self.topics)
            .values()
            .filter_map(|t| t.offline.clone().map(|p| (t.name.clone(), p)))
            .collect()
    }

    /// Per partition: start and end offsets, segment count, bytes; and the config.
    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, EngineError> {
        let topic = self.topic(name)?;
        topic.online()?;
        let partitions = topic
            .partitions
            .iter()
            .zip(&topic.cleanup)
            .enumerate()
            .map(|(p, (slot, cleanup))| partition_info(p as u32, slot, cleanup.stats()))
            .collect();
        let config = read(&topic.config).clone();
        Ok(TopicDescription {
            name: topic.name.clone(),
            partitions,
            config,
        })
    }

    /// Number of partitions of a topic.
    pub fn partition_count(&self, topic: &str) -> Result<u32, EngineError> {
        let t = self.topic(topic)?;
        t.online()?;
        Ok(t.partitions.len() as u32)
    }
}

pub(super) fn partition_info(partition: u32, slot: &Slot, cleanup: CleanupStats) -> PartitionInfo {
    match slot {
        Slot::Open(log) => {
            let segs = log.snapshot();
            let health = log.health();
            let error = log.failure().map(|r| r.to_string());
            let (state, detail) = match (&error, health.damage.split_first()) {
                (Some(e), _) => (PartitionState::Failed, Some(e.clone())),
                (None, Some((first, rest))) => (
                    PartitionState::Damaged,
                    Some(match rest.len() {
                        0 => first.clone(),
                        n => format!("{first} (and {n} more)"),
                    }),
                ),
                (None, None) => (PartitionState::Ok, None),
            };
            PartitionInfo {
                partition,
                start_offset: log.start_offset(),
                end_offset: log.durable_end(),
                segments: segs.len() as u64,
                bytes: segs.iter().map(|s| s.bytes()).sum(),
                error,
                cleanup,
                records: health.records,
                state,
                detail,
                spares: log.spares(),
                preallocated_bytes: log.preallocated_bytes(),
            }
        }
        Slot::Unavailable(reason) => PartitionInfo {
            partition,
            start_offset: 0,
            end_offset: 0,
            segments: 0,
            bytes: 0,
            error: Some(reason.clone()),
            cleanup,
            records: 0,
            state: PartitionState::Failed,
            detail: Some(reason.clone()),
            spares: 0,
            preallocated_bytes: 0,
        },
    }
}
