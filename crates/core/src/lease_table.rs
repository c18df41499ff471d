//! The lease table: a deterministic state machine of locks, leases and waiters.
//!
//! Every operation takes the current time (`now`, in [`Millis`] on the coordinator's monotonic
//! clock) as an argument and never reads a clock, so a sequence of operations replays to the
//! same state and the same outputs. The table does no I/O: the coordinator persists what
//! [`LeaseTable::take_changes`] returns before it acknowledges anything, and delivers what
//! [`LeaseTable::take_events`] returns (grants to waiters, expiries) after that commit.
//!
//! Invariants (checked by [`LeaseTable::check_invariants`] in debug builds after each change):
//! - a lock has at most one lease; a lease belongs to exactly one lock;
//! - every epoch ever granted is at most `last_epoch`, and each grant takes `last_epoch + 1`,
//!   so epochs strictly increase per lock and are never issued twice (P1);
//! - a lock entry exists only while it is held or has waiters (memory stays bounded by the
//!   number of live leases and waiters);
//! - every live lease and waiter has exactly one entry in the deadline index;
//! - each principal's claim count is the number of its live leases plus its queued acquires
//!   (what [`LeaseTable::acquire_within`] limits).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::clock::MAX_EPOCH;
use crate::limits::{MAX_TTL_MS, MAX_WAITERS_PER_LOCK, MAX_WAIT_MS, MIN_TTL_MS};
use sha2::{Digest as _, Sha256};

use crate::types::{
    Epoch, HolderId, InvalidInput, LeaseId, LockClass, LockName, Millis, Principal, RequestId,
};

/// The id of a queued acquire, unique within one run of a lease table (waiters are not durable:
/// a waiting client is a connection, and a restart drops connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaiterId(pub u64);

/// An acquire as the lease table sees it (already parsed; limits are checked here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The lock to acquire.
    pub lock: LockName,
    /// Who asks, as the client labels itself; recorded in the lease and the token.
    pub holder: HolderId,
    /// Who asks, as authenticated: only this principal (or an admin) may renew or release the
    /// lease, and the token names it.
    pub principal: Principal,
    /// Lease TTL, `MIN_TTL_MS..=MAX_TTL_MS`.
    pub ttl_ms: u64,
    /// How long to wait for a held lock, `0..=MAX_WAIT_MS`; 0 fails at once.
    pub wait_ms: u64,
    /// The lock's class, recorded with the lease.
    pub class: LockClass,
    /// The client's id of this acquire: a retry with the same id (and holder) while the lease
    /// it was granted is live returns that lease instead of failing or granting another.
    pub request_id: Option<RequestId>,
}

/// A granted lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease's id: unguessable, drawn from the granting coordinator's secret.
    pub id: LeaseId,
    /// The lock it owns.
    pub lock: LockName,
    /// Who holds it (the client's label).
    pub holder: HolderId,
    /// The authenticated principal that acquired it.
    #[serde(default)]
    pub principal: Principal,
    /// The ownership epoch it was granted at.
    pub epoch: Epoch,
    /// Its TTL; each renewal extends the lease to `now + ttl_ms`.
    pub ttl_ms: u64,
    /// The lock's class.
    pub class: LockClass,
    /// The id of the acquire it was granted to, if the client gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<RequestId>,
    /// When the coordinator may expire it, on the table's clock. Not durable: after a restart
    /// every lease restarts at its full TTL.
    pub expires_at: Millis,
    /// When it was granted, in ms since the Unix epoch, as the granting coordinator's wall
    /// clock read it ([`LeaseTable::set_wall_clock`]); 0 when unknown (a lease granted before
    /// grant times were recorded). Durable and replicated with the lease, so "held since"
    /// survives a restart and a failover. For people only: no decision reads it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub granted_unix_ms: u64,
    /// When it was last renewed, on the same clock; 0 when never (or before renewal times were
    /// recorded). For people (the console marks renewals on its timeline).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub renewed_unix_ms: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// What an acquire did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lock was free: here is the lease.
    Granted(Lease),
    /// The lock is held; the request waits in the lock's FIFO queue. The grant, or the wait's
    /// timeout, arrives later as an [`Event`] naming this waiter.
    Waiting(WaiterId),
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// The lease that ended.
    pub released: Lease,
}

