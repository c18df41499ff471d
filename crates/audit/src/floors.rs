//! The lock floors a PostgreSQL boundary recorded, judged against the coordinator (P4, P6).
//!
//! A floor only rises in the database (`palisade_learn_floor`), so a forged one — 2^63-1 from
//! a man in the middle, or one call of the function by a role that may record floors — refuses
//! the lock's legitimate owner as superseded until the row goes. Writers verify the
//! coordinator's signed statement before they record a floor and (since migration 10) record
//! it too; the audit checks what is stored:
//! - a floor above the coordinator's own floor for that lock (floors only rise, at the
//!   coordinator too: a legitimate one is never above it): **poisoned**, critical;
//! - a statement that does not verify with the coordinator's keys, names another lock or
//!   another floor: **poisoned**, critical;
//! - a floor with no statement (a writer of an earlier version, or a bare
//!   `palisade_learn_floor(lock, floor)`): reported once, with how many, for the record.
//!
//! The repair of a poisoned floor is one command, `palisade resource forget-floor --postgres
//! URL --lock LOCK`, run as the owner: the row goes, and the lock's next fenced write learns
//! its floor again from the coordinator (verified).

use std::collections::BTreeMap;

use palisade_core::{LockName, TokenVerifier};
use serde::{Deserialize, Serialize};

use crate::{Problem, Severity};

/// Most floors the audit reads from one database (the highest first).
pub const MAX_FLOORS_READ: i64 = 1_000;

/// One row of `palisade_lock_floors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFloor {
    /// The lock.
    pub lock: String,
    /// The floor the database enforces.
    #[serde(with = "palisade_core::json::string")]
    pub floor: u64,
    /// The coordinator's signed statement recorded with it (none before migration 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
}

/// The problems of `floors`: `coordinator` is the coordinator's floor for each lock it was
/// asked about, `verifier` holds its keys.
pub fn judge(
    floors: &[StoredFloor],
    coordinator: &BTreeMap<String, u64>,
    verifier: &TokenVerifier,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut unsigned = Vec::new();
    for stored in floors {
        let why = poisoned(stored, coordinator.get(&stored.lock).copied(), verifier);
        if let Some(why) = why {
            problems.push(Problem {
                severity: Severity::Critical,
                code: "poisoned_floor".into(),
                message: format!(
                    "lock {}: the database enforces floor {} and {why}: every owner of the \
                     lock below it is refused as superseded. Repair: palisade resource \
                     forget-floor --postgres URL --lock {} (as the owner; the next fenced write \
                     learns the floor again from the coordinator)",
                    stored.lock, stored.floor, stored.lock
                ),
                proof: format!(
                    "SELECT floor, statement FROM palisade_lock_floors WHERE lock = '{}'",
                    stored.lock.replace('\'', "''")
                ),
            });
        } else if stored.statement.is_none() {
            unsigned.push(stored.lock.as_str());
        }
    }
    if !unsigned.is_empty() {
        problems.push(Problem {
            severity: Severity::Info,
            code: "floor_unsigned".into(),
            message: format!(
                "{} floor(s) recorded without the coordinator's statement (writers of an \
                 earlier version, or palisade_learn_floor(lock, floor)), e.g. {}: checked only \
                 against the coordinator's floor",
                unsigned.len(),
                unsigned[..unsigned.len().min(5)].join(", ")
            ),
            proof: "SELECT lock, floor FROM palisade_lock_floors WHERE statement IS NULL".into(),
        });
    }
    problems
}

/// Why `stored` is poisoned, if it is.
fn poisoned(
    stored: &StoredFloor,
    coordinator: Option<u64>,
    verifier: &TokenVerifier,
) -> Option<String> {
    if let Some(issued) = coordinator.filter(|issued| stored.floor > *issued) {
        return Some(format!(
            "the coordinator's floor for it is {issued} (a legitimate floor is never above it)"
        ));
    }
    let statement = stored.statement.as_deref()?;
    let lock = match LockName::new(stored.lock.clone()) {
        Ok(lock) => lock,
        Err(_) => return Some("its lock name is not one the coordinator issues".into()),
    };
    match verifier.verify_floor(statement, &lock) {
        Err(why) => Some(format!("its recorded statement does not verify ({why})")),
        Ok(claims) if claims.floor.0 != stored.floor => {
            Some(format!("its recorded statement says {}", claims.floor.0))
        }
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_core::{Epoch, TokenSigner};

    fn stored(lock: &str, floor: u64, statement: Option<String>) -> StoredFloor {
        StoredFloor {
            lock: lock.into(),
            floor,
            statement,
        }
    }

    #[test]
    fn p4_p6_forged_and_excessive_floors_are_poisoned_and_signed_ones_are_not() {
        let signer = TokenSigner::from_secret_bytes(&[7; 32]);
        let forger = TokenSigner::from_secret_bytes(&[8; 32]);
        let verifier = TokenVerifier::new([signer.verifying_key()]);
        let lock = |name: &str| LockName::new(name).unwrap();
        let sign = |s: &TokenSigner, name: &str, floor: u64| {
            Some(s.sign_floor(&lock(name), Epoch(floor), 0))
        };
        let max = i64::MAX as u64;
        let floors = [
            stored("ok/1", 5, sign(&signer, "ok/1", 5)),
            stored("forged/1", max, sign(&forger, "forged/1", max)),
            stored("replayed/1", 9, sign(&signer, "other/1", 9)),
            stored("raised/1", max, sign(&signer, "raised/1", 9)),
            stored("unsigned/1", 3, None),
            stored("unsigned/2", max, None),
        ];
        let coordinator = BTreeMap::from([
            ("ok/1".to_owned(), 7),
            ("unsigned/1".to_owned(), 3),
            ("unsigned/2".to_owned(), 12),
        ]);
        let problems = judge(&floors, &coordinator, &verifier);
        let poisoned: Vec<&str> = problems
            .iter()
            .filter(|p| p.code == "poisoned_floor" && p.severity == Severity::Critical)
            .map(|p| p.message.split(':').next().unwrap())
            .collect();
        assert_eq!(
            poisoned,
            [
                "lock forged/1",
                "lock replayed/1",
                "lock raised/1",
                "lock unsigned/2"
            ]
        );
        let unsigned: Vec<&Problem> = problems
            .iter()
            .filter(|p| p.code == "floor_unsigned")
            .collect();
        assert_eq!(unsigned.len(), 1);
        assert!(
            unsigned[0].message.starts_with("1 floor(s)"),
            "{unsigned:?}"
        );
    }
}
