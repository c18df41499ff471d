//! Why a member is not ready although it sees a leader: conditions that its transport (and,
//! later, its clock or disk checks) report while they hold, and clear when they pass.
//!
//! `/readyz` of a member said ready whenever it saw a leader, so a member refusing every
//! append of a leader that lost its history (`network::check_history`) looked like an
//! ordinary follower to a load balancer and to `palisade cluster status`. Each condition here
//! is one reason, told in words, shown by both.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A condition that keeps a member from being ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Condition {
    /// It refuses the leader's entries: they contradict entries it applied (the members that
    /// elected that leader lost them).
    DivergedHistory,
}

/// The conditions that hold now; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Health {
    conditions: Arc<Mutex<BTreeMap<Condition, String>>>,
}

impl Health {
    /// `condition` holds, for the reason `why` (replacing an earlier reason).
    pub fn set(&self, condition: Condition, why: String) {
        self.conditions().insert(condition, why);
    }

    /// `condition` no longer holds.
    pub fn clear(&self, condition: Condition) {
        self.conditions().remove(&condition);
    }

    /// The reasons this member is not ready, in a fixed order (empty when none holds).
    pub fn reasons(&self) -> Vec<String> {
        self.conditions().values().cloned().collect()
    }

    fn conditions(&self) -> std::sync::MutexGuard<'_, BTreeMap<Condition, String>> {
        // A panic while holding it cannot leave the map half-changed: keep using it.
        self.conditions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_reported_until_cleared() {
        let health = Health::default();
        assert!(health.reasons().is_empty());
        let shared = health.clone();
        shared.set(Condition::DivergedHistory, "the leader sent 5-3".into());
        assert_eq!(health.reasons(), vec!["the leader sent 5-3".to_owned()]);
        shared.clear(Condition::DivergedHistory);
        assert!(health.reasons().is_empty());
    }
}
