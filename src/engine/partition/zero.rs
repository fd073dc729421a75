//! The write path's shared state: preallocation and zero-ahead settings, the zero
//! state of every active segment (shared between its writer and the broker's zero
//! worker), and the counters `bench` reports (fsync latency, rolls, roll stalls,
//! zeroed bytes).
//!
//! Invariants of a [`ZeroTarget`] (all under its short mutex, never held across I/O):
//! - The writer announces the end of every write (`writer_end`) before it writes.
//! - The worker claims a piece `[start, start + len)` only with `start` at or past
//!   `writer_end` plus [`zero_gap`], `zeroed_end` and `floor`; while a claim is in flight a writer whose
//!   write would reach into it turns zeroing off and waits for the piece to finish, so
//!   zeros never land on live data, whichever thread runs first.
//! - Once off (overtaken, sealed, failed write) a target is never zeroed again.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use super::{lock, JournalNeed};
use crate::engine::storage::io::StorageFile;

/// Zeroing of a segment starts once it holds this much data.
pub const ZERO_START_BYTES: u64 = 64 * 1024;
/// Zeros are written (and fsynced) in chunks of this size.
pub const ZERO_CHUNK_BYTES: u64 = 4 * 1024 * 1024;
/// One claimed piece of a chunk: the longest a writer can wait for the worker.
pub const ZERO_PIECE_BYTES: u64 = 256 * 1024;
/// Default `--preallocate-bytes`: the zero-ahead window too.
pub const PREALLOCATE_BYTES_DEFAULT: u64 = 8 * 1024 * 1024;
/// Default `--zero-rate` in bytes per second, shared by every segment of a node.
pub const ZERO_RATE_DEFAULT: u64 = 64 * 1024 * 1024;

/// How far ahead of the writer's end zeros start when they have no lead: a piece
/// for the default window, a quarter of a smaller one.
pub fn zero_gap(window: u64) -> u64 {
    ZERO_PIECE_BYTES.min(window / 4)
}

/// Sub-buckets per power of two of the fsync latency histogram (error at most 1/8).
const SUB_BUCKETS: u64 = 8;
/// Buckets of the fsync latency histogram: exact below 8 µs, then 8 per power of two.
pub const FSYNC_BUCKETS: usize = (SUB_BUCKETS + 61 * SUB_BUCKETS) as usize;

/// The bucket of a latency in microseconds.
fn bucket_of(us: u64) -> usize {
    if us < SUB_BUCKETS {
        return us as usize;
    }
    let e = u64::from(u64::BITS - 1 - us.leading_zeros()); // >= 3
    let sub = (us >> (e - 3)) & (SUB_BUCKETS - 1);
    (SUB_BUCKETS + (e - 3) * SUB_BUCKETS + sub) as usize
}

/// The largest latency (µs) a bucket holds.
fn bucket_upper_us(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_BUCKETS {
        return i;
    }
    let e = (i - SUB_BUCKETS) / SUB_BUCKETS + 3;
    let sub = (i - SUB_BUCKETS) % SUB_BUCKETS;
    let upper = u128::from(SUB_BUCKETS + sub + 1) << (e - 3);
    u64::try_from(upper - 1).unwrap_or(u64::MAX)
}

