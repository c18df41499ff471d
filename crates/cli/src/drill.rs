//! `palisade drill`, `palisade simulate`, and the hidden `palisade drill-worker`.

use std::collections::BTreeMap;

use anyhow::Context as _;
use clap::Args;
use palisade_drill::worker::{PausePoint, WorkerPlan};
use palisade_drill::{DrillConfig, ResourceSpec, Scenario};
use palisade_fence::FenceMode;
use palisade_sim::SimConfig;
use serde_json::{json, Value};

use crate::output::print_json;
use crate::output::print_table;

#[derive(Args)]
pub struct DrillArgs {
    /// A scenario (stale-process, delayed-delivery, duplicate-token, forged-token, bypass,
    /// coordinator-failover, restore, resource-restore, rollback, effects) or all. For
    /// coordinator-failover, iterations = leader kills; for the restores and rollback,
    /// iterations = restores (their orders alternate), always on the drill's own embedded
    /// store.
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
        progress: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let reports = palisade_drill::run(config, &scenarios).await?;
    let passed = reports.iter().all(|r| r.passed);
    if json {
        print_json(&json!({"scenarios": reports, "passed": passed}));
    } else {
        print_drill_table(&reports);
        for report in &reports {
            print_failover(report);
            print_effects(report);
            print_restore(report);
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

fn print_drill_table(reports: &[palisade_drill::ScenarioReport]) {
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
}

fn print_failover(report: &palisade_drill::ScenarioReport) {
    if let Some(f) = &report.failover {
        println!(
            "\n{}: {} leader kills survived, {} grants, unavailability after a kill \
             p50 {} ms, max {} ms",
            report.scenario, f.leader_kills, f.grants, f.unavailable_p50_ms, f.unavailable_max_ms
        );
    }
}

fn print_effects(report: &palisade_drill::ScenarioReport) {
    for f in report.effects.iter().flatten() {
        let faults = f
            .faults
            .iter()
            .map(|(kind, n)| format!("{kind}×{n}"))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "\neffects ({}, {}): {} operations; owners stopped {:?}, {} killed, {} \
             resumed ({} stale begins refused); receiver faults {faults}, {} restarts; \
             {} effects performed, {} deduplicated retries, {} late sends refused; \
             {} duplicates, {} review items ({} done, {} not done), {} lost, {} sends \
             unrecorded",
            f.ledger,
            f.capability,
            f.operations,
            f.owner_stops,
            f.owner_kills,
            f.owner_resumes,
            f.stale_begins_refused,
            f.receiver_restarts,
            f.effects_performed,
            f.replays,
            f.late_refused,
            f.duplicates,
            f.review_items,
            f.resolved_done,
            f.resolved_not_done,
            f.lost,
            f.unrecorded_sends
        );
    }
}

fn print_restore(report: &palisade_drill::ScenarioReport) {
    if let Some(f) = &report.restore {
        let orders = f
            .orders
            .iter()
            .map(|(order, n)| format!("{order}×{n}"))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "\n{}: {} restores ({orders}), {} grants after them, {} epochs reused, \
             obsolete writes {} tried / {} accepted, {} refused until the floor, \
             progress after {}; restore to the next write p50 {} ms",
            report.scenario,
            f.restores,
            f.grants_after_restore,
            f.epochs_reused,
            f.obsolete_attempted,
            f.obsolete_accepted,
            f.refused_until_floor,
            f.progressed,
            f.restore_to_write_p50_ms
        );
    }
}

#[derive(Args)]
pub struct EffectsWorkerArgs {
    #[arg(long)]
    coordinator: String,
    #[arg(long)]
    ledger: String,
    #[arg(long)]
    trust_key: std::path::PathBuf,
    #[arg(long)]
    receiver_url: String,
    #[arg(long)]
    capability: String,
    #[arg(long)]
    lock: String,
    #[arg(long)]
    ops: usize,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    attempt_timeout_ms: u64,
    #[arg(long)]
    send_timeout_ms: u64,
    #[arg(long, requires = "stop_op")]
    stop_at: Option<String>,
    #[arg(long, requires = "stop_at")]
    stop_op: Option<usize>,
}

pub async fn run_effects_worker(args: EffectsWorkerArgs) -> anyhow::Result<()> {
    let plan = palisade_drill::effects::WorkerPlan {
        coordinator: args.coordinator,
        ledger: args.ledger,
        trust_key: args.trust_key,
        receiver_url: args.receiver_url,
        capability: palisade_effects::Capability::parse(&args.capability)
            .map_err(|e| anyhow::anyhow!(e.0))?,
        lock: args.lock,
        ops: args.ops,
        ttl_ms: args.ttl_ms,
        attempt_timeout_ms: args.attempt_timeout_ms,
        send_timeout_ms: args.send_timeout_ms,
        stop: args.stop_at.zip(args.stop_op),
    };
    palisade_drill::effects::worker(plan).await
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
    /// With --cluster: half the crashes also wipe the member's data directory; the member is
    /// then removed, restarted with --join and added back (the documented procedure).
    #[arg(long, requires = "cluster")]
    wipe: bool,
    /// With --cluster: crashes alternate between copying the member's disk and, half of the
    /// later times, putting the older copy back (`cp -a`); its witness must refuse it.
    #[arg(long, requires = "cluster")]
    copy_back: bool,
    /// With --cluster: like --copy-back, but the copy is the member's whole volume (disk and
    /// witness) and both go back together (a VM or disk snapshot restore): the member starts
    /// from its older state, and P1 and P8 must still hold.
    #[arg(long, requires = "cluster", conflicts_with = "copy_back")]
    rollback: bool,
    /// With --cluster: found the cluster with member 1 alone and add every other member with
    /// --join and `cluster add` (members that talk only to the leader until they vote).
    #[arg(long, requires = "cluster")]
    join: bool,
    /// With --cluster: a crash lands inside the member's next Raft log write, and the disk
    /// keeps a random subset of that write's 512-byte sectors (seeded).
    #[arg(long, requires = "cluster")]
    torn_sectors: bool,
    /// With --cluster: whole-volume copies (disk and witness) of running members taken at any
    /// instant — before a member's first vote, between a --join and its first append, later —
    /// each put back at a later crash of its member half of the time.
    #[arg(long, requires = "cluster")]
    copy_anytime: bool,
    /// With --cluster: half the network faults are clock faults instead — members' clocks
    /// jump ahead and back, within and beyond the maximum offset, drift, or a majority's jump
    /// ahead together — and P1 must hold, the cluster keep granting.
    #[arg(long, requires = "cluster")]
    clock_faults: bool,
    /// With --cluster: every fault mode at once — whole volumes put back (--rollback, whose
    /// refused put-backs are wiped and re-added), --copy-anytime, --torn-sectors and
    /// --clock-faults — besides the crashes, partitions and cuts of every run.
    #[arg(long, requires = "cluster", conflicts_with_all = ["copy_back", "wipe"])]
    all_faults: bool,
    /// With --cluster: threads running seeds side by side (default: one per core). Every seed
    /// runs on one thread under its own simulated clock, so the results do not depend on it.
    #[arg(long, requires = "cluster")]
    threads: Option<usize>,
}

/// `done of total seeds, about N s left`, on one line of a terminal; nothing into a pipe or a
/// file (a log gets the summary only).
fn progress(done: u64, total: u64, started: std::time::Instant) {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) || done == 0 {
        return;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let left = elapsed / done as f64 * total.saturating_sub(done) as f64;
    eprint!("\r{done} of {total} seeds, about {left:.0} s left   ");
}

pub fn run_simulate(args: SimulateArgs, json: bool) -> anyhow::Result<()> {
    if let Some(members) = args.cluster {
        anyhow::ensure!(
            members == 3 || members == 5,
            "--cluster takes 3 or 5 (members of the simulated cluster), not {members}"
        );
        return run_cluster_simulate(&args, members, json);
    }
    let started = std::time::Instant::now();
    let (mut faults, mut stale, mut events) = (0u64, 0usize, 0u64);
    let (mut restores, mut resource_restores) = (0u64, 0u64);
    for (done, seed) in (args.from..args.from.saturating_add(args.seeds)).enumerate() {
        let report = palisade_sim::run(seed, SimConfig::default());
        faults += report.faults.total();
        restores += report.faults.restores;
        resource_restores += report.faults.resource_restores;
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
            progress(done as u64 + 1, args.seeds, started);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let per_minute = args.seeds as f64 / seconds * 60.0;
    if json {
        print_json(&json!({
            "seeds": args.seeds, "from": args.from, "passed": true, "faults": faults,
            "stale_refused": stale, "events": events, "seconds": seconds, "seeds_per_minute": per_minute,
            "restores": restores, "resource_restores": resource_restores,
        }));
    } else {
        eprintln!();
        println!(
            "{} seeds from {} passed: {faults} faults injected ({:.0}/seed; {restores} coordinator \
             and {resource_restores} resource restores), {stale} stale writes refused, \
             {per_minute:.0} seeds/minute",
            args.seeds,
            args.from,
            faults as f64 / args.seeds.max(1) as f64
        );
    }
    Ok(())
}

/// What one seed of the cluster simulation left: its figures, or what it violated.
struct SeedOutcome {
    seed: u64,
    trace: Vec<String>,
    problems: Option<String>,
    faults: u64,
    grants: usize,
    leaders: u64,
    malformed_refused: u64,
    recovery_ms: Option<u64>,
    failovers_ms: Vec<u64>,
    /// Members put back to an older copy, and of those refused by their witness.
    copy_backs: (u64, u64),
    /// Every kind of fault the run injected (`ClusterFaults`'s fields), by name.
    faults_by_kind: BTreeMap<String, u64>,
    /// The longest time a connected majority granted nothing, ms.
    longest_stall_ms: u64,
}

/// Runs one seed on this thread (the simulation runs its own single-threaded runtime), without
/// the server's logs (openraft reports every election).
fn cluster_seed(seed: u64, config: palisade_cluster_sim::ClusterSimConfig) -> SeedOutcome {
    let report =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            palisade_cluster_sim::run(seed, config)
        });
    SeedOutcome {
        seed,
        problems: report.outcome().err(),
        faults: report.faults.total(),
        grants: report.grants(),
        leaders: report.leader_starts,
        malformed_refused: report.messages.malformed,
        recovery_ms: report.recovery_ms,
        failovers_ms: report.failovers_ms.clone(),
        copy_backs: (report.faults.copy_backs, report.faults.copy_backs_refused),
        faults_by_kind: faults_by_kind(&report.faults),
        longest_stall_ms: report.longest_stall_ms,
        trace: report.trace,
    }
}