/// Expected rejections of lease operations. None of them changes the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A field breaks a limit or a format rule.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// The lock is held and the request had no wait time (or its wait ran out).
    #[error("lock {lock} is held by {holder} at epoch {epoch}")]
    Held {
        /// The lock.
        lock: LockName,
        /// Its current holder.
        holder: HolderId,
        /// The current epoch.
        epoch: Epoch,
        /// Time left on the current lease, as the coordinator sees it.
        remaining_ms: u64,
    },
    /// The lock's waiter queue is full.
    #[error("lock {lock} already has {limit} waiters")]
    TooManyWaiters {
        /// The lock.
        lock: LockName,
        /// The queue's limit.
        limit: usize,
    },
    /// No live lease has this id: it never existed, was released, or expired.
    #[error("lease {0} is unknown, released or expired")]
    UnknownLease(LeaseId),
    /// The lease belongs to another principal: only its holder or an admin may renew or
    /// release it.
    #[error("lease {0} belongs to another principal")]
    NotHolder(LeaseId),
    /// The principal already holds or awaits its limit of leases.
    #[error(
        "principal {principal} already holds or awaits {limit} leases on this coordinator (its \
         limit; the ACL file sets it with `{principal} limits leases=N`)"
    )]
    PrincipalLimit {
        /// Who.
        principal: Principal,
        /// Its limit.
        limit: usize,
    },
    /// No epoch is left for another acquire: the counter (with the waiters queued) is at
    /// [`MAX_EPOCH`], the greatest epoch a resource can store. Renewals and releases go on.
    #[error(
        "no epoch left: the epoch counter {last} is at the end of the epochs' headroom (2^63 - 1, \
         the greatest fence a PostgreSQL resource stores); nothing more can be granted"
    )]
    EpochsExhausted {
        /// The epoch counter.
        last: Epoch,
    },
}

/// Something that happened to a lock, for delivery after the commit that made it durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A lease was granted; `waiter` names the queued acquire it answers, if any.
    Granted {
        /// The new lease.
        lease: Lease,
        /// The waiter it was granted to, or `None` for an immediate grant.
        waiter: Option<WaiterId>,
    },
    /// A lease ended by release.
    Released {
        /// The ended lease.
        lease: Lease,
    },
    /// A lease ended by expiry.
    Expired {
        /// The ended lease.
        lease: Lease,
    },
    /// A queued acquire ran out of wait time (or was cancelled) without a grant.
    WaitEnded {
        /// The waiter.
        waiter: WaiterId,
        /// The lock it waited for.
        lock: LockName,
    },
}

/// What must be made durable: the current lease of every lock touched since the last call
/// (`None` = the lock is free now) and the epoch counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changes {
    /// Locks whose lease changed, with their lease now.
    pub locks: Vec<(LockName, Option<Lease>)>,
    /// The greatest epoch granted so far.
    pub last_epoch: Epoch,
    /// How the leases that ended in this change ended, for the history every member keeps
    /// (a replicated store carries it with the change; the lease table leaves it empty, the
    /// engine fills it). For people: no decision reads it.
    pub endings: Vec<Ended>,
}

/// How a lease ended, as the history shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    /// The lock.
    pub lock: LockName,
    /// The lease's epoch.
    pub epoch: Epoch,
    /// `released`, `expired` or `broken`.
    pub kind: String,
    /// Who broke it (`broken` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

impl Changes {
    /// True when nothing needs to be written.
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }
}

/// A lock's state, for `describe` and `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockSummary {
    /// The lock.
    pub lock: LockName,
    /// Its lease, if held.
    pub lease: Option<Lease>,
    /// Time left on the lease, 0 when free.
    pub remaining_ms: u64,
    /// Acquires waiting for it.
    pub waiters: usize,
}

#[derive(Debug, Clone)]
struct Waiter {
    id: WaiterId,
    holder: HolderId,
    principal: Principal,
    ttl_ms: u64,
    class: LockClass,
    request_id: Option<RequestId>,
    deadline: Millis,
}

/// Who a grant goes to.
struct Grantee {
    holder: HolderId,
    principal: Principal,
    ttl_ms: u64,
    class: LockClass,
    request_id: Option<RequestId>,
}

#[derive(Debug, Default)]
struct LockState {
    lease: Option<Lease>,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug, Clone, Copy)]
