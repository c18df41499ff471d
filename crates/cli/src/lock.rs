//! `palisade lock acquire|renew|release|list|show` (and `run`, in `lock_run.rs`).

use palisade_client::proto::{LockClass as ProtoClass, LockInfo};
use palisade_client::{AcquireOptions, Client};
use palisade_core::LockClass;
use serde_json::json;

use crate::output::{millis, print_fields, print_json, print_table};
use crate::{EndpointArgs, LockCommand};

pub async fn run(command: LockCommand, json: bool) -> anyhow::Result<()> {
    match command {
        LockCommand::Acquire {
            name,
            ttl,
            wait,
            holder,
            class,
            request_id,
            endpoint,
        } => {
            let class = class.as_deref().map(LockClass::parse).transpose()?;
            let mut options = AcquireOptions::new(name);
            options.ttl = ttl;
            options.wait = wait;
            options.class = class;
            options.request_id = request_id;
            if let Some(holder) = holder {
                options.holder = holder;
            }
            let grant = connect(&endpoint).await?.acquire_once(&options).await?;
            print_grant(grant, json);
        }
        LockCommand::Renew { lease_id, endpoint } => {
            let renewed = connect(&endpoint).await?.renew(&lease_id).await?;
            if json {
                print_json(&json!({
                    "lease_id": renewed.lease_id,
                    "epoch": palisade_core::json::value(renewed.epoch),
                    "ttl_ms": renewed.ttl_ms,
                }));
            } else {
                println!("renewed lease {lease_id} for {}", millis(renewed.ttl_ms));
            }
        }
        LockCommand::Release { lease_id, endpoint } => {
            connect(&endpoint).await?.release(&lease_id).await?;
            if json {
                print_json(&json!({"lease_id": lease_id, "released": true}));
            } else {
                println!("released lease {lease_id}");
            }
        }
        LockCommand::List { endpoint } => list(&endpoint, json).await?,
        LockCommand::Run(args) => crate::lock_run::run(args, json).await?,
        LockCommand::Show { name, endpoint } => show(&name, &endpoint, json).await?,
        LockCommand::Break {
            name,
            epoch,
            endpoint,
        } => break_lock(&name, epoch, &endpoint, json).await?,
        LockCommand::Watch {
            name,
            count,
            endpoint,
        } => watch(&name, count, &endpoint, json).await?,
    }
    Ok(())
}

fn print_grant(grant: palisade_client::Grant, json: bool) {
    if json {
        print_json(&json!({
            "lock": grant.lock,
            "epoch": palisade_core::json::value(grant.epoch),
            "lease_id": grant.lease_id,
            "ttl_ms": grant.ttl_ms,
            "holder": grant.holder,
            "principal": grant.principal,
            "class": grant.class,
            "token": grant.token,
        }));
    } else {
        print_fields(&[
            ("lock", grant.lock),
            ("epoch", grant.epoch.to_string()),
            ("lease_id", grant.lease_id),
            ("ttl", millis(grant.ttl_ms)),
            ("holder", grant.holder),
            ("principal", grant.principal),
            ("class", grant.class.to_string()),
            ("token", grant.token),
        ]);
    }
}

async fn list(endpoint: &EndpointArgs, json: bool) -> anyhow::Result<()> {
    let locks = connect(endpoint).await?.list().await?;
    if json {
        let locks: Vec<_> = locks.iter().map(lock_json).collect();
        print_json(&json!({ "locks": locks }));
    } else if locks.is_empty() {
        println!("no locks are held");
    } else {
        let rows: Vec<Vec<String>> = locks.iter().map(lock_row).collect();
        print_table(
            &[
                "LOCK",
                "EPOCH",
                "HOLDER",
                "PRINCIPAL",
                "CLASS",
                "REMAINING",
                "WAITERS",
                "HELD FOR",
            ],
            &rows,
        );
    }
    Ok(())
}

async fn show(name: &str, endpoint: &EndpointArgs, json: bool) -> anyhow::Result<()> {
    let info = connect(endpoint).await?.describe(name).await?;
    if json {
        print_json(&lock_json(&info));
    } else if info.held {
        let row = lock_row(&info);
        let keys = [
            "lock",
            "epoch",
            "holder",
            "principal",
            "class",
            "remaining",
            "waiters",
        ];
        let mut fields: Vec<(&str, String)> = keys.into_iter().zip(row).collect();
        fields.push(("held_since", held_since(&info)));
        // Shown only to the lease's principal or an admin.
        if !info.lease_id.is_empty() {
            fields.insert(2, ("lease_id", info.lease_id.clone()));
        }
        print_fields(&fields);
    } else {
        println!("{name} is free ({} waiting)", info.waiters);
    }
    Ok(())
}

