//! `palisade effects list|show|stats|perform|reconcile|resolve` and `palisade receiver serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use palisade_effects::metrics::EffectsMetrics;
use palisade_effects::model::{now_ms, OpState};
use palisade_effects::{
    perform, reconcile_once, Answer, AnyLedger, Capability, Done, HttpReceiver, Ledger as _,
    ListFilter, OpId, Receiver as _, Record, RunOptions, Verdict,
};
use palisade_fake_receiver::{Fake, Faults};
use palisade_fence::Verifier;
use tokio::signal::unix::{signal, SignalKind};

use crate::output::print_json;
use crate::output::{millis, print_fields, print_table};

/// Exit code of `effects perform` when the effect is in review or in doubt.
pub const IN_DOUBT_EXIT: u8 = 9;

/// Default ledger: the embedded ledger of a reference store on its default port.
const DEFAULT_LEDGER: &str = "http://127.0.0.1:7421";

#[derive(Args)]
pub struct LedgerArgs {
    /// The ledger: the http:// URL of a reference store (its embedded ledger), or a
    /// postgres:// URL.
    #[arg(long, env = "PALISADE_LEDGER", default_value = DEFAULT_LEDGER)]
    ledger: String,
    /// The ledger's admin secret (a file), for reconcile and resolve on an embedded ledger.
    #[arg(long, env = "PALISADE_EFFECTS_ADMIN_SECRET_FILE", value_name = "FILE")]
    admin_secret_file: Option<PathBuf>,
    /// The coordinator's keys (the JSON of GET /v1/keys, or one key per line), to verify
    /// owners' tokens in a PostgreSQL ledger (`perform`; an embedded ledger verifies them
    /// itself).
    #[arg(long, value_name = "FILE", conflicts_with = "coordinator")]
    trust_key: Option<PathBuf>,
    /// The coordinator (https:// with --coordinator-ca, or loopback) whose keys verify owners'
    /// tokens in a PostgreSQL ledger, and whose lock floors it weighs: an owner the
    /// coordinator superseded is refused even after the database was restored or put back.
    #[arg(long, value_name = "URL")]
    coordinator: Option<String>,
    /// The CA (PEM) that signed the coordinator's certificate.
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    coordinator_ca: Option<PathBuf>,
}

impl LedgerArgs {
    async fn connect(&self) -> anyhow::Result<AnyLedger> {
        let secret = self
            .admin_secret_file
            .as_deref()
            .map(crate::resource::read_secret_file)
            .transpose()?;
        // Commands that take no token need no trusted key; over HTTP the ledger verifies
        // tokens itself, and on PostgreSQL this process does, with --trust-key.
        if let Some(url) = &self.coordinator {
            let verifier = Arc::new(Verifier::default());
            let keys = palisade_resource::KeyRing::new(
                palisade_resource::KeySource::Coordinator(url.clone()),
                Vec::new(),
                verifier.clone(),
                self.coordinator_ca.as_deref(),
            )?;
            keys.load_initial().await?;
            let floors: Arc<dyn palisade_fence::FloorSource> = Arc::new(keys);
            return Ok(AnyLedger::connect(&self.ledger, verifier, Some(floors), secret).await?);
        }
        let verifier = match &self.trust_key {
            Some(file) => Verifier::new(
                palisade_resource::load_key_file(file).map_err(|e| anyhow::anyhow!(e))?,
            ),
            None => Verifier::default(),
        };
        Ok(AnyLedger::connect(&self.ledger, Arc::new(verifier), None, secret).await?)
    }
}

#[derive(Args)]
pub struct ReceiverArgs {
    /// The receiver's name in the ledger.
    #[arg(long, default_value = "default")]
    receiver: String,
    /// Where it is (the receiver HTTP protocol of docs/effects.md).
    #[arg(long, default_value = "http://127.0.0.1:7430")]
    receiver_url: String,
    /// What it can do: idempotent, lookup or none.
    #[arg(long, value_parser = parse_capability)]
    capability: Capability,
    /// Longest wait for one answer from it, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    send_timeout_ms: u64,
}

impl ReceiverArgs {
    fn receiver(&self) -> anyhow::Result<HttpReceiver> {
        Ok(HttpReceiver::new(
            &self.receiver,
            self.capability,
            &self.receiver_url,
            Duration::from_millis(self.send_timeout_ms),
        )?)
    }
}

