//! `palisade bench postgres` and `palisade bench resource`: the cost of resource-side
//! enforcement, measured side by side in one run.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use palisade_core::token::encode_public_key;
use palisade_core::{Epoch, HolderId, LockName, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, Outcome, Verifier};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};
use palisade_resource::{KeySource, ResourceConfig};
use serde::Serialize;
use tokio::time::Instant;

use palisade_cli_common::output::{print_fields, print_json, print_table};

use crate::probe::measure_fdatasync;

/// Rows each client owns in the distinct-rows case; an owner writes each once per epoch.
const ROWS_PER_CLIENT: i64 = 1_000;
/// Tokens signed before a hot-row run (each hot-row write needs a new epoch).
const HOT_TOKENS: usize = 60_000;
const TABLE: &str = "palisade_bench_rows";

#[derive(Args)]
pub struct PostgresBenchArgs {
    /// PostgreSQL URL, e.g. postgres://postgres@127.0.0.1:5432/postgres. The bench creates and
    /// drops its own table.
    #[arg(long, env = "PALISADE_BENCH_POSTGRES_URL")]
    url: String,
    /// Client counts to measure, comma-separated.
    #[arg(long, default_value = "1,8,64", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Duration of each measurement.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

#[derive(Serialize)]
struct Row {
    clients: usize,
    rows: &'static str,
    raw_per_sec: f64,
    adapter_per_sec: f64,
    ratio: f64,
    adapter_accepted: usize,
}

fn token(signer: &TokenSigner, lock: &LockName, epoch: u64) -> String {
    let holder = HolderId::new("bench").unwrap();
    signer.sign(
        lock,
        Epoch(epoch),
        &holder,
        &palisade_core::Principal::anonymous(),
        0,
    )
}

pub async fn run_postgres(args: PostgresBenchArgs, json: bool) -> anyhow::Result<()> {
    let signer = Arc::new(TokenSigner::from_secret_bytes(&[42; 32]));
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([signer.verifying_key()])));
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    // The benchmark's signer is its coordinator: it supersedes nobody the database does not see.
    let fence = PostgresFence::connect(&args.url, max_clients, FenceMode::Strict, verifier)
        .await
        .context("connect to PostgreSQL")?
        .with_floors(Arc::new(palisade_fence::StaticFloors::new()));
    // Each row names its lock (client i's rows "bench/i", row 0 "bench/hot").
    let table = GuardedTable::new(TABLE, "id", "payload", RowLock::Column("lock".into()))?;
    let hot_lock = LockName::new("bench/hot").unwrap();
    let hot_tokens: Arc<Vec<String>> = Arc::new(
        (1..=HOT_TOKENS as u64)
            .map(|e| token(&signer, &hot_lock, e))
            .collect(),
    );
    let base = Run {
        fence: fence.clone(),
        table: table.clone(),
        signer: signer.clone(),
        hot_tokens,
        adapter: false,
        hot: false,
    };
    let mut rows = Vec::new();
    for &clients in &args.clients {
        for hot in [false, true] {
            rows.push(raw_and_adapter(&base, clients, hot, max_clients, args.duration).await?);
        }
    }
    let client = fence.pool().get().await?;
    client
        .batch_execute(&format!(
            "BEGIN; SELECT palisade_drop_guard('{TABLE}'); DROP TABLE {TABLE}; COMMIT"
        ))
        .await?;
    print_postgres_rows(&rows, json);
    Ok(())
}

/// One row of the PostgreSQL table: `clients` writing distinct rows or (`hot`) one row, raw
/// SQL first, then the adapter, each on a freshly reset table.
async fn raw_and_adapter(
    base: &Run,
    clients: usize,
    hot: bool,
    max_clients: usize,
    duration: Duration,
) -> anyhow::Result<Row> {
    let mut results = [0.0, 0.0];
    let mut accepted = 0;
    for (index, adapter) in [false, true].into_iter().enumerate() {
        reset_table(&base.fence, &base.table, max_clients).await?;
        let run = Run {
            adapter,
            hot,
            ..base.clone()
        };
        let (count, ok) = run.measure(clients, duration).await?;
        results[index] = count;
        accepted = ok;
    }
    Ok(Row {
        clients,
        rows: if hot { "one hot row" } else { "distinct rows" },
        raw_per_sec: results[0],
        adapter_per_sec: results[1],
        ratio: results[1] / results[0],
        adapter_accepted: accepted,
    })
}