/// `lock break`: `POST /v1/locks/{name}/break` on the first member that answers it.
async fn break_lock(
    name: &str,
    epoch: Option<u64>,
    endpoint: &EndpointArgs,
    json: bool,
) -> anyhow::Result<()> {
    palisade_core::LockName::new(name)?;
    let http = endpoint.http(std::time::Duration::from_secs(10))?;
    let mut errors = Vec::new();
    for base in &endpoint.endpoint {
        let url = format!(
            "{}/v1/locks/{}/break",
            base.trim_end_matches('/'),
            palisade_client::encode_path_segment(name)
        );
        let body = match epoch {
            Some(epoch) => json!({ "epoch": epoch.to_string() }).to_string(),
            None => String::new(),
        };
        let request = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body);
        let reply = match request.send().await {
            Ok(reply) => reply,
            Err(error) => {
                errors.push(format!("{base}: {error}"));
                continue;
            }
        };
        let status = reply.status();
        let body: serde_json::Value = reply.json().await.unwrap_or_default();
        if status.is_success() {
            if json {
                print_json(&body);
            } else {
                println!(
                    "broke {name}: the lease at epoch {} (holder {}) ended; the next owner gets a \
                     higher epoch",
                    body["epoch"].as_str().unwrap_or("?"),
                    body["holder"].as_str().unwrap_or("?")
                );
            }
            return Ok(());
        }
        let message = body["message"].as_str().unwrap_or("").to_owned();
        if status.is_client_error() {
            anyhow::bail!("{name} not broken: {message} ({status})");
        }
        errors.push(format!("{base}: {status} {message}"));
    }
    anyhow::bail!("no member broke {name}: {}", errors.join("; "))
}

/// `lock watch`: the lock's transitions, one line each, until `count` or the stream ends.
async fn watch(
    name: &str,
    count: Option<u64>,
    endpoint: &EndpointArgs,
    json: bool,
) -> anyhow::Result<()> {
    let mut events = match name.strip_suffix('*') {
        Some("") => anyhow::bail!("watch a prefix with at least one character before `*`"),
        Some(prefix) => connect(endpoint).await?.watch_prefix(prefix).await?,
        None => {
            palisade_core::LockName::new(name)?;
            connect(endpoint).await?.watch(name).await?
        }
    };
    let mut seen = 0;
    while count.is_none_or(|count| seen < count) {
        let Some(event) = events.message().await? else {
            anyhow::bail!("the coordinator ended the watch (a leader change, or it stopped)");
        };
        seen += 1;
        let at = palisade_core::clock::display_ms(palisade_core::clock::now_ms());
        let info = event.state.unwrap_or_default();
        if json {
            let mut line = lock_json(&info);
            line["event"] = json!(event.kind);
            line["at"] = json!(at);
            if !info.held && info.epoch > 0 {
                // The lease that just ended: its epoch and holder.
                line["epoch"] = palisade_core::json::value(info.epoch);
                line["holder"] = json!(info.holder);
            }
            if !event.by.is_empty() {
                line["by"] = json!(event.by);
            }
            palisade_cli_common::output::print_json_line(&line);
        } else if info.held {
            println!(
                "{at}  {}  {:<8}  epoch {}  holder {}  remaining {}",
                info.lock,
                event.kind,
                info.epoch,
                info.holder,
                millis(info.remaining_ms)
            );
        } else if info.epoch > 0 {
            let by = if event.by.is_empty() {
                String::new()
            } else {
                format!("  by {}", event.by)
            };
            println!(
                "{at}  {}  {:<8}  epoch {}  holder {}{by}  (now free)",
                info.lock, event.kind, info.epoch, info.holder
            );
        } else {
            println!("{at}  {}  {:<8}  free", info.lock, event.kind);
        }
    }
    Ok(())
}

async fn connect(endpoint: &EndpointArgs) -> anyhow::Result<Client> {
    endpoint.connect().await
}

fn class_name(class: i32) -> &'static str {
    if class == ProtoClass::Efficiency as i32 {
        "efficiency"
    } else {
        "critical"
    }
}

fn lock_row(info: &LockInfo) -> Vec<String> {
    vec![
        info.lock.clone(),
        info.epoch.to_string(),
        info.holder.clone(),
        info.principal.clone(),
        class_name(info.class).into(),
        millis(info.remaining_ms),
        info.waiters.to_string(),
        held_for(info),
    ]
}

/// How long the lease has been held, on this machine's clock against the granting
/// coordinator's (`–`: unknown, a lease granted before grant times were recorded).
fn held_for(info: &LockInfo) -> String {
    if info.granted_unix_ms == 0 {
        return "–".into();
    }
    let now = palisade_core::clock::now_ms();
    palisade_cli_common::output::age(now.saturating_sub(info.granted_unix_ms))
}

/// When the lease was granted, and how long ago.
fn held_since(info: &LockInfo) -> String {
    if info.granted_unix_ms == 0 {
        return "unknown (granted before grant times were recorded)".into();
    }
    format!(
        "{} ({} ago)",
        palisade_core::clock::display_ms(info.granted_unix_ms),
        held_for(info)
    )
}

fn lock_json(info: &LockInfo) -> serde_json::Value {
    if !info.held {
        return json!({"lock": info.lock, "held": false, "waiters": info.waiters});
    }
    let mut value = json!({
        "lock": info.lock,
        "held": true,
        "epoch": palisade_core::json::value(info.epoch),
        "holder": info.holder,
        "principal": info.principal,
        "ttl_ms": info.ttl_ms,
        "remaining_ms": info.remaining_ms,
        "class": class_name(info.class),
        "waiters": info.waiters,
    });
    if info.granted_unix_ms > 0 {
        value["granted_unix_ms"] = json!(info.granted_unix_ms);
        value["held_since"] = json!(palisade_core::clock::display_ms(info.granted_unix_ms));
    }
    // Shown only to the lease's principal or an admin.
    if !info.lease_id.is_empty() {
        value["lease_id"] = json!(info.lease_id);
    }
    value
}