/// Each count of `faults` by its field's name (a nested group's as `group.field`): a fault
/// kind added to the simulation is reported without another line here.
fn faults_by_kind(faults: &palisade_cluster_sim::ClusterFaults) -> BTreeMap<String, u64> {
    fn flatten(prefix: &str, value: &Value, into: &mut BTreeMap<String, u64>) {
        match value {
            Value::Object(fields) => {
                for (name, field) in fields {
                    let name = if prefix.is_empty() {
                        name.clone()
                    } else {
                        format!("{prefix}.{name}")
                    };
                    flatten(&name, field, into);
                }
            }
            other => {
                if let Some(count) = other.as_u64() {
                    into.insert(prefix.to_owned(), count);
                }
            }
        }
    }
    let mut kinds = BTreeMap::new();
    let value = serde_json::to_value(faults).expect("fault counts serialize");
    flatten("", &value, &mut kinds);
    kinds
}

/// The fault counts of every seed added up, by kind, with how many seeds injected each.
fn sum_faults_by_kind(outcomes: &[SeedOutcome]) -> BTreeMap<String, (u64, u64)> {
    let mut sum: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for outcome in outcomes {
        for (kind, count) in &outcome.faults_by_kind {
            let (total, seeds) = sum.entry(kind.clone()).or_default();
            *total += count;
            *seeds += u64::from(*count > 0);
        }
    }
    sum
}

