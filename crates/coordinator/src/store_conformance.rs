//! The conformance suite of [`LeaseStore`]: one set of cases every implementation must pass
//! (the redb store, the in-memory store, the Raft store of cluster mode).
//!
//! An implementation's test module implements [`Harness`] and invokes [`lease_store_suite!`],
//! which expands to one `#[test]` per case, each with a fresh harness. Each case names the
//! properties it checks. The cases call [`commit`], which uses the store's own way of
//! committing (`commit_async` for a replicated store, `commit` otherwise).

use std::future::Future;

use palisade_core::{Changes, Epoch, HolderId, Lease, LeaseId, LockClass, LockName};

use crate::store::{DurableState, LeaseStore, StoreError};

/// Opens and restarts the store under test.
pub trait Harness {
    /// The implementation under test.
    type Store: LeaseStore;
    /// A store over fresh, empty storage.
    fn open(&mut self) -> impl Future<Output = Self::Store>;
    /// Stops `store` as a crash would (kill -9, power cut) and opens the same storage again.
    fn restart(&mut self, store: Self::Store) -> impl Future<Output = Self::Store>;
}

/// Expands to one `#[test]` per case; `$harness` makes a fresh harness, `$run` runs a future
/// to completion (`fn(impl Future<Output = ()>)`).
#[macro_export]
macro_rules! lease_store_suite {
    ($harness:expr, $run:expr) => {
        $crate::lease_store_suite!(@cases $harness, $run;
            an_empty_store_loads_an_empty_state,
            p8_load_returns_exactly_the_last_commit,
            p8_committed_state_survives_a_restart,
            p1_a_lower_counter_is_refused_and_changes_nothing,
            p8_a_commit_of_many_locks_is_all_there_after_a_restart,
        );
    };
    (@cases $harness:expr, $run:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                ($run)($crate::store_conformance::$case($harness));
            }
        )*
    };
}

/// Commits through the store's own path: `commit_async` where it has one, else `commit`.
pub async fn commit<S: LeaseStore>(store: &mut S, changes: &Changes) -> Result<(), StoreError> {
    match store.commit_async(changes) {
        Some(pending) => pending.await,
        None => store.commit(changes),
    }
}

/// A lease of `lock` at `epoch` with a TTL far beyond any test (a replicated store's leader
/// restarts every lease's expiry; none may expire during a case).
pub fn lease(lock: &str, epoch: u64) -> Lease {
    Lease {
        // Distinct from the epoch's value, so a store that mixes the two up is caught.
        id: LeaseId(u128::from(epoch) << 64 | 0xfeed),
        lock: LockName::new(lock).expect("a valid lock name"),
        holder: HolderId::new(format!("holder-{epoch}")).expect("a valid holder"),
        principal: palisade_core::Principal::new(format!("svc-{epoch}")).expect("valid"),
        epoch: Epoch(epoch),
        ttl_ms: 3_600_000,
        class: LockClass::Critical,
        expires_at: 0,
        // The grant time is durable too (the console and `lock show` say "held since").
        granted_unix_ms: 1_765_000_000_000 + epoch,
        renewed_unix_ms: 1_765_000_000_500 + epoch,
        request_id: None,
    }
}

fn set(locks: &[(&str, Option<u64>)], last_epoch: u64) -> Changes {
    Changes {
        locks: locks
            .iter()
            .map(|(lock, epoch)| {
                (
                    LockName::new(*lock).expect("a valid lock name"),
                    epoch.map(|e| lease(lock, e)),
                )
            })
            .collect(),
        last_epoch: Epoch(last_epoch),
        endings: Vec::new(),
    }
}

/// The state with leases sorted by lock (stores may return them in any order) and expiry
/// ignored (a store keeps TTLs, not deadlines).
fn normalised(mut state: DurableState) -> DurableState {
    state.leases.sort_by(|a, b| a.lock.cmp(&b.lock));
    for lease in &mut state.leases {
        lease.expires_at = 0;
    }
    state
}

fn expected(last_epoch: u64, leases: &[(&str, u64)]) -> DurableState {
    normalised(DurableState {
        last_epoch: Epoch(last_epoch),
        leases: leases.iter().map(|(lock, e)| lease(lock, *e)).collect(),
    })
}

