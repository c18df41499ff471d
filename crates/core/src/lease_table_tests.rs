//! Unit tests of the lease table, and a property test that drives random operation sequences
//! (with crashes and restores in between) against a simple model. Each test names the
//! property it checks.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;

fn lock(name: &str) -> LockName {
    LockName::new(name).unwrap()
}

fn request(name: &str, holder: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        lock: lock(name),
        holder: HolderId::new(holder).unwrap(),
        principal: Principal::anonymous(),
        ttl_ms,
        wait_ms,
        class: LockClass::Critical,
        request_id: None,
    }
}

fn granted(outcome: AcquireOutcome) -> Lease {
    match outcome {
        AcquireOutcome::Granted(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn p1_epochs_increase_per_lock_across_release_and_expiry() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 100, 0), 0).unwrap());
    table.release(a.id, None, 10).unwrap();
    let b = granted(table.acquire(request("r/1", "b", 100, 0), 20).unwrap());
    assert!(b.epoch > a.epoch);
    table.expire_due(b.expires_at);
    let c = granted(
        table
            .acquire(request("r/1", "c", 100, 0), b.expires_at)
            .unwrap(),
    );
    assert!(c.epoch > b.epoch);
    assert_eq!(table.last_epoch(), c.epoch);
}

#[test]
fn a_grant_records_the_wall_clock_and_keeps_it_through_renewals_and_a_restore() {
    let mut table = LeaseTable::new();
    table.set_wall_clock(1_765_000_000_000);
    let a = granted(table.acquire(request("r/1", "a", 1_000, 5_000), 0).unwrap());
    assert_eq!(a.granted_unix_ms, 1_765_000_000_000);
    // A waiter granted later records the time of its grant, not of its request.
    assert!(matches!(
        table.acquire(request("r/1", "b", 1_000, 5_000), 0).unwrap(),
        AcquireOutcome::Waiting(_)
    ));
    table.set_wall_clock(1_765_000_000_500);
    let renewed = table.renew(a.id, None, 500).unwrap();
    assert_eq!(
        renewed.granted_unix_ms, a.granted_unix_ms,
        "a renewal is not a grant"
    );
    assert_eq!(renewed.renewed_unix_ms, 1_765_000_000_500);
    table.set_wall_clock(1_765_000_000_900);
    table.release(a.id, None, 900).unwrap();
    let b = table.describe(&lock("r/1"), 900).lease.unwrap();
    assert_eq!(b.granted_unix_ms, 1_765_000_000_900);
    let restored = LeaseTable::restore(table.last_epoch(), [b.clone()], 0);
    assert_eq!(
        restored.lease(b.id).unwrap().granted_unix_ms,
        b.granted_unix_ms
    );
}

#[test]
fn p8_a_retried_acquire_renews_the_lease_so_the_retrier_never_outlives_it() {
    // Granted at t=0 with a 10 s TTL, the answer lost; the client retries at t=9.5 s with the
    // same request id and counts its lease from 9.5 s. Before, the coordinator returned the
    // lease unchanged (expiring at 10 s) and granted B at 10 s while A believed until 19.5 s.
    let mut table = LeaseTable::new();
    let mut first = request("r/1", "a", 10_000, 0);
    first.request_id = Some(RequestId::new("req-1").unwrap());
    let lease = granted(table.acquire(first.clone(), 0).unwrap());
    table.take_changes();
    let retried = granted(table.acquire(first, 9_500).unwrap());
    assert_eq!((retried.id, retried.epoch), (lease.id, lease.epoch));
    assert_eq!(
        retried.expires_at, 19_500,
        "expires a full TTL after the retry"
    );
    assert!(
        !table.take_changes().is_empty(),
        "the renewal is committed before the answer"
    );
    let err = table
        .acquire(request("r/1", "b", 1_000, 0), 10_000)
        .unwrap_err();
    assert!(matches!(err, LeaseError::Held { .. }), "{err:?}");
}

#[test]
fn held_lock_without_wait_is_rejected_with_the_holder() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 1_000, 0), 0).unwrap());
    let err = table
        .acquire(request("r/1", "b", 1_000, 0), 400)
        .unwrap_err();
    assert_eq!(
        err,
        LeaseError::Held {
            lock: lock("r/1"),
            holder: a.holder.clone(),
            epoch: a.epoch,
            remaining_ms: 600
        }
    );
}

