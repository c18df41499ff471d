//! Serves a router on a TCP listener with the limits a server reachable by untrusted clients
//! needs. `axum::serve` has none of them: a client that drips its headers, stalls its body, or
//! just opens sockets and says nothing holds a descriptor for ever, and once the process's
//! descriptor limit is reached nobody can acquire a lock.
//!
//! Every connection here is bounded:
//! - **count**: at most [`Limits::max_connections`] at once (derived from the descriptor
//!   limit). At the limit a newcomer evicts the connection that has gone longest without a
//!   request (none in flight and none for [`limits::EVICT_SILENT_MS`]; HTTP/2 pings do not
//!   count as requests); otherwise it waits up to [`limits::ADMISSION_WAIT_MS`] for a slot and
//!   is closed. The wait happens in the newcomer's own task, beside the accept loop, with at
//!   most [`Limits::admission_waiters`] waiting at once (beyond that newcomers queue in the
//!   kernel's backlog until one of them is settled).
//! - **time**: request headers within [`Limits::header_read`] (also the longest HTTP/1
//!   keep-alive idle time); a connection with no request in flight and none for
//!   [`Limits::idle`] is asked to close gracefully (a request still running is never cut: a
//!   long acquire wait or a watch stream keeps its connection); HTTP/2 peers must answer pings.
//! - **size** (HTTP routes, through [`bounded_bodies`]): a declared `Content-Length` over the
//!   limit is refused before a byte of the body is read (413), a body must arrive within
//!   [`Limits::body_read`] (408), and is never buffered past the limit.
//!
//! On shutdown the listener stops accepting and every connection closes gracefully; dropping
//! the [`serve`] future drops every connection.
//!
//! With [`Tls`] ([`serve_with_tls`]), a connection whose first byte opens a TLS handshake is
//! served over TLS (the handshake must finish within [`Limits::header_read`]); what the server
//! makes of its verified client certificates ([`Tls::identify`], once per connection) reaches
//! every request of the connection as extensions. Other connections are served in clear, or
//! answered `400` and closed when the server is TLS-only ([`Tls::clear_text`]). The coordinator
//! uses this for its clients (HTTPS and gRPC over TLS) and for cluster peers, which must prove
//! who they are, on the one port.

pub mod credentials;
mod grpc;
pub use grpc::grpc_message_deadlines;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use palisade_core::limits;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// A certificate chain a TLS client presented and the server verified (leaf first).
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub Arc<Vec<rustls_pki_types::CertificateDer<'static>>>);

