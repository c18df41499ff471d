//! What the command-line front ends share: output for people and scripts, and client
//! credentials from flags and the environment. Used by the `palisade` command and by its
//! benchmarks (`palisade-bench`).

pub mod credentials;
pub mod output;
