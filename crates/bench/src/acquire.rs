//! `palisade bench acquire`: acquire+release cycles per second against a coordinator.
//!
//! With no `--endpoint` it starts its own coordinator in a temporary directory and, in the same
//! run, measures the fdatasync rate of that directory, so the result can be read as a ratio
//! (cycles per fsync) that holds from machine to machine: one fsync per operation would give
//! at most 0.5 cycles per fsync (a cycle is two durable operations).

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use palisade_client::{AcquireOptions, Client, ClientError, Credentials};
use palisade_core::LockClass;
use palisade_server::ServerConfig;
use serde::Serialize;
use tokio::time::Instant;

use palisade_cli_common::credentials::{bearer_secret, ClientTlsArgs};
use palisade_cli_common::output::{print_fields, print_json};

use crate::cycle::{Cycle, MAX_SAMPLES_PER_CLIENT};
use crate::probe::measure_fdatasync;

/// How long a contended acquire may wait for its turn.
const BENCH_WAIT: Duration = Duration::from_secs(30);

#[derive(Args)]
pub struct AcquireBenchArgs {
    /// Coordinator URL(s); without it the bench starts its own coordinator in a temp dir.
    #[arg(long, env = "PALISADE_ENDPOINT", value_delimiter = ',')]
    endpoint: Option<Vec<String>>,
    /// Concurrent clients, each with its own connection.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Distinct locks; client i uses lock i mod M (M = 1 is one contended lock).
    #[arg(long, default_value_t = 8)]
    locks: usize,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Also start an embedded cluster of this many members (3 or 5, in-process, loopback) and
    /// measure it right after the single node, in the same run.
    #[arg(long, conflicts_with = "endpoint")]
    cluster: Option<usize>,
    /// Also measure the embedded single node with authentication on (a principal, its bearer
    /// secret and an ACL) right after the open one, in the same run.
    #[arg(long, conflicts_with_all = ["endpoint", "cluster"])]
    with_auth: bool,
    /// With --with-auth: also measure it with authentication over TLS (client TLS on the port,
    /// certificates made for the run), in the same run.
    #[arg(long, requires = "with_auth")]
    with_tls: bool,
    /// With --cluster: also measure the cluster with its members over mutual TLS (certificates
    /// made for the run), right after the one without, in the same run.
    #[arg(long, requires = "cluster")]
    peer_tls: bool,
    /// With --endpoint: the bearer secret to authenticate with (else PALISADE_AUTH_TOKEN).
    #[arg(long, requires = "endpoint")]
    token_file: Option<std::path::PathBuf>,
    /// Also run the same workload against another lock service, right after Palisade, in the
    /// same run: `redis=redis://HOST:PORT` (SET NX PX + Lua release) or
    /// `etcd=http://HOST:PORT` (v3 JSON gateway: lease + transactions). Repeatable.
    /// `scripts/bench-compare` starts both durably and runs the whole table.
    #[arg(long, value_delimiter = ',', value_parser = crate::compare::Target::parse,
          conflicts_with = "with_auth")]
    compare: Vec<crate::compare::Target>,
    #[command(flatten)]
    tls: ClientTlsArgs,
}

/// How an embedded single node is secured for one measurement.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Secured {
    /// Open (no authentication).
    Open,
    /// A principal with a bearer secret and an ACL.
    Auth,
    /// [`Secured::Auth`], with the clients over TLS.
    AuthTls,
}

/// How the bench clients authenticate (as the other client commands do); none: an open
/// coordinator.
fn bench_credentials(args: &AcquireBenchArgs) -> anyhow::Result<Credentials> {
    let credentials = match bearer_secret(args.token_file.as_deref())? {
        Some(secret) => Credentials::bearer(&secret)?,
        None => Credentials::default(),
    };
    args.tls.add_to(credentials)
}

