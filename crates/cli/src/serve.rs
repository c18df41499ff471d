//! `palisade serve`: runs the coordinator (a single node, or a cluster member) until SIGINT or
//! SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use palisade_cluster::peer_tls::PeerTls;
use palisade_cluster::ClusterConfig;
use palisade_server::auth::Auth;
use palisade_server::policy::PolicyState;
use palisade_server::tls::ClientTls;
use palisade_server::ServerConfig;
use tokio::signal::unix::{signal, SignalKind};

use crate::ServeArgs;

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let cluster = cluster_config(&args)?;
    let listen = match (args.listen, &cluster) {
        (Some(listen), _) => listen,
        (None, Some(cluster)) => resolve(cluster.own_addr()).await?,
        (None, None) => palisade_server::DEFAULT_LISTEN
            .parse()
            .expect("a valid default address"),
    };
    let auth = Arc::new(load_auth(&args)?);
    let client_tls = load_client_tls(&args)?;
    let policy = Arc::new(
        PolicyState::load(args.policy.as_deref(), args.require_policy)
            .context("cannot load the lock policy")?,
    );
    // Listen for SIGHUP before serving, so no reload request is lost to the default action
    // (which would end the process).
    let mut hangup = signal(SignalKind::hangup())?;
    let peer_tls = match (&cluster, &args.peer_cert, &args.peer_key, &args.peer_ca) {
        (Some(cluster), Some(cert), Some(key), Some(ca)) => Some(Arc::new(
            PeerTls::load(cluster.node_id, cert, key, ca)
                .context("cannot load the peer credentials")?,
        )),
        _ => None,
    };
    let server = palisade_server::start(ServerConfig {
        data_dir: args.data_dir,
        listen,
        cluster,
        auth: auth.clone(),
        insecure: args.insecure,
        peer_tls,
        client_tls,
        high_water: args.high_water_file,
        insecure_peers: args.insecure_peers,
        policy: policy.clone(),
        resume_counter_ahead: args.resume_counter_ahead.map(palisade_core::Epoch),
    })
    .await
    .map_err(removal_told_apart)
    .context("cannot start the coordinator")?;
    eprintln!("palisade coordinator listening on {}", server.local_addr);
    eprintln!(
        "palisade coordinator pid {pid}: kill -HUP {pid} reloads the auth, ACL and policy files; \
         kill {pid} stops it",
        pid = std::process::id()
    );
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                reload(&auth, &policy, &server);
                continue;
            }
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
            // Resolves only if the server stops by itself (a storage failure).
            () = server.stopping() => {}
        }
        break;
    }
    server
        .shutdown()
        .await
        .map_err(removal_told_apart)
        .context("the coordinator stopped with an error")
}

/// The exit code of a cluster member removed from the membership (`palisade cluster remove`):
/// it stops by itself, or refuses to start again, rather than campaign in a cluster that no
/// longer counts it. Distinct, so that a service manager can be told not to restart it
/// (systemd: `RestartPreventExitStatus=10`).
pub const REMOVED_EXIT_CODE: u8 = 10;

/// A cluster member removed from the membership: it stopped, or does not start again.
#[derive(Debug)]
pub struct Removed(String);

impl std::fmt::Display for Removed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Removed {}

/// Whether `error` is a cluster member's removal from the membership.
pub fn was_removed(error: &anyhow::Error) -> bool {
    error.downcast_ref::<Removed>().is_some()
}

/// `error`, with a removal from the membership told apart (its own exit code, its message
/// once).
fn removal_told_apart(error: palisade_server::ServerError) -> anyhow::Error {
    match error {
        palisade_server::ServerError::Cluster(palisade_cluster::ClusterError::Removed(why)) => {
            Removed(why).into()
        }
        other => other.into(),
    }
}

/// Cluster mode's settings (`--node-id`, `--cluster`, `--join`, `--max-clock-offset-ms`), or
/// `None` for a single node.
fn cluster_config(args: &ServeArgs) -> anyhow::Result<Option<ClusterConfig>> {
    Ok(match (args.node_id, &args.cluster) {
        (Some(node_id), Some(list)) => Some(ClusterConfig {
            max_clock_offset_ms: args.max_clock_offset_ms,
            ..ClusterConfig::parse(node_id, list, args.join)?
        }),
        _ => None,
    })
}

/// The principals and their rights: from the auth and ACL files, or open (no files).
fn load_auth(args: &ServeArgs) -> anyhow::Result<Auth> {
    Ok(match (&args.auth_file, &args.acl_file) {
        (None, Some(_)) if args.client_ca.is_none() => anyhow::bail!(
            "--acl-file names principals, but nothing would authenticate them: give \
             --auth-file (bearer secrets), --client-ca (client certificates), or both"
        ),
        (auth_file, Some(acl_file)) => Auth::load(auth_file.as_deref(), acl_file)
            .context("cannot load the auth and ACL files")?,
        _ => Auth::open(),
    })
}

/// TLS for clients, when --tls-cert and --tls-key are given.
fn load_client_tls(args: &ServeArgs) -> anyhow::Result<Option<Arc<ClientTls>>> {
    Ok(match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Arc::new(
            ClientTls::load(cert, key, args.client_ca.as_deref())
                .context("cannot load the TLS files")?,
        )),
        _ => None,
    })
}

/// SIGHUP: the auth, ACL and policy files read again; a file that does not load leaves the
/// one in force.
fn reload(auth: &Auth, policy: &PolicyState, server: &palisade_server::RunningServer) {
    match auth.reload() {
        Ok((principals, rules)) => {
            tracing::info!(principals, rules, "SIGHUP: auth and ACL files reloaded")
        }
        Err(error) => tracing::error!(
            %error, "SIGHUP: the files were not reloaded; the previous policy stays"
        ),
    }
    match policy.reload() {
        Ok(rules) if policy.file().is_some() => {
            tracing::info!(rules, "SIGHUP: lock policy reloaded");
            server.policy_reloaded(Ok(rules));
        }
        Ok(_) => {}
        Err(error) => {
            tracing::error!(
                %error, "SIGHUP: the lock policy was not reloaded; the previous one stays"
            );
            server.policy_reloaded(Err(()));
        }
    }
}

async fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    tokio::net::lookup_host(addr)
        .await
        .with_context(|| format!("cannot resolve this node's address {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to no address"))
}