/// The longest time a connected majority granted nothing in any seed, and that seed.
fn longest_stall(outcomes: &[SeedOutcome]) -> (u64, u64) {
    outcomes
        .iter()
        .map(|o| (o.longest_stall_ms, o.seed))
        .max()
        .unwrap_or((0, 0))
}

/// The line after a cluster simulation's figures: each fault kind injected (in how many
/// seeds), and liveness.
fn print_faults_and_stall(by_kind: &BTreeMap<String, (u64, u64)>, longest_ms: u64, seed: u64) {
    let kinds: Vec<String> = by_kind
        .iter()
        .filter(|(_, (total, _))| *total > 0)
        .map(|(kind, (total, seeds))| format!("{kind} {total} ({seeds} seeds)"))
        .collect();
    println!(
        "faults by kind: {}; longest time a connected majority granted nothing: {longest_ms} ms \
         (seed {seed}; bound {} ms)",
        kinds.join(", "),
        palisade_cluster_sim::LIVENESS_BOUND_MS
    );
}

/// Runs every seed (on `--threads` threads, each taking the next seed), reports every failing
/// seed with what it violated, and fails if any did.
fn run_cluster_simulate(args: &SimulateArgs, members: usize, json: bool) -> anyhow::Result<()> {
    use palisade_cluster_sim::ClusterSimConfig;
    let all = args.all_faults;
    let config = ClusterSimConfig {
        wipe_on_crash: args.wipe || all,
        copy_back_on_crash: args.copy_back || args.rollback || all,
        rollback_volumes: args.rollback || all,
        join_members: args.join,
        torn_sectors: args.torn_sectors || all,
        copy_anytime: args.copy_anytime || all,
        clock_faults: args.clock_faults || all,
        ..ClusterSimConfig::for_members(members)
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 64);
    let (outcomes, seconds) = run_cluster_seeds(args, config, threads, json);
    summarize_cluster_seeds(args, members, threads, &outcomes, seconds, json)
}

