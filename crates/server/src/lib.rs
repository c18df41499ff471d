//! The Palisade coordinator: a durable lease service that issues signed, strictly increasing
//! ownership epochs.
//!
//! Components: `palisade_coordinator` (durable state; the engine: the lease table behind a
//! queue, group commit; the signing key; metrics), [`cluster`], [`api`] / [`http`] / [`grpc`]
//! (the front ends, one port). [`start`] wires them together; see `ARCHITECTURE.md`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod api;
pub mod auth;
pub mod backup;
pub mod console;
pub mod disk;
pub mod grpc;
pub mod http;
pub mod http_error;
pub mod policy;
pub mod tls;
pub mod witnesses;

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use palisade_coordinator::{engine, high_water, keys, log_store, metrics, store, STORE_FILE};

use crate::api::{Api, ClusterMember};
use palisade_cluster::ClusterConfig;
use palisade_coordinator::gateway::Gateway;
use palisade_coordinator::metrics::Metrics;
use palisade_coordinator::store::StoreError;

/// Default data directory of `palisade serve`.
pub const DEFAULT_DATA_DIR: &str = "./palisade-data";
/// Default listen address of `palisade serve` (gRPC and HTTP on one port).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";
/// How long a stopping server waits for open connections (keepalive streams, watches) before
/// it closes them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How to run a coordinator.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the store and the signing key live.
    pub data_dir: PathBuf,
    /// Where to listen for gRPC and HTTP.
    pub listen: SocketAddr,
    /// Cluster mode: this member and its peers. `None`: a single node.
    pub cluster: Option<ClusterConfig>,
    /// Who may do what ([`auth::Auth::open`]: everyone, everything — loopback only).
    pub auth: Arc<auth::Auth>,
    /// Serve without authentication on a non-loopback address (`--insecure`).
    pub insecure: bool,
    /// Cluster mode: this member's peer credentials (mutual TLS between members).
    pub peer_tls: Option<Arc<palisade_cluster::peer_tls::PeerTls>>,
    /// The epoch high-water file of a single node ([`high_water`]); `None`: the data
    /// directory's sibling `DIR.high-water`.
    pub high_water: Option<PathBuf>,
    /// TLS for clients on the port (`--tls-cert`, `--tls-key`, `--client-ca`). `None`: clients
    /// speak in clear.
    pub client_tls: Option<Arc<tls::ClientTls>>,
    /// Cluster mode without peer credentials (`--insecure-peers`): anyone who can reach the
    /// port can send Raft messages. For loopback demos and tests.
    pub insecure_peers: bool,
    /// The lock policy (`--policy`, `--require-policy`); reload it with
    /// [`policy::PolicyState::reload`].
    pub policy: Arc<policy::PolicyState>,
    /// A single node: the operator says its clock is right and the epoch counter named is
    /// ahead of it (`--resume-counter-ahead`, [`palisade_coordinator::counter_ahead`]).
    pub resume_counter_ahead: Option<palisade_core::Epoch>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            listen: DEFAULT_LISTEN.parse().expect("a valid default address"),
            cluster: None,
            auth: Arc::new(auth::Auth::open()),
            insecure: false,
            peer_tls: None,
            client_tls: None,
            high_water: None,
            insecure_peers: false,
            policy: Arc::new(policy::PolicyState::none()),
            resume_counter_ahead: None,
        }
    }
}

