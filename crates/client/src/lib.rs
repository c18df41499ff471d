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
mod stats;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_core::LockClass;
use palisade_proto::v1 as pb;
use pb::coordinator_client::CoordinatorClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

pub use error::ClientError;
pub use lease::{LeaseHandle, LeaseState};
pub use stats::ClientStats;
use stats::Event;

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
    /// The lock's class; `None`: the coordinator's lock policy decides (critical when it has
    /// none). A request for efficiency on a lock the policy makes critical is refused.
    pub class: Option<LockClass>,
    /// The acquire's request id; `None`: a fresh one per call. Retries inside one call always
    /// reuse it; give your own to make retries across calls (or processes) safe too.
    pub request_id: Option<String>,
}

/// Metadata key of a follower's `UNAVAILABLE` answer naming the leader's URL.
pub const LEADER_METADATA: &str = "palisade-leader";

impl AcquireOptions {
    /// Options with a 10 s TTL, no wait, the class the policy gives, and a holder of
    /// `user@host:pid`.
    pub fn new(lock: impl Into<String>) -> Self {
        Self {
            lock: lock.into(),
            ttl: Duration::from_secs(10),
            wait: Duration::ZERO,
            holder: default_holder(),
            class: None,
            request_id: None,
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
    /// The lease id (for renew and release; keep it private: it is the capability to end the
    /// lease).
    pub lease_id: String,
    /// The lease TTL.
    pub ttl_ms: u64,
    /// The holder recorded in the lease.
    pub holder: String,
    /// The authenticated principal the lease belongs to.
    pub principal: String,
    /// The signed token to present to resources.
    pub token: String,
    /// The lock's class.
    pub class: LockClass,
}

/// A connection to a coordinator: one node, or the members of a cluster.
///
/// With several endpoints the client sends to the one it believes leads; a follower's
/// `not leader` answer names the leader, which becomes the target, and an unreachable node
/// moves the target to the next endpoint. State-changing calls are retried only where a retry
/// is safe: an acquire carries a request id (a retry finds the lease its first attempt was
/// granted instead of leaving a second one), a renewal is idempotent, and a release retried
/// after an ambiguous failure accepts "unknown lease" as done.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Endpoints>,
}

/// Most endpoints a client keeps: the ones given, and leaders named by members that were not
/// among them.
const MAX_TARGETS: usize = 16;

#[derive(Debug)]
struct Endpoints {
    /// `(url, channel)` per endpoint, in the order given, then each leader a member named that
    /// was not given (at most [`MAX_TARGETS`]; never removed, so an index stays valid).
    targets: std::sync::RwLock<Vec<(String, Channel)>>,
    /// Index of the endpoint requests go to.
    current: AtomicUsize,
    /// Sent with every call.
    credentials: Credentials,
    /// What this client saw.
    counters: stats::Counters,
}

/// How a client proves who it is and whom it trusts: the bearer secret it sends as gRPC
/// metadata `authorization` (none: an open coordinator or a client certificate), and for
/// `https://` endpoints the CA that signed the coordinator's certificate and, optionally, a
/// client certificate naming the principal. Its `Debug` form never shows a secret.
#[derive(Clone, Default)]
pub struct Credentials {
    bearer: Option<MetadataValue<Ascii>>,
    tls: Option<Arc<ClientTlsConfig>>,
}

impl Credentials {
    /// Credentials for bearer `secret` (surrounding whitespace, as from a file, is dropped).
    pub fn bearer(secret: &str) -> Result<Self, ClientError> {
        let value = format!("Bearer {}", secret.trim());
        let value = MetadataValue::try_from(value.as_str()).map_err(|_| {
            ClientError::InvalidArgument("the token must be printable ASCII".into())
        })?;
        Ok(Self {
            bearer: Some(value),
            tls: None,
        })
    }

    /// Trusts the coordinator certificates `ca_pem` (PEM) signed, for `https://` endpoints.
    pub fn with_ca_pem(mut self, ca_pem: &[u8]) -> Self {
        let tls = self
            .tls_config()
            .ca_certificate(Certificate::from_pem(ca_pem));
        self.tls = Some(Arc::new(tls));
        self
    }

