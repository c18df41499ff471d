//! Small value types: lock names, holders, epochs, lease ids, classes, time.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_HOLDER_BYTES, MAX_LOCK_NAME_BYTES, MAX_PRINCIPAL_BYTES, MAX_REQUEST_ID_BYTES,
};

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

/// The id of one lease: 128 bits the coordinator draws from its secret for each grant, so that
/// nobody can guess a live lease's id from another (ids are capabilities: renew and release name
/// one). Written as 32 lower-case hex digits in JSON, gRPC, the CLI and durable state.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LeaseId(pub u128);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

impl std::str::FromStr for LeaseId {
    type Err = InvalidInput;

    /// Parses exactly 32 hex digits.
    fn from_str(text: &str) -> Result<Self, InvalidInput> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(InvalidInput(format!(
                "lease id {:?} is not 32 hex digits",
                text.chars().take(64).collect::<String>()
            )));
        }
        u128::from_str_radix(text, 16)
            .map(LeaseId)
            .map_err(|_| InvalidInput("lease id is not 32 hex digits".into()))
    }
}

impl Serialize for LeaseId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// An authenticated identity: the name of a principal in the coordinator's auth file (or a
/// client certificate's name). 1–128 bytes of `[A-Za-z0-9._@:-]`. Recorded with each lease (only
/// that principal, or an admin, may renew or release it) and carried in its token, so that a
/// resource can check who writes, not only when. With no authentication configured, every
/// caller is [`Principal::anonymous`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Principal(String);

impl Principal {
    /// The principal of every caller when the coordinator runs without authentication.
    pub const ANONYMOUS: &'static str = "anonymous";

    /// Validates a principal name.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidInput> {
        let name = name.into();
        if name.is_empty() || name.len() > MAX_PRINCIPAL_BYTES {
            return Err(InvalidInput(format!(
                "principal must be 1–{MAX_PRINCIPAL_BYTES} bytes, got {}",
                name.len()
            )));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b':'))
        {
            return Err(InvalidInput(format!(
                "principal {name:?} may contain only A-Z a-z 0-9 . _ - @ :"
            )));
        }
        Ok(Self(name))
    }

    /// The caller of an unauthenticated coordinator.
    pub fn anonymous() -> Self {
        Self(Self::ANONYMOUS.into())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Principal {
    fn default() -> Self {
        Self::anonymous()
    }
}

impl<'de> Deserialize<'de> for Principal {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Principal::new(text).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
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
    fn lease_ids_are_32_hex_digits_both_ways() {
        let id = LeaseId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let text = id.to_string();
        assert_eq!(text, "0123456789abcdef0011223344556677");
        assert_eq!(text.parse::<LeaseId>().unwrap(), id);
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{text}\""));
        assert!("12".parse::<LeaseId>().is_err());
        assert!("+123456789abcdef0011223344556677"
            .parse::<LeaseId>()
            .is_err());
        assert!("0123456789abcdef001122334455667g"
            .parse::<LeaseId>()
            .is_err());
    }

    #[test]
    fn principals_are_bounded_names() {
        assert!(Principal::new("orders-service@prod").is_ok());
        assert!(Principal::new("").is_err());
        assert!(Principal::new("a b").is_err());
        assert!(Principal::new("p".repeat(129)).is_err());
        assert_eq!(Principal::default().as_str(), "anonymous");
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