/// Runs the seeds on `threads` threads, printing failures (and traces) as they come; the
/// outcomes in seed order and the seconds it took.
fn run_cluster_seeds(
    args: &SimulateArgs,
    config: palisade_cluster_sim::ClusterSimConfig,
    threads: usize,
    json: bool,
) -> (Vec<SeedOutcome>, f64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let end = args.from.saturating_add(args.seeds);
    let next = AtomicU64::new(args.from);
    let started = std::time::Instant::now();
    let (sender, receiver) = std::sync::mpsc::channel::<SeedOutcome>();
    let mut outcomes = Vec::new();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (sender, next) = (sender.clone(), &next);
            scope.spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end || sender.send(cluster_seed(seed, config)).is_err() {
                    break;
                }
            });
        }
        drop(sender);
        for outcome in receiver {
            if args.trace {
                for line in &outcome.trace {
                    eprintln!("seed {} {line}", outcome.seed);
                }
            }
            if let Some(problems) = &outcome.problems {
                eprintln!("\rseed {} failed:\n{problems}", outcome.seed);
            }
            outcomes.push(SeedOutcome {
                trace: Vec::new(),
                ..outcome
            });
            if !json && outcomes.len() % 10 == 0 {
                progress(outcomes.len() as u64, args.seeds, started);
            }
        }
    });
    outcomes.sort_by_key(|o| o.seed);
    (outcomes, started.elapsed().as_secs_f64())
}

