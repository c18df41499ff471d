//! The reference fenced store: an HTTP server over the embedded fence adapter
//! ([`palisade_fence_redb::RedbFence`]), in one mode chosen by its operator, trusting the
//! coordinator's published keys (refreshed when a token names an unknown key) or a key file.
//!
//! Interface (docs/enforcement.md, "The reference fenced store"): `PUT /v1/kv/{lock}/{key}` with `Palisade-Token` (and `Palisade-Seq`
//! in sequenced mode), `GET /v1/kv/{lock}/{key}`, `POST /v1/fences/{lock}/activate`,
//! `GET /v1/fences/{lock}`, plus `GET /v1/info`, `/metrics`, `/healthz`, `/readyz`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod floors;
mod http;
mod keys;
mod metrics;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use palisade_fence::{FenceError, FenceMode, Verifier};
use palisade_fence_redb::RedbFence;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use keys::{
    load_key_file, parse_keys, KeyRing, KeySource, DEFAULT_KEY_REFRESH, MIN_REFRESH_INTERVAL,
};

/// Default data directory of `palisade resource serve`.
pub const DEFAULT_DATA_DIR: &str = "./palisade-resource-data";
/// Default listen address of `palisade resource serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7421";
/// File name of the store inside the data directory.
pub const STORE_FILE: &str = "fence.redb";
/// File name of the effects ledger inside the data directory (served at `/v1/effects`).
pub const EFFECTS_FILE: &str = "effects.redb";
/// Time open connections get to finish after a shutdown begins.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The witness of the store in `data_dir` ([`palisade_fence_redb::witness`]): its sibling
/// `NAME.witness`, outside the directory, so a copy of the directory does not carry it.
pub fn witness_path(data_dir: &std::path::Path) -> PathBuf {
    palisade_core::witness::beside(data_dir, ".witness")
}

/// The witness of the effects ledger in `data_dir`: its sibling `NAME.effects-witness`.
pub fn effects_witness_path(data_dir: &std::path::Path) -> PathBuf {
    palisade_core::witness::beside(data_dir, ".effects-witness")
}

pub use palisade_fence_redb::RestoreApplied;

/// The id of the stopped store in `data_dir` (`None`: never opened by this version).
pub fn store_id(data_dir: &std::path::Path) -> Result<Option<String>, ResourceError> {
    Ok(palisade_fence_redb::store_id(&data_dir.join(STORE_FILE))?)
}

/// Applies the coordinator's restore floor `floor` to the stopped store in `data_dir` and
/// brings its witness up to it (`palisade resource restore`; see
/// [`palisade_fence_redb::apply_restore_floor`]).
pub fn apply_restore_floor(
    data_dir: &std::path::Path,
    floor: u64,
    record: &str,
) -> Result<RestoreApplied, ResourceError> {
    Ok(palisade_fence_redb::apply_restore_floor(
        &data_dir.join(STORE_FILE),
        Some(&witness_path(data_dir)),
        floor,
        record,
    )?)
}

/// How to run a reference fenced store.
#[derive(Debug, Clone)]
pub struct ResourceConfig {
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// Where to listen for HTTP.
    pub listen: SocketAddr,
    /// The fence mode (fixed for the store's lifetime).
    pub mode: FenceMode,
    /// Where trusted keys come from.
    pub keys: KeySource,
    /// Which principals' tokens are accepted for which locks (empty: any principal).
    pub principals: Vec<palisade_fence::PrincipalRule>,
    /// Keys never trusted, even when the key source publishes them (revocation).
    pub revoked_keys: Vec<palisade_core::KeyId>,
    /// The CA (PEM file) that signed an `https://` coordinator's certificate.
    pub coordinator_ca: Option<PathBuf>,
    /// TLS for the store's own port: its certificate chain and key (PEM files). With it the
    /// port speaks TLS only.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// How often the coordinator's keys are fetched even when no token asks for it
    /// ([`DEFAULT_KEY_REFRESH`]): a key it stops publishing is dropped within this.
    pub key_refresh: Duration,
    /// The secret reconcilers and people present to settle, retry and resolve operations in
    /// the effects ledger this store hosts (`None`: those requests are refused).
    pub effects_admin_secret: Option<String>,
}