/// Auth and ACL files for one bench principal with `acquire` on `bench/`; returns the policy
/// and the client's credentials.
fn bench_auth(dir: &Path) -> anyhow::Result<(palisade_server::auth::Auth, Credentials)> {
    let secret = "bench-secret-not-for-production-0123456789abcdef";
    let auth_file = dir.join("auth");
    let acl_file = dir.join("acl");
    std::fs::write(
        &auth_file,
        format!("bench {}\n", palisade_server::auth::hash_secret(secret)),
    )?;
    std::fs::write(&acl_file, "bench acquire bench/\n")?;
    let auth = palisade_server::auth::Auth::from_files(&auth_file, &acl_file)?;
    Ok((auth, Credentials::bearer(secret)?))
}

#[derive(Serialize)]
struct Report {
    clients: usize,
    locks: usize,
    duration_s: f64,
    cycles: usize,
    errors: usize,
    ops_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    /// Hand-offs from a releasing holder to a waiting one: release sent → grant received.
    handoffs: usize,
    handoff_p50_us: Option<u64>,
    handoff_p99_us: Option<u64>,
    /// fdatasync calls per second in the coordinator's data directory (embedded runs only).
    fsyncs_per_sec: Option<f64>,
    /// ops_per_sec / fsyncs_per_sec.
    ops_per_fsync: Option<f64>,
    /// Durable commits per second at the coordinator (from its /metrics).
    commits_per_sec: Option<f64>,
    /// Requests answered per durable commit: the group-commit factor.
    requests_per_commit: Option<f64>,
    /// fdatasync/fsync calls of the lease log per commit (a single node; 1.0 = one per commit).
    fsyncs_per_commit: Option<f64>,
    /// With --endpoint: the coordinator's CPU time (user + system) per cycle.
    server_cpu_us_per_cycle: Option<f64>,
    /// With --endpoint: this bench process's CPU time per cycle (its clients).
    client_cpu_us_per_cycle: Option<f64>,
    /// Embedded: the CPU time of the whole process (coordinator and clients) per cycle.
    total_cpu_us_per_cycle: Option<f64>,
    endpoint: String,
}

/// What the coordinators' /metrics count, summed over the endpoints (in a cluster only
/// leaders commit).
#[derive(Clone, Copy, Default)]
struct ServerCounters {
    /// Requests answered by commits (`palisade_commit_batch_size_sum`).
    requests: f64,
    commits: f64,
    /// The single node's lease-log syncs (`palisade_store_syncs_total`).
    syncs: f64,
    /// CPU seconds of the coordinators' processes (`palisade_process_cpu_seconds_total`).
    cpu_seconds: f64,
}

async fn commit_counters(endpoints: &[String]) -> Option<ServerCounters> {
    let mut total = ServerCounters::default();
    for endpoint in endpoints {
        if let Some(node) = node_commit_counters(endpoint).await {
            total.requests += node.requests;
            total.commits += node.commits;
            total.syncs += node.syncs;
            total.cpu_seconds += node.cpu_seconds;
        }
    }
    Some(total)
}

/// What one coordinator's /metrics count.
async fn node_commit_counters(endpoint: &str) -> Option<ServerCounters> {
    let text = reqwest::get(format!("{}/metrics", endpoint.trim_end_matches('/')))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().parse::<f64>().ok())
    };
    Some(ServerCounters {
        requests: value("palisade_commit_batch_size_sum ")?,
        commits: value("palisade_commit_batch_size_count ")?,
        syncs: value("palisade_store_syncs_total ").unwrap_or(0.0),
        cpu_seconds: value("palisade_process_cpu_seconds_total ").unwrap_or(0.0),
    })
}

/// This process's CPU seconds (user + system).
fn own_cpu_seconds() -> f64 {
    palisade_coordinator::metrics::process_cpu_seconds().unwrap_or(0.0)
}