enum Ending {
    Released,
    Expired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Deadline {
    Lease(LeaseId),
    Wait(WaiterId),
}

/// The lease table. See the module documentation for its contract and invariants.
#[derive(Debug, Default)]
pub struct LeaseTable {
    locks: BTreeMap<LockName, LockState>,
    /// Live leases by id, to find a lease's lock on renew and release.
    lease_locks: HashMap<LeaseId, LockName>,
    /// Queued acquires by id, to find a waiter's lock on cancel.
    waiter_locks: HashMap<WaiterId, LockName>,
    /// Every lease expiry and wait deadline, soonest first.
    deadlines: BTreeSet<(Millis, Deadline)>,
    last_epoch: Epoch,
    last_waiter_id: u64,
    /// Lease ids are derived from this secret and the epoch (see [`LeaseTable::lease_id_for`]).
    lease_secret: [u8; 32],
    dirty: BTreeSet<LockName>,
    events: Vec<Event>,
    /// Each principal's live leases plus queued acquires (no entry at 0).
    claims: HashMap<Principal, usize>,
    /// The wall clock's reading (ms since the Unix epoch) that grants record as their
    /// `granted_unix_ms`; set by the caller ([`LeaseTable::set_wall_clock`]), 0 until then.
    wall_ms: u64,
}

impl LeaseTable {
    /// An empty table whose next grant takes epoch 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a table from durable state after a restart: the epoch counter and the leases
    /// that were live. Every lease restarts at its full TTL from `now` (a TTL is a lower bound
    /// on how long a lease lasts, never shortened by a restart).
    ///
    /// Panics if the durable state contradicts itself (two leases on one lock, or a lease
    /// above the epoch counter): serving from such a state could reissue an epoch.
    pub fn restore(
        last_epoch: Epoch,
        leases: impl IntoIterator<Item = Lease>,
        now: Millis,
    ) -> Self {
        let mut table = Self {
            last_epoch,
            ..Self::default()
        };
        for mut lease in leases {
            assert!(
                lease.epoch <= last_epoch,
                "durable lease {} has epoch {} above the epoch counter {last_epoch}",
                lease.id,
                lease.epoch
            );
            lease.expires_at = now.saturating_add(lease.ttl_ms);
            let lock = lease.lock.clone();
            table
                .deadlines
                .insert((lease.expires_at, Deadline::Lease(lease.id)));
            table.lease_locks.insert(lease.id, lock.clone());
            table.claim(&lease.principal);
            let state = table.locks.entry(lock.clone()).or_default();
            assert!(
                state.lease.is_none(),
                "durable state holds two leases on lock {lock}"
            );
            state.lease = Some(lease);
        }
        table.check_invariants();
        table
    }

    /// Sets the secret that lease ids are derived from. A coordinator draws a fresh random
    /// secret at each start (ids stay unique: each grant takes a new epoch); a table left with
    /// the default all-zero secret gives predictable ids, which only tests and simulations
    /// want.
    pub fn set_lease_secret(&mut self, secret: [u8; 32]) {
        self.lease_secret = secret;
    }

    /// Sets the wall-clock time (ms since the Unix epoch) that the following grants record as
    /// their grant time. An input like `now`: the table reads no clock, and nothing it decides
    /// depends on this value (a clock that jumps only mislabels when a lease was granted).
    pub fn set_wall_clock(&mut self, unix_ms: u64) {
        self.wall_ms = unix_ms;
    }

    /// The id of the lease granted at `epoch`: 128 bits of SHA-256 over the secret and the
    /// epoch, so that one id tells nothing about another.
    fn lease_id_for(&self, epoch: Epoch) -> LeaseId {
        let digest = Sha256::new()
            .chain_update(b"palisade lease id v1")
            .chain_update(self.lease_secret)
            .chain_update(epoch.0.to_be_bytes())
            .finalize();
        let mut id = [0; 16];
        id.copy_from_slice(&digest[..16]);
        LeaseId(u128::from_be_bytes(id))
    }

    /// Raises the epoch counter to `floor` (never lowers it): the next grant takes an epoch
    /// above it. The raise is durable with the next commit that grants; until then a restart
    /// raises the counter again (the clock floor, [`crate::clock`]).
    pub fn raise_epoch_floor(&mut self, floor: Epoch) {
        if floor > self.last_epoch {
            self.last_epoch = floor;
        }
    }

