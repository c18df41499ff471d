//! `palisade resource serve|put|get|activate`: the reference fenced store and its HTTP twins.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use clap::{Args, Subcommand};
use palisade_client::encode_path_segment;
use palisade_fence::FenceMode;
use palisade_resource::{KeySource, ResourceConfig};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};

use crate::output::print_json;

/// Default URL of the reference store for the client commands.
const DEFAULT_RESOURCE: &str = "http://127.0.0.1:7421";

#[derive(Subcommand)]
pub enum ResourceCommand {
    /// Run the reference fenced store (embedded, durable).
    Serve(ServeArgs),
    /// Write a value under a lock's token: VALUE, or `-` (or nothing) for standard input.
    Put {
        /// The lock guarding the key.
        lock: String,
        /// The key.
        key: String,
        /// The value; `-` or absent reads standard input.
        value: Option<String>,
        /// The ownership token (from `palisade lock acquire`).
        #[arg(long, env = "PALISADE_FENCE_TOKEN", value_parser = parse_token)]
        token: String,
        /// Sequence number (sequenced mode).
        #[arg(long)]
        seq: Option<u64>,
        #[command(flatten)]
        target: Target,
    },
    /// Read a key's value (to stdout) and the epoch that wrote it.
    Get {
        /// The lock guarding the key.
        lock: String,
        /// The key.
        key: String,
        #[command(flatten)]
        target: Target,
    },
    /// Apply a restore floor from the coordinator to a stopped store that was restored from an
    /// older copy or copied back (or to a PostgreSQL database restored from a backup): from
    /// then on it refuses every token issued before the floor, and accepts writes again.
    Restore(RestoreArgs),
    /// Install the bypass guard on your own PostgreSQL table, from any language: Palisade's
    /// functions are created first, then an UPDATE that does not raise `last_fence` fails,
    /// TRUNCATE fails, and with --guard-rows so do INSERT and DELETE outside the fence (P5).
    /// Run it as the table's owner; running it again changes nothing.
    Guard(GuardArgs),
    /// Forget a PostgreSQL database's floor for a lock: the repair of a floor `palisade audit`
    /// reports as poisoned (forged, or above the coordinator's). The row goes, and the lock's
    /// next fenced write learns its floor again from the coordinator, verified. Run it as the
    /// owner of Palisade's tables.
    ForgetFloor {
        /// The database (`postgres://USER@HOST/DB`).
        #[arg(long)]
        postgres: String,
        /// The lock whose floor goes.
        #[arg(long)]
        lock: String,
    },
    /// Repair rows of a PostgreSQL table fenced above anything the coordinator issued for
    /// their lock (`palisade audit` reports them as `poisoned_fence`: a forged token, or a
    /// bare `last_fence` written by SQL): they go back to just below the coordinator's floor
    /// for the lock (asked and verified), where every superseded owner is still refused. Run
    /// it as the table's owner.
    RepairFence(crate::repair_fence::RepairFenceArgs),
    /// Activate a lock's new epoch (activated mode), before the new owner works.
    Activate {
        /// The lock.
        lock: String,
        /// The ownership token.
        #[arg(long, env = "PALISADE_FENCE_TOKEN", value_parser = parse_token)]
        token: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Args)]