fn parse_capability(text: &str) -> Result<Capability, String> {
    Capability::parse(text).map_err(|e| e.0)
}

fn parse_op(text: &str) -> Result<OpId, String> {
    OpId::parse(text).map_err(|e| e.0)
}

fn parse_verdict(text: &str) -> Result<Verdict, String> {
    Verdict::parse(text).map_err(|e| e.0)
}

#[derive(Subcommand)]
pub enum EffectsCommand {
    /// Operations in the ledger, oldest change first.
    List {
        /// Only these states (comma-separated: pending, in_flight, succeeded, failed, unknown,
        /// reconciled, needs_review, compensated).
        #[arg(long)]
        state: Option<String>,
        /// Only this lock's operations.
        #[arg(long)]
        lock: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        ledger: LedgerArgs,
    },
    /// One operation, with its attempts and any review.
    Show {
        /// LOCK:OP, e.g. invoice/7:charge.
        #[arg(value_parser = parse_op)]
        op: OpId,
        #[command(flatten)]
        ledger: LedgerArgs,
    },
    /// Operations by state, the review queue and the oldest operation in doubt.
    Stats {
        #[command(flatten)]
        ledger: LedgerArgs,
    },
    /// Cause one effect under an owner's token: recorded before it is sent, resolved by the
    /// receiver's capability. Exit 0 when performed, 5 when the ledger refuses the owner
    /// (superseded, bad token), 1 when the receiver refused or failed, 9 when in review or
    /// still in doubt.
    Perform {
        /// LOCK:OP, e.g. invoice/7:charge.
        #[arg(value_parser = parse_op)]
        op: OpId,
        /// The owner's token for LOCK.
        #[arg(long, env = "PALISADE_FENCE_TOKEN")]
        token: String,
        /// The effect's payload.
        #[arg(long)]
        payload: String,
        /// An attempt must be sent within this many milliseconds of being recorded.
        #[arg(long, default_value_t = 30_000)]
        attempt_timeout_ms: u64,
        #[command(flatten)]
        receiver: ReceiverArgs,
        #[command(flatten)]
        ledger: LedgerArgs,
    },
    /// Resolve operations in doubt by the receiver's capability: retry with the same key
    /// (idempotent), look the key up after the deadline (lookup), or send to review (none).
    /// Never sends a second effect to a receiver without deduplication.
    Reconcile {
        /// Repeat every this many seconds until SIGINT/SIGTERM (once when absent).
        #[arg(long, value_name = "SECONDS")]
        every: Option<u64>,
        /// Most operations examined per pass.
        #[arg(long, default_value_t = 1_000)]
        limit: usize,
        /// A reconciler's retry must be sent within this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        attempt_timeout_ms: u64,
        /// Serve the reconciliation metrics at http://ADDR/metrics (with --every).
        #[arg(long, requires = "every")]
        metrics_listen: Option<SocketAddr>,
        #[command(flatten)]
        receiver: ReceiverArgs,
        #[command(flatten)]
        ledger: LedgerArgs,
    },
    /// A person's verdict on an operation in review: done, not-done (its next run sends it),
    /// compensated, or abandon.
    Resolve {
        /// LOCK:OP.
        #[arg(value_parser = parse_op)]
        op: OpId,
        /// done, not-done, compensated or abandon.
        #[arg(long, value_parser = parse_verdict)]
        verdict: Verdict,
        /// Who decides (recorded).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long)]
        why: String,
        /// Ask the receiver to compensate the effect first (its compensation hook), then record
        /// `compensated` with the compensation's reference.
        #[arg(long)]
        compensate: bool,
        /// The receiver, for --compensate.
        #[arg(long)]
        receiver_url: Option<String>,
        #[command(flatten)]
        ledger: LedgerArgs,
    },
}

#[derive(Subcommand)]
pub enum ReceiverCommand {
    /// Run the fake receiver (tests and drills): performs effects, keeps a durable record of
    /// each, and injects the faults asked for.
    Serve(ReceiverServeArgs),
}