    /// The greatest epoch granted so far (0 before the first grant).
    pub fn last_epoch(&self) -> Epoch {
        self.last_epoch
    }

    /// Number of live leases.
    pub fn lease_count(&self) -> usize {
        self.lease_locks.len()
    }

    /// Number of queued acquires, over all locks.
    pub fn waiter_count(&self) -> usize {
        self.waiter_locks.len()
    }

    /// The live lease with this id.
    pub fn lease(&self, id: LeaseId) -> Option<&Lease> {
        let lock = self.lease_locks.get(&id)?;
        self.locks.get(lock)?.lease.as_ref()
    }

    /// Leases `principal` holds plus acquires it has queued.
    pub fn claims_of(&self, principal: &Principal) -> usize {
        self.claims.get(principal).copied().unwrap_or(0)
    }

    /// Acquires `request.lock`: grants it when free, queues the request when held and the
    /// request may wait, and fails otherwise.
    pub fn acquire(
        &mut self,
        request: AcquireRequest,
        now: Millis,
    ) -> Result<AcquireOutcome, LeaseError> {
        self.acquire_within(request, now, None)
    }

    /// [`acquire`](Self::acquire), refused with [`LeaseError::PrincipalLimit`] when the
    /// principal already holds or awaits `max_claims` leases (a retry of the acquire a live
    /// lease answers is never refused: it takes nothing new). Counted here, in the one place
    /// that grants, the limit is exact: a principal never holds more than `max_claims` leases
    /// granted under it, however many of its acquires race.
    pub fn acquire_within(
        &mut self,
        request: AcquireRequest,
        now: Millis,
        max_claims: Option<usize>,
    ) -> Result<AcquireOutcome, LeaseError> {
        validate_ttl(request.ttl_ms)?;
        validate_wait(request.wait_ms)?;
        // Waits that ended by now must not hold a place in the queue.
        self.expire_due(now);
        let claims = self.claims_of(&request.principal);
        let within_limit = match max_claims {
            Some(limit) if claims >= limit => Err(LeaseError::PrincipalLimit {
                principal: request.principal.clone(),
                limit,
            }),
            _ => Ok(()),
        }
        .and(self.epochs_left());
        let state = self.locks.entry(request.lock.clone()).or_default();
        let Some(current) = &state.lease else {
            return self.grant_free(request, now, within_limit);
        };
        if request.request_id.is_some()
            && current.request_id == request.request_id
            && current.holder == request.holder
            && current.principal == request.principal
        {
            // A retry of the acquire this lease was granted to (its answer was lost to a
            // timeout or a leader change): the same lease, renewed now. The client counts
            // its validity from the retry's send time plus the TTL; answering the lease as it
            // was would let it believe in a lease that expires earlier, and a second holder
            // could be granted while it still writes (P8). The renewal is a change, so it is
            // committed before the answer, like any other.
            let id = current.id;
            let lease = self.renew(id, None, now)?;
            return Ok(AcquireOutcome::Granted(lease));
        }
        within_limit?;
        if request.wait_ms == 0 {
            return Err(LeaseError::Held {
                lock: request.lock,
                holder: current.holder.clone(),
                epoch: current.epoch,
                remaining_ms: current.expires_at.saturating_sub(now),
            });
        }
        self.enqueue(request, now)
    }

    /// Grants the free lock `request.lock` to `request`, unless its principal is at its limit
    /// (`within_limit`): then nothing is granted or queued, and no empty entry is left behind.
    fn grant_free(
        &mut self,
        request: AcquireRequest,
        now: Millis,
        within_limit: Result<(), LeaseError>,
    ) -> Result<AcquireOutcome, LeaseError> {
        if let Err(refused) = within_limit {
            self.locks.remove(&request.lock);
            return Err(refused);
        }
        debug_assert!(
            self.locks
                .get(&request.lock)
                .is_none_or(|state| state.waiters.is_empty()),
            "a free lock has waiters"
        );
        let lease = self.grant(
            &request.lock,
            Grantee {
                holder: request.holder,
                principal: request.principal,
                ttl_ms: request.ttl_ms,
                class: request.class,
                request_id: request.request_id,
            },
            now,
        );
        self.events.push(Event::Granted {
            lease: lease.clone(),
            waiter: None,
        });
        self.check_invariants();
        Ok(AcquireOutcome::Granted(lease))
    }

