//! Asking the boundaries what they hold, and probing them. Every request has a timeout; a
//! boundary that does not answer is reported, never waited for.

use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::Value;

use crate::fences::PresentedToken;
use crate::floors::{StoredFloor, MAX_FLOORS_READ};
use crate::guard::{self, Binding};
use crate::policy::Boundary;
use crate::{BoundaryReport, Probe};

/// How long one boundary may take to answer one request (and PostgreSQL to connect).
pub const TIMEOUT: Duration = Duration::from_secs(3);
/// Most recent rejections a report carries per boundary.
pub const MAX_REJECTIONS_SHOWN: usize = 20;
/// Most locks a boundary is asked about in one audit (the rest are left out, and said so).
pub const MAX_LOCKS_ASKED: usize = 1_000;
/// Longest a boundary may take to answer everything one audit asks it (a boundary that
/// answers each request just inside [`TIMEOUT`] cannot hold the audit for long).
pub const OBSERVE_BUDGET: Duration = Duration::from_secs(15);
/// Largest answer read from a boundary.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// An HTTP client fit for asking boundaries.
/// The client follows no redirect: a boundary answers for itself, it does not send the
/// coordinator elsewhere.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client with timeouts only")
}

fn encode(lock: &str) -> String {
    utf8_percent_encode(lock, NON_ALPHANUMERIC).to_string()
}

/// What `boundary` holds for `locks`.
pub async fn observe(
    http: &reqwest::Client,
    boundary: &Boundary,
    patterns: Vec<String>,
    locks: &[String],
) -> BoundaryReport {
    let mut report = BoundaryReport {
        kind: boundary.kind().to_owned(),
        target: boundary.describe(),
        patterns,
        ..BoundaryReport::default()
    };
    let locks = &locks[..locks.len().min(MAX_LOCKS_ASKED)];
    let asking = async {
        match boundary {
            Boundary::Resource { url } => observe_resource(http, url, locks, &mut report).await,
            Boundary::Postgres {
                table,
                url,
                writers,
            } => observe_postgres(url, table, writers, locks, &mut report).await,
            Boundary::Effects { url, .. } => observe_effects(http, url, &mut report).await,
        }
    };
    let outcome = tokio::time::timeout(OBSERVE_BUDGET, asking)
        .await
        .unwrap_or_else(|_| Err(format!("no complete answer within {OBSERVE_BUDGET:?}")));
    match outcome {
        Ok(()) => report.reachable = true,
        Err(error) => report.error = Some(error),
    }
    report
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let response = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {}", without_url(&e)))?;
    let status = response.status();
    let body = read_body_limited(response)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let body: Value =
        serde_json::from_slice(&body).map_err(|_| format!("GET {url}: not JSON ({status})"))?;
    if !status.is_success() {
        return Err(format!("GET {url}: {status}: {body}"));
    }
    Ok(body)
}

/// The answer's body, at most [`MAX_ANSWER_BYTES`].
async fn read_body_limited(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| without_url(&e))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!("an answer over {MAX_ANSWER_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// What went wrong with a request, without the URL reqwest repeats (the caller names it).
fn without_url(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "timed out".into()
    } else if error.is_connect() {
        "cannot connect".into()
    } else if error.is_decode() {
        "not the expected JSON".into()
    } else {
        "request failed".into()
    }
}

