//! The engine: one task that owns the lease table and the store, and turns concurrent
//! requests into group commits.
//!
//! Lifecycle of a request: an API handler sends it over a bounded queue ([`CoordinatorHandle`]);
//! the engine takes every queued request (up to [`MAX_BATCH`]), applies them in order to the
//! lease table with the same `now`, writes the resulting changes in **one** durable commit, and
//! only then answers them — so one fsync acknowledges a whole batch, and nothing is ever
//! acknowledged before it is on disk (P1, P8). Reads (`describe`, `list`) are answered after the
//! same commit, so they never show a state that could still be lost.
//!
//! Waiting acquires stay in the table's FIFO queue; their reply channels stay here. When a
//! release or an expiry hands a lock to a waiter whose client has gone away, the engine releases
//! that lease again *before* the commit, so abandoned waits do not block a lock for a TTL.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_core::clock::{self, WallClock};
use palisade_core::{
    AcquireOutcome, AcquireRequest, Changes, Epoch, Event, Lease, LeaseError, LeaseId, LeaseTable,
    LockName, LockSummary, Principal, WaiterId,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::metrics::{Metrics, TransitionLabels};
use crate::store::{LeaseStore, StoreError};

/// Most requests waiting for the engine. Senders wait (back-pressure) when it is full.
pub const REQUEST_QUEUE_CAPACITY: usize = 16_384;
/// Most requests applied in one commit; bounds the latency a huge burst adds to its first
/// request and the size of one write transaction.
pub const MAX_BATCH: usize = 4_096;
/// Ownership transitions buffered for watchers; a watcher that falls further behind is
/// disconnected (it can reconnect and read the current state).
pub const WATCH_BUFFER: usize = 4_096;
/// Locks whose last granted epoch an engine remembers for floors; past this it forgets them
/// all and their floors fall back to the counter (safe: a higher floor only refuses more).
pub const MAX_REMEMBERED_LOCKS: usize = 100_000;
/// Most locks one `list` returns.
pub const MAX_LIST: usize = 10_000;
/// How often, at most, a queued acquire whose client went away (socket closed, request
/// cancelled) is noticed while nothing else happens; every batch also drops them first. Until
/// then it holds a place in its lock's bounded queue.
pub const ABANDONED_WAITER_SWEEP: Duration = Duration::from_millis(200);

/// Why a coordinator operation failed. Not `non_exhaustive`: each front end maps every
/// variant to its answer, and a new one must not fall into a wildcard unnoticed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorError {
    /// An expected rejection from the lease table (bad input, held, queue full, unknown lease).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The acquire waited its full wait time without the lock becoming free.
    #[error("lock {lock} is still held after waiting")]
    WaitTimedOut {
        /// The lock.
        lock: LockName,
    },
    /// The coordinator is starting, stopping, or stopped by a storage failure.
    #[error("coordinator unavailable: {0}")]
    Unavailable(String),
    /// The lock policy refuses the acquire (a critical lock asked as efficiency, or one with no
    /// boundary under `--require-policy`).
    #[error(transparent)]
    Refused(#[from] palisade_audit::PolicyRefusal),
    /// The caller may no longer acquire the lease's lock (the ACL changed): the lease is not
    /// renewed and ends at its deadline.
    #[error(
        "the caller no longer has the acquire right on lock {lock} (the ACL changed): the lease \
         is not renewed and ends at its deadline"
    )]
    LostRight {
        /// The lease's lock.
        lock: LockName,
    },
    /// This node is a cluster member that does not lead: it never decides. The request was not
    /// applied; send it to the leader (when one is known).
    #[error("{}", not_leader_message(.leader))]
    NotLeader {
        /// The leader this node knows of.
        leader: Option<LeaderHint>,
    },
}

/// The leader a follower points clients to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderHint {
    /// Its node id.
    pub id: u64,
    /// Its client URL (`http://HOST:PORT`).
    pub url: String,
}

fn not_leader_message(leader: &Option<LeaderHint>) -> String {
    match leader {
        Some(leader) => format!(
            "this node is not the leader; the leader is node {} at {}",
            leader.id, leader.url
        ),
        None => {
            "this node is not the leader and no leader is known (election under way, or no quorum)"
                .into()
        }
    }
}

pub use crate::transition::{BreakOutcome, Transition, TransitionKind};

type Reply<T> = oneshot::Sender<Result<T, CoordinatorError>>;

