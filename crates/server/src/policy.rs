//! The lock policy in force ([`palisade_audit::policy`]): loaded at start, reloaded on SIGHUP,
//! consulted by every acquire.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use palisade_audit::policy::{Policy, PolicyError, PolicyRefusal};
use palisade_core::LockClass;

/// The policy a coordinator runs with.
#[derive(Debug)]
pub struct PolicyState {
    file: Option<PathBuf>,
    require: bool,
    current: RwLock<Arc<Policy>>,
}

impl PolicyState {
    /// No policy file: every lock is critical unless its acquire says otherwise, and nothing
    /// is refused for lack of a boundary.
    pub fn none() -> Self {
        Self {
            file: None,
            require: false,
            current: RwLock::new(Arc::new(Policy::none())),
        }
    }

    /// Loads `file` (`--policy`); with `require` (`--require-policy`), critical locks whose
    /// policy names no boundary are refused. `require` without a file is refused: every lock
    /// would be.
    pub fn load(file: Option<&Path>, require: bool) -> Result<Self, PolicyError> {
        let Some(file) = file else {
            if require {
                return Err(PolicyError(
                    "--require-policy needs --policy FILE: without one, every critical lock \
                     would be refused"
                        .into(),
                ));
            }
            return Ok(Self::none());
        };
        let policy = read(file)?;
        Ok(Self {
            file: Some(file.to_owned()),
            require,
            current: RwLock::new(Arc::new(policy)),
        })
    }

    /// Reads the file again; on any error the policy in force stays. Returns the rule count.
    pub fn reload(&self) -> Result<usize, PolicyError> {
        let Some(file) = &self.file else {
            return Ok(0);
        };
        let policy = read(file)?;
        let rules = policy.rules.len();
        *self.current.write().expect("not poisoned") = Arc::new(policy);
        Ok(rules)
    }

    /// The policy in force.
    pub fn current(&self) -> Arc<Policy> {
        self.current.read().expect("not poisoned").clone()
    }

    /// The policy file, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Whether critical locks without a boundary are refused.
    pub fn require(&self) -> bool {
        self.require
    }

    /// The class of an acquire of `lock` that asked for `requested`, or why it is refused.
    pub fn classify(
        &self,
        lock: &str,
        requested: Option<LockClass>,
    ) -> Result<LockClass, PolicyRefusal> {
        let policy = self.current();
        policy
            .classify(lock, requested, self.require)
            .map(|classified| classified.class)
    }
}

fn read(file: &Path) -> Result<Policy, PolicyError> {
    let metadata =
        std::fs::metadata(file).map_err(|e| PolicyError(format!("{}: {e}", file.display())))?;
    if metadata.len() > palisade_audit::policy::MAX_POLICY_BYTES as u64 {
        return Err(PolicyError(format!(
            "{}: {} bytes; the limit is {}",
            file.display(),
            metadata.len(),
            palisade_audit::policy::MAX_POLICY_BYTES
        )));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| PolicyError(format!("{}: {e}", file.display())))?;
    Policy::parse(&text).map_err(|e| PolicyError(format!("{}: {}", file.display(), e.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_reload_keeps_the_policy_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policy.toml");
        std::fs::write(&file, "[[lock]]\npattern = \"r/*\"\nclass = \"critical\"\n").unwrap();
        let state = PolicyState::load(Some(&file), false).unwrap();
        assert_eq!(state.current().rules.len(), 1);
        std::fs::write(&file, "[[lock]]\npattern = \"r/*\"\nclass = \"bogus\"\n").unwrap();
        let error = state.reload().unwrap_err();
        assert!(error.0.contains("bogus"), "{error}");
        assert_eq!(state.current().rules.len(), 1);
        std::fs::write(&file, "default_class = \"efficiency\"\n").unwrap();
        assert_eq!(state.reload().unwrap(), 0);
        assert_eq!(state.classify("x", None).unwrap(), LockClass::Efficiency);
    }

    #[test]
    fn require_policy_needs_a_file() {
        assert!(PolicyState::load(None, true).is_err());
        let state = PolicyState::load(None, false).unwrap();
        assert_eq!(state.classify("x", None).unwrap(), LockClass::Critical);
        assert!(PolicyState::load(Some(Path::new("/nonexistent/p.toml")), false).is_err());
    }
}