#[test]
fn release_hands_the_lock_to_the_first_waiter_in_the_same_step() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 1_000, 0), 0).unwrap());
    let AcquireOutcome::Waiting(w1) = table.acquire(request("r/1", "w1", 500, 100), 1).unwrap()
    else {
        panic!("expected to wait")
    };
    let AcquireOutcome::Waiting(_w2) = table.acquire(request("r/1", "w2", 500, 100), 2).unwrap()
    else {
        panic!("expected to wait")
    };
    table.take_events();
    table.release(a.id, None, 5).unwrap();
    let events = table.take_events();
    // The release is reported before the hand-off it caused.
    assert!(matches!(events[0], Event::Released { .. }));
    let Event::Granted { lease, waiter } = &events[1] else {
        panic!("expected a grant second, got {events:?}")
    };
    assert_eq!(*waiter, Some(w1));
    assert_eq!(lease.holder.as_str(), "w1");
    assert_eq!(lease.expires_at, 505);
    // One durable change covers the release and the hand-off.
    let changes = table.take_changes();
    assert_eq!(changes.locks, vec![(lock("r/1"), Some(lease.clone()))]);
}

#[test]
fn waits_time_out_and_are_skipped_on_hand_off() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 1_000, 0), 0).unwrap());
    table.acquire(request("r/1", "w1", 500, 50), 0).unwrap();
    table.acquire(request("r/1", "w2", 500, 500), 0).unwrap();
    table.take_events();
    assert_eq!(table.next_deadline(), Some(50));
    table.expire_due(50);
    assert!(matches!(table.take_events()[..], [Event::WaitEnded { .. }]));
    table.release(a.id, None, 60).unwrap();
    let lease = table.describe(&lock("r/1"), 60).lease.unwrap();
    assert_eq!(lease.holder.as_str(), "w2");
}

#[test]
fn the_waiter_queue_is_bounded() {
    let mut table = LeaseTable::new();
    table.acquire(request("r/1", "a", 1_000, 0), 0).unwrap();
    for _ in 0..MAX_WAITERS_PER_LOCK {
        table.acquire(request("r/1", "w", 1_000, 1_000), 0).unwrap();
    }
    let err = table
        .acquire(request("r/1", "w", 1_000, 1_000), 0)
        .unwrap_err();
    assert!(matches!(err, LeaseError::TooManyWaiters { .. }));
}

#[test]
fn limits_are_enforced() {
    let mut table = LeaseTable::new();
    for ttl in [0, MIN_TTL_MS - 1, MAX_TTL_MS + 1] {
        let err = table.acquire(request("r/1", "a", ttl, 0), 0).unwrap_err();
        assert!(
            matches!(err, LeaseError::InvalidInput(_)),
            "ttl {ttl}: {err:?}"
        );
    }
    let err = table
        .acquire(request("r/1", "a", 100, MAX_WAIT_MS + 1), 0)
        .unwrap_err();
    assert!(matches!(err, LeaseError::InvalidInput(_)));
    assert_eq!(table.take_changes(), Changes::default());
}

#[test]
fn expired_leases_cannot_be_renewed_or_released() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 100, 0), 0).unwrap());
    assert_eq!(
        table.renew(a.id, None, 100),
        Err(LeaseError::UnknownLease(a.id))
    );
    assert_eq!(
        table.release(a.id, None, 100),
        Err(LeaseError::UnknownLease(a.id))
    );
}

#[test]
fn renewal_extends_from_now_by_the_full_ttl() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 100, 0), 0).unwrap());
    let renewed = table.renew(a.id, None, 90).unwrap();
    assert_eq!(renewed.expires_at, 190);
    table.expire_due(189);
    assert!(table.lease(a.id).is_some());
    table.expire_due(190);
    assert!(table.lease(a.id).is_none());
}

