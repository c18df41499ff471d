//! Resource-side enforcement: the receiver of a write decides whose effects are accepted.
//!
//! A [`FencedResource`] verifies the write's token (signature, key, lock — P4) before it touches
//! data, then compares the token's epoch with its fence and applies the write in one atomic step
//! (P3), in one of three [`FenceMode`]s. The comparison rules live in [`rules`] (no I/O), so
//! every adapter decides alike; [`conformance`] is the one suite every adapter must pass.
//!
//! Results are typed: an expected rejection is `Ok(Outcome::Rejected(..))`, never `Err`, and an
//! I/O failure is `Err(FenceError)`, never a rejection — a caller must not retry a rejection,
//! and may retry an error (the write's fate is then unknown unless the adapter says otherwise).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
mod floors;
mod precheck;
pub mod rules;
mod verifier;

use std::fmt;
use std::future::Future;

use palisade_core::{Epoch, LockName, TokenError};

pub use floors::{
    FloorFlights, FloorSource, FloorStatementFuture, StaticFloors, MAX_FLOOR_REQUESTS,
};
pub use precheck::{key_is_storable, precheck_activation, precheck_write};
pub use verifier::{PrincipalRule, Verifier};

/// Largest value a fenced write may carry: 1 MiB. Bigger payloads belong in a blob store,
/// fenced by a small pointer record.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;
/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;

/// How a resource compares epochs (docs/enforcement.md, "The three modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceMode {
    /// One result per epoch: accept iff `epoch > fence`, the fence kept per key.
    Strict,
    /// `activate` advances the lock's fence before the owner works; a write is accepted iff
    /// `epoch == fence`. Several writes per epoch.
    Activated,
    /// Writes carry `(epoch, seq)`, accepted iff the pair is above the key's stored pair; a
    /// replay of an applied pair returns the recorded outcome and applies nothing.
    Sequenced,
}

impl FenceMode {
    /// The mode's name on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceMode::Strict => "strict",
            FenceMode::Activated => "activated",
            FenceMode::Sequenced => "sequenced",
        }
    }

    /// Parses `strict`, `activated` or `sequenced`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "strict" => Some(FenceMode::Strict),
            "activated" => Some(FenceMode::Activated),
            "sequenced" => Some(FenceMode::Sequenced),
            _ => None,
        }
    }
}

impl fmt::Display for FenceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fenced write.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// The lock that guards the data; the token must be for this lock.
    pub lock: &'a LockName,
    /// The key (row) written.
    pub key: &'a str,
    /// The token in text form, as presented by the writer.
    pub token: &'a str,
    /// The write's sequence number: required in sequenced mode, refused in the others.
    pub seq: Option<u64>,
    /// The new value.
    pub value: &'a [u8],
}

/// What happened to a write. Only `Accepted` applied anything.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// Applied, durably, at this epoch (and sequence number, in sequenced mode).
    Accepted {
        /// The token's epoch.
        epoch: Epoch,
        /// The write's sequence number (sequenced mode).
        seq: Option<u64>,
    },
    /// Sequenced mode: this exact `(epoch, seq)` with this value was applied before; nothing
    /// was applied now (idempotent retry).
    Replayed {
        /// The recorded epoch.
        epoch: Epoch,
        /// The recorded sequence number.
        seq: u64,
    },
    /// Refused; nothing was applied.
    Rejected(Rejection),
}

/// Why a write or an activation was refused. Nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The epoch (or `(epoch, seq)`) is obsolete: a newer owner has written or activated.
    #[error("stale epoch: the fence is at {fence}")]
    StaleEpoch {
        /// The fence (the key's stored epoch, or the lock's activated epoch).
        fence: Epoch,
        /// The stored sequence number (sequenced mode).
        fence_seq: Option<u64>,
    },
    /// Activated mode: the epoch is newer than the fence; the owner must activate first.
    #[error("epoch not activated: the fence is at {fence}")]
    NotActivated {
        /// The lock's fence.
        fence: Epoch,
    },
    /// The token is malformed, forged, altered, signed by an unknown key, or for another lock.
    #[error("invalid token: {0}")]
    InvalidToken(TokenError),
    /// Sequenced mode: this `(epoch, seq)` was applied before with a different value.
    #[error("({epoch}, {seq}) was already applied with a different value")]
    ReplayMismatch {
        /// The epoch.
        epoch: Epoch,
        /// The sequence number.
        seq: u64,
    },
    /// The request is not valid for this resource (missing or unexpected sequence number, key
    /// or value out of bounds, activation in a mode without activation, missing row).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl Rejection {
    /// A short code for metrics and JSON errors.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::StaleEpoch { .. } => "stale_epoch",
            Rejection::NotActivated { .. } => "not_activated",
            Rejection::InvalidToken(_) => "invalid_token",
            Rejection::ReplayMismatch { .. } => "replay_mismatch",
            Rejection::InvalidRequest(_) => "invalid_request",
        }
    }
}

