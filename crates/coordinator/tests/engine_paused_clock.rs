//! The engine on tokio's paused clock: TTLs, waits, hand-offs and restarts, deterministic and
//! instant. The store is the in-memory one (real I/O on blocking threads and a paused clock do
//! not mix); the redb store has its own tests, and the HTTP and crash tests use it for real.

use std::sync::Arc;
use std::time::Duration;

use palisade_coordinator::engine::{self, CoordinatorError, CoordinatorHandle, SteppableClock};
use palisade_coordinator::metrics::Metrics;
use palisade_coordinator::store::{LeaseStore, MemoryLeaseStore};
use palisade_core::clock::{floor_at, MAX_CLOCK_WAIT_MS};
use palisade_core::{AcquireRequest, Epoch, HolderId, LeaseError, LockClass, LockName};
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
    task: tokio::task::JoinHandle<Result<(), palisade_coordinator::store::StoreError>>,
}

/// The wall clock's reading when a test starts (2027).
const T0_MS: u64 = 1_800_000_000_000;

fn start(store: &MemoryLeaseStore) -> Running {
    start_with_clock(store, &Arc::new(SteppableClock::starting_at(T0_MS))).unwrap()
}

fn start_with_clock(
    store: &MemoryLeaseStore,
    clock: &Arc<SteppableClock>,
) -> Result<Running, palisade_coordinator::store::StoreError> {
    let (stop, signal) = watch::channel(false);
    let (handle, task) = engine::start(
        store.clone(),
        Arc::new(Metrics::new()),
        signal,
        clock.clone(),
    )?;
    Ok(Running { handle, stop, task })
}

/// A fresh store and clock, and an engine over them.
fn started() -> (MemoryLeaseStore, Arc<SteppableClock>, Running) {
    let store = MemoryLeaseStore::default();
    let clock = Arc::new(SteppableClock::starting_at(T0_MS));
    let running = start_with_clock(&store, &clock).unwrap();
    (store, clock, running)
}

impl Running {
    /// Acquires `lock` for holder `a` with `ttl_ms`, which must be granted.
    async fn grant(&self, lock: &str, ttl_ms: u64) -> palisade_core::Lease {
        self.handle
            .acquire(request(lock, "a", ttl_ms, 0))
            .await
            .unwrap()
    }

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
    let clock = Arc::new(SteppableClock::starting_at(T0_MS));
    let running = start_with_clock(&store, &clock).unwrap();
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
    let clock_at_restart = palisade_core::clock::WallClock::now_ms(&*clock);