async fn observe_resource(
    http: &reqwest::Client,
    url: &str,
    locks: &[String],
    report: &mut BoundaryReport,
) -> Result<(), String> {
    let base = url.trim_end_matches('/');
    let info = get_json(http, &format!("{base}/v1/info")).await?;
    // `null`, or why the store refuses writes (older stores said `false`/`true`).
    report.restore_required = Some(!matches!(
        &info["restore_required"],
        Value::Null | Value::Bool(false)
    ));
    report.restore_floor = palisade_core::json::read(&info["restore_floor"]);
    report.trusted_keys = info["trusted_keys"]
        .as_array()
        .map(|keys| {
            keys.iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for lock in locks {
        let fence = get_json(http, &format!("{base}/v1/fences/{}", encode(lock))).await?;
        if let Some(fence) = palisade_core::json::read(&fence["fence"]) {
            report.fences.insert(lock.clone(), fence);
        }
    }
    // Older stores have no /v1/rejections: their fences still count.
    if let Ok(rejections) = get_json(http, &format!("{base}/v1/rejections")).await {
        if let Some(totals) = rejections["totals"].as_object() {
            report.rejection_totals = totals
                .iter()
                .filter_map(|(reason, n)| Some((reason.clone(), n.as_u64()?)))
                .collect();
        }
        if let Some(recent) = rejections["recent"].as_array() {
            report.recent_rejections = recent.iter().take(MAX_REJECTIONS_SHOWN).cloned().collect();
        }
    }
    Ok(())
}

async fn observe_effects(
    http: &reqwest::Client,
    url: &str,
    report: &mut BoundaryReport,
) -> Result<(), String> {
    let base = url.trim_end_matches('/');
    let stats = get_json(http, &format!("{base}/v1/effects/stats")).await?;
    report.operations = stats["by_state"]
        .as_object()
        .map(|states| {
            states
                .iter()
                .filter_map(|(state, n)| Some((state.clone(), n.as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    Ok(())
}

/// The audit's own search_path: a role's or a database's setting (`ALTER ROLE audit SET
/// search_path = decoy, public`) would make the policy's table name, and Palisade's tables,
/// resolve to a decoy schema with a guarded copy while the real table is open. An unqualified
/// name in the policy means `public`'s; name another schema as `schema.table`.
pub const AUDIT_SEARCH_PATH: &str = "pg_catalog, public";

/// Connects with [`TIMEOUT`] and sets [`AUDIT_SEARCH_PATH`]; the connection is driven by a
/// task that ends with the client.
async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let redacted = crate::policy::redact_url(url);
    let connecting = tokio_postgres::connect(url, tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(TIMEOUT, connecting)
        .await
        .map_err(|_| format!("{redacted}: no answer within {TIMEOUT:?}"))?
        .map_err(|e| format!("{redacted}: {}", pg_text(&e)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
        .batch_execute(&format!("SET search_path = {AUDIT_SEARCH_PATH}"))
        .await
        .map_err(|e| format!("{redacted}: {}", pg_text(&e)))?;
    Ok(client)
}

fn pg_text(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}

/// `schema.table` or `column` quoted, accepting only plain identifiers (the adapter's rule).
fn quote(identifier: &str) -> Result<String, String> {
    palisade_fence_postgres::quote_identifier(identifier).map_err(|e| e.to_string())
}

async fn binding(client: &tokio_postgres::Client, table: &str) -> Result<Option<Binding>, String> {
    let exists = client
        .query_opt("SELECT to_regclass($1)::text", &[&table])
        .await
        .map_err(|e| pg_text(&e))?
        .and_then(|row| row.get::<_, Option<String>>(0));
    if exists.is_none() {
        return Err(format!("table {table} does not exist"));
    }
    let registry = client
        .query_opt(
            "SELECT relnamespace::oid FROM pg_class \
             WHERE oid = to_regclass('palisade_guarded_tables')",
            &[],
        )
        .await
        .map_err(|e| pg_text(&e))?
        .map(|row| row.get::<_, u32>(0));
    let Some(schema) = registry else {
        return Ok(None);
    };
    // Whether the triggers are Palisade's and fire always is checked by `guard::check`.
    let row = client
        .query_opt(
            "SELECT g.table_lock, g.lock_column, g.key_column, g.guard_rows, \
                    coalesce((to_jsonb(g) ->> 'require_token')::boolean, false) \
             FROM palisade_guarded_tables g WHERE g.tbl = $1::text::regclass::oid",
            &[&table],
        )
        .await
        .map_err(|e| pg_text(&e))?;
    Ok(row.map(|row| Binding {
        table_lock: row.get(0),
        lock_column: row.get(1),
        key_column: row.get(2),
        guard_rows: row.get(3),
        require_token: row.get(4),
        schema,
    }))
}

async fn observe_postgres(
    url: &str,
    table: &str,
    writers: &[String],
    locks: &[String],
    report: &mut BoundaryReport,
) -> Result<(), String> {
    let client = connect(url).await?;
    let Some(binding) = binding(&client, table).await? else {
        report.guard_installed = Some(false);
        return Ok(());
    };
    report.guard_installed = Some(true);
    report.resolved_table = client
        .query_opt(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
            &[&table],
        )
        .await
        .map_err(|e| pg_text(&e))?
        .map(|row| row.get(0));
    report.problems = guard::check(&client, table, &binding, writers).await?;
    report.floors = stored_floors(&client).await?;
    let t = quote(table)?;
    for lock in locks {
        // A deleted row's fence stays in palisade_row_fences (its tombstone).
        let fence: Option<i64> = match (&binding.table_lock, &binding.lock_column) {
            (Some(table_lock), _) if table_lock == lock => client
                .query_one(
                    &format!(
                        "SELECT greatest( \
                           (SELECT max(last_fence) FROM {t}), \
                           (SELECT max(fence) FROM palisade_row_fences \
                              WHERE tbl = $1::text::regclass::oid))"
                    ),
                    &[&table],
                )
                .await
                .map_err(|e| pg_text(&e))?
                .get(0),
            (_, Some(column)) => client
                .query_one(
                    &format!(
                        "SELECT greatest( \
                           (SELECT max(last_fence) FROM {t} WHERE {}::text = $1), \
                           (SELECT max(fence) FROM palisade_row_fences \
                              WHERE tbl = $2::text::regclass::oid \
                                AND to_jsonb(palisade_row_fences) ->> 'lock' = $1))",
                        quote(column)?
                    ),
                    &[lock, &table],
                )
                .await
                .map_err(|e| pg_text(&e))?
                .get(0),
            _ => None,
        };
        if let Some(fence) = fence {
            report.fences.insert(lock.clone(), fence.max(0) as u64);
        }
    }
    report.presented_tokens = presented_tokens(&client, locks).await?;
    refusals(&client, report).await;
    Ok(())
}

/// The stale writes the database refused and its writers recorded (migration 12; none
/// before it, or for a role not granted `palisade_recent_refusals`), newest first, each with
/// the token it carried — which the coordinator verifies before anyone is shown it
/// ([`verify_refusals`]) — and the number recorded so far.
async fn refusals(client: &tokio_postgres::Client, report: &mut BoundaryReport) {
    let limit = i32::try_from(MAX_REJECTIONS_SHOWN).unwrap_or(i32::MAX);
    let Ok(rows) = client
        .query(
            "SELECT at_ms, lock, epoch, fence, reason, token FROM palisade_recent_refusals($1)",
            &[&limit],
        )
        .await
    else {
        return;
    };
    report.recent_rejections = rows
        .iter()
        .map(|row| {
            let (at_ms, lock, epoch, fence): (i64, String, i64, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let (reason, token): (String, String) = (row.get(4), row.get(5));
            serde_json::json!({
                "at_ms": at_ms,
                "lock": lock,
                "epoch": epoch.to_string(),
                "fence": fence.to_string(),
                "reason": reason,
                "token": token,
            })
        })
        .collect();
    if let Ok(row) = client
        .query_one("SELECT palisade_refusal_count()", &[])
        .await
    {
        let recorded = row.get::<_, i64>(0).max(0) as u64;
        report
            .rejection_totals
            .insert("stale_epoch".into(), recorded);
    }
}

/// Keeps the refusals a PostgreSQL boundary recorded whose token `verifier` accepts for the
/// recorded lock and epoch, without the token (a bearer credential wherever the newer owner
/// has not written); a refusal whose token does not verify was recorded by a role with a
/// forged token: dropped, counted as `unverified`, and reported (`forged_refusal`).
pub fn verify_refusals(report: &mut BoundaryReport, verifier: &palisade_core::TokenVerifier) {
    let mut forged = 0_u64;
    report.recent_rejections.retain_mut(|rejection| {
        let Some(token) = rejection
            .as_object_mut()
            .and_then(|fields| fields.remove("token"))
        else {
            return true; // a reference store's: it verified the token itself
        };
        let lock = palisade_core::LockName::new(rejection["lock"].as_str().unwrap_or_default());
        let genuine = lock.ok().is_some_and(|lock| {
            verifier
                .verify(token.as_str().unwrap_or_default(), Some(&lock))
                .is_ok_and(|claims| {
                    palisade_core::json::read(&rejection["epoch"]) == Some(claims.epoch.0)
                })
        });
        forged += u64::from(!genuine);
        genuine
    });
    if forged > 0 {
        report.rejection_totals.insert("unverified".into(), forged);
        report.problems.push(crate::problem(
            crate::Severity::Warning,
            "forged_refusal",
            format!(
                "{forged} of the latest refusals recorded in this database carry a token this                  coordinator did not sign: a role that may run palisade_record_refusal recorded                  them (they are not shown); REVOKE EXECUTE ON FUNCTION                  palisade_record_refusal(text) from roles that do not write"
            ),
            "SELECT lock, epoch, token FROM palisade_recent_refusals(20)",
        ));
    }
}

/// The greatest token presented for each of `locks` (held now), and for the locks nobody
/// holds, the greatest [`MAX_FLOORS_READ`] of them (migration 11; none before it): a token
/// that does not verify is poisoned whether its lock is held or not.
async fn presented_tokens(
    client: &tokio_postgres::Client,
    locks: &[String],
) -> Result<Vec<PresentedToken>, String> {
    let rows = client
        .query(
            "(SELECT p.lock, p.epoch, p.token FROM palisade_presented_tokens p \
              WHERE p.lock = ANY($1)) \
             UNION \
             (SELECT p.lock, p.epoch, p.token FROM palisade_presented_tokens p \
              ORDER BY p.epoch DESC LIMIT $2)",
            &[&locks, &MAX_FLOORS_READ],
        )
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
            return Ok(Vec::new())
        }
        Err(error) => return Err(pg_text(&error)),
    };
    Ok(rows
        .iter()
        .map(|row| PresentedToken {
            lock: row.get(0),
            epoch: row.get::<_, i64>(1).max(0) as u64,
            token: row.get(2),
        })
        .collect())
}

/// The floors the database enforces, the highest first (with their statements since
/// migration 10).
async fn stored_floors(client: &tokio_postgres::Client) -> Result<Vec<StoredFloor>, String> {
    let with_statements: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute \
             WHERE attrelid = to_regclass('palisade_lock_floors') AND attname = 'statement')",
            &[],
        )
        .await
        .map_err(|e| pg_text(&e))?
        .get(0);
    let statement = if with_statements {
        "statement"
    } else {
        "NULL::text"
    };
    let rows = client
        .query(
            &format!(
                "SELECT lock, floor, {statement} FROM palisade_lock_floors \
                 ORDER BY floor DESC, lock LIMIT $1"
            ),
            &[&MAX_FLOORS_READ],
        )
        .await
        .map_err(|e| pg_text(&e))?;
    Ok(rows
        .iter()
        .map(|row| StoredFloor {
            lock: row.get(0),
            floor: row.get::<_, i64>(1).max(0) as u64,
            statement: row.get(2),
        })
        .collect())
}

/// Proves a guarded table refuses a write that does not raise the fence: in a transaction
/// that is always rolled back, an `UPDATE … SET last_fence = last_fence` of one row (skipping
/// rows others have locked, so it never waits) must fail in the guard. No row changes either
/// way.
pub async fn probe_postgres(url: &str, table: &str) -> Probe {
    let mut client = match connect(url).await {
        Ok(client) => client,
        Err(detail) => return Probe::Failed { detail },
    };
    let transaction = match client.transaction().await {
        Ok(transaction) => transaction,
        Err(e) => {
            return Probe::Failed {
                detail: pg_text(&e),
            }
        }
    };
    if let Err(e) = transaction
        .batch_execute("SET LOCAL lock_timeout = '1s'; SET LOCAL statement_timeout = '5s'")
        .await
    {
        return Probe::Failed {
            detail: pg_text(&e),
        };
    }
    let t = match quote(table) {
        Ok(t) => t,
        Err(detail) => return Probe::Failed { detail },
    };
    // The row's lock floor is recorded first (0: nothing superseded), inside the transaction
    // that is rolled back: the refusal must then come from the guard itself (P5001), not from a
    // floor this database has not learned yet (P5008), which would pass a table whose guard
    // trigger is gone.
    let row = match learn_probe_floor(&transaction, table, &t).await {
        Ok(row) => row,
        Err(detail) => {
            let _ = transaction.rollback().await;
            return Probe::Failed { detail };
        }
    };
    let outcome = match row {
        // The row whose lock's floor was just recorded (locked by that read).
        Some(ctid) => {
            let statement =
                format!("UPDATE {t} SET last_fence = last_fence WHERE ctid = $1::text::tid");
            transaction.execute(&statement, &[&ctid]).await
        }
        None => {
            let statement = format!(
                "UPDATE {t} SET last_fence = last_fence WHERE ctid = \
                 (SELECT ctid FROM {t} LIMIT 1 FOR UPDATE SKIP LOCKED)"
            );
            transaction.execute(&statement, &[]).await
        }
    };
    // Dropping the transaction rolls it back; say so explicitly.
    let _ = transaction.rollback().await;
    probe_outcome(table, outcome)
}

/// What the probe's UPDATE showed.
fn probe_outcome(table: &str, outcome: Result<u64, tokio_postgres::Error>) -> Probe {
    match outcome {
        Err(e) if e.code().is_some_and(|c| c.code() == GUARD_UPDATE_SQLSTATE) => Probe::Refused {
            detail: format!(
                "an UPDATE of {table} that does not raise last_fence was refused: {} (rolled back)",
                pg_text(&e)
            ),
        },
        Err(e) if e.code().is_some_and(|c| c.code().starts_with("P5")) => Probe::Failed {
            detail: format!(
                "an UPDATE of {table} that does not raise last_fence was refused, but not by the \
                 guard ({}): that proves nothing about the guard",
                pg_text(&e)
            ),
        },
        Err(e) => Probe::Failed {
            detail: pg_text(&e),
        },
        Ok(0) => Probe::Failed {
            detail: format!("{table} has no row the probe could lock"),
        },
        Ok(_) => Probe::Accepted {
            detail: format!(
                "an UPDATE of {table} that does not raise last_fence went through (rolled back): \
                 the guard is missing or disabled"
            ),
        },
    }
}

/// SQLSTATE of the guard refusing an UPDATE that does not raise `last_fence`.
const GUARD_UPDATE_SQLSTATE: &str = "P5001";

/// Records floor 0 for the lock of the row the probe will update (when the database has lock
/// floors, migration 8), in the probe's transaction; with a lock column, the row it chose and
/// locked (its `ctid`), which the probe then updates.
async fn learn_probe_floor(
    transaction: &tokio_postgres::Transaction<'_>,
    table: &str,
    quoted: &str,
) -> Result<Option<String>, String> {
    let has_floors: bool = transaction
        .query_one(
            "SELECT to_regprocedure('palisade_learn_floor(text, bigint)') IS NOT NULL",
            &[],
        )
        .await
        .map_err(|e| pg_text(&e))?
        .get(0);
    if !has_floors {
        return Ok(None);
    }
    let binding = transaction
        .query_opt(
            "SELECT table_lock, lock_column FROM palisade_guarded_tables \
             WHERE tbl = $1::text::regclass",
            &[&table],
        )
        .await
        .map_err(|e| pg_text(&e))?;
    // A table never guarded has no floor trigger either: nothing to learn.
    let Some(binding) = binding else {
        return Ok(None);
    };
    let (table_lock, lock_column): (Option<String>, Option<String>) =
        (binding.get(0), binding.get(1));
    let (lock, row) = match (table_lock, lock_column) {
        (Some(lock), _) => (Some(lock), None),
        (None, Some(column)) => {
            let column = quote(&column)?;
            let select = format!(
                "SELECT ctid::text, {column}::text FROM {quoted} LIMIT 1 FOR UPDATE SKIP LOCKED"
            );
            match transaction
                .query_opt(&select, &[])
                .await
                .map_err(|e| pg_text(&e))?
            {
                Some(found) => (Some(found.get(1)), Some(found.get(0))),
                None => (None, None),
            }
        }
        (None, None) => (None, None),
    };
    if let Some(lock) = lock {
        transaction
            .execute("SELECT palisade_learn_floor($1, 0)", &[&lock])
            .await
            .map_err(|e| pg_text(&e))?;
    }
    Ok(row)
}

/// A name no boundary can predict: 16 random hex digits.
pub fn unpredictable() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    palisade_core::hex(&bytes)
}

/// A random number below `n` (`n` > 0), from the operating system's random source.
fn below(n: usize) -> usize {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    (u64::from_le_bytes(bytes) % n as u64) as usize
}

/// `sample` with each letter and digit replaced by a random one of its kind (lower case,
/// upper case, digit), everything else kept: a name of the same shape nobody can predict.
pub fn shaped_like(sample: &str) -> String {
    const LOWER: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    const DIGITS: &[u8] = b"0123456789";
    sample
        .chars()
        .map(|c| {
            let set = match c {
                'a'..='z' => LOWER,
                'A'..='Z' => UPPER,
                '0'..='9' => DIGITS,
                _ => return c,
            };
            char::from(set[below(set.len())])
        })
        .collect()
}

/// A name shaped like one of `samples` (the boundary's real traffic: lock names, keys), or
/// with none, `min..=max` random lower-case letters and digits. Never one of `samples`, and at
/// least `min` letters and digits (a short sample, `7`, is extended in its own kind, `58302917`):
/// few letters and digits could name a real lock or key.
pub fn traffic_like(samples: &[String], min: usize, max: usize) -> String {
    loop {
        let sample = match samples.len() {
            0 => {
                let length = min + below(max - min + 1);
                let alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
                (0..length)
                    .map(|_| alphabet.as_bytes()[below(alphabet.len())] as char)
                    .collect()
            }
            n => samples[below(n)].clone(),
        };
        let mut name = shaped_like(&sample);
        let kind = sample
            .chars()
            .rev()
            .find(char::is_ascii_alphanumeric)
            .unwrap_or('a');
        while name.chars().filter(char::is_ascii_alphanumeric).count() < min {
            name.push_str(&shaped_like(&kind.to_string()));
        }
        if !samples.contains(&name) {
            return name;
        }
    }
}

/// The lock the probe of a boundary uses, shaped like the locks the boundary really fences, so
/// that nothing tells a boundary it is probed: an exact name (a rule with no `*`) is probed on
/// that very lock (the probe acquires it like any owner; the caller passes no pattern while
/// the lock is held); a pattern's `*` is replaced by a part shaped like the one a lock the
/// boundary fences has there (`recent` locks, at least 8 letters and digits, never one of
/// theirs), or a random one.
/// `palisade-probe/RANDOM` only when that is no valid lock name or `accept` says another rule
/// decides it.
pub fn probe_lock(
    pattern: Option<&str>,
    recent: &[String],
    accept: impl Fn(&str) -> bool,
) -> String {
    let fallback = || format!("{}{}", crate::policy::PROBE_LOCK_PREFIX, unpredictable());
    let Some(pattern) = pattern else {
        return fallback();
    };
    let (prefix, suffix) = pattern.split_once('*').unwrap_or((pattern, ""));
    let parts: Vec<String> = recent
        .iter()
        .filter_map(|lock| lock.strip_prefix(prefix)?.strip_suffix(suffix))
        .filter(|part| !part.is_empty() && !part.contains('*'))
        .map(str::to_owned)
        .collect();
    let lock = if pattern.contains('*') {
        pattern.replace('*', &traffic_like(&parts, 8, 12))
    } else {
        pattern.to_owned()
    };
    if palisade_core::LockName::new(lock.as_str()).is_ok() && accept(&lock) {
        lock
    } else {
        fallback()
    }
}

/// What the store said to one write.
struct Answer {
    status: reqwest::StatusCode,
    body: Value,
}

/// Proves a reference store refuses an obsolete epoch with the reason `stale_epoch`: `newer`
/// (a token of `lock`) writes a random key, then `older` (an earlier epoch of the same lock)
/// must be refused on that key — and, in strict mode, on a random key nobody has written
/// (the lock-wide rule). Activated stores are activated with `newer` first; sequenced ones
/// get sequence 1. A refusal for another reason proves nothing and fails the probe.
pub async fn probe_resource(
    http: &reqwest::Client,
    url: &str,
    lock: &str,
    older: (u64, &str),
    newer: (u64, &str),
) -> Probe {
    let base = url.trim_end_matches('/');
    let mode = match get_json(http, &format!("{base}/v1/info")).await {
        Ok(info) => info["mode"].as_str().unwrap_or("strict").to_owned(),
        Err(detail) => return Probe::Failed { detail },
    };
    let store = ProbedStore {
        http,
        base,
        lock,
        mode,
    };
    if store.mode == "activated" {
        if let Err(detail) = store.activate(newer.1).await {
            return Probe::Failed { detail };
        }
    }
    // Keys shaped like the ones the store's recent refusals name, and bodies like nothing in
    // particular: no constant marker a store could refuse alone.
    let keys = recent_keys(http, base).await;
    let (written, fresh) = (traffic_like(&keys, 6, 20), traffic_like(&keys, 6, 20));
    match store.put(&written, newer.1).await {
        Ok(answer) if answer.status.is_success() => {}
        Ok(answer) => {
            return Probe::Failed {
                detail: format!(
                    "the current epoch's write was refused ({} {}): does this store trust this \
                     coordinator's keys?",
                    answer.status, answer.body
                ),
            }
        }
        Err(detail) => return Probe::Failed { detail },
    }
    let mut attempts = vec![(written, "the key the newer epoch wrote")];
    if store.mode == "strict" {
        attempts.push((fresh, "a key nobody wrote (strict mode's lock-wide rule)"));
    }
    let mut refusals = Vec::new();
    for (key, which) in attempts {
        let what = format!(
            "PUT {base}/v1/kv/{lock}/{key} with epoch {} ({which})",
            older.0
        );
        match stale_refusal(&what, store.put(&key, older.1).await, older.0, newer.0) {
            Ok(refusal) => refusals.push(refusal),
            Err(verdict) => return verdict,
        }
    }
    Probe::Refused {
        detail: refusals.join("; "),
    }
}

/// The keys of the store's recent refusals (its real traffic's shape), at most 64.
async fn recent_keys(http: &reqwest::Client, base: &str) -> Vec<String> {
    let Ok(rejections) = get_json(http, &format!("{base}/v1/rejections")).await else {
        return Vec::new();
    };
    rejections["recent"]
        .as_array()
        .map(|recent| {
            recent
                .iter()
                .filter_map(|entry| entry["key"].as_str())
                .filter(|key| !key.is_empty() && key.len() <= 256)
                .take(64)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A reference store being probed: its URL without the trailing `/`, the probed lock, and the
/// store's mode.
struct ProbedStore<'a> {
    http: &'a reqwest::Client,
    base: &'a str,
    lock: &'a str,
    mode: String,
}

impl ProbedStore<'_> {
    /// Writes `probe` to `key` with `token` (and a sequence number in sequenced mode).
    async fn put(&self, key: &str, token: &str) -> Result<Answer, String> {
        let (base, lock) = (self.base, self.lock);
        let mut request = self
            .http
            .put(format!("{base}/v1/kv/{}/{}", encode(lock), encode(key)))
            .header("palisade-token", token)
            .body(traffic_like(&[], 8, 64));
        if self.mode == "sequenced" {
            request = request.header("palisade-seq", "1");
        }
        let response = request.send().await.map_err(|e| without_url(&e))?;
        let status = response.status();
        let body = read_body_limited(response).await.unwrap_or_default();
        let body = serde_json::from_slice(&body).unwrap_or_else(|_| {
            Value::String(String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned())
        });
        Ok(Answer { status, body })
    }

    /// Activates `token`'s epoch (activated mode).
    async fn activate(&self, token: &str) -> Result<(), String> {
        let answer = self
            .http
            .post(format!(
                "{}/v1/fences/{}/activate",
                self.base,
                encode(self.lock)
            ))
            .header("palisade-token", token)
            .send()
            .await
            .map_err(|e| without_url(&e))?;
        answer
            .status()
            .is_success()
            .then_some(())
            .ok_or_else(|| format!("activation answered {}", answer.status()))
    }
}

/// What the store's answer to the older epoch's write `what` proves: `Ok` with the refusal's
/// description when it is a `409 stale_epoch`, else the probe's verdict (accepted, or failed:
/// any other refusal proves nothing).
fn stale_refusal(
    what: &str,
    answer: Result<Answer, String>,
    older: u64,
    newer: u64,
) -> Result<String, Probe> {
    match answer {
        Ok(answer)
            if answer.status == reqwest::StatusCode::CONFLICT
                && answer.body["error"] == "stale_epoch" =>
        {
            Ok(format!(
                "epoch {older} refused after epoch {newer} wrote: {what}: 409 stale_epoch (fence {})",
                palisade_core::json::read(&answer.body["fence"])
                    .map_or_else(|| "?".to_owned(), |fence| fence.to_string())
            ))
        }
        Ok(answer) if answer.status.is_success() => Err(Probe::Accepted {
            detail: format!("{what}: ACCEPTED ({})", answer.status),
        }),
        Ok(answer) => Err(Probe::Failed {
            detail: format!(
                "{what}: {} {} — not a refusal as stale_epoch, so it proves nothing",
                answer.status, answer.body
            ),
        }),
        Err(detail) => Err(Probe::Failed {
            detail: format!("{what}: {detail}"),
        }),
    }
}

pub use palisade_fence_postgres::FenceProofs;

/// What a boundary witnesses at a coordinator's start: its highest fence, and for a
/// PostgreSQL database the signed proofs recorded in it. A reference store verifies every
/// token itself, so its fence is proof enough (`proofs` is `None`); a database takes any
/// number a writer with UPDATE puts in a fence column, so only what the coordinator signed
/// proves an epoch was issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witness {
    /// The greatest fence ([`highest_fence`]).
    pub fence: u64,
    /// The signed proofs, where the fence alone proves nothing.
    pub proofs: Option<FenceProofs>,
}

/// [`highest_fence`] of `boundary`, with the proofs of a PostgreSQL database.
pub async fn witness(http: &reqwest::Client, boundary: &Boundary) -> Result<Witness, String> {
    let fence = highest_fence(http, boundary).await?;
    let Boundary::Postgres { url, .. } = boundary else {
        return Ok(Witness {
            fence,
            proofs: None,
        });
    };
    let proofs = tokio::time::timeout(TIMEOUT, palisade_fence_postgres::fence_proofs(url))
        .await
        .map_err(|_| format!("no answer within {} s", TIMEOUT.as_secs()))?
        .map_err(|error| error.to_string())?;
    Ok(Witness {
        fence,
        proofs: Some(proofs),
    })
}

/// The greatest epoch `boundary` has accepted or fenced at, for any lock: a reference store's
/// (or its effects ledger's) `highest_fence` in `/v1/info`, a PostgreSQL database's Palisade
/// tables and guarded tables (`palisade_fence_postgres::highest_fence`). What a coordinator
/// must issue above (`palisade restore --floor-from`, and every single node's start). At most
/// [`TIMEOUT`] for a database; an HTTP boundary is bounded by `http`'s own timeouts.
pub async fn highest_fence(http: &reqwest::Client, boundary: &Boundary) -> Result<u64, String> {
    match boundary {
        Boundary::Resource { url } | Boundary::Effects { url, .. } => {
            let base = url.trim_end_matches('/');
            let info = get_json(http, &format!("{base}/v1/info")).await?;
            palisade_core::json::read(&info["highest_fence"]).ok_or_else(|| {
                format!("{base}/v1/info reports no highest fence (an older version?)")
            })
        }
        Boundary::Postgres { url, .. } => {
            tokio::time::timeout(TIMEOUT, palisade_fence_postgres::highest_fence(url))
                .await
                .map_err(|_| format!("no answer within {} s", TIMEOUT.as_secs()))?
                .map_err(|error| error.to_string())
        }
    }
}
