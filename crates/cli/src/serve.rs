//! `palisade serve`: runs the coordinator until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use palisade_server::ServerConfig;
use tokio::signal::unix::{signal, SignalKind};

pub async fn run(data_dir: PathBuf, listen: SocketAddr) -> anyhow::Result<()> {
    let server = palisade_server::start(ServerConfig { data_dir, listen })
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