enum Request {
    Acquire(AcquireRequest, Option<usize>, Reply<Lease>),
    Renew(LeaseId, Option<Principal>, Option<RightCheck>, Reply<Lease>),
    Release(LeaseId, Option<Principal>, Reply<Lease>),
    Break(LockName, Principal, Option<Epoch>, Reply<BreakOutcome>),
    Describe(LockName, Reply<LockSummary>),
    List(usize, Reply<Vec<LockSummary>>),
    Counter(Reply<palisade_core::Epoch>),
    Floor(LockName, Reply<palisade_core::Epoch>),
}

/// Whether the caller of a renew may still acquire the lease's lock (run on the engine's
/// thread: it must be quick and never block).
pub type RightCheck = Box<dyn Fn(&LockName) -> bool + Send>;

/// A cheap, cloneable handle to the engine.
#[derive(Clone)]
pub struct CoordinatorHandle {
    requests: mpsc::Sender<Request>,
    transitions: broadcast::Sender<Transition>,
    ready: Arc<AtomicBool>,
}

impl CoordinatorHandle {
    /// Acquires a lock; resolves when granted (durably), refused, or the wait ends.
    pub async fn acquire(&self, request: AcquireRequest) -> Result<Lease, CoordinatorError> {
        self.acquire_within(request, None).await
    }

    /// [`acquire`](Self::acquire), refused with [`LeaseError::PrincipalLimit`] when the
    /// principal already holds or awaits `max_claims` leases (counted by the lease table, in
    /// the same step as the grant: exact however many acquires race).
    pub async fn acquire_within(
        &self,
        request: AcquireRequest,
        max_claims: Option<usize>,
    ) -> Result<Lease, CoordinatorError> {
        self.call(|reply| Request::Acquire(request, max_claims, reply))
            .await
    }

    /// Renews a lease by its full TTL (durably). `by`: the principal that asks, which must
    /// hold the lease; `None` for an admin.
    pub async fn renew(
        &self,
        id: LeaseId,
        by: Option<Principal>,
    ) -> Result<Lease, CoordinatorError> {
        self.renew_checked(id, by, None).await
    }

    /// [`renew`](Self::renew), refused with [`CoordinatorError::LostRight`] when `allowed`
    /// says the caller may no longer acquire the lease's lock (its ACL changed since the
    /// acquire): a lease never outlives its principal's right by more than one TTL.
    pub async fn renew_checked(
        &self,
        id: LeaseId,
        by: Option<Principal>,
        allowed: Option<RightCheck>,
    ) -> Result<Lease, CoordinatorError> {
        self.call(|reply| Request::Renew(id, by, allowed, reply))
            .await
    }

    /// Releases a lease (durably) and returns it. `by` as for [`renew`](Self::renew).
    pub async fn release(
        &self,
        id: LeaseId,
        by: Option<Principal>,
    ) -> Result<Lease, CoordinatorError> {
        self.call(|reply| Request::Release(id, by, reply)).await
    }

    /// Ends the lock's lease now (`palisade lock break`; the caller checked that `by` is an
    /// admin of the lock), durably: whoever holds it, or only the lease at `epoch` when given
    /// (so that a holder that changed in between is not broken by mistake). Watchers and the
    /// feed see a [`TransitionKind::Broken`] naming `by`.
    pub async fn break_lock(
        &self,
        lock: LockName,
        by: Principal,
        epoch: Option<Epoch>,
    ) -> Result<BreakOutcome, CoordinatorError> {
        self.call(|reply| Request::Break(lock, by, epoch, reply))
            .await
    }

    /// The durable state of one lock.
    pub async fn describe(&self, lock: LockName) -> Result<LockSummary, CoordinatorError> {
        self.call(|reply| Request::Describe(lock, reply)).await
    }

    /// Up to `limit` (at most [`MAX_LIST`]) held or awaited locks, by name.
    pub async fn list(&self, limit: usize) -> Result<Vec<LockSummary>, CoordinatorError> {
        self.call(|reply| Request::List(limit.min(MAX_LIST), reply))
            .await
    }

    /// The epoch counter, answered once it is durable (every epoch issued so far is at most
    /// it): what a backup records.
    pub async fn epoch_counter(&self) -> Result<palisade_core::Epoch, CoordinatorError> {
        self.call(Request::Counter).await
    }

