//! Errors of the client, by what the caller can do about them.

use tonic::{Code, Status};

/// Why a client call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request breaks a rule (bad lock name, TTL, wait, holder); retrying will not help.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The lock is held (and the wait, if any, ran out).
    #[error("{0}")]
    Held(String),
    /// The lock's waiter queue is full.
    #[error("{0}")]
    TooManyWaiters(String),
    /// The lease is unknown, released or expired.
    #[error("{0}")]
    UnknownLease(String),
    /// No credentials, or credentials the coordinator does not know (`--token-file`,
    /// `PALISADE_AUTH_TOKEN`).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The credentials are known but lack the right (the ACL), or the lease belongs to
    /// another principal.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The coordinator's lock policy refuses the acquire (a critical lock asked as
    /// efficiency, or a critical lock with no boundary under `--require-policy`).
    #[error("refused by the lock policy: {0}")]
    RefusedByPolicy(String),
    /// The coordinator cannot answer now (down, stopping, unreachable, timed out); the
    /// outcome of a state-changing request is unknown.
    #[error("coordinator unavailable: {0}")]
    Unavailable(String),
    /// Any other failure.
    #[error("{0}")]
    Other(String),
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::InvalidArgument => ClientError::InvalidArgument(message),
            Code::AlreadyExists => ClientError::Held(message),
            Code::ResourceExhausted => ClientError::TooManyWaiters(message),
            Code::NotFound => ClientError::UnknownLease(message),
            Code::Unauthenticated => ClientError::Unauthenticated(message),
            Code::PermissionDenied => ClientError::PermissionDenied(message),
            Code::FailedPrecondition => ClientError::RefusedByPolicy(message),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                ClientError::Unavailable(message)
            }
            code => ClientError::Other(format!("{code:?}: {message}")),
        }
    }
}
