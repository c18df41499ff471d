//! The secret an engine draws its lease ids from: the operating system's entropy, or, on a
//! thread a deterministic simulation seeded, a generator that follows from the seed (so that a
//! seed replays the same lease ids).

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static SEEDED_SECRETS: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// From now on, lease-id secrets drawn on this thread follow from `seed` (a generator of their
/// own: the simulation's election timers, drawn from `seed` too, do not shift).
pub fn seed(seed: u64) {
    SEEDED_SECRETS.with(|rng| {
        *rng.borrow_mut() = Some(StdRng::seed_from_u64(seed ^ 0x5eed_1ea5_e1d5_0000));
    });
}

/// Lease-id secrets on this thread come from the operating system's entropy again.
pub fn unseed() {
    SEEDED_SECRETS.with(|rng| *rng.borrow_mut() = None);
}

/// A secret for an engine's lease ids.
pub fn lease_secret() -> [u8; 32] {
    let mut secret = [0; 32];
    SEEDED_SECRETS.with(|seeded| match seeded.borrow_mut().as_mut() {
        Some(rng) => rng.fill_bytes(&mut secret),
        None => rand::rngs::OsRng.fill_bytes(&mut secret),
    });
    secret
}