pub async fn run_acquire(args: AcquireBenchArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    anyhow::ensure!(args.locks >= 1, "--locks must be at least 1");
    if args.with_auth {
        return run_secured(&args, json).await;
    }
    let Some(members) = args.cluster else {
        let report = measure(&args, None, Secured::Open).await?;
        if args.compare.is_empty() {
            print_report(&report, json);
        } else {
            let others = measure_others(&args).await?;
            print_comparison("palisade", &report, &others, json);
        }
        return Ok(());
    };
    anyhow::ensure!(
        (1..=palisade_cluster::MAX_MEMBERS).contains(&members),
        "--cluster takes 1 to {} members",
        palisade_cluster::MAX_MEMBERS
    );
    run_cluster(&args, members, json).await
}

/// `--with-auth`: an open coordinator, then bearer secrets and an ACL, then (with
/// `--with-tls`) the same over TLS, in one run.
async fn run_secured(args: &AcquireBenchArgs, json: bool) -> anyhow::Result<()> {
    let open = measure(args, None, Secured::Open).await?;
    let auth = measure(args, None, Secured::Auth).await?;
    let tls = match args.with_tls {
        true => Some(measure(args, None, Secured::AuthTls).await?),
        false => None,
    };
    let per_open = |report: &Report| report.ops_per_sec / open.ops_per_sec.max(f64::MIN_POSITIVE);
    let ratio = per_open(&auth);
    let tls_ratio = tls.as_ref().map(per_open);
    if json {
        print_json(&serde_json::json!({
            "open": open,
            "auth": auth,
            "auth_vs_open": ratio,
            "auth_tls": tls,
            "auth_tls_vs_open": tls_ratio,
        }));
        return Ok(());
    }
    println!("open (no authentication):");
    print_report(&open, false);
    println!("\nbearer secret + ACL (same run):");
    print_report(&auth, false);
    println!("\nauth / open: {ratio:.2}× the cycles per second");
    if let (Some(tls), Some(tls_ratio)) = (&tls, tls_ratio) {
        println!("\nbearer secret + ACL over TLS (same run):");
        print_report(tls, false);
        println!("\nauth over TLS / open: {tls_ratio:.2}× the cycles per second");
    }
    Ok(())
}

/// The reports of a `--cluster` run, all measured in the same run.
struct ClusterRun {
    members: usize,
    single: Report,
    cluster: Report,
    /// With `--peer-tls`: the cluster with its members over mutual TLS.
    tls: Option<Report>,
    /// The `--compare` targets.
    others: Vec<(String, Report)>,
}

/// `--cluster N`: a single node, then a cluster of `members`, then (with `--peer-tls`) the
/// cluster over mutual TLS, then each `--compare` target.
async fn run_cluster(args: &AcquireBenchArgs, members: usize, json: bool) -> anyhow::Result<()> {
    let single = measure(args, None, Secured::Open).await?;
    let cluster = measure(args, Some((members, false)), Secured::Open).await?;
    let tls = match args.peer_tls {
        true => Some(measure(args, Some((members, true)), Secured::Open).await?),
        false => None,
    };
    let others = measure_others(args).await?;
    let run = ClusterRun {
        members,
        single,
        cluster,
        tls,
        others,
    };
    match json {
        true => print_json(&run.to_json()),
        false => run.print(),
    }
    Ok(())
}

impl ClusterRun {
    /// The cluster's cycles per second over `other`'s.
    fn versus(&self, other: &Report) -> f64 {
        self.cluster.ops_per_sec / other.ops_per_sec.max(f64::MIN_POSITIVE)
    }

    /// The mutual-TLS cluster's cycles per second over the clear one's.
    fn tls_ratio(&self) -> Option<f64> {
        self.tls
            .as_ref()
            .map(|tls| tls.ops_per_sec / self.cluster.ops_per_sec.max(f64::MIN_POSITIVE))
    }

    fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::json!({
            "single": self.single,
            "cluster": self.cluster,
            "members": self.members,
            "cluster_vs_single": self.versus(&self.single),
            "cluster_peer_tls": self.tls,
            "peer_tls_vs_clear": self.tls_ratio(),
        });
        for (name, other) in &self.others {
            value[name.as_str()] = serde_json::to_value(other).expect("serializes");
            value[format!("cluster_vs_{name}")] = serde_json::json!(self.versus(other));
        }
        value
    }

    fn print(&self) {
        let members = self.members;
        println!("single node:");
        print_report(&self.single, false);
        println!("\n{members}-member cluster (same run):");
        print_report(&self.cluster, false);
        let ratio = self.versus(&self.single);
        println!("\ncluster / single: {ratio:.2}× the cycles per second");
        if let (Some(tls), Some(tls_ratio)) = (&self.tls, self.tls_ratio()) {
            println!("\n{members}-member cluster, members over mutual TLS (same run):");
            print_report(tls, false);
            println!("\nmutual TLS / clear: {tls_ratio:.2}× the cycles per second");
        }
        for (name, other) in &self.others {
            println!("\n{name} (same run):");
            print_report(other, false);
            let versus = self.versus(other);
            println!("\ncluster / {name}: {versus:.2}× the cycles per second");
        }
    }
}

/// The same workload against each `--compare` target, one after the other.
async fn measure_others(args: &AcquireBenchArgs) -> anyhow::Result<Vec<(String, Report)>> {
    let mut reports = Vec::new();
    for target in &args.compare {
        let started = Instant::now();
        let deadline = started + args.duration;
        let mut tasks = Vec::with_capacity(args.clients);
        for index in 0..args.clients {
            tasks.push(tokio::spawn(crate::compare::client_loop(
                target.clone(),
                index,
                args.locks,
                started,
                deadline,
            )));
        }
        let mut cycles = Vec::new();
        let mut errors = 0;
        for task in tasks {
            let (mine, failed) = task
                .await?
                .with_context(|| format!("measuring {}", target.url()))?;
            cycles.extend(mine);
            errors += failed;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let mut report = summarize(args, &[target.url()], cycles, errors, elapsed, None);
        report.endpoint = target.url();
        reports.push((target.name().to_owned(), report));
    }
    Ok(reports)
}

/// Prints `ours` beside the other services' reports, with the ratios of cycles per second.
fn print_comparison(name: &str, ours: &Report, others: &[(String, Report)], json: bool) {
    let ratio = |other: &Report| ours.ops_per_sec / other.ops_per_sec.max(f64::MIN_POSITIVE);
    if json {
        let mut value = serde_json::json!({ name: ours });
        for (other_name, other) in others {
            value[other_name.as_str()] = serde_json::to_value(other).expect("serializes");
            value[format!("{name}_vs_{other_name}")] = serde_json::json!(ratio(other));
        }
        print_json(&value);
        return;
    }
    println!("{name}:");
    print_report(ours, false);
    for (other_name, other) in others {
        println!("\n{other_name} (same run):");
        print_report(other, false);
        println!(
            "\n{name} / {other_name}: {:.2}× the cycles per second",
            ratio(other)
        );
    }
}

/// Starts an in-process cluster of `members` on loopback, each in its own directory.
async fn start_cluster(
    dir: &Path,
    members: usize,
    peer_tls: bool,
) -> anyhow::Result<(Vec<palisade_server::RunningServer>, Vec<String>)> {
    let pki = dir.join("pki");
    if peer_tls {
        palisade_drill::certs::peer_credentials(&pki, 1..=members as u64)?;
    }
    let mut addrs = std::collections::BTreeMap::new();
    for id in 1..=members as u64 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        addrs.insert(id, format!("127.0.0.1:{port}"));
    }
    let list = palisade_cluster::format_members(&addrs);
    let mut servers = Vec::new();
    for (id, addr) in &addrs {
        let cluster = palisade_cluster::ClusterConfig::parse(*id, &list, false)?;
        let tls = if peer_tls {
            let file = |name: String| pki.join(name);
            Some(std::sync::Arc::new(
                palisade_cluster::peer_tls::PeerTls::load(
                    *id,
                    &file(format!("node-{id}.pem")),
                    &file(format!("node-{id}.key")),
                    &file("ca.pem".into()),
                )?,
            ))
        } else {
            None
        };
        servers.push(
            palisade_server::start(ServerConfig {
                data_dir: dir.join(format!("node{id}")),
                listen: addr.parse()?,
                cluster: Some(cluster),
                // In-process members on loopback: TLS between them only when measured.
                insecure_peers: tls.is_none(),
                peer_tls: tls,
                ..Default::default()
            })
            .await?,
        );
    }
    let urls = addrs.values().map(|a| format!("http://{a}")).collect();
    Ok((servers, urls))
}