    /// The lock's floor: every owner below it is superseded — the held lease's epoch, else
    /// the last epoch this engine granted for the lock, else (a lock it never granted, or
    /// forgotten past [`MAX_REMEMBERED_LOCKS`], or granted by an earlier engine) one above
    /// the counter. Answered after the batch's commit, in one step with the state it reads.
    pub async fn floor(&self, lock: LockName) -> Result<palisade_core::Epoch, CoordinatorError> {
        self.call(|reply| Request::Floor(lock, reply)).await
    }

    /// Ownership transitions from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.transitions.subscribe()
    }

    /// True while the engine is serving.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<T, CoordinatorError> {
        let stopped = || CoordinatorError::Unavailable("the coordinator is stopping".into());
        let (reply, response) = oneshot::channel();
        self.requests
            .send(make(reply))
            .await
            .map_err(|_| stopped())?;
        response.await.map_err(|_| stopped())?
    }
}

/// An answer held back until the commit that covers it.
trait Deferred: Send {
    /// Sends the answer, or `failure` when the commit failed.
    fn deliver(self: Box<Self>, failure: Option<&CoordinatorError>);
}

struct Answer<T>(Reply<T>, Result<T, CoordinatorError>);

impl<T: Send> Deferred for Answer<T> {
    fn deliver(self: Box<Self>, failure: Option<&CoordinatorError>) {
        let result = match failure {
            Some(error) => Err(error.clone()),
            None => self.1,
        };
        // The client may have gone away; nothing to do then.
        let _ = self.0.send(result);
    }
}

/// Starts the engine over `store` (loading its durable state first) and returns its handle
/// and the task, which ends on `shutdown` or with the storage error that stopped it.
pub fn start<S: LeaseStore>(
    store: S,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    clock: Arc<dyn WallClock>,
) -> Result<
    (
        CoordinatorHandle,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ),
    StoreError,
> {
    let (transitions, _) = broadcast::channel(WATCH_BUFFER);
    start_with(store, metrics, shutdown, transitions, clock)
}

/// [`start`], publishing transitions on an existing channel (a cluster member starts a new
/// engine each time it becomes leader; its watchers stay subscribed to the same channel).
///
/// The epoch counter starts at the clock floor when the stored one is lower
/// ([`palisade_core::clock`]): whatever the store holds — a volume put back from a snapshot,
/// a cluster whose every member was — the next epoch is above every epoch acknowledged
/// before. A stored counter further ahead of `clock` than the engine would wait
/// ([`clock::MAX_CLOCK_WAIT_MS`]) is refused: the clock was stepped back.
pub fn start_with<S: LeaseStore>(
    store: S,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    transitions: broadcast::Sender<Transition>,
    clock: Arc<dyn WallClock>,
) -> Result<
    (
        CoordinatorHandle,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ),
    StoreError,
> {
    let rules = ClockRules {
        clock,
        counter_ahead: CounterAhead::Refuse,
    };
    start_with_rules(store, metrics, shutdown, transitions, rules)
}

/// The wall clock an engine reads, and what it does with a counter ahead of it.
#[derive(Debug, Clone)]
pub struct ClockRules {
    /// The clock the floor and the ceiling are read from ([`palisade_core::clock`]).
    pub clock: Arc<dyn WallClock>,
    /// What a counter ahead of the clock by more than the engine waits does.
    pub counter_ahead: CounterAhead,
}

/// What an engine does when its epoch counter is ahead of its wall clock by more than it
/// waits ([`clock::MAX_CLOCK_WAIT_MS`]): a clock that ran ahead raised it, or this clock went
/// back. Issuing above the counter anyway never reissues an epoch (P1: the counter only
/// rises); what it gives up until the clock passes the counter is the clock floor's cover of
/// a volume put back (P6), which is why it is never the default of a single node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterAhead {
    /// Refuse to start, and stop issuing while serving ([`StoreError::CounterAhead`],
    /// [`StoreError::ClockBehind`]): a single node, where no peer can say which is wrong.
    Refuse,
    /// The operator said this clock is right (`palisade serve --resume-counter-ahead`): epochs
    /// rise from counters up to this one's millisecond (plus [`clock::MAX_CLOCK_WAIT_MS`])
    /// with no wait for the clock, until the clock passes the counter; then the engine is back
    /// to [`CounterAhead::Refuse`] by itself. A counter raised further than that (by another
    /// clock ahead since) is refused again.
    Accepted(Epoch),
    /// A cluster leader whose clock agrees with a majority of the members: a clock behind the
    /// counter by up to `max_wait_ms` (the maximum offset) is waited out; further, the counter
    /// was raised by a clock that was wrong, and epochs rise from it with no wait.
    Outvoted {
        /// The longest wait for the clock (the cluster's maximum clock offset).
        max_wait_ms: u64,
    },
}

