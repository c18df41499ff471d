//! Palisade's core: the rules of ownership, with no I/O.
//!
//! Everything here is plain data and pure functions: lock names and their validation, epochs,
//! the lease table as a deterministic state machine (time is passed in, never read), lock
//! classes, limits, and the signed ownership token. The coordinator (`palisade-server`) wraps
//! the lease table with a durable log and a network; tests and simulations drive it directly.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod json;
pub mod lease_table;
pub mod limits;
pub mod restore;
pub mod token;
pub mod types;
pub mod witness;

pub use lease_table::{
    AcquireOutcome, AcquireRequest, Changes, Event, Lease, LeaseError, LeaseTable, LockSummary,
    ReleaseOutcome, WaiterId,
};
pub use token::{FloorClaims, KeyId, TokenClaims, TokenError, TokenSigner, TokenVerifier};
pub use types::{
    Epoch, HolderId, InvalidInput, LeaseId, LockClass, LockName, Millis, Principal, RequestId,
};