fn print_postgres_rows(rows: &[Row], json: bool) {
    if json {
        print_json(&serde_json::json!({ "postgres": rows }));
    } else {
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                vec![
                    r.clients.to_string(),
                    r.rows.to_string(),
                    format!("{:.0}", r.raw_per_sec),
                    format!("{:.0}", r.adapter_per_sec),
                    format!("{:.1}%", r.ratio * 100.0),
                ]
            })
            .collect();
        print_table(
            &["CLIENTS", "ROWS", "RAW/s", "ADAPTER/s", "ADAPTER/RAW"],
            &table,
        );
    }
}

async fn reset_table(
    fence: &PostgresFence,
    table: &GuardedTable,
    clients: usize,
) -> anyhow::Result<()> {
    let client = fence.pool().get().await?;
    let rows = clients as i64 * ROWS_PER_CLIENT;
    client
        .batch_execute(&format!(
            "SELECT palisade_drop_guard(oid) FROM pg_class WHERE oid = to_regclass('{TABLE}');
             DROP TABLE IF EXISTS {TABLE};
             DELETE FROM palisade_presented_tokens WHERE lock LIKE 'bench/%';
             CREATE TABLE {TABLE} (id bigint PRIMARY KEY, lock text NOT NULL,
                                   payload text NOT NULL, last_fence bigint NOT NULL DEFAULT 0);
             INSERT INTO {TABLE} (id, lock, payload)
             SELECT g, CASE WHEN g = 0 THEN 'bench/hot'
                            ELSE 'bench/' || ((g - 1) / {ROWS_PER_CLIENT}) END, ''
             FROM generate_series(0, {rows}) g;"
        ))
        .await?;
    client
        .batch_execute(&format!("VACUUM ANALYZE {TABLE}"))
        .await?;
    drop(client); // installing the guard takes a connection of its own
    table.install_guard(fence, false).await?;
    Ok(())
}

#[derive(Clone)]
struct Run {
    fence: PostgresFence,
    table: GuardedTable,
    signer: Arc<TokenSigner>,
    hot_tokens: Arc<Vec<String>>,
    adapter: bool,
    hot: bool,
}

impl Run {
    /// Writes per second and accepted writes, over `duration`.
    async fn measure(&self, clients: usize, duration: Duration) -> anyhow::Result<(f64, usize)> {
        let hot_epoch = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + duration;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for client in 0..clients {
            let (run, hot_epoch, accepted) = (self.clone(), hot_epoch.clone(), accepted.clone());
            tasks.push(tokio::spawn(async move {
                run.client_loop(client, deadline, &hot_epoch, &accepted)
                    .await
            }));
        }
        let mut writes = 0;
        for task in tasks {
            writes += task.await??;
        }
        let elapsed = started.elapsed().as_secs_f64();
        Ok((writes as f64 / elapsed, accepted.load(Ordering::Relaxed)))
    }