/// The figures of a cluster simulation run, and an error naming the seeds that failed.
fn summarize_cluster_seeds(
    args: &SimulateArgs,
    members: usize,
    threads: usize,
    outcomes: &[SeedOutcome],
    seconds: f64,
    json: bool,
) -> anyhow::Result<()> {
    let failed: Vec<u64> = outcomes
        .iter()
        .filter(|o| o.problems.is_some())
        .map(|o| o.seed)
        .collect();
    let sum = |pick: fn(&SeedOutcome) -> u64| -> u64 { outcomes.iter().map(pick).sum() };
    let (faults, leaders) = (sum(|o| o.faults), sum(|o| o.leaders));
    let (grants, malformed) = (sum(|o| o.grants as u64), sum(|o| o.malformed_refused));
    let (copy_backs, copy_backs_refused) = (sum(|o| o.copy_backs.0), sum(|o| o.copy_backs.1));
    let mut recovery: Vec<u64> = outcomes.iter().filter_map(|o| o.recovery_ms).collect();
    let mut failovers: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.failovers_ms.iter().copied())
        .collect();
    let (p50, max) = median_and_max(&mut recovery);
    let (failover_p50, failover_max) = median_and_max(&mut failovers);
    let by_kind = sum_faults_by_kind(outcomes);
    let (longest_stall, stalled_seed) = longest_stall(outcomes);
    if json {
        print_json(&json!({
            "seeds": args.seeds, "from": args.from, "members": members, "wipe": args.wipe,
            "join": args.join, "copy_back": args.copy_back, "rollback": args.rollback,
            "copy_backs": copy_backs, "copy_backs_refused": copy_backs_refused,
            "passed": failed.is_empty(), "failed_seeds": failed,
            "faults": faults, "grants": grants, "leader_terms": leaders,
            "malformed_appends_refused": malformed,
            "recovery_p50_ms": p50, "recovery_max_ms": max, "leader_crashes": failovers.len(),
            "failover_p50_ms": failover_p50, "failover_max_ms": failover_max, "seconds": seconds,
            "faults_by_kind": by_kind.iter()
                .map(|(kind, (total, seeds))| (kind.clone(), json!({"total": total, "seeds": seeds})))
                .collect::<serde_json::Map<String, Value>>(),
            "longest_stall_ms": longest_stall,
            "longest_stall_seed": stalled_seed,
            "liveness_bound_ms": palisade_cluster_sim::LIVENESS_BOUND_MS,
        }));
    } else {
        eprintln!();
        println!(
            "{} seeds from {} on {members}-member clusters{}: {} passed, {} failed; {faults} \
             faults injected ({:.1}/seed), {grants} grants, {leaders} leader terms, {malformed} \
             malformed appends refused; simulated time from a leader's crash to another member \
             serving p50 {failover_p50} ms, max {failover_max} ms ({} crashes); first acquire \
             after the last heal p50 {p50} ms, max {max} ms; {copy_backs} members put back to an \
             older copy, {copy_backs_refused} refused; {seconds:.1} s on {threads} threads",
            args.seeds,
            args.from,
            mode_label(args),
            outcomes.len() - failed.len(),
            failed.len(),
            faults as f64 / args.seeds.max(1) as f64,
            failovers.len()
        );
        print_faults_and_stall(&by_kind, longest_stall, stalled_seed);
    }
    fail_on(&failed, outcomes.len())
}

/// An error naming the seeds that failed, if any did.
fn fail_on(failed: &[u64], seeds: usize) -> anyhow::Result<()> {
    if !failed.is_empty() {
        let list: Vec<String> = failed.iter().map(u64::to_string).collect();
        anyhow::bail!(
            "{} of {seeds} seeds violate a property of the replicated coordinator: {}",
            failed.len(),
            list.join(" ")
        );
    }
    Ok(())
}

/// How the members were treated, for the summary line.
fn mode_label(args: &SimulateArgs) -> &'static str {
    if args.all_faults {
        return if args.join {
            " with --join members and every fault mode"
        } else {
            " with every fault mode"
        };
    }
    match (args.wipe, args.join) {
        (true, true) => " with --join members and lost data directories",
        (true, false) => " with lost data directories",
        (false, true) => " with --join members",
        (false, false) => "",
    }
}

/// The median and the maximum (0 and 0 when empty).
fn median_and_max(values: &mut [u64]) -> (u64, u64) {
    values.sort_unstable();
    (
        values.get(values.len() / 2).copied().unwrap_or(0),
        values.last().copied().unwrap_or(0),
    )
}
