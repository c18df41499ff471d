//! Clock faults (`--clock-faults`): members' wall clocks that jump ahead and back, within and
//! beyond the maximum offset (`palisade_cluster::clock_check`), drift, and a majority's clocks
//! that jump ahead together — each drawn from the seed, held for a while, then corrected (as
//! NTP steps a clock back to the right time). A member whose clock a majority refuses must not
//! lead; a counter raised by a majority that ran ahead must not stop the cluster once the
//! clocks are right again; and no epoch may be issued twice (P1) whatever the clocks say.

use std::time::Duration;

use palisade_cluster::NodeId;
use serde::Serialize;

use super::Cluster;

/// The longest jump beyond the maximum offset: a day (a VM resumed with a stale clock,
/// `faketime +1d`).
const MAX_JUMP_MS: u64 = 86_400_000;
/// The longest jump of a majority together: an hour (a host's clock under several members).
const MAX_MAJORITY_JUMP_MS: u64 = 3_600_000;
/// Between two steps of a drifting clock.
const DRIFT_STEP: Duration = Duration::from_millis(100);
/// The fastest drift: this many ms per [`DRIFT_STEP`] (20 %: far beyond a real oscillator's
/// few parts per million, so that a run of seconds drifts by hundreds of ms).
const MAX_DRIFT_PER_STEP_MS: u64 = 20;

/// Clock faults injected in one run, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ClockFaults {
    /// One member's clock jumped ahead by less than the maximum offset.
    pub ahead_within: u64,
    /// One member's clock jumped ahead beyond the maximum offset (up to a day).
    pub ahead_beyond: u64,
    /// One member's clock jumped back by less than the maximum offset.
    pub back_within: u64,
    /// One member's clock jumped back beyond the maximum offset (up to an hour).
    pub back_beyond: u64,
    /// One member's clock drifted (up to 20 % fast or slow) for a while.
    pub drifts: u64,
    /// A majority's clocks jumped ahead together (up to an hour): their floor is committed,
    /// and the counter stays ahead of the clocks once they are corrected.
    pub majority_ahead: u64,
}

impl ClockFaults {
    /// Every clock fault of the run.
    pub fn total(&self) -> u64 {
        self.ahead_within
            + self.ahead_beyond
            + self.back_within
            + self.back_beyond
            + self.drifts
            + self.majority_ahead
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &ClockFaults) {
        self.ahead_within += other.ahead_within;
        self.ahead_beyond += other.ahead_beyond;
        self.back_within += other.back_within;
        self.back_beyond += other.back_beyond;
        self.drifts += other.drifts;
        self.majority_ahead += other.majority_ahead;
    }
}

impl Cluster {
    /// One clock fault drawn from the seed, held for `lasts` ms, then corrected.
    pub(super) async fn clock_fault(&mut self, lasts: u64) {
        let max_offset = self.config.max_clock_offset_ms;
        let victim = self
            .serving_leader()
            .filter(|_| self.shared.chance(50))
            .unwrap_or_else(|| self.shared.random_node());
        let (steps, what): (Vec<(NodeId, i64)>, &str) = match self.shared.range(0, 6) {
            0 => {
                self.faults.clock.ahead_within += 1;
                (vec![(victim, self.jump(1, max_offset))], "ahead within")
            }
            1 => {
                self.faults.clock.ahead_beyond += 1;
                (
                    vec![(victim, self.jump(max_offset + 1, MAX_JUMP_MS))],
                    "ahead beyond",
                )
            }
            2 => {
                self.faults.clock.back_within += 1;
                (vec![(victim, -self.jump(1, max_offset))], "back within")
            }
            3 => {
                self.faults.clock.back_beyond += 1;
                let back = -self.jump(max_offset + 1, MAX_MAJORITY_JUMP_MS);
                (vec![(victim, back)], "back beyond")
            }
            4 => {
                self.faults.clock.drifts += 1;
                return self.drift(victim, lasts).await;
            }
            _ => {
                self.faults.clock.majority_ahead += 1;
                let jump = self.jump(max_offset + 1, MAX_MAJORITY_JUMP_MS);
                let mut ids = self.ids();
                while ids.len() > self.members.len() / 2 + 1 {
                    let i = self.shared.range(0, ids.len() as u64) as usize;
                    ids.remove(i);
                }
                (
                    ids.into_iter().map(|id| (id, jump)).collect(),
                    "majority ahead",
                )
            }
        };
        self.shared.trace(&format!("clock {what} {steps:?}"));
        for (id, ms) in &steps {
            self.step_clock(*id, *ms);
        }
        tokio::time::sleep(Duration::from_millis(lasts)).await;
        for (id, ms) in &steps {
            self.step_clock(*id, -ms);
        }
        self.shared.trace("clocks corrected");
    }

    /// A jump of `low..=high` ms drawn from the seed.
    fn jump(&self, low: u64, high: u64) -> i64 {
        i64::try_from(self.shared.range(low, high + 1)).unwrap_or(i64::MAX)
    }

    /// `id`'s clock fast or slow by up to [`MAX_DRIFT_PER_STEP_MS`] per [`DRIFT_STEP`] for
    /// `lasts` ms, then corrected.
    async fn drift(&mut self, id: NodeId, lasts: u64) {
        let per_step = self.jump(1, MAX_DRIFT_PER_STEP_MS);
        let per_step = if self.shared.chance(50) {
            per_step
        } else {
            -per_step
        };
        self.shared
            .trace(&format!("clock drift {id} {per_step} ms per 100 ms"));
        let mut drifted = 0;
        let steps = lasts / DRIFT_STEP.as_millis() as u64;
        for _ in 0..steps {
            tokio::time::sleep(DRIFT_STEP).await;
            self.step_clock(id, per_step);
            drifted += per_step;
        }
        self.step_clock(id, -drifted);
        self.shared.trace("clocks corrected");
    }

    fn step_clock(&self, id: NodeId, ms: i64) {
        self.members[self.index(id)].clock.step(ms);
    }
}