/// A log-linear histogram of fsync latencies in microseconds.
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    /// Sum of every latency counted, in microseconds (for a Prometheus `_sum`).
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: (0..FSYNC_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    /// Counts one latency.
    pub fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        if let Some(b) = self.buckets.get(bucket_of(us).min(FSYNC_BUCKETS - 1)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Sum of every latency counted, in microseconds.
    pub fn sum_us(&self) -> u64 {
        self.sum_us.load(Ordering::Relaxed)
    }

    /// The counts per bucket.
    pub fn counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

/// How many of `counts` (of a [`LatencyHistogram`]) are below `2^exp` µs: exact,
/// since every power of two from 8 µs on starts a bucket.
pub fn count_below_pow2_us(counts: &[u64], exp: u32) -> u64 {
    let Some(bound) = 1u64.checked_shl(exp) else {
        return counts.iter().sum();
    };
    counts
        .iter()
        .enumerate()
        .take_while(|(i, _)| bucket_upper_us(*i) < bound)
        .map(|(_, c)| c)
        .sum()
}

/// Buckets of a [`Pow2Histogram`]: bucket `i` holds the values in `(2^(i-1), 2^i]`
/// (bucket 0 holds 0 and 1).
pub const POW2_BUCKETS: usize = 65;

/// A histogram with power-of-two bucket bounds, its sum and its count: one atomic
/// add per bucket, sum and count per value, no lock, no allocation.
#[derive(Debug)]
pub struct Pow2Histogram {
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Default for Pow2Histogram {
    fn default() -> Self {
        Pow2Histogram {
            buckets: (0..POW2_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }
}

impl Pow2Histogram {
    /// Counts one value.
    pub fn record(&self, v: u64) {
        let i = (u64::BITS - v.saturating_sub(1).leading_zeros()) as usize;
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum.fetch_add(v, Ordering::Relaxed);
    }

    /// Values counted at most `2^exp` (`exp` past the last bucket: every value).
    pub fn count_at_most_pow2(&self, exp: u32) -> u64 {
        self.buckets
            .iter()
            .take(exp as usize + 1)
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    /// Every value counted.
    pub fn count(&self) -> u64 {
        self.count_at_most_pow2(POW2_BUCKETS as u32)
    }

    /// Sum of the values counted.
    pub fn sum(&self) -> u64 {
        self.sum.load(Ordering::Relaxed)
    }
}

/// The quantile `q` (0..=1) of histogram counts, in microseconds: the upper bound of
/// the bucket that holds it (0 when nothing was counted).
pub fn quantile_us(counts: &[u64], q: f64) -> u64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let want = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= want {
            return bucket_upper_us(i);
        }
    }
    bucket_upper_us(counts.len().saturating_sub(1))
}

/// Settings and counters of the write path, shared by every log of a broker.
#[derive(Debug, Default)]
pub struct WritePath {
    /// Space reserved ahead of each active segment's writer (`fallocate`); 0: none.
    pub preallocate_bytes: AtomicU64,
    /// Whether new active segments are registered with the zero worker.
    pub zero_ahead: AtomicBool,
    /// Latency of every data fsync of a log (group commits and rolls).
    pub fsync_latency: LatencyHistogram,
    pub rolls: AtomicU64,
    /// Longest a writer held the write lock for a roll, in microseconds.
    pub roll_stall_max_us: AtomicU64,
    /// Bytes of zeros the zero worker wrote and fsynced.
    pub zeroed_bytes: AtomicU64,
    targets: Mutex<Vec<Weak<ZeroTarget>>>,
    /// Some segment's lead fell below half the window (or the worker is to stop):
    /// the zero worker sleeps on this instead of polling.
    zero_due: Mutex<bool>,
    zero_wake: Condvar,
}

impl WritePath {
    /// Wakes the zero worker: a segment wants zeros, or the worker is to stop. Only
    /// the first call after the worker woke makes a system call.
    pub fn wake_zeroer(&self) {
        let mut due = lock(&self.zero_due);
        if !std::mem::replace(&mut *due, true) {
            self.zero_wake.notify_one();
        }
    }

    /// The zero worker's sleep: until [`WritePath::wake_zeroer`] or `timeout`.
    pub fn wait_zero_due(&self, timeout: Duration) {
        let due = lock(&self.zero_due);
        let (mut due, _) = self
            .zero_wake
            .wait_timeout_while(due, timeout, |due| !*due)
            .unwrap_or_else(PoisonError::into_inner);
        *due = false;
    }

    /// Registers an active segment with the zero worker (when zero-ahead is on).
    pub(super) fn register(&self, target: &Arc<ZeroTarget>) {
        if self.zero_ahead.load(Ordering::Relaxed) {
            let mut t = lock(&self.targets);
            t.retain(|w| w.strong_count() > 0);
            t.push(Arc::downgrade(target));
        }
    }

    /// The segments the zero worker may still zero (drops those gone or off).
    pub fn targets(&self) -> Vec<Arc<ZeroTarget>> {
        let mut t = lock(&self.targets);
        t.retain(|w| w.upgrade().is_some_and(|z| !z.is_off()));
        t.iter().filter_map(Weak::upgrade).collect()
    }
}

#[derive(Debug)]
struct ZeroState {
    /// End of the data the writer wrote or is writing.
    writer_end: u64,
    /// Zeros (or older data) reach this far; never below the file's length at open.
    /// Past the writer's end it includes the [`zero_gap`] before the first piece,
    /// which reads as zeros without having been written.
    zeroed_end: u64,
    /// Zeroing never writes below this (a reused file's old end).
    floor: u64,
    /// A piece being written: its start.
    in_flight: Option<u64>,
    /// Filling up to a full window (started when the lead fell below half).
    filling: bool,
    /// The worker has zeroed something.
    started: bool,
    off: bool,
    /// The file is not yet under its segment name (a spare the roll's commit has
    /// yet to rename): the worker, which opens it by that name, waits.
    unnamed: bool,
}

/// The zero state of one active segment.
#[derive(Debug)]
pub struct ZeroTarget {
    pub path: PathBuf,
    state: Mutex<ZeroState>,
    idle: Condvar,
    /// The worker's own handle (its own open file description: a failed fsync on it
    /// does not hide the error from the writer's handle, and vice versa).
    handle: OnceLock<Box<dyn StorageFile>>,
    /// A zero fsync failed: the writer fails the partition at its next append.
    failed: OnceLock<Arc<io::Error>>,
    /// Blocks may be reserved (`fallocate`, size kept) up to here: set by every
    /// reservation tried, since one that failed (no space) may still have reserved
    /// part of its range, which the roll's cut must free.
    pub(super) allocated_end: AtomicU64,
    /// Blocks are known reserved up to here (the reservations that succeeded): what
    /// `topics describe` reports as preallocated.
    pub(super) reserved_end: AtomicU64,
    /// Neither reservations nor zeros go past this: the segment rolls before its data
    /// reaches it (its topic's `segment_bytes`, set by every append), and a roll cuts
    /// whatever lies past the data, so space past it would be allocated and zeroed
    /// only to be freed again by the roll's truncation.
    end_cap: AtomicU64,
    /// The journal need of the segment's partition: the worker's fsync writes out
    /// the writer's records too, so it runs the journal barrier first.
    journal: Arc<JournalNeed>,
}

/// A piece the worker may zero now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub start: u64,
    pub len: u64,
}

impl ZeroTarget {
    /// The zero state of a segment whose data ends at `data_end` in a file of
    /// `file_len` bytes (the bytes past the data are zeros or, below `floor`, may be
    /// an older generation's records).
    /// Caps reservations and zeros at `end` (the segment's roll size, or the end of a
    /// write past it).
    pub(super) fn cap_at(&self, end: u64) {
        self.end_cap.store(end, Ordering::Release);
    }

    pub(super) fn end_cap(&self) -> u64 {
        self.end_cap.load(Ordering::Acquire)
    }

    /// The file is not yet under its segment name: no zeros until
    /// [`ZeroTarget::named`].
    pub(super) fn wait_for_name(&self) {
        self.state().unnamed = true;
    }

    /// The file is under its segment name now: the worker may open it.
    pub(super) fn named(&self) {
        self.state().unnamed = false;
    }

    /// A reused file's old end: older bytes may lie below it past the data.
    pub(super) fn floor(&self) -> u64 {
        lock(&self.state).floor
    }

    pub(super) fn new(
        path: PathBuf,
        data_end: u64,
        file_len: u64,
        floor: u64,
        journal: Arc<JournalNeed>,
    ) -> Self {
        ZeroTarget {
            path,
            state: Mutex::new(ZeroState {
                writer_end: data_end,
                zeroed_end: file_len.max(data_end),
                floor,
                in_flight: None,
                filling: false,
                started: false,
                off: false,
                unnamed: false,
            }),
            idle: Condvar::new(),
            handle: OnceLock::new(),
            failed: OnceLock::new(),
            allocated_end: AtomicU64::new(0),
            reserved_end: AtomicU64::new(0),
            end_cap: AtomicU64::new(u64::MAX),
            journal,
        }
    }

    /// The journal need of the segment's partition, for
    /// [`super::LogStats::journal_barrier`] before the worker's fsync.
    pub fn journal_need(&self) -> &JournalNeed {
        &self.journal
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ZeroState> {
        lock(&self.state)
    }

    pub fn is_off(&self) -> bool {
        self.state().off
    }

    /// How far zeros reach (the file's length as far as the zeros made it, or the
    /// start of a piece being written past a gap).
    pub fn zeroed_end(&self) -> u64 {
        self.state().zeroed_end
    }

    /// The writer is about to write up to `end`. Waits for a piece in flight that the
    /// write would reach into (and turns zeroing off), or turns it off when the
    /// writer overtakes the zeros.
    ///
    /// Returns true when the worker should be woken: zeroing is on, the segment holds
    /// [`ZERO_START_BYTES`], no fill is under way and the lead is below half of
    /// `window`.
    pub(super) fn before_write(&self, end: u64, window: u64) -> bool {
        let mut s = self.state();
        if let Some(start) = s.in_flight {
            if end > start {
                s.off = true;
                while s.in_flight.is_some() {
                    s = self.idle.wait(s).unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
        if s.started && end > s.zeroed_end {
            s.off = true;
        }
        s.writer_end = s.writer_end.max(end);
        let lead = s.zeroed_end.saturating_sub(s.writer_end);
        let capped = s.zeroed_end >= self.end_cap();
        !s.off && !s.filling && !capped && s.writer_end >= ZERO_START_BYTES && lead < window / 2
    }

    /// The segment is being sealed: no more zeros, and none in flight once this
    /// returns. Returns how far the zeros reach.
    pub(super) fn seal(&self) -> u64 {
        let mut s = self.state();
        s.off = true;
        while s.in_flight.is_some() {
            s = self.idle.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.zeroed_end
    }

    /// Why zeroing failed the segment's durability, if it did.
    pub(super) fn failure(&self) -> Option<Arc<io::Error>> {
        self.failed.get().cloned()
    }

    /// The worker's next piece for a window of `window` bytes, if any is due: zeroing
    /// starts once the segment holds [`ZERO_START_BYTES`]; when the lead (zeros ahead
    /// of the writer) falls below half the window it fills up to a full window.
    pub fn claim(&self, window: u64) -> Option<Claim> {
        let mut s = self.state();
        if s.off
            || s.unnamed
            || s.in_flight.is_some()
            || s.writer_end < ZERO_START_BYTES
            || window == 0
        {
            return None;
        }
        let lead = s.zeroed_end.saturating_sub(s.writer_end);
        if !s.filling && lead < window / 2 {
            s.filling = true;
        }
        let target = s.writer_end.saturating_add(window).min(self.end_cap());
        let start = if planted!(ZEROS_OVER_LIVE_DATA) {
            // The first piece page-aligned below the writer: zeros on live data.
            if s.zeroed_end > s.writer_end {
                s.zeroed_end
            } else {
                s.writer_end & !4095
            }
        } else {
            // Never right at the writer's end: with no lead, a piece starting there
            // would be in the way of the next append, which would then turn zeroing
            // off for good. The gap reads as zeros all the same (a hole, or a
            // preallocated unwritten extent); it is only not pre-written.
            s.zeroed_end
                .max(s.writer_end.saturating_add(zero_gap(window)))
                .max(s.floor)
        };
        if !s.filling || start >= target {
            s.filling = false;
            return None;
        }
        let len = (target - start).min(ZERO_PIECE_BYTES);
        // The writer is overtaking only once it passes the zeros, not the gap.
        s.zeroed_end = s.zeroed_end.max(start);
        s.in_flight = Some(start);
        s.started = true;
        Some(Claim { start, len })
    }

    /// Ends a claim: `ok` when its zeros were written.
    pub fn finish(&self, claim: Claim, ok: bool) {
        let mut s = self.state();
        debug_assert_eq!(s.in_flight, Some(claim.start));
        s.in_flight = None;
        if ok {
            s.zeroed_end = s.zeroed_end.max(claim.start + claim.len);
        } else {
            s.off = true;
        }
        self.idle.notify_all();
    }

    /// The worker's handle, opened once with `open`.
    pub fn handle(
        &self,
        open: impl FnOnce() -> io::Result<Box<dyn StorageFile>>,
    ) -> io::Result<&dyn StorageFile> {
        if let Some(h) = self.handle.get() {
            return Ok(&**h);
        }
        let h = open()?;
        Ok(&**self.handle.get_or_init(|| h))
    }

    /// A zero fsync failed: zeroing stops and the writer fails the partition.
    pub fn fail(&self, e: io::Error) {
        let _ = self.failed.set(Arc::new(e));
        self.state().off = true;
    }

    /// Turns zeroing off (a failed write: the zeros are not needed for correctness).
    pub fn turn_off(&self) {
        self.state().off = true;
    }
}

/// Reserves blocks up to `end + window` (at most up to the target's cap) when fewer
/// than half a window are reserved ahead of `end` and the cap is not reached (no-op
/// for a window of 0). A failed reservation is only logged:
/// preallocation makes fsyncs cheaper, never data safer.
pub(super) fn preallocate(file: &dyn StorageFile, zero: &ZeroTarget, end: u64, window: u64) {
    if window == 0 {
        return;
    }
    let want = end.saturating_add(window).min(zero.end_cap());
    let reserved = zero.allocated_end.load(Ordering::Acquire);
    if want <= end || reserved >= want.min(end.saturating_add(window / 2)) {
        return;
    }
    match file.allocate(want) {
        Ok(()) => {
            zero.allocated_end.fetch_max(want, Ordering::AcqRel);
            zero.reserved_end.fetch_max(want, Ordering::AcqRel);
        }
        Err(e) => {
            // Not again for this window (and cut at the roll all the same).
            zero.allocated_end.fetch_max(want, Ordering::AcqRel);
            tracing::warn!(path = %zero.path.display(), error = %e, "preallocation failed");
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    const W: u64 = 8 * 1024 * 1024;

    #[test]
    fn nothing_before_the_start_threshold_then_fills_a_window() {
        let t = ZeroTarget::new(PathBuf::from("x"), 32, 32, 0, Arc::default());
        assert_eq!(t.claim(W), None);
        t.before_write(ZERO_START_BYTES, W);
        let mut end = ZERO_START_BYTES + zero_gap(W);
        let mut pieces = 0;
        while let Some(c) = t.claim(W) {
            assert_eq!(c.start, end);
            end += c.len;
            t.finish(c, true);
            pieces += 1;
        }
        assert_eq!(end, ZERO_START_BYTES + W);
        assert_eq!(pieces, (W - zero_gap(W)) / ZERO_PIECE_BYTES);
        // Lead still above half a window: nothing due.
        t.before_write(ZERO_START_BYTES + W / 2 - 1, W);
        assert_eq!(t.claim(W), None);
        t.before_write(ZERO_START_BYTES + W / 2 + 1, W);
        let c = t.claim(W).unwrap();
        assert_eq!(c.start, ZERO_START_BYTES + W);
        t.finish(c, true);
    }

    /// A segment rolls before its data passes its `segment_bytes`, and the roll cuts
    /// what lies past the data: nothing is zeroed or reserved past that.
    #[test]
    fn nothing_is_zeroed_or_reserved_past_the_segments_roll_size() {
        const CAP: u64 = 1024 * 1024;
        let t = ZeroTarget::new(PathBuf::from("x"), 32, 32, 0, Arc::default());
        t.cap_at(CAP);
        assert!(t.before_write(ZERO_START_BYTES, W), "zeros are due");
        let mut end = 0;
        while let Some(c) = t.claim(W) {
            end = c.start + c.len;
            t.finish(c, true);
        }
        assert_eq!(end, CAP, "a window would reach {}", ZERO_START_BYTES + W);
        // Zeros reach the cap: a writer no longer wakes the worker.
        assert!(!t.before_write(CAP / 2 + 1, W));
        assert_eq!(t.claim(W), None);
        let dir = tempfile::tempdir().unwrap();
        let file = crate::engine::storage::io::Storage::create(
            &crate::engine::storage::io::RealStorage,
            &dir.path().join("x"),
        )
        .unwrap();
        preallocate(&*file, &t, 32, W);
        assert_eq!(t.allocated_end.load(Ordering::Acquire), CAP);
        assert_eq!(t.reserved_end.load(Ordering::Acquire), CAP);
        // Past the cap (one batch larger than the segment): nothing more.
        t.cap_at(CAP + 10);
        preallocate(&*file, &t, CAP + 10, W);
        assert_eq!(t.allocated_end.load(Ordering::Acquire), CAP);
    }

    /// A reservation that fails (no space) is not tried again for its window, and is
    /// still cut at the roll, but is not reported as reserved.
    #[test]
    fn a_failed_reservation_is_not_reported_as_reserved() {
        use crate::testkit::storage::{Call, HookStorage};
        let storage = HookStorage::from_fn(
            Arc::new(crate::engine::storage::io::RealStorage),
            |op| match op.call {
                Call::Allocate(_) => Some(Err(io::Error::other("injected: no space left"))),
                _ => None,
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let file =
            crate::engine::storage::io::Storage::create(&storage, &dir.path().join("x")).unwrap();
        let t = ZeroTarget::new(PathBuf::from("x"), 32, 32, 0, Arc::default());
        preallocate(&*file, &t, 32, W);
        assert_eq!(t.allocated_end.load(Ordering::Acquire), 32 + W);
        assert_eq!(t.reserved_end.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_writer_asks_for_the_worker_only_when_zeros_are_due() {
        let t = ZeroTarget::new(PathBuf::from("x"), 32, 32, 0, Arc::default());
        assert!(
            !t.before_write(ZERO_START_BYTES - 1, W),
            "below the start threshold"
        );
        assert!(t.before_write(ZERO_START_BYTES, W), "no lead at all");
        let c = t.claim(W).unwrap();
        assert!(!t.before_write(ZERO_START_BYTES, W), "a fill is under way");
        t.finish(c, true);
        assert!(!t.before_write(ZERO_START_BYTES, W), "the fill goes on");
        assert!(!t.before_write(ZERO_START_BYTES, 0), "no window, no zeros");
        t.turn_off();
        assert!(!t.before_write(ZERO_START_BYTES + 1, W), "zeroing is off");
    }

    #[test]
    fn a_claim_never_starts_below_the_writer_or_the_floor() {
        let t = ZeroTarget::new(PathBuf::from("x"), 32, 32, 1 << 20, Arc::default());
        t.before_write(ZERO_START_BYTES, W);
        let c = t.claim(W).unwrap();
        assert_eq!(c.start, 1 << 20);
        t.finish(c, true);
    }

    #[test]
    fn the_first_piece_starts_a_gap_ahead_so_the_next_append_is_not_in_its_way() {
        for window in [W, 64 * 1024] {
            let t = ZeroTarget::new(PathBuf::from("x"), 32, 32, 0, Arc::default());
            t.before_write(ZERO_START_BYTES, window);
            let c = t.claim(window).unwrap();
            assert_eq!(c.start, ZERO_START_BYTES + zero_gap(window));
            assert!(zero_gap(window) > 0 && c.start + c.len <= ZERO_START_BYTES + window);
            // The writer appends while the piece is in flight, short of the gap.
            assert!(!t.before_write(ZERO_START_BYTES + zero_gap(window) / 2, window));
            t.finish(c, true);
            assert!(!t.is_off(), "window {window}: zeroing stays on");
        }
    }

    #[test]
    fn a_writer_reaching_into_a_claim_waits_and_turns_zeroing_off() {
        let t = Arc::new(ZeroTarget::new(
            PathBuf::from("x"),
            32,
            32,
            0,
            Arc::default(),
        ));
        t.before_write(ZERO_START_BYTES, W);
        let c = t.claim(W).unwrap();
        let t2 = t.clone();
        let writer = std::thread::spawn(move || t2.before_write(c.start + 1, W));
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !writer.is_finished(),
            "the writer waits for the piece in flight"
        );
        t.finish(c, true);
        writer.join().unwrap();
        assert!(t.is_off());
        assert_eq!(t.claim(W), None);
    }

    #[test]
    fn overtaking_the_zeros_turns_zeroing_off() {
        let t = ZeroTarget::new(PathBuf::from("x"), 32, 32, 0, Arc::default());
        t.before_write(ZERO_START_BYTES, W);
        let c = t.claim(W).unwrap();
        t.finish(c, true);
        t.before_write(c.start + c.len + 1, W);
        assert!(t.is_off());
        assert_eq!(t.seal(), c.start + c.len);
    }

    #[test]
    fn quantiles_of_the_histogram() {
        let h = LatencyHistogram::default();
        for _ in 0..98 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_millis(5));
        h.record(Duration::from_millis(5));
        let c = h.counts();
        // 100 µs lies in 96..=103, 5000 µs in 4608..=5119.
        assert_eq!(quantile_us(&c, 0.5), 103);
        assert_eq!(quantile_us(&c, 0.99), 5119);
        assert_eq!(quantile_us(&vec![0; FSYNC_BUCKETS], 0.5), 0);
        assert_eq!(count_below_pow2_us(&vec![0; FSYNC_BUCKETS], 10), 0);
    }

    #[test]
    fn power_of_two_counts_are_exact() {
        let h = LatencyHistogram::default();
        for us in [7, 8, 1023, 1024, 1025, 4095, 4096] {
            h.record(Duration::from_micros(us));
        }
        let c = h.counts();
        assert_eq!(count_below_pow2_us(&c, 3), 1);
        assert_eq!(count_below_pow2_us(&c, 10), 3);
        assert_eq!(count_below_pow2_us(&c, 12), 6);
        assert_eq!(count_below_pow2_us(&c, 64), 7);
        assert_eq!(h.sum_us(), 7 + 8 + 1023 + 1024 + 1025 + 4095 + 4096);

        let p = Pow2Histogram::default();
        for v in [0, 1, 2, 3, 4, 5, 100, u64::MAX] {
            p.record(v);
        }
        assert_eq!(p.count_at_most_pow2(0), 2);
        assert_eq!(p.count_at_most_pow2(1), 3);
        assert_eq!(p.count_at_most_pow2(2), 5);
        assert_eq!(p.count_at_most_pow2(7), 7);
        assert_eq!(p.count(), 8);
    }

    #[test]
    fn every_latency_lies_in_its_bucket() {
        for us in (0..5000).chain([u64::MAX / 3, u64::MAX]) {
            let i = bucket_of(us);
            assert!(i < FSYNC_BUCKETS, "{us}");
            assert!(us <= bucket_upper_us(i), "{us}");
            if i > 0 {
                assert!(us > bucket_upper_us(i - 1), "{us}");
            }
        }
    }
}
