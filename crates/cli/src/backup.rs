//! `palisade backup` and `palisade restore`: a backup of the epoch counter (online from a
//! running coordinator, or offline from a data directory), and a restore into a new data
//! directory that never issues an epoch twice (see `palisade_coordinator::backup`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use palisade_coordinator::backup::{self, Floor};
use serde_json::Value;

use crate::output::print_json;
use crate::EndpointArgs;

/// How long an online backup or a floor read may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args)]
pub struct BackupArgs {
    /// Where to write the backup (written to FILE.partial, then renamed).
    #[arg(long)]
    out: PathBuf,
    /// Back up this stopped single node's (or cluster member's) data directory instead of a
    /// running coordinator.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    endpoint: EndpointArgs,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// The backup file.
    #[arg(long)]
    from: PathBuf,
    /// The new data directory (must not hold a coordinator).
    #[arg(long)]
    data_dir: PathBuf,
    /// The high-water file the restored coordinator will use [default: DATA_DIR.high-water,
    /// as `palisade serve`].
    #[arg(long)]
    high_water_file: Option<PathBuf>,
    /// A resource that enforces the locks: a reference store (http(s)://HOST:PORT) or a
    /// PostgreSQL database with Palisade's tables or guarded tables (postgres://…). Its highest
    /// fence becomes a floor. Repeatable; a source that cannot be read stops the restore.
    #[arg(long, value_name = "URL")]
    floor_from: Vec<String>,
    /// The CA (PEM) of https:// floor sources.
    #[arg(long, env = "PALISADE_CA")]
    ca: Option<PathBuf>,
    /// Restore as the founding member of a new cluster: it starts alone
    /// (`--cluster ID=HOST:PORT` naming only itself) and the other members join it with empty
    /// data directories (`--join`, then `palisade cluster add`). A cluster keeps no high-water
    /// file; --high-water-file is then only read as a floor.
    #[arg(long)]
    cluster: bool,
}

pub async fn run_backup(args: BackupArgs, json: bool) -> anyhow::Result<()> {
    let backup = match &args.data_dir {
        Some(dir) => palisade_server::backup::offline(dir)?,
        None => online(&args.endpoint).await?,
    };
    backup::write(&backup, &args.out)?;
    if json {
        print_json(&serde_json::to_value(&backup)?);
    } else {
        println!(
            "backed up epoch counter {} ({}, {}) to {}",
            backup.last_epoch,
            backup.mode,
            backup.taken,
            args.out.display()
        );
    }
    Ok(())
}

/// Asks each endpoint in turn; a follower's `not_leader` sends the request on.
async fn online(endpoint: &EndpointArgs) -> anyhow::Result<backup::Backup> {
    let http = endpoint.http(REQUEST_TIMEOUT)?;
    let mut errors = Vec::new();
    for base in &endpoint.endpoint {
        let url = format!("{}/v1/backup", base.trim_end_matches('/'));
        let response = match http.get(&url).send().await {
            Ok(response) => response,
            Err(error) => {
                errors.push(format!("{base}: {error}"));
                continue;
            }
        };
        let status = response.status();
        let bytes = response.bytes().await?;
        if status.is_success() {
            return Ok(backup::decode(&bytes)?);
        }
        let body: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let message = body["message"].as_str().unwrap_or("no message");
        match status.as_u16() {
            401 | 403 => {
                return Err(anyhow::Error::new(
                    palisade_client::ClientError::Unauthenticated(message.to_owned()),
                ))
                .context("a backup needs the admin right")
            }
            _ => errors.push(format!("{base}: {status}: {message}")),
        }
    }
    bail!("no coordinator gave a backup: {}", errors.join("; "))
}

pub async fn run_restore(args: RestoreArgs, json: bool) -> anyhow::Result<()> {
    let backup = backup::read(&args.from)?;
    let tls = crate::ClientTlsArgs {
        ca: args.ca.clone(),
        ..Default::default()
    };
    let mut floors = Vec::new();
    for source in &args.floor_from {
        let epoch = read_floor(source, &tls)
            .await
            .with_context(|| format!("cannot read the floor of {}", shown(source)))?;
        floors.push(Floor {
            source: shown(source),
            epoch,
        });
    }
    let (high_water, target) = if args.cluster {
        (args.high_water_file.clone(), backup::Target::ClusterFounder)
    } else {
        let default = palisade_coordinator::high_water::default_path(&args.data_dir);
        (
            Some(args.high_water_file.clone().unwrap_or(default)),
            backup::Target::Single,
        )
    };
    let record = backup::restore(
        &backup,
        &args.data_dir,
        high_water.as_deref(),
        floors,
        backup::now_ms(),
        target,
    )?;
    if json {
        print_json(&serde_json::to_value(&record)?);
    } else if args.cluster {
        println!("{record}");
        println!(
            "start it alone: palisade serve --data-dir {} --node-id ID --cluster ID=HOST:PORT \
             (with its peer credentials); start the other members with empty data directories \
             and --join, then palisade cluster add ID HOST:PORT for each",
            args.data_dir.display()
        );
    } else {
        println!("{record}");
        println!(
            "start it with: palisade serve --data-dir {}{}",
            args.data_dir.display(),
            args.high_water_file
                .as_ref()
                .map(|f| format!(" --high-water-file {}", f.display()))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// A source as it may be shown: a URL without its credentials.
pub fn shown(source: &str) -> String {
    match source.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://{host}"),
            None => source.to_owned(),
        },
        None => source.to_owned(),
    }
}

async fn read_floor(source: &str, tls: &crate::ClientTlsArgs) -> anyhow::Result<u64> {
    if source.starts_with("postgres://") || source.starts_with("postgresql://") {
        return Ok(palisade_fence_postgres::highest_fence(source).await?);
    }
    if !(source.starts_with("http://") || source.starts_with("https://")) {
        bail!("a floor source is an http(s):// reference store or a postgres:// database");
    }
    let http = tls.http(None, REQUEST_TIMEOUT)?;
    let store = palisade_audit::policy::Boundary::Resource {
        url: source.to_owned(),
    };
    palisade_audit::observe::highest_fence(&http, &store)
        .await
        .map_err(anyhow::Error::msg)
}
