//! docs/enforcement.md's Rust example, compiled with the workspace; the docs test checks the
//! page shows these lines. Run it against a real database and coordinator:
//!
//! ```text
//! cargo run -p palisade-fence-postgres --example guard_a_table -- DATABASE_URL [COORDINATOR_URL]
//! ```
//!
//! It needs the table `reports (id bigint PRIMARY KEY, payload text NOT NULL, last_fence bigint
//! NOT NULL DEFAULT 0)` with a row 7, and installs the guard on it (run it as the table's owner).

use std::sync::Arc;

use palisade_core::{LockName, TokenVerifier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(database_url) = args.next() else {
        eprintln!("usage: guard_a_table DATABASE_URL [COORDINATOR_URL]");
        std::process::exit(2);
    };
    let database_url = database_url.as_str();
    let coordinator = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:7420".into());
    let client = palisade_client::Client::connect(std::slice::from_ref(&coordinator)).await?;
    let lock = LockName::new("report/7")?;
    let lease = client
        .acquire(palisade_client::AcquireOptions::new(lock.as_str()))
        .await?;
    let new_payload = format!("written under epoch {}", lease.epoch());

    // docs/enforcement.md: begin
    use palisade_fence::{FenceMode, Outcome, Verifier};
    use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};

    use palisade_resource::{KeyRing, KeySource};

    // Trust the coordinator's public keys (GET /v1/keys; https with a CA, or loopback), and
    // learn each lock's floor from it when the database restarted or was restored.
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([])));
    let keys = KeyRing::new(
        KeySource::Coordinator(coordinator),
        vec![],
        verifier.clone(),
        None,
    )?;
    keys.load_initial().await?;
    // database_url: e.g. "postgres://app@db/app"
    let fence = PostgresFence::connect(database_url, 16, FenceMode::Strict, verifier)
        .await?
        .with_floors(Arc::new(keys));
    // Bind the table to the lock that guards it: one lock for the whole table, or
    // RowLock::Column("lock") when each row names its lock in a `lock text NOT NULL` column.
    let reports = GuardedTable::new("reports", "id", "payload", RowLock::Table(lock.clone()))?;
    reports.install_guard(&fence, false).await?; // once, as the table's owner; idempotent

    // In the worker, with the token of its lease on lock "report/7":
    match reports
        .update(&fence, &lock, &7i64, lease.token(), &new_payload)
        .await?
    {
        Outcome::Accepted { epoch, .. } => println!("written at epoch {epoch}, durably"),
        Outcome::Rejected(why) => {
            eprintln!("refused ({why}): a newer owner exists; stop, do not retry")
        }
        _ => {}
    }
    // docs/enforcement.md: end

    lease.release().await?;
    Ok(())
}