pub struct GuardArgs {
    /// The database (`postgres://USER@HOST/DB`).
    #[arg(long)]
    postgres: String,
    /// The table: it needs a `last_fence bigint NOT NULL` column (0 for rows never written
    /// under a fence).
    #[arg(long)]
    table: String,
    /// Its primary key column.
    #[arg(long, default_value = "id")]
    id_column: String,
    /// The column the fenced statement writes.
    #[arg(long, default_value = "payload")]
    payload_column: String,
    /// The one lock that guards every row.
    #[arg(long, conflicts_with = "lock_column")]
    lock: Option<String>,
    /// The column (`text NOT NULL`) that names each row's lock.
    #[arg(long)]
    lock_column: Option<String>,
    /// Also refuse INSERT and DELETE outside the fence.
    #[arg(long)]
    guard_rows: bool,
    /// Accept a bare epoch as last_fence, as before migration 11 (for writers not yet
    /// passing their token). By default every write must present its token
    /// (`palisade_present_token`): a bare epoch, another lock's token, or a last_fence that
    /// is not the token's epoch is refused by the database.
    #[arg(long)]
    bare_epochs: bool,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Where the store lives.
    #[arg(long, default_value = palisade_resource::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Address for HTTP.
    #[arg(long, default_value = palisade_resource::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// strict, activated or sequenced (fixed for the store's lifetime).
    #[arg(long, default_value = "strict")]
    mode: String,
    /// Trust the keys this coordinator publishes (refreshed on unknown key ids): an https://
    /// URL with --ca, or an http:// URL on a loopback address (keys fetched in clear from
    /// elsewhere could be forged on the way; pin them with --trust-key instead).
    #[arg(long, conflicts_with = "trust_key")]
    coordinator: Option<String>,
    /// The CA (PEM) that signed the https:// coordinator's certificate.
    #[arg(long, env = "PALISADE_CA")]
    ca: Option<PathBuf>,
    /// TLS on this store's port: its certificate chain (PEM). With it the port speaks TLS
    /// only. Needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Trust the keys in this file (the JSON of GET /v1/keys, or one key per line).
    #[arg(long)]
    trust_key: Option<PathBuf>,
    /// Accept tokens for locks under LOCK_PREFIX only from PRINCIPAL (repeatable; a trailing *
    /// on PRINCIPAL matches a prefix; * as LOCK_PREFIX covers every lock). A valid token of
    /// another principal is refused as invalid_token.
    #[arg(long, value_name = "LOCK_PREFIX=PRINCIPAL", value_parser = parse_principal_rule)]
    require_principal: Vec<palisade_fence::PrincipalRule>,
    /// Never trust the key with this id (16 hex digits, as in GET /v1/keys), even when the
    /// coordinator or the key file still lists it (repeatable): revokes a leaked key at once.
    #[arg(long, value_name = "KEY_ID", value_parser = parse_key_id)]
    revoke_key: Vec<palisade_core::KeyId>,
    /// Fetch the coordinator's keys this often (seconds) even when no token names a new one, so
    /// a key it stops publishing (`palisade cluster retire-key`) is dropped within this time.
    #[arg(long = "key-refresh", value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    key_refresh_secs: u64,
    /// A file holding the secret (at least 16 characters) that reconcilers and people present
    /// to settle, retry and resolve operations in the effects ledger this store hosts
    /// (`palisade effects reconcile|resolve --admin-secret-file`). Without it those requests
    /// are refused; owners need only their tokens.
    #[arg(long, value_name = "FILE")]
    effects_admin_secret_file: Option<PathBuf>,
}

/// Reads an admin secret file: one line, at least 16 characters.
pub fn read_secret_file(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the secret file {}", path.display()))?;
    let secret = text.trim().to_owned();
    anyhow::ensure!(
        secret.len() >= 16 && !secret.contains(char::is_whitespace),
        "the secret in {} must be one word of at least 16 characters",
        path.display()
    );
    Ok(secret)
}

#[derive(Args)]
pub struct RestoreArgs {
    /// The stopped store's data directory (as given to `resource serve`).
    #[arg(
        long,
        required_unless_present = "postgres",
        conflicts_with = "postgres"
    )]
    data_dir: Option<PathBuf>,
    /// A PostgreSQL database with Palisade's tables (postgres://…), restored from a backup.
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// The coordinator that gives the floor (an epoch it issues now, signed).
    #[command(flatten)]
    endpoint: crate::EndpointArgs,
}

/// A token as given on the command line: not empty (an empty `$TOKEN` from a failed acquire
/// is the usual cause).
fn parse_token(text: &str) -> Result<String, String> {
    let token = text.trim();
    if token.is_empty() {
        Err("no token given (was the acquire that should have set it refused?)".into())
    } else {
        Ok(token.to_owned())
    }
}

fn parse_key_id(text: &str) -> Result<palisade_core::KeyId, String> {
    text.parse()
        .map_err(|e: palisade_core::TokenError| e.to_string())
}

fn parse_principal_rule(text: &str) -> Result<palisade_fence::PrincipalRule, String> {
    palisade_fence::PrincipalRule::parse(text).map_err(|e| e.0)
}

/// Where the reference store is.
#[derive(Args)]
pub struct Target {
    /// URL of the reference store.
    #[arg(long, env = "PALISADE_RESOURCE", default_value = DEFAULT_RESOURCE)]
    resource: String,
    /// The CA (PEM) that signed an https:// store's certificate.
    #[arg(long = "ca", env = "PALISADE_CA")]
    resource_ca: Option<PathBuf>,
}

/// A refusal or failure reported by the resource.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ResourceFailure {
    status: u16,
    code: String,
    message: String,
}