impl CounterAhead {
    /// True when a counter `behind_ms` ahead of the clock is issued above at once.
    fn waives(self, counter: Epoch, behind_ms: u64) -> bool {
        match self {
            CounterAhead::Refuse => false,
            CounterAhead::Accepted(accepted) => {
                clock::epoch_time_ms(counter.0)
                    <= clock::epoch_time_ms(accepted.0).saturating_add(clock::MAX_CLOCK_WAIT_MS)
            }
            CounterAhead::Outvoted { max_wait_ms } => {
                behind_ms > max_wait_ms.min(clock::MAX_CLOCK_WAIT_MS)
            }
        }
    }
}

/// [`start_with`], with the clock's rules spelled out: the counter ahead of the clock refused
/// (a single node), accepted by the operator, or outvoted (a cluster leader).
pub fn start_with_rules<S: LeaseStore>(
    store: S,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    transitions: broadcast::Sender<Transition>,
    rules: ClockRules,
) -> Result<
    (
        CoordinatorHandle,
        tokio::task::JoinHandle<Result<(), StoreError>>,
    ),
    StoreError,
> {
    let ClockRules {
        clock,
        counter_ahead,
    } = rules;
    let durable = store.load()?;
    let start = Instant::now();
    let now_ms = clock.now_ms();
    let clock_floor = clock::checked_floor_at(now_ms)?;
    check_counter_ahead(durable.last_epoch, now_ms, counter_ahead, &metrics)?;
    let mut table = LeaseTable::restore(durable.last_epoch, durable.leases, 0);
    table.set_lease_secret(crate::lease_secret::lease_secret());
    table.raise_epoch_floor(Epoch(clock_floor));
    tracing::info!(
        stored_epoch = %durable.last_epoch,
        last_epoch = %table.last_epoch(),
        leases = table.lease_count(),
        "loaded durable state; every lease restarts at its full TTL, and the epoch counter \
         starts at least at the clock floor"
    );
    let (requests, receiver) = mpsc::channel(REQUEST_QUEUE_CAPACITY);
    let ready = Arc::new(AtomicBool::new(true));
    let handle = CoordinatorHandle {
        requests,
        transitions: transitions.clone(),
        ready: ready.clone(),
    };
    // A store whose commit blocks on the disk gets a thread of its own for the engine, which
    // then commits inline: one thread hop fewer per batch than a commit on a blocking-pool
    // thread (the engine would wake it, then be woken by it).
    let own_thread = store.dedicated_thread();
    let engine = Engine {
        counter_ahead,
        committed_epoch: durable.last_epoch,
        last_granted: HashMap::new(),
        table,
        clock,
        store: Some(store),
        own_thread,
        waiting: HashMap::new(),
        receiver,
        breaking: HashMap::new(),
        transitions,
        metrics,
        start,
        ready,
    };
    let task = if own_thread {
        spawn_on_own_thread(engine.run(shutdown))?
    } else {
        tokio::spawn(engine.run(shutdown))
    };
    Ok((handle, task))
}

/// At a start: refuses a counter further ahead of the clock than the engine waits, unless
/// the rules issue above it (then says so, once, and counts it).
fn check_counter_ahead(
    counter: Epoch,
    now_ms: u64,
    rules: CounterAhead,
    metrics: &Metrics,
) -> Result<(), StoreError> {
    let behind_ms = clock::wait_ms(counter.0, now_ms);
    if behind_ms <= clock::MAX_CLOCK_WAIT_MS {
        return Ok(());
    }
    if !rules.waives(counter, behind_ms) {
        return Err(StoreError::CounterAhead {
            counter: counter.0,
            now_ms,
        });
    }
    metrics.clock_ceiling_waived.inc();
    tracing::warn!(
        counter = counter.0,
        ahead_ms = behind_ms,
        counter_time = %clock::display_ms(clock::epoch_time_ms(counter.0)),
        rules = ?rules,
        "the epoch counter is ahead of the clock (raised by a clock that ran ahead): epochs \
         rise from the counter with no wait for the clock until the clock passes it; until \
         then the clock floor does not cover a volume put back"
    );
    Ok(())
}