/// Why the resource server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// The data directory, key file or socket failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The store could not be opened.
    #[error(transparent)]
    Fence(#[from] FenceError),
    /// The effects ledger could not be opened.
    #[error(transparent)]
    Effects(#[from] palisade_effects::LedgerError),
    /// The key file could not be read, or the coordinator's keys cannot be fetched safely.
    #[error("trusted keys: {0}")]
    Keys(String),
    /// The TLS files of the store's port cannot be used.
    #[error("TLS: {0}")]
    Tls(String),
}

/// A running reference store.
pub struct RunningResource {
    /// The address it listens on.
    pub local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RunningResource {
    /// Stops accepting, lets open requests finish (up to [`SHUTDOWN_GRACE`]), and closes the
    /// store (its writer commits what is queued first).
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Opens the store and starts serving.
pub async fn start(config: ResourceConfig) -> Result<RunningResource, ResourceError> {
    let io = |context: String| move |source| ResourceError::Io { context, source };
    // Private: the store's files hold every fenced value (mode 0700, its files 0600).
    palisade_durable::create_private_dir(&config.data_dir)
        .map_err(io(format!("data directory {}", config.data_dir.display())))?;
    let verifier = Arc::new(Verifier::default());
    verifier.require_principals(config.principals.clone());
    let tls = match &config.tls {
        Some((cert, key)) => {
            Some(palisade_listener::Tls::from_pem_files(cert, key).map_err(ResourceError::Tls)?)
        }
        None => None,
    };
    let keys = keys::KeyRing::new(
        config.keys.clone(),
        config.revoked_keys.clone(),
        verifier.clone(),
        config.coordinator_ca.as_deref(),
    )?;
    keys.load_initial().await?;
    let keys = Arc::new(keys);
    let app = http::router(open_state(&config, verifier, keys.clone())?);
    palisade_durable::make_files_private(&config.data_dir)
        .map_err(io(format!("data directory {}", config.data_dir.display())))?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(io(format!("listen on {}", config.listen)))?;
    let local_addr = listener.local_addr().map_err(io("local address".into()))?;
    tracing::info!(
        %local_addr,
        mode = %config.mode,
        tls = config.tls.is_some(),
        "fenced store serving HTTP"
    );
    let (shutdown, signal) = watch::channel(false);
    tokio::spawn(
        keys.clone()
            .refresh_periodically(config.key_refresh, shutdown.subscribe()),
    );
    let grace_signal = shutdown.subscribe();
    let task = tokio::spawn(async move {
        let limits = palisade_listener::Limits::default();
        let serve = palisade_listener::serve_with_tls(listener, app, limits, tls, signal);
        serve_until_grace(serve, grace_signal).await;
        tracing::info!("fenced store stopped");
    });
    Ok(RunningResource {
        local_addr,
        shutdown,
        task,
    })
}

/// The store's state: the fenced store and the effects ledger in the data directory (each
/// checked against its witness), the key ring and the ledger's admin secret.
fn open_state(
    config: &ResourceConfig,
    verifier: Arc<Verifier>,
    keys: Arc<keys::KeyRing>,
) -> Result<http::State, ResourceError> {
    let store = RedbFence::open_with(
        &config.data_dir.join(STORE_FILE),
        config.mode,
        verifier.clone(),
        Some(&witness_path(&config.data_dir)),
    )?;
    let ledger = palisade_effects::LocalLedger::new(
        palisade_effects::RedbStore::open_with(
            &config.data_dir.join(EFFECTS_FILE),
            Some(&effects_witness_path(&config.data_dir)),
        )?,
        verifier,
    );
    Ok(http::State::new(
        store,
        keys,
        ledger,
        config.effects_admin_secret.clone(),
    ))
}

/// Runs `serve` until it ends; once `grace_signal` is set, gives open connections
/// [`SHUTDOWN_GRACE`] to finish.
async fn serve_until_grace(
    serve: impl std::future::Future<Output = ()>,
    mut grace_signal: watch::Receiver<bool>,
) {
    tokio::pin!(serve);
    tokio::select! {
        () = &mut serve => {}
        () = async { let _ = grace_signal.wait_for(|stop| *stop).await; } => {
            if tokio::time::timeout(SHUTDOWN_GRACE, serve).await.is_err() {
                tracing::warn!("connections still open after the grace period; closing");
            }
        }
    }
}