impl ResourceFailure {
    pub fn exit_code(&self) -> u8 {
        match self.status {
            409 | 401 | 403 => 5,
            503 => 4,
            _ => 1,
        }
    }
}

pub async fn run(command: ResourceCommand, json: bool) -> anyhow::Result<()> {
    match command {
        ResourceCommand::Serve(args) => serve(args).await,
        ResourceCommand::Restore(args) => restore(args, json).await,
        ResourceCommand::Guard(args) => guard(args).await,
        ResourceCommand::ForgetFloor { postgres, lock } => forget_floor(&postgres, &lock).await,
        ResourceCommand::RepairFence(args) => crate::repair_fence::repair_fence(args).await,
        ResourceCommand::Put {
            lock,
            key,
            value,
            token,
            seq,
            target,
        } => put(lock, key, value, token, seq, target, json).await,
        ResourceCommand::Get { lock, key, target } => get(lock, key, target, json).await,
        ResourceCommand::Activate {
            lock,
            token,
            target,
        } => {
            let url = format!(
                "{}/v1/fences/{}/activate",
                target.resource,
                encode_path_segment(&lock)
            );
            let request = target.http()?.post(url).header("Palisade-Token", token);
            let body = expect_json(request.send().await).await?;
            if json {
                print_json(&body);
            } else {
                println!("fence of {lock} is at epoch {}", shown(&body["fence"]));
            }
            Ok(())
        }
    }
}

async fn put(
    lock: String,
    key: String,
    value: Option<String>,
    token: String,
    seq: Option<u64>,
    target: Target,
    json: bool,
) -> anyhow::Result<()> {
    let value = match value.as_deref() {
        None | Some("-") => {
            let mut buffer = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buffer)
                .context("read standard input")?;
            buffer
        }
        Some(text) => text.as_bytes().to_vec(),
    };
    let url = format!(
        "{}/v1/kv/{}/{}",
        target.resource,
        encode_path_segment(&lock),
        encode_path_segment(&key)
    );
    let mut request = target
        .http()?
        .put(url)
        .header("Palisade-Token", token)
        .body(value);
    if let Some(seq) = seq {
        request = request.header("Palisade-Seq", seq.to_string());
    }
    let body = expect_json(request.send().await).await?;
    if json {
        print_json(&body);
    } else {
        let replay = if body["replay"] == true {
            " (replay: nothing applied)"
        } else {
            ""
        };
        println!("accepted at epoch {}{replay}", shown(&body["epoch"]));
    }
    Ok(())
}

async fn get(lock: String, key: String, target: Target, json: bool) -> anyhow::Result<()> {
    let url = format!(
        "{}/v1/kv/{}/{}",
        target.resource,
        encode_path_segment(&lock),
        encode_path_segment(&key)
    );
    let response = target.http()?.get(url).send().await.map_err(unreachable)?;
    if !response.status().is_success() {
        return Err(failure(response).await.into());
    }
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (epoch, seq) = (header("Palisade-Epoch"), header("Palisade-Seq"));
    let value = response.bytes().await.map_err(unreachable)?;
    if json {
        let epoch = epoch.and_then(|e| e.parse::<u64>().ok());
        let mut body =
            json!({"lock": lock, "key": key, "epoch": epoch.map(palisade_core::json::value)});
        if let Some(seq) = seq {
            body["seq"] = json!(seq.parse::<u64>().ok());
        }
        match std::str::from_utf8(&value) {
            Ok(text) => body["value"] = json!(text),
            Err(_) => body["value_base64"] = json!(STANDARD.encode(&value)),
        }
        print_json(&body);
    } else {
        use std::io::Write as _;
        std::io::stdout().write_all(&value)?;
        eprintln!("(epoch {})", epoch.unwrap_or_default());
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mode = FenceMode::parse(&args.mode).with_context(|| {
        format!(
            "mode {:?} is unknown; use strict, activated or sequenced",
            args.mode
        )
    })?;
    let keys = match (args.coordinator, args.trust_key) {
        (_, Some(file)) => KeySource::File(file),
        (Some(url), None) => KeySource::Coordinator(url),
        (None, None) => KeySource::Coordinator(palisade_client::DEFAULT_ENDPOINT.into()),
    };
    let config = ResourceConfig {
        data_dir: args.data_dir,
        listen: args.listen,
        mode,
        keys,
        principals: args.require_principal,
        revoked_keys: args.revoke_key,
        coordinator_ca: args.ca,
        tls: args.tls_cert.zip(args.tls_key),
        key_refresh: std::time::Duration::from_secs(args.key_refresh_secs),
        effects_admin_secret: args
            .effects_admin_secret_file
            .as_deref()
            .map(read_secret_file)
            .transpose()?,
    };
    let resource = palisade_resource::start(config)
        .await
        .context("cannot start the fenced store")?;
    eprintln!(
        "palisade fenced store ({mode}) listening on {}",
        resource.local_addr
    );
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
        _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
    }
    resource.shutdown().await;
    Ok(())
}