/// Why a coordinator could not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The data directory or the listen socket failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: io::Error,
    },
    /// No authentication is configured and the listen address is reachable from other
    /// machines.
    #[error(
        "{listen} is not a loopback address and no authentication is configured: anyone who \
         can reach it could acquire, release or reconfigure. Give --auth-file and --acl-file \
         (see docs/security.md), listen on 127.0.0.1, or accept the risk with --insecure"
    )]
    Unauthenticated {
        /// The listen address.
        listen: SocketAddr,
    },
    /// Cluster mode with neither peer credentials nor `--insecure-peers`.
    #[error(
        "cluster mode needs peer credentials: --peer-cert, --peer-key and --peer-ca (a \
         certificate naming node-{node}.palisade, signed by the cluster's own CA; see \
         docs/security.md). Without them anyone who can reach the port could forge Raft \
         messages; for a loopback demo, accept that with --insecure-peers"
    )]
    UnauthenticatedPeers {
        /// This member's node id.
        node: u64,
    },
    /// A TLS file or setting cannot be used.
    #[error("TLS: {0}")]
    Tls(#[from] palisade_listener::credentials::TlsError),
    /// The signing key could not be loaded or created.
    #[error(transparent)]
    Key(#[from] keys::KeyError),
    /// The store failed (at start, or later, which stops the server).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Cluster mode could not start (bad membership, unreadable cluster store, Raft failure).
    #[error("cluster: {0}")]
    Cluster(#[from] palisade_cluster::ClusterError),
    /// The data directory has a signing key but its store is gone: starting would forget every
    /// lease held.
    #[error(
        "{key} exists but {store} does not (or is empty): this data directory was used and its store is \
         lost; starting would forget every lease held (epochs stay above the clock floor). \
         Restore the store from a backup (palisade restore), or start over in an empty data \
         directory and let the held leases' TTLs pass before owners come back"
    )]
    LostStore {
        /// The missing store.
        store: String,
        /// The signing key that shows the directory was used.
        key: String,
    },
    /// A file that must survive a copy of the data directory put back (the high-water bound,
    /// a member's witness) would be inside it, so a copy-back would bring it back too.
    #[error(
        "{file} would be inside the data directory {data_dir}, so copying the directory back \
         from an older copy would bring it back too: give the data directory a name of its \
         own inside a parent (e.g. --data-dir ./palisade-data), or put the file elsewhere \
         (--high-water-file)"
    )]
    SideFileInside {
        /// The side file.
        file: String,
        /// The data directory.
        data_dir: String,
    },
}

/// A coordinator that is serving.
pub struct RunningServer {
    /// The address it listens on (useful with port 0).
    pub local_addr: SocketAddr,
    shutdown: Arc<watch::Sender<bool>>,
    task: JoinHandle<Result<(), ServerError>>,
    metrics: Arc<Metrics>,
}

impl RunningServer {
    /// Records a policy reload (`Ok(rules)`, or a refused file) in the metrics.
    pub fn policy_reloaded(&self, result: Result<usize, ()>) {
        let label = match result {
            Ok(rules) => {
                self.metrics.policy_rules.set(rules as i64);
                "ok"
            }
            Err(()) => "error",
        };
        self.metrics
            .policy_reloads
            .get_or_create(&metrics::ResultLabels { result: label })
            .inc();
    }

    /// Asks the server to stop: the batch being committed finishes, waiting acquires are told
    /// the coordinator is unavailable, open connections get [`SHUTDOWN_GRACE`] to finish.
    pub fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Resolves once the server has begun to stop, whether asked to or because its storage
    /// failed.
    pub async fn stopping(&self) {
        let mut signal = self.shutdown.subscribe();
        let _ = signal.wait_for(|stop| *stop).await;
    }

    /// Stops the server and waits until it has stopped.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        self.begin_shutdown();
        self.wait().await
    }

    /// Waits until the server stops (after [`Self::begin_shutdown`], or a storage failure).
    pub async fn wait(self) -> Result<(), ServerError> {
        self.task.await.expect("the server task does not panic")
    }
}

/// Makes sure the data directory's store exists, and is durably in the directory, before the
/// signing key is created (P1/P8).
///
/// A signing key is made on first start, so a key without a store means the store was lost
/// (deleted, or created without its directory entry reaching the disk before a power cut):
/// starting would create an empty store whose epochs restart at 1. That is refused, naming
/// the way back. On a first start the store is created first and its directory fsynced, so no
/// crash can leave a key without a store.
fn create_store_before_key(dir: &std::path::Path, cluster: bool) -> Result<(), ServerError> {
    let store = dir.join(if cluster {
        palisade_cluster::CLUSTER_STORE_FILE
    } else {
        STORE_FILE
    });
    let key = dir.join(keys::SIGNING_KEY_FILE);
    // A lease log emptied in place (`truncate -s 0`, a file system that lost its blocks) is as
    // lost as a removed one: it was created with its header before the key was.
    let emptied = !cluster
        && key.exists()
        && std::fs::metadata(&store).is_ok_and(|m| m.len() < log_store::HEADER_BYTES);
    if emptied {
        return Err(ServerError::LostStore {
            store: format!("{} (emptied)", store.display()),
            key: key.display().to_string(),
        });
    }
    if store.exists() || (!cluster && log_store::exists_in(dir)) {
        return Ok(());
    }
    if key.exists() {
        return Err(ServerError::LostStore {
            store: store.display().to_string(),
            key: key.display().to_string(),
        });
    }
    // Opening creates the file and fsyncs its directory.
    if cluster {
        drop(palisade_cluster::storage::open(&store)?);
    } else {
        drop(log_store::open_in(dir)?);
    }
    Ok(())
}

