//! Small value types: lock names, holders, epochs, lease ids, classes, time.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_HOLDER_BYTES, MAX_LOCK_NAME_BYTES, MAX_REQUEST_ID_BYTES};

/// Milliseconds on the coordinator's monotonic clock. Only differences are meaningful; the
/// origin is wherever the runtime started counting.
pub type Millis = u64;

/// Input that breaks one of Palisade's rules. The message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// A validated lock name: 1–256 bytes of `[A-Za-z0-9._/-]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct LockName(String);

impl LockName {
    /// Validates `name` against the lock-name rules.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidInput> {
        let name = name.into();
        if name.is_empty() {
            return Err(InvalidInput("lock name is empty".into()));
        }
        if name.len() > MAX_LOCK_NAME_BYTES {
            return Err(InvalidInput(format!(
                "lock name is {} bytes; the maximum is {MAX_LOCK_NAME_BYTES}",
                name.len()
            )));
        }
        if let Some(bad) = name.chars().find(|c| !is_lock_name_char(*c)) {
            return Err(InvalidInput(format!(
                "lock name contains {bad:?}; allowed are A-Z a-z 0-9 . _ / -"
            )));
        }
        Ok(Self(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for LockName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        LockName::new(text).map_err(serde::de::Error::custom)
    }
}

fn is_lock_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-')
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who holds a lease: free text chosen by the client (1–128 bytes, no control characters),
/// for people and logs. It is not an identity: the lease id and the token are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HolderId(String);

impl HolderId {
    /// Validates a holder id.
    pub fn new(holder: impl Into<String>) -> Result<Self, InvalidInput> {
        let holder = holder.into();
        if holder.is_empty() {
            return Err(InvalidInput("holder is empty".into()));
        }
        if holder.len() > MAX_HOLDER_BYTES {
            return Err(InvalidInput(format!(
                "holder is {} bytes; the maximum is {MAX_HOLDER_BYTES}",
                holder.len()
            )));
        }
        if holder.chars().any(char::is_control) {
            return Err(InvalidInput("holder contains a control character".into()));
        }
        Ok(Self(holder))
    }

    /// The holder as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client-chosen id of one acquire (1–64 bytes of `[A-Za-z0-9._-]`), so that an acquire
/// retried after a timeout or a leader change finds the lease its first attempt was granted
/// instead of leaving a second lease behind. Kept with the lease (durably, and replicated).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(String);

impl RequestId {
    /// Validates a request id.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidInput> {
        let id = id.into();
        if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES {
            return Err(InvalidInput(format!(
                "request id must be 1–{MAX_REQUEST_ID_BYTES} bytes, got {}",
                id.len()
            )));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(InvalidInput(
                "request id may contain only A-Z a-z 0-9 . _ -".into(),
            ));
        }
        Ok(Self(id))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An ownership epoch (fencing token value). Strictly increasing per lock; epochs of two
/// different locks are never compared. The coordinator draws every epoch from one counter, so
/// an epoch is also never issued twice across locks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The id of one lease. A lease's id is the epoch it was granted at (one grant, one epoch, one
/// lease), so ids are never reused either.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Whether a lock's writes must be fenced (`Critical`) or duplicate work is merely wasteful
/// (`Efficiency`). Recorded and reported; the coordinator treats both alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockClass {
    /// Writes under this lock must be fenced at the resource.
    #[default]
    Critical,
    /// Duplicate work is wasteful, not harmful.
    Efficiency,
}

impl LockClass {
    /// The class's name as used in the CLI, JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            LockClass::Critical => "critical",
            LockClass::Efficiency => "efficiency",
        }
    }

    /// Parses `critical` or `efficiency`.
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        match text {
            "critical" => Ok(LockClass::Critical),
            "efficiency" => Ok(LockClass::Efficiency),
            other => Err(InvalidInput(format!(
                "class {other:?} is unknown; use critical or efficiency"
            ))),
        }
    }
}

impl fmt::Display for LockClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_follow_the_charset_and_length_rules() {
        assert!(LockName::new("report/7").is_ok());
        assert!(LockName::new("a.b_c-D/9").is_ok());
        assert!(LockName::new("x".repeat(256)).is_ok());
        assert!(LockName::new("x".repeat(257)).is_err());
        assert!(LockName::new("").is_err());
        assert!(LockName::new("has space").is_err());
        assert!(LockName::new("é").is_err());
        assert!(LockName::new("a%2F").is_err());
    }

    #[test]
    fn holders_are_bounded_and_printable() {
        assert!(HolderId::new("worker-1@host").is_ok());
        assert!(HolderId::new("").is_err());
        assert!(HolderId::new("a\nb").is_err());
        assert!(HolderId::new("h".repeat(129)).is_err());
    }

    #[test]
    fn classes_parse_and_print() {
        assert_eq!(LockClass::parse("critical").unwrap(), LockClass::Critical);
        assert_eq!(
            LockClass::parse("efficiency").unwrap().as_str(),
            "efficiency"
        );
        assert!(LockClass::parse("urgent").is_err());
    }
}
