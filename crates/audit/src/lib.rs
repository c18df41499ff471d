//! Lock policy and audit.
//!
//! - [`policy`]: the policy file (which locks are critical, where their writes are fenced, the
//!   fallback when a receiver cannot enforce). Pure.
//! - [`assess`]: findings from what the coordinator and the boundaries report. Pure: every
//!   rule is a unit test.
//! - [`observe`]: asks each boundary (a reference store, a guarded PostgreSQL table, an
//!   effects ledger) what it holds for the locks, and runs the probes.
//!
//! The coordinator runs the audit (`GET /v1/audit`, and `POST /v1/audit/probe` for admins):
//! it holds the policy with its credentials, and the epochs. `palisade audit` and the console
//! show its report.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assess;
pub mod fences;
pub mod floors;
pub mod guard;
pub mod observe;
pub mod policy;
pub mod search_path;

use std::collections::BTreeMap;

use palisade_core::LockClass;
use serde::{Deserialize, Serialize};

pub use assess::assess;
pub use policy::{Boundary, Policy, PolicyError, PolicyRefusal};

/// How much a finding matters. `Critical` findings make `palisade audit` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// A correctness-critical lock may accept a stale write, or cannot be checked.
    Critical,
    /// Something to fix that does not by itself admit stale writes.
    Warning,
    /// For the record.
    Info,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// A stable code for scripts (`no_boundary`, `boundary_unreachable`, `fence_ahead`, …).
    pub code: String,
    /// The lock or pattern it is about.
    pub subject: String,
    /// What was found and what to do, for people.
    pub message: String,
    /// The query or request that proved it, for an operator to run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// A problem a boundary's own state shows (PostgreSQL's catalogs: who may write, which
/// triggers fire); the audit turns each into a [`Finding`] about that boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// How much it matters.
    pub severity: Severity,
    /// A stable code (`unfenced_writer`, `guard_trigger_disabled`, …).
    pub code: String,
    /// What was found and what to do.
    pub message: String,
    /// The query that shows it.
    pub proof: String,
}

/// A lock as the coordinator reports it (`GET /v1/locks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveLock {
    /// The lock.
    pub lock: String,
    /// Its current epoch (the holder's); a decimal string in JSON ([`palisade_core::json`]).
    #[serde(with = "palisade_core::json::string")]
    pub epoch: u64,
    /// Its holder.
    pub holder: String,
    /// Its class as recorded on the lease.
    pub class: LockClass,
    /// Time left on the lease.
    pub remaining_ms: u64,
    /// When the lease was granted (ms since the Unix epoch; 0: unknown).
    #[serde(default)]
    pub granted_unix_ms: u64,
    /// Acquires waiting.
    pub waiters: usize,
}

/// What a boundary reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundaryReport {
    /// `resource`, `postgres` or `effects`.
    pub kind: String,
    /// Where it is (passwords redacted).
    pub target: String,
    /// The patterns of the rules that name it.
    pub patterns: Vec<String>,
    /// Whether it answered.
    pub reachable: bool,
    /// Why it did not answer, or what went wrong asking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its fence for each live lock asked about (resource: the lock's fence; postgres: the
    /// highest `last_fence` of the lock's rows).
    #[serde(with = "palisade_core::json::string_map")]
    pub fences: BTreeMap<String, u64>,
    /// The resource says it was copied back and refuses writes until repaired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_required: Option<bool>,
    /// The resource's restore floor (0: never restored).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "palisade_core::json::option_string"
    )]
    pub restore_floor: Option<u64>,
    /// Coordinator keys the resource trusts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_keys: Vec<String>,
    /// Rejections by reason since the boundary started (resource), or as counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rejection_totals: BTreeMap<String, u64>,
    /// The latest rejections (newest first, at most [`observe::MAX_REJECTIONS_SHOWN`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_rejections: Vec<serde_json::Value>,
    /// Postgres: the table the policy's name resolved to, schema-qualified (the audit sets
    /// its own search_path, [`observe::AUDIT_SEARCH_PATH`], whatever its role's is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_table: Option<String>,
    /// Postgres: whether the table is registered as guarded (`palisade_guarded_tables`);
    /// whether its triggers are Palisade's and fire always is in `problems`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard_installed: Option<bool>,
    /// What the boundary's own state shows is wrong with it (see [`guard`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
    /// Postgres: the lock floors the database enforces (at most
    /// [`floors::MAX_FLOORS_READ`], the highest first), judged by the coordinator
    /// ([`floors::judge`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<floors::StoredFloor>,
    /// Postgres: the greatest token presented for each live lock asked about (migration 11),
    /// judged with the fences by the coordinator ([`fences::judge`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub presented_tokens: Vec<fences::PresentedToken>,
    /// Postgres: the locks whose fence [`fences::judge`] found poisoned (reported there, not
    /// again as `fence_ahead`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poisoned_fences: Vec<String>,
    /// Effects: operations by state.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub operations: BTreeMap<String, u64>,
    /// The probe's result, when one ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