#[derive(Args)]
pub struct ReceiverServeArgs {
    /// idempotent, lookup or none.
    #[arg(long, value_parser = parse_capability)]
    capability: Capability,
    /// Where the record of effects lives.
    #[arg(long, default_value = "./palisade-receiver-data")]
    data_dir: PathBuf,
    /// Address for HTTP (loopback by default).
    #[arg(long, default_value = "127.0.0.1:7430")]
    listen: SocketAddr,
    /// Probability of committing an effect, then breaking its answer.
    #[arg(long, default_value_t = 0.0)]
    lose_answer: f64,
    /// Probability of hanging, then answering 503 without performing.
    #[arg(long, default_value_t = 0.0)]
    timeout_before: f64,
    /// Probability of committing, then hanging before answering.
    #[arg(long, default_value_t = 0.0)]
    timeout_after: f64,
    /// Probability of committing, then aborting the process.
    #[arg(long, default_value_t = 0.0)]
    crash: f64,
    /// Probability of processing a request twice (a duplicated delivery).
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// How long a timeout fault hangs, in milliseconds.
    #[arg(long, default_value_t = 6_000)]
    hang_ms: u64,
    /// Seed of the fault choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn state_cell(record: &Record) -> String {
    record.state.as_str().to_owned()
}

fn age(ms: u64) -> String {
    millis(now_ms().saturating_sub(ms))
}

fn short(text: Option<&str>, width: usize) -> String {
    let text = text.unwrap_or("");
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(width - 1).collect::<String>())
    }
}

