//! `palisade resource repair-fence`: the repair of a PostgreSQL row fenced above anything the
//! coordinator issued for its lock (`poisoned_fence` in `palisade audit`).
//!
//! The coordinator's floor for the lock — every owner below it is superseded — is asked over
//! HTTP and its signed statement verified with the keys the coordinator publishes; then
//! `palisade_repair_fence(table, lock, floor)` (migration 11) sets every row of the lock above
//! the floor to floor − 1, where every superseded owner is still refused and the owner at the
//! floor may write, and forgets a presented token above it. The table is locked from before the
//! floor is asked until the repair commits, so no owner's write lands in between.

use anyhow::Context as _;
use clap::Args;
use palisade_core::LockName;
use palisade_fence::FenceMode;

#[derive(Args)]
pub struct RepairFenceArgs {
    /// The database (`postgres://OWNER@HOST/DB`: the table's owner).
    #[arg(long)]
    postgres: String,
    /// The guarded table.
    #[arg(long)]
    table: String,
    /// The lock whose rows are fenced too high.
    #[arg(long)]
    lock: String,
    /// The coordinator that gives the lock's floor (signed).
    #[command(flatten)]
    endpoint: crate::EndpointArgs,
}

pub async fn repair_fence(args: RepairFenceArgs) -> anyhow::Result<()> {
    let lock = LockName::new(args.lock.clone())?;
    let table = palisade_fence_postgres::quote_identifier(&args.table)?;
    let verifier = std::sync::Arc::new(palisade_fence::Verifier::default());
    let fence = palisade_fence_postgres::PostgresFence::connect(
        &args.postgres,
        1,
        FenceMode::Strict,
        verifier,
    )
    .await
    .context("connecting to the database")?;
    let mut client = fence
        .pool()
        .get()
        .await
        .context("connecting to the database")?;
    // The table is locked before the floor is asked: a newer owner's write committed after
    // the floor was read would otherwise be lowered below the older owner's epoch.
    let transaction = client.transaction().await?;
    transaction
        .batch_execute(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        .await
        .context("locking the table (run it as the table's owner)")?;
    let floor = verified_floor(&args.endpoint, &lock).await?;
    let floor = i64::try_from(floor).context("the coordinator's floor is beyond a bigint")?;
    let repaired: i64 = transaction
        .query_one(
            "SELECT palisade_repair_fence($1::text::regclass, $2, $3)",
            &[&args.table, &lock.as_str(), &floor],
        )
        .await
        .context("repairing the fence (run it as the table's owner)")?
        .get(0);
    transaction.commit().await?;
    println!(
        "{repaired} row(s) of {} under lock {lock} set to {} (the coordinator's floor is \
         {floor}: every owner below it is still refused, the owner at it may write)",
        args.table,
        floor - 1
    );
    Ok(())
}

/// The coordinator's floor for `lock`, from its signed statement verified with the keys it
/// publishes (a proxy cannot hand the repair a number of its own).
async fn verified_floor(endpoint: &crate::EndpointArgs, lock: &LockName) -> anyhow::Result<u64> {
    let http = endpoint.http(std::time::Duration::from_secs(10))?;
    let mut failures = Vec::new();
    for base in &endpoint.endpoint {
        let base = base.trim_end_matches('/');
        let path = palisade_client::encode_path_segment(lock.as_str());
        let asked = async {
            let keys = http.get(format!("{base}/v1/keys")).send().await?;
            let keys = keys.error_for_status()?.text().await?;
            let floor = http
                .get(format!("{base}/v1/locks/{path}/floor"))
                .send()
                .await?;
            let floor: serde_json::Value = floor.error_for_status()?.json().await?;
            anyhow::Ok((keys, floor))
        };
        let (keys, answer) = match asked.await {
            Ok(answered) => answered,
            Err(error) => {
                failures.push(format!("{base}: {error}"));
                continue;
            }
        };
        let verifier = palisade_resource::parse_keys(&keys).map_err(anyhow::Error::msg)?;
        let statement = answer["statement"]
            .as_str()
            .context("the coordinator's floor came without its statement")?;
        let claims = verifier
            .verify_floor(statement, lock)
            .context("the floor statement is not signed by a key the coordinator publishes")?;
        return Ok(claims.floor.0);
    }
    anyhow::bail!(
        "cannot ask the coordinator for the floor of {lock}: {}",
        failures.join("; ")
    )
}
