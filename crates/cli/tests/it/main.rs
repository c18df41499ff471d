//! The `palisade` binary's integration tests, as one test binary: one link instead of one
//! per file (each links the whole dependency graph). Each module is one area; `common` runs
//! the real binary.

mod common;

mod audit;
mod bench_compare;
mod boundary_witness;
mod cli;
mod client_tls;
mod clock;
mod cluster;
mod cluster_departure;
mod console_browser;
mod crash_churn;
mod docs_blocks;
mod docs_names;
mod drill;
mod effects;
mod function_sizes;
mod hardening;
mod imports;
mod lock_run;
mod lock_watch;
mod metrics_docs;
mod peer_tls;
mod poisoned_fence;
mod poisoned_floor;
mod readiness;
mod resource_cli;
mod restore;
mod security;