/// Refuses a side file (`DIR.high-water`, `DIR.witness`) whose folder is the data directory or
/// inside it (`--data-dir .`, `--data-dir sub/..`): it must outlive a copy of the directory.
fn refuse_side_file_inside(dir: &Path, side_file: &Path) -> Result<(), ServerError> {
    let folder = match side_file.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => parent.to_owned(),
        None => PathBuf::from("."),
    };
    let (Ok(dir_real), Ok(folder_real)) = (dir.canonicalize(), folder.canonicalize()) else {
        // A folder that does not exist yet cannot be inside an existing directory.
        return Ok(());
    };
    if folder_real.starts_with(&dir_real) {
        return Err(ServerError::SideFileInside {
            file: side_file.display().to_string(),
            data_dir: dir.display().to_string(),
        });
    }
    Ok(())
}

/// Opens the data directory and starts serving.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    refuse_unauthenticated(&config)?;
    // Checked before anything starts: a TLS mistake must not leave a half-started member.
    let tls = tls::listener_tls(
        config.client_tls.as_deref(),
        config.peer_tls.as_deref(),
        config.cluster.is_some() && config.peer_tls.is_none(),
    )?;
    let dir = &config.data_dir;
    let high_water = prepare_data_dir(&config)?;
    let signer = Arc::new(keys::load_or_create_signer(dir)?);
    let metrics = Arc::new(Metrics::new());
    let (shutdown, shutdown_signal) = watch::channel(false);
    let shutdown = Arc::new(shutdown);
    let (mut api, raft, core) = match &config.cluster {
        None => {
            // The boundaries witness what this node issued, whatever its disk and clock say.
            let verifier = palisade_core::TokenVerifier::new([signer.verifying_key()]);
            let witnessed = witnesses::ask(&config.policy.current(), &verifier).await;
            let files = (dir.as_path(), high_water.as_path());
            start_single(
                files,
                witnessed,
                config.resume_counter_ahead,
                signer,
                metrics,
                shutdown_signal.clone(),
            )?
        }
        Some(cluster) => {
            let peer_tls = config.peer_tls.clone();
            let cluster = ClusterConfig {
                client_tls: config.client_tls.is_some(),
                ..cluster.clone()
            };
            start_cluster(
                &cluster,
                dir,
                signer,
                metrics,
                peer_tls,
                shutdown_signal.clone(),
            )
            .await?
        }
    };
    api.auth = config.auth.clone();
    api.policy = config.policy.clone();
    api.metrics
        .policy_rules
        .set(config.policy.current().rules.len() as i64);
    serve(&config, tls, api, raft, core, shutdown, shutdown_signal).await
}

/// Creates the data directory (and its store before its key), refuses a side file inside it
/// and a disk that cannot take a write; the high-water file's path.
fn prepare_data_dir(config: &ServerConfig) -> Result<PathBuf, ServerError> {
    let dir = &config.data_dir;
    keys::create_data_dir(dir).map_err(io(format!("data directory {}", dir.display())))?;
    let high_water = config
        .high_water
        .clone()
        .unwrap_or_else(|| high_water::default_path(dir));
    let side_file = match &config.cluster {
        None => high_water.clone(),
        Some(_) => palisade_cluster::witness::default_path(dir),
    };
    refuse_side_file_inside(dir, &side_file)?;
    // A node that cannot write its disk never says it is ready: refused here, with the cause.
    disk::probe(dir)?;
    create_store_before_key(dir, config.cluster.is_some())?;
    Ok(high_water)
}

