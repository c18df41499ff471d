//! Hybrid epochs: the wall clock as a witness that no rolled-back disk can carry back (P1, P6).
//!
//! A data directory put back from a snapshot — with every file beside it, as a VM, disk or
//! Kubernetes volume snapshot does — brings back an epoch counter from the past. Nothing on
//! that volume can say what was issued after the snapshot. The clock can: it keeps moving
//! while the volume is stopped, copied and put back.
//!
//! The rule has two halves, both applied by the coordinator's engine:
//!
//! 1. **The floor, at every start** (a single node's start, every cluster leader's start):
//!    the counter is raised to [`floor_at`]`(now)` = `now_ms × 2^`[`CLOCK_SHIFT`].
//! 2. **The ceiling, at every commit that issues epochs**: the batch is committed only once
//!    [`issuable`]`(counter, now)`, i.e. `counter < now_ms × 2^CLOCK_SHIFT`; until then the
//!    engine waits for the clock (bounded by [`MAX_CLOCK_WAIT_MS`], after which it refuses).
//!
//! So every epoch E ever acknowledged satisfies `E < w × 2^20`, where `w` is the wall clock
//! when its commit began; a start at a later wall time `w' ≥ w` sets the counter to
//! `w' × 2^20 ≥ w × 2^20 > E`. Whatever the disk says, the next epoch is above every epoch
//! acknowledged before — **provided the clock at a start is not behind the clock at any
//! earlier commit** (the assumption written in ARCHITECTURE.md). A clock stepped back while
//! the coordinator runs is noticed by the ceiling (the engine waits it out or refuses, never
//! issues above the clock); a clock stepped back *and* a volume rolled back together cannot
//! be noticed by anything on that machine, and is what the high-water file and the
//! boundaries' fences still guard against.
//!
//! Headroom, the one true number: epochs end at [`MAX_EPOCH`] = 2^63 − 1, the greatest value a
//! PostgreSQL resource can store as a fence (`bigint`), and the clock floor reaches it at
//! [`LAST_CLOCK_MS`] (2^43 ms after 1970, in the year 2248). A clock past that, or a counter at
//! the end, is a typed error ([`HeadroomError`], `LeaseError::EpochsExhausted`), never a panic
//! or a wrap. One millisecond holds 2^20 epochs, so the ceiling makes a coordinator wait only
//! above a billion grants a second. Restarts cost nothing: each restart's floor is the clock's.

/// The floor is the wall clock in milliseconds shifted left by this much (one millisecond
/// spans 2^20 epochs).
pub const CLOCK_SHIFT: u32 = 20;

/// How far, at most, the engine waits for a clock that is behind its epoch counter before it
/// refuses to issue. A leader whose clock runs behind the previous leader's waits the skew
/// out once; a clock stepped back further than this is an operator's problem to fix (NTP),
/// never a reason to issue an epoch below one already acknowledged.
pub const MAX_CLOCK_WAIT_MS: u64 = 5_000;

/// The greatest epoch ever issued: a PostgreSQL resource stores fences as `bigint`, whose
/// greatest value this is; an epoch above it could not be fenced there.
pub const MAX_EPOCH: u64 = i64::MAX as u64;

/// The last wall-clock millisecond whose floor ([`floor_at`]) is at most [`MAX_EPOCH`]: 2^43 − 1
/// ms after 1970, in the year 2248.
pub const LAST_CLOCK_MS: u64 = MAX_EPOCH >> CLOCK_SHIFT;

/// The clock or the counter has reached the end of the epochs' headroom.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadroomError {
    /// The wall clock reads past [`LAST_CLOCK_MS`]: its floor would be above [`MAX_EPOCH`].
    #[error(
        "the wall clock reads {now} ({now_ms} ms since 1970), past the last time whose clock \
         floor is an epoch a resource can store ({last}, 2^63 epochs): a clock this far ahead \
         is wrong; set it right"
    , now = display_ms(*.now_ms), last = display_ms(LAST_CLOCK_MS))]
    ClockPastLastMs {
        /// The clock's reading.
        now_ms: u64,
    },
}

/// The clock floor at `now_ms`, or why there is none: a clock past [`LAST_CLOCK_MS`].
pub fn checked_floor_at(now_ms: u64) -> Result<u64, HeadroomError> {
    if now_ms > LAST_CLOCK_MS {
        return Err(HeadroomError::ClockPastLastMs { now_ms });
    }
    Ok(floor_at(now_ms))
}

/// `ms` since 1970 as an RFC 3339 time (UTC, milliseconds), for messages; a reading beyond the
/// year 9999 as plain milliseconds.
pub fn display_ms(ms: u64) -> String {
    /// 9999-12-31T23:59:59.999Z: the last time RFC 3339 writes.
    const LAST_RFC3339_MS: u64 = 253_402_300_799_999;
    if ms > LAST_RFC3339_MS {
        return format!("{ms} ms since 1970");
    }
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}

