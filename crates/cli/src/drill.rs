//! `palisade drill`, `palisade simulate`, and the hidden `palisade drill-worker`.

use anyhow::Context as _;
use clap::Args;
use palisade_drill::worker::{PausePoint, WorkerPlan};
use palisade_drill::{DrillConfig, ResourceSpec, Scenario};
use palisade_fence::FenceMode;
use palisade_sim::SimConfig;
use serde_json::json;

use crate::lock::print_json;
use crate::output::print_table;

#[derive(Args)]
pub struct DrillArgs {
    /// A scenario (stale-process, delayed-delivery, duplicate-token, forged-token, bypass,
    /// coordinator-failover) or all. For coordinator-failover, iterations = leader kills.
    scenario: String,
    /// `embedded` (stores started by the drill) or a postgres:// URL (the drill creates and
    /// drops its own table there).
    #[arg(long, default_value = "embedded")]
    resource: String,
    /// Iterations per scenario.
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    /// Lease TTL of the drill's workers, in milliseconds.
    #[arg(long, default_value_t = 200)]
    ttl_ms: u64,
    /// Keys each stale worker writes after it resumes (each one a stale attempt).
    #[arg(long, default_value_t = 5)]
    keys: usize,
}

pub async fn run_drill(args: DrillArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(args.iterations >= 1, "--iterations must be at least 1");
    anyhow::ensure!((1..=100).contains(&args.keys), "--keys must be 1 to 100");
    let scenarios = Scenario::parse(&args.scenario)?;
    let config = DrillConfig {
        binary: std::env::current_exe().context("find the palisade binary")?,
        resource: ResourceSpec::parse(&args.resource)?,
        iterations: args.iterations,
        ttl_ms: args.ttl_ms.max(palisade_core::limits::MIN_TTL_MS),
        keys: args.keys,
        progress: !json,
    };
    let reports = palisade_drill::run(config, &scenarios).await?;
    let passed = reports.iter().all(|r| r.passed);
    if json {
        print_json(&json!({"scenarios": reports, "passed": passed}));
    } else {
        let rows: Vec<Vec<String>> = reports
            .iter()
            .map(|r| {
                let points = r
                    .pause_points
                    .iter()
                    .map(|(p, n)| format!("{p}×{n}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                vec![
                    r.scenario.to_string(),
                    r.resource.to_string(),
                    r.iterations.to_string(),
                    r.stale_attempted.to_string(),
                    r.stale_accepted.to_string(),
                    r.bypass_attempted.to_string(),
                    points,
                    if r.passed {
                        "PASS".into()
                    } else {
                        "FAIL".into()
                    },
                ]
            })
            .collect();
        print_table(
            &[
                "SCENARIO",
                "RESOURCE",
                "ITER",
                "STALE TRIED",
                "STALE ACCEPTED",
                "BYPASS TRIED",
                "PAUSE POINTS",
                "VERDICT",
            ],
            &rows,
        );
        for report in &reports {
            if let Some(f) = &report.failover {
                println!(
                    "\n{}: {} leader kills survived, {} grants, unavailability after a kill \
                     p50 {} ms, max {} ms",
                    report.scenario,
                    f.leader_kills,
                    f.grants,
                    f.unavailable_p50_ms,
                    f.unavailable_max_ms
                );
            }
        }
        for report in reports.iter().filter(|r| !r.passed) {
            eprintln!(
                "\n{} failed:\n{}",
                report.scenario,
                report.violation.as_deref().unwrap_or("")
            );
        }
    }
    anyhow::ensure!(passed, "a drill found a violation");
    Ok(())
}

#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long)]
    coordinator: String,
    #[arg(long)]
    target: String,
    #[arg(long)]
    mode: String,
    #[arg(long)]
    run: String,
    #[arg(long)]
    lock: String,
    #[arg(long, value_delimiter = ',')]
    keys: Vec<String>,
    #[arg(long)]
    value: String,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    token: Option<String>,
    #[arg(long)]
    activate: bool,
    #[arg(long, default_value = "none")]
    pause: String,
    #[arg(long)]
    hold_before_write: bool,
}

pub async fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    let plan = WorkerPlan {
        coordinator: args.coordinator,
        target: args.target,
        mode: FenceMode::parse(&args.mode).context("unknown mode")?,
        run: args.run,
        lock: args.lock,
        keys: args.keys,
        value: args.value,
        ttl_ms: args.ttl_ms,
        token: args.token,
        activate: args.activate,
        pause: PausePoint::parse(&args.pause).context("unknown pause point")?,
        hold_before_write: args.hold_before_write,
    };
    palisade_drill::worker::run(plan).await
}