/// One measurement: against `--endpoint`, or an embedded single node (`cluster: None`;
/// secured as `secured` says) or an embedded cluster (`(members, peer TLS)`).
async fn measure(
    args: &AcquireBenchArgs,
    cluster: Option<(usize, bool)>,
    secured: Secured,
) -> anyhow::Result<Report> {
    let mut credentials = bench_credentials(args)?;
    let target = match &args.endpoint {
        Some(endpoints) => Target::remote(endpoints.clone()),
        None => Target::embedded(cluster, secured, &mut credentials).await?,
    };
    let endpoints = &target.endpoints;
    let counters_before = commit_counters(endpoints).await;
    let cpu_before = own_cpu_seconds();
    let (cycles, errors, elapsed) = run_clients(args, endpoints, &credentials).await?;
    let own_cpu = own_cpu_seconds() - cpu_before;
    let counters_after = commit_counters(endpoints).await;
    let embedded = !target.servers.is_empty();
    let mut report = summarize(
        args,
        endpoints,
        cycles,
        errors,
        elapsed,
        target.fsyncs_per_sec,
    );
    target.stop().await?;
    let per_cycle =
        |seconds: f64| (report.cycles > 0).then(|| seconds * 1e6 / report.cycles as f64);
    if embedded {
        report.total_cpu_us_per_cycle = per_cycle(own_cpu);
    } else {
        report.client_cpu_us_per_cycle = per_cycle(own_cpu);
    }
    if let (Some(before), Some(after)) = (counters_before, counters_after) {
        let commits = after.commits - before.commits;
        report.commits_per_sec = Some(commits / elapsed);
        report.requests_per_commit =
            (commits > 0.0).then(|| (after.requests - before.requests) / commits);
        let syncs = after.syncs - before.syncs;
        report.fsyncs_per_commit = (commits > 0.0 && syncs > 0.0).then(|| syncs / commits);
        if !embedded {
            report.server_cpu_us_per_cycle = per_cycle(after.cpu_seconds - before.cpu_seconds);
        }
    }
    Ok(report)
}

/// `args.clients` clients, each on its own connection, cycling until the run's end; returns
/// their cycles, their errors and the run's length in seconds.
async fn run_clients(
    args: &AcquireBenchArgs,
    endpoints: &[String],
    credentials: &Credentials,
) -> anyhow::Result<(Vec<Cycle>, usize, f64)> {
    let started = Instant::now();
    let deadline = started + args.duration;
    let mut tasks = Vec::with_capacity(args.clients);
    for index in 0..args.clients {
        let client = Client::connect_with(endpoints, credentials.clone()).await?;
        tasks.push(tokio::spawn(client_loop(
            client, index, args.locks, deadline,
        )));
    }
    let mut cycles = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (mine, failed) = task.await?;
        cycles.extend(mine);
        errors += failed;
    }
    Ok((cycles, errors, started.elapsed().as_secs_f64()))
}

/// What a run measures: coordinators it started (in a temporary directory), or ones given.
struct Target {
    endpoints: Vec<String>,
    servers: Vec<palisade_server::RunningServer>,
    /// The temporary directory's fdatasync rate (embedded runs only).
    fsyncs_per_sec: Option<f64>,
    /// Lives until the servers have stopped.
    _data: Option<tempfile::TempDir>,
}

