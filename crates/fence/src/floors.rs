//! Where a resource learns each lock's floor when it cannot trust its own memory (P6, P8).
//!
//! A resource's fences may have gone back in time with its whole volume (a snapshot put back,
//! a database restored or failed over to a replica that lagged): an owner those fences once
//! refused would be accepted again. The coordinator knows better: every owner below a lock's
//! floor is superseded or its lease has ended. A resource asks when its own memory starts anew
//! (a process start, a database incarnation) and refuses every epoch below the answer.

use std::future::Future;
use std::pin::Pin;

use palisade_core::{Epoch, LockName};

/// A lock's floor and the coordinator's signed statement of it (none: the source has none),
/// or why it cannot be learned now.
pub type FloorStatementFuture<'a> =
    Pin<Box<dyn Future<Output = Result<(Epoch, Option<String>), String>> + Send + 'a>>;

/// A source of lock floors: in production the coordinator's signed floor statement
/// (`GET /v1/locks/{lock}/floor`, verified with the trusted keys: `palisade_resource`'s
/// `KeyRing`).
pub trait FloorSource: Send + Sync {
    /// The lock's floor, verified; `Err` (why) when it cannot be learned now: the caller
    /// refuses the write rather than guess.
    fn floor<'a>(
        &'a self,
        lock: &'a LockName,
    ) -> Pin<Box<dyn Future<Output = Result<Epoch, String>> + Send + 'a>>;

    /// The lock's floor, verified, with the coordinator's signed statement of it when the
    /// source has one (a database records it beside the floor, for the audit to verify again:
    /// migration 10). By default [`Self::floor`] with no statement.
    fn floor_statement<'a>(&'a self, lock: &'a LockName) -> FloorStatementFuture<'a> {
        Box::pin(async move { self.floor(lock).await.map(|floor| (floor, None)) })
    }
}

/// Floors set by hand (0 for a lock never set): for a resource whose tokens come from a signer
/// in the same process — tests and benchmarks, where that signer is the coordinator and knows
/// what it superseded. Counts the floors asked.
#[derive(Debug, Default)]
pub struct StaticFloors {
    floors: std::sync::Mutex<std::collections::HashMap<LockName, Epoch>>,
    asked: std::sync::atomic::AtomicU64,
}

impl StaticFloors {
    /// Every lock's floor is 0 until [`StaticFloors::set`].
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on, `lock`'s floor is `floor`.
    pub fn set(&self, lock: &LockName, floor: Epoch) {
        self.floors
            .lock()
            .expect("not poisoned")
            .insert(lock.clone(), floor);
    }

    /// How many floors were asked.
    pub fn asked(&self) -> u64 {
        self.asked.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl FloorSource for StaticFloors {
    fn floor<'a>(
        &'a self,
        lock: &'a LockName,
    ) -> Pin<Box<dyn Future<Output = Result<Epoch, String>> + Send + 'a>> {
        self.asked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let floor = self
            .floors
            .lock()
            .expect("not poisoned")
            .get(lock)
            .copied()
            .unwrap_or(Epoch(0));
        Box::pin(std::future::ready(Ok(floor)))
    }
}