    /// Presents the client certificate `cert_pem` (whose subject's common name is the
    /// principal) with its key `key_pem` in TLS handshakes.
    pub fn with_identity_pem(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Self {
        let tls = self
            .tls_config()
            .identity(Identity::from_pem(cert_pem, key_pem));
        self.tls = Some(Arc::new(tls));
        self
    }

    fn tls_config(&self) -> ClientTlsConfig {
        self.tls
            .as_deref()
            .cloned()
            .unwrap_or_else(ClientTlsConfig::new)
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bearer", &self.bearer.is_some())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The gRPC client of one endpoint, with the credentials attached.
pub(crate) type Grpc = CoordinatorClient<InterceptedService<Channel, Credentials>>;

/// How long a call keeps looking for a leader across endpoints (an election takes well under
/// a second; a cluster without a majority stays unavailable).
pub const FAILOVER_BUDGET: Duration = Duration::from_secs(10);
/// Pause after a full round of endpoints without an answer.
const ROUND_PAUSE: Duration = Duration::from_millis(50);
/// Pause before every retry: during an election followers still name the dead leader, and
/// without a pause clients would spin between it and them, starving the election of CPU.
const HOP_PAUSE: Duration = Duration::from_millis(10);

impl Client {
    /// Connects to `endpoints` (URLs like `http://127.0.0.1:7420`): the first one reachable
    /// becomes the target. Several endpoints are the members of one cluster.
    pub async fn connect(endpoints: &[impl AsRef<str>]) -> Result<Self, ClientError> {
        Self::connect_with(endpoints, Credentials::default()).await
    }

    /// [`connect`](Self::connect), sending `credentials` with every call.
    pub async fn connect_with(
        endpoints: &[impl AsRef<str>],
        credentials: Credentials,
    ) -> Result<Self, ClientError> {
        let mut targets = Vec::new();
        for url in endpoints {
            let url = url.as_ref().trim().trim_end_matches('/');
            let mut endpoint = Endpoint::from_shared(url.to_owned())
                .map_err(|e| ClientError::InvalidArgument(format!("endpoint {url:?}: {e}")))?;
            if url.starts_with("https://") {
                let tls = credentials.tls.as_deref().ok_or_else(|| {
                    ClientError::InvalidArgument(format!(
                        "endpoint {url:?} is https: give the CA that signed the \
                         coordinator's certificate (Credentials::with_ca_pem, --ca)"
                    ))
                })?;
                endpoint = endpoint.tls_config(tls.clone()).map_err(|e| {
                    ClientError::InvalidArgument(format!("endpoint {url:?}: TLS: {e}"))
                })?;
            }
            let endpoint = endpoint
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10));
            targets.push((url.to_owned(), endpoint));
        }
        if targets.is_empty() {
            return Err(ClientError::InvalidArgument("no endpoint given".into()));
        }
        let mut last_error = None;
        let mut first = None;
        for (index, (url, endpoint)) in targets.iter().enumerate() {
            match endpoint.connect().await {
                Ok(_) => {
                    first = Some(index);
                    break;
                }
                Err(e) => {
                    last_error = Some(ClientError::Unavailable(format!(
                        "cannot connect to {url}: {e}"
                    )))
                }
            }
        }
        let Some(first) = first else {
            return Err(last_error.expect("at least one endpoint was tried"));
        };
        let targets = targets
            .into_iter()
            .map(|(url, endpoint)| (url, endpoint.connect_lazy()))
            .collect();
        Ok(Self {
            inner: Arc::new(Endpoints {
                targets: std::sync::RwLock::new(targets),
                current: AtomicUsize::new(first),
                credentials,
                counters: stats::Counters::default(),
            }),
        })
    }

    /// What this client (its clones and its leases' keepalives included) has seen.
    pub fn stats(&self) -> ClientStats {
        self.inner.counters.snapshot()
    }

    pub(crate) fn count(&self, event: Event) {
        self.inner.counters.count(event);
    }

    /// The URL requests go to now.
    pub fn current_endpoint(&self) -> String {
        let targets = self.inner.targets.read().expect("not poisoned");
        targets[self.inner.current.load(Ordering::Relaxed)]
            .0
            .clone()
    }

    /// The index of the target at `url`, adding it (a leader a member named that was not among
    /// the endpoints given, over the same TLS and credentials) when there is room.
    fn target_for(&self, url: &str) -> Option<usize> {
        let url = url.trim_end_matches('/');
        let mut targets = self.inner.targets.write().expect("not poisoned");
        if let Some(index) = targets.iter().position(|(u, _)| u == url) {
            return Some(index);
        }
        // Never from TLS to clear text: the bearer secret would follow the redirect.
        let secure = targets.iter().any(|(u, _)| u.starts_with("https://"));
        if targets.len() >= MAX_TARGETS || (secure && !url.starts_with("https://")) {
            return None;
        }
        let mut endpoint = Endpoint::from_shared(url.to_owned()).ok()?;
        if url.starts_with("https://") {
            let tls = self.inner.credentials.tls.as_deref()?;
            endpoint = endpoint.tls_config(tls.clone()).ok()?;
        } else if !url.starts_with("http://") {
            return None;
        }
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .connect_lazy();
        targets.push((url.to_owned(), channel));
        Some(targets.len() - 1)
    }

    /// Sends `call` to the current target; on `UNAVAILABLE` (not leader, unreachable,
    /// stopping) moves to the leader named in the answer (added when it was not among the
    /// endpoints) or the next endpoint, and tries again, for up to [`FAILOVER_BUDGET`]. With
    /// one endpoint and no leader named there is no retry.
    async fn call<T, F, Fut>(&self, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(Grpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let started = Instant::now();
        let endpoints = &self.inner;
        let mut failures_in_round = 0;
        loop {
            let index = endpoints.current.load(Ordering::Relaxed);
            let client = self.grpc_at(index);
            let status = match call(client).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            let retryable = matches!(status.code(), Code::Unavailable | Code::Unknown);
            if !retryable || started.elapsed() >= FAILOVER_BUDGET {
                return Err(status.into());
            }
            let hinted = status
                .metadata()
                .get(LEADER_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|url| self.target_for(url))
                .filter(|hinted| *hinted != index);
            let count = endpoints.targets.read().expect("not poisoned").len();
            if hinted.is_none() && count == 1 {
                return Err(status.into());
            }
            let next = hinted.unwrap_or((index + 1) % count);
            tracing::debug!(from = index, to = next, %status, "trying another endpoint");
            endpoints.counters.count(Event::FailedOver);
            let _ = endpoints.current.compare_exchange(
                index,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            failures_in_round += 1;
            if failures_in_round >= count {
                failures_in_round = 0;
                tokio::time::sleep(ROUND_PAUSE).await;
            } else {
                tokio::time::sleep(HOP_PAUSE).await;
            }
        }
    }

    /// Acquires a lock and keeps its lease alive in the background until the handle is
    /// released or dropped.
    pub async fn acquire(&self, options: AcquireOptions) -> Result<LeaseHandle, ClientError> {
        let sent = tokio::time::Instant::now();
        let grant = self.acquire_once(&options).await?;
        Ok(LeaseHandle::start(self.clone(), grant, sent))
    }

    /// Acquires a lock once, without a keepalive (the lease expires after its TTL unless
    /// renewed). Retried across endpoints with one request id (see [`AcquireOptions`]).
    pub async fn acquire_once(&self, options: &AcquireOptions) -> Result<Grant, ClientError> {
        let request = pb::AcquireRequest {
            lock: options.lock.clone(),
            ttl_ms: Some(duration_ms(options.ttl)?),
            wait_ms: u64::try_from(options.wait.as_millis()).unwrap_or(u64::MAX),
            holder: options.holder.clone(),
            class: match options.class {
                None => pb::LockClass::Unspecified as i32,
                Some(LockClass::Critical) => pb::LockClass::Critical as i32,
                Some(LockClass::Efficiency) => pb::LockClass::Efficiency as i32,
            },
            request_id: options.request_id.clone().unwrap_or_else(new_request_id),
        };
        let timeout = options.wait + REQUEST_TIMEOUT;
        let reply = self
            .call(|mut client| {
                let mut request = tonic::Request::new(request.clone());
                request.set_timeout(timeout);
                async move { client.acquire(request).await }
            })
            .await
            .inspect_err(|_| self.count(Event::AcquireFailed))?;
        self.count(Event::Acquired);
        Ok(Grant {
            lock: reply.lock,
            epoch: reply.epoch,
            lease_id: reply.lease_id,
            ttl_ms: reply.ttl_ms,
            holder: reply.holder,
            principal: reply.principal,
            token: reply.token,
            class: if reply.class == pb::LockClass::Efficiency as i32 {
                LockClass::Efficiency
            } else {
                LockClass::Critical
            },
        })
    }

    /// Renews a lease by its full TTL.
    pub async fn renew(&self, lease_id: &str) -> Result<pb::RenewResponse, ClientError> {
        let renewed = self.renew_uncounted(lease_id).await;
        self.count(match renewed {
            Ok(_) => Event::Renewed,
            Err(_) => Event::RenewalFailed,
        });
        renewed
    }

    /// [`Self::renew`] for the keepalive, which counts its renewals itself.
    pub(crate) async fn renew_uncounted(
        &self,
        lease_id: &str,
    ) -> Result<pb::RenewResponse, ClientError> {
        self.call(|mut client| async move {
            let lease_id = lease_id.to_owned();
            client
                .renew(with_timeout(pb::RenewRequest { lease_id }))
                .await
        })
        .await
    }

    /// Releases a lease. After an ambiguous failure (the first attempt may have been applied),
    /// a retry that finds the lease unknown counts as released.
    pub async fn release(&self, lease_id: &str) -> Result<(), ClientError> {
        let mut attempts = 0;
        let result = self
            .call(|mut client| {
                attempts += 1;
                let lease_id = lease_id.to_owned();
                async move {
                    client
                        .release(with_timeout(pb::ReleaseRequest { lease_id }))
                        .await
                }
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(ClientError::UnknownLease(_)) if attempts > 1 => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// The state of one lock.
    pub async fn describe(&self, lock: &str) -> Result<pb::LockInfo, ClientError> {
        self.call(|mut client| async move {
            client
                .describe(with_timeout(pb::DescribeRequest { lock: lock.into() }))
                .await
        })
        .await
    }

    /// Every held or awaited lock.
    pub async fn list(&self) -> Result<Vec<pb::LockInfo>, ClientError> {
        let reply = self
            .call(|mut client| async move { client.list(with_timeout(pb::ListRequest {})).await })
            .await?;
        Ok(reply.locks)
    }

    /// The coordinator's public verification keys.
    pub async fn keys(&self) -> Result<Vec<pb::PublicKey>, ClientError> {
        let reply = self
            .call(|mut client| async move { client.keys(with_timeout(pb::KeysRequest {})).await })
            .await?;
        Ok(reply.keys)
    }

    /// Ownership transitions of `lock`, starting with its current state.
    pub async fn watch(&self, lock: &str) -> Result<tonic::Streaming<pb::LockEvent>, ClientError> {
        self.watch_request(pb::WatchRequest {
            lock: lock.into(),
            prefix: String::new(),
        })
        .await
    }

    /// The transitions of every lock whose name starts with `prefix` that the caller may read,
    /// beginning with a `current` event for each held one.
    pub async fn watch_prefix(
        &self,
        prefix: &str,
    ) -> Result<tonic::Streaming<pb::LockEvent>, ClientError> {
        self.watch_request(pb::WatchRequest {
            lock: String::new(),
            prefix: prefix.into(),
        })
        .await
    }

    async fn watch_request(
        &self,
        request: pb::WatchRequest,
    ) -> Result<tonic::Streaming<pb::LockEvent>, ClientError> {
        self.call(|mut client| {
            let request = request.clone();
            async move { client.watch(tonic::Request::new(request)).await }
        })
        .await
    }

    pub(crate) fn grpc(&self) -> Grpc {
        self.grpc_at(self.inner.current.load(Ordering::Relaxed))
    }

    fn grpc_at(&self, index: usize) -> Grpc {
        let channel = self.inner.targets.read().expect("not poisoned")[index]
            .1
            .clone();
        CoordinatorClient::with_interceptor(channel, self.inner.credentials.clone())
    }
}

/// A fresh request id: unique per process and call (a retry reuses it; the coordinator
/// matches it together with the holder).
pub fn new_request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{nanos:x}-{:x}-{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
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