/// A new store holds no lease and a counter of 0.
pub async fn an_empty_store_loads_an_empty_state<H: Harness>(mut harness: H) {
    let store = harness.open().await;
    assert_eq!(normalised(store.load().unwrap()), expected(0, &[]));
}

/// P8: `load` returns exactly the state of the last successful commit: grants, replacements
/// and releases, the counter included.
pub async fn p8_load_returns_exactly_the_last_commit<H: Harness>(mut harness: H) {
    let mut store = harness.open().await;
    commit(&mut store, &set(&[("c/a", Some(1)), ("c/b", Some(2))], 2))
        .await
        .unwrap();
    assert_eq!(
        normalised(store.load().unwrap()),
        expected(2, &[("c/a", 1), ("c/b", 2)])
    );
    commit(
        &mut store,
        &set(&[("c/a", None), ("c/b", Some(4)), ("c/c", Some(3))], 4),
    )
    .await
    .unwrap();
    assert_eq!(
        normalised(store.load().unwrap()),
        expected(4, &[("c/b", 4), ("c/c", 3)])
    );
    // A counter that moves with no lease change (epochs granted and already released).
    commit(&mut store, &set(&[], 9)).await.unwrap();
    assert_eq!(
        normalised(store.load().unwrap()),
        expected(9, &[("c/b", 4), ("c/c", 3)])
    );
}

/// P8: what was committed before a crash is what a restarted store loads.
pub async fn p8_committed_state_survives_a_restart<H: Harness>(mut harness: H) {
    let mut store = harness.open().await;
    commit(&mut store, &set(&[("r/a", Some(5)), ("r/b", Some(6))], 6))
        .await
        .unwrap();
    commit(&mut store, &set(&[("r/a", None)], 7)).await.unwrap();
    let mut store = harness.restart(store).await;
    assert_eq!(
        normalised(store.load().unwrap()),
        expected(7, &[("r/b", 6)])
    );
    // And it goes on from there.
    commit(&mut store, &set(&[("r/c", Some(8))], 8))
        .await
        .unwrap();
    let store = harness.restart(store).await;
    assert_eq!(
        normalised(store.load().unwrap()),
        expected(8, &[("r/b", 6), ("r/c", 8)])
    );
}

/// P1: a commit that would lower the counter is refused, and applies none of its changes
/// (all or nothing), before and after a restart.
pub async fn p1_a_lower_counter_is_refused_and_changes_nothing<H: Harness>(mut harness: H) {
    let mut store = harness.open().await;
    commit(&mut store, &set(&[("d/a", Some(10))], 10))
        .await
        .unwrap();
    let lower = set(&[("d/a", None), ("d/b", Some(9))], 9);
    assert!(commit(&mut store, &lower).await.is_err());
    assert_eq!(
        normalised(store.load().unwrap()),
        expected(10, &[("d/a", 10)])
    );
    let mut store = harness.restart(store).await;
    assert_eq!(
        normalised(store.load().unwrap()),
        expected(10, &[("d/a", 10)])
    );
    assert!(commit(&mut store, &lower).await.is_err());
    // An equal counter is not lower: a batch of releases keeps it.
    commit(&mut store, &set(&[("d/a", None)], 10))
        .await
        .unwrap();
    assert_eq!(normalised(store.load().unwrap()), expected(10, &[]));
}

/// P8: one group commit of many locks is durable as a whole.
pub async fn p8_a_commit_of_many_locks_is_all_there_after_a_restart<H: Harness>(mut harness: H) {
    let mut store = harness.open().await;
    let names: Vec<String> = (0..500).map(|i| format!("many/{i:03}")).collect();
    let locks: Vec<(&str, Option<u64>)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.as_str(), Some(i as u64 + 1)))
        .collect();
    commit(&mut store, &set(&locks, 500)).await.unwrap();
    let store = harness.restart(store).await;
    let leases: Vec<(&str, u64)> = locks.iter().map(|(n, e)| (*n, e.unwrap())).collect();
    assert_eq!(normalised(store.load().unwrap()), expected(500, &leases));
}
