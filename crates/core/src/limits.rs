//! Named limits, each with its reason. Every queue and every size in Palisade is bounded.

/// Longest lock name, in bytes. Names travel in URLs, tokens and headers; 256 bytes keeps a
/// token well under common 8 KiB header limits.
pub const MAX_LOCK_NAME_BYTES: usize = 256;

/// Longest holder id, in bytes. It is copied into every token and every log line.
pub const MAX_HOLDER_BYTES: usize = 128;
/// Longest principal name, in bytes.
pub const MAX_PRINCIPAL_BYTES: usize = 128;

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

/// Most token bytes a verifier will look at. A valid token is under 900 bytes.
pub const MAX_TOKEN_TEXT_BYTES: usize = 1_024;

/// Longest request id of an acquire (see `RequestId`).
pub const MAX_REQUEST_ID_BYTES: usize = 64;

/// Most client connections a server holds open at once, before the process's descriptor limit
/// lowers it (see `palisade-listener`): each costs a descriptor and buffers.
pub const MAX_CONNECTIONS: usize = 4_096;

/// Descriptors a server keeps for itself (store files, logs, peers) when it derives its
/// connection limit from the process's descriptor limit.
pub const RESERVED_DESCRIPTORS: usize = 64;

/// Longest time a client may take to send a request's headers, and longest time an HTTP/1
/// connection may sit idle between requests. A header drip or an idle socket then costs a
/// descriptor for at most this long.
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;

/// Longest time a request body (a JSON document, a stored value) may take to arrive.
pub const BODY_READ_TIMEOUT_MS: u64 = 10_000;

/// A connection with no bytes either way for this long is asked to close (gracefully: a
/// request still running finishes first). HTTP/2 pings count as bytes.
pub const IDLE_TIMEOUT_MS: u64 = 120_000;

/// HTTP/2 ping interval; a peer that does not answer within [`KEEPALIVE_TIMEOUT_MS`] is gone.
pub const KEEPALIVE_INTERVAL_MS: u64 = 20_000;

/// How long an HTTP/2 ping may wait for its answer.
pub const KEEPALIVE_TIMEOUT_MS: u64 = 10_000;

/// Most requests at once on one HTTP/2 connection (gRPC streams included). Beyond it a
/// client queues new streams itself, silently: with long-lived watch and keepalive streams
/// on one connection (grpcio shares one connection between its channels to an address), 256
/// left keepalives queued until their leases expired. 1,024 holds a process's hundreds of
/// streams; memory stays bounded by the connection's flow-control window, the 64 KiB body
/// limit, authentication before bodies, and the per-principal limits.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;

/// At the connection limit, a new connection evicts the one that has gone longest without a
/// request (none in flight, none started or finished for at least this long; HTTP/2 pings and
/// settings do not count); otherwise the newcomer waits for a free slot.
pub const EVICT_SILENT_MS: u64 = 1_000;

/// How long a new connection waits for a free slot at the limit before it is closed. The
/// wait happens beside the accept loop, never in it.
pub const ADMISSION_WAIT_MS: u64 = 2_000;

/// Most new connections waiting for a slot at once (fewer with a low descriptor limit); beyond
/// it newcomers stay in the kernel's backlog until one of the waiting is settled.
pub const MAX_ADMISSION_WAITERS: usize = 64;

/// How long a connection asked to close may take to finish before it is dropped.
pub const CLOSE_GRACE_MS: u64 = 1_000;

/// Largest auth or ACL file the coordinator reads, in bytes (it is read at start and on every
/// SIGHUP; a runaway file must not exhaust memory).
pub const MAX_AUTH_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Most rules in an ACL file. Each request checks its caller's rules in order.
pub const MAX_ACL_RULES: usize = 10_000;
