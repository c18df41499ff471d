//! `palisade`: the coordinator, its client commands and its benchmark, in one binary.
//!
//! Exit codes: 0 success; 1 error; 2 bad usage; 3 the lock is held (acquire with no wait
//! left); 4 the coordinator or resource is unavailable; 5 the resource rejected the write or
//! activation (stale epoch, invalid token, …).

/// mimalloc rather than glibc's malloc: measured side by side, it cut the CPU per
/// acquire+release by 8–10 % and raised cycles/s by 5–10 % at 64 clients, for 10–14 MiB more
/// resident memory (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod audit;
mod backup;
mod cluster;
mod drill;
mod effects;
mod lock;
mod lock_run;
mod repair_fence;
mod resource;
mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use palisade_cli_common::credentials::{
    bearer_secret, ClientTlsArgs, AUTH_TOKEN_ENV, FENCE_TOKEN_ENV, OLD_TOKEN_ENV,
};
use palisade_cli_common::output;
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
    /// Back up a coordinator's epoch counter: online from a running coordinator (admin), or
    /// offline from a stopped single node's --data-dir.
    Backup(backup::BackupArgs),
    /// Make a new data directory from a backup that never issues an epoch issued before (it
    /// starts above the backup, the high-water file, every --floor-from resource and the
    /// clock), and print the floor it used and why.
    Restore(backup::RestoreArgs),
    /// Make bearer secrets and the lines of `--auth-file` for them.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Check the lock policy against the coordinator and the boundaries: per lock, its class,
    /// epoch, boundary and fence; findings, most severe first. Exits 8 on a critical finding.
    Audit {
        /// Also prove each boundary refuses an obsolete epoch (admin; writes only the probe's
        /// own lock and key, or a rolled-back transaction).
        #[arg(long)]
        probe: bool,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Measure the coordinator.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The effects ledger: operations, their attempts and reviews; perform, reconcile and
    /// resolve (docs/effects.md).
    #[command(subcommand)]
    Effects(effects::EffectsCommand),
    /// The fake receiver of effects, for tests and drills.
    #[command(subcommand)]
    Receiver(effects::ReceiverCommand),
    /// Fault drills with real processes: stale-process, delayed-delivery, duplicate-token,
    /// forged-token, bypass, coordinator-failover, restore, resource-restore, rollback, effects,
    /// or all.
    Drill(drill::DrillArgs),
    /// Deterministic simulation: seeds of random pauses, delays, drops, reorders and crashes.
    Simulate(drill::SimulateArgs),
    /// A drill's worker process (started by `palisade drill`).
    #[command(hide = true)]
    DrillWorker(drill::WorkerArgs),
    /// The effects drill's worker process (started by `palisade drill effects`).
    #[command(hide = true)]
    EffectsWorker(drill::EffectsWorkerArgs),
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
    /// Cluster mode: every member as ID=HOST:PORT, comma-separated (1 to 7 members, 3 or 5 in
    /// production; this node's entry is its own address).
    #[arg(long, requires = "node_id")]
    cluster: Option<String>,
    /// Cluster mode: do not initialise; wait to be added with `palisade cluster add`.
    #[arg(long, requires = "cluster")]
    join: bool,
    /// Principals and the SHA-256 of their bearer secrets (`palisade auth new` makes a
    /// line); reloaded on SIGHUP. Needs --acl-file.
    #[arg(long, requires = "acl_file")]
    auth_file: Option<PathBuf>,
    /// Rights: lines `PRINCIPAL read|acquire|admin PREFIX` (PREFIX: lock-name prefix or *);
    /// reloaded on SIGHUP. Needs --auth-file, --client-ca, or both.
    #[arg(long)]
    acl_file: Option<PathBuf>,
    /// TLS on the port for clients (HTTPS and gRPC): the certificate chain (PEM) clients
    /// verify. With it the port speaks TLS only. Needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA of client certificates (PEM): a certificate it signed authenticates the
    /// principal its subject's common name names. Needs --tls-cert and --acl-file.
    #[arg(long, requires_all = ["tls_cert", "acl_file"])]
    client_ca: Option<PathBuf>,
    /// Serve without authentication on a non-loopback address (anyone who can reach it may
    /// acquire, release and change the membership).
    #[arg(long)]
    insecure: bool,
    /// Cluster mode: this member's certificate (PEM chain), naming node-N.palisade as a DNS
    /// name, for both server and client authentication. Needs --peer-key and --peer-ca.
    #[arg(long, requires_all = ["cluster", "peer_key", "peer_ca"])]
    peer_cert: Option<PathBuf>,
    /// Cluster mode: the private key of --peer-cert (PEM).
    #[arg(long, requires = "peer_cert")]
    peer_key: Option<PathBuf>,
    /// Cluster mode: the CA that signs the members' certificates (dedicated to this cluster).
    #[arg(long, requires = "peer_cert")]
    peer_ca: Option<PathBuf>,
    /// Where the epoch high-water bound lives: a file outside the data directory, kept ahead
    /// of issuance, so that a data directory copied back from an older copy never issues an
    /// epoch twice [default: DATA_DIR.high-water, the data directory's sibling].
    #[arg(long, conflicts_with = "cluster")]
    high_water_file: Option<PathBuf>,
    /// Cluster mode without peer credentials: Raft traffic unauthenticated (loopback demos and
    /// tests only; logged as a warning at every start).
    #[arg(long, requires = "cluster", conflicts_with = "peer_cert")]
    insecure_peers: bool,
    /// The lock policy (TOML; see docs/policy.md): which locks are critical, where their
    /// writes are fenced, and the fallback when a receiver cannot enforce. Reloaded on SIGHUP.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Refuse acquires of critical locks whose policy names no boundary (needs --policy).
    #[arg(long, requires = "policy")]
    require_policy: bool,
    /// A single node refused to start because its epoch counter is ahead of its clock, and its
    /// clock is right: serve now, issuing above COUNTER (the counter the refusal named). Kept
    /// in the data directory until the clock passes the counter; until then a copy of the data
    /// directory put back is not caught by the clock floor (docs/operations.md).
    #[arg(long, value_name = "COUNTER", conflicts_with = "cluster")]
    resume_counter_ahead: Option<u64>,
    /// Cluster mode: the greatest offset between a leader's wall clock and a majority of the
    /// members' before it commits a clock floor; a member whose clock is further off does not
    /// lead, and says why (ARCHITECTURE.md, "Hybrid epochs").
    #[arg(
        long,
        value_name = "MS",
        requires = "cluster",
        default_value_t = palisade_cluster::clock_check::DEFAULT_MAX_CLOCK_OFFSET_MS
    )]
    max_clock_offset_ms: u64,
}

