//! The coordinator of one node: its durable state and the single owner of its lease table.
//!
//! - [`store`]: the `LeaseStore` trait (its contract states durability), the in-memory store and
//!   the redb store of earlier versions; [`log_store`]: the single node's lease log (one record
//!   and one fdatasync per commit); [`store_conformance`]: the suite every store passes;
//! - [`engine`]: the lease table behind a queue, batching and group commit; [`gateway`]: the
//!   engine, or "not the leader" in a cluster; [`feed`]: the last ownership transitions;
//! - [`high_water`]: the epoch bound kept outside the data directory; [`backup`]: the backup
//!   format, restores that never issue an epoch twice, and the restore record; [`keys`]: the
//!   signing key; [`metrics`]; [`lease_secret`]: the secret of lease ids.
//!
//! The cluster (`palisade-cluster`) and the front ends (`palisade-server`) are built on it;
//! it imports neither.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backup;
pub mod counter_ahead;
pub mod engine;
pub mod feed;
pub mod gateway;
pub mod high_water;
pub mod keys;
pub mod lease_secret;
pub mod log_store;
pub mod metrics;
pub mod steppable_clock;
pub mod store;
pub mod store_conformance;
pub mod transition;

/// File name of the lease store (the lease log) inside the data directory.
pub const STORE_FILE: &str = "coordinator.log";
/// File name of the lease store of versions before the lease log (redb); moved into the log
/// at the first start ([`log_store::open_in`]).
pub const LEGACY_STORE_FILE: &str = "coordinator.redb";
/// File of a cluster member's store (its Raft log and state machine) inside the data
/// directory.
pub const CLUSTER_STORE_FILE: &str = "cluster.redb";
