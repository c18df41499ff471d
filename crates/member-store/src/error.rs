//! Why a cluster member could not start, or stopped, typed: a caller can tell a bad
//! configuration from a storage failure.

/// Why a cluster member could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// `--node-id` / `--cluster` / `--join` do not describe a valid member.
    #[error("invalid cluster configuration: {0}")]
    Config(String),
    /// The cluster store could not be opened, read or written.
    #[error("cluster store: {0}")]
    Store(String),
    /// The data directory holds something a cluster member must not start over.
    #[error("{0}")]
    DataDirectory(String),
    /// openraft refused to start or failed.
    #[error("raft: {0}")]
    Raft(String),
    /// Raft stopped on a fatal error (a storage failure): the member no longer takes part.
    #[error("raft stopped on a fatal error: {0}")]
    RaftStopped(String),
    /// This member was removed from the cluster's membership (`palisade cluster remove`): it
    /// stops rather than campaign in a cluster that no longer counts it. `palisade serve`
    /// exits 10.
    #[error("{0}")]
    Removed(String),
    /// No randomness for a store id.
    #[error("no randomness for a store id: {0}")]
    Randomness(String),
}
