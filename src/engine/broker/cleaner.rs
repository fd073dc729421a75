//! The background cleaner: rolling by age, retention and compaction rounds over every
//! partition, one partition at a time, at a lowered priority.

use super::*;

/// Which background task a cleaner thread runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CleanupKind {
    Retention,
    Compaction,
}

impl CleanupKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            CleanupKind::Retention => "retention",
            CleanupKind::Compaction => "compaction",
        }
    }
}

/// What the cleanup threads share with the broker.
#[derive(Debug)]
pub(super) struct Cleaner {
    pub(super) topics: Arc<Topics>,
    pub(super) storage: StorageRef,
    pub(super) cold: Option<PathBuf>,
    pub(super) stop: Mutex<bool>,
    pub(super) wake: Condvar,
    /// Set with `stop`: a compaction or copy in progress gives up at its next write.
    pub(super) stopping: Arc<AtomicBool>,
    /// The broker's log counters, for the spare pool's cap.
    pub(super) spares: Arc<LogStats>,
    /// Told when a fetch or the scrub meets damage ([`Broker::on_damage`]).
    pub(super) damage: std::sync::OnceLock<super::DamageListener>,
    /// What the scrub did since the broker started.
    pub(super) scrubbed: super::scrub::ScrubStats,
}

impl Cleaner {
    pub(super) fn start(
        self: Arc<Self>,
        kind: CleanupKind,
        interval: Duration,
    ) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name(format!("seglog-{}", kind.name()))
            .spawn(move || {
                lower_priority();
                while self.sleep(interval) {
                    // Each warning is logged where it arises (see `round`).
                    let _ = self.round(kind);
                }
            })
            .map_err(|e| EngineError::io(format!("starting the {} thread", kind.name()), e))
    }

    /// Waits `interval`; false once stopped.
    pub(super) fn sleep(&self, interval: Duration) -> bool {
        let deadline = Instant::now() + interval;
        let mut stop = lock(&self.stop);
        loop {
            if *stop {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            stop = self
                .wake
                .wait_timeout(stop, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        *lock(&self.stop) = true;
        self.wake.notify_all();
    }

    pub(super) fn stopped(&self) -> bool {
        *lock(&self.stop)
    }

    /// One visit of every partition: roll by age, then retention or compaction where
    /// the topic's `cleanup_policy` asks for it. Returns warnings (failures) as lines.
    pub(super) fn round(&self, kind: CleanupKind) -> Vec<String> {
        let mut warnings = Vec::new();
        let topics: Vec<Arc<Topic>> = read(&self.topics).values().cloned().collect();
        self.spares
            .spares
            .set_partitions(topics.iter().map(|t| t.partitions.len() as u64).sum());
        match self.spares.spares.trim(&*self.storage) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                removed = n,
                "spare pool: removed the spares past the cap of the node's partitions"
            ),
            Err(e) => warnings.push(format!("trimming the spare pool: {e}")),
        }
        for topic in topics {
            let config = read(&topic.config).clone();
            for (p, (slot, cleanup)) in topic.partitions.iter().zip(&topic.cleanup).enumerate() {
                if self.stopped() {
                    return warnings;
                }
                let Slot::Open(log) = slot else { continue };
                let visit = Visit {
                    topic: &topic.name,
                    partition: p as u32,
                    log,
                    cleanup,
                    config: &config,
                    storage: &*self.storage,
                    now_ms: now_ms(),
                    stopping: &self.stopping,
                };
                let label = format!("{}/{p}", topic.name);
                let result = visit.roll_if_due().and_then(|_| match kind {
                    CleanupKind::Retention if config.cleanup_policy.deletes() => {
                        visit.retention(self.cold.as_deref()).map(|done| {
                            if let Some(why) = done.kept_because {
                                tracing::warn!(topic = %topic.name, partition = p, "retention: {why}");
                                warnings.push(format!("retention of {label}: {why}"));
                            }
                        })
                    }
                    CleanupKind::Compaction if config.cleanup_policy.compacts() => {
                        visit.compaction().map(|_: CompactionDone| ())
                    }
                    _ => Ok(()),
                });
                match result {
                    Ok(()) => {}
                    // The topic went, or the broker is stopping: nothing to report.
                    Err(EngineError::TopicDeleted { .. } | EngineError::ShuttingDown) => {}
                    Err(e) => {
                        tracing::warn!(
                            topic = %topic.name,
                            partition = p,
                            error = %e,
                            "{} failed",
                            kind.name()
                        );
                        warnings.push(format!("{} of {label} failed: {e}", kind.name()));
                    }
                }
            }
        }
        warnings
    }
}

/// Background cleanup gives way to request threads: the calling thread gets nice 10
/// (on Linux, priorities are per thread). Failure only means it keeps its priority.
#[expect(unsafe_code, reason = "setpriority of the calling thread through libc")]
pub(super) fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers; this changes
        // only the calling thread's scheduling priority.
        unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
        }
    }
}

impl Broker {
    /// Runs one retention round now (rolling by age too), as the background task
    /// does every `retention_check_interval`. Returns the warnings it printed would be.
    pub fn run_retention(&self) -> Vec<String> {
        self.cleaner.round(CleanupKind::Retention)
    }

    /// Runs one compaction round now, as the background task does every
    /// `compaction_check_interval`. Returns warnings (failures).
    pub fn run_compaction(&self) -> Vec<String> {
        self.cleaner.round(CleanupKind::Compaction)
    }
}
