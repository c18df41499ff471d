//! A wall clock for tests and the cluster simulation ([`SteppableClock`]).

use std::sync::atomic::Ordering;

use palisade_core::clock::WallClock;
use tokio::time::Instant;

/// A wall clock that follows tokio's clock from a chosen starting time, and can be stepped:
/// under a paused runtime (tests, the cluster simulation) its time moves exactly as the
/// runtime's does, so every run is deterministic, and a test steps it back or forward to see
/// what the engine does with a clock that jumps ([`palisade_core::clock`]).
#[derive(Debug)]
pub struct SteppableClock {
    origin: Instant,
    origin_ms: u64,
    /// Milliseconds added to (or, negative, taken from) the clock's reading.
    step_ms: std::sync::atomic::AtomicI64,
}

impl SteppableClock {
    /// A clock that reads `origin_ms` now and moves on with tokio's clock.
    pub fn starting_at(origin_ms: u64) -> Self {
        Self {
            origin: Instant::now(),
            origin_ms,
            step_ms: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// Steps the clock by `ms` (negative: back), as an operator or NTP stepping it would.
    pub fn step(&self, ms: i64) {
        self.step_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl WallClock for SteppableClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.origin_ms
            .saturating_add(elapsed)
            .saturating_add_signed(self.step_ms.load(Ordering::SeqCst))
    }
}
