//! `palisade bench effects`: the cost of the effects ledger — effects per second sent to a
//! receiver directly vs through the ledger (an attempt recorded before each send and its
//! answer after), side by side in one run, for a receiver that does nothing and for the fake
//! receiver (which fsyncs its record of every effect).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use palisade_core::{Epoch, HolderId, LockName, TokenSigner, TokenVerifier};
use palisade_effects::{
    perform, AnyLedger, Attempt, Capability, Done, HttpReceiver, LocalLedger, OpId, Receiver,
    ReceiverError, RedbStore, RunOptions, SendResult, Status,
};
use palisade_fake_receiver::{Fake, Faults};
use palisade_fence::Verifier;
use serde::Serialize;
use tokio::time::Instant;

use palisade_cli_common::output::{print_json, print_table};

use crate::probe::measure_fdatasync;

#[derive(Args)]
pub struct EffectsBenchArgs {
    /// The ledger: `embedded` (a redb file in a temporary directory, in this process), or a
    /// postgres:// URL.
    #[arg(long, default_value = "embedded")]
    ledger: String,
    /// Client counts to measure, comma-separated.
    #[arg(long, default_value = "1,8,64", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Duration of each measurement.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

/// A receiver that performs nothing and answers at once: what the ledger alone costs.
struct Noop;

impl Receiver for Noop {
    fn name(&self) -> &str {
        "noop"
    }
    fn capability(&self) -> Capability {
        Capability::Idempotent
    }
    async fn send(&self, _: &Attempt) -> SendResult {
        SendResult::Performed { reference: None }
    }
    async fn status(&self, _: &str) -> Result<Status, ReceiverError> {
        Ok(Status::NotPerformed)
    }
    async fn compensate(&self, _: &str) -> Result<String, ReceiverError> {
        Err(ReceiverError::Unsupported("compensation"))
    }
}

#[derive(Serialize)]
struct Row {
    receiver: &'static str,
    clients: usize,
    direct_per_sec: f64,
    ledger_per_sec: f64,
    ratio: f64,
    ledger_p50_ms: f64,
}

async fn run_clients<F, Fut>(
    clients: usize,
    duration: Duration,
    one: F,
) -> anyhow::Result<(f64, f64)>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let one = Arc::new(one);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (one, done) = (one.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while started.elapsed() < duration {
                let at = Instant::now();
                one(client, n).await?;
                latencies.push(at.elapsed().as_secs_f64() * 1_000.0);
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let p50 = latencies.get(latencies.len() / 2).copied().unwrap_or(0.0);
    Ok((done.load(Ordering::Relaxed) as f64 / elapsed, p50))
}

async fn measure<R: Receiver + 'static>(
    name: &'static str,
    receiver: Arc<R>,
    ledger: Arc<AnyLedger>,
    tokens: Arc<Vec<(LockName, String)>>,
    clients: usize,
    duration: Duration,
    run: &str,
) -> anyhow::Result<Row> {
    let direct = {
        let (receiver, run) = (receiver.clone(), run.to_owned());
        run_clients(clients, duration, move |client, n| {
            let receiver = receiver.clone();
            let run = run.clone();
            async move {
                let lock = LockName::new(format!("bench-effects/{run}/direct/{client}"))?;
                let id = OpId::new(lock, format!("op-{n}"))?;
                let attempt = Attempt {
                    key: id.idempotency_key(),
                    id,
                    n: 1,
                    epoch: 1,
                    deadline_ms: palisade_effects::model::now_ms() + 30_000,
                    payload: b"amount=10".to_vec(),
                };
                match receiver.send(&attempt).await {
                    SendResult::Performed { .. } => Ok(()),
                    other => anyhow::bail!("the receiver answered {other:?}"),
                }
            }
        })
        .await?
    };
    let through = {
        let (receiver, ledger, tokens) = (receiver.clone(), ledger.clone(), tokens.clone());
        run_clients(clients, duration, move |client, n| {
            let (receiver, ledger, tokens) = (receiver.clone(), ledger.clone(), tokens.clone());
            async move {
                let (lock, token) = &tokens[client];
                let id = OpId::new(lock.clone(), format!("{name}-op-{n}"))?;
                let options = RunOptions::default();
                let payload = b"amount=10";
                match perform(
                    &*ledger,
                    &*receiver,
                    token,
                    &id,
                    payload,
                    &options,
                    |_, _| {},
                )
                .await?
                {
                    Done::Performed(_) => Ok(()),
                    other => anyhow::bail!("not performed: {other:?}"),
                }
            }
        })
        .await?
    };
    Ok(Row {
        receiver: name,
        clients,
        direct_per_sec: direct.0,
        ledger_per_sec: through.0,
        ratio: through.0 / direct.0,
        ledger_p50_ms: through.1,
    })
}

pub async fn run(args: EffectsBenchArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.clients.is_empty() && args.clients.iter().all(|c| (1..=1_024).contains(c)),
        "--clients must be 1 to 1024"
    );
    let dir = tempfile::tempdir()?;
    let signer = TokenSigner::from_secret_bytes(&[11; 32]);
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
    let ledger = if args.ledger == "embedded" {
        let store = RedbStore::open(&dir.path().join("effects.redb"))?;
        AnyLedger::Embedded(LocalLedger::new(store, verifier.clone()))
    } else {
        // The benchmark's signer is its coordinator.
        let floors: Arc<dyn palisade_fence::FloorSource> =
            Arc::new(palisade_fence::StaticFloors::new());
        AnyLedger::connect(&args.ledger, verifier.clone(), Some(floors), None).await?
    };
    let ledger = Arc::new(ledger);
    let run = format!(
        "{}-{}",
        std::process::id(),
        palisade_effects::model::now_ms()
    );
    let max_clients = *args.clients.iter().max().expect("not empty");
    let tokens = Arc::new(client_tokens(&signer, &run, max_clients));
    let fake = Arc::new(start_fake_receiver(dir.path()).await?);
    let noop = Arc::new(Noop);
    let probe = dir.path().to_owned();
    let fsync = tokio::task::spawn_blocking(move || measure_fdatasync(&probe)).await??;
    let mut rows = Vec::new();
    for &clients in &args.clients {
        let row = measure(
            "noop",
            noop.clone(),
            ledger.clone(),
            tokens.clone(),
            clients,
            args.duration,
            &run,
        )
        .await?;
        rows.push(row);
        let row = measure(
            "fake",
            fake.clone(),
            ledger.clone(),
            tokens.clone(),
            clients,
            args.duration,
            &run,
        )
        .await?;
        rows.push(row);
    }
    if json {
        print_json(&serde_json::json!({
            "ledger": if args.ledger == "embedded" { "embedded" } else { "postgres" },
            "fdatasyncs_per_sec": fsync,
            "rows": rows,
        }));
        return Ok(());
    }
    print_rows(&rows);
    println!("\nfdatasync on this disk: {fsync:.0}/s");
    Ok(())
}