/// Makes the extensions of every request of a TLS connection from the client's verified
/// certificate chain (leaf first; empty when the client presented none). Called once per
/// connection, after the handshake.
pub type Identify =
    Arc<dyn Fn(&[rustls_pki_types::CertificateDer<'static>]) -> http::Extensions + Send + Sync>;

/// What a connection that does not open a TLS handshake gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearText {
    /// Served as without TLS.
    Serve,
    /// Answered `400` naming `https://`, and closed.
    Refuse,
}

/// TLS on a listener's port.
#[derive(Clone)]
pub struct Tls {
    /// Performs the handshakes (its configuration decides which client certificates count).
    pub acceptor: TlsAcceptor,
    /// Turns a connection's verified client certificates into request extensions.
    pub identify: Identify,
    /// Whether connections in clear are still served.
    pub clear_text: ClearText,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("clear_text", &self.clear_text)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS by `acceptor`; a client's non-empty verified chain reaches its requests as
    /// [`PeerCertificates`].
    pub fn new(acceptor: TlsAcceptor, clear_text: ClearText) -> Self {
        Self {
            acceptor,
            identify: Arc::new(|chain| {
                let mut extensions = http::Extensions::new();
                if !chain.is_empty() {
                    extensions.insert(PeerCertificates(Arc::new(chain.to_vec())));
                }
                extensions
            }),
            clear_text,
        }
    }
}

impl Tls {
    /// TLS-only serving with the certificate chain in PEM file `cert` and its key in `key`
    /// (no client certificates asked for). Errors name the file at fault.
    pub fn from_pem_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Self, String> {
        use rustls_pki_types::pem::PemObject as _;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls;
        let at = |path: &std::path::Path| {
            let path = path.display().to_string();
            move |e: &dyn std::fmt::Display| format!("{path}: {e}")
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| at(cert)(&e))?;
        if chain.is_empty() {
            return Err(at(cert)(&"holds no certificate"));
        }
        let private_key = PrivateKeyDer::from_pem_file(key).map_err(|e| at(key)(&e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| at(cert)(&e))?
            .with_no_client_auth()
            .with_single_cert(chain, private_key)
            .map_err(|e| at(key)(&e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self::new(
            TlsAcceptor::from(Arc::new(config)),
            ClearText::Refuse,
        ))
    }
}

/// The answer to a clear-text request on a TLS-only port.
const USE_TLS: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
content-length: 83\r\nconnection: close\r\n\r\n\
{\"error\":\"tls_required\",\"message\":\"this port speaks TLS only: use an https:// URL\"}";

/// The first byte of a TLS connection (a handshake record).
const TLS_HANDSHAKE: u8 = 0x16;

/// The bounds of one server's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Longest time to receive a request's headers; longest HTTP/1 idle time between requests.
    pub header_read: Duration,
    /// Longest time to receive a request body (HTTP routes wrapped by [`bounded_bodies`]).
    pub body_read: Duration,
    /// A connection without a request this long is asked to close.
    pub idle: Duration,
    /// Newcomers that wait for a slot at once, each in a task of its own; the accept loop
    /// takes no more connections while this many wait (the rest queue in the kernel's
    /// backlog). Their descriptors come out of the quarter [`connection_limit`] leaves free.
    pub admission_waiters: usize,
}

impl Default for Limits {
    /// The named limits of `palisade_core::limits`, with the connection count lowered to what
    /// this process's descriptor limit allows.
    fn default() -> Self {
        Self {
            max_connections: connection_limit(),
            header_read: Duration::from_millis(limits::HEADER_READ_TIMEOUT_MS),
            body_read: Duration::from_millis(limits::BODY_READ_TIMEOUT_MS),
            idle: Duration::from_millis(limits::IDLE_TIMEOUT_MS),
            admission_waiters: admission_waiters(connection_limit()),
        }
    }
}

/// [`limits::MAX_CONNECTIONS`], or three quarters of the descriptors the process may open
/// beyond [`limits::RESERVED_DESCRIPTORS`] when that is lower (never below 16).
pub fn connection_limit() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| usize::try_from(soft).unwrap_or(usize::MAX))
        .unwrap_or(limits::MAX_CONNECTIONS);
    let by_descriptors = soft.saturating_sub(limits::RESERVED_DESCRIPTORS) / 4 * 3;
    by_descriptors.clamp(16, limits::MAX_CONNECTIONS)
}

/// How many newcomers may wait for a slot at once beside `max_connections`:
/// [`limits::MAX_ADMISSION_WAITERS`], or a quarter of the connection limit when that is
/// lower, so that waiting newcomers never take the descriptors the process keeps free.
pub fn admission_waiters(max_connections: usize) -> usize {
    (max_connections / 4).clamp(1, limits::MAX_ADMISSION_WAITERS)
}

/// Wraps `router` so that a body declared or found larger than `max_bytes` is refused (413
/// with error code `too_large`; before reading when it is declared) and a body that does not
/// arrive within `body_read` is refused (408 `request_timeout`). Handlers then see the whole
/// body. Not for streaming routes (gRPC): it reads the body before calling the handler.
pub fn bounded_bodies(
    router: Router,
    max_bytes: usize,
    too_large: &'static str,
    body_read: Duration,
) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            read_bounded(request, next, max_bytes, too_large, body_read)
        },
    ))
}

async fn read_bounded(
    request: Request,
    next: Next,
    max_bytes: usize,
    too_large: &'static str,
    body_read: Duration,
) -> Response {
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max_bytes as u64) {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            too_large,
            format!("the body is declared larger than {max_bytes} bytes"),
        );
    }
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(body_read, axum::body::to_bytes(body, max_bytes)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(_)) => refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            too_large,
            format!("the body is larger than {max_bytes} bytes (or broke off)"),
        ),
        Err(_) => refuse(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("the body did not arrive within {body_read:?}"),
        ),
    }
}

/// A JSON error in the shape every Palisade server uses.
fn refuse(status: StatusCode, code: &str, message: String) -> Response {
    let body = serde_json::json!({ "error": code, "message": message });
    (status, axum::Json(body)).into_response()
}

/// What one open connection shares with the accept loop.
struct Conn {
    /// Requests of the connection in flight (a streamed response counts until its body ends).
    in_flight: AtomicU64,
    /// When a request last started or ended (or the connection opened), ms since the listener
    /// started. Bytes that carry no request (HTTP/2 pings, settings, window updates) do not
    /// count: a peer that only pings is as idle as one that says nothing.
    last_request_ms: AtomicU64,
    /// Set once the connection has been asked to close to make room.
    evicted: AtomicBool,
    /// Asks the connection to close (it is evicted).
    evict: Notify,
}

