//! The restore rule (P6), as a pure function: where a restored coordinator's epoch counter
//! starts, given the greatest epoch known to be issued (the backup, the high-water bound, the
//! resources' fences) and the clock. `palisade restore` and the simulation both use it.
//!
//! The counter starts [`RESTORE_MARGIN`] above the known floor, or at the clock floor (the wall
//! clock in milliseconds × 2^[`CLOCK_SHIFT`]) when that is higher: a coordinator would have to
//! issue over a million epochs per millisecond between two restores from the same backup to
//! reach the clock floor, so restoring twice is as safe as once even when every other input is
//! lost. Every token issued after the restore orders above every token issued before it.

/// What a restore adds above the greatest known floor.
pub const RESTORE_MARGIN: u64 = 1 << 32;
/// The clock floor is the wall clock in milliseconds shifted left by this much.
pub use crate::clock::CLOCK_SHIFT;

/// Which input decided the restored counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The known floor plus [`RESTORE_MARGIN`].
    Floor,
    /// The clock floor.
    Clock,
}

/// The counter a restore starts from (the next epoch is above it), for the greatest epoch
/// known to be issued `known_floor` at wall-clock time `now_ms`; `None` when the floor leaves
/// no room in a u64.
pub fn restored_counter(known_floor: u64, now_ms: u64) -> Option<(u64, DecidedBy)> {
    let margin = known_floor.checked_add(RESTORE_MARGIN)?;
    let clock = now_ms.saturating_mul(1 << CLOCK_SHIFT);
    Some(if clock > margin {
        (clock, DecidedBy::Clock)
    } else {
        (margin, DecidedBy::Floor)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p6_the_counter_starts_above_the_floor_and_the_clock() {
        assert_eq!(
            restored_counter(10, 1),
            Some((10 + RESTORE_MARGIN, DecidedBy::Floor))
        );
        let now = 1_800_000_000_000; // 2027
        let (counter, by) = restored_counter(10, now).unwrap();
        assert_eq!((counter, by), (now << CLOCK_SHIFT, DecidedBy::Clock));
        // Twice from the same backup, a millisecond later: above the first.
        assert!(restored_counter(10, now + 1).unwrap().0 > counter);
        assert_eq!(restored_counter(u64::MAX - 1, 0), None);
    }
}
