//! Where the front ends send a request: the local engine when this node decides, else a
//! `not leader` / `unavailable` answer.
//!
//! A single node always has its engine. A cluster member has one only while it leads with a
//! quorum behind it (see `cluster::supervisor`); every other moment the gateway refuses,
//! naming the leader when it knows one, so that **no follower ever grants**.

use palisade_core::{AcquireRequest, Lease, LeaseId, LockName, LockSummary, Principal};
use tokio::sync::{broadcast, watch};

use crate::engine::{CoordinatorError, CoordinatorHandle, LeaderHint, Transition, WATCH_BUFFER};

/// What this node does with requests right now.
#[derive(Clone)]
pub enum Serving {
    /// It decides, through this engine.
    Engine(CoordinatorHandle),
    /// Another node leads (or nobody is known to): refuse with `not leader`.
    NotLeader(Option<LeaderHint>),
    /// It cannot serve (starting, leading without a quorum, stopping).
    Unavailable(String),
}

/// A cheap, cloneable view of [`Serving`], with the methods of [`CoordinatorHandle`].
#[derive(Clone)]
pub struct Gateway {
    serving: watch::Receiver<Serving>,
    transitions: broadcast::Sender<Transition>,
}

impl Gateway {
    /// A gateway that always sends to `engine` (a single node).
    pub fn fixed(engine: CoordinatorHandle, transitions: broadcast::Sender<Transition>) -> Self {
        let (_sender, serving) = watch::channel(Serving::Engine(engine));
        Self {
            serving,
            transitions,
        }
    }

    /// A gateway whose target changes with `serving` (a cluster member), and the channel every
    /// engine of this node publishes its transitions on.
    pub fn switching(serving: watch::Receiver<Serving>) -> (Self, broadcast::Sender<Transition>) {
        let (transitions, _) = broadcast::channel(WATCH_BUFFER);
        let gateway = Self {
            serving,
            transitions: transitions.clone(),
        };
        (gateway, transitions)
    }

    fn engine(&self) -> Result<CoordinatorHandle, CoordinatorError> {
        match &*self.serving.borrow() {
            Serving::Engine(engine) => Ok(engine.clone()),
            Serving::NotLeader(leader) => Err(CoordinatorError::NotLeader {
                leader: leader.clone(),
            }),
            Serving::Unavailable(why) => Err(CoordinatorError::Unavailable(why.clone())),
        }
    }

    /// Why this node does not serve now, or `None` when it does.
    pub fn not_serving(&self) -> Option<CoordinatorError> {
        self.engine().err()
    }

    /// See [`CoordinatorHandle::acquire`].
    pub async fn acquire(&self, request: AcquireRequest) -> Result<Lease, CoordinatorError> {
        self.engine()?.acquire(request).await
    }

    /// See [`CoordinatorHandle::acquire_within`].
    pub async fn acquire_within(
        &self,
        request: AcquireRequest,
        max_claims: Option<usize>,
    ) -> Result<Lease, CoordinatorError> {
        self.engine()?.acquire_within(request, max_claims).await
    }

    /// See [`CoordinatorHandle::renew`].
    pub async fn renew(
        &self,
        id: LeaseId,
        by: Option<Principal>,
    ) -> Result<Lease, CoordinatorError> {
        self.engine()?.renew(id, by).await
    }

    /// See [`CoordinatorHandle::renew_checked`].
    pub async fn renew_checked(
        &self,
        id: LeaseId,
        by: Option<Principal>,
        allowed: Option<crate::engine::RightCheck>,
    ) -> Result<Lease, CoordinatorError> {
        self.engine()?.renew_checked(id, by, allowed).await
    }

    /// See [`CoordinatorHandle::release`].
    pub async fn release(
        &self,
        id: LeaseId,
        by: Option<Principal>,
    ) -> Result<Lease, CoordinatorError> {
        self.engine()?.release(id, by).await
    }

    /// See [`CoordinatorHandle::break_lock`].
    pub async fn break_lock(
        &self,
        lock: LockName,
        by: Principal,
        epoch: Option<palisade_core::Epoch>,
    ) -> Result<crate::engine::BreakOutcome, CoordinatorError> {
        self.engine()?.break_lock(lock, by, epoch).await
    }

    /// See [`CoordinatorHandle::describe`].
    pub async fn describe(&self, lock: LockName) -> Result<LockSummary, CoordinatorError> {
        self.engine()?.describe(lock).await
    }

    /// See [`CoordinatorHandle::epoch_counter`].
    pub async fn epoch_counter(&self) -> Result<palisade_core::Epoch, CoordinatorError> {
        self.engine()?.epoch_counter().await
    }

    /// See [`CoordinatorHandle::floor`].
    pub async fn floor(&self, lock: LockName) -> Result<palisade_core::Epoch, CoordinatorError> {
        self.engine()?.floor(lock).await
    }

    /// See [`CoordinatorHandle::list`].
    pub async fn list(&self, limit: usize) -> Result<Vec<LockSummary>, CoordinatorError> {
        self.engine()?.list(limit).await
    }

    /// Ownership transitions from now on, whichever engine of this node commits them.
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.transitions.subscribe()
    }

    /// True while this node serves requests.
    pub fn is_ready(&self) -> bool {
        self.engine().is_ok_and(|engine| engine.is_ready())
    }
}