impl Target {
    /// An HTTP client for the store, trusting --ca (only) for an https:// store.
    fn http(&self) -> anyhow::Result<reqwest::Client> {
        crate::ClientTlsArgs {
            ca: self.resource_ca.clone(),
            ..Default::default()
        }
        .http(None, std::time::Duration::from_secs(30))
    }
}

fn unreachable(error: reqwest::Error) -> anyhow::Error {
    ResourceFailure {
        status: 503,
        code: "unavailable".into(),
        message: format!("cannot reach the resource: {error}"),
    }
    .into()
}

/// An epoch or fence from a store's JSON answer, for people (a string or a number).
fn shown(value: &Value) -> String {
    palisade_core::json::read(value).map_or_else(|| value.to_string(), |n| n.to_string())
}

async fn failure(response: reqwest::Response) -> ResourceFailure {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or_default();
    let mut message = body["message"].as_str().unwrap_or("").to_owned();
    // The store's message names the fence already ("the fence is at 4"); say it once.
    if let Some(fence) = palisade_core::json::read(&body["fence"]) {
        if !message.contains(&fence.to_string()) {
            message = format!("{message} (fence {fence})");
        }
    }
    ResourceFailure {
        status,
        code: body["error"].as_str().unwrap_or("error").to_owned(),
        message,
    }
}

async fn expect_json(response: reqwest::Result<reqwest::Response>) -> anyhow::Result<Value> {
    let response = response.map_err(unreachable)?;
    if !response.status().is_success() {
        return Err(failure(response).await.into());
    }
    response
        .json()
        .await
        .context("the resource answered with invalid JSON")
}

/// The floor lock of a store: acquiring it makes the coordinator issue (and sign) an epoch
/// above every epoch it issued before.
const FLOOR_LOCK_PREFIX: &str = "palisade-restore/";