/// One token per client, each for a lock of its own, at epoch 1 (signed by the benchmark,
/// its own coordinator).
fn client_tokens(signer: &TokenSigner, run: &str, clients: usize) -> Vec<(LockName, String)> {
    let holder = HolderId::new("bench").expect("valid");
    (0..clients)
        .map(|client| {
            let lock = LockName::new(format!("bench-effects/{run}/{client}")).expect("valid");
            let token = signer.sign(
                &lock,
                Epoch(1),
                &holder,
                &palisade_core::Principal::anonymous(),
                0,
            );
            (lock, token)
        })
        .collect()
}

/// The fake receiver, in this process on loopback, with no faults.
async fn start_fake_receiver(dir: &std::path::Path) -> anyhow::Result<HttpReceiver> {
    let fake = Fake::open(
        &dir.join("receiver"),
        Capability::Idempotent,
        Faults::default(),
    )
    .context("open the fake receiver's record")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, palisade_fake_receiver::router(fake)).await;
    });
    Ok(HttpReceiver::new(
        "fake",
        Capability::Idempotent,
        format!("http://{address}"),
        Duration::from_secs(10),
    )?)
}

fn print_rows(rows: &[Row]) {
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.receiver.to_string(),
                r.clients.to_string(),
                format!("{:.0}", r.direct_per_sec),
                format!("{:.0}", r.ledger_per_sec),
                format!("{:.3}", r.ratio),
                format!("{:.2}", r.ledger_p50_ms),
            ]
        })
        .collect();
    print_table(
        &[
            "RECEIVER",
            "CLIENTS",
            "DIRECT/S",
            "LEDGER/S",
            "RATIO",
            "LEDGER P50 MS",
        ],
        &table,
    );
}
