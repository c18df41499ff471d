//! `palisade bench sql-token`: what binding a SQL writer to its token costs per write
//! (migration 11), against the plain statement with a bare epoch, side by side in one run.
//!
//! One connection, one owner: a loop of `--updates` fenced updates of distinct rows, first with
//! the plain statement on a table that takes a bare epoch, then with the documented token
//! statement on a table that requires tokens (`palisade_present_token` reads the lock and epoch
//! from the token; the trigger checks them). Each pair runs `--runs` times on fresh tables; the
//! medians and their ratio are reported.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use palisade_core::{Epoch, HolderId, LockName, Principal, TokenSigner, TokenVerifier};
use palisade_fence::{FenceMode, Verifier};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};
use serde::Serialize;
use tokio::time::Instant;

use palisade_cli_common::output::{print_fields, print_json};

const PLAIN_TABLE: &str = "palisade_bench_plain";
const TOKEN_TABLE: &str = "palisade_bench_token";
const LOCK: &str = "bench/sql-token";

#[derive(Args)]
pub struct SqlTokenBenchArgs {
    /// PostgreSQL URL (the bench creates and drops its own tables; run as their owner).
    #[arg(long, env = "PALISADE_BENCH_POSTGRES_URL")]
    url: String,
    /// Updates per loop (distinct rows, one owner).
    #[arg(long, default_value_t = 20_000)]
    updates: i64,
    /// Runs of each loop; the medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

#[derive(Serialize)]
struct Report {
    updates: i64,
    runs: usize,
    plain_seconds: Vec<f64>,
    token_seconds: Vec<f64>,
    plain_median_us_per_update: f64,
    token_median_us_per_update: f64,
    token_over_plain: f64,
}

pub async fn run(args: SqlTokenBenchArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=10_000_000).contains(&args.updates),
        "--updates is 1 to 10000000"
    );
    anyhow::ensure!((1..=99).contains(&args.runs), "--runs is 1 to 99");
    let verifier = std::sync::Arc::new(Verifier::new(TokenVerifier::new([])));
    let fence = PostgresFence::connect(&args.url, 2, FenceMode::Strict, verifier)
        .await
        .context("connect to PostgreSQL")?;
    let signer = TokenSigner::from_secret_bytes(&[43; 32]);
    let lock = LockName::new(LOCK).unwrap();
    let token = signer.sign(
        &lock,
        Epoch(7),
        &HolderId::new("bench").unwrap(),
        &Principal::anonymous(),
        0,
    );
    let (mut plain, mut bound) = (Vec::new(), Vec::new());
    for _ in 0..args.runs {
        plain.push(
            timed_loop(&fence, PLAIN_TABLE, &token, args.updates)
                .await?
                .as_secs_f64(),
        );
        bound.push(
            timed_loop(&fence, TOKEN_TABLE, &token, args.updates)
                .await?
                .as_secs_f64(),
        );
    }
    let client = fence.pool().get().await?;
    for table in [PLAIN_TABLE, TOKEN_TABLE] {
        client
            .batch_execute(&format!(
                "BEGIN; SELECT palisade_drop_guard('{table}'); DROP TABLE {table}; COMMIT"
            ))
            .await?;
    }
    let per_update = |seconds: &[f64]| median(seconds) * 1e6 / args.updates as f64;
    let report = Report {
        updates: args.updates,
        runs: args.runs,
        plain_median_us_per_update: per_update(&plain),
        token_median_us_per_update: per_update(&bound),
        token_over_plain: median(&bound) / median(&plain),
        plain_seconds: plain,
        token_seconds: bound,
    };
    print_report(&report, json);
    Ok(())
}

/// A fresh guarded table of `updates` rows (requiring tokens when it is the token table), then
/// the seconds one connection takes to update every row once, fenced.
async fn timed_loop(
    fence: &PostgresFence,
    table: &str,
    token: &str,
    updates: i64,
) -> anyhow::Result<Duration> {
    let client = fence.pool().get().await?;
    client
        .batch_execute(&format!(
            "SELECT palisade_drop_guard(oid) FROM pg_class WHERE oid = to_regclass('{table}');
             DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL,
                                   last_fence bigint NOT NULL DEFAULT 0);
             INSERT INTO {table} (id, payload) SELECT g, '' FROM generate_series(1, {updates}) g;
             SELECT palisade_learn_floor('{LOCK}', 0);"
        ))
        .await?;
    // Alone: VACUUM refuses the implicit transaction of several statements.
    client
        .batch_execute(&format!("VACUUM ANALYZE {table}"))
        .await?;
    drop(client);
    let guarded = GuardedTable::new(
        table,
        "id",
        "payload",
        RowLock::Table(LockName::new(LOCK).unwrap()),
    )?;
    guarded.install_guard(fence, false).await?;
    guarded.require_token(fence, table == TOKEN_TABLE).await?;
    let client = fence.pool().get().await?;
    let sql = if table == TOKEN_TABLE {
        format!(
            "UPDATE {table} SET payload = $2, last_fence = t.epoch \
             FROM palisade_present_token($1) AS t(epoch) \
             WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) t.epoch"
        )
    } else {
        format!(
            "UPDATE {table} SET payload = $2, last_fence = $1::text::bigint \
             WHERE id = $3 AND last_fence OPERATOR(pg_catalog.<) $1::text::bigint"
        )
    };
    let statement = client.prepare(&sql).await?;
    let epoch = "7";
    let argument = if table == TOKEN_TABLE { token } else { epoch };
    let started = Instant::now();
    for id in 1..=updates {
        let written = client.execute(&statement, &[&argument, &"x", &id]).await?;
        anyhow::ensure!(written == 1, "row {id} of {table} was not written");
    }
    Ok(started.elapsed())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn print_report(report: &Report, json: bool) {
    if json {
        print_json(&serde_json::json!({ "sql_token": report }));
        return;
    }
    print_fields(&[
        ("updates per loop", report.updates.to_string()),
        ("runs", report.runs.to_string()),
        (
            "plain statement",
            format!(
                "{:.1} µs/update (median)",
                report.plain_median_us_per_update
            ),
        ),
        (
            "token statement",
            format!(
                "{:.1} µs/update (median)",
                report.token_median_us_per_update
            ),
        ),
        ("token / plain", format!("{:.2}", report.token_over_plain)),
    ]);
}