/// Refuses to serve clients without authentication on a non-loopback address, and a cluster
/// whose members do not authenticate each other, unless the operator said `--insecure` or
/// `--insecure-peers` (then it warns).
fn refuse_unauthenticated(config: &ServerConfig) -> Result<(), ServerError> {
    if !config.auth.is_enabled() && !config.listen.ip().is_loopback() {
        if !config.insecure {
            return Err(ServerError::Unauthenticated {
                listen: config.listen,
            });
        }
        tracing::warn!(
            listen = %config.listen,
            "--insecure: serving WITHOUT authentication on a non-loopback address"
        );
    }
    if let Some(cluster) = &config.cluster {
        if config.peer_tls.is_none() {
            if !config.insecure_peers {
                return Err(ServerError::UnauthenticatedPeers {
                    node: cluster.node_id,
                });
            }
            tracing::warn!(
                "--insecure-peers: Raft traffic is NOT authenticated; anyone who can reach \
                 this port can forge cluster messages and signing keys"
            );
        }
    }
    Ok(())
}

/// Says, at a single node's start, what its epoch counter starts above: the high-water bound,
/// a missing bound for a directory that has issued epochs, a restore.
fn log_where_epochs_start(dir: &Path, bound: &high_water::HighWater, stored: palisade_core::Epoch) {
    if bound.bound() > stored.0 {
        tracing::info!(
            high_water = %bound.path().display(),
            bound = bound.bound(),
            stored = stored.0,
            "the epoch counter starts above the high-water bound (epochs up to it may have been \
             issued: reserved ahead, or by a newer copy of this data directory)"
        );
    } else if !bound.existed() && stored.0 > 0 {
        tracing::warn!(
            high_water = %bound.path().display(),
            stored = stored.0,
            "no high-water file for a data directory that has issued epochs: it is created now. \
             If this directory was copied or restored from an older copy, epochs may be issued \
             again: stop and use palisade restore"
        );
    }
    if let Some(record) = palisade_coordinator::backup::restore_record(dir) {
        tracing::info!(
            backup_epoch = record.backup.last_epoch,
            floor = record.floor,
            counter = record.counter,
            decided_by = %record.decided_by,
            floors = ?record.floors,
            "this data directory was made by palisade restore"
        );
    }
}

/// Raises the high-water bound to the greatest fence the policy's boundaries answered, when it
/// is above what this node's disk holds: the counter then starts above every epoch they saw.
fn start_above_witnesses(
    bound: &mut high_water::HighWater,
    witnessed: &witnesses::Witnessed,
    stored: palisade_core::Epoch,
) -> Result<(), ServerError> {
    for silent in &witnessed.silent {
        tracing::warn!(
            boundary = %silent,
            "a boundary of the policy did not say its highest fence at start; the counter \
             starts above the others' and the clock's"
        );
    }
    for unproven in &witnessed.unproven {
        tracing::error!(
            boundary = %unproven,
            "a boundary of the policy holds a fence nothing this node signed proves; the \
             counter does not start above it"
        );
    }
    if witnessed.greatest > stored.0 && witnessed.greatest > bound.bound() {
        tracing::warn!(
            witnessed = witnessed.greatest,
            stored = stored.0,
            "a boundary of the policy holds a fence above every epoch this node's disk \
             knows (its volume and clock went back, or another coordinator signs with its \
             key): the counter starts above it"
        );
        bound.raise(witnessed.greatest)?;
    } else if witnessed.answered > 0 {
        tracing::info!(
            witnessed = witnessed.greatest,
            boundaries = witnessed.answered,
            "the policy's boundaries witnessed no epoch above this node's"
        );
    }
    Ok(())
}