#[test]
fn p1_restore_restarts_leases_at_full_ttl_and_continues_the_epoch_counter() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 100, 0), 0).unwrap());
    let changes = table.take_changes();
    let leases = changes.locks.into_iter().filter_map(|(_, lease)| lease);
    let mut restored = LeaseTable::restore(changes.last_epoch, leases, 5_000);
    assert_eq!(restored.lease(a.id).unwrap().expires_at, 5_100);
    restored.release(a.id, None, 5_001).unwrap();
    let b = granted(
        restored
            .acquire(request("r/1", "b", 100, 0), 5_002)
            .unwrap(),
    );
    assert!(b.epoch > a.epoch);
}

#[test]
#[should_panic(expected = "above the epoch counter")]
fn restore_refuses_a_lease_above_the_counter() {
    let lease = Lease {
        id: LeaseId(9),
        lock: lock("r/1"),
        holder: HolderId::new("a").unwrap(),
        principal: Principal::anonymous(),
        epoch: Epoch(9),
        ttl_ms: 100,
        class: LockClass::Critical,
        expires_at: 0,
        granted_unix_ms: 0,
        renewed_unix_ms: 0,
        request_id: None,
    };
    LeaseTable::restore(Epoch(3), [lease], 0);
}

fn request_as(name: &str, holder: &str, principal: &str) -> AcquireRequest {
    AcquireRequest {
        principal: Principal::new(principal).unwrap(),
        ..request(name, holder, 100, 0)
    }
}

#[test]
fn p2_only_the_holding_principal_or_an_admin_renews_or_releases_a_lease() {
    let mut table = LeaseTable::new();
    let orders = Principal::new("orders").unwrap();
    let mallory = Principal::new("mallory").unwrap();
    let a = granted(table.acquire(request_as("r/1", "w", "orders"), 0).unwrap());
    assert_eq!(a.principal, orders);
    assert_eq!(
        table.release(a.id, Some(&mallory), 1),
        Err(LeaseError::NotHolder(a.id))
    );
    assert_eq!(
        table.renew(a.id, Some(&mallory), 1),
        Err(LeaseError::NotHolder(a.id))
    );
    // Nothing changed: the lease is still the holder's.
    assert_eq!(table.lease(a.id).unwrap().expires_at, a.expires_at);
    assert!(table.renew(a.id, Some(&orders), 2).is_ok());
    // An admin (None) may end any lease.
    assert!(table.release(a.id, None, 3).is_ok());
}

#[test]
fn p2_a_retry_by_another_principal_is_not_handed_the_lease() {
    // A request id and a holder label are client-chosen: another principal that replays them
    // must not receive the live lease (and its token).
    let mut table = LeaseTable::new();
    let first = AcquireRequest {
        request_id: Some(RequestId::new("job-7").unwrap()),
        ..request_as("r/1", "w", "orders")
    };
    let a = granted(table.acquire(first.clone(), 0).unwrap());
    let replay = AcquireRequest {
        principal: Principal::new("mallory").unwrap(),
        ..first.clone()
    };
    assert!(matches!(
        table.acquire(replay, 1),
        Err(LeaseError::Held { .. })
    ));
    assert_eq!(granted(table.acquire(first, 2).unwrap()).id, a.id);
}

#[test]
fn lease_ids_come_from_the_secret_and_tell_nothing_about_each_other() {
    let mut one = LeaseTable::new();
    one.set_lease_secret([1; 32]);
    let mut two = LeaseTable::new();
    two.set_lease_secret([2; 32]);
    let a1 = granted(one.acquire(request("r/1", "a", 100, 0), 0).unwrap());
    let a2 = granted(one.acquire(request("r/2", "a", 100, 0), 0).unwrap());
    let b1 = granted(two.acquire(request("r/1", "a", 100, 0), 0).unwrap());
    assert_eq!(a1.epoch, b1.epoch);
    assert_ne!(a1.id, b1.id, "same epoch, other secret: another id");
    assert_ne!(a1.id, a2.id);
    // Consecutive grants do not give neighbouring ids.
    assert!(a1.id.0.abs_diff(a2.id.0) > u128::from(u64::MAX));
}