/// Where the coordinator is.
#[derive(Args, Clone)]
struct EndpointArgs {
    /// Coordinator URL(s), comma-separated.
    #[arg(
        long,
        env = "PALISADE_ENDPOINT",
        default_value = palisade_client::DEFAULT_ENDPOINT,
        value_delimiter = ',',
        value_parser = parse_endpoint
    )]
    endpoint: Vec<String>,
    /// File holding the bearer secret to authenticate with (else the environment variable
    /// PALISADE_AUTH_TOKEN, else none).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[command(flatten)]
    tls: ClientTlsArgs,
}

/// Refuses `PALISADE_TOKEN` for the commands that took it as an ownership token, before the
/// arguments are parsed (a missing `--token` would otherwise name only the flag).
fn refuse_old_token_as_fence(args: &[String]) -> Option<String> {
    let words: Vec<&str> = args.iter().skip(1).take(2).map(String::as_str).collect();
    let takes_fence_token = matches!(
        words.as_slice(),
        ["resource", "put" | "activate"] | ["effects", "perform"]
    );
    (takes_fence_token && std::env::var_os(OLD_TOKEN_ENV).is_some()).then(|| {
        format!(
            "{OLD_TOKEN_ENV} is no longer read as an ownership token (it also meant the bearer \
             secret): set {FENCE_TOKEN_ENV} or pass --token; the bearer secret is \
             {AUTH_TOKEN_ENV} or --token-file"
        )
    })
}

