//! `palisade drill`: fault drills with real processes, checked by the history checker.
//!
//! A drill starts its own coordinator (a `palisade serve` process) in a temporary directory,
//! and either its own reference stores (`--resource embedded`: `palisade resource serve`
//! processes, one activated and one strict) or a table of its own in the user's PostgreSQL
//! (`--resource postgres://…`, dropped at the end). Workers are `palisade drill-worker`
//! processes. Every invocation and completion goes into a [`History`]; each iteration's history
//! is checked for P1, P2, P4 and P5, and the first violation is printed with its entries.
//!
//! Scenarios live in [`scenarios`]; `coordinator-failover` ([`failover`]), `restore` and
//! `resource-restore` ([`restore`]) run processes of their own (a cluster; a coordinator and a
//! store they restore) and always use the embedded store.

#![forbid(unsafe_code)]

pub mod certs;
pub mod clock;
pub mod effects;
mod env;
pub mod failover;
pub mod proxy;
pub mod restore;
pub mod scenarios;
pub mod target;
pub mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;

use palisade_history::{check, History, Mode};
use serde::Serialize;

pub use env::DrillEnv;

/// Where the drill's writes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceSpec {
    /// Reference stores started by the drill.
    Embedded,
    /// A user's PostgreSQL (the drill creates and drops its own table there).
    Postgres(String),
}

impl ResourceSpec {
    /// `embedded` or a `postgres://` URL.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        if text == "embedded" {
            Ok(ResourceSpec::Embedded)
        } else if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Ok(ResourceSpec::Postgres(text.to_owned()))
        } else {
            anyhow::bail!("--resource must be `embedded` or a postgres:// URL, not {text:?}")
        }
    }

    /// `embedded` or `postgres`.
    pub fn kind(&self) -> &'static str {
        match self {
            ResourceSpec::Embedded => "embedded",
            ResourceSpec::Postgres(_) => "postgres",
        }
    }
}

/// The drills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// A is SIGSTOPped (after acquiring, or between its lease check and its write) until its
    /// lease expired and B acquired, activated and committed; then SIGCONT: A must be refused.
    StaleProcess,
    /// A's write sits in a buffering proxy until B has committed, then is delivered.
    DelayedDelivery,
    /// Two processes present the same token; a captured token is replayed later.
    DuplicateToken,
    /// Altered epoch, enormous epoch, another lock's token, unknown key, garbage.
    ForgedToken,
    /// Writes that skip the guarded path.
    Bypass,
    /// The leader of a 3-node coordinator is killed (-9) during acquire churn, repeatedly.
    CoordinatorFailover,
    /// The coordinator restored from a backup, or its directory copied back.
    Restore,
    /// The reference store copied back (and the coordinator restored too, every other time).
    ResourceRestore,
    /// The coordinator's whole volume — data directory and the high-water file beside it —
    /// put back from a snapshot (a VM or disk snapshot restore), after a clean stop or a kill -9.
    Rollback,
    /// External effects through the effects ledger, for each receiver capability: owners
    /// stopped and killed between recording and sending and between sending and recording,
    /// newer owners taking over, a reconciler running throughout (P7).
    Effects,
}

impl Scenario {
    /// Every scenario built so far, in `drill all` order.
    pub const ALL: [Scenario; 10] = [
        Scenario::StaleProcess,
        Scenario::DelayedDelivery,
        Scenario::DuplicateToken,
        Scenario::ForgedToken,
        Scenario::Bypass,
        Scenario::CoordinatorFailover,
        Scenario::Restore,
        Scenario::ResourceRestore,
        Scenario::Rollback,
        Scenario::Effects,
    ];

    /// The scenario's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::StaleProcess => "stale-process",
            Scenario::DelayedDelivery => "delayed-delivery",
            Scenario::DuplicateToken => "duplicate-token",
            Scenario::ForgedToken => "forged-token",
            Scenario::Bypass => "bypass",
            Scenario::CoordinatorFailover => "coordinator-failover",
            Scenario::Restore => "restore",
            Scenario::ResourceRestore => "resource-restore",
            Scenario::Rollback => "rollback",
            Scenario::Effects => "effects",
        }
    }

    /// Parses a scenario name (or `all`).
    pub fn parse(text: &str) -> anyhow::Result<Vec<Self>> {
        if text == "all" {
            return Ok(Self::ALL.to_vec());
        }
        if let Some(found) = Self::ALL.into_iter().find(|s| s.name() == text) {
            return Ok(vec![found]);
        }
        anyhow::bail!(
            "unknown scenario {text:?}; use one of: all, {}",
            Self::ALL.map(Self::name).join(", ")
        )
    }

    /// The fence mode the scenario's resource runs in.
    pub fn mode(self) -> Mode {
        match self {
            Scenario::StaleProcess | Scenario::DelayedDelivery => Mode::Activated,
            _ => Mode::Strict,
        }
    }
}

/// How to run the drills.
#[derive(Debug, Clone)]
pub struct DrillConfig {
    /// The `palisade` binary (for the coordinator, the stores and the workers).
    pub binary: PathBuf,
    /// Where the writes go.
    pub resource: ResourceSpec,
    /// Iterations per scenario.
    pub iterations: usize,
    /// Lease TTL of the workers (short, so leases expire quickly).
    pub ttl_ms: u64,
    /// Keys each stale worker writes after it resumes (each a stale attempt).
    pub keys: usize,
    /// Print a progress line to stderr.
    pub progress: bool,
}