#[derive(Args)]
pub struct SimulateArgs {
    /// Seeds to run.
    #[arg(long, default_value_t = 1_000)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Simulate the replicated coordinator with this many members (3 or 5) instead: the real
    /// cluster code under crash-restarts, partitions and lost messages, checked for P1 and P8.
    #[arg(long, value_name = "MEMBERS")]
    cluster: Option<usize>,
    /// With --cluster: print the trace (faults, starts, crashes, client outcomes) of each seed.
    #[arg(long, requires = "cluster")]
    trace: bool,
}

pub fn run_simulate(args: SimulateArgs, json: bool) -> anyhow::Result<()> {
    if let Some(members) = args.cluster {
        anyhow::ensure!(
            members == 3 || members == 5,
            "--cluster takes 3 or 5 (members of the simulated cluster), not {members}"
        );
        // The simulation runs its own single-threaded runtime: give it a thread of its own,
        // without the server's logs (openraft reports every election).
        return std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    tracing::subscriber::with_default(
                        tracing::subscriber::NoSubscriber::default(),
                        || run_cluster_simulate(&args, members, json),
                    )
                })
                .join()
                .map_err(|_| anyhow::anyhow!("the simulation thread panicked"))?
        });
    }
    let started = std::time::Instant::now();
    let (mut faults, mut stale, mut events) = (0u64, 0usize, 0u64);
    for (done, seed) in (args.from..args.from.saturating_add(args.seeds)).enumerate() {
        let report = palisade_sim::run(seed, SimConfig::default());
        faults += report.faults.total();
        events += report.events;
        match &report.verdict {
            Ok(summary) => stale += summary.stale_attempted,
            Err(violation) => {
                eprintln!(
                    "seed {seed} failed:\n{}",
                    violation.excerpt(&report.history)
                );
                anyhow::bail!("seed {seed} violates {}", violation.property);
            }
        }
        if !json && done % 1_000 == 999 {
            eprint!("\r{} seeds…", done + 1);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let per_minute = args.seeds as f64 / seconds * 60.0;
    if json {
        print_json(&json!({
            "seeds": args.seeds, "from": args.from, "passed": true, "faults": faults,
            "stale_refused": stale, "events": events, "seconds": seconds, "seeds_per_minute": per_minute,
        }));
    } else {
        eprintln!();
        println!(
            "{} seeds from {} passed: {faults} faults injected ({:.0}/seed), {stale} stale writes \
             refused, {per_minute:.0} seeds/minute",
            args.seeds,
            args.from,
            faults as f64 / args.seeds.max(1) as f64
        );
    }
    Ok(())
}

fn run_cluster_simulate(args: &SimulateArgs, members: usize, json: bool) -> anyhow::Result<()> {
    use palisade_cluster_sim::ClusterSimConfig;
    let config = ClusterSimConfig::for_members(members);
    let started = std::time::Instant::now();
    let (mut faults, mut grants, mut leaders) = (0u64, 0usize, 0u64);
    let (mut recovery, mut failovers) = (Vec::new(), Vec::new());
    for (done, seed) in (args.from..args.from.saturating_add(args.seeds)).enumerate() {
        let report = palisade_cluster_sim::run(seed, config);
        if args.trace {
            for line in &report.trace {
                eprintln!("seed {seed} {line}");
            }
        }
        if let Err(problems) = report.outcome() {
            eprintln!("seed {seed} failed:\n{problems}");
            anyhow::bail!("seed {seed} violates a property of the replicated coordinator");
        }
        faults += report.faults.total();
        grants += report.grants();
        leaders += report.leader_starts;
        recovery.extend(report.recovery_ms);
        failovers.extend(report.failovers_ms.iter().copied());
        if !json && done % 10 == 9 {
            eprint!("\r{} seeds…", done + 1);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let (p50, max) = median_and_max(&mut recovery);
    let (failover_p50, failover_max) = median_and_max(&mut failovers);
    if json {
        print_json(&json!({
            "seeds": args.seeds, "from": args.from, "members": members, "passed": true,
            "faults": faults, "grants": grants, "leader_terms": leaders,
            "recovery_p50_ms": p50, "recovery_max_ms": max, "leader_crashes": failovers.len(),
            "failover_p50_ms": failover_p50, "failover_max_ms": failover_max, "seconds": seconds,
        }));
    } else {
        eprintln!();
        println!(
            "{} seeds from {} passed on {members}-member clusters: {faults} faults injected \
             ({:.1}/seed), {grants} grants, {leaders} leader terms; simulated time from a \
             leader's crash to another member serving p50 {failover_p50} ms, max \
             {failover_max} ms ({} crashes); first acquire after the last heal p50 {p50} ms, \
             max {max} ms; {seconds:.1} s",
            args.seeds,
            args.from,
            faults as f64 / args.seeds.max(1) as f64,
            failovers.len()
        );
    }
    Ok(())
}

/// The median and the maximum (0 and 0 when empty).
fn median_and_max(values: &mut [u64]) -> (u64, u64) {
    values.sort_unstable();
    (
        values.get(values.len() / 2).copied().unwrap_or(0),
        values.last().copied().unwrap_or(0),
    )
}
