//! `palisade cluster status|add|remove|lost|retire-key`: a cluster's members, roles and lag;
//! membership changes and key retirement through the leader; a lost store declared to every
//! member.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Subcommand;
use palisade_client::ClientError;
use serde_json::{json, Value};

use crate::output::print_json;
use crate::output::print_table;
use crate::EndpointArgs;

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// The leader, every member's role, last applied index and lag.
    Status {
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Add a node (started with `palisade serve --node-id ID --cluster ... --join`) as a voter:
    /// it is caught up as a learner first.
    Add {
        /// The new node's id.
        id: u64,
        /// Its HOST:PORT.
        addr: String,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Remove a member.
    Remove {
        /// The member's id.
        id: u64,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Declare a member's store lost for good (its data directory lost, its disk replaced),
    /// on every member reachable: a member on probation whose census waits for it stops
    /// waiting. Only when that store will never come back: entries only it held may be lost.
    Lost {
        /// The lost member's id.
        id: u64,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Retire a signing key for good (a leaked key, or a removed member's): it leaves the list
    /// `GET /v1/keys` publishes, and resources that trust the coordinator drop it. Refused for
    /// a current member's key (remove the member first).
    RetireKey {
        /// The key id (16 hex digits, as `GET /v1/keys` shows it).
        key_id: String,
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
}

/// Per-node status requests are short: an unreachable member is reported, not waited for.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// A membership change waits for the new member to catch up.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a membership change keeps looking for a leader that accepts it.
const CHANGE_RETRY_BUDGET: Duration = Duration::from_secs(10);

pub async fn run(command: ClusterCommand, json_output: bool) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Status { endpoint } => status(&endpoint, json_output).await,
        ClusterCommand::Add { id, addr, endpoint } => {
            let body = json!({"id": id, "addr": addr});
            let reply = change(
                &endpoint,
                reqwest::Method::POST,
                "/v1/cluster/members",
                Some(body),
            )
            .await?;
            report(&reply, json_output, &format!("node {id} added"))
        }
        ClusterCommand::Remove { id, endpoint } => {
            let path = format!("/v1/cluster/members/{id}");
            let reply = change(&endpoint, reqwest::Method::DELETE, &path, None).await?;
            report(&reply, json_output, &format!("node {id} removed"))
        }
        ClusterCommand::Lost { id, endpoint } => lost(id, &endpoint, json_output).await,
        ClusterCommand::RetireKey { key_id, endpoint } => {
            anyhow::ensure!(
                key_id.len() == 16 && key_id.bytes().all(|b| b.is_ascii_hexdigit()),
                "a key id is 16 hex digits, as GET /v1/keys shows it"
            );
            let path = format!("/v1/keys/{key_id}/retire");
            let reply = change(&endpoint, reqwest::Method::POST, &path, None).await?;
            if json_output {
                print_json(&reply);
            } else {
                println!("key {key_id} retired");
            }
            Ok(())
        }
    }
}

fn report(reply: &Value, json_output: bool, done: &str) -> anyhow::Result<()> {
    if json_output {
        print_json(reply);
    } else {
        println!("{done}; voters now {}", reply["voters"]);
    }
    Ok(())
}

/// The scheme members' client URLs use: the one the endpoints were given with.
fn scheme(endpoints: &[String]) -> &'static str {
    if endpoints.iter().any(|e| e.starts_with("https://")) {
        "https"
    } else {
        "http"
    }
}

async fn get_status(client: &reqwest::Client, base: &str) -> Result<Value, String> {
    let url = format!("{}/v1/cluster", base.trim_end_matches('/'));
    let reply = client.get(&url).send().await.map_err(|e| e.to_string())?;
    reply.json::<Value>().await.map_err(|e| e.to_string())
}

async fn status(endpoint: &EndpointArgs, json_output: bool) -> anyhow::Result<()> {
    let endpoints = &endpoint.endpoint;
    let scheme = scheme(endpoints);
    let (views, errors) = gather_views(endpoint, scheme).await?;
    if views.is_empty() {
        return Err(anyhow::Error::new(ClientError::Unavailable(
            errors.join("; "),
        )))
        .context("no member answered");
    }
    let leader_view = views
        .values()
        .find(|v| v["role"] == "leader" && v["serving"] == true);
    let leader = leader_view.and_then(|v| v["node_id"].as_u64());
    let term = views.values().filter_map(|v| v["term"].as_u64()).max();
    let reference = leader_view
        .or_else(|| views.values().next())
        .expect("one view at least");
    let members = member_rows(reference, &views);
    let mode = reference["mode"].clone();
    let document = json!({"mode": mode, "leader": leader, "term": term, "members": members});
    if json_output {
        print_json(&document);
        return Ok(());
    }
    print_status(leader, term, &members);
    Ok(())
}

/// Every member's own view, by node id: the endpoints given, then every member a view names.
async fn gather_views(
    endpoint: &EndpointArgs,
    scheme: &str,
) -> anyhow::Result<(BTreeMap<u64, Value>, Vec<String>)> {
    let endpoints = &endpoint.endpoint;
    let client = endpoint.http(STATUS_TIMEOUT)?;
    // Every node's own view: role, term, last applied. Members found in any view are asked too.
    let mut views: BTreeMap<u64, Value> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut to_ask: Vec<String> = endpoints.to_vec();
    let mut asked = std::collections::BTreeSet::new();
    while let Some(base) = to_ask.pop() {
        let base = base.trim_end_matches('/').to_owned();
        if !asked.insert(base.clone()) {
            continue;
        }
        match get_status(&client, &base).await {
            Ok(view) => {
                if let Some(members) = view["members"].as_array() {
                    for member in members {
                        if let Some(addr) = member["addr"].as_str() {
                            to_ask.push(format!("{scheme}://{addr}"));
                        }
                    }
                }
                if let Some(id) = view["node_id"].as_u64() {
                    views.insert(id, view);
                }
            }
            Err(error) => errors.push(format!("{base}: {error}")),
        }
    }
    Ok((views, errors))
}

/// The members as the reference view lists them, each with its own view's role and progress.
fn member_rows(reference: &Value, views: &BTreeMap<u64, Value>) -> Vec<Value> {
    let mut members = Vec::new();
    for member in reference["members"].as_array().into_iter().flatten() {
        let Some(id) = member["id"].as_u64() else {
            continue;
        };
        let view = views.get(&id);
        // A member the membership names that holds no membership itself started on an empty
        // data directory: its peers refuse it (its store is not the one named), and the
        // leader's progress for it is from before. It counts nowhere until removed and added
        // back.
        let lost_its_data = view.is_some_and(|v| {
            v["members"].as_array().is_some_and(Vec::is_empty) && v["last_applied"].is_null()
        });
        let role = match view {
            None => json!("unreachable"),
            Some(_) if lost_its_data => json!("refused: lost its data (remove, add back)"),
            Some(v) if not_ready(v).is_empty() => v["role"].clone(),
            Some(v) => json!(format!("{}, not ready", text(&v["role"]))),
        };
        members.push(json!({
            "id": id,
            "addr": member["addr"],
            "kind": member["kind"],
            "role": role,
            "term": view.map_or(Value::Null, |v| v["term"].clone()),
            "last_applied": view.map_or(Value::Null, |v| v["last_applied"].clone()),
            "lag": if lost_its_data { Value::Null } else { member["lag"].clone() },
            "not_ready": view.map_or_else(Vec::new, not_ready),
            "clock": view.map_or(Value::Null, |v| clock_column(&v["clock"])),
        }));
    }
    members
}

/// Why a member's own view says it is not ready (`not_ready`; absent from older members).
fn not_ready(view: &Value) -> Vec<Value> {
    view["not_ready"].as_array().cloned().unwrap_or_default()
}

/// A cell of the status table.
fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A member's clock as its own view judges it: its offset from its peers (ms), and whether a
/// majority refuses it (then it commits no clock floor and does not lead).
fn clock_column(verdict: &Value) -> Value {
    let Some(offset_ms) = verdict["offset_ms"].as_i64() else {
        return Value::Null;
    };
    let max_offset_ms = verdict["max_offset_ms"].as_u64().unwrap_or(0);
    if verdict["refused"] == true {
        json!(format!(
            "{offset_ms:+} ms: beyond {max_offset_ms} ms from a majority (does not lead)"
        ))
    } else {
        json!(format!("{offset_ms:+} ms"))
    }
}

fn print_status(leader: Option<u64>, term: Option<u64>, members: &[Value]) {
    match leader {
        Some(id) => println!("leader: node {id} (term {})", term.unwrap_or(0)),
        None => println!("leader: none (election under way, or no majority)"),
    }
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            vec![
                text(&m["id"]),
                text(&m["addr"]),
                text(&m["kind"]),
                text(&m["role"]),
                text(&m["last_applied"]),
                text(&m["lag"]),
                text(&m["clock"]),
            ]
        })
        .collect();
    print_table(
        &[
            "ID",
            "ADDRESS",
            "KIND",
            "ROLE",
            "LAST APPLIED",
            "LAG",
            "CLOCK",
        ],
        &rows,
    );
    for member in members {
        for why in member["not_ready"].as_array().into_iter().flatten() {
            println!("node {} is not ready: {}", text(&member["id"]), text(why));
        }
    }
}