/// A source of wall-clock time in milliseconds since 1970. The coordinator reads the system
/// clock; tests and simulations pass a clock they control (and step back).
pub trait WallClock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// Milliseconds since the Unix epoch on the operating system's clock (0 before 1970, `u64::MAX`
/// past its range): the one place Palisade reads the wall clock outside a [`WallClock`].
pub fn now_ms() -> u64 {
    SystemClock.now_ms()
}

/// The operating system's real-time clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            })
    }
}

/// The counter's floor at wall time `now_ms`: no epoch acknowledged at an earlier (or equal)
/// wall time is at or above it.
pub fn floor_at(now_ms: u64) -> u64 {
    now_ms.saturating_mul(1 << CLOCK_SHIFT)
}

/// True when epochs up to `counter` may be committed at wall time `now_ms`: every one of them
/// is below the floor of any start at `now_ms` or later. A counter of 0 holds no epoch (none
/// is ever 0), so there is nothing to wait for.
pub fn issuable(counter: u64, now_ms: u64) -> bool {
    counter == 0 || counter < floor_at(now_ms)
}

/// How long the clock must move on before epochs up to `counter` are [`issuable`] (0 when
/// they already are).
pub fn wait_ms(counter: u64, now_ms: u64) -> u64 {
    if issuable(counter, now_ms) {
        0
    } else {
        // The counter's millisecond is at most 2^44 − 1; a clock past it with the counter
        // still not issuable (a counter of `u64::MAX`) waits at least a millisecond, never
        // a wrapped figure.
        ((counter >> CLOCK_SHIFT) + 1).saturating_sub(now_ms).max(1)
    }
}

/// The wall time (ms) at which epoch `epoch`'s counter was at most: an epoch's high bits are
/// a lower bound of when some start or commit happened, useful only for display.
pub fn epoch_time_ms(epoch: u64) -> u64 {
    epoch >> CLOCK_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000; // 2027

    #[test]
    fn p6_a_start_at_the_same_or_a_later_time_is_above_every_issuable_epoch() {
        // The greatest epoch the ceiling lets a commit at NOW acknowledge:
        let greatest = floor_at(NOW) - 1;
        assert!(issuable(greatest, NOW));
        assert!(!issuable(greatest + 1, NOW));
        // Any start at NOW or later floors the counter above it.
        assert!(floor_at(NOW) > greatest);
        assert!(floor_at(NOW + 1) > greatest);
    }

    #[test]
    fn p6_right_after_a_start_the_first_grant_waits_at_most_a_millisecond() {
        let counter = floor_at(NOW) + 1;
        assert!(!issuable(counter, NOW));
        assert_eq!(wait_ms(counter, NOW), 1);
        assert!(issuable(counter, NOW + 1));
        assert_eq!(wait_ms(counter, NOW + 1), 0);
    }

    #[test]
    fn p6_a_clock_stepped_back_makes_the_wait_as_long_as_the_step() {
        let counter = floor_at(NOW) + 10;
        assert_eq!(wait_ms(counter, NOW - 3_000), 3_001);
        assert!(wait_ms(counter, NOW - 60_000) > MAX_CLOCK_WAIT_MS);
    }

    #[test]
    fn the_headroom_ends_at_2_63_in_the_year_2248() {
        let year_ms: u64 = 365 * 24 * 3_600 * 1_000 + 6 * 3_600 * 1_000;
        assert_eq!(1970 + LAST_CLOCK_MS / year_ms, 2248);
        assert!(display_ms(LAST_CLOCK_MS).starts_with("2248-"));
        assert!(floor_at(LAST_CLOCK_MS) <= MAX_EPOCH);
        assert!(floor_at(LAST_CLOCK_MS + 1) > MAX_EPOCH);
        assert_eq!(checked_floor_at(LAST_CLOCK_MS), Ok(floor_at(LAST_CLOCK_MS)));
        assert!(SystemClock.now_ms() > NOW - 365 * 24 * 3_600 * 1_000);
    }

    #[test]
    fn p1_a_clock_past_the_headroom_is_a_typed_error_never_a_wrap() {
        for now_ms in [LAST_CLOCK_MS + 1, 1 << 44, (1 << 44) + 5, u64::MAX] {
            let refused = checked_floor_at(now_ms).unwrap_err();
            assert_eq!(refused, HeadroomError::ClockPastLastMs { now_ms });
            assert!(refused.to_string().contains("2248-"), "{refused}");
        }
        // The ceiling's arithmetic holds at every edge: no underflow, no overflow.
        for counter in [MAX_EPOCH, MAX_EPOCH + 1, u64::MAX - 1, u64::MAX] {
            for now_ms in [0, LAST_CLOCK_MS, 1 << 44, (1 << 44) + 1, u64::MAX] {
                let wait = wait_ms(counter, now_ms);
                assert_eq!(
                    wait == 0,
                    issuable(counter, now_ms),
                    "{counter} at {now_ms}"
                );
            }
        }
        assert_eq!(wait_ms(u64::MAX, u64::MAX), 1);
        assert!(display_ms(u64::MAX).ends_with("ms since 1970"));
    }
}
