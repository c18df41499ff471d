//! The fences of a PostgreSQL table, judged against the coordinator and the tokens the writers
//! presented (P4, migration 11).
//!
//! A fence only rises, so one written too high — `last_fence = 9000000000000000000` by a SQL
//! writer, or the epoch of a forged token — refuses every later owner of the lock. The database
//! cannot check a token's signature; it records the greatest token presented for each lock
//! (`palisade_presented_tokens`), and on a table that requires tokens every fence it accepted
//! is the epoch of a presented token. The audit checks both:
//! - the recorded token does not verify with the coordinator's keys, or states another lock
//!   or another epoch than recorded: **poisoned**, critical (it may back any fence up to its
//!   epoch);
//! - a fence above the coordinator's floor for its lock (every epoch the coordinator issued
//!   for the lock is at most the floor) that no verified token backs: **poisoned**, critical.
//!   Backed by a verified token, the fence is the coordinator's own and the coordinator went
//!   back in time (`fence_ahead`, with its own repair).
//!
//! The repair is one command, `palisade resource repair-fence`, run as the table's owner: the
//! rows of the lock above the coordinator's floor go back to just below it, and a presented
//! token above it is forgotten.

use std::collections::BTreeMap;

use palisade_core::{LockName, TokenVerifier};
use serde::{Deserialize, Serialize};

use crate::{Problem, Severity};

/// The greatest token presented for a lock, as `palisade_presented_tokens` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresentedToken {
    /// The lock.
    pub lock: String,
    /// The epoch the database read from the token.
    #[serde(with = "palisade_core::json::string")]
    pub epoch: u64,
    /// The token.
    pub token: String,
}

/// The problems of a table's `fences` (its highest fence per lock): `presented` holds the
/// recorded tokens, `coordinator` the coordinator's floor for each lock it was asked about,
/// `verifier` its keys. Returns the problems and the locks found poisoned.
pub fn judge(
    table: &str,
    fences: &BTreeMap<String, u64>,
    presented: &[PresentedToken],
    coordinator: &BTreeMap<String, u64>,
    verifier: &TokenVerifier,
) -> (Vec<Problem>, Vec<String>) {
    let mut problems = Vec::new();
    let mut poisoned = Vec::new();
    // The held locks' fences, and the locks nobody holds that a token was presented for.
    let mut locks: BTreeMap<&String, Option<u64>> = fences
        .iter()
        .map(|(lock, fence)| (lock, Some(*fence)))
        .collect();
    for token in presented {
        locks.entry(&token.lock).or_insert(None);
    }
    for (lock, fence) in locks {
        let token = presented.iter().find(|p| &p.lock == lock);
        let backing = token.map(|token| verified_epoch(token, verifier));
        let why = match (backing, coordinator.get(lock), fence) {
            (Some(Err(why)), _, _) => Some(why),
            (Some(Ok(epoch)), _, Some(fence)) if epoch >= fence => None,
            (_, Some(floor), Some(fence)) if fence > *floor => Some(format!(
                "no token the coordinator signed names it, and the coordinator's floor for \
                 the lock is {floor}"
            )),
            _ => None,
        };
        let Some(why) = why else { continue };
        let fence = fence.map_or_else(|| "a token's epoch".to_owned(), |f| f.to_string());
        let floor = coordinator
            .get(lock)
            .map_or_else(|| "FLOOR".to_owned(), u64::to_string);
        problems.push(Problem {
            severity: Severity::Critical,
            code: "poisoned_fence".into(),
            message: format!(
                "lock {lock}: {table} is fenced at {fence} and {why}: every owner of the lock \
                 below it is refused. Repair: palisade resource repair-fence --postgres URL \
                 --table {table} --lock {lock} (as the table's owner; rows above the \
                 coordinator's floor, {floor} now, go back to just below it)"
            ),
            proof: "SELECT lock, epoch, token FROM palisade_presented_tokens WHERE lock = 'LOCK'"
                .into(),
        });
        poisoned.push(lock.clone());
    }
    (problems, poisoned)
}

/// The epoch `token` proves, or why it proves nothing.
fn verified_epoch(token: &PresentedToken, verifier: &TokenVerifier) -> Result<u64, String> {
    let lock = LockName::new(token.lock.clone())
        .map_err(|_| "its lock name is not one the coordinator issues".to_owned())?;
    let claims = verifier
        .verify(&token.token, Some(&lock))
        .map_err(|why| format!("the token presented for it does not verify ({why})"))?;
    if claims.epoch.0 != token.epoch {
        return Err(format!(
            "the token presented for it says epoch {}, the database read {}",
            claims.epoch.0, token.epoch
        ));
    }
    Ok(claims.epoch.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_core::{Epoch, HolderId, Principal, TokenSigner};

    fn token(signer: &TokenSigner, lock: &str, epoch: u64) -> PresentedToken {
        PresentedToken {
            lock: lock.into(),
            epoch,
            token: signer.sign(
                &LockName::new(lock).unwrap(),
                Epoch(epoch),
                &HolderId::new("w").unwrap(),
                &Principal::anonymous(),
                0,
            ),
        }
    }

    #[test]
    fn p4_fences_no_signed_token_backs_are_poisoned_and_the_coordinators_are_not() {
        let signer = TokenSigner::from_secret_bytes(&[7; 32]);
        let forger = TokenSigner::from_secret_bytes(&[8; 32]);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let max = i64::MAX as u64;
        let mut relabelled = token(&signer, "relabelled/1", 5);
        relabelled.epoch = max;
        let presented = [
            token(&signer, "ok/1", 7),
            token(&forger, "forged/1", max),
            relabelled,
            // The coordinator went back: its own token is above its floor now.
            token(&signer, "restored/1", 90),
            // Nobody holds it: its forged token is judged all the same.
            token(&forger, "unheld/1", max),
        ];
        let fences = BTreeMap::from(
            [
                ("ok/1", 7),
                ("forged/1", max),
                ("relabelled/1", max),
                ("restored/1", 90),
                ("bare/1", max),
                ("bare/2", 6),
            ]
            .map(|(lock, fence)| (lock.to_owned(), fence)),
        );
        let coordinator = BTreeMap::from(
            [
                ("ok/1", 7),
                ("forged/1", 7),
                ("relabelled/1", 7),
                ("restored/1", 40),
                ("bare/1", 7),
                ("bare/2", 7),
            ]
            .map(|(lock, floor)| (lock.to_owned(), floor)),
        );
        let (problems, poisoned) = judge("t", &fences, &presented, &coordinator, &verifier);
        assert_eq!(poisoned, ["bare/1", "forged/1", "relabelled/1", "unheld/1"]);
        assert!(problems
            .iter()
            .all(|p| p.code == "poisoned_fence" && p.severity == Severity::Critical));
        assert!(
            problems[0].message.contains("--lock bare/1") && problems[0].message.contains("7 now"),
            "{problems:?}"
        );
    }
}
