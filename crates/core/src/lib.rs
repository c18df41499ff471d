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
    AcquireOutcome, AcquireRequest, Changes, Ended, Event, Lease, LeaseError, LeaseTable,
    LockSummary, ReleaseOutcome, WaiterId,
};
/// Lower-case hexadecimal of `bytes` (digests, store ids).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

pub use token::{FloorClaims, KeyId, TokenClaims, TokenError, TokenSigner, TokenVerifier};
pub use types::{
    Epoch, HolderId, InvalidInput, LeaseId, LockClass, LockName, Millis, Principal, RequestId,
};

#[cfg(test)]
mod hex_tests {
    #[test]
    fn hex_is_two_lower_case_digits_per_byte() {
        assert_eq!(super::hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
        assert_eq!(super::hex(&[]), "");
    }
}
