//! The one seeded generator of the tests: the crash simulator's xorshift64*
//! ([`seglog::testkit::sim::Rng`]), and the seed every randomized test starts from.

pub use seglog::testkit::sim::Rng;

/// `SEGLOG_SEED` if set (and a number), else `default`. A test that draws from it
/// names the seed in its failure message so that the run can be repeated.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("SEGLOG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Draws the tests need beyond [`Rng::below`].
pub trait RngExt {
    /// True with probability `percent`/100.
    fn chance(&mut self, percent: u64) -> bool;
}

impl RngExt for Rng {
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Runs `f`; if it panics, panics again naming `seed` and how to rerun it.
pub fn with_seed(seed: u64, f: impl FnOnce() + std::panic::UnwindSafe) {
    if std::panic::catch_unwind(f).is_err() {
        panic!("failed for seed {seed} (rerun with SEGLOG_SEED={seed})");
    }
}
