//! Palisade's benchmarks, run by `palisade bench`. They measure; they assert nothing (the
//! machines are shared and noisy): ratios measured side by side in one run are what to read.
//!
//! - [`acquire`]: acquire+release cycles per second against a single node or a cluster,
//!   compared in the same run with Redis and etcd ([`compare`]);
//! - [`fence`]: fenced writes on PostgreSQL and on the reference store;
//! - [`effects`]: the effects ledger;
//! - [`sql_token`]: a SQL writer bound to its token against the plain statement.
//!
//! Imports run one way: `acquire` → `compare` → `cycle`; `fence`, `effects` → `probe`.

pub mod acquire;
pub mod compare;
pub mod cycle;
pub mod effects;
pub mod fence;
pub mod probe;
pub mod sql_token;

pub use acquire::{run_acquire, AcquireBenchArgs};
pub use effects::{run as run_effects, EffectsBenchArgs};
pub use fence::{run_postgres, run_resource, PostgresBenchArgs, ResourceBenchArgs};
