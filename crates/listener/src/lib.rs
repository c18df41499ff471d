//! Serves a router on a TCP listener with the limits a server reachable by untrusted clients
//! needs. `axum::serve` has none of them: a client that drips its headers, stalls its body, or
//! just opens sockets and says nothing holds a descriptor for ever, and once the process's
//! descriptor limit is reached nobody can acquire a lock.
//!
//! Every connection here is bounded:
//! - **count**: at most [`Limits::max_connections`] at once (derived from the descriptor
//!   limit). At the limit a newcomer evicts the connection that has been silent longest (if it
//!   has been silent for [`limits::EVICT_SILENT_MS`]); otherwise it waits up to
//!   [`limits::ADMISSION_WAIT_MS`] for a slot and is closed.
//! - **time**: request headers within [`Limits::header_read`] (also the longest HTTP/1
//!   keep-alive idle time); a connection with no bytes either way for [`Limits::idle`] is asked
//!   to close gracefully (a request still running finishes first: a long acquire wait is not
//!   cut); HTTP/2 peers must answer pings.
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

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
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
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
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
    /// A connection silent this long both ways is asked to close.
    pub idle: Duration,
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
    /// When a byte last went either way, ms since the listener started.
    last_io_ms: AtomicU64,
    /// Asks the connection to close (it is evicted).
    evict: Notify,
}

/// The open connections, for eviction.
struct Registry {
    started: Instant,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Asks the connection silent longest to close, if it has been silent long enough.
    fn evict_silentest(&self) -> bool {
        let now = self.now_ms();
        let open = self.open.lock().expect("not poisoned");
        let silentest = open
            .values()
            .map(|conn| (conn.last_io_ms.load(Ordering::Relaxed), conn))
            .filter(|(last, _)| now.saturating_sub(*last) >= limits::EVICT_SILENT_MS)
            .min_by_key(|(last, _)| *last);
        match silentest {
            Some((_, conn)) => {
                conn.evict.notify_one();
                true
            }
            None => false,
        }
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
        open: Mutex::new(HashMap::new()),
    });
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
    let builder = Arc::new(builder);
    let mut connections = JoinSet::new();
    let mut pressure = Pressure::default();
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
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let evicted = registry.evict_silentest();
                let wait = tokio::time::timeout(
                    Duration::from_millis(limits::ADMISSION_WAIT_MS),
                    slots.clone().acquire_owned(),
                );
                let admitted = tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|stop| *stop) => break,
                    waited = wait => waited.ok().and_then(Result::ok),
                };
                pressure.record(evicted, admitted.is_some(), limits.max_connections);
                match admitted {
                    Some(permit) => permit,
                    None => continue, // dropping `tcp` closes it
                }
            }
        };
        let _ = tcp.set_nodelay(true); // small messages: never wait for Nagle
        next_id += 1;
        let id = next_id;
        let conn = Arc::new(Conn {
            last_io_ms: AtomicU64::new(registry.now_ms()),
            evict: Notify::new(),
        });
        registry
            .open
            .lock()
            .expect("not poisoned")
            .insert(id, conn.clone());
        let (registry, builder, app, shutdown, tls) = (
            registry.clone(),
            builder.clone(),
            app.clone(),
            shutdown.clone(),
            tls.clone(),
        );
        connections.spawn(async move {
            let io = Watched {
                inner: tcp,
                conn: conn.clone(),
                registry: registry.clone(),
            };
            match tls {
                Some(tls) if opens_tls(&io.inner, limits.header_read).await => {
                    let handshake =
                        tokio::time::timeout(limits.header_read, tls.acceptor.accept(io));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let chain: Vec<_> = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
                                .unwrap_or_default();
                            let extensions = (tls.identify)(&chain);
                            let app = app.layer(tower::util::MapRequestLayer::new(
                                move |mut request: Request| {
                                    request.extensions_mut().extend(extensions.clone());
                                    request
                                },
                            ));
                            run_connection(
                                &builder, stream, app, &conn, &registry, &limits, shutdown,
                            )
                            .await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake refused"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
                Some(Tls {
                    clear_text: ClearText::Refuse,
                    ..
                }) => refuse_clear_text(io, limits.header_read).await,
                _ => run_connection(&builder, io, app, &conn, &registry, &limits, shutdown).await,
            }
            registry.open.lock().expect("not poisoned").remove(&id);
            drop(permit);
        });
    }
    drop(listener);
    // Every connection saw `shutdown` and is closing gracefully.
    while connections.join_next().await.is_some() {}
}

/// Answers a clear-text client of a TLS-only port and closes the connection, all within
/// `within`. The request's headers are read first and whatever follows is drained after the
/// answer: closing a socket with unread bytes resets it, and the client would lose the answer.
async fn refuse_clear_text(mut io: Watched, within: Duration) {
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

/// Serves one connection until it ends, closing it when it is evicted, idle or shut down.
async fn run_connection<I>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    app: Router,
    conn: &Conn,
    registry: &Registry,
    limits: &Limits,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut asked_to_close = false;
    let mut drop_at: Option<Instant> = None;
    let mut idle_check = tokio::time::interval(limits.idle / 4);
    idle_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let close = tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            _ = shutdown.wait_for(|stop| *stop), if !asked_to_close => true,
            () = conn.evict.notified() => {
                drop_at = Some(Instant::now() + Duration::from_millis(limits::CLOSE_GRACE_MS));
                !asked_to_close
            }
            () = sleep_until(drop_at) => {
                tracing::debug!("evicted connection did not close in time; dropped");
                return;
            }
            _ = idle_check.tick() => {
                let last = conn.last_io_ms.load(Ordering::Relaxed);
                let silent = registry.now_ms().saturating_sub(last);
                !asked_to_close && silent >= duration_ms(limits.idle)
            }
        };
        if close {
            asked_to_close = true;
            connection.as_mut().graceful_shutdown();
        }
    }
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

/// A TCP stream that records when bytes last went either way.
struct Watched {
    inner: TcpStream,
    conn: Arc<Conn>,
    registry: Arc<Registry>,
}

impl Watched {
    fn touch(&self) {
        self.conn
            .last_io_ms
            .store(self.registry.now_ms(), Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