/// `palisade cluster lost ID`: tells every member reachable (the endpoints given, and every
/// member their views name) that member `id`'s store is gone for good; each logs it, and one
/// on probation stops waiting for it (`identity` rule 4).
async fn lost(id: u64, endpoint: &EndpointArgs, json_output: bool) -> anyhow::Result<()> {
    let scheme = scheme(&endpoint.endpoint);
    let (views, mut errors) = gather_views(endpoint, scheme).await?;
    let mut bases: std::collections::BTreeSet<String> = endpoint
        .endpoint
        .iter()
        .map(|base| base.trim_end_matches('/').to_owned())
        .collect();
    for member in views
        .values()
        .flat_map(|view| view["members"].as_array().into_iter().flatten())
    {
        if let (Some(addr), false) = (member["addr"].as_str(), member["id"].as_u64() == Some(id)) {
            bases.insert(format!("{scheme}://{addr}"));
        }
    }
    let client = endpoint.http(STATUS_TIMEOUT)?;
    let mut told: BTreeMap<u64, Value> = BTreeMap::new();
    for base in bases {
        let url = format!("{base}/v1/cluster/members/{id}/lost");
        match client.post(&url).send().await {
            Ok(reply) if reply.status().is_success() => {
                let value: Value = reply.json().await.unwrap_or(Value::Null);
                if let Some(node) = value["node_id"].as_u64() {
                    told.insert(node, value);
                }
            }
            Ok(reply) => errors.push(format!("{base}: {}", reply.status())),
            Err(error) => errors.push(format!("{base}: {error}")),
        }
    }
    if told.is_empty() {
        return Err(anyhow::Error::new(ClientError::Unavailable(
            errors.join("; "),
        )))
        .context("no member took the declaration");
    }
    if json_output {
        print_json(
            &json!({"lost": id, "members": told.values().collect::<Vec<_>>(), "errors": errors}),
        );
        return Ok(());
    }
    for (node, value) in &told {
        if value["on_probation"] == true {
            println!("node {node}: on probation; its census no longer waits for node {id}");
        } else {
            println!("node {node}: not on probation (nothing waited for node {id})");
        }
    }
    for error in errors {
        eprintln!("not told: {error}");
    }
    Ok(())
}