/// A single node: the engine over the lease log (`coordinator.log`).
fn start_single(
    (dir, high_water): (&Path, &Path),
    witnessed: witnesses::Witnessed,
    resume_counter_ahead: Option<palisade_core::Epoch>,
    signer: Arc<palisade_core::TokenSigner>,
    metrics: Arc<Metrics>,
    shutdown_signal: watch::Receiver<bool>,
) -> Result<(Api, Option<RaftFront>, Core), ServerError> {
    let cluster_store = dir.join(palisade_cluster::CLUSTER_STORE_FILE);
    if cluster_store.exists() {
        return Err(ServerError::Cluster(
            palisade_cluster::ClusterError::DataDirectory(format!(
                "{} belongs to a cluster member ({}); start it with --node-id and --cluster",
                dir.display(),
                cluster_store.display()
            )),
        ));
    }
    let mut store = log_store::open_in(dir)?;
    store.count_syncs(metrics.store_syncs.clone());
    let mut bound = high_water::HighWater::open(high_water)?;
    let stored = store::LeaseStore::load(&store)?.last_epoch;
    start_above_witnesses(&mut bound, &witnessed, stored)?;
    log_where_epochs_start(dir, &bound, stored);
    let clock = Arc::new(palisade_core::clock::SystemClock);
    let counter = stored.max(palisade_core::Epoch(bound.bound()));
    let accepted = palisade_coordinator::counter_ahead::accepted(
        dir,
        resume_counter_ahead,
        counter,
        palisade_core::clock::WallClock::now_ms(&*clock),
    )?;
    let store = high_water::Bounded::new(store, bound);
    let (transitions, _) = tokio::sync::broadcast::channel(engine::WATCH_BUFFER);
    let rules = engine::ClockRules {
        clock,
        counter_ahead: accepted
            .map_or(engine::CounterAhead::Refuse, engine::CounterAhead::Accepted),
    };
    let (handle, engine) = engine::start_with_rules(
        store,
        metrics.clone(),
        shutdown_signal,
        transitions.clone(),
        rules,
    )?;
    let api = Api {
        coordinator: Gateway::fixed(handle, transitions),
        signer,
        metrics,
        cluster: None,
        auth: Arc::new(auth::Auth::open()),
        policy: Arc::new(policy::PolicyState::none()),
        feed: Arc::default(),
        audits: Arc::default(),
        data_dir: Arc::from(dir),
    };
    let core: Core = Box::pin(async move {
        // The engine ends on shutdown or on a storage failure.
        engine
            .await
            .expect("the engine does not panic")
            .map_err(ServerError::from)
    });
    Ok((api, None, core))
}

/// A cluster member: Raft over `cluster.redb`, and the supervisor that runs an engine while
/// this member leads.
async fn start_cluster(
    cluster: &ClusterConfig,
    dir: &Path,
    signer: Arc<palisade_core::TokenSigner>,
    metrics: Arc<Metrics>,
    peer_tls: Option<Arc<palisade_cluster::peer_tls::PeerTls>>,
    shutdown_signal: watch::Receiver<bool>,
) -> Result<(Api, Option<RaftFront>, Core), ServerError> {
    let member = palisade_cluster::start_member(
        cluster,
        dir,
        &signer,
        metrics.clone(),
        peer_tls.clone(),
        shutdown_signal.clone(),
    )
    .await?;
    let health = palisade_cluster::health::Health::default();
    let api = Api {
        coordinator: member.gateway,
        signer,
        metrics,
        cluster: Some(ClusterMember {
            raft: member.raft.clone(),
            node_id: cluster.node_id,
            state: member.state,
            changes: member.changes,
            health: health.clone(),
            clock_check: member.clock_check,
            identity: member.identity.clone(),
        }),
        auth: Arc::new(auth::Auth::open()),
        policy: Arc::new(policy::PolicyState::none()),
        feed: Arc::default(),
        audits: Arc::default(),
        data_dir: Arc::from(dir),
    };
    tokio::spawn(follow_applied(
        api.feed.clone(),
        member.history.subscribe(),
        shutdown_signal.clone(),
    ));
    let raft = member.raft.clone();
    let supervisor = member.supervisor;
    let core: Core = Box::pin(async move {
        // Ends on shutdown, or when Raft stopped on a storage failure: then the member stops
        // serving and the server exits with the error.
        let outcome = supervisor.await.expect("the supervisor does not panic");
        if let Err(error) = raft.shutdown().await {
            tracing::warn!(%error, "raft did not stop cleanly");
        }
        outcome.map_err(ServerError::Cluster)
    });
    let admission =
        palisade_cluster::network::PeerAdmission::new(peer_tls.is_some(), member.identity.clone());
    let service = palisade_cluster::network::service(
        cluster.node_id,
        member.raft,
        member.identity,
        peer_tls,
        shutdown_signal,
        health,
    );
    Ok((api, Some(RaftFront { service, admission }), core))
}

/// Records in `feed` every transition this member applies, until the channel closes or
/// shutdown: every member keeps the same history, so the console's feed survives a failover.
async fn follow_applied(
    feed: Arc<palisade_coordinator::feed::Feed>,
    mut applied: tokio::sync::broadcast::Receiver<palisade_cluster::AppliedTransition>,
    mut shutdown: watch::Receiver<bool>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let received = tokio::select! {
            received = applied.recv() => received,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        match received {
            Ok(t) => feed.record_parts(&t.kind, &t.lease, t.by),
            Err(RecvError::Lagged(missed)) => feed.record_missed(missed),
            Err(RecvError::Closed) => return,
        }
    }
}

