//! Named limits, each with its reason. Every queue and every size in Palisade is bounded.

/// Longest lock name, in bytes. Names travel in URLs, tokens and headers; 256 bytes keeps a
/// token well under common 8 KiB header limits.
pub const MAX_LOCK_NAME_BYTES: usize = 256;

/// Longest holder id, in bytes. It is copied into every token and every log line.
pub const MAX_HOLDER_BYTES: usize = 128;

/// Shortest lease TTL. A lease shorter than a disk commit and a network round trip would
/// expire before its holder could use it.
pub const MIN_TTL_MS: u64 = 10;

/// Longest lease TTL: one hour. A crashed holder blocks its lock for at most this long, and
/// the TTL is restarted in full after every coordinator restart or failover.
pub const MAX_TTL_MS: u64 = 3_600_000;

/// TTL used when a request names none.
pub const DEFAULT_TTL_MS: u64 = 10_000;

/// Longest time an acquire may wait for a held lock: five minutes. Longer waits are better
/// written as a retry loop in the caller, which can notice its own cancellation.
pub const MAX_WAIT_MS: u64 = 300_000;

/// Most acquires that may wait on one lock at once. Each waiter holds a connection and memory
/// in the coordinator; a longer queue means the lock is a bottleneck, which an error shows
/// sooner than a timeout does.
pub const MAX_WAITERS_PER_LOCK: usize = 1_024;

/// Most tokens bytes a verifier will look at. A valid token is under 700 bytes.
pub const MAX_TOKEN_TEXT_BYTES: usize = 1_024;

/// Longest request id of an acquire (see `RequestId`).
pub const MAX_REQUEST_ID_BYTES: usize = 64;