/// Sends a membership change to the leader; while there is none (or it changes under the
/// request) tries again, for up to `CHANGE_RETRY_BUDGET`. Adding or removing an existing
/// member again is harmless, so the retry is safe.
async fn change(
    endpoint: &EndpointArgs,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let started = std::time::Instant::now();
    loop {
        match change_once(endpoint, method.clone(), path, body.clone()).await {
            Err(error)
                if started.elapsed() < CHANGE_RETRY_BUDGET
                    && matches!(
                        error.downcast_ref::<ClientError>(),
                        Some(ClientError::Unavailable(_))
                    ) =>
            {
                tracing::debug!(%error, "membership change: retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            result => return result,
        }
    }
}

/// One attempt: finds the leader through any endpoint's status and sends it the change.
async fn change_once(
    endpoint: &EndpointArgs,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let endpoints = &endpoint.endpoint;
    let probe = endpoint.http(STATUS_TIMEOUT)?;
    let mut leader_url = None;
    let mut errors = Vec::new();
    for base in endpoints {
        match get_status(&probe, base).await {
            Ok(view) => {
                if view["mode"] == "single" {
                    bail!("{base} runs a single node: membership changes need cluster mode");
                }
                let leader = view["leader"].as_u64();
                let addr = view["members"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["id"].as_u64() == leader && leader.is_some())
                    .and_then(|m| m["addr"].as_str());
                if let Some(addr) = addr {
                    leader_url = Some(format!("{}://{addr}", scheme(endpoints)));
                    break;
                }
            }
            Err(error) => errors.push(format!("{base}: {error}")),
        }
    }
    let Some(leader_url) = leader_url else {
        return Err(anyhow::Error::new(ClientError::Unavailable(format!(
            "no leader found ({})",
            errors.join("; ")
        ))));
    };
    let client = endpoint.http(CHANGE_TIMEOUT)?;
    let mut request = client.request(method, format!("{leader_url}{path}"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let reply = request
        .send()
        .await
        .map_err(|e| anyhow::Error::new(ClientError::Unavailable(e.to_string())))?;
    let status = reply.status();
    let value: Value = reply.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let message = value["message"].as_str().unwrap_or("no message").to_owned();
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return Err(anyhow::Error::new(ClientError::Unavailable(message)));
        }
        bail!("{status}: {message}");
    }
    Ok(value)
}
