//! `effects`: the effects ledger (P7) with real processes — a coordinator, a ledger (the
//! embedded one a reference store hosts, or PostgreSQL), a fake receiver with faults
//! (`palisade receiver serve`, restarted when it crashes), a reconciler running throughout
//! (`palisade effects reconcile --every 1`), and worker processes (`palisade effects-worker`).
//!
//! For each receiver capability (idempotent, lookup, none), each iteration has a lock of its
//! own and [`OPS`] operations under it:
//! 1. owner A acquires and performs them; on one operation it stops itself (SIGSTOP) at one
//!    step — after the attempt is recorded and its deadline checked, right before the send
//!    (`recorded`), or after the receiver answered, before the answer is recorded
//!    (`answered`);
//! 2. A is then killed (-9), or left stopped until B has finished;
//! 3. owner B acquires once A's lease expired and performs the same operations;
//! 4. a stopped A is resumed (SIGCONT): its pending send goes out late, and every operation it
//!    had not begun must be refused by the ledger (stale epoch);
//! 5. at the end, final owners run every lock again and a "person" resolves review items from
//!    the receiver's own record, until every operation is final.
//!
//! Checked from the receiver's durable record: duplicate effects (0 for every capability:
//! `none` is never retried automatically), lost operations (0: final and performed), and
//! sends the ledger had not recorded first (0).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use palisade_effects::{
    AnyLedger, Capability, Ledger as _, ListFilter, OpId, OpState, Record, Verdict,
};
use palisade_fake_receiver::Event;
use serde::Serialize;
use serde_json::Value;

use crate::env::{Service, WorkerProcess};
use crate::ResourceSpec;

/// Operations per iteration (per lock).
pub const OPS: usize = 4;
/// Lease TTL of the drill's owners.
const TTL_MS: u64 = 300;
/// An attempt must be sent within this of being recorded.
const ATTEMPT_TIMEOUT_MS: u64 = 800;
/// A worker's wait for one receiver answer (the receiver's timeout faults hang longer).
const SEND_TIMEOUT_MS: u64 = 500;
/// How long the receiver's timeout faults hang.
const HANG_MS: u64 = 900;
/// The ledger admin secret of the drill's store.
const ADMIN_SECRET: &str = "drill-effects-admin-secret-0123";

/// Figures of one capability's drill.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EffectsFigures {
    /// `embedded` or `postgres`.
    pub ledger: &'static str,
    /// The receiver's capability.
    pub capability: &'static str,
    /// Iterations (locks).
    pub iterations: usize,
    /// Operations in all.
    pub operations: usize,
    /// Owners stopped (SIGSTOP) at a step, by step.
    pub owner_stops: BTreeMap<String, usize>,
    /// Of those, killed (-9) while stopped.
    pub owner_kills: usize,
    /// Of those, resumed after the newer owner finished.
    pub owner_resumes: usize,
    /// Operations a resumed (superseded) owner tried to begin after a newer owner's attempts.
    pub stale_begins_tried: usize,
    /// Of those, refused by the ledger before anything was sent.
    pub stale_begins_refused: usize,
    /// Of those, begun anyway (must be 0).
    pub stale_begins_accepted: usize,
    /// Faults the receiver injected, by kind, and its restarts after crashes.
    pub faults: BTreeMap<String, usize>,
    /// Receiver restarts (after its crash fault).
    pub receiver_restarts: usize,
    /// Effects the receiver performed.
    pub effects_performed: usize,
    /// Retries the receiver deduplicated (idempotent).
    pub replays: usize,
    /// Late sends the receiver refused for their passed deadline (lookup).
    pub late_refused: usize,
    /// Operations the receiver performed more than once, counted once per extra effect.
    pub duplicates: usize,
    /// Operations that reached review, and of those resolved by the drill's "person".
    pub review_items: usize,
    /// Review items resolved `done` (the receiver had performed them).
    pub resolved_done: usize,
    /// Review items resolved `not-done` and then sent by a later owner.
    pub resolved_not_done: usize,
    /// Operations not final-and-performed at the end (must be 0).
    pub lost: usize,
    /// Sends the receiver saw whose attempt the ledger had not recorded (must be 0).
    pub unrecorded_sends: usize,
    /// Every check held.
    pub passed: bool,
    /// What failed.
    pub violation: Option<String>,
}