    /// Queues `request` behind the holder of `request.lock` until its wait ends, unless the
    /// lock's queue is full.
    fn enqueue(
        &mut self,
        request: AcquireRequest,
        now: Millis,
    ) -> Result<AcquireOutcome, LeaseError> {
        let state = self.locks.get_mut(&request.lock).expect("the lock is held");
        if state.waiters.len() >= MAX_WAITERS_PER_LOCK {
            return Err(LeaseError::TooManyWaiters {
                lock: request.lock,
                limit: MAX_WAITERS_PER_LOCK,
            });
        }
        self.last_waiter_id += 1;
        let waiter = Waiter {
            id: WaiterId(self.last_waiter_id),
            holder: request.holder,
            principal: request.principal,
            ttl_ms: request.ttl_ms,
            class: request.class,
            request_id: request.request_id,
            deadline: now.saturating_add(request.wait_ms),
        };
        let id = waiter.id;
        let principal = waiter.principal.clone();
        self.deadlines.insert((waiter.deadline, Deadline::Wait(id)));
        self.waiter_locks.insert(id, request.lock);
        state.waiters.push_back(waiter);
        self.claim(&principal);
        self.check_invariants();
        Ok(AcquireOutcome::Waiting(id))
    }

    /// Extends a live lease to `now + ttl_ms`. Expired leases cannot be renewed, even when
    /// the expiry has not been swept yet. `by`: the principal that asks, which must be the
    /// lease's; `None` for an admin (or the coordinator itself).
    pub fn renew(
        &mut self,
        id: LeaseId,
        by: Option<&Principal>,
        now: Millis,
    ) -> Result<Lease, LeaseError> {
        self.expire_due(now);
        let lock = self.lease_lock(id, by)?.clone();
        let state = self
            .locks
            .get_mut(&lock)
            .expect("lease index points to a lock");
        let lease = state
            .lease
            .as_mut()
            .expect("lease index points to a held lock");
        let renewed_until = now.saturating_add(lease.ttl_ms);
        self.deadlines
            .remove(&(lease.expires_at, Deadline::Lease(id)));
        self.deadlines.insert((renewed_until, Deadline::Lease(id)));
        lease.expires_at = renewed_until;
        lease.renewed_unix_ms = self.wall_ms;
        let lease = lease.clone();
        // A renewal is acknowledged as durable, so it is written like any other change: after
        // a crash the lease is restored (at full TTL) rather than lost.
        self.dirty.insert(lease.lock.clone());
        self.check_invariants();
        Ok(lease)
    }

    /// Ends a live lease and grants the lock to the next waiter, if any. `by` as for
    /// [`renew`](Self::renew).
    pub fn release(
        &mut self,
        id: LeaseId,
        by: Option<&Principal>,
        now: Millis,
    ) -> Result<ReleaseOutcome, LeaseError> {
        self.expire_due(now);
        let lock = self.lease_lock(id, by)?.clone();
        let released = self.end_lease(&lock, now, Ending::Released);
        self.check_invariants();
        Ok(ReleaseOutcome { released })
    }

    /// The lock of live lease `id`, if `by` may act on it.
    fn lease_lock(&self, id: LeaseId, by: Option<&Principal>) -> Result<&LockName, LeaseError> {
        let lock = self
            .lease_locks
            .get(&id)
            .ok_or(LeaseError::UnknownLease(id))?;
        if let Some(principal) = by {
            let lease = self.locks.get(lock).and_then(|s| s.lease.as_ref());
            if lease.is_some_and(|lease| lease.principal != *principal) {
                return Err(LeaseError::NotHolder(id));
            }
        }
        Ok(lock)
    }

    /// Withdraws a queued acquire (its client went away). Unknown ids are ignored: the waiter
    /// may have been granted or timed out in the meantime.
    pub fn cancel_wait(&mut self, id: WaiterId) {
        let Some(lock) = self.waiter_locks.remove(&id) else {
            return;
        };
        let state = self
            .locks
            .get_mut(&lock)
            .expect("waiter index points to a lock");
        let position = state.waiters.iter().position(|w| w.id == id);
        let waiter = state
            .waiters
            .remove(position.expect("waiter is queued"))
            .expect("queued");
        self.deadlines
            .remove(&(waiter.deadline, Deadline::Wait(id)));
        self.unclaim(&waiter.principal);
        self.events.push(Event::WaitEnded { waiter: id, lock });
        self.check_invariants();
    }