/// A principal's leases held plus acquires queued stay within the limit its acquires carry;
/// a lease that ends, a wait that ends and a restore give the count back; other principals
/// are not counted against it. (A limit on the coordinator's resources: it serves P8 for the
/// other principals, whose acquires are not crowded out.)
#[test]
fn p8_a_principal_holds_and_awaits_no_more_than_its_limit() {
    let mut table = LeaseTable::new();
    let jobs = Principal::new("jobs").unwrap();
    let limited = |table: &mut LeaseTable, name: &str, wait_ms: u64, now: Millis| {
        let request = AcquireRequest {
            wait_ms,
            ..request_as(name, "w", "jobs")
        };
        table.acquire_within(request, now, Some(2))
    };
    let a = granted(limited(&mut table, "j/1", 0, 0).unwrap());
    let _b = granted(
        table
            .acquire(request_as("other/1", "w", "orders"), 0)
            .unwrap(),
    );
    // Waiting for a lock another principal holds counts too.
    let w = match limited(&mut table, "other/1", 50, 0).unwrap() {
        AcquireOutcome::Waiting(w) => w,
        other => panic!("expected a wait, got {other:?}"),
    };
    assert_eq!(table.claims_of(&jobs), 2);
    let refused = limited(&mut table, "j/2", 0, 0).unwrap_err();
    assert_eq!(
        refused,
        LeaseError::PrincipalLimit {
            principal: jobs.clone(),
            limit: 2
        }
    );
    assert!(refused.to_string().contains("jobs limits leases=N"));
    // The refusal left nothing behind, and other principals are not limited by it.
    assert!(table.describe(&lock("j/2"), 0).lease.is_none());
    assert_eq!(table.list(10, 0).len(), 2);
    granted(table.acquire(request_as("o/2", "w", "orders"), 0).unwrap());
    // A retry of an acquire a live lease answers takes nothing new: never refused.
    let retry = AcquireRequest {
        request_id: Some(RequestId::new("r1").unwrap()),
        ..request_as("j/3", "w", "jobs")
    };
    table.cancel_wait(w);
    let c = granted(table.acquire_within(retry.clone(), 1, Some(2)).unwrap());
    assert_eq!(table.claims_of(&jobs), 2);
    assert_eq!(
        granted(table.acquire_within(retry, 2, Some(2)).unwrap()).id,
        c.id
    );
    // A release, an expiry and a restore give the count back.
    table.release(a.id, None, 3).unwrap();
    assert_eq!(table.claims_of(&jobs), 1);
    table.expire_due(c.expires_at.max(200));
    assert_eq!(table.claims_of(&jobs), 0);
    let d = granted(limited(&mut table, "j/4", 0, 300).unwrap());
    let restored = LeaseTable::restore(table.last_epoch(), [d], 300);
    assert_eq!(restored.claims_of(&jobs), 1);
}

#[test]
fn cancelled_waiters_leave_no_entry_behind() {
    let mut table = LeaseTable::new();
    let a = granted(table.acquire(request("r/1", "a", 100, 0), 0).unwrap());
    let AcquireOutcome::Waiting(w) = table.acquire(request("r/1", "w", 100, 50), 0).unwrap() else {
        panic!()
    };
    table.cancel_wait(w);
    table.cancel_wait(w);
    table.release(a.id, None, 1).unwrap();
    assert!(table.list(10, 1).is_empty());
    assert_eq!(table.waiter_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Property test: random operations, crashes and restores, checked against a model.

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        lock: u8,
        ttl_ms: u64,
        wait_ms: u64,
        limit: Option<usize>,
    },
    Renew {
        pick: usize,
    },
    Release {
        pick: usize,
    },
    Cancel {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
    CrashAndRestore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            0u8..3,
            10u64..200,
            prop_oneof![Just(0u64), 1u64..300],
            prop_oneof![Just(None), (1usize..4).prop_map(Some)],
        )
            .prop_map(|(lock, ttl_ms, wait_ms, limit)| Op::Acquire {
                lock,
                ttl_ms,
                wait_ms,
                limit
            }),
        2 => any::<usize>().prop_map(|pick| Op::Renew { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        3 => (0u64..150).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::CrashAndRestore),
    ]
}

/// What the model knows: the durable image (as the coordinator would have written it), the
/// live leases with the expiry the model computes itself, and every epoch ever issued.
#[derive(Default)]
struct Model {
    disk_locks: BTreeMap<LockName, Lease>,
    disk_last_epoch: Epoch,
    live: BTreeMap<LockName, (LeaseId, Millis, u64)>,
    last_epoch_per_lock: HashMap<LockName, Epoch>,
    issued: Vec<Epoch>,
    waiters: Vec<WaiterId>,
}

