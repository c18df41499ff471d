//! One clock for every process of a drill: CLOCK_MONOTONIC is system-wide on Linux, so times
//! recorded by workers and by the orchestrator order correctly in one history.

/// Nanoseconds of CLOCK_MONOTONIC.
pub fn now_ns() -> u64 {
    let time = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    time.tv_sec() as u64 * 1_000_000_000 + time.tv_nsec() as u64
}
