//! What every adapter checks before touching storage, in one place so they reject alike:
//! bounds, the sequence number's presence for the mode, and the token (P4).

use palisade_core::{Epoch, LockName};

use crate::{FenceMode, Rejection, Verifier, Write, MAX_KEY_BYTES, MAX_VALUE_BYTES};

/// True when every adapter can store `key` (no NUL): a key that is not can never have been
/// written, so a read of it finds nothing.
pub fn key_is_storable(key: &str) -> bool {
    !key.contains('\0')
}

/// Checks a write; returns the token's verified epoch.
pub fn precheck_write(
    verifier: &Verifier,
    mode: FenceMode,
    write: &Write<'_>,
) -> Result<Epoch, Rejection> {
    if write.key.is_empty() || write.key.len() > MAX_KEY_BYTES {
        return Err(Rejection::InvalidRequest(format!(
            "key must be 1 to {MAX_KEY_BYTES} bytes"
        )));
    }
    if !key_is_storable(write.key) {
        // PostgreSQL text cannot hold NUL: refused alike by every adapter, never a storage
        // failure (found by the conformance fuzz case).
        return Err(Rejection::InvalidRequest(
            "key must not contain the NUL character".into(),
        ));
    }
    if write.value.len() > MAX_VALUE_BYTES {
        return Err(Rejection::InvalidRequest(format!(
            "value is {} bytes; the maximum is {MAX_VALUE_BYTES}",
            write.value.len()
        )));
    }
    match (mode, write.seq) {
        (FenceMode::Sequenced, None) => {
            return Err(Rejection::InvalidRequest(
                "sequenced mode needs a sequence number".into(),
            ))
        }
        (FenceMode::Strict | FenceMode::Activated, Some(_)) => {
            return Err(Rejection::InvalidRequest(format!(
                "{mode} mode takes no sequence number"
            )))
        }
        _ => {}
    }
    let claims = verifier
        .verify(write.token, write.lock)
        .map_err(Rejection::InvalidToken)?;
    Ok(claims.epoch)
}

/// Checks an activation (activated mode only); returns the token's verified epoch.
pub fn precheck_activation(
    verifier: &Verifier,
    mode: FenceMode,
    lock: &LockName,
    token: &str,
) -> Result<Epoch, Rejection> {
    if mode != FenceMode::Activated {
        return Err(Rejection::InvalidRequest(format!(
            "activation is for activated mode; this resource is {mode}"
        )));
    }
    let claims = verifier
        .verify(token, lock)
        .map_err(Rejection::InvalidToken)?;
    Ok(claims.epoch)
}