impl Model {
    fn observe_grant(&mut self, lease: &Lease, now: Millis) {
        // P1: strictly above every earlier epoch of this lock, and never issued before.
        if let Some(previous) = self.last_epoch_per_lock.get(&lease.lock) {
            assert!(
                lease.epoch > *previous,
                "P1: epoch {} after {previous}",
                lease.epoch
            );
        }
        assert!(
            !self.issued.contains(&lease.epoch),
            "P1: epoch {} issued twice",
            lease.epoch
        );
        self.issued.push(lease.epoch);
        self.last_epoch_per_lock
            .insert(lease.lock.clone(), lease.epoch);
        let previous = self.live.insert(
            lease.lock.clone(),
            (lease.id, now + lease.ttl_ms, lease.ttl_ms),
        );
        assert!(previous.is_none(), "two live leases on {}", lease.lock);
    }

    fn observe_events(&mut self, events: Vec<Event>, now: Millis) {
        for event in events {
            match event {
                Event::Granted { lease, .. } => self.observe_grant(&lease, now),
                Event::Released { lease } => {
                    assert_eq!(self.live.remove(&lease.lock).map(|l| l.0), Some(lease.id));
                }
                Event::Expired { lease } => {
                    let (id, expires_at, _) = self.live.remove(&lease.lock).unwrap();
                    assert_eq!(id, lease.id);
                    assert!(
                        expires_at <= now,
                        "lease expired early: {expires_at} > {now}"
                    );
                }
                Event::WaitEnded { waiter, .. } => self.waiters.retain(|w| *w != waiter),
            }
        }
    }

    fn persist(&mut self, changes: Changes) {
        assert!(
            changes.last_epoch >= self.disk_last_epoch,
            "epoch counter went backwards"
        );
        self.disk_last_epoch = changes.last_epoch;
        for (lock, lease) in changes.locks {
            match lease {
                Some(lease) => self.disk_locks.insert(lock, lease),
                None => self.disk_locks.remove(&lock),
            };
        }
    }

    fn is_live(&self, lock: &LockName, now: Millis) -> bool {
        self.live
            .get(lock)
            .is_some_and(|(_, expires_at, _)| *expires_at > now)
    }
}

fn run_ops(ops: Vec<Op>) {
    let names: Vec<LockName> = ["a", "b/c", "d.e"].iter().map(|n| lock(n)).collect();
    let mut table = LeaseTable::new();
    let mut model = Model::default();
    let mut now: Millis = 0;
    for op in ops {
        match op {
            Op::Acquire {
                lock,
                ttl_ms,
                wait_ms,
                limit,
            } => {
                let name = &names[lock as usize];
                let was_live = model.is_live(name, now);
                let anonymous = Principal::anonymous();
                let claims = table.claims_of(&anonymous);
                let at_limit = limit.is_some_and(|limit| claims >= limit);
                let request = request(name.as_str(), "h", ttl_ms, wait_ms);
                let result = table.acquire_within(request, now, limit);
                // Leases held plus acquires queued never pass the limit they were admitted
                // under, and only a principal at its limit is refused for it.
                assert_eq!(
                    matches!(result, Err(LeaseError::PrincipalLimit { .. })),
                    at_limit,
                    "{claims} claims, limit {limit:?}: {result:?}"
                );
                if let (Some(limit), Ok(_)) = (limit, &result) {
                    assert!(table.claims_of(&anonymous) <= limit);
                }
                match result {
                    Ok(AcquireOutcome::Granted(_)) => assert!(!was_live, "granted a held lock"),
                    Ok(AcquireOutcome::Waiting(w)) => {
                        assert!(was_live && wait_ms > 0);
                        model.waiters.push(w);
                    }
                    Err(LeaseError::Held { .. }) => assert!(was_live && wait_ms == 0),
                    Err(LeaseError::PrincipalLimit { .. }) => {}
                    Err(other) => panic!("unexpected {other:?}"),
                }
            }
            Op::Renew { pick } | Op::Release { pick } if !model.live.is_empty() => {
                let (name, &(id, _, ttl)) = model.live.iter().nth(pick % model.live.len()).unwrap();
                let (name, live) = (name.clone(), model.is_live(name, now));
                let result = if matches!(op, Op::Renew { .. }) {
                    table.renew(id, None, now).map(|_| ())
                } else {
                    table.release(id, None, now).map(|_| ())
                };
                assert_eq!(
                    result.is_ok(),
                    live,
                    "lease {id} live={live} got {result:?}"
                );
                if result.is_ok() && matches!(op, Op::Renew { .. }) {
                    model.live.insert(name, (id, now + ttl, ttl));
                }
            }
            Op::Renew { .. } | Op::Release { .. } => {
                assert!(table.renew(LeaseId(u128::MAX), None, now).is_err());
            }
            Op::Cancel { pick } if !model.waiters.is_empty() => {
                table.cancel_wait(model.waiters[pick % model.waiters.len()]);
            }
            Op::Cancel { .. } => {}
            Op::Advance { ms } => {
                now += ms;
                table.expire_due(now);
            }
            Op::CrashAndRestore => {
                // Only what was persisted survives; waiters (connections) are gone.
                table = LeaseTable::restore(
                    model.disk_last_epoch,
                    model.disk_locks.values().cloned(),
                    now,
                );
                model.waiters.clear();
                model.live = model
                    .disk_locks
                    .values()
                    .map(|l| (l.lock.clone(), (l.id, now + l.ttl_ms, l.ttl_ms)))
                    .collect();
            }
        }
        let events = table.take_events();
        model.observe_events(events, now);
        model.persist(table.take_changes());
        table.check_invariants();
        assert_eq!(table.lease_count(), model.live.len());
    }
}

