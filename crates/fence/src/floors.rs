//! Where a resource learns each lock's floor when it cannot trust its own memory (P6, P8).
//!
//! A resource's fences may have gone back in time with its whole volume (a snapshot put back,
//! a database restored or failed over to a replica that lagged): an owner those fences once
//! refused would be accepted again. The coordinator knows better: every owner below a lock's
//! floor is superseded or its lease has ended. A resource asks when its own memory starts anew
//! (a process start, a database incarnation) and refuses every epoch below the answer.

use std::future::Future;
use std::pin::Pin;

use std::sync::{Arc, Weak};

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

/// Most floor requests one resource process has in flight at once (across locks).
pub const MAX_FLOOR_REQUESTS: usize = 8;

/// Bounds the herd of floor requests after a database restart, when every lock's next write
/// needs its floor at once: one learner per lock at a time (the others wait for it and then
/// find the floor known), and at most [`MAX_FLOOR_REQUESTS`] requests to the coordinator in
/// flight across locks.
#[derive(Debug)]
pub struct FloorFlights {
    /// Each lock's turn, held by its learner and waiters only: an entry nobody holds (a waiter
    /// cancelled while it waited) is dead and pruned.
    locks: std::sync::Mutex<std::collections::HashMap<LockName, Weak<tokio::sync::Mutex<()>>>>,
    permits: tokio::sync::Semaphore,
}

/// Entries at which dead ones are pruned before another is added.
const PRUNE_AT: usize = 1_024;

impl Default for FloorFlights {
    fn default() -> Self {
        Self::new(MAX_FLOOR_REQUESTS)
    }
}

impl FloorFlights {
    /// At most `max` requests in flight (at least one).
    pub fn new(max: usize) -> Self {
        Self {
            locks: std::sync::Mutex::default(),
            permits: tokio::sync::Semaphore::new(max.max(1)),
        }
    }

    /// Waits for `lock`'s turn to learn its floor: held, no other writer of this process
    /// learns that lock's floor.
    pub async fn lock_turn(&self, lock: &LockName) -> LockTurn<'_> {
        let entry = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            match locks.get(lock).and_then(Weak::upgrade) {
                Some(entry) => entry,
                None => {
                    if locks.len() >= PRUNE_AT {
                        locks.retain(|_, turn| turn.strong_count() > 0);
                    }
                    let entry = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(lock.clone(), Arc::downgrade(&entry));
                    entry
                }
            }
        };
        LockTurn {
            flights: self,
            lock: lock.clone(),
            guard: Some(entry.lock_owned().await),
        }
    }

    /// Waits for one of the request permits.
    pub async fn permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.permits
            .acquire()
            .await
            .expect("the semaphore is never closed")
    }

    /// Locks with a learner or a waiter now.
    pub fn locks_in_flight(&self) -> usize {
        let locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks
            .values()
            .filter(|turn| turn.strong_count() > 0)
            .count()
    }
}

/// A lock's turn to learn its floor ([`FloorFlights::lock_turn`]); the lock is forgotten when
/// nobody else waits for it.
#[derive(Debug)]
pub struct LockTurn<'a> {
    flights: &'a FloorFlights,
    lock: LockName,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for LockTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self.flights.locks.lock().unwrap_or_else(|e| e.into_inner());
        if locks
            .get(&self.lock)
            .is_some_and(|turn| turn.strong_count() == 0)
        {
            locks.remove(&self.lock);
        }
    }
}

#[cfg(test)]
mod flight_tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn one_learner_per_lock_and_a_bounded_herd_across_locks() {
        let flights = Arc::new(FloorFlights::new(3));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let same = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..40 {
            let (flights, now, most, same) =
                (flights.clone(), now.clone(), most.clone(), same.clone());
            tasks.push(tokio::spawn(async move {
                let lock = LockName::new(format!("herd/{}", i % 10)).unwrap();
                let _turn = flights.lock_turn(&lock).await;
                if i % 10 == 0 {
                    // Every writer of herd/0 holds the turn alone.
                    assert_eq!(same.fetch_add(1, Ordering::SeqCst), 0);
                }
                let _permit = flights.permit().await;
                let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(in_flight, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                if i % 10 == 0 {
                    same.fetch_sub(1, Ordering::SeqCst);
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 3);
        assert_eq!(flights.locks_in_flight(), 0, "every lock forgotten");
        // A waiter cancelled while it waits leaves nothing held behind.
        let lock = LockName::new("herd/cancelled").unwrap();
        let held = flights.lock_turn(&lock).await;
        let waiter = {
            let flights = flights.clone();
            let lock = lock.clone();
            tokio::spawn(async move { drop(flights.lock_turn(&lock).await) })
        };
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        waiter.abort();
        let _ = waiter.await;
        drop(held);
        assert_eq!(flights.locks_in_flight(), 0);
        assert!(
            flights.locks.lock().unwrap().is_empty(),
            "no dead entry left"
        );
    }
}