/// What one scenario did.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    /// The scenario.
    pub scenario: &'static str,
    /// `embedded` or `postgres`.
    pub resource: &'static str,
    /// Iterations run.
    pub iterations: usize,
    /// Writes attempted with an obsolete epoch or a bad token.
    pub stale_attempted: usize,
    /// Of those, accepted (must be 0).
    pub stale_accepted: usize,
    /// Writes accepted in all.
    pub accepted: usize,
    /// Bypass attempts (all must fail).
    pub bypass_attempted: usize,
    /// Pause points reached (stale-process).
    pub pause_points: BTreeMap<String, usize>,
    /// Every property held.
    pub passed: bool,
    /// The first violation, with the offending history entries.
    pub violation: Option<String>,
    /// coordinator-failover: leader kills, grants, unavailability after each kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<failover::FailoverFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<restore::RestoreFigures>,
    /// effects: per receiver capability.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effects: Option<Vec<effects::EffectsFigures>>,
}

impl ScenarioReport {
    fn new(scenario: Scenario, resource: &ResourceSpec) -> Self {
        Self {
            scenario: scenario.name(),
            resource: resource.kind(),
            iterations: 0,
            stale_attempted: 0,
            stale_accepted: 0,
            accepted: 0,
            bypass_attempted: 0,
            pause_points: BTreeMap::new(),
            passed: true,
            violation: None,
            failover: None,
            restore: None,
            effects: None,
        }
    }

    /// Checks one iteration's history and adds it to the report. Returns false on a violation.
    pub fn absorb(&mut self, history: &History, mode: Mode) -> bool {
        self.iterations += 1;
        match check(history, mode) {
            Ok(summary) => {
                self.stale_attempted += summary.stale_attempted;
                self.stale_accepted += summary.stale_accepted;
                self.accepted += summary.accepted;
                self.bypass_attempted += summary.bypass_attempted;
                true
            }
            Err(violation) => {
                self.passed = false;
                self.stale_accepted += 1;
                self.violation = Some(violation.excerpt(history));
                false
            }
        }
    }
}

/// Runs `scenarios` and reports each.
pub async fn run(
    config: DrillConfig,
    scenarios: &[Scenario],
) -> anyhow::Result<Vec<ScenarioReport>> {
    let env = DrillEnv::start(&config).await?;
    let mut reports = Vec::new();
    for &scenario in scenarios {
        let mut report = ScenarioReport::new(scenario, &config.resource);
        if !run_with_own_processes(&config, scenario, &mut report).await? {
            run_iterations(&env, &config, scenario, &mut report).await?;
        }
        reports.push(report);
    }
    env.stop().await;
    Ok(reports)
}

/// The scenarios that start processes of their own (a cluster, a ledger per capability, a
/// coordinator and store to restore): runs `scenario` if it is one of them into `report`, and
/// says whether it was.
async fn run_with_own_processes(
    config: &DrillConfig,
    scenario: Scenario,
    report: &mut ScenarioReport,
) -> anyhow::Result<bool> {
    let restore = match scenario {
        Scenario::Restore => Some(restore::Kind::Coordinator),
        Scenario::ResourceRestore => Some(restore::Kind::Resource),
        Scenario::Rollback => Some(restore::Kind::Rollback),
        _ => None,
    };
    let (binary, iterations, progress) = (&config.binary, config.iterations, config.progress);
    if scenario == Scenario::CoordinatorFailover {
        // Three coordinator members; iterations = leader kills.
        report.failover = Some(failover::run(binary, iterations, progress, report).await?);
    } else if scenario == Scenario::Effects {
        // A coordinator, ledger, receiver and reconciler per capability.
        let figures = effects::run(binary, &config.resource, iterations, progress).await?;
        report.iterations = iterations;
        report.stale_attempted = figures.iter().map(|f| f.stale_begins_tried).sum();
        report.stale_accepted = figures.iter().map(|f| f.stale_begins_accepted).sum();
        if let Some(failed) = figures.iter().find(|f| !f.passed) {
            report.passed = false;
            report.violation = failed.violation.clone();
        }
        report.effects = Some(figures);
    } else if let Some(kind) = restore {
        // A coordinator and reference store (restored, copied back).
        report.resource = "embedded";
        report.restore = Some(restore::run(binary, kind, iterations, progress, report).await?);
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// `config.iterations` of `scenario` on the shared environment, up to the first violation
/// (the one worth reading).
async fn run_iterations(
    env: &DrillEnv,
    config: &DrillConfig,
    scenario: Scenario,
    report: &mut ScenarioReport,
) -> anyhow::Result<()> {
    for iteration in 0..config.iterations {
        if config.progress {
            eprint!(
                "\r{}: iteration {}/{}   ",
                scenario.name(),
                iteration + 1,
                config.iterations
            );
        }
        if !scenarios::run_iteration(env, scenario, iteration, report).await? {
            break;
        }
    }
    if config.progress {
        eprintln!();
    }
    Ok(())
}