/// Runs the engine on a dedicated OS thread with a single-threaded runtime of its own (timers
/// and I/O enabled); the returned task, on the caller's runtime, ends with it.
fn spawn_on_own_thread(
    run: impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static,
) -> Result<tokio::task::JoinHandle<Result<(), StoreError>>, StoreError> {
    let io_error = |e: std::io::Error| StoreError::Storage(redb::StorageError::Io(e).into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_error)?;
    let (done, finished) = oneshot::channel();
    std::thread::Builder::new()
        .name("palisade-engine".into())
        .spawn(move || {
            let _ = done.send(runtime.block_on(run));
        })
        .map_err(io_error)?;
    Ok(tokio::spawn(async move {
        finished
            .await
            .unwrap_or_else(|_| Err(StoreError::Corrupt("the engine thread panicked".into())))
    }))
}

/// Waits until the wall clock has passed `counter`'s ceiling ([`clock::issuable`]), so
/// that no start after this commit can floor the counter at or below an epoch it
/// acknowledges. Right after a start that is under a millisecond; after a clock step back
/// or a leader change to a member whose clock runs behind, as long as the step (at most
/// [`clock::MAX_CLOCK_WAIT_MS`], after which the commit is refused) — unless the rules
/// (`counter_ahead`) issue above the counter at once; once the clock has passed the counter,
/// an operator's acceptance has done its work and the rules are back to refusing.
async fn wait_for_clock(
    clock: Arc<dyn WallClock>,
    metrics: Arc<Metrics>,
    counter_ahead: &mut CounterAhead,
    counter: Epoch,
) -> Result<(), StoreError> {
    loop {
        let now_ms = clock.now_ms();
        let behind_ms = clock::wait_ms(counter.0, now_ms);
        if behind_ms == 0 {
            if matches!(counter_ahead, CounterAhead::Accepted(_)) {
                tracing::info!(
                    counter = counter.0,
                    "the clock has passed the epoch counter accepted ahead of it: the clock \
                     floor covers every epoch again"
                );
                *counter_ahead = CounterAhead::Refuse;
            }
            return Ok(());
        }
        if counter_ahead.waives(counter, behind_ms) {
            if let CounterAhead::Outvoted { .. } = counter_ahead {
                metrics.clock_ceiling_waived.inc();
                tracing::warn!(
                    behind_ms,
                    counter = counter.0,
                    "the epoch counter is ahead of this leader's clock, which a majority \
                     agrees with: issuing above the counter without waiting"
                );
            }
            return Ok(());
        }
        if behind_ms > clock::MAX_CLOCK_WAIT_MS {
            return Err(StoreError::ClockBehind {
                behind_ms,
                counter: counter.0,
                now_ms,
            });
        }
        if behind_ms > 1 {
            tracing::warn!(
                behind_ms,
                counter = counter.0,
                "the wall clock is behind the epoch counter; waiting for it before issuing"
            );
            metrics.clock_waits.inc();
        }
        tokio::time::sleep(Duration::from_millis(behind_ms)).await;
    }
}

pub use crate::steppable_clock::SteppableClock;

struct Engine<S> {
    table: LeaseTable,
    /// What a counter ahead of the clock does ([`CounterAhead`]).
    counter_ahead: CounterAhead,
    /// The wall clock the epochs' floor and ceiling are read from ([`palisade_core::clock`]).
    clock: Arc<dyn WallClock>,
    /// The epoch counter as last made durable: a commit that raises it past this waits for
    /// the clock first.
    committed_epoch: Epoch,
    /// The last epoch granted per lock (for [`CoordinatorHandle::floor`]), at most
    /// [`MAX_REMEMBERED_LOCKS`].
    last_granted: HashMap<LockName, Epoch>,
    /// The store; `None` only while a commit runs on a blocking thread.
    store: Option<S>,
    /// The engine runs on a thread of its own: a blocking commit runs inline.
    own_thread: bool,
    /// Reply channels of acquires queued in the table, with when they arrived.
    waiting: HashMap<WaiterId, Reply<Lease>>,
    receiver: mpsc::Receiver<Request>,
    /// Leases broken in the batch being processed, with who broke them.
    breaking: HashMap<LeaseId, Principal>,
    transitions: broadcast::Sender<Transition>,
    metrics: Arc<Metrics>,
    /// Origin of the table's clock.
    start: Instant,
    ready: Arc<AtomicBool>,
}

