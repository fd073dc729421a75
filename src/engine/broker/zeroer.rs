//! The zero worker: one thread per broker that writes and fsyncs zeros into the
//! space ahead of each active segment's writer, so the writer's fsyncs overwrite
//! allocated, written blocks instead of growing the file (docs/FORMAT.md, Segment
//! states: an active segment's zero tail is legal).
//!
//! It writes through its own handle of each file, at positions its target claimed
//! past the writer's announced end (see `partition::zero`), and never takes a
//! partition's locks: a writer waits for it only when a write would reach into the
//! one piece in flight, and then turns zeroing off for that segment. All segments
//! share one rate (`--zero-rate`).

use super::*;
use crate::engine::partition::zero::{Claim, ZeroTarget, ZERO_CHUNK_BYTES, ZERO_PIECE_BYTES};

/// Zeros written and not yet fsynced, at most: one piece.
const ZERO_SYNC_BYTES: u64 = ZERO_PIECE_BYTES;
const _: () = assert!(ZERO_SYNC_BYTES <= ZERO_CHUNK_BYTES);

/// Longest the worker sleeps without being woken by a writer before it looks at
/// every active segment anyway.
const IDLE_MAX: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub(super) struct Zeroer {
    stats: Arc<LogStats>,
    storage: StorageRef,
    /// Bytes per second for all segments together.
    rate: u64,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Zeroer {
    pub(super) fn new(stats: Arc<LogStats>, storage: StorageRef, rate: u64) -> Self {
        Zeroer {
            stats,
            storage,
            rate: rate.max(1),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        }
    }

    pub(super) fn start(self: Arc<Self>) -> Result<JoinHandle<()>, EngineError> {
        std::thread::Builder::new()
            .name("seglog-zeroer".into())
            .spawn(move || self.run())
            .map_err(|e| EngineError::io("starting the zero worker thread", e))
    }

    pub(super) fn stop(&self) {
        *lock(&self.stop) = true;
        self.wake.notify_all();
        self.stats.write_path.wake_zeroer();
    }

    fn stopped(&self) -> bool {
        *lock(&self.stop)
    }

    /// Sleeps for `d` or until stopped; false once stopped.
    fn sleep(&self, d: Duration) -> bool {
        let st = lock(&self.stop);
        if *st {
            return false;
        }
        let (st, _) = self
            .wake
            .wait_timeout(st, d)
            .unwrap_or_else(PoisonError::into_inner);
        !*st
    }

    fn run(&self) {
        let zeros = vec![0u8; ZERO_PIECE_BYTES as usize];
        // The earliest time the next piece may start, by the shared rate.
        let mut next_at = Instant::now();
        // Woken by a writer whose lead fell below half the window, else every
        // `IDLE_MAX` (no polling while nothing is due).
        loop {
            self.stats.write_path.wait_zero_due(IDLE_MAX);
            if self.stopped() {
                return;
            }
            let window = self
                .stats
                .write_path
                .preallocate_bytes
                .load(Ordering::Relaxed);
            for target in self.stats.write_path.targets() {
                if !self.zero_one(&target, window, &zeros, &mut next_at) {
                    return;
                }
            }
        }
    }

    /// Zeroes `target` up to a full window ahead of its writer (if due), fsyncing
    /// after each piece. False once stopped.
    fn zero_one(
        &self,
        target: &ZeroTarget,
        window: u64,
        zeros: &[u8],
        next_at: &mut Instant,
    ) -> bool {
        let mut unsynced = 0u64;
        loop {
            let now = Instant::now();
            if *next_at > now && !self.sleep(*next_at - now) {
                return false;
            }
            let Some(claim) = target.claim(window) else {
                break;
            };
            *next_at = Instant::now().max(*next_at)
                + Duration::from_secs_f64(claim.len as f64 / self.rate as f64);
            if !self.write_piece(target, claim, zeros) {
                target.turn_off();
                return true;
            }
            // Each piece is fsynced at once: a writer's fdatasync writes out every
            // dirty page of the file, these zeros included, so at most one piece of
            // them ever lands on a writer's fsync.
            unsynced += claim.len;
            if unsynced >= ZERO_SYNC_BYTES {
                self.sync(target, unsynced);
                unsynced = 0;
            }
        }
        if unsynced > 0 {
            self.sync(target, unsynced);
        }
        true
    }

    /// Writes one claimed piece of zeros; ends the claim.
    fn write_piece(&self, target: &ZeroTarget, claim: Claim, zeros: &[u8]) -> bool {
        let len = usize::try_from(claim.len)
            .unwrap_or(usize::MAX)
            .min(zeros.len());
        let written = target
            .handle(|| self.storage.open(&target.path))
            .and_then(|h| h.write_at(zeros.get(..len).unwrap_or(&[]), claim.start));
        let ok = written.is_ok();
        target.finish(claim, ok);
        if let Err(e) = written {
            tracing::warn!(path = %target.path.display(), error = %e, "zeroing ahead stopped for this segment");
        }
        ok
    }

    /// fsyncs what was zeroed. A failed fsync fails the partition at its next write:
    /// the kernel may have dropped the writer's pages of this file too. The fsync
    /// writes out the writer's records as well, so the journal barrier runs first;
    /// when it fails, the zeros are left unsynced and zeroing stops (the partition's
    /// own next sync fails on the barrier too).
    fn sync(&self, target: &ZeroTarget, bytes: u64) {
        let Ok(h) = target.handle(|| self.storage.open(&target.path)) else {
            return;
        };
        if let Err(e) = self.stats.journal_barrier(target.journal_need()) {
            tracing::warn!(path = %target.path.display(), error = %e, "zeroing ahead stopped for this segment");
            target.turn_off();
            return;
        }
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        match h.sync_data() {
            Ok(()) => {
                self.stats
                    .write_path
                    .zeroed_bytes
                    .fetch_add(bytes, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::error!(path = %target.path.display(), error = %e, "fsync of zeroed space failed");
                target.fail(e);
            }
        }
    }
}
