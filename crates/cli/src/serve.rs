//! `palisade serve`: runs the coordinator (a single node, or a cluster member) until SIGINT or
//! SIGTERM.

use std::net::SocketAddr;

use anyhow::Context as _;
use palisade_server::cluster::ClusterConfig;
use palisade_server::ServerConfig;
use tokio::signal::unix::{signal, SignalKind};

use crate::ServeArgs;

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let cluster = match (args.node_id, &args.cluster) {
        (Some(node_id), Some(list)) => Some(ClusterConfig::parse(node_id, list, args.join)?),
        _ => None,
    };
    let listen = match (args.listen, &cluster) {
        (Some(listen), _) => listen,
        (None, Some(cluster)) => resolve(cluster.own_addr()).await?,
        (None, None) => palisade_server::DEFAULT_LISTEN
            .parse()
            .expect("a valid default address"),
    };
    let server = palisade_server::start(ServerConfig {
        data_dir: args.data_dir,
        listen,
        cluster,
    })
    .await
    .context("cannot start the coordinator")?;
    eprintln!("palisade coordinator listening on {}", server.local_addr);
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
        _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        // Resolves only if the server stops by itself (a storage failure).
        () = server.stopping() => {}
    }
    server
        .shutdown()
        .await
        .context("the coordinator stopped with an error")
}

async fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    tokio::net::lookup_host(addr)
        .await
        .with_context(|| format!("cannot resolve this node's address {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to no address"))
}