impl<S: LeaseStore> Engine<S> {
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), StoreError> {
        let mut batch = Vec::new();
        // The counter starts at the clock's floor (or above): let the clock pass it once, here
        // (a millisecond), rather than in the first commit that issues an epoch.
        let floor = self.table.last_epoch();
        let waited = tokio::select! {
            biased;
            () = shutdown_requested(&mut shutdown) => None,
            waited = wait_for_clock(
                self.clock.clone(),
                self.metrics.clone(),
                &mut self.counter_ahead,
                floor,
            ) => Some(waited),
        };
        let result = match waited {
            None => Ok(()),
            Some(Ok(())) => {
                // Restored leases run their full TTL from when this engine begins deciding.
                self.start = Instant::now();
                self.serve(&mut batch, &mut shutdown).await
            }
            Some(Err(error)) => {
                tracing::error!(%error, "this engine does not start deciding");
                Err(error)
            }
        };
        self.ready.store(false, Ordering::Release);
        self.receiver.close();
        let stopping = CoordinatorError::Unavailable("the coordinator is stopping".into());
        for (_, reply) in self.waiting.drain() {
            let _ = reply.send(Err(stopping.clone()));
        }
        result
    }

    /// Takes batches of requests and processes them until shutdown or a failed commit.
    async fn serve(
        &mut self,
        batch: &mut Vec<Request>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), StoreError> {
        loop {
            let mut deadline = self.table.next_deadline().map(|ms| self.instant_of(ms));
            if !self.waiting.is_empty() {
                let sweep = Instant::now() + ABANDONED_WAITER_SWEEP;
                deadline = Some(deadline.map_or(sweep, |d| d.min(sweep)));
            }
            tokio::select! {
                biased;
                () = shutdown_requested(shutdown) => return Ok(()),
                received = self.receiver.recv() => match received {
                    Some(request) => batch.push(request),
                    None => return Ok(()),
                },
                () = sleep_until_optional(deadline) => {}
            }
            while batch.len() < MAX_BATCH {
                match self.receiver.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            if let Err(error) = self.process(std::mem::take(batch)).await {
                tracing::error!(%error, "commit failed; this engine stops deciding");
                return Err(error);
            }
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn instant_of(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// Applies a batch, commits its changes once (or, changing nothing, confirms the store's
    /// authority), then answers it.
    async fn process(&mut self, batch: Vec<Request>) -> Result<(), StoreError> {
        let now = self.now_ms();
        self.table.set_wall_clock(self.clock.now_ms());
        self.breaking.clear();
        self.drop_abandoned_waiters();
        self.table.expire_due(now);
        let batch_size = batch.len();
        let mut answers: Vec<Box<dyn Deferred>> = Vec::with_capacity(batch_size);
        for request in batch {
            if let Some(answer) = self.apply(request, now) {
                answers.push(answer);
            }
        }
        let (events, vanished) = self.collect_events(now);
        let mut changes = self.table.take_changes();
        changes.endings = self.endings(&events, &vanished);
        if !changes.is_empty() {
            if let Err(error) = self.commit(changes, batch_size).await {
                let failure = match &error {
                    StoreError::Replication(why) => CoordinatorError::Unavailable(format!(
                        "not committed (outcome unknown; retry with the same request id): {why}"
                    )),
                    StoreError::ClockBehind { .. } | StoreError::Headroom(_) => {
                        CoordinatorError::Unavailable(error.to_string())
                    }
                    _ => CoordinatorError::Unavailable(format!("storage failed: {error}")),
                };
                answers.into_iter().for_each(|a| a.deliver(Some(&failure)));
                return Err(error);
            }
        } else if !answers.is_empty() {
            // Nothing to commit, so no commit would fail if this engine's leader was deposed:
            // its authority is confirmed before it answers. Unconfirmed, the answers fail and
            // the engine carries on (the supervisor stops it once the node no longer leads).
            if let Err(error) = self.confirm().await {
                let failure =
                    CoordinatorError::Unavailable(format!("cannot answer from this node: {error}"));
                answers.drain(..).for_each(|a| a.deliver(Some(&failure)));
            }
        }
        answers.into_iter().for_each(|a| a.deliver(None));
        self.publish(events, &vanished, now);
        self.metrics
            .leases_active
            .set(self.table.lease_count() as i64);
        self.metrics.waiters.set(self.table.waiter_count() as i64);
        Ok(())
    }

    /// Makes `changes` durable: awaited on this task (a replicated store), inline on the
    /// engine's own thread (a disk), on a blocking thread (a disk, engine on a shared runtime)
    /// or inline (memory).
    async fn commit(&mut self, changes: Changes, batch_size: usize) -> Result<(), StoreError> {
        if changes.last_epoch > self.committed_epoch {
            wait_for_clock(
                self.clock.clone(),
                self.metrics.clone(),
                &mut self.counter_ahead,
                changes.last_epoch,
            )
            .await?;
        }
        let mut store = self
            .store
            .take()
            .expect("the store is home between commits");
        let started = std::time::Instant::now();
        let changes_epoch = changes.last_epoch;
        let (store, result) = if let Some(pending) = store.commit_async(&changes) {
            (store, pending.await)
        } else if store.commit_blocks() && !self.own_thread {
            tokio::task::spawn_blocking(move || {
                let result = store.commit(&changes);
                (store, result)
            })
            .await
            .expect("the commit task does not panic")
        } else {
            let result = store.commit(&changes);
            (store, result)
        };
        self.store = Some(store);
        self.metrics
            .commit_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics.commit_batch_size.observe(batch_size as f64);
        if result.is_ok() {
            self.committed_epoch = changes_epoch;
        }
        result
    }

    /// Confirms that the store's authority is still this engine's ([`LeaseStore::confirm_async`];
    /// nothing to do for a single node).
    async fn confirm(&mut self) -> Result<(), StoreError> {
        let confirm = self
            .store
            .as_mut()
            .expect("the store is home between commits")
            .confirm_async();
        match confirm {
            Some(confirm) => confirm.await,
            None => Ok(()),
        }
    }

    fn apply(&mut self, request: Request, now: u64) -> Option<Box<dyn Deferred>> {
        match request {
            Request::Acquire(acquire, max_claims, reply) => {
                match self.table.acquire_within(acquire, now, max_claims) {
                    Ok(AcquireOutcome::Granted(lease)) => Some(Box::new(Answer(reply, Ok(lease)))),
                    Ok(AcquireOutcome::Waiting(waiter)) => {
                        self.waiting.insert(waiter, reply);
                        None
                    }
                    Err(error) => Some(Box::new(Answer(reply, Err(error.into())))),
                }
            }
            Request::Renew(id, by, allowed, reply) => {
                let lost = allowed.and_then(|allowed| {
                    let lock = &self.table.lease(id)?.lock;
                    (!allowed(lock)).then(|| lock.clone())
                });
                let result = match lost {
                    Some(lock) => Err(CoordinatorError::LostRight { lock }),
                    None => self.table.renew(id, by.as_ref(), now).map_err(Into::into),
                };
                match &result {
                    Ok(_) => self.metrics.leases_renewed.inc(),
                    Err(_) => self.metrics.renewal_failures.inc(),
                };
                Some(Box::new(Answer(reply, result)))
            }
            Request::Release(id, by, reply) => {
                let result = self.table.release(id, by.as_ref(), now).map(|o| o.released);
                Some(Box::new(Answer(reply, result.map_err(Into::into))))
            }
            Request::Break(lock, by, epoch, reply) => {
                let outcome = match self.table.describe(&lock, now).lease {
                    None => Ok(BreakOutcome::Free),
                    Some(lease) if epoch.is_some_and(|epoch| epoch != lease.epoch) => {
                        Ok(BreakOutcome::Other(lease))
                    }
                    Some(lease) => {
                        let ended = self.table.release(lease.id, None, now);
                        if ended.is_ok() {
                            self.breaking.insert(lease.id, by);
                        }
                        ended.map(|o| BreakOutcome::Broken(o.released))
                    }
                };
                Some(Box::new(Answer(reply, outcome.map_err(Into::into))))
            }
            Request::Describe(lock, reply) => {
                Some(Box::new(Answer(reply, Ok(self.table.describe(&lock, now)))))
            }
            Request::List(limit, reply) => {
                Some(Box::new(Answer(reply, Ok(self.table.list(limit, now)))))
            }
            Request::Counter(reply) => Some(Box::new(Answer(reply, Ok(self.table.last_epoch())))),
            Request::Floor(lock, reply) => {
                let held = self
                    .table
                    .describe(&lock, now)
                    .lease
                    .map(|lease| lease.epoch);
                let floor = held
                    .or_else(|| self.last_granted.get(&lock).copied())
                    .unwrap_or(Epoch(self.table.last_epoch().0.saturating_add(1)));
                Some(Box::new(Answer(reply, Ok(floor))))
            }
        }
    }

    /// How each lease that ended in `events` ended, for the history a replicated store keeps
    /// on every member (a lease granted to a vanished waiter and released at once is none).
    fn endings(&self, events: &[Event], vanished: &HashSet<LeaseId>) -> Vec<palisade_core::Ended> {
        let ended = |lease: &Lease, kind: &str, by: Option<&Principal>| palisade_core::Ended {
            lock: lease.lock.clone(),
            epoch: lease.epoch,
            kind: kind.to_owned(),
            by: by.map(ToString::to_string),
        };
        events
            .iter()
            .filter_map(|event| match event {
                Event::Released { lease } if vanished.contains(&lease.id) => None,
                Event::Released { lease } => Some(match self.breaking.get(&lease.id) {
                    Some(by) => ended(lease, "broken", Some(by)),
                    None => ended(lease, "released", None),
                }),
                Event::Expired { lease } => Some(ended(lease, "expired", None)),
                _ => None,
            })
            .collect()
    }

    /// Withdraws every queued acquire whose client has gone (its reply channel closed: the
    /// HTTP connection or gRPC call was dropped), so that it neither holds a place in a bounded
    /// queue nor is granted the lock.
    fn drop_abandoned_waiters(&mut self) {
        let abandoned: Vec<WaiterId> = self
            .waiting
            .iter()
            .filter(|(_, reply)| reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in abandoned {
            self.waiting.remove(&id);
            self.table.cancel_wait(id);
        }
    }

    /// Drains the table's events; a grant to a waiter whose client has gone is released again
    /// at once (before the commit), which may grant the next waiter, and so on. Returns the
    /// events and the leases granted to vanished clients (not counted as transitions).
    fn collect_events(&mut self, now: u64) -> (Vec<Event>, HashSet<LeaseId>) {
        let mut all = Vec::new();
        let mut vanished = HashSet::new();
        loop {
            let events = self.table.take_events();
            if events.is_empty() {
                return (all, vanished);
            }
            for event in &events {
                if let Event::Granted {
                    lease,
                    waiter: Some(waiter),
                } = event
                {
                    if self
                        .waiting
                        .get(waiter)
                        .is_none_or(|reply| reply.is_closed())
                    {
                        self.waiting.remove(waiter);
                        vanished.insert(lease.id);
                        self.table
                            .release(lease.id, None, now)
                            .expect("the lease was just granted");
                    }
                }
            }
            all.extend(events);
        }
    }

    /// After the commit: answers waiters, updates metrics, and tells watchers. A lease granted
    /// to a vanished waiter and released in the same step is no ownership anyone had: it is
    /// neither counted nor shown to watchers.
    fn publish(&mut self, events: Vec<Event>, vanished: &HashSet<LeaseId>, now: u64) {
        for event in events {
            if let Event::Granted { lease, .. } = &event {
                if self.last_granted.len() >= MAX_REMEMBERED_LOCKS {
                    self.last_granted.clear(); // forgotten locks' floors fall back to the counter
                }
                self.last_granted.insert(lease.lock.clone(), lease.epoch);
            }
            if let Event::Granted { lease, .. } | Event::Released { lease } = &event {
                if vanished.contains(&lease.id) {
                    continue;
                }
            }
            let (kind, lease, by) = match event {
                Event::Granted { lease, waiter } => {
                    if let Some(reply) = waiter.and_then(|w| self.waiting.remove(&w)) {
                        let _ = reply.send(Ok(lease.clone()));
                    }
                    self.metrics.leases_granted.inc();
                    (TransitionKind::Granted, lease, None)
                }
                Event::Released { lease } => match self.breaking.remove(&lease.id) {
                    Some(by) => (TransitionKind::Broken, lease, Some(by)),
                    None => {
                        self.metrics.leases_released.inc();
                        (TransitionKind::Released, lease, None)
                    }
                },
                Event::Expired { lease } => {
                    self.metrics.leases_expired.inc();
                    (TransitionKind::Expired, lease, None)
                }
                Event::WaitEnded { waiter, lock } => {
                    if let Some(reply) = self.waiting.remove(&waiter) {
                        let _ = reply.send(Err(CoordinatorError::WaitTimedOut { lock }));
                    }
                    continue;
                }
            };
            self.metrics
                .transitions
                .get_or_create(&TransitionLabels {
                    class: lease.class.as_str(),
                    transition: kind.as_str(),
                })
                .inc();
            let remaining_ms = match kind {
                TransitionKind::Granted => lease.expires_at.saturating_sub(now),
                _ => 0,
            };
            // No watcher is fine.
            let _ = self.transitions.send(Transition {
                kind,
                lease,
                remaining_ms,
                by,
            });
        }
    }
}

/// Resolves when shutdown is asked for; never, if the sender is gone without asking.
async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn sleep_until_optional(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
