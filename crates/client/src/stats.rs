//! Counters of what one client saw, for the application's own metrics: a renewal failure
//! seen here is invisible to the coordinator (it never arrived), and it is the first sign of
//! a lease about to be lost.

use std::sync::atomic::{AtomicU64, Ordering};

/// The live counters of a [`crate::Client`] (shared by its clones and its leases).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    acquires: AtomicU64,
    acquire_failures: AtomicU64,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    leases_lost: AtomicU64,
    failovers: AtomicU64,
}

/// What a client has seen since it was made. Export these as counters
/// (`palisade_client_renewal_failures_total`, … — see docs/metrics.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Acquires granted.
    pub acquires: u64,
    /// Acquires refused or failed (held, invalid, unavailable, …).
    pub acquire_failures: u64,
    /// Renewals confirmed (keepalive and explicit).
    pub renewals: u64,
    /// Renewals that failed (each retried by the keepalive until the lease's validity ends).
    pub renewal_failures: u64,
    /// Leases the keepalive gave up on: refused by the coordinator, or not renewed in time.
    pub leases_lost: u64,
    /// Times a call moved to another endpoint (the leader, or the next one).
    pub failovers: u64,
}

/// Which counter to bump.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Acquired,
    AcquireFailed,
    Renewed,
    RenewalFailed,
    LeaseLost,
    FailedOver,
}

impl Counters {
    pub(crate) fn count(&self, event: Event) {
        let counter = match event {
            Event::Acquired => &self.acquires,
            Event::AcquireFailed => &self.acquire_failures,
            Event::Renewed => &self.renewals,
            Event::RenewalFailed => &self.renewal_failures,
            Event::LeaseLost => &self.leases_lost,
            Event::FailedOver => &self.failovers,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ClientStats {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClientStats {
            acquires: read(&self.acquires),
            acquire_failures: read(&self.acquire_failures),
            renewals: read(&self.renewals),
            renewal_failures: read(&self.renewal_failures),
            leases_lost: read(&self.leases_lost),
            failovers: read(&self.failovers),
        }
    }
}
