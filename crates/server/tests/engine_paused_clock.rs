//! The engine on tokio's paused clock: TTLs, waits, hand-offs and restarts, deterministic and
//! instant. The store is the in-memory one (real I/O on blocking threads and a paused clock do
//! not mix); the redb store has its own tests, and the HTTP and crash tests use it for real.

use std::sync::Arc;
use std::time::Duration;

use palisade_core::{AcquireRequest, Epoch, HolderId, LeaseError, LockClass, LockName};
use palisade_server::engine::{self, CoordinatorError, CoordinatorHandle};
use palisade_server::metrics::Metrics;
use palisade_server::store::{LeaseStore, MemoryLeaseStore};
use tokio::sync::watch;
use tokio::time::sleep;

fn request(lock: &str, holder: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        lock: LockName::new(lock).unwrap(),
        holder: HolderId::new(holder).unwrap(),
        principal: palisade_core::Principal::anonymous(),
        ttl_ms,
        wait_ms,
        class: LockClass::Critical,
        request_id: None,
    }
}

struct Running {
    handle: CoordinatorHandle,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), palisade_server::store::StoreError>>,
}

fn start(store: &MemoryLeaseStore) -> Running {
    let (stop, signal) = watch::channel(false);
    let (handle, task) = engine::start(store.clone(), Arc::new(Metrics::new()), signal).unwrap();
    Running { handle, stop, task }
}

impl Running {
    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_lasts_at_least_its_ttl_and_expires_after_it() {
    let store = MemoryLeaseStore::default();
    let coordinator = start(&store).handle;
    let lease = coordinator
        .acquire(request("r/1", "a", 1_000, 0))
        .await
        .unwrap();
    sleep(Duration::from_millis(999)).await;
    coordinator.renew(lease.id, None).await.unwrap();
    sleep(Duration::from_millis(999)).await;
    assert!(coordinator
        .describe(lease.lock.clone())
        .await
        .unwrap()
        .lease
        .is_some());
    sleep(Duration::from_millis(2)).await;
    assert_eq!(
        coordinator.renew(lease.id, None).await,
        Err(CoordinatorError::Lease(LeaseError::UnknownLease(lease.id)))
    );
    // The expiry is durable: nothing of the lease is left in the store.
    assert!(store.load().unwrap().leases.is_empty());
}

#[tokio::test(start_paused = true)]
async fn p1_a_waiter_gets_the_lock_with_a_higher_epoch_when_it_is_released() {
    let coordinator = start(&MemoryLeaseStore::default()).handle;
    let first = coordinator
        .acquire(request("r/1", "a", 10_000, 0))
        .await
        .unwrap();
    let waiting = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            coordinator
                .acquire(request("r/1", "b", 10_000, 5_000))
                .await
        })
    };
    sleep(Duration::from_millis(100)).await;
    coordinator.release(first.id, None).await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    assert!(second.epoch > first.epoch);
    assert_eq!(second.holder.as_str(), "b");
}

#[tokio::test(start_paused = true)]
async fn p1_an_expired_holder_hands_over_to_the_waiter() {
    let coordinator = start(&MemoryLeaseStore::default()).handle;
    let first = coordinator
        .acquire(request("r/1", "a", 300, 0))
        .await
        .unwrap();
    let second = coordinator
        .acquire(request("r/1", "b", 300, 1_000))
        .await
        .unwrap();
    assert!(second.epoch > first.epoch);
    assert_eq!(
        coordinator
            .renew(first.id, None)
            .await
            .unwrap_err()
            .to_string(),
        { format!("lease {} is unknown, released or expired", first.id) }
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_runs_out_is_answered_with_wait_timed_out() {
    let coordinator = start(&MemoryLeaseStore::default()).handle;
    coordinator
        .acquire(request("r/1", "a", 10_000, 0))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let result = coordinator.acquire(request("r/1", "b", 1_000, 500)).await;
    assert!(
        matches!(result, Err(CoordinatorError::WaitTimedOut { .. })),
        "{result:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_wait_does_not_receive_the_lock() {
    let coordinator = start(&MemoryLeaseStore::default()).handle;
    let first = coordinator
        .acquire(request("r/1", "a", 10_000, 0))
        .await
        .unwrap();
    let abandoned = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            coordinator
                .acquire(request("r/1", "gone", 10_000, 5_000))
                .await
        })
    };
    let patient = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            coordinator
                .acquire(request("r/1", "c", 10_000, 5_000))
                .await
        })
    };
    sleep(Duration::from_millis(10)).await;
    abandoned.abort();
    sleep(Duration::from_millis(10)).await;
    coordinator.release(first.id, None).await.unwrap();
    let granted = patient.await.unwrap().unwrap();
    assert_eq!(granted.holder.as_str(), "c");
}

#[tokio::test(start_paused = true)]
async fn p1_p8_a_restart_keeps_acknowledged_state_and_restarts_ttls_in_full() {
    let store = MemoryLeaseStore::default();
    let running = start(&store);
    let kept = running
        .handle
        .acquire(request("r/1", "a", 1_000, 0))
        .await
        .unwrap();
    let released = running
        .handle
        .acquire(request("r/2", "b", 1_000, 0))
        .await
        .unwrap();
    running.handle.release(released.id, None).await.unwrap();
    sleep(Duration::from_millis(900)).await;
    running.stop().await;

    let restarted = start(&store).handle;
    // The acknowledged release stays released; the held lease is back with a full TTL.
    assert!(restarted
        .describe(released.lock.clone())
        .await
        .unwrap()
        .lease
        .is_none());
    let summary = restarted.describe(kept.lock.clone()).await.unwrap();
    assert_eq!(summary.lease.unwrap().epoch, kept.epoch);
    assert_eq!(summary.remaining_ms, 1_000);
    let next = restarted
        .acquire(request("r/2", "c", 1_000, 0))
        .await
        .unwrap();
    assert!(next.epoch > released.epoch && next.epoch > kept.epoch);
    assert_eq!(store.load().unwrap().last_epoch, next.epoch);
    assert_eq!(next.epoch, Epoch(3));
}

#[tokio::test(start_paused = true)]
async fn stopping_answers_waiters_with_unavailable() {
    let store = MemoryLeaseStore::default();
    let running = start(&store);
    running
        .handle
        .acquire(request("r/1", "a", 10_000, 0))
        .await
        .unwrap();
    let waiting = {
        let coordinator = running.handle.clone();
        tokio::spawn(async move {
            coordinator
                .acquire(request("r/1", "b", 10_000, 60_000))
                .await
        })
    };
    sleep(Duration::from_millis(10)).await;
    let handle = running.handle.clone();
    running.stop().await;
    assert!(matches!(
        waiting.await.unwrap(),
        Err(CoordinatorError::Unavailable(_))
    ));
    assert!(!handle.is_ready());
    assert!(matches!(
        handle.acquire(request("r/3", "c", 1_000, 0)).await,
        Err(CoordinatorError::Unavailable(_))
    ));
}