impl EndpointArgs {
    /// The bearer secret: from --token-file, else from PALISADE_AUTH_TOKEN, else none.
    fn bearer(&self) -> anyhow::Result<Option<String>> {
        bearer_secret(self.token_file.as_deref())
    }

    /// How client commands authenticate: [`Self::bearer`] and the TLS flags.
    fn credentials(&self) -> anyhow::Result<palisade_client::Credentials> {
        let credentials = match self.bearer()? {
            Some(secret) => palisade_client::Credentials::bearer(&secret)?,
            None => palisade_client::Credentials::default(),
        };
        self.tls.add_to(credentials)
    }

    /// An HTTP client with these credentials, giving up after `timeout`.
    fn http(&self, timeout: Duration) -> anyhow::Result<reqwest::Client> {
        self.tls.http(self.bearer()?.as_deref(), timeout)
    }

    /// Connects a client that authenticates with [`Self::credentials`].
    async fn connect(&self) -> anyhow::Result<palisade_client::Client> {
        let credentials = self.credentials()?;
        palisade_client::Client::connect_with(&self.endpoint, credentials)
            .await
            .with_context(|| {
                format!(
                    "cannot reach the coordinator at {}",
                    self.endpoint.join(",")
                )
            })
    }
}

#[derive(Subcommand)]
enum LockCommand {
    /// Acquire a lock and print its epoch, lease id and token.
    Acquire {
        /// The lock's name: 1–256 bytes of [A-Za-z0-9._/-].
        #[arg(value_parser = parse_lock_name)]
        name: String,
        /// Lease TTL, 10ms to 1h (e.g. 10s, 500ms, 1m).
        #[arg(long, default_value = "10s", value_parser = parse_ttl)]
        ttl: Duration,
        /// How long to wait for a held lock, at most 5m.
        #[arg(long, default_value = "0s", value_parser = parse_wait)]
        wait: Duration,
        /// Holder id recorded in the lease (default: user@host:pid).
        #[arg(long, value_parser = parse_holder)]
        holder: Option<String>,
        /// critical (writes must be fenced) or efficiency [default: what the coordinator's
        /// lock policy says; critical without one].
        #[arg(long, value_parser = ["critical", "efficiency"])]
        class: Option<String>,
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
        lease_id: String,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Release a lease.
    Release {
        /// The lease id printed by acquire.
        lease_id: String,
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
    /// End a lock's lease now, as an admin of the lock: for a holder whose lease id was lost
    /// (else its TTL runs, up to an hour). The next owner gets a higher epoch, so the broken
    /// holder's writes are still refused wherever the next owner wrote. Logged by the
    /// coordinator with who broke it, and counted in palisade_leases_broken_total.
    Break {
        /// The lock's name.
        name: String,
        /// Break only the lease at this epoch (as `lock show` printed it): if the lock changed
        /// hands since, nothing is broken.
        #[arg(long)]
        epoch: Option<u64>,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Print a lock's ownership transitions as they happen, one line each (with --json, one
    /// JSON object per line): its state now, then every grant, release, expiry and break, with
    /// the time the coordinator's answer arrived. NAME ending in `*` (quote it: 'jobs/*')
    /// watches every lock whose name starts with the rest, beginning with each held one's
    /// state. Runs until interrupted, or --count events.
    Watch {
        /// The lock's name, or a prefix followed by `*`.
        name: String,
        /// Stop after this many events (for one lock, the first is its state now).
        #[arg(long)]
        count: Option<u64>,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Run a command while holding the lock (flock-style): the lease is kept alive and given
    /// to the command as PALISADE_LOCK, PALISADE_EPOCH, PALISADE_FENCE_TOKEN and
    /// PALISADE_LEASE_ID (not the bearer secret, unless --pass-auth-token). Exits with the
    /// command's code; with 75 when the lease was lost or about to be and the command stopped
    /// (SIGTERM to its process group --grace before the lease's validity ends, SIGKILL when it
    /// ends: before the lock can change hands); 3 when the lock is held past --wait.
    Run(lock_run::RunArgs),
}

#[derive(Subcommand)]
enum AuthCommand {
    /// A new random bearer secret (256 bits) for PRINCIPAL: writes the secret to --secret-file
    /// (mode 0600; give it to the client as --token-file) and prints the auth-file line.
    New {
        /// The principal's name: 1–128 of [A-Za-z0-9._@:-].
        principal: String,
        /// Where to write the secret (refused if it exists).
        #[arg(long)]
        secret_file: PathBuf,
    },
    /// The auth-file hash (`sha256:HEX`) of a secret read from standard input.
    Hash,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Acquire+release cycles per second, with latency percentiles and the disk's fsync rate.
    Acquire(palisade_bench::AcquireBenchArgs),
    /// Fenced writes through the PostgreSQL adapter vs the raw seed statement, side by side.
    Postgres(palisade_bench::PostgresBenchArgs),
    /// Fenced PUTs per second on the reference store, with the disk's fsync rate.
    Resource(palisade_bench::ResourceBenchArgs),
    /// Effects per second through the effects ledger vs sent directly, side by side.
    Effects(palisade_bench::EffectsBenchArgs),
    /// A SQL writer's fenced update passing its token vs the plain statement with a bare
    /// epoch, one connection, medians of several loops.
    SqlToken(palisade_bench::sql_token::SqlTokenBenchArgs),
}

/// What is logged when RUST_LOG is not set.
const DEFAULT_LOG_FILTER: &str = "info,openraft=error,tokio_postgres=warn";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(message) = refuse_old_token_as_fence(&args) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    // openraft narrates every vote and ignored message at INFO and WARN, healthy elections
    // included: only its errors by default (RUST_LOG=info,openraft=info shows the rest).
    // Colour only on a terminal: a log file or journald gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let json = cli.json;
    let result = runtime.block_on(run(cli));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let (code, message) = match error.downcast_ref::<lock_run::Exit>() {
                // A command's own code is passed on without a word.
                Some(exit) => (exit.code, exit.message.clone()),
                None => (exit_code(&error), Some(format!("{error:#}"))),
            };
            // A command that printed its document (the audit's findings, a drill's report, an
            // effect's record) keeps stdout to that one document.
            let reported = output::PRINTED_JSON.load(std::sync::atomic::Ordering::Relaxed);
            if let Some(message) = message {
                if json && !reported {
                    // Under --json an error is JSON too, on stdout where scripts read.
                    output::print_json(&serde_json::json!({
                        "error": {"exit_code": code, "message": message}
                    }));
                }
                eprintln!("error: {message}");
            }
            ExitCode::from(code)
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
        Command::Effects(command) => effects::run(command, json).await,
        Command::Receiver(command) => effects::run_receiver(command).await,
        Command::Auth(command) => auth(command, json),
        Command::Audit { probe, endpoint } => audit::run(endpoint, probe, json).await,
        Command::Backup(args) => backup::run_backup(args, json).await,
        Command::Restore(args) => backup::run_restore(args, json).await,
        Command::Drill(args) => drill::run_drill(args, json).await,
        Command::Simulate(args) => drill::run_simulate(args, json),
        Command::DrillWorker(args) => drill::run_worker(args).await,
        Command::EffectsWorker(args) => drill::run_effects_worker(args).await,
        Command::Bench(BenchCommand::Acquire(args)) => {
            palisade_bench::run_acquire(args, json).await
        }
        Command::Bench(BenchCommand::Postgres(args)) => {
            palisade_bench::run_postgres(args, json).await
        }
        Command::Bench(BenchCommand::Resource(args)) => {
            palisade_bench::run_resource(args, json).await
        }
        Command::Bench(BenchCommand::Effects(args)) => {
            palisade_bench::run_effects(args, json).await
        }
        Command::Bench(BenchCommand::SqlToken(args)) => {
            palisade_bench::sql_token::run(args, json).await
        }
    }
}

fn auth(command: AuthCommand, json: bool) -> anyhow::Result<()> {
    use base64::Engine as _;
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::OpenOptionsExt as _;

    match command {
        AuthCommand::New {
            principal,
            secret_file,
        } => {
            let principal = palisade_core::Principal::new(principal)?;
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes)
                .map_err(|e| anyhow::anyhow!("no randomness for the secret: {e}"))?;
            let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&secret_file)
                .with_context(|| format!("cannot create {}", secret_file.display()))?;
            writeln!(file, "{secret}")?;
            file.sync_all()?;
            let line = format!(
                "{principal} {}",
                palisade_server::auth::hash_secret(&secret)
            );
            if json {
                output::print_json(&serde_json::json!({
                    "principal": principal.as_str(),
                    "auth_line": line,
                    "secret_file": secret_file,
                }));
            } else {
                println!("{line}");
            }
        }
        AuthCommand::Hash => {
            let mut secret = String::new();
            std::io::stdin().read_to_string(&mut secret)?;
            anyhow::ensure!(!secret.trim().is_empty(), "no secret on standard input");
            println!("{}", palisade_server::auth::hash_secret(&secret));
        }
    }
    Ok(())
}