/// A floor from the coordinator: an epoch it issues now for `lock`, with its token, verified
/// against the keys the coordinator publishes.
async fn coordinator_floor(
    endpoint: &crate::EndpointArgs,
    lock: &str,
) -> anyhow::Result<(u64, String)> {
    let client = endpoint.connect().await?;
    let mut options = palisade_client::AcquireOptions::new(lock);
    options.ttl = std::time::Duration::from_secs(10);
    options.wait = std::time::Duration::from_secs(10);
    let grant = client.acquire_once(&options).await.with_context(|| {
        format!("the coordinator did not grant the floor lock {lock} (it needs the acquire right)")
    })?;
    if let Err(error) = client.release(&grant.lease_id).await {
        tracing::warn!(%error, "the floor lock was not released; it expires in 10 s");
    }
    let http = endpoint.http(std::time::Duration::from_secs(10))?;
    let lock_name = palisade_core::LockName::new(lock.to_owned())?;
    let mut failures = Vec::new();
    for base in &endpoint.endpoint {
        let url = format!("{}/v1/keys", base.trim_end_matches('/'));
        let text = match http
            .get(&url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
        {
            Ok(response) => response.text().await?,
            Err(error) => {
                failures.push(format!("{base}: {error}"));
                continue;
            }
        };
        let verifier = palisade_resource::parse_keys(&text).map_err(anyhow::Error::msg)?;
        let claims = verifier
            .verify(&grant.token, Some(&lock_name))
            .context("the floor token is not signed by a key the coordinator publishes")?;
        anyhow::ensure!(
            claims.epoch.0 == grant.epoch,
            "the floor token says epoch {}, the grant {}",
            claims.epoch,
            grant.epoch
        );
        return Ok((grant.epoch, grant.token));
    }
    anyhow::bail!(
        "cannot read the coordinator's keys to check the floor: {}",
        failures.join("; ")
    )
}

async fn restore(args: RestoreArgs, json: bool) -> anyhow::Result<()> {
    if let Some(url) = &args.postgres {
        let lock = format!("{FLOOR_LOCK_PREFIX}postgres");
        let (floor, token) = coordinator_floor(&args.endpoint, &lock).await?;
        let applied = palisade_fence_postgres::apply_restore_floor(url, floor, &token).await?;
        let report = json!({
            "postgres": crate::backup::shown(url),
            "highest_before": palisade_core::json::value(applied.highest_before),
            "floor": palisade_core::json::value(applied.floor),
        });
        print_restore(&report, json);
        return Ok(());
    }
    let data_dir = args
        .data_dir
        .expect("clap requires --data-dir or --postgres");
    let file = data_dir.join(palisade_resource::STORE_FILE);
    let store_id = palisade_resource::store_id(&data_dir)
        .with_context(|| format!("cannot open {} (is the store stopped?)", file.display()))?
        .with_context(|| {
            format!(
                "{} was never opened by this version: start it once, stop it, and restore again",
                file.display()
            )
        })?;
    let lock = format!("{FLOOR_LOCK_PREFIX}{store_id}");
    let (floor, token) = coordinator_floor(&args.endpoint, &lock).await?;
    let record = json!({
        "floor": floor,
        "token": token,
        "applied_at_ms": palisade_core::clock::now_ms(),
    });
    let applied = palisade_resource::apply_restore_floor(&data_dir, floor, &record.to_string())?;
    let report = json!({
        "data_dir": data_dir.display().to_string(),
        "highest_before": palisade_core::json::value(applied.highest_before),
        "witness_saw": palisade_core::json::value(applied.witness_seen),
        "floor": palisade_core::json::value(applied.floor),
    });
    print_restore(&report, json);
    Ok(())
}

fn print_restore(report: &Value, json: bool) {
    if json {
        print_json(report);
    } else {
        println!(
            "restore floor {} applied (the store's highest epoch was {}): every token issued \
             before it is refused from now on; the current owners acquire again to write",
            shown(&report["floor"]),
            shown(&report["highest_before"])
        );
    }
}

/// `palisade resource guard`: binds the table to its lock(s) and installs the guard.
async fn guard(args: GuardArgs) -> anyhow::Result<()> {
    use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};
    let lock = match (&args.lock, &args.lock_column) {
        (Some(lock), None) => RowLock::Table(palisade_core::LockName::new(lock)?),
        (None, Some(column)) => RowLock::Column(column.clone()),
        _ => anyhow::bail!(
            "name the lock that guards the rows: --lock NAME (one lock for every row) or \
             --lock-column COLUMN (each row names its lock)"
        ),
    };
    let table = GuardedTable::new(&args.table, &args.id_column, &args.payload_column, lock)?;
    let verifier = std::sync::Arc::new(palisade_fence::Verifier::default());
    let fence = PostgresFence::connect(&args.postgres, 1, FenceMode::Strict, verifier)
        .await
        .context("connecting to the database")?;
    table
        .install_guard(&fence, args.guard_rows)
        .await
        .context("installing the guard (run it as the table's owner)")?;
    table
        .require_token(&fence, !args.bare_epochs)
        .await
        .context("binding writes to their tokens (run it as the table's owner)")?;
    println!(
        "guarded {}: an UPDATE that does not raise last_fence fails, TRUNCATE fails{}{}",
        args.table,
        if args.guard_rows {
            ", INSERT and DELETE outside the fence fail"
        } else {
            ""
        },
        if args.bare_epochs {
            "; a bare epoch is accepted as last_fence (--bare-epochs)"
        } else {
            "; every write must present its token (palisade_present_token)"
        }
    );
    Ok(())
}

/// `resource forget-floor`: deletes the lock's row of `palisade_lock_floors`.
async fn forget_floor(postgres: &str, lock: &str) -> anyhow::Result<()> {
    use palisade_fence_postgres::PostgresFence;
    let lock = palisade_core::LockName::new(lock)?;
    let verifier = std::sync::Arc::new(palisade_fence::Verifier::default());
    let fence = PostgresFence::connect(postgres, 1, FenceMode::Strict, verifier)
        .await
        .context("connecting to the database")?;
    let client = fence
        .pool()
        .get()
        .await
        .context("connecting to the database")?;
    let forgotten = client
        .query_opt(
            "DELETE FROM palisade_lock_floors WHERE lock = $1 RETURNING floor",
            &[&lock.as_str()],
        )
        .await
        .context("deleting the floor (run it as the owner of Palisade's tables)")?;
    match forgotten {
        Some(row) => println!(
            "forgot floor {} of lock {lock}: its next fenced write learns the floor again from \
             the coordinator",
            row.get::<_, i64>(0)
        ),
        None => println!("no floor recorded for lock {lock}: nothing to forget"),
    }
    Ok(())
}
