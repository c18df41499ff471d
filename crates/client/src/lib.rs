//! Rust client of the Palisade coordinator.
//!
//! [`Client::acquire`] returns a [`LeaseHandle`] that renews the lease in the background and
//! tells its holder when the lease must be considered lost. The holder's view is conservative:
//! the lease counts as valid until `sent + ttl`, where `sent` is when the acquire or the last
//! successful renewal was *sent*. The coordinator counts the TTL from when it commits the
//! request, which is later, so the holder always believes its lease lost before the coordinator
//! can expire it (assuming both clocks run at about the same rate).
//!
//! A lease is not a fence: a holder that pauses after checking [`LeaseHandle::is_valid`] can
//! still write late. Resources must check the token's epoch (see `docs/` of the project).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod lease;

use std::time::Duration;

use palisade_core::LockClass;
use palisade_proto::v1 as pb;
use pb::coordinator_client::CoordinatorClient;
use tonic::transport::{Channel, Endpoint};

pub use error::ClientError;
pub use lease::{LeaseHandle, LeaseState};

/// Default coordinator endpoint.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7420";
/// How long connecting to one endpoint may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Time allowed for a request, on top of its wait time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What to acquire, and how.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    /// The lock's name.
    pub lock: String,
    /// Lease TTL.
    pub ttl: Duration,
    /// How long to wait for a held lock (zero: fail at once).
    pub wait: Duration,
    /// Who holds it (free text for people and logs).
    pub holder: String,
    /// The lock's class.
    pub class: LockClass,
}

impl AcquireOptions {
    /// Options with a 10 s TTL, no wait, class critical, and a holder of `user@host:pid`.
    pub fn new(lock: impl Into<String>) -> Self {
        Self {
            lock: lock.into(),
            ttl: Duration::from_secs(10),
            wait: Duration::ZERO,
            holder: default_holder(),
            class: LockClass::Critical,
        }
    }
}

/// `user@host:pid` of this process.
pub fn default_holder() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    format!("{user}@{host}:{}", std::process::id())
}

/// A granted lease, as the coordinator answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The lock.
    pub lock: String,
    /// The ownership epoch.
    pub epoch: u64,
    /// The lease id (for renew and release).
    pub lease_id: u64,
    /// The lease TTL.
    pub ttl_ms: u64,
    /// The holder recorded in the lease.
    pub holder: String,
    /// The signed token to present to resources.
    pub token: String,
    /// The lock's class.
    pub class: LockClass,
}

/// A connection to a coordinator.
#[derive(Clone, Debug)]
pub struct Client {
    inner: CoordinatorClient<Channel>,
}

impl Client {
    /// Connects to the first reachable of `endpoints` (URLs like `http://127.0.0.1:7420`).
    pub async fn connect(endpoints: &[impl AsRef<str>]) -> Result<Self, ClientError> {
        let mut last_error = ClientError::InvalidArgument("no endpoint given".into());
        for url in endpoints {
            let url = url.as_ref();
            let endpoint = match Endpoint::from_shared(url.to_owned()) {
                Ok(endpoint) => endpoint
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(10)),
                Err(e) => {
                    last_error = ClientError::InvalidArgument(format!("endpoint {url:?}: {e}"));
                    continue;
                }
            };
            match endpoint.connect().await {
                Ok(channel) => {
                    return Ok(Self {
                        inner: CoordinatorClient::new(channel),
                    })
                }
                Err(e) => {
                    last_error = ClientError::Unavailable(format!("cannot connect to {url}: {e}"))
                }
            }
        }
        Err(last_error)
    }

    /// Acquires a lock and keeps its lease alive in the background until the handle is
    /// released or dropped.
    pub async fn acquire(&self, options: AcquireOptions) -> Result<LeaseHandle, ClientError> {
        let sent = tokio::time::Instant::now();
        let grant = self.acquire_once(&options).await?;
        Ok(LeaseHandle::start(self.clone(), grant, sent))
    }

    /// Acquires a lock once, without a keepalive (the lease expires after its TTL unless
    /// renewed).
    pub async fn acquire_once(&self, options: &AcquireOptions) -> Result<Grant, ClientError> {
        let request = pb::AcquireRequest {
            lock: options.lock.clone(),
            ttl_ms: Some(duration_ms(options.ttl)?),
            wait_ms: u64::try_from(options.wait.as_millis()).unwrap_or(u64::MAX),
            holder: options.holder.clone(),
            class: match options.class {
                LockClass::Critical => pb::LockClass::Critical as i32,
                LockClass::Efficiency => pb::LockClass::Efficiency as i32,
            },
        };
        let mut request = tonic::Request::new(request);
        request.set_timeout(options.wait + REQUEST_TIMEOUT);
        let reply = self.inner.clone().acquire(request).await?.into_inner();
        Ok(Grant {
            lock: reply.lock,
            epoch: reply.epoch,
            lease_id: reply.lease_id,
            ttl_ms: reply.ttl_ms,
            holder: reply.holder,
            token: reply.token,
            class: if reply.class == pb::LockClass::Efficiency as i32 {
                LockClass::Efficiency
            } else {
                LockClass::Critical
            },
        })
    }

    /// Renews a lease by its full TTL.
    pub async fn renew(&self, lease_id: u64) -> Result<pb::RenewResponse, ClientError> {
        let request = with_timeout(pb::RenewRequest { lease_id });
        Ok(self.inner.clone().renew(request).await?.into_inner())
    }

    /// Releases a lease.
    pub async fn release(&self, lease_id: u64) -> Result<(), ClientError> {
        let request = with_timeout(pb::ReleaseRequest { lease_id });
        self.inner.clone().release(request).await?;
        Ok(())
    }

    /// The state of one lock.
    pub async fn describe(&self, lock: &str) -> Result<pb::LockInfo, ClientError> {
        let request = with_timeout(pb::DescribeRequest { lock: lock.into() });
        Ok(self.inner.clone().describe(request).await?.into_inner())
    }

    /// Every held or awaited lock.
    pub async fn list(&self) -> Result<Vec<pb::LockInfo>, ClientError> {
        let request = with_timeout(pb::ListRequest {});
        Ok(self.inner.clone().list(request).await?.into_inner().locks)
    }

    /// The coordinator's public verification keys.
    pub async fn keys(&self) -> Result<Vec<pb::PublicKey>, ClientError> {
        let request = with_timeout(pb::KeysRequest {});
        Ok(self.inner.clone().keys(request).await?.into_inner().keys)
    }

    /// Ownership transitions of `lock`, starting with its current state.
    pub async fn watch(&self, lock: &str) -> Result<tonic::Streaming<pb::LockEvent>, ClientError> {
        let request = tonic::Request::new(pb::WatchRequest { lock: lock.into() });
        Ok(self.inner.clone().watch(request).await?.into_inner())
    }

    pub(crate) fn grpc(&self) -> CoordinatorClient<Channel> {
        self.inner.clone()
    }
}

fn with_timeout<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(REQUEST_TIMEOUT);
    request
}

fn duration_ms(duration: Duration) -> Result<u64, ClientError> {
    u64::try_from(duration.as_millis())
        .map_err(|_| ClientError::InvalidArgument("duration too large".into()))
}

/// Percent-encodes one URL path segment (lock names contain `/`, which must travel as `%2F`
/// in HTTP paths). Unreserved characters stay as they are.
pub fn encode_path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// The proto messages, for callers that read `describe`/`list` results.
pub use palisade_proto::v1 as proto;