/// A coordinator URL: `http://` or `https://`.
fn parse_endpoint(text: &str) -> Result<String, String> {
    let url = text.trim();
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(url.to_owned())
    } else {
        Err(format!(
            "{url:?} is not a coordinator URL; use http://HOST:PORT or https://HOST:PORT"
        ))
    }
}

fn parse_lock_name(text: &str) -> Result<String, String> {
    palisade_core::LockName::new(text)
        .map(|name| name.as_str().to_owned())
        .map_err(|e| e.0)
}

fn parse_holder(text: &str) -> Result<String, String> {
    palisade_core::HolderId::new(text)
        .map(|holder| holder.as_str().to_owned())
        .map_err(|e| e.0)
}

/// A duration between `min` and `max`, with the reason in people's words.
fn bounded_duration(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let value = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    let human = |d: Duration| humantime::format_duration(d).to_string();
    if value < min {
        Err(format!("{text} is shorter than the {} minimum", human(min)))
    } else if value > max {
        Err(format!("{text} is longer than the {} maximum", human(max)))
    } else {
        Ok(value)
    }
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    use palisade_core::limits::{MAX_TTL_MS, MIN_TTL_MS};
    bounded_duration(
        text,
        Duration::from_millis(MIN_TTL_MS),
        Duration::from_millis(MAX_TTL_MS),
    )
}