    /// Expires every lease and ends every wait whose deadline is at or before `now`.
    pub fn expire_due(&mut self, now: Millis) {
        while let Some(&(at, deadline)) = self.deadlines.first() {
            if at > now {
                break;
            }
            match deadline {
                Deadline::Lease(id) => {
                    let lock = self.lease_locks[&id].clone();
                    self.end_lease(&lock, now, Ending::Expired);
                }
                Deadline::Wait(id) => self.cancel_wait(id),
            }
        }
        self.check_invariants();
    }

    /// The soonest lease expiry or wait deadline, for the runtime's timer.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// The state of one lock (free locks have no entry and read as free).
    pub fn describe(&self, lock: &LockName, now: Millis) -> LockSummary {
        match self.locks.get(lock) {
            Some(state) => summarize(lock, state, now),
            None => LockSummary {
                lock: lock.clone(),
                lease: None,
                remaining_ms: 0,
                waiters: 0,
            },
        }
    }

    /// Up to `limit` locks that are held or have waiters, in name order.
    pub fn list(&self, limit: usize, now: Millis) -> Vec<LockSummary> {
        self.locks
            .iter()
            .take(limit)
            .map(|(lock, state)| summarize(lock, state, now))
            .collect()
    }

    /// Drains what changed since the last call, for the durable write that must precede every
    /// acknowledgement of those changes.
    pub fn take_changes(&mut self) -> Changes {
        let locks = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|lock| {
                let lease = self.locks.get(&lock).and_then(|s| s.lease.clone());
                (lock, lease)
            })
            .collect();
        Changes {
            locks,
            last_epoch: self.last_epoch,
            endings: Vec::new(),
        }
    }

    /// Drains the events since the last call, in the order they happened.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Refuses a new acquire when the epochs left could not serve it and every queued waiter:
    /// each admitted acquire takes at most one epoch, so `last_epoch + waiters` never passes
    /// [`MAX_EPOCH`] and a hand-off to a waiter never runs out ([`Self::grant`]).
    fn epochs_left(&self) -> Result<(), LeaseError> {
        let promised = self.last_epoch.0.saturating_add(self.waiter_count() as u64);
        if promised >= MAX_EPOCH {
            return Err(LeaseError::EpochsExhausted {
                last: self.last_epoch,
            });
        }
        Ok(())
    }

    /// Takes the next epoch and installs a lease for it on a free lock.
    fn grant(&mut self, lock: &LockName, grantee: Grantee, now: Millis) -> Lease {
        let Grantee {
            holder,
            principal,
            ttl_ms,
            class,
            request_id,
        } = grantee;
        let epoch = Epoch(
            self.last_epoch
                .0
                .checked_add(1)
                .filter(|epoch| *epoch <= MAX_EPOCH)
                .expect("admission keeps last_epoch + waiters at most MAX_EPOCH (epochs_left)"),
        );
        self.last_epoch = epoch;
        let lease = Lease {
            id: self.lease_id_for(epoch),
            lock: lock.clone(),
            holder,
            principal,
            epoch,
            ttl_ms,
            class,
            request_id,
            expires_at: now.saturating_add(ttl_ms),
            granted_unix_ms: self.wall_ms,
            renewed_unix_ms: 0,
        };
        let state = self
            .locks
            .get_mut(lock)
            .expect("grant on an existing lock entry");
        debug_assert!(state.lease.is_none(), "grant on a held lock");
        state.lease = Some(lease.clone());
        self.lease_locks.insert(lease.id, lock.clone());
        self.deadlines
            .insert((lease.expires_at, Deadline::Lease(lease.id)));
        self.dirty.insert(lock.clone());
        self.claim(&lease.principal);
        lease
    }

    fn claim(&mut self, principal: &Principal) {
        *self.claims.entry(principal.clone()).or_insert(0) += 1;
    }

    fn unclaim(&mut self, principal: &Principal) {
        let count = self
            .claims
            .get_mut(principal)
            .expect("a claim of a principal with none");
        *count -= 1;
        if *count == 0 {
            self.claims.remove(principal);
        }
    }