/// A receiver process restarted whenever it exits, until dropped.
struct Supervised {
    stop: Arc<AtomicBool>,
    child: Arc<Mutex<Option<Child>>>,
    restarts: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Supervised {
    fn start(binary: &Path, args: Vec<String>) -> anyhow::Result<Self> {
        let spawn = {
            let binary = binary.to_owned();
            move || {
                Command::new(&binary)
                    .args(&args)
                    .env("RUST_LOG", "error")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
            }
        };
        let child = Arc::new(Mutex::new(Some(spawn().context("start the receiver")?)));
        let stop = Arc::new(AtomicBool::new(false));
        let restarts = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (child, stop, restarts) = (child.clone(), stop.clone(), restarts.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                    let mut slot = child.lock().expect("not poisoned");
                    let exited = match slot.as_mut() {
                        Some(c) => matches!(c.try_wait(), Ok(Some(_))),
                        None => true,
                    };
                    if exited && !stop.load(Ordering::SeqCst) {
                        *slot = spawn().ok();
                        restarts.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        Ok(Self {
            stop,
            child,
            restarts,
            thread: Some(thread),
        })
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(mut child) = self.child.lock().expect("not poisoned").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A child process killed and reaped when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Where a worker stops itself.
#[derive(Debug, Clone, Copy)]
enum StopAt {
    Recorded,
    Answered,
}

impl StopAt {
    fn name(self) -> &'static str {
        match self {
            StopAt::Recorded => "recorded",
            StopAt::Answered => "answered",
        }
    }
}

struct Setup<'a> {
    binary: &'a Path,
    coordinator: String,
    ledger_url: String,
    keys_file: PathBuf,
    receiver_url: String,
    capability: Capability,
}

impl Setup<'_> {
    fn worker(&self, lock: &str, stop: Option<(StopAt, usize)>) -> anyhow::Result<WorkerProcess> {
        let mut command = tokio::process::Command::new(self.binary);
        command
            .arg("effects-worker")
            .args(["--coordinator", &self.coordinator])
            .args(["--ledger", &self.ledger_url])
            .args(["--trust-key", &self.keys_file.display().to_string()])
            .args(["--receiver-url", &self.receiver_url])
            .args(["--capability", self.capability.as_str()])
            .args(["--lock", lock, "--ops", &OPS.to_string()])
            .args(["--ttl-ms", &TTL_MS.to_string()])
            .args(["--attempt-timeout-ms", &ATTEMPT_TIMEOUT_MS.to_string()])
            .args(["--send-timeout-ms", &SEND_TIMEOUT_MS.to_string()])
            .env("RUST_LOG", "error")
            .stderr(Stdio::inherit());
        if let Some((step, op)) = stop {
            command.args(["--stop-at", step.name(), "--stop-op", &op.to_string()]);
        }
        WorkerProcess::spawn(command)
    }
}

/// Runs the drill for every capability on `ledger`.
pub async fn run(
    binary: &Path,
    ledger: &ResourceSpec,
    iterations: usize,
    progress: bool,
) -> anyhow::Result<Vec<EffectsFigures>> {
    let mut all = Vec::new();
    for capability in [Capability::Idempotent, Capability::Lookup, Capability::None] {
        all.push(run_capability(binary, ledger, capability, iterations, progress).await?);
    }
    Ok(all)
}

async fn run_capability(
    binary: &Path,
    ledger: &ResourceSpec,
    capability: Capability,
    iterations: usize,
    progress: bool,
) -> anyhow::Result<EffectsFigures> {
    let dir = tempfile::tempdir()?;
    let run = format!(
        "{}-{}",
        std::process::id(),
        crate::clock::now_ns() % 1_000_000_007
    );
    let (services, ledger_url, keys_file, secret_file) =
        start_ledger(binary, ledger, dir.path()).await?;
    let coordinator_url = format!("http://{}", services[0].address);
    let port = free_port()?;
    let receiver_url = format!("http://127.0.0.1:{port}");
    let receiver_dir = dir.path().join("receiver");
    let receiver = start_receiver(binary, capability, &receiver_dir, port)?;
    wait_healthy(&receiver_url).await?;
    let _reconciler =
        start_reconciler(binary, &ledger_url, &secret_file, &receiver_url, capability)?;
    let setup = Setup {
        binary,
        coordinator: coordinator_url,
        ledger_url: ledger_url.clone(),
        keys_file,
        receiver_url: receiver_url.clone(),
        capability,
    };
    let mut figures = EffectsFigures {
        ledger: ledger.kind(),
        capability: capability.as_str(),
        iterations,
        operations: iterations * OPS,
        ..EffectsFigures::default()
    };
    let locks = run_iterations(&setup, &run, progress, &mut figures).await?;
    let admin = AnyLedger::connect(
        &ledger_url,
        Arc::new(palisade_fence::Verifier::default()),
        None,
        Some(ADMIN_SECRET.into()),
    )
    .await?;
    settle_everything(&setup, &admin, &locks, &receiver_url, &mut figures).await?;
    figures.receiver_restarts = receiver.restarts.load(Ordering::SeqCst);
    drop(receiver);
    let events = palisade_fake_receiver::read_record(&receiver_dir)?;
    judge(&admin, &locks, &events, &mut figures).await?;
    drop(services);
    if let ResourceSpec::Postgres(url) = ledger {
        forget_drill_operations(url, &run).await?;
    }
    Ok(figures)
}

/// A coordinator, and (for the embedded ledger) the reference store that hosts the ledger,
/// in `dir`: the services (the coordinator first), the ledger's URL, the coordinator's keys
/// in a file, and the admin secret's file.
async fn start_ledger(
    binary: &Path,
    ledger: &ResourceSpec,
    dir: &Path,
) -> anyhow::Result<(Vec<Service>, String, std::path::PathBuf, std::path::PathBuf)> {
    let path = |name: &str| dir.join(name).display().to_string();
    let coordinator = Service::start(
        binary,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &path("coordinator"),
        ],
    )?;
    let coordinator_url = format!("http://{}", coordinator.address);
    let keys = reqwest::get(format!("{coordinator_url}/v1/keys"))
        .await?
        .text()
        .await?;
    let keys_file = dir.join("keys.json");
    std::fs::write(&keys_file, keys)?;
    let secret_file = dir.join("admin-secret");
    std::fs::write(&secret_file, ADMIN_SECRET)?;
    let mut services = vec![coordinator];
    let ledger_url = match ledger {
        ResourceSpec::Embedded => {
            let store = start_store(binary, &coordinator_url, &path("store"), &secret_file)?;
            let url = format!("http://{}", store.address);
            services.push(store);
            url
        }
        ResourceSpec::Postgres(url) => url.clone(),
    };
    Ok((services, ledger_url, keys_file, secret_file))
}

/// The reference store hosting the embedded ledger, with the drill's admin secret.
fn start_store(
    binary: &Path,
    coordinator_url: &str,
    data_dir: &str,
    secret_file: &Path,
) -> anyhow::Result<Service> {
    Service::start(
        binary,
        &[
            "resource",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--coordinator",
            coordinator_url,
            "--data-dir",
            data_dir,
            "--effects-admin-secret-file",
            &secret_file.display().to_string(),
        ],
    )
}

/// The fake receiver with its faults (lost answers, timeouts, crashes, hangs; duplicate
/// deliveries only where the receiver deduplicates), restarted when it crashes.
fn start_receiver(
    binary: &Path,
    capability: Capability,
    receiver_dir: &Path,
    port: u16,
) -> anyhow::Result<Supervised> {
    let duplicate = if capability == Capability::Idempotent {
        "0.1"
    } else {
        // A network that delivers twice makes duplicates no sender can prevent without a
        // deduplicating receiver: injected only where the receiver deduplicates.
        "0"
    };
    Supervised::start(
        binary,
        [
            "receiver",
            "serve",
            "--capability",
            capability.as_str(),
            "--data-dir",
            &receiver_dir.display().to_string(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--lose-answer",
            "0.1",
            "--timeout-before",
            "0.05",
            "--timeout-after",
            "0.05",
            "--crash",
            "0.03",
            "--duplicate",
            duplicate,
            "--hang-ms",
            &HANG_MS.to_string(),
            "--seed",
            &(crate::clock::now_ns() % 1_000_003).to_string(),
        ]
        .map(str::to_owned)
        .to_vec(),
    )
}

/// A reconciler every second, as an operator would run it.
fn start_reconciler(
    binary: &Path,
    ledger_url: &str,
    secret_file: &Path,
    receiver_url: &str,
    capability: Capability,
) -> anyhow::Result<Reaped> {
    Ok(Reaped(
        Command::new(binary)
            .args(["effects", "reconcile", "--every", "1"])
            .args(["--ledger", ledger_url])
            .args(["--admin-secret-file", &secret_file.display().to_string()])
            .args(["--receiver", "drill", "--receiver-url", receiver_url])
            .args(["--capability", capability.as_str()])
            .args(["--attempt-timeout-ms", &ATTEMPT_TIMEOUT_MS.to_string()])
            .args(["--send-timeout-ms", &SEND_TIMEOUT_MS.to_string()])
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start the reconciler")?,
    ))
}

/// The iterations: an owner stopped or killed at alternating steps, each on a lock of its
/// own; the locks.
async fn run_iterations(
    setup: &Setup<'_>,
    run: &str,
    progress: bool,
    figures: &mut EffectsFigures,
) -> anyhow::Result<Vec<String>> {
    let (ledger, capability, iterations) = (figures.ledger, setup.capability, figures.iterations);
    let mut locks = Vec::new();
    for iteration in 0..iterations {
        if progress {
            eprint!(
                "\reffects ({}, {}): iteration {}/{}   ",
                ledger,
                capability,
                iteration + 1,
                iterations
            );
        }
        let lock = format!("drill-effects/{run}/{}/{iteration}", capability.as_str());
        let (step, kill) = match iteration % 4 {
            0 => (StopAt::Recorded, false),
            1 => (StopAt::Answered, true),
            2 => (StopAt::Answered, false),
            _ => (StopAt::Recorded, true),
        };
        iterate(setup, &lock, step, kill, iteration % OPS, figures).await?;
        locks.push(lock);
    }
    if progress {
        eprintln!();
    }
    Ok(locks)
}

/// Deletes the drill's operations and ledger fences from the user's database: they are the
/// drill's own, under locks named for this run, and `palisade effects stats` would count them.
async fn forget_drill_operations(url: &str, run: &str) -> anyhow::Result<()> {
    let pool = palisade_fence_postgres::durable_pool(url, 1).map_err(anyhow::Error::msg)?;
    let client = pool.get().await?;
    let pattern = format!("drill-effects/{run}/%");
    for table in ["palisade_effect_ops", "palisade_effect_fences"] {
        let sql = format!("DELETE FROM {table} WHERE lock LIKE $1");
        client.execute(&sql, &[&pattern]).await?;
    }
    Ok(())
}

async fn wait_healthy(url: &str) -> anyhow::Result<()> {
    for _ in 0..500 {
        if let Ok(response) = reqwest::get(format!("{url}/healthz")).await {
            if response.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("the receiver at {url} did not start")
}

/// Reads a worker's events until `done`: each operation's outcome, by operation index.
async fn outcomes(worker: &mut WorkerProcess) -> anyhow::Result<BTreeMap<usize, String>> {
    let mut outcomes = BTreeMap::new();
    for event in worker.until("done").await? {
        if event["event"] == "op" {
            let op = event["op"].as_u64().unwrap_or(u64::MAX) as usize;
            let outcome = event["outcome"].as_str().unwrap_or("?").to_owned();
            outcomes.insert(op, outcome);
        }
    }
    Ok(outcomes)
}

async fn iterate(
    setup: &Setup<'_>,
    lock: &str,
    step: StopAt,
    kill: bool,
    stop_op: usize,
    figures: &mut EffectsFigures,
) -> anyhow::Result<()> {
    let mut a = setup.worker(lock, Some((step, stop_op)))?;
    let events = a.until("stopping").await?;
    anyhow::ensure!(
        events.iter().any(|e| e["event"] == "granted"),
        "owner A was not granted the lock: {events:?}"
    );
    a.wait_stopped().await?;
    *figures.owner_stops.entry(step.name().into()).or_default() += 1;
    if kill {
        a.kill9().await?;
        figures.owner_kills += 1;
    }
    // B acquires once A's lease expired (it waits for it) and performs every operation.
    let mut b = setup.worker(lock, None)?;
    outcomes(&mut b).await?;
    b.wait_exit().await?;
    if !kill {
        a.resume()?;
        figures.owner_resumes += 1;
        // Every operation after the one it stopped on, A never began: B's attempts raised the
        // lock's ledger fence, so each begin must be refused before anything is sent.
        for (op, outcome) in outcomes(&mut a).await?.range(stop_op + 1..) {
            figures.stale_begins_tried += 1;
            if outcome == "stale" {
                figures.stale_begins_refused += 1;
            } else {
                figures.stale_begins_accepted += 1;
                figures.violation.get_or_insert_with(|| {
                    format!("{lock}:op-{op}: a superseded owner's attempt was {outcome}")
                });
            }
        }
        a.wait_exit().await?;
    }
    Ok(())
}

fn op_id(lock: &str, n: usize) -> OpId {
    OpId::parse(&format!("{lock}:op-{n}")).expect("valid")
}

/// Final owners and a "person" until every operation is final (bounded).
async fn settle_everything(
    setup: &Setup<'_>,
    ledger: &AnyLedger,
    locks: &[String],
    receiver_url: &str,
    figures: &mut EffectsFigures,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut reviewed = std::collections::HashSet::new();
    while Instant::now() < deadline {
        let mut open = Vec::new();
        for lock in locks {
            for n in 0..OPS {
                let id = op_id(lock, n);
                let state = ledger.get(&id).await?.map(|r| r.state);
                if !state.is_some_and(OpState::is_final) {
                    open.push((lock.clone(), id, state));
                }
            }
        }
        if open.is_empty() {
            return Ok(());
        }
        let performed = performed_ops(receiver_url).await?;
        let mut rerun = std::collections::BTreeSet::new();
        for (lock, id, state) in open {
            if state == Some(OpState::NeedsReview) {
                if reviewed.insert(id.to_string()) {
                    figures.review_items += 1;
                }
                // The person checks the receiver's own record, then decides.
                let (verdict, why) = if performed.contains(&id.to_string()) {
                    figures.resolved_done += 1;
                    (Verdict::Done, "the receiver's record shows the effect")
                } else {
                    figures.resolved_not_done += 1;
                    (Verdict::NotDone, "the receiver's record has no such effect")
                };
                ledger.resolve(&id, verdict, "drill-person", why).await?;
            }
            rerun.insert(lock);
        }
        for lock in rerun {
            let mut worker = setup.worker(&lock, None)?;
            outcomes(&mut worker).await?;
            worker.wait_exit().await?;
        }
    }
    anyhow::bail!("operations still open after 60 s of final owners and reviews")
}

async fn performed_ops(receiver_url: &str) -> anyhow::Result<std::collections::HashSet<String>> {
    // The receiver may be restarting after a crash fault: retry briefly.
    for _ in 0..200 {
        if let Ok(response) = reqwest::get(format!("{receiver_url}/v1/record")).await {
            if let Ok(events) = response.json::<Vec<Event>>().await {
                return Ok(events
                    .into_iter()
                    .filter(|e| e.kind == "performed")
                    .map(|e| e.op)
                    .collect());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("the receiver's record is unreachable")
}

async fn judge(
    ledger: &AnyLedger,
    locks: &[String],
    events: &[Event],
    figures: &mut EffectsFigures,
) -> anyhow::Result<()> {
    let mut performed: HashMap<&str, usize> = HashMap::new();
    for event in events {
        match event.kind.as_str() {
            "performed" => {
                figures.effects_performed += 1;
                *performed.entry(&event.op).or_default() += 1;
            }
            "replayed" => figures.replays += 1,
            "refused_late" => figures.late_refused += 1,
            "fault" => *figures.faults.entry(event.reference.clone()).or_default() += 1,
            _ => {}
        }
    }
    figures.duplicates = performed.values().map(|n| n.saturating_sub(1)).sum();
    let mut problems = Vec::new();
    let mut records = HashMap::new();
    for lock in locks {
        let filter = ListFilter {
            lock: Some(lock.clone()),
            ..ListFilter::default()
        };
        for record in ledger.list(&filter).await? {
            records.insert(record.id.to_string(), record);
        }
        for n in 0..OPS {
            let id = op_id(lock, n).to_string();
            let done = records
                .get(&id)
                .is_some_and(|r| matches!(r.state, OpState::Succeeded | OpState::Reconciled));
            if !done || !performed.contains_key(id.as_str()) {
                figures.lost += 1;
                problems.push(format!(
                    "{id} lost: ledger {:?}, receiver performed it {} times",
                    records.get(&id).map(|r| r.state),
                    performed.get(id.as_str()).copied().unwrap_or(0)
                ));
            }
        }
    }
    unrecorded_sends(events, &records, figures, &mut problems);
    if let Some(stale) = figures.violation.take() {
        problems.push(stale);
    }
    if figures.duplicates > 0 {
        let dups: Vec<_> = performed.iter().filter(|(_, n)| **n > 1).collect();
        problems.push(format!("duplicate effects: {dups:?}"));
    }
    figures.passed = problems.is_empty();
    figures.violation = (!problems.is_empty()).then(|| problems.join("\n"));
    Ok(())
}

/// Every send the receiver saw (performed, replayed or refused as late) must be an attempt the
/// ledger recorded before it: one that is not is counted and named in `problems`.
fn unrecorded_sends(
    events: &[Event],
    records: &HashMap<String, Record>,
    figures: &mut EffectsFigures,
    problems: &mut Vec<String>,
) {
    for event in events {
        if !matches!(
            event.kind.as_str(),
            "performed" | "replayed" | "refused_late"
        ) {
            continue;
        }
        let recorded = records.get(&event.op).is_some_and(|r| {
            r.attempts
                .iter()
                .any(|a| a.n == event.attempt && a.epoch == event.epoch)
        });
        if !recorded {
            figures.unrecorded_sends += 1;
            problems.push(format!(
                "{} attempt {} (epoch {}) reached the receiver unrecorded",
                event.op, event.attempt, event.epoch
            ));
        }
    }
}

/// A worker's plan (`palisade effects-worker`).
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    pub coordinator: String,
    pub ledger: String,
    pub trust_key: PathBuf,
    pub receiver_url: String,
    pub capability: Capability,
    pub lock: String,
    pub ops: usize,
    pub ttl_ms: u64,
    pub attempt_timeout_ms: u64,
    pub send_timeout_ms: u64,
    /// `recorded` or `answered`, and the operation to stop at.
    pub stop: Option<(String, usize)>,
}

fn report(event: Value) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{event}");
    let _ = stdout.flush();
}

/// The worker: acquires the lock (waiting for it), then performs operations `op-0`… in order
/// through the ledger, stopping itself (SIGSTOP) where the plan says.
pub async fn worker(plan: WorkerPlan) -> anyhow::Result<()> {
    use palisade_effects::{perform, Done, HttpReceiver, RunError, RunOptions, Step};
    let verifier = palisade_fence::Verifier::new(
        palisade_resource_keys(&plan.trust_key).context("read the coordinator's keys")?,
    );
    // A PostgreSQL ledger weighs the coordinator's floor of each lock it has not learned since
    // the database started or was restored.
    let (_, floors) = crate::target::coordinator_keys(&plan.coordinator).await?;
    let ledger = AnyLedger::connect(&plan.ledger, Arc::new(verifier), Some(floors), None).await?;
    let receiver = HttpReceiver::new(
        "drill",
        plan.capability,
        &plan.receiver_url,
        Duration::from_millis(plan.send_timeout_ms),
    )?;
    let client = palisade_client::Client::connect(&[&plan.coordinator]).await?;
    let mut options = palisade_client::AcquireOptions::new(plan.lock.clone());
    options.ttl = Duration::from_millis(plan.ttl_ms);
    options.wait = Duration::from_secs(30);
    options.holder = format!("effects-worker-{}", std::process::id());
    let grant = client.acquire_once(&options).await?;
    report(serde_json::json!({"event": "granted", "epoch": grant.epoch}));
    let run_options = RunOptions {
        attempt_timeout: Duration::from_millis(plan.attempt_timeout_ms),
        max_wait: Duration::from_secs(5),
        max_rounds: 6,
    };
    for n in 0..plan.ops {
        let id = OpId::parse(&format!("{}:op-{n}", plan.lock))?;
        let payload = format!("{id}:amount={}", n * 10 + 7);
        let stop = plan.stop.clone();
        let hook = move |step: Step, _: &palisade_effects::Attempt| {
            let name = match step {
                Step::Recorded => "recorded",
                Step::Answered => "answered",
            };
            if stop.as_ref().is_some_and(|(s, op)| s == name && *op == n) {
                report(serde_json::json!({"event": "stopping", "op": n, "step": name}));
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
            }
        };
        let outcome = match perform(
            &ledger,
            &receiver,
            &grant.token,
            &id,
            payload.as_bytes(),
            &run_options,
            hook,
        )
        .await
        {
            Ok(Done::Performed(_)) => "performed".to_owned(),
            Ok(Done::Failed(_)) => "failed".to_owned(),
            Ok(Done::Review(_)) => "review".to_owned(),
            Ok(Done::InDoubt(_)) => "in_doubt".to_owned(),
            Err(RunError::Rejected(palisade_effects::model::LedgerRejection::StaleEpoch {
                ..
            })) => "stale".to_owned(),
            Err(error) => format!("error: {error}"),
        };
        report(serde_json::json!({"event": "op", "op": n, "outcome": outcome}));
    }
    report(serde_json::json!({"event": "done"}));
    Ok(())
}

/// The coordinator's keys from a file (the JSON of `GET /v1/keys`).
fn palisade_resource_keys(path: &Path) -> anyhow::Result<palisade_core::TokenVerifier> {
    let text = std::fs::read_to_string(path)?;
    let json: Value = serde_json::from_str(&text)?;
    let mut verifier = palisade_core::TokenVerifier::default();
    for key in json["keys"].as_array().context("no keys array")? {
        let text = key["public_key"]
            .as_str()
            .or_else(|| key.as_str())
            .context("a key without public_key")?;
        verifier.trust(palisade_core::token::decode_public_key(text)?);
    }
    Ok(verifier)
}