fn print_record(record: &Record) {
    let mut fields = vec![
        ("operation", record.id.to_string()),
        ("state", state_cell(record)),
        ("idempotency key", record.key.clone()),
        (
            "receiver",
            format!("{} ({})", record.receiver, record.capability),
        ),
        (
            "attempt",
            format!("{} under epoch {}", record.attempt, record.epoch),
        ),
        ("payload sha256", record.payload_hash.clone()),
        ("created", format!("{} ago", age(record.created_ms))),
        ("updated", format!("{} ago", age(record.updated_ms))),
    ];
    if let Some(reference) = &record.reference {
        fields.push(("reference", reference.clone()));
    }
    if let Some(detail) = &record.detail {
        fields.push(("detail", detail.clone()));
    }
    if let Some(review) = &record.review {
        fields.push((
            "review",
            format!(
                "{} by {}: {}",
                review.verdict.as_str(),
                review.by,
                review.why
            ),
        ));
    }
    print_fields(&fields);
    let rows: Vec<Vec<String>> = record
        .attempts
        .iter()
        .map(|a| {
            vec![
                a.n.to_string(),
                a.epoch.to_string(),
                a.by.clone(),
                format!("{} ago", age(a.started_ms)),
                a.result.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    println!();
    print_table(&["ATTEMPT", "EPOCH", "BY", "STARTED", "RESULT"], &rows);
}

fn print_answer(answer: &Answer, json: bool) -> anyhow::Result<()> {
    match answer {
        Answer::Rejected { rejection } => bail!("refused: {rejection}"),
        Answer::Superseded { record } => {
            bail!(
                "not recorded: {} changed meanwhile (now {})",
                record.id,
                record.state
            )
        }
        Answer::Recorded { record } => {
            if json {
                print_json(&serde_json::to_value(record)?);
            } else {
                println!("{} is now {}", record.id, record.state);
            }
            Ok(())
        }
    }
}

pub async fn run(command: EffectsCommand, json: bool) -> anyhow::Result<()> {
    match command {
        EffectsCommand::List {
            state,
            lock,
            limit,
            ledger,
        } => list(state, lock, limit, ledger, json).await,
        EffectsCommand::Show { op, ledger } => show(&op, ledger, json).await,
        EffectsCommand::Stats { ledger } => stats(ledger, json).await,
        EffectsCommand::Perform {
            op,
            token,
            payload,
            attempt_timeout_ms,
            receiver,
            ledger,
        } => {
            perform_one(
                op,
                token,
                payload,
                attempt_timeout_ms,
                receiver,
                ledger,
                json,
            )
            .await
        }
        EffectsCommand::Reconcile {
            every,
            limit,
            attempt_timeout_ms,
            metrics_listen,
            receiver,
            ledger,
        } => {
            reconcile(
                ledger,
                receiver,
                every,
                limit,
                attempt_timeout_ms,
                metrics_listen,
                json,
            )
            .await
        }
        EffectsCommand::Resolve {
            op,
            verdict,
            by,
            why,
            compensate,
            receiver_url,
            ledger,
        } => {
            let ledger = ledger.connect().await?;
            let why = if compensate {
                compensate_first(&ledger, &op, verdict, receiver_url, why).await?
            } else {
                why
            };
            print_answer(&ledger.resolve(&op, verdict, &by, &why).await?, json)
        }
    }
}

async fn list(
    state: Option<String>,
    lock: Option<String>,
    limit: usize,
    ledger: LedgerArgs,
    json: bool,
) -> anyhow::Result<()> {
    let states = match state.as_deref() {
        None => Vec::new(),
        Some(text) => text
            .split(',')
            .map(|s| OpState::parse(s.trim()).map_err(|e| anyhow::anyhow!(e.0)))
            .collect::<anyhow::Result<_>>()?,
    };
    let filter = ListFilter {
        states,
        lock,
        limit: Some(limit),
    };
    let records = ledger.connect().await?.list(&filter).await?;
    if json {
        print_json(&serde_json::to_value(&records)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                state_cell(r),
                format!("{}@{}", r.attempt, r.epoch),
                format!("{} ({})", r.receiver, r.capability),
                age(r.updated_ms),
                short(r.detail.as_deref().or(r.reference.as_deref()), 60),
            ]
        })
        .collect();
    print_table(
        &[
            "OPERATION",
            "STATE",
            "ATTEMPT@EPOCH",
            "RECEIVER",
            "UPDATED",
            "DETAIL",
        ],
        &rows,
    );
    Ok(())
}

async fn show(op: &OpId, ledger: LedgerArgs, json: bool) -> anyhow::Result<()> {
    let Some(record) = ledger.connect().await?.get(op).await? else {
        bail!("no operation {op} in the ledger");
    };
    if json {
        print_json(&serde_json::to_value(&record)?);
    } else {
        print_record(&record);
    }
    Ok(())
}

async fn stats(ledger: LedgerArgs, json: bool) -> anyhow::Result<()> {
    let stats = ledger.connect().await?.stats().await?;
    if json {
        print_json(&serde_json::to_value(&stats)?);
        return Ok(());
    }
    let mut fields: Vec<(&str, String)> = stats
        .by_state
        .iter()
        .map(|(state, n)| (state.as_str(), n.to_string()))
        .collect();
    fields.push((
        "oldest in doubt",
        stats
            .oldest_in_doubt_ms
            .map_or("none".into(), |at| format!("{} ago", age(at))),
    ));
    print_fields(&fields);
    Ok(())
}

async fn perform_one(
    op: OpId,
    token: String,
    payload: String,
    attempt_timeout_ms: u64,
    receiver: ReceiverArgs,
    ledger: LedgerArgs,
    json: bool,
) -> anyhow::Result<()> {
    let ledger = ledger.connect().await?;
    let receiver = receiver.receiver()?;
    let options = RunOptions {
        attempt_timeout: Duration::from_millis(attempt_timeout_ms),
        ..RunOptions::default()
    };
    let done = perform(
        &ledger,
        &receiver,
        &token,
        &op,
        payload.as_bytes(),
        &options,
        |_, _| {},
    )
    .await?;
    let record = done.record();
    if json {
        print_json(&serde_json::to_value(record)?);
    } else {
        println!(
            "{} {}{}",
            record.id,
            record.state,
            record
                .reference
                .as_deref()
                .map(|r| format!(" (reference {r})"))
                .unwrap_or_default()
        );
    }
    match done {
        Done::Performed(_) => Ok(()),
        Done::Failed(record) => bail!(
            "not performed: {}",
            record.detail.unwrap_or_else(|| "refused".into())
        ),
        Done::Review(record) | Done::InDoubt(record) => Err(crate::lock_run::Exit {
            code: IN_DOUBT_EXIT,
            message: Some(format!(
                "{} is {}: a reconciler or a person settles it (palisade effects show {})",
                record.id, record.state, record.id
            )),
        }
        .into()),
    }
}

/// `--compensate`: asks the receiver to undo the operation's effect first; the reason to record,
/// with the receiver's reference for the compensation.
async fn compensate_first(
    ledger: &AnyLedger,
    op: &OpId,
    verdict: Verdict,
    receiver_url: Option<String>,
    why: String,
) -> anyhow::Result<String> {
    if verdict != Verdict::Compensated {
        bail!("--compensate goes with --verdict compensated");
    }
    let url = receiver_url.context("--compensate needs --receiver-url")?;
    let Some(record) = ledger.get(op).await? else {
        bail!("no operation {op} in the ledger");
    };
    let receiver = HttpReceiver::new(
        &record.receiver,
        record.capability,
        url,
        Duration::from_secs(10),
    )?;
    let reference = receiver
        .compensate(&record.key)
        .await
        .context("the receiver did not compensate")?;
    Ok(format!("{why} (compensation {reference})"))
}

async fn reconcile(
    ledger: LedgerArgs,
    receiver: ReceiverArgs,
    every: Option<u64>,
    limit: usize,
    attempt_timeout_ms: u64,
    metrics_listen: Option<SocketAddr>,
    json: bool,
) -> anyhow::Result<()> {
    let ledger = ledger.connect().await?;
    let receiver = receiver.receiver()?;
    let timeout = Duration::from_millis(attempt_timeout_ms);
    let Some(every) = every else {
        let report = reconcile_once(&ledger, &receiver, timeout, limit).await?;
        if json {
            print_json(&serde_json::to_value(&report)?);
        } else {
            print_fields(&[
                ("examined", report.examined.to_string()),
                ("not due yet", report.not_due.to_string()),
                ("performed", report.performed.to_string()),
                (
                    "not performed (pending again)",
                    report.not_performed.to_string(),
                ),
                ("retried (same key)", report.retried.to_string()),
                ("refused", report.refused.to_string()),
                ("sent to review", report.to_review.to_string()),
                ("still in doubt", report.left.to_string()),
                ("other receivers", report.skipped.to_string()),
            ]);
        }
        return Ok(());
    };
    let metrics = EffectsMetrics::default();
    if let Some(address) = metrics_listen {
        serve_metrics(address, metrics.clone()).await?;
    }
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(every.max(1)));
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = tick.tick() => {
                match reconcile_once(&ledger, &receiver, timeout, limit).await {
                    Ok(report) => {
                        metrics.count_report(&report);
                        if let Ok(stats) = ledger.stats().await {
                            metrics.set_stats(&stats, now_ms());
                        }
                        if json {
                            print_json(&serde_json::to_value(&report)?);
                        } else if report.examined > 0 {
                            eprintln!("reconcile: {}", serde_json::to_string(&report)?);
                        }
                    }
                    Err(error) => eprintln!("reconcile: {error}"),
                }
            }
        }
    }
    Ok(())
}