proptest! {
    // A fixed seed keeps every run identical (a flaky test is a bug); vary it by hand with
    // PROPTEST_RNG_SEED to explore further.
    #![proptest_config(ProptestConfig {
        cases: 512,
        rng_seed: std::env::var("PROPTEST_RNG_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .map_or(proptest::test_runner::RngSeed::Fixed(0x5041_4c49), proptest::test_runner::RngSeed::Fixed),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// P1 (monotonic issue) and mutual exclusion under random operations and restarts.
    #[test]
    fn p1_random_operations_with_restarts_never_reissue_or_lower_an_epoch(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        run_ops(ops);
    }
}

#[test]
fn p1_the_last_epochs_are_granted_then_a_typed_refusal_never_a_panic() {
    let mut table = LeaseTable::restore(Epoch(MAX_EPOCH - 2), Vec::new(), 0);
    let first = granted(table.acquire(request("x", "a", 1_000, 0), 0).unwrap());
    assert_eq!(first.epoch, Epoch(MAX_EPOCH - 1));
    // A waiter is promised the last epoch: nothing else is admitted meanwhile.
    let queued = table.acquire(request("x", "b", 1_000, 5_000), 0).unwrap();
    assert!(matches!(queued, AcquireOutcome::Waiting(_)), "{queued:?}");
    let refused = table.acquire(request("y", "c", 1_000, 0), 0).unwrap_err();
    assert_eq!(refused, LeaseError::EpochsExhausted { last: first.epoch });
    assert!(refused.to_string().contains("2^63"), "{refused}");
    // The hand-off takes the last epoch; renewals go on; nothing more is granted.
    table.take_events();
    table.release(first.id, None, 1).unwrap();
    let last = table
        .take_events()
        .into_iter()
        .find_map(|event| match event {
            Event::Granted { lease, .. } => Some(lease),
            _ => None,
        });
    let last = last.expect("the waiter was handed the lock");
    assert_eq!(last.epoch, Epoch(MAX_EPOCH));
    table.renew(last.id, None, 2).unwrap();
    assert!(table.acquire(request("y", "c", 1_000, 0), 2).is_err());
    // A counter restored past the end (an older store's) refuses too, without a panic.
    let mut beyond = LeaseTable::restore(Epoch(u64::MAX), Vec::new(), 0);
    assert!(matches!(
        beyond.acquire(request("z", "d", 1_000, 0), 0),
        Err(LeaseError::EpochsExhausted { .. })
    ));
}
