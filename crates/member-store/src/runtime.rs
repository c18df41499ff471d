//! openraft's async runtime for the coordinator: tokio, with election timers drawn from a
//! generator that a simulation can seed.
//!
//! openraft draws every election timeout from `AsyncRuntime::thread_rng()`. In a server that is
//! the operating system's entropy (as with openraft's own `TokioRuntime`). A deterministic
//! simulation runs every member on one thread and calls [`seed_election_timers`] first: the
//! timeouts then follow from the seed, so a failing seed replays the same elections.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// From now on, election timeouts (and lease-id secrets, from a generator of their own so
/// that the timeouts do not shift) drawn on this thread follow from `seed`.
pub fn seed_election_timers(seed: u64) {
    SEEDED.with(|rng| *rng.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
    palisade_coordinator::lease_secret::seed(seed);
}

/// Election timeouts on this thread come from the operating system's entropy again.
pub fn unseed_election_timers() {
    SEEDED.with(|rng| *rng.borrow_mut() = None);
    palisade_coordinator::lease_secret::unseed();
}

/// The generator openraft gets: this thread's seeded one, or the thread's entropy-seeded one.
#[derive(Debug, Default, Clone, Copy)]
pub struct ElectionRng;

impl ElectionRng {
    fn with<T>(f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
        SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
            Some(rng) => f(rng),
            None => f(&mut rand::thread_rng()),
        })
    }
}

impl RngCore for ElectionRng {
    fn next_u32(&mut self) -> u32 {
        Self::with(|rng| rng.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        Self::with(|rng| rng.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        Self::with(|rng| rng.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        Self::with(|rng| rng.try_fill_bytes(dest))
    }
}

/// tokio, as openraft's `TokioRuntime`, with [`ElectionRng`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runtime;

impl AsyncRuntime for Runtime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = ElectionRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ElectionRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn a_seeded_thread_draws_the_same_timeouts_again() {
        seed_election_timers(7);
        let first: Vec<u64> = (0..8)
            .map(|_| Runtime::thread_rng().gen_range(250..500))
            .collect();
        seed_election_timers(7);
        let again: Vec<u64> = (0..8)
            .map(|_| Runtime::thread_rng().gen_range(250..500))
            .collect();
        unseed_election_timers();
        assert_eq!(first, again);
        assert!(first.iter().all(|t| (250..500).contains(t)));
    }
}