/// What a probe did at a boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Probe {
    /// The obsolete write was refused, as it must be.
    Refused {
        /// What was attempted and how it was refused.
        detail: String,
    },
    /// The obsolete write was ACCEPTED: this boundary does not fence.
    Accepted {
        /// What was attempted.
        detail: String,
    },
    /// The probe could not run.
    Failed {
        /// Why.
        detail: String,
    },
    /// This kind of boundary has no probe.
    NotSupported {
        /// Why.
        detail: String,
    },
}

impl Probe {
    /// `refused`, `accepted`, `failed` or `not_supported`, as in the JSON.
    pub fn result(&self) -> &'static str {
        match self {
            Probe::Refused { .. } => "refused",
            Probe::Accepted { .. } => "accepted",
            Probe::Failed { .. } => "failed",
            Probe::NotSupported { .. } => "not_supported",
        }
    }

    /// What was attempted and what happened, for people.
    pub fn detail(&self) -> &str {
        match self {
            Probe::Refused { detail }
            | Probe::Accepted { detail }
            | Probe::Failed { detail }
            | Probe::NotSupported { detail } => detail,
        }
    }
}

/// A policy rule as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatternReport {
    /// The pattern.
    pub pattern: String,
    /// Its class.
    pub class: LockClass,
    /// Its boundary, for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boundary: Option<String>,
    /// Its fallback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Live locks it matches.
    pub live_locks: usize,
}

/// A live lock as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockReport {
    /// The lock.
    pub lock: String,
    /// Its class by the policy (the lease's when no rule names it).
    pub class: LockClass,
    /// The coordinator's epoch.
    #[serde(with = "palisade_core::json::string")]
    pub epoch: u64,
    /// Its holder.
    pub holder: String,
    /// Time left.
    pub remaining_ms: u64,
    /// When the lease was granted (ms since the Unix epoch; 0: unknown).
    #[serde(default)]
    pub granted_unix_ms: u64,
    /// Acquires waiting.
    pub waiters: usize,
    /// The rule that decides it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Its boundary, for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boundary: Option<String>,
    /// The boundary's fence for it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "palisade_core::json::option_string"
    )]
    pub fence: Option<u64>,
    /// `epoch - fence` when the fence is behind (the holder has not written yet, or writes
    /// elsewhere); negative values are reported as `fence_ahead` findings instead.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "palisade_core::json::option_string"
    )]
    pub lag: Option<u64>,
    /// Stale-epoch rejections the boundary recorded for it recently.
    pub stale_rejections: usize,
}

/// The whole audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// When it was made (ms since the Unix epoch).
    pub generated_at_ms: u64,
    /// Where the policy came from (`None`: no policy file).
    pub policy_file: Option<String>,
    /// Whether critical locks without a boundary are refused.
    pub require_policy: bool,
    /// The class of locks no rule names.
    pub default_class: LockClass,
    /// Per rule.
    pub patterns: Vec<PatternReport>,
    /// Per live lock.
    pub locks: Vec<LockReport>,
    /// Per boundary the policy names.
    pub boundaries: Vec<BoundaryReport>,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
}

impl Report {
    /// Whether a critical finding stands (`palisade audit` exits non-zero).
    pub fn has_critical(&self) -> bool {
        self.findings
            .iter()
            .any(|finding| finding.severity == Severity::Critical)
    }
}

/// A finding of `severity` with the query that shows it (on one line).
pub(crate) fn problem(severity: Severity, code: &str, message: String, proof: &str) -> Problem {
    Problem {
        severity,
        code: code.to_owned(),
        message,
        proof: proof.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

/// PostgreSQL's error as text.
pub(crate) fn pg(error: tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}