/// What an activation did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Activation {
    /// The lock's fence is now the token's epoch (advanced now, or already there: a retried
    /// activation succeeds for its own owner).
    Activated {
        /// The fence.
        fence: Epoch,
    },
    /// Refused; the fence did not move.
    Rejected(Rejection),
}

/// A value as stored, with the epoch (and sequence number) that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The value.
    pub value: Vec<u8>,
    /// The epoch of the write that stored it.
    pub epoch: Epoch,
    /// Its sequence number (sequenced mode).
    pub seq: Option<u64>,
}

/// A failure to reach or use the storage. The write's fate is unknown to the caller unless the
/// adapter documents otherwise; it is never a rejection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The storage failed (I/O, database error, connection lost).
    #[error("storage error: {0}")]
    Storage(Box<dyn std::error::Error + Send + Sync>),
    /// The stored data contradicts the fence rules (e.g. a fence that went backwards): the
    /// resource refuses to guess.
    #[error("integrity violation: {0}")]
    Integrity(String),
    /// The store was restored from an older copy (or copied back) and may have forgotten
    /// fences: it accepts no write until a restore floor signed by the coordinator is applied
    /// (`palisade resource restore`; P6). Nothing was applied.
    #[error("restore required: {0}")]
    RestoreRequired(String),
}

/// A resource that accepts writes only from the current owner of the guarding lock.
///
/// Contract for every implementation (checked by [`conformance`]):
/// - the token is verified (signature, trusted key, lock) before any data is read or written;
///   a bad token is `Rejected(InvalidToken)` (P4);
/// - the comparison of the epoch with the fence and the mutation are one atomic step: no
///   interleaving of another write between them exists (P3);
/// - `Accepted` (and `Activated`) is returned only after the write (and the fence advance) is
///   durable: it survives kill -9 of the process and, for a database, a crash of the database
///   (P8);
/// - nothing is accepted below the fence (strict: at or below); the stored value is the one
///   written by the highest accepted epoch (P2);
/// - rejections apply nothing; storage failures are `Err`, never rejections.
pub trait FencedResource: Send + Sync {
    /// The resource's mode (configuration, never the writer's choice).
    fn mode(&self) -> FenceMode;

    /// Applies `write` iff its token is valid and its epoch passes the mode's rule.
    fn write<'a>(
        &'a self,
        write: Write<'a>,
    ) -> impl Future<Output = Result<Outcome, FenceError>> + Send + 'a;

    /// Activated mode: advances the lock's fence to the token's epoch iff it is higher;
    /// re-activating the current epoch succeeds. Other modes reject it.
    fn activate<'a>(
        &'a self,
        lock: &'a LockName,
        token: &'a str,
    ) -> impl Future<Output = Result<Activation, FenceError>> + Send + 'a;

    /// The stored value of a key.
    fn read<'a>(
        &'a self,
        lock: &'a LockName,
        key: &'a str,
    ) -> impl Future<Output = Result<Option<Stored>, FenceError>> + Send + 'a;

    /// The lock's fence: its activated epoch (activated mode) or the greatest epoch accepted
    /// for any of its keys (other modes); 0 when none.
    fn fence<'a>(
        &'a self,
        lock: &'a LockName,
    ) -> impl Future<Output = Result<Epoch, FenceError>> + Send + 'a;
}

/// SHA-256 of a value: what the sequenced ledger records to tell a replay from a conflicting
/// reuse of a sequence number.
pub fn value_digest(value: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(value).into()
}