impl Conn {
    /// How long the connection has gone without a request, or `None` while one is in flight.
    fn quiet_for(&self, now_ms: u64) -> Option<u64> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(now_ms.saturating_sub(self.last_request_ms.load(Ordering::Acquire)))
    }
}

/// The open connections, for eviction.
struct Registry {
    started: Instant,
    open: Mutex<Open>,
}

/// The open connections and how many of them were evicted and are still closing.
#[derive(Default)]
struct Open {
    conns: HashMap<u64, Arc<Conn>>,
    closing: usize,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn insert(&self, id: u64, conn: Arc<Conn>) {
        self.open
            .lock()
            .expect("not poisoned")
            .conns
            .insert(id, conn);
    }

    fn remove(&self, id: u64) {
        let mut open = self.open.lock().expect("not poisoned");
        if let Some(conn) = open.conns.remove(&id) {
            if conn.evicted.load(Ordering::Acquire) {
                open.closing -= 1;
            }
        }
    }

    /// Asks the connection quiet longest to close, if it has been quiet long enough, is not
    /// closing already, and fewer than `waiting` evicted connections are still closing (each
    /// waiting newcomer is owed one slot, not more: an idle crowd at the door must not empty
    /// the server of the connections it serves).
    fn evict_quietest(&self, waiting: usize) -> bool {
        let now = self.now_ms();
        let mut open = self.open.lock().expect("not poisoned");
        if open.closing >= waiting {
            return false;
        }
        let quietest = open
            .conns
            .values()
            .filter(|conn| !conn.evicted.load(Ordering::Acquire))
            .filter_map(|conn| conn.quiet_for(now).map(|quiet| (quiet, conn)))
            .filter(|(quiet, _)| *quiet >= limits::EVICT_SILENT_MS)
            .max_by_key(|(quiet, _)| *quiet)
            .map(|(_, conn)| conn.clone());
        match quietest {
            Some(conn) => {
                conn.evicted.store(true, Ordering::Release);
                conn.evict.notify_one();
                open.closing += 1;
                true
            }
            None => false,
        }
    }
}

