//! The spare maker: one thread per broker that keeps a few empty spare files ready
//! in `DATA/spares/` (docs/FORMAT.md, Spares), so that a roll finds a file to take
//! even when retention and compaction have returned none yet. A roll that takes a
//! spare touches no directory: its group commit renames the spare into place and
//! creates the index. Without a spare, the roll creates both files while writers
//! wait.
//!
//! It makes a spare only while the pool holds fewer than its target and has room
//! under the cap (the spares count against `--spares-per-partition`), and an empty
//! spare gives up its place to a segment retention or compaction returns.

use super::*;

/// Longest the maker sleeps without being woken (by a roll that took a spare, a
/// topic created, or a stop) before it looks at the pool anyway.
const IDLE_MAX: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(super) struct SpareMaker {
    stats: Arc<LogStats>,
    storage: StorageRef,
    stop: AtomicBool,
}

impl SpareMaker {
    pub(super) fn new(stats: Arc<LogStats>, storage: StorageRef) -> Self {
        SpareMaker {
            stats,
            storage,
            stop: AtomicBool::new(false),
        }
    }

    pub(super) fn start(self: Arc<Self>) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name("seglog-spares".into())
            .spawn(move || self.run())
            .map_err(|e| EngineError::io("starting the spare maker thread", e))
    }

    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.stats.spares.wake_maker();
    }

    fn run(&self) {
        // A failure is logged once, then again only after a success: a full disk
        // must not fill the log too.
        let mut failing = false;
        while !self.stop.load(Ordering::Acquire) {
            match self.stats.spares.refill(&*self.storage) {
                Ok(_) => failing = false,
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "the spare maker could not make a spare; rolls create their files meanwhile");
                    }
                    failing = true;
                }
            }
            self.stats.spares.wait_maker_due(IDLE_MAX);
        }
    }
}