/// The one client-streaming method: it may wait between messages.
const KEEPALIVE_METHOD: &str = "/palisade.v1.Coordinator/Keepalive";
/// The leader's append stream to a follower: it waits between appends.
const APPEND_STREAM_METHOD: &str = "/palisade.v1.Raft/AppendStream";

/// The Raft gRPC service of a cluster member, and who may reach it.
struct RaftFront {
    service: palisade_proto::v1::raft_server::RaftServer<palisade_cluster::network::RaftService>,
    /// Checked before a Raft request's body is read ([`admission::peers_before_bodies`]).
    admission: palisade_cluster::network::PeerAdmission,
}

/// Serves HTTP and gRPC (and Raft traffic) on `config.listen` until the core ends; then stops
/// the front ends within the grace period.
async fn serve(
    config: &ServerConfig,
    tls: Option<palisade_listener::Tls>,
    api: Api,
    raft: Option<RaftFront>,
    core: Core,
    shutdown: Arc<watch::Sender<bool>>,
    shutdown_signal: watch::Receiver<bool>,
) -> Result<RunningServer, ServerError> {
    // The HTTP router (with its JSON 404 fallback) plus the gRPC services' path prefixes.
    let metrics = api.metrics.clone();
    if api.cluster.is_none() {
        // A cluster member's feed follows what it applies instead (`member_api`).
        tokio::spawn(
            api.feed
                .clone()
                .follow(api.coordinator.subscribe(), shutdown_signal.clone()),
        );
    }
    let app = front_ends(api, raft);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(io(format!("listen on {}", config.listen)))?;
    let local_addr = listener.local_addr().map_err(io("local address".into()))?;
    tracing::info!(
        %local_addr,
        data_dir = %config.data_dir.display(),
        "coordinator serving gRPC and HTTP"
    );
    let http = tokio::spawn(palisade_listener::serve_with_tls(
        listener,
        app,
        palisade_listener::Limits::default(),
        tls,
        shutdown_signal,
    ));
    let stopper = shutdown.clone();
    let task = tokio::spawn(async move {
        // The core ends on shutdown or on a storage failure; either way the front ends stop.
        let core_result = core.await;
        let _ = stopper.send(true);
        match tokio::time::timeout(SHUTDOWN_GRACE, http).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "HTTP server task failed"),
            Err(_) => tracing::warn!("connections still open after the grace period; closing"),
        }
        tracing::info!("coordinator stopped");
        core_result
    });
    Ok(RunningServer {
        local_addr,
        shutdown,
        task,
        metrics,
    })
}

/// The HTTP and gRPC routes (and Raft's, for a member) behind the layers every request
/// passes first, outermost first: credentials (a member's certificate for Raft) checked
/// before a body is read, then each gRPC message bounded by the body timeout once started
/// (unary: once requested; the streaming methods may wait between messages).
fn front_ends(api: Api, raft: Option<RaftFront>) -> axum::Router {
    let auth = api.auth.clone();
    let mut routes =
        tonic::service::Routes::from(http::router(api.clone())).add_service(grpc::service(api));
    let mut peers = None;
    if let Some(raft) = raft {
        routes = routes.add_service(raft.service);
        peers = Some(raft.admission);
    }
    let mut app = admission::credentials_before_bodies(routes.into_axum_router(), auth);
    let within = std::time::Duration::from_millis(palisade_core::limits::BODY_READ_TIMEOUT_MS);
    if let Some(peers) = peers {
        app = admission::peers_before_bodies(app, peers);
        app = palisade_listener::grpc_message_deadlines(
            app,
            within,
            admission::RAFT_GRPC,
            &[APPEND_STREAM_METHOD],
        );
    }
    palisade_listener::grpc_message_deadlines(
        app,
        within,
        admission::COORDINATOR_GRPC,
        &[KEEPALIVE_METHOD],
    )
}

/// What a server runs besides its front ends: the engine, or a cluster member's supervisor.
type Core = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ServerError>> + Send>>;

fn io(context: String) -> impl FnOnce(io::Error) -> ServerError {
    move |source| ServerError::Io { context, source }
}