/// A request in flight on a connection; dropping it (the response's body ended, or the
/// request was abandoned) marks the connection's last activity.
struct Active {
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Active {
    fn start(conn: Arc<Conn>, registry: Arc<Registry>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        conn.last_request_ms
            .store(registry.now_ms(), Ordering::Release);
        Self { conn, registry }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.conn
            .last_request_ms
            .store(self.registry.now_ms(), Ordering::Release);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router of one connection, counting its requests in flight.
#[derive(Clone)]
struct Tracked {
    app: Router,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl tower::Service<Request<hyper::body::Incoming>> for Tracked {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<Request<hyper::body::Incoming>>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, request: Request<hyper::body::Incoming>) -> Self::Future {
        let active = Active::start(self.conn.clone(), self.registry.clone());
        let served = self.app.call(request);
        Box::pin(async move {
            let response = served.await?;
            Ok(response.map(|inner| {
                Body::new(TrackedBody {
                    inner,
                    active: Some(active),
                })
            }))
        })
    }
}

/// A response body that holds its request's [`Active`] until the body ends.
struct TrackedBody {
    inner: Body,
    active: Option<Active>,
}

impl http_body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.active = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` turns true, then closes every
/// connection gracefully and returns once they are all closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) {
    serve_with_tls(listener, app, limits, None, shutdown).await;
}

/// Who gets a connection slot. At the limit a newcomer waits for one in a task of its own,
/// so the accept loop does not stall on it; only when [`Limits::admission_waiters`] newcomers
/// wait already does the accept loop wait for one of them to be settled.
struct Admission {
    slots: Arc<Semaphore>,
    waiters: Arc<Semaphore>,
    /// Newcomers waiting for a slot now.
    waiting: AtomicUsize,
    pressure: Mutex<Pressure>,
    limit: usize,
}

/// One newcomer counted in [`Admission::waiting`] while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::AcqRel);
        Self(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A newcomer's place: a slot, or a place among those waiting for one.
enum Ticket {
    Admitted(OwnedSemaphorePermit),
    Waiting(OwnedSemaphorePermit),
}

impl Admission {
    fn new(limit: usize, waiters: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limit.max(1))),
            waiters: Arc::new(Semaphore::new(waiters.max(1))),
            waiting: AtomicUsize::new(0),
            pressure: Mutex::new(Pressure::default()),
            limit,
        }
    }

    /// A slot at once, or a place to wait for one (waiting, only when every place is taken,
    /// for one to come free); `None` on shutdown.
    async fn enter(&self, shutdown: &mut watch::Receiver<bool>) -> Option<Ticket> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Some(Ticket::Admitted(slot));
        }
        let waiting = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => return None,
            waiting = self.waiters.clone().acquire_owned() => waiting.ok()?,
        };
        Some(Ticket::Waiting(waiting))
    }

    /// Waits up to [`limits::ADMISSION_WAIT_MS`] for a slot. Every 100 ms while it waits it
    /// evicts the connection that went longest without a request, when one has been quiet
    /// long enough and fewer evicted connections are still closing than newcomers wait. Slots
    /// go to newcomers in the order they began to wait, so a newcomer cannot count on the
    /// slot its own eviction frees: evictions go on for as long as anyone waits.
    async fn wait(
        &self,
        registry: &Registry,
        mut shutdown: watch::Receiver<bool>,
    ) -> Option<OwnedSemaphorePermit> {
        let _waiting = Waiting::enter(&self.waiting);
        let deadline = Instant::now() + Duration::from_millis(limits::ADMISSION_WAIT_MS);
        let mut evicted = false;
        let mut retry = tokio::time::interval(Duration::from_millis(100));
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let slot = self.slots.clone().acquire_owned();
        tokio::pin!(slot);
        let admitted = loop {
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return None,
                slot = &mut slot => break slot.ok(),
                () = tokio::time::sleep_until(deadline) => break None,
                _ = retry.tick() => {
                    let waiting = self.waiting.load(Ordering::Acquire);
                    evicted |= registry.evict_quietest(waiting);
                }
            }
        };
        self.record(evicted, admitted.is_some());
        admitted
    }

    fn record(&self, evicted: bool, admitted: bool) {
        self.pressure
            .lock()
            .expect("not poisoned")
            .record(evicted, admitted, self.limit);
    }
}

/// [`serve`], with connections that open a TLS handshake served over TLS by `tls`.
pub async fn serve_with_tls(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<Tls>,
    mut shutdown: watch::Receiver<bool>,
) {
    let registry = Arc::new(Registry {
        started: Instant::now(),
        open: Mutex::new(Open::default()),
    });
    let admission = Arc::new(Admission::new(
        limits.max_connections,
        limits.admission_waiters,
    ));
    let builder = Arc::new(connection_builder(&limits));
    let mut connections = JoinSet::new();
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                // Out of descriptors (EMFILE) or a connection reset before accept: wait a
                // little instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(ticket) = admission.enter(&mut shutdown).await else {
            break;
        };
        next_id += 1;
        let connection = Connection {
            id: next_id,
            registry: registry.clone(),
            builder: builder.clone(),
            app: app.clone(),
            limits,
            tls: tls.clone(),
            shutdown: shutdown.clone(),
        };
        connections.spawn(connection.admit_and_run(tcp, ticket, admission.clone()));
    }
    drop(listener);
    // Every connection saw `shutdown` and is closing gracefully.
    while connections.join_next().await.is_some() {}
}

/// HTTP/1 and HTTP/2 with this crate's timeouts and stream limit.
fn connection_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(limits::KEEPALIVE_INTERVAL_MS))
        .keep_alive_timeout(Duration::from_millis(limits::KEEPALIVE_TIMEOUT_MS))
        .max_concurrent_streams(limits::MAX_STREAMS_PER_CONNECTION);
    builder
}

/// One admitted connection and what it is served with.
struct Connection {
    id: u64,
    registry: Arc<Registry>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: Router,
    limits: Limits,
    tls: Option<Tls>,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    /// Serves `tcp` once it holds a connection slot: at once with an admitted `ticket`, else
    /// after waiting beside the accept loop (until shutdown, which closes `tcp` unserved).
    async fn admit_and_run(self, tcp: TcpStream, ticket: Ticket, admission: Arc<Admission>) {
        let slot = match ticket {
            Ticket::Admitted(slot) => slot,
            Ticket::Waiting(waiting) => {
                let slot = admission.wait(&self.registry, self.shutdown.clone()).await;
                drop(waiting);
                match slot {
                    Some(slot) => slot,
                    None => return, // dropping `tcp` closes it
                }
            }
        };
        self.run(tcp).await;
        drop(slot);
    }

    /// Registers the connection, serves it (over TLS when it opens a handshake and the port
    /// has TLS) until it ends, and unregisters it.
    async fn run(self, tcp: TcpStream) {
        let _ = tcp.set_nodelay(true); // small messages: never wait for Nagle
        let conn = Arc::new(Conn {
            in_flight: AtomicU64::new(0),
            last_request_ms: AtomicU64::new(self.registry.now_ms()),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        });
        self.registry.insert(self.id, conn.clone());
        let header_read = self.limits.header_read;
        let tracked = |app: Router| Tracked {
            app,
            conn: conn.clone(),
            registry: self.registry.clone(),
        };
        match &self.tls {
            Some(tls) if opens_tls(&tcp, header_read).await => {
                let handshake = tokio::time::timeout(header_read, tls.acceptor.accept(tcp));
                match handshake.await {
                    Ok(Ok(stream)) => {
                        let app = with_identity(self.app.clone(), tls, &stream);
                        self.serve(stream, tracked(app), &conn).await;
                    }
                    Ok(Err(error)) => tracing::debug!(%error, "TLS handshake refused"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            }
            Some(Tls {
                clear_text: ClearText::Refuse,
                ..
            }) => refuse_clear_text(tcp, header_read).await,
            _ => self.serve(tcp, tracked(self.app.clone()), &conn).await,
        }
        self.registry.remove(self.id);
    }

    /// Serves one connection until it ends, closing it when it is evicted, idle or shut down.
    async fn serve<I>(&self, io: I, service: Tracked, conn: &Conn)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = TowerToHyperService::new(service);
        let connection = self.builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let mut shutdown = self.shutdown.clone();
        let mut asked_to_close = false;
        let mut drop_at: Option<Instant> = None;
        let mut idle_check = tokio::time::interval(self.limits.idle / 4);
        idle_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let idle_ms = duration_ms(self.limits.idle);
        loop {
            let close = tokio::select! {
                served = connection.as_mut() => {
                    if let Err(error) = served {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                    return;
                }
                _ = shutdown.wait_for(|stop| *stop), if !asked_to_close => true,
                () = conn.evict.notified(), if drop_at.is_none() => {
                    drop_at =
                        Some(Instant::now() + Duration::from_millis(limits::CLOSE_GRACE_MS));
                    !asked_to_close
                }
                () = sleep_until(drop_at) => {
                    tracing::debug!("evicted connection did not close in time; dropped");
                    return;
                }
                _ = idle_check.tick() => {
                    let quiet = conn.quiet_for(self.registry.now_ms());
                    !asked_to_close && quiet.is_some_and(|quiet| quiet >= idle_ms)
                }
            };
            if close {
                asked_to_close = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// `app` with the extensions `tls` makes of the connection's verified client certificates.
fn with_identity<I>(app: Router, tls: &Tls, stream: &tokio_rustls::server::TlsStream<I>) -> Router {
    let chain: Vec<_> = stream
        .get_ref()
        .1
        .peer_certificates()
        .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let extensions = (tls.identify)(&chain);
    app.layer(tower::util::MapRequestLayer::new(
        move |mut request: Request| {
            request.extensions_mut().extend(extensions.clone());
            request
        },
    ))
}

/// Answers a clear-text client of a TLS-only port and closes the connection, all within
/// `within`. The request's headers are read first and whatever follows is drained after the
/// answer: closing a socket with unread bytes resets it, and the client would lose the answer.
async fn refuse_clear_text(mut io: TcpStream, within: Duration) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let answered = async {
        let mut seen = Vec::new();
        let mut buffer = [0u8; 1024];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") && seen.len() < 8 * 1024 {
            let n = io.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buffer[..n]);
        }
        io.write_all(USE_TLS).await?;
        io.shutdown().await?;
        while io.read(&mut buffer).await? > 0 {}
        Ok::<_, io::Error>(())
    };
    let _ = tokio::time::timeout(within, answered).await;
}

/// True when the connection's first byte opens a TLS handshake (waits for it up to `within`).
async fn opens_tls(tcp: &TcpStream, within: Duration) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(within, tcp.peek(&mut first)).await,
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE
    )
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Warns about the connection limit at most every ten seconds, with counts.
#[derive(Default)]
struct Pressure {
    evicted: u64,
    refused: u64,
    warned: Option<Instant>,
}

impl Pressure {
    fn record(&mut self, evicted: bool, admitted: bool, limit: usize) {
        self.evicted += u64::from(evicted);
        self.refused += u64::from(!admitted);
        if self
            .warned
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(
                limit,
                evicted = self.evicted,
                refused = self.refused,
                "at the connection limit: silent connections evicted, newcomers refused \
                 when none was silent (counts since the last warning)"
            );
            self.warned = Some(Instant::now());
            self.evicted = 0;
            self.refused = 0;
        }
    }
}