    let restarted = start_with_clock(&store, &clock).unwrap().handle;
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
    // The restart floored the counter at the clock (the store's counter was below it).
    assert_eq!(next.epoch, Epoch(floor_at(clock_at_restart) + 1));
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

#[tokio::test(start_paused = true)]
async fn p1_p6_a_store_put_back_to_an_older_snapshot_never_reissues_an_epoch() {
    let store = MemoryLeaseStore::default();
    let clock = Arc::new(SteppableClock::starting_at(T0_MS));
    let running = start_with_clock(&store, &clock).unwrap();
    running
        .handle
        .acquire(request("r/1", "a", 1_000, 0))
        .await
        .unwrap();
    // The whole volume is snapshotted here (a VM or disk snapshot: nothing beside it
    // survives either, so only the clock can tell what happened after).
    let snapshot = store.snapshot();
    let mut issued = Vec::new();
    for n in 0..20 {
        let lock = format!("r/{}", n % 3 + 2);
        let lease = running
            .handle
            .acquire(request(&lock, "b", 1_000, 0))
            .await
            .unwrap();
        running.handle.release(lease.id, None).await.unwrap();
        issued.push(lease.epoch);
    }
    running.stop().await;
    sleep(Duration::from_millis(50)).await;
    // The snapshot is put back and started: every epoch after it is above all 20.
    let restored = start_with_clock(&snapshot, &clock).unwrap();
    let highest = *issued.iter().max().unwrap();
    for n in 0..5 {
        let lease = restored
            .handle
            .acquire(request(&format!("r/{}", n + 2), "c", 1_000, 0))
            .await
            .unwrap();
        assert!(
            lease.epoch > highest,
            "{} reissued (<= {highest})",
            lease.epoch
        );
        assert!(!issued.contains(&lease.epoch));
    }
    restored.stop().await;
}

#[tokio::test(start_paused = true)]
async fn p1_p6_a_clock_stepped_back_a_little_is_waited_out_never_issued_below() {
    let (_store, clock, running) = started();
    let first = running.grant("r/1", 60_000).await;
    clock.step(-2_000);
    let before = tokio::time::Instant::now();
    let second = running.grant("r/2", 60_000).await;
    // The engine waited for the clock to pass the counter before it issued.
    assert!(before.elapsed() >= Duration::from_millis(1_999));
    assert!(second.epoch > first.epoch);
    let now = palisade_core::clock::WallClock::now_ms(&*clock);
    assert!(palisade_core::clock::issuable(second.epoch.0, now));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn p1_p6_a_clock_stepped_back_far_stops_issuing_and_refuses_to_start() {
    let (store, clock, running) = started();
    let first = running.grant("r/1", 60_000).await;
    let step = i64::try_from(MAX_CLOCK_WAIT_MS).unwrap() + 10_000;
    clock.step(-step);
    // Renewing issues no epoch: it is not held up by the clock.
    running.handle.renew(first.id, None).await.unwrap();
    let refused = running.handle.acquire(request("r/2", "a", 1_000, 0)).await;
    assert!(
        matches!(&refused, Err(CoordinatorError::Unavailable(why)) if why.contains("clock")),
        "{refused:?}"
    );
    let stopped = running.task.await.unwrap();
    assert!(
        matches!(
            stopped,
            Err(palisade_coordinator::store::StoreError::ClockBehind { .. })
        ),
        "{stopped:?}"
    );
    // Nothing above the clock was made durable, and a start with the clock still behind the
    // stored counter is refused, naming the clock.
    assert_eq!(store.load().unwrap().last_epoch, first.epoch);
    let error = start_with_clock(&store, &clock).err().unwrap();
    assert!(
        matches!(
            error,
            palisade_coordinator::store::StoreError::CounterAhead { .. }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("went back"), "{error}");
    // Once the clock is right again, the coordinator starts and issues above.
    clock.step(step);
    let again = start_with_clock(&store, &clock).unwrap();
    let next = again
        .handle
        .acquire(request("r/2", "a", 1_000, 0))
        .await
        .unwrap();
    assert!(next.epoch > first.epoch);
    again.stop().await;
}

fn start_with_rules(
    store: &MemoryLeaseStore,
    clock: &Arc<SteppableClock>,
    counter_ahead: engine::CounterAhead,
) -> Result<Running, palisade_coordinator::store::StoreError> {
    let (stop, signal) = watch::channel(false);
    let (transitions, _) = tokio::sync::broadcast::channel(16);
    let rules = engine::ClockRules {
        clock: clock.clone(),
        counter_ahead,
    };
    let (handle, task) = engine::start_with_rules(
        store.clone(),
        Arc::new(Metrics::new()),
        signal,
        transitions,
        rules,
    )?;
    Ok(Running { handle, stop, task })
}

const DAY_MS: i64 = 86_400_000;

#[tokio::test(start_paused = true)]
async fn p1_p6_a_counter_raised_by_a_clock_a_day_ahead_names_what_happened_and_resumes_on_the_operators_word(
) {
    // Started once with the clock a day ahead, one grant, stopped; the clock set right.
    let (store, clock, running) = started();
    clock.step(DAY_MS);
    running.stop().await;
    let ahead = start_with_clock(&store, &clock).unwrap();
    let first = ahead.grant("r/1", 60_000).await;
    ahead.stop().await;
    clock.step(-DAY_MS);
    let refused = start_with_clock(&store, &clock).err().unwrap();
    let counter = store.load().unwrap().last_epoch;
    let message = refused.to_string();
    for words in [
        "raised by a clock that read".to_owned(),
        "ran ahead".to_owned(),
        format!("--resume-counter-ahead {}", counter.0),
        "is not caught by the clock floor".to_owned(),
    ] {
        assert!(message.contains(&words), "{words:?} not in {message}");
    }
    assert!(!message.contains("NTP"), "{message}");
    assert!(
        message.contains("23h 59m 59.") || message.contains("24h 0m 0."),
        "not a day ahead: {message}"
    );
    // The operator's word: epochs rise from the counter at once, no wait for the clock.
    let resumed =
        start_with_rules(&store, &clock, engine::CounterAhead::Accepted(counter)).unwrap();
    let before = tokio::time::Instant::now();
    let second = resumed.grant("r/2", 60_000).await;
    let third = resumed.grant("r/3", 60_000).await;
    assert!(before.elapsed() < Duration::from_millis(1));
    assert!(first.epoch < second.epoch && second.epoch < third.epoch);
    // Once the clock passes the counter, the ceiling is back by itself: a clock stepped back
    // far is refused again, never issued above.
    clock.step(DAY_MS + 1_000);
    let fourth = resumed.grant("r/4", 60_000).await;
    assert!(fourth.epoch > third.epoch);
    clock.step(-DAY_MS);
    let refused = resumed.handle.acquire(request("r/5", "a", 1_000, 0)).await;
    assert!(
        matches!(refused, Err(CoordinatorError::Unavailable(_))),
        "{refused:?}"
    );
    assert!(resumed.task.await.unwrap().is_err());
}

#[tokio::test(start_paused = true)]
async fn p1_p6_an_acceptance_covers_only_the_counter_it_named() {
    let (store, clock, running) = started();
    running.stop().await;
    clock.step(DAY_MS);
    let ahead = start_with_clock(&store, &clock).unwrap();
    let first = ahead.grant("r/1", 60_000).await;
    ahead.stop().await;
    // Accepted at the counter of a day ahead; the counter then raised by a clock two days ahead.
    let accepted = store.load().unwrap().last_epoch;
    clock.step(DAY_MS);
    let further = start_with_clock(&store, &clock).unwrap();
    further.grant("r/2", 60_000).await;
    further.stop().await;
    clock.step(-2 * DAY_MS);
    let refused = start_with_rules(&store, &clock, engine::CounterAhead::Accepted(accepted));
    assert!(
        matches!(
            refused.err().unwrap(),
            palisade_coordinator::store::StoreError::CounterAhead { .. }
        ),
        "accepted {} covered a counter raised past it",
        first.epoch
    );
}

#[tokio::test(start_paused = true)]
async fn p1_a_leader_outvoting_its_counter_waits_the_offset_out_and_then_issues_above() {
    let (store, clock, running) = started();
    running.stop().await;
    clock.step(DAY_MS);
    let ahead = start_with_clock(&store, &clock).unwrap();
    let first = ahead.grant("r/1", 60_000).await;
    ahead.stop().await;
    clock.step(-DAY_MS);
    let outvoted = engine::CounterAhead::Outvoted { max_wait_ms: 500 };
    let leader = start_with_rules(&store, &clock, outvoted).unwrap();
    let before = tokio::time::Instant::now();
    let second = leader.grant("r/2", 60_000).await;
    assert!(before.elapsed() < Duration::from_millis(1));
    assert!(second.epoch > first.epoch);
    // A clock behind by less than the offset is waited out, as before.
    leader.stop().await;
    let (store, clock, running) = started();
    let first = running.grant("r/1", 60_000).await;
    running.stop().await;
    clock.step(-300);
    let leader = start_with_rules(&store, &clock, outvoted).unwrap();
    let before = tokio::time::Instant::now();
    let second = leader.grant("r/2", 60_000).await;
    assert!(before.elapsed() >= Duration::from_millis(299));
    assert!(second.epoch > first.epoch);
    leader.stop().await;
}

#[tokio::test(start_paused = true)]
async fn p1_a_clock_past_the_headroom_refuses_to_start_with_a_typed_error() {
    let store = MemoryLeaseStore::default();
    for now_ms in [palisade_core::clock::LAST_CLOCK_MS + 1, 1 << 44, u64::MAX] {
        let clock = Arc::new(SteppableClock::starting_at(now_ms));
        let refused = start_with_clock(&store, &clock).err().unwrap();
        assert!(
            matches!(
                refused,
                palisade_coordinator::store::StoreError::Headroom(
                    palisade_core::clock::HeadroomError::ClockPastLastMs { .. }
                )
            ),
            "{refused}"
        );
    }
    // At the last millisecond, it starts and grants.
    let clock = Arc::new(SteppableClock::starting_at(
        palisade_core::clock::LAST_CLOCK_MS - 1_000,
    ));
    let running = start_with_clock(&store, &clock).unwrap();
    let lease = running.grant("r/1", 1_000).await;
    assert!(lease.epoch.0 <= palisade_core::clock::MAX_EPOCH);
    running.stop().await;
}