impl Target {
    fn remote(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            servers: Vec::new(),
            fsyncs_per_sec: None,
            _data: None,
        }
    }

    /// Coordinators of this run in a temporary directory: a cluster of `cluster.0` members
    /// (over mutual TLS with `cluster.1`) or a single node secured as `secured` (the clients'
    /// `credentials` follow), after measuring the directory's fdatasync rate.
    async fn embedded(
        cluster: Option<(usize, bool)>,
        secured: Secured,
        credentials: &mut Credentials,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
        let probe_path = dir.path().to_path_buf();
        let rate = tokio::task::spawn_blocking(move || measure_fdatasync(&probe_path))
            .await?
            .context("cannot measure the fdatasync rate")?;
        let (servers, endpoints) = match cluster {
            Some((count, peer_tls)) => {
                let (members, urls) = start_cluster(dir.path(), count, peer_tls).await?;
                // Wait (bounded by the client's failover budget) until a leader serves.
                let client = Client::connect(&urls).await?;
                client
                    .list()
                    .await
                    .context("the cluster elected no leader")?;
                (members, urls)
            }
            None => {
                let (server, url) = start_single(dir.path(), secured, credentials).await?;
                (vec![server], vec![url])
            }
        };
        Ok(Self {
            endpoints,
            servers,
            fsyncs_per_sec: Some(rate),
            _data: Some(dir),
        })
    }

    async fn stop(self) -> anyhow::Result<()> {
        for server in self.servers {
            server.shutdown().await?;
        }
        Ok(())
    }
}

/// A single node in `dir`, secured as `secured`; `credentials` become what its clients need.
async fn start_single(
    dir: &Path,
    secured: Secured,
    credentials: &mut Credentials,
) -> anyhow::Result<(palisade_server::RunningServer, String)> {
    let mut config = ServerConfig {
        data_dir: dir.join("data"),
        listen: "127.0.0.1:0".parse().expect("valid address"),
        cluster: None,
        ..Default::default()
    };
    if secured != Secured::Open {
        let (policy, bearer) = bench_auth(dir)?;
        config.auth = std::sync::Arc::new(policy);
        *credentials = bearer;
    }
    let mut scheme = "http";
    if secured == Secured::AuthTls {
        let pki = dir.join("pki");
        palisade_drill::certs::client_credentials(&pki, &[])?;
        config.client_tls = Some(std::sync::Arc::new(palisade_server::tls::ClientTls::load(
            &pki.join("server.pem"),
            &pki.join("server.key"),
            None,
        )?));
        *credentials = credentials
            .clone()
            .with_ca_pem(&std::fs::read(pki.join("server-ca.pem"))?);
        scheme = "https";
    }
    let server = palisade_server::start(config).await?;
    let url = format!("{scheme}://{}", server.local_addr);
    Ok((server, url))
}

async fn client_loop(
    client: Client,
    index: usize,
    locks: usize,
    deadline: Instant,
) -> (Vec<Cycle>, usize) {
    let lock = index % locks;
    let mut options = AcquireOptions::new(format!("bench/{lock}"));
    options.ttl = Duration::from_secs(10);
    options.wait = BENCH_WAIT;
    options.holder = format!("bench-{index}");
    options.class = Some(LockClass::Efficiency);
    let mut cycles = Vec::new();
    let mut errors = 0;
    while Instant::now() < deadline && cycles.len() < MAX_SAMPLES_PER_CLIENT {
        let acquire_sent = Instant::now();
        let grant = match client.acquire_once(&options).await {
            Ok(grant) => grant,
            Err(ClientError::Held(_)) => continue,
            Err(_) => {
                errors += 1;
                continue;
            }
        };
        let granted = Instant::now();
        let release_sent = Instant::now();
        if client.release(&grant.lease_id).await.is_err() {
            errors += 1;
            continue;
        }
        cycles.push(Cycle {
            lock,
            epoch: grant.epoch,
            acquire_sent,
            granted,
            release_sent,
            released: Instant::now(),
        });
    }
    (cycles, errors)
}