fn parse_wait(text: &str) -> Result<Duration, String> {
    let max = Duration::from_millis(palisade_core::limits::MAX_WAIT_MS);
    bounded_duration(text, Duration::ZERO, max)
}

fn exit_code(error: &anyhow::Error) -> u8 {
    if serve::was_removed(error) {
        return serve::REMOVED_EXIT_CODE;
    }
    if error.downcast_ref::<audit::CriticalFindings>().is_some() {
        return 8;
    }
    if let Some(failure) = error.downcast_ref::<palisade_effects::RunError>() {
        return match failure {
            palisade_effects::RunError::Rejected(_) => 5,
            palisade_effects::RunError::Ledger(_) => 4,
        };
    }
    if let Some(failure) = error.downcast_ref::<resource::ResourceFailure>() {
        return failure.exit_code();
    }
    match error.downcast_ref::<ClientError>() {
        // Input the coordinator found invalid: bad usage, as clap's own errors.
        Some(ClientError::InvalidArgument(_)) => 2,
        Some(ClientError::Held(_)) => 3,
        Some(ClientError::Unavailable(_)) => 4,
        Some(ClientError::Unauthenticated(_) | ClientError::PermissionDenied(_)) => 6,
        Some(ClientError::RefusedByPolicy(_)) => 7,
        _ => 1,
    }
}
