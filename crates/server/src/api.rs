//! What the HTTP and gRPC front ends share: signing grants into tokens, and acquire latency.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use palisade_audit::PolicyRefusal;
use palisade_core::token::encode_public_key;
use palisade_core::{AcquireRequest, Lease, LeaseError, LeaseId, LockClass, TokenSigner};

use crate::auth::{Caller, Right};
use palisade_cluster::{NodeId, RaftNode};
use palisade_coordinator::engine::CoordinatorError;
use palisade_coordinator::gateway::Gateway;
use palisade_coordinator::metrics::Metrics;

/// A granted lease with its signed token.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The lease.
    pub lease: Lease,
    /// The token stating the lease's ownership, in text form.
    pub token: String,
}

/// A public verification key, as served at `GET /v1/keys`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PublicKeyInfo {
    /// The key's id (16 hex digits), as carried in tokens.
    pub key_id: String,
    /// Base64url (no padding) of the 32-byte Ed25519 public key.
    pub public_key: String,
    /// Always `ed25519`.
    pub algorithm: &'static str,
}

/// Shared state of the front ends.
#[derive(Clone)]
pub struct Api {
    /// Where requests go (the engine, or a refusal when this cluster member does not lead).
    pub coordinator: Gateway,
    /// Signs tokens for grants.
    pub signer: Arc<TokenSigner>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// In cluster mode: this member.
    pub cluster: Option<ClusterMember>,
    /// Who may do what.
    pub auth: Arc<crate::auth::Auth>,
    /// The lock policy: each acquire's class, and refusals under `--require-policy`.
    pub policy: Arc<crate::policy::PolicyState>,
    /// The recent ownership transitions, for the console.
    pub feed: Arc<palisade_coordinator::feed::Feed>,
    /// The audits: one at a time, the last one reused briefly.
    pub audits: Arc<Audits>,
    /// The data directory, whose free space `/readyz` weighs ([`crate::disk::not_ready`]).
    pub data_dir: Arc<std::path::Path>,
}

/// A cluster member, for `/v1/cluster` and `/v1/keys`.
#[derive(Clone)]
pub struct ClusterMember {
    /// The Raft node.
    pub raft: RaftNode,
    /// Its id.
    pub node_id: NodeId,
    /// The applied state (keys of every leader).
    pub state: Arc<std::sync::Mutex<palisade_cluster::storage::SmState>>,
    /// Its membership changes.
    pub changes: Arc<palisade_cluster::membership::Changes>,
    /// Why it is not ready although it sees a leader (its Raft service reports).
    pub health: palisade_cluster::health::Health,
    /// Its clock against its peers' (shown by `cluster status`).
    pub clock_check: Arc<palisade_cluster::clock_check::ClockCheck>,
    /// Its store's identity and probation (`palisade cluster lost` speaks to it).
    pub identity: palisade_cluster::identity::Identity,
}

impl Api {
    /// Classifies the acquire by the policy (`requested`: the class the request named, if
    /// any), acquires, then signs the grant. The epoch is durable before the token exists.
    /// `max_leases`: the principal's limit of leases held or awaited (`None`: unlimited).
    pub async fn acquire(
        &self,
        mut request: AcquireRequest,
        requested: Option<LockClass>,
        max_leases: Option<usize>,
    ) -> Result<Grant, CoordinatorError> {
        let started = std::time::Instant::now();
        request.class = match self.policy.classify(request.lock.as_str(), requested) {
            Ok(class) => class,
            Err(refusal) => {
                self.metrics.refused(match refusal {
                    PolicyRefusal::Downgrade { .. } => "policy_downgrade",
                    PolicyRefusal::NoBoundary { .. } => "policy_no_boundary",
                });
                return Err(CoordinatorError::Refused(refusal));
            }
        };
        let lease = match self.coordinator.acquire_within(request, max_leases).await {
            Ok(lease) => lease,
            Err(error) => {
                self.metrics.refused(refusal_reason(&error));
                return Err(error);
            }
        };
        if lease.epoch.0 as i64 > self.metrics.epoch.get() {
            self.metrics.epoch.set(lease.epoch.0 as i64);
        }
        let token = self.sign(&lease);
        self.metrics
            .acquire_latency
            .observe(started.elapsed().as_secs_f64());
        Ok(Grant { lease, token })
    }

    /// Renews a lease on behalf of `caller`: its own leases (any, for an admin), and only
    /// while it still has the acquire right on the lease's lock — rights are checked on every
    /// renew, not only at the acquire (issue 26, item 8).
    pub async fn renew(&self, id: LeaseId, caller: &Caller) -> Result<Lease, CoordinatorError> {
        let allowed: Option<palisade_coordinator::engine::RightCheck> = match caller.lease_actor() {
            None => None,
            Some(_) => {
                let caller = caller.clone();
                Some(Box::new(move |lock| caller.can(Right::Acquire, Some(lock))))
            }
        };
        self.coordinator
            .renew_checked(id, caller.lease_actor(), allowed)
            .await
    }

    /// The token of a lease.
    pub fn sign(&self, lease: &Lease) -> String {
        let issued_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.signer.sign(
            &lease.lock,
            lease.epoch,
            &lease.holder,
            &lease.principal,
            issued_at_ms,
        )
    }

    /// The keys tokens may be verified with.
    pub fn public_keys(&self) -> Vec<PublicKeyInfo> {
        let own = self.signer.key_id().to_string();
        let mut keys = vec![PublicKeyInfo {
            key_id: own.clone(),
            public_key: encode_public_key(&self.signer.verifying_key()),
            algorithm: "ed25519",
        }];
        if let Some(cluster) = &self.cluster {
            // Every member that has led registered its key in the replicated state; a retired
            // key is published by nobody, its owner included.
            let state = palisade_cluster::storage::lock_state(&cluster.state);
            if state.header.retired_keys.contains(&own) {
                keys.clear();
            }
            for (key_id, public_key) in &state.header.keys {
                if *key_id != own {
                    keys.push(PublicKeyInfo {
                        key_id: key_id.clone(),
                        public_key: public_key.clone(),
                        algorithm: "ed25519",
                    });
                }
            }
        }
        keys
    }
}

/// The `reason` label of a refused acquire.
fn refusal_reason(error: &CoordinatorError) -> &'static str {
    match error {
        CoordinatorError::Lease(LeaseError::Held { .. }) => "held",
        CoordinatorError::WaitTimedOut { .. } => "wait_timed_out",
        CoordinatorError::Lease(LeaseError::TooManyWaiters { .. }) => "too_many_waiters",
        CoordinatorError::Lease(LeaseError::PrincipalLimit { .. }) => "principal_limit",
        CoordinatorError::Lease(LeaseError::EpochsExhausted { .. }) => "epochs_exhausted",
        CoordinatorError::Lease(_) => "invalid",
        CoordinatorError::NotLeader { .. } => "not_leader",
        // A renew's refusal; an acquire never meets it.
        CoordinatorError::LostRight { .. } => "invalid",
        CoordinatorError::Unavailable(_) => "unavailable",
        CoordinatorError::Refused(PolicyRefusal::Downgrade { .. }) => "policy_downgrade",
        CoordinatorError::Refused(PolicyRefusal::NoBoundary { .. }) => "policy_no_boundary",
    }
}

/// The audits of one coordinator: one at a time (a page left open in many tabs cannot multiply
/// the load on the boundaries), and the last one without probes.
#[derive(Default)]
pub struct Audits {
    pub(crate) turn: tokio::sync::Mutex<Option<(std::time::Instant, palisade_audit::Report)>>,
}