    /// Removes the lock's lease (reporting how it ended), then hands the lock to the first
    /// waiter whose wait has not ended, or drops the lock's entry when nobody waits.
    fn end_lease(&mut self, lock: &LockName, now: Millis, ending: Ending) -> Lease {
        let state = self
            .locks
            .get_mut(lock)
            .expect("ending a lease of a known lock");
        let lease = state.lease.take().expect("ending a held lock");
        self.lease_locks.remove(&lease.id);
        self.unclaim(&lease.principal);
        self.deadlines
            .remove(&(lease.expires_at, Deadline::Lease(lease.id)));
        self.dirty.insert(lock.clone());
        self.events.push(match ending {
            Ending::Released => Event::Released {
                lease: lease.clone(),
            },
            Ending::Expired => Event::Expired {
                lease: lease.clone(),
            },
        });
        while let Some(waiter) = self.locks.get_mut(lock).and_then(|s| s.waiters.pop_front()) {
            self.waiter_locks.remove(&waiter.id);
            self.deadlines
                .remove(&(waiter.deadline, Deadline::Wait(waiter.id)));
            // The waiter's claim ends here; a grant below makes it a lease's claim.
            self.unclaim(&waiter.principal);
            if waiter.deadline <= now {
                self.events.push(Event::WaitEnded {
                    waiter: waiter.id,
                    lock: lock.clone(),
                });
                continue;
            }
            let grantee = Grantee {
                holder: waiter.holder,
                principal: waiter.principal,
                ttl_ms: waiter.ttl_ms,
                class: waiter.class,
                request_id: waiter.request_id,
            };
            let granted = self.grant(lock, grantee, now);
            self.events.push(Event::Granted {
                lease: granted,
                waiter: Some(waiter.id),
            });
            return lease;
        }
        self.locks.remove(lock);
        lease
    }

    /// Checks the module's invariants (debug builds only; the check walks the whole table).
    pub fn check_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let mut leases = 0;
        let mut waiters = 0;
        let mut claims: HashMap<&Principal, usize> = HashMap::new();
        for (lock, state) in &self.locks {
            let queued = state.waiters.iter().map(|w| &w.principal);
            for principal in state.lease.iter().map(|l| &l.principal).chain(queued) {
                *claims.entry(principal).or_insert(0) += 1;
            }
            assert!(
                state.lease.is_some() || !state.waiters.is_empty(),
                "lock {lock} is free with no waiters but still has an entry"
            );
            if let Some(lease) = &state.lease {
                leases += 1;
                assert_eq!(&lease.lock, lock);
                assert!(
                    lease.epoch <= self.last_epoch,
                    "lease above the epoch counter"
                );
                assert_eq!(self.lease_locks.get(&lease.id), Some(lock));
                assert!(self
                    .deadlines
                    .contains(&(lease.expires_at, Deadline::Lease(lease.id))));
            }
            for waiter in &state.waiters {
                waiters += 1;
                assert_eq!(self.waiter_locks.get(&waiter.id), Some(lock));
                assert!(self
                    .deadlines
                    .contains(&(waiter.deadline, Deadline::Wait(waiter.id))));
            }
        }
        assert_eq!(leases, self.lease_locks.len());
        assert_eq!(waiters, self.waiter_locks.len());
        assert_eq!(leases + waiters, self.deadlines.len());
        assert_eq!(claims.len(), self.claims.len());
        for (principal, count) in claims {
            assert_eq!(
                self.claims.get(principal),
                Some(&count),
                "claims of {principal}"
            );
        }
    }
}

fn summarize(lock: &LockName, state: &LockState, now: Millis) -> LockSummary {
    LockSummary {
        lock: lock.clone(),
        remaining_ms: state
            .lease
            .as_ref()
            .map_or(0, |l| l.expires_at.saturating_sub(now)),
        lease: state.lease.clone(),
        waiters: state.waiters.len(),
    }
}

fn validate_ttl(ttl_ms: u64) -> Result<(), InvalidInput> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(InvalidInput(format!(
            "ttl_ms {ttl_ms} is outside {MIN_TTL_MS}..={MAX_TTL_MS} (10 ms to 1 hour)"
        )));
    }
    Ok(())
}

fn validate_wait(wait_ms: u64) -> Result<(), InvalidInput> {
    if wait_ms > MAX_WAIT_MS {
        return Err(InvalidInput(format!(
            "wait_ms {wait_ms} is above the maximum {MAX_WAIT_MS} (5 minutes)"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "lease_table_tests.rs"]
mod tests;
