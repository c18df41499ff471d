//! What the HTTP and gRPC front ends share: signing grants into tokens, and acquire latency.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use palisade_core::token::encode_public_key;
use palisade_core::{AcquireRequest, Lease, LeaseId, TokenSigner};

use crate::engine::{CoordinatorError, CoordinatorHandle};
use crate::metrics::Metrics;

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
    /// The engine.
    pub coordinator: CoordinatorHandle,
    /// Signs tokens for grants.
    pub signer: Arc<TokenSigner>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

impl Api {
    /// Acquires, then signs the grant. The epoch is durable before the token exists.
    pub async fn acquire(&self, request: AcquireRequest) -> Result<Grant, CoordinatorError> {
        let started = std::time::Instant::now();
        let lease = self.coordinator.acquire(request).await?;
        let token = self.sign(&lease);
        self.metrics
            .acquire_latency
            .observe(started.elapsed().as_secs_f64());
        Ok(Grant { lease, token })
    }

    /// Renews a lease.
    pub async fn renew(&self, id: LeaseId) -> Result<Lease, CoordinatorError> {
        self.coordinator.renew(id).await
    }

    /// The token of a lease.
    pub fn sign(&self, lease: &Lease) -> String {
        let issued_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.signer.sign(
            &lease.lock,
            lease.epoch,
            lease.id,
            &lease.holder,
            issued_at_ms,
        )
    }

    /// The keys tokens may be verified with.
    pub fn public_keys(&self) -> Vec<PublicKeyInfo> {
        vec![PublicKeyInfo {
            key_id: self.signer.key_id().to_string(),
            public_key: encode_public_key(&self.signer.verifying_key()),
            algorithm: "ed25519",
        }]
    }
}