fn summarize(
    args: &AcquireBenchArgs,
    endpoints: &[String],
    mut cycles: Vec<Cycle>,
    errors: usize,
    elapsed: f64,
    fsyncs_per_sec: Option<f64>,
) -> Report {
    let mut latencies: Vec<u64> = cycles
        .iter()
        .map(|c| (c.released - c.acquire_sent).as_micros() as u64)
        .collect();
    latencies.sort_unstable();
    // A hand-off: consecutive epochs of one lock where the next holder asked before the
    // previous one released, so it was waiting and the release handed the lock over.
    cycles.sort_by_key(|c| (c.lock, c.epoch));
    let mut handoffs: Vec<u64> = cycles
        .windows(2)
        .filter(|w| w[0].lock == w[1].lock && w[1].acquire_sent < w[0].release_sent)
        .map(|w| {
            w[1].granted
                .saturating_duration_since(w[0].release_sent)
                .as_micros() as u64
        })
        .collect();
    handoffs.sort_unstable();
    let ops_per_sec = cycles.len() as f64 / elapsed;
    Report {
        clients: args.clients,
        locks: args.locks,
        duration_s: elapsed,
        cycles: cycles.len(),
        errors,
        ops_per_sec,
        p50_us: percentile(&latencies, 0.50).unwrap_or(0),
        p99_us: percentile(&latencies, 0.99).unwrap_or(0),
        handoffs: handoffs.len(),
        handoff_p50_us: percentile(&handoffs, 0.50),
        handoff_p99_us: percentile(&handoffs, 0.99),
        fsyncs_per_sec,
        ops_per_fsync: fsyncs_per_sec.map(|rate| ops_per_sec / rate),
        commits_per_sec: None,
        requests_per_commit: None,
        fsyncs_per_commit: None,
        server_cpu_us_per_cycle: None,
        client_cpu_us_per_cycle: None,
        total_cpu_us_per_cycle: None,
        endpoint: if args.endpoint.is_some() {
            endpoints.join(",")
        } else if endpoints.len() > 1 {
            format!("embedded cluster of {}", endpoints.len())
        } else {
            "embedded".into()
        },
    }
}

fn percentile(sorted: &[u64], quantile: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * quantile).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn print_report(report: &Report, json: bool) {
    if json {
        print_json(&serde_json::to_value(report).expect("the report serializes"));
        return;
    }
    let optional = |v: Option<u64>| v.map_or("-".into(), |v| format!("{v} µs"));
    print_fields(&[
        ("endpoint", report.endpoint.clone()),
        ("clients", report.clients.to_string()),
        ("locks", report.locks.to_string()),
        ("duration", format!("{:.1} s", report.duration_s)),
        ("cycles", report.cycles.to_string()),
        ("errors", report.errors.to_string()),
        ("cycles/s", format!("{:.0}", report.ops_per_sec)),
        ("cycle p50", format!("{} µs", report.p50_us)),
        ("cycle p99", format!("{} µs", report.p99_us)),
        ("hand-offs", report.handoffs.to_string()),
        ("hand-off p50", optional(report.handoff_p50_us)),
        ("hand-off p99", optional(report.handoff_p99_us)),
        (
            "fdatasync/s",
            report
                .fsyncs_per_sec
                .map_or("-".into(), |r| format!("{r:.0}")),
        ),
        (
            "cycles/fsync",
            report
                .ops_per_fsync
                .map_or("-".into(), |r| format!("{r:.2}")),
        ),
        (
            "commits/s",
            report
                .commits_per_sec
                .map_or("-".into(), |r| format!("{r:.0}")),
        ),
        (
            "requests/commit",
            report
                .requests_per_commit
                .map_or("-".into(), |r| format!("{r:.1}")),
        ),
        (
            "fsyncs/commit",
            report
                .fsyncs_per_commit
                .map_or("-".into(), |r| format!("{r:.2}")),
        ),
        ("server CPU/cycle", micros(report.server_cpu_us_per_cycle)),
        ("client CPU/cycle", micros(report.client_cpu_us_per_cycle)),
        ("total CPU/cycle", micros(report.total_cpu_us_per_cycle)),
    ]);
}

fn micros(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.0} µs"))
}
