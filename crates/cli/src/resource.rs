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

use crate::lock::print_json;

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
        #[arg(long, env = "PALISADE_TOKEN")]
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
    /// Activate a lock's new epoch (activated mode), before the new owner works.
    Activate {
        /// The lock.
        lock: String,
        /// The ownership token.
        #[arg(long, env = "PALISADE_TOKEN")]
        token: String,
        #[command(flatten)]
        target: Target,
    },
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
        ResourceCommand::Put {
            lock,
            key,
            value,
            token,
            seq,
            target,
        } => {
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
                println!("accepted at epoch {}{replay}", body["epoch"]);
            }
            Ok(())
        }
        ResourceCommand::Get { lock, key, target } => {
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
                let mut body = json!({"lock": lock, "key": key, "epoch": epoch.and_then(|e| e.parse::<u64>().ok())});
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
                println!("fence of {lock} is at epoch {}", body["fence"]);
            }
            Ok(())
        }
    }
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

async fn failure(response: reqwest::Response) -> ResourceFailure {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or_default();
    let mut message = body["message"].as_str().unwrap_or("").to_owned();
    if let Some(fence) = body["fence"].as_u64() {
        message = format!("{message} (fence {fence})");
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
