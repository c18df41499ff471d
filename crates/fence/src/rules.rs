//! The fence rules of the three modes, as pure functions: every adapter decides with these (or,
//! in SQL, with statements documented as equivalent to these), so the modes mean the same
//! everywhere.

use palisade_core::Epoch;

use crate::Rejection;

/// Strict mode: accept iff `epoch > stored` (the key's fence; a key never written has fence 0,
/// and the coordinator never issues epoch 0) and `epoch >= lock_fence` (the greatest epoch the
/// resource accepted for the lock, on any key). Equal epochs are never accepted on one key;
/// the lock's rule stops an old owner from creating a key the new owner has not written yet.
/// A resource that does not know the lock of its keys passes `Epoch(0)`.
pub fn strict(stored: Option<Epoch>, lock_fence: Epoch, epoch: Epoch) -> Result<(), Rejection> {
    let fence = stored.unwrap_or_default();
    if epoch < lock_fence {
        return Err(Rejection::StaleEpoch {
            fence: lock_fence,
            fence_seq: None,
        });
    }
    if epoch > fence {
        Ok(())
    } else {
        Err(Rejection::StaleEpoch {
            fence,
            fence_seq: None,
        })
    }
}

/// What an accepted activation does to the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationStep {
    /// The fence moves up to the epoch.
    Advance,
    /// The fence is already at the epoch (a retried activation).
    AlreadyActive,
}

/// Activated mode, `activate`: advance iff `epoch > fence`; equal is an idempotent success.
pub fn activate(fence: Epoch, epoch: Epoch) -> Result<ActivationStep, Rejection> {
    if epoch > fence {
        Ok(ActivationStep::Advance)
    } else if epoch == fence {
        Ok(ActivationStep::AlreadyActive)
    } else {
        Err(Rejection::StaleEpoch {
            fence,
            fence_seq: None,
        })
    }
}

/// Activated mode, write: accept iff `epoch == fence`.
pub fn activated_write(fence: Epoch, epoch: Epoch) -> Result<(), Rejection> {
    if epoch == fence && epoch > Epoch(0) {
        Ok(())
    } else if epoch < fence {
        Err(Rejection::StaleEpoch {
            fence,
            fence_seq: None,
        })
    } else {
        Err(Rejection::NotActivated { fence })
    }
}

/// Sequenced mode: accept iff `(epoch, seq)` is lexicographically above the stored pair (a key
/// never written has `(0, 0)`, so any pair with epoch ≥ 1 passes).
pub fn sequenced(stored: Option<(Epoch, u64)>, epoch: Epoch, seq: u64) -> Result<(), Rejection> {
    let (fence, fence_seq) = stored.unwrap_or_default();
    if (epoch, seq) > (fence, fence_seq) && epoch > Epoch(0) {
        Ok(())
    } else {
        Err(Rejection::StaleEpoch {
            fence,
            fence_seq: Some(fence_seq),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn e(n: u64) -> Epoch {
        Epoch(n)
    }

    #[test]
    fn p2_strict_accepts_only_strictly_higher_epochs() {
        assert!(strict(None, e(0), e(1)).is_ok());
        assert!(strict(Some(e(5)), e(5), e(6)).is_ok());
        assert!(strict(Some(e(5)), e(5), e(5)).is_err());
        assert!(strict(Some(e(5)), e(5), e(4)).is_err());
    }

    #[test]
    fn p2_strict_refuses_an_epoch_below_the_locks_greatest_on_a_new_key() {
        // The new owner (42) wrote key1; the old owner (41) must not create key2.
        assert_eq!(
            strict(None, e(42), e(41)),
            Err(Rejection::StaleEpoch {
                fence: e(42),
                fence_seq: None
            })
        );
        // The current owner writes other keys at its own epoch.
        assert!(strict(None, e(42), e(42)).is_ok());
        assert!(strict(Some(e(40)), e(42), e(42)).is_ok());
    }

    #[test]
    fn p2_activation_moves_only_up_and_is_idempotent() {
        assert_eq!(activate(e(0), e(3)), Ok(ActivationStep::Advance));
        assert_eq!(activate(e(3), e(3)), Ok(ActivationStep::AlreadyActive));
        assert!(activate(e(3), e(2)).is_err());
    }

    #[test]
    fn p2_activated_writes_need_the_exact_fence() {
        assert!(activated_write(e(3), e(3)).is_ok());
        assert!(matches!(
            activated_write(e(3), e(2)),
            Err(Rejection::StaleEpoch { .. })
        ));
        assert!(matches!(
            activated_write(e(3), e(4)),
            Err(Rejection::NotActivated { .. })
        ));
        assert!(matches!(
            activated_write(e(0), e(0)),
            Err(Rejection::NotActivated { .. })
        ));
    }

    #[test]
    fn p2_sequenced_pairs_compare_lexicographically() {
        assert!(sequenced(None, e(1), 0).is_ok());
        assert!(sequenced(Some((e(2), 5)), e(2), 6).is_ok());
        assert!(sequenced(Some((e(2), 5)), e(3), 0).is_ok());
        assert!(sequenced(Some((e(2), 5)), e(2), 5).is_err());
        assert!(sequenced(Some((e(2), 5)), e(1), 99).is_err());
    }
}
