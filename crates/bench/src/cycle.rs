//! What a benchmark client records: one acquire+release cycle, for Palisade and for the
//! services it is compared with.

use tokio::time::Instant;

/// Most cycles recorded per client (bounds the memory of a long run).
pub const MAX_SAMPLES_PER_CLIENT: usize = 2_000_000;
/// One acquire+release cycle as one client saw it.
#[derive(Clone, Copy)]
pub struct Cycle {
    pub lock: usize,
    /// Orders the holders of one lock (the epoch; for another service, the grant's time).
    pub epoch: u64,
    pub acquire_sent: Instant,
    pub granted: Instant,
    pub release_sent: Instant,
    pub released: Instant,
}
