//! `palisade`: the coordinator, its client commands and its benchmark, in one binary.
//!
//! Exit codes: 0 success; 1 error; 2 bad usage; 3 the lock is held (acquire with no wait
//! left); 4 the coordinator or resource is unavailable; 5 the resource rejected the write or
//! activation (stale epoch, invalid token, …).

mod bench;
mod bench_fence;
mod cluster;
mod drill;
mod lock;
mod output;
mod resource;
mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use palisade_client::ClientError;

/// Fencing-token coordination: leases with strictly increasing, signed ownership epochs.
#[derive(Parser)]
#[command(name = "palisade", version, about)]
struct Cli {
    /// Print one JSON document instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the coordinator (gRPC and HTTP/JSON on one port).
    Serve(ServeArgs),
    /// Acquire, renew, release and inspect locks.
    #[command(subcommand)]
    Lock(LockCommand),
    /// A cluster's leader, members, roles and lag; add or remove members.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Run or use the reference fenced store.
    #[command(subcommand)]
    Resource(resource::ResourceCommand),
    /// Measure the coordinator.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Fault drills with real processes: stale-process, delayed-delivery, duplicate-token,
    /// forged-token, bypass, or all.
    Drill(drill::DrillArgs),
    /// Deterministic simulation: seeds of random pauses, delays, drops, reorders and crashes.
    Simulate(drill::SimulateArgs),
    /// A drill's worker process (started by `palisade drill`).
    #[command(hide = true)]
    DrillWorker(drill::WorkerArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Where the lease store and the signing key live.
    #[arg(long, default_value = palisade_server::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Address for gRPC and HTTP [default: 127.0.0.1:7420, or this node's --cluster entry].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Cluster mode: this node's id in --cluster.
    #[arg(long, requires = "cluster")]
    node_id: Option<u64>,
    /// Cluster mode: every member as ID=HOST:PORT, comma-separated (3 or 5 members; this
    /// node's entry is its own address).
    #[arg(long, requires = "node_id")]
    cluster: Option<String>,
    /// Cluster mode: do not initialise; wait to be added with `palisade cluster add`.
    #[arg(long, requires = "cluster")]
    join: bool,
}

/// Where the coordinator is.
#[derive(Args, Clone)]
struct EndpointArgs {
    /// Coordinator URL(s), comma-separated.
    #[arg(
        long,
        env = "PALISADE_ENDPOINT",
        default_value = palisade_client::DEFAULT_ENDPOINT,
        value_delimiter = ','
    )]
    endpoint: Vec<String>,
}

#[derive(Subcommand)]
enum LockCommand {
    /// Acquire a lock and print its epoch, lease id and token.
    Acquire {
        /// The lock's name: 1–256 bytes of [A-Za-z0-9._/-].
        name: String,
        /// Lease TTL (e.g. 10s, 500ms, 1m).
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// How long to wait for a held lock.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Holder id recorded in the lease (default: user@host:pid).
        #[arg(long)]
        holder: Option<String>,
        /// critical (writes must be fenced) or efficiency.
        #[arg(long, default_value = "critical")]
        class: String,
        /// Id of this acquire (1–64 of [A-Za-z0-9._-]); running the same command again with
        /// the same id and holder returns the same lease while it is live (default: fresh).
        #[arg(long)]
        request_id: Option<String>,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Renew a lease by its full TTL.
    Renew {
        /// The lease id printed by acquire.
        lease_id: u64,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Release a lease.
    Release {
        /// The lease id printed by acquire.
        lease_id: u64,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// List held locks and locks with waiters.
    List {
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Show one lock.
    Show {
        /// The lock's name.
        name: String,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Acquire+release cycles per second, with latency percentiles and the disk's fsync rate.
    Acquire(bench::AcquireBenchArgs),
    /// Fenced writes through the PostgreSQL adapter vs the raw seed statement, side by side.
    Postgres(bench_fence::PostgresBenchArgs),
    /// Fenced PUTs per second on the reference store, with the disk's fsync rate.
    Resource(bench_fence::ResourceBenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tokio_postgres=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(exit_code(&error))
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let json = cli.json;
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Cluster(command) => cluster::run(command, json).await,
        Command::Lock(command) => lock::run(command, json).await,
        Command::Resource(command) => resource::run(command, json).await,
        Command::Drill(args) => drill::run_drill(args, json).await,
        Command::Simulate(args) => drill::run_simulate(args, json),
        Command::DrillWorker(args) => drill::run_worker(args).await,
        Command::Bench(BenchCommand::Acquire(args)) => bench::run_acquire(args, json).await,
        Command::Bench(BenchCommand::Postgres(args)) => bench_fence::run_postgres(args, json).await,
        Command::Bench(BenchCommand::Resource(args)) => bench_fence::run_resource(args, json).await,
    }
}

fn exit_code(error: &anyhow::Error) -> u8 {
    if let Some(failure) = error.downcast_ref::<resource::ResourceFailure>() {
        return failure.exit_code();
    }
    match error.downcast_ref::<ClientError>() {
        Some(ClientError::Held(_)) => 3,
        Some(ClientError::Unavailable(_)) => 4,
        _ => 1,
    }
}