async fn serve_metrics(address: SocketAddr, metrics: EffectsMetrics) -> anyhow::Result<()> {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(registry.sub_registry_with_prefix("palisade_effects"));
    let registry = Arc::new(registry);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                let mut out = String::new();
                let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
                out
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(())
}

pub async fn run_receiver(command: ReceiverCommand) -> anyhow::Result<()> {
    let ReceiverCommand::Serve(args) = command;
    for (name, p) in [
        ("--lose-answer", args.lose_answer),
        ("--timeout-before", args.timeout_before),
        ("--timeout-after", args.timeout_after),
        ("--crash", args.crash),
        ("--duplicate", args.duplicate),
    ] {
        if !(0.0..=1.0).contains(&p) {
            bail!("{name} is a probability between 0 and 1, not {p}");
        }
    }
    let faults = Faults {
        lose_answer: args.lose_answer,
        timeout_before: args.timeout_before,
        timeout_after: args.timeout_after,
        crash: args.crash,
        duplicate: args.duplicate,
        hang: Duration::from_millis(args.hang_ms),
        seed: args.seed,
    };
    let fake = Fake::open(&args.data_dir, args.capability, faults)
        .with_context(|| format!("cannot open the record in {}", args.data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    eprintln!(
        "palisade fake receiver ({}) listening on {}",
        args.capability,
        listener.local_addr()?
    );
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
    };
    axum::serve(listener, palisade_fake_receiver::router(fake))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