    async fn client_loop(
        &self,
        client: usize,
        deadline: Instant,
        hot_epoch: &AtomicU64,
        accepted: &AtomicUsize,
    ) -> anyhow::Result<u64> {
        let lock = LockName::new(format!("bench/{client}")).unwrap();
        // The raw runs hold one pooled connection for the whole run; the adapter takes one from
        // the same pool per write (as an application would).
        let raw = if self.adapter {
            None
        } else {
            let client = self.fence.pool().get().await?;
            let update = format!(
                "UPDATE {TABLE} SET payload = $3, last_fence = $2 \
                 WHERE id = $1 AND last_fence < $2 AND lock = $4 RETURNING id"
            );
            let statement = client.prepare_cached(&update).await?;
            Some((client, statement))
        };
        let mut writes = 0u64;
        let mut epoch = 0u64;
        let mut owner_token = String::new();
        while Instant::now() < deadline {
            let (id, write_epoch, token, write_lock) = if self.hot {
                let epoch = hot_epoch.fetch_add(1, Ordering::Relaxed) + 1;
                let Some(token) = self.hot_tokens.get(epoch as usize - 1) else {
                    break; // out of pre-signed tokens: the run ends early
                };
                (
                    0i64,
                    epoch,
                    token.clone(),
                    LockName::new("bench/hot").unwrap(),
                )
            } else {
                // An owner writes each of its rows once per epoch, then takes the next epoch.
                let n = (writes as i64) % ROWS_PER_CLIENT;
                if n == 0 {
                    epoch += 1;
                    owner_token = token(&self.signer, &lock, epoch);
                }
                let id = 1 + client as i64 * ROWS_PER_CLIENT + n;
                (id, epoch, owner_token.clone(), lock.clone())
            };
            let payload = "x";
            if let Some((client, statement)) = &raw {
                let epoch = write_epoch as i64;
                client
                    .query_opt(statement, &[&id, &epoch, &payload, &write_lock.as_str()])
                    .await?;
            } else {
                let outcome = self
                    .table
                    .update(&self.fence, &write_lock, &id, &token, &payload)
                    .await?;
                if matches!(outcome, Outcome::Accepted { .. }) {
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            }
            writes += 1;
        }
        Ok(writes)
    }
}

#[derive(Args)]
pub struct ResourceBenchArgs {
    /// Concurrent HTTP clients, each with its own connection.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

#[derive(Serialize)]
struct ResourceReport {
    clients: usize,
    writes: u64,
    rejected: u64,
    puts_per_sec: f64,
    fsyncs_per_sec: f64,
    puts_per_fsync: f64,
}

/// Fenced PUTs per second against a reference store started in a temp dir (strict mode, each
/// client an owner writing distinct keys under its epoch), next to the fdatasync rate of the
/// same directory.
pub async fn run_resource(args: ResourceBenchArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    let dir = tempfile::tempdir()?;
    let probe = dir.path().to_path_buf();
    let fsyncs_per_sec = tokio::task::spawn_blocking(move || measure_fdatasync(&probe)).await??;
    let signer = TokenSigner::from_secret_bytes(&[43; 32]);
    let key_file = dir.path().join("trusted.keys");
    std::fs::write(&key_file, encode_public_key(&signer.verifying_key()))?;
    let config = ResourceConfig {
        data_dir: dir.path().join("store"),
        listen: "127.0.0.1:0".parse()?,
        mode: FenceMode::Strict,
        keys: KeySource::File(key_file),
        principals: Vec::new(),
        revoked_keys: Vec::new(),
        coordinator_ca: None,
        key_refresh: palisade_resource::DEFAULT_KEY_REFRESH,
        effects_admin_secret: None,
        tls: None,
    };
    let resource = palisade_resource::start(config).await?;
    let base = format!("http://{}", resource.local_addr);
    let started = Instant::now();
    let (writes, rejected) = fenced_puts(&base, &signer, args.clients, args.duration).await?;
    let elapsed = started.elapsed().as_secs_f64();
    resource.shutdown().await;
    let puts_per_sec = writes as f64 / elapsed;
    let report = ResourceReport {
        clients: args.clients,
        writes,
        rejected,
        puts_per_sec,
        fsyncs_per_sec,
        puts_per_fsync: puts_per_sec / fsyncs_per_sec,
    };
    if json {
        print_json(&serde_json::to_value(&report)?);
    } else {
        print_fields(&[
            ("clients", report.clients.to_string()),
            ("fenced PUTs", report.writes.to_string()),
            ("rejected", report.rejected.to_string()),
            ("PUTs/s", format!("{:.0}", report.puts_per_sec)),
            ("fdatasync/s", format!("{:.0}", report.fsyncs_per_sec)),
            ("PUTs/fsync", format!("{:.2}", report.puts_per_fsync)),
        ]);
    }
    Ok(())
}

/// `clients` clients, each writing new keys of its own lock with a valid token until
/// `duration` has passed; returns the writes and how many were rejected.
async fn fenced_puts(
    base: &str,
    signer: &TokenSigner,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<(u64, u64)> {
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for client in 0..clients {
        let lock = LockName::new(format!("bench/{client}"))?;
        let token = token(signer, &lock, 1);
        let url = format!("{base}/v1/kv/bench%2F{client}");
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let (mut writes, mut rejected) = (0u64, 0u64);
            while Instant::now() < deadline {
                let response = http
                    .put(format!("{url}/{writes}"))
                    .header("Palisade-Token", &token)
                    .body("value")
                    .send()
                    .await?;
                if !response.status().is_success() {
                    rejected += 1;
                }
                writes += 1;
            }
            anyhow::Ok((writes, rejected))
        }));
    }
    let (mut writes, mut rejected) = (0, 0);
    for task in tasks {
        let (w, r) = task.await??;
        writes += w;
        rejected += r;
    }
    Ok((writes, rejected))
}
